// Random numbers, with a process-wide key sequence that behaves like the Python binding's.
#include <chrono>
#include <mutex>

#include "internal.hpp"

using namespace mlxs;

namespace {

// MLX's C++ default sequence (random::KeySequence::default_) is per thread; Python's is one
// per process. This one is per process, like Python's, so a seed set on one thread governs
// draws on every thread. Allocated once and never freed: no array outlives MLX at exit.
struct KeySeq {
  std::mutex mu;
  std::optional<mx::array> state;

  mx::array& current() {
    if (!state) {
      auto now = std::chrono::system_clock::now();
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch())
                    .count();
      state = mx::random::key(static_cast<uint64_t>(ms));
    }
    return *state;
  }
};

KeySeq& seq() {
  static KeySeq* k = new KeySeq();
  return *k;
}

// Evaluates `a` now unless it is a placeholder of a function being compiled (which has no
// value yet and cannot be evaluated; a state threaded through `compile` stays lazy there).
void materialize(std::vector<mx::array> arrays) {
  for (auto& a : arrays) {
    if (a.is_tracer()) return;
  }
  mx::eval(std::move(arrays));
}

// Python: `key_ ? key_.value() : default_key().next()`, next() = split; keep first.
// The split is evaluated before the lock is released: a lazy split left in the state would be
// shared by the next draw on any thread, and evaluating draws that share an unevaluated node
// from several threads at once crashes inside MLX (or fails with "no Stream in current
// thread"), issue #29. The values are the same whenever they are computed, so seeded
// sequences are unchanged.
mx::array next_key() {
  auto& k = seq();
  std::lock_guard<std::mutex> lock(k.mu);
  auto [state, key] = mx::random::split(k.current());
  materialize({state, key});
  k.state = state;
  return key;
}

mx::array key_or_next(mlxs_array key) { return key ? A(key) : next_key(); }

}  // namespace

extern "C" {

int mlxs_random_key(mlxs_array* out, uint64_t seed) {
  return guard([&] { put(out, mx::random::key(seed)); });
}

int mlxs_random_seed(uint64_t seed) {
  return guard([&] {
    auto& k = seq();
    std::lock_guard<std::mutex> lock(k.mu);
    k.state = mx::random::key(seed);
    mx::random::seed(seed);
  });
}

int mlxs_random_state(mlxs_array* out) {
  return guard([&] {
    auto& k = seq();
    std::lock_guard<std::mutex> lock(k.mu);
    put(out, k.current());
  });
}

int mlxs_random_set_state(mlxs_array key) {
  return guard([&] {
    auto& a = A(key);
    if (a.dtype() != mx::uint32 || a.ndim() != 1 || a.shape(0) != 2) {
      throw std::invalid_argument("[random_set_state] a key is a uint32 array of shape (2,)");
    }
    auto& k = seq();
    std::lock_guard<std::mutex> lock(k.mu);
    materialize({a});
    k.state = a;
  });
}

int mlxs_random_next_key(mlxs_array* out) {
  return guard([&] { put(out, next_key()); });
}

int mlxs_random_split(mlxs_array* out, mlxs_array key, int num, mlxs_stream s) {
  return guard([&] { put(out, mx::random::split(A(key), num, S(s))); });
}

int mlxs_random_bits(mlxs_array* out, const int32_t* shape, size_t ndim, int width,
                     mlxs_array key, mlxs_stream s) {
  return guard([&] {
    put(out, mx::random::bits(shape_of(shape, ndim), width, key_or_next(key), S(s)));
  });
}

int mlxs_random_uniform(mlxs_array* out, mlxs_array low, mlxs_array high, const int32_t* shape,
                        size_t ndim, mlxs_dtype dtype, mlxs_array key, mlxs_stream s) {
  return guard([&] {
    auto k = key_or_next(key);
    put(out, mx::random::uniform(A(low), A(high), shape_of(shape, ndim), dtype_of(dtype), k,
                                 S(s)));
  });
}

int mlxs_random_normal(mlxs_array* out, const int32_t* shape, size_t ndim, mlxs_dtype dtype,
                       mlxs_array loc, mlxs_array scale, mlxs_array key, mlxs_stream s) {
  return guard([&] {
    auto k = key_or_next(key);
    put(out, mx::random::normal(shape_of(shape, ndim), dtype_of(dtype), opt(loc), opt(scale), k,
                                S(s)));
  });
}

int mlxs_random_randint(mlxs_array* out, mlxs_array low, mlxs_array high, const int32_t* shape,
                        size_t ndim, mlxs_dtype dtype, mlxs_array key, mlxs_stream s) {
  return guard([&] {
    auto k = key_or_next(key);
    put(out, mx::random::randint(A(low), A(high), shape_of(shape, ndim), dtype_of(dtype), k,
                                 S(s)));
  });
}

int mlxs_random_bernoulli(mlxs_array* out, mlxs_array p, bool has_shape, const int32_t* shape,
                          size_t ndim, mlxs_array key, mlxs_stream s) {
  return guard([&] {
    auto k = key_or_next(key);
    if (has_shape) {
      put(out, mx::random::bernoulli(A(p), shape_of(shape, ndim), k, S(s)));
    } else {
      put(out, mx::random::bernoulli(A(p), k, S(s)));
    }
  });
}

int mlxs_random_truncated_normal(mlxs_array* out, mlxs_array lower, mlxs_array upper,
                                 bool has_shape, const int32_t* shape, size_t ndim,
                                 mlxs_dtype dtype, mlxs_array key, mlxs_stream s) {
  return guard([&] {
    auto k = key_or_next(key);
    if (has_shape) {
      put(out, mx::random::truncated_normal(A(lower), A(upper), shape_of(shape, ndim),
                                            dtype_of(dtype), k, S(s)));
    } else {
      put(out, mx::random::truncated_normal(A(lower), A(upper), dtype_of(dtype), k, S(s)));
    }
  });
}

int mlxs_random_gumbel(mlxs_array* out, const int32_t* shape, size_t ndim, mlxs_dtype dtype,
                       mlxs_array key, mlxs_stream s) {
  return guard([&] {
    auto k = key_or_next(key);
    put(out, mx::random::gumbel(shape_of(shape, ndim), dtype_of(dtype), k, S(s)));
  });
}

int mlxs_random_categorical(mlxs_array* out, mlxs_array logits, int axis, mlxs_array key,
                            mlxs_stream s) {
  return guard([&] {
    auto k = key_or_next(key);
    put(out, mx::random::categorical(A(logits), axis, k, S(s)));
  });
}

int mlxs_random_categorical_n(mlxs_array* out, mlxs_array logits, int axis, int num_samples,
                              mlxs_array key, mlxs_stream s) {
  return guard([&] {
    auto k = key_or_next(key);
    put(out, mx::random::categorical(A(logits), axis, num_samples, k, S(s)));
  });
}

int mlxs_random_categorical_shape(mlxs_array* out, mlxs_array logits, int axis,
                                  const int32_t* shape, size_t ndim, mlxs_array key,
                                  mlxs_stream s) {
  return guard([&] {
    auto k = key_or_next(key);
    put(out, mx::random::categorical(A(logits), axis, shape_of(shape, ndim), k, S(s)));
  });
}

int mlxs_random_laplace(mlxs_array* out, const int32_t* shape, size_t ndim, mlxs_dtype dtype,
                        float loc, float scale, mlxs_array key, mlxs_stream s) {
  return guard([&] {
    auto k = key_or_next(key);
    put(out, mx::random::laplace(shape_of(shape, ndim), dtype_of(dtype), loc, scale, k, S(s)));
  });
}

int mlxs_random_permutation(mlxs_array* out, mlxs_array x, int axis, mlxs_array key,
                            mlxs_stream s) {
  return guard([&] {
    auto k = key_or_next(key);
    put(out, mx::random::permutation(A(x), axis, k, S(s)));
  });
}

}  // extern "C"

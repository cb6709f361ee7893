// Function transforms: closures over foreign callbacks, vjp, jvp, value_and_grad,
// custom_vjp, checkpoint, compile.
#include <memory>
#include <set>

#include <mlx/compile_impl.h>

#include "internal.hpp"

using namespace mlxs;

namespace {

using ArrayFn = std::function<std::vector<mx::array>(const std::vector<mx::array>&)>;

// Thrown when a foreign callback reports failure. The foreign side keeps the real error;
// this exception only unwinds MLX.
struct CallbackFailed : std::exception {
  const char* what() const noexcept override {
    return "[mlxs] a callback reported failure (the caller keeps its error)";
  }
};

thread_local bool last_is_callback = false;

// guard() that also records whether the failure came from a callback.
template <class F>
int guard_cb(F&& f) noexcept {
  try {
    f();
    return 0;
  } catch (const CallbackFailed& e) {
    set_error(e.what());
    last_is_callback = true;
    return 1;
  } catch (const std::exception& e) {
    set_error(e.what());
  } catch (...) {
    set_error("unknown C++ exception");
  }
  last_is_callback = false;
  return 1;
}

// A foreign payload and its destructor; the destructor runs once, when the last owner goes.
struct Payload {
  void* p;
  mlxs_payload_free free_fn;
  Payload(void* p, mlxs_payload_free f) : p(p), free_fn(f) {}
  Payload(const Payload&) = delete;
  Payload& operator=(const Payload&) = delete;
  ~Payload() {
    if (free_fn) free_fn(p);
  }
};

// Takes ownership of a payload; if even that fails, frees it before rethrowing.
std::shared_ptr<Payload> own(void* p, mlxs_payload_free free_fn) {
  try {
    return std::make_shared<Payload>(p, free_fn);
  } catch (...) {
    if (free_fn) free_fn(p);
    throw;
  }
}

struct ClosureCall {
  mlxs_closure_fn fn;
  std::shared_ptr<Payload> payload;
  std::vector<mx::array> operator()(const std::vector<mx::array>& inputs) const {
    mlxs_vec_ in{inputs};
    mlxs_vec_ out{};
    if (fn(payload->p, &in, &out) != 0) throw CallbackFailed();
    return std::move(out.v);
  }
};

struct VjpCall {
  mlxs_vjp_fn fn;
  std::shared_ptr<Payload> payload;
  std::vector<mx::array> operator()(const std::vector<mx::array>& primals,
                                    const std::vector<mx::array>& cotangents,
                                    const std::vector<mx::array>& outputs) const {
    mlxs_vec_ p{primals};
    mlxs_vec_ c{cotangents};
    mlxs_vec_ o{outputs};
    mlxs_vec_ r{};
    if (fn(payload->p, &p, &c, &o, &r) != 0) throw CallbackFailed();
    return std::move(r.v);
  }
};

// The identity of one compiled function in the compile cache of the thread that made it.
// Destroyed with the last copy of the compiled function: erases its cache entries.
struct CompileKey {
  mx::detail::CompileCacheWeakPtr cache;
  bool shapeless = false;
  std::uintptr_t id() const { return reinterpret_cast<std::uintptr_t>(this); }
  void erase() const noexcept {
    try {
      mx::detail::compile_erase(cache, id());
    } catch (...) {
    }
  }
  ~CompileKey() { erase(); }
};

}  // namespace

struct mlxs_closure_ {
  ArrayFn f;
  // Set for closures made by mlxs_compile; f is then the function to trace.
  std::shared_ptr<CompileKey> compiled;
};

namespace {

mlxs_closure_& C(mlxs_closure c) {
  if (c == nullptr) throw std::invalid_argument("[mlxs] null closure handle");
  return *c;
}

void put_vec(mlxs_vec* out, std::vector<mx::array> v) { *out = wrap_vec(std::move(v)); }

}  // namespace

extern "C" {

int mlxs_closure_new(mlxs_closure* out, mlxs_closure_fn fn, void* payload,
                     mlxs_payload_free free_payload) {
  return guard_cb([&] {
    auto owned = own(payload, free_payload);
    if (fn == nullptr) throw std::invalid_argument("[mlxs] null closure callback");
    *out = new mlxs_closure_{ArrayFn(ClosureCall{fn, std::move(owned)}), nullptr};
  });
}

void mlxs_closure_free(mlxs_closure c) { delete c; }

int mlxs_closure_apply(mlxs_vec* out, mlxs_closure c, mlxs_vec inputs) {
  return guard_cb([&] {
    auto& cl = C(c);
    auto& in = V(inputs);
    if (cl.compiled) {
      // The cache entry records the thread's default stream; a thread's default stream is
      // created lazily, so on a thread's first compiled call it would only come into being
      // during the trace, and the next call would miss the entry and trace again. Make it
      // exist first (a redundant trace that mx.compile in Python also pays).
      (void)mx::default_stream(mx::default_device());
    }
    try {
      if (cl.compiled) {
        // As the Python binding does: compile at every call (a cache lookup by id), so
        // that disable_compile() applies to functions compiled before it, too.
        auto fn = mx::detail::compile(cl.f, cl.compiled->id(), cl.compiled->shapeless);
        put_vec(out, fn(in));
      } else {
        put_vec(out, cl.f(in));
      }
    } catch (...) {
      // A trace that failed halfway may have left an entry marked as filled; never reuse it.
      if (cl.compiled) cl.compiled->erase();
      throw;
    }
  });
}

bool mlxs_last_error_is_callback(void) { return last_is_callback; }

int mlxs_vjp(mlxs_vec* outputs, mlxs_vec* vjps, mlxs_closure fun, mlxs_vec primals,
             mlxs_vec cotangents) {
  return guard_cb([&] {
    auto [outs, grads] = mx::vjp(C(fun).f, V(primals), V(cotangents));
    auto o = wrap_vec(std::move(outs));
    try {
      put_vec(vjps, std::move(grads));
    } catch (...) {
      mlxs_vec_free(o);
      throw;
    }
    *outputs = o;
  });
}

int mlxs_jvp(mlxs_vec* outputs, mlxs_vec* jvps, mlxs_closure fun, mlxs_vec primals,
             mlxs_vec tangents) {
  return guard_cb([&] {
    auto [outs, tans] = mx::jvp(C(fun).f, V(primals), V(tangents));
    auto o = wrap_vec(std::move(outs));
    try {
      put_vec(jvps, std::move(tans));
    } catch (...) {
      mlxs_vec_free(o);
      throw;
    }
    *outputs = o;
  });
}

int mlxs_value_and_grad(mlxs_vec* values, mlxs_vec* grads, mlxs_closure fun,
                        const int32_t* argnums, size_t nargnums, mlxs_vec inputs) {
  return guard_cb([&] {
    std::vector<int> nums = ints(argnums, nargnums);
    auto [vals, gs] = mx::value_and_grad(C(fun).f, nums)(V(inputs));
    auto v = wrap_vec(std::move(vals));
    try {
      put_vec(grads, std::move(gs));
    } catch (...) {
      mlxs_vec_free(v);
      throw;
    }
    *values = v;
  });
}

int mlxs_custom_vjp(mlxs_closure* out, mlxs_closure fun, mlxs_vjp_fn bwd, void* payload,
                    mlxs_payload_free free_payload) {
  return guard_cb([&] {
    auto owned = own(payload, free_payload);
    if (bwd == nullptr) throw std::invalid_argument("[mlxs] null custom_vjp callback");
    auto f = mx::custom_vjp(C(fun).f, VjpCall{bwd, std::move(owned)});
    *out = new mlxs_closure_{std::move(f), nullptr};
  });
}

int mlxs_checkpoint(mlxs_closure* out, mlxs_closure fun) {
  return guard_cb([&] { *out = new mlxs_closure_{mx::checkpoint(C(fun).f), nullptr}; });
}

int mlxs_compile(mlxs_closure* out, mlxs_closure fun, bool shapeless) {
  return guard_cb([&] {
    auto key = std::make_shared<CompileKey>();
    key->cache = mx::detail::compile_cache();
    key->shapeless = shapeless;
    // The key lives as long as the closure; mlxs_closure_apply compiles f under its id.
    *out = new mlxs_closure_{C(fun).f, std::move(key)};
  });
}

int mlxs_disable_compile(void) {
  return guard([] { mx::disable_compile(); });
}
int mlxs_enable_compile(void) {
  return guard([] { mx::enable_compile(); });
}
int mlxs_set_compile_mode(int mode) {
  return guard([&] {
    if (mode < 0 || mode > 3) {
      throw std::invalid_argument("[set_compile_mode] mode must be 0..3, got " +
                                  std::to_string(mode));
    }
    mx::set_compile_mode(static_cast<mx::CompileMode>(mode));
  });
}

}  // extern "C"

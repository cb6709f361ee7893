// Handles, errors, dtypes, arrays, vectors, devices, streams, memory.
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>

#include <mlx/graph_utils.h>

#include "internal.hpp"

using namespace mlxs;

namespace {
thread_local std::string last_error;
}

void mlxs::set_error(std::string msg) { last_error = std::move(msg); }

// MLX 0.32.4 keeps its CPU allocator (and its buffer cache) in a function-local static, so
// exit() destroys it, while the stream threads, never joined, may still be running queued
// work that frees buffers into that cache: a process that returns from main with work in
// flight (a pipelined decode's next step, an async_eval nobody waited for) corrupts the heap
// or crashes ("malloc_consolidate(): unaligned fastbin chunk detected", SIGSEGV in
// CommonAllocator::free). An exit handler registered after the allocator exists runs before
// its destructor (exit handlers run in reverse order of registration); it waits for every
// stream, so nothing is in flight when MLX's statics go.
void mlxs::drain_streams_at_exit() noexcept {
  static std::once_flag once;
  try {
    std::call_once(once, [] {
      // Both statics the handler needs, constructed now so they outlive it.
      (void)mx::allocator::allocator();
      (void)mx::get_streams();
      std::atexit([] {
        try {
          for (auto& s : mx::get_streams()) mx::synchronize(s);
        } catch (...) {
        }
      });
    });
  } catch (...) {
  }
}

mx::Dtype mlxs::dtype_of(mlxs_dtype d) {
  switch (d) {
    case MLXS_BOOL: return mx::bool_;
    case MLXS_UINT8: return mx::uint8;
    case MLXS_UINT16: return mx::uint16;
    case MLXS_UINT32: return mx::uint32;
    case MLXS_UINT64: return mx::uint64;
    case MLXS_INT8: return mx::int8;
    case MLXS_INT16: return mx::int16;
    case MLXS_INT32: return mx::int32;
    case MLXS_INT64: return mx::int64;
    case MLXS_FLOAT16: return mx::float16;
    case MLXS_FLOAT32: return mx::float32;
    case MLXS_FLOAT64: return mx::float64;
    case MLXS_BFLOAT16: return mx::bfloat16;
    case MLXS_COMPLEX64: return mx::complex64;
  }
  throw std::invalid_argument("[mlxs] unknown dtype code " + std::to_string(int(d)));
}

mlxs_dtype mlxs::dtype_to(mx::Dtype d) { return static_cast<mlxs_dtype>(static_cast<int>(d.val())); }

extern "C" {

const char* mlxs_last_error(void) { return last_error.c_str(); }
const char* mlxs_version(void) {
  // Outside guard (it returns no status): an exception here yields "" instead of crossing
  // the C ABI.
  try {
    static const std::string v = mx::version();
    return v.c_str();
  } catch (...) {
    return "";
  }
}

const char* mlxs_string_data(mlxs_string s) { return s ? s->s.c_str() : ""; }
void mlxs_string_free(mlxs_string s) { delete s; }

void mlxs_array_free(mlxs_array a) { delete a; }

int mlxs_array_clone(mlxs_array* out, mlxs_array a) {
  return guard([&] { put(out, A(a)); });
}

int mlxs_array_from_data(mlxs_array* out, const void* data, size_t nbytes, const int32_t* shape,
                         size_t ndim, mlxs_dtype dtype) {
  return guard([&] {
    auto dt = dtype_of(dtype);
    auto sh = shape_of(shape, ndim);
    size_t n = 1;
    for (auto d : sh) {
      if (d < 0) throw std::invalid_argument("[array] negative dimension in shape");
      n *= static_cast<size_t>(d);
    }
    if (n * dt.size() != nbytes) {
      throw std::invalid_argument("[array] data holds " + std::to_string(nbytes) +
                                  " bytes but the shape and dtype need " +
                                  std::to_string(n * dt.size()));
    }
    auto buf = mx::allocator::malloc(nbytes);
    if (nbytes > 0) std::memcpy(buf.buffer().raw_ptr(), data, nbytes);
    put(out, mx::array(std::move(buf), std::move(sh), dt));
  });
}

int mlxs_array_from_float(mlxs_array* out, float value, mlxs_dtype dtype) {
  return guard([&] { put(out, mx::array(value, dtype_of(dtype))); });
}
int mlxs_array_from_double(mlxs_array* out, double value, mlxs_dtype dtype) {
  return guard([&] { put(out, mx::array(value, dtype_of(dtype))); });
}
int mlxs_array_from_int(mlxs_array* out, int64_t value, mlxs_dtype dtype) {
  return guard([&] { put(out, mx::array(value, dtype_of(dtype))); });
}
int mlxs_array_from_bool(mlxs_array* out, bool value) {
  return guard([&] { put(out, mx::array(value)); });
}

size_t mlxs_array_ndim(mlxs_array a) { return a ? a->a.ndim() : 0; }
const int32_t* mlxs_array_shape(mlxs_array a) { return a ? a->a.shape().data() : nullptr; }
size_t mlxs_array_size(mlxs_array a) { return a ? a->a.size() : 0; }
size_t mlxs_array_nbytes(mlxs_array a) { return a ? a->a.nbytes() : 0; }
size_t mlxs_array_itemsize(mlxs_array a) { return a ? a->a.itemsize() : 0; }
mlxs_dtype mlxs_array_dtype(mlxs_array a) { return a ? dtype_to(a->a.dtype()) : MLXS_FLOAT32; }
bool mlxs_array_is_available(mlxs_array a) { return a && a->a.is_available(); }
uintptr_t mlxs_array_id(mlxs_array a) { return a ? a->a.id() : 0; }

int mlxs_array_eval(mlxs_array a) {
  return guard([&] { A(a).eval(); });
}

int mlxs_array_to_data(mlxs_array a, void* dst, size_t nbytes) {
  return guard([&] {
    auto& x = A(a);
    if (x.nbytes() != nbytes) {
      throw std::invalid_argument("[to_data] array holds " + std::to_string(x.nbytes()) +
                                  " bytes, destination has " + std::to_string(nbytes));
    }
    // Evaluate the array itself first: that waits for it alone. A new node (contiguous) made
    // before it is evaluated would be queued on the default stream behind everything already
    // scheduled there (a pipelined decode's next step), and waiting for it would wait for all
    // of that. Only a strided view still needs the copy, made once the array is ready.
    x.eval();
    if (x.flags().row_contiguous) {
      if (nbytes > 0) std::memcpy(dst, x.data<char>(), nbytes);
      return;
    }
    auto c = mx::contiguous(x);
    c.eval();
    if (nbytes > 0) std::memcpy(dst, c.data<char>(), nbytes);
  });
}

int mlxs_array_data_view(mlxs_array a, const void** data, size_t* nbytes) {
  return guard([&] {
    if (!data || !nbytes) throw std::invalid_argument("[data_view] null output pointer");
    auto& x = A(a);
    x.eval();
    if (!x.flags().row_contiguous) {
      throw std::invalid_argument("[data_view] the array is not row-contiguous (a strided or "
                                  "broadcast view)");
    }
    *data = x.size() > 0 ? static_cast<const void*>(x.data<char>()) : nullptr;
    *nbytes = x.nbytes();
  });
}

int mlxs_array_tostring(mlxs_string* out, mlxs_array a) {
  return guard([&] {
    std::ostringstream os;
    os << A(a);
    *out = new mlxs_string_{os.str()};
  });
}

// Constructors without a status return null when out of memory (nothrow new): every entry
// point taking the handle treats null as an error, and freeing null is a no-op.
mlxs_vec mlxs_vec_new(void) { return new (std::nothrow) mlxs_vec_{}; }
void mlxs_vec_free(mlxs_vec v) { delete v; }
int mlxs_vec_push(mlxs_vec v, mlxs_array a) {
  return guard([&] { V(v).push_back(A(a)); });
}
size_t mlxs_vec_size(mlxs_vec v) { return v ? v->v.size() : 0; }
int mlxs_vec_get(mlxs_array* out, mlxs_vec v, size_t i) {
  return guard([&] {
    auto& vec = V(v);
    if (i >= vec.size()) {
      throw std::out_of_range("[vec_get] index " + std::to_string(i) + " out of range for " +
                              std::to_string(vec.size()) + " arrays");
    }
    put(out, vec[i]);
  });
}

int mlxs_eval(mlxs_vec v) {
  return guard([&] { mx::eval(V(v)); });
}
int mlxs_async_eval(mlxs_vec v) {
  return guard([&] { mx::async_eval(V(v)); });
}
int mlxs_graph_text(mlxs_string* out, mlxs_vec v, bool dot) {
  return guard([&] {
    std::ostringstream os;
    if (dot) {
      mx::export_to_dot(os, V(v));
    } else {
      mx::print_graph(os, V(v));
    }
    *out = new mlxs_string_{os.str()};
  });
}

static mx::Device::DeviceType devtype(mlxs_device_type t) {
  return t == MLXS_GPU ? mx::Device::gpu : mx::Device::cpu;
}

int mlxs_device_new(mlxs_device* out, mlxs_device_type type, int index) {
  return guard([&] { *out = new mlxs_device_{mx::Device(devtype(type), index)}; });
}
void mlxs_device_free(mlxs_device d) { delete d; }
mlxs_device_type mlxs_device_get_type(mlxs_device d) {
  return (d && d->d.type == mx::Device::gpu) ? MLXS_GPU : MLXS_CPU;
}
int mlxs_device_get_index(mlxs_device d) { return d ? d->d.index : 0; }
int mlxs_default_device(mlxs_device* out) {
  return guard([&] { *out = new mlxs_device_{mx::default_device()}; });
}
int mlxs_set_default_device(mlxs_device d) {
  return guard([&] {
    if (!d) throw std::invalid_argument("[set_default_device] null device");
    mx::set_default_device(d->d);
  });
}
int mlxs_device_is_available(bool* out, mlxs_device d) {
  return guard([&] {
    if (!d) throw std::invalid_argument("[is_available] null device");
    *out = mx::is_available(d->d);
  });
}
int mlxs_device_count(int* out, mlxs_device_type type) {
  return guard([&] { *out = mx::device_count(devtype(type)); });
}

void mlxs_stream_free(mlxs_stream s) { delete s; }
int mlxs_default_stream(mlxs_stream* out, mlxs_device d) {
  return guard([&] {
    if (!d) throw std::invalid_argument("[default_stream] null device");
    *out = new mlxs_stream_{mx::default_stream(d->d)};
  });
}
int mlxs_set_default_stream(mlxs_stream s) {
  return guard([&] {
    if (!s) throw std::invalid_argument("[set_default_stream] null stream");
    mx::set_default_stream(s->s);
  });
}
int mlxs_new_stream(mlxs_stream* out, mlxs_device d) {
  return guard([&] {
    if (!d) throw std::invalid_argument("[new_stream] null device");
    *out = new mlxs_stream_{mx::new_stream(d->d)};
  });
}
int mlxs_stream_device(mlxs_device* out, mlxs_stream s) {
  return guard([&] {
    if (!s) throw std::invalid_argument("[stream_device] null stream");
    *out = new mlxs_device_{s->s.device};
  });
}
int mlxs_stream_index(mlxs_stream s) { return s ? s->s.index : -1; }
int mlxs_synchronize(mlxs_stream s) {
  return guard([&] {
    if (s) {
      mx::synchronize(s->s);
    } else {
      mx::synchronize();
    }
  });
}

int mlxs_get_active_memory(size_t* out) {
  return guard([&] { *out = mx::get_active_memory(); });
}
int mlxs_get_peak_memory(size_t* out) {
  return guard([&] { *out = mx::get_peak_memory(); });
}
int mlxs_reset_peak_memory(void) {
  return guard([&] { mx::reset_peak_memory(); });
}
int mlxs_get_cache_memory(size_t* out) {
  return guard([&] { *out = mx::get_cache_memory(); });
}
int mlxs_get_memory_limit(size_t* out) {
  return guard([&] { *out = mx::get_memory_limit(); });
}
int mlxs_set_memory_limit(size_t* out, size_t limit) {
  return guard([&] { *out = mx::set_memory_limit(limit); });
}
int mlxs_set_cache_limit(size_t* out, size_t limit) {
  return guard([&] { *out = mx::set_cache_limit(limit); });
}
int mlxs_set_wired_limit(size_t* out, size_t limit) {
  return guard([&] { *out = mx::set_wired_limit(limit); });
}
int mlxs_clear_cache(void) {
  return guard([&] { mx::clear_cache(); });
}

}  // extern "C"

// Array operations.
#include "internal.hpp"

using namespace mlxs;

extern "C" {

#define MLXS_UNARY(name)                                                   \
  int mlxs_##name(mlxs_array* out, mlxs_array a, mlxs_stream s) {          \
    return guard([&] { put(out, mx::name(A(a), S(s))); });                 \
  }
#define MLXS_BINARY(name)                                                  \
  int mlxs_##name(mlxs_array* out, mlxs_array a, mlxs_array b, mlxs_stream s) { \
    return guard([&] { put(out, mx::name(A(a), A(b), S(s))); });           \
  }
#include "mlxs/ops_list.h"
#undef MLXS_UNARY
#undef MLXS_BINARY

int mlxs_zeros(mlxs_array* out, const int32_t* shape, size_t ndim, mlxs_dtype dtype,
               mlxs_stream s) {
  return guard([&] { put(out, mx::zeros(shape_of(shape, ndim), dtype_of(dtype), S(s))); });
}
int mlxs_ones(mlxs_array* out, const int32_t* shape, size_t ndim, mlxs_dtype dtype,
              mlxs_stream s) {
  return guard([&] { put(out, mx::ones(shape_of(shape, ndim), dtype_of(dtype), S(s))); });
}
int mlxs_full(mlxs_array* out, const int32_t* shape, size_t ndim, mlxs_array vals,
              mlxs_dtype dtype, mlxs_stream s) {
  return guard(
      [&] { put(out, mx::full(shape_of(shape, ndim), A(vals), dtype_of(dtype), S(s))); });
}
int mlxs_arange(mlxs_array* out, double start, double stop, double step, mlxs_dtype dtype,
                mlxs_stream s) {
  return guard([&] { put(out, mx::arange(start, stop, step, dtype_of(dtype), S(s))); });
}

int mlxs_reshape(mlxs_array* out, mlxs_array a, const int32_t* shape, size_t ndim,
                 mlxs_stream s) {
  return guard([&] { put(out, mx::reshape(A(a), shape_of(shape, ndim), S(s))); });
}
int mlxs_astype(mlxs_array* out, mlxs_array a, mlxs_dtype dtype, mlxs_stream s) {
  return guard([&] { put(out, mx::astype(A(a), dtype_of(dtype), S(s))); });
}

}  // extern "C"

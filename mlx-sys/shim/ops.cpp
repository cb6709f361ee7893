// Array operations.
#include <cstring>

#include "internal.hpp"

using namespace mlxs;

namespace {

std::vector<int> ivec(const int32_t* p, size_t n) {
  if (n > 0 && p == nullptr) throw std::invalid_argument("[mlxs] null integer list");
  return std::vector<int>(p, p + n);
}
mx::Shape shp(const int32_t* p, size_t n) {
  if (n > 0 && p == nullptr) throw std::invalid_argument("[mlxs] null shape");
  return mx::Shape(p, p + n);
}
void put_vec(mlxs_vec* out, std::vector<mx::array> v) { *out = wrap_vec(std::move(v)); }

}  // namespace

extern "C" {

#define MLXS_UNARY(name)                                          \
  int mlxs_##name(mlxs_array* out, mlxs_array a, mlxs_stream s) { \
    return guard([&] { put(out, mx::name(A(a), S(s))); });        \
  }
#define MLXS_BINARY(name)                                                       \
  int mlxs_##name(mlxs_array* out, mlxs_array a, mlxs_array b, mlxs_stream s) { \
    return guard([&] { put(out, mx::name(A(a), A(b), S(s))); });                \
  }
#define MLXS_REDUCE(name)                                                                  \
  int mlxs_##name(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes,        \
                  bool keepdims, mlxs_stream s) {                                          \
    return guard([&] { put(out, mx::name(A(a), ivec(axes, naxes), keepdims, S(s))); });    \
  }                                                                                        \
  int mlxs_##name##_all(mlxs_array* out, mlxs_array a, bool keepdims, mlxs_stream s) {     \
    return guard([&] { put(out, mx::name(A(a), keepdims, S(s))); });                       \
  }
#define MLXS_ARGREDUCE(name)                                                                \
  int mlxs_##name(mlxs_array* out, mlxs_array a, int axis, bool keepdims, mlxs_stream s) { \
    return guard([&] { put(out, mx::name(A(a), axis, keepdims, S(s))); });                 \
  }                                                                                         \
  int mlxs_##name##_all(mlxs_array* out, mlxs_array a, bool keepdims, mlxs_stream s) {      \
    return guard([&] { put(out, mx::name(A(a), keepdims, S(s))); });                       \
  }
#define MLXS_SCAN(name)                                                                  \
  int mlxs_##name(mlxs_array* out, mlxs_array a, int axis, bool reverse, bool inclusive, \
                  mlxs_stream s) {                                                       \
    return guard([&] { put(out, mx::name(A(a), axis, reverse, inclusive, S(s))); });     \
  }
#define MLXS_AXIS(name)                                                     \
  int mlxs_##name(mlxs_array* out, mlxs_array a, int axis, mlxs_stream s) { \
    return guard([&] { put(out, mx::name(A(a), axis, S(s))); });            \
  }
#define MLXS_KAXIS(name)                                                           \
  int mlxs_##name(mlxs_array* out, mlxs_array a, int k, int axis, mlxs_stream s) { \
    return guard([&] { put(out, mx::name(A(a), k, axis, S(s))); });                \
  }
#include "mlxs/ops_list.h"
#undef MLXS_UNARY
#undef MLXS_BINARY
#undef MLXS_REDUCE
#undef MLXS_ARGREDUCE
#undef MLXS_SCAN
#undef MLXS_AXIS
#undef MLXS_KAXIS

/* ---- creation ---- */

int mlxs_zeros(mlxs_array* out, const int32_t* shape, size_t ndim, mlxs_dtype dtype,
               mlxs_stream s) {
  return guard([&] { put(out, mx::zeros(shp(shape, ndim), dtype_of(dtype), S(s))); });
}
int mlxs_ones(mlxs_array* out, const int32_t* shape, size_t ndim, mlxs_dtype dtype,
              mlxs_stream s) {
  return guard([&] { put(out, mx::ones(shp(shape, ndim), dtype_of(dtype), S(s))); });
}
int mlxs_full(mlxs_array* out, const int32_t* shape, size_t ndim, mlxs_array vals,
              mlxs_dtype dtype, mlxs_stream s) {
  return guard([&] { put(out, mx::full(shp(shape, ndim), A(vals), dtype_of(dtype), S(s))); });
}
int mlxs_zeros_like(mlxs_array* out, mlxs_array a, mlxs_stream s) {
  return guard([&] { put(out, mx::zeros_like(A(a), S(s))); });
}
int mlxs_ones_like(mlxs_array* out, mlxs_array a, mlxs_stream s) {
  return guard([&] { put(out, mx::ones_like(A(a), S(s))); });
}
int mlxs_full_like(mlxs_array* out, mlxs_array a, mlxs_array vals, mlxs_dtype dtype,
                   mlxs_stream s) {
  return guard([&] { put(out, mx::full_like(A(a), A(vals), dtype_of(dtype), S(s))); });
}
int mlxs_arange(mlxs_array* out, double start, double stop, double step, mlxs_dtype dtype,
                mlxs_stream s) {
  return guard([&] { put(out, mx::arange(start, stop, step, dtype_of(dtype), S(s))); });
}
int mlxs_linspace(mlxs_array* out, double start, double stop, int num, bool endpoint,
                  mlxs_dtype dtype, mlxs_stream s) {
  return guard(
      [&] { put(out, mx::linspace(start, stop, num, endpoint, dtype_of(dtype), S(s))); });
}
int mlxs_eye(mlxs_array* out, int n, int m, int k, mlxs_dtype dtype, mlxs_stream s) {
  return guard([&] { put(out, mx::eye(n, m, k, dtype_of(dtype), S(s))); });
}
int mlxs_identity(mlxs_array* out, int n, mlxs_dtype dtype, mlxs_stream s) {
  return guard([&] { put(out, mx::identity(n, dtype_of(dtype), S(s))); });
}
int mlxs_tri(mlxs_array* out, int n, int m, int k, mlxs_dtype dtype, mlxs_stream s) {
  return guard([&] { put(out, mx::tri(n, m, k, dtype_of(dtype), S(s))); });
}
int mlxs_tril(mlxs_array* out, mlxs_array a, int k, mlxs_stream s) {
  return guard([&] { put(out, mx::tril(A(a), k, S(s))); });
}
int mlxs_triu(mlxs_array* out, mlxs_array a, int k, mlxs_stream s) {
  return guard([&] { put(out, mx::triu(A(a), k, S(s))); });
}
int mlxs_meshgrid(mlxs_vec* out, mlxs_vec arrays, bool sparse, const char* indexing,
                  mlxs_stream s) {
  return guard([&] {
    put_vec(out, mx::meshgrid(V(arrays), sparse, cstr(indexing, "indexing"), S(s)));
  });
}

/* ---- type ---- */

int mlxs_astype(mlxs_array* out, mlxs_array a, mlxs_dtype dtype, mlxs_stream s) {
  return guard([&] { put(out, mx::astype(A(a), dtype_of(dtype), S(s))); });
}
int mlxs_view(mlxs_array* out, mlxs_array a, mlxs_dtype dtype, mlxs_stream s) {
  return guard([&] { put(out, mx::view(A(a), dtype_of(dtype), S(s))); });
}
int mlxs_contiguous(mlxs_array* out, mlxs_array a, bool allow_col_major, mlxs_stream s) {
  return guard([&] { put(out, mx::contiguous(A(a), allow_col_major, S(s))); });
}

int mlxs_depends(mlxs_array* out, mlxs_array a, mlxs_array dep) {
  return guard([&] { put(out, mx::depends({A(a)}, {A(dep)})[0]); });
}

/* ---- elementwise with parameters ---- */

int mlxs_round(mlxs_array* out, mlxs_array a, int decimals, mlxs_stream s) {
  return guard([&] { put(out, mx::round(A(a), decimals, S(s))); });
}
int mlxs_clip(mlxs_array* out, mlxs_array a, mlxs_array a_min, mlxs_array a_max,
              mlxs_stream s) {
  return guard([&] { put(out, mx::clip(A(a), opt(a_min), opt(a_max), S(s))); });
}
int mlxs_where(mlxs_array* out, mlxs_array cond, mlxs_array x, mlxs_array y, mlxs_stream s) {
  return guard([&] { put(out, mx::where(A(cond), A(x), A(y), S(s))); });
}
int mlxs_nan_to_num(mlxs_array* out, mlxs_array a, float nan, bool has_posinf, float posinf,
                    bool has_neginf, float neginf, mlxs_stream s) {
  return guard([&] {
    auto pos = has_posinf ? std::optional<float>(posinf) : std::nullopt;
    auto neg = has_neginf ? std::optional<float>(neginf) : std::nullopt;
    put(out, mx::nan_to_num(A(a), nan, pos, neg, S(s)));
  });
}
int mlxs_isclose(mlxs_array* out, mlxs_array a, mlxs_array b, double rtol, double atol,
                 bool equal_nan, mlxs_stream s) {
  return guard([&] { put(out, mx::isclose(A(a), A(b), rtol, atol, equal_nan, S(s))); });
}
int mlxs_allclose(mlxs_array* out, mlxs_array a, mlxs_array b, double rtol, double atol,
                  bool equal_nan, mlxs_stream s) {
  return guard([&] { put(out, mx::allclose(A(a), A(b), rtol, atol, equal_nan, S(s))); });
}
int mlxs_array_equal(mlxs_array* out, mlxs_array a, mlxs_array b, bool equal_nan,
                     mlxs_stream s) {
  return guard([&] { put(out, mx::array_equal(A(a), A(b), equal_nan, S(s))); });
}

/* ---- reductions with parameters ---- */

int mlxs_var(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes, bool keepdims,
             int ddof, mlxs_stream s) {
  return guard([&] { put(out, mx::var(A(a), ivec(axes, naxes), keepdims, ddof, S(s))); });
}
int mlxs_var_all(mlxs_array* out, mlxs_array a, bool keepdims, int ddof, mlxs_stream s) {
  return guard([&] { put(out, mx::var(A(a), keepdims, ddof, S(s))); });
}
int mlxs_std(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes, bool keepdims,
             int ddof, mlxs_stream s) {
  return guard([&] { put(out, mx::std(A(a), ivec(axes, naxes), keepdims, ddof, S(s))); });
}
int mlxs_std_all(mlxs_array* out, mlxs_array a, bool keepdims, int ddof, mlxs_stream s) {
  return guard([&] { put(out, mx::std(A(a), keepdims, ddof, S(s))); });
}
int mlxs_softmax(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes,
                 bool precise, mlxs_stream s) {
  return guard([&] { put(out, mx::softmax(A(a), ivec(axes, naxes), precise, S(s))); });
}
int mlxs_softmax_all(mlxs_array* out, mlxs_array a, bool precise, mlxs_stream s) {
  return guard([&] { put(out, mx::softmax(A(a), precise, S(s))); });
}
int mlxs_hadamard_transform(mlxs_array* out, mlxs_array a, bool has_scale, float scale,
                            mlxs_stream s) {
  return guard([&] {
    auto sc = has_scale ? std::optional<float>(scale) : std::nullopt;
    put(out, mx::hadamard_transform(A(a), sc, S(s)));
  });
}
int mlxs_linalg_cholesky(mlxs_array* out, mlxs_array a, bool upper, mlxs_stream s) {
  return guard([&] { put(out, mx::linalg::cholesky(A(a), upper, S(s))); });
}
int mlxs_linalg_cholesky_inv(mlxs_array* out, mlxs_array a, bool upper, mlxs_stream s) {
  return guard([&] { put(out, mx::linalg::cholesky_inv(A(a), upper, S(s))); });
}
int mlxs_einsum(mlxs_array* out, const char* subscripts, mlxs_vec operands, mlxs_stream s) {
  return guard([&] { put(out, mx::einsum(std::string(subscripts), V(operands), S(s))); });
}

/* ---- shape ---- */

int mlxs_reshape(mlxs_array* out, mlxs_array a, const int32_t* shape, size_t ndim,
                 mlxs_stream s) {
  return guard([&] { put(out, mx::reshape(A(a), shp(shape, ndim), S(s))); });
}
int mlxs_flatten(mlxs_array* out, mlxs_array a, int start_axis, int end_axis, mlxs_stream s) {
  return guard([&] { put(out, mx::flatten(A(a), start_axis, end_axis, S(s))); });
}
int mlxs_unflatten(mlxs_array* out, mlxs_array a, int axis, const int32_t* shape, size_t ndim,
                   mlxs_stream s) {
  return guard([&] { put(out, mx::unflatten(A(a), axis, shp(shape, ndim), S(s))); });
}
int mlxs_transpose(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes,
                   mlxs_stream s) {
  return guard([&] { put(out, mx::transpose(A(a), ivec(axes, naxes), S(s))); });
}
int mlxs_transpose_all(mlxs_array* out, mlxs_array a, mlxs_stream s) {
  return guard([&] { put(out, mx::transpose(A(a), S(s))); });
}
int mlxs_swapaxes(mlxs_array* out, mlxs_array a, int axis1, int axis2, mlxs_stream s) {
  return guard([&] { put(out, mx::swapaxes(A(a), axis1, axis2, S(s))); });
}
int mlxs_moveaxis(mlxs_array* out, mlxs_array a, int source, int destination, mlxs_stream s) {
  return guard([&] { put(out, mx::moveaxis(A(a), source, destination, S(s))); });
}
int mlxs_expand_dims(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes,
                     mlxs_stream s) {
  return guard([&] { put(out, mx::expand_dims(A(a), ivec(axes, naxes), S(s))); });
}
int mlxs_squeeze(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes,
                 mlxs_stream s) {
  return guard([&] { put(out, mx::squeeze(A(a), ivec(axes, naxes), S(s))); });
}
int mlxs_squeeze_all(mlxs_array* out, mlxs_array a, mlxs_stream s) {
  return guard([&] { put(out, mx::squeeze(A(a), S(s))); });
}
int mlxs_broadcast_to(mlxs_array* out, mlxs_array a, const int32_t* shape, size_t ndim,
                      mlxs_stream s) {
  return guard([&] { put(out, mx::broadcast_to(A(a), shp(shape, ndim), S(s))); });
}
int mlxs_broadcast_arrays(mlxs_vec* out, mlxs_vec arrays, mlxs_stream s) {
  return guard([&] { put_vec(out, mx::broadcast_arrays(V(arrays), S(s))); });
}
int mlxs_concatenate(mlxs_array* out, mlxs_vec arrays, int axis, mlxs_stream s) {
  return guard([&] { put(out, mx::concatenate(V(arrays), axis, S(s))); });
}
int mlxs_stack(mlxs_array* out, mlxs_vec arrays, int axis, mlxs_stream s) {
  return guard([&] { put(out, mx::stack(V(arrays), axis, S(s))); });
}
int mlxs_split_equal(mlxs_vec* out, mlxs_array a, int num_splits, int axis, mlxs_stream s) {
  return guard([&] {
    // MLX divides by num_splits before checking it.
    if (num_splits <= 0) {
      throw std::invalid_argument("[split] Number of splits must be positive, got " +
                                  std::to_string(num_splits) + ".");
    }
    put_vec(out, mx::split(A(a), num_splits, axis, S(s)));
  });
}
int mlxs_split_at(mlxs_vec* out, mlxs_array a, const int32_t* indices, size_t nindices,
                  int axis, mlxs_stream s) {
  return guard([&] { put_vec(out, mx::split(A(a), shp(indices, nindices), axis, S(s))); });
}
int mlxs_pad(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes,
             const int32_t* low, const int32_t* high, mlxs_array value, const char* mode,
             mlxs_stream s) {
  return guard([&] {
    put(out, mx::pad(A(a), ivec(axes, naxes), shp(low, naxes), shp(high, naxes), A(value),
                     cstr(mode, "pad mode"), S(s)));
  });
}
int mlxs_repeat(mlxs_array* out, mlxs_array a, int repeats, int axis, mlxs_stream s) {
  return guard([&] { put(out, mx::repeat(A(a), repeats, axis, S(s))); });
}
int mlxs_repeat_flat(mlxs_array* out, mlxs_array a, int repeats, mlxs_stream s) {
  return guard([&] { put(out, mx::repeat(A(a), repeats, S(s))); });
}
int mlxs_tile(mlxs_array* out, mlxs_array a, const int32_t* reps, size_t nreps, mlxs_stream s) {
  return guard([&] { put(out, mx::tile(A(a), ivec(reps, nreps), S(s))); });
}
int mlxs_flip(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes, mlxs_stream s) {
  return guard([&] { put(out, mx::flip(A(a), ivec(axes, naxes), S(s))); });
}
int mlxs_roll(mlxs_array* out, mlxs_array a, const int32_t* shift, size_t nshift,
              const int32_t* axes, size_t naxes, mlxs_stream s) {
  return guard([&] { put(out, mx::roll(A(a), shp(shift, nshift), ivec(axes, naxes), S(s))); });
}

/* ---- slicing and indexing ---- */

int mlxs_slice(mlxs_array* out, mlxs_array a, const int32_t* start, const int32_t* stop,
               const int32_t* strides, size_t ndim, mlxs_stream s) {
  return guard([&] {
    put(out, mx::slice(A(a), shp(start, ndim), shp(stop, ndim), shp(strides, ndim), S(s)));
  });
}
int mlxs_slice_update(mlxs_array* out, mlxs_array src, mlxs_array update,
                      const int32_t* start, const int32_t* stop, const int32_t* strides,
                      size_t ndim, mlxs_stream s) {
  return guard([&] {
    put(out, mx::slice_update(A(src), A(update), shp(start, ndim), shp(stop, ndim),
                              shp(strides, ndim), S(s)));
  });
}
int mlxs_slice_dynamic(mlxs_array* out, mlxs_array a, mlxs_array start, const int32_t* axes,
                       size_t naxes, const int32_t* slice_size, size_t nsize, mlxs_stream s) {
  return guard([&] {
    put(out, mx::slice(A(a), A(start), ivec(axes, naxes), shp(slice_size, nsize), S(s)));
  });
}
int mlxs_slice_update_dynamic(mlxs_array* out, mlxs_array src, mlxs_array update,
                              mlxs_array start, const int32_t* axes, size_t naxes,
                              mlxs_stream s) {
  return guard([&] {
    put(out, mx::slice_update(A(src), A(update), A(start), ivec(axes, naxes), S(s)));
  });
}
int mlxs_take(mlxs_array* out, mlxs_array a, mlxs_array indices, int axis, mlxs_stream s) {
  return guard([&] { put(out, mx::take(A(a), A(indices), axis, S(s))); });
}
int mlxs_take_flat(mlxs_array* out, mlxs_array a, mlxs_array indices, mlxs_stream s) {
  return guard([&] { put(out, mx::take(A(a), A(indices), S(s))); });
}
int mlxs_take_along_axis(mlxs_array* out, mlxs_array a, mlxs_array indices, int axis,
                         mlxs_stream s) {
  return guard([&] { put(out, mx::take_along_axis(A(a), A(indices), axis, S(s))); });
}
int mlxs_put_along_axis(mlxs_array* out, mlxs_array a, mlxs_array indices, mlxs_array values,
                        int axis, mlxs_stream s) {
  return guard([&] { put(out, mx::put_along_axis(A(a), A(indices), A(values), axis, S(s))); });
}
int mlxs_gather(mlxs_array* out, mlxs_array a, mlxs_vec indices, const int32_t* axes,
                size_t naxes, const int32_t* slice_sizes, size_t nsizes, mlxs_stream s) {
  return guard([&] {
    put(out, mx::gather(A(a), V(indices), ivec(axes, naxes), shp(slice_sizes, nsizes), S(s)));
  });
}
int mlxs_scatter(mlxs_array* out, mlxs_array a, mlxs_vec indices, mlxs_array updates,
                 const int32_t* axes, size_t naxes, mlxs_stream s) {
  return guard(
      [&] { put(out, mx::scatter(A(a), V(indices), A(updates), ivec(axes, naxes), S(s))); });
}
int mlxs_scatter_add(mlxs_array* out, mlxs_array a, mlxs_vec indices, mlxs_array updates,
                     const int32_t* axes, size_t naxes, mlxs_stream s) {
  return guard([&] {
    put(out, mx::scatter_add(A(a), V(indices), A(updates), ivec(axes, naxes), S(s)));
  });
}

/* ---- linear algebra ---- */

int mlxs_addmm(mlxs_array* out, mlxs_array c, mlxs_array a, mlxs_array b, float alpha,
               float beta, mlxs_stream s) {
  return guard([&] { put(out, mx::addmm(A(c), A(a), A(b), alpha, beta, S(s))); });
}
int mlxs_tensordot(mlxs_array* out, mlxs_array a, mlxs_array b, const int32_t* axes_a,
                   size_t naxes_a, const int32_t* axes_b, size_t naxes_b, mlxs_stream s) {
  return guard([&] {
    put(out, mx::tensordot(A(a), A(b), ivec(axes_a, naxes_a), ivec(axes_b, naxes_b), S(s)));
  });
}
int mlxs_tensordot_n(mlxs_array* out, mlxs_array a, mlxs_array b, int n, mlxs_stream s) {
  return guard([&] { put(out, mx::tensordot(A(a), A(b), n, S(s))); });
}
int mlxs_conv1d(mlxs_array* out, mlxs_array input, mlxs_array weight, int stride, int padding,
                int dilation, int groups, mlxs_stream s) {
  return guard([&] {
    put(out, mx::conv1d(A(input), A(weight), stride, padding, dilation, groups, S(s)));
  });
}
int mlxs_conv2d(mlxs_array* out, mlxs_array input, mlxs_array weight, const int32_t* stride,
                const int32_t* padding, const int32_t* dilation, int groups, mlxs_stream s) {
  return guard([&] {
    auto st = ivec(stride, 2), pd = ivec(padding, 2), dl = ivec(dilation, 2);
    put(out, mx::conv2d(A(input), A(weight), {st[0], st[1]}, {pd[0], pd[1]}, {dl[0], dl[1]},
                        groups, S(s)));
  });
}

}  // extern "C"

/* Array operations (mlx/ops.h). Every op takes a nullable stream last. Arrays of ints
 * (shapes, axes) come as a pointer and a length; a NULL pointer is fine with length 0.
 * An optional array argument is a nullable handle. */
#ifndef MLXS_OPS_H
#define MLXS_OPS_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MLXS_UNARY(name) int mlxs_##name(mlxs_array* out, mlxs_array a, mlxs_stream s);
#define MLXS_BINARY(name) \
  int mlxs_##name(mlxs_array* out, mlxs_array a, mlxs_array b, mlxs_stream s);
#define MLXS_REDUCE(name)                                                              \
  int mlxs_##name(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes,    \
                  bool keepdims, mlxs_stream s);                                       \
  int mlxs_##name##_all(mlxs_array* out, mlxs_array a, bool keepdims, mlxs_stream s);
#define MLXS_ARGREDUCE(name)                                                           \
  int mlxs_##name(mlxs_array* out, mlxs_array a, int axis, bool keepdims, mlxs_stream s); \
  int mlxs_##name##_all(mlxs_array* out, mlxs_array a, bool keepdims, mlxs_stream s);
#define MLXS_SCAN(name)                                                                \
  int mlxs_##name(mlxs_array* out, mlxs_array a, int axis, bool reverse, bool inclusive, \
                  mlxs_stream s);
#define MLXS_AXIS(name) int mlxs_##name(mlxs_array* out, mlxs_array a, int axis, mlxs_stream s);
#define MLXS_KAXIS(name) \
  int mlxs_##name(mlxs_array* out, mlxs_array a, int k, int axis, mlxs_stream s);
#include "ops_list.h"
#undef MLXS_UNARY
#undef MLXS_BINARY
#undef MLXS_REDUCE
#undef MLXS_ARGREDUCE
#undef MLXS_SCAN
#undef MLXS_AXIS
#undef MLXS_KAXIS

/* ---- creation ---- */
int mlxs_zeros(mlxs_array* out, const int32_t* shape, size_t ndim, mlxs_dtype dtype,
               mlxs_stream s);
int mlxs_ones(mlxs_array* out, const int32_t* shape, size_t ndim, mlxs_dtype dtype,
              mlxs_stream s);
/* vals is broadcast to shape and cast to dtype. */
int mlxs_full(mlxs_array* out, const int32_t* shape, size_t ndim, mlxs_array vals,
              mlxs_dtype dtype, mlxs_stream s);
int mlxs_zeros_like(mlxs_array* out, mlxs_array a, mlxs_stream s);
int mlxs_ones_like(mlxs_array* out, mlxs_array a, mlxs_stream s);
/* vals is broadcast to a's shape and cast to dtype. */
int mlxs_full_like(mlxs_array* out, mlxs_array a, mlxs_array vals, mlxs_dtype dtype,
                   mlxs_stream s);
int mlxs_arange(mlxs_array* out, double start, double stop, double step, mlxs_dtype dtype,
                mlxs_stream s);
int mlxs_linspace(mlxs_array* out, double start, double stop, int num, bool endpoint,
                  mlxs_dtype dtype, mlxs_stream s);
int mlxs_eye(mlxs_array* out, int n, int m, int k, mlxs_dtype dtype, mlxs_stream s);
int mlxs_identity(mlxs_array* out, int n, mlxs_dtype dtype, mlxs_stream s);
int mlxs_tri(mlxs_array* out, int n, int m, int k, mlxs_dtype dtype, mlxs_stream s);
int mlxs_tril(mlxs_array* out, mlxs_array a, int k, mlxs_stream s);
int mlxs_triu(mlxs_array* out, mlxs_array a, int k, mlxs_stream s);
/* indexing is "xy" or "ij". */
int mlxs_meshgrid(mlxs_vec* out, mlxs_vec arrays, bool sparse, const char* indexing,
                  mlxs_stream s);

/* ---- type ---- */
int mlxs_astype(mlxs_array* out, mlxs_array a, mlxs_dtype dtype, mlxs_stream s);
/* The same bytes read as dtype (the last axis scales by the size ratio). */
int mlxs_view(mlxs_array* out, mlxs_array a, mlxs_dtype dtype, mlxs_stream s);
int mlxs_contiguous(mlxs_array* out, mlxs_array a, bool allow_col_major, mlxs_stream s);
/* mx::depends({a}, {dep})[0]: a's values, evaluated only after dep (mlx-lm's pipeline
 * stages tie a send to their cache with it). */
int mlxs_depends(mlxs_array* out, mlxs_array a, mlxs_array dep);

/* ---- elementwise with parameters ---- */
int mlxs_round(mlxs_array* out, mlxs_array a, int decimals, mlxs_stream s);
/* a_min and a_max may be NULL (no bound), not both. */
int mlxs_clip(mlxs_array* out, mlxs_array a, mlxs_array a_min, mlxs_array a_max,
              mlxs_stream s);
int mlxs_where(mlxs_array* out, mlxs_array cond, mlxs_array x, mlxs_array y, mlxs_stream s);
/* has_posinf / has_neginf false: the dtype's largest / lowest finite value. */
int mlxs_nan_to_num(mlxs_array* out, mlxs_array a, float nan, bool has_posinf, float posinf,
                    bool has_neginf, float neginf, mlxs_stream s);
int mlxs_isclose(mlxs_array* out, mlxs_array a, mlxs_array b, double rtol, double atol,
                 bool equal_nan, mlxs_stream s);
int mlxs_allclose(mlxs_array* out, mlxs_array a, mlxs_array b, double rtol, double atol,
                  bool equal_nan, mlxs_stream s);
int mlxs_array_equal(mlxs_array* out, mlxs_array a, mlxs_array b, bool equal_nan,
                     mlxs_stream s);

/* ---- reductions with parameters ---- */
int mlxs_var(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes, bool keepdims,
             int ddof, mlxs_stream s);
int mlxs_var_all(mlxs_array* out, mlxs_array a, bool keepdims, int ddof, mlxs_stream s);
int mlxs_std(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes, bool keepdims,
             int ddof, mlxs_stream s);
int mlxs_std_all(mlxs_array* out, mlxs_array a, bool keepdims, int ddof, mlxs_stream s);
int mlxs_softmax(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes,
                 bool precise, mlxs_stream s);
int mlxs_softmax_all(mlxs_array* out, mlxs_array a, bool precise, mlxs_stream s);
/* The Walsh-Hadamard transform over the last axis; scale is used when has_scale, else
 * 1 / sqrt(the axis' size). */
int mlxs_hadamard_transform(mlxs_array* out, mlxs_array a, bool has_scale, float scale,
                            mlxs_stream s);
/* mx.linalg.cholesky(a, upper): the Cholesky factor of a symmetric positive definite
 * float32 matrix (batched over leading axes); CPU streams only. */
int mlxs_linalg_cholesky(mlxs_array* out, mlxs_array a, bool upper, mlxs_stream s);
/* mx.linalg.cholesky_inv(L, upper): the inverse of A given its Cholesky factor L; CPU only. */
int mlxs_linalg_cholesky_inv(mlxs_array* out, mlxs_array a, bool upper, mlxs_stream s);
/* mx.einsum(subscripts, *operands) (subscripts a NUL-terminated string). */
int mlxs_einsum(mlxs_array* out, const char* subscripts, mlxs_vec operands, mlxs_stream s);

/* ---- shape ---- */
int mlxs_reshape(mlxs_array* out, mlxs_array a, const int32_t* shape, size_t ndim,
                 mlxs_stream s);
int mlxs_flatten(mlxs_array* out, mlxs_array a, int start_axis, int end_axis, mlxs_stream s);
int mlxs_unflatten(mlxs_array* out, mlxs_array a, int axis, const int32_t* shape, size_t ndim,
                   mlxs_stream s);
int mlxs_transpose(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes,
                   mlxs_stream s);
/* Reverses the axes. */
int mlxs_transpose_all(mlxs_array* out, mlxs_array a, mlxs_stream s);
int mlxs_swapaxes(mlxs_array* out, mlxs_array a, int axis1, int axis2, mlxs_stream s);
int mlxs_moveaxis(mlxs_array* out, mlxs_array a, int source, int destination, mlxs_stream s);
int mlxs_expand_dims(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes,
                     mlxs_stream s);
int mlxs_squeeze(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes,
                 mlxs_stream s);
int mlxs_squeeze_all(mlxs_array* out, mlxs_array a, mlxs_stream s);
int mlxs_broadcast_to(mlxs_array* out, mlxs_array a, const int32_t* shape, size_t ndim,
                      mlxs_stream s);
int mlxs_broadcast_arrays(mlxs_vec* out, mlxs_vec arrays, mlxs_stream s);
int mlxs_concatenate(mlxs_array* out, mlxs_vec arrays, int axis, mlxs_stream s);
int mlxs_stack(mlxs_array* out, mlxs_vec arrays, int axis, mlxs_stream s);
int mlxs_split_equal(mlxs_vec* out, mlxs_array a, int num_splits, int axis, mlxs_stream s);
int mlxs_split_at(mlxs_vec* out, mlxs_array a, const int32_t* indices, size_t nindices,
                  int axis, mlxs_stream s);
/* mode: "constant", "edge", "reflect" or "symmetric"; value is cast to a's dtype. */
int mlxs_pad(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes,
             const int32_t* low, const int32_t* high, mlxs_array value, const char* mode,
             mlxs_stream s);
int mlxs_repeat(mlxs_array* out, mlxs_array a, int repeats, int axis, mlxs_stream s);
/* Repeats the flattened array. */
int mlxs_repeat_flat(mlxs_array* out, mlxs_array a, int repeats, mlxs_stream s);
int mlxs_tile(mlxs_array* out, mlxs_array a, const int32_t* reps, size_t nreps, mlxs_stream s);
int mlxs_flip(mlxs_array* out, mlxs_array a, const int32_t* axes, size_t naxes, mlxs_stream s);
int mlxs_roll(mlxs_array* out, mlxs_array a, const int32_t* shift, size_t nshift,
              const int32_t* axes, size_t naxes, mlxs_stream s);

/* ---- slicing and indexing ---- */
/* start, stop and strides each hold ndim values. */
int mlxs_slice(mlxs_array* out, mlxs_array a, const int32_t* start, const int32_t* stop,
               const int32_t* strides, size_t ndim, mlxs_stream s);
int mlxs_slice_update(mlxs_array* out, mlxs_array src, mlxs_array update,
                      const int32_t* start, const int32_t* stop, const int32_t* strides,
                      size_t ndim, mlxs_stream s);
/* start holds one (integer) start per axis in axes; slice_size holds ndim sizes. */
int mlxs_slice_dynamic(mlxs_array* out, mlxs_array a, mlxs_array start, const int32_t* axes,
                       size_t naxes, const int32_t* slice_size, size_t nsize, mlxs_stream s);
int mlxs_slice_update_dynamic(mlxs_array* out, mlxs_array src, mlxs_array update,
                              mlxs_array start, const int32_t* axes, size_t naxes,
                              mlxs_stream s);
int mlxs_take(mlxs_array* out, mlxs_array a, mlxs_array indices, int axis, mlxs_stream s);
/* Takes from the flattened array. */
int mlxs_take_flat(mlxs_array* out, mlxs_array a, mlxs_array indices, mlxs_stream s);
int mlxs_take_along_axis(mlxs_array* out, mlxs_array a, mlxs_array indices, int axis,
                         mlxs_stream s);
int mlxs_put_along_axis(mlxs_array* out, mlxs_array a, mlxs_array indices, mlxs_array values,
                        int axis, mlxs_stream s);
/* indices holds one index array per axis in axes. */
int mlxs_gather(mlxs_array* out, mlxs_array a, mlxs_vec indices, const int32_t* axes,
                size_t naxes, const int32_t* slice_sizes, size_t nsizes, mlxs_stream s);
int mlxs_scatter(mlxs_array* out, mlxs_array a, mlxs_vec indices, mlxs_array updates,
                 const int32_t* axes, size_t naxes, mlxs_stream s);
int mlxs_scatter_add(mlxs_array* out, mlxs_array a, mlxs_vec indices, mlxs_array updates,
                     const int32_t* axes, size_t naxes, mlxs_stream s);

/* ---- linear algebra ---- */
/* beta * c + alpha * (a @ b) */
int mlxs_addmm(mlxs_array* out, mlxs_array c, mlxs_array a, mlxs_array b, float alpha,
               float beta, mlxs_stream s);
int mlxs_tensordot(mlxs_array* out, mlxs_array a, mlxs_array b, const int32_t* axes_a,
                   size_t naxes_a, const int32_t* axes_b, size_t naxes_b, mlxs_stream s);
int mlxs_tensordot_n(mlxs_array* out, mlxs_array a, mlxs_array b, int n, mlxs_stream s);
int mlxs_conv1d(mlxs_array* out, mlxs_array input, mlxs_array weight, int stride, int padding,
                int dilation, int groups, mlxs_stream s);
/* stride, padding and dilation each hold 2 values. */
int mlxs_conv2d(mlxs_array* out, mlxs_array input, mlxs_array weight, const int32_t* stride,
                const int32_t* padding, const int32_t* dilation, int groups, mlxs_stream s);

#ifdef __cplusplus
}
#endif

#endif

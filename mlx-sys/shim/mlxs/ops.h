/* Array operations (mlx/ops.h). Every op takes a nullable stream last. */
#ifndef MLXS_OPS_H
#define MLXS_OPS_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MLXS_UNARY(name) int mlxs_##name(mlxs_array* out, mlxs_array a, mlxs_stream s);
#define MLXS_BINARY(name) \
  int mlxs_##name(mlxs_array* out, mlxs_array a, mlxs_array b, mlxs_stream s);
#include "ops_list.h"
#undef MLXS_UNARY
#undef MLXS_BINARY

/* ---- creation ---- */
int mlxs_zeros(mlxs_array* out, const int32_t* shape, size_t ndim, mlxs_dtype dtype,
               mlxs_stream s);
int mlxs_ones(mlxs_array* out, const int32_t* shape, size_t ndim, mlxs_dtype dtype,
              mlxs_stream s);
/* vals is broadcast to shape and cast to dtype. */
int mlxs_full(mlxs_array* out, const int32_t* shape, size_t ndim, mlxs_array vals,
              mlxs_dtype dtype, mlxs_stream s);
int mlxs_arange(mlxs_array* out, double start, double stop, double step, mlxs_dtype dtype,
                mlxs_stream s);

/* ---- shape and type ---- */
int mlxs_reshape(mlxs_array* out, mlxs_array a, const int32_t* shape, size_t ndim,
                 mlxs_stream s);
int mlxs_astype(mlxs_array* out, mlxs_array a, mlxs_dtype dtype, mlxs_stream s);

#ifdef __cplusplus
}
#endif

#endif

/* Custom GPU kernels written in source form (mx::fast::metal_kernel, mx::fast::cuda_kernel). */
#ifndef MLXS_KERNELS_H
#define MLXS_KERNELS_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mlxs_kernel_* mlxs_kernel;

typedef enum mlxs_kernel_backend {
  MLXS_KERNEL_METAL = 0,
  MLXS_KERNEL_CUDA = 1,
} mlxs_kernel_backend;

/* Whether this libmlx has the back-end and a device for it (metal::is_available(),
 * cu::is_available()). */
bool mlxs_kernel_backend_available(mlxs_kernel_backend backend);

/* Builds a kernel. atomic_outputs is Metal only, shared_memory CUDA only (the other
 * back-end rejects a non-default value). header may be NULL. */
int mlxs_kernel_new(mlxs_kernel* out, mlxs_kernel_backend backend, const char* name,
                    const char* const* input_names, size_t n_inputs,
                    const char* const* output_names, size_t n_outputs, const char* source,
                    const char* header, bool ensure_row_contiguous, bool atomic_outputs,
                    int shared_memory);
void mlxs_kernel_free(mlxs_kernel k);

typedef enum mlxs_template_kind {
  MLXS_TEMPLATE_INT = 0,
  MLXS_TEMPLATE_BOOL = 1,
  MLXS_TEMPLATE_DTYPE = 2,
} mlxs_template_kind;

/* One template argument: value is the int, 0/1 for a bool, or an mlxs_dtype. */
typedef struct mlxs_template_arg {
  const char* name;
  mlxs_template_kind kind;
  int value;
} mlxs_template_arg;

/* Runs the kernel. Output i has shape output_shapes[offset_i .. offset_i + output_ndims[i]]
 * (the shapes are concatenated) and dtype output_dtypes[i]. grid and threadgroup hold 3
 * ints each. has_init_value selects init_value. Writes a new vector of outputs. */
int mlxs_kernel_apply(mlxs_vec* out, mlxs_kernel k, mlxs_vec inputs,
                      const int32_t* output_shapes, const size_t* output_ndims,
                      const mlxs_dtype* output_dtypes, size_t n_outputs, const int32_t* grid,
                      const int32_t* threadgroup, const mlxs_template_arg* template_args,
                      size_t n_template_args, bool has_init_value, float init_value,
                      bool verbose, mlxs_stream s);

#ifdef __cplusplus
}
#endif

#endif

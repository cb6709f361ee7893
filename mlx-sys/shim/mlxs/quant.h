/* Quantization (mlx/ops.h): quantize, dequantize, quantized and gathered matmuls.
 *
 * mode is "affine", "mxfp4", "mxfp8" or "nvfp4". A group_size or bits <= 0 means the mode's
 * default (MLX's std::nullopt). global_scale (nvfp4 only) may be NULL. */
#ifndef MLXS_QUANT_H
#define MLXS_QUANT_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out receives [w_q, scales] or [w_q, scales, biases] (affine). */
int mlxs_quantize(mlxs_vec* out, mlxs_array w, int group_size, int bits, const char* mode,
                  mlxs_array global_scale, mlxs_stream s);
/* biases may be NULL; the output dtype is dtype when has_dtype, else MLX's inference. */
int mlxs_dequantize(mlxs_array* out, mlxs_array w, mlxs_array scales, mlxs_array biases,
                    int group_size, int bits, const char* mode, mlxs_array global_scale,
                    bool has_dtype, mlxs_dtype dtype, mlxs_stream s);
int mlxs_quantized_matmul(mlxs_array* out, mlxs_array x, mlxs_array w, mlxs_array scales,
                          mlxs_array biases, bool transpose, int group_size, int bits,
                          const char* mode, mlxs_stream s);
/* lhs_indices, rhs_indices, biases and global_scale may be NULL. */
int mlxs_gather_qmm(mlxs_array* out, mlxs_array x, mlxs_array w, mlxs_array scales,
                    mlxs_array biases, mlxs_array lhs_indices, mlxs_array rhs_indices,
                    bool transpose, int group_size, int bits, const char* mode,
                    mlxs_array global_scale, bool sorted_indices, mlxs_stream s);
/* lhs_indices and rhs_indices may be NULL. */
int mlxs_gather_mm(mlxs_array* out, mlxs_array a, mlxs_array b, mlxs_array lhs_indices,
                   mlxs_array rhs_indices, bool sorted_indices, mlxs_stream s);

#ifdef __cplusplus
}
#endif

#endif

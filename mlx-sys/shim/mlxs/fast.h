/* Fused ops (mlx/fast.h): normalizations, rotary embeddings, attention. */
#ifndef MLXS_FAST_H
#define MLXS_FAST_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* weight may be NULL (no scaling). */
int mlxs_fast_rms_norm(mlxs_array* out, mlxs_array x, mlxs_array weight, float eps,
                       mlxs_stream s);
/* weight and bias may be NULL. */
int mlxs_fast_layer_norm(mlxs_array* out, mlxs_array x, mlxs_array weight, mlxs_array bias,
                         float eps, mlxs_stream s);
/* Rotary embedding with an array offset (a scalar, or one per batch element), as MLX's
 * Python binding always calls it. base is used when has_base; freqs may be NULL. */
int mlxs_fast_rope(mlxs_array* out, mlxs_array x, int dims, bool traditional, bool has_base,
                   float base, float scale, mlxs_array offset, mlxs_array freqs,
                   mlxs_stream s);
/* Attention. mask_mode is "" (no mask), "causal" or "array" (mask required: boolean or
 * additive). mask and sinks may be NULL. */
int mlxs_fast_scaled_dot_product_attention(mlxs_array* out, mlxs_array q, mlxs_array k,
                                           mlxs_array v, float scale, const char* mask_mode,
                                           mlxs_array mask, mlxs_array sinks, mlxs_stream s);
/* The gated delta rule recurrence (Qwen3-Next / Qwen3.5): out receives [y, final_state].
 * q, k (B, T, Hk, Dk); v (B, T, Hv, Dv); gates (B, T, Hv) or (B, T, Hv, Dk); beta (B, T, Hv);
 * initial_state (B, Hv, Dv, Dk) and mask (B, T) may be NULL. */
int mlxs_fast_gated_delta_update(mlxs_vec* out, mlxs_array q, mlxs_array k, mlxs_array v,
                                 mlxs_array gates, mlxs_array beta, mlxs_array initial_state,
                                 mlxs_array mask, mlxs_stream s);

#ifdef __cplusplus
}
#endif

#endif

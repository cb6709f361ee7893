// Fused ops (mlx/fast.h).
#include "internal.hpp"

using namespace mlxs;

extern "C" {

int mlxs_fast_rms_norm(mlxs_array* out, mlxs_array x, mlxs_array weight, float eps,
                       mlxs_stream s) {
  return guard([&] { put(out, mx::fast::rms_norm(A(x), opt(weight), eps, S(s))); });
}

int mlxs_fast_layer_norm(mlxs_array* out, mlxs_array x, mlxs_array weight, mlxs_array bias,
                         float eps, mlxs_stream s) {
  return guard(
      [&] { put(out, mx::fast::layer_norm(A(x), opt(weight), opt(bias), eps, S(s))); });
}

int mlxs_fast_rope(mlxs_array* out, mlxs_array x, int dims, bool traditional, bool has_base,
                   float base, float scale, mlxs_array offset, mlxs_array freqs,
                   mlxs_stream s) {
  return guard([&] {
    std::optional<float> b = has_base ? std::optional<float>(base) : std::nullopt;
    put(out, mx::fast::rope(A(x), dims, traditional, b, scale, A(offset), opt(freqs), S(s)));
  });
}

int mlxs_fast_scaled_dot_product_attention(mlxs_array* out, mlxs_array q, mlxs_array k,
                                           mlxs_array v, float scale, const char* mask_mode,
                                           mlxs_array mask, mlxs_array sinks, mlxs_stream s) {
  return guard([&] {
    put(out, mx::fast::scaled_dot_product_attention(
                 A(q), A(k), A(v), scale, std::string(cstr(mask_mode, "mask_mode")),
                 opt(mask), opt(sinks), /*force_fused=*/false, S(s)));
  });
}

int mlxs_fast_gated_delta_update(mlxs_vec* out, mlxs_array q, mlxs_array k, mlxs_array v,
                                 mlxs_array gates, mlxs_array beta, mlxs_array initial_state,
                                 mlxs_array mask, mlxs_stream s) {
  return guard([&] {
    *out = wrap_vec(mx::fast::gated_delta_update(A(q), A(k), A(v), A(gates), A(beta),
                                              opt(initial_state), opt(mask), S(s)));
  });
}

}  // extern "C"

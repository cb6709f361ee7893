// Quantization: quantize, dequantize, quantized_matmul, gather_qmm, gather_mm.
#include "internal.hpp"

using namespace mlxs;

namespace {
std::optional<int> opt_int(int v) { return v > 0 ? std::optional<int>(v) : std::nullopt; }
}  // namespace

extern "C" {

int mlxs_quantize(mlxs_vec* out, mlxs_array w, int group_size, int bits, const char* mode,
                  mlxs_array global_scale, mlxs_stream s) {
  return guard([&] {
    auto r = mx::quantize(A(w), opt_int(group_size), opt_int(bits),
                          std::string(cstr(mode, "mode")), opt(global_scale), S(s));
    *out = wrap_vec(std::move(r));
  });
}

int mlxs_dequantize(mlxs_array* out, mlxs_array w, mlxs_array scales, mlxs_array biases,
                    int group_size, int bits, const char* mode, mlxs_array global_scale,
                    bool has_dtype, mlxs_dtype dtype, mlxs_stream s) {
  return guard([&] {
    std::optional<mx::Dtype> dt =
        has_dtype ? std::optional<mx::Dtype>(dtype_of(dtype)) : std::nullopt;
    put(out, mx::dequantize(A(w), A(scales), opt(biases), opt_int(group_size), opt_int(bits),
                            std::string(cstr(mode, "mode")), opt(global_scale), dt, S(s)));
  });
}

int mlxs_quantized_matmul(mlxs_array* out, mlxs_array x, mlxs_array w, mlxs_array scales,
                          mlxs_array biases, bool transpose, int group_size, int bits,
                          const char* mode, mlxs_stream s) {
  return guard([&] {
    put(out, mx::quantized_matmul(A(x), A(w), A(scales), opt(biases), transpose,
                                  opt_int(group_size), opt_int(bits),
                                  std::string(cstr(mode, "mode")), S(s)));
  });
}

int mlxs_gather_qmm(mlxs_array* out, mlxs_array x, mlxs_array w, mlxs_array scales,
                    mlxs_array biases, mlxs_array lhs_indices, mlxs_array rhs_indices,
                    bool transpose, int group_size, int bits, const char* mode,
                    mlxs_array global_scale, bool sorted_indices, mlxs_stream s) {
  return guard([&] {
    put(out, mx::gather_qmm(A(x), A(w), A(scales), opt(biases), opt(lhs_indices),
                            opt(rhs_indices), transpose, opt_int(group_size), opt_int(bits),
                            std::string(cstr(mode, "mode")), opt(global_scale),
                            sorted_indices, S(s)));
  });
}

int mlxs_gather_mm(mlxs_array* out, mlxs_array a, mlxs_array b, mlxs_array lhs_indices,
                   mlxs_array rhs_indices, bool sorted_indices, mlxs_stream s) {
  return guard([&] {
    put(out, mx::gather_mm(A(a), A(b), opt(lhs_indices), opt(rhs_indices), sorted_indices,
                           S(s)));
  });
}

}  // extern "C"

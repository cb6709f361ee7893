// Custom GPU kernels from source (mx::fast::metal_kernel, mx::fast::cuda_kernel).
#include <mlx/backend/cuda/cuda.h>
#include <mlx/backend/metal/metal.h>

#include "internal.hpp"

using namespace mlxs;

struct mlxs_kernel_ {
  mx::fast::CustomKernelFunction f;
};

namespace {

std::vector<std::string> names(const char* const* p, size_t n, const char* what) {
  if (n > 0 && p == nullptr) throw std::invalid_argument(std::string("[mlxs] null ") + what);
  std::vector<std::string> v;
  v.reserve(n);
  for (size_t i = 0; i < n; ++i) v.emplace_back(cstr(p[i], what));
  return v;
}

}  // namespace

extern "C" {

bool mlxs_kernel_backend_available(mlxs_kernel_backend backend) {
  try {
    switch (backend) {
      case MLXS_KERNEL_METAL: return mx::metal::is_available();
      case MLXS_KERNEL_CUDA: return mx::cu::is_available();
    }
  } catch (...) {
  }
  return false;
}

int mlxs_kernel_new(mlxs_kernel* out, mlxs_kernel_backend backend, const char* name,
                    const char* const* input_names, size_t n_inputs,
                    const char* const* output_names, size_t n_outputs, const char* source,
                    const char* header, bool ensure_row_contiguous, bool atomic_outputs,
                    int shared_memory) {
  return guard([&] {
    std::string nm = cstr(name, "kernel name");
    auto ins = names(input_names, n_inputs, "input name");
    auto outs = names(output_names, n_outputs, "output name");
    std::string src = cstr(source, "kernel source");
    std::string hdr = header ? header : "";
    switch (backend) {
      case MLXS_KERNEL_METAL:
        if (shared_memory != 0) {
          throw std::invalid_argument("[metal_kernel] shared_memory is a CUDA-only option");
        }
        *out = new mlxs_kernel_{mx::fast::metal_kernel(nm, ins, outs, src, hdr,
                                                       ensure_row_contiguous, atomic_outputs)};
        return;
      case MLXS_KERNEL_CUDA:
        if (atomic_outputs) {
          throw std::invalid_argument("[cuda_kernel] atomic_outputs is a Metal-only option");
        }
        *out = new mlxs_kernel_{mx::fast::cuda_kernel(nm, ins, outs, src, hdr,
                                                      ensure_row_contiguous, shared_memory)};
        return;
    }
    throw std::invalid_argument("[mlxs] unknown kernel back-end " + std::to_string(int(backend)));
  });
}

void mlxs_kernel_free(mlxs_kernel k) { delete k; }

int mlxs_kernel_apply(mlxs_vec* out, mlxs_kernel k, mlxs_vec inputs,
                      const int32_t* output_shapes, const size_t* output_ndims,
                      const mlxs_dtype* output_dtypes, size_t n_outputs, const int32_t* grid,
                      const int32_t* threadgroup, const mlxs_template_arg* template_args,
                      size_t n_template_args, bool has_init_value, float init_value,
                      bool verbose, mlxs_stream s) {
  return guard([&] {
    if (k == nullptr) throw std::invalid_argument("[mlxs] null kernel handle");
    if (grid == nullptr || threadgroup == nullptr) {
      throw std::invalid_argument("[mlxs] null grid or threadgroup");
    }
    std::vector<mx::Shape> shapes;
    std::vector<mx::Dtype> dtypes;
    size_t off = 0;
    for (size_t i = 0; i < n_outputs; ++i) {
      shapes.push_back(shape_of(output_shapes + off, output_ndims[i]));
      off += output_ndims[i];
      dtypes.push_back(dtype_of(output_dtypes[i]));
    }
    std::vector<std::pair<std::string, mx::fast::TemplateArg>> targs;
    for (size_t i = 0; i < n_template_args; ++i) {
      const auto& t = template_args[i];
      std::string tn = cstr(t.name, "template argument name");
      switch (t.kind) {
        case MLXS_TEMPLATE_INT: targs.emplace_back(tn, mx::fast::TemplateArg(int(t.value))); break;
        case MLXS_TEMPLATE_BOOL: targs.emplace_back(tn, mx::fast::TemplateArg(t.value != 0)); break;
        case MLXS_TEMPLATE_DTYPE:
          targs.emplace_back(tn, mx::fast::TemplateArg(dtype_of(mlxs_dtype(t.value))));
          break;
        default: throw std::invalid_argument("[mlxs] unknown template argument kind");
      }
    }
    std::optional<float> init = has_init_value ? std::optional<float>(init_value) : std::nullopt;
    auto res = k->f(V(inputs), shapes, dtypes, {grid[0], grid[1], grid[2]},
                    {threadgroup[0], threadgroup[1], threadgroup[2]}, std::move(targs), init,
                    verbose, S(s));
    *out = wrap_vec(std::move(res));
  });
}

}  // extern "C"

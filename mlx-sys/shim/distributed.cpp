// MLX's distributed layer: groups and collectives, every entry inside the exception guard.
#include <mlx/distributed/distributed.h>
#include <mlx/distributed/ops.h>

#include "internal.hpp"

using namespace mlxs;
namespace md = mx::distributed;

struct mlxs_group_ {
  md::Group g;
};

namespace {

std::optional<md::Group> G(mlxs_group g) {
  return g ? std::optional<md::Group>(g->g) : std::nullopt;
}

std::string backend_name(const char* b) { return b ? std::string(b) : std::string("any"); }

}  // namespace

extern "C" {

int mlxs_distributed_is_available(bool* out, const char* backend) {
  return guard([&] { *out = md::is_available(backend_name(backend)); });
}

int mlxs_distributed_init(mlxs_group* out, bool strict, const char* backend) {
  return guard([&] { *out = new mlxs_group_{md::init(strict, backend_name(backend))}; });
}

void mlxs_group_free(mlxs_group g) { delete g; }

int mlxs_group_rank(int* out, mlxs_group g) {
  return guard([&] {
    if (g == nullptr) throw std::invalid_argument("[mlxs] null group handle");
    *out = g->g.rank();
  });
}

int mlxs_group_size(int* out, mlxs_group g) {
  return guard([&] {
    if (g == nullptr) throw std::invalid_argument("[mlxs] null group handle");
    *out = g->g.size();
  });
}

int mlxs_group_split(mlxs_group* out, mlxs_group g, int color, int key) {
  return guard([&] {
    if (g == nullptr) throw std::invalid_argument("[mlxs] null group handle");
    *out = new mlxs_group_{g->g.split(color, key)};
  });
}

int mlxs_distributed_all_sum(mlxs_array* out, mlxs_array x, mlxs_group g, mlxs_stream s) {
  return guard([&] { put(out, md::all_sum(A(x), G(g), S(s))); });
}

int mlxs_distributed_all_max(mlxs_array* out, mlxs_array x, mlxs_group g, mlxs_stream s) {
  return guard([&] { put(out, md::all_max(A(x), G(g), S(s))); });
}

int mlxs_distributed_all_min(mlxs_array* out, mlxs_array x, mlxs_group g, mlxs_stream s) {
  return guard([&] { put(out, md::all_min(A(x), G(g), S(s))); });
}

int mlxs_distributed_all_gather(mlxs_array* out, mlxs_array x, mlxs_group g, mlxs_stream s) {
  return guard([&] { put(out, md::all_gather(A(x), G(g), S(s))); });
}

int mlxs_distributed_sum_scatter(mlxs_array* out, mlxs_array x, mlxs_group g, mlxs_stream s) {
  return guard([&] { put(out, md::sum_scatter(A(x), G(g), S(s))); });
}

int mlxs_distributed_send(mlxs_array* out, mlxs_array x, int dst, mlxs_group g, mlxs_stream s) {
  return guard([&] { put(out, md::send(A(x), dst, G(g), S(s))); });
}

int mlxs_distributed_recv(mlxs_array* out, const int32_t* shape, size_t ndim, mlxs_dtype dtype,
                          int src, mlxs_group g, mlxs_stream s) {
  return guard([&] {
    put(out, md::recv(shape_of(shape, ndim), dtype_of(dtype), src, G(g), S(s)));
  });
}

int mlxs_distributed_recv_like(mlxs_array* out, mlxs_array x, int src, mlxs_group g,
                               mlxs_stream s) {
  return guard([&] { put(out, md::recv_like(A(x), src, G(g), S(s))); });
}

}  // extern "C"

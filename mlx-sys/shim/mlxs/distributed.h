/* MLX's distributed layer (mlx/distributed/distributed.h and ops.h): groups and collectives.
 *
 * A group handle owns one mx::distributed::Group. Backends are MLX's own ("ring" over TCP,
 * "mpi", "nccl" in CUDA builds, "any" = the first available); the shim adds no transport.
 * A NULL group argument means MLX's global group (the one the last init made). */
#ifndef MLXS_DISTRIBUTED_H
#define MLXS_DISTRIBUTED_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mlxs_group_* mlxs_group;

/* Whether the backend (NULL = any) can be used in this build. */
int mlxs_distributed_is_available(bool* out, const char* backend);
/* init(strict, backend): with strict false a failed init gives the singleton group. */
int mlxs_distributed_init(mlxs_group* out, bool strict, const char* backend);
void mlxs_group_free(mlxs_group g);
int mlxs_group_rank(int* out, mlxs_group g);
int mlxs_group_size(int* out, mlxs_group g);
/* Processes with the same color form a new group, ranked by key (negative: current rank). */
int mlxs_group_split(mlxs_group* out, mlxs_group g, int color, int key);

int mlxs_distributed_all_sum(mlxs_array* out, mlxs_array x, mlxs_group g, mlxs_stream s);
int mlxs_distributed_all_max(mlxs_array* out, mlxs_array x, mlxs_group g, mlxs_stream s);
int mlxs_distributed_all_min(mlxs_array* out, mlxs_array x, mlxs_group g, mlxs_stream s);
int mlxs_distributed_all_gather(mlxs_array* out, mlxs_array x, mlxs_group g, mlxs_stream s);
int mlxs_distributed_sum_scatter(mlxs_array* out, mlxs_array x, mlxs_group g, mlxs_stream s);
int mlxs_distributed_send(mlxs_array* out, mlxs_array x, int dst, mlxs_group g, mlxs_stream s);
int mlxs_distributed_recv(mlxs_array* out, const int32_t* shape, size_t ndim, mlxs_dtype dtype,
                          int src, mlxs_group g, mlxs_stream s);
int mlxs_distributed_recv_like(mlxs_array* out, mlxs_array x, int src, mlxs_group g,
                               mlxs_stream s);

#ifdef __cplusplus
}
#endif

#endif

/* Maps and file I/O (mlx/io.h). */
#ifndef MLXS_IO_H
#define MLXS_IO_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A map from names to arrays, iterated in sorted key order. */
typedef struct mlxs_map_* mlxs_map;
/* A map from names to strings, iterated in sorted key order. */
typedef struct mlxs_strmap_* mlxs_strmap;

mlxs_map mlxs_map_new(void);
void mlxs_map_free(mlxs_map m);
/* Inserts or replaces. */
int mlxs_map_insert(mlxs_map m, const char* key, mlxs_array a);
size_t mlxs_map_size(mlxs_map m);
/* Key i (sorted order); NULL when out of range. Valid until the map changes. */
const char* mlxs_map_key(mlxs_map m, size_t i);
int mlxs_map_value(mlxs_array* out, mlxs_map m, size_t i);

mlxs_strmap mlxs_strmap_new(void);
void mlxs_strmap_free(mlxs_strmap m);
int mlxs_strmap_insert(mlxs_strmap m, const char* key, const char* value);
size_t mlxs_strmap_size(mlxs_strmap m);
const char* mlxs_strmap_key(mlxs_strmap m, size_t i);
const char* mlxs_strmap_value(mlxs_strmap m, size_t i);

/* Lazily loads every tensor of a .safetensors file and its metadata. */
int mlxs_load_safetensors(mlxs_map* arrays, mlxs_strmap* metadata, const char* path,
                          mlxs_stream s);
int mlxs_save_safetensors(const char* path, mlxs_map arrays, mlxs_strmap metadata);
/* .npy files. */
int mlxs_load_npy(mlxs_array* out, const char* path, mlxs_stream s);
int mlxs_save_npy(const char* path, mlxs_array a);

#ifdef __cplusplus
}
#endif

#endif

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

/* ---- GGUF ---- */

/* GGUF metadata: a map from keys to values, iterated in sorted key order. A value is
 * nothing, an array (numbers; a scalar number is a 0-d array), a string, or a list of
 * strings. Strings are bytes with a length (not NUL-terminated). */
typedef struct mlxs_gguf_meta_* mlxs_gguf_meta;
typedef enum mlxs_gguf_kind {
  MLXS_GGUF_NONE = 0,
  MLXS_GGUF_ARRAY = 1,
  MLXS_GGUF_STRING = 2,
  MLXS_GGUF_STRINGS = 3,
} mlxs_gguf_kind;

mlxs_gguf_meta mlxs_gguf_meta_new(void);
void mlxs_gguf_meta_free(mlxs_gguf_meta m);
size_t mlxs_gguf_meta_size(mlxs_gguf_meta m);
/* Key i (sorted order); NULL when out of range. Valid until the map changes. */
const char* mlxs_gguf_meta_key(mlxs_gguf_meta m, size_t i);
/* Kind of value i (MLXS_GGUF_NONE when out of range). */
mlxs_gguf_kind mlxs_gguf_meta_kind(mlxs_gguf_meta m, size_t i);
int mlxs_gguf_meta_array(mlxs_array* out, mlxs_gguf_meta m, size_t i);
/* Value i of kind STRING: its bytes, valid until the map changes. */
int mlxs_gguf_meta_string(const char** data, size_t* len, mlxs_gguf_meta m, size_t i);
/* Value i of kind STRINGS: its length, and string j. */
int mlxs_gguf_meta_strings_len(size_t* out, mlxs_gguf_meta m, size_t i);
int mlxs_gguf_meta_strings_get(const char** data, size_t* len, mlxs_gguf_meta m, size_t i,
                               size_t j);
/* Inserting (or replacing) values. */
int mlxs_gguf_meta_insert_none(mlxs_gguf_meta m, const char* key);
int mlxs_gguf_meta_insert_array(mlxs_gguf_meta m, const char* key, mlxs_array a);
int mlxs_gguf_meta_insert_string(mlxs_gguf_meta m, const char* key, const char* data,
                                 size_t len);
/* n strings given as data pointers and lengths. */
int mlxs_gguf_meta_insert_strings(mlxs_gguf_meta m, const char* key, const char* const* data,
                                  const size_t* lens, size_t n);

/* Loads every tensor of a .gguf file and its metadata. Q4_0, Q4_1 and Q8_0 tensors come
 * back as MLX affine-quantized triples (<name>.weight, <prefix>.scales, <prefix>.biases);
 * other quantized types are dequantized to float16. */
int mlxs_load_gguf(mlxs_map* arrays, mlxs_gguf_meta* metadata, const char* path,
                   mlxs_stream s);
/* metadata may be NULL. */
int mlxs_save_gguf(const char* path, mlxs_map arrays, mlxs_gguf_meta metadata);

#ifdef __cplusplus
}
#endif

#endif

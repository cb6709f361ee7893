/* Handles, errors, dtypes, arrays, vectors, devices, streams, memory. */
#ifndef MLXS_CORE_H
#define MLXS_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mlxs_array_* mlxs_array;
typedef struct mlxs_vec_* mlxs_vec;
typedef struct mlxs_stream_* mlxs_stream;
typedef struct mlxs_device_* mlxs_device;
typedef struct mlxs_string_* mlxs_string;

/* The dtypes, in MLX's Dtype::Val order. */
typedef enum mlxs_dtype {
  MLXS_BOOL = 0,
  MLXS_UINT8 = 1,
  MLXS_UINT16 = 2,
  MLXS_UINT32 = 3,
  MLXS_UINT64 = 4,
  MLXS_INT8 = 5,
  MLXS_INT16 = 6,
  MLXS_INT32 = 7,
  MLXS_INT64 = 8,
  MLXS_FLOAT16 = 9,
  MLXS_FLOAT32 = 10,
  MLXS_FLOAT64 = 11,
  MLXS_BFLOAT16 = 12,
  MLXS_COMPLEX64 = 13,
} mlxs_dtype;

typedef enum mlxs_device_type {
  MLXS_CPU = 0,
  MLXS_GPU = 1,
} mlxs_device_type;

/* The message of the last failure on this thread ("" if none). Valid until the
 * next failing call on this thread. */
const char* mlxs_last_error(void);
/* MLX's version string, e.g. "0.32.4". */
const char* mlxs_version(void);

/* Owned strings returned by the shim. */
const char* mlxs_string_data(mlxs_string s);
void mlxs_string_free(mlxs_string s);

/* ---- arrays ---- */
void mlxs_array_free(mlxs_array a);
/* A second handle to the same array (shares data and graph node). */
int mlxs_array_clone(mlxs_array* out, mlxs_array a);
/* Copies nbytes from data; nbytes must equal prod(shape) * itemsize(dtype). */
int mlxs_array_from_data(mlxs_array* out, const void* data, size_t nbytes, const int32_t* shape,
                         size_t ndim, mlxs_dtype dtype);
/* Scalars built the way MLX's Python binding builds them: the value converted
 * from float / int / bool to the given dtype. */
int mlxs_array_from_float(mlxs_array* out, float value, mlxs_dtype dtype);
int mlxs_array_from_double(mlxs_array* out, double value, mlxs_dtype dtype);
int mlxs_array_from_int(mlxs_array* out, int64_t value, mlxs_dtype dtype);
int mlxs_array_from_bool(mlxs_array* out, bool value);

size_t mlxs_array_ndim(mlxs_array a);
/* Pointer to ndim dimensions, valid while the array lives. */
const int32_t* mlxs_array_shape(mlxs_array a);
size_t mlxs_array_size(mlxs_array a);
size_t mlxs_array_nbytes(mlxs_array a);
size_t mlxs_array_itemsize(mlxs_array a);
mlxs_dtype mlxs_array_dtype(mlxs_array a);
/* Whether the array has been evaluated (holds data). */
bool mlxs_array_is_available(mlxs_array a);
/* The identity of the underlying graph node (two handles to one array agree). */
uintptr_t mlxs_array_id(mlxs_array a);

int mlxs_array_eval(mlxs_array a);
/* Evaluates the array and copies its elements, row-major, into dst (nbytes must
 * equal the array's nbytes). */
int mlxs_array_to_data(mlxs_array a, void* dst, size_t nbytes);
/* Evaluates the array and, when it is row-contiguous, sets *data to its first element in host
 * memory and *nbytes to its size in bytes (no copy); fails on a strided or broadcast view. The
 * pointer stays valid while a handle to the array lives (MLX never writes an array's buffer
 * in place while another handle holds it). */
int mlxs_array_data_view(mlxs_array a, const void** data, size_t* nbytes);
/* The array printed as MLX prints it. */
int mlxs_array_tostring(mlxs_string* out, mlxs_array a);

/* ---- vectors of arrays ---- */
mlxs_vec mlxs_vec_new(void);
void mlxs_vec_free(mlxs_vec v);
int mlxs_vec_push(mlxs_vec v, mlxs_array a);
size_t mlxs_vec_size(mlxs_vec v);
int mlxs_vec_get(mlxs_array* out, mlxs_vec v, size_t i);

int mlxs_eval(mlxs_vec v);
int mlxs_async_eval(mlxs_vec v);
/* The unevaluated graph that computes the arrays of v, as text: MLX's print_graph (dot false:
 * one line per primitive, its inputs and outputs with shapes and dtypes) or export_to_dot
 * (dot true: the format Python's mx.export_to_dot writes). */
int mlxs_graph_text(mlxs_string* out, mlxs_vec v, bool dot);

/* ---- devices and streams ---- */
int mlxs_device_new(mlxs_device* out, mlxs_device_type type, int index);
void mlxs_device_free(mlxs_device d);
mlxs_device_type mlxs_device_get_type(mlxs_device d);
int mlxs_device_get_index(mlxs_device d);
int mlxs_default_device(mlxs_device* out);
int mlxs_set_default_device(mlxs_device d);
int mlxs_device_is_available(bool* out, mlxs_device d);
int mlxs_device_count(int* out, mlxs_device_type type);

void mlxs_stream_free(mlxs_stream s);
int mlxs_default_stream(mlxs_stream* out, mlxs_device d);
int mlxs_set_default_stream(mlxs_stream s);
int mlxs_new_stream(mlxs_stream* out, mlxs_device d);
int mlxs_stream_device(mlxs_device* out, mlxs_stream s);
int mlxs_stream_index(mlxs_stream s);
/* Waits for the stream (NULL: the default stream) to finish its work. */
int mlxs_synchronize(mlxs_stream s);

/* ---- memory ---- */
int mlxs_get_active_memory(size_t* out);
int mlxs_get_peak_memory(size_t* out);
int mlxs_reset_peak_memory(void);
int mlxs_get_cache_memory(size_t* out);
int mlxs_get_memory_limit(size_t* out);
/* Each setter returns the previous limit through out. */
int mlxs_set_memory_limit(size_t* out, size_t limit);
int mlxs_set_cache_limit(size_t* out, size_t limit);
int mlxs_set_wired_limit(size_t* out, size_t limit);
int mlxs_clear_cache(void);

#ifdef __cplusplus
}
#endif

#endif

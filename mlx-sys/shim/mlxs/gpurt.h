/* A small CUDA runtime of our own beside MLX: kernels compiled from source with NVRTC, device
 * buffers, launches, and CUDA graphs captured once and replayed. It reaches the CUDA driver
 * (libcuda) and NVRTC through dlopen at run time, so it builds everywhere and fails cleanly
 * (an error, never a crash) where there is no driver or no GPU. It shares the device's primary
 * context with MLX's CUDA back-end.
 *
 * Safety rules the shim enforces:
 * - buffers are named by index; every copy and every buffer argument is checked against the
 *   buffer's size (offset + length);
 * - a launch must pass exactly as many arguments as the kernel declares, each 8 bytes wide
 *   (kernels take pointers, long long and double only);
 * - nothing but launches may happen while a graph is being captured. */
#ifndef MLXS_GPURT_H
#define MLXS_GPURT_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mlxs_gpurt_* mlxs_gpurt;

/* A kernel argument: a buffer (buffer index, byte offset in value) or 8 raw bytes. */
typedef enum mlxs_gpurt_arg_kind {
  MLXS_GPURT_ARG_BUFFER = 0,
  MLXS_GPURT_ARG_BITS = 1,
} mlxs_gpurt_arg_kind;

typedef struct mlxs_gpurt_arg {
  mlxs_gpurt_arg_kind kind;
  uint32_t buffer;
  uint64_t value;
} mlxs_gpurt_arg;

/* Whether the CUDA driver can be loaded and sees a device (never fails). */
bool mlxs_gpurt_available(void);

/* Compiles `source` with NVRTC for device 0's architecture and loads the kernels named in
 * `kernel_names` (extern "C" functions) with their declared argument counts. */
int mlxs_gpurt_new(mlxs_gpurt* out, const char* source, const char* const* kernel_names,
                   const uint32_t* arities, size_t n_kernels);
/* Compiles another source as one more module of the same runtime (its buffers and stream
 * shared) and loads its kernels after those already loaded: `out_first` receives the index
 * of the first (kernel indices count across modules; names may repeat between modules). */
int mlxs_gpurt_add_module(mlxs_gpurt rt, const char* source, const char* const* kernel_names,
                          const uint32_t* arities, size_t n_kernels, uint32_t* out_first);
void mlxs_gpurt_free(mlxs_gpurt rt);

/* "NVIDIA H200 (sm_90)". */
int mlxs_gpurt_device_name(mlxs_gpurt rt, mlxs_string* out);

/* A zeroed device buffer of `bytes` bytes (> 0). */
int mlxs_gpurt_alloc(mlxs_gpurt rt, size_t bytes, uint32_t* out_buffer);
/* Total bytes allocated by this runtime (a parked region's not counted while parked). */
size_t mlxs_gpurt_allocated(mlxs_gpurt rt);

/* The runtime's one parkable region: `n` zeroed buffers of `sizes[i]` bytes (each > 0, each
 * starting 256-byte aligned), numbered from `*out_first`, in one range of device addresses
 * whose memory mlxs_gpurt_park gives back to the device and mlxs_gpurt_unpark takes again at
 * the same addresses (CUDA's virtual memory management), so graphs captured over them stay
 * valid. Where the driver has no virtual memory management, the buffers are plain ones and
 * parking is refused. At most one region a runtime. */
int mlxs_gpurt_alloc_parkable(mlxs_gpurt rt, const size_t* sizes, size_t n, uint32_t* out_first);
/* Waits for the stream, then unmaps the region and gives its memory back to the device; until
 * mlxs_gpurt_unpark, a launch, a graph replay or a copy touching the region is refused (graph
 * replays: all). Parking a parked runtime only waits for the stream. */
int mlxs_gpurt_park(mlxs_gpurt rt);
/* Takes device memory for the region again, maps it at the same addresses and zeroes it.
 * Unparking a runtime that is not parked does nothing. */
int mlxs_gpurt_unpark(mlxs_gpurt rt);
/* The region's device bytes (its mapped size, whether parked or not; 0: none). */
size_t mlxs_gpurt_parkable_bytes(mlxs_gpurt rt);
/* Whether the region is parked. */
bool mlxs_gpurt_parked(mlxs_gpurt rt);

int mlxs_gpurt_upload(mlxs_gpurt rt, uint32_t buffer, size_t offset, const void* src,
                      size_t bytes);
int mlxs_gpurt_download(mlxs_gpurt rt, uint32_t buffer, size_t offset, void* dst, size_t bytes);

/* Copies a row-contiguous MLX array (evaluated first), where MLX's CUDA back-end holds it on
 * the device, into a buffer: `height` rows of `width` bytes (the array's bytes, which must
 * number width x height), row r to offset + r x dst_pitch. Fails where MLX has no GPU. */
int mlxs_gpurt_copy_from_array(mlxs_gpurt rt, uint32_t buffer, size_t offset, size_t dst_pitch,
                               mlxs_array src, size_t width, size_t height);

/* mlxs_gpurt_copy_from_array, queued on the runtime's stream and not waited for: the caller
 * keeps `src` alive (and unwritten) until a later wait on the stream covers the copy. */
int mlxs_gpurt_copy_from_array_queued(mlxs_gpurt rt, uint32_t buffer, size_t offset,
                                      size_t dst_pitch, mlxs_array src, size_t width,
                                      size_t height);

/* A buffer that is a row-contiguous MLX array's own device memory (evaluated first; 256-byte
 * aligned), no copy: the runtime keeps the array alive, never writes or frees that memory,
 * and does not count it in mlxs_gpurt_allocated. Fails where MLX has no GPU. */
int mlxs_gpurt_borrow_array(mlxs_gpurt rt, mlxs_array src, uint32_t* out_buffer);

/* Bytes of MLX arrays' memory the runtime's buffers borrow. */
size_t mlxs_gpurt_borrowed(mlxs_gpurt rt);

/* Raises a kernel's dynamic shared memory limit. */
int mlxs_gpurt_set_shared_limit(mlxs_gpurt rt, uint32_t kernel, uint32_t bytes);

int mlxs_gpurt_launch(mlxs_gpurt rt, uint32_t kernel, const uint32_t* grid3,
                      const uint32_t* block3, uint32_t shared_bytes, const mlxs_gpurt_arg* args,
                      size_t n_args);

/* How many blocks of `kernel` (block_threads threads, shared_bytes of dynamic shared memory)
 * the whole device holds at once: a larger grid runs in more than one wave. */
int mlxs_gpurt_resident_blocks(mlxs_gpurt rt, uint32_t kernel, uint32_t block_threads,
                               uint32_t shared_bytes, uint32_t* out);

/* The device's streaming multiprocessors. */
int mlxs_gpurt_sm_count(mlxs_gpurt rt, uint32_t* out);

/* Launches from now on allow programmatic dependent launch (the next kernel's blocks may start
 * once the current kernel's blocks execute griddepcontrol.launch_dependents; each kernel must
 * execute griddepcontrol.wait before it reads what the kernel before it wrote). Needs
 * cuLaunchKernelEx (CUDA >= 12); kernels of compute capability < 9.0 treat it as a no-op. */
int mlxs_gpurt_set_programmatic_launch(mlxs_gpurt rt, bool on);

/* Captures the launches between begin and end into a graph, instantiated for replay. */
int mlxs_gpurt_capture_begin(mlxs_gpurt rt);
int mlxs_gpurt_capture_end(mlxs_gpurt rt, uint32_t* out_graph);
/* Queues `times` replays of a graph on the runtime's stream (asynchronous). */
int mlxs_gpurt_graph_launch(mlxs_gpurt rt, uint32_t graph, uint32_t times);

/* Queues a copy of `bytes` (at most 1 MiB) from a buffer into one of 16 pinned host slots,
 * after everything queued so far; read_end waits for it and copies it out. */
int mlxs_gpurt_read_begin(mlxs_gpurt rt, uint32_t buffer, size_t offset, size_t bytes,
                          uint64_t* out_ticket);
int mlxs_gpurt_read_end(mlxs_gpurt rt, uint64_t ticket, void* dst, size_t bytes);

/* Waits for everything queued. */
int mlxs_gpurt_synchronize(mlxs_gpurt rt);

#ifdef __cplusplus
}
#endif

#endif

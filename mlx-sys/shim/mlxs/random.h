/* Random numbers (mlx/random.h).
 *
 * Every sampler takes a nullable key. NULL draws the next key from the shim's process-wide
 * key sequence, exactly as MLX's Python binding does with its global state: one split per
 * call (state, key = split(state)). The sequence starts from a time-based seed, like
 * Python's; mlxs_random_seed resets it (and MLX's own per-thread C++ sequence). */
#ifndef MLXS_RANDOM_H
#define MLXS_RANDOM_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

int mlxs_random_key(mlxs_array* out, uint64_t seed);
int mlxs_random_seed(uint64_t seed);
/* The global state (Python's mx.random.state[0]); replacing it. */
int mlxs_random_state(mlxs_array* out);
int mlxs_random_set_state(mlxs_array key);
/* Advances the global state and returns the key a keyless sampler would use. */
int mlxs_random_next_key(mlxs_array* out);

/* num keys, shape (num, 2). */
int mlxs_random_split(mlxs_array* out, mlxs_array key, int num, mlxs_stream s);
int mlxs_random_bits(mlxs_array* out, const int32_t* shape, size_t ndim, int width,
                     mlxs_array key, mlxs_stream s);
int mlxs_random_uniform(mlxs_array* out, mlxs_array low, mlxs_array high, const int32_t* shape,
                        size_t ndim, mlxs_dtype dtype, mlxs_array key, mlxs_stream s);
/* loc and scale may be NULL (0 and 1). */
int mlxs_random_normal(mlxs_array* out, const int32_t* shape, size_t ndim, mlxs_dtype dtype,
                       mlxs_array loc, mlxs_array scale, mlxs_array key, mlxs_stream s);
int mlxs_random_randint(mlxs_array* out, mlxs_array low, mlxs_array high, const int32_t* shape,
                        size_t ndim, mlxs_dtype dtype, mlxs_array key, mlxs_stream s);
/* Without has_shape the output has p's shape. */
int mlxs_random_bernoulli(mlxs_array* out, mlxs_array p, bool has_shape, const int32_t* shape,
                          size_t ndim, mlxs_array key, mlxs_stream s);
/* Without has_shape the output has the broadcast shape of lower and upper. */
int mlxs_random_truncated_normal(mlxs_array* out, mlxs_array lower, mlxs_array upper,
                                 bool has_shape, const int32_t* shape, size_t ndim,
                                 mlxs_dtype dtype, mlxs_array key, mlxs_stream s);
int mlxs_random_gumbel(mlxs_array* out, const int32_t* shape, size_t ndim, mlxs_dtype dtype,
                       mlxs_array key, mlxs_stream s);
/* One sample per distribution (the axis removed). */
int mlxs_random_categorical(mlxs_array* out, mlxs_array logits, int axis, mlxs_array key,
                            mlxs_stream s);
/* num_samples per distribution, in a new last axis. */
int mlxs_random_categorical_n(mlxs_array* out, mlxs_array logits, int axis, int num_samples,
                              mlxs_array key, mlxs_stream s);
/* Samples of the given shape (broadcast-compatible with logits without the axis). */
int mlxs_random_categorical_shape(mlxs_array* out, mlxs_array logits, int axis,
                                  const int32_t* shape, size_t ndim, mlxs_array key,
                                  mlxs_stream s);
int mlxs_random_laplace(mlxs_array* out, const int32_t* shape, size_t ndim, mlxs_dtype dtype,
                        float loc, float scale, mlxs_array key, mlxs_stream s);
/* A random permutation of x along axis. */
int mlxs_random_permutation(mlxs_array* out, mlxs_array x, int axis, mlxs_array key,
                            mlxs_stream s);

#ifdef __cplusplus
}
#endif

#endif

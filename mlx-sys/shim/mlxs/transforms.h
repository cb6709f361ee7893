/* Function transforms (mlx/transforms.h, mlx/compile.h): closures, vjp, jvp,
 * value_and_grad, custom_vjp, checkpoint, compile (stop_gradient is in ops.h). */
#ifndef MLXS_TRANSFORMS_H
#define MLXS_TRANSFORMS_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A function from arrays to arrays that MLX can call (and transform). It owns a
 * payload; the payload's destructor runs when the last copy inside MLX is gone, which
 * may be later than mlxs_closure_free (a custom_vjp or checkpoint node of a graph keeps
 * one) and on another thread. */
typedef struct mlxs_closure_* mlxs_closure;

/* The callback behind a closure. `inputs` is borrowed (read it, do not free it);
 * `outputs` is borrowed and empty on entry: push the results onto it. Return 0 on
 * success. Any other value reports a failure that the caller's language keeps for
 * itself: the shim throws a C++ exception so that MLX unwinds its own state, and the
 * entry point that started it (mlxs_closure_apply, mlxs_vjp, ...) returns non-zero with
 * mlxs_last_error_is_callback() true. The callback must not let an exception or a
 * foreign unwind escape. */
typedef int (*mlxs_closure_fn)(void* payload, mlxs_vec inputs, mlxs_vec outputs);
/* The callback of a custom VJP: primals, cotangents and the forward outputs in,
 * one VJP per primal pushed onto `vjps`. Same contract as mlxs_closure_fn. */
typedef int (*mlxs_vjp_fn)(void* payload, mlxs_vec primals, mlxs_vec cotangents,
                           mlxs_vec outputs, mlxs_vec vjps);
/* Frees a payload. May be NULL (nothing to free). Must not fail or unwind. */
typedef void (*mlxs_payload_free)(void* payload);

/* A closure calling fn(payload, ...). On failure free_payload(payload) has already run. */
int mlxs_closure_new(mlxs_closure* out, mlxs_closure_fn fn, void* payload,
                     mlxs_payload_free free_payload);
void mlxs_closure_free(mlxs_closure c);
/* Calls the closure on inputs. Writes a new vector of outputs. */
int mlxs_closure_apply(mlxs_vec* out, mlxs_closure c, mlxs_vec inputs);

/* Whether the last failure on this thread was a callback reporting failure (as opposed
 * to MLX raising an error of its own). Only meaningful right after a non-zero status
 * from one of the functions of this header. */
bool mlxs_last_error_is_callback(void);

/* ---- autodiff ---- */
/* outputs = fun(primals); vjps = one per primal. */
int mlxs_vjp(mlxs_vec* outputs, mlxs_vec* vjps, mlxs_closure fun, mlxs_vec primals,
             mlxs_vec cotangents);
/* outputs = fun(primals); jvps = one per output. */
int mlxs_jvp(mlxs_vec* outputs, mlxs_vec* jvps, mlxs_closure fun, mlxs_vec primals,
             mlxs_vec tangents);
/* mx::value_and_grad(fun, argnums)(inputs): values = fun(inputs) (outputs after the
 * first pass through stop_gradient), grads = d values[0] / d inputs[argnums[i]]. */
int mlxs_value_and_grad(mlxs_vec* values, mlxs_vec* grads, mlxs_closure fun,
                        const int32_t* argnums, size_t nargnums, mlxs_vec inputs);
/* A closure that computes fun but whose VJP is bwd (mx::custom_vjp). bwd's payload is
 * owned by the result (freed with free_payload, also on failure). */
int mlxs_custom_vjp(mlxs_closure* out, mlxs_closure fun, mlxs_vjp_fn bwd, void* payload,
                    mlxs_payload_free free_payload);
/* A closure that computes fun and recomputes it in the backward pass (mx::checkpoint). */
int mlxs_checkpoint(mlxs_closure* out, mlxs_closure fun);

/* ---- compile ---- */
/* A compiled version of fun, as mx.compile makes it in Python: every call runs
 * mx::detail::compile(fun, id, shapeless) with an id unique to the result, so the compile
 * mode is checked at each call (disable_compile applies to functions compiled before).
 * The compile cache of the calling thread keeps one trace per input signature (shapes
 * and dtypes; with shapeless, ranks and dtypes); fun runs only while tracing (or on
 * every call when compilation is disabled or the inputs are tracers of an enclosing
 * transform). Freeing the closure erases its cache entries; so does a failing call, so
 * that a half-made trace is never reused. */
int mlxs_compile(mlxs_closure* out, mlxs_closure fun, bool shapeless);
int mlxs_disable_compile(void);
int mlxs_enable_compile(void);
/* 0 disabled, 1 no_simplify, 2 no_fuse, 3 enabled (mx::CompileMode order). */
int mlxs_set_compile_mode(int mode);

#ifdef __cplusplus
}
#endif

#endif

/* mlxs: the C ABI over MLX 0.32.4 written for this project.
 *
 * Conventions (every header under mlxs/ follows them):
 * - Handles are opaque pointers owning one C++ object; each has a *_free.
 * - A function that can fail returns int: 0 on success, non-zero on failure,
 *   with the message (MLX's own, e.g. "[matmul] ...") readable through
 *   mlxs_last_error() on the same thread until the next failing call.
 *   Results come back through out-parameters, which are written only on success.
 * - No C++ exception ever leaves the shim.
 * - A stream argument may be NULL: the default stream of the default device.
 */
#ifndef MLXS_H
#define MLXS_H

#include "mlxs/core.h"
#include "mlxs/ops.h"
#include "mlxs/io.h"
#include "mlxs/fast.h"
#include "mlxs/quant.h"
#include "mlxs/random.h"
#include "mlxs/transforms.h"
#include "mlxs/kernels.h"
#include "mlxs/gpurt.h"
#include "mlxs/distributed.h"

#endif

"""Host cost per graph node on MLX's CUDA back-end: native ops vs `mx.fast.cuda_kernel` nodes.

    python node_costs.py OUT.md

A chain of 64 dependent calls on a bf16 [1, 1, 576] array is built and evaluated once; the
median over 60 repetitions (after 10 warm-ups), divided by 64, is the cost per node. Rows:
- native `mx.add`;
- a `cuda_kernel` doing the same add (short source);
- the same kernel with ~8 KB of comment in its header (does source size matter? MLX builds
  the source string per call and hashes it per evaluation);
- the same kernel with 3 outputs (does output count matter?);
- native chain and kernel chain under `mx.compile`.
"""

import statistics
import sys
import time

import mlx.core as mx

N, REPS, WARM = 64, 60, 10

SRC = """
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { out[i] = a[i] + b[i]; }
"""


def kernel(name, header="", outputs=1):
    outs = ["out"] + [f"o{i}" for i in range(1, outputs)]
    src = SRC + "".join(f"  if (i < n) {{ o{i}[i] = a[i]; }}\n" for i in range(1, outputs))
    k = mx.fast.cuda_kernel(name=name, input_names=["a", "b"], output_names=outs, source=src,
                            header=header)

    def call(a, b):
        return k(inputs=[a, b], template=[("n", a.size)], grid=(a.size, 1, 1),
                 threadgroup=(256, 1, 1), output_shapes=[a.shape] * outputs,
                 output_dtypes=[a.dtype] * outputs)[0]

    return call


def per_node(step):
    a = mx.random.normal((1, 1, 576)).astype(mx.bfloat16)
    b = mx.random.normal((1, 1, 576)).astype(mx.bfloat16)
    mx.eval(a, b)

    def once():
        x = a
        for _ in range(N):
            x = step(x, b)
        mx.eval(x)

    for _ in range(WARM):
        once()
    ts = []
    for _ in range(REPS):
        t = time.perf_counter()
        once()
        ts.append(time.perf_counter() - t)
    return 1e6 * statistics.median(ts) / N, 1e6 * min(ts) / N


def main():
    rows = [("native add", lambda x, b: x + b)]
    try:
        rows += [
            ("cuda_kernel add", kernel("nc_add")),
            ("cuda_kernel add, 8 KB header", kernel("nc_add_big", header="// pad\n" * 1200)),
            ("cuda_kernel add, 3 outputs", kernel("nc_add3", outputs=3)),
        ]
    except Exception as e:  # noqa: BLE001  (the CPU build has no cuda_kernel)
        print(f"no cuda_kernel here: {e}", file=sys.stderr)
    results = []
    for name, f in list(rows):
        results.append((name, *per_node(f)))
    for name, f in list(rows):
        chain = mx.compile(lambda x, b, f=f: [f(x, b) for _ in range(1)][0])
        results.append((f"{name} under mx.compile (one call per node)", *per_node(chain)))
    for name, f in list(rows):
        def whole(x, b, f=f):
            for _ in range(N):
                x = f(x, b)
            return x
        cw = mx.compile(whole)
        r = per_node(lambda x, b, cw=cw: cw(x, b) if x is not None else x)
        results.append((f"{name}: all {N} in one mx.compile'd function", r[0] / N, r[1] / N))
    lines = ["| node | us per node (median) | us per node (best) |", "| --- | --- | --- |"]
    lines += [f"| {n} | {m:.2f} | {b:.2f} |" for n, m, b in results]
    text = "\n".join(lines) + f"\n\nmlx {mx.__version__}, {mx.default_device()}\n"
    print(text)
    with open(sys.argv[1], "w") as f:
        f.write(text)


main()

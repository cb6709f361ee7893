#!/bin/bash
# Is MLX's CUDA quantized matmul deterministic and finite on the llama3_q4 test row's shapes?
A=.gpu/a
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -m pip install -q --no-index --no-deps --no-compile $A/mlx-0.32.4-*.whl $A/mlx_lm-0.32.2-*.whl
tar xJf $A/support.tar.xz -C "$SITE"
mkdir -p "$SITE/mlx/lib" && xz -dc $A/libmlx-sm90.so.xz > "$SITE/mlx/lib/libmlx.so"
for w in $A/nvidia_cuda_crt-*.whl; do python3 -m pip install -q --no-index --no-deps --no-compile "$w"; done
python3 - <<'PY'
import mlx.core as mx
print(mx.default_device())
for (N, K, g, b) in [(160, 64, 64, 4), (128, 64, 64, 4), (64, 128, 64, 4), (160, 64, 32, 4), (64, 64, 32, 8), (160, 64, 64, 8), (4096, 4096, 64, 4), (160, 128, 64, 4), (160, 256, 64, 4), (160, 512, 64, 4)]:
    w = (mx.random.normal((N, K), key=mx.random.key(1)) * 0.1).astype(mx.bfloat16)
    q, s, bi = mx.quantize(w, group_size=g, bits=b)
    wd = mx.dequantize(q, s, bi, group_size=g, bits=b)
    for M in (1, 40):
        x = mx.random.normal((1, M, K), key=mx.random.key(2)).astype(mx.bfloat16)
        ref = (x.astype(mx.float32) @ wd.astype(mx.float32).T)
        outs = []
        for _ in range(4):
            y = mx.quantized_matmul(x, q, s, bi, transpose=True, group_size=g, bits=b).astype(mx.float32)
            mx.eval(y); outs.append(y)
        same = all(mx.array_equal(outs[0], o).item() for o in outs[1:])
        fin = all(mx.isfinite(o).all().item() for o in outs)
        err = mx.abs(outs[0] - ref).max().item()
        print(f"N={N} K={K} g={g} b={b} M={M}: repeat-equal={same} finite={fin} max|err|={err:.4g} (ref scale {mx.abs(ref).max().item():.3g})")
PY

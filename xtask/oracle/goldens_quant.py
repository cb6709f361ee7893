"""Goldens for quantization: quantize, dequantize, quantized_matmul, gather_qmm, gather_mm.

Writes mlx-core/tests/goldens/quant.safetensors. Run with `cargo xtask goldens quant`.

Case layouts (read by mlx-core/tests/goldens_quant.rs). A "bundle" case checks quantize and
everything downstream of the oracle's own quantized weights, so no array is stored twice:
- affine_bundle: inputs [w, x, wt, xt]; outputs
    [wq, scales, biases, dequantize(wq...), quantized_matmul(x, wq..., transpose=True),
     wtq, wt_scales, wt_biases, quantized_matmul(xt, wtq..., transpose=False)]
  w is (N, K) (quantized along K, multiplied transposed), wt is (K2, N2) (quantized along N2,
  multiplied untransposed).
- fp_bundle (mxfp4 / mxfp8 / nvfp4): inputs [w, x]; outputs
    [wq, scales, dequantize(default dtype), dequantize(dtype=ddtype), quantized_matmul(x, ...)]
- nvfp4_global: inputs [w, global_scale]; outputs [wq, scales, dequantize(global_scale)]
- dequantize: inputs [wq, scales, biases?]; params mode, group_size, bits, dtype (or none)
- gather_qmm: inputs [x, wq, scales, biases?, lhs?, rhs?]; params mode, group_size, bits,
  transpose, sorted
- gather_mm: inputs [a, b, lhs?, rhs?]; params sorted
Missing group_size / bits are "none" (the mode's default).
"""

import mlx.core as mx

from golden import Golden

g = Golden("mlx-core/tests/goldens/quant.safetensors", __file__)
mx.random.seed(3)

DT = {"f32": mx.float32, "bf16": mx.bfloat16, "f16": mx.float16}

# ---- affine: every bits x group size, f32 and bf16 ----
for bits in [1, 2, 3, 4, 5, 6, 8]:
    for gs in [32, 64, 128]:
        for tag in ["f32", "bf16"]:
            dt = DT[tag]
            w = mx.random.normal((3, 128)).astype(dt)
            x = mx.random.normal((2, 128)).astype(dt)
            wq, s, b = mx.quantize(w, group_size=gs, bits=bits)
            deq = mx.dequantize(wq, s, b, group_size=gs, bits=bits)
            y = mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=gs, bits=bits)
            wt = mx.random.normal((8, 128)).astype(dt)
            xt = mx.random.normal((1, 2, 8)).astype(dt)
            wtq, ts, tb = mx.quantize(wt, group_size=gs, bits=bits)
            yt = mx.quantized_matmul(xt, wtq, ts, tb, transpose=False, group_size=gs, bits=bits)
            g.case(f"affine_b{bits}_g{gs}_{tag}", "affine_bundle", [w, x, wt, xt],
                   [wq, s, b, deq, y, wtq, ts, tb, yt], group_size=gs, bits=bits)

# Defaults (group_size 64, bits 4 when unspecified), f16, a batched 3-D weight.
w = mx.random.normal((2, 4, 64)).astype(mx.float16)
x = mx.random.normal((2, 3, 64)).astype(mx.float16)
wq, s, b = mx.quantize(w)
wt = mx.random.normal((64, 64)).astype(mx.float16)
xt = mx.random.normal((3, 64)).astype(mx.float16)
wtq, ts, tb = mx.quantize(wt)
g.case("affine_defaults_f16", "affine_bundle", [w, x, wt, xt],
       [wq, s, b, mx.dequantize(wq, s, b), mx.quantized_matmul(x, wq, s, b),
        wtq, ts, tb, mx.quantized_matmul(xt, wtq, ts, tb, transpose=False)],
       group_size=None, bits=None)

# dequantize to an explicit dtype.
wq, s, b = mx.quantize(mx.random.normal((3, 64)).astype(mx.bfloat16), group_size=32, bits=4)
for tag in ["f32", "f16", "bf16"]:
    g.case(f"dequantize_affine_to_{tag}", "dequantize", [wq, s, b],
           mx.dequantize(wq, s, b, group_size=32, bits=4, dtype=DT[tag]),
           mode="affine", group_size=32, bits=4, dtype=tag)

# ---- floating-point modes ----
for mode in ["mxfp4", "mxfp8", "nvfp4"]:
    for tag in ["f32", "bf16", "f16"]:
        dt = DT[tag]
        w = (mx.random.normal((4, 64)) * 3).astype(dt)
        x = mx.random.normal((2, 64)).astype(dt)
        wq, s = mx.quantize(w, mode=mode)
        d0 = mx.dequantize(wq, s, mode=mode)
        d1 = mx.dequantize(wq, s, mode=mode, dtype=dt)
        y = mx.quantized_matmul(x, wq, s, mode=mode)
        g.case(f"{mode}_{tag}", "fp_bundle", [w, x], [wq, s, d0, d1, y],
               mode=mode, group_size=None, bits=None, ddtype=tag)

w = (mx.random.normal((2, 32)) * 5).astype(mx.float32)
gsc = mx.array(0.75, dtype=mx.float32)
wq, s = mx.quantize(w, mode="nvfp4", global_scale=gsc)
g.case("nvfp4_global", "nvfp4_global", [w, gsc],
       [wq, s, mx.dequantize(wq, s, mode="nvfp4", global_scale=gsc)])

# ---- gather_qmm ----
E, N, K = 3, 8, 64
for tag in ["f32", "bf16"]:
    dt = DT[tag]
    we = mx.random.normal((E, N, K)).astype(dt)
    wq, s, b = mx.quantize(we, group_size=32, bits=4)
    x = mx.random.normal((4, 1, K)).astype(dt)
    rhs = mx.array([2, 0, 1, 2], dtype=mx.uint32)
    lhs = mx.array([0, 1, 2, 3], dtype=mx.uint32)
    g.case(f"gather_qmm_rhs_{tag}", "gather_qmm", [x, wq, s, b, rhs],
           mx.gather_qmm(x, wq, s, b, rhs_indices=rhs, transpose=True, group_size=32, bits=4),
           mode="affine", group_size=32, bits=4, transpose=True, sorted=False, lhs=False, rhs=True)
    g.case(f"gather_qmm_both_{tag}", "gather_qmm", [x, wq, s, b, lhs, rhs],
           mx.gather_qmm(x, wq, s, b, lhs_indices=lhs, rhs_indices=rhs, transpose=True, group_size=32, bits=4),
           mode="affine", group_size=32, bits=4, transpose=True, sorted=False, lhs=True, rhs=True)
    srt = mx.array([0, 0, 1, 2], dtype=mx.uint32)
    g.case(f"gather_qmm_sorted_{tag}", "gather_qmm", [x, wq, s, b, srt],
           mx.gather_qmm(x, wq, s, b, rhs_indices=srt, transpose=True, group_size=32, bits=4, sorted_indices=True),
           mode="affine", group_size=32, bits=4, transpose=True, sorted=True, lhs=False, rhs=True)
    # Untransposed: w is (E, K, N) quantized along N.
    wu = mx.random.normal((E, 16, 64)).astype(dt)
    uq, us, ub = mx.quantize(wu, group_size=64, bits=8)
    xu = mx.random.normal((4, 2, 16)).astype(dt)
    g.case(f"gather_qmm_untransposed_{tag}", "gather_qmm", [xu, uq, us, ub, rhs],
           mx.gather_qmm(xu, uq, us, ub, rhs_indices=rhs, transpose=False, group_size=64, bits=8),
           mode="affine", group_size=64, bits=8, transpose=False, sorted=False, lhs=False, rhs=True)
    # No indices: a plain batched quantized matmul.
    xb = mx.random.normal((E, 2, K)).astype(dt)
    g.case(f"gather_qmm_noidx_{tag}", "gather_qmm", [xb, wq, s, b],
           mx.gather_qmm(xb, wq, s, b, transpose=True, group_size=32, bits=4),
           mode="affine", group_size=32, bits=4, transpose=True, sorted=False, lhs=False, rhs=False)
    # An fp mode.
    fq, fs = mx.quantize(we, mode="mxfp4")
    g.case(f"gather_qmm_mxfp4_{tag}", "gather_qmm", [x, fq, fs, rhs],
           mx.gather_qmm(x, fq, fs, rhs_indices=rhs, mode="mxfp4"),
           mode="mxfp4", group_size=None, bits=None, transpose=True, sorted=False, lhs=False, rhs=True)

# ---- gather_mm (the CPU backend only runs float32) ----
for tag in ["f32"]:
    dt = DT[tag]
    a = mx.random.normal((4, 2, 16)).astype(dt)
    bm = mx.random.normal((3, 16, 5)).astype(dt)
    rhs = mx.array([1, 2, 0, 1], dtype=mx.uint32)
    lhs = mx.array([3, 2, 1, 0], dtype=mx.uint32)
    g.case(f"gather_mm_rhs_{tag}", "gather_mm", [a, bm, rhs],
           mx.gather_mm(a, bm, rhs_indices=rhs), sorted=False, lhs=False, rhs=True)
    g.case(f"gather_mm_both_{tag}", "gather_mm", [a, bm, lhs, rhs],
           mx.gather_mm(a, bm, lhs_indices=lhs, rhs_indices=rhs), sorted=False, lhs=True, rhs=True)
    srt = mx.array([0, 1, 1, 2], dtype=mx.uint32)
    g.case(f"gather_mm_sorted_{tag}", "gather_mm", [a, bm, srt],
           mx.gather_mm(a, bm, rhs_indices=srt, sorted_indices=True), sorted=True, lhs=False, rhs=True)
    a1 = mx.random.normal((3, 2, 16)).astype(dt)
    g.case(f"gather_mm_noidx_{tag}", "gather_mm", [a1, bm], mx.gather_mm(a1, bm), sorted=False, lhs=False, rhs=False)

g.save()

"""Writes a trellis-coded bench model next to an MLX affine-quantized one, for the decode-speed
row of issue #34 (trellis at k bits against affine 4-bit on the same decoder):

    python3 trellis_bench_model.py SRC_DIR DST_DIR [--bits 3] [--trellis-l 8] [--block 32]
        [--code 1mad|1mad8|1mad8h|1mad8s|gauss8s|gauss7s] [--v-code CODE]

SRC_DIR is a model `bench_models.py` wrote (e.g. `llama-135m-q4`, `llama31-8b-q4`: every linear
MLX affine 4-bit). Every linear but the embedding and the LM head becomes a trellis-coded one
(`"mode": "trellis"`, as `mlx convert --q-mode trellis` writes it): random words (every bit
stream is a valid tail-biting code, so no Viterbi search is needed: the 8B shape is written
in seconds) and one scale a row, in the model's dtype. The embedding and the head stay affine,
as the converter leaves the embedding. A decode step reads and decodes every weight whatever
its bits, so the step costs what a converted model's does. The tokens are meaningless.
`DST_DIR/config.json` is written last, and a complete `DST_DIR` is left alone.
--v-code gives the attention value projections (`*.v_proj`) their own code, in a per-path
quantization entry as `mlx convert --q-trellis-v-code` writes it (no `trellis_code` key for
1mad; the same bits, L and blocks): `--code gauss7s --v-code 1mad` is the hybrid.
"""
import argparse
import glob
import json
import os
import shutil

import mlx.core as mx
import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--bits", type=int, default=3)
    ap.add_argument("--trellis-l", type=int, default=8)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--code", choices=("1mad", "1mad8", "1mad8h", "1mad8s", "gauss8s", "gauss7s"),
                    default="1mad",
                    help="trellis_code (1mad8: L <= 8, blocks of 32 or whole 64s of at most 16 words; "
                         "the hashed codes 1mad8h, 1mad8s, gauss8s, gauss7s: L 9..16)")
    ap.add_argument("--v-code", choices=("1mad", "1mad8", "1mad8h", "1mad8s", "gauss8s", "gauss7s"),
                    help="the value projections' trellis_code (default: --code)")
    a = ap.parse_args()
    if os.path.exists(os.path.join(a.dst, "config.json")):
        print(f"{a.dst}: already written")
        return
    config = json.load(open(os.path.join(a.src, "config.json")))
    q = config.get("quantization")
    if not q or q.get("mode", "affine") != "affine":
        raise SystemExit(f"{a.src}: not an MLX affine-quantized model")
    gs, bits = q["group_size"], q["bits"]
    if (a.block * a.bits) % 32 or not 2 <= a.bits <= 4 or not a.bits < a.trellis_l <= 16:
        raise SystemExit("bits 2-4, trellis-l in bits+1..16, block * bits a multiple of 32")
    for c in (a.code, a.v_code or a.code):
        if c not in ("1mad", "1mad8") and a.trellis_l < 9:
            raise SystemExit(f"{c}: trellis-l 9..16")
    weights = {}
    for f in sorted(glob.glob(os.path.join(a.src, "*.safetensors"))):
        weights.update(mx.load(f))
    rng = np.random.default_rng(a.seed)
    out, coded, values = {}, 0, []
    keep = ("model.embed_tokens.", "lm_head.")
    for name, w in weights.items():
        base = name.rsplit(".", 1)[0]
        if name.startswith(keep) or f"{base}.scales" not in weights:
            out[name] = w
            continue
        if name in (f"{base}.scales", f"{base}.biases"):
            continue  # the affine scales and biases: replaced
        if not name.endswith(".weight"):
            out[name] = w  # a layer bias stays
            continue
        rows, cols = w.shape[0], w.shape[1] * 32 // bits
        if cols % a.block:
            raise SystemExit(f"{base}: {cols} inputs are not whole blocks of {a.block}")
        words = rng.integers(0, 1 << 32, size=(rows, cols * a.bits // 32), dtype=np.uint64)
        out[name] = mx.array(words.astype(np.uint32))
        out[f"{base}.scales"] = mx.full((rows, 1), 0.02, dtype=weights[f"{base}.scales"].dtype)
        coded += 1
        if base.endswith(".v_proj"):
            values.append(base)
    os.makedirs(a.dst, exist_ok=True)
    mx.save_safetensors(os.path.join(a.dst, "model.safetensors"), out)
    for f in os.listdir(a.src):
        if f.startswith("tokenizer") or f.endswith(".jinja"):
            shutil.copy(os.path.join(a.src, f), a.dst)
    tq = {"group_size": a.block, "bits": a.bits, "mode": "trellis", "trellis_l": a.trellis_l,
          "seed": a.seed, "model.embed_tokens": {"group_size": gs, "bits": bits, "mode": "affine"}}
    if a.code != "1mad":
        tq["trellis_code"] = a.code  # as the converter writes it (1mad, the default, is not)
    if a.v_code and a.v_code != a.code:
        # mlx convert's per-path entry of a value projection: the linear's own trellis params.
        for base in values:
            e = {"group_size": a.block, "bits": a.bits, "mode": "trellis", "trellis_l": a.trellis_l,
                 "seed": a.seed}
            if a.v_code != "1mad":
                e["trellis_code"] = a.v_code
            tq[base] = e
    if any(n.startswith("lm_head.") for n in out):
        tq["lm_head"] = {"group_size": gs, "bits": bits, "mode": "affine"}
    config["quantization"] = tq
    config["quantization_config"] = tq
    json.dump(config, open(os.path.join(a.dst, "config.json"), "w"), indent=2)
    vdesc = f", {len(values)} v_proj {a.v_code}" if a.v_code and a.v_code != a.code else ""
    print(f"{a.dst}: written ({coded} coded tensors, trellis {a.bits} bits, L {a.trellis_l}, blocks of {a.block}, "
          f"{a.code}{vdesc})")


if __name__ == "__main__":
    main()

"""mlx-lm's gpt_oss against our Rust forward (mlx-models, the CUDA follow test's reference) on
the CPU, step by step through the sliding layers' RotatingKVCache wrap (the rows' window 48:
the prompt 40 positions, position 48 the first a sliding layer drops one).

    MLX_GRAPH_ROWS_OUT=DIR cargo test -p mlx-engine --test graph_spec dump_the_gpt_oss_steps \
        -- --ignored --nocapture
    $MLX_ORACLE_VENV/bin/python xtask/gpu/gptoss_rotating_check.py DIR

For each dump (`NAME-f32`: the model in float32; `NAME-stored`: in its stored dtypes), mlx-lm
0.32.2 loads DIR/NAME, runs the same prompt over its own make_cache, is teacher-forced on the
dump's tokens and each step's logits are compared bit for bit with the dump's. Also each step's
logits against a forward over plain caches (KVCache, the window kept by the masks mlx-lm makes
for them), which does not rotate.
"""
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, make_prompt_cache
from mlx_lm.utils import load_model


def main():
    root = Path(sys.argv[1])
    ok = True
    for tok_file in sorted(root.glob("*.tokens")):
        base = tok_file.with_suffix("")
        name, tag = base.name.rsplit("-", 1)
        tokens = np.fromfile(tok_file, np.int32)
        ours = np.fromfile(base.with_suffix(".logits"), np.float32).reshape(len(tokens), -1)
        model, config = load_model(root / name)
        if tag == "f32":
            model.set_dtype(mx.float32)
        V = config["vocab_size"]
        prompt = [(i * 7919 + 13) % V for i in range(40)]
        rot, plain = make_prompt_cache(model), [KVCache() for _ in model.layers]
        x = mx.array([prompt])
        equal, worst_plain = [], 0.0
        for j in range(len(tokens)):
            a = np.array(model(x, cache=rot)[0, -1].astype(mx.float32))
            b = np.array(model(x, cache=plain)[0, -1].astype(mx.float32))
            equal.append(bool(np.array_equal(a, ours[j])))
            rel = float(np.max(np.abs(a - b)) / np.max(np.abs(a)))
            worst_plain = max(worst_plain, rel)
            if not equal[-1] or rel > 0:
                pos = 40 + j - 1 if j else 39
                print(f"{base.name} step {j} (position {pos}): mlx-lm against ours "
                      f"{float(np.max(np.abs(a - ours[j])) / np.max(np.abs(a))):.6f}, "
                      f"rotating against plain caches {rel:.6f}")
            x = mx.array([[int(tokens[j])]])
        print(f"{base.name}: {sum(equal)} of {len(equal)} steps bit-equal to mlx-lm "
              f"(the prompt's last logits, then the 24 steps); rotating against plain caches at "
              f"most {worst_plain:.6f} relative")
        ok &= all(equal)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

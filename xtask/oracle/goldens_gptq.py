"""What mlx-lm 0.32.2's own GPTQ (`python -m mlx_lm.quant.gptq`) writes, for `mlx quant gptq`
(issue #34's learned quantizers).

mlx-lm reads its calibration text from `~/.cache/mlx-lm/calibration_v5.txt` (fetched from a
gist on first use); here HOME points at a temporary directory holding the committed tiny text
`mlx-cli/tests/quant/calibration.txt` under that name, so the real command line runs offline
on the tiny seeded llama of `goldens_convert.py` (`mlx-cli/tests/convert/llama/`, float16,
hidden 64, untied lm_head). The text is words of that tokenizer's vocabulary below the
fixture's 96 embedding rows, drawn with Python's `random.Random(34)` (written once, then
committed).

The golden (`mlx-cli/tests/goldens/gptq.json`) holds, per case, the calibration rows mlx-lm's
own `load_data` picks after `mx.random.seed(seed)` and `load(..., lazy=True)` (as `main`
does), and, as `goldens_convert.py` records them, every output file's sha256 and every
tensor's dtype, shape and sha256. Run with `cargo xtask goldens gptq`.
"""

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import mlx.core as mx

from goldens_convert import describe

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "mlx-cli" / "tests"
FIXTURE = CLI / "convert" / "llama"
TEXT = CLI / "quant" / "calibration.txt"
GOLDEN = CLI / "goldens" / "gptq.json"

# (case, args after --model/--mlx-path)
CASES = [
    ("q4_g32", ["--bits", "4", "--group-size", "32", "--num-samples", "16",
                "--sequence-length", "32", "--seed", "123"]),
    ("q2_g64", ["--bits", "2", "--group-size", "64", "--fallback-bits", "4",
                "--fallback-group-size", "32", "--num-samples", "-1",
                "--sequence-length", "48", "--seed", "7"]),
    # Tied embeddings (no lm_head to run GPTQ on), q/k norms, float32.
    ("qwen3_q8", ["--bits", "8", "--group-size", "32", "--fallback-group-size", "32", "--num-samples", "6",
                  "--sequence-length", "16", "--seed", "3"], "models/qwen3"),
]


def write_text():
    if TEXT.exists():
        return
    tok = json.loads((FIXTURE / "tokenizer.json").read_text())
    words = [w for w, i in tok["model"]["vocab"].items() if 6 <= i < 96]
    rng = random.Random(34)
    lines = []
    for _ in range(120):
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))))
    TEXT.parent.mkdir(parents=True, exist_ok=True)
    TEXT.write_text("\n".join(lines) + "\n")


def arg(args, name, default):
    return int(args[args.index(name) + 1]) if name in args else default


def calibration_rows(args, home, src):
    """mlx-lm's own `load_data` after `main`'s seeding and lazy load."""
    from mlx_lm.quant.utils import load_data
    from mlx_lm.utils import load

    os.environ["HOME"] = str(home)
    mx.random.seed(arg(args, "--seed", 123))
    _, tokenizer, _ = load(str(src), lazy=True, return_config=True)
    data = load_data(tokenizer, arg(args, "--num-samples", -1), arg(args, "--sequence-length", 512))
    return data.tolist()


def main():
    write_text()
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        (home / ".cache" / "mlx-lm").mkdir(parents=True)
        shutil.copy(TEXT, home / ".cache" / "mlx-lm" / "calibration_v5.txt")
        for case, args, *model in CASES:
            src = CLI / model[0] if model else FIXTURE
            dst = Path(tmp) / case
            cmd = [sys.executable, "-m", "mlx_lm.quant.gptq", "--model", str(src),
                   "--mlx-path", str(dst), *args]
            env = dict(os.environ, HOME=str(home))
            r = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if r.returncode != 0:
                sys.exit(f"{case}: {' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}")
            out[case] = {
                "args": args,
                "rows": calibration_rows(args, home, src),
                "files": describe(dst),
            }
            if model:
                out[case]["model"] = model[0]
            print(case, "ok")
    GOLDEN.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()

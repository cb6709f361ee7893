"""What mlx-lm 0.32.2's own `python -m mlx_lm fuse` writes, for `mlx fuse` (its directory
byte for byte: issue #34's writers).

Runs the real command line on committed adapters of mlx-train/tests/adapters/ and their base
models (mlx-train/tests/models/), re-quantizing a quantized base as mlx-lm does and with
`--dequantize`, and records the output as `goldens_convert.py` does (every file's sha256, every
tensor's dtype, shape and sha256) in mlx-cli/tests/goldens/fuse.json. `cargo test -p mlx-cli
--test integration convert::fuse_` compares `mlx fuse`'s directory with it. Run with `cargo
xtask goldens fuse`.
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from goldens_convert import describe

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "mlx-cli" / "tests" / "goldens" / "fuse.json"

# (case, adapters under mlx-train/tests/adapters, base under mlx-train/tests/models, args)
CASES = [
    ("dense_text_adam", "dense_text_adam", "dense", []),
    ("q4_completions_adafactor", "q4_completions_adafactor", "q4", []),
    ("q4_completions_adafactor_deq", "q4_completions_adafactor", "q4", ["--dequantize"]),
]


def main():
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case, adapters, base, args in CASES:
            dst = Path(tmp) / case
            cmd = [sys.executable, "-m", "mlx_lm", "fuse",
                   "--model", str(ROOT / "mlx-train" / "tests" / "models" / base),
                   "--adapter-path", str(ROOT / "mlx-train" / "tests" / "adapters" / adapters),
                   "--save-path", str(dst), *args]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"{case}: {' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}")
            out[case] = {"adapters": adapters, "base": base, "args": args, "files": describe(dst)}
            print(case, "ok")
    GOLDEN.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()

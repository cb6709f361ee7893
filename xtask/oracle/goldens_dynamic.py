"""What mlx-lm 0.32.2's own dynamic quantization (`python -m mlx_lm.quant.dynamic_quant`)
writes, for `mlx quant dynamic` (issue #34's learned quantizers).

As for GPTQ and AWQ (`goldens_gptq.py`), HOME points at a temporary directory whose
`.cache/mlx-lm/calibration_v5.txt` is the committed `mlx-cli/tests/quant/calibration.txt`, so the
real command line runs offline (`load_data(tokenizer, -1, 512)`: every 512-token row of it). It
runs in a temporary working directory, where it writes `<model>_sensitivities.json`.

The golden (`mlx-cli/tests/goldens/dynamic.json`) holds, per case, the arguments, the
sensitivities file's text, the `Original PPL` / `Quantized PPL` lines (with `--report-ppl`) and,
as `goldens_convert.py` records them, every output file's sha256 and every tensor's dtype,
shape and sha256. Run with `cargo xtask goldens dynamic`.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from goldens_convert import describe

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "mlx-cli" / "tests"
TEXT = CLI / "quant" / "calibration.txt"
GOLDEN = CLI / "goldens" / "dynamic.json"

# (case, model under mlx-cli/tests, args after --model/--mlx-path)
CASES = [
    # float16 llama, untied lm_head: defaults but the target, and the perplexity report.
    ("llama_bpw4_8", "convert/llama", ["--target-bpw", "4.8", "--report-ppl"]),
    # 3/6 bits in groups of 32, bfloat16 accumulation, another seed.
    ("llama_3_6_g32", "convert/llama",
     ["--target-bpw", "4.2", "--low-bits", "3", "--low-group-size", "32", "--high-bits", "6",
      "--high-group-size", "32", "--seed", "7", "--accumulation-dtype", "bfloat16"]),
    # float32 qwen3 with tied embeddings (the embedding is also the head) and q/k norms.
    ("qwen3_tied", "models/qwen3",
     ["--target-bpw", "4.9", "--low-group-size", "32", "--high-group-size", "32",
      "--seed", "3"]),
]


def main():
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        (home / ".cache" / "mlx-lm").mkdir(parents=True)
        shutil.copy(TEXT, home / ".cache" / "mlx-lm" / "calibration_v5.txt")
        for case, model, args in CASES:
            src = CLI / model
            work = Path(tmp) / f"work_{case}"
            work.mkdir()
            dst = work / "out"
            cmd = [sys.executable, "-m", "mlx_lm.quant.dynamic_quant", "--model", str(src),
                   "--mlx-path", str(dst), *args]
            env = dict(os.environ, HOME=str(home))
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
            if r.returncode != 0:
                sys.exit(f"{case}: {' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}")
            sens = work / (str(src).replace("/", "_") + "_sensitivities.json")
            out[case] = {
                "model": model,
                "args": args,
                "sensitivities": sens.read_text(),
                "ppl": [l for l in r.stdout.splitlines() if "PPL:" in l],
                "files": describe(dst),
            }
            print(case, "ok")
    GOLDEN.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()

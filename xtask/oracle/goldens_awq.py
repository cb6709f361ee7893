"""What mlx-lm 0.32.2's own AWQ (`mlx_lm.quant.awq.main`, the `mlx_lm.quant.awq` command line)
writes, for `mlx quant awq` (issue #34's learned quantizers).

As `goldens_gptq.py`: HOME points at a temporary directory whose
`.cache/mlx-lm/calibration_v5.txt` is the committed `mlx-cli/tests/quant/calibration.txt`, and
the model is the tiny float16 llama `mlx-cli/tests/convert/llama/`. The module has no
`__main__` guard, so its `main()` is called with the arguments in `sys.argv`, in a subprocess.
The golden (`mlx-cli/tests/goldens/awq.json`) holds, per case, every output file's sha256 and
every tensor's dtype, shape and sha256, and the per-block `Loss reduction` lines. Run with `cargo xtask goldens awq`
(case names after the script regenerate only those).
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
FIXTURE = CLI / "convert" / "llama"
TEXT = CLI / "quant" / "calibration.txt"
GOLDEN = CLI / "goldens" / "awq.json"

CASES = [
    ("q4_g32", ["--bits", "4", "--group-size", "32", "--num-samples", "8",
                "--sequence-length", "32", "--seed", "123"]),
    # Three run_layer batches (67 rows), clip inputs strided by 3, 3 bits, 6-bit embedding.
    ("q3_g64_all", ["--bits", "3", "--group-size", "64", "--embed-bits", "6",
                    "--embed-group-size", "64", "--num-samples", "-1",
                    "--sequence-length", "16", "--n-grid", "10", "--seed", "5"]),
    # The other classes of llama_awq: qwen3 (q/k norms, tied embeddings, float32), mistral
    # (llama.py with biases on every linear, Llama 3 rope, tied). (The qwen2_f32 fixture is left
    # out: transformers loads its word-level tokenizer.json as Qwen2's BPE class for that model
    # type, so mlx-lm's calibration ids are not the file's.)
    ("qwen3_q4", ["--bits", "4", "--group-size", "32", "--num-samples", "4",
                  "--sequence-length", "16", "--n-grid", "10", "--seed", "2"], "models/qwen3"),
    ("mistral_q8", ["--bits", "8", "--group-size", "32", "--num-samples", "4",
                    "--sequence-length", "16", "--n-grid", "10", "--seed", "3"],
     "models/mistral_bias_llama3rope"),
    # gemma3_text_awq: `1 + w` norms, the MLP's pre_feedforward_layernorm, sliding layers (run
    # under the one causal mask, as awq_quantize does), an untied lm_head.
    ("gemma3_q4", ["--bits", "4", "--group-size", "32", "--num-samples", "4",
                   "--sequence-length", "16", "--n-grid", "10", "--seed", "4"], "models/gemma3_text"),
    # The wrapper (`lm_key="language_model"`): names and per-module entries under
    # `language_model.` ("+": the fixture staged beside the tiny tokenizer's files).
    ("gemma3_wrapper_q4", ["--bits", "4", "--group-size", "32", "--num-samples", "4",
                           "--sequence-length", "16", "--n-grid", "10", "--seed", "4"],
     "+../../mlx-models/tests/models/dense/gemma3_wrapper"),
    # llama_awq on ministral3: `llama_4_scaling` query scales (the attention makes its own for
    # positions from 0 when AWQ calls it alone; original_max_position_embeddings 4, so they
    # vary over the 16 positions), a sliding layer run under the one causal mask; and its
    # `mistral3` wrapper (`lm_key="language_model"`).
    ("ministral3_q4", ["--bits", "4", "--group-size", "32", "--num-samples", "4",
                       "--sequence-length", "16", "--n-grid", "10", "--seed", "6"],
     "+../../mlx-models/tests/models/dense/ministral3"),
    ("mistral3_wrapper_q4", ["--bits", "4", "--group-size", "32", "--num-samples", "4",
                             "--sequence-length", "16", "--n-grid", "10", "--seed", "6"],
     "+../../mlx-models/tests/models/dense/mistral3_wrapper"),
]

RUN = "import sys; from mlx_lm.quant.awq import main; sys.argv = ['awq'] + sys.argv[1:]; main()"


def main():
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        (home / ".cache" / "mlx-lm").mkdir(parents=True)
        shutil.copy(TEXT, home / ".cache" / "mlx-lm" / "calibration_v5.txt")
        only = set(sys.argv[1:])
        if only and GOLDEN.exists():
            out = json.loads(GOLDEN.read_text())
        for case, args, *model in CASES:
            if only and case not in only:
                continue
            src = CLI / model[0].lstrip("+") if model else FIXTURE
            if model and model[0].startswith("+"):
                staged = Path(tmp) / f"staged_{case}"
                shutil.copytree(src, staged)
                for f in ["tokenizer.json", "tokenizer_config.json"]:
                    shutil.copy(CLI / "models" / "tokenizer" / f, staged / f)
                src = staged
            dst = Path(tmp) / case
            cmd = [sys.executable, "-c", RUN, "--model", str(src), "--mlx-path", str(dst), *args]
            r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, HOME=str(home)))
            if r.returncode != 0:
                sys.exit(f"{case}: {' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}")
            log = [l for l in (r.stdout + r.stderr).splitlines() if l.startswith("Loss")]
            out[case] = {"args": args, "log": log, "files": describe(dst)}
            if model:
                out[case]["model"] = model[0]
            keep = os.environ.get("AWQ_KEEP")
            if keep:
                shutil.copytree(dst, Path(keep) / case, dirs_exist_ok=True)
            print(case, "ok")
    GOLDEN.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()

"""What mlx-lm 0.32.2's own DWQ (`mlx_lm.quant.dwq.main`) writes, for `mlx quant dwq` (issue
#34's learned quantizers).

mlx-lm's `load_data` reads a Hugging Face dataset through `datasets.load_dataset(path,
split="train")` (the oracle venv has no `datasets`, and nothing is on the hub from here): this
script runs mlx-lm's own `main` with only that call replaced, by mlx-lm's own
`create_dataset` over the rows of the committed `mlx-cli/tests/quant/dwq_train.jsonl` in file
order (what `load_dataset` of a local JSONL file's `train` split gives). Everything else
(numpy's permutation under `--seed`, `quantize_model`, `dwq_quantize` with its Adam, the
float teacher's logits, `save`) is mlx-lm's. The rows are `text` rows of words of the tiny
llama's vocabulary (`random.Random(35)`, written once, then committed).

The golden (`mlx-cli/tests/goldens/dwq.json`) holds, per case, the arguments, the
`Trainable parameters` and `Validation` lines and, as `goldens_convert.py` records them, every
output file's sha256 and every tensor's dtype, shape and sha256 (and, with `--target-dir`, each
saved target file's sha256). Run with `cargo xtask goldens dwq`.
"""

import contextlib
import io
import json
import random
import sys
import tempfile
import types
from pathlib import Path

from goldens_convert import describe

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "mlx-cli" / "tests"
DATA = CLI / "quant" / "dwq_train.jsonl"
GOLDEN = CLI / "goldens" / "dwq.json"

# (case, model under mlx-cli/tests, args after --model/--mlx-path/--data-path)
CASES = [
    # float16 llama, untied head: 4 bits in groups of 32, two steps of four rows.
    ("llama_q4_g32", "convert/llama",
     ["--bits", "4", "--group-size", "32", "--num-samples", "8", "--learning-rate", "1e-3",
      "--seed", "5"]),
    # float32 qwen3 with tied embeddings and q/k norms: 3 bits, short rows cut at 17 tokens.
    ("qwen3_q3", "models/qwen3",
     ["--bits", "3", "--group-size", "32", "--num-samples", "6", "--batch-size", "2",
      "--max-seq-length", "17", "--learning-rate", "1e-4", "--seed", "9"]),
    # 8 bits: the scales and biases stay frozen, the norms train.
    ("llama_q8", "convert/llama",
     ["--bits", "8", "--group-size", "64", "--num-samples", "4", "--learning-rate", "1e-2"]),
    # An already quantized student (`mlx_lm convert -q --q-bits 3 --q-group-size 32` of the
    # llama, "@quantized" below): trained instead of quantizing the teacher.
    ("llama_quantized_model", "convert/llama",
     ["--quantized-model", "@quantized", "--num-samples", "8", "--learning-rate", "1e-3",
      "--seed", "5"]),
    # Targets saved to a directory ("@targets") and read back: the llama with its vocabulary
    # padded with zero rows to 1056 ("@padded"), since the targets are the top 1024 logits.
    ("llama_target_dir", "@padded",
     ["--target-dir", "@targets", "--bits", "4", "--group-size", "32", "--num-samples", "8",
      "--learning-rate", "1e-3", "--seed", "5"]),
]
QUANTIZED_ARGS = ["-q", "--q-bits", "3", "--q-group-size", "32"]
PADDED_VOCAB = 1056


def stage_padded(dst):
    """convert/llama with `embed_tokens` and `lm_head` padded with zero rows to 1056."""
    import mlx.core as mx
    import shutil
    src = CLI / "convert" / "llama"
    shutil.copytree(src, dst)
    w = mx.load(str(src / "model.safetensors"))
    for k in ["model.embed_tokens.weight", "lm_head.weight"]:
        a = w[k]
        w[k] = mx.concatenate([a, mx.zeros((PADDED_VOCAB - a.shape[0], a.shape[1]), a.dtype)])
    mx.save_safetensors(str(dst / "model.safetensors"), w)
    cfg = json.loads((src / "config.json").read_text())
    cfg["vocab_size"] = PADDED_VOCAB
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))


def targets_of(d):
    """Each saved target file's sha256, as `split/name`."""
    import hashlib
    return {f"{p.parent.name}/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest()[:16]
            for p in sorted(d.glob("*/*.safetensors"))}


def write_data():
    if DATA.exists():
        return
    tok = json.loads((CLI / "convert" / "llama" / "tokenizer.json").read_text())
    words = [w for w, i in tok["model"]["vocab"].items() if 6 <= i < 96]
    rng = random.Random(35)
    rows = []
    for _ in range(20):
        rows.append({"text": " ".join(rng.choice(words) for _ in range(rng.randint(3, 24)))})
    DATA.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main():
    write_data()
    import mlx_lm.quant.dwq as dwq
    from mlx_lm.tuner.datasets import create_dataset

    rows = [json.loads(l) for l in DATA.read_text().splitlines()]

    def local_dataset(args, tokenizer):
        return create_dataset(rows, tokenizer, types.SimpleNamespace()), None, None

    dwq.load_dataset = local_dataset
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        import subprocess
        quantized = Path(tmp) / "quantized"
        subprocess.run([sys.executable, "-m", "mlx_lm", "convert", "--hf-path",
                        str(CLI / "convert" / "llama"), "--mlx-path", str(quantized),
                        *QUANTIZED_ARGS], check=True, capture_output=True)
        padded = Path(tmp) / "padded"
        stage_padded(padded)
        for case, model, args in CASES:
            dst = Path(tmp) / case
            targets = Path(tmp) / f"targets_{case}"
            at = {"@quantized": str(quantized), "@targets": str(targets), "@padded": str(padded)}
            sys.argv = ["dwq", "--model", at.get(model, str(CLI / model)), "--mlx-path", str(dst),
                        "--data-path", str(DATA), *[at.get(a, a) for a in args]]
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
                dwq.main()
            lines = [l.strip() for l in buf.getvalue().replace("\r", "\n").splitlines()]
            out[case] = {
                "model": model,
                "args": args,
                "log": [l for l in lines
                        if l.startswith("Trainable parameters") or l.startswith("Validation:")],
                "files": describe(dst),
            }
            if targets.exists():
                out[case]["targets"] = targets_of(targets)
            print(case, "ok", out[case]["log"])
    GOLDEN.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()

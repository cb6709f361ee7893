"""What mlx-lm 0.32.2's `mlx_lm.perplexity` computes, for `mlx perplexity` (issue #34).

Writes a small seeded JSONL text dataset over the tiny word-level tokenizer's words (ids below
96, the smallest fixture vocabulary) to mlx-cli/tests/perplexity/train.jsonl, then runs
mlx_lm.perplexity's own steps as its `main` does (`np.random.seed(seed)`,
`mx.random.seed(seed)`, `load`, `load_data`, `eval_ppl`) on tiny fixtures of
mlx-cli/tests/models/. The `datasets` package is not in the oracle venv, so `load_data`'s
`load_dataset` is given the records as `datasets.load_dataset("json")` returns a local file's
(in file order), through mlx-lm's own `create_dataset`.

(`--num-samples -1` is not a case: mlx-lm 0.32.2 then reads past the last record and
raises IndexError; `mlx perplexity` uses every record.)

Golden: mlx-cli/tests/goldens/perplexity.json: per case the perplexity and its standard error
(Python floats, repr), the sample count and the rows' sha256; `model_loaded`, per model the
count mlx_lm.perplexity's `main` takes from `get_total_parameters` and the line its `main`
prints with it (a short run of `main` on the same records); and `benchmark_prompts`, the 12-token prompt `mlx_lm.benchmark` draws for two fixtures (for
`mlx benchmark`).

Run with `cargo xtask goldens perplexity`.
"""

import contextlib
import hashlib
import io
import json
import random
import sys
import types
from pathlib import Path

import mlx.core as mx
import numpy as np

import mlx_lm.perplexity as ppl_mod
from mlx_lm.tuner.datasets import create_dataset
from mlx_lm.utils import get_total_parameters, load

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "mlx-cli" / "tests"
DATA = CLI / "perplexity" / "train.jsonl"
GOLDEN = CLI / "goldens" / "perplexity.json"


def write_data():
    vocab = json.loads((CLI / "models" / "tokenizer" / "tokenizer.json").read_text())["model"]["vocab"]
    words = [w for w, i in vocab.items() if 10 <= i < 96]
    rng = random.Random(34)
    DATA.parent.mkdir(parents=True, exist_ok=True)
    with open(DATA, "w") as f:
        for _ in range(24):
            n = rng.randint(8, 40)
            f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(n))}) + "\n")


CASES = [
    # (case, model, batch_size, sequence_length, num_samples, seed)
    ("qwen3_b4_l16_n6", "models/qwen3", 4, 16, 6, 123),
    ("qwen3_b8_l24_n12", "models/qwen3", 8, 24, 12, 7),
    ("dense_bf16_untied_b2_l24_n5", "models/dense_bf16_untied", 2, 24, 5, 123),
    ("q4_g32_b3_l16_n7", "models/q4_g32", 3, 16, 7, 5),
    ("llama_f16_b4_l20_n8", "convert/llama", 4, 20, 8, 123),
]


def model_loaded_line(model_dir):
    """The `Model loaded: N.NM parameters` line of `mlx_lm.perplexity`'s `main` on a model."""
    argv = sys.argv
    sys.argv = ["mlx_lm.perplexity", "--model", str(CLI / model_dir), "--data-path", str(DATA),
                "--num-samples", "4", "--sequence-length", "8", "--batch-size", "2"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            ppl_mod.main()
    finally:
        sys.argv = argv
    return next(l for l in out.getvalue().splitlines() if l.startswith("Model loaded: "))


def main():
    write_data()
    records = [json.loads(l) for l in DATA.read_text().splitlines()]

    def load_dataset(args, tokenizer):
        config = types.SimpleNamespace(**args.hf_dataset, mask_prompt=False)
        return create_dataset(records, tokenizer, config), [], []

    ppl_mod.load_dataset = load_dataset
    out = {}
    loaded = {}
    for case, model_dir, batch, seq, num, seed in CASES:
        np.random.seed(seed)
        mx.random.seed(seed)
        model, tokenizer = load(str(CLI / model_dir))
        # The count mlx_lm.perplexity's `main` prints (its line: `model_loaded_line`).
        loaded[model_dir] = {"total_parameters": int(get_total_parameters(model))}
        data = ppl_mod.load_data(tokenizer, str(DATA), num_samples=num, sequence_length=seq)
        ppl, se = ppl_mod.eval_ppl(model, data, batch_size=batch)
        rows = np.array(data).astype(np.int32)
        out[case] = {
            "model": model_dir,
            "batch_size": batch,
            "sequence_length": seq,
            "num_samples": num,
            "seed": seed,
            "perplexity": repr(ppl),
            "standard_error": repr(se),
            "samples": int(data.shape[0]),
            "rows_sha256": hashlib.sha256(rows.tobytes()).hexdigest(),
        }
        print(case, ppl, se, file=sys.stderr)
    # mlx_lm.benchmark's prompt ids: `mx.random.seed(0)`, `load` (whose construction draws
    # from the global key), then `randint(0, vocab_size, (batch, prompt_tokens))`.
    bench = {}
    for model_dir in ["models/qwen3", "models/q4_g32"]:
        mx.random.seed(0)
        model, tokenizer, config = load(str(CLI / model_dir), return_config=True)
        vocab = config.get("vocab_size") or config["text_config"]["vocab_size"]
        bench[model_dir] = mx.random.randint(0, vocab, (1, 12)).tolist()[0]
    # The `Model loaded` line as mlx_lm.perplexity's own `main` prints it (a short run on the
    # same records), after every figure above so its seeding moves none of them.
    for model_dir in loaded:
        loaded[model_dir]["line"] = model_loaded_line(model_dir)
    GOLDEN.write_text(
        json.dumps({"cases": out, "model_loaded": loaded, "benchmark_prompts": bench}, indent=1, sort_keys=True) + "\n"
    )


if __name__ == "__main__":
    main()

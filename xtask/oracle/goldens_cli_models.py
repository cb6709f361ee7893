"""What mlx-lm 0.32.2's own `generate_step` produces on every tiny seeded model fixture, for
the "done when" of issues #13 and #14: `mlx generate --model DIR --prompt-ids ... --top-logprobs
5 --json` must reproduce mlx-lm's greedy ids, the chosen log-probabilities and each step's top-5
(ids and log-probabilities) exactly (`mlx-cli/tests/models_cli.rs`).

Fixtures: every model directory that `dense_goldens.rs` (mlx-models/tests/models/dense/*),
`models_goldens.rs` and `llama_goldens.rs` (mlx-models/tests/models/*) check, each in its own
stored dtype (mlx-lm's `load_model` keeps the stored dtypes; the test runs `--dtype stored`).
A tiny WordLevel tokenizer over `t0`..`t127` (ids are what is compared; mlx-lm's side needs no
tokenizer) is written to mlx-cli/tests/models/wordlevel/ and copied by the test beside each
model.

Golden: mlx-cli/tests/goldens/cli_models.json. Per fixture: the generated ids, the chosen
log-probabilities and the top-5 `[id, logprob]` pairs of each step (`mx.argsort(-logprobs)`),
every float also as its float32 bit pattern.

Also `embed`: `mlx embed --model DIR --text T ...` on the dense/qwen3 fixture. sentence-transformers
is not installed in the oracle venv (nor torch), so the golden is what its Qwen3-Embedding
configuration describes (modules.json: Transformer, then `1_Pooling` with
`pooling_mode_lasttoken: true`, then `Normalize`), computed over mlx-lm's own inner model
(`model.model`): the texts encoded by the `tokenizers` library with special tokens, each text
alone, the last token's final normed hidden state in float32, divided by
`max(||x||_2, 1e-12)` (`torch.nn.functional.normalize`).

Run with `cargo xtask goldens cli_models`.
"""

import json
import struct
import sys
import types
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step
from tokenizers import Tokenizer
from mlx_lm.utils import load_model

# mlx_lm/models/olmo.py exits unless `hf_olmo` imports; it is only an availability probe (the
# model is mlx-lm's own), so an empty module stands in for it (as in goldens_dense.py).
sys.modules.setdefault("hf_olmo", types.ModuleType("hf_olmo"))

MODELS = Path("mlx-models/tests/models")
TOKENIZER_DIR = Path("mlx-cli/tests/models/wordlevel")
GOLDEN = Path("mlx-cli/tests/goldens/cli_models.json")
# Every fixture's vocabulary has at least 96 ids.
PROMPT = [(7 * i + 3) % 96 for i in range(40)]
MAX_TOKENS = 8
TOP = 5
# OLMo 1: mlx-lm 0.32.2 adds the "causal" mask string to its scores, so it runs only one token
# at a time (see goldens_dense.py): its prompt is the first id alone.
ONE_TOKEN = {"dense/olmo"}


def bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def write_tokenizer():
    vocab = {f"t{i}": i for i in range(128)}
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
        "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"},
    }
    TOKENIZER_DIR.mkdir(parents=True, exist_ok=True)
    (TOKENIZER_DIR / "tokenizer.json").write_text(json.dumps(tok, indent=1) + "\n")
    (TOKENIZER_DIR / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}, indent=1) + "\n")


def fixtures():
    out = []
    for d in sorted(MODELS.iterdir()):
        if (d / "config.json").exists():
            out.append(d.name)
    for d in sorted((MODELS / "dense").iterdir()):
        if (d / "config.json").exists():
            out.append(f"dense/{d.name}")
    return out


def run(name):
    model, _ = load_model(MODELS / name)
    prompt = PROMPT[:1] if name in ONE_TOKEN else PROMPT
    tokens, logprobs, tops = [], [], []
    for (tok, lp), _ in zip(generate_step(mx.array(prompt), model, max_tokens=MAX_TOKENS),
                            range(MAX_TOKENS)):
        tok = int(tok)
        tokens.append(tok)
        chosen = lp[tok].item()
        logprobs.append([chosen, bits(chosen)])
        order = mx.argsort(-lp)[:TOP].tolist()
        tops.append([[i, lp[i].item(), bits(lp[i].item())] for i in order])
    dtype = str(next(v.dtype for _, v in _leaves(model.parameters())))
    return {"prompt_ids": prompt, "tokens": tokens, "logprobs": logprobs, "top_logprobs": tops, "first_param_dtype": dtype}


def _leaves(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _leaves(v, f"{prefix}{k}.")
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _leaves(v, f"{prefix}{i}.")
    else:
        yield prefix, tree


EMBED_MODEL = "dense/qwen3"
EMBED_TEXTS = ["t5 t17 t3 t88 t40", "t1 t2", "t95"]


def embed():
    tok = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    model, _ = load_model(MODELS / EMBED_MODEL)
    ids, vectors = [], []
    for text in EMBED_TEXTS:
        t = tok.encode(text, add_special_tokens=True).ids
        x = model.model(mx.array([t]))[:, -1, :].astype(mx.float32)
        norm = mx.maximum(mx.sqrt(mx.sum(x * x, axis=-1, keepdims=True)), 1e-12)
        v = (x / norm)[0].tolist()
        ids.append(t)
        vectors.append([bits(f) for f in v])
    return {"model": EMBED_MODEL, "texts": EMBED_TEXTS, "token_ids": ids, "embedding_bits": vectors}


def main():
    write_tokenizer()
    cases = {}
    for name in fixtures():
        cases[name] = run(name)
        print(f"{name}: {cases[name]['tokens']}", file=sys.stderr)
    golden = {
        "generator": f"xtask/oracle/goldens_cli_models.py mlx={mx.__version__} "
                     f"mlx_lm={__import__('mlx_lm').__version__}",
        "max_tokens": MAX_TOKENS,
        "top_logprobs": TOP,
        "cases": cases,
        "embed": embed(),
    }
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(golden, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {GOLDEN}: {len(cases)} fixtures", file=sys.stderr)


if __name__ == "__main__":
    main()

"""phi3small (issue #32): tiny seeded models built by mlx-lm 0.32.2's own `phi3small.Model`, and
what mlx-lm computes on them.

mlx-lm's phi3small writes -inf into logits columns 100256..100351 (`_dummy_tokenizer_ids`)
whatever the vocabulary, so a model with fewer than 100,352 rows crashes it (an
out-of-bounds scatter). The fixtures therefore have the real vocabulary size, but only the
first `ROWS` embedding rows are random: the rest are zero. What is committed is compact:
- mlx-models/tests/models/phi3small/<name>/config.json and model.safetensors, the latter with
  `model.embed_tokens.weight` cut to its first `ROWS` rows (the rows after it are zero, as
  this script checks on what mlx-lm saved); `materialize` in the Rust tests pads it back to
  `vocab_size` rows before loading, and this script loads the same padded file with mlx-lm's
  `load_model`;
- mlx-models/tests/goldens/phi3small/<name>.safetensors: mlx-lm's logits (`prefill` with a fresh
  `make_prompt_cache` cache, `step<i>` of each greedy token through the cache, `full` of one
  cache-less forward), cut to their first `ROWS` columns; this script checks that every other
  column is 0 except the dummy ids, -inf, which the Rust test checks of its own logits too;
- mlx-cli/tests/goldens/cli_phi3small.json: `generate_step`'s greedy ids, chosen
  log-probabilities and per-step top-5 on a 40-token prompt (goldens_cli_models.py's format).

Run with `cargo xtask goldens phi3small`.
"""

import json
import os
import pathlib
import shutil
import struct
import sys

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map
from mlx_lm.generate import generate_step
from mlx_lm.models import phi3small
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from golden import Golden

ROWS = 128
VOCAB = 100352
DUMMY = [100256, 100258, 100259, 100260, 100264, 100265] + list(range(100267, 100352))

BASE = {
    "model_type": "phi3small",
    "hidden_size": 32,
    "dense_attention_every_n_layers": 2,
    "ff_intermediate_size": 32,
    "gegelu_limit": 2.0,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "layer_norm_epsilon": 1e-5,
    "vocab_size": VOCAB,
    "blocksparse_block_size": 32,
    "blocksparse_num_local_blocks": 1,
    "blocksparse_vert_stride": 2,
}

# name: (overrides, dtype)
CASES = {
    # Block-sparse layers 0 and 2 (32-token blocks, one local block, every second block
    # vertical per head), dense SDPA on layer 1; muP scaling of attention, embeddings, logits.
    "phi3small": ({}, "float32"),
    # Square-root attention scale, no embedding multiplier, other rope base and scale, 64-token
    # blocks, three KV groups of one query head.
    "phi3small_bf16": (
        {"mup_use_scaling": False, "mup_embedding_multiplier": 0.0, "num_key_value_heads": 4,
         "rope_embedding_base": 10000.0, "rope_position_scale": 0.5,
         "blocksparse_block_size": 64, "blocksparse_num_local_blocks": 2,
         "blocksparse_vert_stride": 3, "dense_attention_every_n_layers": 3,
         "num_hidden_layers": 2, "gegelu_limit": 1.0},
        "bfloat16",
    ),
}

PROMPT = [(5 * i + 1) % ROWS for i in range(70)]
STEPS = 5
CLI_PROMPT = [(7 * i + 3) % 96 for i in range(40)]
CLI_MAX_TOKENS = 8
TOP = 5
MODELS = pathlib.Path("mlx-models/tests/models/phi3small")
GOLDENS = pathlib.Path("mlx-models/tests/goldens/phi3small")
CLI_GOLDEN = pathlib.Path("mlx-cli/tests/goldens/cli_phi3small.json")
STAGE = pathlib.Path("target/goldens_phi3small")
EMBED = "model.embed_tokens.weight"


def bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def build(i, name, overrides, dtype):
    config = {**BASE, **overrides}
    mx.random.seed(4100 + i)
    model = phi3small.Model(phi3small.ModelArgs.from_dict(config))
    model.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.3, model.parameters()))
    emb = model.model.embed_tokens.weight
    keep = (mx.arange(emb.shape[0]) < ROWS)[:, None]
    model.model.embed_tokens.weight = mx.where(keep, emb, mx.zeros_like(emb))
    model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    stage = STAGE / name
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(stage / "model.safetensors"), weights)
    (stage / "config.json").write_text(json.dumps(config, indent=2))
    # The compact copy: every tensor as saved, the embedding's zero rows left out.
    saved = mx.load(str(stage / "model.safetensors"))
    assert not mx.any(saved[EMBED][ROWS:]).item()
    saved[EMBED] = saved[EMBED][:ROWS]
    out_dir = MODELS / name
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    mx.save_safetensors(str(out_dir / "model.safetensors"), saved)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return stage


def cut(logits):
    """The first ROWS columns; the others must be 0, the dummy ids -inf."""
    tail = logits[..., ROWS:].astype(mx.float32)
    want = mx.zeros(tail.shape[-1])
    want[mx.array(DUMMY) - ROWS] = -float("inf")
    assert mx.array_equal(tail, mx.broadcast_to(want, tail.shape)).item()
    return logits[..., :ROWS]


def logits_golden(name, stage):
    model, _ = load_model(stage)
    g = Golden(str(GOLDENS / f"{name}.safetensors"), __file__)
    cache = make_prompt_cache(model)
    ids = mx.array([PROMPT], dtype=mx.int32)
    logits = model(ids, cache=cache)
    g.case("prefill", "forward", [ids], cut(logits))
    greedy = []
    for s in range(STEPS):
        nxt = mx.argmax(logits[:, -1, :], axis=-1).astype(mx.int32)
        greedy.append(nxt.item())
        ids = nxt[:, None]
        logits = model(ids, cache=cache)
        g.case(f"step{s}", "forward", [ids], cut(logits))
    full_ids = mx.array([PROMPT + greedy], dtype=mx.int32)
    g.case("full", "forward_nocache", [full_ids], cut(model(full_ids)))
    g.meta["greedy"] = ",".join(map(str, greedy))
    g.meta["model_type"] = "phi3small"
    g.meta["rows"] = str(ROWS)
    g.save()


def cli_golden(stage):
    model, _ = load_model(stage)
    tokens, logprobs, tops = [], [], []
    for (tok, lp), _ in zip(generate_step(mx.array(CLI_PROMPT), model, max_tokens=CLI_MAX_TOKENS),
                            range(CLI_MAX_TOKENS)):
        tok = int(tok)
        tokens.append(tok)
        chosen = lp[tok].item()
        logprobs.append([chosen, bits(chosen)])
        order = mx.argsort(-lp)[:TOP].tolist()
        tops.append([[i, lp[i].item(), bits(lp[i].item())] for i in order])
    return {"prompt_ids": CLI_PROMPT, "tokens": tokens, "logprobs": logprobs, "top_logprobs": tops}


def main():
    GOLDENS.mkdir(parents=True, exist_ok=True)
    cases = {}
    for i, (name, (overrides, dtype)) in enumerate(CASES.items()):
        stage = build(i, name, overrides, dtype)
        logits_golden(name, stage)
        cases[f"phi3small/{name}"] = cli_golden(stage)
        print(f"{name}: {cases[f'phi3small/{name}']['tokens']}", file=sys.stderr)
    golden = {
        "generator": f"xtask/oracle/goldens_phi3small.py mlx={mx.__version__} "
                     f"mlx_lm={__import__('mlx_lm').__version__}",
        "max_tokens": CLI_MAX_TOKENS,
        "top_logprobs": TOP,
        "rows": ROWS,
        "cases": cases,
    }
    CLI_GOLDEN.write_text(json.dumps(golden, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {CLI_GOLDEN}: {len(cases)} fixtures", file=sys.stderr)


if __name__ == "__main__":
    main()

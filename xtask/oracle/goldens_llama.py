"""Tiny seeded llama-family models and mlx-lm 0.32.2's logits on them.

For each config below: build mlx-lm's llama Model, seed its random init, cast / quantize it,
save it as an HF-style directory under mlx-models/tests/models/<name>/ (config.json +
model.safetensors), load it back with mlx_lm.utils.load_model (so sanitize and the
quantization predicate run exactly as for a user), then record:
- `prefill`: logits for the prompt with a fresh cache;
- `step<i>`: logits for each greedy token fed one at a time through the cache;
- `full`: logits of one cache-less forward over prompt + generated tokens;
into mlx-models/tests/goldens/llama_<name>.safetensors (param `greedy` = the ids).
Run with `cargo xtask goldens llama`.
"""

import json
import os
import shutil

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models import llama
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from golden import Golden

BASE = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 128,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}

CONFIGS = {
    "dense_f32": ({}, "float32", None),
    "dense_f16": ({"tie_word_embeddings": False}, "float16", None),
    "dense_bf16_untied": ({"tie_word_embeddings": False}, "bfloat16", None),
    "dense_bf16_mha": ({"num_key_value_heads": 4, "rope_traditional": True}, "bfloat16", None),
    "q4_g32": ({}, "float32", (32, 4)),
    "q4_g64_untied": ({"tie_word_embeddings": False}, "float32", (64, 4)),
    "q8_g32_bf16": ({}, "bfloat16", (32, 8)),
    "q8_g64": ({"tie_word_embeddings": False}, "float16", (64, 8)),
    "mistral_bias_llama3rope": (
        {
            "model_type": "mistral",
            "attention_bias": True,
            "mlp_bias": True,
            "head_dim": 32,
            "rope_theta": 500000,
            "max_position_embeddings": 2048,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
        "float32",
        None,
    ),
    "linear_rope_sliding": (
        {
            "rope_scaling": {"type": "linear", "factor": 2.0},
            "layer_types": ["sliding_attention", "full_attention"],
            "sliding_window": 6,
        },
        "float32",
        None,
    ),
    "yarn_rope": (
        {
            "max_position_embeddings": 4096,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
        },
        "float32",
        None,
    ),
}

PROMPT = [1, 17, 99, 5, 42, 42, 7, 120, 3, 64]
STEPS = 6

for i, (name, (overrides, dtype, quant)) in enumerate(CONFIGS.items()):
    config = {**BASE, **overrides}
    mx.random.seed(100 + i)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    # A wider init than the default so logits are not all near zero.
    model.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.3, model.parameters()))
    model.set_dtype(getattr(mx, dtype))
    if quant is not None:
        gs, bits = quant
        nn.quantize(model, group_size=gs, bits=bits)
        config["quantization"] = {"group_size": gs, "bits": bits}
    mx.eval(model.parameters())
    out_dir = f"mlx-models/tests/models/{name}"
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    mx.save_safetensors(f"{out_dir}/model.safetensors", dict(tree_flatten(model.parameters())))
    with open(f"{out_dir}/config.json", "w") as f:
        json.dump(config, f, indent=2)

    model, _ = load_model(__import__("pathlib").Path(out_dir))
    g = Golden(f"mlx-models/tests/goldens/llama_{name}.safetensors", __file__)
    cache = make_prompt_cache(model)
    ids = mx.array([PROMPT], dtype=mx.int32)
    logits = model(ids, cache=cache)
    g.case("prefill", "forward", [ids], logits)
    greedy = []
    for s in range(STEPS):
        nxt = mx.argmax(logits[:, -1, :], axis=-1).astype(mx.int32)
        greedy.append(nxt.item())
        ids = nxt[:, None]
        logits = model(ids, cache=cache)
        g.case(f"step{s}", "forward", [ids], logits)
    full_ids = mx.array([PROMPT + greedy], dtype=mx.int32)
    g.case("full", "forward_nocache", [full_ids], model(full_ids))
    g.meta["greedy"] = ",".join(map(str, greedy))
    g.save()

"""mlx-lm 0.32.2's float32 logits on tiny seeded MLX affine (and dense) llama directories whose
weights are stored in half precision: what `--dtype auto` computes on the CPU backend.

mlx-lm has no dtype option: `Module.set_dtype(mx.float32)` after `load_model` casts every
floating parameter (norms, embeddings, dense weights, quantization scales and biases) as our
`--dtype float32` does. Our CPU-decoder load (`load_model_dir_as(..., keep_linear_scales)`)
keeps the linear layers' scales and biases as stored; these goldens check that the exact path
still gives these bits to the last one.

Writes the 4-bit fixture `mlx-models/tests/models/q4_g64_f16/` (groups of 64, float16 scales,
tied embeddings: built and saved as `goldens_llama.py` builds its models) and, for it and the
existing half-precision fixtures of `goldens_llama.py`, the prefill, 6 cached greedy steps and
a cache-less forward into `mlx-models/tests/goldens/affine_f32/<name>.safetensors`.
Run with `cargo xtask goldens affine_f32`.
"""

import json
import os
import shutil
from pathlib import Path

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

PROMPT = [1, 17, 99, 5, 42, 42, 7, 120, 3, 64]
STEPS = 6

# The new fixture: 4 bits in groups of 64 with float16 scales (what `mlx convert -q` writes
# from a float16 model).
name = "q4_g64_f16"
config = dict(BASE)
mx.random.seed(321)
model = llama.Model(llama.ModelArgs.from_dict(config))
model.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.3, model.parameters()))
model.set_dtype(mx.float16)
nn.quantize(model, group_size=64, bits=4)
config["quantization"] = {"group_size": 64, "bits": 4}
mx.eval(model.parameters())
out_dir = f"mlx-models/tests/models/{name}"
shutil.rmtree(out_dir, ignore_errors=True)
os.makedirs(out_dir)
mx.save_safetensors(f"{out_dir}/model.safetensors", dict(tree_flatten(model.parameters())))
with open(f"{out_dir}/config.json", "w") as f:
    json.dump(config, f, indent=2)

# Half-precision fixtures: the new one, goldens_llama.py's quantized ones (8 bits, float16 /
# bfloat16 scales) and its dense ones.
for name in ["q4_g64_f16", "q8_g64", "q8_g32_bf16", "dense_f16", "dense_bf16_untied"]:
    model, _ = load_model(Path(f"mlx-models/tests/models/{name}"))
    model.set_dtype(mx.float32)
    g = Golden(f"mlx-models/tests/goldens/affine_f32/{name}.safetensors", __file__)
    cache = make_prompt_cache(model)
    ids = mx.array([PROMPT], dtype=mx.int32)
    logits = model(ids, cache=cache)
    assert logits.dtype == mx.float32
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

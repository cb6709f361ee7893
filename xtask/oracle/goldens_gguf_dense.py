"""GGUF name maps of the dense table: tiny seeded models written as llama.cpp would write them
(its tensor names, Gemma norms stored as 1 + w, its metadata keys), and mlx-lm 0.32.2's
logits on the same weights.

For each case: build `mlx_lm.models.<model_type>.Model`, seed it (normal * 0.3), write
mlx-models/tests/models/gguf/<name>.gguf with `mx.save_gguf`; then read that file back with
`mx.load` (as our loader does through MLX), map the names back to mlx-lm's (Gemma norms
`- 1`), load them strictly into a fresh mlx-lm model and record prefill, cached decode steps
and a cache-less forward into mlx-models/tests/goldens/gguf/<name>.safetensors.
Run with `cargo xtask goldens gguf_dense`.
"""

import importlib
import os

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models.cache import make_prompt_cache

from golden import Golden

COMMON = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "vocab_size": 96,
    "max_position_embeddings": 256,
}

# name: (gguf architecture, model_type, config overrides); each config is what the GGUF
# metadata can express (llama.cpp's conventions, e.g. Gemma 3's pattern of 6).
CASES = {
    "qwen2": ("qwen2", "qwen2", {"rope_theta": 1000000.0, "tie_word_embeddings": False}),
    "qwen3": ("qwen3", "qwen3", {"head_dim": 16, "rope_theta": 1000000.0, "tie_word_embeddings": True}),
    "phi3": ("phi3", "phi3", {"rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
    "gemma": ("gemma", "gemma", {"head_dim": 8, "rope_theta": 10000.0}),
    "gemma2": (
        "gemma2",
        "gemma2",
        {
            "head_dim": 8,
            "query_pre_attn_scalar": 8,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "rope_theta": 10000.0,
        },
    ),
    "gemma3": (
        "gemma3",
        "gemma3_text",
        {
            "num_hidden_layers": 7,
            "num_key_value_heads": 1,
            "head_dim": 8,
            "query_pre_attn_scalar": 8,
            "sliding_window": 4,
            "sliding_window_pattern": 6,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
        },
    ),
}

LAYER_PARTS = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.qkv_proj": "attn_qkv",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.gate_up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def to_gguf_name(name, arch):
    module, suffix = name.rsplit(".", 1)
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    if module in top:
        return f"{top[module]}.{suffix}"
    _, _, layer, part = module.split(".", 3)
    if part == "post_attention_layernorm":
        g = "post_attention_norm" if arch in ("gemma2", "gemma3") else "ffn_norm"
    elif part == "pre_feedforward_layernorm":
        g = "ffn_norm"
    else:
        g = LAYER_PARTS[part]
    return f"blk.{layer}.{g}.{suffix}"


def from_gguf_name(name, arch):
    back = {}
    for k, v in LAYER_PARTS.items():
        back.setdefault(v, k)
    if arch == "phi3":
        back["ffn_up"] = "mlp.gate_up_proj"
    back["attn_norm"] = "input_layernorm"
    if arch in ("gemma2", "gemma3"):
        back["post_attention_norm"] = "post_attention_layernorm"
        back["ffn_norm"] = "pre_feedforward_layernorm"
    else:
        back["ffn_norm"] = "post_attention_layernorm"
    module, suffix = name.rsplit(".", 1)
    top = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
    if module in top:
        return f"{top[module]}.{suffix}"
    _, layer, part = module.split(".", 2)
    return f"model.layers.{layer}.{back[part]}.{suffix}"


def metadata(arch, c):
    m = {"general.architecture": arch}

    def num(k, v, dtype=mx.uint32):
        m[f"{arch}.{k}"] = mx.array(v, dtype=dtype)

    num("embedding_length", c["hidden_size"])
    num("block_count", c["num_hidden_layers"])
    num("feed_forward_length", c["intermediate_size"])
    num("attention.head_count", c["num_attention_heads"])
    num("attention.head_count_kv", c["num_key_value_heads"])
    num("attention.layer_norm_rms_epsilon", c["rms_norm_eps"], mx.float32)
    num("rope.freq_base", c["rope_theta"], mx.float32)
    num("context_length", c["max_position_embeddings"])
    num("vocab_size", c["vocab_size"])
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    num("attention.key_length", hd)
    num("attention.value_length", hd)
    if arch == "phi3":
        num("rope.dimension_count", int(hd * c["partial_rotary_factor"]))
    if arch in ("gemma2", "gemma3") and "sliding_window" in c:
        num("attention.sliding_window", c["sliding_window"])
    if arch == "gemma2":
        num("attn_logit_softcapping", c["attn_logit_softcapping"], mx.float32)
        num("final_logit_softcapping", c["final_logit_softcapping"], mx.float32)
    return m


PROMPT = [2, 17, 90, 5, 42, 42, 7, 88, 3, 64]
STEPS = 5

os.makedirs("mlx-models/tests/models/gguf", exist_ok=True)
for i, (name, (arch, model_type, overrides)) in enumerate(CASES.items()):
    config = {**COMMON, "model_type": model_type, **overrides}
    module = importlib.import_module(f"mlx_lm.models.{model_type}")
    mx.random.seed(2000 + i)
    model = module.Model(module.ModelArgs.from_dict(config))
    model.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.3, model.parameters()))
    weights = dict(tree_flatten(model.parameters()))
    if model_type == "gemma3_text":
        weights.pop("lm_head.weight")  # tied, as the real GGUF stores it
    gemma = arch.startswith("gemma")
    gguf = {}
    for k, v in weights.items():
        if gemma and k.endswith("norm.weight"):
            v = v + 1  # llama.cpp's convert_hf_to_gguf norm shift
        gguf[to_gguf_name(k, arch)] = v
    path = f"mlx-models/tests/models/gguf/{name}.gguf"
    mx.save_gguf(path, gguf, metadata(arch, config))

    loaded = mx.load(path)
    back = {}
    for k, v in loaded.items():
        if gemma and k.endswith("norm.weight"):
            v = v - 1
        back[from_gguf_name(k, arch)] = v
    model = module.Model(module.ModelArgs.from_dict(config))
    if hasattr(model, "sanitize"):
        back = model.sanitize(back)
    model.load_weights(list(back.items()), strict=True)
    mx.eval(model.parameters())

    g = Golden(f"mlx-models/tests/goldens/gguf/{name}.safetensors", __file__)
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

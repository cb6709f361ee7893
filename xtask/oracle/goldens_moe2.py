"""Tiny seeded models of the later mixture-of-experts rows (issue #32: granitemoe, minimax and
its `minimax_m2` name, ernie4_5_moe, phimoe, Klear, hunyuan, lfm2_moe, dbrx, llama4, mellum, exaone_moe, bailing_moe, afmoe, laguna), and what mlx-lm 0.32.2 makes of them.

For each row below: build mlx-lm's own model class (`mlx_lm.models.<module>.Model`), seed its
random init, cast / quantize it, save it as an HF-style directory under
mlx-models/tests/models/moe2/<name>/ (config.json + model.safetensors), load it back with
mlx_lm.utils.load_model (sanitize and the quantization predicate run as for a user), then
record:
- mlx-models/tests/goldens/moe2_<name>.safetensors (read by mlx-models/tests/moe2_goldens.rs):
  `prefill` logits for a 40-token prompt with fresh caches (top-2 of 4 experts = 80 pairs:
  SwitchGLU's sorted path), `step<i>` logits of each greedy token fed through the caches (the
  unsorted path), `full` logits of one cache-less forward; param `greedy` = the ids;
- mlx-cli/tests/goldens/cli_moe2.json (read by mlx-cli/tests/moe2_cli.rs): mlx-lm's own
  `generate_step` on the fixture (8 greedy ids, the chosen log-probabilities and each step's
  top-5 `[id, logprob, float32 bits]`), the layout of `goldens_cli_models.py`.

Run with `cargo xtask goldens moe2` (or this script with row names to redo only those).
"""

import importlib
import json
import os
import shutil
import struct
import sys
import zlib
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from golden import Golden

ATTN = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 128,
    "rope_theta": 10000.0,
    "max_position_embeddings": 512,
}

GRANITE = {
    "intermediate_size": 32,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "logits_scaling": 4.0,
    "attention_multiplier": 0.2,
    "embedding_multiplier": 6.0,
    "residual_multiplier": 0.3,
}

MINIMAX = {
    "intermediate_size": 32,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "shared_intermediate_size": 0,
    "rotary_dim": 8,
    "head_dim": 16,
}

ERNIE = {
    "intermediate_size": 48,
    "moe_num_experts": 4,
    "moe_intermediate_size": 32,
    "moe_k": 2,
    "moe_layer_interval": 1,
}

PHIMOE = {
    "intermediate_size": 32,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
}

KLEAR = {
    "intermediate_size": 48,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 1,
    "moe_intermediate_size": 32,
}

HUNYUAN = {
    "intermediate_size": 32,
    "num_experts": 4,
    "rope_scaling": {"alpha": 1000.0, "factor": 1.0, "type": "dynamic"},
}

LFM2_MOE = {
    "intermediate_size": 48,
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "norm_eps": 1e-5,
}

LLAMA4 = {
    "head_dim": 16,
    "hidden_size": 64,
    "intermediate_size": 32,
    "intermediate_size_mlp": 48,
    "max_position_embeddings": 512,
    "model_type": "llama4_text",
    "num_attention_heads": 4,
    "num_experts_per_tok": 1,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 4,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "vocab_size": 128,
}

MELLUM = {
    "intermediate_size": 48,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "head_dim": 16,
}

EXAONE_MOE = {
    "intermediate_size": 48,
    "moe_intermediate_size": 32,
    "head_dim": 16,
    "num_experts": 4,
    "num_experts_per_tok": 2,
}

BAILING = {
    "intermediate_size": 48,
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
}

AFMOE = {
    "intermediate_size": 48,
    "moe_intermediate_size": 32,
    "head_dim": 16,
    "num_experts": 4,
    "num_experts_per_tok": 2,
}

LAGUNA = {
    "intermediate_size": 48,
    "head_dim": 16,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 24,
}

MIMO = {
    "num_experts_per_tok": 2,
    "hybrid_layer_pattern": [0, 1, 1],
    "moe_layer_freq": [0, 1, 1],
    "add_swa_attention_sink_bias": True,
    "add_full_attention_sink_bias": False,
    "sliding_window_size": 8,
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "moe_intermediate_size": 16,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "n_shared_experts": 1,
    "n_routed_experts": 4,
    "routed_scaling_factor": 2.0,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "n_group": 2,
    "topk_group": 1,
    "max_position_embeddings": 512,
    "layernorm_epsilon": 1e-5,
    "rope_theta": 10000.0,
    "swa_rope_theta": 1000.0,
    "swa_num_attention_heads": 2,
    "swa_num_key_value_heads": 1,
    "head_dim": 8,
    "v_head_dim": 16,
    "swa_head_dim": 16,
    "swa_v_head_dim": 8,
    "partial_rotary_factor": 0.5,
    "attention_value_scale": 0.7,
}

ROWS = {
    # name: (module, config overrides, dtype, (group_size, bits) or None)
    "granitemoe": (
        "granitemoe",
        {**GRANITE, "attention_bias": True, "tie_word_embeddings": False},
        "float32",
        None,
    ),
    "granitemoe_q4": (
        "granitemoe",
        {**GRANITE, "attention_bias": False, "tie_word_embeddings": True},
        "float32",
        (32, 4),
    ),
    "minimax": ("minimax", {**MINIMAX, "use_qk_norm": True}, "float32", None),
    # Saved under the `minimax_m2` name mlx-lm remaps to minimax.
    "minimax_m2_q4": (
        "minimax",
        {**MINIMAX, "model_type": "minimax_m2", "tie_word_embeddings": True},
        "float32",
        (32, 4),
    ),
    "ernie4_5_moe": (
        "ernie4_5_moe",
        {
            **ERNIE,
            "num_hidden_layers": 3,
            "use_bias": True,
            "tie_word_embeddings": False,
            "moe_layer_start_index": 1,
            "moe_num_shared_experts": 1,
        },
        "float32",
        None,
    ),
    "ernie4_5_moe_q4": (
        "ernie4_5_moe",
        {
            **ERNIE,
            "use_bias": False,
            "tie_word_embeddings": True,
            "moe_layer_start_index": [0],
            "moe_layer_end_index": [1],
            "moe_gate_act": "sigmoid",
        },
        "float32",
        (32, 4),
    ),
    # SuScaledRoPE (longrope factors, long_mscale) and a wide sparsemixer band.
    "phimoe": (
        "phimoe",
        {
            **PHIMOE,
            "router_jitter_noise": 0.3,
            "max_position_embeddings": 8192,
            "original_max_position_embeddings": 512,
            "rope_scaling": {
                "type": "longrope",
                "short_factor": [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7],
                "long_factor": [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5],
                "short_mscale": 1.1,
                "long_mscale": 1.25,
            },
        },
        "float32",
        None,
    ),
    # No rope_scaling: plain nn.RoPE.
    "phimoe_q4": ("phimoe", {**PHIMOE, "router_jitter_noise": 0.01}, "float32", (32, 4)),
    "Klear": (
        "Klear",
        {
            **KLEAR,
            "num_hidden_layers": 3,
            "attention_bias": True,
            "mlp_only_layers": [1],
            "n_shared_experts": 1,
            "norm_topk_prob": True,
        },
        "float32",
        None,
    ),
    "Klear_q4": (
        "Klear",
        {
            **KLEAR,
            "attention_bias": False,
            "mlp_only_layers": [],
            "n_shared_experts": 2,
            "norm_topk_prob": False,
        },
        "float32",
        (32, 4),
    ),
    # Cross-layer attention (layers 1 and 3 reuse layer 0's and 2's keys and values), q/k
    # norms after the rope, per-layer expert widths.
    "hunyuan": (
        "hunyuan",
        {
            **HUNYUAN,
            "num_hidden_layers": 4,
            "attention_bias": False,
            "moe_topk": 2,
            "num_shared_expert": 1,
            "use_mixed_mlp_moe": True,
            "use_qk_norm": True,
            "use_cla": True,
            "cla_share_factor": 2,
            "moe_intermediate_size": [32, 48, 32, 16],
        },
        "float32",
        None,
    ),
    "hunyuan_q4": (
        "hunyuan",
        {
            **HUNYUAN,
            "attention_bias": True,
            "moe_topk": [2, 1],
            "num_shared_expert": [1, 2],
            "use_mixed_mlp_moe": True,
            "use_qk_norm": False,
            "use_cla": False,
            "cla_share_factor": 2,
        },
        "float32",
        (32, 4),
    ),
    "lfm2_moe": (
        "lfm2_moe",
        {
            **LFM2_MOE,
            "num_hidden_layers": 4,
            "norm_topk_prob": True,
            "use_expert_bias": True,
            "num_dense_layers": 1,
            "conv_bias": True,
            "conv_L_cache": 3,
            "routed_scaling_factor": 2.5,
            "layer_types": ["conv", "full_attention", "conv", "full_attention"],
        },
        "float32",
        None,
    ),
    "lfm2_moe_q4": (
        "lfm2_moe",
        {
            **LFM2_MOE,
            "num_hidden_layers": 3,
            "norm_topk_prob": False,
            "use_expert_bias": False,
            "num_dense_layers": 0,
            "conv_bias": False,
            "conv_L_cache": 4,
            "full_attn_idxs": [1],
        },
        "float32",
        (32, 4),
    ),
    # Experts as a list of MLPs run token by token; clip_qkv small enough to clip.
    "dbrx": (
        "dbrx",
        {
            "d_model": 64,
            "n_layers": 2,
            "n_heads": 4,
            "attn_config": {"kv_n_heads": 2, "clip_qkv": 2.0, "rope_theta": 10000.0},
            "ffn_config": {"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2},
        },
        "float32",
        None,
    ),
    "dbrx_q4": (
        "dbrx",
        {
            "d_model": 64,
            "n_layers": 2,
            "n_heads": 4,
            "attn_config": {"kv_n_heads": 4, "clip_qkv": 8.0, "rope_theta": 500000.0},
            "ffn_config": {"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 1},
        },
        "float32",
        (32, 4),
    ),
    # Chunks of 16 (the 40-token prompt spans three; decoding trims the chunked caches'
    # fronts), a small floor_scale so layer 3's query scaling varies with position.
    "llama4": (
        "llama4",
        {
            "text_config": {
                **LLAMA4,
                "attention_bias": False,
                "attention_chunk_size": 16,
                "interleave_moe_layer_step": 2,
                "rope_scaling": None,
                "use_qk_norm": True,
                "floor_scale": 8,
                "attn_scale": 0.1,
            }
        },
        "float32",
        None,
    ),
    "llama4_q4": (
        "llama4",
        {
            "text_config": {
                **LLAMA4,
                "attention_bias": True,
                "attention_chunk_size": 8,
                "interleave_moe_layer_step": 1,
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
                "use_qk_norm": False,
                "attn_temperature_tuning": 0,
            }
        },
        "float32",
        (32, 4),
    ),
    # A rope per layer type (llama3-scaled on the full layers), sliding window 8.
    "mellum": (
        "mellum",
        {
            **MELLUM,
            "num_hidden_layers": 3,
            "tie_word_embeddings": False,
            "norm_topk_prob": True,
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "rope_parameters": {
                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
                "full_attention": {
                    "rope_theta": 500000.0,
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
            },
        },
        "float32",
        None,
    ),
    "mellum_q4": (
        "mellum",
        {
            **MELLUM,
            "tie_word_embeddings": True,
            "norm_topk_prob": False,
            "sliding_window": 16,
            "layer_types": ["full_attention", "full_attention"],
            "rope_parameters": {"full_attention": {"rope_theta": 10000.0}},
        },
        "float32",
        (32, 4),
    ),
    # Sliding layers with rope, a global one without; two expert groups (one kept).
    "exaone_moe": (
        "exaone_moe",
        {
            **EXAONE_MOE,
            "num_hidden_layers": 4,
            "num_shared_experts": 1,
            "sliding_window": 8,
            "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
            "is_moe_layer": [False, True, True, True],
            "n_group": 2,
            "topk_group": 1,
            "tie_word_embeddings": False,
        },
        "float32",
        None,
    ),
    "exaone_moe_q4": (
        "exaone_moe",
        {
            **EXAONE_MOE,
            "num_shared_experts": 0,
            "sliding_window": 16,
            "layer_types": ["full_attention", "full_attention"],
            "is_moe_layer": [True, True],
            "norm_topk_prob": False,
            "routed_scaling_factor": 1.5,
            "tie_word_embeddings": True,
            "rope_parameters": {"rope_theta": 50000.0},
        },
        "float32",
        (32, 4),
    ),
    # Fused query_key_value, q/k norms, half rotary, sigmoid scores with the expert bias and
    # two groups, a shared expert, norm_head.
    "bailing_moe": (
        "bailing_moe",
        {
            **BAILING,
            "num_hidden_layers": 3,
            "num_shared_experts": 1,
            "norm_topk_prob": True,
            "first_k_dense_replace": 1,
            "use_qk_norm": True,
            "use_qkv_bias": True,
            "partial_rotary_factor": 0.5,
            "moe_router_enable_expert_bias": True,
            "score_function": "sigmoid",
            "n_group": 2,
            "topk_group": 1,
            "routed_scaling_factor": 2.0,
            "norm_head": True,
            "tie_word_embeddings": False,
        },
        "float32",
        None,
    ),
    "bailing_moe_q4": (
        "bailing_moe",
        {
            **BAILING,
            "num_shared_experts": 0,
            "norm_topk_prob": False,
            "first_k_dense_replace": 0,
            "use_bias": True,
            "tie_word_embeddings": True,
        },
        "float32",
        (32, 4),
    ),
    # Sandwich norms, gated attention output, rope on the sliding layers only, muP embedding
    # scale, two expert groups.
    "afmoe": (
        "afmoe",
        {
            **AFMOE,
            "num_hidden_layers": 3,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
            "num_shared_experts": 1,
            "num_dense_layers": 1,
            "sliding_window": 8,
            "n_group": 2,
            "topk_group": 1,
            "tie_word_embeddings": False,
        },
        "float32",
        None,
    ),
    "afmoe_q4": (
        "afmoe",
        {
            **AFMOE,
            "layer_types": ["full_attention", "sliding_attention"],
            "num_shared_experts": 0,
            "num_dense_layers": 0,
            "score_func": "softmax",
            "route_norm": False,
            "mup_enabled": False,
            "sliding_window": 16,
            "tie_word_embeddings": True,
        },
        "float32",
        (32, 4),
    ),
    # Per-layer head counts, per-head softplus output gates, a rope per layer type (half
    # rotary on the full layer), a soft-capped sigmoid router, scaled experts.
    "laguna": (
        "laguna",
        {
            **LAGUNA,
            "num_hidden_layers": 3,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "num_attention_heads_per_layer": [4, 2, 4],
            "mlp_layer_types": ["dense", "sparse", "sparse"],
            "sliding_window": 8,
            "gating": True,
            "moe_routed_scaling_factor": 2.0,
            "moe_router_logit_softcapping": 5.0,
            "rope_parameters": {
                "full_attention": {"rope_theta": 50000.0, "partial_rotary_factor": 0.5},
                "sliding_attention": {"rope_theta": 10000.0},
            },
            "tie_word_embeddings": False,
        },
        "float32",
        None,
    ),
    "laguna_q4": (
        "laguna",
        {
            **LAGUNA,
            "intermediate_size": 64,
            "shared_expert_intermediate_size": 32,
            "gating": False,
            "moe_router_score_func": "sqrtsoftplus",
            "tie_word_embeddings": True,
        },
        "float32",
        (32, 4),
    ),
    # Phi-2 parallel blocks over a SwitchMLP with biases (gelu_approx), float32 queries, a
    # partial rope, a LayerNorm + biased linear head.
    "phixtral": (
        "phixtral",
        {"num_vocab": 128, "model_dim": 32, "num_heads": 4, "num_layers": 2, "rotary_dim": 4,
         "num_local_experts": 4, "num_experts_per_tok": 2},
        "float32",
        None,
    ),
    "phixtral_q4": (
        "phixtral",
        {"num_vocab": 128, "model_dim": 64, "num_heads": 2, "num_layers": 2, "rotary_dim": 32,
         "num_local_experts": 3, "num_experts_per_tok": 1},
        "float32",
        (32, 4),
    ),
    # Sliding and full layers with their own heads, head sizes, rope bases and sinks; a
    # partial rope, scaled values; DeepSeek V3's router (+ 1e-20) with shared experts.
    "mimo_v2_flash": (
        "mimo_v2_flash",
        {**MIMO},
        "float32",
        None,
    ),
    "mimo_v2_flash_q4": (
        "mimo_v2_flash",
        {**MIMO, "hidden_size": 64, "moe_intermediate_size": 32, "n_shared_experts": None,
         "routed_scaling_factor": None, "n_group": 1, "add_full_attention_sink_bias": True,
         "attention_value_scale": None, "hybrid_layer_pattern": [1, 0, 1],
         "moe_layer_freq": [1, 0, 1], "head_dim": 16, "v_head_dim": 8, "swa_head_dim": 8,
         "swa_v_head_dim": 16, "partial_rotary_factor": 1.0},
        "float32",
        (32, 4),
    ),
}

MODELS = Path("mlx-models/tests/models/moe2")
GOLDENS = Path("mlx-models/tests/goldens")
CLI_GOLDEN = Path("mlx-cli/tests/goldens/cli_moe2.json")
PROMPT = [(7 * i + 3) % 128 for i in range(40)]
STEPS = 6
# The CLI golden: goldens_cli_models.py's prompt and lengths.
CLI_PROMPT = [(7 * i + 3) % 96 for i in range(40)]
MAX_TOKENS = 8
TOP = 5


def bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def build(name, module, overrides, dtype, quant):
    # Rows with a nested `text_config` (llama4) carry everything there.
    base = {} if "text_config" in overrides else ATTN
    config = {"model_type": module, **base, **overrides}
    arch = importlib.import_module(f"mlx_lm.models.{module}")
    mx.random.seed(zlib.crc32(name.encode()))  # stable per row, whatever the row order
    model = arch.Model(arch.ModelArgs.from_dict(config))
    # A wider init than the default so logits and routing are not all near zero.
    model.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.3, model.parameters()))
    model.set_dtype(getattr(mx, dtype))
    if quant is not None:
        gs, b = quant
        nn.quantize(model, group_size=gs, bits=b)
        config["quantization"] = {"group_size": gs, "bits": b}
    mx.eval(model.parameters())
    out_dir = MODELS / name
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    mx.save_safetensors(str(out_dir / "model.safetensors"), dict(tree_flatten(model.parameters())))
    with open(out_dir / "config.json", "w") as f:
        json.dump(config, f, indent=2)
    return out_dir


def logits_goldens(name, out_dir):
    model, _ = load_model(out_dir)
    g = Golden(str(GOLDENS / f"moe2_{name}.safetensors"), __file__)
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


def cli_case(out_dir):
    model, _ = load_model(out_dir)
    tokens, logprobs, tops = [], [], []
    for (tok, lp), _ in zip(
        generate_step(mx.array(CLI_PROMPT), model, max_tokens=MAX_TOKENS), range(MAX_TOKENS)
    ):
        tok = int(tok)
        tokens.append(tok)
        chosen = lp[tok].item()
        logprobs.append([chosen, bits(chosen)])
        order = mx.argsort(-lp)[:TOP].tolist()
        tops.append([[i, lp[i].item(), bits(lp[i].item())] for i in order])
    return {"prompt_ids": CLI_PROMPT, "tokens": tokens, "logprobs": logprobs, "top_logprobs": tops}


def main():
    only = sys.argv[1:]
    unknown = [n for n in only if n not in ROWS]
    assert not unknown, f"unknown rows {unknown}"
    cases = {}
    if only and CLI_GOLDEN.exists():
        cases = json.loads(CLI_GOLDEN.read_text())["cases"]
    for name, (module, overrides, dtype, quant) in ROWS.items():
        if only and name not in only:
            continue
        out_dir = build(name, module, overrides, dtype, quant)
        logits_goldens(name, out_dir)
        cases[f"moe2/{name}"] = cli_case(out_dir)
        print(f"{name}: {cases[f'moe2/{name}']['tokens']}", file=sys.stderr)
    golden = {
        "generator": f"xtask/oracle/goldens_moe2.py mlx={mx.__version__} "
        f"mlx_lm={__import__('mlx_lm').__version__}",
        "max_tokens": MAX_TOKENS,
        "top_logprobs": TOP,
        "cases": dict(sorted(cases.items())),
    }
    CLI_GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    CLI_GOLDEN.write_text(json.dumps(golden, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {CLI_GOLDEN}: {len(cases)} fixtures", file=sys.stderr)


if __name__ == "__main__":
    main()

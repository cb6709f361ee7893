"""Tiny seeded models of the MLA / DeepSeek-style family (issue #32) and mlx-lm 0.32.2's outputs.

For each row below: build mlx-lm's own model class (`mlx_lm.models.<module>.Model`), seed its
random init (normal * 0.3, so routing and logits are not all near zero), cast / quantize it,
save it as an HF-style directory under mlx-models/tests/models/mla/<name>/ (config.json +
model.safetensors), load it back with mlx_lm.utils.load_model (sanitize and the quantization
predicate run as for a user), then record:
- mlx-models/tests/goldens/mla_<name>.safetensors: `prefill` logits of the 40-token prompt
  with fresh caches (`make_prompt_cache`; 80 expert pairs, SwitchGLU's sorted path, MLA's
  prefill branch), `step<i>` for each greedy token fed alone (MLA's absorbed L == 1 branch),
  `full`: one cache-less forward over prompt + generated ids; metadata `greedy`;
- mlx-cli/tests/goldens/cli_models_mla.json: what mlx-lm's own `generate_step` yields on each
  fixture (ids, chosen log-probabilities, per-step top-5), in `goldens_cli_models.py`'s format
  (`mlx-cli/tests/models_cli.rs` reads every `cli_models*.json`).
Run with `cargo xtask goldens mla`.
"""

import importlib
import json
import os
import shutil
import sys
import zlib
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

import goldens_cli_models as cli
from golden import Golden

MLA = {
    "vocab_size": 128,
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_shared_experts": 1,
    "n_routed_experts": 8,
    "routed_scaling_factor": 2.5,
    "kv_lora_rank": 32,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "qk_nope_head_dim": 32,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "n_group": 2,
    "topk_group": 1,
    "num_experts_per_tok": 2,
    "moe_layer_freq": 1,
    "first_k_dense_replace": 1,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "attention_bias": False,
}

YARN = {
    "type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 128,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}

ROWS = {
    # name: (module, config, dtype, (group_size, bits) or None)
    "deepseek_v3": ("deepseek_v3", {**MLA}, "float32", None),
    # bf16 experts need quantized weights: mlx's CPU gather_mm is float32-only.
    "deepseek_v3_q8_bf16": (
        "deepseek_v3",
        {**MLA, "rope_scaling": YARN, "n_group": 1, "n_shared_experts": None},
        "bfloat16",
        (32, 8),
    ),
    "deepseek_v3_q4": (
        "deepseek_v3",
        {**MLA, "q_lora_rank": None, "n_group": 4, "topk_group": 2},
        "float32",
        (32, 4),
    ),
    "kimi_k25": ("kimi_k25", {"text_config": {**MLA, "model_type": "kimi_k2"}}, "float32", None),
    "kimi_k25_q4": (
        "kimi_k25",
        {"text_config": {**MLA, "model_type": "kimi_k2", "first_k_dense_replace": 0}},
        "float32",
        (32, 4),
    ),
    "glm4_moe_lite": ("glm4_moe_lite", {**MLA, "tie_word_embeddings": False}, "float32", None),
    "glm4_moe_lite_q4": (
        "glm4_moe_lite",
        {**MLA, "n_group": 1, "tie_word_embeddings": False},
        "float32",
        (32, 4),
    ),
}

DOTS1 = {
    "vocab_size": 128,
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 512,
    "first_k_dense_replace": 1,
    "moe_intermediate_size": 32,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_experts_per_tok": 2,
    "rope_theta": 10000.0,
    "routed_scaling_factor": 2.5,
    "n_group": 2,
    "topk_group": 1,
}

ROWS.update(
    {
        "dots1": ("dots1", {**DOTS1}, "float32", None),
        "dots1_q4": (
            "dots1",
            {**DOTS1, "n_group": 1, "tie_word_embeddings": True, "mlp_bias": True},
            "float32",
            (32, 4),
        ),
    }
)

DEEPSEEK = {
    "vocab_size": 128,
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "n_shared_experts": 2,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_layer_freq": 1,
    "first_k_dense_replace": 1,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
}

ROWS.update(
    {
        "deepseek": ("deepseek", {**DEEPSEEK}, "float32", None),
        "deepseek_q4": (
            "deepseek",
            {
                **DEEPSEEK,
                "attention_bias": True,
                "n_shared_experts": None,
                "rope_scaling": {"type": "linear", "factor": 2.0},
            },
            "float32",
            (32, 4),
        ),
    }
)

V2_YARN = {
    "type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 128,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
}

ROWS.update(
    {
        "deepseek_v2": (
            "deepseek_v2",
            {
                **MLA,
                "rope_scaling": V2_YARN,
                "topk_method": "group_limited_greedy",
                "n_group": 2,
                "topk_group": 1,
            },
            "float32",
            None,
        ),
        "deepseek_v2_q4": (
            "deepseek_v2",
            {
                **MLA,
                "q_lora_rank": None,
                "rope_scaling": {**V2_YARN, "mscale": 1.0, "mscale_all_dim": 0.0},
                "topk_method": "gready",
            },
            "float32",
            (32, 4),
        ),
    }
)

MINICPM3 = {
    "vocab_size": 128,
    "hidden_size": 64,
    "dim_model_base": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-5,
    "q_lora_rank": 32,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "kv_lora_rank": 32,
    "scale_depth": 1.4,
    "scale_emb": 12,
    "max_position_embeddings": 512,
    "rope_theta": 10000.0,
    "rope_scaling": {
        "type": "longrope",
        "original_max_position_embeddings": 128,
        "short_factor": [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7],
        "long_factor": [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5],
    },
}

ROWS.update(
    {
        "minicpm3": ("minicpm3", {**MINICPM3}, "float32", None),
        "minicpm3_q4": (
            "minicpm3",
            {**MINICPM3, "tie_word_embeddings": True, "rope_scaling": {"type": "longrope"}},
            "float32",
            (32, 4),
        ),
    }
)

MISTRAL4 = {
    **{k: v for k, v in MLA.items() if k not in ("rope_theta", "topk_method", "scoring_func",
                                                  "moe_layer_freq", "attention_bias")},
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "llama_4_scaling_beta": 0.1,
    },
}

ROWS.update(
    {
        "mistral4": ("mistral4", {**MISTRAL4}, "float32", None),
        "mistral4_q4": (
            "mistral4",
            {
                **MISTRAL4,
                "q_lora_rank": None,
                "n_group": 1,
                "tie_word_embeddings": True,
                "rope_interleave": False,
                "rope_parameters": {
                    "rope_theta": 10000.0,
                    "original_max_position_embeddings": 8,
                    "llama_4_scaling_beta": 0.2,
                },
            },
            "float32",
            (32, 4),
        ),
    }
)

LONGCAT = {
    "attention_method": "MLA",
    "zero_expert_type": "identity",
    "hidden_size": 64,
    "ffn_hidden_size": 96,
    "moe_topk": 2,
    "expert_ffn_hidden_size": 32,
    "n_routed_experts": 6,
    "zero_expert_num": 2,
    "num_layers": 2,
    "vocab_size": 128,
    "max_position_embeddings": 512,
    "num_attention_heads": 4,
    "kv_lora_rank": 32,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 16,
    "qk_nope_head_dim": 32,
    "v_head_dim": 32,
    "routed_scaling_factor": 2.0,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "mla_scale_q_lora": True,
    "mla_scale_kv_lora": True,
    "attention_bias": False,
}

ROWS.update(
    {
        "longcat_flash": ("longcat_flash", {**LONGCAT}, "float32", None),
        "longcat_flash_q4": (
            "longcat_flash",
            {**LONGCAT, "norm_topk_prob": True, "router_bias": True},
            "float32",
            (32, 4),
        ),
    }
)

# n-gram embeddings over longcat_flash's layers: 2 hashes of 2- and 3-grams (emb_dim 16).
ROWS.update(
    {
        "longcat_flash_ngram": (
            "longcat_flash_ngram",
            {**LONGCAT, "ngram_vocab_size_ratio": 3, "emb_neighbor_num": 3, "emb_split_num": 2},
            "float32",
            None,
        ),
        "longcat_flash_ngram_q4": (
            "longcat_flash_ngram",
            {**LONGCAT, "ngram_vocab_size_ratio": 2, "emb_neighbor_num": 2, "emb_split_num": 2,
             "norm_topk_prob": True},
            "float32",
            (32, 4),
        ),
    }
)

# index_topk 24 < the 40-token prompt: the sparse paths (prompt mask, gathered latent) run.
V32 = {**MLA, "index_head_dim": 32, "index_n_heads": 4, "index_topk": 24}

ROWS.update(
    {
        "deepseek_v32": ("deepseek_v32", {**V32}, "float32", None),
        "deepseek_v32_q4": (
            "deepseek_v32",
            {**V32, "n_group": 1, "indexer_rope_interleave": True},
            "float32",
            (32, 4),
        ),
        "glm_moe_dsa": (
            "glm_moe_dsa",
            {
                **{k: v for k, v in V32.items() if k not in ("rope_theta",)},
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            },
            "float32",
            None,
        ),
    }
)

GLM4_MOE = {
    **{k: v for k, v in DOTS1.items()},
    "head_dim": 16,
    "use_qk_norm": True,
    "tie_word_embeddings": False,
    "attention_bias": True,
    "partial_rotary_factor": 0.5,
    "rope_scaling": None,
}

YOUTU = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "qk_nope_head_dim": 32,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
}

ROWS.update(
    {
        # kimi_vl: deepseek_v3's text model under its own TextArgs (vision weights dropped).
        "kimi_vl": ("kimi_vl", {"text_config": {**MLA}}, "float32", None),
        "kimi_vl_q4": (
            "kimi_vl",
            {"text_config": {**MLA, "n_group": 1, "q_lora_rank": None}},
            "float32",
            (32, 4),
        ),
        "glm4_moe": ("glm4_moe", {**GLM4_MOE}, "float32", None),
        "glm4_moe_q4": (
            "glm4_moe",
            {**GLM4_MOE, "n_group": 1, "use_qk_norm": False, "attention_bias": False,
             "partial_rotary_factor": 1.0, "n_shared_experts": None},
            "float32",
            (32, 4),
        ),
        # solar_open: glm4_moe's Model under solar_open's ModelArgs (no attention bias, no
        # q/k norms, one expert group and no rope_scaling by default); the 4-bit row sets them.
        "solar_open": (
            "solar_open",
            {k: v for k, v in GLM4_MOE.items()
             if k not in ("use_qk_norm", "attention_bias", "n_group", "topk_group",
                          "rope_scaling")},
            "float32",
            None,
        ),
        "solar_open_q4": (
            "solar_open",
            {**GLM4_MOE, "use_qk_norm": True, "attention_bias": True, "n_group": 2,
             "topk_group": 1, "tie_word_embeddings": True},
            "float32",
            (32, 4),
        ),
        "youtu_llm": ("youtu_llm", {**YOUTU}, "float32", None),
        "youtu_llm_q4": (
            "youtu_llm",
            {**YOUTU, "q_lora_rank": None, "tie_word_embeddings": False, "attention_bias": True,
             "mlp_bias": True, "rope_traditional": False,
             "rope_scaling": {"type": "yarn", "factor": 4.0,
                              "original_max_position_embeddings": 128, "beta_fast": 32,
                              "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}},
            "float32",
            (32, 4),
        ),
    }
)

PROMPT = [(7 * i + 3) % 128 for i in range(40)]
STEPS = 6
MODELS = Path("mlx-models/tests/models")
CLI_GOLDEN = Path("mlx-cli/tests/goldens/cli_models_mla.json")


def make(name, module, overrides, dtype, quant):
    config = {"model_type": module, **overrides}
    arch = importlib.import_module(f"mlx_lm.models.{module}")
    mx.random.seed(zlib.crc32(name.encode()))  # stable per row, whatever the row order
    model = arch.Model(arch.ModelArgs.from_dict(config))
    model.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.3, model.parameters()))
    model.set_dtype(getattr(mx, dtype))
    if quant is not None:
        gs, bits = quant
        nn.quantize(model, group_size=gs, bits=bits)
        config["quantization"] = {"group_size": gs, "bits": bits}
    mx.eval(model.parameters())
    out_dir = MODELS / "mla" / name
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    mx.save_safetensors(str(out_dir / "model.safetensors"), dict(tree_flatten(model.parameters())))
    with open(out_dir / "config.json", "w") as f:
        json.dump(config, f, indent=2)
    return out_dir


def logits_goldens(name, out_dir):
    model, _ = load_model(out_dir)
    g = Golden(f"mlx-models/tests/goldens/mla_{name}.safetensors", __file__)
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


def main():
    only = set(sys.argv[1:])
    cases = {}
    if CLI_GOLDEN.exists():
        cases = json.loads(CLI_GOLDEN.read_text())["cases"]
    for name, (module, overrides, dtype, quant) in ROWS.items():
        if only and name not in only:
            continue
        out_dir = make(name, module, overrides, dtype, quant)
        logits_goldens(name, out_dir)
        cases[f"mla/{name}"] = cli.run(f"mla/{name}")
        print(f"{name}: {cases[f'mla/{name}']['tokens']}", file=sys.stderr)
    cases = {k: cases[k] for k in sorted(cases) if k[len("mla/"):] in ROWS}
    golden = {
        "generator": f"xtask/oracle/goldens_mla.py mlx={mx.__version__} "
                     f"mlx_lm={__import__('mlx_lm').__version__}",
        "max_tokens": cli.MAX_TOKENS,
        "top_logprobs": cli.TOP,
        "cases": cases,
    }
    CLI_GOLDEN.write_text(json.dumps(golden, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {CLI_GOLDEN}: {len(cases)} fixtures", file=sys.stderr)


if __name__ == "__main__":
    main()

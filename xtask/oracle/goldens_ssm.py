"""Tiny seeded state-space models (issue #32's SSM family) and mlx-lm 0.32.2's outputs on them.

For each row of ROWS: build mlx-lm's own model class (`mlx_lm.models.<module>.Model`), seed its
random init (normal * 0.3), cast it to the row's dtype, quantize it with mlx-lm's own
`quantize_model` (what `mlx_lm.convert -q` runs; its predicate skips layers whose input width
is not a multiple of the group size) where the row asks, save it as an HF-style directory under
mlx-models/tests/models/ssm/<name>/ (config.json + model.safetensors), load it back with
`mlx_lm.utils.load_model` (sanitize and the quantization predicate run as for a user), then
record:
- mlx-models/tests/goldens/ssm/<name>.safetensors: `prefill` (the 40-token prompt through
  fresh caches), `step<i>` (each greedy token fed one at a time), `chunk<i>` / `chunkstep<i>`
  (the prompt in chunks of 16, 16, 8 with the cache state evaluated after each chunk, as
  generate_step does, then the same greedy tokens), `full` (one cache-less forward over prompt
  + greedy tokens); param `greedy` = the ids;
- mlx-cli/tests/goldens/cli_ssm.json: what mlx-lm's own `generate_step` yields on the fixture
  (8 greedy ids, the chosen log-probabilities and each step's top-5, float32 bit patterns
  too), for `mlx generate --top-logprobs 5 --json` (`mlx-cli/tests/ssm_cli.rs`).

Run with `cargo xtask goldens ssm` (or `python xtask/oracle/goldens_ssm.py [ROW ...]` from the
repository root in the oracle venv to regenerate some rows only).
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
from mlx.utils import tree_flatten, tree_map
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model, quantize_model

from golden import Golden

BASE = {"hidden_size": 32, "vocab_size": 128}

MAMBA = {
    **BASE,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "state_size": 8,
    "conv_kernel": 4,
    "use_bias": False,
    "use_conv_bias": True,
    "time_step_rank": "auto",
    "tie_word_embeddings": True,
}

MAMBA2 = {
    **BASE,
    "num_hidden_layers": 2,
    "num_heads": 4,
    "head_dim": 16,
    "intermediate_size": 64,
    "state_size": 8,
    "layer_norm_epsilon": 1e-5,
    "conv_kernel": 4,
    "n_groups": 2,
    "use_bias": False,
    "use_conv_bias": True,
    "tie_word_embeddings": True,
    "time_step_limit": [0.001, 100.0],
    "time_step_rank": "auto",
}

NEMOTRON_H = {
    **BASE,
    "intermediate_size": 48,
    "max_position_embeddings": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "attention_bias": False,
    "mamba_num_heads": 4,
    "mamba_head_dim": 16,
    "mamba_proj_bias": False,
    "ssm_state_size": 8,
    "conv_kernel": 4,
    "n_groups": 2,
    "mlp_bias": False,
    "layer_norm_epsilon": 1e-5,
    "use_bias": False,
    "use_conv_bias": True,
    "hybrid_override_pattern": "M*M-",
    "time_step_limit": [0.0, 50.0],
}

NEMOTRON_H_MOE = {
    **NEMOTRON_H,
    "hybrid_override_pattern": "ME*E",
    "moe_intermediate_size": 24,
    "moe_shared_expert_intermediate_size": 40,
    "moe_latent_size": 16,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "n_group": 2,
    "topk_group": 1,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
}

GRANITE = {
    **BASE,
    "intermediate_size": 32,
    "num_hidden_layers": 3,
    "max_position_embeddings": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "attention_bias": False,
    "embedding_multiplier": 2.0,
    "attention_multiplier": 0.125,
    "logits_scaling": 4.0,
    "residual_multiplier": 0.5,
    "layer_types": ["mamba", "attention", "mamba"],
    "rms_norm_eps": 1e-5,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "shared_intermediate_size": 48,
    "mamba_n_heads": 4,
    "mamba_d_head": 16,
    "mamba_proj_bias": False,
    "mamba_d_state": 8,
    "mamba_d_conv": 4,
    "mamba_n_groups": 2,
    "mamba_conv_bias": True,
    "rope_theta": 10000.0,
}

FALCON_H1 = {
    **BASE,
    "num_hidden_layers": 2,
    "intermediate_size": 48,
    "head_dim": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "mamba_n_heads": 4,
    "mamba_d_head": 16,
    "mamba_d_ssm": 64,
    "mamba_d_state": 8,
    "mamba_n_groups": 2,
    "mamba_d_conv": 4,
    "max_position_embeddings": 512,
    "rope_theta": 10000.0,
}

JAMBA = {
    **BASE,
    "intermediate_size": 48,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "attn_layer_offset": 1,
    "attn_layer_period": 2,
    "expert_layer_offset": 1,
    "expert_layer_period": 2,
    "mamba_d_conv": 4,
    "mamba_d_state": 8,
    "mamba_expand": 2,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 512,
}

BAICHUAN_M1 = {
    **BASE,
    "intermediate_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rope_theta": 10000.0,
    "sliding_window": 8,
    "sliding_window_layers": [1],
    "conv_window": 2,
    "rms_norm_eps": 1e-6,
}

OLMO_HYBRID = {
    **BASE,
    "intermediate_size": 48,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 512,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "linear_allow_neg_eigval": True,
    "tie_word_embeddings": True,
    "attention_bias": False,
}

ROWS = {
    # name: (module, model_type, config, dtype, (group_size, bits) or None)
    "mamba": ("mamba", "mamba", MAMBA, "float32", None),
    "mamba_q4": (
        "mamba",
        "mamba",
        {**MAMBA, "use_bias": True, "use_conv_bias": False, "time_step_rank": 4,
         "tie_word_embeddings": False},
        "float32",
        (32, 4),
    ),
    # falcon_mamba: mlx-lm remaps it to mamba, whose args then turn on the B/C/dt RMS norms.
    "falcon_mamba_bf16": (
        "mamba",
        "falcon_mamba",
        {**MAMBA, "num_hidden_layers": 3, "mixer_rms_eps": 1e-5},
        "bfloat16",
        None,
    ),
    "mamba2": ("mamba2", "mamba2", MAMBA2, "float32", None),
    "mamba2_q4": (
        "mamba2",
        "mamba2",
        {**MAMBA2, "n_groups": 1, "use_bias": True, "tie_word_embeddings": False},
        "float32",
        (32, 4),
    ),
    "mamba2_bf16": (
        "mamba2",
        "mamba2",
        {**MAMBA2, "n_groups": 4, "use_conv_bias": False, "time_step_limit": [0.0, 5.0]},
        "bfloat16",
        None,
    ),
    "nemotron_h": ("nemotron_h", "nemotron_h", NEMOTRON_H, "float32", None),
    "nemotron_h_q4": (
        "nemotron_h",
        "nemotron_h",
        {**NEMOTRON_H, "hybrid_override_pattern": None,
         "layers_block_type": ["mamba", "mlp", "attention", "mamba"],
         "attention_bias": True, "mlp_bias": True, "mamba_proj_bias": True, "n_groups": 1},
        "float32",
        (32, 4),
    ),
    "nemotron_h_bf16": (
        "nemotron_h",
        "nemotron_h",
        {**NEMOTRON_H, "hybrid_override_pattern": "*M-M", "n_groups": 4, "head_dim": 16,
         "use_conv_bias": False},
        "bfloat16",
        None,
    ),
    # Mixture-of-experts (`E`) blocks: grouped sigmoid routing with the correction bias, the
    # latent projections and shared experts (f32: gather_mm is float32-only on the CPU); then
    # one group, no latent, no shared experts, 4-bit experts.
    "nemotron_h_moe": ("nemotron_h", "nemotron_h", NEMOTRON_H_MOE, "float32", None),
    "nemotron_h_moe_q4": (
        "nemotron_h",
        "nemotron_h",
        {**NEMOTRON_H_MOE, "hybrid_override_pattern": "E*ME", "moe_latent_size": None,
         "n_shared_experts": None, "n_group": 1, "topk_group": None, "norm_topk_prob": False,
         "moe_intermediate_size": 32},
        "float32",
        (32, 4),
    ),
    "granitemoehybrid": ("granitemoehybrid", "granitemoehybrid", GRANITE, "float32", None),
    # The router is quantized 8-bit in groups of 64 (mlx-lm's quant_predicate): hidden 64.
    "granitemoehybrid_q4": (
        "granitemoehybrid",
        "granitemoehybrid",
        {**GRANITE, "hidden_size": 64, "tie_word_embeddings": False, "mamba_n_groups": 1,
         "mamba_proj_bias": True, "attention_bias": True,
         "layer_types": ["attention", "mamba", "mamba"]},
        "float32",
        (32, 4),
    ),
    # Dense MLPs (gather_mm is float32-only on the CPU), no rope.
    "granitemoehybrid_bf16": (
        "granitemoehybrid",
        "granitemoehybrid",
        {**GRANITE, "num_local_experts": None, "num_experts_per_tok": None,
         "shared_intermediate_size": None, "position_embedding_type": "nope",
         "mlp_bias": True, "mamba_n_groups": 4},
        "bfloat16",
        None,
    ),
    "falcon_h1": ("falcon_h1", "falcon_h1", FALCON_H1, "float32", None),
    "falcon_h1_q4": (
        "falcon_h1",
        "falcon_h1",
        {**FALCON_H1, "mamba_rms_norm": True, "tie_word_embeddings": False,
         "attention_bias": True, "mlp_bias": True, "projectors_bias": True},
        "float32",
        (32, 4),
    ),
    "falcon_h1_bf16": (
        "falcon_h1",
        "falcon_h1",
        {**FALCON_H1, "mamba_rms_norm": True, "mamba_norm_before_gate": True,
         "mamba_n_groups": 1, "mamba_proj_bias": True, "tie_word_embeddings": False},
        "bfloat16",
        None,
    ),
    "jamba": ("jamba", "jamba", JAMBA, "float32", None),
    # Dense MLPs: mlx-lm quantizes the router 8-bit in groups of 64, and gather_mm is
    # float32-only on the CPU (bf16).
    "jamba_q4": (
        "jamba",
        "jamba",
        {**JAMBA, "num_experts": 1, "tie_word_embeddings": False, "mamba_proj_bias": True,
         "mamba_dt_rank": 4, "layers_block_type": ["attention", "mamba", "mamba"],
         "num_hidden_layers": 3},
        "float32",
        (32, 4),
    ),
    "jamba_bf16": (
        "jamba",
        "jamba",
        {**JAMBA, "num_experts": 1, "mamba_conv_bias": False},
        "bfloat16",
        None,
    ),
    # The 40-token prompt wraps the sliding layers' rotating caches (window 8).
    "baichuan_m1": ("baichuan_m1", "baichuan_m1", BAICHUAN_M1, "float32", None),
    "baichuan_m1_q4": ("baichuan_m1", "baichuan_m1", BAICHUAN_M1, "float32", (32, 4)),
    "baichuan_m1_bf16": (
        "baichuan_m1",
        "baichuan_m1",
        {**BAICHUAN_M1, "sliding_window_layers": [0, 2], "num_swa_attention_heads": 2,
         "num_swa_key_value_heads": 1},
        "bfloat16",
        None,
    ),
    "olmo_hybrid": ("olmo_hybrid", "olmo_hybrid", OLMO_HYBRID, "float32", None),
    "olmo_hybrid_q4": (
        "olmo_hybrid",
        "olmo_hybrid",
        {**OLMO_HYBRID, "tie_word_embeddings": False, "linear_allow_neg_eigval": False,
         "layer_types": ["full_attention", "linear_attention", "linear_attention"],
         "num_hidden_layers": 3, "attention_bias": True},
        "float32",
        (32, 4),
    ),
    "olmo_hybrid_bf16": (
        "olmo_hybrid",
        "olmo_hybrid",
        {**OLMO_HYBRID, "rope_theta": None, "linear_num_key_heads": 4},
        "bfloat16",
        None,
    ),
}

# Rows saved as Hugging Face checkpoints are: conv weights (C, 1, K), so that mlx-lm's
# falcon_h1 `sanitize` folds its muP multipliers into the weights at load.
HF_LAYOUT = {"falcon_h1", "falcon_h1_bf16"}

MODELS = Path("mlx-models/tests/models/ssm")
GOLDENS = Path("mlx-models/tests/goldens/ssm")
CLI_GOLDEN = Path("mlx-cli/tests/goldens/cli_ssm.json")
PROMPT = [(7 * i + 3) % 128 for i in range(40)]
STEPS = 6
CHUNKS = [16, 16, 8]
CLI_PROMPT = [(7 * i + 3) % 96 for i in range(40)]
CLI_MAX_TOKENS = 8
TOP = 5


def bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def write_fixture(name):
    module, model_type, overrides, dtype, quant = ROWS[name]
    config = {"model_type": model_type, **overrides}
    arch = importlib.import_module(f"mlx_lm.models.{module}")
    mx.random.seed(zlib.crc32(name.encode()))  # stable per row, whatever the row order
    model = arch.Model(arch.ModelArgs.from_dict(config))
    model.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.3, model.parameters()))
    model.set_dtype(getattr(mx, dtype))
    if quant is not None:
        gs, bits_ = quant
        model, config = quantize_model(model, config, gs, bits_)
    mx.eval(model.parameters())
    out_dir = MODELS / name
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    weights = dict(tree_flatten(model.parameters()))
    if name in HF_LAYOUT:
        weights = {k: v.transpose(0, 2, 1) if "conv1d.weight" in k else v
                   for k, v in weights.items()}
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights)
    with open(out_dir / "config.json", "w") as f:
        json.dump(config, f, indent=2)


def logits_goldens(name):
    model, _ = load_model(MODELS / name)
    g = Golden(str(GOLDENS / f"{name}.safetensors"), __file__)
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
    cache = make_prompt_cache(model)
    start = 0
    for c, n in enumerate(CHUNKS):
        ids = mx.array([PROMPT[start : start + n]], dtype=mx.int32)
        logits = model(ids, cache=cache)
        mx.eval([c.state for c in cache])
        g.case(f"chunk{c}", "forward", [ids], logits)
        start += n
    assert start == len(PROMPT)
    for s, t in enumerate(greedy):
        ids = mx.array([[t]], dtype=mx.int32)
        g.case(f"chunkstep{s}", "forward", [ids], model(ids, cache=cache))
    full_ids = mx.array([PROMPT + greedy], dtype=mx.int32)
    g.case("full", "forward_nocache", [full_ids], model(full_ids))
    g.meta["greedy"] = ",".join(map(str, greedy))
    g.save()


def cli_case(name):
    model, _ = load_model(MODELS / name)
    tokens, logprobs, tops = [], [], []
    steps = generate_step(mx.array(CLI_PROMPT), model, max_tokens=CLI_MAX_TOKENS)
    for (tok, lp), _ in zip(steps, range(CLI_MAX_TOKENS)):
        tok = int(tok)
        tokens.append(tok)
        chosen = lp[tok].item()
        logprobs.append([chosen, bits(chosen)])
        order = mx.argsort(-lp)[:TOP].tolist()
        tops.append([[i, lp[i].item(), bits(lp[i].item())] for i in order])
    return {"prompt_ids": CLI_PROMPT, "tokens": tokens, "logprobs": logprobs,
            "top_logprobs": tops}


def main():
    names = sys.argv[1:] or list(ROWS)
    unknown = [n for n in names if n not in ROWS]
    assert not unknown, f"unknown rows {unknown}; rows: {list(ROWS)}"
    golden = {}
    if CLI_GOLDEN.exists():
        golden = json.loads(CLI_GOLDEN.read_text())
    cases = {k: v for k, v in golden.get("cases", {}).items() if k in ROWS}
    for name in names:
        write_fixture(name)
        logits_goldens(name)
        cases[name] = cli_case(name)
        print(f"{name}: {cases[name]['tokens']}", file=sys.stderr)
    golden = {
        "generator": f"xtask/oracle/goldens_ssm.py mlx={mx.__version__} "
                     f"mlx_lm={__import__('mlx_lm').__version__}",
        "fixture_dir": "ssm",
        "max_tokens": CLI_MAX_TOKENS,
        "top_logprobs": TOP,
        "cases": {k: cases[k] for k in ROWS if k in cases},
    }
    CLI_GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    CLI_GOLDEN.write_text(json.dumps(golden, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {CLI_GOLDEN}: {len(golden['cases'])} fixtures", file=sys.stderr)


if __name__ == "__main__":
    main()

"""mlx-lm 0.32.2's own tensor-parallel run of a tiny llama, the L1 reference for `mlx launch`.

Runs this script under `mlx.launch -n 2 --backend ring` (MLX's launcher, from the oracle
venv); each rank loads mlx-cli/tests/models/dense_f32 (the seeded llama of
goldens_llama.py: 4 heads, 2 KV heads, 2 layers) with mlx_lm.utils.sharded_load, which
shards it with the llama Model's own shard() over the world group. Rank 0 then writes
mlx-models/tests/goldens/dist_llama_tp2.safetensors with:
- `prompt`: the prompt ids; `prefill`: the sharded model's logits for the prompt (fresh cache);
- `greedy`: 8 greedy ids from generate_step, `logprobs`: their per-step log-probability rows;
- `single_prefill`: the same prompt's logits from the unsharded model (plain `load`), to show
  how far the sharded numerics are from one process (all_sum reorders the sums).
Run with `cargo xtask goldens dist` (or this file directly in the oracle venv).
"""

import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx

ROOT = Path(__file__).resolve().parents[2]
# (fixture under mlx-cli/tests/models, golden under mlx-models/tests/goldens)
MODELS = [
    ("dense_f32", "dist_llama_tp2"),
    ("qwen3", "dist_qwen3_tp2"),
    ("q4_g32", "dist_llama_q4_tp2"),
    # The MLA family (goldens_mla.py's seeded fixtures, relative to mlx-cli/tests/models; they
    # have no tokenizer, which sharded_load needs: see `staged`).
    ("../../../mlx-models/tests/models/mla/deepseek_v3", "dist_deepseek_v3_tp2"),
    ("../../../mlx-models/tests/models/mla/kimi_k25", "dist_kimi_k25_tp2"),
    ("../../../mlx-models/tests/models/mla/deepseek_v32", "dist_deepseek_v32_tp2"),
    ("../../../mlx-models/tests/models/mla/deepseek_v2", "dist_deepseek_v2_tp2"),
    ("../../../mlx-models/tests/models/mla/glm4_moe_lite", "dist_glm4_moe_lite_tp2"),
    ("../../../mlx-models/tests/models/mla/mistral4", "dist_mistral4_tp2"),
    ("../../../mlx-models/tests/models/qwen3_moe", "dist_qwen3_moe_tp2"),
    # Later rows with `shard()`: mistral (llama.py through MODEL_REMAPPING), ministral3,
    # gpt_oss (sinks split, experts' down bias / N), minimax (ShardedRMSNorm q/k norms),
    # exaone_moe (dense and MoE layers, shared experts in place).
    ("../../../mlx-models/tests/models/mistral_bias_llama3rope", "dist_mistral_tp2"),
    ("../../../mlx-models/tests/models/dense/ministral3", "dist_ministral3_tp2"),
    ("../../../mlx-models/tests/models/gpt_oss", "dist_gpt_oss_tp2"),
    ("../../../mlx-models/tests/models/moe2/minimax", "dist_minimax_tp2"),
    ("../../../mlx-models/tests/models/moe2/exaone_moe", "dist_exaone_moe_tp2"),
    # glm_moe_dsa's Model subclasses deepseek_v32's (shard() and pipeline() with it).
    ("../../../mlx-models/tests/models/mla/glm_moe_dsa", "dist_glm_moe_dsa_tp2"),
    # longcat_flash: two MLA attentions and two MLPs per layer, identity experts after the sum.
    ("../../../mlx-models/tests/models/mla/longcat_flash", "dist_longcat_flash_tp2"),
    # qwen3_5: Gated DeltaNet layers split by heads (the convolution and in_proj_qkv by
    # segments q | k | v), gated attention, the block summing; qwen3_5_moe (its Model
    # subclasses qwen3_5's): experts and the gated shared expert in place, the untied head
    # by vocabulary (all-gathered along the last axis).
    ("../../../mlx-models/tests/models/qwen3_5", "dist_qwen3_5_tp2"),
    ("../../../mlx-models/tests/models/qwen3_5_moe", "dist_qwen3_5_moe_tp2"),
    # glm4_moe: llama's attention split (q/k/v biases, per-head q/k norms), MoE as deepseek_v3.
    ("../../../mlx-models/tests/models/mla/glm4_moe", "dist_glm4_moe_tp2"),
    # longcat_flash_ngram: longcat_flash's shard(), the n-gram embeddings whole.
    ("../../../mlx-models/tests/models/mla/longcat_flash_ngram", "dist_longcat_flash_ngram_tp2"),
    # iquestloopcoder: llama's split plus each layer's loop gate by heads.
    ("../../../mlx-models/tests/models/dense2/iquestloopcoder", "dist_iquestloopcoder_tp2"),
    # step3p5 (FIXTURES below: head counts that divide by 2 on every layer, sliding ones too):
    # heads split with the head-wise gate, dense MLP as llama's, the MoE block's experts and
    # shared expert in place with one sum.
    ("../../../mlx-models/tests/models/dist/step3p5", "dist_step3p5_tp2"),
    # minimax_m3_vl: llama's split plus the sparse layers' index queries by heads; experts and
    # shared experts in place, one sum.
    ("../../../mlx-models/tests/models/dense2/minimax_m3_vl", "dist_minimax_m3_vl_tp2"),
    # kimi_k3: KDA layers split by heads (qkv_proj and its convolution by q | k | v segments),
    # NoPE MLA layers as deepseek_v3's with the output gate, experts and shared experts in
    # place, the latent projections whole.
    ("../../../mlx-models/tests/models/dense2/kimi_k3", "dist_kimi_k3_tp2"),
    # deepseek_v41: q_b_proj by heads, whole output groups per rank (o_a_proj in place),
    # sinks by heads, experts and shared experts in place.
    ("../../../mlx-models/tests/models/dense2/deepseek_v41", "dist_deepseek_v41_tp2"),
    # solar_open: glm4_moe's Model (its shard() and pipeline) under solar_open's arguments.
    ("../../../mlx-models/tests/models/mla/solar_open", "dist_solar_open_tp2"),
]
# Pipeline rows beyond qwen2_f32 (relative to mlx-cli/tests/models; `staged` writes the
# weight index sharded_load's pipeline path reads).
PIPELINES = [
    ("../../../mlx-models/tests/models/dense/ministral3", "dist_ministral3_pp2"),
    ("../../../mlx-models/tests/models/qwen3_moe", "dist_qwen3_moe_pp2"),
    ("../../../mlx-models/tests/models/mla/deepseek_v3", "dist_deepseek_v3_pp2"),
    ("../../../mlx-models/tests/models/mla/deepseek_v32", "dist_deepseek_v32_pp2"),
    ("../../../mlx-models/tests/models/mla/glm_moe_dsa", "dist_glm_moe_dsa_pp2"),
    ("../../../mlx-models/tests/models/mla/deepseek_v2", "dist_deepseek_v2_pp2"),
    ("../../../mlx-models/tests/models/mla/glm4_moe_lite", "dist_glm4_moe_lite_pp2"),
    ("../../../mlx-models/tests/models/mla/mistral4", "dist_mistral4_pp2"),
    # Gated DeltaNet layers between attention layers (masks per stage).
    ("../../../mlx-models/tests/models/qwen3_next", "dist_qwen3_next_pp2"),
    ("../../../mlx-models/tests/models/qwen3_5", "dist_qwen3_5_pp2"),
    ("../../../mlx-models/tests/models/mla/glm4_moe", "dist_glm4_moe_pp2"),
    # minimax_m3_vl's 3 layers split [2, 1] (each layer's cache a CacheList).
    ("../../../mlx-models/tests/models/dense2/minimax_m3_vl", "dist_minimax_m3_vl_pp2"),
    # bailing_hybrid's own split by layer groups (FIXTURES: 5 layers in groups of 2, so
    # [3, 2]: the tail layer on rank 0, an MLA layer on every rank for the linear layers'
    # offset).
    ("../../../mlx-models/tests/models/dist/bailing_hybrid", "dist_bailing_hybrid_pp2"),
    # kimi_k3: 4 layers split [2, 2]; the attention-residual blocks so far travel with the
    # hidden state.
    ("../../../mlx-models/tests/models/dense2/kimi_k3", "dist_kimi_k3_pp2"),
    ("../../../mlx-models/tests/models/dense2/prism_hadamard_qwen35", "dist_prism_hadamard_qwen35_pp2"),
    # deepseek_v41: 4 layers split [2, 2]; the hyper-connection streams, pre_mix and the
    # shared compressed KV / index keys / candidates / top-k indices packed in one message.
    ("../../../mlx-models/tests/models/dense2/deepseek_v41", "dist_deepseek_v41_pp2"),
    ("../../../mlx-models/tests/models/mla/solar_open", "dist_solar_open_pp2"),
    # qwen3_5_moe is left out: mlx-lm 0.32.2's own pipeline run of it loses rank 1 during
    # generate_step on this fixture (no reference to hold ours to).
]
# `DIST_ONLY=name,name` regenerates only those goldens (the others are left as they are).
ONLY = [n for n in os.environ.get("DIST_ONLY", "").split(",") if n]


def wanted(out):
    return not ONLY or out in ONLY
PROMPT = [1, 5, 9, 17, 33, 65, 7, 3]
STEPS = 8


# The pipeline case: a seeded 3-layer qwen2 (mlx-lm's qwen2 Model has `pipeline`), split
# unevenly over 2 ranks by `sharded_load(pipeline_group=...)` (mlx-lm's `--pipeline`).
QWEN2 = ROOT / "mlx-cli/tests/models/qwen2_f32"
QWEN2_CONFIG = {
    "model_type": "qwen2",
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "vocab_size": 128,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}


def make_qwen2():
    """Writes the seeded qwen2 fixture (config, weights, dense_f32's tokenizer)."""
    import json
    import shutil

    from mlx.utils import tree_flatten, tree_map
    from mlx_lm.models import qwen2

    QWEN2.mkdir(parents=True, exist_ok=True)
    mx.random.seed(20261203)
    model = qwen2.Model(qwen2.ModelArgs.from_dict(QWEN2_CONFIG))
    # Larger-than-default weights so the logits spread (greedy ids vary).
    model.update(
        tree_map(lambda p: p * 4 if p.ndim == 2 else p, model.parameters())
    )
    mx.eval(model.parameters())
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(QWEN2 / "model.safetensors"), weights)
    # sharded_load's pipeline path reads the index to pick each stage's files.
    index = {"metadata": {}, "weight_map": {k: "model.safetensors" for k in sorted(weights)}}
    (QWEN2 / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (QWEN2 / "config.json").write_text(json.dumps(QWEN2_CONFIG, indent=2))
    src = ROOT / "mlx-cli/tests/models/dense_f32"
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / f, QWEN2 / f)


# Seeded fixtures of our own (mlx-models/tests/models/dist/<name>), built by mlx-lm's model
# classes as goldens_dense2.py builds its rows (normal * 0.3 init, float32) where the dense2
# fixtures cannot be sharded by mlx-lm: step3p5's has one KV head on its sliding layers (its
# shard() cannot split it), bailing_hybrid's 3 layers in groups of 2 leave rank 1 no layer
# group under its pipeline().
FIXTURES = {
    "step3p5": {
        "model_type": "step3p5",
        "hidden_size": 32,
        "num_hidden_layers": 3,
        "intermediate_size": 64,
        "rms_norm_eps": 1e-5,
        "vocab_size": 96,
        "num_attention_heads": 4,
        "num_attention_groups": 2,
        "head_dim": 8,
        "sliding_window": 6,
        "rope_theta": [10000.0, 5000.0, 10000.0],
        "partial_rotary_factors": [0.5, 1.0, 0.5],
        "attention_other_setting": {"num_attention_heads": 8, "num_attention_groups": 4},
        "moe_num_experts": 4,
        "moe_top_k": 2,
        "moe_intermediate_size": 16,
        "share_expert_dim": 32,
        "moe_router_scaling_factor": 2.0,
        "swiglu_limits": [None, 0.5, None],
        "swiglu_limits_shared": [0.7, None, 0.4],
    },
    "bailing_hybrid": {
        "model_type": "bailing_hybrid",
        "hidden_size": 32,
        "num_hidden_layers": 5,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-5,
        "vocab_size": 96,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "num_shared_experts": 1,
        "n_group": 2,
        "topk_group": 1,
        "first_k_dense_replace": 1,
        "layer_group_size": 2,
        "group_norm_size": 2,
        "rope_theta": 10000.0,
        "max_position_embeddings": 512,
        "routed_scaling_factor": 2.0,
        "head_dim": 8,
        "kv_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "v_head_dim": 8,
        "q_lora_rank": 16,
        "moe_intermediate_size": 16,
        "use_qkv_bias": True,
    },
}


def make_fixture(i, name):
    """Writes FIXTURES[name] to mlx-models/tests/models/dist/<name> (config + weights)."""
    import importlib
    import json
    import shutil

    from mlx.utils import tree_flatten, tree_map

    config = FIXTURES[name]
    out = ROOT / "mlx-models/tests/models/dist" / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    mx.random.seed(3500 + i)
    model = arch.Model(arch.ModelArgs.from_dict(json.loads(json.dumps(config))))
    model.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.3, model.parameters()))
    mx.eval(model.parameters())
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (out / "config.json").write_text(json.dumps(config, indent=2))


def staged(model, force=False):
    """The directory sharded_load reads for `model`: the fixture itself, or (a fixture without
    a tokenizer) target/goldens_dist/<name> with links to its config and weights and
    dense_f32's tokenizer (the ids are all the goldens use)."""
    import shutil

    src = (ROOT / "mlx-cli/tests/models" / model).resolve()
    if (src / "tokenizer.json").exists() and not force:
        return src
    dst = ROOT / "target/goldens_dist" / src.name
    if os.environ.get("MLX_RANK") is None:
        import json

        dst.mkdir(parents=True, exist_ok=True)
        for f in ("config.json", "model.safetensors"):
            (dst / f).unlink(missing_ok=True)
            (dst / f).symlink_to(src / f)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(ROOT / "mlx-cli/tests/models/dense_f32" / f, dst / f)
        index = src / "model.safetensors.index.json"
        (dst / index.name).unlink(missing_ok=True)
        if index.exists():
            (dst / index.name).symlink_to(index)
        else:
            names = sorted(mx.load(str(src / "model.safetensors")).keys())
            weight_map = {k: "model.safetensors" for k in names}
            (dst / index.name).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst


def worker():
    for model, out in MODELS:
        if wanted(out):
            run_model(staged(model), ROOT / f"mlx-models/tests/goldens/{out}.safetensors")
    if wanted("dist_qwen2_pp2"):
        out = ROOT / "mlx-models/tests/goldens/dist_qwen2_pp2.safetensors"
        run_model(QWEN2, out, pipeline=True)
    for model, out in PIPELINES:
        if wanted(out):
            path = ROOT / f"mlx-models/tests/goldens/{out}.safetensors"
            run_model(staged(model, force=True), path, pipeline=True)


# Rows whose greedy ids come from a plain loop over the sharded model (`model(y, cache)`,
# argmax, evaluated each step) instead of generate_step: mlx-lm 0.32.2's generate_step over
# deepseek_v41's pipeline loses a message (rank 1 finishes while rank 0 still waits for a
# stage message), though the sharded model itself runs.
PLAIN_GREEDY = {"dist_deepseek_v41_pp2"}


def run_model(MODEL, OUT, pipeline=False):
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load, sharded_load

    group = mx.distributed.init(strict=True, backend="ring")
    if pipeline:
        model, _tok = sharded_load(str(MODEL), pipeline_group=group)
    else:
        model, _tok = sharded_load(str(MODEL))
    prompt = mx.array(PROMPT)
    cache = make_prompt_cache(model)
    prefill = model(prompt[None], cache=cache)[0].astype(mx.float32)
    mx.eval(prefill)
    ids, rows = [], []
    if OUT.stem in PLAIN_GREEDY:
        logits = prefill[-1:]
        for _ in range(STEPS):
            logprobs = logits[-1] - mx.logsumexp(logits[-1], keepdims=True)
            tok = mx.argmax(logits[-1])
            mx.eval(tok, logprobs)
            ids.append(int(tok))
            rows.append(logprobs)
            logits = model(mx.array([[int(tok)]]), cache=cache)[0].astype(mx.float32)
            mx.eval(logits)
    else:
        for (tok, logprobs), _ in zip(
            generate_step(prompt, model, max_tokens=STEPS), range(STEPS)
        ):
            ids.append(int(tok))
            rows.append(logprobs.astype(mx.float32))
    mx.eval(prefill, rows)
    if group.rank() == 0:
        single, _ = load(str(MODEL))
        single_prefill = single(prompt[None])[0].astype(mx.float32)
        out = {
            "prompt": mx.array(PROMPT, dtype=mx.int32),
            "prefill": prefill,
            "greedy": mx.array(ids, dtype=mx.int32),
            "logprobs": mx.stack(rows),
            "single_prefill": single_prefill,
        }
        mx.save_safetensors(
            str(OUT),
            out,
            metadata={
                "world_size": str(group.size()),
                "backend": "ring",
                "model": MODEL.name,
                "sharding": "pipeline" if pipeline else "tensor",
            },
        )
        same = bool(mx.array_equal(prefill, single_prefill))
        diff = float(mx.abs(prefill - single_prefill).max())
        print(f"wrote {OUT} (greedy {ids}; sharded == single: {same}, max |diff| {diff:g})")


def main():
    if os.environ.get("MLX_RANK") is not None:
        worker()
        return
    if wanted("dist_qwen2_pp2"):
        make_qwen2()
    for i, name in enumerate(FIXTURES):
        if any(wanted(out) and f"/dist/{name}" in m for m, out in MODELS + PIPELINES):
            make_fixture(i, name)
    for model, _ in MODELS:
        staged(model)
    for model, _ in PIPELINES:
        staged(model, force=True)
    launcher = Path(sys.executable).parent / "mlx.launch"
    subprocess.run(
        [str(launcher), "-n", "2", "--backend", "ring", "--python", sys.executable, __file__],
        check=True,
        env={**os.environ, "MLX_DEVICE": "cpu"},
    )


if __name__ == "__main__":
    main()

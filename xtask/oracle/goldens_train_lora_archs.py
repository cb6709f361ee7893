"""LoRA / DoRA beyond the descriptor table: mlx-lm 0.32.2's own `linear_to_lora_layers` on
the tiny mlx-models fixtures of the dedicated ports, the L1 reference for
`mlx_train::lora` there.

Writes mlx-train/tests/goldens/train_lora_archs.safetensors (and the adapter directories of
`ADAPTED` below). Per case (`<fixture>[_dora]`):
the fixture loaded with `mlx_lm.utils.load_model`, `mx.random.seed(SEED)`, `model.freeze()`
and `linear_to_lora_layers(model, num_layers, LORA)` as `mlx_lm.lora.train_model` runs them
(default keys: every linear of a layer), then `nn.value_and_grad(model, default_loss)` in
training mode on a fixed batch. Outputs: loss, token count, the adapter arrays right after
the conversion (the seeded init), and every adapter gradient; `names` is the sorted
trainable parameter names (mlx-lm's module paths). The MoE fixtures' experts become
`LoRASwitchLinear`; one case trains DoRA on a MoE model with `keys` leaving the experts out.
Run with `cargo xtask goldens train_lora_archs`.
"""

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.tuner.trainer import default_loss
from mlx_lm.tuner.utils import linear_to_lora_layers, load_adapters
from mlx_lm.utils import load_model

from golden import Golden

SEED = 7
LORA = {"rank": 4, "scale": 10.0, "dropout": 0.0}
# (case, fixture, num_layers, dora). lfm2 ends conv, attention; qwen3_5 ends linear
# attention, full attention: two layers adapt both kinds.
CASES = [
    ("lfm2", "lfm2", 2, False),
    ("lfm2_bf16", "lfm2_bf16", 2, False),
    ("lfm2_dora", "lfm2", 2, True),
    ("qwen3_5", "qwen3_5", 2, False),
    ("qwen3_5_bf16", "qwen3_5_bf16", 2, False),
    ("qwen3_5_dora", "qwen3_5", 2, True),
    # gemma4_text: the last two layers share an earlier layer's keys and values (no
    # k_proj/v_proj), so four layers reach the ones that own them; bf16 has per-layer
    # inputs, kv_eq has `attention_k_eq_v` (no v_proj).
    ("gemma4_text_bf16", "gemma4_text_bf16", 4, False),
    ("gemma4_text_kv_eq", "gemma4_text_kv_eq", 4, False),
    ("gemma4_text_kv_eq_dora", "gemma4_text_kv_eq", 3, True),
    # MoE: the experts' SwitchLinear / QuantizedSwitchLinear become LoRASwitchLinear.
    ("mixtral", "mixtral", 2, False),
    ("qwen2_moe", "qwen2_moe", 2, False),
    ("qwen3_moe", "qwen3_moe", 2, False),
    ("qwen3_moe_q4", "qwen3_moe_q4", 2, False),
    ("olmoe", "olmoe", 2, False),
    ("gpt_oss", "gpt_oss", 2, False),
    ("qwen3_next", "qwen3_next", 3, False),
    ("qwen3_5_moe", "qwen3_5_moe", 2, False),
    ("gemma4_text", "gemma4_text", 4, False),
    # Descriptor rows whose layers are not `model.layers` (the adapter names follow).
    ("gpt2", "dense/gpt2", 1, False),
    ("gpt_neox", "dense/gpt_neox", 1, False),
]
# Cases whose adapters are then given random `lora_b` (seeded) and saved as mlx_lm.lora
# saves them (adapters/lora_archs_<case>/: adapters.safetensors, adapter_config.json); case
# `<case>_adapted` holds the adapted model's logits (eval mode), which mlx-lm's own
# `load_adapters` reproduces from that directory; `<case>_fused` the logits after
# mlx_lm.fuse's fusing step.
ADAPTED = ["lfm2_dora", "qwen3_5", "gemma4_text", "qwen3_moe_q4", "gpt_oss", "qwen3_next",
           "dense_untied_lm_head", "q4_untied_lm_head_dora", "dense_untied_embed",
           "tied_embed_dora", "q4_tied_embed"]

# (case, fixture, num_layers, dora, keys): DoRA on a MoE model's plain linears, the experts
# left out by `keys` (mlx-lm refuses DoRA on switch layers); `lm_head` named by `keys`, which
# mlx-lm's `linear_to_lora_layers` converts after the layers (on a dense, a 4-bit and a MoE
# model with untied heads).
KEYED = [
    ("qwen3_moe_keys_dora", "qwen3_moe", 2, True,
     ["self_attn.q_proj", "self_attn.o_proj", "mlp.gate"]),
    ("dense_untied_lm_head", "dense_bf16_untied", 1, False,
     ["self_attn.q_proj", "mlp.down_proj", "lm_head"]),
    ("q4_untied_lm_head_dora", "q4_g64_untied", 2, True, ["self_attn.v_proj", "lm_head"]),
    ("olmoe_lm_head", "olmoe", 1, False, ["self_attn.q_proj", "lm_head"]),
    # `model.embed_tokens` becomes LoRAEmbedding / DoRAEmbedding: its lookups and, tied, its
    # use as the head (`as_linear`); after `lm_head` in `named_modules` order.
    ("dense_untied_embed", "dense_bf16_untied", 1, False,
     ["self_attn.q_proj", "lm_head", "model.embed_tokens"]),
    ("tied_embed_dora", "dense_f32", 1, True, ["self_attn.k_proj", "model.embed_tokens"]),
    ("q4_tied_embed", "q4_g32", 1, False, ["model.embed_tokens"]),
    ("lfm2_embed", "lfm2", 1, False, ["model.embed_tokens"]),
]


def main():
    g = Golden("mlx-train/tests/goldens/train_lora_archs.safetensors", __file__)
    batch = mx.array([[3, 17, 40, 9, 88, 5, 61, 23, 12], [7, 2, 55, 31, 80, 14, 6, 47, 29]], mx.int32)
    lengths = mx.array([[0, 8], [2, 6]], mx.int32)
    cases = [(c, f, n, d, None) for c, f, n, d in CASES] + KEYED
    for case, fixture, num_layers, dora, keys in cases:
        model, _ = load_model(Path(f"mlx-models/tests/models/{fixture}"))
        mx.random.seed(SEED)
        model.freeze()
        config = dict(LORA)
        extra = {}
        if keys is not None:
            config["keys"] = keys
            extra["keys"] = keys
        linear_to_lora_layers(model, num_layers, config, use_dora=dora)
        init = dict(tree_flatten(model.trainable_parameters()))
        names = sorted(init)
        model.train()
        (loss, ntoks), grads = nn.value_and_grad(model, default_loss)(model, batch, lengths)
        flat = dict(tree_flatten(grads))
        g.case(case, "value_and_grad", [batch, lengths],
               [loss, ntoks] + [init[k] for k in names] + [flat[k] for k in names],
               names=names, num_layers=num_layers, dora=dora, seed=SEED, fixture=fixture,
               **LORA, **extra)
        if case in ADAPTED:
            adapted(g, case, fixture, model, num_layers, dora, config, batch)
    g.save()


def adapted(g, case, fixture, model, num_layers, dora, config, batch):
    mx.random.seed(SEED + 1)
    b = [(k, 0.05 * mx.random.normal(v.shape)) for k, v in
         tree_flatten(model.trainable_parameters()) if k.endswith(".lora_b")]
    model.update(tree_unflatten(b))
    model.eval()
    logits = model(batch)
    out = Path(f"mlx-train/tests/adapters/lora_archs_{case}")
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "adapters.safetensors"),
                        dict(tree_flatten(model.trainable_parameters())))
    with open(out / "adapter_config.json", "w") as f:
        json.dump({"fine_tune_type": "dora" if dora else "lora", "num_layers": num_layers,
                   "lora_parameters": config}, f, indent=4)
    fresh, _ = load_model(Path(f"mlx-models/tests/models/{fixture}"))
    load_adapters(fresh, str(out))
    fresh.eval()
    assert mx.array_equal(fresh(batch), logits).item(), case
    g.case(f"{case}_adapted", "adapted_logits", [batch], [logits], fixture=fixture)
    # mlx_lm.fuse's step (its `main` needs a tokenizer): every module with `fuse` replaced by
    # its fused layer (LoRASwitchLinear's included), then the fused model's logits.
    fused = [(n, m.fuse(dequantize=False)) for n, m in fresh.named_modules() if hasattr(m, "fuse")]
    fresh.update_modules(tree_unflatten(fused))
    g.case(f"{case}_fused", "fused_logits", [batch], [fresh(batch)], fixture=fixture)


if __name__ == "__main__":
    main()

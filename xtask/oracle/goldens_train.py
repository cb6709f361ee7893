"""mlx-lm 0.32.2's tuner on tiny seeded models: the L1 reference for mlx-train.

Writes under mlx-train/tests/:
- models/<name>/: a tiny llama (`dense`, `q4`), Gemma 3 (`gemma3`), Qwen3 MoE (`moe`) or
  Qwen3-Next hybrid (`hybrid`) (config.json,
  model.safetensors) with a byte-level BPE tokenizer trained here (tokenizer.json, tokenizer_config.json with a ChatML template);
- data/<format>/{train,valid}.jsonl: `text`, `prompt`/`completion` and `messages` data;
- goldens/train_<run>.safetensors, one per run below, made by mlx-lm's own entry points
  (`mlx_lm.utils.load`, `tuner.datasets.load_dataset`, `mlx_lm.lora.train_model`, which
  runs `linear_to_lora_layers`, builds the optimizer and schedule and calls `tuner.train`):
  - `init`: every adapter parameter right after `linear_to_lora_layers` (seeded) and the
    `resume_adapter_file`, if any;
  - `batches`: the first training batches `iterate_batches` yields (numpy's global seed);
  - `report`: the training loss of every step and the validation losses (callback values);
  - `final`: `adapters.safetensors` after training (compiled steps, as mlx_lm.lora);
  - `grad`: `nn.value_and_grad(model, default_loss)` at the trained weights on batch 0;
  - `logits`: the adapted model's logits (mlx_lm.utils.load with adapter_path) and the
    fused model's logits (mlx_lm.fuse's fuse + save, loaded back); `fused_weights`;
  - `dequantized` (quantized bases): `mlx_lm.fuse --dequantize`'s logits and weights;
  plus adapters/<run>/ (adapters.safetensors, adapter_config.json) as mlx_lm.lora wrote it.
  The `full_*` runs fine-tune whole layers (`--fine-tune-type full`); `init` is then the
  trainable arrays after `freeze` + `unfreeze`, and on the 4-bit base a quantized linear's
  own arrays stay frozen (`frozen_quantized`).
- goldens/train_{dpo,orpo}.safetensors: DPO and ORPO (the reference below, over MLX and
  mlx-lm's LoRA layers): loss, token count and every adapter gradient for three Adam steps
  on preference batches (`prompt`/`chosen`/`rejected`), and the adapters after them.
- goldens/train_misc.safetensors: numpy's legacy permutations, clip_grad_norm, schedules.
- goldens/train_full_archs.safetensors: full fine-tuning's trainable names and gradients on
  the last layer of other architectures' fixtures (`FULL_ARCHS`), and the arrays after two
  Adam steps.
Run with `cargo xtask goldens train`.
"""

import contextlib
import importlib
import json
import os
import shutil
import types
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map, tree_unflatten
from mlx_lm import lora as lora_cli
from mlx_lm.models import llama
from mlx_lm.tuner.datasets import CacheDataset, load_dataset
from mlx_lm.tuner.trainer import TrainingCallback, default_loss, iterate_batches
from mlx_lm.utils import dequantize_model, load, save

from golden import Golden

ROOT = "mlx-train/tests"

CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

WORDS = (
    "the cat sat on a mat and a dog ran to the red ball while birds sang "
    "over green hills near small rivers where fish swim fast"
).split()


def sentence(rng, n):
    return " ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), n))


def make_tokenizer(out_dir, corpus):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    tok.save(f"{out_dir}/tokenizer.json")
    with open(f"{out_dir}/tokenizer_config.json", "w") as f:
        json.dump(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "chat_template": CHAT_TEMPLATE,
            },
            f,
            indent=2,
        )
    return tok.get_vocab_size()


def write_data(rng):
    sets = {}
    for split, n in (("train", 8), ("valid", 4)):
        sets.setdefault("text", {})[split] = [
            {"text": sentence(rng, int(rng.integers(4, 30)))} for _ in range(n)
        ]
        sets.setdefault("completions", {})[split] = [
            {
                "prompt": sentence(rng, int(rng.integers(2, 8))),
                "completion": sentence(rng, int(rng.integers(3, 12))),
            }
            for _ in range(n)
        ]
        chat = []
        for i in range(n):
            row = {
                "messages": [
                    {"role": "system", "content": sentence(rng, 3)},
                    {"role": "user", "content": sentence(rng, int(rng.integers(2, 8)))},
                    {"role": "assistant", "content": sentence(rng, int(rng.integers(3, 10)))},
                ]
            }
            if i % 3 == 1:
                row["tools"] = [
                    {
                        "type": "function",
                        "function": {
                            "name": "get_" + WORDS[i],
                            "description": sentence(rng, 4),
                            "parameters": {"type": "object", "properties": {}},
                        },
                    }
                ]
            chat.append(row)
        sets.setdefault("chat", {})[split] = chat
        sets.setdefault("preference", {})[split] = [
            {
                "prompt": sentence(rng, int(rng.integers(2, 6))),
                "chosen": sentence(rng, int(rng.integers(2, 9))),
                "rejected": sentence(rng, int(rng.integers(2, 9))),
            }
            for _ in range(n)
        ]
    corpus = []
    for fmt, splits in sets.items():
        d = f"{ROOT}/data/{fmt}"
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        for split, rows in splits.items():
            with open(f"{d}/{split}.jsonl", "w") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
            for r in rows:
                corpus += [v for v in r.values() if isinstance(v, str)]
                corpus += [m["content"] for m in r.get("messages", [])]
    return corpus


# A tiny Gemma 3 (the architecture of Gemma 3 270M): `1 + weight` norms, per-head QK norms,
# a sliding window shorter than the data's sequences on the first layer, tied embeddings.
GEMMA3 = {
    "model_type": "gemma3_text",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "query_pre_attn_scalar": 8,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "sliding_window": 16,
    "sliding_window_pattern": 2,
}

# A mixture of experts (the experts' SwitchLinear become LoRASwitchLinear) and a recurrent
# hybrid (gated delta layers, a full-attention layer, experts), both with tied embeddings.
QWEN3_MOE = {
    "model_type": "qwen3_moe",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "intermediate_size": 64,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [1],
    "moe_intermediate_size": 16,
    "head_dim": 8,
    "tie_word_embeddings": True,
    "max_position_embeddings": 512,
    "norm_topk_prob": True,
}
QWEN3_NEXT = {
    "model_type": "qwen3_next",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "full_attention_interval": 2,
    "intermediate_size": 64,
    "head_dim": 8,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "shared_expert_intermediate_size": 16,
    "moe_intermediate_size": 16,
    "partial_rotary_factor": 0.5,
    "norm_topk_prob": True,
}


def make_model(name, vocab, seed, quant, arch=None):
    config = {
        "model_type": "llama",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
    }
    module = llama
    if arch is not None:
        config = {**arch, "vocab_size": vocab}
        module = importlib.import_module(f"mlx_lm.models.{arch['model_type']}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    model.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.3, model.parameters()))
    if quant is not None:
        gs, bits = quant
        nn.quantize(model, group_size=gs, bits=bits)
        config["quantization"] = {"group_size": gs, "bits": bits}
    mx.eval(model.parameters())
    d = f"{ROOT}/models/{name}"
    for f in ("config.json", "model.safetensors"):
        if os.path.exists(f"{d}/{f}"):
            os.remove(f"{d}/{f}")
    weights = dict(tree_flatten(model.parameters()))
    if arch is not None:
        weights.pop("lm_head.weight", None)  # tied, as Gemma 3 270M
    mx.save_safetensors(f"{d}/model.safetensors", weights)
    with open(f"{d}/config.json", "w") as f:
        json.dump(config, f, indent=2)


class Recorder(TrainingCallback):
    def __init__(self):
        self.train, self.val = [], []

    def on_train_loss_report(self, info):
        self.train.append(info["train_loss"])

    def on_val_loss_report(self, info):
        self.val.append(info["val_loss"])


# (model, data, overrides of mlx_lm.lora's CONFIG_DEFAULTS)
RUNS = {
    "dense_text_adam": (
        "dense",
        "text",
        {"num_layers": 1, "batch_size": 2, "iters": 6, "learning_rate": 1e-2,
         "lora_parameters": {"rank": 4, "dropout": 0.0, "scale": 10.0},
         "steps_per_eval": 4, "val_batches": 2},
    ),
    "q4_completions_mask_adamw_cosine_accum": (
        "q4",
        "completions",
        {"num_layers": -1, "batch_size": 2, "iters": 6, "learning_rate": 2e-2,
         "mask_prompt": True, "optimizer": "adamw",
         "optimizer_config": {"adamw": {"weight_decay": 0.05}},
         "lr_schedule": {"name": "cosine_decay", "arguments": [2e-2, 6, 1e-3], "warmup": 2},
         "grad_accumulation_steps": 2, "seed": 7,
         "lora_parameters": {"rank": 8, "dropout": 0.0, "scale": 20.0},
         "steps_per_eval": 100, "val_batches": -1},
    ),
    "dense_chat_sgd_keys": (
        "dense",
        "chat",
        {"num_layers": 2, "batch_size": 4, "iters": 5, "learning_rate": 5e-2,
         "optimizer": "sgd", "optimizer_config": {"sgd": {"momentum": 0.9, "weight_decay": 0.01}},
         "max_seq_length": 40, "seed": 3,
         "lora_parameters": {"rank": 2, "dropout": 0.0, "scale": 5.0,
                             "keys": ["self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"]},
         "steps_per_eval": 100, "val_batches": 1},
    ),
    "dense_chat_dora_mask": (
        "dense",
        "chat",
        {"fine_tune_type": "dora", "num_layers": 2, "batch_size": 2, "iters": 4,
         "learning_rate": 1e-2, "mask_prompt": True, "seed": 11,
         "lora_parameters": {"rank": 4, "dropout": 0.0, "scale": 8.0},
         "steps_per_eval": 100, "val_batches": 1},
    ),
    # Full fine-tuning: every array of the last `num_layers` layers trains.
    "full_dense_text_adam": (
        "dense",
        "text",
        {"fine_tune_type": "full", "num_layers": 1, "batch_size": 2, "iters": 5,
         "learning_rate": 1e-3, "steps_per_eval": 4, "val_batches": 2, "seed": 2},
    ),
    # Resumes from the run above's adapters.safetensors (layer 1 only) with both layers
    # trainable, AdamW, masked prompts.
    "full_dense_chat_adamw_resume": (
        "dense",
        "chat",
        {"fine_tune_type": "full", "num_layers": 2, "batch_size": 2, "iters": 3,
         "learning_rate": 5e-3, "optimizer": "adamw",
         "optimizer_config": {"adamw": {"weight_decay": 0.02}}, "mask_prompt": True,
         "resume_adapter_file": f"{ROOT}/adapters/full_dense_text_adam/adapters.safetensors",
         "seed": 4, "steps_per_eval": 100, "val_batches": 1},
    ),
    # Gemma 3: both layers (sliding and global) train in full, AdamW, masked prompts.
    "full_gemma3_chat_adamw": (
        "gemma3",
        "chat",
        {"fine_tune_type": "full", "num_layers": 2, "batch_size": 2, "iters": 4,
         "learning_rate": 5e-3, "optimizer": "adamw", "mask_prompt": True, "seed": 8,
         "steps_per_eval": 2, "val_batches": 1},
    ),
    # LoRA on a mixture of experts: the experts train through LoRASwitchLinear.
    "moe_text_adam": (
        "moe",
        "text",
        {"num_layers": 2, "batch_size": 2, "iters": 4, "learning_rate": 1e-2, "seed": 12,
         "lora_parameters": {"rank": 4, "dropout": 0.0, "scale": 10.0},
         "steps_per_eval": 2, "val_batches": 1},
    ),
    # DoRA on the hybrid's plain linears (the experts left out by `keys`), with gradient
    # checkpointing and masked prompts: the gated delta layer and the attention layer.
    "hybrid_chat_dora_ckpt": (
        "hybrid",
        "chat",
        {"fine_tune_type": "dora", "num_layers": -1, "batch_size": 2, "iters": 4,
         "learning_rate": 5e-3, "optimizer": "adamw", "mask_prompt": True,
         "grad_checkpoint": True, "seed": 13,
         "lora_parameters": {"rank": 4, "dropout": 0.0, "scale": 8.0,
                             "keys": ["self_attn.q_proj", "self_attn.o_proj",
                                      "linear_attn.in_proj_qkvz", "linear_attn.out_proj",
                                      "mlp.shared_expert.down_proj"]},
         "steps_per_eval": 100, "val_batches": 1},
    ),
    # A 4-bit base: only the norms train (see `frozen_quantized`).
    "full_q4_completions_adamw_accum": (
        "q4",
        "completions",
        {"fine_tune_type": "full", "num_layers": -1, "batch_size": 2, "iters": 4,
         "learning_rate": 2e-2, "optimizer": "adamw", "grad_accumulation_steps": 2,
         "mask_prompt": True, "seed": 6, "steps_per_eval": 100, "val_batches": -1},
    ),
}


@contextlib.contextmanager
def frozen_quantized(on):
    """On mlx 0.32.4 a layer's `unfreeze()` unfreezes the packed arrays of the
    `QuantizedLinear`s inside it too, so mlx_lm.lora's full fine-tuning of a quantized base
    fails at the first step (`[QuantizedMatmul::vjp] no gradient wrt the quantized weights`).
    mlx-train keeps a quantized linear's own arrays frozen instead; this reference does the
    same by re-freezing them after every `unfreeze` (what mlx's sharded quantized layers do
    for themselves), and is otherwise mlx-lm's tuner unchanged."""
    if not on:
        yield
        return
    original = nn.Module.unfreeze

    def refreeze(_, m):
        if isinstance(m, nn.QuantizedLinear):
            m.freeze(recurse=False)

    def unfreeze(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.apply_to_modules(refreeze)
        return self

    nn.Module.unfreeze = unfreeze
    try:
        yield
    finally:
        nn.Module.unfreeze = original

LOGIT_IDS = [3, 50, 7, 99, 120, 4, 8]
N_BATCHES = 3


def run(name, model_name, data, overrides, script=__file__):
    g = Golden(f"{ROOT}/goldens/train_{name}.safetensors", script)
    adapter_dir = f"{ROOT}/adapters/{name}"
    shutil.rmtree(adapter_dir, ignore_errors=True)
    defaults = json.loads(json.dumps(lora_cli.CONFIG_DEFAULTS))
    args = types.SimpleNamespace(
        **{
            **defaults,
            **overrides,
            "model": f"{ROOT}/models/{model_name}",
            "data": f"{ROOT}/data/{data}",
            "train": True,
            "adapter_path": adapter_dir,
            "steps_per_report": 1,
            "save_every": 1000,
        }
    )
    # mlx_lm.lora's `run`, step by step, recording along the way.
    np.random.seed(args.seed)
    model, tokenizer = load(args.model)
    train_set, valid_set, _ = load_dataset(args, tokenizer)

    # The batches train() will draw (numpy's global state restored afterwards).
    state = np.random.get_state()
    it = iterate_batches(CacheDataset(train_set), args.batch_size, args.max_seq_length, loop=True)
    batches = [next(it) for _ in range(N_BATCHES)]
    np.random.set_state(state)
    for i, (b, l) in enumerate(batches):
        g.case(f"batch{i}", "iterate_batches", [], [b, l])

    full = args.fine_tune_type == "full"
    with frozen_quantized(full):
        run_tuner(g, args, model, train_set, valid_set, batches, adapter_dir, name, full)


def run_tuner(g, args, model, train_set, valid_set, batches, adapter_dir, name, full):
    # Record the init: run linear_to_lora_layers (or a full run's freeze and unfreeze) exactly
    # as train_model will, on a copy. train_model seeds mx.random itself; snapshot what it
    # will create.
    probe, _ = load(args.model)
    mx.random.seed(args.seed)
    probe.freeze()
    from mlx_lm.tuner.utils import linear_to_lora_layers

    if full:
        for layer in probe.layers[-max(args.num_layers, 0):]:
            layer.unfreeze()
    else:
        linear_to_lora_layers(
            probe, args.num_layers, args.lora_parameters,
            use_dora=(args.fine_tune_type == "dora"),
        )
    if args.resume_adapter_file is not None:
        probe.load_weights(args.resume_adapter_file, strict=False)
    init = dict(tree_flatten(probe.trainable_parameters()))
    names = sorted(init)
    g.case("init", "linear_to_lora_layers", [], [init[k] for k in names], names=names)

    rec = Recorder()
    lora_cli.train_model(args, model, train_set, valid_set, rec)
    final = mx.load(f"{adapter_dir}/adapters.safetensors")
    assert sorted(final) == names, (sorted(final), names)
    g.case("final", "train", [], [final[k] for k in names], names=names)
    g.case(
        "report", "train_callbacks", [],
        [mx.array(rec.train, mx.float32), mx.array(rec.val, mx.float32)],
    )

    # Loss and every adapter gradient at the trained weights, on batch 0.
    model.train()
    loss_and_grad = nn.value_and_grad(model, default_loss)
    (loss, ntoks), grads = loss_and_grad(model, *batches[0])
    grads = dict(tree_flatten(grads))
    g.case("grad", "value_and_grad", [], [loss, ntoks] + [grads[k] for k in names], names=names)

    # Adapter applied by mlx-lm's loader, and fused as mlx_lm.fuse does.
    ids = mx.array([LOGIT_IDS], mx.int32)
    adapted, tok2, config = load(args.model, adapter_path=adapter_dir, return_config=True)
    adapted_logits = adapted(ids)
    fused = [(n, m.fuse(dequantize=False)) for n, m in adapted.named_modules() if hasattr(m, "fuse")]
    if fused:
        adapted.update_modules(tree_unflatten(fused))
    fused_dir = f"/tmp/mlx_train_fused_{name}"
    shutil.rmtree(fused_dir, ignore_errors=True)
    save(Path(fused_dir), args.model, adapted, tok2, config, donate_model=False)
    fused_model, _ = load(fused_dir)
    g.case("logits", "forward", [ids], [adapted_logits, fused_model(ids)])
    fw = dict(tree_flatten(fused_model.parameters()))
    fnames = sorted(fw)
    g.case("fused_weights", "fuse", [], [fw[k] for k in fnames], names=fnames)
    shutil.rmtree(fused_dir, ignore_errors=True)
    if "quantization" in config:
        # mlx_lm.fuse --dequantize: fused linears dense, then dequantize_model.
        deq, _ = load(args.model, adapter_path=adapter_dir)
        fused = [(n, m.fuse(dequantize=True)) for n, m in deq.named_modules() if hasattr(m, "fuse")]
        if fused:
            deq.update_modules(tree_unflatten(fused))
        deq = dequantize_model(deq)
        dw = dict(tree_flatten(deq.parameters()))
        dn = sorted(dw)
        g.case("dequantized", "fuse_dequantize", [ids], [deq(ids)] + [dw[k] for k in dn], names=dn)
    g.save()


# DPO and ORPO: mlx-lm has none, so this is the reference, written over MLX with mlx-lm's
# LoRA layers; mlx-train's objectives port it op for op.
def seq_logps(model, batch, lengths):
    inputs, targets = batch[:, :-1], batch[:, 1:]
    logits = model(inputs)
    steps = mx.arange(1, targets.shape[1] + 1)
    mask = mx.logical_and(steps >= lengths[:, 0:1], steps <= lengths[:, 1:])
    ce = nn.losses.cross_entropy(logits, targets) * mask
    return -ce.astype(mx.float32).sum(axis=1), mask.sum(axis=1)


def dpo_loss(model, batch, lengths, ref_logps, beta):
    logps, ntoks = seq_logps(model, batch, lengths)
    n = logps.shape[0] // 2
    pc, pr = logps[:n], logps[n:]
    rc, rr = ref_logps[:n], ref_logps[n:]
    logits = (pc - pr) - (rc - rr)
    loss = mx.mean(mx.logaddexp(0.0, -beta * logits))
    return loss, ntoks.sum()


def orpo_loss(model, batch, lengths, beta):
    logps, ntoks = seq_logps(model, batch, lengths)
    n = logps.shape[0] // 2
    pc, pr = logps[:n], logps[n:]
    nc, nr = ntoks[:n], ntoks[n:]
    nll = -pc.sum() / nc.sum()
    ac, ar = pc / nc, pr / nr
    log_odds = (ac - ar) - (mx.log1p(-mx.exp(ac)) - mx.log1p(-mx.exp(ar)))
    ratio = -mx.logaddexp(0.0, -log_odds)
    loss = nll - beta * mx.mean(ratio)
    return loss, ntoks.sum()


def pad(rows, max_seq_length=2048):
    # iterate_batches' padding, chosen rows then rejected rows.
    lengths = [len(t) for t, _ in rows]
    width = min(1 + 32 * ((max(lengths) + 31) // 32), max_seq_length)
    arr = np.zeros((len(rows), width), np.int32)
    lens = []
    for j, (t, off) in enumerate(rows):
        n = min(len(t), max_seq_length)
        arr[j, :n] = t[:n]
        lens.append((off, n))
    return mx.array(arr), mx.array(lens)


def preference():
    model_dir = f"{ROOT}/models/dense"
    _, tokenizer = load(model_dir)
    rows = [json.loads(l) for l in open(f"{ROOT}/data/preference/train.jsonl")]

    def encode(r, key):
        msgs = [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r[key]}]
        toks = tokenizer.apply_chat_template(msgs, return_dict=False)
        off = len(tokenizer.apply_chat_template(msgs[:1], add_generation_prompt=True, return_dict=False))
        return toks, off

    pairs = [(encode(r, "chosen"), encode(r, "rejected")) for r in rows]
    batches = [pad([c for c, _ in pairs[i:i + 2]] + [r for _, r in pairs[i:i + 2]]) for i in (0, 2, 4)]
    for objective, beta in (("dpo", 0.1), ("orpo", 0.25)):
        g = Golden(f"{ROOT}/goldens/train_{objective}.safetensors", __file__)
        base, _ = load(model_dir)
        model, _ = load(model_dir)
        mx.random.seed(5)
        model.freeze()
        from mlx_lm.tuner.utils import linear_to_lora_layers

        linear_to_lora_layers(model, 2, {"rank": 4, "dropout": 0.0, "scale": 10.0})
        opt = optim.Adam(learning_rate=1e-2)
        for i, (b, l) in enumerate(batches):
            if objective == "dpo":
                ref = mx.stop_gradient(seq_logps(base, b, l)[0])
                fn = lambda m, b, l: dpo_loss(m, b, l, ref, beta)
            else:
                fn = lambda m, b, l: orpo_loss(m, b, l, beta)
            (loss, ntoks), grads = nn.value_and_grad(model, fn)(model, b, l)
            grads = dict(tree_flatten(grads))
            names = sorted(grads)
            g.case(f"step{i}", objective, [b, l], [loss, ntoks] + [grads[k] for k in names],
                   names=names, beta=beta)
            opt.update(model, tree_unflatten(list(grads.items())))
            mx.eval(model.parameters(), opt.state)
        final = dict(tree_flatten(model.trainable_parameters()))
        g.case("final", "adam", [], [final[k] for k in names], names=names)
        g.save()


def misc():
    g = Golden(f"{ROOT}/goldens/train_misc.safetensors", __file__)
    for seed, n, draws in ((0, 5, 3), (7, 1, 2), (3, 37, 2), (12345, 1000, 1)):
        np.random.seed(seed)
        perms = [np.random.permutation(n).astype(np.int32) for _ in range(draws)]
        g.case(f"perm_{seed}_{n}", "np.random.permutation", [], [mx.array(np.stack(perms))],
               seed=seed, n=n)
    mx.random.seed(5)
    grads = {"a": mx.random.normal((3, 4)), "b": {"c": mx.random.normal((5,)) * 3}}
    flat = [grads["a"], grads["b"]["c"]]
    for max_norm in (0.5, 100.0):
        clipped, norm = optim.clip_grad_norm(grads, max_norm)
        g.case(f"clip_{str(max_norm).replace('.', '_')}", "clip_grad_norm", flat,
               [clipped["a"], clipped["b"]["c"], norm], max_norm=max_norm)
    from mlx_lm.tuner.utils import build_schedule

    steps = mx.array(list(range(0, 12)), mx.uint64)
    for label, cfg in (
        ("cosine_warmup", {"name": "cosine_decay", "arguments": [2e-2, 6, 1e-3], "warmup": 2}),
        ("cosine", {"name": "cosine_decay", "arguments": [1e-3, 10]}),
        ("linear_warmup_init", {"name": "linear_schedule", "arguments": [1e-2, 1e-4, 5],
                                "warmup": 3, "warmup_init": 1e-5}),
        ("exp", {"name": "exponential_decay", "arguments": [1e-2, 0.9]}),
        ("step", {"name": "step_decay", "arguments": [1e-2, 0.5, 3]}),
    ):
        fn = build_schedule(cfg)
        vals = mx.stack([fn(mx.array(i, mx.uint64)) for i in range(12)])
        g.case(f"sched_{label}", "build_schedule", [steps], [vals])
    g.save()


# Full fine-tuning beyond llama: the last layer (`FULL_LAYERS`) of tiny mlx-models fixtures (descriptor rows
# under dense/, the ports beside them; the case is the fixture's name) unfrozen as
# mlx_lm.lora does it, and `nn.value_and_grad(model, default_loss)` on a fixed batch: the
# trainable names (mlx-lm's module paths) and every gradient (case `<arch>`); then two steps
# of mlx's `optim.Adam` on that batch, as the tuner's step applies them: the second step's
# loss and the trained arrays (case `<arch>_adam`).
FULL_ARCHS = ["dense/qwen3", "dense/phi3", "dense/gpt2", "dense/cohere", "dense/gpt_neox",
              "dense/internlm2", "dense/olmo2", "dense/starcoder2", "dense/gemma", "dense/gemma2",
              "dense/gemma2_bf16", "dense/gemma3_text", "dense/nemotron", "dense/stablelm",
              "dense/stablelm_parallel_qknorm", "dense/apertus", "mixtral", "qwen2_moe",
              "qwen3_moe", "olmoe", "gpt_oss", "lfm2", "qwen3_next", "qwen3_5", "qwen3_5_moe",
              "gemma4_text", "gemma4_text_bf16", "gemma4_text_kv_eq"]
# Fixtures whose last layer alone would leave a layer kind out: lfm2 ends conv, attention;
# the DeltaNet hybrids linear attention, full attention; gemma4_text's last layers share an
# earlier layer's keys and values, so the trained layers reach back to one that has its own.
FULL_LAYERS = {"lfm2": 2, "qwen3_next": 2, "qwen3_5": 2, "qwen3_5_moe": 2, "gemma4_text": 3,
               "gemma4_text_bf16": 3, "gemma4_text_kv_eq": 2}
FULL_ADAM_LR = 1e-2


def full_architectures():
    from mlx_lm.utils import load_model

    g = Golden(f"{ROOT}/goldens/train_full_archs.safetensors", __file__)
    batch = mx.array([[3, 17, 40, 9, 88, 5, 61, 23, 12], [7, 2, 55, 31, 80, 14, 6, 47, 29]], mx.int32)
    lengths = mx.array([[0, 8], [2, 6]], mx.int32)
    for fixture in FULL_ARCHS:
        arch = fixture.split("/")[-1]
        model, _ = load_model(Path(f"mlx-models/tests/models/{fixture}"))
        num_layers = FULL_LAYERS.get(arch, 1)
        model.freeze()
        for layer in model.layers[-num_layers:]:
            layer.unfreeze()
        names = sorted(k for k, _ in tree_flatten(model.trainable_parameters()))
        model.train()
        loss_and_grad = nn.value_and_grad(model, default_loss)
        (loss, ntoks), grads = loss_and_grad(model, batch, lengths)
        flat = dict(tree_flatten(grads))
        g.case(arch, "value_and_grad", [batch, lengths], [loss, ntoks] + [flat[k] for k in names],
               names=names, num_layers=num_layers)
        opt = optim.Adam(learning_rate=FULL_ADAM_LR)
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state)
        (loss, _), grads = loss_and_grad(model, batch, lengths)
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state)
        final = dict(tree_flatten(model.trainable_parameters()))
        g.case(f"{arch}_adam", "adam", [], [loss] + [final[k] for k in names], names=names,
               steps=2, learning_rate=FULL_ADAM_LR)
    g.save()


def main():
    rng = np.random.default_rng(1234)
    corpus = write_data(rng)
    vocab = None
    for name in ("dense", "q4", "gemma3", "moe", "hybrid"):
        d = f"{ROOT}/models/{name}"
        os.makedirs(d, exist_ok=True)
        vocab = make_tokenizer(d, corpus)
    make_model("dense", vocab, 21, None)
    make_model("q4", vocab, 22, (32, 4))
    make_model("gemma3", vocab, 23, None, GEMMA3)
    make_model("moe", vocab, 24, None, QWEN3_MOE)
    make_model("hybrid", vocab, 25, None, QWEN3_NEXT)
    for name, (model_name, data, overrides) in RUNS.items():
        run(name, model_name, data, overrides)
    preference()
    misc()
    full_architectures()


if __name__ == "__main__":
    main()

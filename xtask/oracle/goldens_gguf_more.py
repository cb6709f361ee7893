"""GGUF name maps, the later architectures (issue #32): tiny seeded mlx-lm models written as
llama.cpp's `convert_hf_to_gguf.py` writes them, and mlx-lm 0.32.2's logits on the same
weights.

One table, `CASES`, and one writer, `write_case`. For each case: build
`mlx_lm.models.<model_type>.Model`, seed it (normal * 0.3), rename its tensors to llama.cpp's
(gguf-py's tensor_mapping.py: experts stacked as `ffn_*_exps`, Q / K rows permuted where the
converter's class is LlamaModel's, the case's `convert` hook for tensors the converter
reshapes), add the tensors the converter generates (`extra`), write the metadata keys that
converter class writes, in its order (`meta`, a list of entries; only those keys: no
`vocab_size` where it writes none, the vocabulary's size is then the length of
`tokenizer.ggml.tokens`), save the file with `mx.save_gguf` (f32, checked lossless) under
mlx-models/tests/models/gguf/<name>.gguf and record the model's prefill, cached decode steps
and a cache-less forward in mlx-models/tests/goldens/gguf/<name>.safetensors. A case whose
conversion changes values (`read_back`) is recorded on a fresh mlx-lm model loaded from the
file with each conversion undone. Case names after the script regenerate only those. Run
with `cargo xtask goldens gguf_more`.
"""

import math
import os
import sys
import types
import zlib
from dataclasses import dataclass, field
from typing import Callable, Optional

import mlx.core as mx
from mlx.utils import tree_flatten

# mlx_lm/models/olmo.py exits unless `hf_olmo` imports; it is only an availability probe.
sys.modules.setdefault("hf_olmo", types.ModuleType("hf_olmo"))

from gguf_golden import Meta, only, permute, record, seeded_model, unpermute, write_gguf

BASE = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "vocab_size": 96,
    "max_position_embeddings": 256,
    "rope_theta": 10000.0,
}

# mlx-lm names -> llama.cpp's, shared by the llama-like layers.
LLAMA = {
    "model.embed_tokens": "token_embd",
    "model.norm": "output_norm",
    "lm_head": "output",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}

EXPERTS = {
    "mlp.gate": "ffn_gate_inp",
    "mlp.switch_mlp.gate_proj": "ffn_gate_exps",
    "mlp.switch_mlp.up_proj": "ffn_up_exps",
    "mlp.switch_mlp.down_proj": "ffn_down_exps",
}


# --- Metadata, as data ---------------------------------------------------------------------
# An entry is (kind, key, value): `value` is a config field name, a function of the config, or
# a constant. Kinds: "u32" (uint32, also a per-layer list), "f32", "str", "flag" (bool),
# "arr" (an mx.array the function returns: bool or int32 lists), and "raw" (a key without the
# architecture prefix: the tokenizer's).


def _val(c, v):
    if callable(v):
        return v(c)
    if isinstance(v, str):
        return c[v]
    return v


def _entry(kind):
    return lambda key, v: (kind, key, v)


u32, f32, text, flag, arr = (_entry(k) for k in ("u32", "f32", "str", "flag", "arr"))


def write_meta(arch, c, entries):
    m = Meta(arch)
    for kind, key, v in entries:
        # Strings are field names except for the string kinds.
        v = _val(c, v) if kind not in ("str", "raw") or callable(v) else v
        if kind == "u32":
            m.num(key, v)
        elif kind == "f32":
            m.f32(key, v)
        elif kind == "str":
            m.str(key, v)
        elif kind == "flag":
            m.flag(key, v)
        elif kind == "arr":
            m.m[f"{arch}.{key}"] = v
        else:
            m.m[key] = v
    return m


def layers(c):
    return c.get("num_hidden_layers", c.get("num_layers"))


def head_size(c):
    return c["hidden_size"] // c["num_attention_heads"]


def tokenizer(model):
    return [
        ("raw", "tokenizer.ggml.model", model),
        ("raw", "tokenizer.ggml.tokens", lambda c: [f"t{i}" for i in range(c["vocab_size"])]),
    ]


GPT2 = tokenizer("gpt2")
SPM = tokenizer("llama")


def text_model(eps=("attention.layer_norm_rms_epsilon", "rms_norm_eps"), head_dim=None,
               vocab_size=False, rope_dims=None, blocks=layers, ffn="intermediate_size"):
    """TextModel.set_gguf_parameters' keys (plus LlamaModel's vocab_size and rope dims), then
    the byte-level BPE tokenizer; `head_dim` / `rope_dims` are config fields or functions."""
    e = [
        u32("block_count", blocks),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", ffn),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", "num_key_value_heads"),
        f32("rope.freq_base", "rope_theta"),
        f32(*eps),
    ]
    if head_dim is not None:
        e += [u32("attention.key_length", head_dim), u32("attention.value_length", head_dim)]
    if vocab_size:
        e.append(u32("vocab_size", "vocab_size"))
    if rope_dims is not None:
        e.append(u32("rope.dimension_count", rope_dims))
    return e + GPT2


def plus_mtp(c):
    """block_count with the one MTP layer the converter writes after the main layers."""
    return c["num_hidden_layers"] + 1


def window_pattern(flags):
    return arr("attention.sliding_window_pattern", lambda c: mx.array(flags(c)))


# The expert keys TextModel and the GLM-4.5 / dots.llm1 converter classes write.
MOE_META = [
    u32("expert_count", "n_routed_experts"),
    u32("expert_used_count", "num_experts_per_tok"),
    u32("expert_group_count", "n_group"),
    u32("expert_group_used_count", "topk_group"),
    u32("expert_feed_forward_length", "moe_intermediate_size"),
    u32("expert_shared_count", "n_shared_experts"),
    u32("leading_dense_block_count", "first_k_dense_replace"),
    f32("expert_weights_scale", "routed_scaling_factor"),
    flag("expert_weights_norm", "norm_topk_prob"),
]


def phi3_meta(experts=False):
    """Phi3MiniModel.set_gguf_parameters (long rope: the factors are tensors, `extra`)."""
    e = [
        u32("context_length", "max_position_embeddings"),
        u32("rope.scaling.original_context_length", "original_max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("block_count", "num_hidden_layers"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", "num_key_value_heads"),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("rope.dimension_count",
            lambda c: int(c.get("partial_rotary_factor", 1.0) * c["hidden_size"]) // c["num_attention_heads"]),
        f32("rope.freq_base", "rope_theta"),
        u32("attention.sliding_window", 0),
        f32("rope.scaling.attn_factor", lambda c: math.sqrt(
            1 + math.log(c["max_position_embeddings"] / c["original_max_position_embeddings"])
            / math.log(c["original_max_position_embeddings"]))),
    ] + SPM
    if experts:
        e += [u32("expert_used_count", "num_experts_per_tok"), u32("expert_count", "num_local_experts")]
    return e


def ssm_meta(c_dk="linear_key_head_dim"):
    """The gated-delta keys Qwen3NextModel and the Qwen 3.5 classes write."""
    return [
        u32("ssm.conv_kernel", "linear_conv_kernel_dim"),
        u32("ssm.state_size", c_dk),
        u32("ssm.group_count", "linear_num_key_heads"),
        u32("ssm.time_step_rank", "linear_num_value_heads"),
        u32("ssm.inner_size", lambda c: c["linear_value_head_dim"] * c["linear_num_value_heads"]),
    ]


def lfm2_meta(kv_of, ffn, middle):
    """LFM2Model / LFM2MoeModel: per-layer `head_count_kv` (0 for a convolution layer), the
    convolution's cache length, the tokenizer last."""
    return [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", ffn),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv",
            lambda c: [c["num_key_value_heads"] if kv_of(t) else 0 for t in c["layer_types"]]),
        f32("rope.freq_base", "rope_theta"),
        f32("attention.layer_norm_rms_epsilon", "norm_eps"),
    ] + middle + [
        u32("vocab_size", "vocab_size"),
        u32("shortconv.l_cache", "conv_L_cache"),
    ] + GPT2


# --- Tensors the converters generate or reshape --------------------------------------------


def llama3_rope_freqs(c, gguf):
    """LlamaModel.generate_extra_tensors for a llama3 rope (torch float32 there, numpy's
    here): the per-frequency factors llama.cpp divides its frequencies by."""
    import numpy as np

    rp = c["rope_scaling"]
    base = c["rope_theta"]
    dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    freqs = np.float32(1.0) / (np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    factor, low, high, old = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"], rp["original_max_position_embeddings"]
    out = []
    for freq in freqs:
        wavelen = np.float32(2 * math.pi) / freq
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (np.float32(old) / wavelen - np.float32(low)) / np.float32(high - low)
            out.append(np.float32(1) / ((np.float32(1) - smooth) / np.float32(factor) + smooth))
    gguf["rope_freqs.weight"] = mx.array(np.array(out, dtype=np.float32))


def long_rope_factors(c, gguf):
    """Phi-3's / MiniCPM3's long-rope factors as tensors (long, then short)."""
    rs = c["rope_scaling"]
    gguf["rope_factors_long.weight"] = mx.array(rs["long_factor"], dtype=mx.float32)
    gguf["rope_factors_short.weight"] = mx.array(rs["short_factor"], dtype=mx.float32)


def mtp_layer(shift):
    """One MTP layer (nextn_predict_layers 1) after the main ones: the last layer's tensors
    renamed (plus `shift`, so that reading it by mistake shows), and its nextn.* parts."""

    def add(c, gguf):
        n = c["num_hidden_layers"]
        for k in [k for k in gguf if k.startswith(f"blk.{n - 1}.")]:
            gguf[f"blk.{n}." + k.split(".", 2)[2]] = gguf[k] + shift if shift else gguf[k]
        h = c["hidden_size"]
        gguf[f"blk.{n}.nextn.eh_proj.weight"] = mx.ones((h, 2 * h))
        for part in ("enorm", "hnorm", "shared_head_norm"):
            gguf[f"blk.{n}.nextn.{part}.weight"] = mx.ones((h,))

    return add


def layer_of(k):
    return k.split(".")[2] if k.startswith("model.layers.") else None


def squeezed_conv(k, v):
    """LFM2's short convolution: the depthwise kernel squeezed to (channels, kernel)."""
    if k.endswith("conv.conv.weight"):
        return k, v.squeeze(-1)
    return k, v


def adjusted_ffn(c, gguf):
    """LFM2's feed-forward width as block_auto_adjust_ff_dim leaves it (64 -> 48 here)."""
    assert gguf["blk.0.ffn_gate.weight"].shape[0] == 48


def lfm2_tensors(case, k, v):
    k, v = squeezed_conv(k, v)
    if k.endswith(".feed_forward.expert_bias"):
        return [(f"blk.{layer_of(k)}.exp_probs_b.bias", v)]
    return [(case.gguf_name(k), v)]


def gated_delta_tensor(k, v):
    """Qwen3NextModel.modify_tensors' value-changing conversions, or None."""
    layer = layer_of(k)
    if k.endswith("linear_attn.A_log"):
        return [(f"blk.{layer}.ssm_a", -mx.exp(v))]
    if k.endswith("linear_attn.dt_bias"):
        return [(f"blk.{layer}.ssm_dt.bias", v)]
    if k.endswith("linear_attn.conv1d.weight"):
        return [(f"blk.{layer}.ssm_conv1d.weight", v.squeeze(-1))]
    return None


def qwen3next_tensors(case, k, v):
    """`in_proj_qkvz` regrouped into `attn_qkv` (q, k, v of every head) and `attn_gate` (z)."""
    c = case.config
    nk, dk = c["linear_num_key_heads"], c["linear_key_head_dim"]
    r, dv = c["linear_num_value_heads"] // nk, c["linear_value_head_dim"]
    out = gated_delta_tensor(k, v)
    if out is not None:
        return out
    if k.endswith("linear_attn.in_proj_qkvz.weight"):
        g = v.reshape(nk, 2 * dk + 2 * r * dv, -1)
        q, kk, vv, z = mx.split(g, [dk, 2 * dk, 2 * dk + r * dv], axis=1)
        h = v.shape[-1]
        qkv = [q.reshape(-1, h), kk.reshape(-1, h), vv.reshape(-1, h)]
        return [
            (f"blk.{layer_of(k)}.attn_qkv.weight", mx.concatenate(qkv, axis=0)),
            (f"blk.{layer_of(k)}.attn_gate.weight", z.reshape(-1, h)),
        ]
    return [(case.gguf_name(k), v)]


def tile_v(t, axis, nk, r, d):
    """_LinearAttentionVReorderBase._reorder_v_heads: (.., nk, r, d, ..) -> (.., r, nk, d, ..)."""
    s = list(t.shape)
    axis = axis % len(s)
    t = t.reshape(*s[:axis], nk, r, d, *s[axis + 1 :])
    return t.swapaxes(axis, axis + 1).reshape(s)


def untile_v(t, axis, nk, r, d):
    s = list(t.shape)
    axis = axis % len(s)
    t = t.reshape(*s[:axis], r, nk, d, *s[axis + 1 :])
    return t.swapaxes(axis, axis + 1).reshape(s)


def qwen35_v_heads(c, k, v, tile):
    """The value-head reorder of every tensor the Qwen 3.5 converter reorders (`tile`), or
    its inverse (`untile_v`)."""
    nk, dk = c["linear_num_key_heads"], c["linear_key_head_dim"]
    r, dv = c["linear_num_value_heads"] // nk, c["linear_value_head_dim"]
    qk = 2 * nk * dk
    if ".linear_attn." not in k or r == 1:
        return v
    if k.endswith(("in_proj_qkv.weight", "conv1d.weight")):
        return mx.concatenate([v[:qk], tile(v[qk:], 0, nk, r, dv)], axis=0)
    if k.endswith("in_proj_z.weight"):
        return tile(v, 0, nk, r, dv)
    if k.endswith(("in_proj_b.weight", "in_proj_a.weight", "A_log", "dt_bias")):
        return tile(v, 0, nk, r, 1)
    if k.endswith("out_proj.weight"):
        return tile(v, 1, nk, r, dv)
    return v


def qwen35_tensors(case, k, v):
    k = k.removeprefix("language_model.")
    v = qwen35_v_heads(case.config, k, v, tile_v)
    out = gated_delta_tensor(k, v)
    return out if out is not None else [(case.gguf_name(k), v)]


def qwen3next_back(case, p, rest, v, loaded):
    """The mlx-lm (name, value) of `blk.<layer>.<rest>` with qwen3next's conversions undone,
    or None for `attn_gate` (joined into `in_proj_qkvz` with `attn_qkv`)."""
    c = case.config
    nk, dk = c["linear_num_key_heads"], c["linear_key_head_dim"]
    r, dv = c["linear_num_value_heads"] // nk, c["linear_value_head_dim"]
    if rest == "attn_gate.weight":
        return None
    if rest == "attn_qkv.weight":
        hh = v.shape[-1]
        q, kk, vv = mx.split(v, [nk * dk, 2 * nk * dk], axis=0)
        z = loaded[f"blk.{p.split('.')[2]}.attn_gate.weight"]
        parts = [q.reshape(nk, dk, hh), kk.reshape(nk, dk, hh), vv.reshape(nk, r * dv, hh), z.reshape(nk, r * dv, hh)]
        return f"{p}.linear_attn.in_proj_qkvz.weight", mx.concatenate(parts, axis=1).reshape(-1, hh)
    return gated_delta_back(case, p, rest, v)


def gated_delta_back(case, p, rest, v):
    if rest == "ssm_a":
        return f"{p}.linear_attn.A_log", mx.log(-v)
    if rest == "ssm_dt.bias":
        return f"{p}.linear_attn.dt_bias", v
    if rest == "ssm_conv1d.weight":
        return f"{p}.linear_attn.conv1d.weight", v[..., None]
    module, suffix = rest.rsplit(".", 1)
    return f"{p}.{case.inverse[module]}.{suffix}", v


def qwen35_back(case, p, rest, v, loaded):
    mk, v = gated_delta_back(case, p, rest, v)
    return mk, qwen35_v_heads(case.config, mk, v, untile_v)


# --- The table -----------------------------------------------------------------------------


@dataclass
class Case:
    model_type: str
    config: dict
    arch: str
    meta: list
    parts: dict = field(default_factory=dict)
    permute_qk: bool = False
    prefix: str = "model.layers"
    # (case, mlx-lm name, value) -> [(GGUF name, value)], for tensors the converter reshapes.
    tensors: Optional[Callable] = None
    # Functions (config, gguf tensors) adding what the converter generates, in its order.
    extra: list = field(default_factory=list)
    # (case, "model.layers.<l>", rest, value, loaded) -> (mlx-lm name, value) or None: the
    # golden is then mlx-lm on the weights read back from the file through it.
    read_back: Optional[Callable] = None
    # The mlx-lm names' wrapper read back (`language_model.` for Qwen 3.5).
    wrap: str = ""
    # The config the converter reads (Llama 4's `text_config`).
    hparams: Callable = lambda c: c
    # (name, model, path) -> None: more goldens from the written file and the golden's model.
    after: Optional[Callable] = None
    # Read-back of every tensor (GGUF name, value) -> value, before `read_back` maps it; the
    # names (mlx-lm's) whose read-back may differ from the seeded values.
    undo: Optional[Callable] = None
    inexact: Callable = lambda k: k.endswith("A_log")
    # (case, top-level GGUF name, value) -> [(mlx-lm name, value)] or None (then `inverse`):
    # Kimi K3's fused `output_res_score`.
    top_back: Optional[Callable] = None
    # The read-back model as recorded (BitNet's BitLinears unpacked for the CPU).
    serve: Callable = lambda m: m

    def __post_init__(self):
        self.names = {**LLAMA, **self.parts}
        self.inverse = {v: k for k, v in self.names.items()}

    def gguf_name(self, name):
        return to_gguf_name(name, self.names, self.prefix)


def to_gguf_name(name, parts, prefix):
    if name.endswith(".self_attn.sinks"):
        # gpt-oss: the converter adds `.weight` to the bare parameter.
        return f"blk.{name.split('.')[2]}.attn_sinks.weight"
    if name.endswith(".mlp.gate.e_score_correction_bias"):
        return f"blk.{name.split('.')[2]}.exp_probs_b.bias"
    module, suffix = name.rsplit(".", 1)
    if module in parts:
        return f"{parts[module]}.{suffix}"
    assert module.startswith(prefix + "."), name
    layer, part = module[len(prefix) + 1 :].split(".", 1)
    return f"blk.{layer}.{parts[part]}.{suffix}"


def seed_of(name):
    """A seed from the case name (adding a case changes no other case's weights)."""
    return zlib.crc32(name.encode()) % 100000


def write_case(name, case):
    c = case.config
    _, model = seeded_model(case.model_type, c, seed_of(name))
    gguf = {}
    for k, v in tree_flatten(model.parameters()):
        if c.get("tie_word_embeddings", case.model_type != "phimoe") and k == "lm_head.weight":
            continue
        if case.permute_qk and (".q_proj." in k or ".k_proj." in k):
            v = permute(v, c["num_attention_heads" if ".q_proj." in k else "num_key_value_heads"])
        for g, t in case.tensors(case, k, v) if case.tensors else [(case.gguf_name(k), v)]:
            gguf[g] = t
    for add in case.extra:
        add(case.hparams(c), gguf)
    path = write_gguf(name, gguf, write_meta(case.arch, case.hparams(c), case.meta))
    if case.read_back is None:
        record(model, name, __file__, one_token=case.model_type == "olmo")
        if case.after is not None:
            case.after(name, model, path)
        return
    # Read back into a fresh mlx-lm model, undoing each conversion (the MTP layer skipped);
    # every tensor but A_log (through -exp / log) must come back as seeded.
    loaded = mx.load(path)
    n = c["num_hidden_layers"]
    back = {}
    for k, v in loaded.items():
        if k.startswith(f"blk.{n}."):
            continue
        if case.undo is not None:
            v = case.undo(k, v)
        if not k.startswith("blk."):
            top = case.top_back(case, k, v) if case.top_back is not None else None
            if top is not None:
                back.update((case.wrap + mk, mv) for mk, mv in top)
                continue
            module, suffix = k.rsplit(".", 1)
            back[f"{case.wrap}{case.inverse[module]}.{suffix}"] = v
            continue
        _, layer, rest = k.split(".", 2)
        got = case.read_back(case, f"model.layers.{layer}", rest, v, loaded)
        # One pair, or a list of pairs (BitNet: packed codes and their scale).
        for mk, mv in [] if got is None else got if isinstance(got, list) else [got]:
            back[case.wrap + mk] = mv
    orig = dict(tree_flatten(model.parameters()))
    assert sorted(orig) == sorted(back), (sorted(orig), sorted(back))
    for k, v in back.items():
        if not case.inexact(k):
            assert mx.array_equal(orig[k], v).item(), k
    module = __import__(f"mlx_lm.models.{case.model_type}", fromlist=["Model"])
    fresh = module.Model(module.ModelArgs.from_dict(c))
    fresh.load_weights(list(back.items()), strict=True)
    mx.eval(fresh.parameters())
    record(case.serve(fresh), name, __file__)


def cfg(model_type, **overrides):
    return {**BASE, "model_type": model_type, **overrides}


DEEPSEEK_MOE = {
    "mlp.gate": "ffn_gate_inp",
    "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
    "mlp.shared_experts.up_proj": "ffn_up_shexp",
    "mlp.shared_experts.down_proj": "ffn_down_shexp",
}

MOE_COMMON = {
    "num_hidden_layers": 3,
    "first_k_dense_replace": 1,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 16,
    "norm_topk_prob": True,
    "tie_word_embeddings": False,
    "rope_scaling": None,
}

MLA = {
    "self_attn.q_a_proj": "attn_q_a",
    "self_attn.q_a_layernorm": "attn_q_a_norm",
    "self_attn.q_b_proj": "attn_q_b",
    "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
    "self_attn.kv_a_layernorm": "attn_kv_a_norm",
    "self_attn.kv_b_proj": "attn_kv_b",
}

POST_NORMS = {
    "post_attention_layernorm": "post_attention_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}

# The attention factor llama.cpp's converter writes for long rope (its formula, which mlx-lm's
# SuScaledRoPE also uses without an mscale): PhiMoE's mscales are that, as the file holds it.
PHIMOE_MSCALE = math.sqrt(1 + math.log(8192 / 512) / math.log(512))
FACTORS = {
    "short_factor": [1.0, 1.1, 1.2, 1.3],
    "long_factor": [1.0, 1.5, 2.0, 2.5],
}

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
}

# LFM2 (`lfm2`): short-convolution layers between attention layers. LFM2Model writes
# `head_count_kv` per layer (0 for a convolution layer), the feed-forward width already
# adjusted (block_auto_adjust_ff_dim: 64 -> 48 here), the convolution's cache length, and
# the depthwise kernel squeezed to (channels, kernel); the final norm is `token_embd_norm`.
LFM2 = {
    "model_type": "lfm2",
    "vocab_size": 96,
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "norm_eps": 1e-5,
    "conv_bias": False,
    "conv_L_cache": 3,
    "block_dim": 32,
    "block_ff_dim": 64,
    "block_multiple_of": 16,
    "block_ffn_dim_multiplier": 1.0,
    "block_auto_adjust_ff_dim": True,
    "rope_theta": 1000000.0,
    "layer_types": ["conv", "full_attention", "conv", "full_attention"],
}

LFM2_PARTS = {
    "model.embed_tokens": "token_embd",
    "model.embedding_norm": "token_embd_norm",
    "operator_norm": "attn_norm",
    "ffn_norm": "ffn_norm",
    "feed_forward.w1": "ffn_gate",
    "feed_forward.w3": "ffn_up",
    "feed_forward.w2": "ffn_down",
    "self_attn.q_layernorm": "attn_q_norm",
    "self_attn.k_layernorm": "attn_k_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.out_proj": "attn_output",
    "conv.conv": "shortconv.conv",
    "conv.in_proj": "shortconv.in_proj",
    "conv.out_proj": "shortconv.out_proj",
}

# LFM2-MoE (`lfm2moe`): LFM2's layers with a dense first block and sigmoid-routed experts
# with a selection bias. LFM2MoeModel writes the per-layer `head_count_kv`, the dense width
# as `feed_forward_length`, the experts' as `expert_feed_forward_length`, the dense block
# count, sigmoid gating (2) and `expert_bias` as `exp_probs_b.bias`; llama.cpp always
# renormalizes the top-k weights (norm_topk_prob) and scales them by 1.
LFM2MOE = {
    "model_type": "lfm2_moe",
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 48,
    "moe_intermediate_size": 16,
    "num_hidden_layers": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "use_expert_bias": True,
    "num_dense_layers": 1,
    "norm_eps": 1e-5,
    "conv_bias": False,
    "conv_L_cache": 3,
    "rope_theta": 1000000.0,
    "routed_scaling_factor": 1.0,
    "layer_types": ["conv", "full_attention", "conv", "full_attention"],
}

LFM2MOE_PARTS = {
    **LFM2_PARTS,
    "feed_forward.gate_proj": "ffn_gate",
    "feed_forward.up_proj": "ffn_up",
    "feed_forward.down_proj": "ffn_down",
    "feed_forward.gate": "ffn_gate_inp",
    "feed_forward.switch_mlp.gate_proj": "ffn_gate_exps",
    "feed_forward.switch_mlp.up_proj": "ffn_up_exps",
    "feed_forward.switch_mlp.down_proj": "ffn_down_exps",
}

# Qwen3-Next (`qwen3next`): Qwen3NextModel.modify_tensors' conversions, which change values,
# so the golden is mlx-lm on the weights read back from the file (as the Gemma norms are in
# goldens_gguf_dense.py): `A_log` stored as `ssm_a = -exp(A_log)` (read back as
# `log(-ssm_a)`), `in_proj_qkvz` regrouped into `attn_qkv` (q, k, v of every head) and
# `attn_gate` (z), conv1d squeezed to (channels, kernel), `dt_bias` as `ssm_dt.bias`; the
# norms are stored as 1 + w, which is mlx-lm's own parameter. The file also holds one MTP
# layer (nextn_predict_layers), which is skipped.
QWEN3NEXT = {
    **BASE,
    "model_type": "qwen3_next",
    "num_hidden_layers": 4,
    "full_attention_interval": 2,
    "head_dim": 8,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "shared_expert_intermediate_size": 16,
    "moe_intermediate_size": 16,
    "partial_rotary_factor": 0.25,
    "norm_topk_prob": True,
    "tie_word_embeddings": False,
}

QWEN3NEXT_PARTS = {
    **EXPERTS,
    "post_attention_layernorm": "post_attention_norm",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "linear_attn.in_proj_ba": "ssm_ba",
    "linear_attn.norm": "ssm_norm",
    "linear_attn.out_proj": "ssm_out",
}

# Qwen 3.5 (`qwen35`, `qwen35moe`): Qwen3-Next's layers with separate projections
# (`in_proj_qkv` -> attn_qkv, `in_proj_z` -> attn_gate, `in_proj_b` -> ssm_beta, `in_proj_a`
# -> ssm_alpha), every layer with experts in the MoE. Qwen3_5TextModel /
# Qwen3_5MoeTextModel (_LinearAttentionVReorderBase) first reorder the value heads from
# grouped by key head ([k0: v0..v{r-1}, k1: ...]) to tiled ([v0 of every k, v1 of every k,
# ...]) in the V rows of `in_proj_qkv`, the rows of `in_proj_z`, `in_proj_b`, `in_proj_a`,
# `A_log`, `dt_bias`, the V channels of the conv kernel and the columns of `out_proj`; then
# Qwen3NextModel's conversions (`ssm_a = -exp(A_log)`, conv squeezed, `dt_bias` as
# `ssm_dt.bias`). The metadata adds the interleaved-MRoPE sections (text positions make it
# plain rope) and `attention.recurrent_layers` from `layer_types`. The golden is mlx-lm on
# the weights read back from the file (A_log through -exp / log); every other tensor read
# back is checked equal to the seeded model's.
QWEN35 = {
    **BASE,
    "model_type": "qwen3_5",
    "num_hidden_layers": 4,
    "intermediate_size": 24,
    "full_attention_interval": 2,
    "layer_types": ["linear_attention", "full_attention"] * 2,
    "head_dim": 8,
    # Three value heads per key head: a reorder that swapped the two counts would fail.
    "linear_num_value_heads": 6,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "tie_word_embeddings": False,
    "rope_parameters": {
        "rope_type": "default",
        "mrope_section": [1, 1, 0],
        "mrope_interleaved": True,
        "rope_theta": 1000000.0,
        "partial_rotary_factor": 0.5,
    },
}

QWEN35MOE = {
    **QWEN35,
    "model_type": "qwen3_5_moe",
    "num_hidden_layers": 2,
    "layer_types": ["linear_attention", "full_attention"],
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "shared_expert_intermediate_size": 16,
    "moe_intermediate_size": 16,
}

QWEN35_PARTS = {
    **QWEN3NEXT_PARTS,
    "linear_attn.in_proj_qkv": "attn_qkv",
    "linear_attn.in_proj_z": "attn_gate",
    "linear_attn.in_proj_b": "ssm_beta",
    "linear_attn.in_proj_a": "ssm_alpha",
    "linear_attn.conv1d": "ssm_conv1d",
    "linear_attn.dt": "ssm_dt",
}


def qwen35_meta(c):
    """Qwen3_5TextModel / Qwen3_5MoeTextModel.set_gguf_parameters."""
    moe = [
        u32("expert_count", "num_experts"),
        u32("expert_used_count", "num_experts_per_tok"),
        u32("expert_feed_forward_length", "moe_intermediate_size"),
        u32("expert_shared_feed_forward_length", "shared_expert_intermediate_size"),
    ] if c.get("num_experts") else []
    rp = lambda f: lambda c: c["rope_parameters"][f]  # noqa: E731
    return [
        u32("block_count", plus_mtp),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", "num_key_value_heads"),
        arr("rope.dimension_sections", lambda c: mx.array(c["rope_parameters"]["mrope_section"] + [0], dtype=mx.int32)),
        f32("rope.freq_base", rp("rope_theta")),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
    ] + moe + [
        u32("attention.key_length", "head_dim"),
        u32("attention.value_length", "head_dim"),
    ] + ssm_meta() + [
        arr("attention.recurrent_layers",
            lambda c: mx.array([t == "linear_attention" for t in c["layer_types"]] + [False])),
        u32("full_attention_interval", "full_attention_interval"),
        u32("rope.dimension_count", lambda c: int(c["head_dim"] * c["rope_parameters"]["partial_rotary_factor"])),
        u32("nextn_predict_layers", 1),
    ] + GPT2


CASES = {
    # gpt-oss: sinks, biased router and experts, alternating sliding layers, YaRN.
    # GptOssModel: TextModel's keys (YaRN's as rope scaling, head_dim as key / value length,
    # no vocab_size), the window and the experts' width.
    "gpt_oss": Case(
        "gpt_oss",
        cfg(
            "gpt_oss",
            head_dim=8,
            intermediate_size=32,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=4,
            tie_word_embeddings=False,
            rope_theta=150000.0,
            rope_scaling={
                "rope_type": "yarn",
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "original_max_position_embeddings": 64,
                "truncate": False,
            },
        ),
        "gpt-oss",
        text_model(head_dim="head_dim") + [
            text("rope.scaling.type", "yarn"),
            f32("rope.scaling.factor", lambda c: c["rope_scaling"]["factor"]),
            u32("rope.scaling.original_context_length",
                lambda c: c["rope_scaling"]["original_max_position_embeddings"]),
            f32("rope.scaling.yarn_beta_fast", lambda c: c["rope_scaling"]["beta_fast"]),
            f32("rope.scaling.yarn_beta_slow", lambda c: c["rope_scaling"]["beta_slow"]),
            u32("expert_count", "num_local_experts"),
            u32("expert_used_count", "num_experts_per_tok"),
            u32("attention.sliding_window", "sliding_window"),
            u32("expert_feed_forward_length", "intermediate_size"),
        ],
        {
            "post_attention_layernorm": "post_attention_norm",
            "mlp.router": "ffn_gate_inp",
            "mlp.experts.gate_proj": "ffn_gate_exps",
            "mlp.experts.up_proj": "ffn_up_exps",
            "mlp.experts.down_proj": "ffn_down_exps",
        },
    ),
    # Nanbeige: the llama stack run twice with shared weights, the final norm between loops
    # skipped. NanbeigeModel (LlamaModel: Q / K permuted, vocab size, rope dims) plus its
    # loops.
    "nanbeige": Case(
        "nanbeige",
        cfg("nanbeige", head_dim=16, num_loops=2, skip_loop_final_norm=True, tie_word_embeddings=False),
        "nanbeige",
        text_model(vocab_size=True, rope_dims="head_dim") + [
            u32("num_loops", "num_loops"),
            flag("skip_loop_final_norm", "skip_loop_final_norm"),
        ],
        permute_qk=True,
    ),
    # Llama 3.1's rope (llama.cpp stores the factors as `rope_freqs`, not the parameters):
    # two frequencies in the smoothed band, one of each outside it.
    "llama3": Case(
        "llama",
        cfg(
            "llama",
            head_dim=16,
            tie_word_embeddings=False,
            rope_scaling={**LLAMA3_ROPE, "factor": 8.0, "original_max_position_embeddings": 2048},
        ),
        "llama",
        text_model(vocab_size=True, rope_dims="head_dim", head_dim="head_dim"),
        permute_qk=True,
        extra=[llama3_rope_freqs],
    ),
    # OLMo 3 (sliding window 4 on layers 1-3, full attention on the 4th), written as `olmo2`
    # by Olmo2Model: the window and its per-layer pattern (every 4th layer full attention when
    # the config has no layer_types).
    "olmo3": Case(
        "olmo3",
        cfg("olmo3", num_hidden_layers=4, sliding_window=4, rope_theta=500000.0, tie_word_embeddings=False),
        "olmo2",
        text_model() + [
            u32("attention.sliding_window", "sliding_window"),
            window_pattern(lambda c: [(i + 1) % 4 != 0 for i in range(c["num_hidden_layers"])]),
        ],
        POST_NORMS,
    ),
    "seed_oss": Case(
        "seed_oss",
        cfg("seed_oss", head_dim=16, attention_bias=True, attention_out_bias=False, mlp_bias=False,
            tie_word_embeddings=False),
        "seed_oss",
        text_model(head_dim="head_dim"),
    ),
    # ERNIE 4.5 (dense): interleaved rope in both, so no permutation.
    "ernie4_5": Case(
        "ernie4_5",
        cfg("ernie4_5", head_dim=8, use_bias=False, tie_word_embeddings=True),
        "ernie4_5",
        text_model(head_dim="head_dim"),
    ),
    # Command R (cohere): parallel block with one LayerNorm, per-head q/k LayerNorms, tied
    # head scaled by logit_scale. CommandR2Model: LayerNorm epsilon, logit scale, no rope
    # scaling.
    "command_r": Case(
        "cohere",
        cfg("cohere", layer_norm_eps=1e-5, logit_scale=0.0625, use_qk_norm=True, attention_bias=False,
            layer_norm_bias=False, tie_word_embeddings=True),
        "command-r",
        text_model(eps=("attention.layer_norm_epsilon", "layer_norm_eps")) + [
            f32("logit_scale", "logit_scale"),
            text("rope.scaling.type", "none"),
        ],
    ),
    # Command R7B (cohere2): sliding window 4 on layers 1-3, the 4th global without rope.
    # Cohere2Model: LayerNorm epsilon, logit scale, sliding window, vocab size, rope dims
    # (rotary_pct 1); llama.cpp's pattern is every 4th layer global, as mlx-lm's default.
    "cohere2": Case(
        "cohere2",
        cfg("cohere2", num_hidden_layers=4, head_dim=8, layer_norm_eps=1e-5, logit_scale=0.25,
            sliding_window=4, sliding_window_pattern=4, tie_word_embeddings=True),
        "cohere2",
        text_model(eps=("attention.layer_norm_epsilon", "layer_norm_eps"), vocab_size=True,
                   rope_dims="head_dim", head_dim="head_dim") + [
            f32("logit_scale", "logit_scale"),
            u32("attention.sliding_window", "sliding_window"),
            text("rope.scaling.type", "none"),
        ],
    ),
    # EXAONE 4.0: post-norms only, q/k norms, 3 sliding layers then a global one without
    # rope, Llama 3's rope scaling. Exaone4Model: vocab size, the sliding window and its
    # per-layer pattern (from the config's "LLLG" string), Llama 3's rope as `rope_freqs`.
    "exaone4": Case(
        "exaone4",
        cfg("exaone4", num_hidden_layers=4, head_dim=8, sliding_window=4, sliding_window_pattern="LLLG",
            tie_word_embeddings=False,
            rope_scaling={**LLAMA3_ROPE, "factor": 16.0, "original_max_position_embeddings": 64}),
        "exaone4",
        text_model(vocab_size=True, head_dim="head_dim") + [
            u32("attention.sliding_window", "sliding_window"),
            window_pattern(lambda c: [c["sliding_window_pattern"][i % len(c["sliding_window_pattern"])] == "L"
                                      for i in range(c["num_hidden_layers"])]),
        ],
        POST_NORMS,
        extra=[llama3_rope_freqs],
    ),
    # 4 layers: the 4th has no rope. SmolLM3Model(LlamaModel): Q / K permuted, no-rope layers
    # fixed at every 4th in llama.cpp.
    "smollm3": Case(
        "smollm3",
        cfg("smollm3", num_hidden_layers=4, tie_word_embeddings=False, rope_theta=5000000.0),
        "smollm3",
        text_model(vocab_size=True, rope_dims=head_size),
        permute_qk=True,
    ),
    "starcoder2": Case(
        "starcoder2",
        cfg("starcoder2", norm_epsilon=1e-5, tie_word_embeddings=True, rope_theta=100000.0),
        "starcoder2",
        text_model(eps=("attention.layer_norm_epsilon", "norm_epsilon")),
        {"mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"},
    ),
    # ExaoneModel: rope dims = partial_rotary_factor (1.0) * head size; the released files
    # carry the RMS epsilon key llama.cpp reads.
    "exaone": Case(
        "exaone",
        {k: v for k, v in cfg("exaone", num_layers=2, layer_norm_epsilon=1e-5, tie_word_embeddings=False,
                              attention_bias=False, mlp_bias=False).items()
         if k not in ("num_hidden_layers", "rms_norm_eps")},
        "exaone",
        text_model(eps=("attention.layer_norm_rms_epsilon", "layer_norm_epsilon"), rope_dims=head_size),
        {
            "transformer.wte": "token_embd",
            "transformer.ln_f": "output_norm",
            "ln_1": "attn_norm",
            "ln_2": "ffn_norm",
            "attn.attention.q_proj": "attn_q",
            "attn.attention.k_proj": "attn_k",
            "attn.attention.v_proj": "attn_v",
            "attn.attention.out_proj": "attn_output",
            "mlp.c_fc_0": "ffn_gate",
            "mlp.c_fc_1": "ffn_up",
            "mlp.c_proj": "ffn_down",
        },
        prefix="transformer.h",
    ),
    # OlmoeModel writes the RMS epsilon as 1e-5 whatever the config says (the config's is too).
    "olmoe": Case(
        "olmoe",
        cfg("olmoe", rms_norm_eps=1e-5, num_experts=4, num_experts_per_tok=2, intermediate_size=16,
            norm_topk_prob=False, tie_word_embeddings=False),
        "olmoe",
        text_model() + [u32("expert_count", "num_experts"), u32("expert_used_count", "num_experts_per_tok")],
        EXPERTS,
    ),
    "granitemoe": Case(
        "granitemoe",
        cfg("granitemoe", intermediate_size=16, num_local_experts=4, num_experts_per_tok=2,
            attention_bias=False, attention_multiplier=0.25, embedding_multiplier=12.0,
            residual_multiplier=0.22, logits_scaling=8.0, tie_word_embeddings=True),
        "granitemoe",
        text_model(vocab_size=True, rope_dims=head_size) + [
            u32("expert_count", "num_local_experts"),
            u32("expert_used_count", "num_experts_per_tok"),
            f32("attention.scale", "attention_multiplier"),
            f32("embedding_scale", "embedding_multiplier"),
            f32("residual_scale", "residual_multiplier"),
            f32("logit_scale", "logits_scaling"),
        ],
        {
            "block_sparse_moe.router.layer": "ffn_gate_inp",
            "block_sparse_moe.switch_mlp.gate_proj": "ffn_gate_exps",
            "block_sparse_moe.switch_mlp.up_proj": "ffn_up_exps",
            "block_sparse_moe.switch_mlp.down_proj": "ffn_down_exps",
        },
        permute_qk=True,
    ),
    # Phi-3 with long rope (the 128k models): the factors as tensors.
    "phi3_longrope": Case(
        "phi3",
        cfg("phi3", max_position_embeddings=8192, original_max_position_embeddings=512,
            rope_scaling={"type": "longrope", **FACTORS}, tie_word_embeddings=False),
        "phi3",
        phi3_meta(),
        {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"},
        extra=[long_rope_factors],
    ),
    "phimoe": Case(
        "phimoe",
        cfg("phimoe", intermediate_size=16, num_local_experts=4, num_experts_per_tok=2,
            max_position_embeddings=8192, original_max_position_embeddings=512,
            rope_scaling={"type": "longrope", **FACTORS, "short_mscale": PHIMOE_MSCALE,
                          "long_mscale": PHIMOE_MSCALE}),
        "phimoe",
        phi3_meta(experts=True),
        {
            "block_sparse_moe.gate": "ffn_gate_inp",
            "block_sparse_moe.switch_mlp.gate_proj": "ffn_gate_exps",
            "block_sparse_moe.switch_mlp.up_proj": "ffn_up_exps",
            "block_sparse_moe.switch_mlp.down_proj": "ffn_down_exps",
        },
        extra=[long_rope_factors],
    ),
    # MiniCPM3 (MLA, dense): rope scaled by long factors over the whole context (the file
    # has no original context: llama.cpp's is the context length, as here).
    # MiniCPM3Model.set_gguf_parameters (no scales: llama.cpp fixes scale_emb 12, scale_depth
    # 1.4 and dim_model_base 256, MiniCPM3-4B's) and its long-rope factor tensors.
    "minicpm3": Case(
        "minicpm3",
        cfg("minicpm3", num_key_value_heads=4, dim_model_base=256, scale_depth=1.4, scale_emb=12.0,
            q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
            rope_scaling={"type": "longrope", "original_max_position_embeddings": 256, **FACTORS},
            tie_word_embeddings=False),
        "minicpm3",
        [
            u32("context_length", "max_position_embeddings"),
            u32("embedding_length", "hidden_size"),
            u32("block_count", "num_hidden_layers"),
            u32("feed_forward_length", "intermediate_size"),
            u32("attention.head_count", "num_attention_heads"),
            u32("attention.head_count_kv", "num_key_value_heads"),
            f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
            u32("vocab_size", "vocab_size"),
            u32("attention.q_lora_rank", "q_lora_rank"),
            u32("attention.kv_lora_rank", "kv_lora_rank"),
            u32("attention.key_length", lambda c: c["qk_nope_head_dim"] + c["qk_rope_head_dim"]),
            u32("rope.dimension_count", "qk_rope_head_dim"),
        ] + SPM,
        MLA,
        extra=[long_rope_factors],
    ),
    # GLM-4.5: head_dim wider than hidden / heads, half of it rotated, q/k norms, biases,
    # sigmoid router with groups, a leading dense layer, shared expert, one MTP layer.
    # Glm4MoeModel: head_dim as key / value length, the rotated part as rope dims, sigmoid
    # gating, and the MTP layer (block_count counts it) written after the main layers.
    "glm4moe": Case(
        "glm4_moe",
        cfg("glm4_moe", **MOE_COMMON, head_dim=16, partial_rotary_factor=0.5, attention_bias=True,
            use_qk_norm=True, n_group=2, topk_group=1, routed_scaling_factor=2.5),
        "glm4moe",
        text_model(blocks=plus_mtp, head_dim="head_dim",
                   rope_dims=lambda c: int(c["head_dim"] * c["partial_rotary_factor"]))
        + MOE_META + [u32("expert_gating_func", 2), u32("nextn_predict_layers", 1)],
        {**DEEPSEEK_MOE, "post_attention_layernorm": "post_attention_norm", **EXPERTS},
        extra=[mtp_layer(shift=1)],
    ),
    # Dots1Model (Qwen2MoeModel's keys plus DeepSeek's); no gating function key (the
    # converter rejects `noaux_tc`; llama.cpp's dots1 is sigmoid).
    "dots1": Case(
        "dots1",
        cfg("dots1", **MOE_COMMON, n_group=1, topk_group=1, routed_scaling_factor=2.0, scoring_func="noaux_tc"),
        "dots1",
        text_model() + MOE_META,
        {
            **DEEPSEEK_MOE,
            "mlp.experts.gate_proj": "ffn_gate_exps",
            "mlp.experts.up_proj": "ffn_up_exps",
            "mlp.experts.down_proj": "ffn_down_exps",
        },
    ),
    "qwen3next": Case(
        "qwen3_next",
        QWEN3NEXT,
        "qwen3next",
        text_model(blocks=plus_mtp, head_dim="head_dim",
                   rope_dims=lambda c: int(c["head_dim"] * c["partial_rotary_factor"])) + [
            u32("expert_count", "num_experts"),
            u32("expert_used_count", "num_experts_per_tok"),
            u32("expert_feed_forward_length", "moe_intermediate_size"),
            u32("expert_shared_feed_forward_length", "shared_expert_intermediate_size"),
        ] + ssm_meta() + [
            u32("full_attention_interval", "full_attention_interval"),
            u32("nextn_predict_layers", 1),
        ],
        QWEN3NEXT_PARTS,
        tensors=qwen3next_tensors,
        extra=[mtp_layer(shift=0)],
        read_back=qwen3next_back,
    ),
    "lfm2": Case(
        "lfm2",
        LFM2,
        "lfm2",
        lfm2_meta(lambda t: t != "conv", 48, []),
        LFM2_PARTS,
        tensors=lfm2_tensors,
        extra=[adjusted_ffn],
    ),
    "lfm2moe": Case(
        "lfm2_moe",
        LFM2MOE,
        "lfm2moe",
        lfm2_meta(lambda t: t == "full_attention", "intermediate_size", [
            u32("expert_count", "num_experts"),
            u32("expert_used_count", "num_experts_per_tok"),
            u32("expert_feed_forward_length", "moe_intermediate_size"),
            u32("leading_dense_block_count", "num_dense_layers"),
            u32("expert_gating_func", 2),
        ]),
        LFM2MOE_PARTS,
        tensors=lfm2_tensors,
    ),
    **{
        name: Case(c["model_type"], c, name, qwen35_meta(c), QWEN35_PARTS, tensors=qwen35_tensors,
                   extra=[mtp_layer(shift=0)], read_back=qwen35_back, wrap="language_model.")
        for name, c in [("qwen35", QWEN35), ("qwen35moe", QWEN35MOE)]
    },
}


# ERNIE 4.5 MoE (`ernie4_5-moe`): a dense first layer (moe_layer_start_index), then experts
# every `moe_layer_interval`-th layer, a softmax router over f32 logits, a shared expert.
# Ernie4_5MoeModel writes TextModel's keys, the expert counts, the interleave step, the dense
# block count, the experts' width, the shared expert count, and as the shared expert's width
# `intermediate_size // num_key_value_heads` (sic; mlx-lm's is moe_intermediate_size *
# moe_num_shared_experts, which the tensors' shapes carry). The checkpoints'
# `moe_statics.e_score_correction_bias` becomes `exp_probs_b.bias`, which llama.cpp adds to
# the router's selection and mlx-lm's sanitize drops: the file holds one that would move the
# choice to expert 3, and the golden is mlx-lm's (without it).
def ernie_probs_b(c, gguf):
    for layer in range(c["num_hidden_layers"]):
        if layer >= c["moe_layer_start_index"] and (layer + 1) % c["moe_layer_interval"] == 0:
            gguf[f"blk.{layer}.exp_probs_b.bias"] = mx.array([0.0, 0.0, 0.0, 10.0])


CASES["ernie4_5_moe"] = Case(
    "ernie4_5_moe",
    cfg("ernie4_5_moe", num_hidden_layers=4, head_dim=8, use_bias=False, tie_word_embeddings=False,
        moe_num_experts=4, moe_k=2, moe_layer_start_index=1, moe_layer_interval=2,
        moe_intermediate_size=16, moe_num_shared_experts=1),
    "ernie4_5-moe",
    text_model(head_dim="head_dim") + [
        u32("expert_count", "moe_num_experts"),
        u32("expert_used_count", "moe_k"),
        u32("interleave_moe_layer_step", "moe_layer_interval"),
        u32("leading_dense_block_count", "moe_layer_start_index"),
        u32("expert_feed_forward_length", "moe_intermediate_size"),
        u32("expert_shared_count", "moe_num_shared_experts"),
        u32("expert_shared_feed_forward_length", lambda c: c["intermediate_size"] // c["num_key_value_heads"]),
    ],
    {**DEEPSEEK_MOE, **EXPERTS},
    extra=[ernie_probs_b],
)


# Llama 4 (`llama4`): Llama4Model (LlamaModel's keys, Q / K not permuted: llama.cpp's llama4
# rope is interleaved as mlx-lm's) with the MoE width as `expert_feed_forward_length`, the
# dense layers' as `feed_forward_length`, the interleave step; Scout's rope (llama3 with
# low = high frequency factor 1: no blended band) as `rope_freqs`. llama.cpp fixes what the
# file does not say: chunks of 8192, every 4th layer global without rope, the attention
# temperature (floor 8192, scale 0.1), and q/k norms unless there are 128 experts.
# A head of 32 (16 frequencies, adjacent ones closer than 4x) puts the 8192 boundary between
# two of them.
def llama4_tensors(case, k, v):
    return [(case.gguf_name(k.removeprefix("language_model.")), v)]


CASES["llama4"] = Case(
    "llama4",
    {
        "model_type": "llama4",
        "text_config": {
            **BASE,
            "model_type": "llama4_text",
            "num_hidden_layers": 4,
            "head_dim": 32,
            "intermediate_size": 16,
            "intermediate_size_mlp": 64,
            "interleave_moe_layer_step": 2,
            "num_local_experts": 4,
            "num_experts_per_tok": 1,
            "attention_bias": False,
            "attention_chunk_size": 8192,
            "use_qk_norm": True,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
            "rope_scaling": {**LLAMA3_ROPE, "factor": 16.0, "high_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192},
        },
    },
    "llama4",
    text_model(vocab_size=True, rope_dims="head_dim", head_dim="head_dim",
               ffn="intermediate_size_mlp") + [
        u32("expert_count", "num_local_experts"),
        u32("expert_used_count", "num_experts_per_tok"),
        u32("interleave_moe_layer_step", "interleave_moe_layer_step"),
        u32("expert_feed_forward_length", "intermediate_size"),
    ],
    {
        "feed_forward.gate_proj": "ffn_gate",
        "feed_forward.up_proj": "ffn_up",
        "feed_forward.down_proj": "ffn_down",
        "feed_forward.router": "ffn_gate_inp",
        "feed_forward.experts.gate_proj": "ffn_gate_exps",
        "feed_forward.experts.up_proj": "ffn_up_exps",
        "feed_forward.experts.down_proj": "ffn_down_exps",
        "feed_forward.shared_expert.gate_proj": "ffn_gate_shexp",
        "feed_forward.shared_expert.up_proj": "ffn_up_shexp",
        "feed_forward.shared_expert.down_proj": "ffn_down_shexp",
    },
    tensors=llama4_tensors,
    extra=[llama3_rope_freqs],
    hparams=lambda c: c["text_config"],
)


# Granite 4.0 H (`granitehybrid`): Mamba-2 layers between attention layers, experts with a
# shared expert (or a dense MLP), Granite's multipliers. GraniteHybridModel writes Granite
# MoE's keys (LlamaModel's: Q / K permuted, vocab size, rope dims; the multipliers as
# scales; the shared expert's width), the SSM sizes, `head_count_kv` per layer (0 for a
# Mamba layer), and `rope.scaling.finetuned` for whether attention uses rope (Granite 4.0
# H: no, and then a context of 2**20; Bamba: yes). Mamba2Model's conversions: `A_log` as
# `ssm_a = -exp(A_log)` and `D` as `ssm_d`, both (heads, 1); `dt_bias` as `ssm_dt.bias`;
# the conv kernel squeezed; the gated norm's weight as (groups, inner / groups); the shared
# expert's fused `input_linear` split into `ffn_gate_shexp` / `ffn_up_shexp` (the dense
# variant's into `ffn_gate` / `ffn_up`). The golden is mlx-lm on the weights read back.
GRANITEHYBRID = {
    "model_type": "granitemoehybrid",
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 16,
    "num_hidden_layers": 4,
    "max_position_embeddings": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "attention_bias": False,
    "embedding_multiplier": 12.0,
    "attention_multiplier": 0.25,
    "logits_scaling": 8.0,
    "residual_multiplier": 0.22,
    "layer_types": ["mamba", "attention", "mamba", "mamba"],
    "rms_norm_eps": 1e-5,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "shared_intermediate_size": 24,
    "mamba_n_heads": 4,
    "mamba_d_head": 16,
    "mamba_proj_bias": False,
    "mamba_d_state": 8,
    "mamba_d_conv": 4,
    "mamba_n_groups": 2,
    "mamba_conv_bias": True,
    "position_embedding_type": "nope",
    "tie_word_embeddings": True,
}

# Dense, with rope (Q / K permutation shows), tied: the converter's non-MoE path.
GRANITEHYBRID_DENSE = {
    **{k: v for k, v in GRANITEHYBRID.items()
       if k not in ("num_local_experts", "num_experts_per_tok", "shared_intermediate_size")},
    "intermediate_size": 48,
    "layer_types": ["attention", "mamba", "attention", "mamba"],
    "position_embedding_type": "rope",
    "rope_theta": 10000.0,
    "mamba_conv_bias": False,
}

def mamba2_tensors(c, layer, k, v):
    """GraniteHybridModel's / FalconH1Model's Mamba-2 conversions (`mamba.*`): A as -exp(A_log)
    and D as (heads, 1), the convolution squeezed, the gated norm per group; else None."""
    if k.endswith("mamba.A_log"):
        return [(f"blk.{layer}.ssm_a", (-mx.exp(v))[:, None])]
    if k.endswith("mamba.D"):
        return [(f"blk.{layer}.ssm_d", v[:, None])]
    if k.endswith("mamba.dt_bias"):
        return [(f"blk.{layer}.ssm_dt.bias", v)]
    if k.endswith("mamba.conv1d.weight"):
        return [(f"blk.{layer}.ssm_conv1d.weight", v.squeeze(-1))]
    if k.endswith("mamba.norm.weight"):
        return [(f"blk.{layer}.ssm_norm.weight", v.reshape(c["mamba_n_groups"], -1))]
    return None


def mamba2_back(p, rest, v):
    """`mamba2_tensors` undone for `blk.<layer>.<rest>` (`p` the mlx-lm layer prefix); else None."""
    if rest == "ssm_a":
        return f"{p}.mamba.A_log", mx.log(-v).reshape(-1)
    if rest == "ssm_d":
        return f"{p}.mamba.D", v.reshape(-1)
    if rest == "ssm_dt.bias":
        return f"{p}.mamba.dt_bias", v
    if rest == "ssm_conv1d.weight":
        return f"{p}.mamba.conv1d.weight", v[..., None]
    if rest == "ssm_norm.weight":
        return f"{p}.mamba.norm.weight", v.reshape(-1)
    return None


GRANITEHYBRID_PARTS = {
    "mamba.in_proj": "ssm_in",
    "mamba.out_proj": "ssm_out",
    "mamba.conv1d": "ssm_conv1d",
    "mamba.norm": "ssm_norm",
    "block_sparse_moe.router.layer": "ffn_gate_inp",
    "block_sparse_moe.switch_mlp.gate_proj": "ffn_gate_exps",
    "block_sparse_moe.switch_mlp.up_proj": "ffn_up_exps",
    "block_sparse_moe.switch_mlp.down_proj": "ffn_down_exps",
    "shared_mlp.output_linear": "ffn_down_shexp",
}


def granite_tensors(case, k, v):
    c = case.config
    layer = layer_of(k)
    mamba = mamba2_tensors(c, layer, k, v)
    if mamba is not None:
        return mamba
    if k.endswith("shared_mlp.input_linear.weight"):
        gate, up = mx.split(v, 2, axis=0)
        return [(f"blk.{layer}.ffn_gate_shexp.weight", gate), (f"blk.{layer}.ffn_up_shexp.weight", up)]
    return [(case.gguf_name(k), v)]


def granite_back(case, p, rest, v, loaded):
    c = case.config
    mamba = mamba2_back(p, rest, v)
    if mamba is not None:
        return mamba
    if rest == "ffn_gate_shexp.weight":
        return None
    if rest == "ffn_up_shexp.weight":
        gate = loaded[f"blk.{p.split('.')[2]}.ffn_gate_shexp.weight"]
        return f"{p}.shared_mlp.input_linear.weight", mx.concatenate([gate, v], axis=0)
    if rest in ("attn_q.weight", "attn_k.weight"):
        v = unpermute(v, c["num_attention_heads" if rest == "attn_q.weight" else "num_key_value_heads"])
    module, suffix = rest.rsplit(".", 1)
    return f"{p}.{case.inverse[module]}.{suffix}", v


def granite_meta(c):
    moe = "num_local_experts" in c
    rope = c["position_embedding_type"] != "nope"
    return [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "max_position_embeddings" if rope else 2**20),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv",
            lambda c: [c["num_key_value_heads"] if t == "attention" else 0 for t in c["layer_types"]]),
        f32("rope.freq_base", lambda c: c.get("rope_theta", 10000.0)),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
    ] + ([u32("expert_count", "num_local_experts"), u32("expert_used_count", "num_experts_per_tok")]
         if moe else []) + [
        u32("vocab_size", "vocab_size"),
        u32("rope.dimension_count", head_size),
        f32("attention.scale", "attention_multiplier"),
        f32("embedding_scale", "embedding_multiplier"),
        f32("residual_scale", "residual_multiplier"),
        f32("logit_scale", "logits_scaling"),
    ] + ([u32("expert_shared_feed_forward_length", "shared_intermediate_size")] if moe else []) + [
        u32("ssm.conv_kernel", "mamba_d_conv"),
        u32("ssm.state_size", "mamba_d_state"),
        u32("ssm.group_count", "mamba_n_groups"),
        u32("ssm.inner_size", lambda c: c["mamba_n_heads"] * c["mamba_d_head"]),
        u32("ssm.time_step_rank", "mamba_n_heads"),
        flag("rope.scaling.finetuned", rope),
    ] + GPT2


for _name, _c in [("granitehybrid", GRANITEHYBRID), ("granitehybrid_dense", GRANITEHYBRID_DENSE)]:
    CASES[_name] = Case(_c["model_type"], _c, "granitehybrid", granite_meta(_c), GRANITEHYBRID_PARTS,
                        permute_qk=True, tensors=granite_tensors, read_back=granite_back)


# Gemma 3n's and Gemma 4's names beyond llama's: the sandwich norms and the per-layer inputs.
GEMMA_PER_LAYER = {
        "post_attention_layernorm": "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
        "model.embed_tokens_per_layer": "per_layer_token_embd",
        "model.per_layer_model_projection": "per_layer_model_proj",
        "model.per_layer_projection_norm": "per_layer_proj_norm",
        "per_layer_input_gate": "inp_gate",
        "per_layer_projection": "proj",
        "post_per_layer_input_norm": "post_norm",
}


# Gemma 4 (`gemma4`, the dense E2B / E4B kind): sliding and full layers with their own head
# sizes, per-layer inputs, KV shared by the last layers, double-wide MLPs there, a layer
# scalar. Gemma4Model writes Gemma 3's keys (norms as they are: no `1 + w` in Gemma 4), the
# full layers' head size as key / value length and the sliding ones' as `*_swa`, the shared
# KV layer count, the per-layer input width, the pattern as a per-layer flag list, the
# feed-forward width per layer (doubled on the shared-KV layers), the rope dims of each kind
# and both rope bases; the full layers' proportional rope (a quarter of the head rotated) as
# `rope_freqs`: 1 for each rotated frequency, 1e30 for the others. `layer_scalar` becomes
# `layer_output_scale.weight`.
GEMMA4 = {
    "model_type": "gemma4_text",
    "hidden_size": 32,
    "num_hidden_layers": 5,
    "intermediate_size": 32,
    "num_attention_heads": 4,
    "head_dim": 8,
    "global_head_dim": 16,
    "rms_norm_eps": 1e-6,
    "vocab_size": 96,
    "vocab_size_per_layer_input": 96,
    "num_key_value_heads": 2,
    "num_kv_shared_layers": 2,
    "hidden_size_per_layer_input": 8,
    "sliding_window": 4,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                    "full_attention"],
    "max_position_embeddings": 256,
    "final_logit_softcapping": 30.0,
    "use_double_wide_mlp": True,
    "tie_word_embeddings": True,
    "rope_parameters": {
        "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
        "sliding_attention": {"partial_rotary_factor": 1.0, "rope_theta": 10000.0, "rope_type": "default"},
    },
}


def gemma4_tensors(case, k, v):
    if k.endswith(".layer_scalar"):
        return [(f"blk.{layer_of(k)}.layer_output_scale.weight", v)]
    return [(case.gguf_name(k), v)]


def gemma4_rope_freqs(c, gguf):
    """Gemma4Model.generate_extra_tensors."""
    hd = c["global_head_dim"]
    n_rot = int(hd * c["rope_parameters"]["full_attention"]["partial_rotary_factor"] / 2)
    gguf["rope_freqs.weight"] = mx.array([1.0] * n_rot + [1e30] * (hd // 2 - n_rot), dtype=mx.float32)


def gemma4_ffn(c):
    first_shared = c["num_hidden_layers"] - c["num_kv_shared_layers"]
    n = c["intermediate_size"]
    return [n if i < first_shared else 2 * n for i in range(c["num_hidden_layers"])]


def gemma4_rope(kind, field):
    return lambda c: c["rope_parameters"][kind][field]


CASES["gemma4"] = Case(
    "gemma4_text",
    GEMMA4,
    "gemma4",
    [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", gemma4_ffn),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", "num_key_value_heads"),
        f32("rope.freq_base", gemma4_rope("full_attention", "rope_theta")),
        f32("rope.freq_base_swa", gemma4_rope("sliding_attention", "rope_theta")),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("attention.key_length", "global_head_dim"),
        u32("attention.value_length", "global_head_dim"),
        f32("final_logit_softcapping", "final_logit_softcapping"),
        u32("attention.sliding_window", "sliding_window"),
        u32("attention.shared_kv_layers", "num_kv_shared_layers"),
        u32("embedding_length_per_layer_input", "hidden_size_per_layer_input"),
        arr("attention.sliding_window_pattern",
            lambda c: mx.array([t == "sliding_attention" for t in c["layer_types"]])),
        u32("attention.key_length_swa", "head_dim"),
        u32("attention.value_length_swa", "head_dim"),
        u32("rope.dimension_count", "global_head_dim"),
        u32("rope.dimension_count_swa", lambda c: int(c["head_dim"] * c["rope_parameters"]["sliding_attention"]["partial_rotary_factor"])),
    ] + tokenizer("gemma4"),
    {
        **GEMMA_PER_LAYER,
    },
    tensors=gemma4_tensors,
    extra=[gemma4_rope_freqs],
)


# Gemma 3n (`gemma3n`, its text model): AltUp (four streams, their projections stacked by the
# converter into `altup_proj` / `altup_unembd_proj`), Laurel, per-layer inputs, KV shared
# by the last layers, Gaussian top-k activation sparsity. Gemma3NModel writes Gemma 3's keys
# (norms as they are), the AltUp sizes, the per-layer input width, the shared KV layer count,
# the pattern as per-layer flags, and the sparsity as `activation_sparsity_scale`: the
# standard normal's quantile of each layer's value (torch float32: -inf for 0; mx here).
# `correct_output_scale` becomes `altup_correct_scale.weight`. The file has no
# `altup_coef_clip` (llama.cpp does not clip): the seeded coefficients are far inside 120.
GEMMA3N_TEXT = {
    "model_type": "gemma3n_text",
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "head_dim": 8,
    "rms_norm_eps": 1e-6,
    "vocab_size": 96,
    "num_key_value_heads": 2,
    "num_kv_shared_layers": 2,
    "vocab_size_per_layer_input": 96,
    "sliding_window": 4,
    "max_position_embeddings": 256,
    "rope_local_base_freq": 10000.0,
    "rope_theta": 1000000.0,
    "final_logit_softcapping": 30.0,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
    "activation_sparsity_pattern": [0.95, 0.95, 0.0, 0.0],
    "hidden_size_per_layer_input": 8,
    "altup_num_inputs": 4,
    "altup_coef_clip": 120.0,
    "altup_correct_scale": True,
    "altup_active_idx": 0,
    "laurel_rank": 4,
}


def gemma3n_tensors(case, k, v):
    k = k.removeprefix("model.language_model.")
    if k.endswith(".altup.correct_output_scale"):
        return [(f"blk.{k.split('.')[1]}.altup_correct_scale.weight", v)]
    for stack, name in [("altup_projections", "altup_proj"), ("altup_unembed_projections", "altup_unembd_proj")]:
        if k.startswith(stack + "."):
            # Gemma3NModel stacks the three projections (0, 1, 2) into one tensor.
            case.stacks.setdefault(name, {})[int(k.split(".")[1])] = v
            if len(case.stacks[name]) < 3:
                return []
            return [(f"{name}.weight", mx.stack([case.stacks[name][i] for i in range(3)]))]
    return [(case.gguf_name("model." + k), v)]


def gemma3n_meta():
    rope_theta = lambda c: c["rope_theta"]  # noqa: E731
    return [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", "num_key_value_heads"),
        f32("rope.freq_base", rope_theta),
        f32("rope.freq_base_swa", "rope_local_base_freq"),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("attention.key_length", "head_dim"),
        u32("attention.value_length", "head_dim"),
        f32("final_logit_softcapping", "final_logit_softcapping"),
        u32("attention.sliding_window", "sliding_window"),
        u32("altup.active_idx", "altup_active_idx"),
        u32("altup.num_inputs", "altup_num_inputs"),
        u32("embedding_length_per_layer_input", "hidden_size_per_layer_input"),
        u32("attention.shared_kv_layers", "num_kv_shared_layers"),
        arr("activation_sparsity_scale", lambda c: mx.sqrt(mx.array(2.0)) * mx.erfinv(
            2 * mx.array(c["activation_sparsity_pattern"], dtype=mx.float32) - 1)),
        arr("attention.sliding_window_pattern",
            lambda c: mx.array([t == "sliding_attention" for t in c["layer_types"]])),
    ] + SPM


CASES["gemma3n"] = Case(
    "gemma3n",
    {"model_type": "gemma3n", "text_config": GEMMA3N_TEXT},
    "gemma3n",
    gemma3n_meta(),
    {
        **GEMMA_PER_LAYER,
        "altup.correction_coefs": "altup_correct_coef",
        "altup.prediction_coefs": "altup_predict_coef",
        "altup.modality_router": "altup_router",
        "altup.router_norm": "altup_router_norm",
        "laurel.linear_left": "laurel_l",
        "laurel.linear_right": "laurel_r",
        "laurel.post_laurel_norm": "laurel_post_norm",
    },
    tensors=gemma3n_tensors,
    hparams=lambda c: c["text_config"],
)
CASES["gemma3n"].stacks = {}


# RWKV-7 (`rwkv7`, fla-hub's layout as mlx-lm reads it): Rwkv7Model's filter renames
# (`attn` -> `attention`, `ffn` -> `feed_forward`, `ffn_norm` -> `ln2`, `g_norm` -> `ln_x`,
# `*_lora.lora.0/2.weight` -> `*1` / `*2`, `*_lora.lora.2.bias` -> `*0`), the six token-shift
# mixes stacked into `time_mix_lerp_fused` (r, w, k, v, a, g), every other tensor squeezed
# (`k_k`, `k_a`, `ln_x` are flat in the checkpoint, which mlx-lm's sanitize reshapes per
# head), `r_k` flattened, and layer 0's missing value-residual LoRA written as copies of its
# `a` LoRA. Metadata: the LayerNorm epsilon, the head size, the four LoRA ranks, the width,
# a context of 2**20 and a head count of 0.
RWKV7 = {
    "model_type": "rwkv7",
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "norm_eps": 1e-5,
    "head_dim": 8,
    "num_hidden_layers": 2,
    "a_low_rank_dim": 8,
    "v_low_rank_dim": 4,
    "gate_low_rank_dim": 12,
    "decay_low_rank_dim": 8,
    "tie_word_embeddings": False,
}

RWKV7_PARTS = {
    "model.embeddings": "token_embd",
    "attn_norm": "attn_norm",
    "ffn_norm": "attn_norm_2",
    "attn.r_proj": "time_mix_receptance",
    "attn.k_proj": "time_mix_key",
    "attn.v_proj": "time_mix_value",
    "attn.o_proj": "time_mix_output",
    "attn.g_norm": "time_mix_ln",
    "ffn.key": "channel_mix_key",
    "ffn.value": "channel_mix_value",
}


def rwkv7_tensors(case, k, v):
    layer = layer_of(k)
    if k.startswith("model.layers.0.pre_norm."):
        return [(f"token_embd_norm.{k.rsplit('.', 1)[1]}", v)]
    if ".attn.x_" in k:
        mixes = case.stacks.setdefault(layer, {})
        mixes[k.rsplit("_", 1)[1]] = v
        if len(mixes) < 6:
            return []
        return [(f"blk.{layer}.time_mix_lerp_fused.weight", mx.stack([mixes[x] for x in "rwkvag"]))]
    if ".attn." in k and "_lora.lora." in k:
        which = k.split(".attn.")[1][0]
        tail = k.split("_lora.lora.")[1]
        n = {"0.weight": "1", "2.weight": "2", "2.bias": "0"}[tail]
        out = [(f"blk.{layer}.time_mix_{which}{n}.weight", v)]
        if layer == "0" and which == "a":
            out.append((f"blk.{layer}.time_mix_v{n}.weight", v))
        return out
    if k.endswith((".attn.k_k", ".attn.k_a", ".attn.r_k")):
        return [(f"blk.{layer}.time_mix_{k.rsplit('.', 1)[1]}.weight", v.reshape(-1))]
    if k.endswith(".attn.g_norm.weight") or k.endswith(".attn.g_norm.bias"):
        return [(f"blk.{layer}.time_mix_ln.{k.rsplit('.', 1)[1]}", v.reshape(-1))]
    if k.endswith(".ffn.x_k"):
        return [(f"blk.{layer}.channel_mix_lerp_k.weight", v.reshape(-1))]
    return [(case.gguf_name(k), v)]


CASES["rwkv7"] = Case(
    "rwkv7",
    RWKV7,
    "rwkv7",
    [
        u32("context_length", 1048576),
        u32("embedding_length", "hidden_size"),
        u32("block_count", "num_hidden_layers"),
        f32("attention.layer_norm_epsilon", "norm_eps"),
        u32("wkv.head_size", "head_dim"),
        u32("attention.decay_lora_rank", "decay_low_rank_dim"),
        u32("attention.iclr_lora_rank", "a_low_rank_dim"),
        u32("attention.value_residual_mix_lora_rank", "v_low_rank_dim"),
        u32("attention.gate_lora_rank", "gate_low_rank_dim"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", 0),
    ] + tokenizer("rwkv"),
    RWKV7_PARTS,
    tensors=rwkv7_tensors,
)
CASES["rwkv7"].stacks = {}


# StableLM (`stablelm`, StableLM 2 / Zephyr): LayerNorms with bias, partial rope. StableLMModel
# writes no rope base (llama.cpp's default 10000 applies) and `use_parallel_residual`; the
# per-head q / k LayerNorms (`qk_layernorm`, StableLM 2 12B) are stacked into one
# (heads, head_dim) tensor each. Two files: sequential with qkv bias and the per-head norms,
# and the parallel residual block (no `ffn_norm`).
def stablelm_tensors(case, k, v):
    if ".q_layernorm.norms." in k or ".k_layernorm.norms." in k:
        which = "q" if ".q_layernorm." in k else "k"
        layer = layer_of(k)
        norms = case.stacks.setdefault((layer, which), {})
        norms[int(k.split(".norms.")[1].split(".")[0])] = v
        n = case.config["num_attention_heads" if which == "q" else "num_key_value_heads"]
        if len(norms) < n:
            return []
        return [(f"blk.{layer}.attn_{which}_norm.weight", mx.stack([norms[i] for i in range(n)]))]
    return [(case.gguf_name(k), v)]


STABLELM_META = [
    u32("context_length", "max_position_embeddings"),
    u32("embedding_length", "hidden_size"),
    u32("block_count", "num_hidden_layers"),
    u32("feed_forward_length", "intermediate_size"),
    u32("rope.dimension_count", lambda c: int(c["partial_rotary_factor"] * head_size(c))),
    u32("attention.head_count", "num_attention_heads"),
    u32("attention.head_count_kv", "num_key_value_heads"),
    flag("use_parallel_residual", "use_parallel_residual"),
    f32("attention.layer_norm_epsilon", "layer_norm_eps"),
] + GPT2

for _name, _extra in [
    ("stablelm", dict(use_qkv_bias=True, qk_layernorm=True, use_parallel_residual=False)),
    ("stablelm_parallel", dict(use_qkv_bias=False, use_parallel_residual=True)),
]:
    CASES[_name] = Case(
        "stablelm",
        {k: v for k, v in cfg("stablelm", partial_rotary_factor=0.25, layer_norm_eps=1e-5, tie_word_embeddings=False,
                              **_extra).items() if k != "rms_norm_eps"},
        "stablelm",
        STABLELM_META,
        tensors=stablelm_tensors,
    )
    CASES[_name].stacks = {}


# BitNet b1.58 (`bitnet`): BitnetModel is TextModel (SentencePiece vocabulary) plus linear rope
# scaling of factor 1, and writes each attention / MLP projection as its `weight_quant` leaves
# the float checkpoint: round(w * iscale).clamp(-1, 1) / iscale in float32 (iscale = 1 / mean
# |w|): ternary values times one scale. The seeded float weights (per name) go through that;
# mlx-lm's bitnet holds packed ternary codes (four output rows a byte) and `weight_scale`, so
# the golden packs back what the file holds (the scale: the non-zero magnitude) into a fresh
# model, recorded on the unpacked weights (mlx-lm runs BitLinear only in a Metal kernel;
# goldens_dense2's `unpack_bitlinear`).
BITNET_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def bitnet_linear(k):
    return k.rsplit(".", 2)[-2] in BITNET_LINEARS


def bitnet_tensors(case, k, v):
    if not bitnet_linear(k):
        return [(case.gguf_name(k), v)]
    if not k.endswith(".weight"):
        return []
    rows, cols = v.shape
    w = mx.random.normal((4 * rows, cols), key=mx.random.key(zlib.crc32(k.encode()))) * 0.3
    scale = mx.maximum(mx.mean(mx.abs(w)), 1e-5)
    iscale = 1 / scale
    return [(case.gguf_name(k), mx.clip(mx.round(w * iscale), -1, 1) / iscale)]


def bitnet_back(case, p, rest, v, loaded):
    module, suffix = rest.rsplit(".", 1)
    name = f"{p}.{case.inverse[module]}"
    if not bitnet_linear(f"{name}.{suffix}"):
        return f"{name}.{suffix}", v
    s = mx.max(mx.abs(v))
    assert mx.all((v == 0) | (v == s) | (v == -s)).item(), name
    codes = mx.where(v > 0, 2, mx.where(v < 0, 0, 1)).astype(mx.uint8)
    codes = codes.reshape(4, v.shape[0] // 4, v.shape[1])
    packed = sum(codes[i] << (2 * i) for i in range(4)).astype(mx.uint8)
    return [(f"{name}.weight", packed), (f"{name}.weight_scale", s.reshape(1).astype(v.dtype))]


def bitnet_serve(model):
    from goldens_dense2 import unpack_bitlinear

    return unpack_bitlinear(model)


CASES["bitnet"] = Case(
    "bitnet",
    cfg("bitnet", head_dim=8),
    "bitnet",
    text_model(head_dim="head_dim")[:-len(GPT2)] + [
        text("rope.scaling.type", "linear"),
        f32("rope.scaling.factor", 1.0),
    ] + SPM,
    {"self_attn.attn_sub_norm": "attn_sub_norm", "mlp.ffn_sub_norm": "ffn_sub_norm"},
    tensors=bitnet_tensors,
    read_back=bitnet_back,
    inexact=bitnet_linear,
    serve=bitnet_serve,
)


# Deci / Nemotron-NAS (`deci`, Llama-3_1-Nemotron-51B): DeciModel writes per layer the query
# heads (0 without attention), the KV heads (0 also for the linear stand-in) and the MLP
# widths (`_ffn_mult_to_intermediate_size`, 0 without an MLP), then the block count, context,
# width, RMS eps, key / value lengths, vocabulary size and rope width; Q / K permuted with the
# layer's head counts; the linear stand-in `self_attn.linear_attn` as `attn_output`; Llama
# 3's rope as `rope_freqs`; a SentencePiece vocabulary (a size other than 128256). llama.cpp
# has no linear MLP stand-in. mlx-lm's type is `nemotron-nas`.
DECI_BLOCKS = [
    {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 1.0}},
    {"attention": {"no_op": True}, "ffn": {"ffn_mult": 0.5}},
    {"attention": {"replace_with_linear": True}, "ffn": {"no_op": True}},
    {"attention": {"n_heads_in_group": 4}, "ffn": {"ffn_mult": 7.0}},
]


def deci_heads(c):
    return [0 if b["attention"].get("no_op") else c["num_attention_heads"] for b in c["block_configs"]]


def deci_kv(c):
    g = [b["attention"].get("n_heads_in_group") for b in c["block_configs"]]
    return [0 if n is None else c["num_attention_heads"] // n for n in g]


def deci_ffn(c):
    from importlib import import_module

    m = import_module("mlx_lm.models.nemotron-nas")
    return [0 if b["ffn"].get("no_op") else m._ffn_mult_to_intermediate_size(b["ffn"]["ffn_mult"], c["hidden_size"])
            for b in c["block_configs"]]


def deci_tensors(case, k, v):
    if ".self_attn.linear." in k:
        return [(f"blk.{layer_of(k)}.attn_output.{k.rsplit('.', 1)[1]}", v)]
    if ".q_proj." in k or ".k_proj." in k:
        c, layer = case.config, int(layer_of(k))
        v = permute(v, c["num_attention_heads"] if ".q_proj." in k else deci_kv(c)[layer])
    return [(case.gguf_name(k), v)]


CASES["deci"] = Case(
    "nemotron-nas",
    cfg("nemotron-nas", hidden_size=64, num_hidden_layers=4, block_configs=DECI_BLOCKS,
        tie_word_embeddings=False,
        rope_scaling={**LLAMA3_ROPE, "factor": 8.0, "original_max_position_embeddings": 2048}),
    "deci",
    [
        f32("rope.freq_base", "rope_theta"),
        u32("attention.head_count_kv", deci_kv),
        u32("attention.head_count", deci_heads),
        u32("feed_forward_length", deci_ffn),
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("attention.key_length", head_size),
        u32("attention.value_length", head_size),
        u32("vocab_size", "vocab_size"),
        u32("rope.dimension_count", head_size),
    ] + SPM,
    tensors=deci_tensors,
    extra=[llama3_rope_freqs],
)


# Qwen2-VL / Qwen3-VL's text towers (`qwen2vl`, `qwen3vl`): Qwen2VLModel is TextModel (qkv
# bias), Qwen3VLTextModel Qwen3Model (per-head q / k norms, the head size) plus the deepstack
# layer count; both write the M-RoPE sections (padded to 4) where TextModel writes rope
# scaling. mlx-lm's qwen2_vl / qwen3_vl wrap qwen2 / qwen3 under `language_model.` and turn
# M-RoPE into plain rope, as text positions make it.
def qwen_vl_tensors(case, k, v):
    k = k.removeprefix("language_model.")
    if case.config.get("tie_word_embeddings") and k == "lm_head.weight":
        return []
    return [(case.gguf_name(k), v)]


def qwen_vl_meta(deepstack):
    tm = text_model(head_dim="head_dim" if deepstack else None)
    sections = arr("rope.dimension_sections",
                   lambda c: mx.array(c["rope_scaling"]["mrope_section"] + [0], dtype=mx.int32))
    at = [e[1] for e in tm].index("rope.freq_base")
    meta = tm[:at] + [sections] + tm[at:]
    if deepstack:
        meta.insert(meta.index(GPT2[0]), u32("n_deepstack_layers", 3))
    return meta


for _name, _type, _extra in [
    ("qwen2vl", "qwen2_vl", dict(tie_word_embeddings=False)),
    ("qwen3vl", "qwen3_vl", dict(head_dim=16, tie_word_embeddings=True)),
]:
    CASES[_name] = Case(
        _type,
        cfg(_type, rope_theta=1000000.0,
            rope_scaling={"type": "mrope", "mrope_section": [2, 1, 1] if _name == "qwen2vl" else [4, 2, 2]},
            **_extra),
        _name,
        qwen_vl_meta(_name == "qwen3vl"),
        {"self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"},
        tensors=qwen_vl_tensors,
    )


# Qwen (`qwen`, Qwen-7B's QWenLMHeadModel): QwenModel is TextModel's keys (the whole MLP
# width as `feed_forward_length`, each of `w1` / `w2` half of it; Qwen's `layer_norm_epsilon`
# as the LayerNorm key) and gguf-py's map: fused `c_attn` with bias, `w1` up, `w2` gate.
CASES["qwen"] = Case(
    "qwen",
    {"model_type": "qwen", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2,
     "kv_channels": 8, "intermediate_size": 128, "layer_norm_epsilon": 1e-6, "no_bias": True,
     "vocab_size": 96, "max_position_embeddings": 256, "tie_word_embeddings": False},
    "qwen",
    [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        f32("attention.layer_norm_epsilon", "layer_norm_epsilon"),
    ] + GPT2,
    {
        "transformer.wte": "token_embd",
        "transformer.ln_f": "output_norm",
        "ln_1": "attn_norm",
        "ln_2": "ffn_norm",
        "attn.c_attn": "attn_qkv",
        "attn.c_proj": "attn_output",
        "mlp.w1": "ffn_up",
        "mlp.w2": "ffn_gate",
        "mlp.c_proj": "ffn_down",
    },
    prefix="transformer.h",
)


# PLaMo (`plamo`, PLaMo-13B): PlamoModel writes a fixed context of 4096 and its KV head count
# (the query heads over `n_shared_head`), and shuffles `attn_q`'s rows and `attn_output`'s
# columns from (shared, kv, head_dim) to (kv, shared, head_dim) so that ggml's GQA broadcast
# pairs each query head with mlx-lm's tiled key head (the converter spells it for 13B's 8 x 5
# x 128; here the same shuffle at this size). One norm per layer (parallel attention and MLP).
def plamo_tensors(case, k, v):
    c = case.config
    shared = c["n_shared_head"]
    kv = c["num_attention_heads"] // shared
    hd = c["hidden_size"] // c["num_attention_heads"]
    if k.endswith(".self_attn.q_proj.weight"):
        v = v.reshape(shared, kv, hd, -1).transpose(1, 0, 2, 3).reshape(v.shape)
    elif k.endswith(".self_attn.o_proj.weight"):
        v = v.reshape(-1, shared, kv, hd).transpose(0, 2, 1, 3).reshape(v.shape)
    return [(case.gguf_name(k), v)]


CASES["plamo"] = Case(
    "plamo",
    {"model_type": "plamo", "hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64,
     "num_attention_heads": 4, "n_shared_head": 2, "rms_norm_eps": 1e-6, "vocab_size": 96,
     "tie_word_embeddings": False},
    "plamo",
    [
        u32("context_length", 4096),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("block_count", "num_hidden_layers"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", lambda c: c["num_attention_heads"] // c["n_shared_head"]),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
    ] + SPM,
    {"norm": "attn_norm"},
    prefix="model.layers.layers",
    tensors=plamo_tensors,
)


# PLaMo 3 (`plamo3`): Plamo3Model writes TextModel's keys (the local rope base as
# `rope.freq_base_swa`, the head size) and the vocabulary size, window and its period, and
# stores each norm with mlx-lm's runtime offset added (`+ 1`; `+ 1/5` after the mixer, `+ 1/5 **
# 1.5` after the MLP): read back with the offsets taken off again (`undo`).
PLAMO3_OFFSETS = {
    "attn_post_norm.weight": 1.0 / 5,
    "ffn_post_norm.weight": 1.0 / (5**1.5),
}


def plamo3_offset(k):
    if k.startswith("blk.") and k.split(".", 2)[2] in PLAMO3_OFFSETS:
        return PLAMO3_OFFSETS[k.split(".", 2)[2]]
    return 1.0 if k.endswith("norm.weight") else 0.0


def plamo3_tensors(case, k, v):
    g = case.gguf_name(k)
    off = plamo3_offset(g)
    return [(g, v + off if off else v)]


def plamo3_back(case, p, rest, v, loaded):
    module, suffix = rest.rsplit(".", 1)
    return f"model.layers.layers.{p.split('.')[2]}.{case.inverse[module]}.{suffix}", v


CASES["plamo3"] = Case(
    "plamo3",
    {"model_type": "plamo3", "hidden_size": 32, "num_hidden_layers": 4, "intermediate_size": 64,
     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
     "vocab_size": 96, "max_position_embeddings": 256, "window_size": 4,
     "sliding_window_pattern": 2, "rope_theta": 1000000.0, "rope_local_theta": 10000.0,
     "tie_word_embeddings": False},
    "plamo3",
    [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", "num_key_value_heads"),
        f32("rope.freq_base", "rope_theta"),
        f32("rope.freq_base_swa", "rope_local_theta"),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("attention.key_length", "head_dim"),
        u32("attention.value_length", "head_dim"),
        u32("vocab_size", "vocab_size"),
        u32("attention.sliding_window", "window_size"),
        u32("attention.sliding_window_pattern", "sliding_window_pattern"),
    ] + tokenizer("plamo2"),
    {
        "pre_mixer_norm": "attn_norm",
        "mixer.qkv_proj": "attn_qkv",
        "mixer.o_proj": "attn_output",
        "mixer.q_norm": "attn_q_norm",
        "mixer.k_norm": "attn_k_norm",
        "post_mixer_norm": "attn_post_norm",
        "pre_mlp_norm": "ffn_norm",
        "mlp.gate_up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "post_mlp_norm": "ffn_post_norm",
    },
    prefix="model.layers.layers",
    tensors=plamo3_tensors,
    read_back=plamo3_back,
    undo=lambda k, v: v - plamo3_offset(k) if plamo3_offset(k) else v,
    inexact=lambda k: k.endswith("norm.weight"),
)


# Talkie (`talkie`): TalkieModel negates the second half of each query and key head's rows
# (its rope turns the other way), writes the gains as `attn_output.scale` / `ffn_down.scale`,
# the embedding skip as `layer_output_scale`, the query head gain as `attn_q_norm` (n_head, 1),
# the bare `lm_head` as `output.weight` and its gain as the `logit_scale` key; its norms have
# no weights and its eps is float32's (the key it writes).
TALKIE_GAIN = {}


def talkie_tensors(case, k, v):
    c = case.config
    layer = k.split(".")[2] if k.startswith("model.blocks.") else None
    if k == "lm_head_gain.w_g":
        TALKIE_GAIN["w_g"] = v.item()
        return []
    if k == "lm_head":
        return [("output.weight", v)]
    if k.endswith((".attn.attn_query.weight", ".attn.attn_key.weight")):
        hd = c["head_dim"]
        signs = mx.concatenate([mx.ones((hd // 2,)), -mx.ones((hd // 2,))]).reshape(1, hd, 1)
        v = (v.reshape(-1, hd, v.shape[-1]) * signs).reshape(v.shape)
    elif k.endswith(".attn.head_gain.head_g"):
        return [(f"blk.{layer}.attn_q_norm.weight", v[:, None])]
    elif k.endswith(".attn_gain.a_g"):
        return [(f"blk.{layer}.attn_output.scale", v)]
    elif k.endswith(".mlp_gain.a_g"):
        return [(f"blk.{layer}.ffn_down.scale", v)]
    elif k.endswith(".embed_skip.a_g"):
        return [(f"blk.{layer}.layer_output_scale.weight", v)]
    return [(case.gguf_name(k), v)]


CASES["talkie"] = Case(
    "talkie",
    {"model_type": "talkie", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
     "head_dim": 8, "intermediate_size": 64, "vocab_size": 96, "rope_theta": 1000000.0,
     "max_position_embeddings": 256, "tie_word_embeddings": False},
    "talkie",
    [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        f32("rope.freq_base", "rope_theta"),
        u32("attention.key_length", "head_dim"),
        u32("attention.value_length", "head_dim"),
        f32("attention.layer_norm_rms_epsilon", 1.1920928955078125e-07),
        f32("logit_scale", lambda c: TALKIE_GAIN["w_g"]),
    ] + GPT2,
    {
        "model.embed": "token_embd",
        "attn.attn_query": "attn_q",
        "attn.attn_key": "attn_k",
        "attn.attn_value": "attn_v",
        "attn.attn_resid": "attn_output",
        "mlp.mlp_gate": "ffn_gate",
        "mlp.mlp_linear": "ffn_up",
        "mlp.mlp_resid": "ffn_down",
    },
    prefix="model.blocks",
    tensors=talkie_tensors,
)


# Spark 2.5 (`spark2_5`): TextModel's keys (the full layers' rope base, the sliding layers' as
# `rope.freq_base_swa`, the head size) plus the vocabulary size, the window, the per-layer
# sliding flags and each layer kind's rotated width; fused `q_k_v_proj`, the head-wise sigmoid
# gate `g_proj` as `attn_gate`.
CASES["spark2_5"] = Case(
    "spark2_5",
    {"model_type": "spark2_5", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 96,
     "sliding_window": 4, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
     "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
     "rope_parameters": {
         "full_attention": {"rope_theta": 1000000.0, "partial_rotary_factor": 0.5},
         "sliding_attention": {"rope_theta": 10000.0, "partial_rotary_factor": 1.0},
     },
     "tie_word_embeddings": False},
    "spark2_5",
    [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", "num_key_value_heads"),
        f32("rope.freq_base", lambda c: c["rope_parameters"]["full_attention"]["rope_theta"]),
        f32("rope.freq_base_swa", lambda c: c["rope_parameters"]["sliding_attention"]["rope_theta"]),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("attention.key_length", "head_dim"),
        u32("attention.value_length", "head_dim"),
        u32("vocab_size", "vocab_size"),
        u32("attention.sliding_window", "sliding_window"),
        window_pattern(lambda c: [t == "sliding_attention" for t in c["layer_types"]]),
        u32("rope.dimension_count", lambda c: int(c["head_dim"] * c["rope_parameters"]["full_attention"]["partial_rotary_factor"])),
        u32("rope.dimension_count_swa", lambda c: int(c["head_dim"] * c["rope_parameters"]["sliding_attention"]["partial_rotary_factor"])),
    ] + GPT2,
    {
        "model.embedding": "token_embd",
        "self_attn.q_k_v_proj": "attn_qkv",
        "self_attn.g_proj": "attn_gate",
        "self_attn.out_proj": "attn_output",
    },
)


# OLMo (`olmo`, OLMo 1 / 1.7 as transformers' OlmoForCausalLM): OlmoModel writes TextModel's
# keys and a LayerNorm eps of 1e-5, Q / K permuted as LlamaModel's; transformers' q / k / v and
# gate / up are mlx-lm's (AI2 layout) fused `att_proj` and `ff_proj` ([up | gate]); no norm
# weights (non-parametric LayerNorms).
def olmo_tensors(case, k, v):
    c = case.config
    if k == "model.transformer.ff_out.weight":
        return [("output.weight", v)]
    if k == "model.transformer.wte.weight":
        return [("token_embd.weight", v)]
    layer = k.split(".")[3]
    if k.endswith(".att_proj.weight"):
        q, kk, vv = mx.split(v, 3, axis=0)
        n = c["n_heads"]
        return [(f"blk.{layer}.attn_q.weight", permute(q, n)), (f"blk.{layer}.attn_k.weight", permute(kk, n)),
                (f"blk.{layer}.attn_v.weight", vv)]
    if k.endswith(".ff_proj.weight"):
        up, gate = mx.split(v, 2, axis=0)
        return [(f"blk.{layer}.ffn_gate.weight", gate), (f"blk.{layer}.ffn_up.weight", up)]
    if k.endswith(".attn_out.weight"):
        return [(f"blk.{layer}.attn_output.weight", v)]
    if k.endswith(".ff_out.weight"):
        return [(f"blk.{layer}.ffn_down.weight", v)]
    raise KeyError(k)


CASES["olmo"] = Case(
    "olmo",
    {"model_type": "olmo", "d_model": 32, "n_layers": 2, "mlp_hidden_size": 128, "n_heads": 4,
     "vocab_size": 96, "embedding_size": 96, "rope_theta": 10000.0, "weight_tying": False,
     "max_position_embeddings": 256, "tie_word_embeddings": False},
    "olmo",
    [
        u32("block_count", "n_layers"),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "d_model"),
        u32("feed_forward_length", lambda c: c["mlp_hidden_size"] // 2),
        u32("attention.head_count", "n_heads"),
        u32("attention.head_count_kv", "n_heads"),
        f32("rope.freq_base", "rope_theta"),
        f32("attention.layer_norm_epsilon", 1e-5),
    ] + GPT2,
    tensors=olmo_tensors,
)


# Mellum (`mellum`, JetBrains Mellum 2): MellumModel writes TextModel's keys (the full layers'
# rope base, the sliding ones' as `rope.freq_base_swa`, the experts, the head size), the
# experts' width, the window and the per-layer sliding flags; experts stacked; q / k norms.
CASES["mellum"] = Case(
    "mellum",
    {"model_type": "mellum", "hidden_size": 32, "num_hidden_layers": 4, "intermediate_size": 64,
     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_experts": 4,
     "num_experts_per_tok": 2, "moe_intermediate_size": 16, "rms_norm_eps": 1e-6,
     "vocab_size": 96, "max_position_embeddings": 256, "norm_topk_prob": True, "sliding_window": 4,
     "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
     "rope_parameters": {"full_attention": {"rope_theta": 1000000.0},
                         "sliding_attention": {"rope_theta": 10000.0}},
     "tie_word_embeddings": False},
    "mellum",
    [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", "num_key_value_heads"),
        f32("rope.freq_base", lambda c: c["rope_parameters"]["full_attention"]["rope_theta"]),
        f32("rope.freq_base_swa", lambda c: c["rope_parameters"]["sliding_attention"]["rope_theta"]),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("expert_count", "num_experts"),
        u32("expert_used_count", "num_experts_per_tok"),
        u32("attention.key_length", "head_dim"),
        u32("attention.value_length", "head_dim"),
        u32("expert_feed_forward_length", "moe_intermediate_size"),
        u32("attention.sliding_window", "sliding_window"),
        window_pattern(lambda c: [t == "sliding_attention" for t in c["layer_types"]]),
    ] + GPT2,
    EXPERTS,
)


# EXAONE MoE (`exaone-moe`, K-EXAONE): ExaoneMoEModel is Exaone4Model's keys (TextModel's with
# the expert groups and the sigmoid gating function, the vocabulary size, the window and the
# per-layer sliding flags) plus the experts' and shared experts' widths, their scale and
# renormalization, the dense first blocks, no MTP layers and rope scaling "none"; experts
# stacked, the correction bias as `exp_probs_b`.
EXAONE_MOE = {
    "model_type": "exaone_moe", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 96,
    "num_experts": 8, "num_experts_per_tok": 2, "num_shared_experts": 1, "moe_intermediate_size": 16,
    "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
    "rms_norm_eps": 1e-6, "max_position_embeddings": 256, "sliding_window": 4,
    "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
    "is_moe_layer": [False, True, True, True], "first_k_dense_replace": 1, "rope_theta": 1000000.0,
    "scoring_func": "sigmoid", "tie_word_embeddings": False,
}

CASES["exaone_moe"] = Case(
    "exaone_moe",
    EXAONE_MOE,
    "exaone-moe",
    [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", "num_key_value_heads"),
        f32("rope.freq_base", "rope_theta"),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("expert_count", "num_experts"),
        u32("expert_used_count", "num_experts_per_tok"),
        u32("expert_group_count", "n_group"),
        u32("expert_group_used_count", "topk_group"),
        u32("expert_gating_func", 2),
        u32("attention.key_length", "head_dim"),
        u32("attention.value_length", "head_dim"),
        u32("vocab_size", "vocab_size"),
        u32("attention.sliding_window", "sliding_window"),
        window_pattern(lambda c: [t == "sliding_attention" for t in c["layer_types"]]),
        u32("expert_feed_forward_length", "moe_intermediate_size"),
        u32("expert_shared_count", "num_shared_experts"),
        u32("expert_shared_feed_forward_length", lambda c: c["moe_intermediate_size"] * c["num_shared_experts"]),
        f32("expert_weights_scale", "routed_scaling_factor"),
        flag("expert_weights_norm", "norm_topk_prob"),
        u32("leading_dense_block_count", "first_k_dense_replace"),
        u32("nextn_predict_layers", 0),
        text("rope.scaling.type", "none"),
    ] + GPT2,
    {**EXPERTS, **DEEPSEEK_MOE},
)


# OpenELM (`openelm`): OpenELMModel writes the per-layer query / KV head counts and MLP widths
# (make_divisible(multiplier * model_dim, divisor)) as lists, the rope base, an RMS eps of
# 1e-6, a full-head rope width and the head size; `proj_1` split into gate and up.
def openelm_tensors(case, k, v):
    if k.endswith(".ffn.proj_1.weight"):
        layer = k.split(".")[2]
        gate, up = mx.split(v, 2, axis=0)
        return [(f"blk.{layer}.ffn_gate.weight", gate), (f"blk.{layer}.ffn_up.weight", up)]
    return [(case.gguf_name(k), v)]


def openelm_ffn(c):
    from mlx_lm.models.openelm import make_divisible

    return [int(make_divisible(m * c["model_dim"], divisor=c["ffn_dim_divisor"])) for m in c["ffn_multipliers"]]


CASES["openelm"] = Case(
    "openelm",
    {"model_type": "openelm", "head_dim": 8, "num_transformer_layers": 2, "model_dim": 32,
     "vocab_size": 96, "ffn_dim_divisor": 8, "num_query_heads": [4, 2], "num_kv_heads": [2, 1],
     "ffn_multipliers": [0.5, 1.3], "share_input_output_layers": False,
     "rope_freq_constant": 10000.0, "max_context_length": 256, "tie_word_embeddings": False},
    "openelm",
    [
        u32("block_count", "num_transformer_layers"),
        u32("context_length", "max_context_length"),
        u32("embedding_length", "model_dim"),
        u32("feed_forward_length", openelm_ffn),
        u32("attention.head_count", "num_query_heads"),
        u32("attention.head_count_kv", "num_kv_heads"),
        f32("rope.freq_base", "rope_freq_constant"),
        f32("attention.layer_norm_rms_epsilon", 1e-6),
        u32("rope.dimension_count", "head_dim"),
        u32("attention.key_length", "head_dim"),
        u32("attention.value_length", "head_dim"),
    ] + SPM,
    {
        "transformer.token_embeddings": "token_embd",
        "transformer.norm": "output_norm",
        "attn.qkv_proj": "attn_qkv",
        "attn.out_proj": "attn_output",
        "attn.q_norm": "attn_q_norm",
        "attn.k_norm": "attn_k_norm",
        "ffn.proj_2": "ffn_down",
        "ffn_norm": "ffn_norm",
        "attn_norm": "attn_norm",
    },
    prefix="transformer.layers",
    tensors=openelm_tensors,
)


# Muse Glimmer (`muse-glimmer`, text tower): MuseGlimmerModel stores the four centred layer
# norms with their `1 +` added, Q / K in llama.cpp's interleaved rope layout (LlamaModel's
# permutation), the scaleless q / k norms as synthesized `attn_q_norm` (qk_scale_factor) and
# `attn_k_norm` (ones) tensors, the output gate as `attn_gate`; `output_multiplier` as
# `logit_scale`, the final soft-capping, the window and the per-layer sliding flags (rope on
# the sliding layers only). Read back with the `1 +` taken off and the synthesized norms dropped.
MUSE_NORMS = ("attn_norm.weight", "attn_post_norm.weight", "ffn_norm.weight", "ffn_post_norm.weight")


def muse_offset(k):
    return 1.0 if k.startswith("blk.") and k.split(".", 2)[2] in MUSE_NORMS else 0.0


def muse_tensors(case, k, v):
    c = case.config
    g = case.gguf_name(k)
    out = [(g, v + 1.0 if muse_offset(g) else v)]
    if k.endswith(".self_attn.q_proj.weight"):
        layer = k.split(".")[2]
        hd = c["head_dim"]
        out += [(f"blk.{layer}.attn_q_norm.weight", mx.full((hd,), c["qk_scale_factor"], dtype=mx.float32)),
                (f"blk.{layer}.attn_k_norm.weight", mx.ones((hd,), dtype=mx.float32))]
    return out


def muse_back(case, p, rest, v, loaded):
    if rest in ("attn_q_norm.weight", "attn_k_norm.weight"):
        return None
    c = case.config
    module, suffix = rest.rsplit(".", 1)
    name = f"{p}.{case.inverse[module]}.{suffix}"
    if name.endswith(".self_attn.q_proj.weight"):
        v = unpermute(v, c["num_attention_heads"])
    elif name.endswith(".self_attn.k_proj.weight"):
        v = unpermute(v, c["num_key_value_heads"])
    return name, v


CASES["muse_glimmer"] = Case(
    "muse_glimmer",
    {"model_type": "muse_glimmer", "hidden_size": 32, "num_hidden_layers": 4, "intermediate_size": 64,
     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 96,
     "rms_norm_eps": 1e-5, "post_norm_eps": 1e-8, "sliding_window": 4, "qk_scale_factor": 3.87,
     "max_position_embeddings": 256, "rope_theta": 500000.0,
     "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
     "final_logit_softcapping": 20.0, "output_multiplier": 0.19611613513818404,
     "tie_word_embeddings": False},
    "muse-glimmer",
    text_model(head_dim="head_dim") [:-len(GPT2)] + [
        f32("final_logit_softcapping", "final_logit_softcapping"),
        f32("logit_scale", "output_multiplier"),
        u32("attention.sliding_window", "sliding_window"),
        window_pattern(lambda c: [t == "sliding_attention" for t in c["layer_types"]]),
    ] + GPT2,
    {
        "self_attn.gate_proj": "attn_gate",
        "post_attention_layernorm": "attn_post_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "ffn_post_norm",
    },
    permute_qk=True,
    tensors=muse_tensors,
    read_back=muse_back,
    undo=lambda k, v: v - 1.0 if muse_offset(k) else v,
    inexact=lambda k: k.endswith("layernorm.weight"),
)


# InternLM2 (`internlm2`): InternLM2Model splits the fused `wqkv` (per KV group: its queries,
# then one key and one value head) into q, k and v, Q and K permuted as LlamaModel's; it adds
# the vocabulary size and the rope width to TextModel's keys. Its checkpoints have no biases.
def internlm2_tensors(case, k, v):
    c = case.config
    if k.endswith(".attention.wqkv.weight"):
        layer = layer_of(k)
        heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
        hd = c["hidden_size"] // heads
        qkv = v.reshape(kv, heads // kv + 2, hd, c["hidden_size"])
        q = qkv[:, : heads // kv].reshape(-1, c["hidden_size"])
        kk = qkv[:, -2].reshape(-1, c["hidden_size"])
        vv = qkv[:, -1].reshape(-1, c["hidden_size"])
        return [
            (f"blk.{layer}.attn_q.weight", permute(q, heads)),
            (f"blk.{layer}.attn_k.weight", permute(kk, kv)),
            (f"blk.{layer}.attn_v.weight", vv),
        ]
    return [(case.gguf_name(k), v)]


CASES["internlm2"] = Case(
    "internlm2",
    cfg("internlm2", bias=False, tie_word_embeddings=False),
    "internlm2",
    text_model(vocab_size=True, rope_dims=head_size),
    {
        "model.tok_embeddings": "token_embd",
        "output": "output",
        "attention.wo": "attn_output",
        "attention_norm": "attn_norm",
        "ffn_norm": "ffn_norm",
        "feed_forward.w1": "ffn_gate",
        "feed_forward.w3": "ffn_up",
        "feed_forward.w2": "ffn_down",
    },
    tensors=internlm2_tensors,
)


# Apertus (`apertus`): ApertusModel(LlamaModel) keeps Q / K as stored (undo_permute False) and
# writes each layer's xIELU parameters (`act_fn.alpha_n`, `alpha_p`, `beta`, `eps`) as four
# per-layer float arrays (`xielu.*`) instead of tensors; q / k norms per head.
APERTUS_XIELU = {}


def apertus_tensors(case, k, v):
    if ".mlp.act_fn." in k:
        APERTUS_XIELU.setdefault(k.rsplit(".", 1)[1], {})[int(layer_of(k))] = v.item()
        return []
    return [(case.gguf_name(k), v)]


def xielu(name):
    return arr(f"xielu.{name}", lambda c: mx.array(
        [APERTUS_XIELU[name][layer] for layer in range(c["num_hidden_layers"])], dtype=mx.float32))


CASES["apertus"] = Case(
    "apertus",
    cfg("apertus", mlp_bias=False, attention_bias=False, post_norm=False, qk_norm=True,
        tie_word_embeddings=False),
    "apertus",
    text_model(vocab_size=True, rope_dims=head_size) + [xielu(n) for n in ("alpha_n", "alpha_p", "beta", "eps")],
    {
        "attention_layernorm": "attn_norm",
        "feedforward_layernorm": "ffn_norm",
        "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm",
    },
    tensors=apertus_tensors,
)


# Nemotron (`nemotron`, Nemotron-3 / Minitron): LayerNorm1P weights stored as `w + 1`
# (NemotronModel adds 1 to every `*norm.weight`; biases as they are), the relu2 MLP's
# up / down, a partial rope (`rope.dimension_count` = int(factor * hidden) // heads), the
# LayerNorm epsilon, the vocabulary size and `rope.scaling.type` "none" (or linear with a
# factor). The golden is mlx-lm on the norms read back as `stored - 1`.
CASES["nemotron"] = Case(
    "nemotron",
    {k: v for k, v in cfg("nemotron", hidden_act="relu2", norm_eps=1e-5, partial_rotary_factor=0.5,
                          attention_bias=False, mlp_bias=False, tie_word_embeddings=False).items()
     if k != "rms_norm_eps"},
    "nemotron",
    [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", "num_key_value_heads"),
        f32("rope.freq_base", "rope_theta"),
        u32("vocab_size", "vocab_size"),
        f32("attention.layer_norm_epsilon", "norm_eps"),
        u32("rope.dimension_count", lambda c: int(c["partial_rotary_factor"] * c["hidden_size"]) // c["num_attention_heads"]),
        text("rope.scaling.type", "none"),
    ] + GPT2,
    tensors=lambda case, k, v: [(case.gguf_name(k), v + 1 if k.endswith("norm.weight") else v)],
    read_back=lambda case, prefix, rest, v, loaded: (f"{prefix}.{case.inverse[rest.rsplit('.', 1)[0]]}.{rest.rsplit('.', 1)[1]}", v),
    undo=lambda k, v: v - 1 if k.endswith("norm.weight") else v,
    inexact=lambda k: k.endswith("norm.weight"),
)


# Hunyuan dense (`hunyuan-dense`, Hunyuan-7B / 4B / 1.8B / 0.5B): HunYuanModel writes TextModel's
# keys with the head size, then for its NTK-alpha ("dynamic") rope the base already scaled,
# base * alpha ** (head_dim / (head_dim - 2)), scaling "none" with factor 1, and a 256k context
# (both as the original context). mlx-lm's hunyuan_v1_dense scales the same base the same way
# at load; the file's scaled base with alpha 1 is the same rope.
HUNYUAN_DENSE = cfg("hunyuan_v1_dense", head_dim=8, use_qk_norm=True, attention_bias=False,
                    tie_word_embeddings=True, max_position_embeddings=32768,
                    rope_scaling={"alpha": 50.0, "factor": 1.0, "type": "dynamic"})


def hunyuan_base(c):
    d = c["head_dim"]
    return c["rope_theta"] * (c["rope_scaling"]["alpha"] ** (d / (d - 2)))


CASES["hunyuan_dense"] = Case(
    "hunyuan_v1_dense",
    HUNYUAN_DENSE,
    "hunyuan-dense",
    [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", 256 * 1024),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", "num_key_value_heads"),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("attention.key_length", "head_dim"),
        u32("attention.value_length", "head_dim"),
        f32("rope.freq_base", hunyuan_base),
        text("rope.scaling.type", "none"),
        f32("rope.scaling.factor", 1.0),
        u32("rope.scaling.original_context_length", 256 * 1024),
    ] + GPT2,
    {"self_attn.query_layernorm": "attn_q_norm", "self_attn.key_layernorm": "attn_k_norm"},
)


# Phi-2 (`phi2`, mlx-lm's `phi`): Phi2Model writes no rope base (10000), the feed-forward width
# as 4 * hidden (Phi-2's), the LayerNorm epsilon, the rotated width int(factor * hidden) //
# heads and `add_bos_token` false; LayerNorms and every linear layer with bias, the head too.
CASES["phi2"] = Case(
    "phi",
    {k: v for k, v in cfg("phi", intermediate_size=128, layer_norm_eps=1e-5, partial_rotary_factor=0.5,
                          num_key_value_heads=4, tie_word_embeddings=False).items()
     if k != "rms_norm_eps"},
    "phi2",
    [
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", lambda c: 4 * c["hidden_size"]),
        u32("block_count", "num_hidden_layers"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", "num_attention_heads"),
        f32("attention.layer_norm_epsilon", "layer_norm_eps"),
        u32("rope.dimension_count", lambda c: int(c["partial_rotary_factor"] * c["hidden_size"]) // c["num_attention_heads"]),
        ("raw", "tokenizer.ggml.add_bos_token", mx.array(False)),
    ] + GPT2,
    {
        "model.final_layernorm": "output_norm",
        "self_attn.dense": "attn_output",
        "mlp.fc1": "ffn_up",
        "mlp.fc2": "ffn_down",
    },
)


# GPT-2 (`gpt2`): GPT2Model transposes HF's Conv1D weights (to mlx-lm's Linear layout) and
# writes the block count, `n_ctx`, the width, 4 * width as the feed-forward width, the heads
# and the LayerNorm epsilon; learned positions as `position_embd`; the head is the embedding.
CASES["gpt2"] = Case(
    "gpt2",
    {"model_type": "gpt2", "n_ctx": 256, "n_embd": 32, "n_head": 4, "n_layer": 2, "n_positions": 256,
     "layer_norm_epsilon": 1e-5, "vocab_size": 96},
    "gpt2",
    [
        u32("block_count", "n_layer"),
        u32("context_length", "n_ctx"),
        u32("embedding_length", "n_embd"),
        u32("feed_forward_length", lambda c: 4 * c["n_embd"]),
        u32("attention.head_count", "n_head"),
        f32("attention.layer_norm_epsilon", "layer_norm_epsilon"),
    ] + GPT2,
    {
        "model.wte": "token_embd",
        "model.wpe": "position_embd",
        "model.ln_f": "output_norm",
        "ln_1": "attn_norm",
        "attn.c_attn": "attn_qkv",
        "attn.c_proj": "attn_output",
        "ln_2": "ffn_norm",
        "mlp.c_fc": "ffn_up",
        "mlp.c_proj": "ffn_down",
    },
    prefix="model.h",
)


# StarCoder (`starcoder`, mlx-lm's gpt_bigcode): StarCoderModel writes `n_positions` as the
# context, 4 * width as the feed-forward width, one KV head (multi-query) and the LayerNorm
# epsilon; learned positions as `position_embd`; the head tied to the embedding.
CASES["starcoder"] = Case(
    "gpt_bigcode",
    {"model_type": "gpt_bigcode", "n_embd": 32, "n_layer": 2, "n_inner": 128, "n_head": 4,
     "n_positions": 256, "layer_norm_epsilon": 1e-5, "vocab_size": 96, "multi_query": True,
     "tie_word_embeddings": True},
    "starcoder",
    [
        u32("context_length", "n_positions"),
        u32("embedding_length", "n_embd"),
        u32("feed_forward_length", lambda c: 4 * c["n_embd"]),
        u32("block_count", "n_layer"),
        u32("attention.head_count", "n_head"),
        u32("attention.head_count_kv", 1),
        f32("attention.layer_norm_epsilon", "layer_norm_epsilon"),
    ] + GPT2,
    {
        "transformer.wte": "token_embd",
        "transformer.wpe": "position_embd",
        "transformer.ln_f": "output_norm",
        "ln_1": "attn_norm",
        "attn.c_attn": "attn_qkv",
        "attn.c_proj": "attn_output",
        "ln_2": "ffn_norm",
        "mlp.c_fc": "ffn_up",
        "mlp.c_proj": "ffn_down",
    },
    prefix="transformer.h",
)


# GPT-NeoX (`gptneox`, Pythia): GPTNeoXModel regroups the per-head interleaved
# `query_key_value` (per head: its q, k, v rows) into q rows, then k, then v (weight and bias),
# and writes no rope base (10000), the rotated width int(rotary_pct * head size), the parallel
# residual flag and the LayerNorm epsilon.
def gptneox_tensors(case, k, v):
    if ".attention.query_key_value." in k:
        c = case.config
        h, hd = c["num_attention_heads"], c["hidden_size"] // c["num_attention_heads"]
        v = v.reshape(h, 3, hd, *v.shape[1:]).swapaxes(0, 1).reshape(v.shape)
    return [(case.gguf_name(k), v)]


CASES["gptneox"] = Case(
    "gpt_neox",
    {"model_type": "gpt_neox", "max_position_embeddings": 256, "hidden_size": 32,
     "num_attention_heads": 4, "num_hidden_layers": 2, "layer_norm_eps": 1e-5, "vocab_size": 96,
     "rotary_emb_base": 10000, "rotary_pct": 0.25, "use_parallel_residual": True,
     "intermediate_size": 128},
    "gptneox",
    [
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("block_count", "num_hidden_layers"),
        u32("feed_forward_length", "intermediate_size"),
        u32("rope.dimension_count", lambda c: int(c["rotary_pct"] * (c["hidden_size"] // c["num_attention_heads"]))),
        u32("attention.head_count", "num_attention_heads"),
        flag("use_parallel_residual", "use_parallel_residual"),
        f32("attention.layer_norm_epsilon", "layer_norm_eps"),
    ] + GPT2,
    {
        "model.embed_in": "token_embd",
        "model.embed_out": "output",
        "model.final_layer_norm": "output_norm",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "attention.query_key_value": "attn_qkv",
        "attention.dense": "attn_output",
        "mlp.dense_h_to_4h": "ffn_up",
        "mlp.dense_4h_to_h": "ffn_down",
    },
    prefix="model.h",
    tensors=gptneox_tensors,
)


# MiniCPM (`minicpm`, MiniCPM 1 / 2): MiniCPMModel permutes Q / K as LlamaModel does and adds
# to TextModel's keys `embedding_scale` (scale_emb), `residual_scale` (scale_depth / sqrt of
# the layer count) and `logit_scale` (hidden / dim_model_base), each an f32 of the Python
# value mlx-lm computes the same way.
CASES["minicpm"] = Case(
    "minicpm",
    cfg("minicpm", dim_model_base=16, scale_depth=1.4, scale_emb=12.0, tie_word_embeddings=True),
    "minicpm",
    text_model() + [
        f32("embedding_scale", "scale_emb"),
        f32("residual_scale", lambda c: c["scale_depth"] / c["num_hidden_layers"] ** 0.5),
        f32("logit_scale", lambda c: c["hidden_size"] / c["dim_model_base"]),
    ],
    permute_qk=True,
)


# DeepSeek MoE (`deepseek`, deepseek-moe-16b): DeepseekModel permutes Q / K as LlamaModel
# does, stacks the routed experts, and adds to TextModel's keys (with the experts used per
# token) the rope width, scaling "none", the dense first blocks, the vocabulary size, the
# experts' width, a weights scale of 1, the expert and shared-expert counts.
CASES["deepseek"] = Case(
    "deepseek",
    cfg("deepseek", num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=16, moe_layer_freq=1,
        num_key_value_heads=4, tie_word_embeddings=False),
    "deepseek",
    text_model() + [
        u32("expert_used_count", "num_experts_per_tok"),
        u32("rope.dimension_count", head_size),
        text("rope.scaling.type", "none"),
        u32("leading_dense_block_count", "first_k_dense_replace"),
        u32("vocab_size", "vocab_size"),
        u32("expert_feed_forward_length", "moe_intermediate_size"),
        f32("expert_weights_scale", 1.0),
        u32("expert_count", "n_routed_experts"),
        u32("expert_shared_count", "n_shared_experts"),
    ],
    {**EXPERTS, **DEEPSEEK_MOE},
    permute_qk=True,
)


# RWKV-7 with a real "world" vocabulary (`rwkv7_world`): the same converter output with the
# tokenizer metadata of `goldens_gguf_rwkv.py`'s fixture (run that first), so `mlx generate`
# runs on the file. Besides the logits, `rwkv7_cli` records what `mlx generate --json`
# must print: the prompt through the file's chat template (rendered as transformers renders
# it, with the `enable_thinking` mlx-lm's TokenizerWrapper passes: false, the vocabulary has
# no thinking markers), its ids from llama.cpp's `llama-tokenize` on this very file, and mlx-lm's
# `generate_step` (greedy) on the seeded model: ids and each token's log-probability.
RWKV_VOCAB = "mlx-tokenizers/tests/fixtures/gguf/rwkv-world.gguf"
RWKV_CLI = "mlx-cli/tests/goldens/gguf_rwkv_cli.json"
RWKV_PROMPT = "Write one line about the sea."
RWKV_MAX_TOKENS = 8


def vocab_of(path):
    """The tokenizer metadata of the vocabulary-only GGUF at `path`."""
    _, meta = mx.load(path, return_metadata=True)
    return [(k, v) for k, v in meta.items() if k.startswith("tokenizer.")]


def rwkv_vocab():
    return vocab_of(RWKV_VOCAB)


def cli_golden(out_path, prompt, max_tokens, with_text=False):
    """An `after` hook writing what `mlx generate --json` must print on the file: `prompt`
    through the file's chat template where it has one (else as it is, as mlx-lm's CLI then
    runs it), its ids from llama.cpp's `llama-tokenize`, and mlx-lm's greedy `generate_step`
    (ids and each token's log-probability, up to EOS); with `with_text`, llama.cpp's
    `llama_detokenize` of the generated ids."""

    def after(name, model, path):
        import json

        import jinja2
        from mlx_lm.generate import generate_step

        from goldens_gguf_rwkv import tokenize

        _, meta = mx.load(path, return_metadata=True)
        if "tokenizer.chat_template" in meta:
            env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
            text = env.from_string(meta["tokenizer.chat_template"]).render(
                messages=[{"role": "user", "content": prompt}], add_generation_prompt=True,
                bos_token=meta["tokenizer.ggml.tokens"][0], enable_thinking=False)
        else:
            text = prompt
        ids = tokenize(path, text)
        eos = meta["tokenizer.ggml.eos_token_id"].item()
        tokens, logprobs = [], []
        for tok, lp in generate_step(mx.array(ids), model, max_tokens=max_tokens,
                                     sampler=lambda x: mx.argmax(x, axis=-1)):
            tok = int(tok)
            if tok == eos:
                break
            tokens.append(tok)
            logprobs.append(float(lp[tok].item()))
        out = {
            "generator": f"xtask/oracle/goldens_gguf_more.py {name}",
            "model": path,
            "prompt": prompt,
            "rendered": text,
            "max_tokens": max_tokens,
            "prompt_ids": ids,
            "tokens": tokens,
            "logprobs": logprobs,
        }
        if with_text:
            from goldens_gguf_rwkv import detokenize

            out["text"] = detokenize(path, tokens)
        with open(out_path, "w") as f:
            f.write(json.dumps(out, indent=1, ensure_ascii=False) + "\n")

    return after


rwkv7_cli = cli_golden(RWKV_CLI, RWKV_PROMPT, RWKV_MAX_TOKENS)


def rwkv7_world_case():
    vocab = rwkv_vocab() if os.path.isfile(RWKV_VOCAB) else []
    tokens = dict(vocab).get("tokenizer.ggml.tokens", [])
    case = Case(
        "rwkv7",
        {**RWKV7, "vocab_size": len(tokens)},
        "rwkv7",
        CASES["rwkv7"].meta[:-len(tokenizer("rwkv"))] + [("raw", k, v) for k, v in vocab],
        RWKV7_PARTS,
        tensors=rwkv7_tensors,
        after=rwkv7_cli,
    )
    case.stacks = {}
    return case


CASES["rwkv7_world"] = rwkv7_world_case()



# --- State-space and later mixture-of-experts architectures (issue #32, h12) ---------------

# Mamba (`mamba`; Falcon Mamba is written as `mamba` with `ssm.dt_b_c_rms` true): MambaModel
# writes a dummy context (2**20), the width, feed-forward width and head count 0, the block
# count, the SSM sizes (conv kernel, inner, state, time-step rank), the RMS epsilon and the
# B/C/dt-norm flag; `A_log` as `ssm_a = -exp(A_log)` (read back as `log(-ssm_a)`), the conv
# kernel squeezed to (channels, kernel), `D` as `ssm_d`; the head omitted when it equals the
# embedding. mlx-lm's block norms use RMSNorm's default epsilon (1e-5, the file's here) and
# its B/C/dt norms `mixer_rms_eps` (default 1e-6: the file has no key for it).
MAMBA_PARTS = {
    "backbone.embeddings": "token_embd",
    "backbone.norm_f": "output_norm",
    "lm_head": "output",
    "norm": "attn_norm",
    "mixer.in_proj": "ssm_in",
    "mixer.conv1d": "ssm_conv1d",
    "mixer.x_proj": "ssm_x",
    "mixer.dt_proj": "ssm_dt",
    "mixer.out_proj": "ssm_out",
    "mixer.norm": "ssm_norm",
}


def mamba_tensors(case, k, v):
    """MambaModel / Mamba2Model.modify_tensors: A as -exp(A_log) ((heads, 1) in Mamba-2), D
    ((heads, 1) in Mamba-2), the conv kernel squeezed, Mamba-2's gated norm per group and its
    `dt_bias` as `ssm_dt.bias`."""
    c = case.config
    layer = k.split(".")[2] if k.startswith("backbone.layers.") else None
    two = case.model_type in ("mamba2", "nemotron_h")
    if k.endswith("mixer.A_log"):
        a = -mx.exp(v)
        return [(f"blk.{layer}.ssm_a", a[:, None] if two else a)]
    if k.endswith("mixer.D"):
        return [(f"blk.{layer}.ssm_d", v[:, None] if two else v)]
    if k.endswith("mixer.dt_bias"):
        return [(f"blk.{layer}.ssm_dt.bias", v)]
    if k.endswith("mixer.conv1d.weight"):
        return [(f"blk.{layer}.ssm_conv1d.weight", v.squeeze(-1))]
    if k.endswith("mixer.norm.weight") and two:
        return [(f"blk.{layer}.ssm_norm.weight", v.reshape(c["n_groups"], -1))]
    return [(case.gguf_name(k), v)]


def mamba_back(case, p, rest, v, loaded):
    p = p.replace("model.layers", "backbone.layers")
    two = case.model_type in ("mamba2", "nemotron_h")
    if rest == "ssm_a":
        return f"{p}.mixer.A_log", mx.log(-v).reshape(-1) if two else mx.log(-v)
    if rest == "ssm_d":
        return f"{p}.mixer.D", v.reshape(-1)
    if rest == "ssm_dt.bias" and two:
        return f"{p}.mixer.dt_bias", v
    if rest == "ssm_conv1d.weight":
        return f"{p}.mixer.conv1d.weight", v[..., None]
    if rest == "ssm_norm.weight":
        return f"{p}.mixer.norm.weight", v.reshape(-1)
    module, suffix = rest.rsplit(".", 1)
    return f"{p}.{case.inverse[module]}.{suffix}", v


def mamba_meta(two):
    e = [
        u32("context_length", 2**20),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", 0),
        u32("attention.head_count", 0),
        u32("block_count", "num_hidden_layers"),
        u32("ssm.conv_kernel", "conv_kernel"),
        u32("ssm.inner_size", "intermediate_size"),
        u32("ssm.state_size", "state_size"),
    ]
    if two:
        e += [
            u32("ssm.time_step_rank", lambda c: c["intermediate_size"] // c["head_dim"]),
            u32("ssm.group_count", "n_groups"),
            f32("attention.layer_norm_rms_epsilon", "layer_norm_epsilon"),
        ]
    else:
        e += [
            u32("ssm.time_step_rank", "time_step_rank"),
            f32("attention.layer_norm_rms_epsilon", 1e-5),
            flag("ssm.dt_b_c_rms", lambda c: c["model_type"] == "falcon_mamba"),
        ]
    return e + GPT2


MAMBA = {
    "model_type": "mamba",
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "state_size": 8,
    "num_hidden_layers": 2,
    "conv_kernel": 4,
    "use_bias": False,
    "use_conv_bias": True,
    "time_step_rank": 4,
    "tie_word_embeddings": True,
}

# Mamba-2 (`mamba2`): Mamba2Model writes the head count as `ssm.time_step_rank` (inner / head
# size), the group count; `dt_bias` becomes `ssm_dt.bias`, A and D are (heads, 1), the gated
# norm (groups, inner / groups). llama.cpp clamps no time step: mlx-lm's (0, inf).
MAMBA2 = {
    "model_type": "mamba2",
    "num_heads": 8,
    "head_dim": 8,
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "state_size": 8,
    "num_hidden_layers": 2,
    "layer_norm_epsilon": 1e-5,
    "conv_kernel": 4,
    "n_groups": 2,
    "use_bias": False,
    "use_conv_bias": True,
    "tie_word_embeddings": False,
    "time_step_limit": (0.0, float("inf")),
    "time_step_rank": "auto",
}

for _name, _c in [
    ("mamba", MAMBA),
    ("falcon_mamba", {**MAMBA, "model_type": "falcon_mamba", "tie_word_embeddings": False}),
    ("mamba2", MAMBA2),
]:
    _two = _c["model_type"] == "mamba2"
    CASES[_name] = Case("mamba2" if _two else "mamba", _c, "mamba2" if _two else "mamba",
                        mamba_meta(_two), MAMBA_PARTS, prefix="backbone.layers",
                        tensors=mamba_tensors, read_back=mamba_back)



# MiniMax-M2 (`minimax-m2`, mlx-lm's `minimax`): TextModel's keys (the experts' width is
# `intermediate_size`, so also `feed_forward_length`; sigmoid gating as
# `expert_gating_func` 2; the head size as key / value length), then the experts' width and
# the rotated width `rotary_dim`; experts stacked, `e_score_correction_bias` as
# `exp_probs_b.bias`, the q / k norms over all heads as `attn_q_norm` / `attn_k_norm`.
MINIMAX_M2 = cfg("minimax", num_hidden_layers=2, intermediate_size=16, head_dim=8,
                 num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=0,
                 rotary_dim=4, scoring_func="sigmoid", use_qk_norm=True,
                 tie_word_embeddings=False)


def minimax_m2_tensors(case, k, v):
    if k.endswith(".block_sparse_moe.e_score_correction_bias"):
        return [(f"blk.{layer_of(k)}.exp_probs_b.bias", v)]
    return [(case.gguf_name(k), v)]


CASES["minimax_m2"] = Case(
    "minimax",
    MINIMAX_M2,
    "minimax-m2",
    [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", "num_key_value_heads"),
        f32("rope.freq_base", "rope_theta"),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("expert_count", "num_local_experts"),
        u32("expert_used_count", "num_experts_per_tok"),
        u32("expert_gating_func", 2),
        u32("attention.key_length", "head_dim"),
        u32("attention.value_length", "head_dim"),
        u32("expert_feed_forward_length", "intermediate_size"),
        u32("rope.dimension_count", "rotary_dim"),
    ] + GPT2,
    {
        "block_sparse_moe.gate": "ffn_gate_inp",
        "block_sparse_moe.switch_mlp.gate_proj": "ffn_gate_exps",
        "block_sparse_moe.switch_mlp.up_proj": "ffn_up_exps",
        "block_sparse_moe.switch_mlp.down_proj": "ffn_down_exps",
    },
    tensors=minimax_m2_tensors,
)



# Ling 2.0 (`bailingmoe2`, mlx-lm's `bailing_moe`): BailingMoeV2Model writes TextModel's keys
# (with the group routing and the sigmoid gating), the rotated width (head size * the
# partial-rotary factor), the dense first blocks, the vocabulary size, the experts' and the
# shared expert's widths, the routed scale, the shared count, top-k renormalization and the
# MTP layer count (its MTP layer after the main ones, skipped); the fused `query_key_value`
# as `attn_qkv` (nothing permuted), `expert_bias` as `exp_probs_b.bias`, experts stacked.
BAILINGMOE2 = cfg("bailing_moe", num_hidden_layers=3, num_key_value_heads=2, intermediate_size=48,
                  moe_intermediate_size=16, num_experts=8, num_shared_experts=1,
                  num_experts_per_tok=2, norm_topk_prob=True, first_k_dense_replace=1,
                  use_qk_norm=True, partial_rotary_factor=0.5, moe_router_enable_expert_bias=True,
                  routed_scaling_factor=2.5, score_function="sigmoid", n_group=4, topk_group=2,
                  moe_shared_expert_intermediate_size=16, num_nextn_predict_layers=1,
                  tie_word_embeddings=False)


def bailing_tensors(case, k, v):
    if k.endswith(".mlp.gate.expert_bias"):
        return [(f"blk.{layer_of(k)}.exp_probs_b.bias", v)]
    return [(case.gguf_name(k), v)]


CASES["bailingmoe2"] = Case(
    "bailing_moe",
    BAILINGMOE2,
    "bailingmoe2",
    [
        u32("block_count", plus_mtp),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", "num_key_value_heads"),
        f32("rope.freq_base", "rope_theta"),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("expert_count", "num_experts"),
        u32("expert_used_count", "num_experts_per_tok"),
        u32("expert_group_count", "n_group"),
        u32("expert_group_used_count", "topk_group"),
        u32("expert_gating_func", 2),
        u32("rope.dimension_count", lambda c: int(head_size(c) * c["partial_rotary_factor"])),
        u32("leading_dense_block_count", "first_k_dense_replace"),
        u32("vocab_size", "vocab_size"),
        u32("expert_feed_forward_length", "moe_intermediate_size"),
        u32("expert_shared_feed_forward_length", "moe_shared_expert_intermediate_size"),
        f32("expert_weights_scale", "routed_scaling_factor"),
        u32("expert_shared_count", "num_shared_experts"),
        flag("expert_weights_norm", "norm_topk_prob"),
        u32("nextn_predict_layers", "num_nextn_predict_layers"),
    ] + GPT2,
    {
        "model.word_embeddings": "token_embd",
        "attention.query_key_value": "attn_qkv",
        "attention.dense": "attn_output",
        "attention.query_layernorm": "attn_q_norm",
        "attention.key_layernorm": "attn_k_norm",
        "mlp.gate.gate_proj": "ffn_gate_inp",
        "mlp.switch_mlp.gate_proj": "ffn_gate_exps",
        "mlp.switch_mlp.up_proj": "ffn_up_exps",
        "mlp.switch_mlp.down_proj": "ffn_down_exps",
        "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
        "mlp.shared_experts.up_proj": "ffn_up_shexp",
        "mlp.shared_experts.down_proj": "ffn_down_shexp",
    },
    tensors=bailing_tensors,
    extra=[mtp_layer(1.0)],
)



# Nemotron-H (`nemotron_h`, dense): NemotronHModel is GraniteHybridModel's (Mamba-2 layers as
# Mamba2Model writes them, attention layers through the llama class: Q / K permuted) with
# MLP-only layers. The layer kinds are per-layer lists: `head_count_kv` (> 0: attention) and
# `feed_forward_length` (> 0: MLP), both 0 for Mamba-2. GraniteModel drops `head_dim` before
# the llama class writes the rope width (hidden / heads); NemotronH writes it as key / value
# length. The LayerNorm-epsilon key (`layer_norm_epsilon`) is llama.cpp's RMS epsilon here.
NEMOTRON_H = {
    "model_type": "nemotron_h",
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 48,
    "max_position_embeddings": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "attention_bias": False,
    "mamba_num_heads": 8,
    "mamba_head_dim": 8,
    "mamba_proj_bias": False,
    "ssm_state_size": 8,
    "conv_kernel": 4,
    "n_groups": 2,
    "mlp_bias": False,
    "layer_norm_epsilon": 1e-5,
    "use_bias": False,
    "use_conv_bias": True,
    "hybrid_override_pattern": "M*M-",
    "num_hidden_layers": 4,
    # mlx-lm's nemotron_h always has its own head (the converter writes `output`).
    "tie_word_embeddings": False,
}

NEMOTRON_H_PARTS = {
    **MAMBA_PARTS,
    "mixer.q_proj": "attn_q",
    "mixer.k_proj": "attn_k",
    "mixer.v_proj": "attn_v",
    "mixer.o_proj": "attn_output",
    "mixer.up_proj": "ffn_up",
    "mixer.down_proj": "ffn_down",
}


def nemotron_h_back(case, p, rest, v, loaded):
    c = case.config
    if rest in ("attn_q.weight", "attn_k.weight"):
        v = unpermute(v, c["num_attention_heads" if rest == "attn_q.weight" else "num_key_value_heads"])
    return mamba_back(case, p, rest, v, loaded)


CASES["nemotron_h"] = Case(
    "nemotron_h",
    NEMOTRON_H,
    "nemotron_h",
    [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", 2**20),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length",
            lambda c: [c["intermediate_size"] if t == "-" else 0 for t in c["hybrid_override_pattern"]]),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv",
            lambda c: [c["num_key_value_heads"] if t == "*" else 0 for t in c["hybrid_override_pattern"]]),
        f32("attention.layer_norm_epsilon", "layer_norm_epsilon"),
        u32("vocab_size", "vocab_size"),
        u32("rope.dimension_count", head_size),
        u32("ssm.conv_kernel", "conv_kernel"),
        u32("ssm.state_size", "ssm_state_size"),
        u32("ssm.group_count", "n_groups"),
        u32("ssm.inner_size", lambda c: c["mamba_num_heads"] * c["mamba_head_dim"]),
        u32("ssm.time_step_rank", "mamba_num_heads"),
        flag("rope.scaling.finetuned", False),
        u32("attention.key_length", "head_dim"),
        u32("attention.value_length", "head_dim"),
    ] + GPT2,
    NEMOTRON_H_PARTS,
    permute_qk=True,
    prefix="backbone.layers",
    tensors=mamba_tensors,
    read_back=nemotron_h_back,
)



# Falcon-H1 (`falcon-h1`): FalconH1Model is Mamba2Model's (A as -exp(A_log), A and D
# (heads, 1), the gated norm per group, `dt_bias` as `ssm_dt.bias`, the conv kernel squeezed)
# with every layer's attention and Mamba-2 side by side and an MLP; its multipliers are
# folded into the weights (embedding, q / k / v, k's key multiplier, o, the SSM in / out with
# the per-segment `ssm_multipliers`, MLP gate / down, the head), which is also mlx-lm's
# sanitize, so the file holds no multiplier. It writes Mamba2Model's keys, then the
# vocabulary size, the block count, the real context and feed-forward width, the heads, the
# head size and the rope base. The golden is mlx-lm on the folded weights read back.
FALCON_H1 = {
    "model_type": "falcon_h1",
    "vocab_size": 96,
    "hidden_size": 32,
    "head_dim": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "intermediate_size": 48,
    "max_position_embeddings": 256,
    "mamba_d_ssm": 64,
    "mamba_n_heads": 8,
    "mamba_d_head": 8,
    "mamba_d_state": 8,
    "mamba_n_groups": 1,
    "mamba_d_conv": 4,
    "mamba_rms_norm": True,
    "mamba_norm_before_gate": False,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "projectors_bias": False,
    "attention_bias": False,
    "mlp_bias": False,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "attention_in_multiplier": 1.5,
    "attention_out_multiplier": 0.9375,
    "embedding_multiplier": 5.656854249492381,
    "key_multiplier": 0.390625,
    "lm_head_multiplier": 0.0390625,
    "mlp_multipliers": [0.8838834764831844, 0.5859375],
    "ssm_in_multiplier": 1.25,
    "ssm_multipliers": [0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738],
    "ssm_out_multiplier": 0.23570226039551587,
}

FALCON_H1_PARTS = {
    "model.final_layernorm": "output_norm",
    "pre_ff_layernorm": "ffn_norm",
    "feed_forward.gate_proj": "ffn_gate",
    "feed_forward.up_proj": "ffn_up",
    "feed_forward.down_proj": "ffn_down",
    "mamba.in_proj": "ssm_in",
    "mamba.conv1d": "ssm_conv1d",
    "mamba.norm": "ssm_norm",
    "mamba.out_proj": "ssm_out",
}


def falcon_h1_tensors(case, k, v):
    c = case.config
    layer = layer_of(k)
    mamba = mamba2_tensors(c, layer, k, v)
    if mamba is not None:
        return mamba
    # FalconH1Model.modify_tensors' multipliers (float32 products).
    if "down_proj" in k:
        v = v * c["mlp_multipliers"][1]
    elif "gate_proj" in k:
        v = v * c["mlp_multipliers"][0]
    elif "k_proj" in k:
        v = v * c["key_multiplier"] * c["attention_in_multiplier"]
    elif "q_proj" in k or "v_proj" in k:
        v = v * c["attention_in_multiplier"]
    elif "o_proj" in k:
        v = v * c["attention_out_multiplier"]
    elif "out_proj" in k:
        v = v * c["ssm_out_multiplier"]
    elif "in_proj" in k:
        v = v * c["ssm_in_multiplier"]
        d, g = c["mamba_d_ssm"], c["mamba_n_groups"] * c["mamba_d_state"]
        ends = [d, 2 * d, 2 * d + g, 2 * d + 2 * g, v.shape[0]]
        m = c["ssm_multipliers"]
        parts, start = [], 0
        for i, e in enumerate(ends):
            parts.append(v[start:e] * m[i])
            start = e
        v = mx.concatenate(parts, axis=0)
    elif "lm_head" in k:
        v = v * c["lm_head_multiplier"]
    elif "embed_tokens" in k:
        v = v * c["embedding_multiplier"]
    return [(case.gguf_name(k), v)]


def falcon_h1_back(case, p, rest, v, loaded):
    mamba = mamba2_back(p, rest, v)
    if mamba is not None:
        return mamba
    module, suffix = rest.rsplit(".", 1)
    return f"{p}.{case.inverse[module]}.{suffix}", v


CASES["falcon_h1"] = Case(
    "falcon_h1",
    FALCON_H1,
    "falcon-h1",
    [
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("block_count", "num_hidden_layers"),
        u32("ssm.conv_kernel", "mamba_d_conv"),
        u32("ssm.inner_size", "mamba_d_ssm"),
        u32("ssm.state_size", "mamba_d_state"),
        u32("ssm.time_step_rank", lambda c: c["mamba_d_ssm"] // c["mamba_d_head"]),
        u32("ssm.group_count", "mamba_n_groups"),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("vocab_size", "vocab_size"),
        u32("attention.head_count_kv", "num_key_value_heads"),
        u32("attention.key_length", "head_dim"),
        u32("attention.value_length", "head_dim"),
        f32("rope.freq_base", "rope_theta"),
    ] + GPT2,
    FALCON_H1_PARTS,
    tensors=falcon_h1_tensors,
    read_back=falcon_h1_back,
    # Every multiplied tensor comes back as the folded product, not the seeded value.
    inexact=lambda k: not k.endswith(("norm.weight", "conv1d.weight", "conv1d.bias", "dt_bias", ".D")),
)



# Jamba (`jamba`): JambaModel writes the per-layer `head_count_kv` (attention layers), the
# Mamba sizes (inner = expand * width, state, conv kernel, time-step rank), the RMS epsilon
# and the expert counts; no key places the experts (the stacked `ffn_*_exps` of the layers
# that have them do); Mamba's conversions (A as -exp(A_log), the conv kernel squeezed) and
# the dt / B / C norms as `ssm_dt_norm` / `ssm_b_norm` / `ssm_c_norm`.
JAMBA = {
    "model_type": "jamba",
    "hidden_size": 32,
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
    "mamba_dt_rank": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 256,
    "vocab_size": 96,
    "mamba_proj_bias": False,
    "mamba_conv_bias": True,
    "tie_word_embeddings": False,
}

JAMBA_PARTS = {
    "model.final_layernorm": "output_norm",
    "pre_ff_layernorm": "ffn_norm",
    "feed_forward.gate_proj": "ffn_gate",
    "feed_forward.up_proj": "ffn_up",
    "feed_forward.down_proj": "ffn_down",
    "feed_forward.router": "ffn_gate_inp",
    "feed_forward.switch_mlp.gate_proj": "ffn_gate_exps",
    "feed_forward.switch_mlp.up_proj": "ffn_up_exps",
    "feed_forward.switch_mlp.down_proj": "ffn_down_exps",
    "mamba.in_proj": "ssm_in",
    "mamba.conv1d": "ssm_conv1d",
    "mamba.x_proj": "ssm_x",
    "mamba.dt_proj": "ssm_dt",
    "mamba.out_proj": "ssm_out",
    "mamba.dt_layernorm": "ssm_dt_norm",
    "mamba.b_layernorm": "ssm_b_norm",
    "mamba.c_layernorm": "ssm_c_norm",
}


def jamba_tensors(case, k, v):
    layer = layer_of(k)
    if k.endswith("mamba.A_log"):
        return [(f"blk.{layer}.ssm_a", -mx.exp(v))]
    if k.endswith("mamba.D"):
        return [(f"blk.{layer}.ssm_d", v)]
    if k.endswith("mamba.conv1d.weight"):
        return [(f"blk.{layer}.ssm_conv1d.weight", v.squeeze(-1))]
    return [(case.gguf_name(k), v)]


def jamba_back(case, p, rest, v, loaded):
    if rest == "ssm_a":
        return f"{p}.mamba.A_log", mx.log(-v)
    if rest == "ssm_d":
        return f"{p}.mamba.D", v
    if rest == "ssm_conv1d.weight":
        return f"{p}.mamba.conv1d.weight", v[..., None]
    module, suffix = rest.rsplit(".", 1)
    return f"{p}.{case.inverse[module]}.{suffix}", v


CASES["jamba"] = Case(
    "jamba",
    JAMBA,
    "jamba",
    [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", lambda c: [
            c["num_key_value_heads"] if i >= c["attn_layer_offset"]
            and (i - c["attn_layer_offset"]) % c["attn_layer_period"] == 0 else 0
            for i in range(c["num_hidden_layers"])]),
        u32("ssm.conv_kernel", "mamba_d_conv"),
        u32("ssm.inner_size", lambda c: c["mamba_expand"] * c["hidden_size"]),
        u32("ssm.state_size", "mamba_d_state"),
        u32("ssm.time_step_rank", "mamba_dt_rank"),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("expert_count", "num_experts"),
        u32("expert_used_count", "num_experts_per_tok"),
    ] + SPM,
    JAMBA_PARTS,
    tensors=jamba_tensors,
    read_back=jamba_back,
)



# DBRX (`dbrx`): DbrxModel writes the block count, `max_seq_len`, the width, the experts'
# width as `feed_forward_length`, the heads, the KV heads, the rope base, `clip_qkv` as
# `attention.clamp_kqv`, the expert counts and a LayerNorm epsilon of 1e-5; it stacks each
# layer's experts (`w1` -> `ffn_gate_exps`, `v1` -> `ffn_up_exps`, `w2` -> `ffn_down_exps` as
# (experts, width, ffn): each expert's is mlx-lm's `w2` Linear weight) where mlx-lm keeps a
# list of experts; `norm_2` is `attn_output_norm`.
DBRX = {
    "model_type": "dbrx",
    "vocab_size": 96,
    "d_model": 32,
    "n_layers": 2,
    "n_heads": 4,
    "max_seq_len": 256,
    "attn_config": {"kv_n_heads": 2, "clip_qkv": 0.5, "rope_theta": 10000.0},
    "ffn_config": {"ffn_hidden_size": 16, "moe_num_experts": 4, "moe_top_k": 2},
    "tie_word_embeddings": False,
}

DBRX_PARTS = {
    "transformer.wte": "token_embd",
    "transformer.norm_f": "output_norm",
    "norm_attn_norm.norm_1": "attn_norm",
    "norm_attn_norm.norm_2": "attn_output_norm",
    "norm_attn_norm.attn.Wqkv": "attn_qkv",
    "norm_attn_norm.attn.out_proj": "attn_output",
    "ffn.router.layer": "ffn_gate_inp",
}


def dbrx_tensors(case, k, v):
    """The experts of a layer stacked once all of them are seen."""
    if ".ffn.experts." not in k:
        return [(case.gguf_name(k), v)]
    _, _, layer, _, _, e, w, _ = k.split(".")
    seen = case.stacks.setdefault(layer, {})
    seen[(w, int(e))] = v
    n = case.config["ffn_config"]["moe_num_experts"]
    if len(seen) < 3 * n:
        return []
    names = {"w1": "ffn_gate_exps", "v1": "ffn_up_exps", "w2": "ffn_down_exps"}
    return [(f"blk.{layer}.{g}.weight", mx.stack([seen[(w, i)] for i in range(n)]))
            for w, g in names.items()]


CASES["dbrx"] = Case(
    "dbrx",
    DBRX,
    "dbrx",
    [
        u32("block_count", "n_layers"),
        u32("context_length", "max_seq_len"),
        u32("embedding_length", "d_model"),
        u32("feed_forward_length", lambda c: c["ffn_config"]["ffn_hidden_size"]),
        u32("attention.head_count", "n_heads"),
        u32("attention.head_count_kv", lambda c: c["attn_config"]["kv_n_heads"]),
        f32("rope.freq_base", lambda c: c["attn_config"]["rope_theta"]),
        f32("attention.clamp_kqv", lambda c: c["attn_config"]["clip_qkv"]),
        u32("expert_count", lambda c: c["ffn_config"]["moe_num_experts"]),
        u32("expert_used_count", lambda c: c["ffn_config"]["moe_top_k"]),
        f32("attention.layer_norm_epsilon", 1e-5),
    ] + GPT2,
    DBRX_PARTS,
    prefix="transformer.blocks",
    tensors=dbrx_tensors,
)
CASES["dbrx"].stacks = {}



# Hunyuan MoE (`hunyuan-moe`, Hunyuan-A13B; mlx-lm's `hunyuan`): HunYuanMoEModel writes
# TextModel's keys (no per-token expert count there: Hunyuan's is `moe_topk`), then the
# shared MLP's width (`intermediate_size`), the experts' width, the experts used, the shared
# count, and for its NTK-alpha rope the base already scaled as hunyuan-dense does, scaling
# "none" and a 256k context. Experts stacked, the router `mlp.gate.wg` as `ffn_gate_inp`, the
# shared MLP as `ffn_*_shexp`; every layer has its own K / V (llama.cpp has no CLA).
HUNYUAN_MOE = cfg("hunyuan", intermediate_size=32, attention_bias=False, moe_topk=2, num_experts=4,
                  num_shared_expert=1, use_mixed_mlp_moe=True, use_qk_norm=True, use_cla=False,
                  cla_share_factor=2, moe_intermediate_size=16, tie_word_embeddings=False,
                  rms_norm_eps=1e-5, max_position_embeddings=32768,
                  rope_scaling={"alpha": 50.0, "factor": 1.0, "type": "dynamic"})


def hunyuan_moe_base(c):
    d = c["hidden_size"] // c["num_attention_heads"]
    return c["rope_theta"] * (c["rope_scaling"]["alpha"] ** (d / (d - 2)))


CASES["hunyuan_moe"] = Case(
    "hunyuan",
    HUNYUAN_MOE,
    "hunyuan-moe",
    [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", 256 * 1024),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", "num_key_value_heads"),
        f32("rope.freq_base", hunyuan_moe_base),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("expert_count", "num_experts"),
        u32("expert_shared_feed_forward_length", "intermediate_size"),
        u32("expert_feed_forward_length", "moe_intermediate_size"),
        u32("expert_used_count", "moe_topk"),
        u32("expert_shared_count", "num_shared_expert"),
        text("rope.scaling.type", "none"),
        f32("rope.scaling.factor", 1.0),
        u32("rope.scaling.original_context_length", 256 * 1024),
    ] + GPT2,
    {
        "self_attn.query_layernorm": "attn_q_norm",
        "self_attn.key_layernorm": "attn_k_norm",
        "mlp.gate.wg": "ffn_gate_inp",
        "mlp.switch_mlp.gate_proj": "ffn_gate_exps",
        "mlp.switch_mlp.up_proj": "ffn_up_exps",
        "mlp.switch_mlp.down_proj": "ffn_down_exps",
        "mlp.shared_mlp.gate_proj": "ffn_gate_shexp",
        "mlp.shared_mlp.up_proj": "ffn_up_shexp",
        "mlp.shared_mlp.down_proj": "ffn_down_shexp",
    },
)



# Qwen3-VL MoE's text tower (`qwen3vlmoe`, mlx-lm's `qwen3_vl_moe`, whose model is qwen3_moe's
# under `language_model.`): Qwen3VLMoeTextModel writes Qwen3MoeModel's keys plus the
# interleaved-MRoPE sections (text positions make it plain rope, as mlx-lm runs it) and the
# deepstack layer count (the vision tower's; unused by text); experts stacked (the packed
# `gate_up_proj` split, `down_proj` transposed: each expert's Linear weight, as here).
QWEN3VLMOE_TEXT = cfg("qwen3_moe", head_dim=8, num_experts=4, num_experts_per_tok=2,
                      decoder_sparse_step=1, mlp_only_layers=[], moe_intermediate_size=16,
                      norm_topk_prob=True, rope_theta=5000000.0, tie_word_embeddings=False,
                      rope_scaling={"rope_type": "default", "mrope_section": [2, 1, 1],
                                    "mrope_interleaved": True})

CASES["qwen3vlmoe"] = Case(
    "qwen3_vl_moe",
    {"model_type": "qwen3_vl_moe", "text_config": QWEN3VLMOE_TEXT, "tie_word_embeddings": False},
    "qwen3vlmoe",
    [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", "num_key_value_heads"),
        arr("rope.dimension_sections", lambda c: mx.array([2, 1, 1, 0], dtype=mx.int32)),
        f32("rope.freq_base", "rope_theta"),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("expert_count", "num_experts"),
        u32("expert_used_count", "num_experts_per_tok"),
        u32("attention.key_length", "head_dim"),
        u32("attention.value_length", "head_dim"),
        u32("expert_feed_forward_length", "moe_intermediate_size"),
        u32("n_deepstack_layers", 3),
    ] + GPT2,
    {**EXPERTS},
    tensors=lambda case, k, v: [(case.gguf_name(k.removeprefix("language_model.")), v)],
    hparams=lambda c: c["text_config"],
)



# AFMoE (`afmoe`, Arcee Trinity): AfmoeModel writes LlamaModel's keys (TextModel's with the
# group routing, the gating function and the head size, plus the vocabulary size and rope
# width; nothing permuted: its tensors bypass the llama class) and the shared-expert count,
# the experts' width, the dense first blocks, the routed renormalization and scale and the
# sliding window; llama.cpp fixes the pattern (three sliding layers, then a full one) and
# always scales the embedding by sqrt(width) (mlx-lm's `mup_enabled`). The gated attention's
# `gate_proj` is `attn_gate`, `expert_bias` `exp_probs_b.bias`, experts stacked.
AFMOE = cfg("afmoe", num_hidden_layers=4, head_dim=8, num_experts=4, num_experts_per_tok=2,
            num_shared_experts=1, num_dense_layers=1, moe_intermediate_size=16, route_norm=True,
            route_scale=2.5, score_func="sigmoid", n_group=1, topk_group=1, sliding_window=4,
            mup_enabled=True, tie_word_embeddings=False,
            layer_types=["sliding_attention"] * 3 + ["full_attention"])


def afmoe_tensors(case, k, v):
    if k.endswith(".mlp.expert_bias"):
        return [(f"blk.{layer_of(k)}.exp_probs_b.bias", v)]
    return [(case.gguf_name(k), v)]


CASES["afmoe"] = Case(
    "afmoe",
    AFMOE,
    "afmoe",
    [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", "num_key_value_heads"),
        f32("rope.freq_base", "rope_theta"),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("expert_count", "num_experts"),
        u32("expert_used_count", "num_experts_per_tok"),
        u32("expert_group_count", "n_group"),
        u32("expert_group_used_count", "topk_group"),
        u32("expert_gating_func", 2),
        u32("attention.key_length", "head_dim"),
        u32("attention.value_length", "head_dim"),
        u32("vocab_size", "vocab_size"),
        u32("rope.dimension_count", "head_dim"),
        u32("expert_shared_count", "num_shared_experts"),
        u32("expert_feed_forward_length", "moe_intermediate_size"),
        u32("leading_dense_block_count", "num_dense_layers"),
        flag("expert_weights_norm", "route_norm"),
        f32("expert_weights_scale", "route_scale"),
        u32("attention.sliding_window", "sliding_window"),
    ] + GPT2,
    {
        "self_attn.gate_proj": "attn_gate",
        "post_attention_layernorm": "post_attention_norm",
        "pre_mlp_layernorm": "ffn_norm",
        "post_mlp_layernorm": "post_ffw_norm",
        "mlp.router.gate": "ffn_gate_inp",
        "mlp.experts.gate_proj": "ffn_gate_exps",
        "mlp.experts.up_proj": "ffn_up_exps",
        "mlp.experts.down_proj": "ffn_down_exps",
        "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
        "mlp.shared_experts.up_proj": "ffn_up_shexp",
        "mlp.shared_experts.down_proj": "ffn_down_shexp",
    },
    tensors=afmoe_tensors,
)



# Ling 1.0 (`bailingmoe`, Ling-lite / Ling-plus; mlx-lm's `bailing_moe`): BailingMoeModel splits
# the fused `query_key_value` into `attn_q` / `attn_k` / `attn_v`, Q / K permuted as the llama
# class does (K by the KV heads), and, with `norm_head`, writes the head divided by its
# column norms (+ 1e-7); its keys are TextModel's (softmax routing, no key for it) plus the
# rope width, the dense first blocks, the vocabulary size, the experts' width, a weights scale
# of 1, the shared count and the renormalization flag. The golden is mlx-lm on the weights
# read back (Q / K un-permuted and joined; the normalized head as stored).
BAILINGMOE = cfg("bailing_moe", num_hidden_layers=3, num_key_value_heads=2, intermediate_size=48,
                 moe_intermediate_size=16, num_experts=4, num_shared_experts=1,
                 num_experts_per_tok=2, norm_topk_prob=True, first_k_dense_replace=1,
                 norm_head=True, tie_word_embeddings=False)


def bailing1_tensors(case, k, v):
    c = case.config
    layer = layer_of(k)
    if k.endswith(".attention.query_key_value.weight"):
        h, kv, d = c["num_attention_heads"], c["num_key_value_heads"], head_size(c)
        q, kk, vv = mx.split(v, [h * d, (h + kv) * d], axis=0)
        return [(f"blk.{layer}.attn_q.weight", permute(q, h)), (f"blk.{layer}.attn_k.weight", permute(kk, kv)),
                (f"blk.{layer}.attn_v.weight", vv)]
    if k == "lm_head.weight":
        return [("output.weight", v / (mx.linalg.norm(v, axis=0, keepdims=True) + 1e-7))]
    return [(case.gguf_name(k), v)]


def bailing1_back(case, p, rest, v, loaded):
    c = case.config
    if rest in ("attn_k.weight", "attn_v.weight"):
        return None
    if rest == "attn_q.weight":
        layer = p.split(".")[2]
        q = unpermute(v, c["num_attention_heads"])
        kk = unpermute(loaded[f"blk.{layer}.attn_k.weight"], c["num_key_value_heads"])
        qkv = mx.concatenate([q, kk, loaded[f"blk.{layer}.attn_v.weight"]], axis=0)
        return f"{p}.attention.query_key_value.weight", qkv
    module, suffix = rest.rsplit(".", 1)
    return f"{p}.{case.inverse[module]}.{suffix}", v


CASES["bailingmoe"] = Case(
    "bailing_moe",
    BAILINGMOE,
    "bailingmoe",
    [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", "num_key_value_heads"),
        f32("rope.freq_base", "rope_theta"),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("expert_count", "num_experts"),
        u32("expert_used_count", "num_experts_per_tok"),
        u32("rope.dimension_count", head_size),
        u32("leading_dense_block_count", "first_k_dense_replace"),
        u32("vocab_size", "vocab_size"),
        u32("expert_feed_forward_length", "moe_intermediate_size"),
        f32("expert_weights_scale", 1.0),
        u32("expert_shared_count", "num_shared_experts"),
        flag("expert_weights_norm", "norm_topk_prob"),
    ] + GPT2,
    {
        "model.word_embeddings": "token_embd",
        "attention.dense": "attn_output",
        "mlp.gate.gate_proj": "ffn_gate_inp",
        "mlp.switch_mlp.gate_proj": "ffn_gate_exps",
        "mlp.switch_mlp.up_proj": "ffn_up_exps",
        "mlp.switch_mlp.down_proj": "ffn_down_exps",
        "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
        "mlp.shared_experts.up_proj": "ffn_up_shexp",
        "mlp.shared_experts.down_proj": "ffn_down_shexp",
    },
    tensors=bailing1_tensors,
    read_back=bailing1_back,
    inexact=lambda k: k == "lm_head.weight",
)



# PLaMo 2 (`plamo2`): Plamo2Model writes the layer kinds as per-layer `head_count` and
# `head_count_kv` lists (0 on Mamba layers, from `mamba_step`), the head size as key / value
# length, the Mamba sizes (inner = Mamba heads * head size, group count 0), and adds each
# RMSNorm's offset to its weight (pre-mixer, pre-MLP and final norms + 1, post-mixer + 1/5,
# post-MLP + 1/5**1.5); A as -exp(A_log), the conv kernel squeezed, the bare `dt_bias`,
# `*_norm_weight` and `q_weight` / `k_weight` renamed to `.bias` / `.weight` tensors. The
# golden is mlx-lm on the weights read back (the offsets subtracted in f32).
PLAMO2 = {
    "model_type": "plamo2",
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size_per_head": 8,
    "max_position_embeddings": 256,
    "mamba_d_state": 8,
    "mamba_d_conv": 4,
    "mamba_num_heads": 4,
    "mamba_step": 2,
    "mamba_enabled": True,
    "intermediate_size": 48,
    "vocab_size": 96,
}

PLAMO2_OFFSETS = {
    "pre_mixer_norm": 1.0,
    "post_mixer_norm": 1.0 / 5,
    "pre_mlp_norm": 1.0,
    "post_mlp_norm": 1.0 / (5**1.5),
}

PLAMO2_PARTS = {
    "pre_mixer_norm": "attn_norm",
    "post_mixer_norm": "post_attention_norm",
    "pre_mlp_norm": "ffn_norm",
    "post_mlp_norm": "post_ffw_norm",
    "mixer.qkv_proj": "attn_qkv",
    "mixer.o_proj": "attn_output",
    "mixer.in_proj": "ssm_in",
    "mixer.bcdt_proj": "ssm_x",
    "mixer.dt_proj": "ssm_dt",
    "mixer.out_proj": "ssm_out",
    "mlp.gate_up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}

PLAMO2_BARE = {
    "mixer.q_weight": "attn_q_norm.weight",
    "mixer.k_weight": "attn_k_norm.weight",
    "mixer.dt_norm_weight": "ssm_dt_norm.weight",
    "mixer.B_norm_weight": "ssm_b_norm.weight",
    "mixer.C_norm_weight": "ssm_c_norm.weight",
    "mixer.dt_bias": "ssm_dt.bias",
    "mixer.D": "ssm_d",
}


def plamo2_is_mamba(c, i):
    n, step = c["num_hidden_layers"], c["mamba_step"]
    if n <= step // 2:
        return i != n - 1
    return (i % step) != (step // 2)


def plamo2_tensors(case, k, v):
    if k == "model.norm.weight":
        return [("output_norm.weight", v + 1.0)]
    if not k.startswith("model.layers.layers."):
        return [(case.gguf_name(k), v)]
    layer, rest = k.split(".", 4)[3:]
    if rest == "mixer.A_log":
        return [(f"blk.{layer}.ssm_a", -mx.exp(v))]
    if rest in PLAMO2_BARE:
        return [(f"blk.{layer}.{PLAMO2_BARE[rest]}", v)]
    if rest == "mixer.conv1d.weight":
        return [(f"blk.{layer}.ssm_conv1d.weight", v.squeeze(-1))]
    module = rest.rsplit(".", 1)[0]
    if module in PLAMO2_OFFSETS:
        v = v + PLAMO2_OFFSETS[module]
    return [(case.gguf_name(k), v)]


def plamo2_back(case, p, rest, v, loaded):
    p = p.replace("model.layers", "model.layers.layers")
    if rest == "ssm_a":
        return f"{p}.mixer.A_log", mx.log(-v)
    if rest == "ssm_conv1d.weight":
        return f"{p}.mixer.conv1d.weight", v[..., None]
    for mk, g in PLAMO2_BARE.items():
        if rest == g:
            return f"{p}.{mk}", v
    module, suffix = rest.rsplit(".", 1)
    mk = case.inverse[module]
    if mk in PLAMO2_OFFSETS:
        v = v - PLAMO2_OFFSETS[mk]
    return f"{p}.{mk}.{suffix}", v


CASES["plamo2"] = Case(
    "plamo2",
    PLAMO2,
    "plamo2",
    [
        u32("vocab_size", "vocab_size"),
        u32("attention.head_count_kv", lambda c: [
            0 if plamo2_is_mamba(c, i) else c["num_key_value_heads"] for i in range(c["num_hidden_layers"])]),
        u32("attention.head_count", lambda c: [
            0 if plamo2_is_mamba(c, i) else c["num_attention_heads"] for i in range(c["num_hidden_layers"])]),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("attention.key_length", "hidden_size_per_head"),
        u32("attention.value_length", "hidden_size_per_head"),
        u32("block_count", "num_hidden_layers"),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        f32("rope.freq_base", 10000.0),
        u32("ssm.state_size", "mamba_d_state"),
        u32("ssm.conv_kernel", "mamba_d_conv"),
        u32("ssm.time_step_rank", "mamba_num_heads"),
        u32("ssm.inner_size", lambda c: c["mamba_num_heads"] * c["hidden_size_per_head"]),
        u32("ssm.group_count", 0),
        u32("feed_forward_length", "intermediate_size"),
    ] + GPT2,
    PLAMO2_PARTS,
    prefix="model.layers.layers",
    tensors=plamo2_tensors,
    read_back=plamo2_back,
    undo=lambda k, v: v - 1.0 if k == "output_norm.weight" else v,
    inexact=lambda k: k.endswith(("A_log", "norm.weight")),
)


# Nemotron-H with mixture-of-experts layers (`nemotron_h_moe`; Nemotron 3 Nano / Super):
# NemotronHModel with `num_experts_per_tok` in the config. The MoE layers are the ones with a
# `feed_forward_length` (moe_intermediate_size there, 0 elsewhere); then the expert keys (used,
# expert / shared widths, count, shared count, norm, scale, group count, latent size). The
# router's `e_score_correction_bias` is `exp_probs_b.bias`, the stacked experts
# `ffn_up_exps` / `ffn_down_exps`, the latent projections `ffn_latent_down` / `ffn_latent_up`.
# No `expert_group_used_count` is written, so one group (a file with more is refused, as by
# llama.cpp).
NEMOTRON_H_MOE = {
    **NEMOTRON_H,
    "hybrid_override_pattern": "ME*E",
    "moe_intermediate_size": 24,
    "moe_shared_expert_intermediate_size": 40,
    "moe_latent_size": 16,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
}

NEMOTRON_H_MOE_PARTS = {
    **NEMOTRON_H_PARTS,
    "mixer.gate": "ffn_gate_inp",
    "mixer.switch_mlp.fc1": "ffn_up_exps",
    "mixer.switch_mlp.fc2": "ffn_down_exps",
    "mixer.fc1_latent_proj": "ffn_latent_down",
    "mixer.fc2_latent_proj": "ffn_latent_up",
    "mixer.shared_experts.up_proj": "ffn_up_shexp",
    "mixer.shared_experts.down_proj": "ffn_down_shexp",
}


def nemotron_h_moe_tensors(case, k, v):
    if k.endswith("mixer.gate.e_score_correction_bias"):
        return [(f"blk.{k.split('.')[2]}.exp_probs_b.bias", v)]
    return mamba_tensors(case, k, v)


def nemotron_h_moe_back(case, p, rest, v, loaded):
    if rest == "exp_probs_b.bias":
        return f"{p.replace('model.layers', 'backbone.layers')}.mixer.gate.e_score_correction_bias", v
    return nemotron_h_back(case, p, rest, v, loaded)


CASES["nemotron_h_moe"] = Case(
    "nemotron_h",
    NEMOTRON_H_MOE,
    "nemotron_h_moe",
    CASES["nemotron_h"].meta + [
        u32("feed_forward_length",
            lambda c: [c["moe_intermediate_size"] if t == "E" else 0 for t in c["hybrid_override_pattern"]]),
        u32("expert_used_count", "num_experts_per_tok"),
        u32("expert_feed_forward_length", "moe_intermediate_size"),
        u32("expert_shared_feed_forward_length", "moe_shared_expert_intermediate_size"),
        u32("expert_count", "n_routed_experts"),
        u32("expert_shared_count", "n_shared_experts"),
        flag("expert_weights_norm", "norm_topk_prob"),
        f32("expert_weights_scale", "routed_scaling_factor"),
        u32("expert_group_count", "n_group"),
        u32("moe_latent_size", "moe_latent_size"),
    ],
    NEMOTRON_H_MOE_PARTS,
    permute_qk=True,
    prefix="backbone.layers",
    tensors=nemotron_h_moe_tensors,
    read_back=nemotron_h_moe_back,
)


# Step 3.5 (`step35`, mlx-lm's `step3p5`): Step35Model (TextModel) writes TextModel's keys (no
# KV head count: the config says `num_attention_groups`; a per-layer rope-theta list as
# `rope.freq_base` = its first entry and `rope.freq_base_swa` = its second; the head size as
# key / value length), then the per-layer head counts (the sliding layers' from
# `attention_other_setting`), the window and its per-layer pattern, the expert keys, the
# leading dense blocks, `moe_every_n_layers` and the per-layer SwiGLU clamps (None as 0).
# Partial rope is implied: half the head on full layers, all of it on sliding ones (the
# converter asserts those factors). Norm weights are written + 1 (the checkpoint's are zero
# centred), which is mlx-lm's weight after its sanitize, so they are stored as mlx-lm holds
# them; `router_bias` is `exp_probs_b.bias`, `g_proj` `attn_gate`, the experts stacked.
STEP35 = cfg("step3p5", num_hidden_layers=4, num_attention_groups=2, head_dim=8,
             sliding_window=6, rms_norm_eps=1e-5,
             layer_types=["full_attention", "sliding_attention"] * 2,
             rope_theta=[10000.0, 5000.0, 10000.0, 5000.0],
             partial_rotary_factors=[0.5, 1.0, 0.5, 1.0],
             attention_other_setting={"num_attention_heads": 2, "num_attention_groups": 1},
             moe_num_experts=4, moe_top_k=2, moe_intermediate_size=16, share_expert_dim=32,
             moe_layers_enum="1,2,3", moe_router_scaling_factor=2.0, norm_expert_weight=True,
             swiglu_limits=[None, 0.5, None, 0.8], swiglu_limits_shared=[0.7, None, 0.4, None],
             tie_word_embeddings=False)
del STEP35["num_key_value_heads"]


def step35_tensors(case, k, v):
    if k.endswith(".mlp.gate.router_bias"):
        return [(f"blk.{layer_of(k)}.exp_probs_b.bias", v)]
    return [(case.gguf_name(k), v)]


def _swa(c):
    return [t == "sliding_attention" for t in c["layer_types"]]


def _clamps(key):
    return lambda c: [0.0 if v is None else float(v) for v in c[key]]


CASES["step35"] = Case(
    "step3p5",
    STEP35,
    "step35",
    [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        f32("rope.freq_base", lambda c: c["rope_theta"][0]),
        f32("rope.freq_base_swa", lambda c: c["rope_theta"][1]),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("attention.key_length", "head_dim"),
        u32("attention.value_length", "head_dim"),
        u32("attention.head_count", lambda c: [
            c["attention_other_setting"]["num_attention_heads"] if w else c["num_attention_heads"]
            for w in _swa(c)]),
        u32("attention.head_count_kv", lambda c: [
            c["attention_other_setting"]["num_attention_groups"] if w else c["num_attention_groups"]
            for w in _swa(c)]),
        u32("attention.sliding_window", "sliding_window"),
        arr("attention.sliding_window_pattern", lambda c: mx.array(_swa(c))),
        u32("expert_count", "moe_num_experts"),
        u32("expert_used_count", "moe_top_k"),
        u32("expert_feed_forward_length", "moe_intermediate_size"),
        u32("expert_shared_feed_forward_length", "share_expert_dim"),
        f32("expert_weights_scale", "moe_router_scaling_factor"),
        flag("expert_weights_norm", "norm_expert_weight"),
        u32("leading_dense_block_count", 1),
        u32("moe_every_n_layers", 1),
        f32("swiglu_clamp_exp", _clamps("swiglu_limits")),
        f32("swiglu_clamp_shexp", _clamps("swiglu_limits_shared")),
    ] + GPT2,
    {
        "self_attn.g_proj": "attn_gate",
        "mlp.gate.gate": "ffn_gate_inp",
        "mlp.switch_mlp.gate_proj": "ffn_gate_exps",
        "mlp.switch_mlp.up_proj": "ffn_up_exps",
        "mlp.switch_mlp.down_proj": "ffn_down_exps",
        "mlp.share_expert.gate_proj": "ffn_gate_shexp",
        "mlp.share_expert.up_proj": "ffn_up_shexp",
        "mlp.share_expert.down_proj": "ffn_down_shexp",
    },
    tensors=step35_tensors,
)


# MiMo V2 Flash (`mimo2`, mlx-lm's `mimo_v2_flash`): MimoV2Model (TextModel) writes TextModel's
# keys (the expert count, top-k, groups and sigmoid gating, the rope bases, the head size as
# key / value length), then the per-layer KV heads (sliding layers' from
# `swa_num_key_value_heads`), the window, the per-layer pattern (ints), the value head size,
# the expert width, the rope width (head * partial_rotary_factor), the RMS epsilon and the
# value scale; block_count and the lists count the 3 MTP blocks it appends (this file has
# their entries, not their tensors, as a trunk-only file). The converter requires the sliding
# layers' head count and sizes to equal the full ones'; llama.cpp has no shared experts and
# always normalizes the routed weights, unscaled (no key carries mlx-lm's scale).
# `attention_sink_bias` is `attn_sinks.weight`, the correction bias `exp_probs_b.bias`.
MIMO2_MTP = 3
MIMO2 = {
    "model_type": "mimo_v2_flash",
    "num_experts_per_tok": 2,
    "hybrid_layer_pattern": [0, 1, 1, 0],
    "moe_layer_freq": [0, 1, 1, 1],
    "add_swa_attention_sink_bias": True,
    "add_full_attention_sink_bias": False,
    "sliding_window_size": 6,
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "moe_intermediate_size": 16,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "n_shared_experts": None,
    "n_routed_experts": 8,
    "routed_scaling_factor": None,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "n_group": 2,
    "topk_group": 1,
    "max_position_embeddings": 256,
    "layernorm_epsilon": 1e-5,
    "rope_theta": 10000.0,
    "swa_rope_theta": 1000.0,
    "swa_num_attention_heads": 4,
    "swa_num_key_value_heads": 1,
    "head_dim": 8,
    "v_head_dim": 16,
    "swa_head_dim": 8,
    "swa_v_head_dim": 16,
    "partial_rotary_factor": 0.5,
    "attention_value_scale": 0.7,
    "tie_word_embeddings": False,
}


def _mimo2_pattern(c):
    return list(c["hybrid_layer_pattern"]) + [1] * MIMO2_MTP


def mimo2_tensors(case, k, v):
    if k.endswith(".self_attn.attention_sink_bias"):
        return [(f"blk.{layer_of(k)}.attn_sinks.weight", v)]
    if k.endswith(".mlp.gate.e_score_correction_bias"):
        return [(f"blk.{layer_of(k)}.exp_probs_b.bias", v)]
    return [(case.gguf_name(k), v)]


CASES["mimo2"] = Case(
    "mimo_v2_flash",
    MIMO2,
    "mimo2",
    [
        u32("block_count", lambda c: c["num_hidden_layers"] + MIMO2_MTP),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", "num_key_value_heads"),
        f32("rope.freq_base", "rope_theta"),
        f32("rope.freq_base_swa", "swa_rope_theta"),
        u32("expert_count", "n_routed_experts"),
        u32("expert_used_count", "num_experts_per_tok"),
        u32("expert_group_count", "n_group"),
        u32("expert_group_used_count", "topk_group"),
        u32("expert_gating_func", 2),
        u32("attention.key_length", "head_dim"),
        u32("attention.value_length", "head_dim"),
        u32("attention.head_count_kv", lambda c: [
            c["swa_num_key_value_heads"] if s == 1 else c["num_key_value_heads"]
            for s in _mimo2_pattern(c)]),
        u32("attention.sliding_window", "sliding_window_size"),
        arr("attention.sliding_window_pattern",
            lambda c: mx.array(_mimo2_pattern(c), dtype=mx.int32)),
        u32("attention.value_length", "v_head_dim"),
        u32("expert_feed_forward_length", "moe_intermediate_size"),
        u32("rope.dimension_count", lambda c: int(c["head_dim"] * c["partial_rotary_factor"])),
        f32("attention.layer_norm_rms_epsilon", "layernorm_epsilon"),
        f32("attention.value_scale", "attention_value_scale"),
        u32("nextn_predict_layers", MIMO2_MTP),
    ] + GPT2,
    {
        "mlp.gate": "ffn_gate_inp",
        "mlp.switch_mlp.gate_proj": "ffn_gate_exps",
        "mlp.switch_mlp.up_proj": "ffn_up_exps",
        "mlp.switch_mlp.down_proj": "ffn_down_exps",
    },
    tensors=mimo2_tensors,
)


# Laguna (`laguna`, poolside Laguna XS.2): LagunaModel (TextModel) writes TextModel's keys
# (expert count and top-k, the full layers' rope as `rope_parameters.full_attention` gives it:
# YaRN type, factor, original context and betas, `rope.freq_base`, the sliding layers' base
# as `rope.freq_base_swa`, the head size as key / value length), then the vocabulary size, the
# per-layer head counts, the window (no per-layer pattern: llama.cpp places a full layer every
# 4th, from the first), the expert and shared widths, the routed normalization (always), its
# scale, sigmoid gating, the dense first blocks and each kind's rope width. The router has no
# soft cap in llama.cpp. The per-head gate `g_proj` is `attn_gate`, the correction bias
# `exp_probs_b.bias`, experts stacked.
LAGUNA = cfg("laguna", num_hidden_layers=4, head_dim=8, num_key_value_heads=2,
             num_attention_heads_per_layer=[4, 2, 2, 2], sliding_window=6,
             layer_types=["full_attention"] + ["sliding_attention"] * 3,
             mlp_layer_types=["dense"] + ["sparse"] * 3, gating=True,
             rope_parameters={
                 "full_attention": {"rope_theta": 50000.0, "partial_rotary_factor": 0.5,
                                    "rope_type": "yarn", "factor": 4.0,
                                    "original_max_position_embeddings": 64,
                                    "beta_fast": 32.0, "beta_slow": 1.0},
                 "sliding_attention": {"rope_theta": 10000.0, "partial_rotary_factor": 1.0},
             },
             num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
             shared_expert_intermediate_size=24, moe_routed_scaling_factor=2.0,
             moe_router_score_func="sigmoid", moe_router_logit_softcapping=0.0,
             tie_word_embeddings=False)
del LAGUNA["rope_theta"]


def laguna_tensors(case, k, v):
    if k.endswith(".mlp.gate.e_score_correction_bias"):
        return [(f"blk.{layer_of(k)}.exp_probs_b.bias", v)]
    return [(case.gguf_name(k), v)]


def _rope(c, kind, k):
    return c["rope_parameters"][kind][k]


CASES["laguna"] = Case(
    "laguna",
    LAGUNA,
    "laguna",
    [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", "num_key_value_heads"),
        text("rope.scaling.type", "yarn"),
        f32("rope.scaling.factor", lambda c: _rope(c, "full_attention", "factor")),
        u32("rope.scaling.original_context_length",
            lambda c: _rope(c, "full_attention", "original_max_position_embeddings")),
        f32("rope.scaling.yarn_beta_fast", lambda c: _rope(c, "full_attention", "beta_fast")),
        f32("rope.scaling.yarn_beta_slow", lambda c: _rope(c, "full_attention", "beta_slow")),
        f32("rope.freq_base", lambda c: _rope(c, "full_attention", "rope_theta")),
        f32("rope.freq_base_swa", lambda c: _rope(c, "sliding_attention", "rope_theta")),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("expert_count", "num_experts"),
        u32("expert_used_count", "num_experts_per_tok"),
        u32("attention.key_length", "head_dim"),
        u32("attention.value_length", "head_dim"),
        u32("vocab_size", "vocab_size"),
        u32("attention.head_count", "num_attention_heads_per_layer"),
        u32("attention.sliding_window", "sliding_window"),
        u32("expert_feed_forward_length", "moe_intermediate_size"),
        u32("expert_shared_feed_forward_length", "shared_expert_intermediate_size"),
        flag("expert_weights_norm", True),
        f32("expert_weights_scale", "moe_routed_scaling_factor"),
        u32("expert_gating_func", 2),
        u32("leading_dense_block_count", 1),
        u32("rope.dimension_count", lambda c: int(
            c["head_dim"] * _rope(c, "full_attention", "partial_rotary_factor"))),
        u32("rope.dimension_count_swa", lambda c: int(
            c["head_dim"] * _rope(c, "sliding_attention", "partial_rotary_factor"))),
    ] + GPT2,
    {
        "self_attn.g_proj": "attn_gate",
        "mlp.gate.proj": "ffn_gate_inp",
        "mlp.switch_mlp.gate_proj": "ffn_gate_exps",
        "mlp.switch_mlp.up_proj": "ffn_up_exps",
        "mlp.switch_mlp.down_proj": "ffn_down_exps",
        "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
        "mlp.shared_expert.up_proj": "ffn_up_shexp",
        "mlp.shared_expert.down_proj": "ffn_down_shexp",
    },
    tensors=laguna_tensors,
)


# Kimi Linear (`kimi-linear`, mlx-lm's `kimi_linear`): KimiLinearModel (TextModel) writes
# TextModel's keys with the KV head count forced to 1 (the context from `model_max_length`,
# the experts, top-k, `topk_group`, sigmoid gating, the head size), then the vocabulary size,
# the per-layer KV heads (1 on MLA layers, 0 on KDA ones), the short-conv kernel, the KDA head
# size, the KV LoRA rank, the rope width (`qk_rope_head_dim`; MLA has no rope here), the key
# length (rank + rope) and MLA's key / value head sizes, the experts' width, the shared-expert
# count, the dense first blocks and the routed scale. KDA layers: A as -exp(A_log) (shape
# kept), `dt_bias` as `ssm_dt.bias`, the q / k / v convolutions as (1, channels, 1, kernel),
# f / g / beta projections and `o_norm` under `ssm_*`; MLA's `kv_b_proj` split into `attn_k_b`
# (transposed) and `attn_v_b`, which are mlx-lm's `embed_q` / `unembed_out`. llama.cpp's router
# is not grouped (the converter writes no group count) and always renormalizes. The golden is
# mlx-lm on the weights read back.
KIMI_LINEAR = cfg("kimi_linear", num_hidden_layers=3, num_key_value_heads=4, head_dim=8,
                  model_max_length=256, num_experts=4, moe_intermediate_size=16,
                  kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
                  mla_use_nope=True, num_experts_per_token=2, num_shared_experts=1,
                  first_k_dense_replace=1, num_expert_group=1, topk_group=1,
                  routed_scaling_factor=2.5, moe_router_activation_func="sigmoid",
                  moe_renormalize=True, tie_word_embeddings=False,
                  linear_attn_config={"num_heads": 4, "head_dim": 8, "kda_layers": [1, 3],
                                      "full_attn_layers": [2], "short_conv_kernel_size": 4})

KIMI_KDA = {
    "self_attn.q_conv.conv.weight": "ssm_conv1d_q.weight",
    "self_attn.k_conv.conv.weight": "ssm_conv1d_k.weight",
    "self_attn.v_conv.conv.weight": "ssm_conv1d_v.weight",
}


def kimi_tensors(case, k, v):
    layer = layer_of(k)
    rest = k.split(".", 3)[3] if layer is not None else None
    if rest in KIMI_KDA:
        # mlx-lm's (C, K, 1) is the checkpoint's (C, 1, K) moved; the converter writes it as
        # (1, C, 1, K).
        c, kk, _ = v.shape
        return [(f"blk.{layer}.{KIMI_KDA[rest]}", v.reshape(1, c, 1, kk))]
    if rest == "self_attn.A_log":
        return [(f"blk.{layer}.ssm_a", -mx.exp(v))]
    if rest == "self_attn.dt_bias":
        return [(f"blk.{layer}.ssm_dt.bias", v)]
    if rest == "mlp.e_score_correction_bias":
        return [(f"blk.{layer}.exp_probs_b.bias", v)]
    return [(case.gguf_name(k), v)]


def kimi_back(case, p, rest, v, loaded):
    for mk, g in KIMI_KDA.items():
        if rest == g:
            return f"{p}.{mk}", v.reshape(v.shape[1], v.shape[3], 1)
    if rest == "ssm_a":
        return f"{p}.self_attn.A_log", mx.log(-v)
    if rest == "ssm_dt.bias":
        return f"{p}.self_attn.dt_bias", v
    if rest == "exp_probs_b.bias":
        return f"{p}.mlp.e_score_correction_bias", v
    module, suffix = rest.rsplit(".", 1)
    return f"{p}.{case.inverse[module]}.{suffix}", v


def _kimi_mla(c, i):
    return (i + 1) in c["linear_attn_config"]["full_attn_layers"]


CASES["kimi_linear"] = Case(
    "kimi_linear",
    KIMI_LINEAR,
    "kimi-linear",
    [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "model_max_length"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", 1),
        f32("rope.freq_base", "rope_theta"),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("expert_count", "num_experts"),
        u32("expert_used_count", "num_experts_per_token"),
        u32("expert_group_used_count", "topk_group"),
        u32("expert_gating_func", 2),
        u32("attention.key_length", "head_dim"),
        u32("attention.value_length", "head_dim"),
        u32("vocab_size", "vocab_size"),
        u32("attention.head_count_kv", lambda c: [
            1 if _kimi_mla(c, i) else 0 for i in range(c["num_hidden_layers"])]),
        u32("ssm.conv_kernel", lambda c: c["linear_attn_config"]["short_conv_kernel_size"]),
        u32("kda.head_dim", lambda c: c["linear_attn_config"]["head_dim"]),
        u32("attention.kv_lora_rank", "kv_lora_rank"),
        u32("rope.dimension_count", "qk_rope_head_dim"),
        u32("attention.key_length", lambda c: c["kv_lora_rank"] + c["qk_rope_head_dim"]),
        u32("attention.key_length_mla", lambda c: c["qk_nope_head_dim"] + c["qk_rope_head_dim"]),
        u32("attention.value_length_mla", "v_head_dim"),
        u32("expert_feed_forward_length", "moe_intermediate_size"),
        u32("expert_shared_count", "num_shared_experts"),
        u32("leading_dense_block_count", "first_k_dense_replace"),
        f32("expert_weights_scale", "routed_scaling_factor"),
    ] + GPT2,
    {
        "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
        "self_attn.kv_a_layernorm": "attn_kv_a_norm",
        "self_attn.embed_q": "attn_k_b",
        "self_attn.unembed_out": "attn_v_b",
        "self_attn.f_a_proj": "ssm_f_a",
        "self_attn.f_b_proj": "ssm_f_b",
        "self_attn.b_proj": "ssm_beta",
        "self_attn.g_a_proj": "ssm_g_a",
        "self_attn.g_b_proj": "ssm_g_b",
        "self_attn.o_norm": "ssm_norm",
        "mlp.gate": "ffn_gate_inp",
        "mlp.switch_mlp.gate_proj": "ffn_gate_exps",
        "mlp.switch_mlp.up_proj": "ffn_up_exps",
        "mlp.switch_mlp.down_proj": "ffn_down_exps",
        "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
        "mlp.shared_experts.up_proj": "ffn_up_shexp",
        "mlp.shared_experts.down_proj": "ffn_down_shexp",
    },
    tensors=kimi_tensors,
    read_back=kimi_back,
)


# Ling 3.0 (`bailingmoe3`, mlx-lm's `bailing_moe_v3`): BailingMoeV3Model writes TextModel's
# keys with the KV head count forced to 1 (experts, top-k, groups, sigmoid gating, the KDA head
# size as `key_length`), then the per-layer KV heads (1 on the MLA layers, MTP included; 0 on
# KDA ones: mlx-lm's `layer_group_size` is the one that gives this pattern), the vocabulary
# size, the short-conv kernel, the KDA head size, the safe gate and its lower bound, the Q and
# KV LoRA ranks, the rope width, the key length (rank + rope), MLA's key / value head sizes,
# the experts' and shared experts' widths, the shared count, the dense first blocks, the routed
# scale, top-k renormalization and the MTP layer count (its layer after the main ones,
# skipped). KDA layers: A as exp(A_log) reshaped (heads, 1), `dt_bias` as `ssm_dt.bias`, the
# q / k / v convolutions as (1, channels, 1, kernel), `f_proj` as `ssm_f_a`, `g_proj` as
# `ssm_g_a` there and as `attn_gate` on MLA layers, `o_proj` and MLA's `dense` both
# `attn_output`; `kv_b_proj` split into `attn_k_b` (transposed) and `attn_v_b` (mlx-lm's
# `embed_q` / `unembed_out`); `expert_bias` as `exp_probs_b.bias`. The golden is mlx-lm on the
# weights read back.
BAILING_V3 = cfg("bailing_moe_v3", num_hidden_layers=5, layer_group_size=2, head_dim=8,
                 intermediate_size=48, moe_intermediate_size=16,
                 moe_shared_expert_intermediate_size=16, num_experts=8, num_experts_per_tok=2,
                 num_shared_experts=1, first_k_dense_replace=1, n_group=4, topk_group=2,
                 routed_scaling_factor=2.5, q_lora_rank=16, kv_lora_rank=16,
                 qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
                 short_conv_kernel_size=4, kda_lower_bound=-5.0, kda_safe_gate=True,
                 no_kda_lora=True, score_function="sigmoid", norm_topk_prob=True,
                 num_nextn_predict_layers=1, tie_word_embeddings=False)

BAILING_V3_CONV = {
    "attention.q_conv1d.weight": "ssm_conv1d_q.weight",
    "attention.k_conv1d.weight": "ssm_conv1d_k.weight",
    "attention.v_conv1d.weight": "ssm_conv1d_v.weight",
}


def _bailing_v3_kda(c, i):
    g, n = c["layer_group_size"], c["num_hidden_layers"]
    return not ((i + 1) % g == 0 or i >= n // g * g)


def bailing_v3_tensors(case, k, v):
    layer = layer_of(k)
    rest = k.split(".", 3)[3] if layer is not None else None
    kda = layer is not None and _bailing_v3_kda(case.config, int(layer))
    if rest in BAILING_V3_CONV:
        c, kk, _ = v.shape
        return [(f"blk.{layer}.{BAILING_V3_CONV[rest]}", v.reshape(1, c, 1, kk))]
    if rest == "attention.A_log":
        return [(f"blk.{layer}.ssm_a", mx.exp(v).reshape(-1, 1))]
    if rest == "attention.dt_bias":
        return [(f"blk.{layer}.ssm_dt.bias", v)]
    if rest == "attention.g_proj.weight":
        return [(f"blk.{layer}.{'ssm_g_a' if kda else 'attn_gate'}.weight", v)]
    if rest == "mlp.gate.expert_bias":
        return [(f"blk.{layer}.exp_probs_b.bias", v)]
    return [(case.gguf_name(k), v)]


def bailing_v3_back(case, p, rest, v, loaded):
    kda = _bailing_v3_kda(case.config, int(p.split(".")[2]))
    for mk, g in BAILING_V3_CONV.items():
        if rest == g:
            return f"{p}.{mk}", v.reshape(v.shape[1], v.shape[3], 1)
    if rest == "ssm_a":
        return f"{p}.attention.A_log", mx.log(v).reshape(-1)
    if rest == "ssm_dt.bias":
        return f"{p}.attention.dt_bias", v
    if rest in ("ssm_g_a.weight", "attn_gate.weight"):
        return f"{p}.attention.g_proj.weight", v
    if rest == "attn_output.weight":
        return f"{p}.attention.{'o_proj' if kda else 'dense'}.weight", v
    if rest == "exp_probs_b.bias":
        return f"{p}.mlp.gate.expert_bias", v
    module, suffix = rest.rsplit(".", 1)
    return f"{p}.{case.inverse[module]}.{suffix}", v


CASES["bailingmoe3"] = Case(
    "bailing_moe_v3",
    BAILING_V3,
    "bailingmoe3",
    [
        u32("block_count", plus_mtp),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", 1),
        f32("rope.freq_base", "rope_theta"),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("expert_count", "num_experts"),
        u32("expert_used_count", "num_experts_per_tok"),
        u32("expert_group_count", "n_group"),
        u32("expert_group_used_count", "topk_group"),
        u32("expert_gating_func", 2),
        u32("attention.key_length", "head_dim"),
        u32("attention.value_length", "head_dim"),
        u32("attention.head_count_kv", lambda c: [
            0 if i < c["num_hidden_layers"] and _bailing_v3_kda(c, i) else 1
            for i in range(plus_mtp(c))]),
        u32("vocab_size", "vocab_size"),
        u32("ssm.conv_kernel", "short_conv_kernel_size"),
        u32("kda.head_dim", "head_dim"),
        flag("kda.safe_gate", "kda_safe_gate"),
        f32("kda.gate_lower_bound", "kda_lower_bound"),
        u32("attention.q_lora_rank", "q_lora_rank"),
        u32("attention.kv_lora_rank", "kv_lora_rank"),
        u32("rope.dimension_count", "qk_rope_head_dim"),
        u32("attention.key_length", lambda c: c["kv_lora_rank"] + c["qk_rope_head_dim"]),
        u32("attention.key_length_mla", lambda c: c["qk_nope_head_dim"] + c["qk_rope_head_dim"]),
        u32("attention.value_length_mla", "v_head_dim"),
        u32("expert_feed_forward_length", "moe_intermediate_size"),
        u32("expert_shared_feed_forward_length", "moe_shared_expert_intermediate_size"),
        u32("expert_shared_count", "num_shared_experts"),
        u32("leading_dense_block_count", "first_k_dense_replace"),
        f32("expert_weights_scale", "routed_scaling_factor"),
        flag("expert_weights_norm", "norm_topk_prob"),
        u32("nextn_predict_layers", "num_nextn_predict_layers"),
    ] + GPT2,
    {
        "model.word_embeddings": "token_embd",
        "attention.q_proj": "attn_q",
        "attention.k_proj": "attn_k",
        "attention.v_proj": "attn_v",
        "attention.o_proj": "attn_output",
        "attention.f_proj": "ssm_f_a",
        "attention.b_proj": "ssm_beta",
        "attention.o_norm": "ssm_norm",
        "attention.q_a_proj": "attn_q_a",
        "attention.q_a_layernorm": "attn_q_a_norm",
        "attention.q_b_proj": "attn_q_b",
        "attention.kv_a_proj_with_mqa": "attn_kv_a_mqa",
        "attention.kv_a_layernorm": "attn_kv_a_norm",
        "attention.embed_q": "attn_k_b",
        "attention.unembed_out": "attn_v_b",
        "attention.dense": "attn_output",
        "mlp.gate": "ffn_gate_inp",
        "mlp.switch_mlp.gate_proj": "ffn_gate_exps",
        "mlp.switch_mlp.up_proj": "ffn_up_exps",
        "mlp.switch_mlp.down_proj": "ffn_down_exps",
        "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
        "mlp.shared_experts.up_proj": "ffn_up_shexp",
        "mlp.shared_experts.down_proj": "ffn_down_shexp",
    },
    tensors=bailing_v3_tensors,
    extra=[mtp_layer(1.0)],
    read_back=bailing_v3_back,
)


# MiniMax M3's text tower (`minimax-m3`, mlx-lm's `minimax_m3_vl`, its model under
# `language_model.`): MiniMaxM3Model writes MiniMaxM2Model's keys (TextModel's: the dense
# layers' width as `feed_forward_length`, sigmoid gating, the head size; the experts' width,
# the rotated width) and the shared-expert count, the routed scale, top-k renormalization
# (always), the MSA indexer's heads, key size, top-k blocks, block size and local blocks, and
# the dense first blocks (leading zeros of `moe_layer_freq`; llama.cpp puts the indexer on the
# MoE layers). Every `*norm.weight` is written as 1 + w (mlx-lm's Gemma norms add the 1 back),
# `e_score_correction_bias` as `exp_probs_b.bias`, experts stacked. The golden is mlx-lm on the
# weights read back (each norm minus 1).
MINIMAX_M3_TEXT = cfg("minimax_m3", num_hidden_layers=3, head_dim=8, rotary_dim=4,
                      intermediate_size=16, dense_intermediate_size=48,
                      shared_intermediate_size=16, num_local_experts=4, num_experts_per_tok=2,
                      n_shared_experts=1, routed_scaling_factor=2.0, use_qk_norm=True,
                      use_gemma_norm=True, scoring_func="sigmoid", moe_layer_freq=[0, 1, 1],
                      tie_word_embeddings=False,
                      sparse_attention_config={"sparse_num_index_heads": 2,
                                               "sparse_index_dim": 8,
                                               "sparse_topk_blocks": 2,
                                               "sparse_block_size": 2,
                                               "sparse_local_block": 1,
                                               "sparse_attention_freq": [0, 1, 1]})


def minimax_m3_tensors(case, k, v):
    k = k.removeprefix("language_model.")
    if k.endswith("norm.weight"):
        v = v + 1.0
    if k.endswith(".block_sparse_moe.e_score_correction_bias"):
        return [(f"blk.{layer_of(k)}.exp_probs_b.bias", v)]
    return [(case.gguf_name(k), v)]


def minimax_m3_back(case, p, rest, v, loaded):
    if rest == "exp_probs_b.bias":
        return f"{p}.block_sparse_moe.e_score_correction_bias", v
    module, suffix = rest.rsplit(".", 1)
    return f"{p}.{case.inverse[module]}.{suffix}", v


CASES["minimax_m3"] = Case(
    "minimax_m3_vl",
    # The outer layer count is the read-back's (no MTP layer to skip).
    {"model_type": "minimax_m3_vl", "text_config": MINIMAX_M3_TEXT, "tie_word_embeddings": False,
     "num_hidden_layers": MINIMAX_M3_TEXT["num_hidden_layers"]},
    "minimax-m3",
    [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "dense_intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", "num_key_value_heads"),
        f32("rope.freq_base", "rope_theta"),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("expert_count", "num_local_experts"),
        u32("expert_used_count", "num_experts_per_tok"),
        u32("expert_gating_func", 2),
        u32("attention.key_length", "head_dim"),
        u32("attention.value_length", "head_dim"),
        u32("expert_feed_forward_length", "intermediate_size"),
        u32("rope.dimension_count", "rotary_dim"),
        u32("expert_shared_count", "n_shared_experts"),
        f32("expert_weights_scale", "routed_scaling_factor"),
        flag("expert_weights_norm", True),
        u32("attention.indexer.head_count",
            lambda c: c["sparse_attention_config"]["sparse_num_index_heads"]),
        u32("attention.indexer.key_length",
            lambda c: c["sparse_attention_config"]["sparse_index_dim"]),
        u32("attention.indexer.top_k",
            lambda c: c["sparse_attention_config"]["sparse_topk_blocks"]),
        u32("attention.indexer.block_size",
            lambda c: c["sparse_attention_config"]["sparse_block_size"]),
        u32("attention.indexer.local_blocks",
            lambda c: c["sparse_attention_config"]["sparse_local_block"]),
        u32("leading_dense_block_count",
            lambda c: next(i for i, f in enumerate(c["moe_layer_freq"]) if f)),
    ] + GPT2,
    {
        "self_attn.index_q_proj": "indexer.q_proj",
        "self_attn.index_k_proj": "indexer.k_proj",
        "self_attn.index_q_norm": "indexer.q_norm",
        "self_attn.index_k_norm": "indexer.k_norm",
        "block_sparse_moe.gate": "ffn_gate_inp",
        "block_sparse_moe.switch_mlp.gate_proj": "ffn_gate_exps",
        "block_sparse_moe.switch_mlp.up_proj": "ffn_up_exps",
        "block_sparse_moe.switch_mlp.down_proj": "ffn_down_exps",
        "block_sparse_moe.shared_experts.gate_proj": "ffn_gate_shexp",
        "block_sparse_moe.shared_experts.up_proj": "ffn_up_shexp",
        "block_sparse_moe.shared_experts.down_proj": "ffn_down_shexp",
    },
    tensors=minimax_m3_tensors,
    hparams=lambda c: c["text_config"],
    read_back=minimax_m3_back,
    wrap="language_model.",
    undo=lambda k, v: v - 1.0 if k.endswith("norm.weight") else v,
    inexact=lambda k: k.endswith("norm.weight"),
)


# Kimi K3 (`kimi-k3`, mlx-lm's `kimi_k3`, its text model under `language_model.`): KimiK3Model
# writes TextModel's keys with the KV head count forced to 1 (no rope base: the MLA is NoPE),
# the experts, top-k and sigmoid gating, then the vocabulary size, the per-layer KV heads (0 on
# KDA layers), the short-conv kernel, the KDA head size and gate lower bound, the LoRA ranks,
# the rope width, key / value lengths (latent) and MLA's head sizes, the experts' width, the
# shared count, the dense first blocks, the routed scale and renormalization, the latent
# width, the SiTU betas and the attention-residual block size. Tensors: each
# `<x>_res_norm` * `<x>_res_proj` fused into one vector (`attn_res_score`, `ffn_res_score`,
# `output_res_score`; mlx-lm only ever uses that product), `g_proj` as `ssm_g` on KDA layers and
# `attn_gate` on MLA layers, the fused `qkv_proj` / `qkv_conv` as the checkpoint's q / k / v
# (the convolutions (1, channels, 1, kernel)), A as -exp(A_log), `dt_bias` as `ssm_dt.bias`,
# `kv_b_proj` split (mlx-lm's `embed_q` / `unembed_out`), the latent projections and norm as
# `ffn_routed_*`. The golden is mlx-lm on the weights read back (each fused vector as the
# norm's weight, the projection ones).
KIMI_K3 = cfg("kimi_k3", num_hidden_layers=4, num_key_value_heads=4, intermediate_size=48,
              hidden_act="situ", activation_situ_beta=1.5, activation_situ_linear_beta=2.0,
              attn_res_block_size=2, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8,
              qk_rope_head_dim=8, v_head_dim=8, mla_use_nope=True, mla_use_output_gate=True,
              num_experts=8, num_experts_per_token=2, num_shared_experts=1,
              moe_intermediate_size=16, moe_router_activation_func="sigmoid",
              moe_renormalize=True, routed_scaling_factor=2.5, first_k_dense_replace=1,
              num_expert_group=1, topk_group=1, routed_expert_hidden_size=16,
              latent_moe_use_norm=True, tie_word_embeddings=False,
              linear_attn_config={"num_heads": 4, "head_dim": 8, "kda_layers": [1, 2, 4],
                                  "full_attn_layers": [3], "short_conv_kernel_size": 4,
                                  "gate_lower_bound": -5.0, "use_full_rank_gate": True})

K3_RES = {
    "self_attention_res": "attn_res_score",
    "mlp_res": "ffn_res_score",
    "output_attn_res": "output_res_score",
}
_k3_res_parts = {}


def _k3_kda(c, layer):
    return (int(layer) + 1) in c["linear_attn_config"]["kda_layers"]


def kimi_k3_tensors(case, k, v):
    k = k.removeprefix("language_model.")
    layer = layer_of(k)
    rest = k.split(".", 3)[3] if layer is not None else k.removeprefix("model.")
    for src, dst in K3_RES.items():
        for kind in ("norm", "proj"):
            if rest == f"{src}_{kind}.weight":
                key = (layer, src)
                other = _k3_res_parts.pop(key, None)
                if other is None:
                    _k3_res_parts[key] = (kind, v)
                    return []
                norm = v if kind == "norm" else other[1]
                proj = v if kind == "proj" else other[1]
                name = f"blk.{layer}.{dst}.weight" if layer is not None else f"{dst}.weight"
                return [(name, norm.astype(mx.float32).reshape(-1) * proj.astype(mx.float32).reshape(-1))]
    if rest == "self_attn.qkv_proj.weight":
        q, kk, vv = mx.split(v, 3, axis=0)
        return [(f"blk.{layer}.attn_{n}.weight", t) for n, t in (("q", q), ("k", kk), ("v", vv))]
    if rest == "self_attn.qkv_conv.conv.weight":
        out = []
        for n, t in zip("qkv", mx.split(v, 3, axis=0)):
            c, kk, _ = t.shape
            out.append((f"blk.{layer}.ssm_conv1d_{n}.weight", t.reshape(1, c, 1, kk)))
        return out
    if rest == "self_attn.A_log":
        return [(f"blk.{layer}.ssm_a", -mx.exp(v))]
    if rest == "self_attn.dt_bias":
        return [(f"blk.{layer}.ssm_dt.bias", v)]
    if rest == "self_attn.g_proj.weight":
        return [(f"blk.{layer}.{'ssm_g' if _k3_kda(case.config, layer) else 'attn_gate'}.weight", v)]
    if rest == "mlp.e_score_correction_bias":
        return [(f"blk.{layer}.exp_probs_b.bias", v)]
    return [(case.gguf_name(k), v)]


def kimi_k3_back(case, p, rest, v, loaded):
    layer = p.split(".")[2]
    h = case.config["hidden_size"]
    res = {f"{dst}.weight": src for src, dst in K3_RES.items()}
    if rest in res:
        src = res[rest]
        return [(f"{p}.{src}_norm.weight", v), (f"{p}.{src}_proj.weight", mx.ones((1, h)))]
    if _k3_kda(case.config, layer):
        if rest in ("attn_k.weight", "attn_v.weight", "ssm_conv1d_k.weight", "ssm_conv1d_v.weight"):
            return None
        if rest == "attn_q.weight":
            parts = [loaded[f"blk.{layer}.attn_{n}.weight"] for n in "qkv"]
            return f"{p}.self_attn.qkv_proj.weight", mx.concatenate(parts, axis=0)
        if rest == "ssm_conv1d_q.weight":
            parts = [loaded[f"blk.{layer}.ssm_conv1d_{n}.weight"] for n in "qkv"]
            parts = [t.reshape(t.shape[1], t.shape[3], 1) for t in parts]
            return f"{p}.self_attn.qkv_conv.conv.weight", mx.concatenate(parts, axis=0)
    if rest == "ssm_a":
        return f"{p}.self_attn.A_log", mx.log(-v)
    if rest == "ssm_dt.bias":
        return f"{p}.self_attn.dt_bias", v
    if rest in ("ssm_g.weight", "attn_gate.weight"):
        return f"{p}.self_attn.g_proj.weight", v
    if rest == "exp_probs_b.bias":
        return f"{p}.mlp.e_score_correction_bias", v
    module, suffix = rest.rsplit(".", 1)
    return f"{p}.{case.inverse[module]}.{suffix}", v


def kimi_k3_top(case, k, v):
    if k == "output_res_score.weight":
        h = case.config["hidden_size"]
        return [("model.output_attn_res_norm.weight", v),
                ("model.output_attn_res_proj.weight", mx.ones((1, h)))]
    return None


CASES["kimi_k3"] = Case(
    "kimi_k3",
    KIMI_K3,
    "kimi-k3",
    [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", 1),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("expert_count", "num_experts"),
        u32("expert_used_count", "num_experts_per_token"),
        u32("expert_gating_func", 2),
        u32("vocab_size", "vocab_size"),
        u32("attention.head_count_kv", lambda c: [
            0 if _k3_kda(c, i) else 1 for i in range(c["num_hidden_layers"])]),
        u32("ssm.conv_kernel", lambda c: c["linear_attn_config"]["short_conv_kernel_size"]),
        u32("kda.head_dim", lambda c: c["linear_attn_config"]["head_dim"]),
        f32("kda.gate_lower_bound", lambda c: c["linear_attn_config"]["gate_lower_bound"]),
        u32("attention.q_lora_rank", "q_lora_rank"),
        u32("attention.kv_lora_rank", "kv_lora_rank"),
        u32("rope.dimension_count", "qk_rope_head_dim"),
        u32("attention.key_length", lambda c: c["kv_lora_rank"] + c["qk_rope_head_dim"]),
        u32("attention.value_length", "kv_lora_rank"),
        u32("attention.key_length_mla", lambda c: c["qk_nope_head_dim"] + c["qk_rope_head_dim"]),
        u32("attention.value_length_mla", "v_head_dim"),
        u32("expert_feed_forward_length", "moe_intermediate_size"),
        u32("expert_shared_count", "num_shared_experts"),
        u32("leading_dense_block_count", "first_k_dense_replace"),
        f32("expert_weights_scale", "routed_scaling_factor"),
        flag("expert_weights_norm", "moe_renormalize"),
        u32("expert_latent_length", "routed_expert_hidden_size"),
        f32("activation.situ_beta", "activation_situ_beta"),
        f32("activation.situ_linear_beta", "activation_situ_linear_beta"),
        u32("attn_res.block_size", "attn_res_block_size"),
    ] + GPT2,
    {
        "self_attn.f_a_proj": "ssm_f_a",
        "self_attn.f_b_proj": "ssm_f_b",
        "self_attn.b_proj": "ssm_beta",
        "self_attn.o_norm": "ssm_norm",
        "self_attn.q_a_proj": "attn_q_a",
        "self_attn.q_a_layernorm": "attn_q_a_norm",
        "self_attn.q_b_proj": "attn_q_b",
        "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
        "self_attn.kv_a_layernorm": "attn_kv_a_norm",
        "self_attn.embed_q": "attn_k_b",
        "self_attn.unembed_out": "attn_v_b",
        "mlp.gate": "ffn_gate_inp",
        "mlp.switch_mlp.gate_proj": "ffn_gate_exps",
        "mlp.switch_mlp.up_proj": "ffn_up_exps",
        "mlp.switch_mlp.down_proj": "ffn_down_exps",
        "mlp.routed_expert_down_proj": "ffn_routed_down",
        "mlp.routed_expert_up_proj": "ffn_routed_up",
        "mlp.routed_expert_norm": "ffn_routed_norm",
        "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
        "mlp.shared_experts.up_proj": "ffn_up_shexp",
        "mlp.shared_experts.down_proj": "ffn_down_shexp",
    },
    tensors=kimi_k3_tensors,
    read_back=kimi_k3_back,
    top_back=kimi_k3_top,
    wrap="language_model.",
    inexact=lambda k: k.endswith(("A_log", "_res_norm.weight", "_res_proj.weight")),
)


# XVERSE (`xverse`, which mlx-lm remaps to `llama`): XverseModel writes TextModel's keys and
# the rope width (the head size), the SentencePiece-style vocabulary, and Q / K rows permuted
# by its `_reverse_hf_permute` (llama's permutation when the model has as many KV heads as
# heads, or as many as the heads per KV head).
XVERSE = cfg("llama", num_key_value_heads=4, tie_word_embeddings=False)

CASES["xverse"] = Case(
    "llama",
    XVERSE,
    "xverse",
    [
        u32("block_count", "num_hidden_layers"),
        u32("context_length", "max_position_embeddings"),
        u32("embedding_length", "hidden_size"),
        u32("feed_forward_length", "intermediate_size"),
        u32("attention.head_count", "num_attention_heads"),
        u32("attention.head_count_kv", "num_key_value_heads"),
        f32("rope.freq_base", "rope_theta"),
        f32("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        u32("rope.dimension_count", head_size),
    ] + SPM,
    {},
    permute_qk=True,
)


# XVERSE with a real-shaped vocabulary (`xverse` itself): XverseModel writes its SentencePiece
# vocabulary without scores, so the case takes `goldens_gguf_xverse.py`'s fixture (run that
# first) for the placeholder one, and `xverse_cli` records what `mlx generate --json` must print
# on the file (`cli_golden`: the file has no chat template, so the prompt as it is).
XVERSE_VOCAB = "mlx-tokenizers/tests/fixtures/gguf/xverse-spm.gguf"
XVERSE_CLI = "mlx-cli/tests/goldens/gguf_xverse_cli.json"


def xverse_with_vocab():
    case = CASES["xverse"]
    if not os.path.isfile(XVERSE_VOCAB):
        return
    vocab = vocab_of(XVERSE_VOCAB)
    case.config = {**case.config, "vocab_size": len(dict(vocab)["tokenizer.ggml.tokens"])}
    case.meta = case.meta[:-len(SPM)] + [("raw", k, v) for k, v in vocab]
    case.after = cli_golden(XVERSE_CLI, "Hello world, 你好 🚀 café", 8, with_text=True)


xverse_with_vocab()


ONLY = only()
for _name, _case in CASES.items():
    if not ONLY or _name in ONLY:
        write_case(_name, _case)

//! Mixture-of-experts maps: the expert counts, the routing (softmax or sigmoid, renormalized
//! or not, scaled, grouped), the shared experts and the leading dense layers, as each mlx-lm type
//! names them.

use std::collections::BTreeMap;

use mlx_core::io::GgufValue;
use mlx_core::prelude::*;
use serde_json::{json, Value};

use super::{
    attention_kinds, gguf_err, meta_bool, meta_count, meta_f64, meta_layer_count, meta_str,
    need_count, positive_f64, require_context, sliding_kinds, unpermute, Cx,
};
use crate::error::{ModelError, Result};

/// ERNIE 4.5 MoE (`Ernie4_5MoeModel`'s keys) as mlx-lm's `ernie4_5_moe` args: the expert
/// counts, the interleave step, the leading dense layers (llama.cpp: a layer has experts from
/// `leading_dense_block_count` on where `(layer + 1) % step == 0`, mlx-lm's rule with no
/// end index), the experts' width and the shared expert count (its width is
/// `moe_intermediate_size * moe_num_shared_experts` in mlx-lm, which the tensors' shapes
/// must match; the converter's `expert_shared_feed_forward_length` is not read).
pub(super) fn ernie45_moe_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks) =
        (&mut *cx.config, &*cx.tensors, cx.path, cx.meta, cx.blocks);
    let key = |k: &str| format!("ernie4_5-moe.{k}");
    let need = |k: &str| need_count(meta, path, "ernie4_5-moe", k);
    cx.k.experts(config, &["moe_num_experts", "moe_k"])?;
    config["moe_layer_interval"] = Value::from(need("interleave_moe_layer_step")?);
    config["moe_layer_start_index"] = Value::from(
        meta_layer_count(meta, path, &key("leading_dense_block_count"), blocks)?.unwrap_or(0),
    );
    if let Some(n) = meta_count(meta, path, &key("expert_feed_forward_length"))? {
        config["moe_intermediate_size"] = Value::from(n);
    }
    config["moe_num_shared_experts"] = Value::from(
        meta_layer_count(meta, path, &key("expert_shared_count"), i32::MAX)?.unwrap_or(0),
    );
    config["use_bias"] = Value::from(tensors.contains_key("model.layers.0.self_attn.q_proj.bias"));
    if config.get("head_dim").is_none() {
        let (h, n) = (&config["hidden_size"], &config["num_attention_heads"]);
        config["head_dim"] = Value::from(h.as_i64().unwrap_or(0) / n.as_i64().unwrap_or(1));
    }
    require_context(config, path, &key("context_length"))?;
    Ok(())
}

/// EXAONE MoE (`exaone-moe`): llama.cpp's router (sigmoid, the required gating function 2,
/// groups, the correction bias, top-k renormalized as `expert_weights_norm` says, scaled by
/// `expert_weights_scale`, 1 when absent or 0) as mlx-lm's exaone_moe arguments; MoE layers
/// from `leading_dense_block_count` on; layer kinds from the sliding flags (llama.cpp's "LLLG"
/// without them); the local rope base (`rope.freq_base_swa`, else the base) for mlx-lm's one,
/// since only the sliding layers rotate; a layer without `exp_probs_b` gets a zero bias.
pub(super) fn exaone_moe_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
    );
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    let need = |k: &str| -> Result<i32> {
        meta_count(meta, path, &key(k))?
            .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", key(k))))
    };
    let experts = need("expert_count")?;
    if need("expert_gating_func")? != 2 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is not sigmoid (2), the router mlx-lm's exaone_moe has",
                key("expert_gating_func")
            ),
        ));
    }
    let moe = need("expert_feed_forward_length")?;
    let shared = meta_count(meta, path, &key("expert_shared_count"))?.unwrap_or(0);
    if let Some(w) = meta_count(meta, path, &key("expert_shared_feed_forward_length"))? {
        if shared > 0 && i64::from(w) != i64::from(moe) * i64::from(shared) {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {w} is not {shared} shared experts of {moe} (mlx-lm's \
                     exaone_moe)",
                    key("expert_shared_feed_forward_length")
                ),
            ));
        }
    }
    if let Some(t) = meta_str(meta, &key("rope.scaling.type")).filter(|t| *t != "none") {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is `{t}`; the exaone-moe map reads unscaled rope only",
                key("rope.scaling.type")
            ),
        ));
    }
    let dense = meta_count(meta, path, &key("leading_dense_block_count"))?.unwrap_or(0);
    let kinds = if meta.contains_key(&key("attention.sliding_window_pattern")) {
        sliding_kinds(meta, path, key, blocks)?
    } else {
        (0..blocks)
            .map(|i| {
                if (i + 1) % 4 != 0 {
                    "sliding_attention"
                } else {
                    "full_attention"
                }
            })
            .collect()
    };
    if kinds.contains(&"sliding_attention") {
        if let Some(t) = positive_f64(meta, path, &key("rope.freq_base_swa"))? {
            config["rope_theta"] = Value::from(t);
        }
    }
    config["layer_types"] = json!(kinds);
    config["sliding_window"] = Value::from(need("attention.sliding_window")?);
    config["is_moe_layer"] = json!((0..blocks).map(|i| i >= dense).collect::<Vec<_>>());
    config["num_experts"] = Value::from(experts);
    config["num_experts_per_tok"] = Value::from(need("expert_used_count")?);
    config["num_shared_experts"] = Value::from(shared);
    config["moe_intermediate_size"] = Value::from(moe);
    cx.k.groups(config)?;
    config["routed_scaling_factor"] = Value::from(
        meta_f64(meta, &key("expert_weights_scale"))
            .filter(|&s| s != 0.0)
            .unwrap_or(1.0),
    );
    config["norm_topk_prob"] = Value::from(match meta.get(&key("expert_weights_norm")) {
        None => false,
        Some(GgufValue::Array(a)) if a.size() == 1 => a
            .astype(Dtype::Bool)
            .and_then(|b| b.item::<bool>())
            .map_err(|e| {
                gguf_err(
                    path,
                    format!("metadata `{}`: {e}", key("expert_weights_norm")),
                )
            })?,
        Some(_) => {
            return Err(gguf_err(
                path,
                format!("metadata `{}` is not a flag", key("expert_weights_norm")),
            ))
        }
    });
    if config.get("head_dim").is_none() {
        return Err(gguf_err(
            path,
            format!("metadata `{}` is missing", key("attention.key_length")),
        ));
    }
    for l in dense..blocks {
        let bias = format!("model.layers.{l}.mlp.gate.e_score_correction_bias");
        if let std::collections::btree_map::Entry::Vacant(e) = tensors.entry(bias) {
            e.insert(ops::zeros(&[experts], Dtype::Float32, None)?);
        }
    }
    Ok(())
}

/// DeepSeek MoE (`deepseek`): mlx-lm's deepseek arguments from the expert keys (every layer
/// from `leading_dense_block_count` on has experts, `moe_layer_freq` 1, as llama.cpp's graph);
/// an `expert_weights_scale` other than 1 (which mlx-lm's deepseek lacks) is refused.
pub(super) fn deepseek_config(cx: &mut Cx) -> Result<()> {
    let (config, path, meta, blocks) = (&mut *cx.config, cx.path, cx.meta, cx.blocks);
    let need = |k: &str| need_count(meta, path, "deepseek", k);
    let dense = meta_count(meta, path, "deepseek.leading_dense_block_count")?.unwrap_or(0);
    if dense > blocks {
        return Err(gguf_err(
            path,
            format!(
                "metadata `deepseek.leading_dense_block_count` = {dense} is more than the \
                 {blocks} layers"
            ),
        ));
    }
    if let Some(s) = meta_f64(meta, "deepseek.expert_weights_scale") {
        if s != 1.0 {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `deepseek.expert_weights_scale` is {s}: mlx-lm's deepseek \
                     scales by 1"
                ),
            ));
        }
    }
    cx.k.experts(config, &["n_routed_experts", "num_experts_per_tok"])?;
    config["n_shared_experts"] =
        Value::from(meta_count(meta, path, "deepseek.expert_shared_count")?.unwrap_or(0));
    config["moe_intermediate_size"] = Value::from(need("expert_feed_forward_length")?);
    config["first_k_dense_replace"] = Value::from(dense);
    config["moe_layer_freq"] = Value::from(1);
    Ok(())
}

/// Llama 4 (`Llama4Model`'s keys) as mlx-lm's llama4 `text_config`: the dense layers' width
/// is `feed_forward_length` (`intermediate_size_mlp`), the experts' is
/// `expert_feed_forward_length` (`intermediate_size`). What llama.cpp fixes rather than reads
/// is set as it fixes it: chunks of 8192 tokens on three of every four layers, the fourth
/// global without rope (mlx-lm's fixed pattern), the attention temperature (mlx-lm's
/// defaults, llama.cpp's values), and q/k norms unless there are 128 experts (Maverick). A
/// file whose `attention.sliding_window` is 0 (every layer global with rope: MobileLLM) is
/// refused: mlx-lm's llama4 has no such layout.
pub(super) fn llama4_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta) = (&mut *cx.config, &*cx.tensors, cx.path, cx.meta);
    let key = |k: &str| format!("llama4.{k}");
    let need = |k: &str| need_count(meta, path, "llama4", k);
    if meta_f64(meta, &key("attention.sliding_window")) == Some(0.0) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is 0 (every layer global, with rope): mlx-lm's llama4 makes \
                 every 4th layer global without rope and chunks the others",
                key("attention.sliding_window")
            ),
        ));
    }
    // llama.cpp's pattern (every 4th layer global) and one rope base: mlx-lm's fixed layout.
    if let Some(GgufValue::Array(a)) = meta.get(&key("attention.sliding_window_pattern")) {
        let flags = a
            .astype(Dtype::Bool)
            .and_then(|b| b.to_vec::<bool>())
            .map_err(|e| gguf_err(path, format!("metadata `sliding_window_pattern`: {e}")))?;
        if !(0..flags.len()).all(|i| flags[i] == ((i + 1) % 4 != 0)) {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is not every 4th layer global, mlx-lm's llama4 layout",
                    key("attention.sliding_window_pattern")
                ),
            ));
        }
    }
    if meta_f64(meta, &key("rope.freq_base_swa"))
        .is_some_and(|b| Some(b) != config["rope_theta"].as_f64())
    {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` differs from the global base; mlx-lm's llama4 has one",
                key("rope.freq_base_swa")
            ),
        ));
    }
    let experts = need("expert_count")?;
    config["intermediate_size_mlp"] = config["intermediate_size"].clone();
    config["intermediate_size"] = Value::from(need("expert_feed_forward_length")?);
    config["interleave_moe_layer_step"] = Value::from(need("interleave_moe_layer_step")?);
    config["num_local_experts"] = Value::from(experts);
    config["num_experts_per_tok"] = Value::from(need("expert_used_count")?);
    config["attention_chunk_size"] = Value::from(8192);
    config["use_qk_norm"] = Value::from(experts != 128);
    config["attention_bias"] =
        Value::from(tensors.contains_key("model.layers.0.self_attn.q_proj.bias"));
    require_context(config, path, &key("context_length"))?;
    if config.get("rope_scaling").is_none() {
        config["rope_scaling"] = Value::Null;
    }
    Ok(())
}

/// GLM-4.5 (`glm4moe`) and dots.llm1 (`dots1`): mlx-lm's glm4_moe / dots1 arguments from the
/// keys their converters write; both route with DeepSeek V3's sigmoid and correction bias
/// (a softmax `expert_gating_func` is refused), group-limited, with shared experts after
/// `leading_dense_block_count` dense layers. GLM-4.5's head size is `key_length` (its
/// `rope.dimension_count` is the rotated part).
pub(super) fn grouped_moe_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, arch, default_head) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.meta,
        cx.arch,
        cx.hidden / cx.heads,
    );
    let key = |k: &str| format!("{arch}.{k}");
    let opt = |k: &str| meta_count(meta, path, &key(k));
    match opt("expert_gating_func")? {
        None | Some(2) => {}
        Some(g) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {g}; mlx-lm's {arch} routes with sigmoid (2)",
                    key("expert_gating_func")
                ),
            ))
        }
    }
    let scale = match meta_f64(meta, &key("expert_weights_scale")) {
        None if meta.contains_key(&key("expert_weights_scale")) => {
            return Err(gguf_err(
                path,
                format!("metadata `{}` is not a number", key("expert_weights_scale")),
            ))
        }
        None => 1.0,
        Some(v) if v.is_finite() => v,
        Some(v) => {
            return Err(gguf_err(
                path,
                format!("metadata `{}` is {v}", key("expert_weights_scale")),
            ))
        }
    };
    let head_dim = opt("attention.key_length")?.unwrap_or(default_head);
    config["head_dim"] = Value::from(head_dim);
    cx.k.experts(
        config,
        &[
            "n_routed_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
        ],
    )?;
    config["n_shared_experts"] = Value::from(opt("expert_shared_count")?.unwrap_or(0));
    config["first_k_dense_replace"] = Value::from(opt("leading_dense_block_count")?.unwrap_or(0));
    cx.k.groups(config)?;
    config["routed_scaling_factor"] = Value::from(scale);
    config["norm_topk_prob"] =
        Value::from(meta_bool(meta, path, &key("expert_weights_norm"))?.unwrap_or(false));
    config["rope_scaling"] = Value::Null;
    let has = |t: &str| tensors.contains_key(t);
    config["attention_bias"] = Value::from(has("model.layers.0.self_attn.q_proj.bias"));
    if arch == "glm4moe" {
        config["use_qk_norm"] = Value::from(has("model.layers.0.self_attn.q_norm.weight"));
        let rot = opt("rope.dimension_count")?.unwrap_or(head_dim / 2);
        config["partial_rotary_factor"] = Value::from(f64::from(rot) / f64::from(head_dim));
    } else {
        config["scoring_func"] = Value::from("noaux_tc");
    }
    Ok(())
}

/// MiniMax-M2 (`MiniMaxM2Model`'s keys) as mlx-lm's `minimax`: the experts' width
/// (`expert_feed_forward_length`), the rotated width (`rope.dimension_count`), the head size;
/// mlx-lm routes by sigmoid with a selection bias and renormalizes the top-k weights, so a
/// file with another `expert_gating_func` is refused.
pub(super) fn minimax_m2_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta) = (&mut *cx.config, &*cx.tensors, cx.path, cx.meta);
    let arch = "minimax-m2";
    let need = |k: &str| need_count(meta, path, arch, k);
    let gating = format!("{arch}.expert_gating_func");
    if meta_count(meta, path, &gating)?.is_some_and(|g| g != 2) {
        return Err(gguf_err(
            path,
            format!("metadata `{gating}` is not sigmoid (2), the router mlx-lm's minimax has"),
        ));
    }
    cx.k.experts(
        config,
        &[
            "num_local_experts",
            "num_experts_per_tok",
            "intermediate_size",
        ],
    )?;
    config["shared_intermediate_size"] = Value::from(0);
    config["rotary_dim"] = Value::from(need("rope.dimension_count")?);
    config["scoring_func"] = Value::from("sigmoid");
    config["use_qk_norm"] =
        Value::from(tensors.contains_key("model.layers.0.self_attn.q_norm.weight"));
    require_context(config, path, &format!("{arch}.context_length"))
}

/// Ling 1.0 (`BailingMoeModel`, `bailingmoe`) and 2.0 (`BailingMoeV2Model`, `bailingmoe2`)
/// as mlx-lm's `bailing_moe`; Ling 1.0's split, permuted q / k / v are joined back into
/// `query_key_value` (its head, which the converter normalized, is read as stored). Experts after
/// `leading_dense_block_count` dense layers, the router's gating (`expert_gating_func`: 1
/// softmax, 2 sigmoid), groups, routed scale and renormalization, the rotated width, the
/// shared experts' width per expert from the tensors (mlx-lm multiplies
/// `moe_shared_expert_intermediate_size` by their count). mlx-lm's head size is the width over
/// the heads and its lm_head is not re-normalized (`norm_head` false, as this converter class
/// writes it): a file saying otherwise is refused.
pub(super) fn bailing_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks, arch) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
        cx.arch,
    );
    if arch == "bailingmoe" {
        let heads = config["num_attention_heads"].as_i64().unwrap_or(0) as i32;
        let kv = config["num_key_value_heads"].as_i64().unwrap_or(0) as i32;
        join_bailing_qkv(tensors, blocks, heads, kv)?;
    }
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    cx.k.width_over_heads(config, "bailing_moe")?;
    config["score_function"] =
        Value::from(cx.k.gating("bailing_moe", [(1, "softmax"), (2, "sigmoid")])?);
    cx.k.experts(
        config,
        &[
            "num_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
        ],
    )?;
    let dense = meta_layer_count(meta, path, &key("leading_dense_block_count"), blocks)?;
    config["first_k_dense_replace"] = Value::from(dense.unwrap_or(0));
    cx.k.groups(config)?;
    cx.k.route_weights(config, ["norm_topk_prob", "routed_scaling_factor"])?;
    config["rotary_dim"] = Value::from(need("rope.dimension_count")?);
    let has = |t: &str| tensors.keys().any(|k| k.ends_with(t));
    config["use_qk_norm"] = Value::from(has(".attention.query_layernorm.weight"));
    config["use_qkv_bias"] = Value::from(has(".attention.query_key_value.bias"));
    config["use_bias"] = Value::from(has(".attention.dense.bias"));
    config["moe_router_enable_expert_bias"] = Value::from(has(".mlp.gate.expert_bias"));
    config["norm_head"] = Value::from(false);
    // The shared experts' width: mlx-lm's is `moe_shared_expert_intermediate_size` times their
    // count.
    let shared = meta_count(meta, path, &key("expert_shared_count"))?.unwrap_or(0);
    config["num_shared_experts"] = Value::from(shared);
    let width = tensors
        .iter()
        .find(|(k, _)| k.ends_with(".mlp.shared_experts.up_proj.weight"))
        .map(|(_, a)| a.shape()[0]);
    match width {
        Some(w) if shared > 0 && w % shared == 0 => {
            config["moe_shared_expert_intermediate_size"] = Value::from(w / shared)
        }
        None if shared == 0 => {}
        _ => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {shared} does not fit the shared experts' tensors \
                     (`ffn_up_shexp` with {width:?} rows)",
                    key("expert_shared_count")
                ),
            ))
        }
    }
    if meta_str(meta, &key("rope.scaling.type")).is_some_and(|t| t != "none") {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}`: rope scaling is not mapped for {arch}",
                key("rope.scaling.type")
            ),
        ));
    }
    require_context(config, path, &key("context_length"))
}

/// DBRX (`DbrxModel`'s keys) as mlx-lm's `dbrx` arguments (`attn_config`, `ffn_config`),
/// replacing the transformer fields; each layer's stacked experts become mlx-lm's list
/// (`ffn.experts.<e>.{w1, v1, w2}`: the converter's `w2` is already each expert's Linear
/// weight). mlx-lm always clips the fused projection and has its own head: a file without
/// `attention.clamp_kqv` is refused (llama.cpp would not clip), one without `output.weight`
/// gets the embedding's (llama.cpp's duplicate). mlx-lm's LayerNorms use their default
/// epsilon (1e-5, the only one the converter writes) whatever the file says.
pub(super) fn dbrx_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta) = (&mut *cx.config, &mut *cx.tensors, cx.path, cx.meta);
    let arch = "dbrx";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let clip = meta_f64(meta, &key("attention.clamp_kqv"))
        .filter(|c| c.is_finite() && *c > 0.0)
        .ok_or_else(|| {
            gguf_err(
                path,
                format!(
                    "metadata `{}` is missing or not a positive number (mlx-lm's dbrx clips \
                     the fused projection)",
                    key("attention.clamp_kqv")
                ),
            )
        })?;
    let experts = need("expert_count")?;
    let blocks = config["num_hidden_layers"].clone();
    *config = json!({
        "model_type": "dbrx",
        "vocab_size": config["vocab_size"].clone(),
        "d_model": config["hidden_size"].clone(),
        "n_layers": blocks,
        "n_heads": config["num_attention_heads"].clone(),
        "attn_config": {
            "kv_n_heads": config["num_key_value_heads"].clone(),
            "clip_qkv": clip,
            "rope_theta": config["rope_theta"].clone(),
        },
        "ffn_config": {
            "ffn_hidden_size": config["intermediate_size"].clone(),
            "moe_num_experts": experts,
            "moe_top_k": need("expert_used_count")?,
        },
    });
    let stacked: Vec<String> = tensors
        .keys()
        .filter(|k| k.contains(".ffn.gguf_"))
        .cloned()
        .collect();
    for k in stacked {
        let (Some(a), Some((layer, rest))) = (tensors.remove(&k), k.split_once(".ffn.gguf_"))
        else {
            continue;
        };
        let (w, suffix) = rest.split_once('.').unwrap_or((rest, "weight"));
        let shape = a.shape();
        let &[n, rows, cols] = shape.as_slice() else {
            return Err(ModelError::Weights(vec![format!(
                "GGUF tensor for {k}: shape {shape:?}, expected {experts} stacked experts"
            )]));
        };
        if n != experts {
            return Err(ModelError::Weights(vec![format!(
                "GGUF tensor for {k}: {n} experts, metadata `{}` says {experts}",
                key("expert_count")
            )]));
        }
        for e in 0..experts {
            let one = ops::slice_axis(&a, 0, e, e + 1, None)?.reshape(&[rows, cols])?;
            tensors.insert(format!("{layer}.ffn.experts.{e}.{w}.{suffix}"), one);
        }
    }
    if !tensors.contains_key("lm_head.weight") {
        for suffix in ["weight", "scales", "biases"] {
            if let Some(e) = tensors.get(&format!("transformer.wte.{suffix}")) {
                let e = e.clone();
                tensors.insert(format!("lm_head.{suffix}"), e);
            }
        }
    }
    if meta_count(meta, path, &key("context_length"))?.is_none() {
        return Err(gguf_err(
            path,
            format!("metadata `{}` is missing", key("context_length")),
        ));
    }
    Ok(())
}

/// Hunyuan MoE (`HunYuanMoEModel`'s keys) as mlx-lm's `hunyuan`: the rope base comes
/// already scaled by the NTK alpha (scaling "none"), so alpha is 1 here; the experts' width
/// and count, the experts used (`moe_topk`), the shared MLP (`use_mixed_mlp_moe`, its width
/// `intermediate_size` times `num_shared_expert` in mlx-lm, which the tensors must match).
/// llama.cpp gives every layer its own K / V: no cross-layer sharing (`use_cla` false).
/// mlx-lm's head size is the width over the heads: another `attention.key_length` is refused.
pub(super) fn hunyuan_moe_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta) = (&mut *cx.config, &*cx.tensors, cx.path, cx.meta);
    let arch = "hunyuan-moe";
    let key = |k: &str| format!("{arch}.{k}");
    cx.k.width_over_heads(config, "hunyuan")?;
    match meta_str(meta, &key("rope.scaling.type")) {
        None | Some("none") => {}
        Some(other) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {other:?}: Hunyuan's files carry the NTK-alpha base \
                     already scaled, with scaling \"none\"",
                    key("rope.scaling.type")
                ),
            ))
        }
    }
    config["rope_scaling"] = json!({"alpha": 1.0, "factor": 1.0, "type": "dynamic"});
    cx.k.experts(
        config,
        &["num_experts", "moe_topk", "moe_intermediate_size"],
    )?;
    let shared = meta_count(meta, path, &key("expert_shared_count"))?.unwrap_or(0);
    let width = tensors
        .iter()
        .find(|(k, _)| k.ends_with(".mlp.shared_mlp.up_proj.weight"))
        .map(|(_, a)| i64::from(a.shape()[0]));
    let ffn = config["intermediate_size"].as_i64().unwrap_or(0);
    match width {
        None => config["use_mixed_mlp_moe"] = Value::from(false),
        Some(w) if w == ffn * i64::from(shared) => config["use_mixed_mlp_moe"] = Value::from(true),
        Some(w) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {shared} times `{}` = {ffn} is not the shared MLP's width \
                     ({w} rows of `ffn_up_shexp`), as mlx-lm's hunyuan sizes it",
                    key("expert_shared_count"),
                    key("feed_forward_length")
                ),
            ))
        }
    }
    config["num_shared_expert"] = Value::from(shared);
    let has = |k: &str| tensors.contains_key(k);
    config["use_qk_norm"] = Value::from(has("model.layers.0.self_attn.query_layernorm.weight"));
    config["attention_bias"] = Value::from(has("model.layers.0.self_attn.q_proj.bias"));
    config["use_cla"] = Value::from(false);
    config["cla_share_factor"] = Value::from(2);
    Ok(())
}

/// AFMoE (`AfmoeModel`'s keys) as mlx-lm's `afmoe`: with `attention.sliding_window`, the
/// per-layer flags of `attention.sliding_window_pattern` or llama.cpp's fixed pattern (three
/// sliding layers, then a full one; mlx-lm needs at least one full layer), else every layer
/// full; routing as llama.cpp reads it (sigmoid unless `expert_gating_func` says softmax, no
/// renormalization and a scale of 1 unless the keys say otherwise); the shared experts' width
/// must be mlx-lm's (`moe_intermediate_size` times their count); the embedding scaled by
/// sqrt(width), which llama.cpp always does.
pub(super) fn afmoe_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks) =
        (&mut *cx.config, &*cx.tensors, cx.path, cx.meta, cx.blocks);
    let arch = "afmoe";
    let key = |k: &str| format!("{arch}.{k}");
    let window = meta_count(meta, path, &key("attention.sliding_window"))?;
    let sliding: Vec<bool> = match (window, meta.get(&key("attention.sliding_window_pattern"))) {
        (None, _) => vec![false; blocks as usize],
        (Some(_), Some(GgufValue::Array(a))) => a
            .astype(Dtype::Bool)
            .and_then(|b| b.to_vec::<bool>())
            .map_err(|e| {
                gguf_err(
                    path,
                    format!("metadata `attention.sliding_window_pattern`: {e}"),
                )
            })?,
        (Some(_), _) => (0..blocks).map(|i| (i + 1) % 4 != 0).collect(),
    };
    if sliding.len() != blocks as usize || sliding.iter().all(|&s| s) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` ({} entries for {blocks} layers) needs a full-attention layer, \
                 which mlx-lm's afmoe needs",
                key("attention.sliding_window_pattern"),
                sliding.len()
            ),
        ));
    }
    let types = attention_kinds(&sliding);
    config["layer_types"] = json!(types);
    config["sliding_window"] = Value::from(window.unwrap_or(1));
    config["score_func"] = Value::from(cx.k.gating("afmoe", [(2, "sigmoid"), (1, "softmax")])?);
    cx.k.experts(
        config,
        &[
            "num_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
        ],
    )?;
    let dense = meta_layer_count(meta, path, &key("leading_dense_block_count"), blocks)?;
    config["num_dense_layers"] = Value::from(dense.unwrap_or(0));
    cx.k.groups(config)?;
    cx.k.route_weights(config, ["route_norm", "route_scale"])?;
    config["mup_enabled"] = Value::from(true);
    let shared = meta_count(meta, path, &key("expert_shared_count"))?.unwrap_or(0);
    let moe = config["moe_intermediate_size"].as_i64().unwrap_or(0);
    let width = tensors
        .iter()
        .find(|(k, _)| k.ends_with(".mlp.shared_experts.up_proj.weight"))
        .map(|(_, a)| i64::from(a.shape()[0]));
    if width.unwrap_or(0) != moe * i64::from(shared) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {shared} times `{}` = {moe} is not the shared experts' width \
                 ({width:?} rows of `ffn_up_shexp`), as mlx-lm's afmoe sizes it",
                key("expert_shared_count"),
                key("expert_feed_forward_length")
            ),
        ));
    }
    config["num_shared_experts"] = Value::from(shared);
    if meta_str(meta, &key("rope.scaling.type")).is_some_and(|t| t != "none") {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}`: rope scaling is not mapped for afmoe",
                key("rope.scaling.type")
            ),
        ));
    }
    if meta_f64(meta, &key("rope.freq_base_swa"))
        .is_some_and(|b| Some(b) != config["rope_theta"].as_f64())
    {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` differs from the base; mlx-lm's afmoe has one",
                key("rope.freq_base_swa")
            ),
        ));
    }
    if config.get("head_dim").is_none() {
        let (h, n) = (
            config["hidden_size"].as_i64().unwrap_or(0),
            config["num_attention_heads"].as_i64().unwrap_or(1).max(1),
        );
        config["head_dim"] = Value::from(h / n);
    }
    require_context(config, path, &key("context_length"))
}

/// Ling 1.0's `attn_q` / `attn_k` (rows permuted by the heads / KV heads, as the llama class
/// does) and `attn_v` joined back into mlx-lm's `query_key_value` (scales and biases with
/// their rows).
pub(super) fn join_bailing_qkv(
    tensors: &mut BTreeMap<String, Array>,
    blocks: i32,
    heads: i32,
    kv: i32,
) -> Result<()> {
    for l in 0..blocks {
        let p = format!("model.layers.{l}.attention");
        for suffix in ["weight", "scales", "biases", "bias"] {
            let part = |t: &str| format!("{p}.gguf_{t}.{suffix}");
            let (q, k, v) = (
                tensors.remove(&part("q")),
                tensors.remove(&part("k")),
                tensors.remove(&part("v")),
            );
            match (q, k, v) {
                (None, None, None) => {}
                (Some(q), Some(k), Some(v)) if suffix != "bias" => {
                    let q = unpermute(
                        &q,
                        heads,
                        &format!("blk.{l}.attn_q.{suffix}"),
                        "attention.head_count",
                    )?;
                    let k = unpermute(
                        &k,
                        kv,
                        &format!("blk.{l}.attn_k.{suffix}"),
                        "attention.head_count_kv",
                    )?;
                    let joined = ops::concatenate(&[&q, &k, &v], 0, None)?;
                    tensors.insert(format!("{p}.query_key_value.{suffix}"), joined);
                }
                _ => {
                    return Err(ModelError::Weights(vec![format!(
                        "GGUF tensors blk.{l}.attn_q / attn_k / attn_v .{suffix}: not all three, \
                         or biases (which this map does not un-permute)"
                    )]))
                }
            }
        }
    }
    Ok(())
}

/// Qwen3 MoE (`qwen3moe`, `qwen3vlmoe`): the experts, every layer sparse, renormalized.
pub(super) fn qwen3moe_config(cx: &mut Cx) -> Result<()> {
    let (config, hidden, heads, keys) = (&mut *cx.config, cx.hidden, cx.heads, cx.k);
    // llama.cpp's qwen3moe renormalizes the top-k weights and has no dense layers.
    keys.experts(
        config,
        &[
            "num_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
        ],
    )?;
    config["decoder_sparse_step"] = Value::from(1);
    config["mlp_only_layers"] = json!([]);
    config["norm_topk_prob"] = Value::from(true);
    if config.get("head_dim").is_none() {
        config["head_dim"] = Value::from(hidden / heads);
    }
    Ok(())
}

/// Qwen2 MoE (`qwen2moe`): the experts and the shared expert's width.
pub(super) fn qwen2moe_config(cx: &mut Cx) -> Result<()> {
    let (config, keys) = (&mut *cx.config, cx.k);
    // llama.cpp's qwen2moe, like mlx-lm's, does not renormalize the top-k weights.
    keys.experts(
        config,
        &[
            "num_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
        ],
    )?;
    config["shared_expert_intermediate_size"] =
        Value::from(keys.count("expert_shared_feed_forward_length")?);
    Ok(())
}

/// OLMoE (`olmoe`): the expert counts, not renormalized.
pub(super) fn olmoe_config(cx: &mut Cx) -> Result<()> {
    let (config, keys) = (&mut *cx.config, cx.k);
    // llama.cpp's olmoe does not renormalize the top-k weights (OLMoE's own config).
    keys.experts(config, &["num_experts", "num_experts_per_tok"])?;
    config["norm_topk_prob"] = Value::from(false);
    Ok(())
}

/// gpt-oss (`gpt-oss`): the experts' width, the window (even layers sliding, an even layer
/// count), YaRN's rope scaling if any.
pub(super) fn gpt_oss_config(cx: &mut Cx) -> Result<()> {
    let (config, path, meta, blocks, hidden, heads, keys) = (
        &mut *cx.config,
        cx.path,
        cx.meta,
        cx.blocks,
        cx.hidden,
        cx.heads,
        cx.k,
    );
    // GptOssModel: the experts' width as `expert_feed_forward_length`, the window;
    // llama.cpp fixes the pattern (even layers sliding), mlx-lm's default too.
    keys.experts(
        config,
        &[
            "num_local_experts",
            "num_experts_per_tok",
            "intermediate_size",
        ],
    )?;
    config["sliding_window"] = Value::from(keys.count("attention.sliding_window")?);
    if config.get("head_dim").is_none() {
        config["head_dim"] = Value::from(hidden / heads);
    }
    if blocks % 2 != 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is {blocks}: gpt-oss alternates sliding and full layers",
                keys.key("block_count")
            ),
        ));
    }
    config["rope_scaling"] = match meta_str(meta, &keys.key("rope.scaling.type")) {
        Some("yarn") => {
            let need = |k: &str| -> Result<f64> {
                keys.float(k, false)?
                    .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", keys.key(k))))
            };
            json!({
                "rope_type": "yarn",
                "factor": need("rope.scaling.factor")?,
                "original_max_position_embeddings":
                    keys.count("rope.scaling.original_context_length")?,
                "beta_fast": keys.float("rope.scaling.yarn_beta_fast", false)?.unwrap_or(32.0),
                "beta_slow": keys.float("rope.scaling.yarn_beta_slow", false)?.unwrap_or(1.0),
            })
        }
        None | Some("none") => Value::Null,
        Some(t) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is `{t}`; gpt-oss maps only yarn",
                    keys.key("rope.scaling.type")
                ),
            ))
        }
    };
    Ok(())
}

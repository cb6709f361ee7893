//! Mixture-of-experts maps whose layers differ in their attention (Step 3.5, MiMo-V2-Flash,
//! Laguna): per-layer head counts, sliding-window patterns and rope bases, read as per-layer lists.

use serde_json::{json, Value};

use super::{
    attention_kinds, gguf_err, layer_list, meta_bool, meta_count, meta_f64, meta_str, need_count,
    Cx,
};
use crate::error::Result;

/// MiMo V2 Flash as MimoV2Model writes it, for mlx-lm's `mimo_v2_flash`: the per-layer pattern
/// (`attention.sliding_window_pattern`, 1 = sliding) as `hybrid_layer_pattern`, the per-layer KV
/// heads (one count per kind of layer), the head count and sizes (`key_length`,
/// `value_length`), which the converter requires the sliding layers to share, the rope width
/// as `partial_rotary_factor`, the rope bases, the window, the value scale, the MoE layers and
/// each kind's sinks from the tensors, and the router llama.cpp runs: sigmoid with the
/// correction bias, the groups, weights always normalized, scaled only by
/// `expert_weights_scale` (unscaled when absent). The lists' MTP entries are skipped.
pub(super) fn mimo2_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, heads) =
        (&mut *cx.config, &*cx.tensors, cx.path, cx.meta, cx.heads);
    let arch = "mimo2";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let blocks = config["num_hidden_layers"].as_i64().unwrap_or(0) as usize;
    let list = |k: &str| -> Result<Vec<f64>> {
        layer_list(meta, path, &key(k), blocks)?
            .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", key(k))))
    };
    let swa: Vec<bool> = list("attention.sliding_window_pattern")?
        .iter()
        .map(|&v| v != 0.0)
        .collect();
    if !swa.contains(&true) || !swa.contains(&false) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}`: mlx-lm's mimo_v2_flash needs both sliding and full layers",
                key("attention.sliding_window_pattern")
            ),
        ));
    }
    let kvs = list("attention.head_count_kv")?;
    let mut kv: [Option<f64>; 2] = [None, None];
    for (l, (&k, &s)) in kvs.iter().zip(&swa).enumerate() {
        let slot = &mut kv[usize::from(s)];
        if k < 1.0 || f64::from(heads) % k != 0.0 || slot.is_some_and(|v| v != k) {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}`: layer {l} has {k} KV heads; mlx-lm's mimo_v2_flash needs one \
                    divisor of the {heads} heads per kind of layer (full, sliding)",
                    key("attention.head_count_kv")
                ),
            ));
        }
        *slot = Some(k);
    }
    let head_dim = need("attention.key_length")?;
    let v_head_dim = need("attention.value_length")?;
    let rope = need("rope.dimension_count")?;
    if rope > head_dim {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {rope} exceeds the head size {head_dim}",
                key("rope.dimension_count")
            ),
        ));
    }
    // mlx-lm rotates int(partial_rotary_factor * head_dim) dimensions.
    let mut factor = f64::from(rope) / f64::from(head_dim);
    if (factor * f64::from(head_dim)) as i32 != rope {
        factor = (f64::from(rope) + 0.5) / f64::from(head_dim);
    }
    if let Some(g) = meta_count(meta, path, &key("expert_gating_func"))? {
        if g != 2 {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {g}: llama.cpp's mimo2 routes by sigmoid (2)",
                    key("expert_gating_func")
                ),
            ));
        }
    }
    if meta_bool(meta, path, &key("expert_weights_norm"))? == Some(false) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is false: llama.cpp's mimo2 always normalizes the routed weights",
                key("expert_weights_norm")
            ),
        ));
    }
    let groups = meta_count(meta, path, &key("expert_group_count"))?.unwrap_or(1);
    let groups_used = if groups > 1 {
        need("expert_group_used_count")?
    } else {
        meta_count(meta, path, &key("expert_group_used_count"))?.unwrap_or(1)
    };
    let has = |l: usize, t: &str| tensors.contains_key(&format!("model.layers.{l}.{t}"));
    let sinks = |sliding: bool| {
        (0..blocks).any(|l| swa[l] == sliding && has(l, "self_attn.attention_sink_bias"))
    };
    let base = meta_f64(meta, &key("rope.freq_base")).unwrap_or(10000.0);
    let moe_layers: Vec<i32> = (0..blocks)
        .map(|l| i32::from(has(l, "mlp.gate.weight")))
        .collect();
    let o = json!({
        "num_key_value_heads": kv[0].unwrap_or(1.0) as i64,
        "swa_num_key_value_heads": kv[1].unwrap_or(1.0) as i64,
        "num_attention_heads": heads,
        "swa_num_attention_heads": heads,
        "head_dim": head_dim,
        "swa_head_dim": head_dim,
        "v_head_dim": v_head_dim,
        "swa_v_head_dim": v_head_dim,
        "partial_rotary_factor": factor,
        "rope_theta": base,
        "swa_rope_theta": meta_f64(meta, &key("rope.freq_base_swa")).unwrap_or(base),
        "sliding_window_size": need("attention.sliding_window")?,
        "hybrid_layer_pattern": swa.iter().map(|&s| i32::from(s)).collect::<Vec<_>>(),
        "moe_layer_freq": moe_layers,
        "add_swa_attention_sink_bias": sinks(true),
        "add_full_attention_sink_bias": sinks(false),
        "attention_value_scale": meta_f64(meta, &key("attention.value_scale")),
        "n_routed_experts": need("expert_count")?,
        "num_experts_per_tok": need("expert_used_count")?,
        "moe_intermediate_size": need("expert_feed_forward_length")?,
        "n_shared_experts": null,
        "routed_scaling_factor": meta_f64(meta, &key("expert_weights_scale")),
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": true,
        "n_group": groups,
        "topk_group": groups_used,
    });
    if let (Some(c), Some(o)) = (config.as_object_mut(), o.as_object()) {
        c.extend(o.clone());
    }
    Ok(())
}

/// Laguna as LagunaModel writes it, for mlx-lm's `laguna`: the per-layer head counts, the
/// layer kinds (`attention.sliding_window_pattern`, else llama.cpp's full layer every 4th from
/// the first; all full without a window), `rope_parameters` per kind (the full layers' base,
/// rope width and YaRN from `rope.scaling.*`; the sliding layers' `freq_base_swa` and
/// `dimension_count_swa`, plain), the dense first blocks as `mlp_layer_types`, the expert keys
/// and the router llama.cpp runs (sigmoid or sqrt-softplus, no soft cap, weights always
/// normalized, scaled by `expert_weights_scale`), the per-head gate and biases from the
/// tensors. Refused: a per-element gate (mlx-lm's laguna gates per head), YaRN's attention /
/// extrapolation factors (mlx-lm's YaRN has neither), other rope scaling, another gating,
/// a shared-expert count other than 1.
pub(super) fn laguna_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta) = (&mut *cx.config, &*cx.tensors, cx.path, cx.meta);
    let arch = "laguna";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let float = |k: &str| meta_f64(meta, &key(k));
    let blocks = config["num_hidden_layers"].as_i64().unwrap_or(0) as usize;
    let heads: Vec<i64> = match float("attention.head_count") {
        Some(_) => vec![i64::from(need("attention.head_count")?); blocks],
        None => layer_list(meta, path, &key("attention.head_count"), blocks)?
            .ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `{}` is missing", key("attention.head_count")),
                )
            })?
            .into_iter()
            .map(|h| h as i64)
            .collect(),
    };
    let head_dim = need("attention.key_length")?;
    let window = meta_count(meta, path, &key("attention.sliding_window"))?;
    let sliding: Vec<bool> = match (
        window,
        layer_list(meta, path, &key("attention.sliding_window_pattern"), blocks)?,
    ) {
        (None, _) => vec![false; blocks],
        (Some(_), Some(p)) => p.iter().map(|&v| v != 0.0).collect(),
        (Some(_), None) => (0..blocks).map(|l| l % 4 != 0).collect(),
    };
    // mlx-lm rotates int(head_dim * partial_rotary_factor) dimensions.
    let factor = |dims: i32, k: &str| -> Result<f64> {
        if dims < 1 || dims > head_dim {
            return Err(gguf_err(
                path,
                format!("metadata `{}` = {dims} is not in 1..={head_dim}", key(k)),
            ));
        }
        let f = f64::from(dims) / f64::from(head_dim);
        Ok(if (f * f64::from(head_dim)) as i32 == dims {
            f
        } else {
            (f64::from(dims) + 0.5) / f64::from(head_dim)
        })
    };
    let full_dims = meta_count(meta, path, &key("rope.dimension_count"))?.unwrap_or(head_dim);
    let swa_dims = meta_count(meta, path, &key("rope.dimension_count_swa"))?.unwrap_or(full_dims);
    let base = float("rope.freq_base").unwrap_or(10000.0);
    let mut full = json!({
        "rope_theta": base,
        "partial_rotary_factor": factor(full_dims, "rope.dimension_count")?,
    });
    for k in [
        "rope.scaling.yarn_attn_factor",
        "rope.scaling.yarn_ext_factor",
    ] {
        if let Some(v) = float(k) {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {v}: mlx-lm's YaRN rope has no such factor",
                    key(k)
                ),
            ));
        }
    }
    match meta_str(meta, &key("rope.scaling.type")) {
        None | Some("none") => {}
        Some("yarn") => {
            let f = float("rope.scaling.factor").ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `{}` is missing", key("rope.scaling.factor")),
                )
            })?;
            full["rope_type"] = Value::from("yarn");
            full["factor"] = Value::from(f);
            full["original_max_position_embeddings"] =
                Value::from(need("rope.scaling.original_context_length")?);
            for (k, field) in [
                ("rope.scaling.yarn_beta_fast", "beta_fast"),
                ("rope.scaling.yarn_beta_slow", "beta_slow"),
            ] {
                if let Some(v) = float(k) {
                    full[field] = Value::from(v);
                }
            }
        }
        Some(t) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is `{t}`; laguna maps only yarn",
                    key("rope.scaling.type")
                ),
            ))
        }
    }
    let swa = json!({
        "rope_theta": float("rope.freq_base_swa").unwrap_or(base),
        "partial_rotary_factor": factor(swa_dims, "rope.dimension_count_swa")?,
    });
    let score = match meta_count(meta, path, &key("expert_gating_func"))? {
        None | Some(2) => "sigmoid",
        Some(4) => "sqrtsoftplus",
        Some(g) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {g}: mlx-lm's laguna routes by sigmoid (2) \
                or sqrt-softplus (4)",
                    key("expert_gating_func")
                ),
            ))
        }
    };
    if meta_bool(meta, path, &key("expert_weights_norm"))? == Some(false) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is false: mlx-lm's laguna always normalizes the routed weights",
                key("expert_weights_norm")
            ),
        ));
    }
    if let Some(n) = meta_count(meta, path, &key("expert_shared_count"))? {
        if n != 1 {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {n}: laguna has one shared expert",
                    key("expert_shared_count")
                ),
            ));
        }
    }
    let dense = meta_count(meta, path, &key("leading_dense_block_count")).and_then(|v| {
        v.ok_or_else(|| {
            gguf_err(
                path,
                format!("metadata `{}` is missing", key("leading_dense_block_count")),
            )
        })
    })? as usize;
    for (l, &h) in heads.iter().enumerate() {
        if let Some(g) = tensors.get(&format!("model.layers.{l}.self_attn.g_proj.weight")) {
            let rows = g.shape().first().copied().unwrap_or(0);
            if i64::from(rows) != h {
                return Err(gguf_err(
                    path,
                    format!(
                        "tensor `blk.{l}.attn_gate.weight` has {rows} rows for {} heads: a \
                        per-element gate, which mlx-lm's laguna (one gate per head) lacks",
                        h
                    ),
                ));
            }
        }
    }
    let has = |t: &str| tensors.keys().any(|k| k.ends_with(t));
    let layer_types = attention_kinds(&sliding);
    let mlp_types: Vec<&str> = (0..blocks)
        .map(|l| if l < dense { "dense" } else { "sparse" })
        .collect();
    let o = json!({
        "num_attention_heads": heads.first().copied().unwrap_or(1),
        "num_attention_heads_per_layer": heads,
        "head_dim": head_dim,
        "sliding_window": window,
        "layer_types": layer_types,
        "mlp_layer_types": mlp_types,
        "rope_parameters": {"full_attention": full, "sliding_attention": swa},
        "gating": has(".self_attn.g_proj.weight"),
        "qkv_bias": has(".self_attn.q_proj.bias"),
        "attention_bias": has(".self_attn.o_proj.bias"),
        "num_experts": need("expert_count")?,
        "num_experts_per_tok": need("expert_used_count")?,
        "moe_intermediate_size": need("expert_feed_forward_length")?,
        "shared_expert_intermediate_size": need("expert_shared_feed_forward_length")?,
        "moe_routed_scaling_factor": float("expert_weights_scale").unwrap_or(1.0),
        "moe_router_score_func": score,
        "moe_router_logit_softcapping": 0.0,
    });
    if let (Some(c), Some(o)) = (config.as_object_mut(), o.as_object()) {
        c.extend(o.clone());
    }
    Ok(())
}

/// Step 3.5 as Step35Model writes it, for mlx-lm's `step3p5`: the per-layer head / KV counts
/// (one pair on the full layers, `num_attention_heads` / `num_attention_groups`, one on the
/// sliding ones, `attention_other_setting`), `layer_types` from
/// `attention.sliding_window_pattern`, the window, the head size (`attention.key_length`), the
/// partial rope the converter requires (half the head on full layers, all of it on sliding
/// ones), per-layer rope bases (`rope.freq_base`, `rope.freq_base_swa`), the expert keys
/// (mlx-lm's defaults differ from llama.cpp's where a key is absent, so scale and norm are
/// required), the MoE layers from the router tensors, the per-layer SwiGLU clamps (0 = none)
/// and the head-wise gate from its tensors. Refused: Llama 3 rope factors (`rope_freqs`) and
/// other rope scaling, another gating function, a file without expert layers.
pub(super) fn step35_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, rope_tensors) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.meta,
        &*cx.rope_tensors,
    );
    let arch = "step35";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let blocks = config["num_hidden_layers"].as_i64().unwrap_or(0) as usize;
    let list = |k: &str| -> Result<Vec<f64>> {
        layer_list(meta, path, &key(k), blocks)?
            .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", key(k))))
    };
    let swa: Vec<bool> = list("attention.sliding_window_pattern")?
        .iter()
        .map(|&v| v != 0.0)
        .collect();
    let (heads, kvs) = (
        list("attention.head_count")?,
        list("attention.head_count_kv")?,
    );
    // One (heads, kv) pair per kind of layer.
    let mut pairs: [Option<(f64, f64)>; 2] = [None, None];
    for l in 0..blocks {
        let pair = (heads[l], kvs[l]);
        let slot = &mut pairs[usize::from(swa[l])];
        if pair.0 < 1.0 || pair.1 < 1.0 || pair.0 % pair.1 != 0.0 || slot.is_some_and(|p| p != pair)
        {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` / `{}`: layer {l} has {} heads over {} KV heads; mlx-lm's \
                    step3p5 needs one positive multiple per kind of layer (full, sliding)",
                    key("attention.head_count"),
                    key("attention.head_count_kv"),
                    pair.0,
                    pair.1
                ),
            ));
        }
        *slot = Some(pair);
    }
    let Some((full_heads, full_kv)) = pairs[0] else {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` marks every layer sliding; the full layers set mlx-lm's head counts",
                key("attention.sliding_window_pattern")
            ),
        ));
    };
    config["num_attention_heads"] = Value::from(full_heads as i64);
    config["num_attention_groups"] = Value::from(full_kv as i64);
    config["attention_other_setting"] = match pairs[1] {
        Some((h, kv)) => {
            json!({"num_attention_heads": h as i64, "num_attention_groups": kv as i64})
        }
        None => Value::Null,
    };
    config["layer_types"] = json!(attention_kinds(&swa));
    config["sliding_window"] = Value::from(need("attention.sliding_window")?);
    let head_dim = need("attention.key_length")?;
    config["head_dim"] = Value::from(head_dim);
    if let Some(r) = meta_count(meta, path, &key("rope.dimension_count"))? {
        if r != head_dim {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {r}: llama.cpp's step35 rotates the whole head ({head_dim}) \
                    on sliding layers and half of it on full ones",
                    key("rope.dimension_count")
                ),
            ));
        }
    }
    config["partial_rotary_factors"] = swa.iter().map(|&s| if s { 1.0 } else { 0.5 }).collect();
    if rope_tensors.contains_key("rope_freqs.weight") {
        return Err(gguf_err(
            path,
            "tensor `rope_freqs.weight`: Llama 3 rope factors are not mapped for step35",
        ));
    }
    if meta_str(meta, &key("rope.scaling.type")).is_some_and(|t| t != "none") {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}`: rope scaling is not mapped for step35",
                key("rope.scaling.type")
            ),
        ));
    }
    let base = meta_f64(meta, &key("rope.freq_base")).unwrap_or(10000.0);
    if let Some(local) = meta_f64(meta, &key("rope.freq_base_swa")) {
        config["rope_theta"] = swa.iter().map(|&s| if s { local } else { base }).collect();
    }
    if let Some(g) = meta_count(meta, path, &key("expert_gating_func"))? {
        if g != 2 {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {g}: mlx-lm's step3p5 routes by sigmoid (2)",
                    key("expert_gating_func")
                ),
            ));
        }
    }
    cx.k.experts(
        config,
        &["moe_num_experts", "moe_top_k", "moe_intermediate_size"],
    )?;
    config["share_expert_dim"] = Value::from(need("expert_shared_feed_forward_length")?);
    config["moe_router_scaling_factor"] =
        Value::from(meta_f64(meta, &key("expert_weights_scale")).ok_or_else(|| {
            gguf_err(
                path,
                format!("metadata `{}` is missing", key("expert_weights_scale")),
            )
        })?);
    config["norm_expert_weight"] = Value::from(
        meta_bool(meta, path, &key("expert_weights_norm"))?.ok_or_else(|| {
            gguf_err(
                path,
                format!("metadata `{}` is missing", key("expert_weights_norm")),
            )
        })?,
    );
    let moe: Vec<String> = (0..blocks)
        .filter(|l| tensors.contains_key(&format!("model.layers.{l}.mlp.gate.gate.weight")))
        .map(|l| l.to_string())
        .collect();
    if moe.is_empty() {
        return Err(gguf_err(
            path,
            "no expert layer (`ffn_gate_inp`): mlx-lm's step3p5 puts experts on every layer but \
            the first when it is told none",
        ));
    }
    config["moe_layers_enum"] = Value::from(moe.join(","));
    for (k, field) in [
        ("swiglu_clamp_exp", "swiglu_limits"),
        ("swiglu_clamp_shexp", "swiglu_limits_shared"),
    ] {
        if let Some(v) = layer_list(meta, path, &key(k), blocks)? {
            config[field] = v.into_iter().collect();
        }
    }
    config["use_head_wise_attn_gate"] = Value::from(
        tensors
            .keys()
            .any(|k| k.ends_with(".self_attn.g_proj.weight")),
    );
    if let Some(o) = config.as_object_mut() {
        o.remove("num_key_value_heads");
    }
    Ok(())
}

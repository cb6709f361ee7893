//! Linear-attention and recurrent hybrids (Qwen3-Next / Qwen 3.5, Kimi Linear, RWKV-7,
//! LFM2): the regrouped projections and value heads put back, and the per-layer kinds.

use std::collections::BTreeMap;

use mlx_core::io::GgufValue;
use mlx_core::prelude::*;
use serde_json::{json, Value};

use super::{
    gguf_err, layer_list, meta_count, meta_f64, meta_layer_count, need_count, require_context, Cx,
    QWEN35_PARTS,
};
use crate::error::{ModelError, Result};

pub(super) fn rwkv7_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks, heads) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
        cx.heads,
    );
    let need = |k: &str| need_count(meta, path, "rwkv7", k);
    let head = need("wkv.head_size")?;
    config["head_dim"] = Value::from(head);
    config["decay_low_rank_dim"] = Value::from(need("attention.decay_lora_rank")?);
    config["a_low_rank_dim"] = Value::from(need("attention.iclr_lora_rank")?);
    config["v_low_rank_dim"] = Value::from(need("attention.value_residual_mix_lora_rank")?);
    config["gate_low_rank_dim"] = Value::from(need("attention.gate_lora_rank")?);
    tensors.retain(|k, _| !k.starts_with("model.layers.0.attn.v_lora."));
    let names: Vec<String> = tensors.keys().cloned().collect();
    for name in names {
        let Some(t) = tensors.remove(&name) else {
            continue;
        };
        if let Some(p) = name.strip_suffix(".gguf0.weight") {
            tensors.insert(format!("{p}.lora.2.bias"), t);
        } else if let Some(p) = name.strip_suffix(".attn.gguf_lerp.weight") {
            let hidden = t.shape().last().copied().unwrap_or(0);
            if t.size() != 6 * hidden as usize {
                return Err(ModelError::Weights(vec![format!(
                    "GGUF tensor blk.{}.time_mix_lerp_fused.weight: shape {:?}, expected the six \
                     token-shift mixes (r, w, k, v, a, g) of the width",
                    p.trim_start_matches("model.layers."),
                    t.shape()
                )]));
            }
            let t = t.reshape(&[6, 1, 1, hidden])?;
            for (i, x) in ["r", "w", "k", "v", "a", "g"].iter().enumerate() {
                let one = ops::take(&t, &Array::from_slice(&[i as i32], &[1])?, 0, None)?;
                tensors.insert(format!("{p}.attn.x_{x}"), one.reshape(&[1, 1, hidden])?);
            }
        } else if name.ends_with(".attn.r_k") {
            tensors.insert(name, t.reshape(&[heads, head])?);
        } else {
            tensors.insert(name, t);
        }
    }
    if !tensors.contains_key("model.layers.0.pre_norm.weight") && blocks > 0 {
        return Err(ModelError::Weights(vec![
            "GGUF tensor token_embd_norm.weight is missing (RWKV-7's first pre-norm)".into(),
        ]));
    }
    Ok(())
}

/// llama.cpp's `qwen3next` as mlx-lm's qwen3_next, and `qwen35` / `qwen35moe` as qwen3_5 /
/// qwen3_5_moe: the gated-delta sizes from the `ssm.*` keys (`state_size` the key head size,
/// `group_count` the key heads, `time_step_rank` the value heads, `inner_size` their width),
/// the layer pattern from `full_attention_interval` (an `attention.recurrent_layers` list must
/// follow it), experts renormalized as llama.cpp does; and the tensors back in mlx-lm's form:
/// the conv kernel given its trailing axis, `ssm_dt.bias` as `dt_bias`; for qwen3next
/// `attn_qkv` / `attn_gate` regrouped per key head into `in_proj_qkvz`; for Qwen 3.5 they are
/// `in_proj_qkv` / `in_proj_z`, and the value heads, which the converter reorders from grouped
/// by key head to tiled ([`untile_v_heads`]), are put back in every tensor it reorders.
pub(super) fn qwen3next_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks, arch) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
        cx.arch,
    );
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| -> Result<i32> {
        meta_count(meta, path, &key(k))?
            .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", key(k))))
    };
    let (nk, dk, nv, inner) = (
        need("ssm.group_count")?,
        need("ssm.state_size")?,
        need("ssm.time_step_rank")?,
        need("ssm.inner_size")?,
    );
    if nk <= 0 || dk <= 0 || nv <= 0 || inner <= 0 || inner % nv != 0 || nv % nk != 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata: `ssm.inner_size` {inner}, `ssm.time_step_rank` {nv}, \
                 `ssm.state_size` {dk} and `ssm.group_count` {nk} do not divide into heads"
            ),
        ));
    }
    let dv = inner / nv;
    let interval = meta_count(meta, path, &key("full_attention_interval"))?.unwrap_or(4);
    if interval <= 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is {interval}",
                key("full_attention_interval")
            ),
        ));
    }
    if let Some(GgufValue::Array(a)) = meta.get(&key("attention.recurrent_layers")) {
        let flags: Vec<bool> = a
            .astype(Dtype::Bool)
            .and_then(|b| b.to_vec::<bool>())
            .map_err(|e| gguf_err(path, format!("metadata `attention.recurrent_layers`: {e}")))?;
        let ok =
            (0..blocks as usize).all(|i| flags.get(i) == Some(&((i as i32 + 1) % interval != 0)));
        if !ok {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is not every {interval}th layer full attention, the only \
                     pattern mlx-lm's {} has",
                    key("attention.recurrent_layers"),
                    config["model_type"].as_str().unwrap_or(arch)
                ),
            ));
        }
    }
    let head_dim = config["head_dim"].as_i64().unwrap_or(0);
    let rot = need("rope.dimension_count")?;
    if head_dim <= 0 {
        return Err(gguf_err(
            path,
            format!("metadata `{}` is missing", key("attention.key_length")),
        ));
    }
    let partial = f64::from(rot) / head_dim as f64;
    let qwen35 = arch != "qwen3next";
    config["linear_num_key_heads"] = Value::from(nk);
    config["linear_key_head_dim"] = Value::from(dk);
    config["linear_num_value_heads"] = Value::from(nv);
    config["linear_value_head_dim"] = Value::from(dv);
    config["linear_conv_kernel_dim"] = Value::from(need("ssm.conv_kernel")?);
    config["full_attention_interval"] = Value::from(interval);
    config["attention_bias"] = Value::from(
        (0..blocks)
            .any(|l| tensors.contains_key(&format!("model.layers.{l}.self_attn.q_proj.bias"))),
    );
    if qwen35 {
        // qwen3_5's rope settings are `rope_parameters` (its defaults otherwise: theta 1e5,
        // a quarter rotated). Text positions make the interleaved MRoPE of
        // `rope.dimension_sections` plain rope, which is what mlx-lm's text model applies.
        let mut rope = json!({
            "type": "default",
            "rope_theta": config["rope_theta"].clone(),
            "partial_rotary_factor": partial,
        });
        if let Some(GgufValue::Array(a)) = meta.get(&key("rope.dimension_sections")) {
            let s = a
                .astype(Dtype::Int64)
                .and_then(|b| b.to_vec::<i64>())
                .map_err(|e| gguf_err(path, format!("metadata `rope.dimension_sections`: {e}")))?;
            rope["mrope_section"] = json!(s.iter().take(3).collect::<Vec<_>>());
        }
        config["rope_parameters"] = rope;
    } else {
        config["partial_rotary_factor"] = Value::from(partial);
    }
    if arch != "qwen35" {
        cx.k.experts(
            config,
            &[
                "num_experts",
                "num_experts_per_tok",
                "moe_intermediate_size",
            ],
        )?;
        config["shared_expert_intermediate_size"] =
            Value::from(need("expert_shared_feed_forward_length")?);
        config["decoder_sparse_step"] = Value::from(1);
        config["norm_topk_prob"] = Value::from(true);
    }
    if arch == "qwen3next" {
        let dense: Vec<i32> = (0..blocks)
            .filter(|l| tensors.contains_key(&format!("model.layers.{l}.mlp.gate_proj.weight")))
            .collect();
        config["mlp_only_layers"] = json!(dense);
    }

    let bad = |what: String| gguf_err(path, what);
    let r = nv / nk;
    let qk_rows = 2 * nk * dk;
    // Value heads tiled -> grouped along `axis`, each head `len / nv` wide (whole quantization
    // groups of a packed tensor's columns, or the error says so).
    let untile = |a: &Array, axis: usize, name: &str| -> Result<Array> {
        if r == 1 {
            return Ok(a.clone());
        }
        let len = a.shape().get(axis).copied().unwrap_or(0);
        if len <= 0 || len % nv != 0 {
            return Err(bad(format!(
                "GGUF tensor {name}: shape {:?} does not split into {nv} value heads along axis {axis}",
                a.shape()
            )));
        }
        untile_v_heads(a, axis, nk, r, len / nv)
    };
    // The V part (after q and k, `2 * nk * dk` rows) of a (rows, ..) tensor, put back in order.
    let untile_v_rows = |a: &Array, name: &str| -> Result<Array> {
        let rows = a.shape().first().copied().unwrap_or(0);
        if rows != qk_rows + nv * dv {
            return Err(bad(format!(
                "GGUF tensor {name}: shape {:?}, expected {} rows (2 x {nk} x {dk} + {nv} x {dv})",
                a.shape(),
                qk_rows + nv * dv
            )));
        }
        if r == 1 {
            return Ok(a.clone());
        }
        let parts = ops::split_at(a, &[qk_rows], 0, None)?;
        let [qk, v] = <[Array; 2]>::try_from(parts)
            .map_err(|_| bad(format!("GGUF tensor {name}: split failed")))?;
        let v = untile(&v, 0, name)?;
        Ok(ops::concatenate(&[&qk, &v], 0, None)?)
    };
    let names: Vec<String> = tensors.keys().cloned().collect();
    for k in names {
        let take = |t: &mut BTreeMap<String, Array>| t.remove(&k).ok_or_else(|| bad(k.clone()));
        let g = gguf_linear_attn_name(&k);
        if let Some(p) = k.strip_suffix(".linear_attn.gguf_dt.bias") {
            let a = take(tensors)?;
            let a = if qwen35 { untile(&a, 0, &g)? } else { a };
            tensors.insert(format!("{p}.linear_attn.dt_bias"), a);
        } else if qwen35 && k.ends_with(".linear_attn.A_log") {
            let a = untile(&take(tensors)?, 0, &g)?;
            tensors.insert(k, a);
        } else if k.ends_with(".linear_attn.conv1d.weight") {
            let a = take(tensors)?;
            let a = match a.shape().as_slice() {
                &[c, w] => {
                    let a = if qwen35 { untile_v_rows(&a, &g)? } else { a };
                    a.reshape(&[c, w, 1])?
                }
                s => {
                    return Err(bad(format!(
                        "GGUF tensor {g}: shape {s:?}, expected (channels, kernel)"
                    )))
                }
            };
            tensors.insert(k, a);
        } else if qwen35 {
            let Some((p, rest)) = k.split_once(".linear_attn.") else {
                continue;
            };
            let Some((part, suffix)) = rest.split_once('.') else {
                continue;
            };
            let (to, a) = match part {
                "gguf_qkv" => ("in_proj_qkv", untile_v_rows(&take(tensors)?, &g)?),
                "gguf_z" => ("in_proj_z", untile(&take(tensors)?, 0, &g)?),
                "in_proj_b" | "in_proj_a" => (part, untile(&take(tensors)?, 0, &g)?),
                "out_proj" => {
                    let a = take(tensors)?;
                    let last = a.ndim().saturating_sub(1);
                    ("out_proj", untile(&a, last, &g)?)
                }
                _ => continue,
            };
            tensors.insert(format!("{p}.linear_attn.{to}.{suffix}"), a);
        } else if let Some(rest) = k.split_once(".linear_attn.gguf_qkv.") {
            let (p, suffix) = rest;
            let qkv = tensors.remove(&k).ok_or_else(|| bad(k.clone()))?;
            let zk = format!("{p}.linear_attn.gguf_z.{suffix}");
            let z = tensors
                .remove(&zk)
                .ok_or_else(|| bad(format!("GGUF tensor {g} without its attn_gate")))?;
            let cols = qkv.shape().last().copied().unwrap_or(0);
            let rows = qkv.shape().first().copied().unwrap_or(0);
            if qkv.ndim() != 2
                || z.ndim() != 2
                || rows != nk * (2 * dk + r * dv)
                || z.shape()[0] != nk * r * dv
                || z.shape()[1] != cols
            {
                return Err(bad(format!(
                    "GGUF tensor {g} {:?} / attn_gate {:?} are not ({nk} key heads x (2 x {dk} + {} ), \
                     columns) / ({nk} x {}, columns)",
                    qkv.shape(),
                    z.shape(),
                    r * dv,
                    r * dv
                )));
            }
            let parts = ops::split_at(&qkv, &[nk * dk, 2 * nk * dk], 0, None)?;
            let [q, kk, v] = <[Array; 3]>::try_from(parts)
                .map_err(|_| bad(format!("GGUF tensor {g}: split failed")))?;
            let q = q.reshape(&[nk, dk, cols])?;
            let kk = kk.reshape(&[nk, dk, cols])?;
            let v = v.reshape(&[nk, r * dv, cols])?;
            let z = z.reshape(&[nk, r * dv, cols])?;
            let joined = ops::concatenate(&[&q, &kk, &v, &z], 1, None)?;
            let joined = joined.reshape(&[nk * (2 * dk + 2 * r * dv), cols])?;
            tensors.insert(format!("{p}.linear_attn.in_proj_qkvz.{suffix}"), joined);
        }
    }
    if let Some(k) = tensors.keys().find(|k| k.contains(".gguf_")) {
        return Err(bad(format!("GGUF tensor for {k} without its partner")));
    }
    Ok(())
}

/// The GGUF name (`blk.N.attn_qkv.weight`) of an mlx-lm gated-delta tensor name, for messages.
pub(super) fn gguf_linear_attn_name(mapped: &str) -> String {
    let Some((layer, rest)) = mapped
        .strip_prefix("model.layers.")
        .and_then(|r| r.split_once('.'))
    else {
        return mapped.to_string();
    };
    let (part, suffix) = match rest.rsplit_once('.') {
        Some((p, s)) if !rest.ends_with("A_log") && !rest.ends_with("dt_bias") => (p, s),
        _ => (rest, ""),
    };
    let gguf = match part {
        "linear_attn.A_log" => Some("ssm_a"),
        "linear_attn.dt_bias" => Some("ssm_dt.bias"),
        "linear_attn.in_proj_ba" => Some("ssm_ba"),
        _ => QWEN35_PARTS
            .iter()
            .find(|(_, to)| *to == part)
            .map(|(from, _)| *from),
    };
    match (gguf, suffix) {
        (Some(g), "") => format!("blk.{layer}.{g}"),
        (Some(g), s) => format!("blk.{layer}.{g}.{s}"),
        (None, _) => mapped.to_string(),
    }
}

/// Undoes llama.cpp's value-head reorder for Qwen 3.5 (`_LinearAttentionVReorderBase`): along
/// `axis`, heads stored tiled `(per_key, key_heads, width)` go back to mlx-lm's grouped order
/// `(key_heads, per_key, width)`.
pub(super) fn untile_v_heads(
    a: &Array,
    axis: usize,
    key_heads: i32,
    per_key: i32,
    width: i32,
) -> Result<Array> {
    let shape = a.shape();
    let mut split = shape[..axis].to_vec();
    split.extend([per_key, key_heads, width]);
    split.extend_from_slice(&shape[axis + 1..]);
    let v = ops::reshape(a, &split, None)?;
    let v = ops::swapaxes(&v, axis as i32, axis as i32 + 1, None)?;
    Ok(ops::reshape(&v, &shape, None)?)
}

/// Kimi Linear as KimiLinearModel writes it, for mlx-lm's `kimi_linear`: the KDA layers are
/// those with `head_count_kv` 0 (`linear_attn_config.kda_layers`, 1-based), KDA's heads the
/// attention heads and its head size `kda.head_dim`, the short-conv kernel, MLA's sizes
/// (`kv_lora_rank`, the rope width, `key_length_mla` / `value_length_mla`), the expert keys and
/// llama.cpp's router (sigmoid or softmax, always renormalized, grouped only where
/// `expert_group_count` says so, scaled by `expert_weights_scale`). Refused: a Q LoRA rank
/// (mlx-lm's kimi_linear projects Q directly).
pub(super) fn kimi_linear_config(cx: &mut Cx) -> Result<()> {
    let (config, path, meta, heads) = (&mut *cx.config, cx.path, cx.meta, cx.heads);
    let arch = "kimi-linear";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let blocks = config["num_hidden_layers"].as_i64().unwrap_or(0) as usize;
    let kv = layer_list(meta, path, &key("attention.head_count_kv"), blocks)?.ok_or_else(|| {
        gguf_err(
            path,
            format!(
                "metadata `{}` must list the KV heads per layer (0 on KDA layers)",
                key("attention.head_count_kv")
            ),
        )
    })?;
    let kda: Vec<usize> = (0..blocks)
        .filter(|&l| kv[l] == 0.0)
        .map(|l| l + 1)
        .collect();
    let full: Vec<usize> = (0..blocks)
        .filter(|&l| kv[l] != 0.0)
        .map(|l| l + 1)
        .collect();
    if kda.is_empty() || full.is_empty() {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}`: mlx-lm's kimi_linear needs both KDA (0) and MLA layers",
                key("attention.head_count_kv")
            ),
        ));
    }
    if let Some(r) = meta_count(meta, path, &key("attention.q_lora_rank"))? {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {r}: mlx-lm's kimi_linear projects Q without a LoRA",
                key("attention.q_lora_rank")
            ),
        ));
    }
    let rope = need("rope.dimension_count")?;
    let k_mla = need("attention.key_length_mla")?;
    if k_mla <= rope {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {k_mla} leaves no room beside the rope width {rope}",
                key("attention.key_length_mla")
            ),
        ));
    }
    let router = match meta_count(meta, path, &key("expert_gating_func"))? {
        None | Some(2) => "sigmoid",
        Some(1) => "softmax",
        Some(g) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {g}: mlx-lm's kimi_linear routes by softmax (1) or \
                     sigmoid (2)",
                    key("expert_gating_func")
                ),
            ))
        }
    };
    let groups = meta_count(meta, path, &key("expert_group_count"))?.unwrap_or(1);
    let groups_used = if groups > 1 {
        need("expert_group_used_count")?
    } else {
        1
    };
    let kda_dim = need("kda.head_dim")?;
    let o = json!({
        "num_key_value_heads": heads,
        "head_dim": kda_dim,
        "linear_attn_config": {
            "num_heads": heads,
            "head_dim": kda_dim,
            "kda_layers": kda,
            "full_attn_layers": full,
            "short_conv_kernel_size": need("ssm.conv_kernel")?,
        },
        "model_max_length": need("context_length")?,
        "kv_lora_rank": need("attention.kv_lora_rank")?,
        "qk_rope_head_dim": rope,
        "qk_nope_head_dim": k_mla - rope,
        "v_head_dim": need("attention.value_length_mla")?,
        "num_experts": need("expert_count")?,
        "num_experts_per_token": need("expert_used_count")?,
        "moe_intermediate_size": need("expert_feed_forward_length")?,
        "num_shared_experts": need("expert_shared_count")?,
        "first_k_dense_replace":
            meta_count(meta, path, &key("leading_dense_block_count"))?.unwrap_or(0),
        "routed_scaling_factor": meta_f64(meta, &key("expert_weights_scale")).unwrap_or(1.0),
        "moe_router_activation_func": router,
        "moe_renormalize": true,
        "moe_layer_freq": 1,
        "num_expert_group": groups,
        "topk_group": groups_used,
    });
    if let (Some(c), Some(o)) = (config.as_object_mut(), o.as_object()) {
        c.extend(o.clone());
    }
    Ok(())
}

/// LFM2 and LFM2-MoE (`lfm2`, `lfm2moe`): the layer kinds from the per-layer KV heads, the
/// short convolution, the dense width as stored, or the experts with llama.cpp's routing
/// (renormalized, scaled, sigmoid only).
pub(super) fn lfm2_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, arch, blocks, hidden, ffn, kv_per_layer, keys) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.meta,
        cx.arch,
        cx.blocks,
        cx.hidden,
        cx.ffn,
        cx.kv_per_layer,
        cx.k,
    );
    let Some(per) = &kv_per_layer else {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is not a per-layer list; LFM2 needs one",
                keys.key("attention.head_count_kv")
            ),
        ));
    };
    if per.len() != blocks as usize {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` has {} entries for {blocks} layers",
                keys.key("attention.head_count_kv"),
                per.len()
            ),
        ));
    }
    let types: Vec<&str> = per
        .iter()
        .map(|&n| if n == 0 { "conv" } else { "full_attention" })
        .collect();
    config["layer_types"] = json!(types);
    config["conv_L_cache"] = Value::from(keys.count("shortconv.l_cache")?);
    config["conv_bias"] = Value::from(tensors.keys().any(|k| k.ends_with(".conv.in_proj.bias")));
    if arch == "lfm2" {
        // The width is stored already adjusted (LFM2Model._add_feed_forward_length).
        config["block_ff_dim"] = Value::from(ffn);
        config["block_dim"] = Value::from(hidden);
        config["block_auto_adjust_ff_dim"] = Value::from(false);
        config["block_multiple_of"] = Value::from(1);
        config["block_ffn_dim_multiplier"] = Value::Null;
    } else {
        // llama.cpp's LFM2-MoE always renormalizes the top-k weights and scales them
        // by `expert_weights_scale` (1 when absent, as the converter writes none).
        keys.experts(
            config,
            &[
                "num_experts",
                "num_experts_per_tok",
                "moe_intermediate_size",
            ],
        )?;
        let dense = meta_layer_count(meta, path, &keys.key("leading_dense_block_count"), blocks)?;
        config["num_dense_layers"] = Value::from(dense.unwrap_or(0));
        config["norm_topk_prob"] = Value::from(true);
        config["use_expert_bias"] = Value::from(
            tensors
                .keys()
                .any(|k| k.ends_with(".feed_forward.expert_bias")),
        );
        config["routed_scaling_factor"] = Value::from(
            keys.float("expert_weights_scale", true)?
                .filter(|&v| v != 0.0)
                .unwrap_or(1.0),
        );
        if meta_count(meta, path, &keys.key("expert_gating_func"))?.is_some_and(|g| g != 2) {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is not sigmoid (2), the router mlx-lm's lfm2_moe has",
                    keys.key("expert_gating_func")
                ),
            ));
        }
    }
    require_context(config, path, &keys.key("context_length"))?;
    Ok(())
}

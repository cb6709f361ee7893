//! Gemma 2, 3, 3n and 4: soft-capping and windows, the sliding-layer flags, Gemma 3n's
//! AltUp / Laurel / sparsity keys and Gemma 4's per-layer widths and rope.

use std::path::Path;

use mlx_core::io::{GgufMetadata, GgufValue};
use mlx_core::prelude::*;
use serde_json::{json, Value};

use super::{
    attention_kinds, gguf_err, meta_count, meta_f64, meta_layer_count, need_count, require_context,
    Cx,
};
use crate::error::{ModelError, Result};

/// Gemma 3n / 4 `layer_types` from the per-layer sliding flags `key` (one per layer).
pub(super) fn gemma_layer_types(
    meta: &GgufMetadata,
    path: &Path,
    key: &str,
    blocks: i32,
) -> Result<Value> {
    let flags = match meta.get(key) {
        Some(GgufValue::Array(a)) if a.ndim() == 1 => a
            .astype(Dtype::Bool)
            .and_then(|b| b.to_vec::<bool>())
            .map_err(|e| gguf_err(path, format!("metadata `{key}`: {e}")))?,
        _ => vec![],
    };
    if flags.len() != blocks as usize {
        return Err(gguf_err(
            path,
            format!("metadata `{key}` must flag each of the {blocks} layers sliding or not"),
        ));
    }
    Ok(json!(attention_kinds(&flags)))
}

/// The standard normal's CDF, `(1 + erf(t / sqrt 2)) / 2`, by erf's Taylor series (|x| < 4;
/// saturated beyond, where it is 1 within f64).
pub(super) fn normal_cdf(t: f64) -> f64 {
    if t.is_nan() {
        return f64::NAN;
    }
    let x = t / std::f64::consts::SQRT_2;
    if x.abs() >= 4.0 {
        return if x > 0.0 { 1.0 } else { 0.0 };
    }
    // erf(x) = 2 / sqrt(pi) * sum_n (-1)^n x^(2n+1) / (n! (2n+1))
    let (mut term, mut sum, mut n) = (x, x, 0.0);
    while term.abs() > 1e-17 * sum.abs().max(1e-300) {
        n += 1.0;
        term *= -x * x / n;
        sum += term / (2.0 * n + 1.0);
    }
    0.5 * (1.0 + sum * 2.0 / std::f64::consts::PI.sqrt())
}

/// Gemma 3n (`Gemma3NModel`'s keys) as mlx-lm's gemma3n `text_config`: layer types from the
/// per-layer flags, the head size, the sliding window and both rope bases, AltUp's stream
/// count and active stream (and `altup_correct_scale` where the file has its tensors), the
/// Laurel rank from `laurel_l`'s rows, the per-layer input width and its embedding's rows,
/// the shared-KV layer count, the widths (one, or one per layer), the softcap, and
/// `activation_sparsity_pattern` from `activation_sparsity_scale` (the converter's f32
/// standard normal quantile of each value: the value is its CDF, given to 6 decimals as the
/// released ones are; -inf is 0). llama.cpp does not clip AltUp's coefficients and the file
/// does not carry `altup_coef_clip`: none here. The stacked AltUp projections are split back
/// into mlx-lm's three of each.
pub(super) fn gemma3n_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks, ffn_per_layer) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
        cx.ffn_per_layer,
    );
    let key = |k: &str| format!("gemma3n.{k}");
    let need = |k: &str| need_count(meta, path, "gemma3n", k);
    config["layer_types"] =
        gemma_layer_types(meta, path, &key("attention.sliding_window_pattern"), blocks)?;
    config["head_dim"] = Value::from(need("attention.key_length")?);
    config["sliding_window"] = Value::from(need("attention.sliding_window")?);
    config["rope_local_base_freq"] = meta_f64(meta, &key("rope.freq_base_swa"))
        .map_or(config["rope_theta"].clone(), Value::from);
    let inputs = need("altup.num_inputs")?;
    let active = meta_layer_count(meta, path, &key("altup.active_idx"), inputs - 1)?.unwrap_or(0);
    config["altup_num_inputs"] = Value::from(inputs);
    config["altup_active_idx"] = Value::from(active);
    config["altup_coef_clip"] = Value::Null;
    let layer0 = |t: &str| tensors.get(&format!("model.layers.0.{t}"));
    config["altup_correct_scale"] = Value::from(layer0("altup.correct_output_scale").is_some());
    config["laurel_rank"] = match layer0("laurel.linear_left.weight") {
        Some(t) => Value::from(t.shape()[0]),
        None => {
            return Err(ModelError::Weights(vec![
                "GGUF tensor blk.0.laurel_l.weight is missing".into(),
            ]))
        }
    };
    config["hidden_size_per_layer_input"] = Value::from(need("embedding_length_per_layer_input")?);
    config["vocab_size_per_layer_input"] = match tensors.get("model.embed_tokens_per_layer.weight")
    {
        Some(t) => Value::from(t.shape()[0]),
        None => {
            return Err(ModelError::Weights(vec![
                "GGUF tensor per_layer_token_embd.weight is missing".into(),
            ]))
        }
    };
    config["num_kv_shared_layers"] = Value::from(
        meta_layer_count(meta, path, &key("attention.shared_kv_layers"), blocks)?.unwrap_or(0),
    );
    if let Some(per) = ffn_per_layer {
        if per.len() != blocks as usize {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` has {} widths for {blocks} layers",
                    key("feed_forward_length"),
                    per.len()
                ),
            ));
        }
        config["intermediate_size"] = json!(per);
    }
    config["final_logit_softcapping"] =
        meta_f64(meta, &key("final_logit_softcapping")).map_or(Value::Null, Value::from);
    let scales: Vec<f32> = match meta.get(&key("activation_sparsity_scale")) {
        Some(GgufValue::Array(a)) if a.ndim() == 1 && a.size() == blocks as usize => a
            .astype(Dtype::Float32)
            .and_then(|b| b.to_vec::<f32>())
            .map_err(|e| gguf_err(path, format!("metadata `activation_sparsity_scale`: {e}")))?,
        _ => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` must give one value for each of the {blocks} layers",
                    key("activation_sparsity_scale")
                ),
            ))
        }
    };
    let pattern: Vec<f64> = scales
        .iter()
        .map(|&t| (normal_cdf(f64::from(t)) * 1e6).round() / 1e6)
        .collect();
    if pattern.iter().any(|p| !(0.0..1.0).contains(p)) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is {scales:?}: not quantiles of a sparsity in [0, 1)",
                key("activation_sparsity_scale")
            ),
        ));
    }
    config["activation_sparsity_pattern"] = json!(pattern);
    // The converter's stacks (3, hidden, hidden), and their quantization, back into three.
    for (stacked, name) in [
        ("model.gguf_altup_proj", "model.altup_projections"),
        (
            "model.gguf_altup_unembd_proj",
            "model.altup_unembed_projections",
        ),
    ] {
        for suffix in ["weight", "scales", "biases"] {
            let Some(t) = tensors.remove(&format!("{stacked}.{suffix}")) else {
                continue;
            };
            let n = t.shape().first().copied().unwrap_or(0);
            if n != inputs - 1 {
                return Err(ModelError::Weights(vec![format!(
                    "GGUF tensor {}.{suffix}: {n} projections stacked, expected `{}` - 1 = {}",
                    stacked.trim_start_matches("model.gguf_"),
                    key("altup.num_inputs"),
                    inputs - 1
                )]));
            }
            for i in 0..n {
                let one = ops::take(&t, &Array::scalar(i)?, 0, None)?;
                tensors.insert(format!("{name}.{i}.{suffix}"), one);
            }
        }
    }
    require_context(config, path, &key("context_length"))?;
    Ok(())
}

/// Gemma 4 (`Gemma4Model`'s keys) as mlx-lm's gemma4_text args, for the dense models: layer
/// types from `attention.sliding_window_pattern`, the sliding and full layers' head sizes
/// (`key_length_swa`, `key_length`), the shared-KV layer count, the per-layer input width (and
/// its embedding's rows), double-wide MLPs from the per-layer `feed_forward_length`, the
/// softcap (none when absent, as llama.cpp), and `rope_parameters`: the full layers'
/// proportional rope with the rotated fraction `rope_freqs` gives (1 per rotated frequency,
/// 1e30 per other), the sliding layers' default rope over the whole head. Refused, naming
/// the key or tensor: experts (26B), K = V layers (a KV layer without `attn_v`), different KV
/// head counts per kind, sliding layers rotating part of a head (mlx-lm rotates it whole).
pub(super) fn gemma4_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, rope_tensors, path, meta, blocks, ffn_per_layer) = (
        &mut *cx.config,
        &*cx.tensors,
        &mut *cx.rope_tensors,
        cx.path,
        cx.meta,
        cx.blocks,
        cx.ffn_per_layer,
    );
    let key = |k: &str| format!("gemma4.{k}");
    let need = |k: &str| need_count(meta, path, "gemma4", k);
    if meta.contains_key(&key("expert_count")) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}`: Gemma 4's mixture of experts (26B) is not mapped",
                key("expert_count")
            ),
        ));
    }
    config["layer_types"] =
        gemma_layer_types(meta, path, &key("attention.sliding_window_pattern"), blocks)?;
    let (head, global) = (
        need("attention.key_length_swa")?,
        need("attention.key_length")?,
    );
    config["head_dim"] = Value::from(head);
    config["global_head_dim"] = Value::from(global);
    config["sliding_window"] = Value::from(need("attention.sliding_window")?);
    let shared =
        meta_layer_count(meta, path, &key("attention.shared_kv_layers"), blocks)?.unwrap_or(0);
    config["num_kv_shared_layers"] = Value::from(shared);
    let per_layer = meta_layer_count(
        meta,
        path,
        &key("embedding_length_per_layer_input"),
        i32::MAX,
    )?
    .unwrap_or(0);
    config["hidden_size_per_layer_input"] = Value::from(per_layer);
    config["vocab_size_per_layer_input"] = match tensors.get("model.embed_tokens_per_layer.weight")
    {
        Some(t) => Value::from(t.shape()[0]),
        None => config["vocab_size"].clone(),
    };
    let first_shared = i64::from(blocks - shared);
    let base = config["intermediate_size"].as_i64().unwrap_or(0);
    config["use_double_wide_mlp"] = Value::from(match ffn_per_layer {
        None => false,
        Some(per) => {
            let wide =
                (0..per.len() as i64).any(|l| l >= first_shared && per[l as usize] == 2 * base);
            let ok = per.len() == blocks as usize
                && per.iter().enumerate().all(|(l, &n)| {
                    n == if wide && l as i64 >= first_shared {
                        2 * base
                    } else {
                        base
                    }
                });
            if !ok {
                return Err(gguf_err(
                    path,
                    format!(
                        "metadata `{}` is {per:?}: mlx-lm's gemma4_text has one width, doubled \
                         on the {shared} shared-KV layers or not",
                        key("feed_forward_length")
                    ),
                ));
            }
            wide
        }
    });
    for l in 0..first_shared {
        let p = format!("model.layers.{l}.self_attn");
        if tensors.contains_key(&format!("{p}.k_proj.weight"))
            && !tensors.contains_key(&format!("{p}.v_proj.weight"))
        {
            return Err(ModelError::Weights(vec![format!(
                "GGUF tensor blk.{l}.attn_v.weight is missing: K = V attention (Gemma 4 31B) is \
                 not mapped"
            )]));
        }
    }
    if let Some(d) = meta_count(meta, path, &key("rope.dimension_count_swa"))? {
        if d != head {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {d}: a sliding layer rotating part of its {head}-wide \
                     heads, which mlx-lm's gemma4_text rotates whole",
                    key("rope.dimension_count_swa")
                ),
            ));
        }
    }
    let full_theta = config["rope_theta"].clone();
    let swa_theta =
        meta_f64(meta, &key("rope.freq_base_swa")).map_or(full_theta.clone(), Value::from);
    let rotated = match rope_tensors.remove("rope_freqs.weight") {
        None => 1.0,
        Some(f) => {
            let v = f
                .astype(Dtype::Float32)
                .and_then(|a| a.to_vec::<f32>())
                .map_err(|e| gguf_err(path, format!("tensor rope_freqs: {e}")))?;
            let n = v.iter().take_while(|&&x| x == 1.0).count();
            if v.len() as i64 * 2 != i64::from(global) || v[n..].iter().any(|&x| x < 1e30) {
                return Err(gguf_err(
                    path,
                    format!(
                        "tensor rope_freqs: expected {} factors, 1 for each rotated frequency \
                         then 1e30, as Gemma 4's converter writes them",
                        global / 2
                    ),
                ));
            }
            2.0 * n as f64 / f64::from(global)
        }
    };
    config["rope_parameters"] = json!({
        "full_attention": {
            "rope_type": "proportional",
            "rope_theta": full_theta,
            "partial_rotary_factor": rotated,
        },
        "sliding_attention": {
            "rope_type": "default",
            "rope_theta": swa_theta,
            "partial_rotary_factor": 1.0,
        },
    });
    config["final_logit_softcapping"] =
        meta_f64(meta, &key("final_logit_softcapping")).map_or(Value::Null, Value::from);
    config["attention_k_eq_v"] = Value::from(false);
    config["enable_moe_block"] = Value::from(false);
    require_context(config, path, &key("context_length"))?;
    Ok(())
}

/// Gemma 2 and 3 (`gemma2`, `gemma3`): the query scale from the head size, the window and
/// the two soft-caps.
pub(super) fn gemma2_config(cx: &mut Cx) -> Result<()> {
    let (config, head_dim, keys) = (&mut *cx.config, cx.head_dim, cx.k);
    if let Some(d) = head_dim {
        // llama.cpp's Gemma 2 / 3 scale queries by head_dim ** -0.5.
        config["query_pre_attn_scalar"] = Value::from(d);
    }
    if let Some(w) = keys.float("attention.sliding_window", false)? {
        config["sliding_window"] = Value::from(w as i64);
    }
    for (k, name) in [
        ("attn_logit_softcapping", "attn_logit_softcapping"),
        ("final_logit_softcapping", "final_logit_softcapping"),
    ] {
        if let Some(v) = keys.float(k, false)? {
            config[name] = Value::from(v);
        }
    }
    Ok(())
}

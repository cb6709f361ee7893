//! Dense transformer maps: llama's tensors with a few keys of their own (Phi-3, Granite,
//! GLM-4, Ministral 3, OLMo 2 / 3, EXAONE, EXAONE 4, Cohere 2, Seed-OSS, ERNIE 4.5, Command-R,
//! Nanbeige, Nemotron, Hunyuan, Apertus, MiniCPM, Mellum, Spark 2.5).

use mlx_core::io::GgufValue;
use mlx_core::prelude::*;
use serde_json::{json, Value};

use super::rope::long_rope;
use super::{
    attention_kinds, gguf_err, meta_count, meta_f64, meta_str, positive_f64, require_context,
    rotary_dims, sliding_kinds, Cx,
};
use crate::error::Result;

/// RWKV-7 (`Rwkv7Model`'s keys) as mlx-lm's rwkv7 args: the head size, the four LoRA ranks,
/// the LayerNorm epsilon; the fused token-shift mixes (r, w, k, v, a, g) split back into
/// `x_r` .. `x_g` of shape (1, 1, hidden), the LoRAs' biases (`*0`) back under `lora.2.bias`,
/// `r_k` per head, and the first layer's value LoRA dropped (the converter writes copies of
/// its `a` LoRA there; mlx-lm's first layer has none).
/// Nemotron (`nemotron`): relu2, the rotated share of the head from `rope.dimension_count`
/// (the converter's int(factor * hidden) // heads), biases from the tensors, linear rope
/// scaling from `rope.scaling.type` / `rope.scaling.factor` (another kind is refused).
pub(super) fn nemotron_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, hidden, heads) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.meta,
        cx.hidden,
        cx.heads,
    );
    let key = |k: &str| format!("nemotron.{k}");
    config["hidden_act"] = Value::from("relu2");
    // The head size is `attention.key_length` where written (TextModel writes it from the
    // config's `head_dim`), else hidden / heads; `rope.dimension_count` is the rotated part.
    let hd = meta_count(meta, path, &key("attention.key_length"))?.unwrap_or(hidden / heads.max(1));
    config["head_dim"] = Value::from(hd);
    let rot = rotary_dims(meta, path, &key("rope.dimension_count"), hd / 2, hd)?;
    config["partial_rotary_factor"] = Value::from(f64::from(rot) / f64::from(hd));
    let has = |k: &str| tensors.contains_key(k);
    config["attention_bias"] = Value::from(has("model.layers.0.self_attn.q_proj.bias"));
    config["mlp_bias"] = Value::from(has("model.layers.0.mlp.up_proj.bias"));
    match meta_str(meta, &key("rope.scaling.type")) {
        None | Some("none") => {}
        Some("linear") => {
            let f = meta_f64(meta, &key("rope.scaling.factor")).ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `{}` is missing", key("rope.scaling.factor")),
                )
            })?;
            config["rope_scaling"] = json!({"type": "linear", "factor": f});
        }
        Some(other) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {other:?}: mlx-lm's nemotron takes linear scaling only",
                    key("rope.scaling.type")
                ),
            ))
        }
    }
    Ok(())
}

/// Mellum (`mellum`): the experts (llama.cpp renormalizes the top-k softmax weights and scales
/// them only by an `expert_weights_scale` other than 0 or 1, which mlx-lm's mellum lacks), the
/// layer kinds from the sliding flags (all full without a window) and each kind's rope base.
pub(super) fn mellum_config(cx: &mut Cx) -> Result<()> {
    let (config, path, meta, blocks) = (&mut *cx.config, cx.path, cx.meta, cx.blocks);
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    cx.k.experts(
        config,
        &[
            "num_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
        ],
    )?;
    config["norm_topk_prob"] = Value::from(true);
    if let Some(s) = meta_f64(meta, &key("expert_weights_scale")).filter(|&s| s != 0.0 && s != 1.0)
    {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is {s}: mlx-lm's mellum does not scale its experts",
                key("expert_weights_scale")
            ),
        ));
    }
    if let Some(t) = meta_str(meta, &key("rope.scaling.type")).filter(|t| *t != "none") {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is `{t}`; the mellum map reads unscaled rope only",
                key("rope.scaling.type")
            ),
        ));
    }
    let window = meta_count(meta, path, &key("attention.sliding_window"))?;
    let kinds = match window {
        Some(_) => sliding_kinds(meta, path, key, blocks)?,
        None => vec!["full_attention"; blocks as usize],
    };
    config["layer_types"] = json!(kinds);
    config["sliding_window"] = Value::from(window.unwrap_or(0));
    let theta = config["rope_theta"].clone();
    let swa = match positive_f64(meta, path, &key("rope.freq_base_swa"))? {
        Some(t) => Value::from(t),
        None => theta.clone(),
    };
    config["rope_parameters"] = json!({
        "full_attention": {"rope_theta": theta},
        "sliding_attention": {"rope_theta": swa},
    });
    if config.get("head_dim").is_none() {
        return Err(gguf_err(
            path,
            format!("metadata `{}` is missing", key("attention.key_length")),
        ));
    }
    Ok(())
}

/// Spark 2.5 (`spark2_5`): the layer kinds from the per-layer sliding flags, the window, and
/// each kind's `rope_parameters` (base, rotated share of the head); biases from the tensors.
pub(super) fn spark2_5_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks) =
        (&mut *cx.config, &*cx.tensors, cx.path, cx.meta, cx.blocks);
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    let missing = |k: &str| gguf_err(path, format!("metadata `{}` is missing", key(k)));
    config["layer_types"] = json!(sliding_kinds(meta, path, key, blocks)?);
    config["sliding_window"] = Value::from(
        meta_count(meta, path, &key("attention.sliding_window"))?
            .ok_or_else(|| missing("attention.sliding_window"))?,
    );
    let hd = config["head_dim"]
        .as_f64()
        .ok_or_else(|| missing("attention.key_length"))?;
    let theta = config["rope_theta"].clone();
    let swa_theta = match positive_f64(meta, path, &key("rope.freq_base_swa"))? {
        Some(t) => Value::from(t),
        None => theta.clone(),
    };
    let share = |k: &str| -> Result<f64> {
        Ok(meta_count(meta, path, &key(k))?.map_or(1.0, |d| f64::from(d) / hd))
    };
    config["rope_parameters"] = json!({
        "full_attention": {"rope_theta": theta, "partial_rotary_factor": share("rope.dimension_count")?},
        "sliding_attention": {"rope_theta": swa_theta, "partial_rotary_factor": share("rope.dimension_count_swa")?},
    });
    let has = |t: &str| tensors.contains_key(&format!("model.layers.0.{t}"));
    config["attention_bias"] = Value::from(has("self_attn.q_k_v_proj.bias"));
    config["mlp_bias"] = Value::from(has("mlp.down_proj.bias"));
    Ok(())
}

/// MiniCPM (`minicpm`): mlx-lm's `scale_emb` (`embedding_scale`), `scale_depth`
/// (`residual_scale` times the square root of the layer count) and `dim_model_base` (hidden /
/// `logit_scale`, an integer where it is one): mlx-lm recomputes the residual and logit scales
/// from them in Python floats, which come back to the file's f32 values.
pub(super) fn minicpm_config(cx: &mut Cx) -> Result<()> {
    let (config, path, meta, blocks, hidden) =
        (&mut *cx.config, cx.path, cx.meta, cx.blocks, cx.hidden);
    let need = |k: &str| -> Result<f64> {
        let key = format!("minicpm.{k}");
        match meta_f64(meta, &key) {
            Some(v) if v.is_finite() && v != 0.0 => Ok(v),
            Some(v) => Err(gguf_err(path, format!("metadata `{key}` is {v}"))),
            None => Err(gguf_err(path, format!("metadata `{key}` is missing"))),
        }
    };
    config["scale_emb"] = Value::from(need("embedding_scale")?);
    config["scale_depth"] = Value::from(need("residual_scale")? * f64::from(blocks).sqrt());
    let base = f64::from(hidden) / need("logit_scale")?;
    config["dim_model_base"] = if base.fract() == 0.0 && base.abs() < 1e9 {
        Value::from(base as i64)
    } else {
        Value::from(base)
    };
    Ok(())
}

/// Hunyuan dense (`hunyuan-dense`): mlx-lm's hunyuan_v1_dense with the file's rope base, which
/// HunYuanModel wrote already scaled by its NTK alpha (so no `rope_scaling`: alpha 1 keeps the
/// base); a scaling other than "none" is refused. The head size from `attention.key_length`,
/// q / k norms and biases from the tensors.
pub(super) fn hunyuan_dense_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, hidden, heads) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.meta,
        cx.hidden,
        cx.heads,
    );
    let key = |k: &str| format!("hunyuan-dense.{k}");
    let hd = meta_count(meta, path, &key("attention.key_length"))?.unwrap_or(hidden / heads.max(1));
    config["head_dim"] = Value::from(hd);
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
    let has = |k: &str| tensors.contains_key(k);
    config["use_qk_norm"] = Value::from(has("model.layers.0.self_attn.query_layernorm.weight"));
    config["attention_bias"] = Value::from(has("model.layers.0.self_attn.q_proj.bias"));
    Ok(())
}

/// Apertus (`apertus`): each layer's xIELU parameters from the per-layer `xielu.alpha_n`,
/// `xielu.alpha_p`, `xielu.beta` and `xielu.eps` arrays (the converter's `.item()` of each
/// parameter) back into mlx-lm's `mlp.act_fn.*` scalars; biases and q / k norms from the tensors.
pub(super) fn apertus_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
    );
    for name in ["alpha_n", "alpha_p", "beta", "eps"] {
        let key = format!("apertus.xielu.{name}");
        let values: Vec<f32> = match meta.get(&key) {
            Some(GgufValue::Array(a)) if a.ndim() == 1 && a.size() == blocks as usize => a
                .astype(Dtype::Float32)
                .and_then(|b| b.to_vec::<f32>())
                .map_err(|e| gguf_err(path, format!("metadata `{key}`: {e}")))?,
            None => return Err(gguf_err(path, format!("metadata `{key}` is missing"))),
            Some(_) => {
                return Err(gguf_err(
                    path,
                    format!("metadata `{key}` must give one value for each of the {blocks} layers"),
                ))
            }
        };
        for (l, v) in values.into_iter().enumerate() {
            tensors.insert(
                format!("model.layers.{l}.mlp.act_fn.{name}"),
                Array::scalar(v)?,
            );
        }
    }
    let has = |k: &str| tensors.contains_key(k);
    config["mlp_bias"] = Value::from(has("model.layers.0.mlp.up_proj.bias"));
    config["attention_bias"] = Value::from(has("model.layers.0.self_attn.q_proj.bias"));
    config["qk_norm"] = Value::from(has("model.layers.0.self_attn.q_norm.weight"));
    config["post_norm"] = Value::from(false);
    Ok(())
}

/// Phi-3 and PhiMoE (`phi3`, `phimoe`): the partial rope as `partial_rotary_factor` (phimoe
/// has none and refuses one), phimoe's expert counts, and the long-rope factor tensors.
pub(super) fn phi3_config(cx: &mut Cx) -> Result<()> {
    let (config, rope_tensors, path, meta, arch, hidden, heads, keys) = (
        &mut *cx.config,
        &mut *cx.rope_tensors,
        cx.path,
        cx.meta,
        cx.arch,
        cx.hidden,
        cx.heads,
        cx.k,
    );
    if let Some(d) = keys.float("rope.dimension_count", false)? {
        let hd = f64::from(hidden / heads);
        if arch == "phi3" {
            config["partial_rotary_factor"] = Value::from(d / hd);
        } else if d != hd {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {d}: a partial rope, which mlx-lm's phimoe lacks",
                    keys.key("rope.dimension_count")
                ),
            ));
        }
    }
    if arch == "phimoe" {
        keys.experts(config, &["num_local_experts", "num_experts_per_tok"])?;
    }
    long_rope(config, rope_tensors, path, meta, arch)?;
    Ok(())
}

/// Granite and Granite MoE (`granite`, `granitemoe`): the four multipliers (attention,
/// embedding, residual, logits), required, the biases from the tensors, the expert counts.
pub(super) fn granite_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, arch, keys) =
        (&mut *cx.config, &*cx.tensors, cx.path, cx.arch, cx.k);
    if arch == "granitemoe" {
        keys.experts(config, &["num_local_experts", "num_experts_per_tok"])?;
    }
    let has_bias = |t: &str| tensors.contains_key(&format!("model.layers.0.{t}.bias"));
    config["attention_bias"] = Value::from(has_bias("self_attn.q_proj"));
    config["mlp_bias"] = Value::from(has_bias("mlp.down_proj"));
    for (k, name) in [
        ("attention.scale", "attention_multiplier"),
        ("embedding_scale", "embedding_multiplier"),
        ("residual_scale", "residual_multiplier"),
        ("logit_scale", "logits_scaling"),
    ] {
        let v = keys
            .float(k, false)?
            .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", keys.key(k))))?;
        config[name] = Value::from(v);
    }
    require_context(config, path, &keys.key("context_length"))?;
    Ok(())
}

/// GLM-4 (`glm4`): the head size, the attention bias from the tensors, and the rotated part
/// (`rope.dimension_count`, half a head when absent) as `partial_rotary_factor`.
pub(super) fn glm4_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, hidden, heads, keys) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.meta,
        cx.hidden,
        cx.heads,
        cx.k,
    );
    // `rope.dimension_count` is the rotated part of a head here, not its size.
    let hd = meta_count(meta, path, &keys.key("attention.key_length"))?
        .map_or(i64::from(hidden / heads), i64::from);
    config["head_dim"] = Value::from(hd);
    config["attention_bias"] =
        Value::from(tensors.contains_key("model.layers.0.self_attn.q_proj.bias"));
    // llama.cpp rotates `rope.dimension_count` dims of each head (HF's default: half).
    let rot = keys
        .float("rope.dimension_count", false)?
        .unwrap_or(hd as f64 / 2.0);
    config["partial_rotary_factor"] = Value::from(rot / hd as f64);
    Ok(())
}

/// Ministral 3 (`mistral3`): `rope_parameters` from the YaRN keys, which must be there.
pub(super) fn mistral3_config(cx: &mut Cx) -> Result<()> {
    let (config, path, meta, keys) = (&mut *cx.config, cx.path, cx.meta, cx.k);
    // rope_parameters from YaRN's keys; `yarn_log_multiplier` is mscale_all_dim here
    // (Ministral3Model writes it as is) and `temperature_scale` Llama 4's beta.
    let need = |k: &str| -> Result<f64> {
        keys.float(k, false)?
            .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", keys.key(k))))
    };
    match meta_str(meta, &keys.key("rope.scaling.type")) {
        Some("yarn") => {}
        other => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {other:?}; Ministral 3 needs yarn",
                    keys.key("rope.scaling.type")
                ),
            ))
        }
    }
    let m = need("rope.scaling.yarn_log_multiplier")?;
    config["rope_parameters"] = json!({
        "rope_type": "yarn",
        "type": "yarn",
        "rope_theta": config["rope_theta"].clone(),
        "factor": need("rope.scaling.factor")?,
        "original_max_position_embeddings":
            keys.count("rope.scaling.original_context_length")?,
        "beta_fast": keys.float("rope.scaling.yarn_beta_fast", false)?.unwrap_or(32.0),
        "beta_slow": keys.float("rope.scaling.yarn_beta_slow", false)?.unwrap_or(1.0),
        "mscale": m,
        "mscale_all_dim": m,
        "llama_4_scaling_beta": keys.float("attention.temperature_scale", true)?
            .ok_or_else(|| gguf_err(
                path,
                format!("metadata `{}` is missing", keys.key("attention.temperature_scale")),
            ))?,
    });
    Ok(())
}

/// OLMo 2 (`olmo2`), or OLMo 3 when the file has a sliding window: its layer kinds from the
/// per-layer pattern, which must hold both kinds; no rope scaling.
pub(super) fn olmo2_config(cx: &mut Cx) -> Result<()> {
    let (config, path, meta, blocks, keys) = (&mut *cx.config, cx.path, cx.meta, cx.blocks, cx.k);
    // OLMo 3 is written as `olmo2` with a sliding window (and its per-layer pattern).
    if let Some(w) = meta_count(meta, path, &keys.key("attention.sliding_window"))? {
        config["model_type"] = Value::from("olmo3");
        config["sliding_window"] = Value::from(w);
        if let Some(GgufValue::Array(a)) = meta.get(&keys.key("attention.sliding_window_pattern")) {
            let flags = a
                .astype(Dtype::Bool)
                .and_then(|b| b.to_vec::<bool>())
                .map_err(|e| {
                    gguf_err(
                        path,
                        format!("metadata `attention.sliding_window_pattern`: {e}"),
                    )
                })?;
            if flags.len() != blocks as usize || !flags.contains(&false) || !flags.contains(&true) {
                return Err(gguf_err(
                    path,
                    format!(
                        "metadata `{}` has {} entries for {blocks} layers; mlx-lm's olmo3 \
                         needs both sliding and full-attention layers",
                        keys.key("attention.sliding_window_pattern"),
                        flags.len()
                    ),
                ));
            }
            let types = attention_kinds(&flags);
            config["layer_types"] = json!(types);
        }
        if meta_str(meta, &keys.key("rope.scaling.type")).is_some_and(|t| t != "none") {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}`: rope scaling is not mapped for OLMo 3",
                    keys.key("rope.scaling.type")
                ),
            ));
        }
    }
    Ok(())
}

/// EXAONE 4 (`exaone4`): the window and mlx-lm's `sliding_window_pattern` letters (the
/// shortest period of the per-layer flags, llama.cpp's LLLG when there are none).
pub(super) fn exaone4_config(cx: &mut Cx) -> Result<()> {
    let (config, path, meta, blocks, hidden, heads, keys) = (
        &mut *cx.config,
        cx.path,
        cx.meta,
        cx.blocks,
        cx.hidden,
        cx.heads,
        cx.k,
    );
    // mlx-lm's `sliding_window_pattern` is a period of "L" (sliding) / "G" (global)
    // letters: the shortest that repeats the file's per-layer pattern (llama.cpp's
    // default, "LLLG", when the file has a window and no pattern).
    config["rope_scaling"] = Value::Null;
    if config.get("head_dim").is_none() {
        config["head_dim"] = Value::from(hidden / heads);
    }
    match meta_count(meta, path, &keys.key("attention.sliding_window"))? {
        None => {
            config["sliding_window"] = Value::Null;
            config["sliding_window_pattern"] = Value::Null;
        }
        Some(w) => {
            config["sliding_window"] = Value::from(w);
            let flags = match meta.get(&keys.key("attention.sliding_window_pattern")) {
                Some(GgufValue::Array(a)) => a
                    .astype(Dtype::Bool)
                    .and_then(|b| b.to_vec::<bool>())
                    .map_err(|e| {
                        gguf_err(path, format!("metadata `sliding_window_pattern`: {e}"))
                    })?,
                _ => (0..blocks).map(|i| (i + 1) % 4 != 0).collect(),
            };
            let n = flags.len();
            let period = (1..=n)
                .find(|&p| (0..n).all(|i| flags[i] == flags[i % p]))
                .unwrap_or(n);
            let pattern: String = flags[..period]
                .iter()
                .map(|&l| if l { 'L' } else { 'G' })
                .collect();
            if n != blocks as usize || !pattern.contains('L') || !pattern.contains('G') {
                return Err(gguf_err(
                    path,
                    format!(
                        "metadata `{}` ({n} entries for {blocks} layers) needs both \
                         sliding and global layers for mlx-lm's exaone4",
                        keys.key("attention.sliding_window_pattern")
                    ),
                ));
            }
            config["sliding_window_pattern"] = Value::from(pattern);
        }
    }
    require_context(config, path, &keys.key("context_length"))?;
    Ok(())
}

/// Cohere 2 (`cohere2`): one rope base and a full rope, the logit scale, the window with
/// every 4th layer global (a stored pattern must agree), the biases from the tensors.
pub(super) fn cohere2_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, hidden, heads, keys) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.meta,
        cx.hidden,
        cx.heads,
        cx.k,
    );
    let hd = config["head_dim"]
        .as_i64()
        .unwrap_or(i64::from(hidden / heads));
    config["head_dim"] = Value::from(hd);
    if let Some(d) = meta_count(meta, path, &keys.key("rope.dimension_count"))? {
        if i64::from(d) != hd {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {d}: a partial rope, which mlx-lm's cohere2 lacks",
                    keys.key("rope.dimension_count")
                ),
            ));
        }
    }
    if meta_f64(meta, &keys.key("rope.freq_base_swa"))
        .is_some_and(|b| Some(b) != config["rope_theta"].as_f64())
    {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` differs from the global base; mlx-lm's cohere2 has one",
                keys.key("rope.freq_base_swa")
            ),
        ));
    }
    config["logit_scale"] = Value::from(keys.float("logit_scale", false)?.ok_or_else(|| {
        gguf_err(
            path,
            format!("metadata `{}` is missing", keys.key("logit_scale")),
        )
    })?);
    config["sliding_window"] = Value::from(keys.count("attention.sliding_window")?);
    // llama.cpp's default pattern (every 4th layer global); a stored one must agree.
    let pattern = 4;
    if let Some(GgufValue::Array(a)) = meta.get(&keys.key("attention.sliding_window_pattern")) {
        let flags = a
            .astype(Dtype::Bool)
            .and_then(|b| b.to_vec::<bool>())
            .map_err(|e| gguf_err(path, format!("metadata `sliding_window_pattern`: {e}")))?;
        if !(0..flags.len()).all(|i| flags[i] == ((i + 1) % pattern != 0)) {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is not every 4th layer global, the pattern this map \
                     reads",
                    keys.key("attention.sliding_window_pattern")
                ),
            ));
        }
    }
    config["sliding_window_pattern"] = Value::from(pattern as i64);
    let has = |t: &str| tensors.contains_key(&format!("model.layers.0.{t}"));
    config["layer_norm_bias"] = Value::from(has("input_layernorm.bias"));
    config["attention_bias"] = Value::from(has("self_attn.q_proj.bias"));
    Ok(())
}

/// Seed-OSS, ERNIE 4.5 and Command-R (`seed_oss`, `ernie4_5`, `command-r`): biases and
/// norms from the tensors, Command-R's logit scale, and a head size.
pub(super) fn seed_oss_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, arch, hidden, heads, keys) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.arch,
        cx.hidden,
        cx.heads,
        cx.k,
    );
    let has = |t: &str| tensors.contains_key(&format!("model.layers.0.{t}"));
    match arch {
        "seed_oss" => {
            config["attention_bias"] = Value::from(has("self_attn.q_proj.bias"));
            config["attention_out_bias"] = Value::from(has("self_attn.o_proj.bias"));
            config["mlp_bias"] = Value::from(has("mlp.down_proj.bias"));
        }
        "ernie4_5" => {
            config["use_bias"] = Value::from(has("self_attn.q_proj.bias"));
        }
        _ => {
            config["logit_scale"] =
                Value::from(keys.float("logit_scale", false)?.ok_or_else(|| {
                    gguf_err(
                        path,
                        format!("metadata `{}` is missing", keys.key("logit_scale")),
                    )
                })?);
            config["use_qk_norm"] = Value::from(has("self_attn.q_norm.weight"));
            config["layer_norm_bias"] = Value::from(has("input_layernorm.bias"));
            config["attention_bias"] = Value::from(has("self_attn.q_proj.bias"));
        }
    }
    // seed_oss and ernie4_5 need a head size; HF's default when the file has none.
    if config.get("head_dim").is_none() {
        config["head_dim"] = Value::from(hidden / heads);
    }
    require_context(config, path, &keys.key("context_length"))?;
    Ok(())
}

/// EXAONE (`exaone`): mlx-lm's names, a full rope (a partial one is refused), the biases
/// from the tensors.
pub(super) fn exaone_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks, hidden, heads, keys) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
        cx.hidden,
        cx.heads,
        cx.k,
    );
    // mlx-lm's EXAONE names and full-width rope.
    let hd = i64::from(hidden / heads);
    if let Some(d) = meta_count(meta, path, &keys.key("rope.dimension_count"))? {
        if i64::from(d) != config["head_dim"].as_i64().unwrap_or(hd) {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {d}: a partial rope, which mlx-lm's exaone lacks",
                    keys.key("rope.dimension_count")
                ),
            ));
        }
    }
    config["num_layers"] = Value::from(blocks);
    config["attention_bias"] =
        Value::from(tensors.contains_key("transformer.h.0.attn.attention.q_proj.bias"));
    config["mlp_bias"] = Value::from(tensors.contains_key("transformer.h.0.mlp.c_proj.bias"));
    Ok(())
}

/// Nanbeige (`nanbeige`): the loop count, whether the loops between skip the final norm,
/// the biases from the tensors.
pub(super) fn nanbeige_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, keys) =
        (&mut *cx.config, &*cx.tensors, cx.path, cx.meta, cx.k);
    // NanbeigeModel: the loop count and whether the loops between skip the final norm.
    if let Some(n) = meta_count(meta, path, &keys.key("num_loops"))? {
        config["num_loops"] = Value::from(n);
    }
    match meta.get(&keys.key("skip_loop_final_norm")) {
        None => {}
        Some(GgufValue::Array(a)) if a.size() == 1 => {
            let b = a
                .astype(Dtype::Bool)
                .and_then(|b| b.item::<bool>())
                .map_err(|e| gguf_err(path, format!("metadata `skip_loop_final_norm`: {e}")))?;
            config["skip_loop_final_norm"] = Value::from(b);
        }
        Some(_) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is not a flag",
                    keys.key("skip_loop_final_norm")
                ),
            ))
        }
    }
    let has = |t: &str| tensors.contains_key(&format!("model.layers.0.{t}"));
    config["attention_bias"] = Value::from(has("self_attn.q_proj.bias"));
    config["mlp_bias"] = Value::from(has("mlp.down_proj.bias"));
    Ok(())
}

//! State-space stacks and hybrids (Mamba 1/2, Jamba, Falcon-H1, Granite 4.0 H, Nemotron-H,
//! PLaMo 2): the SSM sizes, the per-layer kinds, and the MoE keys of the hybrids.

use std::collections::BTreeMap;
use std::path::Path;

use mlx_core::io::{GgufMetadata, GgufValue};
use mlx_core::prelude::*;
use serde_json::{json, Value};

use super::{gguf_err, meta_bool, meta_count, meta_f64, need_count, require_context, Cx};
use crate::error::{ModelError, Result};

/// Granite 4.0 H (`GraniteHybridModel`'s keys) as mlx-lm's granitemoehybrid args: layer
/// types from the per-layer `head_count_kv` (0: Mamba), the Mamba-2 sizes from `ssm.*`
/// (heads = `time_step_rank`, head size = `inner_size / heads`), Granite's multipliers from
/// its scales, experts and the shared expert's width where there are experts (the converter's
/// split `ffn_gate_shexp` / `ffn_up_shexp` joined back into `input_linear`, gate first, rows
/// with their quantization), rope only where `rope.scaling.finetuned` says (llama.cpp's flag;
/// absent: none, Granite 4.0 H's `nope`).
pub(super) fn granitehybrid_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks, per) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
        cx.kv_per_layer.unwrap_or(&[]),
    );
    let key = |k: &str| format!("granitehybrid.{k}");
    let need = |k: &str| need_count(meta, path, "granitehybrid", k);
    if per.len() != blocks as usize {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` must list a head count for each of the {blocks} layers (0 for a \
                 Mamba layer)",
                key("attention.head_count_kv")
            ),
        ));
    }
    let types: Vec<&str> = per
        .iter()
        .map(|&n| if n == 0 { "mamba" } else { "attention" })
        .collect();
    config["layer_types"] = json!(types);
    let (heads, head_dim) = cx.k.ssm_heads()?;
    config["mamba_n_heads"] = Value::from(heads);
    config["mamba_d_head"] = Value::from(head_dim);
    config["mamba_d_state"] = Value::from(need("ssm.state_size")?);
    config["mamba_d_conv"] = Value::from(need("ssm.conv_kernel")?);
    config["mamba_n_groups"] = Value::from(need("ssm.group_count")?);
    let has = |t: &str| tensors.keys().any(|k| k.ends_with(t));
    config["mamba_conv_bias"] = Value::from(has(".mamba.conv1d.bias"));
    config["mamba_proj_bias"] = Value::from(has(".mamba.in_proj.bias"));
    config["attention_bias"] = Value::from(has(".self_attn.q_proj.bias"));
    config["mlp_bias"] = Value::from(has(".mlp.down_proj.bias"));
    for (k, name) in [
        ("attention.scale", "attention_multiplier"),
        ("embedding_scale", "embedding_multiplier"),
        ("residual_scale", "residual_multiplier"),
        ("logit_scale", "logits_scaling"),
    ] {
        let v = meta_f64(meta, &key(k))
            .filter(|v| v.is_finite() && *v > 0.0)
            .ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `{}` is missing or not a positive number", key(k)),
                )
            })?;
        config[name] = Value::from(v);
    }
    let rope = match meta.get(&key("rope.scaling.finetuned")) {
        None => false,
        Some(GgufValue::Array(a)) if a.size() == 1 => a
            .astype(Dtype::Bool)
            .and_then(|b| b.item::<bool>())
            .map_err(|e| gguf_err(path, format!("metadata `rope.scaling.finetuned`: {e}")))?,
        Some(_) => {
            return Err(gguf_err(
                path,
                format!("metadata `{}` is not a flag", key("rope.scaling.finetuned")),
            ))
        }
    };
    config["position_embedding_type"] = Value::from(if rope { "rope" } else { "nope" });
    if has(".block_sparse_moe.router.layer.weight") {
        cx.k.experts(config, &["num_local_experts", "num_experts_per_tok"])?;
        config["shared_intermediate_size"] =
            Value::from(need("expert_shared_feed_forward_length")?);
        for l in 0..blocks {
            let p = format!("model.layers.{l}.shared_mlp");
            for suffix in ["weight", "scales", "biases"] {
                let (g, u) = (
                    tensors.remove(&format!("{p}.gguf_gate.{suffix}")),
                    tensors.remove(&format!("{p}.gguf_up.{suffix}")),
                );
                match (g, u) {
                    (None, None) => {}
                    (Some(g), Some(u)) => {
                        let joined = ops::concatenate(&[&g, &u], 0, None)?;
                        tensors.insert(format!("{p}.input_linear.{suffix}"), joined);
                    }
                    _ => {
                        return Err(ModelError::Weights(vec![format!(
                            "GGUF tensors blk.{l}.ffn_gate_shexp.{suffix} and \
                             blk.{l}.ffn_up_shexp.{suffix}: one without the other"
                        )]))
                    }
                }
            }
        }
    }
    Ok(())
}

/// Mamba / Mamba-2 (`MambaModel` / `Mamba2Model`'s keys) as mlx-lm's `mamba` / `mamba2`
/// arguments, replacing the transformer fields: the SSM sizes, biases from the tensors,
/// Falcon Mamba (`falcon_mamba`) where `ssm.dt_b_c_rms` is set. Mamba-2's head count is
/// `ssm.time_step_rank`, its time step unclamped (llama.cpp clamps none: mlx-lm's `(0, inf)`).
/// mlx-lm's Mamba block norms use RMSNorm's default epsilon and Falcon Mamba's B/C/dt norms
/// `mixer_rms_eps` (default 1e-6), which no key carries: mlx-lm's defaults, as it reads the
/// checkpoints.
pub(super) fn mamba_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, arch) =
        (&mut *cx.config, &*cx.tensors, cx.path, cx.meta, cx.arch);
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let (inner, rank) = (need("ssm.inner_size")?, need("ssm.time_step_rank")?);
    let has = |t: &str| tensors.contains_key(&format!("backbone.layers.0.mixer.{t}"));
    let mut c = json!({
        "model_type": arch,
        "vocab_size": config["vocab_size"].clone(),
        "hidden_size": config["hidden_size"].clone(),
        "num_hidden_layers": config["num_hidden_layers"].clone(),
        "intermediate_size": inner,
        "state_size": need("ssm.state_size")?,
        "conv_kernel": need("ssm.conv_kernel")?,
        "use_bias": has("in_proj.bias"),
        "use_conv_bias": has("conv1d.bias"),
        "tie_word_embeddings": config["tie_word_embeddings"].clone(),
    });
    if arch == "mamba" {
        c["time_step_rank"] = Value::from(rank);
        if meta_bool(meta, path, &key("ssm.dt_b_c_rms"))? == Some(true) {
            c["model_type"] = Value::from("falcon_mamba");
        }
    } else {
        c["num_heads"] = Value::from(rank);
        c["head_dim"] = Value::from(cx.k.ssm_head_dim(inner, rank)?);
        c["n_groups"] = Value::from(need("ssm.group_count")?);
        c["layer_norm_epsilon"] = config["rms_norm_eps"].clone();
        c["time_step_limit"] = json!([0.0, "Infinity"]);
        c["time_step_rank"] = Value::from("auto");
    }
    *config = c;
    Ok(())
}

/// Nemotron-H (dense; `NemotronHModel`'s keys) as mlx-lm's `nemotron_h`: the layer pattern
/// from the per-layer lists (`head_count_kv` > 0: attention `*`, `feed_forward_length` > 0:
/// MLP `-`, both 0: Mamba-2 `M`), the Mamba-2 sizes as `granitehybrid` writes them, biases from
/// the tensors. mlx-lm's model always has its own head: a file without `output.weight` gets
/// the embedding's (llama.cpp's duplicate). `nemotron_h_moe` (`arch`): the MLP layers are
/// mixture-of-experts blocks `E` ([`nemotron_h_moe_config`]); the per-layer lists may also
/// cover the multi-token-prediction block the converter appends (not read).
pub(super) fn nemotron_h_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, arch, kv, ffn) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.arch,
        cx.kv_per_layer,
        cx.ffn_per_layer,
    );
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let moe = arch == "nemotron_h_moe";
    let blocks = config["num_hidden_layers"].as_i64().unwrap_or(0) as usize;
    let nextn = meta_count(meta, path, &key("nextn_predict_layers"))?.unwrap_or(0) as usize;
    let list = |k: &str, per: Option<&[i64]>| -> Result<Vec<i64>> {
        match per {
            Some(p)
                if (p.len() == blocks || p.len() == blocks + nextn)
                    && p.iter().all(|&n| n >= 0) =>
            {
                Ok(p[..blocks].to_vec())
            }
            _ => Err(gguf_err(
                path,
                format!(
                    "metadata `{}` must list a non-negative value for each of the {blocks} \
                     layers (0 for a Mamba-2 layer)",
                    key(k)
                ),
            )),
        }
    };
    let (kv, ffn) = (
        list("attention.head_count_kv", kv)?,
        list("feed_forward_length", ffn)?,
    );
    let mut pattern = String::new();
    let mut width = None;
    for (l, (&k, &f)) in kv.iter().zip(&ffn).enumerate() {
        pattern.push(match (k, f) {
            (0, 0) => 'M',
            (_, 0) => '*',
            (0, f) if width.is_none_or(|w| w == f) => {
                width = Some(f);
                if moe {
                    'E'
                } else {
                    '-'
                }
            }
            _ => {
                return Err(gguf_err(
                    path,
                    format!(
                        "metadata `{}` / `{}`: layer {l} has both or an MLP width other than the \
                         others'",
                        key("attention.head_count_kv"),
                        key("feed_forward_length")
                    ),
                ))
            }
        });
    }
    let (heads, head_dim) = cx.k.ssm_heads()?;
    if meta_bool(meta, path, &key("rope.scaling.finetuned"))? == Some(true) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is true: rope, which mlx-lm's nemotron_h attention lacks",
                key("rope.scaling.finetuned")
            ),
        ));
    }
    config["hybrid_override_pattern"] = Value::from(pattern);
    config["intermediate_size"] = Value::from(width.unwrap_or(0).max(1));
    if moe {
        nemotron_h_moe_config(config, tensors, path, meta, width)?;
    }
    config["mamba_num_heads"] = Value::from(heads);
    config["mamba_head_dim"] = Value::from(head_dim);
    config["ssm_state_size"] = Value::from(need("ssm.state_size")?);
    config["conv_kernel"] = Value::from(need("ssm.conv_kernel")?);
    config["n_groups"] = Value::from(need("ssm.group_count")?);
    let has = |t: &str| tensors.keys().any(|k| k.ends_with(t));
    config["mamba_proj_bias"] = Value::from(has(".mixer.in_proj.bias"));
    config["use_conv_bias"] = Value::from(has(".mixer.conv1d.bias"));
    config["attention_bias"] = Value::from(has(".mixer.q_proj.bias"));
    config["mlp_bias"] = Value::from(has(".mixer.up_proj.bias"));
    config["use_bias"] = Value::from(false);
    if !tensors.contains_key("lm_head.weight") {
        for suffix in ["weight", "scales", "biases"] {
            if let Some(e) = tensors.get(&format!("backbone.embeddings.{suffix}")) {
                let e = e.clone();
                tensors.insert(format!("lm_head.{suffix}"), e);
            }
        }
    }
    Ok(())
}

/// `nemotron_h_moe`'s expert keys as NemotronHModel writes them: `expert_count`,
/// `expert_used_count`, `expert_feed_forward_length` (the per-layer `feed_forward_length` of
/// the `E` layers, `width`), `expert_weights_scale`, `expert_weights_norm` (false when absent,
/// as llama.cpp reads it), `expert_group_count` (1 when absent) and, for more than one group,
/// `expert_group_used_count` (which the converter does not write: llama.cpp refuses such a file
/// too); the shared experts and the latent projections from their tensors and keys. The router
/// is sigmoid with the correction bias in both.
pub(super) fn nemotron_h_moe_config(
    config: &mut Value,
    tensors: &BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    width: Option<i64>,
) -> Result<()> {
    let arch = "nemotron_h_moe";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let experts = need("expert_count")?;
    let used = need("expert_used_count")?;
    let inner = need("expert_feed_forward_length")?;
    if width.is_some_and(|w| w != i64::from(inner)) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {inner} differs from the expert layers' `{}` {width:?}",
                key("expert_feed_forward_length"),
                key("feed_forward_length")
            ),
        ));
    }
    let scale = meta_f64(meta, &key("expert_weights_scale")).ok_or_else(|| {
        gguf_err(
            path,
            format!("metadata `{}` is missing", key("expert_weights_scale")),
        )
    })?;
    let groups = meta_count(meta, path, &key("expert_group_count"))?.unwrap_or(1);
    let groups_used = if groups > 1 {
        Some(need("expert_group_used_count")?)
    } else {
        None
    };
    let rows = |t: &str| {
        tensors
            .iter()
            .find(|(k, _)| k.ends_with(t))
            .and_then(|(_, a)| a.shape().first().copied())
    };
    let shared_rows = rows(".mixer.shared_experts.up_proj.weight");
    let shared_count = meta_count(meta, path, &key("expert_shared_count"))?;
    match (shared_rows, shared_count) {
        (Some(h), _) => {
            if let Some(k) = meta_count(meta, path, &key("expert_shared_feed_forward_length"))? {
                if k != h {
                    return Err(gguf_err(
                        path,
                        format!(
                            "metadata `{}` = {k} differs from `ffn_up_shexp`'s {h} rows",
                            key("expert_shared_feed_forward_length")
                        ),
                    ));
                }
            }
            config["n_shared_experts"] = Value::from(shared_count.unwrap_or(1));
            config["moe_shared_expert_intermediate_size"] = Value::from(h);
        }
        (None, Some(n)) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {n} but the file has no shared experts (`ffn_up_shexp`)",
                    key("expert_shared_count")
                ),
            ))
        }
        (None, None) => {}
    }
    let latent = meta_count(meta, path, &key("moe_latent_size"))?;
    if latent.is_none() && rows(".mixer.fc1_latent_proj.weight").is_some() {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is missing but the file has latent projections (`ffn_latent_down`)",
                key("moe_latent_size")
            ),
        ));
    }
    config["n_routed_experts"] = Value::from(experts);
    config["num_experts_per_tok"] = Value::from(used);
    config["moe_intermediate_size"] = Value::from(inner);
    config["routed_scaling_factor"] = Value::from(scale);
    config["norm_topk_prob"] =
        Value::from(meta_bool(meta, path, &key("expert_weights_norm"))?.unwrap_or(false));
    config["n_group"] = Value::from(groups);
    config["topk_group"] = groups_used.map_or(Value::Null, Value::from);
    config["moe_latent_size"] = latent.map_or(Value::Null, Value::from);
    Ok(())
}

/// Falcon-H1 (`FalconH1Model`'s keys: Mamba2Model's, then the attention's) as mlx-lm's
/// `falcon_h1`. The converter folds every multiplier into the weights (mlx-lm's sanitize does
/// the same on a checkpoint), so they are all 1 here. A tied head is refused: mlx-lm scales
/// tied logits by `lm_head_multiplier / embedding_multiplier`, which the file does not keep.
pub(super) fn falcon_h1_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta) = (&mut *cx.config, &*cx.tensors, cx.path, cx.meta);
    let arch = "falcon-h1";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    if !tensors.contains_key("lm_head.weight") {
        return Err(gguf_err(
            path,
            "no `output.weight`: a tied Falcon-H1 head needs `lm_head_multiplier` and \
             `embedding_multiplier`, which the file does not keep",
        ));
    }
    let (heads, head_dim) = cx.k.ssm_heads()?;
    config["head_dim"] = Value::from(need("attention.key_length")?);
    config["mamba_d_ssm"] = Value::from(heads * head_dim);
    config["mamba_n_heads"] = Value::from(heads);
    config["mamba_d_head"] = Value::from(head_dim);
    config["mamba_d_state"] = Value::from(need("ssm.state_size")?);
    config["mamba_n_groups"] = Value::from(need("ssm.group_count")?);
    config["mamba_d_conv"] = Value::from(need("ssm.conv_kernel")?);
    let has = |t: &str| tensors.keys().any(|k| k.ends_with(t));
    config["mamba_rms_norm"] = Value::from(has(".mamba.norm.weight"));
    // llama.cpp gates before the norm.
    config["mamba_norm_before_gate"] = Value::from(false);
    config["mamba_conv_bias"] = Value::from(has(".mamba.conv1d.bias"));
    config["mamba_proj_bias"] = Value::from(has(".mamba.in_proj.bias"));
    config["projectors_bias"] = Value::from(has(".mamba.out_proj.bias"));
    config["attention_bias"] = Value::from(has(".self_attn.q_proj.bias"));
    config["mlp_bias"] = Value::from(has(".feed_forward.up_proj.bias"));
    for m in [
        "attention_in_multiplier",
        "attention_out_multiplier",
        "embedding_multiplier",
        "key_multiplier",
        "lm_head_multiplier",
        "ssm_in_multiplier",
        "ssm_out_multiplier",
    ] {
        config[m] = Value::from(1.0);
    }
    config["mlp_multipliers"] = json!([1.0, 1.0]);
    config["ssm_multipliers"] = json!([1.0, 1.0, 1.0, 1.0, 1.0]);
    require_context(config, path, &key("context_length"))
}

/// Jamba (`JambaModel`'s keys) as mlx-lm's `jamba`: the layer kinds from the per-layer
/// `head_count_kv` (mlx-lm's `layers_block_type`; it needs both kinds), the Mamba sizes
/// (`mamba_expand` = inner / width), and the expert layers from the tensors (no key places
/// them): mlx-lm puts experts where `(layer + expert_layer_offset) % expert_layer_period == 0`,
/// so the file's must be such a set.
pub(super) fn jamba_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, kv) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.meta,
        cx.kv_per_layer,
    );
    let arch = "jamba";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let blocks = config["num_hidden_layers"].as_i64().unwrap_or(0);
    let n = blocks as usize;
    let kv = match kv {
        Some(k) if k.len() == n && k.contains(&0) && k.iter().any(|&h| h > 0) => k,
        _ => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` must list a head count for each of the {blocks} layers, 0 on \
                     the Mamba layers; mlx-lm's jamba needs both kinds",
                    key("attention.head_count_kv")
                ),
            ))
        }
    };
    let types: Vec<&str> = kv
        .iter()
        .map(|&h| if h > 0 { "attention" } else { "mamba" })
        .collect();
    let attn: Vec<i64> = (0..blocks).filter(|&i| kv[i as usize] > 0).collect();
    config["layers_block_type"] = json!(types);
    config["attn_layer_offset"] = Value::from(attn[0]);
    config["attn_layer_period"] = Value::from(attn.get(1).map_or(blocks, |b| b - attn[0]));
    let moe: Vec<i64> = (0..blocks)
        .filter(|i| tensors.contains_key(&format!("model.layers.{i}.feed_forward.router.weight")))
        .collect();
    let (offset, period) = match moe.as_slice() {
        [] => (1, blocks + 1),
        [first, rest @ ..] => {
            let p = rest.first().map_or(blocks + 1, |s| s - first);
            ((p - first % p) % p, p)
        }
    };
    if (0..blocks).any(|i| ((i + offset) % period == 0) != moe.contains(&i)) {
        return Err(ModelError::Weights(vec![format!(
            "GGUF jamba: the layers with experts ({moe:?}) are not every n-th layer from one \
             offset, the only placement mlx-lm's jamba has"
        )]));
    }
    config["expert_layer_offset"] = Value::from(offset);
    config["expert_layer_period"] = Value::from(period);
    cx.k.experts(config, &["num_experts", "num_experts_per_tok"])?;
    let (inner, hidden) = (need("ssm.inner_size")?, need("embedding_length")?);
    if inner % hidden != 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {inner} is not a multiple of `{}` = {hidden} (mlx-lm's \
                 `mamba_expand`)",
                key("ssm.inner_size"),
                key("embedding_length")
            ),
        ));
    }
    config["mamba_expand"] = Value::from(inner / hidden);
    config["mamba_d_state"] = Value::from(need("ssm.state_size")?);
    config["mamba_d_conv"] = Value::from(need("ssm.conv_kernel")?);
    config["mamba_dt_rank"] = Value::from(need("ssm.time_step_rank")?);
    let has = |t: &str| tensors.keys().any(|k| k.ends_with(t));
    config["mamba_proj_bias"] = Value::from(has(".mamba.in_proj.bias"));
    config["mamba_conv_bias"] = Value::from(has(".mamba.conv1d.bias"));
    require_context(config, path, &key("context_length"))
}

/// PLaMo 2 (`Plamo2Model`'s keys) as mlx-lm's `plamo2`: `mamba_step` from the per-layer
/// `head_count_kv` (mlx-lm places attention where `i % step == step / 2`, or on the last layer
/// alone when `step / 2` reaches the depth: the file's layers must be such a set), the head
/// size (`key_length`), the Mamba sizes (inner = Mamba heads * head size); each RMSNorm's
/// offset, which the converter added, subtracted in the tensor's dtype (mlx-lm adds it back
/// at run time); `ssm_dt.bias` as the bare `dt_bias`. mlx-lm's attention rotates with base
/// 10000 whatever the file says, as it does for the checkpoint.
pub(super) fn plamo2_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, kv) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.kv_per_layer,
    );
    let arch = "plamo2";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let blocks = config["num_hidden_layers"].as_i64().unwrap_or(0);
    let attn: Vec<bool> = match kv {
        Some(k) if k.len() == blocks as usize => k.iter().map(|&h| h > 0).collect(),
        _ => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` must list a head count for each of the {blocks} layers (0 on \
                     the Mamba layers)",
                    key("attention.head_count_kv")
                ),
            ))
        }
    };
    let is_mamba = |step: i64, i: i64| {
        if blocks <= step / 2 {
            i != blocks - 1
        } else {
            i % step != step / 2
        }
    };
    let step = (1..=2 * blocks + 2)
        .find(|&s| (0..blocks).all(|i| is_mamba(s, i) != attn[i as usize]))
        .ok_or_else(|| {
            gguf_err(
                path,
                format!(
                    "metadata `{}`: the attention layers are not every `mamba_step`-th, the only \
                     placement mlx-lm's plamo2 has",
                    key("attention.head_count_kv")
                ),
            )
        })?;
    let (heads, inner, hd) = (
        need("ssm.time_step_rank")?,
        need("ssm.inner_size")?,
        need("attention.key_length")?,
    );
    if i64::from(heads) * i64::from(hd) != i64::from(inner) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {inner} is not `{}` = {heads} times `{}` = {hd}, as mlx-lm's \
                 plamo2 sizes the Mamba layers",
                key("ssm.inner_size"),
                key("ssm.time_step_rank"),
                key("attention.key_length")
            ),
        ));
    }
    config["mamba_step"] = Value::from(step);
    config["mamba_enabled"] = Value::from(true);
    config["mamba_num_heads"] = Value::from(heads);
    config["hidden_size_per_head"] = Value::from(hd);
    config["mamba_d_state"] = Value::from(need("ssm.state_size")?);
    config["mamba_d_conv"] = Value::from(need("ssm.conv_kernel")?);
    for l in 0..blocks {
        let p = format!("model.layers.layers.{l}");
        if let Some(b) = tensors.remove(&format!("{p}.mixer.dt_proj.bias")) {
            tensors.insert(format!("{p}.mixer.dt_bias"), b);
        }
    }
    let offsets = [
        ("pre_mixer_norm", 1.0),
        ("post_mixer_norm", 1.0 / 5.0),
        ("pre_mlp_norm", 1.0),
        ("post_mlp_norm", 1.0 / 5f64.powf(1.5)),
    ];
    let names: Vec<(String, f64)> = tensors
        .keys()
        .filter_map(|k| {
            if k == "model.norm.weight" {
                return Some((k.clone(), 1.0));
            }
            let module = k.strip_suffix(".weight")?.rsplit('.').next()?;
            offsets
                .iter()
                .find(|(m, _)| *m == module)
                .map(|(_, o)| (k.clone(), *o))
        })
        .collect();
    for (k, o) in names {
        if let Some(w) = tensors.remove(&k) {
            let off = Scalar::from(o).to_array_like(w.dtype())?;
            tensors.insert(k, ops::subtract(&w, &off, None)?);
        }
    }
    Ok(())
}

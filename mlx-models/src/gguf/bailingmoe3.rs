//! Ling 3.0 as llama.cpp's `BailingMoeV3Model` writes it (`bailingmoe3`), for mlx-lm's
//! `bailing_moe_v3`: KDA layers between MLA layers, grouped sigmoid routing with an expert
//! bias, shared experts after dense first blocks, the MTP layer after the main ones (skipped).

use mlx_core::io::GgufValue;
use mlx_core::prelude::*;
use serde_json::json;

use super::{gguf_err, layer_list, meta_bool, meta_count, meta_f64, meta_str, Cx};
use crate::error::Result;

/// mlx-lm's `_is_kda_layer`.
fn is_kda(layer: i32, group: i32, blocks: i32) -> bool {
    !((layer + 1) % group == 0 || layer >= blocks / group * group)
}

/// The hyper-parameters mlx-lm's `bailing_moe_v3` reads, from the keys BailingMoeV3Model
/// writes: `layer_group_size` as the one that gives the per-layer KV heads' pattern (1 on MLA
/// layers, 0 on KDA ones), the KDA head size, convolution, safe gate and lower bound, the MLA
/// ranks and head sizes, the experts, groups, routed scale, the shared experts' width per
/// expert from their tensors. Then the tensors: `o_proj` on KDA layers (the file's
/// `attn_output` is MLA's `dense` elsewhere), `dt_bias`, the convolutions as (channels,
/// kernel, 1). Refused by key: unsafe gates, another router, unnormalized top-k weights
/// (mlx-lm always renormalizes), SwiGLU clamps, rope scaling, M-RoPE sections (the VL text
/// tower, which mlx-lm 0.32.2 has no type for).
pub(super) fn config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks, keys) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
        cx.k,
    );
    let key = |k: &str| keys.key(k);
    let need = |k: &str| keys.count(k);
    let refuse = |k: &str, why: &str| Err(gguf_err(path, format!("metadata `{}` {why}", key(k))));
    let kv = layer_list(meta, path, &key("attention.head_count_kv"), blocks as usize)?.ok_or_else(
        || {
            gguf_err(
                path,
                format!(
                    "metadata `{}` must list the KV heads per layer (0 on KDA layers)",
                    key("attention.head_count_kv")
                ),
            )
        },
    )?;
    let group = (1..=blocks)
        .find(|&g| (0..blocks).all(|l| is_kda(l, g, blocks) == (kv[l as usize] == 0.0)))
        .ok_or_else(|| {
            gguf_err(
                path,
                format!(
                    "metadata `{}` is {kv:?}: no `layer_group_size` of mlx-lm's bailing_moe_v3 \
                     (MLA on every group's last layer and the remainder) gives these layers",
                    key("attention.head_count_kv")
                ),
            )
        })?;
    if meta_bool(meta, path, &key("kda.safe_gate"))? == Some(false) {
        return refuse(
            "kda.safe_gate",
            "is false; mlx-lm's bailing_moe_v3 has only the safe gate",
        );
    }
    let bound = meta_f64(meta, &key("kda.gate_lower_bound")).ok_or_else(|| {
        gguf_err(
            path,
            format!("metadata `{}` is missing", key("kda.gate_lower_bound")),
        )
    })?;
    if !(bound.is_finite() && bound < 0.0) {
        return refuse(
            "kda.gate_lower_bound",
            &format!("is {bound}; it must be a finite number < 0"),
        );
    }
    keys.router("bailing_moe_v3", &[(2, "sigmoid")])?
        .ok_or_else(|| keys.missing("expert_gating_func"))?;
    if meta_bool(meta, path, &key("expert_weights_norm"))? != Some(true) {
        return refuse(
            "expert_weights_norm",
            "is false or missing; mlx-lm's bailing_moe_v3 always renormalizes the top-k weights",
        );
    }
    let scale = keys
        .float("expert_weights_scale", false)?
        .ok_or_else(|| keys.missing("expert_weights_scale"))?;
    for k in ["swiglu_clamp_exp", "swiglu_clamp_shexp"] {
        let clamps = match meta.get(&key(k)) {
            Some(GgufValue::Array(a)) => a
                .astype(Dtype::Float64)
                .and_then(|b| b.reshape(&[-1]))
                .and_then(|b| b.to_vec::<f64>())
                .map_err(|e| gguf_err(path, format!("metadata `{}`: {e}", key(k))))?,
            Some(_) => vec![f64::NAN],
            None => vec![],
        };
        if clamps.iter().any(|&c| c != 0.0) {
            return refuse(
                k,
                "clamps the SwiGLU, which mlx-lm's bailing_moe_v3 does not",
            );
        }
    }
    if meta_str(meta, &key("rope.scaling.type")).is_some_and(|t| t != "none") {
        return refuse(
            "rope.scaling.type",
            "is set: rope scaling is not mapped for bailingmoe3",
        );
    }
    if meta.contains_key(&key("rope.dimension_sections")) {
        return refuse(
            "rope.dimension_sections",
            "is set: M-RoPE of the VL model's text tower, which mlx-lm 0.32.2 has no type for",
        );
    }
    let rope = need("rope.dimension_count")?;
    let k_mla = need("attention.key_length_mla")?;
    if k_mla <= rope {
        return refuse(
            "attention.key_length_mla",
            &format!("= {k_mla} leaves no room beside the rope width {rope}"),
        );
    }
    let q_lora = meta_count(meta, path, &key("attention.q_lora_rank"))?;
    let (groups, groups_used) = keys.grouped()?;
    // mlx-lm's shared experts are `moe_shared_expert_intermediate_size` * their count wide;
    // llama.cpp runs the `ffn_*_shexp` tensors as stored (at least one expert).
    let shared = need("expert_shared_count")?.max(1);
    let width = tensors
        .iter()
        .find(|(k, _)| k.ends_with(".mlp.shared_experts.up_proj.weight"))
        .map(|(_, a)| a.shape()[0]);
    let per_shared = match width {
        Some(w) if w % shared == 0 => w / shared,
        None => need("expert_feed_forward_length")?,
        Some(w) => {
            return refuse(
                "expert_shared_count",
                &format!(
                    "= {shared} does not divide the shared experts' width {w} (`ffn_up_shexp`)"
                ),
            )
        }
    };
    let o = json!({
        "layer_group_size": group,
        "head_dim": need("kda.head_dim")?,
        "short_conv_kernel_size": need("ssm.conv_kernel")?,
        "kda_lower_bound": bound,
        "kda_safe_gate": true,
        "no_kda_lora": true,
        "q_lora_rank": q_lora,
        "kv_lora_rank": need("attention.kv_lora_rank")?,
        "qk_rope_head_dim": rope,
        "qk_nope_head_dim": k_mla - rope,
        "v_head_dim": need("attention.value_length_mla")?,
        "num_shared_experts": shared,
        "moe_shared_expert_intermediate_size": per_shared,
        "first_k_dense_replace": need("leading_dense_block_count")?,
        "n_group": groups,
        "topk_group": groups_used,
        "routed_scaling_factor": scale,
        "rope_interleave": true,
    });
    keys.experts(
        config,
        &[
            "num_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
        ],
    )?;
    if let (Some(c), Some(o)) = (config.as_object_mut(), o.as_object()) {
        c.extend(o.clone());
    }
    // The tensors' names and shapes as mlx-lm's.
    for (k, v) in std::mem::take(tensors) {
        let layer = k
            .strip_prefix("model.layers.")
            .and_then(|r| r.split('.').next())
            .and_then(|l| l.parse::<i32>().ok());
        let kda = layer.is_some_and(|l| is_kda(l, group, blocks));
        // Any suffix: MLX's reader gives a Q4_0 / Q4_1 / Q8_0 tensor as weight, scales, biases.
        let (k, v) = if kda && k.contains(".attention.dense.") {
            (k.replace(".attention.dense.", ".attention.o_proj."), v)
        } else if k.ends_with(".attention.dt_proj.bias") {
            (
                k.replace(".attention.dt_proj.bias", ".attention.dt_bias"),
                v,
            )
        } else if k.ends_with("_conv1d.weight") {
            // Written (1, channels, 1, kernel): mlx-lm's Conv1d weight is (channels, kernel, 1).
            let sh = v.shape();
            match sh.as_slice() {
                [1, c, 1, n] | [c, 1, n] | [c, n] => {
                    let v = v.reshape(&[*c, *n, 1])?;
                    (k, v)
                }
                _ => {
                    return Err(gguf_err(
                        path,
                        format!("tensor {k}: shape {sh:?} is not a short convolution"),
                    ))
                }
            }
        } else {
            (k, v)
        };
        tensors.insert(k, v);
    }
    super::require_context(config, path, &key("context_length"))
}

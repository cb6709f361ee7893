//! Kimi K3 as llama.cpp's `KimiK3Model` writes it (`kimi-k3`), for mlx-lm's `kimi_k3` (its text
//! model under `language_model.`): KDA layers with a full-rank gate between NoPE MLA layers
//! with an output gate, cross-layer attention residuals, a latent MoE, SiTU activations.

use std::collections::BTreeMap;

use mlx_core::prelude::*;
use serde_json::{json, Value};

use super::{gguf_err, layer_list, meta_bool, meta_count, meta_f64, Cx};
use crate::error::Result;

/// The layer of a `model.layers.N.` name.
fn layer_of(k: &str) -> Option<usize> {
    k.strip_prefix("model.layers.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// mlx-lm's `TextArgs` from the keys KimiK3Model writes: KDA layers where `head_count_kv` is
/// 0 (1-indexed `kda_layers` / `full_attn_layers`), their heads, size, convolution, gate lower
/// bound and full-rank gate; the MLA's LoRA ranks and head sizes, its output gate from the
/// `attn_gate` tensors; the experts (sigmoid routing, groups, renormalization as the file
/// says, the routed scale), the shared experts (mlx-lm's width is the experts' times their
/// count: the tensors must agree), the latent width and its norm from the tensors; the SiTU
/// betas (a linear beta of 0 is none, as llama.cpp reads it); the attention-residual block
/// size (0: none). Then the tensors: each fused residual score as the norm's weight with a
/// projection of ones (mlx-lm only uses their product, which the converter stored), the KDA
/// q / k / v projections and convolutions joined into `qkv_proj` / `qkv_conv`. Refused by key:
/// another router, a SiTU beta that is not positive, absent routed scale.
pub(super) fn config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks, heads, keys) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
        cx.heads,
        cx.k,
    );
    let ggml_keys: Vec<&String> = cx.ggml.keys().collect();
    let key = |k: &str| keys.key(k);
    let need = |k: &str| keys.count(k);
    let refuse = |k: &str, why: &str| Err(gguf_err(path, format!("metadata `{}` {why}", key(k))));
    let n = blocks as usize;
    let kv = layer_list(meta, path, &key("attention.head_count_kv"), n)?.ok_or_else(|| {
        gguf_err(
            path,
            format!(
                "metadata `{}` must list the KV heads per layer (0 on KDA layers)",
                key("attention.head_count_kv")
            ),
        )
    })?;
    let is_kda = |l: usize| kv.get(l) == Some(&0.0);
    let kda: Vec<usize> = (0..n).filter(|&l| is_kda(l)).map(|l| l + 1).collect();
    let full: Vec<usize> = (0..n).filter(|&l| !is_kda(l)).map(|l| l + 1).collect();
    keys.router("kimi_k3", &[(2, "sigmoid")])?
        .ok_or_else(|| keys.missing("expert_gating_func"))?;
    let scale = keys
        .float("expert_weights_scale", false)?
        .ok_or_else(|| keys.missing("expert_weights_scale"))?;
    let f = |k: &str| -> Result<f64> {
        let v = meta_f64(meta, &key(k))
            .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", key(k))))?;
        if v.is_finite() {
            Ok(v)
        } else {
            Err(gguf_err(path, format!("metadata `{}` is {v}", key(k))))
        }
    };
    let beta = f("activation.situ_beta")?;
    if beta <= 0.0 {
        return refuse(
            "activation.situ_beta",
            &format!("is {beta}; it must be > 0"),
        );
    }
    let linear_beta = f("activation.situ_linear_beta")?;
    // 0: no attention residuals (not a count `need` takes).
    let res_block = match meta_f64(meta, &key("attn_res.block_size")) {
        Some(0.0) => 0,
        _ => need("attn_res.block_size")?,
    };
    let rope = need("rope.dimension_count")?;
    let k_mla = need("attention.key_length_mla")?;
    if k_mla <= rope {
        return refuse(
            "attention.key_length_mla",
            &format!("= {k_mla} leaves no room beside the rope width {rope}"),
        );
    }
    let (groups, groups_used) = keys.grouped()?;
    let moe_ffn = need("expert_feed_forward_length")?;
    let shared = meta_count(meta, path, &key("expert_shared_count"))?.unwrap_or(0);
    if let Some((k, a)) = tensors
        .iter()
        .find(|(k, _)| k.ends_with(".mlp.shared_experts.up_proj.weight"))
    {
        if i64::from(a.shape()[0]) != i64::from(moe_ffn) * i64::from(shared) {
            return Err(gguf_err(
                path,
                format!(
                    "{k}: {} rows, not `{}` * `{}` = {moe_ffn} * {shared}, the only shared width \
                     mlx-lm's kimi_k3 has",
                    a.shape()[0],
                    key("expert_feed_forward_length"),
                    key("expert_shared_count")
                ),
            ));
        }
    }
    let has = |end: &str, mla: bool| {
        tensors
            .keys()
            .any(|k| k.ends_with(end) && layer_of(k).is_some_and(|l| is_kda(l) != mla))
    };
    let mut linear = json!({
        "num_heads": heads,
        "head_dim": need("kda.head_dim")?,
        "kda_layers": kda,
        "full_attn_layers": full,
        "short_conv_kernel_size": need("ssm.conv_kernel")?,
        "use_full_rank_gate": true,
    });
    if let Some(lb) = meta_f64(meta, &key("kda.gate_lower_bound")) {
        linear["gate_lower_bound"] = Value::from(lb);
    }
    let latent = meta_count(meta, path, &key("expert_latent_length"))?;
    let o = json!({
        "num_key_value_heads": heads,
        "linear_attn_config": linear,
        "hidden_act": "situ",
        "activation_situ_beta": beta,
        "activation_situ_linear_beta": if linear_beta > 0.0 { Value::from(linear_beta) } else { Value::Null },
        "attn_res_block_size": if res_block > 0 { Value::from(res_block) } else { Value::Null },
        "q_lora_rank": meta_count(meta, path, &key("attention.q_lora_rank"))?,
        "kv_lora_rank": need("attention.kv_lora_rank")?,
        "qk_rope_head_dim": rope,
        "qk_nope_head_dim": k_mla - rope,
        "v_head_dim": need("attention.value_length_mla")?,
        "mla_use_nope": true,
        "mla_use_output_gate": has(".self_attn.g_proj.weight", true),
        "num_shared_experts": shared,
        "moe_router_activation_func": "sigmoid",
        "moe_renormalize": meta_bool(meta, path, &key("expert_weights_norm"))?.unwrap_or(false),
        "routed_scaling_factor": scale,
        "first_k_dense_replace":
            super::meta_layer_count(meta, path, &key("leading_dense_block_count"), blocks)?
                .unwrap_or(0),
        "moe_layer_freq": 1,
        "num_expert_group": groups,
        "topk_group": groups_used,
        "routed_expert_hidden_size": latent,
        "latent_moe_use_norm": has(".mlp.routed_expert_norm.weight", false)
            || has(".mlp.routed_expert_norm.weight", true),
    });
    keys.experts(
        config,
        &[
            "num_experts",
            "num_experts_per_token",
            "moe_intermediate_size",
        ],
    )?;
    if let (Some(c), Some(o)) = (config.as_object_mut(), o.as_object()) {
        c.extend(o.clone());
    }
    // KDA's q / k / v are joined below: not from GGML blocks.
    if let Some(k) = ggml_keys.iter().find(|k| {
        layer_of(k).is_some_and(is_kda)
            && [".q_proj.", ".k_proj.", ".v_proj."]
                .iter()
                .any(|p| k.contains(p))
    }) {
        return Err(gguf_err(
            path,
            format!("{k}: Kimi K3's KDA projections are joined, so they are read dequantized only"),
        ));
    }
    let mut out = BTreeMap::new();
    // (layer, `proj` or `conv`, suffix): MLX's reader gives a Q4_0 / Q4_1 / Q8_0 projection as
    // weight, scales, biases, each joined by rows.
    let mut kda_parts: BTreeMap<(usize, &str, String), [Option<Array>; 3]> = BTreeMap::new();
    for (k, v) in std::mem::take(tensors) {
        let res = [
            ("gguf_attn_res_score.weight", "self_attention_res"),
            ("gguf_ffn_res_score.weight", "mlp_res"),
            ("model.gguf_output_res_score.weight", "output_attn_res"),
        ]
        .into_iter()
        .find(|(end, _)| k.ends_with(end));
        if let Some((end, src)) = res {
            let base = &k[..k.len() - end.len()];
            let base = if base.is_empty() { "model." } else { base };
            let h = v.shape()[0];
            let ones = ops::ones(&[1, h], v.dtype(), None)?;
            out.insert(format!("{base}{src}_proj.weight"), ones);
            out.insert(format!("{base}{src}_norm.weight"), v);
            continue;
        }
        let part = layer_of(&k).filter(|&l| is_kda(l)).and_then(|l| {
            let (module, suffix) = k.rsplit_once('.')?;
            [
                ("q_proj", "proj", 0),
                ("k_proj", "proj", 1),
                ("v_proj", "proj", 2),
                ("gguf_conv_q", "conv", 0),
                ("gguf_conv_k", "conv", 1),
                ("gguf_conv_v", "conv", 2),
            ]
            .into_iter()
            .find(|(m, _, _)| module.ends_with(&format!(".self_attn.{m}")))
            .map(|(_, kind, i)| (l, kind, suffix.to_string(), i))
        });
        match part {
            Some((l, kind, suffix, i)) => {
                let v = if kind == "conv" {
                    // Written (1, channels, 1, kernel): mlx-lm's Conv1d weight is (channels,
                    // kernel, 1).
                    let sh = v.shape();
                    match sh.as_slice() {
                        [1, c, 1, w] | [c, 1, w] | [c, w] => v.reshape(&[*c, *w, 1])?,
                        _ => {
                            return Err(gguf_err(
                                path,
                                format!("tensor {k}: shape {sh:?} is not a short convolution"),
                            ))
                        }
                    }
                } else {
                    v
                };
                kda_parts.entry((l, kind, suffix)).or_default()[i] = Some(v);
            }
            None => {
                out.insert(k, v);
            }
        }
    }
    for ((l, kind, suffix), parts) in kda_parts {
        let [Some(q), Some(k), Some(v)] = parts else {
            return Err(gguf_err(
                path,
                format!(
                    "layer {l}: a KDA {kind} `{suffix}` of q / k / v is missing \
                     (`blk.{l}.attn_q/k/v` or `ssm_conv1d_q/k/v`)"
                ),
            ));
        };
        let joined = ops::concatenate(&[&q, &k, &v], 0, None)?;
        let name = if kind == "proj" {
            format!("model.layers.{l}.self_attn.qkv_proj.{suffix}")
        } else {
            format!("model.layers.{l}.self_attn.qkv_conv.conv.{suffix}")
        };
        out.insert(name, joined);
    }
    *tensors = out;
    super::require_context(config, path, &key("context_length"))
}

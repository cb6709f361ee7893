//! MiniMax M3's text tower as llama.cpp's `MiniMaxM3Model` writes it (`minimax-m3`), for
//! mlx-lm's `minimax_m3_vl`: MiniMax M2's attention with per-head Q / K norms and a partial
//! rope, dense first blocks, sigmoid-routed experts with a correction bias and a shared expert
//! (SwiGLU-OAI everywhere), the MSA block indexer on the MoE layers; every norm stored `1 + w`.

use serde_json::json;

use super::{gguf_err, meta_bool, meta_count, meta_str, Cx};
use crate::error::Result;

/// mlx-lm's `TextArgs` from the keys MiniMaxM3Model writes: the MoE (and indexed) layers from
/// `leading_dense_block_count` on (llama.cpp runs the indexer exactly there), the dense and
/// expert widths, the shared expert's width from its tensors, the routed scale, the rotated
/// width, the indexer's heads, key size, top-k blocks, block size and local blocks, mlx-lm's
/// Gemma norms (every `*_norm` tensor, the indexer's too, is `w` again through the row's
/// `norm_plus_one`) and SwiGLU-OAI constants (llama.cpp's are the same fixed 1.702 / 7.0; the file has
/// none). Refused by key: another router, unnormalized top-k weights, expert groups, rope
/// scaling.
pub(super) fn config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks, keys) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
        cx.k,
    );
    let key = |k: &str| keys.key(k);
    let need = |k: &str| keys.count(k);
    let refuse = |k: &str, why: &str| Err(gguf_err(path, format!("metadata `{}` {why}", key(k))));
    keys.router("minimax_m3_vl", &[(2, "sigmoid")])?
        .ok_or_else(|| keys.missing("expert_gating_func"))?;
    if meta_bool(meta, path, &key("expert_weights_norm"))? != Some(true) {
        return refuse(
            "expert_weights_norm",
            "is false or missing; mlx-lm's minimax_m3_vl always renormalizes the top-k weights",
        );
    }
    if meta_count(meta, path, &key("expert_group_count"))?.is_some_and(|g| g > 1) {
        return refuse(
            "expert_group_count",
            "is more than 1: mlx-lm's minimax_m3_vl routes without groups",
        );
    }
    let scale = keys
        .float("expert_weights_scale", false)?
        .ok_or_else(|| keys.missing("expert_weights_scale"))?;
    if meta_str(meta, &key("rope.scaling.type")).is_some_and(|t| t != "none") {
        return refuse(
            "rope.scaling.type",
            "is set: rope scaling is not mapped for minimax-m3",
        );
    }
    let dense = super::meta_layer_count(meta, path, &key("leading_dense_block_count"), blocks)?
        .unwrap_or(0);
    let freq: Vec<i32> = (0..blocks).map(|l| i32::from(l >= dense)).collect();
    let dense_ffn = config["intermediate_size"].clone();
    keys.experts(
        config,
        &[
            "num_local_experts",
            "num_experts_per_tok",
            "intermediate_size",
        ],
    )?;
    let expert_ffn = need("expert_feed_forward_length")?;
    let shared = need("expert_shared_count")?;
    let width = match tensors
        .iter()
        .find(|(k, _)| k.ends_with(".block_sparse_moe.shared_experts.up_proj.weight"))
    {
        Some((_, a)) => a.shape()[0],
        // The shared expert's width as the keys give it, which must fit a 32-bit width.
        None => expert_ffn.checked_mul(shared).ok_or_else(|| {
            gguf_err(
                path,
                format!(
                    "metadata `{}` * `{}` = {expert_ffn} * {shared} does not fit a 32-bit width",
                    key("expert_feed_forward_length"),
                    key("expert_shared_count")
                ),
            )
        })?,
    };
    let o = json!({
        "dense_intermediate_size": dense_ffn,
        "shared_intermediate_size": width,
        "routed_scaling_factor": scale,
        "rotary_dim": need("rope.dimension_count")?,
        "use_qk_norm": true,
        "use_gemma_norm": true,
        "swiglu_alpha": 1.702,
        "swiglu_limit": 7.0,
        "moe_layer_freq": freq,
        "sparse_attention_freq": freq,
        "index_n_heads": need("attention.indexer.head_count")?,
        "index_head_dim": need("attention.indexer.key_length")?,
        "index_topk_blocks": need("attention.indexer.top_k")?,
        "index_block_size": need("attention.indexer.block_size")?,
        "index_local_blocks": need("attention.indexer.local_blocks")?,
    });
    if let (Some(c), Some(o)) = (config.as_object_mut(), o.as_object()) {
        c.extend(o.clone());
    }
    super::require_context(config, path, &key("context_length"))
}

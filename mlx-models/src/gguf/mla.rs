//! Multi-head latent attention (DeepSeek V2/V3, Mistral 4, DeepSeek 3.2 / GLM-DSA's indexer,
//! MiniCPM3): the latent ranks and rope split, and `attn_kv_b` rebuilt from llama.cpp's split
//! `attn_k_b` / `attn_v_b`.

use std::collections::BTreeMap;

use mlx_core::io::GgufValue;
use mlx_core::prelude::*;
use serde_json::{json, Value};

use super::rope::long_rope;
use super::{gguf_err, meta_count, meta_f64, meta_str, need_count, require_context, Cx};
use crate::error::{ModelError, Result};

/// llama.cpp's `deepseek2` hyper-parameters as mlx-lm's `deepseek_v2` (softmax router) or
/// `deepseek_v3` (sigmoid router with its correction bias) arguments, as
/// `convert_hf_to_gguf.py`'s `DeepseekV2Model` wrote them: MLA written as MQA
/// (`head_count_kv` = 1: the heads are `head_count`), the head sizes from `key_length_mla` /
/// `value_length_mla` (files converted before those keys: `key_length` / `value_length`),
/// YaRN's `mscale_all_dim` from `yarn_log_multiplier` (= 0.1 * mscale_all_dim). For
/// deepseek_v2, split `attn_k_b` / `attn_v_b` tensors are joined back into `kv_b_proj`.
pub(super) fn deepseek2_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, heads, arch) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.heads,
        cx.arch,
    );
    let mistral4 = arch == "mistral4";
    let key = |k: &str| format!("{arch}.{k}");
    let opt = |k: &str| meta_count(meta, path, &key(k));
    let need = |k: &str| -> Result<i32> {
        opt(k)?.ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", key(k))))
    };
    let num = |k: &str| -> Result<Option<f64>> {
        match meta_f64(meta, &key(k)) {
            Some(v) if v.is_finite() => Ok(Some(v)),
            Some(v) => Err(gguf_err(path, format!("metadata `{}` is {v}", key(k)))),
            None if meta.contains_key(&key(k)) => Err(gguf_err(
                path,
                format!("metadata `{}` is not a number", key(k)),
            )),
            None => Ok(None),
        }
    };
    let rope = need("rope.dimension_count")?;
    let (qk, v) = match (
        opt("attention.key_length_mla")?,
        opt("attention.value_length_mla")?,
    ) {
        (Some(k), Some(v)) => (k, v),
        (None, None) => (
            need("attention.key_length")?,
            need("attention.value_length")?,
        ),
        _ => {
            return Err(gguf_err(
                path,
                "metadata: `deepseek2.attention.key_length_mla` and `value_length_mla` come \
                 together",
            ))
        }
    };
    if qk <= rope {
        return Err(gguf_err(
            path,
            format!(
                "metadata: the query/key head size {qk} is not larger than \
                 `deepseek2.rope.dimension_count` = {rope}"
            ),
        ));
    }
    let nope = qk - rope;
    let kv_lora = need("attention.kv_lora_rank")?;
    // `expert_gating_func`: 1 softmax, 2 sigmoid; files without it are DeepSeek V2's
    // (llama.cpp reads them with softmax).
    let gating = opt("expert_gating_func")?;
    let v3 = match gating {
        None | Some(1) => false,
        Some(2) if !mistral4 => true,
        Some(g) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {g}; mlx-lm's {} routes with {}",
                    key("expert_gating_func"),
                    if mistral4 {
                        "mistral4"
                    } else {
                        "deepseek_v2 / v3"
                    },
                    if mistral4 {
                        "softmax (1)"
                    } else {
                        "softmax (1) or sigmoid (2)"
                    }
                ),
            ))
        }
    };
    let c = config
        .as_object_mut()
        .ok_or_else(|| gguf_err(path, "internal: the config is not a map"))?;
    c.remove("head_dim");
    let model_type = match (mistral4, v3) {
        (true, _) => "mistral4",
        (false, true) => "deepseek_v3",
        (false, false) => "deepseek_v2",
    };
    c.insert("model_type".into(), Value::from(model_type));
    c.insert("num_key_value_heads".into(), Value::from(heads));
    c.insert(
        "q_lora_rank".into(),
        opt("attention.q_lora_rank")?.map_or(Value::Null, Value::from),
    );
    c.insert("kv_lora_rank".into(), Value::from(kv_lora));
    c.insert("qk_rope_head_dim".into(), Value::from(rope));
    c.insert("qk_nope_head_dim".into(), Value::from(nope));
    c.insert("v_head_dim".into(), Value::from(v));
    c.insert(
        "first_k_dense_replace".into(),
        Value::from(opt("leading_dense_block_count")?.unwrap_or(0)),
    );
    c.insert("moe_layer_freq".into(), Value::from(1));
    c.insert(
        "attention_bias".into(),
        Value::from(tensors.contains_key("model.layers.0.self_attn.q_a_proj.bias")),
    );
    if let Some(n) = opt("expert_count")? {
        c.insert("n_routed_experts".into(), Value::from(n));
        c.insert(
            "num_experts_per_tok".into(),
            Value::from(need("expert_used_count")?),
        );
        c.insert(
            "moe_intermediate_size".into(),
            Value::from(need("expert_feed_forward_length")?),
        );
        c.insert(
            "n_shared_experts".into(),
            Value::from(opt("expert_shared_count")?.unwrap_or(0)),
        );
        c.insert(
            "routed_scaling_factor".into(),
            Value::from(num("expert_weights_scale")?.unwrap_or(1.0)),
        );
        let groups = opt("expert_group_count")?.unwrap_or(1);
        let used = opt("expert_group_used_count")?.unwrap_or(1);
        c.insert("n_group".into(), Value::from(groups));
        c.insert("topk_group".into(), Value::from(used));
        let norm = match meta.get(&key("expert_weights_norm")) {
            None => false,
            Some(GgufValue::Array(a)) if a.size() == 1 => a
                .astype(Dtype::Bool)
                .ok()
                .and_then(|b| b.item::<bool>().ok())
                .unwrap_or(false),
            Some(_) => {
                return Err(gguf_err(
                    path,
                    format!("metadata `{}` is not a boolean", key("expert_weights_norm")),
                ))
            }
        };
        c.insert("norm_topk_prob".into(), Value::from(norm));
        if mistral4 {
            // mistral4.py's router: softmax, group-limited when n_group > 1.
        } else if v3 {
            c.insert("topk_method".into(), Value::from("noaux_tc"));
            c.insert("scoring_func".into(), Value::from("sigmoid"));
        } else {
            let method = if groups > 1 {
                "group_limited_greedy"
            } else {
                "greedy"
            };
            c.insert("topk_method".into(), Value::from(method));
        }
    }
    // YaRN: mlx-lm's deepseek_v2 needs a `rope_scaling` (a factor of 1 when the file has none).
    let scaling = match meta_str(meta, &key("rope.scaling.type")) {
        Some("yarn") => {
            let factor = num("rope.scaling.factor")?.ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `{}` is missing", key("rope.scaling.factor")),
                )
            })?;
            let orig = need("rope.scaling.original_context_length")?;
            // Stored as 0.1 * mscale_all_dim in f32; configs write a few decimals.
            let m = num("rope.scaling.yarn_log_multiplier")?
                .map(|x| x / 0.1)
                .map(|x| format!("{x:.6e}").parse::<f64>().unwrap_or(x));
            let mut rs = json!({
                "type": "yarn",
                "factor": factor,
                "original_max_position_embeddings": orig,
                "beta_fast": num("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
                "beta_slow": num("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
            });
            if let Some(m) = m {
                rs["mscale"] = Value::from(m);
                rs["mscale_all_dim"] = Value::from(m);
            }
            Some(rs)
        }
        None | Some("none") => None,
        Some(t) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is `{t}`; only yarn is mapped",
                    key("rope.scaling.type")
                ),
            ))
        }
    };
    if mistral4 {
        // mistral4.py reads `rope_parameters` (YaRN plus Llama 4's query scale, whose beta
        // the HF converter does not write: llama.cpp then scales by 1, as beta 0 does).
        let Some(mut rp) = scaling else {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is not yarn; Mistral 4 needs it",
                    key("rope.scaling.type")
                ),
            ));
        };
        if rp.get("mscale_all_dim").is_none() {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is missing",
                    key("rope.scaling.yarn_log_multiplier")
                ),
            ));
        }
        rp["rope_type"] = Value::from("yarn");
        rp["rope_theta"] = c.get("rope_theta").cloned().unwrap_or(Value::from(10000.0));
        rp["llama_4_scaling_beta"] =
            Value::from(num("attention.temperature_scale")?.unwrap_or(0.0));
        c.insert("rope_parameters".into(), rp);
        return Ok(());
    }
    match scaling {
        Some(rs) => {
            c.insert("rope_scaling".into(), rs);
        }
        None if !v3 => {
            let ctx = c
                .get("max_position_embeddings")
                .cloned()
                .unwrap_or(Value::from(2048));
            c.insert(
                "rope_scaling".into(),
                json!({"type": "yarn", "factor": 1.0, "original_max_position_embeddings": ctx}),
            );
        }
        None => {}
    }
    if !v3 {
        join_kv_b(tensors, heads, nope, v)?;
    }
    Ok(())
}

/// deepseek_v2 reads `kv_b_proj` `(heads * (nope + v), kv_lora_rank)`: llama.cpp's
/// `attn_k_b` `(heads, kv_lora_rank, nope)` transposed back and `attn_v_b`
/// `(heads, v, kv_lora_rank)`, joined per head (quantized halves are dequantized first).
pub(super) fn join_kv_b(
    tensors: &mut BTreeMap<String, Array>,
    heads: i32,
    nope: i32,
    v: i32,
) -> Result<()> {
    let prefixes: Vec<String> = tensors
        .keys()
        .filter_map(|k| k.strip_suffix(".embed_q.weight").map(str::to_string))
        .collect();
    for p in prefixes {
        let mut take = |part: &str| -> Result<Array> {
            let w = tensors
                .remove(&format!("{p}.{part}.weight"))
                .ok_or_else(|| {
                    ModelError::Weights(vec![format!(
                        "{p}.{part}: missing (attn_k_b without attn_v_b)"
                    )])
                })?;
            let scales = tensors.remove(&format!("{p}.{part}.scales"));
            let biases = tensors.remove(&format!("{p}.{part}.biases"));
            match (scales, biases) {
                (None, None) => Ok(w),
                (Some(s), b) => {
                    // MLX's GGUF reader: groups of 32 along the last axis.
                    let cols = s.shape().last().copied().unwrap_or(0) * 32;
                    let packed = w.shape().last().copied().unwrap_or(0);
                    if cols <= 0 || (packed * 32) % cols != 0 {
                        return Err(ModelError::Weights(vec![format!(
                            "{p}.{part}: quantized shapes {:?} / {:?} do not agree",
                            w.shape(),
                            s.shape()
                        )]));
                    }
                    let bits = packed * 32 / cols;
                    Ok(mlx_core::quantized::dequantize(
                        &w,
                        &s,
                        b.as_ref(),
                        32,
                        bits,
                        mlx_core::quantized::QuantMode::Affine,
                        None,
                        None,
                    )?)
                }
                (None, Some(_)) => Err(ModelError::Weights(vec![format!(
                    "{p}.{part}: biases without scales"
                )])),
            }
        };
        let k_b = take("embed_q")?;
        let v_b = take("unembed_out")?;
        let ok = k_b.ndim() == 3
            && v_b.ndim() == 3
            && k_b.shape()[0] == heads
            && v_b.shape()[0] == heads
            && k_b.shape()[2] == nope
            && v_b.shape()[1] == v
            && k_b.shape()[1] == v_b.shape()[2];
        if !ok {
            return Err(ModelError::Weights(vec![format!(
                "{p}: attn_k_b {:?} / attn_v_b {:?} are not (heads, kv_lora_rank, nope) / \
                 (heads, v_head_dim, kv_lora_rank) for {heads} heads, nope {nope}, v {v}",
                k_b.shape(),
                v_b.shape()
            )]));
        }
        let rank = k_b.shape()[1];
        let k = ops::swapaxes(&k_b, 1, 2, None)?;
        let kv = ops::concatenate(&[&k, &v_b], 1, None)?;
        let kv = ops::reshape(&kv, &[heads * (nope + v), rank], None)?;
        tensors.insert(format!("{p}.kv_b_proj.weight"), kv);
    }
    Ok(())
}

/// DeepSeek V3.2 (`DeepseekV32Model`'s keys) as mlx-lm's `deepseek_v32`, and GLM-5
/// (`GlmMoeDsaModel`'s, `glm-dsa`) as its `glm_moe_dsa`, after [`deepseek2_config`]: the
/// indexer's head count, head size and top-k; GLM-5's rope as `rope_parameters`. Their MLA
/// is deepseek_v3's (a sigmoid router: `expert_gating_func` 2). A GLM-5 file whose
/// `attention.indexer.types` skips the indexer on some layers is refused: mlx-lm's has one on
/// every layer.
pub(super) fn deepseek32_config(cx: &mut Cx) -> Result<()> {
    deepseek2_config(cx)?;
    let (config, path, meta, arch) = (&mut *cx.config, cx.path, cx.meta, cx.arch);
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    if config["model_type"] != "deepseek_v3" {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is not sigmoid (2), the router of mlx-lm's {}",
                key("expert_gating_func"),
                if arch == "glm-dsa" {
                    "glm_moe_dsa"
                } else {
                    "deepseek_v32"
                }
            ),
        ));
    }
    if arch == "glm-dsa" {
        if let Some(GgufValue::Array(a)) = meta.get(&key("attention.indexer.types")) {
            let full = a
                .astype(Dtype::Bool)
                .and_then(|b| b.to_vec::<bool>())
                .map_err(|e| gguf_err(path, format!("metadata `attention.indexer.types`: {e}")))?;
            if full.contains(&false) {
                return Err(gguf_err(
                    path,
                    format!(
                        "metadata `{}` skips the indexer on some layers; mlx-lm's glm_moe_dsa \
                         has one on every layer",
                        key("attention.indexer.types")
                    ),
                ));
            }
        }
        let theta = config["rope_theta"].clone();
        let mut rp = match config.get("rope_scaling") {
            Some(rs @ Value::Object(_)) => rs.clone(),
            _ => json!({"rope_type": "default"}),
        };
        rp["rope_theta"] = theta;
        config["rope_parameters"] = rp;
        config["model_type"] = Value::from("glm_moe_dsa");
    } else {
        config["model_type"] = Value::from("deepseek_v32");
    }
    config["index_n_heads"] = Value::from(need("attention.indexer.head_count")?);
    config["index_head_dim"] = Value::from(need("attention.indexer.key_length")?);
    config["index_topk"] = Value::from(need("attention.indexer.top_k")?);
    Ok(())
}

/// MiniCPM3 (`minicpm3`): the latent ranks and the rope split of a head, llama.cpp's fixed
/// scales, the long-rope factors (a plain longrope over the context when none).
pub(super) fn minicpm3_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, rope_tensors, path, meta, arch, keys) = (
        &mut *cx.config,
        &*cx.tensors,
        &mut *cx.rope_tensors,
        cx.path,
        cx.meta,
        cx.arch,
        cx.k,
    );
    // llama.cpp fixes MiniCPM3-4B's scales (none are in the file).
    let rope = keys.count("rope.dimension_count")?;
    let qk = keys.count("attention.key_length")?;
    if qk <= rope {
        return Err(gguf_err(
            path,
            format!(
                "metadata: `{}` = {qk} is not larger than `{}` = {rope}",
                keys.key("attention.key_length"),
                keys.key("rope.dimension_count")
            ),
        ));
    }
    if let Some(c) = config.as_object_mut() {
        c.remove("head_dim");
    }
    config["qk_rope_head_dim"] = Value::from(rope);
    config["qk_nope_head_dim"] = Value::from(qk - rope);
    config["q_lora_rank"] = Value::from(keys.count("attention.q_lora_rank")?);
    config["kv_lora_rank"] = Value::from(keys.count("attention.kv_lora_rank")?);
    config["scale_emb"] = Value::from(12.0);
    config["scale_depth"] = Value::from(1.4);
    config["dim_model_base"] = Value::from(256);
    config["attention_bias"] =
        Value::from(tensors.contains_key("model.layers.0.self_attn.q_a_proj.bias"));
    require_context(config, path, &keys.key("context_length"))?;
    long_rope(config, rope_tensors, path, meta, arch)?;
    if config.get("rope_scaling").is_none() {
        // minicpm3.py needs a rope_scaling: factors of 1 over the whole context (no
        // scale), llama.cpp's plain rope.
        config["rope_scaling"] = json!({
            "type": "longrope",
            "original_max_position_embeddings": config["max_position_embeddings"].clone(),
        });
    }
    Ok(())
}

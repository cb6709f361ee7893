//! Maps whose layers differ in shape (OpenELM, Deci / Nemotron-NAS, Muse Glimmer): per-layer
//! head counts and widths read as lists, and each layer's tensors checked against them.

use mlx_core::prelude::*;
use serde_json::{json, Value};

use super::{gguf_err, meta_count, meta_f64, positive_f64, sliding_kinds, unpermute, Cx};
use crate::error::Result;

/// Deci / Nemotron-NAS (`deci` -> mlx-lm's `nemotron-nas`): each layer's `block_configs`
/// entry from the per-layer lists DeciModel writes: query heads 0 (no attention), or the
/// model's count with KV heads 0 (the linear stand-in: `attn_output` is mlx-lm's
/// `self_attn.linear`) or a divisor of it (`n_heads_in_group`, Q / K rows un-permuted per
/// layer); an MLP width of 0 (none) or the converter's `_ffn_mult_to_intermediate_size` of a
/// multiplier, which is recovered (`3 w / 2 hidden`, checked to give `w` back in mlx-lm's
/// arithmetic). A width no multiplier gives is refused.
pub(super) fn deci_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, ggml, path, blocks, hidden, heads) = (
        &mut *cx.config,
        &mut *cx.tensors,
        &mut *cx.ggml,
        cx.path,
        cx.blocks,
        cx.hidden,
        cx.heads,
    );
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    let (q, kv) = cx.layer_heads.cloned().unwrap_or_default();
    let ffn = cx
        .ffn_per_layer
        .map_or_else(|| vec![i64::from(cx.ffn)], <[i64]>::to_vec);
    let n = blocks as usize;
    let expand = |v: Vec<i64>, k: &str| -> Result<Vec<i64>> {
        match v.len() {
            1 => Ok(vec![v[0]; n]),
            l if l == n => Ok(v),
            l => Err(gguf_err(
                path,
                format!("metadata `{}` has {l} entries for {blocks} layers", key(k)),
            )),
        }
    };
    let (qk, kvk, fk) = (
        "attention.head_count",
        "attention.head_count_kv",
        "feed_forward_length",
    );
    let q = expand(q.into_iter().map(i64::from).collect(), qk)?;
    let kv = expand(kv.into_iter().map(i64::from).collect(), kvk)?;
    let ffn = expand(ffn, fk)?;
    let h = i64::from(heads);
    if heads <= 0 || hidden % heads != 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` ({heads}) does not divide `{}` ({hidden})",
                key(qk),
                key("embedding_length")
            ),
        ));
    }
    if let Some(d) = config["head_dim"]
        .as_i64()
        .filter(|&d| d != i64::from(hidden / heads))
    {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is {d}; nemotron-nas's heads are {} wide",
                key("attention.key_length"),
                hidden / heads
            ),
        ));
    }
    let d = f64::from(hidden);
    let mut blocks_cfg = Vec::with_capacity(n);
    for l in 0..n {
        let bad = |k: &str, why: String| {
            gguf_err(path, format!("layer {l}: metadata `{}` {why}", key(k)))
        };
        let p = format!("model.layers.{l}.self_attn");
        let attention = match (q[l], kv[l]) {
            (0, 0) => json!({"no_op": true}),
            (a, _) if a != h => {
                return Err(bad(
                    qk,
                    format!("is {a}; the attention layers have {h} heads"),
                ))
            }
            (_, 0) => {
                // Every part (a quantized weight's scales and biases too).
                let parts: Vec<String> = tensors
                    .keys()
                    .filter(|k| k.starts_with(&format!("{p}.o_proj.")))
                    .cloned()
                    .collect();
                for k in parts {
                    if let Some(w) = tensors.remove(&k) {
                        tensors.insert(k.replacen(".o_proj.", ".linear.", 1), w);
                    }
                }
                if let Some(g) = ggml.remove(&format!("{p}.o_proj.weight")) {
                    ggml.insert(format!("{p}.linear.weight"), g);
                }
                json!({"replace_with_linear": true})
            }
            (_, k) if k < 0 || h % k != 0 => {
                return Err(bad(kvk, format!("is {k}, which does not divide {h} heads")))
            }
            (_, k) => {
                // Rows of every part (a quantized weight's scales and biases too); weights kept
                // as GGML blocks were un-permuted as they were read.
                for (proj, count, name) in [("q_proj", h, qk), ("k_proj", k, kvk)] {
                    let parts: Vec<String> = tensors
                        .keys()
                        .filter(|t| t.starts_with(&format!("{p}.{proj}.")))
                        .cloned()
                        .collect();
                    for t in parts {
                        let Some(w) = tensors.remove(&t) else {
                            continue;
                        };
                        let w = if w.ndim() == 1 {
                            let r = w.shape()[0];
                            unpermute(&w.reshape(&[r, 1])?, count as i32, &t, &key(name))?
                                .reshape(&[r])?
                        } else {
                            unpermute(&w, count as i32, &t, &key(name))?
                        };
                        tensors.insert(t, w);
                    }
                }
                json!({"n_heads_in_group": h / k})
            }
        };
        let mlp = match ffn[l] {
            0 => json!({"no_op": true}),
            w if w > 0 => {
                // mlx-lm: round(mult, 6), then find_multiple(int(2 * mult * d / 3), 256).
                let mult = (1.5 * w as f64 / d * 1e6).round() / 1e6;
                let i = (2.0 * mult * d / 3.0) as i64;
                let back = if i % 256 == 0 { i } else { i + 256 - i % 256 };
                if back != w {
                    return Err(bad(
                        fk,
                        format!("is {w}, which no `ffn_mult` gives (a multiple of 256)"),
                    ));
                }
                json!({"ffn_mult": mult})
            }
            w => return Err(bad(fk, format!("is {w}"))),
        };
        blocks_cfg.push(json!({"attention": attention, "ffn": mlp}));
    }
    config["model_type"] = Value::from("nemotron-nas");
    config["num_attention_heads"] = Value::from(heads);
    config["block_configs"] = Value::from(blocks_cfg);
    let has = |t: &str| {
        tensors
            .keys()
            .any(|k| k.starts_with("model.layers.") && k.ends_with(t))
    };
    config["attention_bias"] = Value::from(has(".self_attn.q_proj.bias"));
    config["mlp_bias"] = Value::from(has(".mlp.up_proj.bias"));
    for k in ["head_dim", "num_key_value_heads", "intermediate_size"] {
        if let Value::Object(m) = config {
            m.remove(k);
        }
    }
    Ok(())
}

/// OpenELM (`openelm`): mlx-lm's arguments from the per-layer lists (each MLP width as a
/// multiplier of the width with a divisor of 1, which gives the width back through mlx-lm's
/// `make_divisible`); gate and up joined into `proj_1`.
pub(super) fn openelm_config(cx: &mut Cx) -> Result<()> {
    if let Some(k) = cx.ggml.keys().find(|k| k.contains(".ffn.gguf_")) {
        return Err(gguf_err(
            cx.path,
            format!("{k}: OpenELM's split gate / up are read dequantized only"),
        ));
    }
    let (config, tensors, path, blocks, hidden) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.blocks,
        cx.hidden,
    );
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    let (q, kv) = cx.layer_heads.cloned().unwrap_or_default();
    let ffn = cx
        .ffn_per_layer
        .map_or_else(|| vec![i64::from(cx.ffn)], <[i64]>::to_vec);
    let n = blocks as usize;
    let expand = |v: Vec<i64>, k: &str| -> Result<Vec<i64>> {
        match v.len() {
            1 => Ok(vec![v[0]; n]),
            l if l == n => Ok(v),
            l => Err(gguf_err(
                path,
                format!("metadata `{}` has {l} entries for {blocks} layers", key(k)),
            )),
        }
    };
    let q = expand(
        q.into_iter().map(i64::from).collect(),
        "attention.head_count",
    )?;
    let kv = expand(
        kv.into_iter().map(i64::from).collect(),
        "attention.head_count_kv",
    )?;
    let ffn = expand(ffn, "feed_forward_length")?;
    if let Some(l) = (0..n).find(|&l| q[l] % kv[l] != 0) {
        return Err(gguf_err(
            path,
            format!(
                "layer {l}: metadata `{}` ({}) does not divide `{}` ({})",
                key("attention.head_count_kv"),
                kv[l],
                key("attention.head_count"),
                q[l]
            ),
        ));
    }
    let hd = config["head_dim"].as_i64().ok_or_else(|| {
        gguf_err(
            path,
            format!("metadata `{}` is missing", key("attention.key_length")),
        )
    })?;
    for l in 0..blocks {
        let p = format!("transformer.layers.{l}.ffn");
        let (Some(gate), Some(up)) = (
            tensors.remove(&format!("{p}.gguf_gate.weight")),
            tensors.remove(&format!("{p}.gguf_up.weight")),
        ) else {
            return Err(gguf_err(
                path,
                format!("GGUF tensors blk.{l}.ffn_gate / ffn_up: OpenELM needs both"),
            ));
        };
        tensors.insert(
            format!("{p}.proj_1.weight"),
            ops::concatenate(&[&gate, &up], 0, None)?,
        );
    }
    let eps = config["rms_norm_eps"].clone();
    let theta = config["rope_theta"].clone();
    let vocab = config["vocab_size"].clone();
    let tied = !tensors.contains_key("lm_head.weight");
    let norms = tensors.contains_key("transformer.layers.0.attn.q_norm.weight");
    *config = json!({
        "model_type": "openelm",
        "head_dim": hd,
        "num_transformer_layers": blocks,
        "model_dim": hidden,
        "vocab_size": vocab,
        "ffn_dim_divisor": 1,
        "num_query_heads": q,
        "num_kv_heads": kv,
        "ffn_multipliers": ffn.iter().map(|&f| f as f64 / f64::from(hidden)).collect::<Vec<_>>(),
        "ffn_with_glu": true,
        "normalize_qk_projections": norms,
        "share_input_output_layers": tied,
        "rms_norm_eps": eps,
        "rope_freq_constant": theta,
    });
    Ok(())
}

/// Muse Glimmer (`muse-glimmer`): the four centred layer norms' `1 +` taken off (f32, as
/// mlx-lm adds it back); the synthesized q / k norms read back into `qk_scale_factor` (every
/// `attn_q_norm` one value, every `attn_k_norm` ones) and dropped; `logit_scale` as
/// `output_multiplier`, the soft-capping, the window and layer kinds; the sliding layers' rope
/// base (`rope.freq_base_swa`, else the base) as mlx-lm's one, the full layers without rope;
/// llama.cpp's fixed post-norm eps (1e-8).
pub(super) fn muse_glimmer_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
    );
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    let need = |k: &str| -> Result<f64> {
        meta_f64(meta, &key(k))
            .filter(|v| v.is_finite() && *v > 0.0)
            .ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `{}` is missing or not a number > 0", key(k)),
                )
            })
    };
    let mut qk_scale: Option<f32> = None;
    let names: Vec<String> = tensors.keys().cloned().collect();
    for name in names {
        if name.contains(".self_attn.gguf_q_norm.") || name.contains(".self_attn.gguf_k_norm.") {
            let Some(a) = tensors.remove(&name) else {
                continue;
            };
            let v = a
                .astype(Dtype::Float32)
                .and_then(|b| b.reshape(&[-1]))
                .and_then(|b| b.to_vec::<f32>())
                .map_err(|e| gguf_err(path, format!("{name}: {e}")))?;
            let first = v.first().copied().unwrap_or(f32::NAN);
            let uniform = v.iter().all(|&x| x == first);
            let ok = if name.contains("gguf_k_norm") {
                uniform && first == 1.0
            } else {
                let same = qk_scale.is_none_or(|s| s == first);
                qk_scale = Some(first);
                uniform && same && first.is_finite()
            };
            if !ok {
                return Err(gguf_err(
                    path,
                    format!(
                        "{name}: Muse Glimmer's q / k norms are weightless (`attn_k_norm` all ones, \
                         every `attn_q_norm` one qk_scale_factor), which mlx-lm's muse_glimmer \
                         assumes"
                    ),
                ));
            }
            continue;
        }
        if [
            ".input_layernorm.weight",
            ".post_attention_layernorm.weight",
            ".pre_feedforward_layernorm.weight",
            ".post_feedforward_layernorm.weight",
        ]
        .iter()
        .any(|s| name.ends_with(s))
        {
            if let Some(a) = tensors.get_mut(&name) {
                *a = (&*a - 1.0f32)?;
            }
        }
    }
    let qk_scale = qk_scale.ok_or_else(|| {
        gguf_err(
            path,
            "GGUF tensor blk.0.attn_q_norm.weight is missing (it carries qk_scale_factor)",
        )
    })?;
    config["qk_scale_factor"] = Value::from(f64::from(qk_scale));
    config["output_multiplier"] = Value::from(need("logit_scale")?);
    config["final_logit_softcapping"] = Value::from(need("final_logit_softcapping")?);
    config["sliding_window"] = Value::from(
        meta_count(meta, path, &key("attention.sliding_window"))?.ok_or_else(|| {
            gguf_err(
                path,
                format!("metadata `{}` is missing", key("attention.sliding_window")),
            )
        })?,
    );
    config["layer_types"] = json!(sliding_kinds(meta, path, key, blocks)?);
    if let Some(t) = positive_f64(meta, path, &key("rope.freq_base_swa"))? {
        config["rope_theta"] = Value::from(t);
    }
    config["post_norm_eps"] = Value::from(1e-8);
    if config.get("head_dim").is_none() {
        return Err(gguf_err(
            path,
            format!("metadata `{}` is missing", key("attention.key_length")),
        ));
    }
    Ok(())
}

//! Maps whose converter fused, split, permuted or repacked tensors (Phi-2, GPT-2, Qwen,
//! StarCoder, GPT-NeoX, InternLM2, StableLM, OLMo, PLaMo, PLaMo 3, Talkie, BitNet): the tensors are
//! put back into mlx-lm's layout, and the few hyper-parameters these older configs name their own way.

use mlx_core::prelude::*;
use serde_json::{json, Value};

use super::{
    gguf_err, head_size, meta_bool, meta_count, meta_f64, meta_str, positive_f64, rotary_dims,
    unpermute, Cx,
};
use crate::error::Result;

/// Phi-2 (`phi2`): mlx-lm's phi arguments; the rotated share of the head from
/// `rope.dimension_count` (the whole head when absent); a fused `attn_qkv` (q, k, v rows in
/// turn, as older converters wrote Phi-2's `Wqkv`) split into mlx-lm's three projections.
pub(super) fn phi2_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks, hidden, heads) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
        cx.hidden,
        cx.heads,
    );
    let key = |k: &str| format!("phi2.{k}");
    let hd = head_size(path, &key, hidden, heads)?;
    if let Some(c) = config.as_object_mut() {
        c.remove("head_dim");
    }
    let rot = rotary_dims(meta, path, &key("rope.dimension_count"), hd, hd)?;
    config["partial_rotary_factor"] = Value::from(f64::from(rot) / f64::from(hd));
    let kv = config["num_key_value_heads"].as_i64().unwrap_or(0) as i32;
    for l in 0..blocks {
        for suffix in ["weight", "bias", "scales", "biases"] {
            let name = format!("model.layers.{l}.self_attn.gguf_qkv.{suffix}");
            let Some(qkv) = tensors.remove(&name) else {
                continue;
            };
            let rows = qkv.shape()[0];
            let (q, k) = (heads * hd, kv * hd);
            if rows != q + 2 * k {
                return Err(gguf_err(
                    path,
                    format!(
                        "GGUF tensor blk.{l}.attn_qkv.{suffix} has {rows} rows, not {} (q, k, v)",
                        q + 2 * k
                    ),
                ));
            }
            let cols = qkv.shape().get(1).copied();
            for (part, start, len) in [("q", 0, q), ("k", q, k), ("v", q + k, k)] {
                let a = match cols {
                    Some(c) => qkv.slice(&[start, 0], &[start + len, c], &[1, 1])?,
                    None => qkv.slice(&[start], &[start + len], &[1])?,
                };
                tensors.insert(
                    format!("model.layers.{l}.self_attn.{part}_proj.{suffix}"),
                    a,
                );
            }
        }
    }
    Ok(())
}

/// GPT-2 (`gpt2`): mlx-lm's `n_*` arguments; the positions from `position_embd`'s rows. The
/// head is the embedding in mlx-lm's gpt2: a file with its own `output` is refused.
pub(super) fn gpt2_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, blocks, hidden, heads) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.blocks,
        cx.hidden,
        cx.heads,
    );
    if tensors.contains_key("lm_head.weight") {
        return Err(gguf_err(
            path,
            "GGUF tensor output.weight: mlx-lm's gpt2 ties its head to the embedding",
        ));
    }
    let positions = tensors
        .get("model.wpe.weight")
        .map(|w| w.shape()[0])
        .ok_or_else(|| gguf_err(path, "GGUF tensor position_embd.weight is missing"))?;
    config["n_embd"] = Value::from(hidden);
    config["n_head"] = Value::from(heads);
    config["n_layer"] = Value::from(blocks);
    config["n_positions"] = Value::from(positions);
    config["n_ctx"] = config
        .get("max_position_embeddings")
        .cloned()
        .unwrap_or(Value::from(positions));
    Ok(())
}

/// Qwen (`qwen`): mlx-lm's qwen arguments (its rope base is fixed at 10000, its heads all
/// have keys and values, its head untied); biases beyond the qkv one from the tensors.
pub(super) fn qwen_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, hidden, heads, kv_heads) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.hidden,
        cx.heads,
        cx.kv_heads,
    );
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    let hd = head_size(path, key, hidden, heads)?;
    if kv_heads != heads {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {kv_heads}: mlx-lm's qwen gives every one of the {heads} heads \
                 its keys and values",
                key("attention.head_count_kv")
            ),
        ));
    }
    if config["rope_theta"].as_f64() != Some(10000.0) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is {}: mlx-lm's qwen fixes the rope base at 10000",
                key("rope.freq_base"),
                config["rope_theta"]
            ),
        ));
    }
    if !tensors.contains_key("lm_head.weight") {
        return Err(gguf_err(
            path,
            "GGUF tensor output.weight is missing: mlx-lm's qwen has its own head",
        ));
    }
    config["kv_channels"] = Value::from(hd);
    config["no_bias"] = Value::from(!tensors.contains_key("transformer.h.0.attn.c_proj.bias"));
    Ok(())
}

/// PLaMo (`plamo`): the query heads shared `n_shared_head` ways over the KV heads, the
/// converter's shuffle of `attn_q`'s rows and `attn_output`'s columns, (kv, shared, head_dim),
/// put back to mlx-lm's (shared, kv, head_dim).
pub(super) fn plamo_config(cx: &mut Cx) -> Result<()> {
    if let Some(k) = cx.ggml.keys().find(|k| k.contains(".self_attn.")) {
        return Err(gguf_err(
            cx.path,
            format!("{k}: PLaMo's shuffled attention is read dequantized only"),
        ));
    }
    let (config, tensors, path, hidden, heads, kv_heads) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.hidden,
        cx.heads,
        cx.kv_heads,
    );
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    let hd = head_size(path, key, hidden, heads)?;
    if heads % kv_heads != 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {kv_heads} does not divide `{}` = {heads}",
                key("attention.head_count_kv"),
                key("attention.head_count")
            ),
        ));
    }
    let shared = heads / kv_heads;
    for (name, a) in tensors.iter_mut() {
        let fixed = if name.ends_with(".self_attn.q_proj.weight") {
            let cols = a.shape()[1];
            a.reshape(&[kv_heads, shared, hd, cols])?
                .transpose(&[1, 0, 2, 3])?
                .reshape(&[heads * hd, cols])?
        } else if name.ends_with(".self_attn.o_proj.weight") {
            let rows = a.shape()[0];
            a.reshape(&[rows, kv_heads, shared, hd])?
                .transpose(&[0, 2, 1, 3])?
                .reshape(&[rows, heads * hd])?
        } else {
            continue;
        };
        *a = fixed;
    }
    config["n_shared_head"] = Value::from(shared);
    config.as_object_mut().map(|m| m.remove("head_dim"));
    Ok(())
}

/// PLaMo 3 (`plamo3`): the norms' offsets (added by the converter, added again at run time by
/// mlx-lm) taken off, in f32 as mlx-lm's `weight + offset` is computed; the window, its period
/// (every n-th layer full) and the local rope base from metadata.
pub(super) fn plamo3_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta) = (&mut *cx.config, &mut *cx.tensors, cx.path, cx.meta);
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    let after_mlp = (1.0f64 / 5f64.powf(1.5)) as f32;
    for (name, a) in tensors.iter_mut() {
        let offset = if name.ends_with(".post_mixer_norm.weight") {
            (1.0f64 / 5.0) as f32
        } else if name.ends_with(".post_mlp_norm.weight") {
            after_mlp
        } else if name.ends_with("norm.weight") {
            1.0
        } else {
            continue;
        };
        *a = (&*a - offset)?;
    }
    let need = |k: &str| -> Result<i32> {
        meta_count(meta, path, &key(k))?
            .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", key(k))))
    };
    config["window_size"] = Value::from(need("attention.sliding_window")?);
    config["sliding_window_pattern"] = Value::from(need("attention.sliding_window_pattern")?);
    if let Some(theta) = positive_f64(meta, path, &key("rope.freq_base_swa"))? {
        config["rope_local_theta"] = Value::from(theta);
    }
    Ok(())
}

/// Talkie (`talkie`): the converter's negation of the second half of every query and key
/// head's rows undone (exact), its renames put back (`attn_output.scale` -> `attn_gain.a_g`,
/// `ffn_down.scale` -> `mlp_gain.a_g`, `output.weight` -> the bare `lm_head`, the head gain
/// flattened) and `logit_scale` made the head's gain `lm_head_gain.w_g`.
pub(super) fn talkie_config(cx: &mut Cx) -> Result<()> {
    if let Some(k) = cx.ggml.keys().find(|k| k.contains(".attn.attn_")) {
        return Err(gguf_err(
            cx.path,
            format!("{k}: Talkie's sign-flipped attention is read dequantized only"),
        ));
    }
    let (config, tensors, path, meta) = (&mut *cx.config, &mut *cx.tensors, cx.path, cx.meta);
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    let hd = config["head_dim"]
        .as_i64()
        .map(|d| d as i32)
        .filter(|&d| d > 0 && d % 2 == 0)
        .ok_or_else(|| {
            gguf_err(
                path,
                format!(
                    "metadata `{}` is missing or odd: Talkie's heads need an even size",
                    key("attention.key_length")
                ),
            )
        })?;
    let half = hd / 2;
    let signs: Vec<f32> = (0..hd).map(|i| if i < half { 1.0 } else { -1.0 }).collect();
    let signs = Array::from_slice(&signs, &[1, hd, 1])?;
    let renames = [
        (".attn.attn_resid.scale", ".attn_gain.a_g"),
        (".mlp.mlp_resid.scale", ".mlp_gain.a_g"),
    ];
    let names: Vec<String> = tensors.keys().cloned().collect();
    for name in names {
        let Some(a) = tensors.remove(&name) else {
            continue;
        };
        let (name, a) = if name.ends_with(".attn.attn_query.weight")
            || name.ends_with(".attn.attn_key.weight")
        {
            let shape = a.shape().to_vec();
            let flipped = (&a.reshape(&[-1, hd, shape[1]])? * &signs.astype(a.dtype())?)?;
            (name, flipped.reshape(&shape)?)
        } else if name.ends_with(".attn.head_gain.head_g") {
            (name, a.reshape(&[-1])?)
        } else if name == "lm_head.weight" {
            ("lm_head".to_string(), a)
        } else if let Some((from, to)) = renames.iter().find(|(f, _)| name.ends_with(f)) {
            (format!("{}{to}", &name[..name.len() - from.len()]), a)
        } else {
            (name, a)
        };
        tensors.insert(name, a);
    }
    if !tensors.contains_key("lm_head") {
        return Err(gguf_err(
            path,
            "GGUF tensor output.weight is missing: Talkie's head is its own",
        ));
    }
    let gain = meta_f64(meta, &key("logit_scale")).ok_or_else(|| {
        gguf_err(
            path,
            format!("metadata `{}` is missing", key("logit_scale")),
        )
    })?;
    tensors.insert(
        "lm_head_gain.w_g".into(),
        Array::from_slice(&[gain as f32], &[1])?,
    );
    Ok(())
}

/// BitNet's projections: llama.cpp's part, mlx-lm's module.
pub(super) const BITNET_LINEARS: &[(&str, &str)] = &[
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// BitNet b1.58 (`bitnet`): BitnetModel writes each projection as ternary values times one
/// scale (its `weight_quant`); mlx-lm's BitLinear holds the codes packed four output rows a
/// byte plus `weight_scale`, which [`bitnet_pack`] recovers exactly. The rope scaling the
/// converter writes (linear, factor 1) is no scaling; another linear factor is kept.
pub(super) fn bitnet_config(cx: &mut Cx) -> Result<()> {
    if let Some(k) = cx
        .ggml
        .keys()
        .find(|k| BITNET_LINEARS.iter().any(|(_, p)| k.contains(p)))
    {
        return Err(gguf_err(
            cx.path,
            format!("{k}: BitNet's ternary weights are read dequantized only"),
        ));
    }
    let (config, tensors, path, meta, blocks) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
    );
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    match meta_str(meta, &key("rope.scaling.type")) {
        None | Some("none") => {}
        Some("linear") => {
            let f = meta_f64(meta, &key("rope.scaling.factor")).ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `{}` is missing", key("rope.scaling.factor")),
                )
            })?;
            if f != 1.0 {
                config["rope_scaling"] = json!({"type": "linear", "factor": f});
            }
        }
        Some(other) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {other:?}: mlx-lm's bitnet takes linear scaling only",
                    key("rope.scaling.type")
                ),
            ))
        }
    }
    let bias = |p: &str| tensors.contains_key(&format!("model.layers.0.{p}.bias"));
    config["attention_bias"] = Value::from(bias("self_attn.q_proj"));
    config["mlp_bias"] = Value::from(bias("mlp.up_proj"));
    for l in 0..blocks {
        for (part, module) in BITNET_LINEARS {
            let gguf = format!("blk.{l}.{part}.weight");
            let name = format!("model.layers.{l}.{module}");
            let w = tensors
                .remove(&format!("{name}.weight"))
                .ok_or_else(|| gguf_err(path, format!("GGUF tensor {gguf} is missing")))?;
            let (packed, scale) =
                bitnet_pack(&w).map_err(|e| gguf_err(path, format!("GGUF tensor {gguf}: {e}")))?;
            tensors.insert(format!("{name}.weight"), packed);
            tensors.insert(format!("{name}.weight_scale"), scale);
        }
    }
    Ok(())
}

/// A weight of ternary values times one scale (`(out, in)`, `out` a multiple of 4) as mlx-lm's
/// BitLinear holds it: uint8 `(out / 4, in)` whose bits `2i..2i + 2` of row `r` are row
/// `r + i * out / 4`'s code (value / scale + 1), and the scale (the non-zero magnitude, 1 when
/// every value is 0) in the weight's dtype, shape (1,). Values that are not 0 or plus / minus
/// one magnitude are refused.
pub(super) fn bitnet_pack(w: &Array) -> std::result::Result<(Array, Array), NotTernary> {
    let shape = w.shape();
    let &[out, cols] = shape.as_slice() else {
        return Err(NotTernary::Shape(shape));
    };
    if out % 4 != 0 {
        return Err(NotTernary::Rows(out));
    }
    let v = w.astype(Dtype::Float32).and_then(|a| a.to_vec::<f32>())?;
    let s = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    if let Some(i) = v.iter().position(|&x| !(x == 0.0 || x == s || x == -s)) {
        let c = cols as usize;
        return Err(NotTernary::Value {
            value: v[i],
            row: i / c,
            col: i % c,
            scale: s,
        });
    }
    let (q, c) = (out as usize / 4, cols as usize);
    let mut packed = vec![0u8; q * c];
    for i in 0..4 {
        for (j, p) in packed.iter_mut().enumerate() {
            let x = v[i * q * c + j];
            let code: u8 = if x > 0.0 {
                2
            } else if x < 0.0 {
                0
            } else {
                1
            };
            *p |= code << (2 * i);
        }
    }
    let s = if s == 0.0 { 1.0 } else { s };
    Ok((
        Array::from_slice(&packed, &[out / 4, cols])?,
        Array::from_slice(&[s], &[1]).and_then(|a| a.astype(w.dtype()))?,
    ))
}

/// Why [`bitnet_pack`] refused a weight; the loader adds the file and the tensor.
#[derive(Debug)]
pub(super) enum NotTernary {
    /// Not 2-d.
    Shape(Vec<i32>),
    /// Rows not a multiple of 4.
    Rows(i32),
    /// A value that is not 0 or plus / minus the scale.
    Value {
        value: f32,
        row: usize,
        col: usize,
        scale: f32,
    },
    /// MLX failed reading or building the arrays.
    Mlx(mlx_core::Error),
}

impl From<mlx_core::Error> for NotTernary {
    fn from(e: mlx_core::Error) -> NotTernary {
        NotTernary::Mlx(e)
    }
}

impl std::fmt::Display for NotTernary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotTernary::Shape(shape) => write!(f, "must be 2-d, got shape {shape:?}"),
            NotTernary::Rows(out) => write!(
                f,
                "has {out} rows; mlx-lm's BitLinear packs four output rows a byte"
            ),
            NotTernary::Value {
                value,
                row,
                col,
                scale,
            } => write!(
                f,
                "value {value} at ({row}, {col}) is not 0 or +/-{scale}: not ternary values \
                 times one scale"
            ),
            NotTernary::Mlx(e) => write!(f, "{e}"),
        }
    }
}

/// OLMo (`olmo`): mlx-lm's AI2 arguments and fused projections (`att_proj` = [q | k | v],
/// `ff_proj` = [up | gate]); mlx-lm's fixed LayerNorm eps (1e-5), full heads and no clamp are
/// checked.
pub(super) fn olmo_config(cx: &mut Cx) -> Result<()> {
    if let Some(k) = cx
        .ggml
        .keys()
        .find(|k| k.contains("_proj.") || k.contains(".gguf_"))
    {
        return Err(gguf_err(
            cx.path,
            format!("{k}: OLMo's fused projections are read dequantized only"),
        ));
    }
    let (config, tensors, path, meta, blocks, heads, kv_heads, ffn) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
        cx.heads,
        cx.kv_heads,
        cx.ffn,
    );
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    if meta.contains_key(&key("attention.clamp_kqv")) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}`: mlx-lm's olmo does not clamp q, k and v",
                key("attention.clamp_kqv")
            ),
        ));
    }
    if kv_heads != heads {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {kv_heads}: mlx-lm's olmo gives each of the {heads} heads its \
                 keys and values",
                key("attention.head_count_kv")
            ),
        ));
    }
    if config["layer_norm_eps"].as_f64().map(|e| e as f32) != Some(1e-5) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is {}: mlx-lm's olmo fixes it at 1e-5",
                key("attention.layer_norm_epsilon"),
                config["layer_norm_eps"]
            ),
        ));
    }
    for l in 0..blocks {
        let p = format!("model.transformer.blocks.{l}");
        for (fused, parts) in [
            (
                "att_proj",
                ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"].as_slice(),
            ),
            ("ff_proj", ["gguf_up", "gguf_gate"].as_slice()),
        ] {
            let mut got = Vec::with_capacity(parts.len());
            for part in parts {
                let name = format!("{p}.{part}.weight");
                got.push(tensors.remove(&name).ok_or_else(|| {
                    gguf_err(
                        path,
                        format!("layer {l}: `{part}` is missing (OLMo's {fused} needs it)"),
                    )
                })?);
            }
            let refs: Vec<&Array> = got.iter().collect();
            let joined = ops::concatenate(&refs, 0, None)
                .map_err(|e| gguf_err(path, format!("layer {l}: joining {fused}: {e}")))?;
            tensors.insert(format!("{p}.{fused}.weight"), joined);
        }
    }
    if let Some(k) = tensors.keys().find(|k| k.ends_with(".bias")) {
        return Err(gguf_err(path, format!("{k}: mlx-lm's olmo has no biases")));
    }
    let tied = !tensors.contains_key("model.transformer.ff_out.weight");
    let vocab = config["vocab_size"].clone();
    *config = json!({
        "model_type": "olmo",
        "d_model": config["hidden_size"],
        "n_layers": blocks,
        "mlp_hidden_size": 2 * ffn,
        "n_heads": heads,
        "vocab_size": vocab,
        "embedding_size": vocab,
        "rope_theta": config["rope_theta"],
        "weight_tying": tied,
    });
    Ok(())
}

/// StarCoder (`starcoder`): mlx-lm's gpt_bigcode arguments; multi-query where the file has one
/// KV head (else every head has its own, `multi_query` false); positions from
/// `position_embd`'s rows; biases from the tensors.
#[allow(clippy::too_many_arguments)]
pub(super) fn starcoder_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, blocks, hidden, heads, kv_heads, ffn) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.blocks,
        cx.hidden,
        cx.heads,
        cx.kv_heads,
        cx.ffn,
    );
    let multi_query = match kv_heads {
        1 => true,
        k if k == heads => false,
        k => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `starcoder.attention.head_count_kv` = {k}: mlx-lm's gpt_bigcode \
                     takes 1 (multi-query) or the head count ({heads})"
                ),
            ))
        }
    };
    let positions = tensors
        .get("transformer.wpe.weight")
        .map(|w| w.shape()[0])
        .ok_or_else(|| gguf_err(path, "GGUF tensor position_embd.weight is missing"))?;
    let has = |k: &str| tensors.contains_key(k);
    config["n_embd"] = Value::from(hidden);
    config["n_head"] = Value::from(heads);
    config["n_layer"] = Value::from(blocks);
    config["n_inner"] = Value::from(ffn);
    config["n_positions"] = Value::from(positions);
    config["multi_query"] = Value::from(multi_query);
    config["attention_bias"] = Value::from(has("transformer.h.0.attn.c_attn.bias"));
    config["mlp_bias"] = Value::from(has("transformer.h.0.mlp.c_fc.bias"));
    Ok(())
}

/// GPT-NeoX (`gptneox`): mlx-lm's gpt_neox arguments (`rotary_pct` from `rope.dimension_count`,
/// the base from `rope.freq_base` or 10000, `use_parallel_residual` as the file says, else
/// true); the converter's `attn_qkv` (q rows, then k, then v) interleaved per head again
/// (per head: q, k, v), weight, bias and a quantized tensor's scales and biases alike.
pub(super) fn gptneox_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks, hidden, heads) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
        cx.hidden,
        cx.heads,
    );
    let key = |k: &str| format!("gptneox.{k}");
    let hd = head_size(path, &key, hidden, heads)?;
    let rot = rotary_dims(meta, path, &key("rope.dimension_count"), hd, hd)?;
    if let Some(c) = config.as_object_mut() {
        c.remove("head_dim");
    }
    config["rotary_pct"] = Value::from(f64::from(rot) / f64::from(hd));
    config["rotary_emb_base"] = config["rope_theta"].clone();
    config["use_parallel_residual"] =
        Value::from(meta_bool(meta, path, &key("use_parallel_residual"))?.unwrap_or(true));
    for l in 0..blocks {
        for suffix in ["weight", "bias", "scales", "biases"] {
            let name = format!("model.h.{l}.attention.gguf_qkv.{suffix}");
            let Some(qkv) = tensors.remove(&name) else {
                continue;
            };
            let shape = qkv.shape();
            if shape[0] != 3 * hidden {
                return Err(gguf_err(
                    path,
                    format!(
                        "GGUF tensor blk.{l}.attn_qkv.{suffix} has {} rows, not 3 x {hidden}",
                        shape[0]
                    ),
                ));
            }
            let mut grouped = vec![3, heads, hd];
            grouped.extend_from_slice(&shape[1..]);
            let a = qkv.reshape(&grouped)?;
            let a = ops::swapaxes(&a, 0, 1, None)?.reshape(&shape)?;
            tensors.insert(format!("model.h.{l}.attention.query_key_value.{suffix}"), a);
        }
    }
    Ok(())
}

/// InternLM2 (`internlm2`): llama.cpp's q, k and v (Q / K rows permuted) back into mlx-lm's
/// fused `attention.wqkv`, per KV group its queries, then its key and value head (the rows of
/// a quantized tensor's scales and biases with them). llama.cpp writes no biases (`bias` false).
pub(super) fn internlm2_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, blocks, heads, kv_heads) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.blocks,
        cx.heads,
        cx.kv_heads,
    );
    if heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `internlm2.attention.head_count` = {heads} is not a multiple of \
                 `internlm2.attention.head_count_kv` = {kv_heads}"
            ),
        ));
    }
    config["bias"] = Value::from(false);
    // mlx-lm's head is `output`, not `lm_head`: tied when the file has none.
    config["tie_word_embeddings"] = Value::from(!tensors.keys().any(|k| k.starts_with("output.")));
    for l in 0..blocks {
        let p = format!("model.layers.{l}.attention");
        for suffix in ["weight", "scales", "biases", "bias"] {
            let names = ["q", "k", "v"].map(|w| format!("{p}.gguf_{w}.{suffix}"));
            if names.iter().all(|n| !tensors.contains_key(n)) {
                continue;
            }
            if suffix == "bias" {
                return Err(gguf_err(
                    path,
                    format!("GGUF tensor blk.{l}.attn_q.bias: InternLM2 files have no biases"),
                ));
            }
            let mut parts = Vec::with_capacity(3);
            for (n, w) in names.iter().zip(["q", "k", "v"]) {
                let Some(a) = tensors.remove(n) else {
                    return Err(gguf_err(
                        path,
                        format!(
                            "GGUF tensor blk.{l}.attn_{w}.{suffix} is missing (InternLM2's q, k \
                             and v come together)"
                        ),
                    ));
                };
                parts.push(a);
            }
            let key = |k: &str| format!("internlm2.attention.{k}");
            let q = unpermute(&parts[0], heads, &names[0], &key("head_count"))?;
            let k = unpermute(&parts[1], kv_heads, &names[1], &key("head_count_kv"))?;
            let v = &parts[2];
            let cols = q.shape()[1];
            let hd = q.shape()[0] / heads;
            if k.shape() != [kv_heads * hd, cols] || v.shape() != [kv_heads * hd, cols] {
                return Err(gguf_err(
                    path,
                    format!(
                        "layer {l}: k {:?} and v {:?} do not match q {:?} for {kv_heads} key \
                         heads",
                        k.shape(),
                        v.shape(),
                        q.shape()
                    ),
                ));
            }
            let g = kv_heads;
            let q = q.reshape(&[g, heads / g, hd, cols])?;
            let k = k.reshape(&[g, 1, hd, cols])?;
            let v = v.reshape(&[g, 1, hd, cols])?;
            let qkv =
                ops::concatenate(&[&q, &k, &v], 1, None)?.reshape(&[(heads + 2 * g) * hd, cols])?;
            tensors.insert(format!("{p}.wqkv.{suffix}"), qkv);
        }
    }
    Ok(())
}

/// StableLM (`stablelm`): mlx-lm's stablelm arguments. The rotated share of the head from
/// `rope.dimension_count` (the whole head when absent, as llama.cpp); qkv bias and the
/// per-head q / k LayerNorms from the tensors, those norms unstacked into mlx-lm's
/// `norms.<head>`; the parallel residual block where the layers have no `ffn_norm` (what
/// llama.cpp's graph goes by; `use_parallel_residual` must agree). llama.cpp computes the
/// output from the embedding when a file has no `output`, which mlx-lm's stablelm always has.
pub(super) fn stablelm_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, heads, kv_heads) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.heads,
        cx.kv_heads,
    );
    let key = |k: &str| format!("stablelm.{k}");
    let hidden = config["hidden_size"].as_i64().unwrap_or(0) as i32;
    let hd = head_size(path, &key, hidden, heads)?;
    if let Some(c) = config.as_object_mut() {
        c.remove("head_dim");
    }
    let rot = meta_count(meta, path, &key("rope.dimension_count"))?.unwrap_or(hd);
    if rot <= 0 || rot > hd || rot % 2 != 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {rot} must be even and in 2..={hd} (the head size)",
                key("rope.dimension_count")
            ),
        ));
    }
    config["partial_rotary_factor"] = Value::from(f64::from(rot) / f64::from(hd));
    config["use_qkv_bias"] =
        Value::from(tensors.contains_key("model.layers.0.self_attn.q_proj.bias"));
    let parallel = !tensors.contains_key("model.layers.0.post_attention_layernorm.weight");
    if let Some(p) = meta_bool(meta, path, &key("use_parallel_residual"))? {
        if p != parallel {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {p}, but the layers {} `ffn_norm`",
                    key("use_parallel_residual"),
                    if parallel { "have no" } else { "have an" }
                ),
            ));
        }
    }
    config["use_parallel_residual"] = Value::from(parallel);
    let mut qk = false;
    for (which, n) in [("q", heads), ("k", kv_heads)] {
        let layers: Vec<String> = tensors
            .keys()
            .filter(|k| k.ends_with(&format!(".self_attn.{which}_layernorm.weight")))
            .cloned()
            .collect();
        for name in layers {
            let Some(w) = tensors.remove(&name) else {
                continue;
            };
            if w.shape() != [n, hd] {
                return Err(gguf_err(
                    path,
                    format!(
                        "tensor for {name} has shape {:?}, not ({n}, {hd}) (heads, head size)",
                        w.shape()
                    ),
                ));
            }
            let stem = name.trim_end_matches(".weight");
            for h in 0..n {
                let row = w.slice(&[h, 0], &[h + 1, hd], &[1, 1])?.reshape(&[hd])?;
                tensors.insert(format!("{stem}.norms.{h}.weight"), row);
            }
            qk = true;
        }
    }
    config["qk_layernorm"] = Value::from(qk);
    if !tensors.contains_key("lm_head.weight") {
        if let Some(e) = tensors.get("model.embed_tokens.weight") {
            let e = e.clone();
            tensors.insert("lm_head.weight".into(), e);
        }
    }
    Ok(())
}

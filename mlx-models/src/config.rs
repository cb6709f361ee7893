//! `config.json` handling: the model type (with mlx-lm's `MODEL_REMAPPING`), typed arguments
//! that tolerate unknown keys, and the `quantization` block with per-module overrides.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde_json::Value;

use mlx_core::quantized::QuantMode;

use crate::error::{ModelError, Result};

/// mlx-lm 0.32.2's `MODEL_REMAPPING` (`mlx_lm/utils.py`), whole: whether a target is served
/// is decided by [`crate::models::build`]'s dispatch ladder.
pub const MODEL_REMAPPING: &[(&str, &str)] = &[
    ("mistral", "llama"),
    ("llava", "mistral3"),
    ("phi-msft", "phixtral"),
    ("falcon_mamba", "mamba"),
    ("joyai_llm_flash", "deepseek_v3"),
    ("kimi_k2", "deepseek_v3"),
    ("qwen2_5_vl", "qwen2_vl"),
    ("minimax_m2", "minimax"),
    ("iquestcoder", "llama"),
    ("xverse", "llama"),
    ("gemma4_unified", "gemma4"),
    ("deepseek_v41_text", "deepseek_v41"),
];

/// `model_type` after [`MODEL_REMAPPING`].
pub fn remap(model_type: &str) -> &str {
    MODEL_REMAPPING
        .iter()
        .find(|(from, _)| *from == model_type)
        .map_or(model_type, |(_, to)| to)
}

/// A parsed `config.json`.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    /// The whole document, for architecture-specific arguments.
    pub raw: Value,
    /// `model_type` as written.
    pub model_type: String,
    /// The architecture that runs it (`model_type` after [`MODEL_REMAPPING`]).
    pub architecture: String,
    /// The `quantization` (or legacy `quantization_config`) block, if any.
    pub quantization: Option<QuantConfig>,
}

/// Affine (or other mode) quantization parameters of one module.
#[derive(serde::Serialize, Clone, Debug, PartialEq, Eq)]
pub struct QuantParams {
    pub group_size: i32,
    pub bits: i32,
    pub mode: String,
    /// `mode: "trellis"` only: the state bits and the incoherence seed.
    #[serde(flatten)]
    pub trellis: Option<TrellisParams>,
}

/// The trellis fields of a quantization entry (`"mode": "trellis"`): `group_size` is the
/// trellis block (weights a tail-biting stream), `bits` the bits a weight.
#[derive(serde::Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrellisParams {
    /// `trellis_l`: the state window's bits (default 12).
    pub trellis_l: u32,
    /// `seed`: the incoherence signs' seed (default 0), mixed with each layer's path.
    pub seed: u64,
    /// `trellis_code`: the code the states decode to, `"1mad"` (the default, not written)
    /// `"1mad8"` (1MAD rounded to int8: the CPU decoder's int8 kernel, `L` 8 or less) or
    /// `"1mad8h"` (1mad8's table indexed by a hash of an `L`-bit state, `L` 9..=16) or
    /// `"1mad8s"` (as 1mad8h with the AES S-box of the top byte) or `"gauss8s"` / `"gauss7s"`
    /// (1mad8s's index into a stratified Gaussian table of 256 / 128 entries).
    #[serde(
        skip_serializing_if = "is_default_code",
        serialize_with = "serialize_code"
    )]
    pub trellis_code: mlx_core::cpu::trellis::TrellisCode,
}

fn is_default_code(c: &mlx_core::cpu::trellis::TrellisCode) -> bool {
    *c == mlx_core::cpu::trellis::TrellisCode::Mad
}

fn serialize_code<S: serde::Serializer>(
    c: &mlx_core::cpu::trellis::TrellisCode,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(c.name())
}

/// The trellis defaults: `group_size` (block) 64, 2 bits, `trellis_l` 12.
pub const TRELLIS_DEFAULTS: (i32, i32, u32) = (64, 2, 12);

/// The `quantization` block: defaults plus per-module entries (`false` = not quantized).
#[derive(serde::Serialize, Clone, Debug, PartialEq)]
pub struct QuantConfig {
    pub default: QuantParams,
    pub overrides: BTreeMap<String, Option<QuantParams>>,
}

impl ModelConfig {
    /// The document's `model_type` (it must be an object holding a string `model_type`).
    /// The checked constructors (`from_file`, `from_json_str`, `from_value`) are beside the
    /// registry (`models/registry.rs`), which decides whether the type is served.
    pub(crate) fn model_type_of(raw: &Value) -> Result<String> {
        let obj = raw
            .as_object()
            .ok_or_else(|| ModelError::Config("config.json must hold a JSON object".into()))?;
        Ok(obj
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| ModelError::Config("config.json has no string `model_type`".into()))?
            .to_string())
    }

    /// The config of `raw` once its `model_type` (from [`Self::model_type_of`]) is accepted:
    /// float hyper-parameters checked, the quantization block parsed.
    pub(crate) fn with_model_type(raw: Value, model_type: String) -> Result<ModelConfig> {
        let obj = raw
            .as_object()
            .ok_or_else(|| ModelError::Config("config.json must hold a JSON object".into()))?;
        let architecture = remap(&model_type).to_string();
        check_float_params(obj, "")?;
        if let Some(Value::Object(text)) = obj.get("text_config") {
            check_float_params(text, "text_config.")?;
        }
        let quantization = match obj
            .get("quantization")
            .or_else(|| obj.get("quantization_config"))
        {
            None | Some(Value::Null) => None,
            // BitNet's packed ternary weights: unpacked by its row (descriptor `bitlinear`).
            Some(q) if q.get("quant_method").and_then(Value::as_str) == Some("bitnet") => None,
            Some(q) if !obj.contains_key("quantization") && legacy_mx(q).is_some() => {
                Some(QuantConfig::parse(&legacy_mx(q).unwrap_or_default())?)
            }
            Some(q) => Some(QuantConfig::parse(q)?),
        };
        Ok(ModelConfig {
            raw,
            model_type,
            architecture,
            quantization,
        })
    }

    /// Typed architecture arguments (unknown keys ignored, missing ones defaulted by `T`).
    pub fn args<T: DeserializeOwned>(&self) -> Result<T> {
        parse_args(&self.raw, &self.architecture)
    }
}

/// mlx-lm's reading of a legacy `quantization_config` whose method is a microscaling format:
/// `mxfp4`, `mxfp8`, or `fp8` with power-of-two (`ue8m0`) scales over 32x32 blocks, which
/// stays packed as mxfp8 (DeepSeek V4.1). Each module's own mode is then inferred from its
/// tensors, as mlx-lm's `infer_quant_config` does.
fn legacy_mx(q: &Value) -> Option<Value> {
    let (bits, mode) = match q.get("quant_method").and_then(Value::as_str)? {
        "mxfp4" => (4, "mxfp4"),
        "mxfp8" => (8, "mxfp8"),
        "fp8"
            if q.get("scale_fmt").and_then(Value::as_str) == Some("ue8m0")
                && q.get("weight_block_size") == Some(&serde_json::json!([32, 32])) =>
        {
            (8, "mxfp8")
        }
        _ => return None,
    };
    Some(serde_json::json!({"group_size": 32, "bits": bits, "mode": mode}))
}

/// Float hyper-parameters that are meaningless outside a range (`true`: zero allowed): rope
/// bases, epsilons, scaling factors and soft-caps. A value past `f32::MAX` is refused too, as
/// the kernels take them as `f32` (an infinite rope base gives NaN logits).
const FLOAT_PARAMS: &[(&str, bool)] = &[
    ("rope_theta", false),
    ("rope_local_base_freq", false),
    ("rms_norm_eps", true),
    ("layer_norm_eps", true),
    ("norm_eps", true),
    ("layer_norm_epsilon", true),
    ("attn_logit_softcapping", false),
    ("final_logit_softcapping", false),
    ("partial_rotary_factor", false),
];

/// Checks `obj`'s float hyper-parameters (and `rope_scaling.factor`) when they are numbers;
/// errors name the field (`prefix` + key) and the value.
fn check_float_params(obj: &serde_json::Map<String, Value>, prefix: &str) -> Result<()> {
    let check = |field: String, v: &Value, zero_ok: bool| -> Result<()> {
        let Some(x) = v.as_f64() else {
            return Ok(());
        };
        if x.is_finite() && x <= f64::from(f32::MAX) && (x > 0.0 || (zero_ok && x == 0.0)) {
            return Ok(());
        }
        let want = if zero_ok { ">= 0" } else { "> 0" };
        Err(ModelError::Config(format!(
            "`{field}` is {x}; it must be a finite number {want} (at most {:e})",
            f32::MAX
        )))
    };
    for (k, zero_ok) in FLOAT_PARAMS {
        if let Some(v) = obj.get(*k) {
            check(format!("{prefix}{k}"), v, *zero_ok)?;
        }
    }
    for scaling in ["rope_scaling", "rope_parameters"] {
        if let Some(Value::Object(r)) = obj.get(scaling) {
            for k in ["factor", "rope_theta"] {
                if let Some(v) = r.get(k) {
                    check(format!("{prefix}{scaling}.{k}"), v, false)?;
                }
            }
        }
    }
    Ok(())
}

/// Deserializes `T` from a config object; an error names the offending key (serde's own
/// message does not for a wrongly typed value): the first key whose removal makes the
/// arguments parse, or turns the error into that key missing.
pub fn parse_args<T: DeserializeOwned>(raw: &Value, architecture: &str) -> Result<T> {
    serde_json::from_value(raw.clone()).map_err(|e| {
        let culprit = raw.as_object().and_then(|obj| {
            obj.keys()
                .find(|k| {
                    let mut o = obj.clone();
                    o.remove(*k);
                    match serde_json::from_value::<T>(Value::Object(o)) {
                        Ok(_) => true,
                        Err(e2) => e2.to_string().contains(&format!("missing field `{k}`")),
                    }
                })
                .cloned()
        });
        match culprit {
            Some(k) => {
                ModelError::Config(format!("arguments for `{architecture}`: field `{k}`: {e}"))
            }
            None => ModelError::Config(format!("arguments for `{architecture}`: {e}")),
        }
    })
}

fn int_field(v: &Value, key: &str, ctx: &str) -> Result<i32> {
    v.get(key)
        .and_then(Value::as_i64)
        .and_then(|x| i32::try_from(x).ok())
        .ok_or_else(|| ModelError::Config(format!("quantization{ctx}: `{key}` must be an integer")))
}

impl QuantParams {
    fn parse(v: &Value, ctx: &str, default_mode: &str) -> Result<QuantParams> {
        let mode = match v.get("mode") {
            None | Some(Value::Null) => default_mode.to_string(),
            Some(Value::String(m)) => m.clone(),
            Some(other) => {
                return Err(ModelError::Config(format!(
                    "quantization{ctx}: `mode` must be a string, got {other}"
                )))
            }
        };
        // `null` (a `mixed_*` recipe run without `--q-group-size` records it so) and, in a
        // per-module entry, a missing value are the mode's default, as `to_quantized(None)`.
        let (dg, db) = QuantMode::from_name(&mode)
            .map(|m| match m {
                QuantMode::Affine => (64, 4),
                QuantMode::Mxfp4 => (32, 4),
                QuantMode::Nvfp4 => (16, 4),
                QuantMode::Mxfp8 => (32, 8),
            })
            .unwrap_or(if mode == "trellis" {
                (TRELLIS_DEFAULTS.0, TRELLIS_DEFAULTS.1)
            } else {
                (64, 4)
            });
        let field = |key: &str, default: i32| match v.get(key) {
            Some(Value::Null) => Ok(default),
            None if !ctx.is_empty() => Ok(default),
            _ => int_field(v, key, ctx),
        };
        let trellis = if mode == "trellis" {
            let opt = |key: &str| match v.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x.as_u64().map(Some).ok_or_else(|| {
                    ModelError::Config(format!(
                        "quantization{ctx}: `{key}` must be a non-negative integer"
                    ))
                }),
            };
            let l = opt("trellis_l")?.unwrap_or(u64::from(TRELLIS_DEFAULTS.2));
            let trellis_code = match v.get("trellis_code") {
                None | Some(Value::Null) => mlx_core::cpu::trellis::TrellisCode::Mad,
                Some(x) => x
                    .as_str()
                    .and_then(mlx_core::cpu::trellis::TrellisCode::from_name)
                    .ok_or_else(|| {
                        ModelError::Config(format!(
                            "quantization{ctx}: `trellis_code` must be \"1mad\", \"1mad8\", \
                             \"1mad8h\", \"1mad8s\", \"gauss8s\" or \"gauss7s\", got {x}"
                        ))
                    })?,
            };
            Some(TrellisParams {
                trellis_l: u32::try_from(l).unwrap_or(u32::MAX),
                seed: opt("seed")?.unwrap_or(0),
                trellis_code,
            })
        } else {
            None
        };
        let q = QuantParams {
            group_size: field("group_size", dg)?,
            bits: field("bits", db)?,
            mode,
            trellis,
        };
        q.validate()
            .map_err(|m| ModelError::Config(format!("quantization{ctx}: {m}")))?;
        Ok(q)
    }

    /// Checks the mode, bits and group size against what MLX accepts.
    pub fn validate(&self) -> std::result::Result<(), QuantParamsError> {
        if let Some(t) = &self.trellis {
            return Ok(self.trellis_spec(t).check()?);
        }
        let mode = QuantMode::from_name(&self.mode)
            .ok_or_else(|| QuantParamsError::UnknownMode(self.mode.clone()))?;
        Ok(mode.check(self.group_size, self.bits)?)
    }
}

/// Why [`QuantParams::validate`] refuses a quantization entry (the message names the
/// parameter; the caller adds the file and the entry).
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum QuantParamsError {
    /// A `trellis` entry whose code shape does not hold.
    #[error(transparent)]
    Trellis(#[from] mlx_core::cpu::trellis::TrellisError),
    /// A `mode` MLX does not have.
    #[error("unknown `mode` {0:?} (expected affine, mxfp4, nvfp4, mxfp8 or trellis)")]
    UnknownMode(String),
    /// Bits or a group size the mode does not take.
    #[error(transparent)]
    Mode(#[from] mlx_core::quantized::QuantParamError),
}

impl QuantParams {
    /// The trellis code's shape of a `trellis` entry.
    pub fn trellis_spec(&self, t: &TrellisParams) -> mlx_core::cpu::trellis::TrellisSpec {
        mlx_core::cpu::trellis::TrellisSpec {
            k: u32::try_from(self.bits).unwrap_or(0),
            l: t.trellis_l,
            block: usize::try_from(self.group_size).unwrap_or(0),
            code: t.trellis_code,
        }
    }
}

impl QuantConfig {
    fn parse(v: &Value) -> Result<QuantConfig> {
        let obj = v
            .as_object()
            .ok_or_else(|| ModelError::Config("`quantization` must be an object".into()))?;
        let default = QuantParams::parse(v, "", "affine")?;
        let mut overrides = BTreeMap::new();
        for (k, val) in obj {
            match val {
                Value::Bool(false) => {
                    overrides.insert(k.clone(), None);
                }
                Value::Object(_) => {
                    overrides.insert(
                        k.clone(),
                        // `to_quantized(**entry)`: a missing mode is affine, not the top level's.
                        Some(QuantParams::parse(val, &format!(".{k}"), "affine")?),
                    );
                }
                _ => {}
            }
        }
        Ok(QuantConfig { default, overrides })
    }
}

/// JSON as Python's `json.dump` writes it, which (unlike strict JSON) writes the non-finite
/// floats as the bare words `Infinity`, `-Infinity` and `NaN` (transformers' Mamba 2 configs
/// hold `"time_step_limit": [0.0, Infinity]`). Those words, outside strings, are read as the
/// strings `"Infinity"`, `"-Infinity"` and `"NaN"`, which [`py_float`] turns back into
/// floats for the fields that take them.
pub fn parse_python_json(text: &str) -> std::result::Result<Value, serde_json::Error> {
    match serde_json::from_str(text) {
        Ok(v) => Ok(v),
        Err(e) => {
            let quoted = quote_non_finite(text);
            if quoted == text {
                return Err(e);
            }
            serde_json::from_str(&quoted)
        }
    }
}

fn quote_non_finite(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let (mut in_str, mut escaped) = (false, false);
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_str {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_str = false;
            }
            rest = &rest[c.len_utf8()..];
            continue;
        }
        if c == '"' {
            in_str = true;
            out.push(c);
            rest = &rest[1..];
            continue;
        }
        let word = ["-Infinity", "Infinity", "NaN"]
            .into_iter()
            .find(|w| rest.starts_with(w));
        match word {
            Some(w) => {
                out.push('"');
                out.push_str(w);
                out.push('"');
                rest = &rest[w.len()..];
            }
            None => {
                out.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    out
}

/// A float field as Python writes it: a number, or `Infinity`, `-Infinity`, `NaN` (read by
/// [`parse_python_json`] as strings).
pub fn py_float(v: &Value) -> Option<f64> {
    match v {
        Value::String(s) => match s.as_str() {
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            "NaN" => Some(f64::NAN),
            _ => None,
        },
        other => other.as_f64(),
    }
}

/// Serde's `deserialize_with` for a `[low, high]` pair of [`py_float`]s.
pub fn py_float_pair<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<(f64, f64), D::Error> {
    use serde::Deserialize;
    let v = Value::deserialize(d)?;
    match v.as_array().map(|a| a.as_slice()) {
        Some([a, b]) => match (py_float(a), py_float(b)) {
            (Some(a), Some(b)) => Ok((a, b)),
            _ => Err(serde::de::Error::custom(format!(
                "expected two numbers, got {v}"
            ))),
        },
        _ => Err(serde::de::Error::custom(format!(
            "expected [low, high], got {v}"
        ))),
    }
}

#[cfg(test)]
mod python_json_tests {
    use super::*;

    #[test]
    fn python_non_finite_floats_are_read() {
        let v = parse_python_json(
            r#"{"time_step_limit": [0.0, Infinity], "x": -Infinity, "s": "NaN Infinity", "n": NaN}"#,
        )
        .unwrap();
        assert_eq!(v["s"], "NaN Infinity");
        let pair: (f64, f64) = py_float_pair(&v["time_step_limit"]).unwrap();
        assert_eq!(pair, (0.0, f64::INFINITY));
        assert_eq!(py_float(&v["x"]), Some(f64::NEG_INFINITY));
        assert!(py_float(&v["n"]).unwrap().is_nan());
        assert!(parse_python_json("{\"a\": Inf}").is_err());
    }
}

//! mlx-lm's `rope_utils.initialize_rope`: one rotary embedding for every scaling scheme
//! mlx-lm 0.32.2 knows (default, linear, dynamic, llama3, yarn / deepseek_yarn /
//! telechat3-yarn, longrope, proportional, mrope), with the frequency tables computed by the
//! same ops in the same order and dtypes as mlx-lm (Python scalars weak, Python-side
//! arithmetic in f64).

use mlx_core::fast::{self, RopeOffset};
use mlx_core::prelude::*;
use serde_json::{Map, Value};

use crate::error::{ModelError, Result};

/// The `rope_scaling` object of a config.
pub type RopeScaling = Map<String, Value>;

/// A rotary embedding ready to apply.
#[derive(Clone, Debug)]
pub enum Rope {
    /// `nn.RoPE(dims, traditional, base, scale)`.
    Base {
        dims: i32,
        traditional: bool,
        base: f32,
        scale: f32,
    },
    /// A precomputed frequency table (llama3, yarn, longrope, proportional), optionally
    /// multiplying the first `dims` features by `input_scale` first.
    Freqs {
        dims: i32,
        traditional: bool,
        freqs: Array,
        input_scale: Option<f64>,
    },
    /// `DynamicNTKScalingRoPE`: the base depends on the sequence length.
    Dynamic {
        dims: i32,
        max_position_embeddings: i64,
        traditional: bool,
        base: f64,
        factor: f64,
    },
}

fn get_f64(cfg: &RopeScaling, key: &str) -> Option<f64> {
    cfg.get(key).and_then(Value::as_f64)
}

fn need_f64(cfg: &RopeScaling, key: &str) -> Result<f64> {
    get_f64(cfg, key)
        .ok_or_else(|| ModelError::Config(format!("rope_scaling: missing number `{key}`")))
}

fn weak(v: f64, like: &Array) -> Result<Array> {
    Ok(Scalar::from(v).to_array_like(like.dtype())?)
}

/// `base ** (mx.arange(0, dims, 2, dtype) / dims)` with `base` a Python float.
pub(crate) fn base_pow(base: f64, dims: i32, arange_dtype: Dtype) -> Result<Array> {
    let r = ops::arange(0.0, f64::from(dims), 2.0, arange_dtype, None)?;
    let e = ops::divide(
        &r,
        &Scalar::Int(dims.into()).to_array_like(r.dtype())?,
        None,
    )?;
    Ok(ops::power(&weak(base, &e)?, &e, None)?)
}

impl Rope {
    /// `initialize_rope(dims, base, traditional, scaling_config, max_position_embeddings)`.
    pub fn initialize(
        dims: i32,
        base: f64,
        traditional: bool,
        scaling: Option<&RopeScaling>,
        max_position_embeddings: Option<i64>,
    ) -> Result<Rope> {
        let rope_type = scaling
            .and_then(|c| {
                c.get("type")
                    .and_then(Value::as_str)
                    .or_else(|| c.get("rope_type").and_then(Value::as_str))
            })
            .unwrap_or("default");
        let empty = Map::new();
        let cfg = scaling.unwrap_or(&empty);
        if rope_type == "mrope" {
            let n = cfg
                .get("mrope_section")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            if n != 3 {
                return Err(ModelError::Config(format!(
                    "MRoPE currently only supports 3 sections, got {n}."
                )));
            }
        }
        match rope_type {
            "default" | "linear" | "mrope" => {
                let scale = if rope_type == "linear" {
                    1.0 / need_f64(cfg, "factor")?
                } else {
                    1.0
                };
                Ok(Rope::Base {
                    dims,
                    traditional,
                    base: base as f32,
                    scale: scale as f32,
                })
            }
            "dynamic" => Ok(Rope::Dynamic {
                dims,
                max_position_embeddings: max_position_embeddings.ok_or_else(|| {
                    ModelError::Config("dynamic rope needs max_position_embeddings".into())
                })?,
                traditional,
                base,
                factor: need_f64(cfg, "factor")?,
            }),
            "llama3" => Self::llama3(dims, traditional, base, cfg),
            "yarn" | "deepseek_yarn" | "telechat3-yarn" => Self::yarn(dims, traditional, base, cfg),
            "longrope" => Self::longrope(dims, base, cfg, max_position_embeddings),
            "proportional" => {
                let rotated =
                    (f64::from(dims) * get_f64(cfg, "partial_rotary_factor").unwrap_or(1.0)) as i32;
                Self::proportional(
                    dims,
                    rotated,
                    traditional,
                    base,
                    get_f64(cfg, "factor").unwrap_or(1.0),
                )
            }
            other => Err(ModelError::Config(format!(
                "unsupported RoPE type `{other}`"
            ))),
        }
    }

    /// Hunyuan's `DynamicNTKAlphaRoPE`: `base * alpha ** (dims / (dims - 2))` (Python floats),
    /// then `base ** (mx.arange(0, dims, 2) / dims)` as a frequency table.
    pub fn ntk_alpha(dims: i32, base: f64, alpha: f64) -> Result<Rope> {
        let d = f64::from(dims);
        let base = base * alpha.powf(d / (d - 2.0));
        Ok(Rope::Freqs {
            dims,
            traditional: false,
            freqs: base_pow(base, dims, Dtype::Int32)?,
            input_scale: None,
        })
    }

    /// nanochat's table: `-exp(arange(0.0, dims // 2, f32) * (log(base) / (dims // 2)))`.
    pub fn neg_exp(dims: i32, base: f64) -> Result<Rope> {
        let half = dims / 2;
        let ar = ops::arange(0.0, f64::from(half), 1.0, Dtype::Float32, None)?;
        let e = ops::multiply(&ar, &weak(base.ln() / f64::from(half), &ar)?, None)?;
        let freqs = ops::negative(&ops::exp(&e, None)?, None)?;
        Ok(Rope::Freqs {
            dims,
            traditional: false,
            freqs,
            input_scale: None,
        })
    }

    /// Talkie's table: `-(base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims))`, the
    /// NeoX rotation with the opposite sign.
    pub fn neg_pow(dims: i32, base: f64) -> Result<Rope> {
        let freqs = ops::negative(&base_pow(base, dims, Dtype::Float32)?, None)?;
        Ok(Rope::Freqs {
            dims,
            traditional: false,
            freqs,
            input_scale: None,
        })
    }

    fn llama3(dims: i32, traditional: bool, base: f64, cfg: &RopeScaling) -> Result<Rope> {
        let factor = need_f64(cfg, "factor")?;
        let low_freq_factor = get_f64(cfg, "low_freq_factor").unwrap_or(1.0);
        let high_freq_factor = get_f64(cfg, "high_freq_factor").unwrap_or(4.0);
        let old_context_len = get_f64(cfg, "original_max_position_embeddings").unwrap_or(8192.0);
        let low_freq_wavelen = old_context_len / low_freq_factor;
        let high_freq_wavelen = old_context_len / high_freq_factor;

        // freqs = base ** (mx.arange(0, dims, 2) / dims)   (int32 arange)
        let freqs = base_pow(base, dims, Dtype::Int32)?;
        // wavelens = 2 * mx.pi * freqs   ((2 * pi) in Python first)
        let wavelens = ops::multiply(&weak(2.0 * std::f64::consts::PI, &freqs)?, &freqs, None)?;
        let freqs = ops::where_(
            &ops::greater(&wavelens, &weak(low_freq_wavelen, &wavelens)?, None)?,
            &ops::multiply(&freqs, &weak(factor, &freqs)?, None)?,
            &freqs,
            None,
        )?;
        let is_medium = ops::bitwise_and(
            &ops::greater(&wavelens, &weak(high_freq_wavelen, &wavelens)?, None)?,
            &ops::less(&wavelens, &weak(low_freq_wavelen, &wavelens)?, None)?,
            None,
        )?;
        // smooth = (old_context_len / wavelens - low_freq_factor) / (high - low)
        // (A Python int or float numerator: either way a weak scalar of the array's dtype.)
        let ratio = ops::divide(&weak(old_context_len, &wavelens)?, &wavelens, None)?;
        let smooth = ops::divide(
            &ops::subtract(&ratio, &weak(low_freq_factor, &ratio)?, None)?,
            &weak(high_freq_factor - low_freq_factor, &ratio)?,
            None,
        )?;
        // smooth_freqs = freqs / ((1 - smooth) / factor + smooth)
        let one_minus = ops::subtract(
            &Scalar::Int(1).to_array_like(smooth.dtype())?,
            &smooth,
            None,
        )?;
        let denom = ops::add(
            &ops::divide(&one_minus, &weak(factor, &one_minus)?, None)?,
            &smooth,
            None,
        )?;
        let smooth_freqs = ops::divide(&freqs, &denom, None)?;
        let freqs = ops::where_(&is_medium, &smooth_freqs, &freqs, None)?;
        Ok(Rope::Freqs {
            dims,
            traditional,
            freqs,
            input_scale: None,
        })
    }

    fn yarn(dims: i32, traditional: bool, base: f64, cfg: &RopeScaling) -> Result<Rope> {
        let scaling_factor = need_f64(cfg, "factor")?;
        let original = get_f64(cfg, "original_max_position_embeddings").unwrap_or(4096.0);
        let beta_fast = get_f64(cfg, "beta_fast").unwrap_or(32.0);
        let beta_slow = get_f64(cfg, "beta_slow").unwrap_or(1.0);
        let mscale = get_f64(cfg, "mscale").unwrap_or(1.0);
        let mscale_all_dim = get_f64(cfg, "mscale_all_dim").unwrap_or(0.0);
        let d = f64::from(dims);
        let correction_dim = |rot: f64| {
            (d * (original / (rot * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * base.ln())
        };
        let low = correction_dim(beta_fast).floor().max(0.0);
        let high = correction_dim(beta_slow).ceil().min(d - 1.0);
        let get_mscale = |scale: f64, m: f64| {
            if scale <= 1.0 {
                1.0
            } else {
                0.1 * m * scale.ln() + 1.0
            }
        };
        let ms = get_mscale(scaling_factor, mscale) / get_mscale(scaling_factor, mscale_all_dim);

        let freq_extra = base_pow(base, dims, Dtype::Float32)?;
        let freq_inter = ops::multiply(&weak(scaling_factor, &freq_extra)?, &freq_extra, None)?;
        // yarn_linear_ramp_mask(low, high, dims // 2)
        let (min_val, mut max_val) = (low, high);
        if min_val == max_val {
            max_val += 0.001;
        }
        let ar = ops::arange(0.0, f64::from(dims / 2), 1.0, Dtype::Float32, None)?;
        let lin = ops::divide(
            &ops::subtract(&ar, &weak(min_val, &ar)?, None)?,
            &weak(max_val - min_val, &ar)?,
            None,
        )?;
        let ramp = ops::clip(&lin, Some(&weak(0.0, &lin)?), Some(&weak(1.0, &lin)?), None)?;
        // Python ints 0 and 1 in mx.clip are weak ints: same values as float 0 / 1 here.
        let freq_mask = ops::subtract(&weak(1.0, &ramp)?, &ramp, None)?;
        let num = ops::multiply(&freq_inter, &freq_extra, None)?;
        let one_minus = ops::subtract(
            &Scalar::Int(1).to_array_like(freq_mask.dtype())?,
            &freq_mask,
            None,
        )?;
        let den = ops::add(
            &ops::multiply(&freq_inter, &freq_mask, None)?,
            &ops::multiply(&freq_extra, &one_minus, None)?,
            None,
        )?;
        let freqs = ops::divide(&num, &den, None)?;
        Ok(Rope::Freqs {
            dims,
            traditional,
            freqs,
            input_scale: (ms != 1.0).then_some(ms),
        })
    }

    /// `SuScaledRoPE` as `initialize_rope` builds it: `short_factor` and `long_factor` are
    /// required (a `KeyError` in mlx-lm) though only `long_factor` is used, and so is
    /// `max_position_embeddings` (mlx-lm divides it); `long_mscale` / `short_mscale` are not
    /// passed, so the scale is always the default one.
    fn longrope(dims: i32, base: f64, cfg: &RopeScaling, max_pos: Option<i64>) -> Result<Rope> {
        let original = need_f64(cfg, "original_max_position_embeddings")?;
        let max_pos = max_pos.ok_or_else(|| {
            ModelError::Config("longrope rope_scaling needs max_position_embeddings".into())
        })? as f64;
        let factors = |key: &str| -> Result<Vec<f32>> {
            let bad = || {
                ModelError::Config(format!(
                    "rope_scaling: `{key}` must be a number or a list of numbers"
                ))
            };
            match cfg.get(key) {
                None => Err(ModelError::Config(format!(
                    "rope_scaling: longrope needs `{key}`"
                ))),
                Some(Value::Array(v)) => v
                    .iter()
                    .map(|x| x.as_f64().map(|f| f as f32).ok_or_else(bad))
                    .collect(),
                Some(v) => Ok(vec![v.as_f64().ok_or_else(bad)? as f32]),
            }
        };
        factors("short_factor")?;
        let long_factor = factors("long_factor")?;
        if long_factor.len() != 1 && long_factor.len() as i32 != dims / 2 {
            return Err(ModelError::Config(format!(
                "rope_scaling: long_factor has {} entries, expected {} (dims / 2)",
                long_factor.len(),
                dims / 2
            )));
        }
        let freqs = base_pow(base, dims, Dtype::Float32)?;
        let lf = Array::from_slice(&long_factor, &[long_factor.len() as i32])?;
        let lf = if long_factor.len() == 1 {
            lf.reshape(&[])?
        } else {
            lf
        };
        let freqs = ops::multiply(&lf, &freqs, None)?;
        let factor = max_pos / original;
        let scale = if factor <= 1.0 {
            1.0
        } else {
            (1.0 + factor.ln() / original.ln()).sqrt()
        };
        Ok(Rope::Freqs {
            dims,
            traditional: false,
            freqs,
            input_scale: Some(scale),
        })
    }

    fn proportional(
        dims: i32,
        rotated: i32,
        traditional: bool,
        base: f64,
        factor: f64,
    ) -> Result<Rope> {
        if rotated > dims {
            return Err(ModelError::Config(
                "rotated_dims should be smaller than dims".into(),
            ));
        }
        let r = ops::arange(0.0, f64::from(rotated), 2.0, Dtype::Float32, None)?;
        let exps = ops::divide(
            &r,
            &Scalar::Int(dims.into()).to_array_like(r.dtype())?,
            None,
        )?;
        let pw = ops::power(&weak(base, &exps)?, &exps, None)?;
        let head = ops::multiply(&weak(factor, &pw)?, &pw, None)?;
        let n_inf = (dims - rotated) / 2;
        let tail = ops::full(
            &[n_inf],
            &Array::from_f32(f32::INFINITY, Dtype::Float32)?,
            Dtype::Float32,
            None,
        )?;
        let freqs = ops::concatenate(&[&head, &tail], 0, None)?;
        Ok(Rope::Freqs {
            dims,
            traditional,
            freqs,
            input_scale: None,
        })
    }

    /// Applies the embedding to `x` of shape `(batch, heads, seq, head_dim)` at `offset`.
    pub fn forward(&self, x: &Array, offset: usize) -> Result<Array> {
        let off = RopeOffset::Int(i32::try_from(offset).map_err(|_| ModelError::Input {
            what: "rope".into(),
            problem: format!("offset {offset} too large"),
        })?);
        self.apply(x, off, offset)
    }

    /// Applies the embedding with one offset per batch row (`offsets` int32 of shape
    /// `(batch,)`), as mlx-lm does with a batched cache's array `offset`. The dynamic NTK
    /// variant needs a scalar offset (mlx-lm's does too) and is refused.
    pub fn forward_offsets(&self, x: &Array, offsets: &Array) -> Result<Array> {
        if matches!(self, Rope::Dynamic { .. }) {
            return Err(ModelError::Cache {
                what: "dynamic NTK rope".into(),
                problem: "needs a scalar offset; batched caches are not supported".into(),
            });
        }
        self.apply(x, RopeOffset::Array(offsets), 0)
    }

    fn apply(&self, x: &Array, off: RopeOffset<'_>, offset: usize) -> Result<Array> {
        match self {
            Rope::Base {
                dims,
                traditional,
                base,
                scale,
            } => Ok(fast::rope(
                x,
                *dims,
                *traditional,
                Some(*base),
                *scale,
                off,
                None,
                None,
            )?),
            Rope::Freqs {
                dims,
                traditional,
                freqs,
                input_scale,
            } => {
                let x = match input_scale {
                    Some(s) => scale_features(x, *dims, *s)?,
                    None => x.clone(),
                };
                Ok(fast::rope(
                    &x,
                    *dims,
                    *traditional,
                    None,
                    1.0,
                    off,
                    Some(freqs),
                    None,
                )?)
            }
            Rope::Dynamic {
                dims,
                max_position_embeddings,
                traditional,
                base,
                factor,
            } => {
                let seq = x
                    .shape()
                    .get(x.ndim().saturating_sub(2))
                    .copied()
                    .unwrap_or(0) as i64;
                let seq_len = (seq + offset as i64).max(*max_position_embeddings) as f64;
                let d = f64::from(*dims);
                let b = base
                    * ((factor * seq_len / *max_position_embeddings as f64) - (factor - 1.0))
                        .powf(d / (d - 2.0));
                Ok(fast::rope(
                    x,
                    *dims,
                    *traditional,
                    Some(b as f32),
                    1.0,
                    off,
                    None,
                    None,
                )?)
            }
        }
    }

    /// Whether [`Rope::forward_offsets`] works (every variant but dynamic NTK).
    pub fn takes_array_offset(&self) -> bool {
        !matches!(self, Rope::Dynamic { .. })
    }

    pub fn dims(&self) -> i32 {
        match self {
            Rope::Base { dims, .. } | Rope::Freqs { dims, .. } | Rope::Dynamic { dims, .. } => {
                *dims
            }
        }
    }
}

/// `x.at[..., :dims].multiply(s)` (a weak Python float).
fn scale_features(x: &Array, dims: i32, s: f64) -> Result<Array> {
    let last = x.shape().last().copied().unwrap_or(0);
    let scaled = |a: &Array| -> Result<Array> { Ok(ops::multiply(a, &weak(s, a)?, None)?) };
    if dims >= last {
        return scaled(x);
    }
    let ax = x.ndim() as i32 - 1;
    let head = scaled(&ops::slice_axis(x, ax, 0, dims, None)?)?;
    let tail = ops::slice_axis(x, ax, dims, last, None)?;
    Ok(ops::concatenate(&[&head, &tail], ax, None)?)
}

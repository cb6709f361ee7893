//! `nn.Linear` and `nn.QuantizedLinear` as one layer that may be quantized.

use mlx_core::prelude::*;
use mlx_core::quantized::{self, QuantMode};

use crate::config::QuantParams;
use crate::error::{ModelError, Result};
use crate::layers::trellis::TrellisWeight;
use crate::layers::LayerParam;
use crate::weights::Weights;

/// A packed, quantized weight: `(weight, scales, biases)` plus how it was packed.
#[derive(Clone, Debug)]
pub struct QuantizedWeight {
    pub weight: Array,
    pub scales: Array,
    /// Absent for the modes without biases (mxfp4, nvfp4, mxfp8).
    pub biases: Option<Array>,
    pub group_size: i32,
    pub bits: i32,
    pub mode: QuantMode,
    /// The dtype an embedding lookup widens the gathered rows' `scales` and `biases` to before
    /// dequantizing them: set when they were kept in their stored dtype under a load's cast
    /// (an embedding loaded under [`Weights::keep_linear_scales`]), so the rows come out
    /// bit for bit as from scales cast at load (widening is exact), at the cast's dtype,
    /// without a second copy of the table's scales. `None`: dequantize in the scales' dtype.
    pub lookup_dtype: Option<Dtype>,
    /// `biases` is `-2^(bits - 1) x scales` held as MLX's unevaluated product (a GGUF file's
    /// Q4_0 / Q8_0 loaded for the CPU decoder: [`Weights::with_symmetric`]): the MLX forward
    /// computes it where it first uses it (the bits MLX's reader gives), and the CPU decoder
    /// forms each bias from its scale (`mlx_core::cpu::Matrix::symmetric`) without ever
    /// evaluating it, so its memory is never allocated in that run. Handing the biases out
    /// mutably (`parameters_mut`: an update may replace them) clears it, so replaced biases
    /// are read as stored.
    pub symmetric: bool,
}

impl QuantizedWeight {
    /// The packed `weight`, `scales` and (affine) `biases` under `path`, marked quantized:
    /// no gradient reaches them, so full fine-tuning keeps them frozen.
    pub(crate) fn parameters_mut<'a>(&'a mut self, path: &str, out: &mut Vec<LayerParam<'a>>) {
        let QuantizedWeight {
            weight,
            scales,
            biases,
            symmetric,
            ..
        } = self;
        // The biases may be replaced through the handle: read them as stored from now on.
        *symmetric = false;
        LayerParam::push(out, path, "weight", weight, true);
        LayerParam::push(out, path, "scales", scales, true);
        if let Some(b) = biases {
            LayerParam::push(out, path, "biases", b, true);
        }
    }
}

pub(crate) fn quant_mode(mode: &str) -> Result<QuantMode> {
    match mode {
        "affine" => Ok(QuantMode::Affine),
        "mxfp4" => Ok(QuantMode::Mxfp4),
        "nvfp4" => Ok(QuantMode::Nvfp4),
        "mxfp8" => Ok(QuantMode::Mxfp8),
        other => Err(ModelError::Config(format!(
            "unknown quantization mode `{other}`"
        ))),
    }
}

impl QuantizedWeight {
    /// Loads `<path>.weight`, `.scales` (and `.biases` for affine) for a logical
    /// `(rows, cols)` matrix, checking the packed shapes.
    pub fn load(
        w: &mut Weights,
        path: &str,
        rows: i32,
        cols: i32,
        q: &QuantParams,
    ) -> Result<QuantizedWeight> {
        Self::load_as(w, path, rows, cols, q, false)
    }

    /// [`QuantizedWeight::load`] for a linear layer: its scales and biases through
    /// [`Weights::take_linear_scales`].
    pub fn load_linear(
        w: &mut Weights,
        path: &str,
        rows: i32,
        cols: i32,
        q: &QuantParams,
    ) -> Result<QuantizedWeight> {
        Self::load_as(w, path, rows, cols, q, true)
    }

    /// [`QuantizedWeight::load`] for an embedding table: under
    /// [`Weights::keep_linear_scales`] its scales and biases keep their stored dtype too, and
    /// [`QuantizedWeight::lookup_dtype`] says what a lookup widens the gathered rows to (the
    /// load's cast dtype); the tied head's `quantized_matmul` widens them itself, with the
    /// same bits. The CPU decoder reads the stored scales in place.
    pub fn load_embedding(
        w: &mut Weights,
        path: &str,
        rows: i32,
        cols: i32,
        q: &QuantParams,
    ) -> Result<QuantizedWeight> {
        let kept = w.keeps_linear_scales();
        let mut qw = Self::load_as(w, path, rows, cols, q, kept)?;
        if kept {
            qw.lookup_dtype = w
                .cast_dtype()
                .filter(|&d| qw.scales.dtype().is_floating() && qw.scales.dtype() != d);
        }
        Ok(qw)
    }

    fn load_as(
        w: &mut Weights,
        path: &str,
        rows: i32,
        cols: i32,
        q: &QuantParams,
        linear: bool,
    ) -> Result<QuantizedWeight> {
        let mode = quant_mode(&q.mode)?;
        if q.bits <= 0
            || q.group_size <= 0
            || (i64::from(cols) * i64::from(q.bits)) % 32 != 0
            || cols % q.group_size != 0
        {
            return Err(ModelError::Config(format!(
                "{path}: {cols} columns cannot be packed with {} bits in groups of {}",
                q.bits, q.group_size
            )));
        }
        let packed = (i64::from(cols) * i64::from(q.bits) / 32) as i32;
        let weight = w.take(&format!("{path}.weight"), &[rows, packed])?;
        let shape = [rows, cols / q.group_size];
        let biases_name = format!("{path}.biases");
        let symmetric = mode == QuantMode::Affine && w.is_symmetric_biases(&biases_name);
        let mut take = |name: String| {
            if linear {
                w.take_linear_scales(&name, &shape)
            } else {
                w.take(&name, &shape)
            }
        };
        let scales = take(format!("{path}.scales"))?;
        let biases = if mode == QuantMode::Affine {
            Some(take(biases_name)?)
        } else {
            None
        };
        Ok(QuantizedWeight {
            weight,
            scales,
            biases,
            group_size: q.group_size,
            bits: q.bits,
            mode,
            lookup_dtype: None,
            symmetric,
        })
    }

    /// `mx.quantized_matmul(x, w, scales, biases, transpose=True, ...)`.
    pub fn matmul_t(&self, x: &Array) -> Result<Array> {
        Ok(quantized::quantized_matmul(
            x,
            &self.weight,
            &self.scales,
            self.biases.as_ref(),
            true,
            self.group_size,
            self.bits,
            self.mode,
            None,
        )?)
    }
}

/// A layer that replaces a [`Linear`] in a model and computes its output itself, usually
/// from the linear it wraps (LoRA and DoRA in `mlx-train`, as mlx-lm's tuner swaps a module).
pub trait LinearAdapter: Send + std::fmt::Debug {
    fn forward(&self, x: &Array) -> Result<Array>;
    fn clone_box(&self) -> Box<dyn LinearAdapter>;
    /// The wrapped linear.
    fn base(&self) -> &Linear;
    /// For downcasting to the concrete adapter.
    fn as_any(&self) -> &dyn std::any::Any;
    /// The adapter's trainable arrays, for transforms that must see them as inputs
    /// (per-layer gradient checkpointing).
    fn parameters(&self) -> Result<Vec<Array>> {
        Ok(Vec::new())
    }
    /// Replaces the arrays [`LinearAdapter::parameters`] returned (same order).
    fn set_parameters(&self, _values: &[Array]) -> Result<()> {
        Ok(())
    }
}

/// `y = x W^T (+ b)`, dense or quantized, or an adapter standing in for one.
#[derive(Clone, Debug)]
pub enum Linear {
    Dense {
        weight: Array,
        bias: Option<Array>,
    },
    Quantized {
        weight: QuantizedWeight,
        bias: Option<Array>,
    },
    /// `TrellisLinear`: a trellis-coded weight (`"mode": "trellis"`).
    Trellis {
        weight: Box<TrellisWeight>,
        bias: Option<Array>,
    },
    /// GGML blocks kept from a GGUF file for the CPU decoder (`GgufTensors::Blocks`).
    Ggml {
        weight: Box<crate::layers::GgmlWeight>,
        bias: Option<Array>,
    },
    Adapted(Box<dyn LinearAdapter>),
}

impl Clone for Box<dyn LinearAdapter> {
    fn clone(&self) -> Self {
        self.clone_box()
    }
}

impl Linear {
    /// Loads the layer at `path` (`<path>.weight`, optional `<path>.bias`), quantized when
    /// mlx-lm would quantize it (see [`Weights::quantization`]).
    pub fn load(
        w: &mut Weights,
        path: &str,
        in_dims: i32,
        out_dims: i32,
        bias: bool,
    ) -> Result<Linear> {
        let b = if bias {
            Some(w.take(&format!("{path}.bias"), &[out_dims])?)
        } else {
            None
        };
        let q = w.linear_quantization(path, in_dims)?;
        if let Some(g) = w.take_ggml(&format!("{path}.weight"), out_dims, in_dims)? {
            return Ok(Linear::Ggml {
                weight: Box::new(g),
                bias: b,
            });
        }
        match q {
            Some(q) if q.trellis.is_some() => {
                let t = q.trellis.unwrap_or(crate::config::TrellisParams {
                    trellis_l: 0,
                    seed: 0,
                    trellis_code: Default::default(),
                });
                Ok(Linear::Trellis {
                    weight: Box::new(TrellisWeight::load(w, path, out_dims, in_dims, &q, &t)?),
                    bias: b,
                })
            }
            Some(q) => Ok(Linear::Quantized {
                weight: QuantizedWeight::load_linear(w, path, out_dims, in_dims, &q)?,
                bias: b,
            }),
            None => Ok(Linear::Dense {
                weight: w.take(&format!("{path}.weight"), &[out_dims, in_dims])?,
                bias: b,
            }),
        }
    }

    /// The layer's arrays under `path` as mlx names them: `weight`, `bias`; a quantized
    /// layer's `weight`, `scales`, `biases` and `bias`, marked quantized. An adapted linear
    /// has none of its own to give (an error).
    pub fn parameters_mut<'a>(
        &'a mut self,
        path: &str,
        out: &mut Vec<LayerParam<'a>>,
    ) -> Result<()> {
        let (bias, quantized) = match self {
            Linear::Dense { weight, bias } => {
                LayerParam::push(out, path, "weight", weight, false);
                (bias, false)
            }
            Linear::Quantized { weight, bias } => {
                weight.parameters_mut(path, out);
                (bias, true)
            }
            Linear::Trellis { weight, bias } => {
                weight.parameters_mut(path, out);
                (bias, true)
            }
            Linear::Ggml { weight, bias } => {
                LayerParam::push(out, path, "weight", &mut weight.data, true);
                (bias, true)
            }
            Linear::Adapted(_) => {
                return Err(ModelError::Unsupported {
                    what: path.to_string(),
                    problem: "an adapted linear has no parameters of its own".into(),
                })
            }
        };
        if let Some(b) = bias {
            LayerParam::push(out, path, "bias", b, quantized);
        }
        Ok(())
    }

    /// `(output_dims, input_dims)` of the logical (dequantized) weight.
    pub fn dims(&self) -> Result<(i32, i32)> {
        match self {
            Linear::Dense { weight, .. } => {
                let s = weight.shape();
                Ok((s[0], s[1]))
            }
            Linear::Quantized { weight, .. } => {
                let s = weight.weight.shape();
                Ok((s[0], s[1] * 32 / weight.bits))
            }
            Linear::Trellis { weight, .. } => Ok((weight.rows, weight.cols)),
            Linear::Ggml { weight, .. } => Ok((weight.rows, weight.cols)),
            Linear::Adapted(a) => a.base().dims(),
        }
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Linear::Adapted(a) => a.forward(x),
            Linear::Dense {
                weight,
                bias: Some(b),
            } => Ok(ops::addmm(
                b,
                x,
                &ops::transpose_all(weight, None)?,
                1.0,
                1.0,
                None,
            )?),
            Linear::Dense { weight, bias: None } => {
                Ok(ops::matmul(x, &ops::transpose_all(weight, None)?, None)?)
            }
            Linear::Ggml { weight, bias } => {
                let y = weight.matmul_t(x)?;
                match bias {
                    Some(b) => Ok((&y + b)?),
                    None => Ok(y),
                }
            }
            Linear::Trellis { weight, bias } => {
                let y = weight.matmul_t(x)?;
                match bias {
                    Some(b) => Ok((&y + b)?),
                    None => Ok(y),
                }
            }
            Linear::Quantized { weight, bias } => {
                let y = weight.matmul_t(x)?;
                match bias {
                    Some(b) => Ok((&y + b)?),
                    None => Ok(y),
                }
            }
        }
    }
}

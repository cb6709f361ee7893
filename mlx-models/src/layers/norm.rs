//! `nn.RMSNorm` and `nn.LayerNorm` over MLX's fused kernels.

use mlx_core::fast;
use mlx_core::prelude::*;

use crate::error::Result;
use crate::layers::LayerParam;
use crate::weights::Weights;

#[derive(Clone, Debug)]
pub struct RmsNorm {
    pub weight: Array,
    pub eps: f32,
}

impl RmsNorm {
    pub fn load(w: &mut Weights, path: &str, dims: i32, eps: f32) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: w.take(&format!("{path}.weight"), &[dims])?,
            eps,
        })
    }

    /// `weight` under `path`, for full fine-tuning.
    pub fn parameters_mut<'a>(&'a mut self, path: &str, out: &mut Vec<LayerParam<'a>>) {
        LayerParam::push(out, path, "weight", &mut self.weight, false);
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(fast::rms_norm(x, Some(&self.weight), self.eps, None)?)
    }
}

#[derive(Clone, Debug)]
pub struct LayerNorm {
    pub weight: Option<Array>,
    pub bias: Option<Array>,
    pub eps: f32,
}

impl LayerNorm {
    pub fn load(
        w: &mut Weights,
        path: &str,
        dims: i32,
        eps: f32,
        affine: bool,
        bias: bool,
    ) -> Result<LayerNorm> {
        let weight = if affine {
            Some(w.take(&format!("{path}.weight"), &[dims])?)
        } else {
            None
        };
        let bias = if affine && bias {
            Some(w.take(&format!("{path}.bias"), &[dims])?)
        } else {
            None
        };
        Ok(LayerNorm { weight, bias, eps })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(fast::layer_norm(
            x,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
            None,
        )?)
    }
}

/// Which normalization a descriptor asks for (mlx-lm's spellings in brackets).
#[derive(serde::Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    /// `nn.RMSNorm`.
    Rms,
    /// Gemma's `RMSNorm`: `rms_norm(x, 1.0 + weight)`.
    RmsOffset,
    /// `mx.fast.rms_norm(x, None, eps)`: no weight.
    RmsNoWeight,
    /// `nn.LayerNorm(dims, eps, bias=...)`.
    Layer { bias: bool },
    /// Nemotron's `LayerNorm1P`: `layer_norm(x, weight + 1, bias)`.
    LayerOffset { bias: bool },
    /// `nn.LayerNorm(dims, affine=False)`: no weight, no bias (OLMo).
    LayerNoAffine,
}

/// A normalization layer of any [`NormKind`]. The offset kinds keep `weight` as the file
/// stores it (mlx-lm's parameter, which full fine-tuning trains) and add the `1` at every call,
/// where mlx-lm adds it.
#[derive(Clone, Debug)]
pub enum Norm {
    Rms(RmsNorm),
    /// Gemma's `RMSNorm`: `rms_norm(x, 1.0 + weight, eps)`.
    RmsOffset(RmsNorm),
    RmsNoWeight {
        eps: f32,
    },
    Layer(LayerNorm),
    /// Nemotron's `LayerNorm1P`: `layer_norm(x, weight + 1, bias, eps)`.
    LayerOffset(LayerNorm),
    /// PLaMo 3's `RMSNorm(offset=...)`: `rms_norm(x, weight + offset, eps)`, the offset a
    /// weak Python float (the weight's dtype).
    RmsPlus(RmsNorm, f32),
    /// Gear's `GearRMSNorm`: `rms_norm(x, (1.0 + weight).astype(x.dtype), eps)`.
    RmsOffsetCast(RmsNorm),
}

impl Norm {
    pub fn load(w: &mut Weights, path: &str, kind: NormKind, dims: i32, eps: f32) -> Result<Norm> {
        let layer =
            |w: &mut Weights, affine, bias| LayerNorm::load(w, path, dims, eps, affine, bias);
        Ok(match kind {
            NormKind::Rms => Norm::Rms(RmsNorm::load(w, path, dims, eps)?),
            NormKind::RmsOffset => Norm::RmsOffset(RmsNorm::load(w, path, dims, eps)?),
            NormKind::RmsNoWeight => Norm::RmsNoWeight { eps },
            NormKind::Layer { bias } => Norm::Layer(layer(w, true, bias)?),
            NormKind::LayerOffset { bias } => Norm::LayerOffset(layer(w, true, bias)?),
            NormKind::LayerNoAffine => Norm::Layer(layer(w, false, false)?),
        })
    }

    /// [`Norm::RmsPlus`]: an RMSNorm whose scale is `weight + offset`.
    pub fn load_rms_plus(
        w: &mut Weights,
        path: &str,
        dims: i32,
        eps: f32,
        offset: f32,
    ) -> Result<Norm> {
        Ok(Norm::RmsPlus(RmsNorm::load(w, path, dims, eps)?, offset))
    }

    /// The plain `nn.RMSNorm` inside, when it is one.
    pub fn as_rms(&self) -> Option<&RmsNorm> {
        match self {
            Norm::Rms(n) => Some(n),
            _ => None,
        }
    }

    /// The norm's arrays under `path` (`weight`, `bias`), as mlx-lm names and stores them.
    pub fn parameters_mut<'a>(&'a mut self, path: &str, out: &mut Vec<LayerParam<'a>>) {
        match self {
            Norm::Rms(n) | Norm::RmsOffset(n) | Norm::RmsPlus(n, _) | Norm::RmsOffsetCast(n) => {
                n.parameters_mut(path, out)
            }
            Norm::RmsNoWeight { .. } => {}
            Norm::Layer(n) | Norm::LayerOffset(n) => {
                if let Some(w) = &mut n.weight {
                    LayerParam::push(out, path, "weight", w, false);
                }
                if let Some(b) = &mut n.bias {
                    LayerParam::push(out, path, "bias", b, false);
                }
            }
        }
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Norm::Rms(n) => n.forward(x),
            // `1.0 + self.weight`: a weak Python float, so the weight's dtype.
            Norm::RmsOffset(n) => Ok(fast::rms_norm(
                x,
                Some(&(1.0f32 + &n.weight)?),
                n.eps,
                None,
            )?),
            Norm::RmsNoWeight { eps } => Ok(fast::rms_norm(x, None, *eps, None)?),
            Norm::RmsPlus(n, offset) => Ok(fast::rms_norm(
                x,
                Some(&(&n.weight + *offset)?),
                n.eps,
                None,
            )?),
            Norm::RmsOffsetCast(n) => {
                let weight = (1.0f32 + &n.weight)?.astype(x.dtype())?;
                Ok(fast::rms_norm(x, Some(&weight), n.eps, None)?)
            }
            Norm::Layer(n) => n.forward(x),
            // `self.weight + 1`: a weak Python int, so the weight's dtype.
            Norm::LayerOffset(n) => {
                let weight = n.weight.as_ref().map(|w| w + 1).transpose()?;
                Ok(fast::layer_norm(
                    x,
                    weight.as_ref(),
                    n.bias.as_ref(),
                    n.eps,
                    None,
                )?)
            }
        }
    }
}

//! `nn.RMSNorm` and `nn.LayerNorm` over MLX's fused kernels.

use mlx_core::fast;
use mlx_core::prelude::*;

use crate::error::Result;
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

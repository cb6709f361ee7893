//! The MLP variants: SwiGLU (llama), GeGLU (gemma), plain GELU.

use mlx_core::prelude::*;

use crate::error::Result;
use crate::layers::activations::{gelu, gelu_approx, swiglu};
use crate::layers::linear::Linear;
use crate::weights::Weights;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlpKind {
    /// `down(silu(gate(x)) * up(x))`.
    SwiGlu,
    /// `down(gelu_approx(gate(x)) * up(x))`.
    GeGlu,
    /// `fc2(gelu(fc1(x)))`, with `up_proj` / `down_proj` names.
    Gelu,
}

#[derive(Clone, Debug)]
pub struct Mlp {
    pub kind: MlpKind,
    pub gate_proj: Option<Linear>,
    pub up_proj: Linear,
    pub down_proj: Linear,
}

impl Mlp {
    pub fn load(
        w: &mut Weights,
        path: &str,
        dim: i32,
        hidden: i32,
        bias: bool,
        kind: MlpKind,
    ) -> Result<Mlp> {
        let gate_proj = match kind {
            MlpKind::Gelu => None,
            _ => Some(Linear::load(
                w,
                &format!("{path}.gate_proj"),
                dim,
                hidden,
                bias,
            )?),
        };
        let down_proj = Linear::load(w, &format!("{path}.down_proj"), hidden, dim, bias)?;
        let up_proj = Linear::load(w, &format!("{path}.up_proj"), dim, hidden, bias)?;
        Ok(Mlp {
            kind,
            gate_proj,
            up_proj,
            down_proj,
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let h = match (&self.gate_proj, self.kind) {
            (Some(g), MlpKind::SwiGlu) => swiglu(&g.forward(x)?, &self.up_proj.forward(x)?)?,
            (Some(g), MlpKind::GeGlu) => {
                (&gelu_approx(&g.forward(x)?)? * &self.up_proj.forward(x)?)?
            }
            _ => gelu(&self.up_proj.forward(x)?)?,
        };
        self.down_proj.forward(&h)
    }
}

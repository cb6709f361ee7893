//! Reusable layers, each a port of its mlx / mlx-lm counterpart with the same op order.

pub(crate) mod activations;
mod attention;
mod embedding;
pub mod gated_delta;
pub mod ggml;
mod linear;
pub mod mla;
mod mlp;
mod norm;
mod rope;
pub mod ssm;
mod switch;
pub mod trellis;
mod walk;

pub use activations::{
    clip_residual, geglu, gelu, gelu_approx, gelu_topk, logit_softcap, precise_swiglu, relu2, silu,
    situ, softcap, swiglu, swiglu_oai, xielu,
};
pub(crate) use attention::finfo_min;
pub use attention::{
    bucketed_scaled_dot_product_attention, plain_scaled_dot_product_attention,
    quantized_scaled_dot_product_attention, scaled_dot_product_attention, with_dense_attention,
    DenseAttention,
};
pub use embedding::{Embedding, EmbeddingAdapter};
pub use ggml::GgmlWeight;
pub use linear::{
    dense_prompt, with_dense_prompt, DensePrompt, Linear, LinearAdapter, QuantizedWeight,
};
pub use mlp::{join, Mlp, MlpKind, MlpNames};
pub use norm::{LayerNorm, Norm, NormKind, RmsNorm};
pub(crate) use rope::base_pow;
pub use rope::{Rope, RopeScaling};
pub use switch::{
    clamped_swiglu, SwitchActivation, SwitchAdapter, SwitchGlu, SwitchLinear, SwitchMlp,
};
pub use trellis::{set_trellis_decode, TrellisDecode, TrellisWeight};
pub use walk::{Walk, Walkable};

use mlx_core::prelude::Array;

use crate::error::Result;

/// A layer module adapters can replace: a linear or a switch (per-expert) linear.
#[derive(Debug)]
pub enum LinearMut<'a> {
    Linear(&'a mut Linear),
    Switch(&'a mut SwitchLinear),
}

impl LinearMut<'_> {
    /// The trainable arrays of the adapter standing in for the layer (none when it is not
    /// adapted).
    pub fn adapter_parameters(&self) -> Result<Vec<Array>> {
        match self {
            LinearMut::Linear(Linear::Adapted(a)) => a.parameters(),
            LinearMut::Switch(SwitchLinear::Adapted(a)) => a.parameters(),
            _ => Ok(Vec::new()),
        }
    }

    /// Replaces the arrays [`LinearMut::adapter_parameters`] returned (same order).
    pub fn set_adapter_parameters(&self, values: &[Array]) -> Result<()> {
        match self {
            LinearMut::Linear(Linear::Adapted(a)) => a.set_parameters(values),
            LinearMut::Switch(SwitchLinear::Adapted(a)) => a.set_parameters(values),
            _ => Ok(()),
        }
    }
}

/// One parameter array of a decoder layer under its full mlx-lm name
/// (`model.layers.3.self_attn.q_proj.weight`), for full fine-tuning (`mlx-train`), which
/// reads and replaces it in place.
#[derive(Debug)]
pub struct LayerParam<'a> {
    pub name: String,
    pub value: &'a mut Array,
    /// Part of a quantized linear (packed weight, scales, biases, or its bias): no gradient
    /// flows into it, so it stays frozen.
    pub quantized: bool,
}

impl<'a> LayerParam<'a> {
    pub(crate) fn push(
        out: &mut Vec<LayerParam<'a>>,
        path: &str,
        leaf: &str,
        value: &'a mut Array,
        quantized: bool,
    ) {
        out.push(LayerParam {
            name: join(path, leaf),
            value,
            quantized,
        });
    }
}

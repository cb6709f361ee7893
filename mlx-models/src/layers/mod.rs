//! Reusable layers, each a port of its mlx / mlx-lm counterpart with the same op order.

mod activations;
mod attention;
mod embedding;
pub mod gated_delta;
mod linear;
mod mlp;
mod norm;
mod rope;
mod switch;

pub use activations::{geglu, gelu, gelu_approx, logit_softcap, silu, swiglu};
pub(crate) use attention::finfo_min;
pub use attention::{
    quantized_scaled_dot_product_attention, scaled_dot_product_attention, with_dense_attention,
    DenseAttention,
};
pub use embedding::Embedding;
pub use linear::{Linear, LinearAdapter, QuantizedWeight};
pub use mlp::{join, Mlp, MlpKind, MlpNames};
pub use norm::{LayerNorm, Norm, NormKind, RmsNorm};
pub use rope::{Rope, RopeScaling};
pub use switch::{SwitchActivation, SwitchGlu, SwitchLinear};

//! Reusable layers, each a port of its mlx / mlx-lm counterpart with the same op order.

mod activations;
mod attention;
mod embedding;
mod linear;
mod mlp;
mod norm;
mod rope;

pub use activations::{gelu, gelu_approx, silu, swiglu};
pub use attention::{quantized_scaled_dot_product_attention, scaled_dot_product_attention};
pub use embedding::Embedding;
pub use linear::{Linear, LinearAdapter, QuantizedWeight};
pub use mlp::{Mlp, MlpKind};
pub use norm::{LayerNorm, RmsNorm};
pub use rope::{Rope, RopeScaling};

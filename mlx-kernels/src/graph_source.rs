//! The graph decoder's base CUDA source (`graph_decode.cu`: the step's kernels and the device
//! helpers). [`crate::graph_decode`] compiles it with the extra sources a model needs, and
//! [`crate::graph_trellis`] appends its trellis kernels to it (they use its helpers); it sits
//! apart so that graph_trellis does not read graph_decode, which reads graph_trellis.

/// The kernels' CUDA source.
pub const SOURCE: &str = include_str!("graph_decode.cu");

//! [`FlashSpec`]: which keys each query of flash attention sees, its scale and its tiles. It
//! sits apart from [`crate::flash_attention`] because both that plain-ops path and its CUDA
//! path ([`crate::flash_cuda`]) read it, and the plain-ops path calls the CUDA one.

/// Which keys each query attends to, the softmax scale and the tile sizes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlashSpec {
    pub scale: f32,
    /// Causal: query at position `p` sees keys `0..=p`.
    pub causal: bool,
    /// Sliding window (needs `causal`): query at `p` sees keys `p - window + 1 ..= p`.
    pub window: Option<i32>,
    /// Queries per tile.
    pub block_q: i32,
    /// Keys per tile.
    pub block_k: i32,
}

impl FlashSpec {
    /// Causal attention with square tiles of `block` tokens.
    pub fn causal(scale: f32, block: i32) -> FlashSpec {
        FlashSpec {
            scale,
            causal: true,
            window: None,
            block_q: block,
            block_k: block,
        }
    }
}

//! XVERSE as llama.cpp's `XverseModel` writes it (`xverse`), for mlx-lm's `llama` (which
//! mlx-lm's MODEL_REMAPPING serves `xverse` as): llama's tensors, Q / K rows permuted.

use std::path::Path;

use serde_json::Value;

use super::gguf_err;
use crate::error::Result;

/// The converter permutes K with `heads / kv_heads` heads where the two differ (its
/// `_reverse_hf_permute`), llama's permutation (undone by the row's `permute_qk`) only when
/// that equals `kv_heads`: another grouping is refused, naming the key.
pub(super) fn config(config: &Value, path: &Path, heads: i32, kv_heads: i32) -> Result<()> {
    if kv_heads != heads && heads / kv_heads.max(1) != kv_heads {
        return Err(gguf_err(
            path,
            format!(
                "metadata `xverse.attention.head_count_kv` = {kv_heads}: XverseModel permutes K \
                 with {heads} / {kv_heads} heads, which is not llama's permutation (undone \
                 here) for this grouping"
            ),
        ));
    }
    super::require_context(config, path, "xverse.context_length")
}

//! Fused kernels, each with a plain-ops reference and a stated parity tier.
//!
//! Not implemented yet: this crate is a placeholder in the workspace layout so that later
//! work lands where the design puts it. It exports nothing.
#![forbid(unsafe_code)]

//! mlx-models's integration tests as one test binary: each file of `tests/` is a module here,
//! so that the workspace links one test executable per crate instead of one per file (disk
//! and link time on CI's 2-core machine). Files that need a process of their own (the
//! global PRNG key, environment variables, re-running the test executable) or a feature
//! are separate `[[test]]` targets in Cargo.toml; xtask's `every_test_file_is_built`
//! checks that no file of `tests/` is left out of both.

mod model_check;

mod dense2_goldens;
mod dense_goldens;
mod gated_delta_parity;
mod gguf_dense;
mod gguf_dequant;
mod gguf_kquant;
mod hybrid_rollback;
mod layer_walk;
mod llama_goldens;
mod loading_errors;
mod mla_goldens;
mod models_goldens;
mod moe2_goldens;
mod moe_hybrid_errors;
mod phi3small_goldens;
mod rope_goldens;
mod ssm_goldens;
mod trellis;

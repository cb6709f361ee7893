//! mlx-cli's integration tests as one test binary: each file of `tests/` is a module here,
//! so that the workspace links one test executable per crate instead of one per file (disk
//! and link time on CI's 2-core machine). Files that need a process of their own (the
//! global PRNG key, environment variables, re-running the test executable) or a feature
//! are separate `[[test]]` targets in Cargo.toml; xtask's `every_test_file_is_built`
//! checks that no file of `tests/` is left out of both.

#[path = "support/cli_golden.rs"]
mod cli_golden;
#[path = "support/model_output.rs"]
mod model_output;
mod support;

mod cache_prompt_partial;
mod cli;
mod convert;
mod dense2_cli;
mod gemma3_gguf_cli;
mod hub;
mod install;
mod json_schema;
mod launch;
mod loader;
mod models_cli;
mod moe2_cli;
mod parity;
mod perplexity;
mod phi3small_cli;
mod quant;
mod readme;
mod speculative;
mod ssm_cli;
mod trellis_cli;

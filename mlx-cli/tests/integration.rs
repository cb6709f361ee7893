//! mlx-cli's integration tests as one test binary: each file of `tests/` is a module here,
//! so that the workspace links one test executable per crate instead of one per file (disk
//! and link time on CI's 2-core machine). Files that need a process of their own (the
//! global PRNG key, environment variables, re-running the test executable) or a feature
//! are separate `[[test]]` targets in Cargo.toml; `every_test_file_is_built` checks that no
//! file of `tests/` is left out of both.

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

/// Every `tests/*.rs` file is a module of this binary or a `[[test]]` target of its own:
/// with `autotests = false`, a new file would otherwise silently not be built.
#[test]
fn every_test_file_is_built() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    let this = include_str!("integration.rs");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(dir.join("tests")).unwrap() {
        let path = entry.unwrap().path();
        let (Some(stem), Some("rs")) = (
            path.file_stem().and_then(|s| s.to_str()),
            path.extension().and_then(|s| s.to_str()),
        ) else {
            continue;
        };
        let module = format!("\nmod {stem};");
        let target = format!("path = \"tests/{stem}.rs\"");
        if stem != "integration" && !this.contains(&module) && !manifest.contains(&target) {
            missing.push(stem.to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "tests/ files built by no target (add `mod NAME;` to tests/integration.rs): {missing:?}"
    );
}

//! `cargo xtask <command>`: project automation.
//!
//! - `bindgen`: regenerate `mlx-sys/src/bindings.rs` from the shim's headers (needs libclang;
//!   nothing else in the build does). `bindgen --check` fails if the committed file is stale.
#![forbid(unsafe_code)]

mod bindings;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("bindgen") => bindings::run(args.iter().any(|a| a == "--check")),
        _ => {
            eprintln!("usage: cargo xtask bindgen [--check]");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

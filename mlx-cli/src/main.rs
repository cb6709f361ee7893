//! The `mlx` binary: everything is in the library (`mlx_cli`), so that the command line's
//! parsing and validation can be called in-process (tests, `mlx-fuzz`).
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    mlx_cli::main(std::env::args_os())
}

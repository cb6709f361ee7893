//! `mlx-serve --model DIR`: the server over a model directory, without the `mlx` CLI (tests
//! and benchmarks start it on an ephemeral port with `--port 0`).
#![forbid(unsafe_code)]

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "mlx-serve",
    about = "An OpenAI-compatible server for an MLX model directory"
)]
struct Cli {
    #[command(flatten)]
    serve: mlx_server::ServeArgs,
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = mlx_server::run(cli.serve, mlx_server::load_model_dir) {
        eprintln!("mlx serve: {e}");
        std::process::exit(1);
    }
}

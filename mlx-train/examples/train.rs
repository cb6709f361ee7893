//! The `train` and `fuse` commands on their own, until the `mlx` binary wires them in:
//! `cargo run -p mlx-train --example train -- train --model DIR --data DIR ...` (the options of
//! `mlx_lm.lora`), `... -- fuse --model DIR --adapter-path DIR --save-path DIR`.

use clap::Parser;
use mlx_train::cli::{run, run_fuse, FuseArgs, TrainArgs};

#[derive(Parser)]
enum Cli {
    /// LoRA or QLoRA finetuning (mlx_lm.lora).
    Train(Box<TrainArgs>),
    /// Fuse adapters into the base model (mlx_lm.fuse).
    Fuse(FuseArgs),
}

fn main() {
    let r = match Cli::parse() {
        Cli::Train(a) => run(&a),
        Cli::Fuse(a) => run_fuse(&a),
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

//! `mlx`: generate text, chat, serve and fine-tune language models on MLX, with results identical to
//! mlx-lm's command-line tools (see the workspace README).
//!
//! One module per subcommand, each with its `clap::Args` struct and a `run`; [`Command`] has one
//! variant per subcommand. Shared flag groups live in `common`, model loading in `model`,
//! progress bars in `progress`.
#![forbid(unsafe_code)]

mod cache_prompt;
mod chat;
mod common;
mod embed;
mod generate;
mod info;
mod model;
mod models;
mod progress;
mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Generate text with a language model on MLX (results identical to mlx-lm 0.32.2).
#[derive(Parser, Debug)]
#[command(name = "mlx", version, about, args_override_self = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per run: the size difference between the variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Generate a reply to a prompt (as `mlx_lm.generate`).
    Generate(generate::GenerateArgs),
    /// Chat in the terminal, one growing cache over the turns (as `mlx_lm.chat`).
    Chat(chat::ChatArgs),
    /// Run a prompt through the model and save its KV cache to a file that `mlx generate
    /// --prompt-cache-file` and `mlx_lm.generate --prompt-cache-file` read (as
    /// `mlx_lm.cache_prompt`).
    CachePrompt(cache_prompt::CachePromptArgs),
    /// Serve the model over an OpenAI-compatible HTTP API with continuous batching (as
    /// `mlx_lm.server`).
    Serve(mlx_server::ServeArgs),
    /// Fine-tune LoRA or DoRA adapters (as `mlx_lm.lora`), with SFT, DPO or ORPO.
    Train(mlx_train::cli::TrainArgs),
    /// Fuse trained adapters into the base model (as `mlx_lm.fuse`).
    Fuse(mlx_train::cli::FuseArgs),
    /// List every supported model_type and how it is served (descriptor table or dedicated port).
    Models(models::ModelsArgs),
    /// Sentence embeddings of texts as JSON vectors (last-token pooling, L2-normalised, as
    /// sentence-transformers computes them for Qwen3-Embedding-style models).
    Embed(embed::EmbedArgs),
    /// Describe a model directory: resolved descriptor, parameters, dtypes, quantization.
    Info(info::InfoArgs),
}

/// The first argument that is not valid UTF-8, as an error naming it (clap's own message does
/// not say which one).
fn check_utf8() -> Result<(), String> {
    for (i, a) in std::env::args_os().enumerate().skip(1) {
        if a.to_str().is_none() {
            return Err(format!(
                "argument {i} ({:?}) is not valid UTF-8; arguments must be UTF-8 text",
                a.to_string_lossy()
            ));
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    if let Err(e) = check_utf8() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Generate(a) => generate::run(&a),
        Command::Chat(a) => chat::run(&a),
        Command::CachePrompt(a) => cache_prompt::run(&a),
        Command::Serve(a) => serve::run(a),
        Command::Train(a) => mlx_train::cli::run(&a).map_err(|e| e.to_string()),
        Command::Fuse(a) => mlx_train::cli::run_fuse(&a).map_err(|e| e.to_string()),
        Command::Models(a) => models::run(&a),
        Command::Info(a) => info::run(&a),
        Command::Embed(a) => embed::run(&a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}

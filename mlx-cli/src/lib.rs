//! `mlx`: generate text, chat, serve and fine-tune language models on MLX, with results identical to
//! mlx-lm's command-line tools (see the workspace README).
//!
//! One module per subcommand, each with its `clap::Args` struct and a `run`; [`Command`] has one
//! variant per subcommand. Shared flag groups live in `common`, model loading in `model`,
//! progress bars in `progress`. [`check`] is the command line's parse-and-validate layer: the
//! real clap parser plus every check that needs no model and no network, callable on any
//! argument vector (the `mlx` binary runs it first; `mlx-fuzz`'s `argv` target fuzzes it).
#![forbid(unsafe_code)]

mod benchmark;
mod cache_prompt;
mod chat;
pub mod check;
mod common;
mod completions;
mod convert;
mod embed;
mod generate;
mod info;
mod launch;
mod manage;
mod model;
mod models;
mod perplexity;
mod progress;
mod quant;
mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Generate text with a language model on MLX (results identical to mlx-lm 0.32.2).
#[derive(Parser, Debug)]
#[command(
    name = "mlx",
    version,
    about,
    args_override_self = true,
    infer_long_args = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per run: the size difference between the variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate a reply to a prompt (as `mlx_lm.generate`).
    #[command(allow_negative_numbers = true)]
    Generate(generate::GenerateArgs),
    /// Chat in the terminal, one growing cache over the turns (as `mlx_lm.chat`).
    #[command(allow_negative_numbers = true)]
    Chat(chat::ChatArgs),
    /// Run a prompt through the model and save its KV cache to a file that `mlx generate
    /// --prompt-cache-file` and `mlx_lm.generate --prompt-cache-file` read (as
    /// `mlx_lm.cache_prompt`).
    #[command(allow_negative_numbers = true)]
    CachePrompt(cache_prompt::CachePromptArgs),
    /// Serve the model over an OpenAI-compatible HTTP API with continuous batching (as
    /// `mlx_lm.server`).
    #[command(allow_negative_numbers = true)]
    Serve(mlx_server::ServeArgs),
    /// Fine-tune LoRA or DoRA adapters (as `mlx_lm.lora`), with SFT, DPO or ORPO.
    #[command(allow_negative_numbers = true)]
    Train(mlx_train::cli::TrainArgs),
    /// Fuse trained adapters into the base model (as `mlx_lm.fuse`).
    Fuse(mlx_train::cli::FuseArgs),
    /// List every supported model_type and how it is served (descriptor table or dedicated port).
    Models(models::ModelsArgs),
    /// Sentence embeddings of texts as JSON vectors (last-token pooling, L2-normalised, as
    /// sentence-transformers computes them for Qwen3-Embedding-style models).
    #[command(allow_negative_numbers = true)]
    Embed(embed::EmbedArgs),
    /// Describe a model directory: resolved descriptor, parameters, dtypes, quantization.
    Info(info::InfoArgs),
    /// List or delete models in the Hugging Face cache (as `mlx_lm.manage`).
    Manage(manage::ManageArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to standard
    /// output, e.g. `mlx completions bash > ~/.local/share/bash-completion/completions/mlx`.
    Completions(completions::CompletionsArgs),
    /// Run `mlx SUBCOMMAND ARGS...` as N ranks of one MLX distributed group (as `mlx.launch`),
    /// e.g. `mlx launch -n 2 --backend ring -- generate --model DIR`; only rank 0 prints.
    Launch(launch::LaunchArgs),
    /// Convert a model directory to MLX format, optionally quantized or dequantized (as
    /// `mlx_lm.convert`).
    Convert(convert::ConvertArgs),
    /// The perplexity of a model on local data, with its standard error (as
    /// `mlx_lm.perplexity`).
    #[command(allow_negative_numbers = true)]
    Perplexity(perplexity::PerplexityArgs),
    /// Prompt and generation tokens/s and peak memory over timed trials (as
    /// `mlx_lm.benchmark`).
    Benchmark(benchmark::BenchmarkArgs),
    /// Learned quantization with calibration text from a local file (as
    /// `python -m mlx_lm.quant.gptq`): `mlx quant gptq --model DIR --data-path TEXT`.
    Quant(quant::QuantArgs),
}

/// Runs a checked command line.
pub fn run(c: check::Checked) -> Result<(), String> {
    use check::Checked;
    match c {
        Checked::Generate(a, cache_file) => generate::run(&a, cache_file),
        Checked::Chat(a) => chat::run(&a),
        Checked::CachePrompt(a) => cache_prompt::run(&a),
        Checked::Serve(a) => serve::run(*a),
        Checked::Train(a) => {
            mlx_train::cli::run_in(&a, launch::world()?).map_err(|e| e.to_string())
        }
        Checked::Fuse(a) => mlx_train::cli::run_fuse(&a).map_err(|e| e.to_string()),
        Checked::Models(a) => models::run(&a),
        Checked::Manage(a) => manage::run(&a),
        Checked::Completions(a) => completions::run(&a),
        Checked::Info(a, info) => info::run(&a, &info),
        Checked::Embed(a) => embed::run(&a),
        Checked::Launch(a) => launch::run(&a),
        Checked::Convert(a) => convert::run(&a),
        Checked::Perplexity(a) => perplexity::run(&a),
        Checked::Benchmark(a) => benchmark::run(&a),
        Checked::Quant(a) => quant::run(&a),
    }
}

/// The `mlx` binary: parse and check `args` (the program name first), then run.
pub fn main(args: impl IntoIterator<Item = std::ffi::OsString>) -> ExitCode {
    let checked = match check::parse(args) {
        Ok(c) => c,
        Err(e) => return e.report(),
    };
    if !matches!(checked, check::Checked::Launch(_)) {
        if let Some(code) = launch::prepare() {
            return code;
        }
    }
    let launched = !matches!(checked, check::Checked::Launch(_));
    match run(checked) {
        Ok(()) => {
            if launched {
                if let Err(e) = launch::barrier() {
                    eprintln!("error: {}", launch::peer_hint(&e));
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}", launch::peer_hint(&e));
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

//! `mlx`: generate text and chat with a language model on MLX, with results identical to
//! mlx-lm's command-line tools (see the workspace README).
//!
//! One module per subcommand, each with its `clap::Args` struct and a `run`; [`Command`] has one
//! variant per subcommand. Shared flag groups live in `common`, model loading in `model`,
//! progress bars in `progress`.
#![forbid(unsafe_code)]

mod cache_prompt;
mod chat;
mod common;
mod generate;
mod model;
mod progress;

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

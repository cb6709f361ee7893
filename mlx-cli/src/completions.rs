//! `mlx completions SHELL`: a completion script for the `mlx` command line.

use clap::{Args, CommandFactory};
use clap_complete::Shell;

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    pub shell: Shell,
}

pub fn run(a: &CompletionsArgs) -> Result<(), String> {
    use std::io::Write;
    let mut cmd = crate::Cli::command();
    // Built whole first: `generate` panics on a failed write (`mlx completions bash | head`).
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "mlx", &mut script);
    match std::io::stdout().lock().write_all(&script) {
        // A closed pipe ends the output quietly, as `mlx info | head` does.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(format!("writing to standard output: {e}"))
        }
        _ => Ok(()),
    }
}

//! `mlx completions SHELL`: a completion script for the `mlx` command line.

use clap::{Args, CommandFactory};
use clap_complete::Shell;

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    pub shell: Shell,
}

pub fn run(a: &CompletionsArgs) -> Result<(), String> {
    let mut cmd = crate::Cli::command();
    clap_complete::generate(a.shell, &mut cmd, "mlx", &mut std::io::stdout().lock());
    Ok(())
}

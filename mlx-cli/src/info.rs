//! `mlx info --model DIR|FILE.gguf`: the resolved descriptor, parameter count, dtypes and
//! quantization of a model directory or GGUF file, without building the model.

use std::io::Write as _;

use clap::Args;
use mlx_models::load::ModelInfo;

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// An HF-style model directory (config.json and safetensors) or a .gguf file.
    #[arg(long, short = 'm')]
    pub model: String,
    /// Print one JSON object (the same fields, the descriptor as an object).
    #[arg(long)]
    pub json: bool,
}

/// Prints what `check` read from the directory.
pub fn run(a: &InfoArgs, info: &ModelInfo) -> Result<(), String> {
    let json = serde_json::to_value(info).map_err(|e| e.to_string())?;
    let mut text;
    if a.json {
        text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
        text.push('\n');
    } else {
        // The human description the library gives (no Rust debug structures).
        text = info.to_string();
        if !text.ends_with('\n') {
            text.push('\n');
        }
    }
    // A closed pipe (`mlx info ... | head`) ends the output quietly.
    std::io::stdout().lock().write_all(text.as_bytes()).ok();
    Ok(())
}

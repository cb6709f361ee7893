//! `mlx info --model DIR`: the resolved descriptor, parameter count, dtypes and quantization
//! of a model directory, without building the model.

use std::fmt::Write as _;
use std::io::Write as _;

use clap::Args;
use mlx_models::load::ModelInfo;

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// An HF-style model directory (config.json and safetensors).
    #[arg(long, short = 'm')]
    pub model: String,
}

/// Prints what `check` read from the directory.
pub fn run(_a: &InfoArgs, info: &ModelInfo) -> Result<(), String> {
    let mut text = String::new();
    writeln!(text, "model_type:   {}", info.model_type).ok();
    writeln!(text, "architecture: {}", info.architecture).ok();
    writeln!(text, "served by:    {:?}", info.serving).ok();
    writeln!(text, "parameters:   {}", info.parameters).ok();
    let dtypes: Vec<String> = info
        .dtypes
        .iter()
        .map(|(d, n)| format!("{d} ({n} tensors)"))
        .collect();
    writeln!(text, "dtypes:       {}", dtypes.join(", ")).ok();
    match &info.quantization {
        Some(q) => writeln!(text, "quantization: {q:?}").ok(),
        None => writeln!(text, "quantization: none").ok(),
    };
    if let Some(d) = &info.descriptor {
        writeln!(text, "descriptor:   {d:#?}").ok();
    }
    // A closed pipe (`mlx info ... | head`) ends the output quietly.
    std::io::stdout().lock().write_all(text.as_bytes()).ok();
    Ok(())
}

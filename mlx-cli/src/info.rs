//! `mlx info --model DIR`: the resolved descriptor, parameter count, dtypes and quantization
//! of a model directory, without building the model.

use std::path::Path;

use clap::Args;
use mlx_models::load::model_info;

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// An HF-style model directory (config.json and safetensors).
    #[arg(long, short = 'm')]
    pub model: String,
}

pub fn run(a: &InfoArgs) -> Result<(), String> {
    let info = model_info(Path::new(&a.model)).map_err(|e| format!("{}: {e}", a.model))?;
    println!("model_type:   {}", info.model_type);
    println!("architecture: {}", info.architecture);
    println!("served by:    {:?}", info.serving);
    println!("parameters:   {}", info.parameters);
    let dtypes: Vec<String> = info
        .dtypes
        .iter()
        .map(|(d, n)| format!("{d} ({n} tensors)"))
        .collect();
    println!("dtypes:       {}", dtypes.join(", "));
    match &info.quantization {
        Some(q) => println!("quantization: {q:?}"),
        None => println!("quantization: none"),
    }
    if let Some(d) = &info.descriptor {
        println!("descriptor:   {d:#?}");
    }
    Ok(())
}

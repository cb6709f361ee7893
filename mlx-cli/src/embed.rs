//! `mlx embed --model PATH --text T [--text T2 ...]`: sentence embeddings as
//! sentence-transformers computes them for Qwen3-Embedding-style models (last-token pooling,
//! L2-normalised; [`mlx_models::embed::embed`]), printed as one JSON object.

use std::io::Write as _;

use clap::Args;
use serde_json::json;

use crate::common::ModelArgs;
use crate::model;

#[derive(Args, Debug)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A text to embed (repeatable: one vector per text, in order). Each is encoded with the
    /// tokenizer's special tokens, as sentence-transformers does.
    #[arg(long, required = true, value_name = "TEXT")]
    pub text: Vec<String>,
}

pub fn run(a: &EmbedArgs) -> Result<(), String> {
    let m = model::load(&a.model)?;
    let ids = a
        .text
        .iter()
        .enumerate()
        .map(|(i, t)| {
            m.tokenizer
                .encode(t, true)
                .map_err(|e| format!("--text {}: {e}", i + 1))
        })
        .collect::<Result<Vec<Vec<u32>>, String>>()?;
    let e = mlx_models::embed::embed(m.model.as_ref(), &ids).map_err(|e| e.to_string())?;
    let vectors = mlx_models::embed::to_vecs(&e).map_err(|e| e.to_string())?;
    let obj = json!({
        "model_type": m.model.model_type(),
        "dtype": m.dtype_name,
        "token_ids": ids,
        "embeddings": vectors,
    });
    // A closed pipe ends the output quietly.
    writeln!(std::io::stdout().lock(), "{obj}").ok();
    Ok(())
}

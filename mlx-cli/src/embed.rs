//! `mlx embed --model PATH --text T [--text T2 ...]`: sentence embeddings as
//! sentence-transformers computes them for Qwen3-Embedding-style models (last-token pooling,
//! L2-normalised; [`mlx_models::embed::embed`]), printed as one JSON object.

use std::io::Write as _;

use clap::Args;
use serde_json::json;

use mlx_engine::cpu_decode::CpuDecoder;
use mlx_engine::generate::GenerateOptions;

use crate::common::{self, DecoderArgs, ModelArgs};
use crate::model;

#[derive(Args, Debug)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A text to embed (repeatable: one vector per text, in order). Each is encoded with the
    /// tokenizer's special tokens, as sentence-transformers does.
    #[arg(long, required = true, value_name = "TEXT")]
    pub text: Vec<String>,
    #[command(flatten)]
    pub decoder: DecoderArgs,
    /// Print which decoder runs the model (and why `--decoder auto` fell back) on standard
    /// error (`false`/`f`, any case, turns it off).
    #[arg(long, default_value = "false", value_parser = common::str2bool, value_name = "BOOL",
          action = clap::ArgAction::Set)]
    pub verbose: bool,
}

pub fn run(a: &EmbedArgs) -> Result<(), String> {
    // GGML blocks kept for the CPU decoder where it may run (the MLX path dequantizes on use).
    let m = model::load_for(&a.model, false, a.decoder.may_pick_cpu(&a.model.dtype))?;
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
    let decoder = a.decoder.pick(
        m.model.as_ref(),
        &GenerateOptions::default(),
        &a.model.dtype,
        false,
        Err("embeddings are not decoded".into()),
    )?;
    if a.verbose {
        eprintln!("[mlx] {}", decoder.note);
    }
    let vectors = match decoder.cpu {
        Some(c) => {
            let mut d =
                CpuDecoder::new(m.model.as_ref(), c.threads, 64).map_err(|e| e.to_string())?;
            mlx_engine::cpu_decode::embed(&mut d, &ids).map_err(|e| e.to_string())?
        }
        None => {
            let e = mlx_models::embed::embed(m.model.as_ref(), &ids).map_err(|e| e.to_string())?;
            mlx_models::embed::to_vecs(&e).map_err(|e| e.to_string())?
        }
    };
    let obj = json!({
        "model_type": m.model.model_type(),
        "dtype": m.dtype_name,
        "decoder": decoder.name,
        "token_ids": ids,
        "embeddings": vectors,
    });
    // A closed pipe ends the output quietly.
    writeln!(std::io::stdout().lock(), "{obj}").ok();
    Ok(())
}

//! `mlx serve`: the OpenAI-compatible server of `mlx-server`, with the model found and loaded
//! by the one loader as the other subcommands load it (the default SmolLM2 when `--model` is
//! omitted; `--adapter-path` applied as `mlx generate` applies it).

use mlx_server::ServeArgs;

use crate::common::{DecoderArgs, ModelArgs};
use crate::model;

pub fn run(a: ServeArgs) -> Result<(), String> {
    // Under `mlx launch` (mlx_lm.server under mlx.launch): every rank loads its shard and
    // steps with the others; rank 0 alone serves HTTP.
    let launched = crate::launch::lockstep_engine()?;
    let blocks = launched.is_none() && loads_for_cpu_decoder(&a);
    let load = move |a: &ServeArgs| -> Result<mlx_server::LoadedModel, String> {
        let m = model::load_for(
            &ModelArgs {
                model: a.model.clone(),
                dtype: "auto".into(),
                adapter_path: a.adapter_path.clone(),
            },
            false,
            blocks,
        )?;
        Ok(mlx_server::LoadedModel::from(m))
    };
    match launched {
        Some(rank) => {
            if a.draft_model.is_some() {
                return Err(format!(
                    "rank {rank}: --draft-model is not supported under mlx launch"
                ));
            }
            if rank == 0 {
                mlx_server::run(a, load).map_err(|e| e.to_string())
            } else {
                mlx_server::follow(a, load).map_err(|e| format!("rank {rank}: {e}"))
            }
        }
        None => mlx_server::run(a, load).map_err(|e| e.to_string()),
    }
}

/// Whether the engine will likely run the CPU decoder, so that the model is loaded for it as
/// `mlx generate` loads it ([`DecoderArgs::loads_gguf_blocks`] with serve's `--dtype auto`; not with
/// a draft model, whose speculation stays on the MLX path, unless `--decoder cpu`): a GGUF
/// file's GGML-block weights kept as their blocks, its Q4_0 / Q8_0 biases as the lazy product
/// of their scales (`QuantizedWeight::symmetric`), and the linear scales in their stored
/// half precision. The MLX path, where a request still takes it, computes those on use with
/// the same bits.
fn loads_for_cpu_decoder(a: &ServeArgs) -> bool {
    let d = DecoderArgs {
        decoder: a.decoder.clone(),
        threads: a.threads,
    };
    d.loads_gguf_blocks("auto", a.draft_model.is_some())
}

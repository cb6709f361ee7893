//! `mlx serve`: the OpenAI-compatible server of `mlx-server`, with the model found and loaded
//! by the one loader as the other subcommands load it (the default SmolLM2 when `--model` is
//! omitted; `--adapter-path` applied as `mlx generate` applies it).

use mlx_server::ServeArgs;

use crate::common::ModelArgs;
use crate::model;

pub fn run(a: ServeArgs) -> Result<(), String> {
    let load = |a: &ServeArgs| -> Result<mlx_server::LoadedModel, String> {
        let m = model::load(&ModelArgs {
            model: a.model.clone(),
            dtype: "auto".into(),
            adapter_path: a.adapter_path.clone(),
        })?;
        Ok(mlx_server::LoadedModel::from(m))
    };
    // Under `mlx launch` (mlx_lm.server under mlx.launch): every rank loads its shard and
    // steps with the others; rank 0 alone serves HTTP.
    match crate::launch::lockstep_engine()? {
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

//! `mlx serve`: the OpenAI-compatible server of `mlx-server`, with the model found and loaded
//! by the one loader as the other subcommands load it (the default SmolLM2 when `--model` is
//! omitted; `--adapter-path` applied as `mlx generate` applies it).

use mlx_server::ServeArgs;

use crate::common::ModelArgs;
use crate::model;

pub fn run(a: ServeArgs) -> Result<(), String> {
    mlx_server::run(a, |a: &ServeArgs| {
        let m = model::load(&ModelArgs {
            model: a.model.clone(),
            dtype: "auto".into(),
            adapter_path: a.adapter_path.clone(),
        })?;
        Ok(mlx_server::LoadedModel::from(m))
    })
    .map_err(|e| e.to_string())
}

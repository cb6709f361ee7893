//! `mlx serve`: the OpenAI-compatible server of `mlx-server`, with the model found and loaded
//! as the other subcommands find it (the default SmolLM2 when `--model` is omitted).

use mlx_server::ServeArgs;

use crate::common::ModelArgs;
use crate::model;

pub fn run(a: ServeArgs) -> Result<(), String> {
    mlx_server::run(a, |a: &ServeArgs| {
        // A Hub name is fetched once here; the load and the context length read the folder.
        let path = model::resolve(a.model.as_deref())?;
        let m = model::load(&ModelArgs {
            model: Some(path.display().to_string()),
            dtype: "auto".into(),
            adapter_path: None,
        })?;
        Ok(mlx_server::LoadedModel {
            model: m.model,
            tokenizer: m.tokenizer,
            context_length: mlx_server::context_length_at(&path),
        })
    })
    .map_err(|e| e.to_string())
}

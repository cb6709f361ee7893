//! `--seed` as mlx-lm's command-line tools apply it: `mx.random.seed(seed)` happens *before*
//! the model is loaded, and building the model draws from MLX's global key. Every
//! `nn.Linear` draws its weight (`mx.random.uniform`) and its bias when it has one, every
//! `nn.Embedding` its weight (`mx.random.normal`), and `nn.quantize` builds each
//! `QuantizedLinear` / `QuantizedEmbedding` from a freshly drawn weight again. Each draw splits
//! the global key once, so sampling afterwards starts from the key advanced by that many
//! splits. [`seed_as_mlx_lm`] reproduces that: seed, then advance the key by
//! [`construction_draws`].
//!
//! The count depends on the architecture's module tree, which is what strict loading checks the
//! checkpoint against: so it is computed from the tensors the model consumes (after the
//! architecture's `sanitize`). Per architecture, [`init_rule`] says which tensors belong to
//! modules initialised with random draws.

use std::collections::BTreeMap;

use mlx_core::prelude::*;
use mlx_core::random;
use mlx_models::config::ModelConfig;

use crate::error::{EngineError, Result};

/// How an architecture's mlx-lm module tree draws from the global key while it is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitRule {
    /// Only `nn.Linear` and `nn.Embedding` draw: every 2-D (or packed quantized) `<p>.weight`
    /// is one draw, `<p>.bias` beside it one more, `<p>.scales` (quantized) one more.
    /// `drop_tied_lm_head`: `sanitize` drops `lm_head.*` when `tie_word_embeddings` (default
    /// true).
    LinearEmbedding { drop_tied_lm_head: bool },
}

/// The rule of an mlx-lm architecture (`ModelConfig::architecture`), `None` when unknown.
pub fn init_rule(architecture: &str) -> Option<InitRule> {
    match architecture {
        "llama" => Some(InitRule::LinearEmbedding {
            drop_tied_lm_head: true,
        }),
        _ => None,
    }
}

/// How many times building `config`'s model in mlx-lm (`load_model`: the model class, then
/// `nn.quantize`) splits the global key, given the checkpoint's tensors (name -> shape).
pub fn construction_draws(
    config: &ModelConfig,
    tensors: &BTreeMap<String, Vec<i32>>,
) -> Result<usize> {
    let rule = init_rule(&config.architecture).ok_or_else(|| {
        EngineError::Other(format!(
            "--seed: how mlx-lm's {} model draws from the random key while it is built is not \
             known here, so seeded sampling cannot match mlx-lm",
            config.architecture
        ))
    })?;
    match rule {
        InitRule::LinearEmbedding { drop_tied_lm_head } => {
            let tied = drop_tied_lm_head
                && config
                    .raw
                    .get("tie_word_embeddings")
                    .and_then(serde_json::Value::as_bool)
                    .unwrap_or(true);
            let mut draws = 0;
            for (name, shape) in tensors {
                let Some(module) = name.strip_suffix(".weight") else {
                    continue;
                };
                if shape.len() < 2 || (tied && module == "lm_head") {
                    continue;
                }
                draws += 1;
                draws += usize::from(tensors.contains_key(&format!("{module}.bias")));
                draws += usize::from(tensors.contains_key(&format!("{module}.scales")));
            }
            Ok(draws)
        }
    }
}

/// The shapes of a tensor map, as [`construction_draws`] takes them.
pub fn shapes(tensors: &BTreeMap<String, Array>) -> BTreeMap<String, Vec<i32>> {
    tensors
        .iter()
        .map(|(k, v)| (k.clone(), v.shape()))
        .collect()
}

/// `mx.random.seed(seed)` followed by `draws` splits of the global key: the state mlx-lm's
/// `generate` and `chat` sample from after loading a model whose construction took `draws`.
pub fn seed_as_mlx_lm(seed: u64, draws: usize) -> Result<()> {
    random::seed(seed)?;
    for _ in 0..draws {
        random::next_key()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: &str) -> ModelConfig {
        ModelConfig::from_json_str(json).unwrap()
    }

    #[test]
    fn llama_draws_count_linears_embeddings_biases_and_quantization() {
        let base = r#"{"model_type":"llama","hidden_size":8,"num_hidden_layers":1,
            "intermediate_size":16,"num_attention_heads":2,"rms_norm_eps":1e-5,
            "vocab_size":32"#;
        let mut t: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        t.insert("model.embed_tokens.weight".into(), vec![32, 8]);
        t.insert("model.norm.weight".into(), vec![8]);
        t.insert("model.layers.0.self_attn.q_proj.weight".into(), vec![8, 8]);
        t.insert("model.layers.0.self_attn.q_proj.bias".into(), vec![8]);
        t.insert("model.layers.0.mlp.up_proj.weight".into(), vec![16, 1]);
        t.insert("model.layers.0.mlp.up_proj.scales".into(), vec![16, 1]);
        t.insert("model.layers.0.mlp.up_proj.biases".into(), vec![16, 1]);
        t.insert("lm_head.weight".into(), vec![32, 8]);
        // embed 1, q_proj 2, up_proj 1 + 1 (quantize); lm_head dropped (tied by default).
        assert_eq!(
            construction_draws(&config(&format!("{base}}}")), &t).unwrap(),
            5
        );
        let untied = config(&format!("{base},\"tie_word_embeddings\":false}}"));
        assert_eq!(construction_draws(&untied, &t).unwrap(), 6);
    }
}

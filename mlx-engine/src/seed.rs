//! `--seed` as mlx-lm's command-line tools apply it: `mx.random.seed(seed)` happens *before*
//! the model is loaded, and building the model draws from MLX's global key. Each draw (any
//! `mx.random.*` call without an explicit key) splits the global key once, so only the *count*
//! of draws matters: sampling afterwards starts from the seeded key advanced by that many
//! splits. [`seed_as_mlx_lm`] reproduces that: seed, then advance the key by
//! [`construction_draws`] (+ [`adapter_draws`] with `--adapter-path`).
//!
//! Who draws while mlx-lm's `load` builds a model (mlx 0.32.4, mlx-lm 0.32.2):
//! - `nn.Linear`: its weight, and its bias when it has one (`mx.random.uniform`);
//! - `nn.Embedding`: its weight (`mx.random.normal`);
//! - `nn.Conv1d` and mlx-lm's `SwitchLinear`: their weight only (a bias starts as zeros);
//! - `nn.quantize` replaces each quantized module by a `QuantizedLinear` /
//!   `QuantizedEmbedding` / `QuantizedSwitchLinear` built from a freshly drawn weight: one more;
//! - norms (`RMSNorm`, `LayerNorm`, Cohere's 2-D `LayerNorm2D`) start from ones or zeros;
//! - model-specific draws: Gated DeltaNet's `A_log` (qwen3_next, qwen3_5: `mx.random.uniform`
//!   in `__init__`); helium builds `lm_head` twice when it is untied.
//!
//! The count is computed from the module tree: the parameters the model took while it was
//! built ([`mlx_models::weights::Weights::taken_shapes`]: names after `sanitize`, the same set
//! mlx-lm's strict `load_weights` checks), where a `<p>.weight` of rank 2 is a linear or an
//! embedding and one of rank 3 a convolution or a switch linear. The rule is checked against
//! mlx-lm for every tiny model fixture (`seed_draws` in `cargo xtask goldens cli`).

use std::collections::BTreeMap;

use mlx_core::prelude::*;
use mlx_core::random;
use mlx_models::config::ModelConfig;

use crate::error::Result;

/// Parameters named with this leaf are drawn in the mlx-lm module's `__init__` for these
/// model types (`A = mx.random.uniform(...)`, `A_log = mx.log(A)` in qwen3_next's and
/// qwen3_5's `GatedDeltaNet`); the state-space models' `A_log` (mamba, mamba2, nemotron_h,
/// falcon_h1, jamba, granitemoehybrid, olmo_hybrid) starts from `arange` or zeros: no draw.
const DRAWN_LEAVES: &[(&str, &[&str])] = &[("A_log", &["qwen3_next", "qwen3_5", "qwen3_5_moe"])];

/// Modules an mlx-lm model class builds twice: `(model_type, module path)` (helium's `Model`
/// assigns `self.lm_head = nn.Linear(...)` and, when untied, assigns a new one).
const BUILT_TWICE: &[(&str, &str)] = &[("helium", "lm_head")];

/// Rank-2 `weight`s a model class creates with `mx.zeros`, no draw: `(model_type, module
/// path suffix)` (deepseek_v41's `Router.weight`).
const ZERO_INIT: &[(&str, &str)] = &[("deepseek_v41", ".mlp.gate")];

/// How many times building `config`'s model in mlx-lm (`load_model`: the model class, then
/// `nn.quantize`) splits the global key, given the model's parameters (name -> shape, after
/// `sanitize`: what the built model took).
pub fn construction_draws(config: &ModelConfig, params: &BTreeMap<String, Vec<i32>>) -> usize {
    let mut draws = 0;
    for (name, shape) in params {
        let (module, leaf) = name.rsplit_once('.').unwrap_or(("", name));
        if let Some((_, types)) = DRAWN_LEAVES.iter().find(|(l, _)| *l == leaf) {
            draws += usize::from(types.contains(&config.architecture.as_str()));
            continue;
        }
        if leaf != "weight" {
            continue;
        }
        let module_leaf = module.rsplit('.').next().unwrap_or(module);
        if module_leaf.contains("norm") {
            continue;
        }
        if ZERO_INIT
            .iter()
            .any(|(t, m)| *t == config.architecture && module.ends_with(m))
        {
            continue;
        }
        let has = |p: &str| params.contains_key(&format!("{module}.{p}"));
        draws += match shape.len() {
            // Linear (weight, bias) or Embedding; quantized: one more.
            2 => 1 + usize::from(has("bias")) + usize::from(has("scales")),
            // Conv1d or SwitchLinear: the weight only; quantized: one more.
            3 => 1 + usize::from(has("scales")),
            _ => 0,
        };
        if BUILT_TWICE.contains(&(config.architecture.as_str(), module)) {
            draws += 1;
        }
    }
    draws
}

/// The draws `--adapter-path` adds, given the names of the adapter parameters: mlx-lm's
/// `load_adapters` (LoRA or DoRA) replaces each targeted module by a `LoRALinear` /
/// `DoRALinear` (or switch / embedding variant) whose constructor builds a fresh base module
/// (`nn.Linear(..., bias=False)`: one draw) and draws `lora_a`: two per adapted module, one
/// `lora_a` each.
pub fn adapter_draws<'a>(names: impl IntoIterator<Item = &'a str>) -> usize {
    2 * names
        .into_iter()
        .filter(|n| n.rsplit('.').next() == Some("lora_a"))
        .count()
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
    fn draws_count_linears_embeddings_biases_convs_and_quantization() {
        let llama = config(
            r#"{"model_type":"llama","hidden_size":8,"num_hidden_layers":1,
            "intermediate_size":16,"num_attention_heads":2,"rms_norm_eps":1e-5,
            "vocab_size":32}"#,
        );
        let mut t: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        t.insert("model.embed_tokens.weight".into(), vec![32, 8]);
        t.insert("model.norm.weight".into(), vec![8]);
        t.insert("model.layers.0.self_attn.q_proj.weight".into(), vec![8, 8]);
        t.insert("model.layers.0.self_attn.q_proj.bias".into(), vec![8]);
        t.insert("model.layers.0.self_attn.q_norm.weight".into(), vec![2, 4]);
        t.insert("model.layers.0.mlp.up_proj.weight".into(), vec![16, 1]);
        t.insert("model.layers.0.mlp.up_proj.scales".into(), vec![16, 1]);
        t.insert("model.layers.0.mlp.up_proj.biases".into(), vec![16, 1]);
        t.insert("model.layers.0.conv.weight".into(), vec![8, 4, 1]);
        t.insert("model.layers.0.conv.bias".into(), vec![8]);
        t.insert("model.layers.0.linear_attn.A_log".into(), vec![2]);
        // embed 1, q_proj 2, 2-D norm 0, up_proj 1 + 1 (quantize), conv 1; A_log is drawn
        // only by the Gated DeltaNet types (a state-space model's starts from arange).
        assert_eq!(construction_draws(&llama, &t), 6);
        let next = config(&serde_json::json!({"model_type": "qwen3_next"}).to_string());
        assert_eq!(construction_draws(&next, &t), 7);
        let mamba = config(&serde_json::json!({"model_type": "mamba2"}).to_string());
        assert_eq!(construction_draws(&mamba, &t), 6);
        t.insert("lm_head.weight".into(), vec![32, 8]);
        assert_eq!(construction_draws(&llama, &t), 7);
        let helium = config(&serde_json::json!({"model_type": "helium"}).to_string());
        assert_eq!(construction_draws(&helium, &t), 8);
    }

    #[test]
    fn zero_initialized_weights_draw_nothing() {
        let v41 = config(&serde_json::json!({"model_type": "deepseek_v41"}).to_string());
        let mut t: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        t.insert("model.layers.0.mlp.gate.weight".into(), vec![4, 8]);
        assert_eq!(construction_draws(&v41, &t), 0);
        t.insert(
            "model.layers.0.mlp.shared_experts.gate_proj.weight".into(),
            vec![4, 8],
        );
        assert_eq!(construction_draws(&v41, &t), 1);
    }

    #[test]
    fn adapters_draw_twice_per_adapted_module() {
        let names = [
            "a.q_proj.lora_a",
            "a.q_proj.lora_b",
            "a.v_proj.lora_a",
            "a.v_proj.m",
        ];
        assert_eq!(adapter_draws(names), 4);
    }
}

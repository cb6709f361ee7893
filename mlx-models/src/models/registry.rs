//! The registry: which `model_type` is served and how ([`build`]'s dispatch ladder: a
//! dedicated port where one exists, else a row of the dense decoder's descriptor table, else a
//! rejection naming the type, what mlx-lm remaps it to, and every supported type), and the
//! checked `ModelConfig` constructors that consult it. The model trait and the pieces the
//! ports share stay in `models/mod.rs`.

use super::*;
use crate::config::{remap, ModelConfig, MODEL_REMAPPING};
use crate::weights::ParamShapes;

type DedicatedFn = fn(&ModelConfig, &mut Weights) -> Result<Box<dyn LanguageModel>>;

/// Dedicated ports, tried before the table: architectures the descriptor cannot express
/// (mixtures of experts, recurrent hybrids, Gemma 4).
const DEDICATED: &[(&str, DedicatedFn)] = &[
    ("mixtral", |c, w| Ok(Box::new(moe::Model::load(c, w)?))),
    ("qwen2_moe", |c, w| Ok(Box::new(moe::Model::load(c, w)?))),
    ("qwen3_moe", |c, w| Ok(Box::new(moe::Model::load(c, w)?))),
    ("olmoe", |c, w| Ok(Box::new(moe::Model::load(c, w)?))),
    ("gpt_oss", |c, w| Ok(Box::new(moe::Model::load(c, w)?))),
    ("granitemoe", |c, w| Ok(Box::new(moe::Model::load(c, w)?))),
    ("minimax", |c, w| Ok(Box::new(moe::Model::load(c, w)?))),
    ("ernie4_5_moe", |c, w| Ok(Box::new(moe::Model::load(c, w)?))),
    ("phimoe", |c, w| Ok(Box::new(moe::Model::load(c, w)?))),
    ("Klear", |c, w| Ok(Box::new(moe::Model::load(c, w)?))),
    ("hunyuan", |c, w| Ok(Box::new(moe::Model::load(c, w)?))),
    ("lfm2_moe", |c, w| Ok(Box::new(lfm2::Model::load(c, w)?))),
    ("dbrx", |c, w| Ok(Box::new(dbrx::Model::load(c, w)?))),
    ("llama4", |c, w| Ok(Box::new(llama4::Model::load(c, w)?))),
    ("mellum", |c, w| Ok(Box::new(moe::Model::load(c, w)?))),
    ("exaone_moe", |c, w| Ok(Box::new(moe::Model::load(c, w)?))),
    ("bailing_moe", |c, w| Ok(Box::new(moe::Model::load(c, w)?))),
    ("afmoe", |c, w| Ok(Box::new(moe::Model::load(c, w)?))),
    ("laguna", |c, w| Ok(Box::new(moe::Model::load(c, w)?))),
    ("qwen3_next", |c, w| {
        Ok(Box::new(qwen3_next::Model::load(c, w)?))
    }),
    ("qwen3_5", |c, w| {
        Ok(Box::new(qwen3_next::Model::load(c, w)?))
    }),
    ("qwen3_5_moe", |c, w| {
        Ok(Box::new(qwen3_next::Model::load(c, w)?))
    }),
    ("lfm2", |c, w| Ok(Box::new(lfm2::Model::load(c, w)?))),
    ("gemma4_text", |c, w| {
        Ok(Box::new(gemma4_text::Model::load(c, w)?))
    }),
    // MLA / DeepSeek V3 family (`deepseek.rs`).
    ("deepseek_v3", |c, w| {
        Ok(Box::new(deepseek::Model::load(c, w)?))
    }),
    ("kimi_k25", |c, w| {
        Ok(Box::new(deepseek::Model::load(c, w)?))
    }),
    ("glm4_moe_lite", |c, w| {
        Ok(Box::new(deepseek::Model::load(c, w)?))
    }),
    ("dots1", |c, w| Ok(Box::new(deepseek::Model::load(c, w)?))),
    ("glm4_moe", |c, w| {
        Ok(Box::new(deepseek::Model::load(c, w)?))
    }),
    ("solar_open", |c, w| {
        Ok(Box::new(deepseek::Model::load(c, w)?))
    }),
    ("kimi_vl", |c, w| Ok(Box::new(deepseek::Model::load(c, w)?))),
    ("youtu_llm", |c, w| {
        Ok(Box::new(deepseek::Model::load(c, w)?))
    }),
    ("deepseek", |c, w| {
        Ok(Box::new(deepseek::Model::load(c, w)?))
    }),
    ("deepseek_v2", |c, w| {
        Ok(Box::new(deepseek::Model::load(c, w)?))
    }),
    ("minicpm3", |c, w| {
        Ok(Box::new(deepseek::Model::load(c, w)?))
    }),
    ("mistral4", |c, w| {
        Ok(Box::new(deepseek::Model::load(c, w)?))
    }),
    ("deepseek_v32", |c, w| {
        Ok(Box::new(deepseek::Model::load(c, w)?))
    }),
    ("glm_moe_dsa", |c, w| {
        Ok(Box::new(deepseek::Model::load(c, w)?))
    }),
    ("longcat_flash", |c, w| {
        Ok(Box::new(longcat_flash::Model::load(c, w)?))
    }),
    ("longcat_flash_ngram", |c, w| {
        Ok(Box::new(longcat_flash::Model::load(c, w)?))
    }),
    // State-space family (issue #32).
    ("mamba", |c, w| Ok(Box::new(mamba::Model::load(c, w)?))),
    ("mamba2", |c, w| Ok(Box::new(mamba::Model::load(c, w)?))),
    ("nemotron_h", |c, w| {
        Ok(Box::new(nemotron_h::Model::load(c, w)?))
    }),
    ("granitemoehybrid", |c, w| {
        Ok(Box::new(granitemoehybrid::Model::load(c, w)?))
    }),
    ("falcon_h1", |c, w| {
        Ok(Box::new(falcon_h1::Model::load(c, w)?))
    }),
    ("jamba", |c, w| Ok(Box::new(jamba::Model::load(c, w)?))),
    ("baichuan_m1", |c, w| {
        Ok(Box::new(baichuan_m1::Model::load(c, w)?))
    }),
    ("olmo_hybrid", |c, w| {
        Ok(Box::new(olmo_hybrid::Model::load(c, w)?))
    }),
    ("kimi_linear", |c, w| Ok(Box::new(kda::Model::load(c, w)?))),
    ("bailing_moe_linear", |c, w| {
        Ok(Box::new(bailing_linear::Model::load(c, w)?))
    }),
    ("bailing_hybrid", |c, w| {
        Ok(Box::new(bailing_linear::Model::load(c, w)?))
    }),
    ("minimax_m3_vl", |c, w| {
        Ok(Box::new(minimax_m3::Model::load(c, w)?))
    }),
    ("bailing_moe_v3", |c, w| {
        Ok(Box::new(kda::Model::load(c, w)?))
    }),
    ("kimi_k3", |c, w| Ok(Box::new(kimi_k3::Model::load(c, w)?))),
    ("prism_hadamard_qwen35", prism::load),
    // Issue #32: multimodal wrappers around a port's text model (`wrappers.rs`).
    ("lfm2-vl", wrappers::lfm2_vl),
    ("qwen3_vl_moe", wrappers::qwen3_vl_moe),
    ("gemma4", wrappers::gemma4),
    ("gemma3n", |c, w| Ok(Box::new(gemma3n::Model::load(c, w)?))),
    ("deepseek_v41", |c, w| {
        Ok(Box::new(deepseek_v41::Model::load(c, w)?))
    }),
    ("talkie", |c, w| Ok(Box::new(talkie::Model::load(c, w)?))),
    ("phixtral", |c, w| {
        Ok(Box::new(phixtral::Model::load(c, w)?))
    }),
    ("afm7", |c, w| Ok(Box::new(afm7::Model::load(c, w)?))),
    ("phi3small", |c, w| {
        Ok(Box::new(phi3small::Model::load(c, w)?))
    }),
    ("recurrent_gemma", |c, w| {
        Ok(Box::new(recurrent_gemma::Model::load(c, w)?))
    }),
    ("rwkv7", |c, w| Ok(Box::new(rwkv7::Model::load(c, w)?))),
    ("gear", |c, w| Ok(Box::new(gear::Model::load(c, w)?))),
    ("plamo2", |c, w| Ok(Box::new(plamo2::Model::load(c, w)?))),
    ("step3p5", |c, w| Ok(Box::new(step3p5::Model::load(c, w)?))),
    ("mimo_v2_flash", |c, w| {
        Ok(Box::new(mimo_v2_flash::Model::load(c, w)?))
    }),
    ("iquestloopcoder", |c, w| {
        Ok(Box::new(iquestloopcoder::Model::load(c, w)?))
    }),
    ("nemotron-nas", |c, w| {
        Ok(Box::new(nemotron_nas::Model::load(c, w)?))
    }),
    ("muse_glimmer", |c, w| {
        Ok(Box::new(muse_glimmer::Model::load(c, w)?))
    }),
];

/// One supported `model_type` and how it is served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SupportedType {
    pub model_type: String,
    pub serving: Serving,
    /// For a remapped name (e.g. `mistral`), the type that serves it.
    pub via: Option<String>,
}

/// Every `model_type` a config may name, sorted: dedicated ports, table rows, and the
/// `MODEL_REMAPPING` aliases whose target is one of those.
pub fn supported_model_types() -> Vec<SupportedType> {
    let mut out: Vec<SupportedType> = DEDICATED
        .iter()
        .map(|(t, _)| SupportedType {
            model_type: t.to_string(),
            serving: Serving::Dedicated,
            via: None,
        })
        .chain(descriptor::ROWS.iter().map(|(t, _)| SupportedType {
            model_type: t.to_string(),
            serving: Serving::Table,
            via: None,
        }))
        .collect();
    for (from, to) in MODEL_REMAPPING {
        if let Some(target) = out.iter().find(|s| s.model_type == *to).cloned() {
            out.push(SupportedType {
                model_type: from.to_string(),
                serving: target.serving,
                via: Some(to.to_string()),
            });
        }
    }
    out.sort_by(|a, b| a.model_type.cmp(&b.model_type));
    out
}

/// The checked constructors of a `config.json`: parsed, its `model_type` served by the
/// registry ([`check_supported`]), its float hyper-parameters and quantization block read
/// (`config.rs`).
impl ModelConfig {
    /// Reads and parses `path` (a `config.json`).
    pub fn from_file(path: &std::path::Path) -> Result<ModelConfig> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ModelError::Config(format!("{}: {e}", path.display())))?;
        Self::from_json_str(&text).map_err(|e| match e {
            ModelError::Config(m) => ModelError::Config(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    pub fn from_json_str(text: &str) -> Result<ModelConfig> {
        let raw = crate::config::parse_python_json(text)
            .map_err(|e| ModelError::Config(format!("invalid JSON: {e}")))?;
        Self::from_value(raw)
    }

    pub fn from_value(raw: serde_json::Value) -> Result<ModelConfig> {
        let model_type = ModelConfig::model_type_of(&raw)?;
        check_supported(&model_type)?;
        ModelConfig::with_model_type(raw, model_type)
    }
}

/// Ok when [`build`] serves `model_type`; else the rejection error.
pub fn check_supported(model_type: &str) -> Result<()> {
    let arch = remap(model_type);
    let served = DEDICATED.iter().any(|(t, _)| *t == arch)
        || descriptor::ROWS.iter().any(|(t, _)| *t == arch);
    if served {
        return Ok(());
    }
    Err(ModelError::UnsupportedModelType {
        model_type: model_type.to_string(),
        remapped_to: (arch != model_type).then(|| arch.to_string()),
        supported: supported_model_types()
            .into_iter()
            .map(|s| s.model_type)
            .collect(),
    })
}

/// The resolved descriptor of a config served by the table (`None` for a dedicated port).
pub fn resolve(config: &ModelConfig) -> Result<Option<Descriptor>> {
    check_supported(&config.model_type)?;
    if DEDICATED.iter().any(|(t, _)| *t == config.architecture) {
        return Ok(None);
    }
    match descriptor::describe(&config.architecture, &config.raw) {
        Some(d) => {
            let mut d = d?;
            d.model_type = config.model_type.clone();
            Ok(Some(d))
        }
        None => Err(ModelError::Unsupported {
            what: format!("architecture `{}`", config.architecture),
            problem: "has no descriptor row".into(),
        }),
    }
}

/// Builds the model named by `config.architecture` from `weights`, strictly: every problem
/// with the weights is reported together.
pub fn build(config: &ModelConfig, weights: Weights) -> Result<Box<dyn LanguageModel>> {
    build_with_params(config, weights).map(|(model, _)| model)
}

/// The model of `config`'s architecture (its dedicated port, else its descriptor row), taking
/// its arrays from `weights`.
fn construct(config: &ModelConfig, weights: &mut Weights) -> Result<Box<dyn LanguageModel>> {
    match DEDICATED.iter().find(|(t, _)| *t == config.architecture) {
        Some((_, f)) => f(config, weights),
        None => match resolve(config)? {
            Some(desc) => Ok(Box::new(dense::Model::load(desc, weights)?)),
            None => Err(ModelError::Unsupported {
                what: format!("`{}`", config.model_type),
                problem: "has neither a port nor a row".into(),
            }),
        },
    }
}

/// [`build`], also returning the parameters the model took ([`Weights::taken_shapes`]).
pub fn build_with_params(
    config: &ModelConfig,
    mut weights: Weights,
) -> Result<(Box<dyn LanguageModel>, ParamShapes)> {
    check_layer_count(config, &weights)?;
    let model = construct(config, &mut weights)?;
    let params = weights.taken_shapes();
    let taken = weights.eager_arrays();
    weights.finish()?;
    // mlx-lm's `load_model` (lazy=False): read every weight now, not in the first forward
    // (symmetric biases excepted: computed from their scales where the MLX forward uses them).
    mlx_core::eval(taken.iter())?;
    Ok((model, params))
}

/// What [`build_recording`] returns: the model's parameters under mlx-lm's names (after
/// `sanitize`), in the order the model took them, and its quantizable modules.
pub struct BuiltParameters {
    pub parameters: Vec<(String, Array)>,
    pub quantizable: Vec<crate::weights::QuantizableModule>,
}

/// Builds the model strictly (as [`build`]) but lazily (`load(..., lazy=True)`, what
/// `mlx_lm.convert` does), returning its parameters and quantizable modules (for `convert`).
pub fn build_recording(config: &ModelConfig, mut weights: Weights) -> Result<BuiltParameters> {
    check_layer_count(config, &weights)?;
    let _model = construct(config, &mut weights)?;
    let parameters = weights.taken_named();
    let quantizable = weights.quantizable().to_vec();
    weights.finish()?;
    Ok(BuiltParameters {
        parameters,
        quantizable,
    })
}

/// Refuses a `num_hidden_layers` past the layers the files hold tensors for before any layer
/// is built: such a model would only fail with every tensor of every missing layer listed, after
/// building them all (a `num_hidden_layers` of a million once used 17 GB doing so).
fn check_layer_count(config: &ModelConfig, weights: &Weights) -> Result<()> {
    let Some(v) = config.raw.get("num_hidden_layers") else {
        return Ok(());
    };
    let n = v
        .as_i64()
        .filter(|n| (0..=i64::from(i32::MAX)).contains(n))
        .ok_or_else(|| {
            ModelError::Config(format!(
                "`num_hidden_layers` must be a non-negative 32-bit integer, got {v}"
            ))
        })?;
    let present = weights.layers_present();
    if n as usize > present {
        return Err(ModelError::Weights(vec![format!(
            "num_hidden_layers (GGUF: <arch>.block_count) is {n} but the weights hold tensors \
             for {present} layers: layers {present} to {} are missing",
            n - 1
        )]));
    }
    Ok(())
}

//! `mlx_lm.convert` (mlx-lm 0.32.2's `convert.py` and `utils.save`): a model directory in,
//! an MLX model directory out, optionally cast to a dtype, quantized (every mode of MLX
//! 0.32.4, the `mixed_*` recipes) or dequantized. Tensors, `config.json`,
//! `model.safetensors.index.json` and `README.md` are mlx-lm's byte for byte.
//!
//! The output is written into a temporary sibling directory and renamed into place at the
//! end, so an interrupted or failed conversion never leaves a half-written model behind.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_core::prelude::*;
use mlx_core::quantized::{self, QuantMode};
use serde_json::{Map, Value};

use crate::config::ModelConfig;
use crate::config::{QuantParams, TrellisParams, TRELLIS_DEFAULTS};
use crate::error::{ModelError, Result};
use crate::load::load_weights;
use crate::models::build_recording;
use crate::pyjson;
use crate::weights::Weights;

/// mlx-lm's `MAX_FILE_SIZE_GB`: shards are cut at 5 GiB.
pub const MAX_FILE_SIZE_BYTES: usize = 5 << 30;

/// The `--quant-predicate` recipes (`QUANT_RECIPES`).
pub const QUANT_RECIPES: [&str; 4] = ["mixed_2_6", "mixed_3_4", "mixed_3_6", "mixed_4_6"];

/// `--dtype` choices (`MODEL_CONVERSION_DTYPES`).
pub const CONVERSION_DTYPES: [&str; 3] = ["float16", "bfloat16", "float32"];

/// mlx-lm's per-model predicates, as its classes answer them (`predicates.json`, recorded by
/// `xtask/oracle/goldens_param_order.py` over the fixtures and their switched configs; only
/// answers other than the default `True`): `cast`, per parameter name, whether `convert
/// --dtype` casts it (`cast_predicate`); `quant`, per module path, whether it is quantized
/// (`false`) or with its own parameters (a dict), when no recipe is given (`quant_predicate`);
/// `plain`, the modules with a matrix `weight` mlx-lm cannot quantize (no `to_quantized`).
/// Keys are names with the layer index as `*`; where a model's answer depends on the layer's
/// kind, `pattern|a,b,c` (the parent's named children), and `=name` for one name.
const PREDICATES: &str = include_str!("predicates.json");

fn predicate_table() -> &'static Map<String, Value> {
    static TABLE: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| serde_json::from_str(PREDICATES).unwrap_or_default())
}

/// Each concrete parent's named (non-index) children among `names`.
fn children_of<'a>(
    names: impl Iterator<Item = &'a str>,
) -> BTreeMap<String, std::collections::BTreeSet<&'a str>> {
    let mut children: BTreeMap<String, std::collections::BTreeSet<&str>> = BTreeMap::new();
    for name in names {
        let mut parent = String::new();
        for part in name.split('.') {
            if part.parse::<usize>().is_err() {
                children.entry(parent.clone()).or_default().insert(part);
            }
            if !parent.is_empty() {
                parent.push('.');
            }
            parent.push_str(part);
        }
    }
    children
}

/// mlx-lm's predicate `kind` (`cast` or `quant`) of `model_type` for `name` (mlx-lm's name),
/// where it is not the default `True`.
fn predicate_answer(
    model_type: &str,
    kind: &str,
    name: &str,
    children: &BTreeMap<String, std::collections::BTreeSet<&str>>,
) -> Option<&'static Value> {
    let table = predicate_table()
        .get(crate::config::remap(model_type))?
        .get(kind)?;
    let mut parts: Vec<&str> = name.split('.').collect();
    if let Some(i) = parts.iter().position(|p| p.parse::<usize>().is_ok()) {
        parts[i] = "*";
    }
    let pattern = parts.join(".");
    let parent = name.rsplit_once('.').map_or("", |(p, _)| p);
    let kids = children
        .get(parent)
        .map(|k| k.iter().copied().collect::<Vec<_>>().join(","))
        .unwrap_or_default();
    table
        .get(format!("={name}"))
        .or_else(|| table.get(format!("{pattern}|{kids}")))
        .or_else(|| table.get(&pattern))
}

/// What to do (mlx_lm.convert's arguments).
#[derive(Clone, Debug, Default)]
pub struct ConvertOptions {
    /// `-q`.
    pub quantize: bool,
    /// `--q-group-size` (None: the mode's default).
    pub q_group_size: Option<i32>,
    /// `--q-bits` (None: the mode's default).
    pub q_bits: Option<i32>,
    /// `--q-mode`.
    pub q_mode: QuantMode,
    /// `--quant-predicate` (one of [`QUANT_RECIPES`]).
    pub quant_predicate: Option<String>,
    /// `--dtype` (one of [`CONVERSION_DTYPES`]); None: `torch_dtype` from config.json.
    pub dtype: Option<String>,
    /// `-d`.
    pub dequantize: bool,
    /// `--q-mode trellis`: trellis-code the linear layers (`q_group_size` is the block,
    /// `q_bits` the bits a weight; other quantizable modules take affine 4-bit, group 64).
    pub trellis: Option<TrellisParams>,
    /// `--q-hessians`: a `.safetensors` file of `<linear path>.hessian` (float `(in, in)`, the
    /// second moment of the layer's inputs on calibration text): those trellis linears are
    /// rounded by LDLQ; linears without one by plain Viterbi.
    pub trellis_hessians: Option<std::path::PathBuf>,
    /// `--q-select-hessians`: a `.safetensors` file of `<linear path>.hessian` made from
    /// HELD-OUT text (not `trellis_hessians`' calibration text): each trellis linear with one
    /// is coded under [`ConvertOptions::trellis_seed_candidates`] sign seeds and keeps the
    /// seed with the least output error under it (recorded in the linear's own quantization
    /// entry where it is not the model's seed).
    pub trellis_select_hessians: Option<std::path::PathBuf>,
    /// `--q-seed-candidates`: how many seeds (`seed, seed + 1, ...`) each linear tries when
    /// `trellis_select_hessians` is given; None: [`crate::layers::trellis::SEED_CANDIDATES`];
    /// 1 turns the choice off.
    pub trellis_seed_candidates: Option<usize>,
    /// `--q-trellis-v-code`: the code of the attention value projections (modules whose last
    /// path component is `v_proj`) where it differs from the model's
    /// (`trellis`' code), recorded in each such linear's own quantization entry; fused
    /// q/k/v projections keep the model's code. None: every linear takes the model's code.
    pub trellis_value_code: Option<mlx_core::cpu::trellis::TrellisCode>,
    /// Files written into the output beside the model's (name, bytes): the tokenizer files a
    /// caller made for a GGUF source, which has none of its own.
    pub extra_files: Vec<(String, Vec<u8>)>,
    /// A learned quantizer's `quant_predicate` (dynamic quant's): these modules take their own
    /// bits and group size, recorded as `{"bits", "group_size"}`; the rest take `-q`'s.
    pub per_module: Option<PerModule>,
    /// Keep the stored dtypes (`quantize_model` on a loaded model, as the learned quantizers
    /// call it) instead of casting to `--dtype` / `torch_dtype` (`mlx_lm.convert`).
    pub keep_dtype: bool,
}

/// Modules quantized with their own bits and group size (see [`ConvertOptions::per_module`]).
#[derive(Clone, Debug, Default)]
pub struct PerModule {
    pub bits: i32,
    pub group_size: i32,
    pub paths: std::collections::BTreeSet<String>,
}

/// Whether `src` names a GGUF file (a `.gguf` path that is a file).
pub fn is_gguf(src: &Path) -> bool {
    src.is_file()
        && src
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// Progress of [`convert`], one event per step and per tensor.
#[derive(Clone, Debug)]
pub enum Progress<'a> {
    /// A stage starts (`Loading`, `Quantizing`, `Saving`), with the number of tensors it
    /// handles.
    Stage(&'a str, usize),
    /// One tensor is done.
    Tensor(&'a str),
    /// An informational line mlx-lm prints (`[INFO] ...`), without the prefix.
    Info(String),
}

/// What [`convert`] did.
#[derive(Clone, Debug)]
pub struct ConvertReport {
    /// Files written (relative names).
    pub files: Vec<String>,
    /// `compute_bits_per_weight` after quantizing (when `-q`).
    pub bits_per_weight: Option<f64>,
    /// How many tensors were written.
    pub tensors: usize,
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> ModelError {
    ModelError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| io_err(path, e))?;
    serde_json::from_str(&text)
        .map_err(|e| ModelError::Config(format!("{}: invalid JSON: {e}", path.display())))
}

/// mlx-lm's `load_config` plus what `load_model` changes in the returned dict.
pub(crate) fn load_config_dict(src: &Path) -> Result<Map<String, Value>> {
    let path = src.join("config.json");
    let Value::Object(mut config) = read_json(&path)? else {
        return Err(ModelError::Config(format!(
            "{}: the top level is not a JSON object",
            path.display()
        )));
    };
    let gen = src.join("generation_config.json");
    if gen.exists() {
        // mlx-lm ignores a generation_config.json it cannot parse.
        if let Ok(Value::Object(g)) = read_json(&gen) {
            if let Some(eos) = g.get("eos_token_id").filter(|v| truthy(v)) {
                config.insert("eos_token_id".into(), eos.clone());
            }
        }
    }
    if !config.contains_key("quantization_config") {
        if let Some(q) = config
            .get("text_config")
            .and_then(|t| t.get("quantization_config"))
            .cloned()
        {
            config.insert("quantization_config".into(), q);
        }
    }
    if !config.contains_key("quantization") {
        if let Some(q) = config.get("quantization_config") {
            let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("?");
            // BitNet's own packed linears (mlx-lm's `bitnet_quantize`): read as the model's
            // BitLinears and written back as they are.
            let bitnet = config.get("model_type").and_then(Value::as_str) == Some("bitnet");
            if method == "bitnet" && bitnet {
                return Ok(config);
            }
            return Err(ModelError::Config(format!(
                "{}: quantization_config with quant_method `{method}` (a checkpoint quantized \
                 outside MLX) is not read by `mlx convert` yet",
                path.display()
            )));
        }
        if src.join("hf_quant_config.json").exists() {
            return Err(ModelError::Config(format!(
                "{}: ModelOpt checkpoints (hf_quant_config.json) are not read by `mlx convert` yet",
                src.display()
            )));
        }
    }
    Ok(config)
}

/// Python truthiness of a JSON value.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// The mode's default group size and bits (`defaults_for_mode`).
fn mode_defaults(mode: QuantMode) -> (i32, i32) {
    match mode {
        QuantMode::Affine => (64, 4),
        QuantMode::Mxfp4 => (32, 4),
        QuantMode::Nvfp4 => (16, 4),
        QuantMode::Mxfp8 => (32, 8),
    }
}

/// One module's quantization as mlx-lm records it in the config (group size may be `null`
/// when a recipe ran without `--q-group-size`).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LayerQuant {
    pub(crate) group_size: Option<i32>,
    pub(crate) bits: i32,
    pub(crate) mode: QuantMode,
    /// A trellis-coded linear (then `mode` is unused).
    pub(crate) trellis: Option<TrellisParams>,
}

impl LayerQuant {
    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert(
            "group_size".into(),
            self.group_size.map_or(Value::Null, Value::from),
        );
        m.insert("bits".into(), Value::from(self.bits));
        match &self.trellis {
            Some(t) => {
                m.insert("mode".into(), Value::from("trellis"));
                m.insert("trellis_l".into(), Value::from(t.trellis_l));
                m.insert("seed".into(), Value::from(t.seed));
                if t.trellis_code != mlx_core::cpu::trellis::TrellisCode::Mad {
                    m.insert("trellis_code".into(), Value::from(t.trellis_code.name()));
                }
            }
            None => {
                m.insert("mode".into(), Value::from(self.mode.name()));
            }
        }
        Value::Object(m)
    }
}

/// What `--q-mode trellis` gives the quantizable modules that are not plain linears
/// (embeddings): affine 4-bit in groups of 64.
const TRELLIS_OTHER: LayerQuant = LayerQuant {
    group_size: Some(64),
    bits: 4,
    mode: QuantMode::Affine,
    trellis: None,
};

/// `mixed_quant_predicate_builder`: the recipe's choice for the module at `path`.
fn mixed_recipe(
    recipe: &str,
    group_size: Option<i32>,
    num_layers: i64,
    layer_location: usize,
    path: &str,
) -> Result<LayerQuant> {
    let (low, high) = match recipe {
        "mixed_2_6" => (2, 6),
        "mixed_3_4" => (3, 4),
        "mixed_3_6" => (3, 6),
        "mixed_4_6" => (4, 6),
        other => {
            return Err(ModelError::Convert {
                option: "--quant-predicate".into(),
                problem: format!(
                    "invalid quant recipe {other} (expected one of {QUANT_RECIPES:?})"
                ),
            })
        }
    };
    let parts: Vec<&str> = path.split('.').collect();
    let index: i64 = if parts.len() > layer_location {
        parts[layer_location]
            .parse()
            .map_err(|_| ModelError::Convert {
                option: "--quant-predicate".into(),
                problem: format!("`{path}` has no layer index at position {layer_location}"),
            })?
    } else {
        0
    };
    let n8 = num_layers.div_euclid(8);
    let use_more_bits =
        index < n8 || index >= (7 * num_layers).div_euclid(8) || (index - n8).rem_euclid(3) == 2;
    let more = path.contains("v_proj")
        || path.contains("v_a_proj")
        || path.contains("v_b_proj")
        || path.contains("down_proj");
    let high_path = (more && use_more_bits) || path.contains("lm_head");
    Ok(LayerQuant {
        group_size,
        bits: if high_path { high } else { low },
        mode: QuantMode::Affine,
        trellis: None,
    })
}

fn parse_dtype(name: &str) -> Option<Dtype> {
    match name {
        "float16" => Some(Dtype::Float16),
        "bfloat16" => Some(Dtype::Bfloat16),
        "float32" => Some(Dtype::Float32),
        _ => None,
    }
}

/// Converts the model directory `src` into a new MLX model directory `dst` as
/// `mlx_lm.convert(src, dst, ...)` does. `dst` must not exist.
pub fn convert(
    src: &Path,
    dst: &Path,
    opts: &ConvertOptions,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<ConvertReport> {
    check_free(dst)?;
    let c = convert_in_memory(src, opts, progress)?;
    save_converted(src, dst, &c, &opts.extra_files, progress)
}

/// A converted model before it is written: the parameters under mlx-lm's names in its
/// order, each module's quantization and the config.
pub struct Converted {
    pub params: Vec<(String, Array)>,
    quantized: BTreeMap<String, LayerQuant>,
    config: Map<String, Value>,
    bits_per_weight: Option<f64>,
    gguf: bool,
}

impl Converted {
    /// The `config.json` the model is written with.
    pub fn config(&self) -> &Map<String, Value> {
        &self.config
    }

    /// Whether the module at `path` is quantized, and with which bits, group size and mode.
    pub fn quantization(&self, path: &str) -> Option<(i32, Option<i32>, QuantMode)> {
        self.quantized
            .get(path)
            .filter(|q| q.trellis.is_none())
            .map(|q| (q.bits, q.group_size, q.mode))
    }
}

fn check_free(dst: &Path) -> Result<()> {
    if dst.exists() {
        return Err(ModelError::Convert { option: "--mlx-path".into(), problem: format!("Cannot save to the path {} as it already exists. Please delete the file/directory or specify a new path to save to.", dst.display()) });
    }
    Ok(())
}

/// Writes a [`Converted`] model to `dst` (mlx-lm's `save`; `src` gives the tokenizer and
/// other files copied beside the weights).
pub fn save_converted(
    src: &Path,
    dst: &Path,
    c: &Converted,
    extra_files: &[(String, Vec<u8>)],
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<ConvertReport> {
    check_free(dst)?;
    let report = save(
        (!c.gguf).then_some(src),
        dst,
        &c.params,
        &c.quantized,
        c.config.clone(),
        extra_files,
        progress,
    )?;
    Ok(ConvertReport {
        bits_per_weight: c.bits_per_weight,
        ..report
    })
}

/// Each module's current quantization (loaded quantized; convert quantizes more later).
fn quantized_of(built: &crate::models::BuiltParameters) -> Result<BTreeMap<String, LayerQuant>> {
    let mut quantized: BTreeMap<String, LayerQuant> = BTreeMap::new();
    for m in &built.quantizable {
        if let Some(q) = &m.quantized {
            if q.trellis.is_some() {
                quantized.insert(
                    m.path.clone(),
                    LayerQuant {
                        group_size: Some(q.group_size),
                        bits: q.bits,
                        mode: QuantMode::Affine,
                        trellis: q.trellis,
                    },
                );
                continue;
            }
            let mode = QuantMode::from_name(&q.mode).ok_or_else(|| {
                ModelError::Config(format!(
                    "{}: unknown quantization mode `{}`",
                    m.path, q.mode
                ))
            })?;
            quantized.insert(
                m.path.clone(),
                LayerQuant {
                    group_size: Some(q.group_size),
                    bits: q.bits,
                    mode,
                    trellis: None,
                },
            );
        }
    }
    Ok(quantized)
}

/// mlx-lm's `save` of a model held as tensors under its names (`mlx_lm.fuse` writes its fused
/// model so): built lazily as `convert` builds it, then [`save`] (the parameters in mlx-lm's
/// order, shards, index, `save_config`, the tokenizer and other files of `src`, the model
/// card). `dst` may be an empty directory; anything else there is refused.
pub fn save_tensors(
    src: &Path,
    dst: &Path,
    tensors: BTreeMap<String, Array>,
    config: Map<String, Value>,
) -> Result<ConvertReport> {
    let model_config = ModelConfig::from_value(Value::Object(config.clone()))?;
    let quant = model_config.quantization.clone();
    let built = build_recording(&model_config, Weights::new(tensors, quant, None))?;
    let quantized = quantized_of(&built)?;
    if dst.is_dir() && std::fs::read_dir(dst).is_ok_and(|mut d| d.next().is_none()) {
        std::fs::remove_dir(dst).map_err(|e| io_err(dst, e))?;
    }
    check_free(dst)?;
    save(
        Some(src),
        dst,
        &built.parameters,
        &quantized,
        config,
        &[],
        &mut |_| {},
    )
}

/// [`convert`] without writing: what `mlx_lm.convert` holds before its `save`.
pub fn convert_in_memory(
    src: &Path,
    opts: &ConvertOptions,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Converted> {
    if opts.quantize && opts.dequantize {
        return Err(ModelError::Convert {
            option: "-q/-d".into(),
            problem: "Choose either quantize or dequantize, not both.".into(),
        });
    }
    if opts.quant_predicate.is_some() && opts.q_mode != QuantMode::Affine {
        return Err(ModelError::Convert {
            option: "--quant-predicate".into(),
            problem: "Quant predicates only support 'affine' quantization.".into(),
        });
    }
    if let Some(d) = &opts.dtype {
        if parse_dtype(d).is_none() {
            return Err(ModelError::Convert {
                option: "--dtype".into(),
                problem: format!("`{d}` is not one of {CONVERSION_DTYPES:?}"),
            });
        }
    }
    let gguf = is_gguf(src);
    if !gguf && !src.is_dir() {
        return Err(io_err(src, "not a model directory (nor a .gguf file)"));
    }

    progress(Progress::Info("Loading".into()));
    let (mut config, model_config, tensors) = if gguf {
        // Every tensor dequantized to float32 (bit for bit as gguf-py), names mapped to the
        // model's; the config is the one the GGUF hyper-parameters make.
        let g = crate::gguf::read_gguf_with(src, crate::gguf::GgufTensors::Dequantize)?;
        let Value::Object(map) = g.config.raw.clone() else {
            return Err(ModelError::Config(format!("{}: no config", src.display())));
        };
        (map, g.config, g.tensors)
    } else {
        (
            load_config_dict(src)?,
            ModelConfig::from_file(&src.join("config.json"))?,
            load_weights(src)?,
        )
    };
    // BitNet's BitLinears (a uint8 `weight` beside a `weight_scale`): mlx-lm keeps both as
    // the file holds them (its `--dtype` casts the scale; `nn.quantize` passes BitLinear by),
    // where our loader unpacks them into plain weights. Kept aside to be written back.
    let bitlinear: Vec<(String, Array, Array)> = if model_config.model_type == "bitnet" {
        tensors
            .iter()
            .filter_map(|(k, scale)| {
                let base = k.strip_suffix(".weight_scale")?;
                let w = tensors.get(&format!("{base}.weight"))?;
                (w.dtype() == Dtype::Uint8).then(|| (base.to_string(), w.clone(), scale.clone()))
            })
            .collect()
    } else {
        Vec::new()
    };
    let weights = Weights::new(tensors, model_config.quantization.clone(), None);
    let mut built = build_recording(&model_config, weights)?;
    let model_type = model_config.model_type.clone();
    for (base, packed, scale) in bitlinear {
        let weight = format!("{base}.weight");
        let Some(i) = built.parameters.iter().position(|(n, _)| *n == weight) else {
            return Err(ModelError::Internal {
                what: weight,
                problem: "a BitLinear weight is not among the model's parameters".into(),
            });
        };
        built.parameters[i].1 = packed;
        built
            .parameters
            .insert(i + 1, (format!("{base}.weight_scale"), scale));
        built.quantizable.retain(|m| m.path != base);
    }

    let mut quantized = quantized_of(&built)?;
    let mut params: Vec<(String, Array)> = built.parameters;

    // dtype: --dtype, else config's torch_dtype, else text_config's dtype.
    let dtype_name: Option<String> = opts
        .dtype
        .clone()
        .or_else(|| {
            config
                .get("torch_dtype")
                .and_then(Value::as_str)
                .map(String::from)
        })
        .or_else(|| {
            config
                .get("text_config")
                .filter(|t| truthy(t))
                .and_then(|t| t.get("dtype"))
                .and_then(Value::as_str)
                .map(String::from)
        });
    if let Some(dt) = dtype_name
        .as_deref()
        .and_then(parse_dtype)
        .filter(|_| !opts.keep_dtype)
    {
        progress(Progress::Info(format!(
            "Using dtype: {}",
            dtype_name.as_deref().unwrap_or("")
        )));
        // The model's `cast_predicate` reads mlx-lm's names (a wrapper's `language_model.`).
        let prefix = wrapper_prefix(&model_type, &params).unwrap_or("");
        let names: Vec<String> = params.iter().map(|(n, _)| format!("{prefix}{n}")).collect();
        let children = children_of(names.iter().map(String::as_str));
        let kept: Vec<bool> = names
            .iter()
            .map(|n| {
                predicate_answer(&model_type, "cast", n, &children) == Some(&Value::Bool(false))
            })
            .collect();
        for ((_, a), keep) in params.iter_mut().zip(kept) {
            if !keep && a.dtype().is_floating() && a.dtype() != dt {
                *a = a.astype(dt)?;
            }
        }
    }

    let mut bits_per_weight = None;
    if opts.quantize {
        progress(Progress::Info("Quantizing".into()));
        let (dg, db) = match opts.trellis {
            Some(_) => (TRELLIS_DEFAULTS.0, TRELLIS_DEFAULTS.1),
            None => mode_defaults(opts.q_mode),
        };
        let group_size = opts.q_group_size.unwrap_or(dg);
        let bits = opts.q_bits.unwrap_or(db);
        match opts.trellis {
            Some(t) => {
                if opts.quant_predicate.is_some() {
                    return Err(ModelError::Convert {
                        option: "--quant-predicate".into(),
                        problem: "recipes are affine; not with --q-mode trellis".into(),
                    });
                }
                QuantParams {
                    group_size,
                    bits,
                    mode: "trellis".into(),
                    trellis: Some(t),
                }
                .validate()
                .map_err(|m| ModelError::Convert {
                    option: "--q-bits/--q-group-size".into(),
                    problem: m.to_string(),
                })?;
                if let Some(code) = opts.trellis_value_code {
                    QuantParams {
                        group_size,
                        bits,
                        mode: "trellis".into(),
                        trellis: Some(TrellisParams {
                            trellis_code: code,
                            ..t
                        }),
                    }
                    .validate()
                    .map_err(|m| ModelError::Convert {
                        option: format!("--q-trellis-v-code {}", code.name()),
                        problem: m.to_string(),
                    })?;
                }
            }
            None if opts.trellis_value_code.is_some() => {
                return Err(ModelError::Convert {
                    option: "--q-trellis-v-code".into(),
                    problem: "only with --q-mode trellis".into(),
                })
            }
            None => opts
                .q_mode
                .check(group_size, bits)
                .map_err(|m| ModelError::Convert {
                    option: "--q-bits/--q-group-size".into(),
                    problem: m.to_string(),
                })?,
        }
        if let Some(g) = opts.q_group_size.filter(|_| opts.quant_predicate.is_some()) {
            QuantMode::Affine
                .check(g, 2)
                .map_err(|m| ModelError::Convert {
                    option: "--q-group-size".into(),
                    problem: m.to_string(),
                })?;
        }
        let top = LayerQuant {
            group_size: Some(group_size),
            bits,
            mode: opts.q_mode,
            trellis: opts.trellis,
        };
        let fine_grained = config.contains_key("quantization");
        let mut qblock: Map<String, Value> = match config.get("quantization") {
            Some(Value::Object(m)) => m.clone(),
            Some(_) => {
                return Err(ModelError::Config(
                    "config.json: `quantization` is not an object".into(),
                ))
            }
            None => match top.to_json() {
                Value::Object(m) => m,
                _ => Map::new(),
            },
        };
        // The recipe's layer-index position and layer count (from the model's modules).
        let recipe = opts.quant_predicate.as_deref();
        let (layer_location, num_layers) = if recipe.is_some() {
            let down = built
                .quantizable
                .iter()
                .find(|m| m.path.contains("down_proj"))
                .ok_or_else(|| ModelError::Convert {
                    option: "--quant-predicate".into(),
                    problem: "Model does not have expected keys for mixed quant.".into(),
                })?;
            let parts: Vec<&str> = down.path.split('.').collect();
            let loc = parts
                .iter()
                .position(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
                .unwrap_or(parts.len() - 1);
            let n = model_config
                .raw
                .get("num_hidden_layers")
                .and_then(Value::as_i64)
                .ok_or_else(|| {
                    ModelError::Config(
                        "config.json: `num_hidden_layers` is needed for a recipe".into(),
                    )
                })?;
            (loc, n)
        } else {
            (0, 0)
        };
        let index: BTreeMap<String, usize> = params
            .iter()
            .enumerate()
            .map(|(i, (n, _))| (n.clone(), i))
            .collect();
        let candidates: Vec<_> = built
            .quantizable
            .iter()
            .filter(|m| {
                m.quantized.is_none()
                    && if opts.trellis.is_some() && !m.linear {
                        m.in_dims % TRELLIS_OTHER.group_size.unwrap_or(64) == 0
                    } else {
                        m.in_dims % group_size == 0
                    }
            })
            .collect();
        let hessians = match &opts.trellis_hessians {
            Some(p) if opts.trellis.is_some() => mlx_core::io::load_safetensors(p, None)?.0,
            Some(p) => {
                return Err(ModelError::Convert {
                    option: format!("--q-hessians {}", p.display()),
                    problem: "only with --q-mode trellis".into(),
                })
            }
            None => Default::default(),
        };
        let select_hessians = match &opts.trellis_select_hessians {
            Some(p) if opts.trellis.is_some() => mlx_core::io::load_safetensors(p, None)?.0,
            Some(p) => {
                return Err(ModelError::Convert {
                    option: format!("--q-select-hessians {}", p.display()),
                    problem: "only with --q-mode trellis".into(),
                })
            }
            None => Default::default(),
        };
        let seed_candidates = opts
            .trellis_seed_candidates
            .unwrap_or(crate::layers::trellis::SEED_CANDIDATES);
        if seed_candidates == 0 || seed_candidates > crate::layers::trellis::MAX_SEED_CANDIDATES {
            return Err(ModelError::Convert {
                option: format!("--q-seed-candidates {seed_candidates}"),
                problem: format!(
                    "from 1 (1: no seed choice) to {}",
                    crate::layers::trellis::MAX_SEED_CANDIDATES
                ),
            });
        }
        if opts.trellis_seed_candidates.is_some() && opts.trellis_select_hessians.is_none() {
            return Err(ModelError::Convert {
                option: format!("--q-seed-candidates {seed_candidates}"),
                problem: "only with --q-select-hessians (the held-out Hessians that choose)".into(),
            });
        }
        // The model's own `quant_predicate` (mlx-lm's, by its names), when no recipe is given.
        let prefix = wrapper_prefix(&model_type, &params).unwrap_or("");
        let names: Vec<String> = params.iter().map(|(n, _)| format!("{prefix}{n}")).collect();
        let children = children_of(names.iter().map(String::as_str));
        let model_says = |path: &str| -> Option<&'static Value> {
            if recipe.is_some() || opts.trellis.is_some() {
                return None;
            }
            predicate_answer(&model_type, "quant", &format!("{prefix}{path}"), &children)
        };
        // What mlx-lm cannot quantize at all (a matrix weight on a module without
        // `to_quantized`, e.g. a router class of its own) stays float, recipe or not.
        let plain = |path: &str| {
            predicate_answer(&model_type, "plain", &format!("{prefix}{path}"), &children).is_some()
        };
        let candidates: Vec<_> = candidates
            .into_iter()
            .filter(|m| !plain(&m.path) && model_says(&m.path) != Some(&Value::Bool(false)))
            .collect();
        progress(Progress::Stage("Quantizing", candidates.len()));
        // How many linears kept each candidate seed (`seed + j`), for the closing line.
        let mut seeds_kept = vec![0usize; seed_candidates];
        let mut replaced: BTreeMap<String, Vec<(String, Array)>> = BTreeMap::new();
        for m in candidates {
            let own_params = model_says(&m.path).filter(|v| v.is_object());
            let own = opts
                .per_module
                .as_ref()
                .filter(|p| p.paths.contains(&m.path));
            let lq = match recipe {
                _ if own.is_some() => {
                    let p = own.ok_or_else(|| ModelError::Internal {
                        what: "convert".into(),
                        problem: "per-module quantization went missing".into(),
                    })?;
                    let mut j = Map::new();
                    j.insert("bits".into(), Value::from(p.bits));
                    j.insert("group_size".into(), Value::from(p.group_size));
                    qblock.insert(m.path.clone(), Value::Object(j));
                    LayerQuant {
                        group_size: Some(p.group_size),
                        bits: p.bits,
                        mode: QuantMode::Affine,
                        trellis: None,
                    }
                }
                Some(r) => {
                    let lq =
                        mixed_recipe(r, opts.q_group_size, num_layers, layer_location, &m.path)?;
                    qblock.insert(m.path.clone(), lq.to_json());
                    lq
                }
                None if own_params.is_some() => {
                    // `to_quantized(**params)`: what the dict leaves out takes `nn.quantize`'s
                    // defaults (affine; the mode's group size), not the command line's.
                    let v = own_params.cloned().unwrap_or_default();
                    let mode = match v.get("mode").and_then(Value::as_str) {
                        Some(name) => {
                            QuantMode::from_name(name).ok_or_else(|| ModelError::Convert {
                                option: format!("model type `{model_type}`"),
                                problem: format!(
                                    "its quant_predicate gives {} the unknown mode `{name}`",
                                    m.path
                                ),
                            })?
                        }
                        None => QuantMode::Affine,
                    };
                    let lq = LayerQuant {
                        group_size: v
                            .get("group_size")
                            .and_then(Value::as_i64)
                            .map(|g| g as i32)
                            .or(Some(mode_defaults(mode).0)),
                        bits: v
                            .get("bits")
                            .and_then(Value::as_i64)
                            .map_or(mode_defaults(mode).1, |b| b as i32),
                        mode,
                        trellis: None,
                    };
                    qblock.insert(m.path.clone(), v);
                    lq
                }
                None if opts.trellis.is_some() && !m.linear => {
                    qblock.insert(m.path.clone(), TRELLIS_OTHER.to_json());
                    TRELLIS_OTHER
                }
                None => {
                    if fine_grained {
                        qblock.insert(m.path.clone(), top.to_json());
                    }
                    top.clone()
                }
            };
            let wname = format!("{}.weight", m.path);
            let Some(&wi) = index.get(&wname) else {
                return Err(ModelError::Weights(vec![format!("missing: {wname}")]));
            };
            let mut lq = lq;
            // `--q-trellis-v-code` (checked with the other trellis options above).
            if let (Some(t), Some(code)) = (lq.trellis, opts.trellis_value_code) {
                if code != t.trellis_code && is_value_projection(&m.path) {
                    lq.trellis = Some(TrellisParams {
                        trellis_code: code,
                        ..t
                    });
                    qblock.insert(m.path.clone(), lq.to_json());
                }
            }
            let (wq, scales, biases) = match lq.trellis {
                Some(t) => {
                    let q = QuantParams {
                        group_size,
                        bits: lq.bits,
                        mode: "trellis".into(),
                        trellis: Some(t),
                    };
                    let hessian = hessians.get(&format!("{}.hessian", m.path));
                    match select_hessians
                        .get(&format!("{}.hessian", m.path))
                        .filter(|_| seed_candidates > 1)
                    {
                        Some(select) => {
                            let c = crate::layers::trellis::quantize_trellis_select(
                                &params[wi].1,
                                &m.path,
                                &q,
                                &t,
                                mlx_core::cpu::available_threads(),
                                hessian,
                                select,
                                seed_candidates,
                                params[wi].1.dtype(),
                            )?;
                            if c.seed != t.seed {
                                lq.trellis = Some(TrellisParams { seed: c.seed, ..t });
                                qblock.insert(m.path.clone(), lq.to_json());
                            }
                            seeds_kept[c.seed.wrapping_sub(t.seed) as usize] += 1;
                            (c.weight, c.scales, None)
                        }
                        None => {
                            let (w, s) = crate::layers::trellis::quantize_trellis(
                                &params[wi].1,
                                &m.path,
                                &q,
                                &t,
                                mlx_core::cpu::available_threads(),
                                hessian,
                            )?;
                            (w, s.astype(params[wi].1.dtype())?, None)
                        }
                    }
                }
                None => quantized::quantize(&params[wi].1, lq.group_size, lq.bits, lq.mode, None)?,
            };
            let mut parts = vec![(wname.clone(), wq), (format!("{}.scales", m.path), scales)];
            if let Some(b) = biases {
                parts.push((format!("{}.biases", m.path), b));
            }
            replaced.insert(wname.clone(), parts);
            quantized.insert(
                m.path.clone(),
                LayerQuant {
                    group_size: Some(lq.group_size.unwrap_or(mode_defaults(lq.mode).0)),
                    ..lq
                },
            );
            progress(Progress::Tensor(&wname));
        }
        // Rebuild the parameter list: a quantized module's weight, scales and biases where
        // its weight was.
        let mut out = Vec::with_capacity(params.len() + 2 * replaced.len());
        for (n, a) in params {
            match replaced.remove(&n) {
                Some(parts) => out.extend(parts),
                None => out.push((n, a)),
            }
        }
        params = out;
        config.insert("quantization".into(), Value::Object(qblock.clone()));
        config.insert("quantization_config".into(), Value::Object(qblock));
        if seeds_kept.iter().sum::<usize>() > 0 {
            progress(Progress::Info(format!(
                "Chose each trellis linear's seed by held-out error: linears per seed {}",
                seeds_kept
                    .iter()
                    .enumerate()
                    .map(|(j, n)| format!("+{j}: {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let bpw = bits_per_weight_of(&params, &quantized);
        progress(Progress::Info(format!(
            "Quantized model with {bpw:.3} bits per weight."
        )));
        bits_per_weight = Some(bpw);
    }

    if opts.dequantize {
        progress(Progress::Info("Dequantizing".into()));
        config.remove("quantization");
        config.remove("quantization_config");
        let mut out = Vec::with_capacity(params.len());
        let lookup: BTreeMap<String, Array> = params.iter().cloned().collect();
        progress(Progress::Stage("Dequantizing", quantized.len()));
        for (n, a) in &params {
            let Some(path) = n.strip_suffix(".weight") else {
                if drop_quant_part(n, &quantized) {
                    continue;
                }
                out.push((n.clone(), a.clone()));
                continue;
            };
            let Some(q) = quantized.get(path) else {
                out.push((n.clone(), a.clone()));
                continue;
            };
            let scales = lookup
                .get(&format!("{path}.scales"))
                .ok_or_else(|| ModelError::Weights(vec![format!("missing: {path}.scales")]))?;
            let biases = lookup.get(&format!("{path}.biases"));
            let w = match &q.trellis {
                Some(t) => {
                    let qp = QuantParams {
                        group_size: q.group_size.unwrap_or(TRELLIS_DEFAULTS.0),
                        bits: q.bits,
                        mode: "trellis".into(),
                        trellis: Some(*t),
                    };
                    let sh = a.shape();
                    let rows = sh.first().copied().unwrap_or(0);
                    let cols = (i64::from(sh.get(1).copied().unwrap_or(0)) * 32
                        / i64::from(q.bits.max(1))) as i32;
                    mlx_core::eval([a, scales])?;
                    crate::layers::trellis::TrellisWeight::new(
                        a.clone(),
                        scales.clone(),
                        qp.trellis_spec(t),
                        *t,
                        path,
                        rows,
                        cols,
                    )?
                    .dequantize()?
                    .astype(scales.dtype())?
                }
                None => quantized::dequantize(
                    a,
                    scales,
                    biases,
                    q.group_size,
                    q.bits,
                    q.mode,
                    None,
                    None,
                )?,
            };
            out.push((n.clone(), w));
            progress(Progress::Tensor(n));
        }
        params = out;
        quantized.clear();
    }

    Ok(Converted {
        params,
        quantized,
        config,
        bits_per_weight,
        gguf,
    })
}

/// Whether `name` is a quantized module's `scales` or `biases` (dropped on dequantizing).
fn drop_quant_part(name: &str, quantized: &BTreeMap<String, LayerQuant>) -> bool {
    ["scales", "biases"].iter().any(|s| {
        name.strip_suffix(s)
            .and_then(|p| p.strip_suffix('.'))
            .is_some_and(|p| quantized.contains_key(p))
    })
}

/// The module path of a parameter name (everything before the last dot).
fn module_of(name: &str) -> &str {
    name.rsplit_once('.').map_or("", |(m, _)| m)
}

/// mlx-lm's `get_total_parameters`: over the leaf modules only (a parameter set directly on a
/// module that has submodules, such as a router's `expert_bias` beside its experts, is not
/// counted), a quantized module counts its bias and its unpacked weight; every other module all
/// of its parameters.
fn total_parameters(params: &[(String, Array)], quantized: &BTreeMap<String, LayerQuant>) -> u64 {
    // Modules with submodules: every strict ancestor of a parameter's module, the root
    // included (an array set on the model itself, talkie's `lm_head`, is not counted).
    let mut inner: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
    for (n, _) in params {
        if !n.contains('.') {
            continue;
        }
        let mut m = module_of(module_of(n));
        loop {
            if !inner.insert(m) || m.is_empty() {
                break;
            }
            m = module_of(m);
        }
    }
    params
        .iter()
        .filter(|(n, _)| !inner.contains(module_of(n)))
        .map(|(n, a)| {
            let m = module_of(n);
            match quantized.get(m) {
                Some(q) => {
                    if n.ends_with(".weight") {
                        a.size() as u64 * 32 / q.bits as u64
                    } else if n.ends_with(".bias") {
                        a.size() as u64
                    } else {
                        0
                    }
                }
                None => a.size() as u64,
            }
        })
        .sum()
}

/// mlx-lm's `compute_bits_per_weight`: all bytes * 8 / total parameters.
pub(crate) fn bits_per_weight_of(
    params: &[(String, Array)],
    quantized: &BTreeMap<String, LayerQuant>,
) -> f64 {
    let bytes: usize = params.iter().map(|(_, a)| a.nbytes()).sum();
    let total = total_parameters(params, quantized);
    if total == 0 {
        0.0
    } else {
        bytes as f64 * 8.0 / total as f64
    }
}

/// Per mlx-lm model module (`mlx_lm/models/<module>.py`, a `model_type` after
/// `MODEL_REMAPPING`), each module's children in the order its classes define them
/// (`xtask/oracle/goldens_param_order.py` records it from mlx-lm's own classes: the tiny
/// fixtures as loaded, and each fixture's config rebuilt with every boolean switch flipped, so
/// optional modules no fixture has are placed too; numeric children, a list's items, are in
/// index order and not listed). Where a type's list items are of classes that order their
/// children differently, the pattern is kept per set of children
/// (`model.layers.*|mlp,self_attn`), looked up before the pattern.
const PARAM_ORDER: &str = include_str!("param_order.json");

fn param_order_table() -> &'static Map<String, Value> {
    static TABLE: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| serde_json::from_str(PARAM_ORDER).unwrap_or_default())
}

/// The prefix mlx-lm's names carry over ours: a type whose mlx-lm class wraps the text model
/// as its only child (`self.language_model`, `param_order.json`'s root) names every parameter
/// `language_model.` + the text model's name, where our loader takes that prefix off.
pub fn wrapper_prefix(model_type: &str, params: &[(String, Array)]) -> Option<&'static str> {
    let root = param_order_table()
        .get(crate::config::remap(model_type))?
        .get("")?
        .as_array()?;
    let only = root.len() == 1 && root[0] == "language_model";
    (only && !params.iter().any(|(n, _)| n.starts_with("language_model.")))
        .then_some("language_model.")
}

/// Puts `params` in `tree_flatten(model.parameters())`'s order, the order mlx-lm's
/// `save_model` inserts them into the dict it saves. `mx.save_safetensors` lays the data out
/// in the iteration order of the `std::unordered_map` MLX's bindings fill from that dict one
/// emplace at a time, so the file's bytes depend on that insertion order (our save replays
/// it: `mlxs_save_safetensors`). A depth-first walk of the module tree: each name sorts by its
/// components' ranks among their siblings (the table's; list items by index). A quantized
/// module's `scales` and `biases` follow its `weight` (`QuantizedLinear` sets them in that
/// order, before any `bias`, whatever the table says); what the table lacks keeps our order, after what it has. A
/// type the table lacks is refused (no order to write it in).
pub fn mlx_lm_order(model_type: &str, params: &mut [(String, Array)]) -> Result<()> {
    let module = crate::config::remap(model_type);
    let Some(Value::Object(types)) = param_order_table().get(module) else {
        return Err(ModelError::Convert {
            option: format!("model type `{model_type}`"),
            problem: format!(
                "no parameter order for mlx-lm's `{module}` module in param_order.json \
                 (`cargo xtask goldens param_order` records it from a fixture of the type), so \
                 the file could not be written in mlx-lm's byte order"
            ),
        });
    };
    // Each concrete parent's set of named children (what a `pattern|a,b,c` entry is for).
    let names: Vec<String> = params.iter().map(|(n, _)| n.clone()).collect();
    let children = children_of(names.iter().map(String::as_str));
    let mut unknown: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut keys: Vec<Vec<(u8, usize, u8)>> = Vec::with_capacity(params.len());
    for (name, _) in params.iter() {
        let mut key = Vec::new();
        let mut pattern = String::new();
        let mut concrete = String::new();
        for part in name.split('.') {
            if let Ok(i) = part.parse::<usize>() {
                key.push((0, i, 0));
            } else {
                let set = children.get(&concrete).map(|c| {
                    format!(
                        "{pattern}|{}",
                        c.iter().copied().collect::<Vec<_>>().join(",")
                    )
                });
                let kids = set
                    .and_then(|k| types.get(&k))
                    .or_else(|| types.get(&pattern))
                    .and_then(Value::as_array);
                let pos = |c: &str| kids.and_then(|k| k.iter().position(|v| v == c));
                // A quantized module's `scales` and `biases` follow its `weight` wherever the
                // table has them: `QuantizedLinear` sets all three before any `bias`.
                let after_weight = match part {
                    "scales" => pos("weight").map(|p| (p, 1)),
                    "biases" => pos("weight").map(|p| (p, 2)),
                    _ => None,
                };
                let rank = after_weight.or_else(|| pos(part).map(|p| (p, 0)));
                key.push(match rank {
                    Some((p, sub)) => (1, p, sub),
                    None => {
                        let n = unknown.len();
                        (
                            2,
                            *unknown
                                .entry((pattern.clone(), part.to_string()))
                                .or_insert(n),
                            0,
                        )
                    }
                });
            }
            if !pattern.is_empty() {
                pattern.push('.');
                concrete.push('.');
            }
            pattern.push_str(if part.parse::<usize>().is_ok() {
                "*"
            } else {
                part
            });
            concrete.push_str(part);
        }
        keys.push(key);
    }
    let mut idx: Vec<usize> = (0..params.len()).collect();
    idx.sort_by(|&a, &b| keys[a].cmp(&keys[b]));
    let mut taken: Vec<Option<(String, Array)>> = params.iter().cloned().map(Some).collect();
    for (slot, i) in params.iter_mut().zip(idx) {
        if let Some(p) = taken[i].take() {
            *slot = p;
        }
    }
    Ok(())
}

/// mlx-lm's `make_shards`: consecutive tensors, a new shard when the next would pass 5 GiB.
fn make_shards(params: &[(String, Array)]) -> Vec<Vec<usize>> {
    let mut shards: Vec<Vec<usize>> = Vec::new();
    let mut size = 0usize;
    for (i, (_, a)) in params.iter().enumerate() {
        if shards.is_empty() || size + a.nbytes() > MAX_FILE_SIZE_BYTES {
            shards.push(Vec::new());
            size = 0;
        }
        if let Some(last) = shards.last_mut() {
            last.push(i);
        }
        size += a.nbytes();
    }
    shards
}

/// The model card mlx-lm writes for a local source (`ModelCard.from_template` with
/// `library_name: mlx`, `pipeline_tag: text-generation`, `tags: [mlx]`).
pub const MODEL_CARD: &str =
    "---\nlanguage: en\nlibrary_name: mlx\npipeline_tag: text-generation\ntags:\n- mlx\n---\n";

/// What mlx-lm's `ModelArgs.__post_init__` writes into the config's own `text_config` dict
/// (`from_dict` passes that dict itself, so `save_config` writes the change): a wrapper's
/// vocabulary size copied in, head counts and `tie_word_embeddings` set (gemma3, gemma4,
/// pixtral, lfm2-vl, mistral3; llava is mistral3). A key already there keeps its place, a new
/// one goes last, as a Python dict's assignment does.
fn args_mutations(config: &mut Map<String, Value>) {
    let model_type = config
        .get("model_type")
        .and_then(Value::as_str)
        .map(|t| crate::config::remap(t).to_string())
        .unwrap_or_default();
    let vocab = config.get("vocab_size").cloned();
    let Some(Value::Object(tc)) = config.get_mut("text_config") else {
        return;
    };
    let default = |tc: &mut Map<String, Value>, key: &str, v: i64| {
        let cur = tc.get(key).cloned().unwrap_or(Value::from(v));
        tc.insert(key.into(), cur);
    };
    match model_type.as_str() {
        "gemma3" | "gemma4" => {
            let (v, heads, kv) = if model_type == "gemma3" {
                (262208, 8, 4)
            } else {
                (262144, 8, 1)
            };
            tc.insert("vocab_size".into(), vocab.unwrap_or(Value::from(v)));
            default(tc, "num_attention_heads", heads);
            default(tc, "num_key_value_heads", kv);
        }
        "pixtral" => {
            tc.insert("tie_word_embeddings".into(), Value::Bool(false));
            default(tc, "num_attention_heads", 32);
        }
        "lfm2-vl" => {
            tc.insert("tie_word_embeddings".into(), Value::Bool(false));
        }
        "mistral3" if !tc.contains_key("tie_word_embeddings") => {
            tc.insert("tie_word_embeddings".into(), Value::Bool(false));
        }
        _ => {}
    }
}

/// A temporary sibling of `dst`, removed on drop unless renamed into place.
struct TempDir {
    path: PathBuf,
    done: bool,
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

pub(crate) fn save(
    src: Option<&Path>,
    dst: &Path,
    params: &[(String, Array)],
    quantized: &BTreeMap<String, LayerQuant>,
    mut config: Map<String, Value>,
    extra_files: &[(String, Vec<u8>)],
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<ConvertReport> {
    let name = dst
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| io_err(dst, "the output path has no file name"))?;
    let parent = match dst.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| io_err(&parent, e))?;
    let mut tmp = TempDir {
        path: parent.join(format!(".{name}.{}.partial", std::process::id())),
        done: false,
    };
    let _ = std::fs::remove_dir_all(&tmp.path);
    std::fs::create_dir(&tmp.path).map_err(|e| io_err(&tmp.path, e))?;
    args_mutations(&mut config);
    let mut files = Vec::new();

    // Weights, in the order mlx-lm's `save_model` inserts them.
    // (The count reads the quantization by our module paths, before any wrapper prefix.)
    let total_params = total_parameters(params, quantized);
    let mut ordered = params.to_vec();
    let model_type = config
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if let Some(prefix) = wrapper_prefix(&model_type, &ordered) {
        for (n, _) in ordered.iter_mut() {
            *n = format!("{prefix}{n}");
        }
        // The quantization block's per-module entries are module paths too.
        if let Some(Value::Object(q)) = config.get_mut("quantization") {
            *q = std::mem::take(q)
                .into_iter()
                .map(|(k, v)| match v {
                    Value::Object(_) | Value::Bool(_) => (format!("{prefix}{k}"), v),
                    v => (k, v),
                })
                .collect();
        }
    }
    mlx_lm_order(&model_type, &mut ordered)?;
    let params = &ordered[..];
    let shards = make_shards(params);
    let count = shards.len();
    let mut weight_map: BTreeMap<String, String> = BTreeMap::new();
    let mut meta = mlx_core::io::StringMap::new();
    meta.insert("format".into(), "mlx".into());
    progress(Progress::Stage("Saving", params.len()));
    for (i, shard) in shards.iter().enumerate() {
        let shard_name = if count > 1 {
            format!("model-{:05}-of-{:05}.safetensors", i + 1, count)
        } else {
            "model.safetensors".to_string()
        };
        for &j in shard {
            mlx_core::eval([&params[j].1])?;
            progress(Progress::Tensor(&params[j].0));
        }
        let path = tmp.path.join(&shard_name);
        mlx_core::io::save_safetensors(
            &path,
            shard.iter().map(|&j| (params[j].0.as_str(), &params[j].1)),
            &meta,
        )?;
        for &j in shard {
            weight_map.insert(params[j].0.clone(), shard_name.clone());
        }
        files.push(shard_name);
    }
    let total_size: usize = params.iter().map(|(_, a)| a.nbytes()).sum();
    let mut metadata = Map::new();
    metadata.insert("total_size".into(), Value::from(total_size as u64));
    metadata.insert("total_parameters".into(), Value::from(total_params));
    let mut index = Map::new();
    index.insert("metadata".into(), Value::Object(metadata));
    index.insert(
        "weight_map".into(),
        Value::Object(
            weight_map
                .into_iter()
                .map(|(k, v)| (k, Value::from(v)))
                .collect(),
        ),
    );
    write_file(
        &tmp.path.join("model.safetensors.index.json"),
        &pyjson::dumps(&Value::Object(index), 4, true),
    )?;
    files.push("model.safetensors.index.json".into());

    // config.json (`save_config`).
    config.remove("_name_or_path");
    config.remove("vision_config");
    if let Some(q) = config.get("quantization").cloned() {
        config.insert("quantization_config".into(), q);
    }
    let mut keys: Vec<String> = config.keys().cloned().collect();
    keys.sort();
    let sorted: Map<String, Value> = keys
        .into_iter()
        .filter_map(|k| config.remove(&k).map(|v| (k, v)))
        .collect();
    write_file(
        &tmp.path.join("config.json"),
        &pyjson::dumps(&Value::Object(sorted), 4, true),
    )?;
    files.push("config.json".into());

    // Tokenizer files and what mlx-lm copies (`*.py`, generation_config.json). The tokenizer
    // is written as transformers' `save_pretrained` writes the class it loads
    // (`tokenizer_files`); a class not reproduced has its files copied, with a note.
    if let Some(src) = src {
        let rewritten = tokenizer_files(src, progress)?;
        if let Some(written) = &rewritten {
            for (name, text) in written {
                write_file(&tmp.path.join(name), text)?;
                files.push(name.clone());
            }
        }
        for f in copied_files(src)? {
            // With the tokenizer re-saved, mlx-lm copies only `*.py` and
            // `generation_config.json` beside it.
            let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let kept = name.ends_with(".py") || name == "generation_config.json";
            if rewritten.is_some() && !kept {
                continue;
            }
            let to = tmp.path.join(f.file_name().unwrap_or_default());
            std::fs::copy(&f, &to).map_err(|e| io_err(&f, e))?;
            files.push(f.file_name().and_then(|n| n.to_str()).unwrap_or("").into());
        }
    }
    for (name, bytes) in extra_files {
        if name.contains('/') || name.contains('\\') || name.starts_with('.') {
            return Err(ModelError::Convert {
                option: format!("extra file `{name}`"),
                problem: "not a plain name".into(),
            });
        }
        let to = tmp.path.join(name);
        std::fs::write(&to, bytes).map_err(|e| io_err(&to, e))?;
        files.push(name.clone());
    }
    write_file(&tmp.path.join("README.md"), MODEL_CARD)?;
    files.push("README.md".into());

    if dst.exists() {
        return Err(ModelError::Convert {
            option: "--mlx-path".into(),
            problem: format!(
                "Cannot save to the path {} as it already exists (it appeared while converting).",
                dst.display()
            ),
        });
    }
    std::fs::rename(&tmp.path, dst).map_err(|e| io_err(dst, e))?;
    tmp.done = true;
    files.sort();
    Ok(ConvertReport {
        files,
        bits_per_weight: None,
        tensors: params.len(),
    })
}

/// transformers 5.25's `save_pretrained` as mlx-lm's `save` calls it, for the class
/// `AutoTokenizer` loads (`mlx_tokenizers::hf_save`: the class, its `tokenizer.json`, its
/// init arguments): `tokenizer_config.json` holds the config's own entries and the class's
/// init arguments less `add_bos_token`, `add_eos_token`, `added_tokens_decoder`, the file
/// names and what the class consumes (`additional_special_tokens` as `extra_special_tokens`,
/// named special tokens as strings), plus `backend`, `is_local`, `local_files_only`,
/// `model_max_length` (transformers' `1e30` when absent), the class name and mlx-lm's
/// inferred `tool_parser_type`; keys sorted, indent 2; the chat template moved to
/// `chat_template.jinja`. `None` (files copied) without a `tokenizer.json`, for a class not
/// reproduced (said through `progress`) or several named templates.
fn tokenizer_files(
    src: &Path,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Option<Vec<(String, String)>>> {
    use mlx_tokenizers::hf_save::{self, Saved};
    let cfg_path = src.join("tokenizer_config.json");
    // One parse of the config (Python's json, `NaN` / `Infinity` included) for the class and
    // for what is written; a config that does not parse as an object is copied as it is.
    let Ok(text) = std::fs::read_to_string(&cfg_path) else {
        return Ok(None);
    };
    let Ok(Value::Object(mut cfg)) = crate::config::parse_python_json(&text) else {
        return Ok(None);
    };
    let saved = match hf_save::load(src, &cfg) {
        Ok(Saved::Files(s)) => s,
        Ok(Saved::NoTokenizer) => return Ok(None),
        Ok(Saved::Unsupported(class)) => {
            progress(Progress::Info(format!(
                "tokenizer class {class}: not re-saved as transformers saves it; its files are copied"
            )));
            return Ok(None);
        }
        Err(e) => {
            return Err(ModelError::Convert {
                option: cfg_path.display().to_string(),
                problem: format!("the tokenizer cannot be re-saved as transformers does: {e}"),
            })
        }
    };
    let template = match cfg.remove("chat_template") {
        Some(Value::String(t)) => Some(t),
        None | Some(Value::Null) => None,
        Some(_) => return Ok(None), // several named templates: not reproduced
    };
    // A `chat_template.jinja` beside the config takes priority over the config's entry.
    let template = match std::fs::read_to_string(src.join("chat_template.jinja")) {
        Ok(t) => Some(t),
        Err(_) => template,
    };
    // The class's init arguments where the config has none (its `__init__` defaults, then
    // what `tokenizer.json`'s padding and truncation set), less what the class consumes.
    for (k, v) in saved.class_defaults.iter().chain(&saved.json_defaults) {
        if !cfg.contains_key(k) {
            cfg.insert(k.clone(), v.clone());
        }
    }
    for k in saved.consumed.iter().chain(&saved.vocab_file_keys) {
        cfg.remove(k);
    }
    // Named special tokens are written as their strings (`special_tokens_map`).
    for k in hf_save::SPECIAL_TOKENS {
        if let Some(Value::Object(o)) = cfg.get(k) {
            if let Some(c) = o.get("content").cloned() {
                cfg.insert(k.into(), c);
            }
        }
    }
    // `additional_special_tokens` come back as `extra_special_tokens` (their contents).
    if let Some(Value::Array(extra)) = cfg.get("additional_special_tokens") {
        let names: Vec<Value> = extra
            .iter()
            .filter_map(|t| match t {
                Value::String(_) => Some(t.clone()),
                Value::Object(o) => o.get("content").cloned(),
                _ => None,
            })
            .collect();
        if !names.is_empty() && !cfg.contains_key("extra_special_tokens") {
            cfg.insert("extra_special_tokens".into(), Value::Array(names));
        }
    }
    for k in [
        "add_bos_token",
        "add_eos_token",
        "added_tokens_decoder",
        "additional_special_tokens",
        "name_or_path",
        "special_tokens_map_file",
        "tokenizer_file",
        "device_map",
        "slow_tokenizer_class",
        "files_loaded",
    ] {
        cfg.remove(k);
    }
    cfg.insert("backend".into(), Value::from("tokenizers"));
    cfg.insert("is_local".into(), Value::Bool(true));
    cfg.insert("local_files_only".into(), Value::Bool(false));
    const MAX_LEN: &str = "__mlx_transformers_very_large_integer__";
    if !cfg.contains_key("model_max_length") {
        cfg.insert("model_max_length".into(), Value::from(MAX_LEN));
    }
    cfg.insert("tokenizer_class".into(), Value::from(saved.class.clone()));
    if !cfg.contains_key("tool_parser_type") {
        let vocab = tokenizer_vocab(&src.join("tokenizer.json"));
        if let Some(t) = infer_tool_parser(template.as_deref(), &vocab) {
            cfg.insert("tool_parser_type".into(), Value::from(t));
        }
    }
    fn sorted(v: Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut kv: Vec<(String, Value)> = m.into_iter().collect();
                kv.sort_by(|a, b| a.0.cmp(&b.0));
                Value::Object(kv.into_iter().map(|(k, v)| (k, sorted(v))).collect())
            }
            Value::Array(a) => Value::Array(a.into_iter().map(sorted).collect()),
            v => v,
        }
    }
    let json = pyjson::dumps(&sorted(Value::Object(cfg)), 2, false)
        .replace(&format!("\"{MAX_LEN}\""), "1000000000000000019884624838656")
        + "\n";
    let mut out = vec![
        ("tokenizer_config.json".to_string(), json),
        ("tokenizer.json".to_string(), saved.tokenizer_json),
    ];
    if let Some(t) = template {
        out.push(("chat_template.jinja".into(), t));
    }
    Ok(Some(out))
}

/// The token strings of a `tokenizer.json` (model vocabulary and added tokens).
fn tokenizer_vocab(path: &Path) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let Ok(text) = std::fs::read_to_string(path) else {
        return out;
    };
    let Ok(v) = serde_json::from_str::<Value>(&text) else {
        return out;
    };
    match v.pointer("/model/vocab") {
        Some(Value::Object(m)) => out.extend(m.keys().cloned()),
        Some(Value::Array(a)) => out.extend(
            a.iter()
                .filter_map(|p| p.get(0).and_then(Value::as_str).map(String::from)),
        ),
        _ => {}
    }
    if let Some(Value::Array(a)) = v.get("added_tokens") {
        out.extend(
            a.iter()
                .filter_map(|t| t.get("content").and_then(Value::as_str).map(String::from)),
        );
    }
    out
}

/// mlx-lm's `_infer_tool_parser` (`tokenizer_utils.py`): the chat template's markers, then
/// the vocabulary's.
fn infer_tool_parser(
    template: Option<&str>,
    vocab: &std::collections::BTreeSet<String>,
) -> Option<&'static str> {
    if let Some(t) = template {
        let has = |s: &str| t.contains(s);
        let found = if has("<minimax:tool_call>") {
            Some("minimax_m2")
        } else if has("<|tool_call>") && has("<tool_call|>") {
            Some("gemma4")
        } else if has("<start_function_call>") {
            Some("function_gemma")
        } else if has("<longcat_tool_call>") {
            Some("longcat")
        } else if has("<arg_key>") {
            Some("glm47")
        } else if has("<|tool_list_start|>") || has("<|tool_call_start|>") {
            Some("pythonic")
        } else if has("<tool_call>\\n<function=") || has("<tool_call>\n<function=") {
            Some("qwen3_coder")
        } else if has("<|tool_calls_section_begin|>") {
            Some("kimi_k2")
        } else if has("<function name=\"") && has("<param name=\"") {
            Some("minicpm5")
        } else if has("[TOOL_CALLS]") {
            Some("mistral")
        } else if has("<atem:function_calls>") {
            Some("muse_spark")
        } else if has("<tool_call>") && has("tool_call.name") {
            Some("json_tools")
        } else {
            None
        };
        if found.is_some() {
            return found;
        }
    }
    let v = |s: &str| vocab.contains(s);
    if ["<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"]
        .iter()
        .all(|t| v(t))
    {
        Some("kimi_k3")
    } else if v("<|tool_call_start|>") && v("<|tool_call_end|>") {
        Some("pythonic")
    } else {
        None
    }
}

/// The tokenizer's files and what `save` copies: `*.py`, `generation_config.json`,
/// `tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json`, `tokenizer.model`,
/// `*.tiktoken`, `tiktoken.model`, `chat_template.jinja`, `chat_template.json`, `vocab.json`,
/// `merges.txt`, `added_tokens.json`.
fn copied_files(src: &Path) -> Result<Vec<PathBuf>> {
    const NAMES: [&str; 11] = [
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "tokenizer.model",
        "tiktoken.model",
        "chat_template.jinja",
        "chat_template.json",
        "vocab.json",
        "merges.txt",
        "added_tokens.json",
    ];
    let rd = std::fs::read_dir(src).map_err(|e| io_err(src, e))?;
    let mut out: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                NAMES.contains(&n) || n.ends_with(".py") || n.ends_with(".tiktoken")
            })
        })
        .filter(|p| p.is_file())
        .collect();
    out.sort();
    Ok(out)
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| io_err(path, e))
}

/// Whether `path` names an attention value projection that `--q-trellis-v-code` recodes: its
/// last component is `v_proj` (the families that keep q, k and v apart: llama, mistral,
/// qwen2/3, gemma, olmo2, ...). Fused q/k/v projections (`qkv_proj`, `query_key_value`,
/// `c_attn`) keep the model's code.
fn is_value_projection(path: &str) -> bool {
    path.rsplit('.').next() == Some("v_proj")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `tokenizer_config.json` as Python's json writes it (`NaN`) is read by the one parser
    /// convert uses, so the tokenizer is still re-saved rather than failing the conversion.
    #[test]
    fn a_tokenizer_config_with_nan_is_still_resaved() {
        let dir = std::env::temp_dir().join(format!("mlx-convert-nan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let tok = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
            "normalizer":null,
            "pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},
            "post_processor":null,
            "decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true},
            "model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,
              "end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,
              "vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}}"#;
        std::fs::write(dir.join("tokenizer.json"), tok).unwrap();
        std::fs::write(dir.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
        std::fs::write(
            dir.join("tokenizer_config.json"),
            r#"{"tokenizer_class": "GPT2TokenizerFast", "some_limit": NaN}"#,
        )
        .unwrap();
        let files = tokenizer_files(&dir, &mut |_| {});
        std::fs::remove_dir_all(&dir).unwrap();
        let files = files.unwrap().expect("the tokenizer is re-saved");
        let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert!(names.contains(&"tokenizer.json"), "{names:?}");
        assert!(names.contains(&"tokenizer_config.json"), "{names:?}");
    }
}

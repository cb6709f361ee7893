//! Dynamic quantization as mlx-lm 0.32.2 runs it (`mlx_lm/quant/dynamic_quant.py`, `python -m
//! mlx_lm.quant.dynamic_quant`), op for op in its order:
//!
//! - [`estimate_sensitivities`]: every quantizable module's weight (linears, the embedding, an
//!   untied `lm_head`) quantized and dequantized at the low bits; the gradient of
//!   `kl_div_loss(q_model(batch), model(batch)).mean()` with respect to those weights summed
//!   in float32 (or bfloat16) over batches of four calibration rows; a module's sensitivity is
//!   `sum(grad / n_batches * (qdq_low(w) - qdq_high(w))) / (w.size / 1e6)`.
//! - [`estimate_threshold`]: the binary search for the sensitivity above which a module takes
//!   the high bits, so that the model's `compute_bits_per_weight` reaches `--target-bpw`
//!   (computed from shapes and dtypes, what mlx-lm's `nn.quantize` of a copy gives).
//! - The model quantized by `convert` with the modules above the threshold at the high bits
//!   (`quantize_model` with the predicate's `{bits, group_size}`), written by mlx-lm's `save`.
//!
//! Tier L1 on CPU: the sensitivities are mlx-lm's float32 values bit for bit, and every output
//! tensor (name, dtype, shape, bytes), `config.json`, the index and the copied files equal
//! mlx-lm's (`mlx-cli/tests/quant.rs`, golden `cargo xtask goldens dynamic`); the safetensors
//! container orders its data otherwise, as every `save` here does.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use mlx_core::prelude::*;
use mlx_core::quantized::{self, QuantMode};

use crate::config::ModelConfig;
use crate::convert::{convert, ConvertOptions, ConvertReport, PerModule, Progress};
use crate::error::{ModelError, Result};
use crate::layers::{Embedding, Linear};
use crate::load::load_weights;
use crate::models::{build, build_recording, LanguageModel, TopModuleMut};
use crate::weights::{QuantizableModule, Weights};

/// `python -m mlx_lm.quant.dynamic_quant`'s quantization arguments.
#[derive(Clone, Debug)]
pub struct DynamicOptions {
    /// `--target-bpw`.
    pub target_bpw: f64,
    pub low_bits: i32,
    pub low_group_size: i32,
    pub high_bits: i32,
    pub high_group_size: i32,
    /// `--accumulation-dtype` (float32 or bfloat16).
    pub accumulation_dtype: Dtype,
    /// `--grad-checkpoint`.
    pub grad_checkpoint: bool,
    /// Rows a forward pass (mlx-lm's `batch_size=4`).
    pub batch_size: usize,
}

impl Default for DynamicOptions {
    fn default() -> Self {
        DynamicOptions {
            target_bpw: 5.0,
            low_bits: 4,
            low_group_size: 64,
            high_bits: 5,
            high_group_size: 64,
            accumulation_dtype: Dtype::Float32,
            grad_checkpoint: false,
            batch_size: 4,
        }
    }
}

fn bad(option: &str, problem: String) -> ModelError {
    ModelError::Convert {
        option: option.into(),
        problem,
    }
}

impl DynamicOptions {
    /// The options' own checks (before any model is read).
    pub fn validate(&self) -> Result<()> {
        QuantMode::Affine
            .check(self.low_group_size, self.low_bits)
            .map_err(|m| bad("--low-bits/--low-group-size", m.to_string()))?;
        QuantMode::Affine
            .check(self.high_group_size, self.high_bits)
            .map_err(|m| bad("--high-bits/--high-group-size", m.to_string()))?;
        if !self.target_bpw.is_finite() || self.target_bpw <= 0.0 {
            return Err(bad(
                "--target-bpw",
                format!("{}: must be a positive number", self.target_bpw),
            ));
        }
        if !matches!(self.accumulation_dtype, Dtype::Float32 | Dtype::Bfloat16) {
            return Err(bad(
                "--accumulation-dtype",
                "must be float32 or bfloat16".into(),
            ));
        }
        if self.batch_size == 0 {
            return Err(bad("batch size", "must be at least 1".into()));
        }
        Ok(())
    }
}

/// A loaded float model with its tensors and quantizable modules (mlx-lm's order).
pub struct Source {
    pub config: ModelConfig,
    pub tensors: BTreeMap<String, Array>,
    /// The model's parameters under mlx-lm's names (what `compute_bits_per_weight` counts).
    pub parameters: Vec<(String, Array)>,
    pub modules: Vec<QuantizableModule>,
}

impl Source {
    pub fn load(src: &Path) -> Result<Source> {
        if !src.is_dir() {
            return Err(bad(
                "--model",
                format!("{}: not a model directory", src.display()),
            ));
        }
        let config = ModelConfig::from_file(&src.join("config.json"))?;
        let tensors = load_weights(src)?;
        let built = build_recording(
            &config,
            Weights::new(tensors.clone(), config.quantization.clone(), None),
        )?;
        if let Some(m) = built.quantizable.iter().find(|m| m.quantized.is_some()) {
            return Err(bad(
                "--model",
                format!(
                    "{}: `{}` is already quantized; dynamic quantization starts from a float model",
                    src.display(),
                    m.path
                ),
            ));
        }
        Ok(Source {
            config,
            tensors,
            parameters: built.parameters,
            modules: built.quantizable,
        })
    }

    fn model(&self, tensors: BTreeMap<String, Array>) -> Result<Box<dyn LanguageModel>> {
        build(
            &self.config,
            Weights::new(tensors, self.config.quantization.clone(), None),
        )
    }

    fn weight(&self, path: &str) -> Result<&Array> {
        let name = format!("{path}.weight");
        self.tensors
            .get(&name)
            .ok_or_else(|| ModelError::Weights(vec![format!("missing: {name}")]))
    }
}

/// `qdq(w, bits, group_size)`: quantize, then dequantize.
fn qdq(w: &Array, bits: i32, group_size: i32) -> Result<Array> {
    let (wq, s, b) = quantized::quantize(w, group_size, bits, QuantMode::Affine, None)?;
    Ok(quantized::dequantize(
        &wq,
        &s,
        b.as_ref(),
        group_size,
        bits,
        QuantMode::Affine,
        None,
        None,
    )?)
}

/// mlx-lm's `kl_div_loss` off Metal: `nn.losses.kl_div_loss` of the two log-softmaxes, per
/// position.
pub fn kl_div_loss(logits_q: &Array, logits_p: &Array) -> Result<Array> {
    let q = (logits_q - &logits_q.logsumexp(&[-1], true)?)?;
    let p = (logits_p - &logits_p.logsumexp(&[-1], true)?)?;
    let e = ops::exp(&p, None)?;
    Ok((&e * &(&p - &q)?)?.sum(&[-1], false)?)
}

/// Writes `values` (`<module>.weight` by name) into the model's dense linears and embedding.
fn write_weights(model: &mut dyn LanguageModel, values: &ParamMap) -> Result<()> {
    let mut seen = BTreeSet::new();
    if let Some(model) = model.as_trainable_mut() {
        for layer in model.layer_parameters_mut()? {
            for p in layer {
                if let Some(v) = values.get(&p.name) {
                    *p.value = v.clone();
                    seen.insert(p.name);
                }
            }
        }
        for (path, m) in model.top_modules_mut() {
            let name = format!("{path}.weight");
            let Some(v) = values.get(&name) else { continue };
            match m {
                TopModuleMut::Linear(Linear::Dense { weight, .. }) => *weight = v.clone(),
                TopModuleMut::Embedding(Embedding::Dense(w)) => *w = v.clone(),
                _ => continue,
            }
            seen.insert(name);
        }
    }
    match values.keys().find(|k| !seen.contains(*k)) {
        Some(k) => Err(ModelError::Unsupported {
            what: k.clone(),
            problem: "dynamic quantization cannot reach this weight in the model".into(),
        }),
        None => Ok(()),
    }
}

/// `estimate_sensitivities`: each quantizable module's sensitivity, in mlx-lm's order (the
/// module tree's), as `.item()` gives them (float32 values).
pub fn estimate_sensitivities(
    src: &Source,
    data: &Array,
    opts: &DynamicOptions,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Vec<(String, f64)>> {
    opts.validate()?;
    if data.ndim() != 2 || data.shape()[0] == 0 {
        return Err(bad(
            "calibration data",
            format!(
                "needs (samples, sequence length) ids, not {:?}",
                data.shape()
            ),
        ));
    }
    let model = src.model(src.tensors.clone())?;
    // The low-bit copy: every quantizable weight through qdq.
    let mut low = BTreeMap::new();
    let mut q_tensors = src.tensors.clone();
    for m in &src.modules {
        if m.in_dims % opts.low_group_size != 0 {
            return Err(ModelError::Unsupported {
                what: m.path.clone(),
                problem: format!(
                    "{} input columns are not a multiple of --low-group-size {}",
                    m.in_dims, opts.low_group_size
                ),
            });
        }
        let name = format!("{}.weight", m.path);
        let w = qdq(src.weight(&m.path)?, opts.low_bits, opts.low_group_size)?;
        q_tensors.insert(name.clone(), w.clone());
        low.insert(name, w);
    }
    let mut q_model = src.model(q_tensors)?;
    if let (true, Some(t)) = (opts.grad_checkpoint, q_model.as_trainable_mut()) {
        t.set_grad_checkpoint(true);
    }
    let q_model = RefCell::new(q_model);

    let loss_fn = |p: &ParamMap, others: &[Array]| -> mlx_core::Result<Vec<Array>> {
        let mut m = q_model.borrow_mut();
        write_weights(m.as_mut(), p).map_err(|e| mlx_core::Error::Callback(e.to_string()))?;
        let logits = m
            .forward(&others[0], None)
            .map_err(|e| mlx_core::Error::Callback(e.to_string()))?;
        let l = kl_div_loss(&logits, &others[1])
            .map_err(|e| mlx_core::Error::Callback(e.to_string()))?;
        Ok(vec![l.mean_all(false)?])
    };
    let vg = transforms::value_and_grad_tree(loss_fn);

    let mut accum: ParamMap = low
        .iter()
        .map(|(k, v)| {
            Ok((
                k.clone(),
                ops::zeros(&v.shape(), opts.accumulation_dtype, None)?,
            ))
        })
        .collect::<Result<_>>()?;
    let n = data.shape()[0];
    let len = data.shape()[1];
    let bs = opts.batch_size as i32;
    progress(Progress::Stage(
        "Estimating sensitivities",
        (n as usize) / opts.batch_size,
    ));
    for s in (0..n).step_by(opts.batch_size) {
        let e = (s + bs).min(n);
        let batch = data.slice(&[s, 0], &[e, len], &[1, 1])?;
        let targets = model.forward(&batch, None)?;
        mlx_core::eval([&targets])?;
        let (_, grads) = vg(&low, &[batch, targets])?;
        write_weights(q_model.borrow_mut().as_mut(), &low)?;
        for (k, g) in grads {
            if let Some(a) = accum.get_mut(&k) {
                *a = (&*a + &g)?;
            }
        }
        mlx_core::eval(accum.values())?;
        progress(Progress::Tensor("batch"));
    }

    let n_batches = (n as usize).div_ceil(opts.batch_size);
    let mut out = Vec::with_capacity(src.modules.len());
    for m in &src.modules {
        let name = format!("{}.weight", m.path);
        let (g, lw) = match (accum.get(&name), low.get(&name)) {
            (Some(g), Some(l)) => (g, l),
            _ => return Err(ModelError::Weights(vec![format!("missing: {name}")])),
        };
        let orig = src.weight(&m.path)?;
        let g = (g / &Array::from_f32(n_batches as f32, g.dtype())?)?;
        let high = qdq(orig, opts.high_bits, opts.high_group_size)?;
        let param_size = orig.size() as f64 / 1e6;
        let alignment = (&g * &(lw - &high)?)?.sum_all(false)?;
        let s = (&alignment / &Array::from_f32(param_size as f32, alignment.dtype())?)?;
        let v = s.astype(Dtype::Float32)?.item::<f32>()?;
        out.push((m.path.clone(), f64::from(v)));
    }
    Ok(out)
}

/// The bits per weight of the model with the `high` modules at the high bits and the rest at
/// the low ones (mlx-lm's `compute_bits_per_weight` of `nn.quantize` on a copy), from shapes and
/// dtypes.
pub fn bits_per_weight(src: &Source, high: &BTreeSet<&str>, opts: &DynamicOptions) -> f64 {
    let quant: BTreeMap<&str, (i32, i32)> = src
        .modules
        .iter()
        .map(|m| {
            let q = if high.contains(m.path.as_str()) {
                (opts.high_bits, opts.high_group_size)
            } else {
                (opts.low_bits, opts.low_group_size)
            };
            (m.path.as_str(), q)
        })
        .collect();
    let mut bytes: u64 = 0;
    let mut params: u64 = 0;
    for (name, a) in &src.parameters {
        let (module, leaf) = name.rsplit_once('.').unwrap_or(("", name));
        match quant.get(module) {
            Some(&(bits, gs)) if leaf == "weight" => {
                let sh = a.shape();
                let cols = i64::from(*sh.last().unwrap_or(&0));
                let rows = a.size() as i64 / cols.max(1);
                let packed = rows * (cols * i64::from(bits) / 32);
                let groups = rows * (cols / i64::from(gs));
                let item = a.itemsize() as i64;
                bytes += (packed * 4 + 2 * groups * item) as u64;
                params += (packed * 32 / i64::from(bits)) as u64;
            }
            _ => {
                bytes += a.nbytes() as u64;
                params += a.size() as u64;
            }
        }
    }
    if params == 0 {
        0.0
    } else {
        (bytes * 8) as f64 / params as f64
    }
}

/// `estimate_threshold`: the binary search over the sensitivities' range.
pub fn estimate_threshold(
    src: &Source,
    sensitivities: &BTreeMap<String, f64>,
    opts: &DynamicOptions,
) -> Result<f64> {
    let mut lo = f64::INFINITY;
    let mut hi = f64::NEG_INFINITY;
    for m in &src.modules {
        let s = *sensitivities.get(&m.path).ok_or_else(|| {
            bad(
                "--sensitivities",
                format!("no sensitivity for `{}`", m.path),
            )
        })?;
        lo = lo.min(s);
        hi = hi.max(s);
    }
    if src.modules.is_empty() {
        return Err(ModelError::Unsupported {
            what: format!("model type `{}`", src.config.model_type),
            problem: "no quantizable modules".into(),
        });
    }
    let tolerance = 1e-3 * (hi - lo);
    while (hi - lo) > tolerance {
        let mid = (hi + lo) / 2.0;
        let high: BTreeSet<&str> = src
            .modules
            .iter()
            .filter(|m| sensitivities[&m.path] > mid)
            .map(|m| m.path.as_str())
            .collect();
        if bits_per_weight(src, &high, opts) > opts.target_bpw {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok((hi + lo) / 2.0)
}

/// The modules above the threshold (the predicate's high-bit choice).
pub fn high_modules(
    src: &Source,
    sensitivities: &BTreeMap<String, f64>,
    threshold: f64,
) -> BTreeSet<String> {
    src.modules
        .iter()
        .filter(|m| sensitivities.get(&m.path).is_some_and(|&s| s > threshold))
        .map(|m| m.path.clone())
        .collect()
}

/// `quantize_model(model, config, low_group_size, low_bits, quant_predicate)` and `save`.
pub fn quantize_and_save(
    src_dir: &Path,
    dst: &Path,
    high: BTreeSet<String>,
    opts: &DynamicOptions,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<ConvertReport> {
    let copts = ConvertOptions {
        quantize: true,
        q_group_size: Some(opts.low_group_size),
        q_bits: Some(opts.low_bits),
        per_module: Some(PerModule {
            bits: opts.high_bits,
            group_size: opts.high_group_size,
            paths: high,
        }),
        keep_dtype: true,
        ..ConvertOptions::default()
    };
    convert(src_dir, dst, &copts, progress)
}

/// `eval_ppl(model, data, batch_size=8)`: the perplexity of the model on the rows.
pub fn eval_ppl(model: &dyn LanguageModel, data: &Array) -> Result<f64> {
    let n = data.shape()[0];
    let len = data.shape()[1];
    let mut all_loss = 0.0f64;
    let mut ntoks = 0usize;
    for s in (0..n).step_by(8) {
        let e = (s + 8).min(n);
        let inputs = data.slice(&[s, 0], &[e, len - 1], &[1, 1])?;
        let targets = data.slice(&[s, 1], &[e, len], &[1, 1])?;
        let logits = model.forward(&inputs, None)?.astype(Dtype::Float32)?;
        // `nn.losses.cross_entropy(logits, targets)` off the GPU: the logits less their
        // maximum, then logsumexp minus the target's logit.
        let top = logits.max(&[-1], true)?;
        let logits = (&logits - &top)?;
        let score =
            ops::take_along_axis(&logits, &ops::expand_dims(&targets, &[-1], None)?, -1, None)?
                .squeeze(&[-1])?;
        let losses = (&logits.logsumexp(&[-1], false)? - &score)?;
        all_loss += f64::from(losses.sum_all(false)?.item::<f32>()?);
        ntoks += losses.size();
    }
    Ok((all_loss / ntoks as f64).exp())
}

/// The sensitivities file mlx-lm writes (`json.dump` of `[[path, value], ...]`).
pub fn sensitivities_json(s: &[(String, f64)]) -> String {
    let v = serde_json::Value::Array(
        s.iter()
            .map(|(k, x)| {
                serde_json::Value::Array(vec![
                    serde_json::Value::from(k.as_str()),
                    serde_json::Number::from_f64(*x)
                        .map_or(serde_json::Value::Null, serde_json::Value::Number),
                ])
            })
            .collect(),
    );
    crate::pyjson::dumps_inline(&v, true)
}

/// Reads a sensitivities file (`--sensitivities`): `[[path, value], ...]`.
pub fn read_sensitivities(path: &Path) -> Result<BTreeMap<String, f64>> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ModelError::Config(format!("{}: invalid JSON: {e}", path.display())))?;
    let bad_row = |i: usize| {
        ModelError::Config(format!(
            "{}: entry {i} is not a [module path, number] pair",
            path.display()
        ))
    };
    let rows = v.as_array().ok_or_else(|| {
        ModelError::Config(format!(
            "{}: not a list of [module path, number] pairs",
            path.display()
        ))
    })?;
    rows.iter()
        .enumerate()
        .map(|(i, r)| match r.as_array().map(Vec::as_slice) {
            Some([k, x]) => match (k.as_str(), x.as_f64()) {
                (Some(k), Some(x)) => Ok((k.to_string(), x)),
                _ => Err(bad_row(i)),
            },
            _ => Err(bad_row(i)),
        })
        .collect()
}

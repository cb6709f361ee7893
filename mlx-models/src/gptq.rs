//! GPTQ as mlx-lm 0.32.2 runs it (`mlx_lm/quant/gptq.py`, `python -m mlx_lm.quant.gptq`),
//! op for op in its order: every plain linear's input Hessian `H = sum x^T x` accumulated over
//! the calibration batches (eight rows at a time, on the unquantized model), damping by 1% of
//! its mean diagonal, `Hinv = cholesky(cholesky_inv(cholesky(H)), upper)`, then per group of
//! columns the group's affine scales and biases and the column-by-column error feedback (the
//! rest of the group at once per column, the columns after the group once per group), the
//! compiled `gptq_error` and mlx-lm's own packing. Every other quantizable module (embeddings)
//! takes plain affine quantization at the fallback bits and group size. The output directory
//! is written by `convert`'s `save` (mlx-lm's `save`).
//!
//! Tier L1 on CPU: the tensors equal mlx-lm's bit for bit (`mlx-cli/tests/quant.rs`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use mlx_core::compile::compile;
use mlx_core::prelude::*;
use mlx_core::quantized::{self, QuantMode};
use serde_json::{Map, Value};

use crate::convert::{ConvertReport, LayerQuant, Progress};
use crate::error::{ModelError, Result};
use crate::layers::{Linear, LinearAdapter, LinearMut};
use crate::learned::{bad, check_run, load_source, splice_and_save, Source};
use crate::models::{build, build_recording, TopModuleMut};
use crate::weights::Weights;

/// `python -m mlx_lm.quant.gptq`'s quantization arguments.
#[derive(Clone, Debug)]
pub struct GptqOptions {
    /// `--bits` (2, 4 or 8, as mlx-lm's packing asserts).
    pub bits: i32,
    /// `--group-size`.
    pub group_size: i32,
    /// `--fallback-bits`: the modules GPTQ does not handle (embeddings).
    pub fallback_bits: i32,
    /// `--fallback-group-size`.
    pub fallback_group_size: i32,
    /// Rows of calibration data a forward pass (mlx-lm's `batch_size=8`).
    pub batch_size: usize,
}

impl Default for GptqOptions {
    fn default() -> Self {
        GptqOptions {
            bits: 4,
            group_size: 64,
            fallback_bits: 6,
            fallback_group_size: 64,
            batch_size: 8,
        }
    }
}

/// mlx-lm's `Catcher`: records `H = H + xf^T xf` of the inputs, then runs the linear.
#[derive(Clone, Debug)]
struct Catcher {
    base: Linear,
    h: Arc<Mutex<Array>>,
}

impl LinearAdapter for Catcher {
    fn forward(&self, x: &Array) -> Result<Array> {
        let xf = x.flatten(0, -2)?;
        let xtx = ops::matmul(&xf.t()?, &xf, None)?;
        let mut h = self.h.lock().map_err(|_| poisoned())?;
        *h = (&*h + &xtx)?;
        self.base.forward(x)
    }
    fn clone_box(&self) -> Box<dyn LinearAdapter> {
        Box::new(self.clone())
    }
    fn base(&self) -> &Linear {
        &self.base
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

fn poisoned() -> ModelError {
    ModelError::Internal {
        what: "gptq".into(),
        problem: "a Hessian lock was poisoned".into(),
    }
}

/// Wraps a dense linear in a [`Catcher`]; `None` for anything else (mlx-lm's `type(l) in
/// {nn.Linear, SwitchLinear}` skips quantized linears).
fn catch(l: &mut Linear) -> Result<Option<Arc<Mutex<Array>>>> {
    if !matches!(l, Linear::Dense { .. }) {
        return Ok(None);
    }
    let h = Arc::new(Mutex::new(Array::from_f32(0.0, Dtype::Float32)?));
    let base = l.clone();
    *l = Linear::Adapted(Box::new(Catcher {
        base,
        h: Arc::clone(&h),
    }));
    Ok(Some(h))
}

fn hessian(h: &Arc<Mutex<Array>>) -> Result<Array> {
    Ok(h.lock().map_err(|_| poisoned())?.clone())
}

/// `compute_inverse_hessian`: damping, then `cholesky`, `cholesky_inv`, `cholesky(upper)` on
/// the CPU.
fn inverse_hessian(h: &Array) -> Result<Array> {
    let cpu = Stream::cpu()?;
    let s = Some(&cpu);
    let n = h.shape()[0];
    // `mx.diag(H)`: the same values the gather of the diagonal gives.
    let idx: Vec<i32> = (0..n).map(|i| i * n + i).collect();
    let diag = ops::take(&h.flatten(0, -1)?, &Array::from_slice(&idx, &[n])?, 0, s)?;
    let damp = (&diag.mean_all(false)? * &Array::from_f32(1e-2, Dtype::Float32)?)?;
    // `H[diag, diag] += damp`: only the diagonal changes.
    let eye = ops::eye(n, n, 0, Dtype::Bool, s)?;
    let damped = ops::where_(&eye, &(h + &damp)?, h, s)?;
    let l = ops::cholesky(&damped, false, s)?;
    let inv = ops::cholesky_inv(&l, false, s)?;
    Ok(ops::cholesky(&inv, true, s)?)
}

/// mlx-lm's `quantize(w, bits, scales, biases)`: the codes of `w` under the given scales and
/// biases, packed `32 / bits` to a `uint32`, lowest bits first.
fn pack(w: &Array, bits: i32, scales: &Array, biases: &Array) -> Result<Array> {
    let el_per_int = 32 / bits;
    let n_bins = ((1i32 << bits) - 1) as f32;
    let groups = scales.shape()[scales.ndim() - 1];
    let w = ops::unflatten(w, -1, &[groups, -1], None)?;
    let b = ops::expand_dims(biases, &[-1], None)?;
    let sc = ops::expand_dims(scales, &[-1], None)?;
    let q = ops::round(&((&w - &b)? / &sc)?, 0, None)?;
    let q = ops::clip_scalar(&q, Some(0.0f32.into()), Some(n_bins.into()), None)?
        .astype(Dtype::Uint32)?;
    let shifts: Vec<u32> = (0..el_per_int).map(|i| 1u32 << (i * bits)).collect();
    let shifts = Array::from_slice(&shifts, &[el_per_int])?;
    let q = ops::unflatten(&q, -1, &[-1, el_per_int], None)?;
    let packed = (&q * &shifts)?.sum(&[-1], false)?;
    Ok(packed.flatten(-2, -1)?)
}

/// The GPTQ rounding of one linear's float32 weight `(out, in)` given its inverse Hessian's
/// upper Cholesky factor: the updated weight and the groups' scales and biases (float32).
fn gptq_layer(
    weight: &Array,
    hinv: &Array,
    bits: i32,
    group_size: i32,
    error: &mlx_core::compile::Compiled<'_>,
) -> Result<(Array, Array, Array)> {
    let mut w = weight.astype(Dtype::Float32)?;
    let sh = w.shape();
    let (rows, cols) = (sh[0], sh[1]);
    if cols % group_size != 0 {
        return Err(ModelError::Unsupported {
            what: format!("{cols} input columns"),
            problem: format!("not a multiple of the group size {group_size}"),
        });
    }
    let mut all_scales = Vec::new();
    let mut all_biases = Vec::new();
    for i in (0..cols).step_by(group_size as usize) {
        let j = i + group_size;
        let wl = w.slice(&[0, i], &[rows, j], &[1, 1])?;
        let mut err = ops::zeros(&[rows, group_size], Dtype::Float32, None)?;
        let (_, scales, biases) =
            quantized::quantize(&wl, group_size, bits, QuantMode::Affine, None)?;
        let biases = biases.ok_or_else(|| ModelError::Internal {
            what: "gptq".into(),
            problem: "affine quantization gave no biases".into(),
        })?;
        for k in i..j {
            let col = w.slice(&[0, k], &[rows, k + 1], &[1, 1])?;
            let d = hinv
                .slice(&[k, k], &[k + 1, k + 1], &[1, 1])?
                .reshape(&[])?;
            let e = crate::layers::activations::one(
                error.call(&[col, d, scales.clone(), biases.clone()])?,
                "gptq_error",
            )?;
            let hrow = hinv.slice(&[k, k], &[k + 1, j], &[1, 1])?;
            let part = w.slice(&[0, k], &[rows, j], &[1, 1])?;
            let upd = (&part - &ops::matmul(&e, &hrow, None)?)?;
            w = ops::slice_update(&w, &upd, &[0, k], &[rows, j], &[1, 1], None)?;
            err = ops::slice_update(&err, &e, &[0, k - i], &[rows, k - i + 1], &[1, 1], None)?;
            mlx_core::eval([&err, &w])?;
        }
        if j < cols {
            let rest = w.slice(&[0, j], &[rows, cols], &[1, 1])?;
            let h = hinv.slice(&[i, j], &[j, cols], &[1, 1])?;
            let upd = (&rest - &ops::matmul(&err, &h, None)?)?;
            w = ops::slice_update(&w, &upd, &[0, j], &[rows, cols], &[1, 1], None)?;
        }
        all_scales.push(scales);
        all_biases.push(biases);
    }
    let s: Vec<&Array> = all_scales.iter().collect();
    let b: Vec<&Array> = all_biases.iter().collect();
    Ok((
        w,
        ops::concatenate(&s, -1, None)?,
        ops::concatenate(&b, -1, None)?,
    ))
}

/// Runs GPTQ on the model directory `src` with the calibration rows `data` (`(samples,
/// sequence_length)` token ids) and writes the quantized model to `dst` (mlx-lm's `save`:
/// written into a temporary sibling, then renamed).
pub fn gptq(
    src: &Path,
    dst: &Path,
    data: &Array,
    opts: &GptqOptions,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<ConvertReport> {
    check_run(dst, data)?;
    if ![2, 4, 8].contains(&opts.bits) {
        return Err(bad(
            "--bits",
            format!("{}: mlx-lm's GPTQ packs 2, 4 or 8 bits", opts.bits),
        ));
    }
    QuantMode::Affine
        .check(opts.group_size, opts.bits)
        .map_err(|m| bad("--group-size", m.to_string()))?;
    QuantMode::Affine
        .check(opts.fallback_group_size, opts.fallback_bits)
        .map_err(|m| bad("--fallback-bits/--fallback-group-size", m.to_string()))?;
    if opts.batch_size == 0 {
        return Err(bad("batch size", "must be at least 1".into()));
    }
    let Source {
        config,
        model_config,
        tensors,
    } = load_source(src, progress)?;
    let quant = model_config.quantization.clone();
    let mut model = build(
        &model_config,
        Weights::new(tensors.clone(), quant.clone(), None),
    )?;

    // The Catchers, in mlx-lm's `tree_flatten(model.leaf_modules())` order: the layers' linears,
    // then an untied lm_head.
    let mut caught: Vec<(String, Arc<Mutex<Array>>)> = Vec::new();
    let none = || ModelError::Unsupported {
        what: format!("model type `{}`", model_config.model_type),
        problem: "GPTQ needs its linears (none are exposed to adapters)".into(),
    };
    let params = model.as_trainable_mut().ok_or_else(none)?;
    let layers_path = params.layers_path();
    for (li, layer) in params.layer_adaptables_mut().into_iter().enumerate() {
        for (name, l) in layer {
            let l = match l {
                LinearMut::Linear(l) => l,
                LinearMut::Switch(_) => {
                    return Err(ModelError::Unsupported {
                        what: format!("{layers_path}.{li}.{name}"),
                        problem: "GPTQ of expert (switch) linears is not implemented".into(),
                    })
                }
            };
            if let Some(h) = catch(l)? {
                caught.push((format!("{layers_path}.{li}.{name}"), h));
            }
        }
    }
    if caught.is_empty() {
        return Err(none());
    }
    for (path, m) in params.top_modules_mut() {
        if let TopModuleMut::Linear(l) = m {
            if let Some(h) = catch(l)? {
                caught.push((path, h));
            }
        }
    }

    // "Computing Hessians".
    let n = data.shape()[0];
    let len = data.shape()[1];
    let batches = (n as usize).div_ceil(opts.batch_size);
    progress(Progress::Stage("Computing Hessians", batches));
    for s in (0..n).step_by(opts.batch_size) {
        let e = (s + opts.batch_size as i32).min(n);
        let batch = data.slice(&[s, 0], &[e, len], &[1, 1])?;
        let _ = model.forward(&batch, None)?;
        let hs = caught
            .iter()
            .map(|(_, h)| hessian(h))
            .collect::<Result<Vec<_>>>()?;
        mlx_core::eval(hs.iter())?;
        progress(Progress::Tensor("batch"));
    }
    drop(model);

    // The parameters under mlx-lm's names, in load order.
    let built = build_recording(&model_config, Weights::new(tensors, quant, None))?;
    let params = built.parameters;
    let index: BTreeMap<String, usize> = params
        .iter()
        .enumerate()
        .map(|(i, (n, _))| (n.clone(), i))
        .collect();
    let n_bins = ((1i32 << opts.bits) - 1) as f32;
    // `@mx.compile def gptq_error(w, d, scales, biases)`.
    let error = compile(
        move |xs: &[Array]| {
            let (w, d, scales, biases) = (&xs[0], &xs[1], &xs[2], &xs[3]);
            let q = ops::round(&((w - biases)? / scales)?, 0, None)?;
            let q = ops::clip_scalar(&q, Some(0.0f32.into()), Some(n_bins.into()), None)?;
            let q = (&(scales * &q)? + biases)?;
            Ok(vec![((w - &q)? / d)?])
        },
        false,
    )?;

    let mut quantized: BTreeMap<String, LayerQuant> = BTreeMap::new();
    let mut replaced: BTreeMap<String, Vec<(String, Array)>> = BTreeMap::new();
    progress(Progress::Stage("Quantizing", caught.len()));
    for (path, h) in &caught {
        let wname = format!("{path}.weight");
        let &wi = index
            .get(&wname)
            .ok_or_else(|| ModelError::Weights(vec![format!("missing: {wname}")]))?;
        let h = hessian(h)?;
        if h.ndim() != 2 {
            return Err(ModelError::Unsupported {
                what: path.clone(),
                problem: "no input reached it in the calibration forward".into(),
            });
        }
        let hinv = inverse_hessian(&h)?;
        mlx_core::eval([&hinv])?;
        let orig = params[wi].1.dtype();
        let (w, scales, biases) =
            gptq_layer(&params[wi].1, &hinv, opts.bits, opts.group_size, &error).map_err(|e| {
                match e {
                    ModelError::Unsupported { what, problem } => ModelError::Unsupported {
                        what: format!("{path}: {what}"),
                        problem,
                    },
                    e => e,
                }
            })?;
        let wq = pack(&w, opts.bits, &scales, &biases)?;
        let scales = scales.astype(orig)?;
        let biases = biases.astype(orig)?;
        mlx_core::eval([&wq, &scales, &biases])?;
        replaced.insert(
            wname.clone(),
            vec![
                (wname.clone(), wq),
                (format!("{path}.scales"), scales),
                (format!("{path}.biases"), biases),
            ],
        );
        quantized.insert(
            path.clone(),
            LayerQuant {
                group_size: Some(opts.group_size),
                bits: opts.bits,
                mode: QuantMode::Affine,
                trellis: None,
            },
        );
        progress(Progress::Tensor(&wname));
    }

    // mlx-lm's config: bits and group size, then each fallback module's.
    let mut qblock = Map::new();
    qblock.insert("bits".into(), Value::from(opts.bits));
    qblock.insert("group_size".into(), Value::from(opts.group_size));
    let caught_paths: std::collections::BTreeSet<&str> =
        caught.iter().map(|(p, _)| p.as_str()).collect();
    for m in &built.quantizable {
        if caught_paths.contains(m.path.as_str()) || m.quantized.is_some() {
            continue;
        }
        if m.linear {
            return Err(ModelError::Unsupported {
                what: m.path.clone(),
                problem: "a linear GPTQ does not reach here (mlx-lm would run GPTQ on it)".into(),
            });
        }
        let wname = format!("{}.weight", m.path);
        let &wi = index
            .get(&wname)
            .ok_or_else(|| ModelError::Weights(vec![format!("missing: {wname}")]))?;
        let (wq, scales, biases) = quantized::quantize(
            &params[wi].1,
            opts.fallback_group_size,
            opts.fallback_bits,
            QuantMode::Affine,
            None,
        )?;
        let mut parts = vec![(wname.clone(), wq), (format!("{}.scales", m.path), scales)];
        if let Some(b) = biases {
            parts.push((format!("{}.biases", m.path), b));
        }
        replaced.insert(wname.clone(), parts);
        let mut fb = Map::new();
        fb.insert("bits".into(), Value::from(opts.fallback_bits));
        fb.insert("group_size".into(), Value::from(opts.fallback_group_size));
        qblock.insert(m.path.clone(), Value::Object(fb));
        quantized.insert(
            m.path.clone(),
            LayerQuant {
                group_size: Some(opts.fallback_group_size),
                bits: opts.fallback_bits,
                mode: QuantMode::Affine,
                trellis: None,
            },
        );
    }
    splice_and_save(
        src, dst, params, replaced, &quantized, config, qblock, progress,
    )
}

//! AWQ as mlx-lm 0.32.2 runs it (`mlx_lm/quant/awq.py`, `python -m mlx_lm.quant.awq`) with
//! its `llama_awq` recipe, op for op in its order: the input embedding quantized first (its
//! output is the first block's input), then block by block: the linears' inputs captured in
//! a float forward, the plain-quantized block's loss, the activation-aware scale search over
//! `n_grid` ratios for q/k/v (scaled into `input_layernorm`), down (into `up_proj`) and
//! gate/up (into `post_attention_layernorm`), the clip search on every linear but q/k (ten
//! shrink steps per group, in batches of 64 rows, on at most 512 strided input rows), then the
//! block quantized, kept only when its loss is below the plain one; the next block's input is
//! the float block's output. An untied `lm_head` is quantized last with the embedding's
//! bits. `config.json`'s quantization block is mlx-lm's `update_config`: a dummy
//! `{group_size: 64, bits: 4}`, then every leaf module of the llama class (`false` for the
//! unquantized ones).
//!
//! `gemma3_text` takes `gemma3_text_awq`: the same three scale groups with the MLP's input
//! norm `pre_feedforward_layernorm`, folded into Gemma's `1 + w` weights by
//! `((1 + w) / s - 1)` in float32; as in mlx-lm, the blocks see the embedding without its
//! `sqrt(hidden)` scale and every block (sliding ones too) runs under the one causal mask.
//!
//! Tier L1 on CPU (`mlx-cli/tests/quant.rs`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use mlx_core::prelude::*;
use mlx_core::quantized::{self, QuantMode};
use serde_json::{Map, Value};

use crate::convert::{ConvertReport, LayerQuant, Progress};
use crate::error::{ModelError, Result};
use crate::layers::{Embedding, Linear, LinearAdapter, Norm, QuantizedWeight};
use crate::learned::{bad, check_run, load_source, splice_and_save, Source};
use crate::models::dense::{AwqPart, Model as Dense};
use crate::models::{build, build_recording, LanguageModel, Trainable};
use crate::weights::Weights;

/// The model types AWQ runs here: `AWQ_MODEL_CONFIGS`' `llama_awq` rows (llama, mistral,
/// ministral3 with its `llama_4_scaling` query scales, qwen2, qwen3, and the
/// `lm_key="language_model"` wrappers mistral3 and llava), `gemma3_text_awq`'s `gemma3_text`,
/// and its wrapper `gemma3`.
pub const AWQ_TYPES: [&str; 9] = [
    "llama",
    "mistral",
    "ministral3",
    "mistral3",
    "llava",
    "qwen2",
    "qwen3",
    "gemma3_text",
    "gemma3",
];

/// `python -m mlx_lm.quant.awq`'s quantization arguments.
#[derive(Clone, Debug)]
pub struct AwqOptions {
    pub bits: i32,
    pub group_size: i32,
    pub embed_bits: i32,
    pub embed_group_size: i32,
    pub n_grid: i32,
}

impl Default for AwqOptions {
    fn default() -> Self {
        AwqOptions {
            bits: 4,
            group_size: 64,
            embed_bits: 4,
            embed_group_size: 32,
            n_grid: 20,
        }
    }
}

/// mlx-lm's `Catcher` for AWQ: keeps each input, then runs the linear.
#[derive(Clone, Debug)]
struct Capture {
    base: Linear,
    feats: Arc<Mutex<Vec<Array>>>,
}

impl LinearAdapter for Capture {
    fn forward(&self, x: &Array) -> Result<Array> {
        self.feats
            .lock()
            .map_err(|_| internal("a capture lock was poisoned"))?
            .push(x.clone());
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

fn internal(problem: &str) -> ModelError {
    ModelError::Internal {
        what: "awq".into(),
        problem: problem.into(),
    }
}

fn scalar(v: f32, dtype: Dtype) -> Result<Array> {
    Ok(Array::from_f32(v, dtype)?)
}

/// `mse(x, y) = ((x - y).astype(float32)) ** 2`.
fn mse(x: &Array, y: &Array) -> Result<Array> {
    let d = (x - y)?.astype(Dtype::Float32)?;
    Ok(ops::power(&d, &scalar(2.0, Dtype::Float32)?, None)?)
}

/// `mse(a, b).sum() / a.size` (the distributed sum over one process is the value itself).
fn mean_loss(a: &Array, b: &Array) -> Result<Array> {
    let s = mse(a, b)?.sum_all(false)?;
    Ok((&s / &scalar(a.size() as f32, Dtype::Float32)?)?)
}

fn weight_of(l: &Linear) -> Result<Array> {
    match l {
        Linear::Dense { weight, .. } => Ok(weight.clone()),
        _ => Err(internal("a linear that should be dense is not")),
    }
}

fn set_weight(l: &mut Linear, w: Array) -> Result<()> {
    match l {
        Linear::Dense { weight, .. } => {
            *weight = w;
            Ok(())
        }
        _ => Err(internal("a linear that should be dense is not")),
    }
}

fn norm_weight(n: &mut Norm) -> Result<&mut Array> {
    match n {
        Norm::Rms(r) | Norm::RmsOffset(r) => Ok(&mut r.weight),
        _ => Err(internal("a norm that should be an RMS norm is not")),
    }
}

/// `apply_scale`'s norm branches: `w / s` for `nn.RMSNorm`; for Gemma's `RMSNorm` (`1 + w`),
/// `((1 + w.astype(float32)) / s - 1).astype(w.dtype)`.
fn scale_norm(n: &mut Norm, s: &Array) -> Result<()> {
    match n {
        Norm::Rms(r) => r.weight = (&r.weight / s)?,
        Norm::RmsOffset(r) => {
            let dt = r.weight.dtype();
            let one = scalar(1.0, Dtype::Float32)?;
            let w = (&(&one + &r.weight.astype(Dtype::Float32)?)? / s)?;
            r.weight = (&w - &one)?.astype(dt)?;
        }
        _ => return Err(internal("a norm that should be an RMS norm is not")),
    }
    Ok(())
}

fn quantized_weight(w: &Array, group_size: i32, bits: i32) -> Result<QuantizedWeight> {
    let (weight, scales, biases) =
        quantized::quantize(w, group_size, bits, QuantMode::Affine, None)?;
    Ok(QuantizedWeight {
        weight,
        scales,
        biases,
        group_size,
        bits,
        mode: QuantMode::Affine,
        lookup_dtype: None,
        symmetric: false,
    })
}

struct Run<'m> {
    model: &'m mut Dense,
    opts: AwqOptions,
}

impl Run<'_> {
    /// `quantize_func`: quantize, then dequantize.
    fn qdq(&self, w: &Array) -> Result<Array> {
        let (g, b) = (self.opts.group_size, self.opts.bits);
        let (wq, s, bi) = quantized::quantize(w, g, b, QuantMode::Affine, None)?;
        Ok(quantized::dequantize(
            &wq,
            &s,
            bi.as_ref(),
            g,
            b,
            QuantMode::Affine,
            None,
            None,
        )?)
    }

    /// Layer `i`'s linears' weights by name.
    fn weights(&mut self, i: usize) -> Result<BTreeMap<String, Array>> {
        let lm = self.model.awq_layer_mut(i)?;
        lm.linears
            .into_iter()
            .map(|(n, l)| Ok((n, weight_of(l)?)))
            .collect()
    }

    fn set_weights(&mut self, i: usize, w: &BTreeMap<String, Array>) -> Result<()> {
        let lm = self.model.awq_layer_mut(i)?;
        for (n, l) in lm.linears {
            if let Some(a) = w.get(&n) {
                set_weight(l, a.clone())?;
            }
        }
        Ok(())
    }

    /// One part of layer `i`, or (`None`) the linear `down` alone.
    fn part(&mut self, i: usize, part: Option<AwqPart>, linear: &str, x: &Array) -> Result<Array> {
        match part {
            Some(p) => self.model.awq_run(i, p, x),
            None => {
                let lm = self.model.awq_layer_mut(i)?;
                let l = lm
                    .linears
                    .into_iter()
                    .find(|(n, _)| n == linear)
                    .ok_or_else(|| internal("a recipe linear is missing"))?;
                l.1.forward(x)
            }
        }
    }

    /// `run_layer`: the part over batches of 32 rows, each evaluated, concatenated.
    fn run_layer(
        &mut self,
        i: usize,
        part: Option<AwqPart>,
        linear: &str,
        x: &Array,
    ) -> Result<Array> {
        let n = x.shape()[0];
        let mut ys = Vec::new();
        for s in (0..n).step_by(32) {
            let e = (s + 32).min(n);
            let xb = x.slice_axis(0, s, e)?;
            ys.push(self.part(i, part, linear, &xb)?);
            mlx_core::eval(ys.iter())?;
        }
        let refs: Vec<&Array> = ys.iter().collect();
        Ok(ops::concatenate(&refs, 0, None)?)
    }

    /// `nn.quantize(block)`: every linear of layer `i` quantized from its current weight.
    fn quantize_layer(&mut self, i: usize) -> Result<()> {
        let (g, b) = (self.opts.group_size, self.opts.bits);
        let lm = self.model.awq_layer_mut(i)?;
        for (_, l) in lm.linears {
            let (w, bias) = match l {
                Linear::Dense { weight, bias } => (weight.clone(), bias.clone()),
                _ => return Err(internal("a linear to quantize is not dense")),
            };
            *l = Linear::Quantized {
                weight: quantized_weight(&w, g, b)?,
                bias,
            };
        }
        Ok(())
    }

    fn restore(
        &mut self,
        i: usize,
        linears: &[(String, Linear)],
        norms: &(Array, Array),
    ) -> Result<()> {
        let lm = self.model.awq_layer_mut(i)?;
        for ((_, l), (_, o)) in lm.linears.into_iter().zip(linears) {
            *l = o.clone();
        }
        *norm_weight(lm.pre_attn)? = norms.0.clone();
        *norm_weight(lm.pre_mlp)? = norms.1.clone();
        Ok(())
    }

    /// `search_best_scale`.
    fn search_best_scale(
        &mut self,
        i: usize,
        layers: &[&str],
        part: Option<AwqPart>,
        x: &Array,
    ) -> Result<Array> {
        let out = self.part(i, part, layers[0], x)?;
        let x_max = x.abs()?.mean(&[0, 1], false)?;
        let dt = x_max.dtype();
        let saved = self.weights(i)?;
        let mut best_error = f64::INFINITY;
        let mut best_scales = None;
        let n_grid = self.opts.n_grid;
        for r in 0..n_grid {
            let ratio = (f64::from(r) / f64::from(n_grid)) as f32;
            let s = ops::power(&x_max, &scalar(ratio, dt)?, None)?;
            let s = ops::maximum(&s, &scalar(1e-4, dt)?, None)?.reshape(&[-1])?;
            let norm = (&s.max_all(false)? * &s.min_all(false)?)?.sqrt()?;
            let s = (&s / &norm)?;
            let mut w = saved.clone();
            for name in layers {
                let cur = saved
                    .get(*name)
                    .ok_or_else(|| internal("a recipe linear is missing"))?;
                let q = (&self.qdq(&(cur * &s)?)? / &s)?;
                w.insert((*name).to_string(), q);
            }
            self.set_weights(i, &w)?;
            let out_q = self.run_layer(i, part, layers[0], x)?;
            let loss = mean_loss(&out, &out_q)?;
            mlx_core::eval([&loss])?;
            let v = f64::from(loss.item::<f32>()?);
            if v < best_error {
                best_error = v;
                best_scales = Some(s);
            }
            self.set_weights(i, &saved)?;
        }
        let best = best_scales.ok_or_else(|| internal("no scale was better than infinity"))?;
        let best = best.reshape(&[-1])?;
        mlx_core::eval([&best])?;
        Ok(best)
    }

    /// `search_best_clip` for one linear: its weight clipped per group.
    fn search_best_clip(&self, w: &Array, feat: &Array) -> Result<Array> {
        let gs = self.opts.group_size;
        let n_grid = self.opts.n_grid;
        let x = feat.flatten(0, 1)?;
        let rows = x.shape()[0];
        let stride = (rows + 512 - 1) / 512;
        let x = x.slice(&[0, 0], &[rows, x.shape()[1]], &[stride, 1])?;
        let x = x.reshape(&[x.shape()[0], -1, gs])?;
        let w_init_shape = w.shape();
        let (o, cols) = (w_init_shape[0], w_init_shape[1]);
        let mut all = Vec::new();
        for b in (0..o).step_by(64) {
            let e = (b + 64).min(o);
            let wb = w.slice_axis(0, b, e)?;
            let groups = cols / gs;
            let mut best_error = ops::full(
                &[e - b, groups],
                &scalar(f32::INFINITY, Dtype::Float32)?,
                Dtype::Float32,
                None,
            )?;
            let mut best_w_max = ops::zeros(&[e - b, groups, 1], x.dtype(), None)?;
            let w_shape = wb.shape();
            let wg = wb.reshape(&[e - b, -1, gs])?;
            let out = ops::einsum("bdg,odg->bod", &[&x, &wg], None)?;
            let init_max = wg.abs()?.max(&[-1], true)?;
            for k in 0..(0.5 * f64::from(n_grid)) as i32 {
                let p = (1.0 - f64::from(k) / f64::from(n_grid)) as f32;
                let w_max = (&scalar(p, init_max.dtype())? * &init_max)?;
                let neg = w_max.negative()?;
                let w_m = ops::clip(&wg, Some(&neg), Some(&w_max), None)?.reshape(&w_shape)?;
                let w_q = self.qdq(&w_m)?;
                let w_q = w_q.reshape(&[e - b, -1, gs])?;
                let out_q = ops::einsum("bdg,odg->bod", &[&x, &w_q], None)?;
                let loss = mse(&out, &out_q)?.sum(&[0], false)?;
                let loss = (&loss / &scalar(out.shape()[0] as f32, Dtype::Float32)?)?;
                let better = ops::less(&loss, &best_error, None)?;
                best_error = ops::where_(&better, &loss, &best_error, None)?;
                let better3 = ops::expand_dims(&better, &[-1], None)?;
                best_w_max = ops::where_(&better3, &w_max, &best_w_max, None)?;
                mlx_core::eval([&best_w_max, &best_error])?;
            }
            all.push(best_w_max);
        }
        let refs: Vec<&Array> = all.iter().collect();
        let best_w_max = ops::concatenate(&refs, 0, None)?;
        let w_r = w.reshape(&[o, -1, gs])?;
        let neg = best_w_max.negative()?;
        let best = ops::clip(&w_r, Some(&neg), Some(&best_w_max), None)?.reshape(&w_init_shape)?;
        mlx_core::eval([&best])?;
        Ok(best)
    }

    /// One block: capture, plain loss, scales, clips, quantize (or fall back); its float
    /// output.
    fn block(&mut self, i: usize, inputs: &Array, log: &mut dyn FnMut(String)) -> Result<Array> {
        // Capture the linears' inputs in a float forward.
        let mut feats: Vec<(String, Arc<Mutex<Vec<Array>>>)> = Vec::new();
        let orig_linears: Vec<(String, Linear)>;
        let orig_norms: (Array, Array);
        {
            let lm = self.model.awq_layer_mut(i)?;
            orig_norms = (
                norm_weight(lm.pre_attn)?.clone(),
                norm_weight(lm.pre_mlp)?.clone(),
            );
            let mut o = Vec::new();
            for (n, l) in lm.linears {
                if !matches!(l, Linear::Dense { .. }) {
                    return Err(ModelError::Unsupported {
                        what: format!("layer {i}: {n}"),
                        problem: "AWQ takes dense (unquantized) linears".into(),
                    });
                }
                o.push((n.clone(), l.clone()));
                let f = Arc::new(Mutex::new(Vec::new()));
                *l = Linear::Adapted(Box::new(Capture {
                    base: l.clone(),
                    feats: Arc::clone(&f),
                }));
                feats.push((n, f));
            }
            orig_linears = o;
        }
        let outputs = self.run_layer(i, Some(AwqPart::Block), "", inputs)?;
        self.restore(i, &orig_linears, &orig_norms)?;
        let mut feat: BTreeMap<String, Array> = BTreeMap::new();
        for (n, f) in feats {
            let v = f
                .lock()
                .map_err(|_| internal("a capture lock was poisoned"))?;
            let refs: Vec<&Array> = v.iter().collect();
            let a = if refs.len() == 1 {
                refs[0].clone()
            } else {
                ops::concatenate(&refs, 0, None)?
            };
            feat.insert(n, a);
        }

        // The plain-quantized block's loss.
        self.quantize_layer(i)?;
        let outputs_q = self.run_layer(i, Some(AwqPart::Block), "", inputs)?;
        let before = mean_loss(&outputs, &outputs_q)?;
        self.restore(i, &orig_linears, &orig_norms)?;

        // `scale_block` with llama_awq's configs.
        let get = |feat: &BTreeMap<String, Array>, n: &str| {
            feat.get(n)
                .cloned()
                .ok_or_else(|| internal("no captured input"))
        };
        let attn = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"];
        let x = get(&feat, attn[0])?;
        let s = self.search_best_scale(i, &attn, Some(AwqPart::Attention), &x)?;
        self.apply_norm_scale(i, true, &attn, &s, &mut feat)?;

        let down = ["mlp.down_proj"];
        let x = get(&feat, down[0])?;
        let s = self.search_best_scale(i, &down, None, &x)?;
        {
            self.divide_bias(i, "mlp.up_proj", &s)?;
            let mut w = self.weights(i)?;
            let up = w.get("mlp.up_proj").ok_or_else(|| internal("no up_proj"))?;
            let up = (up / &ops::expand_dims(&s, &[-1], None)?)?;
            let d = w.get(down[0]).ok_or_else(|| internal("no down_proj"))?;
            let d = (d * &s)?;
            w.insert("mlp.up_proj".into(), up);
            w.insert(down[0].into(), d);
            self.set_weights(i, &w)?;
            let f = get(&feat, down[0])?;
            feat.insert(down[0].into(), (&f / &s)?);
        }

        let mlp = ["mlp.gate_proj", "mlp.up_proj"];
        let x = get(&feat, mlp[0])?;
        let s = self.search_best_scale(i, &mlp, Some(AwqPart::Mlp), &x)?;
        self.apply_norm_scale(i, false, &mlp, &s, &mut feat)?;

        // `clip_block`: every linear but q and k.
        let mut w = self.weights(i)?;
        for (n, cur) in w.iter_mut() {
            if n.contains("q_proj") || n.contains("k_proj") {
                continue;
            }
            *cur = self.search_best_clip(cur, &get(&feat, n)?)?;
        }
        self.set_weights(i, &w)?;

        self.quantize_layer(i)?;
        let outputs_q = self.run_layer(i, Some(AwqPart::Block), "", inputs)?;
        let after = mean_loss(&outputs, &outputs_q)?;
        mlx_core::eval([&before, &after])?;
        let (b, a) = (before.item::<f32>()?, after.item::<f32>()?);
        // mlx-lm prints the float32 quotient as a Python float.
        log(format!("Loss reduction: {}", f64::from(a / b)));
        if a > b {
            self.restore(i, &orig_linears, &orig_norms)?;
            self.quantize_layer(i)?;
            log("Loss is not reduced, falling back to original weights.".into());
        }
        Ok(outputs)
    }

    /// `apply_scale` into a linear: its bias, if any, divided by the scales.
    fn divide_bias(&mut self, i: usize, name: &str, s: &Array) -> Result<()> {
        let lm = self.model.awq_layer_mut(i)?;
        for (n, l) in lm.linears {
            if n == name {
                if let Linear::Dense { bias: Some(b), .. } = l {
                    *b = (&*b / s)?;
                }
            }
        }
        Ok(())
    }

    /// `apply_scale` into a norm (`input_layernorm` when `attn`, else
    /// `post_attention_layernorm`).
    fn apply_norm_scale(
        &mut self,
        i: usize,
        attn: bool,
        layers: &[&str],
        s: &Array,
        feat: &mut BTreeMap<String, Array>,
    ) -> Result<()> {
        let lm = self.model.awq_layer_mut(i)?;
        scale_norm(if attn { lm.pre_attn } else { lm.pre_mlp }, s)?;
        for (n, l) in lm.linears {
            if layers.contains(&n.as_str()) {
                let w = (&weight_of(l)? * s)?;
                set_weight(l, w)?;
            }
        }
        for n in layers {
            if let Some(f) = feat.get(*n) {
                let g = (f / s)?;
                feat.insert((*n).to_string(), g);
            }
        }
        Ok(())
    }
}

/// Runs AWQ on the model directory `src` with the calibration rows `data` (`(samples,
/// sequence_length)` token ids) and writes the quantized model to `dst`.
pub fn awq(
    src: &Path,
    dst: &Path,
    data: &Array,
    opts: &AwqOptions,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<ConvertReport> {
    check_run(dst, data)?;
    QuantMode::Affine
        .check(opts.group_size, opts.bits)
        .map_err(|m| bad("--bits/--group-size", m.to_string()))?;
    QuantMode::Affine
        .check(opts.embed_group_size, opts.embed_bits)
        .map_err(|m| bad("--embed-bits/--embed-group-size", m.to_string()))?;
    if opts.n_grid < 1 {
        return Err(bad("--n-grid", "must be at least 1".into()));
    }
    let Source {
        config,
        model_config,
        tensors,
    } = load_source(src, progress)?;
    if model_config.model_type == "deepseek_v2" {
        // In mlx-lm's table (`deepseek_v2_awq`), not here yet: its recipe scales MLA's
        // q/kv_a projections and kv_b_proj, and runs the routed experts' SwitchLinears with
        // their captured indices, none of which the descriptor-table AWQ above covers.
        // mlx-lm's recipe itself stops on a model with `q_lora_rank` (it names
        // `self_attn.q_proj`, which such a model does not have: `KeyError: 'q_proj'`).
        let lora = model_config
            .raw
            .get("q_lora_rank")
            .is_some_and(|v| !v.is_null());
        let also = if lora {
            "; with q_lora_rank set, mlx-lm's own recipe fails too (it scales \
             self_attn.q_proj, which this model does not have)"
        } else {
            ""
        };
        return Err(bad(
            "--model",
            format!(
                "AWQ for deepseek_v2 (mlx-lm's deepseek_v2_awq: MLA projections and routed \
                 experts) is not ported yet{also}"
            ),
        ));
    }
    if !AWQ_TYPES.contains(&model_config.model_type.as_str()) {
        return Err(bad(
            "--model",
            format!(
                "AWQ support for {} models NYI (here: {AWQ_TYPES:?})",
                model_config.model_type
            ),
        ));
    }
    let quant = model_config.quantization.clone();
    if quant.is_some() {
        return Err(bad("--model", "is quantized already".into()));
    }
    let mut boxed = build(&model_config, Weights::new(tensors.clone(), None, None))?;
    let model = boxed
        .as_dense_mut()
        .ok_or_else(|| bad("--model", "not a descriptor-table model".into()))?;
    // `gemma3` is `update(gemma3_text_awq, lm_key="language_model")`: the same recipe on the
    // wrapped text model, whose names `save` writes under `language_model.`.
    let gemma = matches!(model_config.model_type.as_str(), "gemma3_text" | "gemma3");
    if gemma {
        model
            .awq_gemma3_shape()
            .map_err(|p| bad("--model", format!("AWQ's Gemma 3 recipe does not fit: {p}")))?;
    } else {
        model
            .awq_llama_shape()
            .map_err(|p| bad("--model", format!("AWQ's llama recipe does not fit: {p}")))?;
    }
    let (pre_attn_name, pre_mlp_name) = model.awq_norm_names();

    // The embedding, quantized first; its output feeds the first block.
    let embed = match model.awq_embedding_mut() {
        Embedding::Dense(w) => w.clone(),
        _ => return Err(bad("--model", "the embedding is not dense".into())),
    };
    let qe = quantized_weight(&embed, opts.embed_group_size, opts.embed_bits)?;
    *model.awq_embedding_mut() = Embedding::Quantized(qe.clone());
    let mut inputs = model.awq_embed(data)?;
    mlx_core::eval([&inputs])?;

    let n_layers = model.num_layers();
    let mut run = Run {
        model,
        opts: opts.clone(),
    };
    let mut lines = Vec::new();
    progress(Progress::Stage("AWQ", n_layers));
    for i in 0..n_layers {
        inputs = run.block(i, &inputs, &mut |l| lines.push(l))?;
        mlx_core::eval([&inputs])?;
        progress(Progress::Tensor(&format!("layer {i}")));
    }
    for l in lines {
        progress(Progress::Info(l));
    }
    let head = match run.model.awq_lm_head_mut() {
        Some(Linear::Dense { weight, bias: None }) => Some(quantized_weight(
            weight,
            opts.embed_group_size,
            opts.embed_bits,
        )?),
        Some(_) => return Err(bad("--model", "lm_head is not a dense linear".into())),
        None => None,
    };

    // The parameters under mlx-lm's names: the layers' new norms and quantized linears.
    let layers_path = run.model.layers_path();
    let qwen3 = model_config.model_type == "qwen3";
    let mut new: BTreeMap<String, Vec<(String, Array)>> = BTreeMap::new();
    let mut quantized: BTreeMap<String, LayerQuant> = BTreeMap::new();
    let lq = |g: i32, b: i32| LayerQuant {
        group_size: Some(g),
        bits: b,
        mode: QuantMode::Affine,
        trellis: None,
    };
    let triple = |path: &str, q: &QuantizedWeight| -> Result<Vec<(String, Array)>> {
        let b = q
            .biases
            .clone()
            .ok_or_else(|| internal("affine without biases"))?;
        Ok(vec![
            (format!("{path}.weight"), q.weight.clone()),
            (format!("{path}.scales"), q.scales.clone()),
            (format!("{path}.biases"), b),
        ])
    };
    let embed_path = "model.embed_tokens";
    new.insert(format!("{embed_path}.weight"), triple(embed_path, &qe)?);
    quantized.insert(
        embed_path.into(),
        lq(opts.embed_group_size, opts.embed_bits),
    );
    let mut qblock = Map::new();
    qblock.insert("group_size".into(), Value::from(64));
    qblock.insert("bits".into(), Value::from(4));
    let leaf = |g: i32, b: i32| {
        let mut m = Map::new();
        m.insert("group_size".into(), Value::from(g));
        m.insert("bits".into(), Value::from(b));
        Value::Object(m)
    };
    qblock.insert(
        embed_path.into(),
        leaf(opts.embed_group_size, opts.embed_bits),
    );
    for i in 0..n_layers {
        let p = format!("{layers_path}.{i}");
        let lm = run.model.awq_layer_mut(i)?;
        new.insert(
            format!("{p}.{pre_attn_name}.weight"),
            vec![(
                format!("{p}.{pre_attn_name}.weight"),
                norm_weight(lm.pre_attn)?.clone(),
            )],
        );
        new.insert(
            format!("{p}.{pre_mlp_name}.weight"),
            vec![(
                format!("{p}.{pre_mlp_name}.weight"),
                norm_weight(lm.pre_mlp)?.clone(),
            )],
        );
        let mut entries: BTreeMap<String, Value> = BTreeMap::new();
        for (n, l) in lm.linears {
            let Linear::Quantized { weight, bias } = l else {
                return Err(internal("a layer linear was left unquantized"));
            };
            let path = format!("{p}.{n}");
            new.insert(format!("{path}.weight"), triple(&path, weight)?);
            if let Some(b) = bias {
                // `up_proj`'s bias took the down scales (`apply_scale`).
                new.insert(
                    format!("{path}.bias"),
                    vec![(format!("{path}.bias"), b.clone())],
                );
            }
            quantized.insert(path.clone(), lq(weight.group_size, weight.bits));
            entries.insert(n, leaf(weight.group_size, weight.bits));
        }
        // The class's module order: attention (q, k, v, o, qwen3's q/k norms, rope), MLP
        // (gate, down, up), norms.
        let qk_norms: &[&str] = if qwen3 || gemma {
            &["self_attn.q_norm", "self_attn.k_norm"]
        } else {
            &[]
        };
        let order = [
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
        ]
        .iter()
        .chain(qk_norms)
        .chain(&[
            "self_attn.rope",
            "mlp.gate_proj",
            "mlp.down_proj",
            "mlp.up_proj",
            "input_layernorm",
            "post_attention_layernorm",
        ])
        .chain(if gemma {
            &["pre_feedforward_layernorm", "post_feedforward_layernorm"][..]
        } else {
            &[]
        });
        for n in order {
            qblock.insert(
                format!("{p}.{n}"),
                entries.remove(*n).unwrap_or(Value::Bool(false)),
            );
        }
        if !entries.is_empty() {
            return Err(internal("a layer linear outside llama.py's modules"));
        }
    }
    qblock.insert("model.norm".into(), Value::Bool(false));
    if let Some(h) = &head {
        new.insert("lm_head.weight".into(), triple("lm_head", h)?);
        quantized.insert("lm_head".into(), lq(opts.embed_group_size, opts.embed_bits));
        qblock.insert(
            "lm_head".into(),
            leaf(opts.embed_group_size, opts.embed_bits),
        );
    }
    drop(boxed);

    let built = build_recording(&model_config, Weights::new(tensors, None, None))?;
    splice_and_save(
        src,
        dst,
        built.parameters,
        new,
        &quantized,
        config,
        qblock,
        progress,
    )
}

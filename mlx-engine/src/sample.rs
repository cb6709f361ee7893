//! Sampling, ported from mlx-lm 0.32.2 `sample_utils.py`: the sampler chain (top-p, min-p,
//! XTC, top-k, then categorical at a temperature; greedy at temperature 0) and the logits
//! processors (logit bias, repetition / presence / frequency penalties). Random draws use
//! MLX's global PRNG, so `mlx_core::random::seed(s)` reproduces `mx.random.seed(s)`.

use mlx_core::prelude::*;
use mlx_core::random;

use crate::error::{EngineError, Result};

/// `make_sampler`'s arguments.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SamplerSettings {
    pub temp: f64,
    pub top_p: f64,
    pub min_p: f64,
    pub min_tokens_to_keep: usize,
    pub top_k: i32,
    pub xtc_probability: f64,
    pub xtc_threshold: f64,
    pub xtc_special_tokens: Vec<i32>,
}

impl Default for SamplerSettings {
    fn default() -> Self {
        SamplerSettings {
            temp: 0.0,
            top_p: 0.0,
            min_p: 0.0,
            min_tokens_to_keep: 1,
            top_k: 0,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            xtc_special_tokens: Vec::new(),
        }
    }
}

impl SamplerSettings {
    /// Refuses values mlx-lm would turn into NaN probabilities or silently misuse: a
    /// temperature that is negative or not finite, `top_p`/`min_p`/`xtc_*` outside [0, 1], a
    /// negative `top_k`, special-token ids outside `0..vocab_size`.
    pub fn validate(&self, vocab_size: i32) -> Result<()> {
        let bad = |parameter: &str, problem: String| {
            Err(EngineError::Sampler {
                parameter: parameter.into(),
                problem,
            })
        };
        if !(self.temp.is_finite() && self.temp >= 0.0) {
            return bad(
                "temp",
                format!("must be a finite number >= 0, got {}", self.temp),
            );
        }
        for (name, v) in [
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("xtc_probability", self.xtc_probability),
            ("xtc_threshold", self.xtc_threshold),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return bad(name, format!("must be in [0, 1], got {v}"));
            }
        }
        if self.top_k < 0 {
            return bad("top_k", format!("must be >= 0, got {}", self.top_k));
        }
        check_token_ids("xtc_special_tokens", &self.xtc_special_tokens, vocab_size)
    }
}

/// Every id in `ids` must index the model's vocabulary (`0..vocab_size`): MLX's gather does
/// not check, and an id past the embedding reads out of bounds (or crashes).
pub fn check_token_ids(what: &str, ids: &[i32], vocab_size: i32) -> Result<()> {
    match ids
        .iter()
        .enumerate()
        .find(|(_, &t)| t < 0 || t >= vocab_size)
    {
        None => Ok(()),
        Some((i, t)) => Err(EngineError::Input { what: what.to_string(), problem: format!("token id {t} (position {i}) is outside the model's vocabulary of {vocab_size} tokens (ids 0 to {})", vocab_size - 1) }),
    }
}

/// Checks processor arguments against the vocabulary (logit-bias ids) and for finiteness.
pub fn check_logits_processors(processors: &[LogitsProcessor], vocab_size: i32) -> Result<()> {
    for p in processors {
        match p {
            LogitsProcessor::LogitBias { ids, values } => {
                check_token_ids("logit_bias", ids, vocab_size)?;
                if let Some(v) = values.iter().find(|v| v.is_nan()) {
                    return Err(EngineError::Sampler {
                        parameter: "logit_bias".into(),
                        problem: format!("value {v}"),
                    });
                }
            }
            LogitsProcessor::Repetition { penalty, .. }
            | LogitsProcessor::Presence { penalty, .. }
            | LogitsProcessor::Frequency { penalty, .. } => {
                if !penalty.is_finite() {
                    return Err(EngineError::Sampler {
                        parameter: "penalty".into(),
                        problem: format!("must be finite, got {penalty}"),
                    });
                }
            }
        }
    }
    Ok(())
}

fn weak(v: f64, like: &Array) -> Result<Array> {
    Ok(Scalar::from(v).to_array_like(like.dtype())?)
}

fn neg_inf_like(like: &Array) -> Result<Array> {
    weak(f64::NEG_INFINITY, like)
}

fn last_axis_slice(a: &Array, start: i32, stop: Option<i32>) -> Result<Array> {
    let ax = a.ndim() as i32 - 1;
    let n = a.shape().last().copied().unwrap_or(0);
    let norm = |i: i32| if i < 0 { (n + i).max(0) } else { i.min(n) };
    Ok(ops::slice_axis(
        a,
        ax,
        norm(start),
        stop.map_or(n, norm),
        None,
    )?)
}

/// `apply_top_k`.
pub fn apply_top_k(logprobs: &Array, top_k: i32) -> Result<Array> {
    let vocab = logprobs.shape().last().copied().unwrap_or(0);
    if !(0 < top_k && top_k < vocab) {
        return Err(EngineError::Sampler {
            parameter: "top_k".into(),
            problem: format!("has to be an integer in the (0, {vocab}) interval, but is {top_k}."),
        });
    }
    let neg = ops::negative(logprobs, None)?;
    let idx = ops::argpartition(&neg, top_k - 1, -1, None)?;
    let mask_idx = last_axis_slice(&idx, top_k, None)?;
    let inf = Array::from_f32(f32::NEG_INFINITY, logprobs.dtype())?;
    Ok(ops::put_along_axis(logprobs, &mask_idx, &inf, -1, None)?)
}

/// `apply_min_p`.
pub fn apply_min_p(logprobs: &Array, min_p: f64, min_tokens_to_keep: usize) -> Result<Array> {
    if !(0.0..=1.0).contains(&min_p) {
        return Err(EngineError::Sampler {
            parameter: "min_p".into(),
            problem: format!("has to be a float in the [0, 1] interval, but is {min_p}"),
        });
    }
    if min_tokens_to_keep < 1 {
        return Err(EngineError::Sampler {
            parameter: "min_tokens_to_keep".into(),
            problem: "has to be a positive integer".into(),
        });
    }
    // More than the vocabulary: MLX's argpartition refuses the index (mlx-lm stops there
    // too), with a message that names neither the parameter nor the vocabulary.
    let vocab = logprobs.shape().last().copied().unwrap_or(0).max(0) as usize;
    if min_tokens_to_keep > vocab.max(1) {
        return Err(EngineError::Sampler {
            parameter: "min_tokens_to_keep".into(),
            problem: format!(
                "has to be at most the vocabulary size {vocab}, but is {min_tokens_to_keep}."
            ),
        });
    }
    let top = ops::max(logprobs, &[-1], true, None)?;
    let scaled = ops::add(&top, &weak(min_p.ln(), &top)?, None)?;
    let mut remove = ops::less(logprobs, &scaled, None)?;
    if min_tokens_to_keep > 1 {
        let k = min_tokens_to_keep as i32;
        let idx = ops::argpartition(logprobs, -k, -1, None)?;
        let top_idx = last_axis_slice(&idx, -k, None)?;
        remove = ops::put_along_axis(&remove, &top_idx, &Array::scalar(false)?, -1, None)?;
    }
    Ok(ops::where_(
        &remove,
        &neg_inf_like(logprobs)?,
        logprobs,
        None,
    )?)
}

/// `apply_top_p`.
pub fn apply_top_p(logprobs: &Array, top_p: f64) -> Result<Array> {
    let sorted = ops::sort(logprobs, -1, None)?;
    let probs = ops::exp(&sorted.astype(Dtype::Float32)?, None)?;
    let mass_above = ops::cumsum(&probs, -1, true, false, None)?;
    let total = ops::add(
        &last_axis_slice(&mass_above, 0, Some(1))?,
        &last_axis_slice(&probs, 0, Some(1))?,
        None,
    )?;
    let cut = ops::multiply(&weak(top_p, &total)?, &total, None)?;
    let num_dropped = ops::sum(
        &ops::greater_equal(&mass_above, &cut, None)?,
        &[-1],
        true,
        None,
    )?;
    let threshold = ops::take_along_axis(&sorted, &num_dropped, -1, None)?;
    Ok(ops::where_(
        &ops::less(logprobs, &threshold, None)?,
        &neg_inf_like(logprobs)?,
        logprobs,
        None,
    )?)
}

/// `apply_xtc`.
pub fn apply_xtc(
    logits: &Array,
    probability: f64,
    threshold: f64,
    special: &[i32],
) -> Result<Array> {
    if !(0.0..=0.5).contains(&threshold) {
        return Err(EngineError::Sampler {
            parameter: "threshold".into(),
            problem: format!("has to be a float in the [0, 0.5] interval, but is {threshold}"),
        });
    }
    if !(0.0..=1.0).contains(&probability) {
        return Err(EngineError::Sampler {
            parameter: "probability".into(),
            problem: format!("has to be a float in the [0, 1] interval, but is {probability}"),
        });
    }
    let probs = ops::softmax(logits, &[-1], false, None)?;
    let above = ops::greater(&probs, &weak(threshold, &probs)?, None)?;
    let candidates = ops::where_(&above, &probs, &weak(f64::INFINITY, &probs)?, None)?;
    let mut mask = ops::greater(&probs, &ops::min(&candidates, &[-1], true, None)?, None)?;
    if !special.is_empty() {
        let idx = Array::from_slice(special, &[special.len() as i32])?;
        let shape = mask.shape();
        let mut bshape = shape.clone();
        *bshape.last_mut().unwrap_or(&mut 0) = special.len() as i32;
        let mut ishape = vec![1; shape.len()];
        *ishape.last_mut().unwrap_or(&mut 0) = special.len() as i32;
        let idx = ops::broadcast_to(&idx.reshape(&ishape)?, &bshape, None)?;
        mask = ops::put_along_axis(&mask, &idx, &Array::scalar(false)?, -1, None)?;
    }
    let u = random::uniform(0i32, 1i32, &[], Dtype::Float32, None, None)?;
    let keep = ops::greater(&u, &weak(probability, &u)?, None)?;
    let masked = ops::where_(&mask, &neg_inf_like(logits)?, logits, None)?;
    Ok(ops::where_(&keep, logits, &masked, None)?)
}

/// `categorical_sampling(logits, temp)`.
pub fn categorical_sampling(logits: &Array, temp: f64) -> Result<Array> {
    let scaled = ops::multiply(logits, &weak(1.0 / temp, logits)?, None)?;
    Ok(random::categorical(&scaled, -1, None, None)?)
}

/// A sampler: log-probabilities `(batch, vocab)` to token ids `(batch,)`.
#[derive(Clone, Debug)]
pub struct Sampler {
    settings: SamplerSettings,
}

impl Sampler {
    /// `make_sampler(...)`.
    pub fn new(settings: SamplerSettings) -> Sampler {
        Sampler { settings }
    }

    pub fn greedy() -> Sampler {
        Sampler::new(SamplerSettings::default())
    }

    pub fn settings(&self) -> &SamplerSettings {
        &self.settings
    }

    pub fn sample(&self, logprobs: &Array) -> Result<Array> {
        let s = &self.settings;
        if s.temp == 0.0 {
            return Ok(ops::argmax(logprobs, -1, false, None)?);
        }
        let mut lp = logprobs.clone();
        if 0.0 < s.top_p && s.top_p < 1.0 {
            lp = apply_top_p(&lp, s.top_p)?;
        }
        if s.min_p != 0.0 {
            lp = apply_min_p(&lp, s.min_p, s.min_tokens_to_keep)?;
        }
        if s.xtc_probability > 0.0 {
            lp = apply_xtc(
                &lp,
                s.xtc_probability,
                s.xtc_threshold,
                &s.xtc_special_tokens,
            )?;
        }
        if s.top_k > 0 {
            lp = apply_top_k(&lp, s.top_k)?;
        }
        categorical_sampling(&lp, s.temp)
    }
}

/// One logits processor of `make_logits_processors`.
#[derive(Clone, Debug)]
pub enum LogitsProcessor {
    /// Additive bias per token id.
    LogitBias {
        ids: Vec<i32>,
        values: Vec<f32>,
    },
    Repetition {
        penalty: f64,
        context_size: usize,
    },
    Presence {
        penalty: f64,
        context_size: usize,
    },
    Frequency {
        penalty: f64,
        context_size: usize,
    },
}

/// `make_logits_processors`'s arguments (mlx-lm's default context sizes are 20).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProcessorSettings {
    pub logit_bias: Vec<(i32, f32)>,
    pub repetition_penalty: Option<f64>,
    pub repetition_context_size: Option<usize>,
    pub presence_penalty: Option<f64>,
    pub presence_context_size: Option<usize>,
    pub frequency_penalty: Option<f64>,
    pub frequency_context_size: Option<usize>,
}

/// `make_logits_processors(...)`.
pub fn make_logits_processors(s: &ProcessorSettings) -> Result<Vec<LogitsProcessor>> {
    let mut out = Vec::new();
    if !s.logit_bias.is_empty() {
        out.push(LogitsProcessor::LogitBias {
            ids: s.logit_bias.iter().map(|(i, _)| *i).collect(),
            values: s.logit_bias.iter().map(|(_, v)| *v).collect(),
        });
    }
    if let Some(p) = s.repetition_penalty.filter(|p| *p != 0.0) {
        if p < 0.0 {
            return Err(EngineError::Sampler {
                parameter: "repetition_penalty".into(),
                problem: format!("must be a non-negative float, got {p}"),
            });
        }
        out.push(LogitsProcessor::Repetition {
            penalty: p,
            context_size: s.repetition_context_size.unwrap_or(20),
        });
    }
    if let Some(p) = s.presence_penalty.filter(|p| *p != 0.0) {
        out.push(LogitsProcessor::Presence {
            penalty: p,
            context_size: s.presence_context_size.unwrap_or(20),
        });
    }
    if let Some(p) = s.frequency_penalty.filter(|p| *p != 0.0) {
        out.push(LogitsProcessor::Frequency {
            penalty: p,
            context_size: s.frequency_context_size.unwrap_or(20),
        });
    }
    Ok(out)
}

/// The last `n` tokens as a `(1, n)`-broadcastable index over `(batch, vocab)` logits.
fn recent(tokens: &[i32], n: usize, batch: i32) -> Result<Array> {
    let t = &tokens[tokens.len().saturating_sub(n)..];
    let idx = Array::from_slice(t, &[1, t.len() as i32])?;
    Ok(ops::broadcast_to(&idx, &[batch, t.len() as i32], None)?)
}

impl LogitsProcessor {
    /// Applies the processor to `logits` `(batch, vocab)` given every token so far.
    pub fn apply(&self, tokens: &[i32], logits: &Array) -> Result<Array> {
        let batch = logits.shape().first().copied().unwrap_or(1);
        match self {
            LogitsProcessor::LogitBias { ids, values } => {
                // logits.at[:, ids].add(values): each id once (dict keys).
                let idx = ops::broadcast_to(
                    &Array::from_slice(ids, &[1, ids.len() as i32])?,
                    &[batch, ids.len() as i32],
                    None,
                )?;
                let vals =
                    Array::from_slice(values, &[values.len() as i32])?.astype(logits.dtype())?;
                let cur = ops::take_along_axis(logits, &idx, -1, None)?;
                Ok(ops::put_along_axis(
                    logits,
                    &idx,
                    &ops::add(&cur, &vals, None)?,
                    -1,
                    None,
                )?)
            }
            _ if tokens.is_empty() => Ok(logits.clone()),
            LogitsProcessor::Repetition {
                penalty,
                context_size,
            } => {
                let idx = recent(tokens, *context_size, batch)?;
                let sel = ops::take_along_axis(logits, &idx, -1, None)?;
                let p = weak(*penalty, &sel)?;
                let neg = ops::less(&sel, &Scalar::Int(0).to_array_like(sel.dtype())?, None)?;
                let upd = ops::where_(
                    &neg,
                    &ops::multiply(&sel, &p, None)?,
                    &ops::divide(&sel, &p, None)?,
                    None,
                )?;
                Ok(ops::put_along_axis(logits, &idx, &upd, -1, None)?)
            }
            LogitsProcessor::Presence {
                penalty,
                context_size,
            } => {
                let idx = recent(tokens, *context_size, batch)?;
                let sel = ops::take_along_axis(logits, &idx, -1, None)?;
                let upd = ops::subtract(&sel, &weak(*penalty, &sel)?, None)?;
                Ok(ops::put_along_axis(logits, &idx, &upd, -1, None)?)
            }
            LogitsProcessor::Frequency {
                penalty,
                context_size,
            } => {
                // logits.at[:, tokens].subtract(penalty): every occurrence subtracts once.
                let t = &tokens[tokens.len().saturating_sub(*context_size)..];
                let idx = Array::from_slice(t, &[t.len() as i32])?;
                let upd = ops::full(
                    &[t.len() as i32, batch, 1],
                    &weak(-*penalty, logits)?,
                    logits.dtype(),
                    None,
                )?;
                Ok(ops::scatter_add(logits, &[&idx], &upd, &[1], None)?)
            }
        }
    }
}

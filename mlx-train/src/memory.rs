//! Peak memory of one training step, measured with MLX's own peak counter, and the
//! arithmetic that predicts it for the memory options (`--grad-checkpoint`,
//! `--segment-length`, `--ce-chunk-size` together), on a seeded random llama written to a
//! directory. The `train_memory` example prints the table; `tests/memory.rs` asserts it.

use std::collections::BTreeMap;
use std::path::Path;

use mlx_core::prelude::*;
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::LanguageModel;

use crate::attention::{with_flash_attention, FlashKernel};
use crate::data::Batch;
use crate::error::{Result, TrainError};
use crate::lora::{linear_to_lora_layers, LoraConfig};
use crate::loss::{chunked_loss, default_loss};
use crate::params::Params;
use crate::segmented::segmented_loss_and_grad;
use crate::trainer::loss_and_grad;

/// A random llama's shape: intermediate `3 * hidden`, heads of 64, half as many KV heads,
/// tied embeddings; `q4`: every linear and the embedding 4-bit (group 64), float32 otherwise.
#[derive(Clone, Debug)]
pub struct Shape {
    pub hidden: i32,
    pub layers: i32,
    pub vocab: i32,
    pub q4: bool,
}

impl Shape {
    fn heads(&self) -> i32 {
        (self.hidden / 64).max(1)
    }
    fn kv_dim(&self) -> i32 {
        (self.heads() / 2).max(1) * 64
    }
    fn inter(&self) -> i32 {
        self.hidden.saturating_mul(3)
    }
}

/// Writes `config.json` and `model.safetensors` of a seeded random llama of `shape`.
pub fn write_random_llama(dir: &Path, shape: &Shape) -> Result<()> {
    let io = |e: std::io::Error| TrainError::Config(format!("{}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(io)?;
    let (hidden, vocab, inter, kv) = (shape.hidden, shape.vocab, shape.inter(), shape.kv_dim());
    let mut config = serde_json::json!({
        "model_type": "llama", "hidden_size": hidden, "num_hidden_layers": shape.layers,
        "intermediate_size": inter, "num_attention_heads": shape.heads(),
        "num_key_value_heads": kv / 64, "rms_norm_eps": 1e-5,
        "vocab_size": vocab, "tie_word_embeddings": true,
    });
    if shape.q4 {
        config["quantization"] = serde_json::json!({"group_size": 64, "bits": 4});
    }
    random::seed(0)?;
    let mut w = BTreeMap::new();
    let mut put = |k: String, s: &[i32]| -> Result<()> {
        let a = (&random::normal(s, Dtype::Float32, None, None, None, None)? * 0.02f32)?;
        if shape.q4 {
            let (q, sc, b) = mlx_core::quantized::quantize(&a, 64, 4, Default::default(), None)?;
            let base = k.trim_end_matches(".weight").to_string();
            w.insert(k, q);
            w.insert(format!("{base}.scales"), sc);
            if let Some(b) = b {
                w.insert(format!("{base}.biases"), b);
            }
        } else {
            w.insert(k, a);
        }
        Ok(())
    };
    put("model.embed_tokens.weight".into(), &[vocab, hidden])?;
    for i in 0..shape.layers {
        let p = format!("model.layers.{i}");
        for (n, s) in [
            ("self_attn.q_proj", [hidden, hidden]),
            ("self_attn.k_proj", [kv, hidden]),
            ("self_attn.v_proj", [kv, hidden]),
            ("self_attn.o_proj", [hidden, hidden]),
            ("mlp.gate_proj", [inter, hidden]),
            ("mlp.up_proj", [inter, hidden]),
            ("mlp.down_proj", [hidden, inter]),
        ] {
            put(format!("{p}.{n}.weight"), &s)?;
        }
    }
    for i in 0..shape.layers {
        for n in ["input_layernorm", "post_attention_layernorm"] {
            w.insert(
                format!("model.layers.{i}.{n}.weight"),
                ops::ones(&[hidden], Dtype::Float32, None)?,
            );
        }
    }
    w.insert(
        "model.norm.weight".into(),
        ops::ones(&[hidden], Dtype::Float32, None)?,
    );
    mlx_core::io::save_safetensors(
        dir.join("model.safetensors"),
        w.iter().map(|(k, v)| (k.as_str(), v)),
        &Default::default(),
    )?;
    std::fs::write(dir.join("config.json"), config.to_string()).map_err(io)?;
    Ok(())
}

/// MLX's memory limit for as long as the guard lives (`--memory-limit GB`), the previous one
/// restored on drop.
///
/// MLX's evaluation holds every buffer a queued GPU command graph reads until that graph has
/// run, and on CUDA up to ten graphs of up to 100 nodes or 1,000 MB each are in flight (MLX
/// 0.32's defaults for Hopper). When the host schedules far ahead of a GPU busy with large
/// matmuls, those held buffers, not the step's live arrays, set the peak. Past the limit,
/// MLX's `eval` waits for queued graphs to finish (and free what they hold) before scheduling
/// more; the limit is not a cap on allocation, so a step that needs more still runs.
#[derive(Debug)]
pub struct MemoryLimit {
    previous: Option<usize>,
}

impl MemoryLimit {
    /// A limit of `gb` GB in bytes, or an error naming the value when it is not a positive,
    /// finite size.
    pub fn bytes(gb: f64) -> Result<usize> {
        let bytes = gb * 1e9;
        if !(gb.is_finite() && gb > 0.0 && bytes < usize::MAX as f64) {
            return Err(TrainError::Config(format!(
                "memory_limit must be a positive number of GB, got {gb}"
            )));
        }
        Ok((bytes as usize).max(1))
    }

    /// Sets MLX's memory limit to `gb` GB until the guard drops; `None` changes nothing.
    pub fn set(gb: Option<f64>) -> Result<MemoryLimit> {
        let previous = match gb {
            Some(gb) => Some(mlx_core::memory::set_memory_limit(Self::bytes(gb)?)?),
            None => None,
        };
        Ok(MemoryLimit { previous })
    }
}

impl Drop for MemoryLimit {
    fn drop(&mut self) {
        if let Some(p) = self.previous {
            // Restoring a limit MLX gave us back cannot fail for a reason we could act on.
            let _ = mlx_core::memory::set_memory_limit(p);
        }
    }
}

/// Which memory options a step runs with.
#[derive(Clone, Debug, Default)]
pub struct StepOptions {
    pub grad_checkpoint: bool,
    pub ce_chunk: Option<i32>,
    pub segment: Option<i32>,
    /// `--flash-block`: attention through `mlx_kernels::flash_attention` in tiles of this many
    /// positions instead of MLX's SDPA.
    pub flash_block: Option<i32>,
}

/// One step's figures: MLX's peak memory during the step, the memory held before it
/// (weights, adapters, tokens), and the arithmetic's prediction of the peak (for the
/// checkpointed runs).
#[derive(Clone, Debug)]
pub struct StepMemory {
    pub peak: usize,
    pub before: usize,
    pub predicted: Option<usize>,
    pub loss: f32,
}

/// The peak the arithmetic predicts for a checkpointed step (float32 activations, batch 1,
/// `t` tokens, segments of `s` (`t` without), cross-entropy chunks of `c` (`t` without)),
/// over `before` (weights, adapters, tokens):
/// - the layer inputs the checkpoints keep: `layers * s * hidden`, and as many gradients;
/// - one layer's recompute and its gradients at `s` tokens: what autograd keeps of a LoRA
///   llama layer, `12 hidden + 5 kv + 6 inter` per token (norms, projections with their
///   LoRA outputs, rope, attention output, SwiGLU's four `inter`-wide tensors), twice;
/// - the attention probabilities of MLX's unfused SDPA (the CPU's, and on CUDA its backward
///   as measured): `heads * s * t`, three copies (scores, probabilities, their gradient); with
///   flash attention one tile's, `heads * block * block`;
/// - keys and values: the final ones of every layer, the ones a segment's backward
///   recomputes, and the gradients of both, `8 * layers * t * kv` (the segmented backward;
///   without segments one layer's);
/// - one cross-entropy chunk: logits, their exponentials and gradient, `3 * c * vocab`.
pub fn predicted_peak(shape: &Shape, t: i32, opts: &StepOptions, before: usize) -> usize {
    // Computed in u128 from non-negative sizes (a negative one counts as 0), saturating at
    // usize::MAX: the figure is an estimate and must not overflow for any input.
    let n = |x: i32| u128::from(x.max(0).unsigned_abs());
    let (d, l, v) = (n(shape.hidden), n(shape.layers), n(shape.vocab));
    let (kv, f, h) = (n(shape.kv_dim()), n(shape.inter()), n(shape.heads()));
    let t = n(t);
    let s = opts.segment.map_or(t, |s| n(s).min(t));
    let c = opts.ce_chunk.map_or(t, |c| n(c).min(t));
    let kv_layers = if opts.segment.is_some() { l } else { 1 };
    let elems = 2 * l * s * d
        + 2 * s * (12 * d + 5 * kv + 6 * f)
        + 3 * h * opts.flash_block.map_or(s * t, |b| n(b).min(s).pow(2))
        + 8 * kv_layers * t * kv
        + 3 * c * v;
    usize::try_from(before as u128 + 4 * elems).unwrap_or(usize::MAX)
}

/// Loads the llama in `dir`, adds LoRA (rank 8, every layer), and measures one step of
/// `len` tokens with `opts`: loss and gradients evaluated, MLX's peak counter reset first.
pub fn measure_step(dir: &Path, shape: &Shape, len: i32, opts: &StepOptions) -> Result<StepMemory> {
    let (mut model, _) = load_model_dir(dir, &LoadOptions::default())?;
    let params = Params::new();
    linear_to_lora_layers(model.as_mut(), -1, &LoraConfig::default(), false, &params)?;
    if opts.grad_checkpoint
        && !model
            .as_trainable_mut()
            .is_some_and(|t| t.set_grad_checkpoint(true))
    {
        return Err(TrainError::Config("no gradient checkpointing here".into()));
    }
    params.set_training(true);
    random::seed(1)?;
    let tokens = random::randint(0, shape.vocab, &[1, len + 1], Dtype::Int32, None, None)?;
    let batch = Batch {
        tokens,
        lengths: Array::from_slice(&[0i32, len + 1], &[1, 2])?,
        truncated: false,
    };
    let mut held: Vec<Array> = params.snapshot().into_values().collect();
    held.push(batch.tokens.clone());
    held.push(batch.lengths.clone());
    eval(&held)?;
    mlx_core::memory::clear_cache()?;
    let before = mlx_core::memory::active_memory()?;
    mlx_core::memory::reset_peak_memory()?;
    let chunk = opts.ce_chunk;
    let f = move |m: &dyn LanguageModel, b: &Array, l: &Array| match chunk {
        Some(c) => chunked_loss(m, b, l, c),
        None => default_loss(m, b, l),
    };
    let (l, _, g) = with_flash_attention(opts.flash_block, FlashKernel::Plain, || {
        match opts.segment {
            Some(s) => segmented_loss_and_grad(
                model.as_ref(),
                &params,
                &batch.tokens,
                &batch.lengths,
                s,
                chunk,
            ),
            None => loss_and_grad(model.as_ref(), &params, &f, &batch),
        }
    })?;
    let mut out: Vec<Array> = g.into_values().collect();
    out.push(l.clone());
    eval(&out)?;
    let peak = mlx_core::memory::peak_memory()?;
    let predicted = opts
        .grad_checkpoint
        .then(|| predicted_peak(shape, len, opts, before));
    Ok(StepMemory {
        peak,
        before,
        predicted,
        loss: l.item::<f32>()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prediction_never_overflows() {
        let opts = |v: i32| StepOptions {
            grad_checkpoint: true,
            ce_chunk: Some(v),
            segment: Some(v),
            flash_block: Some(v),
        };
        let shape = |v: i32| Shape {
            hidden: v,
            layers: v,
            vocab: v,
            q4: false,
        };
        assert_eq!(predicted_peak(&shape(-5), -1, &opts(-3), 7), 7);
        assert_eq!(
            predicted_peak(&shape(i32::MAX), i32::MAX, &opts(i32::MAX), usize::MAX),
            usize::MAX
        );
        let small = predicted_peak(&shape(64), 16, &opts(8), 0);
        assert!(small > 0 && small < 1 << 30);
    }
}

//! Scaled dot-product attention over what a cache returns (mlx-lm `models/base.py`).

use mlx_cache::{AttentionMask, Kv, QTensor, QuantSpec};
use mlx_core::fast::{self, SdpaMask};
use mlx_core::prelude::*;
use mlx_core::quantized::{self, QuantMode};

use crate::error::Result;

/// An attention that stands in for MLX's SDPA over dense keys and values on this thread
/// (training's flash attention, `mlx_train::attention`): called with `(queries, keys, values,
/// scale, mask)`; `Ok(None)` leaves the call to MLX.
pub type DenseAttention =
    dyn Fn(&Array, &Array, &Array, f32, &AttentionMask) -> Result<Option<Array>>;

thread_local! {
    static DENSE_ATTENTION: std::cell::RefCell<Option<std::rc::Rc<DenseAttention>>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `body` with `attention` standing in for MLX's SDPA wherever a model on this thread
/// attends over dense keys and values without sinks (also inside transforms and gradient
/// checkpoints that `body` runs). The previous stand-in is restored afterwards, also on panic.
pub fn with_dense_attention<R>(
    attention: std::rc::Rc<DenseAttention>,
    body: impl FnOnce() -> R,
) -> R {
    struct Restore(Option<std::rc::Rc<DenseAttention>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            DENSE_ATTENTION.with(|c| *c.borrow_mut() = prev);
        }
    }
    let prev = DENSE_ATTENTION.with(|c| c.borrow_mut().replace(attention));
    let _restore = Restore(prev);
    body()
}

fn dense_attention() -> Option<std::rc::Rc<DenseAttention>> {
    DENSE_ATTENTION.with(|c| c.borrow().clone())
}

/// mlx-lm's `scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks)`:
/// MLX's fused kernel for dense keys/values, the quantized path for a quantized cache.
pub fn scaled_dot_product_attention(
    queries: &Array,
    kv: &Kv,
    scale: f32,
    mask: &AttentionMask,
    sinks: Option<&Array>,
) -> Result<Array> {
    match kv {
        Kv::Dense { keys, values } => {
            if let (Some(f), None) = (dense_attention(), sinks) {
                if let Some(out) = f(queries, keys, values, scale, mask)? {
                    return Ok(out);
                }
            }
            let m = match mask {
                AttentionMask::None => SdpaMask::None,
                AttentionMask::Causal => SdpaMask::Causal,
                AttentionMask::Array(a) => SdpaMask::Array(a),
            };
            Ok(fast::scaled_dot_product_attention(
                queries, keys, values, scale, m, sinks, None,
            )?)
        }
        Kv::Quantized { keys, values, spec } => {
            if sinks.is_some() {
                return Err(crate::ModelError::Unsupported {
                    what: "quantized SDPA".into(),
                    problem: "does not support attention sinks".into(),
                });
            }
            quantized_scaled_dot_product_attention(queries, keys, values, scale, mask, *spec)
        }
    }
}

fn qmm(x: &Array, t: &QTensor, transpose: bool, spec: QuantSpec) -> Result<Array> {
    Ok(quantized::quantized_matmul(
        x,
        &t.weight,
        &t.scales,
        Some(&t.biases),
        transpose,
        spec.group_size,
        spec.bits,
        QuantMode::Affine,
        None,
    )?)
}

/// mlx-lm's `quantized_scaled_dot_product_attention`.
pub fn quantized_scaled_dot_product_attention(
    queries: &Array,
    q_keys: &QTensor,
    q_values: &QTensor,
    scale: f32,
    mask: &AttentionMask,
    spec: QuantSpec,
) -> Result<Array> {
    let qs = queries.shape();
    let (b, n_q_heads, l, d) = (qs[0], qs[1], qs[2], qs[3]);
    let ks = q_keys.weight.shape();
    let n_kv_heads = ks[ks.len() - 3];
    let n_repeats = n_q_heads / n_kv_heads;

    let mut queries = ops::multiply_scalar(queries, scale, None)?;
    let expand = |t: &QTensor| -> Result<QTensor> {
        Ok(QTensor {
            weight: ops::expand_dims(&t.weight, &[-3], None)?,
            scales: ops::expand_dims(&t.scales, &[-3], None)?,
            biases: ops::expand_dims(&t.biases, &[-3], None)?,
        })
    };
    let (k, v) = if n_repeats > 1 {
        queries = ops::reshape(&queries, &[b, n_kv_heads, n_repeats, l, d], None)?;
        (expand(q_keys)?, expand(q_values)?)
    } else {
        (q_keys.clone(), q_values.clone())
    };
    let mut scores = qmm(&queries, &k, true, spec)?;
    scores = masked_scores(scores, mask, n_repeats)?;
    let scores = ops::softmax(&scores, &[-1], true, None)?;
    let out = qmm(&scores, &v, false, spec)?;
    if n_repeats > 1 {
        Ok(ops::reshape(&out, &[b, n_q_heads, l, d], None)?)
    } else {
        Ok(out)
    }
}

/// Attention over dense keys and values through plain ops, in the order of MLX's own fallback
/// (`fast::scaled_dot_product_attention`'s unfused path): queries scaled, grouped by KV head,
/// scores by matmul, the mask applied (boolean: the dtype's minimum where false; additive:
/// added; causal: bottom-right aligned), precise softmax, matmul with the values: on the CPU
/// equal to the last bit to `fast::scaled_dot_product_attention` (which runs that fallback
/// there). Used where MLX's fused kernel has a per-shape cost (the engine's speculative
/// verification on CUDA).
pub fn plain_scaled_dot_product_attention(
    queries: &Array,
    keys: &Array,
    values: &Array,
    scale: f32,
    mask: &AttentionMask,
) -> Result<Array> {
    let qs = queries.shape();
    let (b, n_q_heads, l, d) = (qs[0], qs[1], qs[2], qs[3]);
    let ks = keys.shape();
    let n_kv_heads = ks[ks.len() - 3];
    let vs = values.shape();
    let dv = vs[vs.len() - 1];
    let n_repeats = n_q_heads / n_kv_heads.max(1);
    let mut queries = ops::multiply_scalar(queries, scale, None)?;
    let (k, v) = if n_repeats > 1 {
        queries = ops::reshape(&queries, &[b, n_kv_heads, n_repeats, l, d], None)?;
        (
            ops::expand_dims(keys, &[-3], None)?,
            ops::expand_dims(values, &[-3], None)?,
        )
    } else {
        (keys.clone(), values.clone())
    };
    let mut scores = ops::matmul(&queries, &ops::swapaxes(&k, -1, -2, None)?, None)?;
    scores = masked_scores(scores, mask, n_repeats)?;
    let scores = ops::softmax(&scores, &[-1], true, None)?;
    let out = ops::matmul(&scores, &v, None)?;
    if n_repeats > 1 {
        Ok(ops::reshape(&out, &[b, n_q_heads, l, dv], None)?)
    } else {
        Ok(out)
    }
}

/// Attention over dense keys and values through MLX's fused kernel, with the keys and values
/// padded with zeros to a multiple of `bucket` positions and a boolean mask that hides the
/// padding (a causal mask keeps its bottom-right alignment: query i of l sees the keys up to
/// kl - l + i). On MLX's CUDA back-end the fused kernel runs cuDNN for more than one query,
/// whose graphs are cached by shape: keys that grow every call built a graph every call, padded
/// ones build one a bucket, after which a call is cheaper than the plain ops over keys that
/// grow (figures: results/gpu/2026-12-04-s24-spec-attn).
/// `None` for an array mask (left to the caller).
pub fn bucketed_scaled_dot_product_attention(
    queries: &Array,
    keys: &Array,
    values: &Array,
    scale: f32,
    mask: &AttentionMask,
    bucket: i32,
) -> Result<Option<Array>> {
    let causal = match mask {
        AttentionMask::None => false,
        AttentionMask::Causal => true,
        AttentionMask::Array(_) => return Ok(None),
    };
    let ql = queries.dim(-2)?;
    let kl = keys.dim(-2)?;
    let bucket = bucket.max(1);
    let padded = (kl + bucket - 1) / bucket * bucket;
    let pad = |a: &Array| -> Result<Array> {
        if padded == kl {
            return Ok(a.clone());
        }
        let zero = Scalar::Float(0.0).to_array_like(a.dtype())?;
        let axis = a.ndim() as i32 - 2;
        Ok(ops::pad(
            a,
            &[axis],
            &[0],
            &[padded - kl],
            &zero,
            "constant",
            None,
        )?)
    };
    let (k, v) = (pad(keys)?, pad(values)?);
    // Query i sees key j when j <= its last visible key (kl - ql + i causal, kl - 1 otherwise).
    let last = if causal {
        ops::arange(f64::from(kl - ql), f64::from(kl), 1.0, Dtype::Int32, None)?
    } else {
        ops::arange(f64::from(kl - 1), f64::from(kl), 1.0, Dtype::Int32, None)?
    };
    let cols = ops::arange(0.0, f64::from(padded), 1.0, Dtype::Int32, None)?;
    let m = ops::greater_equal(
        &ops::expand_dims(&last, &[1], None)?,
        &ops::expand_dims(&cols, &[0], None)?,
        None,
    )?;
    Ok(Some(fast::scaled_dot_product_attention(
        queries,
        &k,
        &v,
        scale,
        SdpaMask::Array(&m),
        None,
        None,
    )?))
}

/// mlx-lm's masking of attention scores (`scaled_dot_product_attention`'s fallback): a causal
/// mask built for the scores' query and key lengths, a boolean mask as `where` with the dtype's
/// minimum, an additive mask added; one axis more for grouped heads.
fn masked_scores(mut scores: Array, mask: &AttentionMask, n_repeats: i32) -> Result<Array> {
    let mask_arr = match mask {
        AttentionMask::None => None,
        AttentionMask::Causal => {
            let ss = scores.shape();
            let (ql, kl) = (ss[ss.len() - 2], ss[ss.len() - 1]);
            let q_idx = ops::arange(f64::from(kl - ql), f64::from(kl), 1.0, Dtype::Int32, None)?;
            let k_idx = ops::arange(0.0, f64::from(kl), 1.0, Dtype::Int32, None)?;
            Some(ops::greater_equal(
                &ops::expand_dims(&q_idx, &[1], None)?,
                &ops::expand_dims(&k_idx, &[0], None)?,
                None,
            )?)
        }
        AttentionMask::Array(a) => Some(a.clone()),
    };
    if let Some(mut m) = mask_arr {
        if n_repeats > 1 && m.ndim() > 3 {
            m = ops::expand_dims(&m, &[-3], None)?;
        }
        scores = if m.dtype() == Dtype::Bool {
            let min = finfo_min(scores.dtype());
            ops::where_(
                &m,
                &scores,
                &Scalar::Float(min).to_array_like(scores.dtype())?,
                None,
            )?
        } else {
            ops::add(&scores, &m, None)?
        };
    }
    Ok(scores)
}

/// `mx.finfo(dtype).min` as the Python float mlx-lm passes on.
pub(crate) fn finfo_min(d: Dtype) -> f32 {
    match d {
        Dtype::Float16 => -65504.0,
        Dtype::Bfloat16 => half::bf16::MIN.to_f32(),
        _ => f32::MIN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seeded standard-normal float32 values of `shape`.
    fn n(shape: &[i32], seed: u64) -> Result<Array> {
        let key = mlx_core::random::key(seed)?;
        Ok(mlx_core::random::normal(
            shape,
            Dtype::Float32,
            None,
            None,
            Some(&key),
            None,
        )?)
    }

    /// The plain-op attention (the engine's stand-in for MLX's SDPA in CUDA verification
    /// passes) against `mx.fast.scaled_dot_product_attention` on the CPU, which runs MLX's
    /// plain-op fallback: GQA, few queries over a longer cache, each mask kind; equal to the
    /// last bit (the same ops in the same order).
    #[test]
    fn plain_attention_matches_fused_sdpa() -> Result<()> {
        let (b, hq, hkv, l, kl, d) = (1, 8, 2, 5, 37, 16);
        let q = n(&[b, hq, l, d], 1)?;
        let k = n(&[b, hkv, kl, d], 2)?;
        let v = n(&[b, hkv, kl, d], 3)?;
        let scale = (d as f32).powf(-0.5);
        let rows = ops::arange(f64::from(kl - l), f64::from(kl), 1.0, Dtype::Int32, None)?;
        let cols = ops::arange(0.0, f64::from(kl), 1.0, Dtype::Int32, None)?;
        let boolean = ops::greater_equal(
            &ops::expand_dims(&rows, &[1], None)?,
            &ops::expand_dims(&cols, &[0], None)?,
            None,
        )?;
        let additive = n(&[l, kl], 4)?;
        for (name, mask) in [
            ("none", AttentionMask::None),
            ("causal", AttentionMask::Causal),
            ("boolean", AttentionMask::Array(boolean)),
            ("additive", AttentionMask::Array(additive)),
        ] {
            let fused = scaled_dot_product_attention(
                &q,
                &Kv::Dense {
                    keys: k.clone(),
                    values: v.clone(),
                },
                scale,
                &mask,
                None,
            )?;
            let plain = plain_scaled_dot_product_attention(&q, &k, &v, scale, &mask)?;
            assert_eq!(plain.shape(), fused.shape(), "{name}");
            let equal = ops::array_equal(&plain, &fused, false, None)?.item::<bool>()?;
            assert!(equal, "{name}: plain-op attention differs from MLX's SDPA");
        }
        Ok(())
    }

    /// The bucketed attention (keys and values padded to a bucket, the padding masked) against
    /// MLX's SDPA over the unpadded keys, on the CPU: few queries over a longer cache, causal
    /// and unmasked, a key length inside a bucket and one at its end. Float32: the masked
    /// padding adds exact zeros to the softmax's sum, so only the sums' order differs (L3 on
    /// the GPU, where cuDNN sums in its own order anyway).
    #[test]
    fn bucketed_attention_matches_fused_sdpa() -> Result<()> {
        let (b, hq, hkv, l, d) = (1, 8, 2, 5, 16);
        for kl in [37, 64] {
            let q = n(&[b, hq, l, d], 1)?;
            let k = n(&[b, hkv, kl, d], 2)?;
            let v = n(&[b, hkv, kl, d], 3)?;
            let scale = (d as f32).powf(-0.5);
            for (name, mask) in [
                ("none", AttentionMask::None),
                ("causal", AttentionMask::Causal),
            ] {
                let kv = Kv::Dense {
                    keys: k.clone(),
                    values: v.clone(),
                };
                let fused = scaled_dot_product_attention(&q, &kv, scale, &mask, None)?;
                let bucketed = bucketed_scaled_dot_product_attention(&q, &k, &v, scale, &mask, 32)?
                    .expect("a causal or no mask is bucketed");
                assert_eq!(bucketed.shape(), fused.shape(), "{name}");
                let diff = ops::abs(&ops::subtract(&bucketed, &fused, None)?, None)?
                    .max_all(false)?
                    .item::<f32>()?;
                assert!(
                    diff <= 1e-5,
                    "{name}, {kl} keys: bucketed attention {diff} from MLX's SDPA"
                );
            }
            let arr = AttentionMask::Array(n(&[l, kl], 4)?);
            assert!(bucketed_scaled_dot_product_attention(&q, &k, &v, scale, &arr, 32)?.is_none());
        }
        Ok(())
    }
}

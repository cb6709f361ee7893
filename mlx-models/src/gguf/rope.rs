//! Rope factor tensors turned back into mlx-lm's `rope_scaling`: Llama 3's `rope_freqs`
//! and the long-rope factors of Phi-3 and MiniCPM3.

use std::collections::BTreeMap;
use std::path::Path;

use mlx_core::io::GgufMetadata;
use mlx_core::prelude::*;
use serde_json::{json, Value};

use super::{gguf_err, meta_count, meta_f64};
use crate::error::Result;

/// Llama 3's rope scaling from llama.cpp's `rope_freqs` tensor. The converter stores only the
/// per-frequency factors (1 above the high-frequency wavelength, `factor` below the
/// low-frequency one, a smooth blend between) that mlx-lm's `Llama3RoPE` computes from
/// `factor`, `low_freq_factor`, `high_freq_factor` and `original_max_position_embeddings`: the
/// parameters are recovered (low_freq_factor 1, as every Llama 3 has; the other two solved
/// from the blended factors, `high_freq_factor` 4 when fewer than two are blended) and
/// checked by recomputing every factor; factors no such parameters give are refused.
pub(super) fn llama3_rope(
    config: &mut Value,
    f: &Array,
    path: &Path,
    default_head: i32,
) -> Result<()> {
    let bad = |why: String| gguf_err(path, format!("tensor rope_freqs: {why}"));
    let got: Vec<f64> = f
        .astype(Dtype::Float32)
        .and_then(|a| a.to_vec::<f32>())
        .map_err(|e| bad(e.to_string()))?
        .into_iter()
        .map(f64::from)
        .collect();
    let dim = config["head_dim"]
        .as_i64()
        .unwrap_or(i64::from(default_head));
    if f.ndim() != 1 || got.len() as i64 * 2 != dim {
        return Err(bad(format!(
            "shape {:?}, expected ({},) for head size {dim}",
            f.shape(),
            dim / 2
        )));
    }
    if got.iter().any(|x| !x.is_finite() || *x < 1.0) {
        return Err(bad("a factor below 1 or not finite".into()));
    }
    let factor = got.iter().cloned().fold(1.0, f64::max);
    if factor == 1.0 {
        return Ok(()); // no scaling
    }
    let base = config["rope_theta"].as_f64().unwrap_or(10000.0);
    let wavelen: Vec<f64> = (0..got.len())
        .map(|i| 2.0 * std::f64::consts::PI * base.powf(2.0 * i as f64 / dim as f64))
        .collect();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-4 * b.abs().max(1.0);
    // smooth = (old / wavelen - low) / (high - low), from a blended factor r.
    let smooth = |r: f64| (1.0 / r - 1.0 / factor) / (1.0 - 1.0 / factor);
    let blended: Vec<usize> = (0..got.len())
        .filter(|&i| !close(got[i], 1.0) && !close(got[i], factor))
        .collect();
    let low = 1.0;
    let (old, high) = match blended.as_slice() {
        [] => {
            // No blended band: a step at the original context, which low = high gives (Llama 4
            // Scout's 1 and 1; mlx-lm's Llama3RoPE then blends nothing). Any context between
            // the two classes gives the same factors.
            let lo = (0..got.len())
                .filter(|&i| close(got[i], 1.0))
                .map(|i| wavelen[i])
                .fold(0.0, f64::max);
            let hi = (0..got.len())
                .filter(|&i| close(got[i], factor))
                .map(|i| wavelen[i])
                .fold(f64::INFINITY, f64::min);
            let old = if lo < 8192.0 && 8192.0 < hi {
                8192.0
            } else {
                ((lo + hi.min(lo * 2.0)) / 2.0).round()
            };
            (old, low)
        }
        [i] => {
            let high = 4.0;
            (((3.0 * smooth(got[*i]) + 1.0) * wavelen[*i]).round(), high)
        }
        [.., _] => {
            // s = a / wavelen - b with a = old / (high - low), b = low / (high - low).
            let (i, j) = (blended[0], blended[blended.len() - 1]);
            let (si, sj) = (smooth(got[i]), smooth(got[j]));
            let a = (si - sj) / (1.0 / wavelen[i] - 1.0 / wavelen[j]);
            let b = a / wavelen[i] - si;
            if !(b > 0.0 && a > 0.0) {
                return Err(bad("the blended factors are not Llama 3's".into()));
            }
            let high = low + 1.0 / b;
            let high = format!("{high:.6e}").parse::<f64>().unwrap_or(high);
            ((a / b).round(), high)
        }
    };
    let expect = |w: f64| -> f64 {
        if w < old / high {
            1.0
        } else if w > old / low {
            factor
        } else {
            let s = (old / w - low) / (high - low);
            1.0 / ((1.0 - s) / factor + s)
        }
    };
    if let Some(i) = (0..got.len()).find(|&i| !close(expect(wavelen[i]), got[i])) {
        return Err(bad(format!(
            "factor {i} is {}, which no Llama 3 rope scaling gives (recovered factor {factor}, \
             low 1, high {high}, original context {old})",
            got[i]
        )));
    }
    config["rope_scaling"] = json!({
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": old as i64,
    });
    Ok(())
}

/// Phi-3's long rope as llama.cpp writes it (`rope_factors_long` / `rope_factors_short`
/// tensors, `rope.scaling.original_context_length`, `rope.scaling.attn_factor`) back into
/// mlx-lm's `rope_scaling` (type `longrope`) and `original_max_position_embeddings`. mlx-lm's
/// phimoe reads the scale from `long_mscale`: the file's attention factor (what llama.cpp
/// multiplies by; a checkpoint's own mscale, when it differs, is not in the file). Both
/// factor tensors or neither.
pub(super) fn long_rope(
    config: &mut Value,
    rope: &mut BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    arch: &str,
) -> Result<()> {
    let long = rope.remove("rope_factors_long.weight");
    let short = rope.remove("rope_factors_short.weight");
    let (long, short) = match (long, short) {
        (None, None) => return Ok(()),
        (Some(l), Some(s)) => (l, s),
        _ => {
            return Err(gguf_err(
                path,
                "rope_factors_long and rope_factors_short come together",
            ))
        }
    };
    let list = |a: &Array, name: &str| -> Result<Value> {
        let v = a
            .astype(Dtype::Float32)
            .and_then(|a| a.to_vec::<f32>())
            .map_err(|e| gguf_err(path, format!("tensor {name}: {e}")))?;
        if a.ndim() != 1 || v.iter().any(|x| !x.is_finite() || *x <= 0.0) {
            return Err(gguf_err(
                path,
                format!("tensor {name}: expected a vector of positive factors"),
            ));
        }
        Ok(Value::from(
            v.into_iter().map(f64::from).collect::<Vec<_>>(),
        ))
    };
    let key = |k: &str| format!("{arch}.{k}");
    // MiniCPM3's converter writes no original context: llama.cpp's is the context length.
    let orig_key = if arch == "minicpm3" {
        "context_length"
    } else {
        "rope.scaling.original_context_length"
    };
    let orig = meta_count(meta, path, &key(orig_key))?.ok_or_else(|| {
        gguf_err(
            path,
            format!("metadata `{}` is missing (long rope)", key(orig_key)),
        )
    })?;
    let mut rs = json!({
        "type": "longrope",
        "long_factor": list(&long, "rope_factors_long")?,
        "short_factor": list(&short, "rope_factors_short")?,
    });
    if arch == "phimoe" {
        let m = match meta_f64(meta, &key("rope.scaling.attn_factor")) {
            Some(v) if v.is_finite() && v > 0.0 => Value::from(v),
            Some(v) => {
                return Err(gguf_err(
                    path,
                    format!("metadata `{}` is {v}", key("rope.scaling.attn_factor")),
                ))
            }
            None => Value::Null,
        };
        rs["short_mscale"] = m.clone();
        rs["long_mscale"] = m;
    }
    if arch == "minicpm3" {
        rs["original_max_position_embeddings"] = Value::from(orig);
    } else {
        config["original_max_position_embeddings"] = Value::from(orig);
    }
    config["rope_scaling"] = rs;
    Ok(())
}

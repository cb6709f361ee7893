//! Metadata reads shared by the per-architecture maps: counts, floats, flags and per-layer
//! lists, each failing with an error that names the key (`metadata `<arch>.<key>` ...`).
//! Re-exported from `gguf.rs`, so every map calls them as `super::NAME`.

use std::path::Path;

use mlx_core::io::{GgufMetadata, GgufValue};
use mlx_core::prelude::*;
use serde_json::Value;

use super::gguf_err;
use crate::error::{ModelError, Result};

/// An architecture's hyper-parameter keys (`<arch>.<k>`), read with the messages every map
/// shares: `key`, `float` (finite, within f32, > 0 or >= 0), `count` (a positive 32-bit
/// integer that must be present).
#[derive(Clone, Copy)]
pub(super) struct Keys<'a> {
    pub(super) arch: &'a str,
    pub(super) meta: &'a GgufMetadata,
    pub(super) path: &'a Path,
}

impl Keys<'_> {
    /// `<arch>.<k>`.
    pub(super) fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// A float hyper-parameter that is present must be finite and within what it means: a
    /// NaN `rope.freq_base` became JSON null (serde_json's NaN) and the default replaced it.
    pub(super) fn float(&self, k: &str, zero_ok: bool) -> Result<Option<f64>> {
        let key = |k: &str| self.key(k);
        let Some(v) = meta_f64(self.meta, &key(k)) else {
            if self.meta.contains_key(&key(k)) {
                return Err(gguf_err(
                    self.path,
                    format!("metadata `{}` is not a number", key(k)),
                ));
            }
            return Ok(None);
        };
        let ok = v.is_finite() && v <= f64::from(f32::MAX) && (v > 0.0 || (zero_ok && v == 0.0));
        if !ok {
            let want = if zero_ok {
                "a finite number >= 0"
            } else {
                "a finite number > 0"
            };
            return Err(gguf_err(
                self.path,
                format!("metadata `{}` is {v}; it must be {want}", key(k)),
            ));
        }
        Ok(Some(v))
    }

    /// `<arch>.<k>`, a positive count, or an error naming the key when it is absent.
    pub(super) fn count(&self, k: &str) -> Result<i32> {
        need_count(self.meta, self.path, self.arch, k)
    }

    /// The expert counts llama.cpp writes for a mixture of experts, each required, into
    /// `config` under the names the mlx-lm type gives them: `names` in the order
    /// `expert_count`, `expert_used_count`, `expert_feed_forward_length` (the first
    /// `names.len()` of them are read).
    pub(super) fn experts(&self, config: &mut Value, names: &[&str]) -> Result<()> {
        const KEYS: [&str; 3] = [
            "expert_count",
            "expert_used_count",
            "expert_feed_forward_length",
        ];
        for (name, k) in names.iter().zip(KEYS) {
            config[*name] = Value::from(self.count(k)?);
        }
        Ok(())
    }

    /// The error for `<arch>.<k>`, required and absent.
    pub(super) fn missing(&self, k: &str) -> ModelError {
        gguf_err(self.path, format!("metadata `{}` is missing", self.key(k)))
    }

    /// `expert_gating_func` as the router name mlx-lm's `ty` takes: the first of `routers`
    /// when absent; a number not among them is refused, naming both.
    pub(super) fn gating(
        &self,
        ty: &str,
        routers: [(i32, &'static str); 2],
    ) -> Result<&'static str> {
        Ok(self.router(ty, &routers)?.unwrap_or(routers[0].1))
    }

    /// `expert_gating_func` as one of `routers` (`None` when absent); a number not among them
    /// is refused, naming them.
    pub(super) fn router(
        &self,
        ty: &str,
        routers: &[(i32, &'static str)],
    ) -> Result<Option<&'static str>> {
        let Some(g) = meta_count(self.meta, self.path, &self.key("expert_gating_func"))? else {
            return Ok(None);
        };
        if let Some((_, r)) = routers.iter().find(|(n, _)| *n == g) {
            return Ok(Some(r));
        }
        let names: Vec<String> = routers.iter().map(|(n, r)| format!("{r} ({n})")).collect();
        Err(gguf_err(
            self.path,
            format!(
                "metadata `{}` is {g}; mlx-lm's {ty} routes by {}",
                self.key("expert_gating_func"),
                names.join(" or ")
            ),
        ))
    }

    /// Group-limited routing as DeepSeek V3 names it: `n_group` from `expert_group_count`
    /// and `topk_group` from `expert_group_used_count`, 1 each when absent.
    pub(super) fn groups(&self, config: &mut Value) -> Result<()> {
        for (name, k) in [
            ("n_group", "expert_group_count"),
            ("topk_group", "expert_group_used_count"),
        ] {
            config[name] =
                Value::from(meta_count(self.meta, self.path, &self.key(k))?.unwrap_or(1));
        }
        Ok(())
    }

    /// Group-limited routing where the used groups are required once there are groups:
    /// (`expert_group_count`, `expert_group_used_count`), (1, 1) without groups.
    pub(super) fn grouped(&self) -> Result<(i32, i32)> {
        let groups =
            meta_count(self.meta, self.path, &self.key("expert_group_count"))?.unwrap_or(1);
        let used = if groups > 1 {
            self.count("expert_group_used_count")?
        } else {
            1
        };
        Ok((groups, used))
    }

    /// Mamba-2's heads: `ssm.time_step_rank` of them (read first), each of
    /// `ssm.inner_size / heads` channels.
    pub(super) fn ssm_heads(&self) -> Result<(i32, i32)> {
        let heads = self.count("ssm.time_step_rank")?;
        let inner = self.count("ssm.inner_size")?;
        Ok((heads, self.ssm_head_dim(inner, heads)?))
    }

    /// `inner / heads`, which must be whole (`ssm.inner_size` over `ssm.time_step_rank`).
    pub(super) fn ssm_head_dim(&self, inner: i32, heads: i32) -> Result<i32> {
        if inner % heads != 0 {
            return Err(gguf_err(
                self.path,
                format!(
                    "metadata `{}` = {inner} does not divide into `{}` = {heads} heads",
                    self.key("ssm.inner_size"),
                    self.key("ssm.time_step_rank")
                ),
            ));
        }
        Ok(inner / heads)
    }

    /// For an mlx-lm type whose head size is the width over the heads: an
    /// `attention.key_length` that differs is refused, and `head_dim` is dropped.
    pub(super) fn width_over_heads(&self, config: &mut Value, ty: &str) -> Result<()> {
        let (hidden, heads) = (
            config["hidden_size"].as_i64().unwrap_or(0),
            config["num_attention_heads"].as_i64().unwrap_or(1),
        );
        if let Some(d) = meta_count(self.meta, self.path, &self.key("attention.key_length"))? {
            if i64::from(d) * heads != hidden {
                return Err(gguf_err(
                    self.path,
                    format!(
                        "metadata `{}` = {d} is not the width over the heads, the only head size \
                         mlx-lm's {ty} has",
                        self.key("attention.key_length")
                    ),
                ));
            }
        }
        if let Some(c) = config.as_object_mut() {
            c.remove("head_dim");
        }
        Ok(())
    }

    /// The routed weights' renormalization (`expert_weights_norm`, false when absent) and
    /// scale (`expert_weights_scale`, finite and > 0, 1 when absent), under `names`.
    pub(super) fn route_weights(&self, config: &mut Value, names: [&str; 2]) -> Result<()> {
        let norm = meta_bool(self.meta, self.path, &self.key("expert_weights_norm"))?;
        config[names[0]] = Value::from(norm.unwrap_or(false));
        let scale = positive_f64(self.meta, self.path, &self.key("expert_weights_scale"))?;
        config[names[1]] = Value::from(scale.unwrap_or(1.0));
        Ok(())
    }
}

/// A positive integer hyper-parameter `key`, as a 32-bit value.
pub(super) fn meta_count(meta: &GgufMetadata, path: &Path, key: &str) -> Result<Option<i32>> {
    let Some(v) = meta_f64(meta, key) else {
        return match meta.get(key) {
            None => Ok(None),
            Some(_) => Err(gguf_err(path, format!("metadata `{key}` is not a number"))),
        };
    };
    if v.fract() != 0.0 || !(1.0..=f64::from(i32::MAX)).contains(&v) {
        return Err(gguf_err(
            path,
            format!("metadata `{key}` is {v}; it must be a positive 32-bit integer"),
        ));
    }
    Ok(Some(v as i32))
}

/// A float metadata value that must be finite and positive when present (rope bases,
/// routing scales): `None` when absent, an error naming the key otherwise.
pub(super) fn positive_f64(meta: &GgufMetadata, path: &Path, key: &str) -> Result<Option<f64>> {
    match meta_f64(meta, key) {
        Some(v) if !(v.is_finite() && v > 0.0) => Err(gguf_err(
            path,
            format!("metadata `{key}` is {v}; it must be a finite number > 0"),
        )),
        v => Ok(v),
    }
}

/// A metadata number (scalar array) as f64.
pub fn meta_f64(meta: &GgufMetadata, key: &str) -> Option<f64> {
    match meta.get(key) {
        Some(GgufValue::Array(a)) if a.size() == 1 => {
            a.astype(Dtype::Float64).ok()?.item::<f64>().ok()
        }
        _ => None,
    }
}

/// A metadata string.
pub fn meta_str<'a>(meta: &'a GgufMetadata, key: &str) -> Option<&'a str> {
    match meta.get(key) {
        Some(GgufValue::String(s)) => Some(s),
        _ => None,
    }
}

/// `max_position_embeddings` must have come from `key` (`<arch>.context_length`).
pub(super) fn require_context(config: &Value, path: &Path, key: &str) -> Result<()> {
    match config.get("max_position_embeddings") {
        Some(_) => Ok(()),
        None => Err(gguf_err(path, format!("metadata `{key}` is missing"))),
    }
}

/// `<arch>.<k>`, a positive count, or an error naming the key when it is absent.
pub(super) fn need_count(meta: &GgufMetadata, path: &Path, arch: &str, k: &str) -> Result<i32> {
    let key = format!("{arch}.{k}");
    meta_count(meta, path, &key)?
        .ok_or_else(|| gguf_err(path, format!("metadata `{key}` is missing")))
}

/// A count of layers `key` (0 allowed, unlike [`meta_count`]) of at most `blocks`.
pub(super) fn meta_layer_count(
    meta: &GgufMetadata,
    path: &Path,
    key: &str,
    blocks: i32,
) -> Result<Option<i32>> {
    match meta_f64(meta, key) {
        None if meta.contains_key(key) => {
            Err(gguf_err(path, format!("metadata `{key}` is not a number")))
        }
        None => Ok(None),
        Some(v) if v.fract() == 0.0 && (0.0..=f64::from(blocks)).contains(&v) => Ok(Some(v as i32)),
        Some(v) => Err(gguf_err(
            path,
            format!("metadata `{key}` is {v}; it must be a layer count of at most {blocks}"),
        )),
    }
}

/// The head size `hidden / heads`, where `embedding_length` is a multiple of
/// `attention.head_count` (`key` spells an architecture's metadata keys).
pub(super) fn head_size(
    path: &Path,
    key: &dyn Fn(&str) -> String,
    hidden: i32,
    heads: i32,
) -> Result<i32> {
    if heads <= 0 || hidden % heads != 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {hidden} is not a multiple of `{}` = {heads}",
                key("embedding_length"),
                key("attention.head_count")
            ),
        ));
    }
    Ok(hidden / heads)
}

/// The rotated share of a head of `hd`: the metadata `rot_key` (else `default`), in 1..=hd.
pub(super) fn rotary_dims(
    meta: &GgufMetadata,
    path: &Path,
    rot_key: &str,
    default: i32,
    hd: i32,
) -> Result<i32> {
    let rot = meta_count(meta, path, rot_key)?.unwrap_or(default);
    if rot <= 0 || rot > hd {
        return Err(gguf_err(
            path,
            format!("metadata `{rot_key}` = {rot} must be in 1..={hd} (the head size)"),
        ));
    }
    Ok(rot)
}

/// mlx-lm's `layer_types` names for per-layer sliding flags: `sliding_attention` where a
/// layer slides, `full_attention` elsewhere.
pub(super) fn attention_kinds(sliding: &[bool]) -> Vec<&'static str> {
    let kind = |&s: &bool| {
        if s {
            "sliding_attention"
        } else {
            "full_attention"
        }
    };
    sliding.iter().map(kind).collect()
}

/// `layer_types` ("sliding_attention" / "full_attention") from the per-layer flags of
/// `attention.sliding_window_pattern`, one per layer.
pub(super) fn sliding_kinds(
    meta: &GgufMetadata,
    path: &Path,
    key: &dyn Fn(&str) -> String,
    blocks: i32,
) -> Result<Vec<&'static str>> {
    let missing = |k: &str| gguf_err(path, format!("metadata `{}` is missing", key(k)));
    let flags = match meta.get(&key("attention.sliding_window_pattern")) {
        Some(GgufValue::Array(a)) if a.ndim() == 1 => a
            .astype(Dtype::Bool)
            .and_then(|b| b.to_vec::<bool>())
            .map_err(|e| {
                gguf_err(
                    path,
                    format!(
                        "metadata `{}`: {e}",
                        key("attention.sliding_window_pattern")
                    ),
                )
            })?,
        Some(_) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is not a per-layer list of flags",
                    key("attention.sliding_window_pattern")
                ),
            ))
        }
        None => return Err(missing("attention.sliding_window_pattern")),
    };
    if flags.len() != blocks as usize {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` has {} entries for {blocks} layers",
                key("attention.sliding_window_pattern"),
                flags.len()
            ),
        ));
    }
    let kinds = attention_kinds(&flags);
    Ok(kinds)
}

/// A positive count per layer (a list, or one number for every layer), as 32-bit values.
pub(super) fn per_layer_counts(meta: &GgufMetadata, path: &Path, key: &str) -> Result<Vec<i32>> {
    layer_counts(meta, path, key, 1)
}

/// [`per_layer_counts`] with counts of at least `min` (0 for layers without attention).
pub(super) fn layer_counts(
    meta: &GgufMetadata,
    path: &Path,
    key: &str,
    min: i32,
) -> Result<Vec<i32>> {
    let bad = || {
        let what = if min > 0 { "positive" } else { "non-negative" };
        gguf_err(
            path,
            format!("metadata `{key}` must be {what} 32-bit counts, one per layer"),
        )
    };
    match meta.get(key) {
        None => Err(gguf_err(path, format!("metadata `{key}` is missing"))),
        Some(GgufValue::Array(a)) if a.ndim() <= 1 && a.size() >= 1 => {
            let v = a
                .astype(Dtype::Int64)
                .and_then(|b| b.reshape(&[-1]))
                .and_then(|b| b.to_vec::<i64>())
                .map_err(|e| gguf_err(path, format!("metadata `{key}`: {e}")))?;
            v.iter()
                .map(|&n| i32::try_from(n).ok().filter(|&n| n >= min).ok_or_else(bad))
                .collect()
        }
        Some(_) => Err(bad()),
    }
}

/// A boolean metadata value (`None` when absent).
pub(super) fn meta_bool(meta: &GgufMetadata, path: &Path, key: &str) -> Result<Option<bool>> {
    match meta.get(key) {
        None => Ok(None),
        Some(GgufValue::Array(a)) if a.size() == 1 => a
            .astype(Dtype::Bool)
            .and_then(|b| b.item::<bool>())
            .map(Some)
            .map_err(|e| gguf_err(path, format!("metadata `{key}`: {e}"))),
        Some(_) => Err(gguf_err(path, format!("metadata `{key}` is not a boolean"))),
    }
}

/// The first entry of a per-layer count list `key`, which must be positive.
pub(super) fn first_count(a: &Array, path: &Path, key: &str) -> Result<i32> {
    let per = int_list(a, path, key)?;
    match per.first() {
        Some(&n) if n > 0 && n <= i64::from(i32::MAX) => Ok(n as i32),
        _ => Err(gguf_err(
            path,
            format!("metadata `{key}` is {per:?}: its first layer needs a positive count"),
        )),
    }
}

fn int_list(a: &Array, path: &Path, key: &str) -> Result<Vec<i64>> {
    a.astype(Dtype::Int64)
        .and_then(|b| b.to_vec::<i64>())
        .map_err(|e| gguf_err(path, format!("metadata `{key}`: {e}")))
}

/// A per-layer metadata list `key` (numbers or bools, as f64) of the `blocks` main layers:
/// `None` when absent; the entries past them (multi-token-prediction blocks) dropped.
pub(super) fn layer_list(
    meta: &GgufMetadata,
    path: &Path,
    key: &str,
    blocks: usize,
) -> Result<Option<Vec<f64>>> {
    match meta.get(key) {
        None => Ok(None),
        Some(GgufValue::Array(a)) if a.ndim() == 1 && a.size() >= blocks => {
            let v = a
                .astype(Dtype::Float64)
                .and_then(|b| b.to_vec::<f64>())
                .map_err(|e| gguf_err(path, format!("metadata `{key}`: {e}")))?;
            Ok(Some(v[..blocks].to_vec()))
        }
        Some(_) => Err(gguf_err(
            path,
            format!("metadata `{key}` must list a value for each of the {blocks} layers"),
        )),
    }
}

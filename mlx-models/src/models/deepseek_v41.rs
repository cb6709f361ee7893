//! mlx-lm 0.32.2 `models/deepseek_v41.py` (DeepSeek V4.1's text model): `hc_mult`
//! hyper-connection streams mixed around each sub-layer (per-token mixing coefficients from
//! a float32 RMS-normed projection, the residual mix Sinkhorn-normalized as plain ops, mlx-lm's
//! path off Apple GPUs); attention over a sliding window of one latent KV head plus, on layers
//! with a compression ratio, compressed KV (every `ratio` tokens pooled by a softmax gate, or
//! every token with ratio 1) picked per query by an indexer's top-k (the candidate source
//! layer also picks candidate blocks for the later index layers), the compressed state shared
//! with later layers; FP8 (e4m3, as plain ops bit for bit with MLX's `to_fp8`/`from_fp8`
//! round trip) and FP4 fake quantization, float32 sparse attention with sinks, an inverse rope
//! on the output and grouped low-rank output projections; sqrt-softplus (or sigmoid, softmax)
//! routing with a correction bias over clamped-SwiGLU experts plus a shared MLP. Each layer
//! keeps a [`LayerCache`] (mlx-lm's `LayerCache`: window rows, compressed rows, index keys and
//! the open group's rows; not trimmable). Inference only.

use mlx_cache::{AttentionMask, Cache, Kv, StateValue};
use mlx_core::fast::{self, RopeOffset, SdpaMask};
use mlx_core::prelude::*;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::config::{parse_args, ModelConfig};
use crate::error::{ModelError, Result};
use crate::layers::{
    swiglu, Embedding, Linear, RmsNorm, Rope, SwitchActivation, SwitchGlu, SwitchLinear,
};
use crate::models::moe_block::{Router, ScoreFunc};
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

serde_defaults! {
    d_type: String = "deepseek_v41".into();
    d_vocab: i32 = 129280;
    d_hidden: i32 = 5120;
    d_layers: i32 = 40;
    d_heads: i32 = 64;
    d_head_dim: i32 = 512;
    d_q_lora: i32 = 1280;
    d_rope_dim: i32 = 64;
    d_o_groups: i32 = 8;
    d_o_lora: i32 = 1024;
    d_moe_inter: i32 = 2304;
    d_experts: i32 = 384;
    d_topk: i32 = 6;
    d_score: String = "sqrtsoftplus".into();
    d_one: f64 = 1.0;
    d_true: bool = true;
    d_route_scale: f64 = 1.5;
    d_limit: f64 = 10.0;
    d_eps: f64 = 1e-20;
    d_window: i32 = 128;
    d_compress_theta: f64 = 160000.0;
    d_minus_one: i64 = -1;
    d_cand_blocks: i32 = 2048;
    d_cand_block: i32 = 8;
    d_index_heads: i32 = 32;
    d_index_dim: i32 = 128;
    d_index_topk: i32 = 512;
    d_theta: f64 = 10000.0;
    d_max_pos: i64 = 1048576;
    d_hc: i32 = 4;
    d_hc_iters: i32 = 20;
    d_hc_eps: f64 = 1e-6;
}

/// deepseek_v41.py `ModelArgs` (all defaulted there; a `text_config` is read flat).
#[derive(Clone, Debug, Deserialize)]
pub struct ModelArgs {
    #[serde(default = "d_type")]
    pub model_type: String,
    #[serde(default = "d_vocab")]
    pub vocab_size: i32,
    #[serde(default = "d_hidden")]
    pub hidden_size: i32,
    #[serde(default = "d_layers")]
    pub num_hidden_layers: i32,
    #[serde(default = "d_heads")]
    pub num_attention_heads: i32,
    #[serde(default = "d_head_dim")]
    pub head_dim: i32,
    #[serde(default = "d_q_lora")]
    pub q_lora_rank: i32,
    #[serde(default = "d_rope_dim")]
    pub qk_rope_head_dim: i32,
    #[serde(default = "d_o_groups")]
    pub o_groups: i32,
    #[serde(default = "d_o_lora")]
    pub o_lora_rank: i32,
    #[serde(default = "d_moe_inter")]
    pub moe_intermediate_size: i32,
    #[serde(default = "d_experts")]
    pub n_routed_experts: i32,
    #[serde(default = "d_topk")]
    pub num_experts_per_tok: i32,
    #[serde(default = "d_score")]
    pub scoring_func: String,
    #[serde(default = "d_one")]
    pub gate_temp: f64,
    #[serde(default = "d_true")]
    pub norm_topk_prob: bool,
    #[serde(default = "d_route_scale")]
    pub routed_scaling_factor: f64,
    #[serde(default = "d_limit")]
    pub swiglu_limit: f64,
    #[serde(default = "d_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "d_window")]
    pub sliding_window: i32,
    #[serde(default)]
    pub compress_ratios: Vec<i64>,
    #[serde(default)]
    pub kv_source_layer_ids: Vec<i64>,
    #[serde(default)]
    pub index_source_layer_ids: Vec<i64>,
    #[serde(default = "d_compress_theta")]
    pub compress_rope_theta: f64,
    #[serde(default = "d_minus_one")]
    pub candidate_source_layer_id: i64,
    #[serde(default = "d_cand_blocks")]
    pub candidate_topk_blocks: i32,
    #[serde(default = "d_cand_block")]
    pub candidate_block_size: i32,
    #[serde(default = "d_index_heads")]
    pub index_n_heads: i32,
    #[serde(default = "d_index_dim")]
    pub index_head_dim: i32,
    #[serde(default = "d_index_topk")]
    pub index_topk: i32,
    #[serde(default = "d_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_scaling: Option<Map<String, Value>>,
    #[serde(default = "d_max_pos")]
    pub max_position_embeddings: i64,
    #[serde(default = "d_hc")]
    pub hc_mult: i32,
    #[serde(default = "d_hc_iters")]
    pub hc_sinkhorn_iters: i32,
    #[serde(default = "d_hc_eps")]
    pub hc_eps: f64,
    #[serde(default)]
    pub engram_layer_ids: Vec<i64>,
}

impl ModelArgs {
    fn ratio(&self, layer: usize) -> i64 {
        self.compress_ratios.get(layer).copied().unwrap_or(0)
    }

    fn kv_source(&self, layer: usize) -> bool {
        self.kv_source_layer_ids.contains(&(layer as i64))
    }

    fn index_source(&self, layer: usize) -> bool {
        self.index_source_layer_ids.contains(&(layer as i64))
    }

    /// mlx-lm's own failures (engram layers, indices past `compress_ratios`) and the shapes
    /// MLX would refuse, as errors naming the field.
    fn check(&self) -> Result<()> {
        let bad = |m: String| ModelError::Config(format!("config.json (`deepseek_v41`): {m}"));
        kit::check_positive(
            "deepseek_v41",
            &[
                ("vocab_size", self.vocab_size),
                ("hidden_size", self.hidden_size),
                ("num_hidden_layers", self.num_hidden_layers),
                ("num_attention_heads", self.num_attention_heads),
                ("head_dim", self.head_dim),
                ("q_lora_rank", self.q_lora_rank),
                ("o_groups", self.o_groups),
                ("o_lora_rank", self.o_lora_rank),
                ("moe_intermediate_size", self.moe_intermediate_size),
                ("n_routed_experts", self.n_routed_experts),
                ("num_experts_per_tok", self.num_experts_per_tok),
                ("sliding_window", self.sliding_window),
                ("index_n_heads", self.index_n_heads),
                ("index_head_dim", self.index_head_dim),
                ("index_topk", self.index_topk),
                ("hc_mult", self.hc_mult),
                ("candidate_block_size", self.candidate_block_size),
            ],
        )?;
        if !self.engram_layer_ids.is_empty() {
            return Err(bad(format!(
                "engram_layer_ids {:?}: engram memory (n-gram hash tables, hashed embedding \
                 lookup, engram attention) is not implemented, as in mlx-lm",
                self.engram_layer_ids
            )));
        }
        let n = self.num_hidden_layers as usize;
        let rd = self.qk_rope_head_dim;
        if rd < 0 || rd % 2 != 0 || rd > self.head_dim || rd > self.index_head_dim {
            return Err(bad(format!(
                "qk_rope_head_dim {rd} must be even, at least 0 and at most head_dim {} and \
                 index_head_dim {}",
                self.head_dim, self.index_head_dim
            )));
        }
        if (self.num_attention_heads * self.head_dim) % self.o_groups != 0 {
            return Err(bad(format!(
                "num_attention_heads * head_dim ({}) must divide by o_groups {}",
                self.num_attention_heads * self.head_dim,
                self.o_groups
            )));
        }
        if self.num_experts_per_tok > self.n_routed_experts {
            return Err(bad(format!(
                "num_experts_per_tok {} exceeds n_routed_experts {}",
                self.num_experts_per_tok, self.n_routed_experts
            )));
        }
        if let Some(r) = self
            .compress_ratios
            .iter()
            .find(|r| **r < 0 || **r > 1 << 20)
        {
            return Err(bad(format!("compress_ratios entry {r} is out of range")));
        }
        for (field, ids) in [
            ("kv_source_layer_ids", &self.kv_source_layer_ids),
            ("index_source_layer_ids", &self.index_source_layer_ids),
        ] {
            if let Some(i) = ids
                .iter()
                .find(|i| **i < 0 || **i as usize >= self.compress_ratios.len().min(n))
            {
                return Err(bad(format!(
                    "{field} names layer {i}, which has no entry in compress_ratios (or no layer)"
                )));
            }
        }
        for i in 0..n {
            if self.kv_source(i) && self.ratio(i) == 0 {
                return Err(bad(format!(
                    "kv source layer {i} has compress ratio 0 (nothing to compress)"
                )));
            }
        }
        for (name, v) in [
            ("gate_temp", self.gate_temp),
            ("rms_norm_eps", self.rms_norm_eps),
            ("hc_eps", self.hc_eps),
            ("compress_rope_theta", self.compress_rope_theta),
            ("rope_theta", self.rope_theta),
        ] {
            if !v.is_finite() || v.abs() > f64::from(f32::MAX) {
                return Err(bad(format!("{name} must be a finite float32, got {v}")));
            }
        }
        if self.gate_temp == 0.0 {
            return Err(bad("gate_temp must not be 0".into()));
        }
        Ok(())
    }
}

/// mlx-lm's `LayerCache`: one decoder layer's window rows (the last `window_size`), closed
/// compressed groups and their index keys, and the rows of the group still open. Not
/// trimmable (evicted window rows and closed groups cannot be restored).
#[derive(Clone, Debug)]
pub struct LayerCache {
    window_size: usize,
    offset: usize,
    window: Option<Array>,
    compress_kv: Option<Array>,
    index_k: Option<Array>,
    pending_kv: Option<Array>,
    pending_gate: Option<Array>,
}

impl LayerCache {
    pub fn new(window_size: usize) -> LayerCache {
        LayerCache {
            window_size,
            offset: 0,
            window: None,
            compress_kv: None,
            index_k: None,
            pending_kv: None,
            pending_gate: None,
        }
    }

    /// `update_window`: the window with `kv` appended (returned whole), of which the last
    /// `window_size` rows are kept.
    fn update_window(&mut self, kv: &Array) -> Result<Array> {
        let window = append(self.window.as_ref(), kv)?;
        let rows = window.shape()[1];
        let keep = (self.window_size as i64).min(i64::from(rows)) as i32;
        self.window = Some(ops::slice_axis(&window, 1, rows - keep, rows, None)?);
        self.offset += kv.shape()[1] as usize;
        Ok(window)
    }
}

fn opt(a: &Option<Array>) -> StateValue {
    a.clone().map_or(StateValue::None, StateValue::Array)
}

impl Cache for LayerCache {
    fn class_name(&self) -> &'static str {
        "LayerCache"
    }

    fn offset(&self) -> usize {
        self.offset
    }

    fn update_and_fetch(&mut self, _keys: &Array, _values: &Array) -> mlx_core::Result<Kv> {
        Err(mlx_core::Error::InvalidArgument {
            op: "LayerCache",
            message: "deepseek_v41's layer cache holds window and compressed rows, not keys and \
                      values"
                .into(),
        })
    }

    fn fetch(&self) -> mlx_core::Result<Option<Kv>> {
        Ok(None)
    }

    fn make_mask(
        &self,
        _n: usize,
        _window_size: Option<usize>,
        _return_array: bool,
    ) -> mlx_core::Result<AttentionMask> {
        Ok(AttentionMask::None)
    }

    fn state(&self) -> StateValue {
        StateValue::List(vec![
            opt(&self.window),
            opt(&self.compress_kv),
            opt(&self.index_k),
            opt(&self.pending_kv),
            opt(&self.pending_gate),
            StateValue::Int(self.offset as i64),
        ])
    }

    fn is_trimmable(&self) -> bool {
        false
    }

    fn trim(&mut self, _n: usize) -> usize {
        0
    }

    fn nbytes(&self) -> usize {
        [
            &self.window,
            &self.compress_kv,
            &self.index_k,
            &self.pending_kv,
            &self.pending_gate,
        ]
        .iter()
        .filter_map(|a| a.as_ref().map(Array::nbytes))
        .sum()
    }

    fn is_empty(&self) -> bool {
        self.offset == 0
    }
}

/// `_append`: `new` after `cached` on axis 1.
fn append(cached: Option<&Array>, new: &Array) -> Result<Array> {
    Ok(match cached {
        None => new.clone(),
        Some(c) => ops::concatenate(&[c, new], 1, None)?,
    })
}

fn weak(v: f64, like: &Array) -> Result<Array> {
    Ok(Scalar::from(v).to_array_like(like.dtype())?)
}

/// `YarnRoPE` as deepseek_v41 builds it (traditional, attention factor 1): its frequency
/// table, applied with a position scale and, for the output, negated frequencies.
#[derive(Clone)]
struct YarnRope {
    dims: i32,
    freqs: Array,
    neg_freqs: Array,
}

impl YarnRope {
    fn new(
        dims: i32,
        base: f64,
        factor: f64,
        original: f64,
        fast: f64,
        slow: f64,
    ) -> Result<YarnRope> {
        let mut cfg = Map::new();
        cfg.insert("type".into(), "yarn".into());
        cfg.insert("factor".into(), factor.into());
        cfg.insert("original_max_position_embeddings".into(), original.into());
        cfg.insert("beta_fast".into(), fast.into());
        cfg.insert("beta_slow".into(), slow.into());
        cfg.insert("mscale".into(), 0.0.into());
        cfg.insert("mscale_all_dim".into(), 0.0.into());
        let freqs = match Rope::initialize(dims, base, true, Some(&cfg), None)? {
            Rope::Freqs { freqs, .. } => freqs,
            _ => {
                return Err(ModelError::Internal {
                    what: "deepseek_v41".into(),
                    problem: "YaRN rope without a frequency table".into(),
                })
            }
        };
        Ok(YarnRope {
            dims,
            neg_freqs: ops::negative(&freqs, None)?,
            freqs,
        })
    }

    fn apply(&self, x: &Array, offset: i64, scale: f32, inverse: bool) -> Result<Array> {
        let offset = i32::try_from(offset).map_err(|_| ModelError::Input {
            what: "rope".into(),
            problem: format!("offset {offset} too large"),
        })?;
        let freqs = if inverse {
            &self.neg_freqs
        } else {
            &self.freqs
        };
        Ok(fast::rope(
            x,
            self.dims,
            true,
            None,
            scale,
            RopeOffset::Int(offset),
            Some(freqs),
            None,
        )?)
    }
}

/// `_apply_rope`: interleaved rope on the trailing `rope_dim` features, in float32.
fn apply_rope(
    x: &Array,
    rope: &YarnRope,
    rope_dim: i32,
    offset: i64,
    scale: f32,
    inverse: bool,
) -> Result<Array> {
    if rope_dim == 0 {
        return Ok(x.clone());
    }
    let d = *x.shape().last().unwrap_or(&0);
    let head = ops::slice_axis(x, -1, 0, d - rope_dim, None)?;
    let tail = ops::slice_axis(x, -1, d - rope_dim, d, None)?.astype(Dtype::Float32)?;
    let tail = if x.ndim() == 4 {
        let t = ops::transpose(&tail, &[0, 2, 1, 3], None)?;
        let t = rope.apply(&t, offset, scale, inverse)?;
        ops::transpose(&t, &[0, 2, 1, 3], None)?
    } else {
        rope.apply(&tail, offset, scale, inverse)?
    };
    Ok(ops::concatenate(
        &[&head, &tail.astype(x.dtype())?],
        -1,
        None,
    )?)
}

/// `x` split into blocks of `block` on the last axis, in float32: `(..., n, block)`.
fn blocks_of(x: &Array, block: i32) -> Result<Array> {
    let mut shape = x.shape();
    shape.pop();
    shape.extend([-1, block]);
    Ok(ops::reshape(&x.astype(Dtype::Float32)?, &shape, None)?)
}

/// `mx.from_fp8(mx.to_fp8(x), float32)` for float32 `x`: round to nearest even on the e4m3
/// grid (3 mantissa bits, subnormal step 2^-9), saturating at 448 (MLX's `ToFP8` sends
/// magnitudes of 464 and up to 448; below that the nearest grid point is at most 448).
fn fp8_round_trip(x: &Array) -> Result<Array> {
    let f = |v: f64| Scalar::from(v).to_array_like(Dtype::Float32);
    let a = ops::abs(x, None)?;
    let e = ops::floor(&ops::log2(&a, None)?, None)?;
    let two = f(2.0)?;
    // log2 may miss the binade by one next to a power of two: correct it exactly.
    let p = ops::power(&two, &e, None)?;
    let e = ops::where_(
        &ops::less(&a, &p, None)?,
        &ops::subtract(&e, &f(1.0)?, None)?,
        &e,
        None,
    )?;
    let p = ops::power(&two, &e, None)?;
    let p2 = ops::multiply(&p, &two, None)?;
    let e = ops::where_(
        &ops::greater_equal(&a, &p2, None)?,
        &ops::add(&e, &f(1.0)?, None)?,
        &e,
        None,
    )?;
    let e = ops::maximum(&e, &f(-6.0)?, None)?;
    let step = ops::power(&two, &ops::subtract(&e, &f(3.0)?, None)?, None)?;
    let q = ops::multiply(
        &ops::round(&ops::divide(&a, &step, None)?, 0, None)?,
        &step,
        None,
    )?;
    let q = ops::minimum(&q, &f(448.0)?, None)?;
    Ok(ops::where_(
        &ops::less(x, &f(0.0)?, None)?,
        &ops::negative(&q, None)?,
        &q,
        None,
    )?)
}

/// `_fake_quant_fp8(x, block_size)`: FP8 e4m3 round trip with power-of-two block scales.
fn fake_quant_fp8(x: &Array, block: i32) -> Result<Array> {
    let shape = x.shape();
    if shape.last().copied().unwrap_or(0) % block != 0 {
        return Ok(x.clone());
    }
    let blocks = blocks_of(x, block)?;
    let amax = ops::max(&ops::abs(&blocks, None)?, &[-1], true, None)?;
    let amax = ops::maximum(&amax, &weak(1e-4, &amax)?, None)?;
    let exponent = ops::ceil(
        &ops::log2(&ops::divide(&amax, &weak(448.0, &amax)?, None)?, None)?,
        None,
    )?;
    let scale = ops::power(&weak(2.0, &exponent)?, &exponent, None)?;
    let q = ops::divide(&blocks, &scale, None)?;
    let q = ops::clip(&q, Some(&weak(-448.0, &q)?), Some(&weak(448.0, &q)?), None)?;
    let out = ops::multiply(&fp8_round_trip(&q)?, &scale, None)?;
    Ok(ops::reshape(&out, &shape, None)?.astype(x.dtype())?)
}

/// `_round_fp4`: each value to the nearest e2m1 value (thresholds as mlx-lm writes them).
fn round_fp4(x: &Array) -> Result<Array> {
    let mag = ops::abs(x, None)?;
    let mut idx = ops::zeros(&mag.shape(), Dtype::Int32, None)?;
    for (t, ge) in [
        (0.25, false),
        (1.25, false),
        (2.5, false),
        (5.0, false),
        (0.75, true),
        (1.75, true),
        (3.5, true),
    ] {
        let th = weak(t, &mag)?;
        let c = if ge {
            ops::greater_equal(&mag, &th, None)?
        } else {
            ops::greater(&mag, &th, None)?
        };
        idx = ops::add(&idx, &c.astype(Dtype::Int32)?, None)?;
    }
    let lut = Array::from_slice(&[0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], &[8])?;
    Ok(ops::multiply(
        &ops::sign(x, None)?,
        &ops::take(&lut, &idx, 0, None)?,
        None,
    )?)
}

/// `_fake_quant_fp4(x, block_size, e4m3_scale)`.
fn fake_quant_fp4(x: &Array, block: i32, e4m3_scale: bool) -> Result<Array> {
    let shape = x.shape();
    if shape.last().copied().unwrap_or(0) % block != 0 {
        return Ok(x.clone());
    }
    let blocks = blocks_of(x, block)?;
    let floor = if e4m3_scale {
        6.0 * 2f64.powi(-9)
    } else {
        6.0 * 2f64.powi(-126)
    };
    let amax = ops::max(&ops::abs(&blocks, None)?, &[-1], true, None)?;
    let amax = ops::maximum(&amax, &weak(floor, &amax)?, None)?;
    let sixth = ops::divide(&amax, &weak(6.0, &amax)?, None)?;
    let scale = if e4m3_scale {
        fp8_round_trip(&sixth)?
    } else {
        let e = ops::ceil(&ops::log2(&sixth, None)?, None)?;
        ops::power(&weak(2.0, &e)?, &e, None)?
    };
    let q = ops::divide(&blocks, &scale, None)?;
    let q = ops::clip(&q, Some(&weak(-6.0, &q)?), Some(&weak(6.0, &q)?), None)?;
    let q = ops::multiply(&round_fp4(&q)?, &scale, None)?;
    Ok(ops::reshape(&q, &shape, None)?.astype(x.dtype())?)
}

/// `HyperConnection`: the pre, post and (Sinkhorn-normalized) residual mixes of the streams.
#[derive(Clone)]
struct HyperConnection {
    hc: i32,
    iters: i32,
    hc_eps: f64,
    norm_eps: f32,
    eps: Array,
    scale_ids: Array,
    fn_: Array,
    base: Array,
    scale: Array,
}

impl HyperConnection {
    fn load(a: &ModelArgs, w: &mut Weights, p: &str) -> Result<HyperConnection> {
        let hc = a.hc_mult;
        let mix = (2 + hc) * hc;
        let ids: Vec<i32> = std::iter::repeat_n(0, hc as usize)
            .chain(std::iter::repeat_n(1, hc as usize))
            .chain(std::iter::repeat_n(2, (hc * hc) as usize))
            .collect();
        Ok(HyperConnection {
            hc,
            iters: a.hc_sinkhorn_iters,
            hc_eps: a.hc_eps,
            norm_eps: a.rms_norm_eps as f32,
            eps: Array::from_slice(&[a.hc_eps as f32], &[1])?,
            scale_ids: Array::from_slice(&ids, &[ids.len() as i32])?,
            fn_: w.take(&format!("{p}.fn"), &[mix, hc * a.hidden_size])?,
            base: w.take(&format!("{p}.base"), &[mix])?,
            scale: w.take(&format!("{p}.scale"), &[3])?,
        })
    }

    /// `_sinkhorn` as mlx-lm runs it off Apple GPUs: the columns normalized, then the rows
    /// and columns `iters - 1` more times.
    fn sinkhorn(&self, comb: &Array) -> Result<Array> {
        let norm = |c: &Array, axis: i32| -> Result<Array> {
            let s = ops::sum(c, &[axis], true, None)?;
            Ok(ops::divide(c, &ops::add(&s, &self.eps, None)?, None)?)
        };
        let mut comb = norm(comb, -2)?;
        for _ in 0..self.iters.max(1) - 1 {
            comb = norm(&comb, -1)?;
            comb = norm(&comb, -2)?;
        }
        Ok(comb)
    }

    fn forward(&self, streams: &Array) -> Result<(Array, Array, Array)> {
        let s = streams.shape();
        let flat = ops::reshape(streams, &[s[0], s[1], -1], None)?.astype(Dtype::Float32)?;
        let flat = fast::rms_norm(&flat, None, self.norm_eps, None)?;
        let mix = ops::matmul(&flat, &ops::transpose_all(&self.fn_, None)?, None)?;
        let mix = ops::add(
            &ops::multiply(
                &mix,
                &ops::take(&self.scale, &self.scale_ids, 0, None)?,
                None,
            )?,
            &self.base,
            None,
        )?;
        let parts = ops::split_at(&mix, &[self.hc, 2 * self.hc], -1, None)?;
        let pre = ops::sigmoid(&parts[0], None)?;
        let pre = ops::add(&pre, &weak(self.hc_eps, &pre)?, None)?;
        let post = ops::sigmoid(&parts[1], None)?;
        let post = ops::multiply(&weak(2.0, &post)?, &post, None)?;
        let mut shape = parts[2].shape();
        shape.pop();
        shape.extend([self.hc, self.hc]);
        let comb = ops::reshape(&parts[2], &shape, None)?;
        let comb = ops::softmax(&comb, &[-1], false, None)?;
        let comb = ops::add(&comb, &weak(self.hc_eps, &comb)?, None)?;
        Ok((pre, post, self.sinkhorn(&comb)?))
    }
}

/// `_collapse(streams, mix)`.
fn collapse(streams: &Array, mix: &Array) -> Result<Array> {
    let m = ops::expand_dims(mix, &[-1], None)?;
    let out = ops::sum(
        &ops::multiply(&m, &streams.astype(Dtype::Float32)?, None)?,
        &[2],
        false,
        None,
    )?;
    Ok(out.astype(streams.dtype())?)
}

/// `_expand(x, residual, post, comb)`.
fn expand(x: &Array, residual: &Array, post: &Array, comb: &Array) -> Result<Array> {
    let c = ops::expand_dims(comb, &[-1], None)?;
    let r = ops::expand_dims(residual, &[-2], None)?;
    let mixed = ops::sum(&ops::multiply(&c, &r, None)?, &[2], false, None)?;
    let out = ops::multiply(
        &ops::expand_dims(post, &[-1], None)?,
        &ops::expand_dims(x, &[-2], None)?,
        None,
    )?;
    Ok(ops::add(&out, &mixed, None)?.astype(residual.dtype())?)
}

#[derive(Clone)]
struct Compressor {
    ratio: i64,
    kv_proj: Linear,
    gate_proj: Option<Linear>,
    kv_norm: RmsNorm,
}

impl Compressor {
    /// The latents of every group of `ratio` tokens completed by `x` (`None` if none) and the
    /// index of the first.
    fn forward(
        &self,
        x: &Array,
        start_pos: i64,
        cache: &mut LayerCache,
    ) -> Result<(Option<Array>, i64)> {
        if self.ratio == 1 {
            return Ok((
                Some(self.kv_norm.forward(&self.kv_proj.forward(x)?)?),
                start_pos,
            ));
        }
        let gate_proj = self
            .gate_proj
            .as_ref()
            .ok_or_else(|| ModelError::Internal {
                what: "deepseek_v41".into(),
                problem: "a pooling compressor without gate_proj".into(),
            })?;
        let h = x.astype(Dtype::Float32)?;
        let pending = cache.pending_kv.as_ref().map_or(0, |p| p.shape()[1]);
        let kv = append(cache.pending_kv.as_ref(), &self.kv_proj.forward(&h)?)?;
        let gate = append(cache.pending_gate.as_ref(), &gate_proj.forward(&h)?)?;
        let total = kv.shape()[1];
        let ratio = self.ratio as i32;
        let full = total - total % ratio;
        cache.pending_kv = Some(ops::slice_axis(&kv, 1, full, total, None)?);
        cache.pending_gate = Some(ops::slice_axis(&gate, 1, full, total, None)?);
        let first = (start_pos - i64::from(pending)).div_euclid(self.ratio);
        if full == 0 {
            return Ok((None, first));
        }
        let s = kv.shape();
        let grouped = |a: &Array| -> Result<Array> {
            Ok(ops::reshape(
                &ops::slice_axis(a, 1, 0, full, None)?,
                &[s[0], -1, ratio, s[2]],
                None,
            )?)
        };
        let (kv, gate) = (grouped(&kv)?, grouped(&gate)?);
        let latent = ops::sum(
            &ops::multiply(&kv, &ops::softmax(&gate, &[2], false, None)?, None)?,
            &[2],
            false,
            None,
        )?;
        Ok((
            Some(self.kv_norm.forward(&latent.astype(x.dtype())?)?),
            first,
        ))
    }
}

#[derive(Clone)]
struct Indexer {
    ratio: i64,
    candidate_source: bool,
    candidate_topk_blocks: i32,
    candidate_block_size: i32,
    num_heads: i32,
    head_dim: i32,
    index_topk: i32,
    rope_dim: i32,
    q_b_proj: Linear,
    weights_proj: Linear,
    /// Where the layer compresses its own KV: `k_proj`, `k_norm`.
    keys: Option<(Linear, RmsNorm)>,
}

impl Indexer {
    /// The top-k compressed entries of each query (-1 for none) and the candidate mask.
    fn forward(
        &self,
        x: &Array,
        q_residual: &Array,
        index_k: Option<&Array>,
        candidates: Option<Array>,
        rope: &YarnRope,
        start_pos: i64,
    ) -> Result<(Array, Option<Array>)> {
        let s = x.shape();
        let (b, l) = (s[0], s[1]);
        let index_k = match index_k {
            Some(k) if k.shape()[1] > 0 => k,
            _ => return Ok((ops::zeros(&[b, l, 0], Dtype::Int32, None)?, candidates)),
        };
        let nk = index_k.shape()[1];
        let q = ops::reshape(
            &self.q_b_proj.forward(q_residual)?,
            &[b, l, self.num_heads, self.head_dim],
            None,
        )?;
        let q = apply_rope(&q, rope, self.rope_dim, start_pos, 1.0, false)?;
        let q = fake_quant_fp4(&q, 32, false)?;
        let keys = index_k.astype(Dtype::Float32)?;
        let weights = self.weights_proj.forward(x)?.astype(Dtype::Float32)?;
        let weights = ops::multiply(
            &weights,
            &weak(f64::from(self.num_heads).powf(-0.5), &weights)?,
            None,
        )?;
        let keys_t = ops::swapaxes(&ops::expand_dims(&keys, &[1], None)?, -1, -2, None)?;
        let scores = ops::matmul(&q.astype(Dtype::Float32)?, &keys_t, None)?;
        let scores = ops::maximum(&scores, &weak(0.0, &scores)?, None)?;
        let scores = ops::multiply(
            &scores,
            &weak(f64::from(self.head_dim).powf(-0.5), &scores)?,
            None,
        )?;
        let scores = ops::sum(
            &ops::multiply(&scores, &ops::expand_dims(&weights, &[-1], None)?, None)?,
            &[2],
            false,
            None,
        )?;
        let int = |v: i64| Scalar::Int(v).to_array_like(Dtype::Int32);
        let positions = ops::arange(0.0, f64::from(l), 1.0, Dtype::Int32, None)?;
        let lens = ops::floor_divide(
            &ops::add(&int(start_pos + 1)?, &positions, None)?,
            &int(self.ratio)?,
            None,
        )?;
        let lens = ops::expand_dims(&lens, &[1], None)?;
        let keys_at = ops::arange(0.0, f64::from(nk), 1.0, Dtype::Int32, None)?;
        let visible = ops::less(&ops::expand_dims(&keys_at, &[0], None)?, &lens, None)?;
        let neg_inf = weak(f64::NEG_INFINITY, &scores)?;
        let mut scores = ops::where_(
            &ops::expand_dims(&visible, &[0], None)?,
            &scores,
            &neg_inf,
            None,
        )?;
        let mut candidates = candidates;
        if self.candidate_source && self.candidate_topk_blocks > 0 {
            let block = self.candidate_block_size;
            let pad = (-nk).rem_euclid(block);
            let padded = ops::pad(
                &scores,
                &[0, 1, 2],
                &[0, 0, 0],
                &[0, 0, pad],
                &neg_inf,
                "constant",
                None,
            )?;
            let bs = ops::reshape(&padded, &[b, l, -1, block], None)?;
            let block_scores = ops::max(&bs, &[-1], false, None)?;
            let last = ops::where_(
                &ops::greater(&lens, &int(0)?, None)?,
                &ops::floor_divide(
                    &ops::subtract(&lens, &int(1)?, None)?,
                    &int(block.into())?,
                    None,
                )?,
                &int(-1)?,
                None,
            )?;
            let nb = block_scores.shape()[2];
            let blocks_at = ops::arange(0.0, f64::from(nb), 1.0, Dtype::Int32, None)?;
            let block_scores = ops::where_(
                &ops::equal(&blocks_at, &last, None)?,
                &weak(f64::INFINITY, &block_scores)?,
                &block_scores,
                None,
            )?;
            let kb = self.candidate_topk_blocks.min(nb);
            let chosen = ops::argpartition(&ops::negative(&block_scores, None)?, kb - 1, -1, None)?;
            let chosen = ops::slice_axis(&chosen, -1, 0, kb, None)?;
            let reachable = ops::greater(
                &ops::take_along_axis(&block_scores, &chosen, -1, None)?,
                &neg_inf,
                None,
            )?;
            let c = ops::zeros(&block_scores.shape(), Dtype::Bool, None)?;
            let c = ops::put_along_axis(&c, &chosen, &reachable, -1, None)?;
            let c = ops::repeat(&c, block, -1, None)?;
            candidates = Some(ops::slice_axis(&c, -1, 0, nk, None)?);
        } else if let Some(c) = &candidates {
            scores = ops::where_(c, &scores, &neg_inf, None)?;
        }
        let k = self.index_topk.min(nk);
        let chosen = ops::argpartition(&ops::negative(&scores, None)?, k - 1, -1, None)?;
        let chosen = ops::slice_axis(&chosen, -1, 0, k, None)?.astype(Dtype::Int32)?;
        let keep = ops::less(&chosen, &ops::expand_dims(&lens, &[0], None)?, None)?;
        Ok((ops::where_(&keep, &chosen, &int(-1)?, None)?, candidates))
    }
}

/// The shared state of one forward pass (mlx-lm's `shared` dict).
#[derive(Default)]
struct Shared {
    compress_kv: Option<Array>,
    index_k: Option<Array>,
    topk_idx: Option<Array>,
    candidates: Option<Array>,
}

/// `_gather_rows(values, indices)`: `values (B, K, D)` rows per `indices (B, S, k)`.
fn gather_rows(values: &Array, indices: &Array) -> Result<Array> {
    let s = values.shape();
    let (b, len, dim) = (s[0], s[1], s[2]);
    let safe = ops::maximum(
        indices,
        &Scalar::Int(0).to_array_like(indices.dtype())?,
        None,
    )?;
    let base = ops::arange(0.0, f64::from(b), 1.0, Dtype::Int32, None)?;
    let base = ops::reshape(
        &ops::multiply(
            &base,
            &Scalar::Int(len.into()).to_array_like(Dtype::Int32)?,
            None,
        )?,
        &[b, 1, 1],
        None,
    )?;
    let flat = ops::reshape(values, &[b * len, dim], None)?;
    let idx = ops::reshape(&ops::add(&safe, &base, None)?, &[-1], None)?;
    let mut shape = indices.shape();
    shape.push(dim);
    Ok(ops::reshape(
        &ops::take(&flat, &idx, 0, None)?,
        &shape,
        None,
    )?)
}

/// `_sparse_attention`: each query over the rows its indices pick, in float32, with sinks.
fn sparse_attention(
    q: &Array,
    kvs: &[&Array],
    indices: &[&Array],
    sinks: &Array,
    scale: f32,
) -> Result<Array> {
    let s = q.shape();
    let (b, l, h, d) = (s[0], s[1], s[2], s[3]);
    let rows = kvs
        .iter()
        .zip(indices)
        .map(|(kv, idx)| gather_rows(kv, idx))
        .collect::<Result<Vec<_>>>()?;
    let refs: Vec<&Array> = rows.iter().collect();
    let keys = ops::reshape(&ops::concatenate(&refs, 2, None)?, &[b * l, 1, -1, d], None)?
        .astype(Dtype::Float32)?;
    let all = ops::concatenate(indices, -1, None)?;
    let mask = ops::greater_equal(&all, &Scalar::Int(0).to_array_like(all.dtype())?, None)?;
    let mask = ops::reshape(&mask, &[b * l, 1, 1, -1], None)?;
    let queries = ops::reshape(q, &[b * l, h, 1, d], None)?.astype(Dtype::Float32)?;
    let out = fast::scaled_dot_product_attention(
        &queries,
        &keys,
        &keys,
        scale,
        SdpaMask::Array(&mask),
        Some(&sinks.astype(Dtype::Float32)?),
        None,
    )?;
    Ok(ops::reshape(&out, &[b, l, h, d], None)?.astype(q.dtype())?)
}

#[derive(Clone)]
struct Attention {
    num_heads: i32,
    head_dim: i32,
    rope_dim: i32,
    o_groups: i32,
    ratio: i64,
    kv_source: bool,
    index_source: bool,
    q_a_proj: Linear,
    q_a_norm: RmsNorm,
    q_b_proj: Linear,
    kv_proj: Linear,
    kv_norm: RmsNorm,
    o_a_proj: SwitchLinear,
    o_b_proj: Linear,
    sinks: Array,
    group_ids: Array,
    compressor: Option<Compressor>,
    indexer: Option<Indexer>,
    rope: YarnRope,
}

impl Attention {
    fn load(a: &ModelArgs, w: &mut Weights, p: &str, i: usize) -> Result<Attention> {
        let p = |n: &str| format!("{p}.{n}");
        let (d, h, hd) = (a.hidden_size, a.num_attention_heads, a.head_dim);
        let eps = a.rms_norm_eps as f32;
        let ratio = a.ratio(i);
        let (kv_source, index_source) = (a.kv_source(i), a.index_source(i));
        let compressor = if kv_source {
            Some(Compressor {
                ratio,
                kv_proj: Linear::load(w, &p("compressor.kv_proj"), d, hd, false)?,
                gate_proj: if ratio > 1 {
                    Some(Linear::load(w, &p("compressor.gate_proj"), d, hd, false)?)
                } else {
                    None
                },
                kv_norm: RmsNorm::load(w, &p("compressor.kv_norm"), hd, eps)?,
            })
        } else {
            None
        };
        let indexer = if index_source {
            let (ih, ihd) = (a.index_n_heads, a.index_head_dim);
            Some(Indexer {
                ratio,
                candidate_source: i as i64 == a.candidate_source_layer_id,
                candidate_topk_blocks: a.candidate_topk_blocks,
                candidate_block_size: a.candidate_block_size,
                num_heads: ih,
                head_dim: ihd,
                index_topk: a.index_topk,
                rope_dim: a.qk_rope_head_dim,
                q_b_proj: Linear::load(w, &p("indexer.q_b_proj"), a.q_lora_rank, ih * ihd, false)?,
                weights_proj: Linear::load(w, &p("indexer.weights_proj"), d, ih, false)?,
                keys: if kv_source {
                    Some((
                        Linear::load(w, &p("indexer.k_proj"), hd, ihd, false)?,
                        RmsNorm::load(w, &p("indexer.k_norm"), ihd, eps)?,
                    ))
                } else {
                    None
                },
            })
        } else {
            None
        };
        let rope = if ratio != 0 {
            let scaling = a.rope_scaling.clone().unwrap_or_default();
            let num = |k: &str, d: f64| scaling.get(k).and_then(Value::as_f64).unwrap_or(d);
            let original = num(
                "original_max_position_embeddings",
                a.max_position_embeddings as f64,
            );
            YarnRope::new(
                a.qk_rope_head_dim,
                a.compress_rope_theta,
                num("factor", 1.0),
                original.trunc(),
                num("beta_fast", 32.0).trunc(),
                num("beta_slow", 1.0).trunc(),
            )?
        } else {
            YarnRope::new(a.qk_rope_head_dim, a.rope_theta, 1.0, 4096.0, 32.0, 1.0)?
        };
        let groups = a.o_groups;
        Ok(Attention {
            num_heads: h,
            head_dim: hd,
            rope_dim: a.qk_rope_head_dim,
            o_groups: groups,
            ratio,
            kv_source,
            index_source,
            q_a_proj: Linear::load(w, &p("q_a_proj"), d, a.q_lora_rank, false)?,
            q_a_norm: RmsNorm::load(w, &p("q_a_norm"), a.q_lora_rank, eps)?,
            q_b_proj: Linear::load(w, &p("q_b_proj"), a.q_lora_rank, h * hd, false)?,
            kv_proj: Linear::load(w, &p("kv_proj"), d, hd, false)?,
            kv_norm: RmsNorm::load(w, &p("kv_norm"), hd, eps)?,
            o_a_proj: SwitchLinear::load(
                w,
                &p("o_a_proj"),
                h * hd / groups,
                a.o_lora_rank,
                groups,
                false,
            )?,
            o_b_proj: Linear::load(w, &p("o_b_proj"), groups * a.o_lora_rank, d, false)?,
            sinks: w.take(&p("sinks"), &[h])?,
            group_ids: ops::reshape(
                &ops::arange(0.0, f64::from(groups), 1.0, Dtype::Int32, None)?,
                &[1, groups],
                None,
            )?,
            compressor,
            indexer,
            rope,
        })
    }

    /// `shard()` on `self_attn`: `q_b_proj` by heads, whole output groups per rank
    /// (`o_a_proj`'s groups, `o_b_proj`'s columns, summed), `sinks` by heads; the KV, the
    /// compressor and the indexer whole.
    fn shard_tensor_parallel(&mut self, n: i32, r: i32, path: &str) -> Result<()> {
        use crate::shard::{all_to_sharded, sharded_to_all, split_rows, switch_experts_inplace};
        let p = |m: &str| format!("{path}.{m}");
        all_to_sharded(&mut self.q_b_proj, n, r, &p("q_b_proj"))?;
        switch_experts_inplace(&mut self.o_a_proj, n, r, &p("o_a_proj"))?;
        sharded_to_all(&mut self.o_b_proj, n, r, &p("o_b_proj"))?;
        self.num_heads /= n;
        self.o_groups /= n;
        self.group_ids = ops::reshape(
            &ops::arange(0.0, f64::from(self.o_groups), 1.0, Dtype::Int32, None)?,
            &[1, self.o_groups],
            None,
        )?;
        self.sinks = split_rows(&self.sinks, &[], n, r, &p("sinks"))?;
        Ok(())
    }

    /// `_compress`: the new compressed KV and index keys into the cache, and shared.
    fn compress(
        &self,
        x: &Array,
        start_pos: i64,
        cache: &mut LayerCache,
        shared: &mut Shared,
    ) -> Result<()> {
        let compressor = self
            .compressor
            .as_ref()
            .ok_or_else(|| ModelError::Internal {
                what: "deepseek_v41".into(),
                problem: "a kv source layer without a compressor".into(),
            })?;
        let (latent, first) = compressor.forward(x, start_pos, cache)?;
        if let Some(latent) = latent {
            let scale = self.ratio as f32;
            let kv = apply_rope(&latent, &self.rope, self.rope_dim, first, scale, false)?;
            let kv = fake_quant_fp4(&kv, 16, true)?;
            cache.compress_kv = Some(append(cache.compress_kv.as_ref(), &kv)?);
            if self.index_source {
                if let Some((k_proj, k_norm)) = self.indexer.as_ref().and_then(|i| i.keys.as_ref())
                {
                    let k = k_norm.forward(&k_proj.forward(&latent)?)?;
                    let k = apply_rope(&k, &self.rope, self.rope_dim, first, scale, false)?;
                    let k = fake_quant_fp4(&k, 32, false)?;
                    cache.index_k = Some(append(cache.index_k.as_ref(), &k)?);
                }
            }
        }
        shared.compress_kv = cache.compress_kv.clone();
        if self.index_source {
            shared.index_k = cache.index_k.clone();
        }
        Ok(())
    }

    fn forward(
        &self,
        x: &Array,
        start_pos: i64,
        window_idx: &Array,
        cache: &mut LayerCache,
        shared: &mut Shared,
    ) -> Result<Array> {
        let s = x.shape();
        let (b, l) = (s[0], s[1]);
        let q_residual = self.q_a_norm.forward(&self.q_a_proj.forward(x)?)?;
        let q = ops::reshape(
            &self.q_b_proj.forward(&q_residual)?,
            &[b, l, self.num_heads, self.head_dim],
            None,
        )?;
        let q = apply_rope(&q, &self.rope, self.rope_dim, start_pos, 1.0, false)?;
        let kv = self.kv_norm.forward(&self.kv_proj.forward(x)?)?;
        let kv = apply_rope(&kv, &self.rope, self.rope_dim, start_pos, 1.0, false)?;
        let kv = fake_quant_fp8(&kv, 32)?;
        let window = cache.update_window(&kv)?;
        let mut kvs = vec![window];
        let mut indices = vec![window_idx.clone()];
        if self.ratio != 0 {
            if self.kv_source {
                self.compress(x, start_pos, cache, shared)?;
            }
            if let (true, Some(indexer)) = (self.index_source, &self.indexer) {
                let (topk, candidates) = indexer.forward(
                    x,
                    &q_residual,
                    shared.index_k.as_ref(),
                    shared.candidates.clone(),
                    &self.rope,
                    start_pos,
                )?;
                shared.topk_idx = Some(topk);
                if indexer.candidate_source {
                    shared.candidates = candidates;
                }
            }
            if let (Some(c), Some(t)) = (&shared.compress_kv, &shared.topk_idx) {
                if t.shape().last().copied().unwrap_or(0) > 0 {
                    kvs.push(c.clone());
                    indices.push(t.clone());
                }
            }
        }
        let kv_refs: Vec<&Array> = kvs.iter().collect();
        let idx_refs: Vec<&Array> = indices.iter().collect();
        let scale = f64::from(self.head_dim).powf(-0.5) as f32;
        let out = sparse_attention(&q, &kv_refs, &idx_refs, &self.sinks, scale)?;
        let out = apply_rope(&out, &self.rope, self.rope_dim, start_pos, 1.0, true)?;
        let out = ops::reshape(&out, &[b * l, self.o_groups, 1, -1], None)?;
        let out = self.o_a_proj.forward(&out, &self.group_ids, false)?;
        self.o_b_proj
            .forward(&ops::reshape(&out, &[b, l, -1], None)?)
    }
}

/// `DeepseekV41SwiGLU(limit)(up, gate)`: in float32, the gate clipped from above and the up
/// projection both ways (for a positive limit), mlx-lm's compiled `swiglu`, cast back.
fn clamped_swiglu(up: &Array, gate: &Array, limit: f64) -> Result<Array> {
    let dtype = up.dtype();
    let mut gate = gate.astype(Dtype::Float32)?;
    let mut up = up.astype(Dtype::Float32)?;
    if limit > 0.0 {
        gate = ops::minimum(&gate, &weak(limit, &gate)?, None)?;
        up = ops::clip(
            &up,
            Some(&weak(-limit, &up)?),
            Some(&weak(limit, &up)?),
            None,
        )?;
    }
    Ok(swiglu(&gate, &up)?.astype(dtype)?)
}

#[derive(Clone)]
struct Moe {
    gate_weight: Array,
    e_score_correction_bias: Array,
    top_k: i32,
    /// The shared block's [`Router::DeepseekV4`].
    router: Router,
    experts: SwitchGlu,
    shared_gate: Linear,
    shared_up: Linear,
    shared_down: Linear,
    limit: f64,
    dim: i32,
    /// `sharding_group` after [`Model::shard_tensor_parallel`]: the block's float32 output
    /// summed over the ranks.
    sharded: bool,
}

impl Moe {
    fn load(a: &ModelArgs, w: &mut Weights, p: &str) -> Result<Moe> {
        let (d, m, e) = (a.hidden_size, a.moe_intermediate_size, a.n_routed_experts);
        let p = |n: &str| format!("{p}.{n}");
        Ok(Moe {
            gate_weight: w.take(&p("gate.weight"), &[e, d])?,
            e_score_correction_bias: w.take(&p("gate.e_score_correction_bias"), &[e])?,
            top_k: a.num_experts_per_tok,
            router: Router::DeepseekV4 {
                score: match a.scoring_func.as_str() {
                    "sigmoid" => ScoreFunc::Sigmoid,
                    "softmax" => ScoreFunc::Softmax,
                    _ => ScoreFunc::SqrtSoftplus,
                },
                gate_temp: a.gate_temp,
                norm_topk_prob: a.norm_topk_prob,
                route_scale: a.routed_scaling_factor,
            },
            experts: SwitchGlu::load(
                w,
                &p("experts.switch_mlp"),
                d,
                m,
                e,
                false,
                SwitchActivation::SwiGlu,
            )?,
            shared_gate: Linear::load(w, &p("shared_experts.gate_proj"), d, m, false)?,
            shared_up: Linear::load(w, &p("shared_experts.up_proj"), d, m, false)?,
            shared_down: Linear::load(w, &p("shared_experts.down_proj"), m, d, false)?,
            limit: a.swiglu_limit,
            dim: d,
            sharded: false,
        })
    }

    /// `Router.__call__`: the float32 logits against the raw gate weight, then the shared
    /// block's [`Router::DeepseekV4`] rule.
    fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let logits = ops::matmul(
            &x.astype(Dtype::Float32)?,
            &ops::transpose_all(&self.gate_weight.astype(Dtype::Float32)?, None)?,
            None,
        )?;
        let bias = Some(&self.e_score_correction_bias);
        let (chosen, weights, _) = self.router.select(&logits, self.top_k, bias, x)?;
        Ok((chosen, weights))
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        let shape = x.shape();
        let flat = ops::reshape(x, &[-1, self.dim], None)?;
        let (indices, weights) = self.route(&flat)?;
        let limit = self.limit;
        let routed = self
            .experts
            .forward_with(&flat, &indices, |up, gate| clamped_swiglu(up, gate, limit))?;
        let routed = ops::sum(
            &ops::multiply(
                &routed.astype(Dtype::Float32)?,
                &ops::expand_dims(&weights, &[-1], None)?.astype(Dtype::Float32)?,
                None,
            )?,
            &[1],
            false,
            None,
        )?;
        let gate = self.shared_gate.forward(&flat)?;
        let up = self.shared_up.forward(&flat)?;
        let shared = self
            .shared_down
            .forward(&clamped_swiglu(&up, &gate, limit)?.astype(flat.dtype())?)?;
        let mut out = ops::add(&routed, &shared.astype(Dtype::Float32)?, None)?;
        if self.sharded {
            out = mlx_core::distributed::all_sum(&out, None, None)?;
        }
        Ok(ops::reshape(&out, &shape, None)?.astype(x.dtype())?)
    }

    /// `shard()` on the block: the routed and shared experts split in place (gate and up by
    /// rows, down by columns), their sum taken over the ranks in `forward`.
    fn shard_tensor_parallel(&mut self, n: i32, r: i32, path: &str) -> Result<()> {
        use crate::shard::{all_to_sharded, sharded_to_all_inplace, switch_inplace};
        let p = |m: &str| format!("{path}.{m}");
        let e = &mut self.experts;
        switch_inplace(
            &mut e.gate_proj,
            true,
            n,
            r,
            &p("experts.switch_mlp.gate_proj"),
        )?;
        switch_inplace(&mut e.up_proj, true, n, r, &p("experts.switch_mlp.up_proj"))?;
        switch_inplace(
            &mut e.down_proj,
            false,
            n,
            r,
            &p("experts.switch_mlp.down_proj"),
        )?;
        all_to_sharded(&mut self.shared_gate, n, r, &p("shared_experts.gate_proj"))?;
        all_to_sharded(&mut self.shared_up, n, r, &p("shared_experts.up_proj"))?;
        sharded_to_all_inplace(&mut self.shared_down, n, r, &p("shared_experts.down_proj"))?;
        self.sharded = true;
        Ok(())
    }
}

#[derive(Clone)]
struct Layer {
    self_attn: Attention,
    mlp: Moe,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    attn_hc: HyperConnection,
    ffn_hc: HyperConnection,
}

impl Layer {
    fn forward(
        &self,
        streams: &Array,
        pre_mix: &Array,
        start_pos: i64,
        window_idx: &Array,
        cache: &mut LayerCache,
        shared: &mut Shared,
    ) -> Result<(Array, Array)> {
        let (attn_pre, attn_post, attn_comb) = self.attn_hc.forward(streams)?;
        let h = self.input_layernorm.forward(&collapse(streams, pre_mix)?)?;
        let h = self
            .self_attn
            .forward(&h, start_pos, window_idx, cache, shared)?;
        let streams = expand(&h, streams, &attn_post, &attn_comb)?;
        let (ffn_pre, ffn_post, ffn_comb) = self.ffn_hc.forward(&streams)?;
        let h = self.mlp.forward(
            &self
                .post_attention_layernorm
                .forward(&collapse(&streams, &attn_pre)?)?,
        )?;
        Ok((expand(&h, &streams, &ffn_post, &ffn_comb)?, ffn_pre))
    }
}

/// `_window_indices(previous, length, window)`: the window rows each query reads, -1 for none.
fn window_indices(previous: i32, length: i32, window: i32) -> Result<Array> {
    let int = |v: i32| Scalar::Int(v.into()).to_array_like(Dtype::Int32);
    let width = window.min(previous + length);
    let end = ops::add(
        &int(previous)?,
        &ops::arange(0.0, f64::from(length), 1.0, Dtype::Int32, None)?,
        None,
    )?;
    let start = ops::maximum(
        &ops::add(&ops::subtract(&end, &int(window)?, None)?, &int(1)?, None)?,
        &int(0)?,
        None,
    )?;
    let indices = ops::add(
        &ops::expand_dims(&start, &[1], None)?,
        &ops::expand_dims(
            &ops::arange(0.0, f64::from(width), 1.0, Dtype::Int32, None)?,
            &[0],
            None,
        )?,
        None,
    )?;
    Ok(ops::where_(
        &ops::greater(&indices, &ops::expand_dims(&end, &[1], None)?, None)?,
        &int(-1)?,
        &indices,
        None,
    )?)
}

/// The DeepSeek V4.1 text model.
pub struct Model {
    args: ModelArgs,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Linear,
    /// After [`Model::shard_pipeline`]: this rank's stage `(rank, size)` and its layers.
    pipeline: Option<Stage>,
}

/// A pipeline stage: `(rank, size)` and the layers `start..end` it runs.
#[derive(Clone, Copy, Debug)]
struct Stage {
    rank: i32,
    size: i32,
    start: usize,
    end: usize,
}

/// The shared state that crosses a stage boundary (`_shared_reads` / `_crossing` keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SharedKey {
    CompressKv,
    IndexK,
    Candidates,
    TopkIdx,
}

impl SharedKey {
    /// `_CACHE_FIELDS`: the state kept in the `LayerCache` field of that name.
    fn is_cache_field(self) -> bool {
        matches!(self, SharedKey::CompressKv | SharedKey::IndexK)
    }

    fn name(self) -> &'static str {
        match self {
            SharedKey::CompressKv => "compress_kv",
            SharedKey::IndexK => "index_k",
            SharedKey::Candidates => "candidates",
            SharedKey::TopkIdx => "topk_idx",
        }
    }
}

/// `_shared_reads(args, layer)`: the shared state a layer reads, as (key, layer that writes
/// it), in mlx-lm's dict order.
fn shared_reads(a: &ModelArgs, layer: usize) -> Vec<(SharedKey, usize)> {
    if a.ratio(layer) == 0 {
        return Vec::new();
    }
    let last = |m: &dyn Fn(usize) -> bool| (0..=layer).rev().find(|&j| m(j));
    let mut reads = vec![(
        SharedKey::CompressKv,
        last(&|j| a.kv_source(j) && a.ratio(j) != 0),
    )];
    if a.index_source(layer) {
        reads.push((
            SharedKey::IndexK,
            last(&|j| a.kv_source(j) && a.index_source(j)),
        ));
        let source = a.candidate_source_layer_id;
        if source >= 0 && (source as usize) < layer && a.candidate_topk_blocks > 0 {
            reads.push((SharedKey::Candidates, Some(source as usize)));
        }
    } else {
        reads.push((SharedKey::TopkIdx, last(&|j| a.index_source(j))));
    }
    reads
        .into_iter()
        .filter_map(|(k, s)| s.map(|s| (k, s)))
        .collect()
}

/// `_crossing(args, boundary)`: the shared state that layers from `boundary` on read from
/// layers before it (a key keeps the place it was first met, its source the last one).
fn crossing(a: &ModelArgs, boundary: usize) -> Vec<(SharedKey, usize)> {
    let mut out: Vec<(SharedKey, usize)> = Vec::new();
    for layer in boundary..a.num_hidden_layers as usize {
        for (key, source) in shared_reads(a, layer) {
            if source < boundary {
                match out.iter_mut().find(|(k, _)| *k == key) {
                    Some(e) => e.1 = source,
                    None => out.push((key, source)),
                }
            }
        }
    }
    out
}

/// `_entries(args, source, position)`: the compressed entries of kv source `source` after
/// `position` tokens.
fn entries(a: &ModelArgs, source: Option<usize>, position: i64) -> Result<i64> {
    match source {
        None => Ok(0),
        Some(s) => match a.ratio(s) {
            0 => Err(ModelError::Config(format!(
                "config.json (`deepseek_v41`): layer {s} is a shared-state source with \
                 compress ratio 0 (`compress_ratios`)"
            ))),
            r => Ok(position.div_euclid(r)),
        },
    }
}

/// `_index_keys(args, layer, position)`: the index keys layer `layer` scores.
fn index_keys(a: &ModelArgs, layer: usize, position: i64) -> Result<i64> {
    let source = shared_reads(a, layer)
        .into_iter()
        .find(|(k, _)| *k == SharedKey::IndexK)
        .map(|(_, s)| s);
    entries(a, source, position)
}

/// One part of a stage-boundary message: its key (`None` for the streams and `pre_mix`),
/// shape and dtype.
type Part = (Option<SharedKey>, Vec<i32>, Dtype);

/// `_layout`: the parts of the message at a stage boundary.
fn layout(
    a: &ModelArgs,
    crossing: &[(SharedKey, usize)],
    batch: i32,
    length: i32,
    start_pos: i64,
    dtype: Dtype,
) -> Result<Vec<Part>> {
    let end = start_pos + i64::from(length);
    let mut out: Vec<Part> = vec![
        (None, vec![batch, length, a.hc_mult, a.hidden_size], dtype),
        (None, vec![batch, length, a.hc_mult], Dtype::Float32),
    ];
    for &(key, source) in crossing {
        let part = match key {
            SharedKey::CompressKv | SharedKey::IndexK => {
                let new = entries(a, Some(source), end)? - entries(a, Some(source), start_pos)?;
                let width = if key == SharedKey::CompressKv {
                    a.head_dim
                } else {
                    a.index_head_dim
                };
                (vec![batch, new as i32, width], dtype)
            }
            SharedKey::Candidates => {
                let block = i64::from(a.candidate_block_size);
                let blocks = (index_keys(a, source, end)? + block - 1).div_euclid(block);
                (vec![batch, length, blocks as i32], Dtype::Bool)
            }
            SharedKey::TopkIdx => {
                let topk = i64::from(a.index_topk).min(index_keys(a, source, end)?);
                (vec![batch, length, topk as i32], Dtype::Int32)
            }
        };
        out.push((Some(key), part.0, part.1));
    }
    Ok(out)
}

/// `_nbytes`: one part's bytes in a message, padded to a multiple of 8.
fn nbytes(shape: &[i32], dtype: Dtype) -> i64 {
    let size = shape.iter().map(|&d| i64::from(d)).product::<i64>() * dtype.size() as i64;
    (size + 7) / 8 * 8
}

/// `_pack`: the bytes of all parts in one `uint8` array.
fn pack(parts: &[Array]) -> Result<Array> {
    let mut data = Vec::with_capacity(parts.len());
    for part in parts {
        let flat = ops::reshape(&part.view(Dtype::Uint8)?, &[-1], None)?;
        let pad = nbytes(&part.shape(), part.dtype()) - flat.size() as i64;
        data.push(if pad > 0 {
            ops::pad_widths(
                &flat,
                &[(0, pad as i32)],
                &Array::from_int(0, Dtype::Uint8)?,
                "constant",
                None,
            )?
        } else {
            flat
        });
    }
    let refs: Vec<&Array> = data.iter().collect();
    Ok(ops::concatenate(&refs, 0, None)?)
}

/// `_unpack`: the parts of `packed` as `layout` places them.
fn unpack(packed: &Array, layout: &[Part]) -> Result<Vec<Array>> {
    let mut start = 0i64;
    let mut out = Vec::with_capacity(layout.len());
    for (_, shape, dtype) in layout {
        let len = shape.iter().map(|&d| i64::from(d)).product::<i64>() * dtype.size() as i64;
        let data = ops::slice_axis(packed, 0, start as i32, (start + len) as i32, None)?;
        let mut rows = shape.clone();
        if let Some(last) = rows.last_mut() {
            *last *= dtype.size() as i32;
        }
        out.push(ops::reshape(&data, &rows, None)?.view(*dtype)?);
        start += nbytes(shape, *dtype);
    }
    Ok(out)
}

/// The config, read flat from a `text_config` when there is one (`model_type` from the top).
fn model_args(config: &ModelConfig) -> Result<ModelArgs> {
    let raw = match config.raw.get("text_config") {
        Some(Value::Object(t)) => {
            let mut t = t.clone();
            t.insert("model_type".into(), config.model_type.clone().into());
            Value::Object(t)
        }
        _ => config.raw.clone(),
    };
    let a: ModelArgs = parse_args(&raw, "deepseek_v41")?;
    a.check()?;
    Ok(a)
}

/// `sanitize` for the published checkpoint (DeepSeek's own names: no key starts with
/// `model.`): vision, aligner, image, MTP and engram tensors and the image router bias go,
/// names are mapped to mlx-lm's (`_rename`), experts stacked per projection, `wo_a` split
/// into its output groups, fp8/fp4 weights with their `.scale` repacked as mxfp8/mxfp4
/// (`_repack`; the legacy `quantization_config` is read as mlx-lm reads it, each module's mode
/// inferred from its tensors).
fn sanitize(a: &ModelArgs, w: &mut Weights) -> Result<()> {
    let names = w.names();
    if names.iter().any(|k| k.starts_with("model.")) {
        return Ok(());
    }
    let has = |k: &str| names.iter().any(|n| n == k);
    // A `.scale` beside a `.weight` is that weight's block scale, not a tensor of its own.
    let scale_of = |k: &str| {
        k.strip_suffix(".scale")
            .is_some_and(|base| has(&format!("{base}.weight")))
    };
    let mut scales: std::collections::HashMap<String, Array> = std::collections::HashMap::new();
    for k in names.iter().filter(|k| scale_of(k)) {
        if let Some(v) = w.remove(k) {
            scales.insert(k.clone(), v);
        }
    }
    let dropped = |k: &str| {
        ["vision.", "aligner.", "image_", "mtp."]
            .iter()
            .any(|p| k.starts_with(p))
            || k.contains(".engram.")
            || k.ends_with(".gate.bias_vl")
    };
    type Rows = Vec<(usize, Array, Option<Array>)>;
    let mut experts: std::collections::BTreeMap<(usize, &str), Rows> =
        std::collections::BTreeMap::new();
    for k in &names {
        let Some(v) = w.remove(k) else { continue };
        if dropped(k) {
            continue;
        }
        let scale = k
            .strip_suffix(".weight")
            .and_then(|base| scales.remove(&format!("{base}.scale")));
        // `layers.{l}.ffn.experts.{e}.{w1|w2|w3}.weight`
        let parts: Vec<&str> = k.split('.').collect();
        if let ["layers", l, "ffn", "experts", e, proj @ ("w1" | "w2" | "w3"), "weight"] =
            parts.as_slice()
        {
            if let (Ok(l), Ok(e)) = (l.parse::<usize>(), e.parse::<usize>()) {
                let to = match *proj {
                    "w1" => "gate_proj",
                    "w2" => "down_proj",
                    _ => "up_proj",
                };
                experts.entry((l, to)).or_default().push((e, v, scale));
                continue;
            }
        }
        let name = rename(k);
        let (mut v, mut scale) = match scale {
            Some(sc) => {
                let (v, sc) = repack(&v, &sc)?;
                (v, Some(sc))
            }
            None => (v, None),
        };
        if name.ends_with(".o_a_proj.weight") {
            let groups = |x: &Array| -> Result<Array> {
                let last = *x.shape().last().unwrap_or(&0);
                Ok(ops::reshape(x, &[a.o_groups, -1, last], None)?)
            };
            v = groups(&v)?;
            scale = scale.as_ref().map(groups).transpose()?;
        }
        if let Some(sc) = scale {
            let base = name.strip_suffix("weight").unwrap_or(&name);
            w.insert(format!("{base}scales"), sc);
        }
        w.insert(name, v);
    }
    for ((layer, proj), mut rows) in experts {
        if rows.len() != a.n_routed_experts as usize {
            return Err(ModelError::Weights(vec![format!(
                "layer {layer} has {} {proj} expert weights, but the config declares {} experts",
                rows.len(),
                a.n_routed_experts
            )]));
        }
        rows.sort_by_key(|(e, _, _)| *e);
        let name = format!("model.layers.{layer}.mlp.experts.switch_mlp.{proj}");
        let refs: Vec<&Array> = rows.iter().map(|(_, v, _)| v).collect();
        let value = ops::stack(&refs, 0, None)?;
        let scales: Vec<&Array> = rows.iter().filter_map(|(_, _, s)| s.as_ref()).collect();
        if scales.len() == rows.len() {
            let (value, sc) = repack(&value, &ops::stack(&scales, 0, None)?)?;
            w.insert(format!("{name}.scales"), sc);
            w.insert(format!("{name}.weight"), value);
        } else if scales.is_empty() {
            w.insert(format!("{name}.weight"), value);
        } else {
            return Err(ModelError::Weights(vec![format!(
                "layer {layer}: some {proj} experts have block scales and some not"
            )]));
        }
    }
    Ok(())
}

/// `_repack`: an fp8 or fp4 weight and its power-of-two (ue8m0) block scale in MLX's
/// microscaling layout: the weight's bytes as uint32 words, the scale as its biased exponent
/// (uint8), one per output row (fp8 keeps one per 32x32 tile: repeated over the rows).
fn repack(weight: &Array, scale: &Array) -> Result<(Array, Array)> {
    let mut scale = scale.clone();
    if scale.dtype() != Dtype::Uint8 {
        let e = ops::log2(&scale.astype(Dtype::Float32)?, None)?;
        scale = ops::add(&e, &Scalar::Int(127).to_array_like(e.dtype())?, None)?
            .astype(Dtype::Uint8)?;
    }
    let (ws, ss) = (weight.shape(), scale.shape());
    if ws.len() < 2 || ss.len() < 2 {
        return Err(ModelError::Weights(vec![format!(
            "deepseek_v41: a packed weight {ws:?} with scale {ss:?} (both need 2 or more axes)"
        )]));
    }
    let rows = ws[ws.len() - 2];
    if ss[ss.len() - 2] != rows {
        let r = ops::repeat(&scale, 32, -2, None)?;
        scale = ops::slice_axis(&r, -2, 0, rows, None)?;
    }
    if ws.last().copied().unwrap_or(0) * weight.dtype().size() as i32 % 4 != 0 {
        return Err(ModelError::Weights(vec![format!(
            "deepseek_v41: a packed weight {ws:?} whose rows are not whole 32-bit words"
        )]));
    }
    Ok((ops::view(weight, Dtype::Uint32, None)?, scale))
}

/// `_rename`: one published name to mlx-lm's.
fn rename(key: &str) -> String {
    match key {
        "head.weight" => return "lm_head.weight".into(),
        "embed.weight" => return "model.embed_tokens.weight".into(),
        _ => {}
    }
    let mut k = format!("model.{key}");
    for (from, to) in [
        (".attn.", ".self_attn."),
        (".ffn.", ".mlp."),
        (".attn_norm.", ".input_layernorm."),
        (".ffn_norm.", ".post_attention_layernorm."),
        (".hc_attn_", ".attn_hc."),
        (".hc_ffn_", ".ffn_hc."),
        (".attn_sink", ".sinks"),
        (".wq_a.", ".q_a_proj."),
        (".wq_b.", ".q_b_proj."),
        (".wkv.", ".kv_proj."),
        (".wgate.", ".gate_proj."),
        (".wo_a.", ".o_a_proj."),
        (".wo_b.", ".o_b_proj."),
        (".q_norm.", ".q_a_norm."),
        (".compressor.norm.", ".compressor.kv_norm."),
        (".indexer.wk.", ".indexer.k_proj."),
        (".gate.bias", ".gate.e_score_correction_bias"),
        (".shared_experts.w1.", ".shared_experts.gate_proj."),
        (".shared_experts.w2.", ".shared_experts.down_proj."),
        (".shared_experts.w3.", ".shared_experts.up_proj."),
    ] {
        k = k.replace(from, to);
    }
    k
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let a = model_args(config)?;
        sanitize(&a, w)?;
        let (d, eps) = (a.hidden_size, a.rms_norm_eps as f32);
        let layers = (0..a.num_hidden_layers as usize)
            .map(|i| {
                let p = format!("model.layers.{i}");
                Ok(Layer {
                    self_attn: Attention::load(&a, w, &format!("{p}.self_attn"), i)?,
                    mlp: Moe::load(&a, w, &format!("{p}.mlp"))?,
                    input_layernorm: RmsNorm::load(w, &format!("{p}.input_layernorm"), d, eps)?,
                    post_attention_layernorm: RmsNorm::load(
                        w,
                        &format!("{p}.post_attention_layernorm"),
                        d,
                        eps,
                    )?,
                    attn_hc: HyperConnection::load(&a, w, &format!("{p}.attn_hc"))?,
                    ffn_hc: HyperConnection::load(&a, w, &format!("{p}.ffn_hc"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Model {
            embed_tokens: Embedding::load(w, "model.embed_tokens", a.vocab_size, d)?,
            norm: RmsNorm::load(w, "model.norm", d, eps)?,
            lm_head: Linear::load(w, "lm_head", d, a.vocab_size, false)?,
            layers,
            args: a,
            pipeline: None,
        })
    }

    fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        kit::new_positions(inputs, caches.as_deref(), self.layers.len(), "layers")?;
        let mut own;
        let caches: &mut [Box<dyn Cache>] = match caches {
            Some(c) => c,
            None => {
                own = self.make_cache();
                &mut own
            }
        };
        let mut layer_caches = caches
            .iter_mut()
            .map(|c| {
                c.as_any_mut()
                    .downcast_mut::<LayerCache>()
                    .ok_or_else(|| ModelError::Cache {
                        what: "deepseek_v41".into(),
                        problem: "every layer needs its LayerCache (from make_cache)".into(),
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        let a = &self.args;
        let h = self.embed_tokens.forward(inputs)?;
        let s = h.shape();
        let (b, l) = (s[0], s[1]);
        let start_pos = layer_caches[0].offset as i64;
        let previous = layer_caches[0].window.as_ref().map_or(0, |w| w.shape()[1]);
        let window_idx = window_indices(previous, l, a.sliding_window)?;
        let mut wshape = vec![b];
        wshape.extend(window_idx.shape());
        let window_idx = ops::broadcast_to(&window_idx, &wshape, None)?;
        let mut streams = ops::broadcast_to(
            &ops::expand_dims(&h, &[2], None)?,
            &[b, l, a.hc_mult, a.hidden_size],
            None,
        )?;
        let pre_mix = ops::zeros(&[b, l, a.hc_mult], Dtype::Float32, None)?;
        let mut pre_mix = ops::slice_update(
            &pre_mix,
            &weak(1.0, &pre_mix)?,
            &[0, 0, 0],
            &[b, l, 1],
            &[1, 1, 1],
            None,
        )?;
        let mut shared = Shared::default();
        if let Some(st) = self.pipeline {
            if st.rank < st.size - 1 {
                let (s2, p2) =
                    self.receive(&streams, start_pos, st, layer_caches[0], &mut shared)?;
                streams = s2;
                pre_mix = p2;
            }
        }
        for (layer, cache) in self.layers.iter().zip(layer_caches.iter_mut()) {
            let (st, pm) = layer.forward(
                &streams,
                &pre_mix,
                start_pos,
                &window_idx,
                cache,
                &mut shared,
            )?;
            streams = st;
            pre_mix = pm;
        }
        let Some(st) = self.pipeline else {
            return self.norm.forward(&collapse(&streams, &pre_mix)?);
        };
        if st.rank > 0 {
            let sent = self.send(&streams, &pre_mix, start_pos, st, &shared)?;
            streams = ops::depends(&streams, &sent)?;
            pre_mix = ops::depends(&pre_mix, &sent)?;
            // Prefill only evaluates the cache, which must still send.
            if let Some(last) = layer_caches.last_mut() {
                if let Some(w) = &last.window {
                    last.window = Some(ops::depends(w, &sent)?);
                }
            }
        }
        let out = collapse(&streams, &pre_mix)?;
        // Rank 0 runs the last layers, and every rank needs its output.
        let out = crate::shard::gather_stage_output(out, st.size)?;
        self.norm.forward(&out)
    }

    /// `_receive`: the streams and `pre_mix` from the stage above, and the shared state it
    /// sends into `shared` (the growing parts appended to this stage's first cache).
    fn receive(
        &self,
        like: &Array,
        start_pos: i64,
        st: Stage,
        cache: &mut LayerCache,
        shared: &mut Shared,
    ) -> Result<(Array, Array)> {
        let a = &self.args;
        let s = like.shape();
        let parts_in = crossing(a, st.start);
        let lay = layout(a, &parts_in, s[0], s[1], start_pos, like.dtype())?;
        let size: i64 = lay.iter().map(|(_, sh, dt)| nbytes(sh, *dt)).sum();
        let packed =
            mlx_core::distributed::recv(&[size as i32], Dtype::Uint8, st.rank + 1, None, None)?;
        let mut parts = unpack(&packed, &lay)?.into_iter();
        let (streams, pre_mix) = match (parts.next(), parts.next()) {
            (Some(a), Some(b)) => (a, b),
            _ => {
                return Err(ModelError::Internal {
                    what: "deepseek_v41 pipeline".into(),
                    problem: "a message without its streams".into(),
                })
            }
        };
        for ((key, source), part) in parts_in.iter().zip(parts) {
            match key {
                SharedKey::CompressKv | SharedKey::IndexK => {
                    // The first layer never writes this field, so it keeps the entries of the
                    // source in the stage before.
                    let field = if *key == SharedKey::CompressKv {
                        &mut cache.compress_kv
                    } else {
                        &mut cache.index_k
                    };
                    if part.shape()[1] > 0 {
                        *field = Some(append(field.as_ref(), &part)?);
                    }
                    if *key == SharedKey::CompressKv {
                        shared.compress_kv = field.clone();
                    } else {
                        shared.index_k = field.clone();
                    }
                }
                SharedKey::Candidates => {
                    let keys = index_keys(a, *source, start_pos + i64::from(s[1]))?;
                    let mask = ops::repeat(&part, a.candidate_block_size, -1, None)?;
                    shared.candidates = if keys != 0 {
                        Some(ops::slice_axis(&mask, -1, 0, keys as i32, None)?)
                    } else {
                        None
                    };
                }
                SharedKey::TopkIdx => shared.topk_idx = Some(part),
            }
        }
        Ok((streams, pre_mix))
    }

    /// `_send`: the streams, `pre_mix` and the shared state the next stages read, packed and
    /// sent to the rank below.
    fn send(
        &self,
        streams: &Array,
        pre_mix: &Array,
        start_pos: i64,
        st: Stage,
        shared: &Shared,
    ) -> Result<Array> {
        let a = &self.args;
        let s = streams.shape();
        let out = crossing(a, st.end);
        let lay = layout(a, &out, s[0], s[1], start_pos, streams.dtype())?;
        let mut parts = Vec::with_capacity(lay.len());
        for (i, (key, shape, dtype)) in lay.iter().enumerate() {
            let state = match key {
                None if i == 0 => Some(streams.clone()),
                None => Some(pre_mix.clone()),
                Some(SharedKey::CompressKv) => shared.compress_kv.clone(),
                Some(SharedKey::IndexK) => shared.index_k.clone(),
                Some(SharedKey::Candidates) => shared.candidates.clone(),
                Some(SharedKey::TopkIdx) => shared.topk_idx.clone(),
            };
            let part = match (state, key) {
                // Not written yet, so the layout has no entries either.
                (None, _) => ops::zeros(shape, *dtype, None)?,
                (Some(p), Some(k)) if k.is_cache_field() => {
                    // It holds all entries so far; send only the new ones.
                    let n = p.shape()[1];
                    ops::slice_axis(&p, 1, n - shape[1], n, None)?
                }
                (Some(p), Some(SharedKey::Candidates)) => {
                    // `part[..., ::candidate_block_size]`.
                    let stop = p.shape();
                    let start = vec![0; stop.len()];
                    let mut strides = vec![1; stop.len()];
                    if let Some(step) = strides.last_mut() {
                        *step = a.candidate_block_size;
                    }
                    p.slice(&start, &stop, &strides)?
                }
                (Some(p), _) => p,
            };
            if &part.shape() != shape || part.dtype() != *dtype {
                return Err(ModelError::Parallel {
                    kind: crate::Parallelism::Pipeline,
                    what: format!("deepseek_v41 stage {}", st.rank),
                    problem: format!(
                        "the next pipeline stage expects {} as {:?} {:?}, not {:?} {:?}",
                        key.map_or("streams", SharedKey::name),
                        dtype,
                        shape,
                        part.dtype(),
                        part.shape()
                    ),
                });
            }
            parts.push(part);
        }
        Ok(mlx_core::distributed::send(
            &pack(&parts)?,
            st.rank - 1,
            None,
            None,
        )?)
    }

    /// Pipeline parallelism as `TextModel.pipeline` (`PipelineMixin`'s even split): this
    /// rank keeps its stage's layers; the streams, `pre_mix` and the shared compressed KV,
    /// index keys, candidates and top-k indices the later layers read cross each boundary
    /// packed in one message.
    pub fn shard_pipeline(&mut self, size: i32, rank: i32) -> Result<()> {
        crate::shard::check_pipeline("deepseek_v41", &["deepseek_v41"], self.pipeline.is_some())?;
        let range = crate::shard::pipeline_range(self.layers.len(), size, rank)?;
        let (start, end) = (range.start, range.end);
        crate::shard::keep_range(&mut self.layers, range);
        self.pipeline = Some(Stage {
            rank,
            size,
            start,
            end,
        });
        Ok(())
    }

    fn head(&self, h: &Array) -> Result<Array> {
        self.lm_head.forward(h)
    }

    /// Tensor parallelism as `Model.shard()`: every layer's attention
    /// ([`Attention::shard_tensor_parallel`]) and MoE block ([`Moe::shard_tensor_parallel`]),
    /// refused (the model left whole) unless the ranks divide the heads and the output groups.
    pub fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        crate::shard::check_tensor_rank(size, rank)?;
        if size == 1 {
            return Ok(());
        }
        if self.pipeline.is_some() {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: "the model".into(),
                problem: "already split into pipeline stages".into(),
            });
        }
        let (heads, groups) = (self.args.num_attention_heads, self.args.o_groups);
        if heads % size != 0 || groups % size != 0 {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: "model.layers.*.self_attn".into(),
                problem: format!(
                    "{size} ranks must divide the {heads} attention heads and the {groups} \
                     output groups"
                ),
            });
        }
        // Split copies (the arrays are shared) and keep them only when every layer splits.
        let mut layers = self.layers.clone();
        for (i, l) in layers.iter_mut().enumerate() {
            let p = format!("model.layers.{i}");
            l.self_attn
                .shard_tensor_parallel(size, rank, &format!("{p}.self_attn"))?;
            l.mlp
                .shard_tensor_parallel(size, rank, &format!("{p}.mlp"))?;
        }
        self.layers = layers;
        Ok(())
    }
}

impl LanguageModel for Model {
    kit::short_port_entry_points!(args, vocab_size);

    fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        Model::shard_tensor_parallel(self, size, rank)
    }

    fn shard_pipeline(&mut self, size: i32, rank: i32) -> Result<()> {
        Model::shard_pipeline(self, size, rank)
    }

    kit::layer_caches! {
        /// `make_cache`: a `LayerCache(sliding_window)` per layer.
        fn make_cache(&self) {
            let window = self.args.sliding_window.max(1) as usize;
            self.layers
                .iter()
                .map(|_| -> Box<dyn Cache> { Box::new(LayerCache::new(window)) })
                .collect()
        }
    }
}

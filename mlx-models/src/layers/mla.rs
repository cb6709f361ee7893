//! Multi-head latent attention (DeepSeek V3's MLA) as mlx-lm 0.32.2 writes it:
//! `models/mla.py` (`MultiLinear`, `QuantizedMultiLinear`) and the attention of
//! `models/deepseek_v3.py` (shared by kimi_k25 and glm4_moe_lite), op for op.
//!
//! The cache holds the normed latent `kv_latent` `(B, 1, S, kv_lora_rank)` as keys and the
//! roped `k_pe` `(B, 1, S, qk_rope_head_dim)` as values. The rope part of the scores enters
//! MLX's attention as an additive mask; a prompt (`L > 1`) expands the latent into per-head
//! keys and values (`embed_q` untransposed, `unembed_out`), a single token absorbs `embed_q`
//! into the query and `unembed_out` into the output instead.

use mlx_cache::{AttentionMask, Cache, Kv};
use mlx_core::prelude::*;
use mlx_core::quantized::{self, QuantMode};

use crate::error::{ModelError, Result};
use crate::layers::linear::quant_mode;
use crate::layers::{finfo_min, scaled_dot_product_attention, Linear, RmsNorm, Rope};
use crate::weights::Weights;

/// `MultiLinear` / `QuantizedMultiLinear`: one `(output, input)` matrix per head, stored as
/// `(num_heads, output_dims, input_dims)`.
#[derive(Clone, Debug)]
pub enum MultiLinear {
    Dense(Array),
    Quantized {
        weight: Array,
        scales: Array,
        biases: Option<Array>,
        group_size: i32,
        bits: i32,
        mode: QuantMode,
    },
}

impl MultiLinear {
    /// `<path>.weight` (and `.scales`, `.biases` when mlx-lm would load it quantized).
    pub fn load(
        w: &mut Weights,
        path: &str,
        input_dims: i32,
        output_dims: i32,
        num_heads: i32,
    ) -> Result<MultiLinear> {
        match w.quantization(path, input_dims)? {
            None => Ok(MultiLinear::Dense(w.take(
                &format!("{path}.weight"),
                &[num_heads, output_dims, input_dims],
            )?)),
            Some(q) => {
                let mode = quant_mode(&q.mode)?;
                if q.bits <= 0
                    || q.group_size <= 0
                    || (i64::from(input_dims) * i64::from(q.bits)) % 32 != 0
                    || input_dims % q.group_size != 0
                {
                    return Err(ModelError::Config(format!(
                        "{path}: {input_dims} columns cannot be packed with {} bits in groups \
                         of {}",
                        q.bits, q.group_size
                    )));
                }
                let packed = (i64::from(input_dims) * i64::from(q.bits) / 32) as i32;
                let groups = input_dims / q.group_size;
                let weight =
                    w.take(&format!("{path}.weight"), &[num_heads, output_dims, packed])?;
                let scales =
                    w.take(&format!("{path}.scales"), &[num_heads, output_dims, groups])?;
                let biases = if mode == QuantMode::Affine {
                    Some(w.take(&format!("{path}.biases"), &[num_heads, output_dims, groups])?)
                } else {
                    None
                };
                Ok(MultiLinear::Quantized {
                    weight,
                    scales,
                    biases,
                    group_size: q.group_size,
                    bits: q.bits,
                    mode,
                })
            }
        }
    }

    /// `x @ weight.swapaxes(-1, -2)` (`transpose`) or `x @ weight`; quantized:
    /// `quantized_matmul(x, ..., transpose=transpose)`.
    pub fn forward(&self, x: &Array, transpose: bool) -> Result<Array> {
        match self {
            MultiLinear::Dense(weight) => {
                let w = if transpose {
                    ops::swapaxes(weight, -1, -2, None)?
                } else {
                    weight.clone()
                };
                Ok(ops::matmul(x, &w, None)?)
            }
            MultiLinear::Quantized {
                weight,
                scales,
                biases,
                group_size,
                bits,
                mode,
            } => Ok(quantized::quantized_matmul(
                x,
                weight,
                scales,
                biases.as_ref(),
                transpose,
                *group_size,
                *bits,
                *mode,
                None,
            )?),
        }
    }
}

/// What an MLA attention block is made of.
#[derive(Clone, Debug)]
pub struct MlaSpec {
    pub hidden_size: i32,
    pub num_heads: i32,
    /// `None`: one `q_proj`; else `q_a_proj` -> `q_a_layernorm` -> `q_b_proj`.
    pub q_lora_rank: Option<i32>,
    pub kv_lora_rank: i32,
    pub qk_nope_head_dim: i32,
    pub qk_rope_head_dim: i32,
    pub v_head_dim: i32,
    pub attention_bias: bool,
    /// Epsilon of `q_a_layernorm` and `kv_a_layernorm` (deepseek_v3: 1e-6; glm4_moe_lite:
    /// `rms_norm_eps`).
    pub lora_norm_eps: f32,
    /// The softmax scale, `mscale` applied (a Python float in mlx-lm).
    pub scale: f32,
    pub rope: Rope,
    /// longcat_flash's `mla_scale_q_lora` / `mla_scale_kv_lora`: the queries (after the head
    /// split) and the normed latent times these.
    pub q_scale: Option<f32>,
    pub kv_scale: Option<f32>,
}

/// The latent projections out of the cache: deepseek_v3's absorbed `embed_q` / `unembed_out`,
/// or deepseek_v2's `kv_b_proj` (keys and values expanded before the cache).
#[derive(Clone)]
enum KvOut {
    Absorbed {
        embed_q: MultiLinear,
        unembed_out: MultiLinear,
    },
    Expanded {
        kv_b_proj: Linear,
    },
}

#[derive(Clone)]
enum QProj {
    Direct(Linear),
    Lora {
        q_a_proj: Linear,
        q_a_layernorm: RmsNorm,
        q_b_proj: Linear,
    },
}

/// deepseek_v3.py's `DeepseekV3Attention`.
#[derive(Clone)]
pub struct MlaAttention {
    num_heads: i32,
    q_head_dim: i32,
    qk_nope_head_dim: i32,
    qk_rope_head_dim: i32,
    kv_lora_rank: i32,
    scale: f32,
    q_scale: Option<f32>,
    kv_scale: Option<f32>,
    q: QProj,
    kv_a_proj_with_mqa: Linear,
    kv_a_layernorm: RmsNorm,
    kv_out: KvOut,
    o_proj: Linear,
    rope: Rope,
    /// kimi_linear's `mla_use_nope`: the rope part of the queries and keys is used unrotated.
    no_rope: bool,
}

impl MlaAttention {
    /// The block at `path` (`...self_attn`), its modules loaded in mlx-lm's declaration order;
    /// `expanded`: deepseek_v2's `kv_b_proj` instead of `embed_q` / `unembed_out`.
    pub fn load(expanded: bool, s: MlaSpec, w: &mut Weights, path: &str) -> Result<MlaAttention> {
        MlaAttention::load_named(expanded, s, w, path, "o_proj")
    }

    /// [`MlaAttention::load`] with the output projection under another name (bailing_moe_v3:
    /// `dense`).
    pub fn load_named(
        expanded: bool,
        s: MlaSpec,
        w: &mut Weights,
        path: &str,
        o_proj: &str,
    ) -> Result<MlaAttention> {
        let p = |n: &str| format!("{path}.{n}");
        let q_head_dim = s.qk_nope_head_dim + s.qk_rope_head_dim;
        let q = match s.q_lora_rank {
            None => QProj::Direct(Linear::load(
                w,
                &p("q_proj"),
                s.hidden_size,
                s.num_heads * q_head_dim,
                false,
            )?),
            Some(r) => QProj::Lora {
                q_a_proj: Linear::load(w, &p("q_a_proj"), s.hidden_size, r, s.attention_bias)?,
                q_a_layernorm: RmsNorm::load(w, &p("q_a_layernorm"), r, s.lora_norm_eps)?,
                q_b_proj: Linear::load(w, &p("q_b_proj"), r, s.num_heads * q_head_dim, false)?,
            },
        };
        Ok(MlaAttention {
            num_heads: s.num_heads,
            q_head_dim,
            qk_nope_head_dim: s.qk_nope_head_dim,
            qk_rope_head_dim: s.qk_rope_head_dim,
            kv_lora_rank: s.kv_lora_rank,
            scale: s.scale,
            q_scale: s.q_scale,
            kv_scale: s.kv_scale,
            q,
            kv_a_proj_with_mqa: Linear::load(
                w,
                &p("kv_a_proj_with_mqa"),
                s.hidden_size,
                s.kv_lora_rank + s.qk_rope_head_dim,
                s.attention_bias,
            )?,
            kv_a_layernorm: RmsNorm::load(
                w,
                &p("kv_a_layernorm"),
                s.kv_lora_rank,
                s.lora_norm_eps,
            )?,
            kv_out: if expanded {
                KvOut::Expanded {
                    kv_b_proj: Linear::load(
                        w,
                        &p("kv_b_proj"),
                        s.kv_lora_rank,
                        s.num_heads * (s.qk_nope_head_dim + s.v_head_dim),
                        false,
                    )?,
                }
            } else {
                KvOut::Absorbed {
                    embed_q: MultiLinear::load(
                        w,
                        &p("embed_q"),
                        s.qk_nope_head_dim,
                        s.kv_lora_rank,
                        s.num_heads,
                    )?,
                    unembed_out: MultiLinear::load(
                        w,
                        &p("unembed_out"),
                        s.kv_lora_rank,
                        s.v_head_dim,
                        s.num_heads,
                    )?,
                }
            },
            o_proj: Linear::load(
                w,
                &p(o_proj),
                s.num_heads * s.v_head_dim,
                s.hidden_size,
                s.attention_bias,
            )?,
            rope: s.rope,
            no_rope: false,
        })
    }

    /// The block without its rope (kimi_linear's MLA layers: `q_pe` and `k_pe` enter the
    /// scores as projected).
    pub fn without_rope(mut self) -> MlaAttention {
        self.no_rope = true;
        self
    }

    /// The output projection alone (`o_proj`, or the name given to
    /// [`MlaAttention::load_named`]).
    pub fn project_out(&self, x: &Array) -> Result<Array> {
        self.o_proj.forward(x)
    }

    /// The attention's heads (this rank's, once sharded).
    pub fn num_heads(&self) -> i32 {
        self.num_heads
    }

    /// Tensor parallelism as deepseek_v3's / deepseek_v2's `shard()` on `self_attn`: q_proj or
    /// q_b_proj (and v2's kv_b_proj) all-to-sharded, o_proj sharded-to-all, the heads divided
    /// by `n`, and rank `r`'s heads of `embed_q` / `unembed_out`.
    pub fn shard_tensor_parallel(&mut self, n: i32, r: i32, path: &str) -> Result<()> {
        use crate::shard::{all_to_sharded, sharded_to_all, take_heads};
        let p = |m: &str| format!("{path}.{m}");
        if n <= 0 || self.num_heads % n != 0 {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: path.to_string(),
                problem: format!("{} heads do not split over {n} ranks", self.num_heads),
            });
        }
        match &mut self.q {
            QProj::Direct(q) => all_to_sharded(q, n, r, &p("q_proj"))?,
            QProj::Lora { q_b_proj, .. } => all_to_sharded(q_b_proj, n, r, &p("q_b_proj"))?,
        }
        let heads = self.num_heads / n;
        match &mut self.kv_out {
            KvOut::Expanded { kv_b_proj } => all_to_sharded(kv_b_proj, n, r, &p("kv_b_proj"))?,
            KvOut::Absorbed {
                embed_q,
                unembed_out,
            } => {
                for (m, name) in [(embed_q, "embed_q"), (unembed_out, "unembed_out")] {
                    let what = p(name);
                    *m = match &*m {
                        MultiLinear::Dense(wt) => {
                            MultiLinear::Dense(take_heads(wt, heads, r, &what)?)
                        }
                        MultiLinear::Quantized {
                            weight,
                            scales,
                            biases,
                            group_size,
                            bits,
                            mode,
                        } => MultiLinear::Quantized {
                            weight: take_heads(weight, heads, r, &what)?,
                            scales: take_heads(scales, heads, r, &what)?,
                            biases: biases
                                .as_ref()
                                .map(|b| take_heads(b, heads, r, &what))
                                .transpose()?,
                            group_size: *group_size,
                            bits: *bits,
                            mode: *mode,
                        },
                    };
                }
            }
        }
        sharded_to_all(&mut self.o_proj, n, r, &p("o_proj"))?;
        self.num_heads = heads;
        Ok(())
    }

    /// `q` as `(B, heads, L, q_head_dim)`.
    fn queries(&self, x: &Array, b: i32, l: i32) -> Result<Array> {
        let q = match &self.q {
            QProj::Direct(q) => q.forward(x)?,
            QProj::Lora {
                q_a_proj,
                q_a_layernorm,
                q_b_proj,
            } => q_b_proj.forward(&q_a_layernorm.forward(&q_a_proj.forward(x)?)?)?,
        };
        Ok(ops::transpose(
            &ops::reshape(&q, &[b, l, self.num_heads, self.q_head_dim], None)?,
            &[0, 2, 1, 3],
            None,
        )?)
    }

    /// deepseek_v2.py's `DeepseekV2Attention`: keys `[k_nope, k_pe repeated per head]` and
    /// values from `kv_b_proj` go to the cache; `mask` as `create_attention_mask(h, cache)`.
    /// `kv_a_proj_with_mqa(x)` split into the normed latent `(B, L, kv_lora_rank)` and the
    /// rope keys `(B, 1, L, qk_rope_head_dim)`.
    fn compress_kv(&self, x: &Array, b: i32, l: i32) -> Result<(Array, Array)> {
        let compressed = self.kv_a_proj_with_mqa.forward(x)?;
        let parts = ops::split_at(&compressed, &[self.kv_lora_rank], -1, None)?;
        let k_pe = ops::transpose(
            &ops::reshape(&parts[1], &[b, l, 1, self.qk_rope_head_dim], None)?,
            &[0, 2, 1, 3],
            None,
        )?;
        Ok((self.kv_a_layernorm.forward(&parts[0])?, k_pe))
    }

    pub fn forward_expanded(
        &self,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        let KvOut::Expanded { kv_b_proj } = &self.kv_out else {
            return Err(ModelError::Unsupported {
                what: "MLA attention".into(),
                problem: "without kv_b_proj has no expanded form".into(),
            });
        };
        let sh = x.shape();
        let (b, l) = (sh[0], sh[1]);
        let q = self.queries(x, b, l)?;
        let qs = ops::split_at(&q, &[self.qk_nope_head_dim], -1, None)?;
        let (q_nope, q_pe) = (&qs[0], &qs[1]);
        let (kv_latent, k_pe) = self.compress_kv(x, b, l)?;
        let kv = kv_b_proj.forward(&kv_latent)?;
        let kv = ops::transpose(
            &ops::reshape(&kv, &[b, l, self.num_heads, -1], None)?,
            &[0, 2, 1, 3],
            None,
        )?;
        let kvs = ops::split_at(&kv, &[self.qk_nope_head_dim], -1, None)?;
        let (k_nope, values) = (&kvs[0], &kvs[1]);
        let offset = cache.as_ref().map_or(0, |c| c.offset());
        let q_pe = self.rope.forward(q_pe, offset)?;
        let k_pe = self.rope.forward(&k_pe, offset)?;
        let k_pe = ops::repeat(&k_pe, self.num_heads, 1, None)?;
        let keys = ops::concatenate(&[k_nope, &k_pe], -1, None)?;
        let kv = match cache {
            Some(c) => c.update_and_fetch(&keys, values)?,
            None => Kv::Dense {
                keys,
                values: values.clone(),
            },
        };
        let queries = ops::concatenate(&[q_nope, &q_pe], -1, None)?;
        let out = scaled_dot_product_attention(&queries, &kv, self.scale, mask, None)?;
        self.o_proj.forward(&join_heads(&out, b, l)?)
    }

    /// mistral4.py's `Mistral4Attention`: the absorbed latent cache of deepseek_v3, both query
    /// halves times Llama 4's `attn_scale` after the rope; one token attends to the latent
    /// with the rope scores as its mask, a prompt to keys `[embed_q(latent), k_rope]` with
    /// `mask` (`create_attention_mask(h, cache)`).
    pub fn forward_mistral4(
        &self,
        x: &Array,
        attn_scale: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        let KvOut::Absorbed {
            embed_q,
            unembed_out,
        } = &self.kv_out
        else {
            return Err(ModelError::Unsupported {
                what: "mistral4 attention".into(),
                problem: "needs embed_q and unembed_out".into(),
            });
        };
        let sh = x.shape();
        let (b, l) = (sh[0], sh[1]);
        let q = self.queries(x, b, l)?;
        let qs = ops::split_at(&q, &[self.qk_nope_head_dim], -1, None)?;
        let (kv_latent, k_rope) = self.compress_kv(x, b, l)?;
        let kv_latent = ops::expand_dims(&kv_latent, &[1], None)?;
        let offset = cache.as_ref().map_or(0, |c| c.offset());
        let q_rope = self.rope.forward(&qs[1], offset)?;
        let k_rope = self.rope.forward(&k_rope, offset)?;
        let q_nope = (&qs[0] * attn_scale)?;
        let q_rope = (&q_rope * attn_scale)?;
        let (kv_latent, k_rope) = cached_latent(cache, kv_latent, k_rope)?;
        let out = if l == 1 {
            let mask_arr = match mask {
                AttentionMask::Array(m) => Some(m),
                _ => None,
            };
            absorbed(
                (embed_q, unembed_out),
                &q_nope,
                &q_rope,
                kv_latent,
                &k_rope,
                mask_arr,
                self.scale,
            )?
        } else {
            let k_nope = embed_q.forward(&kv_latent, false)?;
            let v = unembed_out.forward(&kv_latent, true)?;
            let s_len = k_rope.shape()[2];
            let k_rope = ops::broadcast_to(
                &k_rope,
                &[b, self.num_heads, s_len, self.qk_rope_head_dim],
                None,
            )?;
            scaled_dot_product_attention(
                &ops::concatenate(&[&q_nope, &q_rope], -1, None)?,
                &Kv::Dense {
                    keys: ops::concatenate(&[&k_nope, &k_rope], -1, None)?,
                    values: v,
                },
                self.scale,
                mask,
                None,
            )?
        };
        self.o_proj.forward(&join_heads(&out, b, l)?)
    }

    /// `x` `(B, L, hidden)`; `mask` as `create_attention_mask(h, cache, return_array=True)`
    /// gives it (a boolean array, or none for one token).
    pub fn forward(
        &self,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        if matches!(self.kv_out, KvOut::Expanded { .. }) {
            return self.forward_expanded(x, mask, cache);
        }
        self.o_proj.forward(&self.attend(x, mask, cache)?)
    }

    /// The absorbed attention of [`MlaAttention::forward`] up to the output projection: the
    /// heads joined, `(B, L, heads * v_head_dim)`.
    pub fn attend(
        &self,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        let KvOut::Absorbed {
            embed_q,
            unembed_out,
        } = &self.kv_out
        else {
            return Err(ModelError::Internal {
                what: "MLA attention".into(),
                problem: "with kv_b_proj it has no absorbed form".into(),
            });
        };
        let sh = x.shape();
        let (b, l) = (sh[0], sh[1]);
        let mut q = self.queries(x, b, l)?;
        if let Some(sc) = self.q_scale {
            q = ops::multiply_scalar(&q, sc, None)?;
        }
        let qs = ops::split_at(&q, &[self.qk_nope_head_dim], -1, None)?;
        let (q_nope, q_pe) = (&qs[0], &qs[1]);
        let (mut kv_latent, k_pe) = self.compress_kv(x, b, l)?;
        if let Some(sc) = self.kv_scale {
            kv_latent = ops::multiply_scalar(&kv_latent, sc, None)?;
        }
        let offset = cache.as_ref().map_or(0, |c| c.offset());
        let (q_pe, k_pe) = if self.no_rope {
            (q_pe.clone(), k_pe)
        } else {
            (
                self.rope.forward(q_pe, offset)?,
                self.rope.forward(&k_pe, offset)?,
            )
        };
        let kv_latent = ops::expand_dims(&kv_latent, &[1], None)?;
        let (kv_latent, k_pe) = cached_latent(cache, kv_latent, k_pe)?;
        let mask = match mask {
            AttentionMask::Causal => mlx_cache::mask::fallback_mask(l as usize, None, true)?,
            m => m.clone(),
        };
        let mask_arr = match &mask {
            AttentionMask::Array(m) => Some(m),
            _ => None,
        };
        let out = absorbed(
            (embed_q, unembed_out),
            q_nope,
            &q_pe,
            kv_latent,
            &k_pe,
            mask_arr,
            self.scale,
        )?;
        Ok(join_heads(&out, b, l)?)
    }
}

/// The layer's KV cache updated with the new latent and rope keys, and its whole contents
/// (the inputs themselves without a cache); a quantized cache is refused.
fn cached_latent(
    cache: Option<&mut Box<dyn Cache>>,
    kv_latent: Array,
    k_pe: Array,
) -> Result<(Array, Array)> {
    match cache {
        Some(c) => match c.update_and_fetch(&kv_latent, &k_pe)? {
            Kv::Dense { keys, values } => Ok((keys, values)),
            Kv::Quantized { .. } => Err(ModelError::Cache {
                what: "MLA attention".into(),
                problem: "does not support a quantized KV cache (--kv-bits)".into(),
            }),
        },
        None => Ok((kv_latent, k_pe)),
    }
}

/// deepseek_v3.py's absorbed attention once queries, latent and rope keys are ready: the rope
/// scores `(q_pe * scale) @ k_pe^T` filled with the dtype's minimum where `mask` is false, as
/// the additive mask of attention over the latent (one token: the queries through `embed_q`,
/// the output through `unembed_out`; a prompt: keys and values expanded from the latent).
/// `(B, heads, L, v_head_dim)`.
fn absorbed(
    (embed_q, unembed_out): (&MultiLinear, &MultiLinear),
    q_nope: &Array,
    q_pe: &Array,
    kv_latent: Array,
    k_pe: &Array,
    mask: Option<&Array>,
    scale: f32,
) -> Result<Array> {
    let l = q_nope.shape()[2];
    let mut pe_scores = ops::matmul(
        &ops::multiply_scalar(q_pe, scale, None)?,
        &ops::swapaxes(k_pe, -1, -2, None)?,
        None,
    )?;
    if let Some(m) = mask {
        let dt = pe_scores.dtype();
        let min = Scalar::Float(finfo_min(dt)).to_array_like(dt)?;
        pe_scores = ops::where_(m, &pe_scores, &min, None)?;
    }
    let (q_nope, k, v) = if l == 1 {
        (embed_q.forward(q_nope, true)?, kv_latent.clone(), kv_latent)
    } else {
        (
            q_nope.clone(),
            embed_q.forward(&kv_latent, false)?,
            unembed_out.forward(&kv_latent, true)?,
        )
    };
    let mut out = scaled_dot_product_attention(
        &q_nope,
        &Kv::Dense { keys: k, values: v },
        scale,
        &AttentionMask::Array(pe_scores),
        None,
    )?;
    if l == 1 {
        out = unembed_out.forward(&out, true)?;
    }
    Ok(out)
}

/// `(B, heads, L, D)` -> `(B, L, heads * D)`.
fn join_heads(out: &Array, b: i32, l: i32) -> mlx_core::Result<Array> {
    ops::reshape(
        &ops::transpose(out, &[0, 2, 1, 3], None)?,
        &[b, l, -1],
        None,
    )
}

/// deepseek_v32.py's `Indexer` (DeepSeek Sparse Attention): scores every cached position per
/// query with its own small heads, and names the `index_topk` best once more than that many
/// positions are cached. Its keys live in a second cache of the layer.
#[derive(Clone)]
pub struct Indexer {
    n_heads: i32,
    head_dim: i32,
    index_topk: i32,
    softmax_scale: f64,
    wq_b: Linear,
    wk: Linear,
    k_norm: crate::layers::LayerNorm,
    weights_proj: Linear,
    rope: Rope,
}

/// What an [`Indexer`] is made of.
#[derive(Clone, Debug)]
pub struct IndexerSpec {
    pub hidden_size: i32,
    pub q_lora_rank: i32,
    pub n_heads: i32,
    pub head_dim: i32,
    pub index_topk: i32,
    pub rope: Rope,
}

impl Indexer {
    pub fn load(s: IndexerSpec, w: &mut Weights, path: &str) -> Result<Indexer> {
        let p = |n: &str| format!("{path}.{n}");
        Ok(Indexer {
            n_heads: s.n_heads,
            head_dim: s.head_dim,
            index_topk: s.index_topk,
            softmax_scale: f64::from(s.head_dim).powf(-0.5),
            wq_b: Linear::load(w, &p("wq_b"), s.q_lora_rank, s.n_heads * s.head_dim, false)?,
            wk: Linear::load(w, &p("wk"), s.hidden_size, s.head_dim, false)?,
            k_norm: crate::layers::LayerNorm::load(w, &p("k_norm"), s.head_dim, 1e-5, true, true)?,
            weights_proj: Linear::load(w, &p("weights_proj"), s.hidden_size, s.n_heads, false)?,
            rope: s.rope,
        })
    }

    /// The top-k positions `(B, 1, L, index_topk)`, or `None` while at most `index_topk`
    /// positions are cached.
    fn forward(
        &self,
        x: &Array,
        qr: &Array,
        mask: Option<&Array>,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Option<Array>> {
        let sh = x.shape();
        let (b, s) = (sh[0], sh[1]);
        let q = self.wq_b.forward(qr)?;
        let q = ops::swapaxes(
            &ops::reshape(&q, &[b, s, self.n_heads, self.head_dim], None)?,
            1,
            2,
            None,
        )?;
        let k = self.k_norm.forward(&self.wk.forward(x)?)?;
        let k = ops::reshape(&k, &[b, 1, s, self.head_dim], None)?;
        let offset = cache.as_ref().map_or(0, |c| c.offset());
        let q = self.rope.forward(&q, offset)?;
        let mut k = self.rope.forward(&k, offset)?;
        if let Some(c) = cache {
            k = match c.update_and_fetch(&k, &k)? {
                Kv::Dense { keys, .. } => keys,
                Kv::Quantized { .. } => {
                    return Err(ModelError::Cache {
                        what: "the sparse-attention indexer".into(),
                        problem: "does not support a quantized cache".into(),
                    })
                }
            };
        }
        if k.shape()[2] <= self.index_topk {
            return Ok(None);
        }
        let scores = ops::matmul(&q, &ops::swapaxes(&k, -1, -2, None)?, None)?;
        let scores = ops::maximum(
            &scores,
            &Scalar::Int(0).to_array_like(scores.dtype())?,
            None,
        )?;
        let factor = f64::from(self.n_heads).powf(-0.5) * self.softmax_scale;
        let weights = ops::multiply_scalar(&self.weights_proj.forward(x)?, factor as f32, None)?;
        let weights = ops::expand_dims(&ops::swapaxes(&weights, -1, -2, None)?, &[-1], None)?;
        let scores = (&scores * &weights)?;
        let mut scores = if s > 1 {
            // Python's `sum(scores[:, h : h + 1] for h in ...)`: `0 +` the first, then in order.
            let head = |h: i32| ops::slice_axis(&scores, 1, h, h + 1, None);
            let mut acc = ops::scalar_add(0i32, &head(0)?, None)?;
            for h in 1..self.n_heads {
                acc = (&acc + &head(h)?)?;
            }
            acc
        } else {
            ops::sum(&scores, &[1], true, None)?
        };
        if let Some(m) = mask {
            let inf = Scalar::Float(f32::NEG_INFINITY).to_array_like(scores.dtype())?;
            scores = ops::where_(m, &scores, &inf, None)?;
        }
        let n = scores.shape().last().copied().unwrap_or(0);
        let k = self.index_topk;
        Ok(Some(ops::slice_axis(
            &ops::argpartition(&scores, -k, -1, None)?,
            -1,
            n - k,
            n,
            None,
        )?))
    }
}

impl MlaAttention {
    /// deepseek_v32.py's `DeepseekV32Attention`: deepseek_v3's absorbed attention over the
    /// `index_topk` positions the [`Indexer`] picks (a sparse mask for a prompt, the gathered
    /// latent for one token). `caches` is the layer's pair (attention, indexer).
    pub fn forward_sparse(
        &self,
        indexer: &Indexer,
        x: &Array,
        mask: &AttentionMask,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        let KvOut::Absorbed {
            embed_q,
            unembed_out,
        } = &self.kv_out
        else {
            return Err(ModelError::Unsupported {
                what: "sparse MLA attention".into(),
                problem: "needs embed_q and unembed_out".into(),
            });
        };
        let QProj::Lora {
            q_a_proj,
            q_a_layernorm,
            q_b_proj,
        } = &self.q
        else {
            return Err(ModelError::Unsupported {
                what: "sparse MLA attention".into(),
                problem: "needs q_a_proj / q_b_proj".into(),
            });
        };
        let sh = x.shape();
        let (b, l) = (sh[0], sh[1]);
        let qr = q_a_layernorm.forward(&q_a_proj.forward(x)?)?;
        let q = q_b_proj.forward(&qr)?;
        let q = ops::transpose(
            &ops::reshape(&q, &[b, l, self.num_heads, self.q_head_dim], None)?,
            &[0, 2, 1, 3],
            None,
        )?;
        let qs = ops::split_at(&q, &[self.qk_nope_head_dim], -1, None)?;
        let (q_nope, q_pe) = (&qs[0], &qs[1]);
        let (kv_latent, k_pe) = self.compress_kv(x, b, l)?;
        let mut caches = caches;
        let offset = caches
            .as_deref()
            .and_then(|c| c.first())
            .map_or(0, |c| c.offset());
        let q_pe = self.rope.forward(q_pe, offset)?;
        let k_pe = self.rope.forward(&k_pe, offset)?;
        let kv_latent = ops::expand_dims(&kv_latent, &[1], None)?;
        let (mut kv_latent, mut k_pe) = cached_latent(
            caches.as_deref_mut().and_then(|c| c.first_mut()),
            kv_latent,
            k_pe,
        )?;
        let mask = match mask {
            AttentionMask::Causal => mlx_cache::mask::fallback_mask(l as usize, None, true)?,
            m => m.clone(),
        };
        let mut mask_arr = match &mask {
            AttentionMask::Array(m) => Some(m.clone()),
            _ => None,
        };
        let index_cache = caches.and_then(|c| c.get_mut(1));
        if let Some(topk) = indexer.forward(x, &qr, mask_arr.as_ref(), index_cache)? {
            let topk = ops::stop_gradient(&topk, None)?;
            if l == 1 {
                // `topk_indices[:, :, 0, :, None]`
                let idx = ops::expand_dims(&ops::squeeze(&topk, &[2], None)?, &[-1], None)?;
                let gather = |a: &Array| -> Result<Array> {
                    let mut shape = idx.shape();
                    let last = shape.len() - 1;
                    shape[last] = a.shape().last().copied().unwrap_or(0);
                    Ok(ops::take_along_axis(
                        a,
                        &ops::broadcast_to(&idx, &shape, None)?,
                        2,
                        None,
                    )?)
                };
                kv_latent = gather(&kv_latent)?;
                k_pe = gather(&k_pe)?;
                if let Some(m) = &mask_arr {
                    mask_arr = Some(ops::take_along_axis(m, &topk, -1, None)?);
                }
            } else {
                let mut shape = topk.shape();
                let last = shape.len() - 1;
                shape[last] = kv_latent.shape()[2];
                let sparse = ops::zeros(&shape, Dtype::Bool, None)?;
                let sparse = ops::put_along_axis(&sparse, &topk, &Array::scalar(true)?, -1, None)?;
                mask_arr = Some(match &mask_arr {
                    Some(m) => ops::logical_and(&sparse, m, None)?,
                    None => sparse,
                });
            }
        }
        let out = absorbed(
            (embed_q, unembed_out),
            q_nope,
            &q_pe,
            kv_latent,
            &k_pe,
            mask_arr.as_ref(),
            self.scale,
        )?;
        self.o_proj.forward(&join_heads(&out, b, l)?)
    }
}

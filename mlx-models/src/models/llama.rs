//! mlx-lm 0.32.2 `models/llama.py`: Llama 2/3.x, Mistral, SmolLM/SmolLM2, MiniCPM5 and the
//! other `MODEL_REMAPPING` aliases.

use mlx_cache::{AttentionMask, Cache, KVCache, RotatingKVCache};
use mlx_core::prelude::*;
use serde::Deserialize;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::{
    scaled_dot_product_attention, swiglu, Embedding, Linear, RmsNorm, Rope, RopeScaling,
};
use crate::models::LanguageModel;
use crate::weights::Weights;

fn default_rope_theta() -> f64 {
    10000.0
}
fn default_true() -> bool {
    true
}

/// `ModelArgs` of llama.py; unknown keys are ignored, defaults as in mlx-lm.
#[derive(Clone, Debug, Deserialize)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    #[serde(default)]
    pub head_dim: Option<i32>,
    #[serde(default)]
    pub max_position_embeddings: Option<i64>,
    #[serde(default)]
    pub num_key_value_heads: Option<i32>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub sliding_window: Option<usize>,
}

impl ModelArgs {
    /// `__post_init__`: kv heads default to the attention heads, layer types to full.
    fn post_init(mut self) -> Result<Self> {
        if self.num_key_value_heads.is_none() {
            self.num_key_value_heads = Some(self.num_attention_heads);
        }
        if self.layer_types.is_none() {
            self.layer_types = Some(vec![
                "full_attention".into();
                self.num_hidden_layers.max(0) as usize
            ]);
        }
        if self.vocab_size <= 0 || self.hidden_size <= 0 || self.num_attention_heads <= 0 {
            return Err(ModelError::Config(
                "vocab_size, hidden_size and num_attention_heads must be positive".into(),
            ));
        }
        if self.hidden_size % self.num_attention_heads != 0 && self.head_dim.is_none() {
            return Err(ModelError::Config(
                "hidden_size must divide by num_attention_heads (or give head_dim)".into(),
            ));
        }
        let kv = self.num_key_value_heads.unwrap_or(1);
        if kv <= 0 || self.num_attention_heads % kv != 0 {
            return Err(ModelError::Config(format!(
                "num_attention_heads {} must be a multiple of num_key_value_heads {kv}",
                self.num_attention_heads
            )));
        }
        Ok(self)
    }
}

pub struct Attention {
    n_heads: i32,
    n_kv_heads: i32,
    scale: f32,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    rope: Rope,
}

impl Attention {
    fn load(args: &ModelArgs, w: &mut Weights, path: &str) -> Result<Attention> {
        let dim = args.hidden_size;
        let n_heads = args.num_attention_heads;
        let n_kv_heads = args.num_key_value_heads.unwrap_or(n_heads);
        let head_dim = args.head_dim.unwrap_or(args.hidden_size / n_heads);
        let bias = args.attention_bias;
        Ok(Attention {
            n_heads,
            n_kv_heads,
            scale: (f64::from(head_dim)).powf(-0.5) as f32,
            q_proj: Linear::load(w, &format!("{path}.q_proj"), dim, n_heads * head_dim, bias)?,
            k_proj: Linear::load(
                w,
                &format!("{path}.k_proj"),
                dim,
                n_kv_heads * head_dim,
                bias,
            )?,
            v_proj: Linear::load(
                w,
                &format!("{path}.v_proj"),
                dim,
                n_kv_heads * head_dim,
                bias,
            )?,
            o_proj: Linear::load(w, &format!("{path}.o_proj"), n_heads * head_dim, dim, bias)?,
            rope: Rope::initialize(
                head_dim,
                args.rope_theta,
                args.rope_traditional,
                args.rope_scaling.as_ref(),
                args.max_position_embeddings,
            )?,
        })
    }

    fn forward(
        &self,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        let s = x.shape();
        let (b, l) = (s[0], s[1]);
        let heads = |y: Array, n: i32| -> Result<Array> {
            Ok(ops::transpose(
                &ops::reshape(&y, &[b, l, n, -1], None)?,
                &[0, 2, 1, 3],
                None,
            )?)
        };
        let queries = heads(self.q_proj.forward(x)?, self.n_heads)?;
        let keys = heads(self.k_proj.forward(x)?, self.n_kv_heads)?;
        let values = heads(self.v_proj.forward(x)?, self.n_kv_heads)?;
        let (queries, kv) = match cache {
            Some(c) => {
                let (q, k) = match c.offsets() {
                    Some(offsets) => (
                        self.rope.forward_offsets(&queries, &offsets)?,
                        self.rope.forward_offsets(&keys, &offsets)?,
                    ),
                    None => {
                        let offset = c.offset();
                        (
                            self.rope.forward(&queries, offset)?,
                            self.rope.forward(&keys, offset)?,
                        )
                    }
                };
                (q, c.update_and_fetch(&k, &values)?)
            }
            None => {
                let q = self.rope.forward(&queries, 0)?;
                let k = self.rope.forward(&keys, 0)?;
                (q, mlx_cache::Kv::Dense { keys: k, values })
            }
        };
        let out = scaled_dot_product_attention(&queries, &kv, self.scale, mask, None)?;
        let out = ops::reshape(
            &ops::transpose(&out, &[0, 2, 1, 3], None)?,
            &[b, l, -1],
            None,
        )?;
        self.o_proj.forward(&out)
    }
}

pub struct Mlp {
    gate_proj: Linear,
    down_proj: Linear,
    up_proj: Linear,
}

impl Mlp {
    fn load(args: &ModelArgs, w: &mut Weights, path: &str) -> Result<Mlp> {
        let (dim, hidden, bias) = (args.hidden_size, args.intermediate_size, args.mlp_bias);
        Ok(Mlp {
            gate_proj: Linear::load(w, &format!("{path}.gate_proj"), dim, hidden, bias)?,
            down_proj: Linear::load(w, &format!("{path}.down_proj"), hidden, dim, bias)?,
            up_proj: Linear::load(w, &format!("{path}.up_proj"), dim, hidden, bias)?,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        self.down_proj.forward(&swiglu(
            &self.gate_proj.forward(x)?,
            &self.up_proj.forward(x)?,
        )?)
    }
}

pub struct TransformerBlock {
    use_sliding: bool,
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

impl TransformerBlock {
    fn forward(
        &self,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        let r = self
            .self_attn
            .forward(&self.input_layernorm.forward(x)?, mask, cache)?;
        let h = (x + &r)?;
        let r = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&h)?)?;
        Ok((&h + &r)?)
    }
}

/// `Model` of llama.py (`model.*` submodules plus an optional `lm_head`).
pub struct Model {
    args: ModelArgs,
    embed_tokens: Embedding,
    layers: Vec<TransformerBlock>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    fa_idx: usize,
    swa_idx: Option<usize>,
}

impl Model {
    /// Builds the model, taking its tensors from `w` (after llama.py's `sanitize`).
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let args: ModelArgs = config.args::<ModelArgs>()?.post_init()?;
        Self::sanitize(&args, w);
        let eps = args.rms_norm_eps as f32;
        let embed_tokens =
            Embedding::load(w, "model.embed_tokens", args.vocab_size, args.hidden_size)?;
        let layer_types = args.layer_types.clone().unwrap_or_default();
        if layer_types.len() != args.num_hidden_layers as usize {
            return Err(ModelError::Config(format!(
                "layer_types has {} entries for {} layers",
                layer_types.len(),
                args.num_hidden_layers
            )));
        }
        let mut layers = Vec::with_capacity(layer_types.len());
        for (i, t) in layer_types.iter().enumerate() {
            let p = format!("model.layers.{i}");
            layers.push(TransformerBlock {
                use_sliding: t == "sliding_attention",
                self_attn: Attention::load(&args, w, &format!("{p}.self_attn"))?,
                mlp: Mlp::load(&args, w, &format!("{p}.mlp"))?,
                input_layernorm: RmsNorm::load(
                    w,
                    &format!("{p}.input_layernorm"),
                    args.hidden_size,
                    eps,
                )?,
                post_attention_layernorm: RmsNorm::load(
                    w,
                    &format!("{p}.post_attention_layernorm"),
                    args.hidden_size,
                    eps,
                )?,
            });
        }
        let norm = RmsNorm::load(w, "model.norm", args.hidden_size, eps)?;
        let lm_head = if args.tie_word_embeddings {
            None
        } else {
            Some(Linear::load(
                w,
                "lm_head",
                args.hidden_size,
                args.vocab_size,
                false,
            )?)
        };
        let fa_idx = layer_types
            .iter()
            .position(|t| t == "full_attention")
            .ok_or_else(|| ModelError::Config("layer_types has no full_attention layer".into()))?;
        let swa_idx = layers.iter().position(|l| l.use_sliding);
        if swa_idx.is_some() && args.sliding_window.is_none() {
            return Err(ModelError::Config(
                "sliding_attention layers need sliding_window".into(),
            ));
        }
        Ok(Model {
            args,
            embed_tokens,
            layers,
            norm,
            lm_head,
            fa_idx,
            swa_idx,
        })
    }

    /// llama.py `sanitize`: drop precomputed rotary tables, and `lm_head` when tied.
    fn sanitize(args: &ModelArgs, w: &mut Weights) {
        for i in 0..args.num_hidden_layers {
            w.discard(&format!("model.layers.{i}.self_attn.rotary_emb.inv_freq"));
        }
        if args.tie_word_embeddings {
            for suffix in ["weight", "scales", "biases"] {
                w.discard(&format!("lm_head.{suffix}"));
            }
        }
    }

    pub fn args(&self) -> &ModelArgs {
        &self.args
    }
}

impl LanguageModel for Model {
    fn forward(&self, inputs: &Array, caches: Option<&mut [Box<dyn Cache>]>) -> Result<Array> {
        let mut h = self.embed_tokens.forward(inputs)?;
        let n = h.shape().get(1).copied().unwrap_or(0) as usize;
        let out = match caches {
            Some(caches) => {
                if caches.len() != self.layers.len() {
                    return Err(ModelError::Other(format!(
                        "{} caches for {} layers",
                        caches.len(),
                        self.layers.len()
                    )));
                }
                let fa_mask = caches[self.fa_idx].make_mask(n, None, false)?;
                let swa_mask = match self.swa_idx {
                    Some(i) => Some(caches[i].make_mask(n, self.args.sliding_window, false)?),
                    None => None,
                };
                for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
                    let mask = if layer.use_sliding {
                        swa_mask.as_ref().unwrap_or(&fa_mask)
                    } else {
                        &fa_mask
                    };
                    h = layer.forward(&h, mask, Some(cache))?;
                }
                h
            }
            None => {
                let fa_mask = no_cache_mask(n, None)?;
                let swa_mask = no_cache_mask(n, self.args.sliding_window)?;
                for layer in &self.layers {
                    let mask = if layer.use_sliding {
                        &swa_mask
                    } else {
                        &fa_mask
                    };
                    h = layer.forward(&h, mask, None)?;
                }
                h
            }
        };
        let out = self.norm.forward(&out)?;
        match &self.lm_head {
            Some(head) => head.forward(&out),
            None => self.embed_tokens.as_linear(&out),
        }
    }

    fn make_cache(&self) -> Vec<Box<dyn Cache>> {
        self.layers
            .iter()
            .map(|l| -> Box<dyn Cache> {
                match (l.use_sliding, self.args.sliding_window) {
                    (true, Some(w)) => match RotatingKVCache::new(w, 0) {
                        Ok(c) => Box::new(c),
                        Err(_) => Box::new(KVCache::new()),
                    },
                    _ => Box::new(KVCache::new()),
                }
            })
            .collect()
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn model_type(&self) -> &str {
        &self.args.model_type
    }

    fn vocab_size(&self) -> i32 {
        self.args.vocab_size
    }
}

/// `base.create_attention_mask(h, None, window_size)`.
fn no_cache_mask(n: usize, window: Option<usize>) -> Result<AttentionMask> {
    Ok(mlx_cache::mask::fallback_mask(n, window, false)?)
}

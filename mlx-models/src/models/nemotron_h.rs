//! mlx-lm 0.32.2 `models/nemotron_h.py`: a stack of `x + mixer(norm(x))` blocks, each a
//! Mamba 2 mixer (`M`, grouped gated norm), attention without positional encoding (`*`) or a
//! squared-ReLU MLP (`-`), as `hybrid_override_pattern` (or `layers_block_type`) lists them.
//! Only `M` and `*` blocks have caches (an [`ArraysCache`] of two slots, a [`KVCache`]). The
//! mixture-of-experts block (`E`) is not ported yet: a config with one is refused by name.

use mlx_cache::{AttentionMask, Cache, KVCache};
use mlx_core::prelude::*;
use serde::Deserialize;
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::ssm::{arrays_cache, GatedNorm, Mamba2Dims, Mamba2Mixer};
use crate::layers::{relu2, Embedding, Linear, RmsNorm};
use crate::models::mamba::{conv_kernel_ok, positive, sanitize};
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

/// nemotron_h.py `ModelArgs` (the fields this port reads).
#[derive(Clone, Debug, Deserialize)]
struct ModelArgs {
    model_type: String,
    vocab_size: i32,
    hidden_size: i32,
    intermediate_size: i32,
    num_attention_heads: i32,
    num_key_value_heads: i32,
    attention_bias: bool,
    mamba_num_heads: i32,
    mamba_head_dim: i32,
    mamba_proj_bias: bool,
    ssm_state_size: i32,
    conv_kernel: i32,
    n_groups: i32,
    mlp_bias: bool,
    layer_norm_epsilon: f64,
    use_conv_bias: bool,
    #[serde(default)]
    hybrid_override_pattern: Option<Value>,
    #[serde(default)]
    layers_block_type: Option<Vec<String>>,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
    #[serde(default)]
    head_dim: Option<i32>,
    #[serde(default)]
    time_step_limit: Option<(f64, f64)>,
}

impl ModelArgs {
    /// `__post_init__`: the block pattern as one character per layer, plus the checks that
    /// keep MLX from seeing bad shapes.
    fn pattern(&self) -> Result<Vec<char>> {
        let bad = |m: String| ModelError::Config(format!("nemotron_h: {m}"));
        let pattern: Vec<char> = match &self.hybrid_override_pattern {
            Some(Value::String(s)) => s.chars().collect(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .and_then(|s| {
                            let mut c = s.chars();
                            c.next().filter(|_| c.next().is_none())
                        })
                        .ok_or_else(|| {
                            bad(format!(
                                "`hybrid_override_pattern` entries must be one character, got {v}"
                            ))
                        })
                })
                .collect::<Result<_>>()?,
            Some(v) => {
                return Err(bad(format!(
                    "`hybrid_override_pattern` must be a string or a list, got {v}"
                )))
            }
            None => {
                let types = self
                    .layers_block_type
                    .as_ref()
                    .or(self.layer_types.as_ref())
                    .ok_or_else(|| {
                        bad("the config must have layers_block_type or \
                             hybrid_override_pattern to describe the layer stack"
                            .into())
                    })?;
                types
                    .iter()
                    .map(|t| match t.as_str() {
                        "full_attention" | "attention" => Ok('*'),
                        "linear_attention" | "mamba" | "conv" => Ok('M'),
                        "moe" => Ok('E'),
                        "mlp" => Ok('-'),
                        other => Err(bad(format!("unsupported layers_block_type `{other}`"))),
                    })
                    .collect::<Result<_>>()?
            }
        };
        if let Some(c) = pattern.iter().find(|c| !matches!(c, 'M' | '*' | '-' | 'E')) {
            return Err(bad(format!(
                "unknown block type `{c}` in the layer pattern"
            )));
        }
        if pattern.contains(&'E') {
            return Err(bad(
                "mixture-of-experts blocks (`E`) are not supported yet".into()
            ));
        }
        if pattern.is_empty() {
            return Err(bad("the layer pattern is empty".into()));
        }
        positive(
            "nemotron_h",
            &[
                ("vocab_size", self.vocab_size),
                ("hidden_size", self.hidden_size),
                ("intermediate_size", self.intermediate_size),
                ("num_attention_heads", self.num_attention_heads),
                ("num_key_value_heads", self.num_key_value_heads),
                ("mamba_num_heads", self.mamba_num_heads),
                ("mamba_head_dim", self.mamba_head_dim),
                ("ssm_state_size", self.ssm_state_size),
                ("n_groups", self.n_groups),
            ],
        )?;
        conv_kernel_ok("nemotron_h", self.conv_kernel)?;
        let inter = self.mamba_num_heads * self.mamba_head_dim;
        if self.mamba_num_heads % self.n_groups != 0 || inter % self.n_groups != 0 {
            return Err(bad(format!(
                "`mamba_num_heads` {} is not a multiple of `n_groups` {}",
                self.mamba_num_heads, self.n_groups
            )));
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(bad(format!(
                "`num_attention_heads` {} is not a multiple of `num_key_value_heads` {}",
                self.num_attention_heads, self.num_key_value_heads
            )));
        }
        if self.head_dim.is_none() && self.hidden_size % self.num_attention_heads != 0 {
            return Err(bad(format!(
                "`hidden_size` {} is not a multiple of `num_attention_heads` {}",
                self.hidden_size, self.num_attention_heads
            )));
        }
        Ok(pattern)
    }

    fn mamba_dims(&self) -> Mamba2Dims {
        let inter = self.mamba_num_heads * self.mamba_head_dim;
        let (lo, hi) = self.time_step_limit.unwrap_or((0.0, f64::INFINITY));
        Mamba2Dims {
            hidden_size: self.hidden_size,
            num_heads: self.mamba_num_heads,
            head_dim: self.mamba_head_dim,
            n_groups: self.n_groups,
            state_size: self.ssm_state_size,
            conv_kernel: self.conv_kernel,
            use_conv_bias: self.use_conv_bias,
            proj_bias: self.mamba_proj_bias,
            out_bias: self.mamba_proj_bias,
            eps: self.layer_norm_epsilon as f32,
            time_step_limit: (lo as f32, hi as f32),
            norm: GatedNorm::Grouped(inter / self.n_groups),
            cast_d: true,
        }
    }
}

/// `NemotronHAttention` (and jamba's): no positional encoding.
#[derive(Clone)]
pub(crate) struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    n_heads: i32,
    n_kv_heads: i32,
    scale: f32,
}

impl Attention {
    fn load(a: &ModelArgs, w: &mut Weights, p: &str) -> Result<Attention> {
        let hd = a.head_dim.unwrap_or(a.hidden_size / a.num_attention_heads);
        Attention::load_parts(
            w,
            p,
            a.hidden_size,
            a.num_attention_heads,
            a.num_key_value_heads,
            hd,
            a.attention_bias,
        )
    }

    /// `q_proj`, `k_proj`, `v_proj`, `o_proj` under `p`, scale `head_dim ** -0.5`.
    pub(crate) fn load_parts(
        w: &mut Weights,
        p: &str,
        d: i32,
        h: i32,
        kv: i32,
        hd: i32,
        bias: bool,
    ) -> Result<Attention> {
        let mut l = |n: &str, i: i32, o: i32| Linear::load(w, &format!("{p}.{n}"), i, o, bias);
        Ok(Attention {
            q_proj: l("q_proj", d, h * hd)?,
            k_proj: l("k_proj", d, kv * hd)?,
            v_proj: l("v_proj", d, kv * hd)?,
            o_proj: l("o_proj", h * hd, d)?,
            n_heads: h,
            n_kv_heads: kv,
            scale: (f64::from(hd)).powf(-0.5) as f32,
        })
    }

    pub(crate) fn forward(
        &self,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        let q = kit::split_heads(&self.q_proj.forward(x)?, self.n_heads)?;
        let k = kit::split_heads(&self.k_proj.forward(x)?, self.n_kv_heads)?;
        let v = kit::split_heads(&self.v_proj.forward(x)?, self.n_kv_heads)?;
        let out = kit::rope_attend(q, k, v, None, cache, self.scale, mask)?;
        self.o_proj.forward(&out)
    }
}

/// `NemotronHMLP`: `down(relu2(up(x)))`.
#[derive(Clone)]
struct Mlp {
    up_proj: Linear,
    down_proj: Linear,
}

#[derive(Clone)]
enum Mixer {
    Mamba(Box<Mamba2Mixer>),
    Attention(Attention),
    Mlp(Mlp),
}

#[derive(Clone)]
struct Block {
    norm: RmsNorm,
    mixer: Mixer,
}

/// The Nemotron-H model (untied `lm_head`).
pub struct Model {
    model_type: String,
    vocab_size: i32,
    embeddings: Embedding,
    layers: Vec<Block>,
    norm_f: RmsNorm,
    lm_head: Linear,
    /// Index into the caches of the first attention layer's cache (`fa_idx`) and of the
    /// first Mamba layer's (`ssm_idx`), as mlx-lm counts them.
    fa_idx: usize,
    ssm_idx: usize,
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let a: ModelArgs = config.args()?;
        let pattern = a.pattern()?;
        // sanitize: multi-token-prediction weights dropped, conv weights moved.
        w.discard_prefix("mtp.");
        sanitize(w)?;
        let eps = a.layer_norm_epsilon as f32;
        let d = a.hidden_size;
        let embeddings = Embedding::load(w, "backbone.embeddings", a.vocab_size, d)?;
        let mut layers = Vec::with_capacity(pattern.len());
        for (i, kind) in pattern.iter().enumerate() {
            let p = format!("backbone.layers.{i}");
            let m = format!("{p}.mixer");
            let mixer = match kind {
                'M' => Mixer::Mamba(Box::new(Mamba2Mixer::load(&a.mamba_dims(), w, &m)?)),
                '*' => Mixer::Attention(Attention::load(&a, w, &m)?),
                _ => Mixer::Mlp(Mlp {
                    up_proj: Linear::load(
                        w,
                        &format!("{m}.up_proj"),
                        d,
                        a.intermediate_size,
                        a.mlp_bias,
                    )?,
                    down_proj: Linear::load(
                        w,
                        &format!("{m}.down_proj"),
                        a.intermediate_size,
                        d,
                        a.mlp_bias,
                    )?,
                }),
            };
            layers.push(Block {
                norm: RmsNorm::load(w, &format!("{p}.norm"), d, eps)?,
                mixer,
            });
        }
        let norm_f = RmsNorm::load(w, "backbone.norm_f", d, eps)?;
        let lm_head = Linear::load(w, "lm_head", d, a.vocab_size, false)?;
        let fa_idx = pattern
            .iter()
            .take_while(|c| **c != '*')
            .filter(|c| **c == 'M')
            .count();
        let ssm_idx = pattern
            .iter()
            .take_while(|c| **c != 'M')
            .filter(|c| **c == '*')
            .count();
        Ok(Model {
            model_type: a.model_type,
            vocab_size: a.vocab_size,
            embeddings,
            layers,
            norm_f,
            lm_head,
            fa_idx,
            ssm_idx,
        })
    }

    fn n_caches(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| !matches!(l.mixer, Mixer::Mlp(_)))
            .count()
    }

    /// The final normed hidden states `(batch, seq, hidden)`.
    fn head(&self, h: &Array) -> Result<Array> {
        self.lm_head.forward(h)
    }

    pub fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        crate::models::moe::check_inputs(inputs)?;
        let mut h = self.embeddings.forward(inputs)?;
        let n = h.shape().get(1).copied().unwrap_or(0) as usize;
        let mut caches = caches;
        let (attn_mask, ssm_mask) = match caches.as_deref() {
            Some(c) => {
                if c.len() != self.n_caches() {
                    return Err(ModelError::Cache {
                        what: "nemotron_h".into(),
                        problem: format!(
                            "{} caches for {} Mamba and attention layers",
                            c.len(),
                            self.n_caches()
                        ),
                    });
                }
                let mask = |i: usize| -> Result<AttentionMask> {
                    match c.get(i) {
                        Some(c) => Ok(c.make_mask(n, None, false)?),
                        None => Ok(mlx_cache::mask::fallback_mask(n, None, false)?),
                    }
                };
                (mask(self.fa_idx)?, mask(self.ssm_idx)?.as_array().cloned())
            }
            None => (mlx_cache::mask::fallback_mask(n, None, false)?, None),
        };
        let mut counter = 0;
        for (i, layer) in self.layers.iter().enumerate() {
            let x = layer.norm.forward(&h)?;
            let out = match &layer.mixer {
                Mixer::Mlp(m) => m.down_proj.forward(&relu2(&m.up_proj.forward(&x)?)?)?,
                Mixer::Mamba(m) => {
                    let cache = caches.as_deref_mut().and_then(|c| c.get_mut(counter));
                    counter += 1;
                    m.forward(&x, ssm_mask.as_ref(), arrays_cache(cache, i)?)?
                }
                Mixer::Attention(a) => {
                    let cache = caches.as_deref_mut().and_then(|c| c.get_mut(counter));
                    counter += 1;
                    a.forward(&x, &attn_mask, cache)?
                }
            };
            h = (&h + &out)?;
        }
        self.norm_f.forward(&h)
    }
}

impl LanguageModel for Model {
    kit::hidden_state_entry_points!();

    fn output_head(&self) -> Option<crate::models::OutputHead> {
        Some(crate::models::OutputHead::Linear(self.lm_head.clone()))
    }

    kit::layer_caches! {
        fn make_cache(&self) {
            self.layers
                .iter()
                .filter_map(|l| -> Option<Box<dyn Cache>> {
                    match l.mixer {
                        Mixer::Mamba(_) => Some(Box::new(mlx_cache::ArraysCache::new(2))),
                        Mixer::Attention(_) => Some(Box::new(KVCache::new())),
                        Mixer::Mlp(_) => None,
                    }
                })
                .collect()
        }
    }

    fn model_type(&self) -> &str {
        &self.model_type
    }

    fn vocab_size(&self) -> i32 {
        self.vocab_size
    }
}

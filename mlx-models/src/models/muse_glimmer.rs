//! mlx-lm 0.32.2 `models/muse_glimmer.py`: sandwich blocks of centred RMS norms
//! (`rms_norm(x, 1 + w)`, the post norms with their own eps), weightless q/k RMS norms with
//! the queries scaled by `qk_scale_factor`, an element-wise sigmoid gate on the attention
//! output, sliding layers (rotating caches) and full layers without rope, weightless-normed
//! embeddings, and logits scaled by `output_multiplier` then soft-capped.

use mlx_cache::{create_attention_mask, AttentionMask, Cache, Kv};
use mlx_core::prelude::*;
use serde::Deserialize;
use serde_json::Value;

use crate::config::{parse_args, ModelConfig};
use crate::error::{ModelError, Result};
use crate::layers::{
    scaled_dot_product_attention, silu, Embedding, Linear, Norm, NormKind, RmsNorm, Rope,
};
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

serde_defaults! {
    d_hidden: i32 = 6656;
    d_layers: i32 = 52;
    d_inter: i32 = 19968;
    d_heads: i32 = 32;
    d_kv_heads: i32 = 2;
    d_head_dim: i32 = 128;
    d_vocab: i32 = 202048;
    d_eps: f64 = 1e-5;
    d_post_eps: f64 = 1e-8;
    d_window: i64 = 2048;
    d_qk_scale: f64 = 3.87;
    d_theta: f64 = 500000.0;
    d_softcap: f64 = 20.0;
    d_out_mult: f64 = 0.19611613513818404;
    d_false: bool = false;
}

/// muse_glimmer.py `ModelArgs` (after `from_dict` merged `text_config` in).
#[derive(Clone, Debug, Deserialize)]
pub struct ModelArgs {
    pub model_type: String,
    #[serde(default = "d_hidden")]
    pub hidden_size: i32,
    #[serde(default = "d_layers")]
    pub num_hidden_layers: i32,
    #[serde(default = "d_inter")]
    pub intermediate_size: i32,
    #[serde(default = "d_heads")]
    pub num_attention_heads: i32,
    #[serde(default = "d_kv_heads")]
    pub num_key_value_heads: i32,
    #[serde(default = "d_head_dim")]
    pub head_dim: i32,
    #[serde(default = "d_vocab")]
    pub vocab_size: i32,
    #[serde(default = "d_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "d_post_eps")]
    pub post_norm_eps: f64,
    #[serde(default = "d_window")]
    pub sliding_window: i64,
    #[serde(default = "d_qk_scale")]
    pub qk_scale_factor: f64,
    #[serde(default = "d_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub layer_rope_theta: Option<Vec<f64>>,
    #[serde(default = "d_false")]
    pub tie_word_embeddings: bool,
    #[serde(default = "d_softcap")]
    pub final_logit_softcapping: f64,
    #[serde(default = "d_out_mult")]
    pub output_multiplier: f64,
}

struct Layer {
    sliding: bool,
    rope: Option<Rope>,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    gate: Linear,
    mlp_gate: Linear,
    mlp_up: Linear,
    mlp_down: Linear,
    input_norm: Norm,
    post_attn_norm: Norm,
    pre_ff_norm: Norm,
    post_ff_norm: Norm,
}

pub struct Model {
    args: ModelArgs,
    eps: f32,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    window: usize,
}

fn bad(field: &str, what: &str) -> ModelError {
    ModelError::Config(format!(
        "config.json (`muse_glimmer`): field `{field}` {what}"
    ))
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        // `from_dict`: `text_config`'s keys over the top level's.
        let mut raw = config.raw.clone();
        if let Some(Value::Object(t)) = config.raw.get("text_config") {
            if let Value::Object(top) = &mut raw {
                for (k, v) in t {
                    top.insert(k.clone(), v.clone());
                }
            }
        }
        let mut args: ModelArgs = parse_args(&raw, "muse_glimmer")?;
        if let Some(t) = args
            .rope_parameters
            .as_ref()
            .and_then(|p| p.get("rope_theta"))
        {
            args.rope_theta = t
                .as_f64()
                .ok_or_else(|| bad("rope_parameters.rope_theta", "must be a number"))?;
        }
        let n = args.num_hidden_layers;
        for (name, v) in [
            ("hidden_size", args.hidden_size),
            ("num_hidden_layers", n),
            ("intermediate_size", args.intermediate_size),
            ("num_attention_heads", args.num_attention_heads),
            ("num_key_value_heads", args.num_key_value_heads),
            ("head_dim", args.head_dim),
            ("vocab_size", args.vocab_size),
        ] {
            if v <= 0 {
                return Err(bad(name, &format!("must be positive, got {v}")));
            }
        }
        if args.num_attention_heads % args.num_key_value_heads != 0 {
            return Err(bad(
                "num_key_value_heads",
                "must divide num_attention_heads",
            ));
        }
        if args.sliding_window <= 0 {
            return Err(bad("sliding_window", "must be positive"));
        }
        let types = match &args.layer_types {
            Some(t) => t.clone(),
            None => (0..n)
                .map(|i| {
                    if i % 4 == 3 {
                        "full_attention".to_string()
                    } else {
                        "sliding_attention".to_string()
                    }
                })
                .collect(),
        };
        if types.len() != n as usize {
            return Err(bad(
                "layer_types",
                &format!("has {} entries for {n} layers", types.len()),
            ));
        }
        let thetas = match &args.layer_rope_theta {
            Some(t) => t.clone(),
            None => types
                .iter()
                .map(|t| {
                    if t == "full_attention" {
                        0.0
                    } else {
                        args.rope_theta
                    }
                })
                .collect(),
        };
        if thetas.len() != n as usize {
            return Err(bad(
                "layer_rope_theta",
                &format!("has {} entries for {n} layers", thetas.len()),
            ));
        }
        // sanitize: vision modules dropped, the language model's names taken back.
        for k in w.names() {
            if k.starts_with("vision_tower")
                || k.starts_with("vision_adapter")
                || k.starts_with("vision_projection")
            {
                w.discard(&k);
            }
        }
        w.rename_all(|k| {
            Some(if let Some(r) = k.strip_prefix("language_model.model.") {
                format!("model.{r}")
            } else if let Some(r) = k.strip_prefix("language_model.lm_head.") {
                format!("lm_head.{r}")
            } else if let Some(r) = k.strip_prefix("model.language_model.") {
                format!("model.{r}")
            } else {
                k.to_string()
            })
        })?;
        let (d, h, kv, hd) = (
            args.hidden_size,
            args.num_attention_heads,
            args.num_key_value_heads,
            args.head_dim,
        );
        let (eps, post_eps) = (args.rms_norm_eps as f32, args.post_norm_eps as f32);
        let inter = args.intermediate_size;
        let embed = Embedding::load(w, "model.embed_tokens", args.vocab_size, d)?;
        let mut layers = Vec::with_capacity(n as usize);
        for i in 0..n as usize {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            let centred =
                |w: &mut Weights, s: &str, e: f32| Norm::load(w, &p(s), NormKind::RmsOffset, d, e);
            layers.push(Layer {
                sliding: types[i] == "sliding_attention",
                rope: if thetas[i] != 0.0 {
                    Some(Rope::initialize(hd, args.rope_theta, false, None, None)?)
                } else {
                    None
                },
                q: Linear::load(w, &p("self_attn.q_proj"), d, h * hd, false)?,
                k: Linear::load(w, &p("self_attn.k_proj"), d, kv * hd, false)?,
                v: Linear::load(w, &p("self_attn.v_proj"), d, kv * hd, false)?,
                o: Linear::load(w, &p("self_attn.o_proj"), h * hd, d, false)?,
                gate: Linear::load(w, &p("self_attn.gate_proj"), d, h * hd, false)?,
                mlp_gate: Linear::load(w, &p("mlp.gate_proj"), d, inter, false)?,
                mlp_up: Linear::load(w, &p("mlp.up_proj"), d, inter, false)?,
                mlp_down: Linear::load(w, &p("mlp.down_proj"), inter, d, false)?,
                input_norm: centred(w, "input_layernorm", eps)?,
                post_attn_norm: centred(w, "post_attention_layernorm", post_eps)?,
                pre_ff_norm: centred(w, "pre_feedforward_layernorm", eps)?,
                post_ff_norm: centred(w, "post_feedforward_layernorm", post_eps)?,
            });
        }
        let norm = RmsNorm::load(w, "model.norm", d, eps)?;
        let lm_head = crate::models::load_lm_head(w, args.tie_word_embeddings, d, args.vocab_size)?;
        Ok(Model {
            eps,
            embed,
            layers,
            norm,
            lm_head,
            window: args.sliding_window as usize,
            args,
        })
    }

    fn attention(
        &self,
        l: &Layer,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        let s = x.shape();
        let (b, n) = (s[0], s[1]);
        let a = &self.args;
        let (h, kv, hd) = (a.num_attention_heads, a.num_key_value_heads, a.head_dim);
        let q = ops::reshape(&l.q.forward(x)?, &[b, n, h, hd], None)?;
        let k = ops::reshape(&l.k.forward(x)?, &[b, n, kv, hd], None)?;
        let v = ops::reshape(&l.v.forward(x)?, &[b, n, kv, hd], None)?;
        let q = (&fast::rms_norm(&q, None, self.eps, None)? * a.qk_scale_factor as f32)?;
        let k = fast::rms_norm(&k, None, self.eps, None)?;
        let t = |y: &Array| ops::transpose(y, &[0, 2, 1, 3], None);
        let (mut q, mut k, v) = (t(&q)?, t(&k)?, t(&v)?);
        if let Some(r) = &l.rope {
            let offset = cache.as_ref().map_or(0, |c| c.offset());
            q = r.forward(&q, offset)?;
            k = r.forward(&k, offset)?;
        }
        let kv = match cache {
            Some(c) => c.update_and_fetch(&k, &v)?,
            None => Kv::Dense { keys: k, values: v },
        };
        let scale = f64::from(hd).powf(-0.5) as f32;
        let out = scaled_dot_product_attention(&q, &kv, scale, mask, None)?;
        let out = ops::reshape(&t(&out)?, &[b, n, -1], None)?;
        let out = (&out * &ops::sigmoid(&l.gate.forward(x)?, None)?)?;
        l.o.forward(&out)
    }

    fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        if inputs.ndim() != 2 {
            return Err(ModelError::Input {
                what: "inputs".into(),
                problem: format!(
                    "must be token ids of shape (batch, seq), got shape {:?}",
                    inputs.shape()
                ),
            });
        }
        let n = inputs.shape()[1] as usize;
        let mut h = fast::rms_norm(&self.embed.forward(inputs)?, None, self.eps, None)?;
        let mut caches = caches;
        if let Some(c) = caches.as_deref() {
            kit::check_caches(Some(c), self.layers.len(), "layers")?;
        }
        // `_masks`: one mask per layer type, from the first layer of that type's cache.
        let mask_of = |sliding: bool| -> Result<Option<AttentionMask>> {
            let Some(i) = self.layers.iter().position(|l| l.sliding == sliding) else {
                return Ok(None);
            };
            let window = sliding.then_some(self.window);
            Ok(Some(match caches.as_deref() {
                Some(c) => c[i].make_mask(n, window, false)?,
                None => create_attention_mask(n, 0, false, window)?,
            }))
        };
        let (full, swa) = (mask_of(false)?, mask_of(true)?);
        for (i, l) in self.layers.iter().enumerate() {
            let mask = if l.sliding { &swa } else { &full };
            let mask = mask.as_ref().ok_or_else(|| ModelError::Internal {
                what: "layer".into(),
                problem: "without a mask".into(),
            })?;
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            let a = self.attention(l, &l.input_norm.forward(&h)?, mask, cache)?;
            h = (&h + &l.post_attn_norm.forward(&a)?)?;
            let x = l.pre_ff_norm.forward(&h)?;
            let m = l
                .mlp_down
                .forward(&(&silu(&l.mlp_gate.forward(&x)?)? * &l.mlp_up.forward(&x)?)?)?;
            h = (&h + &l.post_ff_norm.forward(&m)?)?;
        }
        self.norm.forward(&h)
    }

    fn head(&self, h: &Array) -> Result<Array> {
        let out = match &self.lm_head {
            Some(l) => l.forward(h)?,
            None => self.embed.as_linear(h)?,
        };
        let out = (&out * self.args.output_multiplier as f32)?;
        Ok(crate::layers::softcap(
            &out,
            self.args.final_logit_softcapping as f32,
        )?)
    }
}

impl LanguageModel for Model {
    fn forward(&self, inputs: &Array, caches: Option<&mut [Box<dyn Cache>]>) -> Result<Array> {
        let h = self.hidden_states(inputs, caches)?;
        self.head(&h)
    }

    fn forward_hidden(&self, inputs: &Array) -> Option<Result<Array>> {
        Some(self.hidden_states(inputs, None))
    }

    kit::layer_caches! {
        fn make_cache(&self) {
            kit::sliding_caches(self.layers.iter().map(|l| l.sliding), self.window)
        }
    }

    kit::own_type_and_vocab!(args);
}

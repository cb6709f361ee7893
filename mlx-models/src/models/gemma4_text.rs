//! mlx-lm 0.32.2 `models/gemma4_text.py`: sliding and global layers with different head
//! dims and rotary settings (proportional partial rope on the global layers), KV sharing
//! across the trailing `num_kv_shared_layers` layers (they read the last earlier layer of
//! their type and write no cache), per-layer input embeddings, the optional MoE block
//! (router with per-expert scales, GeGLU experts) beside the dense MLP, and the final logit
//! soft-cap.

use mlx_cache::{AttentionMask, Cache, KVCache, Kv, RotatingKVCache};
use mlx_core::prelude::*;
use serde::Deserialize;
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::{
    gelu_approx, join, Embedding, Linear, Norm, RmsNorm, Rope, SwitchActivation, SwitchGlu, Walk,
    Walkable,
};
use crate::models::checkpoint::{checkpointed_many, concat_cache, LayerArrays};
use crate::models::moe::QkNorm;
use crate::models::moe_block::Router;
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

serde_defaults! {
    d_type: String = "gemma4_text".into();
    d_hidden: i32 = 1536;
    d_layers: i32 = 35;
    d_intermediate: i32 = 6144;
    d_heads: i32 = 8;
    d_head_dim: i32 = 256;
    d_global_head_dim: i32 = 512;
    d_eps: f64 = 1e-6;
    d_vocab: i32 = 262144;
    d_kv_heads: i32 = 1;
    d_shared: i32 = 20;
    d_per_layer: i32 = 256;
    d_window: i64 = 512;
    d_pattern: i32 = 5;
    d_max_pos: i64 = 131072;
    d_softcap: Option<f64> = Some(30.0);
    d_true: bool = true;
}

/// gemma4_text.py `ModelArgs` (all defaulted there).
#[derive(Clone, Debug, Deserialize)]
pub struct ModelArgs {
    #[serde(default = "d_type")]
    pub model_type: String,
    #[serde(default = "d_hidden")]
    pub hidden_size: i32,
    #[serde(default = "d_layers")]
    pub num_hidden_layers: i32,
    #[serde(default = "d_intermediate")]
    pub intermediate_size: i32,
    #[serde(default = "d_heads")]
    pub num_attention_heads: i32,
    #[serde(default = "d_head_dim")]
    pub head_dim: i32,
    #[serde(default = "d_global_head_dim")]
    pub global_head_dim: i32,
    #[serde(default = "d_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "d_vocab")]
    pub vocab_size: i32,
    #[serde(default = "d_vocab")]
    pub vocab_size_per_layer_input: i32,
    #[serde(default = "d_kv_heads")]
    pub num_key_value_heads: i32,
    #[serde(default)]
    pub num_global_key_value_heads: Option<i32>,
    #[serde(default = "d_shared")]
    pub num_kv_shared_layers: i32,
    #[serde(default = "d_per_layer")]
    pub hidden_size_per_layer_input: i32,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_parameters: Option<Value>,
    #[serde(default = "d_window")]
    pub sliding_window: i64,
    #[serde(default = "d_pattern")]
    pub sliding_window_pattern: i32,
    #[serde(default = "d_max_pos")]
    pub max_position_embeddings: i64,
    #[serde(default)]
    pub attention_k_eq_v: bool,
    #[serde(default = "d_softcap")]
    pub final_logit_softcapping: Option<f64>,
    #[serde(default = "d_true")]
    pub use_double_wide_mlp: bool,
    #[serde(default)]
    pub enable_moe_block: bool,
    #[serde(default)]
    pub num_experts: Option<i32>,
    #[serde(default)]
    pub top_k_experts: Option<i32>,
    #[serde(default)]
    pub moe_intermediate_size: Option<i32>,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default = "d_true")]
    pub tie_word_embeddings: bool,
}

impl ModelArgs {
    /// `__post_init__` (default rope parameters and layer pattern) and the checks that keep
    /// MLX from seeing bad shapes.
    fn post_init(mut self) -> Result<ModelArgs> {
        if self.rope_parameters.is_none() {
            self.rope_parameters = Some(serde_json::json!({
                "full_attention": {
                    "partial_rotary_factor": 0.25,
                    "rope_theta": 1000000.0,
                    "rope_type": "proportional",
                },
                "sliding_attention": {
                    "partial_rotary_factor": 1.0,
                    "rope_theta": 10000.0,
                    "rope_type": "default",
                },
            }));
        }
        let n = self.num_hidden_layers.max(0) as usize;
        if self.layer_types.is_none() {
            let p = self.sliding_window_pattern.max(1) as usize;
            self.layer_types = Some(
                (0..n)
                    .map(|i| {
                        if i % p == p - 1 {
                            "full_attention"
                        } else {
                            "sliding_attention"
                        }
                        .to_string()
                    })
                    .collect(),
            );
        }
        let t = &self.model_type;
        let types = self.layer_types.as_deref().unwrap_or_default();
        if types.len() != n {
            return Err(ModelError::Config(format!(
                "{t}: layer_types has {} entries for {n} layers",
                types.len()
            )));
        }
        if let Some(bad) = types
            .iter()
            .find(|x| *x != "full_attention" && *x != "sliding_attention")
        {
            return Err(ModelError::Config(format!(
                "{t}: unknown layer type `{bad}`"
            )));
        }
        for (name, v) in [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
        ] {
            if v <= 0 {
                return Err(ModelError::Config(format!(
                    "{t}: `{name}` must be positive, got {v}"
                )));
            }
        }
        if self.num_kv_shared_layers < 0 || self.num_kv_shared_layers >= self.num_hidden_layers {
            return Err(ModelError::Config(format!(
                "{t}: num_kv_shared_layers {} must be below num_hidden_layers {}",
                self.num_kv_shared_layers, self.num_hidden_layers
            )));
        }
        let first_shared = (self.num_hidden_layers - self.num_kv_shared_layers) as usize;
        for j in first_shared..n {
            if !types[..first_shared].contains(&types[j]) {
                return Err(ModelError::Config(format!(
                    "{t}: KV-shared layer {j} ({}) has no earlier layer of its type",
                    types[j]
                )));
            }
        }
        if self.enable_moe_block {
            let (e, k, m) = (
                self.num_experts.unwrap_or(0),
                self.top_k_experts.unwrap_or(0),
                self.moe_intermediate_size.unwrap_or(0),
            );
            if e <= 0 || k <= 0 || k > e || m <= 0 {
                return Err(ModelError::Config(format!(
                    "{t}: the MoE block needs num_experts > 0, 0 < top_k_experts <= num_experts \
                     and moe_intermediate_size > 0 (got {e}, {k}, {m})"
                )));
            }
        }
        if self.sliding_window <= 0 {
            return Err(ModelError::Config(format!(
                "{t}: sliding_window must be positive, got {}",
                self.sliding_window
            )));
        }
        Ok(self)
    }

    fn first_kv_shared(&self) -> usize {
        (self.num_hidden_layers - self.num_kv_shared_layers) as usize
    }

    fn layer_type(&self, i: usize) -> &str {
        self.layer_types
            .as_ref()
            .and_then(|t| t.get(i))
            .map_or("full_attention", String::as_str)
    }
}

/// gemma4_text.py's `Attention` ([`kit::Attention`]): per-head q/k norms, weightless-normed
/// values, scale 1, the rope of the layer's kind. A KV-shared layer (from
/// `num_kv_shared_layers` on) has no `k_proj`, `v_proj` or `k_norm` and attends over an
/// earlier layer's keys and values ([`kit::Attention::forward_reusing`]); an
/// `attention_k_eq_v` full layer has no `v_proj` (its values are its keys' heads).
fn attention(a: &ModelArgs, w: &mut Weights, path: &str, i: usize) -> Result<kit::Attention> {
    let p = |n: &str| format!("{path}.{n}");
    let is_sliding = a.layer_type(i) == "sliding_attention";
    let has_kv = i < a.first_kv_shared();
    let head_dim = if !is_sliding && a.global_head_dim > 0 {
        a.global_head_dim
    } else {
        a.head_dim
    };
    let use_k_eq_v = a.attention_k_eq_v && !is_sliding;
    let n_kv_heads = match (use_k_eq_v, a.num_global_key_value_heads) {
        (true, Some(n)) => n,
        _ => a.num_key_value_heads,
    };
    let (dim, h) = (a.hidden_size, a.num_attention_heads);
    let eps = a.rms_norm_eps as f32;
    let key = if is_sliding {
        "sliding_attention"
    } else {
        "full_attention"
    };
    let params = a
        .rope_parameters
        .as_ref()
        .and_then(|r| r.get(key))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let theta = params
        .get("rope_theta")
        .and_then(Value::as_f64)
        .unwrap_or(10000.0);
    let kv_width = n_kv_heads * head_dim;
    let q_proj = Linear::load(w, &p("q_proj"), dim, h * head_dim, false)?;
    let k_proj = match has_kv {
        true => Some(Linear::load(w, &p("k_proj"), dim, kv_width, false)?),
        false => None,
    };
    let v_proj = match has_kv && !use_k_eq_v {
        true => Some(Linear::load(w, &p("v_proj"), dim, kv_width, false)?),
        false => None,
    };
    let o_proj = Linear::load(w, &p("o_proj"), h * head_dim, dim, false)?;
    let mut at = kit::Attention::from_parts(
        q_proj,
        (k_proj, v_proj),
        o_proj,
        (h, n_kv_heads, head_dim),
        1.0,
    );
    at.qk_norm = QkNorm::PerHead;
    at.q_norm = Some(Norm::Rms(RmsNorm::load(w, &p("q_norm"), head_dim, eps)?));
    if has_kv {
        at.k_norm = Some(Norm::Rms(RmsNorm::load(w, &p("k_norm"), head_dim, eps)?));
        at.value_norm = Some(Norm::RmsNoWeight { eps });
    }
    at.values_from_keys = use_k_eq_v;
    let rope = Rope::initialize(
        head_dim,
        theta,
        a.rope_traditional,
        Some(&params),
        Some(a.max_position_embeddings),
    )?;
    Ok(at.with_rope(Some(rope)))
}

/// `geglu(gate, x)`: `gelu_approx(gate) * x`, compiled as gemma4_text.py compiles it.
fn geglu(gate: &Array, x: &Array) -> Result<Array> {
    Ok(crate::layers::geglu(gate, x)?)
}

#[derive(Clone)]
struct Mlp {
    gate_proj: Linear,
    down_proj: Linear,
    up_proj: Linear,
}

impl Mlp {
    fn forward(&self, x: &Array) -> Result<Array> {
        self.down_proj.forward(&geglu(
            &self.gate_proj.forward(x)?,
            &self.up_proj.forward(x)?,
        )?)
    }
}

/// The MoE block: `Router` (norm, scale, project, top-k, softmax, per-expert scale) and the
/// GeGLU experts, with its three extra norms.
#[derive(Clone)]
struct Moe {
    top_k: i32,
    eps: f32,
    root_size: f64,
    proj: Linear,
    scale: Array,
    per_expert_scale: Array,
    switch_glu: SwitchGlu,
    post_feedforward_layernorm_1: RmsNorm,
    post_feedforward_layernorm_2: RmsNorm,
    pre_feedforward_layernorm_2: RmsNorm,
}

impl Moe {
    /// `Router.__call__`: its scaled RMS norm and projection, then the shared block's
    /// [`Router::UpperTopKThenSoftmaxScaled`] (the upper top-k, a softmax over the chosen,
    /// `per_expert_scale[inds]`).
    fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let w = ops::multiply_scalar(&self.scale, self.root_size, None)?;
        let x = fast::rms_norm(x, Some(&w), self.eps, None)?;
        let scores = self.proj.forward(&x)?;
        let scale = Some(&self.per_expert_scale);
        let (inds, weights, _) =
            Router::UpperTopKThenSoftmaxScaled.select(&scores, self.top_k, scale, &x)?;
        Ok((inds, weights))
    }
}

#[derive(Clone)]
struct PerLayerInput {
    per_layer_input_gate: Linear,
    per_layer_projection: Linear,
    post_per_layer_input_norm: RmsNorm,
}

#[derive(Clone)]
struct DecoderLayer {
    sliding: bool,
    self_attn: kit::Attention,
    mlp: Mlp,
    moe: Option<Moe>,
    per_layer: Option<PerLayerInput>,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    post_feedforward_layernorm: RmsNorm,
    layer_scalar: Array,
}

impl Walkable for DecoderLayer {
    /// In declaration order: `self_attn`'s projections (those a KV-shared or
    /// `attention_k_eq_v` layer has), `mlp`'s, a MoE layer's `router.proj` (its `scale` and
    /// `per_expert_scale`) and `experts.switch_glu.*`, the per-layer input's linears; then
    /// the norms (the MoE block's on the layer) and `layer_scalar`.
    fn walk<'a>(&'a mut self, path: &str, w: &mut Walk<'a>) {
        let DecoderLayer {
            self_attn,
            mlp,
            moe,
            per_layer,
            input_layernorm,
            post_attention_layernorm,
            pre_feedforward_layernorm,
            post_feedforward_layernorm,
            layer_scalar,
            ..
        } = self;
        let p = |n: &str| join(path, n);
        w.module(&p("self_attn"), self_attn);
        let Mlp {
            gate_proj,
            down_proj,
            up_proj,
        } = mlp;
        for (name, l) in [
            ("gate_proj", gate_proj),
            ("down_proj", down_proj),
            ("up_proj", up_proj),
        ] {
            w.linear(&p(&format!("mlp.{name}")), l);
        }
        let mut norms = vec![
            ("input_layernorm", input_layernorm),
            ("post_attention_layernorm", post_attention_layernorm),
            ("pre_feedforward_layernorm", pre_feedforward_layernorm),
            ("post_feedforward_layernorm", post_feedforward_layernorm),
        ];
        if let Some(m) = moe {
            let Moe {
                proj,
                scale,
                per_expert_scale,
                switch_glu,
                post_feedforward_layernorm_1,
                post_feedforward_layernorm_2,
                pre_feedforward_layernorm_2,
                ..
            } = m;
            w.linear(&p("router.proj"), proj);
            w.array(&p("router"), "scale", scale);
            w.array(&p("router"), "per_expert_scale", per_expert_scale);
            w.module(&p("experts.switch_glu"), switch_glu);
            norms.push(("post_feedforward_layernorm_1", post_feedforward_layernorm_1));
            norms.push(("post_feedforward_layernorm_2", post_feedforward_layernorm_2));
            norms.push(("pre_feedforward_layernorm_2", pre_feedforward_layernorm_2));
        }
        if let Some(pl) = per_layer {
            let PerLayerInput {
                per_layer_input_gate,
                per_layer_projection,
                post_per_layer_input_norm,
            } = pl;
            w.linear(&p("per_layer_input_gate"), per_layer_input_gate);
            w.linear(&p("per_layer_projection"), per_layer_projection);
            norms.push(("post_per_layer_input_norm", post_per_layer_input_norm));
        }
        for (name, n) in norms {
            w.rms_norm(&p(name), n);
        }
        w.array(path, "layer_scalar", layer_scalar);
    }
}

impl DecoderLayer {
    fn forward(
        &self,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
        per_layer_input: Option<&Array>,
        shared: Option<(&Kv, usize)>,
    ) -> Result<(Array, Kv, usize)> {
        let h = self.input_layernorm.forward(x)?;
        let (h, kv, offset) = self.self_attn.forward_reusing(&h, mask, cache, shared)?;
        let h = self.post_attention_layernorm.forward(&h)?;
        let h = (x + &h)?;
        let residual = h.clone();
        let h = match &self.moe {
            Some(m) => {
                let h1 = self
                    .mlp
                    .forward(&self.pre_feedforward_layernorm.forward(&h)?)?;
                let h1 = m.post_feedforward_layernorm_1.forward(&h1)?;
                let (inds, weights) = m.route(&h)?;
                let h2 = m.pre_feedforward_layernorm_2.forward(&h)?;
                let y = m.switch_glu.forward(&h2, &inds)?;
                let h2 = ops::sum(
                    &(&ops::expand_dims(&weights, &[-1], None)? * &y)?,
                    &[-2],
                    false,
                    None,
                )?;
                let h2 = m.post_feedforward_layernorm_2.forward(&h2)?;
                (&h1 + &h2)?
            }
            None => self
                .mlp
                .forward(&self.pre_feedforward_layernorm.forward(&h)?)?,
        };
        let h = self.post_feedforward_layernorm.forward(&h)?;
        let mut h = (&residual + &h)?;
        if let (Some(p), Some(input)) = (&self.per_layer, per_layer_input) {
            let gate = gelu_approx(&p.per_layer_input_gate.forward(&h)?)?;
            let gate = ops::multiply(&gate, input, None)?;
            let gate = p
                .post_per_layer_input_norm
                .forward(&p.per_layer_projection.forward(&gate)?)?;
            h = (&h + &gate)?;
        }
        Ok(((&h * &self.layer_scalar)?, kv, offset))
    }
}

impl LayerArrays for DecoderLayer {}

impl DecoderLayer {
    /// [`DecoderLayer::forward`] without a cache under `mx.checkpoint` (mlx-lm's
    /// `grad_checkpoint`): the hidden states, the per-layer input and the shared keys and
    /// values are the checkpoint's inputs, the output and the layer's keys and values its
    /// outputs.
    fn forward_checkpointed(
        &self,
        x: &Array,
        mask: &AttentionMask,
        per_layer_input: Option<Array>,
        shared: Option<(&Kv, usize)>,
        own: bool,
    ) -> Result<(Array, Kv, usize)> {
        let mut inputs = vec![x.clone()];
        let has_pli = per_layer_input.is_some();
        inputs.extend(per_layer_input);
        let offset = shared.map_or(0, |(_, o)| o);
        match shared {
            Some((Kv::Dense { keys, values }, _)) => inputs.extend([keys.clone(), values.clone()]),
            Some(_) => {
                return Err(ModelError::Internal {
                    what: "a checkpointed gemma4 layer".into(),
                    problem: "shares only dense keys and values".into(),
                })
            }
            None => {}
        }
        let has_shared = shared.is_some();
        let mask = mask.clone();
        let out = checkpointed_many(self, &inputs, own, move |l, xs| {
            let missing = || ModelError::Internal {
                what: "checkpoint".into(),
                problem: "missing inputs".into(),
            };
            let (x, pli, rest) = hidden_and_per_layer_input(xs, has_pli)?;
            let kv = match (has_shared, rest.first(), rest.get(1)) {
                (true, Some(k), Some(v)) => Some(Kv::Dense {
                    keys: k.clone(),
                    values: v.clone(),
                }),
                (true, _, _) => return Err(missing()),
                (false, _, _) => None,
            };
            let (h, kv, _) = l.forward(x, &mask, None, pli, kv.as_ref().map(|kv| (kv, offset)))?;
            // A KV-shared layer's keys and values are its inputs: only `h` comes out.
            match kv {
                _ if has_shared => Ok(vec![h]),
                Kv::Dense { keys, values } => Ok(vec![h, keys, values]),
                _ => Err(ModelError::Internal {
                    what: "a checkpointed gemma4 layer".into(),
                    problem: "left no dense keys and values".into(),
                }),
            }
        })?;
        let mut out = out.into_iter();
        match (out.next(), shared, out.next(), out.next()) {
            (Some(h), Some((kv, _)), None, None) => Ok((h, kv.clone(), offset)),
            (Some(h), None, Some(keys), Some(values)) => {
                Ok((h, Kv::Dense { keys, values }, offset))
            }
            _ => Err(ModelError::Internal {
                what: "a checkpointed gemma4 layer".into(),
                problem: "returned an unexpected number of arrays".into(),
            }),
        }
    }
}

/// A checkpoint's inputs as `(hidden states, per-layer input if `has_pli`, the rest)`.
fn hidden_and_per_layer_input(
    xs: &[Array],
    has_pli: bool,
) -> Result<(&Array, Option<&Array>, &[Array])> {
    let missing = || ModelError::Internal {
        what: "checkpoint".into(),
        problem: "missing inputs".into(),
    };
    let (x, rest) = xs.split_first().ok_or_else(missing)?;
    if !has_pli {
        return Ok((x, None, rest));
    }
    let (pli, rest) = rest.split_first().ok_or_else(missing)?;
    Ok((x, Some(pli), rest))
}

impl DecoderLayer {
    /// A layer that owns its keys and values, under `mx.checkpoint` with the segmented
    /// backward's `ConcatenateKVCache`: the earlier keys and values enter the checkpoint, the
    /// layer's full keys and values come out, and the cache is rebuilt from them.
    fn forward_checkpointed_cached(
        &self,
        x: &Array,
        mask: &AttentionMask,
        per_layer_input: Option<Array>,
        cache: &mut Box<dyn Cache>,
        own: bool,
    ) -> Result<(Array, Kv, usize)> {
        let offset = cache.offset();
        let prev = cache.state().into_arrays();
        let n_prev = prev.len();
        let has_pli = per_layer_input.is_some();
        let mut inputs = vec![x.clone()];
        inputs.extend(per_layer_input);
        inputs.extend(prev);
        let mask = mask.clone();
        let out = checkpointed_many(self, &inputs, own, move |l, xs| {
            let missing = || ModelError::Internal {
                what: "checkpoint".into(),
                problem: "missing inputs".into(),
            };
            let (x, pli, rest) = hidden_and_per_layer_input(xs, has_pli)?;
            let prev = rest.get(..n_prev).ok_or_else(missing)?;
            let mut c: Box<dyn Cache> = Box::new(concat_cache(prev)?);
            match l.forward(x, &mask, Some(&mut c), pli, None)? {
                (h, Kv::Dense { keys, values }, _) => Ok(vec![h, keys, values]),
                _ => Err(ModelError::Internal {
                    what: "a checkpointed gemma4 layer".into(),
                    problem: "left no dense keys and values".into(),
                }),
            }
        })?;
        match out.as_slice() {
            [h, keys, values] => {
                *cache = Box::new(concat_cache(&[keys.clone(), values.clone()])?);
                let kv = Kv::Dense {
                    keys: keys.clone(),
                    values: values.clone(),
                };
                Ok((h.clone(), kv, offset))
            }
            _ => Err(ModelError::Internal {
                what: "a checkpointed gemma4 layer".into(),
                problem: "returned an unexpected number of arrays".into(),
            }),
        }
    }
}

struct PerLayerEmbedding {
    embed_tokens_per_layer: Embedding,
    per_layer_model_projection: Linear,
    per_layer_projection_norm: RmsNorm,
}

/// The Gemma 4 text model.
pub struct Model {
    args: ModelArgs,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    per_layer: Option<PerLayerEmbedding>,
    /// For each layer, the layer whose keys and values it uses (itself unless KV-shared).
    previous_kvs: Vec<usize>,
    /// `--grad-checkpoint`: every layer under `mx.checkpoint` (training, no caches).
    grad_checkpoint: bool,
    /// The layers whose own arrays enter their checkpoints (full fine-tuning).
    checkpoint_own: std::ops::Range<usize>,
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let args: ModelArgs = config.args::<ModelArgs>()?.post_init()?;
        sanitize(&args, w)?;
        let eps = args.rms_norm_eps as f32;
        let d = args.hidden_size;
        let n = args.num_hidden_layers as usize;
        let first_shared = args.first_kv_shared();
        let hpl = args.hidden_size_per_layer_input;
        let mut layers = Vec::with_capacity(n);
        for i in 0..n {
            let p = format!("model.layers.{i}");
            let norm =
                |w: &mut Weights, name: &str| RmsNorm::load(w, &format!("{p}.{name}"), d, eps);
            let wide = args.use_double_wide_mlp && i >= first_shared && first_shared > 0;
            let inter = args.intermediate_size * if wide { 2 } else { 1 };
            let mlp = Mlp {
                gate_proj: Linear::load(w, &format!("{p}.mlp.gate_proj"), d, inter, false)?,
                down_proj: Linear::load(w, &format!("{p}.mlp.down_proj"), inter, d, false)?,
                up_proj: Linear::load(w, &format!("{p}.mlp.up_proj"), d, inter, false)?,
            };
            let moe = if args.enable_moe_block {
                let e = args.num_experts.unwrap_or(0);
                Some(Moe {
                    top_k: args.top_k_experts.unwrap_or(0),
                    eps,
                    root_size: f64::from(d).powf(-0.5),
                    proj: Linear::load(w, &format!("{p}.router.proj"), d, e, false)?,
                    scale: w.take(&format!("{p}.router.scale"), &[d])?,
                    per_expert_scale: w.take(&format!("{p}.router.per_expert_scale"), &[e])?,
                    switch_glu: SwitchGlu::load(
                        w,
                        &format!("{p}.experts.switch_glu"),
                        d,
                        args.moe_intermediate_size.unwrap_or(0),
                        e,
                        false,
                        SwitchActivation::GeGlu,
                    )?,
                    post_feedforward_layernorm_1: norm(w, "post_feedforward_layernorm_1")?,
                    post_feedforward_layernorm_2: norm(w, "post_feedforward_layernorm_2")?,
                    pre_feedforward_layernorm_2: norm(w, "pre_feedforward_layernorm_2")?,
                })
            } else {
                None
            };
            let per_layer = if hpl > 0 {
                Some(PerLayerInput {
                    per_layer_input_gate: Linear::load(
                        w,
                        &format!("{p}.per_layer_input_gate"),
                        d,
                        hpl,
                        false,
                    )?,
                    per_layer_projection: Linear::load(
                        w,
                        &format!("{p}.per_layer_projection"),
                        hpl,
                        d,
                        false,
                    )?,
                    post_per_layer_input_norm: norm(w, "post_per_layer_input_norm")?,
                })
            } else {
                None
            };
            layers.push(DecoderLayer {
                sliding: args.layer_type(i) == "sliding_attention",
                self_attn: attention(&args, w, &format!("{p}.self_attn"), i)?,
                mlp,
                moe,
                per_layer,
                input_layernorm: norm(w, "input_layernorm")?,
                post_attention_layernorm: norm(w, "post_attention_layernorm")?,
                pre_feedforward_layernorm: norm(w, "pre_feedforward_layernorm")?,
                post_feedforward_layernorm: norm(w, "post_feedforward_layernorm")?,
                layer_scalar: w.take(&format!("{p}.layer_scalar"), &[1])?,
            });
        }
        let embed_tokens = Embedding::load(w, "model.embed_tokens", args.vocab_size, d)?;
        let per_layer = if hpl > 0 {
            let total = args.num_hidden_layers * hpl;
            Some(PerLayerEmbedding {
                embed_tokens_per_layer: Embedding::load(
                    w,
                    "model.embed_tokens_per_layer",
                    args.vocab_size_per_layer_input,
                    total,
                )?,
                per_layer_model_projection: Linear::load(
                    w,
                    "model.per_layer_model_projection",
                    d,
                    total,
                    false,
                )?,
                per_layer_projection_norm: RmsNorm::load(
                    w,
                    "model.per_layer_projection_norm",
                    hpl,
                    eps,
                )?,
            })
        } else {
            None
        };
        let norm = RmsNorm::load(w, "model.norm", d, eps)?;
        let lm_head = crate::models::load_lm_head(w, args.tie_word_embeddings, d, args.vocab_size)?;
        let mut previous_kvs: Vec<usize> = (0..n).collect();
        for (j, prev) in previous_kvs.iter_mut().enumerate().skip(first_shared) {
            *prev = (0..first_shared)
                .rev()
                .find(|&i| args.layer_type(i) == args.layer_type(j))
                .unwrap_or(j);
        }
        Ok(Model {
            args,
            embed_tokens,
            layers,
            norm,
            lm_head,
            per_layer,
            previous_kvs,
            grad_checkpoint: false,
            checkpoint_own: 0..0,
        })
    }

    /// `_get_per_layer_inputs` and `_project_per_layer_inputs`: `(B, L, layers, hpl)`.
    fn per_layer_inputs(&self, p: &PerLayerEmbedding, ids: &Array, h: &Array) -> Result<Array> {
        let shape = [
            self.args.num_hidden_layers,
            self.args.hidden_size_per_layer_input,
        ];
        let hpl = f64::from(self.args.hidden_size_per_layer_input);
        let inputs =
            ops::multiply_scalar(&p.embed_tokens_per_layer.forward(ids)?, hpl.powf(0.5), None)?;
        let inputs = ops::unflatten(&inputs, -1, &shape, None)?;
        let proj = p.per_layer_model_projection.forward(h)?;
        let proj = ops::multiply_scalar(&proj, f64::from(self.args.hidden_size).powf(-0.5), None)?;
        let proj = ops::unflatten(&proj, -1, &shape, None)?;
        let proj = p.per_layer_projection_norm.forward(&proj)?;
        Ok(ops::multiply_scalar(
            &(&proj + &inputs)?,
            2.0f64.powf(-0.5),
            None,
        )?)
    }
}

/// gemma4_text.py `sanitize`: drop rotary tables and clipping ranges, the K/V weights of
/// KV-shared layers, and split HF's fused `experts.gate_up_proj`.
fn sanitize(a: &ModelArgs, w: &mut Weights) -> Result<()> {
    let first_shared = a.first_kv_shared();
    for k in w.names() {
        let drop = [
            "self_attn.rotary_emb",
            "input_max",
            "input_min",
            "output_max",
            "output_min",
        ]
        .iter()
        .any(|s| k.contains(s));
        let shared_kv = [
            ".self_attn.k_proj",
            ".self_attn.v_proj",
            ".self_attn.k_norm",
        ]
        .iter()
        .any(|s| k.contains(s))
            && k.split("layers.")
                .nth(1)
                .and_then(|r| r.split('.').next())
                .and_then(|i| i.parse::<usize>().ok())
                .is_some_and(|i| i >= first_shared);
        if drop || shared_kv {
            w.remove(&k);
            continue;
        }
        if let Some(base) = k.strip_suffix(".experts.gate_up_proj") {
            if let Some(v) = w.remove(&k) {
                let halves = ops::split_equal(&v, 2, -2, None)?;
                for (name, t) in ["gate_proj", "up_proj"].iter().zip(halves) {
                    w.insert(
                        format!("{base}.experts.switch_glu.{name}.weight"),
                        ops::contiguous(&t, false, None)?,
                    );
                }
            }
        } else if let Some(base) = k.strip_suffix(".experts.down_proj") {
            if let Some(v) = w.remove(&k) {
                w.insert(format!("{base}.experts.switch_glu.down_proj.weight"), v);
            }
        }
    }
    Ok(())
}

impl Model {
    /// The final normed hidden states `(batch, seq, hidden)` (the inner model's output, before
    /// the output head).
    pub fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        crate::models::moe::check_inputs(inputs)?;
        let emb = self.embed_tokens.forward(inputs)?;
        let h0 = ops::multiply_scalar(&emb, f64::from(self.args.hidden_size).powf(0.5), None)?;
        let n = h0.shape().get(1).copied().unwrap_or(0) as usize;
        let per_layer = match &self.per_layer {
            Some(p) => Some(self.per_layer_inputs(p, inputs, &h0)?),
            None => None,
        };
        let first_shared = self.args.first_kv_shared();
        let window = usize::try_from(self.args.sliding_window).ok();
        let mut caches = caches;
        // `_make_masks`: the first layer of each type makes the mask from its cache.
        let mut full_mask = None;
        let mut swa_mask = None;
        if let Some(c) = caches.as_deref() {
            if c.len() != first_shared {
                return Err(ModelError::Cache {
                    what: "gemma4_text".into(),
                    problem: format!(
                        "{} caches for the {first_shared} layers that own keys and values",
                        c.len()
                    ),
                });
            }
        }
        for (i, l) in self.layers.iter().enumerate() {
            let slot = if l.sliding {
                &mut swa_mask
            } else {
                &mut full_mask
            };
            if slot.is_none() {
                let w = if l.sliding { window } else { None };
                *slot = Some(match caches.as_deref().and_then(|c| c.get(i)) {
                    Some(c) => c.make_mask(n, w, false)?,
                    None => mlx_cache::mask::fallback_mask(n, w, false)?,
                });
            }
        }
        let mut h = h0;
        let mut intermediates: Vec<Option<(Kv, usize)>> = vec![None; self.layers.len()];
        for (i, layer) in self.layers.iter().enumerate() {
            let mask = if layer.sliding { &swa_mask } else { &full_mask };
            let mask = mask.as_ref().unwrap_or(&AttentionMask::None);
            let prev = self.previous_kvs[i];
            let shared = if prev != i {
                intermediates[prev].as_ref().map(|(kv, o)| (kv, *o))
            } else {
                None
            };
            let cache = caches.as_deref_mut().and_then(|c| c.get_mut(i));
            let pli = match &per_layer {
                Some(p) => Some(ops::squeeze(
                    &ops::slice_axis(p, 2, i as i32, i as i32 + 1, None)?,
                    &[2],
                    None,
                )?),
                None => None,
            };
            let (out, kv, offset) = match cache {
                None if self.grad_checkpoint => {
                    let own = self.checkpoint_own.contains(&i);
                    layer.forward_checkpointed(&h, mask, pli, shared, own)?
                }
                // The segmented backward's caches.
                Some(c) if self.grad_checkpoint && c.class_name() == "ConcatenateKVCache" => {
                    let own = self.checkpoint_own.contains(&i);
                    layer.forward_checkpointed_cached(&h, mask, pli, c, own)?
                }
                cache => layer.forward(&h, mask, cache, pli.as_ref(), shared)?,
            };
            h = out;
            intermediates[i] = Some((kv, offset));
        }
        self.norm.forward(&h)
    }

    /// The output head and the logit soft-cap over normed hidden states.
    fn head(&self, out: &Array) -> Result<Array> {
        self.shaped_head().forward(out)
    }

    /// The projection, then the logit soft-cap.
    fn shaped_head(&self) -> super::OutputHead {
        let plain = super::OutputHead::of(self.lm_head.as_ref(), &self.embed_tokens);
        match self.args.final_logit_softcapping {
            Some(cap) => super::OutputHead::Shaped {
                inner: Box::new(plain),
                pre_div: None,
                post: vec![super::LogitTransform::SoftcapCompiled(cap)],
            },
            None => plain,
        }
    }
}

impl LanguageModel for Model {
    port_entry_points!(args);

    /// The projection `head` applies (for the chunked cross-entropy of training).
    fn output_head(&self) -> Option<super::OutputHead> {
        Some(self.shaped_head())
    }

    fn make_cache(&self) -> Vec<Box<dyn Cache>> {
        let window = usize::try_from(self.args.sliding_window).unwrap_or(1);
        self.layers[..self.args.first_kv_shared()]
            .iter()
            .map(|l| -> Box<dyn Cache> {
                if l.sliding {
                    match RotatingKVCache::new(window, 0) {
                        Ok(c) => Box::new(c),
                        Err(_) => Box::new(KVCache::new()),
                    }
                } else {
                    Box::new(KVCache::new())
                }
            })
            .collect()
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    /// The layers that own caches (the KV-shared ones have none).
    fn num_layers(&self) -> usize {
        self.args.first_kv_shared()
    }
}

impl super::Trainable for Model {
    checkpoint_switches!();

    fn top_modules_mut(&mut self) -> Vec<(String, super::TopModuleMut<'_>)> {
        super::head_and_embedding(
            "",
            self.lm_head.as_mut(),
            "lm_head",
            &mut self.embed_tokens,
            "model.embed_tokens",
        )
    }

    crate::models::kit::walked_layers!(layers);
}

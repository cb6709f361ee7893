//! mlx-lm 0.32.2 `models/nemotron_h.py`: a stack of `x + mixer(norm(x))` blocks, each a
//! Mamba 2 mixer (`M`, grouped gated norm), attention without positional encoding (`*`) or a
//! squared-ReLU MLP (`-`), as `hybrid_override_pattern` (or `layers_block_type`) lists them.
//! Only `M` and `*` blocks have caches (an [`ArraysCache`] of two slots, a [`KVCache`]). The
//! mixture-of-experts block (`E`, `NemotronHMoE`): exaone_moe's compiled `group_expert_select`
//! (sigmoid, correction bias, groups), squared-ReLU `SwitchMLP` experts, optionally between the
//! latent projections `fc1_latent_proj` / `fc2_latent_proj`, plus ungated shared experts.

use mlx_cache::{AttentionMask, Cache, KVCache};
use mlx_core::prelude::*;
use serde::Deserialize;
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::ssm::{arrays_cache, GatedNorm, Mamba2Dims, Mamba2Mixer};
use crate::layers::{relu2, Embedding, Linear, RmsNorm, SwitchMlp};
use crate::models::kit::{self, Attention};
use crate::models::mamba::{conv_kernel_ok, positive, sanitize};
use crate::models::moe_block::{GroupSelect, Router};
use crate::models::LanguageModel;
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
    #[serde(default)]
    moe_intermediate_size: Option<i32>,
    #[serde(default)]
    moe_shared_expert_intermediate_size: Option<i32>,
    #[serde(default)]
    moe_latent_size: Option<i32>,
    #[serde(default)]
    n_group: Option<i32>,
    #[serde(default)]
    n_routed_experts: Option<i32>,
    #[serde(default)]
    n_shared_experts: Option<i32>,
    #[serde(default)]
    topk_group: Option<i32>,
    #[serde(default)]
    num_experts_per_tok: Option<i32>,
    #[serde(default)]
    norm_topk_prob: Option<bool>,
    #[serde(default)]
    routed_scaling_factor: Option<f64>,
}

/// What an `E` block needs, checked once.
#[derive(Clone, Copy)]
struct MoeArgs {
    experts: i32,
    inner: i32,
    top_k: i32,
    n_group: i32,
    topk_group: i32,
    scaling: f64,
    norm: bool,
    shared: Option<i32>,
    latent: Option<i32>,
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

    /// The `E` blocks' settings: the keys mlx-lm's `NemotronHMoE` cannot do without named
    /// when missing, and the sizes `group_expert_select` indexes with checked.
    fn moe(&self) -> Result<MoeArgs> {
        let bad = |m: String| ModelError::Config(format!("nemotron_h: {m}"));
        let need = |v: Option<i32>, key: &str| {
            v.ok_or_else(|| {
                bad(format!(
                    "`{key}` is required by mixture-of-experts (`E`) blocks"
                ))
            })
        };
        let experts = need(self.n_routed_experts, "n_routed_experts")?;
        let inner = need(self.moe_intermediate_size, "moe_intermediate_size")?;
        let top_k = need(self.num_experts_per_tok, "num_experts_per_tok")?;
        let n_group = need(self.n_group, "n_group")?;
        let scaling = self.routed_scaling_factor.ok_or_else(|| {
            bad("`routed_scaling_factor` is required by mixture-of-experts (`E`) blocks".into())
        })?;
        positive(
            "nemotron_h",
            &[
                ("n_routed_experts", experts),
                ("moe_intermediate_size", inner),
                ("num_experts_per_tok", top_k),
                ("n_group", n_group),
            ],
        )?;
        if top_k > experts {
            return Err(bad(format!(
                "`num_experts_per_tok` {top_k} is more than `n_routed_experts` {experts}"
            )));
        }
        let topk_group = if n_group > 1 {
            let t = need(self.topk_group, "topk_group")?;
            if experts % n_group != 0 || experts / n_group < 2 {
                return Err(bad(format!(
                    "`n_routed_experts` {experts} is not `n_group` {n_group} groups of 2 or more"
                )));
            }
            if !(1..=n_group).contains(&t) {
                return Err(bad(format!("`topk_group` {t} is not in 1..={n_group}")));
            }
            t
        } else {
            self.topk_group.unwrap_or(1)
        };
        let shared = self.n_shared_experts.map(|_| {
            self.moe_shared_expert_intermediate_size
                .unwrap_or(self.intermediate_size)
        });
        if let Some(l) = self.moe_latent_size {
            positive("nemotron_h", &[("moe_latent_size", l)])?;
        }
        if let Some(h) = shared {
            positive("nemotron_h", &[("moe_shared_expert_intermediate_size", h)])?;
        }
        Ok(MoeArgs {
            experts,
            inner,
            top_k,
            n_group,
            topk_group,
            scaling,
            norm: self.norm_topk_prob.unwrap_or(false),
            shared,
            latent: self.moe_latent_size,
        })
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

/// `NemotronHAttention` ([`kit::Attention`]): no positional encoding, scale `head_dim ** -0.5`.
fn attention(a: &ModelArgs, w: &mut Weights, p: &str) -> Result<Attention> {
    let hd = a.head_dim.unwrap_or(a.hidden_size / a.num_attention_heads);
    let dims = (
        a.hidden_size,
        a.num_attention_heads,
        a.num_key_value_heads,
        hd,
    );
    Attention::load(w, p, dims, a.attention_bias, kit::head_scale(hd))
}

/// `NemotronHMLP`: `down(relu2(up(x)))`.
#[derive(Clone)]
struct Mlp {
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    fn load(w: &mut Weights, m: &str, d: i32, inner: i32, bias: bool) -> Result<Mlp> {
        Ok(Mlp {
            up_proj: Linear::load(w, &format!("{m}.up_proj"), d, inner, bias)?,
            down_proj: Linear::load(w, &format!("{m}.down_proj"), inner, d, bias)?,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        self.down_proj.forward(&relu2(&self.up_proj.forward(x)?)?)
    }
}

/// `NemotronHMoE`: the gate (`x @ weight.T` and `e_score_correction_bias`), the experts, the
/// optional latent projections and shared experts.
#[derive(Clone)]
struct Moe {
    gate: Linear,
    correction_bias: Array,
    switch_mlp: SwitchMlp,
    shared_experts: Option<Mlp>,
    latent: Option<(Linear, Linear)>,
    select: GroupSelect,
}

impl Moe {
    fn load(a: &ModelArgs, m: &MoeArgs, w: &mut Weights, p: &str) -> Result<Moe> {
        let d = a.hidden_size;
        let expert_dim = m.latent.unwrap_or(d);
        let mut switch_mlp = SwitchMlp::load(
            w,
            &format!("{p}.switch_mlp"),
            expert_dim,
            m.inner,
            m.experts,
            false,
        )?;
        switch_mlp.relu2 = true;
        let shared_experts = match m.shared {
            Some(h) => Some(Mlp::load(
                w,
                &format!("{p}.shared_experts"),
                d,
                h,
                a.mlp_bias,
            )?),
            None => None,
        };
        let latent = match m.latent {
            Some(l) => Some((
                Linear::load(w, &format!("{p}.fc1_latent_proj"), d, l, a.mlp_bias)?,
                Linear::load(w, &format!("{p}.fc2_latent_proj"), l, d, a.mlp_bias)?,
            )),
            None => None,
        };
        Ok(Moe {
            gate: Linear::load(w, &format!("{p}.gate"), d, m.experts, false)?,
            correction_bias: w.take(&format!("{p}.gate.e_score_correction_bias"), &[m.experts])?,
            switch_mlp,
            shared_experts,
            latent,
            select: GroupSelect {
                top_k: m.top_k,
                n_group: m.n_group,
                topk_group: m.topk_group,
                scaling_bits: m.scaling.to_bits(),
                norm_topk_prob: m.norm,
                bailing: false,
                sigmoid: true,
                has_bias: true,
                kimi: false,
                cast_back: false,
                grouped: m.n_group > 1,
                norm_any_k: false,
                eps: true,
            },
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        let k = self.select.top_k;
        let bias = Some(&self.correction_bias);
        let (inds, scores, _) =
            Router::DeepseekGroup(self.select).select(&self.gate.forward(x)?, k, bias, x)?;
        let h = match &self.latent {
            Some((fc1, _)) => fc1.forward(x)?,
            None => x.clone(),
        };
        let y = self.switch_mlp.forward(&h, &inds)?;
        let weighted = (&y * &ops::expand_dims(&scores, &[-1], None)?)?;
        let mut y = ops::sum(&weighted, &[-2], false, None)?.astype(y.dtype())?;
        if let Some((_, fc2)) = &self.latent {
            y = fc2.forward(&y)?;
        }
        if let Some(s) = &self.shared_experts {
            y = (&y + &s.forward(x)?)?;
        }
        Ok(y)
    }
}

#[derive(Clone)]
enum Mixer {
    Mamba(Box<Mamba2Mixer>),
    Attention(Box<Attention>),
    Mlp(Mlp),
    Moe(Box<Moe>),
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
        // sanitize: multi-token-prediction weights dropped, conv weights moved, experts
        // stacked.
        w.discard_prefix("mtp.");
        sanitize(w)?;
        if pattern.contains(&'E') {
            let m = a.moe()?;
            for (i, kind) in pattern.iter().enumerate() {
                if *kind == 'E' {
                    let p = format!("backbone.layers.{i}.mixer");
                    kit::stack_experts(
                        w,
                        &format!("{p}.experts"),
                        &format!("{p}.switch_mlp"),
                        m.experts,
                        &[("down_proj", "fc2"), ("up_proj", "fc1")],
                        &kit::LINEAR_KEYS,
                    )?;
                }
            }
        }
        let eps = a.layer_norm_epsilon as f32;
        let d = a.hidden_size;
        let embeddings = Embedding::load(w, "backbone.embeddings", a.vocab_size, d)?;
        let mut layers = Vec::with_capacity(pattern.len());
        for (i, kind) in pattern.iter().enumerate() {
            let p = format!("backbone.layers.{i}");
            let m = format!("{p}.mixer");
            let mixer = match kind {
                'M' => Mixer::Mamba(Box::new(Mamba2Mixer::load(&a.mamba_dims(), w, &m)?)),
                '*' => Mixer::Attention(Box::new(attention(&a, w, &m)?)),
                'E' => Mixer::Moe(Box::new(Moe::load(&a, &a.moe()?, w, &m)?)),
                _ => Mixer::Mlp(Mlp::load(w, &m, d, a.intermediate_size, a.mlp_bias)?),
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
            .filter(|l| matches!(l.mixer, Mixer::Mamba(_) | Mixer::Attention(_)))
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
        let (mut h, n) = kit::embed_inputs(inputs, &self.embeddings)?;
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
                Mixer::Mlp(m) => m.forward(&x)?,
                Mixer::Moe(m) => m.forward(&x)?,
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
                        Mixer::Mlp(_) | Mixer::Moe(_) => None,
                    }
                })
                .collect()
        }
    }

    kit::own_type_and_vocab!();
}

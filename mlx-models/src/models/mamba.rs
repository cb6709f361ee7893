//! mlx-lm 0.32.2 `models/mamba.py` (also `falcon_mamba`, which mlx-lm remaps to it and which
//! turns on the B/C/dt RMS norms) and `models/mamba2.py`: pure state-space stacks of
//! `norm -> mixer -> + x` blocks over `backbone.embeddings`. Each layer's conv state and SSM
//! state live in an [`ArraysCache`] of two slots. A cache from
//! [`LanguageModel::make_cache_with_rollback`] records the state after each recent token, so
//! `trim(n)` restores the state `n` tokens back exactly (see `mlx_cache::ArraysCache`).

use mlx_cache::{ArraysCache, Cache};
use mlx_core::fast;
use mlx_core::prelude::*;
use serde::Deserialize;
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::ssm::{
    arrays_cache, softplus, store_recurrent, DepthwiseConv, GatedNorm, Mamba2Dims, Mamba2Mixer,
};
use crate::layers::{silu, swiglu, Embedding, Linear, RmsNorm};
use crate::models::checkpoint::layer_loop;
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

serde_defaults! {
    default_true: bool = true;
    default_mixer_eps: f64 = 1e-6;
}

/// mamba.py `ModelArgs`.
#[derive(Clone, Debug, Deserialize)]
struct MambaArgs {
    model_type: String,
    vocab_size: i32,
    hidden_size: i32,
    intermediate_size: i32,
    state_size: i32,
    num_hidden_layers: i32,
    conv_kernel: i32,
    use_bias: bool,
    use_conv_bias: bool,
    time_step_rank: Value,
    #[serde(default = "default_true")]
    tie_word_embeddings: bool,
    #[serde(default)]
    use_bcdt_rms: bool,
    #[serde(default = "default_mixer_eps")]
    mixer_rms_eps: f64,
}

/// mamba2.py `ModelArgs`.
#[derive(Clone, Debug, Deserialize)]
struct Mamba2Args {
    model_type: String,
    num_heads: i32,
    head_dim: i32,
    vocab_size: i32,
    hidden_size: i32,
    #[allow(dead_code)]
    intermediate_size: i32,
    state_size: i32,
    num_hidden_layers: i32,
    layer_norm_epsilon: f64,
    conv_kernel: i32,
    n_groups: i32,
    use_bias: bool,
    use_conv_bias: bool,
    tie_word_embeddings: bool,
    #[serde(deserialize_with = "crate::config::py_float_pair")]
    time_step_limit: (f64, f64),
    #[allow(dead_code)]
    time_step_rank: Value,
    #[serde(default)]
    ssm_state_size: Option<i32>,
}

pub(crate) use crate::models::kit::check_positive as positive;

pub(crate) fn conv_kernel_ok(model: &str, k: i32) -> Result<()> {
    if k < 2 {
        return Err(ModelError::Config(format!(
            "{model}: `conv_kernel` must be at least 2, got {k}"
        )));
    }
    Ok(())
}

impl MambaArgs {
    /// `__post_init__` (the `"auto"` rank, falcon_mamba's norms) and the checks that keep MLX
    /// from seeing bad shapes; returns the time-step rank.
    fn post_init(&mut self) -> Result<i32> {
        let rank = match &self.time_step_rank {
            Value::String(s) if s == "auto" => (self.hidden_size + 15).div_euclid(16),
            v => v
                .as_i64()
                .and_then(|r| i32::try_from(r).ok())
                .ok_or_else(|| {
                    ModelError::Config(format!(
                        "mamba: `time_step_rank` must be an integer or \"auto\", got {v}"
                    ))
                })?,
        };
        if self.model_type == "falcon_mamba" {
            self.use_bcdt_rms = true;
        }
        positive(
            "mamba",
            &[
                ("vocab_size", self.vocab_size),
                ("hidden_size", self.hidden_size),
                ("intermediate_size", self.intermediate_size),
                ("state_size", self.state_size),
                ("num_hidden_layers", self.num_hidden_layers),
                ("time_step_rank", rank),
            ],
        )?;
        conv_kernel_ok("mamba", self.conv_kernel)?;
        Ok(rank)
    }
}

impl Mamba2Args {
    fn dims(&self) -> Mamba2Dims {
        Mamba2Dims {
            hidden_size: self.hidden_size,
            num_heads: self.num_heads,
            head_dim: self.head_dim,
            n_groups: self.n_groups,
            state_size: self.ssm_state_size.unwrap_or(self.state_size),
            conv_kernel: self.conv_kernel,
            use_conv_bias: self.use_conv_bias,
            proj_bias: self.use_bias,
            out_bias: self.use_bias,
            eps: self.layer_norm_epsilon as f32,
            time_step_limit: (self.time_step_limit.0 as f32, self.time_step_limit.1 as f32),
            norm: GatedNorm::Plain,
            cast_d: false,
        }
    }

    fn post_init(&mut self) -> Result<()> {
        if self.ssm_state_size.is_none() {
            self.ssm_state_size = Some(self.state_size);
        }
        positive(
            "mamba2",
            &[
                ("vocab_size", self.vocab_size),
                ("hidden_size", self.hidden_size),
                ("num_heads", self.num_heads),
                ("head_dim", self.head_dim),
                ("ssm_state_size", self.ssm_state_size.unwrap_or(0)),
                ("num_hidden_layers", self.num_hidden_layers),
                ("n_groups", self.n_groups),
            ],
        )?;
        conv_kernel_ok("mamba2", self.conv_kernel)?;
        if self.num_heads % self.n_groups != 0 {
            return Err(ModelError::Config(format!(
                "mamba2: `num_heads` {} is not a multiple of `n_groups` {}",
                self.num_heads, self.n_groups
            )));
        }
        let (lo, hi) = self.time_step_limit;
        if lo.is_nan() || hi.is_nan() || lo > hi {
            return Err(ModelError::Config(format!(
                "mamba2: `time_step_limit` must be [low, high] with low <= high, got [{lo}, {hi}]"
            )));
        }
        Ok(())
    }
}

/// mamba.py `MambaBlock`.
#[derive(Clone)]
struct MambaBlock {
    in_proj: Linear,
    conv1d: DepthwiseConv,
    x_proj: Linear,
    dt_proj: Linear,
    a_log: Array,
    d: Array,
    out_proj: Linear,
    rank: i32,
    state_size: i32,
    bcdt_eps: Option<f32>,
}

impl MambaBlock {
    fn load(a: &MambaArgs, rank: i32, w: &mut Weights, p: &str) -> Result<MambaBlock> {
        let (h, i, n) = (a.hidden_size, a.intermediate_size, a.state_size);
        let n_ = |s: &str| format!("{p}.{s}");
        Ok(MambaBlock {
            in_proj: Linear::load(w, &n_("in_proj"), h, 2 * i, a.use_bias)?,
            conv1d: DepthwiseConv::load(w, &n_("conv1d"), i, a.conv_kernel, a.use_conv_bias)?,
            x_proj: Linear::load(w, &n_("x_proj"), i, rank + 2 * n, false)?,
            dt_proj: Linear::load(w, &n_("dt_proj"), rank, i, true)?,
            a_log: w.take(&n_("A_log"), &[i, n])?,
            d: w.take(&n_("D"), &[i])?,
            out_proj: Linear::load(w, &n_("out_proj"), i, h, a.use_bias)?,
            rank,
            state_size: n,
            bcdt_eps: a.use_bcdt_rms.then_some(a.mixer_rms_eps as f32),
        })
    }

    /// `ssm_step`: `x` `(B, D)` with the previous state to `(y, new_state)`.
    fn ssm_step(&self, x: &Array, a: &Array, state: Option<&Array>) -> Result<(Array, Array)> {
        let dbc = self.x_proj.forward(x)?;
        let parts = ops::split_at(&dbc, &[self.rank, self.rank + self.state_size], -1, None)?;
        let (mut delta, mut b, mut c) = (parts[0].clone(), parts[1].clone(), parts[2].clone());
        if let Some(eps) = self.bcdt_eps {
            delta = fast::rms_norm(&delta, None, eps, None)?;
            b = fast::rms_norm(&b, None, eps, None)?;
            c = fast::rms_norm(&c, None, eps, None)?;
        }
        let delta = softplus(&self.dt_proj.forward(&delta)?)?;
        let mut new_state = (&(&delta * x)?.expand_dims(&[-1])? * &b.expand_dims(&[1])?)?;
        if let Some(s) = state {
            let decay = ops::exp(&(&delta.expand_dims(&[-1])? * a)?, None)?;
            new_state = (&new_state + &(s * &decay)?)?;
        }
        let y = ops::matmul(&new_state, &c.expand_dims(&[-1])?, None)?.squeeze(&[2])?;
        let y = (&y + &(&self.d * x)?)?;
        Ok((y, new_state))
    }

    fn forward(&self, x: &Array, cache: Option<&mut ArraysCache>) -> Result<Array> {
        let xz = ops::split_equal(&self.in_proj.forward(x)?, 2, -1, None)?;
        let (x, z) = (&xz[0], &xz[1]);
        let t = x.shape()[1];
        let padded =
            self.conv1d
                .padded(x, cache.as_ref().and_then(|c| c.get(0)), cache.is_some())?;
        let x = silu(&self.conv1d.forward(&padded)?)?;
        let a = ops::negative(&ops::exp(&self.a_log, None)?, None)?;
        let mut state = cache.as_ref().and_then(|c| c.get(1)).cloned();
        let mut ys = Vec::with_capacity(t as usize);
        let mut states = Vec::new();
        let keep = cache.as_ref().is_some_and(|c| c.keeps_history());
        for s in 0..t {
            let xt = x.slice_axis(1, s, s + 1)?.squeeze(&[1])?;
            let (y, st) = self.ssm_step(&xt, &a, state.as_ref())?;
            if keep {
                states.push(st.clone());
            }
            state = Some(st);
            ys.push(y);
        }
        let refs: Vec<&Array> = ys.iter().collect();
        let y = ops::stack(&refs, 1, None)?;
        if let Some(c) = cache {
            let conv = [(&self.conv1d, &padded)];
            store_recurrent(c, &conv, t, keep.then_some(states), state, false)?;
        }
        self.out_proj.forward(&swiglu(z, &y)?)
    }
}

#[derive(Clone)]
enum Mixer {
    V1(MambaBlock),
    V2(Mamba2Mixer),
}

#[derive(Clone)]
struct ResidualBlock {
    norm: RmsNorm,
    mixer: Mixer,
}

/// The Mamba / Mamba 2 model.
pub struct Model {
    model_type: String,
    vocab_size: i32,
    embeddings: Embedding,
    layers: Vec<ResidualBlock>,
    norm_f: RmsNorm,
    lm_head: Option<Linear>,
}

/// `sanitize`: HF conv weights `(C, 1, K)` become `(C, K, 1)`.
pub(crate) fn sanitize(w: &mut Weights) -> Result<()> {
    for name in w.names() {
        let Some(shape) = w.shape_of(&name) else {
            continue;
        };
        if name.contains("conv1d.weight") && shape.len() == 3 && shape[2] != 1 {
            if let Some(t) = w.remove(&name) {
                w.insert(name, ops::moveaxis(&t, 2, 1, None)?);
            }
        }
    }
    Ok(())
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        sanitize(w)?;
        // nn.RMSNorm's default eps for each block's norm.
        let block_eps = 1e-5;
        let (model_type, vocab, d, n_layers, tied, final_eps, mixers) =
            if config.architecture == "mamba2" {
                let mut a: Mamba2Args = config.args()?;
                a.post_init()?;
                let mixers = (0..a.num_hidden_layers)
                    .map(|i| {
                        Mamba2Mixer::load(&a.dims(), w, &format!("backbone.layers.{i}.mixer"))
                            .map(Mixer::V2)
                    })
                    .collect::<Result<Vec<_>>>()?;
                let eps = a.layer_norm_epsilon as f32;
                (
                    a.model_type,
                    a.vocab_size,
                    a.hidden_size,
                    a.num_hidden_layers,
                    a.tie_word_embeddings,
                    eps,
                    mixers,
                )
            } else {
                let mut a: MambaArgs = config.args()?;
                let rank = a.post_init()?;
                let mixers = (0..a.num_hidden_layers)
                    .map(|i| {
                        MambaBlock::load(&a, rank, w, &format!("backbone.layers.{i}.mixer"))
                            .map(Mixer::V1)
                    })
                    .collect::<Result<Vec<_>>>()?;
                (
                    a.model_type,
                    a.vocab_size,
                    a.hidden_size,
                    a.num_hidden_layers,
                    a.tie_word_embeddings,
                    block_eps,
                    mixers,
                )
            };
        let embeddings = Embedding::load(w, "backbone.embeddings", vocab, d)?;
        let mut layers = Vec::with_capacity(n_layers as usize);
        for (i, mixer) in mixers.into_iter().enumerate() {
            layers.push(ResidualBlock {
                norm: RmsNorm::load(w, &format!("backbone.layers.{i}.norm"), d, block_eps)?,
                mixer,
            });
        }
        let norm_f = RmsNorm::load(w, "backbone.norm_f", d, final_eps)?;
        let lm_head = crate::models::load_lm_head(w, tied, d, vocab)?;
        Ok(Model {
            model_type,
            vocab_size: vocab,
            embeddings,
            layers,
            norm_f,
            lm_head,
        })
    }

    /// The final normed hidden states `(batch, seq, hidden)`.
    pub fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        let (h, n) = kit::embed_inputs(inputs, &self.embeddings)?;
        let mask = match caches.as_deref() {
            Some(c) => {
                kit::check_caches(Some(c), self.layers.len(), "layers")?;
                // mamba2's `create_ssm_mask` (mamba.py takes no mask).
                match (c.first(), self.layers.first().map(|l| &l.mixer)) {
                    (Some(c0), Some(Mixer::V2(_))) => {
                        c0.make_mask(n, None, false)?.as_array().cloned()
                    }
                    _ => None,
                }
            }
            None => None,
        };
        let h = layer_loop(&self.layers, h, caches, |i, layer, h, cache| {
            let cache = arrays_cache(cache, i)?;
            let x = layer.norm.forward(h)?;
            let out = match &layer.mixer {
                Mixer::V1(m) => m.forward(&x, cache)?,
                Mixer::V2(m) => m.forward(&x, mask.as_ref(), cache)?,
            };
            Ok((&out + h)?)
        })?;
        self.norm_f.forward(&h)
    }
}

impl LanguageModel for Model {
    kit::hidden_state_entry_points!(tied lm_head, embeddings);

    kit::layer_caches! {
        fn make_cache(&self) {
            self.layers
                .iter()
                .map(|_| Box::new(ArraysCache::new(2)) as Box<dyn Cache>)
                .collect()
        }
    }

    kit::own_type_and_vocab!();
}

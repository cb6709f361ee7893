//! Architectures: the model trait ([`LanguageModel`]) and what the ports share, and the ports
//! themselves. Which `model_type` is served, and by what, is the registry (`registry.rs`,
//! [`build`]): a dedicated port where one exists, else a row of the universal dense decoder's
//! descriptor table ([`descriptor::ROWS`], run by [`dense::Model`]), else a rejection naming the
//! `model_type`, what mlx-lm remaps it to, and every supported type.

/// The entry points every dedicated port shares, inside its `impl LanguageModel`: `forward`
/// (the port's `hidden_states`, then its `head`), `forward_hidden`, `forward_hidden_cached`
/// (`kit::hidden_state_entry_points!`), `model_type` / `vocab_size` read from the port's
/// config field `$cfg`, and `as_trainable_mut` (the port also implements [`Trainable`], with
/// [`checkpoint_switches!`] inside).
macro_rules! port_entry_points {
    ($cfg:ident) => {
        $crate::models::kit::hidden_state_entry_points!();

        fn model_type(&self) -> &str {
            &self.$cfg.model_type
        }

        fn vocab_size(&self) -> i32 {
            self.$cfg.vocab_size
        }

        fn as_trainable_mut(&mut self) -> Option<&mut dyn $crate::models::Trainable> {
            Some(self)
        }
    };
}

/// mlx-lm's `grad_checkpoint` (`models/checkpoint.rs`) inside a port's `impl Trainable`: the
/// two switches over the port's `grad_checkpoint` and `checkpoint_own` fields.
macro_rules! checkpoint_switches {
    () => {
        fn set_grad_checkpoint(&mut self, on: bool) -> bool {
            self.grad_checkpoint = on;
            true
        }

        fn set_checkpoint_layer_params(&mut self, layers: std::ops::Range<usize>) -> bool {
            self.checkpoint_own = layers;
            true
        }
    };
}

/// Serde default functions from one table (`name: Type = value;` each), for the ports'
/// configuration structs.
macro_rules! serde_defaults {
    ($($name:ident: $t:ty = $v:expr;)*) => {$(
        fn $name() -> $t {
            $v
        }
    )*};
}

pub mod afm7;
pub mod baichuan_m1;
pub mod bailing_linear;
mod checkpoint;
pub mod dbrx;
pub mod deepseek;
pub mod deepseek_v41;
pub mod dense;
pub mod descriptor;
pub mod falcon_h1;
pub mod gear;
pub mod gemma3n;
pub mod gemma4_text;
pub mod granitemoehybrid;
pub mod iquestloopcoder;
pub mod jamba;
pub mod kda;
pub mod kimi_k3;
pub(crate) mod kit;
pub mod lfm2;
pub mod llama4;
pub mod longcat_flash;
pub mod mamba;
pub mod mimo_v2_flash;
pub mod minimax_m3;
pub mod moe;
pub mod moe_block;
pub mod muse_glimmer;
pub mod nemotron_h;
pub mod nemotron_nas;
pub mod olmo_hybrid;
pub mod phi3small;
pub mod phixtral;
pub mod plamo2;
pub mod prism;
pub mod qwen3_next;
pub mod recurrent_gemma;
mod registry;
pub mod rwkv7;
pub mod segmented;
pub mod step3p5;
pub mod talkie;
pub mod unserved;
mod wrappers;

use mlx_cache::Cache;
use mlx_core::prelude::*;

use crate::error::{ModelError, Result};
use crate::layers::{Embedding, LayerParam, Linear, LinearMut};
use crate::weights::Weights;

pub use registry::{
    build, build_recording, build_with_params, check_supported, resolve, supported_model_types,
    BuiltParameters, SupportedType,
};

pub use descriptor::{Descriptor, Serving};
pub use segmented::SegmentedDecode;

/// A causal language model: token ids in, logits out. Models never own caches.
pub trait LanguageModel: Send {
    /// `inputs` of shape `(batch, seq)` (int32) to logits `(batch, seq, vocab)`. With
    /// `caches` (one per layer, from [`LanguageModel::make_cache`] or loaded), keys and values
    /// are appended and attention covers everything cached; without, the whole sequence is
    /// attended causally.
    fn forward(&self, inputs: &Array, caches: Option<&mut [Box<dyn Cache>]>) -> Result<Array>;

    /// Fresh caches, one per layer, of the kinds this architecture uses.
    fn make_cache(&self) -> Vec<Box<dyn Cache>>;

    /// Shards the model for tensor parallelism over `size` ranks as mlx-lm's `shard()` does
    /// (this process is `rank`; see `crate::shard`). Architectures without it: an error.
    fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        let _ = (size, rank);
        Err(crate::error::ModelError::Parallel {
            kind: crate::Parallelism::Tensor,
            what: format!("model_type `{}`", self.model_type()),
            problem: "not supported for this model yet".into(),
        })
    }

    /// Keeps this rank's stage of the layers for pipeline parallelism over `size` ranks as
    /// mlx-lm's `PipelineMixin.pipeline()` does (rank `size - 1` runs the first layers,
    /// rank 0 the last; hidden states pass by send/recv and every rank ends with rank 0's).
    /// Architectures without it: an error.
    fn shard_pipeline(&mut self, size: i32, rank: i32) -> Result<()> {
        let _ = (size, rank);
        Err(crate::error::ModelError::Parallel {
            kind: crate::Parallelism::Pipeline,
            what: format!("model_type `{}`", self.model_type()),
            problem: "not supported for this model yet".into(),
        })
    }

    /// [`LanguageModel::make_cache`]'s caches able to undo up to `max_rollback` tokens exactly
    /// with `trim` (speculative decoding), also where mlx-lm cannot: recurrent state (its
    /// issue #1446) and rotating caches that have wrapped (see `mlx_cache::enable_rollback`).
    fn make_cache_with_rollback(&self, max_rollback: usize) -> Vec<Box<dyn Cache>> {
        let mut caches = self.make_cache();
        mlx_cache::enable_rollback(&mut caches, max_rollback);
        caches
    }

    /// Whether the mlx-lm model class defines `make_cache` (then `make_prompt_cache` ignores
    /// `max_kv_size`, as mlx-lm does); otherwise [`LanguageModel::make_cache`] is the default
    /// of plain caches.
    fn defines_make_cache(&self) -> bool;

    fn num_layers(&self) -> usize;

    /// The `model_type` this was built from.
    fn model_type(&self) -> &str;

    /// Vocabulary size (last dimension of the logits).
    fn vocab_size(&self) -> i32;

    /// A cache-less forward that also returns every layer's intermediate states, named as
    /// `xtask/oracle/port_check.py` names mlx-lm's: `layers.<i>.{in, attn_in, attn, mlp_in,
    /// mlp, out}` in execution order, then `logits`.
    fn trace(&self, _inputs: &Array) -> Result<Vec<(String, Array)>> {
        Err(ModelError::Unsupported {
            what: format!("`{}`", self.model_type()),
            problem: "does not support tracing".into(),
        })
    }

    /// The hidden states before the output projection (`forward` is
    /// `output_head().forward(forward_hidden(...))`), for losses that project them in chunks.
    /// `None` when the architecture does not split its forward.
    fn forward_hidden(&self, _inputs: &Array) -> Option<Result<Array>> {
        None
    }

    /// [`LanguageModel::forward_hidden`] through caches (the segmented backward of training:
    /// hidden states of a segment attending to the keys and values of the earlier ones).
    /// `None` where the architecture does not split its forward.
    fn forward_hidden_cached(
        &self,
        _inputs: &Array,
        _caches: &mut [Box<dyn Cache>],
    ) -> Option<Result<Array>> {
        None
    }

    /// The model's parameter access for training, adapters and the quantizers that rewrite
    /// its linears in place ([`Trainable`]); `None` where the architecture has none (as if
    /// every [`Trainable`] method answered its default: no linears, no parameters, no
    /// checkpointing, `model.layers`).
    fn as_trainable_mut(&mut self) -> Option<&mut dyn Trainable> {
        None
    }

    /// The output projection that turns [`LanguageModel::forward_hidden`] into logits.
    fn output_head(&self) -> Option<OutputHead> {
        None
    }

    /// The descriptor-driven dense model behind this one, read-only (its descriptor and its
    /// layers' weights), for decoders that run the model's own arrays; `None` for the
    /// dedicated ports.
    fn as_dense(&self) -> Option<&dense::Model> {
        None
    }

    /// The mixture-of-experts model behind this one (mixtral, qwen3_moe and the other rows of
    /// `moe.rs`), read-only, for decoders that run the model's own arrays; `None` elsewhere.
    fn as_moe(&self) -> Option<&moe::Model> {
        None
    }

    /// [`LanguageModel::as_dense`], mutable: AWQ (`crate::awq`) runs its layers' parts and
    /// rewrites their weights in place.
    fn as_dense_mut(&mut self) -> Option<&mut dense::Model> {
        None
    }

    /// The decode step cut into compilable segments ([`SegmentedDecode`]); `None` where the
    /// architecture (or this model's variant of it) does not support it.
    fn segmented(&self) -> Option<&dyn SegmentedDecode> {
        None
    }

    /// The checkpoint's multi-token-prediction layers, when they were loaded
    /// (`Weights::with_mtp`); `None` otherwise.
    fn mtp(&self) -> Option<&dyn MtpHead> {
        None
    }
}

/// Training's access to a model's parameters, apart from inference ([`LanguageModel`] reaches
/// it through [`LanguageModel::as_trainable_mut`]): the linears adapters wrap, every array of
/// the decoder layers (full fine-tuning, the quantizers), the modules outside the layers, and
/// gradient checkpointing. Ports give the per-layer lists from their layers' one walk
/// ([`crate::layers::Walk`], `kit::walked_layers!`).
pub trait Trainable {
    /// The linears and switch (per-expert) linears of each decoder layer (`model.layers`),
    /// under their path inside the layer as mlx-lm names the modules (`self_attn.q_proj`), in
    /// the order the Python module declares them; adapters (LoRA, DoRA) wrap or replace them
    /// in place. Empty when the architecture does not support adapters. Ports give it from
    /// their layers' walk ([`crate::layers::Walk`]).
    fn layer_adaptables_mut(&mut self) -> Vec<Vec<(String, LinearMut<'_>)>> {
        Vec::new()
    }

    /// The modules outside the decoder layers that adapters can wrap (an untied `lm_head`,
    /// the input embedding), under their full mlx-lm module path, in the order mlx-lm's
    /// `model.named_modules()` lists them (`lm_head` before `model.embed_tokens`), which is
    /// the order `linear_to_lora_layers` converts them when a LoRA config's `keys` names
    /// them. Empty by default.
    fn top_modules_mut(&mut self) -> Vec<(String, TopModuleMut<'_>)> {
        Vec::new()
    }

    /// The module path of the decoder layers (`model.layers`; qwen3_5's
    /// `language_model.model.layers`): adapter parameters are named under it.
    fn layers_path(&self) -> String {
        "model.layers".into()
    }

    /// Every parameter array of each decoder layer (`model.layers`) under its full mlx-lm
    /// name, as mlx-lm stores it, for full fine-tuning, which reads and replaces them in
    /// place. Empty when the architecture does not support it (every model here does); an
    /// error when a layer is adapted.
    fn layer_parameters_mut(&mut self) -> Result<Vec<Vec<LayerParam<'_>>>> {
        Ok(Vec::new())
    }

    /// Recompute each decoder layer in the backward pass instead of keeping its
    /// activations (mlx-lm's `grad_checkpoint`, applied to every layer). Adapter
    /// parameters enter each checkpoint as inputs, so their gradients are unchanged.
    /// Returns whether the architecture supports it.
    fn set_grad_checkpoint(&mut self, _on: bool) -> bool {
        false
    }

    /// Under [`Trainable::set_grad_checkpoint`], the layers whose own arrays train
    /// (full fine-tuning): each of their checkpoints takes those arrays as inputs too, as
    /// mlx-lm's `checkpoint(inner_fn)(layer.trainable_parameters(), ...)` does. Returns
    /// whether the architecture supports it.
    fn set_checkpoint_layer_params(&mut self, _layers: std::ops::Range<usize>) -> bool {
        false
    }
}

/// Multi-token-prediction layers (DeepSeek V3 / GLM-4.5 `num_nextn_predict_layers`,
/// Qwen3-Next `mtp.*`): each predicts the token after next from a hidden state and the next
/// token, so chained they draft tokens for speculative decoding. Not part of mlx-lm (its
/// `sanitize` drops them): loading them is opt-in.
pub trait MtpHead {
    /// How many layers there are.
    fn depth(&self) -> usize;

    /// Fresh caches, one per layer.
    fn make_mtp_cache(&self) -> Vec<Box<dyn Cache>>;

    /// Layer `k` over `hidden` `(1, n, hidden)` (the target's final normed hidden states, or
    /// this head's previous output) and `tokens` `(1, n)` (the token after each of those
    /// positions), appending to its `cache`: the logits `(1, n, vocab)` for the token after
    /// each of `tokens`, and the layer's hidden output `(1, n, hidden)` (the next step's
    /// `hidden`).
    fn mtp_forward(
        &self,
        k: usize,
        hidden: &Array,
        tokens: &Array,
        cache: &mut Box<dyn Cache>,
    ) -> Result<(Array, Array)>;
}

/// The untied `lm_head` ([`project`]'s `lm_head`): `None` with tied embeddings, else the
/// `lm_head` linear of `hidden` inputs and `vocab` outputs, without a bias.
pub(crate) fn load_lm_head(
    w: &mut crate::weights::Weights,
    tied: bool,
    hidden: i32,
    vocab: i32,
) -> Result<Option<Linear>> {
    if tied {
        return Ok(None);
    }
    Ok(Some(Linear::load(w, "lm_head", hidden, vocab, false)?))
}

/// `lm_head(h)`, or with tied embeddings `embed_tokens.as_linear(h)`: the head every
/// architecture ends with.
pub(crate) fn project(lm_head: Option<&Linear>, embed: &Embedding, h: &Array) -> Result<Array> {
    match lm_head {
        Some(head) => head.forward(h),
        None => embed.as_linear(h),
    }
}

/// A model's output projection: its own `lm_head`, or the tied input embedding; or one of
/// those with the scaling and soft-capping the model applies around it.
#[derive(Clone, Debug)]
pub enum OutputHead {
    Linear(Linear),
    Tied(Embedding),
    /// `inner(h / pre_div)` (MiniCPM divides before an untied head), then `post` in order.
    Shaped {
        inner: Box<OutputHead>,
        pre_div: Option<f32>,
        post: Vec<LogitTransform>,
    },
}

/// A module outside the decoder layers (see [`Trainable::top_modules_mut`]).
pub enum TopModuleMut<'a> {
    Linear(&'a mut Linear),
    Embedding(&'a mut Embedding),
}

/// The untied head, if any, then the input embedding, under `prefix` (mlx-lm's order).
pub(crate) fn head_and_embedding<'a>(
    prefix: &str,
    lm_head: Option<&'a mut Linear>,
    head_name: &str,
    embed: &'a mut Embedding,
    embed_name: &str,
) -> Vec<(String, TopModuleMut<'a>)> {
    let mut out = Vec::new();
    if let Some(h) = lm_head {
        out.push((format!("{prefix}{head_name}"), TopModuleMut::Linear(h)));
    }
    out.push((
        format!("{prefix}{embed_name}"),
        TopModuleMut::Embedding(embed),
    ));
    out
}

/// One step after a head's projection, in the model's own ops.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LogitTransform {
    /// `logits * s`.
    Mul(f32),
    /// `logits / s`.
    Div(f32),
    /// `cap * tanh(logits / cap)` as one compiled function (mlx-lm's `logit_softcap`).
    SoftcapCompiled(f64),
    /// `tanh(logits / cap) * cap` in plain ops.
    Softcap(f32),
}

impl LogitTransform {
    fn apply(self, x: &Array) -> Result<Array> {
        Ok(match self {
            LogitTransform::Mul(s) => (x * s)?,
            LogitTransform::Div(s) => (x / s)?,
            LogitTransform::SoftcapCompiled(cap) => crate::layers::logit_softcap(cap, x)?,
            LogitTransform::Softcap(cap) => crate::layers::softcap(x, cap)?,
        })
    }
}

impl OutputHead {
    /// What [`project`] multiplies by.
    pub(crate) fn of(lm_head: Option<&Linear>, embed: &Embedding) -> OutputHead {
        match lm_head {
            Some(head) => OutputHead::Linear(head.clone()),
            None => OutputHead::Tied(embed.clone()),
        }
    }

    pub fn forward(&self, h: &Array) -> Result<Array> {
        match self {
            OutputHead::Linear(l) => l.forward(h),
            OutputHead::Tied(e) => e.as_linear(h),
            OutputHead::Shaped {
                inner,
                pre_div,
                post,
            } => {
                let mut out = match pre_div {
                    Some(d) => inner.forward(&(h / *d)?)?,
                    None => inner.forward(h)?,
                };
                for t in post {
                    out = t.apply(&out)?;
                }
                Ok(out)
            }
        }
    }
}

//! MiMo's multi-token-prediction layers (`model.mtp_layers.{k}`), loaded only under `--mtp`
//! (mlx-lm's `mimo.py` `sanitize` drops them). The layout is the MiMo checkpoint's
//! (`modeling_mimo.py`'s `MiMoMTPLayers`): `input_proj([hidden_layernorm(h),
//! token_layernorm(embed(t))])` (the hidden state first, the reverse of DeepSeek's `eh_proj`),
//! a decoder block of the main model's shape under the same prefix (`input_layernorm`,
//! `self_attn`, `post_attention_layernorm`, `mlp`), then `final_layernorm`; the logits come
//! from the model's own head.

use mlx_cache::Cache;
use mlx_core::prelude::*;

use super::{Ctx, Model, TransformerBlock};
use crate::error::{ModelError, Result};
use crate::layers::{Linear, Norm};
use crate::models::descriptor::Descriptor;
use crate::models::kit;
use crate::weights::Weights;

/// One multi-token-prediction layer.
#[derive(Clone)]
pub(super) struct MtpLayer {
    token_norm: Norm,
    hidden_norm: Norm,
    input_proj: Linear,
    block: TransformerBlock,
    final_norm: Norm,
}

/// The row's multi-token-prediction layers when `--mtp` asked for them (none otherwise): every
/// `{mtp_layers}.{k}` with an `input_proj`, from `k = 0` on. Asked for on a checkpoint that has
/// none, an error naming the tensor looked for.
pub(super) fn load(d: &Descriptor, w: &mut Weights) -> Result<Vec<MtpLayer>> {
    let Some(prefix) = d.mtp_layers.filter(|_| w.mtp()) else {
        return Ok(Vec::new());
    };
    let proj = |k: usize| format!("{prefix}.{k}.input_proj");
    let has = |w: &Weights, k: usize| w.contains(&format!("{}.weight", proj(k)));
    let count = (0..).take_while(|&k| has(w, k)).count();
    if count == 0 {
        return Err(ModelError::Config(format!(
            "--mtp: the checkpoint has no `{}.weight`: it carries no multi-token-prediction \
             layers",
            proj(0)
        )));
    }
    let (dim, eps) = (d.hidden_size, d.norm_eps);
    (0..count)
        .map(|k| {
            let p = format!("{prefix}.{k}");
            let norm = |w: &mut Weights, name: &str| {
                Norm::load(w, &format!("{p}.{name}"), d.norm, dim, eps)
            };
            Ok(MtpLayer {
                token_norm: norm(w, "token_layernorm")?,
                hidden_norm: norm(w, "hidden_layernorm")?,
                input_proj: Linear::load(w, &proj(k), 2 * dim, dim, false)?,
                // Shaped as a layer past the stack: no per-layer sliding or NoPE flag applies.
                block: TransformerBlock::load_at(d, w, d.num_layers as usize, &p)?,
                final_norm: norm(w, "final_layernorm")?,
            })
        })
        .collect()
}

impl crate::models::MtpHead for Model {
    fn depth(&self) -> usize {
        self.mtp.len()
    }

    fn make_mtp_cache(&self) -> Vec<Box<dyn Cache>> {
        kit::kv_caches(self.mtp.len())
    }

    /// The hidden output handed on is `final_layernorm`'s, what the layer returns in MiMo's
    /// code (and what its head reads), as the main model hands on its final normed states.
    fn mtp_forward(
        &self,
        k: usize,
        hidden: &Array,
        tokens: &Array,
        cache: &mut Box<dyn Cache>,
    ) -> Result<(Array, Array)> {
        let l = kit::mtp_layer(&self.mtp, k)?;
        kit::check_inputs(tokens)?;
        let e = self.embed_tokens.forward(tokens)?;
        let x = ops::concatenate(
            &[&l.hidden_norm.forward(hidden)?, &l.token_norm.forward(&e)?],
            -1,
            None,
        )?;
        let x = l.input_proj.forward(&x)?;
        let n = x.dim(1)? as usize;
        let mask = cache.make_mask(n, None, self.desc.mask_as_array)?;
        let ctx = Ctx {
            mask: &mask,
            query_scale: None,
            layer: self.layers.len(),
            trace: None,
        };
        let h = l.block.forward(&x, &ctx, Some(cache))?;
        let out = l.final_norm.forward(&h)?;
        Ok((self.head(&out)?, out))
    }
}

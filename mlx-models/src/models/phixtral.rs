//! mlx-lm 0.32.2 `models/phixtral.py`: Phi-2 parallel blocks (one LayerNorm feeding both the
//! attention and the experts, `attn + moe + x`) whose MLP is a mixture of Phi-2 MLPs
//! ([`SwitchMlp`] with biases, routed by the shared block's [`Router::TopKThenSoftmax`]). The
//! attention has a fused `Wqkv` with bias, a partial rope (`rotary_dim`), and float32 queries;
//! the head is a LayerNorm and a linear with bias. Inference only (no adapters or full
//! fine-tuning).

use mlx_cache::Cache;
use mlx_core::prelude::*;
use serde::Deserialize;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::{scaled_dot_product_attention, Embedding, LayerNorm, Linear, Rope, SwitchMlp};
use crate::models::moe_block::Router;
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

serde_defaults! {
    d_vocab: i32 = 51200;
    d_dim: i32 = 2560;
    d_heads: i32 = 32;
    d_layers: i32 = 32;
    d_rotary: i32 = 32;
    d_per_tok: i32 = 2;
    d_experts: i32 = 4;
}

/// phixtral.py `ModelArgs`.
#[derive(Clone, Debug, Deserialize)]
pub struct ModelArgs {
    pub model_type: String,
    #[serde(default = "d_vocab")]
    pub num_vocab: i32,
    #[serde(default = "d_dim")]
    pub model_dim: i32,
    #[serde(default = "d_heads")]
    pub num_heads: i32,
    #[serde(default = "d_layers")]
    pub num_layers: i32,
    #[serde(default = "d_rotary")]
    pub rotary_dim: i32,
    #[serde(default = "d_per_tok")]
    pub num_experts_per_tok: i32,
    #[serde(default = "d_experts")]
    pub num_local_experts: i32,
}

struct Block {
    ln: LayerNorm,
    wqkv: Linear,
    out_proj: Linear,
    gate: Linear,
    switch_mlp: SwitchMlp,
}

pub struct Model {
    args: ModelArgs,
    wte: Embedding,
    blocks: Vec<Block>,
    rope: Rope,
    head_ln: LayerNorm,
    head: Linear,
}

const EPS: f32 = 1e-5;

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let args: ModelArgs = config.args()?;
        let bad = |m: String| ModelError::Config(format!("config.json (`phixtral`): {m}"));
        kit::check_positive(
            "phixtral",
            &[
                ("num_vocab", args.num_vocab),
                ("model_dim", args.model_dim),
                ("num_heads", args.num_heads),
                ("num_layers", args.num_layers),
                ("rotary_dim", args.rotary_dim),
                ("num_experts_per_tok", args.num_experts_per_tok),
                ("num_local_experts", args.num_local_experts),
            ],
        )?;
        let (d, h, e) = (args.model_dim, args.num_heads, args.num_local_experts);
        if d % h != 0 {
            return Err(bad(format!(
                "field `model_dim` {d} must divide by `num_heads` {h}"
            )));
        }
        if args.num_experts_per_tok > e {
            return Err(bad(format!(
                "field `num_experts_per_tok` {} exceeds the {e} experts",
                args.num_experts_per_tok
            )));
        }
        if args.rotary_dim > d / h {
            return Err(bad(format!(
                "field `rotary_dim` {} exceeds the head size {}",
                args.rotary_dim,
                d / h
            )));
        }
        sanitize(&args, w)?;
        let mut blocks = Vec::with_capacity(args.num_layers as usize);
        for i in 0..args.num_layers {
            let p = |s: &str| format!("transformer.h.{i}.{s}");
            blocks.push(Block {
                ln: LayerNorm::load(w, &p("ln"), d, EPS, true, true)?,
                wqkv: Linear::load(w, &p("mixer.Wqkv"), d, 3 * d, true)?,
                out_proj: Linear::load(w, &p("mixer.out_proj"), d, d, true)?,
                gate: Linear::load(w, &p("moe.gate"), d, e, false)?,
                switch_mlp: SwitchMlp::load(w, &p("moe.switch_mlp"), d, 4 * d, e, true)?,
            });
        }
        Ok(Model {
            wte: Embedding::load(w, "transformer.embd.wte", args.num_vocab, d)?,
            blocks,
            rope: Rope::initialize(args.rotary_dim, 10000.0, false, None, None)?,
            head_ln: LayerNorm::load(w, "lm_head.ln", d, EPS, true, true)?,
            head: Linear::load(w, "lm_head.linear", d, args.num_vocab, true)?,
            args,
        })
    }

    fn attention(
        &self,
        b: &Block,
        x: &Array,
        mask: &mlx_cache::AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        let h = self.args.num_heads;
        let qkv = ops::split_equal(&b.wqkv.forward(x)?, 3, -1, None)?;
        let queries = kit::split_heads(&qkv[0], h)?;
        let keys = kit::split_heads(&qkv[1], h)?;
        let values = kit::split_heads(&qkv[2], h)?;
        let dtype = values.dtype();
        let offset = cache.as_ref().map_or(0, |c| c.offset());
        let queries = self.rope.forward(&queries, offset)?;
        let kv = kit::cached_kv(cache, self.rope.forward(&keys, offset)?, values)?;
        let queries = queries.astype(Dtype::Float32)?;
        let head_dim = queries.shape().last().copied().unwrap_or(1);
        // `math.sqrt(1 / queries.shape[-1])` in double, passed as a float.
        let scale = (1.0 / f64::from(head_dim)).sqrt() as f32;
        let out = scaled_dot_product_attention(&queries, &kv, scale, mask, None)?;
        b.out_proj.forward(&kit::merge_heads(&out.astype(dtype)?)?)
    }

    /// `MOE.__call__`: the block's [`Router::TopKThenSoftmax`] (mixtral's rule: the top-k gate
    /// logits, softmaxed precisely) weighting each expert's MLP. The experts are GELU
    /// [`SwitchMlp`]s (`fc1`, `fc2`), which `SparseMoe`'s SwiGLU experts are not.
    fn moe(&self, b: &Block, x: &Array) -> Result<Array> {
        let gates = b.gate.forward(x)?;
        let k = self.args.num_experts_per_tok;
        let (inds, scores, _) = Router::TopKThenSoftmax.select(&gates, k, None, x)?;
        let y = b.switch_mlp.forward(x, &inds)?;
        let y = (&y * &ops::expand_dims(&scores, &[-1], None)?)?;
        Ok(ops::sum(&y, &[-2], false, None)?)
    }

    fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        let n = kit::new_positions(inputs, caches.as_deref(), self.blocks.len(), "layers")?;
        let mut caches = caches;
        let mask = kit::cache_mask(caches.as_deref(), 0, n, None, false)?;
        let mut x = self.wte.forward(inputs)?;
        for (i, b) in self.blocks.iter().enumerate() {
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            let h = b.ln.forward(&x)?;
            let attn_h = self.attention(b, &h, &mask, cache)?;
            let ff_h = self.moe(b, &h)?;
            x = (&(&attn_h + &ff_h)? + &x)?;
        }
        self.head_ln.forward(&x)
    }

    /// `lm_head.linear` (its LayerNorm ends `hidden_states`).
    fn head(&self, h: &Array) -> Result<Array> {
        self.head.forward(h)
    }
}

/// `sanitize`: per-expert `moe.mlp.<e>.fc1/fc2` stacked into `moe.switch_mlp` when the first
/// layer's first expert is stored that way.
fn sanitize(args: &ModelArgs, w: &mut Weights) -> Result<()> {
    if !w.contains("transformer.h.0.moe.mlp.0.fc1.weight") {
        return Ok(());
    }
    for l in 0..args.num_layers {
        let prefix = format!("transformer.h.{l}.moe");
        kit::stack_experts(
            w,
            &format!("{prefix}.mlp"),
            &format!("{prefix}.switch_mlp"),
            args.num_local_experts,
            &[("fc1", "fc1"), ("fc2", "fc2")],
            &["weight", "scales", "biases", "bias"],
        )?;
    }
    Ok(())
}

impl LanguageModel for Model {
    kit::short_port_entry_points!(args, num_vocab);

    fn make_cache(&self) -> Vec<Box<dyn Cache>> {
        kit::kv_caches(self.blocks.len())
    }

    fn defines_make_cache(&self) -> bool {
        false
    }

    fn num_layers(&self) -> usize {
        self.blocks.len()
    }
}

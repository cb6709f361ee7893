//! mlx-lm 0.32.2 `models/dbrx.py`: a fused, clipped `Wqkv` attention between bias-free
//! LayerNorms, and experts kept as a list of SwiGLU MLPs (`v1`, `w1`, `w2`) that inference
//! runs token by token, as mlx-lm does (no `SwitchGLU`: each chosen expert's MLP on the
//! token's vector, stacked, weighted by the L1-normalized float32 softmax scores).
//!
//! The router is the shared block's ([`Router::SoftmaxL1`]); the experts stay here, not in a
//! `SparseMoe`: mlx-lm's `SparseMoeBlock.__call__` (inference) loops over the tokens and
//! calls each chosen expert's own `nn.Linear`s on the token's vector (`matmul` of a vector,
//! or `quantized_matmul` of each expert's separately quantized weight), where a `SwitchGLU`
//! would run one `gather_mm` / `gather_qmm` over stacked weights: other kernels, so other
//! bits, and other parameter names (`ffn.experts.<e>.v1`, what adapters and converted
//! checkpoints name).

use mlx_cache::{AttentionMask, Cache};
use mlx_core::prelude::*;
use serde::Deserialize;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::{scaled_dot_product_attention, swiglu, Embedding, LayerNorm, Linear, Rope};
use crate::models::moe_block::Router;
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

/// dbrx.py `ModelArgs` (every field required; the two configs read by key).
#[derive(Clone, Debug, Deserialize)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub d_model: i32,
    pub ffn_config: serde_json::Map<String, serde_json::Value>,
    pub attn_config: serde_json::Map<String, serde_json::Value>,
    pub n_layers: i32,
    pub n_heads: i32,
}

/// A number a sub-config must hold.
fn need(map: &serde_json::Map<String, serde_json::Value>, cfg: &str, key: &str) -> Result<f64> {
    map.get(key)
        .and_then(|v| v.as_f64())
        .ok_or_else(|| ModelError::Config(format!("dbrx: `{cfg}.{key}` must be a number")))
}

#[derive(Clone)]
struct Expert {
    v1: Linear,
    w1: Linear,
    w2: Linear,
}

#[derive(Clone)]
struct Block {
    norm_1: LayerNorm,
    norm_2: LayerNorm,
    wqkv: Linear,
    out_proj: Linear,
    router: Linear,
    experts: Vec<Expert>,
}

/// The DBRX model.
pub struct Model {
    args: ModelArgs,
    head_dim: i32,
    kv_heads: i32,
    clip_qkv: f32,
    top_k: i32,
    rope: Rope,
    wte: Embedding,
    blocks: Vec<Block>,
    norm_f: LayerNorm,
    lm_head: Linear,
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let args: ModelArgs = config.args()?;
        let (d, heads) = (args.d_model, args.n_heads);
        if d <= 0 || heads <= 0 || d % heads != 0 || args.n_layers <= 0 || args.vocab_size <= 0 {
            return Err(ModelError::Config(format!(
                "dbrx: d_model {d}, n_heads {heads}, n_layers {} and vocab_size {} must be \
                 positive, d_model a multiple of n_heads",
                args.n_layers, args.vocab_size
            )));
        }
        let head_dim = d / heads;
        let kv_heads = need(&args.attn_config, "attn_config", "kv_n_heads")? as i32;
        let clip_qkv = need(&args.attn_config, "attn_config", "clip_qkv")? as f32;
        let theta = need(&args.attn_config, "attn_config", "rope_theta")?;
        let ffn = need(&args.ffn_config, "ffn_config", "ffn_hidden_size")? as i32;
        let num_experts = need(&args.ffn_config, "ffn_config", "moe_num_experts")? as i32;
        let top_k = need(&args.ffn_config, "ffn_config", "moe_top_k")? as i32;
        if kv_heads <= 0 || heads % kv_heads != 0 || ffn <= 0 || num_experts <= 0 {
            return Err(ModelError::Config(format!(
                "dbrx: kv_n_heads {kv_heads} must divide n_heads {heads}; ffn_hidden_size \
                 {ffn} and moe_num_experts {num_experts} must be positive"
            )));
        }
        if top_k <= 0 || top_k > num_experts {
            return Err(ModelError::Config(format!(
                "dbrx: moe_top_k {top_k} must be within 1..={num_experts}"
            )));
        }
        sanitize(w, num_experts)?;
        let mut blocks = Vec::with_capacity(args.n_layers as usize);
        for i in 0..args.n_layers {
            let p = format!("transformer.blocks.{i}");
            let nan = format!("{p}.norm_attn_norm");
            let experts = (0..num_experts)
                .map(|e| -> Result<Expert> {
                    let q = format!("{p}.ffn.experts.{e}");
                    Ok(Expert {
                        v1: Linear::load(w, &format!("{q}.v1"), d, ffn, false)?,
                        w1: Linear::load(w, &format!("{q}.w1"), d, ffn, false)?,
                        w2: Linear::load(w, &format!("{q}.w2"), ffn, d, false)?,
                    })
                })
                .collect::<Result<_>>()?;
            blocks.push(Block {
                norm_1: LayerNorm::load(w, &format!("{nan}.norm_1"), d, 1e-5, true, false)?,
                norm_2: LayerNorm::load(w, &format!("{nan}.norm_2"), d, 1e-5, true, false)?,
                wqkv: Linear::load(
                    w,
                    &format!("{nan}.attn.Wqkv"),
                    d,
                    (kv_heads * 2 + heads) * head_dim,
                    false,
                )?,
                out_proj: Linear::load(w, &format!("{nan}.attn.out_proj"), d, d, false)?,
                router: Linear::load(w, &format!("{p}.ffn.router.layer"), d, num_experts, false)?,
                experts,
            });
        }
        Ok(Model {
            head_dim,
            kv_heads,
            clip_qkv,
            top_k,
            rope: Rope::initialize(head_dim, theta, false, None, None)?,
            wte: Embedding::load(w, "transformer.wte", args.vocab_size, d)?,
            blocks,
            norm_f: LayerNorm::load(w, "transformer.norm_f", d, 1e-5, true, false)?,
            lm_head: Linear::load(w, "lm_head", d, args.vocab_size, false)?,
            args,
        })
    }
}

/// dbrx.py `sanitize`: HF's `ffn.experts.mlp.{v1,w1,w2}` (experts stacked along rows) split
/// into `ffn.experts.<e>.<name>.weight`, `w2` transposed.
fn sanitize(w: &mut Weights, num_experts: i32) -> Result<()> {
    for k in w.names() {
        if !k.contains("experts.mlp") {
            continue;
        }
        let Some(v) = w.remove(&k) else { continue };
        let parts = ops::split_equal(&v, num_experts, 0, None)?;
        for (e, part) in parts.into_iter().enumerate() {
            let name = format!("{}.weight", k.replace(".mlp", &format!(".{e}")));
            let part = if k.ends_with("w2") {
                ops::transpose(&part, &[1, 0], None)?
            } else {
                part
            };
            w.insert(name, part);
        }
    }
    Ok(())
}

impl Block {
    fn attention(
        &self,
        m: &Model,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        let d = m.args.d_model;
        let qkv = self.wqkv.forward(x)?;
        let qkv = ops::clip_scalar(
            &qkv,
            Some(Scalar::from(-m.clip_qkv)),
            Some(Scalar::from(m.clip_qkv)),
            None,
        )?;
        let parts = ops::split_at(&qkv, &[d, d + m.head_dim * m.kv_heads], -1, None)?;
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let heads = |y: &Array, n: i32| -> Result<Array> {
            Ok(ops::transpose(
                &ops::reshape(y, &[b, l, n, -1], None)?,
                &[0, 2, 1, 3],
                None,
            )?)
        };
        let queries = heads(&parts[0], m.args.n_heads)?;
        let keys = heads(&parts[1], m.kv_heads)?;
        let values = heads(&parts[2], m.kv_heads)?;
        let (queries, kv) = match cache {
            Some(c) => {
                let offset = c.offset();
                let q = m.rope.forward(&queries, offset)?;
                let k = m.rope.forward(&keys, offset)?;
                (q, c.update_and_fetch(&k, &values)?)
            }
            None => (
                m.rope.forward(&queries, 0)?,
                mlx_cache::Kv::Dense {
                    keys: m.rope.forward(&keys, 0)?,
                    values,
                },
            ),
        };
        let scale = f64::from(m.head_dim).powf(-0.5) as f32;
        let out = scaled_dot_product_attention(&queries, &kv, scale, mask, None)?;
        let out = ops::reshape(
            &ops::transpose(&out, &[0, 2, 1, 3], None)?,
            &[b, l, -1],
            None,
        )?;
        self.out_proj.forward(&out)
    }

    /// `SparseMoeBlock.__call__` in inference: the router on the flattened tokens, then each
    /// token through its chosen experts one by one.
    fn experts(&self, m: &Model, x: &Array) -> Result<Array> {
        let shape = x.shape();
        let d = shape.last().copied().unwrap_or(0);
        let x = ops::reshape(x, &[-1, d], None)?;
        let k = m.top_k;
        let (inds, scores, _) = Router::SoftmaxL1.select(&self.router.forward(&x)?, k, None, &x)?;
        let ids = inds.astype(Dtype::Int32)?.to_vec::<i32>()?;
        let n = x.shape()[0];
        let mut rows = Vec::with_capacity(n as usize);
        for t in 0..n {
            let xt = ops::squeeze(&ops::slice_axis(&x, 0, t, t + 1, None)?, &[0], None)?;
            let st = ops::squeeze(&ops::slice_axis(&scores, 0, t, t + 1, None)?, &[0], None)?;
            let mut outs = Vec::with_capacity(k as usize);
            for j in 0..k {
                let e = ids[(t * k + j) as usize];
                let ex = usize::try_from(e)
                    .ok()
                    .and_then(|e| self.experts.get(e))
                    .ok_or_else(|| ModelError::Input {
                        what: "dbrx".into(),
                        problem: format!("expert {e} out of range"),
                    })?;
                let h = swiglu(&ex.w1.forward(&xt)?, &ex.v1.forward(&xt)?)?;
                outs.push(ex.w2.forward(&h)?);
            }
            let refs: Vec<&Array> = outs.iter().collect();
            let yt = ops::stack(&refs, -1, None)?;
            rows.push(ops::sum(&(&yt * &st)?, &[-1], false, None)?);
        }
        let refs: Vec<&Array> = rows.iter().collect();
        Ok(ops::reshape(&ops::stack(&refs, 0, None)?, &shape, None)?)
    }

    fn forward(
        &self,
        m: &Model,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        let h = self.attention(m, &self.norm_1.forward(x)?, mask, cache)?;
        let r = (&h + x)?;
        let h = self.norm_2.forward(&r)?;
        Ok((&self.experts(m, &h)? + &r)?)
    }
}

impl Model {
    /// The final normed hidden states `(batch, seq, d_model)`.
    pub fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        let (mut h, n) = kit::embed_inputs(inputs, &self.wte)?;
        let mut caches = caches;
        kit::check_caches(caches.as_deref(), self.blocks.len(), "layers")?;
        let mask = kit::cache_mask(caches.as_deref(), 0, n, None, false)?;
        for (i, block) in self.blocks.iter().enumerate() {
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            h = block.forward(self, &h, &mask, cache)?;
        }
        self.norm_f.forward(&h)
    }
}

impl LanguageModel for Model {
    fn forward(&self, inputs: &Array, caches: Option<&mut [Box<dyn Cache>]>) -> Result<Array> {
        self.lm_head.forward(&self.hidden_states(inputs, caches)?)
    }

    fn forward_hidden(&self, inputs: &Array) -> Option<Result<Array>> {
        Some(self.hidden_states(inputs, None))
    }

    fn output_head(&self) -> Option<crate::models::OutputHead> {
        Some(crate::models::OutputHead::Linear(self.lm_head.clone()))
    }

    fn make_cache(&self) -> Vec<Box<dyn Cache>> {
        kit::kv_caches(self.blocks.len())
    }

    fn defines_make_cache(&self) -> bool {
        false
    }

    fn num_layers(&self) -> usize {
        self.blocks.len()
    }

    kit::own_type_and_vocab!(args);

    fn as_trainable_mut(&mut self) -> Option<&mut dyn super::Trainable> {
        Some(self)
    }
}

impl super::Trainable for Model {
    fn layers_path(&self) -> String {
        "transformer.blocks".into()
    }
}

//! The GPU graph decoder as an engine backend: [`mlx_kernels::graph_decode::GraphDecoder`]
//! driven by the loaded model.
//!
//! [`map_model`] builds the decoder's [`GraphSpec`] from the model's descriptor row and its
//! [`GraphWeights`] from the arrays the one loader ([`crate::load`]) produced (clones of
//! their handles: nothing is read from disk again and no array is copied on the host; the
//! decoder lays them out on the device). [`model_unsupported`] says why a model cannot take
//! it, and [`crate::generate::graph_decode_unsupported`] why a model with a set of options
//! cannot, which `--decoder auto` prints when it falls back.
//!
//! What it covers: dense descriptor rows with pre-norm blocks, RMSNorm, separate q/k/v
//! projections with or without biases, RoPE from the model's own rope (a base with linear
//! scaling, or a frequency table: llama3, yarn with its `mscale`, longrope), layers without
//! RoPE (SmolLM3), grouped-query or multi-query attention with the row's own softmax scale,
//! SwiGLU, a tied or untied head, per-head q/k RMSNorm before RoPE (Qwen 3, Gemma 3) or over
//! the whole q and k projections (OLMo 2), fused q/k/v and gate/up projections split by rows
//! into views (phi3); Gemma's `1 + w` RMSNorms, sandwich norms (or OLMo 2's post norms alone),
//! GeGLU (`gelu_approx`), embedding scale, sliding-window layers with their own RoPE,
//! attention and logit soft-caps; granite's residual multiplier and logits scaling (its
//! embedding and attention multipliers are the embedding scale and the softmax scale);
//! bfloat16 weights or MLX affine 4/8-bit weights with bfloat16 scales (groups of 32, 64,
//! 128); greedy decoding of one sequence. Rows: llama, mistral, qwen2, qwen3, smollm3, phi3,
//! granite, gemma2, gemma3_text, olmo2 without its optional biases (and the other rows these
//! knobs describe: exaone4, olmo3). The rest give a reason.
//!
//! Mixture-of-experts rows ([`mlx_models::models::moe`]: qwen3_moe and mixtral, and the rows
//! with their knobs) map through [`map_moe`]: the same attention, and in each layer with
//! experts the router (softmax then top-k, optionally renormalised, or top-k then softmax), the
//! experts' stacked SwiGLU projections as the model holds them (bfloat16 or affine, the router
//! in its own quantization: mlx-lm's convert keeps qwen3_moe's at 8 bits), decoded one sequence
//! a step. gpt_oss maps too (attention sinks, biased q/k/v and o projections and router,
//! experts with biases and the clamped SwiGLU, mxfp4 experts, sliding and full layers), behind
//! [`GPT_OSS_ENV`] for `--decoder auto` until a device has run it. Shared experts and grouped
//! or other biased routers give a reason.

use mlx_core::Dtype;
pub use mlx_kernels::graph_decode::BuildTimes;
use mlx_kernels::graph_decode::GraphTrellis;
use mlx_kernels::graph_decode::{GraphLayer, GraphLinear, GraphRope, GraphSpec, GraphWeights};
use mlx_kernels::graph_decode::{GraphMoe, GraphRouter};
use mlx_models::layers::SwitchLinear;
use mlx_models::layers::{Embedding, Linear, MlpKind, Norm, NormKind, Rope, SwitchActivation};
use mlx_models::models::dense::Model;
use mlx_models::models::descriptor::{EmbedScale, LogitScale, Placement, QkNorm};
use mlx_models::models::moe::{self, MoeFfnView, Router};
use mlx_models::LanguageModel;

/// Why the graph decoder does not take a model ([`map_model`]'s error): its text is the reason
/// `--decoder auto` prints when it falls back.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum GraphGap {
    /// A dedicated port, not a dense descriptor row.
    #[error("`{model_type}` is a dedicated port, not a dense descriptor row")]
    DedicatedPort { model_type: String },
    /// A setting of the descriptor row the decoder does not implement.
    #[error("`{model_type}`: {setting} is not in the graph decoder yet")]
    Setting { model_type: String, setting: String },
    /// A layer the decoder cannot take (missing, laid out otherwise, its RoPE): the problem.
    #[error("`{model_type}`: layer {layer} {problem}")]
    Layer {
        model_type: String,
        layer: usize,
        problem: String,
    },
    /// A weight or norm the decoder cannot take: which (`lm_head`, `` `llama`: layer 3
    /// q_proj``) and the problem.
    #[error("{part}: {problem}")]
    Part { part: String, problem: String },
}

fn part(part: &str, problem: impl Into<String>) -> GraphGap {
    GraphGap::Part {
        part: part.into(),
        problem: problem.into(),
    }
}

/// The decoder's description of `model` and the model's own arrays, or why the model is not
/// one the decoder runs (the descriptor's knobs; the kernels' own limits, such as the head
/// size and the dtypes, are [`GraphSpec::check`] and [`GraphWeights::check`]).
pub fn map_model(model: &dyn LanguageModel) -> Result<(GraphSpec, GraphWeights), GraphGap> {
    if let Some(m) = model.as_moe() {
        return map_moe(m);
    }
    let Some(m) = model.as_dense() else {
        return Err(GraphGap::DedicatedPort {
            model_type: model.model_type().to_string(),
        });
    };
    let mut spec = map_descriptor(m)?;
    let weights = map_weights(m, &mut spec)?;
    Ok((spec, weights))
}

fn map_descriptor(m: &Model) -> Result<GraphSpec, GraphGap> {
    let d = m.descriptor();
    let t = &d.model_type;
    let no = |what: &str| {
        Err(GraphGap::Setting {
            model_type: t.clone(),
            setting: what.into(),
        })
    };
    let layer = |i: usize, problem: &str| GraphGap::Layer {
        model_type: t.clone(),
        layer: i,
        problem: problem.into(),
    };
    // Pre-norm blocks, Gemma's sandwich (pre and post norms around attention and MLP), or
    // OLMo 2's post norms alone (the sandwich's post norms, no pre-norms).
    let (sandwich, post_only) = match d.placement {
        Placement::Pre => (false, false),
        Placement::Sandwich if d.post_norm_offsets.is_none() => (true, false),
        Placement::PostOnly => (true, true),
        p => return no(&format!("norm placement {p:?}")),
    };
    // RMSNorm, or Gemma's `rms_norm(x, 1 + w)` (the `1 + w` is added to the weights as the
    // model adds it: `map_weights`).
    if !matches!(d.norm, NormKind::Rms | NormKind::RmsOffset) {
        return no("a norm other than RMSNorm");
    }
    // Per-head RMSNorm before RoPE: Qwen 3's, and Gemma 3's transposed variant, which
    // computes the same values; or OLMo 2's over the whole q and k projections.
    let (qk_norm, qk_norm_full) = match (d.qk_norm, d.qk_norm_kind) {
        (QkNorm::None, None) => (false, false),
        (QkNorm::PerHead | QkNorm::PerHeadTransposed, None) => (true, false),
        (QkNorm::Full, None) => (true, true),
        (q, _) => return no(&format!("q/k norm {q:?}")),
    };
    if d.embed_norm || d.n_positions > 0 || d.names.positions.is_some() {
        return no("an embedding norm or learned positions");
    }
    // Gemma's sqrt(hidden): a bfloat16 constant (gemma3_text), or a weak Python float the
    // activations' dtype rounds to bfloat16 (gemma, gemma2): the same value either way.
    let embed_scale = match d.embed_scale {
        EmbedScale::None => 1.0,
        EmbedScale::Bf16(s) | EmbedScale::Weak(s) => bf16_value(s),
    };
    // granite's residual multiplier and logits scaling: weak Python floats, so bfloat16
    // values against bfloat16 activations (the model multiplies by `m as f32`).
    let residual_scale = match d.residual_multiplier {
        None => 0.0,
        Some(m) if m > 0.0 => half::bf16::from_f32(m as f32).to_f32(),
        Some(m) => return no(&format!("the residual multiplier {m}")),
    };
    let logit_div = match d.logit_scale {
        LogitScale::None => 0.0,
        LogitScale::Div(s) if s > 0.0 => half::bf16::from_f32(s as f32).to_f32(),
        other => return no(&format!("the logit scale {other:?}")),
    };
    if d.query_scale.is_some() {
        return no("a query scale");
    }
    if d.head_gate.is_some() {
        return no("a head-wise attention gate");
    }
    let sliding_window = match (d.sliding.iter().any(|&s| s), d.sliding_window) {
        (false, _) => 0,
        (true, Some(w)) if w > 0 => w,
        (true, w) => return no(&format!("sliding layers with the window {w:?}")),
    };
    let gelu = match d.mlp {
        MlpKind::SwiGlu => false,
        MlpKind::GeGluTanh => true,
        other => return no(&format!("the {other:?} MLP")),
    };
    if d.o_bias || d.mlp_bias || d.down_bias || d.lm_head_bias {
        return no("an output, MLP or head bias");
    }
    let layers = m.num_layers();
    let mut rope_layers = Vec::with_capacity(layers);
    let mut sliding = Vec::with_capacity(layers);
    // One RoPE for the full-attention layers and one for the sliding ones (Gemma 3's local
    // base); the same where the model has one.
    let (mut rope, mut local): (Option<GraphRope>, Option<GraphRope>) = (None, None);
    for i in 0..layers {
        let v = m.layer_view(i).ok_or_else(|| layer(i, "is missing"))?;
        sliding.push(v.sliding);
        let Some(r) = v
            .rope
            .filter(|_| !d.no_rope.get(i).copied().unwrap_or(false))
        else {
            rope_layers.push(false);
            continue;
        };
        let g = graph_rope(r, |e| layer(i, e))?;
        let slot = if v.sliding && d.local_rope.is_some() {
            &mut local
        } else {
            &mut rope
        };
        match slot {
            Some(first) if *first != g => {
                return no("layers with different rotary embeddings");
            }
            Some(_) => {}
            None => *slot = Some(g),
        }
        rope_layers.push(true);
    }
    let Some(rope) = rope.or_else(|| local.clone()) else {
        return no("a model without rotary positions");
    };
    let local_rope = local.filter(|l| *l != rope);
    if sliding_window == 0 {
        sliding.clear();
    }
    let softcap = |c: Option<f64>| c.map_or(0.0, bf16_value);
    Ok(GraphSpec {
        model_type: t.clone(),
        hidden: d.hidden_size as usize,
        layers,
        heads: d.n_heads as usize,
        kv_heads: d.n_kv_heads as usize,
        head_dim: d.head_dim as usize,
        intermediate: d.intermediate_size as usize,
        vocab: model_vocab(m),
        eps: d.norm_eps,
        attn_scale: d.attn_scale as f32,
        rope,
        rope_layers,
        tied: m.lm_head().is_none(),
        qkv_bias: d.qkv_bias,
        qk_norm,
        qk_norm_full,
        quant: None,
        embed_scale,
        sandwich,
        post_only,
        gelu,
        sliding,
        sliding_window,
        local_rope,
        attn_softcap: softcap(d.attn_logit_softcap),
        attn_sinks: false,
        o_bias: false,
        final_softcap: softcap(d.final_logit_softcap),
        residual_scale,
        logit_div,
        moe: None,
        trellis: None,
        trellis_v: None,
    })
}

/// How a model's experts are stored ([`switch_linear`]): not seen yet, MLX mxfp4 (gpt_oss's
/// checkpoint), or bfloat16 / affine as `(group, bits)` (`None`: bfloat16), which must be the
/// other linears' quantization.
#[derive(Clone, Copy, PartialEq)]
enum ExpertQuant {
    Unseen,
    Mxfp4,
    Like(Option<(usize, usize)>),
}

/// A stacked expert projection's arrays; its storage joins `eq`. With `biased` (gpt_oss) its
/// bias `[experts, rows]` comes along, else a bias is refused.
fn switch_linear(
    l: &SwitchLinear,
    what: &str,
    eq: &mut ExpertQuant,
    biased: bool,
) -> Result<GraphLinear, GraphGap> {
    let (lin, this, bias) = match l {
        SwitchLinear::Dense { weight, bias } => (
            GraphLinear {
                weight: weight.clone(),
                scales: None,
                biases: None,
                bias: None,
                trellis: None,
            },
            ExpertQuant::Like(None),
            bias,
        ),
        SwitchLinear::Quantized { weight: q, bias }
            if q.mode == mlx_core::quantized::QuantMode::Mxfp4 =>
        {
            if (q.group_size, q.bits) != (32, 4) || q.biases.is_some() {
                return Err(part(
                    what,
                    format!(
                        "mxfp4 with group size {} and {} bits (the decoder takes 32 and 4, \
                         no biases)",
                        q.group_size, q.bits
                    ),
                ));
            }
            (
                GraphLinear {
                    weight: q.weight.clone(),
                    scales: Some(q.scales.clone()),
                    biases: None,
                    bias: None,
                    trellis: None,
                },
                ExpertQuant::Mxfp4,
                bias,
            )
        }
        SwitchLinear::Quantized { weight, bias } => {
            let mut one = None;
            let lin = quantized(weight, what, &mut one)?;
            (lin, ExpertQuant::Like(one), bias)
        }
        SwitchLinear::Adapted(_) => return Err(part(what, "adapted (LoRA) experts")),
    };
    match *eq {
        ExpertQuant::Unseen => *eq = this,
        first if first != this => {
            return Err(part(
                what,
                "experts stored unlike the other experts (mixed)",
            ));
        }
        _ => {}
    }
    match (bias, biased) {
        (None, false) => Ok(lin),
        (Some(b), true) => Ok(GraphLinear {
            bias: Some(b.clone()),
            ..lin
        }),
        (Some(_), false) => Err(part(what, "experts with biases")),
        (None, true) => Err(part(what, "experts without the biases their row has")),
    }
}

/// The switch that lets `--decoder auto` take gpt_oss (attention sinks, biased output
/// projections and routers, experts with biases and the clamped SwiGLU, mxfp4 experts,
/// sliding layers on a row with experts): emulator-checked only until its
/// `graph_decoder_follows_the_mlx_forward` rows run on a device.
pub const GPT_OSS_ENV: &str = "MLX_GRAPH_GPT_OSS";

/// Whether [`GPT_OSS_ENV`] is `1`.
pub fn gpt_oss_rows_enabled() -> bool {
    std::env::var(GPT_OSS_ENV).as_deref() == Ok("1")
}

/// [`map_model`] for a mixture-of-experts row (`mlx_models::models::moe`): its spec's knobs,
/// each layer's parts ([`moe::Model::layer_view`]).
pub fn map_moe(m: &moe::Model) -> Result<(GraphSpec, GraphWeights), GraphGap> {
    let ms = m.spec();
    let t = ms.model_type.clone();
    let no = |what: &str| GraphGap::Setting {
        model_type: t.clone(),
        setting: what.into(),
    };
    let layer = |i: usize, problem: &str| GraphGap::Layer {
        model_type: t.clone(),
        layer: i,
        problem: problem.into(),
    };
    let x = &ms.extras;
    // gpt_oss's experts: biases on the experts and the router, and the clamped SwiGLU, which
    // the kernels take together (GraphMoe::oai).
    let oai = ms.activation == SwitchActivation::SwiGluOai;
    for (apart, what) in [
        (ms.expert_bias && !oai, "experts with biases"),
        (ms.router_bias && !oai, "a router bias"),
        (
            oai && !(ms.expert_bias && ms.router_bias),
            "the clamped SwiGLU without gpt_oss's expert and router biases",
        ),
    ] {
        if apart {
            return Err(no(what));
        }
    }
    // Sliding-window layers (gpt_oss's layer_types): the window of every sliding layer.
    let sliding_window = match (ms.sliding.iter().any(|&s| s), ms.sliding_window) {
        (false, _) => 0,
        (true, Some(w)) if w > 0 => w,
        (true, w) => return Err(no(&format!("sliding layers with the window {w:?}"))),
    };
    for (present, what) in [
        (
            ms.shared_expert_intermediate_size.is_some(),
            "a shared expert",
        ),
        (x.embedding_multiplier.is_some(), "an embedding multiplier"),
        (x.logits_scaling.is_some(), "a logits scaling"),
        (x.layer_norm || x.lm_head_bias, "layer norms or a head bias"),
        (x.norm_head, "a normed head"),
        (
            m.is_sharded(),
            "a sharded (tensor- or pipeline-parallel) model",
        ),
    ] {
        if present {
            return Err(no(what));
        }
    }
    if !matches!(
        ms.activation,
        SwitchActivation::SwiGlu | SwitchActivation::SwiGluOai
    ) {
        return Err(no(&format!("the experts' {:?} activation", ms.activation)));
    }
    let router = match ms.router {
        Router::SoftmaxUpperPartition { norm_topk_prob, .. }
        | Router::SoftmaxLowerPartition {
            norm_topk_prob,
            flatten: false,
        } => GraphRouter::SoftmaxTopK {
            norm: norm_topk_prob,
        },
        // gpt_oss's mlx_topk (argpartition's upper k) chooses the same experts but among
        // equal logits, where each side breaks the tie its own way.
        Router::TopKThenSoftmax | Router::UpperTopKThenSoftmax => GraphRouter::TopKSoftmax,
        r => return Err(no(&format!("the {r:?} router"))),
    };
    let eps = ms.rms_norm_eps;
    let layers = ms.num_hidden_layers.max(0) as usize;
    let (mut quant, mut router_quant) = (None, None);
    let mut equant = ExpertQuant::Unseen;
    let embed = embedding(m.embed_tokens(), &t, &mut quant)?;
    let head = m
        .lm_head()
        .map(|l| linear(l, "lm_head", &mut quant))
        .transpose()?;
    let (mut rope, mut rope_layers) = (None::<GraphRope>, Vec::with_capacity(layers));
    let (mut moe_layers, mut graph_layers) = (Vec::new(), Vec::with_capacity(layers));
    let mut qk_norm = None;
    for i in 0..layers {
        let v = m.layer_view(i).ok_or_else(|| layer(i, "is missing"))?;
        let w = |s: &str| format!("`{t}`: layer {i} {s}");
        // Attention sinks are taken (gpt_oss): `sinks` below.
        let sinks_taken = |w: &&&str| v.sinks.is_some() && **w == "attention sinks";
        if let Some(what) = v.other.iter().find(|w| !sinks_taken(w)) {
            return Err(layer(i, &format!("has {what}")));
        }
        match v.rope {
            Some(r) => {
                let g = graph_rope(r, |e| layer(i, e))?;
                match &rope {
                    Some(first) if *first != g => {
                        return Err(no("layers with different rotary embeddings"))
                    }
                    Some(_) => {}
                    None => rope = Some(g),
                }
                rope_layers.push(true);
            }
            None => rope_layers.push(false),
        }
        let norms = match (v.q_norm, v.k_norm) {
            (Some(q), Some(k)) => {
                if q.eps != eps || k.eps != eps {
                    return Err(layer(i, "has q/k norms with another eps"));
                }
                Some((q.weight.clone(), k.weight.clone()))
            }
            (None, None) => None,
            _ => return Err(layer(i, "has a q norm without a k norm")),
        };
        if *qk_norm.get_or_insert(norms.is_some()) != norms.is_some() {
            return Err(no("q/k norms on some layers only"));
        }
        let (Some(k), Some(vv)) = (v.k, v.v) else {
            return Err(layer(i, "takes another layer's keys and values"));
        };
        let (gate, up, down, router_w) = match v.ffn {
            MoeFfnView::Dense(mlp) => {
                let (g, u, d) = mlp
                    .gate_up_down()
                    .ok_or_else(|| layer(i, "has an MLP without gate and up projections"))?;
                moe_layers.push(false);
                (
                    linear(g, &w("gate_proj"), &mut quant)?,
                    linear(u, &w("up_proj"), &mut quant)?,
                    linear(d, &w("down_proj"), &mut quant)?,
                    None,
                )
            }
            MoeFfnView::Sparse(b) => {
                if let Some(what) = b.extras_present().first() {
                    return Err(layer(i, &format!("has {what}")));
                }
                if b.top_k() != ms.top_k {
                    return Err(layer(i, "chooses another number of experts"));
                }
                let e = b.experts();
                moe_layers.push(true);
                (
                    switch_linear(&e.gate_proj, &w("experts' gate_proj"), &mut equant, oai)?,
                    switch_linear(&e.up_proj, &w("experts' up_proj"), &mut equant, oai)?,
                    switch_linear(&e.down_proj, &w("experts' down_proj"), &mut equant, oai)?,
                    Some(linear(b.gate(), &w("router"), &mut router_quant)?),
                )
            }
        };
        let norm = |n: &Norm, what: &str| -> Result<mlx_core::Array, GraphGap> {
            match n {
                Norm::Rms(r) if r.eps == eps => Ok(r.weight.clone()),
                _ => Err(part(&w(what), "not an RMSNorm of the model's eps")),
            }
        };
        let (q_norm, k_norm) = norms.unzip();
        graph_layers.push(GraphLayer {
            q: linear(v.q, &w("q_proj"), &mut quant)?,
            k: linear(k, &w("k_proj"), &mut quant)?,
            v: linear(vv, &w("v_proj"), &mut quant)?,
            o: linear(v.o, &w("o_proj"), &mut quant)?,
            gate,
            up,
            down,
            router: router_w,
            input_norm: norm(v.input_norm, "input norm")?,
            post_norm: norm(v.post_attention_norm, "post-attention norm")?,
            q_norm,
            k_norm,
            post_attn_norm: None,
            post_mlp_norm: None,
            sinks: v.sinks.cloned(),
        });
    }
    let Some(rope) = rope else {
        return Err(no("a model without rotary positions"));
    };
    // The experts: mxfp4 (whatever the other linears are), or as the other linears.
    let mxfp4 = match equant {
        ExpertQuant::Mxfp4 => true,
        ExpertQuant::Like(q) if quant.is_some() && q != quant => {
            return Err(part(
                &format!("`{t}`: experts"),
                "quantized unlike the other linears (mixed quantization)",
            ));
        }
        ExpertQuant::Like(q) => {
            quant = quant.or(q);
            false
        }
        ExpertQuant::Unseen => false,
    };
    let attn_scale = m.layer_view(0).map_or(0.0, |v| v.scale);
    let final_norm = match m.final_norm() {
        Norm::Rms(r) if r.eps == eps => r.weight.clone(),
        _ => return Err(part(&format!("`{t}`: final norm"), "not an RMSNorm")),
    };
    let width = ms.moe_intermediate_size.max(0) as usize;
    // The dense MLP's width where a layer has one, else the experts' (unused).
    let dense = moe_layers.iter().any(|&e| !e);
    let spec = GraphSpec {
        model_type: t.clone(),
        hidden: ms.hidden_size.max(0) as usize,
        layers,
        heads: ms.n_heads.max(0) as usize,
        kv_heads: ms.n_kv_heads.max(0) as usize,
        head_dim: ms.head_dim.max(0) as usize,
        intermediate: if dense {
            ms.intermediate_size.max(0) as usize
        } else {
            width
        },
        vocab: m.embed_tokens().shape().0 as usize,
        eps,
        attn_scale,
        rope,
        rope_layers,
        tied: head.is_none(),
        qkv_bias: ms.qkv_bias,
        qk_norm: qk_norm.unwrap_or(false),
        qk_norm_full: false,
        quant,
        embed_scale: 1.0,
        sandwich: false,
        post_only: false,
        gelu: false,
        sliding: if sliding_window > 0 {
            ms.sliding.clone()
        } else {
            Vec::new()
        },
        sliding_window,
        local_rope: None,
        attn_softcap: 0.0,
        attn_sinks: ms.attn_sinks,
        o_bias: ms.o_bias,
        final_softcap: 0.0,
        residual_scale: 0.0,
        logit_div: 0.0,
        moe: Some(GraphMoe {
            experts: ms.num_experts.max(0) as usize,
            top_k: ms.top_k.max(0) as usize,
            intermediate: width,
            router,
            layers: moe_layers,
            router_quant,
            oai,
            mxfp4,
        }),
        trellis: None,
        trellis_v: None,
    };
    Ok((
        spec,
        GraphWeights {
            embed,
            head,
            final_norm,
            layers: graph_layers,
        },
    ))
}

/// `x` as a bfloat16 value (what MLX multiplies by when a weak scalar meets bfloat16
/// activations, or a bfloat16 constant is built).
fn bf16_value(x: f64) -> f32 {
    half::bf16::from_f64(x).to_f32()
}

fn model_vocab(m: &Model) -> usize {
    m.embed_tokens().shape().0 as usize
}

/// A layer's RoPE as the decoder applies it, or the problem (as `gap` makes it the layer's).
fn graph_rope(r: &Rope, gap: impl Fn(&str) -> GraphGap) -> Result<GraphRope, GraphGap> {
    match r {
        Rope::Base {
            dims,
            traditional,
            base,
            scale,
        } => Ok(GraphRope::from_base(
            *dims as usize,
            *traditional,
            *base,
            *scale,
        )),
        Rope::Freqs {
            traditional,
            freqs,
            input_scale,
            ..
        } => {
            let f = freqs
                .astype(Dtype::Float32)
                .and_then(|f| f.to_vec::<f32>())
                .map_err(|e| gap(&format!("rope frequencies: {e}")))?;
            Ok(GraphRope::from_freqs(
                *traditional,
                &f,
                input_scale.unwrap_or(1.0) as f32,
            ))
        }
        Rope::Dynamic { .. } => Err(gap("dynamic NTK RoPE is not in the graph decoder yet")),
    }
}

fn linear(
    l: &Linear,
    what: &str,
    quant: &mut Option<(usize, usize)>,
) -> Result<GraphLinear, GraphGap> {
    match l {
        Linear::Dense { weight, bias } => Ok(GraphLinear {
            weight: weight.clone(),
            scales: None,
            biases: None,
            bias: bias.clone(),
            trellis: None,
        }),
        Linear::Quantized { weight, bias } => {
            let q = quantized(weight, what, quant)?;
            Ok(GraphLinear {
                bias: bias.clone(),
                ..q
            })
        }
        Linear::Adapted(_) => Err(part(what, "an adapted (LoRA/DoRA) linear")),
        // The words, row scales and signs as the loader made them ([`GraphSpec::trellis`]
        // is the layers' common spec: `map_weights`).
        Linear::Trellis { weight, bias } => {
            let (su, sv) = weight.signs();
            Ok(GraphLinear {
                weight: weight.weight.clone(),
                scales: Some(weight.scales.clone()),
                biases: None,
                bias: bias.clone(),
                trellis: Some(GraphTrellis {
                    spec: weight.spec,
                    su: su.clone(),
                    sv: sv.clone(),
                }),
            })
        }
        Linear::Ggml { .. } => Err(part(what, "GGML blocks kept for the CPU decoder")),
    }
}

/// Rows `a..b` of a linear layer's arrays (weight, and scales, biases and bias where there are):
/// slices, views of the loaded model's arrays (a fused projection's parts).
fn split_rows(l: &GraphLinear, a: usize, b: usize, what: &str) -> Result<GraphLinear, GraphGap> {
    if l.trellis.is_some() {
        return Err(part(
            what,
            "a fused trellis-coded projection (its output transform mixes the parts' rows)",
        ));
    }
    let rows = l.weight.shape().first().copied().unwrap_or(0) as usize;
    if b > rows {
        return Err(part(
            what,
            format!("{rows} rows, fewer than the {b} its heads or width need"),
        ));
    }
    let cut = |x: &mlx_core::Array| {
        mlx_core::ops::slice_axis(x, 0, a as i32, b as i32, None)
            .map_err(|e| part(what, format!("rows {a}..{b}: {e}")))
    };
    Ok(GraphLinear {
        weight: cut(&l.weight)?,
        scales: l.scales.as_ref().map(cut).transpose()?,
        biases: l.biases.as_ref().map(cut).transpose()?,
        bias: l.bias.as_ref().map(cut).transpose()?,
        trellis: None,
    })
}

fn quantized(
    q: &mlx_models::layers::QuantizedWeight,
    what: &str,
    quant: &mut Option<(usize, usize)>,
) -> Result<GraphLinear, GraphGap> {
    if q.mode != mlx_core::quantized::QuantMode::Affine {
        return Err(part(what, format!("{} quantization", q.mode.name())));
    }
    let this = (q.group_size as usize, q.bits as usize);
    match quant {
        Some(first) if *first != this => {
            return Err(part(
                what,
                format!(
                    "group size {} and {} bits, other weights {} and {} (mixed quantization)",
                    this.0, this.1, first.0, first.1
                ),
            ))
        }
        _ => *quant = Some(this),
    }
    Ok(GraphLinear {
        weight: q.weight.clone(),
        scales: Some(q.scales.clone()),
        biases: Some(
            q.biases
                .clone()
                .ok_or_else(|| part(what, "affine weights without biases"))?,
        ),
        bias: None,
        trellis: None,
    })
}

fn rms(n: Option<&Norm>, what: &str) -> Result<mlx_core::Array, GraphGap> {
    match n {
        Some(n) => rms_eps(n, what).map(|(w, _)| w),
        None => Err(part(what, "not a weighted RMSNorm")),
    }
}

/// A weighted RMSNorm's weight and epsilon; Gemma's norm's weight is `1 + w`, computed as the
/// model computes it at every call (a weak scalar: the weight's dtype), a new array of the
/// norm's size.
fn rms_eps(n: &Norm, what: &str) -> Result<(mlx_core::Array, f32), GraphGap> {
    match n {
        Norm::Rms(r) => Ok((r.weight.clone(), r.eps)),
        Norm::RmsOffset(r) => {
            let w = (1.0f32 + &r.weight).map_err(|e| part(what, format!("1 + weight: {e}")))?;
            Ok((w, r.eps))
        }
        _ => Err(part(what, "not a weighted RMSNorm")),
    }
}

/// The embedding's arrays (its quantization joins `quant`).
fn embedding(
    e: &Embedding,
    t: &str,
    quant: &mut Option<(usize, usize)>,
) -> Result<GraphLinear, GraphGap> {
    match e {
        Embedding::Dense(w) => Ok(GraphLinear {
            weight: w.clone(),
            scales: None,
            biases: None,
            bias: None,
            trellis: None,
        }),
        Embedding::Quantized(q) => quantized(q, "embed_tokens", quant),
        Embedding::Adapted(_) => Err(part(&format!("`{t}`"), "an adapted embedding")),
        Embedding::Ggml(_) => Err(part(
            &format!("`{t}`"),
            "GGML blocks kept for the CPU decoder",
        )),
    }
}

fn map_weights(m: &Model, spec: &mut GraphSpec) -> Result<GraphWeights, GraphGap> {
    let t = spec.model_type.clone();
    let mut quant = None;
    let embed = embedding(m.embed_tokens(), &t, &mut quant)?;
    let head = m
        .lm_head()
        .map(|l| linear(l, "lm_head", &mut quant))
        .transpose()?;
    let mut layers = Vec::with_capacity(spec.layers);
    for i in 0..spec.layers {
        // A part of the layer, and the layer's own problems.
        let w = |s: &str| format!("`{t}`: layer {i} {s}");
        let gap = |problem: &str| GraphGap::Layer {
            model_type: t.clone(),
            layer: i,
            problem: problem.into(),
        };
        let v = m.layer_view(i).ok_or_else(|| gap("is missing"))?;
        // Separate q/k/v projections, or phi3's fused one split by rows (views of its arrays).
        let (q, k, vv) = match (v.q, v.k, v.v, v.qkv) {
            (Some(q), Some(k), Some(vv), _) => (
                linear(q, &w("q_proj"), &mut quant)?,
                linear(k, &w("k_proj"), &mut quant)?,
                linear(vv, &w("v_proj"), &mut quant)?,
            ),
            (_, _, _, Some(f)) => {
                let f = linear(f, &w("qkv_proj"), &mut quant)?;
                let (qn, kn) = (spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim);
                let part = |a: usize, b: usize| split_rows(&f, a, b, &w("qkv_proj"));
                (
                    part(0, qn)?,
                    part(qn, qn + kn)?,
                    part(qn + kn, qn + 2 * kn)?,
                )
            }
            _ => return Err(gap("has a q/k/v projection laid out per head")),
        };
        if v.head_gate || v.other_qk_norm {
            return Err(gap("has a gated or normed attention"));
        }
        let (q_norm, k_norm) = match (spec.qk_norm, v.q_norm, v.k_norm) {
            (false, None, None) => (None, None),
            (true, Some(qn), Some(kn)) => {
                let (qn, kn) = (rms_eps(qn, &w("q_norm"))?, rms_eps(kn, &w("k_norm"))?);
                if qn.1 != spec.eps || kn.1 != spec.eps {
                    return Err(gap(&format!(
                        "q/k norm eps {} and {}, the layers' {}",
                        qn.1, kn.1, spec.eps
                    )));
                }
                (Some(qn.0), Some(kn.0))
            }
            _ => return Err(gap("has q/k norms other than its descriptor's")),
        };
        let (post_attn_norm, post_mlp_norm) =
            match (spec.sandwich, v.post_attn_norm, v.post_mlp_norm) {
                (false, None, None) => (None, None),
                (true, Some(a), Some(b)) => {
                    let (a, b) = (
                        rms_eps(a, &w("post-attention norm"))?,
                        rms_eps(b, &w("post-MLP norm"))?,
                    );
                    if a.1 != spec.eps || b.1 != spec.eps {
                        return Err(gap("has post-norms with another eps"));
                    }
                    (Some(a.0), Some(b.0))
                }
                _ => return Err(gap("has post-norms other than its descriptor's")),
            };
        // Separate gate and up projections, or a fused one split in half (phi3).
        let (gate, up, down) = match (v.mlp.gate_up_down(), v.mlp.fused_gate_up_down()) {
            (Some((g, u, d)), _) => (
                linear(g, &w("gate_proj"), &mut quant)?,
                linear(u, &w("up_proj"), &mut quant)?,
                d,
            ),
            (None, Some((f, up_first, d))) => {
                let f = linear(f, &w("gate_up_proj"), &mut quant)?;
                let n = spec.intermediate;
                let first = split_rows(&f, 0, n, &w("gate_up_proj"))?;
                let second = split_rows(&f, n, 2 * n, &w("gate_up_proj"))?;
                let (g, u) = if up_first {
                    (second, first)
                } else {
                    (first, second)
                };
                (g, u, d)
            }
            _ => return Err(gap("has an MLP without gate and up projections")),
        };
        let mut lin = |l: &Linear, s: &str| linear(l, &w(s), &mut quant);
        // Post norms only (OLMo 2): no pre-norms, whose slots hold the post norms' handles
        // (`GraphSpec::post_only`: not read).
        let (input_norm, post_norm) = match (spec.post_only, &post_attn_norm, &post_mlp_norm) {
            (true, Some(a), Some(b)) if v.pre_attn_norm.is_none() && v.pre_mlp_norm.is_none() => {
                (a.clone(), b.clone())
            }
            (true, _, _) => return Err(gap("has pre-norms other than its descriptor's")),
            (false, _, _) => (
                rms(v.pre_attn_norm, &w("input norm"))?,
                rms(v.pre_mlp_norm, &w("post-attention norm"))?,
            ),
        };
        layers.push(GraphLayer {
            q,
            k,
            v: vv,
            o: lin(v.o, "o_proj")?,
            gate,
            up,
            down: lin(down, "down_proj")?,
            router: None,
            input_norm,
            post_norm,
            q_norm,
            k_norm,
            post_attn_norm,
            post_mlp_norm,
            sinks: None,
        });
    }
    spec.quant = quant;
    // Trellis-coded layers: the first linear's spec other than a value projection's, and the
    // first value projection's where it differs (`mlx convert --q-trellis-v-code`; the
    // decoder's v slice takes its own code: GraphSpec::trellis_v). GraphWeights::check names
    // a mix, another spec, or a value projections' spec the kernels cannot pair with the rest.
    let coded = |x: &GraphLinear| x.trellis.as_ref().map(|t| t.spec);
    spec.trellis = layers
        .iter()
        .flat_map(|l| [&l.q, &l.k, &l.o, &l.gate, &l.up, &l.down])
        .find_map(coded);
    spec.trellis_v = layers
        .iter()
        .find_map(|l| coded(&l.v))
        .filter(|v| spec.trellis.is_some_and(|t| t != *v));
    Ok(GraphWeights {
        embed,
        head,
        final_norm: rms(Some(m.final_norm()), &format!("`{t}`: final norm"))?,
        layers,
    })
}

/// Why the graph decoder cannot run `model` (its descriptor, the kernels' limits, the dtypes).
pub fn model_unsupported(model: &dyn LanguageModel) -> Option<String> {
    let (spec, weights) = match map_model(model) {
        Ok(x) => x,
        Err(e) => return Some(e.to_string()),
    };
    let t = &spec.model_type;
    if let Err(e) = spec.check() {
        return Some(format!("`{t}`: {e}"));
    }
    if let Err(e) = weights.check(&spec) {
        return Some(format!(
            "`{t}`: the graph decoder runs bfloat16 weights or MLX affine 4/8-bit ones with \
             bfloat16 scales, and mxfp4 experts ({e})"
        ));
    }
    let gpt_oss = spec.attn_sinks
        || spec.o_bias
        || !spec.sliding.is_empty() && spec.moe.is_some()
        || spec.moe.as_ref().is_some_and(|m| m.oai || m.mxfp4);
    if gpt_oss && !gpt_oss_rows_enabled() {
        return Some(format!(
            "`{t}`: attention sinks, biased output projections and routers, experts with \
             biases, the clamped SwiGLU, mxfp4 experts and sliding layers among experts \
             (gpt_oss's kind) have run on the emulator only, not yet on a device \
             ({GPT_OSS_ENV}=1 takes them; a prompt longer than a sliding layer's window still \
             stays on the MLX path: the decoder takes a rotating cache only before it wraps)"
        ));
    }
    if post_norm_gated(&spec) {
        return Some(format!(
            "`{t}`: post-norm blocks and q/k norms over the whole projections have run on a \
             device for olmo2 and exaone4, for olmo3 on the emulator only \
             ({POST_NORM_ENV}=1 takes it)"
        ));
    }
    None
}

/// The switch that lets `--decoder auto` take olmo3, whose kernels (OLMo 2's post norms and
/// full-width q/k norms, `GraphSpec::post_only` and `GraphSpec::qk_norm_full`, with sliding
/// windows) have run only on the emulator. olmo2 and exaone4, the same kernels, passed their
/// `graph_decoder_follows_the_mlx_forward` rows on an H100
/// (`results/gpu/2026-12-06-s35-h100/`) and are taken without it.
pub const POST_NORM_ENV: &str = "MLX_GRAPH_POST_NORM";

/// Whether [`POST_NORM_ENV`] is `1`.
pub fn post_norm_rows_enabled() -> bool {
    std::env::var(POST_NORM_ENV).as_deref() == Ok("1")
}

/// Whether `spec` is a post-norm row still behind [`POST_NORM_ENV`] (olmo3, without the
/// switch).
pub fn post_norm_gated(spec: &GraphSpec) -> bool {
    (spec.post_only || spec.qk_norm_full) && spec.model_type == "olmo3" && !post_norm_rows_enabled()
}

/// A graph decoder kept between the generations of one loaded model (`mlx benchmark`'s
/// warm-up and trials, `mlx chat`'s turns): building one compiles its kernels, lays the
/// weights out on the device and captures the step, which a short generation would otherwise
/// pay every time (and count in its prompt time). [`crate::generate::GenerateOptions::graph_keep`]
/// hands it to `generate_step`, which takes the kept decoder when it was made for the same
/// model (the same loaded model object and [`GraphSpec`]) with room enough, else builds one,
/// and puts it back when the generation ends unless a CUDA call failed. Clones share the one
/// slot. Keep one per loaded model: a slot given to a model other than the one it was filled
/// for builds a new decoder.
///
/// While it waits in the slot the decoder is parked ([`KeptDecoder::park`]): its KV cache's
/// device memory goes back to the device, so the next prompt (MLX's activations) runs beside
/// its small state only (issue #30's peak: an 8B decoder keeps 1.8 MB of its 94 MB); taking it
/// maps the cache's memory again at the same addresses (no rebuild, no new capture). A
/// decoder whose memory cannot be taken again is dropped, and one is built as without a kept
/// one.
///
/// A slot made for a conversation ([`GraphKeep::for_conversation`]: `mlx chat`'s turns,
/// [`crate::chat::ChatSession`]) keeps a decoder whose prompt went in through it (a
/// trellis-coded model's, [`crate::generate::GenerateStep`]'s prompt on the decoder) with its
/// cache instead: not parked, with the tokens it holds from position 0. The next turn's
/// generation, given the whole conversation as its prompt (the MLX caches hold none of it:
/// [`crate::held::Plan::Prepend`]), keeps the positions whose tokens begin that prompt
/// ([`reusable`]) and runs only the rest through the decoder ([`GraphBackend::resume`]), as
/// the MLX path continues its caches. Every other run's decoder is parked as in a plain slot.
#[derive(Clone, Default)]
pub struct GraphKeep {
    slot: std::sync::Arc<std::sync::Mutex<Option<Kept>>>,
    conversation: bool,
}

struct Kept {
    model: usize,
    spec: GraphSpec,
    dec: Box<dyn KeptDecoder>,
    /// The tokens the decoder's cache holds from position 0 (a conversation's slot); empty
    /// when it was parked (its cache forgotten).
    holds: Vec<u32>,
}

/// How many positions of a kept decoder that holds `holds` (its tokens from position 0) a
/// generation of `prompt` keeps: those whose tokens begin the prompt, short of the prompt's
/// last token (its step gives the logits of the first token). The decoder then runs only
/// `prompt[reusable..]`; the positions after the common prefix (a reply the next turn's
/// template renders otherwise, a reset conversation) are forgotten. A position's keys and
/// values depend only on the tokens up to it, so the kept positions are those a fresh run of
/// the whole prompt computes.
pub fn reusable(holds: &[u32], prompt: &[i32]) -> usize {
    let head = prompt.len().saturating_sub(1);
    holds
        .iter()
        .zip(&prompt[..head])
        .take_while(|(&h, &p)| i64::from(h) == i64::from(p))
        .count()
}

/// A graph decoder that can wait in a [`GraphKeep`] between generations: the CUDA decoder,
/// or a test's stand-in.
pub trait KeptDecoder: GraphBackend + Send {
    /// Positions its cache holds.
    fn capacity(&self) -> usize;
    /// Whether an earlier CUDA call failed (it is then not kept).
    fn is_broken(&self) -> bool;
    /// Gives the memory it needs only while decoding (its KV cache) back to the device;
    /// `Ok(false)`: it cannot, and keeps it. An error leaves it unusable (it is dropped).
    fn park(&mut self) -> mlx_core::Result<bool>;
    /// Takes that memory again. An error: it is dropped.
    fn unpark(&mut self) -> mlx_core::Result<()>;
}

impl KeptDecoder for mlx_kernels::graph_decode::GraphDecoder {
    fn capacity(&self) -> usize {
        mlx_kernels::graph_decode::GraphDecoder::capacity(self)
    }
    fn is_broken(&self) -> bool {
        mlx_kernels::graph_decode::GraphDecoder::is_broken(self)
    }
    fn park(&mut self) -> mlx_core::Result<bool> {
        mlx_kernels::graph_decode::GraphDecoder::park(self)
    }
    fn unpark(&mut self) -> mlx_core::Result<()> {
        mlx_kernels::graph_decode::GraphDecoder::unpark(self)
    }
}

impl std::fmt::Debug for GraphKeep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.holds() {
            "GraphKeep(a decoder)"
        } else {
            "GraphKeep(empty)"
        })
    }
}

/// The identity of a loaded model object (its address).
pub(crate) fn model_id(model: &dyn LanguageModel) -> usize {
    model as *const dyn LanguageModel as *const () as usize
}

impl GraphKeep {
    /// An empty slot.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty slot for one conversation: a decoder whose prompt went in through it waits
    /// with its cache and the tokens it holds (see [`GraphKeep`]).
    pub fn for_conversation() -> Self {
        Self {
            conversation: true,
            ..Self::default()
        }
    }

    /// Whether the slot was made for a conversation ([`GraphKeep::for_conversation`]).
    pub fn is_for_conversation(&self) -> bool {
        self.conversation
    }

    /// Whether a decoder is kept.
    pub fn holds(&self) -> bool {
        self.slot.lock().map(|k| k.is_some()).unwrap_or(false)
    }

    /// The tokens the kept decoder's cache holds from position 0 (empty: none kept, or kept
    /// parked).
    pub fn held_tokens(&self) -> Vec<u32> {
        self.slot
            .lock()
            .ok()
            .and_then(|k| k.as_ref().map(|k| k.holds.clone()))
            .unwrap_or_default()
    }

    /// The device bytes the kept decoder holds outside MLX's allocator while it waits (0:
    /// none kept): parked, its small state only; one that holds a conversation, its cache
    /// too.
    pub fn device_bytes(&self) -> usize {
        self.slot
            .lock()
            .ok()
            .and_then(|k| k.as_ref().map(|k| k.dec.device_bytes()))
            .unwrap_or(0)
    }

    /// The kept decoder, its memory taken again, when it was made for `model` with `spec`
    /// and holds `room` positions, with the tokens its cache holds from position 0 (empty
    /// unless it waited holding a conversation and still says it holds as many). One that
    /// does not fit, or whose memory cannot be taken again, is dropped (before a new one is
    /// built beside it).
    pub(crate) fn take(
        &self,
        model: &dyn LanguageModel,
        spec: &GraphSpec,
        room: usize,
    ) -> Option<(Box<dyn KeptDecoder>, Vec<u32>)> {
        let mut k = self.slot.lock().ok()?;
        let fits = k.as_ref().is_some_and(|k| {
            k.model == model_id(model)
                && &k.spec == spec
                && k.dec.capacity() >= room
                && !k.dec.is_broken()
        });
        let Kept { mut dec, holds, .. } = k.take().filter(|_| fits)?;
        if !holds.is_empty() {
            // Not parked: its cache holds the conversation.
            let holds = if dec.position() == Some(holds.len()) {
                holds
            } else {
                Vec::new()
            };
            return Some((dec, holds));
        }
        if dec.unpark().is_err() {
            // MLX's buffer cache (the prompt's freed activations) may hold the memory the
            // region needs: it goes back to the device and the mapping is tried once more.
            if mlx_core::memory::cache_memory().ok()? == 0 {
                return None;
            }
            mlx_core::memory::clear_cache().ok()?;
            dec.unpark().ok()?;
        }
        Some((dec, Vec::new()))
    }

    /// Keeps `dec` (made for `model` with `spec`), parked, unless a CUDA call broke it or it
    /// could not be parked.
    pub(crate) fn put(&self, model: usize, spec: GraphSpec, mut dec: Box<dyn KeptDecoder>) {
        if dec.is_broken() || dec.park().is_err() {
            return;
        }
        if let Ok(mut k) = self.slot.lock() {
            *k = Some(Kept {
                model,
                spec,
                dec,
                holds: Vec::new(),
            });
        }
    }

    /// Keeps `dec` (made for `model` with `spec`) with its cache, which holds `holds` from
    /// position 0 (a conversation's slot; else, or where `holds` is not what the decoder's
    /// position says, it is parked as [`GraphKeep::put`] parks). What it still computes is
    /// waited for ([`GraphBackend::resume`] with no tokens), so nothing of it runs beside the
    /// next prompt; a decoder that fails there, or that a CUDA call broke, is not kept.
    pub(crate) fn put_holding(
        &self,
        model: usize,
        spec: GraphSpec,
        mut dec: Box<dyn KeptDecoder>,
        holds: Vec<u32>,
    ) {
        if !self.conversation || holds.is_empty() || dec.position() != Some(holds.len()) {
            return self.put(model, spec, dec);
        }
        if dec.is_broken() || dec.resume(holds.len(), &[]).is_err() {
            return;
        }
        if let Ok(mut k) = self.slot.lock() {
            *k = Some(Kept {
                model,
                spec,
                dec,
                holds,
            });
        }
    }
}

/// What `generate_step` asks of a graph decoder: the CUDA one
/// ([`mlx_kernels::graph_decode::GraphDecoder`]), or a stand-in ([`GraphStandIn`]) with which
/// the engine's glue (the prompt's cache handed over, the first token, the host sampler, the
/// fall-back) is tested on a machine without CUDA.
pub trait GraphBackend {
    /// Copies the prompt's keys and values in (per layer, `[1, kv_heads, n, head_dim]`).
    fn set_prefix(&mut self, kv: &[(mlx_core::Array, mlx_core::Array)]) -> mlx_core::Result<()>;
    /// Starts greedy decoding from `first`, at most `max_steps` tokens.
    fn start(&mut self, first: u32, max_steps: usize) -> mlx_core::Result<()>;
    /// The next greedy token and its log-probability.
    fn next_token(&mut self) -> mlx_core::Result<(u32, f32)>;
    /// One teacher-forced step: the logits after `token` (float32 values).
    fn step_logits(&mut self, token: u32) -> mlx_core::Result<Vec<f32>>;
    /// Makes the `n`-th token fail as a CUDA call would (testing the fall-back).
    fn inject_failure_after(&mut self, n: usize);
    /// Forgets what the decoder holds and takes `tokens` (a prompt, one step a token, nothing
    /// read back); the position becomes `tokens.len()`. A stand-in that cannot says so (the
    /// MLX path then runs the prompt).
    fn feed_prompt(&mut self, tokens: &[u32]) -> mlx_core::Result<()> {
        let _ = tokens;
        Err(mlx_core::Error::InvalidArgument {
            op: "graph_decoder",
            message: "this decoder does not take a prompt".into(),
        })
    }
    /// Positions its cache holds (`None`: a decoder that does not say, which is never
    /// continued: [`GraphKeep::for_conversation`]'s decoder feeds each prompt whole then).
    fn position(&self) -> Option<usize> {
        None
    }
    /// Keeps the first `keep` cached positions (at most [`GraphBackend::position`]), forgets
    /// the rest, and takes `tokens` after them, one step a token, nothing read back: the
    /// position becomes `keep + tokens.len()`. What a run waited for first (the reads a greedy
    /// run queued ahead) is finished. A kept decoder's next turn ([`GraphKeep`]); a decoder
    /// that says its position takes it.
    fn resume(&mut self, keep: usize, tokens: &[u32]) -> mlx_core::Result<()> {
        let _ = (keep, tokens);
        Err(mlx_core::Error::InvalidArgument {
            op: "graph_decoder",
            message: "this decoder does not continue its cache".into(),
        })
    }
    /// What building it cost (the CUDA decoder's kernels, weights and capture).
    fn build_times(&self) -> Option<BuildTimes> {
        None
    }
    /// The decoder itself, to keep between generations ([`GraphKeep`]): the CUDA decoder, or
    /// a stand-in that can be kept; `None` (the default): dropped when the generation ends.
    fn into_kept(self: Box<Self>) -> Option<Box<dyn KeptDecoder>> {
        None
    }
    /// Device bytes the decoder holds outside MLX's allocator (the weights it re-lays for
    /// the kernels, not those it reads in MLX's buffers; its cache, its activations): MLX's
    /// peak memory does not count them, so a
    /// generation's reported peak adds them ([`crate::generate::GenerateStep::graph_device_bytes`]).
    fn device_bytes(&self) -> usize {
        0
    }
}

impl GraphBackend for mlx_kernels::graph_decode::GraphDecoder {
    fn set_prefix(&mut self, kv: &[(mlx_core::Array, mlx_core::Array)]) -> mlx_core::Result<()> {
        mlx_kernels::graph_decode::GraphDecoder::set_prefix(self, kv)
    }
    fn start(&mut self, first: u32, max_steps: usize) -> mlx_core::Result<()> {
        mlx_kernels::graph_decode::GraphDecoder::start(self, first, max_steps)
    }
    fn next_token(&mut self) -> mlx_core::Result<(u32, f32)> {
        mlx_kernels::graph_decode::GraphDecoder::next_token(self)
    }
    fn step_logits(&mut self, token: u32) -> mlx_core::Result<Vec<f32>> {
        mlx_kernels::graph_decode::GraphDecoder::step_logits(self, token)
    }
    fn inject_failure_after(&mut self, n: usize) {
        mlx_kernels::graph_decode::GraphDecoder::inject_failure_after(self, n)
    }
    fn feed_prompt(&mut self, tokens: &[u32]) -> mlx_core::Result<()> {
        self.reset();
        self.feed(tokens)
    }
    fn position(&self) -> Option<usize> {
        Some(mlx_kernels::graph_decode::GraphDecoder::position(self))
    }
    fn resume(&mut self, keep: usize, tokens: &[u32]) -> mlx_core::Result<()> {
        // `rewind` waits for the reads a greedy run left queued first.
        self.rewind(keep)?;
        self.feed(tokens)
    }
    fn build_times(&self) -> Option<BuildTimes> {
        Some(mlx_kernels::graph_decode::GraphDecoder::build_times(self))
    }
    fn device_bytes(&self) -> usize {
        mlx_kernels::graph_decode::GraphDecoder::device_bytes(self)
    }
    fn into_kept(self: Box<Self>) -> Option<Box<dyn KeptDecoder>> {
        Some(self)
    }
}

/// Builds a stand-in decoder for a loaded model with room for so many positions.
pub type StandInFn = dyn for<'a> Fn(&'a dyn LanguageModel, usize) -> mlx_core::Result<Box<dyn GraphBackend + 'a>>
    + Send
    + Sync;

/// A stand-in for the CUDA graph decoder
/// ([`crate::generate::GenerateOptions::graph_stand_in`]): tests of the engine's glue on a
/// machine without CUDA. With one, `generate_step` skips the CUDA
/// availability check (the model and the options are still checked) and builds its decoder
/// through this function instead.
#[derive(Clone)]
pub struct GraphStandIn(pub std::sync::Arc<StandInFn>);

impl std::fmt::Debug for GraphStandIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GraphStandIn(..)")
    }
}

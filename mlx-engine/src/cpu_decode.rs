//! The CPU decoder: a decode step of a descriptor-table dense model (the llama family) run by
//! our own kernels (`mlx_core::cpu`) on all cores, outside MLX's graph.
//!
//! Why: on the CPU backend MLX 0.32.4's quantized matmul is scalar and single-threaded, so a
//! small model decodes and prefills an order of magnitude below what the cores and memory
//! allow (and below llama.cpp on the same file). Issue #31 allowed either custom MLX
//! primitives (C++ `eval_cpu`, keeping MLX's graph and its VJPs) or a Rust decode step like
//! the GPU graph decoder; this is the second, because generation needs no gradients, a step
//! outside the graph pays no per-primitive scheduling (a token here is ~200 products and a
//! few hundred small ops), and the kernels stay in safe-to-audit Rust with one `unsafe`
//! crate. It reads the loaded model's own arrays in place (MLX's evaluated host buffers,
//! borrowed through `Array::as_slice`) and its [`Descriptor`]: no second parser and no second
//! copy of the weights.
//!
//! What it covers ([`unsupported`] names the reason for anything else): dense descriptor rows
//! with pre-norm or sandwich blocks (Gemma 3's post norms), RMSNorm (or Gemma's `1 + w`
//! one), separate q/k/v projections with optional biases, optional per-head RMS q/k norms,
//! RoPE (a base with linear scaling, or a frequency table such as llama3's; sliding layers'
//! own), grouped-query attention, full or sliding-window (over its full cache, each query
//! seeing the window before it as mlx-lm's mask does), SwiGLU or the GELU-approx gate, an
//! embedding scale, a tied or untied head; weights dense (float32,
//! float16, bfloat16), MLX affine-quantized (2, 4 or 8 bits), trellis-coded, or a GGUF file's
//! GGML blocks kept as stored (`GgufTensors::Blocks`: Q4_0..Q8_0, Q2_K..Q6_K, int8 inputs). Its own float16 KV cache is
//! filled by running the prompt through it in blocks of [`BLOCK`] tokens, so every weight row
//! is read once per block.
//!
//! Tier L3 against the exact path (the model's MLX forward): float32 activations as MLX's
//! with `--dtype auto` on the CPU, but sums in another order, so logits differ by rounding
//! (`tests/cpu_decode.rs` states the bounds). Sampling and logits processors are the
//! engine's own, applied to these logits.

use half::{f16, slice::HalfFloatSliceExt};
use mlx_core::cpu::{
    self, Activations, AttentionShape, CpuContext, Floats, KvPrefetch, MatJob, Matrix, RowsScratch,
};
use mlx_core::memory::{ZeroBits, ZeroedBuf};
use mlx_models::layers::{Embedding, Linear, MlpKind, Norm, NormKind, Rope};
use mlx_models::models::dense::{LayerView, Model};
use mlx_models::models::descriptor::{Descriptor, EmbedScale, LogitScale, Placement, QkNorm};
use mlx_models::LanguageModel;

use crate::error::{EngineError, Result};

/// Prompt tokens run through the layers together (each weight row is read once per block):
/// 64, so that the AMX tile kernels (`cpu::amx`) dequantize each weight once for 64 rows
/// (`results/bench/2026-12-05-s28-q4prefill/`).
pub const BLOCK: usize = 64;

fn unsup(msg: impl Into<String>) -> EngineError {
    EngineError::CpuDecoderUnsupported(msg.into())
}

/// Why the CPU decoder cannot run `model` (`None`: it can).
pub fn unsupported(model: &dyn LanguageModel) -> Option<String> {
    // Building a one-thread decoder with room for one token checks every weight's view (a
    // few small buffers; no thread is spawned).
    match CpuDecoder::new(model, 1, 1) {
        Ok(_) => None,
        Err(EngineError::CpuDecoderUnsupported(m)) => Some(m),
        Err(e) => Some(e.to_string()),
    }
}

fn model_addr(model: &dyn LanguageModel) -> usize {
    model as *const dyn LanguageModel as *const () as usize
}

fn check(model: &dyn LanguageModel) -> Result<&Model> {
    let Some(m) = model.as_dense() else {
        return Err(unsup(format!(
            "`{}` is a dedicated port, not a dense descriptor row",
            model.model_type()
        )));
    };
    let d = m.descriptor();
    let t = &d.model_type;
    let no = |what: &str| Err(unsup(format!("`{t}`: {what} is not supported")));
    if m.pipeline_stage().is_some() {
        return no("a pipeline stage (mlx launch --pipeline)");
    }
    if !matches!(d.placement, Placement::Pre | Placement::Sandwich) {
        return no(&format!("norm placement {:?}", d.placement));
    }
    if d.post_norm_offsets.is_some() {
        return no("offset post norms");
    }
    // Gemma's `rms_norm(x, 1 + w)` is an RMSNorm with a shifted weight ([`NormW::Offset`]).
    let rms = |k: NormKind| matches!(k, NormKind::Rms | NormKind::RmsOffset);
    if !rms(d.norm) || d.qk_norm_kind.is_some_and(|k| !rms(k)) {
        return no("a norm other than RMSNorm");
    }
    if d.embed_norm || d.n_positions > 0 || d.names.positions.is_some() {
        return no("an embedding norm or learned positions");
    }
    // The embedding scale is applied in float32 ([`Weights::embed_rows`]); Gemma 3's
    // `clip_residual` only acts on float16 residuals, and the decoder's are float32.
    if d.logit_scale != LogitScale::None
        || d.final_logit_softcap.is_some()
        || d.attn_logit_softcap.is_some()
        || d.residual_multiplier.is_some()
        || d.query_scale.is_some()
    {
        return no("scaling or soft-capping of embeddings, attention or logits");
    }
    if d.head_gate.is_some() {
        return no("a head-wise attention gate");
    }
    if d.kv_tile.is_some() || !d.layer_shapes.is_empty() || d.loops > 1 {
        return no("tiled KV heads, per-layer head counts or a looped layer stack");
    }
    if d.sliding.iter().any(|&s| s) && d.sliding_window.is_none_or(|w| w == 0) {
        return no("sliding-window attention without a window");
    }
    if d.no_rope.iter().any(|&n| n) || d.rope.is_none() {
        return no("layers without rotary positions");
    }
    if !matches!(d.mlp, MlpKind::SwiGlu | MlpKind::GeGluTanh) {
        return no(&format!("the {:?} MLP", d.mlp));
    }
    if !matches!(
        d.qk_norm,
        QkNorm::None | QkNorm::PerHead | QkNorm::PerHeadTransposed
    ) {
        return no(&format!("q/k norm {:?}", d.qk_norm));
    }
    if d.head_dim as usize > cpu::MAX_HEAD_DIM || d.n_kv_heads <= 0 || d.n_heads % d.n_kv_heads != 0
    {
        return no("this head layout");
    }
    Ok(m)
}

fn floats<'m>(a: &'m mlx_core::Array, what: &str) -> Result<Floats<'m>> {
    Floats::from_array(a).map_err(|e| unsup(format!("{what}: {e}")))
}

fn matrix<'m>(l: &'m Linear, what: &str) -> Result<(Matrix<'m>, Option<Floats<'m>>)> {
    let (rows, cols) = l.dims()?;
    let (rows, cols) = (rows as usize, cols as usize);
    match l {
        Linear::Dense { weight, bias } => Ok((
            Matrix::dense(floats(weight, what)?, rows, cols)?,
            bias.as_ref().map(|b| floats(b, what)).transpose()?,
        )),
        Linear::Quantized { weight, bias } => Ok((
            quantized(weight, rows, cols, what)?,
            bias.as_ref().map(|b| floats(b, what)).transpose()?,
        )),
        Linear::Ggml { weight, bias } => Ok((
            weight
                .cpu_view()
                .map_err(|e| unsup(format!("{what}: {e}")))?,
            bias.as_ref().map(|b| floats(b, what)).transpose()?,
        )),
        Linear::Adapted(_) => Err(unsup(format!("{what}: an adapted (LoRA/DoRA) linear"))),
        Linear::Trellis { weight, bias } => Ok((
            Matrix::trellis(
                weight
                    .cpu_view()
                    .map_err(|e| unsup(format!("{what}: {e}")))?,
            ),
            bias.as_ref().map(|b| floats(b, what)).transpose()?,
        )),
    }
}

fn quantized<'m>(
    q: &'m mlx_models::layers::QuantizedWeight,
    rows: usize,
    cols: usize,
    what: &str,
) -> Result<Matrix<'m>> {
    if q.mode != mlx_core::quantized::QuantMode::Affine {
        return Err(unsup(format!("{what}: {} quantization", q.mode.name())));
    }
    let biases = q
        .biases
        .as_ref()
        .ok_or_else(|| unsup(format!("{what}: affine weights without biases")))?;
    let words = q
        .weight
        .as_slice::<u32>()
        .map_err(|e| unsup(format!("{what}: {e}")))?;
    if q.symmetric {
        // A GGUF file's Q4_0 / Q8_0 biases, `-2^(bits - 1) x scales`, left unevaluated at
        // load (`QuantizedWeight::symmetric`): the kernels form them from the scales, with
        // the bits of the materialized ones, and the lazy array stays unevaluated (where the
        // MLX forward already computed it, the same bits either way).
        if let Ok(m) = Matrix::symmetric(
            words,
            floats(&q.scales, what)?,
            rows,
            cols,
            q.bits as u32,
            q.group_size as usize,
        ) {
            return Ok(m);
        }
    }
    // Biases another reader left lazy are computed once here (the MLX forward's bits).
    biases
        .eval()
        .map_err(|e| unsup(format!("{what}: biases: {e}")))?;
    Matrix::affine(
        words,
        floats(&q.scales, what)?,
        floats(biases, what)?,
        rows,
        cols,
        q.bits as u32,
        q.group_size as usize,
    )
    .map_err(|e| unsup(format!("{what}: {e}")))
}

/// An RMSNorm's scale as the kernels read it.
enum NormW<'m> {
    /// `rms_norm(x, w)`: the loaded weight in place.
    Plain(Floats<'m>),
    /// Gemma's `rms_norm(x, 1.0 + w)`: `1 + w` computed once, rounded to the weight's dtype as
    /// mlx-lm's weak-scalar add leaves it (a vector of the hidden or head size, not a weight
    /// copy).
    Offset(Vec<f32>),
}

impl NormW<'_> {
    fn floats(&self) -> Floats<'_> {
        match self {
            NormW::Plain(f) => *f,
            NormW::Offset(v) => Floats::F32(v),
        }
    }

    fn len(&self) -> usize {
        match self {
            NormW::Plain(f) => f.len(),
            NormW::Offset(v) => v.len(),
        }
    }
}

fn rms_weight<'m>(n: Option<&'m Norm>, what: &str) -> Result<NormW<'m>> {
    match n {
        Some(Norm::Rms(r)) => Ok(NormW::Plain(floats(&r.weight, what)?)),
        Some(Norm::RmsOffset(r)) => {
            let w = floats(&r.weight, what)?;
            let one_plus = (0..w.len())
                .map(|i| match w {
                    Floats::F32(_) => 1.0 + w.get(i),
                    Floats::F16(_) => f16::from_f32(1.0 + w.get(i)).to_f32(),
                    Floats::Bf16(_) => half::bf16::from_f32(1.0 + w.get(i)).to_f32(),
                })
                .collect();
            Ok(NormW::Offset(one_plus))
        }
        _ => Err(unsup(format!("{what}: not a weighted RMSNorm"))),
    }
}

/// The rotary embedding of a layer: inverse frequencies and the position multiplier.
#[derive(Clone, Debug, PartialEq)]
struct RopeTable {
    traditional: bool,
    scale: f32,
    inv: Vec<f32>,
}

fn rope_table(r: Option<&Rope>, what: &str) -> Result<RopeTable> {
    match r {
        Some(Rope::Base {
            dims,
            traditional,
            base,
            scale,
        }) => {
            let mut inv = vec![0f32; *dims as usize / 2];
            cpu::rope_inv_freqs(*dims as usize, Some(*base), None, &mut inv)?;
            Ok(RopeTable {
                traditional: *traditional,
                scale: *scale,
                inv,
            })
        }
        Some(Rope::Freqs {
            dims,
            traditional,
            freqs,
            input_scale: None,
        }) => {
            freqs.eval()?;
            let mut inv = vec![0f32; *dims as usize / 2];
            cpu::rope_inv_freqs(*dims as usize, None, Some(floats(freqs, what)?), &mut inv)?;
            Ok(RopeTable {
                traditional: *traditional,
                scale: 1.0,
                inv,
            })
        }
        _ => Err(unsup(format!(
            "{what}: this RoPE variant (dynamic NTK, or a scaled frequency table)"
        ))),
    }
}

struct Layer<'m> {
    attn_norm: NormW<'m>,
    mlp_norm: NormW<'m>,
    /// Sandwich rows (Gemma 2 / 3): the norms of the attention's and the MLP's outputs
    /// before each residual add.
    post_attn_norm: Option<NormW<'m>>,
    post_mlp_norm: Option<NormW<'m>>,
    q: (Matrix<'m>, Option<Floats<'m>>),
    k: (Matrix<'m>, Option<Floats<'m>>),
    v: (Matrix<'m>, Option<Floats<'m>>),
    o: (Matrix<'m>, Option<Floats<'m>>),
    q_norm: Option<NormW<'m>>,
    k_norm: Option<NormW<'m>>,
    gate: (Matrix<'m>, Option<Floats<'m>>),
    up: (Matrix<'m>, Option<Floats<'m>>),
    down: (Matrix<'m>, Option<Floats<'m>>),
    rope: RopeTable,
    /// A sliding-window layer: each query sees its own and the `window - 1` positions before
    /// it (mlx-lm's `create_causal_mask(..., window_size)`).
    window: Option<usize>,
}

fn layer<'m>(d: &Descriptor, v: LayerView<'m>, i: usize) -> Result<Layer<'m>> {
    let w = |s: &str| format!("layer {i} {s}");
    let (Some(q), Some(k), Some(vv)) = (v.q, v.k, v.v) else {
        return Err(unsup(format!(
            "`{}`: a fused q/k/v projection",
            d.model_type
        )));
    };
    if v.head_gate || v.other_qk_norm {
        return Err(unsup(format!(
            "`{}`: a gated or layer-normed attention",
            d.model_type
        )));
    }
    let Some((gate, up, down)) = v.mlp.gate_up_down() else {
        return Err(unsup(format!(
            "`{}`: a fused gate/up projection",
            d.model_type
        )));
    };
    let (q_norm, k_norm) = match (v.q_norm, v.k_norm) {
        (Some(a), Some(b)) => (
            Some(rms_weight(Some(a), &w("q_norm"))?),
            Some(rms_weight(Some(b), &w("k_norm"))?),
        ),
        _ => (None, None),
    };
    let sandwich = d.placement == Placement::Sandwich;
    let post = |n: Option<&'m Norm>, what: &str| -> Result<Option<NormW<'m>>> {
        if sandwich {
            rms_weight(n, &w(what)).map(Some)
        } else {
            Ok(None)
        }
    };
    let window = if v.sliding {
        let win = d.sliding_mask_window.or(d.sliding_window).unwrap_or(0);
        if win == 0 {
            return Err(unsup(format!(
                "layer {i}: a sliding layer without a window"
            )));
        }
        Some(win)
    } else {
        None
    };
    Ok(Layer {
        attn_norm: rms_weight(v.pre_attn_norm, &w("input norm"))?,
        mlp_norm: rms_weight(v.pre_mlp_norm, &w("pre-MLP norm"))?,
        post_attn_norm: post(v.post_attn_norm, "post-attention norm")?,
        post_mlp_norm: post(v.post_mlp_norm, "post-MLP norm")?,
        q: matrix(q, &w("q_proj"))?,
        k: matrix(k, &w("k_proj"))?,
        v: matrix(vv, &w("v_proj"))?,
        o: matrix(v.o, &w("o_proj"))?,
        q_norm,
        k_norm,
        gate: matrix(gate, &w("gate_proj"))?,
        up: matrix(up, &w("up_proj"))?,
        down: matrix(down, &w("down_proj"))?,
        rope: rope_table(v.rope, &w("rope"))?,
        window,
    })
}

/// What [`CpuDecoder::feed_all`] calls with each position's logits.
type LogitsFn<'a> = dyn FnMut(usize, &[f32]) + 'a;

/// The model's weights as the kernels read them (views of the loaded arrays, never copied) and
/// its shape: shared by every sequence a [`CpuBatch`] decodes.
struct Weights<'m> {
    hidden: usize,
    n_heads: usize,
    n_kv: usize,
    head_dim: usize,
    vocab: usize,
    eps: f32,
    scale: f32,
    embed: Matrix<'m>,
    head: (Matrix<'m>, Option<Floats<'m>>),
    final_norm: NormW<'m>,
    layers: Vec<Layer<'m>>,
    /// The embeddings' multiplier ([`EmbedScale`]), as the exact path rounds it.
    embed_scale: Option<f32>,
    /// The MLP's gate activation.
    act: MlpKind,
}

impl<'m> Weights<'m> {
    fn new(model: &'m dyn LanguageModel) -> Result<Self> {
        let m = check(model)?;
        let d = m.descriptor();
        let hidden = d.hidden_size as usize;
        let (n_heads, n_kv, head_dim) = (
            d.n_heads as usize,
            d.n_kv_heads as usize,
            d.head_dim as usize,
        );
        let embed = match m.embed_tokens() {
            Embedding::Dense(w) => {
                let (r, c) = (w.shape()[0] as usize, w.shape()[1] as usize);
                Matrix::dense(floats(w, "embed_tokens")?, r, c)?
            }
            Embedding::Quantized(q) => {
                let (r, c) = m.embed_tokens().shape();
                quantized(q, r as usize, c as usize, "embed_tokens")?
            }
            Embedding::Ggml(g) => g
                .cpu_view()
                .map_err(|e| unsup(format!("embed_tokens: {e}")))?,
            Embedding::Adapted(_) => return Err(unsup("an adapted embedding")),
        };
        let head = match m.lm_head() {
            Some(l) => matrix(l, "lm_head")?,
            None => (embed, None),
        };
        let vocab = head.0.rows();
        let mut layers = Vec::with_capacity(m.num_layers());
        for i in 0..m.num_layers() {
            let v = m
                .layer_view(i)
                .ok_or_else(|| unsup(format!("layer {i} is missing")))?;
            layers.push(layer(d, v, i)?);
        }
        if cpu::lane4_from_env() {
            // The lane kernel's layouts of the layers' 4-bit products (made by the first
            // decoder over this model, kept with it: `Model::cpu_lanes`).
            let mut ws: Vec<Matrix<'m>> = layers
                .iter()
                .flat_map(|l: &Layer<'m>| [l.q.0, l.k.0, l.v.0, l.o.0, l.gate.0, l.up.0, l.down.0])
                .collect();
            m.cpu_lanes().attach(&mut ws);
            for (l, w) in layers.iter_mut().zip(ws.chunks(7)) {
                (l.q.0, l.k.0, l.v.0, l.o.0) = (w[0], w[1], w[2], w[3]);
                (l.gate.0, l.up.0, l.down.0) = (w[4], w[5], w[6]);
            }
        }
        let final_norm = rms_weight(Some(m.final_norm()), "final norm")?;
        for (i, l) in layers.iter().enumerate() {
            let shapes = [
                ("q_proj", &l.q.0, n_heads * head_dim, hidden),
                ("k_proj", &l.k.0, n_kv * head_dim, hidden),
                ("v_proj", &l.v.0, n_kv * head_dim, hidden),
                ("o_proj", &l.o.0, hidden, n_heads * head_dim),
                ("gate_proj", &l.gate.0, l.gate.0.rows(), hidden),
                ("up_proj", &l.up.0, l.gate.0.rows(), hidden),
                ("down_proj", &l.down.0, hidden, l.gate.0.rows()),
            ];
            for (name, w, r, c) in shapes {
                if (w.rows(), w.cols()) != (r, c) {
                    return Err(unsup(format!(
                        "layer {i} {name}: shape ({}, {}), expected ({r}, {c})",
                        w.rows(),
                        w.cols()
                    )));
                }
            }
            let post = [&l.post_attn_norm, &l.post_mlp_norm];
            if l.attn_norm.len() != hidden
                || l.mlp_norm.len() != hidden
                || post
                    .iter()
                    .any(|n| n.as_ref().is_some_and(|n| n.len() != hidden))
            {
                return Err(unsup(format!("layer {i}: norm width")));
            }
            if l.q_norm.as_ref().is_some_and(|n| n.len() != head_dim)
                || l.k_norm.as_ref().is_some_and(|n| n.len() != head_dim)
            {
                return Err(unsup(format!("layer {i}: q/k norm width")));
            }
            if 2 * l.rope.inv.len() > head_dim {
                return Err(unsup(format!("layer {i}: rope wider than a head")));
            }
        }
        if embed.cols() != hidden || head.0.cols() != hidden || final_norm.len() != hidden {
            return Err(unsup("embedding, head or final norm width"));
        }
        // Every weight a step streams, on huge pages where the kernel allows (fewer TLB misses
        // and page walks per step; `cpu::prefer_huge_pages`, a hint: no contents change).
        let mut spans = head.0.spans();
        for l in &layers {
            for (w, _) in [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down] {
                spans.extend(w.spans());
            }
        }
        cpu::prefer_huge_pages(&spans);
        Ok(Weights {
            hidden,
            n_heads,
            n_kv,
            head_dim,
            vocab,
            eps: d.norm_eps,
            scale: d.attn_scale as f32,
            embed,
            head,
            final_norm,
            layers,
            embed_scale: match d.embed_scale {
                EmbedScale::None => None,
                // `h * s`, a weak Python float: rounded to float32 here.
                EmbedScale::Weak(s) => Some(s as f32),
                // `h * mx.array(s, mx.bfloat16).astype(h.dtype)`.
                EmbedScale::Bf16(s) => Some(half::bf16::from_f64(s).to_f32()),
            },
            act: d.mlp,
        })
    }

    /// The embedding rows of `tokens` into `x` (`(tokens.len(), hidden)`), scaled as the
    /// row's embedding scale says.
    fn embed_rows(&self, tokens: &[u32], x: &mut [f32]) -> Result<()> {
        let hid = self.hidden;
        for (i, &tok) in tokens.iter().enumerate() {
            let row = &mut x[i * hid..(i + 1) * hid];
            self.embed.row_to(tok as usize, row)?;
            if let Some(s) = self.embed_scale {
                row.iter_mut().for_each(|v| *v *= s);
            }
        }
        Ok(())
    }

    fn inter(&self) -> usize {
        self.layers.first().map_or(0, |l| l.gate.0.rows())
    }

    /// Token ids below the embedding's rows, else the error naming the first that is not.
    fn check_ids(&self, tokens: &[u32]) -> Result<()> {
        let vocab = self.embed.rows();
        match tokens.iter().find(|&&x| x as usize >= vocab) {
            Some(bad) => Err(EngineError::Input {
                what: "tokens".into(),
                problem: format!(
                    "token id {bad} is outside the model's vocabulary of {vocab} tokens"
                ),
            }),
            None => Ok(()),
        }
    }

    fn attention_shape(&self, capacity: usize) -> AttentionShape {
        AttentionShape {
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv,
            head_dim: self.head_dim,
            capacity,
        }
    }
}

/// The element type of a [`CpuCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvDtype {
    /// Float16 (the default, as llama.cpp's cache): half the bytes a decode step's attention
    /// reads; keys and values rounded to nearest even when written, widened exactly when read.
    #[default]
    F16,
    /// Float32: the exact path's values (the tight parity tests).
    F32,
}

/// One layer's keys or values.
#[derive(Clone)]
enum KvBuf {
    F16(ZeroedBuf<f16>),
    F32(ZeroedBuf<f32>),
}

impl KvBuf {
    /// Zeros on pages fresh from the system ([`ZeroedBuf`]), so that pages a sequence never
    /// reaches are never touched: a fresh cache costs resident memory as its positions fill,
    /// not all at once (issue #31's peak: the prompt block's scratch is given back before the
    /// decode steps fill the rest). `vec![0; n]` (`calloc`) cleared every page of a block
    /// reused from the holes loading leaves in the heap (session 32: ~2.9 MB of a SmolLM2
    /// cache's 128 generated positions resident from the start).
    fn new(dtype: KvDtype, n: usize) -> KvBuf {
        match dtype {
            KvDtype::F16 => KvBuf::F16(ZeroedBuf::new(n)),
            KvDtype::F32 => KvBuf::F32(ZeroedBuf::new(n)),
        }
    }

    /// `self[at..at + src.len()] = src` (rounded to the buffer's type).
    fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            KvBuf::F16(b) => b[at..at + src.len()].convert_from_f32_slice(src),
            KvBuf::F32(b) => b[at..at + src.len()].copy_from_slice(src),
        }
    }

    /// The same heads with room for `new` positions instead of `old`, the first `n` kept.
    fn regrow(&self, heads: usize, hd: usize, old: usize, new: usize, n: usize) -> KvBuf {
        fn each<T: ZeroBits>(
            a: &[T],
            heads: usize,
            hd: usize,
            old: usize,
            new: usize,
            n: usize,
        ) -> ZeroedBuf<T> {
            let mut b = ZeroedBuf::new(heads * new * hd);
            for h in 0..heads {
                b[h * new * hd..h * new * hd + n * hd]
                    .copy_from_slice(&a[h * old * hd..h * old * hd + n * hd]);
            }
            b
        }
        match self {
            KvBuf::F16(a) => KvBuf::F16(each(a, heads, hd, old, new, n)),
            KvBuf::F32(a) => KvBuf::F32(each(a, heads, hd, old, new, n)),
        }
    }
}

/// One sequence's KV cache ([`KvDtype::F16`] by default): per layer, keys and values
/// `(n_kv, capacity, head_dim)`. A [`CpuBatch`] decodes any number of them; cloning one
/// forks the sequence.
#[derive(Clone)]
pub struct CpuCache {
    dtype: KvDtype,
    keys: Vec<KvBuf>,
    values: Vec<KvBuf>,
    n_kv: usize,
    head_dim: usize,
    capacity: usize,
    pos: usize,
}

impl std::fmt::Debug for CpuCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CpuCache({} layers, {} of {} positions)",
            self.keys.len(),
            self.pos,
            self.capacity
        )
    }
}

impl CpuCache {
    fn new(w: &Weights<'_>, capacity: usize, dtype: KvDtype) -> CpuCache {
        let capacity = capacity.max(1);
        let kd = w.n_kv * w.head_dim;
        let n = w.layers.len();
        CpuCache {
            dtype,
            keys: (0..n).map(|_| KvBuf::new(dtype, kd * capacity)).collect(),
            values: (0..n).map(|_| KvBuf::new(dtype, kd * capacity)).collect(),
            n_kv: w.n_kv,
            head_dim: w.head_dim,
            capacity,
            pos: 0,
        }
    }

    /// Tokens the cache holds.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes of keys and values allocated.
    pub fn nbytes(&self) -> usize {
        let each = match self.dtype {
            KvDtype::F16 => 2,
            KvDtype::F32 => 4,
        };
        2 * self.keys.len() * self.n_kv * self.head_dim * self.capacity * each
    }

    /// The type its keys and values are stored in.
    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Empties the cache (its memory is kept).
    pub fn reset(&mut self) {
        self.pos = 0;
    }

    /// Keeps the first `n` tokens (all when it holds fewer).
    pub fn truncate(&mut self, n: usize) {
        self.pos = self.pos.min(n);
    }

    fn fits(&self, w: &Weights<'_>) -> Result<()> {
        if self.keys.len() != w.layers.len() || self.n_kv != w.n_kv || self.head_dim != w.head_dim {
            return Err(EngineError::Cache {
                what: "CPU cache".into(),
                problem: format!(
                "a CPU cache of {} layers, {} KV heads of {} for a model of {} layers, {} of {}",
                self.keys.len(),
                self.n_kv,
                self.head_dim,
                w.layers.len(),
                w.n_kv,
                w.head_dim
            ),
            });
        }
        Ok(())
    }

    fn grow(&mut self, need: usize) {
        if need <= self.capacity {
            return;
        }
        let new = need.max(self.capacity * 2);
        let hd = self.head_dim;
        let (old, n) = (self.capacity, self.pos);
        for cache in self.keys.iter_mut().chain(self.values.iter_mut()) {
            *cache = cache.regrow(self.n_kv, hd, old, new, n);
        }
        self.capacity = new;
    }

    /// Writes one token's keys and values (`(n_kv, head_dim)` each) at position `at`,
    /// rounded to float16.
    fn put(&mut self, li: usize, at: usize, k: &[f32], v: &[f32]) {
        let hd = self.head_dim;
        let (kc, vc) = (&mut self.keys[li], &mut self.values[li]);
        for kh in 0..self.n_kv {
            let o = (kh * self.capacity + at) * hd;
            kc.write(o, &k[kh * hd..(kh + 1) * hd]);
            vc.write(o, &v[kh * hd..(kh + 1) * hd]);
        }
    }
}

/// Scratch buffers for `rows` tokens at once, allocated once (nothing is allocated per step).
struct Scratch {
    rows: usize,
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// `(logit_rows, vocab)`.
    logits: Vec<f32>,
}

/// `s`, made room for a prompt block ([`BLOCK`] tokens and one row of logits) if it has none.
fn block_scratch<'s>(w: &Weights<'_>, s: &'s mut Scratch) -> &'s mut Scratch {
    if s.rows < BLOCK {
        *s = Scratch::new(w, BLOCK, 1);
    }
    s
}

impl Scratch {
    fn new(w: &Weights<'_>, rows: usize, logit_rows: usize) -> Scratch {
        let (qd, kd, inter) = (w.n_heads * w.head_dim, w.n_kv * w.head_dim, w.inter());
        Scratch {
            rows,
            x: vec![0.0; rows * w.hidden],
            h: vec![0.0; rows * w.hidden],
            q: vec![0.0; rows * qd],
            k: vec![0.0; rows * kd],
            v: vec![0.0; rows * kd],
            attn: vec![0.0; rows * qd],
            o: vec![0.0; rows * w.hidden],
            gate: vec![0.0; rows * inter],
            up: vec![0.0; rows * inter],
            logits: vec![0.0; logit_rows * w.vocab],
        }
    }
}

/// `x += o` elementwise.
fn add(x: &mut [f32], o: &[f32]) {
    for (a, b) in x.iter_mut().zip(o.iter()) {
        *a += b;
    }
}

/// The residual add of a block's branch output `o`: `x += o`, or on sandwich rows
/// `x += rms_norm(o, post)` (through `tmp`, of `x`'s length).
fn residual(
    x: &mut [f32],
    o: &[f32],
    post: Option<&NormW<'_>>,
    eps: f32,
    tmp: &mut [f32],
) -> Result<()> {
    match post {
        Some(n) => {
            cpu::rms_norm(o, n.floats(), eps, tmp)?;
            add(x, tmp);
        }
        None => add(x, o),
    }
    Ok(())
}

/// Whether a verification pass's per-row elementwise work (the residual adds, the RMSNorms
/// around the products, SiLU x up, the final norm) runs with its rows split over the pool's
/// workers ([`split_rows`]); `MLX_CPU_ROWSPLIT=0`: on the caller, row after row, as a decode
/// step does (read once; any other value leaves the default, on). Each row's operations are
/// the same either way (bit-identical); only which thread runs them differs.
fn rows_split_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLX_CPU_ROWSPLIT").map_or(true, |v| v != "0"))
}

/// The most rows [`split_rows`] takes (a verification pass of more runs its rows serially).
const SPLIT_MAX: usize = 16;

/// One row's work of a [`split_rows`] stage: `(row, a_row, b_row)`.
type RowFn<'f> = dyn Fn(usize, &mut [f32], &mut [f32]) -> Result<()> + Sync + 'f;

/// `f(i, a_i, b_i)` for each row `i` of `n`, `a` and `b` cut into rows of `da` and `db`
/// floats, the rows handed out over the pool's workers in one pool run: each worker its own
/// region of consecutive rows first, the same in every stage (so a row's data stays in one
/// core's cache from stage to stage), then the others' rows left (`cpu::Regions`: a worker
/// that does not join leaves its rows to the others). Nothing allocated: the rows' slices
/// wait in a stack array. The first error any row returns is returned.
fn split_rows(
    ctx: &CpuContext,
    n: usize,
    a: &mut [f32],
    da: usize,
    b: &mut [f32],
    db: usize,
    f: &RowFn<'_>,
) -> Result<()> {
    use std::sync::Mutex;
    if n > SPLIT_MAX || a.len() < n * da || b.len() < n * db {
        return Err(EngineError::Input {
            what: "cpu_decode::split_rows".into(),
            problem: format!(
                "{n} rows of {da} and {db} floats over {} and {} (at most {SPLIT_MAX} rows)",
                a.len(),
                b.len()
            ),
        });
    }
    type Row<'r> = Mutex<Option<(&'r mut [f32], &'r mut [f32])>>;
    let cells: [Row<'_>; SPLIT_MAX] = std::array::from_fn(|_| Mutex::new(None));
    for ((c, ar), br) in cells
        .iter()
        .zip(a[..n * da].chunks_exact_mut(da.max(1)))
        .zip(b[..n * db].chunks_exact_mut(db.max(1)))
    {
        *c.lock().unwrap_or_else(|e| e.into_inner()) = Some((ar, br));
    }
    let regions = cpu::Regions::new(n, ctx.pool.threads());
    let err: Mutex<Option<EngineError>> = Mutex::new(None);
    ctx.pool.run(&|worker, _| {
        while let Some(i) = regions.claim(worker) {
            let row = cells[i].lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some((ar, br)) = row {
                if let Err(e) = f(i, ar, br) {
                    err.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get_or_insert(e);
                }
            }
        }
    });
    match err.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// One row's residual add of a branch output `o` into `x` (through `post` on sandwich rows,
/// `h` the temporary, as [`residual`]), then `h = rms_norm(x, norm)`: the elementwise work
/// between a product and the next one's inputs, for one row.
fn residual_norm(
    x: &mut [f32],
    h: &mut [f32],
    o: Option<(&[f32], Option<&NormW<'_>>)>,
    norm: &NormW<'_>,
    eps: f32,
) -> Result<()> {
    if let Some((o, post)) = o {
        residual(x, o, post, eps, h)?;
    }
    cpu::rms_norm(x, norm.floats(), eps, h)?;
    Ok(())
}

/// Which rows one pass through the layers runs, and the caches their keys and values go to.
enum Rows<'c, 'r> {
    /// Consecutive tokens of one sequence (a prompt block) from its cache's position on: the
    /// products read each weight row once for all of them (`cpu::matmul_t`).
    Block(&'c mut CpuCache),
    /// Consecutive tokens of one sequence verified together (speculative decoding): positions,
    /// RoPE, cache writes and attention as [`Rows::Block`] (each row of `cpu::attention`
    /// attends up to its own position, as alone), the products as [`Rows::Each`], so every row
    /// gets the bits it gets fed alone while each weight row is still read once for all.
    /// The last field: whether the elementwise stages run the rows over the workers
    /// ([`split_rows`]).
    Seq(&'c mut CpuCache, &'c mut RowsScratch, bool),
    /// One token of each of several sequences, each at its own cache's position: every row
    /// gets the bits it gets alone (`cpu::matmul_t_each`). A single sequence's decode step is
    /// this with one row.
    Each(&'c mut [&'r mut CpuCache], &'c mut RowsScratch),
}

impl Rows<'_, '_> {
    /// `normed`: `x` is an RMSNorm's output (else a decode step's products take
    /// [`Activations::unnormed`]). `pf`: the share of layer `pf.0`'s keys and values to
    /// prefetch meanwhile ([`kv_prefetch`]; decode steps of one sequence and verification
    /// passes only).
    fn matmul(
        &mut self,
        ctx: &CpuContext,
        x: &[f32],
        n: usize,
        jobs: &mut [MatJob<'_, '_>],
        normed: bool,
        pf: Option<(&Weights<'_>, usize, [f32; 2])>,
    ) -> Result<()> {
        let act = if normed {
            ctx.activations
        } else {
            ctx.activations.unnormed()
        };
        match self {
            Rows::Block(_) => cpu::matmul_t(ctx, x, n, jobs)?,
            Rows::Seq(c, rs, _) => {
                let pf = pf.and_then(|(w, li, share)| kv_prefetch(w, c, li, share));
                cpu::matmul_t_each_prefetch(ctx, act, x, n, jobs, rs, pf.as_ref())?
            }
            Rows::Each(cs, rs) => {
                let pf = match (&cs[..], pf) {
                    ([c], Some((w, li, share))) => kv_prefetch(w, c, li, share),
                    _ => None,
                };
                cpu::matmul_t_each_prefetch(ctx, act, x, n, jobs, rs, pf.as_ref())?
            }
        }
        Ok(())
    }
}

/// Whether decode steps prefetch the next layer's keys and values (`MLX_CPU_KVPF=0`: not;
/// read once).
fn kv_prefetch_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLX_CPU_KVPF").map_or(true, |v| v != "0"))
}

/// The keys and values of layer `li` that the next attention over `c` reads (its positions
/// before `c.pos`, from the window's start on a sliding layer), `share` of them: prefetched
/// into L2 during the products before that attention (the MLP of the layer before, or the
/// head for layer 0), as the weights streamed since the last step evicted them. A hint: no
/// result changes.
fn kv_prefetch<'c>(
    w: &Weights<'_>,
    c: &'c CpuCache,
    li: usize,
    share: [f32; 2],
) -> Option<KvPrefetch<'c>> {
    if !kv_prefetch_on() || li >= c.keys.len() {
        return None;
    }
    let lo = w.layers[li]
        .window
        .map_or(0, |win| (c.pos + 1).saturating_sub(win))
        .min(c.pos);
    let bufs = match (&c.keys[li], &c.values[li]) {
        (KvBuf::F16(k), KvBuf::F16(v)) => [Floats::F16(k), Floats::F16(v)],
        (KvBuf::F32(k), KvBuf::F32(v)) => [Floats::F32(k), Floats::F32(v)],
        _ => return None,
    };
    Some(KvPrefetch {
        bufs,
        heads: c.n_kv,
        stride: c.capacity * c.head_dim,
        start: lo * c.head_dim,
        len: (c.pos - lo) * c.head_dim,
        share,
    })
}

/// The parts of a decode step [`Profile`] times.
#[derive(Clone, Copy)]
enum Phase {
    Embed,
    Elementwise,
    Qkv,
    Attention,
    O,
    GateUp,
    Down,
    Head,
    /// Between the end of one step and the start of the next: the caller's sampling,
    /// detokenizing and printing.
    Outside,
}

const PHASES: [(&str, &str); 9] = [
    ("embed", "embedding row lookup"),
    (
        "elementwise",
        "RMSNorms, RoPE, KV writes, residual adds, SiLU*up",
    ),
    ("qkv", "q/k/v products (one pool run)"),
    (
        "attention",
        "decode attention (one pool run; a batched step's: one a row)",
    ),
    ("o_proj", "o product (one pool run)"),
    ("gate_up", "gate/up products (one pool run)"),
    ("down", "down product (one pool run)"),
    ("lm_head", "final norm and head product (one pool run)"),
    (
        "outside",
        "between steps: the caller's sampling, detokenizing, printing",
    ),
];

/// Wall time per part of the decode steps (and, in a second table, of the prompt blocks),
/// when `MLX_CPU_PROFILE` is set (read once when a decoder is made); printed to stderr when
/// the decoder is dropped. Off, it costs one branch a part.
#[derive(Default)]
struct Profile {
    on: bool,
    steps: u64,
    rows: u64,
    dispatches: u64,
    ns: [u64; PHASES.len()],
    last: Option<std::time::Instant>,
    /// When the last step ended (for [`Phase::Outside`]).
    ended: Option<std::time::Instant>,
}

impl Profile {
    fn from_env() -> Profile {
        Profile {
            on: std::env::var_os("MLX_CPU_PROFILE").is_some_and(|v| !v.is_empty() && v != "0"),
            ..Profile::default()
        }
    }

    fn begin(&mut self, rows: usize) {
        if self.on {
            let now = std::time::Instant::now();
            if let Some(e) = self.ended.take() {
                self.ns[Phase::Outside as usize] += (now - e).as_nanos() as u64;
            }
            self.steps += 1;
            self.rows += rows as u64;
            self.last = Some(now);
        }
    }

    /// Charges the time since the last lap to `p` (`runs`: pool dispatches it made).
    #[inline]
    fn lap(&mut self, p: Phase, runs: usize) {
        if let (true, Some(l)) = (self.on, self.last) {
            let now = std::time::Instant::now();
            self.ns[p as usize] += (now - l).as_nanos() as u64;
            self.dispatches += runs as u64;
            self.last = Some(now);
        }
    }

    fn end(&mut self) {
        if self.on {
            self.ended = Some(std::time::Instant::now());
        }
    }

    /// The table: one line a part, `name ms_per_step share description`; `what` names the
    /// steps (`decode steps`, `prompt blocks`).
    fn report(&self, what: &str) -> Option<String> {
        if !self.on || self.steps == 0 {
            return None;
        }
        let total: u64 = self.ns.iter().sum();
        let steps = self.steps as f64;
        let mut out = format!(
            "cpu decoder profile: {} {what}, {:.2} rows a step, {:.1} pool runs a step, \
             {:.3} ms a step in all\n",
            self.steps,
            self.rows as f64 / steps,
            self.dispatches as f64 / steps,
            total as f64 / steps / 1e6
        );
        for (i, (name, what)) in PHASES.iter().enumerate() {
            out += &format!(
                "cpu-profile {name:<12} {:>8.3} ms/step {:>5.1}%  {what}\n",
                self.ns[i] as f64 / steps / 1e6,
                100.0 * self.ns[i] as f64 / total.max(1) as f64
            );
        }
        Some(out)
    }
}

/// One query row at `pos` of a sliding layer over the keys of its window, `[pos + 1 -
/// window, pos]`, of a cache of `cap` positions per KV head. Where the window reaches back to
/// the start this is [`attend`]; else each KV head's query group is attended over the cache
/// from the window's first position on (the kernel's cache view starts there; one pool run
/// a KV head).
#[allow(clippy::too_many_arguments)]
fn attend_window(
    ctx: &CpuContext,
    w: &Weights<'_>,
    cap: usize,
    q: &[f32],
    k: &KvBuf,
    v: &KvBuf,
    pos: usize,
    window: usize,
    out: &mut [f32],
) -> Result<()> {
    let lo = (pos + 1).saturating_sub(window);
    if lo == 0 {
        return attend(ctx, w.attention_shape(cap), q, k, v, pos, 1, w.scale, out);
    }
    let hd = w.head_dim;
    let group = w.n_heads / w.n_kv;
    let shape = AttentionShape {
        n_heads: group,
        n_kv_heads: 1,
        head_dim: hd,
        capacity: cap - lo,
    };
    for kh in 0..w.n_kv {
        let kv = (kh * cap + lo) * hd..(kh + 1) * cap * hd;
        let qr = kh * group * hd..(kh + 1) * group * hd;
        let (qh, oh) = (&q[qr.clone()], &mut out[qr]);
        match (k, v) {
            (KvBuf::F16(k), KvBuf::F16(v)) => cpu::attention_f16(
                ctx,
                shape,
                qh,
                &k[kv.clone()],
                &v[kv],
                pos - lo,
                1,
                w.scale,
                oh,
            )?,
            (KvBuf::F32(k), KvBuf::F32(v)) => cpu::attention(
                ctx,
                shape,
                qh,
                &k[kv.clone()],
                &v[kv],
                pos - lo,
                1,
                w.scale,
                oh,
            )?,
            _ => return Err(mixed_kv()),
        }
    }
    Ok(())
}

/// [`cpu::attention`] or [`cpu::attention_f16`] as the cache stores.
#[allow(clippy::too_many_arguments)]
fn attend(
    ctx: &CpuContext,
    shape: AttentionShape,
    q: &[f32],
    k: &KvBuf,
    v: &KvBuf,
    start: usize,
    m: usize,
    scale: f32,
    out: &mut [f32],
) -> Result<()> {
    match (k, v) {
        (KvBuf::F16(k), KvBuf::F16(v)) => {
            cpu::attention_f16(ctx, shape, q, k, v, start, m, scale, out)?
        }
        (KvBuf::F32(k), KvBuf::F32(v)) => {
            cpu::attention(ctx, shape, q, k, v, start, m, scale, out)?
        }
        _ => return Err(mixed_kv()),
    }
    Ok(())
}

/// [`cpu::attention_prompt`] or [`cpu::attention_prompt_f16`] as the cache stores (a prompt
/// block of at least [`cpu::PROMPT_MIN_M`] rows, `window` a sliding layer's).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn attend_prompt(
    ctx: &CpuContext,
    shape: AttentionShape,
    q: &[f32],
    k: &KvBuf,
    v: &KvBuf,
    start: usize,
    m: usize,
    window: Option<usize>,
    scale: f32,
    out: &mut [f32],
) -> Result<()> {
    match (k, v) {
        (KvBuf::F16(k), KvBuf::F16(v)) => {
            cpu::attention_prompt_f16(ctx, shape, q, k, v, start, m, window, scale, out)?
        }
        (KvBuf::F32(k), KvBuf::F32(v)) => {
            cpu::attention_prompt(ctx, shape, q, k, v, start, m, window, scale, out)?
        }
        _ => return Err(mixed_kv()),
    }
    Ok(())
}

/// Off x86-64 never called (`prompt` is false there): the per-row kernel.
#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
fn attend_prompt(
    ctx: &CpuContext,
    shape: AttentionShape,
    q: &[f32],
    k: &KvBuf,
    v: &KvBuf,
    start: usize,
    m: usize,
    _window: Option<usize>,
    scale: f32,
    out: &mut [f32],
) -> Result<()> {
    attend(ctx, shape, q, k, v, start, m, scale, out)
}

/// The layers over the `n` embedded rows in `s.x`, then the caches' positions advanced: the
/// one layer body of a prompt block and of a (batched) decode step. Returns whether `s.h`
/// holds the rows' final norm (a verification pass whose rows were split over the workers,
/// [`rows_split_on`]: the last residual add and the final norm ran as one stage), else the
/// head's caller norms `s.x`.
fn layers(
    w: &Weights<'_>,
    ctx: &CpuContext,
    s: &mut Scratch,
    rows: &mut Rows<'_, '_>,
    n: usize,
    prof: &mut Profile,
) -> Result<bool> {
    let (hid, hd) = (w.hidden, w.head_dim);
    let (qd, kd) = (w.n_heads * hd, w.n_kv * hd);
    // A verification pass's elementwise stages with the rows over the workers (one pool run
    // a stage), each row's operations those of its one-token step.
    let split = matches!(rows, Rows::Seq(.., true)) && (2..=SPLIT_MAX).contains(&n);
    // Split only: the last down product's residual add (its post norm on sandwich rows),
    // left to the next stage (the next layer's first norm, or the final norm).
    let mut pending: Option<Option<&NormW<'_>>> = None;
    let isa = ctx.isa;
    for (li, l) in w.layers.iter().enumerate() {
        // The layer whose keys and values the MLP's products prefetch (the head does layer
        // 0's for the next step).
        let next = (li + 1 < w.layers.len()).then_some(li + 1);
        let x = &mut s.x[..n * hid];
        let h = &mut s.h[..n * hid];
        if split {
            let o = &s.o[..n * hid];
            let pend = pending.take();
            split_rows(ctx, n, x, hid, h, hid, &|i, xi, hi| {
                let oi = pend.map(|p| (&o[i * hid..(i + 1) * hid], p));
                residual_norm(xi, hi, oi, &l.attn_norm, w.eps)
            })?;
            prof.lap(Phase::Elementwise, 1);
        } else {
            cpu::rms_norm(x, l.attn_norm.floats(), w.eps, h)?;
            prof.lap(Phase::Elementwise, 0);
        }
        let (q, k, v) = (&mut s.q[..n * qd], &mut s.k[..n * kd], &mut s.v[..n * kd]);
        rows.matmul(
            ctx,
            h,
            n,
            &mut [
                MatJob {
                    w: &l.q.0,
                    bias: l.q.1,
                    out: q,
                },
                MatJob {
                    w: &l.k.0,
                    bias: l.k.1,
                    out: k,
                },
                MatJob {
                    w: &l.v.0,
                    bias: l.v.1,
                    out: v,
                },
            ],
            true,
            None,
        )?;
        prof.lap(Phase::Qkv, 1);
        if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
            // In place through the attention buffer (free at this point).
            let tmp = &mut s.attn[..n * qd];
            cpu::rms_norm(q, qn.floats(), w.eps, tmp)?;
            q.copy_from_slice(tmp);
            let tmp = &mut s.attn[..n * kd];
            cpu::rms_norm(k, kn.floats(), w.eps, tmp)?;
            k.copy_from_slice(tmp);
        }
        let attn = &mut s.attn[..n * qd];
        // A prompt block's rows as one product (`cpu::attention_prompt`); decode steps and
        // verification rows (which must equal rows alone) never.
        #[cfg(target_arch = "x86_64")]
        let prompt = matches!(rows, Rows::Block(_)) && cpu::prompt_applies(ctx, n, hd);
        #[cfg(not(target_arch = "x86_64"))]
        let prompt = false;
        let rope = |qi: &mut [f32], ki: &mut [f32], pos: usize| -> Result<()> {
            let p = pos as f32 * l.rope.scale;
            cpu::rope_pair(qi, ki, hd, l.rope.traditional, &l.rope.inv, p)?;
            Ok(())
        };
        match rows {
            Rows::Block(cache) | Rows::Seq(cache, ..) => {
                let pos = cache.pos;
                for i in 0..n {
                    let (qi, ki) = (&mut q[i * qd..(i + 1) * qd], &mut k[i * kd..(i + 1) * kd]);
                    rope(qi, ki, pos + i)?;
                    cache.put(li, pos + i, ki, &v[i * kd..(i + 1) * kd]);
                }
                prof.lap(Phase::Elementwise, 0);
                let (kc, vc) = (&cache.keys[li], &cache.values[li]);
                match l.window {
                    _ if prompt => {
                        let shape = w.attention_shape(cache.capacity);
                        attend_prompt(ctx, shape, q, kc, vc, pos, n, l.window, w.scale, attn)?;
                    }
                    // The window cuts into some row's past: each row over its own window.
                    Some(win) if pos + n > win => {
                        for i in 0..n {
                            let r = i * qd..(i + 1) * qd;
                            let (qi, oi) = (&q[r.clone()], &mut attn[r]);
                            let cap = cache.capacity;
                            attend_window(ctx, w, cap, qi, kc, vc, pos + i, win, oi)?;
                        }
                    }
                    _ => {
                        let shape = w.attention_shape(cache.capacity);
                        attend(ctx, shape, q, kc, vc, pos, n, w.scale, attn)?;
                    }
                }
                prof.lap(Phase::Attention, 1);
            }
            Rows::Each(caches, _) => {
                for (i, c) in caches.iter_mut().enumerate() {
                    let (qi, ki) = (&mut q[i * qd..(i + 1) * qd], &mut k[i * kd..(i + 1) * kd]);
                    rope(qi, ki, c.pos)?;
                    c.put(li, c.pos, ki, &v[i * kd..(i + 1) * kd]);
                    prof.lap(Phase::Elementwise, 0);
                    let (kc, vc) = (&c.keys[li], &c.values[li]);
                    let out = &mut attn[i * qd..(i + 1) * qd];
                    match l.window {
                        Some(win) => {
                            attend_window(ctx, w, c.capacity, qi, kc, vc, c.pos, win, out)?
                        }
                        None => {
                            let shape = w.attention_shape(c.capacity);
                            attend(ctx, shape, qi, kc, vc, c.pos, 1, w.scale, out)?
                        }
                    }
                    prof.lap(Phase::Attention, 1);
                }
            }
        }
        let o = &mut s.o[..n * hid];
        rows.matmul(
            ctx,
            attn,
            n,
            &mut [MatJob {
                w: &l.o.0,
                bias: l.o.1,
                out: o,
            }],
            false,
            None,
        )?;
        prof.lap(Phase::O, 1);
        if split {
            let (o, post) = (&*o, l.post_attn_norm.as_ref());
            split_rows(ctx, n, x, hid, h, hid, &|i, xi, hi| {
                let oi = Some((&o[i * hid..(i + 1) * hid], post));
                residual_norm(xi, hi, oi, &l.mlp_norm, w.eps)
            })?;
            prof.lap(Phase::Elementwise, 1);
        } else {
            let oi = Some((&*o, l.post_attn_norm.as_ref()));
            residual_norm(x, h, oi, &l.mlp_norm, w.eps)?;
            prof.lap(Phase::Elementwise, 0);
        }
        let inter = l.gate.0.rows();
        let (g, u) = (&mut s.gate[..n * inter], &mut s.up[..n * inter]);
        rows.matmul(
            ctx,
            h,
            n,
            &mut [
                MatJob {
                    w: &l.gate.0,
                    bias: l.gate.1,
                    out: g,
                },
                MatJob {
                    w: &l.up.0,
                    bias: l.up.1,
                    out: u,
                },
            ],
            true,
            next.map(|n| (w, n, [0.0, 0.66])),
        )?;
        prof.lap(Phase::GateUp, 1);
        let gate_up = |g: &mut [f32], u: &[f32]| -> Result<()> {
            match w.act {
                MlpKind::GeGluTanh => cpu::gelu_approx_mul_isa(isa, g, u)?,
                _ => cpu::silu_mul_isa(isa, g, u)?,
            }
            Ok(())
        };
        if split {
            // Each row as its one-token step's call (one row of `inter`).
            split_rows(ctx, n, g, inter, u, inter, &|_, gi, ui| gate_up(gi, ui))?;
            prof.lap(Phase::Elementwise, 1);
        } else {
            gate_up(g, u)?;
            prof.lap(Phase::Elementwise, 0);
        }
        rows.matmul(
            ctx,
            g,
            n,
            &mut [MatJob {
                w: &l.down.0,
                bias: l.down.1,
                out: o,
            }],
            false,
            next.map(|n| (w, n, [0.66, 1.0])),
        )?;
        prof.lap(Phase::Down, 1);
        if split {
            pending = Some(l.post_mlp_norm.as_ref());
        } else {
            residual(x, o, l.post_mlp_norm.as_ref(), w.eps, h)?;
        }
    }
    // The last residual add with the final norm, one stage.
    let normed = match pending {
        Some(post) => {
            let (x, h, o) = (&mut s.x[..n * hid], &mut s.h[..n * hid], &s.o[..n * hid]);
            split_rows(ctx, n, x, hid, h, hid, &|i, xi, hi| {
                let oi = Some((&o[i * hid..(i + 1) * hid], post));
                residual_norm(xi, hi, oi, &w.final_norm, w.eps)
            })?;
            prof.lap(Phase::Elementwise, 1);
            true
        }
        None => false,
    };
    match rows {
        Rows::Block(cache) | Rows::Seq(cache, ..) => cache.pos += n,
        Rows::Each(caches, _) => {
            for c in caches.iter_mut() {
                c.pos += 1;
            }
        }
    }
    Ok(normed)
}

/// Runs `tokens` (at most [`BLOCK`]) of one sequence through the model after what `cache`
/// holds; with `head`, the logits of the last token (or of each, to `all`) into `s.logits`.
#[allow(clippy::too_many_arguments)]
fn block(
    w: &Weights<'_>,
    ctx: &CpuContext,
    cache: &mut CpuCache,
    s: &mut Scratch,
    tokens: &[u32],
    mut all: Option<&mut LogitsFn<'_>>,
    head: bool,
    prof: &mut Profile,
) -> Result<()> {
    let t = tokens.len();
    let hid = w.hidden;
    w.check_ids(tokens)?;
    cache.fits(w)?;
    cache.grow(cache.pos + t);
    // No `end`: the time between prompt blocks is not the caller's.
    prof.begin(t);
    w.embed_rows(tokens, &mut s.x[..t * hid])?;
    prof.lap(Phase::Embed, 0);
    layers(w, ctx, s, &mut Rows::Block(cache), t, prof)?;
    if !head {
        return Ok(());
    }
    let first = if all.is_some() { 0 } else { t - 1 };
    for i in first..t {
        let h = &mut s.h[..hid];
        cpu::rms_norm(
            &s.x[i * hid..(i + 1) * hid],
            w.final_norm.floats(),
            w.eps,
            h,
        )?;
        cpu::matmul_t(
            ctx,
            h,
            1,
            &mut [MatJob {
                w: &w.head.0,
                bias: w.head.1,
                out: &mut s.logits[..w.vocab],
            }],
        )?;
        prof.lap(Phase::Head, 1);
        if let Some(f) = all.as_mut() {
            f(i, &s.logits[..w.vocab]);
        }
    }
    Ok(())
}

/// A decoder over one model's weights with its own KV cache (one sequence).
pub struct CpuDecoder<'m> {
    batch: CpuBatch<'m>,
    cache: CpuCache,
}

impl std::fmt::Debug for CpuDecoder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CpuDecoder({} layers, {} threads, {}, position {})",
            self.batch.w.layers.len(),
            self.batch.ctx.pool.threads(),
            self.batch.ctx.kernels(),
            self.cache.pos
        )
    }
}

impl<'m> CpuDecoder<'m> {
    /// A decoder for `model` on `threads` workers (0: all cores) with room for `capacity`
    /// tokens (it grows past that when needed). An unsupported model is
    /// [`EngineError::CpuDecoderUnsupported`] with the reason.
    pub fn new(model: &'m dyn LanguageModel, threads: usize, capacity: usize) -> Result<Self> {
        let batch = CpuBatch::new(model, threads)?;
        let cache = batch.new_cache(capacity);
        Ok(CpuDecoder { batch, cache })
    }

    /// Whether this decoder was made for `model` (the same loaded model, not an equal one).
    pub fn is_for(&self, model: &dyn LanguageModel) -> bool {
        self.batch.is_for(model)
    }

    /// How the products read their inputs: [`Activations::Int16Q8Int8`] by default (the 4-
    /// and 8-bit products of a decode step as int16 integer dot products, Q8_0 linears' as
    /// int8 ones where the CPU has AVX-512 VNNI, the head's int16 ([`Activations::head`]);
    /// `MLX_CPU_ACTIVATIONS` overrides it when the decoder is made); [`Activations::Int16`]
    /// keeps every product int16; [`Activations::Int8`] and
    /// [`Activations::Int8Vnni`] (int8 inputs for the 4-bit products too) are faster but fail
    /// the quality gate on SmolLM2; [`Activations::F32`] keeps every product in float32.
    pub fn set_activations(&mut self, a: Activations) {
        self.batch.set_activations(a);
    }

    /// See [`CpuDecoder::set_activations`].
    pub fn activations(&self) -> Activations {
        self.batch.activations()
    }

    /// Stores keys and values as `d` ([`KvDtype::F16`] by default; [`KvDtype::F32`] keeps the
    /// exact path's values). A change empties the cache (its room is kept).
    pub fn set_kv_dtype(&mut self, d: KvDtype) {
        self.batch.set_kv_dtype(d);
        if self.cache.dtype != d {
            self.cache = self.batch.new_cache(self.cache.capacity);
        }
    }

    /// Worker threads in use.
    pub fn threads(&self) -> usize {
        self.batch.threads()
    }

    /// See [`CpuBatch::set_rows_split`].
    pub fn set_rows_split(&mut self, on: bool) {
        self.batch.set_rows_split(on);
    }

    /// The instruction set of the kernels (see [`CpuBatch::isa`]).
    pub fn isa(&self) -> &'static str {
        self.batch.isa()
    }

    /// Tokens in the cache.
    pub fn position(&self) -> usize {
        self.cache.pos
    }

    /// Empties the cache.
    pub fn reset(&mut self) {
        self.cache.reset();
    }

    /// Keeps the first `n` tokens of the cache (speculative decoding's rollback).
    pub fn truncate(&mut self, n: usize) {
        self.cache.truncate(n);
    }

    /// Hands the prompt blocks' scratch back to the system once a prompt is in (see
    /// [`CpuBatch::release_prompt_scratch`]; the allocator's free pages too, through
    /// `mlx_core::memory::release_free_memory`), and unmaps the code and read-only data pages
    /// loading and the prompt touched (`mlx_core::memory::release_file_pages`: the decode
    /// steps' own come back at their first touch): `mlx generate` calls it before its first
    /// decode step. Nothing to do (and no trim) where there is none.
    pub fn release_prompt_scratch(&mut self) {
        if self.batch.release_prompt_scratch() {
            let _ = mlx_core::memory::release_free_memory();
            let _ = mlx_core::memory::release_file_pages();
        }
    }

    /// Runs `tokens` through the model after what the cache holds and returns the logits
    /// `(vocab,)` of the last one.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        self.batch.prefill(&mut self.cache, tokens)
    }

    /// Runs `tokens` through the model from an empty cache and returns the last one's final
    /// hidden state (after the final norm, as the model's `forward_hidden`): what a sentence
    /// embedding pools. The cache is left holding `tokens`.
    pub fn hidden_last(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        hidden_last(&mut self.batch, &mut self.cache, tokens)
    }

    /// Runs `tokens` through the model after what the cache holds in one pass and returns
    /// their logits `(tokens.len(), vocab)`: row `i` bit for bit what feeding the tokens one at
    /// a time gives (speculative verification; see [`CpuBatch::verify`]).
    pub fn verify(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        self.batch.verify(&mut self.cache, tokens)
    }

    /// Logits per token.
    pub fn vocab(&self) -> usize {
        self.batch.vocab()
    }

    /// Runs `tokens` through the model and calls `each(i, logits)` with the logits of every
    /// one of them (teacher forcing: tests and perplexity).
    pub fn feed_all(&mut self, tokens: &[u32], each: &mut dyn FnMut(usize, &[f32])) -> Result<()> {
        let b = &mut self.batch;
        let mut done = 0;
        for chunk in tokens.chunks(BLOCK) {
            let mut f = |i: usize, l: &[f32]| each(done + i, l);
            block(
                &b.w,
                &b.ctx,
                &mut self.cache,
                block_scratch(&b.w, &mut b.s),
                chunk,
                Some(&mut f),
                true,
                &mut b.pprof,
            )?;
            done += chunk.len();
        }
        Ok(())
    }
}

/// The CPU decoder for many sequences at once (continuous batching): one copy of the model's
/// weight views and one thread pool, any number of [`CpuCache`]s. A prompt is run into its
/// cache alone ([`CpuBatch::prefill`], blocks of [`BLOCK`] tokens, as [`CpuDecoder::feed`]);
/// a decode step ([`CpuBatch::step`]) runs one token of every given sequence, each at its own
/// position over its own cache, and gives each the logits it would get decoded alone, bit for
/// bit (the products through [`cpu::matmul_t_each`]; norms, RoPE and attention per row as
/// alone). Sequences join and leave between steps: a step takes whichever caches it is given.
pub struct CpuBatch<'m> {
    /// The address of the model it was made for (identity only, see [`CpuBatch::is_for`]).
    model_addr: usize,
    ctx: CpuContext,
    w: Weights<'m>,
    /// Prefill scratch ([`BLOCK`] tokens; made by the first block, see
    /// [`CpuBatch::release_prompt_scratch`]).
    s: Scratch,
    /// Decode-step scratch, grown to the largest batch seen.
    b: Scratch,
    rows: RowsScratch,
    /// Decode-step timings (`MLX_CPU_PROFILE`).
    prof: Profile,
    /// Prompt-block timings (`MLX_CPU_PROFILE`).
    pprof: Profile,
    /// What [`CpuBatch::new_cache`] stores.
    kv_dtype: KvDtype,
    /// Whether a verification pass splits its rows' elementwise work over the workers
    /// ([`rows_split_on`] when made; [`CpuBatch::set_rows_split`]).
    split: bool,
}

impl std::fmt::Debug for CpuBatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CpuBatch({} layers, {} threads, {})",
            self.w.layers.len(),
            self.ctx.pool.threads(),
            self.ctx.kernels()
        )
    }
}

/// The decoder's default activations: [`Activations::Int16Q8Int8`], or what
/// `MLX_CPU_ACTIVATIONS` names (`f32`, `int8`, `int16`, `int16q8int8`, `int8vnni`,
/// `int8normed`: a
/// measurement knob).
fn activations_from_env() -> Result<Activations> {
    match std::env::var("MLX_CPU_ACTIVATIONS").ok().as_deref() {
        None | Some("") | Some("int16q8int8") => Ok(Activations::Int16Q8Int8),
        Some("int8vnni") => Ok(Activations::Int8Vnni),
        Some("int8normed") => Ok(Activations::Int8Normed),
        Some("int16") => Ok(Activations::Int16),
        Some("int8") => Ok(Activations::Int8),
        Some("f32") => Ok(Activations::F32),
        Some(o) => Err(EngineError::Options {
            option: "MLX_CPU_ACTIVATIONS".into(),
            problem: format!("{o}: expected f32, int8, int16, int16q8int8, int8vnni or int8normed"),
        }),
    }
}

/// Whether prompt blocks may use AMX's tiles where the CPU has them (`cpu::amx`): yes unless
/// `MLX_CPU_AMX` is `0`. On by default because the SmolLM2 quality gate (`cargo xtask
/// cpu-quality smollm2`) passes with it on
/// (results/bench/2026-12-05-s27-cpu-prefill/quality-smollm2.txt).
fn amx_from_env() -> Result<bool> {
    match std::env::var("MLX_CPU_AMX").ok().as_deref() {
        None | Some("") | Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(o) => Err(EngineError::Options {
            option: "MLX_CPU_AMX".into(),
            problem: format!("{o}: expected 0 or 1"),
        }),
    }
}

/// The kernels a CPU decoder made now runs (what [`CpuBatch::isa`] would say: `avx512+vnni+amx`
/// where AMX's tiles run prompt blocks (`MLX_CPU_AMX` is not `0`, and the products' inputs are
/// not float32, which never take the tiles), else the instruction
/// set's name), for a statistics line written before the decoder is made.
pub fn kernels() -> &'static str {
    let isa = cpu::Isa::detect();
    cpu::kernels_name(
        isa,
        cpu::amx_available(isa)
            && amx_from_env().unwrap_or(false)
            && !matches!(activations_from_env(), Ok(Activations::F32)),
    )
}

impl<'m> CpuBatch<'m> {
    /// A batch decoder for `model` on `threads` workers (0: all cores), with
    /// the activations of [`CpuDecoder`]. An unsupported model is
    /// [`EngineError::CpuDecoderUnsupported`] with the reason.
    pub fn new(model: &'m dyn LanguageModel, threads: usize) -> Result<Self> {
        let w = Weights::new(model)?;
        // The prompt blocks' scratch is made by the first block ([`block_scratch`]).
        let s = Scratch::new(&w, 0, 0);
        let b = Scratch::new(&w, 0, 0);
        let mut ctx = CpuContext::new(threads)?;
        ctx.activations = activations_from_env()?;
        ctx.amx &= amx_from_env()?;
        Ok(CpuBatch {
            model_addr: model_addr(model),
            ctx,
            w,
            s,
            b,
            rows: RowsScratch::default(),
            prof: Profile::from_env(),
            pprof: Profile::from_env(),
            kv_dtype: KvDtype::default(),
            split: rows_split_on(),
        })
    }

    /// Whether this decoder was made for `model` (the same loaded model, not an equal one).
    pub fn is_for(&self, model: &dyn LanguageModel) -> bool {
        self.model_addr == model_addr(model)
    }

    /// See [`CpuDecoder::set_activations`].
    pub fn set_activations(&mut self, a: Activations) {
        self.ctx.activations = a;
    }

    pub fn activations(&self) -> Activations {
        self.ctx.activations
    }

    /// The element type of the caches [`CpuBatch::new_cache`] makes from now on
    /// ([`KvDtype::F16`] by default).
    pub fn set_kv_dtype(&mut self, d: KvDtype) {
        self.kv_dtype = d;
    }

    /// Worker threads in use.
    pub fn threads(&self) -> usize {
        self.ctx.pool.threads()
    }

    /// Whether [`CpuBatch::verify`] runs its rows' elementwise stages split over the workers
    /// (on unless `MLX_CPU_ROWSPLIT=0`; the same bits either way). For tests and A/B runs.
    pub fn set_rows_split(&mut self, on: bool) {
        self.split = on;
    }

    /// The instruction set of the kernels (`avx512+vnni+amx`, `avx512+vnni`, `avx2+fma` or
    /// `scalar`).
    pub fn isa(&self) -> &'static str {
        self.ctx.kernels()
    }

    /// Logits per token.
    pub fn vocab(&self) -> usize {
        self.w.vocab
    }

    /// An empty cache for this model with room for `capacity` tokens (it grows as needed).
    pub fn new_cache(&self, capacity: usize) -> CpuCache {
        CpuCache::new(&self.w, capacity, self.kv_dtype)
    }

    /// Runs `tokens` into `cache` (after what it holds) in blocks of [`BLOCK`] and returns
    /// the logits `(vocab,)` of the last one. A prompt fed in parts whose lengths are
    /// multiples of [`BLOCK`] (but the last) gives the cache and logits one call would.
    pub fn prefill(&mut self, cache: &mut CpuCache, tokens: &[u32]) -> Result<&[f32]> {
        if tokens.len() == 1 {
            // A decode step: the batched step with one row (the bits a block of one gives).
            return self.step(&mut [cache], tokens);
        }
        self.run(cache, tokens, true)?;
        Ok(&self.s.logits[..self.w.vocab])
    }

    /// Drops the prompt blocks' scratch ([`BLOCK`] rows: ~1.8 MB on SmolLM2-135M, ~2.7 MB
    /// on a 360M), which the next prompt block makes again; whether there was one. For a
    /// caller done with its prompt: the decode steps that follow fill the cache's remaining
    /// positions (pages untouched until then, see [`KvBuf::new`]) instead of stacking on it
    /// (issue #31's peak memory). Not for a caller that feeds short blocks every round (a
    /// draft decoder): each block would make it again.
    pub fn release_prompt_scratch(&mut self) -> bool {
        if self.s.rows == 0 {
            return false;
        }
        self.s = Scratch::new(&self.w, 0, 0);
        mlx_core::cpu::release_prompt_buffers();
        true
    }

    /// As [`CpuBatch::prefill`] without the logits (a part of a prompt that more follows).
    pub fn prefill_part(&mut self, cache: &mut CpuCache, tokens: &[u32]) -> Result<()> {
        self.run(cache, tokens, false)
    }

    fn run(&mut self, cache: &mut CpuCache, tokens: &[u32], head: bool) -> Result<()> {
        if tokens.is_empty() {
            return Err(EngineError::Input {
                what: "CpuBatch::prefill".into(),
                problem: "no tokens".into(),
            });
        }
        // A prompt between two decode steps is not the caller's time.
        self.prof.ended = None;
        let n = tokens.len().div_ceil(BLOCK);
        for (i, chunk) in tokens.chunks(BLOCK).enumerate() {
            // The head of the last block only (earlier ones' logits are never read).
            let last = head && i + 1 == n;
            let p = &mut self.pprof;
            let s = block_scratch(&self.w, &mut self.s);
            block(&self.w, &self.ctx, cache, s, chunk, None, last, p)?;
        }
        Ok(())
    }

    /// Consecutive `tokens` of one sequence into `cache` (after what it holds) in one pass:
    /// the logits `(tokens.len(), vocab)`, row `i` bit for bit what [`CpuBatch::step`] of
    /// `tokens[i]` alone gives after the ones before it. Every weight row is read once for all
    /// the rows (the products through [`cpu::matmul_t_each`], the head included), which is
    /// what makes verifying `k` drafts cost less than `k` steps.
    pub fn verify(&mut self, cache: &mut CpuCache, tokens: &[u32]) -> Result<&[f32]> {
        let n = tokens.len();
        if n == 0 {
            return Err(EngineError::Input {
                what: "CpuBatch::verify".into(),
                problem: "no tokens".into(),
            });
        }
        let w = &self.w;
        w.check_ids(tokens)?;
        cache.fits(w)?;
        cache.grow(cache.pos + n);
        if self.b.rows < n {
            self.b = Scratch::new(w, n, n);
        }
        let (ctx, s, prof) = (&self.ctx, &mut self.b, &mut self.prof);
        prof.begin(n);
        let hid = w.hidden;
        w.embed_rows(tokens, &mut s.x[..tokens.len() * hid])?;
        prof.lap(Phase::Embed, 0);
        let rows = &mut Rows::Seq(cache, &mut self.rows, self.split);
        let normed = layers(w, ctx, s, rows, n, prof)?;
        head_each(w, ctx, s, n, &mut self.rows, Some(cache), normed)?;
        prof.lap(Phase::Head, 1);
        prof.end();
        Ok(&s.logits[..n * w.vocab])
    }

    /// One decode step: `tokens[i]` into `caches[i]` for every row; returns the logits
    /// `(rows, vocab)`, row `i` bit for bit what [`CpuDecoder::feed`] of that one token over
    /// that cache gives.
    pub fn step(&mut self, caches: &mut [&mut CpuCache], tokens: &[u32]) -> Result<&[f32]> {
        let b = tokens.len();
        if b == 0 || caches.len() != b {
            return Err(EngineError::Input {
                what: "CpuBatch::step".into(),
                problem: format!("{b} tokens for {} caches", caches.len()),
            });
        }
        let w = &self.w;
        w.check_ids(tokens)?;
        for c in caches.iter_mut() {
            c.fits(w)?;
            c.grow(c.pos + 1);
        }
        if self.b.rows < b {
            self.b = Scratch::new(w, b, b);
        }
        let (ctx, s, prof) = (&self.ctx, &mut self.b, &mut self.prof);
        prof.begin(b);
        let hid = w.hidden;
        w.embed_rows(tokens, &mut s.x[..tokens.len() * hid])?;
        prof.lap(Phase::Embed, 0);
        let normed = layers(w, ctx, s, &mut Rows::Each(caches, &mut self.rows), b, prof)?;
        let next = match &caches[..] {
            [c] => Some(&**c),
            _ => None,
        };
        head_each(w, ctx, s, b, &mut self.rows, next, normed)?;
        prof.lap(Phase::Head, 1);
        prof.end();
        Ok(&s.logits[..b * w.vocab])
    }
}

/// The final norm and head of the `n` rows in `s.x` into `s.logits`, each row as alone
/// (`normed`: the final norm is in `s.h` already, see [`layers`]).
/// `next`: the cache of the sequence's next step (one sequence), whose layer 0 keys and values
/// the head's product prefetches ([`kv_prefetch`]).
fn head_each(
    w: &Weights<'_>,
    ctx: &CpuContext,
    s: &mut Scratch,
    n: usize,
    rows: &mut RowsScratch,
    next: Option<&CpuCache>,
    normed: bool,
) -> Result<()> {
    let hid = w.hidden;
    let h = &mut s.h[..n * hid];
    if !normed {
        cpu::rms_norm(&s.x[..n * hid], w.final_norm.floats(), w.eps, h)?;
    }
    let logits = &mut s.logits[..n * w.vocab];
    let pf = next.and_then(|c| kv_prefetch(w, c, 0, [0.0, 1.0]));
    // The logits' product: `Activations::head` (int16 inputs for a Q8_0 head).
    cpu::matmul_t_each_prefetch(
        ctx,
        ctx.activations.head(),
        h,
        n,
        &mut [MatJob {
            w: &w.head.0,
            bias: w.head.1,
            out: logits,
        }],
        rows,
        pf.as_ref(),
    )?;
    Ok(())
}

impl Drop for CpuBatch<'_> {
    fn drop(&mut self) {
        if let Some(r) = self.prof.report("decode steps") {
            eprint!("{r}");
        }
        if let Some(r) = self.pprof.report("prompt blocks") {
            eprint!("{r}");
        }
    }
}

/// [`CpuDecoder::hidden_last`] through `b` into `cache` (emptied first).
fn hidden_last<'a>(
    b: &'a mut CpuBatch<'_>,
    cache: &mut CpuCache,
    tokens: &[u32],
) -> Result<&'a [f32]> {
    if tokens.is_empty() {
        return Err(EngineError::Input {
            what: "CpuDecoder::hidden_last".into(),
            problem: "no tokens".into(),
        });
    }
    cache.reset();
    let mut t = 0;
    for chunk in tokens.chunks(BLOCK) {
        let p = &mut Profile::default();
        block(
            &b.w,
            &b.ctx,
            cache,
            block_scratch(&b.w, &mut b.s),
            chunk,
            None,
            false,
            p,
        )?;
        t = chunk.len();
    }
    let hid = b.w.hidden;
    let s = &mut b.s;
    cpu::rms_norm(
        &s.x[(t - 1) * hid..t * hid],
        b.w.final_norm.floats(),
        b.w.eps,
        &mut s.h[..hid],
    )?;
    Ok(&s.h[..hid])
}

impl CpuBatch<'_> {
    /// Sentence embeddings as [`embed`] computes them through a [`CpuDecoder`] (the same
    /// bits), each text in a scratch cache of its own: the running sequences' caches are
    /// untouched.
    pub fn embed(&mut self, batch: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        let before = self.ctx.activations;
        self.ctx.activations = Activations::F32;
        let longest = batch.iter().map(Vec::len).max().unwrap_or(1);
        let mut cache = CpuCache::new(&self.w, longest, KvDtype::F32);
        let out = embed_with(batch, &mut |ids| {
            hidden_last(self, &mut cache, ids).map(<[f32]>::to_vec)
        });
        self.ctx.activations = before;
        out
    }
}

/// Sentence embeddings through `decoder` (one reset per text): each text's last-token final
/// hidden state, L2-normalised in float32, as `mlx_models::embed::embed` computes them on the
/// exact path (tier L3 against it: sums in another order; float32 products throughout, even
/// for one-token texts, which the decoder's int16 activations would otherwise take, and a
/// float32 cache). The decoder's cache is left empty.
pub fn embed(decoder: &mut CpuDecoder<'_>, batch: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
    let before = (decoder.activations(), decoder.cache.dtype);
    decoder.set_activations(Activations::F32);
    decoder.set_kv_dtype(KvDtype::F32);
    let out = embed_with(batch, &mut |ids| {
        decoder.hidden_last(ids).map(<[f32]>::to_vec)
    });
    decoder.set_activations(before.0);
    decoder.set_kv_dtype(before.1);
    decoder.reset();
    out
}

/// Each text's hidden state from `hidden`, L2-normalised.
fn embed_with(
    batch: &[Vec<u32>],
    hidden: &mut dyn FnMut(&[u32]) -> Result<Vec<f32>>,
) -> Result<Vec<Vec<f32>>> {
    if batch.is_empty() {
        return Err(EngineError::Input {
            what: "embed".into(),
            problem: "no texts given".into(),
        });
    }
    let mut out = Vec::with_capacity(batch.len());
    for (i, ids) in batch.iter().enumerate() {
        if ids.is_empty() {
            return Err(EngineError::Input {
                what: "embed".into(),
                problem: format!("text {i} has no tokens"),
            });
        }
        let h = hidden(ids).map_err(|e| EngineError::EmbedText {
            index: i,
            source: Box::new(e),
        })?;
        // mlx-lm's order: sum of squares, square root, then max with 1e-12 and a division.
        let norm = h.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
        out.push(h.iter().map(|v| v / norm).collect());
    }
    Ok(out)
}

/// The error of a CPU cache whose keys and values are stored in different types.
fn mixed_kv() -> EngineError {
    EngineError::Cache {
        what: "CPU cache".into(),
        problem: "keys and values of different types".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The profile charges each lap to its part, the time between steps to `outside` (not a
    /// prompt's), and reports a line a part; off, it records nothing.
    #[test]
    fn profile_charges_parts_and_reports() {
        let mut p = Profile {
            on: true,
            ..Profile::default()
        };
        for _ in 0..2 {
            p.begin(1);
            std::thread::sleep(std::time::Duration::from_millis(2));
            p.lap(Phase::Qkv, 1);
            p.lap(Phase::Head, 1);
            p.end();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let r = p.report("decode steps").unwrap();
        assert!(
            r.contains("2 decode steps, 1.00 rows a step, 2.0 pool runs a step"),
            "{r}"
        );
        assert_eq!(
            r.lines().filter(|l| l.starts_with("cpu-profile ")).count(),
            9
        );
        assert!(p.ns[Phase::Qkv as usize] >= 4_000_000);
        assert!(p.ns[Phase::Outside as usize] >= 1_000_000);
        let mut off = Profile::default();
        off.begin(1);
        off.lap(Phase::Qkv, 1);
        assert!(off.report("decode steps").is_none() && off.ns.iter().all(|&n| n == 0));
    }
}

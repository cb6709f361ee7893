//! The universal dense decoder's descriptor: one row per `model_type`, built from
//! `config.json` with mlx-lm's field names and defaults for that type, holding only knobs.
//! [`super::dense`] runs any descriptor. Each row function names the mlx-lm file it follows,
//! so it can be checked against the Python `ModelArgs` line by line.

use serde_json::{Map, Value};

use crate::error::{ModelError, Result};
use crate::layers::{MlpKind, MlpNames, NormKind, RopeScaling};

/// Where the norms sit in a block.
#[derive(serde::Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// `h = x + attn(n1(x)); out = h + mlp(n2(h))` (llama).
    Pre,
    /// `h = x + n2(attn(n1(x))); out = h + n4(mlp(n3(h)))` (Gemma 2 / 3).
    Sandwich,
    /// `h = x + n2(attn(x)); out = h + n4(mlp(h))` (OLMo 2).
    PostOnly,
    /// `h = n1(x); out = attn(h) + mlp(h) + x` (Cohere, Phi, GPT-J).
    Parallel,
    /// `h = n1(x); out = x + attn(h) + mlp(h)` (StableLM's parallel residual).
    ParallelResidualFirst,
    /// `out = attn(n1(x)) + mlp(n2(x)) + x` (GPT-NeoX).
    ParallelTwoNorms,
}

/// Layout of a fused q/k/v projection.
#[derive(serde::Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkvLayout {
    /// `[q | k | v]`, split at `[q, q + kv]` (Phi 3, GPT-2, GPT-BigCode).
    Split,
    /// Per KV head: its `groups` query heads, then its key, then its value (InternLM 2).
    Interleaved,
    /// Per head: `[q | k | v]` of `head_dim` each (GPT-NeoX).
    PerHead,
}

/// Casts to float32 around the attention kernel (Phi, StableLM).
#[derive(serde::Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upcast {
    None,
    /// `sdpa(q.astype(f32), k, v).astype(v.dtype)`.
    Queries,
    /// `sdpa(q.astype(f32), k.astype(f32), v).astype(v.dtype)`.
    QueriesKeys,
    /// Cohere 2: float16 queries in float32, the output back in the queries' dtype.
    QueriesIfF16,
}

/// Normalization of queries and keys.
#[derive(serde::Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// Per head (over `head_dim`) on `(B, L, heads, head_dim)`, before rope (Qwen 3).
    PerHead,
    /// Per head on `(B, heads, L, head_dim)`, after the heads' transpose, before rope
    /// (Gemma 3). The same values as `PerHead`, but the weight's gradient sums the rows in
    /// this order.
    PerHeadTransposed,
    /// Per head, after rope (Hunyuan).
    PerHeadAfterRope,
    /// Over the whole projection, before splitting into heads (OLMo 2).
    Full,
    /// Cohere's `LayerNorm2D`: `weight * layer_norm(x)` with a `(heads, head_dim)` weight.
    LayerNorm2d,
    /// StableLM's `LayerNormPerHead`: the same with one stored weight per head
    /// (`<norm>.norms.<h>.weight`), stacked.
    LayerNormPerHead,
}

/// How the output head is chosen.
#[derive(serde::Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head {
    /// `embed_tokens.as_linear` (and a stored `lm_head` is dropped by sanitize).
    Tied,
    Untied,
    /// Gemma 3: untied when `lm_head.weight` is stored, else tied.
    TiedIfMissing,
}

/// A multiplier on the embeddings.
#[derive(serde::Serialize, Clone, Copy, Debug, PartialEq)]
pub enum EmbedScale {
    None,
    /// `h * s` with `s` a Python float (weak: `h`'s dtype).
    Weak(f64),
    /// `h * mx.array(s, mx.bfloat16).astype(h.dtype)` (Gemma 3).
    Bf16(f64),
}

/// What happens to the logits after the head.
#[derive(serde::Serialize, Clone, Copy, Debug, PartialEq)]
pub enum LogitScale {
    None,
    /// `out * s`.
    Mul(f64),
    /// `out / s`.
    Div(f64),
    /// `lm_head(h / s)`: MiniCPM divides the hidden state before an untied head.
    DivBeforeHead(f64),
}

/// Rotary embedding parameters for one kind of layer.
#[derive(serde::Serialize, Clone, Debug, PartialEq)]
pub struct RopeSpec {
    /// Rotated features (`head_dim` unless partial).
    pub dims: i32,
    pub theta: f64,
    pub traditional: bool,
    pub scaling: Option<RopeScaling>,
    pub max_position_embeddings: Option<i64>,
    pub table: RopeTable,
}

impl RopeSpec {
    /// `nn.RoPE(dims, traditional, base=theta)`: no scaling, no length, `initialize_rope`.
    pub fn plain(dims: i32, theta: f64, traditional: bool) -> RopeSpec {
        RopeSpec {
            dims,
            theta,
            traditional,
            scaling: None,
            max_position_embeddings: None,
            table: RopeTable::Initialize,
        }
    }
}

/// Where the rotary frequencies come from.
#[derive(serde::Serialize, Clone, Copy, Debug, PartialEq)]
pub enum RopeTable {
    /// `initialize_rope` (with `scaling`).
    Initialize,
    /// Hunyuan's NTK-alpha table (always a table, even for alpha 1).
    NtkAlpha(f64),
    /// nanochat: `-exp(arange(half) * (log(base) / half))`.
    NegExp,
}

/// Module names of a row (llama's unless a row says otherwise).
#[derive(serde::Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Names {
    pub embed: &'static str,
    pub layers: &'static str,
    pub final_norm: &'static str,
    pub attn: &'static str,
    pub q: &'static str,
    pub k: &'static str,
    pub v: &'static str,
    pub o: &'static str,
    /// When set, q, k and v are one projection split at `[q, q + kv]`.
    pub qkv: Option<&'static str>,
    pub qkv_layout: QkvLayout,
    /// A learned absolute position table (`wpe`), when the row has one.
    pub positions: Option<&'static str>,
    pub q_norm: &'static str,
    pub k_norm: &'static str,
    pub lm_head: &'static str,
    pub mlp: &'static str,
    pub mlp_names: MlpNames,
    pub pre_attn_norm: &'static str,
    pub post_attn_norm: &'static str,
    pub pre_mlp_norm: &'static str,
    pub post_mlp_norm: &'static str,
}

impl Names {
    pub const LLAMA: Names = Names {
        embed: "model.embed_tokens",
        layers: "model.layers",
        final_norm: "model.norm",
        attn: "self_attn",
        q: "q_proj",
        k: "k_proj",
        v: "v_proj",
        o: "o_proj",
        qkv: None,
        qkv_layout: QkvLayout::Split,
        positions: None,
        q_norm: "q_norm",
        k_norm: "k_norm",
        lm_head: "lm_head",
        mlp: "mlp",
        mlp_names: MlpNames::LLAMA,
        pre_attn_norm: "input_layernorm",
        post_attn_norm: "post_attention_layernorm",
        pre_mlp_norm: "post_attention_layernorm",
        post_mlp_norm: "post_feedforward_layernorm",
    };
    /// Gemma 2 / 3's four norms per block.
    pub const SANDWICH: Names = Names {
        pre_mlp_norm: "pre_feedforward_layernorm",
        ..Names::LLAMA
    };
}

/// Everything the dense decoder needs to know about an architecture.
#[derive(serde::Serialize, Clone, Debug, PartialEq)]
pub struct Descriptor {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_layers: i32,
    pub intermediate_size: i32,
    pub n_heads: i32,
    pub n_kv_heads: i32,
    pub head_dim: i32,
    pub vocab_size: i32,
    pub norm: NormKind,
    pub norm_eps: f32,
    /// Norm of q/k when it differs from `norm` (Llama 4's weightless RMS).
    pub qk_norm_kind: Option<NormKind>,
    /// A norm on the embeddings (nanochat), with [`Names::embed_norm`].
    pub embed_norm: bool,
    pub placement: Placement,
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub mlp_bias: bool,
    /// Bias of the down projection (differs from `mlp_bias` in a few rows).
    pub down_bias: bool,
    pub qk_norm: QkNorm,
    pub lm_head_bias: bool,
    pub upcast: Upcast,
    /// Rope applied to `x[..., :dims]` then concatenated back (GPT-J's explicit slicing).
    pub rope_slice_concat: bool,
    /// Rows of the learned position table (`n_positions`), with [`Names::positions`].
    pub n_positions: i32,
    /// The learned positions' ids are a host array (gpt_bigcode's `mx.array(np.arange(...))`),
    /// not `mx.arange(L) + offset` built in the graph (gpt2): the same ids, other nodes.
    pub positions_on_host: bool,
    pub mlp: MlpKind,
    /// Rope of full-attention layers (`None`: no positions).
    pub rope: Option<RopeSpec>,
    /// Rope of sliding layers, where it differs (Gemma 3's `rope_local_base_freq`).
    pub local_rope: Option<RopeSpec>,
    /// Python's attention scale, computed as the row's file computes it.
    pub attn_scale: f64,
    pub attn_logit_softcap: Option<f64>,
    /// A head-wise attention output gate: this module (inside the attention, `hidden -> heads`,
    /// with the q/k/v bias) scales each head's output by `sigmoid(g(x).astype(f32))` cast back,
    /// before the output projection (Spark 2.5's `g_proj`).
    pub head_gate: Option<&'static str>,
    /// `mx.contiguous` on q, k and v after their transposes and on the attention output after
    /// its transpose (Spark 2.5): the same values, the nodes mlx-lm builds.
    pub contiguous_heads: bool,
    /// Keys and values tiled this many times along the heads after the cache
    /// (`mx.tile(keys, [1, n, 1, 1])`: PLaMo's shared heads, head `h` reads KV head
    /// `h % n_kv_heads`), so the attention runs with as many KV heads as queries.
    pub kv_tile: Option<i32>,
    /// Per layer `(heads, kv_heads, intermediate_size)` where they differ between layers
    /// (OpenELM); empty: every layer has the fields above.
    pub layer_shapes: Vec<(i32, i32, i32)>,
    /// The layer stack applied this many times with shared weights, each pass with its own
    /// caches (Nanbeige's `num_loops`); 1 for every other row.
    pub loops: usize,
    /// With `loops > 1`: the final norm also ends every pass (else only the last).
    pub loop_norm: bool,
    /// Sandwich rows: the two post norms as `rms_norm(x, weight + offset)` with these offsets
    /// (PLaMo 3's `1 / 5` and `1 / 5 ** 1.5`), the pre norms as `norm`.
    pub post_norm_offsets: Option<(f32, f32)>,
    /// The sliding layers' mask window where it differs from the rotating cache's
    /// `sliding_window` (PLaMo 3 masks `window + 1`).
    pub sliding_mask_window: Option<usize>,
    /// BitNet's sub-norms: `self_attn.attn_sub_norm` (hidden size) on the attention output
    /// before `o_proj`, `mlp.ffn_sub_norm` (intermediate size) before `down_proj`.
    pub sub_norms: bool,
    /// BitNet's packed ternary linears (`weight` uint8, four rows a byte, and
    /// `weight_scale`), unpacked at load into plain weights (`ternary * scale` in float32,
    /// cast to the scale's dtype): `Some(invert)`, `invert` dividing by the scale for a
    /// converted `lm_head` (mlx-lm's `invert_weight_scales`).
    pub bitlinear: Option<bool>,
    /// Ministral 3's per-position query scale `(llama_4_scaling_beta,
    /// original_max_position_embeddings)`.
    pub query_scale: Option<(f64, i64)>,
    pub embed_scale: EmbedScale,
    pub residual_multiplier: Option<f64>,
    pub logit_scale: LogitScale,
    pub final_logit_softcap: Option<f64>,
    /// The final softcap is a helper mlx-lm compiles shapeless (nanochat's `softcap`), not
    /// plain ops (gemma2): the same bits, one fused node.
    pub final_logit_softcap_compiled: bool,
    /// Per layer: sliding-window attention (else full).
    pub sliding: Vec<bool>,
    pub sliding_window: Option<usize>,
    /// Masks built with `return_array=True` (Gemma 2).
    pub mask_as_array: bool,
    /// Gemma 3's `clip_residual` (f16 residual sums in f32, clipped).
    pub clip_residual: bool,
    pub head: Head,
    /// Whether the mlx-lm class defines `make_cache`.
    pub defines_make_cache: bool,
    /// OLMo's hand-written attention: `softmax(((q * scale) @ k.T + mask).astype(f32))`
    /// cast back, then `@ v`.
    pub manual_attention: bool,
    /// Per layer: no positions at all (SmolLM 3's NoPE layers).
    pub no_rope: Vec<bool>,
    /// sanitize: drop these tensors inside every layer (precomputed rotary tables).
    pub drop_layer_tensors: Vec<&'static str>,
    /// sanitize: drop every tensor under these prefixes (e.g. MiMo's `model.mtp_layers.`).
    pub drop_prefixes: Vec<&'static str>,
    /// Where the checkpoint keeps multi-token-prediction layers (MiMo's `model.mtp_layers`):
    /// dropped with `drop_prefixes` unless `--mtp` asks for them (`Weights::with_mtp`).
    pub mtp_layers: Option<&'static str>,
    /// sanitize: a wrapper's prefix taken off every name (`language_model.`), after the
    /// drops.
    pub strip_prefix: Option<&'static str>,
    /// sanitize: a Hugging Face checkpoint's names to mlx-lm's (GPT-2, GPT-NeoX, GPT-J).
    pub hf_renames: Option<HfRenames>,
    pub names: Names,
}

/// The rename part of a `sanitize`: applied to every stored name, in this order.
#[derive(serde::Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct HfRenames {
    /// Names ending so are dropped (`.attention.masked_bias`).
    pub drop_suffixes: &'static [&'static str],
    /// Conv1D weights (`(in, out)`) to transpose: names ending so that lack `add_prefix`.
    pub conv1d_suffixes: &'static [&'static str],
    /// Prefixed to every name that does not start with it (`model.`).
    pub add_prefix: Option<&'static str>,
    /// Substring replacements (`.gpt_neox.layers.` -> `.h.`).
    pub replace: &'static [(&'static str, &'static str)],
}

impl HfRenames {
    /// The new name of `k`, or `None` to drop it.
    pub fn rename(&self, k: &str) -> Option<String> {
        if self.drop_suffixes.iter().any(|s| k.ends_with(s)) {
            return None;
        }
        let mut n = match self.add_prefix {
            Some(p) if !k.starts_with(p) => format!("{p}{k}"),
            _ => k.to_string(),
        };
        for (from, to) in self.replace {
            n = n.replace(from, to);
        }
        Some(n)
    }

    /// Whether the stored `k` is a Conv1D weight to transpose.
    pub fn is_conv1d(&self, k: &str) -> bool {
        let prefixed = self.add_prefix.is_some_and(|p| k.starts_with(p));
        !prefixed && self.conv1d_suffixes.iter().any(|s| k.ends_with(s))
    }
}

/// How a `model_type` is served.
#[derive(serde::Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serving {
    /// By a row of the descriptor table.
    Table,
    /// By a dedicated port.
    Dedicated,
}

/// `config.json` fields read the way mlx-lm's `ModelArgs.from_dict` reads them: unknown keys
/// ignored, `null` the same as absent, every error naming the field and the model type.
pub struct Cfg<'a> {
    obj: &'a Map<String, Value>,
    ty: &'a str,
}

impl<'a> Cfg<'a> {
    pub fn new(raw: &'a Value, ty: &'a str) -> Result<Cfg<'a>> {
        let obj = raw
            .as_object()
            .ok_or_else(|| ModelError::Config("config.json must hold a JSON object".into()))?;
        Ok(Cfg { obj, ty })
    }

    fn get(&self, k: &str) -> Option<&'a Value> {
        self.obj.get(k).filter(|v| !v.is_null())
    }

    fn err(&self, k: &str, what: &str) -> ModelError {
        ModelError::Config(format!("config.json (`{}`): field `{k}` {what}", self.ty))
    }

    pub fn opt_i64(&self, k: &str) -> Result<Option<i64>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .or_else(|| v.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64))
                .map(Some)
                .ok_or_else(|| self.err(k, &format!("must be an integer, got {v}"))),
        }
    }

    pub fn opt_i32(&self, k: &str) -> Result<Option<i32>> {
        match self.opt_i64(k)? {
            None => Ok(None),
            Some(x) => i32::try_from(x)
                .map(Some)
                .map_err(|_| self.err(k, &format!("is out of range ({x})"))),
        }
    }

    pub fn i32(&self, k: &str) -> Result<i32> {
        self.opt_i32(k)?
            .ok_or_else(|| self.err(k, "is required but missing"))
    }

    pub fn i32_or(&self, k: &str, d: i32) -> Result<i32> {
        Ok(self.opt_i32(k)?.unwrap_or(d))
    }

    pub fn opt_f64(&self, k: &str) -> Result<Option<f64>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(k, &format!("must be a number, got {v}"))),
        }
    }

    pub fn f64(&self, k: &str) -> Result<f64> {
        self.opt_f64(k)?
            .ok_or_else(|| self.err(k, "is required but missing"))
    }

    pub fn f64_or(&self, k: &str, d: f64) -> Result<f64> {
        Ok(self.opt_f64(k)?.unwrap_or(d))
    }

    pub fn bool_or(&self, k: &str, d: bool) -> Result<bool> {
        match self.get(k) {
            None => Ok(d),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.err(k, &format!("must be true or false, got {v}"))),
        }
    }

    pub fn bool(&self, k: &str) -> Result<bool> {
        match self.get(k) {
            None => Err(self.err(k, "is required but missing")),
            Some(_) => self.bool_or(k, false),
        }
    }

    pub fn opt_map(&self, k: &str) -> Result<Option<RopeScaling>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m.clone())),
            Some(v) => Err(self.err(k, &format!("must be an object, got {v}"))),
        }
    }

    pub fn opt_strings(&self, k: &str) -> Result<Option<Vec<String>>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| self.err(k, "must be a list of strings"))
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(v) => Err(self.err(k, &format!("must be a list, got {v}"))),
        }
    }

    /// `rope_scaling`, or transformers 5's nested `rope_parameters` when that is all there is.
    fn rope_scaling(&self) -> Result<Option<RopeScaling>> {
        match self.opt_map("rope_scaling")? {
            Some(m) => Ok(Some(m)),
            None => self.opt_map("rope_parameters"),
        }
    }
}

const INV_FREQ: &str = "self_attn.rotary_emb.inv_freq";

type RowFn = fn(&Cfg) -> Result<Descriptor>;

/// The table: every `model_type` the dense decoder serves, with its row.
pub const ROWS: &[(&str, RowFn)] = &[
    ("llama", llama),
    ("qwen2", qwen2),
    ("qwen3", qwen3),
    ("gemma", gemma),
    ("gemma2", gemma2),
    ("gemma3_text", gemma3_text),
    ("phi3", phi3),
    ("spark2_5", spark2_5),
    ("olmo2", olmo2),
    ("granite", granite),
    ("cohere", cohere),
    ("starcoder2", starcoder2),
    ("mimo", mimo),
    ("seed_oss", seed_oss),
    ("helium", helium),
    ("smollm3", smollm3),
    ("internlm3", internlm3),
    ("ernie4_5", ernie4_5),
    ("exaone", exaone),
    ("glm4", glm4),
    ("olmo3", olmo3),
    ("minicpm", minicpm),
    ("exaone4", exaone4),
    ("internlm2", internlm2),
    ("hunyuan_v1_dense", hunyuan_v1_dense),
    ("glm", glm),
    ("phi", phi),
    ("stablelm", stablelm),
    ("gpt_neox", gpt_neox),
    ("gpt2", gpt2),
    ("gpt_bigcode", gpt_bigcode),
    ("gptj", gptj),
    ("cohere2", cohere2),
    ("nemotron", nemotron),
    ("apertus", apertus),
    ("telechat3", telechat3),
    ("nanochat", nanochat),
    ("llama4_text", llama4_text),
    ("ministral3", ministral3),
    ("gemma3", gemma3),
    ("mistral3", mistral3),
    ("olmo", olmo),
    // Issue #32's rows (`descriptor_dense2.rs`).
    ("qwen", dense2::qwen),
    ("lille-130m", dense2::lille_130m),
    ("qwen2_vl", dense2::qwen2_vl),
    ("qwen3_vl", dense2::qwen3_vl),
    ("pixtral", dense2::pixtral),
    ("plamo", dense2::plamo),
    ("openelm", dense2::openelm),
    ("nanbeige", dense2::nanbeige),
    ("plamo3", dense2::plamo3),
    ("bitnet", dense2::bitnet),
];

#[path = "descriptor_dense2.rs"]
mod dense2;

/// `models/olmo.py` (OLMo 1): non-affine LayerNorms, fused `att_proj`, fused `ff_proj` holding
/// `[up | gate]`, its own attention. mlx-lm 0.32.2 can only run it one token at a time (it
/// adds the "causal" mask string to the scores); a causal mask here is additive 0 / -inf.
fn olmo(c: &Cfg) -> Result<Descriptor> {
    let hidden = c.i32("d_model")?;
    let heads = c.i32("n_heads")?;
    let mlp_hidden = match c.opt_i32("mlp_hidden_size")? {
        Some(m) => m,
        None => c.i32_or("mlp_ratio", 4)? * hidden,
    };
    let k = Common {
        hidden,
        layers: c.i32("n_layers")?,
        inter: mlp_hidden / 2,
        heads,
        kv_heads: heads,
        vocab: c.i32("embedding_size")?,
    };
    c.i32("vocab_size")?;
    if heads <= 0 || hidden % heads != 0 {
        return Err(c.err("d_model", "must be divisible by n_heads"));
    }
    let hd = hidden / heads;
    let mut d = base("olmo", &k, hd, 1e-5);
    d.norm = NormKind::LayerNoAffine;
    d.manual_attention = true;
    d.rope = Some(RopeSpec::plain(
        hd,
        c.f64_or("rope_theta", 10000.0)?,
        c.bool_or("rope_traditional", false)?,
    ));
    d.head = tie(c.bool_or("weight_tying", false)?);
    d.names = Names {
        embed: "model.transformer.wte",
        layers: "model.transformer.blocks",
        final_norm: "model.transformer.norm",
        attn: "",
        qkv: Some("att_proj"),
        o: "attn_out",
        mlp: "",
        mlp_names: MlpNames {
            gate: "",
            up: "",
            down: "ff_out",
            gate_up: Some("ff_proj"),
            up_first: true,
        },
        pre_attn_norm: "att_norm",
        pre_mlp_norm: "ff_norm",
        lm_head: "model.transformer.ff_out",
        ..Names::LLAMA
    };
    Ok(d)
}

/// A multimodal wrapper's text model: the inner row on `text_config`, with the wrapper's
/// weight prefix and its vision modules dropped.
fn wrapped(c: &Cfg, text: Value, row: RowFn, model_type: &'static str) -> Result<Descriptor> {
    let inner = Cfg::new(&text, c.ty)?;
    let mut d = row(&inner)?;
    d.model_type = model_type.into();
    d.drop_prefixes
        .extend(["vision_tower.", "multi_modal_projector."]);
    d.strip_prefix = Some("language_model.");
    Ok(d)
}

fn text_config(c: &Cfg) -> Result<Map<String, Value>> {
    match c.get("text_config") {
        Some(Value::Object(m)) => Ok(m.clone()),
        Some(v) => Err(c.err("text_config", &format!("must be an object, got {v}"))),
        None => Err(c.err("text_config", "is required but missing")),
    }
}

/// `models/gemma3.py`: the Gemma 3 wrapper around `gemma3_text`.
fn gemma3(c: &Cfg) -> Result<Descriptor> {
    let mut t = text_config(c)?;
    t.insert("vocab_size".into(), c.i32_or("vocab_size", 262208)?.into());
    for (key, d) in [("num_attention_heads", 8), ("num_key_value_heads", 4)] {
        if !t.contains_key(key) {
            t.insert(key.into(), d.into());
        }
    }
    wrapped(c, Value::Object(t), gemma3_text, "gemma3")
}

/// `models/mistral3.py`: the Mistral 3 wrapper around `ministral3` or `llama`.
fn mistral3(c: &Cfg) -> Result<Descriptor> {
    let mut t = text_config(c)?;
    if !t.contains_key("tie_word_embeddings") {
        t.insert("tie_word_embeddings".into(), false.into());
    }
    let row: RowFn = match t.get("model_type").and_then(Value::as_str) {
        Some("ministral3") => ministral3,
        Some("mistral4") => {
            return Err(c.err(
                "text_config.model_type",
                "`mistral4` text models are not supported",
            ))
        }
        _ => llama,
    };
    let mut d = wrapped(c, Value::Object(t), row, "mistral3")?;
    // mistral3.Model has no `make_cache` (gemma3.Model delegates its own).
    d.defines_make_cache = false;
    Ok(d)
}

/// The descriptor of `model_type` (after remapping), or `None` when no row serves it.
pub fn describe(model_type: &str, raw: &Value) -> Option<Result<Descriptor>> {
    let row = ROWS.iter().find(|(t, _)| *t == model_type)?.1;
    Some(
        Cfg::new(raw, model_type)
            .and_then(|c| row(&c))
            .and_then(|d| d.validate()),
    )
}

/// The fields every llama-shaped `ModelArgs` has, with that file's defaults.
struct Common {
    hidden: i32,
    layers: i32,
    inter: i32,
    heads: i32,
    kv_heads: i32,
    vocab: i32,
}

/// `kv_required`: `num_key_value_heads` is a required field of that `ModelArgs` (else it
/// defaults to the attention heads).
fn common(c: &Cfg, kv_required: bool) -> Result<Common> {
    let hidden = c.i32("hidden_size")?;
    let layers = c.i32("num_hidden_layers")?;
    let inter = c.i32("intermediate_size")?;
    let heads = c.i32("num_attention_heads")?;
    let kv_heads = if kv_required {
        c.i32("num_key_value_heads")?
    } else {
        c.i32_or("num_key_value_heads", heads)?
    };
    Ok(Common {
        hidden,
        layers,
        inter,
        heads,
        kv_heads,
        vocab: c.i32("vocab_size")?,
    })
}

fn head_dim_or(c: &Cfg, hidden: i32, heads: i32) -> Result<i32> {
    match c.opt_i32("head_dim")? {
        Some(h) => Ok(h),
        None if heads > 0 && hidden % heads == 0 => Ok(hidden / heads),
        None if heads > 0 => Err(c.err(
            "hidden_size",
            "must divide by num_attention_heads (or give head_dim)",
        )),
        None => Err(c.err("num_attention_heads", "must be positive")),
    }
}

fn rope(
    dims: i32,
    theta: f64,
    traditional: bool,
    c: &Cfg,
    max_pos: Option<i64>,
) -> Result<RopeSpec> {
    Ok(RopeSpec {
        dims,
        theta,
        traditional,
        scaling: c.rope_scaling()?,
        max_position_embeddings: max_pos,
        table: RopeTable::Initialize,
    })
}

fn scale_of(head_dim: i32) -> f64 {
    f64::from(head_dim).powf(-0.5)
}

/// A llama-shaped descriptor; rows adjust the knobs that differ.
fn base(model_type: &str, k: &Common, head_dim: i32, eps: f64) -> Descriptor {
    Descriptor {
        model_type: model_type.to_string(),
        hidden_size: k.hidden,
        num_layers: k.layers,
        intermediate_size: k.inter,
        n_heads: k.heads,
        n_kv_heads: k.kv_heads,
        head_dim,
        vocab_size: k.vocab,
        norm: NormKind::Rms,
        norm_eps: eps as f32,
        qk_norm_kind: None,
        embed_norm: false,
        placement: Placement::Pre,
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        down_bias: false,
        qk_norm: QkNorm::None,
        lm_head_bias: false,
        upcast: Upcast::None,
        rope_slice_concat: false,
        n_positions: 0,
        positions_on_host: false,
        mlp: MlpKind::SwiGlu,
        rope: None,
        local_rope: None,
        attn_scale: scale_of(head_dim),
        attn_logit_softcap: None,
        head_gate: None,
        contiguous_heads: false,
        kv_tile: None,
        layer_shapes: Vec::new(),
        loops: 1,
        loop_norm: false,
        post_norm_offsets: None,
        sliding_mask_window: None,
        sub_norms: false,
        bitlinear: None,
        query_scale: None,
        embed_scale: EmbedScale::None,
        residual_multiplier: None,
        logit_scale: LogitScale::None,
        final_logit_softcap: None,
        final_logit_softcap_compiled: false,
        sliding: vec![false; k.layers.max(0) as usize],
        sliding_window: None,
        mask_as_array: false,
        clip_residual: false,
        head: Head::Tied,
        defines_make_cache: false,
        manual_attention: false,
        no_rope: vec![false; k.layers.max(0) as usize],
        drop_layer_tensors: Vec::new(),
        drop_prefixes: Vec::new(),
        mtp_layers: None,
        strip_prefix: None,
        hf_renames: None,
        names: Names::LLAMA,
    }
}

fn tie(b: bool) -> Head {
    if b {
        Head::Tied
    } else {
        Head::Untied
    }
}

/// `models/llama.py` (and its remaps: mistral, iquestcoder, xverse).
fn llama(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, false)?;
    let hd = head_dim_or(c, k.hidden, k.heads)?;
    let mut d = base("llama", &k, hd, c.f64("rms_norm_eps")?);
    let bias = c.bool_or("attention_bias", false)?;
    (d.qkv_bias, d.o_bias) = (bias, bias);
    let mlp_bias = c.bool_or("mlp_bias", false)?;
    (d.mlp_bias, d.down_bias) = (mlp_bias, mlp_bias);
    d.rope = Some(rope(
        hd,
        c.f64_or("rope_theta", 10000.0)?,
        c.bool_or("rope_traditional", false)?,
        c,
        c.opt_i64("max_position_embeddings")?,
    )?);
    d.head = tie(c.bool_or("tie_word_embeddings", true)?);
    if let Some(types) = c.opt_strings("layer_types")? {
        d.sliding = types.iter().map(|t| t == "sliding_attention").collect();
    }
    d.sliding_window = c.opt_i64("sliding_window")?.map(|w| w.max(0) as usize);
    d.defines_make_cache = true;
    d.drop_layer_tensors = vec![INV_FREQ];
    Ok(d)
}

/// `models/qwen2.py`.
fn qwen2(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, true)?;
    let hd = k.hidden / k.heads.max(1);
    let mut d = base("qwen2", &k, hd, c.f64("rms_norm_eps")?);
    d.qkv_bias = true;
    d.rope = Some(rope(
        hd,
        c.f64_or("rope_theta", 1000000.0)?,
        c.bool_or("rope_traditional", false)?,
        c,
        Some(c.opt_i64("max_position_embeddings")?.unwrap_or(32768)),
    )?);
    d.head = tie(c.bool_or("tie_word_embeddings", true)?);
    d.drop_layer_tensors = vec![INV_FREQ];
    Ok(d)
}

/// `models/qwen3.py`.
fn qwen3(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, true)?;
    let hd = c.i32("head_dim")?;
    let mut d = base("qwen3", &k, hd, c.f64("rms_norm_eps")?);
    d.qk_norm = QkNorm::PerHead;
    let nested = c.opt_map("rope_parameters")?;
    let theta = match c.opt_f64("rope_theta")? {
        Some(t) => t,
        None => nested
            .as_ref()
            .and_then(|m| m.get("rope_theta"))
            .and_then(Value::as_f64)
            .ok_or_else(|| c.err("rope_theta", "is missing"))?,
    };
    d.rope = Some(rope(
        hd,
        theta,
        false,
        c,
        Some(c.i32("max_position_embeddings")?.into()),
    )?);
    d.head = tie(c.bool("tie_word_embeddings")?);
    Ok(d)
}

/// `models/gemma.py`.
fn gemma(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, true)?;
    let hd = c.i32("head_dim")?;
    let mut d = base("gemma", &k, hd, c.f64("rms_norm_eps")?);
    d.norm = NormKind::RmsOffset;
    d.mlp = MlpKind::GeGluErf;
    d.rope = Some(RopeSpec::plain(
        hd,
        c.f64_or("rope_theta", 10000.0)?,
        c.bool_or("rope_traditional", false)?,
    ));
    d.embed_scale = EmbedScale::Weak(f64::from(k.hidden).powf(0.5));
    Ok(d)
}

/// `models/gemma2.py`.
fn gemma2(c: &Cfg) -> Result<Descriptor> {
    let mut d = gemma(c)?;
    d.model_type = "gemma2".into();
    d.mlp = MlpKind::GeGluTanh;
    d.placement = Placement::Sandwich;
    d.names = Names::SANDWICH;
    d.attn_scale = 1.0 / c.f64_or("query_pre_attn_scalar", 144.0)?.powf(0.5);
    d.attn_logit_softcap = Some(c.f64_or("attn_logit_softcapping", 50.0)?);
    d.final_logit_softcap = Some(c.f64_or("final_logit_softcapping", 30.0)?);
    d.mask_as_array = true;
    Ok(d)
}

/// `models/gemma3_text.py`.
fn gemma3_text(c: &Cfg) -> Result<Descriptor> {
    let k = Common {
        hidden: c.i32_or("hidden_size", 1152)?,
        layers: c.i32_or("num_hidden_layers", 26)?,
        inter: c.i32_or("intermediate_size", 6912)?,
        heads: c.i32_or("num_attention_heads", 4)?,
        kv_heads: c.i32_or("num_key_value_heads", 1)?,
        vocab: c.i32_or("vocab_size", 262144)?,
    };
    let hd = c.i32_or("head_dim", 256)?;
    let mut d = base("gemma3_text", &k, hd, c.f64_or("rms_norm_eps", 1.0e-6)?);
    d.norm = NormKind::RmsOffset;
    d.mlp = MlpKind::GeGluTanh;
    d.placement = Placement::Sandwich;
    d.names = Names::SANDWICH;
    d.qk_norm = QkNorm::PerHeadTransposed;
    d.attn_scale = c.f64_or("query_pre_attn_scalar", 256.0)?.powf(-0.5);
    d.rope = Some(RopeSpec {
        dims: hd,
        theta: c.f64_or("rope_theta", 1_000_000.0)?,
        traditional: false,
        scaling: c.opt_map("rope_scaling")?,
        max_position_embeddings: Some(c.opt_i64("max_position_embeddings")?.unwrap_or(32768)),
        table: RopeTable::Initialize,
    });
    d.local_rope = Some(RopeSpec::plain(
        hd,
        c.f64_or("rope_local_base_freq", 10_000.0)?,
        false,
    ));
    let pattern = c.i32_or("sliding_window_pattern", 6)?;
    if pattern <= 0 {
        return Err(c.err("sliding_window_pattern", "must be positive"));
    }
    d.sliding = (0..k.layers.max(0))
        .map(|i| (i + 1) % pattern != 0)
        .collect();
    d.sliding_window = Some(c.opt_i64("sliding_window")?.unwrap_or(512).max(0) as usize);
    d.embed_scale = EmbedScale::Bf16(f64::from(k.hidden).powf(0.5));
    d.clip_residual = true;
    d.head = Head::TiedIfMissing;
    d.defines_make_cache = true;
    Ok(d)
}

/// `models/spark2_5.py`: fused `q_k_v_proj`, a head-wise sigmoid output gate (`g_proj`),
/// GeGLU (erf), sliding and full layers each with their own rope from `rope_parameters`
/// (`rope_theta`, `partial_rotary_factor`), rotating caches on the sliding layers.
fn spark2_5(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, false)?;
    let hd = c.i32("head_dim")?;
    let mut d = base("spark2_5", &k, hd, c.f64_or("rms_norm_eps", 1e-6)?);
    let bias = c.bool_or("attention_bias", false)?;
    (d.qkv_bias, d.o_bias) = (bias, bias);
    let mlp_bias = c.bool_or("mlp_bias", false)?;
    (d.mlp_bias, d.down_bias) = (mlp_bias, mlp_bias);
    if c.get("hidden_act")
        .is_some_and(|v| v.as_str() != Some("gelu"))
    {
        return Err(c.err("hidden_act", "must be \"gelu\" (Spark2_5 requires GELU)"));
    }
    if !c.bool_or("headwise_attn_output_gate", true)? {
        return Err(c.err("headwise_attn_output_gate", "must be true"));
    }
    if c.get("gate_attn_act_mode")
        .is_some_and(|v| v.as_str() != Some("sigmoid"))
    {
        return Err(c.err("gate_attn_act_mode", "must be \"sigmoid\""));
    }
    d.mlp = MlpKind::GeGluErf;
    d.head_gate = Some("g_proj");
    d.contiguous_heads = true;
    d.names.embed = "model.embedding";
    d.names.qkv = Some("q_k_v_proj");
    d.names.o = "out_proj";
    let n = k.layers.max(0) as usize;
    let types = match c.opt_strings("layer_types")? {
        Some(t) => t,
        None => (0..n)
            .map(|i| {
                if i % 4 == 3 {
                    "full_attention"
                } else {
                    "sliding_attention"
                }
                .to_string()
            })
            .collect(),
    };
    if types.len() != n {
        return Err(c.err("layer_types", "length must match num_hidden_layers"));
    }
    if let Some(t) = types
        .iter()
        .find(|t| *t != "sliding_attention" && *t != "full_attention")
    {
        return Err(c.err("layer_types", &format!("has an unsupported type {t:?}")));
    }
    let params = c
        .opt_map("rope_parameters")?
        .ok_or_else(|| c.err("rope_parameters", "is required but missing"))?;
    let rope_of = |ty: &str| -> Result<RopeSpec> {
        let p = params
            .get(ty)
            .and_then(Value::as_object)
            .ok_or_else(|| c.err("rope_parameters", &format!("has no object for {ty}")))?;
        let num = |key: &str, default: f64| -> Result<f64> {
            match p.get(key) {
                None => Ok(default),
                Some(v) => v.as_f64().ok_or_else(|| {
                    c.err("rope_parameters", &format!("{ty}.{key} must be a number"))
                }),
            }
        };
        let dims = (f64::from(hd) * num("partial_rotary_factor", 1.0)?) as i32;
        if dims <= 0 || dims > hd || dims % 2 != 0 {
            return Err(c.err(
                "rope_parameters",
                &format!("{ty}: invalid rotary dimension {dims} for head_dim {hd}"),
            ));
        }
        Ok(RopeSpec::plain(dims, num("rope_theta", 10000.0)?, false))
    };
    d.sliding = types.iter().map(|t| t == "sliding_attention").collect();
    if d.sliding.iter().any(|&s| !s) {
        d.rope = Some(rope_of("full_attention")?);
    }
    if d.sliding.iter().any(|&s| s) {
        d.local_rope = Some(rope_of("sliding_attention")?);
        // Full layers' rope is needed as the fallback only when there are any.
        if d.rope.is_none() {
            d.rope = d.local_rope.clone();
        }
    }
    d.sliding_window = Some(c.i64_required("sliding_window")?.max(0) as usize);
    d.head = tie(c.bool_or("tie_word_embeddings", true)?);
    d.drop_layer_tensors = vec![INV_FREQ];
    d.defines_make_cache = true;
    Ok(d)
}

/// `models/phi3.py`.
fn phi3(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, false)?;
    let hd = k.hidden / k.heads.max(1);
    let mut d = base("phi3", &k, hd, c.f64("rms_norm_eps")?);
    d.names.qkv = Some("qkv_proj");
    d.names.mlp_names.gate_up = Some("gate_up_proj");
    let rope_dim = (f64::from(hd) * c.f64_or("partial_rotary_factor", 1.0)?) as i32;
    let max_pos = c.opt_i64("max_position_embeddings")?.unwrap_or(131072);
    let original = c
        .opt_i64("original_max_position_embeddings")?
        .unwrap_or(4096);
    let mut scaling = c.opt_map("rope_scaling")?;
    if let Some(s) = &mut scaling {
        if !s.contains_key("long_factor") || !s.contains_key("type") {
            return Err(c.err("rope_scaling", "must contain keys long_factor and type"));
        }
        match s.get("type").and_then(Value::as_str) {
            Some("longrope") | Some("su") => {
                s.insert("type".into(), "longrope".into());
                s.insert("original_max_position_embeddings".into(), original.into());
            }
            Some("linear") => {}
            // mlx-lm warns and drops other types.
            _ => scaling = None,
        }
    }
    d.rope = Some(RopeSpec {
        dims: rope_dim,
        theta: c.f64_or("rope_theta", 10000.0)?,
        traditional: c.bool_or("rope_traditional", false)?,
        scaling,
        max_position_embeddings: Some(max_pos),
        table: RopeTable::Initialize,
    });
    d.head = tie(c.bool_or("tie_word_embeddings", false)?);
    Ok(d)
}

/// `models/olmo2.py`.
fn olmo2(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, false)?;
    let hd = head_dim_or(c, k.hidden, k.heads)?;
    let mut d = base("olmo2", &k, hd, c.f64("rms_norm_eps")?);
    let bias = c.bool_or("attention_bias", false)?;
    (d.qkv_bias, d.o_bias) = (bias, bias);
    let mlp_bias = c.bool_or("mlp_bias", false)?;
    (d.mlp_bias, d.down_bias) = (mlp_bias, mlp_bias);
    d.placement = Placement::PostOnly;
    d.qk_norm = QkNorm::Full;
    d.rope = Some(rope(
        hd,
        c.f64_or("rope_theta", 10000.0)?,
        c.bool_or("rope_traditional", false)?,
        c,
        c.opt_i64("max_position_embeddings")?,
    )?);
    d.head = tie(c.bool_or("tie_word_embeddings", true)?);
    d.drop_layer_tensors = vec![INV_FREQ];
    Ok(d)
}

/// `models/granite.py`.
fn granite(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, true)?;
    let hd = k.hidden / k.heads.max(1);
    let mut d = base("granite", &k, hd, c.f64("rms_norm_eps")?);
    let bias = c.bool("attention_bias")?;
    (d.qkv_bias, d.o_bias) = (bias, bias);
    let mlp_bias = c.bool("mlp_bias")?;
    (d.mlp_bias, d.down_bias) = (mlp_bias, mlp_bias);
    d.attn_scale = c.f64("attention_multiplier")?;
    d.embed_scale = EmbedScale::Weak(c.f64("embedding_multiplier")?);
    d.residual_multiplier = Some(c.f64("residual_multiplier")?);
    d.logit_scale = LogitScale::Div(c.f64("logits_scaling")?);
    d.rope = Some(rope(
        hd,
        c.f64("rope_theta")?,
        false,
        c,
        Some(c.i64_required("max_position_embeddings")?),
    )?);
    d.head = tie(c.bool_or("tie_word_embeddings", true)?);
    Ok(d)
}

/// `models/cohere.py`.
fn cohere(c: &Cfg) -> Result<Descriptor> {
    let k = Common {
        hidden: c.i32_or("hidden_size", 8192)?,
        layers: c.i32_or("num_hidden_layers", 40)?,
        inter: c.i32_or("intermediate_size", 22528)?,
        heads: c.i32_or("num_attention_heads", 64)?,
        kv_heads: c.i32_or("num_key_value_heads", 64)?,
        vocab: c.i32_or("vocab_size", 256000)?,
    };
    let hd = k.hidden / k.heads.max(1);
    let mut d = base("cohere", &k, hd, c.f64_or("layer_norm_eps", 1e-5)?);
    d.norm = NormKind::Layer {
        bias: c.bool_or("layer_norm_bias", false)?,
    };
    let bias = c.bool_or("attention_bias", false)?;
    (d.qkv_bias, d.o_bias) = (bias, bias);
    if c.bool_or("use_qk_norm", false)? {
        d.qk_norm = QkNorm::LayerNorm2d;
    }
    d.placement = Placement::Parallel;
    d.rope = Some(RopeSpec::plain(
        hd,
        c.f64_or("rope_theta", 8000000.0)?,
        true,
    ));
    d.logit_scale = LogitScale::Mul(c.f64_or("logit_scale", 0.0625)?);
    Ok(d)
}

/// `models/starcoder2.py`.
fn starcoder2(c: &Cfg) -> Result<Descriptor> {
    let k = Common {
        vocab: c.i32_or("vocab_size", 49152)?,
        ..common_no_vocab(c)?
    };
    let hd = k.hidden / k.heads.max(1);
    let mut d = base("starcoder2", &k, hd, c.f64_or("norm_epsilon", 1e-5)?);
    d.norm = NormKind::Layer { bias: true };
    (d.qkv_bias, d.o_bias, d.mlp_bias, d.down_bias) = (true, true, true, true);
    d.mlp = MlpKind::Gelu;
    d.names.mlp_names = MlpNames {
        gate: "",
        up: "c_fc",
        down: "c_proj",
        gate_up: None,
        up_first: false,
    };
    d.rope = Some(RopeSpec::plain(
        hd,
        c.f64_or("rope_theta", 100000.0)?,
        false,
    ));
    d.head = tie(c.bool_or("tie_word_embeddings", true)?);
    Ok(d)
}

/// `models/mimo.py`: qwen2 with another rope base and untied default; its multi-token
/// prediction layers are dropped, as mlx-lm drops them, unless `--mtp` loads them
/// (`dense::mtp`).
fn mimo(c: &Cfg) -> Result<Descriptor> {
    let mut d = qwen2(c)?;
    d.model_type = "mimo".into();
    if let Some(r) = &mut d.rope {
        r.theta = c.f64_or("rope_theta", 10000.0)?;
    }
    d.head = tie(c.bool_or("tie_word_embeddings", false)?);
    d.drop_prefixes = vec!["model.mtp_layers."];
    d.mtp_layers = Some("model.mtp_layers");
    Ok(d)
}

/// `models/seed_oss.py`.
fn seed_oss(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, true)?;
    let hd = c.i32("head_dim")?;
    let mut d = base("seed_oss", &k, hd, c.f64("rms_norm_eps")?);
    d.qkv_bias = c.bool_or("attention_bias", false)?;
    d.o_bias = c.bool_or("attention_out_bias", false)?;
    let mlp_bias = c.bool_or("mlp_bias", false)?;
    (d.mlp_bias, d.down_bias) = (mlp_bias, mlp_bias);
    d.rope = Some(rope(
        hd,
        c.f64_or("rope_theta", 10000.0)?,
        c.bool_or("rope_traditional", false)?,
        c,
        c.opt_i64("max_position_embeddings")?,
    )?);
    d.head = tie(c.bool_or("tie_word_embeddings", true)?);
    Ok(d)
}

/// `models/helium.py`: always an untied head, traditional rope.
fn helium(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, true)?;
    let hd = k.hidden / k.heads.max(1);
    let mut d = base("helium", &k, hd, c.f64("rms_norm_eps")?);
    d.qkv_bias = c.bool("attention_bias")?;
    let mlp_bias = c.bool("mlp_bias")?;
    (d.mlp_bias, d.down_bias) = (mlp_bias, mlp_bias);
    d.rope = Some(RopeSpec::plain(hd, c.f64("rope_theta")?, true));
    d.head = Head::Untied;
    Ok(d)
}

/// `models/smollm3.py`: llama with NoPE layers (`no_rope_layers`, else every
/// `no_rope_layer_interval`-th layer).
fn smollm3(c: &Cfg) -> Result<Descriptor> {
    let mut d = llama(c)?;
    d.model_type = "smollm3".into();
    d.defines_make_cache = false;
    let n = d.num_layers.max(0) as usize;
    let use_rope: Vec<bool> = match c.get("no_rope_layers") {
        Some(Value::Array(a)) => {
            if a.len() != n {
                return Err(c.err("no_rope_layers", "length mismatch"));
            }
            a.iter().map(|v| v.as_i64().unwrap_or(1) != 0).collect()
        }
        Some(_) => return Err(c.err("no_rope_layers", "must be a list of 0/1")),
        None => {
            let interval = c.i32_or("no_rope_layer_interval", 4)?;
            if interval <= 0 {
                return Err(c.err("no_rope_layer_interval", "must be positive"));
            }
            (0..n as i32).map(|i| (i + 1) % interval != 0).collect()
        }
    };
    d.no_rope = use_rope.iter().map(|u| !u).collect();
    Ok(d)
}

/// InternLM's rotary embedding (internlm2 and internlm3): `rope_scaling` must have `factor`
/// and a `type_key` (`type`, internlm3's `rope_type`) of linear or dynamic;
/// `max_position_embeddings` defaults to 32768.
fn internlm_rope(c: &Cfg, hd: i32, type_key: &str) -> Result<RopeSpec> {
    let scaling = c.opt_map("rope_scaling")?;
    if let Some(s) = &scaling {
        let ty = s.get(type_key).and_then(Value::as_str);
        if !s.contains_key("factor") || !matches!(ty, Some("linear") | Some("dynamic")) {
            return Err(c.err(
                "rope_scaling",
                &format!("must have `factor` and a `{type_key}` of linear or dynamic"),
            ));
        }
    }
    Ok(RopeSpec {
        dims: hd,
        theta: c.f64_or("rope_theta", 10000.0)?,
        traditional: c.bool_or("rope_traditional", false)?,
        scaling,
        max_position_embeddings: Some(c.opt_i64("max_position_embeddings")?.unwrap_or(32768)),
        table: RopeTable::Initialize,
    })
}

/// `models/internlm3.py`.
fn internlm3(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, false)?;
    let hd = k.hidden / k.heads.max(1);
    let mut d = base("internlm3", &k, hd, c.f64("rms_norm_eps")?);
    let qkv_bias = c.bool_or("qkv_bias", false)?;
    (d.qkv_bias, d.o_bias) = (qkv_bias, qkv_bias);
    let bias = c.bool_or("bias", false)?;
    (d.mlp_bias, d.down_bias) = (bias, bias);
    d.rope = Some(internlm_rope(c, hd, "rope_type")?);
    d.head = tie(c.bool_or("tie_word_embeddings", false)?);
    Ok(d)
}

/// `models/ernie4_5.py`.
fn ernie4_5(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, true)?;
    let hd = head_dim_or(c, k.hidden, k.heads)?;
    let mut d = base("ernie4_5", &k, hd, c.f64("rms_norm_eps")?);
    let bias = c.bool("use_bias")?;
    (d.qkv_bias, d.o_bias, d.mlp_bias, d.down_bias) = (bias, bias, bias, bias);
    d.rope = Some(RopeSpec {
        dims: hd,
        theta: c.f64("rope_theta")?,
        traditional: true,
        scaling: None,
        max_position_embeddings: Some(c.i64_required("max_position_embeddings")?),
        table: RopeTable::Initialize,
    });
    d.head = tie(c.bool("tie_word_embeddings")?);
    Ok(d)
}

/// `models/exaone.py`: llama under GPT-2-style names.
fn exaone(c: &Cfg) -> Result<Descriptor> {
    let k = Common {
        hidden: c.i32("hidden_size")?,
        layers: c.i32("num_layers")?,
        inter: c.i32("intermediate_size")?,
        heads: c.i32("num_attention_heads")?,
        kv_heads: c.i32("num_key_value_heads")?,
        vocab: c.i32("vocab_size")?,
    };
    let hd = head_dim_or(c, k.hidden, k.heads)?;
    let mut d = base("exaone", &k, hd, c.f64("layer_norm_epsilon")?);
    let bias = c.bool_or("attention_bias", false)?;
    (d.qkv_bias, d.o_bias) = (bias, bias);
    let mlp_bias = c.bool_or("mlp_bias", false)?;
    (d.mlp_bias, d.down_bias) = (mlp_bias, mlp_bias);
    d.rope = Some(rope(
        hd,
        c.f64("rope_theta")?,
        c.bool_or("rope_traditional", false)?,
        c,
        c.opt_i64("max_position_embeddings")?,
    )?);
    d.head = tie(c.bool_or("tie_word_embeddings", true)?);
    d.names = Names {
        embed: "transformer.wte",
        layers: "transformer.h",
        final_norm: "transformer.ln_f",
        attn: "attn.attention",
        o: "out_proj",
        mlp_names: MlpNames {
            gate: "c_fc_0",
            up: "c_fc_1",
            down: "c_proj",
            gate_up: None,
            up_first: false,
        },
        pre_attn_norm: "ln_1",
        pre_mlp_norm: "ln_2",
        ..Names::LLAMA
    };
    Ok(d)
}

/// `models/glm4.py`: sandwich norms, partial traditional rope, fused gate/up, untied head.
fn glm4(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, true)?;
    let hd = c.i32("head_dim")?;
    let mut d = base("glm4", &k, hd, c.f64("rms_norm_eps")?);
    d.qkv_bias = c.bool("attention_bias")?;
    d.placement = Placement::Sandwich;
    d.names.post_attn_norm = "post_self_attn_layernorm";
    d.names.pre_mlp_norm = "post_attention_layernorm";
    d.names.post_mlp_norm = "post_mlp_layernorm";
    d.names.mlp_names.gate_up = Some("gate_up_proj");
    d.rope = Some(RopeSpec::plain(
        (f64::from(hd) * c.f64("partial_rotary_factor")?) as i32,
        c.f64("rope_theta")?,
        c.bool_or("rope_traditional", true)?,
    ));
    d.head = Head::Untied;
    Ok(d)
}

/// `models/olmo3.py`: OLMo 2 with sliding layers (every fourth full by default).
fn olmo3(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, false)?;
    let hd = head_dim_or(c, k.hidden, k.heads)?;
    let mut d = base("olmo3", &k, hd, c.f64("rms_norm_eps")?);
    let bias = c.bool_or("attention_bias", false)?;
    (d.qkv_bias, d.o_bias) = (bias, bias);
    d.placement = Placement::PostOnly;
    d.qk_norm = QkNorm::Full;
    let theta = c.f64("rope_theta")?;
    d.rope = Some(rope(
        hd,
        theta,
        false,
        c,
        Some(c.i64_required("max_position_embeddings")?),
    )?);
    d.local_rope = Some(RopeSpec::plain(hd, theta, false));
    d.sliding = match c.opt_strings("layer_types")? {
        Some(t) => t.iter().map(|t| t != "full_attention").collect(),
        None => (0..k.layers.max(0)).map(|i| (i + 1) % 4 != 0).collect(),
    };
    if !d.sliding.iter().any(|&s| s) {
        return Err(c.err("layer_types", "needs a sliding_attention layer"));
    }
    d.sliding_window = Some(c.i64_required("sliding_window")?.max(0) as usize);
    d.head = tie(c.bool_or("tie_word_embeddings", false)?);
    d.defines_make_cache = true;
    Ok(d)
}

/// `models/minicpm.py` (untied head; mlx-lm's tied path cannot load its own sanitize output).
fn minicpm(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, true)?;
    let hd = k.hidden / k.heads.max(1);
    let mut d = base("minicpm", &k, hd, c.f64("rms_norm_eps")?);
    d.rope = Some(rope(
        hd,
        c.f64_or("rope_theta", 1000000.0)?,
        c.bool_or("rope_traditional", false)?,
        c,
        c.opt_i64("max_position_embeddings")?,
    )?);
    d.embed_scale = EmbedScale::Weak(c.f64("scale_emb")?);
    d.residual_multiplier = Some(c.f64("scale_depth")? / f64::from(k.layers).powf(0.5));
    if c.bool_or("tie_word_embeddings", false)? {
        d.head = Head::Tied;
    } else {
        d.head = Head::Untied;
        d.logit_scale =
            LogitScale::DivBeforeHead(f64::from(k.hidden) / f64::from(c.i32("dim_model_base")?));
    }
    Ok(d)
}

/// `models/exaone4.py`: post-norms only, per-head q/k norms; with `sliding_window_pattern`
/// (e.g. "LLLG") local layers slide and only they use rope.
fn exaone4(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, true)?;
    let hd = c.i32("head_dim")?;
    let mut d = base("exaone4", &k, hd, c.f64("rms_norm_eps")?);
    d.placement = Placement::PostOnly;
    d.qk_norm = QkNorm::PerHead;
    d.rope = Some(RopeSpec {
        dims: hd,
        theta: c.f64("rope_theta")?,
        traditional: false,
        scaling: c.opt_map("rope_scaling")?,
        max_position_embeddings: Some(c.i64_required("max_position_embeddings")?),
        table: RopeTable::Initialize,
    });
    d.head = tie(c.bool("tie_word_embeddings")?);
    let pattern = match c.get("sliding_window_pattern") {
        None => None,
        Some(Value::String(p)) if !p.is_empty() => Some(p.clone()),
        Some(Value::String(_)) => None,
        Some(v) => {
            return Err(c.err(
                "sliding_window_pattern",
                &format!("must be a string, got {v}"),
            ))
        }
    };
    if let Some(p) = pattern {
        let p: Vec<char> = p.chars().collect();
        if !p.contains(&'L') || !p.contains(&'G') {
            return Err(c.err("sliding_window_pattern", "needs both L and G layers"));
        }
        d.sliding = (0..k.layers.max(0) as usize)
            .map(|i| p[i % p.len()] == 'L')
            .collect();
        d.no_rope = d.sliding.iter().map(|s| !s).collect();
        d.sliding_window = c.opt_i64("sliding_window")?.map(|w| w.max(0) as usize);
    }
    d.defines_make_cache = true;
    Ok(d)
}

/// `models/internlm2.py`: a per-head interleaved fused `wqkv`, InternLM names.
fn internlm2(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, false)?;
    let hd = k.hidden / k.heads.max(1);
    let mut d = base("internlm2", &k, hd, c.f64("rms_norm_eps")?);
    let bias = c.bool_or("bias", true)?;
    (d.qkv_bias, d.o_bias) = (bias, bias);
    d.rope = Some(internlm_rope(c, hd, "type")?);
    d.head = tie(c.bool_or("tie_word_embeddings", false)?);
    d.names = Names {
        embed: "model.tok_embeddings",
        attn: "attention",
        qkv: Some("wqkv"),
        qkv_layout: QkvLayout::Interleaved,
        o: "wo",
        mlp: "feed_forward",
        mlp_names: MlpNames {
            gate: "w1",
            up: "w3",
            down: "w2",
            gate_up: None,
            up_first: false,
        },
        pre_attn_norm: "attention_norm",
        pre_mlp_norm: "ffn_norm",
        lm_head: "output",
        ..Names::LLAMA
    };
    d.drop_layer_tensors = vec!["attention.rope.inv_freq"];
    Ok(d)
}

/// `models/hunyuan_v1_dense.py`: q/k norms after rope, NTK-alpha rope.
fn hunyuan_v1_dense(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, true)?;
    let hd = head_dim_or(c, k.hidden, k.heads)?;
    let mut d = base("hunyuan_v1_dense", &k, hd, c.f64("rms_norm_eps")?);
    let bias = c.bool_or("attention_bias", false)?;
    (d.qkv_bias, d.o_bias) = (bias, bias);
    if c.bool_or("use_qk_norm", true)? {
        d.qk_norm = QkNorm::PerHeadAfterRope;
        d.names.q_norm = "query_layernorm";
        d.names.k_norm = "key_layernorm";
    }
    let scaling = c.opt_map("rope_scaling")?;
    let mut alpha = 1.0;
    if let Some(s) = &scaling {
        if !["alpha", "factor", "type"]
            .iter()
            .all(|k| s.contains_key(*k))
        {
            return Err(c.err("rope_scaling", "must contain keys alpha, factor and type"));
        }
        alpha = s.get("alpha").and_then(Value::as_f64).unwrap_or(1.0);
    }
    d.rope = Some(RopeSpec {
        dims: hd,
        theta: c.f64_or("rope_theta", 10000.0)?,
        traditional: false,
        scaling: None,
        max_position_embeddings: None,
        table: RopeTable::NtkAlpha(alpha),
    });
    d.head = tie(c.bool_or("tie_word_embeddings", false)?);
    Ok(d)
}

/// `models/glm.py`: traditional rope, fused gate/up, bias-free output projection.
fn glm(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, true)?;
    let hd = c.i32("head_dim")?;
    let mut d = base("glm", &k, hd, c.f64("rms_norm_eps")?);
    d.qkv_bias = c.bool_or("attention_bias", false)?;
    d.names.mlp_names.gate_up = Some("gate_up_proj");
    d.rope = Some(RopeSpec::plain(hd, c.f64_or("rope_theta", 10000.0)?, true));
    d.head = tie(c.bool_or("tie_word_embeddings", true)?);
    d.drop_layer_tensors = vec![INV_FREQ];
    Ok(d)
}

fn layer_norm_row(model_type: &str, k: &Common, hd: i32, eps: f64) -> Descriptor {
    let mut d = base(model_type, k, hd, eps);
    d.norm = NormKind::Layer { bias: true };
    d.head = Head::Untied;
    d
}

fn plain_mlp(up: &'static str, down: &'static str) -> MlpNames {
    MlpNames {
        gate: "",
        up,
        down,
        gate_up: None,
        up_first: false,
    }
}

/// `models/phi.py` (Phi 1 / 1.5 / 2): parallel block, partial rope, f32 queries.
fn phi(c: &Cfg) -> Result<Descriptor> {
    let heads = c.i32_or("num_attention_heads", 32)?;
    let k = Common {
        hidden: c.i32_or("hidden_size", 2560)?,
        layers: c.i32_or("num_hidden_layers", 32)?,
        inter: c.i32_or("intermediate_size", 10240)?,
        heads,
        kv_heads: c.i32_or("num_key_value_heads", heads)?,
        vocab: c.i32_or("vocab_size", 51200)?,
    };
    if k.heads <= 0 || k.hidden % k.heads != 0 {
        return Err(c.err("hidden_size", "must be divisible by num_attention_heads"));
    }
    let hd = k.hidden / k.heads;
    let mut d = layer_norm_row("phi", &k, hd, c.f64_or("layer_norm_eps", 1e-5)?);
    d.placement = Placement::Parallel;
    (
        d.qkv_bias,
        d.o_bias,
        d.mlp_bias,
        d.down_bias,
        d.lm_head_bias,
    ) = (true, true, true, true, true);
    d.names.o = "dense";
    d.names.final_norm = "model.final_layernorm";
    d.names.mlp_names = plain_mlp("fc1", "fc2");
    d.mlp = MlpKind::GeluTanh;
    d.rope = Some(RopeSpec::plain(
        (c.f64_or("partial_rotary_factor", 0.4)? * f64::from(hd)) as i32,
        c.f64_or("rope_theta", 10000.0)?,
        false,
    ));
    d.attn_scale = (1.0 / f64::from(hd)).sqrt();
    d.upcast = Upcast::Queries;
    Ok(d)
}

/// `models/stablelm.py`.
fn stablelm(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, true)?;
    if k.heads <= 0 || k.hidden % k.heads != 0 {
        return Err(c.err("hidden_size", "must be divisible by num_attention_heads"));
    }
    let hd = k.hidden / k.heads;
    let mut d = layer_norm_row("stablelm", &k, hd, c.f64("layer_norm_eps")?);
    d.qkv_bias = c.bool("use_qkv_bias")?;
    if c.bool_or("use_parallel_residual", false)? {
        d.placement = Placement::ParallelResidualFirst;
    }
    if c.bool_or("qk_layernorm", false)? {
        d.qk_norm = QkNorm::LayerNormPerHead;
        d.names.q_norm = "q_layernorm";
        d.names.k_norm = "k_layernorm";
    }
    d.rope = Some(RopeSpec::plain(
        (c.f64("partial_rotary_factor")? * f64::from(hd)) as i32,
        c.f64("rope_theta")?,
        false,
    ));
    d.attn_scale = (1.0 / f64::from(hd)).sqrt();
    d.upcast = Upcast::QueriesKeys;
    Ok(d)
}

/// `models/gpt_neox.py`.
fn gpt_neox(c: &Cfg) -> Result<Descriptor> {
    let hidden = c.i32("hidden_size")?;
    let heads = c.i32("num_attention_heads")?;
    let k = Common {
        hidden,
        layers: c.i32("num_hidden_layers")?,
        inter: 4 * hidden,
        heads,
        kv_heads: c.i32_or("num_key_value_heads", heads)?,
        vocab: c.i32("vocab_size")?,
    };
    if heads <= 0 || hidden % heads != 0 {
        return Err(c.err("hidden_size", "must be divisible by num_attention_heads"));
    }
    if k.kv_heads != heads {
        return Err(c.err(
            "num_key_value_heads",
            "must equal num_attention_heads (fused qkv)",
        ));
    }
    let hd = hidden / heads;
    let mut d = layer_norm_row("gpt_neox", &k, hd, c.f64("layer_norm_eps")?);
    (d.qkv_bias, d.o_bias, d.mlp_bias, d.down_bias) = (true, true, true, true);
    d.placement = if c.bool_or("use_parallel_residual", true)? {
        Placement::ParallelTwoNorms
    } else {
        Placement::Pre
    };
    d.mlp = MlpKind::GeluTanh;
    d.names = Names {
        embed: "model.embed_in",
        layers: "model.h",
        final_norm: "model.final_layer_norm",
        attn: "attention",
        qkv: Some("query_key_value"),
        qkv_layout: QkvLayout::PerHead,
        o: "dense",
        mlp_names: plain_mlp("dense_h_to_4h", "dense_4h_to_h"),
        lm_head: "model.embed_out",
        ..Names::LLAMA
    };
    d.rope = Some(RopeSpec::plain(
        (f64::from(hd) * c.f64("rotary_pct")?) as i32,
        c.f64("rotary_emb_base")?,
        false,
    ));
    // gpt_neox.py sanitize.
    d.hf_renames = Some(HfRenames {
        drop_suffixes: &[
            ".attention.bias",
            ".attention.masked_bias",
            ".attention.rotary_emb.inv_freq",
        ],
        conv1d_suffixes: &[],
        add_prefix: Some("model."),
        replace: &[(".gpt_neox.layers.", ".h."), (".gpt_neox.", ".")],
    });
    Ok(d)
}

/// GPT-2-style names under `prefix` (`model` or `transformer`).
fn gpt2_names(prefix: &'static str) -> Names {
    let (embed, layers, final_norm, positions) = match prefix {
        "model" => ("model.wte", "model.h", "model.ln_f", "model.wpe"),
        _ => (
            "transformer.wte",
            "transformer.h",
            "transformer.ln_f",
            "transformer.wpe",
        ),
    };
    Names {
        embed,
        layers,
        final_norm,
        positions: Some(positions),
        attn: "attn",
        qkv: Some("c_attn"),
        o: "c_proj",
        mlp_names: plain_mlp("c_fc", "c_proj"),
        pre_attn_norm: "ln_1",
        pre_mlp_norm: "ln_2",
        ..Names::LLAMA
    }
}

/// `models/gpt2.py`: learned absolute positions, fused `c_attn`, tied head.
fn gpt2(c: &Cfg) -> Result<Descriptor> {
    let hidden = c.i32("n_embd")?;
    let heads = c.i32("n_head")?;
    c.i32("n_ctx")?;
    let k = Common {
        hidden,
        layers: c.i32("n_layer")?,
        inter: 4 * hidden,
        heads,
        kv_heads: heads,
        vocab: c.i32("vocab_size")?,
    };
    if heads <= 0 || hidden % heads != 0 {
        return Err(c.err("n_embd", "must be divisible by n_head"));
    }
    let hd = hidden / heads;
    let mut d = layer_norm_row("gpt2", &k, hd, c.f64("layer_norm_epsilon")?);
    (d.qkv_bias, d.o_bias, d.mlp_bias, d.down_bias) = (true, true, true, true);
    d.mlp = MlpKind::GeluTanh;
    d.names = gpt2_names("model");
    d.n_positions = c.i32("n_positions")?;
    d.head = Head::Tied;
    // gpt2.py sanitize: Conv1D weights transposed, `attn.bias` dropped, `model.` prefixed.
    d.hf_renames = Some(HfRenames {
        drop_suffixes: &[".attn.bias"],
        conv1d_suffixes: &[
            ".attn.c_attn.weight",
            ".attn.c_proj.weight",
            ".mlp.c_fc.weight",
            ".mlp.c_proj.weight",
        ],
        add_prefix: Some("model."),
        replace: &[],
    });
    Ok(d)
}

/// `models/gpt_bigcode.py`: GPT-2 with multi-query attention and erf GELU.
fn gpt_bigcode(c: &Cfg) -> Result<Descriptor> {
    let hidden = c.i32("n_embd")?;
    let heads = c.i32("n_head")?;
    let k = Common {
        hidden,
        layers: c.i32("n_layer")?,
        inter: c.i32("n_inner")?,
        heads,
        kv_heads: if c.bool_or("multi_query", true)? {
            1
        } else {
            heads
        },
        vocab: c.i32("vocab_size")?,
    };
    if heads <= 0 || hidden % heads != 0 {
        return Err(c.err("n_embd", "must be divisible by n_head"));
    }
    let hd = hidden / heads;
    let mut d = layer_norm_row("gpt_bigcode", &k, hd, c.f64("layer_norm_epsilon")?);
    let bias = c.bool_or("attention_bias", true)?;
    (d.qkv_bias, d.o_bias) = (bias, bias);
    let mlp_bias = c.bool_or("mlp_bias", true)?;
    (d.mlp_bias, d.down_bias) = (mlp_bias, mlp_bias);
    d.mlp = MlpKind::Gelu;
    d.names = gpt2_names("transformer");
    d.n_positions = c.i32("n_positions")?;
    d.positions_on_host = true;
    d.head = tie(c.bool_or("tie_word_embeddings", true)?);
    Ok(d)
}

/// `models/gptj.py`: parallel block, traditional partial rope on an explicit slice.
fn gptj(c: &Cfg) -> Result<Descriptor> {
    let hidden = c.i32_or("n_embd", 4096)?;
    let heads = c.i32_or("n_head", 16)?;
    let k = Common {
        hidden,
        layers: c.i32_or("n_layer", 28)?,
        inter: 4 * hidden,
        heads,
        kv_heads: heads,
        vocab: c.i32_or("vocab_size", 50400)?,
    };
    if heads <= 0 || hidden % heads != 0 {
        return Err(c.err("n_embd", "must be divisible by n_head"));
    }
    let hd = hidden / heads;
    let mut d = layer_norm_row("gptj", &k, hd, c.f64_or("layer_norm_epsilon", 1e-5)?);
    d.placement = Placement::Parallel;
    (d.mlp_bias, d.down_bias, d.lm_head_bias) = (true, true, true);
    d.mlp = MlpKind::GeluTanh;
    d.names = Names {
        embed: "model.wte",
        layers: "model.h",
        final_norm: "model.ln_f",
        attn: "attn",
        o: "out_proj",
        mlp_names: plain_mlp("fc_in", "fc_out"),
        pre_attn_norm: "ln_1",
        ..Names::LLAMA
    };
    let rotary = match c.opt_i32("rotary_dim")? {
        Some(r) if r != 0 => r,
        Some(_) => hd,
        None => 64,
    };
    d.rope = Some(RopeSpec {
        dims: rotary,
        theta: 10000.0,
        traditional: true,
        scaling: None,
        max_position_embeddings: Some(c.opt_i64("n_positions")?.unwrap_or(2048)),
        table: RopeTable::Initialize,
    });
    d.rope_slice_concat = true;
    // gptj.py sanitize.
    d.hf_renames = Some(HfRenames {
        drop_suffixes: &[".attn.masked_bias", ".attn.bias"],
        conv1d_suffixes: &[],
        add_prefix: None,
        replace: &[("transformer.", "model.")],
    });
    Ok(d)
}

/// `models/cohere2.py`: Cohere with sliding layers; only sliding layers use rope.
fn cohere2(c: &Cfg) -> Result<Descriptor> {
    let k = Common {
        hidden: c.i32_or("hidden_size", 4096)?,
        layers: c.i32_or("num_hidden_layers", 32)?,
        inter: c.i32_or("intermediate_size", 14336)?,
        heads: c.i32_or("num_attention_heads", 32)?,
        kv_heads: c.i32_or("num_key_value_heads", 8)?,
        vocab: c.i32_or("vocab_size", 256000)?,
    };
    let hd = c.i32_or("head_dim", 128)?;
    if hd * k.heads != k.hidden {
        return Err(c.err("hidden_size", "must equal num_attention_heads * head_dim"));
    }
    let mut d = base("cohere2", &k, hd, c.f64_or("layer_norm_eps", 1e-5)?);
    d.norm = NormKind::Layer {
        bias: c.bool_or("layer_norm_bias", false)?,
    };
    let bias = c.bool_or("attention_bias", false)?;
    (d.qkv_bias, d.o_bias) = (bias, bias);
    d.placement = Placement::Parallel;
    d.rope = Some(RopeSpec::plain(hd, c.f64_or("rope_theta", 50000.0)?, true));
    let pattern = c.i32_or("sliding_window_pattern", 4)?;
    if pattern <= 0 {
        return Err(c.err("sliding_window_pattern", "must be positive"));
    }
    d.sliding = (0..k.layers.max(0))
        .map(|i| (i + 1) % pattern != 0)
        .collect();
    d.no_rope = d.sliding.iter().map(|s| !s).collect();
    d.sliding_window = Some(c.opt_i64("sliding_window")?.unwrap_or(4096).max(0) as usize);
    d.upcast = Upcast::QueriesIfF16;
    d.logit_scale = LogitScale::Mul(c.f64_or("logit_scale", 0.0625)?);
    d.defines_make_cache = true;
    Ok(d)
}

/// `models/nemotron.py`: LayerNorm (1 + w), squared-ReLU MLP, partial rope.
fn nemotron(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, true)?;
    c.get("hidden_act")
        .ok_or_else(|| c.err("hidden_act", "is required but missing"))?;
    let hd = head_dim_or(c, k.hidden, k.heads)?;
    let mut d = base("nemotron", &k, hd, c.f64("norm_eps")?);
    d.norm = NormKind::LayerOffset { bias: true };
    let bias = c.bool_or("attention_bias", false)?;
    (d.qkv_bias, d.o_bias) = (bias, bias);
    let mlp_bias = c.bool_or("mlp_bias", false)?;
    (d.mlp_bias, d.down_bias) = (mlp_bias, mlp_bias);
    d.mlp = MlpKind::Relu2;
    let scaling = c.opt_map("rope_scaling")?;
    if let Some(s) = &scaling {
        let ty = s
            .get("type")
            .or_else(|| s.get("rope_type"))
            .and_then(Value::as_str);
        if !s.contains_key("factor") || ty != Some("linear") {
            return Err(c.err("rope_scaling", "must be linear with a `factor`"));
        }
    }
    d.rope = Some(RopeSpec {
        dims: (c.f64_or("partial_rotary_factor", 0.5)? * f64::from(hd)) as i32,
        theta: c.f64_or("rope_theta", 10000.0)?,
        traditional: false,
        scaling,
        max_position_embeddings: None,
        table: RopeTable::Initialize,
    });
    d.head = tie(c.bool_or("tie_word_embeddings", false)?);
    Ok(d)
}

/// `models/apertus.py`: xIELU MLP, per-head q/k norms, its own norm names.
fn apertus(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, true)?;
    let hd = k.hidden / k.heads.max(1);
    let mut d = base("apertus", &k, hd, c.f64("rms_norm_eps")?);
    let mlp_bias = c.bool("mlp_bias")?;
    (d.mlp_bias, d.down_bias) = (mlp_bias, mlp_bias);
    c.bool("attention_bias")?;
    c.bool("post_norm")?;
    c.bool("qk_norm")?;
    d.qk_norm = QkNorm::PerHead;
    d.mlp = MlpKind::XieLu;
    d.names.mlp_names = plain_mlp("up_proj", "down_proj");
    d.names.pre_attn_norm = "attention_layernorm";
    d.names.pre_mlp_norm = "feedforward_layernorm";
    d.rope = Some(rope(
        hd,
        c.f64("rope_theta")?,
        c.bool_or("rope_traditional", false)?,
        c,
        Some(c.i64_required("max_position_embeddings")?),
    )?);
    d.head = tie(c.bool("tie_word_embeddings")?);
    Ok(d)
}

/// `models/telechat3.py`.
fn telechat3(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, true)?;
    let hd = head_dim_or(c, k.hidden, k.heads)?;
    let mut d = base("telechat3", &k, hd, c.f64("rms_norm_eps")?);
    let bias = c.bool_or("attention_bias", false)?;
    (d.qkv_bias, d.o_bias) = (bias, bias);
    let mlp_bias = c.bool_or("mlp_bias", false)?;
    (d.mlp_bias, d.down_bias) = (mlp_bias, mlp_bias);
    d.rope = Some(RopeSpec {
        dims: hd,
        theta: c.f64("rope_theta")?,
        traditional: false,
        scaling: c.opt_map("rope_scaling")?,
        max_position_embeddings: Some(c.i64_required("max_position_embeddings")?),
        table: RopeTable::Initialize,
    });
    d.head = tie(c.bool_or("tie_word_embeddings", false)?);
    Ok(d)
}

/// `models/nanochat.py`: weightless RMS norms everywhere (also on the embeddings and on
/// q/k after rope), relu² MLP, its own rope table, final soft cap 15.
fn nanochat(c: &Cfg) -> Result<Descriptor> {
    let heads = c.i32_or("num_attention_heads", 10)?;
    let k = Common {
        hidden: c.i32_or("hidden_size", 1280)?,
        layers: c.i32_or("num_hidden_layers", 20)?,
        inter: c.i32_or("intermediate_size", 5120)?,
        heads,
        kv_heads: c.i32_or("num_key_value_heads", 10)?,
        vocab: c.i32_or("vocab_size", 65536)?,
    };
    let hd = k.hidden / k.heads.max(1);
    let mut d = base("nanochat", &k, hd, 1e-5);
    d.norm = NormKind::RmsNoWeight;
    d.embed_norm = true;
    d.qk_norm = QkNorm::PerHeadAfterRope;
    d.mlp = MlpKind::Relu2;
    d.names = Names {
        embed: "transformer.wte",
        layers: "transformer.h",
        attn: "attn",
        q: "c_q",
        k: "c_k",
        v: "c_v",
        o: "c_proj",
        mlp_names: plain_mlp("c_fc", "c_proj"),
        ..Names::LLAMA
    };
    d.rope = Some(RopeSpec {
        dims: hd,
        theta: c.f64_or("rope_theta", 10000.0)?,
        traditional: false,
        scaling: None,
        max_position_embeddings: None,
        table: RopeTable::NegExp,
    });
    d.final_logit_softcap = Some(15.0);
    d.final_logit_softcap_compiled = true;
    d.head = Head::Untied;
    Ok(d)
}

/// `models/llama4_text.py`: weightless q/k norms, traditional rope except on the
/// `no_rope_layers` entries that are 0, `feed_forward` MLP of `intermediate_size_mlp`,
/// head named `output`.
fn llama4_text(c: &Cfg) -> Result<Descriptor> {
    let mut k = common(c, true)?;
    k.inter = c.i32("intermediate_size_mlp")?;
    let hd = c.i32("head_dim")?;
    let mut d = base("llama4_text", &k, hd, c.f64("rms_norm_eps")?);
    if c.bool("use_qk_norm")? {
        d.qk_norm = QkNorm::PerHead;
        d.qk_norm_kind = Some(NormKind::RmsNoWeight);
    }
    d.rope = Some(RopeSpec::plain(hd, c.f64("rope_theta")?, true));
    let n = k.layers.max(0) as usize;
    d.no_rope = match c.get("no_rope_layers") {
        Some(Value::Array(a)) if a.len() == n => a
            .iter()
            .map(|v| !(v.as_bool().unwrap_or(false) || v.as_i64().unwrap_or(0) != 0))
            .collect(),
        _ => return Err(c.err("no_rope_layers", "must list one 0/1 per layer")),
    };
    d.names.mlp = "feed_forward";
    d.names.lm_head = "output";
    d.head = tie(c.bool("tie_word_embeddings")?);
    Ok(d)
}

/// `models/ministral3.py`: llama with `rope_parameters` and Llama 4's per-position query
/// scale.
fn ministral3(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, false)?;
    let hd = head_dim_or(c, k.hidden, k.heads)?;
    let mut d = base("ministral3", &k, hd, c.f64("rms_norm_eps")?);
    let params = c
        .opt_map("rope_parameters")?
        .ok_or_else(|| c.err("rope_parameters", "is required but missing"))?;
    let num = |key: &str| {
        params
            .get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| c.err("rope_parameters", &format!("needs a number `{key}`")))
    };
    d.query_scale = Some((
        num("llama_4_scaling_beta")?,
        num("original_max_position_embeddings")? as i64,
    ));
    d.rope = Some(RopeSpec {
        dims: hd,
        theta: num("rope_theta")?,
        traditional: false,
        scaling: Some(params.clone()),
        max_position_embeddings: c.opt_i64("max_position_embeddings")?,
        table: RopeTable::Initialize,
    });
    d.head = tie(c.bool_or("tie_word_embeddings", true)?);
    if let Some(types) = c.opt_strings("layer_types")? {
        d.sliding = types.iter().map(|t| t == "sliding_attention").collect();
    }
    d.sliding_window = c.opt_i64("sliding_window")?.map(|w| w.max(0) as usize);
    d.defines_make_cache = true;
    d.drop_layer_tensors = vec![INV_FREQ];
    Ok(d)
}

fn common_no_vocab(c: &Cfg) -> Result<Common> {
    Ok(Common {
        hidden: c.i32("hidden_size")?,
        layers: c.i32("num_hidden_layers")?,
        inter: c.i32("intermediate_size")?,
        heads: c.i32("num_attention_heads")?,
        kv_heads: c.i32("num_key_value_heads")?,
        vocab: 0,
    })
}

impl Cfg<'_> {
    fn i64_required(&self, k: &str) -> Result<i64> {
        self.opt_i64(k)?
            .ok_or_else(|| self.err(k, "is required but missing"))
    }
}

impl Descriptor {
    /// Checks what MLX would otherwise fail on (or worse): positive sizes, heads that divide,
    /// one entry per layer, a window for sliding layers.
    pub fn validate(self) -> Result<Descriptor> {
        let bad = |m: String| {
            Err(ModelError::Config(format!(
                "config.json (`{}`): {m}",
                self.model_type
            )))
        };
        for (name, v) in [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_layers),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", self.n_heads),
            ("num_key_value_heads", self.n_kv_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
        ] {
            if v <= 0 {
                return bad(format!("`{name}` must be positive, got {v}"));
            }
        }
        if self.n_heads % self.n_kv_heads != 0 {
            return bad(format!(
                "num_attention_heads {} must be a multiple of num_key_value_heads {}",
                self.n_heads, self.n_kv_heads
            ));
        }
        if self.sliding.len() != self.num_layers as usize {
            return bad(format!(
                "layer_types has {} entries for {} layers",
                self.sliding.len(),
                self.num_layers
            ));
        }
        if self.sliding.iter().any(|&s| s) && self.sliding_window.unwrap_or(0) == 0 {
            return bad("sliding_attention layers need a positive sliding_window".into());
        }
        if !self.sliding.iter().any(|&s| !s) {
            return bad("no full-attention layer".into());
        }
        if let Some((_, original)) = self.query_scale {
            if original <= 0 {
                return bad(format!(
                    "original_max_position_embeddings must be positive, got {original}"
                ));
            }
        }
        if self.names.positions.is_some() && self.n_positions <= 0 {
            return bad(format!(
                "n_positions must be positive, got {}",
                self.n_positions
            ));
        }
        if self.names.qkv.is_some()
            && self.names.qkv_layout == QkvLayout::PerHead
            && self.n_kv_heads != self.n_heads
        {
            return bad("a per-head fused qkv needs as many kv heads as heads".into());
        }
        if let Some(r) = &self.rope {
            if r.dims <= 0 || r.dims > self.head_dim || r.dims % 2 != 0 {
                return bad(format!(
                    "rotary dims {} must be even and within head_dim {}",
                    r.dims, self.head_dim
                ));
            }
        }
        Ok(self)
    }
}

impl Descriptor {
    /// The resolved knobs, one per line (`mlx info`).
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let mut line = |k: &str, v: String| {
            out.push_str(&format!("  {k}: {v}\n"));
        };
        line(
            "shape",
            format!(
                "hidden {}, {} layers, {} heads / {} kv heads of {}, intermediate {}, vocab {}",
                self.hidden_size,
                self.num_layers,
                self.n_heads,
                self.n_kv_heads,
                self.head_dim,
                self.intermediate_size,
                self.vocab_size
            ),
        );
        line(
            "norm",
            format!("{} (eps {})", self.norm.describe(), self.norm_eps),
        );
        line("placement", format!("{:?}", self.placement));
        line(
            "biases",
            format!(
                "qkv {}, o {}, mlp {}, down {}, lm_head {}",
                self.qkv_bias, self.o_bias, self.mlp_bias, self.down_bias, self.lm_head_bias
            ),
        );
        line("q/k norm", format!("{:?}", self.qk_norm));
        line("mlp", format!("{:?}", self.mlp));
        if let Some(q) = self.names.qkv {
            line("fused qkv", format!("{q} ({:?})", self.names.qkv_layout));
        }
        if let Some(g) = self.names.mlp_names.gate_up {
            line("fused gate/up", g.to_string());
        }
        match &self.rope {
            Some(r) => line(
                "rope",
                format!(
                    "{} of {} dims, base {}, traditional {}, scaling {}, table {:?}",
                    r.dims,
                    self.head_dim,
                    r.theta,
                    r.traditional,
                    r.scaling
                        .as_ref()
                        .map_or("none".to_string(), |m| Value::Object(m.clone()).to_string()),
                    r.table
                ),
            ),
            None => line("rope", "none".into()),
        }
        if let Some(r) = &self.local_rope {
            line("local rope base", format!("{}", r.theta));
        }
        if self.no_rope.iter().any(|&n| n) {
            line("NoPE layers", format!("{:?}", indices(&self.no_rope)));
        }
        if self.names.positions.is_some() {
            line("learned positions", format!("{}", self.n_positions));
        }
        line("attention scale", format!("{}", self.attn_scale));
        if let Some(c) = self.attn_logit_softcap {
            line("attention softcap", format!("{c}"));
        }
        if self.upcast != Upcast::None {
            line("attention upcast", format!("{:?}", self.upcast));
        }
        if let Some((beta, orig)) = self.query_scale {
            line(
                "query scale",
                format!("llama 4 beta {beta}, original {orig}"),
            );
        }
        if self.embed_scale != EmbedScale::None {
            line("embedding scale", format!("{:?}", self.embed_scale));
        }
        if let Some(m) = self.residual_multiplier {
            line("residual multiplier", format!("{m}"));
        }
        if self.logit_scale != LogitScale::None {
            line("logit scale", format!("{:?}", self.logit_scale));
        }
        if let Some(c) = self.final_logit_softcap {
            line("final softcap", format!("{c}"));
        }
        if self.sliding.iter().any(|&s| s) {
            line(
                "sliding layers",
                format!(
                    "{:?}, window {}",
                    indices(&self.sliding),
                    self.sliding_window.unwrap_or(0)
                ),
            );
        }
        line("head", format!("{:?}", self.head));
        out
    }
}

fn indices(flags: &[bool]) -> Vec<usize> {
    flags
        .iter()
        .enumerate()
        .filter_map(|(i, &f)| f.then_some(i))
        .collect()
}

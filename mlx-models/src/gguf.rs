//! GGUF model files, read through MLX's loader: llama.cpp tensor names mapped to mlx-lm's per
//! architecture ([`supported_gguf_architectures`]: one `GgufArch` row each in `ARCHS`), the Q/K
//! rows of the architectures llama.cpp's converter writes through its llama class un-permuted
//! (stored interleaved for its rope), Gemma's `1 + w` norms turned back into mlx-lm's `w`,
//! tensors the converter reshaped or fused put back (fused expert gate/up, Qwen3-Next's
//! regrouped `in_proj_qkvz` and `-exp(A_log)`), rope tensors turned back into the
//! `rope_scaling` they were computed from, hyper-parameters from metadata, and the tokenizer
//! data.
//!
//! Tensors come one of two ways ([`GgufTensors`]). MLX's reader returns Q4_0 / Q4_1 / Q8_0
//! tensors as affine-quantized triples (`<name>.weight`, `.scales`, `.biases`, group size 32),
//! whose quantization is then inferred from the shapes exactly as mlx-lm infers it for a
//! checkpoint without a `quantization` block; F32 and F16 keep their dtype. Files holding any
//! other type (k-quants, Q5_0, Q5_1, BF16: MLX 0.32.4 fails on some and turns the others into
//! f16) are read in Rust instead ([`mlx_core::io::read_gguf_header`]) and every tensor is
//! dequantized to f32 by [`crate::gguf_dequant`], bit for bit as gguf-py dequantizes it.

use std::collections::BTreeMap;
use std::path::Path;

use mlx_core::io::{load_gguf, read_gguf_header, GgufMetadata, GgufValue};
use mlx_core::prelude::*;
use serde_json::{json, Value};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::load::LoadOptions;
use crate::models::{build, LanguageModel};
use crate::weights::Weights;

mod gemma;
mod linear;
mod meta;
mod mla;
mod moe;
mod rope;
mod ssm;
mod table;

use meta::{
    first_count, head_size, layer_counts, layer_list, meta_bool, meta_count, meta_layer_count,
    need_count, per_layer_counts, positive_f64, require_context, rotary_dims, sliding_kinds, Keys,
};
pub use meta::{meta_f64, meta_str};
use rope::{llama3_rope, long_rope};
use table::{is_proj, map_name, ARCHS, GGUF_ENCODERS, QWEN35_PARTS};

/// What a GGUF file holds, mapped for this crate.
pub struct GgufModel {
    pub config: ModelConfig,
    pub tensors: BTreeMap<String, Array>,
    pub metadata: GgufMetadata,
    /// Weights kept as GGML blocks ([`GgufTensors::Blocks`]; else empty), by mlx-lm name
    /// (`<path>.weight`).
    pub blocks: BTreeMap<String, crate::layers::GgmlWeight>,
}

fn gguf_err(path: &Path, m: impl std::fmt::Display) -> ModelError {
    ModelError::Io {
        path: path.display().to_string(),
        message: m.to_string(),
    }
}

/// Tensors llama.cpp writes for rope scaling, which mlx-lm's configs hold as numbers.
const ROPE_TENSORS: &[&str] = &[
    "rope_factors_long.weight",
    "rope_factors_short.weight",
    "rope_freqs.weight",
];

/// Undoes llama.cpp's row permutation of Q / K: rows viewed as
/// `(heads, head_dim / 2, 2)` -> swap the last two -> flatten. Scales and biases of a
/// quantized tensor move with their rows. `name`/`key` name the tensor and the head count for
/// the message when the shape does not allow it.
fn unpermute(a: &Array, heads: i32, name: &str, key: &str) -> Result<Array> {
    let shape = a.shape();
    let &[rows, cols] = shape.as_slice() else {
        return Err(ModelError::Weights(vec![format!(
            "GGUF tensor {name}: shape {shape:?}, expected 2 dimensions"
        )]));
    };
    if heads <= 0 || rows % heads != 0 || (rows / heads) % 2 != 0 {
        return Err(ModelError::Weights(vec![format!(
            "GGUF tensor {name}: {rows} rows cannot be split into {key} = {heads} heads of an \
             even head dimension"
        )]));
    }
    let hd = rows / heads;
    let v = ops::reshape(a, &[heads, hd / 2, 2, cols], None)?;
    let v = ops::swapaxes(&v, 1, 2, None)?;
    Ok(ops::reshape(&v, &[rows, cols], None)?)
}

/// How [`read_gguf_with`] obtains the tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GgufTensors {
    /// MLX's reader when every tensor is of a type it loads as stored (F32, F16, Q4_0, Q4_1,
    /// Q8_0), else [`GgufTensors::Dequantize`].
    #[default]
    Auto,
    /// MLX's reader (`mx.load`).
    Mlx,
    /// Every tensor dequantized to f32 in Rust, as gguf-py's `dequantize` does.
    Dequantize,
    /// For the CPU decoder: as [`GgufTensors::Auto`] where MLX's reader takes every tensor as
    /// stored; else the linear and embedding weights stored in a GGML block type
    /// (`mlx_core::cpu::kquant::GgmlType`) kept as their blocks, read in place by its int8
    /// kernels ([`GgufModel::blocks`]; about the file's size in memory, where dequantizing
    /// takes 4 bytes a weight); every other tensor as [`GgufTensors::Dequantize`] gives it.
    /// The MLX forward over kept weights dequantizes them on use (the same bits, slowly).
    Blocks,
}

/// The mlx-lm names whose GGML blocks [`GgufTensors::Blocks`] keeps: plain linear and
/// embedding weights (not experts, fused or reshaped tensors).
fn keeps_blocks(mapped: &str) -> bool {
    const ENDS: &[&str] = &[
        ".q_proj.weight",
        ".k_proj.weight",
        ".v_proj.weight",
        ".o_proj.weight",
        ".gate_proj.weight",
        ".up_proj.weight",
        ".down_proj.weight",
    ];
    let top = matches!(mapped, "model.embed_tokens.weight" | "lm_head.weight");
    top || (mapped.starts_with("model.layers.")
        && !mapped.contains("expert")
        && !mapped.contains("switch_mlp")
        && ENDS.iter().any(|e| mapped.ends_with(e)))
}

/// The tensors of `header`: those `keep` picks (2-dimensional, of a GGML block type) as
/// their bytes, `(name, type, rows, cols, uint8 (rows, row_bytes))`, the others dequantized.
#[allow(clippy::type_complexity)]
fn blocks_with(
    path: &Path,
    header: mlx_core::io::GgufHeader,
    keep: impl Fn(&str) -> bool,
) -> Result<(
    BTreeMap<String, Array>,
    GgufMetadata,
    Vec<(String, mlx_core::cpu::kquant::GgmlType, i32, i32, Array)>,
)> {
    use std::io::{Read, Seek, SeekFrom};
    let mut kept = Vec::new();
    let mut rest = header.clone();
    rest.tensors.clear();
    let mut file = std::fs::File::open(path).map_err(|e| gguf_err(path, e))?;
    for t in &header.tensors {
        let ty = mlx_core::cpu::kquant::GgmlType::from_id(t.ggml_type);
        let (Some(ty), &[cols, rows]) = (ty, t.dims.as_slice()) else {
            rest.tensors.push(t.clone());
            continue;
        };
        let (Ok(rows), Ok(cols)) = (i32::try_from(rows), i32::try_from(cols)) else {
            rest.tensors.push(t.clone());
            continue;
        };
        if !keep(&t.name) || cols as usize % ty.block() != 0 {
            rest.tensors.push(t.clone());
            continue;
        }
        let rb = ty.row_bytes(cols as usize);
        let len = (rows as usize)
            .checked_mul(rb)
            .filter(|&n| n as u64 == t.bytes && i32::try_from(rb).is_ok())
            .ok_or_else(|| gguf_err(path, format!("tensor {}: size does not match", t.name)))?;
        let mut bytes = vec![0u8; len];
        file.seek(SeekFrom::Start(t.offset))
            .and_then(|_| file.read_exact(&mut bytes))
            .map_err(|e| gguf_err(path, format!("tensor {}: {e}", t.name)))?;
        let a = Array::from_slice(&bytes, &[rows, rb as i32])?;
        kept.push((t.name.clone(), ty, rows, cols, a));
    }
    let (raw, metadata) = dequantized_with(path, rest)?;
    Ok((raw, metadata, kept))
}

/// GGML types MLX's GGUF reader loads without converting them (F32, F16, Q4_0, Q4_1, Q8_0).
const MLX_NATIVE_TYPES: &[u32] = &[0, 1, 2, 3, 8];

/// Every tensor of the GGUF file at `path` dequantized to f32 (shapes row-major, as MLX and
/// numpy give them), with the file's metadata; both read in Rust.
pub fn read_gguf_dequantized(path: &Path) -> Result<(BTreeMap<String, Array>, GgufMetadata)> {
    let header = read_gguf_header(path).map_err(|e| gguf_err(path, e))?;
    dequantized_with(path, header)
}

/// [`read_gguf_dequantized`] with the header already read.
fn dequantized_with(
    path: &Path,
    header: mlx_core::io::GgufHeader,
) -> Result<(BTreeMap<String, Array>, GgufMetadata)> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path).map_err(|e| gguf_err(path, e))?;
    let mut tensors = BTreeMap::new();
    for t in &header.tensors {
        let elements = t
            .dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
            .ok_or_else(|| gguf_err(path, format!("tensor {}: too many elements", t.name)))?;
        let shape = t
            .dims
            .iter()
            .rev()
            .map(|&d| i32::try_from(d))
            .collect::<std::result::Result<Vec<i32>, _>>()
            .map_err(|_| gguf_err(path, format!("tensor {}: dimension too large", t.name)))?;
        let len = usize::try_from(t.bytes)
            .map_err(|_| gguf_err(path, format!("tensor {}: too large", t.name)))?;
        let mut bytes = vec![0u8; len];
        file.seek(SeekFrom::Start(t.offset))
            .and_then(|_| file.read_exact(&mut bytes))
            .map_err(|e| gguf_err(path, format!("tensor {}: {e}", t.name)))?;
        let values = crate::gguf_dequant::dequantize(t.ggml_type, &bytes, elements)
            .map_err(|e| gguf_err(path, format!("tensor {}: {e}", t.name)))?;
        drop(bytes);
        tensors.insert(t.name.clone(), Array::from_slice(&values, &shape)?);
    }
    Ok((tensors, header.metadata))
}

/// The GGUF architectures [`read_gguf`] maps (`general.architecture` values).
pub fn supported_gguf_architectures() -> Vec<&'static str> {
    ARCHS.iter().map(|a| a.arch).collect()
}

/// What an architecture's hyper-parameter function ([`table::GgufArch::config`]) works on:
/// the counts every map reads first, the per-layer lists some write, and the config and
/// tensors it completes or reshapes.
struct Cx<'a> {
    /// `general.architecture` (the row's `arch`).
    arch: &'static str,
    /// `<arch>.<key>` reads with the shared messages.
    k: Keys<'a>,
    path: &'a Path,
    meta: &'a GgufMetadata,
    /// `block_count` less the multi-token-prediction layers.
    blocks: i32,
    hidden: i32,
    heads: i32,
    kv_heads: i32,
    /// `feed_forward_length` (the first layer's where it is a list).
    ffn: i32,
    /// `attention.head_count_kv` as a per-layer list (rows with `per_layer_kv`).
    kv_per_layer: Option<&'a [i64]>,
    /// `feed_forward_length` as a per-layer list (gemma3n, gemma4, nemotron_h, openelm, deci).
    ffn_per_layer: Option<&'a [i64]>,
    /// OpenELM's and Deci's per-layer query / KV head counts.
    layer_heads: Option<&'a (Vec<i32>, Vec<i32>)>,
    /// `attention.key_length`, else `rope.dimension_count`.
    head_dim: Option<i64>,
    config: &'a mut Value,
    tensors: &'a mut BTreeMap<String, Array>,
    ggml: &'a mut BTreeMap<String, crate::layers::GgmlWeight>,
    /// Rope factor tensors not yet turned into `rope_scaling`.
    rope_tensors: &'a mut BTreeMap<String, Array>,
}

/// An architecture's hyper-parameter function: completes `cx.config` (and reshapes
/// `cx.tensors` where the converter changed them) after the keys every map shares.
type ConfigFn = fn(&mut Cx) -> Result<()>;

/// Reads a GGUF file of a supported architecture (see [`supported_gguf_architectures`]),
/// its tensors as [`GgufTensors::Auto`] chooses.
pub fn read_gguf(path: &Path) -> Result<GgufModel> {
    read_gguf_with(path, GgufTensors::Auto)
}

/// [`read_gguf`] with the tensors obtained as `how` says.
pub fn read_gguf_with(path: &Path, how: GgufTensors) -> Result<GgufModel> {
    // The header is read once here; MLX's own reader parses the file for its tensors.
    let mut kept = Vec::new();
    let (raw, metadata) = match how {
        GgufTensors::Blocks => {
            let header = read_gguf_header(path).map_err(|e| gguf_err(path, e))?;
            if header
                .tensors
                .iter()
                .all(|t| MLX_NATIVE_TYPES.contains(&t.ggml_type))
            {
                // As `Auto`: MLX's reader gives these as affine triples the CPU decoder reads.
                return read_gguf_with(path, GgufTensors::Mlx);
            }
            let arch_name = meta_str(&header.metadata, "general.architecture").unwrap_or("");
            let arch = ARCHS.iter().find(|a| a.arch == arch_name);
            let keep = |name: &str| {
                arch.and_then(|a| map_name(a, name))
                    .is_some_and(|m| keeps_blocks(&m))
            };
            let (raw, metadata, k) = blocks_with(path, header, keep)?;
            kept = k;
            (raw, metadata)
        }
        GgufTensors::Auto => {
            let header = read_gguf_header(path).map_err(|e| gguf_err(path, e))?;
            if header
                .tensors
                .iter()
                .all(|t| MLX_NATIVE_TYPES.contains(&t.ggml_type))
            {
                load_gguf(path, None).map_err(|e| gguf_err(path, e))?
            } else {
                dequantized_with(path, header)?
            }
        }
        GgufTensors::Dequantize => read_gguf_dequantized(path)?,
        GgufTensors::Mlx => load_gguf(path, None).map_err(|e| gguf_err(path, e))?,
    };
    let arch_name = meta_str(&metadata, "general.architecture").unwrap_or("");
    if let Some((_, why)) = GGUF_ENCODERS.iter().find(|(a, _)| *a == arch_name) {
        return Err(gguf_err(
            path,
            format!(
                "GGUF architecture `{arch_name}` ({why}) is not served: it is an encoder (masked \
                 language model / embeddings) and mlx-lm 0.32.2, whose model types this crate \
                 serves, has none; its tokenizer can still be read \
                 (mlx_tokenizers::tokenizer_gguf)"
            ),
        ));
    }
    let Some(arch) = ARCHS.iter().find(|a| a.arch == arch_name) else {
        return Err(ModelError::UnsupportedModelType {
            model_type: format!("gguf:{arch_name}"),
            remapped_to: None,
            supported: ARCHS.iter().map(|a| format!("gguf:{}", a.arch)).collect(),
        });
    };
    let keys = Keys {
        arch: arch.arch,
        meta: &metadata,
        path,
    };
    let key = |k: &str| keys.key(k);
    let float = |k: &str, zero_ok: bool| keys.float(k, zero_ok);
    let count = |k: &str| keys.count(k);
    // Pure state-space stacks: no attention heads, no feed-forward width (both written as 0).
    let attention_free = matches!(arch.arch, "mamba" | "mamba2");
    // OpenELM writes its query / KV head counts per layer; the first layer's stand for the
    // shared reads below, `openelm_config` takes the lists.
    let openelm_heads = if arch.arch == "openelm" {
        Some((
            per_layer_counts(&metadata, path, &key("attention.head_count"))?,
            per_layer_counts(&metadata, path, &key("attention.head_count_kv"))?,
        ))
    } else {
        None
    };
    // Deci (Nemotron-NAS) writes them per layer too, 0 where a layer has no attention (KV 0
    // also for a linear stand-in); `deci_config` reads the lists.
    let deci_heads = if arch.arch == "deci" {
        Some((
            layer_counts(&metadata, path, &key("attention.head_count"), 0)?,
            layer_counts(&metadata, path, &key("attention.head_count_kv"), 0)?,
        ))
    } else {
        None
    };
    let heads = if let Some((q, _)) = &openelm_heads {
        q[0]
    } else if let Some((q, _)) = &deci_heads {
        // The model's head count: that of its attention layers (`deci_config` checks them),
        // else the width over the head size.
        match q.iter().copied().find(|&n| n > 0) {
            Some(n) => n,
            None => {
                let d = count("attention.key_length")?.max(1);
                count("embedding_length")? / d
            }
        }
    } else if arch.arch == "rwkv7" {
        // RWKV-7 writes a head count of 0 (unused); its heads are the width over the head size.
        let (h, d) = (count("embedding_length")?, count("wkv.head_size")?);
        if h % d != 0 {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {d} does not divide `{}` = {h}",
                    key("wkv.head_size"),
                    key("embedding_length")
                ),
            ));
        }
        h / d
    } else if attention_free {
        // Mamba writes a head count of 0 (unused).
        1
    } else if let (true, Some(GgufValue::Array(a))) = (
        matches!(arch.arch, "step35" | "laguna"),
        metadata.get(&key("attention.head_count")),
    ) {
        // Step 3.5 writes one per layer, the sliding layers' their own (`step35_config`):
        // layer 0's here.
        first_count(a, path, &key("attention.head_count"))?
    } else if let (true, Some(GgufValue::Array(a))) = (
        arch.per_layer_kv,
        metadata.get(&key("attention.head_count")),
    ) {
        // PLaMo 2 writes it per layer too, 0 on its Mamba layers: the attention layers' count.
        let per = a
            .astype(Dtype::Int64)
            .and_then(|b| b.to_vec::<i64>())
            .map_err(|e| gguf_err(path, format!("metadata `attention.head_count`: {e}")))?;
        let mut nonzero = per.iter().copied().filter(|&n| n != 0);
        match nonzero.next() {
            Some(n) if n > 0 && n <= i64::from(i32::MAX) && nonzero.all(|m| m == n) => n as i32,
            _ => {
                return Err(gguf_err(
                    path,
                    format!(
                        "metadata `{}` is {per:?}: {arch_name} needs one positive head count on \
                         its attention layers, 0 on the others",
                        key("attention.head_count")
                    ),
                ))
            }
        }
    } else {
        count("attention.head_count")?
    };
    // LFM2 and Granite 4.0 H write `head_count_kv` per layer, 0 for their convolution /
    // Mamba layers.
    let kv_per_layer = match metadata.get(&key("attention.head_count_kv")) {
        Some(GgufValue::Array(a)) if arch.per_layer_kv && a.ndim() == 1 => Some(
            a.astype(Dtype::Int64)
                .and_then(|b| b.to_vec::<i64>())
                .map_err(|e| gguf_err(path, format!("metadata `attention.head_count_kv`: {e}")))?,
        ),
        _ => None,
    };
    let kv_heads = match &kv_per_layer {
        Some(per) => {
            let mut nonzero = per.iter().copied().filter(|&n| n != 0);
            let first = nonzero.next();
            match first {
                Some(n) if n > 0 && n <= i64::from(heads) && nonzero.all(|m| m == n) => n as i32,
                _ => {
                    return Err(gguf_err(
                        path,
                        format!(
                            "metadata `{}` is {per:?}: {arch_name} needs one positive head \
                             count (at most {heads}) on its attention layers, 0 on the others",
                            key("attention.head_count_kv")
                        ),
                    ))
                }
            }
        }
        None => match (&openelm_heads, &deci_heads) {
            (Some((_, kv)), _) => kv[0],
            (_, Some((_, kv))) => kv.iter().copied().find(|&n| n > 0).unwrap_or(heads),
            _ => match metadata.get(&key("attention.head_count_kv")) {
                Some(GgufValue::Array(a)) if matches!(arch.arch, "step35" | "mimo2") => {
                    first_count(a, path, &key("attention.head_count_kv"))?
                }
                _ => meta_count(&metadata, path, &key("attention.head_count_kv"))?.unwrap_or(heads),
            },
        },
    };
    let hidden = count("embedding_length")?;
    let vocab = match meta_count(&metadata, path, &key("vocab_size"))? {
        Some(v) => v,
        None => match metadata.get("tokenizer.ggml.tokens") {
            Some(GgufValue::Strings(t)) => i32::try_from(t.len()).map_err(|_| {
                gguf_err(
                    path,
                    "metadata `tokenizer.ggml.tokens` has too many entries",
                )
            })?,
            _ => {
                return Err(gguf_err(
                    path,
                    format!(
                        "no vocabulary size (metadata `{}` or `tokenizer.ggml.tokens`)",
                        key("vocab_size")
                    ),
                ))
            }
        },
    };
    let blocks = count("block_count")?;
    // Multi-token-prediction layers (GLM-4.5, DeepSeek V3) come after the main ones and are
    // counted in `block_count`; mlx-lm's sanitize drops them, so they are not read.
    // 0 is what converters write for a checkpoint without MTP layers (EXAONE MoE's).
    let nextn = if meta_f64(&metadata, &key("nextn_predict_layers")) == Some(0.0) {
        0
    } else {
        meta_count(&metadata, path, &key("nextn_predict_layers"))?.unwrap_or(0)
    };
    if nextn >= blocks {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {nextn} leaves no layer of `{}` = {blocks}",
                key("nextn_predict_layers"),
                key("block_count")
            ),
        ));
    }
    let blocks = blocks - nextn;
    let is_mtp = |name: &str| -> bool {
        name.strip_prefix("blk.")
            .and_then(|r| r.split_once('.'))
            .and_then(|(l, _)| l.parse::<i32>().ok())
            .is_some_and(|l| l >= blocks)
            && nextn > 0
    };
    // Gemma 4 writes the width per layer when its shared-KV layers' MLPs are double wide
    // (`gemma4_config` checks the list); the first is the base width.
    let ffn_per_layer = match metadata.get(&key("feed_forward_length")) {
        Some(GgufValue::Array(a))
            if matches!(
                arch.arch,
                "gemma4" | "gemma3n" | "nemotron_h" | "nemotron_h_moe" | "openelm" | "deci"
            ) && a.ndim() == 1
                && a.size() > 1 =>
        {
            Some(
                a.astype(Dtype::Int64)
                    .and_then(|b| b.to_vec::<i64>())
                    .map_err(|e| gguf_err(path, format!("metadata `feed_forward_length`: {e}")))?,
            )
        }
        _ => None,
    };
    let ffn = match &ffn_per_layer {
        // Nemotron-H: 0 on its Mamba-2 and attention layers (`nemotron_h_config` reads the list).
        Some(_) if matches!(arch.arch, "nemotron_h" | "nemotron_h_moe") => 0,
        Some(per) => i32::try_from(per[0])
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `{}` is {per:?}", key("feed_forward_length")),
                )
            })?,
        None if attention_free => 0,
        None => count("feed_forward_length")?,
    };
    let mut tensors = BTreeMap::new();
    let mut unknown = Vec::new();
    // Rope tensors that become hyper-parameters (long-rope factors).
    let mut rope_tensors: BTreeMap<String, Array> = BTreeMap::new();
    let mut ggml = BTreeMap::new();
    for (name, ty, rows, cols, a) in kept {
        let Some(m) = map_name(arch, &name) else {
            unknown.push(name);
            continue;
        };
        // Rows carry their blocks: llama.cpp's Q/K row permutation is undone on the bytes.
        // Deci's Q / K rows are permuted with the layer's own head counts.
        let deci_layer = |list: &[i32]| {
            let l = name.split('.').nth(1).and_then(|l| l.parse::<usize>().ok());
            l.and_then(|l| list.get(l.min(list.len().saturating_sub(1))).copied())
        };
        let a = if arch.permute_qk && is_proj(&m, "q_proj") {
            unpermute(&a, heads, &name, &key("attention.head_count"))?
        } else if arch.permute_qk && is_proj(&m, "k_proj") {
            unpermute(&a, kv_heads, &name, &key("attention.head_count_kv"))?
        } else if let (Some((q, kv)), true) = (&deci_heads, m.contains(".self_attn.")) {
            if m.contains(".q_proj.") {
                let n = deci_layer(q).unwrap_or(heads);
                unpermute(&a, n, &name, &key("attention.head_count"))?
            } else if m.contains(".k_proj.") {
                let n = deci_layer(kv).unwrap_or(kv_heads);
                unpermute(&a, n, &name, &key("attention.head_count_kv"))?
            } else {
                a
            }
        } else {
            a
        };
        if ggml.contains_key(&m) {
            return Err(gguf_err(
                path,
                format!("GGUF tensor {name} maps to {m}, which another tensor already gave"),
            ));
        }
        let g = crate::layers::GgmlWeight::new(a, ty, rows, cols)
            .map_err(|e| gguf_err(path, format!("tensor {name}: {e}")))?;
        ggml.insert(m, g);
    }
    for (name, a) in raw {
        if is_mtp(&name) {
            continue;
        }
        if ROPE_TENSORS.contains(&name.as_str()) && arch.rope_tensors {
            rope_tensors.insert(name, a);
            continue;
        }
        if matches!(
            arch.arch,
            "qwen3next"
                | "qwen35"
                | "qwen35moe"
                | "granitehybrid"
                | "mamba"
                | "mamba2"
                | "nemotron_h"
                | "nemotron_h_moe"
                | "falcon-h1"
                | "jamba"
                | "plamo2"
                | "kimi-linear"
        ) {
            let layer_of = |suffix: &str| {
                name.strip_prefix("blk.")
                    .and_then(|r| r.strip_suffix(suffix))
                    .filter(|l| l.parse::<u32>().is_ok())
                    .map(str::to_string)
            };
            // `blk.N.ssm_a` (no suffix): -exp(A_log), read back as mlx-lm's A_log; Mamba-2's
            // `ssm_a` and `ssm_d` are (heads, 1), mlx-lm's A_log and D (heads,).
            // Mamba (1) and Jamba keep A as (inner, state).
            let module = |layer: &str| match arch.arch {
                "granitehybrid" | "falcon-h1" | "jamba" => format!("model.layers.{layer}.mamba"),
                "kimi-linear" => format!("model.layers.{layer}.self_attn"),
                "mamba" | "mamba2" | "nemotron_h" | "nemotron_h_moe" | "plamo2" => {
                    format!("{}.{layer}.mixer", arch.layers)
                }
                _ => format!("model.layers.{layer}.linear_attn"),
            };
            if let Some(layer) = layer_of(".ssm_a") {
                let a_log = ops::log(&ops::negative(&a, None)?, None)?;
                // Kimi Linear keeps (1, 1, heads, 1).
                let a_log = if !matches!(arch.arch, "mamba" | "jamba" | "plamo2" | "kimi-linear") {
                    a_log.reshape(&[-1])?
                } else {
                    a_log
                };
                tensors.insert(format!("{}.A_log", module(&layer)), a_log);
                continue;
            }
            if let Some(layer) = layer_of(".ssm_d").filter(|_| {
                matches!(
                    arch.arch,
                    "granitehybrid"
                        | "mamba"
                        | "mamba2"
                        | "nemotron_h"
                        | "nemotron_h_moe"
                        | "falcon-h1"
                        | "jamba"
                        | "plamo2"
                )
            }) {
                tensors.insert(format!("{}.D", module(&layer)), a.reshape(&[-1])?);
                continue;
            }
        }
        match map_name(arch, &name) {
            Some(m) => {
                let a = if arch.permute_qk && is_proj(&m, "q_proj") {
                    unpermute(&a, heads, &name, &key("attention.head_count"))?
                } else if arch.permute_qk && is_proj(&m, "k_proj") {
                    unpermute(&a, kv_heads, &name, &key("attention.head_count_kv"))?
                } else if m.ends_with(".shared_expert_gate.weight") && a.ndim() == 1 {
                    // One gate row, which a converter may store as a vector.
                    let h = a.shape()[0];
                    a.reshape(&[1, h])?
                } else if (m.ends_with(".conv.conv.weight")
                    || m.ends_with(".mamba.conv1d.weight")
                    || m.ends_with(".mixer.conv1d.weight"))
                    && a.ndim() == 2
                {
                    // Stored squeezed, (channels, kernel): mlx-lm's Conv1d weight is
                    // (channels, kernel, 1).
                    a.expand_dims(&[2])?
                } else if arch.arch == "kimi-linear" && m.ends_with("_conv.conv.weight") {
                    // KDA's short convolutions, written (1, channels, 1, kernel) (or without
                    // the trailing axes): mlx-lm's Conv1d weight is (channels, kernel, 1).
                    let sh = a.shape();
                    match sh.as_slice() {
                        [1, c, 1, k] | [c, 1, k] | [c, k] => a.reshape(&[*c, *k, 1])?,
                        _ => {
                            return Err(gguf_err(
                                path,
                                format!("tensor {name}: shape {sh:?} is not a short convolution"),
                            ))
                        }
                    }
                } else if (m.ends_with(".mamba.norm.weight") || m.ends_with(".mixer.norm.weight"))
                    && a.ndim() == 2
                {
                    // Mamba-2's gated norm, stored per group.
                    a.reshape(&[-1])?
                } else if arch.norm_plus_one && name.contains("_norm.") && name.ends_with(".weight")
                {
                    // Stored as `1 + w` (a weak Python int in mlx-lm terms: the tensor's dtype).
                    (&a - 1)?
                } else {
                    a
                };
                if tensors.insert(m.clone(), a).is_some() {
                    return Err(gguf_err(
                        path,
                        format!(
                            "GGUF tensor {name} maps to {m}, which another tensor already gave"
                        ),
                    ));
                }
            }
            None => unknown.push(name),
        }
    }
    if !unknown.is_empty() {
        unknown.sort();
        return Err(ModelError::Weights(crate::weights::cap_listing(
            unknown
                .into_iter()
                .map(|n| format!("unexpected GGUF tensor: {n}"))
                .collect(),
        )));
    }
    split_gate_up(&mut tensors)?;
    let tied = !tensors.contains_key("lm_head.weight");
    let head_dim = match meta_count(&metadata, path, &key("attention.key_length"))? {
        Some(d) => Some(i64::from(d)),
        None => meta_count(&metadata, path, &key("rope.dimension_count"))?.map(i64::from),
    };
    // The norm epsilon: RMS norms' key, or LayerNorm's (starcoder2); EXAONE's converter has
    // written either. mlx-lm's field name per type.
    const RMS_EPS: &str = "attention.layer_norm_rms_epsilon";
    const LN_EPS: &str = "attention.layer_norm_epsilon";
    let (eps, eps_field) = match arch.arch {
        "starcoder2" => (float(LN_EPS, true)?, "norm_epsilon"),
        "stablelm" | "olmo" => (float(LN_EPS, true)?, "layer_norm_eps"),
        "gpt2" => (float(LN_EPS, true)?, "layer_norm_epsilon"),
        "gptneox" => (float(LN_EPS, true)?, "layer_norm_eps"),
        "starcoder" => (float(LN_EPS, true)?, "layer_norm_epsilon"),
        "phi2" => (float(LN_EPS, true)?, "layer_norm_eps"),
        "nemotron" => (float(LN_EPS, true)?, "norm_eps"),
        "command-r" | "cohere2" => (float(LN_EPS, true)?, "layer_norm_eps"),
        "lfm2" | "lfm2moe" => (float(RMS_EPS, true)?, "norm_eps"),
        "rwkv7" => (float(LN_EPS, true)?, "norm_eps"),
        "dbrx" => (float(LN_EPS, true)?, "layer_norm_eps"),
        "mimo2" => (float(RMS_EPS, true)?, "layernorm_epsilon"),
        // llama.cpp reads the RMS key, else the LayerNorm one (what the converter writes).
        "nemotron_h" | "nemotron_h_moe" => (
            match float(RMS_EPS, true)? {
                Some(e) => Some(e),
                None => float(LN_EPS, true)?,
            },
            "layer_norm_epsilon",
        ),
        // llama.cpp reads Qwen's RMS key; its converter writes Qwen's `layer_norm_epsilon`
        // under the LayerNorm one.
        "exaone" | "qwen" => (
            match float(RMS_EPS, true)? {
                Some(e) => Some(e),
                None => float(LN_EPS, true)?,
            },
            "layer_norm_epsilon",
        ),
        _ => (float(RMS_EPS, true)?, "rms_norm_eps"),
    };
    let eps = eps.ok_or_else(|| {
        let k = if matches!(
            eps_field,
            "norm_epsilon" | "layer_norm_eps" | "layer_norm_epsilon"
        ) && arch.arch != "qwen"
            || matches!(arch.arch, "rwkv7" | "nemotron" | "dbrx")
        {
            LN_EPS
        } else {
            RMS_EPS
        };
        gguf_err(path, format!("metadata `{}` is missing", key(k)))
    })?;
    let mut config = json!({
        "model_type": arch.model_type,
        "hidden_size": hidden,
        "num_hidden_layers": blocks,
        "intermediate_size": ffn,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
        "rope_theta": float("rope.freq_base", false)?.unwrap_or(10000.0),
        "tie_word_embeddings": tied,
    });
    config[eps_field] = Value::from(eps);
    if let Some(ctx) = meta_count(&metadata, path, &key("context_length"))? {
        config["max_position_embeddings"] = Value::from(ctx);
    }
    match head_dim {
        Some(d) if d != i64::from(hidden / heads) || arch.arch != "llama" => {
            config["head_dim"] = Value::from(d);
        }
        _ => {}
    }
    if let Some(f) = arch.config {
        f(&mut Cx {
            arch: arch.arch,
            k: keys,
            path,
            meta: &metadata,
            blocks,
            hidden,
            heads,
            kv_heads,
            ffn,
            kv_per_layer: kv_per_layer.as_deref(),
            ffn_per_layer: ffn_per_layer.as_deref(),
            layer_heads: openelm_heads.as_ref().or(deci_heads.as_ref()),
            head_dim,
            config: &mut config,
            tensors: &mut tensors,
            ggml: &mut ggml,
            rope_tensors: &mut rope_tensors,
        })?;
    }
    if let Some(f) = rope_tensors.remove("rope_freqs.weight") {
        llama3_rope(&mut config, &f, path, hidden / heads)?;
    }
    if let Some(name) = rope_tensors.keys().next() {
        return Err(ModelError::Weights(vec![format!(
            "unexpected GGUF tensor: {name}"
        )]));
    }
    if let Some((prefix, strip, text_type)) = arch.text_of {
        // mlx-lm's model is the text model of the multimodal checkpoint.
        config = json!({"model_type": arch.model_type, "text_config": config});
        config["text_config"]["model_type"] = Value::from(text_type);
        let rename = |k: String| format!("{prefix}{}", k.strip_prefix(strip).unwrap_or(&k));
        tensors = std::mem::take(&mut tensors)
            .into_iter()
            .map(|(k, v)| (rename(k), v))
            .collect();
        ggml = std::mem::take(&mut ggml)
            .into_iter()
            .map(|(k, v)| (rename(k), v))
            .collect();
    }
    let config = ModelConfig::from_value(config).map_err(|e| match e {
        ModelError::Config(m) => gguf_err(path, format!("hyper-parameters: {m}")),
        other => other,
    })?;
    Ok(GgufModel {
        config,
        tensors,
        metadata,
        blocks: ggml,
    })
}

/// RWKV-7 (`Rwkv7Model`'s keys) as mlx-lm's rwkv7 args: the head size, the four LoRA ranks,
/// the LayerNorm epsilon; the fused token-shift mixes (r, w, k, v, a, g) split back into
/// `x_r` .. `x_g` of shape (1, 1, hidden), the LoRAs' biases (`*0`) back under `lora.2.bias`,
/// `r_k` per head, and the first layer's value LoRA dropped (the converter writes copies of
/// its `a` LoRA there; mlx-lm's first layer has none).
/// Nemotron (`nemotron`): relu2, the rotated share of the head from `rope.dimension_count`
/// (the converter's int(factor * hidden) // heads), biases from the tensors, linear rope
/// scaling from `rope.scaling.type` / `rope.scaling.factor` (another kind is refused).
fn nemotron_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, hidden, heads) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.meta,
        cx.hidden,
        cx.heads,
    );
    let key = |k: &str| format!("nemotron.{k}");
    config["hidden_act"] = Value::from("relu2");
    // The head size is `attention.key_length` where written (TextModel writes it from the
    // config's `head_dim`), else hidden / heads; `rope.dimension_count` is the rotated part.
    let hd = meta_count(meta, path, &key("attention.key_length"))?.unwrap_or(hidden / heads.max(1));
    config["head_dim"] = Value::from(hd);
    let rot = rotary_dims(meta, path, &key("rope.dimension_count"), hd / 2, hd)?;
    config["partial_rotary_factor"] = Value::from(f64::from(rot) / f64::from(hd));
    let has = |k: &str| tensors.contains_key(k);
    config["attention_bias"] = Value::from(has("model.layers.0.self_attn.q_proj.bias"));
    config["mlp_bias"] = Value::from(has("model.layers.0.mlp.up_proj.bias"));
    match meta_str(meta, &key("rope.scaling.type")) {
        None | Some("none") => {}
        Some("linear") => {
            let f = meta_f64(meta, &key("rope.scaling.factor")).ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `{}` is missing", key("rope.scaling.factor")),
                )
            })?;
            config["rope_scaling"] = json!({"type": "linear", "factor": f});
        }
        Some(other) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {other:?}: mlx-lm's nemotron takes linear scaling only",
                    key("rope.scaling.type")
                ),
            ))
        }
    }
    Ok(())
}

/// Phi-2 (`phi2`): mlx-lm's phi arguments; the rotated share of the head from
/// `rope.dimension_count` (the whole head when absent); a fused `attn_qkv` (q, k, v rows in
/// turn, as older converters wrote Phi-2's `Wqkv`) split into mlx-lm's three projections.
fn phi2_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks, hidden, heads) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
        cx.hidden,
        cx.heads,
    );
    let key = |k: &str| format!("phi2.{k}");
    let hd = head_size(path, &key, hidden, heads)?;
    if let Some(c) = config.as_object_mut() {
        c.remove("head_dim");
    }
    let rot = rotary_dims(meta, path, &key("rope.dimension_count"), hd, hd)?;
    config["partial_rotary_factor"] = Value::from(f64::from(rot) / f64::from(hd));
    let kv = config["num_key_value_heads"].as_i64().unwrap_or(0) as i32;
    for l in 0..blocks {
        for suffix in ["weight", "bias", "scales", "biases"] {
            let name = format!("model.layers.{l}.self_attn.gguf_qkv.{suffix}");
            let Some(qkv) = tensors.remove(&name) else {
                continue;
            };
            let rows = qkv.shape()[0];
            let (q, k) = (heads * hd, kv * hd);
            if rows != q + 2 * k {
                return Err(gguf_err(
                    path,
                    format!(
                        "GGUF tensor blk.{l}.attn_qkv.{suffix} has {rows} rows, not {} (q, k, v)",
                        q + 2 * k
                    ),
                ));
            }
            let cols = qkv.shape().get(1).copied();
            for (part, start, len) in [("q", 0, q), ("k", q, k), ("v", q + k, k)] {
                let a = match cols {
                    Some(c) => qkv.slice(&[start, 0], &[start + len, c], &[1, 1])?,
                    None => qkv.slice(&[start], &[start + len], &[1])?,
                };
                tensors.insert(
                    format!("model.layers.{l}.self_attn.{part}_proj.{suffix}"),
                    a,
                );
            }
        }
    }
    Ok(())
}

/// GPT-2 (`gpt2`): mlx-lm's `n_*` arguments; the positions from `position_embd`'s rows. The
/// head is the embedding in mlx-lm's gpt2: a file with its own `output` is refused.
fn gpt2_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, blocks, hidden, heads) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.blocks,
        cx.hidden,
        cx.heads,
    );
    if tensors.contains_key("lm_head.weight") {
        return Err(gguf_err(
            path,
            "GGUF tensor output.weight: mlx-lm's gpt2 ties its head to the embedding",
        ));
    }
    let positions = tensors
        .get("model.wpe.weight")
        .map(|w| w.shape()[0])
        .ok_or_else(|| gguf_err(path, "GGUF tensor position_embd.weight is missing"))?;
    config["n_embd"] = Value::from(hidden);
    config["n_head"] = Value::from(heads);
    config["n_layer"] = Value::from(blocks);
    config["n_positions"] = Value::from(positions);
    config["n_ctx"] = config
        .get("max_position_embeddings")
        .cloned()
        .unwrap_or(Value::from(positions));
    Ok(())
}

/// Qwen (`qwen`): mlx-lm's qwen arguments (its rope base is fixed at 10000, its heads all
/// have keys and values, its head untied); biases beyond the qkv one from the tensors.
fn qwen_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, hidden, heads, kv_heads) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.hidden,
        cx.heads,
        cx.kv_heads,
    );
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    let hd = head_size(path, key, hidden, heads)?;
    if kv_heads != heads {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {kv_heads}: mlx-lm's qwen gives every one of the {heads} heads \
                 its keys and values",
                key("attention.head_count_kv")
            ),
        ));
    }
    if config["rope_theta"].as_f64() != Some(10000.0) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is {}: mlx-lm's qwen fixes the rope base at 10000",
                key("rope.freq_base"),
                config["rope_theta"]
            ),
        ));
    }
    if !tensors.contains_key("lm_head.weight") {
        return Err(gguf_err(
            path,
            "GGUF tensor output.weight is missing: mlx-lm's qwen has its own head",
        ));
    }
    config["kv_channels"] = Value::from(hd);
    config["no_bias"] = Value::from(!tensors.contains_key("transformer.h.0.attn.c_proj.bias"));
    Ok(())
}

/// PLaMo (`plamo`): the query heads shared `n_shared_head` ways over the KV heads, the
/// converter's shuffle of `attn_q`'s rows and `attn_output`'s columns, (kv, shared, head_dim),
/// put back to mlx-lm's (shared, kv, head_dim).
fn plamo_config(cx: &mut Cx) -> Result<()> {
    if let Some(k) = cx.ggml.keys().find(|k| k.contains(".self_attn.")) {
        return Err(gguf_err(
            cx.path,
            format!("{k}: PLaMo's shuffled attention is read dequantized only"),
        ));
    }
    let (config, tensors, path, hidden, heads, kv_heads) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.hidden,
        cx.heads,
        cx.kv_heads,
    );
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    let hd = head_size(path, key, hidden, heads)?;
    if heads % kv_heads != 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {kv_heads} does not divide `{}` = {heads}",
                key("attention.head_count_kv"),
                key("attention.head_count")
            ),
        ));
    }
    let shared = heads / kv_heads;
    for (name, a) in tensors.iter_mut() {
        let fixed = if name.ends_with(".self_attn.q_proj.weight") {
            let cols = a.shape()[1];
            a.reshape(&[kv_heads, shared, hd, cols])?
                .transpose(&[1, 0, 2, 3])?
                .reshape(&[heads * hd, cols])?
        } else if name.ends_with(".self_attn.o_proj.weight") {
            let rows = a.shape()[0];
            a.reshape(&[rows, kv_heads, shared, hd])?
                .transpose(&[0, 2, 1, 3])?
                .reshape(&[rows, heads * hd])?
        } else {
            continue;
        };
        *a = fixed;
    }
    config["n_shared_head"] = Value::from(shared);
    config.as_object_mut().map(|m| m.remove("head_dim"));
    Ok(())
}

/// PLaMo 3 (`plamo3`): the norms' offsets (added by the converter, added again at run time by
/// mlx-lm) taken off, in f32 as mlx-lm's `weight + offset` is computed; the window, its period
/// (every n-th layer full) and the local rope base from metadata.
fn plamo3_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta) = (&mut *cx.config, &mut *cx.tensors, cx.path, cx.meta);
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    let after_mlp = (1.0f64 / 5f64.powf(1.5)) as f32;
    for (name, a) in tensors.iter_mut() {
        let offset = if name.ends_with(".post_mixer_norm.weight") {
            (1.0f64 / 5.0) as f32
        } else if name.ends_with(".post_mlp_norm.weight") {
            after_mlp
        } else if name.ends_with("norm.weight") {
            1.0
        } else {
            continue;
        };
        *a = (&*a - offset)?;
    }
    let need = |k: &str| -> Result<i32> {
        meta_count(meta, path, &key(k))?
            .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", key(k))))
    };
    config["window_size"] = Value::from(need("attention.sliding_window")?);
    config["sliding_window_pattern"] = Value::from(need("attention.sliding_window_pattern")?);
    if let Some(theta) = positive_f64(meta, path, &key("rope.freq_base_swa"))? {
        config["rope_local_theta"] = Value::from(theta);
    }
    Ok(())
}

/// Talkie (`talkie`): the converter's negation of the second half of every query and key
/// head's rows undone (exact), its renames put back (`attn_output.scale` -> `attn_gain.a_g`,
/// `ffn_down.scale` -> `mlp_gain.a_g`, `output.weight` -> the bare `lm_head`, the head gain
/// flattened) and `logit_scale` made the head's gain `lm_head_gain.w_g`.
fn talkie_config(cx: &mut Cx) -> Result<()> {
    if let Some(k) = cx.ggml.keys().find(|k| k.contains(".attn.attn_")) {
        return Err(gguf_err(
            cx.path,
            format!("{k}: Talkie's sign-flipped attention is read dequantized only"),
        ));
    }
    let (config, tensors, path, meta) = (&mut *cx.config, &mut *cx.tensors, cx.path, cx.meta);
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    let hd = config["head_dim"]
        .as_i64()
        .map(|d| d as i32)
        .filter(|&d| d > 0 && d % 2 == 0)
        .ok_or_else(|| {
            gguf_err(
                path,
                format!(
                    "metadata `{}` is missing or odd: Talkie's heads need an even size",
                    key("attention.key_length")
                ),
            )
        })?;
    let half = hd / 2;
    let signs: Vec<f32> = (0..hd).map(|i| if i < half { 1.0 } else { -1.0 }).collect();
    let signs = Array::from_slice(&signs, &[1, hd, 1])?;
    let renames = [
        (".attn.attn_resid.scale", ".attn_gain.a_g"),
        (".mlp.mlp_resid.scale", ".mlp_gain.a_g"),
    ];
    let names: Vec<String> = tensors.keys().cloned().collect();
    for name in names {
        let Some(a) = tensors.remove(&name) else {
            continue;
        };
        let (name, a) = if name.ends_with(".attn.attn_query.weight")
            || name.ends_with(".attn.attn_key.weight")
        {
            let shape = a.shape().to_vec();
            let flipped = (&a.reshape(&[-1, hd, shape[1]])? * &signs.astype(a.dtype())?)?;
            (name, flipped.reshape(&shape)?)
        } else if name.ends_with(".attn.head_gain.head_g") {
            (name, a.reshape(&[-1])?)
        } else if name == "lm_head.weight" {
            ("lm_head".to_string(), a)
        } else if let Some((from, to)) = renames.iter().find(|(f, _)| name.ends_with(f)) {
            (format!("{}{to}", &name[..name.len() - from.len()]), a)
        } else {
            (name, a)
        };
        tensors.insert(name, a);
    }
    if !tensors.contains_key("lm_head") {
        return Err(gguf_err(
            path,
            "GGUF tensor output.weight is missing: Talkie's head is its own",
        ));
    }
    let gain = meta_f64(meta, &key("logit_scale")).ok_or_else(|| {
        gguf_err(
            path,
            format!("metadata `{}` is missing", key("logit_scale")),
        )
    })?;
    tensors.insert(
        "lm_head_gain.w_g".into(),
        Array::from_slice(&[gain as f32], &[1])?,
    );
    Ok(())
}

/// Mellum (`mellum`): the experts (llama.cpp renormalizes the top-k softmax weights and scales
/// them only by an `expert_weights_scale` other than 0 or 1, which mlx-lm's mellum lacks), the
/// layer kinds from the sliding flags (all full without a window) and each kind's rope base.
fn mellum_config(cx: &mut Cx) -> Result<()> {
    let (config, path, meta, blocks) = (&mut *cx.config, cx.path, cx.meta, cx.blocks);
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    let need = |k: &str| -> Result<i32> {
        meta_count(meta, path, &key(k))?
            .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", key(k))))
    };
    config["num_experts"] = Value::from(need("expert_count")?);
    config["num_experts_per_tok"] = Value::from(need("expert_used_count")?);
    config["moe_intermediate_size"] = Value::from(need("expert_feed_forward_length")?);
    config["norm_topk_prob"] = Value::from(true);
    if let Some(s) = meta_f64(meta, &key("expert_weights_scale")).filter(|&s| s != 0.0 && s != 1.0)
    {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is {s}: mlx-lm's mellum does not scale its experts",
                key("expert_weights_scale")
            ),
        ));
    }
    if let Some(t) = meta_str(meta, &key("rope.scaling.type")).filter(|t| *t != "none") {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is `{t}`; the mellum map reads unscaled rope only",
                key("rope.scaling.type")
            ),
        ));
    }
    let window = meta_count(meta, path, &key("attention.sliding_window"))?;
    let kinds = match window {
        Some(_) => sliding_kinds(meta, path, key, blocks)?,
        None => vec!["full_attention"; blocks as usize],
    };
    config["layer_types"] = json!(kinds);
    config["sliding_window"] = Value::from(window.unwrap_or(0));
    let theta = config["rope_theta"].clone();
    let swa = match positive_f64(meta, path, &key("rope.freq_base_swa"))? {
        Some(t) => Value::from(t),
        None => theta.clone(),
    };
    config["rope_parameters"] = json!({
        "full_attention": {"rope_theta": theta},
        "sliding_attention": {"rope_theta": swa},
    });
    if config.get("head_dim").is_none() {
        return Err(gguf_err(
            path,
            format!("metadata `{}` is missing", key("attention.key_length")),
        ));
    }
    Ok(())
}

/// Deci / Nemotron-NAS (`deci` -> mlx-lm's `nemotron-nas`): each layer's `block_configs`
/// entry from the per-layer lists DeciModel writes: query heads 0 (no attention), or the
/// model's count with KV heads 0 (the linear stand-in: `attn_output` is mlx-lm's
/// `self_attn.linear`) or a divisor of it (`n_heads_in_group`, Q / K rows un-permuted per
/// layer); an MLP width of 0 (none) or the converter's `_ffn_mult_to_intermediate_size` of a
/// multiplier, which is recovered (`3 w / 2 hidden`, checked to give `w` back in mlx-lm's
/// arithmetic). A width no multiplier gives is refused.
fn deci_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, ggml, path, blocks, hidden, heads) = (
        &mut *cx.config,
        &mut *cx.tensors,
        &mut *cx.ggml,
        cx.path,
        cx.blocks,
        cx.hidden,
        cx.heads,
    );
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    let (q, kv) = cx.layer_heads.cloned().unwrap_or_default();
    let ffn = cx
        .ffn_per_layer
        .map_or_else(|| vec![i64::from(cx.ffn)], <[i64]>::to_vec);
    let n = blocks as usize;
    let expand = |v: Vec<i64>, k: &str| -> Result<Vec<i64>> {
        match v.len() {
            1 => Ok(vec![v[0]; n]),
            l if l == n => Ok(v),
            l => Err(gguf_err(
                path,
                format!("metadata `{}` has {l} entries for {blocks} layers", key(k)),
            )),
        }
    };
    let (qk, kvk, fk) = (
        "attention.head_count",
        "attention.head_count_kv",
        "feed_forward_length",
    );
    let q = expand(q.into_iter().map(i64::from).collect(), qk)?;
    let kv = expand(kv.into_iter().map(i64::from).collect(), kvk)?;
    let ffn = expand(ffn, fk)?;
    let h = i64::from(heads);
    if heads <= 0 || hidden % heads != 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` ({heads}) does not divide `{}` ({hidden})",
                key(qk),
                key("embedding_length")
            ),
        ));
    }
    if let Some(d) = config["head_dim"]
        .as_i64()
        .filter(|&d| d != i64::from(hidden / heads))
    {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is {d}; nemotron-nas's heads are {} wide",
                key("attention.key_length"),
                hidden / heads
            ),
        ));
    }
    let d = f64::from(hidden);
    let mut blocks_cfg = Vec::with_capacity(n);
    for l in 0..n {
        let bad = |k: &str, why: String| {
            gguf_err(path, format!("layer {l}: metadata `{}` {why}", key(k)))
        };
        let p = format!("model.layers.{l}.self_attn");
        let attention = match (q[l], kv[l]) {
            (0, 0) => json!({"no_op": true}),
            (a, _) if a != h => {
                return Err(bad(
                    qk,
                    format!("is {a}; the attention layers have {h} heads"),
                ))
            }
            (_, 0) => {
                // Every part (a quantized weight's scales and biases too).
                let parts: Vec<String> = tensors
                    .keys()
                    .filter(|k| k.starts_with(&format!("{p}.o_proj.")))
                    .cloned()
                    .collect();
                for k in parts {
                    if let Some(w) = tensors.remove(&k) {
                        tensors.insert(k.replacen(".o_proj.", ".linear.", 1), w);
                    }
                }
                if let Some(g) = ggml.remove(&format!("{p}.o_proj.weight")) {
                    ggml.insert(format!("{p}.linear.weight"), g);
                }
                json!({"replace_with_linear": true})
            }
            (_, k) if k < 0 || h % k != 0 => {
                return Err(bad(kvk, format!("is {k}, which does not divide {h} heads")))
            }
            (_, k) => {
                // Rows of every part (a quantized weight's scales and biases too); weights kept
                // as GGML blocks were un-permuted as they were read.
                for (proj, count, name) in [("q_proj", h, qk), ("k_proj", k, kvk)] {
                    let parts: Vec<String> = tensors
                        .keys()
                        .filter(|t| t.starts_with(&format!("{p}.{proj}.")))
                        .cloned()
                        .collect();
                    for t in parts {
                        let Some(w) = tensors.remove(&t) else {
                            continue;
                        };
                        let w = if w.ndim() == 1 {
                            let r = w.shape()[0];
                            unpermute(&w.reshape(&[r, 1])?, count as i32, &t, &key(name))?
                                .reshape(&[r])?
                        } else {
                            unpermute(&w, count as i32, &t, &key(name))?
                        };
                        tensors.insert(t, w);
                    }
                }
                json!({"n_heads_in_group": h / k})
            }
        };
        let mlp = match ffn[l] {
            0 => json!({"no_op": true}),
            w if w > 0 => {
                // mlx-lm: round(mult, 6), then find_multiple(int(2 * mult * d / 3), 256).
                let mult = (1.5 * w as f64 / d * 1e6).round() / 1e6;
                let i = (2.0 * mult * d / 3.0) as i64;
                let back = if i % 256 == 0 { i } else { i + 256 - i % 256 };
                if back != w {
                    return Err(bad(
                        fk,
                        format!("is {w}, which no `ffn_mult` gives (a multiple of 256)"),
                    ));
                }
                json!({"ffn_mult": mult})
            }
            w => return Err(bad(fk, format!("is {w}"))),
        };
        blocks_cfg.push(json!({"attention": attention, "ffn": mlp}));
    }
    config["model_type"] = Value::from("nemotron-nas");
    config["num_attention_heads"] = Value::from(heads);
    config["block_configs"] = Value::from(blocks_cfg);
    let has = |t: &str| {
        tensors
            .keys()
            .any(|k| k.starts_with("model.layers.") && k.ends_with(t))
    };
    config["attention_bias"] = Value::from(has(".self_attn.q_proj.bias"));
    config["mlp_bias"] = Value::from(has(".mlp.up_proj.bias"));
    for k in ["head_dim", "num_key_value_heads", "intermediate_size"] {
        if let Value::Object(m) = config {
            m.remove(k);
        }
    }
    Ok(())
}

/// BitNet's projections: llama.cpp's part, mlx-lm's module.
const BITNET_LINEARS: &[(&str, &str)] = &[
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// BitNet b1.58 (`bitnet`): BitnetModel writes each projection as ternary values times one
/// scale (its `weight_quant`); mlx-lm's BitLinear holds the codes packed four output rows a
/// byte plus `weight_scale`, which [`bitnet_pack`] recovers exactly. The rope scaling the
/// converter writes (linear, factor 1) is no scaling; another linear factor is kept.
fn bitnet_config(cx: &mut Cx) -> Result<()> {
    if let Some(k) = cx
        .ggml
        .keys()
        .find(|k| BITNET_LINEARS.iter().any(|(_, p)| k.contains(p)))
    {
        return Err(gguf_err(
            cx.path,
            format!("{k}: BitNet's ternary weights are read dequantized only"),
        ));
    }
    let (config, tensors, path, meta, blocks) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
    );
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    match meta_str(meta, &key("rope.scaling.type")) {
        None | Some("none") => {}
        Some("linear") => {
            let f = meta_f64(meta, &key("rope.scaling.factor")).ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `{}` is missing", key("rope.scaling.factor")),
                )
            })?;
            if f != 1.0 {
                config["rope_scaling"] = json!({"type": "linear", "factor": f});
            }
        }
        Some(other) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {other:?}: mlx-lm's bitnet takes linear scaling only",
                    key("rope.scaling.type")
                ),
            ))
        }
    }
    let bias = |p: &str| tensors.contains_key(&format!("model.layers.0.{p}.bias"));
    config["attention_bias"] = Value::from(bias("self_attn.q_proj"));
    config["mlp_bias"] = Value::from(bias("mlp.up_proj"));
    for l in 0..blocks {
        for (part, module) in BITNET_LINEARS {
            let gguf = format!("blk.{l}.{part}.weight");
            let name = format!("model.layers.{l}.{module}");
            let w = tensors
                .remove(&format!("{name}.weight"))
                .ok_or_else(|| gguf_err(path, format!("GGUF tensor {gguf} is missing")))?;
            let (packed, scale) =
                bitnet_pack(&w).map_err(|e| gguf_err(path, format!("GGUF tensor {gguf}: {e}")))?;
            tensors.insert(format!("{name}.weight"), packed);
            tensors.insert(format!("{name}.weight_scale"), scale);
        }
    }
    Ok(())
}

/// A weight of ternary values times one scale (`(out, in)`, `out` a multiple of 4) as mlx-lm's
/// BitLinear holds it: uint8 `(out / 4, in)` whose bits `2i..2i + 2` of row `r` are row
/// `r + i * out / 4`'s code (value / scale + 1), and the scale (the non-zero magnitude, 1 when
/// every value is 0) in the weight's dtype, shape (1,). Values that are not 0 or plus / minus
/// one magnitude are refused.
fn bitnet_pack(w: &Array) -> std::result::Result<(Array, Array), String> {
    let shape = w.shape();
    let &[out, cols] = shape.as_slice() else {
        return Err(format!("must be 2-d, got shape {shape:?}"));
    };
    if out % 4 != 0 {
        return Err(format!(
            "has {out} rows; mlx-lm's BitLinear packs four output rows a byte"
        ));
    }
    let v = w
        .astype(Dtype::Float32)
        .and_then(|a| a.to_vec::<f32>())
        .map_err(|e| e.to_string())?;
    let s = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    if let Some(i) = v.iter().position(|&x| !(x == 0.0 || x == s || x == -s)) {
        let c = cols as usize;
        return Err(format!(
            "value {} at ({}, {}) is not 0 or +/-{s}: not ternary values times one scale",
            v[i],
            i / c,
            i % c
        ));
    }
    let (q, c) = (out as usize / 4, cols as usize);
    let mut packed = vec![0u8; q * c];
    for i in 0..4 {
        for (j, p) in packed.iter_mut().enumerate() {
            let x = v[i * q * c + j];
            let code: u8 = if x > 0.0 {
                2
            } else if x < 0.0 {
                0
            } else {
                1
            };
            *p |= code << (2 * i);
        }
    }
    let s = if s == 0.0 { 1.0 } else { s };
    let err = |e: mlx_core::Error| e.to_string();
    Ok((
        Array::from_slice(&packed, &[out / 4, cols]).map_err(err)?,
        Array::from_slice(&[s], &[1])
            .and_then(|a| a.astype(w.dtype()))
            .map_err(err)?,
    ))
}

/// OpenELM (`openelm`): mlx-lm's arguments from the per-layer lists (each MLP width as a
/// multiplier of the width with a divisor of 1, which gives the width back through mlx-lm's
/// `make_divisible`); gate and up joined into `proj_1`.
fn openelm_config(cx: &mut Cx) -> Result<()> {
    if let Some(k) = cx.ggml.keys().find(|k| k.contains(".ffn.gguf_")) {
        return Err(gguf_err(
            cx.path,
            format!("{k}: OpenELM's split gate / up are read dequantized only"),
        ));
    }
    let (config, tensors, path, blocks, hidden) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.blocks,
        cx.hidden,
    );
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    let (q, kv) = cx.layer_heads.cloned().unwrap_or_default();
    let ffn = cx
        .ffn_per_layer
        .map_or_else(|| vec![i64::from(cx.ffn)], <[i64]>::to_vec);
    let n = blocks as usize;
    let expand = |v: Vec<i64>, k: &str| -> Result<Vec<i64>> {
        match v.len() {
            1 => Ok(vec![v[0]; n]),
            l if l == n => Ok(v),
            l => Err(gguf_err(
                path,
                format!("metadata `{}` has {l} entries for {blocks} layers", key(k)),
            )),
        }
    };
    let q = expand(
        q.into_iter().map(i64::from).collect(),
        "attention.head_count",
    )?;
    let kv = expand(
        kv.into_iter().map(i64::from).collect(),
        "attention.head_count_kv",
    )?;
    let ffn = expand(ffn, "feed_forward_length")?;
    if let Some(l) = (0..n).find(|&l| q[l] % kv[l] != 0) {
        return Err(gguf_err(
            path,
            format!(
                "layer {l}: metadata `{}` ({}) does not divide `{}` ({})",
                key("attention.head_count_kv"),
                kv[l],
                key("attention.head_count"),
                q[l]
            ),
        ));
    }
    let hd = config["head_dim"].as_i64().ok_or_else(|| {
        gguf_err(
            path,
            format!("metadata `{}` is missing", key("attention.key_length")),
        )
    })?;
    for l in 0..blocks {
        let p = format!("transformer.layers.{l}.ffn");
        let (Some(gate), Some(up)) = (
            tensors.remove(&format!("{p}.gguf_gate.weight")),
            tensors.remove(&format!("{p}.gguf_up.weight")),
        ) else {
            return Err(gguf_err(
                path,
                format!("GGUF tensors blk.{l}.ffn_gate / ffn_up: OpenELM needs both"),
            ));
        };
        tensors.insert(
            format!("{p}.proj_1.weight"),
            ops::concatenate(&[&gate, &up], 0, None)?,
        );
    }
    let eps = config["rms_norm_eps"].clone();
    let theta = config["rope_theta"].clone();
    let vocab = config["vocab_size"].clone();
    let tied = !tensors.contains_key("lm_head.weight");
    let norms = tensors.contains_key("transformer.layers.0.attn.q_norm.weight");
    *config = json!({
        "model_type": "openelm",
        "head_dim": hd,
        "num_transformer_layers": blocks,
        "model_dim": hidden,
        "vocab_size": vocab,
        "ffn_dim_divisor": 1,
        "num_query_heads": q,
        "num_kv_heads": kv,
        "ffn_multipliers": ffn.iter().map(|&f| f as f64 / f64::from(hidden)).collect::<Vec<_>>(),
        "ffn_with_glu": true,
        "normalize_qk_projections": norms,
        "share_input_output_layers": tied,
        "rms_norm_eps": eps,
        "rope_freq_constant": theta,
    });
    Ok(())
}

/// Muse Glimmer (`muse-glimmer`): the four centred layer norms' `1 +` taken off (f32, as
/// mlx-lm adds it back); the synthesized q / k norms read back into `qk_scale_factor` (every
/// `attn_q_norm` one value, every `attn_k_norm` ones) and dropped; `logit_scale` as
/// `output_multiplier`, the soft-capping, the window and layer kinds; the sliding layers' rope
/// base (`rope.freq_base_swa`, else the base) as mlx-lm's one, the full layers without rope;
/// llama.cpp's fixed post-norm eps (1e-8).
fn muse_glimmer_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
    );
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    let need = |k: &str| -> Result<f64> {
        meta_f64(meta, &key(k))
            .filter(|v| v.is_finite() && *v > 0.0)
            .ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `{}` is missing or not a number > 0", key(k)),
                )
            })
    };
    let mut qk_scale: Option<f32> = None;
    let names: Vec<String> = tensors.keys().cloned().collect();
    for name in names {
        if name.contains(".self_attn.gguf_q_norm.") || name.contains(".self_attn.gguf_k_norm.") {
            let Some(a) = tensors.remove(&name) else {
                continue;
            };
            let v = a
                .astype(Dtype::Float32)
                .and_then(|b| b.reshape(&[-1]))
                .and_then(|b| b.to_vec::<f32>())
                .map_err(|e| gguf_err(path, format!("{name}: {e}")))?;
            let first = v.first().copied().unwrap_or(f32::NAN);
            let uniform = v.iter().all(|&x| x == first);
            let ok = if name.contains("gguf_k_norm") {
                uniform && first == 1.0
            } else {
                let same = qk_scale.is_none_or(|s| s == first);
                qk_scale = Some(first);
                uniform && same && first.is_finite()
            };
            if !ok {
                return Err(gguf_err(
                    path,
                    format!(
                        "{name}: Muse Glimmer's q / k norms are weightless (`attn_k_norm` all ones, \
                         every `attn_q_norm` one qk_scale_factor), which mlx-lm's muse_glimmer \
                         assumes"
                    ),
                ));
            }
            continue;
        }
        if [
            ".input_layernorm.weight",
            ".post_attention_layernorm.weight",
            ".pre_feedforward_layernorm.weight",
            ".post_feedforward_layernorm.weight",
        ]
        .iter()
        .any(|s| name.ends_with(s))
        {
            if let Some(a) = tensors.get_mut(&name) {
                *a = (&*a - 1.0f32)?;
            }
        }
    }
    let qk_scale = qk_scale.ok_or_else(|| {
        gguf_err(
            path,
            "GGUF tensor blk.0.attn_q_norm.weight is missing (it carries qk_scale_factor)",
        )
    })?;
    config["qk_scale_factor"] = Value::from(f64::from(qk_scale));
    config["output_multiplier"] = Value::from(need("logit_scale")?);
    config["final_logit_softcapping"] = Value::from(need("final_logit_softcapping")?);
    config["sliding_window"] = Value::from(
        meta_count(meta, path, &key("attention.sliding_window"))?.ok_or_else(|| {
            gguf_err(
                path,
                format!("metadata `{}` is missing", key("attention.sliding_window")),
            )
        })?,
    );
    config["layer_types"] = json!(sliding_kinds(meta, path, key, blocks)?);
    if let Some(t) = positive_f64(meta, path, &key("rope.freq_base_swa"))? {
        config["rope_theta"] = Value::from(t);
    }
    config["post_norm_eps"] = Value::from(1e-8);
    if config.get("head_dim").is_none() {
        return Err(gguf_err(
            path,
            format!("metadata `{}` is missing", key("attention.key_length")),
        ));
    }
    Ok(())
}

/// Spark 2.5 (`spark2_5`): the layer kinds from the per-layer sliding flags, the window, and
/// each kind's `rope_parameters` (base, rotated share of the head); biases from the tensors.
fn spark2_5_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks) =
        (&mut *cx.config, &*cx.tensors, cx.path, cx.meta, cx.blocks);
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    let missing = |k: &str| gguf_err(path, format!("metadata `{}` is missing", key(k)));
    config["layer_types"] = json!(sliding_kinds(meta, path, key, blocks)?);
    config["sliding_window"] = Value::from(
        meta_count(meta, path, &key("attention.sliding_window"))?
            .ok_or_else(|| missing("attention.sliding_window"))?,
    );
    let hd = config["head_dim"]
        .as_f64()
        .ok_or_else(|| missing("attention.key_length"))?;
    let theta = config["rope_theta"].clone();
    let swa_theta = match positive_f64(meta, path, &key("rope.freq_base_swa"))? {
        Some(t) => Value::from(t),
        None => theta.clone(),
    };
    let share = |k: &str| -> Result<f64> {
        Ok(meta_count(meta, path, &key(k))?.map_or(1.0, |d| f64::from(d) / hd))
    };
    config["rope_parameters"] = json!({
        "full_attention": {"rope_theta": theta, "partial_rotary_factor": share("rope.dimension_count")?},
        "sliding_attention": {"rope_theta": swa_theta, "partial_rotary_factor": share("rope.dimension_count_swa")?},
    });
    let has = |t: &str| tensors.contains_key(&format!("model.layers.0.{t}"));
    config["attention_bias"] = Value::from(has("self_attn.q_k_v_proj.bias"));
    config["mlp_bias"] = Value::from(has("mlp.down_proj.bias"));
    Ok(())
}

/// OLMo (`olmo`): mlx-lm's AI2 arguments and fused projections (`att_proj` = [q | k | v],
/// `ff_proj` = [up | gate]); mlx-lm's fixed LayerNorm eps (1e-5), full heads and no clamp are
/// checked.
fn olmo_config(cx: &mut Cx) -> Result<()> {
    if let Some(k) = cx
        .ggml
        .keys()
        .find(|k| k.contains("_proj.") || k.contains(".gguf_"))
    {
        return Err(gguf_err(
            cx.path,
            format!("{k}: OLMo's fused projections are read dequantized only"),
        ));
    }
    let (config, tensors, path, meta, blocks, heads, kv_heads, ffn) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
        cx.heads,
        cx.kv_heads,
        cx.ffn,
    );
    let k = cx.k;
    let key: &dyn Fn(&str) -> String = &move |s: &str| k.key(s);
    if meta.contains_key(&key("attention.clamp_kqv")) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}`: mlx-lm's olmo does not clamp q, k and v",
                key("attention.clamp_kqv")
            ),
        ));
    }
    if kv_heads != heads {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {kv_heads}: mlx-lm's olmo gives each of the {heads} heads its \
                 keys and values",
                key("attention.head_count_kv")
            ),
        ));
    }
    if config["layer_norm_eps"].as_f64().map(|e| e as f32) != Some(1e-5) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is {}: mlx-lm's olmo fixes it at 1e-5",
                key("attention.layer_norm_epsilon"),
                config["layer_norm_eps"]
            ),
        ));
    }
    for l in 0..blocks {
        let p = format!("model.transformer.blocks.{l}");
        for (fused, parts) in [
            (
                "att_proj",
                ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"].as_slice(),
            ),
            ("ff_proj", ["gguf_up", "gguf_gate"].as_slice()),
        ] {
            let mut got = Vec::with_capacity(parts.len());
            for part in parts {
                let name = format!("{p}.{part}.weight");
                got.push(tensors.remove(&name).ok_or_else(|| {
                    gguf_err(
                        path,
                        format!("layer {l}: `{part}` is missing (OLMo's {fused} needs it)"),
                    )
                })?);
            }
            let refs: Vec<&Array> = got.iter().collect();
            let joined = ops::concatenate(&refs, 0, None)
                .map_err(|e| gguf_err(path, format!("layer {l}: joining {fused}: {e}")))?;
            tensors.insert(format!("{p}.{fused}.weight"), joined);
        }
    }
    if let Some(k) = tensors.keys().find(|k| k.ends_with(".bias")) {
        return Err(gguf_err(path, format!("{k}: mlx-lm's olmo has no biases")));
    }
    let tied = !tensors.contains_key("model.transformer.ff_out.weight");
    let vocab = config["vocab_size"].clone();
    *config = json!({
        "model_type": "olmo",
        "d_model": config["hidden_size"],
        "n_layers": blocks,
        "mlp_hidden_size": 2 * ffn,
        "n_heads": heads,
        "vocab_size": vocab,
        "embedding_size": vocab,
        "rope_theta": config["rope_theta"],
        "weight_tying": tied,
    });
    Ok(())
}

/// StarCoder (`starcoder`): mlx-lm's gpt_bigcode arguments; multi-query where the file has one
/// KV head (else every head has its own, `multi_query` false); positions from
/// `position_embd`'s rows; biases from the tensors.
#[allow(clippy::too_many_arguments)]
fn starcoder_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, blocks, hidden, heads, kv_heads, ffn) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.blocks,
        cx.hidden,
        cx.heads,
        cx.kv_heads,
        cx.ffn,
    );
    let multi_query = match kv_heads {
        1 => true,
        k if k == heads => false,
        k => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `starcoder.attention.head_count_kv` = {k}: mlx-lm's gpt_bigcode \
                     takes 1 (multi-query) or the head count ({heads})"
                ),
            ))
        }
    };
    let positions = tensors
        .get("transformer.wpe.weight")
        .map(|w| w.shape()[0])
        .ok_or_else(|| gguf_err(path, "GGUF tensor position_embd.weight is missing"))?;
    let has = |k: &str| tensors.contains_key(k);
    config["n_embd"] = Value::from(hidden);
    config["n_head"] = Value::from(heads);
    config["n_layer"] = Value::from(blocks);
    config["n_inner"] = Value::from(ffn);
    config["n_positions"] = Value::from(positions);
    config["multi_query"] = Value::from(multi_query);
    config["attention_bias"] = Value::from(has("transformer.h.0.attn.c_attn.bias"));
    config["mlp_bias"] = Value::from(has("transformer.h.0.mlp.c_fc.bias"));
    Ok(())
}

/// GPT-NeoX (`gptneox`): mlx-lm's gpt_neox arguments (`rotary_pct` from `rope.dimension_count`,
/// the base from `rope.freq_base` or 10000, `use_parallel_residual` as the file says, else
/// true); the converter's `attn_qkv` (q rows, then k, then v) interleaved per head again
/// (per head: q, k, v), weight, bias and a quantized tensor's scales and biases alike.
fn gptneox_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks, hidden, heads) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
        cx.hidden,
        cx.heads,
    );
    let key = |k: &str| format!("gptneox.{k}");
    let hd = head_size(path, &key, hidden, heads)?;
    let rot = rotary_dims(meta, path, &key("rope.dimension_count"), hd, hd)?;
    if let Some(c) = config.as_object_mut() {
        c.remove("head_dim");
    }
    config["rotary_pct"] = Value::from(f64::from(rot) / f64::from(hd));
    config["rotary_emb_base"] = config["rope_theta"].clone();
    config["use_parallel_residual"] =
        Value::from(meta_bool(meta, path, &key("use_parallel_residual"))?.unwrap_or(true));
    for l in 0..blocks {
        for suffix in ["weight", "bias", "scales", "biases"] {
            let name = format!("model.h.{l}.attention.gguf_qkv.{suffix}");
            let Some(qkv) = tensors.remove(&name) else {
                continue;
            };
            let shape = qkv.shape();
            if shape[0] != 3 * hidden {
                return Err(gguf_err(
                    path,
                    format!(
                        "GGUF tensor blk.{l}.attn_qkv.{suffix} has {} rows, not 3 x {hidden}",
                        shape[0]
                    ),
                ));
            }
            let mut grouped = vec![3, heads, hd];
            grouped.extend_from_slice(&shape[1..]);
            let a = qkv.reshape(&grouped)?;
            let a = ops::swapaxes(&a, 0, 1, None)?.reshape(&shape)?;
            tensors.insert(format!("model.h.{l}.attention.query_key_value.{suffix}"), a);
        }
    }
    Ok(())
}

/// MiniCPM (`minicpm`): mlx-lm's `scale_emb` (`embedding_scale`), `scale_depth`
/// (`residual_scale` times the square root of the layer count) and `dim_model_base` (hidden /
/// `logit_scale`, an integer where it is one): mlx-lm recomputes the residual and logit scales
/// from them in Python floats, which come back to the file's f32 values.
fn minicpm_config(cx: &mut Cx) -> Result<()> {
    let (config, path, meta, blocks, hidden) =
        (&mut *cx.config, cx.path, cx.meta, cx.blocks, cx.hidden);
    let need = |k: &str| -> Result<f64> {
        let key = format!("minicpm.{k}");
        match meta_f64(meta, &key) {
            Some(v) if v.is_finite() && v != 0.0 => Ok(v),
            Some(v) => Err(gguf_err(path, format!("metadata `{key}` is {v}"))),
            None => Err(gguf_err(path, format!("metadata `{key}` is missing"))),
        }
    };
    config["scale_emb"] = Value::from(need("embedding_scale")?);
    config["scale_depth"] = Value::from(need("residual_scale")? * f64::from(blocks).sqrt());
    let base = f64::from(hidden) / need("logit_scale")?;
    config["dim_model_base"] = if base.fract() == 0.0 && base.abs() < 1e9 {
        Value::from(base as i64)
    } else {
        Value::from(base)
    };
    Ok(())
}

/// Hunyuan dense (`hunyuan-dense`): mlx-lm's hunyuan_v1_dense with the file's rope base, which
/// HunYuanModel wrote already scaled by its NTK alpha (so no `rope_scaling`: alpha 1 keeps the
/// base); a scaling other than "none" is refused. The head size from `attention.key_length`,
/// q / k norms and biases from the tensors.
fn hunyuan_dense_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, hidden, heads) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.meta,
        cx.hidden,
        cx.heads,
    );
    let key = |k: &str| format!("hunyuan-dense.{k}");
    let hd = meta_count(meta, path, &key("attention.key_length"))?.unwrap_or(hidden / heads.max(1));
    config["head_dim"] = Value::from(hd);
    match meta_str(meta, &key("rope.scaling.type")) {
        None | Some("none") => {}
        Some(other) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {other:?}: Hunyuan's files carry the NTK-alpha base \
                     already scaled, with scaling \"none\"",
                    key("rope.scaling.type")
                ),
            ))
        }
    }
    let has = |k: &str| tensors.contains_key(k);
    config["use_qk_norm"] = Value::from(has("model.layers.0.self_attn.query_layernorm.weight"));
    config["attention_bias"] = Value::from(has("model.layers.0.self_attn.q_proj.bias"));
    Ok(())
}

/// Apertus (`apertus`): each layer's xIELU parameters from the per-layer `xielu.alpha_n`,
/// `xielu.alpha_p`, `xielu.beta` and `xielu.eps` arrays (the converter's `.item()` of each
/// parameter) back into mlx-lm's `mlp.act_fn.*` scalars; biases and q / k norms from the tensors.
fn apertus_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
    );
    for name in ["alpha_n", "alpha_p", "beta", "eps"] {
        let key = format!("apertus.xielu.{name}");
        let values: Vec<f32> = match meta.get(&key) {
            Some(GgufValue::Array(a)) if a.ndim() == 1 && a.size() == blocks as usize => a
                .astype(Dtype::Float32)
                .and_then(|b| b.to_vec::<f32>())
                .map_err(|e| gguf_err(path, format!("metadata `{key}`: {e}")))?,
            None => return Err(gguf_err(path, format!("metadata `{key}` is missing"))),
            Some(_) => {
                return Err(gguf_err(
                    path,
                    format!("metadata `{key}` must give one value for each of the {blocks} layers"),
                ))
            }
        };
        for (l, v) in values.into_iter().enumerate() {
            tensors.insert(
                format!("model.layers.{l}.mlp.act_fn.{name}"),
                Array::scalar(v)?,
            );
        }
    }
    let has = |k: &str| tensors.contains_key(k);
    config["mlp_bias"] = Value::from(has("model.layers.0.mlp.up_proj.bias"));
    config["attention_bias"] = Value::from(has("model.layers.0.self_attn.q_proj.bias"));
    config["qk_norm"] = Value::from(has("model.layers.0.self_attn.q_norm.weight"));
    config["post_norm"] = Value::from(false);
    Ok(())
}

/// InternLM2 (`internlm2`): llama.cpp's q, k and v (Q / K rows permuted) back into mlx-lm's
/// fused `attention.wqkv`, per KV group its queries, then its key and value head (the rows of
/// a quantized tensor's scales and biases with them). llama.cpp writes no biases (`bias` false).
fn internlm2_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, blocks, heads, kv_heads) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.blocks,
        cx.heads,
        cx.kv_heads,
    );
    if heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `internlm2.attention.head_count` = {heads} is not a multiple of \
                 `internlm2.attention.head_count_kv` = {kv_heads}"
            ),
        ));
    }
    config["bias"] = Value::from(false);
    // mlx-lm's head is `output`, not `lm_head`: tied when the file has none.
    config["tie_word_embeddings"] = Value::from(!tensors.keys().any(|k| k.starts_with("output.")));
    for l in 0..blocks {
        let p = format!("model.layers.{l}.attention");
        for suffix in ["weight", "scales", "biases", "bias"] {
            let names = ["q", "k", "v"].map(|w| format!("{p}.gguf_{w}.{suffix}"));
            if names.iter().all(|n| !tensors.contains_key(n)) {
                continue;
            }
            if suffix == "bias" {
                return Err(gguf_err(
                    path,
                    format!("GGUF tensor blk.{l}.attn_q.bias: InternLM2 files have no biases"),
                ));
            }
            let mut parts = Vec::with_capacity(3);
            for (n, w) in names.iter().zip(["q", "k", "v"]) {
                let Some(a) = tensors.remove(n) else {
                    return Err(gguf_err(
                        path,
                        format!(
                            "GGUF tensor blk.{l}.attn_{w}.{suffix} is missing (InternLM2's q, k \
                             and v come together)"
                        ),
                    ));
                };
                parts.push(a);
            }
            let key = |k: &str| format!("internlm2.attention.{k}");
            let q = unpermute(&parts[0], heads, &names[0], &key("head_count"))?;
            let k = unpermute(&parts[1], kv_heads, &names[1], &key("head_count_kv"))?;
            let v = &parts[2];
            let cols = q.shape()[1];
            let hd = q.shape()[0] / heads;
            if k.shape() != [kv_heads * hd, cols] || v.shape() != [kv_heads * hd, cols] {
                return Err(gguf_err(
                    path,
                    format!(
                        "layer {l}: k {:?} and v {:?} do not match q {:?} for {kv_heads} key \
                         heads",
                        k.shape(),
                        v.shape(),
                        q.shape()
                    ),
                ));
            }
            let g = kv_heads;
            let q = q.reshape(&[g, heads / g, hd, cols])?;
            let k = k.reshape(&[g, 1, hd, cols])?;
            let v = v.reshape(&[g, 1, hd, cols])?;
            let qkv =
                ops::concatenate(&[&q, &k, &v], 1, None)?.reshape(&[(heads + 2 * g) * hd, cols])?;
            tensors.insert(format!("{p}.wqkv.{suffix}"), qkv);
        }
    }
    Ok(())
}

/// StableLM (`stablelm`): mlx-lm's stablelm arguments. The rotated share of the head from
/// `rope.dimension_count` (the whole head when absent, as llama.cpp); qkv bias and the
/// per-head q / k LayerNorms from the tensors, those norms unstacked into mlx-lm's
/// `norms.<head>`; the parallel residual block where the layers have no `ffn_norm` (what
/// llama.cpp's graph goes by; `use_parallel_residual` must agree). llama.cpp computes the
/// output from the embedding when a file has no `output`, which mlx-lm's stablelm always has.
fn stablelm_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, heads, kv_heads) = (
        &mut *cx.config,
        &mut *cx.tensors,
        cx.path,
        cx.meta,
        cx.heads,
        cx.kv_heads,
    );
    let key = |k: &str| format!("stablelm.{k}");
    let hidden = config["hidden_size"].as_i64().unwrap_or(0) as i32;
    let hd = head_size(path, &key, hidden, heads)?;
    if let Some(c) = config.as_object_mut() {
        c.remove("head_dim");
    }
    let rot = meta_count(meta, path, &key("rope.dimension_count"))?.unwrap_or(hd);
    if rot <= 0 || rot > hd || rot % 2 != 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {rot} must be even and in 2..={hd} (the head size)",
                key("rope.dimension_count")
            ),
        ));
    }
    config["partial_rotary_factor"] = Value::from(f64::from(rot) / f64::from(hd));
    config["use_qkv_bias"] =
        Value::from(tensors.contains_key("model.layers.0.self_attn.q_proj.bias"));
    let parallel = !tensors.contains_key("model.layers.0.post_attention_layernorm.weight");
    if let Some(p) = meta_bool(meta, path, &key("use_parallel_residual"))? {
        if p != parallel {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {p}, but the layers {} `ffn_norm`",
                    key("use_parallel_residual"),
                    if parallel { "have no" } else { "have an" }
                ),
            ));
        }
    }
    config["use_parallel_residual"] = Value::from(parallel);
    let mut qk = false;
    for (which, n) in [("q", heads), ("k", kv_heads)] {
        let layers: Vec<String> = tensors
            .keys()
            .filter(|k| k.ends_with(&format!(".self_attn.{which}_layernorm.weight")))
            .cloned()
            .collect();
        for name in layers {
            let Some(w) = tensors.remove(&name) else {
                continue;
            };
            if w.shape() != [n, hd] {
                return Err(gguf_err(
                    path,
                    format!(
                        "tensor for {name} has shape {:?}, not ({n}, {hd}) (heads, head size)",
                        w.shape()
                    ),
                ));
            }
            let stem = name.trim_end_matches(".weight");
            for h in 0..n {
                let row = w.slice(&[h, 0], &[h + 1, hd], &[1, 1])?.reshape(&[hd])?;
                tensors.insert(format!("{stem}.norms.{h}.weight"), row);
            }
            qk = true;
        }
    }
    config["qk_layernorm"] = Value::from(qk);
    if !tensors.contains_key("lm_head.weight") {
        if let Some(e) = tensors.get("model.embed_tokens.weight") {
            let e = e.clone();
            tensors.insert("lm_head.weight".into(), e);
        }
    }
    Ok(())
}

/// llama.cpp's fused `ffn_gate_up_exps` `(experts, 2 * ffn, hidden)` (and its quantization
/// scales and biases, row by row alike) split in halves along the rows into mlx-lm's
/// `switch_mlp.gate_proj` and `switch_mlp.up_proj`, gate first (mistral4.py's sanitize).
fn split_gate_up(tensors: &mut BTreeMap<String, Array>) -> Result<()> {
    let fused: Vec<String> = tensors
        .keys()
        .filter(|k| k.contains(".switch_mlp.gate_up_proj."))
        .cloned()
        .collect();
    for k in fused {
        let Some(a) = tensors.remove(&k) else {
            continue;
        };
        let rows = if a.ndim() == 3 { a.shape()[1] } else { -1 };
        if rows <= 0 || rows % 2 != 0 {
            return Err(ModelError::Weights(vec![format!(
                "GGUF tensor {k}: shape {:?} is not (experts, 2 * ffn, hidden)",
                a.shape()
            )]));
        }
        let parts = ops::split_equal(&a, 2, 1, None)?;
        let [gate, up] = <[Array; 2]>::try_from(parts)
            .map_err(|_| ModelError::Weights(vec![format!("GGUF tensor {k}: split failed")]))?;
        tensors.insert(k.replace(".gate_up_proj.", ".gate_proj."), gate);
        tensors.insert(k.replace(".gate_up_proj.", ".up_proj."), up);
    }
    Ok(())
}

/// MiMo V2 Flash as MimoV2Model writes it, for mlx-lm's `mimo_v2_flash`: the per-layer pattern
/// (`attention.sliding_window_pattern`, 1 = sliding) as `hybrid_layer_pattern`, the per-layer KV
/// heads (one count per kind of layer), the head count and sizes (`key_length`,
/// `value_length`), which the converter requires the sliding layers to share, the rope width
/// as `partial_rotary_factor`, the rope bases, the window, the value scale, the MoE layers and
/// each kind's sinks from the tensors, and the router llama.cpp runs: sigmoid with the
/// correction bias, the groups, weights always normalized, scaled only by
/// `expert_weights_scale` (unscaled when absent). The lists' MTP entries are skipped.
fn mimo2_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, heads) =
        (&mut *cx.config, &*cx.tensors, cx.path, cx.meta, cx.heads);
    let arch = "mimo2";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let blocks = config["num_hidden_layers"].as_i64().unwrap_or(0) as usize;
    let list = |k: &str| -> Result<Vec<f64>> {
        layer_list(meta, path, &key(k), blocks)?
            .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", key(k))))
    };
    let swa: Vec<bool> = list("attention.sliding_window_pattern")?
        .iter()
        .map(|&v| v != 0.0)
        .collect();
    if !swa.contains(&true) || !swa.contains(&false) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}`: mlx-lm's mimo_v2_flash needs both sliding and full layers",
                key("attention.sliding_window_pattern")
            ),
        ));
    }
    let kvs = list("attention.head_count_kv")?;
    let mut kv: [Option<f64>; 2] = [None, None];
    for (l, (&k, &s)) in kvs.iter().zip(&swa).enumerate() {
        let slot = &mut kv[usize::from(s)];
        if k < 1.0 || f64::from(heads) % k != 0.0 || slot.is_some_and(|v| v != k) {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}`: layer {l} has {k} KV heads; mlx-lm's mimo_v2_flash needs one \
                    divisor of the {heads} heads per kind of layer (full, sliding)",
                    key("attention.head_count_kv")
                ),
            ));
        }
        *slot = Some(k);
    }
    let head_dim = need("attention.key_length")?;
    let v_head_dim = need("attention.value_length")?;
    let rope = need("rope.dimension_count")?;
    if rope > head_dim {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {rope} exceeds the head size {head_dim}",
                key("rope.dimension_count")
            ),
        ));
    }
    // mlx-lm rotates int(partial_rotary_factor * head_dim) dimensions.
    let mut factor = f64::from(rope) / f64::from(head_dim);
    if (factor * f64::from(head_dim)) as i32 != rope {
        factor = (f64::from(rope) + 0.5) / f64::from(head_dim);
    }
    if let Some(g) = meta_count(meta, path, &key("expert_gating_func"))? {
        if g != 2 {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {g}: llama.cpp's mimo2 routes by sigmoid (2)",
                    key("expert_gating_func")
                ),
            ));
        }
    }
    if meta_bool(meta, path, &key("expert_weights_norm"))? == Some(false) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is false: llama.cpp's mimo2 always normalizes the routed weights",
                key("expert_weights_norm")
            ),
        ));
    }
    let groups = meta_count(meta, path, &key("expert_group_count"))?.unwrap_or(1);
    let groups_used = if groups > 1 {
        need("expert_group_used_count")?
    } else {
        meta_count(meta, path, &key("expert_group_used_count"))?.unwrap_or(1)
    };
    let has = |l: usize, t: &str| tensors.contains_key(&format!("model.layers.{l}.{t}"));
    let sinks = |sliding: bool| {
        (0..blocks).any(|l| swa[l] == sliding && has(l, "self_attn.attention_sink_bias"))
    };
    let base = meta_f64(meta, &key("rope.freq_base")).unwrap_or(10000.0);
    let moe_layers: Vec<i32> = (0..blocks)
        .map(|l| i32::from(has(l, "mlp.gate.weight")))
        .collect();
    let o = json!({
        "num_key_value_heads": kv[0].unwrap_or(1.0) as i64,
        "swa_num_key_value_heads": kv[1].unwrap_or(1.0) as i64,
        "num_attention_heads": heads,
        "swa_num_attention_heads": heads,
        "head_dim": head_dim,
        "swa_head_dim": head_dim,
        "v_head_dim": v_head_dim,
        "swa_v_head_dim": v_head_dim,
        "partial_rotary_factor": factor,
        "rope_theta": base,
        "swa_rope_theta": meta_f64(meta, &key("rope.freq_base_swa")).unwrap_or(base),
        "sliding_window_size": need("attention.sliding_window")?,
        "hybrid_layer_pattern": swa.iter().map(|&s| i32::from(s)).collect::<Vec<_>>(),
        "moe_layer_freq": moe_layers,
        "add_swa_attention_sink_bias": sinks(true),
        "add_full_attention_sink_bias": sinks(false),
        "attention_value_scale": meta_f64(meta, &key("attention.value_scale")),
        "n_routed_experts": need("expert_count")?,
        "num_experts_per_tok": need("expert_used_count")?,
        "moe_intermediate_size": need("expert_feed_forward_length")?,
        "n_shared_experts": null,
        "routed_scaling_factor": meta_f64(meta, &key("expert_weights_scale")),
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": true,
        "n_group": groups,
        "topk_group": groups_used,
    });
    if let (Some(c), Some(o)) = (config.as_object_mut(), o.as_object()) {
        c.extend(o.clone());
    }
    Ok(())
}

/// Laguna as LagunaModel writes it, for mlx-lm's `laguna`: the per-layer head counts, the
/// layer kinds (`attention.sliding_window_pattern`, else llama.cpp's full layer every 4th from
/// the first; all full without a window), `rope_parameters` per kind (the full layers' base,
/// rope width and YaRN from `rope.scaling.*`; the sliding layers' `freq_base_swa` and
/// `dimension_count_swa`, plain), the dense first blocks as `mlp_layer_types`, the expert keys
/// and the router llama.cpp runs (sigmoid or sqrt-softplus, no soft cap, weights always
/// normalized, scaled by `expert_weights_scale`), the per-head gate and biases from the
/// tensors. Refused: a per-element gate (mlx-lm's laguna gates per head), YaRN's attention /
/// extrapolation factors (mlx-lm's YaRN has neither), other rope scaling, another gating,
/// a shared-expert count other than 1.
fn laguna_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta) = (&mut *cx.config, &*cx.tensors, cx.path, cx.meta);
    let arch = "laguna";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let float = |k: &str| meta_f64(meta, &key(k));
    let blocks = config["num_hidden_layers"].as_i64().unwrap_or(0) as usize;
    let heads: Vec<i64> = match float("attention.head_count") {
        Some(_) => vec![i64::from(need("attention.head_count")?); blocks],
        None => layer_list(meta, path, &key("attention.head_count"), blocks)?
            .ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `{}` is missing", key("attention.head_count")),
                )
            })?
            .into_iter()
            .map(|h| h as i64)
            .collect(),
    };
    let head_dim = need("attention.key_length")?;
    let window = meta_count(meta, path, &key("attention.sliding_window"))?;
    let sliding: Vec<bool> = match (
        window,
        layer_list(meta, path, &key("attention.sliding_window_pattern"), blocks)?,
    ) {
        (None, _) => vec![false; blocks],
        (Some(_), Some(p)) => p.iter().map(|&v| v != 0.0).collect(),
        (Some(_), None) => (0..blocks).map(|l| l % 4 != 0).collect(),
    };
    // mlx-lm rotates int(head_dim * partial_rotary_factor) dimensions.
    let factor = |dims: i32, k: &str| -> Result<f64> {
        if dims < 1 || dims > head_dim {
            return Err(gguf_err(
                path,
                format!("metadata `{}` = {dims} is not in 1..={head_dim}", key(k)),
            ));
        }
        let f = f64::from(dims) / f64::from(head_dim);
        Ok(if (f * f64::from(head_dim)) as i32 == dims {
            f
        } else {
            (f64::from(dims) + 0.5) / f64::from(head_dim)
        })
    };
    let full_dims = meta_count(meta, path, &key("rope.dimension_count"))?.unwrap_or(head_dim);
    let swa_dims = meta_count(meta, path, &key("rope.dimension_count_swa"))?.unwrap_or(full_dims);
    let base = float("rope.freq_base").unwrap_or(10000.0);
    let mut full = json!({
        "rope_theta": base,
        "partial_rotary_factor": factor(full_dims, "rope.dimension_count")?,
    });
    for k in [
        "rope.scaling.yarn_attn_factor",
        "rope.scaling.yarn_ext_factor",
    ] {
        if let Some(v) = float(k) {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {v}: mlx-lm's YaRN rope has no such factor",
                    key(k)
                ),
            ));
        }
    }
    match meta_str(meta, &key("rope.scaling.type")) {
        None | Some("none") => {}
        Some("yarn") => {
            let f = float("rope.scaling.factor").ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `{}` is missing", key("rope.scaling.factor")),
                )
            })?;
            full["rope_type"] = Value::from("yarn");
            full["factor"] = Value::from(f);
            full["original_max_position_embeddings"] =
                Value::from(need("rope.scaling.original_context_length")?);
            for (k, field) in [
                ("rope.scaling.yarn_beta_fast", "beta_fast"),
                ("rope.scaling.yarn_beta_slow", "beta_slow"),
            ] {
                if let Some(v) = float(k) {
                    full[field] = Value::from(v);
                }
            }
        }
        Some(t) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is `{t}`; laguna maps only yarn",
                    key("rope.scaling.type")
                ),
            ))
        }
    }
    let swa = json!({
        "rope_theta": float("rope.freq_base_swa").unwrap_or(base),
        "partial_rotary_factor": factor(swa_dims, "rope.dimension_count_swa")?,
    });
    let score = match meta_count(meta, path, &key("expert_gating_func"))? {
        None | Some(2) => "sigmoid",
        Some(4) => "sqrtsoftplus",
        Some(g) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {g}: mlx-lm's laguna routes by sigmoid (2) \
                or sqrt-softplus (4)",
                    key("expert_gating_func")
                ),
            ))
        }
    };
    if meta_bool(meta, path, &key("expert_weights_norm"))? == Some(false) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is false: mlx-lm's laguna always normalizes the routed weights",
                key("expert_weights_norm")
            ),
        ));
    }
    if let Some(n) = meta_count(meta, path, &key("expert_shared_count"))? {
        if n != 1 {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {n}: laguna has one shared expert",
                    key("expert_shared_count")
                ),
            ));
        }
    }
    let dense = meta_count(meta, path, &key("leading_dense_block_count")).and_then(|v| {
        v.ok_or_else(|| {
            gguf_err(
                path,
                format!("metadata `{}` is missing", key("leading_dense_block_count")),
            )
        })
    })? as usize;
    for (l, &h) in heads.iter().enumerate() {
        if let Some(g) = tensors.get(&format!("model.layers.{l}.self_attn.g_proj.weight")) {
            let rows = g.shape().first().copied().unwrap_or(0);
            if i64::from(rows) != h {
                return Err(gguf_err(
                    path,
                    format!(
                        "tensor `blk.{l}.attn_gate.weight` has {rows} rows for {} heads: a \
                        per-element gate, which mlx-lm's laguna (one gate per head) lacks",
                        h
                    ),
                ));
            }
        }
    }
    let has = |t: &str| tensors.keys().any(|k| k.ends_with(t));
    let layer_types: Vec<&str> = sliding
        .iter()
        .map(|&s| {
            if s {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    let mlp_types: Vec<&str> = (0..blocks)
        .map(|l| if l < dense { "dense" } else { "sparse" })
        .collect();
    let o = json!({
        "num_attention_heads": heads.first().copied().unwrap_or(1),
        "num_attention_heads_per_layer": heads,
        "head_dim": head_dim,
        "sliding_window": window,
        "layer_types": layer_types,
        "mlp_layer_types": mlp_types,
        "rope_parameters": {"full_attention": full, "sliding_attention": swa},
        "gating": has(".self_attn.g_proj.weight"),
        "qkv_bias": has(".self_attn.q_proj.bias"),
        "attention_bias": has(".self_attn.o_proj.bias"),
        "num_experts": need("expert_count")?,
        "num_experts_per_tok": need("expert_used_count")?,
        "moe_intermediate_size": need("expert_feed_forward_length")?,
        "shared_expert_intermediate_size": need("expert_shared_feed_forward_length")?,
        "moe_routed_scaling_factor": float("expert_weights_scale").unwrap_or(1.0),
        "moe_router_score_func": score,
        "moe_router_logit_softcapping": 0.0,
    });
    if let (Some(c), Some(o)) = (config.as_object_mut(), o.as_object()) {
        c.extend(o.clone());
    }
    Ok(())
}

/// Step 3.5 as Step35Model writes it, for mlx-lm's `step3p5`: the per-layer head / KV counts
/// (one pair on the full layers, `num_attention_heads` / `num_attention_groups`, one on the
/// sliding ones, `attention_other_setting`), `layer_types` from
/// `attention.sliding_window_pattern`, the window, the head size (`attention.key_length`), the
/// partial rope the converter requires (half the head on full layers, all of it on sliding
/// ones), per-layer rope bases (`rope.freq_base`, `rope.freq_base_swa`), the expert keys
/// (mlx-lm's defaults differ from llama.cpp's where a key is absent, so scale and norm are
/// required), the MoE layers from the router tensors, the per-layer SwiGLU clamps (0 = none)
/// and the head-wise gate from its tensors. Refused: Llama 3 rope factors (`rope_freqs`) and
/// other rope scaling, another gating function, a file without expert layers.
fn step35_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, rope_tensors) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.meta,
        &*cx.rope_tensors,
    );
    let arch = "step35";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let blocks = config["num_hidden_layers"].as_i64().unwrap_or(0) as usize;
    let list = |k: &str| -> Result<Vec<f64>> {
        layer_list(meta, path, &key(k), blocks)?
            .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", key(k))))
    };
    let swa: Vec<bool> = list("attention.sliding_window_pattern")?
        .iter()
        .map(|&v| v != 0.0)
        .collect();
    let (heads, kvs) = (
        list("attention.head_count")?,
        list("attention.head_count_kv")?,
    );
    // One (heads, kv) pair per kind of layer.
    let mut pairs: [Option<(f64, f64)>; 2] = [None, None];
    for l in 0..blocks {
        let pair = (heads[l], kvs[l]);
        let slot = &mut pairs[usize::from(swa[l])];
        if pair.0 < 1.0 || pair.1 < 1.0 || pair.0 % pair.1 != 0.0 || slot.is_some_and(|p| p != pair)
        {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` / `{}`: layer {l} has {} heads over {} KV heads; mlx-lm's \
                    step3p5 needs one positive multiple per kind of layer (full, sliding)",
                    key("attention.head_count"),
                    key("attention.head_count_kv"),
                    pair.0,
                    pair.1
                ),
            ));
        }
        *slot = Some(pair);
    }
    let Some((full_heads, full_kv)) = pairs[0] else {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` marks every layer sliding; the full layers set mlx-lm's head counts",
                key("attention.sliding_window_pattern")
            ),
        ));
    };
    config["num_attention_heads"] = Value::from(full_heads as i64);
    config["num_attention_groups"] = Value::from(full_kv as i64);
    config["attention_other_setting"] = match pairs[1] {
        Some((h, kv)) => {
            json!({"num_attention_heads": h as i64, "num_attention_groups": kv as i64})
        }
        None => Value::Null,
    };
    config["layer_types"] = swa
        .iter()
        .map(|&s| {
            if s {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    config["sliding_window"] = Value::from(need("attention.sliding_window")?);
    let head_dim = need("attention.key_length")?;
    config["head_dim"] = Value::from(head_dim);
    if let Some(r) = meta_count(meta, path, &key("rope.dimension_count"))? {
        if r != head_dim {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {r}: llama.cpp's step35 rotates the whole head ({head_dim}) \
                    on sliding layers and half of it on full ones",
                    key("rope.dimension_count")
                ),
            ));
        }
    }
    config["partial_rotary_factors"] = swa.iter().map(|&s| if s { 1.0 } else { 0.5 }).collect();
    if rope_tensors.contains_key("rope_freqs.weight") {
        return Err(gguf_err(
            path,
            "tensor `rope_freqs.weight`: Llama 3 rope factors are not mapped for step35",
        ));
    }
    if meta_str(meta, &key("rope.scaling.type")).is_some_and(|t| t != "none") {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}`: rope scaling is not mapped for step35",
                key("rope.scaling.type")
            ),
        ));
    }
    let base = meta_f64(meta, &key("rope.freq_base")).unwrap_or(10000.0);
    if let Some(local) = meta_f64(meta, &key("rope.freq_base_swa")) {
        config["rope_theta"] = swa.iter().map(|&s| if s { local } else { base }).collect();
    }
    if let Some(g) = meta_count(meta, path, &key("expert_gating_func"))? {
        if g != 2 {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {g}: mlx-lm's step3p5 routes by sigmoid (2)",
                    key("expert_gating_func")
                ),
            ));
        }
    }
    config["moe_num_experts"] = Value::from(need("expert_count")?);
    config["moe_top_k"] = Value::from(need("expert_used_count")?);
    config["moe_intermediate_size"] = Value::from(need("expert_feed_forward_length")?);
    config["share_expert_dim"] = Value::from(need("expert_shared_feed_forward_length")?);
    config["moe_router_scaling_factor"] =
        Value::from(meta_f64(meta, &key("expert_weights_scale")).ok_or_else(|| {
            gguf_err(
                path,
                format!("metadata `{}` is missing", key("expert_weights_scale")),
            )
        })?);
    config["norm_expert_weight"] = Value::from(
        meta_bool(meta, path, &key("expert_weights_norm"))?.ok_or_else(|| {
            gguf_err(
                path,
                format!("metadata `{}` is missing", key("expert_weights_norm")),
            )
        })?,
    );
    let moe: Vec<String> = (0..blocks)
        .filter(|l| tensors.contains_key(&format!("model.layers.{l}.mlp.gate.gate.weight")))
        .map(|l| l.to_string())
        .collect();
    if moe.is_empty() {
        return Err(gguf_err(
            path,
            "no expert layer (`ffn_gate_inp`): mlx-lm's step3p5 puts experts on every layer but \
            the first when it is told none",
        ));
    }
    config["moe_layers_enum"] = Value::from(moe.join(","));
    for (k, field) in [
        ("swiglu_clamp_exp", "swiglu_limits"),
        ("swiglu_clamp_shexp", "swiglu_limits_shared"),
    ] {
        if let Some(v) = layer_list(meta, path, &key(k), blocks)? {
            config[field] = v.into_iter().collect();
        }
    }
    config["use_head_wise_attn_gate"] = Value::from(
        tensors
            .keys()
            .any(|k| k.ends_with(".self_attn.g_proj.weight")),
    );
    if let Some(o) = config.as_object_mut() {
        o.remove("num_key_value_heads");
    }
    Ok(())
}

/// `phi3` | `phimoe`.
fn phi3_config(cx: &mut Cx) -> Result<()> {
    let (config, rope_tensors, path, meta, arch, hidden, heads, keys) = (
        &mut *cx.config,
        &mut *cx.rope_tensors,
        cx.path,
        cx.meta,
        cx.arch,
        cx.hidden,
        cx.heads,
        cx.k,
    );
    if let Some(d) = keys.float("rope.dimension_count", false)? {
        let hd = f64::from(hidden / heads);
        if arch == "phi3" {
            config["partial_rotary_factor"] = Value::from(d / hd);
        } else if d != hd {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {d}: a partial rope, which mlx-lm's phimoe lacks",
                    keys.key("rope.dimension_count")
                ),
            ));
        }
    }
    if arch == "phimoe" {
        config["num_local_experts"] = Value::from(keys.count("expert_count")?);
        config["num_experts_per_tok"] = Value::from(keys.count("expert_used_count")?);
    }
    long_rope(config, rope_tensors, path, meta, arch)?;
    Ok(())
}

/// `granite` | `granitemoe`.
fn granite_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, arch, keys) =
        (&mut *cx.config, &*cx.tensors, cx.path, cx.arch, cx.k);
    if arch == "granitemoe" {
        config["num_local_experts"] = Value::from(keys.count("expert_count")?);
        config["num_experts_per_tok"] = Value::from(keys.count("expert_used_count")?);
    }
    let has_bias = |t: &str| tensors.contains_key(&format!("model.layers.0.{t}.bias"));
    config["attention_bias"] = Value::from(has_bias("self_attn.q_proj"));
    config["mlp_bias"] = Value::from(has_bias("mlp.down_proj"));
    for (k, name) in [
        ("attention.scale", "attention_multiplier"),
        ("embedding_scale", "embedding_multiplier"),
        ("residual_scale", "residual_multiplier"),
        ("logit_scale", "logits_scaling"),
    ] {
        let v = keys
            .float(k, false)?
            .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", keys.key(k))))?;
        config[name] = Value::from(v);
    }
    if config.get("max_position_embeddings").is_none() {
        return Err(gguf_err(
            path,
            format!("metadata `{}` is missing", keys.key("context_length")),
        ));
    }
    Ok(())
}

/// `glm4`.
fn glm4_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, hidden, heads, keys) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.meta,
        cx.hidden,
        cx.heads,
        cx.k,
    );
    // `rope.dimension_count` is the rotated part of a head here, not its size.
    let hd = meta_count(meta, path, &keys.key("attention.key_length"))?
        .map_or(i64::from(hidden / heads), i64::from);
    config["head_dim"] = Value::from(hd);
    config["attention_bias"] =
        Value::from(tensors.contains_key("model.layers.0.self_attn.q_proj.bias"));
    // llama.cpp rotates `rope.dimension_count` dims of each head (HF's default: half).
    let rot = keys
        .float("rope.dimension_count", false)?
        .unwrap_or(hd as f64 / 2.0);
    config["partial_rotary_factor"] = Value::from(rot / hd as f64);
    Ok(())
}

/// `mistral3`.
fn mistral3_config(cx: &mut Cx) -> Result<()> {
    let (config, path, meta, keys) = (&mut *cx.config, cx.path, cx.meta, cx.k);
    // rope_parameters from YaRN's keys; `yarn_log_multiplier` is mscale_all_dim here
    // (Ministral3Model writes it as is) and `temperature_scale` Llama 4's beta.
    let need = |k: &str| -> Result<f64> {
        keys.float(k, false)?
            .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", keys.key(k))))
    };
    match meta_str(meta, &keys.key("rope.scaling.type")) {
        Some("yarn") => {}
        other => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {other:?}; Ministral 3 needs yarn",
                    keys.key("rope.scaling.type")
                ),
            ))
        }
    }
    let m = need("rope.scaling.yarn_log_multiplier")?;
    config["rope_parameters"] = json!({
        "rope_type": "yarn",
        "type": "yarn",
        "rope_theta": config["rope_theta"].clone(),
        "factor": need("rope.scaling.factor")?,
        "original_max_position_embeddings":
            keys.count("rope.scaling.original_context_length")?,
        "beta_fast": keys.float("rope.scaling.yarn_beta_fast", false)?.unwrap_or(32.0),
        "beta_slow": keys.float("rope.scaling.yarn_beta_slow", false)?.unwrap_or(1.0),
        "mscale": m,
        "mscale_all_dim": m,
        "llama_4_scaling_beta": keys.float("attention.temperature_scale", true)?
            .ok_or_else(|| gguf_err(
                path,
                format!("metadata `{}` is missing", keys.key("attention.temperature_scale")),
            ))?,
    });
    Ok(())
}

/// `olmo2`.
fn olmo2_config(cx: &mut Cx) -> Result<()> {
    let (config, path, meta, blocks, keys) = (&mut *cx.config, cx.path, cx.meta, cx.blocks, cx.k);
    // OLMo 3 is written as `olmo2` with a sliding window (and its per-layer pattern).
    if let Some(w) = meta_count(meta, path, &keys.key("attention.sliding_window"))? {
        config["model_type"] = Value::from("olmo3");
        config["sliding_window"] = Value::from(w);
        if let Some(GgufValue::Array(a)) = meta.get(&keys.key("attention.sliding_window_pattern")) {
            let flags = a
                .astype(Dtype::Bool)
                .and_then(|b| b.to_vec::<bool>())
                .map_err(|e| {
                    gguf_err(
                        path,
                        format!("metadata `attention.sliding_window_pattern`: {e}"),
                    )
                })?;
            if flags.len() != blocks as usize || !flags.contains(&false) || !flags.contains(&true) {
                return Err(gguf_err(
                    path,
                    format!(
                        "metadata `{}` has {} entries for {blocks} layers; mlx-lm's olmo3 \
                         needs both sliding and full-attention layers",
                        keys.key("attention.sliding_window_pattern"),
                        flags.len()
                    ),
                ));
            }
            let types: Vec<&str> = flags
                .iter()
                .map(|&s| {
                    if s {
                        "sliding_attention"
                    } else {
                        "full_attention"
                    }
                })
                .collect();
            config["layer_types"] = json!(types);
        }
        if meta_str(meta, &keys.key("rope.scaling.type")).is_some_and(|t| t != "none") {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}`: rope scaling is not mapped for OLMo 3",
                    keys.key("rope.scaling.type")
                ),
            ));
        }
    }
    Ok(())
}

/// `exaone4`.
fn exaone4_config(cx: &mut Cx) -> Result<()> {
    let (config, path, meta, blocks, hidden, heads, keys) = (
        &mut *cx.config,
        cx.path,
        cx.meta,
        cx.blocks,
        cx.hidden,
        cx.heads,
        cx.k,
    );
    // mlx-lm's `sliding_window_pattern` is a period of "L" (sliding) / "G" (global)
    // letters: the shortest that repeats the file's per-layer pattern (llama.cpp's
    // default, "LLLG", when the file has a window and no pattern).
    config["rope_scaling"] = Value::Null;
    if config.get("head_dim").is_none() {
        config["head_dim"] = Value::from(hidden / heads);
    }
    match meta_count(meta, path, &keys.key("attention.sliding_window"))? {
        None => {
            config["sliding_window"] = Value::Null;
            config["sliding_window_pattern"] = Value::Null;
        }
        Some(w) => {
            config["sliding_window"] = Value::from(w);
            let flags = match meta.get(&keys.key("attention.sliding_window_pattern")) {
                Some(GgufValue::Array(a)) => a
                    .astype(Dtype::Bool)
                    .and_then(|b| b.to_vec::<bool>())
                    .map_err(|e| {
                        gguf_err(path, format!("metadata `sliding_window_pattern`: {e}"))
                    })?,
                _ => (0..blocks).map(|i| (i + 1) % 4 != 0).collect(),
            };
            let n = flags.len();
            let period = (1..=n)
                .find(|&p| (0..n).all(|i| flags[i] == flags[i % p]))
                .unwrap_or(n);
            let pattern: String = flags[..period]
                .iter()
                .map(|&l| if l { 'L' } else { 'G' })
                .collect();
            if n != blocks as usize || !pattern.contains('L') || !pattern.contains('G') {
                return Err(gguf_err(
                    path,
                    format!(
                        "metadata `{}` ({n} entries for {blocks} layers) needs both \
                         sliding and global layers for mlx-lm's exaone4",
                        keys.key("attention.sliding_window_pattern")
                    ),
                ));
            }
            config["sliding_window_pattern"] = Value::from(pattern);
        }
    }
    if config.get("max_position_embeddings").is_none() {
        return Err(gguf_err(
            path,
            format!("metadata `{}` is missing", keys.key("context_length")),
        ));
    }
    Ok(())
}

/// `cohere2`.
fn cohere2_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, hidden, heads, keys) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.meta,
        cx.hidden,
        cx.heads,
        cx.k,
    );
    let hd = config["head_dim"]
        .as_i64()
        .unwrap_or(i64::from(hidden / heads));
    config["head_dim"] = Value::from(hd);
    if let Some(d) = meta_count(meta, path, &keys.key("rope.dimension_count"))? {
        if i64::from(d) != hd {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {d}: a partial rope, which mlx-lm's cohere2 lacks",
                    keys.key("rope.dimension_count")
                ),
            ));
        }
    }
    if meta_f64(meta, &keys.key("rope.freq_base_swa"))
        .is_some_and(|b| Some(b) != config["rope_theta"].as_f64())
    {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` differs from the global base; mlx-lm's cohere2 has one",
                keys.key("rope.freq_base_swa")
            ),
        ));
    }
    config["logit_scale"] = Value::from(keys.float("logit_scale", false)?.ok_or_else(|| {
        gguf_err(
            path,
            format!("metadata `{}` is missing", keys.key("logit_scale")),
        )
    })?);
    config["sliding_window"] = Value::from(keys.count("attention.sliding_window")?);
    // llama.cpp's default pattern (every 4th layer global); a stored one must agree.
    let pattern = 4;
    if let Some(GgufValue::Array(a)) = meta.get(&keys.key("attention.sliding_window_pattern")) {
        let flags = a
            .astype(Dtype::Bool)
            .and_then(|b| b.to_vec::<bool>())
            .map_err(|e| gguf_err(path, format!("metadata `sliding_window_pattern`: {e}")))?;
        if !(0..flags.len()).all(|i| flags[i] == ((i + 1) % pattern != 0)) {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is not every 4th layer global, the pattern this map \
                     reads",
                    keys.key("attention.sliding_window_pattern")
                ),
            ));
        }
    }
    config["sliding_window_pattern"] = Value::from(pattern as i64);
    let has = |t: &str| tensors.contains_key(&format!("model.layers.0.{t}"));
    config["layer_norm_bias"] = Value::from(has("input_layernorm.bias"));
    config["attention_bias"] = Value::from(has("self_attn.q_proj.bias"));
    Ok(())
}

/// `seed_oss` | `ernie4_5` | `command-r`.
fn seed_oss_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, arch, hidden, heads, keys) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.arch,
        cx.hidden,
        cx.heads,
        cx.k,
    );
    let has = |t: &str| tensors.contains_key(&format!("model.layers.0.{t}"));
    match arch {
        "seed_oss" => {
            config["attention_bias"] = Value::from(has("self_attn.q_proj.bias"));
            config["attention_out_bias"] = Value::from(has("self_attn.o_proj.bias"));
            config["mlp_bias"] = Value::from(has("mlp.down_proj.bias"));
        }
        "ernie4_5" => {
            config["use_bias"] = Value::from(has("self_attn.q_proj.bias"));
        }
        _ => {
            config["logit_scale"] =
                Value::from(keys.float("logit_scale", false)?.ok_or_else(|| {
                    gguf_err(
                        path,
                        format!("metadata `{}` is missing", keys.key("logit_scale")),
                    )
                })?);
            config["use_qk_norm"] = Value::from(has("self_attn.q_norm.weight"));
            config["layer_norm_bias"] = Value::from(has("input_layernorm.bias"));
            config["attention_bias"] = Value::from(has("self_attn.q_proj.bias"));
        }
    }
    // seed_oss and ernie4_5 need a head size; HF's default when the file has none.
    if config.get("head_dim").is_none() {
        config["head_dim"] = Value::from(hidden / heads);
    }
    if config.get("max_position_embeddings").is_none() {
        return Err(gguf_err(
            path,
            format!("metadata `{}` is missing", keys.key("context_length")),
        ));
    }
    Ok(())
}

/// `exaone`.
fn exaone_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, blocks, hidden, heads, keys) = (
        &mut *cx.config,
        &*cx.tensors,
        cx.path,
        cx.meta,
        cx.blocks,
        cx.hidden,
        cx.heads,
        cx.k,
    );
    // mlx-lm's EXAONE names and full-width rope.
    let hd = i64::from(hidden / heads);
    if let Some(d) = meta_count(meta, path, &keys.key("rope.dimension_count"))? {
        if i64::from(d) != config["head_dim"].as_i64().unwrap_or(hd) {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {d}: a partial rope, which mlx-lm's exaone lacks",
                    keys.key("rope.dimension_count")
                ),
            ));
        }
    }
    config["num_layers"] = Value::from(blocks);
    config["attention_bias"] =
        Value::from(tensors.contains_key("transformer.h.0.attn.attention.q_proj.bias"));
    config["mlp_bias"] = Value::from(tensors.contains_key("transformer.h.0.mlp.c_proj.bias"));
    Ok(())
}

/// `nanbeige`.
fn nanbeige_config(cx: &mut Cx) -> Result<()> {
    let (config, tensors, path, meta, keys) =
        (&mut *cx.config, &*cx.tensors, cx.path, cx.meta, cx.k);
    // NanbeigeModel: the loop count and whether the loops between skip the final norm.
    if let Some(n) = meta_count(meta, path, &keys.key("num_loops"))? {
        config["num_loops"] = Value::from(n);
    }
    match meta.get(&keys.key("skip_loop_final_norm")) {
        None => {}
        Some(GgufValue::Array(a)) if a.size() == 1 => {
            let b = a
                .astype(Dtype::Bool)
                .and_then(|b| b.item::<bool>())
                .map_err(|e| gguf_err(path, format!("metadata `skip_loop_final_norm`: {e}")))?;
            config["skip_loop_final_norm"] = Value::from(b);
        }
        Some(_) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is not a flag",
                    keys.key("skip_loop_final_norm")
                ),
            ))
        }
    }
    let has = |t: &str| tensors.contains_key(&format!("model.layers.0.{t}"));
    config["attention_bias"] = Value::from(has("self_attn.q_proj.bias"));
    config["mlp_bias"] = Value::from(has("mlp.down_proj.bias"));
    Ok(())
}

/// What `mlx info` prints about a GGUF file of a supported architecture, without building
/// the model: the mapped config's descriptor and the tensors as they would be loaded (MLX's
/// GGUF reader quantizes with group size 32).
pub fn gguf_model_info(path: &Path) -> Result<crate::load::ModelInfo> {
    let g = read_gguf(path)?;
    crate::load::info_of(g.config, &g.tensors, 32)
}

/// Loads a GGUF file of a supported architecture as a model.
pub fn load_gguf_model(
    path: &Path,
    opts: &LoadOptions,
) -> Result<(Box<dyn LanguageModel>, GgufModel)> {
    load_gguf_model_with(path, opts, GgufTensors::Auto)
}

/// [`load_gguf_model`] with the tensors obtained as `how` says.
pub fn load_gguf_model_with(
    path: &Path,
    opts: &LoadOptions,
    how: GgufTensors,
) -> Result<(Box<dyn LanguageModel>, GgufModel)> {
    let g = read_gguf_with(path, how)?;
    let weights = Weights::new(g.tensors.clone(), None, opts.dtype).with_ggml(g.blocks.clone());
    let model = build(&g.config, weights)?;
    Ok((model, g))
}

#[cfg(test)]
mod tests {
    use super::gemma::normal_cdf;
    use super::linear::untile_v_heads;
    use super::*;

    /// `LlamaModel.generate_extra_tensors`'s factors in f32, as llama.cpp's converter
    /// computes them (torch float32).
    fn converter_factors(
        base: f32,
        dim: i32,
        factor: f32,
        low: f32,
        high: f32,
        old: f32,
    ) -> Vec<f32> {
        (0..dim / 2)
            .map(|i| {
                let freq = 1.0f32 / base.powf((2 * i) as f32 / dim as f32);
                let wavelen = (2.0 * std::f64::consts::PI) as f32 / freq;
                if wavelen < old / high {
                    1.0
                } else if wavelen > old / low {
                    factor
                } else {
                    let s = (old / wavelen - low) / (high - low);
                    1.0 / ((1.0 - s) / factor + s)
                }
            })
            .collect()
    }

    /// BitNet: ternary values times one scale pack into mlx-lm's codes (row `r + i * out / 4`
    /// in bits `2i..2i + 2` of row `r`) with the scale in the weight's dtype; all-zero weights
    /// take scale 1; a second magnitude or rows not a multiple of 4 are refused.
    #[test]
    fn bitnet_weights_pack_into_codes_and_one_scale() -> Result<()> {
        let h = |v: &[f32]| {
            v.iter()
                .map(|&x| half::f16::from_f32(x))
                .collect::<Vec<_>>()
        };
        let w = Array::from_slice(&h(&[0.5, 0.0, -0.5, 0.5, 0.0, 0.0, 0.5, -0.5]), &[4, 2])?;
        let (packed, scale) = bitnet_pack(&w).unwrap();
        assert_eq!(packed.dtype(), Dtype::Uint8);
        assert_eq!(packed.shape(), vec![1, 2]);
        assert_eq!(
            packed.to_vec::<u8>()?,
            vec![2 | 1 << 4 | 2 << 6, 1 | 2 << 2 | 1 << 4]
        );
        assert_eq!(scale.dtype(), Dtype::Float16);
        assert_eq!(scale.astype(Dtype::Float32)?.to_vec::<f32>()?, vec![0.5]);
        let zero = Array::from_slice(&[0.0f32; 8], &[4, 2])?;
        let (packed, scale) = bitnet_pack(&zero).unwrap();
        assert_eq!(packed.to_vec::<u8>()?, vec![0b0101_0101; 2]);
        assert_eq!(scale.to_vec::<f32>()?, vec![1.0]);
        let two = Array::from_slice(&[0.5f32, 0.25, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], &[4, 2])?;
        assert!(bitnet_pack(&two).unwrap_err().contains("at (0, 1)"));
        let three = Array::from_slice(&[0.5f32; 6], &[3, 2])?;
        assert!(bitnet_pack(&three).unwrap_err().contains("3 rows"));
        Ok(())
    }

    /// Llama 3.1 (factor 8) and 3.2 (factor 32) as released (theta 500000, head 128, original
    /// context 8192, low 1, high 4): the parameters come back exactly.
    #[test]
    fn llama3_rope_parameters_are_recovered_from_rope_freqs() -> Result<()> {
        for factor in [8.0f32, 32.0] {
            let f = converter_factors(500_000.0, 128, factor, 1.0, 4.0, 8192.0);
            let a = Array::from_slice(&f, &[64])?;
            let mut config = json!({"head_dim": 128, "rope_theta": 500000.0});
            llama3_rope(&mut config, &a, Path::new("x.gguf"), 128)?;
            assert_eq!(
                config["rope_scaling"],
                json!({
                    "rope_type": "llama3",
                    "factor": f64::from(factor),
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                })
            );
        }
        // Llama 4 Scout (theta 500000, head 128, factor 16, low = high = 1, original context
        // 8192): no blended band; a step at 8192 between two adjacent frequencies.
        let f = converter_factors(500_000.0, 128, 16.0, 1.0, 1.0, 8192.0);
        let a = Array::from_slice(&f, &[64])?;
        let mut config = json!({"head_dim": 128, "rope_theta": 500000.0});
        llama3_rope(&mut config, &a, Path::new("x.gguf"), 128)?;
        assert_eq!(
            config["rope_scaling"],
            json!({
                "rope_type": "llama3",
                "factor": 16.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
            })
        );
        // Factors no Llama 3 scaling gives are refused, naming the tensor.
        let mut f = converter_factors(500_000.0, 128, 8.0, 1.0, 4.0, 8192.0);
        f[40] = 3.0;
        f[10] = 5.0;
        let a = Array::from_slice(&f, &[64])?;
        let mut config = json!({"head_dim": 128, "rope_theta": 500000.0});
        let e = llama3_rope(&mut config, &a, Path::new("x.gguf"), 128).unwrap_err();
        assert!(e.to_string().contains("rope_freqs"), "{e}");
        Ok(())
    }

    /// Gemma 3n's sparsity values come back from the converter's f32 quantiles.
    #[test]
    fn normal_cdf_recovers_sparsity_values() {
        // torch.distributions.Normal(0, 1).icdf(s) in float32, for s = 0.95, 0.5, 0.99.
        for (t, s) in [(1.644_853_6f32, 0.95), (0.0, 0.5), (2.326_347_9, 0.99)] {
            let p = (normal_cdf(f64::from(t)) * 1e6).round() / 1e6;
            assert_eq!(p, s, "{t}");
        }
        assert_eq!(normal_cdf(f64::NEG_INFINITY), 0.0);
        assert!((normal_cdf(-1.0) - 0.158_655_253_931_457).abs() < 1e-14);
    }

    /// Qwen 3.5's value heads untiled on a quantized `ssm_out` (MLX's affine triple of a
    /// Q4_0 / Q8_0 file): whole groups of columns move with their head, so untiling the packed
    /// weight, scales and biases by heads dequantizes to the untiled weight.
    #[test]
    fn value_heads_untile_on_quantized_columns() -> Result<()> {
        use mlx_core::quantized::{dequantize, quantize, QuantMode};
        let (nk, r, dv) = (2, 3, 32);
        let nv = nk * r;
        let w = mlx_core::random::normal(&[8, nv * dv], Dtype::Float32, None, None, None, None)?;
        let (q, sc, b) = quantize(&w, 32, 4, QuantMode::Affine, None)?;
        let b = b.ok_or_else(|| ModelError::Weights(vec!["no biases".into()]))?;
        let by_heads = |a: &Array| untile_v_heads(a, 1, nk, r, a.shape()[1] / nv);
        let (uq, us, ub) = (by_heads(&q)?, by_heads(&sc)?, by_heads(&b)?);
        let deq = |q: &Array, s: &Array, b: &Array| {
            dequantize(q, s, Some(b), 32, 4, QuantMode::Affine, None, None)
        };
        let got = deq(&uq, &us, &ub)?;
        let want = untile_v_heads(&deq(&q, &sc, &b)?, 1, nk, r, dv)?;
        assert_eq!(got.to_vec::<f32>()?, want.to_vec::<f32>()?);
        // And untiling is the converter's tiling undone: tiled (r, nk) -> grouped (nk, r).
        let ids = Array::from_slice(&(0..nv).collect::<Vec<i32>>(), &[nv])?;
        let tiled = untile_v_heads(&ids, 0, r, nk, 1)?;
        assert_eq!(tiled.to_vec::<i32>()?, vec![0, 3, 1, 4, 2, 5]);
        let back = untile_v_heads(&tiled, 0, nk, r, 1)?;
        assert_eq!(back.to_vec::<i32>()?, (0..nv).collect::<Vec<i32>>());
        Ok(())
    }
}

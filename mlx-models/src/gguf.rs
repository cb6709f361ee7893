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

mod bailingmoe3;
mod dense;
mod fused;
mod gemma;
mod kimi_k3;
mod layerwise;
mod linear;
mod meta;
mod minimax_m3;
mod mla;
mod moe;
mod moe_swa;
mod rope;
mod ssm;
mod table;
mod xverse;

use meta::{
    attention_kinds, first_count, head_size, layer_counts, layer_list, meta_bool, meta_count,
    meta_layer_count, need_count, per_layer_counts, positive_f64, require_context, rotary_dims,
    sliding_kinds, Keys,
};
pub use meta::{meta_f64, meta_str};
use rope::llama3_rope;
use table::{is_proj, map_name, ARCHS, GGUF_ENCODERS, QWEN35_PARTS};

/// What a GGUF file holds, mapped for this crate.
pub struct GgufModel {
    pub config: ModelConfig,
    pub tensors: BTreeMap<String, Array>,
    pub metadata: GgufMetadata,
    /// Weights kept as GGML blocks ([`GgufTensors::Blocks`]; else empty), by mlx-lm name
    /// (`<path>.weight`).
    pub blocks: BTreeMap<String, crate::layers::GgmlWeight>,
    /// The mlx-lm names (`<path>.biases`) of Q4_0 / Q8_0 biases held lazily
    /// ([`GgufTensors::Blocks`]; else empty): each is the unevaluated MLX product `scales x
    /// -8` (`x -128`) of its `<path>.scales`, exactly the array MLX's reader materializes,
    /// computed only where the MLX forward first uses it; the CPU decoder forms the biases
    /// from the scales (`mlx_core::cpu::Matrix::symmetric`) and never evaluates it.
    pub symmetric: std::collections::BTreeSet<String>,
}

/// `blk.N.ssm_a` (no suffix) as mlx-lm's `A_log` (heads,) under `model.layers.N.<module>`:
/// the converter stored `exp(A_log)` (bailingmoe3, as (heads, 1)) or, with `negate`,
/// `-exp(A_log)` (kimi-k3).
fn a_log(name: &str, a: &Array, negate: bool, module: &str) -> Result<Option<(String, Array)>> {
    let Some(layer) = name
        .strip_prefix("blk.")
        .and_then(|r| r.strip_suffix(".ssm_a"))
        .filter(|l| l.parse::<u32>().is_ok())
    else {
        return Ok(None);
    };
    let v = if negate {
        ops::log(&ops::negative(a, None)?, None)?
    } else {
        ops::log(a, None)?
    };
    let v = v.reshape(&[-1])?;
    Ok(Some((format!("model.layers.{layer}.{module}.A_log"), v)))
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

/// The `len` bytes of tensor `t` of the GGUF file at `path` (open as `file`); an error names
/// the tensor.
fn tensor_bytes(
    file: &mut std::fs::File,
    path: &Path,
    t: &mlx_core::io::GgufTensorInfo,
    len: usize,
) -> Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut bytes = vec![0u8; len];
    file.seek(SeekFrom::Start(t.offset))
        .and_then(|_| file.read_exact(&mut bytes))
        .map_err(|e| gguf_err(path, format!("tensor {}: {e}", t.name)))?;
    Ok(bytes)
}

/// Whether every tensor of `header` is of a type MLX's reader loads without converting it.
fn all_native(header: &mlx_core::io::GgufHeader) -> bool {
    header
        .tensors
        .iter()
        .all(|t| MLX_NATIVE_TYPES.contains(&t.ggml_type))
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
        let bytes = tensor_bytes(&mut file, path, t, len)?;
        let a = Array::from_slice(&bytes, &[rows, rb as i32])?;
        kept.push((t.name.clone(), ty, rows, cols, a));
    }
    let (raw, metadata) = dequantized_with(path, rest)?;
    Ok((raw, metadata, kept))
}

/// GGML types MLX's GGUF reader loads without converting them (F32, F16, Q4_0, Q4_1, Q8_0).
const MLX_NATIVE_TYPES: &[u32] = &[0, 1, 2, 3, 8];

/// The tensors of a GGUF file whose types are all F32, F16, Q4_0, Q4_1 or Q8_0, bit for bit as
/// MLX's `load_gguf` gives them, read one tensor at a time (the path [`read_gguf`] takes for
/// such files), with the file's metadata.
pub fn read_gguf_native(path: &Path) -> Result<(BTreeMap<String, Array>, GgufMetadata)> {
    let header = read_gguf_header(path).map_err(|e| gguf_err(path, e))?;
    native_streamed(path, header, None)
}

/// The tensors of a GGUF file whose types are all [`MLX_NATIVE_TYPES`], as MLX's `load_gguf`
/// gives them (bit for bit: F32/F16 as stored; Q4_0, Q4_1, Q8_0 as MLX's affine triples
/// `NAME.weight` uint32, `NAME.scales` / `NAME.biases` f16), read one tensor at a time. MLX's
/// reader maps the whole file and keeps every page of it resident until the last tensor is
/// converted, which doubles the load's peak memory (results/bench/2026-12-05-s26-memory); here
/// only one tensor's bytes are held beside the converted arrays. The block layouts follow MLX
/// 0.32.4's `extract_q4_0_data` / `extract_q4_1_data` / `extract_q8_0_data`; the test
/// `gguf_dense::native_streamed_matches_mlx_loader` checks them against [`load_gguf`].
///
/// With `lazy` (the CPU decoder's load, [`GgufTensors::Blocks`]), the Q4_0 / Q8_0 biases are
/// left unevaluated (the same MLX product, computed where the MLX forward first reads them)
/// and go into `lazy` by array id (held there, so that no other array takes the id while it
/// is read), unless a scale is not finite or its bias would overflow float16 (then evaluated
/// as without `lazy`).
fn native_streamed(
    path: &Path,
    header: mlx_core::io::GgufHeader,
    mut lazy: Option<&mut BTreeMap<usize, Array>>,
) -> Result<(BTreeMap<String, Array>, GgufMetadata)> {
    let mut file = std::fs::File::open(path).map_err(|e| gguf_err(path, e))?;
    let mut tensors = BTreeMap::new();
    for t in &header.tensors {
        let bad = |what: &str| gguf_err(path, format!("tensor {}: {what}", t.name));
        let mut shape = t
            .dims
            .iter()
            .rev()
            .map(|&d| i32::try_from(d))
            .collect::<std::result::Result<Vec<i32>, _>>()
            .map_err(|_| bad("dimension too large"))?;
        let elements = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
            .ok_or_else(|| bad("too many elements"))?;
        // (bytes per element or per 32-element block, bytes of a block's header)
        let (unit, block_bytes) = match t.ggml_type {
            0 => (4, 0),
            1 => (2, 0),
            2 => (18, 2),
            3 => (20, 4),
            8 => (34, 2),
            _ => return Err(bad("not a type MLX reads natively")),
        };
        let quantized = block_bytes > 0;
        let last = shape.last().copied().unwrap_or(1);
        if quantized && (last % 32 != 0 || shape.is_empty()) {
            return Err(bad("last dimension is not a multiple of 32"));
        }
        let len = if quantized {
            elements / 32 * unit
        } else {
            elements * unit
        };
        if len as u64 != t.bytes {
            return Err(bad("size does not match its type and shape"));
        }
        let bytes = tensor_bytes(&mut file, path, t, len)?;
        if !quantized {
            let dtype = if t.ggml_type == 0 {
                mlx_core::Dtype::Float32
            } else {
                mlx_core::Dtype::Float16
            };
            let mut byte_shape = shape.clone();
            match byte_shape.last_mut() {
                Some(d) => *d *= unit as i32,
                None => byte_shape.push(unit as i32),
            }
            let a = Array::from_slice(&bytes, &byte_shape)?.view(dtype)?;
            let a = if shape.is_empty() { a.reshape(&[])? } else { a };
            a.eval()?;
            tensors.insert(t.name.clone(), a);
            continue;
        }
        let blocks = elements / 32;
        let per_block = if t.ggml_type == 8 { 32 } else { 16 };
        let mut scale = Vec::with_capacity(blocks * 2);
        let mut bias = Vec::with_capacity(if t.ggml_type == 3 { blocks * 2 } else { 0 });
        let mut weights = Vec::with_capacity(blocks * per_block);
        for b in bytes.chunks_exact(unit) {
            scale.extend_from_slice(&b[..2]);
            let qs = &b[block_bytes..];
            match t.ggml_type {
                3 | 2 => {
                    if t.ggml_type == 3 {
                        bias.extend_from_slice(&b[2..4]);
                    }
                    // MLX's unpack_32_4: element j < 16 is the low nibble of qs[j], element
                    // 16 + j the high one; packed two per byte, the even element low.
                    for half in [0u8, 4] {
                        for j in (0..16).step_by(2) {
                            weights.push(
                                ((qs[j] >> half) & 0x0F) | (((qs[j + 1] >> half) & 0x0F) << 4),
                            );
                        }
                    }
                }
                _ => weights.extend(qs.iter().map(|&x| x ^ 0x80)),
            }
        }
        drop(bytes);
        let rows = &shape[..shape.len() - 1];
        let groups = last / 32;
        let mut s_shape = rows.to_vec();
        s_shape.push(groups * 2);
        let scales = Array::from_slice(&scale, &s_shape)?.view(mlx_core::Dtype::Float16)?;
        let k: i32 = if t.ggml_type == 2 { -8 } else { -128 };
        let biases = if t.ggml_type == 3 {
            Array::from_slice(&bias, &s_shape)?.view(mlx_core::Dtype::Float16)?
        } else {
            scales.multiply_scalar(k)?
        };
        // Lazy only where the CPU kernels' float32 `k x scale` is the float16 product's value:
        // finite scales whose product does not overflow float16.
        let limit = 65504.0 / k.unsigned_abs() as f32;
        let symmetric = t.ggml_type != 3
            && lazy.is_some()
            && scale
                .chunks_exact(2)
                .all(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32().abs() <= limit);
        *shape.last_mut().expect("non-empty") = groups * per_block as i32;
        let w = Array::from_slice(&weights, &shape)?.view(mlx_core::Dtype::Uint32)?;
        if symmetric {
            mlx_core::eval([&w, &scales])?;
            if let Some(ids) = lazy.as_deref_mut() {
                ids.insert(biases.id(), biases.clone());
            }
        } else {
            mlx_core::eval([&w, &scales, &biases])?;
        }
        // MLX cuts the name's last 7 bytes (`.weight`) whatever they are.
        let base = t
            .name
            .get(..t.name.len().saturating_sub(7))
            .unwrap_or(&t.name);
        tensors.insert(format!("{base}.scales"), scales);
        tensors.insert(format!("{base}.biases"), biases);
        tensors.insert(t.name.clone(), w);
    }
    Ok((tensors, header.metadata))
}

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
        let bytes = tensor_bytes(&mut file, path, t, len)?;
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

/// The header (metadata and tensor infos, no tensor data) of the GGUF file at `path`, with
/// this crate's error naming the file: what [`read_gguf_from`] and [`load_gguf_model_from`]
/// take.
pub fn read_gguf_header_of(path: &Path) -> Result<mlx_core::io::GgufHeader> {
    read_gguf_header(path).map_err(|e| gguf_err(path, e))
}

/// [`read_gguf`] with the tensors obtained as `how` says.
pub fn read_gguf_with(path: &Path, how: GgufTensors) -> Result<GgufModel> {
    let header = match how {
        // MLX's own reader parses the file itself.
        GgufTensors::Mlx => None,
        _ => Some(read_gguf_header_of(path)?),
    };
    read_gguf_from(path, header, how)
}

/// [`read_gguf_with`] on a header already read by [`read_gguf_header`] (`None` only with
/// [`GgufTensors::Mlx`], whose reader parses the file itself; a header given to it is
/// unused): a caller that needs the metadata first (the tokenizer, built before any tensor
/// is read so that its transient memory is gone before the weights arrive) reads the header
/// once.
pub fn read_gguf_from(
    path: &Path,
    header: Option<mlx_core::io::GgufHeader>,
    how: GgufTensors,
) -> Result<GgufModel> {
    let header = match (how, header) {
        (GgufTensors::Mlx, _) => None,
        (_, Some(h)) => Some(h),
        (_, None) => Some(read_gguf_header_of(path)?),
    };
    let mut kept = Vec::new();
    // The lazy Q4_0 / Q8_0 biases (`GgufModel::symmetric`) and their un-permuted rows (the
    // same product of the un-permuted scales), by array id (held: no other array takes an id
    // while this map lives).
    let mut lazy_ids: BTreeMap<usize, Array> = BTreeMap::new();
    let (raw, metadata) = match (how, header) {
        (GgufTensors::Mlx, _) | (_, None) => {
            load_gguf(path, None).map_err(|e| gguf_err(path, e))?
        }
        (GgufTensors::Blocks, Some(header)) => {
            if all_native(&header) {
                // As `Auto`: MLX's affine triples, which the CPU decoder reads, less the
                // Q4_0 / Q8_0 biases, left lazy (`GgufModel::symmetric`).
                native_streamed(path, header, Some(&mut lazy_ids))?
            } else {
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
        }
        (GgufTensors::Auto, Some(header)) => {
            if all_native(&header) {
                native_streamed(path, header, None)?
            } else {
                dequantized_with(path, header)?
            }
        }
        (GgufTensors::Dequantize, Some(header)) => dequantized_with(path, header)?,
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
        let renamed = match arch.arch {
            "bailingmoe3" => a_log(&name, &a, false, "attention")?,
            "kimi-k3" => a_log(&name, &a, true, "self_attn")?,
            _ => None,
        };
        if let Some((m, v)) = renamed {
            tensors.insert(m, v);
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
                let lazy = lazy_ids.contains_key(&a.id());
                let unpermuted =
                    arch.permute_qk && (is_proj(&m, "q_proj") || is_proj(&m, "k_proj"));
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
                if lazy && unpermuted {
                    // The same rows of `scales x k` as of its un-permuted scales.
                    lazy_ids.insert(a.id(), a.clone());
                }
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
    // The lazy biases as the model will take them (after every rename above).
    let symmetric = tensors
        .iter()
        .filter(|(k, a)| k.ends_with(".biases") && lazy_ids.contains_key(&a.id()))
        .map(|(k, _)| k.clone())
        .collect();
    Ok(GgufModel {
        config,
        tensors,
        metadata,
        blocks: ggml,
        symmetric,
    })
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

/// What `mlx info` prints about a GGUF file of a supported architecture, without building
/// the model: the mapped config's descriptor and the tensors as they would be loaded (MLX's
/// GGUF reader quantizes with group size 32).
pub fn gguf_model_info(path: &Path) -> Result<crate::load::ModelInfo> {
    let header = read_gguf_header_of(path)?;
    let mut types = BTreeMap::new();
    for t in &header.tensors {
        *types.entry(t.type_name.to_string()).or_insert(0usize) += 1;
    }
    let g = read_gguf_from(path, Some(header), GgufTensors::Auto)?;
    let mut info = crate::load::info_of(g.config, &g.tensors, 32)?;
    info.gguf_types = Some(types);
    Ok(info)
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
    load_gguf_model_from(path, None, opts, how)
}

/// Takes out of a GGUF's metadata the tokenizer's per-token lists, which nothing but the
/// tokenizer's build reads (`tokenizer.ggml.merges`, `.token_type`, `.scores`, and
/// `.tokens` where `<general.architecture>.vocab_size` gives the model's vocabulary size,
/// else the model reads its length): for a loader that has built the tokenizer already.
pub fn drop_tokenizer_lists(metadata: &mut GgufMetadata) {
    for k in [
        "tokenizer.ggml.merges",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.scores",
    ] {
        metadata.remove(k);
    }
    let sized = meta_str(metadata, "general.architecture")
        .is_some_and(|a| metadata.contains_key(&format!("{a}.vocab_size")));
    if sized {
        metadata.remove("tokenizer.ggml.tokens");
    }
}

/// [`load_gguf_model_with`] on a header already read ([`read_gguf_from`]).
pub fn load_gguf_model_from(
    path: &Path,
    header: Option<mlx_core::io::GgufHeader>,
    opts: &LoadOptions,
    how: GgufTensors,
) -> Result<(Box<dyn LanguageModel>, GgufModel)> {
    let g = read_gguf_from(path, header, how)?;
    let mut weights = Weights::new(g.tensors.clone(), None, opts.dtype)
        .with_ggml(g.blocks.clone())
        .with_symmetric(g.symmetric.clone());
    if how == GgufTensors::Blocks {
        // Loading for the CPU decoder: its kernels read the half-precision scales in place.
        weights = weights.keep_linear_scales();
    }
    let model = build(&g.config, weights)?;
    Ok((model, g))
}

#[cfg(test)]
mod tests {
    use super::fused::bitnet_pack;
    use super::gemma::normal_cdf;
    use super::linear::untile_v_heads;
    use super::*;

    /// The tokenizer's per-token lists leave the metadata; the token list stays where the
    /// model's vocabulary size is its length (no `<arch>.vocab_size`).
    #[test]
    fn drop_tokenizer_lists_keeps_what_the_model_reads() {
        let strings = |n: usize| GgufValue::Strings(vec!["x".to_string(); n]);
        let meta = |sized: bool| {
            let mut m = GgufMetadata::new();
            m.insert("general.architecture", GgufValue::String("llama".into()));
            if sized {
                m.insert(
                    "llama.vocab_size",
                    GgufValue::Array(Array::from_slice(&[3u32], &[]).unwrap()),
                );
            }
            m.insert("tokenizer.ggml.tokens", strings(3));
            m.insert("tokenizer.ggml.merges", strings(2));
            m.insert("tokenizer.ggml.scores", strings(3));
            m.insert("tokenizer.ggml.token_type", strings(3));
            m.insert("tokenizer.ggml.eos_token_id", strings(1));
            m
        };
        for sized in [true, false] {
            let mut m = meta(sized);
            drop_tokenizer_lists(&mut m);
            let keys: Vec<&str> = m.keys().map(String::as_str).collect();
            let mut want = vec!["general.architecture"];
            if sized {
                want.push("llama.vocab_size");
            }
            want.push("tokenizer.ggml.eos_token_id");
            if !sized {
                want.push("tokenizer.ggml.tokens");
            }
            assert_eq!(keys, want, "sized: {sized}");
        }
    }

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
        assert!(bitnet_pack(&two)
            .unwrap_err()
            .to_string()
            .contains("at (0, 1)"));
        let three = Array::from_slice(&[0.5f32; 6], &[3, 2])?;
        assert!(bitnet_pack(&three)
            .unwrap_err()
            .to_string()
            .contains("3 rows"));
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

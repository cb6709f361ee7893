//! `nn.Linear` and `nn.QuantizedLinear` as one layer that may be quantized.

use mlx_core::prelude::*;
use mlx_core::quantized::{self, QuantMode};

use crate::config::QuantParams;
use crate::error::{ModelError, Result};
use crate::layers::trellis::TrellisWeight;
use crate::layers::LayerParam;
use crate::weights::Weights;

/// A packed, quantized weight: `(weight, scales, biases)` plus how it was packed.
#[derive(Clone, Debug)]
pub struct QuantizedWeight {
    pub weight: Array,
    pub scales: Array,
    /// Absent for the modes without biases (mxfp4, nvfp4, mxfp8).
    pub biases: Option<Array>,
    pub group_size: i32,
    pub bits: i32,
    pub mode: QuantMode,
    /// The dtype an embedding lookup widens the gathered rows' `scales` and `biases` to before
    /// dequantizing them: set when they were kept in their stored dtype under a load's cast
    /// (an embedding loaded under [`Weights::keep_linear_scales`]), so the rows come out
    /// bit for bit as from scales cast at load (widening is exact), at the cast's dtype,
    /// without a second copy of the table's scales. `None`: dequantize in the scales' dtype.
    pub lookup_dtype: Option<Dtype>,
    /// `biases` is `-2^(bits - 1) x scales` held as MLX's unevaluated product (a GGUF file's
    /// Q4_0 / Q8_0 loaded for the CPU decoder: [`Weights::with_symmetric`]): the MLX forward
    /// computes it where it first uses it (the bits MLX's reader gives), and the CPU decoder
    /// forms each bias from its scale (`mlx_core::cpu::Matrix::symmetric`) without ever
    /// evaluating it, so its memory is never allocated in that run. Handing the biases out
    /// mutably (`parameters_mut`: an update may replace them) clears it, so replaced biases
    /// are read as stored.
    pub symmetric: bool,
}

impl QuantizedWeight {
    /// The packed `weight`, `scales` and (affine) `biases` under `path`, marked quantized:
    /// no gradient reaches them, so full fine-tuning keeps them frozen.
    pub(crate) fn parameters_mut<'a>(&'a mut self, path: &str, out: &mut Vec<LayerParam<'a>>) {
        let QuantizedWeight {
            weight,
            scales,
            biases,
            symmetric,
            ..
        } = self;
        // The biases may be replaced through the handle: read them as stored from now on.
        *symmetric = false;
        LayerParam::push(out, path, "weight", weight, true);
        LayerParam::push(out, path, "scales", scales, true);
        if let Some(b) = biases {
            LayerParam::push(out, path, "biases", b, true);
        }
    }
}

pub(crate) fn quant_mode(mode: &str) -> Result<QuantMode> {
    match mode {
        "affine" => Ok(QuantMode::Affine),
        "mxfp4" => Ok(QuantMode::Mxfp4),
        "nvfp4" => Ok(QuantMode::Nvfp4),
        "mxfp8" => Ok(QuantMode::Mxfp8),
        other => Err(ModelError::Config(format!(
            "unknown quantization mode `{other}`"
        ))),
    }
}

impl QuantizedWeight {
    /// Loads `<path>.weight`, `.scales` (and `.biases` for affine) for a logical
    /// `(rows, cols)` matrix, checking the packed shapes.
    pub fn load(
        w: &mut Weights,
        path: &str,
        rows: i32,
        cols: i32,
        q: &QuantParams,
    ) -> Result<QuantizedWeight> {
        Self::load_as(w, path, rows, cols, q, false)
    }

    /// [`QuantizedWeight::load`] for a linear layer: its scales and biases through
    /// [`Weights::take_linear_scales`].
    pub fn load_linear(
        w: &mut Weights,
        path: &str,
        rows: i32,
        cols: i32,
        q: &QuantParams,
    ) -> Result<QuantizedWeight> {
        Self::load_as(w, path, rows, cols, q, true)
    }

    /// [`QuantizedWeight::load`] for an embedding table: under
    /// [`Weights::keep_linear_scales`] its scales and biases keep their stored dtype too, and
    /// [`QuantizedWeight::lookup_dtype`] says what a lookup widens the gathered rows to (the
    /// load's cast dtype); the tied head's `quantized_matmul` widens them itself, with the
    /// same bits. The CPU decoder reads the stored scales in place.
    pub fn load_embedding(
        w: &mut Weights,
        path: &str,
        rows: i32,
        cols: i32,
        q: &QuantParams,
    ) -> Result<QuantizedWeight> {
        let kept = w.keeps_linear_scales();
        let mut qw = Self::load_as(w, path, rows, cols, q, kept)?;
        if kept {
            qw.lookup_dtype = w
                .cast_dtype()
                .filter(|&d| qw.scales.dtype().is_floating() && qw.scales.dtype() != d);
        }
        Ok(qw)
    }

    fn load_as(
        w: &mut Weights,
        path: &str,
        rows: i32,
        cols: i32,
        q: &QuantParams,
        linear: bool,
    ) -> Result<QuantizedWeight> {
        let mode = quant_mode(&q.mode)?;
        if q.bits <= 0
            || q.group_size <= 0
            || (i64::from(cols) * i64::from(q.bits)) % 32 != 0
            || cols % q.group_size != 0
        {
            return Err(ModelError::Config(format!(
                "{path}: {cols} columns cannot be packed with {} bits in groups of {}",
                q.bits, q.group_size
            )));
        }
        let packed = (i64::from(cols) * i64::from(q.bits) / 32) as i32;
        let weight = w.take(&format!("{path}.weight"), &[rows, packed])?;
        let shape = [rows, cols / q.group_size];
        let biases_name = format!("{path}.biases");
        let symmetric = mode == QuantMode::Affine && w.is_symmetric_biases(&biases_name);
        let mut take = |name: String| {
            if linear {
                w.take_linear_scales(&name, &shape)
            } else {
                w.take(&name, &shape)
            }
        };
        let scales = take(format!("{path}.scales"))?;
        let biases = if mode == QuantMode::Affine {
            Some(take(biases_name)?)
        } else {
            None
        };
        Ok(QuantizedWeight {
            weight,
            scales,
            biases,
            group_size: q.group_size,
            bits: q.bits,
            mode,
            lookup_dtype: None,
            symmetric,
        })
    }

    /// `x @ dequantize(w).T` by blocks of the weight's rows, each block dequantized and
    /// multiplied alone, at most `block_bytes` of dequantized weight a block (at least one
    /// row), the blocks' outputs joined along the last axis. The same product as
    /// [`QuantizedWeight::matmul_t`] within float rounding (tier L3: [`DensePrompt`]); a dense
    /// GEMM instead of the quantized one.
    pub fn matmul_t_dense(&self, x: &Array, block_bytes: usize) -> Result<Array> {
        let rows = self.weight.dim(0)?;
        let cols = i64::from(self.weight.dim(1)?) * 32 / i64::from(self.bits);
        // Affine: in the scales' dtype, as `mx.dequantize` gives it; the floating-point
        // modes' scales are exponents (uint8): in the input's dtype (their values are exact
        // in bfloat16 and wider).
        let dtype = match self.mode {
            QuantMode::Affine => None,
            _ => Some(x.dtype()),
        };
        let item = dtype.unwrap_or(self.scales.dtype()).size();
        let row_bytes = (cols as usize).saturating_mul(item).max(1);
        let per_block = (block_bytes / row_bytes).max(1);
        // Whole tiles of 128 rows where a block holds more than one.
        let per_block = if per_block >= 256 {
            per_block / 128 * 128
        } else {
            per_block
        };
        let per_block = i32::try_from(per_block).unwrap_or(i32::MAX);
        let product = |w: &Array, s: &Array, b: Option<&Array>| -> Result<Array> {
            let w =
                quantized::dequantize(w, s, b, self.group_size, self.bits, self.mode, dtype, None)?;
            Ok(ops::matmul(x, &ops::transpose_all(&w, None)?, None)?)
        };
        if per_block >= rows {
            return product(&self.weight, &self.scales, self.biases.as_ref());
        }
        let mut outs = Vec::with_capacity(((rows + per_block - 1) / per_block) as usize);
        let mut start = 0;
        while start < rows {
            let stop = rows.min(start.saturating_add(per_block));
            let part = |a: &Array| ops::slice_axis(a, 0, start, stop, None);
            let b = self.biases.as_ref().map(part).transpose()?;
            outs.push(product(
                &part(&self.weight)?,
                &part(&self.scales)?,
                b.as_ref(),
            )?);
            start = stop;
        }
        let outs: Vec<&Array> = outs.iter().collect();
        Ok(ops::concatenate(&outs, -1, None)?)
    }

    /// `mx.quantized_matmul(x, w, scales, biases, transpose=True, ...)`.
    pub fn matmul_t(&self, x: &Array) -> Result<Array> {
        Ok(quantized::quantized_matmul(
            x,
            &self.weight,
            &self.scales,
            self.biases.as_ref(),
            true,
            self.group_size,
            self.bits,
            self.mode,
            None,
        )?)
    }
}

/// How a quantized [`Linear`] runs a prompt chunk on this thread ([`with_dense_prompt`]): an
/// input of at least [`DensePrompt::min_rows`] rows (every dimension but the last multiplied)
/// is multiplied by the dequantized weight (`x @ dequantize(w).T`, a dense GEMM) instead of
/// MLX's `quantized_matmul`, the weight dequantized in blocks of at most
/// [`DensePrompt::block_bytes`] ([`QuantizedWeight::matmul_t_dense`]), so no linear's
/// dequantized weight is ever made whole (what MLX keeps of the blocks across linears until
/// their work has run is the engine's to bound: `MLX_PREFILL_DENSE_HEADROOM_MB`). Tier L3
/// against the exact forward (float rounding: on the CPU the two products sum in another
/// order; on an H100 each 8B linear was bit-equal from 256 rows as one block, but a block
/// split can change cuBLAS's kernel (the down projection's at 511 rows differed), and the 8B's
/// logits end to end were within 0.0135, `results/gpu/2026-12-06-s38-h100` call 3);
/// off outside [`with_dense_prompt`], and then the forward builds the graph it builds without
/// it, node for node.
/// The engine turns it on for the prompt forward of a generation the GPU graph decoder
/// decodes (issue #30's prefill): there MLX's CUDA `quantized_matmul` at prompt widths is
/// slower than cuBLAS on the dequantized weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DensePrompt {
    min_rows: usize,
    block_bytes: usize,
}

impl DensePrompt {
    /// The block of dequantized weight by default: 32 MiB (a 4096-wide bfloat16 weight's
    /// 4,096 rows; the 8B's 14,336-wide down projection in four blocks of 1,024 rows).
    pub const DEFAULT_BLOCK_BYTES: usize = 32 << 20;

    /// Inputs of 256 rows or more, blocks of [`DensePrompt::DEFAULT_BLOCK_BYTES`] (the setting
    /// measured on the device, `results/gpu/2026-12-06-s38-h100` call 3).
    pub const DEFAULT: DensePrompt = DensePrompt {
        min_rows: 256,
        block_bytes: Self::DEFAULT_BLOCK_BYTES,
    };

    /// Inputs of at least `min_rows` rows, blocks of at most `block_bytes` of dequantized
    /// weight (a block holds one row at least). Either one 0 is an error.
    pub fn new(min_rows: usize, block_bytes: usize) -> Result<DensePrompt> {
        if min_rows == 0 {
            return Err(ModelError::Input {
                what: "dense prompt linears: min_rows".into(),
                problem: "must be at least 1".into(),
            });
        }
        if block_bytes == 0 {
            return Err(ModelError::Input {
                what: "dense prompt linears: block_bytes".into(),
                problem: "must be at least 1".into(),
            });
        }
        Ok(DensePrompt {
            min_rows,
            block_bytes,
        })
    }

    /// The fewest rows an input takes the dense path with.
    pub fn min_rows(&self) -> usize {
        self.min_rows
    }

    /// The most bytes of dequantized weight one block holds.
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// Whether `x` has rows enough.
    fn takes(&self, x: &Array) -> bool {
        let last = x.shape().last().copied().unwrap_or(1).max(1) as usize;
        x.size() / last >= self.min_rows
    }
}

thread_local! {
    static DENSE_PROMPT: std::cell::Cell<Option<DensePrompt>> = const { std::cell::Cell::new(None) };
}

/// Runs `body` with `setting` for every quantized [`Linear`] a model on this thread runs
/// (`None`: MLX's `quantized_matmul` throughout, the exact path). The previous setting is
/// restored afterwards, also on panic.
pub fn with_dense_prompt<R>(setting: Option<DensePrompt>, body: impl FnOnce() -> R) -> R {
    struct Restore(Option<DensePrompt>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0;
            DENSE_PROMPT.with(|c| c.set(prev));
        }
    }
    let _restore = Restore(DENSE_PROMPT.with(|c| c.replace(setting)));
    body()
}

/// The setting [`with_dense_prompt`] put on this thread.
pub fn dense_prompt() -> Option<DensePrompt> {
    DENSE_PROMPT.with(|c| c.get())
}

/// A layer that replaces a [`Linear`] in a model and computes its output itself, usually
/// from the linear it wraps (LoRA and DoRA in `mlx-train`, as mlx-lm's tuner swaps a module).
pub trait LinearAdapter: Send + std::fmt::Debug {
    fn forward(&self, x: &Array) -> Result<Array>;
    fn clone_box(&self) -> Box<dyn LinearAdapter>;
    /// The wrapped linear.
    fn base(&self) -> &Linear;
    /// For downcasting to the concrete adapter.
    fn as_any(&self) -> &dyn std::any::Any;
    /// The adapter's trainable arrays, for transforms that must see them as inputs
    /// (per-layer gradient checkpointing).
    fn parameters(&self) -> Result<Vec<Array>> {
        Ok(Vec::new())
    }
    /// Replaces the arrays [`LinearAdapter::parameters`] returned (same order).
    fn set_parameters(&self, _values: &[Array]) -> Result<()> {
        Ok(())
    }
}

/// `y = x W^T (+ b)`, dense or quantized, or an adapter standing in for one.
#[derive(Clone, Debug)]
pub enum Linear {
    Dense {
        weight: Array,
        bias: Option<Array>,
    },
    Quantized {
        weight: QuantizedWeight,
        bias: Option<Array>,
    },
    /// `TrellisLinear`: a trellis-coded weight (`"mode": "trellis"`).
    Trellis {
        weight: Box<TrellisWeight>,
        bias: Option<Array>,
    },
    /// GGML blocks kept from a GGUF file for the CPU decoder (`GgufTensors::Blocks`).
    Ggml {
        weight: Box<crate::layers::GgmlWeight>,
        bias: Option<Array>,
    },
    Adapted(Box<dyn LinearAdapter>),
}

impl Clone for Box<dyn LinearAdapter> {
    fn clone(&self) -> Self {
        self.clone_box()
    }
}

impl Linear {
    /// Loads the layer at `path` (`<path>.weight`, optional `<path>.bias`), quantized when
    /// mlx-lm would quantize it (see [`Weights::quantization`]).
    pub fn load(
        w: &mut Weights,
        path: &str,
        in_dims: i32,
        out_dims: i32,
        bias: bool,
    ) -> Result<Linear> {
        let b = if bias {
            Some(w.take(&format!("{path}.bias"), &[out_dims])?)
        } else {
            None
        };
        let q = w.linear_quantization(path, in_dims)?;
        if let Some(g) = w.take_ggml(&format!("{path}.weight"), out_dims, in_dims)? {
            return Ok(Linear::Ggml {
                weight: Box::new(g),
                bias: b,
            });
        }
        match q {
            Some(q) if q.trellis.is_some() => {
                let t = q.trellis.unwrap_or(crate::config::TrellisParams {
                    trellis_l: 0,
                    seed: 0,
                    trellis_code: Default::default(),
                });
                Ok(Linear::Trellis {
                    weight: Box::new(TrellisWeight::load(w, path, out_dims, in_dims, &q, &t)?),
                    bias: b,
                })
            }
            Some(q) => Ok(Linear::Quantized {
                weight: QuantizedWeight::load_linear(w, path, out_dims, in_dims, &q)?,
                bias: b,
            }),
            None => Ok(Linear::Dense {
                weight: w.take(&format!("{path}.weight"), &[out_dims, in_dims])?,
                bias: b,
            }),
        }
    }

    /// The layer's arrays under `path` as mlx names them: `weight`, `bias`; a quantized
    /// layer's `weight`, `scales`, `biases` and `bias`, marked quantized. An adapted linear
    /// has none of its own to give (an error).
    pub fn parameters_mut<'a>(
        &'a mut self,
        path: &str,
        out: &mut Vec<LayerParam<'a>>,
    ) -> Result<()> {
        let (bias, quantized) = match self {
            Linear::Dense { weight, bias } => {
                LayerParam::push(out, path, "weight", weight, false);
                (bias, false)
            }
            Linear::Quantized { weight, bias } => {
                weight.parameters_mut(path, out);
                (bias, true)
            }
            Linear::Trellis { weight, bias } => {
                weight.parameters_mut(path, out);
                (bias, true)
            }
            Linear::Ggml { weight, bias } => {
                LayerParam::push(out, path, "weight", &mut weight.data, true);
                (bias, true)
            }
            Linear::Adapted(_) => {
                return Err(ModelError::Unsupported {
                    what: path.to_string(),
                    problem: "an adapted linear has no parameters of its own".into(),
                })
            }
        };
        if let Some(b) = bias {
            LayerParam::push(out, path, "bias", b, quantized);
        }
        Ok(())
    }

    /// `(output_dims, input_dims)` of the logical (dequantized) weight.
    pub fn dims(&self) -> Result<(i32, i32)> {
        match self {
            Linear::Dense { weight, .. } => {
                let s = weight.shape();
                Ok((s[0], s[1]))
            }
            Linear::Quantized { weight, .. } => {
                let s = weight.weight.shape();
                Ok((s[0], s[1] * 32 / weight.bits))
            }
            Linear::Trellis { weight, .. } => Ok((weight.rows, weight.cols)),
            Linear::Ggml { weight, .. } => Ok((weight.rows, weight.cols)),
            Linear::Adapted(a) => a.base().dims(),
        }
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Linear::Adapted(a) => a.forward(x),
            Linear::Dense {
                weight,
                bias: Some(b),
            } => Ok(ops::addmm(
                b,
                x,
                &ops::transpose_all(weight, None)?,
                1.0,
                1.0,
                None,
            )?),
            Linear::Dense { weight, bias: None } => {
                Ok(ops::matmul(x, &ops::transpose_all(weight, None)?, None)?)
            }
            Linear::Ggml { weight, bias } => {
                let y = weight.matmul_t(x)?;
                match bias {
                    Some(b) => Ok((&y + b)?),
                    None => Ok(y),
                }
            }
            Linear::Trellis { weight, bias } => {
                let y = weight.matmul_t(x)?;
                match bias {
                    Some(b) => Ok((&y + b)?),
                    None => Ok(y),
                }
            }
            Linear::Quantized { weight, bias } => {
                let y = match dense_prompt() {
                    Some(d) if d.takes(x) => weight.matmul_t_dense(x, d.block_bytes)?,
                    _ => weight.matmul_t(x)?,
                };
                match bias {
                    Some(b) => Ok((&y + b)?),
                    None => Ok(y),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_core::graph;

    /// Seeded values in [-1, 1) (a linear congruential generator).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// A quantized linear of `rows x cols` (weights in `dtype` before quantizing).
    fn linear(
        rows: i32,
        cols: i32,
        mode: QuantMode,
        bits: i32,
        group: i32,
        dtype: Dtype,
    ) -> Linear {
        let w = Array::from_slice(&values((rows * cols) as usize, 7), &[rows, cols])
            .unwrap()
            .astype(dtype)
            .unwrap();
        let (weight, scales, biases) = quantized::quantize(&w, group, bits, mode, None).unwrap();
        Linear::Quantized {
            weight: QuantizedWeight {
                weight,
                scales,
                biases,
                group_size: group,
                bits,
                mode,
                lookup_dtype: None,
                symmetric: false,
            },
            bias: Some(
                Array::from_slice(&values(rows as usize, 9), &[rows])
                    .unwrap()
                    .astype(dtype)
                    .unwrap(),
            ),
        }
    }

    fn input(m: i32, cols: i32, dtype: Dtype) -> Array {
        Array::from_slice(&values((m * cols) as usize, 3), &[1, m, cols])
            .unwrap()
            .astype(dtype)
            .unwrap()
    }

    fn floats(a: &Array) -> Vec<f32> {
        a.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap()
    }

    /// The largest difference relative to the largest magnitude of `want`.
    fn rel_diff(got: &Array, want: &Array) -> f32 {
        let (g, w) = (floats(got), floats(want));
        assert_eq!(g.len(), w.len());
        let scale = w.iter().fold(0f32, |m, v| m.max(v.abs()));
        g.iter()
            .zip(&w)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
            / scale
    }

    fn counts(a: &Array) -> std::collections::BTreeMap<String, usize> {
        graph::primitive_counts(&graph::to_dot([a]).unwrap())
    }

    /// The float32 product of the weight dequantized in float32, plus the bias.
    fn reference(l: &Linear, x: &Array) -> Array {
        let Linear::Quantized {
            weight: q,
            bias: Some(b),
        } = l
        else {
            unreachable!("the tests' linears are quantized with a bias")
        };
        let f = Some(Dtype::Float32);
        let w = quantized::dequantize(
            &q.weight,
            &q.scales,
            q.biases.as_ref(),
            q.group_size,
            q.bits,
            q.mode,
            f,
            None,
        )
        .unwrap();
        let x = x.astype(Dtype::Float32).unwrap();
        let y = ops::matmul(&x, &ops::transpose_all(&w, None).unwrap(), None).unwrap();
        (&y + &b.astype(Dtype::Float32).unwrap()).unwrap()
    }

    /// Tier L3: the dense prompt linears (one block, and blocks of three rows and of one)
    /// against the float32 product of the same dequantized weight, affine 4 and 8 bits and
    /// mxfp4, float32 and bfloat16 inputs, with MLX's `quantized_matmul` (the exact path)
    /// beside them. Bounds (largest difference over the largest output): float32 1e-5
    /// (measured: 0); bfloat16 8e-3, two bfloat16 roundings (measured: 0.0034-0.0040, one
    /// rounding of the output; MLX's CPU `quantized_matmul` in bfloat16 is 0.010-0.026 from
    /// it, so the dense path must also stay within that distance plus the bound of the exact
    /// path's output: measured 0.009-0.023).
    #[test]
    fn dense_prompt_linears_are_the_float_product_within_rounding() {
        for (mode, bits, group) in [
            (QuantMode::Affine, 4, 64),
            (QuantMode::Affine, 8, 32),
            (QuantMode::Mxfp4, 4, 32),
        ] {
            for (dtype, bound) in [(Dtype::Float32, 1e-5f32), (Dtype::Bfloat16, 8e-3)] {
                let l = linear(200, 128, mode, bits, group, dtype);
                let x = input(9, 128, dtype);
                let want = l.forward(&x).unwrap();
                let exact = rel_diff(&want, &reference(&l, &x));
                // 128 columns: 512 B a float32 row, 256 B a bfloat16 one.
                for block in [DensePrompt::DEFAULT_BLOCK_BYTES, 3 * 512, 1] {
                    let d = DensePrompt::new(4, block).unwrap();
                    let got = with_dense_prompt(Some(d), || l.forward(&x)).unwrap();
                    assert_eq!(got.shape(), want.shape());
                    assert_eq!(got.dtype(), want.dtype(), "{mode:?} {dtype:?}");
                    let c = counts(&got);
                    // MLX's CPU `dequantize` is built of shifts and products.
                    assert!(c.contains_key("Matmul"), "{c:?}");
                    assert!(!c.contains_key("QuantizedMatmul"), "{c:?}");
                    let what = format!("{mode:?} {bits} {dtype:?} block {block}");
                    let r = rel_diff(&got, &reference(&l, &x));
                    assert!(r <= bound, "{what}: {r} from float32 > {bound}");
                    let e = rel_diff(&got, &want);
                    assert!(
                        e <= exact + bound,
                        "{what}: {e} from the exact path > {exact} + {bound}"
                    );
                }
            }
        }
    }

    /// Without the setting, and with it for inputs of fewer rows than its threshold, a
    /// quantized linear builds MLX's `quantized_matmul` graph and gives its bits; the setting
    /// ends with its scope.
    #[test]
    fn below_the_threshold_or_without_the_setting_the_graph_is_unchanged() {
        let l = linear(64, 128, QuantMode::Affine, 4, 64, Dtype::Bfloat16);
        let x = input(3, 128, Dtype::Bfloat16);
        let exact = l.forward(&x).unwrap();
        let exact_counts = counts(&exact);
        let d = DensePrompt::new(4, 1 << 20).unwrap();
        let below = with_dense_prompt(Some(d), || l.forward(&x)).unwrap();
        let off = with_dense_prompt(None, || l.forward(&x)).unwrap();
        assert_eq!(dense_prompt(), None, "the setting ends with its scope");
        let after = l.forward(&x).unwrap();
        assert_eq!(exact_counts.get("QuantizedMatmul"), Some(&1));
        assert!(!exact_counts.contains_key("Matmul"));
        for a in [&below, &off, &after] {
            assert_eq!(counts(a), exact_counts);
        }
        for a in [&below, &off, &after] {
            assert_eq!(floats(a), floats(&exact));
        }
        // Nested scopes restore the outer setting.
        with_dense_prompt(Some(d), || {
            with_dense_prompt(None, || assert_eq!(dense_prompt(), None));
            assert_eq!(dense_prompt(), Some(d));
        });
    }

    #[test]
    fn a_dense_prompt_setting_of_zero_is_an_error() {
        for (rows, block) in [(0, 1), (1, 0)] {
            let e = DensePrompt::new(rows, block).unwrap_err().to_string();
            assert!(e.contains("must be at least 1"), "{e}");
        }
        let d = DensePrompt::new(5, 7).unwrap();
        assert_eq!((d.min_rows(), d.block_bytes()), (5, 7));
    }
}

//! Strict weight loading: every tensor a model asks for must exist with the right shape, and
//! every tensor in the files must be used. All problems are reported together, sorted.

use std::collections::{BTreeMap, BTreeSet};

use mlx_core::prelude::*;

use crate::config::{QuantConfig, QuantParams};
use crate::error::{ModelError, Result};

/// How many problems [`Weights::finish`] lists before summarising the rest (the shared
/// listing of `mlx-core`).
pub use mlx_core::{cap_listing, MAX_LISTED_PROBLEMS};

/// Tensor names and shapes: [`Weights::taken_shapes`], the parameters of a built model.
pub type ParamShapes = BTreeMap<String, Vec<i32>>;

/// The tensors of a checkpoint, consumed by name while a model is built.
pub struct Weights {
    tensors: BTreeMap<String, Array>,
    used: BTreeSet<String>,
    missing: BTreeSet<String>,
    misshaped: Vec<String>,
    quant: Option<QuantConfig>,
    dtype: Option<Dtype>,
    /// What a missing tensor is replaced by while building goes on: one shared scalar, so a
    /// config asking for far more tensors than the files hold allocates nothing per tensor.
    placeholder: Option<Array>,
    /// Every array handed out by `take`/`take_any` (after the dtype cast), for
    /// [`Weights::taken_arrays`].
    taken: Vec<Array>,
    /// The name of each array of `taken`, in the same order.
    taken_names: Vec<String>,
    /// Every module that asked [`Weights::quantization`] (the modules mlx-lm's `nn.quantize`
    /// can quantize: linear, embedding and switch layers), in the order they asked, with
    /// their input width and how they are quantized.
    quantizable: Vec<QuantizableModule>,
    /// Load the checkpoint's multi-token-prediction layers too ([`Weights::with_mtp`]).
    mtp: bool,
    /// Weights kept as GGML blocks (`<path>.weight` names; [`Weights::with_ggml`]).
    ggml: BTreeMap<String, crate::layers::GgmlWeight>,
    /// Linear layers' quantization scales and biases keep their stored dtype under a `dtype`
    /// cast ([`Weights::keep_linear_scales`]).
    keep_linear_scales: bool,
    /// Names of biases held as the lazy product of their scales ([`Weights::with_symmetric`]).
    symmetric: BTreeSet<String>,
}

/// A module that can be quantized (it has mlx's `to_quantized`), as [`Weights`] saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizableModule {
    /// The module's path (`model.layers.0.self_attn.q_proj`).
    pub path: String,
    /// Its input width (the last axis of the unpacked weight).
    pub in_dims: i32,
    /// How it is stored: `None` for a dense weight.
    pub quantized: Option<QuantParams>,
    /// A plain linear layer (`nn.Linear`): what trellis quantization codes.
    pub linear: bool,
}

impl Weights {
    /// `dtype`: cast every floating tensor to it as it is taken (None keeps stored dtypes).
    pub fn new(
        tensors: BTreeMap<String, Array>,
        quant: Option<QuantConfig>,
        dtype: Option<Dtype>,
    ) -> Self {
        Weights {
            tensors,
            used: BTreeSet::new(),
            missing: BTreeSet::new(),
            misshaped: Vec::new(),
            quant,
            dtype,
            placeholder: None,
            taken: Vec::new(),
            taken_names: Vec::new(),
            quantizable: Vec::new(),
            mtp: false,
            ggml: BTreeMap::new(),
            keep_linear_scales: false,
            symmetric: BTreeSet::new(),
        }
    }

    /// Marks the quantization biases `names` (`<path>.biases`) as symmetric: each tensor is
    /// the unevaluated MLX product `-2^(bits - 1) x <path>.scales` (a GGUF file's Q4_0 / Q8_0
    /// read for the CPU decoder: `crate::gguf::GgufModel::symmetric`). The layers taking
    /// them say so ([`crate::layers::QuantizedWeight::symmetric`]), and building the model
    /// leaves them unevaluated ([`Weights::eager_arrays`]): the MLX forward computes them where
    /// it first uses them, the CPU decoder never does.
    pub fn with_symmetric(mut self, names: BTreeSet<String>) -> Self {
        self.symmetric = names;
        self
    }

    /// Whether the tensor `name` is a symmetric matrix's lazy biases
    /// ([`Weights::with_symmetric`]).
    pub fn is_symmetric_biases(&self, name: &str) -> bool {
        self.symmetric.contains(name)
    }

    /// Linear layers' quantization scales and biases keep their stored dtype (a GGUF file's
    /// half-precision Q4_0 / Q4_1 / Q8_0 scales) when the other floating tensors are cast:
    /// the loading for the CPU decoder (`GgufTensors::Blocks`, and an HF directory's
    /// float16/bfloat16 scales through `load::load_model_dir_as`), whose kernels read the
    /// half-precision scales in place (a sixth fewer bytes a decode step for 4-bit rows in
    /// groups of 32). MLX's `quantized_matmul` gives the same bits with either (it widens
    /// the scales to the input's dtype, exactly). Quantized embeddings keep theirs too
    /// ([`crate::layers::QuantizedWeight::load_embedding`]): their lookup (`dequantize`, which
    /// computes in the scales' dtype) widens the gathered rows first, so no float32 copy of
    /// the table's scales is made.
    pub fn keep_linear_scales(mut self) -> Self {
        self.keep_linear_scales = true;
        self
    }

    /// Whether scales keep their stored dtype: [`Weights::keep_linear_scales`] was asked for
    /// and the cast is to float32 (or there is none). A half-precision cast keeps casting them:
    /// MLX's `quantized_matmul` promotes a float16 input with bfloat16 scales (or the reverse)
    /// to float32, which would change the MLX forward's numbers and dtype, while a float32
    /// input widens half scales exactly.
    pub fn keeps_linear_scales(&self) -> bool {
        self.keep_linear_scales && self.dtype.is_none_or(|d| d == Dtype::Float32)
    }

    /// The dtype floating tensors are cast to as they are taken (`None`: stored dtypes).
    pub fn cast_dtype(&self) -> Option<Dtype> {
        self.dtype
    }

    /// [`Weights::take`] for a quantized linear layer's scales or biases: uncast under
    /// [`Weights::keep_linear_scales`].
    pub fn take_linear_scales(&mut self, name: &str, shape: &[i32]) -> Result<Array> {
        if !self.keeps_linear_scales() {
            return self.take(name, shape);
        }
        let dtype = self.dtype.take();
        let a = self.take(name, shape);
        self.dtype = dtype;
        a
    }

    /// Adds weights kept as GGML blocks (a GGUF file read with `GgufTensors::Blocks`), by
    /// `<path>.weight` name: the linear and embedding layers at those paths take them
    /// ([`Weights::take_ggml`]).
    pub fn with_ggml(mut self, ggml: BTreeMap<String, crate::layers::GgmlWeight>) -> Self {
        self.ggml = ggml;
        self
    }

    /// The GGML-block weight `name` of logical shape `(rows, cols)`, if one was given (a
    /// different shape is recorded for [`Weights::finish`]).
    pub fn take_ggml(
        &mut self,
        name: &str,
        rows: i32,
        cols: i32,
    ) -> Result<Option<crate::layers::GgmlWeight>> {
        let Some(g) = self.ggml.get(name) else {
            return Ok(None);
        };
        let g = g.clone();
        self.used.insert(name.to_string());
        if (g.rows, g.cols) != (rows, cols) {
            self.misshaped.push(format!(
                "{name}: shape [{}, {}], expected [{rows}, {cols}]",
                g.rows, g.cols
            ));
        }
        Ok(Some(g))
    }

    /// Opt in to the multi-token-prediction layers a checkpoint carries (DeepSeek V3 /
    /// GLM-4.5 layers past `num_hidden_layers`, Qwen3-Next `mtp.*`): the architectures that
    /// know them load them as a drafter instead of dropping them (mlx-lm drops them).
    pub fn with_mtp(mut self, on: bool) -> Self {
        self.mtp = on;
        self
    }

    /// Whether [`Weights::with_mtp`] asked for the multi-token-prediction layers.
    pub fn mtp(&self) -> bool {
        self.mtp
    }

    /// One more than the highest `<prefix><i>.` index among the tensor names (0 if none):
    /// how many layers the files hold tensors for.
    /// How many numbered layers the stored tensors hold: one past the largest `N` in a name
    /// part `layers.N.`, `h.N.`, `blocks.N.` or `layer.N.` (each architecture's naming, before
    /// or after its `sanitize`).
    pub fn layers_present(&self) -> usize {
        self.tensors
            .keys()
            .filter_map(|k| {
                let parts: Vec<&str> = k.split('.').collect();
                parts
                    .windows(2)
                    .filter(|w| matches!(w[0], "layers" | "h" | "blocks" | "layer"))
                    .filter_map(|w| w[1].parse::<usize>().ok())
                    .max()
            })
            .max()
            .map_or(0, |i| i + 1)
    }

    fn missing_placeholder(&mut self, name: &str) -> Result<Array> {
        self.missing.insert(name.to_string());
        match &self.placeholder {
            Some(p) => Ok(p.clone()),
            None => {
                let p = Array::from_f32(0.0, Dtype::Float32)?;
                self.placeholder = Some(p.clone());
                Ok(p)
            }
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The stored shape of a tensor, if present.
    pub fn shape_of(&self, name: &str) -> Option<Vec<i32>> {
        self.tensors.get(name).map(Array::shape)
    }

    /// The stored dtype of a tensor, if present.
    pub fn dtype_of(&self, name: &str) -> Option<Dtype> {
        self.tensors.get(name).map(Array::dtype)
    }

    fn cast(&self, a: Array) -> Result<Array> {
        match self.dtype {
            Some(d) if a.dtype().is_floating() && a.dtype() != d => Ok(a.astype(d)?),
            _ => Ok(a),
        }
    }

    /// Takes a required tensor of `shape`; a missing or mis-shaped tensor is recorded (and
    /// reported by [`Weights::finish`]) and a placeholder returned so building can go on.
    pub fn take(&mut self, name: &str, shape: &[i32]) -> Result<Array> {
        match self.tensors.get(name) {
            None => self.missing_placeholder(name),
            Some(a) => {
                let a = a.clone();
                self.used.insert(name.to_string());
                if a.shape() != shape {
                    self.misshaped
                        .push(format!("{name}: shape {:?}, expected {shape:?}", a.shape()));
                }
                let a = self.cast(a)?;
                self.taken.push(a.clone());
                self.taken_names.push(name.to_string());
                Ok(a)
            }
        }
    }

    /// The tensors taken so far with their stored shapes. Once a model is built, these are the
    /// parameters of mlx-lm's module tree for the same checkpoint (names after `sanitize`, as
    /// strict loading matches them on both sides): what `--seed` counts initialiser draws from.
    pub fn taken_shapes(&self) -> ParamShapes {
        self.used
            .iter()
            .filter_map(|n| self.tensors.get(n).map(|a| (n.clone(), a.shape())))
            .collect()
    }

    /// The arrays taken so far, as handed out (lazy: the files are read when they are
    /// evaluated). Evaluating them once the model is built is mlx-lm's `load_model` with
    /// `lazy=False` (`mx.eval(model.parameters())`): the weights are read at load, not inside
    /// the first forward, whose time to first token would otherwise include reading the files.
    pub fn taken_arrays(&self) -> &[Array] {
        &self.taken
    }

    /// [`Weights::taken_arrays`] less the symmetric biases ([`Weights::with_symmetric`]):
    /// what building a model evaluates.
    pub fn eager_arrays(&self) -> Vec<Array> {
        self.taken_names
            .iter()
            .zip(&self.taken)
            .filter(|(n, _)| !self.symmetric.contains(n.as_str()))
            .map(|(_, a)| a.clone())
            .collect()
    }

    /// The arrays taken so far with their names, in the order they were taken (a name taken
    /// twice appears once, at its first place).
    pub fn taken_named(&self) -> Vec<(String, Array)> {
        let mut seen = BTreeSet::new();
        self.taken_names
            .iter()
            .zip(&self.taken)
            .filter(|(n, _)| seen.insert(n.as_str()))
            .map(|(n, a)| (n.clone(), a.clone()))
            .collect()
    }

    /// Every module that asked [`Weights::quantization`], in order (see
    /// [`QuantizableModule`]).
    pub fn quantizable(&self) -> &[QuantizableModule] {
        &self.quantizable
    }

    /// Takes a tensor whose shape the model cannot know in advance (packed weights).
    pub fn take_any(&mut self, name: &str) -> Result<Array> {
        match self.tensors.get(name) {
            None => self.missing_placeholder(name),
            Some(a) => {
                let a = a.clone();
                self.used.insert(name.to_string());
                let a = self.cast(a)?;
                self.taken.push(a.clone());
                self.taken_names.push(name.to_string());
                Ok(a)
            }
        }
    }

    /// Drops a tensor the model does not use (mlx-lm's `sanitize` removals).
    pub fn discard(&mut self, name: &str) {
        if self.tensors.remove(name).is_some() {
            self.used.remove(name);
        }
    }

    /// Drops every tensor whose name starts with `prefix` (sanitize removals of whole modules).
    pub fn discard_prefix(&mut self, prefix: &str) {
        let names: Vec<String> = self
            .tensors
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect();
        for n in names {
            self.discard(&n);
        }
    }

    /// Drops every tensor of `model.layers.{i}` with `i >= n` (a checkpoint's MTP or extra
    /// layers after the model's own).
    pub fn discard_layers_from(&mut self, n: i32) {
        for name in self.names() {
            let layer = name
                .strip_prefix("model.layers.")
                .and_then(|r| r.split('.').next())
                .and_then(|i| i.parse::<i32>().ok());
            if layer.is_some_and(|i| i >= n) {
                self.discard(&name);
            }
        }
    }

    /// Moves tensor `from` to `to` when present (a checkpoint's name to mlx-lm's).
    pub fn rename(&mut self, from: &str, to: String) {
        if let Some(t) = self.remove(from) {
            self.insert(to, t);
        }
    }

    /// Renames every tensor under `prefix` to the name without it (a wrapper's
    /// `language_model.`).
    pub fn strip_prefix(&mut self, prefix: &str) {
        let names: Vec<String> = self
            .tensors
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect();
        for n in names {
            if let Some(a) = self.tensors.remove(&n) {
                self.tensors.insert(n[prefix.len()..].to_string(), a);
            }
        }
    }

    /// Renames every stored tensor with `f` (`None` drops it): mlx-lm `sanitize` rules that
    /// turn a Hugging Face checkpoint's names into the model's.
    pub fn rename_all(&mut self, f: impl Fn(&str) -> Option<String>) -> Result<()> {
        let old = std::mem::take(&mut self.tensors);
        for (k, v) in old {
            if let Some(n) = f(&k) {
                if self.tensors.insert(n.clone(), v).is_some() {
                    return Err(ModelError::Weights(vec![format!(
                        "two tensors map to {n} (one of them is {k})"
                    )]));
                }
            }
        }
        Ok(())
    }

    /// Replaces a stored tensor by `f(tensor)` (e.g. a Conv1D weight transposed).
    pub fn map_tensor(&mut self, name: &str, f: impl Fn(&Array) -> Result<Array>) -> Result<()> {
        if let Some(a) = self.tensors.get(name) {
            let b = f(a)?;
            self.tensors.insert(name.to_string(), b);
        }
        Ok(())
    }

    /// Removes and returns a stored tensor (for `sanitize` steps that rebuild tensors).
    pub fn remove(&mut self, name: &str) -> Option<Array> {
        self.used.remove(name);
        self.tensors.remove(name)
    }

    /// The names of every stored tensor, sorted.
    pub fn names(&self) -> Vec<String> {
        self.tensors.keys().cloned().collect()
    }

    /// Adds (or replaces) a tensor, as a `sanitize` step that renames or stacks does.
    pub fn insert(&mut self, name: String, value: Array) {
        self.tensors.insert(name, value);
    }

    /// Records a shape problem found by a layer.
    pub fn report(&mut self, problem: String) {
        self.misshaped.push(problem);
    }

    /// How the module at `path` (e.g. `model.layers.0.self_attn.q_proj`) is quantized, as
    /// mlx-lm decides: a per-module entry in the config wins; otherwise a module is quantized
    /// when `<path>.scales` exists, with group size and bits inferred from the shapes
    /// (`infer_quant_config`).
    pub fn quantization(&mut self, path: &str, in_dims: i32) -> Result<Option<QuantParams>> {
        self.record_quantization(path, in_dims, false)
    }

    /// [`Weights::quantization`] for a plain linear layer (recorded as one).
    pub fn linear_quantization(&mut self, path: &str, in_dims: i32) -> Result<Option<QuantParams>> {
        self.record_quantization(path, in_dims, true)
    }

    fn record_quantization(
        &mut self,
        path: &str,
        in_dims: i32,
        linear: bool,
    ) -> Result<Option<QuantParams>> {
        let q = self.infer_quantization(path, in_dims)?;
        if let (Some(t), false) = (q.as_ref().and_then(|q| q.trellis.as_ref()), linear) {
            let _ = t;
            return Err(ModelError::Config(format!(
                "{path}: only linear layers can be trellis-coded (give this module an affine \
                 entry in the quantization block)"
            )));
        }
        self.quantizable.push(QuantizableModule {
            path: path.to_string(),
            in_dims,
            quantized: q.clone(),
            linear,
        });
        Ok(q)
    }

    fn infer_quantization(&self, path: &str, in_dims: i32) -> Result<Option<QuantParams>> {
        if let Some(q) = &self.quant {
            // mlx-lm names a wrapper's modules `language_model.` + the text model's path
            // (what `mlx convert` writes for those types too).
            let wrapped = format!("language_model.{path}");
            if let Some(o) = q.overrides.get(path).or_else(|| q.overrides.get(&wrapped)) {
                return Ok(o.clone());
            }
        }
        let Some(scales) = self.tensors.get(&format!("{path}.scales")) else {
            return Ok(None);
        };
        // A trellis model's modules are the block's trellis entry (their shapes are checked
        // when the layer loads).
        if let Some(q) = self.quant.as_ref().filter(|q| q.default.trellis.is_some()) {
            return Ok(Some(q.default.clone()));
        }
        let weight = self.tensors.get(&format!("{path}.weight")).ok_or_else(|| {
            ModelError::Weights(vec![format!(
                "{path}.scales present but {path}.weight missing"
            )])
        })?;
        let (s_last, w_last) = (
            scales.shape().last().copied().unwrap_or(0),
            weight.shape().last().copied().unwrap_or(0),
        );
        if s_last == 0 || in_dims == 0 {
            return Err(ModelError::Weights(vec![format!(
                "{path}: empty quantization scales"
            )]));
        }
        let group_size = in_dims / s_last;
        let bits = i32::try_from(i64::from(w_last) * 32 / i64::from(in_dims)).unwrap_or(i32::MAX);
        let mode = if scales.dtype() != Dtype::Uint8 {
            "affine"
        } else {
            match (bits, group_size) {
                (4, 16) => "nvfp4",
                (4, 32) => "mxfp4",
                (8, 32) => "mxfp8",
                _ => {
                    return Err(ModelError::Weights(vec![format!(
                        "{path}: cannot infer the quantization mode of {bits} bits with group size {group_size}"
                    )]))
                }
            }
        };
        let q = QuantParams {
            group_size,
            bits,
            mode: mode.to_string(),
            trellis: None,
        };
        q.validate().map_err(|m| {
            ModelError::Weights(vec![format!(
                "{path}: quantization inferred from the shapes of {path}.weight and \
                 {path}.scales: {m}"
            )])
        })?;
        Ok(Some(q))
    }

    /// Ends loading: an error listing the missing, unexpected and mis-shaped tensors (sorted;
    /// the first [`MAX_LISTED_PROBLEMS`], then how many more).
    pub fn finish(self) -> Result<()> {
        let mut problems: Vec<String> = self
            .missing
            .iter()
            .map(|n| format!("missing: {n}"))
            .collect();
        let mut unexpected: Vec<String> = self
            .tensors
            .keys()
            .chain(self.ggml.keys())
            .filter(|k| !self.used.contains(*k))
            .map(|k| format!("unexpected: {k}"))
            .collect();
        problems.append(&mut unexpected);
        let mut mis: Vec<String> = self
            .misshaped
            .iter()
            .map(|m| format!("wrong shape: {m}"))
            .collect();
        problems.append(&mut mis);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ModelError::Weights(cap_listing(problems)))
        }
    }
}

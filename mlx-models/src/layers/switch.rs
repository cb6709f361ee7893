//! mlx-lm 0.32.2 `models/switch_layers.py`: per-expert linears over `gather_mm` /
//! `gather_qmm` (`SwitchLinear`, `QuantizedSwitchLinear`) and the expert MLP (`SwitchGLU`),
//! with mlx-lm's sorting of tokens by expert when 64 or more (token, expert) pairs are routed.

use mlx_core::prelude::*;
use mlx_core::quantized::QuantMode;

use crate::error::{ModelError, Result};
use crate::layers::activations::{geglu, gelu_approx, relu2, silu, swiglu, swiglu_oai};
use crate::layers::linear::{quant_mode, QuantizedWeight};
use crate::layers::LayerParam;
use crate::weights::Weights;

/// A layer that replaces a [`SwitchLinear`] in a model (mlx-lm's `LoRASwitchLinear`, in
/// `mlx-train`), as [`crate::layers::LinearAdapter`] replaces a linear.
pub trait SwitchAdapter: Send + std::fmt::Debug {
    /// `__call__(x, indices, sorted_indices)`.
    fn forward(&self, x: &Array, indices: &Array, sorted_indices: bool) -> Result<Array>;
    fn clone_box(&self) -> Box<dyn SwitchAdapter>;
    /// The wrapped layer.
    fn base(&self) -> &SwitchLinear;
    /// For downcasting to the concrete adapter.
    fn as_any(&self) -> &dyn std::any::Any;
    /// The adapter's trainable arrays (inputs of per-layer gradient checkpoints).
    fn parameters(&self) -> Result<Vec<Array>>;
    /// Replaces the arrays [`SwitchAdapter::parameters`] returned (same order).
    fn set_parameters(&self, values: &[Array]) -> Result<()>;
}

impl Clone for Box<dyn SwitchAdapter> {
    fn clone(&self) -> Self {
        self.clone_box()
    }
}

/// `SwitchLinear` / `QuantizedSwitchLinear`: `num_experts` stacked `(out, in)` matrices; each
/// row of `x` is multiplied by the expert its index names. Or an adapter standing in for one.
#[derive(Clone, Debug)]
pub enum SwitchLinear {
    Dense {
        /// `(experts, out, in)`.
        weight: Array,
        bias: Option<Array>,
    },
    Quantized {
        /// Packed `(experts, out, in * bits / 32)` with `(experts, out, in / group)` scales.
        weight: QuantizedWeight,
        bias: Option<Array>,
    },
    Adapted(Box<dyn SwitchAdapter>),
}

impl SwitchLinear {
    /// Loads `<path>.weight` (plus `.scales`/`.biases` when quantized, `.bias` when `bias`).
    pub fn load(
        w: &mut Weights,
        path: &str,
        in_dims: i32,
        out_dims: i32,
        num_experts: i32,
        bias: bool,
    ) -> Result<SwitchLinear> {
        let b = if bias {
            Some(w.take(&format!("{path}.bias"), &[num_experts, out_dims])?)
        } else {
            None
        };
        match w.quantization(path, in_dims)? {
            None => Ok(SwitchLinear::Dense {
                weight: w.take(&format!("{path}.weight"), &[num_experts, out_dims, in_dims])?,
                bias: b,
            }),
            Some(q) => {
                let mode = quant_mode(&q.mode)?;
                if q.bits <= 0
                    || q.group_size <= 0
                    || (in_dims * q.bits) % 32 != 0
                    || in_dims % q.group_size != 0
                {
                    return Err(ModelError::Config(format!(
                        "{path}: {in_dims} columns cannot be packed with {} bits in groups of {}",
                        q.bits, q.group_size
                    )));
                }
                let groups = [num_experts, out_dims, in_dims / q.group_size];
                let weight = w.take(
                    &format!("{path}.weight"),
                    &[num_experts, out_dims, in_dims * q.bits / 32],
                )?;
                let scales = w.take(&format!("{path}.scales"), &groups)?;
                let biases = if mode == QuantMode::Affine {
                    Some(w.take(&format!("{path}.biases"), &groups)?)
                } else {
                    None
                };
                Ok(SwitchLinear::Quantized {
                    weight: QuantizedWeight {
                        weight,
                        scales,
                        biases,
                        group_size: q.group_size,
                        bits: q.bits,
                        mode,
                        lookup_dtype: None,
                        symmetric: false,
                    },
                    bias: b,
                })
            }
        }
    }

    /// `(num_experts, output_dims, input_dims)` of the logical (dequantized) weight.
    pub fn dims(&self) -> (i32, i32, i32) {
        match self {
            SwitchLinear::Dense { weight, .. } => {
                let s = weight.shape();
                (s[0], s[1], s[2])
            }
            SwitchLinear::Quantized { weight, .. } => {
                let s = weight.weight.shape();
                (s[0], s[1], s[2] * 32 / weight.bits)
            }
            SwitchLinear::Adapted(a) => a.base().dims(),
        }
    }

    /// The layer's arrays under `path` as mlx names them (full fine-tuning): `weight`,
    /// `bias`; a quantized layer's (`weight`, `scales`, `biases`, `bias`) marked quantized.
    /// An adapted layer has none of its own (its adapter's arrays train instead).
    pub fn parameters_mut<'a>(&'a mut self, path: &str, out: &mut Vec<LayerParam<'a>>) {
        let (bias, quantized) = match self {
            SwitchLinear::Adapted(_) => return,
            SwitchLinear::Dense { weight, bias } => {
                LayerParam::push(out, path, "weight", weight, false);
                (bias, false)
            }
            SwitchLinear::Quantized { weight, bias } => {
                weight.parameters_mut(path, out);
                (bias, true)
            }
        };
        if let Some(b) = bias {
            LayerParam::push(out, path, "bias", b, quantized);
        }
    }

    /// `SwitchLinear.__call__(x, indices, sorted_indices)`.
    pub fn forward(&self, x: &Array, indices: &Array, sorted_indices: bool) -> Result<Array> {
        let (y, bias) = match self {
            SwitchLinear::Adapted(a) => return a.forward(x, indices, sorted_indices),
            SwitchLinear::Dense { weight, bias } => (
                quantized::gather_mm(
                    x,
                    &ops::swapaxes(weight, -1, -2, None)?,
                    None,
                    Some(indices),
                    sorted_indices,
                    None,
                )?,
                bias,
            ),
            SwitchLinear::Quantized { weight: q, bias } => (
                quantized::gather_qmm(
                    x,
                    &q.weight,
                    &q.scales,
                    q.biases.as_ref(),
                    None,
                    Some(indices),
                    true,
                    q.group_size,
                    q.bits,
                    q.mode,
                    sorted_indices,
                    None,
                )?,
                bias,
            ),
        };
        match bias {
            Some(b) => {
                Ok((&y + &ops::expand_dims(&ops::take(b, indices, 0, None)?, &[-2], None)?)?)
            }
            None => Ok(y),
        }
    }
}

/// The activation between the up/gate and down projections of a [`SwitchGlu`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SwitchActivation {
    /// mlx-lm's `SwiGLU()`: `silu(gate) * up`.
    SwiGlu,
    /// gpt_oss's `SwigluOAI` (`swiglu_oai`, alpha 1.702, limit 7): the gate clipped from
    /// above, the linear part clipped both ways and offset by one.
    SwiGluOai,
    /// gemma4's `GeGLU`: `gelu_approx(gate) * up`.
    GeGlu,
    /// step3p5's `ClampedSwiGLU(limit)`: `min(silu(gate), limit) * clip(up, -limit, limit)`.
    ClampedSwiGlu(f32),
}

impl SwitchActivation {
    /// `activation(x_up, x_gate)`.
    fn apply(self, up: &Array, gate: &Array) -> Result<Array> {
        match self {
            SwitchActivation::SwiGlu => Ok(swiglu(gate, up)?),
            SwitchActivation::GeGlu => Ok(geglu(gate, up)?),
            SwitchActivation::SwiGluOai => Ok(swiglu_oai(gate, up)?),
            SwitchActivation::ClampedSwiGlu(limit) => clamped_swiglu(up, gate, limit),
        }
    }
}

/// `SwitchGLU`: `down(activation(up(x), gate(x)))` with each token's rows sent to its experts.
#[derive(Clone, Debug)]
pub struct SwitchGlu {
    pub gate_proj: SwitchLinear,
    pub up_proj: SwitchLinear,
    pub down_proj: SwitchLinear,
    pub activation: SwitchActivation,
}

impl SwitchGlu {
    pub fn load(
        w: &mut Weights,
        path: &str,
        input_dims: i32,
        hidden_dims: i32,
        num_experts: i32,
        bias: bool,
        activation: SwitchActivation,
    ) -> Result<SwitchGlu> {
        let p = |n: &str| format!("{path}.{n}");
        Ok(SwitchGlu {
            gate_proj: SwitchLinear::load(
                w,
                &p("gate_proj"),
                input_dims,
                hidden_dims,
                num_experts,
                bias,
            )?,
            up_proj: SwitchLinear::load(
                w,
                &p("up_proj"),
                input_dims,
                hidden_dims,
                num_experts,
                bias,
            )?,
            down_proj: SwitchLinear::load(
                w,
                &p("down_proj"),
                hidden_dims,
                input_dims,
                num_experts,
                bias,
            )?,
            activation,
        })
    }

    /// The three projections under their names, in `SwitchGLU`'s declaration order.
    pub fn linears_mut(&mut self) -> [(&'static str, &mut SwitchLinear); 3] {
        let SwitchGlu {
            gate_proj,
            up_proj,
            down_proj,
            ..
        } = self;
        [
            ("gate_proj", gate_proj),
            ("up_proj", up_proj),
            ("down_proj", down_proj),
        ]
    }

    /// `x` of shape `(..., dims)` and `indices` `(..., k)` to `(..., k, dims)`.
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        self.forward_with(x, indices, |up, gate| self.activation.apply(up, gate))
    }

    /// [`SwitchGlu::forward`] with the activation `act(x_up, x_gate)` given by the caller
    /// (kimi_k3's SiTU, whose constants would widen [`SwitchActivation`]).
    pub fn forward_with(
        &self,
        x: &Array,
        indices: &Array,
        act: impl Fn(&Array, &Array) -> Result<Array>,
    ) -> Result<Array> {
        routed(x, indices, |x, idx, do_sort| {
            let x_up = self.up_proj.forward(x, idx, do_sort)?;
            let x_gate = self.gate_proj.forward(x, idx, do_sort)?;
            self.down_proj.forward(&act(&x_up, &x_gate)?, idx, do_sort)
        })
    }
}

/// `SwitchMLP` (phixtral): `fc2(gelu_approx(fc1(x)))` per expert (mlx-lm's default activation
/// `nn.GELU(approx="precise")` is the tanh approximation); nemotron_h's `activation=nn.ReLU2()`
/// when `relu2`.
#[derive(Clone, Debug)]
pub struct SwitchMlp {
    pub fc1: SwitchLinear,
    pub fc2: SwitchLinear,
    pub relu2: bool,
}

impl SwitchMlp {
    pub fn load(
        w: &mut Weights,
        path: &str,
        input_dims: i32,
        hidden_dims: i32,
        num_experts: i32,
        bias: bool,
    ) -> Result<SwitchMlp> {
        Ok(SwitchMlp {
            fc1: SwitchLinear::load(
                w,
                &format!("{path}.fc1"),
                input_dims,
                hidden_dims,
                num_experts,
                bias,
            )?,
            fc2: SwitchLinear::load(
                w,
                &format!("{path}.fc2"),
                hidden_dims,
                input_dims,
                num_experts,
                bias,
            )?,
            relu2: false,
        })
    }

    /// `x` of shape `(..., dims)` and `indices` `(..., k)` to `(..., k, dims)`.
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        routed(x, indices, |x, idx, do_sort| {
            let h = self.fc1.forward(x, idx, do_sort)?;
            let h = if self.relu2 {
                relu2(&h)?
            } else {
                gelu_approx(&h)?
            };
            self.fc2.forward(&h, idx, do_sort)
        })
    }
}

/// The routing both switch MLPs share: `x` expanded to `(..., 1, 1, dims)`, the (token,
/// expert) pairs sorted by expert when there are 64 or more, `experts(x, indices, sorted)`,
/// the rows put back in order and the singleton axis squeezed.
fn routed(
    x: &Array,
    indices: &Array,
    experts: impl FnOnce(&Array, &Array, bool) -> Result<Array>,
) -> Result<Array> {
    let x = ops::expand_dims(x, &[-2, -3], None)?;
    let indices = ops::stop_gradient(indices, None)?;
    let do_sort = indices.size() >= 64;
    let (x, idx, inv_order) = if do_sort {
        let (x, idx, inv) = gather_sort(&x, &indices)?;
        (x, idx, Some(inv))
    } else {
        (x, indices.clone(), None)
    };
    let mut x = experts(&x, &idx, do_sort)?;
    if let Some(inv) = inv_order {
        x = ops::unflatten(&ops::take(&x, &inv, 0, None)?, 0, &indices.shape(), None)?;
    }
    Ok(ops::squeeze(&x, &[-2], None)?)
}

/// `_gather_sort`: token rows ordered by expert, the sorted indices, and the inverse order.
fn gather_sort(x: &Array, indices: &Array) -> Result<(Array, Array, Array)> {
    let m = indices.shape().last().copied().unwrap_or(1);
    let flat = ops::flatten(indices, 0, -1, None)?;
    let order = ops::argsort(&flat, -1, None)?;
    let inv_order = ops::argsort(&order, -1, None)?;
    let rows = ops::floor_divide_scalar(&order, i64::from(m), None)?;
    Ok((
        ops::take(&ops::flatten(x, 0, -3, None)?, &rows, 0, None)?,
        ops::take(&flat, &order, 0, None)?,
        inv_order,
    ))
}

/// step3p5's `clamped_swiglu(x, gate, limit)`: `clip(silu(gate), None, limit) * clip(x, -limit,
/// limit)`, the limit a weak scalar.
pub fn clamped_swiglu(x: &Array, gate: &Array, limit: f32) -> Result<Array> {
    let g = ops::clip_scalar(&silu(gate)?, None, Some(Scalar::Float(limit)), None)?;
    let x = ops::clip_scalar(
        x,
        Some(Scalar::Float(-limit)),
        Some(Scalar::Float(limit)),
        None,
    )?;
    Ok((&g * &x)?)
}

impl super::Walkable for SwitchGlu {
    /// The three projections, in `SwitchGLU`'s declaration order.
    fn walk<'a>(&'a mut self, path: &str, w: &mut super::Walk<'a>) {
        for (name, l) in self.linears_mut() {
            w.switch(&super::join(path, name), l);
        }
    }
}

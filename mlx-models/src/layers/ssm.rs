//! The state-space pieces of mlx-lm 0.32.2 (`models/ssm.py`, and the depthwise causal
//! convolution the Mamba blocks share), op for op. On the CPU, mlx-lm's `ssm_update` always
//! takes `ssm_attn` (its Metal kernel needs a GPU), so that is the L1 reference here.

use mlx_cache::{ArraysCache, Cache};
use mlx_core::fast;
use mlx_core::prelude::*;

use crate::error::{ModelError, Result};
use crate::layers::activations::{compiled, one};
use crate::layers::{silu, swiglu, Linear};
use crate::weights::Weights;

/// `nn.softplus`: `logaddexp(x, 0)` (the 0 a weak Python int), compiled shapeless as mlx.nn
/// compiles it.
pub fn softplus(x: &Array) -> Result<Array> {
    let f = compiled!(|xs: &[Array]| Ok(vec![ops::logaddexp_scalar(&xs[0], 0i32, None)?]))?;
    Ok(one(f.call(std::slice::from_ref(x))?, "softplus")?)
}

/// `compute_dt`: `clip(softplus(dt.astype(float32) + dt_bias), lo, hi)`, compiled (not
/// shapeless) as mlx-lm compiles it; the two limits (Python floats there, weak float32
/// scalars of the clip) are float32 inputs of the trace.
pub fn compute_dt(dt: &Array, dt_bias: &Array, limit: (f32, f32)) -> Result<Array> {
    let f = compiled!(
        |xs: &[Array]| {
            let x = (&xs[0].astype(Dtype::Float32)? + &xs[1])?;
            let x = ops::logaddexp_scalar(&x, 0i32, None)?;
            Ok(vec![ops::clip(&x, Some(&xs[2]), Some(&xs[3]), None)?])
        },
        shapeless = false
    )?;
    Ok(one(
        f.call(&[
            dt.clone(),
            dt_bias.clone(),
            Array::from_f32(limit.0, Dtype::Float32)?,
            Array::from_f32(limit.1, Dtype::Float32)?,
        ])?,
        "compute_dt",
    )?)
}

/// jamba's `fma(a, b, c)`: `a * b + c`, compiled (not shapeless) as mlx-lm compiles it.
pub fn fma(a: &Array, b: &Array, c: &Array) -> Result<Array> {
    let f = compiled!(
        |xs: &[Array]| Ok(vec![(&(&xs[0] * &xs[1])? + &xs[2])?]),
        shapeless = false
    )?;
    Ok(one(f.call(&[a.clone(), b.clone(), c.clone()])?, "fma")?)
}

/// `nn.Conv1d(C, C, K, groups=C)` as the Mamba blocks use it: weight `(C, K, 1)` after
/// `sanitize`, optional bias.
#[derive(Clone, Debug)]
pub struct DepthwiseConv {
    pub weight: Array,
    pub bias: Option<Array>,
    pub kernel: i32,
}

impl DepthwiseConv {
    pub fn load(
        w: &mut Weights,
        path: &str,
        channels: i32,
        kernel: i32,
        bias: bool,
    ) -> Result<DepthwiseConv> {
        Ok(DepthwiseConv {
            weight: w.take(&format!("{path}.weight"), &[channels, kernel, 1])?,
            bias: if bias {
                Some(w.take(&format!("{path}.bias"), &[channels])?)
            } else {
                None
            },
            kernel,
        })
    }

    /// The convolution's input: the cached `K - 1` steps (zeros when the cache is empty)
    /// before `x` with a cache, else `x` padded with `K - 1` zeros in front.
    pub fn padded(&self, x: &Array, state: Option<&Array>, cached: bool) -> Result<Array> {
        let n_keep = self.kernel - 1;
        if !cached {
            return Ok(ops::pad_widths(
                x,
                &[(0, 0), (n_keep, 0), (0, 0)],
                &Scalar::Int(0).to_array_like(x.dtype())?,
                "constant",
                None,
            )?);
        }
        let state = match state {
            Some(s) => s.clone(),
            None => {
                let sh = x.shape();
                ops::zeros(&[sh[0], n_keep, sh[2]], x.dtype(), None)?
            }
        };
        Ok(ops::concatenate(&[&state, x], 1, None)?)
    }

    /// The conv state after `t` of the new steps of `padded` (`padded[:, t : t + K - 1]`).
    pub fn state_after(&self, padded: &Array, t: i32) -> Result<Array> {
        Ok(padded.slice_axis(1, t, t + self.kernel - 1)?)
    }

    /// `conv1d(padded) (+ bias)`.
    pub fn forward(&self, padded: &Array) -> Result<Array> {
        let y = ops::conv1d(padded, &self.weight, 1, 0, 1, self.weight.shape()[0], None)?;
        Ok(match &self.bias {
            Some(b) => (&y + b)?,
            None => y,
        })
    }
}

/// `segsum(x, mask)`: `x` `(b, h, l)` to the `(b, h, l, l)` segment sums.
fn segsum(x: &Array, mask: Option<&Array>) -> Result<Array> {
    let l = x.shape().last().copied().unwrap_or(0);
    let mask = mask.map(|m| m.expand_dims(&[1])).transpose()?;
    let x = match &mask {
        Some(m) => (x * m)?,
        None => x.clone(),
    };
    let x = ops::repeat(&x.expand_dims(&[-1])?, l, -1, None)?;
    let x = ops::tril(&x, -1, None)?;
    let s = ops::cumsum(&x, -2, false, true, None)?;
    match &mask {
        Some(m) => {
            let keep = (&m.expand_dims(&[-2])? * &m.expand_dims(&[-1])?)?;
            Ok(ops::where_scalar(&keep, &s, f32::NEG_INFINITY, None)?)
        }
        None => Ok(s),
    }
}

/// The inputs of [`ssm_attn`] beyond `x`, `B`, `C`, `dt` and the state.
pub struct SsmParams<'a> {
    pub a_log: &'a Array,
    pub d: &'a Array,
    pub dt_bias: &'a Array,
    pub time_step_limit: (f32, f32),
}

const SSM_STEP: i32 = 256;

/// `ssm_attn` (the SSD forward, no `lengths`): `x` `(b, l, h, dh)`, `b_`/`c` `(b, l, g, n)`,
/// `dt` `(b, l, h)`, `state` `(b, h, dh, n)`; returns `y` `(b, l, h, dh)` and the next state.
pub fn ssm_attn(
    x: &Array,
    b_: &Array,
    c: &Array,
    dt: &Array,
    p: &SsmParams<'_>,
    state: Option<&Array>,
    mask: Option<&Array>,
) -> Result<(Array, Array)> {
    let sh = x.shape();
    let (b, l, h, dh) = (sh[0], sh[1], sh[2], sh[3]);
    let bsh = b_.shape();
    let (g, d) = (bsh[2], bsh[3]);
    let dt = compute_dt(dt, p.dt_bias, p.time_step_limit)?;
    let repeats = h / g;
    let a = ops::negative(&ops::exp(p.a_log, None)?.astype(dt.dtype())?, None)?;
    let mut dta = (&dt * &a.reshape(&[1, 1, -1])?)?;
    if let Some(m) = mask {
        dta = (&dta * &m.expand_dims(&[-1])?)?;
    }
    let dtx = (&dt.reshape(&[b, l, h, 1])? * x)?;

    let step = |dtx: &Array,
                dta: &Array,
                bm: &Array,
                cm: &Array,
                state: Option<&Array>,
                mask: Option<&Array>|
     -> Result<(Array, Array)> {
        let s = dtx.shape()[1];
        let bm = bm.transpose(&[0, 2, 3, 1])?;
        let cb = ops::matmul(&cm.swapaxes(1, 2)?, &bm, None)?;
        let cb = ops::repeat(&cb, repeats, 1, None)?;
        let decay = ops::exp(&segsum(&dta.swapaxes(1, 2)?, mask)?, None)?;
        let sam = ops::tril(&(&cb * &decay)?, 0, None)?;
        let y = ops::matmul(&sam, &dtx.swapaxes(1, 2)?, None)?;
        let mut y = y.swapaxes(1, 2)?;
        let last = decay.shape()[2];
        let decay = decay
            .slice_axis(2, last - 1, last)?
            .transpose(&[0, 3, 1, 2])?;
        let bm = ops::repeat(&bm, h / g, 1, None)?.swapaxes(2, 3)?;
        let dtxdecay = (dtx * &decay)?.swapaxes(1, 2)?.swapaxes(2, 3)?;
        let mut next_state = ops::matmul(&dtxdecay, &bm, None)?;
        if let Some(state) = state {
            let e = ops::exp(&ops::cumsum(dta, -2, false, true, None)?, None)?;
            let se = e.shape()[1];
            let e_last = e
                .slice_axis(1, se - 1, se)?
                .squeeze(&[1])?
                .expand_dims(&[-1, -2])?;
            next_state = (&next_state + &(&e_last * state)?)?;
            let cm = cm.reshape(&[b, s, g, 1, d, 1])?;
            let y_prev = ops::matmul(&state.reshape(&[b, 1, g, repeats, dh, d])?, &cm, None)?
                .squeeze(&[-1])?
                .flatten(2, 3)?;
            y = (&y + &(&e.expand_dims(&[-1])? * &y_prev)?)?;
        }
        Ok((y.astype(x.dtype())?, next_state))
    };

    let mut ys = Vec::new();
    let mut state = state.cloned();
    let mut i = 0;
    while i < l {
        let end = (i + SSM_STEP).min(l);
        let sl = |a: &Array| a.slice_axis(1, i, end);
        let m = mask
            .map(|m| m.slice_axis(m.ndim() as i32 - 1, i, end))
            .transpose()?;
        let (y, st) = step(
            &sl(&dtx)?,
            &sl(&dta)?,
            &sl(b_)?,
            &sl(c)?,
            state.as_ref(),
            m.as_ref(),
        )?;
        state = Some(st);
        ys.push(y);
        i = end;
    }
    let refs: Vec<&Array> = ys.iter().collect();
    let y = (&ops::concatenate(&refs, 1, None)? + &(x * &p.d.reshape(&[1, 1, h, 1])?)?)?;
    let state = match state {
        Some(s) => s,
        None => ops::zeros(&[b, h, dh, d], Dtype::Float32, None)?,
    };
    Ok((y, state))
}

/// Writes a recurrent layer's `ArraysCache` after `t` new steps: slot `k` the state of
/// convolution `k` over its padded input (`convs`), the next slot the recurrent `state` (when
/// given), then `advance(t)`. `history` (the recurrent state after each step, given when the
/// cache keeps history) is recorded first, step by step, beside the conv states after that
/// step. `contiguous`: the conv states are copied contiguous (kimi_linear's and
/// bailing_moe_v3's `mx.contiguous`).
pub(crate) fn store_recurrent(
    c: &mut ArraysCache,
    convs: &[(&DepthwiseConv, &Array)],
    t: i32,
    history: Option<Vec<Array>>,
    state: Option<Array>,
    contiguous: bool,
) -> Result<()> {
    let conv_at = |step: i32| -> Result<Vec<Option<Array>>> {
        convs
            .iter()
            .map(|(conv, p)| {
                let st = conv.state_after(p, step)?;
                Ok(Some(if contiguous {
                    ops::contiguous(&st, false, None)?
                } else {
                    st
                }))
            })
            .collect()
    };
    if let Some(states) = history {
        let steps = states
            .into_iter()
            .enumerate()
            .map(|(i, st)| {
                let mut slots = conv_at(i as i32 + 1)?;
                slots.push(Some(st));
                Ok(slots)
            })
            .collect::<Result<Vec<_>>>()?;
        c.checkpoint_steps(steps)?;
    }
    for (slot, st) in conv_at(t)?.into_iter().enumerate() {
        if let Some(st) = st {
            c.set(slot, st)?;
        }
    }
    if let Some(st) = state {
        c.set(convs.len(), st)?;
    }
    c.advance(t as usize)?;
    Ok(())
}

/// The `(B, T, D)` cache of layer `i`, downcast.
pub(crate) fn arrays_cache(
    c: Option<&mut Box<dyn Cache>>,
    i: usize,
) -> Result<Option<&mut ArraysCache>> {
    match c {
        None => Ok(None),
        Some(c) => c
            .as_any_mut()
            .downcast_mut::<ArraysCache>()
            .map(Some)
            .ok_or_else(|| ModelError::Cache {
                what: format!("layer {i}"),
                problem: "a state-space layer and needs an ArraysCache".into(),
            }),
    }
}

/// How a Mamba 2 mixer normalises its gated output.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GatedNorm {
    /// mamba2.py's `MambaRMSNormGated`: `rms_norm(swiglu(gate, y), weight, eps)`.
    Plain,
    /// nemotron_h's: `weight * rms_norm(swiglu(gate, y)` in groups of this width`)`.
    Grouped(i32),
    /// falcon_h1 with `mamba_norm_before_gate`: `swiglu(gate, rms_norm(y, weight, eps))`.
    NormThenGate,
    /// falcon_h1 without `mamba_rms_norm`: `swiglu(gate, y)`, no norm (and no weight).
    GateOnly,
}

/// The shape of a Mamba 2 mixer (each model's args read into it).
#[derive(Clone, Debug)]
pub struct Mamba2Dims {
    pub hidden_size: i32,
    pub num_heads: i32,
    pub head_dim: i32,
    pub n_groups: i32,
    pub state_size: i32,
    pub conv_kernel: i32,
    pub use_conv_bias: bool,
    /// `in_proj` bias.
    pub proj_bias: bool,
    /// `out_proj` bias.
    pub out_bias: bool,
    pub eps: f32,
    pub time_step_limit: (f32, f32),
    pub norm: GatedNorm,
    /// `D.astype(hidden_states.dtype)` before the SSM (nemotron_h).
    pub cast_d: bool,
}

/// mamba2.py's `Mamba2Block` (and nemotron_h's `NemotronHMamba2Mixer`).
#[derive(Clone)]
pub struct Mamba2Mixer {
    in_proj: Linear,
    conv1d: DepthwiseConv,
    dt_bias: Array,
    a_log: Array,
    d: Array,
    norm_weight: Option<Array>,
    norm: GatedNorm,
    eps: f32,
    cast_d: bool,
    out_proj: Linear,
    num_heads: i32,
    head_dim: i32,
    n_groups: i32,
    state_size: i32,
    intermediate: i32,
    conv_dim: i32,
    time_step_limit: (f32, f32),
}

impl Mamba2Mixer {
    pub fn load(a: &Mamba2Dims, w: &mut Weights, p: &str) -> Result<Mamba2Mixer> {
        let n = a.state_size;
        let inter = a.num_heads * a.head_dim;
        let conv_dim = inter + 2 * a.n_groups * n;
        let n_ = |s: &str| format!("{p}.{s}");
        let h = a.num_heads;
        Ok(Mamba2Mixer {
            conv1d: DepthwiseConv::load(
                w,
                &n_("conv1d"),
                conv_dim,
                a.conv_kernel,
                a.use_conv_bias,
            )?,
            in_proj: Linear::load(
                w,
                &n_("in_proj"),
                a.hidden_size,
                inter + conv_dim + h,
                a.proj_bias,
            )?,
            dt_bias: w.take(&n_("dt_bias"), &[h])?,
            a_log: w.take(&n_("A_log"), &[h])?,
            d: w.take(&n_("D"), &[h])?,
            norm_weight: if a.norm == GatedNorm::GateOnly {
                None
            } else {
                Some(w.take(&n_("norm.weight"), &[inter])?)
            },
            norm: a.norm,
            eps: a.eps,
            cast_d: a.cast_d,
            out_proj: Linear::load(w, &n_("out_proj"), inter, a.hidden_size, a.out_bias)?,
            num_heads: h,
            head_dim: a.head_dim,
            n_groups: a.n_groups,
            state_size: n,
            intermediate: inter,
            conv_dim,
            time_step_limit: a.time_step_limit,
        })
    }

    pub fn forward(
        &self,
        hs: &Array,
        mask: Option<&Array>,
        cache: Option<&mut ArraysCache>,
    ) -> Result<Array> {
        let projected = self.in_proj.forward(hs)?;
        let parts = ops::split_at(
            &projected,
            &[self.intermediate, self.intermediate + self.conv_dim],
            -1,
            None,
        )?;
        let (gate, mut conv_input, dt) = (&parts[0], parts[1].clone(), &parts[2]);
        if let Some(m) = mask {
            conv_input = ops::where_scalar(&m.expand_dims(&[-1])?, &conv_input, 0i32, None)?;
        }
        let padded = self.conv1d.padded(
            &conv_input,
            cache.as_ref().and_then(|c| c.get(0)),
            cache.is_some(),
        )?;
        let conv_out = silu(&self.conv1d.forward(&padded)?)?;
        let gn = self.n_groups * self.state_size;
        let parts = ops::split_at(
            &conv_out,
            &[self.intermediate, self.intermediate + gn],
            -1,
            None,
        )?;
        let sh = hs.shape();
        let (b, t) = (sh[0], sh[1]);
        let x = parts[0].reshape(&[b, t, self.num_heads, self.head_dim])?;
        let bm = parts[1].reshape(&[b, t, self.n_groups, self.state_size])?;
        let cm = parts[2].reshape(&[b, t, self.n_groups, self.state_size])?;
        let d_cast;
        let params = SsmParams {
            a_log: &self.a_log,
            d: if self.cast_d {
                d_cast = self.d.astype(x.dtype())?;
                &d_cast
            } else {
                &self.d
            },
            dt_bias: &self.dt_bias,
            time_step_limit: self.time_step_limit,
        };
        let state0 = cache.as_ref().and_then(|c| c.get(1)).cloned();
        let (y, state) = ssm_attn(&x, &bm, &cm, dt, &params, state0.as_ref(), mask)?;
        if let Some(c) = cache {
            if c.keeps_history() {
                // The state after each token: the last one is `state`; earlier ones (those the
                // history keeps) are the same forward over the prefix.
                let first_kept = (t as usize).saturating_sub(c.max_rollback() + 1);
                let mut steps = Vec::with_capacity(t as usize);
                for s in 1..=t {
                    let st = if s == t {
                        Some(state.clone())
                    } else if (s as usize) > first_kept {
                        let pre = |a: &Array| a.slice_axis(1, 0, s);
                        let m = mask
                            .map(|m| m.slice_axis(m.ndim() as i32 - 1, 0, s))
                            .transpose()?;
                        Some(
                            ssm_attn(
                                &pre(&x)?,
                                &pre(&bm)?,
                                &pre(&cm)?,
                                &pre(dt)?,
                                &params,
                                state0.as_ref(),
                                m.as_ref(),
                            )?
                            .1,
                        )
                    } else {
                        None
                    };
                    steps.push(vec![Some(self.conv1d.state_after(&padded, s)?), st]);
                }
                c.checkpoint_steps(steps)?;
            }
            c.set(0, self.conv1d.state_after(&padded, t)?)?;
            c.set(1, state)?;
            c.advance(t as usize)?;
        }
        let y = y.reshape(&[b, t, self.intermediate])?;
        let weight = self.norm_weight.as_ref();
        let y = match self.norm {
            GatedNorm::Plain => fast::rms_norm(&swiglu(gate, &y)?, weight, self.eps, None)?,
            GatedNorm::Grouped(g) => {
                let y = swiglu(gate, &y)?;
                let sh = y.shape();
                let mut grouped = sh[..sh.len() - 1].to_vec();
                grouped.extend([-1, g]);
                let n = fast::rms_norm(&y.reshape(&grouped)?, None, self.eps, None)?;
                let n = n.flatten(-2, -1)?;
                match weight {
                    Some(w) => (w * &n)?,
                    None => n,
                }
            }
            GatedNorm::NormThenGate => swiglu(gate, &fast::rms_norm(&y, weight, self.eps, None)?)?,
            GatedNorm::GateOnly => swiglu(gate, &y)?,
        };
        self.out_proj.forward(&y)
    }
}

//! The state-space pieces of mlx-lm 0.32.2 (`models/ssm.py`, and the depthwise causal
//! convolution the Mamba blocks share), op for op. On the CPU, mlx-lm's `ssm_update` always
//! takes `ssm_attn` (its Metal kernel needs a GPU), so that is the L1 reference here.

use mlx_core::prelude::*;

use crate::error::Result;
use crate::layers::activations::{compiled, one};
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

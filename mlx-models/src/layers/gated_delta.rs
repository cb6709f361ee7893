//! mlx-lm 0.32.2 `models/gated_delta.py`, the plain-ops path (`gated_delta_ops`) that mlx-lm
//! runs off Apple GPUs (CPU and CUDA): the L1 reference for Qwen3-Next / Qwen3.5's Gated
//! DeltaNet. Also the gated RMS norm (`Qwen3NextRMSNormGated`).

use mlx_core::prelude::*;

use crate::error::{ModelError, Result};
use crate::layers::activations::{compiled, one, precise_swiglu};
use crate::weights::Weights;

/// `compute_g`: `exp(-exp(A_log.astype(float32)) * softplus(a + dt_bias))`, compiled shapeless
/// as mlx-lm compiles it.
pub fn compute_g(a_log: &Array, a: &Array, dt_bias: &Array) -> Result<Array> {
    let f = compiled!(|xs: &[Array]| {
        let (a_log, a, dt_bias) = (&xs[0], &xs[1], &xs[2]);
        let neg_decay = ops::negative(&ops::exp(&a_log.astype(Dtype::Float32)?, None)?, None)?;
        // nn.softplus(x) = logaddexp(x, 0), the 0 a weak Python int.
        let softplus = ops::logaddexp_scalar(&(a + dt_bias)?, 0i32, None)?;
        Ok(vec![ops::exp(&(&neg_decay * &softplus)?, None)?])
    })?;
    Ok(one(
        f.call(&[a_log.clone(), a.clone(), dt_bias.clone()])?,
        "compute_g",
    )?)
}

/// `normalize_qk`: RMS-normalize q and k (the l2 norm's `eps` rescaled for `rms_norm`) and
/// fold the `head_dim ** -0.5` readout scale into q.
pub fn normalize_qk(q: &Array, k: &Array, inv_scale: f64, eps: f64) -> Result<(Array, Array)> {
    let inv2 = inv_scale * inv_scale;
    let rms_eps = (eps * inv2) as f32;
    let q = ops::scalar_multiply(inv2, &fast::rms_norm(q, None, rms_eps, None)?, None)?;
    let k = ops::scalar_multiply(inv_scale, &fast::rms_norm(k, None, rms_eps, None)?, None)?;
    Ok((q, k))
}

/// `_gated_delta_step_ops`: one recurrent step. `q`, `k` `(B, H, Dk)`, `v` `(B, H, Dv)`,
/// `g` `(B, H)` or `(B, H, Dk)`, `beta` `(B, H)`, `state` `(B, H, Dv, Dk)`. Compiled (not
/// shapeless) as mlx-lm compiles it; the mask, when given, is a seventh input of the trace.
fn step_ops(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: &Array,
    mask: Option<&Array>,
) -> Result<(Array, Array)> {
    let f = compiled!(|xs: &[Array]| step_ops_body(xs), shapeless = false)?;
    let mut inputs = vec![
        q.clone(),
        k.clone(),
        v.clone(),
        g.clone(),
        beta.clone(),
        state.clone(),
    ];
    inputs.extend(mask.cloned());
    let mut out = f.call(&inputs)?.into_iter();
    match (out.next(), out.next()) {
        (Some(y), Some(state)) => Ok((y, state)),
        _ => Err(ModelError::Internal {
            what: "compiled gated delta step".into(),
            problem: "returned fewer than two arrays".into(),
        }),
    }
}

/// The body `_gated_delta_step_ops` compiles: inputs `[q, k, v, g, beta, state(, mask)]`,
/// outputs `[y, state]`.
fn step_ops_body(xs: &[Array]) -> mlx_core::Result<Vec<Array>> {
    let [q, k, v, g, beta, state, ..] = xs else {
        return Err(mlx_core::Error::Callback(format!(
            "gated delta step: {} inputs, expected 6 or 7",
            xs.len()
        )));
    };
    let decay = match g.ndim() {
        2 => ops::expand_dims(g, &[-1, -2], None)?,
        3 => ops::expand_dims(g, &[-2], None)?,
        n => {
            return Err(mlx_core::Error::Callback(format!(
                "gated delta: unsupported gating rank {n}"
            )))
        }
    };
    let old_state = state;
    let state = (state * &decay)?;
    let kv_mem = ops::sum(
        &(&state * &ops::expand_dims(k, &[-2], None)?)?,
        &[-1],
        false,
        None,
    )?;
    let delta = (&(v - &kv_mem)? * &ops::expand_dims(beta, &[-1], None)?)?;
    let state = (&state
        + &(&ops::expand_dims(k, &[-2], None)? * &ops::expand_dims(&delta, &[-1], None)?)?)?;
    let y = ops::sum(
        &(&state * &ops::expand_dims(q, &[-2], None)?)?,
        &[-1],
        false,
        None,
    )?;
    let state = match xs.get(6) {
        Some(m) => ops::where_(
            &ops::expand_dims(m, &[1, 2, 3], None)?,
            &state,
            old_state,
            None,
        )?,
        None => state,
    };
    Ok(vec![y.astype(q.dtype())?, state])
}

/// `gated_delta_ops`: the sequential recurrence over `T`. `q`, `k` `(B, T, Hk, Dk)`, `v`
/// `(B, T, Hv, Dv)`, `g` `(B, T, Hv[, Dk])`, `beta` `(B, T, Hv)`, `state` `(B, Hv, Dv, Dk)`.
/// Returns `y` `(B, T, Hv, Dv)`, the final state, and — when `keep_states` — the state after
/// every step (for rolling a cache back to any position of this call).
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_ops(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: Option<&Array>,
    mask: Option<&Array>,
    keep_states: bool,
) -> Result<(Array, Array, Vec<Array>)> {
    let qs = q.shape();
    let vs = v.shape();
    if qs.len() != 4 || vs.len() != 4 || k.shape() != qs {
        return Err(ModelError::Input {
            what: "gated delta".into(),
            problem: format!(
                "q {qs:?}, k {:?}, v {vs:?} must be (B, T, H, D) with q == k",
                k.shape()
            ),
        });
    }
    let (b, t_len, hk, dk) = (qs[0], qs[1], qs[2], qs[3]);
    let (hv, dv) = (vs[2], vs[3]);
    if hk <= 0 || hv % hk != 0 {
        return Err(ModelError::Tensor {
            name: "gated delta".into(),
            problem: format!("{hv} value heads are not a multiple of {hk} key heads"),
        });
    }
    let mut state = match state {
        Some(s) => s.clone(),
        None => ops::zeros(&[b, hv, dv, dk], Dtype::Float32, None)?,
    };
    let (q, k) = if hv / hk > 1 {
        (
            ops::repeat(q, hv / hk, -2, None)?,
            ops::repeat(k, hv / hk, -2, None)?,
        )
    } else {
        (q.clone(), k.clone())
    };
    let at = |a: &Array, t: i32| -> Result<Array> {
        Ok(ops::squeeze(
            &ops::slice_axis(a, 1, t, t + 1, None)?,
            &[1],
            None,
        )?)
    };
    let mut ys = Vec::with_capacity(t_len.max(0) as usize);
    let mut states = Vec::new();
    for t in 0..t_len {
        let m = mask.map(|m| at(m, t)).transpose()?;
        let (y, s) = step_ops(
            &at(&q, t)?,
            &at(&k, t)?,
            &at(v, t)?,
            &at(g, t)?,
            &at(beta, t)?,
            &state,
            m.as_ref(),
        )?;
        ys.push(y);
        state = s;
        if keep_states {
            states.push(state.clone());
        }
    }
    let refs: Vec<&Array> = ys.iter().collect();
    Ok((ops::stack(&refs, 1, None)?, state, states))
}

/// `gated_delta_update` on the plain-ops path: `beta = sigmoid(b)`, `g = compute_g(...)`,
/// then [`gated_delta_ops`].
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_update(
    q: &Array,
    k: &Array,
    v: &Array,
    a: &Array,
    b: &Array,
    a_log: &Array,
    dt_bias: &Array,
    state: Option<&Array>,
    mask: Option<&Array>,
    keep_states: bool,
) -> Result<(Array, Array, Vec<Array>)> {
    let beta = ops::sigmoid(b, None)?;
    let g = compute_g(a_log, a, dt_bias)?;
    gated_delta_ops(q, k, v, &g, &beta, state, mask, keep_states)
}

/// The kernel path: the same `beta` and `g`, then MLX's fused `fast::gated_delta_update`
/// (mlx-lm's `gated_delta_kernel` role). Tier: on MLX's CPU backend it gives the same bits as
/// [`gated_delta_ops`] (checked on the model goldens); on GPUs it is a kernel with its own
/// reduction order, to be compared with [`gated_delta_ops`] under a tolerance.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_update_fast(
    q: &Array,
    k: &Array,
    v: &Array,
    a: &Array,
    b: &Array,
    a_log: &Array,
    dt_bias: &Array,
    state: Option<&Array>,
    mask: Option<&Array>,
) -> Result<(Array, Array)> {
    let beta = ops::sigmoid(b, None)?;
    let g = compute_g(a_log, a, dt_bias)?;
    let state = match state {
        Some(s) => s.clone(),
        None => {
            let (qs, vs) = (q.shape(), v.shape());
            if qs.len() != 4 || vs.len() != 4 {
                return Err(ModelError::Input {
                    what: "gated delta".into(),
                    problem: format!("q {qs:?} and v {vs:?} must be (B, T, H, D)"),
                });
            }
            ops::zeros(&[qs[0], vs[2], vs[3], qs[3]], Dtype::Float32, None)?
        }
    };
    Ok(fast::gated_delta_update(
        q,
        k,
        v,
        &g,
        &beta,
        Some(&state),
        mask,
        None,
    )?)
}

/// `Qwen3NextRMSNormGated`: `rms_norm(x)`, then `silu(gate) * normed` in float32 and cast back
/// (`precise_swiglu`).
#[derive(Clone, Debug)]
pub struct RmsNormGated {
    pub weight: Array,
    pub eps: f32,
}

impl RmsNormGated {
    pub fn load(w: &mut Weights, path: &str, dims: i32, eps: f32) -> Result<RmsNormGated> {
        Ok(RmsNormGated {
            weight: w.take(&format!("{path}.weight"), &[dims])?,
            eps,
        })
    }

    pub fn forward(&self, hidden: &Array, gate: Option<&Array>) -> Result<Array> {
        let x = fast::rms_norm(hidden, Some(&self.weight), self.eps, None)?;
        match gate {
            Some(gate) => Ok(precise_swiglu(hidden, gate, &x)?),
            None => Ok(x.astype(hidden.dtype())?),
        }
    }
}

//! The MLP variants of the dense decoders: gated (SwiGLU, GeGLU with erf or tanh GELU) with
//! separate or fused gate/up projections, and plain two-layer MLPs (GELU, GELU-tanh, relu²).

use mlx_core::prelude::*;

use crate::error::Result;
use crate::layers::activations::{gelu, gelu_approx, relu2, silu, swiglu, swiglu_oai, xielu};
use crate::layers::linear::Linear;
use crate::weights::Weights;

#[derive(serde::Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlpKind {
    /// `down(swiglu(gate(x), up(x)))`.
    SwiGlu,
    /// `down(nn.gelu(gate(x)) * up(x))` (Gemma 1).
    GeGluErf,
    /// `down(nn.gelu_approx(gate(x)) * up(x))` (Gemma 2 / 3).
    GeGluTanh,
    /// `down(nn.gelu(up(x)))`.
    Gelu,
    /// `down(nn.gelu_approx(up(x)))`.
    GeluTanh,
    /// `down(silu(up(x)))`.
    Silu,
    /// `down(relu(up(x)) ** 2)` (squared ReLU).
    Relu2,
    /// `down(xielu(up(x)))` with the learned scalars under `act_fn` (Apertus).
    XieLu,
    /// `down(nn.relu2(gate(x)) * up(x))` (BitNet).
    Relu2Glu,
    /// `down(nn.silu(gate(x)) * up(x))`: the activation alone, then the product (nemotron-nas).
    SiluGlu,
    /// `down(nn.relu(gate(x)) * up(x))` (nemotron-nas).
    ReluGlu,
    /// `down(swiglu_oai(gate(x), up(x)))`: gpt_oss's SwiGLU (minimax_m3's MLPs).
    SwiGluOai,
    /// `down(min(silu(gate(x)), limit) * clip(up(x), -limit, limit))` (step3p5's clamped
    /// MLPs; the limit is the MLP's, [`Mlp::from_linears`]).
    ClampedSwiGlu,
}

impl MlpKind {
    pub fn gated(self) -> bool {
        matches!(
            self,
            MlpKind::SwiGlu
                | MlpKind::GeGluErf
                | MlpKind::GeGluTanh
                | MlpKind::Relu2Glu
                | MlpKind::SiluGlu
                | MlpKind::ReluGlu
                | MlpKind::SwiGluOai
                | MlpKind::ClampedSwiGlu
        )
    }
}

/// The module names of an MLP inside its parent (`gate_proj`, `up_proj`, `down_proj`, or a
/// fused `gate_up_proj`; `c_fc` / `c_proj`, `fc1` / `fc2` for plain MLPs as `up` / `down`).
#[derive(serde::Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlpNames {
    pub gate: &'static str,
    pub up: &'static str,
    pub down: &'static str,
    /// When set, gate and up are one projection of twice the width, split in half.
    pub gate_up: Option<&'static str>,
    /// The fused projection holds `[up | gate]` rather than `[gate | up]` (OLMo).
    pub up_first: bool,
}

impl MlpNames {
    pub const LLAMA: MlpNames = MlpNames {
        gate: "gate_proj",
        up: "up_proj",
        down: "down_proj",
        gate_up: None,
        up_first: false,
    };
}

#[derive(Clone, Debug)]
enum GateUp {
    Separate { gate: Linear, up: Linear },
    Fused(Linear),
    Plain(Linear),
}

/// xIELU's learned scalars (`alpha_p`, `alpha_n`, `beta`, `eps`, each 0-d).
#[derive(Clone, Debug)]
struct XieLuParams {
    alpha_p: Array,
    alpha_n: Array,
    beta: Array,
    eps: Array,
}

/// The projections under their names, in mlx-lm's declaration order (gate, down, up).
fn gate_up_down<'a>(
    gate_up: &'a mut GateUp,
    down: &'a mut Linear,
    names: &MlpNames,
) -> Vec<(&'static str, &'a mut Linear)> {
    match gate_up {
        GateUp::Separate { gate, up } => {
            vec![(names.gate, gate), (names.down, down), (names.up, up)]
        }
        GateUp::Fused(l) => vec![
            (names.gate_up.unwrap_or("gate_up_proj"), l),
            (names.down, down),
        ],
        GateUp::Plain(l) => vec![(names.up, l), (names.down, down)],
    }
}

#[derive(Clone, Debug)]
pub struct Mlp {
    kind: MlpKind,
    gate_up: GateUp,
    down: Linear,
    xielu: Option<XieLuParams>,
    up_first: bool,
    inner_norm: Option<Box<crate::layers::Norm>>,
    /// [`MlpKind::ClampedSwiGlu`]'s limit.
    limit: f32,
}

impl Mlp {
    /// The projections under their names, in mlx-lm's declaration order (gate, down, up).
    pub fn linears_mut(&mut self, names: &MlpNames) -> Vec<(&'static str, &mut Linear)> {
        let Mlp { gate_up, down, .. } = self;
        gate_up_down(gate_up, down, names)
    }

    /// Walks the projections under their `names`, in mlx-lm's declaration order (gate,
    /// down, up), then xIELU's learned scalars (`act_fn.alpha_p`, `alpha_n`, `beta`, `eps`:
    /// mlx-lm's `XieLU` holds all four as parameters, so all four train).
    pub fn walk<'a>(&'a mut self, path: &str, names: &MlpNames, w: &mut super::Walk<'a>) {
        let Mlp {
            gate_up,
            down,
            xielu,
            ..
        } = self;
        for (name, l) in gate_up_down(gate_up, down, names) {
            w.linear(&join(path, name), l);
        }
        if let Some(p) = xielu {
            let act = join(path, "act_fn");
            let XieLuParams {
                alpha_p,
                alpha_n,
                beta,
                eps,
            } = p;
            for (leaf, a) in [
                ("alpha_p", alpha_p),
                ("alpha_n", alpha_n),
                ("beta", beta),
                ("eps", eps),
            ] {
                w.array(&act, leaf, a);
            }
        }
    }

    /// The projections, in the order of [`Mlp::linears_mut`].
    pub fn linears(&self) -> Vec<&Linear> {
        match &self.gate_up {
            GateUp::Separate { gate, up } => vec![gate, &self.down, up],
            GateUp::Fused(l) | GateUp::Plain(l) => vec![l, &self.down],
        }
    }

    /// The activation.
    pub fn kind(&self) -> MlpKind {
        self.kind
    }

    /// `(gate, up, down)` when the gate and up projections are separate linears (read-only,
    /// for decoders that run the model's own weights, such as the CPU decoder).
    pub fn gate_up_down(&self) -> Option<(&Linear, &Linear, &Linear)> {
        match &self.gate_up {
            GateUp::Separate { gate, up } => Some((gate, up, &self.down)),
            _ => None,
        }
    }

    /// A gated MLP's fused gate/up projection (`gate_up_proj`, split in half: `[gate | up]`,
    /// or `[up | gate]` when the flag is set), and the down projection.
    pub fn fused_gate_up_down(&self) -> Option<(&Linear, bool, &Linear)> {
        match &self.gate_up {
            GateUp::Fused(l) => Some((l, self.up_first, &self.down)),
            _ => None,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn load(
        w: &mut Weights,
        path: &str,
        names: &MlpNames,
        dim: i32,
        hidden: i32,
        bias: bool,
        down_bias: bool,
        kind: MlpKind,
    ) -> Result<Mlp> {
        let p = |n: &str| join(path, n);
        // Loaded in mlx-lm's attribute order (gate, down, up): `mlx convert` writes the
        // per-module quantization entries in the order the modules are loaded.
        let (gate_up, down) = match (kind.gated(), names.gate_up) {
            (true, Some(f)) => {
                let gu = GateUp::Fused(Linear::load(w, &p(f), dim, 2 * hidden, bias)?);
                (gu, Linear::load(w, &p(names.down), hidden, dim, down_bias)?)
            }
            (true, None) => {
                let gate = Linear::load(w, &p(names.gate), dim, hidden, bias)?;
                let down = Linear::load(w, &p(names.down), hidden, dim, down_bias)?;
                let up = Linear::load(w, &p(names.up), dim, hidden, bias)?;
                (GateUp::Separate { gate, up }, down)
            }
            (false, _) => {
                let up = GateUp::Plain(Linear::load(w, &p(names.up), dim, hidden, bias)?);
                (up, Linear::load(w, &p(names.down), hidden, dim, down_bias)?)
            }
        };
        let xielu = if kind == MlpKind::XieLu {
            let mut s = |n: &str| w.take(&format!("{path}.act_fn.{n}"), &[]);
            Some(XieLuParams {
                alpha_p: s("alpha_p")?,
                alpha_n: s("alpha_n")?,
                beta: s("beta")?,
                eps: s("eps")?,
            })
        } else {
            None
        };
        Ok(Mlp {
            kind,
            gate_up,
            down,
            xielu,
            up_first: names.up_first,
            inner_norm: None,
            limit: 0.0,
        })
    }

    /// A gated MLP from separate projections its port loaded in its own module's order
    /// (minimax_m3's and step3p5's declare gate, up, down); `limit` is
    /// [`MlpKind::ClampedSwiGlu`]'s.
    pub fn from_linears(kind: MlpKind, gate: Linear, up: Linear, down: Linear, limit: f32) -> Mlp {
        Mlp {
            kind,
            gate_up: GateUp::Separate { gate, up },
            down,
            xielu: None,
            up_first: false,
            inner_norm: None,
            limit,
        }
    }

    /// A norm on the activation before the down projection (BitNet's `ffn_sub_norm`).
    pub fn with_inner_norm(mut self, norm: crate::layers::Norm) -> Mlp {
        self.inner_norm = Some(Box::new(norm));
        self
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let h = match &self.gate_up {
            GateUp::Separate { gate, up } => self.gated(&gate.forward(x)?, &up.forward(x)?)?,
            GateUp::Fused(l) => {
                let parts = ops::split_equal(&l.forward(x)?, 2, -1, None)?;
                if self.up_first {
                    self.gated(&parts[1], &parts[0])?
                } else {
                    self.gated(&parts[0], &parts[1])?
                }
            }
            GateUp::Plain(up) => {
                let u = up.forward(x)?;
                match self.kind {
                    MlpKind::GeluTanh => gelu_approx(&u)?,
                    MlpKind::Silu => silu(&u)?,
                    MlpKind::XieLu => match &self.xielu {
                        Some(p) => xielu(&u, &p.alpha_p, &p.alpha_n, &p.beta, &p.eps)?,
                        None => u,
                    },
                    MlpKind::Relu2 => relu2(&u)?,
                    _ => gelu(&u)?,
                }
            }
        };
        match &self.inner_norm {
            Some(n) => self.down.forward(&n.forward(&h)?),
            None => self.down.forward(&h),
        }
    }

    fn gated(&self, g: &Array, u: &Array) -> Result<Array> {
        Ok(match self.kind {
            MlpKind::GeGluErf => (&gelu(g)? * u)?,
            MlpKind::GeGluTanh => (&gelu_approx(g)? * u)?,
            MlpKind::Relu2Glu => (&relu2(g)? * u)?,
            MlpKind::SiluGlu => (&silu(g)? * u)?,
            MlpKind::SwiGluOai => swiglu_oai(g, u)?,
            MlpKind::ClampedSwiGlu => crate::layers::clamped_swiglu(u, g, self.limit)?,
            MlpKind::ReluGlu => {
                let zero = Scalar::Int(0).to_array_like(g.dtype())?;
                (&ops::maximum(g, &zero, None)? * u)?
            }
            _ => swiglu(g, u)?,
        })
    }
}

/// `path.name`, or `path` alone for an empty name (modules that sit directly in their parent).
pub fn join(path: &str, name: &str) -> String {
    match (path.is_empty(), name.is_empty()) {
        (_, true) => path.to_string(),
        (true, false) => name.to_string(),
        _ => format!("{path}.{name}"),
    }
}

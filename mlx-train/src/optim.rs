//! `mlx.optimizers`: SGD, Adam, AdamW, Muon and Adafactor (every `mlx_lm.lora --optimizer`)
//! with a learning rate that may follow a schedule (`cosine_decay`, `linear_schedule`,
//! `exponential_decay`, `step_decay`, warmup joined as mlx-lm's `build_schedule` does), and
//! `clip_grad_norm`. Same ops, same order, same dtypes (the step counter is `uint64`, the
//! learning rate `float32`, Python's scalars weak), so updates match bit for bit.

use std::collections::BTreeMap;
use std::f64::consts::PI;
use std::rc::Rc;

use mlx_core::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Result, TrainError};

type ScheduleFn = Rc<dyn Fn(&Array) -> Result<Array>>;

/// A learning-rate schedule: a function of the (uint64) step.
#[derive(Clone)]
pub struct Schedule(ScheduleFn);

impl Schedule {
    pub fn at(&self, step: &Array) -> Result<Array> {
        (self.0)(step)
    }

    /// `cosine_decay(init, decay_steps, end)`.
    pub fn cosine_decay(init: f64, decay_steps: i64, end: f64) -> Result<Schedule> {
        if decay_steps < 1 {
            return Err(TrainError::Config(format!(
                "decay_steps must be greater than 0, but got {decay_steps}."
            )));
        }
        Ok(Schedule(Rc::new(move |step| {
            let s = ops::minimum_scalar(step, decay_steps, None)?;
            let c = ops::multiply_scalar(&s, PI / decay_steps as f64, None)?.cos()?;
            let decay = ops::multiply_scalar(&ops::add_scalar(&c, 1.0, None)?, 0.5, None)?;
            let d = ops::multiply_scalar(&decay, init - end, None)?;
            Ok(ops::add_scalar(&d, end, None)?)
        })))
    }

    /// `linear_schedule(init, end, steps)`.
    pub fn linear(init: f64, end: f64, steps: i64) -> Result<Schedule> {
        if steps < 1 {
            return Err(TrainError::Config(format!(
                "steps must be greater than 0, but got {steps}."
            )));
        }
        Ok(Schedule(Rc::new(move |step| {
            let s = ops::minimum_scalar(step, steps, None)?;
            let y = ops::multiply_scalar(&s, (end - init) / steps as f64, None)?;
            Ok(ops::add_scalar(&y, init, None)?)
        })))
    }

    /// `exponential_decay(init, decay_rate)`: `init * decay_rate**step`.
    pub fn exponential_decay(init: f64, decay_rate: f64) -> Schedule {
        Schedule(Rc::new(move |step| {
            let p = ops::scalar_power(decay_rate, step, None)?;
            Ok(ops::scalar_multiply(init, &p, None)?)
        }))
    }

    /// `step_decay(init, decay_rate, step_size)`: `init * decay_rate**(step // step_size)`.
    pub fn step_decay(init: f64, decay_rate: f64, step_size: i64) -> Result<Schedule> {
        if step_size < 1 {
            return Err(TrainError::Config(
                "step_decay step_size must be positive".into(),
            ));
        }
        Ok(Schedule(Rc::new(move |step| {
            let k = ops::floor_divide_scalar(step, step_size, None)?;
            let p = ops::scalar_power(decay_rate, &k, None)?;
            Ok(ops::scalar_multiply(init, &p, None)?)
        })))
    }

    /// `join_schedules(schedules, boundaries)`.
    pub fn join(schedules: Vec<Schedule>, boundaries: Vec<i64>) -> Result<Schedule> {
        if schedules.is_empty() || schedules.len() != boundaries.len() + 1 {
            return Err(TrainError::Config(format!(
                "Received {} boundaries but expected {}.",
                boundaries.len(),
                schedules.len().saturating_sub(1)
            )));
        }
        Ok(Schedule(Rc::new(move |step| {
            let mut out = schedules[0].at(step)?;
            for (b, s) in boundaries.iter().zip(&schedules[1..]) {
                let later = s.at(&ops::subtract_scalar(step, *b, None)?)?;
                out = ops::where_(&ops::less_scalar(step, *b, None)?, &out, &later, None)?;
            }
            Ok(out)
        })))
    }
}

/// mlx-lm's `lr_schedule` config: `{name, arguments, warmup?, warmup_init?}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScheduleConfig {
    pub name: String,
    pub arguments: Vec<Value>,
    #[serde(default)]
    pub warmup: i64,
    #[serde(default)]
    pub warmup_init: f64,
}

fn num(args: &[Value], i: usize, name: &str) -> Result<f64> {
    args.get(i).and_then(Value::as_f64).ok_or_else(|| {
        TrainError::option(
            format!("lr_schedule `{name}`: argument {i}"),
            "must be a number",
        )
    })
}

fn int(args: &[Value], i: usize, name: &str) -> Result<i64> {
    args.get(i).and_then(Value::as_i64).ok_or_else(|| {
        TrainError::option(
            format!("lr_schedule `{name}`: argument {i}"),
            "must be an integer",
        )
    })
}

/// `build_schedule(config)`.
pub fn build_schedule(c: &ScheduleConfig) -> Result<Schedule> {
    let a = &c.arguments;
    let n = c.name.as_str();
    let opt_num = |i: usize, d: f64| -> Result<f64> {
        if a.len() > i {
            num(a, i, n)
        } else {
            Ok(d)
        }
    };
    let base = match n {
        "cosine_decay" => Schedule::cosine_decay(num(a, 0, n)?, int(a, 1, n)?, opt_num(2, 0.0)?)?,
        "linear_schedule" => Schedule::linear(num(a, 0, n)?, num(a, 1, n)?, int(a, 2, n)?)?,
        "exponential_decay" => Schedule::exponential_decay(num(a, 0, n)?, num(a, 1, n)?),
        "step_decay" => Schedule::step_decay(num(a, 0, n)?, num(a, 1, n)?, int(a, 2, n)?)?,
        other => {
            return Err(TrainError::Config(format!(
                "lr_schedule name `{other}` is not supported (cosine_decay, linear_schedule, \
                 exponential_decay, step_decay)"
            )))
        }
    };
    if c.warmup > 0 {
        let initial = num(a, 0, n)?;
        let warm = Schedule::linear(c.warmup_init, initial, c.warmup)?;
        Schedule::join(vec![warm, base], vec![c.warmup + 1])
    } else {
        Ok(base)
    }
}

/// Muon's Newton-Schulz iterations are three matrix products each: more than this many is
/// refused as a configuration mistake rather than run.
pub const MAX_NS_STEPS: u64 = 1000;

/// The update rule and its hyper-parameters (mlx's defaults via `Default`-like builders).
#[derive(Clone, Debug, PartialEq)]
pub enum Method {
    Sgd {
        momentum: f64,
        weight_decay: f64,
        dampening: f64,
        nesterov: bool,
    },
    Adam {
        betas: [f64; 2],
        eps: f64,
        bias_correction: bool,
    },
    AdamW {
        betas: [f64; 2],
        eps: f64,
        weight_decay: f64,
        bias_correction: bool,
    },
    /// `optim.Muon`: momentum, then Newton-Schulz orthogonalization of 2-D (and higher,
    /// flattened) updates; arrays under 2-D take the momentum update as is.
    Muon {
        momentum: f64,
        weight_decay: f64,
        nesterov: bool,
        ns_steps: usize,
    },
    /// `optim.Adafactor`: factored second moments for arrays of 2-D and more.
    Adafactor {
        eps: [f64; 2],
        clip_threshold: f64,
        decay_rate: f64,
        beta_1: Option<f64>,
        weight_decay: f64,
        scale_parameter: bool,
        relative_step: bool,
        warmup_init: bool,
    },
}

impl Method {
    /// `name` (`sgd`, `adam`, `adamw`, `muon`, `adafactor`) with mlx's defaults overridden by
    /// `config` (mlx-lm's `optimizer_config.<name>`: the keyword arguments of the
    /// `mlx.optimizers` class: `momentum`, `betas`, `eps`, `weight_decay`, ...).
    pub fn from_config(name: &str, config: &serde_json::Map<String, Value>) -> Result<Method> {
        let f = |k: &str, d: f64| -> Result<f64> {
            match config.get(k) {
                None => Ok(d),
                Some(v) => v.as_f64().ok_or_else(|| {
                    TrainError::option(format!("optimizer_config.{name}.{k}"), "must be a number")
                }),
            }
        };
        let b = |k: &str, d: bool| -> Result<bool> {
            match config.get(k) {
                None => Ok(d),
                Some(v) => v.as_bool().ok_or_else(|| {
                    TrainError::option(format!("optimizer_config.{name}.{k}"), "must be a boolean")
                }),
            }
        };
        // A pair of numbers (`betas`, Adafactor's `eps`), each checked by `ok` (what it must be).
        let pair = |k: &str, d: [f64; 2], ok: &dyn Fn(f64) -> bool, what: &str| match config.get(k)
        {
            None => Ok(d),
            Some(Value::Array(v)) if v.len() == 2 => {
                let g = |i: usize| {
                    v[i].as_f64().filter(|x| ok(*x)).ok_or_else(|| {
                        TrainError::option(
                            format!("optimizer_config.{name}.{k}[{i}]"),
                            format!("must be {what}"),
                        )
                    })
                };
                Ok([g(0)?, g(1)?])
            }
            Some(_) => Err(TrainError::option(
                format!("optimizer_config.{name}.{k}"),
                "must be two numbers",
            )),
        };
        let betas = || {
            pair(
                "betas",
                [0.9, 0.999],
                &|b| (0.0..1.0).contains(&b),
                "in [0, 1)",
            )
        };
        let known: &[&str] = match name {
            "sgd" => &["momentum", "weight_decay", "dampening", "nesterov"],
            "adam" => &["betas", "eps", "bias_correction"],
            "adamw" => &["betas", "eps", "weight_decay", "bias_correction"],
            "muon" => &["momentum", "weight_decay", "nesterov", "ns_steps"],
            "adafactor" => &[
                "eps",
                "clip_threshold",
                "decay_rate",
                "beta_1",
                "weight_decay",
                "scale_parameter",
                "relative_step",
                "warmup_init",
            ],
            other => {
                return Err(TrainError::Config(format!(
                    "optimizer `{other}` is not supported (sgd, adam, adamw, muon, adafactor)"
                )))
            }
        };
        if let Some(k) = config.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(TrainError::UnknownOption {
                section: format!("optimizer_config.{name}"),
                option: k.to_string(),
            });
        }
        let m = match name {
            "sgd" => {
                let (momentum, dampening, nesterov) = (
                    f("momentum", 0.0)?,
                    f("dampening", 0.0)?,
                    b("nesterov", false)?,
                );
                if nesterov && (momentum <= 0.0 || dampening != 0.0) {
                    return Err(TrainError::Config(
                        "Nesterov momentum requires a momentum and zero dampening.".into(),
                    ));
                }
                Method::Sgd {
                    momentum,
                    weight_decay: f("weight_decay", 0.0)?,
                    dampening,
                    nesterov,
                }
            }
            "adam" => Method::Adam {
                betas: betas()?,
                eps: f("eps", 1e-8)?,
                bias_correction: b("bias_correction", false)?,
            },
            "adamw" => Method::AdamW {
                betas: betas()?,
                eps: f("eps", 1e-8)?,
                weight_decay: f("weight_decay", 0.01)?,
                bias_correction: b("bias_correction", false)?,
            },
            "muon" => Method::Muon {
                momentum: f("momentum", 0.95)?,
                weight_decay: f("weight_decay", 0.01)?,
                nesterov: b("nesterov", true)?,
                ns_steps: match config.get("ns_steps") {
                    None => 5,
                    Some(v) => v.as_u64().filter(|n| *n <= MAX_NS_STEPS).ok_or_else(|| {
                        TrainError::option(
                            "optimizer_config.muon.ns_steps",
                            format!("must be an integer in 0..={MAX_NS_STEPS}"),
                        )
                    })? as usize,
                },
            },
            _ => {
                let beta_1 = match config.get("beta_1") {
                    None | Some(Value::Null) => None,
                    Some(v) => Some(v.as_f64().ok_or_else(|| {
                        TrainError::option(
                            "optimizer_config.adafactor.beta_1",
                            "must be a number or null",
                        )
                    })?),
                };
                Method::Adafactor {
                    eps: pair("eps", [1e-30, 1e-3], &f64::is_finite, "a finite number")?,
                    clip_threshold: f("clip_threshold", 1.0)?,
                    decay_rate: f("decay_rate", -0.8)?,
                    beta_1,
                    weight_decay: f("weight_decay", 0.0)?,
                    scale_parameter: b("scale_parameter", true)?,
                    relative_step: b("relative_step", true)?,
                    warmup_init: b("warmup_init", false)?,
                }
            }
        };
        Ok(m)
    }
}

/// A learning rate: a constant, a schedule, or none (Adafactor's `learning_rate=None`, which
/// only its relative step size can do without).
pub enum LearningRate {
    Constant(f64),
    Scheduled(Schedule),
    Unset,
}

/// An `mlx.optimizers.Optimizer` over named parameters.
pub struct Optimizer {
    method: Method,
    schedule: Option<Schedule>,
    /// `state["step"]` (uint64).
    step: Array,
    /// `state["learning_rate"]` (float32); absent for [`LearningRate::Unset`].
    learning_rate: Option<Array>,
    /// Per parameter: `m`/`v` (Adam), `v` (SGD, Muon), `exp_avg_sq_row`/`exp_avg_sq_col` or
    /// `exp_avg_sq`, and `exp_avg` (Adafactor).
    state: OptState,
    /// The update traced by [`Optimizer::apply_gradients_compiled`].
    trace: UpdateTrace,
}

/// Where [`Optimizer::apply_gradients_compiled`] stands.
enum UpdateTrace {
    /// Not traced yet.
    Untraced,
    /// Traced for the layout it holds.
    Traced(CompiledUpdate),
    /// A trace failed: the update runs uncompiled from then on.
    Failed,
}

/// Per parameter, its named state arrays.
type OptState = BTreeMap<String, BTreeMap<&'static str, Array>>;

/// Which arrays a compiled update takes and returns, in order: `step`, `learning_rate` if
/// any, then per parameter with a gradient its gradient, value and state leaves.
#[derive(Clone, Debug, PartialEq)]
struct UpdateLayout {
    has_lr: bool,
    params: Vec<(String, Vec<&'static str>)>,
}

impl UpdateLayout {
    /// `step`, the learning rate if any, then per parameter its array in each of `maps` and
    /// its state leaves.
    fn pack(
        &self,
        step: &Array,
        learning_rate: Option<&Array>,
        maps: &[&ParamMap],
        state: &OptState,
    ) -> Result<Vec<Array>> {
        let mut out = vec![step.clone()];
        out.extend(learning_rate.cloned());
        for (k, leaves) in &self.params {
            let missing = || TrainError::Config(format!("the optimizer update lost {k}"));
            for m in maps {
                out.push(m.get(k).cloned().ok_or_else(missing)?);
            }
            let entry = state.get(k).ok_or_else(missing)?;
            for leaf in leaves {
                out.push(state_get(entry, leaf)?);
            }
        }
        Ok(out)
    }

    /// The inverse of [`UpdateLayout::pack`] with `maps` maps.
    fn unpack(
        &self,
        arrays: Vec<Array>,
        maps: usize,
    ) -> Result<(Array, Option<Array>, Vec<ParamMap>, OptState)> {
        let mut it = arrays.into_iter();
        let mut next = || {
            it.next()
                .ok_or_else(|| TrainError::Config("the optimizer update lost arrays".into()))
        };
        let step = next()?;
        let learning_rate = if self.has_lr { Some(next()?) } else { None };
        let mut out = vec![ParamMap::new(); maps];
        let mut state = OptState::new();
        for (k, leaves) in &self.params {
            for m in out.iter_mut() {
                m.insert(k.clone(), next()?);
            }
            let mut entry = BTreeMap::new();
            for leaf in leaves {
                entry.insert(*leaf, next()?);
            }
            state.insert(k.clone(), entry);
        }
        Ok((step, learning_rate, out, state))
    }
}

struct CompiledUpdate {
    layout: UpdateLayout,
    f: mlx_core::compile::Compiled<'static>,
}

impl Optimizer {
    pub fn new(method: Method, lr: LearningRate) -> Result<Optimizer> {
        let step = Array::from_int(0, Dtype::Uint64)?;
        let (schedule, learning_rate) = match lr {
            LearningRate::Constant(v) => (None, Some(Array::from_f32(v as f32, Dtype::Float32)?)),
            LearningRate::Scheduled(s) => {
                let lr = s.at(&step)?;
                (Some(s), Some(lr))
            }
            LearningRate::Unset => {
                if !matches!(
                    method,
                    Method::Adafactor {
                        relative_step: true,
                        ..
                    }
                ) {
                    return Err(TrainError::Config(
                        "a learning rate is required (only Adafactor with relative_step \
                         can do without one)"
                            .into(),
                    ));
                }
                (None, None)
            }
        };
        Ok(Optimizer {
            method,
            schedule,
            step,
            learning_rate,
            state: BTreeMap::new(),
            trace: UpdateTrace::Untraced,
        })
    }

    /// `state["learning_rate"]`, if the optimizer has one.
    pub fn learning_rate(&self) -> Option<&Array> {
        self.learning_rate.as_ref()
    }

    pub fn step(&self) -> &Array {
        &self.step
    }

    /// The names [`Optimizer::state_map`] gives once every parameter of `params` was
    /// updated (`step`, `<param>.<leaf>`; the learning rate left out): what a saved state of
    /// this optimizer over these parameters holds.
    pub fn state_names(&self, params: &ParamMap) -> Result<std::collections::BTreeSet<String>> {
        let mut out = std::collections::BTreeSet::from(["step".to_string()]);
        for (k, p) in params {
            for leaf in init_single(&self.method, p)?.keys() {
                out.insert(format!("{k}.{leaf}"));
            }
        }
        Ok(out)
    }

    /// Sets the step counter (a resumed run whose optimizer state was not saved: the
    /// learning-rate schedule continues where it was, the moments start fresh).
    pub fn set_step(&mut self, step: u64) -> Result<()> {
        let s = Array::from_slice(&[step], &[])?;
        if let Some(sched) = &self.schedule {
            self.learning_rate = Some(sched.at(&s)?);
        }
        self.step = s;
        Ok(())
    }

    /// Whether [`Optimizer::apply_gradients_compiled`] holds a traced update (false before
    /// its first call and after a trace failed).
    pub fn is_update_compiled(&self) -> bool {
        matches!(self.trace, UpdateTrace::Traced(_))
    }

    /// Every array of the state (for `eval`).
    pub fn state_arrays(&self) -> Vec<Array> {
        let mut v = vec![self.step.clone()];
        v.extend(self.learning_rate.clone());
        v.extend(self.state.values().flat_map(|m| m.values().cloned()));
        v
    }

    /// The state as named arrays, mlx's flattened names (`<param>.m`, `step`, ...).
    pub fn state_map(&self) -> BTreeMap<String, Array> {
        let mut out = BTreeMap::new();
        out.insert("step".to_string(), self.step.clone());
        if let Some(lr) = &self.learning_rate {
            out.insert("learning_rate".to_string(), lr.clone());
        }
        for (p, m) in &self.state {
            for (k, a) in m {
                out.insert(format!("{p}.{k}"), a.clone());
            }
        }
        out
    }

    /// Restores a state written by [`Optimizer::state_map`].
    pub fn load_state_map(&mut self, map: &BTreeMap<String, Array>) -> Result<()> {
        for (k, a) in map {
            match k.as_str() {
                "step" => self.step = a.astype(Dtype::Uint64)?,
                "learning_rate" => self.learning_rate = Some(a.clone()),
                _ => {
                    let (p, leaf) = k.rsplit_once('.').ok_or_else(|| {
                        TrainError::Config(format!("optimizer state: bad name `{k}`"))
                    })?;
                    let leaf: &'static str = match STATE_LEAVES.iter().find(|l| **l == leaf) {
                        Some(l) => l,
                        None => {
                            return Err(TrainError::Config(format!(
                                "optimizer state: unknown entry `{leaf}` in `{k}`"
                            )))
                        }
                    };
                    self.state
                        .entry(p.to_string())
                        .or_default()
                        .insert(leaf, a.clone());
                }
            }
        }
        Ok(())
    }

    /// `apply_gradients(gradients, parameters)`: the updated parameters (only those with a
    /// gradient), the state advanced.
    /// On any error the optimizer is as it was (step, learning rate and state).
    pub fn apply_gradients(&mut self, grads: &ParamMap, params: &ParamMap) -> Result<ParamMap> {
        let state = self.initialized_state(grads, params)?;
        self.apply_on(state, grads, params)
    }

    /// Checks that every gradient has its parameter, of its shape, and returns the state with
    /// a fresh entry for every parameter with a gradient and none yet (the optimizer's own
    /// state is not touched until an update succeeds).
    fn initialized_state(&self, grads: &ParamMap, params: &ParamMap) -> Result<OptState> {
        let mut state = self.state.clone();
        for (k, g) in grads {
            let p = params
                .get(k)
                .ok_or_else(|| TrainError::Config(format!("gradient for unknown parameter {k}")))?;
            if g.shape() != p.shape() {
                return Err(TrainError::Config(format!(
                    "gradient for {k} has shape {:?}, the parameter {:?}",
                    g.shape(),
                    p.shape()
                )));
            }
            if !state.contains_key(k) {
                state.insert(k.clone(), init_single(&self.method, g)?);
            }
        }
        Ok(state)
    }

    /// [`Optimizer::apply_gradients`] as one compiled function of the step, the learning rate,
    /// the gradients, the parameters and the state, as mlx-lm's trainer compiles
    /// `optimizer.update` inside its step (`mx.compile(step, inputs=state, outputs=state)`):
    /// MLX fuses each parameter's elementwise update, where uncompiled every op is its own
    /// node (a dozen per parameter for Adam), which on a GPU costs the host a few
    /// microseconds each. Traced once per layout (which parameters, which state); the same
    /// values as uncompiled (the CPU goldens hold either way). A trace that fails changes
    /// nothing: that update and every later one run uncompiled, and a real error surfaces
    /// from there.
    pub fn apply_gradients_compiled(
        &mut self,
        grads: &ParamMap,
        params: &ParamMap,
    ) -> Result<ParamMap> {
        let mut state = self.initialized_state(grads, params)?;
        let layout = UpdateLayout {
            has_lr: self.learning_rate.is_some(),
            params: grads
                .keys()
                .map(|k| {
                    let leaves = state.get(k).map(|m| m.keys().copied().collect());
                    (k.clone(), leaves.unwrap_or_default())
                })
                .collect(),
        };
        let stale = match &self.trace {
            UpdateTrace::Traced(c) => c.layout != layout,
            UpdateTrace::Failed => return self.apply_on(state, grads, params),
            UpdateTrace::Untraced => true,
        };
        if stale {
            self.trace = match self.compile_update(layout) {
                Ok(c) => UpdateTrace::Traced(c),
                Err(_) => UpdateTrace::Failed,
            };
        }
        let UpdateTrace::Traced(c) = &self.trace else {
            return self.apply_on(state, grads, params);
        };
        let inputs = c.layout.pack(
            &self.step,
            self.learning_rate.as_ref(),
            &[grads, params],
            &state,
        )?;
        let (step, lr, mut new, updated) = match c.f.call(&inputs) {
            Ok(out) => c.layout.unpack(out, 1)?,
            Err(_) => {
                self.trace = UpdateTrace::Failed;
                return self.apply_on(state, grads, params);
            }
        };
        state.extend(updated);
        self.step = step;
        self.learning_rate = lr;
        self.state = state;
        Ok(new.pop().unwrap_or_default())
    }

    fn compile_update(&self, layout: UpdateLayout) -> Result<CompiledUpdate> {
        let (method, schedule, traced) =
            (self.method.clone(), self.schedule.clone(), layout.clone());
        let update = move |inputs: &[Array]| -> Result<Vec<Array>> {
            let (step, learning_rate, maps, state) = traced.unpack(inputs.to_vec(), 2)?;
            let [grads, params] = <[ParamMap; 2]>::try_from(maps)
                .map_err(|_| TrainError::Config("the compiled update lost its inputs".into()))?;
            let mut opt = Optimizer {
                method: method.clone(),
                schedule: schedule.clone(),
                step,
                learning_rate,
                state: BTreeMap::new(),
                trace: UpdateTrace::Untraced,
            };
            let new = opt.apply_on(state, &grads, &params)?;
            traced.pack(&opt.step, opt.learning_rate.as_ref(), &[&new], &opt.state)
        };
        let f = move |inputs: &[Array]| {
            update(inputs).map_err(|e| mlx_core::Error::Callback(e.to_string()))
        };
        Ok(CompiledUpdate {
            layout,
            f: mlx_core::compile::compile(f, false)?,
        })
    }

    /// The update over `state` (the optimizer's, with an entry for every parameter with a
    /// gradient), adopted with the new step and learning rate only once every parameter's
    /// update is built.
    fn apply_on(
        &mut self,
        mut state: OptState,
        grads: &ParamMap,
        params: &ParamMap,
    ) -> Result<ParamMap> {
        let learning_rate = match &self.schedule {
            Some(s) => Some(s.at(&self.step)?),
            None => self.learning_rate.clone(),
        };
        let step = ops::add_scalar(&self.step, 1, None)?;
        let mut out = ParamMap::new();
        for (k, g) in grads {
            let p = params
                .get(k)
                .ok_or_else(|| TrainError::Config(format!("gradient for unknown parameter {k}")))?;
            let entry = state
                .get_mut(k)
                .ok_or_else(|| TrainError::Config(format!("no optimizer state for {k}")))?;
            let new = apply_single(&self.method, learning_rate.as_ref(), &step, g, p, entry)?;
            out.insert(k.clone(), new);
        }
        self.learning_rate = learning_rate;
        self.step = step;
        self.state = state;
        Ok(out)
    }
}

/// Every per-parameter state entry an optimizer keeps.
const STATE_LEAVES: [&str; 6] = [
    "m",
    "v",
    "exp_avg_sq_row",
    "exp_avg_sq_col",
    "exp_avg_sq",
    "exp_avg",
];

/// `init_single(parameter, state)`; mlx initializes from the gradients' tree, so `g`.
fn init_single(method: &Method, g: &Array) -> Result<BTreeMap<&'static str, Array>> {
    let z = || ops::zeros_like(g, None);
    Ok(match *method {
        Method::Sgd { .. } | Method::Muon { .. } => BTreeMap::from([("v", z()?)]),
        Method::Adam { .. } | Method::AdamW { .. } => BTreeMap::from([("m", z()?), ("v", z()?)]),
        Method::Adafactor { beta_1, .. } => {
            let mut s = BTreeMap::new();
            let shape = g.shape();
            let n = shape.len();
            if n >= 2 {
                let row = &shape[..n - 1];
                let col: Vec<i32> = shape[..n - 2]
                    .iter()
                    .chain(&shape[n - 1..])
                    .copied()
                    .collect();
                s.insert("exp_avg_sq_row", ops::zeros(row, g.dtype(), None)?);
                s.insert("exp_avg_sq_col", ops::zeros(&col, g.dtype(), None)?);
            } else {
                s.insert("exp_avg_sq", z()?);
            }
            if beta_1.is_some() {
                s.insert("exp_avg", z()?);
            }
            s
        }
    })
}

fn state_get(state: &BTreeMap<&'static str, Array>, k: &str) -> Result<Array> {
    state
        .get(k)
        .cloned()
        .ok_or_else(|| TrainError::Config(format!("optimizer state lacks `{k}`")))
}

fn apply_single(
    method: &Method,
    learning_rate: Option<&Array>,
    step: &Array,
    g: &Array,
    p: &Array,
    state: &mut BTreeMap<&'static str, Array>,
) -> Result<Array> {
    if let Method::Adafactor { .. } = method {
        return adafactor(method, learning_rate, step, g, p, state);
    }
    let lr = learning_rate
        .ok_or_else(|| TrainError::Config("the optimizer has no learning rate".into()))?
        .astype(g.dtype())?;
    let get = state_get;
    match *method {
        Method::Sgd {
            momentum,
            weight_decay,
            dampening,
            nesterov,
        } => {
            let g = with_weight_decay(g, p, weight_decay)?;
            if momentum <= 0.0 {
                return Ok((p - &(&lr * &g)?)?);
            }
            let mut v = ops::scalar_multiply(momentum, &get(state, "v")?, None)?;
            if dampening > 0.0 {
                v = (&v + &ops::scalar_multiply(1.0 - dampening, &g, None)?)?;
            } else {
                v = (&v + &g)?;
            }
            let update = if nesterov {
                (&g + &ops::scalar_multiply(momentum, &v, None)?)?
            } else {
                v.clone()
            };
            state.insert("v", v);
            Ok((p - &(&lr * &update)?)?)
        }
        Method::Adam {
            betas,
            eps,
            bias_correction,
        } => adam(&lr, step, betas, eps, bias_correction, g, p, state),
        Method::AdamW {
            betas,
            eps,
            weight_decay,
            bias_correction,
        } => {
            let decay =
                ops::scalar_subtract(1.0, &ops::multiply_scalar(&lr, weight_decay, None)?, None)?;
            let p = (p * &decay)?;
            adam(&lr, step, betas, eps, bias_correction, g, &p, state)
        }
        Method::Muon {
            momentum,
            weight_decay,
            nesterov,
            ns_steps,
        } => {
            let g = with_weight_decay(g, p, weight_decay)?;
            let v = ops::scalar_multiply(momentum, &get(state, "v")?, None)?;
            let v = (&v + &ops::scalar_multiply(1.0 - momentum, &g, None)?)?;
            state.insert("v", v.clone());
            let update = if nesterov {
                (&ops::multiply_scalar(&g, 1.0 - momentum, None)?
                    + &ops::multiply_scalar(&v, momentum, None)?)?
            } else {
                v
            };
            let shape = update.shape();
            let (update, lr) = if shape.len() >= 2 {
                let reshaped = if shape.len() > 2 {
                    update.reshape(&[shape[0], -1])?
                } else {
                    update
                };
                let mut o = zeropower_via_newtonschulz5(&reshaped, ns_steps)?;
                if shape.len() > 2 {
                    o = o.reshape(&shape)?;
                }
                // `max(1, rows / cols) ** 0.5` in Python floats.
                let n = shape.len();
                let ratio = f64::from(shape[n - 2]) / f64::from(shape[n - 1]);
                let scale = if ratio > 1.0 { ratio.powf(0.5) } else { 1.0 };
                (o, ops::multiply_scalar(&lr, scale, None)?)
            } else {
                (update, lr)
            };
            Ok((p - &(&lr * &update)?)?)
        }
        Method::Adafactor { .. } => adafactor(method, learning_rate, step, g, p, state),
    }
}

/// Muon's `_zeropower_via_newtonschulz5(X, steps)` on a 2-D `x`.
fn zeropower_via_newtonschulz5(x: &Array, steps: usize) -> Result<Array> {
    let (a, b, c) = (3.4445, -4.7750, 2.0315);
    let shape = x.shape();
    let transpose_needed = shape[0] > shape[1];
    let mut x = if transpose_needed {
        x.transpose_all()?
    } else {
        x.clone()
    };
    // `mx.linalg.norm(X, keepdims=True)`: the flattened array's 2-norm, shaped (1, 1).
    let norm = x
        .flatten(0, -1)?
        .square()?
        .sum(&[0], true)?
        .sqrt()?
        .reshape(&[1, 1])?;
    // mlx-lm runs this inside its compiled step, where the fused division writes a
    // row-major array even from the transposed `X`; uncompiled, the division keeps X's
    // column-major layout and the products below take another BLAS path (1-ulp apart).
    // `contiguous` gives the compiled layout, so the products match bit for bit.
    x = ops::contiguous(&(&x / &ops::add_scalar(&norm, 1e-7, None)?)?, false, None)?;
    for _ in 0..steps {
        let xt = x.transpose_all()?;
        let a_ = ops::matmul(&x, &xt, None)?;
        let b_ = ops::addmm(
            &ops::scalar_multiply(b, &a_, None)?,
            &a_,
            &a_,
            c as f32,
            1.0,
            None,
        )?;
        x = ops::addmm(&ops::scalar_multiply(a, &x, None)?, &b_, &x, 1.0, 1.0, None)?;
    }
    if transpose_needed {
        x = x.transpose_all()?;
    }
    Ok(x)
}

/// `sqrt(mean(square(x)))`.
fn rms(x: &Array) -> Result<Array> {
    Ok(x.square()?.mean_all(false)?.sqrt()?)
}

/// Adafactor's `apply_single`.
fn adafactor(
    method: &Method,
    learning_rate: Option<&Array>,
    step: &Array,
    g: &Array,
    p: &Array,
    state: &mut BTreeMap<&'static str, Array>,
) -> Result<Array> {
    let Method::Adafactor {
        eps,
        clip_threshold,
        decay_rate,
        beta_1,
        weight_decay,
        scale_parameter,
        relative_step,
        warmup_init,
    } = *method
    else {
        return Err(TrainError::Config("not Adafactor".into()));
    };
    let factored = g.ndim() >= 2;
    let parameter_rms = rms(p)?;
    // _compute_learning_rate(step, parameter_rms)
    let relative_step_size = if relative_step {
        let r = step.rsqrt()?;
        if warmup_init {
            ops::minimum(&ops::scalar_multiply(1e-6, step, None)?, &r, None)?
        } else {
            ops::scalar_minimum(1e-2, &r, None)?
        }
    } else {
        learning_rate.cloned().ok_or_else(|| {
            TrainError::Config("Adafactor without relative_step needs a learning rate".into())
        })?
    };
    let relative_step_size = relative_step_size.astype(parameter_rms.dtype())?;
    let lr = if scale_parameter {
        let scale = ops::scalar_maximum(eps[1], &parameter_rms, None)?;
        (&scale * &relative_step_size)?
    } else {
        ops::scalar_multiply(1.0, &relative_step_size, None)?
    };
    let beta_2 = ops::scalar_subtract(
        1.0,
        &ops::power_scalar(step, decay_rate, None)?.astype(parameter_rms.dtype())?,
        None,
    )?;
    let one_minus_beta_2 = ops::scalar_subtract(1, &beta_2, None)?;
    let update = ops::add_scalar(&g.square()?, eps[0], None)?;
    let update = if factored {
        let row = (&(&beta_2 * &state_get(state, "exp_avg_sq_row")?)?
            + &(&one_minus_beta_2 * &update.mean(&[-1], false)?)?)?;
        let col = (&(&beta_2 * &state_get(state, "exp_avg_sq_col")?)?
            + &(&one_minus_beta_2 * &update.mean(&[-2], false)?)?)?;
        state.insert("exp_avg_sq_row", row.clone());
        state.insert("exp_avg_sq_col", col.clone());
        // _approximate_exp_moving_avg(row, col)
        let r_factor = (&row / &row.mean(&[-1], true)?)?.rsqrt()?;
        let c_factor = col.rsqrt()?;
        let u = (&r_factor.expand_dims(&[-1])? * &c_factor.expand_dims(&[-2])?)?;
        (&u * g)?
    } else {
        let sq =
            (&(&beta_2 * &state_get(state, "exp_avg_sq")?)? + &(&one_minus_beta_2 * &update)?)?;
        state.insert("exp_avg_sq", sq.clone());
        (&sq.rsqrt()? * g)?
    };
    let denom = ops::scalar_maximum(
        1.0,
        &ops::divide_scalar(&rms(&update)?, clip_threshold, None)?,
        None,
    )?;
    let update = (&update / &denom)?;
    let mut update = (&lr * &update)?;
    if let Some(b1) = beta_1 {
        let m = (&ops::scalar_multiply(b1, &state_get(state, "exp_avg")?, None)?
            + &ops::scalar_multiply(1.0 - b1, &update, None)?)?;
        state.insert("exp_avg", m.clone());
        update = m;
    }
    let p = if weight_decay != 0.0 {
        (p + &(p * &ops::scalar_multiply(-weight_decay, &lr, None)?)?)?
    } else {
        p.clone()
    };
    Ok((&p - &update)?)
}

/// `g + weight_decay * p` (SGD's and Muon's coupled decay); `g` itself when the decay is 0,
/// as mlx's optimizers skip it.
fn with_weight_decay(g: &Array, p: &Array, weight_decay: f64) -> Result<Array> {
    Ok(if weight_decay != 0.0 {
        (g + &ops::scalar_multiply(weight_decay, p, None)?)?
    } else {
        g.clone()
    })
}

#[allow(clippy::too_many_arguments)]
fn adam(
    lr: &Array,
    step: &Array,
    [b1, b2]: [f64; 2],
    eps: f64,
    bias_correction: bool,
    g: &Array,
    p: &Array,
    state: &mut BTreeMap<&'static str, Array>,
) -> Result<Array> {
    let (m, v) = match (state.get("m"), state.get("v")) {
        (Some(m), Some(v)) => (m.clone(), v.clone()),
        _ => return Err(TrainError::Config("Adam state lacks m or v".into())),
    };
    let m = (&ops::scalar_multiply(b1, &m, None)? + &ops::scalar_multiply(1.0 - b1, g, None)?)?;
    let v = (&ops::scalar_multiply(b2, &v, None)?
        + &ops::scalar_multiply(1.0 - b2, &g.square()?, None)?)?;
    state.insert("m", m.clone());
    state.insert("v", v.clone());
    if bias_correction {
        let c1 = (lr / &ops::scalar_subtract(1.0, &ops::scalar_power(b1, step, None)?, None)?)?
            .astype(g.dtype())?;
        let c2 = ops::scalar_subtract(1.0, &ops::scalar_power(b2, step, None)?, None)?
            .rsqrt()?
            .astype(g.dtype())?;
        let num = (&c1 * &m)?;
        let den = ops::add_scalar(&(&v.sqrt()? * &c2)?, eps, None)?;
        Ok((p - &(&num / &den)?)?)
    } else {
        let den = ops::add_scalar(&v.sqrt()?, eps, None)?;
        Ok((p - &(&(lr * &m)? / &den)?)?)
    }
}

/// `optim.clip_grad_norm(grads, max_norm)`: the rescaled gradients and the global norm.
pub fn clip_grad_norm(grads: &ParamMap, max_norm: f64) -> Result<(ParamMap, Array)> {
    if max_norm < 0.0 {
        return Err(TrainError::option(
            "max_norm",
            format!("should be >=0, {max_norm} was provided instead"),
        ));
    }
    let mut acc: Option<Array> = None;
    for g in grads.values() {
        let g32 = if g.dtype() == Dtype::Float16 {
            g.astype(Dtype::Float32)?
        } else {
            g.clone()
        };
        let sq = g32.square()?.sum_all(false)?;
        acc = Some(match acc {
            None => ops::scalar_add(0.0, &sq, None)?,
            Some(a) => (&a + &sq)?,
        });
    }
    let norm_sq = match acc {
        Some(a) => a,
        None => Array::from_f32(0.0, Dtype::Float32)?,
    };
    let total = norm_sq.sqrt()?;
    let normalizer = ops::minimum_scalar(
        &ops::scalar_divide(max_norm, &ops::add_scalar(&total, 1e-6, None)?, None)?,
        1.0,
        None,
    )?;
    let mut out = ParamMap::new();
    for (k, g) in grads {
        let c = if g.dtype().is_floating() {
            (g * &normalizer)?.astype(g.dtype())?
        } else {
            (g * &normalizer)?
        };
        out.insert(k.clone(), c);
    }
    Ok((out, total))
}

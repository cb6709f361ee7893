//! mlx-lm's `tuner/trainer.py`: the step (loss, gradients, accumulation, optimizer update),
//! `evaluate` and the `train` loop with its reports, validation and checkpoints.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::time::Instant;

use mlx_core::prelude::*;
use mlx_models::LanguageModel;

use crate::adapters::save_adapter_weights;
use crate::data::{Batch, BatchIter, BatchPosition, Dataset, World};
use crate::error::{Result, TrainError};
use crate::nprand::NumpyRandom;
use crate::optim::{clip_grad_norm, Optimizer};
use crate::params::Params;
use crate::resume::{checkpoint_path, optimizer_path, save_state, state_path, Outputs};
use crate::segmented::segmented_loss_and_grad;

/// A loss over a batch: `(mean loss, number of tokens)`, as mlx-lm's `default_loss`.
pub type LossFn = dyn Fn(&dyn LanguageModel, &Array, &Array) -> Result<(Array, Array)>;

/// `TrainingArgs` (mlx-lm's names and defaults) plus `max_grad_norm` (clipping, off by
/// default as in mlx-lm).
#[derive(Clone, Debug)]
pub struct TrainingArgs {
    pub batch_size: usize,
    pub iters: usize,
    /// `-1` uses the entire validation set.
    pub val_batches: i64,
    pub steps_per_report: usize,
    pub steps_per_eval: usize,
    pub steps_per_save: usize,
    pub max_seq_length: usize,
    pub adapter_file: PathBuf,
    pub grad_accumulation_steps: usize,
    pub max_grad_norm: Option<f64>,
    /// Segmented backward with segments of this many positions (SFT's `default_loss` only;
    /// the `loss` argument of [`train`] is then not used for the training steps).
    pub segment_length: Option<i32>,
    /// With `segment_length`: each segment's cross-entropy in chunks of this many positions.
    pub ce_chunk_size: Option<i32>,
    /// Loss and gradients through one compiled function, as mlx-lm's `mx.compile`d step
    /// (see [`CompiledLossGrad`]); off where the loss draws random numbers (LoRA dropout),
    /// whose state a trace would freeze, and for losses that read arrays a trace cannot
    /// capture (`RunConfig` compiles SFT only).
    pub compile: bool,
    /// Clear MLX's allocator cache after each step and each evaluation batch when it holds
    /// more than this many bytes (mlx-lm's `clear_cache_threshold`, whose `TrainingArgs`
    /// default 0 clears whenever it holds any); `None` never clears.
    pub clear_cache_threshold: Option<u64>,
    /// Iterations done before this run (a resumed run's, from its state; see
    /// [`crate::resume`]): this run's iterations are numbered `start_iteration + 1` to
    /// `start_iteration + iters`, and evaluation, reports, accumulation and checkpoints go
    /// by those numbers, as in the uninterrupted run.
    pub start_iteration: usize,
    /// Where the resumed run's batch iterator continues.
    pub resume_batches: Option<BatchPosition>,
    /// The gradient the earlier run was accumulating when it stopped.
    pub resume_grad_accum: Option<ParamMap>,
    /// Which existing files the run may replace (mlx-lm's `train` replaces any; `mlx train`
    /// refuses files of earlier runs unless `--overwrite`).
    pub outputs: Outputs,
    /// Write the resume state beside the adapter file at every checkpoint and at the end.
    pub save_resume_state: bool,
    /// Data-parallel training (`mlx launch ... -- train`): each rank takes its share of every
    /// batch, gradients are averaged over MLX's global group before each update, reported
    /// losses are summed over it, and only rank 0 writes files (mlx-lm's `train` under
    /// `mlx.launch`).
    pub world: World,
}

impl Default for TrainingArgs {
    fn default() -> Self {
        TrainingArgs {
            batch_size: 4,
            iters: 100,
            val_batches: 25,
            steps_per_report: 10,
            steps_per_eval: 200,
            steps_per_save: 100,
            max_seq_length: 2048,
            adapter_file: PathBuf::from("adapters.safetensors"),
            grad_accumulation_steps: 1,
            max_grad_norm: None,
            segment_length: None,
            ce_chunk_size: None,
            compile: true,
            clear_cache_threshold: Some(0),
            start_iteration: 0,
            resume_batches: None,
            resume_grad_accum: None,
            outputs: Outputs::new(true, Vec::new()),
            save_resume_state: true,
            world: World::single(),
        }
    }
}

impl TrainingArgs {
    pub fn validate(&self) -> Result<()> {
        let pos = |v: usize, name: &str| {
            if v == 0 {
                Err(TrainError::Config(format!("{name} must be at least 1")))
            } else {
                Ok(())
            }
        };
        pos(self.batch_size, "batch_size")?;
        pos(self.steps_per_report, "steps_per_report")?;
        pos(self.steps_per_eval, "steps_per_eval")?;
        pos(self.steps_per_save, "save_every")?;
        pos(self.grad_accumulation_steps, "grad_accumulation_steps")?;
        if self.val_batches < -1 {
            return Err(TrainError::Config("val_batches must be -1 or more".into()));
        }
        Ok(())
    }
}

/// What `on_train_loss_report` receives.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TrainReport {
    pub iteration: usize,
    pub train_loss: f64,
    pub learning_rate: f64,
    pub iterations_per_second: f64,
    pub tokens_per_second: f64,
    pub trained_tokens: u64,
    pub peak_memory: f64,
}

/// What `on_val_loss_report` receives.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ValReport {
    pub iteration: usize,
    pub val_loss: f64,
    pub val_time: f64,
}

/// mlx-lm's `TrainingCallback`, plus a hook per step (progress) and per checkpoint.
pub trait TrainingCallback {
    fn on_train_loss_report(&mut self, _info: &TrainReport) {}
    fn on_val_loss_report(&mut self, _info: &ValReport) {}
    fn on_step(&mut self, _iteration: usize, _loss: f32, _tokens: i64) {}
    fn on_save(&mut self, _iteration: usize, _path: &Path) {}
    /// Before the first step: the first iteration's number (1, or after a resume the one
    /// after the earlier run's last) and the last one's.
    fn on_start(&mut self, _first: usize, _last: usize) {}
}

/// A callback that does nothing.
pub struct NoCallback;
impl TrainingCallback for NoCallback {}

/// `loss_value_and_grad(model, batch, lengths)`: the loss, its token count, and the gradient
/// of every trainable parameter (`nn.value_and_grad(model, loss)`).
pub fn loss_and_grad(
    model: &dyn LanguageModel,
    params: &Params,
    loss: &LossFn,
    batch: &Batch,
) -> Result<(Array, Array, ParamMap)> {
    let failure: RefCell<Option<TrainError>> = RefCell::new(None);
    let f = |p: &ParamMap, data: &[Array]| -> mlx_core::Result<Vec<Array>> {
        let r = params
            .update(p)
            .and_then(|_| loss(model, &data[0], &data[1]));
        match r {
            Ok((l, n)) => Ok(vec![l, n]),
            Err(e) => {
                let msg = e.to_string();
                *failure.borrow_mut() = Some(e);
                Err(mlx_core::Error::Callback(msg))
            }
        }
    };
    let current = params.snapshot();
    let r = transforms::value_and_grad_tree(f)(
        &current,
        &[batch.tokens.clone(), batch.lengths.clone()],
    );
    // The model saw tracers; give it the concrete arrays back whatever happened.
    params.update(&current)?;
    let (values, grads) = match r {
        Ok(v) => v,
        Err(e) => return Err(failure.into_inner().unwrap_or(TrainError::Mlx(e))),
    };
    let mut it = values.into_iter();
    match (it.next(), it.next()) {
        (Some(l), Some(n)) => Ok((l, n, grads)),
        _ => Err(TrainError::Config(
            "the loss must return (loss, ntoks)".into(),
        )),
    }
}

/// [`loss_and_grad`] as one compiled function of the trainable parameters and the batch,
/// as mlx-lm's trainer compiles its step (`mx.compile(step, inputs=state, outputs=state)`):
/// MLX fuses the step's elementwise work, which on a GPU saves time and the memory of the
/// intermediate arrays. One trace per batch shape, as in mlx-lm; the frozen weights are
/// constants of the trace. The values are the uncompiled ones (the CPU goldens hold either
/// way).
pub struct CompiledLossGrad<'a> {
    compiled: mlx_core::compile::Compiled<'a>,
    params: &'a Params,
    names: Vec<String>,
    failure: std::rc::Rc<RefCell<Option<TrainError>>>,
}

impl<'a> CompiledLossGrad<'a> {
    pub fn new(model: &'a dyn LanguageModel, params: &'a Params, loss: &'a LossFn) -> Result<Self> {
        let names = params.names();
        let failure = std::rc::Rc::new(RefCell::new(None));
        let (keys, fail) = (names.clone(), std::rc::Rc::clone(&failure));
        let f =
            move |inputs: &[Array]| -> mlx_core::Result<Vec<Array>> {
                let n = keys.len();
                if inputs.len() != n + 2 {
                    return Err(mlx_core::Error::Callback(format!(
                        "the compiled step takes {} arrays, got {}",
                        n + 2,
                        inputs.len()
                    )));
                }
                let tree: ParamMap = keys
                    .iter()
                    .cloned()
                    .zip(inputs[..n].iter().cloned())
                    .collect();
                let batch = Batch {
                    tokens: inputs[n].clone(),
                    lengths: inputs[n + 1].clone(),
                    truncated: false,
                };
                params
                    .update(&tree)
                    .and_then(|_| loss_and_grad(model, params, loss, &batch))
                    .and_then(|(l, t, mut g)| {
                        let mut out = vec![l, t];
                        for k in &keys {
                            out.push(g.remove(k).ok_or_else(|| {
                                TrainError::Config(format!("no gradient for {k}"))
                            })?);
                        }
                        Ok(out)
                    })
                    .map_err(|e| {
                        let msg = e.to_string();
                        *fail.borrow_mut() = Some(e);
                        mlx_core::Error::Callback(msg)
                    })
            };
        let compiled = mlx_core::compile::compile(f, false)?;
        Ok(CompiledLossGrad {
            compiled,
            params,
            names,
            failure,
        })
    }

    /// The loss, its token count and the gradients for `batch` (as [`loss_and_grad`]).
    pub fn call(&self, batch: &Batch) -> Result<(Array, Array, ParamMap)> {
        let current = self.params.snapshot();
        let mut inputs: Vec<Array> = self
            .names
            .iter()
            .map(|k| {
                current.get(k).cloned().ok_or_else(|| {
                    TrainError::Config(format!("trainable parameter {k} went missing"))
                })
            })
            .collect::<Result<_>>()?;
        inputs.push(batch.tokens.clone());
        inputs.push(batch.lengths.clone());
        let r = self.compiled.call(&inputs);
        // A trace leaves its tracers in the parameters: give them the concrete arrays back.
        self.params.update(&current)?;
        let out = match r {
            Ok(v) => v,
            Err(e) => {
                return Err(self
                    .failure
                    .borrow_mut()
                    .take()
                    .unwrap_or(TrainError::Mlx(e)));
            }
        };
        let mut it = out.into_iter();
        match (it.next(), it.next()) {
            (Some(l), Some(n)) => {
                let grads: ParamMap = self.names.iter().cloned().zip(it).collect();
                Ok((l, n, grads))
            }
            _ => Err(TrainError::Config(
                "the compiled step returned no loss".into(),
            )),
        }
    }
}

/// `evaluate(model, dataset, batch_size, num_batches, max_seq_length, loss)`: the mean loss
/// per token over `num_batches` batches (`-1`: all), drawing the batch order from `rng`.
#[allow(clippy::too_many_arguments)]
pub fn evaluate(
    model: &dyn LanguageModel,
    params: &Params,
    dataset: &Dataset,
    batch_size: usize,
    num_batches: i64,
    max_seq_length: usize,
    loss: &LossFn,
    rng: &mut NumpyRandom,
    clear_cache_threshold: Option<u64>,
    world: World,
) -> Result<f64> {
    params.set_training(false);
    let mut all_losses = Array::from_f32(0.0, Dtype::Float32)?;
    let mut ntokens = Array::from_int(0, Dtype::Int32)?;
    let mut it = BatchIter::sharded(dataset, batch_size, max_seq_length, false, world)?;
    let mut i = 0i64;
    while num_batches == -1 || i < num_batches {
        let Some(batch) = it.next_batch(dataset, rng)? else {
            break;
        };
        let (l, t) = loss(model, &batch.tokens, &batch.lengths)?;
        all_losses = (&all_losses + &(&l * &t)?)?;
        ntokens = (&ntokens + &t)?;
        eval([&all_losses, &ntokens])?;
        clear_cache(clear_cache_threshold)?;
        i += 1;
    }
    if world.is_distributed() {
        all_losses = all_sum_cpu(&all_losses)?;
        ntokens = all_sum_cpu(&ntokens)?;
    }
    Ok(f64::from((&all_losses / &ntokens)?.item::<f32>()?))
}

/// The state a run leaves: the optimizer (for checkpoints that resume exactly).
pub struct TrainOutcome {
    pub optimizer: Optimizer,
}

/// `train(model, optimizer, train_dataset, val_dataset, args, loss)`: the mlx-lm loop,
/// with `rng` the numpy global generator (seeded once by the caller, as mlx_lm.lora does).
/// Adapters are written to `args.adapter_file` every `steps_per_save` steps (plus a
/// `{it:07}_adapters.safetensors` checkpoint beside it) and at the end.
#[allow(clippy::too_many_arguments)]
pub fn train(
    model: &dyn LanguageModel,
    params: &Params,
    mut optimizer: Optimizer,
    train_set: &Dataset,
    val_set: &Dataset,
    args: &TrainingArgs,
    loss: &LossFn,
    rng: &mut NumpyRandom,
    callback: &mut dyn TrainingCallback,
) -> Result<TrainOutcome> {
    args.validate()?;
    if params.is_empty() {
        return Err(TrainError::Config("no trainable parameters".into()));
    }
    let accum = args.grad_accumulation_steps;
    let mut compiled = if args.compile && args.segment_length.is_none() {
        Some(CompiledLossGrad::new(model, params, loss)?)
    } else {
        None
    };
    params.set_training(true);
    let world = args.world;
    let mut batches =
        BatchIter::sharded(train_set, args.batch_size, args.max_seq_length, true, world)?;
    if let Some(p) = &args.resume_batches {
        if !batches.restore(p) {
            return Err(TrainError::Config(format!(
                "the resume state's batch order ({} batches) does not fit this training set \
                 ({} batches of {})",
                p.num_batches,
                batches.num_batches(),
                args.batch_size
            )));
        }
    }
    let mut grad_accum: Option<ParamMap> = args.resume_grad_accum.clone();
    let mut losses: Option<Array> = None;
    let mut n_tokens: Option<Array> = None;
    let (mut steps, mut trained_tokens, mut train_time) = (0usize, 0u64, 0f64);
    let mut outputs = args.outputs.clone();
    let start = args.start_iteration;
    let end = start
        .checked_add(args.iters)
        .ok_or_else(|| TrainError::Config("iters: too many iterations".into()))?;
    // numpy's generator as the uninterrupted run has it after iteration `end`: the last
    // iteration's evaluation (mlx-lm evaluates at every run's last iteration) draws a batch
    // order the longer run would not have drawn there.
    let mut rng_for_state: Option<NumpyRandom> = None;
    callback.on_start(start + 1, end);
    for it in start + 1..=end {
        let batch = batches
            .next_batch(train_set, rng)?
            .ok_or_else(|| TrainError::Config("the training set yields no batch".into()))?;
        let mut tic = Instant::now();
        let scheduled_eval = it == 1 || it % args.steps_per_eval == 0;
        if !val_set.is_empty() && it == end && !scheduled_eval {
            rng_for_state = Some(rng.clone());
        }
        if !val_set.is_empty() && (scheduled_eval || it == end) {
            let t = Instant::now();
            let val_loss = evaluate(
                model,
                params,
                val_set,
                args.batch_size,
                args.val_batches,
                args.max_seq_length,
                loss,
                rng,
                args.clear_cache_threshold,
                world,
            )?;
            params.set_training(true);
            callback.on_val_loss_report(&ValReport {
                iteration: it - 1,
                val_loss,
                val_time: t.elapsed().as_secs_f64(),
            });
            tic = Instant::now();
        }

        let (lvalue, toks, mut grad) = match args.segment_length {
            Some(seg) => segmented_loss_and_grad(
                model,
                params,
                &batch.tokens,
                &batch.lengths,
                seg,
                args.ce_chunk_size,
            )?,
            None => match compiled.as_ref().map(|c| c.call(&batch)) {
                Some(Ok(r)) => r,
                // A loss MLX cannot trace (one reading arrays that are neither its inputs nor
                // constants) fails at its first trace, having changed nothing: from here on
                // the step runs uncompiled, and a real error surfaces from there.
                Some(Err(_)) => {
                    compiled = None;
                    loss_and_grad(model, params, loss, &batch)?
                }
                None => loss_and_grad(model, params, loss, &batch)?,
            },
        };
        if let Some(prev) = grad_accum.take() {
            grad = add_trees(&grad, &prev)?;
        }
        if it % accum == 0 {
            if world.is_distributed() {
                grad = average_gradients(&grad, world.size)?;
            }
            if accum > 1 {
                grad = grad
                    .into_iter()
                    .map(|(k, g)| Ok((k, ops::divide_scalar(&g, accum as i64, None)?)))
                    .collect::<Result<_>>()?;
            }
            if let Some(max_norm) = args.max_grad_norm {
                grad = clip_grad_norm(&grad, max_norm)?.0;
            }
            // Compiled whatever `args.compile` says: the update draws no random numbers and
            // reads nothing a trace cannot capture (mlx-lm compiles it inside its step).
            let new = optimizer.apply_gradients_compiled(&grad, &params.snapshot())?;
            params.update(&new)?;
        } else {
            grad_accum = Some(grad);
        }
        let l = match losses.take() {
            None => ops::scalar_add(0, &lvalue, None)?,
            Some(a) => (&a + &lvalue)?,
        };
        let n = match n_tokens.take() {
            None => ops::scalar_add(0, &toks, None)?,
            Some(a) => (&a + &toks)?,
        };
        let mut to_eval: Vec<Array> = params.snapshot().into_values().collect();
        to_eval.extend(optimizer.state_arrays());
        to_eval.push(l.clone());
        to_eval.push(n.clone());
        if let Some(g) = &grad_accum {
            to_eval.extend(g.values().cloned());
        }
        eval(&to_eval)?;
        clear_cache(args.clear_cache_threshold)?;
        steps += 1;
        train_time += tic.elapsed().as_secs_f64();
        callback.on_step(it, lvalue.item::<f32>()?, i64::from(toks.item::<i32>()?));

        if it % args.steps_per_report == 0 || it == end {
            let (l, n) = if world.is_distributed() {
                (all_sum_cpu(&l)?, all_sum_cpu(&n)?)
            } else {
                (l, n)
            };
            let train_loss = f64::from(l.item::<f32>()?) / (steps * world.size) as f64;
            let ntok = u64::try_from(n.item::<i32>()?).unwrap_or(0);
            trained_tokens += ntok;
            let t = train_time.max(1e-9);
            callback.on_train_loss_report(&TrainReport {
                iteration: it,
                train_loss,
                // NaN where there is none (Adafactor's relative steps, `learning_rate=None`).
                learning_rate: match optimizer.learning_rate() {
                    Some(lr) => f64::from(lr.item::<f32>()?),
                    None => f64::NAN,
                },
                iterations_per_second: args.steps_per_report as f64 / t,
                tokens_per_second: ntok as f64 / t,
                trained_tokens,
                peak_memory: mlx_core::memory::peak_memory().unwrap_or(0) as f64 / 1e9,
            });
            steps = 0;
            train_time = 0.0;
        } else {
            losses = Some(l);
            n_tokens = Some(n);
        }

        if it % args.steps_per_save == 0 && world.rank == 0 {
            outputs.claim(&args.adapter_file)?;
            save_adapter_weights(&args.adapter_file, params)?;
            let checkpoint = checkpoint_path(&args.adapter_file, it);
            outputs.claim(&checkpoint)?;
            save_adapter_weights(&checkpoint, params)?;
            let state_rng: &NumpyRandom = match &rng_for_state {
                Some(r) if it == end => r,
                _ => rng,
            };
            write_state(
                args,
                &mut outputs,
                it,
                &optimizer,
                grad_accum.as_ref(),
                state_rng,
                batches.position(),
            )?;
            callback.on_save(it, &checkpoint);
        }
    }
    if world.rank != 0 {
        return Ok(TrainOutcome { optimizer });
    }
    outputs.claim(&args.adapter_file)?;
    save_adapter_weights(&args.adapter_file, params)?;
    write_state(
        args,
        &mut outputs,
        end,
        &optimizer,
        grad_accum.as_ref(),
        rng_for_state.as_ref().unwrap_or(&*rng),
        batches.position(),
    )?;
    Ok(TrainOutcome { optimizer })
}

/// The resume state of iteration `it` beside the adapter file (see [`crate::resume`]).
fn write_state(
    args: &TrainingArgs,
    outputs: &mut Outputs,
    it: usize,
    optimizer: &Optimizer,
    grad_accum: Option<&ParamMap>,
    rng: &NumpyRandom,
    batches: BatchPosition,
) -> Result<()> {
    if !args.save_resume_state {
        return Ok(());
    }
    outputs.claim(&optimizer_path(&args.adapter_file))?;
    outputs.claim(&state_path(&args.adapter_file))?;
    save_state(&args.adapter_file, it, optimizer, grad_accum, rng, batches)
}

/// mlx-lm's `_clear_cache`: frees MLX's cached buffers when they pass `threshold` bytes.
fn clear_cache(threshold: Option<u64>) -> Result<()> {
    if let Some(t) = threshold {
        if mlx_core::memory::cache_memory()? as u64 > t {
            mlx_core::memory::clear_cache()?;
        }
    }
    Ok(())
}

/// `mlx.nn.average_gradients`: every gradient summed over MLX's global group and divided
/// by its size. mlx-lm concatenates same-dtype gradients into ~32 MiB messages first; the
/// sums are elementwise, so each element comes out the same either way, and so does this
/// (fewer, larger messages only change the transport's work).
fn average_gradients(grad: &ParamMap, size: usize) -> Result<ParamMap> {
    const MESSAGE_BYTES: usize = 32 << 20;
    let keys: Vec<&String> = grad.keys().collect();
    let mut out = ParamMap::new();
    let mut start = 0;
    while start < keys.len() {
        // One message: consecutive gradients of one dtype, up to ~32 MiB.
        let dtype = grad[keys[start]].dtype();
        let (mut end, mut bytes) = (start, 0usize);
        while end < keys.len() && bytes < MESSAGE_BYTES && grad[keys[end]].dtype() == dtype {
            let g = &grad[keys[end]];
            bytes += g.size() * dtype.size();
            end += 1;
        }
        let flat: Vec<Array> = keys[start..end]
            .iter()
            .map(|k| grad[*k].reshape(&[-1]))
            .collect::<std::result::Result<_, _>>()?;
        let refs: Vec<&Array> = flat.iter().collect();
        let joined = ops::concatenate(&refs, 0, None)?;
        let summed = mlx_core::distributed::all_sum(&joined, None, None)?;
        let avg = ops::divide_scalar(&summed, size as i64, None)?;
        let mut offset = 0i32;
        for k in &keys[start..end] {
            let g = &grad[*k];
            let n = g.size() as i32;
            let part = avg
                .slice(&[offset], &[offset + n], &[1])?
                .reshape(&g.shape())?;
            out.insert((*k).clone(), part);
            offset += n;
        }
        start = end;
    }
    Ok(out)
}

/// `mx.distributed.all_sum(x, stream=mx.cpu)` over the global group (mlx-lm's reports).
fn all_sum_cpu(x: &Array) -> Result<Array> {
    let cpu = mlx_core::Stream::cpu()?;
    Ok(mlx_core::distributed::all_sum(x, None, Some(&cpu))?)
}

fn add_trees(a: &ParamMap, b: &ParamMap) -> Result<ParamMap> {
    a.iter()
        .map(|(k, x)| {
            let y = b
                .get(k)
                .ok_or_else(|| TrainError::Config(format!("accumulated gradient lacks {k}")))?;
            Ok((k.clone(), (x + y)?))
        })
        .collect()
}

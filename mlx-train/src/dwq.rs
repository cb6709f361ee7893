//! DWQ (distilled weight quantization) as mlx-lm 0.32.2 runs it (`mlx_lm/quant/dwq.py`,
//! `python -m mlx_lm.quant.dwq`): the float model is the teacher (or its top-1024 logits saved
//! under `--target-dir`), its copy quantized by `quantize_model` (or `--quantized-model`) the
//! student, and the student's trainable arrays (the
//! scales and biases of its affine layers under 8 bits, and every array outside quantized
//! modules, such as the norms, which mlx-lm's `trainable_parameters` leaves unfrozen) are
//! trained in float32 by `Adam(learning_rate, bias_correction=True)` on
//! `kl_div_loss(logits / T, targets / T)` over the unpadded positions, the model running with
//! them cast to `dtype` (bfloat16); one pass over the training rows in `iterate_batches` order,
//! validation before, every 200 steps and at the end. The output is the student with the
//! trained arrays in `dtype`, written by mlx-lm's `save`.
//!
//! The data are mlx-lm's `load_data`: numpy's permutation of the rows under `--seed`, the first
//! `num_samples` for training and the next 32 for validation, each tokenized by
//! `create_dataset`'s formats and cut at `max_seq_length`.
//!
//! Tier L1 on CPU, what the tests check (`mlx-cli/tests/quant.rs`): the same ops in mlx-lm's
//! order (the student rebuilt from its arrays at each step, MLX's vjp through it, the tuner's
//! Adam), so the written tensors equal mlx-lm's bit for bit.

use std::path::Path;

use mlx_core::prelude::*;
use mlx_core::quantized::QuantMode;
use mlx_models::config::ModelConfig;
use mlx_models::convert::{
    convert_in_memory, save_converted, ConvertOptions, ConvertReport, Converted, Progress,
};
use mlx_models::dynamic_quant::kl_div_loss;
use mlx_models::models::build;
use mlx_models::weights::Weights;
use mlx_models::LanguageModel;
use serde_json::{Map, Value};

use crate::data::{create_dataset, BatchIter, DataConfig, Dataset, Example};
use crate::error::{Result, TrainError};
use crate::nprand::NumpyRandom;
use crate::optim::{LearningRate, Method, Optimizer};
use crate::tokenize::Tokenizer;

/// `python -m mlx_lm.quant.dwq`'s options that shape the run.
#[derive(Clone, Debug)]
pub struct DwqOptions {
    pub bits: i32,
    pub group_size: i32,
    pub num_samples: usize,
    pub max_seq_length: usize,
    pub seed: u32,
    pub learning_rate: f64,
    pub batch_size: usize,
    pub grad_checkpoint: bool,
    /// The dtype the trained arrays run (and are saved) in (`dwq_quantize`'s `dtype`).
    pub dtype: Dtype,
    pub temperature: f64,
    /// Validation rows after the training ones (`load_data`'s `num_valid_samples`).
    pub num_valid_samples: usize,
}

impl Default for DwqOptions {
    fn default() -> Self {
        DwqOptions {
            bits: 4,
            group_size: 64,
            num_samples: 2048,
            max_seq_length: 1025,
            seed: 123,
            learning_rate: 1e-6,
            batch_size: 4,
            grad_checkpoint: false,
            dtype: Dtype::Bfloat16,
            temperature: 2.0,
            num_valid_samples: 32,
        }
    }
}

/// Where the student and the targets come from (`--quantized-model`, `--target-dir`,
/// `--targets-only`).
#[derive(Clone, Debug, Default)]
pub struct DwqSources<'a> {
    /// An already quantized model to train instead of quantizing the teacher.
    pub quantized_model: Option<&'a Path>,
    /// Where the teacher's top-1024 logits are saved (computed when the directory holds no
    /// `train/*.safetensors` and `valid/*.safetensors` yet) and read back from.
    pub target_dir: Option<&'a Path>,
    /// Compute the targets and stop.
    pub targets_only: bool,
}

/// What the run reports (mlx-lm's printed lines, as events).
pub enum DwqEvent<'a> {
    /// `Trainable parameters: ...`.
    Trainable {
        trainable: usize,
        total: usize,
    },
    /// `Validation: it=..., loss=...`.
    Validation {
        it: usize,
        loss: f64,
    },
    /// One training step's loss and tokens.
    Step {
        it: usize,
        loss: f64,
        tokens: i64,
    },
    Convert(Progress<'a>),
}

/// `load_data(tokenizer, data_path, num_samples, max_seq_length)` on rows already read (the
/// `train` split, in file order): the training and validation examples.
pub fn load_data(
    tok: &Tokenizer,
    rows: &[Map<String, Value>],
    file: &str,
    opts: &DwqOptions,
) -> Result<(Dataset, Dataset)> {
    let dataset = create_dataset(rows, tok, &DataConfig::default(), file)?;
    // `np.random.seed(args.seed)` in `main`, then `np.random.permutation(len(dataset))`.
    let mut rng = NumpyRandom::new(opts.seed);
    let perm = rng.permutation(dataset.len());
    let n = opts.num_samples.min(perm.len());
    let v_end = (opts.num_samples + opts.num_valid_samples).min(perm.len());
    let process = |i: &usize| {
        let e = &dataset.examples[*i];
        let tokens: Vec<u32> = e.tokens.iter().take(opts.max_seq_length).copied().collect();
        // DWQ's rows are `(tokens, offset)` tuples: `iterate_batches` sorts them by length.
        Example {
            item_len: tokens.len(),
            tokens,
            offset: e.offset,
            rejected: None,
        }
    };
    let train = perm[..n].iter().map(process).collect();
    let valid = perm[n.min(v_end)..v_end].iter().map(process).collect();
    Ok((Dataset { examples: train }, Dataset { examples: valid }))
}

/// The student: the parameters, which of them train, and how to rebuild the model.
struct Student {
    converted: Converted,
    config: ModelConfig,
    trainable: Vec<usize>,
}

impl Student {
    fn new(converted: Converted) -> Result<Student> {
        let config = ModelConfig::from_value(Value::Object(converted.config().clone()))?;
        let trainable = converted
            .params
            .iter()
            .enumerate()
            .filter(|(_, (name, _))| {
                let (module, leaf) = name.rsplit_once('.').unwrap_or(("", name));
                match converted.quantization(module) {
                    // `unfreeze(keys=["scales", "biases"])` of affine layers under 8 bits; a
                    // quantized layer's other arrays stay frozen.
                    Some((bits, _, mode)) => {
                        mode == QuantMode::Affine
                            && bits < 8
                            && (leaf == "scales" || leaf == "biases")
                    }
                    None => true,
                }
            })
            .map(|(i, _)| i)
            .collect();
        Ok(Student {
            converted,
            config,
            trainable,
        })
    }

    /// `tree_map(astype(float32), model.trainable_parameters())`.
    fn params(&self) -> Result<ParamMap> {
        self.trainable
            .iter()
            .map(|&i| {
                let (k, v) = &self.converted.params[i];
                Ok((k.clone(), v.astype(Dtype::Float32)?))
            })
            .collect()
    }

    /// The model with `params` cast to `dtype` in place of its trainable arrays
    /// (`model.update(tree_map(lambda x: x.astype(dtype), params))`).
    fn model(&self, params: &ParamMap, dtype: Dtype) -> Result<Box<dyn LanguageModel>> {
        let mut tensors = std::collections::BTreeMap::new();
        for (k, v) in &self.converted.params {
            let a = match params.get(k) {
                Some(p) => p.astype(dtype)?,
                None => v.clone(),
            };
            tensors.insert(k.clone(), a);
        }
        Ok(build(
            &self.config,
            Weights::new(tensors, self.config.quantization.clone(), None),
        )?)
    }
}

/// `dwq_quantize`'s `loss_fn`: the masked mean of the tempered KL divergence, and the count of
/// positions.
fn dwq_loss(
    logits: &Array,
    targets: &Array,
    lengths: &Array,
    scale: f64,
) -> Result<(Array, Array)> {
    let s = |a: &Array| -> Result<Array> { Ok((a * &Array::from_f32(scale as f32, a.dtype())?)?) };
    let losses = kl_div_loss(&s(logits)?, &s(targets)?)?;
    let t = targets.shape()[1];
    let pos = ops::arange(1.0, f64::from(1 + t), 1.0, Dtype::Int32, None)?;
    let b = lengths.shape()[0];
    let len = lengths.slice(&[0, 1], &[b, 2], &[1, 1])?;
    let mask = ops::less(&pos, &len, None)?;
    let ntoks = mask.sum_all(false)?;
    let loss = (&(&mask * &losses)?.sum_all(false)? / &ntoks)?;
    Ok((loss, ntoks))
}

/// `python -m mlx_lm.quant.dwq --model SRC --mlx-path DST` on `train`/`valid`.
pub fn dwq(
    src: &Path,
    dst: &Path,
    train: &Dataset,
    valid: &Dataset,
    opts: &DwqOptions,
    on_event: &mut dyn FnMut(DwqEvent<'_>),
) -> Result<ConvertReport> {
    dwq_with(
        src,
        dst,
        train,
        valid,
        opts,
        &DwqSources::default(),
        on_event,
    )?
    .ok_or_else(|| TrainError::Config("no model written (the targets only were asked for)".into()))
}

/// Whether `dir` holds targets (`train/*.safetensors` and `valid/*.safetensors`).
fn has_targets(dir: &Path) -> bool {
    let any = |split: &str| {
        std::fs::read_dir(dir.join(split)).is_ok_and(|rd| {
            rd.filter_map(|e| e.ok())
                .any(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        })
    };
    dir.is_dir() && any("train") && any("valid")
}

/// `compute_dwq_targets`: for `valid` then `train`, each batch's teacher logits (inputs
/// without their last token), their top 1024 by `argpartition(kth=-1024)` and the matching
/// logits, saved as `{"logits", "indices"}` in `dir/<split>/<batch index:010>.safetensors`.
fn compute_targets(
    teacher: &dyn LanguageModel,
    dir: &Path,
    train: &Dataset,
    valid: &Dataset,
    opts: &DwqOptions,
) -> Result<()> {
    for (data, split) in [(valid, "valid"), (train, "train")] {
        let path = dir.join(split);
        std::fs::create_dir_all(&path).map_err(|e| TrainError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let mut it = BatchIter::new(data, opts.batch_size, opts.max_seq_length, false)?;
        let mut rng = NumpyRandom::new(opts.seed);
        let mut i = 0usize;
        while let Some(batch) = it.next_batch(data, &mut rng)? {
            let (b, w) = (batch.tokens.shape()[0], batch.tokens.shape()[1]);
            let x = batch.tokens.slice(&[0, 0], &[b, w - 1], &[1, 1])?;
            let logits = teacher.forward(&x, None)?;
            mlx_core::eval([&logits])?;
            let v = logits.shape()[2];
            let idx = ops::argpartition(&logits, -1024, -1, None)?;
            let idx = idx.slice(&[0, 0, v - 1024], &[b, w - 1, v], &[1, 1, 1])?;
            let top = ops::take_along_axis(&logits, &idx, -1, None)?;
            let file = path.join(format!("{i:010}.safetensors"));
            mlx_core::io::save_safetensors(
                &file,
                [("logits", &top), ("indices", &idx)],
                &Default::default(),
            )?;
            i += 1;
        }
    }
    Ok(())
}

/// [`dwq`] with mlx-lm's other sources: an already quantized student, targets saved to (or
/// read from) a directory, or the targets alone (then `None`). In one process `--pipeline`
/// changes nothing (mlx-lm shards only over a group of several).
pub fn dwq_with(
    src: &Path,
    dst: &Path,
    train: &Dataset,
    valid: &Dataset,
    opts: &DwqOptions,
    sources: &DwqSources<'_>,
    on_event: &mut dyn FnMut(DwqEvent<'_>),
) -> Result<Option<ConvertReport>> {
    let mut targets = sources.target_dir.filter(|d| has_targets(d));
    // The float model, unless both the targets and the student are given.
    let teacher = match (targets, sources.quantized_model) {
        (Some(_), Some(_)) => None,
        _ => Some(mlx_models::load::load_model_dir(src, &Default::default())?.0),
    };
    if let (None, Some(dir), Some(t)) = (targets, sources.target_dir, teacher.as_ref()) {
        compute_targets(t.as_ref(), dir, train, valid, opts)?;
        targets = Some(dir);
    }
    if sources.targets_only {
        return Ok(None);
    }
    if dst.exists() {
        return Err(TrainError::option(
            "--mlx-path",
            format!("{} already exists", dst.display()),
        ));
    }
    if valid.is_empty() {
        return Err(TrainError::option(
            "--num-samples",
            "leaves no validation rows (mlx-lm takes the 32 after the training ones)",
        ));
    }
    let converted = match sources.quantized_model {
        Some(q) => {
            let copts = ConvertOptions {
                keep_dtype: true,
                ..ConvertOptions::default()
            };
            let c = convert_in_memory(q, &copts, &mut |p| on_event(DwqEvent::Convert(p)))?;
            if !c.config().contains_key("quantization") {
                return Err(TrainError::option(
                    "--quantized-model",
                    format!(
                        "{}: Quantized model must already be quantized.",
                        q.display()
                    ),
                ));
            }
            c
        }
        None => {
            let copts = ConvertOptions {
                quantize: true,
                q_bits: Some(opts.bits),
                q_group_size: Some(opts.group_size),
                keep_dtype: true,
                ..ConvertOptions::default()
            };
            convert_in_memory(src, &copts, &mut |p| on_event(DwqEvent::Convert(p)))?
        }
    };
    let target = match targets {
        Some(dir) => Target::Saved(dir),
        None => match teacher.as_ref() {
            Some(t) => Target::Teacher(t.as_ref()),
            None => {
                return Err(TrainError::Config(
                    "no teacher and no targets (internal)".into(),
                ))
            }
        },
    };
    let student = Student::new(converted)?;
    let total = total_parameters(&student);
    let params = student.params()?;
    on_event(DwqEvent::Trainable {
        trainable: params.values().map(Array::size).sum(),
        total,
    });
    let params = train_student(&student, &target, params, train, valid, opts, on_event)?;
    let Student { mut converted, .. } = student;
    for (k, v) in converted.params.iter_mut() {
        if let Some(p) = params.get(k) {
            *v = p.astype(opts.dtype)?;
        }
    }
    Ok(Some(save_converted(src, dst, &converted, &[], &mut |p| {
        on_event(DwqEvent::Convert(p))
    })?))
}

/// `target_fn`: the teacher's logits, or the saved top-1024 logits and their indices.
enum Target<'a> {
    Teacher(&'a dyn LanguageModel),
    Saved(&'a Path),
}

/// `dwq_quantize`'s validation and training loop: the trained float32 arrays.
fn train_student(
    student: &Student,
    target: &Target<'_>,
    mut params: ParamMap,
    train: &Dataset,
    valid: &Dataset,
    opts: &DwqOptions,
    on_event: &mut dyn FnMut(DwqEvent<'_>),
) -> Result<ParamMap> {
    let scale = 1.0 / opts.temperature;
    let dtype = opts.dtype;
    let grad_checkpoint = opts.grad_checkpoint;
    let loss_fn = |p: &ParamMap, others: &[Array]| -> mlx_core::Result<Vec<Array>> {
        let cb = |e: TrainError| mlx_core::Error::Callback(e.to_string());
        let mut m = student.model(p, dtype).map_err(cb)?;
        if let (true, Some(t)) = (grad_checkpoint, m.as_trainable_mut()) {
            t.set_grad_checkpoint(true);
        }
        let mut logits = m.forward(&others[0], None).map_err(|e| cb(e.into()))?;
        if let Some(ids) = others.get(3) {
            // Saved targets: the student's logits at the teacher's top indices.
            logits = ops::take_along_axis(&logits, ids, -1, None)?;
        }
        let (l, n) = dwq_loss(&logits, &others[1], &others[2], scale).map_err(cb)?;
        Ok(vec![l, n])
    };
    let vg = transforms::value_and_grad_tree(&loss_fn);
    let mut opt = Optimizer::new(
        Method::Adam {
            betas: [0.9, 0.999],
            eps: 1e-8,
            bias_correction: true,
        },
        LearningRate::Constant(opts.learning_rate),
    )?;

    // The inputs (the batch less its last token) and `target_fn(batch, idx, split)`.
    let targets_of = |batch: &Array, idx: usize, split: &str| -> Result<Vec<Array>> {
        let w = batch.shape()[1];
        let b = batch.shape()[0];
        let x = batch.slice(&[0, 0], &[b, w - 1], &[1, 1])?;
        match target {
            Target::Teacher(teacher) => {
                let t = teacher.forward(&x, None)?;
                mlx_core::eval([&t])?;
                Ok(vec![x, t])
            }
            Target::Saved(dir) => {
                let file = dir.join(split).join(format!("{idx:010}.safetensors"));
                let (m, _) = mlx_core::io::load_safetensors(&file, None)?;
                let get = |k: &str| {
                    m.get(k).cloned().ok_or_else(|| {
                        TrainError::Config(format!("{}: no `{k}` tensor", file.display()))
                    })
                };
                let (t, ids) = (get("logits")?, get("indices")?);
                mlx_core::eval([&t, &ids])?;
                Ok(vec![x, t, ids])
            }
        }
    };
    let with_lengths = |mut xt: Vec<Array>, lengths: &Array| {
        let ids = (xt.len() == 3).then(|| xt.remove(2));
        xt.push(lengths.clone());
        xt.extend(ids);
        xt
    };
    let validate = |params: &ParamMap| -> Result<f64> {
        let mut it = BatchIter::new(valid, opts.batch_size, opts.max_seq_length, false)?;
        let mut rng = NumpyRandom::new(opts.seed);
        let (mut v_loss, mut v_tokens) = (0.0f64, 0i64);
        let mut i = 0usize;
        while let Some(batch) = it.next_batch(valid, &mut rng)? {
            let xt = targets_of(&batch.tokens, i, "valid")?;
            i += 1;
            let out = loss_fn(params, &with_lengths(xt, &batch.lengths))?;
            mlx_core::eval(out.iter())?;
            let loss = f64::from(out[0].item::<f32>()?);
            let ntoks = out[1].astype(Dtype::Int64)?.item::<i64>()?;
            v_tokens += ntoks;
            v_loss += loss * ntoks as f64;
        }
        Ok(v_loss / v_tokens as f64)
    };

    let initial = validate(&params)?;
    on_event(DwqEvent::Validation {
        it: 0,
        loss: initial,
    });
    let mut iter = BatchIter::new(train, opts.batch_size, opts.max_seq_length, false)?;
    let mut rng = NumpyRandom::new(opts.seed);
    let mut it = 0usize;
    let mut last = 0usize;
    while let Some(batch) = iter.next_batch(train, &mut rng)? {
        let xt = targets_of(&batch.tokens, it, "train")?;
        let (values, grads) = vg(&params, &with_lengths(xt, &batch.lengths))?;
        params = opt.apply_gradients(&grads, &params)?;
        let mut outs: Vec<&Array> = values.iter().collect();
        outs.extend(params.values());
        mlx_core::eval(outs)?;
        on_event(DwqEvent::Step {
            it,
            loss: f64::from(values[0].item::<f32>()?),
            tokens: values[1].astype(Dtype::Int64)?.item::<i64>()?,
        });
        if (it + 1) % 200 == 0 {
            let l = validate(&params)?;
            on_event(DwqEvent::Validation { it, loss: l });
        }
        last = it;
        it += 1;
    }
    let final_loss = validate(&params)?;
    on_event(DwqEvent::Validation {
        it: last,
        loss: final_loss,
    });
    Ok(params)
}

/// `get_total_parameters(model)`: a quantized module counts its unpacked weight (and bias).
fn total_parameters(s: &Student) -> usize {
    s.converted
        .params
        .iter()
        .map(|(name, a)| {
            let (module, leaf) = name.rsplit_once('.').unwrap_or(("", name));
            match s.converted.quantization(module) {
                Some((bits, _, _)) => match leaf {
                    "weight" => a.size() * 32 / bits as usize,
                    "bias" => a.size(),
                    _ => 0,
                },
                None => a.size(),
            }
        })
        .sum()
}

//! L1 against mlx-lm 0.32.2's tuner (goldens from `cargo xtask goldens train`): for each run
//! of `xtask/oracle/goldens_train.py` (its options are read back from the
//! `adapter_config.json` mlx_lm.lora wrote), bit for bit on CPU:
//! the batches, the adapter init, every step's training loss and the validation losses, the
//! adapter weights after training, the loss and every adapter gradient at the trained
//! weights, the logits with mlx-lm's adapter loaded here, and the fused model. The `full_*`
//! runs are `--fine-tune-type full` (their "adapters" are the trained layer weights). The
//! Muon and Adafactor runs come from `cargo xtask goldens train_optim`.

use std::path::{Path, PathBuf};

use mlx_core::prelude::*;
use mlx_core::testing::{assert_bit_equal, Case, Goldens};
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::models::Trainable;
use mlx_train::adapters::{fuse_model_dir, load_adapters};
use mlx_train::data::{Batch, BatchIter};
use mlx_train::full::FullModel;
use mlx_train::lora::linear_to_lora_layers;
use mlx_train::loss::default_loss;
use mlx_train::nprand::NumpyRandom;
use mlx_train::optim::{LearningRate, Method, Optimizer};
use mlx_train::run::{prepare, train_model, RunConfig};
use mlx_train::trainer::{
    loss_and_grad, CompiledLossGrad, TrainReport, TrainingCallback, ValReport,
};
use mlx_train::Params;

/// MLX's global PRNG key is process-wide: runs that seed it take turns.
static SEEDED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn names(case: &Case) -> Vec<String> {
    case.params["names"]
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .map(str::to_string)
        .collect()
}

fn check_named(case: &Case, skip: usize, got: &ParamMap) -> Result<(), String> {
    let names = names(case);
    if got.len() != names.len() {
        return Err(format!(
            "{}: {} parameters, oracle has {} ({:?})",
            case.name,
            got.len(),
            names.len(),
            got.keys().collect::<Vec<_>>()
        ));
    }
    for (i, n) in names.iter().enumerate() {
        let a = got
            .get(n)
            .ok_or_else(|| format!("{}: missing {n}", case.name))?;
        assert_bit_equal(a, &case.outputs[skip + i])
            .map_err(|m| format!("{}: {n}: {m}", case.name))?;
    }
    Ok(())
}

#[derive(Default)]
struct Rec {
    train: Vec<f32>,
    val: Vec<f32>,
}

impl TrainingCallback for Rec {
    fn on_train_loss_report(&mut self, info: &TrainReport) {
        self.train.push(info.train_loss as f32);
    }
    fn on_val_loss_report(&mut self, info: &ValReport) {
        self.val.push(info.val_loss as f32);
    }
}

fn config_for(run: &str, out: &Path) -> RunConfig {
    let ws = root().join("../..");
    let mut c = RunConfig::from_json_file(
        &root()
            .join("adapters")
            .join(run)
            .join("adapter_config.json"),
    )
    .unwrap();
    c.model = ws.join(&c.model).display().to_string();
    c.data = ws.join(&c.data).display().to_string();
    c.resume_adapter_file = c
        .resume_adapter_file
        .map(|f| ws.join(f).display().to_string());
    c.adapter_path = out.display().to_string();
    c
}

fn check_run(run: &str) -> Result<(), String> {
    let g = Goldens::load(
        root()
            .join("goldens")
            .join(format!("train_{run}.safetensors")),
    )
    .map_err(|e| e.to_string())?;
    let out = std::env::temp_dir().join(format!("mlx_train_l1_{run}_{}", std::process::id()));
    let config = config_for(run, &out);
    let e = |e: mlx_train::TrainError| format!("{run}: {e}");

    // Batches, from numpy's global generator.
    let prepared = prepare(&config).map_err(e)?;
    let mut rng = NumpyRandom::new(config.seed);
    let mut it = BatchIter::new(
        &prepared.train,
        config.batch_size,
        config.max_seq_length,
        true,
    )
    .map_err(e)?;
    for i in 0..3 {
        let b = it
            .next_batch(&prepared.train, &mut rng)
            .map_err(e)?
            .unwrap();
        g.case(&format!("batch{i}"))
            .map_err(|e| e.to_string())?
            .check(&[b.tokens, b.lengths])?;
    }
    // Adapter init right after linear_to_lora_layers.
    check_named(&g.case("init").unwrap(), 0, &prepared.params.snapshot())?;
    drop(prepared);

    // Training: every reported loss, the validation losses and the final adapters.
    let mut rec = Rec::default();
    let (p, _) = train_model(&config, &mut rec).map_err(e)?;
    let report = g.case("report").unwrap();
    let got = [
        Array::from_slice(&rec.train, &[rec.train.len() as i32]).unwrap(),
        Array::from_slice(&rec.val, &[rec.val.len() as i32]).unwrap(),
    ];
    report.check(&got)?;
    check_named(&g.case("final").unwrap(), 0, &p.params.snapshot())?;
    // Our adapters.safetensors holds the same arrays.
    let (saved, _) =
        mlx_core::io::load_safetensors(out.join("adapters.safetensors"), None).unwrap();
    check_named(&g.case("final").unwrap(), 0, &saved)?;

    // Loss and gradients at the trained weights on the first batch.
    p.params.set_training(true);
    let mut rng = NumpyRandom::new(config.seed);
    let mut it =
        BatchIter::new(&p.train, config.batch_size, config.max_seq_length, true).map_err(e)?;
    let b0 = it.next_batch(&p.train, &mut rng).map_err(e)?.unwrap();
    let loss = |m: &dyn mlx_models::LanguageModel, b: &Array, l: &Array| default_loss(m, b, l);
    let (l, n, grads) = loss_and_grad(p.model.as_ref(), &p.params, &loss, &b0).map_err(e)?;
    let gc = g.case("grad").unwrap();
    assert_bit_equal(&l, &gc.outputs[0]).map_err(|m| format!("grad loss: {m}"))?;
    assert_bit_equal(&n, &gc.outputs[1]).map_err(|m| format!("grad ntoks: {m}"))?;
    check_named(&gc, 2, &grads)?;

    // mlx-lm's adapter loaded here; and the fused model.
    let lc = g.case("logits").unwrap();
    let ids = lc.input(0).unwrap();
    let model_dir = PathBuf::from(&config.model);
    let (mut model, _) =
        load_model_dir(&model_dir, &LoadOptions::default()).map_err(|e| e.to_string())?;
    load_adapters(model.as_mut(), &root().join("adapters").join(run)).map_err(e)?;
    let logits = model.forward(ids, None).map_err(|e| e.to_string())?;
    assert_bit_equal(&logits, &lc.outputs[0]).map_err(|m| format!("adapted logits: {m}"))?;
    // Ours, loaded the same way, gives the same logits.
    let (mut model, _) =
        load_model_dir(&model_dir, &LoadOptions::default()).map_err(|e| e.to_string())?;
    load_adapters(model.as_mut(), &out).map_err(e)?;
    let logits = model.forward(ids, None).map_err(|e| e.to_string())?;
    assert_bit_equal(&logits, &lc.outputs[0]).map_err(|m| format!("own adapter logits: {m}"))?;

    let fused = out.join("fused");
    fuse_model_dir(
        &model_dir,
        &root().join("adapters").join(run),
        &fused,
        false,
    )
    .map_err(e)?;
    let (fmodel, _) = load_model_dir(&fused, &LoadOptions::default()).map_err(|e| e.to_string())?;
    let logits = fmodel.forward(ids, None).map_err(|e| e.to_string())?;
    assert_bit_equal(&logits, &lc.outputs[1]).map_err(|m| format!("fused logits: {m}"))?;
    let (fw, _) = mlx_core::io::load_safetensors(fused.join("model.safetensors"), None).unwrap();
    check_named(&g.case("fused_weights").unwrap(), 0, &fw)?;
    if let Ok(dq) = g.case("dequantized") {
        // mlx_lm.fuse --dequantize.
        let dir = out.join("dequantized");
        fuse_model_dir(&model_dir, &root().join("adapters").join(run), &dir, true).map_err(e)?;
        let (dmodel, _) =
            load_model_dir(&dir, &LoadOptions::default()).map_err(|e| e.to_string())?;
        let logits = dmodel.forward(ids, None).map_err(|e| e.to_string())?;
        assert_bit_equal(&logits, &dq.outputs[0])
            .map_err(|m| format!("dequantized logits: {m}"))?;
        let (dw, _) = mlx_core::io::load_safetensors(dir.join("model.safetensors"), None).unwrap();
        check_named(&dq, 1, &dw)?;
    }
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

macro_rules! run_test {
    ($name:ident) => {
        #[test]
        fn $name() {
            let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
            check_run(stringify!($name)).unwrap();
        }
    };
}

run_test!(dense_text_adam);
run_test!(q4_completions_mask_adamw_cosine_accum);
run_test!(dense_chat_sgd_keys);
run_test!(dense_chat_dora_mask);
// --fine-tune-type full: whole layers train (Adam; AdamW resuming from the first run's
// weights; the 4-bit base, where only the norms train).
run_test!(full_dense_text_adam);
run_test!(full_dense_chat_adamw_resume);
run_test!(full_q4_completions_adamw_accum);
// Gemma 3 (`1 + weight` norms, QK norms after the heads' transpose, a sliding layer), both
// layers in full.
run_test!(full_gemma3_chat_adamw);
// The dedicated ports end to end through mlx_lm.lora's train_model: LoRA on a Qwen3 MoE (the
// experts through LoRASwitchLinear), DoRA on a Qwen3-Next hybrid (gated delta and attention
// layers, experts left out by `keys`) with gradient checkpointing.
run_test!(moe_text_adam);
run_test!(hybrid_chat_dora_ckpt);
// Muon and Adafactor (`cargo xtask goldens train_optim`): defaults on LoRA, and every option
// off its default under full fine-tuning (1-D norms take their non-matrix paths), a
// scheduled learning rate, relative steps with warmup_init and a first moment.
run_test!(dense_text_muon);
run_test!(full_dense_chat_muon_options);
run_test!(q4_completions_adafactor);
run_test!(full_dense_text_adafactor_options);
run_test!(dense_chat_adafactor_warmup);

/// `optimizer_config` for Muon and Adafactor: what mlx's constructors accept, and a clear
/// error naming the option otherwise.
#[test]
fn muon_and_adafactor_configs() {
    use mlx_train::optim::{LearningRate, Method, Optimizer};
    let cfg = |j: &str| serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(j);
    let err = |name: &str, j: &str| {
        Method::from_config(name, &cfg(j).unwrap())
            .err()
            .unwrap_or_else(|| panic!("{name} {j}: accepted"))
            .to_string()
    };
    assert_eq!(
        Method::from_config("muon", &cfg("{}").unwrap()).unwrap(),
        Method::Muon {
            momentum: 0.95,
            weight_decay: 0.01,
            nesterov: true,
            ns_steps: 5
        }
    );
    assert_eq!(
        Method::from_config("adafactor", &cfg(r#"{"beta_1": null}"#).unwrap()).unwrap(),
        Method::Adafactor {
            eps: [1e-30, 1e-3],
            clip_threshold: 1.0,
            decay_rate: -0.8,
            beta_1: None,
            weight_decay: 0.0,
            scale_parameter: true,
            relative_step: true,
            warmup_init: false
        }
    );
    for (name, j, want) in [
        (
            "muon",
            r#"{"betas": [0.9, 0.99]}"#,
            "optimizer_config.muon: unknown option `betas`",
        ),
        ("muon", r#"{"ns_steps": -1}"#, "ns_steps must be an integer"),
        (
            "muon",
            r#"{"ns_steps": 2.5}"#,
            "ns_steps must be an integer",
        ),
        (
            "muon",
            r#"{"nesterov": "yes"}"#,
            "muon.nesterov must be a boolean",
        ),
        (
            "adafactor",
            r#"{"eps": 1e-30}"#,
            "adafactor.eps must be two numbers",
        ),
        (
            "adafactor",
            r#"{"eps": [1e-30, "x"]}"#,
            "adafactor.eps[1] must be a finite number",
        ),
        (
            "adafactor",
            r#"{"beta_1": "0.9"}"#,
            "beta_1 must be a number or null",
        ),
        (
            "adafactor",
            r#"{"momentum": 0.9}"#,
            "unknown option `momentum`",
        ),
        ("lion", "{}", "(sgd, adam, adamw, muon, adafactor)"),
    ] {
        let e = err(name, j);
        assert!(e.contains(want), "{name} {j}: {e}");
    }
    // No learning rate: only Adafactor's relative steps do without one.
    let m = |j: &str| Method::from_config("adafactor", &cfg(j).unwrap()).unwrap();
    assert!(Optimizer::new(m("{}"), LearningRate::Unset).is_ok());
    let e = Optimizer::new(m(r#"{"relative_step": false}"#), LearningRate::Unset)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("a learning rate is required"), "{e}");
}

/// With `grad_checkpoint` (every layer recomputed in the backward pass) the runs give
/// mlx-lm's results unchanged: LoRA on the 4-bit base, DoRA, and full fine-tuning (the
/// layers' own arrays enter each checkpoint).
#[test]
fn grad_checkpoint_changes_nothing() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    for run in [
        "q4_completions_mask_adamw_cosine_accum",
        "dense_chat_dora_mask",
        "full_dense_text_adam",
        "full_q4_completions_adamw_accum",
        "full_gemma3_chat_adamw",
    ] {
        let g = Goldens::load(
            root()
                .join("goldens")
                .join(format!("train_{run}.safetensors")),
        )
        .unwrap();
        let out = std::env::temp_dir().join(format!("mlx_train_ckpt_{run}_{}", std::process::id()));
        let mut config = config_for(run, &out);
        config.grad_checkpoint = true;
        let (p, _) = train_model(&config, &mut Rec::default()).unwrap();
        check_named(&g.case("final").unwrap(), 0, &p.params.snapshot()).unwrap();
        let _ = std::fs::remove_dir_all(&out);
    }
}

#[test]
fn init_draws_follow_the_global_seed() {
    // Two conversions after the same seed give the same arrays; a different seed does not.
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    let dir = root().join("models/dense");
    let draw = |seed: u64| {
        let (mut m, _) = load_model_dir(&dir, &LoadOptions::default()).unwrap();
        random::seed(seed).unwrap();
        let p = Params::new();
        linear_to_lora_layers(m.as_mut(), 1, &Default::default(), false, &p).unwrap();
        p.get("model.layers.1.self_attn.q_proj.lora_a").unwrap()
    };
    assert_bit_equal(&draw(3), &draw(3)).unwrap();
    assert!(assert_bit_equal(&draw(3), &draw(4)).is_err());
}

/// Full fine-tuning of the last layer beyond llama (fused QKV and gate/up projections, QK
/// norms, biases, layer norms, interleaved and per-head QKV layouts, Gemma's `1 + weight`
/// norms, Nemotron's `weight + 1` layer norms, StableLM's per-head QK layer norms, xIELU's
/// learned scalars): the trainable set is mlx-lm's, names included, the loss and every
/// gradient equal its `nn.value_and_grad(model, default_loss)` bit for bit, and so do the
/// loss and the trained arrays after two steps of mlx's Adam. The gradients are the same
/// under `--grad-checkpoint`.
#[test]
fn full_fine_tuning_gradients_across_architectures() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    let g = Goldens::load(root().join("goldens/train_full_archs.safetensors")).unwrap();
    let fixtures = root().join("../../mlx-models/tests/models");
    let mut checked = 0;
    for case in g.cases().unwrap() {
        if case.name.ends_with("_adam") {
            continue;
        }
        let dense = fixtures.join("dense").join(&case.name);
        let dir = if dense.is_dir() {
            dense
        } else {
            fixtures.join(&case.name)
        };
        let (model, _) = load_model_dir(&dir, &LoadOptions::default()).unwrap();
        let layers: i32 = case.params["num_layers"].parse().unwrap();
        let params = Params::new();
        let full = FullModel::new(model, layers, &params, false).unwrap();
        let got: Vec<String> = params.names();
        assert_eq!(got, names(&case), "{}: trainable parameters", case.name);
        params.set_training(true);
        let batch = Batch {
            tokens: case.inputs[0].clone(),
            lengths: case.inputs[1].clone(),
            truncated: false,
        };
        let loss = |m: &dyn mlx_models::LanguageModel, b: &Array, l: &Array| default_loss(m, b, l);
        let (l, n, grads) = loss_and_grad(&full, &params, &loss, &batch).unwrap();
        assert_bit_equal(&l, &case.outputs[0])
            .unwrap_or_else(|m| panic!("{}: loss {m}", case.name));
        assert_bit_equal(&n, &case.outputs[1]).unwrap();
        check_named(&case, 2, &grads).unwrap();

        // The same under --grad-checkpoint (every layer checkpointed, the trained layers'
        // own arrays entering their checkpoints).
        let (model, _) = load_model_dir(&dir, &LoadOptions::default()).unwrap();
        let ck_params = Params::new();
        let mut ck = FullModel::new(model, layers, &ck_params, false).unwrap();
        assert!(ck.set_grad_checkpoint(true), "{}", case.name);
        ck_params.set_training(true);
        let (ck_l, _, ck_grads) = loss_and_grad(&ck, &ck_params, &loss, &batch).unwrap();
        assert_bit_equal(&ck_l, &case.outputs[0])
            .unwrap_or_else(|m| panic!("{}: checkpointed loss {m}", case.name));
        check_named(&case, 2, &ck_grads)
            .unwrap_or_else(|m| panic!("{}: checkpointed gradients {m}", case.name));
        // And through the compiled step `train` runs (as mlx-lm compiles its step), with and
        // without the checkpoints.
        for (m, p) in [(&full, &params), (&ck, &ck_params)] {
            let compiled = CompiledLossGrad::new(m, p, &loss).unwrap();
            let (c_l, _, c_grads) = compiled.call(&batch).unwrap();
            assert_bit_equal(&c_l, &case.outputs[0])
                .unwrap_or_else(|m| panic!("{}: compiled loss {m}", case.name));
            check_named(&case, 2, &c_grads)
                .unwrap_or_else(|m| panic!("{}: compiled gradients {m}", case.name));
        }

        let adam = g.case(&format!("{}_adam", case.name)).unwrap();
        let lr = adam.params["learning_rate"].parse::<f64>().unwrap();
        let method = Method::from_config("adam", &Default::default()).unwrap();
        let mut opt = Optimizer::new(method, LearningRate::Constant(lr)).unwrap();
        let mut grads = grads;
        let mut last = l;
        for step in 0..2 {
            let next = opt.apply_gradients(&grads, &params.snapshot()).unwrap();
            params.update(&next).unwrap();
            if step == 0 {
                let (l, _, g) = loss_and_grad(&full, &params, &loss, &batch).unwrap();
                (last, grads) = (l, g);
            }
        }
        assert_bit_equal(&last, &adam.outputs[0])
            .unwrap_or_else(|m| panic!("{}: second loss {m}", case.name));
        check_named(&adam, 1, &params.snapshot()).unwrap();
        checked += 1;
    }
    assert_eq!(checked, 28);
}

/// LoRA and DoRA on the dedicated ports (lfm2's convolution and attention layers, qwen3_5's
/// Gated DeltaNet and attention layers, gemma4_text's KV-shared, `attention_k_eq_v` and
/// per-layer-input layers; f32 and bf16): mlx-lm's own `linear_to_lora_layers`
/// after the same seed gives the same adapter names and init, and the loss and every adapter
/// gradient equal its `nn.value_and_grad(model, default_loss)` bit for bit, also under
/// `--grad-checkpoint` and through the compiled step.
#[test]
fn lora_gradients_across_ports() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    let g = Goldens::load(root().join("goldens/train_lora_archs.safetensors")).unwrap();
    let fixtures = root().join("../../mlx-models/tests/models");
    let mut checked = 0;
    for case in g.cases().unwrap() {
        if case.name.ends_with("_adapted") || case.name.ends_with("_fused") {
            continue;
        }
        let p = |k: &str| case.params[k].clone();
        let (mut model, _) =
            load_model_dir(&fixtures.join(p("fixture")), &LoadOptions::default()).unwrap();
        let config = mlx_train::lora::LoraConfig {
            rank: p("rank").parse().unwrap(),
            scale: p("scale").parse().unwrap(),
            dropout: p("dropout").parse().unwrap(),
            keys: case.params.get("keys").map(|k| {
                k.trim_matches(|c| c == '[' || c == ']')
                    .split(',')
                    .map(str::to_string)
                    .collect()
            }),
        };
        random::seed(p("seed").parse().unwrap()).unwrap();
        let params = Params::new();
        let layers: i32 = p("num_layers").parse().unwrap();
        linear_to_lora_layers(
            model.as_mut(),
            layers,
            &config,
            p("dora") == "true",
            &params,
        )
        .unwrap();
        assert_eq!(
            params.names(),
            names(&case),
            "{}: adapter parameters",
            case.name
        );
        check_named(&case, 2, &params.snapshot())
            .unwrap_or_else(|m| panic!("{}: init {m}", case.name));
        params.set_training(true);
        let batch = Batch {
            tokens: case.inputs[0].clone(),
            lengths: case.inputs[1].clone(),
            truncated: false,
        };
        let loss = |m: &dyn mlx_models::LanguageModel, b: &Array, l: &Array| default_loss(m, b, l);
        let (l, n, grads) = loss_and_grad(model.as_ref(), &params, &loss, &batch).unwrap();
        assert_bit_equal(&l, &case.outputs[0])
            .unwrap_or_else(|m| panic!("{}: loss {m}", case.name));
        assert_bit_equal(&n, &case.outputs[1]).unwrap();
        check_named(&case, 2 + grads.len(), &grads)
            .unwrap_or_else(|m| panic!("{}: gradients {m}", case.name));
        // The same under --grad-checkpoint (the adapters' arrays enter each layer's
        // checkpoint) and through the compiled step.
        assert!(
            model
                .as_trainable_mut()
                .is_some_and(|t| t.set_grad_checkpoint(true)),
            "{}",
            case.name
        );
        let (ck_l, _, ck_grads) = loss_and_grad(model.as_ref(), &params, &loss, &batch).unwrap();
        assert_bit_equal(&ck_l, &case.outputs[0])
            .unwrap_or_else(|m| panic!("{}: checkpointed loss {m}", case.name));
        check_named(&case, 2 + grads.len(), &ck_grads)
            .unwrap_or_else(|m| panic!("{}: checkpointed gradients {m}", case.name));
        let compiled = CompiledLossGrad::new(model.as_ref(), &params, &loss).unwrap();
        let (c_l, _, c_grads) = compiled.call(&batch).unwrap();
        assert_bit_equal(&c_l, &case.outputs[0])
            .unwrap_or_else(|m| panic!("{}: compiled loss {m}", case.name));
        check_named(&case, 2 + grads.len(), &c_grads)
            .unwrap_or_else(|m| panic!("{}: compiled gradients {m}", case.name));
        checked += 1;
    }
    assert_eq!(checked, 28);
}

/// Adapters mlx-lm wrote for the ports (random `lora_b`, so the low-rank products count:
/// LoRA, DoRA, `LoRASwitchLinear` over dense and 4-bit experts, qwen3_5's
/// `language_model.` names) load here, and the adapted model's logits equal mlx-lm's bit for
/// bit (mlx-lm's own `load_adapters` reproduced them from the same directory); `mlx fuse`
/// with them gives mlx_lm.fuse's fused logits (experts' `LoRASwitchLinear.fuse` included,
/// re-quantized on the 4-bit base).
#[test]
fn port_adapters_from_mlx_lm_load_and_fuse_bit_equal() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    let g = Goldens::load(root().join("goldens/train_lora_archs.safetensors")).unwrap();
    let fixtures = root().join("../../mlx-models/tests/models");
    let mut checked = 0;
    for case in g.cases().unwrap() {
        let Some(run) = case.name.strip_suffix("_adapted") else {
            continue;
        };
        let dir = fixtures.join(&case.params["fixture"]);
        let (mut model, _) = load_model_dir(&dir, &LoadOptions::default()).unwrap();
        let adapters = root().join(format!("adapters/lora_archs_{run}"));
        load_adapters(model.as_mut(), &adapters).unwrap();
        let logits = model.forward(&case.inputs[0], None).unwrap();
        assert_bit_equal(&logits, &case.outputs[0])
            .unwrap_or_else(|m| panic!("{run}: adapted logits {m}"));
        // `mlx fuse`: the fused model directory gives mlx_lm.fuse's fused logits.
        let out = std::env::temp_dir().join(format!("mlx_lora_archs_{run}_{}", std::process::id()));
        fuse_model_dir(&dir, &adapters, &out, false).unwrap();
        let (fused, _) = load_model_dir(&out, &LoadOptions::default()).unwrap();
        let fused_case = g.case(&format!("{run}_fused")).unwrap();
        assert_bit_equal(
            &fused.forward(&case.inputs[0], None).unwrap(),
            &fused_case.outputs[0],
        )
        .unwrap_or_else(|m| panic!("{run}: fused logits {m}"));
        let _ = std::fs::remove_dir_all(&out);
        checked += 1;
    }
    assert_eq!(checked, 11);
}

/// mlx-lm refuses DoRA on switch layers: the default keys of a MoE model include the
/// experts, so DoRA is refused naming them.
#[test]
fn switch_layers_refuse_dora() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    let dir = root().join("../../mlx-models/tests/models/mixtral");
    let (mut m, _) = load_model_dir(&dir, &LoadOptions::default()).unwrap();
    let err = linear_to_lora_layers(m.as_mut(), 1, &Default::default(), true, &Params::new())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("block_sparse_moe.switch_mlp") && err.contains("DoRA"),
        "{err}"
    );
}

/// Full fine-tuning under the other memory options: one cross-entropy chunk or one segment
/// spanning the sequence is the plain step, so the trained weights stay mlx-lm's bit for bit.
#[test]
fn full_fine_tuning_memory_options_one_chunk() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    let run = "full_dense_text_adam";
    let g = Goldens::load(root().join(format!("goldens/train_{run}.safetensors"))).unwrap();
    for (chunk, segment) in [(Some(4096), None), (None, Some(4096))] {
        let out = std::env::temp_dir().join(format!("mlx_train_fullmem_{}", std::process::id()));
        let mut config = config_for(run, &out);
        config.ce_chunk_size = chunk;
        config.segment_length = segment;
        let (p, _) = train_model(&config, &mut Rec::default()).unwrap();
        check_named(&g.case("final").unwrap(), 0, &p.params.snapshot())
            .unwrap_or_else(|m| panic!("chunk {chunk:?} segment {segment:?}: {m}"));
        let _ = std::fs::remove_dir_all(&out);
    }
}

/// Resuming a one-layer full run from a two-layer file loads the other layer into the model
/// too (mlx-lm's `load_weights(file, strict=False)`): the prepared model's logits equal the
/// model with that whole file loaded.
#[test]
fn full_resume_loads_untrained_layers_too() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    let out = std::env::temp_dir().join(format!("mlx_train_fullres_{}", std::process::id()));
    let mut config = config_for("full_dense_text_adam", &out);
    let two = root().join("adapters/full_dense_chat_adamw_resume");
    config.resume_adapter_file = Some(two.join("adapters.safetensors").display().to_string());
    let p = prepare(&config).unwrap();
    assert_eq!(p.params.len(), 9, "one layer trains");
    let ids = Array::from_slice(&[3i32, 50, 7, 99, 120], &[1, 5]).unwrap();
    let got = p.model.forward(&ids, None).unwrap();
    let (mut model, _) =
        load_model_dir(&PathBuf::from(&config.model), &LoadOptions::default()).unwrap();
    load_adapters(model.as_mut(), &two).unwrap();
    assert_bit_equal(&got, &model.forward(&ids, None).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&out);
}

/// DoRA on a quantized embedding is refused (mlx-lm's check looks for a quantized linear and
/// would take the norms of the packed integers).
#[test]
fn dora_on_a_quantized_embedding_is_refused() {
    let fixtures = root().join("../../mlx-models/tests/models");
    let (mut model, _) = load_model_dir(&fixtures.join("q4_g32"), &LoadOptions::default()).unwrap();
    let config = mlx_train::lora::LoraConfig {
        keys: Some(vec!["model.embed_tokens".into()]),
        ..Default::default()
    };
    let e = linear_to_lora_layers(model.as_mut(), 1, &config, true, &Params::new())
        .unwrap_err()
        .to_string();
    assert!(e.contains("DoRA on a quantized embedding"), "{e}");
}

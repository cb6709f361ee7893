//! `mlx train` (the `cli` module): mlx_lm.lora's option names give mlx_lm.lora's adapter
//! bit for bit; checkpoints, the JSONL log, `-c` YAML configs, resume, `--test`; and bad
//! input fails with an error naming the file and the problem.

use std::path::{Path, PathBuf};

use clap::Parser;
use mlx_core::testing::{assert_bit_equal, Goldens};
use mlx_train::cli::{run, TrainArgs};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: TrainArgs,
}

static SEEDED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn tests() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mlx_train_cli_{name}_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn parse(argv: &[&str]) -> TrainArgs {
    let mut v = vec!["mlx-train"];
    v.extend_from_slice(argv);
    Cli::try_parse_from(v).unwrap().args
}

fn model() -> String {
    tests().join("models/dense").display().to_string()
}

fn data(fmt: &str) -> String {
    tests().join("data").join(fmt).display().to_string()
}

#[test]
fn same_options_same_adapter_as_mlx_lm_lora() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    let out = tmp("same");
    // The dense_text_adam run of goldens_train.py, given as mlx_lm.lora's flags plus a config
    // file for the LoRA parameters (as mlx_lm.lora takes them).
    std::fs::create_dir_all(&out).unwrap();
    let cfg = out.join("c.yaml");
    std::fs::write(
        &cfg,
        "lora_parameters:\n  rank: 4\n  dropout: 0.0\n  scale: 10.0\nlearning_rate: 1e-2\n",
    )
    .unwrap();
    let adapters = out.join("adapters");
    let args = parse(&[
        "--model",
        &model(),
        "--train",
        "--data",
        &data("text"),
        "--num-layers",
        "1",
        "--batch-size",
        "2",
        "--iters",
        "6",
        "--steps-per-eval",
        "4",
        "--val-batches",
        "2",
        "--steps-per-report",
        "1",
        "--save-every",
        "4",
        "-c",
        cfg.to_str().unwrap(),
        "--adapter-path",
        adapters.to_str().unwrap(),
    ]);
    run(&args).unwrap();
    let g = Goldens::load(tests().join("goldens/train_dense_text_adam.safetensors")).unwrap();
    assert_final_is(&adapters, &g);
    // A checkpoint at step 4, the config, and a JSONL log with 6 train, 2 val, 1 save events.
    assert!(adapters.join("0000004_adapters.safetensors").is_file());
    let conf: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(adapters.join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(conf["num_layers"], 1);
    assert_eq!(conf["lora_parameters"]["rank"], 4);
    let log = std::fs::read_to_string(adapters.join("train_log.jsonl")).unwrap();
    let events: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let count = |e: &str| events.iter().filter(|v| v["event"] == e).count();
    assert_eq!((count("train"), count("val"), count("save")), (6, 3, 1));
    let rep = g.case("report").unwrap();
    let losses: Vec<f32> = events
        .iter()
        .filter(|v| v["event"] == "train")
        .map(|v| v["train_loss"].as_f64().unwrap() as f32)
        .collect();
    assert_eq!(losses, rep.outputs[0].to_vec::<f32>().unwrap());

    // Resume from the step-4 checkpoint for 2 more steps, then evaluate on the test split
    // (there is none: a clear error).
    let resumed = out.join("resumed");
    let args = parse(&[
        "--model",
        &model(),
        "--data",
        &data("text"),
        "--num-layers",
        "1",
        "--batch-size",
        "2",
        "--iters",
        "2",
        "-c",
        cfg.to_str().unwrap(),
        "--resume-adapter-file",
        adapters
            .join("0000004_adapters.safetensors")
            .to_str()
            .unwrap(),
        "--adapter-path",
        resumed.to_str().unwrap(),
    ]);
    run(&args).unwrap();
    assert!(resumed.join("adapters.safetensors").is_file());
    let args = parse(&[
        "--model",
        &model(),
        "--data",
        &data("text"),
        "--test",
        "--adapter-path",
        adapters.to_str().unwrap(),
    ]);
    let e = run(&args).unwrap_err().to_string();
    assert!(e.contains("Test set not found"), "{e}");
    let _ = std::fs::remove_dir_all(&out);
}

/// `adapters/adapters.safetensors` holds the golden run's trained arrays, bit for bit.
fn assert_final_is(adapters: &Path, g: &Goldens) {
    let fin = g.case("final").unwrap();
    let names: Vec<&str> = fin.params["names"]
        .trim_matches(['[', ']'])
        .split(',')
        .collect();
    let (ours, _) =
        mlx_core::io::load_safetensors(adapters.join("adapters.safetensors"), None).unwrap();
    assert_eq!(ours.len(), names.len());
    for (i, n) in names.iter().enumerate() {
        assert_bit_equal(&ours[*n], &fin.outputs[i]).unwrap_or_else(|m| panic!("{n}: {m}"));
    }
}

/// `--optimizer muon` with its options from a `-c` file, and Adafactor named by the file
/// itself: mlx_lm.lora's adapters (goldens_train_optim.py's runs) bit for bit.
#[test]
fn muon_and_adafactor_from_the_command_line() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    let out = tmp("optim");
    std::fs::create_dir_all(&out).unwrap();
    let runs = [
        (
            "full_dense_chat_muon_options",
            "optimizer_config:\n  muon:\n    momentum: 0.8\n    weight_decay: 0.05\n    \
             nesterov: false\n    ns_steps: 3\n",
            "chat",
            vec!["--optimizer", "muon", "--iters", "3", "--seed", "13"],
        ),
        (
            "full_dense_text_adafactor_options",
            "optimizer: adafactor\noptimizer_config:\n  adafactor:\n    eps: [1.0e-29, 2.0e-3]\n    \
             clip_threshold: 0.5\n    decay_rate: -0.6\n    beta_1: 0.9\n    \
             weight_decay: 0.02\n    scale_parameter: false\n    relative_step: false\n\
             lr_schedule:\n  name: cosine_decay\n  arguments: [1.0e-2, 4, 1.0e-3]\n  warmup: 1\n",
            "text",
            vec!["--iters", "4", "--seed", "15"],
        ),
    ];
    for (run_name, yaml, fmt, mut argv) in runs {
        let cfg = out.join(format!("{run_name}.yaml"));
        std::fs::write(&cfg, yaml).unwrap();
        let adapters = out.join(run_name);
        let d = data(fmt);
        let (m, c, a) = (
            model(),
            cfg.display().to_string(),
            adapters.display().to_string(),
        );
        argv.extend([
            "--model",
            &m,
            "--train",
            "--data",
            &d,
            "--fine-tune-type",
            "full",
            "--num-layers",
            "1",
            "--batch-size",
            "2",
            "--learning-rate",
            "1e-2",
            "--steps-per-eval",
            "100",
            "--val-batches",
            "1",
            "-c",
            &c,
            "--adapter-path",
            &a,
        ]);
        run(&parse(&argv)).unwrap_or_else(|e| panic!("{run_name}: {e}"));
        let g =
            Goldens::load(tests().join(format!("goldens/train_{run_name}.safetensors"))).unwrap();
        assert_final_is(&adapters, &g);
    }
    // An option Adafactor does not have, named with the optimizer.
    let cfg = out.join("bad.yaml");
    std::fs::write(&cfg, "optimizer_config:\n  adafactor:\n    momentum: 0.9\n").unwrap();
    let ap = out.join("bad");
    let e = run(&parse(&[
        "--model",
        &model(),
        "--train",
        "--data",
        &data("text"),
        "--optimizer",
        "adafactor",
        "--num-layers",
        "1",
        "-c",
        cfg.to_str().unwrap(),
        "--adapter-path",
        ap.to_str().unwrap(),
    ]))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("optimizer_config.adafactor: unknown option `momentum`"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn memory_options_run() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    for extra in [
        &["--segment-length", "8"][..],
        &["--ce-chunk-size", "8", "--grad-checkpoint"][..],
    ] {
        let out = tmp("mem");
        let mut argv = vec!["--iters", "2", "--mask-prompt"];
        argv.extend_from_slice(extra);
        train_small_q4(&out, &argv);
        assert!(out.join("adapters.safetensors").is_file());
        let _ = std::fs::remove_dir_all(&out);
    }
}

/// Trains LoRA on 2 layers of the 4-bit fixture, batch 2, completions, into `out`, with
/// `extra` options.
fn train_small_q4(out: &Path, extra: &[&str]) {
    let (m, d) = (model_q4(), data("completions"));
    let ap = out.display().to_string();
    let mut argv = vec![
        "--model",
        &m,
        "--data",
        &d,
        "--num-layers",
        "2",
        "--batch-size",
        "2",
        "--adapter-path",
        &ap,
    ];
    argv.extend_from_slice(extra);
    run(&parse(&argv)).unwrap_or_else(|e| panic!("{extra:?}: {e}"));
}

fn model_q4() -> String {
    tests().join("models/q4").display().to_string()
}

#[test]
fn dpo_and_orpo_runs() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    for objective in ["dpo", "orpo"] {
        let out = tmp(objective);
        let args = parse(&[
            "--model",
            &model(),
            "--data",
            &data("preference"),
            "--objective",
            objective,
            "--beta",
            "0.2",
            "--num-layers",
            "1",
            "--batch-size",
            "2",
            "--iters",
            "3",
            "--val-batches",
            "1",
            "--adapter-path",
            out.to_str().unwrap(),
        ]);
        run(&args).unwrap_or_else(|e| panic!("{objective}: {e}"));
        assert!(out.join("adapters.safetensors").is_file());
        let conf = std::fs::read_to_string(out.join("adapter_config.json")).unwrap();
        assert!(
            conf.contains(&format!("\"objective\": \"{objective}\"")),
            "{conf}"
        );
        let _ = std::fs::remove_dir_all(&out);
    }
}

fn err(argv: &[&str]) -> String {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    run(&parse(argv)).unwrap_err().to_string()
}

#[test]
fn bad_input_is_a_clear_error() {
    let out = tmp("bad");
    let ap = out.join("a");
    let ap = ap.to_str().unwrap();
    // A JSONL line that is not JSON: file and line named.
    let d = out.join("data");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(
        d.join("train.jsonl"),
        "{\"text\": \"the cat\"}\n{not json\n",
    )
    .unwrap();
    let e = err(&[
        "--model",
        &model(),
        "--data",
        d.to_str().unwrap(),
        "--adapter-path",
        ap,
    ]);
    assert!(
        e.contains("train.jsonl:2") && e.contains("invalid JSON"),
        "{e}"
    );
    // A row of the wrong shape.
    std::fs::write(
        d.join("train.jsonl"),
        "{\"text\": \"the cat\"}\n{\"text\": 3}\n",
    )
    .unwrap();
    let e = err(&[
        "--model",
        &model(),
        "--data",
        d.to_str().unwrap(),
        "--adapter-path",
        ap,
    ]);
    assert!(
        e.contains("train.jsonl:2") && e.contains("`text` must be a string"),
        "{e}"
    );
    // Unknown format.
    std::fs::write(d.join("train.jsonl"), "{\"foo\": \"x\"}\n").unwrap();
    let e = err(&[
        "--model",
        &model(),
        "--data",
        d.to_str().unwrap(),
        "--adapter-path",
        ap,
    ]);
    assert!(e.contains("unsupported data format"), "{e}");
    // Fewer examples than the batch size.
    std::fs::write(d.join("train.jsonl"), "{\"text\": \"the cat\"}\n").unwrap();
    let e = err(&[
        "--model",
        &model(),
        "--data",
        d.to_str().unwrap(),
        "--adapter-path",
        ap,
        "--batch-size",
        "4",
        "--num-layers",
        "-1",
    ]);
    assert!(e.contains("at least batch_size=4"), "{e}");
    // More layers than the model has; a missing data directory; a bad config file.
    let e = err(&[
        "--model",
        &model(),
        "--data",
        &data("text"),
        "--num-layers",
        "9",
        "--adapter-path",
        ap,
    ]);
    assert!(e.contains("only has 2 layers"), "{e}");
    let e = err(&[
        "--model",
        &model(),
        "--data",
        "/nonexistent/dir",
        "--adapter-path",
        ap,
    ]);
    assert!(e.contains("/nonexistent/dir"), "{e}");
    let cfg = out.join("bad.yaml");
    std::fs::write(&cfg, "batch_size: [1, 2]\n").unwrap();
    let e = err(&["--model", &model(), "-c", cfg.to_str().unwrap()]);
    assert!(e.contains("bad.yaml") && e.contains("batch_size"), "{e}");
    // Preference rows need a preference objective, and the other way round.
    let e = err(&[
        "--model",
        &model(),
        "--data",
        &data("preference"),
        "--num-layers",
        "1",
        "--adapter-path",
        ap,
    ]);
    assert!(
        e.contains("train.jsonl") && e.contains("--objective dpo or orpo"),
        "{e}"
    );
    let e = err(&[
        "--model",
        &model(),
        "--data",
        &data("text"),
        "--objective",
        "orpo",
        "--num-layers",
        "1",
        "--adapter-path",
        ap,
    ]);
    assert!(e.contains("needs prompt/chosen/rejected"), "{e}");
    // Adapters that do not fit the model.
    let bad = out.join("badadapter");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::copy(
        tests().join("adapters/dense_text_adam/adapter_config.json"),
        bad.join("adapter_config.json"),
    )
    .unwrap();
    std::fs::copy(
        tests().join("adapters/dense_chat_sgd_keys/adapters.safetensors"),
        bad.join("adapters.safetensors"),
    )
    .unwrap();
    let e = err(&[
        "--model",
        &model(),
        "--data",
        &data("text"),
        "--test",
        "--adapter-path",
        bad.to_str().unwrap(),
    ]);
    assert!(
        e.contains("incompatible tensors") && e.contains("adapters.safetensors"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(Path::new(&out));
}

/// Records each step's loss.
#[derive(Default)]
struct Steps(Vec<f32>);
impl mlx_train::trainer::TrainingCallback for Steps {
    fn on_step(&mut self, _iteration: usize, loss: f32, _tokens: i64) {
        self.0.push(loss);
    }
}

/// Two steps of full fine-tuning of one layer with DPO (beta 0.5) on the preference data.
fn full_dpo_config(out: &Path) -> mlx_train::run::RunConfig {
    serde_json::from_value(serde_json::json!({
        "model": model(), "data": data("preference"), "train": true, "iters": 2,
        "fine_tune_type": "full", "num_layers": 1, "batch_size": 2, "learning_rate": 1e-2,
        "objective": "dpo", "beta": 0.5, "val_batches": 1, "steps_per_eval": 100,
        "adapter_path": out.display().to_string(),
    }))
    .unwrap()
}

/// A loss the compiled step cannot trace (full fine-tuning's DPO reads its reference through
/// disabled parameters) with compilation forced on: `train` runs the step uncompiled instead,
/// with the same losses as with compilation off.
#[test]
fn a_loss_that_cannot_be_compiled_trains_uncompiled() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    let out = tmp("full_dpo_compile");
    let config = full_dpo_config(&out);
    let run = |compile: bool| {
        let mut p = mlx_train::run::prepare(&config).unwrap();
        let optimizer = config.build_optimizer().unwrap();
        let loss = mlx_train::run::objective_loss(&config, &p.params).unwrap();
        let mut args = config.training_args();
        args.compile = compile;
        let mut steps = Steps::default();
        mlx_train::trainer::train(
            p.model.as_ref(),
            &p.params,
            optimizer,
            &p.train,
            &p.valid,
            &args,
            loss.as_ref(),
            &mut p.rng,
            &mut steps,
        )
        .unwrap();
        steps.0
    };
    let (forced, off) = (run(true), run(false));
    assert_eq!(forced.len(), 2);
    assert_eq!(forced, off);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn full_fine_tune_with_dpo_uses_the_base_as_reference() {
    // With policy = reference, DPO's loss is exactly log(2); after one update the base
    // layers (the reference, with `Params` disabled) and the trained ones differ.
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    let out = tmp("full_dpo");
    let config = full_dpo_config(&out);
    let mut steps = Steps::default();
    mlx_train::run::train_model(&config, &mut steps).unwrap();
    assert_eq!(steps.0.len(), 2);
    assert_eq!(steps.0[0], std::f32::consts::LN_2, "{:?}", steps.0);
    assert!(steps.0[1].is_finite() && steps.0[1] != std::f32::consts::LN_2);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn full_adapters_test_and_check() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    // `--test` without `--train` loads a full fine-tune (mlx-lm's) and evaluates it.
    let full = tests().join("adapters/full_dense_text_adam");
    let out = tmp("full_test");
    let text = out.join("text");
    std::fs::create_dir_all(&text).unwrap();
    for (from, to) in [("train", "train"), ("valid", "valid"), ("valid", "test")] {
        std::fs::copy(
            tests().join(format!("data/text/{from}.jsonl")),
            text.join(format!("{to}.jsonl")),
        )
        .unwrap();
    }
    run(&parse(&[
        "--model",
        &model(),
        "--data",
        text.to_str().unwrap(),
        "--test",
        "--test-batches",
        "1",
        "--adapter-path",
        full.to_str().unwrap(),
    ]))
    .unwrap();
    // A full config over LoRA weights: every foreign tensor named, with the file.
    let bad = out.join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::copy(
        full.join("adapter_config.json"),
        bad.join("adapter_config.json"),
    )
    .unwrap();
    std::fs::copy(
        tests().join("adapters/dense_text_adam/adapters.safetensors"),
        bad.join("adapters.safetensors"),
    )
    .unwrap();
    let e = run(&parse(&[
        "--model",
        &model(),
        "--data",
        text.to_str().unwrap(),
        "--test",
        "--adapter-path",
        bad.to_str().unwrap(),
    ]))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("adapters.safetensors")
            && e.contains("model.layers.1.self_attn.q_proj.lora_a: not an adapter parameter"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn full_adapter_with_a_non_float_array_is_refused_at_load() {
    // A full fine-tune's file whose array has the right name and shape but an integer dtype
    // (a float layer array; mlx-lm would fail later, inside the forward pass): the load
    // names the file, the array and both dtypes.
    let full = tests().join("adapters/full_dense_text_adam");
    let out = tmp("full_dtype");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::copy(
        full.join("adapter_config.json"),
        out.join("adapter_config.json"),
    )
    .unwrap();
    let (mut weights, _) =
        mlx_core::io::load_safetensors(full.join("adapters.safetensors"), None).unwrap();
    let name = "model.layers.1.self_attn.q_proj.weight";
    let w = weights
        .get(name)
        .unwrap()
        .astype(mlx_core::Dtype::Int32)
        .unwrap();
    weights.insert(name.to_string(), w);
    mlx_core::io::save_safetensors(
        out.join("adapters.safetensors"),
        weights.iter().map(|(k, v)| (k.as_str(), v)),
        &Default::default(),
    )
    .unwrap();
    let (mut m, _) = mlx_models::load::load_model_dir(
        &tests().join("models/dense"),
        &mlx_models::load::LoadOptions::default(),
    )
    .unwrap();
    let e = match mlx_train::adapters::load_adapters(m.as_mut(), &out) {
        Ok(_) => panic!("an int32 layer weight was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("adapters.safetensors") && e.contains(name) && e.contains("int32"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// `--memory-limit` only changes when MLX waits for queued work: the adapter is byte-equal to
/// the run without it, and MLX's own limit is back to what it was afterwards. `--flash-kernel
/// cuda` on a back-end without CUDA kernels is the plain flash path, byte for byte.
#[test]
fn memory_limit_and_flash_kernel_change_no_bits() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    let before = mlx_core::memory::memory_limit().unwrap();
    let adapter = |extra: &[&str]| {
        let out = tmp("limit");
        let mut argv = vec!["--iters", "3", "--grad-checkpoint"];
        argv.extend_from_slice(extra);
        train_small_q4(&out, &argv);
        let bytes = std::fs::read(out.join("adapters.safetensors")).unwrap();
        let _ = std::fs::remove_dir_all(&out);
        bytes
    };
    let plain = adapter(&[]);
    // 1 MB: below what the step holds, so every scheduled op waits for the queue to drain.
    assert!(
        plain == adapter(&["--memory-limit", "0.001"]),
        "--memory-limit changed bits"
    );
    assert_eq!(mlx_core::memory::memory_limit().unwrap(), before);
    let flash = adapter(&["--flash-block", "4"]);
    assert!(
        flash == adapter(&["--flash-block", "4", "--flash-kernel", "cuda"]),
        "--flash-kernel cuda changed bits where no CUDA kernels run"
    );
}

#[test]
fn bad_memory_limit_and_flash_kernel_are_clear_errors() {
    let (m, d) = (model(), data("completions"));
    for bad in ["0", "-1", "1e300"] {
        let e = err(&[
            "--model",
            &m,
            "--data",
            &d,
            &format!("--memory-limit={bad}"),
        ]);
        assert!(
            e.contains("memory_limit must be a positive number of GB"),
            "{bad}: {e}"
        );
    }
    for (flag, bad) in [
        ("--memory-limit", "nan"),
        ("--memory-limit", "inf"),
        ("--learning-rate", "nan"),
        ("--beta", "-inf"),
        ("--max-grad-norm", "NaN"),
    ] {
        let e = err(&["--model", &m, "--data", &d, &format!("{flag}={bad}")]);
        assert!(
            e.contains(&format!("{flag} must be a finite number")),
            "{flag} {bad}: {e}"
        );
    }
    assert!(Cli::try_parse_from(["mlx-train", "--flash-kernel", "metal"]).is_err());
    let cfg: mlx_train::run::RunConfig =
        serde_json::from_value(serde_json::json!({"flash_kernel": "metal"})).unwrap();
    let e = cfg.validate().unwrap_err().to_string();
    assert!(
        e.contains("flash_kernel must be `plain`, `cuda` or `sdpa`, got `metal`"),
        "{e}"
    );
}

/// mlx_lm.lora's remaining flags: `--clear-cache-threshold` (a size, as its `_parse_size`
/// reads it) changes no bits; `--trust-remote-code` and `--project-name` are recorded;
/// `--report-to` (wandb, swanlab) and `hf_dataset` are clear errors. The `adapter_config.json` written holds
/// every key mlx_lm.lora's own holds for the same run.
#[test]
fn clear_cache_threshold_and_the_recorded_flags() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    let adapter = |extra: &[&str]| {
        let out = tmp("clear");
        train_small_q4(&out, &[&["--iters", "3"], extra].concat());
        let bytes = std::fs::read(out.join("adapters.safetensors")).unwrap();
        let conf: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out.join("adapter_config.json")).unwrap(),
        )
        .unwrap();
        let _ = std::fs::remove_dir_all(&out);
        (bytes, conf)
    };
    let (plain, conf) = adapter(&[]);
    assert_eq!(conf["clear_cache_threshold"], 0);
    let (big, conf) = adapter(&[
        "--clear-cache-threshold",
        "1.5G",
        "--trust-remote-code",
        "--project-name",
        "p",
    ]);
    assert!(plain == big, "--clear-cache-threshold changed bits");
    assert_eq!(conf["clear_cache_threshold"], 1_500_000_000u64);
    assert_eq!(conf["trust_remote_code"], true);
    assert_eq!(conf["project_name"], "p");
    assert_eq!(conf["report_to"], serde_json::Value::Null);
    // Every key of the adapter_config.json mlx_lm.lora wrote for a run of its own.
    let theirs: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
        &std::fs::read_to_string(tests().join("adapters/dense_text_adam/adapter_config.json"))
            .unwrap(),
    )
    .unwrap();
    let missing: Vec<&String> = theirs
        .keys()
        .filter(|k| conf.get(k.as_str()).is_none())
        .collect();
    assert!(
        missing.is_empty(),
        "keys mlx-lm writes and we do not: {missing:?}"
    );

    for (size, bytes) in [
        ("0", 0u64),
        ("100", 100),
        ("500MB", 500_000_000),
        ("2 gb", 2_000_000_000),
        (".5G", 500_000_000),
        ("1.", 1),
        ("0.0000015M", 1),
    ] {
        assert_eq!(mlx_train::run::parse_size(size), Ok(bytes), "{size}");
    }
    for bad in ["", "G", "2T", "1.2.3G", "-1", "99999999999999999999G"] {
        assert!(mlx_train::run::parse_size(bad).is_err(), "{bad}");
        assert!(
            Cli::try_parse_from(["mlx-train", "--clear-cache-threshold", bad]).is_err(),
            "{bad}"
        );
    }
    drop(_g);
    let (m, d) = (model(), data("completions"));
    let e = err(&["--model", &m, "--data", &d, "--report-to", "wandb"]);
    assert!(
        e.contains("report_to `wandb`") && e.contains("not supported"),
        "{e}"
    );
    // mlx-lm's `hf_dataset` (a dataset from the hub) is refused before anything loads.
    let out = tmp("hf");
    std::fs::create_dir_all(&out).unwrap();
    let cfg = out.join("c.yaml");
    std::fs::write(&cfg, "hf_dataset:\n  path: mlx-community/wikisql\n").unwrap();
    let e = err(&["--model", &m, "-c", cfg.to_str().unwrap()]);
    assert!(e.contains("hf_dataset") && e.contains("--data"), "{e}");
    let _ = std::fs::remove_dir_all(&out);
    // In a config file, a size string or a number of bytes.
    let cfg: mlx_train::run::RunConfig =
        serde_json::from_str(r#"{"clear_cache_threshold": "2G"}"#).unwrap();
    assert_eq!(cfg.clear_cache_threshold, 2_000_000_000);
    let e = serde_json::from_str::<mlx_train::run::RunConfig>(r#"{"clear_cache_threshold": -3}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a size in bytes"), "{e}");
}

//! mlx-lm reads the adapters our `mlx train` writes (goldens from `cargo xtask goldens
//! train_ours`: `xtask/oracle/goldens_train_ours.py` trains with our built `mlx` binary, then
//! loads the adapter with mlx-lm's own `load(model, adapter_path=...)`).
//!
//! For each run: training here with the same flags writes the committed adapter bit for bit
//! (so the adapter mlx-lm read is the one this code writes), mlx-lm loaded every tensor of it,
//! and our model with our adapter gives mlx-lm's logits with our adapter bit for bit (L1,
//! CPU), and the same greedy continuation.

use std::path::PathBuf;

use clap::Parser;
use mlx_core::testing::{assert_bit_equal, Goldens};
use mlx_engine::generate::{generate_step, GenerateOptions};
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_train::adapters::load_adapters;
use mlx_train::cli::{run, TrainArgs};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: TrainArgs,
}

fn tests() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn list(s: &str) -> Vec<String> {
    s.trim_matches(['[', ']'])
        .split(',')
        .map(str::to_string)
        .collect()
}

fn check(run_name: &str) {
    let g = Goldens::load(tests().join("goldens/train_ours.safetensors")).unwrap();
    let spec = g.case(&format!("{run_name}_argv")).unwrap();
    let fixture = tests().join(format!("adapters/ours_{run_name}"));
    let out =
        std::env::temp_dir().join(format!("mlx_train_ours_{run_name}_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let model_dir = tests().join("models").join(&spec.params["model"]);
    let mut argv: Vec<String> = vec![
        "mlx-train".into(),
        "--model".into(),
        model_dir.display().to_string(),
        "--data".into(),
        tests()
            .join("data")
            .join(&spec.params["data"])
            .display()
            .to_string(),
        "-c".into(),
        tests()
            .join("data/configs")
            .join(&spec.params["config"])
            .display()
            .to_string(),
        "--adapter-path".into(),
        out.display().to_string(),
        "--train".into(),
    ];
    argv.extend(list(&spec.params["argv"]));
    run(&Cli::try_parse_from(argv).unwrap().args).unwrap();

    // The adapter trained here is the committed one, tensor for tensor.
    let (ours, _) = mlx_core::io::load_safetensors(out.join("adapters.safetensors"), None).unwrap();
    let (committed, _) =
        mlx_core::io::load_safetensors(fixture.join("adapters.safetensors"), None).unwrap();
    assert_eq!(ours.len(), committed.len());
    for (n, a) in &committed {
        assert_bit_equal(&ours[n], a).unwrap_or_else(|m| panic!("{run_name} {n}: {m}"));
    }
    // mlx-lm's loader took every tensor of it.
    let loaded = g.case(&format!("{run_name}_loaded")).unwrap();
    let names = list(&loaded.params["names"]);
    assert_eq!(names.len(), committed.len());
    for (n, a) in names.iter().zip(&loaded.outputs) {
        assert_bit_equal(&committed[n], a).unwrap_or_else(|m| panic!("{run_name} {n}: {m}"));
    }

    // Our model with our adapter = mlx-lm's model with our adapter.
    let lc = g.case(&format!("{run_name}_logits")).unwrap();
    let (mut model, _) = load_model_dir(&model_dir, &LoadOptions::default()).unwrap();
    load_adapters(model.as_mut(), &out).unwrap();
    let logits = model.forward(&lc.inputs[0], None).unwrap();
    assert_bit_equal(&logits, &lc.outputs[0]).unwrap_or_else(|m| panic!("{run_name}: {m}"));
    let ids = lc.inputs[0].to_vec::<i32>().unwrap();
    let want = lc.outputs[1].to_vec::<i32>().unwrap();
    let opts = GenerateOptions {
        max_tokens: Some(want.len()),
        ..Default::default()
    };
    let got: Vec<i32> = generate_step(&ids, model.as_ref(), None, opts)
        .unwrap()
        .map(|s| s.unwrap().token as i32)
        .collect();
    assert_eq!(got, want, "{run_name}: greedy continuation");
    let _ = std::fs::remove_dir_all(&out);
}

static SEEDED: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn mlx_lm_reads_our_qlora_dora_adapter() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    check("q4_chat_dora_keys");
}

#[test]
fn mlx_lm_reads_our_lora_adapter() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    check("dense_completions_lora");
}

#[test]
fn mlx_lm_reads_our_full_fine_tune() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    check("dense_text_full");
}

#[test]
fn mlx_lm_reads_our_full_fine_tune_of_a_4bit_base() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    check("q4_chat_full");
}

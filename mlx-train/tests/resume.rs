//! `mlx train --resume-adapter-file DIR/adapters.safetensors --adapter-path DIR`: the resumed
//! run continues the iteration count, the schedule, the optimizer, the data order and a
//! pending accumulated gradient, so it equals the uninterrupted run bit for bit; it keeps
//! every file of the earlier run (checkpoints byte for byte, the log appended, the earlier
//! final weights as their numbered checkpoint); and no run replaces a file of an earlier
//! run without `--overwrite`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Parser;
use mlx_train::cli::{run, TrainArgs};
use serde_json::Value;

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
    let d = std::env::temp_dir().join(format!("mlx_train_resume_{name}_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `mlx train` on the dense fixture's text data, one LoRA layer, batch 2 (4 batches an
/// epoch), evaluation every 4 iterations, a report every iteration, a checkpoint every 2,
/// gradients accumulated over 2 iterations, and a cosine schedule.
fn train(out: &Path, cfg: &Path, extra: &[&str]) -> Result<(), String> {
    let (m, d) = (
        tests().join("models/dense").display().to_string(),
        tests().join("data/text").display().to_string(),
    );
    let (c, a) = (cfg.display().to_string(), out.display().to_string());
    let mut argv = vec![
        "mlx-train",
        "--model",
        &m,
        "--train",
        "--data",
        &d,
        "--num-layers",
        "1",
        "--batch-size",
        "2",
        "--steps-per-eval",
        "4",
        "--val-batches",
        "2",
        "--steps-per-report",
        "1",
        "--save-every",
        "2",
        "--grad-accumulation-steps",
        "2",
        "-c",
        &c,
        "--adapter-path",
        &a,
    ];
    argv.extend_from_slice(extra);
    run(&Cli::try_parse_from(argv).unwrap().args).map_err(|e| e.to_string())
}

fn config(dir: &Path) -> PathBuf {
    let cfg = dir.join("c.yaml");
    std::fs::write(
        &cfg,
        "lora_parameters:\n  rank: 4\n  dropout: 0.0\n  scale: 10.0\nlearning_rate: 1e-2\n\
         lr_schedule:\n  name: cosine_decay\n  arguments: [1.0e-2, 8, 1.0e-3]\n  warmup: 1\n",
    )
    .unwrap();
    cfg
}

fn sha256(path: &Path) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x}", Sha256::digest(std::fs::read(path).unwrap()))
}

/// Every file of `dir` by name with its sha256.
fn hashes(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                sha256(&e.path()),
            )
        })
        .collect()
}

fn events(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("train_log.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `(iteration, train_loss)` of every train report.
fn train_reports(ev: &[Value]) -> Vec<(u64, f64)> {
    ev.iter()
        .filter(|v| v["event"] == "train")
        .map(|v| {
            (
                v["iteration"].as_u64().unwrap(),
                v["train_loss"].as_f64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn resume_into_the_same_directory_continues_exactly_and_keeps_every_file() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    let root = tmp("exact");
    let cfg = config(&root);
    // The uninterrupted run: 8 iterations.
    let whole = root.join("whole");
    train(&whole, &cfg, &["--iters", "8"]).unwrap();

    // 3 iterations, stopping mid-epoch and mid-accumulation, after an evaluation that only
    // the last iteration of a run gets (the uninterrupted run has none at 3).
    let dir = root.join("dir");
    train(&dir, &cfg, &["--iters", "3"]).unwrap();
    let before = hashes(&dir);
    assert!(before.contains_key("adapters.optimizer.safetensors"));
    assert!(before.contains_key("adapters.resume.json"));
    let log_before = std::fs::read_to_string(dir.join("train_log.jsonl")).unwrap();
    let final_before = before["adapters.safetensors"].clone();

    // Resumed into the same directory for the other 5.
    let resume_from = dir.join("adapters.safetensors");
    train(
        &dir,
        &cfg,
        &[
            "--iters",
            "5",
            "--resume-adapter-file",
            resume_from.to_str().unwrap(),
        ],
    )
    .unwrap();
    let after = hashes(&dir);

    // Every file of the first run: byte for byte, except what the run continues (the
    // adapter file, its state, the config) and the log, which grew by appending.
    for (name, h) in &before {
        match name.as_str() {
            "adapters.safetensors"
            | "adapters.optimizer.safetensors"
            | "adapters.resume.json"
            | "adapter_config.json"
            | "train_log.jsonl" => {}
            _ => assert_eq!(&after[name], h, "{name} changed"),
        }
    }
    let log_after = std::fs::read_to_string(dir.join("train_log.jsonl")).unwrap();
    assert!(
        log_after.starts_with(&log_before),
        "the log was not appended to"
    );
    // The first run's final weights are kept as the checkpoint of their iteration.
    assert_eq!(after["0000003_adapters.safetensors"], final_before);

    // The iteration count continues: reports 1..=8, checkpoints 2, 4, 6, 8, and the resumed
    // part starts at 4.
    let ev = events(&dir);
    let ours = train_reports(&ev);
    assert_eq!(
        ours.iter().map(|r| r.0).collect::<Vec<_>>(),
        (1..=8).collect::<Vec<_>>()
    );
    let starts: Vec<u64> = ev
        .iter()
        .filter(|v| v["event"] == "start")
        .map(|v| v["iteration"].as_u64().unwrap())
        .collect();
    assert_eq!(starts, [1, 4]);
    for it in [2, 4, 6, 8] {
        assert!(
            after.contains_key(&format!("{it:07}_adapters.safetensors")),
            "{it}"
        );
    }

    // Equal to the uninterrupted run, bit for bit: every step's loss, every checkpoint after
    // the resume and the final adapters.
    assert_eq!(ours, train_reports(&events(&whole)));
    let theirs = hashes(&whole);
    for name in [
        "0000004_adapters.safetensors",
        "0000006_adapters.safetensors",
        "0000008_adapters.safetensors",
        "adapters.safetensors",
        "adapters.optimizer.safetensors",
    ] {
        assert_eq!(
            after[name], theirs[name],
            "{name} differs from the uninterrupted run"
        );
    }
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn files_of_an_earlier_run_are_replaced_only_with_overwrite() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    let root = tmp("refuse");
    let cfg = config(&root);
    let dir = root.join("dir");
    train(&dir, &cfg, &["--iters", "2"]).unwrap();
    let before = hashes(&dir);

    // A new run into the same directory: refused before training, naming the file.
    let e = train(&dir, &cfg, &["--iters", "2"]).unwrap_err();
    assert!(
        e.contains("adapter_config.json") && e.contains("--overwrite"),
        "{e}"
    );
    // Resumed from a numbered checkpoint (no state of its own): numbered from 1 as
    // mlx_lm.lora numbers it, so adapters.safetensors (later weights) would be replaced.
    let ckpt = dir.join("0000002_adapters.safetensors");
    let e = train(
        &dir,
        &cfg,
        &[
            "--iters",
            "2",
            "--resume-adapter-file",
            ckpt.to_str().unwrap(),
        ],
    )
    .unwrap_err();
    assert!(e.contains("adapter_config.json"), "{e}");
    assert_eq!(hashes(&dir), before, "a refused run changed files");

    // Adapters as mlx_lm.lora leaves them (no state), resumed into their own directory:
    // the iteration is unknown, so the numbering is mlx-lm's and both the adapter file and
    // the checkpoint it would write again are refused; with --overwrite the run goes ahead.
    let theirs = root.join("theirs");
    std::fs::create_dir_all(&theirs).unwrap();
    std::fs::copy(&ckpt, theirs.join("adapters.safetensors")).unwrap();
    std::fs::copy(&ckpt, theirs.join("0000002_adapters.safetensors")).unwrap();
    let from = theirs.join("adapters.safetensors");
    let resume = [
        "--iters",
        "2",
        "--resume-adapter-file",
        from.to_str().unwrap(),
    ];
    let e = train(&theirs, &cfg, &resume).unwrap_err();
    assert!(
        e.contains("adapters.safetensors") && e.contains("iteration is not known"),
        "{e}"
    );
    std::fs::remove_file(theirs.join("adapters.safetensors")).unwrap();
    let elsewhere = root.join("adapters.safetensors");
    std::fs::copy(&ckpt, &elsewhere).unwrap();
    let e = train(
        &theirs,
        &cfg,
        &[
            "--iters",
            "2",
            "--resume-adapter-file",
            elsewhere.to_str().unwrap(),
        ],
    )
    .unwrap_err();
    assert!(e.contains("0000002_adapters.safetensors"), "{e}");
    std::fs::copy(&ckpt, &from).unwrap();
    train(&theirs, &cfg, &[&resume[..], &["--overwrite"]].concat()).unwrap();
    let starts: Vec<u64> = events(&theirs)
        .iter()
        .filter(|v| v["event"] == "start")
        .map(|v| v["iteration"].as_u64().unwrap())
        .collect();
    assert_eq!(starts, [1]);
    let _ = std::fs::remove_dir_all(&root);
}

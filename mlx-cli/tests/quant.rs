//! `mlx quant gptq` and `mlx quant awq` against mlx-lm's own `python -m mlx_lm.quant.gptq` and
//! `mlx_lm.quant.awq` (goldens from `cargo xtask goldens gptq awq`,
//! `xtask/oracle/goldens_{gptq,awq}.py`). GPTQ: on the tiny float16 llama of the
//! convert goldens with the committed calibration text, every tensor's name, dtype, shape and
//! bytes, `config.json`, `model.safetensors.index.json`, `README.md` and the copied
//! `tokenizer.json` and `generation_config.json` equal mlx-lm's byte for byte (tier L1 on CPU:
//! the Hessians, damping, Cholesky factors, the column-blocked updates and the packing are
//! mlx-lm's ops in its order). The cases cover two bit widths, two group sizes, the fallback
//! options, `--num-samples` below and at `-1` (all rows) and batches of 8 with a short last one.
//! AWQ: the same, and the per-block `Loss reduction` figures equal mlx-lm's as float32 (tier
//! L1: the scale grid, the einsum clip search and the block losses are mlx-lm's ops in its
//! order). Its second case (67 rows: three `run_layer` batches, clip inputs strided by 3,
//! 3 bits, 6-bit embedding) takes ~40 s in debug: `cargo test -p mlx-cli --test integration quant:: --
//! --ignored`. `qwen3_q4`'s second block falls back to its plain quantization (AWQ's loss is not
//! below it); the other blocks are kept. `gemma3_q4` is `gemma3_text_awq` (`1 + w` norms,
//! sliding layers).
//! Dynamic quantization (`python -m mlx_lm.quant.dynamic_quant`, `cargo xtask goldens
//! dynamic`): the sensitivities file equals mlx-lm's byte for byte (every float32 sensitivity:
//! the gradients of the KL loss through the low-bit model are MLX's vjp of the same ops), and
//! so do the chosen bit widths and the output; `--report-ppl`'s lines too. `--sensitivities`
//! with mlx-lm's file gives the same output.
//! DWQ (`mlx_lm.quant.dwq.main` with its HF dataset loader replaced by the committed
//! `quant/dwq_train.jsonl` rows, `cargo xtask goldens dwq`): the distilled scales, biases and
//! norms (bfloat16), every other tensor and the compared files equal mlx-lm's, over 4 and 3 bits (the
//! trained arrays) and 8 bits (only the norms train), and the printed trainable share and
//! validation losses are mlx-lm's lines.

use crate::model_output::compare;
use crate::support;
use support::mlx;

use std::path::{Path, PathBuf};

use serde_json::Value;

fn tests_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mlx-gptq-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `mlx ARGS` run in `dir` (dynamic quant writes its sensitivities file in the working
/// directory, as mlx-lm does).
fn mlx_in(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mlx"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run mlx");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `*_sensitivities.json` file a dynamic run left in `dir`.
fn sensitivities_in(dir: &Path) -> Option<String> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .find(|e| {
            e.file_name()
                .to_string_lossy()
                .ends_with("_sensitivities.json")
        })
        .and_then(|e| std::fs::read_to_string(e.path()).ok())
}

/// Runs `mlx quant METHOD` on the golden's `cases` (all when empty) and compares.
fn check_cases(method: &str, cases: &[&str]) {
    check_cases_with(method, cases, &[]);
}

/// [`check_cases`] with `extra` arguments after the golden's.
fn check_cases_with(method: &str, cases: &[&str], extra: &[&str]) {
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(tests_dir().join(format!("goldens/{method}.json"))).unwrap(),
    )
    .unwrap();
    let out = temp_dir(&format!("{method}-{}-{}", cases.join("-"), extra.len()));
    let text = tests_dir().join(if method == "dwq" {
        "quant/dwq_train.jsonl"
    } else {
        "quant/calibration.txt"
    });
    let mut bad = Vec::new();
    for (case, want) in golden.as_object().unwrap() {
        if !cases.is_empty() && !cases.contains(&case.as_str()) {
            continue;
        }
        let model = want
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("convert/llama");
        let work = out.join(format!("work_{case}"));
        std::fs::create_dir_all(&work).unwrap();
        let src = match model {
            "@padded" => stage_padded(&work.join("padded")),
            // A fixture staged beside the tiny tokenizer's files (as the golden script does).
            m if m.starts_with('+') => crate::model_output::stage_with_tokenizer(
                &tests_dir(),
                &m[1..],
                &work.join("staged"),
            ),
            m => tests_dir().join(m),
        };
        let targets = work.join("targets");
        let quantized = work.join("quantized");
        let staged: Vec<String> = want["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| match a.as_str().unwrap() {
                "@targets" => targets.to_str().unwrap().to_string(),
                "@quantized" => {
                    // The golden's `mlx_lm convert` of the llama, by ours (equal byte for byte).
                    let llama = tests_dir().join("convert/llama");
                    let (code, _, err) = mlx_in(
                        &work,
                        &[
                            "convert",
                            "--hf-path",
                            llama.to_str().unwrap(),
                            "--mlx-path",
                            quantized.to_str().unwrap(),
                            "-q",
                            "--q-bits",
                            "3",
                            "--q-group-size",
                            "32",
                        ],
                    );
                    assert_eq!(code, 0, "{err}");
                    quantized.to_str().unwrap().to_string()
                }
                a => a.to_string(),
            })
            .collect();
        let dst = out.join(case);
        let mut args = vec![
            "quant",
            method,
            "--model",
            src.to_str().unwrap(),
            "--mlx-path",
            dst.to_str().unwrap(),
            "--data-path",
            text.to_str().unwrap(),
        ];
        args.extend(staged.iter().map(String::as_str));
        // `--sensitivities @`: mlx-lm's own file for this case, written into the work directory.
        let given = work.join("given_sensitivities.json.in");
        for a in extra {
            if *a == "@" {
                std::fs::write(&given, want["sensitivities"].as_str().unwrap()).unwrap();
                args.push(given.to_str().unwrap());
            } else {
                args.push(a);
            }
        }
        let (code, stdout, stderr) = mlx_in(&work, &args);
        assert_eq!(code, 0, "{case}: {stderr}");
        if method == "dwq" {
            // mlx-lm's printed lines: the trainable share and the validation losses.
            let theirs: Vec<&str> = want["log"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(Value::as_str)
                .collect();
            let ours: Vec<&str> = stdout
                .lines()
                .filter(|l| l.starts_with("Trainable") || l.starts_with("Validation:"))
                .collect();
            if ours != theirs {
                bad.push(format!("{case}: {ours:?}, mlx-lm {theirs:?}"));
            }
        } else {
            assert!(
                stdout.contains("bits per weight"),
                "{case}: no bits-per-weight line in {stdout}"
            );
        }
        if let Some(log) = want
            .get("log")
            .and_then(Value::as_array)
            .filter(|_| method == "awq")
        {
            let theirs: Vec<String> = log.iter().map(|l| figure(l.as_str().unwrap())).collect();
            let ours: Vec<String> = stdout
                .lines()
                .filter(|l| l.starts_with("Loss"))
                .map(figure)
                .collect();
            if ours != theirs {
                bad.push(format!(
                    "{case}: loss reductions {ours:?}, mlx-lm {theirs:?}"
                ));
            }
        }
        if let Some(theirs) = want.get("sensitivities").and_then(Value::as_str) {
            if !extra.contains(&"@") && sensitivities_in(&work).as_deref() != Some(theirs) {
                bad.push(format!(
                    "{case}: sensitivities {:?}, mlx-lm {theirs}",
                    sensitivities_in(&work)
                ));
            }
        }
        if let Some(ppl) = want.get("ppl").and_then(Value::as_array) {
            let ours: Vec<&str> = stdout.lines().filter(|l| l.contains("PPL:")).collect();
            let theirs: Vec<&str> = ppl.iter().filter_map(Value::as_str).collect();
            if ours != theirs {
                bad.push(format!("{case}: {ours:?}, mlx-lm {theirs:?}"));
            }
        }
        bad.extend(compare(case, &dst, want));
        if let Some(t) = want.get("targets").and_then(Value::as_object) {
            bad.extend(compare_targets(case, &targets, t));
        }
    }
    let _ = std::fs::remove_dir_all(&out);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The saved DWQ targets against the golden's hashes of mlx-lm's (`split/name` -> sha256).
fn compare_targets(case: &str, dir: &Path, want: &serde_json::Map<String, Value>) -> Vec<String> {
    let mut bad = Vec::new();
    let mut ours = Vec::new();
    for split in ["train", "valid"] {
        for e in std::fs::read_dir(dir.join(split)).into_iter().flatten() {
            ours.push(format!(
                "{split}/{}",
                e.unwrap().file_name().to_string_lossy()
            ));
        }
    }
    ours.sort();
    let theirs: Vec<&String> = want.keys().collect();
    if ours.iter().collect::<Vec<_>>() != theirs {
        bad.push(format!("{case}: target files {ours:?}, mlx-lm {theirs:?}"));
    }
    for (name, sha) in want {
        let got = std::fs::read(dir.join(name)).map(|b| crate::model_output::sha(&b));
        if got.as_deref().ok() != sha.as_str() {
            bad.push(format!("{case}: target {name} differs from mlx-lm's"));
        }
    }
    bad
}

/// `goldens_dwq.py`'s `stage_padded`: the convert llama with `embed_tokens` and `lm_head`
/// padded with zero rows to 1056 (DWQ's saved targets are the top 1024 logits).
fn stage_padded(dst: &Path) -> PathBuf {
    use mlx_core::prelude::*;
    let src = tests_dir().join("convert/llama");
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    let (mut w, meta) =
        mlx_core::io::load_safetensors(src.join("model.safetensors"), None).unwrap();
    for k in ["model.embed_tokens.weight", "lm_head.weight"] {
        let a = &w[k];
        let (rows, cols) = (a.shape()[0], a.shape()[1]);
        let pad = ops::zeros(&[1056 - rows, cols], a.dtype(), None).unwrap();
        let padded = ops::concatenate(&[a, &pad], 0, None).unwrap();
        w.insert(k.to_string(), padded);
    }
    mlx_core::io::save_safetensors(
        dst.join("model.safetensors"),
        w.iter().map(|(k, v)| (k.as_str(), v)),
        &meta,
    )
    .unwrap();
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["vocab_size"] = 1056.into();
    std::fs::write(dst.join("config.json"), cfg.to_string()).unwrap();
    dst.to_path_buf()
}

/// A `Loss reduction: X` line's figure as float32 (mlx-lm prints the float32's double), or
/// the fallback line as it is.
fn figure(line: &str) -> String {
    match line.strip_prefix("Loss reduction: ") {
        Some(x) => format!("{}", x.parse::<f64>().unwrap() as f32),
        None => line.to_string(),
    }
}

#[test]
fn gptq_equals_mlx_lm_bit_for_bit() {
    check_cases("gptq", &[]);
}

#[test]
fn awq_equals_mlx_lm_bit_for_bit() {
    check_cases(
        "awq",
        &[
            "q4_g32",
            "qwen3_q4",
            "mistral_q8",
            "gemma3_q4",
            "gemma3_wrapper_q4",
            "ministral3_q4",
            "mistral3_wrapper_q4",
        ],
    );
}

#[test]
#[ignore = "~40 s in debug: cargo test -p mlx-cli --test integration quant:: -- --ignored"]
fn awq_equals_mlx_lm_bit_for_bit_over_batches_and_strides() {
    check_cases("awq", &["q3_g64_all"]);
}

#[test]
fn dynamic_equals_mlx_lm_bit_for_bit() {
    check_cases("dynamic", &[]);
}

#[test]
fn dynamic_from_mlx_lm_sensitivities_equals_mlx_lm() {
    check_cases_with("dynamic", &["llama_3_6_g32"], &["--sensitivities", "@"]);
}

#[test]
fn dwq_equals_mlx_lm_bit_for_bit() {
    check_cases("dwq", &[]);
}

#[test]
fn awq_refuses_what_its_recipe_does_not_cover() {
    let out = temp_dir("awq-bad");
    let text = tests_dir().join("quant/calibration.txt");
    let dst = out.join("q");
    // phi3 is not in mlx-lm's AWQ table.
    let src = tests_dir().join("models/phi3");
    let (code, _, err) = mlx(&[
        "quant",
        "awq",
        "--model",
        src.to_str().unwrap(),
        "--mlx-path",
        dst.to_str().unwrap(),
        "--data-path",
        text.to_str().unwrap(),
        "--sequence-length",
        "8",
        "--num-samples",
        "2",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("AWQ support for phi3"), "{err}");
    assert!(!dst.exists());
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn gptq_refuses_bad_options_with_the_option_named() {
    let out = temp_dir("bad");
    let src = tests_dir().join("convert/llama");
    let text = tests_dir().join("quant/calibration.txt");
    let dst = out.join("q");
    let base = |extra: &[&str]| {
        let mut a = vec![
            "quant".to_string(),
            "gptq".into(),
            "--model".into(),
            src.to_str().unwrap().into(),
            "--mlx-path".into(),
            dst.to_str().unwrap().into(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let run = |args: Vec<String>| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        mlx(&refs)
    };
    let t = text.to_str().unwrap();
    let (code, _, err) = run(base(&["--data-path", "/nonexistent/calibration.txt"]));
    assert_ne!(code, 0);
    assert!(err.contains("--data-path"), "{err}");
    let (code, _, err) = run(base(&["--data-path", t, "--bits", "3"]));
    assert_ne!(code, 0);
    assert!(err.contains("--bits"), "{err}");
    let (code, _, err) = run(base(&["--data-path", t, "--group-size", "48"]));
    assert_ne!(code, 0);
    assert!(err.contains("--group-size"), "{err}");
    let (code, _, err) = run(base(&["--data-path", t, "--sequence-length", "5000"]));
    assert_ne!(code, 0);
    assert!(err.contains("--sequence-length"), "{err}");
    assert!(!dst.exists(), "a refused run left {}", dst.display());
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn dynamic_and_dwq_refuse_bad_options_with_the_option_named() {
    let out = temp_dir("dyn-dwq-bad");
    let src = tests_dir().join("convert/llama");
    let text = tests_dir().join("quant/calibration.txt");
    let rows = tests_dir().join("quant/dwq_train.jsonl");
    let dst = out.join("q");
    let run = |method: &str, data: &Path, extra: &[&str]| {
        let mut a = vec![
            "quant",
            method,
            "--model",
            src.to_str().unwrap(),
            "--mlx-path",
            dst.to_str().unwrap(),
            "--data-path",
            data.to_str().unwrap(),
        ];
        a.extend(extra);
        mlx_in(&out, &a)
    };
    for (method, data, extra, named) in [
        ("dynamic", &text, &["--low-bits", "7"][..], "--low-bits"),
        ("dynamic", &text, &["--target-bpw", "0"][..], "--target-bpw"),
        (
            "dynamic",
            &text,
            &["--sensitivities", "/nonexistent.json"][..],
            "--sensitivities",
        ),
        // A student that is not quantized (mlx-lm: "Quantized model must already be
        // quantized.").
        (
            "dwq",
            &rows,
            &[
                "--quantized-model",
                src.to_str().unwrap(),
                "--num-samples",
                "8",
            ][..],
            "--quantized-model",
        ),
        ("dwq", &rows, &["--bits", "7"][..], "--bits"),
        // All 20 rows train: none is left to validate on.
        ("dwq", &rows, &["--num-samples", "20"][..], "--num-samples"),
    ] {
        let (code, _, err) = run(method, data, extra);
        assert_ne!(code, 0, "{method} {extra:?}");
        assert!(err.contains(named), "{method} {extra:?}: {err}");
    }
    assert!(!dst.exists(), "a refused run left {}", dst.display());
    let _ = std::fs::remove_dir_all(&out);
}

/// `--targets-only` computes and saves the teacher's targets (equal to mlx-lm's files of the
/// `llama_target_dir` case) and writes no model.
#[test]
fn dwq_targets_only_saves_mlx_lm_targets_and_stops() {
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(tests_dir().join("goldens/dwq.json")).unwrap(),
    )
    .unwrap();
    let want = &golden["llama_target_dir"];
    let out = temp_dir("dwq-targets-only");
    let src = stage_padded(&out.join("padded"));
    let targets = out.join("targets");
    let dst = out.join("q");
    let rows = tests_dir().join("quant/dwq_train.jsonl");
    let (code, _, err) = mlx_in(
        &out,
        &[
            "quant",
            "dwq",
            "--model",
            src.to_str().unwrap(),
            "--mlx-path",
            dst.to_str().unwrap(),
            "--data-path",
            rows.to_str().unwrap(),
            "--target-dir",
            targets.to_str().unwrap(),
            "--targets-only",
            "--num-samples",
            "8",
            "--seed",
            "5",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(!dst.exists());
    let bad = compare_targets(
        "targets-only",
        &targets,
        want["targets"].as_object().unwrap(),
    );
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    let _ = std::fs::remove_dir_all(&out);
}

//! `mlx perplexity` against `mlx_lm.perplexity` (goldens from `cargo xtask goldens
//! perplexity`, `xtask/oracle/goldens_perplexity.py`): the same data sampling (numpy's
//! seeded permutation of the records), batches and figures, the perplexity and its standard
//! error equal as float64 on tiny fixtures (f32, bf16, f16 and 4-bit models).

use crate::support;
use support::mlx;

use std::path::PathBuf;

use serde_json::Value;

fn tests_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

#[test]
fn perplexity_equals_mlx_lm() {
    let golden = golden();
    let data = tests_dir().join("perplexity/train.jsonl");
    for (case, want) in golden["cases"].as_object().unwrap() {
        let model = tests_dir().join(want["model"].as_str().unwrap());
        let s = |k: &str| want[k].to_string();
        let (code, stdout, stderr) = mlx(&[
            "perplexity",
            "--model",
            model.to_str().unwrap(),
            "--data-path",
            data.to_str().unwrap(),
            "--batch-size",
            &s("batch_size"),
            "--sequence-length",
            &s("sequence_length"),
            "--num-samples",
            &s("num_samples"),
            "--seed",
            &s("seed"),
            "--json",
        ]);
        assert_eq!(code, 0, "{case}: {stderr}");
        let line = stdout.lines().last().unwrap();
        let got: Value = serde_json::from_str(line).unwrap();
        for k in ["perplexity", "standard_error"] {
            let w: f64 = want[k].as_str().unwrap().parse().unwrap();
            // The number's text, parsed exactly (serde_json's default float parser may be
            // off by one ulp).
            let at = line.find(&format!("\"{k}\":")).unwrap() + k.len() + 3;
            let text: String = line[at..]
                .chars()
                .take_while(|c| !matches!(c, ',' | '}'))
                .collect();
            let g: f64 = text.parse().unwrap();
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{case}: {k}: ours {g}, mlx-lm {w}"
            );
        }
        assert_eq!(got["samples"], want["samples"], "{case}");
    }
}

#[test]
fn perplexity_refuses_bad_input_naming_it() {
    let model = tests_dir().join("models/qwen3");
    let model = model.to_str().unwrap();
    let data = tests_dir().join("perplexity/train.jsonl");
    let data = data.to_str().unwrap();
    for (args, needle) in [
        (
            vec!["--data-path", "/nonexistent.jsonl"],
            "/nonexistent.jsonl",
        ),
        (
            vec!["--data-path", data, "--sequence-length", "1"],
            "--sequence-length",
        ),
        (
            vec!["--data-path", data, "--batch-size", "0"],
            "--batch-size",
        ),
        // More tokens asked for than the records hold.
        (
            vec!["--data-path", data, "--num-samples", "100000"],
            "fewer than",
        ),
    ] {
        let mut a = vec!["perplexity", "--model", model];
        a.extend(args.iter());
        let (code, _, stderr) = mlx(&a);
        assert_ne!(code, 0, "{args:?}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

fn golden() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(tests_dir().join("goldens/perplexity.json")).unwrap(),
    )
    .unwrap()
}

/// The parameter count `mlx perplexity` prints (`mlx info`'s, from the weight files' headers)
/// equals what mlx_lm.perplexity's `get_total_parameters` counts, on every golden model:
/// plain f32, bf16 and f16 weights and packed 4-bit ones (counted at their unpacked size).
#[test]
fn parameter_counts_equal_mlx_lm() {
    let golden = golden();
    let models = golden["model_loaded"].as_object().unwrap();
    assert_eq!(models.len(), 4);
    for (dir, want) in models {
        let model = tests_dir().join(dir);
        let (code, stdout, stderr) = mlx(&["info", "--model", model.to_str().unwrap(), "--json"]);
        assert_eq!(code, 0, "{dir}: {stderr}");
        let got: Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(got["parameters"], want["total_parameters"], "{dir}");
    }
}

/// Without `--json`, `mlx perplexity` prints mlx_lm.perplexity's lines, the `Model loaded`
/// line equal to the one the golden recorded from mlx-lm's `main`.
#[test]
fn perplexity_prints_mlx_lm_s_lines() {
    let golden = golden();
    let loaded = golden["model_loaded"]["models/q4_g32"]["line"]
        .as_str()
        .unwrap();
    let model = tests_dir().join("models/q4_g32");
    let data = tests_dir().join("perplexity/train.jsonl");
    let (code, stdout, stderr) = mlx(&[
        "perplexity",
        "--model",
        model.to_str().unwrap(),
        "--data-path",
        data.to_str().unwrap(),
        "--sequence-length",
        "8",
        "--num-samples",
        "4",
        "--batch-size",
        "2",
    ]);
    assert_eq!(code, 0, "{stderr}");
    for line in [
        loaded,
        "Loading dataset...",
        "  Sequence length: 8",
        "  Loaded 4 samples",
        "Evaluating perplexity with batch size 2...",
        "EVALUATION RESULTS",
        "  Total samples: 4",
        "  Total tokens: 32",
    ] {
        assert!(stdout.lines().any(|l| l == line), "{line:?}: {stdout}");
    }
    for prefix in ["Perplexity: ", "Evaluation time: ", "Peak memory: "] {
        assert!(
            stdout.lines().any(|l| l.starts_with(prefix)),
            "{prefix:?}: {stdout}"
        );
    }
}

/// `mlx benchmark` draws mlx_lm.benchmark's prompt ids (seed 0 before loading, the key
/// advanced by the model's construction) and reports every trial and the averages.
#[test]
fn benchmark_draws_mlx_lm_prompts_and_reports_trials() {
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(tests_dir().join("goldens/perplexity.json")).unwrap(),
    )
    .unwrap();
    for (model, want) in golden["benchmark_prompts"].as_object().unwrap() {
        let dir = tests_dir().join(model);
        let (code, stdout, stderr) = mlx(&[
            "benchmark",
            "--model",
            dir.to_str().unwrap(),
            "--dtype",
            "stored",
            "-p",
            "12",
            "-g",
            "3",
            "-n",
            "2",
            "--json",
        ]);
        assert_eq!(code, 0, "{model}: {stderr}");
        let lines: Vec<Value> = stdout
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(&lines[0]["prompt"], want, "{model}: prompt ids");
        assert_eq!(lines[1]["trial"], 1);
        assert_eq!(lines[2]["trial"], 2);
        assert!(lines[3]["averages"]["generation_tps"].as_f64().unwrap() > 0.0);
    }
    // The text report, as mlx_lm.benchmark prints it.
    let dir = tests_dir().join("models/qwen3");
    let (code, stdout, _) = mlx(&[
        "benchmark",
        "--model",
        dir.to_str().unwrap(),
        "-p",
        "4",
        "-g",
        "2",
        "-n",
        "1",
    ]);
    assert_eq!(code, 0);
    assert!(stdout.contains("Timing with prompt_tokens=4, generation_tokens=2, batch_size=1."));
    assert!(stdout.contains("Trial 1:  prompt_tps="));
    assert!(stdout.contains("Averages: prompt_tps="));
}

/// `--decoder cpu` (L3): the CPU decoder's teacher-forced forward, float32 products and cache,
/// on the same rows as mlx_lm.perplexity; the perplexity and its standard error within
/// `CPU_PPL_BOUND` (relative) of mlx-lm's on every golden case. Measured: 3e-7 to 1.3e-6 on the
/// float32-activation rows (4-bit, qwen3), 3e-5 to 8e-5 on f16 and 3e-4 to 8e-4 on bf16, where
/// mlx-lm rounds every activation to the model's dtype and the decoder keeps float32; 1.1e-4
/// on SmolLM2-135M float32 (results/quant/2026-12-04-session20/).
const CPU_PPL_BOUND: f64 = 2e-3;

#[test]
fn perplexity_on_the_cpu_decoder_is_within_the_bound() {
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(tests_dir().join("goldens/perplexity.json")).unwrap(),
    )
    .unwrap();
    let data = tests_dir().join("perplexity/train.jsonl");
    for (case, want) in golden["cases"].as_object().unwrap() {
        let model = tests_dir().join(want["model"].as_str().unwrap());
        let s = |k: &str| want[k].to_string();
        let (code, stdout, stderr) = mlx(&[
            "perplexity",
            "--model",
            model.to_str().unwrap(),
            "--data-path",
            data.to_str().unwrap(),
            "--batch-size",
            &s("batch_size"),
            "--sequence-length",
            &s("sequence_length"),
            "--num-samples",
            &s("num_samples"),
            "--seed",
            &s("seed"),
            "--decoder",
            "cpu",
            "--json",
        ]);
        assert_eq!(code, 0, "{case}: {stderr}");
        let got: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        for k in ["perplexity", "standard_error"] {
            let w: f64 = want[k].as_str().unwrap().parse().unwrap();
            let g = got[k].as_f64().unwrap();
            let rel = (g - w).abs() / w;
            eprintln!("{case}: {k}: cpu {g}, mlx-lm {w}, relative {rel:.2e}");
            assert!(rel <= CPU_PPL_BOUND, "{case}: {k}: cpu {g}, mlx-lm {w}");
        }
        assert_eq!(got["samples"], want["samples"], "{case}");
    }
}

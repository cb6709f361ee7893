//! The `mlx` command end to end: greedy generation on the real SmolLM2-135M-Instruct GGUF
//! reproduces `mlx_lm generate`'s token ids and log-probabilities exactly (raw prompt and
//! chat-templated prompt, float32; goldens from `cargo xtask goldens smollm2_generate`), and
//! bad input gets a clear error and a non-zero exit.

use crate::support;
use support::mlx;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn golden() -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/goldens/smollm2_generate.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn greedy_generation_reproduces_mlx_lm() {
    let model = mlx_engine::fetch::smollm2_gguf().unwrap();
    let model = model.to_str().unwrap();
    for case in golden()["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let max = case["max_tokens"].as_u64().unwrap().to_string();
        let mut args = vec![
            "generate",
            "--model",
            model,
            "--dtype",
            "f32",
            "--json",
            "--max-tokens",
            &max,
        ];
        args.extend(["--prompt", case["prompt"].as_str().unwrap()]);
        if !case["chat"].as_bool().unwrap() {
            args.push("--no-chat-template");
        }
        if let Some(s) = case.get("system").and_then(Value::as_str) {
            args.extend(["--system", s]);
        }
        let (code, out, err) = mlx(&args);
        assert_eq!(code, 0, "{name}: {err}");
        let got: Value =
            serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{name}: {e}: {out}"));
        assert_eq!(got["prompt_ids"], case["prompt_ids"], "{name}: prompt ids");
        assert_eq!(got["tokens"], case["tokens"], "{name}: generated ids");
        assert_eq!(
            got["logprobs"], case["logprobs"],
            "{name}: log-probabilities"
        );
        assert_eq!(got["text"], case["text"], "{name}: text");
        assert_eq!(got["dtype"], "float32");
    }
}

#[test]
fn prompt_ids_and_top_logprobs() {
    let model = mlx_engine::fetch::smollm2_gguf().unwrap();
    let (code, out, err) = mlx(&[
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--prompt-ids",
        "1,4093,198",
        "--max-tokens",
        "3",
        "--json",
        "--top-logprobs",
        "3",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["prompt_ids"], serde_json::json!([1, 4093, 198]));
    let tops = v["top_logprobs"].as_array().unwrap();
    assert_eq!(tops.len(), v["tokens"].as_array().unwrap().len());
    for (step, top) in tops.iter().enumerate() {
        let top = top.as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely one, and the list is sorted.
        assert_eq!(top[0][0], v["tokens"][step]);
        assert_eq!(top[0][1], v["logprobs"][step]);
        assert!(
            top[0][1].as_f64() >= top[1][1].as_f64() && top[1][1].as_f64() >= top[2][1].as_f64()
        );
    }
}

/// `--decoder`: `auto` runs the CPU decoder on the CPU backend with the default `--dtype
/// auto` and says so under `--verbose`; an explicit dtype or an option it cannot honour keeps
/// MLX's exact path (with the reason); `--decoder cpu` where it cannot run is an error naming
/// why; `--decoder mlx` and `--decoder cpu` agree on a short greedy reply here.
#[test]
fn decoder_flag_picks_the_decoder_and_says_why() {
    let model = mlx_engine::fetch::smollm2_gguf().unwrap();
    let model = model.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            model,
            "--prompt-ids",
            "1,4093,198",
            "-m",
            "4",
            "--json",
        ];
        args.extend_from_slice(extra);
        mlx(&args)
    };
    let (code, out, err) = run(&[]);
    assert_eq!(code, 0, "{err}");
    let cpu: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(cpu["decoder"], "cpu", "{err}");
    assert!(err.contains("[mlx] decoder: cpu ("), "{err}");
    // The kernels the decoder runs (`avx512+vnni+amx` where AMX's tiles run prompt blocks).
    let kernels = format!(
        "[mlx] decoder: cpu ({}, ",
        mlx_engine::cpu_decode::kernels()
    );
    assert!(err.contains(&kernels), "{kernels} in {err}");
    let (code, out, err) = run(&["--decoder", "mlx", "--threads", "1"]);
    assert_eq!(code, 0, "{err}");
    let exact: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(exact["decoder"], "mlx");
    assert_eq!(cpu["tokens"], exact["tokens"]);
    let (code, out, err) = run(&["--dtype", "f32"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        serde_json::from_str::<Value>(out.trim()).unwrap()["decoder"],
        "mlx"
    );
    assert!(
        err.contains("--dtype f32 asks for MLX's exact numerics"),
        "{err}"
    );
    let (code, out, err) = run(&["--max-kv-size", "64"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        serde_json::from_str::<Value>(out.trim()).unwrap()["decoder"],
        "mlx"
    );
    assert!(err.contains("does not apply: --max-kv-size"), "{err}");
    let (code, out, err) = run(&["--decoder", "cpu", "--kv-bits", "4"]);
    assert_eq!(code, 1, "{out}");
    assert!(err.contains("--decoder cpu: --kv-bits"), "{err}");
    let (code, _, err) = run(&["--decoder", "gpu"]);
    assert_ne!(code, 0);
    assert!(err.contains("--decoder"), "{err}");
    let (code, _, err) = run(&["--threads", "0"]);
    assert_ne!(code, 0);
    assert!(err.contains("--threads"), "{err}");
}

fn mlx_stdin(args: &[&str], stdin: &str) -> (i32, String, String) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_mlx"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run mlx");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `mlx chat` runs the CPU decoder by default on the CPU backend (its cache kept across turns,
/// `r` resetting it) and says so; `--decoder mlx` keeps the exact path. Two greedy turns agree
/// between the two here (tier L3: same tokens on this short reply), with the same number of
/// cached tokens after each turn.
#[test]
fn chat_runs_the_cpu_decoder_by_default() {
    let model = mlx_engine::fetch::smollm2_gguf().unwrap();
    let model = model.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["chat", "--model", model, "-m", "4", "--json"];
        args.extend_from_slice(extra);
        let (code, out, err) = mlx_stdin(&args, "Hi\nWhat is 2+2?\nr\nHi\n");
        assert_eq!(code, 0, "{err}");
        let turns: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (turns, err)
    };
    let (cpu, err) = run(&["--verbose", "true"]);
    assert!(err.contains("[mlx] decoder: cpu ("), "{err}");
    let (exact, err) = run(&["--decoder", "mlx", "--verbose", "true"]);
    assert!(err.contains("[mlx] decoder: mlx (--decoder mlx)"), "{err}");
    assert_eq!(cpu.len(), 3);
    assert_eq!(exact.len(), 3);
    for (i, (c, e)) in cpu.iter().zip(&exact).enumerate() {
        assert_eq!(c["decoder"], "cpu");
        assert_eq!(e["decoder"], "mlx");
        assert_eq!(c["tokens"], e["tokens"], "turn {i}");
        assert_eq!(c["cached_tokens"], e["cached_tokens"], "turn {i}");
    }
    // After `r` the third turn starts from an empty cache, as the first did.
    assert_eq!(cpu[2]["cached_tokens"], cpu[0]["cached_tokens"]);
    assert_eq!(cpu[2]["tokens"], cpu[0]["tokens"]);
    // An option the CPU decoder cannot honour falls back, saying why.
    let (turns, err) = run(&["--max-kv-size", "64", "--verbose", "true"]);
    assert_eq!(turns[0]["decoder"], "mlx");
    assert!(err.contains("does not apply: --max-kv-size"), "{err}");
}

/// `mlx embed` runs the CPU decoder by default on the CPU backend; its unit vectors are within
/// 1e-4 (absolute, per element: tier L3) of the exact path's on the real SmolLM2.
#[test]
fn embed_runs_the_cpu_decoder_by_default() {
    let model = mlx_engine::fetch::smollm2_gguf().unwrap();
    let model = model.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "embed",
            "--model",
            model,
            "--text",
            "The cat sat on the mat.",
            "--text",
            "Hi",
            "--verbose",
            "true",
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = mlx(&args);
        assert_eq!(code, 0, "{err}");
        (serde_json::from_str::<Value>(out.trim()).unwrap(), err)
    };
    let (cpu, err) = run(&[]);
    assert_eq!(cpu["decoder"], "cpu");
    assert!(err.contains("[mlx] decoder: cpu ("), "{err}");
    let (exact, err) = run(&["--decoder", "mlx"]);
    assert_eq!(exact["decoder"], "mlx", "{err}");
    let rows = |v: &Value| -> Vec<Vec<f64>> {
        v["embeddings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap())
                    .collect()
            })
            .collect()
    };
    let (a, b) = (rows(&cpu), rows(&exact));
    assert_eq!(a.len(), 2);
    for (ra, rb) in a.iter().zip(&b) {
        assert_eq!(ra.len(), rb.len());
        let worst = ra
            .iter()
            .zip(rb)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        assert!(worst < 1e-4, "largest difference {worst}");
    }
}

#[test]
fn bad_input_is_a_clear_error() {
    let (code, _, err) = mlx(&["generate", "--model", "/no/such/model"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("/no/such/model") && err.contains("not found"),
        "{err}"
    );
    let (code, _, err) = mlx(&["generate", "--max-tokens", "many"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--max-tokens") && err.contains("many"),
        "{err}"
    );
    let (code, _, err) = mlx(&["generate", "--dtype", "f8"]);
    assert_eq!(code, 2);
    assert!(err.contains("--dtype"), "{err}");
    let (code, _, err) = mlx(&["sing"]);
    assert_eq!(code, 2);
    assert!(err.contains("sing"), "{err}");
    let dir = std::env::temp_dir().join(format!("mlx-cli-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), "{not json").unwrap();
    let (code, _, err) = mlx(&["generate", "--model", dir.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("config.json"), "{err}");
    let (code, out, _) = mlx(&["--help"]);
    assert_eq!(code, 0);
    for sub in ["generate", "chat", "cache-prompt"] {
        assert!(out.contains(sub), "{out}");
    }
    let (code, out, _) = mlx(&["generate", "--help"]);
    assert_eq!(code, 0);
    for flag in [
        "--prompt-cache-file",
        "--xtc-probability",
        "--kv-bits",
        "--verbose",
    ] {
        assert!(out.contains(flag), "{out}");
    }
}

/// `--quantized-kv-start -1` is taken as mlx-lm takes it (a cache is quantized once its
/// offset reaches the start, so any negative start is 0): the same reply as `0` (a fixture
/// whose head dimension, 32, takes a group of 32).
#[test]
fn a_negative_quantized_kv_start_is_zero() {
    let fixture =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/models/mistral_bias_llama3rope");
    let model = fixture.to_str().unwrap();
    let run = |start: &str| {
        mlx(&[
            "generate",
            "--model",
            model,
            "-m",
            "6",
            "--prompt",
            "hello world",
            "--kv-bits",
            "4",
            "--kv-group-size",
            "32",
            "--quantized-kv-start",
            start,
        ])
    };
    let (code, zero, err) = run("0");
    assert_eq!(code, 0, "{err}");
    let (code, negative, err) = run("-1");
    assert_eq!(code, 0, "{err}");
    // The reply between the `==========` lines (the speed lines differ run to run).
    let reply = |out: &str| out.split("==========").nth(1).map(str::to_owned);
    assert!(reply(&zero).is_some_and(|r| !r.trim().is_empty()), "{zero}");
    assert_eq!(reply(&negative), reply(&zero));
}

/// `mlx generate`'s split load (the prompt's ids and the sampler's special tokens computed from
/// the tokenizer before any weight is read, its encoder dropped then): a chat-templated prompt
/// gives the reply its ids give, and errors come in their old order: a model whose weights
/// cannot be read is reported before a bad `--extra-eos-token`, which is reported before the
/// prompt is read.
#[test]
fn generate_split_load_keeps_replies_and_error_order() {
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/models/dense_f32");
    let model = fixture.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["generate", "--model", model, "-m", "4", "--json"];
        args.extend_from_slice(extra);
        mlx(&args)
    };
    let (code, out, err) = run(&["--prompt", "hello world", "--system", "be brief"]);
    assert_eq!(code, 0, "{err}");
    let chat: Value = serde_json::from_str(out.trim()).unwrap();
    let ids: Vec<String> = chat["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.to_string())
        .collect();
    assert!(ids.len() > 3, "{chat}");
    let (code, out, err) = run(&["--prompt-ids", &ids.join(",")]);
    assert_eq!(code, 0, "{err}");
    let by_ids: Value = serde_json::from_str(out.trim()).unwrap();
    for k in ["tokens", "logprobs", "text"] {
        assert_eq!(chat[k], by_ids[k], "{k}");
    }
    // A bad EOS token: its error, before the prompt is read (stdin is never read here).
    let (code, _, err) = run(&["--prompt", "-", "--extra-eos-token", "<no such token>"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("--extra-eos-token") && err.contains("no such token"),
        "{err}"
    );
    // Weights that cannot be read: their error, not the EOS token's.
    let dir = std::env::temp_dir().join(format!("mlx-cli-split-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixture.join(f), dir.join(f)).unwrap();
    }
    std::fs::write(
        dir.join("model.safetensors"),
        b"\x08\x00\x00\x00\x00\x00\x00\x00{}",
    )
    .unwrap();
    let (code, _, err) = mlx(&[
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--prompt",
        "hi",
        "--extra-eos-token",
        "<no such token>",
    ]);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(code, 1);
    assert!(!err.contains("--extra-eos-token"), "{err}");
    assert!(
        err.contains("model.safetensors") || err.contains("weight"),
        "{err}"
    );
}

/// The default model's first use, when it cannot be fetched: a clear error on stderr, a
/// non-zero exit, nothing on stdout, and nothing left in the cache.
#[test]
fn a_failed_first_fetch_is_a_clear_error() {
    let cache = std::env::temp_dir().join(format!("mlx-cli-nofetch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let out = Command::new(env!("CARGO_BIN_EXE_mlx"))
        .args(["generate", "--prompt", "hi", "--json"])
        .env("MLX_RS_CACHE", &cache)
        .env("MLX_RS_INDEX_URL", "http://127.0.0.1:1/simple")
        .output()
        .expect("run mlx");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(out.stdout.is_empty());
    assert!(
        err.contains("fetching SmolLM2-135M-Instruct") && err.contains("127.0.0.1:1/simple/"),
        "{err}"
    );
    fn files(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                files(&e.path(), out);
            } else {
                out.push(e.path());
            }
        }
    }
    let mut left = Vec::new();
    files(&cache, &mut left);
    let _ = std::fs::remove_dir_all(&cache);
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn models_and_info_describe_what_is_served() {
    let (code, out, err) = mlx(&["models", "--json"]);
    assert_eq!(code, 0, "{err}");
    let rows: Value = serde_json::from_str(&out).unwrap();
    let rows = rows.as_array().unwrap();
    assert!(rows.len() >= 40, "{} model types", rows.len());
    let serving = |t: &str| {
        rows.iter()
            .find(|r| r["model_type"] == t)
            .map(|r| r["serving"].as_str().unwrap().to_string())
    };
    assert_eq!(serving("qwen3").as_deref(), Some("table"));
    assert_eq!(serving("qwen3_next").as_deref(), Some("dedicated"));

    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../mlx-models/tests/models/dense_f32"
    );
    let (code, out, err) = mlx(&["info", "--model", dir]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("model_type: llama") && out.contains("parameters:"),
        "{out}"
    );
    // No Rust debug structures in what users read.
    assert!(
        !out.contains("Descriptor {") && !out.contains("Float32"),
        "{out}"
    );
    let (code, out, err) = mlx(&["info", "--model", dir, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect(&out);
    assert_eq!(v["model_type"], "llama");
    assert_eq!(v["descriptor"]["num_layers"], 2);
    assert_eq!(v["dtypes"]["float32"], 20);

    let (code, _, err) = mlx(&["info", "--model", "/nonexistent-model-dir"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("/nonexistent-model-dir") && err.contains("config.json"),
        "{err}"
    );
}

/// Negative numbers reach the command's own checks, which name the flag and its range (clap
/// alone called `--temp -1` an unexpected argument); where mlx-lm gives a negative value a
/// meaning, it has that meaning here (`--top-k -1` is off, `--max-tokens -1` no limit).
#[test]
fn negative_numbers_are_parsed_and_checked() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../mlx-engine/tests/fixtures/tiny_chat"
    );
    let (code, _, err) = mlx(&["generate", "--model", dir, "--temp", "-1", "-m", "2"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("--temp must be a finite number >= 0, got -1"),
        "{err}"
    );
    let (code, _, err) = mlx(&["chat", "--model", dir, "--top-p", "-0.5"]);
    assert_eq!(code, 1);
    assert!(err.contains("--top-p"), "{err}");
    let run = |extra: &[&str]| {
        let mut args = vec!["generate", "--model", dir, "-m", "3", "--verbose", "false"];
        args.extend_from_slice(extra);
        let (code, out, err) = mlx(&args);
        assert_eq!(code, 0, "{err}");
        out
    };
    assert_eq!(run(&["--top-k", "-1"]), run(&[]));
}

/// `mlx cache-prompt` without `--model` records the built-in default under its Hub name, and
/// `mlx generate --prompt-cache-file` continues it with or without `--model` naming the
/// default (it recorded `"None"`, which it then failed to load as a model); another model
/// is still refused, as mlx-lm refuses it.
#[test]
fn a_prompt_cache_of_the_default_model_continues() {
    mlx_engine::fetch::smollm2_gguf().unwrap();
    let file = std::env::temp_dir().join(format!(
        "mlx-cli-default-cache-{}.safetensors",
        std::process::id()
    ));
    let file = file.to_str().unwrap();
    let (code, out, err) = mlx(&[
        "cache-prompt",
        "-p",
        "The code word is banana.",
        "--prompt-cache-file",
        file,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().any(|l| l.starts_with("Peak memory: ")), "{out}");
    for extra in [&[][..], &["--model", "smollm2"]] {
        let mut args = vec![
            "generate",
            "--prompt-cache-file",
            file,
            "-p",
            "What is the code word?",
            "-m",
            "3",
            "--json",
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = mlx(&args);
        assert_eq!(code, 0, "{extra:?}: {err}");
        let v: Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(v["tokens"].as_array().map(Vec::len), Some(3), "{out}");
    }
    let other = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/models/dense_f32");
    let (code, _, err) = mlx(&[
        "generate",
        "--prompt-cache-file",
        file,
        "--model",
        other,
        "-m",
        "1",
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("different model"), "{err}");
    let _ = std::fs::remove_file(file);
}

/// A closed standard output (`mlx ... | head`) is no panic: `completions` ends quietly (as
/// `info` does), `convert` and `train` go on with their work, `benchmark` stops with an error
/// naming standard output (each panicked in `println!`, exit 101, and clap_complete's writer
/// panicked the same way).
#[test]
fn a_closed_stdout_is_no_panic() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/models/dense_f32");
    let converted = std::env::temp_dir().join(format!("mlx-cli-pipe-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&converted);
    let converted = converted.to_str().unwrap().to_string();
    // Training on the small text set: its report lines go to the closed pipe, and it saves
    // its adapters all the same.
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/../mlx-train/tests/data/text");
    let adapters = std::env::temp_dir().join(format!("mlx-cli-pipe-train-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&adapters);
    let adapters = adapters.to_str().unwrap().to_string();
    let train = [
        "train",
        "--model",
        dir,
        "--train",
        "--data",
        data,
        "--iters",
        "2",
        "--batch-size",
        "2",
        "--val-batches",
        "1",
        "--steps-per-report",
        "1",
        "--num-layers",
        "1",
        "--adapter-path",
        &adapters,
    ];
    for (args, want) in [
        (&["completions", "bash"][..], 0),
        (&train[..], 0),
        (&["convert", "--hf-path", dir, "--mlx-path", &converted], 0),
        (
            &["benchmark", "--model", dir, "-p", "4", "-g", "2", "-n", "2"],
            1,
        ),
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mlx"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run mlx");
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(out.status.code(), Some(want), "{args:?}: {err}");
        if want == 1 {
            assert!(
                err.contains("writing to standard output"),
                "{args:?}: {err}"
            );
        }
    }
    // The conversion went on to the end, and the training saved its adapters.
    assert!(Path::new(&converted).join("config.json").is_file());
    assert!(Path::new(&adapters).join("adapters.safetensors").is_file());
    let _ = std::fs::remove_dir_all(&converted);
    let _ = std::fs::remove_dir_all(&adapters);
}

/// Sampler values past the vocabulary are refused naming the parameter and the vocabulary,
/// as mlx-lm words `top_k`'s: `--min-tokens-to-keep` gave MLX's bare argpartition message.
#[test]
fn sampler_values_past_the_vocabulary_name_it() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../mlx-engine/tests/fixtures/tiny_chat"
    );
    for extra in [
        &["--min-p", "0.5", "--min-tokens-to-keep", "100000"][..],
        &["--top-k", "100000"],
    ] {
        let mut args = vec!["generate", "--model", dir, "-m", "2", "--temp", "1"];
        args.extend_from_slice(extra);
        let (code, _, err) = mlx(&args);
        assert_eq!(code, 1, "{extra:?}: {err}");
        let param = extra[extra.len() - 2]
            .trim_start_matches("--")
            .replace('-', "_");
        assert!(
            err.contains(&format!("{param}: has to be")) && err.contains("100000"),
            "{extra:?}: {err}"
        );
    }
}

#[test]
fn completion_scripts_name_every_subcommand() {
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, err) = mlx(&["completions", shell]);
        assert_eq!(code, 0, "{err}");
        for sub in ["generate", "serve", "train", "manage"] {
            assert!(out.contains(sub), "{shell}: {sub}");
        }
    }
    let (code, _, _) = mlx(&["completions", "tcsh"]);
    assert_ne!(code, 0);
}

/// `mlx generate --draft-model --decoder graph` asks for speculation on the graph decoder: where
/// it cannot run (no CUDA here) the refusal names why.
#[test]
fn draft_model_on_the_graph_decoder_says_why_not() {
    let model = mlx_engine::fetch::smollm2_gguf().unwrap();
    let model = model.to_str().unwrap();
    let args = [
        "generate",
        "--model",
        model,
        "--draft-model",
        model,
        "--num-draft-tokens",
        "2",
        "--prompt",
        "hi",
        "-m",
        "3",
        "--decoder",
        "graph",
        "--verbose",
        "true",
    ];
    let (code, _, err) = mlx(&args);
    if code == 0 {
        // A CUDA build on a GPU where both models qualify: it ran there.
        assert!(err.contains("decoder: graph (speculative"), "{err}");
    } else {
        assert!(err.contains("--decoder graph: speculation:"), "{err}");
    }
}

/// `mlx chat --decoder graph` is no longer refused for keeping its cache across turns: on a
/// build or machine without CUDA the refusal names that instead (the turns' continued KV cache
/// is copied into the graph decoder on a CUDA build).
#[test]
fn chat_takes_the_graph_decoder_flag() {
    let model = mlx_engine::fetch::smollm2_gguf().unwrap();
    let model = model.to_str().unwrap();
    // Refused before a turn is read (no standard input needed).
    let (code, _, err) = mlx(&["chat", "--model", model, "-m", "2", "--decoder", "graph"]);
    assert_ne!(code, 0);
    assert!(err.contains("--decoder graph:"), "{err}");
    assert!(!err.contains("chat keeps its MLX cache"), "{err}");
}

//! `mlx generate --draft-model` against `python -m mlx_lm generate --draft-model` (goldens in
//! `mlx-engine/tests/goldens/speculative.json`, `cli` section, from
//! `xtask/oracle/goldens_spec.py`): the same text and token count, greedy and seeded (the
//! seed advanced by both models' construction draws, as mlx-lm's `load` of each takes them);
//! prompt lookup and `mlx chat --draft-model` give plain greedy decoding's text; a draft with
//! another vocabulary is refused.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn mlx(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mlx"))
        .args(args)
        .current_dir(repo())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run mlx");
    if let Some(s) = stdin {
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    } else {
        drop(child.stdin.take());
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const TARGET: &str = "mlx-cli/tests/models/dense_f32";
const DRAFT: &str = "mlx-cli/tests/models/dense_f32_draft";

/// The streamed text and the "Generation: N tokens" count of verbose output.
fn parse(out: &str) -> (String, u64) {
    let text = out
        .split_once("==========\n")
        .unwrap()
        .1
        .rsplit_once("\n==========")
        .unwrap()
        .0
        .to_string();
    let n = out
        .split_once("Generation: ")
        .unwrap()
        .1
        .split_once(" tokens")
        .unwrap()
        .0
        .parse()
        .unwrap();
    (text, n)
}

#[test]
fn draft_model_generation_reproduces_mlx_lm() {
    let p = repo().join("mlx-engine/tests/goldens/speculative.json");
    let g: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    for c in g["cli"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let extra: Vec<&str> = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let mut args = vec!["generate", "--model", TARGET, "--draft-model", DRAFT];
        args.extend(extra);
        let (code, out, err) = mlx(&args, None);
        assert_eq!(code, 0, "{name}: {err}");
        let (text, n) = parse(&out);
        assert_eq!(text, c["text"].as_str().unwrap(), "{name}");
        assert_eq!(n, c["generation_tokens"].as_u64().unwrap(), "{name}");
        assert!(out.contains("draft tokens accepted"), "{name}: {out}");
    }
}

#[test]
fn prompt_lookup_and_chat_speculation_keep_greedy_output() {
    let base = [
        "generate",
        "--model",
        TARGET,
        "--prompt",
        "the cat is big",
        "-m",
        "40",
        "--decoder",
        "mlx",
    ];
    let (code, plain, err) = mlx(&base, None);
    assert_eq!(code, 0, "{err}");
    let mut args = base.to_vec();
    args.extend(["--prompt-lookup-ngram", "1", "--num-draft-tokens", "4"]);
    let (code, lookup, err) = mlx(&args, None);
    assert_eq!(code, 0, "{err}");
    assert_eq!(parse(&lookup).0, parse(&plain).0);
    assert!(lookup.contains("draft tokens accepted"), "{lookup}");

    let turns = "hello world\nthe cat is big\nq\n";
    let chat = ["chat", "--model", TARGET, "-m", "20", "--json"];
    let (code, plain, err) = mlx(&chat, Some(turns));
    assert_eq!(code, 0, "{err}");
    let texts = |out: &str| -> Vec<String> {
        out.lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["text"].to_string())
            .collect()
    };
    for extra in [
        &["--draft-model", DRAFT][..],
        &["--prompt-lookup-ngram", "2"][..],
    ] {
        let mut args = chat.to_vec();
        args.extend(extra);
        let (code, spec, err) = mlx(&args, Some(turns));
        assert_eq!(code, 0, "{extra:?}: {err}");
        assert_eq!(texts(&spec), texts(&plain), "{extra:?}");
    }
}

#[test]
fn a_draft_model_with_another_vocabulary_is_refused() {
    let (code, _, err) = mlx(
        &[
            "generate",
            "--model",
            TARGET,
            "--draft-model",
            "mlx-train/tests/models/dense",
        ],
        None,
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("--draft-model") && err.contains("does not match model tokenizer"),
        "{err}"
    );
    let (code, _, err) = mlx(
        &[
            "generate",
            "--model",
            TARGET,
            "--draft-model",
            DRAFT,
            "--prompt-lookup-ngram",
            "2",
        ],
        None,
    );
    assert_ne!(code, 0);
    assert!(err.contains("cannot be used with"), "{err}");
}

#[path = "../../mlx-engine/tests/support/mtp_fixture.rs"]
mod mtp_fixture;

#[test]
fn mtp_generation_keeps_greedy_output() {
    let tok = repo().join("mlx-cli/tests/models/tokenizer");
    for (fixture, name) in [
        ("qwen3_next", "qwen3_next"),
        ("mla/deepseek_v3", "deepseek_v3"),
    ] {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cli_mtp_{name}"));
        mtp_fixture::with_mtp(
            &repo().join("mlx-models/tests/models").join(fixture),
            &dir,
            7,
        );
        for f in ["tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(tok.join(f), dir.join(f)).unwrap();
        }
        let dir = dir.to_str().unwrap();
        let base = [
            "generate",
            "--model",
            dir,
            "--prompt",
            "the cat is big",
            "-m",
            "24",
        ];
        // Without --mtp: the strict loader refuses the MTP tensors, as mlx-lm's does.
        let (code, _, err) = mlx(&base, None);
        assert_ne!(code, 0, "{name}");
        assert!(err.contains("eh_proj") || err.contains("mtp.fc"), "{err}");
        let plain_dir = repo().join("mlx-cli/tests/models/qwen3_next");
        if name == "qwen3_next" {
            let mut args = base.to_vec();
            args[2] = plain_dir.to_str().unwrap();
            let (code, plain, err) = mlx(&args, None);
            assert_eq!(code, 0, "{err}");
            let mut args = base.to_vec();
            args.extend(["--mtp", "--num-draft-tokens", "3", "--verbose", "True"]);
            let (code, mtp, err) = mlx(&args, None);
            assert_eq!(code, 0, "{err}");
            assert_eq!(parse(&mtp).0, parse(&plain).0);
            assert!(mtp.contains("draft tokens accepted"), "{mtp}");
        } else {
            let mut args = base.to_vec();
            args.extend(["--mtp", "--verbose", "True"]);
            let (code, out, err) = mlx(&args, None);
            assert_eq!(code, 0, "{err}");
            assert!(out.contains("draft tokens accepted"), "{out}");
        }
    }
    // A model without MTP layers refuses --mtp, naming the flag.
    let (code, _, err) = mlx(
        &[
            "generate", "--model", TARGET, "--prompt", "hi", "-m", "4", "--mtp",
        ],
        None,
    );
    assert_ne!(code, 0);
    assert!(err.contains("--mtp"), "{err}");
}

#[test]
fn prompt_lookup_on_the_cpu_decoder_keeps_its_greedy_output() {
    let base = [
        "generate",
        "--model",
        TARGET,
        "--prompt",
        "the cat is big the cat is big",
        "-m",
        "40",
        "--decoder",
        "cpu",
        "--verbose",
        "true",
    ];
    let (code, plain, err) = mlx(&base, None);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("decoder: cpu"), "{err}");
    for (ngram, k) in [("1", "4"), ("2", "3")] {
        let mut args = base.to_vec();
        args.extend(["--prompt-lookup-ngram", ngram, "--num-draft-tokens", k]);
        let (code, lookup, err) = mlx(&args, None);
        assert_eq!(code, 0, "{err}");
        assert!(
            err.contains("decoder: cpu") && err.contains("prompt lookup"),
            "{err}"
        );
        assert_eq!(parse(&lookup), parse(&plain), "ngram {ngram}");
        assert!(lookup.contains("draft tokens accepted"), "{lookup}");
    }
    // The JSON output: the same tokens and log-probabilities (bit for bit: a verification
    // pass computes each row's as a plain step does), and the acceptance counted.
    let json = |extra: &[&str]| -> Value {
        let mut args = base[..9].to_vec();
        args.push("--json");
        args.extend(extra);
        let (code, out, err) = mlx(&args, None);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str(out.trim()).unwrap()
    };
    let plain = json(&[]);
    let spec = json(&["--prompt-lookup-ngram", "1", "--num-draft-tokens", "4"]);
    assert_eq!(spec["tokens"], plain["tokens"]);
    assert_eq!(spec["logprobs"], plain["logprobs"]);
    assert_eq!(spec["decoder"], "cpu");
    assert!(spec["verification_passes"].as_u64().unwrap() > 0, "{spec}");
    // Sampling does not speculate on the CPU decoder: `--decoder cpu` says so.
    let mut args = base.to_vec();
    args.extend(["--prompt-lookup-ngram", "1", "--temp", "0.5"]);
    let (code, _, err) = mlx(&args, None);
    assert_ne!(code, 0);
    assert!(
        err.contains("--decoder cpu") && err.contains("greedy"),
        "{err}"
    );
}

#[test]
fn chat_prompt_lookup_on_the_cpu_decoder_keeps_greedy_turns() {
    // Turns that end at EOS and at the token limit; later turns repeat earlier ones, so
    // lookups find drafts in the conversation's history.
    let turns = "the cat is big the cat is big\nhello world\nthe cat is big the cat is big\nq\n";
    let chat = [
        "chat",
        "--model",
        TARGET,
        "-m",
        "24",
        "--json",
        "--decoder",
        "cpu",
    ];
    let (code, plain, err) = mlx(&chat, Some(turns));
    assert_eq!(code, 0, "{err}");
    let lines = |out: &str| -> Vec<Value> {
        out.lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .collect()
    };
    let plain = lines(&plain);
    assert_eq!(plain.len(), 3);
    for k in ["1", "3", "8"] {
        let mut args = chat.to_vec();
        args.extend(["--prompt-lookup-ngram", "1", "--num-draft-tokens", k]);
        let (code, spec, err) = mlx(&args, Some(turns));
        assert_eq!(code, 0, "k {k}: {err}");
        let spec = lines(&spec);
        assert_eq!(spec.len(), plain.len(), "k {k}");
        let mut drafted = 0;
        for (s, p) in spec.iter().zip(&plain) {
            for f in ["text", "tokens", "finish_reason", "cached_tokens"] {
                assert_eq!(s[f], p[f], "k {k}: {f}");
            }
            assert_eq!(s["decoder"], "cpu", "k {k}");
            drafted += s["draft_tokens"].as_u64().unwrap();
        }
        assert!(drafted > 0, "k {k}: no drafts in {spec:?}");
    }
    // Sampling with --decoder cpu is refused, naming why.
    let mut args = chat.to_vec();
    args.extend(["--prompt-lookup-ngram", "1", "--temp", "0.7"]);
    let (code, _, err) = mlx(&args, Some(turns));
    assert_ne!(code, 0);
    assert!(err.contains("greedy"), "{err}");
}

/// `--draft-model` with `--decoder cpu`: both models on the CPU decoder (the draft on its
/// own), drafts verified in batched passes; the text and tokens are plain greedy decoding's
/// on the CPU decoder. Sampling is refused there.
#[test]
fn draft_model_on_the_cpu_decoder_keeps_its_greedy_output() {
    let base = [
        "generate",
        "--model",
        TARGET,
        "--prompt",
        "the cat is big the cat is big",
        "-m",
        "40",
        "--decoder",
        "cpu",
        "--json",
    ];
    let run = |extra: &[&str]| -> (Value, String) {
        let mut args = base.to_vec();
        args.extend(extra);
        let (code, out, err) = mlx(&args, None);
        assert_eq!(code, 0, "{extra:?}: {err}");
        (serde_json::from_str(out.trim()).unwrap(), err)
    };
    let (plain, _) = run(&[]);
    for k in ["1", "3", "5"] {
        let (spec, _) = run(&["--draft-model", DRAFT, "--num-draft-tokens", k]);
        assert_eq!(spec["tokens"], plain["tokens"], "k {k}");
        assert_eq!(spec["text"], plain["text"], "k {k}");
        assert_eq!(spec["decoder"], "cpu");
        assert!(spec["verification_passes"].as_u64().unwrap() > 0, "{spec}");
    }
    // The target as its own draft: every draft accepted.
    let (spec, _) = run(&["--draft-model", TARGET, "--num-draft-tokens", "3"]);
    assert_eq!(spec["tokens"], plain["tokens"]);
    let mut args = base.to_vec();
    args.extend(["--draft-model", DRAFT, "--verbose", "true"]);
    let (code, _, err) = mlx(&args, None);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("decoder: cpu") && err.contains("draft model"),
        "{err}"
    );
    let mut args = base.to_vec();
    args.extend(["--draft-model", DRAFT, "--temp", "0.5"]);
    let (code, _, err) = mlx(&args, None);
    assert_ne!(code, 0);
    assert!(
        err.contains("--decoder cpu") && err.contains("greedy"),
        "{err}"
    );
}

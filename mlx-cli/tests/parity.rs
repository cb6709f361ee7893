//! The `mlx` command against mlx-lm 0.32.2's own command-line tools (goldens from
//! `cargo xtask goldens cli`, which runs `python -m mlx_lm generate|chat|cache_prompt` on the
//! tiny seeded models of mlx-models/tests/models with a tiny word-level tokenizer):
//! seeded sampling, a scripted chat, prompt-cache files both ways, and the flags' edge cases.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use mlx_core::io::load_safetensors;
use mlx_engine::seed::{adapter_draws, construction_draws};
use mlx_models::load::{load_model_dir_with_params, LoadOptions};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `mlx` from the workspace root (the goldens' model paths are relative to it).
fn mlx(args: &[&str], stdin: Option<&[u8]>) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mlx"))
        .args(args)
        .current_dir(root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run mlx");
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(stdin.unwrap_or_default())
        .expect("write stdin");
    drop(input);
    let out = child.wait_with_output().expect("wait mlx");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn golden() -> Value {
    let p = root().join("mlx-cli/tests/goldens/cli.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// The reply and the "Generation: N tokens" count of `generate`'s verbose output (parsed as
/// the golden script parses mlx-lm's).
fn parse_verbose(out: &str) -> (String, Option<u64>) {
    let body = out
        .strip_prefix("==========\n")
        .unwrap_or_else(|| panic!("no opening rule: {out:?}"));
    let end = body
        .find("\n==========\n")
        .unwrap_or_else(|| panic!("no closing rule: {out:?}"));
    let gen = out
        .lines()
        .find_map(|l| l.strip_prefix("Generation: "))
        .and_then(|l| l.split(' ').next())
        .map(|n| n.parse().unwrap());
    (body[..end].to_string(), gen)
}

fn check_generate(case: &Value, extra: &[&str]) {
    let name = case["name"].as_str().unwrap();
    let mut args = vec!["generate".to_string()];
    args.extend(strings(&case["args"]));
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out, err) = mlx(&args, None);
    assert_eq!(code, 0, "{name}: {err}");
    let (text, gen) = parse_verbose(&out);
    assert_eq!(text, case["text"].as_str().unwrap(), "{name}: text");
    assert_eq!(
        gen,
        case["generation_tokens"].as_u64(),
        "{name}: generation tokens"
    );
}

#[test]
fn seeded_sampling_matches_mlx_lm_generate() {
    let g = golden();
    let cases = g["generate"].as_array().unwrap();
    assert!(cases.len() >= 6);
    for case in cases {
        check_generate(case, &["--dtype", "stored"]);
    }
}

/// `--seed` replays the draws building the model takes in mlx-lm: the count computed from
/// each tiny fixture's module tree (and its adapters) equals the number of splits of the global
/// key mlx-lm's `load_model` (+ `load_adapters`) takes for it. Also: each model says whether
/// mlx-lm's class defines `make_cache` as mlx-lm does (what `--max-kv-size` depends on).
#[test]
fn construction_draws_match_mlx_lm_for_every_fixture() {
    let g = golden();
    let sd = &g["seed_draws"];
    let load = |dir: &str| {
        load_model_dir_with_params(&root().join(dir), &LoadOptions::default())
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
    };
    let mut wrong = Vec::new();
    let models = sd["models"].as_object().unwrap();
    assert!(models.len() >= 90, "{}", models.len());
    for (dir, want) in models {
        let (model, config, params) = load(dir);
        let got = construction_draws(&config, &params);
        if got as u64 != want.as_u64().unwrap() {
            wrong.push(format!("{dir}: {got} draws, mlx-lm {want}"));
        }
        // `--max-kv-size` picks rotating caches only where mlx-lm's class has no make_cache.
        let makes = g["defines_make_cache"][dir.as_str()].as_bool().unwrap();
        if model.defines_make_cache() != makes {
            wrong.push(format!(
                "{dir}: defines_make_cache {}, mlx-lm {makes}",
                !makes
            ));
        }
    }
    let adapters = sd["adapters"].as_array().unwrap();
    assert!(!adapters.is_empty());
    for case in adapters {
        let (dir, adapter) = (
            case["model"].as_str().unwrap(),
            case["adapter"].as_str().unwrap(),
        );
        let (mut model, config, params) = load(dir);
        let lora = mlx_train::adapters::load_adapters(model.as_mut(), &root().join(adapter))
            .unwrap_or_else(|e| panic!("{adapter}: {e}"));
        let names = lora.names();
        let got =
            construction_draws(&config, &params) + adapter_draws(names.iter().map(String::as_str));
        if got as u64 != case["draws"].as_u64().unwrap() {
            wrong.push(format!(
                "{dir} + {adapter}: {got} draws, mlx-lm {}",
                case["draws"]
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn a_scripted_chat_matches_mlx_lm_chat() {
    for case in golden()["chat"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let mut args = vec!["chat".to_string()];
        args.extend(strings(&case["args"]));
        args.extend(["--dtype", "stored", "--json"].map(String::from));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let stdin = strings(&case["lines"]).join("\n") + "\n";
        let (code, out, err) = mlx(&args, Some(stdin.as_bytes()));
        assert_eq!(code, 0, "{name}: {err}");
        let got: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{name}: {e}: {l}")))
            .collect();
        let want = case["turns"].as_array().unwrap();
        assert_eq!(got.len(), want.len(), "{name}: turns\n{out}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(g["text"], w["text"], "{name}: turn {i} text");
            assert_eq!(
                g["generation_tokens"], w["generation_tokens"],
                "{name}: turn {i} tokens"
            );
        }
    }
}

/// Every tensor and every metadata entry of two safetensors files, compared bit for bit.
fn same_file(a: &Path, b: &Path) -> Result<(), String> {
    let (ta, ma) = load_safetensors(a, None).map_err(|e| e.to_string())?;
    let (tb, mb) = load_safetensors(b, None).map_err(|e| e.to_string())?;
    if ma != mb {
        return Err(format!("metadata differs:\n{ma:?}\n{mb:?}"));
    }
    let ka: Vec<_> = ta.keys().collect();
    let kb: Vec<_> = tb.keys().collect();
    if ka != kb {
        return Err(format!("tensor names differ: {ka:?} vs {kb:?}"));
    }
    for (k, x) in &ta {
        let y = &tb[k];
        if x.dtype() != y.dtype() || x.shape() != y.shape() {
            return Err(format!(
                "{k}: {:?}{:?} vs {:?}{:?}",
                x.dtype(),
                x.shape(),
                y.dtype(),
                y.shape()
            ));
        }
        let bits = |a: &mlx_core::Array| -> Vec<u8> {
            a.astype(mlx_core::Dtype::Float32)
                .and_then(|a| a.to_vec::<f32>())
                .map(|v| v.iter().flat_map(|f| f.to_bits().to_le_bytes()).collect())
                .unwrap_or_default()
        };
        if bits(x) != bits(y) {
            return Err(format!("{k}: values differ"));
        }
    }
    Ok(())
}

#[test]
fn prompt_cache_files_interoperate_with_mlx_lm() {
    let tmp = std::env::temp_dir().join(format!("mlx-cli-cache-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    for case in golden()["cache"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        // mlx-lm's file, continued here.
        check_generate(case, &["--dtype", "stored"]);
        // Our file equals mlx-lm's, tensors and metadata.
        let ours = tmp.join(format!("{name}.safetensors"));
        let (code, out, err) = mlx(
            &[
                "cache-prompt",
                "--dtype",
                "stored",
                "--model",
                case["model"].as_str().unwrap(),
                "--prompt",
                case["cached_prompt"].as_str().unwrap(),
                "--prompt-cache-file",
                ours.to_str().unwrap(),
            ],
            None,
        );
        assert_eq!(code, 0, "{name}: {err}");
        // mlx_lm.cache_prompt's summary lines, as scripts read them.
        let peak = out.lines().find_map(|l| l.strip_prefix("Peak memory: "));
        assert!(
            peak.and_then(|p| p.strip_suffix(" GB"))
                .and_then(|v| v.split_once('.'))
                .is_some_and(|(i, f)| i.parse::<u64>().is_ok() && f.len() == 3),
            "{name}: no `Peak memory: X.XXX GB` line: {out}"
        );
        assert!(out.lines().any(|l| l == "Saving..."), "{name}: {out}");
        let theirs = root().join(case["file"].as_str().unwrap());
        if let Err(e) = same_file(&ours, &theirs) {
            panic!("{name}: our prompt-cache file differs from mlx_lm.cache_prompt's: {e}");
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// `cargo xtask goldens cache_eos`: `mlx_lm.cache_prompt --eos-token WORD` and its
/// continuation.
fn eos_golden() -> Value {
    let p = root().join("mlx-cli/tests/goldens/cache_eos.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// A prompt-cache file's user metadata entry `key` (mlx-lm's `metadata[key]`).
fn cache_metadata(path: &Path, key: &str) -> Option<String> {
    let (_, metadata) = mlx_cache::load_prompt_cache(path).unwrap();
    metadata.get(key).cloned()
}

/// `mlx cache-prompt --eos-token WORD` writes mlx_lm.cache_prompt's file (tensors and
/// metadata: `{"trust_remote_code": false, "eos_token": WORD}`), and `mlx generate
/// --prompt-cache-file` on mlx-lm's file (or ours) stops at WORD as mlx_lm.generate does;
/// `--trust-remote-code` is recorded as mlx-lm records it.
#[test]
fn cache_prompt_eos_token_matches_mlx_lm() {
    let g = eos_golden();
    let tmp = std::env::temp_dir().join(format!("mlx-cli-cache-eos-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let ours = tmp.join("eos.safetensors");
    let mut args = vec![
        "cache-prompt".to_string(),
        "--dtype".into(),
        "stored".into(),
    ];
    args.extend(strings(&g["cache_prompt_args"]));
    let file = args.len() - 1;
    args[file] = ours.to_str().unwrap().into();
    let (code, _, err) = mlx(&args.iter().map(String::as_str).collect::<Vec<_>>(), None);
    assert_eq!(code, 0, "{err}");
    let theirs = root().join(g["file"].as_str().unwrap());
    if let Err(e) = same_file(&ours, &theirs) {
        panic!("our --eos-token prompt-cache file differs from mlx_lm.cache_prompt's: {e}");
    }
    assert_eq!(
        cache_metadata(&ours, "tokenizer_config").as_deref(),
        g["tokenizer_config"].as_str()
    );
    // mlx-lm's file continued here stops at the EOS word, as in mlx-lm; ours too.
    assert!(!g["plain"]["text"]
        .as_str()
        .unwrap()
        .ends_with(g["text"].as_str().unwrap()));
    let mut case = g.clone();
    case["name"] = "cache_eos".into();
    check_generate(&case, &["--dtype", "stored"]);
    let mut args = strings(&g["args"]);
    let at = args
        .iter()
        .position(|a| a == "--prompt-cache-file")
        .unwrap()
        + 1;
    args[at] = ours.to_str().unwrap().into();
    case["args"] = args.into();
    check_generate(&case, &["--dtype", "stored"]);

    // --trust-remote-code: `true` in the metadata, as mlx-lm writes it.
    let trusted = tmp.join("trusted.safetensors");
    let mut args = vec![
        "cache-prompt".to_string(),
        "--dtype".into(),
        "stored".into(),
    ];
    args.extend(strings(&g["trust_remote_code"]["cache_prompt_args"]));
    args.extend([
        "--prompt-cache-file".into(),
        trusted.to_str().unwrap().into(),
    ]);
    let (code, _, err) = mlx(&args.iter().map(String::as_str).collect::<Vec<_>>(), None);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        cache_metadata(&trusted, "tokenizer_config").as_deref(),
        g["trust_remote_code"]["tokenizer_config"].as_str()
    );
    // Without the flags: mlx-lm's `{"trust_remote_code": false}`.
    let plain = tmp.join("plain.safetensors");
    let cache_hello = |extra: &[&str]| {
        let mut args = vec!["cache-prompt", "--model", g["model"].as_str().unwrap()];
        args.extend(["--prompt", "hello"]);
        args.extend(extra);
        args.extend(["--prompt-cache-file", plain.to_str().unwrap()]);
        mlx(&args, None)
    };
    let (code, _, err) = cache_hello(&[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        cache_metadata(&plain, "tokenizer_config").as_deref(),
        Some(r#"{"trust_remote_code": false}"#)
    );
    // An empty token is refused before anything loads.
    let (code, _, err) = cache_hello(&["--eos-token", ""]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--eos-token"), "{err}");
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A prompt-cache file whose `tokenizer_config` metadata is not a JSON object is an error
/// naming the file and the entry (not a panic); one without the entry (older tools) continues
/// with the model's own tokenizer config.
#[test]
fn prompt_cache_tokenizer_config_metadata_is_checked() {
    let g = eos_golden();
    let tmp = std::env::temp_dir().join(format!("mlx-cli-cache-tc-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let (arrays, metadata) =
        load_safetensors(root().join(g["file"].as_str().unwrap()), None).unwrap();
    // mlx-lm's metadata entries are saved under the index of their place in the file (`0.`).
    let key = "0.tokenizer_config";
    assert!(metadata.contains_key(key), "{metadata:?}");
    let rewrite = |name: &str, value: Option<&str>| -> PathBuf {
        let mut m = metadata.clone();
        match value {
            Some(v) => m.insert(key.into(), v.into()),
            None => m.remove(key),
        };
        let path = tmp.join(name);
        mlx_core::io::save_safetensors(&path, arrays.iter().map(|(k, a)| (k.as_str(), a)), &m)
            .unwrap();
        path
    };
    let generate = |path: &Path| {
        let mut args = strings(&g["args"]);
        let at = args
            .iter()
            .position(|a| a == "--prompt-cache-file")
            .unwrap()
            + 1;
        args[at] = path.to_str().unwrap().into();
        args.insert(0, "generate".into());
        args.extend(["--dtype".into(), "stored".into()]);
        mlx(&args.iter().map(String::as_str).collect::<Vec<_>>(), None)
    };
    for (name, value, what) in [
        (
            "not_json.safetensors",
            "{trust_remote_code: false",
            "not valid JSON",
        ),
        (
            "not_object.safetensors",
            r#"["eos_token", "tell"]"#,
            "not a JSON object",
        ),
        // An object whose entry the tokenizer refuses: the tokenizer's error, with the file
        // the entry came from.
        (
            "bad_entry.safetensors",
            r#"{"chat_template": 7}"#,
            "chat_template",
        ),
    ] {
        let path = rewrite(name, Some(value));
        let (code, out, err) = generate(&path);
        assert_eq!(code, 1, "{name}: {out}{err}");
        assert!(
            err.contains(path.to_str().unwrap()) && err.contains("`tokenizer_config`"),
            "{name}: {err}"
        );
        assert!(err.contains(what), "{name}: {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
    }
    // No entry: `{}`, the model's own EOS: mlx-lm's plain continuation.
    let path = rewrite("no_entry.safetensors", None);
    let (code, out, err) = generate(&path);
    assert_eq!(code, 0, "{err}");
    assert_eq!(parse_verbose(&out).0, g["plain"]["text"].as_str().unwrap());
    let _ = std::fs::remove_dir_all(&tmp);
}

fn greedy_case() -> Value {
    golden()["generate"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "greedy_no_seed")
        .unwrap()
        .clone()
}

const MODEL: &str = "mlx-cli/tests/models/q4_g32";

#[test]
fn max_tokens_minus_one_stdin_prompt_and_stream_endings() {
    let case = greedy_case();
    // mlx-lm's greedy run stops on EOS after two words: -1 (no limit) gives the same.
    check_generate(&case, &["--dtype", "stored", "-m", "-1"]);
    // `--prompt -` reads all of stdin, not one line.
    let prompt = "hello , what is\nthe big red sun ?";
    let (code, out, err) = mlx(
        &["generate", "--model", MODEL, "--dtype", "stored", "-p", "-"],
        Some(prompt.as_bytes()),
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(parse_verbose(&out).0, case["text"].as_str().unwrap());
    // The last response: EOS counted in generation_tokens, finish_reason stop ...
    let json = |extra: &[&str]| -> Value {
        let mut args = vec!["generate", "--model", MODEL, "--dtype", "stored", "--json"];
        args.extend(["--prompt", "hello , what is the big red sun ?"]);
        args.extend(extra);
        let (code, out, err) = mlx(&args, None);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str(out.trim()).unwrap()
    };
    let v = json(&[]);
    assert_eq!(v["finish_reason"], "stop");
    assert_eq!(v["generation_tokens"], case["generation_tokens"]);
    assert_eq!(
        v["tokens"].as_array().unwrap().len() as u64 + 1,
        case["generation_tokens"].as_u64().unwrap()
    );
    // ... and `length` on the max-th token.
    let v = json(&["-m", "1"]);
    assert_eq!(v["finish_reason"], "length");
    assert_eq!(v["generation_tokens"], 1);
    assert_eq!(v["tokens"].as_array().unwrap().len(), 1);
    // An extra EOS token that is the first word: nothing generated, said as mlx-lm says it.
    let first = case["text"].as_str().unwrap().split(' ').next().unwrap();
    let (code, out, err) = mlx(
        &[
            "generate",
            "--model",
            MODEL,
            "--dtype",
            "stored",
            "--prompt",
            "hello , what is the big red sun ?",
            "--extra-eos-token",
            first,
        ],
        None,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "==========\n\n==========\nNo text generated for this prompt\n"
    );
    // --verbose false: the reply only.
    let (code, out, _) = mlx(
        &[
            "generate",
            "--model",
            MODEL,
            "--dtype",
            "stored",
            "--prompt",
            "hello , what is the big red sun ?",
            "--verbose",
            "F",
        ],
        None,
    );
    assert_eq!(code, 0);
    assert_eq!(out, format!("{}\n", case["text"].as_str().unwrap()));
}

#[test]
fn bad_flags_are_clear_errors() {
    let (code, _, err) = mlx(&["generate", "--model", MODEL, "-m", "0"], None);
    assert_eq!(code, 1);
    assert!(
        err.contains("Maximum number of tokens must be non-zero"),
        "{err}"
    );
    let (code, _, err) = mlx(
        &[
            "generate",
            "--model",
            MODEL,
            "--chat-template-config",
            "[1]",
        ],
        None,
    );
    assert_eq!(code, 1);
    assert!(err.contains("--chat-template-config"), "{err}");
    let (code, _, err) = mlx(&["generate", "--kv-bits", "9"], None);
    assert_eq!(code, 2);
    assert!(err.contains("--kv-bits"), "{err}");
    let (code, _, err) = mlx(
        &[
            "generate",
            "--model",
            "mlx-cli/tests/models/dense_f32",
            "--prompt-cache-file",
            "mlx-cli/tests/goldens/prompt_cache_cache_q4.safetensors",
        ],
        None,
    );
    assert_eq!(code, 1);
    assert!(err.contains("different model"), "{err}");
}

#[cfg(unix)]
#[test]
fn non_utf8_arguments_are_a_clear_error() {
    use std::os::unix::ffi::OsStrExt;
    let bad = std::ffi::OsStr::from_bytes(b"caf\xe9");
    let out = Command::new(env!("CARGO_BIN_EXE_mlx"))
        .args([
            std::ffi::OsStr::new("generate"),
            std::ffi::OsStr::new("--prompt"),
            bad,
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("argument 3") && err.contains("not valid UTF-8"),
        "{err}"
    );
}

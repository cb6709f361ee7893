//! The one loader (`mlx_engine::load`) behind every command: `mlx serve --adapter-path` answers
//! what `mlx generate --adapter-path` prints on the same adapter, and `mlx info`, `mlx train`
//! (then `mlx generate --adapter-path` on what it trained) and `mlx perplexity` take a `.gguf`
//! file; `mlx fuse` on one is a clear error naming what to do instead.

use crate::support;
use support::mlx;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mlx_cli_loader_{name}_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// One non-streaming POST to a server on loopback; the reply's JSON body.
fn post(addr: &str, path: &str, body: &Value) -> Value {
    let body = body.to_string();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{raw}");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {raw}"))
}

/// `mlx serve --model M --adapter-path A` on an ephemeral port: the completion of `prompt`
/// (greedy, `max_tokens`).
fn serve_completion(model: &str, adapter: Option<&str>, prompt: &str, max_tokens: u32) -> String {
    let mut args = vec!["serve", "--model", model, "--port", "0", "--decoder", "mlx"];
    if let Some(a) = adapter {
        args.extend(["--adapter-path", a]);
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_mlx"))
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run mlx serve");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let addr = loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            let _ = child.kill();
            panic!("mlx serve exited before listening: {seen}");
        }
        seen.push_str(&line);
        if let Some(a) = line.trim().strip_prefix("mlx serve: listening on http://") {
            break a.to_string();
        }
    };
    let reply = post(
        &addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}),
    );
    let _ = child.kill();
    let _ = child.wait();
    reply["choices"][0]["text"].as_str().unwrap().to_string()
}

#[test]
fn serve_applies_adapters_as_generate_does() {
    let ws = workspace();
    let model = ws.join("mlx-train/tests/models/dense");
    let adapter = ws.join("mlx-train/tests/adapters/dense_text_adam");
    let (model, adapter) = (model.to_str().unwrap(), adapter.to_str().unwrap());
    let prompt = "the red fish";
    let generate = |adapter: Option<&str>| {
        let mut args = vec![
            "generate",
            "--model",
            model,
            "--prompt",
            prompt,
            "--no-chat-template",
            "--max-tokens",
            "8",
            "--decoder",
            "mlx",
            "--json",
        ];
        if let Some(a) = adapter {
            args.extend(["--adapter-path", a]);
        }
        let (code, out, err) = mlx(&args);
        assert_eq!(code, 0, "{err}");
        let v: Value = serde_json::from_str(out.trim()).unwrap();
        v["text"].as_str().unwrap().to_string()
    };
    let adapted = generate(Some(adapter));
    let base = generate(None);
    assert_ne!(adapted, base, "the adapter changes this reply");
    assert_eq!(serve_completion(model, Some(adapter), prompt, 8), adapted);
    assert_eq!(serve_completion(model, None, prompt, 8), base);
    // A missing adapter directory is refused before the model loads.
    let (code, _, err) = mlx(&["serve", "--model", model, "--adapter-path", "/no/such/dir"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("--adapter-path") && err.contains("not a directory"),
        "{err}"
    );
}

#[test]
fn info_reads_a_gguf_file() {
    let gguf = workspace().join("mlx-models/tests/models/gguf/qwen2.gguf");
    let (code, out, err) = mlx(&["info", "--model", gguf.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["model_type"], "qwen2");
    assert!(v["parameters"].as_u64().unwrap() > 0, "{v}");
    // A GGUF's quantization is per tensor: its GGML types are counted, not "none".
    let types = v["gguf_types"].as_object().expect("gguf_types");
    let counted: u64 = types.values().map(|n| n.as_u64().unwrap()).sum();
    assert!(counted > 0, "{v}");
    let (code, out, err) = mlx(&["info", "--model", gguf.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("model_type: qwen2"), "{out}");
    assert!(out.contains("quantization: GGUF types "), "{out}");
}

/// The tiny qwen2 GGUF fixture with a byte-level BPE tokenizer in its metadata (one token per
/// letter, `Ġ` for the space, no merges): a complete GGUF model the training data can use.
fn gguf_with_tokenizer(dir: &Path) -> PathBuf {
    use mlx_core::io::{load_gguf, save_gguf, GgufValue};
    use mlx_core::Array;
    let src = workspace().join("mlx-models/tests/models/gguf/qwen2.gguf");
    let (tensors, mut meta) = load_gguf(&src, None).unwrap();
    let mut tokens: Vec<String> = vec!["<s>".into(), "</s>".into(), "Ġ".into()];
    tokens.extend(('a'..='z').map(String::from));
    while tokens.len() < 96 {
        tokens.push(format!("<unused{}>", tokens.len()));
    }
    let mut types = vec![1i32; tokens.len()];
    types[0] = 3;
    types[1] = 3;
    let id = |v: u32| GgufValue::Array(Array::from_slice(&[v], &[]).unwrap());
    meta.insert("tokenizer.ggml.model", GgufValue::String("gpt2".into()));
    meta.insert("tokenizer.ggml.pre", GgufValue::String("default".into()));
    meta.insert("tokenizer.ggml.tokens", GgufValue::Strings(tokens));
    meta.insert("tokenizer.ggml.merges", GgufValue::Strings(vec![]));
    meta.insert(
        "tokenizer.ggml.token_type",
        GgufValue::Array(Array::from_slice(&types, &[96]).unwrap()),
    );
    meta.insert("tokenizer.ggml.bos_token_id", id(0));
    meta.insert("tokenizer.ggml.eos_token_id", id(1));
    let path = dir.join("tiny.gguf");
    save_gguf(&path, tensors.iter().map(|(k, v)| (k.as_str(), v)), &meta).unwrap();
    path
}

#[test]
fn train_generate_and_fuse_on_a_gguf_file() {
    let dir = tmp("gguf");
    let gguf = gguf_with_tokenizer(&dir);
    let gguf = gguf.to_str().unwrap();
    let adapters = dir.join("adapters");
    let data = workspace().join("mlx-train/tests/data/text");
    let (code, out, err) = mlx(&[
        "train",
        "--model",
        gguf,
        "--train",
        "--data",
        data.to_str().unwrap(),
        "--iters",
        "2",
        "--batch-size",
        "2",
        "--val-batches",
        "1",
        "--num-layers",
        "1",
        "--adapter-path",
        adapters.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(adapters.join("adapters.safetensors").is_file(), "{out}");
    let (code, out, err) = mlx(&[
        "generate",
        "--model",
        gguf,
        "--adapter-path",
        adapters.to_str().unwrap(),
        "--prompt",
        "the red fish",
        "--no-chat-template",
        "--max-tokens",
        "3",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert!(!v["prompt_ids"].as_array().unwrap().is_empty(), "{v}");
    // Fusing writes a safetensors directory, which a GGUF base cannot give: a clear error.
    let (code, _, err) = mlx(&[
        "fuse",
        "--model",
        gguf,
        "--adapter-path",
        adapters.to_str().unwrap(),
        "--save-path",
        dir.join("fused").to_str().unwrap(),
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains("GGUF")
            && err.contains("HF-style directory")
            && err.contains("--adapter-path"),
        "{err}"
    );
    assert!(!dir.join("fused").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn perplexity_reads_a_gguf_file() {
    let dir = tmp("ppl");
    let gguf = gguf_with_tokenizer(&dir);
    let data = workspace().join("mlx-train/tests/data/text");
    let (code, out, err) = mlx(&[
        "perplexity",
        "--model",
        gguf.to_str().unwrap(),
        "--data-path",
        data.to_str().unwrap(),
        "--sequence-length",
        "8",
        "--num-samples",
        "2",
        "--batch-size",
        "2",
        "--json",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let v: Value = out
        .lines()
        .find(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .unwrap_or_else(|| panic!("no JSON line: {out}"));
    let ppl = v["perplexity"].as_f64().unwrap();
    assert!(ppl.is_finite() && ppl > 1.0, "{v}");
    assert_eq!(v["samples"], 2, "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `mlx cache-prompt --eos-token` on a `.gguf` file: its tokenizer (built from the metadata)
/// takes the token as its EOS, and `mlx generate --prompt-cache-file` stops at it.
#[test]
fn cache_prompt_eos_token_on_a_gguf_file() {
    let dir = tmp("cache_eos");
    let gguf = gguf_with_tokenizer(&dir);
    let file = dir.join("cache.safetensors");
    let tokens = |eos: Option<&str>| -> Vec<u64> {
        let mut args = vec!["cache-prompt", "--model", gguf.to_str().unwrap()];
        args.extend(["--prompt", "hello world", "--prompt-cache-file"]);
        args.push(file.to_str().unwrap());
        if let Some(t) = eos {
            args.extend(["--eos-token", t]);
        }
        let (code, out, err) = mlx(&args);
        assert_eq!(code, 0, "{out}\n{err}");
        let (code, out, err) = mlx(&[
            "generate",
            "--prompt-cache-file",
            file.to_str().unwrap(),
            "--prompt",
            "the",
            "--max-tokens",
            "8",
            "--json",
        ]);
        assert_eq!(code, 0, "{out}\n{err}");
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        v["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect()
    };
    let plain = tokens(None);
    assert_eq!(plain.len(), 8, "{plain:?}");
    // The first id after the first that was not generated before it; its spelling in the
    // fixture.
    let at = (1..plain.len())
        .find(|&i| !plain[..i].contains(&plain[i]))
        .unwrap_or_else(|| panic!("no second id: {plain:?}"));
    let name = match plain[at] {
        0 => "<s>".to_string(),
        1 => "</s>".to_string(),
        2 => "Ġ".to_string(),
        n @ 3..=28 => char::from(b'a' + (n - 3) as u8).to_string(),
        n => format!("<unused{n}>"),
    };
    assert_eq!(tokens(Some(&name)), plain[..at], "--eos-token {name}");
    let _ = std::fs::remove_dir_all(&dir);
}

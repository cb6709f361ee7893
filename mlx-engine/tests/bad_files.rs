//! Crafted model, vocabulary and prompt-cache files that used to load (issue #37, "Bad inputs
//! still accepted"): each is refused with the file, the field and the problem.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_cache::{load_prompt_cache, save_prompt_cache, Cache, KVCache, QuantizedKVCache};
use mlx_core::io::{load_gguf, load_safetensors, read_gguf_header, save_safetensors};
use mlx_core::prelude::*;
use mlx_models::config::ModelConfig;
use mlx_models::gguf::load_gguf_model;
use mlx_models::load::LoadOptions;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mlx-bad-files-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mlx-models/tests/models")
}

/// `bytes` with the 4-byte value of the first FLOAT32 metadata entry whose key ends with
/// `key` replaced by `value`.
fn with_f32(bytes: &[u8], key: &str, value: f32) -> Vec<u8> {
    let at = bytes
        .windows(key.len())
        .position(|w| w == key.as_bytes())
        .unwrap_or_else(|| panic!("no {key}"))
        + key.len();
    assert_eq!(
        &bytes[at..at + 4],
        &6u32.to_le_bytes(),
        "{key} is not FLOAT32"
    );
    let mut out = bytes.to_vec();
    out[at + 4..at + 8].copy_from_slice(&value.to_le_bytes());
    out
}

fn load_err(path: &Path) -> String {
    match load_gguf_model(path, &LoadOptions::default()) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

/// A GGUF whose `rope.freq_base` was NaN loaded (serde_json turned the NaN into null, and the
/// default base replaced it); infinite, zero and negative bases, epsilons and soft-caps are
/// refused as well.
#[test]
fn gguf_float_hyper_parameters_must_be_finite_and_in_range() {
    let qwen3 = std::fs::read(models().join("gguf/qwen3.gguf")).unwrap();
    for v in [f32::NAN, f32::INFINITY, 0.0, -10000.0] {
        let p = tmp("rope.gguf");
        std::fs::write(&p, with_f32(&qwen3, "rope.freq_base", v)).unwrap();
        let e = load_err(&p);
        assert!(
            e.contains("rope.gguf") && e.contains("`qwen3.rope.freq_base`") && e.contains("> 0"),
            "{v}: {e}"
        );
    }
    for v in [f32::NAN, -1e-6] {
        let p = tmp("eps.gguf");
        std::fs::write(&p, with_f32(&qwen3, "attention.layer_norm_rms_epsilon", v)).unwrap();
        let e = load_err(&p);
        assert!(
            e.contains("`qwen3.attention.layer_norm_rms_epsilon`") && e.contains(">= 0"),
            "{v}: {e}"
        );
    }
    let gemma2 = std::fs::read(models().join("gguf/gemma2.gguf")).unwrap();
    for v in [f32::NAN, 0.0] {
        let p = tmp("softcap.gguf");
        std::fs::write(&p, with_f32(&gemma2, "softcapping", v)).unwrap();
        let e = load_err(&p);
        assert!(e.contains("softcapping`") && e.contains("> 0"), "{v}: {e}");
    }
    // The files as written load.
    let p = tmp("ok.gguf");
    std::fs::write(&p, &qwen3).unwrap();
    load_gguf_model(&p, &LoadOptions::default()).unwrap();
}

/// `config.json` cannot hold a NaN, but a zero, negative or past-`f32` rope base, epsilon,
/// scaling factor or soft-cap is as meaningless.
#[test]
fn config_float_hyper_parameters_must_be_in_range() {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny_chat/config.json");
    let good: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&fixture).unwrap()).unwrap();
    ModelConfig::from_value(good.clone()).unwrap();
    for (field, value, shown) in [
        ("rope_theta", serde_json::json!(0.0), "`rope_theta` is 0"),
        (
            "rope_theta",
            serde_json::json!(-10000),
            "`rope_theta` is -10000",
        ),
        ("rope_theta", serde_json::json!(1e39), "`rope_theta` is 1"),
        (
            "rms_norm_eps",
            serde_json::json!(-1e-5),
            "`rms_norm_eps` is -0.00001",
        ),
        (
            "final_logit_softcapping",
            serde_json::json!(0),
            "`final_logit_softcapping` is 0",
        ),
        (
            "rope_scaling",
            serde_json::json!({"type": "linear", "factor": 0.0}),
            "`rope_scaling.factor` is 0",
        ),
    ] {
        let mut c = good.clone();
        c[field] = value;
        let p = tmp("config.json");
        std::fs::write(&p, serde_json::to_vec(&c).unwrap()).unwrap();
        let e = ModelConfig::from_file(&p).unwrap_err().to_string();
        assert!(
            e.contains("config.json") && e.contains(shown),
            "{field}: {e}"
        );
    }
    // A null soft-cap means none (Gemma 2's configs).
    let mut c = good;
    c["final_logit_softcapping"] = serde_json::Value::Null;
    ModelConfig::from_value(c).unwrap();
}

/// A GGUF holding only `tokenizer.ggml.tokens` (strings as given, raw bytes allowed) and one
/// f32 tensor.
fn vocab_gguf(tokens: &[&[u8]]) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(1u64.to_le_bytes()); // tensors
    out.extend(1u64.to_le_bytes()); // metadata entries
    let key = b"tokenizer.ggml.tokens";
    out.extend((key.len() as u64).to_le_bytes());
    out.extend(key);
    out.extend(9u32.to_le_bytes()); // ARRAY
    out.extend(8u32.to_le_bytes()); // of STRING
    out.extend((tokens.len() as u64).to_le_bytes());
    for t in tokens {
        out.extend((t.len() as u64).to_le_bytes());
        out.extend(*t);
    }
    out.extend(1u64.to_le_bytes());
    out.push(b't');
    out.extend(1u32.to_le_bytes()); // dims
    out.extend(4u64.to_le_bytes());
    out.extend(0u32.to_le_bytes()); // F32
    out.extend(0u64.to_le_bytes()); // offset
    while out.len() % 32 != 0 {
        out.push(0);
    }
    out.extend([0u8; 16]);
    out
}

/// A vocabulary token that is not UTF-8 was turned into U+FFFD (two such tokens became one
/// string); it is refused with its index. SentencePiece's byte tokens (`<0x0A>`) are text.
#[test]
fn gguf_vocabulary_tokens_must_be_utf8() {
    let p = tmp("vocab.gguf");
    std::fs::write(&p, vocab_gguf(&[b"a", b"<0x0A>", "é".as_bytes()])).unwrap();
    let (_, meta) = load_gguf(&p, None).unwrap();
    assert_eq!(meta.get_strings("tokenizer.ggml.tokens").unwrap()[2], "é");
    read_gguf_header(&p).unwrap();

    for bad in [&b"\xff\xfe"[..], b"ab\xc3", b"\xe2\x82"] {
        std::fs::write(&p, vocab_gguf(&[b"a", b"<0x0A>", bad, b"b"])).unwrap();
        for e in [
            load_gguf(&p, None).unwrap_err().to_string(),
            read_gguf_header(&p).unwrap_err().to_string(),
        ] {
            assert!(
                e.contains("vocab.gguf")
                    && e.contains("\"tokenizer.ggml.tokens\", entry 2,")
                    && e.contains("not valid UTF-8"),
                "{bad:?}: {e}"
            );
        }
    }
}

fn kv(t: i32, dim: i32) -> Array {
    let data: Vec<f32> = (0..2 * t * dim).map(|i| i as f32 * 0.25).collect();
    Array::from_slice(&data, &[1, 2, t, dim]).unwrap()
}

/// `path` rewritten with `key`'s array cast to `dtype`.
fn relabel(path: &Path, key: &str, dtype: Dtype, name: &str) -> PathBuf {
    let (mut arrays, meta) = load_safetensors(path, None).unwrap();
    let a = arrays[key].astype(dtype).unwrap();
    arrays.insert(key.into(), a);
    let out = tmp(name);
    save_safetensors(&out, arrays.iter().map(|(k, a)| (k.as_str(), a)), &meta).unwrap();
    out
}

fn cache_err(path: &Path) -> String {
    match load_prompt_cache(path) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

/// A prompt cache whose keys were stored as int32 loaded and went to attention; it is refused
/// naming the file, the layer's tensor and the dtype expected. Quantized caches' packed data,
/// scales and biases are checked alike, and keys and values must share a dtype.
#[test]
fn prompt_cache_tensors_relabelled_to_another_dtype_are_refused() {
    let mut c = KVCache::new();
    c.update_and_fetch(&kv(3, 32), &kv(3, 32)).unwrap();
    let caches: Vec<Box<dyn Cache>> = vec![Box::new(c)];
    let good = tmp("kv.safetensors");
    save_prompt_cache(&good, &caches, &BTreeMap::new()).unwrap();
    load_prompt_cache(&good).unwrap();
    // State: keys (0.0), values (0.1), offset.
    let e = cache_err(&relabel(&good, "0.0", Dtype::Int32, "kv_int.safetensors"));
    assert!(
        e.contains("kv_int.safetensors")
            && e.contains("layer 0 (KVCache)")
            && e.contains("keys are int32; expected a floating-point dtype"),
        "{e}"
    );
    let e = cache_err(&relabel(
        &good,
        "0.1",
        Dtype::Float16,
        "kv_mixed.safetensors",
    ));
    assert!(e.contains("keys are float32 but values float16"), "{e}");

    let mut q = QuantizedKVCache::new(32, 4).unwrap();
    q.update_and_fetch(&kv(3, 32), &kv(3, 32)).unwrap();
    let caches: Vec<Box<dyn Cache>> = vec![Box::new(q)];
    let good = tmp("q.safetensors");
    save_prompt_cache(&good, &caches, &BTreeMap::new()).unwrap();
    load_prompt_cache(&good).unwrap();
    // Keys: packed data (0.0.0), scales (0.0.1), biases (0.0.2).
    let e = cache_err(&relabel(
        &good,
        "0.0.1",
        Dtype::Int32,
        "q_scales.safetensors",
    ));
    assert!(
        e.contains("q_scales.safetensors")
            && e.contains("QuantizedKVCache")
            && e.contains("keys scales are int32; expected a floating-point dtype"),
        "{e}"
    );
    let e = cache_err(&relabel(
        &good,
        "0.1.0",
        Dtype::Float32,
        "q_data.safetensors",
    ));
    assert!(
        e.contains("quantized values are float32; expected uint32"),
        "{e}"
    );
}

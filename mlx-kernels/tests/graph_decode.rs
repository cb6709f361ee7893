//! The graph decoder's host side on every build: config and weight checks (all before any GPU
//! is touched), and a clean error where there is no CUDA driver. Its kernels' parity with the
//! MLX forward is checked on the GPU (`bench_generate --graph-check`, `xtask/gpu/graph.sh`).

use std::path::{Path, PathBuf};

use mlx_core::gpurt::GpuRuntime;
use mlx_core::io::{save_safetensors, StringMap};
use mlx_core::ops;
use mlx_core::{Array, Dtype};
use mlx_kernels::graph_decode::{GraphDecoder, LlamaShape};
use serde_json::json;

fn config() -> serde_json::Value {
    json!({
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 96,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": 40,
        "rope_theta": 10000.0,
        "tie_word_embeddings": true
    })
}

fn with(mut v: serde_json::Value, k: &str, x: serde_json::Value) -> serde_json::Value {
    v[k] = x;
    v
}

#[test]
fn config_is_checked_field_by_field() {
    let s = LlamaShape::from_config(&config()).unwrap();
    assert_eq!(
        (s.head_dim, s.kv_heads, s.quant, s.tied),
        (16, 2, None, true)
    );
    let q = with(
        config(),
        "quantization",
        json!({"group_size": 32, "bits": 4}),
    );
    assert_eq!(LlamaShape::from_config(&q).unwrap().quant, Some((32, 4)));
    let cases = [
        (with(config(), "model_type", json!("gemma3")), "model_type"),
        (
            with(config(), "rope_scaling", json!({"type": "llama3"})),
            "rope_scaling",
        ),
        (
            with(config(), "attention_bias", json!(true)),
            "attention_bias",
        ),
        (with(config(), "head_dim", json!(96)), "head_dim"),
        (
            with(config(), "num_key_value_heads", json!(3)),
            "num_key_value_heads",
        ),
        (with(config(), "hidden_size", json!(-4)), "hidden_size"),
        (with(config(), "vocab_size", json!("many")), "vocab_size"),
        (
            with(
                config(),
                "quantization",
                json!({"group_size": 64, "bits": 3}),
            ),
            "quantization",
        ),
        (
            with(
                config(),
                "quantization",
                json!({"group_size": 32, "bits": 4, "model.layers.0.mlp.down_proj": {"bits": 8}}),
            ),
            "quantization.model.layers.0.mlp.down_proj",
        ),
    ];
    for (cfg, field) in cases {
        let e = LlamaShape::from_config(&cfg).unwrap_err();
        assert!(e.contains(field), "{field}: {e}");
    }
    let mut missing = config();
    missing.as_object_mut().unwrap().remove("intermediate_size");
    let e = LlamaShape::from_config(&missing).unwrap_err();
    assert!(e.contains("intermediate_size is missing"), "{e}");
}

fn bf16(shape: &[i32]) -> Array {
    ops::zeros(shape, Dtype::Bfloat16, None).unwrap()
}

/// A tiny llama directory; `edit` changes the tensor list before it is written.
fn write_model(dir: &Path, edit: impl FnOnce(&mut Vec<(String, Array)>)) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), config().to_string()).unwrap();
    let mut t: Vec<(String, Array)> = vec![
        ("model.embed_tokens.weight".into(), bf16(&[40, 64])),
        ("model.norm.weight".into(), bf16(&[64])),
    ];
    for l in 0..2 {
        let p = format!("model.layers.{l}");
        for (n, shape) in [
            ("self_attn.q_proj", [64, 64]),
            ("self_attn.k_proj", [32, 64]),
            ("self_attn.v_proj", [32, 64]),
            ("self_attn.o_proj", [64, 64]),
            ("mlp.gate_proj", [96, 64]),
            ("mlp.up_proj", [96, 64]),
            ("mlp.down_proj", [64, 96]),
        ] {
            t.push((format!("{p}.{n}.weight"), bf16(&shape)));
        }
        t.push((format!("{p}.input_layernorm.weight"), bf16(&[64])));
        t.push((format!("{p}.post_attention_layernorm.weight"), bf16(&[64])));
    }
    edit(&mut t);
    save_safetensors(
        dir.join("model.safetensors"),
        t.iter().map(|(k, a)| (k.as_str(), a)),
        &StringMap::new(),
    )
    .unwrap();
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("graph-decode-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn weight_problems_are_listed_together_before_the_gpu() {
    let dir = tmp("bad");
    write_model(&dir, |t| {
        t.retain(|(k, _)| k != "model.layers.1.mlp.up_proj.weight");
        for (k, a) in t.iter_mut() {
            if k == "model.layers.0.self_attn.k_proj.weight" {
                *a = bf16(&[33, 64]);
            }
        }
        t.push(("model.layers.0.extra.weight".into(), bf16(&[2])));
    });
    let e = GraphDecoder::load(&dir, 64).unwrap_err().to_string();
    assert!(e.contains("3 tensor problem(s)"), "{e}");
    assert!(
        e.contains("missing model.layers.1.mlp.up_proj.weight"),
        "{e}"
    );
    assert!(
        e.contains("model.layers.0.self_attn.k_proj.weight: [33, 64]"),
        "{e}"
    );
    assert!(e.contains("unused model.layers.0.extra.weight"), "{e}");
    assert!(e.contains(&dir.display().to_string()), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_good_model_needs_a_gpu_and_says_so() {
    let dir = tmp("good");
    write_model(&dir, |_| {});
    assert!(GraphDecoder::load(&dir, 0).is_err());
    match GraphDecoder::load(&dir, 100) {
        Ok(d) => {
            assert!(GraphDecoder::available());
            assert_eq!(d.capacity(), 128);
        }
        Err(e) => {
            assert!(!GraphDecoder::available(), "{e}");
            let e = e.to_string();
            assert!(e.contains("[gpurt]"), "{e}");
            assert!(e.contains("CUDA driver") || e.contains("device"), "{e}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn runtime_without_a_driver_is_an_error_not_a_crash() {
    if GpuRuntime::available() {
        let rt = GpuRuntime::new(
            "extern \"C\" __global__ void k(long long x) {}",
            &[("k", 1)],
        );
        assert!(rt.is_ok(), "{rt:?}");
        let bad = GpuRuntime::new("this is not CUDA", &[]);
        assert!(bad.unwrap_err().to_string().contains("NVRTC"));
    } else {
        let e = GpuRuntime::new("", &[]).unwrap_err().to_string();
        assert!(e.contains("gpurt"), "{e}");
    }
}

/// mlx-lm-saved llama fixtures: the decoder accepts their tensors as saved (then needs a GPU),
/// and rejects what it cannot run with the field or tensor named.
#[test]
fn real_fixtures_pass_the_checks_or_are_named() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../mlx-models/tests/models");
    for name in ["dense_bf16_mha", "dense_bf16_untied", "q8_g32_bf16"] {
        match GraphDecoder::load(&root.join(name), 32) {
            Ok(_) => assert!(GraphDecoder::available()),
            Err(e) => {
                // Everything was accepted up to the GPU.
                let e = e.to_string();
                assert!(e.contains("[gpurt]"), "{name}: {e}");
                assert!(!GraphDecoder::available(), "{name}: {e}");
            }
        }
    }
    for (name, what) in [
        ("yarn_rope", "rope_scaling"),
        ("dense_f32", "float32, expected"),
        ("q4_g32", "expected"),
    ] {
        let e = GraphDecoder::load(&root.join(name), 32)
            .unwrap_err()
            .to_string();
        assert!(e.contains(what), "{name}: {e}");
    }
}

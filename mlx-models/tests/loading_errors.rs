//! Loading errors: each names what is wrong and where, never a panic.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_core::io::{load_safetensors, save_safetensors};
use mlx_core::prelude::*;
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::ModelError;

fn src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/models/dense_f32")
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mlx-models-err-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(src().join("config.json"), d.join("config.json")).unwrap();
    d
}

fn write_weights(dir: &Path, edit: impl FnOnce(&mut BTreeMap<String, Array>)) {
    let (mut w, _) = load_safetensors(src().join("model.safetensors"), None).unwrap();
    edit(&mut w);
    save_safetensors(
        dir.join("model.safetensors"),
        w.iter().map(|(k, v)| (k.as_str(), v)),
        &BTreeMap::new(),
    )
    .unwrap();
}

fn load_err(dir: &Path) -> String {
    match load_model_dir(dir, &LoadOptions::default()) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn missing_extra_and_misshaped_tensors_are_listed_together() {
    let d = scratch("weights");
    write_weights(&d, |w| {
        w.remove("model.layers.1.mlp.up_proj.weight");
        w.insert(
            "model.layers.0.extra.weight".into(),
            Array::from_slice(&[1.0f32], &[1]).unwrap(),
        );
        w.insert(
            "model.norm.weight".into(),
            Array::from_slice(&[1.0f32; 3], &[3]).unwrap(),
        );
    });
    let e = load_err(&d);
    assert!(
        e.contains("missing: model.layers.1.mlp.up_proj.weight"),
        "{e}"
    );
    assert!(e.contains("unexpected: model.layers.0.extra.weight"), "{e}");
    assert!(
        e.contains("wrong shape: model.norm.weight: shape [3], expected [64]"),
        "{e}"
    );
}

#[test]
fn unknown_model_type_names_the_supported_ones() {
    let d = scratch("type");
    write_weights(&d, |_| {});
    let cfg = std::fs::read_to_string(d.join("config.json"))
        .unwrap()
        .replace("\"llama\"", "\"not_a_model\"");
    std::fs::write(d.join("config.json"), cfg).unwrap();
    let e = load_err(&d);
    assert!(e.contains("not_a_model") && e.contains("llama"), "{e}");
}

#[test]
fn malformed_config_is_an_error() {
    let d = scratch("config");
    write_weights(&d, |_| {});
    std::fs::write(
        d.join("config.json"),
        "{\"model_type\": \"llama\", \"hidden_size\": ",
    )
    .unwrap();
    let e = load_err(&d);
    assert!(e.contains("config.json") && e.contains("JSON"), "{e}");
    std::fs::write(d.join("config.json"), "{\"model_type\": \"llama\"}").unwrap();
    let e = load_err(&d);
    assert!(e.contains("hidden_size"), "{e}");
    std::fs::write(d.join("config.json"), "[1, 2]").unwrap();
    assert!(load_err(&d).contains("object"));
}

#[test]
fn truncated_weights_file_is_an_error() {
    let d = scratch("truncated");
    let bytes = std::fs::read(src().join("model.safetensors")).unwrap();
    std::fs::write(d.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    let r = load_model_dir(&d, &LoadOptions::default()).and_then(|(m, _)| {
        m.forward(&Array::from_slice(&[1i32, 2], &[1, 2])?, None)?
            .eval()?;
        Ok(())
    });
    let e = r.expect_err("a truncated file must not load");
    assert!(!e.to_string().is_empty());
    let _: &ModelError = &e;
}

#[test]
fn missing_files_are_errors() {
    let d = scratch("nofiles");
    assert!(load_err(&d).contains("safetensors"));
    std::fs::remove_file(d.join("config.json")).unwrap();
    assert!(load_err(&d).contains("config.json"));
}

fn write_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src().join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
}

#[test]
fn a_million_layers_fail_fast_without_building_them() {
    let d = scratch("layers");
    write_weights(&d, |_| {});
    write_config(&d, |c| c["num_hidden_layers"] = 1_000_000.into());
    let e = load_err(&d);
    assert!(
        e.contains("num_hidden_layers (GGUF: <arch>.block_count) is 1000000")
            && e.contains("layers 2 to 999999 are missing"),
        "{e}"
    );
    assert!(e.len() < 1000, "{} bytes of message", e.len());
    write_config(&d, |c| c["num_hidden_layers"] = (-1).into());
    assert!(load_err(&d).contains("num_hidden_layers"));
}

#[test]
fn long_problem_lists_are_capped() {
    let d = scratch("cap");
    write_weights(&d, |w| {
        for i in 0..120 {
            w.insert(
                format!("extra.{i:03}.weight"),
                Array::from_slice(&[1.0f32], &[1]).unwrap(),
            );
        }
    });
    let e = load_err(&d);
    assert!(e.contains("unexpected: extra.000.weight"), "{e}");
    assert!(e.contains("... and 70 more"), "{e}");
    assert!(!e.contains("extra.119"), "{e}");
}

#[test]
fn quantization_parameters_are_validated() {
    let d = scratch("quant");
    write_weights(&d, |_| {});
    for (q, needle) in [
        (serde_json::json!({"group_size": 64, "bits": 7}), "bits 7"),
        (
            serde_json::json!({"group_size": 0, "bits": 4}),
            "group_size 0",
        ),
        (
            serde_json::json!({"group_size": 64, "bits": 4, "mode": "int3"}),
            "int3",
        ),
        (
            serde_json::json!({"group_size": 64, "bits": 4, "model.norm": {"group_size": 64, "bits": 9}}),
            "quantization.model.norm: bits 9",
        ),
    ] {
        write_config(&d, |c| c["quantization"] = q.clone());
        let e = load_err(&d);
        assert!(e.contains("config.json") && e.contains(needle), "{q}: {e}");
    }
}

#[test]
fn config_values_that_would_overflow_are_refused() {
    let d = scratch("overflow");
    write_weights(&d, |_| {});
    for (key, v) in [
        ("head_dim", 1_000_000_000i64),
        ("intermediate_size", 0),
        ("intermediate_size", -5),
    ] {
        write_config(&d, |c| c[key] = v.into());
        let e = load_err(&d);
        assert!(e.contains("invalid model config"), "{key}={v}: {e}");
    }
}

mod gguf {
    use super::*;
    use mlx_core::io::{save_gguf, GgufMetadata, GgufValue};
    use mlx_models::gguf::read_gguf;

    /// A llama GGUF with one Q projection of 64 rows and the given head counts.
    fn file(name: &str, heads: u32, kv_heads: u32) -> PathBuf {
        let d = scratch(name);
        let mut meta = GgufMetadata::new();
        meta.insert("general.architecture", GgufValue::String("llama".into()));
        let u = |v: u32| GgufValue::Array(Array::scalar(v).unwrap());
        meta.insert("llama.attention.head_count", u(heads));
        meta.insert("llama.attention.head_count_kv", u(kv_heads));
        meta.insert("llama.embedding_length", u(64));
        meta.insert("llama.block_count", u(1));
        meta.insert("llama.feed_forward_length", u(128));
        meta.insert("llama.vocab_size", u(128));
        meta.insert(
            "llama.attention.layer_norm_rms_epsilon",
            GgufValue::Array(Array::scalar(1e-5f32).unwrap()),
        );
        let q = ops::zeros(&[64, 64], Dtype::Float32, None).unwrap();
        let p = d.join(format!("{name}.gguf"));
        save_gguf(&p, [("blk.0.attn_q.weight", &q)], &meta).unwrap();
        p
    }

    fn err(p: &Path) -> String {
        match read_gguf(p) {
            Ok(_) => panic!("{} should not load", p.display()),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn zero_head_counts_are_errors_not_a_division_by_zero() {
        let e = err(&file("heads0", 0, 0));
        assert!(
            e.contains("llama.attention.head_count") && e.contains("heads0.gguf"),
            "{e}"
        );
        let e = err(&file("kvheads0", 4, 0));
        assert!(e.contains("llama.attention.head_count_kv"), "{e}");
    }

    /// An encoder GGUF (mmBERT's `modern-bert`) is refused by name: not a model type served.
    #[test]
    fn encoder_gguf_architectures_are_refused_by_name() {
        let p = file("mmbert", 4, 4);
        let (tensors, mut meta) = mlx_core::io::load_gguf(&p, None).unwrap();
        meta.insert(
            "general.architecture",
            GgufValue::String("modern-bert".into()),
        );
        save_gguf(&p, tensors.iter().map(|(k, v)| (k.as_str(), v)), &meta).unwrap();
        let e = err(&p);
        assert!(
            e.contains("`modern-bert`") && e.contains("mmBERT") && e.contains("not served"),
            "{e}"
        );
    }

    /// A committed GGUF fixture (`tests/models/gguf/<fixture>.gguf`) rewritten with its
    /// metadata and tensors edited.
    fn edited(
        fixture: &str,
        name: &str,
        edit_meta: impl FnOnce(&mut BTreeMap<String, GgufValue>),
        edit_tensors: impl FnOnce(&mut BTreeMap<String, Array>),
    ) -> PathBuf {
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/models/gguf")
            .join(format!("{fixture}.gguf"));
        let (mut tensors, meta) = mlx_core::io::load_gguf(&src, None).unwrap();
        let mut values = meta.into_inner();
        edit_meta(&mut values);
        edit_tensors(&mut tensors);
        let mut meta = GgufMetadata::new();
        for (k, v) in values {
            meta.insert(k, v);
        }
        let p = scratch(name).join(format!("{name}.gguf"));
        save_gguf(&p, tensors.iter().map(|(k, v)| (k.as_str(), v)), &meta).unwrap();
        p
    }

    /// The error of `fixture` rewritten as `name` with metadata `key` set to `value`.
    fn with_key(fixture: &str, name: &str, key: &str, value: GgufValue) -> String {
        err(&edited(
            fixture,
            name,
            |m| {
                m.insert(key.into(), value);
            },
            |_| {},
        ))
    }

    /// The error of `fixture` rewritten as `name` without metadata `key`.
    fn without_key(fixture: &str, name: &str, key: &str) -> String {
        err(&edited(
            fixture,
            name,
            |m| {
                m.remove(key);
            },
            |_| {},
        ))
    }

    /// BitNet's projections must be ternary values times one scale (the converter's
    /// `weight_quant`): another value, a missing projection or rope scaling mlx-lm's bitnet
    /// does not take is refused by name.
    #[test]
    fn bitnet_weights_that_are_not_ternary_are_refused_by_name() {
        let e = err(&edited(
            "bitnet",
            "bnval",
            |_| {},
            |t| {
                // Row 0 at half the scale: two magnitudes.
                let w = t["blk.1.ffn_up.weight"].clone();
                let rows = w.shape()[0];
                let mut f = vec![1.0f32; rows as usize];
                f[0] = 0.5;
                let half = Array::from_slice(&f, &[rows, 1]).unwrap();
                let w = (&w * &half).unwrap();
                t.insert("blk.1.ffn_up.weight".into(), w);
            },
        ));
        assert!(
            e.contains("blk.1.ffn_up.weight") && e.contains("not ternary") && e.contains("bnval"),
            "{e}"
        );
        let e = err(&edited(
            "bitnet",
            "bnmiss",
            |_| {},
            |t| {
                t.remove("blk.0.attn_v.weight");
            },
        ));
        assert!(e.contains("blk.0.attn_v.weight is missing"), "{e}");
        let e = with_key(
            "bitnet",
            "bnrope",
            "bitnet.rope.scaling.type",
            GgufValue::String("yarn".into()),
        );
        assert!(e.contains("bitnet.rope.scaling.type"), "{e}");
    }

    #[test]
    fn bad_deepseek2_and_mistral3_metadata_names_the_key() {
        let u = |v: u32| GgufValue::Array(Array::scalar(v).unwrap());
        let e = with_key(
            "deepseek2_v3",
            "ds2gating",
            "deepseek2.expert_gating_func",
            u(3),
        );
        assert!(
            e.contains("deepseek2.expert_gating_func") && e.contains("ds2gating.gguf"),
            "{e}"
        );
        let e = without_key(
            "deepseek2_v3",
            "ds2mla",
            "deepseek2.attention.value_length_mla",
        );
        assert!(e.contains("value_length_mla"), "{e}");
        let e = with_key(
            "deepseek2_v3",
            "ds2rope",
            "deepseek2.rope.dimension_count",
            u(64),
        );
        assert!(e.contains("deepseek2.rope.dimension_count"), "{e}");
        let e = err(&edited(
            "deepseek2_v2",
            "ds2vb",
            |_| {},
            |t| {
                t.remove("blk.1.attn_v_b.weight");
            },
        ));
        assert!(e.contains("model.layers.1.self_attn.unembed_out"), "{e}");
        let e = without_key("mistral3", "m3temp", "mistral3.attention.temperature_scale");
        assert!(e.contains("mistral3.attention.temperature_scale"), "{e}");
    }

    #[test]
    fn bad_metadata_of_the_later_gguf_maps_names_the_key() {
        let u = |v: u32| GgufValue::Array(Array::scalar(v).unwrap());
        for (fixture, key) in [
            ("ernie4_5_moe", "ernie4_5-moe.interleave_moe_layer_step"),
            ("ernie4_5_moe", "ernie4_5-moe.expert_used_count"),
            ("llama4", "llama4.expert_feed_forward_length"),
            ("llama4", "llama4.interleave_moe_layer_step"),
            ("granitehybrid", "granitehybrid.ssm.time_step_rank"),
            (
                "granitehybrid",
                "granitehybrid.expert_shared_feed_forward_length",
            ),
            ("gemma4", "gemma4.attention.key_length_swa"),
            ("gemma4", "gemma4.attention.sliding_window"),
            ("gemma3n", "gemma3n.altup.num_inputs"),
            ("gemma3n", "gemma3n.embedding_length_per_layer_input"),
            ("rwkv7", "rwkv7.wkv.head_size"),
            ("rwkv7", "rwkv7.attention.gate_lora_rank"),
            ("rwkv7", "rwkv7.attention.layer_norm_epsilon"),
            ("apertus", "apertus.xielu.beta"),
            ("minicpm", "minicpm.residual_scale"),
            ("deepseek", "deepseek.expert_feed_forward_length"),
        ] {
            let e = without_key(fixture, "missing", key);
            assert!(e.contains(key) && e.contains("is missing"), "{key}: {e}");
        }
        let e = with_key(
            "ernie4_5_moe",
            "e45dense",
            "ernie4_5-moe.leading_dense_block_count",
            u(9),
        );
        assert!(
            e.contains("leading_dense_block_count") && e.contains("at most 4"),
            "{e}"
        );
        // Granite 4.0 H's layer types come from a per-layer head count.
        let e = with_key(
            "granitehybrid",
            "ghkv",
            "granitehybrid.attention.head_count_kv",
            u(2),
        );
        assert!(
            e.contains("granitehybrid.attention.head_count_kv") && e.contains("ghkv.gguf"),
            "{e}"
        );
        // Gemma 4: the layer kinds, the double-wide widths and the unmapped MoE name the key;
        // Gemma 3n: the sparsity quantiles.
        for (fixture, name, k, v) in [
            (
                "gemma4",
                "g4pattern",
                "gemma4.attention.sliding_window_pattern",
                u(1),
            ),
            (
                "gemma4",
                "g4ffn",
                "gemma4.feed_forward_length",
                GgufValue::Array(Array::from_slice(&[32u32, 64, 32, 64, 64], &[5]).unwrap()),
            ),
            ("gemma4", "g4moe", "gemma4.expert_count", u(4)),
            (
                "gemma3n",
                "g3nsparse",
                "gemma3n.activation_sparsity_scale",
                u(1),
            ),
        ] {
            let e = with_key(fixture, name, k, v);
            assert!(e.contains(k) && e.contains(&format!("{name}.gguf")), "{e}");
        }
        // StableLM: the residual layout must agree with the tensors, the rope width fit a
        // head, the stacked per-head norms have one row per head.
        let e = with_key(
            "stablelm",
            "slpar",
            "stablelm.use_parallel_residual",
            GgufValue::Array(Array::scalar(true).unwrap()),
        );
        assert!(
            e.contains("stablelm.use_parallel_residual") && e.contains("slpar.gguf"),
            "{e}"
        );
        let e = with_key("stablelm", "slrope", "stablelm.rope.dimension_count", u(12));
        assert!(e.contains("stablelm.rope.dimension_count"), "{e}");
        let e = err(&edited(
            "stablelm",
            "slqn",
            |_| {},
            |t| {
                let w = t["blk.0.attn_q_norm.weight"].reshape(&[2, 16]).unwrap();
                t.insert("blk.0.attn_q_norm.weight".into(), w);
            },
        ));
        assert!(
            e.contains("self_attn.q_layernorm") && e.contains("(4, 8)"),
            "{e}"
        );
        // Nemotron: a rope scaling mlx-lm's nemotron lacks.
        let e = with_key(
            "nemotron",
            "nemyarn",
            "nemotron.rope.scaling.type",
            GgufValue::String("yarn".into()),
        );
        assert!(e.contains("nemotron.rope.scaling.type"), "{e}");
        // Hunyuan dense: only the pre-scaled NTK-alpha rope.
        let e = with_key(
            "hunyuan_dense",
            "hydyn",
            "hunyuan-dense.rope.scaling.type",
            GgufValue::String("yarn".into()),
        );
        assert!(e.contains("hunyuan-dense.rope.scaling.type"), "{e}");
        // Phi-2: an older converter's fused qkv is split (and must have q + 2 kv rows).
        let e = err(&edited(
            "phi2",
            "phi2qkv",
            |_| {},
            |t| {
                let q = t.remove("blk.0.attn_q.weight").unwrap();
                let k = t.remove("blk.0.attn_k.weight").unwrap();
                let fused = mlx_core::ops::concatenate(&[&q, &k], 0, None).unwrap();
                t.insert("blk.0.attn_qkv.weight".into(), fused);
            },
        ));
        assert!(
            e.contains("blk.0.attn_qkv.weight") && e.contains("rows"),
            "{e}"
        );
        // GPT-2: learned positions are needed; the head is the embedding.
        let e = err(&edited(
            "gpt2",
            "gpt2pos",
            |_| {},
            |t| {
                t.remove("position_embd.weight");
            },
        ));
        assert!(e.contains("position_embd.weight"), "{e}");
        let e = err(&edited(
            "gpt2",
            "gpt2head",
            |_| {},
            |t| {
                let w = t["token_embd.weight"].clone();
                t.insert("output.weight".into(), w);
            },
        ));
        assert!(e.contains("output.weight"), "{e}");
        // StarCoder: one KV head or all of them.
        let e = with_key(
            "starcoder",
            "scgqa",
            "starcoder.attention.head_count_kv",
            u(2),
        );
        assert!(e.contains("starcoder.attention.head_count_kv"), "{e}");
        // GPT-NeoX: the fused qkv has three times the width.
        let e = err(&edited(
            "gptneox",
            "neoxqkv",
            |_| {},
            |t| {
                let w = t["blk.0.attn_qkv.weight"]
                    .slice(&[0, 0], &[64, 32], &[1, 1])
                    .unwrap();
                t.insert("blk.0.attn_qkv.weight".into(), w);
            },
        ));
        assert!(
            e.contains("blk.0.attn_qkv.weight") && e.contains("rows"),
            "{e}"
        );
        // InternLM2: q, k and v come together; the key heads divide the query heads.
        let e = err(&edited(
            "internlm2",
            "il2v",
            |_| {},
            |t| {
                t.remove("blk.1.attn_v.weight");
            },
        ));
        assert!(
            e.contains("blk.1.attn_v.weight") && e.contains("il2v.gguf"),
            "{e}"
        );
        let e = with_key(
            "internlm2",
            "il2kv",
            "internlm2.attention.head_count_kv",
            u(3),
        );
        assert!(e.contains("internlm2.attention.head_count_kv"), "{e}");
        // MobileLLM's layout (every layer global, with rope) is not mlx-lm's llama4.
        let e = with_key("llama4", "l4swa", "llama4.attention.sliding_window", u(0));
        assert!(
            e.contains("llama4.attention.sliding_window") && e.contains("l4swa.gguf"),
            "{e}"
        );
    }

    #[test]
    fn head_counts_that_do_not_divide_the_rows_name_the_tensor() {
        let e = err(&file("heads3", 3, 3));
        assert!(
            e.contains("blk.0.attn_q.weight") && e.contains("head_count = 3"),
            "{e}"
        );
        assert!(!e.contains("invalid model config"), "{e}");
    }

    #[test]
    fn bad_qwen35_sizes_name_the_key_or_the_tensor() {
        let u = |v: u32| GgufValue::Array(Array::scalar(v).unwrap());
        let e = with_key("qwen35", "q35rank", "qwen35.ssm.time_step_rank", u(3));
        assert!(
            e.contains("ssm.time_step_rank") && e.contains("q35rank.gguf"),
            "{e}"
        );
        let e = with_key(
            "qwen35",
            "q35pattern",
            "qwen35.full_attention_interval",
            u(3),
        );
        assert!(e.contains("qwen35.attention.recurrent_layers"), "{e}");
        let e = err(&edited(
            "qwen35moe",
            "q35qkv",
            |_| {},
            |t| {
                let w = ops::zeros(&[40, 32], Dtype::Float32, None).unwrap();
                t.insert("blk.0.attn_qkv.weight".into(), w);
            },
        ));
        assert!(
            e.contains("blk.0.attn_qkv.weight")
                && e.contains("[40, 32]")
                && e.contains("q35qkv.gguf"),
            "{e}"
        );
    }

    /// The maps added for issue #32's dense rows: a missing or unusable key is named.
    #[test]
    fn bad_metadata_of_the_dense_gguf_maps_names_the_key() {
        let u = |v: u32| GgufValue::Array(Array::scalar(v).unwrap());
        let f = |v: f32| GgufValue::Array(Array::scalar(v).unwrap());
        for (fixture, key) in [
            ("talkie", "talkie.logit_scale"),
            ("plamo3", "plamo3.attention.sliding_window"),
            ("spark2_5", "spark2_5.attention.sliding_window_pattern"),
            ("exaone_moe", "exaone-moe.expert_gating_func"),
            ("mellum", "mellum.expert_feed_forward_length"),
            ("muse_glimmer", "muse-glimmer.logit_scale"),
        ] {
            let e = without_key(fixture, "dense_missing", key);
            assert!(e.contains(key) && e.contains("is missing"), "{key}: {e}");
        }
        for (fixture, name, key, value, says) in [
            ("qwen", "qwrope", "qwen.rope.freq_base", f(1e6), "10000"),
            (
                "olmo",
                "olclamp",
                "olmo.attention.clamp_kqv",
                f(8.0),
                "clamp",
            ),
            (
                "olmo",
                "oleps",
                "olmo.attention.layer_norm_epsilon",
                f(1e-6),
                "1e-5",
            ),
            (
                "plamo",
                "plkv",
                "plamo.attention.head_count_kv",
                u(3),
                "does not divide",
            ),
            (
                "exaone_moe",
                "exgate",
                "exaone-moe.expert_gating_func",
                u(1),
                "sigmoid",
            ),
            (
                "mellum",
                "mlscale",
                "mellum.expert_weights_scale",
                f(2.0),
                "scale",
            ),
            (
                "spark2_5",
                "sppat",
                "spark2_5.attention.sliding_window_pattern",
                GgufValue::Array(Array::from_slice(&[true, false], &[2]).unwrap()),
                "2 entries for 4 layers",
            ),
            (
                "openelm",
                "oekv",
                "openelm.attention.head_count_kv",
                GgufValue::Array(Array::from_slice(&[2u32, 1, 1], &[3]).unwrap()),
                "3 entries for 2 layers",
            ),
            (
                "openelm",
                "oeq",
                "openelm.attention.head_count",
                GgufValue::Array(Array::from_slice(&[4u32, 0], &[2]).unwrap()),
                "positive",
            ),
            (
                "deci",
                "deciffn",
                "deci.feed_forward_length",
                GgufValue::Array(Array::from_slice(&[256u32, 256, 0, 300], &[4]).unwrap()),
                "no `ffn_mult` gives",
            ),
            (
                "deci",
                "deciq",
                "deci.attention.head_count",
                GgufValue::Array(Array::from_slice(&[4u32, 0, 2, 4], &[4]).unwrap()),
                "the attention layers have 4 heads",
            ),
            (
                "deci",
                "decikv",
                "deci.attention.head_count_kv",
                GgufValue::Array(Array::from_slice(&[3u32, 0, 0, 1], &[4]).unwrap()),
                "does not divide 4 heads",
            ),
        ] {
            let e = with_key(fixture, name, key, value);
            assert!(
                e.contains(key) && e.contains(says) && e.contains(&format!("{name}.gguf")),
                "{key}: {e}"
            );
        }
    }

    /// The state-space and later mixture-of-experts maps (`gguf_dense::ssm_and_moe_*`): a
    /// missing key they add names it; what a file cannot say for mlx-lm is refused by key.
    #[test]
    fn bad_metadata_of_the_ssm_and_moe_gguf_maps_names_the_key() {
        let u = |v: u32| GgufValue::Array(Array::scalar(v).unwrap());
        for (fixture, key) in [
            ("mamba", "mamba.ssm.time_step_rank"),
            ("falcon_mamba", "mamba.ssm.state_size"),
            ("mamba2", "mamba2.ssm.group_count"),
            ("minimax_m2", "minimax-m2.rope.dimension_count"),
            ("bailingmoe2", "bailingmoe2.expert_feed_forward_length"),
            ("bailingmoe", "bailingmoe.rope.dimension_count"),
            ("nemotron_h", "nemotron_h.ssm.inner_size"),
            ("falcon_h1", "falcon-h1.attention.key_length"),
            ("jamba", "jamba.ssm.conv_kernel"),
            ("dbrx", "dbrx.attention.clamp_kqv"),
            ("hunyuan_moe", "hunyuan-moe.expert_feed_forward_length"),
            ("qwen3vlmoe", "qwen3vlmoe.expert_feed_forward_length"),
            ("afmoe", "afmoe.expert_feed_forward_length"),
            ("deepseek32", "deepseek32.attention.indexer.top_k"),
            ("glm_dsa", "glm-dsa.attention.indexer.head_count"),
            ("plamo2", "plamo2.attention.key_length"),
            ("nemotron_h_moe", "nemotron_h_moe.expert_count"),
            ("nemotron_h_moe", "nemotron_h_moe.expert_weights_scale"),
            // The latent projections' tensors are there.
            ("nemotron_h_moe", "nemotron_h_moe.moe_latent_size"),
            ("step35", "step35.attention.sliding_window_pattern"),
            ("step35", "step35.expert_weights_scale"),
            ("step35", "step35.expert_weights_norm"),
            ("step35", "step35.attention.key_length"),
            ("mimo2", "mimo2.attention.sliding_window_pattern"),
            ("mimo2", "mimo2.rope.dimension_count"),
            ("mimo2", "mimo2.expert_feed_forward_length"),
            // Two groups need it.
            ("mimo2", "mimo2.expert_group_used_count"),
            ("laguna", "laguna.leading_dense_block_count"),
            ("laguna", "laguna.expert_shared_feed_forward_length"),
            ("laguna", "laguna.rope.scaling.factor"),
            ("kimi_linear", "kimi-linear.kda.head_dim"),
            ("kimi_linear", "kimi-linear.attention.key_length_mla"),
            ("kimi_linear", "kimi-linear.expert_shared_count"),
        ] {
            let e = without_key(fixture, "ssmmissing", key);
            assert!(e.contains(key) && e.contains("is missing"), "{key}: {e}");
        }
        // A router mlx-lm's class lacks, layer lists that do not describe the layers, a
        // tied Falcon-H1 head (its multipliers are not in the file).
        for (fixture, name, k, v) in [
            (
                "minimax_m2",
                "mmgating",
                "minimax-m2.expert_gating_func",
                u(1),
            ),
            (
                "bailingmoe2",
                "blgating",
                "bailingmoe2.expert_gating_func",
                u(3),
            ),
            (
                "deepseek32",
                "ds32gating",
                "deepseek32.expert_gating_func",
                u(1),
            ),
            (
                "nemotron_h",
                "nhffn",
                "nemotron_h.feed_forward_length",
                u(48),
            ),
            ("jamba", "jbkv", "jamba.attention.head_count_kv", u(2)),
            (
                "nemotron_h_moe",
                "nhmffn",
                "nemotron_h_moe.expert_feed_forward_length",
                u(32),
            ),
            // Two head counts on full layers; another router; a rope width llama.cpp ignores.
            ("step35", "s35heads", "step35.attention.head_count", {
                GgufValue::Array(Array::from_slice(&[4u32, 2, 2, 2], &[4]).unwrap())
            }),
            ("step35", "s35gating", "step35.expert_gating_func", u(1)),
            ("step35", "s35rope", "step35.rope.dimension_count", u(4)),
            // Only full layers; a KV count that does not divide the heads; unnormalized weights.
            (
                "mimo2",
                "m2pattern",
                "mimo2.attention.sliding_window_pattern",
                { GgufValue::Array(Array::from_slice(&[0i32; 7], &[7]).unwrap()) },
            ),
            ("mimo2", "m2kv", "mimo2.attention.head_count_kv", {
                GgufValue::Array(Array::from_slice(&[3u32, 1, 1, 2, 1, 1, 1], &[7]).unwrap())
            }),
            ("mimo2", "m2norm", "mimo2.expert_weights_norm", {
                GgufValue::Array(Array::scalar(false).unwrap())
            }),
            // Another router, YaRN's attention factor, unnormalized weights.
            ("laguna", "lgating", "laguna.expert_gating_func", u(1)),
            ("laguna", "lattn", "laguna.rope.scaling.yarn_attn_factor", {
                GgufValue::Array(Array::scalar(1.2f32).unwrap())
            }),
            ("laguna", "lnorm", "laguna.expert_weights_norm", {
                GgufValue::Array(Array::scalar(false).unwrap())
            }),
            // Q through a LoRA; only MLA layers.
            (
                "kimi_linear",
                "kqlora",
                "kimi-linear.attention.q_lora_rank",
                u(8),
            ),
            (
                "kimi_linear",
                "kkv",
                "kimi-linear.attention.head_count_kv",
                { GgufValue::Array(Array::from_slice(&[1u32, 1, 1], &[3]).unwrap()) },
            ),
            // Puzzle's per-layer top-k: mlx-lm has one `num_experts_per_tok`.
            (
                "nemotron_h_moe",
                "nhmused",
                "nemotron_h_moe.expert_used_count",
                { GgufValue::Array(Array::from_slice(&[0u32, 2, 0, 4], &[4]).unwrap()) },
            ),
            ("plamo2", "p2kv", "plamo2.attention.head_count_kv", {
                GgufValue::Array(Array::from_slice(&[0u32, 0, 2, 2], &[4]).unwrap())
            }),
            (
                "afmoe",
                "afpattern",
                "afmoe.attention.sliding_window_pattern",
                { GgufValue::Array(Array::from_slice(&[true, true, true, true], &[4]).unwrap()) },
            ),
        ] {
            let e = with_key(fixture, name, k, v);
            assert!(e.contains(k) && e.contains(&format!("{name}.gguf")), "{e}");
        }
        // A per-element gate (Laguna M.1): mlx-lm's laguna gates per head.
        let e = err(&edited(
            "laguna",
            "lelem",
            |_| {},
            |t| {
                let g = t.remove("blk.1.attn_gate.weight").unwrap();
                let wide = mlx_core::ops::concatenate(&[&g; 8], 0, None).unwrap();
                t.insert("blk.1.attn_gate.weight".into(), wide);
            },
        ));
        assert!(
            e.contains("blk.1.attn_gate.weight") && e.contains("per-element"),
            "{e}"
        );
        // Groups need `expert_group_used_count`, which the converter does not write.
        let e = with_key(
            "nemotron_h_moe",
            "nhmgroups",
            "nemotron_h_moe.expert_group_count",
            u(2),
        );
        assert!(
            e.contains("nemotron_h_moe.expert_group_used_count") && e.contains("is missing"),
            "{e}"
        );
        let e = err(&edited(
            "falcon_h1",
            "fh1tied",
            |_| {},
            |t| {
                t.remove("output.weight");
            },
        ));
        assert!(
            e.contains("output.weight") && e.contains("lm_head_multiplier"),
            "{e}"
        );
    }

    /// The last GGUF maps (`gguf_dense::last_gguf_architectures_match_mlx_lm`): a missing key
    /// is named; what mlx-lm's class cannot compute is refused by key.
    #[test]
    fn bad_metadata_of_the_last_gguf_maps_names_the_key() {
        let u = |v: u32| GgufValue::Array(Array::scalar(v).unwrap());
        for (fixture, key) in [
            ("bailingmoe3", "bailingmoe3.kda.head_dim"),
            ("bailingmoe3", "bailingmoe3.kda.gate_lower_bound"),
            ("bailingmoe3", "bailingmoe3.attention.key_length_mla"),
            ("bailingmoe3", "bailingmoe3.expert_shared_count"),
            ("bailingmoe3", "bailingmoe3.leading_dense_block_count"),
            ("bailingmoe3", "bailingmoe3.expert_gating_func"),
            ("bailingmoe3", "bailingmoe3.expert_weights_scale"),
            ("minimax_m3", "minimax-m3.expert_feed_forward_length"),
            ("minimax_m3", "minimax-m3.attention.indexer.head_count"),
            ("minimax_m3", "minimax-m3.attention.indexer.block_size"),
            ("minimax_m3", "minimax-m3.attention.indexer.local_blocks"),
            ("minimax_m3", "minimax-m3.expert_weights_scale"),
            ("minimax_m3", "minimax-m3.expert_gating_func"),
            ("minimax_m3", "minimax-m3.rope.dimension_count"),
            ("kimi_k3", "kimi-k3.attention.head_count_kv"),
            ("kimi_k3", "kimi-k3.activation.situ_beta"),
            ("kimi_k3", "kimi-k3.activation.situ_linear_beta"),
            ("kimi_k3", "kimi-k3.attn_res.block_size"),
            ("kimi_k3", "kimi-k3.kda.head_dim"),
            ("kimi_k3", "kimi-k3.expert_weights_scale"),
            ("kimi_k3", "kimi-k3.attention.key_length_mla"),
            ("xverse", "xverse.context_length"),
        ] {
            let e = err(&edited(
                fixture,
                "lastmissing",
                |m| {
                    m.remove(key);
                },
                |_| {},
            ));
            assert!(e.contains(key) && e.contains("missing"), "{key}: {e}");
        }
        for (fixture, name, k, v) in [
            // Another router; unsafe gates; unnormalized weights; a SwiGLU clamp; M-RoPE; a
            // layer pattern no `layer_group_size` gives.
            (
                "bailingmoe3",
                "b3gating",
                "bailingmoe3.expert_gating_func",
                u(1),
            ),
            ("bailingmoe3", "b3safe", "bailingmoe3.kda.safe_gate", {
                GgufValue::Array(Array::scalar(false).unwrap())
            }),
            (
                "bailingmoe3",
                "b3norm",
                "bailingmoe3.expert_weights_norm",
                { GgufValue::Array(Array::scalar(false).unwrap()) },
            ),
            ("bailingmoe3", "b3clamp", "bailingmoe3.swiglu_clamp_exp", {
                GgufValue::Array(Array::from_slice(&[0f32, 7.0, 7.0, 7.0, 7.0, 7.0], &[6]).unwrap())
            }),
            (
                "bailingmoe3",
                "b3mrope",
                "bailingmoe3.rope.dimension_sections",
                { GgufValue::Array(Array::from_slice(&[2i32, 1, 1, 0], &[4]).unwrap()) },
            ),
            (
                "bailingmoe3",
                "b3kv",
                "bailingmoe3.attention.head_count_kv",
                { GgufValue::Array(Array::from_slice(&[1u32, 0, 0, 1, 1, 1], &[6]).unwrap()) },
            ),
            // Sizes multiplied past i32 (`expert_feed_forward_length` * `expert_shared_count`)
            // are compared in i64, not overflowed.
            (
                "kimi_k3",
                "k3shared",
                "kimi-k3.expert_shared_count",
                u(i32::MAX as u32),
            ),
        ] {
            let e = err(&edited(
                fixture,
                name,
                |m| {
                    m.insert(k.into(), v);
                },
                |_| {},
            ));
            assert!(e.contains(k) && e.contains(&format!("{name}.gguf")), "{e}");
        }
        // A routed scale that is present but not a number is not reported as missing.
        for (fixture, k) in [
            ("bailingmoe3", "bailingmoe3.expert_weights_scale"),
            ("minimax_m3", "minimax-m3.expert_weights_scale"),
            ("kimi_k3", "kimi-k3.expert_weights_scale"),
        ] {
            let e = err(&edited(
                fixture,
                "scaletext",
                |m| {
                    m.insert(k.into(), GgufValue::String("2.5".into()));
                },
                |_| {},
            ));
            assert!(e.contains(k) && e.contains("is not a number"), "{e}");
        }
    }
}

//! L1 against mlx-lm 0.32.2 for issue #32's rows (the dense rest and the text towers of the
//! multimodal wrappers): tiny seeded models built by mlx-lm's own classes (written with their
//! goldens by `cargo xtask goldens dense2`) give mlx-lm's logits to the last bit: prefill,
//! every cached decode step and a cache-less forward.

use crate::model_check;

use std::path::PathBuf;

use mlx_models::config::ModelConfig;
use mlx_models::models::{resolve, supported_model_types, Serving};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root().join("goldens/dense2"))
        .unwrap()
        .filter_map(|e| {
            let p = e.ok()?.path();
            Some(p.file_stem()?.to_str()?.to_string())
        })
        .collect();
    names.sort();
    names
}

#[test]
fn every_dense2_fixture_matches_mlx_lm_bit_for_bit() {
    let names = names();
    assert!(names.len() >= 10, "only {} dense2 goldens", names.len());
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    model_check::check_all(&names, |n| {
        model_check::check_model(
            &root().join("models/dense2").join(n),
            &root().join(format!("goldens/dense2/{n}.safetensors")),
        )
    });
}

#[test]
fn the_new_types_are_listed_as_table_rows() {
    let all = supported_model_types();
    for t in [
        "qwen",
        "lille-130m",
        "qwen2_vl",
        "qwen3_vl",
        "pixtral",
        "plamo",
        "openelm",
        "nanbeige",
        "plamo3",
        "bitnet",
    ] {
        let s = all.iter().find(|s| s.model_type == t);
        assert_eq!(s.map(|s| s.serving), Some(Serving::Table), "{t}");
    }
    for t in [
        "lfm2-vl",
        "qwen3_vl_moe",
        "gemma4",
        "talkie",
        "muse_glimmer",
        "nemotron-nas",
        "iquestloopcoder",
        "afm7",
        "phixtral",
        "mimo_v2_flash",
        "step3p5",
        "recurrent_gemma",
        "rwkv7",
        "gear",
        "plamo2",
        "kimi_linear",
        "bailing_moe_v3",
        "bailing_moe_linear",
        "bailing_hybrid",
        "minimax_m3_vl",
        "kimi_k3",
        "prism_hadamard_qwen35",
        "gemma3n",
        "deepseek_v41",
    ] {
        let s = all.iter().find(|s| s.model_type == t);
        assert_eq!(s.map(|s| s.serving), Some(Serving::Dedicated), "{t}");
    }
    // Every type is served or listed as not served, never both.
    for (t, _, reason) in mlx_models::models::unserved::UNSERVED {
        assert!(all.iter().all(|s| s.model_type != *t), "{t} is served");
        assert!(!reason.is_empty());
    }
    let alias = all.iter().find(|s| s.model_type == "qwen2_5_vl");
    assert_eq!(
        alias.and_then(|s| s.via.clone()).as_deref(),
        Some("qwen2_vl")
    );
}

#[test]
fn wrapper_configs_name_the_bad_field() {
    let cfg =
        ModelConfig::from_json_str(r#"{"model_type": "qwen3_vl", "text_config": 3}"#).unwrap();
    let msg = resolve(&cfg).unwrap_err().to_string();
    assert!(
        msg.contains("`text_config`") && msg.contains("object"),
        "{msg}"
    );
    let cfg = ModelConfig::from_json_str(r#"{"model_type": "pixtral"}"#).unwrap();
    let msg = resolve(&cfg).unwrap_err().to_string();
    assert!(
        msg.contains("`text_config`") && msg.contains("missing"),
        "{msg}"
    );
    let cfg = ModelConfig::from_json_str(
        r#"{"model_type": "lille-130m", "n_embd": 30, "n_head": 4, "n_kv_heads": 2,
            "n_layer": 1, "block_size": 8, "layer_norm_eps": 1e-5, "rope_theta": 1e4,
            "vocab_size": 10}"#,
    )
    .unwrap();
    let msg = resolve(&cfg).unwrap_err().to_string();
    assert!(msg.contains("`n_embd`"), "{msg}");
    let cfg = ModelConfig::from_json_str(
        r#"{"model_type": "openelm", "num_transformer_layers": 2, "model_dim": 32,
            "head_dim": 8, "vocab_size": 10, "ffn_dim_divisor": 16,
            "num_query_heads": [4], "num_kv_heads": [2, 2], "ffn_multipliers": [1, 1]}"#,
    )
    .unwrap();
    let msg = resolve(&cfg).unwrap_err().to_string();
    assert!(
        msg.contains("`num_query_heads`") && msg.contains("1 entries for 2"),
        "{msg}"
    );
    let cfg = ModelConfig::from_json_str(
        r#"{"model_type": "plamo", "hidden_size": 32, "num_hidden_layers": 1,
            "intermediate_size": 8, "num_attention_heads": 4, "n_shared_head": 3,
            "rms_norm_eps": 1e-6, "vocab_size": 10}"#,
    )
    .unwrap();
    let msg = resolve(&cfg).unwrap_err().to_string();
    assert!(msg.contains("`n_shared_head`"), "{msg}");
}

#[test]
fn wrapped_ports_name_a_missing_text_config() {
    let dir = std::env::temp_dir().join(format!("dense2_no_text_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        root().join("models/dense2/lfm2_vl/model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    std::fs::write(dir.join("config.json"), r#"{"model_type": "lfm2-vl"}"#).unwrap();
    let err = match mlx_models::load::load_model_dir(&dir, &Default::default()) {
        Ok(_) => panic!("loaded lfm2-vl without a text_config"),
        Err(e) => e.to_string(),
    };
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        err.contains("`text_config`") && err.contains("lfm2-vl"),
        "{err}"
    );
}

/// The new hybrids' bad configs and weights give errors naming the field or tensor, never a
/// panic.
#[test]
fn new_hybrid_configs_and_weights_name_the_problem() {
    use mlx_models::load::load_weights;
    use mlx_models::models::build;
    use mlx_models::weights::Weights;
    use serde_json::Value;

    let err = |name: &str, edit: &dyn Fn(&mut Value), drop: Option<&str>| -> String {
        let dir = root().join("models/dense2").join(name);
        let mut config: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        edit(&mut config);
        let mut tensors = load_weights(&dir).unwrap();
        if let Some(d) = drop {
            tensors.retain(|k, _| k != d);
        }
        let config = match ModelConfig::from_value(config) {
            Ok(c) => c,
            Err(e) => return e.to_string(),
        };
        match build(&config, Weights::new(tensors, None, None)) {
            Ok(_) => panic!("{name}: expected an error"),
            Err(e) => e.to_string(),
        }
    };
    let cases: Vec<(String, &str)> = vec![
        (
            err(
                "kimi_linear",
                &|c| c["linear_attn_config"]["kda_layers"] = serde_json::json!([9]),
                None,
            ),
            "kda_layers",
        ),
        (
            err(
                "kimi_linear",
                &|c| c["moe_router_activation_func"] = "tanh".into(),
                None,
            ),
            "moe_router_activation_func",
        ),
        (
            err(
                "bailing_moe_v3",
                &|c| c["rope_interleave"] = false.into(),
                None,
            ),
            "rope_interleave",
        ),
        (
            err(
                "bailing_moe_v3",
                &|_| {},
                Some("model.layers.0.attention.A_log"),
            ),
            "model.layers.0.attention.A_log",
        ),
        (
            err(
                "bailing_moe_linear",
                &|c| c["layer_group_size"] = 7.into(),
                None,
            ),
            "layer_group_size",
        ),
        (
            err(
                "bailing_hybrid",
                &|c| c["partial_rotary_factor"] = 0.1.into(),
                None,
            ),
            "rotary dimension",
        ),
        (
            err(
                "minimax_m3_vl",
                &|c| {
                    c["text_config"]["sparse_attention_config"]["sparse_num_index_heads"] = 3.into()
                },
                None,
            ),
            "index_n_heads",
        ),
        (
            err(
                "minimax_m3_vl",
                &|c| c["text_config"]["mlp_layer_types"] = serde_json::json!(["dense"]),
                None,
            ),
            "mlp_layer_types",
        ),
        (
            err(
                "kimi_k3",
                &|c| c["text_config"]["hidden_act"] = "gelu".into(),
                None,
            ),
            "hidden_act",
        ),
        (
            err(
                "prism_hadamard_qwen35",
                &|c| c["quantization"]["bits"] = 4.into(),
                None,
            ),
            "`quantization`",
        ),
        (
            err(
                "prism_hadamard_qwen35",
                &|_| {},
                Some("language_model.model.layers.0.mlp.gate_proj.signs"),
            ),
            "language_model.model.layers.0.mlp.gate_proj.signs",
        ),
        (
            err(
                "prism_hadamard_qwen35",
                &|c| {
                    c["modules"][0] = serde_json::json!({"path": "model.layers.9.nothing",
                        "embedding": false, "dtype": "float16", "block": 0})
                },
                None,
            ),
            "packed modules are unknown",
        ),
        // gemma3n: mlx-lm needs a layer of each type among those that own keys and values.
        (
            err(
                "gemma3n",
                &|c| c["text_config"]["num_kv_shared_layers"] = 4.into(),
                None,
            ),
            "needs a `full_attention` layer among the first 1",
        ),
        (
            err(
                "gemma3n",
                &|c| c["text_config"]["intermediate_size"] = serde_json::json!([64, 64]),
                None,
            ),
            "intermediate_size has 2 entries for 5 layers",
        ),
        (
            err(
                "gemma3n",
                &|c| c["text_config"]["altup_active_idx"] = 4.into(),
                None,
            ),
            "altup_active_idx",
        ),
        (
            err(
                "gemma3n",
                &|c| {
                    c["text_config"]
                        .as_object_mut()
                        .unwrap()
                        .remove("laurel_rank");
                },
                None,
            ),
            "laurel_rank",
        ),
        (
            err(
                "gemma3n",
                &|_| {},
                Some("model.language_model.layers.4.altup.prediction_coefs.weight"),
            ),
            "model.language_model.layers.4.altup.prediction_coefs.weight",
        ),
        // deepseek_v41: mlx-lm's refusals (engram layers) and index errors as config errors.
        (
            err(
                "deepseek_v41",
                &|c| c["engram_layer_ids"] = serde_json::json!([1]),
                None,
            ),
            "engram_layer_ids",
        ),
        (
            err(
                "deepseek_v41",
                &|c| c["kv_source_layer_ids"] = serde_json::json!([0, 1]),
                None,
            ),
            "kv source layer 0 has compress ratio 0",
        ),
        (
            err(
                "deepseek_v41",
                &|c| c["index_source_layer_ids"] = serde_json::json!([7]),
                None,
            ),
            "index_source_layer_ids",
        ),
        (
            err("deepseek_v41", &|c| c["o_groups"] = 3.into(), None),
            "o_groups",
        ),
        (
            err(
                "deepseek_v41",
                &|_| {},
                Some("model.layers.1.self_attn.indexer.k_proj.weight"),
            ),
            "model.layers.1.self_attn.indexer.k_proj.weight",
        ),
    ];
    for (msg, want) in cases {
        assert!(msg.contains(want), "{want}: {msg}");
    }
}

/// gemma3n's `sanitize`: a checkpoint of the whole multimodal model (vision and audio towers
/// and their embedders beside `model.language_model`) loads as the text model, with the same
/// logits.
#[test]
fn gemma3n_drops_the_vision_and_audio_towers() {
    use mlx_core::prelude::*;
    use mlx_models::load::load_weights;
    use mlx_models::models::build;
    use mlx_models::weights::Weights;

    let dir = root().join("models/dense2/gemma3n");
    let config = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let mut tensors = load_weights(&dir).unwrap();
    for k in [
        "model.vision_tower.timm_model.stem.conv.weight",
        "model.audio_tower.subsample_conv_projection.conv_0.conv.weight",
        "model.embed_audio.embedding.weight",
        "model.embed_vision.embedding_projection.weight",
    ] {
        tensors.insert(
            k.to_string(),
            Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap(),
        );
    }
    let model = build(&config, Weights::new(tensors, None, None)).unwrap();
    model_check::check_loaded(
        model.as_ref(),
        &root().join("goldens/dense2/gemma3n.safetensors"),
    )
    .unwrap();
}

/// deepseek_v41's caches are mlx-lm's `LayerCache`s: not trimmable (evicted window rows and
/// closed compressed groups cannot come back), so prompt-cache reuse and speculative decoding
/// refuse to trim them rather than decode from a wrong state; a cache of another kind is an
/// error naming the model.
#[test]
fn deepseek_v41_caches_are_layer_caches_that_refuse_to_trim() {
    use mlx_core::prelude::*;
    use mlx_models::load::{load_model_dir, LoadOptions};

    let dir = root().join("models/dense2/deepseek_v41");
    let (model, _) = load_model_dir(&dir, &LoadOptions::default()).unwrap();
    let mut caches = model.make_cache();
    assert_eq!(caches.len(), 4);
    let ids = Array::from_slice(&[1i32, 17, 90, 5, 42, 42, 7], &[1, 7]).unwrap();
    model.forward(&ids, Some(&mut caches)).unwrap();
    assert!(caches.iter().all(|c| c.offset() == 7 && !c.is_trimmable()));
    assert!(!mlx_cache::can_trim_prompt_cache(&caches));
    assert_eq!(mlx_cache::trim_prompt_cache(&mut caches, 2), 0);
    // The prompt-cache loader cannot rebuild a LayerCache (nor can mlx-lm's): no file is
    // written.
    let file = std::env::temp_dir().join(format!("v41_cache_{}.safetensors", std::process::id()));
    let err = mlx_cache::save_prompt_cache(&file, &caches, &Default::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("LayerCache cannot be saved"), "{err}");
    assert!(!file.exists());
    let mut wrong = mlx_models::LanguageModel::make_cache(model.as_ref());
    wrong[2] = Box::new(mlx_cache::KVCache::new());
    let err = model
        .forward(&ids, Some(&mut wrong))
        .unwrap_err()
        .to_string();
    assert!(err.contains("LayerCache"), "{err}");
}

/// deepseek_v41's `sanitize`: the float32 fixture under the published checkpoint's names
/// (`cargo xtask goldens dense2` writes it and checks mlx-lm loads it to the same logits)
/// loads to mlx-lm's logits (the packed fp8/fp4 fixture, `deepseek_v41_fp8`, is one of the
/// dense2 cases); a malformed block scale and a missing expert are errors.
#[test]
fn deepseek_v41_published_names_load_to_the_same_logits() {
    use mlx_core::prelude::*;
    use mlx_models::load::load_weights;
    use mlx_models::models::build;
    use mlx_models::weights::Weights;

    let dir = root().join("models/deepseek_v41_published");
    model_check::check_model(
        &dir,
        &root().join("goldens/dense2/deepseek_v41.safetensors"),
    )
    .unwrap();
    let config = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let err = |edit: &dyn Fn(&mut std::collections::BTreeMap<String, Array>)| {
        let mut t = load_weights(&dir).unwrap();
        edit(&mut t);
        match build(&config, Weights::new(t, None, None)) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    };
    let msg = err(&|t| {
        t.insert(
            "layers.0.attn.wq_a.scale".into(),
            Array::from_slice(&[1.0f32], &[1]).unwrap(),
        );
    });
    assert!(
        msg.contains("deepseek_v41") && msg.contains("2 or more axes"),
        "{msg}"
    );
    let msg = err(&|t| {
        t.remove("layers.2.ffn.experts.3.w2.weight");
    });
    assert!(
        msg.contains("layer 2 has 3 down_proj expert weights"),
        "{msg}"
    );
}

//! Bad input to the MoE and hybrid rows gives a clear error naming the field or tensor, never
//! a panic: inconsistent configs, missing or extra tensors, and caches of the wrong kind or
//! number.

use std::path::PathBuf;

use mlx_cache::{Cache, KVCache};
use mlx_core::prelude::*;
use mlx_models::config::ModelConfig;
use mlx_models::load::load_weights;
use mlx_models::models::build;
use mlx_models::weights::Weights;
use serde_json::Value;

fn fixture(name: &str) -> (Value, Weights) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/models")
        .join(name);
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let weights = Weights::new(load_weights(&dir).unwrap(), None, None);
    (config, weights)
}

fn build_err(config: Value, weights: Weights) -> String {
    let config = match ModelConfig::from_value(config) {
        Ok(c) => c,
        Err(e) => return e.to_string(),
    };
    match build(&config, weights) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn inconsistent_configs_name_the_field() {
    let cases: &[(&str, &str, Value, &str)] = &[
        (
            "qwen3_moe",
            "num_experts_per_tok",
            Value::from(9),
            "num_experts_per_tok",
        ),
        (
            "mixtral",
            "num_local_experts",
            Value::from(0),
            "num_experts",
        ),
        (
            "qwen3_next",
            "linear_num_key_heads",
            Value::from(3),
            "num_v_heads",
        ),
        (
            "qwen3_next",
            "num_experts",
            Value::from("four"),
            "num_experts",
        ),
        ("lfm2", "conv_L_cache", Value::from(0), "conv_L_cache"),
        (
            "gpt_oss",
            "sliding_window",
            Value::from(-1),
            "sliding_window",
        ),
        (
            "gemma4_text",
            "num_kv_shared_layers",
            Value::from(4),
            "num_kv_shared_layers",
        ),
    ];
    for (name, field, value, expect) in cases {
        let (mut config, weights) = fixture(name);
        config[*field] = value.clone();
        let msg = build_err(config, weights);
        assert!(
            msg.contains(expect),
            "{name} with {field} = {value}: {msg:?} does not name {expect}"
        );
    }
}

#[test]
fn missing_and_unexpected_expert_tensors_are_listed() {
    let (config, weights) = fixture("qwen3_moe");
    let mut w = weights;
    let gone = "model.layers.0.mlp.switch_mlp.up_proj.weight";
    let t = w.remove(gone).unwrap();
    w.insert("model.layers.0.mlp.experts_extra.weight".into(), t);
    let msg = build_err(config, w);
    assert!(msg.contains(&format!("missing: {gone}")), "{msg}");
    assert!(
        msg.contains("unexpected: model.layers.0.mlp.experts_extra.weight"),
        "{msg}"
    );
}

#[test]
fn mis_shaped_recurrent_weights_are_reported() {
    let (config, mut w) = fixture("qwen3_5");
    let name = "language_model.model.layers.0.linear_attn.conv1d.weight";
    w.insert(
        name.into(),
        ops::zeros(&[3, 3, 3], Dtype::Float32, None).unwrap(),
    );
    let msg = build_err(config, w);
    assert!(msg.contains(name) && msg.contains("shape"), "{msg}");
}

#[test]
fn caches_of_the_wrong_kind_or_number_are_errors() {
    let ids = Array::from_slice(&[1i32, 2, 3], &[1, 3]).unwrap();
    for name in ["qwen3_next", "lfm2"] {
        let (config, w) = fixture(name);
        let model = build(&ModelConfig::from_value(config).unwrap(), w).unwrap();
        let mut plain: Vec<Box<dyn Cache>> = (0..model.make_cache().len())
            .map(|_| Box::new(KVCache::new()) as Box<dyn Cache>)
            .collect();
        let msg = model
            .forward(&ids, Some(&mut plain))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("ArraysCache"), "{name}: {msg}");
        let mut short = model.make_cache();
        short.pop();
        assert!(model.forward(&ids, Some(&mut short)).is_err(), "{name}");
    }
    let (config, w) = fixture("gemma4_text");
    let model = build(&ModelConfig::from_value(config).unwrap(), w).unwrap();
    let mut too_many: Vec<Box<dyn Cache>> = (0..4)
        .map(|_| Box::new(KVCache::new()) as Box<dyn Cache>)
        .collect();
    let msg = model
        .forward(&ids, Some(&mut too_many))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("caches"), "{msg}");
}

#[test]
fn malformed_inputs_are_errors() {
    for name in ["qwen3_moe", "qwen3_next", "lfm2", "gemma4_text", "gpt_oss"] {
        let (config, w) = fixture(name);
        let model = build(&ModelConfig::from_value(config).unwrap(), w).unwrap();
        for bad in [
            Array::from_slice(&[1i32], &[]).unwrap(),
            Array::from_slice(&[1i32, 2], &[2]).unwrap(),
            Array::from_slice(&[1.0f32, 2.0], &[1, 2]).unwrap(),
        ] {
            let mut caches = model.make_cache();
            let msg = model
                .forward(&bad, Some(&mut caches))
                .unwrap_err()
                .to_string();
            assert!(msg.contains("(batch, seq)"), "{name}: {msg}");
        }
    }
}

/// The failures above are typed (issue #29): a caller can tell bad input from a cache of the
/// wrong kind and from a model that cannot be split, and each names its subject.
#[test]
fn errors_are_typed_variants_naming_their_subject() {
    use mlx_models::{ModelError, Parallelism};
    let ids = Array::from_slice(&[1i32, 2, 3], &[1, 3]).unwrap();
    let (config, w) = fixture("qwen3_next");
    let mut model = build(&ModelConfig::from_value(config).unwrap(), w).unwrap();

    let mut plain: Vec<Box<dyn Cache>> = (0..model.make_cache().len())
        .map(|_| Box::new(KVCache::new()) as Box<dyn Cache>)
        .collect();
    match model.forward(&ids, Some(&mut plain)).unwrap_err() {
        ModelError::Cache { what, problem } => {
            assert!(what.starts_with("layer "), "{what}");
            assert!(problem.contains("ArraysCache"), "{problem}");
        }
        e => panic!("expected ModelError::Cache, got {e:?}"),
    }

    let flat = Array::from_slice(&[1i32, 2], &[2]).unwrap();
    match model.forward(&flat, None).unwrap_err() {
        ModelError::Input { what, problem } => {
            assert_eq!(what, "inputs");
            assert!(problem.contains("(batch, seq)"), "{problem}");
        }
        e => panic!("expected ModelError::Input, got {e:?}"),
    }

    // mlx-lm's qwen3_next has no shard(): the error names the model type.
    let e = model.shard_tensor_parallel(2, 1).unwrap_err();
    assert!(
        matches!(
            &e,
            ModelError::Parallel { kind: Parallelism::Tensor, what, .. }
                if what == "model_type `qwen3_next`"
        ),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .starts_with("tensor parallelism: model_type `qwen3_next`: not supported"),
        "{e}"
    );
}

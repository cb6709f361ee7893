//! Writes a tiny fixture with multi-token-prediction layers added (seeded): a copy of its last
//! layer as the MTP block, `[small noise | identity]` as `eh_proj` / `fc`, unit norms, and
//! `num_nextn_predict_layers` = 1 in its config. Shared by `mlx-engine/tests/mtp.rs` and
//! `mlx-cli/tests/speculative.rs`.

use std::collections::BTreeMap;
use std::path::Path;

use mlx_core::prelude::*;
use mlx_core::random;
use serde_json::Value;

/// `src` (a tiny fixture) plus `num_nextn_predict_layers` = 1 and seeded MTP tensors, in `dst`.
pub fn with_mtp(src: &Path, dst: &Path, seed: u64) {
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let n = config["num_hidden_layers"].as_i64().unwrap();
    let dim = config["hidden_size"].as_i64().unwrap() as i32;
    config["num_nextn_predict_layers"] = Value::from(1);
    let mut w: BTreeMap<String, Array> = mlx_models::load::load_weights(src).unwrap();
    let key = random::key(seed).unwrap();
    // `[small noise | identity]`: the head sees mostly the target's hidden state, so its drafts
    // are sometimes right (partial acceptance exercises the rollback of its cache).
    let noise = random::normal(
        &[dim, 2 * dim],
        Dtype::Float32,
        None,
        Some(0.01),
        Some(&key),
        None,
    )
    .unwrap();
    let eye = ops::concatenate(
        &[
            &ops::zeros(&[dim, dim], Dtype::Float32, None).unwrap(),
            &ops::eye(dim, dim, 0, Dtype::Float32, None).unwrap(),
        ],
        1,
        None,
    )
    .unwrap();
    let proj = (&noise + &eye).unwrap();
    let ones = ops::ones(&[dim], Dtype::Float32, None).unwrap();
    let last = format!("model.layers.{}.", n - 1);
    let (block, extra): (String, Vec<(&str, &Array)>) = match config["model_type"].as_str() {
        Some("qwen3_next") => (
            // Qwen3-Next: `mtp.layers.0` is a full-attention layer (the fixture's last one).
            "mtp.layers.0.".into(),
            vec![
                ("mtp.fc.weight", &proj),
                ("mtp.pre_fc_norm_embedding.weight", &ones),
                ("mtp.pre_fc_norm_hidden.weight", &ones),
                ("mtp.norm.weight", &ones),
            ],
        ),
        _ => (
            format!("model.layers.{n}."),
            vec![
                ("enorm.weight", &ones),
                ("hnorm.weight", &ones),
                ("eh_proj.weight", &proj),
                ("shared_head.norm.weight", &ones),
            ],
        ),
    };
    let copies: Vec<(String, Array)> = w
        .iter()
        .filter_map(|(k, v)| {
            k.strip_prefix(&last)
                .map(|rest| (format!("{block}{rest}"), v.clone()))
        })
        .collect();
    assert!(!copies.is_empty());
    w.extend(copies);
    for (k, v) in extra {
        let name = if k.starts_with("mtp.") {
            k.to_string()
        } else {
            format!("{block}{k}")
        };
        w.insert(name, v.clone());
    }
    std::fs::create_dir_all(dst).unwrap();
    std::fs::write(
        dst.join("config.json"),
        serde_json::to_string_pretty(&config).unwrap(),
    )
    .unwrap();
    mlx_core::io::save_safetensors(
        dst.join("model.safetensors"),
        w.iter().map(|(k, v)| (k.as_str(), v)),
        &Default::default(),
    )
    .unwrap();
}

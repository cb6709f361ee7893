//! Writes a tiny fixture with multi-token-prediction layers added (seeded): a copy of its last
//! layer as the MTP block, small noise plus the identity on the hidden state's half as
//! `eh_proj` / `fc` / MiMo's `input_proj`, unit norms, and `num_nextn_predict_layers` = 1 in
//! its config. Shared by `mlx-engine/tests/mtp.rs` and
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
    // Small noise plus the identity on the hidden state's half (the second for DeepSeek and
    // Qwen3-Next, the first for MiMo): the head sees mostly the target's hidden state, so its
    // drafts are sometimes right (partial acceptance exercises the rollback of its cache).
    let mimo = config["model_type"].as_str() == Some("mimo");
    let noise = random::normal(
        &[dim, 2 * dim],
        Dtype::Float32,
        None,
        Some(0.01),
        Some(&key),
        None,
    )
    .unwrap();
    let zeros = ops::zeros(&[dim, dim], Dtype::Float32, None).unwrap();
    let id = ops::eye(dim, dim, 0, Dtype::Float32, None).unwrap();
    let halves = if mimo { [&id, &zeros] } else { [&zeros, &id] };
    let eye = ops::concatenate(&halves, 1, None).unwrap();
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
        // MiMo: `model.mtp_layers.0`, its block's tensors beside the fusion's.
        Some("mimo") => (
            "model.mtp_layers.0.".into(),
            vec![
                ("token_layernorm.weight", &ones),
                ("hidden_layernorm.weight", &ones),
                ("input_proj.weight", &proj),
                ("final_layernorm.weight", &ones),
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
    if mimo {
        // The MiMo fixture's greedy reply is mostly one token repeated, which the copied block
        // never drafts: with its output projections zeroed the block is its residual path, so
        // the head reads (nearly) the target's own hidden state and drafts the last token
        // again, right on the repeats and wrong before them.
        for name in ["self_attn.o_proj.weight", "mlp.down_proj.weight"] {
            let key = format!("{block}{name}");
            let zero = ops::zeros_like(&w[&key], None).unwrap();
            w.insert(key, zero);
        }
    }
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

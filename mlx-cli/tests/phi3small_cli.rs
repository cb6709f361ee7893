//! phi3small through the CLI: each compact fixture of `xtask/oracle/goldens_phi3small.py`
//! padded back to its 100,352-row embedding (the rows past the stored ones are zero, as mlx-lm
//! saved them), then `mlx generate --model DIR --prompt-ids ... --top-logprobs 5 --json
//! --max-tokens 8` prints mlx-lm 0.32.2's `generate_step` greedy ids, chosen log-probabilities
//! and per-step top-5 exactly. Golden: `tests/goldens/cli_phi3small.json`.

use std::path::{Path, PathBuf};

use mlx_core::{io, ops};
use serde_json::Value;

use crate::cli_golden;

fn here() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The compact fixture `src` as a full model directory `dst`.
fn materialize(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    let config = std::fs::read_to_string(src.join("config.json")).unwrap();
    let vocab = serde_json::from_str::<Value>(&config).unwrap()["vocab_size"]
        .as_i64()
        .unwrap() as i32;
    let (mut arrays, meta) = io::load_safetensors(src.join("model.safetensors"), None).unwrap();
    let key = "model.embed_tokens.weight";
    let emb = arrays.remove(key).unwrap();
    let s = emb.shape();
    let pad = ops::zeros(&[vocab - s[0], s[1]], emb.dtype(), None).unwrap();
    arrays.insert(
        key.to_string(),
        ops::concatenate(&[&emb, &pad], 0, None).unwrap(),
    );
    io::save_safetensors(
        dst.join("model.safetensors"),
        arrays.iter().map(|(k, v)| (k.as_str(), v)),
        &meta,
    )
    .unwrap();
    std::fs::write(dst.join("config.json"), config).unwrap();
}

#[test]
fn phi3small_reproduces_mlx_lm_top5_through_the_cli() {
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(here().join("tests/goldens/cli_phi3small.json")).unwrap(),
    )
    .unwrap();
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("phi3small_cli");
    std::fs::remove_dir_all(&work).ok();
    let mut failures = Vec::new();
    let cases = golden["cases"].as_object().unwrap();
    assert_eq!(cases.len(), 2);
    for (name, case) in cases {
        let full = work.join("full").join(name);
        materialize(&here().join("../mlx-models/tests/models").join(name), &full);
        if let Err(e) = cli_golden::check_case(&full, name, case, &work) {
            failures.push(format!("{name}: {e}"));
        }
    }
    std::fs::remove_dir_all(&work).ok();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

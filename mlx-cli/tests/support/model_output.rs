//! Comparing a written model directory with a golden's record of mlx-lm's (`describe` in
//! `xtask/oracle/goldens_convert.py`: each file's sha256, each tensor's dtype, shape and
//! sha256), for the convert and quant tests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Files we write as mlx-lm does: `tokenizer_config.json` and `chat_template.jinja` as
/// transformers' `save_pretrained` rewrites a `PreTrainedTokenizerFast` source's (every
/// fixture's tokenizer is one).
pub const COMPARED: [&str; 7] = [
    "config.json",
    "model.safetensors.index.json",
    "README.md",
    "tokenizer.json",
    "generation_config.json",
    "tokenizer_config.json",
    "chat_template.jinja",
];

/// The first 16 hex digits of the sha256 (what the goldens keep).
pub fn sha(bytes: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(bytes);
    format!("{:x}", h.finalize())[..16].to_string()
}

/// Each tensor of a safetensors file: `[dtype, shape, sha]` (and the metadata as it is).
pub fn tensor_table(path: &Path) -> BTreeMap<String, Value> {
    let data = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(data[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&data[8..8 + n]).unwrap();
    let base = 8 + n;
    header
        .into_iter()
        .map(|(k, v)| {
            if k == "__metadata__" {
                return (k, v);
            }
            let off = v["data_offsets"].as_array().unwrap();
            let (a, b) = (
                off[0].as_u64().unwrap() as usize,
                off[1].as_u64().unwrap() as usize,
            );
            let row = serde_json::json!([v["dtype"], v["shape"], sha(&data[base + a..base + b])]);
            (k, row)
        })
        .collect()
}

/// Compares our output directory with the golden's record of mlx-lm's; the differences.
pub fn compare(case: &str, ours: &Path, want: &Value) -> Vec<String> {
    let mut bad = Vec::new();
    for (name, entry) in want["files"].as_object().unwrap() {
        let p = ours.join(name);
        if !p.exists() {
            if COMPARED.contains(&name.as_str()) || name.ends_with(".safetensors") {
                bad.push(format!("{case}: {name} missing"));
            }
            continue;
        }
        if name.ends_with(".safetensors") {
            // The whole file, byte for byte (the tensors' data in the order mlx-lm lays it
            // out); the per-tensor table only says where a differing file differs.
            let bytes = std::fs::read(&p).unwrap();
            if sha(&bytes) == entry["sha256"].as_str().unwrap() {
                continue;
            }
            bad.push(format!(
                "{case}: {name} differs from mlx-lm's byte for byte"
            ));
            let got = tensor_table(&p);
            let want_t = entry["tensors"].as_object().unwrap();
            for (k, v) in want_t {
                match got.get(k) {
                    None => bad.push(format!("{case}: {name}: tensor {k} missing")),
                    Some(g) if g != v => {
                        bad.push(format!("{case}: {name}: {k}: ours {g}, mlx-lm {v}"))
                    }
                    _ => {}
                }
            }
            for k in got.keys().filter(|k| !want_t.contains_key(*k)) {
                bad.push(format!("{case}: {name}: unexpected tensor {k}"));
            }
        } else if COMPARED.contains(&name.as_str()) {
            let got = sha(&std::fs::read(&p).unwrap());
            if got != entry["sha256"].as_str().unwrap() {
                bad.push(format!(
                    "{case}: {name} differs:\n{}",
                    std::fs::read_to_string(&p).unwrap_or_default()
                ));
            }
        }
    }
    bad
}

/// A `+DIR` fixture as the golden scripts stage it: `tests/DIR`'s files copied into `staged`
/// with the tiny tokenizer's `tokenizer.json` and `tokenizer_config.json` beside them.
pub fn stage_with_tokenizer(tests: &Path, fixture: &str, staged: &Path) -> PathBuf {
    std::fs::create_dir_all(staged).unwrap();
    for e in std::fs::read_dir(tests.join(fixture)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), staged.join(e.file_name())).unwrap();
    }
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tests.join("models/tokenizer").join(f), staged.join(f)).unwrap();
    }
    staged.to_path_buf()
}

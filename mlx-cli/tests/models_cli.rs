//! The "done when" of issues #13 and #14 as a test: on every tiny seeded model fixture (each
//! descriptor-table row of `dense_goldens.rs`, each MoE/hybrid/Gemma 4 row of
//! `models_goldens.rs`, the llama fixtures), in the fixture's own stored dtype,
//! `mlx generate --model DIR --prompt-ids ... --top-logprobs 5 --json --max-tokens 8` prints
//! mlx-lm 0.32.2's greedy ids, chosen log-probabilities and per-step top-5 ids and
//! log-probabilities exactly (float32 bit patterns compared). Every `model_type` that
//! `mlx models` serves has a fixture. Goldens from mlx-lm's own `generate_step` through
//! `cargo xtask goldens cli_models`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde_json::Value;

use crate::cli_golden;

fn here() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn models() -> PathBuf {
    here().join("../mlx-models/tests/models")
}

/// A float printed by the CLI (an f32 widened to f64) as its float32 bit pattern.
fn f32_bits(v: &Value) -> Option<u32> {
    Some((v.as_f64()? as f32).to_bits())
}

/// The `model_type`s of the fixtures named by the other CLI golden files
/// (`tests/goldens/cli_*.json` beside `cli_models.json`, each with a `cases` object keyed by
/// fixture directories under mlx-models/tests/models).
fn other_cli_goldens_types() -> Vec<String> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(here().join("tests/goldens")) else {
        return out;
    };
    for entry in dir.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        if !file.starts_with("cli_") || !file.ends_with(".json") || file == "cli_models.json" {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let Ok(golden) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        let Some(cases) = golden["cases"].as_object() else {
            continue;
        };
        for name in cases.keys() {
            let config = std::fs::read_to_string(models().join(name).join("config.json"))
                .ok()
                .and_then(|c| serde_json::from_str::<Value>(&c).ok());
            if let Some(t) = config.as_ref().and_then(|c| c["model_type"].as_str()) {
                out.push(t.to_string());
            }
        }
    }
    out
}

#[test]
fn every_model_fixture_reproduces_mlx_lm_top5_through_the_cli() {
    // `cli_models.json`, then each family's own golden (`cli_models_<family>.json`, e.g. the
    // MLA fixtures under `mlx-models/tests/models/mla/`), whose case names are fixture paths.
    let mut files: Vec<PathBuf> = std::fs::read_dir(here().join("tests/goldens"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("cli_models") && n.ends_with(".json"))
        })
        .collect();
    files.sort();
    let goldens: Vec<Value> = files
        .iter()
        .map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap())
        .collect();
    let cases: Vec<(&String, &Value)> = goldens
        .iter()
        .flat_map(|g| g["cases"].as_object().unwrap().iter())
        .collect();
    // Every model_type `mlx models` serves (table rows and dedicated ports; aliases aside)
    // has at least one fixture here.
    assert!(cases.len() >= 90, "only {} fixtures", cases.len());
    let model_type = |dir: PathBuf| {
        let c: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        c["model_type"].as_str().unwrap().to_string()
    };
    // Issue #32's dense fixtures are checked by `dense2_cli.rs` from their own golden.
    let dense2: Value = serde_json::from_str(
        &std::fs::read_to_string(here().join("tests/goldens/cli_dense2.json")).unwrap(),
    )
    .unwrap();
    let mut covered: std::collections::BTreeSet<String> = cases
        .iter()
        .map(|(name, _)| *name)
        .chain(dense2["cases"].as_object().unwrap().keys())
        .map(|name| model_type(models().join(name)))
        .collect();
    // The fixtures of the other CLI golden sets (`cli_<set>.json` naming its folder under
    // mlx-models/tests/models in `fixture_dir`), which their own test files run.
    for e in std::fs::read_dir(here().join("tests/goldens")).unwrap() {
        let path = e.unwrap().path();
        let Some(file) = path.file_name().and_then(|f| f.to_str()) else {
            continue;
        };
        if !file.starts_with("cli_") || !file.ends_with(".json") || file == "cli_models.json" {
            continue;
        }
        let set: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let Some(dir) = set["fixture_dir"].as_str() else {
            continue;
        };
        for name in set["cases"].as_object().into_iter().flat_map(|c| c.keys()) {
            covered.insert(model_type(models().join(dir).join(name)));
        }
    }
    // Families whose CLI goldens live in their own file (`cli_moe2.json`, checked by
    // `moe2_cli.rs`): their fixtures cover their types too.
    covered.extend(other_cli_goldens_types());
    let listed = Command::new(env!("CARGO_BIN_EXE_mlx"))
        .args(["models", "--json"])
        .output()
        .unwrap();
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let served: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["via"].is_null() && t["serving"] != "none")
        .map(|t| t["model_type"].as_str().unwrap())
        .collect();
    assert!(served.len() >= 50, "{served:?}");
    let missing: Vec<&&str> = served.iter().filter(|t| !covered.contains(**t)).collect();
    assert!(
        missing.is_empty(),
        "served types without a fixture: {missing:?}"
    );
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("models_cli");
    std::fs::remove_dir_all(&work).ok();
    // Two workers: the fixtures are tiny, so process start and loading dominate.
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some((name, case)) = cases.get(i) else {
                    break;
                };
                if let Err(e) = cli_golden::check_case(&models().join(name), name, case, &work) {
                    failures.lock().unwrap().push(format!("{name}: {e}"));
                }
            });
        }
    });
    std::fs::remove_dir_all(&work).ok();
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} fixtures differ from mlx-lm:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    eprintln!(
        "{} fixtures: ids, logprobs and top-5 equal to mlx-lm",
        cases.len()
    );
}

/// `mlx embed` on the dense qwen3 fixture prints the golden's unit vectors bit for bit. The
/// golden is sentence-transformers' Qwen3-Embedding pipeline as its configuration describes it
/// (last-token pooling, then `Normalize`) over mlx-lm's own inner model: sentence-transformers
/// itself is not installed in the oracle venv (see `goldens_cli_models.py`).
#[test]
fn embed_prints_the_golden_vectors() {
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(here().join("tests/goldens/cli_models.json")).unwrap(),
    )
    .unwrap();
    let g = &golden["embed"];
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("models_cli_embed");
    std::fs::remove_dir_all(&work).ok();
    let model = g["model"].as_str().unwrap();
    let dir = cli_golden::prepare(&models().join(model), model, &work).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mlx"));
    cmd.args(["embed", "--model"])
        .arg(&dir)
        .args(["--dtype", "stored"]);
    for t in g["texts"].as_array().unwrap() {
        cmd.args(["--text", t.as_str().unwrap()]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["token_ids"], g["token_ids"]);
    let bits: Vec<Vec<Option<u32>>> = got["embeddings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row.as_array().unwrap().iter().map(f32_bits).collect())
        .collect();
    let want: Vec<Vec<Option<u32>>> = g["embedding_bits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().map(|b| b as u32))
                .collect()
        })
        .collect();
    assert_eq!(bits, want, "embeddings differ from the golden");

    // A missing --text is a clear error.
    let out = Command::new(env!("CARGO_BIN_EXE_mlx"))
        .args(["embed", "--model"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--text"));
    std::fs::remove_dir_all(&work).ok();
}

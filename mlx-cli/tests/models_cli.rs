//! The "done when" of issues #13 and #14 as a test: on every tiny seeded model fixture (each
//! descriptor-table row of `dense_goldens.rs`, each MoE/hybrid/Gemma 4 row of
//! `models_goldens.rs`, the llama fixtures), in the fixture's own stored dtype,
//! `mlx generate --model DIR --prompt-ids ... --top-logprobs 5 --json --max-tokens 8` prints
//! mlx-lm 0.32.2's greedy ids, chosen log-probabilities and per-step top-5 ids and
//! log-probabilities exactly (float32 bit patterns compared). Every `model_type` that
//! `mlx models` serves has a fixture. Goldens from mlx-lm's own `generate_step` through
//! `cargo xtask goldens cli_models`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde_json::Value;

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

/// The fixture copied into `work` with the word-level tokenizer beside it.
fn prepare(name: &str, work: &Path) -> Result<PathBuf, String> {
    let dir = work.join(name.replace('/', "_"));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let tok = here().join("tests/models/wordlevel");
    for (from, file) in [
        (models().join(name), "config.json"),
        (models().join(name), "model.safetensors"),
        (tok.clone(), "tokenizer.json"),
        (tok.clone(), "tokenizer_config.json"),
    ] {
        std::fs::copy(from.join(file), dir.join(file))
            .map_err(|e| format!("copying {}: {e}", from.join(file).display()))?;
    }
    Ok(dir)
}

/// Runs the CLI on one fixture and compares with its golden; `Err` describes the first
/// difference.
fn check(name: &str, case: &Value, work: &Path) -> Result<(), String> {
    let dir = prepare(name, work)?;
    let ids: Vec<String> = case["prompt_ids"]
        .as_array()
        .ok_or("golden: prompt_ids")?
        .iter()
        .map(|v| v.to_string())
        .collect();
    let out = Command::new(env!("CARGO_BIN_EXE_mlx"))
        .args(["generate", "--model"])
        .arg(&dir)
        .args(["--prompt-ids", &ids.join(",")])
        .args(["--max-tokens", "8", "--top-logprobs", "5", "--json"])
        .args(["--dtype", "stored"])
        .output()
        .map_err(|e| format!("running mlx: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mlx failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let got: Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("output is not JSON: {e}"))?;
    if got["tokens"] != case["tokens"] {
        return Err(format!(
            "greedy ids {} != mlx-lm's {}",
            got["tokens"], case["tokens"]
        ));
    }
    let steps = case["tokens"].as_array().map_or(0, Vec::len);
    for s in 0..steps {
        let ours = f32_bits(&got["logprobs"][s]);
        let want = case["logprobs"][s][1].as_u64().map(|b| b as u32);
        if ours.is_none() || ours != want {
            return Err(format!(
                "step {s}: chosen logprob {} != mlx-lm's {}",
                got["logprobs"][s], case["logprobs"][s][0]
            ));
        }
        let ours_top: Vec<(Option<u64>, Option<u32>)> = got["top_logprobs"][s]
            .as_array()
            .ok_or(format!("step {s}: no top_logprobs"))?
            .iter()
            .map(|p| (p[0].as_u64(), f32_bits(&p[1])))
            .collect();
        let want_top: Vec<(Option<u64>, Option<u32>)> = case["top_logprobs"][s]
            .as_array()
            .ok_or("golden: top_logprobs")?
            .iter()
            .map(|p| (p[0].as_u64(), p[2].as_u64().map(|b| b as u32)))
            .collect();
        if ours_top != want_top {
            return Err(format!(
                "step {s}: top-5 {} != mlx-lm's {}",
                got["top_logprobs"][s], case["top_logprobs"][s]
            ));
        }
    }
    Ok(())
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
    let mut covered: std::collections::BTreeSet<String> = cases
        .iter()
        .map(|(name, _)| model_type(models().join(name)))
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
    let listed = Command::new(env!("CARGO_BIN_EXE_mlx"))
        .args(["models", "--json"])
        .output()
        .unwrap();
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let served: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["via"].is_null())
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
                if let Err(e) = check(name, case, &work) {
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
    let dir = prepare(g["model"].as_str().unwrap(), &work).unwrap();
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

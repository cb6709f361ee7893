//! Issue #32's fixtures through the CLI: on each tiny seeded model of
//! `xtask/oracle/goldens_dense2.py`, in its stored dtype, `mlx generate --model DIR
//! --prompt-ids ... --top-logprobs 5 --json --max-tokens 8` prints mlx-lm 0.32.2's
//! `generate_step` greedy ids, chosen log-probabilities and per-step top-5 exactly (float32
//! bit patterns compared). Golden: `tests/goldens/cli_dense2.json`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde_json::Value;

fn here() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn bits(v: &Value) -> Option<u32> {
    Some((v.as_f64()? as f32).to_bits())
}

fn check(name: &str, case: &Value, work: &Path) -> Result<(), String> {
    let dir = work.join(name.replace('/', "_"));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let model = here().join("../mlx-models/tests/models").join(name);
    let tok = here().join("tests/models/wordlevel");
    for (from, file) in [
        (&model, "config.json"),
        (&model, "model.safetensors"),
        (&tok, "tokenizer.json"),
        (&tok, "tokenizer_config.json"),
    ] {
        std::fs::copy(from.join(file), dir.join(file)).map_err(|e| format!("{file}: {e}"))?;
    }
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
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let got: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    if got["tokens"] != case["tokens"] {
        return Err(format!(
            "ids {} != mlx-lm's {}",
            got["tokens"], case["tokens"]
        ));
    }
    for s in 0..case["tokens"].as_array().map_or(0, Vec::len) {
        let want = case["logprobs"][s][1].as_u64().map(|b| b as u32);
        if bits(&got["logprobs"][s]) != want {
            return Err(format!("step {s}: logprob {}", got["logprobs"][s]));
        }
        let top = |v: &Value, bit_at: usize| -> Vec<(Option<u64>, Option<u32>)> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .map(|p| {
                            let b = if bit_at == 1 {
                                bits(&p[1])
                            } else {
                                p[2].as_u64().map(|b| b as u32)
                            };
                            (p[0].as_u64(), b)
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        if top(&got["top_logprobs"][s], 1) != top(&case["top_logprobs"][s], 2) {
            return Err(format!(
                "step {s}: top-5 {} != mlx-lm's {}",
                got["top_logprobs"][s], case["top_logprobs"][s]
            ));
        }
    }
    Ok(())
}

#[test]
fn every_dense2_fixture_reproduces_mlx_lm_top5_through_the_cli() {
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(here().join("tests/goldens/cli_dense2.json")).unwrap(),
    )
    .unwrap();
    let cases: Vec<(&String, &Value)> = golden["cases"].as_object().unwrap().iter().collect();
    assert!(cases.len() >= 10, "only {} fixtures", cases.len());
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dense2_cli");
    std::fs::remove_dir_all(&work).ok();
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                while let Some((name, case)) = cases.get(next.fetch_add(1, Ordering::SeqCst)) {
                    if let Err(e) = check(name, case, &work) {
                        failures.lock().unwrap().push(format!("{name}: {e}"));
                    }
                }
            });
        }
    });
    std::fs::remove_dir_all(&work).ok();
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `mlx models` lists mlx-lm's types that are not served, each with why: the ones mlx-lm
/// itself cannot run on MLX's CPU backend apart from the rest.
#[test]
fn models_lists_unserved_types_with_the_reason() {
    let out = Command::new(env!("CARGO_BIN_EXE_mlx"))
        .args(["models", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    let row = |t: &str| rows.iter().find(|r| r["model_type"] == t).cloned();
    let muse = row("muse_spark").expect("muse_spark listed");
    assert_eq!(muse["serving"], "none");
    assert_eq!(muse["unserved"], "no-cpu");
    assert!(muse["reason"].as_str().unwrap().contains("Metal"), "{muse}");
    assert_eq!(row("plamo3").unwrap()["serving"], "table");
    assert_eq!(row("lfm2-vl").unwrap()["serving"], "dedicated");
    let text = Command::new(env!("CARGO_BIN_EXE_mlx"))
        .arg("models")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("muse_spark") && l.contains("cannot run on MLX's CPU backend")),
        "{text}"
    );
}

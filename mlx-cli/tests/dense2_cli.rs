//! Issue #32's fixtures through the CLI: on each tiny seeded model of
//! `xtask/oracle/goldens_dense2.py`, in its stored dtype, `mlx generate --model DIR
//! --prompt-ids ... --top-logprobs 5 --json --max-tokens 8` prints mlx-lm 0.32.2's
//! `generate_step` greedy ids, chosen log-probabilities and per-step top-5 exactly (float32
//! bit patterns compared). Golden: `tests/goldens/cli_dense2.json`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde_json::Value;

use crate::cli_golden;

fn here() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
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
                    if let Err(e) = cli_golden::check_case(
                        &here().join("../mlx-models/tests/models").join(name),
                        name,
                        case,
                        &work,
                    ) {
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

//! Issue #32's later mixture-of-experts rows through the CLI: on each tiny seeded fixture of
//! `xtask/oracle/goldens_moe2.py` (mlx-models/tests/models/moe2/*, float32 and 4-bit),
//! `mlx generate --model DIR --prompt-ids ... --top-logprobs 5 --json --max-tokens 8` prints
//! mlx-lm 0.32.2's `generate_step` greedy ids, chosen log-probabilities and per-step top-5 ids
//! and log-probabilities exactly (float32 bit patterns compared).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn here() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn golden() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(here().join("tests/goldens/cli_moe2.json")).unwrap(),
    )
    .unwrap()
}

/// One top-5 entry: the id and the float32 bits of its log-probability.
type TopPair = (Option<u64>, Option<u32>);

/// A float printed by the CLI (an f32 widened to f64) as its float32 bit pattern.
fn f32_bits(v: &Value) -> Option<u32> {
    Some((v.as_f64()? as f32).to_bits())
}

/// The fixture copied into `work` with the word-level tokenizer beside it.
fn prepare(name: &str, work: &Path) -> Result<PathBuf, String> {
    let dir = work.join(name.replace('/', "_"));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let models = here().join("../mlx-models/tests/models");
    let tok = here().join("tests/models/wordlevel");
    for (from, file) in [
        (models.join(name), "config.json"),
        (models.join(name), "model.safetensors"),
        (tok.clone(), "tokenizer.json"),
        (tok, "tokenizer_config.json"),
    ] {
        std::fs::copy(from.join(file), dir.join(file))
            .map_err(|e| format!("copying {}: {e}", from.join(file).display()))?;
    }
    Ok(dir)
}

/// Runs the CLI on one fixture and compares with its golden; `Err` names the first difference.
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
        let pairs = |v: &Value, bits_at: usize| -> Result<Vec<TopPair>, String> {
            Ok(v.as_array()
                .ok_or(format!("step {s}: no top_logprobs"))?
                .iter()
                .map(|p| {
                    let b = if bits_at == 1 {
                        f32_bits(&p[1])
                    } else {
                        p[bits_at].as_u64().map(|b| b as u32)
                    };
                    (p[0].as_u64(), b)
                })
                .collect())
        };
        if pairs(&got["top_logprobs"][s], 1)? != pairs(&case["top_logprobs"][s], 2)? {
            return Err(format!(
                "step {s}: top-5 {} != mlx-lm's {}",
                got["top_logprobs"][s], case["top_logprobs"][s]
            ));
        }
    }
    Ok(())
}

/// Every fixture of `model_type`s `types` (as its config names them) against the golden.
fn check_types(types: &[&str]) {
    let golden = golden();
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("moe2_cli_{}", types[0]));
    std::fs::remove_dir_all(&work).ok();
    let models = here().join("../mlx-models/tests/models");
    let mut failures = Vec::new();
    let mut seen = 0;
    for (name, case) in golden["cases"].as_object().unwrap() {
        let config: Value = serde_json::from_str(
            &std::fs::read_to_string(models.join(name).join("config.json")).unwrap(),
        )
        .unwrap();
        if !types.contains(&config["model_type"].as_str().unwrap()) {
            continue;
        }
        seen += 1;
        if let Err(e) = check(name, case, &work) {
            failures.push(format!("{name}: {e}"));
        }
    }
    std::fs::remove_dir_all(&work).ok();
    assert!(seen >= 2, "only {seen} fixtures of {types:?}");
    assert!(
        failures.is_empty(),
        "{} fixtures differ from mlx-lm:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn granitemoe_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["granitemoe"]);
}

#[test]
fn minimax_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["minimax", "minimax_m2"]);
}

#[test]
fn ernie4_5_moe_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["ernie4_5_moe"]);
}

#[test]
fn phimoe_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["phimoe"]);
}

#[test]
fn klear_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["Klear"]);
}

#[test]
fn hunyuan_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["hunyuan"]);
}

#[test]
fn lfm2_moe_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["lfm2_moe"]);
}

#[test]
fn dbrx_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["dbrx"]);
}

#[test]
fn llama4_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["llama4"]);
}

#[test]
fn mellum_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["mellum"]);
}

#[test]
fn exaone_moe_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["exaone_moe"]);
}

#[test]
fn bailing_moe_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["bailing_moe"]);
}

#[test]
fn afmoe_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["afmoe"]);
}

#[test]
fn laguna_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["laguna"]);
}

/// `mlx models` lists each of these types as served by a dedicated port.
#[test]
fn mlx_models_lists_the_moe2_types() {
    let out = Command::new(env!("CARGO_BIN_EXE_mlx"))
        .args(["models", "--json"])
        .output()
        .unwrap();
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed = listed.as_array().unwrap();
    for t in [
        "granitemoe",
        "minimax",
        "minimax_m2",
        "ernie4_5_moe",
        "phimoe",
        "Klear",
        "hunyuan",
        "lfm2_moe",
        "dbrx",
        "llama4",
        "mellum",
        "exaone_moe",
        "bailing_moe",
        "afmoe",
        "laguna",
    ] {
        assert!(
            listed.iter().any(|e| e["model_type"] == t),
            "`mlx models` does not list {t}"
        );
    }
}

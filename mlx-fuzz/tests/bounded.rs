//! The bounded CI pass: a few hundred inputs per target (the long runs are `cargo xtask
//! fuzz`). Any panic, abort or memory past the cap fails it; the hang watchdog is off here
//! (tests do not depend on timing), the long runs have it.

use mlx_fuzz::targets::TARGETS;
use mlx_fuzz::{run, RunOptions};

#[test]
fn every_target_survives_a_short_run() {
    let work = std::env::temp_dir().join(format!("mlx-fuzz-ci-{}", std::process::id()));
    let runs = std::env::var("MLX_FUZZ_CI_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    let mut failures = Vec::new();
    for t in TARGETS {
        let r = run(
            t,
            &work,
            &RunOptions {
                runs,
                seed: 7,
                hang_limit: None,
                ..Default::default()
            },
        )
        .unwrap();
        eprintln!("{r}");
        assert_eq!(r.executions, runs);
        failures.extend(
            r.findings
                .iter()
                .map(|(i, m)| format!("{t} input {i}: {m}")),
        );
    }
    let _ = std::fs::remove_dir_all(&work);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

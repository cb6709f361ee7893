//! L1 pieces against the oracle (`goldens/train_misc.safetensors`): numpy's legacy
//! `np.random.permutation` after `np.random.seed`, `optim.clip_grad_norm`, and mlx-lm's
//! `build_schedule` (warmup joined to cosine, linear, exponential and step decay).

use std::path::PathBuf;

use mlx_core::prelude::*;
use mlx_core::testing::Goldens;
use mlx_train::nprand::NumpyRandom;
use mlx_train::optim::{build_schedule, clip_grad_norm, ScheduleConfig};
use serde_json::json;

fn goldens() -> Goldens {
    Goldens::load(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/goldens/train_misc.safetensors"),
    )
    .unwrap()
}

#[test]
fn numpy_permutations() {
    let g = goldens();
    for (seed, n, draws) in [
        (0u32, 5usize, 3usize),
        (7, 1, 2),
        (3, 37, 2),
        (12345, 1000, 1),
    ] {
        let mut rng = NumpyRandom::new(seed);
        let got: Vec<i32> = (0..draws)
            .flat_map(|_| rng.permutation(n))
            .map(|i| i as i32)
            .collect();
        let got = Array::from_slice(&got, &[draws as i32, n as i32]).unwrap();
        g.case(&format!("perm_{seed}_{n}"))
            .unwrap()
            .check(&[got])
            .unwrap();
    }
}

#[test]
fn clip_grad_norm_matches() {
    let g = goldens();
    for (label, max_norm) in [("0_5", 0.5), ("100_0", 100.0)] {
        let c = g.case(&format!("clip_{label}")).unwrap();
        let grads = ParamMap::from([
            ("a".to_string(), c.input(0).unwrap().clone()),
            ("b.c".to_string(), c.input(1).unwrap().clone()),
        ]);
        let (clipped, norm) = clip_grad_norm(&grads, max_norm).unwrap();
        c.check(&[clipped["a"].clone(), clipped["b.c"].clone(), norm])
            .unwrap();
    }
    assert!(clip_grad_norm(&ParamMap::new(), -1.0).is_err());
}

#[test]
fn schedules_match() {
    let g = goldens();
    let configs = [
        (
            "cosine_warmup",
            json!({"name": "cosine_decay", "arguments": [2e-2, 6, 1e-3], "warmup": 2}),
        ),
        (
            "cosine",
            json!({"name": "cosine_decay", "arguments": [1e-3, 10]}),
        ),
        (
            "linear_warmup_init",
            json!({"name": "linear_schedule", "arguments": [1e-2, 1e-4, 5], "warmup": 3, "warmup_init": 1e-5}),
        ),
        (
            "exp",
            json!({"name": "exponential_decay", "arguments": [1e-2, 0.9]}),
        ),
        (
            "step",
            json!({"name": "step_decay", "arguments": [1e-2, 0.5, 3]}),
        ),
    ];
    for (label, cfg) in configs {
        let cfg: ScheduleConfig = serde_json::from_value(cfg).unwrap();
        let s = build_schedule(&cfg).unwrap();
        let vals: Vec<Array> = (0..12)
            .map(|i| s.at(&Array::from_int(i, Dtype::Uint64).unwrap()).unwrap())
            .collect();
        let refs: Vec<&Array> = vals.iter().collect();
        let got = ops::stack(&refs, 0, None).unwrap();
        g.case(&format!("sched_{label}"))
            .unwrap()
            .check(&[got])
            .unwrap_or_else(|m| panic!("{label}: {m}"));
    }
    let bad: ScheduleConfig =
        serde_json::from_value(json!({"name": "nope", "arguments": [1.0]})).unwrap();
    assert!(build_schedule(&bad).is_err());
}

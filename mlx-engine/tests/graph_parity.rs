//! The graphs `generate_step` evaluates equal mlx-lm's, primitive for primitive (kinds and
//! counts, on the CPU): goldens from `cargo xtask goldens graph`
//! (`xtask/oracle/goldens_graph.py`, which wraps `mx.eval`/`mx.async_eval` around mlx-lm's own
//! `generate_step`). Ours are seen through `GenerateOptions::eval_probe`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use mlx_core::graph;
use mlx_engine::generate::{generate_step, EvalProbe, GenerateOptions};
use mlx_engine::sample::Sampler;
use mlx_models::load::{load_model_dir, LoadOptions};
use serde_json::Value;

type Counts = BTreeMap<String, usize>;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Ours: (mlx-lm's name for the call, primitive counts) per evaluated graph.
fn ours(
    model: &str,
    prompt: &[i32],
    prefill_step_size: usize,
    max_tokens: usize,
) -> Vec<(String, Counts)> {
    let dir = root().join("../mlx-models/tests/models").join(model);
    let (m, _) = load_model_dir(&dir, &LoadOptions::default()).unwrap();
    let seen: Arc<Mutex<Vec<(String, Counts)>>> = Arc::default();
    let sink = Arc::clone(&seen);
    let opts = GenerateOptions {
        max_tokens: Some(max_tokens),
        sampler: Sampler::greedy(),
        prefill_step_size,
        eval_probe: Some(EvalProbe(Arc::new(move |what, arrays| {
            let dot = graph::to_dot(arrays.iter().copied()).unwrap();
            let call = if what == "prefill" {
                "eval"
            } else {
                "async_eval"
            };
            sink.lock()
                .unwrap()
                .push((call.to_string(), graph::primitive_counts(&dot)));
        }))),
        ..GenerateOptions::default()
    };
    for step in generate_step(prompt, m.as_ref(), None, opts).unwrap() {
        step.unwrap();
    }
    let out = seen.lock().unwrap().clone();
    out
}

fn diff(ours: &Counts, theirs: &Counts) -> Vec<String> {
    let kinds: std::collections::BTreeSet<&String> = ours.keys().chain(theirs.keys()).collect();
    kinds
        .into_iter()
        .filter_map(|k| {
            let (a, b) = (
                ours.get(k).copied().unwrap_or(0),
                theirs.get(k).copied().unwrap_or(0),
            );
            (a != b).then(|| format!("{k}: ours {a}, mlx-lm {b}"))
        })
        .collect()
}

#[test]
fn generate_step_builds_the_graphs_mlx_lm_builds() {
    let text = std::fs::read_to_string(root().join("tests/goldens/graph.json")).unwrap();
    let g: Value = serde_json::from_str(&text).unwrap();
    let prompt: Vec<i32> = g["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap() as i32)
        .collect();
    let step = g["prefill_step_size"].as_u64().unwrap() as usize;
    let max_tokens = g["max_tokens"].as_u64().unwrap() as usize;
    let mut failures = Vec::new();
    for (model, graphs) in g["models"].as_object().unwrap() {
        let theirs: Vec<(String, Counts)> = graphs
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let counts = e[1]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_u64().unwrap() as usize))
                    .collect();
                (e[0].as_str().unwrap().to_string(), counts)
            })
            .collect();
        let ours = ours(model, &prompt, step, max_tokens);
        if ours.len() != theirs.len() {
            failures.push(format!(
                "{model}: {} graphs evaluated, mlx-lm {}: {:?} vs {:?}",
                ours.len(),
                theirs.len(),
                ours.iter().map(|o| &o.0).collect::<Vec<_>>(),
                theirs.iter().map(|o| &o.0).collect::<Vec<_>>()
            ));
            continue;
        }
        for (i, ((oc, o), (tc, t))) in ours.iter().zip(&theirs).enumerate() {
            let d = diff(o, t);
            if oc != tc || !d.is_empty() {
                failures.push(format!("{model} graph {i} ({oc} / {tc}): {}", d.join("; ")));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

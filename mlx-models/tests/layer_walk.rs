//! The layers' parameter enumeration, for every tiny model under `tests/models/`: the
//! adaptable linears of each decoder layer (`Trainable::layer_adaptables_mut`: name,
//! plain or switch, in order: LoRA's draws follow it) and every array of each layer
//! (`Trainable::layer_parameters_mut`: full name, shape, quantized or not).
//!
//! `tests/snapshots/layer_walk.txt` was written by this test (`LAYER_WALK_WRITE=1 cargo test
//! -p mlx-models --test integration layer_walk::`) from the hand-written enumerators before one walker
//! replaced them; the test proves the walker lists the same linears in the same order and
//! the same arrays. The arrays' order is compared as a set: their consumers (full
//! fine-tuning's `ParamMap`, adapter file checks, the checkpoints' own inputs) look them up
//! by name or read them back in the order they were taken; the walker lists them in mlx-lm's
//! declaration order, as `tree_flatten(layer.parameters())` does.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use mlx_models::layers::LinearMut;
use mlx_models::load::{load_model_dir, LoadOptions};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn model_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    if entries.iter().any(|p| p.ends_with("config.json")) {
        out.push(dir.to_path_buf());
    }
    for e in entries {
        if e.is_dir() {
            model_dirs(&e, out);
        }
    }
}

/// One model's listing: `L <layer> <name> <linear|switch>` lines, then `P <name> <shape>
/// <q?>` lines (params sorted by name within a layer when `sorted`).
fn listing(dir: &Path, sorted: bool) -> String {
    let mut s = String::new();
    let (mut model, _) = match load_model_dir(dir, &LoadOptions::default()) {
        Ok(m) => m,
        Err(_) => {
            s.push_str("not loaded\n");
            return s;
        }
    };
    // A model without parameter access lists nothing.
    let Some(model) = model.as_trainable_mut() else {
        return s;
    };
    for (i, layer) in model.layer_adaptables_mut().into_iter().enumerate() {
        for (name, l) in layer {
            let kind = match l {
                LinearMut::Linear(_) => "linear",
                LinearMut::Switch(_) => "switch",
            };
            let _ = writeln!(s, "L {i} {name} {kind}");
        }
    }
    match model.layer_parameters_mut() {
        Ok(layers) => {
            for layer in layers {
                let mut lines: Vec<String> = layer
                    .into_iter()
                    .map(|p| {
                        format!(
                            "P {} {:?} {}",
                            p.name,
                            p.value.shape(),
                            if p.quantized { "q" } else { "-" }
                        )
                    })
                    .collect();
                if sorted {
                    lines.sort();
                }
                for l in lines {
                    let _ = writeln!(s, "{l}");
                }
            }
        }
        Err(e) => {
            let _ = writeln!(s, "parameters: {e}");
        }
    }
    s
}

#[test]
fn walker_lists_what_the_enumerators_listed() {
    let models = root().join("models");
    let mut dirs = Vec::new();
    model_dirs(&models, &mut dirs);
    let mut all = String::new();
    for d in &dirs {
        let rel = d.strip_prefix(&models).unwrap_or(d).display().to_string();
        let _ = writeln!(all, "# {rel}");
        all.push_str(&listing(d, true));
    }
    let snap = root().join("snapshots/layer_walk.txt");
    if std::env::var_os("LAYER_WALK_WRITE").is_some() {
        std::fs::create_dir_all(snap.parent().unwrap()).unwrap();
        std::fs::write(&snap, &all).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&snap).expect("tests/snapshots/layer_walk.txt");
    if want != all {
        let diff: Vec<String> = want
            .lines()
            .zip(all.lines())
            .filter(|(a, b)| a != b)
            .take(20)
            .map(|(a, b)| format!("snapshot: {a}\n     now: {b}"))
            .collect();
        panic!(
            "the layers' enumeration changed ({} vs {} lines):\n{}",
            want.lines().count(),
            all.lines().count(),
            diff.join("\n")
        );
    }
}

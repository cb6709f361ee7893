//! Loading errors: each names what is wrong and where, never a panic.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_core::io::{load_safetensors, save_safetensors};
use mlx_core::prelude::*;
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::ModelError;

fn src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/models/dense_f32")
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mlx-models-err-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(src().join("config.json"), d.join("config.json")).unwrap();
    d
}

fn write_weights(dir: &Path, edit: impl FnOnce(&mut BTreeMap<String, Array>)) {
    let (mut w, _) = load_safetensors(src().join("model.safetensors"), None).unwrap();
    edit(&mut w);
    save_safetensors(
        dir.join("model.safetensors"),
        w.iter().map(|(k, v)| (k.as_str(), v)),
        &BTreeMap::new(),
    )
    .unwrap();
}

fn load_err(dir: &Path) -> String {
    match load_model_dir(dir, &LoadOptions::default()) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn missing_extra_and_misshaped_tensors_are_listed_together() {
    let d = scratch("weights");
    write_weights(&d, |w| {
        w.remove("model.layers.1.mlp.up_proj.weight");
        w.insert(
            "model.layers.0.extra.weight".into(),
            Array::from_slice(&[1.0f32], &[1]).unwrap(),
        );
        w.insert(
            "model.norm.weight".into(),
            Array::from_slice(&[1.0f32; 3], &[3]).unwrap(),
        );
    });
    let e = load_err(&d);
    assert!(
        e.contains("missing: model.layers.1.mlp.up_proj.weight"),
        "{e}"
    );
    assert!(e.contains("unexpected: model.layers.0.extra.weight"), "{e}");
    assert!(
        e.contains("wrong shape: model.norm.weight: shape [3], expected [64]"),
        "{e}"
    );
}

#[test]
fn unknown_model_type_names_the_supported_ones() {
    let d = scratch("type");
    write_weights(&d, |_| {});
    let cfg = std::fs::read_to_string(d.join("config.json"))
        .unwrap()
        .replace("\"llama\"", "\"not_a_model\"");
    std::fs::write(d.join("config.json"), cfg).unwrap();
    let e = load_err(&d);
    assert!(e.contains("not_a_model") && e.contains("llama"), "{e}");
}

#[test]
fn malformed_config_is_an_error() {
    let d = scratch("config");
    write_weights(&d, |_| {});
    std::fs::write(
        d.join("config.json"),
        "{\"model_type\": \"llama\", \"hidden_size\": ",
    )
    .unwrap();
    let e = load_err(&d);
    assert!(e.contains("config.json") && e.contains("JSON"), "{e}");
    std::fs::write(d.join("config.json"), "{\"model_type\": \"llama\"}").unwrap();
    let e = load_err(&d);
    assert!(e.contains("hidden_size"), "{e}");
    std::fs::write(d.join("config.json"), "[1, 2]").unwrap();
    assert!(load_err(&d).contains("object"));
}

#[test]
fn truncated_weights_file_is_an_error() {
    let d = scratch("truncated");
    let bytes = std::fs::read(src().join("model.safetensors")).unwrap();
    std::fs::write(d.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    let r = load_model_dir(&d, &LoadOptions::default()).and_then(|(m, _)| {
        m.forward(&Array::from_slice(&[1i32, 2], &[1, 2])?, None)?
            .eval()?;
        Ok(())
    });
    let e = r.expect_err("a truncated file must not load");
    assert!(!e.to_string().is_empty());
    let _: &ModelError = &e;
}

#[test]
fn missing_files_are_errors() {
    let d = scratch("nofiles");
    assert!(load_err(&d).contains("safetensors"));
    std::fs::remove_file(d.join("config.json")).unwrap();
    assert!(load_err(&d).contains("config.json"));
}

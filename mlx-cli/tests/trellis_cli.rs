//! `mlx convert --q-mode trellis` on the tiny seeded llama: the config's quantization block,
//! the stored tensors, loading, `-d` back to dense, logits nearer the source's with more bits,
//! and the refusals.

use crate::support;
use support::mlx;

use std::path::{Path, PathBuf};

use mlx_core::prelude::*;
use mlx_models::load::{load_model_dir, LoadOptions};
use serde_json::Value;

fn src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/convert/llama")
}

fn logits(dir: &Path) -> Vec<f32> {
    let (model, _) = load_model_dir(dir, &LoadOptions::default()).unwrap();
    let ids = Array::from_slice(&[1i32, 5, 9, 17, 33, 60, 2, 4], &[1, 8]).unwrap();
    let y = model
        .forward(&ids, None)
        .unwrap()
        .astype(Dtype::Float32)
        .unwrap();
    y.eval().unwrap();
    y.as_slice::<f32>().unwrap().to_vec()
}

fn rel(a: &[f32], b: &[f32]) -> f32 {
    let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f32 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

#[test]
fn trellis_conversions_load_dequantize_and_improve_with_bits() {
    let out = std::env::temp_dir().join(format!("mlx-trellis-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let source = logits(&src());
    let mut errors = Vec::new();
    for bits in ["2", "3", "4"] {
        let dst = out.join(format!("t{bits}"));
        let (code, stdout, stderr) = mlx(&[
            "convert",
            "--hf-path",
            src().to_str().unwrap(),
            "--mlx-path",
            dst.to_str().unwrap(),
            "-q",
            "--q-mode",
            "trellis",
            "--q-bits",
            bits,
            "--q-trellis-l",
            "10",
            "--q-seed",
            "7",
        ]);
        assert_eq!(code, 0, "{stderr}");
        assert!(stdout.contains("bits per weight"), "{stdout}");
        let config: Value =
            serde_json::from_str(&std::fs::read_to_string(dst.join("config.json")).unwrap())
                .unwrap();
        let q = &config["quantization"];
        assert_eq!(q["mode"], "trellis");
        assert_eq!(q["bits"].as_i64(), Some(bits.parse().unwrap()));
        assert_eq!(q["group_size"], 64);
        assert_eq!(q["trellis_l"], 10);
        assert_eq!(q["seed"], 7);
        // The embedding is not a linear: affine 4-bit, as its own entry.
        assert_eq!(q["model.embed_tokens"]["mode"], "affine");
        assert_eq!(q["model.embed_tokens"]["bits"], 4);
        let tensors = mlx_core::io::load_safetensors(dst.join("model.safetensors"), None)
            .unwrap()
            .0;
        let w = &tensors["model.layers.0.mlp.down_proj.weight"];
        assert_eq!(w.dtype(), Dtype::Uint32);
        assert_eq!(w.shape(), vec![64, 128 * bits.parse::<i32>().unwrap() / 32]);
        assert_eq!(
            tensors["model.layers.0.mlp.down_proj.scales"].shape(),
            vec![64, 1]
        );

        let coded = logits(&dst);
        // `-d` gives the dense matrices the trellis layers multiply by.
        let dense = out.join(format!("d{bits}"));
        let (code, _, stderr) = mlx(&[
            "convert",
            "--hf-path",
            dst.to_str().unwrap(),
            "--mlx-path",
            dense.to_str().unwrap(),
            "-d",
        ]);
        assert_eq!(code, 0, "{stderr}");
        let config: Value =
            serde_json::from_str(&std::fs::read_to_string(dense.join("config.json")).unwrap())
                .unwrap();
        assert!(config.get("quantization").is_none());
        let back = logits(&dense);
        assert!(
            rel(&coded, &back) < 2e-3,
            "{bits} bits: {}",
            rel(&coded, &back)
        );
        errors.push(rel(&coded, &source));
    }
    assert!(errors[0] > errors[1] && errors[1] > errors[2], "{errors:?}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn trellis_options_are_checked_before_loading() {
    let dst = std::env::temp_dir().join(format!("mlx-trellis-refuse-{}", std::process::id()));
    let source = src();
    for (extra, want) in [
        (vec!["--q-bits", "5"], "trellis bits"),
        (vec!["--q-trellis-l", "17"], "L must be"),
        (vec!["--quant-predicate", "mixed_2_6"], "affine"),
        (vec!["--q-group-size", "20"], "32-bit words"),
    ] {
        let mut args = vec![
            "convert",
            "--hf-path",
            source.to_str().unwrap(),
            "--mlx-path",
            dst.to_str().unwrap(),
            "-q",
            "--q-mode",
            "trellis",
        ];
        args.extend(extra.iter().copied());
        let (code, _, stderr) = mlx(&args);
        assert_ne!(code, 0, "{extra:?}");
        assert!(stderr.contains(want), "{extra:?}: {stderr}");
        assert!(!dst.exists());
    }
}

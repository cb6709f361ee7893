//! safetensors and .npy through MLX's loaders: round trips, metadata, and bad files.

use std::collections::BTreeMap;

use mlx_core::io::{load_npy, load_safetensors, save_npy, save_safetensors};
use mlx_core::prelude::*;
use mlx_core::testing::assert_bit_equal;

fn tmpdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("mlx-core-io-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn safetensors_round_trip_with_metadata() {
    let dir = tmpdir("st");
    let a = Array::from_slice(&[bf16::from_f32(1.5), bf16::from_f32(-2.0)], &[2]).unwrap();
    let b = Array::from_slice(&[1i32, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
    let meta = BTreeMap::from([("format".to_string(), "mlx".to_string())]);
    let path = dir.join("x.safetensors");
    save_safetensors(&path, [("a", &a), ("b.weight", &b)], &meta).unwrap();
    let (arrays, m) = load_safetensors(&path, None).unwrap();
    assert_eq!(arrays.keys().collect::<Vec<_>>(), vec!["a", "b.weight"]);
    assert_bit_equal(&arrays["a"], &a).unwrap();
    assert_bit_equal(&arrays["b.weight"], &b).unwrap();
    assert_eq!(m, meta);
    // No temporary left beside it.
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

#[test]
fn npy_round_trip() {
    let dir = tmpdir("npy");
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let path = dir.join("a.npy");
    save_npy(&path, &a).unwrap();
    assert_bit_equal(&load_npy(&path, None).unwrap(), &a).unwrap();
}

#[test]
fn bad_files_are_errors() {
    let dir = tmpdir("bad");
    let missing = dir.join("nope.safetensors");
    let err = load_safetensors(&missing, None).expect_err("missing file");
    assert!(err.to_string().contains("nope.safetensors"), "{err}");

    // A header length that points past the end of the file.
    let bad = dir.join("bad.safetensors");
    std::fs::write(&bad, [0xff, 0, 0, 0, 0, 0, 0, 0, b'{', b'}']).unwrap();
    let err = load_safetensors(&bad, None).expect_err("malformed file");
    assert!(err.to_string().contains("bad.safetensors"), "{err}");

    // A valid file cut short: the header survives, the data does not.
    let good = dir.join("good.safetensors");
    let a = ops::ones(&[256], Dtype::Float32, None).unwrap();
    save_safetensors(&good, [("a", &a)], &BTreeMap::new()).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    let cut = dir.join("cut.safetensors");
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).unwrap();
    let err = load_safetensors(&cut, None).expect_err("a truncated file must not load");
    // MLX checks the header's offsets against the file size when opening it.
    assert!(err.to_string().contains("cut.safetensors"), "{err}");

    let err = load_npy(dir.join("nope.npy"), None).expect_err("missing npy");
    assert!(err.to_string().contains("nope.npy"), "{err}");
}

#[test]
fn bit_equality_reports_the_largest_difference() {
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let b = Array::from_slice(&[1.0f32, f32::from_bits(2.0f32.to_bits() + 1), 3.5], &[3]).unwrap();
    let msg = assert_bit_equal(&a, &b).unwrap_err();
    assert!(msg.contains("2 of 3 elements differ"), "{msg}");
    assert!(msg.contains("flat index 2"), "{msg}");
    assert!(assert_bit_equal(&a, &a.astype(Dtype::Float16).unwrap()).is_err());
    assert!(assert_bit_equal(&a, &a.reshape(&[3, 1]).unwrap()).is_err());
}

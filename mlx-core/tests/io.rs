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

/// A safetensors file from a header (JSON) and a data section.
fn raw_safetensors(path: &std::path::Path, header: &str, data: &[u8]) {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend(data);
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn safetensors_headers_mlx_would_misread_are_refused() {
    let dir = std::env::temp_dir().join(format!("mlx-core-st-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data = [0u8; 64];
    let case = |name: &str, header: &str| -> Result<usize, String> {
        let p = dir.join(name);
        raw_safetensors(&p, header, &data);
        match mlx_core::io::load_safetensors(&p, None) {
            Ok((a, _)) => Ok(a.len()),
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains(name), "the message should name the file: {e}");
                Err(e)
            }
        }
    };
    // Control: two tensors side by side.
    let ok = r#"{"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]},"b":{"dtype":"F32","shape":[8],"data_offsets":[32,64]}}"#;
    assert_eq!(case("ok.safetensors", ok), Ok(2));
    // Two tensors sharing bytes.
    let e = case(
        "shared.safetensors",
        r#"{"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]},"b":{"dtype":"F32","shape":[8],"data_offsets":[16,48]}}"#,
    )
    .unwrap_err();
    assert!(e.contains("share bytes"), "{e}");
    // A hole between two tensors: the format (and its reference crate) wants the byte ranges to
    // tile the data from its start.
    let e = case(
        "hole.safetensors",
        r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[8],"data_offsets":[32,64]}}"#,
    )
    .unwrap_err();
    assert!(e.contains("safetensors format"), "{e}");
    // A dimension past 2^32 (MLX would truncate it to 32 bits: 2^32 + 8 -> 8).
    let e = case(
        "big.safetensors",
        r#"{"a":{"dtype":"U8","shape":[4294967304],"data_offsets":[0,8]}}"#,
    )
    .unwrap_err();
    assert!(e.contains("4294967304"), "{e}");
    // Offsets that disagree with the shape, or lie past the data.
    let e = case(
        "size.safetensors",
        r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,32]}}"#,
    )
    .unwrap_err();
    assert!(e.contains("\"a\"") && e.contains("needs 16"), "{e}");
    let e = case(
        "past.safetensors",
        r#"{"a":{"dtype":"F32","shape":[32],"data_offsets":[0,128]}}"#,
    )
    .unwrap_err();
    assert!(e.contains("outside"), "{e}");
    // Unknown dtype, missing field, header longer than the file.
    assert!(case(
        "dtype.safetensors",
        r#"{"a":{"dtype":"F33","shape":[8],"data_offsets":[0,32]}}"#
    )
    .unwrap_err()
    .contains("F33"));
    assert!(
        case("field.safetensors", r#"{"a":{"dtype":"F32","shape":[8]}}"#)
            .unwrap_err()
            .contains("data_offsets")
    );
    let p = dir.join("long.safetensors");
    std::fs::write(&p, 1_000_000u64.to_le_bytes()).unwrap();
    let e = mlx_core::io::load_safetensors(&p, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("header length"), "{e}");
}

//! The GGUF dequantizers against gguf-py's `gguf.quants.dequantize` (goldens:
//! `cargo xtask goldens gguf_dequant`): every type bit for bit on seeded blocks (finite scales,
//! and fully random bytes with infinities and NaN scales), a GGUF file of every type read
//! through the header reader (offsets, shapes, metadata), and bad sizes refused.

use std::path::PathBuf;

use mlx_core::prelude::*;
use mlx_core::testing::{assert_bit_equal, Goldens};
use mlx_models::gguf::read_gguf_dequantized;
use mlx_models::gguf_dequant::{dequantize, DEQUANTIZED_TYPES};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn goldens() -> Goldens {
    Goldens::load(root().join("goldens/gguf_dequant.safetensors")).unwrap()
}

#[test]
fn every_type_matches_gguf_py_bit_for_bit() {
    let g = goldens();
    let cases: Vec<_> = g
        .cases()
        .unwrap()
        .into_iter()
        .filter(|c| c.op == "dequantize")
        .collect();
    assert_eq!(cases.len(), 2 * DEQUANTIZED_TYPES.len());
    let mut failures = Vec::new();
    for c in &cases {
        let t = c.int("ggml_type").unwrap() as u32;
        let n = c.int("elements").unwrap() as usize;
        let bytes = c.inputs[0].to_vec::<u8>().unwrap();
        match dequantize(t, &bytes, n) {
            Ok(v) => {
                let got = Array::from_slice(&v, &[n as i32]).unwrap();
                if let Err(e) = assert_bit_equal(&got, &c.outputs[0]) {
                    failures.push(format!("{}: {e}", c.name));
                }
            }
            Err(e) => failures.push(format!("{}: {e}", c.name)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_file_of_every_type_reads_as_gguf_py_reads_it() {
    let g = goldens();
    let (tensors, meta) = read_gguf_dequantized(&root().join("models/gguf/quants.gguf")).unwrap();
    let mut failures = Vec::new();
    let mut seen = 0;
    for c in g.cases().unwrap().into_iter().filter(|c| c.op == "file") {
        let name = c.name.strip_prefix("file_").unwrap();
        seen += 1;
        match tensors.get(name) {
            Some(t) => {
                if let Err(e) = assert_bit_equal(t, &c.outputs[0]) {
                    failures.push(format!("{name}: {e}"));
                }
            }
            None => failures.push(format!("{name}: missing")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(seen, DEQUANTIZED_TYPES.len());
    assert_eq!(tensors.len(), seen);
    assert_eq!(meta.get_u64("test.u32").unwrap(), 7);
    assert_eq!(meta.get_i64("test.i8").unwrap(), -3);
    assert_eq!(meta.get_f32("test.f32").unwrap(), 0.5);
    assert!(meta.get_bool("test.bool").unwrap());
    assert_eq!(meta.get_str("test.str").unwrap(), "héllo");
    assert_eq!(meta.get_str("general.architecture").unwrap(), "quants");
    assert_eq!(
        meta.get_array("test.ints")
            .unwrap()
            .to_vec::<i32>()
            .unwrap(),
        [1, 2, 3]
    );
    assert_eq!(meta.get_strings("test.strs").unwrap(), ["a", "bc"]);

    // MLX 0.32.4's own reader fails on such files (Q5_0 / Q5_1: `gguf_tensor_to_f16 failed`;
    // MXFP4 it does not know, so the check before it refuses the file), which is why they
    // take this path.
    let e = mlx_core::io::load_gguf(root().join("models/gguf/quants.gguf"), None).unwrap_err();
    assert!(
        e.to_string()
            .contains("GGML type MXFP4 (39), which MLX's GGUF reader cannot load"),
        "{e}"
    );
}

#[test]
fn bad_sizes_and_types_are_errors() {
    for &(t, name) in DEQUANTIZED_TYPES {
        let (_, block, bytes) = mlx_core::io::ggml_type_info(t).unwrap();
        let (block, bytes) = (block as usize, bytes as usize);
        let data = vec![0u8; 2 * bytes];
        assert!(dequantize(t, &data, 2 * block).is_ok(), "{name}");
        // Short, long and empty data; a partial block.
        for (d, n) in [
            (&data[..2 * bytes - 1], 2 * block),
            (&data[..], block),
            (&data[..0], block),
        ] {
            let e = dequantize(t, d, n).unwrap_err().to_string();
            assert!(e.contains(name) && e.contains("bytes"), "{name}: {e}");
        }
        if block > 1 {
            let e = dequantize(t, &data, 2 * block - 1).unwrap_err().to_string();
            assert!(e.contains("whole number"), "{name}: {e}");
        }
    }
    // Types this module does not read: Q8_1, Q8_K, integer tensors, unknown ids.
    for t in [9, 15, 24, 26, 99, u32::MAX] {
        assert!(dequantize(t, &[0; 64], 16).is_err(), "{t}");
    }
}

/// A truncated or corrupted quantized file is an error naming the file, never a panic.
#[test]
fn truncated_files_are_errors() {
    let src = std::fs::read(root().join("models/gguf/quants.gguf")).unwrap();
    let dir = std::env::temp_dir().join(format!("mlx-dequant-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("cut.gguf");
    // (The file ends with up to 31 bytes of alignment padding after the last tensor.)
    for cut in [8, 100, src.len() / 2, src.len() - 40] {
        std::fs::write(&p, &src[..cut]).unwrap();
        let Err(e) = read_gguf_dequantized(&p) else {
            panic!("a file cut at {cut} bytes was read");
        };
        assert!(e.to_string().contains("cut.gguf"), "{e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Seeded byte mutations of the quantized file (a small xorshift, no dependency): each read
/// either succeeds or is an error; none panics, hangs or allocates past the file's bounds.
#[test]
fn mutated_files_never_panic() {
    let src = std::fs::read(root().join("models/gguf/quants.gguf")).unwrap();
    let dir = std::env::temp_dir().join(format!("mlx-dequant-mut-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("mutated.gguf");
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..300 {
        let mut b = src.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() % b.len() as u64) as usize;
            // Mostly the header (the first ~1 KB), where sizes, types and offsets live.
            let at = if next() % 4 == 0 { at } else { at % 1024 };
            b[at] = match next() % 3 {
                0 => next() as u8,
                1 => 0xff,
                _ => 0,
            };
        }
        std::fs::write(&p, &b).unwrap();
        match read_gguf_dequantized(&p) {
            Ok(_) => ok += 1,
            Err(e) => {
                assert!(e.to_string().contains("mutated.gguf"), "{e}");
                refused += 1;
            }
        }
    }
    assert!(ok > 0 && refused > 0, "ok {ok}, refused {refused}");
    std::fs::remove_dir_all(&dir).unwrap();
}

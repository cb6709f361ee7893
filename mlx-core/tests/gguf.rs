//! GGUF through MLX's loader: a hand-written file (F32, F16, Q4_0, Q4_1, Q8_0 tensors and
//! metadata of every kind) must load exactly as `mx.load` loads it (goldens written by
//! `cargo xtask goldens gguf`); missing, truncated and crash-inducing files are errors.

use std::path::{Path, PathBuf};

use mlx_core::io::{load_gguf, save_gguf, GgufMetadata, GgufValue};
use mlx_core::prelude::*;
use mlx_core::quantized::{self, QuantMode};
use mlx_core::testing::{assert_bit_equal, Goldens};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/goldens")
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mlx-core-gguf-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn small_gguf_loads_as_python_loads_it() {
    let g = Goldens::load(golden_dir().join("gguf.safetensors")).unwrap();
    let (arrays, meta) = load_gguf(golden_dir().join("small.gguf"), None).unwrap();

    // Tensors: names (with the quantized triples), dtypes, shapes and bytes.
    let names: Vec<&str> = g.metadata()["gguf.tensor_names"].split(',').collect();
    assert_eq!(arrays.keys().map(String::as_str).collect::<Vec<_>>(), names);
    let tensors = g.case("tensors").unwrap();
    for (name, expected) in names.iter().zip(&tensors.outputs) {
        assert_bit_equal(&arrays[*name], expected).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    assert_eq!(arrays["blk.0.q4_1.weight"].dtype(), Dtype::Uint32);
    assert_eq!(arrays["blk.0.q4_1.scales"].dtype(), Dtype::Float16);

    // The triples dequantize as in Python (group size 32).
    let deq = g.case("dequantized").unwrap();
    let quant: Vec<(&str, i32)> = g.metadata()["gguf.quantized"]
        .split(',')
        .map(|p| {
            let (prefix, bits) = p.split_once(':').unwrap();
            (prefix, bits.parse().unwrap())
        })
        .collect();
    assert_eq!(quant.len(), 3);
    for ((prefix, bits), expected) in quant.iter().zip(&deq.outputs) {
        let w = &arrays[&format!("{prefix}.weight")];
        let s = &arrays[&format!("{prefix}.scales")];
        let b = &arrays[&format!("{prefix}.biases")];
        let d =
            quantized::dequantize(w, s, Some(b), 32, *bits, QuantMode::Affine, None, None).unwrap();
        assert_bit_equal(&d, expected).unwrap_or_else(|e| panic!("{prefix}: {e}"));
    }

    // Metadata: every key, its kind and value.
    let expected_meta: Vec<(&str, &str)> = g
        .metadata()
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("gguf.meta.").map(|k| (k, v.as_str())))
        .collect();
    assert_eq!(
        meta.keys().map(String::as_str).collect::<Vec<_>>(),
        expected_meta.iter().map(|(k, _)| *k).collect::<Vec<_>>()
    );
    let meta_arrays = g.case("meta_arrays").unwrap();
    let mut next_array = meta_arrays.outputs.iter();
    for (key, spec) in expected_meta {
        match (meta.get(key).unwrap(), spec) {
            (GgufValue::Array(a), "array") => {
                assert_bit_equal(a, next_array.next().unwrap())
                    .unwrap_or_else(|e| panic!("{key}: {e}"));
            }
            (GgufValue::String(s), spec) if spec.starts_with("string:") => {
                assert_eq!(s, &spec["string:".len()..], "{key}");
            }
            (GgufValue::Strings(v), spec) if spec.starts_with("strings:") => {
                let want: Vec<&str> = spec["strings:".len()..].split('\u{1f}').collect();
                assert_eq!(v, &want, "{key}");
            }
            (GgufValue::None, "none") => {}
            (got, spec) => panic!("{key}: got {got:?}, expected {spec}"),
        }
    }
    assert!(next_array.next().is_none());

    // Typed getters.
    assert_eq!(meta.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(meta.get_u64("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(meta.get_u64("t.u64").unwrap(), (1 << 40) + 3);
    assert_eq!(meta.get_i64("t.i64").unwrap(), -(1 << 40) - 3);
    assert_eq!(meta.get_i64("t.i8").unwrap(), -100);
    assert!(meta.get_u64("t.i16").is_err(), "negative is not a u64");
    assert_eq!(meta.get_f32("t.f32").unwrap(), 0.1);
    assert!(meta.get_bool("t.bool").unwrap());
    assert_eq!(meta.get_strings("t.strs").unwrap()[2], "<|im_end|>");
    assert_eq!(meta.get_str("t.str").unwrap(), "héllo wörld");
    let err = meta.get_str("t.u32").unwrap_err();
    assert!(err.to_string().contains("not a string"), "{err}");
    let err = meta.get_u64("no.such.key").unwrap_err();
    assert!(err.to_string().contains("no.such.key"), "{err}");
    let err = meta.get_u64("t.u32s").unwrap_err();
    assert!(err.to_string().contains("not a scalar"), "{err}");
    assert!(meta.get_f32("t.u32").is_err());
}

#[test]
fn missing_and_truncated_files_are_errors() {
    let dir = tmpdir("bad");
    let missing = dir.join("nope.gguf");
    let err = load_gguf(&missing, None).expect_err("missing file");
    assert!(err.to_string().contains("nope.gguf"), "{err}");

    // Every proper prefix of a valid file is an error naming the file, never a crash.
    let bytes = std::fs::read(golden_dir().join("small.gguf")).unwrap();
    let cut = dir.join("cut.gguf");
    for n in 0..bytes.len() {
        std::fs::write(&cut, &bytes[..n]).unwrap();
        match load_gguf(&cut, None) {
            Err(e) => assert!(e.to_string().contains("cut.gguf"), "cut at {n}: {e}"),
            Ok((arrays, _)) => panic!("cut at {n} loaded {} tensors", arrays.len()),
        }
    }
    let err = {
        std::fs::write(&cut, &bytes[..bytes.len() - 1]).unwrap();
        load_gguf(&cut, None).unwrap_err()
    };
    assert!(err.to_string().contains("past the end"), "{err}");

    let junk = dir.join("junk.gguf");
    std::fs::write(&junk, b"not a gguf file at all").unwrap();
    let err = load_gguf(&junk, None).unwrap_err();
    assert!(err.to_string().contains("magic"), "{err}");
}

/// A minimal GGUF writer for files MLX cannot write itself (and for broken ones).
struct Gguf {
    version: u32,
    kv: Vec<u8>,
    n_kv: u64,
    /// Name, dims (innermost first), GGML type, and an offset overriding the computed one.
    tensors: Vec<(String, Vec<u64>, u32, Option<u64>)>,
}

impl Gguf {
    fn new() -> Self {
        Gguf {
            version: 3,
            kv: Vec::new(),
            n_kv: 0,
            tensors: Vec::new(),
        }
    }
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }
    fn kv(mut self, key: &str, ty: u32, value: &[u8]) -> Self {
        Self::string(&mut self.kv, key);
        self.kv.extend(ty.to_le_bytes());
        self.kv.extend(value);
        self.n_kv += 1;
        self
    }
    /// An f32 tensor of `dims` (innermost first, as GGUF lists them).
    fn tensor(self, name: &str, dims: &[u64]) -> Self {
        self.tensor_raw(name, dims, 0, None)
    }
    /// A tensor of GGML type `ty` (only its header entry is typed: the data is zeros of the f32
    /// size); with `offset`, only the header entry is written, at that offset.
    fn tensor_raw(mut self, name: &str, dims: &[u64], ty: u32, offset: Option<u64>) -> Self {
        self.tensors.push((name.into(), dims.to_vec(), ty, offset));
        self
    }
    fn version(mut self, v: u32) -> Self {
        self.version = v;
        self
    }
    fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(&self.kv);
        let mut offset = 0u64;
        let mut data = Vec::new();
        for (name, dims, ty, at) in &self.tensors {
            Self::string(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            out.extend(at.unwrap_or(offset).to_le_bytes());
            if at.is_some() {
                continue;
            }
            let n: u64 = dims.iter().product();
            let size = 4 * n;
            data.extend(std::iter::repeat_n(0u8, size as usize));
            let pad = (32 - size % 32) % 32;
            data.extend(std::iter::repeat_n(0u8, pad as usize));
            offset += size + pad;
        }
        while out.len() % 32 != 0 {
            out.push(0);
        }
        out.extend(data);
        out
    }
}

#[test]
fn files_that_crash_mlx_are_refused() {
    let dir = tmpdir("crash");
    let f64_value = 1.5f64.to_le_bytes();
    let write = |name: &str, g: &Gguf| {
        let p = dir.join(name);
        std::fs::write(&p, g.bytes()).unwrap();
        p
    };

    // Control: a plain file loads.
    let ok = write(
        "ok.gguf",
        &Gguf::new()
            .kv("a", 4, &7u32.to_le_bytes())
            .tensor("t", &[4, 2]),
    );
    let (arrays, meta) = load_gguf(&ok, None).unwrap();
    assert_eq!(arrays["t"].shape(), vec![2, 4]);
    assert_eq!(meta.get_u64("a").unwrap(), 7);

    // A FLOAT64 value with tensors: MLX 0.32.4 segfaults skipping it.
    let p = write(
        "f64.gguf",
        &Gguf::new().kv("x", 12, &f64_value).tensor("t", &[4]),
    );
    let err = load_gguf(&p, None).unwrap_err();
    assert!(err.to_string().contains("FLOAT64"), "{err}");
    // A FLOAT64 array: gguflib aborts.
    let mut arr = 12u32.to_le_bytes().to_vec();
    arr.extend(1u64.to_le_bytes());
    arr.extend(f64_value);
    let p = write("f64s.gguf", &Gguf::new().kv("x", 9, &arr).tensor("t", &[4]));
    assert!(load_gguf(&p, None)
        .unwrap_err()
        .to_string()
        .contains("FLOAT64"));
    // Without tensors MLX reads a FLOAT64 scalar (as float32).
    let p = write("f64_meta_only.gguf", &Gguf::new().kv("x", 12, &f64_value));
    let (_, meta) = load_gguf(&p, None).unwrap();
    assert_eq!(meta.get_f32("x").unwrap(), 1.5);

    // Nine dimensions: gguflib asserts (aborts); eight are fine.
    let p = write("dims9.gguf", &Gguf::new().tensor("t", &[1; 9]));
    let err = load_gguf(&p, None).unwrap_err();
    assert!(err.to_string().contains("dimensions"), "{err}");
    let p = write(
        "dims8.gguf",
        &Gguf::new().tensor("t", &[2, 1, 1, 1, 1, 1, 1, 1]),
    );
    assert_eq!(
        load_gguf(&p, None).unwrap().0["t"].shape(),
        vec![1, 1, 1, 1, 1, 1, 1, 2]
    );

    // An unknown value type and a nested array are errors, not crashes.
    let p = write(
        "badtype.gguf",
        &Gguf::new().kv("x", 77, &[0; 4]).tensor("t", &[4]),
    );
    assert!(load_gguf(&p, None).is_err());
    let mut nested = 9u32.to_le_bytes().to_vec();
    nested.extend(0u64.to_le_bytes());
    let p = write(
        "nested.gguf",
        &Gguf::new().kv("x", 9, &nested).tensor("t", &[4]),
    );
    assert!(load_gguf(&p, None).is_err());
}

#[test]
fn save_and_load_round_trip() {
    let dir = tmpdir("rt");
    let a = Array::from_slice(&[1.0f32, -2.0, 3.5, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let h =
        Array::from_slice(&[half::f16::from_f32(0.5), half::f16::from_f32(-1.0)], &[2]).unwrap();
    let mut meta = GgufMetadata::new();
    meta.insert("general.name", GgufValue::String("tiny".into()));
    meta.insert(
        "tokens",
        GgufValue::Strings(vec!["a".into(), "".into(), "ü c".into()]),
    );
    meta.insert("n", GgufValue::Array(Array::scalar(42u32).unwrap()));
    meta.insert(
        "v",
        GgufValue::Array(Array::from_slice(&[1i32, 2, 3], &[3]).unwrap()),
    );
    let path = dir.join("rt.gguf");
    save_gguf(&path, [("a", &a), ("h", &h)], &meta).unwrap();
    let (arrays, back) = load_gguf(&path, None).unwrap();
    assert_bit_equal(&arrays["a"], &a).unwrap();
    assert_bit_equal(&arrays["h"], &h).unwrap();
    assert_eq!(back.get_str("general.name").unwrap(), "tiny");
    assert_eq!(back.get_strings("tokens").unwrap(), ["a", "", "ü c"]);
    assert_eq!(back.get_u64("n").unwrap(), 42);
    assert_bit_equal(back.get_array("v").unwrap(), meta.get_array("v").unwrap()).unwrap();
    // Only the file itself is left in the directory.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
}

#[test]
fn files_mlx_would_load_wrongly_are_refused() {
    let dir = tmpdir("wrong");
    let write = |name: &str, g: &Gguf| {
        let p = dir.join(name);
        std::fs::write(&p, g.bytes()).unwrap();
        p
    };
    let err = |name: &str, g: &Gguf| -> String {
        let p = write(name, g);
        match load_gguf(&p, None) {
            Ok((a, _)) => panic!("{name} loaded {} tensors", a.len()),
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains(name), "the message should name the file: {e}");
                e
            }
        }
    };
    let two = || Gguf::new().tensor("a", &[8]).tensor("b", &[8]);
    // Control.
    assert_eq!(
        load_gguf(write("two.gguf", &two()), None).unwrap().0.len(),
        2
    );

    // Versions other than 2 and 3.
    let e = err("v99.gguf", &two().version(99));
    assert!(e.contains("version 99"), "{e}");
    assert!(err("v1.gguf", &two().version(1)).contains("version 1"));
    // A data offset one byte off (misaligned), or overlapping the previous tensor.
    let e = err(
        "offset.gguf",
        &Gguf::new()
            .tensor("a", &[8])
            .tensor_raw("b", &[8], 0, Some(33)),
    );
    assert!(e.contains("\"b\"") && e.contains("offset 33"), "{e}");
    let e = err(
        "overlap.gguf",
        &Gguf::new()
            .tensor("a", &[16])
            .tensor_raw("b", &[8], 0, Some(32)),
    );
    assert!(e.contains("share bytes"), "{e}");
    // An offset past the end of the file.
    let e = err(
        "past.gguf",
        &Gguf::new().tensor_raw("a", &[8], 0, Some(1 << 20)),
    );
    assert!(e.contains("past the end"), "{e}");
    // A duplicate name, printed by name.
    let e = err("dup.gguf", &Gguf::new().tensor("a", &[8]).tensor("a", &[8]));
    assert!(e.contains("\"a\" appears more than once"), "{e}");
    // An unknown tensor type: gguflib would stop listing tensors there.
    let e = err(
        "type.gguf",
        &Gguf::new()
            .tensor_raw("a", &[8], 99, None)
            .tensor("b", &[8]),
    );
    assert!(e.contains("unknown GGML type 99"), "{e}");
    // A dimension past 2^31 - 1.
    let e = err(
        "dim.gguf",
        &Gguf::new().tensor_raw("a", &[1 << 32, 1], 0, Some(0)),
    );
    assert!(e.contains("4294967296"), "{e}");
    // An alignment that is not a power of two.
    let e = err(
        "align.gguf",
        &two().kv("general.alignment", 4, &7u32.to_le_bytes()),
    );
    assert!(e.contains("general.alignment"), "{e}");
}

/// `read_gguf_header` (Rust, for types MLX cannot load) gives the metadata MLX's reader gives,
/// value for value (kind, dtype, shape, bytes), and the tensors' names, types and shapes.
#[test]
fn rust_header_reader_agrees_with_mlx() {
    let path = golden_dir().join("small.gguf");
    let (arrays, mlx_meta) = load_gguf(&path, None).unwrap();
    let header = mlx_core::io::read_gguf_header(&path).unwrap();
    let keys = |m: &GgufMetadata| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&header.metadata), keys(&mlx_meta));
    for (key, want) in &mlx_meta {
        match (header.metadata.get(key).unwrap(), want) {
            (GgufValue::Array(a), GgufValue::Array(b)) => {
                assert_bit_equal(a, b).unwrap_or_else(|e| panic!("{key}: {e}"))
            }
            (GgufValue::String(a), GgufValue::String(b)) => assert_eq!(a, b, "{key}"),
            (GgufValue::Strings(a), GgufValue::Strings(b)) => assert_eq!(a, b, "{key}"),
            (got, want) => panic!("{key}: ours {got:?}, MLX {want:?}"),
        }
    }
    for t in &header.tensors {
        let shape: Vec<i32> = t.dims.iter().rev().map(|&d| d as i32).collect();
        let name = t.name.clone();
        match t.type_name {
            "Q4_0" | "Q4_1" | "Q8_0" => {
                let prefix = name.trim_end_matches(".weight");
                let w = &arrays[&format!("{prefix}.weight")];
                assert_eq!(w.shape()[0], shape[0], "{name}");
            }
            _ => assert_eq!(arrays[&name].shape(), shape, "{name}"),
        }
        let (_, block, bytes) = mlx_core::io::ggml_type_info(t.ggml_type).unwrap();
        let n: u64 = t.dims.iter().product();
        assert_eq!(t.bytes, n / block * bytes, "{name}");
    }
}

//! Prompt-cache files: mlx-lm's file loads here, what we write has mlx-lm's exact layout, and
//! save/load round-trips every kind.

use std::collections::BTreeMap;

use mlx_cache::*;
use mlx_core::io::load_safetensors;
use mlx_core::prelude::*;
use mlx_core::testing::assert_bit_equal;

fn golden(name: &str) -> String {
    format!("{}/tests/goldens/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("mlx-cache-{}-{}", name, std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(format!("{name}.safetensors"))
}

#[test]
fn loads_a_prompt_cache_written_by_mlx_lm() {
    let (caches, meta) = load_prompt_cache(golden("prompt_cache_mlx_lm.safetensors")).unwrap();
    let classes: Vec<_> = caches.iter().map(|c| c.class_name()).collect();
    assert_eq!(
        classes,
        [
            "KVCache",
            "RotatingKVCache",
            "QuantizedKVCache",
            "ArraysCache",
            "KVCache",
            "ChunkedKVCache",
            "CacheList"
        ]
    );
    assert_eq!(meta.get("model").map(String::as_str), Some("tiny"));
    let offsets: Vec<_> = caches.iter().map(|c| c.offset()).collect();
    assert_eq!(offsets[..3], [5, 11, 3]);
    assert!(caches[4].is_empty());
    let rot = caches[1]
        .as_any()
        .downcast_ref::<RotatingKVCache>()
        .unwrap();
    assert_eq!((rot.max_size(), rot.keep()), (8, 2));
    let list = caches[6].as_any().downcast_ref::<CacheList>().unwrap();
    assert_eq!(list.caches().len(), 2);
    assert_eq!(list.caches()[1].class_name(), "RotatingKVCache");
}

#[test]
fn what_we_write_has_mlx_lms_exact_layout() {
    let src = golden("prompt_cache_mlx_lm.safetensors");
    let (caches, meta) = load_prompt_cache(&src).unwrap();
    let out = tmp("rewrite");
    save_prompt_cache(&out, &caches, &meta).unwrap();
    let (a, am) = load_safetensors(&src, None).unwrap();
    let (b, bm) = load_safetensors(&out, None).unwrap();
    assert_eq!(am, bm, "metadata differs");
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (k, x) in &a {
        assert_bit_equal(&b[k], x).unwrap_or_else(|e| panic!("{k}: {e}"));
    }
}

fn kv(t: usize, heads: i32, dim: i32, base: f32) -> Array {
    let n = heads as usize * t * dim as usize;
    let data: Vec<f32> = (0..n).map(|i| base + i as f32 * 0.25).collect();
    Array::from_slice(&data, &[1, heads, t as i32, dim]).unwrap()
}

#[test]
fn save_then_load_is_the_identity_for_every_kind() {
    let mut caches: Vec<Box<dyn Cache>> = vec![
        Box::new(KVCache::new()),
        Box::new(QuantizedKVCache::new(32, 4).unwrap()),
        Box::new(RotatingKVCache::new(6, 2).unwrap()),
        Box::new(RotatingQuantizedKVCache::new(6, 1, 32, 8).unwrap()),
        Box::new(ChunkedKVCache::new(8)),
        Box::new(ConcatenateKVCache::new()),
    ];
    for (i, c) in caches.iter_mut().enumerate() {
        for step in 0..9 {
            let t = if step % 3 == 0 { 3 } else { 1 };
            c.update_and_fetch(
                &kv(t, 2, 32, (i * 100 + step) as f32),
                &kv(t, 2, 32, -(step as f32)),
            )
            .unwrap();
        }
    }
    let mut arrays = ArraysCache::new(2);
    arrays.set(0, kv(1, 1, 4, 0.5)).unwrap();
    caches.push(Box::new(arrays));
    caches.push(Box::new(CacheList::new(vec![
        Box::new(KVCache::new()),
        Box::new(ArraysCache::new(1)),
    ])));
    let path = tmp("roundtrip");
    let meta = BTreeMap::from([("k".to_string(), "v".to_string())]);
    save_prompt_cache(&path, &caches, &meta).unwrap();
    let (loaded, m) = load_prompt_cache(&path).unwrap();
    assert_eq!(m, meta);
    check_compatible(&caches, &loaded).unwrap();
    for (a, b) in caches.iter().zip(&loaded) {
        assert_eq!(a.offset(), b.offset(), "{}", a.class_name());
        assert_eq!(a.nbytes(), b.nbytes(), "{}", a.class_name());
        match (a.fetch().unwrap(), b.fetch().unwrap()) {
            (Some(x), Some(y)) => {
                for (p, q) in x.arrays().iter().zip(y.arrays()) {
                    assert_bit_equal(q, p).unwrap_or_else(|e| panic!("{}: {e}", a.class_name()));
                }
            }
            (None, None) => {}
            _ => panic!("{}: fetch differs", a.class_name()),
        }
    }
    // The loaded caches keep working like the originals.
    let (k, v) = (kv(1, 2, 32, 7.0), kv(1, 2, 32, 8.0));
    for (a, b) in caches.iter_mut().zip(loaded).take(6) {
        let mut b = b;
        let x = a.update_and_fetch(&k, &v).unwrap();
        let y = b.update_and_fetch(&k, &v).unwrap();
        for (p, q) in x.arrays().iter().zip(y.arrays()) {
            assert_bit_equal(q, p).unwrap();
        }
    }
}

#[test]
fn incompatible_caches_are_refused_with_the_differences() {
    let model: Vec<Box<dyn Cache>> = vec![Box::new(KVCache::new()), Box::new(KVCache::new())];
    let file: Vec<Box<dyn Cache>> = vec![Box::new(RotatingKVCache::new(4, 0).unwrap())];
    let err = check_compatible(&model, &file).unwrap_err().to_string();
    assert!(err.contains("2 layers") && err.contains("1"), "{err}");
    assert!(
        err.contains("layer 0") && err.contains("RotatingKVCache"),
        "{err}"
    );
}

#[test]
fn bad_prompt_cache_files_are_errors() {
    let path = tmp("notacache");
    let a = Array::from_slice(&[1.0f32], &[1]).unwrap();
    mlx_core::io::save_safetensors(&path, [("weight", &a)], &BTreeMap::new()).unwrap();
    let err = load_prompt_cache(&path).unwrap_err().to_string();
    assert!(err.contains("weight"), "{err}");
    assert!(load_prompt_cache(tmp("missing").with_extension("nope")).is_err());
}

#[test]
fn quantization_settings_are_validated_up_front() {
    for (group, bits) in [(64, 0), (64, 9), (64, 7), (0, 4), (48, 4), (-32, 4)] {
        let err = QuantizedKVCache::new(group, bits).unwrap_err().to_string();
        assert!(
            err.contains("bits") || err.contains("group_size"),
            "({group}, {bits}): {err}"
        );
        assert!(RotatingQuantizedKVCache::new(8, 1, group, bits).is_err());
        assert!(KVCache::new().to_quantized(group, bits).is_err());
    }
    let mut ok = QuantizedKVCache::new(32, 4).unwrap();
    ok.update_and_fetch(&kv(1, 2, 32, 0.0), &kv(1, 2, 32, 1.0))
        .unwrap();
}

#[test]
fn prompt_cache_files_with_bad_quantization_settings_are_refused() {
    let mut c = QuantizedKVCache::new(32, 4).unwrap();
    c.update_and_fetch(&kv(2, 2, 32, 0.0), &kv(2, 2, 32, 1.0))
        .unwrap();
    let good = tmp("qgood");
    let caches: Vec<Box<dyn Cache>> = vec![Box::new(c)];
    save_prompt_cache(&good, &caches, &BTreeMap::new()).unwrap();
    let (arrays, meta) = mlx_core::io::load_safetensors(&good, None).unwrap();
    // Entries 0.3 and 0.4 are group_size and bits.
    for (key, value, needle) in [
        ("0.4", 0i64, "bits 0"),
        ("0.4", 9, "bits 9"),
        ("0.3", 0, "group_size 0"),
        ("0.4", (1i64 << 32) + 4, "out of range"),
    ] {
        let mut edited = arrays.clone();
        edited.insert(key.into(), Array::from_int(value, Dtype::Int64).unwrap());
        let bad = tmp("qbad");
        mlx_core::io::save_safetensors(&bad, edited.iter().map(|(k, a)| (k.as_str(), a)), &meta)
            .unwrap();
        let err = match load_prompt_cache(&bad) {
            Ok(_) => panic!("{key}={value} loaded"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains(needle) && err.contains("qbad"),
            "{key}={value}: {err}"
        );
    }
}

#[test]
fn deeply_nested_prompt_cache_keys_are_refused() {
    let path = tmp("deep");
    let key = vec!["0"; 5000].join(".");
    let a = Array::from_slice(&[1.0f32], &[1]).unwrap();
    let meta = BTreeMap::from([("1.0".to_string(), "KVCache".to_string())]);
    mlx_core::io::save_safetensors(&path, [(key.as_str(), &a)], &meta).unwrap();
    let err = load_prompt_cache(&path).unwrap_err().to_string();
    assert!(err.contains("nests 5000 levels"), "{err}");
}

/// Found by `cargo xtask fuzz prompt_cache`: a cached array without a sequence axis made the
/// next update index past its shape (a panic).
#[test]
fn fuzz_regression_cached_arrays_without_a_sequence_axis() {
    let mut c = KVCache::new();
    c.update_and_fetch(&kv(2, 2, 32, 0.0), &kv(2, 2, 32, 1.0))
        .unwrap();
    let good = tmp("seqaxis");
    let caches: Vec<Box<dyn Cache>> = vec![Box::new(c)];
    save_prompt_cache(&good, &caches, &BTreeMap::new()).unwrap();
    let (mut arrays, meta) = load_safetensors(&good, None).unwrap();
    let flat = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    arrays.insert("0.0".into(), flat.clone());
    arrays.insert("0.1".into(), flat);
    let bad = tmp("seqaxis_bad");
    mlx_core::io::save_safetensors(&bad, arrays.iter().map(|(k, a)| (k.as_str(), a)), &meta)
        .unwrap();
    if let Ok((mut loaded, _)) = load_prompt_cache(&bad) {
        let r = loaded[0].update_and_fetch(&kv(1, 2, 32, 0.0), &kv(1, 2, 32, 1.0));
        assert!(r.is_err());
    }
}

/// Found by `cargo xtask fuzz prompt_cache` (117 inputs): a ChunkedKVCache whose
/// start_position is past its offset made the next update subtract with overflow.
#[test]
fn fuzz_regression_chunked_cache_positions_are_checked() {
    let mut c = ChunkedKVCache::new(8);
    c.update_and_fetch(&kv(2, 2, 32, 0.0), &kv(2, 2, 32, 1.0))
        .unwrap();
    let good = tmp("chunked");
    let caches: Vec<Box<dyn Cache>> = vec![Box::new(c)];
    save_prompt_cache(&good, &caches, &BTreeMap::new()).unwrap();
    let (mut arrays, meta) = load_safetensors(&good, None).unwrap();
    // State: keys, values, offset (0.2), chunk_size (0.3), start_position (0.4).
    arrays.insert("0.4".into(), Array::from_int(5, Dtype::Int32).unwrap());
    let bad = tmp("chunked_bad");
    mlx_core::io::save_safetensors(&bad, arrays.iter().map(|(k, a)| (k.as_str(), a)), &meta)
        .unwrap();
    let err = match load_prompt_cache(&bad) {
        Ok(_) => panic!("a start_position past the offset loaded"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("start_position 5"), "{err}");
}

#[test]
fn an_unknown_class_is_refused_naming_every_known_one() {
    let Err(e) = cache_from_state("NoSuchCache", StateValue::None) else {
        panic!("an unknown class is an error");
    };
    let e = e.to_string();
    assert!(
        e.contains(
            "unknown cache class \"NoSuchCache\" (known: KVCache, QuantizedKVCache, \
             RotatingKVCache, RotatingQuantizedKVCache, ChunkedKVCache, ConcatenateKVCache, \
             ArraysCache, CacheList, TrellisKVCache)"
        ),
        "{e}"
    );
}

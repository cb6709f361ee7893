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
        Box::new(QuantizedKVCache::new(32, 4)),
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

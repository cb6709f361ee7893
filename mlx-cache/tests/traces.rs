//! L1 against mlx-lm 0.32.2: replays the operation traces recorded by
//! `xtask/oracle/goldens_cache.py` (`cargo xtask goldens cache`) and requires every fetched
//! array, offset, trim result and mask to match bit for bit.

use std::collections::BTreeMap;

use mlx_cache::*;
use mlx_core::prelude::*;
use mlx_core::testing::{Case, Goldens};

fn golden(name: &str) -> String {
    format!("{}/tests/goldens/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn opt_usize(c: &Case, key: &str) -> Option<usize> {
    c.has(key).then(|| c.int(key).expect(key) as usize)
}

fn new_cache(c: &Case) -> Box<dyn Cache> {
    let int = |k: &str| c.int(k).expect(k);
    match c.str("kind").unwrap() {
        "kv" => Box::new(KVCache::new()),
        "quantized" => {
            Box::new(QuantizedKVCache::new(int("group_size") as i32, int("bits") as i32).unwrap())
        }
        "rotating" => {
            Box::new(RotatingKVCache::new(int("max_size") as usize, int("keep") as usize).unwrap())
        }
        "chunked" => Box::new(ChunkedKVCache::new(int("chunk_size") as usize)),
        "concat" => Box::new(ConcatenateKVCache::new()),
        other => panic!("unknown cache kind {other}"),
    }
}

fn check_arrays(c: &Case, got: Vec<&Array>) -> Result<(), String> {
    let owned: Vec<Array> = got.into_iter().cloned().collect();
    c.check(&owned)
}

fn replay(trace: &str, steps: &[Case]) -> Vec<String> {
    let mut errors = Vec::new();
    let mut cache: Option<Box<dyn Cache>> = None;
    for c in steps {
        let fail = |m: String| format!("{trace} {}: {m}", c.name);
        if c.op == "new" {
            cache = Some(new_cache(c));
            continue;
        }
        let cache_ref = cache.as_mut().expect("trace starts with new");
        let expect_offset = opt_usize(c, "offset");
        let result: Result<(), String> = (|| {
            match c.op.as_str() {
                "update" => {
                    let kv = cache_ref
                        .update_and_fetch(c.input(0).unwrap(), c.input(1).unwrap())
                        .map_err(|e| e.to_string())?;
                    check_arrays(c, kv.arrays())?;
                }
                "trim" => {
                    let trimmable = cache_ref.is_trimmable();
                    if trimmable != c.bool("trimmable").unwrap() {
                        return Err(format!("is_trimmable {trimmable}"));
                    }
                    let n = c.int("n").unwrap() as usize;
                    let got = cache_ref.trim(n);
                    if got != c.int("trimmed").unwrap() as usize {
                        return Err(format!(
                            "trimmed {got}, expected {}",
                            c.int("trimmed").unwrap()
                        ));
                    }
                }
                "mask" => {
                    let n = c.int("n").unwrap() as usize;
                    let m = cache_ref
                        .make_mask(n, opt_usize(c, "window"), c.bool("return_array").unwrap())
                        .map_err(|e| e.to_string())?;
                    match (c.str("result").unwrap(), &m) {
                        ("none", AttentionMask::None) | ("causal", AttentionMask::Causal) => {}
                        ("array", AttentionMask::Array(a)) => c.check(std::slice::from_ref(a))?,
                        (want, got) => return Err(format!("mask {got:?}, expected {want}")),
                    }
                }
                "fetch" => {
                    let kv = cache_ref.fetch().map_err(|e| e.to_string())?;
                    match kv {
                        Some(kv) => check_arrays(c, kv.arrays())?,
                        None if c.outputs.is_empty() => {}
                        None => return Err("fetch returned nothing".into()),
                    }
                    let nbytes = cache_ref.nbytes();
                    if nbytes != c.int("nbytes").unwrap() as usize {
                        return Err(format!(
                            "nbytes {nbytes}, expected {}",
                            c.int("nbytes").unwrap()
                        ));
                    }
                }
                "to_quantized" => {
                    let kv = cache_ref
                        .as_any()
                        .downcast_ref::<KVCache>()
                        .expect("to_quantized on a KVCache");
                    let q = kv
                        .to_quantized(
                            c.int("group_size").unwrap() as i32,
                            c.int("bits").unwrap() as i32,
                        )
                        .map_err(|e| e.to_string())?;
                    *cache_ref = Box::new(q);
                }
                "maybe_trim_front" => {
                    let ch = cache_ref
                        .as_any_mut()
                        .downcast_mut::<ChunkedKVCache>()
                        .expect("chunked");
                    ch.maybe_trim_front().map_err(|e| e.to_string())?;
                    if ch.start_position() != c.int("start_position").unwrap() as usize {
                        return Err(format!("start_position {}", ch.start_position()));
                    }
                }
                other => return Err(format!("no runner for {other}")),
            }
            if let Some(o) = expect_offset {
                if cache_ref.offset() != o {
                    return Err(format!("offset {}, expected {o}", cache_ref.offset()));
                }
            }
            Ok(())
        })();
        if let Err(m) = result {
            errors.push(fail(m));
        }
    }
    errors
}

#[test]
fn caches_replay_mlx_lm_traces_bit_for_bit() {
    let g = Goldens::load(golden("cache_traces.safetensors")).unwrap();
    let mut traces: BTreeMap<String, Vec<Case>> = BTreeMap::new();
    for c in g.cases().unwrap() {
        traces
            .entry(c.str("trace").unwrap().to_string())
            .or_default()
            .push(c);
    }
    assert!(traces.len() >= 15, "{} traces", traces.len());
    let total: usize = traces.values().map(Vec::len).sum();
    let errors: Vec<String> = traces
        .iter()
        .flat_map(|(t, steps)| replay(t, steps))
        .collect();
    assert!(
        errors.is_empty(),
        "{} of {total} steps differ:\n{}",
        errors.len(),
        errors.join("\n")
    );
}

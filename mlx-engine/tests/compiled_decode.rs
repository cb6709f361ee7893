//! The compiled, transactional decode step (`mlx_engine::compiled`) on the CPU:
//! - tier L1 with the uncompiled forward: greedy decode through `generate_step` gives the same
//!   ids and the same per-step log-probabilities, bit for bit, compiled and not, for the tiny
//!   dense fixtures (f32, f16, bf16, 4- and 8-bit weights, llama3/yarn/linear ropes, sliding
//!   windows), with plain and rotating caches (quantized where head_dim allows), and for a
//!   random model of
//!   SmolLM2-135M's shape (the uncompiled path is L1 with mlx-lm: `generate_goldens.rs`);
//! - one trace of each segment serves every step;
//! - transactional: a fault injected after each layer's staged cache write fails the step,
//!   every cache stays byte for byte as it was, and the step then runs uncompiled (and
//!   compiled) to the same bits as an undisturbed run.

use std::path::PathBuf;

use mlx_cache::{Cache, RotatingKVCache, StateValue};
use mlx_core::prelude::*;
use mlx_engine::compiled::CompiledDecoder;
use mlx_engine::generate::{
    generate_step, generate_step_with_decoder, CompiledDecode, GenerateOptions,
};
use mlx_engine::EngineError;
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::LanguageModel;

fn fixture(name: &str) -> Box<dyn LanguageModel> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../mlx-models/tests/models")
        .join(name);
    load_model_dir(&dir, &LoadOptions::default()).unwrap().0
}

fn prompt(n: usize, vocab: i32) -> Vec<i32> {
    (0..n as i64)
        .map(|i| ((i * 7919 + 13) % i64::from(vocab)) as i32)
        .collect()
}

#[derive(Clone, Copy, Debug)]
enum Caches {
    Plain,
    Quantized,
    Rotating,
}

/// Greedy ids, per-step log-probability bytes, and how many steps ran compiled.
fn decode(
    model: &dyn LanguageModel,
    prompt: &[i32],
    n: usize,
    mode: CompiledDecode,
    caches: Caches,
) -> (Vec<u32>, Vec<Vec<u8>>, usize) {
    let mut opts = GenerateOptions {
        max_tokens: Some(n),
        compiled_decode: mode,
        ..GenerateOptions::default()
    };
    let mut cache = None;
    match caches {
        Caches::Plain => {}
        Caches::Quantized => {
            opts.kv_bits = Some(4);
            opts.kv_group_size = 32;
            opts.quantized_kv_start = 0;
        }
        Caches::Rotating => {
            cache = Some(
                (0..model.num_layers())
                    .map(|_| Box::new(RotatingKVCache::new(8, 4).unwrap()) as Box<dyn Cache>)
                    .collect(),
            );
        }
    }
    let mut g = generate_step(prompt, model, cache, opts).unwrap();
    let (mut ids, mut lps) = (Vec::new(), Vec::new());
    for step in g.by_ref() {
        let step = step.unwrap();
        ids.push(step.token);
        lps.push(step.logprobs.to_bytes().unwrap());
    }
    (ids, lps, g.compiled_steps())
}

fn assert_same(model: &dyn LanguageModel, what: &str, prompt: &[i32], n: usize, caches: Caches) {
    let (ids0, lp0, c0) = decode(model, prompt, n, CompiledDecode::Off, caches);
    let (ids1, lp1, c1) = decode(model, prompt, n, CompiledDecode::Auto, caches);
    assert_eq!(c0, 0);
    assert!(c1 >= n - 1, "{what} {caches:?}: only {c1} compiled steps");
    assert_eq!(ids1, ids0, "{what} {caches:?}: greedy ids differ");
    for (i, (a, b)) in lp1.iter().zip(&lp0).enumerate() {
        assert!(
            a == b,
            "{what} {caches:?}: log-probabilities of step {i} differ"
        );
    }
}

#[test]
fn compiled_decode_is_bit_exact_on_the_dense_fixtures() {
    let names = [
        "dense_f32",
        "dense_f16",
        "dense_bf16_mha",
        "dense_bf16_untied",
        "q4_g32",
        "q4_g64_untied",
        "q8_g32_bf16",
        "q8_g64",
        "linear_rope_sliding",
        "yarn_rope",
        "mistral_bias_llama3rope",
    ];
    for name in names {
        let model = fixture(name);
        assert!(model.segmented().is_some(), "{name} should be segmentable");
        let p = prompt(11, model.vocab_size());
        assert_same(model.as_ref(), name, &p, 12, Caches::Plain);
        assert_same(model.as_ref(), name, &p, 12, Caches::Rotating);
        // A quantized cache needs head_dim >= 32 (MLX's smallest group): only this fixture.
        if name == "mistral_bias_llama3rope" {
            assert_same(model.as_ref(), name, &p, 12, Caches::Quantized);
        }
    }
}

/// Every row of the descriptor table that has a fixture (`mlx-models/tests/models/dense`,
/// each L1 with mlx-lm in `dense_goldens.rs`): the compiled step gives the same bits where
/// the row is segmentable (sequential blocks, no learned positions or per-position query
/// scale); the others (parallel blocks, GPT-2's positions, Ministral 3) decode uncompiled.
#[test]
fn compiled_decode_is_bit_exact_on_every_segmentable_descriptor_row() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../mlx-models/tests/models/dense");
    let mut rows: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    rows.sort();
    let (mut compiled, mut skipped) = (Vec::new(), Vec::new());
    for row in &rows {
        let model = load_model_dir(&root.join(row), &LoadOptions::default())
            .unwrap()
            .0;
        if model.segmented().is_none() {
            skipped.push(row.clone());
            continue;
        }
        let p = prompt(7, model.vocab_size());
        assert_same(model.as_ref(), row, &p, 6, Caches::Plain);
        compiled.push(row.clone());
    }
    eprintln!("compiled and bit-exact: {compiled:?}\nnot segmentable: {skipped:?}");
    assert!(
        compiled.len() >= 40,
        "only {} rows compiled",
        compiled.len()
    );
}

/// A random llama of SmolLM2-135M's shape (30 layers, hidden 576, 9 / 3 heads, vocab 49152,
/// tied embeddings), float32.
fn smollm2_shaped() -> Box<dyn LanguageModel> {
    let dir = std::env::temp_dir().join(format!("mlx-compiled-decode-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = r#"{"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30,
        "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
        "head_dim": 64, "rms_norm_eps": 1e-05, "vocab_size": 49152, "rope_theta": 100000.0,
        "max_position_embeddings": 8192, "tie_word_embeddings": true}"#;
    std::fs::write(dir.join("config.json"), config).unwrap();
    let mut k = 7000;
    let mut draw = |shape: &[i32]| {
        let sub = random::key(k).unwrap();
        k += 1;
        random::normal(shape, Dtype::Float32, None, Some(0.02), Some(&sub), None).unwrap()
    };
    let mut w: Vec<(String, Array)> =
        vec![("model.embed_tokens.weight".into(), draw(&[49152, 576]))];
    let ones = |n: i32| ops::ones(&[n], Dtype::Float32, None).unwrap();
    for i in 0..30 {
        let p = format!("model.layers.{i}");
        for (name, shape) in [
            ("self_attn.q_proj", [576, 576]),
            ("self_attn.k_proj", [192, 576]),
            ("self_attn.v_proj", [192, 576]),
            ("self_attn.o_proj", [576, 576]),
            ("mlp.gate_proj", [1536, 576]),
            ("mlp.up_proj", [1536, 576]),
            ("mlp.down_proj", [576, 1536]),
        ] {
            w.push((format!("{p}.{name}.weight"), draw(&shape)));
        }
        w.push((format!("{p}.input_layernorm.weight"), ones(576)));
        w.push((format!("{p}.post_attention_layernorm.weight"), ones(576)));
    }
    w.push(("model.norm.weight".into(), ones(576)));
    let file = dir.join("model.safetensors");
    mlx_core::io::save_safetensors(
        &file,
        w.iter().map(|(n, a)| (n.as_str(), a)),
        &Default::default(),
    )
    .unwrap();
    let model = load_model_dir(&dir, &LoadOptions::default()).unwrap().0;
    let _ = std::fs::remove_dir_all(&dir);
    model
}

#[test]
fn compiled_decode_is_bit_exact_on_a_smollm2_shaped_model() {
    let model = smollm2_shaped();
    let p = prompt(24, model.vocab_size());
    assert_same(model.as_ref(), "smollm2-shaped", &p, 8, Caches::Plain);
    assert_same(model.as_ref(), "smollm2-shaped", &p, 4, Caches::Quantized);
}

/// Every byte of every cache (whole buffers, not only the filled prefix) and the offsets.
fn snapshot(caches: &[Box<dyn Cache>]) -> Vec<(usize, Vec<Vec<u8>>)> {
    fn bytes(v: &StateValue, out: &mut Vec<Vec<u8>>) {
        match v {
            StateValue::Array(a) => out.push(a.to_bytes().unwrap()),
            StateValue::List(l) => l.iter().for_each(|x| bytes(x, out)),
            StateValue::Int(i) => out.push(i.to_le_bytes().to_vec()),
            StateValue::Str(s) => out.push(s.as_bytes().to_vec()),
            StateValue::None => out.push(Vec::new()),
        }
    }
    caches
        .iter()
        .map(|c| {
            let mut out = Vec::new();
            bytes(&c.state(), &mut out);
            (c.offset(), out)
        })
        .collect()
}

fn fresh_caches(model: &dyn LanguageModel, kind: Caches) -> Vec<Box<dyn Cache>> {
    model
        .make_cache()
        .into_iter()
        .map(|c| -> Box<dyn Cache> {
            match kind {
                Caches::Plain => c,
                Caches::Quantized => Box::new(mlx_cache::QuantizedKVCache::new(32, 4).unwrap()),
                Caches::Rotating => Box::new(RotatingKVCache::new(8, 4).unwrap()),
            }
        })
        .collect()
}

#[test]
fn a_failed_step_leaves_every_cache_byte_for_byte_and_reruns_uncompiled() {
    for (name, kind) in [
        ("dense_f32", Caches::Plain),
        ("mistral_bias_llama3rope", Caches::Quantized),
        ("dense_bf16_mha", Caches::Rotating),
    ] {
        let model = fixture(name);
        let layers = model.num_layers();
        let mut dec = CompiledDecoder::new(model.as_ref()).unwrap().unwrap();
        let mut caches = fresh_caches(model.as_ref(), kind);
        let p = prompt(10, model.vocab_size());
        let x = Array::from_slice(&p, &[1, p.len() as i32]).unwrap();
        model.forward(&x, Some(&mut caches)).unwrap();
        let token = Array::from_slice(&[p[3]], &[1, 1]).unwrap();
        // Several compiled steps first: one trace per segment serves them all.
        for _ in 0..3 {
            let staged = dec.step(&token, &caches).unwrap();
            staged.commit(&mut caches).unwrap().eval().unwrap();
        }
        assert_eq!(dec.trace_counts(), vec![1; layers + 1], "{name}");
        let before = snapshot(&caches);
        // What an undisturbed uncompiled step gives from here.
        let mut reference: Vec<Box<dyn Cache>> = caches.iter().map(|c| c.boxed_clone()).collect();
        let want = model
            .forward(&token, Some(&mut reference))
            .unwrap()
            .to_bytes()
            .unwrap();
        let want_caches = snapshot(&reference);
        for fail_at in 0..layers {
            dec.set_fault_hook(Some(Box::new(move |layer| {
                if layer == fail_at {
                    Err(EngineError::Internal {
                        what: "the test's fault hook".into(),
                        problem: format!("injected fault at layer {layer}"),
                    })
                } else {
                    Ok(())
                }
            })));
            let err = dec
                .step(&token, &caches)
                .err()
                .expect("the step should fail");
            assert!(err.to_string().contains("injected fault"), "{err}");
            assert!(
                snapshot(&caches) == before,
                "{name}: a cache changed after a fault at layer {fail_at}"
            );
        }
        dec.set_fault_hook(None);
        // The caller re-runs the step uncompiled, and gets the undisturbed run's bits.
        let mut rerun: Vec<Box<dyn Cache>> = caches.iter().map(|c| c.boxed_clone()).collect();
        let got = model.forward(&token, Some(&mut rerun)).unwrap();
        assert!(got.to_bytes().unwrap() == want, "{name}: uncompiled re-run");
        assert!(snapshot(&rerun) == want_caches, "{name}: re-run caches");
        // And compiled, to the same bits.
        let got = dec
            .step(&token, &caches)
            .unwrap()
            .commit(&mut caches)
            .unwrap();
        assert!(got.to_bytes().unwrap() == want, "{name}: compiled step");
        assert!(snapshot(&caches) == want_caches, "{name}: compiled caches");
        assert_eq!(dec.trace_counts(), vec![1; layers + 1], "{name}");
    }
}

/// A decoder kept across generations serves only the model it was made for: another model
/// (even one of the same shape, whose steps would run and decode with the wrong weights) is
/// refused, and the right one decodes compiled, twice, to the uncompiled tokens.
#[test]
fn a_kept_decoder_serves_only_its_own_model() {
    let (a, b) = (fixture("dense_f32"), fixture("dense_f32"));
    let dec = CompiledDecoder::new(a.as_ref()).unwrap().unwrap();
    let p = prompt(5, a.vocab_size());
    let opts = GenerateOptions {
        max_tokens: Some(4),
        ..GenerateOptions::default()
    };
    let e = match generate_step_with_decoder(&p, b.as_ref(), None, opts.clone(), &dec) {
        Ok(_) => panic!("a decoder made for another model was used"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("another model"), "{e}");
    let (ids0, _, _) = decode(a.as_ref(), &p, 4, CompiledDecode::Off, Caches::Plain);
    for _ in 0..2 {
        let mut g = generate_step_with_decoder(&p, a.as_ref(), None, opts.clone(), &dec).unwrap();
        let ids: Vec<u32> = g.by_ref().map(|s| s.unwrap().token).collect();
        assert_eq!(ids, ids0);
        assert!(g.compiled_steps() >= 3, "{}", g.compiled_steps());
    }
}

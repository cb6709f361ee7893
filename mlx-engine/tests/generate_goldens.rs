//! L1 against mlx-lm 0.32.2 `generate_step`: seeded sampling with every sampler option and
//! logits processor, chunked prefill, a quantized KV cache switching on mid-prompt, and a
//! rotating cache give the same ids and the same per-step log-probabilities, bit for bit, with
//! the uncompiled forward and with the compiled decode step.

use std::path::PathBuf;

use mlx_cache::{Cache, RotatingKVCache};
use mlx_core::prelude::*;
use mlx_core::random;
use mlx_core::testing::{Case, Goldens};
use mlx_engine::generate::{generate_step, CompiledDecode, GenerateOptions};
use mlx_engine::sample::{make_logits_processors, ProcessorSettings, Sampler, SamplerSettings};
use mlx_models::load::{load_model_dir, LoadOptions};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn f(c: &Case, k: &str) -> Option<f64> {
    c.has(k).then(|| c.float(k).unwrap())
}

fn u(c: &Case, k: &str) -> Option<usize> {
    c.has(k).then(|| c.int(k).unwrap() as usize)
}

fn floats(c: &Case, k: &str) -> Vec<f32> {
    let v = c.str(k).unwrap();
    v.trim_matches(|ch| ch == '[' || ch == ']')
        .split(',')
        .filter(|x| !x.is_empty())
        .map(|x| x.parse().unwrap())
        .collect()
}

fn run(c: &Case, compiled: CompiledDecode) -> Result<(), String> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../mlx-models/tests/models")
        .join(c.str("model").unwrap());
    let (model, _) = load_model_dir(&dir, &LoadOptions::default()).map_err(|e| e.to_string())?;
    let d = SamplerSettings::default();
    let sampler = Sampler::new(SamplerSettings {
        temp: f(c, "temp").unwrap_or(d.temp),
        top_p: f(c, "top_p").unwrap_or(d.top_p),
        min_p: f(c, "min_p").unwrap_or(d.min_p),
        min_tokens_to_keep: u(c, "min_tokens_to_keep").unwrap_or(d.min_tokens_to_keep),
        top_k: if c.has("top_k") {
            c.int("top_k").unwrap() as i32
        } else {
            d.top_k
        },
        xtc_probability: f(c, "xtc_probability").unwrap_or(d.xtc_probability),
        xtc_threshold: f(c, "xtc_threshold").unwrap_or(d.xtc_threshold),
        xtc_special_tokens: if c.has("xtc_special_tokens") {
            c.i32s("xtc_special_tokens").unwrap()
        } else {
            vec![]
        },
    });
    let bias = if c.has("bias_ids") {
        c.i32s("bias_ids")
            .unwrap()
            .into_iter()
            .zip(floats(c, "bias_values"))
            .collect()
    } else {
        vec![]
    };
    let procs = make_logits_processors(&ProcessorSettings {
        logit_bias: bias,
        repetition_penalty: f(c, "repetition_penalty"),
        repetition_context_size: u(c, "repetition_context_size"),
        presence_penalty: f(c, "presence_penalty"),
        presence_context_size: u(c, "presence_context_size"),
        frequency_penalty: f(c, "frequency_penalty"),
        frequency_context_size: u(c, "frequency_context_size"),
    })
    .map_err(|e| e.to_string())?;
    let dflt = GenerateOptions::default();
    let opts = GenerateOptions {
        max_tokens: Some(c.outputs.len()),
        sampler,
        logits_processors: procs,
        max_kv_size: u(c, "max_kv_size"),
        prefill_step_size: u(c, "prefill_step_size").unwrap_or(dflt.prefill_step_size),
        kv_bits: c.has("kv_bits").then(|| c.int("kv_bits").unwrap() as i32),
        kv_group_size: if c.has("kv_group_size") {
            c.int("kv_group_size").unwrap() as i32
        } else {
            64
        },
        quantized_kv_start: u(c, "quantized_kv_start").unwrap_or(dflt.quantized_kv_start),
        prompt_progress: None,
        compiled_decode: compiled,
        eval_probe: None,
        cpu_decode: None,
        grammar: None,
        ..dflt
    };
    let prompt = c.input(0).unwrap().to_vec::<i32>().unwrap();
    random::seed(c.int("seed").unwrap() as u64).unwrap();
    let mut ids = Vec::new();
    let mut lps = Vec::new();
    // An explicit RotatingKVCache(max_size=n, keep=4) per layer: what make_prompt_cache gives a
    // model without its own make_cache.
    let caches = match u(c, "rotating_cache") {
        Some(n) => Some(
            (0..model.num_layers())
                .map(|_| -> Result<Box<dyn Cache>, String> {
                    Ok(Box::new(
                        RotatingKVCache::new(n, 4).map_err(|e| e.to_string())?,
                    ))
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
        None => None,
    };
    let mut g = generate_step(&prompt, model.as_ref(), caches, opts).map_err(|e| e.to_string())?;
    for step in g.by_ref() {
        let step = step.map_err(|e| e.to_string())?;
        ids.push(step.token as i64);
        lps.push(step.logprobs);
    }
    if compiled == CompiledDecode::Auto && ids.len() > 1 && g.compiled_steps() == 0 {
        return Err("no step ran through the compiled decode step".into());
    }
    let expect = c.ints("ids").unwrap();
    if ids != expect {
        return Err(format!("ids {ids:?}, mlx-lm {expect:?}"));
    }
    c.check(&lps)
}

#[test]
fn generation_matches_mlx_lm_for_every_sampler_option() {
    let g = Goldens::load(root().join("goldens/generate.safetensors")).unwrap();
    let cases = g.cases().unwrap();
    assert!(cases.len() >= 17);
    // Every case also through the compiled decode step (`mlx_engine::compiled`).
    let failures: Vec<String> = [CompiledDecode::Off, CompiledDecode::Auto]
        .into_iter()
        .flat_map(|mode| {
            cases.iter().filter_map(move |c| {
                run(c, mode)
                    .err()
                    .map(|e| format!("{} ({mode:?}): {e}", c.name))
            })
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

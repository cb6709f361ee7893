//! The CPU decoder's quality gate on a real model (tier L3): teacher forced over the first N
//! next-token predictions of a text file, its logits against the exact path's (the model's
//! MLX forward, `--dtype auto` on the CPU), through both of its paths: one token at a time
//! (the decode step: int16 activations) and in blocks (`feed_all`: the prefill kernels).
//! Passes when, on each path, the top-1 tokens agree at [`MIN_AGREEMENT`] of the positions
//! or more and the perplexities are within [`MAX_PPL_GAP`] of each other; exits 1 otherwise.
//!
//! `cargo xtask cpu-quality` runs it on SmolLM2-135M and Gemma 3 270M over 2,000 positions of
//! `mlx-engine/tests/fixtures/genesis_kjv.txt` (King James Version, public domain), or by hand:
//! `cargo run --release -p mlx-engine --example cpu_quality -- smollm2|gemma3 TEXT_FILE N`.
//! A model the CPU decoder does not cover is reported with the reason (generation falls back
//! to the exact path there, so there is nothing to gate) and is not a failure.
//!
//! The exact path's logits are cached (its CPU prefill is the slow side) in `CACHE`, default
//! `target/cpu_quality_<model>_<N>.bin`, checked by length only: delete it when the text
//! changes.

use mlx_core::prelude::*;
use mlx_engine::cpu_decode::{unsupported, CpuDecoder};
use mlx_engine::tokenizer_gguf::tokenizer_data;
use mlx_models::gguf::{load_gguf_model_with, GgufTensors};
use mlx_models::load::LoadOptions;

/// Least share of positions whose top-1 tokens agree.
const MIN_AGREEMENT: f64 = 0.99;
/// Largest relative perplexity gap.
const MAX_PPL_GAP: f64 = 0.005;

fn lsm(l: &[f32], t: usize) -> f64 {
    let m = l.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v)) as f64;
    let s: f64 = l.iter().map(|&v| (v as f64 - m).exp()).sum();
    l[t] as f64 - m - s.ln()
}

fn argmax(v: &[f32]) -> usize {
    let mut b = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[b] {
            b = i;
        }
    }
    b
}

/// Agreement, perplexity, and the exact path's perplexity, over `n` positions.
struct Score {
    agree: usize,
    ours: f64,
    exact: f64,
}

impl Score {
    fn new() -> Score {
        Score {
            agree: 0,
            ours: 0.0,
            exact: 0.0,
        }
    }

    fn add(&mut self, ours: &[f32], exact: &[f32], target: usize) {
        self.agree += (argmax(ours) == argmax(exact)) as usize;
        self.ours -= lsm(ours, target);
        self.exact -= lsm(exact, target);
    }

    /// Prints the figures; whether they pass.
    fn report(&self, what: &str, n: usize) -> bool {
        let (pa, pb) = ((self.ours / n as f64).exp(), (self.exact / n as f64).exp());
        let share = self.agree as f64 / n as f64;
        let gap = (pa - pb).abs() / pb;
        let pass = share >= MIN_AGREEMENT && gap <= MAX_PPL_GAP;
        println!(
            "{what}: {n} positions: top-1 agreement {}/{n} = {share:.4} (gate >= \
             {MIN_AGREEMENT}), perplexity {pa:.4} (CPU decoder) vs {pb:.4} (exact): {:.3}% apart \
             (gate <= {:.1}%): {}",
            self.agree,
            gap * 100.0,
            MAX_PPL_GAP * 100.0,
            if pass { "pass" } else { "FAIL" }
        );
        pass
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        return Err("usage: cpu_quality smollm2|gemma3 TEXT_FILE N".into());
    }
    let name = args[1].as_str();
    let path = match name {
        "smollm2" => mlx_engine::fetch::smollm2_gguf()?,
        "gemma3" => mlx_engine::fetch::gemma3_270m_gguf()?,
        o => return Err(format!("model {o}? (smollm2 or gemma3)").into()),
    };
    let text = std::fs::read_to_string(&args[2])
        .map_err(|e| format!("reading the text {}: {e}", args[2]))?;
    let n: usize = args[3].parse().map_err(|e| format!("N {}: {e}", args[3]))?;
    // As `--dtype auto` loads a GGUF on the CPU: float32 activations.
    let opts = LoadOptions {
        dtype: Some(Dtype::Float32),
    };
    // As `mlx generate` loads for the CPU decoder: k-quant and other GGML-block weights kept as
    // their blocks; the exact forward dequantizes them on use (the dequantizing loader's bits).
    let (model, g) = load_gguf_model_with(&path, &opts, GgufTensors::Blocks)?;
    if let Some(why) = unsupported(model.as_ref()) {
        println!(
            "{name}: the CPU decoder does not cover this model ({why}); generation runs the \
             exact path there: nothing to gate"
        );
        return Ok(());
    }
    let tok = tokenizer_data(&g.metadata)?.build()?;
    let ids = tok.encode(&text, false)?;
    if ids.len() < n + 1 {
        return Err(format!(
            "the text has {} tokens, {} needed for {n} positions",
            ids.len(),
            n + 1
        )
        .into());
    }
    let ids = &ids[..n + 1];
    let vocab = model.vocab_size() as usize;
    let cache = std::env::var("CACHE").unwrap_or(format!("target/cpu_quality_{name}_{n}.bin"));
    let exact: Vec<f32> = match std::fs::read(&cache) {
        Ok(b) if b.len() == n * vocab * 4 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        _ => {
            let t = std::time::Instant::now();
            let mut out = Vec::with_capacity(n * vocab);
            let mut caches = mlx_engine::generate::make_prompt_cache(model.as_ref(), None)?;
            for chunk in ids[..n].chunks(256) {
                let v: Vec<i32> = chunk.iter().map(|&t| t as i32).collect();
                let x = Array::from_slice(&v, &[1, v.len() as i32])?;
                out.extend(model.forward(&x, Some(&mut caches))?.to_vec::<f32>()?);
            }
            eprintln!(
                "{name}: exact path over {n} positions in {:.0} s (cached in {cache})",
                t.elapsed().as_secs_f64()
            );
            let bytes: Vec<u8> = out.iter().flat_map(|v| v.to_le_bytes()).collect();
            std::fs::write(&cache, bytes)?;
            out
        }
    };
    let exact_at = |i: usize| &exact[i * vocab..(i + 1) * vocab];
    let mut dec = CpuDecoder::new(model.as_ref(), 0, n)?;
    let mut decode = Score::new();
    for (i, &t) in ids[..n].iter().enumerate() {
        let l = dec.feed(&[t])?;
        decode.add(l, exact_at(i), ids[i + 1] as usize);
    }
    dec.reset();
    let mut prefill = Score::new();
    dec.feed_all(&ids[..n], &mut |i, l| {
        prefill.add(l, exact_at(i), ids[i + 1] as usize)
    })?;
    let a = decode.report(&format!("{name} decode path"), n);
    let b = prefill.report(&format!("{name} prefill path"), n);
    if a && b {
        Ok(())
    } else {
        std::process::exit(1)
    }
}

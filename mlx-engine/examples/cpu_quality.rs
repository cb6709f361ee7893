//! Quality figures of the CPU decoder on the real SmolLM2-135M-Instruct Q4_1 GGUF against the
//! exact path, teacher forced one token at a time (the decode path): top-1 agreement and
//! perplexity over the first N next-token predictions of a text file. The exact path's logits
//! are cached in `CACHE` (default `target/cpu_quality_exact.bin`), keyed by nothing: delete it
//! when the text or N changes.
//! `cargo run -p mlx-engine --example cpu_quality -- TEXT_FILE N`

use mlx_core::prelude::*;
use mlx_engine::cpu_decode::CpuDecoder;
use mlx_engine::tokenizer_gguf::tokenizer_data;
use mlx_models::gguf::load_gguf_model;
use mlx_models::load::LoadOptions;

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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let text = std::fs::read_to_string(&args[1])?;
    let n: usize = args[2].parse()?;
    let cache = std::env::var("CACHE").unwrap_or("target/cpu_quality_exact.bin".into());
    let path = mlx_engine::fetch::smollm2_gguf()?;
    let (model, g) = load_gguf_model(
        &path,
        &LoadOptions {
            dtype: Some(Dtype::Float32),
        },
    )?;
    let tok = tokenizer_data(&g.metadata)?.build()?;
    let ids = tok.encode(&text, false)?;
    let ids = &ids[..(n + 1).min(ids.len())];
    let n = ids.len() - 1;
    let vocab = model.vocab_size() as usize;
    let exact: Vec<f32> = match std::fs::read(&cache) {
        Ok(b) if b.len() == n * vocab * 4 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        _ => {
            let mut out = Vec::with_capacity(n * vocab);
            let mut caches = mlx_engine::generate::make_prompt_cache(model.as_ref(), None)?;
            for chunk in ids[..n].chunks(256) {
                let v: Vec<i32> = chunk.iter().map(|&t| t as i32).collect();
                let x = Array::from_slice(&v, &[1, v.len() as i32])?;
                out.extend(model.forward(&x, Some(&mut caches))?.to_vec::<f32>()?);
            }
            let bytes: Vec<u8> = out.iter().flat_map(|v| v.to_le_bytes()).collect();
            std::fs::write(&cache, bytes)?;
            out
        }
    };
    let mut dec = CpuDecoder::new(model.as_ref(), 0, n)?;
    let (mut agree, mut a, mut b) = (0, 0f64, 0f64);
    for (i, &t) in ids[..n].iter().enumerate() {
        let l = dec.feed(&[t])?;
        let r = &exact[i * vocab..(i + 1) * vocab];
        agree += (argmax(l) == argmax(r)) as usize;
        a -= lsm(l, ids[i + 1] as usize);
        b -= lsm(r, ids[i + 1] as usize);
    }
    let (pa, pb) = ((a / n as f64).exp(), (b / n as f64).exp());
    println!(
        "{n} positions: top-1 agreement {agree}/{n} = {:.4}, perplexity {pa:.4} (CPU decoder) vs \
         {pb:.4} (exact): {:.3}% apart",
        agree as f64 / n as f64,
        (pa - pb).abs() / pb * 100.0
    );
    Ok(())
}

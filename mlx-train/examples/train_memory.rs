//! Peak memory and time of one LoRA step (rank 8, every layer) on a random llama, plain and
//! with the memory options: `--grad-checkpoint`, a chunked cross-entropy, both, and the
//! segmented backward.
//!
//! `cargo run --release -p mlx-train --example train_memory -- [HIDDEN LAYERS VOCAB LEN...]`
//! (defaults: 256 4 32000 512 2048). CPU figures for CI-size checks; numbers vary with the
//! machine, so nothing here is asserted.

use std::collections::BTreeMap;
use std::time::Instant;

use mlx_core::prelude::*;
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::LanguageModel;
use mlx_train::data::Batch;
use mlx_train::lora::{linear_to_lora_layers, LoraConfig};
use mlx_train::loss::{chunked_loss, default_loss};
use mlx_train::segmented::segmented_loss_and_grad;
use mlx_train::trainer::loss_and_grad;
use mlx_train::Params;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<i64> = std::env::args()
        .skip(1)
        .map(|s| s.parse())
        .collect::<Result<_, _>>()?;
    let hidden = *a.first().unwrap_or(&256) as i32;
    let layers = *a.get(1).unwrap_or(&4) as i32;
    let vocab = *a.get(2).unwrap_or(&32000) as i32;
    let lens: Vec<i32> = if a.len() > 3 {
        a[3..].iter().map(|&x| x as i32).collect()
    } else {
        vec![512, 2048]
    };
    let inter = hidden * 3;
    let dir = std::env::temp_dir().join(format!("mlx_train_memory_{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config = serde_json::json!({
        "model_type": "llama", "hidden_size": hidden, "num_hidden_layers": layers,
        "intermediate_size": inter, "num_attention_heads": hidden / 64,
        "num_key_value_heads": (hidden / 64 / 2).max(1), "rms_norm_eps": 1e-5,
        "vocab_size": vocab, "tie_word_embeddings": true,
    });
    std::fs::write(dir.join("config.json"), config.to_string())?;
    random::seed(0)?;
    let mut w = BTreeMap::new();
    fn put(w: &mut BTreeMap<String, Array>, k: String, shape: &[i32]) -> mlx_core::Result<()> {
        let a = (&random::normal(shape, Dtype::Float32, None, None, None, None)? * 0.02f32)?;
        w.insert(k, a);
        Ok(())
    }
    put(&mut w, "model.embed_tokens.weight".into(), &[vocab, hidden])?;
    let kv = (hidden / 64 / 2).max(1) * 64;
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        for (n, s) in [
            ("self_attn.q_proj", [hidden, hidden]),
            ("self_attn.k_proj", [kv, hidden]),
            ("self_attn.v_proj", [kv, hidden]),
            ("self_attn.o_proj", [hidden, hidden]),
            ("mlp.gate_proj", [inter, hidden]),
            ("mlp.up_proj", [inter, hidden]),
            ("mlp.down_proj", [hidden, inter]),
        ] {
            put(&mut w, format!("{p}.{n}.weight"), &s)?;
        }
        w.insert(
            format!("{p}.input_layernorm.weight"),
            ops::ones(&[hidden], Dtype::Float32, None)?,
        );
        w.insert(
            format!("{p}.post_attention_layernorm.weight"),
            ops::ones(&[hidden], Dtype::Float32, None)?,
        );
    }
    w.insert(
        "model.norm.weight".into(),
        ops::ones(&[hidden], Dtype::Float32, None)?,
    );
    mlx_core::io::save_safetensors(
        dir.join("model.safetensors"),
        w.iter().map(|(k, v)| (k.as_str(), v)),
        &Default::default(),
    )?;
    drop(w);

    println!("| tokens | mode | peak MB | step s |");
    println!("|---:|---|---:|---:|");
    for &len in &lens {
        for (mode, ckpt, chunk, seg) in [
            ("plain", false, None, None),
            ("grad checkpoint", true, None, None),
            ("chunked CE 256", false, Some(256), None),
            ("checkpoint + chunked CE", true, Some(256), None),
            ("segmented 256", false, None, Some(256)),
        ] {
            let (mut model, _) = load_model_dir(&dir, &LoadOptions::default())?;
            let params = Params::new();
            linear_to_lora_layers(model.as_mut(), -1, &LoraConfig::default(), false, &params)?;
            model.set_grad_checkpoint(ckpt);
            params.set_training(true);
            let tokens = random::randint(0, vocab, &[1, len + 1], Dtype::Int32, None, None)?;
            let batch = Batch {
                tokens,
                lengths: Array::from_slice(&[0i32, len + 1], &[1, 2])?,
                truncated: false,
            };
            let mut weights: Vec<Array> = params.snapshot().into_values().collect();
            weights.push(batch.tokens.clone());
            eval(&weights)?;
            mlx_core::memory::clear_cache()?;
            mlx_core::memory::reset_peak_memory()?;
            let t = Instant::now();
            let f = move |m: &dyn LanguageModel, b: &Array, l: &Array| match chunk {
                Some(c) => chunked_loss(m, b, l, c),
                None => default_loss(m, b, l),
            };
            let (l, _, g) = match seg {
                Some(s) => segmented_loss_and_grad(
                    model.as_ref(),
                    &params,
                    &batch.tokens,
                    &batch.lengths,
                    s,
                )?,
                None => loss_and_grad(model.as_ref(), &params, &f, &batch)?,
            };
            let mut out: Vec<Array> = g.into_values().collect();
            out.push(l);
            eval(&out)?;
            let secs = t.elapsed().as_secs_f64();
            let peak = mlx_core::memory::peak_memory()? as f64 / 1e6;
            println!("| {len} | {mode} | {peak:.0} | {secs:.2} |");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

//! The chunked cross-entropy against `default_loss` on the trained q4 and dense models:
//! one chunk is bit for bit the same loss and gradients; several chunks change only the
//! float32 summation order (stated bound: relative 1e-5 on the loss and every gradient).

use std::path::PathBuf;

use mlx_core::prelude::*;
use mlx_core::testing::assert_bit_equal;
use mlx_models::LanguageModel;
use mlx_train::data::BatchIter;
use mlx_train::loss::{chunked_loss, default_loss};
use mlx_train::nprand::NumpyRandom;
use mlx_train::run::{prepare, RunConfig};
use mlx_train::trainer::loss_and_grad;

fn max_rel(a: &Array, b: &Array) -> f32 {
    let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-30);
    a.iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

#[test]
fn chunked_equals_plain() {
    let tests = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests");
    for (model, run) in [
        ("q4", "q4_completions_mask_adamw_cosine_accum"),
        ("dense", "dense_text_adam"),
    ] {
        let mut c = RunConfig::from_json_file(
            &tests.join("adapters").join(run).join("adapter_config.json"),
        )
        .unwrap();
        c.model = tests.join("models").join(model).display().to_string();
        c.data = tests
            .join("data")
            .join(if model == "q4" { "completions" } else { "text" })
            .display()
            .to_string();
        let out =
            std::env::temp_dir().join(format!("mlx_train_chunk_{model}_{}", std::process::id()));
        c.adapter_path = out.display().to_string();
        c.resume_adapter_file = Some(
            tests
                .join("adapters")
                .join(run)
                .join("adapters.safetensors")
                .display()
                .to_string(),
        );
        let p = prepare(&c).unwrap();
        p.params.set_training(true);
        let mut rng = NumpyRandom::new(c.seed);
        let mut it = BatchIter::new(&p.train, c.batch_size, c.max_seq_length, true).unwrap();
        let batch = it.next_batch(&p.train, &mut rng).unwrap().unwrap();
        let plain = |m: &dyn LanguageModel, b: &Array, l: &Array| default_loss(m, b, l);
        let (l0, n0, g0) = loss_and_grad(p.model.as_ref(), &p.params, &plain, &batch).unwrap();
        let width = batch.tokens.dim(1).unwrap();
        for chunk in [width, 7, 16] {
            let f = move |m: &dyn LanguageModel, b: &Array, l: &Array| chunked_loss(m, b, l, chunk);
            let (l1, n1, g1) = loss_and_grad(p.model.as_ref(), &p.params, &f, &batch).unwrap();
            assert_bit_equal(&n1, &n0).unwrap();
            if chunk >= width - 1 {
                assert_bit_equal(&l1, &l0).unwrap();
                for (k, g) in &g0 {
                    assert_bit_equal(&g1[k], g).unwrap_or_else(|m| panic!("{model} {k}: {m}"));
                }
            } else {
                assert!(max_rel(&l1, &l0) < 1e-5, "{model} chunk {chunk} loss");
                for (k, g) in &g0 {
                    let r = max_rel(&g1[k], g);
                    assert!(r < 1e-5, "{model} chunk {chunk} {k}: relative {r}");
                }
            }
        }
        let _ = std::fs::remove_dir_all(&out);
    }
}

//! The graph decoder against the model's MLX forward on the GPU (the `cuda` feature; run it on
//! the lent H200, `xtask/gpu/`): teacher-forced logits within
//! [`TEACHER_FORCED_BOUNDS`] and greedy decoding equal to its own teacher-forced argmax, on the
//! mlx-lm-saved llama fixtures (bf16 tied and untied, 8-bit with bf16 scales). The same check
//! on the bench models is `bench_generate --graph-check` (`xtask/gpu/graph.sh`). It also checks
//! that `kernel_breakdown` and `trace_step` leave the decoder's state as a step leaves it.
//! Without a CUDA driver the test says so and passes.

use std::path::PathBuf;

use mlx_core::ops;
use mlx_core::{Array, Dtype};
use mlx_kernels::graph_decode::{compare_logits, GraphDecoder, TEACHER_FORCED_BOUNDS};
use mlx_models::load::{load_model_dir, LoadOptions};

/// Equal, bit for bit.
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn graph_decoder_follows_the_mlx_forward() {
    if !GraphDecoder::available() {
        eprintln!("no CUDA driver: skipped");
        return;
    }
    // The fixtures where this was built, or (a binary carried to the GPU machine) under the
    // working directory's checkout.
    let mut root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../mlx-models/tests/models");
    if !root.exists() {
        root = PathBuf::from("mlx-models/tests/models");
    }
    for name in ["dense_bf16_mha", "dense_bf16_untied", "q8_g32_bf16"] {
        let dir = root.join(name);
        let model = load_model_dir(&dir, &LoadOptions::default()).unwrap().0;
        let vocab = model.vocab_size();
        let prompt: Vec<i32> = (0..40).map(|i| (i * 7919 + 13) % vocab).collect();
        let mut caches = model.make_cache();
        let x = Array::from_slice(&prompt, &[1, prompt.len() as i32]).unwrap();
        let logits = model.forward(&x, Some(&mut caches)).unwrap();
        let n = logits.dim(1).unwrap();
        let last = ops::slice_axis(&logits, 1, n - 1, n, None).unwrap();
        let mut token = ops::argmax(&last, -1, false, None)
            .unwrap()
            .astype(Dtype::Uint32)
            .unwrap()
            .to_vec::<u32>()
            .unwrap()[0];
        let kv: Vec<(Array, Array)> = caches
            .iter()
            .map(|c| match c.fetch().unwrap() {
                Some(mlx_cache::Kv::Dense { keys, values }) => (keys, values),
                _ => panic!("{name}: not a plain KV cache"),
            })
            .collect();
        let mut dec = GraphDecoder::load(&dir, 128).unwrap();
        dec.set_prefix(&kv).unwrap();
        let first = token;
        let (mut agree, steps) = (0, 24);
        let mut ours_greedy = Vec::new();
        for _ in 0..steps {
            let x = Array::from_slice(&[token as i32], &[1, 1]).unwrap();
            let reference = model
                .forward(&x, Some(&mut caches))
                .unwrap()
                .astype(Dtype::Float32)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            let ours = dec.step_logits(token).unwrap();
            let c = compare_logits(&reference, &ours);
            assert!(
                c.rel_diff <= TEACHER_FORCED_BOUNDS.0,
                "{name}: relative logit difference {}",
                c.rel_diff
            );
            agree += usize::from(c.reference_token == c.ours_token);
            ours_greedy.push(c.ours_token as u32);
            token = c.reference_token as u32;
        }
        let share = agree as f32 / steps as f32;
        assert!(
            share >= TEACHER_FORCED_BOUNDS.1,
            "{name}: greedy agreement {share}"
        );
        // Greedy decoding from the same prefix gives the decoder's own argmax sequence when
        // it is fed its own tokens: compare the first token, which both runs see the same way.
        dec.set_prefix(&kv).unwrap();
        let mut got = Vec::new();
        dec.generate(first, 4, |t| got.push(t)).unwrap();
        assert_eq!(got.len(), 4);
        assert_eq!(got[0], ours_greedy[0], "{name}");
        assert_eq!(dec.position(), prompt.len() + 4);
        // The breakdown replays each part of the step alone and keeps the decoder's state: the
        // next step's logits are the same, bit for bit, with or without one in between.
        dec.set_prefix(&kv).unwrap();
        let plain = dec.step_logits(first).unwrap();
        dec.set_prefix(&kv).unwrap();
        let parts = dec.kernel_breakdown(2).unwrap();
        assert_eq!(parts.len(), 8, "{name}");
        assert!(parts.iter().all(|p| p.us_per_step > 0.0 && p.kernels > 0));
        assert_eq!(dec.position(), prompt.len());
        let after = dec.step_logits(first).unwrap();
        assert!(
            same_bits(&plain, &after),
            "{name}: logits changed by the breakdown"
        );
        // A traced step is the same step: the one after it gives the same logits, bit for
        // bit, as after a plain one.
        dec.set_prefix(&kv).unwrap();
        dec.step_logits(first).unwrap();
        let plain2 = dec.step_logits(ours_greedy[0]).unwrap();
        dec.set_prefix(&kv).unwrap();
        let records = dec.trace_step(first).unwrap();
        assert_eq!(dec.position(), prompt.len() + 1);
        let got = dec.step_logits(ours_greedy[0]).unwrap();
        assert!(
            same_bits(&plain2, &got),
            "{name}: logits changed by tracing"
        );
        for kind in 1..=3 {
            assert!(
                records.iter().any(|r| r.what & 0xff == kind),
                "{name}: no record of kernel kind {kind}"
            );
        }
        assert!(
            records
                .iter()
                .all(|r| r.times.windows(2).all(|w| w[0] <= w[1])),
            "{name}: a record's times go backwards"
        );
        // The first weights' arrival: between the prologue and the end in the matrix-vector
        // kernels, none in attention.
        assert!(
            records.iter().all(|r| if r.what & 0xff == 2 {
                r.first_data == 0
            } else {
                (r.times[2]..=r.times[3]).contains(&r.first_data)
            }),
            "{name}: a record's first_data is out of place"
        );
        // At least a record a kernel: per layer q/k/v, attention and three matrix-vector
        // products.
        assert!(
            records.len() > 5 * model.num_layers(),
            "{name}: {} records",
            records.len()
        );
        // Bad input is an error, not a crash.
        assert!(dec.step_logits(vocab as u32).is_err());
        assert!(dec.generate(first, 1000, |_| {}).is_err());
    }
}

//! Peak memory of one LoRA step over a 4-bit base (MLX's own peak counter) with the three
//! memory options together (`--grad-checkpoint --segment-length --ce-chunk-size`), against
//! the arithmetic of `mlx_train::memory::predicted_peak` (weights + per-layer checkpoints +
//! one layer's recompute + the keys and values of every segment and their gradients + one
//! cross-entropy chunk), on a scaled-down llama so it runs in seconds.

use mlx_train::memory::{measure_step, write_random_llama, Shape, StepOptions};

#[test]
fn checkpointed_segmented_chunked_step_fits_the_arithmetic() {
    let shape = Shape {
        hidden: 256,
        layers: 4,
        vocab: 32000,
        q4: true,
    };
    let dir = std::env::temp_dir().join(format!("mlx_train_mem_test_{}", std::process::id()));
    write_random_llama(&dir, &shape).unwrap();
    let len = 2048;
    let plain = measure_step(&dir, &shape, len, &StepOptions::default()).unwrap();
    let all = StepOptions {
        grad_checkpoint: true,
        ce_chunk: Some(256),
        segment: Some(512),
    };
    let m = measure_step(&dir, &shape, len, &all).unwrap();
    let predicted = m.predicted.unwrap();
    let mb = |b: usize| b as f64 / 1e6;
    eprintln!(
        "{len} tokens: plain peak {:.0} MB; ckpt+seg+ce peak {:.0} MB, predicted {:.0} MB, \
         held before {:.0} MB",
        mb(plain.peak),
        mb(m.peak),
        mb(predicted),
        mb(m.before)
    );
    let _ = std::fs::remove_dir_all(&dir);
    // Same loss up to the summation order.
    assert!((m.loss - plain.loss).abs() <= 1e-5 * plain.loss.abs());
    // The arithmetic bounds the measured peak, and is not loose by more than 2x in what the
    // step adds over the weights.
    assert!(m.peak <= predicted, "peak {} > predicted {predicted}", m.peak);
    assert!(
        2 * (m.peak - m.before) >= predicted - m.before,
        "the prediction {predicted} is more than twice what the step added ({})",
        m.peak - m.before
    );
    // And the options cut the step's own memory to a fraction of the plain step's.
    assert!(4 * (m.peak - m.before) < plain.peak - plain.before);
}

//! Peak memory of one LoRA step over a 4-bit base (MLX's own peak counter) with the three
//! memory options together (`--grad-checkpoint --segment-length --ce-chunk-size`), against
//! the arithmetic of `mlx_train::memory::predicted_peak` (weights + per-layer checkpoints +
//! one layer's recompute + the keys and values of every segment and their gradients + one
//! cross-entropy chunk), on a scaled-down llama so it runs in seconds.

use mlx_train::memory::{measure_step, write_random_llama, Shape, StepOptions};

#[test]
fn checkpointed_segmented_chunked_step_fits_the_arithmetic() {
    let shape = Shape {
        hidden: 128,
        layers: 4,
        vocab: 4096,
        q4: true,
    };
    let dir = std::env::temp_dir().join(format!("mlx_train_mem_test_{}", std::process::id()));
    write_random_llama(&dir, &shape).unwrap();
    let len = 1024;
    let plain = measure_step(&dir, &shape, len, &StepOptions::default()).unwrap();
    let all = StepOptions {
        grad_checkpoint: true,
        ce_chunk: Some(128),
        segment: Some(256),
        flash_block: None,
    };
    let m = measure_step(&dir, &shape, len, &all).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let predicted = m.predicted.unwrap();
    let mb = |b: usize| b as f64 / 1e6;
    eprintln!(
        "{len} tokens: plain peak {:.1} MB; ckpt+seg+ce peak {:.1} MB, predicted {:.1} MB, \
         held before {:.1} MB",
        mb(plain.peak),
        mb(m.peak),
        mb(predicted),
        mb(m.before)
    );
    // Same loss up to the summation order.
    assert!((m.loss - plain.loss).abs() <= 1e-5 * plain.loss.abs());
    // What the step adds over the weights is what the arithmetic says, within 20%: nothing
    // else (a `[tokens, vocab]` logits array, earlier segments' copies of the keys and
    // values, a whole model's activations) stays alive.
    let (step, expected) = ((m.peak - m.before) as f64, (predicted - m.before) as f64);
    assert!(
        (step - expected).abs() <= 0.2 * expected,
        "step peak {step} vs predicted {expected}"
    );
    // And the options cut the step's own memory to a fraction of the plain step's.
    assert!(3.0 * step < (plain.peak - plain.before) as f64);
}

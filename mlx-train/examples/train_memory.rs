//! Peak memory and time of one LoRA step (rank 8, every layer) on a random llama, plain and
//! with the memory options: `--grad-checkpoint`, a chunked cross-entropy, both, the
//! segmented backward, and all three together; beside each memory-option row, the peak the
//! arithmetic predicts for it (see `predicted`).
//!
//! `cargo run -p mlx-train --example train_memory -- [--q4] [--seg S] [--chunk C] [--flash B]
//! [--modes plain,ckpt+seg+ce,...] [HIDDEN LAYERS VOCAB LEN...]` (defaults: 256 4 32000 512
//! 2048, segment 512, chunk 256, flash block 256; all modes;
//! `--q4`: 4-bit group-64 base, LoRA over quantized linears). CPU figures for CI-size checks;
//! times vary with the machine, so nothing here is asserted (`tests/memory.rs` asserts the
//! peaks).

use std::time::Instant;

use mlx_core::prelude::*;
use mlx_train::memory::{measure_step, write_random_llama, Shape, StepOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut nums: Vec<i64> = Vec::new();
    let (mut q4, mut seg, mut chunk, mut flash) = (false, 512, 256, 256);
    let mut modes: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--q4" => q4 = true,
            "--seg" => seg = args.next().ok_or("--seg N")?.parse()?,
            "--chunk" => chunk = args.next().ok_or("--chunk N")?.parse()?,
            "--flash" => flash = args.next().ok_or("--flash N")?.parse()?,
            "--modes" => {
                modes = args
                    .next()
                    .ok_or("--modes a,b")?
                    .split(',')
                    .map(String::from)
                    .collect()
            }
            n => nums.push(n.parse()?),
        }
    }
    let shape = Shape {
        hidden: *nums.first().unwrap_or(&256) as i32,
        layers: *nums.get(1).unwrap_or(&4) as i32,
        vocab: *nums.get(2).unwrap_or(&32000) as i32,
        q4,
    };
    let lens: Vec<i32> = if nums.len() > 3 {
        nums[3..].iter().map(|&x| x as i32).collect()
    } else {
        vec![512, 2048]
    };
    let dir = std::env::temp_dir().join(format!("mlx_train_memory_{}", std::process::id()));
    write_random_llama(&dir, &shape)?;
    println!("| tokens | mode | peak MB | predicted MB | step s |");
    println!("|---:|---|---:|---:|---:|");
    for &len in &lens {
        for (mode, ckpt, ce, sg, fl) in [
            ("plain", false, None, None, None),
            ("ckpt", true, None, None, None),
            ("ce", false, Some(chunk), None, None),
            ("ckpt+ce", true, Some(chunk), None, None),
            ("seg", false, None, Some(seg), None),
            ("ckpt+seg+ce", true, Some(chunk), Some(seg), None),
            ("ckpt+ce+flash", true, Some(chunk), None, Some(flash)),
            (
                "ckpt+seg+ce+flash",
                true,
                Some(chunk),
                Some(seg),
                Some(flash),
            ),
        ] {
            if !modes.is_empty() && !modes.iter().any(|m| m == mode) {
                continue;
            }
            let opts = StepOptions {
                grad_checkpoint: ckpt,
                ce_chunk: ce,
                segment: sg,
                flash_block: fl,
            };
            let t = Instant::now();
            let m = measure_step(&dir, &shape, len, &opts)?;
            let secs = t.elapsed().as_secs_f64();
            let pred = m
                .predicted
                .map_or("-".into(), |p| format!("{:.0}", p as f64 / 1e6));
            println!(
                "| {len} | {mode} | {:.0} | {pred} | {secs:.2} |",
                m.peak as f64 / 1e6
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

//! Times the CPU decoder alone on the default model (SmolLM2-135M-Instruct Q4_1 GGUF, loaded
//! as `--dtype auto` loads it on the CPU): prefill of a 128-token prompt, then single-token
//! decode steps. `cargo run --release -p mlx-engine --example cpu_decode_bench [THREADS]
//! [MODE[,MODE...]] [ROUNDS]` (the activations of the products, `f32`, `int8`, `int16`,
//! `int16q8int8` or `int8vnni`, default int16; with several, the rounds alternate between
//! them, ROUNDS each, default 3). Besides the
//! rates it prints the process's CPU time per decoded token, steadier than wall time on a
//! machine other work loads.

use std::time::Instant;

use mlx_core::Dtype;
use mlx_engine::cpu_decode::CpuDecoder;
use mlx_models::gguf::{load_gguf_model_with, GgufTensors};
use mlx_models::load::LoadOptions;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let threads: usize = std::env::args().nth(1).map_or(Ok(0), |s| s.parse())?;
    let path = mlx_engine::fetch::smollm2_gguf()?;
    let opts = LoadOptions {
        dtype: Some(Dtype::Float32),
    };
    let (model, _) = load_gguf_model_with(&path, &opts, GgufTensors::Blocks)?;
    let mut dec = CpuDecoder::new(model.as_ref(), threads, 1024)?;
    // One or more activation modes, comma-separated: the rounds alternate between them.
    let modes = std::env::args()
        .nth(2)
        .unwrap_or_else(|| "int16".into())
        .split(',')
        .map(|m| match m {
            "f32" => Ok(mlx_core::cpu::Activations::F32),
            "int8" => Ok(mlx_core::cpu::Activations::Int8),
            "int16" => Ok(mlx_core::cpu::Activations::Int16),
            "int16q8int8" => Ok(mlx_core::cpu::Activations::Int16Q8Int8),
            "int8vnni" => Ok(mlx_core::cpu::Activations::Int8Vnni),
            "int8normed" => Ok(mlx_core::cpu::Activations::Int8Normed),
            o => Err(format!(
                "activations: {o}? (f32, int8, int16, int16q8int8, int8vnni or int8normed)"
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let rounds: usize = std::env::args().nth(3).map_or(Ok(3), |s| s.parse())?;
    let prompt: Vec<u32> = (0..128u32).map(|i| (i * 7919 + 13) % 49152).collect();
    for round in 0..rounds * modes.len() {
        dec.set_activations(modes[round % modes.len()]);
        dec.reset();
        let t = Instant::now();
        dec.feed(&prompt)?;
        let prefill = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let c0 = cpu_seconds();
        let steps = 64;
        for i in 0..steps {
            dec.feed(&[(i * 31 + 5) as u32])?;
        }
        let decode = t.elapsed().as_secs_f64();
        let cpu_ms = (cpu_seconds() - c0) * 1e3 / steps as f64;
        println!(
            "round {round}: {} threads, {}, {:?} activations: prefill {:.1} tok/s, decode {:.1} \
             tok/s, {cpu_ms:.2} CPU ms a decoded token, load {}",
            dec.threads(),
            dec.isa(),
            dec.activations(),
            prompt.len() as f64 / prefill,
            steps as f64 / decode,
            std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .trim()
        );
    }
    Ok(())
}

/// User + system CPU time of this process so far (Linux `/proc/self/stat`, 100 Hz ticks).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

//! Times the CPU decoder alone on the default model (SmolLM2-135M-Instruct Q4_1 GGUF, loaded
//! as `--dtype auto` loads it on the CPU): prefill of a 128-token prompt, then single-token
//! decode steps. `cargo run --release -p mlx-engine --example cpu_decode_bench [THREADS]`.

use std::time::Instant;

use mlx_core::Dtype;
use mlx_engine::cpu_decode::CpuDecoder;
use mlx_models::gguf::load_gguf_model;
use mlx_models::load::LoadOptions;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let threads: usize = std::env::args().nth(1).map_or(Ok(0), |s| s.parse())?;
    let path = mlx_engine::fetch::smollm2_gguf()?;
    let opts = LoadOptions {
        dtype: Some(Dtype::Float32),
    };
    let (model, _) = load_gguf_model(&path, &opts)?;
    let mut dec = CpuDecoder::new(model.as_ref(), threads, 1024)?;
    let prompt: Vec<u32> = (0..128u32).map(|i| (i * 7919 + 13) % 49152).collect();
    for round in 0..3 {
        dec.reset();
        let t = Instant::now();
        dec.feed(&prompt)?;
        let prefill = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let steps = 64;
        for i in 0..steps {
            dec.feed(&[(i * 31 + 5) as u32])?;
        }
        let decode = t.elapsed().as_secs_f64();
        println!(
            "round {round}: {} threads, {}: prefill {:.1} tok/s, decode {:.1} tok/s",
            dec.threads(),
            dec.isa(),
            prompt.len() as f64 / prefill,
            steps as f64 / decode
        );
    }
    Ok(())
}

//! Times the decode attention of a speculative verification pass (`m` query rows of one
//! sequence at positions `start..start + m`, one `cpu::attention_f16` call) at SmolLM2-135M's
//! heads (9 query heads, 3 KV heads of 64), cycling through 30 layers' float16 caches as a
//! pass does: `cargo run --release -p mlx-core --example cpu_attention_rows -- [THREADS]
//! [START] [MAX_ROWS] [REPS]`. Prints the fastest and the median call per row count and each
//! as a multiple of the one-row call (session 29: each extra row costs ~0.7-0.8 of the first;
//! `results/bench/2026-12-05-s29-spec/`).

use half::f16;
use mlx_core::cpu::{attention_f16, AttentionShape, CpuContext};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = |i: usize, d: usize| {
        std::env::args()
            .nth(i)
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (threads, start, max_rows, reps) = (arg(1, 2), arg(2, 230), arg(3, 6), arg(4, 300));
    let (nh, nkv, hd, cap, layers) = (9usize, 3usize, 64usize, 512usize, 30usize);
    let ctx = CpuContext::new(threads)?;
    let mut s = 7u64;
    let mut unit = move || {
        s = s
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let caches: Vec<(Vec<f16>, Vec<f16>)> = (0..layers)
        .map(|_| {
            let k = (0..nkv * cap * hd).map(|_| f16::from_f32(unit())).collect();
            let v = (0..nkv * cap * hd).map(|_| f16::from_f32(unit())).collect();
            (k, v)
        })
        .collect();
    let shape = AttentionShape {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        capacity: cap,
    };
    let mut base = (0.0, 0.0);
    for m in 1..=max_rows.min(cap - start) {
        let q: Vec<f32> = (0..m * nh * hd).map(|_| unit()).collect();
        let mut out = vec![0f32; m * nh * hd];
        let mut times = Vec::with_capacity(reps);
        for i in 0..reps {
            let (k, v) = &caches[i % layers];
            let t = std::time::Instant::now();
            attention_f16(&ctx, shape, &q, k, v, start, m, 0.125, &mut out)?;
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let (best, med) = (times[0], times[times.len() / 2]);
        if m == 1 {
            base = (best, med);
        }
        println!(
            "threads {threads} start {start} m={m}: fastest {:.1} us ({:.2}), median {:.1} us ({:.2})",
            best * 1e6,
            best / base.0,
            med * 1e6,
            med / base.1
        );
    }
    Ok(())
}

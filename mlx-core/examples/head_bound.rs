//! Checks, on random Q8_0-shaped heads, the bound a greedy verify row could use to read the
//! head with int8 inputs (#33, session 30; `results/bench/2026-12-05-s30-spec/README.md`,
//! section 2): for logits `L` (int16 inputs, `Activations::Int16`: what decoding computes) and
//! `A` (int8 inputs, `Activations::Int16Q8Int8` on a symmetric 8-bit matrix), per output `r`
//! and input row,
//! `|L_r - A_r| <= e_r = sum_b |s_rb| m_b (sum_k |k_rk| (1/254 + 1/65534) + 4096/65534) * 1.01
//! + 2^-17 sum_b |s_rb| (sum_k |k_rk| + 4096) m_b`
//! (`k` the signed codes, `m_b` a block of 32 inputs' largest magnitude; the int16 term
//! counts the `-128 x scale` biases against the inputs' float sums, the last term both
//! kernels' float rounding). Prints the largest `|L - A| / e` (must stay below 1), how many
//! outputs are candidates (`A_r + e_r >= max_j (A_j - e_j)`) and whether `L`'s argmax is
//! always among them. `cargo run --release -p mlx-core --example head_bound -- [TRIALS] [ROWS]`
//! (`ROWS` input rows a product, default 4).

use half::f16;
use mlx_core::cpu::{
    matmul_t_each_with, Activations, CpuContext, Floats, MatJob, Matrix, RowsScratch,
};

#[path = "support/bench_data.rs"]
mod bench_data;
use bench_data::Lcg;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let trials: usize = std::env::args()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let m: usize = std::env::args()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let (rows, cols) = (8192usize, 576usize);
    let blocks = cols / 32;
    let ctx = CpuContext::new(1)?;
    let mut scratch = RowsScratch::default();
    let mut rng = Lcg(11);
    let (mut worst, mut cand_sum, mut cand_max, mut cases, mut missed) =
        (0f64, 0usize, 0usize, 0usize, 0usize);
    for trial in 0..trials {
        let words: Vec<u32> = (0..rows * cols / 4).map(|_| rng.next()).collect();
        let scales: Vec<f16> = (0..rows * blocks)
            .map(|_| f16::from_f32(0.001 + 0.02 * (rng.unit() + 0.5)))
            .collect();
        let w = Matrix::symmetric(&words, Floats::F16(&scales), rows, cols, 8, 32)?;
        // Inputs: small values, an outlier channel as a final norm's (up to ~45), a second one.
        let mut x: Vec<f32> = (0..m * cols).map(|_| rng.unit() * 2.0).collect();
        for t in 0..m {
            x[t * cols + (trial * 7) % cols] = 20.0 + 25.0 * (rng.unit() + 0.5);
            x[t * cols + (trial * 131 + 300) % cols] = -8.0 * (rng.unit() + 0.5);
        }
        let mut l = vec![0f32; m * rows];
        let mut a = vec![0f32; m * rows];
        for (act, out) in [
            (Activations::Int16, &mut l),
            (Activations::Int16Q8Int8, &mut a),
        ] {
            let mut jobs = [MatJob {
                w: &w,
                bias: None,
                out,
            }];
            matmul_t_each_with(&ctx, act, &x, m, &mut jobs, &mut scratch)?;
        }
        if l == a {
            return Err("int8 and int16 logits are the same: the int8 path was not taken".into());
        }
        // Per row and block: |s| sum |k| (bytes are 128 + k).
        let bytes: Vec<u8> = words.iter().flat_map(|v| v.to_le_bytes()).collect();
        let wk: Vec<(f64, f64)> = (0..rows * blocks)
            .map(|rb| {
                let (r, b) = (rb / blocks, rb % blocks);
                let k: f64 = bytes[r * cols + b * 32..r * cols + b * 32 + 32]
                    .iter()
                    .map(|&v| (v as f64 - 128.0).abs())
                    .sum();
                (scales[rb].to_f64().abs(), k)
            })
            .collect();
        for t in 0..m {
            let mb: Vec<f64> = (0..blocks)
                .map(|b| {
                    x[t * cols + b * 32..t * cols + b * 32 + 32]
                        .iter()
                        .fold(0f64, |z, v| z.max(v.abs() as f64))
                })
                .collect();
            let e: Vec<f64> = (0..rows)
                .map(|r| {
                    (0..blocks)
                        .map(|b| {
                            let (s, k) = wk[r * blocks + b];
                            s * mb[b]
                                * ((k * (1.0 / 254.0 + 1.0 / 65534.0) + 4096.0 / 65534.0) * 1.01
                                    + (k + 4096.0) * 2f64.powi(-17))
                        })
                        .sum()
                })
                .collect();
            let (lt, at) = (&l[t * rows..(t + 1) * rows], &a[t * rows..(t + 1) * rows]);
            for r in 0..rows {
                worst = worst.max((lt[r] as f64 - at[r] as f64).abs() / e[r]);
            }
            let lo = (0..rows)
                .map(|r| at[r] as f64 - e[r])
                .fold(f64::MIN, f64::max);
            let cands: Vec<usize> = (0..rows).filter(|&r| at[r] as f64 + e[r] >= lo).collect();
            let best = (0..rows).fold(0, |bi, r| if lt[r] > lt[bi] { r } else { bi });
            missed += usize::from(!cands.contains(&best));
            cand_sum += cands.len();
            cand_max = cand_max.max(cands.len());
            cases += 1;
        }
    }
    println!(
        "{trials} heads of {rows} x {cols}, {m} input rows each: largest |L - A| / e = {worst:.4} \
         (must be < 1); candidates a row: mean {:.1}, max {cand_max} of {rows}; L's argmax \
         outside the candidates: {missed} of {cases}",
        cand_sum as f64 / cases as f64
    );
    Ok(())
}

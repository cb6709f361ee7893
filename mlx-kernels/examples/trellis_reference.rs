//! The CPU references `xtask/gpu/trellis_emulate.py` checks the CUDA trellis kernels
//! (`graph_trellis.cu`) against, on seeded random trellis matrices at SmolLM2-135M's shapes:
//!
//! ```text
//! cargo run -p mlx-kernels --example trellis_reference -- OUT_DIR
//! ```
//!
//! writes `OUT_DIR/case_NN/` for each case: `meta.json` (the code's shape, the matrix's, the
//! Hadamard blocks and their `1 / sqrt(block)` factors), the inputs (`words.u32`, `scales.f32`,
//! `su.f32`, `sv.f32`, `x.f32`: bfloat16 values, `normw.f32`) and the references, each from
//! `mlx_core::cpu::trellis`'s own functions:
//! - `decoded.f32`: `decode_row` of every row (the L2 reference of `trellis_decode`);
//! - `xh.f32`: `fwht_blocks(sv * x)` (the L2 reference of `trellis_input`);
//! - `z.f32`: the CPU kernel's product of `xh` (`TrellisMatvec::rows`);
//! - `yt.f32`: `su * fwht_blocks(z)` (the L2 reference of `trellis_output` on `z`);
//! - `y.f32`: `TrellisView::matvec(x)`, the CPU decoder's whole trellis linear.
//!
//! Six codes: `1mad`, `1mad8` from case `mad8_from` on, `1mad8h` from case `mad8h_from` on,
//! and the S-box codes (`gauss7s`, `gauss8s`, `1mad8s`) from case `sbox_from` on (`meta.json`'s
//! `code`). Words are random bits (every bit stream is a valid tail-biting code),
//! except the cases coded from a Gaussian matrix by `quantize`. Little-endian raw files.

use std::io::Write;
use std::path::Path;

use mlx_core::cpu::trellis::{self as tc, TrellisCode, TrellisSpec};

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut x = self.0;
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Roughly Gaussian (the sum of four uniforms, centred and scaled).
    fn gauss(&mut self) -> f32 {
        let s: f32 = (0..4).map(|_| self.unit()).sum();
        (s - 2.0) * 1.732
    }
}

/// float32 to the nearest bfloat16 value (ties to even), as float32.
fn bf16(v: f32) -> f32 {
    let u = v.to_bits();
    let r = u.wrapping_add(0x7FFF + ((u >> 16) & 1)) & 0xFFFF_0000;
    f32::from_bits(r)
}

fn write<T: Copy>(dir: &Path, name: &str, v: &[T], to: fn(T) -> [u8; 4]) {
    let mut f = std::fs::File::create(dir.join(name)).expect("create a reference file");
    let bytes: Vec<u8> = v.iter().flat_map(|&x| to(x)).collect();
    f.write_all(&bytes).expect("write a reference file");
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args()
        .nth(1)
        .ok_or("usage: trellis_reference OUT_DIR")?;
    let out = Path::new(&out);
    // SmolLM2-135M's linears: q/o, k/v, gate/up, down.
    let shapes = [(576usize, 576usize), (192, 576), (1536, 576), (576, 1536)];
    // (k, L, block, rows, cols, coded from a Gaussian matrix), 1mad
    let mut cases = Vec::new();
    for k in [2u32, 3, 4] {
        for &(r, c) in &shapes {
            cases.push((k, 8u32, 32usize, r, c, false));
        }
        cases.push((k, 12, 64, 576, 576, false));
        cases.push((k, 12, 64, 576, 1536, false));
    }
    // The general path: other state windows and blocks.
    cases.push((2, 16, 64, 192, 576, false));
    cases.push((3, 10, 128, 192, 1536, false));
    cases.push((4, 6, 8, 192, 576, false));
    // A real code: a Gaussian matrix through the Viterbi encoder.
    cases.push((3, 8, 32, 576, 576, true));
    // Wide Hadamard blocks (the transforms' strided passes past 512): 4,096 and 2,048 rows
    // (an 8B's q/o/down and gate/up outputs), 4,096 and 14,336 inputs (2,048 a block: down's),
    // and 48 rows (blocks of 16, a warp's last run of 32 part-filled).
    cases.push((3, 8, 32, 4096, 64, false));
    cases.push((3, 8, 32, 64, 14336, false));
    cases.push((3, 8, 32, 2048, 96, false));
    cases.push((3, 8, 32, 48, 4096, false));
    // 1mad8 (its table in the product where L is 8 and the blocks 32 or 64): the 135M's q/o,
    // gate and down shapes at 3 bits in blocks of 32 and 64, 2 and 4 bits, a real code, and
    // the general path (L 6; blocks of 128).
    let mad8_from = cases.len();
    for block in [32usize, 64] {
        for (r, c) in [(576usize, 576usize), (1536, 576), (576, 1536)] {
            cases.push((3, 8, block, r, c, false));
        }
    }
    cases.push((2, 8, 32, 192, 576, false));
    cases.push((4, 8, 64, 192, 576, false));
    cases.push((3, 8, 32, 576, 576, true));
    cases.push((3, 8, 64, 576, 576, true));
    cases.push((2, 6, 64, 192, 576, false));
    cases.push((2, 8, 128, 192, 1536, false));
    // 1mad8h (1mad8's table at each L-bit state's hashed index where L is 12 and the blocks 32
    // or 64): the 135M's q/o, gate and down shapes at 3 bits in blocks of 64 (the default
    // conversion's) and 32, 2 and 4 bits, a real code in blocks of 64, the wide input (the
    // 8B's down: 14,336), and the general path (L 9, L 16; blocks of 128).
    let mad8h_from = cases.len();
    for block in [64usize, 32] {
        for (r, c) in [(576usize, 576usize), (1536, 576), (576, 1536)] {
            cases.push((3, 12, block, r, c, false));
        }
    }
    cases.push((2, 12, 64, 192, 576, false));
    cases.push((4, 12, 64, 192, 576, false));
    cases.push((2, 12, 32, 192, 576, false));
    cases.push((4, 12, 32, 192, 576, false));
    cases.push((3, 12, 64, 576, 576, true));
    cases.push((3, 12, 64, 64, 14336, false));
    cases.push((3, 9, 64, 192, 576, false));
    cases.push((2, 16, 64, 192, 576, false));
    cases.push((3, 12, 128, 192, 1536, false));
    // The S-box codes (the S-box and the code's table where L is 12 and the blocks 32 or 64):
    // gauss7s at the 135M's q/o, gate and down shapes at 3 bits in blocks of 64 and a real code
    // (its conversion's shape), blocks of 32, 2 and 4 bits, the wide input, and the general
    // path (L 9, blocks of 128); gauss8s and 1mad8s at 3 bits in blocks of 64 and 32, a real
    // code, and the general path (L 16).
    let sbox_from = cases.len();
    let mut sbox_codes = Vec::new();
    for (r, c) in [(576usize, 576usize), (1536, 576), (576, 1536)] {
        cases.push((3, 12, 64, r, c, false));
    }
    cases.push((3, 12, 64, 576, 576, true));
    cases.push((3, 12, 32, 576, 1536, false));
    cases.push((2, 12, 64, 192, 576, false));
    cases.push((4, 12, 32, 192, 576, false));
    cases.push((3, 12, 64, 64, 14336, false));
    cases.push((3, 9, 64, 192, 576, false));
    cases.push((3, 12, 128, 192, 1536, false));
    sbox_codes.resize(cases.len() - sbox_from, TrellisCode::Gauss7S);
    for code in [TrellisCode::Gauss8S, TrellisCode::Mad8S] {
        cases.push((3, 12, 64, 576, 1536, false));
        cases.push((3, 12, 32, 1536, 576, false));
        cases.push((3, 12, 64, 576, 576, true));
        cases.push((2, 16, 64, 192, 576, false));
        sbox_codes.resize(cases.len() - sbox_from, code);
    }
    let pool = mlx_core::cpu::ThreadPool::new(mlx_core::cpu::available_threads())
        .map_err(|e| e.to_string())?;
    for (i, &(k, l, block, rows, cols, coded)) in cases.iter().enumerate() {
        let code = if i >= sbox_from {
            sbox_codes[i - sbox_from]
        } else if i >= mad8h_from {
            TrellisCode::Mad8H
        } else if i >= mad8_from {
            TrellisCode::Mad8
        } else {
            TrellisCode::Mad
        };
        let spec = TrellisSpec { k, l, block, code };
        spec.check_shape(rows, cols)?;
        let seed = 0x7E11_1500 + i as u64;
        let path = format!("model.layers.{i}.mlp.proj");
        let mut rng = Rng(seed);
        let wpr = cols * k as usize / 32;
        let (words, scales) = if coded {
            let w: Vec<f32> = (0..rows * cols).map(|_| rng.gauss() * 0.02).collect();
            tc::quantize(&spec, &w, rows, cols, tc::layer_seed(seed, &path), 2)?
        } else {
            let words: Vec<u32> = (0..rows * wpr).map(|_| rng.next() as u32).collect();
            let scales: Vec<f32> = (0..rows).map(|_| 0.01 + 0.03 * rng.unit()).collect();
            (words, scales)
        };
        let (su, sv) = tc::layer_signs(tc::layer_seed(seed, &path), rows, cols);
        let x: Vec<f32> = (0..cols).map(|_| bf16(rng.gauss())).collect();
        let normw: Vec<f32> = (0..cols).map(|_| bf16(0.5 + rng.unit())).collect();
        let (hr, hc) = (tc::hadamard_block(rows), tc::hadamard_block(cols));
        let mut decoded = vec![0.0f32; rows * cols];
        for r in 0..rows {
            tc::decode_row(
                &spec,
                &words[r * wpr..(r + 1) * wpr],
                scales[r],
                &mut decoded[r * cols..(r + 1) * cols],
            );
        }
        let mut xh: Vec<f32> = x.iter().zip(&sv).map(|(a, s)| a * s).collect();
        tc::fwht_blocks(&mut xh, hc);
        let plan = tc::TrellisMatvec::new(&spec, cols)?;
        let mut z = vec![0.0f32; rows];
        plan.rows(&words, &scales, &xh, 0, &mut z)?;
        let mut yt = z.clone();
        tc::fwht_blocks(&mut yt, hr);
        for (o, s) in yt.iter_mut().zip(&su) {
            *o *= s;
        }
        let view = tc::TrellisView::new(&words, &scales, &su, &sv, &plan)?;
        let (mut scratch, mut y) = (vec![0.0f32; cols], vec![0.0f32; rows]);
        view.matvec(&pool, &x, &mut scratch, &mut y)?;
        let dir = out.join(format!("case_{i:02}"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let meta = serde_json::json!({
            "k": k, "l": l, "block": block, "code": code.name(), "rows": rows, "cols": cols, "seed": seed,
            "path": path, "coded": coded, "hb_rows": hr, "hb_cols": hc,
            "hscale_rows": f64::from(1.0 / (hr as f32).sqrt()),
            "hscale_cols": f64::from(1.0 / (hc as f32).sqrt()),
            "cpu_kernel": if plan.is_table() { "table" } else if plan.is_simd() { "simd" } else { "portable" },
        });
        std::fs::write(dir.join("meta.json"), meta.to_string()).map_err(|e| e.to_string())?;
        let f = |v: f32| v.to_le_bytes();
        write(&dir, "words.u32", &words, |v: u32| v.to_le_bytes());
        for (name, v) in [
            ("scales.f32", &scales),
            ("su.f32", &su),
            ("sv.f32", &sv),
            ("x.f32", &x),
            ("normw.f32", &normw),
            ("decoded.f32", &decoded),
            ("xh.f32", &xh),
            ("z.f32", &z),
            ("yt.f32", &yt),
            ("y.f32", &y),
        ] {
            write(&dir, name, v, f);
        }
    }
    println!("{} cases in {}", cases.len(), out.display());
    Ok(())
}

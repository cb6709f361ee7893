//! The `cuda` test set: every fused kernel against its plain-ops reference on the GPU, at the
//! tier the kernel states. Needs MLX's CUDA build and a GPU: build with `--features cuda` and
//! run on the lent H200 (`xtask/gpu/kernels.sh`). Each check prints one line (dtype, shape,
//! differing elements, largest difference in ulps) so the run's log is the evidence.

mod common;

use common::{check_finite_differences, rel_err};
use mlx_core::kernels::KernelBackend;
use mlx_core::prelude::*;
use mlx_core::transforms::vjp;
use mlx_kernels::flash_cuda::{FUSED_BF16_REL_BOUND, FUSED_F16_REL_BOUND, FUSED_F32_REL_BOUND};
use mlx_kernels::rms_norm::{self, add_rms_norm_reference};
use mlx_kernels::swiglu::{self, swiglu_reference};
use mlx_kernels::{add_rms_norm, Path, Tier};
use mlx_kernels::{attention_reference, flash_attention_with, FlashSpec};

const DTYPES: [Dtype; 3] = [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16];

fn gpu() {
    assert_eq!(
        KernelBackend::native(),
        Some(KernelBackend::Cuda),
        "the cuda test set needs MLX's CUDA back-end and a GPU"
    );
    assert_eq!(Path::auto(), Path::Fused);
}

fn rnd(shape: &[i32], dtype: Dtype, scale: f32, seed: u64) -> Array {
    let key = random::key(seed).unwrap();
    random::normal(shape, Dtype::Float32, None, Some(scale), Some(&key), None)
        .unwrap()
        .astype(dtype)
        .unwrap()
}

/// Elements as ordered integers (sign-magnitude to two's complement), for ulp distances.
fn ordered(a: &Array) -> Vec<i64> {
    let f = a.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
    // The ulp of the element type, for normal numbers: float32 bits as they are; float16
    // (10 mantissa bits) and bfloat16 (7) widened to float32 leave 13 and 16 low bits zero.
    let shift = match a.dtype() {
        Dtype::Float16 => 13,
        Dtype::Bfloat16 => 16,
        _ => 0,
    };
    let bits: Vec<u32> = f.iter().map(|x| x.to_bits()).collect();
    bits.iter()
        .map(|&b| {
            let v = if b & 0x8000_0000 != 0 {
                -((b & 0x7fff_ffff) as i64)
            } else {
                b as i64
            };
            v >> shift
        })
        .collect()
}

/// Compares at `tier`; returns a report line, panics with it on failure.
fn compare(what: &str, tier: Tier, fused: &Array, reference: &Array) -> String {
    assert_eq!(fused.shape(), reference.shape(), "{what}: shape");
    assert_eq!(fused.dtype(), reference.dtype(), "{what}: dtype");
    let (a, b) = (fused.to_bytes().unwrap(), reference.to_bytes().unwrap());
    let (oa, ob) = (ordered(fused), ordered(reference));
    let differing = oa.iter().zip(&ob).filter(|(x, y)| x != y).count();
    let max_ulps = oa
        .iter()
        .zip(&ob)
        .map(|(x, y)| (x - y).unsigned_abs())
        .max()
        .unwrap_or(0);
    let line = format!(
        "{what}: {} elements, {differing} differ (bytes equal: {}), max {max_ulps} ulp",
        oa.len(),
        a == b
    );
    println!("{line}");
    match tier {
        Tier::Exact => assert!(a == b, "not bit-equal: {line}"),
        Tier::Bounded { max_ulps: bound } => {
            assert!(
                max_ulps <= u64::from(bound),
                "over the bound of {bound} ulp: {line}"
            )
        }
    }
    line
}

#[test]
fn add_rms_norm_fused_matches_its_reference() {
    gpu();
    let mut seed = 0;
    for dtype in DTYPES {
        // Widths: tiny, SmolLM2 (576), unaligned (1000, 100), Llama-3-8B (4096), the largest
        // single-pass width for 2-byte types (8192), and the looped kernel (10000).
        for &dims in &[32, 100, 576, 1000, 2048, 4096, 8192, 10000] {
            for &rows in &[1, 3, 64] {
                seed += 1;
                let x = rnd(&[rows, 1, dims], dtype, 2.0, seed);
                let r = rnd(&[rows, 1, dims], dtype, 0.5, seed + 1000);
                let w = (&rnd(&[dims], dtype, 0.1, seed + 2000) + 1.0f32).unwrap();
                let eps = 1e-5;
                let (h, out) = add_rms_norm(&x, &r, &w, eps, Path::Fused).unwrap();
                let (rh, rout) = add_rms_norm_reference(&x, &r, &w, eps).unwrap();
                eval([&h, &out, &rh, &rout]).unwrap();
                let tag = format!("add_rms_norm {dtype} [{rows}, 1, {dims}]");
                compare(&format!("{tag} h"), Tier::Exact, &h, &rh);
                compare(&format!("{tag} out"), rms_norm::TIER, &out, &rout);
            }
        }
    }
    // A non-contiguous input (MLX copies it to row-contiguous first).
    let x = rnd(&[576, 4], Dtype::Bfloat16, 1.0, 7)
        .transpose(&[1, 0])
        .unwrap();
    let r = rnd(&[4, 576], Dtype::Bfloat16, 1.0, 8);
    let w = rnd(&[576], Dtype::Bfloat16, 1.0, 9);
    let (h, out) = add_rms_norm(&x, &r, &w, 1e-6, Path::Fused).unwrap();
    let (rh, rout) = add_rms_norm_reference(&x, &r, &w, 1e-6).unwrap();
    compare("add_rms_norm transposed h", Tier::Exact, &h, &rh);
    compare("add_rms_norm transposed out", rms_norm::TIER, &out, &rout);
}

#[test]
fn swiglu_fused_matches_its_reference() {
    gpu();
    let mut seed = 100_000;
    for dtype in DTYPES {
        let shapes: [&[i32]; 7] = [
            &[],
            &[7],
            &[1, 1, 1536],
            &[1, 1, 14336],
            &[3, 5, 1536],
            &[100_003],
            &[8, 512, 1536],
        ];
        for shape in shapes {
            seed += 1;
            let gate = rnd(shape, dtype, 4.0, seed);
            let up = rnd(shape, dtype, 1.0, seed + 1000);
            let out = swiglu::swiglu(&gate, &up, Path::Fused).unwrap();
            let reference = swiglu_reference(&gate, &up).unwrap();
            eval([&out, &reference]).unwrap();
            compare(
                &format!("swiglu {dtype} {shape:?}"),
                swiglu::TIER,
                &out,
                &reference,
            );
        }
    }
    // Extremes: large magnitudes (exp overflow), zeros of both signs, infinities.
    let v = [
        -1e4f32,
        -88.0,
        -20.0,
        -0.0,
        0.0,
        1e-30,
        20.0,
        88.0,
        1e4,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ];
    for dtype in DTYPES {
        let gate = Array::from_slice(&v, &[v.len() as i32])
            .unwrap()
            .astype(dtype)
            .unwrap();
        let up = ops::ones(&[v.len() as i32], dtype, None).unwrap();
        let out = swiglu::swiglu(&gate, &up, Path::Fused).unwrap();
        let reference = swiglu_reference(&gate, &up).unwrap();
        compare(
            &format!("swiglu {dtype} extremes"),
            swiglu::TIER,
            &out,
            &reference,
        );
    }
}

struct FlashCase {
    name: &'static str,
    b: i32,
    hq: i32,
    hkv: i32,
    l: i32,
    s: i32,
    d: i32,
    dv: i32,
    causal: bool,
    window: Option<i32>,
    dtypes: &'static [Dtype],
}

fn flash_cases() -> Vec<FlashCase> {
    let all: &'static [Dtype] = &[Dtype::Float32, Dtype::Bfloat16, Dtype::Float16];
    let two: &'static [Dtype] = &[Dtype::Float32, Dtype::Bfloat16];
    let f32_only: &'static [Dtype] = &[Dtype::Float32];
    let case = |name, (b, hq, hkv), (l, s), (d, dv), causal, window, dtypes| FlashCase {
        name,
        b,
        hq,
        hkv,
        l,
        s,
        d,
        dv,
        causal,
        window,
        dtypes,
    };
    vec![
        case(
            "causal gqa",
            (1, 8, 2),
            (300, 300),
            (64, 64),
            true,
            None,
            all,
        ),
        case("causal", (2, 4, 4), (257, 257), (128, 128), true, None, two),
        case(
            "sliding window gqa",
            (1, 4, 1),
            (333, 333),
            (128, 128),
            true,
            Some(100),
            two,
        ),
        case(
            "causal after a prefix",
            (2, 4, 2),
            (77, 200),
            (64, 64),
            true,
            None,
            f32_only,
        ),
        case("full", (1, 3, 1), (50, 131), (64, 64), false, None, two),
        case(
            "window after a prefix",
            (1, 4, 2),
            (45, 190),
            (128, 128),
            true,
            Some(37),
            f32_only,
        ),
        case(
            "short, odd head dims",
            (1, 2, 1),
            (7, 7),
            (16, 8),
            true,
            Some(3),
            f32_only,
        ),
    ]
}

fn flash_inputs(c: &FlashCase, dtype: Dtype, seed: u64) -> [Array; 4] {
    [
        rnd(&[c.b, c.hq, c.l, c.d], dtype, 1.0, seed),
        rnd(&[c.b, c.hkv, c.s, c.d], dtype, 1.0, seed + 1),
        rnd(&[c.b, c.hkv, c.s, c.dv], dtype, 1.0, seed + 2),
        rnd(&[c.b, c.hq, c.l, c.dv], dtype, 1.0, seed + 3),
    ]
}

fn flash_spec(c: &FlashCase) -> FlashSpec {
    FlashSpec {
        scale: 1.0 / (c.d as f32).sqrt(),
        causal: c.causal,
        window: c.window,
        block_q: 64,
        block_k: 64,
    }
}

/// `[out, dq, dk, dv]` of `path` (`None`: the materialised attention) for cotangent `x[3]`.
fn flash_grads(spec: FlashSpec, path: Option<Path>, x: &[Array; 4]) -> Vec<Array> {
    let f = |xs: &[Array]| -> Result<Vec<Array>> {
        Ok(vec![match path {
            Some(p) => flash_attention_with(&xs[0], &xs[1], &xs[2], spec, p)?,
            None => attention_reference(&xs[0], &xs[1], &xs[2], spec)?,
        }])
    };
    let (outs, grads) = vjp(f, &x[..3], &x[3..]).unwrap();
    let mut all = outs;
    all.extend(grads);
    eval(&all).unwrap();
    all
}

fn check_tf32_off() {
    assert_eq!(
        std::env::var("MLX_ENABLE_TF32").as_deref(),
        Ok("0"),
        "run the flash tests with MLX_ENABLE_TF32=0: the float32 reference needs float32 matmuls"
    );
}

#[test]
fn flash_fused_matches_the_materialised_attention() {
    gpu();
    check_tf32_off();
    let mut seed = 200_000;
    for c in flash_cases() {
        let spec = flash_spec(&c);
        for &dtype in c.dtypes {
            seed += 10;
            let x = flash_inputs(&c, dtype, seed);
            // The yardstick: the materialised attention in float32 of the same values.
            let x32 = x.clone().map(|a| a.astype(Dtype::Float32).unwrap());
            let truth = flash_grads(spec, None, &x32);
            let fused = flash_grads(spec, Some(Path::Fused), &x);
            let reference = flash_grads(spec, None, &x);
            let bound = match dtype {
                Dtype::Float32 => FUSED_F32_REL_BOUND,
                Dtype::Bfloat16 => FUSED_BF16_REL_BOUND,
                _ => FUSED_F16_REL_BOUND,
            };
            for (n, name) in ["out", "dq", "dk", "dv"].iter().enumerate() {
                assert_eq!(fused[n].shape(), truth[n].shape(), "{}: {name}", c.name);
                assert_eq!(fused[n].dtype(), dtype, "{}: {name} dtype", c.name);
                let e = rel_err(&fused[n], &truth[n]);
                let r = rel_err(&reference[n], &truth[n]);
                let line = format!(
                    "flash {} {dtype} {name}: fused rel err {e:.3e}, materialised {dtype} \
                     rel err {r:.3e} (vs float32 materialised; bound {bound:e})",
                    c.name
                );
                println!("{line}");
                let allowed = if dtype == Dtype::Float32 {
                    bound
                } else {
                    bound.max(r)
                };
                assert!(e.is_finite() && e <= allowed, "over the bound: {line}");
            }
        }
    }
}

#[test]
fn flash_fused_gradients_match_finite_differences() {
    gpu();
    check_tf32_off();
    // d/de sum(w * fused(x + e*u)) at e = 0 by central differences in float32, against
    // <grad, u> from the fused backward, along a random direction per input.
    for c in flash_cases()
        .iter()
        .filter(|c| c.window.is_some() || c.hq != c.hkv)
    {
        let spec = flash_spec(c);
        let x = flash_inputs(c, Dtype::Float32, 300_000);
        let g = flash_grads(spec, Some(Path::Fused), &x);
        let loss = |xs: &[Array]| -> f32 {
            let o = flash_attention_with(&xs[0], &xs[1], &xs[2], spec, Path::Fused).unwrap();
            (&o * &x[3])
                .unwrap()
                .sum_all(false)
                .unwrap()
                .item::<f32>()
                .unwrap()
        };
        check_finite_differences(
            &format!("flash {}", c.name),
            &x[..3],
            &g[1..],
            310_000,
            loss,
        );
    }
}

/// The trellis kernels (`graph_trellis.cu`, through `graph_trellis::TrellisGpu`) on the device
/// against `mlx_core::cpu::trellis` at SmolLM2-135M's shapes and Llama-3-8B's widest: the
/// decoded matrix, the input transform, the output transform and the product with the input
/// transform in its prologue or the output transform in its epilogue (against the two
/// launches) bit for bit (L2), the product
/// within the rounding bound `xtask/gpu/trellis_emulate.py` states (L3), for the host's lanes
/// a row and for 1 and 32, and bit for bit on integer inputs (exact sums: L2), for the 1mad,
/// 1mad8, 1mad8h and the S-box codes (1mad8s, gauss8s, gauss7s) (the table paths: 1mad8's at L
/// 8, the hashed codes' at L 12). Then each shape's product is timed alone (kernel-level, printed as
/// weights and weight bytes a second, the matrix L2-resident: the kernel's arithmetic ceiling,
/// evidence for the decoder's design, not a target).
#[test]
fn trellis_kernels_match_the_cpu_references() {
    use mlx_core::cpu::trellis as tc;
    use mlx_kernels::graph_trellis::{
        is_fast, TrellisGpu, TrellisPlan, TrellisSwitches, DEFAULT_SMS,
    };
    gpu();
    let mut seed = 0x7E11_15C0_u64;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        seed >> 11
    };
    let bf16_bits = |v: f32| -> u16 {
        let u = v.to_bits();
        (u.wrapping_add(0x7FFF + ((u >> 16) & 1)) >> 16) as u16
    };
    let (mad, mad8, mad8h) = (
        tc::TrellisCode::Mad,
        tc::TrellisCode::Mad8,
        tc::TrellisCode::Mad8H,
    );
    let (m8s, g8s, g7s) = (
        tc::TrellisCode::Mad8S,
        tc::TrellisCode::Gauss8S,
        tc::TrellisCode::Gauss7S,
    );
    for (code, k, l, block, rows, cols) in [
        (mad, 3u32, 8u32, 32usize, 576usize, 576usize),
        (mad, 3, 8, 32, 1536, 576),
        (mad, 3, 8, 32, 576, 1536),
        (mad, 2, 8, 32, 192, 576),
        (mad, 4, 8, 32, 576, 576),
        (mad, 3, 12, 64, 576, 1536),
        (mad, 2, 16, 64, 192, 576),
        (mad, 3, 8, 32, 4096, 14336),
        (mad, 3, 8, 32, 4096, 4096),
        (mad, 3, 8, 32, 14336, 4096),
        // 1mad8: its table (L 8, blocks of 32 and 64) and the general path (blocks of 128).
        (mad8, 3, 8, 32, 576, 576),
        (mad8, 3, 8, 64, 576, 1536),
        (mad8, 2, 8, 128, 192, 1536),
        (mad8, 3, 8, 32, 4096, 4096),
        (mad8, 3, 8, 64, 4096, 4096),
        (mad8, 3, 8, 32, 14336, 4096),
        // 1mad8h: its table (L 12, blocks of 64 and 32), the general path (L 16; blocks of
        // 128), and the 8B's shapes against 1mad's L 12 blocks of 64 for the timing.
        (mad8h, 3, 12, 64, 576, 1536),
        (mad8h, 3, 12, 32, 576, 576),
        (mad8h, 2, 16, 64, 192, 576),
        (mad8h, 3, 12, 128, 192, 1536),
        (mad, 3, 12, 64, 4096, 4096),
        (mad8h, 3, 12, 64, 4096, 4096),
        (mad, 3, 12, 64, 4096, 14336),
        (mad8h, 3, 12, 64, 4096, 14336),
        (mad8h, 3, 12, 64, 14336, 4096),
        // The S-box codes: their tables (L 12, blocks of 64 and 32: the S-box, then the code's
        // table), the general path (L 16; blocks of 128), and gauss7s at the 8B's shapes beside
        // 1mad8h's above for the timing.
        (g7s, 3, 12, 64, 576, 1536),
        (g7s, 3, 12, 32, 576, 576),
        (g7s, 2, 16, 64, 192, 576),
        (g7s, 3, 12, 128, 192, 1536),
        (g8s, 3, 12, 64, 576, 1536),
        (g8s, 4, 12, 32, 192, 576),
        (m8s, 3, 12, 64, 576, 1536),
        (m8s, 2, 16, 64, 192, 576),
        (g7s, 3, 12, 64, 4096, 4096),
        (g7s, 3, 12, 64, 4096, 14336),
        (g7s, 3, 12, 64, 14336, 4096),
        (g8s, 3, 12, 64, 4096, 4096),
    ] {
        let spec = tc::TrellisSpec { k, l, block, code };
        // The switches a model of this matrix's narrower side as its hidden width takes (the
        // 135M's shapes the kernels' own defaults, the 8B's the wide ones), each
        // MLX_GRAPH_TRELLIS_* variable overriding, as the decoder chooses them.
        let switches = TrellisSwitches::from_env(rows.min(cols));
        let plan = TrellisPlan::new(&spec, rows, cols, DEFAULT_SMS, &switches).unwrap();
        let wpr = cols * k as usize / 32;
        let words: Vec<u32> = (0..rows * wpr).map(|_| next() as u32).collect();
        let scales: Vec<f32> = (0..rows)
            .map(|_| 0.01 + 0.03 * (next() % 1000) as f32 / 1000.0)
            .collect();
        let (su, sv) = tc::layer_signs(tc::layer_seed(3, "layers.0.proj"), rows, cols);
        let xbits: Vec<u16> = (0..cols)
            .map(|_| bf16_bits((next() % 2001) as f32 / 500.0 - 2.0))
            .collect();
        let x: Vec<f32> = xbits
            .iter()
            .map(|&b| f32::from_bits(u32::from(b) << 16))
            .collect();
        let what = format!(
            "trellis {} k {k} L {l} block {block} ({rows}, {cols})",
            code.name()
        );
        let mut g = TrellisGpu::new(plan.clone(), &words, &scales, &su, &sv).unwrap();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();

        // L2: the decoded matrix.
        let dec = g.decode().unwrap();
        let mut want = vec![0f32; rows * cols];
        for r in 0..rows {
            tc::decode_row(
                &spec,
                &words[r * wpr..(r + 1) * wpr],
                scales[r],
                &mut want[r * cols..(r + 1) * cols],
            );
        }
        assert!(bits(&dec) == bits(&want), "{what}: decode");

        // L2: the input transform.
        let xh = g.input(&xbits, None).unwrap();
        let mut xh_ref: Vec<f32> = x.iter().zip(&sv).map(|(a, s)| a * s).collect();
        tc::fwht_blocks(&mut xh_ref, plan.hb_cols);
        assert!(bits(&xh) == bits(&xh_ref), "{what}: input transform");

        // L3: the product, within its rounding bound.
        let nb = cols / block;
        let fast = is_fast(&spec);
        let mut worst = 0f64;
        for lanes in [None, Some(1), Some(32)] {
            let z = g.matvec(&xh_ref, lanes).unwrap();
            let lpr = lanes.unwrap_or(plan.lanes_per_row) as usize;
            let chain = if fast {
                let per = nb.div_ceil(lpr);
                per * (block / 2) + per
            } else {
                cols.div_ceil(lpr)
            };
            let steps = chain + lpr.trailing_zeros() as usize + 3;
            for r in 0..rows {
                let row = &want[r * cols..(r + 1) * cols];
                let exact: f64 = row
                    .iter()
                    .zip(&xh_ref)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                let s: f64 = row
                    .iter()
                    .zip(&xh_ref)
                    .map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs())
                    .sum();
                let bound = steps as f64 * 2f64.powi(-24) * s + 2f64.powi(-23) * s;
                let err = (f64::from(z[r]) - exact).abs();
                assert!(
                    err <= bound,
                    "{what}: row {r} lanes {lpr}: {} vs {exact} (bound {bound})",
                    z[r]
                );
                worst = worst.max(err / bound);
            }
        }

        // L2: the product on small integer inputs (-2..2): every partial sum is an exact
        // integer below 2^24, so any order gives the same bits, float32(sum code * x) *
        // float32(scale / divisor), the codes read back from the decoded matrix (L2 above).
        let xi: Vec<f32> = (0..cols)
            .map(|c| ((c * 7919 + 13) % 5) as f32 - 2.0)
            .collect();
        let div = spec.code.divisor();
        for lanes in [None, Some(1)] {
            let z = g.matvec(&xi, lanes).unwrap();
            for r in 0..rows {
                let acc: i64 = want[r * cols..(r + 1) * cols]
                    .iter()
                    .zip(&xi)
                    .map(|(d, x)| {
                        let c = (f64::from(*d) / f64::from(scales[r]) * f64::from(div)).round();
                        c as i64 * *x as i64
                    })
                    .sum();
                let exact = acc as f32 * (scales[r] / div);
                assert!(
                    z[r].to_bits() == exact.to_bits(),
                    "{what}: row {r} on integer inputs: {} vs {exact}",
                    z[r]
                );
            }
        }

        // L2: the input transform fused into the product's prologue, with and without the
        // norm, against the two launches.
        let normw: Vec<u16> = (0..cols)
            .map(|_| bf16_bits(0.5 + (next() % 1000) as f32 / 1000.0))
            .collect();
        for norm in [None, Some((normw.as_slice(), 1e-5))] {
            let xin = g.input(&xbits, norm).unwrap();
            let two = g.matvec(&xin, None).unwrap();
            let one = g.matvec_in(&xbits, norm).unwrap();
            assert!(
                bits(&one) == bits(&two),
                "{what}: trellis_matvec_in (norm {})",
                norm.is_some()
            );
        }

        // L2: the output transform fused into the product's epilogue against the two
        // launches (twice: the counts must be back at zero after the first).
        let z_two = g.matvec(&xh_ref, None).unwrap();
        let y_two = g.output(&z_two, true).unwrap();
        for round in 0..2 {
            let y_one = g.matvec_out(&xh_ref, true).unwrap();
            assert!(
                bits(&y_one) == bits(&y_two),
                "{what}: trellis_matvec_out, launch {round}"
            );
        }

        // L2: the output transform on the CPU kernel's product.
        let cpu = tc::TrellisMatvec::new(&spec, cols).unwrap();
        let mut z = vec![0f32; rows];
        cpu.rows(&words, &scales, &xh_ref, 0, &mut z).unwrap();
        let y = g.output(&z, true).unwrap();
        let mut y_ref = z.clone();
        tc::fwht_blocks(&mut y_ref, plan.hb_rows);
        for (o, s) in y_ref.iter_mut().zip(&su) {
            *o *= s;
        }
        assert!(bits(&y) == bits(&y_ref), "{what}: output transform");

        let t = g.time_matvec(200, None).unwrap();
        // The whole linear as the graph decoder launches it (the transforms in its prologue
        // and epilogue), on the normed input matvec_in uploaded last.
        let tl = g.time_linear(200).unwrap();
        let weights = (rows * cols) as f64;
        println!(
            "{what}: decode, transforms bit-equal; product worst error / bound {worst:.3}; \
             trellis_matvec {:.2} us, {:.0} Gweights/s, {:.0} GB/s of weights (lanes {}); \
             trellis_linear {:.2} us ({} threads{}{}{}{})",
            t * 1e6,
            weights / t / 1e9,
            plan.weight_bytes() as f64 / t / 1e9,
            plan.lanes_per_row,
            tl * 1e6,
            switches.threads,
            if switches.alias { ", ALIAS" } else { "" },
            if switches.pipe { ", PIPE" } else { "" },
            if switches.states { ", STATES" } else { "" },
            if switches.pair { ", PAIR" } else { "" },
        );
    }
}

/// The runtime's parkable region (issue #30's peak: a kept graph decoder gives its KV cache's
/// memory back between generations): a graph captured over its buffers replays after a park
/// and an unpark at the same addresses; while parked, the region's bytes are not counted and
/// every use of them is refused; unparked, they are zeroed.
#[test]
fn a_parked_region_comes_back_at_the_same_addresses() {
    use mlx_core::gpurt::{Arg, GpuRuntime};
    const SRC: &str = r#"
extern "C" __global__ void fill(long long* p, long long v) {
  p[threadIdx.x] += v + threadIdx.x;
}
"#;
    let mut rt = GpuRuntime::new(SRC, &[("fill", 2)]).unwrap();
    let k = rt.kernel("fill").unwrap();
    let plain = rt.alloc(64).unwrap();
    let before = rt.allocated();
    let bufs = rt.alloc_parkable(&[3 << 20, 8 * 32]).unwrap();
    let region = rt.parkable_bytes();
    println!(
        "parkable region: {region} bytes for {} asked",
        (3 << 20) + 8 * 32
    );
    assert!(region >= (3 << 20) + 256, "{region}");
    assert_eq!(rt.allocated(), before + region);
    let g = rt
        .capture(|rt| {
            rt.launch(
                k,
                [1, 1, 1],
                [32, 1, 1],
                0,
                &[Arg::Buf(bufs[1], 0), Arg::I64(5)],
            )
        })
        .unwrap();
    let read = |rt: &mut GpuRuntime| -> Vec<i64> {
        let mut out = vec![0u8; 8 * 32];
        rt.download(bufs[1], 0, &mut out).unwrap();
        out.chunks(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    rt.replay(g, 2).unwrap();
    rt.synchronize().unwrap();
    assert_eq!(
        read(&mut rt),
        (0..32).map(|i| 2 * (5 + i)).collect::<Vec<_>>()
    );
    rt.park().unwrap();
    assert!(rt.parked());
    assert_eq!(rt.allocated(), before, "the region's memory is given back");
    assert!(rt.replay(g, 1).is_err(), "no replay while parked");
    let mut out = vec![0u8; 8];
    assert!(rt.download(bufs[1], 0, &mut out).is_err());
    rt.download(plain, 0, &mut out).unwrap();
    rt.park().unwrap();
    rt.unpark().unwrap();
    assert!(!rt.parked());
    assert_eq!(rt.allocated(), before + region);
    assert_eq!(read(&mut rt), vec![0; 32], "zeroed");
    rt.replay(g, 1).unwrap();
    rt.synchronize().unwrap();
    assert_eq!(read(&mut rt), (0..32).map(|i| 5 + i).collect::<Vec<_>>());
    rt.unpark().unwrap();
    assert!(rt.alloc_parkable(&[64]).is_err(), "one region a runtime");
}

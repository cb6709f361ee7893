//! The `cuda` test set: every fused kernel against its plain-ops reference on the GPU, at the
//! tier the kernel states. Needs MLX's CUDA build and a GPU: build with `--features cuda` and
//! run on the lent H200 (`xtask/gpu/kernels.sh`). Each check prints one line (dtype, shape,
//! differing elements, largest difference in ulps) so the run's log is the evidence.

use mlx_core::kernels::KernelBackend;
use mlx_core::prelude::*;
use mlx_kernels::rms_norm::{self, add_rms_norm_reference};
use mlx_kernels::swiglu::{self, swiglu_reference};
use mlx_kernels::{add_rms_norm, Path, Tier};

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

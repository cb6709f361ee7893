//! The Gated DeltaNet kernel path (MLX's fused `fast::gated_delta_update`) against its
//! plain-ops reference (`gated_delta_ops`, mlx-lm's L1 path off Apple GPUs), across dtypes and
//! head layouts. Tier: identical bits in float32 on the CPU backend; within bf16 rounding
//! (a per-dtype tolerance relative to the output's magnitude) in bfloat16.

use mlx_core::prelude::*;
use mlx_models::layers::gated_delta::{compute_g, gated_delta_ops, gated_delta_update_fast};

fn max_abs(a: &Array) -> f32 {
    ops::max_all(
        &ops::abs(&a.astype(Dtype::Float32).unwrap(), None).unwrap(),
        false,
        None,
    )
    .unwrap()
    .item::<f32>()
    .unwrap()
}

/// Largest |a - b| and where it is.
fn worst(a: &Array, b: &Array) -> (f32, usize) {
    let a = a.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
    let b = b.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .enumerate()
        .fold(
            (0.0, 0),
            |(m, i), (j, d)| if d > m { (d, j) } else { (m, i) },
        )
}

#[test]
fn fused_gated_delta_matches_the_plain_ops_reference() {
    let key = random::key(7).unwrap();
    let keys = random::split(&key, 8, None).unwrap();
    let k = |i: i32| {
        ops::squeeze(
            &ops::slice_axis(&keys, 0, i, i + 1, None).unwrap(),
            &[0],
            None,
        )
        .unwrap()
    };
    for (dtype, tol) in [(Dtype::Float32, 0.0f32), (Dtype::Bfloat16, 1.0 / 64.0)] {
        for (hk, hv) in [(2, 2), (2, 4)] {
            let (b, t, dk, dv) = (2, 13, 16, 8);
            let n = |i: i32, shape: &[i32], s: f32| {
                ops::multiply_scalar(
                    &random::normal(shape, Dtype::Float32, None, None, Some(&k(i)), None).unwrap(),
                    s,
                    None,
                )
                .unwrap()
                .astype(dtype)
                .unwrap()
            };
            let q = n(0, &[b, t, hk, dk], 0.25);
            let kk = n(1, &[b, t, hk, dk], 0.25);
            let v = n(2, &[b, t, hv, dv], 1.0);
            let a = n(3, &[b, t, hv], 1.0);
            let bb = n(4, &[b, t, hv], 1.0);
            let a_log =
                random::normal(&[hv], Dtype::Float32, None, None, Some(&k(5)), None).unwrap();
            let dt_bias =
                random::normal(&[hv], Dtype::Float32, None, None, Some(&k(6)), None).unwrap();
            let state = random::normal(
                &[b, hv, dv, dk],
                Dtype::Float32,
                None,
                None,
                Some(&k(7)),
                None,
            )
            .unwrap();
            let g = compute_g(&a_log, &a, &dt_bias).unwrap();
            let beta = ops::sigmoid(&bb, None).unwrap();
            let (y_ref, s_ref, _) =
                gated_delta_ops(&q, &kk, &v, &g, &beta, Some(&state), None, false).unwrap();
            let (y, s) =
                gated_delta_update_fast(&q, &kk, &v, &a, &bb, &a_log, &dt_bias, Some(&state), None)
                    .unwrap();
            assert_eq!(y.dtype(), y_ref.dtype());
            assert_eq!(s.dtype(), s_ref.dtype());
            for (what, got, want) in [("y", &y, &y_ref), ("state", &s, &s_ref)] {
                let (d, at) = worst(got, want);
                let bound = tol * max_abs(want);
                assert!(
                    d <= bound,
                    "{dtype:?} Hk={hk} Hv={hv} {what}: largest |diff| {d} at flat index {at} \
                     exceeds {bound}"
                );
            }
        }
    }
}

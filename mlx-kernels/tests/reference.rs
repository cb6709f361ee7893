//! The plain-ops references (the exact path of every fused kernel) against mlx-lm, bit for bit
//! (L1 on CPU), and the checks both paths share. Goldens: `cargo xtask goldens kernels`.

use mlx_core::prelude::*;
use mlx_core::testing::{Case, Goldens};
use mlx_kernels::{add_rms_norm, swiglu, Path};

fn run(c: &Case) -> Result<Vec<Array>> {
    match c.op.as_str() {
        "add_rms_norm" => {
            let eps = c.float("eps")? as f32;
            let (h, out) =
                add_rms_norm(c.input(0)?, c.input(1)?, c.input(2)?, eps, Path::Reference)?;
            Ok(vec![h, out])
        }
        "swiglu" => Ok(vec![swiglu(c.input(0)?, c.input(1)?, Path::Reference)?]),
        other => panic!("case {}: no runner for op {other}", c.name),
    }
}

#[test]
fn references_match_mlx_lm_bit_for_bit() {
    let g = Goldens::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/goldens/kernels.safetensors"
    ))
    .unwrap();
    if let Err(e) = g.check_all(18, run) {
        panic!("{e}");
    }
}

fn zeros(shape: &[i32], dtype: Dtype) -> Array {
    ops::zeros(shape, dtype, None).unwrap()
}

fn message(r: Result<impl std::fmt::Debug>) -> String {
    r.expect_err("bad input must be an error").to_string()
}

#[test]
fn bad_inputs_are_clear_errors_on_both_paths() {
    let x = zeros(&[2, 8], Dtype::Bfloat16);
    let w = zeros(&[8], Dtype::Bfloat16);
    for path in [Path::Reference, Path::Fused] {
        let m = message(add_rms_norm(
            &x,
            &zeros(&[2, 4], Dtype::Bfloat16),
            &w,
            1e-5,
            path,
        ));
        assert!(
            m.contains("add_rms_norm") && m.contains("residual has shape [2, 4]"),
            "{m}"
        );
        let m = message(add_rms_norm(
            &x,
            &x,
            &zeros(&[4], Dtype::Bfloat16),
            1e-5,
            path,
        ));
        assert!(m.contains("weight has shape [4]; expected [8]"), "{m}");
        let m = message(add_rms_norm(
            &x,
            &x,
            &zeros(&[8], Dtype::Float32),
            1e-5,
            path,
        ));
        assert!(
            m.contains("weight has dtype float32, x has bfloat16"),
            "{m}"
        );
        let m = message(add_rms_norm(&x, &x, &w, f32::NAN, path));
        assert!(m.contains("eps is NaN"), "{m}");
        let xi = zeros(&[2, 8], Dtype::Int32);
        let m = message(add_rms_norm(
            &xi,
            &xi,
            &zeros(&[8], Dtype::Int32),
            1e-5,
            path,
        ));
        assert!(m.contains("x has dtype int32"), "{m}");
        let s = zeros(&[], Dtype::Float32);
        let m = message(add_rms_norm(&s, &s, &s, 1e-5, path));
        assert!(m.contains("x is a scalar"), "{m}");

        let m = message(swiglu(&x, &zeros(&[2, 7], Dtype::Bfloat16), path));
        assert!(m.contains("swiglu") && m.contains("up has [2, 7]"), "{m}");
        let m = message(swiglu(&x, &zeros(&[2, 8], Dtype::Float16), path));
        assert!(m.contains("up has dtype float16, gate has bfloat16"), "{m}");
    }
}

#[test]
fn the_fused_path_without_cuda_says_what_to_use() {
    // This test set runs on the CPU build; the `cuda` test set covers the GPU.
    if mlx_core::kernels::KernelBackend::native().is_some() {
        return;
    }
    assert_eq!(Path::auto(), Path::Reference);
    let x = zeros(&[1, 8], Dtype::Float32);
    let m = message(swiglu(&x, &x, Path::Fused));
    assert!(m.contains("Path::Reference") && m.contains("CUDA"), "{m}");
    let m = message(add_rms_norm(
        &x,
        &x,
        &zeros(&[8], Dtype::Float32),
        1e-5,
        Path::Fused,
    ));
    assert!(m.contains("Path::Reference"), "{m}");
}

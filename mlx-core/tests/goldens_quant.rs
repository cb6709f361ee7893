//! L1 against the Python oracle (mlx 0.32.4): every case in `tests/goldens/quant.safetensors`
//! (written by `cargo xtask goldens quant`) must match bit for bit. Layouts are described in
//! `xtask/oracle/goldens_quant.py`.

use mlx_core::prelude::*;
use mlx_core::quantized::{self, QuantMode};
use mlx_core::testing::{Case, Goldens};

fn opt_int(c: &Case, k: &str) -> Option<i32> {
    c.has(k).then(|| c.int(k).expect(k) as i32)
}

fn dtype(name: &str) -> Dtype {
    match name {
        "f32" => Dtype::Float32,
        "f16" => Dtype::Float16,
        "bf16" => Dtype::Bfloat16,
        other => panic!("dtype {other}"),
    }
}

fn mode(c: &Case) -> QuantMode {
    QuantMode::from_name(c.str("mode").expect("mode")).expect("known mode")
}

fn run(c: &Case) -> Result<Vec<Array>> {
    let x = |i: usize| c.input(i).expect("input");
    let o = |i: usize| &c.outputs[i];
    let (gs, bits) = (opt_int(c, "group_size"), opt_int(c, "bits"));
    Ok(match c.op.as_str() {
        "affine_bundle" => {
            let a = QuantMode::Affine;
            let (wq, s, b) = quantized::quantize(x(0), gs, bits, a, None)?;
            let b = b.expect("affine biases");
            // Downstream ops run on the oracle's own quantized weights.
            let deq = quantized::dequantize(o(0), o(1), Some(o(2)), gs, bits, a, None, None)?;
            let y =
                quantized::quantized_matmul(x(1), o(0), o(1), Some(o(2)), true, gs, bits, a, None)?;
            let (tq, ts, tb) = quantized::quantize(x(2), gs, bits, a, None)?;
            let tb = tb.expect("affine biases");
            let yt = quantized::quantized_matmul(
                x(3),
                o(5),
                o(6),
                Some(o(7)),
                false,
                gs,
                bits,
                a,
                None,
            )?;
            vec![wq, s, b, deq, y, tq, ts, tb, yt]
        }
        "fp_bundle" => {
            let m = mode(c);
            let (wq, s, b) = quantized::quantize(x(0), gs, bits, m, None)?;
            assert!(b.is_none(), "{m} has no biases");
            let d0 = quantized::dequantize(o(0), o(1), None, gs, bits, m, None, None)?;
            let dt = dtype(c.str("ddtype").expect("ddtype"));
            let d1 = quantized::dequantize(o(0), o(1), None, gs, bits, m, Some(dt), None)?;
            let y = quantized::quantized_matmul(x(1), o(0), o(1), None, true, gs, bits, m, None)?;
            vec![wq, s, d0, d1, y]
        }
        "nvfp4_global" => {
            let m = QuantMode::Nvfp4;
            let (wq, s, _) =
                quantized::quantize_with_global_scale(x(0), None, None, m, x(1), None)?;
            let d = quantized::dequantize_with_global_scale(
                o(0),
                o(1),
                None,
                None,
                None,
                m,
                x(1),
                None,
                None,
            )?;
            vec![wq, s, d]
        }
        "dequantize" => {
            let biases = (c.inputs.len() > 2).then(|| x(2));
            let dt = c
                .has("dtype")
                .then(|| dtype(c.str("dtype").expect("dtype")));
            vec![quantized::dequantize(
                x(0),
                x(1),
                biases,
                gs,
                bits,
                mode(c),
                dt,
                None,
            )?]
        }
        "gather_qmm" => {
            let m = mode(c);
            let mut next = 3;
            let mut take = |present: bool| {
                present.then(|| {
                    next += 1;
                    x(next - 1)
                })
            };
            let biases = take(m == QuantMode::Affine);
            let lhs = take(c.bool("lhs").expect("lhs"));
            let rhs = take(c.bool("rhs").expect("rhs"));
            vec![quantized::gather_qmm(
                x(0),
                x(1),
                x(2),
                biases,
                lhs,
                rhs,
                c.bool("transpose").expect("transpose"),
                gs,
                bits,
                m,
                c.bool("sorted").expect("sorted"),
                None,
            )?]
        }
        "gather_mm" => {
            let mut next = 2;
            let mut take = |present: bool| {
                present.then(|| {
                    next += 1;
                    x(next - 1)
                })
            };
            let lhs = take(c.bool("lhs").expect("lhs"));
            let rhs = take(c.bool("rhs").expect("rhs"));
            vec![quantized::gather_mm(
                x(0),
                x(1),
                lhs,
                rhs,
                c.bool("sorted").expect("sorted"),
                None,
            )?]
        }
        other => panic!("case {}: no runner for op {other}", c.name),
    })
}

#[test]
fn quantization_matches_the_oracle_bit_for_bit() {
    let g = Goldens::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/goldens/quant.safetensors"
    ))
    .unwrap();
    if let Err(e) = g.check_all(61, run) {
        panic!("{e}");
    }
}

#[test]
fn modes_round_trip_their_names() {
    for m in [
        QuantMode::Affine,
        QuantMode::Mxfp4,
        QuantMode::Mxfp8,
        QuantMode::Nvfp4,
    ] {
        assert_eq!(QuantMode::from_name(m.name()), Some(m));
        assert_eq!(m.has_biases(), m == QuantMode::Affine);
    }
    assert_eq!(QuantMode::from_name("int4"), None);
}

#[test]
fn bad_arguments_are_errors() {
    let w = ops::ones(&[4, 64], Dtype::Float32, None).unwrap();
    // Not a supported group size / bit width.
    let err = quantized::quantize(&w, 48, 4, QuantMode::Affine, None).expect_err("group 48");
    assert!(matches!(err, Error::Mlx { .. }), "{err}");
    let err = quantized::quantize(&w, 64, 7, QuantMode::Affine, None).expect_err("7 bits");
    assert!(err.to_string().contains("quantize"), "{err}");
    // Zero or negative are rejected before MLX (0 would mean "default" to the shim).
    let err = quantized::quantize(&w, 0, 4, QuantMode::Affine, None).expect_err("group 0");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    // The last axis must divide into groups.
    let w2 = ops::ones(&[4, 40], Dtype::Float32, None).unwrap();
    assert!(quantized::quantize(&w2, 32, 4, QuantMode::Affine, None).is_err());
    // gather_mm on the CPU runs float32 only.
    let a = ops::ones(&[2, 2, 4], Dtype::Bfloat16, None).unwrap();
    let b = ops::ones(&[2, 4, 3], Dtype::Bfloat16, None).unwrap();
    let idx = Array::from_slice(&[1u32, 0], &[2]).unwrap();
    let err = quantized::gather_mm(&a, &b, None, Some(&idx), false, None)
        .and_then(|y| y.eval().map(|_| y))
        .expect_err("bf16 gather_mm on the CPU");
    assert!(err.to_string().contains("float32"), "{err}");
}

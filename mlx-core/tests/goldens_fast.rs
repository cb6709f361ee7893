//! L1 against the Python oracle (mlx 0.32.4): every case in `tests/goldens/fast.safetensors`
//! (written by `cargo xtask goldens fast`) must match bit for bit.

use mlx_core::fast::{self, RopeOffset, SdpaMask};
use mlx_core::prelude::*;
use mlx_core::testing::{Case, Goldens};

fn run(c: &Case) -> Result<Vec<Array>> {
    let x = |i: usize| c.input(i).expect("input");
    let flag = |k: &str| c.bool(k).expect(k);
    let eps = || c.float("eps").expect("eps") as f32;
    let out = match c.op.as_str() {
        "rms_norm" => fast::rms_norm(x(0), flag("weight").then(|| x(1)), eps(), None)?,
        "layer_norm" => {
            let (hw, hb) = (flag("weight"), flag("bias"));
            let w = hw.then(|| x(1));
            let b = hb.then(|| x(if hw { 2 } else { 1 }));
            fast::layer_norm(x(0), w, b, eps(), None)?
        }
        "rope" => {
            let mut next = 1;
            let offset = if c.str("offset").expect("offset") == "array" {
                next += 1;
                RopeOffset::Array(x(1))
            } else {
                RopeOffset::Int(c.int("offset").expect("offset") as i32)
            };
            let freqs = flag("freqs").then(|| x(next));
            let base = c.has("base").then(|| c.float("base").expect("base") as f32);
            fast::rope(
                x(0),
                c.int("dims").expect("dims") as i32,
                flag("traditional"),
                base,
                c.float("scale").expect("scale") as f32,
                offset,
                freqs,
                None,
            )?
        }
        "sdpa" => {
            let mut next = 3;
            let mask = match c.str("mask").expect("mask") {
                "none" => SdpaMask::None,
                "causal" => SdpaMask::Causal,
                "array" => {
                    next += 1;
                    SdpaMask::Array(x(3))
                }
                other => panic!("mask {other}"),
            };
            let sinks = flag("sinks").then(|| x(next));
            fast::scaled_dot_product_attention(
                x(0),
                x(1),
                x(2),
                c.float("scale").expect("scale") as f32,
                mask,
                sinks,
                None,
            )?
        }
        other => panic!("case {}: no runner for op {other}", c.name),
    };
    Ok(vec![out])
}

#[test]
fn fast_ops_match_the_oracle_bit_for_bit() {
    let g = Goldens::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/goldens/fast.safetensors"
    ))
    .unwrap();
    if let Err(e) = g.check_all(151, run) {
        panic!("{e}");
    }
}

#[test]
fn bad_arguments_are_errors() {
    let q = ops::zeros(&[1, 2, 3, 8], Dtype::Float16, None).unwrap();
    // An f32 additive mask does not promote to a half output (Python raises the same).
    let m = ops::zeros(&[3, 3], Dtype::Float32, None).unwrap();
    let err = fast::scaled_dot_product_attention(&q, &q, &q, 0.3, SdpaMask::Array(&m), None, None)
        .expect_err("f32 mask with f16 inputs");
    assert!(err.to_string().contains("Mask type must promote"), "{err}");
    // Heads that do not divide.
    let k = ops::zeros(&[1, 3, 3, 8], Dtype::Float16, None).unwrap();
    let err = fast::scaled_dot_product_attention(&q, &k, &k, 0.3, SdpaMask::None, None, None)
        .expect_err("2 query heads, 3 kv heads");
    assert!(err.to_string().contains("n_heads"), "{err}");
    // rope needs exactly one of base and freqs.
    let x = ops::zeros(&[1, 1, 2, 8], Dtype::Float32, None).unwrap();
    let f = ops::ones(&[4], Dtype::Float32, None).unwrap();
    let err = fast::rope(&x, 8, false, Some(10000.0), 1.0, 0.into(), Some(&f), None)
        .and_then(|a| a.eval().map(|_| a))
        .expect_err("base and freqs");
    assert!(err.to_string().contains("rope"), "{err}");
    // rms_norm weight of the wrong size.
    let w = ops::ones(&[5], Dtype::Float32, None).unwrap();
    assert!(fast::rms_norm(&x, Some(&w), 1e-5, None).is_err());
}

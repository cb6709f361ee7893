//! Flash attention against the materialised attention (forward and gradients, within the
//! stated bounds `FWD_REL_BOUND` / `GRAD_REL_BOUND`), against central finite differences, the
//! reference against MLX's own SDPA (which mlx-lm calls; bit for bit), memory, and bad input.

mod common;

use common::{check_finite_differences, rel_err};
use mlx_core::prelude::*;
use mlx_core::testing::assert_bit_equal;
use mlx_core::transforms::vjp;
use mlx_kernels::flash_attention::{FWD_REL_BOUND, GRAD_REL_BOUND};
use mlx_kernels::{attention_reference, flash_attention, flash_attention_with, FlashSpec, Path};

fn randn(shape: &[i32], seed: u64) -> Array {
    let key = random::key(seed).unwrap();
    random::normal(shape, Dtype::Float32, None, None, Some(&key), None).unwrap()
}

struct Case {
    name: &'static str,
    hq: i32,
    hkv: i32,
    l: i32,
    s: i32,
    spec: FlashSpec,
}

fn spec(causal: bool, window: Option<i32>, bq: i32, bk: i32) -> FlashSpec {
    FlashSpec {
        scale: 0.25,
        causal,
        window,
        block_q: bq,
        block_k: bk,
    }
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "causal gqa",
            hq: 4,
            hkv: 2,
            l: 37,
            s: 37,
            spec: spec(true, None, 8, 8),
        },
        Case {
            name: "causal, uneven tiles",
            hq: 2,
            hkv: 2,
            l: 37,
            s: 37,
            spec: spec(true, None, 5, 16),
        },
        Case {
            name: "causal, one tile",
            hq: 4,
            hkv: 1,
            l: 20,
            s: 20,
            spec: spec(true, None, 64, 64),
        },
        Case {
            name: "causal, queries after a prefix",
            hq: 4,
            hkv: 2,
            l: 13,
            s: 40,
            spec: spec(true, None, 4, 8),
        },
        Case {
            name: "full",
            hq: 3,
            hkv: 1,
            l: 19,
            s: 29,
            spec: spec(false, None, 8, 8),
        },
        Case {
            name: "sliding window",
            hq: 4,
            hkv: 2,
            l: 41,
            s: 41,
            spec: spec(true, Some(9), 8, 4),
        },
        Case {
            name: "sliding window after a prefix",
            hq: 2,
            hkv: 1,
            l: 17,
            s: 33,
            spec: spec(true, Some(6), 4, 8),
        },
    ]
}

fn inputs(c: &Case, seed: u64) -> [Array; 3] {
    [
        randn(&[2, c.hq, c.l, 16], seed),
        randn(&[2, c.hkv, c.s, 16], seed + 1),
        randn(&[2, c.hkv, c.s, 8], seed + 2),
    ]
}

type Attention = fn(&Array, &Array, &Array, FlashSpec) -> Result<Array>;

fn grads(f: Attention, spec: FlashSpec, x: &[Array; 3], cot: &Array) -> (Array, Vec<Array>) {
    let (outs, g) = vjp(
        |xs: &[Array]| Ok(vec![f(&xs[0], &xs[1], &xs[2], spec)?]),
        x,
        std::slice::from_ref(cot),
    )
    .unwrap();
    (outs[0].clone(), g)
}

#[test]
fn flash_matches_the_materialised_attention_and_its_gradients() {
    for (i, c) in cases().iter().enumerate() {
        let x = inputs(c, 10 * i as u64);
        let cot = randn(&[2, c.hq, c.l, 8], 99 + i as u64);
        let (fo, fg) = grads(flash_attention, c.spec, &x, &cot);
        let (ro, rg) = grads(attention_reference, c.spec, &x, &cot);
        let e = rel_err(&fo, &ro);
        eprintln!("{}: output rel err {e:e}", c.name);
        assert!(e <= FWD_REL_BOUND, "{}: output rel err {e}", c.name);
        for (n, (a, b)) in ["dq", "dk", "dv"].iter().zip(fg.iter().zip(&rg)) {
            assert_eq!(a.shape(), b.shape(), "{}: {n} shape", c.name);
            let e = rel_err(a, b);
            eprintln!("{}: {n} rel err {e:e}", c.name);
            assert!(e <= GRAD_REL_BOUND, "{}: {n} rel err {e}", c.name);
        }
    }
}

#[test]
fn flash_gradients_match_finite_differences() {
    // d/de sum(w * flash(x + e*u)) at e = 0, by central differences in float32, against
    // <grad, u> from the custom backward, along a random direction per input.
    for c in [&cases()[0], &cases()[5], &cases()[6]] {
        let x = inputs(c, 7);
        let w = randn(&[2, c.hq, c.l, 8], 8);
        let loss = |xs: &[Array]| -> f32 {
            let o = flash_attention(&xs[0], &xs[1], &xs[2], c.spec).unwrap();
            (&o * &w)
                .unwrap()
                .sum_all(false)
                .unwrap()
                .item::<f32>()
                .unwrap()
        };
        let (_, g) = grads(flash_attention, c.spec, &x, &w);
        check_finite_differences(c.name, &x, &g, 50, loss);
    }
}

#[test]
fn the_reference_is_mlx_sdpa() {
    // The materialised reference is MLX's SDPA (what mlx-lm calls) bit for bit: causal, none,
    // and the sliding window as mlx-lm's boolean mask array.
    for c in cases() {
        let [q, k, v] = inputs(&c, 3);
        let off = f64::from(c.s - c.l);
        let qpos = ops::arange(off, off + f64::from(c.l), 1.0, Dtype::Int32, None)
            .unwrap()
            .reshape(&[c.l, 1])
            .unwrap();
        let kpos = ops::arange(0.0, f64::from(c.s), 1.0, Dtype::Int32, None)
            .unwrap()
            .reshape(&[1, c.s])
            .unwrap();
        let window_mask = c.spec.window.map(|w| {
            let causal = kpos.less_equal(&qpos).unwrap();
            causal
                .logical_and(&qpos.less(&kpos.add_scalar(w).unwrap()).unwrap())
                .unwrap()
        });
        let mask = match (&window_mask, c.spec.causal) {
            (Some(m), _) => fast::SdpaMask::Array(m),
            (None, true) => fast::SdpaMask::Causal,
            (None, false) => fast::SdpaMask::None,
        };
        let want =
            fast::scaled_dot_product_attention(&q, &k, &v, c.spec.scale, mask, None, None).unwrap();
        let got = attention_reference(&q, &k, &v, c.spec).unwrap();
        assert_bit_equal(&got, &want).unwrap_or_else(|m| panic!("{}: {m}", c.name));
    }
}

#[test]
fn flash_keeps_less_memory_for_the_backward() {
    // 1024 queries and keys, 4 heads: the reference keeps [4, 1024, 1024] float32 scores
    // (16 MiB) and probabilities for its backward; flash keeps the output and the lse.
    let c = Case {
        name: "mem",
        hq: 4,
        hkv: 2,
        l: 1024,
        s: 1024,
        spec: spec(true, None, 128, 128),
    };
    let q = randn(&[1, c.hq, c.l, 16], 1);
    let k = randn(&[1, c.hkv, c.s, 16], 2);
    let v = randn(&[1, c.hkv, c.s, 8], 3);
    let cot = randn(&[1, c.hq, c.l, 8], 4);
    let x = [q, k, v];
    let mut peaks = Vec::new();
    for f in [flash_attention as Attention, attention_reference] {
        eval(&x).unwrap();
        eval(std::slice::from_ref(&cot)).unwrap();
        mlx_core::memory::reset_peak_memory().unwrap();
        let base = mlx_core::memory::active_memory().unwrap();
        let (o, g) = grads(f, c.spec, &x, &cot);
        let mut all = g;
        all.push(o);
        eval(&all).unwrap();
        peaks.push(mlx_core::memory::peak_memory().unwrap() - base);
    }
    eprintln!(
        "peak bytes above the inputs: flash {}, reference {}",
        peaks[0], peaks[1]
    );
    assert!(
        peaks[0] * 2 < peaks[1],
        "flash peak {} bytes, reference peak {} bytes",
        peaks[0],
        peaks[1]
    );
}

#[test]
fn bad_input_is_a_clear_error() {
    let z = |shape: &[i32]| ops::zeros(shape, Dtype::Float32, None).unwrap();
    let (q, k, v) = (z(&[1, 4, 8, 16]), z(&[1, 2, 8, 16]), z(&[1, 2, 8, 8]));
    let s = spec(true, None, 4, 4);
    let msg = |r: Result<Array>| r.expect_err("must fail").to_string();
    assert!(msg(flash_attention(&z(&[4, 8, 16]), &k, &v, s)).contains("queries must be 4-D"));
    assert!(msg(flash_attention(
        &q,
        &z(&[1, 3, 8, 16]),
        &z(&[1, 3, 8, 8]),
        s
    ))
    .contains("multiple of"));
    assert!(msg(flash_attention(&q, &z(&[1, 2, 8, 12]), &v, s)).contains("head_dim"));
    assert!(msg(flash_attention(&q, &k, &z(&[1, 2, 7, 8]), s)).contains("do not match"));
    assert!(msg(flash_attention(&z(&[1, 4, 9, 16]), &k, &v, s)).contains("at least as many keys"));
    assert!(msg(flash_attention(&q, &k, &v, spec(true, None, 0, 4))).contains("block sizes"));
    assert!(msg(flash_attention(&q, &k, &v, spec(true, Some(0), 4, 4))).contains("window"));
    assert!(msg(flash_attention(&q, &k, &v, spec(false, Some(3), 4, 4))).contains("needs causal"));
    let qi = ops::zeros(&[1, 4, 8, 16], Dtype::Int32, None).unwrap();
    assert!(msg(flash_attention(&qi, &k, &v, s)).contains("dtype"));
}

#[test]
fn the_cuda_path_is_refused_clearly_where_it_cannot_run() {
    let z = |shape: &[i32]| ops::zeros(shape, Dtype::Float32, None).unwrap();
    let (q, k, v) = (z(&[1, 4, 8, 16]), z(&[1, 2, 8, 16]), z(&[1, 2, 8, 8]));
    let s = spec(true, None, 4, 4);
    let msg = |r: Result<Array>| r.expect_err("must fail").to_string();
    // Head dims the kernels do not take, before any back-end question.
    let m = msg(flash_attention_with(
        &z(&[1, 4, 8, 6]),
        &z(&[1, 2, 8, 6]),
        &v,
        s,
        Path::Fused,
    ));
    assert!(m.contains("multiple of 4"), "{m}");
    let m = msg(flash_attention_with(
        &z(&[1, 4, 8, 264]),
        &z(&[1, 2, 8, 264]),
        &v,
        s,
        Path::Fused,
    ));
    assert!(m.contains("at most 256"), "{m}");
    // Shared validation comes first on both paths.
    let m = msg(flash_attention_with(
        &z(&[1, 4, 9, 16]),
        &k,
        &v,
        s,
        Path::Fused,
    ));
    assert!(m.contains("at least as many keys"), "{m}");
    if Path::auto() == Path::Reference {
        // The CPU build: a clear error, not a panic.
        let m = msg(flash_attention_with(&q, &k, &v, s, Path::Fused));
        assert!(m.contains("CUDA"), "{m}");
    }
    // The reference path is `flash_attention` itself.
    let x = inputs(&cases()[0], 1);
    let a = flash_attention(&x[0], &x[1], &x[2], cases()[0].spec).unwrap();
    let b = flash_attention_with(&x[0], &x[1], &x[2], cases()[0].spec, Path::Reference).unwrap();
    assert_bit_equal(&a, &b).unwrap();
}

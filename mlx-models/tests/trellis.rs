//! Trellis-coded linears (`"mode": "trellis"`): the plain-ops decode against the CPU kernel
//! (L2: here bit-equal), the incoherence algebra, the error per bit width, strict loading.

use std::collections::BTreeMap;

use mlx_core::prelude::*;
use mlx_models::config::{ModelConfig, QuantParams, TrellisParams};
use mlx_models::layers::trellis::{
    output_error, quantize_trellis, quantize_trellis_select, TrellisWeight,
};
use mlx_models::layers::{Embedding, Linear};
use mlx_models::weights::Weights;

fn seeded(shape: &[i32], seed: u64) -> Array {
    let key = mlx_core::random::key(seed).unwrap();
    mlx_core::random::normal(shape, Dtype::Float32, None, None, Some(&key), None).unwrap()
}

fn params(bits: i32, block: i32, l: u32) -> (QuantParams, TrellisParams) {
    let t = TrellisParams {
        trellis_l: l,
        seed: 42,
        trellis_code: Default::default(),
    };
    (
        QuantParams {
            group_size: block,
            bits,
            mode: "trellis".into(),
            trellis: Some(t),
        },
        t,
    )
}

fn coded(w: &Array, path: &str, bits: i32, block: i32, l: u32) -> TrellisWeight {
    let (q, t) = params(bits, block, l);
    let (words, scales) = quantize_trellis(w, path, &q, &t, 2, None).unwrap();
    let s = w.shape();
    TrellisWeight::new(words, scales, q.trellis_spec(&t), t, path, s[0], s[1]).unwrap()
}

fn to_vec(a: &Array) -> Vec<f32> {
    let a = a.astype(Dtype::Float32).unwrap();
    a.eval().unwrap();
    a.as_slice::<f32>().unwrap().to_vec()
}

#[test]
fn plain_ops_decode_equals_the_cpu_kernel_bit_for_bit() {
    for (bits, l) in [(2, 10), (3, 12), (4, 9)] {
        let w = seeded(&[48, 128], 1 + bits as u64);
        let tw = coded(&w, "model.layers.0.mlp.up_proj", bits, 64, l);
        let r = to_vec(&tw.decode_reference().unwrap());
        let k = to_vec(&tw.decode_kernel().unwrap());
        assert_eq!(r.len(), 48 * 128);
        let differ = r
            .iter()
            .zip(&k)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(differ, 0, "{bits} bits, L {l}: {differ} values differ");
    }
}

/// The `1mad8` code (`"trellis_code": "1mad8"`): parsed from the config, the plain-ops decode
/// (a take on the state table) bit-equal to the CPU kernel's, within 1% of 1MAD's error.
#[test]
fn the_int8_code_loads_and_decodes_bit_for_bit() {
    // 1mad8 only with 8-bit states (its int8 kernel's), and the error names trellis_l.
    let e = ModelConfig::from_json_str(
        r#"{"model_type": "llama", "quantization": {"group_size": 64, "bits": 3,
            "mode": "trellis", "trellis_l": 10, "seed": 42, "trellis_code": "1mad8"}}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("trellis_l") && e.contains("1mad8"), "{e}");
    let cfg = ModelConfig::from_json_str(
        r#"{"model_type": "llama", "quantization": {"group_size": 64, "bits": 3,
            "mode": "trellis", "trellis_l": 8, "seed": 42, "trellis_code": "1mad8"}}"#,
    )
    .unwrap();
    let q = cfg.quantization.unwrap().default;
    let t = q.trellis.unwrap();
    assert_eq!(t.trellis_code, mlx_core::cpu::trellis::TrellisCode::Mad8);
    assert_eq!(
        serde_json::to_value(&q).unwrap()["trellis_code"],
        serde_json::json!("1mad8")
    );
    let w = seeded(&[48, 128], 5);
    let wv = to_vec(&w);
    let mut errors = Vec::new();
    for code in [
        mlx_core::cpu::trellis::TrellisCode::Mad,
        mlx_core::cpu::trellis::TrellisCode::Mad8,
    ] {
        let (mut q, mut t) = params(3, 32, 8);
        t.trellis_code = code;
        q.trellis = Some(t);
        let (words, scales) = quantize_trellis(&w, "m.up", &q, &t, 2, None).unwrap();
        let tw = TrellisWeight::new(words, scales, q.trellis_spec(&t), t, "m.up", 48, 128).unwrap();
        let r = to_vec(&tw.decode_reference().unwrap());
        let k = to_vec(&tw.decode_kernel().unwrap());
        assert!(
            r.iter().zip(&k).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{code:?}"
        );
        let dq = to_vec(&tw.dequantize().unwrap());
        errors.push(
            dq.iter()
                .zip(&wv)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f32>(),
        );
    }
    assert!(errors[1] <= errors[0] * 1.01, "{errors:?}");
}

/// The hashed codes (`"1mad8h"`, `"1mad8s"`, `"gauss8s"`, `"gauss7s"`, L 12): parsed from the config, the plain-ops
/// decode (the MLX path's take on the state table) bit-equal to the CPU kernel's.
#[test]
fn the_hashed_codes_load_and_decode_bit_for_bit() {
    for (name, code) in [
        ("1mad8h", mlx_core::cpu::trellis::TrellisCode::Mad8H),
        ("1mad8s", mlx_core::cpu::trellis::TrellisCode::Mad8S),
        ("gauss8s", mlx_core::cpu::trellis::TrellisCode::Gauss8S),
        ("gauss7s", mlx_core::cpu::trellis::TrellisCode::Gauss7S),
    ] {
        let cfg = ModelConfig::from_json_str(&format!(
            r#"{{"model_type": "llama", "quantization": {{"group_size": 64, "bits": 3,
                "mode": "trellis", "trellis_l": 12, "seed": 42, "trellis_code": "{name}"}}}}"#
        ))
        .unwrap();
        let q = cfg.quantization.unwrap().default;
        let t = q.trellis.unwrap();
        assert_eq!(t.trellis_code, code);
        let w = seeded(&[48, 128], 5);
        let (mut q, mut t) = params(3, 64, 12);
        t.trellis_code = code;
        q.trellis = Some(t);
        let (words, scales) = quantize_trellis(&w, "m.up", &q, &t, 2, None).unwrap();
        let tw = TrellisWeight::new(words, scales, q.trellis_spec(&t), t, "m.up", 48, 128).unwrap();
        let r = to_vec(&tw.decode_reference().unwrap());
        let k = to_vec(&tw.decode_kernel().unwrap());
        assert!(
            r.iter().zip(&k).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}"
        );
    }
}

#[test]
fn the_product_is_the_dequantized_matrix_and_the_error_falls_with_bits() {
    let w = seeded(&[96, 192], 7);
    let x = seeded(&[3, 192], 8);
    let wv = to_vec(&w);
    let norm: f32 = wv.iter().map(|v| v * v).sum();
    let mut errors = Vec::new();
    for bits in [2, 3, 4] {
        let tw = coded(&w, "model.layers.3.self_attn.o_proj", bits, 64, 10);
        let dq = tw.dequantize().unwrap();
        let y = to_vec(&tw.matmul_t(&x).unwrap());
        let want = to_vec(&ops::matmul(&x, &dq.transpose_all().unwrap(), None).unwrap());
        for (a, b) in y.iter().zip(&want) {
            assert!(
                (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                "{bits} bits: {a} vs {b}"
            );
        }
        let err: f32 = to_vec(&dq)
            .iter()
            .zip(&wv)
            .map(|(a, b)| (a - b) * (a - b))
            .sum();
        errors.push(err / norm);
    }
    // Lloyd-Max scalar quantizers of a Gaussian: 0.118, 0.0345, 0.0095.
    assert!(
        errors[0] < 0.118 && errors[1] < 0.0345 && errors[2] < 0.0095,
        "{errors:?}"
    );
    // Both decode paths give the same product (more rows than the fused kernel takes).
    let tw = coded(&w, "p", 3, 64, 10);
    let x8 = seeded(&[2, 4, 192], 9);
    mlx_models::layers::set_trellis_decode(mlx_models::layers::TrellisDecode::Reference);
    let r = to_vec(&tw.matmul_t(&x8).unwrap());
    let r1 = to_vec(&tw.matmul_t(&x).unwrap());
    mlx_models::layers::set_trellis_decode(mlx_models::layers::TrellisDecode::Kernel);
    let k = to_vec(&tw.matmul_t(&x8).unwrap());
    assert!(r.iter().zip(&k).all(|(a, b)| a.to_bits() == b.to_bits()));
    // Few rows take the fused decode-and-dot kernel: equal up to rounding, same shape.
    let x1 = x.reshape(&[3, 1, 192]).unwrap();
    let f = tw.matmul_t(&x1).unwrap();
    assert_eq!(f.shape(), vec![3, 1, 96]);
    for (a, b) in to_vec(&f).iter().zip(&r1) {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "fused {a} vs {b}");
    }
}

fn trellis_config(extra: &str) -> ModelConfig {
    ModelConfig::from_json_str(&format!(
        r#"{{"model_type": "llama", "quantization": {{"group_size": 64, "bits": 3,
            "mode": "trellis", "trellis_l": 10, "seed": 42{extra}}}}}"#
    ))
    .unwrap()
}

#[test]
fn a_trellis_linear_loads_strictly() {
    let cfg = trellis_config("");
    let w = seeded(&[32, 128], 3);
    let (q, t) = params(3, 64, 10);
    let (words, scales) = quantize_trellis(&w, "m.q", &q, &t, 1, None).unwrap();
    let load = |tensors: BTreeMap<String, Array>| {
        let mut ws = Weights::new(tensors, cfg.quantization.clone(), None);
        Linear::load(&mut ws, "m.q", 128, 32, false).and_then(|l| ws.finish().map(|_| l))
    };
    let good: BTreeMap<String, Array> = [
        ("m.q.weight".to_string(), words.clone()),
        ("m.q.scales".to_string(), scales.clone()),
    ]
    .into();
    let lin = load(good).unwrap();
    assert!(matches!(lin, Linear::Trellis { .. }));
    assert_eq!(lin.dims().unwrap(), (32, 128));
    // The same layer through the config gives the same product as built by hand.
    let x = seeded(&[2, 128], 4);
    let tw = TrellisWeight::new(
        words.clone(),
        scales.clone(),
        q.trellis_spec(&t),
        t,
        "m.q",
        32,
        128,
    )
    .unwrap();
    assert_eq!(
        to_vec(&lin.forward(&x).unwrap()),
        to_vec(&tw.matmul_t(&x).unwrap())
    );

    // Missing scales (then the layer is dense, and the packed weight has the wrong shape),
    // a wrong shape, a wrong dtype, an extra tensor: errors naming them.
    let err = load([("m.q.weight".to_string(), words.clone())].into()).unwrap_err();
    assert!(
        format!("{err}").contains("m.q.weight: shape [32, 12]"),
        "{err}"
    );
    let bad_shape = words.reshape(&[16, 2 * 12]).unwrap();
    let err = load(
        [
            ("m.q.weight".to_string(), bad_shape),
            ("m.q.scales".to_string(), scales.clone()),
        ]
        .into(),
    )
    .unwrap_err();
    assert!(format!("{err}").contains("m.q.weight"), "{err}");
    let err = load(
        [
            (
                "m.q.weight".to_string(),
                words.astype(Dtype::Int32).unwrap(),
            ),
            ("m.q.scales".to_string(), scales.clone()),
        ]
        .into(),
    )
    .unwrap_err();
    assert!(format!("{err}").contains("uint32"), "{err}");
    let err = load(
        [
            ("m.q.weight".to_string(), words.clone()),
            ("m.q.scales".to_string(), scales.clone()),
            ("m.q.bias".to_string(), scales.clone()),
        ]
        .into(),
    )
    .unwrap_err();
    assert!(format!("{err}").contains("m.q.bias"), "{err}");

    // Columns that are not whole blocks.
    let mut ws = Weights::new(
        [
            ("m.q.weight".to_string(), words.clone()),
            ("m.q.scales".to_string(), scales.clone()),
        ]
        .into(),
        cfg.quantization.clone(),
        None,
    );
    let err = Linear::load(&mut ws, "m.q", 96, 32, false).unwrap_err();
    assert!(format!("{err}").contains("m.q"), "{err}");
}

#[test]
fn only_linears_are_trellis_coded_and_bad_entries_are_config_errors() {
    let cfg = trellis_config("");
    let table = seeded(&[16, 64], 5);
    let (wq, s, b) = mlx_core::quantized::quantize(
        &table,
        Some(64),
        4,
        mlx_core::quantized::QuantMode::Affine,
        None,
    )
    .unwrap();
    let tensors: BTreeMap<String, Array> = [
        ("e.weight".to_string(), wq),
        ("e.scales".to_string(), s),
        ("e.biases".to_string(), b.unwrap()),
    ]
    .into();
    let mut ws = Weights::new(tensors.clone(), cfg.quantization.clone(), None);
    let err = Embedding::load(&mut ws, "e", 16, 64).unwrap_err();
    assert!(format!("{err}").contains("only linear layers"), "{err}");
    // With an affine entry for it, it loads.
    let cfg = trellis_config(r#", "e": {"group_size": 64, "bits": 4, "mode": "affine"}"#);
    let mut ws = Weights::new(tensors, cfg.quantization.clone(), None);
    Embedding::load(&mut ws, "e", 16, 64).unwrap();

    for (entry, what) in [
        (r#""bits": 5"#, "bits"),
        (r#""bits": 2, "trellis_l": 17"#, "L"),
        (r#""bits": 3, "group_size": 10"#, "block"),
        (r#""bits": 2, "seed": -1"#, "seed"),
        (r#""bits": 3, "trellis_code": "2mad""#, "trellis_code"),
    ] {
        let err = ModelConfig::from_json_str(&format!(
            r#"{{"model_type": "llama", "quantization": {{"mode": "trellis", "group_size": 64, {entry}}}}}"#
        ))
        .unwrap_err();
        let text = format!("{err}");
        assert!(
            text.contains("quantization") && text.contains(what),
            "{entry}: {text}"
        );
    }
}

/// With the inputs' second moment `H` (`--q-hessians`), `quantize_trellis` rounds by LDLQ: the
/// output error `tr(dW H dW^T)` on correlated inputs falls below plain Viterbi's; a Hessian of
/// the wrong shape is an error naming the layer.
#[test]
fn a_hessian_selects_ldlq_and_lowers_the_output_error() {
    let w = seeded(&[32, 128], 21);
    // Correlated inputs: a few strong directions plus noise.
    let basis = seeded(&[8, 128], 22);
    let coef = seeded(&[512, 8], 23);
    let noise = seeded(&[512, 128], 24);
    let x = (&ops::matmul(&coef, &basis, None).unwrap() * &Array::scalar(3.0f32).unwrap()).unwrap();
    let x = (&x + &(&noise * &Array::scalar(0.1f32).unwrap()).unwrap()).unwrap();
    let h = (&ops::matmul(&x.transpose_all().unwrap(), &x, None).unwrap()
        / &Array::scalar(512.0f32).unwrap())
        .unwrap();
    let (q, t) = params(2, 64, 8);
    let path = "model.layers.1.mlp.down_proj";
    let out_err = |hs: Option<&Array>| {
        let (words, scales) = quantize_trellis(&w, path, &q, &t, 2, hs).unwrap();
        let tw = TrellisWeight::new(words, scales, q.trellis_spec(&t), t, path, 32, 128).unwrap();
        let d = (&tw.dequantize().unwrap() - &w).unwrap();
        let e = ops::matmul(
            &ops::matmul(&d, &h, None).unwrap(),
            &d.transpose_all().unwrap(),
            None,
        )
        .unwrap();
        let ev = to_vec(&e);
        (0..32).map(|i| ev[i * 32 + i]).sum::<f32>()
    };
    let (plain, ldlq) = (out_err(None), out_err(Some(&h)));
    assert!(ldlq < 0.7 * plain, "LDLQ {ldlq} vs plain {plain}");
    let bad = seeded(&[64, 64], 25);
    let err = quantize_trellis(&w, path, &q, &t, 1, Some(&bad))
        .unwrap_err()
        .to_string();
    assert!(err.contains(path) && err.contains("hessian"), "{err}");
}

/// The second moment `X^T X / n` of `n` correlated seeded inputs of width `d` (a few strong
/// directions plus noise), as a calibration text's Hessian.
fn second_moment(d: i32, n: i32, seed: u64) -> Array {
    let basis = seeded(&[8, d], seed);
    let coef = seeded(&[n, 8], seed + 1);
    let noise = seeded(&[n, d], seed + 2);
    let x = (&ops::matmul(&coef, &basis, None).unwrap() * &Array::scalar(3.0f32).unwrap()).unwrap();
    let x = (&x + &(&noise * &Array::scalar(0.3f32).unwrap()).unwrap()).unwrap();
    (&ops::matmul(&x.transpose_all().unwrap(), &x, None).unwrap()
        / &Array::scalar(n as f32).unwrap())
        .unwrap()
}

fn words_of(a: &Array) -> Vec<u32> {
    a.eval().unwrap();
    a.as_slice::<u32>().unwrap().to_vec()
}

/// `quantize_trellis_select` (`--q-select-hessians`) codes a linear under several sign seeds
/// and keeps the one with the least output error under the held-out second moment: the kept
/// words and scales are `quantize_trellis`'s at that seed, each candidate's error is
/// `output_error` of its decoded weight, one candidate is the plain seed; a held-out Hessian
/// of the wrong shape is an error naming the layer.
#[test]
fn seed_choice_keeps_the_least_held_out_error() {
    let w = seeded(&[32, 128], 31);
    // Calibration and held-out inputs: the same directions, other draws.
    let (calib, held) = (second_moment(128, 256, 40), second_moment(128, 256, 40));
    let held = (&held + &(&second_moment(128, 256, 50) * &Array::scalar(0.5f32).unwrap()).unwrap())
        .unwrap();
    let (q, t) = params(2, 64, 8);
    let path = "model.layers.2.self_attn.o_proj";
    let c = quantize_trellis_select(&w, path, &q, &t, 2, Some(&calib), &held, 4, Dtype::Float16)
        .unwrap();
    assert_eq!(c.errors.len(), 4);
    let best = (0..4)
        .min_by(|&a, &b| c.errors[a].total_cmp(&c.errors[b]))
        .unwrap();
    assert_eq!(c.seed, t.seed + best as u64);
    // The seed matters: the candidates' errors differ.
    assert!(c.errors.iter().any(|&e| e != c.errors[0]), "{:?}", c.errors);
    for (j, &e) in c.errors.iter().enumerate() {
        let tj = TrellisParams {
            seed: t.seed + j as u64,
            ..t
        };
        let (words, scales) = quantize_trellis(&w, path, &q, &tj, 2, Some(&calib)).unwrap();
        let scales = scales.astype(Dtype::Float16).unwrap();
        if j == best {
            assert_eq!(
                words_of(&words),
                words_of(&c.weight),
                "the kept words are seed {}'s",
                tj.seed
            );
            assert_eq!(to_vec(&scales), to_vec(&c.scales));
            assert_eq!(c.scales.dtype(), Dtype::Float16);
        }
        let deq = TrellisWeight::new(words, scales, q.trellis_spec(&tj), tj, path, 32, 128)
            .unwrap()
            .dequantize()
            .unwrap();
        assert_eq!(output_error(&w, &deq, &held).unwrap(), e, "candidate {j}");
    }
    // One candidate: the plain seed, `quantize_trellis`'s codes.
    let one = quantize_trellis_select(&w, path, &q, &t, 2, Some(&calib), &held, 1, Dtype::Float32)
        .unwrap();
    let (words, _) = quantize_trellis(&w, path, &q, &t, 2, Some(&calib)).unwrap();
    assert_eq!(one.seed, t.seed);
    assert_eq!(words_of(&one.weight), words_of(&words));
    let err = quantize_trellis_select(
        &w,
        path,
        &q,
        &t,
        1,
        Some(&calib),
        &seeded(&[64, 64], 9),
        2,
        Dtype::Float32,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains(path) && err.contains("held-out"), "{err}");
}

//! The CPU decoder on trellis-coded linears (`"mode": "trellis"`): a tiny llama fixture
//! converted by `mlx convert -q --q-mode trellis` (the library call) at 2, 3 and 4 bits, its
//! teacher-forced logits and decode steps against the exact path (the model's MLX forward, the
//! trellis layers through the plain-ops decode, `TrellisDecode::Reference`).
//!
//! Tier L2: the CPU decoder's trellis products (`cpu::trellis::TrellisView`: fast
//! Walsh-Hadamard transforms, the fused decode-and-dot kernel) sum in another order than the
//! reference's (Hadamard matrices as matmuls, the decoded matrix in a BLAS product). Bound:
//! `|ours - exact| <= 1e-4 * (1 + max |exact|)` per position with float32 activations; 1e-3
//! with the default ones (the affine 4-bit tied head reads int16-quantized inputs; `mlx
//! generate` on a 3-bit model measured log-probability differences of ~1e-4).

use std::path::PathBuf;

use mlx_core::cpu::Activations;
use mlx_core::prelude::*;
use mlx_engine::cpu_decode::{unsupported, CpuDecoder, KvDtype, BLOCK};
use mlx_models::config::TrellisParams;
use mlx_models::convert::{convert, ConvertOptions};
use mlx_models::layers::{set_trellis_decode, TrellisDecode};
use mlx_models::load::{load_model_dir, LoadOptions};

fn prompt(vocab: i32, n: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i as u64 * 2_654_435_761 + 17) % vocab as u64) as u32)
        .collect()
}

#[test]
fn a_trellis_model_decodes_on_the_cpu_decoder_near_the_exact_path() {
    let src =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../mlx-models/tests/models/dense_f32");
    let tmp = std::env::temp_dir().join(format!("cpu_decode_trellis_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    set_trellis_decode(TrellisDecode::Reference);
    use mlx_core::cpu::trellis::TrellisCode;
    // 1mad8 at 3 bits: its int16-activation steps run the int8 kernel.
    for (bits, code) in [
        (2, TrellisCode::Mad),
        (3, TrellisCode::Mad),
        (4, TrellisCode::Mad),
        (3, TrellisCode::Mad8),
    ] {
        let dst = tmp.join(format!("t{bits}-{}", code.name()));
        let opts = ConvertOptions {
            quantize: true,
            q_bits: Some(bits),
            trellis: Some(TrellisParams {
                trellis_l: 8,
                seed: 3,
                trellis_code: code,
            }),
            ..ConvertOptions::default()
        };
        convert(&src, &dst, &opts, &mut |_| {}).unwrap();
        let (model, _) = load_model_dir(
            &dst,
            &LoadOptions {
                dtype: Some(Dtype::Float32),
            },
        )
        .unwrap();
        assert_eq!(unsupported(model.as_ref()), None, "{bits} bits {code:?}");
        let ids = prompt(model.vocab_size(), BLOCK + 5);
        let v: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
        let x = Array::from_slice(&v, &[1, v.len() as i32]).unwrap();
        let logits = model
            .forward(&x, None)
            .unwrap()
            .astype(Dtype::Float32)
            .unwrap();
        let vocab = *logits.shape().last().unwrap() as usize;
        let reference: Vec<Vec<f32>> = logits
            .to_vec::<f32>()
            .unwrap()
            .chunks(vocab)
            .map(<[f32]>::to_vec)
            .collect();
        let check = |what: String, ours: &[f32], exact: &[f32], tol: f32| {
            let scale = 1.0 + exact.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = ours
                .iter()
                .zip(exact)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                worst <= tol * scale,
                "{bits} bits {code:?} {what}: max |ours - exact| = {worst}, scale {scale}"
            );
        };
        let mut dec = CpuDecoder::new(model.as_ref(), 2, 8).unwrap();
        dec.set_activations(Activations::F32);
        dec.set_kv_dtype(KvDtype::F32);
        let mut seen = 0;
        dec.feed_all(&ids, &mut |i, l| {
            check(format!("position {i}"), l, &reference[i], 1e-4);
            seen += 1;
        })
        .unwrap();
        assert_eq!(seen, ids.len());
        // The default activations (integer kernels for affine rows) leave trellis rows on
        // their own kernel: decode steps through the cache give the same logits.
        let mut dec = CpuDecoder::new(model.as_ref(), 2, 8).unwrap();
        dec.set_kv_dtype(KvDtype::F32);
        let split = ids.len() - 3;
        dec.feed(&ids[..split]).unwrap();
        for (i, &t) in ids.iter().enumerate().skip(split) {
            let l = dec.feed(&[t]).unwrap().to_vec();
            check(format!("step at {i}"), &l, &reference[i], 1e-3);
        }
    }
    set_trellis_decode(TrellisDecode::Kernel);
    let _ = std::fs::remove_dir_all(&tmp);
}

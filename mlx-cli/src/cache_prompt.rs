//! `mlx cache-prompt`: `mlx_lm.cache_prompt` — run a prompt through the model and save the KV
//! cache with mlx-lm's metadata (`model`, `tokenizer_config`), so that `mlx generate
//! --prompt-cache-file` and `mlx_lm.generate --prompt-cache-file` continue it.

use clap::Args;
use mlx_cache::save_prompt_cache;
use mlx_core::io::StringMap;
use mlx_engine::chat_template::ChatTemplateOptions;
use mlx_engine::generate::{generate_step, make_prompt_cache, GenerateOptions};
use serde_json::{json, Map, Value};

use crate::common::{self, KvArgs, ModelArgs};
use crate::model;

/// `mlx_lm.cache_prompt`'s flags.
#[derive(Args, Debug, Clone)]
#[command(args_override_self = true)]
pub struct CachePromptArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Accepted for mlx-lm compatibility (nothing is run from the model directory); recorded
    /// in the cache file's `tokenizer_config`, as mlx-lm records it.
    #[arg(long)]
    pub trust_remote_code: bool,
    /// End of sequence token for tokenizer (recorded in the cache file: `mlx generate
    /// --prompt-cache-file` stops at it).
    #[arg(long, value_name = "TOKEN")]
    pub eos_token: Option<String>,
    /// The file to write the KV cache to (safetensors).
    #[arg(long, value_name = "FILE")]
    pub prompt_cache_file: String,
    /// Message to be processed by the model (`-` reads all of stdin).
    #[arg(long, short = 'p')]
    pub prompt: String,
    #[command(flatten)]
    pub kv: KvArgs,
}

/// mlx_lm.cache_prompt's `tokenizer_config`, in its order: `trust_remote_code`, then
/// `eos_token` when given. The tokenizer is loaded with it and the cache file records it.
fn tokenizer_config(a: &CachePromptArgs) -> Map<String, Value> {
    let mut c = Map::new();
    c.insert("trust_remote_code".into(), Value::Bool(a.trust_remote_code));
    if let Some(t) = &a.eos_token {
        c.insert("eos_token".into(), Value::String(t.clone()));
    }
    c
}

pub fn run(a: &CachePromptArgs) -> Result<(), String> {
    // Ctrl-C while the cache is written leaves no `.<name>.<pid>.partial.safetensors`;
    // partials of writers killed outright are removed by the write itself.
    mlx_core::partial::cleanup_on_interrupt();
    let tokenizer_config = tokenizer_config(a);
    let m = model::load_for_with(&a.model, false, false, &tokenizer_config, &mut |_| {})?;
    let text = common::read_prompt(&a.prompt)?;
    let tok = &m.tokenizer;
    // mlx_lm.cache_prompt: the message left open (continue_final_message), or the raw prompt
    // with special tokens.
    let ids = if tok.has_chat_template() {
        let opts = ChatTemplateOptions {
            add_generation_prompt: false,
            continue_final_message: Some("content".into()),
            ..ChatTemplateOptions::default()
        };
        tok.apply_chat_template_ids(&[json!({"role": "user", "content": text})], &opts)
    } else {
        tok.encode(&text, true)
    }
    .map_err(|e| e.to_string())?;
    let ids: Vec<i32> = ids
        .into_iter()
        .map(|t| i32::try_from(t).map_err(|_| format!("token id {t} out of range")))
        .collect::<Result<_, _>>()?;
    let mut opts = GenerateOptions {
        max_tokens: Some(0),
        ..GenerateOptions::default()
    };
    a.kv.apply(&mut opts);
    let caches =
        make_prompt_cache(m.model.as_ref(), opts.max_kv_size).map_err(|e| e.to_string())?;
    opts.prompt_progress = crate::progress::prefill_bar(ids.len());
    let mut steps =
        generate_step(&ids, m.model.as_ref(), Some(caches), opts).map_err(|e| e.to_string())?;
    for s in steps.by_ref() {
        s.map_err(|e| e.to_string())?;
    }
    let caches = steps.into_cache();
    // mlx_lm.cache_prompt's lines: its `Peak memory: ... GB` line is the one scripts read.
    common::out(format_args!("Processed {} tokens", ids.len()))?;
    common::out(format_args!(
        "Peak memory: {:.3} GB",
        mlx_core::memory::peak_memory().map_err(|e| e.to_string())? as f64 / 1e9
    ))?;
    common::out(format_args!("Saving..."))?;
    let mut metadata = StringMap::new();
    // mlx-lm stores the --model argument as given (its own default when absent); without
    // --model, the built-in default's Hub name, which `mlx generate --prompt-cache-file`
    // loads as the built-in default and `mlx_lm.generate` as that repository.
    metadata.insert(
        "model".into(),
        a.model
            .model
            .clone()
            .unwrap_or_else(|| mlx_engine::load::DEFAULT_REPO.into()),
    );
    // `json.dumps(tokenizer_config)`, byte for byte.
    metadata.insert(
        "tokenizer_config".into(),
        mlx_models::pyjson::dumps_inline(&Value::Object(tokenizer_config), true),
    );
    save_prompt_cache(&a.prompt_cache_file, &caches, &metadata)
        .map_err(|e| format!("{}: {e}", a.prompt_cache_file))
}

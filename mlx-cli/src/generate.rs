//! `mlx generate`: `mlx_lm.generate`'s flags and output, plus `--prompt-ids`, `--stop`,
//! `--top-logprobs`, `--json` and `--dtype`.

use std::io::Write;

use clap::Args;
use mlx_cache::{load_prompt_cache, Cache, QuantizedKVCache};
use mlx_engine::chat_template::ChatTemplateOptions;
use mlx_engine::generate::GenerateOptions;
use mlx_engine::sample::{Sampler, SamplerSettings};
use mlx_engine::stream::{
    stream_generate, stream_generate_cpu_draft, stream_generate_cpu_speculative,
    stream_generate_graph_draft, stream_generate_speculative, FinishReason, StreamOptions,
};
use serde_json::{json, Map, Value};

use crate::common::{self, DecoderArgs, KvArgs, ModelArgs, SpecArgs, SpecSource};
use crate::model::{self, Loaded};
use mlx_engine::tokenizer::Tokenizer;

/// `mlx_lm.generate`'s flags.
#[derive(Args, Debug, Clone)]
#[command(args_override_self = true)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Accepted for mlx-lm compatibility (nothing is run from the model directory).
    #[arg(long)]
    pub trust_remote_code: bool,
    /// Message to be processed by the model (`\n`, `\t` unescaped; `-` reads all of stdin).
    #[arg(
        long,
        short = 'p',
        default_value = "hello",
        conflicts_with = "prompt_ids"
    )]
    pub prompt: String,
    /// Prompt token ids, used as they are (no chat template).
    #[arg(long, value_delimiter = ',', value_name = "ID,ID,...")]
    pub prompt_ids: Option<Vec<u32>>,
    /// System prompt to be used for the chat template.
    #[arg(long, alias = "system")]
    pub system_prompt: Option<String>,
    /// Prefill response to be used for the chat template (the reply continues it).
    #[arg(long)]
    pub prefill_response: Option<String>,
    /// Maximum number of tokens to generate (-1: no limit).
    #[arg(
        long,
        short = 'm',
        default_value_t = 100,
        allow_negative_numbers = true
    )]
    pub max_tokens: i64,
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temp: f64,
    /// Sampling top-p (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    /// Sampling min-p (0: off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f64,
    /// Sampling top-k (0 or less: off, as mlx-lm reads it).
    #[arg(long, default_value_t = 0)]
    pub top_k: i32,
    /// Probability of XTC sampling to happen each next token.
    #[arg(long, default_value_t = 0.0)]
    pub xtc_probability: f64,
    /// Threshold the probs of each next token candidate to be sampled by XTC.
    #[arg(long, default_value_t = 0.1)]
    pub xtc_threshold: f64,
    /// Minimum tokens to keep for min-p sampling.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub min_tokens_to_keep: u64,
    /// PRNG seed (as mlx-lm: seeded before the model is built, so the same seed samples the
    /// same tokens).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Use the raw prompt without the tokenizer's chat template.
    #[arg(long, alias = "no-chat-template")]
    pub ignore_chat_template: bool,
    /// Accepted for mlx-lm compatibility (`mlx_lm.generate` parses it and does nothing with it).
    #[arg(long)]
    pub use_default_chat_template: bool,
    /// Additional variables for the chat template, as a JSON object.
    #[arg(long, value_name = "JSON")]
    pub chat_template_config: Option<String>,
    /// Add tokens to the EOS tokens that stop generation.
    #[arg(long, num_args = 1.., value_name = "TOKEN")]
    pub extra_eos_token: Vec<String>,
    /// Print the text as it streams plus statistics (`true`), or only the reply (`false` or
    /// `f`, any case).
    #[arg(long, default_value = "true", value_parser = common::str2bool, value_name = "BOOL",
          action = clap::ArgAction::Set)]
    pub verbose: bool,
    #[command(flatten)]
    pub kv: KvArgs,
    #[command(flatten)]
    pub decoder: DecoderArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// A file of saved KV caches (`mlx cache-prompt`, `mlx_lm.cache_prompt`): the prompt
    /// continues what it holds.
    #[arg(long, value_name = "FILE")]
    pub prompt_cache_file: Option<String>,
    /// Stop when this text appears (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// With --json: the K most likely tokens of each step.
    #[arg(long, default_value_t = 0, value_name = "K")]
    pub top_logprobs: usize,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Constrain the reply to JSON valid against the JSON schema in FILE (constrained
    /// decoding through llguidance).
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<String>,
}

/// `--json-schema FILE` read and parsed (not yet compiled: that needs the tokenizer).
pub(crate) fn read_json_schema(path: &str) -> Result<Value, String> {
    use std::io::Read;
    // Bounded: a schema is small, and the path may name a device or an endless pipe.
    const LIMIT: u64 = 16 << 20;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(LIMIT + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("--json-schema {path}: {e}"))?;
    if bytes.len() as u64 > LIMIT {
        return Err(format!(
            "--json-schema {path}: larger than {} MiB; a JSON schema is expected",
            LIMIT >> 20
        ));
    }
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("--json-schema {path}: not valid JSON: {e}"))?;
    if !(v.is_object() || v.is_boolean()) {
        return Err(format!(
            "--json-schema {path}: a JSON schema must be an object (or a boolean)"
        ));
    }
    Ok(v)
}

/// The grammar of `--json-schema`, compiled for the loaded tokenizer and model.
pub(crate) fn json_schema_grammar(
    path: Option<&str>,
    m: &Loaded,
) -> Result<Option<mlx_engine::grammar::Grammar>, String> {
    let Some(path) = path else {
        return Ok(None);
    };
    let schema = read_json_schema(path)?;
    let vocab = m.model.vocab_size().max(0) as usize;
    let compiler = mlx_engine::grammar::GrammarCompiler::new(&m.tokenizer, vocab)
        .map_err(|e| format!("--json-schema {path}: {e}"))?;
    compiler
        .compile(&mlx_engine::grammar::GrammarSpec::JsonSchema(schema))
        .map(Some)
        .map_err(|e| format!("--json-schema {path}: invalid schema: {e}"))
}

/// A prompt-cache file and its metadata.
pub struct CacheFile {
    caches: Vec<Box<dyn Cache>>,
    model: Option<String>,
    /// The metadata's `tokenizer_config` (what `mlx_lm.cache_prompt` loaded the tokenizer
    /// with, e.g. its `--eos-token`) without `trust_remote_code`: the continuation's tokenizer
    /// is loaded with it, as `mlx_lm.generate` does.
    tokenizer_config: Map<String, Value>,
}

/// A prompt-cache file's `tokenizer_config` metadata (`json.dumps` of a dict): an object, its
/// `trust_remote_code` dropped (mlx-lm's generate replaces it with its own flag, which changes
/// nothing here). A file without the entry (older tools) gives an empty one.
fn cache_tokenizer_config(path: &str, entry: Option<&str>) -> Result<Map<String, Value>, String> {
    let Some(text) = entry else {
        return Ok(Map::new());
    };
    let mut config = match serde_json::from_str(text) {
        Ok(Value::Object(m)) => m,
        Ok(_) => {
            return Err(format!(
                "{path}: the prompt cache's metadata `tokenizer_config` is not a JSON object"
            ))
        }
        Err(e) => {
            return Err(format!(
                "{path}: the prompt cache's metadata `tokenizer_config` is not valid JSON: {e}"
            ))
        }
    };
    config.remove("trust_remote_code");
    Ok(config)
}

/// `main`'s prompt-cache checks: the kv flags must match a quantized cache, and the metadata's
/// `tokenizer_config` must be a JSON object.
pub(crate) fn load_cache_file(path: &str, a: &GenerateArgs) -> Result<CacheFile, String> {
    let (caches, metadata) = load_prompt_cache(path).map_err(|e| e.to_string())?;
    if let Some(q) = caches
        .first()
        .and_then(|c| c.as_any().downcast_ref::<QuantizedKVCache>())
    {
        if a.kv.kv_bits.is_some_and(|b| b != q.spec().bits) {
            return Err(format!(
                "{path}: --kv-bits does not match the kv cache loaded from --prompt-cache-file"
            ));
        }
        if a.kv.kv_group_size != q.spec().group_size {
            return Err(format!(
                "{path}: --kv-group-size does not match the kv cache loaded from \
                 --prompt-cache-file"
            ));
        }
    }
    if let Some(t) = caches
        .first()
        .and_then(|c| c.as_any().downcast_ref::<mlx_cache::TrellisKVCache>())
    {
        if a.kv.kv_bits.is_some_and(|b| b != t.spec().bits as i32) {
            return Err(format!(
                "{path}: --kv-bits does not match the trellis kv cache loaded from \
                 --prompt-cache-file ({} bits)",
                t.spec().bits
            ));
        }
    }
    let tokenizer_config =
        cache_tokenizer_config(path, metadata.get("tokenizer_config").map(String::as_str))?;
    Ok(CacheFile {
        caches,
        model: metadata.get("model").cloned(),
        tokenizer_config,
    })
}

pub(crate) fn template_kwargs(a: &GenerateArgs) -> Result<Map<String, Value>, String> {
    match &a.chat_template_config {
        None => Ok(Map::new()),
        Some(s) => match serde_json::from_str(s) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(_) => Err("--chat-template-config must be a JSON object".into()),
            Err(e) => Err(format!("--chat-template-config: invalid JSON: {e}")),
        },
    }
}

/// The prompt's token ids, as `mlx_lm.generate.main` builds them.
fn prompt_ids(a: &GenerateArgs, tok: &Tokenizer, using_cache: bool) -> Result<Vec<u32>, String> {
    if let Some(ids) = &a.prompt_ids {
        return Ok(ids.clone());
    }
    let mut prompt = common::read_prompt(&a.prompt)?;
    let use_template = !a.ignore_chat_template && tok.has_chat_template();
    if use_template {
        let mut messages: Vec<Value> = Vec::new();
        if let Some(s) = &a.system_prompt {
            messages.push(json!({"role": "system", "content": s}));
        }
        messages.push(json!({"role": "user", "content": prompt}));
        let has_prefill = a.prefill_response.is_some();
        if let Some(p) = &a.prefill_response {
            messages.push(json!({"role": "assistant", "content": p}));
        }
        let opts = |kwargs: Map<String, Value>| ChatTemplateOptions {
            add_generation_prompt: !has_prefill,
            continue_final_message: has_prefill.then(|| "content".to_string()),
            kwargs,
            ..ChatTemplateOptions::default()
        };
        prompt = tok
            .apply_chat_template(&messages, &opts(template_kwargs(a)?))
            .map_err(|e| e.to_string())?;
        if using_cache {
            // The cache holds the prefix: keep the prompt from where the last message starts.
            if let Some(last) = messages.last_mut() {
                last["content"] = json!("<query>");
            }
            let test = tok
                .apply_chat_template(&messages, &opts(Map::new()))
                .map_err(|e| e.to_string())?;
            let at = test.find("<query>").ok_or_else(|| {
                "the chat template drops the message content; cannot continue a prompt cache"
                    .to_string()
            })?;
            prompt = prompt.get(at..).unwrap_or_default().to_string();
        }
    }
    tok.encode(&prompt, !use_template)
        .map_err(|e| e.to_string())
}

/// `make_sampler(...)` with `mlx_lm.generate.main`'s XTC special tokens: `"\n"` encoded, then
/// the EOS ids (the flags were checked by `check`).
fn sampler(a: &GenerateArgs, special: Vec<i32>) -> Sampler {
    Sampler::new(SamplerSettings {
        temp: a.temp,
        top_p: a.top_p,
        min_p: a.min_p,
        min_tokens_to_keep: a.min_tokens_to_keep as usize,
        top_k: a.top_k.max(0),
        xtc_probability: a.xtc_probability,
        xtc_threshold: a.xtc_threshold,
        xtc_special_tokens: special,
    })
}

/// The sampler's XTC special tokens: `"\n"` encoded, then the EOS ids.
fn xtc_special_tokens(tok: &Tokenizer) -> Result<Vec<i32>, String> {
    let mut special: Vec<i32> = tok
        .encode("\n", true)
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|t| t as i32)
        .collect();
    special.extend(tok.eos_token_ids().iter().map(|&t| t as i32));
    Ok(special)
}

/// What `mlx generate` computes from the tokenizer alone, in its order, stopping at the first
/// error: the `--extra-eos-token`s added, the prompt's ids, the sampler's special tokens.
struct FromTokenizer {
    extra_eos: Result<(), String>,
    ids: Option<Result<Vec<u32>, String>>,
    special: Option<Result<Vec<i32>, String>>,
}

impl FromTokenizer {
    fn compute(a: &GenerateArgs, tok: &mut Tokenizer, using_cache: bool) -> FromTokenizer {
        let mut f = FromTokenizer {
            extra_eos: Ok(()),
            ids: None,
            special: None,
        };
        for t in &a.extra_eos_token {
            if let Err(e) = tok.add_eos_token(t) {
                f.extra_eos = Err(format!("--extra-eos-token {t:?}: {e}"));
                return f;
            }
        }
        let ids = prompt_ids(a, tok, using_cache);
        let ok = ids.is_ok();
        f.ids = Some(ids);
        if ok {
            f.special = Some(xtc_special_tokens(tok));
        }
        f
    }
}

/// Runs a checked command line; `cache_file` is `--prompt-cache-file` as `check` loaded it.
pub fn run(a: &GenerateArgs, cache_file: Option<CacheFile>) -> Result<(), String> {
    let mut model_args = a.model.clone();
    if let Some(cf) = &cache_file {
        // The built-in default under any of its names, or as `mlx cache-prompt` recorded it
        // before it wrote a name (`"None"`).
        let default = |m: &str| m == "None" || mlx_engine::load::DEFAULT_NAMES.contains(&m);
        match (&model_args.model, &cf.model) {
            (None, Some(m)) if m != "None" => model_args.model = Some(m.clone()),
            (Some(given), Some(m)) if given != m && !(default(given) && default(m)) => {
                return Err(format!(
                    "Providing a different model ({given}) than that used to create the prompt \
                     cache ({m}) is an error."
                ))
            }
            _ => {}
        }
    }
    // GGML blocks kept for the CPU decoder where it will likely run (not for a draft model's
    // exact speculation or a prompt cache's continuation, which stay on MLX under `auto`).
    let blocks = a.decoder.loads_gguf_blocks(
        &a.model.dtype,
        a.spec.draft_model.is_some() || a.prompt_cache_file.is_some(),
    );
    let using_cache = cache_file.is_some();
    // A split load: where nothing after loading encodes (no grammar, no speculation, no prompt
    // cache), the prompt's ids and the sampler's special tokens are computed from the
    // tokenizer before any weight is read, and its backend (the vocabulary both ways and the
    // merges) is dropped then, not after the weights (issue #31's peak memory: it was resident
    // through the whole load). Errors come in the same order as without it.
    let split = a.json_schema.is_none()
        && !using_cache
        && a.spec.draft_model.is_none()
        && a.spec.prompt_lookup_ngram.is_none()
        && !a.spec.mtp;
    let mut early: Option<FromTokenizer> = None;
    let mut before_weights = |tok: &mut Tokenizer| {
        if split {
            let f = FromTokenizer::compute(a, tok, using_cache);
            if f.special.as_ref().is_some_and(Result::is_ok) {
                tok.keep_decoding_only();
            }
            early = Some(f);
        }
    };
    let tokenizer_config = cache_file
        .as_ref()
        .map(|cf| cf.tokenizer_config.clone())
        .unwrap_or_default();
    let mut m = model::load_for_with(
        &model_args,
        a.spec.mtp,
        blocks,
        &tokenizer_config,
        &mut before_weights,
    )
    .map_err(|e| match &a.prompt_cache_file {
        // The tokenizer took entries from the cache file: say where a bad one came from.
        Some(path) if !tokenizer_config.is_empty() && e.contains("tokenizer") => format!(
            "{e} (the tokenizer was loaded with {path}'s `tokenizer_config` metadata: {})",
            Value::Object(tokenizer_config.clone())
        ),
        _ => e,
    })?;
    let f = match early.take() {
        Some(f) => f,
        None => FromTokenizer::compute(a, &mut m.tokenizer, using_cache),
    };
    f.extra_eos?;
    let ids = f.ids.expect("computed after the EOS tokens")?;
    let caches = match cache_file {
        Some(cf) => {
            if cf.caches.len() != m.model.num_layers() {
                return Err(format!(
                    "the prompt cache file has {} layers, the model {}",
                    cf.caches.len(),
                    m.model.num_layers()
                ));
            }
            Some(cf.caches)
        }
        None => None,
    };
    let spec = a.spec.load(&m, &a.model.dtype)?;
    if let Some(s) = a.seed {
        match &spec {
            Some(sp) => sp.seed(&m, s)?,
            None => m.seed(s).map_err(|e| e.to_string())?,
        }
    }
    let grammar = json_schema_grammar(a.json_schema.as_deref(), &m)?;
    let mut generate = GenerateOptions {
        max_tokens: common::max_tokens(a.max_tokens),
        sampler: sampler(a, f.special.expect("computed after the prompt")?),
        grammar,
        ..GenerateOptions::default()
    };
    a.kv.apply(&mut generate);
    // Nothing below encodes: the stream needs of the tokenizer only its detokenizer's token
    // map and the EOS ids. The backend (its vocabulary both ways and its merges, ~9 MiB on
    // SmolLM2) goes back to the system before the KV cache fills, and with it issue #31's peak
    // memory. The streamed text is byte for byte the same.
    if m.tokenizer.keep_decoding_only() {
        let _ = mlx_core::memory::release_free_memory();
    }
    // Loading is over: the code and read-only data pages only it touched (the GGUF and
    // tokenizer readers, the model's construction) stop counting in the resident set before
    // the KV cache fills; what the steps run comes back at its first touch (see
    // `release_file_pages`; the CPU decoder does the same again once the prompt is in).
    // `mlx generate` maps and unmaps nothing on other threads where it releases them (here
    // and once the prompt is in), so it allows it (a library user's program does not).
    mlx_core::memory::allow_file_page_release(true);
    let _ = mlx_core::memory::release_file_pages();
    let lookup = match &spec {
        Some(SpecSource::Lookup(n)) => Some(*n),
        _ => None,
    };
    // A draft model runs on the CPU decoder beside the target's only when asked for
    // (`--decoder cpu`): on the CPU, `auto` keeps mlx-lm's exact speculation (L1) for it.
    let draft_on_cpu = matches!(&spec, Some(SpecSource::Draft(_))) && a.decoder.decoder == "cpu";
    // A draft model on the GPU graph decoder (`--decoder graph`, or `auto` where MLX runs on
    // the GPU with `--dtype auto`): drafts and their verification as graph steps, greedy;
    // else mlx-lm's exact speculation on the MLX path, with the reason.
    // `Ok(true)`: it runs; `Err(why)`: it would have been chosen but cannot run.
    let draft_on_graph: Result<bool, String> = match &spec {
        Some(SpecSource::Draft(d)) => {
            let on_gpu =
                mlx_core::Device::default_device().is_ok_and(|dv| dv != mlx_core::Device::cpu());
            let asked = a.decoder.decoder == "graph";
            let auto = a.decoder.decoder == "auto" && on_gpu && a.model.dtype == "auto";
            let why = if !asked && !auto {
                None
            } else if !asked && !mlx_engine::graph_speculative::BY_DEFAULT {
                Some(
                    "speculation on the graph decoder is off by default in this build \
                     (`--decoder graph` opts in)"
                        .to_string(),
                )
            } else if a.top_logprobs > 0 {
                Some("--top-logprobs".to_string())
            } else if caches.is_some() {
                Some("a prompt cache file".to_string())
            } else {
                mlx_engine::graph_speculative::unsupported(
                    m.model.as_ref(),
                    d.model.as_ref(),
                    &generate,
                    a.spec.num_draft_tokens(),
                )
            };
            match why {
                Some(w) if asked => return Err(format!("--decoder graph: speculation: {w}")),
                Some(w) => Err(w),
                None => Ok(asked || auto),
            }
        }
        _ => Ok(false),
    };
    let graph_draft_why = draft_on_graph.as_ref().err().cloned();
    let draft_on_graph = draft_on_graph.unwrap_or(false);
    let mut decoder = if draft_on_graph {
        common::DecoderChoice {
            cpu: None,
            graph: false,
            name: "graph",
            note: format!(
                "decoder: graph (speculative: the draft model's drafts on a graph decoder of \
                 its own, {} + 1 tokens verified in one graph step of the target, greedy)",
                a.spec.num_draft_tokens()
            ),
        }
    } else if lookup.is_some() || draft_on_cpu {
        let greedy = if a.temp != 0.0 {
            Err(format!("--temp {}", a.temp))
        } else if !generate.logits_processors.is_empty() {
            Err("logits processors (--repetition-penalty and the like)".into())
        } else if a.top_logprobs > 0 {
            Err("--top-logprobs".into())
        } else {
            Ok(())
        };
        a.decoder.pick_for_prompt_lookup(
            m.model.as_ref(),
            &generate,
            &a.model.dtype,
            caches.is_some(),
            greedy,
        )?
    } else {
        a.decoder.pick_unless_speculative(
        spec.is_some(),
        m.model.as_ref(),
        &generate,
        &a.model.dtype,
        caches.is_some(),
        if a.top_logprobs > 0 {
            Err("--top-logprobs (the graph decoder reads back only the token and its log-probability)".into())
        } else if let Some(c) = caches
            .as_ref()
            .and_then(|c| c.iter().find(|c| c.class_name() != "KVCache"))
        {
            Err(format!("the prompt cache file holds a {} (plain KV caches only)", c.class_name()))
        } else {
            Ok(())
        },
    )?
    };
    if let Some(why) = &graph_draft_why {
        if decoder.name == "mlx" {
            decoder.note = format!(
                "{}; the graph decoder does not speculate here: {why})",
                decoder.note.trim_end_matches(')')
            );
        }
    }
    if draft_on_cpu {
        decoder.note = decoder.note.replace(
            "prompt lookup drafts",
            "the draft model's drafts (its own CPU decoder)",
        );
    }
    decoder.apply(&mut generate);
    if a.verbose {
        eprintln!("[mlx] {}", decoder.note);
    }
    generate.prompt_progress = crate::progress::prefill_bar(ids.len());
    let opts = StreamOptions {
        generate,
        stop_strings: a.stop.clone(),
        top_logprobs: a.top_logprobs,
    };
    // Speculation on the graph decoder that `auto` chose and that cannot start (device memory
    // for two decoders, a CUDA or NVRTC failure) gives the run to mlx-lm's speculation on the
    // MLX path, as plain graph decoding falls back; asked for (`--decoder graph`), it is an
    // error.
    let on_graph = match &spec {
        Some(SpecSource::Draft(d)) if draft_on_graph => match stream_generate_graph_draft(
            m.model.as_ref(),
            &m.tokenizer,
            &ids,
            d.model.as_ref(),
            a.spec.num_draft_tokens(),
            opts.clone(),
        ) {
            Ok(s) => Some(s),
            Err(e) if a.decoder.decoder != "graph" => {
                eprintln!(
                    "[mlx] warning: speculation on the graph decoder could not start ({e}); \
                     mlx-lm's speculation on the MLX path runs instead"
                );
                None
            }
            Err(e) => return Err(e.to_string()),
        },
        _ => None,
    };
    let mut stream = match on_graph {
        Some(s) => s,
        None => match (&spec, lookup) {
            (Some(SpecSource::Draft(d)), _) if decoder.cpu.is_some() => stream_generate_cpu_draft(
                m.model.as_ref(),
                &m.tokenizer,
                &ids,
                d.model.as_ref(),
                a.spec.num_draft_tokens(),
                opts,
            ),
            (Some(_), Some(n)) if decoder.cpu.is_some() => stream_generate_cpu_speculative(
                m.model.as_ref(),
                &m.tokenizer,
                &ids,
                n,
                a.spec.num_draft_tokens(),
                opts,
            ),
            (Some(sp), _) => stream_generate_speculative(
                m.model.as_ref(),
                &m.tokenizer,
                &ids,
                caches,
                sp.drafter(),
                a.spec.num_draft_tokens(),
                opts,
            ),
            (None, _) => stream_generate(m.model.as_ref(), &m.tokenizer, &ids, caches, opts),
        }
        .map_err(|e| e.to_string())?,
    };
    let mut out = std::io::stdout().lock();
    let streaming = a.verbose && !a.json;
    if streaming {
        writeln!(out, "==========").ok();
    }
    let (mut tokens, mut logprobs, mut tops, mut text) =
        (Vec::new(), Vec::new(), Vec::new(), String::new());
    let mut last = None;
    let mut from_draft = Vec::new();
    for r in stream.by_ref() {
        let r = r.map_err(|e| e.to_string())?;
        let eos = r.finish_reason == Some(FinishReason::Stop)
            && r.token
                .is_some_and(|t| m.tokenizer.eos_token_ids().contains(&t));
        if let (Some(t), Some(lp), false) = (r.token, r.logprob, eos) {
            tokens.push(t);
            from_draft.push(r.from_draft);
            logprobs.push(f64::from(lp));
            tops.push(
                r.top_logprobs
                    .iter()
                    .map(|(i, v)| json!([i, f64::from(*v)]))
                    .collect::<Vec<_>>(),
            );
        }
        if streaming {
            write!(out, "{}", r.text).ok();
            out.flush().ok();
        }
        text.push_str(&r.text);
        last = Some(r);
    }
    let graph_fallback = stream.graph_fallback().map(str::to_owned);
    let graph_build_times = stream.graph_build_times();
    let spec_stats = stream.spec_stats();
    // The generation is over: the KV cache and the decoder's buffers go back to the system
    // before the output is built and the teardown (the model's drop, MLX's destructors)
    // brings its code back into memory (`release_file_pages` let it go after loading):
    // without this the process's peak was its exit (issue #31's peak memory).
    drop(stream);
    let _ = mlx_core::memory::release_free_memory();
    if let Some(w) = &graph_fallback {
        eprintln!("[mlx] warning: {w}");
    }
    if a.verbose {
        if let Some(b) = graph_build_times {
            eprintln!("[mlx] {}", crate::common::graph_build_note(&b));
        }
    }
    let Some(r) = last else {
        return Err("generation produced no output".into());
    };
    if a.json {
        let mut obj = json!({
            "prompt_ids": ids,
            "tokens": tokens,
            "logprobs": logprobs,
            "text": text,
            "prompt_tps": r.prompt_tps,
            "generation_tokens": r.generation_tokens,
            "generation_tps": r.generation_tps,
            "peak_memory_bytes": r.peak_memory_bytes,
            "process_peak_rss_bytes": process_peak_rss_bytes(),
            "dtype": m.dtype_name,
            "decoder": decoder.name,
            "graph_fallback": graph_fallback,
            "finish_reason": r.finish_reason.unwrap_or(FinishReason::Length).as_str(),
        });
        if let Some(st) = &spec_stats {
            obj["from_draft"] = json!(from_draft);
            obj["draft_tokens"] = json!(st.drafted);
            obj["accepted_draft_tokens"] = json!(st.accepted);
            obj["verification_passes"] = json!(st.rounds);
        }
        if a.top_logprobs > 0 {
            obj["top_logprobs"] = Value::Array(tops.into_iter().map(Value::Array).collect());
        }
        writeln!(out, "{obj}").ok();
    } else if !a.verbose {
        writeln!(out, "{text}").ok();
    } else {
        writeln!(out).ok();
        writeln!(out, "==========").ok();
        if text.is_empty() {
            writeln!(out, "No text generated for this prompt").ok();
            return Ok(());
        }
        writeln!(
            out,
            "Prompt: {} tokens, {:.3} tokens-per-sec",
            r.prompt_tokens, r.prompt_tps
        )
        .ok();
        writeln!(
            out,
            "Generation: {} tokens, {:.3} tokens-per-sec",
            r.generation_tokens, r.generation_tps
        )
        .ok();
        writeln!(
            out,
            "Peak memory: {:.3} GB",
            r.peak_memory_bytes as f64 / 1e9
        )
        .ok();
        if let Some(st) = &spec_stats {
            writeln!(out, "{}", SpecSource::report(st)).ok();
        }
    }
    Ok(())
}

/// The whole process's peak resident set so far (`VmHWM` of `/proc/self/status`: code,
/// libraries, heap, weights, caches), in bytes; `None` where the system has no such file.
/// `--json` reports it so that a caller sees the peak of a run too short to poll (issue #31's
/// bench takes the larger of it and its own polling).
fn process_peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

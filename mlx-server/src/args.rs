//! `ServeArgs`: the options of `mlx serve`, named as `mlx_lm.server` names them, plus the
//! limits a server exposed to clients needs.

use std::time::Duration;

use clap::Args;

/// Options of `mlx serve` (`mlx_lm.server`'s names where it has the option).
#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    /// The model: a directory with config.json, safetensors and tokenizer files.
    #[arg(long)]
    pub model: Option<String>,

    /// A directory with trained adapters (`adapters.safetensors` + `adapter_config.json`, as
    /// `mlx train` and `mlx_lm.lora` write them), applied to the model as mlx-lm does.
    #[arg(long, value_name = "DIR")]
    pub adapter_path: Option<String>,

    /// Accepted for mlx_lm.server compatibility (nothing is run from the model directory).
    #[arg(long)]
    pub trust_remote_code: bool,

    /// Host to bind. Loopback by default: the server has no TLS.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,

    /// Port to bind (0 picks a free one; the chosen address is logged).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,

    /// Default sampling temperature.
    #[arg(long, default_value_t = 0.0)]
    pub temp: f64,

    /// Default nucleus sampling top-p.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,

    /// Default top-k (0 disables it).
    #[arg(long, default_value_t = 0)]
    pub top_k: i32,

    /// Default min-p (0 disables it).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f64,

    /// Default maximum number of tokens to generate.
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,

    /// The largest `max_tokens` a request may ask for.
    #[arg(long, default_value_t = 8192)]
    pub max_tokens_limit: usize,

    /// Prompt plus generated tokens may not exceed this.
    #[arg(long, default_value_t = 32768)]
    pub max_context: usize,

    /// Sequences decoded together at most (continuous batching).
    #[arg(long, alias = "decode-concurrency", default_value_t = 32)]
    pub max_batch: usize,

    /// Requests waiting for a batch slot at most; more get HTTP 503 with `Retry-After`.
    #[arg(long, default_value_t = 64)]
    pub queue_size: usize,

    /// Step size for prefill processing. Also the engine's unit of fair scheduling: it
    /// alternates one slice of large work (a prefill chunk of at most this many prompt
    /// positions for each request prefilled in it, or embedding inputs of at most this many
    /// tokens together, or one longer input of at most --max-embedding-input-tokens) with one
    /// decode step of the running requests. So a streaming request waits at most one decode
    /// step plus one such slice between two tokens, whatever else arrives.
    #[arg(long, default_value_t = 2048)]
    pub prefill_step_size: usize,

    /// Distinct KV caches kept for prompt-prefix reuse (0 disables reuse).
    #[arg(long, default_value_t = 10)]
    pub prompt_cache_size: usize,

    /// Bytes the prompt cache may hold: a number of bytes, or with mlx_lm.server's units
    /// (`M`/`MB` = 10^6, `G`/`GB` = 10^9, any case; `1.5G` too).
    #[arg(long, default_value_t = 1 << 30, value_parser = size)]
    pub prompt_cache_bytes: usize,

    /// Require `Authorization: Bearer <key>` on every /v1 request.
    #[arg(long, env = "MLX_SERVE_API_KEY")]
    pub api_key: Option<String>,

    /// Largest request body in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body_bytes: usize,

    /// Seconds a request may run in the engine before it fails.
    #[arg(long, default_value_t = 600)]
    pub request_timeout: u64,

    /// JSON object of extra chat-template variables, e.g. '{"enable_thinking":false}'.
    #[arg(long, default_value = "{}")]
    pub chat_template_args: String,

    /// Log level (error, warn, info, debug, trace, off; any case), or mlx_lm.server's names
    /// (DEBUG, INFO, WARNING, ERROR, CRITICAL: WARNING is warn, CRITICAL error).
    #[arg(long, default_value = "info", value_parser = log_level)]
    pub log_level: String,

    /// Prompt tokens of one completion request, or input tokens of one embeddings request
    /// (all inputs together), at most; a larger request gets HTTP 413.
    #[arg(long, default_value_t = 262_144)]
    pub max_request_tokens: usize,

    /// Inputs of one embeddings request at most; more get HTTP 413.
    #[arg(long, default_value_t = 2048)]
    pub max_embedding_inputs: usize,

    /// Tokens of one embeddings input at most; a longer input gets HTTP 413. One input's
    /// forward pass is one slice of the engine's work (it is not cut), so this bounds what it
    /// costs the requests running beside it.
    #[arg(long, default_value_t = 8192)]
    pub max_embedding_input_tokens: usize,

    /// Tokens of prompts and embedding inputs waiting or under way at most, over all requests;
    /// a request that would pass it gets HTTP 429 with Retry-After (one request is always
    /// accepted when nothing is queued).
    #[arg(long, default_value_t = 1 << 20)]
    pub max_queued_tokens: usize,

    /// Seconds a client has to send a request's head (counted from when the connection is
    /// ready for it: opened, or its previous response sent), and as long again for its body;
    /// slower clients are disconnected (a request head) or answered 408 (a body).
    #[arg(long, default_value_t = 15.0, value_parser = seconds)]
    pub header_timeout: f64,

    /// Seconds an idle keep-alive connection (no request in progress, nothing received) is
    /// kept open; --header-timeout closes it first when shorter.
    #[arg(long, default_value_t = 10.0, value_parser = seconds)]
    pub keep_alive_timeout: f64,

    /// Seconds a response may wait on a client that does not read it (its socket full)
    /// before the connection is dropped and its generation cancelled.
    #[arg(long, default_value_t = 30.0, value_parser = seconds)]
    pub write_timeout: f64,

    /// Connections open at once at most. Past it, the connection idle longest (no request
    /// in progress: keep-alive, or a head not yet complete) is closed to make room; when
    /// every connection is busy, new ones are answered 503 with `Retry-After` and closed.
    #[arg(long, default_value_t = 512)]
    pub max_connections: usize,

    /// Seconds running requests get to finish after SIGINT/SIGTERM before they are
    /// cancelled; idle and half-sent connections close at once, a second signal exits at once.
    #[arg(long, default_value_t = 10.0, value_parser = seconds)]
    pub shutdown_timeout: f64,

    /// Comma-separated host names accepted in the `Host` header besides localhost, IP
    /// addresses and the --host name (`*` accepts any; `.example.com` a domain and its
    /// subdomains). Other names are refused (403) against DNS rebinding.
    #[arg(long, value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,

    /// A model to be used for speculative decoding (same vocabulary as --model), as
    /// `mlx_lm.server --draft-model`: requests then speculate and are not batched (each runs
    /// alone, between batches).
    #[arg(long, value_name = "PATH|NAME")]
    pub draft_model: Option<String>,

    /// Number of tokens to draft when using speculative decoding (a request's
    /// `num_draft_tokens` overrides it for a draft model): default 3 with --draft-model
    /// (mlx_lm.server's), 4 with --prompt-lookup-ngram.
    #[arg(long)]
    pub num_draft_tokens: Option<usize>,

    /// Speculate by prompt lookup on the CPU decoder: where it runs the batch, greedy
    /// requests (temperature 0, no penalties, logit bias, grammar, top log-probabilities or
    /// `n` > 1) run alone between batches, drafting from the most context-matching earlier
    /// occurrence of the last N tokens (prompt and output; 1 is best on edits and summaries)
    /// up to the matched length and up to --num-draft-tokens, verified in one
    /// batched pass: the tokens of plain greedy decoding (`mlx generate`'s policy).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=64), conflicts_with = "draft_model")]
    pub prompt_lookup_ngram: Option<u64>,

    // --- Server completeness (issue #36): CORS, n, chat template, KV cache options. ---
    /// Comma-separated origins a browser page may call the API from (CORS), as
    /// mlx_lm.server's `--allowed-origins`: `*` (the default) answers every origin with
    /// `Access-Control-Allow-Origin: *`; otherwise a listed `Origin` is echoed back.
    #[arg(long, value_delimiter = ',', default_value = "*")]
    pub allowed_origins: Vec<String>,

    /// The largest `n` (choices per request) a request may ask for.
    #[arg(long, default_value_t = 8)]
    pub max_n: usize,

    /// A chat template (Jinja source) used instead of the tokenizer's, as mlx_lm.server's
    /// `--chat-template`.
    #[arg(long)]
    pub chat_template: Option<String>,

    /// Accepted for mlx_lm.server compatibility; changes nothing. mlx_lm.server then sets a
    /// tokenizer without a chat template to transformers' `default_chat_template`, which
    /// transformers 5 no longer has (it fails to load such a model); a model with a template
    /// keeps it, as here.
    #[arg(long)]
    pub use_default_chat_template: bool,

    /// Quantize the KV cache to this many bits (mlx-lm's `--kv-bits`). As in
    /// mlx_lm.server, requests are then served one at a time (no batching).
    #[arg(long)]
    pub kv_bits: Option<i32>,

    /// Group size of KV cache quantization.
    #[arg(long, default_value_t = 64)]
    pub kv_group_size: i32,

    /// Token position from which the KV cache is quantized (with --kv-bits); a negative one
    /// is 0, as mlx_lm.server's `offset >= start` reads it.
    #[arg(long, default_value_t = 5000, allow_negative_numbers = true)]
    pub quantized_kv_start: i64,

    /// How --kv-bits quantizes the KV cache: `affine` (mlx-lm's) or `trellis` (2, 3 or 4
    /// bits, trellis-coded keys and values; not in mlx_lm.server).
    #[arg(long, default_value = "affine", value_parser = ["affine", "trellis"])]
    pub kv_mode: String,

    /// A rotating KV cache of this many tokens per layer (for models whose cache mlx-lm
    /// does not fix); requests are then served one at a time (no batching).
    #[arg(long)]
    pub max_kv_size: Option<usize>,

    /// `auto`: on a CUDA build with a GPU, the graph decoder runs the batch's decode steps
    /// where it covers the model (one row of it a sequence; prefill stays on MLX); on the CPU
    /// backend, our multi-threaded SIMD CPU decoder where it covers the model and options
    /// (dense llama-family rows; float weights or MLX affine 2/4/8-bit; not with --kv-bits or
    /// --max-kv-size); else MLX. `mlx`: MLX's own forward, the exact path whose outputs match
    /// mlx_lm.server's; `cpu`, `graph`: that decoder, an error where it does not apply. Their
    /// logits differ from MLX's by float rounding.
    #[arg(long, default_value = "auto", value_parser = ["auto", "mlx", "cpu", "graph"])]
    pub decoder: String,

    /// Worker threads of the CPU decoder (default: all cores).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..4097))]
    pub threads: Option<u64>,
}

/// A positive, finite number of seconds no larger than a year.
fn seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("expected a number of seconds, got {s:?}"))?;
    if v.is_finite() && v > 0.0 && v <= 365.0 * 86400.0 {
        Ok(v)
    } else {
        Err(format!("seconds must be in (0, 31536000], got {s}"))
    }
}

/// `--log-level`: a level name, as the filter reads it (lowercase). mlx_lm.server's `WARNING`
/// and `CRITICAL` are mapped to `warn` and `error`; anything else is refused (the filter would
/// read an unknown word as a target name and log nothing at all).
fn log_level(s: &str) -> Result<String, String> {
    let level = s.trim().to_ascii_lowercase();
    match level.as_str() {
        "off" | "error" | "warn" | "info" | "debug" | "trace" => Ok(level),
        "warning" => Ok("warn".into()),
        "critical" => Ok("error".into()),
        _ => Err(format!(
            "expected one of error, warn, info, debug, trace, off (or mlx_lm.server's DEBUG, \
             INFO, WARNING, ERROR, CRITICAL), got {s:?}"
        )),
    }
}

/// `--prompt-cache-bytes` as mlx_lm.server's `_parse_size` reads it: a decimal number, then
/// an optional unit `M`/`MB` (10^6) or `G`/`GB` (10^9), any case; the bytes are rounded down
/// (exactly, as its `Decimal` does).
fn size(s: &str) -> Result<usize, String> {
    let bad =
        || format!("expected a number of bytes, optionally with a unit M, MB, G or GB, got {s:?}");
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let zeros: u32 = match unit.trim().to_ascii_uppercase().as_str() {
        "" => 0,
        "M" | "MB" => 6,
        "G" | "GB" => 9,
        _ => return Err(bad()),
    };
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(bad());
    }
    // The fraction's first `zeros` digits are whole bytes; the rest is rounded off.
    let frac: String = frac
        .chars()
        .chain(std::iter::repeat('0'))
        .take(zeros as usize)
        .collect();
    let too_large = || format!("{s:?} is too large");
    let whole: usize = if int.is_empty() { Ok(0) } else { int.parse() }.map_err(|_| too_large())?;
    let part: usize = if frac.is_empty() { Ok(0) } else { frac.parse() }.map_err(|_| bad())?;
    whole
        .checked_mul(10usize.pow(zeros))
        .and_then(|b| b.checked_add(part))
        .ok_or_else(too_large)
}

impl ServeArgs {
    /// `--num-draft-tokens`, or its default: 4 for prompt lookup
    /// ([`mlx_engine::cpu_spec::LOOKUP_DRAFTS`]), 3 otherwise (mlx_lm.server's).
    pub fn num_draft_tokens(&self) -> usize {
        match self.num_draft_tokens {
            Some(n) => n,
            None if self.prompt_lookup_ngram.is_some() => mlx_engine::cpu_spec::LOOKUP_DRAFTS,
            None => 3,
        }
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout)
    }

    /// The connection limits, as durations (the parser bounded the seconds).
    pub(crate) fn conn_limits(&self) -> crate::conn::Limits {
        let d = |s: f64| Duration::try_from_secs_f64(s).unwrap_or(Duration::from_secs(1));
        crate::conn::Limits {
            header_timeout: d(self.header_timeout),
            keep_alive_timeout: d(self.keep_alive_timeout),
            write_timeout: d(self.write_timeout),
            max_connections: self.max_connections,
            shutdown_timeout: d(self.shutdown_timeout),
        }
    }
}

//! Parsing and validating request bodies at the edge: every field is checked for its type and
//! range here, with an error naming it, before anything reaches the engine.

use std::time::Duration;

use mlx_engine::batch::BatchRequest;
use mlx_engine::chat_template::ChatTemplateOptions;
use mlx_engine::sample::{ProcessorSettings, SamplerSettings};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::state::AppState;

/// Which endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

/// A validated request, tokenized.
#[derive(Clone, Debug)]
pub struct Parsed {
    pub kind: Kind,
    pub model: String,
    pub stream: bool,
    pub include_usage: bool,
    pub logprobs: bool,
    /// Choices to generate (`n`).
    pub n: usize,
    /// Tools were given (tool calls are parsed from the reply).
    pub has_tools: bool,
    pub request: BatchRequest,
}

/// HTTP 413 for a request over one of this server's size limits, naming the field.
pub(crate) fn too_large(param: &str, message: String) -> ApiError {
    let mut e = ApiError::invalid(param, message);
    e.status = axum::http::StatusCode::PAYLOAD_TOO_LARGE;
    e.code = Some("request_too_large");
    e
}

fn field<'a>(body: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    body.get(name).filter(|v| !v.is_null())
}

fn number(body: &Map<String, Value>, name: &str) -> Result<Option<f64>, ApiError> {
    match field(body, name) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite())
            .map(Some)
            .ok_or_else(|| ApiError::invalid(name, format!("`{name}` must be a number, got {v}"))),
    }
}

fn integer(body: &Map<String, Value>, name: &str) -> Result<Option<i64>, ApiError> {
    match field(body, name) {
        None => Ok(None),
        Some(v) => v.as_i64().map(Some).ok_or_else(|| {
            ApiError::invalid(name, format!("`{name}` must be an integer, got {v}"))
        }),
    }
}

fn boolean(body: &Map<String, Value>, name: &str) -> Result<Option<bool>, ApiError> {
    match field(body, name) {
        None => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| ApiError::invalid(name, format!("`{name}` must be a boolean, got {v}"))),
    }
}

fn in_range(name: &str, v: f64, lo: f64, hi: f64) -> Result<f64, ApiError> {
    if (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(ApiError::invalid(
            name,
            format!("`{name}` must be in [{lo}, {hi}], got {v}"),
        ))
    }
}

fn context_size(body: &Map<String, Value>, name: &str) -> Result<Option<usize>, ApiError> {
    match integer(body, name)? {
        None => Ok(None),
        Some(n) if (1..=1 << 20).contains(&n) => Ok(Some(n as usize)),
        Some(n) => Err(ApiError::invalid(
            name,
            format!("`{name}` must be a positive integer, got {n}"),
        )),
    }
}

/// `stop`: a string or a list of at most 4 strings.
fn stop_strings(body: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let bad = || ApiError::invalid("stop", "`stop` must be a string or a list of strings");
    match field(body, "stop") {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => {
            if items.len() > 16 {
                return Err(ApiError::invalid(
                    "stop",
                    "`stop` may hold at most 16 strings",
                ));
            }
            items
                .iter()
                .map(|v| v.as_str().map(str::to_string).ok_or_else(bad))
                .collect()
        }
        Some(_) => Err(bad()),
    }
}

/// `logit_bias`: `{"token id": bias}`, ids inside the vocabulary, biases in [-100, 100].
fn logit_bias(body: &Map<String, Value>, vocab: usize) -> Result<Vec<(i32, f32)>, ApiError> {
    let Some(v) = field(body, "logit_bias") else {
        return Ok(Vec::new());
    };
    let map = v
        .as_object()
        .ok_or_else(|| ApiError::invalid("logit_bias", "`logit_bias` must be an object"))?;
    map.iter()
        .map(|(k, v)| {
            let id: usize = k.trim().parse().map_err(|_| {
                ApiError::invalid(
                    "logit_bias",
                    format!("`logit_bias` key {k:?} is not a token id"),
                )
            })?;
            if id >= vocab {
                return Err(ApiError::invalid(
                    "logit_bias",
                    format!("`logit_bias` token id {id} is outside the vocabulary of {vocab}"),
                ));
            }
            let b = v.as_f64().ok_or_else(|| {
                ApiError::invalid("logit_bias", format!("`logit_bias[{k}]` must be a number"))
            })?;
            let b = in_range("logit_bias", b, -100.0, 100.0)?;
            Ok((id as i32, b as f32))
        })
        .collect()
}

/// A message's content as the chat template gets it: a string (text parts joined, as
/// `mlx_lm.server`'s `process_message_content` does) or null.
fn normalize_messages(messages: &Value) -> Result<Vec<Value>, ApiError> {
    let list = messages
        .as_array()
        .ok_or_else(|| ApiError::invalid("messages", "`messages` must be a list of messages"))?;
    if list.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must not be empty",
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let mut m = m.as_object().cloned().ok_or_else(|| {
                ApiError::invalid("messages", format!("`messages[{i}]` must be an object"))
            })?;
            match m.get("role") {
                Some(Value::String(_)) => {}
                _ => {
                    return Err(ApiError::invalid(
                        "messages",
                        format!("`messages[{i}].role` must be a string"),
                    ))
                }
            }
            match m.get("content") {
                None | Some(Value::Null) | Some(Value::String(_)) => {}
                Some(Value::Array(parts)) => {
                    let mut text = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        match (
                            p.get("type").and_then(Value::as_str),
                            p.get("text").and_then(Value::as_str),
                        ) {
                            (Some("text"), Some(t)) => text.push_str(t),
                            _ => {
                                return Err(ApiError::invalid(
                                    "messages",
                                    format!(
                                        "`messages[{i}].content[{j}]`: only text parts \
                                         ({{\"type\": \"text\", \"text\": ...}}) are supported"
                                    ),
                                ))
                            }
                        }
                    }
                    m.insert("content".into(), Value::String(text));
                }
                Some(_) => {
                    return Err(ApiError::invalid(
                        "messages",
                        format!("`messages[{i}].content` must be a string or a list of parts"),
                    ))
                }
            }
            // Tool-call arguments arrive as JSON strings; templates expect objects.
            if let Some(Value::Array(calls)) = m.get_mut("tool_calls") {
                for c in calls.iter_mut() {
                    if let Some(f) = c.get_mut("function") {
                        if let Some(Value::String(a)) = f.get("arguments") {
                            if let Ok(parsed) = serde_json::from_str::<Value>(a) {
                                f["arguments"] = parsed;
                            }
                        }
                    }
                }
            }
            Ok(Value::Object(m))
        })
        .collect()
}

/// Fields this server reads (or, for `response_format` and `tool_choice`, leaves to the
/// structured-output code), per endpoint, and harmless OpenAI metadata it accepts and
/// ignores.
const KNOWN: &[&str] = &[
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "stream",
    "stream_options",
    "stop",
    "seed",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "repetition_context_size",
    "presence_context_size",
    "frequency_context_size",
    "xtc_probability",
    "xtc_threshold",
    "response_format",
    "tool_choice",
    "tools",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "messages",
    "prompt",
    "user",
    "store",
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
];

/// OpenAI request fields this server does not implement: a request that sets one (to
/// anything but its default) is refused with a 400 naming it, rather than answered as if
/// it had not been asked.
const UNSUPPORTED: &[&str] = &[
    "audio",
    "modalities",
    "prediction",
    "functions",
    "function_call",
    "web_search_options",
    "reasoning_effort",
    "verbosity",
    "suffix",
    "echo",
    "best_of",
];

/// Refuses a set unsupported OpenAI field (400 naming it); logs other unknown fields once per
/// name and ignores them (extensions of other servers).
fn check_fields(state: &AppState, kind: Kind, body: &Map<String, Value>) -> Result<(), ApiError> {
    for (name, value) in body {
        if KNOWN.contains(&name.as_str()) {
            continue;
        }
        if UNSUPPORTED.contains(&name.as_str()) {
            let default = match (name.as_str(), value) {
                (_, Value::Null) => true,
                ("modalities", Value::Array(m)) => m.iter().all(|x| x == "text"),
                ("echo", Value::Bool(false)) => true,
                ("best_of", Value::Number(b)) => b.as_u64() == Some(1),
                ("functions", Value::Array(f)) => f.is_empty(),
                ("suffix", Value::String(t)) => t.is_empty(),
                _ => false,
            };
            if default {
                continue;
            }
            let endpoint = match kind {
                Kind::Chat => "/v1/chat/completions",
                Kind::Completion => "/v1/completions",
            };
            let mut e = ApiError::invalid(
                name,
                format!("`{name}` is not supported by this server's {endpoint}"),
            );
            e.code = Some("unsupported_parameter");
            return Err(e);
        }
        state.note_unknown_field(name);
    }
    Ok(())
}

/// Parses and validates a body of `/v1/chat/completions` or `/v1/completions`.
pub fn parse(state: &AppState, kind: Kind, bytes: &[u8]) -> Result<Parsed, ApiError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("The request body is not valid JSON: {e}")))?;
    let body = value
        .as_object()
        .ok_or_else(|| ApiError::bad_request("The request body must be a JSON object"))?;
    let args = &state.args;

    let model = match field(body, "model") {
        None => state.model_id.clone(),
        Some(Value::String(m)) => {
            if !state.knows_model(m) {
                return Err(ApiError::model_not_found(m));
            }
            m.clone()
        }
        Some(v) => {
            return Err(ApiError::invalid(
                "model",
                format!("`model` must be a string, got {v}"),
            ))
        }
    };

    check_fields(state, kind, body)?;
    let n = integer(body, "n")?.unwrap_or(1);
    if n < 1 || n as u64 > args.max_n as u64 {
        return Err(ApiError::invalid(
            "n",
            format!("`n` must be in [1, {}] (--max-n), got {n}", args.max_n),
        ));
    }
    let n = n as usize;
    if n > 1 && (args.kv_bits.is_some() || args.max_kv_size.is_some()) {
        return Err(ApiError::invalid(
            "n",
            "`n` > 1 needs batching, which --kv-bits and --max-kv-size turn off",
        ));
    }

    let max_tokens = match integer(body, "max_completion_tokens")? {
        Some(m) => Some(m),
        None => integer(body, "max_tokens")?,
    };
    let max_tokens = match max_tokens {
        None => args.max_tokens.min(args.max_tokens_limit),
        Some(m) if m < 1 => {
            return Err(ApiError::invalid(
                "max_tokens",
                format!("`max_tokens` must be at least 1, got {m}"),
            ))
        }
        Some(m) if m as u64 > args.max_tokens_limit as u64 => {
            return Err(ApiError::invalid(
                "max_tokens",
                format!(
                    "`max_tokens` is {m}, above this server's limit of {}",
                    args.max_tokens_limit
                ),
            ))
        }
        Some(m) => m as usize,
    };

    let temp = in_range(
        "temperature",
        number(body, "temperature")?.unwrap_or(args.temp),
        0.0,
        100.0,
    )?;
    let top_p = in_range(
        "top_p",
        number(body, "top_p")?.unwrap_or(args.top_p),
        0.0,
        1.0,
    )?;
    let min_p = in_range(
        "min_p",
        number(body, "min_p")?.unwrap_or(args.min_p),
        0.0,
        1.0,
    )?;
    let vocab = state.engine.vocab_size();
    let top_k = integer(body, "top_k")?.unwrap_or(i64::from(args.top_k));
    if top_k < 0 || top_k >= vocab as i64 {
        return Err(ApiError::invalid(
            "top_k",
            format!("`top_k` must be in [0, {vocab}), got {top_k}"),
        ));
    }
    let xtc_probability = in_range(
        "xtc_probability",
        number(body, "xtc_probability")?.unwrap_or(0.0),
        0.0,
        1.0,
    )?;
    let xtc_threshold = in_range(
        "xtc_threshold",
        number(body, "xtc_threshold")?.unwrap_or(0.1),
        0.0,
        0.5,
    )?;
    let repetition_penalty = number(body, "repetition_penalty")?
        .map(|p| in_range("repetition_penalty", p, 0.0, 100.0))
        .transpose()?;
    let presence_penalty = number(body, "presence_penalty")?
        .map(|p| in_range("presence_penalty", p, -2.0, 2.0))
        .transpose()?;
    let frequency_penalty = number(body, "frequency_penalty")?
        .map(|p| in_range("frequency_penalty", p, -2.0, 2.0))
        .transpose()?;
    let processors = ProcessorSettings {
        logit_bias: logit_bias(body, vocab)?,
        repetition_penalty,
        repetition_context_size: context_size(body, "repetition_context_size")?,
        presence_penalty,
        presence_context_size: context_size(body, "presence_context_size")?,
        frequency_penalty,
        frequency_context_size: context_size(body, "frequency_context_size")?,
    };

    let seed = match integer(body, "seed")? {
        None => None,
        Some(s) if s >= 0 => Some(s as u64),
        Some(s) => {
            return Err(ApiError::invalid(
                "seed",
                format!("`seed` must be non-negative, got {s}"),
            ))
        }
    };

    // mlx_lm.server: `num_draft_tokens` (default --num-draft-tokens) and `draft_model`
    // ("default_model": --draft-model). Speculation needs the server's draft model.
    let num_draft_tokens = match integer(body, "num_draft_tokens")? {
        None => args.num_draft_tokens(),
        Some(n) if (0..=64).contains(&n) => n as usize,
        Some(n) => {
            return Err(ApiError::invalid(
                "num_draft_tokens",
                format!("`num_draft_tokens` must be in [0, 64], got {n}"),
            ))
        }
    };
    match field(body, "draft_model") {
        None => {}
        Some(Value::String(d))
            if d == "default_model" || args.draft_model.as_deref() == Some(d.as_str()) => {}
        Some(Value::String(d)) => {
            return Err(ApiError::invalid(
                "draft_model",
                match &args.draft_model {
                    Some(own) => format!(
                        "`draft_model` {d:?}: this server drafts only with its --draft-model \
                         ({own:?}, or \"default_model\")"
                    ),
                    None => format!(
                        "`draft_model` {d:?}: this server was started without --draft-model"
                    ),
                },
            ))
        }
        Some(v) => {
            return Err(ApiError::invalid(
                "draft_model",
                format!("`draft_model` must be a string, got {v}"),
            ))
        }
    }
    let num_draft_tokens = args.draft_model.is_some().then_some(num_draft_tokens);

    // Chat: `logprobs` is a boolean and `top_logprobs` a count; completions: `logprobs` is the
    // count.
    let (logprobs, top_logprobs) = match kind {
        Kind::Chat => {
            let lp = boolean(body, "logprobs")?.unwrap_or(false);
            let top = integer(body, "top_logprobs")?.unwrap_or(0);
            (lp, top)
        }
        // `logprobs: N` (the legacy API: N alternatives per token), or mlx_lm.server's
        // `logprobs: true` with `top_logprobs: N`.
        Kind::Completion => match field(body, "logprobs") {
            None => (false, 0),
            Some(Value::Bool(b)) => (
                *b,
                if *b {
                    integer(body, "top_logprobs")?.unwrap_or(0)
                } else {
                    0
                },
            ),
            Some(_) => {
                let top = integer(body, "logprobs")?.unwrap_or(0);
                if top < 0 {
                    return Err(ApiError::invalid(
                        "logprobs",
                        format!("`logprobs` must be a boolean or a count in [0, 20], got {top}"),
                    ));
                }
                (true, top)
            }
        },
    };
    if !(0..=20).contains(&top_logprobs) {
        return Err(ApiError::invalid(
            "top_logprobs",
            format!("`top_logprobs` must be in [0, 20], got {top_logprobs}"),
        ));
    }

    let stream = boolean(body, "stream")?.unwrap_or(false);
    let include_usage = match field(body, "stream_options") {
        None => false,
        Some(Value::Object(o)) => boolean(o, "include_usage")?.unwrap_or(false),
        Some(_) => {
            return Err(ApiError::invalid(
                "stream_options",
                "`stream_options` must be an object",
            ))
        }
    };

    let tokenizer = state.engine.tokenizer();
    let mut has_tools = false;
    let mut request_tools: Option<Vec<Value>> = None;
    let prompt = match kind {
        Kind::Chat => {
            let messages = normalize_messages(
                field(body, "messages")
                    .ok_or_else(|| ApiError::invalid("messages", "`messages` is required"))?,
            )?;
            let tools = match field(body, "tools") {
                None => None,
                Some(Value::Array(t)) if t.is_empty() => None,
                Some(Value::Array(t)) => Some(t.clone()),
                Some(_) => return Err(ApiError::invalid("tools", "`tools` must be a list")),
            };
            has_tools = tools.is_some();
            request_tools.clone_from(&tools);
            if !tokenizer.has_chat_template() {
                return Err(ApiError::bad_request(
                    "This model's tokenizer has no chat template: use /v1/completions",
                ));
            }
            let mut kwargs = state.template_args.clone();
            match field(body, "chat_template_kwargs") {
                None => {}
                Some(Value::Object(o)) => kwargs.extend(o.clone()),
                Some(_) => {
                    return Err(ApiError::invalid(
                        "chat_template_kwargs",
                        "`chat_template_kwargs` must be an object",
                    ))
                }
            }
            let opts = ChatTemplateOptions {
                add_generation_prompt: true,
                tools,
                kwargs,
                ..ChatTemplateOptions::default()
            };
            tokenizer
                .apply_chat_template_ids(&messages, &opts)
                .map_err(|e| {
                    ApiError::invalid("messages", format!("rendering the chat template: {e}"))
                })?
        }
        Kind::Completion => {
            let text = match field(body, "prompt") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
                    a[0].as_str().unwrap_or_default().to_string()
                }
                Some(_) => {
                    return Err(ApiError::invalid(
                        "prompt",
                        "`prompt` must be a string (batches of prompts are not supported)",
                    ))
                }
                None => return Err(ApiError::invalid("prompt", "`prompt` is required")),
            };
            tokenizer
                .encode(&text, true)
                .map_err(|e| ApiError::invalid("prompt", format!("tokenizing the prompt: {e}")))?
        }
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid(
            "prompt",
            "the prompt encodes to no tokens",
        ));
    }
    if prompt.len() > args.max_request_tokens {
        let param = if kind == Kind::Chat {
            "messages"
        } else {
            "prompt"
        };
        return Err(too_large(
            param,
            format!(
                "the prompt has {} tokens, more than this server's limit of {} tokens per \
                 request (--max-request-tokens)",
                prompt.len(),
                args.max_request_tokens
            ),
        ));
    }
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::bad_request(format!(
            "the prompt has token id {bad}, outside the model's vocabulary of {vocab}"
        )));
    }
    if prompt.len() + max_tokens > state.max_context {
        return Err(ApiError::context_length(
            state.max_context,
            state.model_context == Some(state.max_context),
            prompt.len(),
            max_tokens,
            kind == Kind::Chat,
        ));
    }

    // mlx_lm.server: XTC never removes the newline or EOS tokens.
    let xtc_special_tokens: Vec<i32> = if xtc_probability > 0.0 {
        tokenizer
            .encode("\n", false)
            .unwrap_or_default()
            .into_iter()
            .chain(tokenizer.eos_token_ids().iter().copied())
            .map(|t| t as i32)
            .collect()
    } else {
        Vec::new()
    };

    let grammar =
        crate::structured::grammar(state, kind == Kind::Chat, body, request_tools.as_deref())?;

    Ok(Parsed {
        kind,
        model,
        stream,
        include_usage,
        logprobs,
        n,
        has_tools,
        request: BatchRequest {
            prompt,
            max_tokens,
            sampler: SamplerSettings {
                temp,
                top_p,
                min_p,
                top_k: top_k as i32,
                xtc_probability,
                xtc_threshold,
                xtc_special_tokens,
                ..SamplerSettings::default()
            },
            processors,
            stop_strings: stop_strings(body)?,
            logprobs,
            top_logprobs: top_logprobs as usize,
            seed,
            timeout: Some(Duration::from_secs(args.request_timeout)),
            num_draft_tokens,
            grammar,
        },
    })
}

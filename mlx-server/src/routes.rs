//! The HTTP API: handlers, response bodies (shaped as the OpenAI API shapes them) and
//! server-sent event streams.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream, StreamExt};
use mlx_engine::batch::{BatchEvent, EventSink};
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::error::ApiError;
use crate::guard::{accept, authorize};
use crate::request::{parse, Kind, Parsed};
use crate::state::{unix_now, Shared};
use crate::tools::{self, ReplyText, State as ReplyState, ToolFormat};

pub fn router(state: Shared) -> Router {
    let limit = state.args.max_body_bytes;
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/", get(chat_page))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(crate::embeddings::embeddings))
        .fallback(fallback)
        .layer(axum::middleware::map_response(retry_after))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// Liveness, with the engine's load (requests decoding, waiting, decode steps so far).
async fn health(State(state): State<Shared>) -> Json<Value> {
    let s = state.engine.stats();
    Json(json!({
        "status": "ok",
        "decoder": state.engine.decoder(),
        "active": s.active.load(Ordering::Relaxed),
        "queued": s.queued.load(Ordering::Relaxed),
        "queued_tokens": s.queued_tokens.load(Ordering::Relaxed),
        "decode_steps": s.decode_steps.load(Ordering::Relaxed),
        "max_batch_seen": s.max_batch_seen.load(Ordering::Relaxed),
        "batched_prefills": s.batched_prefills.load(Ordering::Relaxed),
        "reused_tokens": s.reused_tokens.load(Ordering::Relaxed),
    }))
}

/// `/metrics`: Prometheus text format 0.0.4.
async fn metrics(State(state): State<Shared>) -> Response {
    let body = state.metrics.render(state.engine.stats());
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// The chat page: one static file, no external resources.
async fn chat_page() -> Response {
    (
        [
            (axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                axum::http::header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'",
            ),
        ],
        include_str!("chat.html"),
    )
        .into_response()
}

/// Every 429 (a full queue, too many queued tokens) tells the client when to come back.
async fn retry_after(mut response: Response) -> Response {
    if response.status() == StatusCode::TOO_MANY_REQUESTS {
        response
            .headers_mut()
            .entry(axum::http::header::RETRY_AFTER)
            .or_insert(axum::http::HeaderValue::from_static("1"));
    }
    response
}

async fn fallback(uri: Uri) -> ApiError {
    ApiError::not_found(uri.path())
}

async fn models(State(state): State<Shared>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers)?;
    Ok(Json(json!({
        "object": "list",
        "data": [{
            "id": state.model_id,
            "object": "model",
            "created": state.created,
            "owned_by": "mlx-rs",
        }],
    })))
}

async fn chat(
    State(state): State<Shared>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(state, headers, body, Kind::Chat).await
}

async fn completions(
    State(state): State<Shared>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(state, headers, body, Kind::Completion).await
}

/// Events from the engine into a tokio channel; a dropped receiver (client gone) cancels.
struct Sink(UnboundedSender<BatchEvent>);

impl EventSink for Sink {
    fn send(&mut self, event: BatchEvent) -> bool {
        self.0.send(event).is_ok()
    }
    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

async fn handle(
    state: Shared,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    kind: Kind,
) -> Response {
    let start = Instant::now();
    let route = match kind {
        Kind::Chat => "/v1/chat/completions",
        Kind::Completion => "/v1/completions",
    };
    let result = async {
        let bytes = accept(&state, &headers, body)?;
        // Tokenizing (chat template, encoding) runs off the async workers.
        let st = state.clone();
        let parsed = tokio::task::spawn_blocking(move || parse(&st, kind, &bytes))
            .await
            .map_err(|e| ApiError::server(format!("parsing the request: {e}")))??;
        let mut rxs = Vec::with_capacity(parsed.n);
        let mut sinks: Vec<Box<dyn EventSink>> = Vec::with_capacity(parsed.n);
        for _ in 0..parsed.n {
            let (tx, rx) = unbounded_channel();
            rxs.push(rx);
            sinks.push(Box::new(Sink(tx)));
        }
        if state.engine.uses_cpu_decoder()
            && parsed.n == 1
            && parsed.request.num_draft_tokens.is_some()
            && parsed.request.grammar.is_none()
        {
            tracing::info!(
                route,
                "request runs on the MLX path, alone: speculative decoding (--draft-model) \
                 verifies drafts there"
            );
        }
        let submitted = if parsed.n == 1 {
            let sink = sinks.pop().ok_or_else(|| ApiError::server("no choice"))?;
            state.engine.submit(parsed.request.clone(), sink)
        } else {
            state.engine.submit_n(parsed.request.clone(), sinks)
        };
        submitted.map_err(ApiError::refused)?;
        Ok::<_, ApiError>((parsed, rxs))
    }
    .await;
    let (parsed, rxs) = match result {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!(route, status = e.status.as_u16(), error = %e.message, "request rejected");
            return e.into_response();
        }
    };
    let id = state.next_id(match parsed.kind {
        Kind::Chat => "chatcmpl",
        Kind::Completion => "cmpl",
    });
    let ctxs: Vec<Ctx> = rxs
        .into_iter()
        .enumerate()
        .map(|(i, rx)| {
            Ctx::new(
                state.clone(),
                parsed.clone(),
                rx,
                route,
                start,
                id.clone(),
                i,
            )
        })
        .collect();
    if parsed.stream {
        let stream = sse_streams(ctxs);
        Sse::new(stream)
            .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
            .into_response()
    } else {
        match collect_all(ctxs).await {
            Ok(v) => Json(v).into_response(),
            Err(e) => e.into_response(),
        }
    }
}

/// A non-streaming request: every choice collected, one response.
async fn collect_all(ctxs: Vec<Ctx>) -> Result<Value, ApiError> {
    let results = futures_util::future::join_all(ctxs.into_iter().map(Ctx::collect)).await;
    let mut choices = Vec::with_capacity(results.len());
    let mut head: Option<Value> = None;
    let mut completion = 0usize;
    for r in results {
        let (choice, response) = r?;
        choices.push(choice);
        completion += response["usage"]["completion_tokens"].as_u64().unwrap_or(0) as usize;
        head.get_or_insert(response);
    }
    let mut response = head.ok_or_else(|| ApiError::server("no choice"))?;
    let prompt = response["usage"]["prompt_tokens"].as_u64().unwrap_or(0) as usize;
    response["usage"]["completion_tokens"] = json!(completion);
    response["usage"]["total_tokens"] = json!(prompt + completion);
    response["choices"] = Value::Array(choices);
    Ok(response)
}

/// One request in flight: what it accumulated so far.
struct Ctx {
    state: Shared,
    parsed: Parsed,
    rx: UnboundedReceiver<BatchEvent>,
    route: &'static str,
    start: Instant,
    id: String,
    created: u64,
    /// The choice's `index` (`n` > 1).
    index: usize,
    text: String,
    tokens: Vec<u32>,
    logprobs: Vec<Option<f32>>,
    top: Vec<Vec<(u32, f32)>>,
    /// Each token's text and its character offset in the reply (with `logprobs`).
    token_texts: Vec<String>,
    text_offsets: Vec<usize>,
    last_token: Option<Instant>,
    prompt_tokens: usize,
    cached_tokens: usize,
    completion_tokens: usize,
    first_token: Option<Duration>,
    /// Tool-call parsing of this reply, when the template defines a format that applies.
    tools: Option<ToolState>,
}

/// A reply read for reasoning and tool calls (see [`crate::tools`]).
struct ToolState {
    format: ToolFormat,
    text: ReplyText,
    /// Reasoning not yet sent (streaming) or all of it.
    reasoning: String,
    /// Content not yet sent (streaming) or all content (not streaming).
    content: String,
    /// Raw text of calls not yet sent.
    calls: Vec<String>,
    made_call: bool,
    /// Calls formatted so far (their ids and stream indices).
    formatted: usize,
}

impl Ctx {
    fn new(
        state: Shared,
        parsed: Parsed,
        rx: UnboundedReceiver<BatchEvent>,
        route: &'static str,
        start: Instant,
        id: String,
        index: usize,
    ) -> Self {
        let prompt_tokens = parsed.request.prompt.len();
        // mlx_lm.server reads `<think>` blocks and `<tool_call>` markers in every chat reply
        // of a model whose tokenizer and template define them; Llama 3's bare JSON only when
        // tools were given. A prompt that ends inside a think block starts in reasoning.
        let thinking = state.engine.tokenizer().thinking();
        let think = thinking.map(|t| (t.start.clone(), t.end.clone()));
        let prompt = &parsed.request.prompt;
        let initial = match thinking {
            Some(t) if rfind(prompt, &t.start_ids) > rfind(prompt, &t.end_ids) => {
                ReplyState::Reasoning
            }
            _ => ReplyState::Normal,
        };
        let markers = state.tool_format == Some(ToolFormat::Markers);
        let format = match (parsed.kind, state.tool_format) {
            (Kind::Chat, Some(ToolFormat::Llama3Json)) if parsed.has_tools => {
                Some(ToolFormat::Llama3Json)
            }
            (Kind::Chat, _) if markers || think.is_some() => Some(ToolFormat::Markers),
            _ => None,
        };
        let tools = format.map(|format| ToolState {
            format,
            text: ReplyText::new(think, markers, initial),
            reasoning: String::new(),
            content: String::new(),
            calls: Vec::new(),
            made_call: false,
            formatted: 0,
        });
        Ctx {
            state,
            parsed,
            rx,
            route,
            start,
            id,
            created: unix_now(),
            index,
            text: String::new(),
            token_texts: Vec::new(),
            text_offsets: Vec::new(),
            last_token: None,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            top: Vec::new(),
            prompt_tokens,
            cached_tokens: 0,
            completion_tokens: 0,
            first_token: None,
            tools,
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.parsed.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn usage(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }

    fn token_text(&self, id: u32) -> String {
        self.state
            .engine
            .tokenizer()
            .decode(&[id], false)
            .unwrap_or_default()
    }

    /// Log-probabilities of tokens `from..` in the API's shape for this endpoint.
    fn logprobs_value(&self, from: usize) -> Value {
        if !self.parsed.logprobs {
            return Value::Null;
        }
        let range = from..self.tokens.len();
        match self.parsed.kind {
            Kind::Chat => {
                let entry = |id: u32, lp: f32| {
                    let t = self.token_text(id);
                    json!({"token": t, "logprob": lp, "bytes": t.as_bytes()})
                };
                let content: Vec<Value> = range
                    .map(|i| {
                        let mut e = json!({
                            "token": self.token_texts[i],
                            "logprob": self.logprobs[i].unwrap_or(f32::NAN),
                            "bytes": self.token_texts[i].as_bytes(),
                        });
                        e["top_logprobs"] = Value::Array(
                            self.top[i].iter().map(|&(id, lp)| entry(id, lp)).collect(),
                        );
                        e
                    })
                    .collect();
                json!({"content": content})
            }
            // The legacy shape: parallel lists, `top_logprobs` a `{token: logprob}` object per
            // token (null without alternatives), `text_offset` each token's character offset
            // in the reply.
            Kind::Completion => {
                let tokens = &self.token_texts[range.clone()];
                let lps: Vec<Option<f32>> = range.clone().map(|i| self.logprobs[i]).collect();
                let tops: Value = if self.parsed.request.top_logprobs == 0 {
                    Value::Null
                } else {
                    range
                        .clone()
                        .map(|i| {
                            Value::Object(
                                self.top[i]
                                    .iter()
                                    .map(|&(id, lp)| (self.token_text(id), json!(lp)))
                                    .collect(),
                            )
                        })
                        .collect()
                };
                let offsets = &self.text_offsets[range];
                json!({
                    "tokens": tokens,
                    "token_logprobs": lps,
                    "top_logprobs": tops,
                    "text_offset": offsets,
                })
            }
        }
    }

    /// Applies an engine event; returns the text it adds, or the end of the request.
    fn apply(&mut self, ev: BatchEvent) -> Step {
        match ev {
            BatchEvent::Started {
                prompt_tokens,
                cached_tokens,
            } => {
                self.prompt_tokens = prompt_tokens;
                self.cached_tokens = cached_tokens;
                Step::Text(String::new())
            }
            BatchEvent::Token {
                token,
                text,
                logprob,
                top_logprobs,
            } => {
                let now = Instant::now();
                match self.last_token {
                    None => {
                        let ttft = self.start.elapsed();
                        self.first_token = Some(ttft);
                        // Once per request (its first choice).
                        if self.index == 0 {
                            self.state.metrics.ttft.observe(ttft);
                        }
                    }
                    Some(prev) => self.state.metrics.itl.observe(now - prev),
                }
                self.last_token = Some(now);
                if self.parsed.logprobs {
                    let t = self.token_text(token);
                    let offset = match (self.text_offsets.last(), self.token_texts.last()) {
                        (Some(o), Some(prev)) => o + prev.chars().count(),
                        _ => 0,
                    };
                    self.text_offsets.push(offset);
                    self.token_texts.push(t);
                }
                self.tokens.push(token);
                self.logprobs.push(logprob);
                self.top.push(top_logprobs);
                self.completion_tokens += 1;
                self.text.push_str(&text);
                Step::Text(text)
            }
            BatchEvent::Done {
                text,
                finish_reason,
                prompt_tokens,
                completion_tokens,
            } => {
                self.prompt_tokens = prompt_tokens;
                self.completion_tokens = completion_tokens;
                self.text.push_str(&text);
                Step::Done(text, finish_reason.as_str())
            }
            BatchEvent::Error(e) => Step::Failed(ApiError::server(e)),
        }
    }

    fn log(&self, status: u16, finish: &str) {
        if status == 200 {
            self.state.metrics.add_tokens(
                if self.index == 0 {
                    self.prompt_tokens
                } else {
                    0
                },
                self.completion_tokens,
            );
        }
        tracing::info!(
            route = self.route,
            id = %self.id,
            choice = self.index,
            status,
            stream = self.parsed.stream,
            prompt_tokens = self.prompt_tokens,
            cached_tokens = self.cached_tokens,
            completion_tokens = self.completion_tokens,
            finish,
            ttft_ms = self.first_token.map(|d| d.as_millis() as u64),
            total_ms = self.start.elapsed().as_millis() as u64,
            "request"
        );
    }

    /// A non-streaming choice: waits for its end; returns the choice and the whole response
    /// as it would be for this choice alone.
    async fn collect(mut self) -> Result<(Value, Value), ApiError> {
        let finish = loop {
            let Some(ev) = self.rx.recv().await else {
                return Err(ApiError::server("the engine dropped the request"));
            };
            match self.apply(ev) {
                Step::Text(_) => {}
                Step::Done(_, reason) => break reason,
                Step::Failed(e) => {
                    self.log(e.status.as_u16(), "error");
                    return Err(e);
                }
            }
        };
        let logprobs = self.logprobs_value(0);
        let choice = match self.parsed.kind {
            Kind::Chat => {
                let (message, finish) = self.message(finish);
                self.log(200, finish);
                json!({"index": self.index, "message": message, "logprobs": logprobs, "finish_reason": finish})
            }
            Kind::Completion => {
                self.log(200, finish);
                json!({
                    "index": self.index, "text": self.text, "logprobs": logprobs,
                    "finish_reason": finish,
                })
            }
        };
        let response = json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.parsed.model,
            "system_fingerprint": fingerprint(),
            "choices": [choice.clone()],
            "usage": self.usage(),
        });
        Ok((choice, response))
    }

    /// Feeds reply text to the tool parser (Markers: as it comes; Llama 3: all at the end).
    fn tool_feed(&mut self, text: &str) {
        if let Some(t) = &mut self.tools {
            match t.format {
                ToolFormat::Markers => {
                    let split = t.text.push(text);
                    t.content.push_str(&split.content);
                    t.reasoning.push_str(&split.reasoning);
                    t.made_call |= !split.calls.is_empty();
                    t.calls.extend(split.calls);
                }
                ToolFormat::Llama3Json => t.content.push_str(text),
            }
        }
    }

    /// The end of the reply for the tool parser; returns the finish reason, `tool_calls` when
    /// the reply stopped after a call (mlx_lm.server's rule).
    fn tool_end(&mut self, reason: &'static str) -> &'static str {
        let Some(t) = &mut self.tools else {
            return reason;
        };
        match t.format {
            ToolFormat::Markers => {
                let split = t.text.finish(reason == "length");
                t.content.push_str(&split.content);
                t.reasoning.push_str(&split.reasoning);
                t.made_call |= !split.calls.is_empty();
                t.calls.extend(split.calls);
            }
            ToolFormat::Llama3Json => {
                if tools::parse_llama3(&t.content).is_some() {
                    t.calls.push(std::mem::take(&mut t.content));
                    t.made_call = true;
                }
            }
        }
        if reason == "stop" && t.made_call {
            "tool_calls"
        } else {
            reason
        }
    }

    /// The calls read since the last call of this, in the API's shape (`index` when
    /// streaming).
    fn take_calls(&mut self, streaming: bool) -> Vec<Value> {
        let Some(t) = &mut self.tools else {
            return Vec::new();
        };
        let raw = std::mem::take(&mut t.calls);
        let parsed: Vec<tools::ToolCall> = match t.format {
            ToolFormat::Markers => raw.iter().flat_map(|r| tools::parse_calls(r)).collect(),
            ToolFormat::Llama3Json => raw.iter().filter_map(|r| tools::parse_llama3(r)).collect(),
        };
        parsed
            .iter()
            .map(|c| {
                let i = t.formatted;
                t.formatted += 1;
                c.to_json(format!("call_{}_{i}", self.id), streaming.then_some(i))
            })
            .collect()
    }

    /// The assistant message and the finish reason. With a tool format, the calls are parsed
    /// out of the text and the content is what remains (null when empty, as mlx_lm.server
    /// sends it).
    fn message(&mut self, finish: &'static str) -> (Value, &'static str) {
        if self.tools.is_none() {
            return (json!({"role": "assistant", "content": self.text}), finish);
        }
        let text = std::mem::take(&mut self.text);
        self.tool_feed(&text);
        self.text = text;
        let finish = self.tool_end(finish);
        let calls = self.take_calls(false);
        let (content, reasoning) = self.tools.as_mut().map_or_else(Default::default, |t| {
            (
                std::mem::take(&mut t.content),
                std::mem::take(&mut t.reasoning),
            )
        });
        let mut message = json!({
            "role": "assistant",
            "content": if content.is_empty() { Value::Null } else { Value::String(content) },
        });
        if !reasoning.is_empty() {
            message["reasoning"] = json!(reasoning);
        }
        if !calls.is_empty() {
            message["tool_calls"] = Value::Array(calls);
        }
        (message, finish)
    }

    fn chunk(&self, choice: Value) -> Event {
        let v = json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.parsed.model,
            "system_fingerprint": fingerprint(),
            "choices": [choice],
        });
        Event::default().data(v.to_string())
    }

    fn delta_chunk(&self, text: &str, from: usize, finish: Option<&str>) -> Event {
        let lp = self.logprobs_value(from);
        match self.parsed.kind {
            Kind::Chat => {
                let delta = if text.is_empty() && finish.is_some() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                self.chunk(json!({
                    "index": self.index, "delta": delta, "logprobs": lp, "finish_reason": finish,
                }))
            }
            Kind::Completion => self.chunk(json!({
                "index": self.index, "text": text, "logprobs": lp, "finish_reason": finish,
            })),
        }
    }
}

enum Step {
    Text(String),
    Done(String, &'static str),
    Failed(ApiError),
}

/// The start of the last occurrence of `pat` in `tokens` (mlx-lm's `rfind_think_*`), `None`
/// when absent (below every position, as mlx-lm's -1).
fn rfind(tokens: &[u32], pat: &[u32]) -> Option<usize> {
    if pat.is_empty() || pat.len() > tokens.len() {
        return None;
    }
    (0..=tokens.len() - pat.len())
        .rev()
        .find(|&i| &tokens[i..i + pat.len()] == pat)
}

fn fingerprint() -> String {
    format!("mlx-rs-{}", env!("CARGO_PKG_VERSION"))
}

/// What the choices of a streamed request add up to, for its final usage chunk.
#[derive(Default)]
struct Totals {
    prompt: usize,
    cached: usize,
    completion: usize,
    failed: bool,
}

struct StreamState {
    ctx: Ctx,
    totals: Arc<Mutex<Totals>>,
    pending: VecDeque<Event>,
    /// Tokens already reported in a chunk.
    sent: usize,
    started: bool,
    finished: bool,
}

impl StreamState {
    /// mlx_lm.server's streaming with a tool format: a chunk whenever the reply is outside a
    /// call and has content or finished calls to report (calls as `tool_calls` deltas with
    /// their `index`), and always the last one (with `finish`).
    fn tool_chunk(&mut self, finish: Option<&'static str>) -> Option<Event> {
        let t = self.ctx.tools.as_ref()?;
        let hold = t.format == ToolFormat::Llama3Json || t.text.in_tool();
        let nothing = t.content.is_empty() && t.calls.is_empty() && t.reasoning.is_empty();
        if finish.is_none() && (hold || nothing) {
            return None;
        }
        let calls = self.ctx.take_calls(true);
        let (content, reasoning) = self.ctx.tools.as_mut().map_or_else(Default::default, |t| {
            (
                std::mem::take(&mut t.content),
                std::mem::take(&mut t.reasoning),
            )
        });
        let mut delta = json!({"role": "assistant"});
        if !content.is_empty() {
            delta["content"] = json!(content);
        }
        if !reasoning.is_empty() {
            delta["reasoning"] = json!(reasoning);
        }
        if !calls.is_empty() {
            delta["tool_calls"] = Value::Array(calls);
        }
        let logprobs = self.ctx.logprobs_value(self.sent);
        self.sent = self.ctx.tokens.len();
        Some(self.ctx.chunk(json!({
            "index": self.ctx.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish,
        })))
    }
}

/// The SSE stream of a streaming request: its choices' chunks as they come (each with its
/// `index`), then the usage chunk (`stream_options.include_usage`) and `[DONE]`. Dropping it
/// (client gone) drops the receivers, and the engine frees the rows at its next step.
fn sse_streams(ctxs: Vec<Ctx>) -> impl Stream<Item = Result<Event, Infallible>> {
    let totals = Arc::new(Mutex::new(Totals::default()));
    let head = ctxs.first().map(|c| {
        (
            c.id.clone(),
            c.object(true),
            c.created,
            c.parsed.model.clone(),
            c.parsed.include_usage,
        )
    });
    let streams: Vec<_> = ctxs
        .into_iter()
        .map(|c| Box::pin(sse_stream(c, totals.clone())))
        .collect();
    let trailer = move |_| {
        let mut events = Vec::new();
        let t = totals
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((id, object, created, model, true)) = &head {
            if !t.failed {
                let v = json!({
                    "id": id,
                    "object": object,
                    "created": created,
                    "model": model,
                    "system_fingerprint": fingerprint(),
                    "choices": [],
                    "usage": {
                        "prompt_tokens": t.prompt,
                        "completion_tokens": t.completion,
                        "total_tokens": t.prompt + t.completion,
                        "prompt_tokens_details": {"cached_tokens": t.cached},
                    },
                });
                events.push(Ok(Event::default().data(v.to_string())));
            }
        }
        events.push(Ok(Event::default().data("[DONE]")));
        stream::iter(events)
    };
    stream::select_all(streams).chain(stream::iter([()]).flat_map(trailer))
}

/// The chunks of one choice.
fn sse_stream(
    ctx: Ctx,
    totals: Arc<Mutex<Totals>>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let st = StreamState {
        ctx,
        totals,
        pending: VecDeque::new(),
        sent: 0,
        started: false,
        finished: false,
    };
    stream::unfold(st, |mut st| async move {
        loop {
            if let Some(ev) = st.pending.pop_front() {
                return Some((Ok(ev), st));
            }
            if st.finished {
                return None;
            }
            if !st.started && st.ctx.parsed.kind == Kind::Chat {
                st.started = true;
                let first = st.ctx.chunk(json!({
                    "index": st.ctx.index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": null,
                    "finish_reason": null,
                }));
                st.pending.push_back(first);
                continue;
            }
            let step = match st.ctx.rx.recv().await {
                Some(ev) => st.ctx.apply(ev),
                None => Step::Failed(ApiError::server("the engine dropped the request")),
            };
            match step {
                Step::Text(t) if st.ctx.tools.is_some() => {
                    st.ctx.tool_feed(&t);
                    if let Some(ev) = st.tool_chunk(None) {
                        st.pending.push_back(ev);
                    }
                }
                Step::Text(t) if t.is_empty() && !st.ctx.parsed.logprobs => {}
                Step::Text(t) => {
                    if st.ctx.tokens.len() > st.sent || !t.is_empty() {
                        let ev = st.ctx.delta_chunk(&t, st.sent, None);
                        st.sent = st.ctx.tokens.len();
                        st.pending.push_back(ev);
                    }
                }
                Step::Done(t, reason) => {
                    if st.ctx.tools.is_some() {
                        st.ctx.tool_feed(&t);
                        let finish = st.ctx.tool_end(reason);
                        st.ctx.log(200, finish);
                        let ev = st.tool_chunk(Some(finish));
                        st.pending.extend(ev);
                    } else {
                        st.ctx.log(200, reason);
                        if !t.is_empty() {
                            let ev = st.ctx.delta_chunk(&t, st.sent, None);
                            st.pending.push_back(ev);
                        }
                        let ev = st.ctx.delta_chunk("", st.ctx.tokens.len(), Some(reason));
                        st.pending.push_back(ev);
                    }
                    {
                        let mut t = st
                            .totals
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        t.prompt = st.ctx.prompt_tokens;
                        t.cached = st.ctx.cached_tokens;
                        t.completion += st.ctx.completion_tokens;
                    }
                    st.finished = true;
                }
                Step::Failed(e) => {
                    st.ctx.log(e.status.as_u16(), "error");
                    st.pending
                        .push_back(Event::default().data(e.body().to_string()));
                    st.totals
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .failed = true;
                    st.finished = true;
                }
            }
        }
    })
}

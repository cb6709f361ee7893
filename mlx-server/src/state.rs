//! What every handler shares: the engine handle, the options, the served model's names.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use mlx_engine::batch::Engine;
use mlx_engine::chat_template::ChatTemplates;
use mlx_engine::grammar::GrammarCompiler;
use serde_json::{Map, Value};

use crate::args::ServeArgs;
use crate::tools::{self, ToolFormat};

pub struct AppState {
    pub engine: Engine,
    pub args: ServeArgs,
    /// The id `/v1/models` lists.
    pub model_id: String,
    /// Extra chat-template variables (`--chat-template-args`).
    pub template_args: Map<String, Value>,
    pub created: u64,
    /// Prompt plus `max_tokens` may not exceed this: `--max-context`, or the model's own
    /// context length when that is smaller.
    pub max_context: usize,
    /// The model's own context length, when its config declares one.
    pub model_context: Option<usize>,
    /// How the chat template marks tool calls, if it does.
    pub tool_format: Option<ToolFormat>,
    /// Structured output's grammar compiler, built on the first request that needs one (or
    /// why it could not be, answered to every request that needs one).
    pub grammar: OnceLock<Result<Arc<GrammarCompiler>, Arc<mlx_engine::EngineError>>>,
    counter: AtomicU64,
    /// Unknown request fields already logged (each is logged once).
    unknown_fields: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The `/metrics` counters and histograms.
    pub metrics: crate::metrics::Metrics,
}

pub type Shared = Arc<AppState>;

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl AppState {
    pub fn new(
        engine: Engine,
        args: ServeArgs,
        template_args: Map<String, Value>,
        model_context: Option<usize>,
    ) -> Self {
        let max_context = model_context.map_or(args.max_context, |n| n.min(args.max_context));
        let tool_format = match engine.tokenizer().chat_templates() {
            Some(ChatTemplates::Single(t)) => tools::detect(t),
            Some(ChatTemplates::Named(list)) => list.iter().find_map(|(_, t)| tools::detect(t)),
            None => None,
        };
        let model_id = args
            .model
            .clone()
            .unwrap_or_else(|| "default_model".to_string());
        AppState {
            engine,
            args,
            model_id,
            template_args,
            created: unix_now(),
            max_context,
            model_context,
            tool_format,
            grammar: OnceLock::new(),
            counter: AtomicU64::new(0),
            unknown_fields: Default::default(),
            metrics: Default::default(),
        }
    }

    /// Whether a request's `model` names the served model: its id, the last component of
    /// its path, or mlx_lm.server's `default_model`.
    pub fn knows_model(&self, name: &str) -> bool {
        let base = std::path::Path::new(&self.model_id)
            .file_name()
            .and_then(|s| s.to_str())
            .unwrap_or(&self.model_id);
        name == self.model_id || name == base || name == "default_model"
    }

    /// Logs an unknown request field the first time it is seen (it is ignored).
    pub fn note_unknown_field(&self, name: &str) {
        let mut seen = self
            .unknown_fields
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Bounded, so clients cannot grow it without limit.
        if seen.len() < 1024 && seen.insert(name.to_string()) {
            tracing::warn!(
                field = name,
                "ignoring an unknown request field (logged once)"
            );
        }
    }

    /// A fresh id with the OpenAI prefix (`chatcmpl-...`, `cmpl-...`).
    pub fn next_id(&self, prefix: &str) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        format!(
            "{prefix}-{:08x}{:06x}{n:x}",
            self.created as u32,
            nanos & 0xffffff
        )
    }
}

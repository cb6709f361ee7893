//! A multi-turn chat over one model, reusing the prompt cache between turns: each turn renders
//! the whole conversation with the chat template, reuses the cached prefix it shares with the
//! previous turn (trimmed to the common prefix), and runs the model only on the rest.

use serde_json::{json, Value};

use crate::chat_template::ChatTemplateOptions;
use crate::error::Result;
use crate::prompt_cache::PromptCache;
use crate::stream::{stream_generate, GenerationResponse, StreamOptions};
use crate::tokenizer::Tokenizer;
use mlx_models::LanguageModel;

/// Statistics of one turn.
#[derive(Clone, Debug, Default)]
pub struct TurnStats {
    /// Tokens of the rendered conversation.
    pub prompt_tokens: usize,
    /// Of those, tokens that ran through the model this turn (the rest came from the cache).
    pub prefilled: usize,
    pub generated: usize,
    pub prompt_tps: f64,
    pub generation_tps: f64,
    pub peak_memory_bytes: usize,
}

pub struct ChatSession<'m> {
    model: &'m dyn LanguageModel,
    tokenizer: &'m Tokenizer,
    messages: Vec<Value>,
    cache: PromptCache,
    opts: StreamOptions,
}

impl<'m> ChatSession<'m> {
    pub fn new(
        model: &'m dyn LanguageModel,
        tokenizer: &'m Tokenizer,
        system: Option<&str>,
        opts: StreamOptions,
    ) -> Self {
        let messages = system
            .map(|s| vec![json!({"role": "system", "content": s})])
            .unwrap_or_default();
        // One conversation: a single entry suffices; 8 GiB caps a runaway context.
        ChatSession {
            model,
            tokenizer,
            messages,
            cache: PromptCache::new(1, 8 << 30),
            opts,
        }
    }

    pub fn messages(&self) -> &[Value] {
        &self.messages
    }

    /// Sends a user message; `on_response` sees every streamed response. Returns the reply.
    pub fn send(
        &mut self,
        user: &str,
        mut on_response: impl FnMut(&GenerationResponse),
    ) -> Result<(String, TurnStats)> {
        self.messages.push(json!({"role": "user", "content": user}));
        let tokens = self
            .tokenizer
            .apply_chat_template_ids(&self.messages, &ChatTemplateOptions::generation(true))?;
        let (caches, reused) = match self.cache.fetch(&tokens) {
            Some(r) => (Some(r.caches), r.reused),
            None => (None, 0),
        };
        let mut stream = stream_generate(
            self.model,
            self.tokenizer,
            &tokens[reused..],
            caches,
            self.opts.clone(),
        )?;
        let mut reply = String::new();
        let mut stats = TurnStats {
            prompt_tokens: tokens.len(),
            prefilled: tokens.len() - reused,
            ..TurnStats::default()
        };
        for r in stream.by_ref() {
            let r = r?;
            reply.push_str(&r.text);
            stats.generated = r.generation_tokens;
            stats.prompt_tps = r.prompt_tps;
            stats.generation_tps = r.generation_tps;
            stats.peak_memory_bytes = r.peak_memory_bytes;
            on_response(&r);
        }
        let held: Vec<u32> = tokens
            .iter()
            .copied()
            .chain(stream.cached_tokens())
            .collect();
        let caches = stream.into_cache();
        let offset = caches.first().map_or(0, |c| c.offset());
        if offset == held.len() {
            self.cache.insert(held, caches);
        }
        self.messages
            .push(json!({"role": "assistant", "content": reply}));
        Ok((reply, stats))
    }
}

//! Multi-turn chat over one model, two ways:
//!
//! - [`Conversation`] is `mlx_lm.chat`: each turn renders only `[system?, user]` with the chat
//!   template and appends it to one growing cache made once (`make_prompt_cache(model,
//!   max_kv_size)`), which keeps every previous prompt, reply and EOS token; `reset` starts a
//!   fresh cache.
//! - [`ChatSession`] renders the whole conversation each turn, reuses the cached prefix it
//!   shares with the previous turn (trimmed to the common prefix), and runs the model only on
//!   the rest.
//!
//! On the GPU graph decoder, a trellis-coded model's prompt runs through the decoder and the
//! MLX caches hold nothing ([`crate::held`]). Both keep the decoder between turns, its cache
//! holding the conversation ([`crate::graph::GraphKeep::for_conversation`], made here when
//! the options ask for the decoder and name no slot): each turn hands the generation the
//! whole conversation with empty MLX caches, and the kept decoder runs only the tokens it
//! does not hold. The MLX caches are filled (the tokens run through MLX's forward) only where
//! they are used: a fall-back to the MLX path mid-turn runs the conversation's whole history.

use serde_json::{json, Value};

use mlx_cache::Cache;

use crate::chat_template::ChatTemplateOptions;
use crate::cpu_decode::CpuDecoder;
use crate::error::Result;
use crate::generate::{cpu_decode_unsupported, make_prompt_cache};
use crate::held::{HeldCaches, Plan};
use crate::prompt_cache::PromptCache;
use crate::speculative::{Drafter, SpecStats};
use crate::stream::{
    stream_generate, stream_generate_cpu, stream_generate_cpu_speculative_with,
    stream_generate_speculative, GenerationResponse, StreamOptions,
};
use crate::tokenizer::Tokenizer;
use mlx_models::LanguageModel;

/// Statistics of one turn.
#[derive(Clone, Debug, Default)]
pub struct TurnStats {
    /// Tokens of the rendered conversation.
    pub prompt_tokens: usize,
    /// Of those, tokens that ran through the model this turn (the rest came from the cache,
    /// or from a kept graph decoder's: [`crate::stream::TextStream::prompt_reused`]).
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
    /// With `opts.generate.graph_decode` and no `graph_keep`, the session keeps its decoder in
    /// a conversation's slot ([`crate::graph::GraphKeep::for_conversation`]).
    pub fn new(
        model: &'m dyn LanguageModel,
        tokenizer: &'m Tokenizer,
        system: Option<&str>,
        mut opts: StreamOptions,
    ) -> Self {
        conversation_keep(&mut opts);
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
            prefilled: tokens.len() - reused - stream.prompt_reused(),
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
        match stream.into_held_caches() {
            // A trellis prompt ran on the graph decoder: the MLX caches hold nothing, and the
            // decoder (kept in the session's slot) holds the conversation. Nothing is run
            // through MLX's forward: the next turn's prompt is the whole conversation again,
            // of which the kept decoder runs only what it does not hold (a decoder not kept,
            // or a fall-back, runs it all).
            Ok((h, _)) if h.plan() == Plan::Prepend => {}
            Ok((h, _)) => {
                let caches = h.sync_or_keep(self.model);
                let offset = caches.first().map_or(0, |c| c.offset());
                if offset == held.len() {
                    self.cache.insert(held, caches);
                }
            }
            Err(_) => {}
        }
        self.messages
            .push(json!({"role": "assistant", "content": reply}));
        Ok((reply, stats))
    }
}

/// `mlx_lm.chat`'s loop body over one growing cache (see the module docs). With
/// `opts.generate.cpu_decode` the cache is the CPU decoder's own, kept across turns.
pub struct Conversation<'m> {
    model: &'m dyn LanguageModel,
    tokenizer: &'m Tokenizer,
    system: Option<String>,
    /// The growing cache, with the tokens the last turn's graph decoder ran that it does not
    /// hold yet (after a trellis prompt on the decoder, every token: the next turn runs them
    /// with its prompt, [`HeldCaches::continue_with`]; a conversation that ends or is reset
    /// never runs them through MLX's path).
    cache: HeldCaches,
    /// The CPU decoder and its cache (`None` on the MLX path; taken during a turn).
    cpu: Option<CpuDecoder<'m>>,
    opts: StreamOptions,
    spec: Option<ChatSpeculation<'m>>,
    /// The draft model's growing cache (speculation with a draft model).
    draft_cache: Vec<Box<dyn Cache>>,
    /// The last turn's acceptance statistics.
    last_stats: Option<SpecStats>,
    /// Why the last turn's graph decoder handed the turn to the MLX path, if it did.
    last_graph_fallback: Option<String>,
    /// Prompt lookup on the CPU decoder: the tokens its cache holds (what lookups search).
    cpu_history: Vec<u32>,
}

/// Speculative decoding for a [`Conversation`] (beyond `mlx_lm.chat`, which has none).
#[derive(Clone, Copy)]
pub struct ChatSpeculation<'m> {
    /// A draft model (`Some`) or prompt lookup with n-grams of `ngram` tokens.
    pub draft: Option<&'m dyn LanguageModel>,
    pub ngram: usize,
    pub num_draft_tokens: usize,
}

impl<'m> Conversation<'m> {
    /// A conversation with a fresh cache (`make_prompt_cache(model, opts.generate.max_kv_size)`).
    /// With `opts.generate.graph_decode` and no `graph_keep`, it keeps its GPU graph decoder in
    /// a conversation's slot ([`crate::graph::GraphKeep::for_conversation`]) for as long as it
    /// lives: the decoder's weights, and for a trellis-coded model the conversation's KV cache
    /// on the device, stay allocated between turns (pass your own `graph_keep` to share or
    /// drop it).
    pub fn new(
        model: &'m dyn LanguageModel,
        tokenizer: &'m Tokenizer,
        system: Option<&str>,
        mut opts: StreamOptions,
    ) -> Result<Self> {
        conversation_keep(&mut opts);
        let cpu = match opts.generate.cpu_decode {
            Some(c) => {
                if let Some(why) = cpu_decode_unsupported(model, &opts.generate, false) {
                    return Err(crate::EngineError::CpuDecoderUnsupported(why));
                }
                Some(CpuDecoder::new(model, c.threads, 256)?)
            }
            None => None,
        };
        Ok(Conversation {
            model,
            tokenizer,
            system: system.map(str::to_string),
            cache: HeldCaches::synced(if cpu.is_some() {
                Vec::new()
            } else {
                make_prompt_cache(model, opts.generate.max_kv_size)?
            }),
            cpu,
            opts,
            spec: None,
            draft_cache: Vec::new(),
            last_stats: None,
            last_graph_fallback: None,
            cpu_history: Vec::new(),
        })
    }

    /// Every turn speculates with `spec`: the caches become ones that roll back exactly
    /// (`max_kv_size` does not apply, as mlx-lm drops it when speculating), and after each
    /// turn they are brought up to every generated token, so greedy turns give the text of
    /// plain decoding. Prompt lookup on a conversation made with the CPU decoder stays on it
    /// (greedy only: [`crate::cpu_spec`], drafts verified in batched passes, its cache kept
    /// across turns as plain decoding keeps it); a draft model verifies on the exact path.
    pub fn with_speculation(mut self, spec: ChatSpeculation<'m>) -> Result<Self> {
        if spec.draft.is_some() || self.cpu.is_none() {
            self.cpu = None;
            self.opts.generate.cpu_decode = None;
        }
        self.spec = Some(spec);
        self.reset()?;
        Ok(self)
    }

    /// Why the last turn's graph decoder handed it to the MLX path (see
    /// [`crate::generate::GenerateStep::graph_fallback`]), if it did.
    pub fn graph_fallback(&self) -> Option<&str> {
        self.last_graph_fallback.as_deref()
    }

    /// The last turn's acceptance statistics (speculative decoding).
    pub fn spec_stats(&self) -> Option<SpecStats> {
        self.last_stats
    }

    /// The `r` command: a fresh cache.
    pub fn reset(&mut self) -> Result<()> {
        self.cpu_history.clear();
        match &self.spec {
            Some(sp) if sp.draft.is_none() && self.opts.generate.cpu_decode.is_some() => {
                self.reset_cpu()?
            }
            Some(sp) => {
                let depth = sp.num_draft_tokens + 1;
                self.cache = HeldCaches::synced(self.model.make_cache_with_rollback(depth));
                self.draft_cache = sp
                    .draft
                    .map(|d| d.make_cache_with_rollback(depth))
                    .unwrap_or_default();
            }
            None if self.opts.generate.cpu_decode.is_some() => self.reset_cpu()?,
            None => {
                self.cache = HeldCaches::synced(make_prompt_cache(
                    self.model,
                    self.opts.generate.max_kv_size,
                )?);
            }
        }
        Ok(())
    }

    /// An empty CPU decoder cache (a new decoder if a failed turn took it).
    fn reset_cpu(&mut self) -> Result<()> {
        match self.cpu.as_mut() {
            Some(d) => d.reset(),
            None => {
                let threads = self.opts.generate.cpu_decode.map_or(0, |c| c.threads);
                self.cpu = Some(CpuDecoder::new(self.model, threads, 256)?);
            }
        }
        Ok(())
    }

    /// Whether the turns run through the CPU decoder.
    pub fn uses_cpu_decoder(&self) -> bool {
        self.opts.generate.cpu_decode.is_some()
    }

    /// Tokens the cache holds.
    pub fn cached_tokens(&self) -> usize {
        match &self.cpu {
            Some(d) => d.position(),
            None => self.cache.tokens(),
        }
    }

    /// One turn: `[system?, user]` rendered with the generation prompt, appended to the cache,
    /// then generation; `on_response` sees every streamed response. Returns the last one.
    pub fn turn(
        &mut self,
        query: &str,
        mut on_response: impl FnMut(&GenerationResponse),
    ) -> Result<GenerationResponse> {
        let mut messages = Vec::new();
        if let Some(s) = &self.system {
            messages.push(json!({"role": "system", "content": s}));
        }
        messages.push(json!({"role": "user", "content": query}));
        let prompt = self
            .tokenizer
            .apply_chat_template_ids(&messages, &ChatTemplateOptions::generation(true))?;
        let cpu = self.cpu.take();
        let held = std::mem::replace(&mut self.cache, HeldCaches::synced(Vec::new()));
        // The tokens the last turn's graph decoder ran and the cache does not hold: the head
        // of this turn's prompt where the cache holds nothing (a trellis prompt ran on the
        // decoder, which is kept holding them: it runs only what it does not hold), else run
        // through the MLX forward now (plain decoding only: speculation leaves none pending).
        // This turn's prompt statistics (`prompt_tokens`, `prompt_tps`) count those the
        // decoder runs again (none it held; a decoder not kept runs them all).
        let continued = match (&self.spec, &cpu) {
            (None, None) => held.continue_with(self.model, &prompt),
            _ => held.sync(self.model).map(|c| (c, prompt.clone())),
        };
        let (cache, prompt) = match continued {
            Ok(c) => c,
            Err(e) => {
                self.reset()?;
                return Err(e);
            }
        };
        let started = match (&self.spec, cpu) {
            (None, Some(cpu)) => {
                stream_generate_cpu(self.model, self.tokenizer, &prompt, cpu, self.opts.clone())
            }
            (None, None) => stream_generate(
                self.model,
                self.tokenizer,
                &prompt,
                Some(cache),
                self.opts.clone(),
            ),
            (Some(sp), Some(cpu)) => stream_generate_cpu_speculative_with(
                self.model,
                self.tokenizer,
                &prompt,
                cpu,
                std::mem::take(&mut self.cpu_history),
                sp.ngram,
                sp.num_draft_tokens,
                self.opts.clone(),
            ),
            (Some(sp), None) => {
                let drafter = match sp.draft {
                    Some(model) => Drafter::Model {
                        model,
                        cache: Some(std::mem::take(&mut self.draft_cache)),
                    },
                    None => Drafter::PromptLookup { ngram: sp.ngram },
                };
                stream_generate_speculative(
                    self.model,
                    self.tokenizer,
                    &prompt,
                    Some(cache),
                    drafter,
                    sp.num_draft_tokens,
                    self.opts.clone(),
                )
            }
        };
        let mut stream = match started {
            Ok(s) => s,
            Err(e) => {
                // The cache went into the failed prefill: start over rather than keep a
                // half-updated one.
                self.reset()?;
                return Err(e);
            }
        };
        let mut last = None;
        let mut failure = None;
        for r in stream.by_ref() {
            match r {
                Ok(r) => {
                    on_response(&r);
                    last = Some(r);
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        self.last_stats = stream.spec_stats();
        self.last_graph_fallback = stream.graph_fallback().map(str::to_string);
        if stream.uses_cpu_decoder() {
            // The CPU decoder keeps its own cache across turns.
            if self.spec.is_some() {
                if let Some((dec, history)) = stream.into_cpu_speculation() {
                    self.cpu = Some(dec);
                    self.cpu_history = history;
                }
            } else {
                self.cpu = stream.into_cpu_decoder();
            }
            if let Some(e) = failure {
                self.reset()?;
                return Err(e);
            }
            return last.ok_or_else(|| crate::EngineError::Internal {
                what: "chat".into(),
                problem: "generation produced no response".into(),
            });
        }
        if let Some(e) = failure {
            if self.spec.is_some() {
                self.reset()?;
            } else {
                self.cache = match stream.into_held_caches() {
                    Ok((c, _)) => c,
                    Err(_) => HeldCaches::synced(Vec::new()),
                };
            }
            return Err(e);
        }
        let (cache, draft_cache) = match stream.into_held_caches() {
            Ok(c) => c,
            Err(e) => {
                self.reset()?;
                return Err(e);
            }
        };
        self.cache = cache;
        self.draft_cache = draft_cache;
        last.ok_or_else(|| crate::EngineError::Internal {
            what: "chat".into(),
            problem: "generation produced no response".into(),
        })
    }
}

/// The options of a conversation: with the graph decoder and no slot named, a conversation's
/// slot ([`crate::graph::GraphKeep::for_conversation`]), so that the decoder and its cache
/// are kept from one turn to the next.
fn conversation_keep(opts: &mut StreamOptions) {
    if opts.generate.graph_decode && opts.generate.graph_keep.is_none() {
        opts.generate.graph_keep = Some(crate::graph::GraphKeep::for_conversation());
    }
}

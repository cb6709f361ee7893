//! Text generation on top of [`crate::generate::generate_step`], as mlx-lm's
//! `stream_generate` does it: a streaming detokenizer, EOS ids from the tokenizer (and
//! config), stop strings matched on the decoded text, per-token log-probabilities, and the
//! statistics mlx-lm reports (prompt and generation tokens per second, peak memory).

use std::time::Instant;

use mlx_cache::Cache;
use mlx_core::memory;
use mlx_core::prelude::*;

use crate::cpu_decode::CpuDecoder;
use crate::cpu_spec::CpuSpecSteps;
use crate::error::{EngineError, Result};
use crate::generate::{generate_step_cpu, generate_step_host, GenerateOptions, GenerateStep, Step};
use crate::speculative::{
    speculative_generate_step, CachePair, Drafter, SpecStats, SpeculativeStep,
};
pub use crate::step_tail::FinishReason;
use crate::step_tail::{token_logprobs, Chunking, StepTail, Tail};
use crate::tokenizer::Tokenizer;
use mlx_models::LanguageModel;

/// Options of [`stream_generate`].
#[derive(Clone, Debug, Default)]
pub struct StreamOptions {
    pub generate: GenerateOptions,
    /// Generation stops before the first occurrence of any of these in the decoded text.
    pub stop_strings: Vec<String>,
    /// How many most likely `(id, logprob)` pairs to report per token (0: none).
    pub top_logprobs: usize,
}

/// One step of the stream (mlx-lm's `GenerationResponse`).
#[derive(Clone, Debug)]
pub struct GenerationResponse {
    /// New text since the previous response (may be empty while a character or a possible
    /// stop string is incomplete).
    pub text: String,
    /// The token generated at this step: on the final response the last token (the EOS token
    /// when generation ended on one, as mlx-lm reports it). `None` only if the model produced
    /// no token.
    pub token: Option<u32>,
    /// Its log-probability under the model (after logits processors, before the sampler's
    /// transforms such as temperature or top-p).
    pub logprob: Option<f32>,
    /// The most likely tokens at this step, most likely first.
    pub top_logprobs: Vec<(u32, f32)>,
    /// Tokens of the prompt run this generation: the prompt's, less those a kept graph
    /// decoder held already ([`TextStream::prompt_reused`]); `prompt_tps` is over these.
    pub prompt_tokens: usize,
    pub prompt_tps: f64,
    /// Tokens generated so far, counting an EOS token that ended generation (as mlx-lm does).
    pub generation_tokens: usize,
    pub generation_tps: f64,
    pub peak_memory_bytes: usize,
    /// Set on the last response only: `Length` on the `max_tokens`-th token, `Stop` on an EOS
    /// token or a stop string.
    pub finish_reason: Option<FinishReason>,
    /// The token was proposed by the drafter and accepted (speculative decoding only).
    pub from_draft: bool,
}

/// The token source of a [`TextStream`]: plain or speculative decoding.
enum Steps<'m> {
    Plain(Box<GenerateStep<'m>>),
    Speculative(Box<SpeculativeStep<'m>>),
    /// Greedy speculation on the CPU decoder ([`crate::cpu_spec::CpuSpecSteps`]).
    CpuSpeculative(Box<CpuSpecSteps<'m>>),
    /// Greedy draft-model speculation on the GPU graph decoder
    /// ([`crate::graph_speculative::GraphSpecSteps`]).
    GraphSpeculative(Box<crate::graph_speculative::GraphSpecSteps>),
}

impl Steps<'_> {
    /// See [`GenerateStep::prompt_reused`]; 0 for speculative decoding.
    fn prompt_reused(&self) -> usize {
        match self {
            Steps::Plain(g) => g.prompt_reused(),
            _ => 0,
        }
    }

    fn next(&mut self) -> Option<Result<Step>> {
        match self {
            Steps::Plain(g) => g.next(),
            Steps::Speculative(g) => g.next(),
            Steps::CpuSpeculative(g) => Some(g.next_token().and_then(|(token, lp, from_draft)| {
                Ok(Step {
                    token,
                    logprobs: Array::from_slice::<f32>(&[], &[0])?,
                    from_draft,
                    logprob: Some(lp),
                })
            })),
            Steps::GraphSpeculative(g) => {
                Some(g.next_token().and_then(|(token, lp, from_draft)| {
                    Ok(Step {
                        token,
                        logprobs: Array::from_slice::<f32>(&[], &[0])?,
                        from_draft,
                        logprob: Some(lp),
                    })
                }))
            }
        }
    }
}

/// The stream of [`stream_generate`].
pub struct TextStream<'m> {
    steps: Steps<'m>,
    tokenizer: &'m Tokenizer,
    tail: StepTail,
    opts: StreamOptions,
    prompt_tokens: usize,
    start: Instant,
    prompt_tps: f64,
    first: Option<Instant>,
    generation_tps: f64,
    done: bool,
    tokens: Vec<u32>,
    eos: Option<u32>,
    from_draft: bool,
}

/// Starts generating text for `prompt` (token ids), optionally continuing `prompt_cache`
/// (which must hold exactly the tokens before `prompt`).
///
/// As mlx-lm's `stream_generate`: every response but the last carries one token and its
/// text; the last one carries the last token (or the EOS token, which is counted in
/// `generation_tokens` but not detokenized), the rest of the text and the `finish_reason`.
/// `max_tokens == Some(0)` is an error (`None` is mlx-lm's `-1`: no limit).
pub fn stream_generate<'m>(
    model: &'m dyn LanguageModel,
    tokenizer: &'m Tokenizer,
    prompt: &[u32],
    prompt_cache: Option<Vec<Box<dyn Cache>>>,
    opts: StreamOptions,
) -> Result<TextStream<'m>> {
    let top = opts.top_logprobs;
    start(model, tokenizer, prompt, opts, |ids, g| {
        // The stream reads a step's `(vocab,)` log-probabilities only for top log-probabilities.
        let steps = generate_step_host(ids, model, prompt_cache, g, top > 0)?;
        Ok(Steps::Plain(Box::new(steps)))
    })
}

/// [`stream_generate`] through a CPU decoder the caller keeps (see
/// [`crate::generate::generate_step_cpu`]); [`TextStream::into_cpu_decoder`] gives it back.
pub fn stream_generate_cpu<'m>(
    model: &'m dyn LanguageModel,
    tokenizer: &'m Tokenizer,
    prompt: &[u32],
    cpu: CpuDecoder<'m>,
    opts: StreamOptions,
) -> Result<TextStream<'m>> {
    start(model, tokenizer, prompt, opts, |ids, g| {
        let steps = generate_step_cpu(ids, model, cpu, g)?;
        Ok(Steps::Plain(Box::new(steps)))
    })
}

/// [`stream_generate`] with speculative decoding (mlx-lm's `stream_generate(...,
/// draft_model=..., num_draft_tokens=...)`, or prompt lookup): each response carries
/// `from_draft`; the draft model's own cache is made fresh unless `drafter` carries one.
/// `prompt_cache` must be trimmable (or a recurrent cache keeping history); `None` makes
/// fresh caches that roll back exactly.
pub fn stream_generate_speculative<'m>(
    model: &'m dyn LanguageModel,
    tokenizer: &'m Tokenizer,
    prompt: &[u32],
    prompt_cache: Option<Vec<Box<dyn Cache>>>,
    drafter: Drafter<'m>,
    num_draft_tokens: usize,
    opts: StreamOptions,
) -> Result<TextStream<'m>> {
    start(model, tokenizer, prompt, opts, |ids, g| {
        let steps =
            speculative_generate_step(ids, model, prompt_cache, drafter, num_draft_tokens, g)?;
        Ok(Steps::Speculative(Box::new(steps)))
    })
}

/// [`stream_generate`] with prompt lookup speculation on the CPU decoder
/// ([`crate::cpu_spec`]): greedy only (temperature 0, no logits processors, no grammar, no
/// prompt cache); `opts.generate.cpu_decode` must be set (its threads run the decoder). Drafts
/// by [`crate::cpu_spec::LookupDrafter`] (n-grams of at least `ngram` tokens, at most
/// `num_draft_tokens` a round) are verified in one batched pass each; the output is plain
/// greedy decoding's on the CPU decoder, bit for bit.
pub fn stream_generate_cpu_speculative<'m>(
    model: &'m dyn LanguageModel,
    tokenizer: &'m Tokenizer,
    prompt: &[u32],
    ngram: usize,
    num_draft_tokens: usize,
    opts: StreamOptions,
) -> Result<TextStream<'m>> {
    cpu_speculative(
        model,
        tokenizer,
        prompt,
        None,
        CpuDrafterSpec::Lookup(ngram),
        num_draft_tokens,
        opts,
    )
}

/// [`stream_generate_cpu_speculative`] with a draft model instead of prompt lookup
/// (`--draft-model` on the CPU decoder): `draft` runs on a CPU decoder of its own (the same
/// thread count) and drafts greedily; both models must be ones the CPU decoder takes. Greedy
/// only; the output is plain greedy decoding's on the CPU decoder, bit for bit.
pub fn stream_generate_cpu_draft<'m>(
    model: &'m dyn LanguageModel,
    tokenizer: &'m Tokenizer,
    prompt: &[u32],
    draft: &'m dyn LanguageModel,
    num_draft_tokens: usize,
    opts: StreamOptions,
) -> Result<TextStream<'m>> {
    cpu_speculative(
        model,
        tokenizer,
        prompt,
        None,
        CpuDrafterSpec::Model(draft),
        num_draft_tokens,
        opts,
    )
}

/// [`stream_generate_speculative`] with a draft model on the GPU graph decoder
/// ([`crate::graph_speculative`]): both models on graph decoders of their own, each round's drafts
/// verified by the target in one batched graph step. Greedy only; the output is plain greedy
/// graph decoding's, bit for bit. [`crate::graph_speculative::unsupported`] says where it cannot run.
pub fn stream_generate_graph_draft<'m>(
    model: &'m dyn LanguageModel,
    tokenizer: &'m Tokenizer,
    prompt: &[u32],
    draft: &'m dyn LanguageModel,
    num_draft_tokens: usize,
    opts: StreamOptions,
) -> Result<TextStream<'m>> {
    start(model, tokenizer, prompt, opts, |ids, g| {
        let steps =
            crate::graph_speculative::GraphSpecSteps::new(model, draft, ids, &g, num_draft_tokens)?;
        Ok(Steps::GraphSpeculative(Box::new(steps)))
    })
}

/// What drafts for [`cpu_speculative`].
enum CpuDrafterSpec<'m> {
    /// Prompt lookup with this n-gram size.
    Lookup(usize),
    /// A draft model on a CPU decoder of its own.
    Model(&'m dyn LanguageModel),
}

/// [`stream_generate_cpu_speculative`] continuing `cpu`, a CPU decoder of `model` whose cache
/// holds `earlier` (a conversation's earlier turns, from [`TextStream::into_cpu_speculation`]
/// or empty for a fresh decoder): `prompt` runs after them and lookups search all of it.
/// `opts.generate.cpu_decode` is not consulted.
#[allow(clippy::too_many_arguments)]
pub fn stream_generate_cpu_speculative_with<'m>(
    model: &'m dyn LanguageModel,
    tokenizer: &'m Tokenizer,
    prompt: &[u32],
    cpu: CpuDecoder<'m>,
    earlier: Vec<u32>,
    ngram: usize,
    num_draft_tokens: usize,
    opts: StreamOptions,
) -> Result<TextStream<'m>> {
    if !cpu.is_for(model) {
        return Err(EngineError::DecoderMismatch {
            context: "speculation on the CPU decoder".into(),
            decoder: "decoder".into(),
            model_type: model.model_type().to_string(),
        });
    }
    cpu_speculative(
        model,
        tokenizer,
        prompt,
        Some((cpu, earlier)),
        CpuDrafterSpec::Lookup(ngram),
        num_draft_tokens,
        opts,
    )
}

fn cpu_speculative<'m>(
    model: &'m dyn LanguageModel,
    tokenizer: &'m Tokenizer,
    prompt: &[u32],
    cpu: Option<(CpuDecoder<'m>, Vec<u32>)>,
    drafter: CpuDrafterSpec<'m>,
    num_draft_tokens: usize,
    opts: StreamOptions,
) -> Result<TextStream<'m>> {
    if let CpuDrafterSpec::Lookup(0) = drafter {
        return Err(EngineError::Options {
            option: "prompt lookup".into(),
            problem: "the n-gram size must be at least 1".into(),
        });
    }
    if let CpuDrafterSpec::Model(d) = drafter {
        if let Some(why) = crate::cpu_decode::unsupported(d) {
            return Err(EngineError::CpuDecoderUnsupported(format!(
                "the draft model ({}): {why}",
                d.model_type()
            )));
        }
    }
    start(model, tokenizer, prompt, opts, |ids, g| {
        if g.sampler.settings().temp != 0.0
            || !g.logits_processors.is_empty()
            || g.grammar.is_some()
        {
            return Err(EngineError::Conflict(
                "speculation on the CPU decoder is greedy only: temperature 0, no logits \
                 processors, no grammar (use --decoder mlx)"
                    .into(),
            ));
        }
        let (dec, earlier) = match cpu {
            Some(c) => c,
            None => {
                let Some(c) = g.cpu_decode else {
                    return Err(EngineError::Options {
                        option: "speculation on the CPU decoder".into(),
                        problem: "cpu_decode is not set".into(),
                    });
                };
                if let Some(why) = crate::generate::cpu_decode_unsupported(model, &g, false) {
                    return Err(EngineError::CpuDecoderUnsupported(why));
                }
                let room = ids.len() + g.max_tokens.unwrap_or(0) + num_draft_tokens + 1;
                (CpuDecoder::new(model, c.threads, room)?, Vec::new())
            }
        };
        let prompt: Vec<u32> = ids.iter().map(|&t| t as u32).collect();
        // Prompt lookup drafts by its policy (the number of drafts fixed, capped by the
        // matched context); a draft model's rounds adapt to its misses.
        let (propose, adaptive): (Box<crate::cpu_spec::Propose<'m>>, bool) = match drafter {
            CpuDrafterSpec::Lookup(ngram) => {
                let mut lookup = crate::cpu_spec::LookupDrafter::new(ngram);
                (
                    Box::new(move |h: &[u32], k: usize| lookup.propose(h, k)),
                    false,
                )
            }
            CpuDrafterSpec::Model(d) => {
                let room = ids.len() + g.max_tokens.unwrap_or(0) + num_draft_tokens + 1;
                let ddec = CpuDecoder::new(d, dec.threads(), room)?;
                let mut draft = crate::cpu_spec::CpuDraft::new(ddec, dec.vocab());
                (
                    Box::new(move |h: &[u32], k: usize| draft.propose(h, k)),
                    true,
                )
            }
        };
        let steps = CpuSpecSteps::resume(
            dec,
            earlier,
            &prompt,
            g.max_tokens,
            crate::cpu_spec::DraftLength::new(num_draft_tokens, adaptive),
            propose,
        )?;
        Ok(Steps::CpuSpeculative(Box::new(steps)))
    })
}

/// What every stream starter shares: the prompt's checks, the clock, then `steps` (given the
/// prompt's ids and the generation options) wrapped in a [`TextStream`].
fn start<'m>(
    model: &dyn LanguageModel,
    tokenizer: &'m Tokenizer,
    prompt: &[u32],
    opts: StreamOptions,
    steps: impl FnOnce(&[i32], GenerateOptions) -> Result<Steps<'m>>,
) -> Result<TextStream<'m>> {
    let ids = check_prompt(model, prompt, &opts)?;
    let start = Instant::now();
    let steps = steps(&ids, opts.generate.clone())?;
    let ran = prompt.len() - steps.prompt_reused().min(prompt.len());
    Ok(TextStream::new(steps, tokenizer, opts, ran, start))
}

impl<'m> TextStream<'m> {
    fn new(
        steps: Steps<'m>,
        tokenizer: &'m Tokenizer,
        opts: StreamOptions,
        prompt_tokens: usize,
        start: Instant,
    ) -> Self {
        TextStream {
            steps,
            tokenizer,
            tail: StepTail::new(
                tokenizer,
                opts.stop_strings.clone(),
                opts.generate.max_tokens,
                Chunking::Stream,
            ),
            opts,
            prompt_tokens,
            start,
            prompt_tps: 0.0,
            first: None,
            generation_tps: 0.0,
            done: false,
            tokens: Vec::new(),
            eos: None,
            from_draft: false,
        }
    }
}

/// The checks both streams make before generating; the prompt as `i32` ids.
fn check_prompt(
    model: &dyn LanguageModel,
    prompt: &[u32],
    opts: &StreamOptions,
) -> Result<Vec<i32>> {
    if opts.generate.max_tokens == Some(0) {
        return Err(EngineError::ZeroMaxTokens);
    }
    let ids: Vec<i32> = prompt
        .iter()
        .map(|&t| {
            i32::try_from(t).map_err(|_| EngineError::Input {
                what: "prompt".into(),
                problem: format!(
                    "token id {t} is outside the model's vocabulary of {} tokens",
                    model.vocab_size()
                ),
            })
        })
        .collect::<Result<_>>()?;
    Ok(ids)
}

/// A warning when an EOS id of `tokenizer` is outside `model`'s vocabulary (`None`: every one
/// is inside). mlx-lm accepts such a model (its config may name the EOS ids of a larger
/// tokenizer family, e.g. Llama 3's 128001 beside a 49152-token model); generation then stops
/// only at the model's other EOS ids or at `max_tokens`, so the loader says so.
pub fn eos_outside_vocab(model: &dyn LanguageModel, tokenizer: &Tokenizer) -> Option<String> {
    let vocab = model.vocab_size();
    let out: Vec<String> = tokenizer
        .eos_token_ids()
        .iter()
        .filter(|&&e| i64::from(e) >= i64::from(vocab))
        .map(|e| e.to_string())
        .collect();
    (!out.is_empty()).then(|| {
        format!(
            "warning: EOS token id {} (from config.json `eos_token_id` or the tokenizer's \
             eos_token) is outside the model's vocabulary of {vocab} tokens: the model can never \
             produce it, so generation stops only at another EOS id or the token limit",
            out.join(", ")
        )
    })
}

impl<'m> TextStream<'m> {
    /// The caches after generation: they hold the prompt and every generated token.
    /// With speculative decoding, the target's caches after mlx-lm's closing rewind (see
    /// [`TextStream::into_caches`] for the draft model's too).
    pub fn into_cache(self) -> Vec<Box<dyn Cache>> {
        match self.into_caches() {
            Ok((c, _)) => c,
            Err(_) => Vec::new(),
        }
    }

    /// The target's caches and the draft model's (empty unless a draft model speculated).
    pub fn into_caches(self) -> Result<CachePair> {
        match self.steps {
            Steps::Plain(g) => Ok((g.into_cache(), Vec::new())),
            Steps::Speculative(g) => g.into_caches(),
            Steps::CpuSpeculative(_) | Steps::GraphSpeculative(_) => Ok((Vec::new(), Vec::new())),
        }
    }

    /// [`TextStream::into_caches`], with speculative decoding's caches brought up to every
    /// generated token (see [`SpeculativeStep::into_synced_caches`]); plain decoding's hold
    /// them already.
    pub fn into_synced_caches(self) -> Result<CachePair> {
        match self.steps {
            Steps::Plain(g) => Ok((g.into_cache(), Vec::new())),
            Steps::Speculative(g) => g.into_synced_caches(),
            Steps::CpuSpeculative(_) | Steps::GraphSpeculative(_) => Ok((Vec::new(), Vec::new())),
        }
    }

    /// [`TextStream::into_synced_caches`], except that plain decoding's tokens the graph
    /// decoder ran and the MLX caches do not hold yet stay pending
    /// ([`GenerateStep::into_held_cache`]): run through the MLX forward only when the caches
    /// are used.
    pub fn into_held_caches(self) -> Result<(crate::held::HeldCaches, Vec<Box<dyn Cache>>)> {
        match self.steps {
            Steps::Plain(g) => Ok((g.into_held_cache(), Vec::new())),
            Steps::Speculative(g) => {
                let (c, d) = g.into_synced_caches()?;
                Ok((crate::held::HeldCaches::synced(c), d))
            }
            Steps::CpuSpeculative(_) | Steps::GraphSpeculative(_) => {
                Ok((crate::held::HeldCaches::synced(Vec::new()), Vec::new()))
            }
        }
    }

    /// Why the graph decoder handed the run to the MLX path, if it did (see
    /// [`GenerateStep::graph_fallback`]).
    pub fn graph_fallback(&self) -> Option<&str> {
        match &self.steps {
            Steps::Plain(g) => g.graph_fallback(),
            Steps::Speculative(_) | Steps::CpuSpeculative(_) | Steps::GraphSpeculative(_) => None,
        }
    }

    /// The peak reported with each response, the process's since start (or MLX's last reset)
    /// as mlx-lm reports `mx.get_peak_memory()`: MLX's peak, or where a graph decoder held
    /// device buffers outside MLX's allocator (its cache, its step buffers) in this or an
    /// earlier generation, the most held with them at once when that is more
    /// ([`GenerateStep::device_peak`]; a speculative graph pair's the same way,
    /// [`crate::graph_speculative::GraphSpecSteps::device_peak`];
    /// [`memory::device_peak_memory`]).
    fn peak_memory_bytes(&self) -> Result<usize> {
        let run = match &self.steps {
            Steps::Plain(g) => g.device_peak()?.unwrap_or(0),
            Steps::GraphSpeculative(g) => g.device_peak()?,
            Steps::Speculative(_) | Steps::CpuSpeculative(_) => 0,
        };
        memory::note_device_peak(run);
        Ok(memory::device_peak_memory()?)
    }

    /// Device bytes this generation's graph decoder held outside MLX's allocator (see
    /// [`GenerateStep::graph_device_bytes`]); 0 without one.
    pub fn graph_device_bytes(&self) -> usize {
        match &self.steps {
            Steps::Plain(g) => g.graph_device_bytes(),
            Steps::GraphSpeculative(g) => g.device_bytes(),
            Steps::Speculative(_) | Steps::CpuSpeculative(_) => 0,
        }
    }

    /// The graph decoder's construction times when this generation built one (see
    /// [`GenerateStep::graph_build_times`]).
    pub fn graph_build_times(&self) -> Option<mlx_kernels::graph_decode::BuildTimes> {
        match &self.steps {
            Steps::Plain(g) => g.graph_build_times(),
            Steps::Speculative(_) | Steps::CpuSpeculative(_) | Steps::GraphSpeculative(_) => None,
        }
    }

    /// Speculative decoding's acceptance statistics (`None` for plain decoding).
    pub fn spec_stats(&self) -> Option<SpecStats> {
        match &self.steps {
            Steps::Plain(_) => None,
            Steps::Speculative(g) => Some(g.stats()),
            Steps::CpuSpeculative(g) => Some(g.stats()),
            Steps::GraphSpeculative(g) => Some(g.stats()),
        }
    }

    /// The CPU decoder that ran this generation (`None` on the MLX path), see
    /// [`GenerateStep::into_cpu_decoder`].
    pub fn into_cpu_decoder(self) -> Option<CpuDecoder<'m>> {
        match self.steps {
            Steps::Plain(g) => g.into_cpu_decoder(),
            Steps::Speculative(_) | Steps::GraphSpeculative(_) => None,
            Steps::CpuSpeculative(g) => Some(g.into_decoder().0),
        }
    }

    /// Speculation on the CPU decoder: the decoder and the tokens its cache holds, as plain
    /// decoding would leave them after the tokens streamed so far (see
    /// [`CpuSpecSteps::into_decoder`]); what [`stream_generate_cpu_speculative_with`]
    /// continues. `None` for other generations.
    pub fn into_cpu_speculation(self) -> Option<(CpuDecoder<'m>, Vec<u32>)> {
        match self.steps {
            Steps::CpuSpeculative(g) => Some(g.into_decoder()),
            _ => None,
        }
    }

    /// Whether this generation runs through the CPU decoder.
    pub fn uses_cpu_decoder(&self) -> bool {
        match &self.steps {
            Steps::Plain(g) => g.uses_cpu_decoder(),
            Steps::Speculative(_) | Steps::GraphSpeculative(_) => false,
            Steps::CpuSpeculative(_) => true,
        }
    }

    /// Tokens at the head of the prompt that a kept graph decoder held already and this
    /// generation did not run again ([`GenerateStep::prompt_reused`]: a conversation's
    /// earlier turns on a trellis model); 0 for every other generation.
    pub fn prompt_reused(&self) -> usize {
        self.steps.prompt_reused()
    }

    /// The tokens generated so far (without a final EOS token).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The EOS token that ended generation, if one did.
    pub fn eos_token(&self) -> Option<u32> {
        self.eos
    }

    /// Every token the caches hold after `prompt`: the generated tokens and the EOS token
    /// (mlx-lm's pipelined decode runs the model on it before stopping).
    /// With speculative decoding, the generated tokens the target's cache keeps after the
    /// rewind (a token the target produced is in the cache only once verified past).
    pub fn cached_tokens(&self) -> Vec<u32> {
        let all = self.tokens.iter().copied().chain(self.eos);
        match &self.steps {
            Steps::Plain(_) => all.collect(),
            Steps::Speculative(g) => all.take(g.cached_generated()).collect(),
            Steps::CpuSpeculative(_) | Steps::GraphSpeculative(_) => Vec::new(),
        }
    }

    fn response(
        &self,
        text: String,
        token: Option<u32>,
        logprob: Option<f32>,
        top: Vec<(u32, f32)>,
        finish: Option<FinishReason>,
    ) -> Result<GenerationResponse> {
        Ok(GenerationResponse {
            text,
            token,
            logprob,
            top_logprobs: top,
            prompt_tokens: self.prompt_tokens,
            prompt_tps: self.prompt_tps,
            generation_tokens: self.tail.generated(),
            generation_tps: self.generation_tps,
            peak_memory_bytes: self.peak_memory_bytes()?,
            finish_reason: finish,
            from_draft: self.from_draft,
        })
    }

    fn advance(&mut self) -> Result<Option<GenerationResponse>> {
        if self.done {
            return Ok(None);
        }
        let step = match self.steps.next() {
            Some(s) => s?,
            None => {
                // `generate_step` ends only at `max_tokens`, where the stream has already
                // finished; kept for safety.
                self.done = true;
                let text = self.tail.end()?;
                return self
                    .response(text, None, None, Vec::new(), Some(FinishReason::Length))
                    .map(Some);
            }
        };
        self.from_draft = step.from_draft;
        let now = Instant::now();
        if self.first.is_none() {
            let dt = now.duration_since(self.start).as_secs_f64();
            self.prompt_tps = self.prompt_tokens as f64 / dt.max(f64::MIN_POSITIVE);
            self.first = Some(now);
        }
        // A step that carries its token's log-probability and no top log-probabilities asked
        // for builds no graph.
        let (logprob, top) = token_logprobs(
            &step.logprobs,
            step.logprob,
            step.token,
            self.opts.top_logprobs,
        )?;
        let eos = self.tokenizer.eos_token_ids().contains(&step.token);
        let tail = self.tail.step(step.token, eos)?;
        if let Some(t0) = self.first {
            // Timed here, after the token's own work, as mlx-lm times it where it yields: the
            // first token's rate is then a measured (large) figure, not tokens over zero.
            self.generation_tps =
                self.tail.generated() as f64 / t0.elapsed().as_secs_f64().max(f64::MIN_POSITIVE);
        }
        let (text, finish) = match tail {
            // The EOS token is not detokenized; the final response carries it.
            Tail::Eos { text } => {
                self.eos = Some(step.token);
                (text, Some(FinishReason::Stop))
            }
            // `rest` is empty under `Chunking::Stream`.
            Tail::Token { text, finish, .. } => {
                self.tokens.push(step.token);
                (text, finish)
            }
        };
        self.done = finish.is_some();
        self.response(text, Some(step.token), Some(logprob), top, finish)
            .map(Some)
    }
}

impl Iterator for TextStream<'_> {
    type Item = Result<GenerationResponse>;

    fn next(&mut self) -> Option<Result<GenerationResponse>> {
        match self.advance() {
            Ok(Some(r)) => Some(Ok(r)),
            Ok(None) => None,
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

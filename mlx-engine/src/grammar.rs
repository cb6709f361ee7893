//! Constrained decoding (structured output) through `llguidance`, the grammar engine llama.cpp
//! and vLLM use: a JSON schema, "any JSON object", or a Lark grammar becomes a [`Grammar`]
//! whose mask is applied to the logits before sampling, so every sampled token keeps the output
//! inside the grammar, and an EOS token is allowed only where the grammar accepts.
//!
//! - [`GrammarCompiler`]: built once per tokenizer (it holds `llguidance`'s token trie over
//!   every token id's bytes, see [`token_bytes`], and its pre-computed token slices); compiles
//!   a [`GrammarSpec`] into a fresh [`Grammar`]. Errors carry `llguidance`'s message.
//! - [`Grammar`]: one generation's parser state. [`Grammar::mask_logits`] masks `(1, vocab)`
//!   or `(vocab,)` logits (disallowed tokens to `-inf`), [`Grammar::commit`] advances it by the
//!   sampled token. Cloning gives an independent copy (a fresh grammar per request).
//!
//! The decoders apply it in the same place: `generate_step` (the MLX path, the compiled step
//! and the CPU decoder all sample through `sample_logits`) and the batch engine, per row.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use mlx_core::prelude::*;
use serde_json::{json, Value};

use crate::error::{EngineError, Result};
use crate::tokenizer::Tokenizer;
use crate::tokenizer_stream::{byte_decoder, spm_token_bytes, DetokenizerKind};

/// What the output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (OpenAI's `{"type": "json_object"}`).
    JsonObject,
    /// A JSON value valid against this JSON schema.
    JsonSchema(Value),
    /// A grammar in `llguidance`'s Lark dialect (which may embed `%json {schema}`).
    Lark(String),
}

/// The JSON layout constrained output uses unless a schema's own `x-guidance` says otherwise:
/// no free whitespace, `", "` and `": "` between items (Python's `json.dumps`). Free
/// whitespace would let a model spin in blanks until `max_tokens`.
fn json_layout() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// `schema` with the default layout added (objects only; a boolean schema stays as it is).
pub fn with_layout(schema: &Value) -> Value {
    let mut s = schema.clone();
    if let Some(o) = s.as_object_mut() {
        o.entry("x-guidance").or_insert_with(json_layout);
    }
    s
}

impl GrammarSpec {
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(with_layout(&json!({"type": "object"})))
            }
            GrammarSpec::JsonSchema(s) => TopLevelGrammar::from_json_schema(with_layout(s)),
            GrammarSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        }
    }
}

/// The bytes each token id stands for, as `llguidance`'s trie wants them: byte-level BPE
/// tokens through GPT-2's byte map, SentencePiece tokens with `▁` as a space and `<0xNN>`
/// byte-fallback tokens as that byte, other tokens as their text; special added tokens as
/// `0xFF` followed by their text (`llguidance`'s marker: grammar text never matches them);
/// ids past the tokenizer (a model's padded vocabulary) as nothing (never allowed).
pub fn token_bytes(tokenizer: &Tokenizer, vocab: usize) -> Vec<Vec<u8>> {
    let backend = tokenizer.backend();
    let added = backend.get_added_tokens_decoder();
    let kind = tokenizer.detokenizer_kind();
    (0..vocab)
        .map(|id| {
            let id = id as u32;
            if let Some(t) = added.get(&id) {
                if t.special {
                    let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    b.extend_from_slice(t.content.as_bytes());
                    return b;
                }
                return t.content.as_bytes().to_vec();
            }
            let Some(t) = backend.id_to_token(id) else {
                return Vec::new();
            };
            match kind {
                DetokenizerKind::Bpe => t
                    .chars()
                    .map(byte_decoder)
                    .collect::<Option<Vec<u8>>>()
                    .unwrap_or_else(|| t.as_bytes().to_vec()),
                DetokenizerKind::Spm { .. } => {
                    let b = spm_token_bytes(&t);
                    if b.len() == 1 && t.starts_with("<0x") {
                        b
                    } else {
                        t.replace('\u{2581}', " ").into_bytes()
                    }
                }
                DetokenizerKind::Naive => t.into_bytes(),
            }
        })
        .collect()
}

/// Compiles grammars for one tokenizer and model vocabulary. Build it once: making the token
/// trie and `llguidance`'s slices walks the whole vocabulary.
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
    vocab: usize,
    eos: Arc<[u32]>,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field("vocab", &self.vocab)
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

/// A schema or grammar [`GrammarCompiler::compile`] refuses: `llguidance`'s message (the
/// schema's own words: where in it and what is wrong).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidGrammar(pub String);

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

impl GrammarCompiler {
    /// The compiler for `tokenizer` and a model of `vocab` logits. The tokenizer needs an EOS
    /// token inside the vocabulary: it is how a constrained generation ends.
    pub fn new(tokenizer: &Tokenizer, vocab: usize) -> Result<Self> {
        let eos: Vec<u32> = tokenizer
            .eos_token_ids()
            .iter()
            .copied()
            .filter(|&e| (e as usize) < vocab)
            .collect();
        let Some(&first) = eos.first() else {
            return Err(EngineError::Grammar {
                problem:
                    "needs an EOS token inside the model's vocabulary, and this tokenizer has none"
                        .into(),
            });
        };
        if vocab == 0 || vocab > u32::MAX as usize {
            return Err(EngineError::Grammar {
                problem: format!("a vocabulary of {vocab} tokens is not supported"),
            });
        }
        if tokenizer.is_decoding_only() {
            // Its backend (the added tokens, the vocabulary) is gone: the trie would allow
            // nothing.
            return Err(EngineError::Grammar {
                problem: "the tokenizer keeps only its decoding table \
                          (Tokenizer::keep_decoding_only): build the grammar before dropping it"
                    .into(),
            });
        }
        let words = token_bytes(tokenizer, vocab);
        let info = TokRxInfo::new(vocab as u32, first);
        let built = std::panic::catch_unwind(|| {
            let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos);
            let env = ApproximateTokEnv::new(trie);
            let env: Arc<dyn TokenizerEnv + Sync> = Arc::new(env);
            ParserFactory::new_simple(&env).map(|mut f| {
                f.quiet();
                f
            })
        })
        .map_err(|p| EngineError::Grammar {
            problem: format!("building the token trie failed: {}", panic_message(p)),
        })?
        .map_err(|e| EngineError::Grammar {
            problem: format!("preparing the grammar engine failed: {e}"),
        })?;
        Ok(GrammarCompiler {
            factory: Arc::new(built),
            vocab,
            eos: eos.into(),
        })
    }

    /// A fresh grammar for `spec`; an invalid schema or grammar is an error with
    /// `llguidance`'s message.
    pub fn compile(&self, spec: &GrammarSpec) -> std::result::Result<Grammar, InvalidGrammar> {
        let top = spec.top_level();
        let factory = self.factory.clone();
        let parser = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            factory.create_parser(top)
        }))
        .map_err(|p| InvalidGrammar(panic_message(p)))?
        .map_err(|e| InvalidGrammar(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(InvalidGrammar(e));
        }
        Ok(Grammar {
            matcher,
            vocab: self.vocab,
            eos: self.eos.clone(),
        })
    }

    /// The model vocabulary this compiler masks.
    pub fn vocab(&self) -> usize {
        self.vocab
    }
}

/// One generation's grammar state (see the module docs). A clone is independent, lexer caches
/// included (`Matcher::deep_clone`), so it may go to another thread.
pub struct Grammar {
    matcher: Matcher,
    vocab: usize,
    eos: Arc<[u32]>,
}

impl Clone for Grammar {
    fn clone(&self) -> Self {
        Grammar {
            matcher: self.matcher.deep_clone(),
            vocab: self.vocab,
            eos: self.eos.clone(),
        }
    }
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("vocab", &self.vocab)
            .field("stopped", &self.matcher.is_stopped())
            .finish_non_exhaustive()
    }
}

fn grammar_err(what: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::Grammar {
        problem: format!("{what}: {e}"),
    }
}

impl Grammar {
    /// The tokens allowed next: the grammar's mask, EOS only once the grammar is complete.
    pub fn allowed(&mut self) -> Result<SimpleVob> {
        let mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| grammar_err("computing the token mask", e))?;
        Ok(mask)
    }

    /// Writes the tokens allowed next into `out` (one flag per token id of the vocabulary);
    /// an error when the grammar allows none.
    pub fn fill_mask(&mut self, out: &mut [bool]) -> Result<()> {
        if out.len() != self.vocab {
            return Err(EngineError::Grammar {
                problem: format!(
                    "the logits have {} entries, the grammar was built for a vocabulary of {}",
                    out.len(),
                    self.vocab
                ),
            });
        }
        let mask = self.allowed()?;
        out.fill(false);
        let n = out.len();
        let mut any = false;
        mask.iter_set_entries(|i| {
            if i < n {
                out[i] = true;
                any = true;
            }
        });
        if !any {
            return Err(EngineError::Grammar {
                problem: "the grammar allows no token here".into(),
            });
        }
        Ok(())
    }

    /// `logits` (`(1, vocab)` or `(vocab,)`) with every token the grammar does not allow next
    /// set to `-inf`.
    pub fn mask_logits(&mut self, logits: &Array) -> Result<Array> {
        let n = logits.shape().last().copied().unwrap_or(0).max(0) as usize;
        let mut bits = vec![false; n];
        self.fill_mask(&mut bits)?;
        let mut shape = vec![1i32; logits.ndim().saturating_sub(1)];
        shape.push(n as i32);
        apply_mask(logits, &bits, &shape)
    }

    /// Advances the grammar by the sampled `token`.
    pub fn commit(&mut self, token: u32) -> Result<()> {
        if self.matcher.is_stopped() {
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| grammar_err(&format!("token {token} does not fit the grammar"), e))
    }

    /// Whether the output so far is complete under the grammar.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Whether `token` is one of the EOS tokens the grammar ends with.
    pub fn is_eos(&self, token: u32) -> bool {
        self.eos.contains(&token)
    }
}

/// `logits` where `bits` (of `shape`, broadcast against them) is set, `-inf` elsewhere.
pub fn apply_mask(logits: &Array, bits: &[bool], shape: &[i32]) -> Result<Array> {
    let cond = Array::from_slice(bits, shape)?;
    let neg = Scalar::Float(f32::NEG_INFINITY).to_array_like(logits.dtype())?;
    Ok(ops::where_(&cond, logits, &neg, None)?)
}

//! A tokenizer built from GGUF metadata (`tokenizer.ggml.*`), the way llama.cpp and transformers'
//! GGUF converter (`integrations/gguf/gguf_tokenizer_mapping.py`) build it.
//!
//! Supported: SentencePiece vocabularies (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral,
//! Gemma; see [`GgufTokenizerData::build`]), WordPiece vocabularies (`"bert"`: BERT-style
//! embedding models, see `build_wpm`), and byte-level BPE vocabularies
//! (`tokenizer.ggml.model = "gpt2"`) with the pre-tokenizers named by `tokenizer.ggml.pre`:
//!
//! | `pre` | split |
//! | --- | --- |
//! | `gpt2`, `default`, `smollm` | GPT-2's byte-level regex |
//! | `llama3`, `llama-v3`, `llama-bpe`, `falcon3`, `falcon-h1`, `pixtral`, `midm-2.0`, `lfm2`, `jina-v5-nano`, `dbrx`, `smaug-bpe` | the Llama 3 regex, with whole-word vocabulary hits taking precedence over merges (llama.cpp's `ignore_merges`) |
//! | `qwen2`, `deepseek-r1-qwen`, `kormo`, `f2llmv2`, `megrez` | the Qwen2 regex |
//! | `qwen35` | the Qwen 3.5 regex |
//! | `tekken` | Mistral's Tekken regex |
//! | `gpt-4o`, `llama4`, `kanana2`, `talkie`, `minimax-m2` | the GPT-4o (o200k) regex |
//!
//! Tokens of type 3 (control) become special added tokens, tokens of type 4 (user-defined) plain
//! added tokens, neither normalized; a control token spelled outside the byte-level alphabet is a
//! llama.cpp mislabel and is skipped, as transformers does. The decoder is byte-level. BOS/EOS are
//! added on encode as `add_bos`/`add_eos` say; when `add_bos` is absent it defaults to llama.cpp's
//! choice (on for the Llama 3 family, off otherwise).
//!
//! Like llama.cpp and transformers' converter, no Unicode normalizer is applied (the Qwen2
//! `tokenizer.json` has NFC, which a GGUF does not record). Unlike transformers, no
//! `<|endoftext|>` default is invented when the file names no such token.
//!
//! `smollm` follows transformers' converter (what mlx-lm users get), not llama.cpp: llama.cpp
//! (like SmolLM's original `tokenizer.json`, which has a `Digits` pre-tokenizer) splits every
//! `\p{N}` off before GPT-2's regex, but transformers' converter has no `smollm` entry and keeps
//! GPT2Tokenizer's plain byte-level pre-tokenizer. For SmolLM2's vocabulary (no token holds a
//! digit next to anything else) this only shows in whitespace runs just before a digit: `"a   1"`
//! is `a|ĠĠ|Ġ|1` here and in transformers, `a|ĠĠĠ|1` in llama.cpp. The Llama 3 family, in
//! contrast, keeps llama.cpp's (and the original `tokenizer.json`'s) `ignore_merges`, which
//! transformers' converter leaves off; the two differ on some whole words (`" việc"`).

use serde_json::{Map, Value};
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use mlx_core::io::{GgufMetadata, GgufValue};
use mlx_core::prelude::*;

use crate::chat_template::ChatTemplates;
use crate::tokenizer::{Result, Tokenizer, TokenizerError};
use crate::tokenizer_stream::byte_to_unicode;

/// A scalar metadata value as `f64` (the same reading as `mlx_models::gguf::meta_f64`).
fn meta_f64(meta: &GgufMetadata, key: &str) -> Option<f64> {
    match meta.get(key) {
        Some(GgufValue::Array(a)) if a.size() == 1 => {
            a.astype(Dtype::Float64).ok()?.item::<f64>().ok()
        }
        _ => None,
    }
}

/// A metadata string.
fn meta_str<'a>(meta: &'a GgufMetadata, key: &str) -> Option<&'a str> {
    match meta.get(key) {
        Some(GgufValue::String(s)) => Some(s),
        _ => None,
    }
}

/// The tokenizer part of a GGUF file's metadata.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GgufTokenizerData {
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE) or `"llama"` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer name.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type` (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
    /// 6 byte).
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges`, each `"left right"`.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.scores` (SentencePiece vocabularies: each piece's score, which orders
    /// the merges).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece: prepend `▁` to the text).
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
    /// `tokenizer.ggml.cls_token_id` (WordPiece: the BOS of an encoded text).
    pub cls_id: Option<u32>,
    /// `tokenizer.ggml.seperator_token_id` (sic; WordPiece: the EOS of an encoded text).
    pub sep_id: Option<u32>,
    /// `tokenizer.ggml.mask_token_id`.
    pub mask_id: Option<u32>,
    /// `tokenizer.ggml.normalizer.lowercase` (WordPiece; llama.cpp's default: true).
    pub lowercase: Option<bool>,
    /// `tokenizer.ggml.normalizer.strip_accents` (WordPiece; llama.cpp's default: as
    /// `lowercase`).
    pub strip_accents: Option<bool>,
}

const LLAMA3_SPLIT: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

const QWEN2_SPLIT: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// transformers' `_TEKKEN_SPLIT` (Mistral's Tekken vocabularies).
const TEKKEN_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// transformers' `_GPT4O_SPLIT` (o200k-style: GPT-4o, Llama 4, MiniMax M2, ...).
const GPT4O_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// transformers' Qwen 3.5 `PRETOKENIZE_REGEX`.
const QWEN35_SPLIT: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}",
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// The pre-tokenizer families this builder knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PreKind {
    Gpt2,
    Llama3,
    /// transformers' `set_split_regex`: this regex, then a byte-level step without its own.
    Split(&'static str),
}

const PRE_NAMES: &[(&str, PreKind)] = &[
    ("gpt2", PreKind::Gpt2),
    ("default", PreKind::Gpt2),
    // transformers' converter has no `smollm` entry: GPT-2's pre-tokenizer (see the module docs).
    ("smollm", PreKind::Gpt2),
    ("llama3", PreKind::Llama3),
    ("llama-v3", PreKind::Llama3),
    ("llama-bpe", PreKind::Llama3),
    ("falcon3", PreKind::Llama3),
    ("falcon-h1", PreKind::Llama3),
    ("pixtral", PreKind::Llama3),
    ("midm-2.0", PreKind::Llama3),
    ("lfm2", PreKind::Llama3),
    ("jina-v5-nano", PreKind::Llama3),
    ("dbrx", PreKind::Llama3),
    ("smaug-bpe", PreKind::Llama3),
    ("qwen2", PreKind::Split(QWEN2_SPLIT)),
    ("deepseek-r1-qwen", PreKind::Split(QWEN2_SPLIT)),
    ("kormo", PreKind::Split(QWEN2_SPLIT)),
    ("f2llmv2", PreKind::Split(QWEN2_SPLIT)),
    ("megrez", PreKind::Split(QWEN2_SPLIT)),
    ("tekken", PreKind::Split(TEKKEN_SPLIT)),
    ("qwen35", PreKind::Split(QWEN35_SPLIT)),
    ("gpt-4o", PreKind::Split(GPT4O_SPLIT)),
    ("llama4", PreKind::Split(GPT4O_SPLIT)),
    ("kanana2", PreKind::Split(GPT4O_SPLIT)),
    ("talkie", PreKind::Split(GPT4O_SPLIT)),
    ("minimax-m2", PreKind::Split(GPT4O_SPLIT)),
];

/// The `pre` names [`GgufTokenizerData::build`] supports.
pub fn supported_pre_tokenizers() -> Vec<&'static str> {
    PRE_NAMES.iter().map(|(n, _)| *n).collect()
}

fn split(pattern: &str) -> Result<PreTokenizerWrapper> {
    let s = Split::new(
        SplitPattern::Regex(pattern.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| TokenizerError::Backend(format!("pre-tokenizer regex: {e}")))?;
    Ok(PreTokenizerWrapper::Split(s))
}

impl PreKind {
    fn pre_tokenizer(self) -> Result<PreTokenizerWrapper> {
        Ok(match self {
            // GPT2Tokenizer: ByteLevel(add_prefix_space=False) with its own regex.
            Self::Gpt2 => PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
            Self::Llama3 => PreTokenizerWrapper::Sequence(Sequence::new(vec![
                split(LLAMA3_SPLIT)?,
                PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)),
            ])),
            Self::Split(regex) => PreTokenizerWrapper::Sequence(Sequence::new(vec![
                split(regex)?,
                PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)),
            ])),
        })
    }
}

/// Whether every character of `token` is in GPT-2's byte-level alphabet.
fn is_byte_level_spelled(token: &str, alphabet: &std::collections::HashSet<char>) -> bool {
    token.chars().all(|c| alphabet.contains(&c))
}

impl GgufTokenizerData {
    /// `tokenizer.ggml.token_type`, one per token (all normal where the file has none).
    fn token_types(&self) -> Result<Vec<i32>> {
        let n = self.tokens.len();
        match &self.token_types {
            Some(t) if t.len() == n => Ok(t.clone()),
            Some(t) => Err(TokenizerError::Invalid(format!(
                "GGUF token_type has {} entries for {n} tokens",
                t.len()
            ))),
            None => Ok(vec![1; n]),
        }
    }

    /// An error naming the first special token id outside the vocabulary.
    fn check_ids(&self, ids: &[(&str, Option<u32>)]) -> Result<()> {
        let n = self.tokens.len();
        match ids
            .iter()
            .find(|(_, id)| id.is_some_and(|id| id as usize >= n))
        {
            Some((what, Some(id))) => Err(TokenizerError::Invalid(format!(
                "GGUF {what} token id {id} is outside the vocabulary of {n} tokens"
            ))),
            _ => Ok(()),
        }
    }

    /// Builds the tokenizer. Errors name what is unsupported or inconsistent.
    pub fn build(&self) -> Result<Tokenizer> {
        if self.model == "llama" {
            return self.build_spm();
        }
        if self.model == "bert" {
            return self.build_wpm();
        }
        if self.model != "gpt2" {
            return Err(TokenizerError::Invalid(format!(
                "GGUF tokenizer model {:?} is not supported; supported: [\"gpt2\"] \
                 (byte-level BPE), [\"llama\"] (SentencePiece), [\"bert\"] (WordPiece)",
                self.model
            )));
        }
        let pre_name = self.pre.as_deref().unwrap_or("default");
        let kind = PRE_NAMES
            .iter()
            .find(|(n, _)| *n == pre_name)
            .map(|(_, k)| *k)
            .ok_or_else(|| {
                TokenizerError::Invalid(format!(
                    "GGUF pre-tokenizer {pre_name:?} is not supported; supported: {:?}",
                    supported_pre_tokenizers()
                ))
            })?;
        let n = self.tokens.len();
        self.token_types()?;
        self.check_ids(&[
            ("bos", self.bos_id),
            ("eos", self.eos_id),
            ("unk", self.unk_id),
            ("pad", self.pad_id),
        ])?;

        // transformers' byte_level_tokenizer: tokens spelled outside the byte alphabet are
        // re-spelled byte by byte.
        let alphabet: std::collections::HashSet<char> = (0..=255u8).map(byte_to_unicode).collect();
        let mut vocab: Vec<(String, u32)> = Vec::with_capacity(n);
        for (i, t) in self.tokens.iter().enumerate() {
            let spelled = if is_byte_level_spelled(t, &alphabet) {
                t.clone()
            } else {
                t.bytes().map(byte_to_unicode).collect()
            };
            // A later duplicate wins, as in a Python dict comprehension.
            vocab.push((spelled, i as u32));
        }
        let mut merges: Vec<(String, String)> = Vec::with_capacity(self.merges.len());
        for m in &self.merges {
            let mut parts = m.split(' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(a), Some(b), None) => merges.push((a.to_string(), b.to_string())),
                _ => {
                    return Err(TokenizerError::Invalid(format!(
                        "GGUF merge {m:?} is not two tokens separated by one space"
                    )))
                }
            }
        }
        let bpe = BPE::builder()
            .vocab_and_merges(
                vocab
                    .into_iter()
                    .collect::<tokenizers::models::bpe::Vocab>(),
                merges,
            )
            .ignore_merges(kind == PreKind::Llama3)
            // GPT2Tokenizer's BPE spells these as empty strings (no effect on tokenization).
            .continuing_subword_prefix(String::new())
            .end_of_word_suffix(String::new())
            .build()
            .map_err(|e| TokenizerError::Backend(format!("building BPE: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(kind.pre_tokenizer()?));
        inner.with_decoder(Some(ByteLevel::default()));

        if let Some(types) = &self.token_types {
            let control: Vec<AddedToken> = self
                .tokens
                .iter()
                .zip(types)
                .filter(|(t, ty)| **ty == 3 && is_byte_level_spelled(t, &alphabet))
                .map(|(t, _)| AddedToken::from(t.clone(), true).normalized(false))
                .collect();
            if !control.is_empty() {
                inner
                    .add_special_tokens(control)
                    .map_err(|e| TokenizerError::Backend(format!("adding control tokens: {e}")))?;
            }
            let user: Vec<AddedToken> = self
                .tokens
                .iter()
                .zip(types)
                .filter(|(t, ty)| **ty == 4 && inner.token_to_id(t).is_some())
                .map(|(t, _)| AddedToken::from(t.clone(), false).normalized(false))
                .collect();
            if !user.is_empty() {
                inner.add_tokens(user).map_err(|e| {
                    TokenizerError::Backend(format!("adding user-defined tokens: {e}"))
                })?;
            }
        }

        self.finish(inner, &self.tokens, kind == PreKind::Llama3)
    }

    /// The tokenizer around `inner`: the special tokens named by id (spelled as in `names`),
    /// BOS/EOS as the file says (BOS by `add_bos_default` when it says nothing), the chat
    /// template.
    fn finish(
        &self,
        inner: tokenizers::Tokenizer,
        names: &[String],
        add_bos_default: bool,
    ) -> Result<Tokenizer> {
        let token = |id: Option<u32>| -> Value {
            id.and_then(|i| names.get(i as usize))
                .map_or(Value::Null, |t| Value::String(t.clone()))
        };
        let mut config = Map::new();
        config.insert("bos_token".into(), token(self.bos_id));
        config.insert("eos_token".into(), token(self.eos_id));
        config.insert("unk_token".into(), token(self.unk_id));
        config.insert("pad_token".into(), token(self.pad_id));
        config.insert(
            "add_bos_token".into(),
            Value::Bool(self.add_bos.unwrap_or(add_bos_default)),
        );
        config.insert(
            "add_eos_token".into(),
            Value::Bool(self.add_eos.unwrap_or(false)),
        );
        if self.model == "bert" {
            // BertTokenizer's default: transformers' clean-up of spaces before punctuation.
            config.insert("clean_up_tokenization_spaces".into(), Value::Bool(true));
        }
        let mut tok = Tokenizer::from_parts(inner, &config, &[])?;
        if let Some(t) = &self.chat_template {
            tok.set_chat_template(Some(ChatTemplates::Single(t.clone())));
            tok.set_chat_template_origin("GGUF metadata `tokenizer.chat_template`");
        }
        Ok(tok)
    }
}

impl GgufTokenizerData {
    /// A SentencePiece vocabulary as transformers' GGUF converters build it: a BPE over the
    /// pieces with byte fallback and `<unk>` fused, its merges derived from the pieces'
    /// scores (every split of a piece into two pieces, ranked by the merged piece's score),
    /// spaces written `▁` by the normalizer (after a `▁` prefix when `add_space_prefix`), a
    /// decoder that undoes that. Gemma's GGUF files spell runs of spaces with spaces where its
    /// tokenizer has `▁`s; they are re-spelled, as transformers' Gemma converter does. The
    /// user-defined pieces (type 4: runs of spaces, tabs and newlines, HTML tags) merge
    /// first, the longest first, as SentencePiece matches them before its merges (this gives
    /// Gemma 3's `tokenizer.json`'s ids: the same merges, ranked where they matter).
    fn build_spm(&self) -> Result<Tokenizer> {
        use std::collections::{HashMap, HashSet};
        use tokenizers::decoders::byte_fallback::ByteFallback;
        use tokenizers::decoders::fuse::Fuse;
        use tokenizers::decoders::sequence::Sequence as DecoderSequence;
        use tokenizers::decoders::strip::Strip;
        use tokenizers::normalizers::prepend::Prepend;
        use tokenizers::normalizers::replace::Replace;
        use tokenizers::normalizers::utils::Sequence as NormalizerSequence;
        use tokenizers::{DecoderWrapper, NormalizerWrapper};

        let bad = |m: String| TokenizerError::Invalid(m);
        let n = self.tokens.len();
        let scores = self.scores.as_ref().ok_or_else(|| {
            bad("GGUF SentencePiece vocabulary has no tokenizer.ggml.scores".into())
        })?;
        if scores.len() != n {
            return Err(bad(format!(
                "GGUF tokenizer.ggml.scores has {} entries for {n} tokens",
                scores.len()
            )));
        }
        if let Some(i) = scores.iter().position(|s| !s.is_finite()) {
            return Err(bad(format!(
                "GGUF tokenizer.ggml.scores[{i}] is {} (not a finite number)",
                scores[i]
            )));
        }
        let types = self.token_types()?;
        self.check_ids(&[
            ("bos", self.bos_id),
            ("eos", self.eos_id),
            ("unk", self.unk_id),
            ("pad", self.pad_id),
        ])?;
        let pieces: Vec<String> = self
            .tokens
            .iter()
            .map(|t| {
                if !t.is_empty() && t.chars().all(|c| c == ' ') {
                    "\u{2581}".repeat(t.chars().count())
                } else {
                    t.clone()
                }
            })
            .collect();
        let mut vocab: HashMap<String, u32> = HashMap::with_capacity(n);
        let mut score_of: HashMap<&str, f32> = HashMap::with_capacity(n);
        for (i, p) in pieces.iter().enumerate() {
            // A later duplicate wins, as in a Python dict comprehension.
            vocab.insert(p.clone(), i as u32);
            score_of.insert(p.as_str(), scores[i]);
        }
        let user: HashSet<&str> = pieces
            .iter()
            .zip(&types)
            .filter(|(_, t)| **t == 4)
            .map(|(p, _)| p.as_str())
            .collect();
        // transformers' `GGUFTokenizerSkeleton` merges: per piece (in vocabulary order), every
        // split whose halves are pieces, ranked by the halves' scores; then all by the merged
        // piece's score (stable sorts, as Python's).
        let mut merges: Vec<(&str, &str, f32)> = Vec::new();
        let mut seen: HashSet<&str> = HashSet::with_capacity(n);
        for p in &pieces {
            if !seen.insert(p.as_str()) {
                continue;
            }
            let score = score_of[p.as_str()];
            let start = merges.len();
            for (k, _) in p.char_indices().skip(1) {
                let (l, r) = p.split_at(k);
                if score_of.contains_key(l) && score_of.contains_key(r) {
                    merges.push((l, r, score));
                }
            }
            merges[start..].sort_by(|a, b| {
                let key = |m: &(&str, &str, f32)| (score_of[m.0], score_of[m.1]);
                key(b)
                    .partial_cmp(&key(a))
                    .unwrap_or(std::cmp::Ordering::Equal)
            });
        }
        let (mut first, mut rest): (Vec<_>, Vec<_>) = merges
            .into_iter()
            .partition(|(l, r, _)| user.contains(format!("{l}{r}").as_str()));
        first.sort_by(|a, b| {
            let key = |m: &(&str, &str, f32)| (m.0.len() + m.1.len(), m.0.len());
            key(b).cmp(&key(a))
        });
        rest.sort_by(|a, b| b.2.partial_cmp(&a.2).unwrap_or(std::cmp::Ordering::Equal));
        let merges: Vec<(String, String)> = first
            .into_iter()
            .chain(rest)
            .map(|(l, r, _)| (l.to_string(), r.to_string()))
            .collect();

        let mut builder = BPE::builder()
            .vocab_and_merges(
                vocab
                    .into_iter()
                    .collect::<tokenizers::models::bpe::Vocab>(),
                merges,
            )
            .fuse_unk(true)
            .byte_fallback(true);
        if let Some(unk) = self.unk_id.and_then(|i| pieces.get(i as usize)) {
            builder = builder.unk_token(unk.clone());
        }
        let bpe = builder
            .build()
            .map_err(|e| TokenizerError::Backend(format!("building BPE: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        let space_prefix = self.add_space_prefix.unwrap_or(true);
        let replace = |from: &str, to: &str| {
            Replace::new(from, to)
                .map_err(|e| TokenizerError::Backend(format!("building a Replace: {e}")))
        };
        let spaces = NormalizerWrapper::Replace(replace(" ", "\u{2581}")?);
        inner
            .with_normalizer(Some(if space_prefix {
                NormalizerWrapper::Sequence(NormalizerSequence::new(vec![
                    NormalizerWrapper::Prepend(Prepend::new("\u{2581}".into())),
                    spaces,
                ]))
            } else {
                spaces
            }))
            .map_err(|e| TokenizerError::Backend(format!("setting the normalizer: {e}")))?;
        if !space_prefix {
            // Gemma's tokenizer.json splits on spaces (a no-op once they are `▁`s).
            inner.with_pre_tokenizer(Some(PreTokenizerWrapper::Split(
                Split::new(
                    SplitPattern::String(" ".into()),
                    SplitDelimiterBehavior::MergedWithPrevious,
                    false,
                )
                .map_err(|e| TokenizerError::Backend(format!("building a Split: {e}")))?,
            )));
        }
        let mut decoders = vec![
            DecoderWrapper::Replace(replace("\u{2581}", " ")?),
            DecoderWrapper::ByteFallback(ByteFallback::new()),
            DecoderWrapper::Fuse(Fuse::new()),
        ];
        if space_prefix {
            decoders.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
        }
        inner.with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(
            decoders,
        ))));

        let added = |ty: i32, special: bool| -> Vec<AddedToken> {
            pieces
                .iter()
                .zip(&types)
                .filter(|(_, t)| **t == ty)
                .map(|(p, _)| AddedToken::from(p.clone(), special).normalized(false))
                .collect()
        };
        let control = added(3, true);
        if !control.is_empty() {
            inner
                .add_special_tokens(control)
                .map_err(|e| TokenizerError::Backend(format!("adding control tokens: {e}")))?;
        }
        let user_tokens = added(4, false);
        if !user_tokens.is_empty() {
            inner
                .add_tokens(user_tokens)
                .map_err(|e| TokenizerError::Backend(format!("adding user-defined tokens: {e}")))?;
        }

        // llama.cpp adds BOS for SentencePiece vocabularies unless the file says otherwise.
        self.finish(inner, &pieces, true)
    }
}

impl GgufTokenizerData {
    /// A WordPiece vocabulary (`tokenizer.ggml.model = "bert"`: BERT-style embedding models)
    /// as transformers' `BertTokenizerFast` runs the original: `BertNormalizer` (lower case and
    /// accents stripped as llama.cpp's `tokenizer.ggml.normalizer.*` keys say, both on when
    /// absent, as llama.cpp defaults), `BertPreTokenizer`, WordPiece with `##` continuations
    /// and `[CLS] text [SEP]` around an encoded text. llama.cpp's converter writes the
    /// vocabulary in "phantom space" form (a word-initial piece `x` as `▁x`, a continuation
    /// `##x` as `x`; control tokens, and with older converters every `[...]` token, kept);
    /// that is undone here.
    fn build_wpm(&self) -> Result<Tokenizer> {
        use tokenizers::decoders::wordpiece::WordPiece as WordPieceDecoder;
        use tokenizers::models::wordpiece::WordPiece;
        use tokenizers::normalizers::bert::BertNormalizer;
        use tokenizers::pre_tokenizers::bert::BertPreTokenizer;

        let types = self.token_types()?;
        let cls = self.cls_id.or(self.bos_id);
        let sep = self.sep_id.or(self.eos_id);
        self.check_ids(&[
            ("cls", cls),
            ("seperator", sep),
            ("mask", self.mask_id),
            ("unk", self.unk_id),
            ("pad", self.pad_id),
        ])?;
        let words: Vec<String> = self
            .tokens
            .iter()
            .zip(&types)
            .map(|(t, ty)| {
                if *ty == 3 || (t.starts_with('[') && t.ends_with(']') && t.len() > 1) {
                    t.clone()
                } else if let Some(w) = t.strip_prefix('\u{2581}') {
                    w.to_string()
                } else {
                    format!("##{t}")
                }
            })
            .collect();
        let mut vocab = Map::new();
        for (i, w) in words.iter().enumerate() {
            // A later duplicate wins, as in a Python dict.
            vocab.insert(w.clone(), Value::from(i as u32));
        }
        let unk = self
            .unk_id
            .and_then(|i| words.get(i as usize))
            .cloned()
            .unwrap_or_else(|| "[UNK]".to_string());
        // The crate's builder wants its own hash map type; its serialized form is public.
        let model_json = serde_json::json!({
            "type": "WordPiece",
            "unk_token": unk,
            "continuing_subword_prefix": "##",
            "max_input_chars_per_word": 100,
            "vocab": Value::Object(vocab),
        })
        .to_string();
        let model: WordPiece = serde_json::from_str(&model_json)
            .map_err(|e| TokenizerError::Backend(format!("building WordPiece: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(model);
        let lowercase = self.lowercase.unwrap_or(true);
        let strip_accents = self.strip_accents.unwrap_or(lowercase);
        inner
            .with_normalizer(Some(BertNormalizer::new(
                true,
                true,
                Some(strip_accents),
                lowercase,
            )))
            .map_err(|e| TokenizerError::Backend(format!("setting the normalizer: {e}")))?;
        inner.with_pre_tokenizer(Some(BertPreTokenizer));
        inner.with_decoder(Some(WordPieceDecoder::new("##".into(), true)));
        let control: Vec<AddedToken> = words
            .iter()
            .zip(&types)
            .filter(|(_, t)| **t == 3)
            .map(|(w, _)| AddedToken::from(w.clone(), true).normalized(false))
            .collect();
        if !control.is_empty() {
            inner
                .add_special_tokens(control)
                .map_err(|e| TokenizerError::Backend(format!("adding control tokens: {e}")))?;
        }
        let data = GgufTokenizerData {
            bos_id: cls,
            eos_id: sep,
            add_bos: Some(self.add_bos.unwrap_or(true)),
            add_eos: Some(self.add_eos.unwrap_or(true)),
            ..self.clone()
        };
        data.finish(inner, &words, true)
    }
}

/// The tokenizer part of GGUF metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`).
pub fn tokenizer_data(meta: &GgufMetadata) -> Result<GgufTokenizerData> {
    let strings = |k: &str| -> Option<Vec<String>> {
        match meta.get(k) {
            Some(GgufValue::Strings(v)) => Some(v.clone()),
            _ => None,
        }
    };
    let id = |k: &str| meta_f64(meta, k).map(|v| v as u32);
    let flag = |k: &str| meta.get_bool(k).ok();
    let scores = match meta.get("tokenizer.ggml.scores") {
        Some(GgufValue::Array(a)) => Some(
            a.astype(Dtype::Float32)
                .and_then(|a| a.to_vec::<f32>())
                .map_err(|e| TokenizerError::Config(format!("GGUF tokenizer.ggml.scores: {e}")))?,
        ),
        _ => None,
    };
    let token_types = match meta.get("tokenizer.ggml.token_type") {
        Some(GgufValue::Array(a)) => Some(
            a.astype(Dtype::Int32)
                .and_then(|a| a.to_vec::<i32>())
                .map_err(|e| {
                    TokenizerError::Config(format!("GGUF tokenizer.ggml.token_type: {e}"))
                })?,
        ),
        _ => None,
    };
    Ok(GgufTokenizerData {
        model: meta_str(meta, "tokenizer.ggml.model")
            .ok_or_else(|| {
                TokenizerError::Config("GGUF metadata has no tokenizer.ggml.model".into())
            })?
            .to_string(),
        pre: meta_str(meta, "tokenizer.ggml.pre").map(str::to_string),
        tokens: strings("tokenizer.ggml.tokens").ok_or_else(|| {
            TokenizerError::Config("GGUF metadata has no tokenizer.ggml.tokens".into())
        })?,
        token_types,
        merges: strings("tokenizer.ggml.merges").unwrap_or_default(),
        scores,
        add_space_prefix: flag("tokenizer.ggml.add_space_prefix"),
        bos_id: id("tokenizer.ggml.bos_token_id"),
        eos_id: id("tokenizer.ggml.eos_token_id"),
        unk_id: id("tokenizer.ggml.unknown_token_id"),
        pad_id: id("tokenizer.ggml.padding_token_id"),
        add_bos: flag("tokenizer.ggml.add_bos_token"),
        add_eos: flag("tokenizer.ggml.add_eos_token"),
        chat_template: meta_str(meta, "tokenizer.chat_template").map(str::to_string),
        cls_id: id("tokenizer.ggml.cls_token_id"),
        sep_id: id("tokenizer.ggml.seperator_token_id"),
        mask_id: id("tokenizer.ggml.mask_token_id"),
        lowercase: flag("tokenizer.ggml.normalizer.lowercase"),
        strip_accents: flag("tokenizer.ggml.normalizer.strip_accents"),
    })
}

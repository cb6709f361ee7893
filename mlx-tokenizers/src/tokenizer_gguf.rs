//! A tokenizer built from GGUF metadata (`tokenizer.ggml.*`), the way llama.cpp and transformers'
//! GGUF converter (`integrations/gguf/gguf_tokenizer_mapping.py`) build it.
//!
//! Supported: HybriDNA's (`"hybriddna"`: the byte-level BPE below, with llama.cpp's DNA k-mers
//! between `<dna>` and `</dna>`, see [`TrieEncoder::hybriddna`](crate::tokenizer_trie::TrieEncoder::hybriddna)), RWKV "world" vocabularies (`"rwkv"`, llama.cpp's greedy byte trie, see
//! `build_rwkv`), PLaMo 2's (`"plamo2"`, see `build_plamo2`), whitespace-split BPE
//! (`"whitespace"`, see `build_whitespace`), SentencePiece vocabularies (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral,
//! Gemma; see [`GgufTokenizerData::build`]), SentencePiece Unigram vocabularies (`"t5"`,
//! llama.cpp's UGM: T5, mT5, Flan-T5; see `build_ugm`), WordPiece vocabularies (`"bert"`: BERT-style
//! embedding models, see `build_wpm`), BPE over raw UTF-8 pieces (`"gemma4"`, see
//! `build_raw_bpe`) and byte-level BPE vocabularies (`tokenizer.ggml.model = "gpt2"`) with
//! every pre-tokenizer llama.cpp's `llama-vocab.cpp` names in `tokenizer.ggml.pre` (`PRE_NAMES`:
//! about 90 names, each a list of split regexes applied in turn, plus llama.cpp's
//! `ignore_merges` and BOS default). Where transformers' GGUF converter also knows a name
//! (`gpt2`, `default`, `smollm`, the Llama 3, Qwen2, Qwen 3.5, Tekken and GPT-4o families) its
//! regex is used, as the `gguf_pre` goldens check; llama.cpp's rewrites of those regexes (for
//! C++'s `std::regex`) are not copied. The other names follow llama.cpp, checked against
//! llama.cpp's own `test-tokenizer-0` data (`tests/gguf_llama_vocab.rs`). Where llama.cpp runs
//! a hand-written splitter instead of a regex (AFMoE's and Tiny Aya's digit groups, Kimi K2's
//! Han-aware pattern, SuperBPE's groups of three), an equivalent regex stands in. mmBERT's
//! `mmbert` (BPE over raw UTF-8 with a Metaspace word split) is built as `build_raw_bpe`
//! describes; `whitespace` under the `gpt2` model (which llama.cpp's converter never writes) is
//! refused.
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
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use mlx_core::io::{GgufMetadata, GgufValue};
use mlx_core::prelude::*;

use crate::chat_template::ChatTemplates;
use crate::tokenizer::{apply_config_overrides, Result, Tokenizer, TokenizerError};
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
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE), `"llama"` (SentencePiece), `"t5"`
    /// (SentencePiece Unigram), `"bert"` (WordPiece), `"gemma4"` (BPE over raw UTF-8) or
    /// `"rwkv"` (RWKV's byte trie).
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
    /// `tokenizer.ggml.precompiled_charsmap` (Unigram: SentencePiece's normalization table).
    pub precompiled_charsmap: Option<Vec<u8>>,
    /// `tokenizer.ggml.remove_extra_whitespaces` (Unigram; llama.cpp's default: true).
    pub remove_extra_whitespaces: Option<bool>,
    /// Not in the file: entries replacing those of the tokenizer config built from the metadata
    /// (`bos_token`, `eos_token`, `add_bos_token`, ..., `chat_template`), as
    /// [`Tokenizer::from_dir_with_config`]'s replace `tokenizer_config.json`'s (mlx-lm's
    /// `load(path, tokenizer_config=...)`, e.g. `mlx cache-prompt --eos-token`). Empty: the
    /// file's own. Where llama.cpp's own encoder adds the BOS / EOS (see [`Self::build`]), an
    /// override of what it adds is an error.
    pub config_overrides: Map<String, Value>,
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

/// A pre-tokenizer as llama.cpp's `llm_tokenizer_bpe` sets it up for one `tokenizer.ggml.pre`
/// value (`src/llama-vocab.cpp`), together with the vocabulary flags it sets with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PreSpec {
    /// The split regexes, applied in turn: each splits every piece the one before left, its
    /// matches isolated and the text between them kept (llama.cpp's `unicode_regex_split`, the
    /// `tokenizers` crate's `Split` with `Isolated`). Empty: GPT2Tokenizer's byte-level step
    /// with its own regex.
    splits: &'static [&'static str],
    /// A word that is a vocabulary token is that token, whatever the merges say (llama.cpp's
    /// `ignore_merges`).
    ignore_merges: bool,
    /// Whether BOS is added when the file has no `tokenizer.ggml.add_bos_token`.
    add_bos: bool,
}

impl PreSpec {
    const fn split(splits: &'static [&'static str]) -> Self {
        Self {
            splits,
            ignore_merges: false,
            add_bos: false,
        }
    }
    const fn ignore_merges(self) -> Self {
        Self {
            ignore_merges: true,
            ..self
        }
    }
    const fn add_bos(self) -> Self {
        Self {
            add_bos: true,
            ..self
        }
    }
}

/// Digits in groups of three from the right, the leading group one to three long: llama.cpp's
/// custom `\p{AFMoE_digits}` splitter, which it also runs for Tiny Aya's
/// `\d{1,3}(?=(?:\d{3})*\b)`.
const DIGIT_GROUPS: &str = r"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))";

/// Kimi K2's `tokenization_kimi.py` pattern; its `\p{Han}` is llama.cpp's `unicode_cpt_is_han`
/// ranges (llama.cpp's custom K2 splitter implements the pattern with them).
const KIMI_K2_SPLIT: &str = concat!(
    r"[\x{3400}-\x{4DBF}\x{4E00}-\x{9FFF}\x{F900}-\x{FAFF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2EBEF}\x{2F800}-\x{2FA1F}]+",
    r"|[^\r\n\p{L}\p{N}]?(?:(?![\x{3400}-\x{4DBF}\x{4E00}-\x{9FFF}\x{F900}-\x{FAFF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2EBEF}\x{2F800}-\x{2FA1F}])[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])*",
    r"(?:(?![\x{3400}-\x{4DBF}\x{4E00}-\x{9FFF}\x{F900}-\x{FAFF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2EBEF}\x{2F800}-\x{2FA1F}])[\p{Ll}\p{Lm}\p{Lo}\p{M}])+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?(?:(?![\x{3400}-\x{4DBF}\x{4E00}-\x{9FFF}\x{F900}-\x{FAFF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2EBEF}\x{2F800}-\x{2FA1F}])[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])+",
    r"(?:(?![\x{3400}-\x{4DBF}\x{4E00}-\x{9FFF}\x{F900}-\x{FAFF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2EBEF}\x{2F800}-\x{2FA1F}])[\p{Ll}\p{Lm}\p{Lo}\p{M}])*",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// llama.cpp `JAIS2`.
const RE_JAIS2: &[&str] = &[
    r#"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"#,
];
/// llama.cpp `DEEPSEEK_LLM`.
const RE_DEEPSEEK_LLM: &[&str] = &[
    r#"[\r\n]"#,
    r#"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+"#,
    r#"\s?[!-/:-~！-／：-～‘-‟\x{3000}-。]+"#,
    r#"\s+$"#,
    r#"[一-龥ࠀ-一가-\x{D7FF}]+"#,
    r#"\p{N}+"#,
];
/// llama.cpp `DEEPSEEK3_LLM, HUNYUAN_DENSE, JOYAI_LLM, HY_V4`.
const RE_DEEPSEEK3_LLM: &[&str] = &[
    r#"\p{N}{1,3}"#,
    r#"[一-龥\x{3040}-ゟ゠-ヿ]+"#,
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];
/// llama.cpp `SPARK2_5`.
const RE_SPARK2_5: &[&str] = &[
    r#"\p{N}{1,3}"#,
    r#"[一-龥\x{3040}-ゟ゠-ヿ]+"#,
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"##,
    r#"\p{N}"#,
];
/// llama.cpp `YOUTU`.
const RE_YOUTU: &[&str] = &[
    r#"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥\x{3040}-ゟ゠-ヿ]+"#,
    r#"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"#,
];
/// llama.cpp `DEEPSEEK_CODER`.
const RE_DEEPSEEK_CODER: &[&str] = &[
    r#"[\r\n]"#,
    r#"\s?\p{L}+"#,
    r#"\s?\p{P}+"#,
    r#"[一-龥ࠀ-一가-\x{D7FF}]+"#,
    r#"\p{N}"#,
];
/// llama.cpp `FALCON`.
const RE_FALCON: &[&str] = &[
    r#"[\p{P}\$\+<=>\^~\|`]+"#,
    r#"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"#,
    r#"[0-9][0-9][0-9]"#,
];
/// llama.cpp `STARCODER, REFACT, COMMAND_R, SMOLLM, CODESHELL, EXAONE, MINERVA, MELLUM2`.
const RE_STARCODER: &[&str] = &[
    r#"\p{N}"#,
    r#"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"#,
];
/// llama.cpp `PORO, BLOOM, GPT3_FINNISH`.
const RE_PORO: &[&str] = &[r#" ?[^(\s|.,!?…。，、।۔،)]+"#];
/// llama.cpp `VIKING`.
const RE_VIKING: &[&str] = &[r#" ?[^(\s|.,!?…。，、।۔،)]+"#, r#"\p{N}"#];
/// llama.cpp `CHAMELEON`.
const RE_CHAMELEON: &[&str] = &[
    r#"<sentinel:[0-9]+>"#,
    r#"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z"#,
    r#"([\t\n]|    |  )"#,
    r#"\p{N}"#,
    r#"[\p{P}!-/:-@\[-`{-~]"#,
    r#"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"#,
];
/// llama.cpp `TINY_AYA`.
const RE_TINY_AYA: &[&str] = &[
    DIGIT_GROUPS,
    r#"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"#,
];
/// llama.cpp `SUPERBPE`.
const RE_SUPERBPE: &[&str] = &[r#"\p{N}+"#, r#"[0-9]{1,3}(?=(?:[0-9]{3})*(?![0-9]))"#];
/// llama.cpp `BAILINGMOE`.
const RE_BAILINGMOE: &[&str] = &[
    r#"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"#,
];
/// llama.cpp `SEED_CODER`.
const RE_SEED_CODER: &[&str] = &[
    r#"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"#,
];
/// llama.cpp `UFAKZEKA`.
const RE_UFAKZEKA: &[&str] =
    &[r#"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"#];
/// llama.cpp `AFMOE`.
const RE_AFMOE: &[&str] = &[
    DIGIT_GROUPS,
    r#"[一-鿿㐀-䶿豈-\x{FAFF}\x{3040}-ゟ゠-ヿ･-ﾟ⼀-\x{2FDF}เ-\x{E7F}\x{E80}-\x{EFF}ក-\x{17FF}က-႟ꩠ-ꩿꧠ-\x{A9FF}가-\x{D7AF}ᄀ-ᇿ]+"#,
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];
/// llama.cpp `LAGUNA`.
const RE_LAGUNA: &[&str] = &[
    r#"[^\n]+|[\n]+"#,
    r#"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"#,
];
/// llama.cpp `EXAONE_MOE`.
const RE_EXAONE_MOE: &[&str] = &[
    r#"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+"#,
];
/// llama.cpp `MINICPM5`.
const RE_MINICPM5: &[&str] = &[
    r#"\p{N}{1,3}"#,
    r#"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"#,
];

const GPT2: PreSpec = PreSpec::split(&[]);
const LLAMA3: PreSpec = PreSpec::split(&[LLAMA3_SPLIT]).ignore_merges().add_bos();
const QWEN2: PreSpec = PreSpec::split(&[QWEN2_SPLIT]);
const GPT4O: PreSpec = PreSpec::split(&[GPT4O_SPLIT]);
const DIGITS_GPT2: PreSpec = PreSpec::split(RE_STARCODER);

/// Every `tokenizer.ggml.pre` value llama.cpp's `llama_vocab::impl::load` accepts for a
/// byte-level BPE vocabulary, with its regexes and flags; where transformers' GGUF converter
/// knows a value (the first block), its pre-tokenizer (see the module docs).
const PRE_NAMES: &[(&str, PreSpec)] = &[
    ("gpt2", GPT2),
    ("default", GPT2),
    // transformers' converter has no `smollm` entry: GPT-2's pre-tokenizer (see the module docs).
    ("smollm", GPT2),
    ("llama3", LLAMA3),
    ("llama-v3", LLAMA3),
    ("llama-bpe", LLAMA3),
    ("falcon3", LLAMA3),
    ("falcon-h1", LLAMA3),
    ("pixtral", LLAMA3),
    ("midm-2.0", LLAMA3),
    ("lfm2", LLAMA3),
    ("jina-v5-nano", LLAMA3),
    ("qwen2", QWEN2),
    ("deepseek-r1-qwen", QWEN2),
    ("kormo", QWEN2),
    ("f2llmv2", QWEN2),
    ("megrez", QWEN2),
    ("tekken", PreSpec::split(&[TEKKEN_SPLIT])),
    ("qwen35", PreSpec::split(&[QWEN35_SPLIT])),
    ("gpt-4o", GPT4O),
    ("llama4", GPT4O),
    ("kanana2", GPT4O),
    ("talkie", GPT4O),
    ("minimax-m2", GPT4O),
    // The rest as llama.cpp alone sets them up.
    ("dbrx", PreSpec::split(&[LLAMA3_SPLIT])),
    ("smaug-bpe", PreSpec::split(&[LLAMA3_SPLIT])),
    ("minicpm5", PreSpec::split(RE_MINICPM5).ignore_merges()),
    ("deepseek-llm", PreSpec::split(RE_DEEPSEEK_LLM)),
    ("deepseek-coder", PreSpec::split(RE_DEEPSEEK_CODER)),
    ("deepseek-v3", PreSpec::split(RE_DEEPSEEK3_LLM)),
    ("hunyuan-dense", PreSpec::split(RE_DEEPSEEK3_LLM)),
    ("joyai-llm", PreSpec::split(RE_DEEPSEEK3_LLM)),
    ("hy_v4", PreSpec::split(RE_DEEPSEEK3_LLM)),
    ("spark2_5", PreSpec::split(RE_SPARK2_5)),
    ("youtu", PreSpec::split(RE_YOUTU).ignore_merges()),
    ("falcon", PreSpec::split(RE_FALCON)),
    ("mpt", GPT2),
    ("starcoder", DIGITS_GPT2),
    ("gpt-2", GPT2),
    ("phi-2", GPT2),
    ("jina-es", GPT2),
    ("jina-de", GPT2),
    ("gigachat", GPT2),
    ("jina-v2-es", GPT2),
    ("jina-v2-de", GPT2),
    ("a.x-4.0", GPT2),
    ("mellum", GPT2),
    ("modern-bert", GPT2),
    ("jina-v1-en", GPT2),
    ("jina-v2-code", GPT2),
    ("roberta-bpe", GPT2),
    ("jais-2", PreSpec::split(RE_JAIS2)),
    ("refact", DIGITS_GPT2),
    ("command-r", DIGITS_GPT2),
    ("stablelm2", QWEN2),
    ("olmo", GPT2),
    ("poro-chat", PreSpec::split(RE_PORO)),
    ("chatglm-bpe", PreSpec::split(&[LLAMA3_SPLIT])),
    ("glm4", PreSpec::split(&[LLAMA3_SPLIT]).ignore_merges()),
    ("glm5", PreSpec::split(&[LLAMA3_SPLIT]).ignore_merges()),
    ("viking", PreSpec::split(RE_VIKING)),
    ("jais", GPT2),
    ("codeshell", DIGITS_GPT2),
    ("bloom", PreSpec::split(RE_PORO)),
    ("gpt3-finnish", PreSpec::split(RE_PORO)),
    ("exaone", DIGITS_GPT2),
    ("exaone4", GPT2),
    ("exaone-moe", PreSpec::split(RE_EXAONE_MOE)),
    ("chameleon", PreSpec::split(RE_CHAMELEON).add_bos()),
    ("minerva-7b", DIGITS_GPT2),
    ("granite-embed-multi-97m", GPT4O.ignore_merges()),
    ("tiny_aya", PreSpec::split(RE_TINY_AYA)),
    ("cohere2moe", PreSpec::split(RE_TINY_AYA)),
    ("superbpe", PreSpec::split(RE_SUPERBPE)),
    ("trillion", GPT2),
    ("granite-docling", GPT2),
    ("bailingmoe", PreSpec::split(RE_BAILINGMOE)),
    ("bailingmoe2", PreSpec::split(RE_BAILINGMOE)),
    ("llada-moe", PreSpec::split(RE_BAILINGMOE)),
    ("seed-coder", PreSpec::split(RE_SEED_CODER)),
    ("hunyuan", QWEN2),
    ("kimi-k2", PreSpec::split(&[KIMI_K2_SPLIT])),
    ("ufakzeka", PreSpec::split(RE_UFAKZEKA)),
    ("grok-2", QWEN2),
    ("afmoe", PreSpec::split(RE_AFMOE)),
    ("laguna", PreSpec::split(RE_LAGUNA)),
    ("solar-open", QWEN2),
    ("mellum2", DIGITS_GPT2),
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
    .map_err(|e| TokenizerError::Backend(format!("pre-tokenizer regex {pattern:?}: {e}")))?;
    Ok(PreTokenizerWrapper::Split(s))
}

impl PreSpec {
    fn pre_tokenizer(self) -> Result<PreTokenizerWrapper> {
        if self.splits.is_empty() {
            // GPT2Tokenizer: ByteLevel(add_prefix_space=False) with its own regex.
            return Ok(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
                false, true, true,
            )));
        }
        let mut steps = self
            .splits
            .iter()
            .map(|r| split(r))
            .collect::<Result<Vec<_>>>()?;
        steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
            false, true, false,
        )));
        Ok(PreTokenizerWrapper::Sequence(Sequence::new(steps)))
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

    /// [`Self::check_ids`] over the BOS, EOS, unknown and padding ids.
    fn check_special_ids(&self) -> Result<()> {
        self.check_ids(&[
            ("bos", self.bos_id),
            ("eos", self.eos_id),
            ("unk", self.unk_id),
            ("pad", self.pad_id),
        ])
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

    /// Builds the tokenizer, [`Self::config_overrides`] applied. Errors name what is
    /// unsupported or inconsistent: where an encoder of llama.cpp's runs (RWKV, PLaMo 2,
    /// HybriDNA, SentencePiece without scores), it adds the file's BOS / EOS itself, so
    /// overriding `add_bos_token` or `add_eos_token`, or the token it adds, is refused.
    pub fn build(&self) -> Result<Tokenizer> {
        let tok = self.build_tokenizer()?;
        if let Some((bos, eos)) = tok.trie_encoder_adds() {
            let refused = |k: &str| match k {
                "add_bos_token" | "add_eos_token" => true,
                "bos_token" => bos,
                "eos_token" => eos,
                _ => false,
            };
            if let Some(k) = self.config_overrides.keys().find(|k| refused(k)) {
                return Err(TokenizerError::Invalid(format!(
                    "tokenizer config override {k:?}: not supported for this GGUF tokenizer \
                     (llama.cpp's own encoder, which adds the file's BOS / EOS itself)"
                )));
            }
        }
        Ok(tok)
    }

    fn build_tokenizer(&self) -> Result<Tokenizer> {
        if self.model == "llama" {
            return self.build_spm();
        }
        if self.model == "t5" {
            return self.build_ugm();
        }
        if self.model == "bert" {
            return self.build_wpm();
        }
        if self.model == "rwkv" {
            return self.build_rwkv();
        }
        if self.model == "whitespace" {
            return self.build_whitespace();
        }
        if self.model == "plamo2" {
            return self.build_plamo2();
        }
        let raw_pre = matches!(
            self.pre.as_deref(),
            Some("gemma4" | "granite-embed-multi-311m" | "sarvam-moe" | "mmbert")
        );
        if self.model == "gemma4" || (self.model == "gpt2" && raw_pre) {
            return self.build_raw_bpe();
        }
        let hybriddna = self.model == "hybriddna";
        if self.model != "gpt2" && !hybriddna {
            return Err(TokenizerError::Invalid(format!(
                "GGUF tokenizer model {:?} is not supported; supported: [\"gpt2\"] \
                 (byte-level BPE), [\"gemma4\"] (BPE over raw UTF-8), [\"llama\"] \
                 (SentencePiece), [\"t5\"] (SentencePiece Unigram), [\"bert\"] (WordPiece), \
                 [\"rwkv\"] (RWKV's greedy byte trie), [\"whitespace\"] (BPE over \
                 whitespace-split UTF-8 words), [\"plamo2\"] (PLaMo 2's Viterbi search), \
                 [\"hybriddna\"] (byte-level BPE with DNA k-mers)",
                self.model
            )));
        }
        let pre_name = self.pre.as_deref().unwrap_or("default");
        if pre_name == "whitespace" {
            // The whitespace pre-tokenizer under `gpt2` (its own model, `whitespace`, is
            // built): llama.cpp's converter never writes it so.
            return Err(TokenizerError::Invalid(format!(
                "GGUF tokenizer.ggml.pre {pre_name:?} with tokenizer.ggml.model \"gpt2\" is not \
                 supported (llama.cpp's converter writes it with the model \"whitespace\")"
            )));
        }
        let spec = PRE_NAMES
            .iter()
            .find(|(n, _)| *n == pre_name)
            .map(|(_, k)| *k)
            .ok_or_else(|| {
                TokenizerError::Invalid(format!(
                    "GGUF tokenizer.ggml.pre {pre_name:?}: unknown byte-level BPE \
                     pre-tokenizer (neither llama.cpp nor transformers' GGUF converter names \
                     it); known: {:?}",
                    supported_pre_tokenizers()
                ))
            })?;
        let n = self.tokens.len();
        self.token_types()?;
        self.check_special_ids()?;

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
        // A user-defined token spelled outside the byte alphabet (GPT-NeoX's runs of spaces,
        // `"  "`) is matched in the raw text, as llama.cpp's `tokenizer_st_partition` matches
        // it: its raw spelling names the same id, for the added token below.
        if let Some(types) = &self.token_types {
            for (i, (t, ty)) in self.tokens.iter().zip(types).enumerate() {
                if *ty == 4 && !is_byte_level_spelled(t, &alphabet) {
                    vocab.push((t.clone(), i as u32));
                }
            }
        }
        let merges = self.merge_pairs()?;
        let bpe = BPE::builder()
            .vocab_and_merges(
                vocab
                    .into_iter()
                    .collect::<tokenizers::models::bpe::Vocab>(),
                merges,
            )
            .ignore_merges(spec.ignore_merges)
            // GPT2Tokenizer's BPE spells these as empty strings (no effect on tokenization).
            .continuing_subword_prefix(String::new())
            .end_of_word_suffix(String::new())
            .build()
            .map_err(|e| TokenizerError::Backend(format!("building BPE: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(spec.pre_tokenizer()?));
        if hybriddna {
            // llama.cpp erases the k-mers' marker from their text: they decode to the bases.
            use tokenizers::decoders::sequence::Sequence as DecoderSequence;
            use tokenizers::normalizers::replace::Replace;
            use tokenizers::DecoderWrapper;
            let erase = Replace::new(crate::tokenizer_trie::DNA_KMER_MARKER, "")
                .map_err(|e| TokenizerError::Backend(format!("building a Replace: {e}")))?;
            inner.with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(vec![
                DecoderWrapper::ByteLevel(ByteLevel::default()),
                DecoderWrapper::Replace(erase),
            ]))));
        } else {
            inner.with_decoder(Some(ByteLevel::default()));
        }
        // HybriDNA's encoder runs this BPE between its special tokens and DNA spans.
        let plain_bpe = hybriddna.then(|| inner.clone());

        if let Some(types) = &self.token_types {
            let control: Vec<AddedToken> = self
                .tokens
                .iter()
                .zip(types)
                .filter(|(t, ty)| **ty == 3 && is_byte_level_spelled(t, &alphabet))
                .map(|(t, _)| AddedToken::from(t.clone(), true).normalized(false))
                .collect();
            add_control_tokens(&mut inner, control)?;
            let user: Vec<AddedToken> = self
                .tokens
                .iter()
                .zip(types)
                .filter(|(t, ty)| **ty == 4 && inner.token_to_id(t).is_some())
                .map(|(t, _)| AddedToken::from(t.clone(), false).normalized(false))
                .collect();
            add_user_tokens(&mut inner, user)?;
        }

        let tag = |t: &str| self.tokens.iter().rposition(|x| x == t).map(|i| i as u32);
        match (plain_bpe, tag("<dna>"), tag("</dna>"), tag("<oov>")) {
            (Some(bpe), Some(begin), Some(end), Some(oov)) => {
                // llama.cpp's HybriDNA session; it adds BOS / EOS itself.
                let types = self.token_types()?;
                let add_bos = self.add_bos.unwrap_or(spec.add_bos);
                let add_eos = self.add_eos.unwrap_or(false);
                let encoder = crate::tokenizer_trie::TrieEncoder::hybriddna(
                    bpe,
                    &self.tokens,
                    &types,
                    (begin, end, oov),
                    self.bos_id.filter(|_| add_bos),
                    self.eos_id.filter(|_| add_eos),
                );
                let data = GgufTokenizerData {
                    add_bos: Some(false),
                    add_eos: Some(false),
                    ..self.clone()
                };
                let mut tok = data.finish(inner, &self.tokens, false)?;
                tok.set_trie_encoder(encoder);
                Ok(tok)
            }
            // Without the DNA tokens llama.cpp runs the plain BPE.
            _ => self.finish(inner, &self.tokens, spec.add_bos),
        }
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
        let put = apply_config_overrides(&mut config, &self.config_overrides);
        let mut tok = Tokenizer::from_parts(inner, &config, &[])?;
        if put.contains(&"chat_template") {
            if tok.has_chat_template() {
                tok.set_chat_template_origin("the tokenizer config overrides' `chat_template`");
            }
        } else if let Some(t) = &self.chat_template {
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
        if self.scores.is_none() {
            // llama.cpp's SentencePiece defaults where the file names none: BOS 1, EOS 2,
            // unknown 0.
            let fill = |id: Option<u32>, d: u32| id.or(((d as usize) < n).then_some(d));
            let filled = GgufTokenizerData {
                bos_id: fill(self.bos_id, 1),
                eos_id: fill(self.eos_id, 2),
                unk_id: fill(self.unk_id, 0),
                ..self.clone()
            };
            if filled != *self {
                return filled.build_spm();
            }
        }
        // llama.cpp's xverse converter writes no scores; llama.cpp reads each as 0, which
        // llama.cpp's own algorithm encodes (below): the BPE built here then only decodes.
        let zeros;
        let scores = match &self.scores {
            Some(s) => s,
            None => {
                zeros = vec![0.0f32; n];
                &zeros
            }
        };
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
        self.check_special_ids()?;
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
        add_control_tokens(&mut inner, control)?;
        let user_tokens = added(4, false);
        add_user_tokens(&mut inner, user_tokens)?;

        // llama.cpp adds BOS for SentencePiece vocabularies unless the file says otherwise.
        let mut tok = self.finish(inner, &pieces, true)?;
        if self.scores.is_none() {
            let encoder = crate::tokenizer_trie::TrieEncoder::spm(
                &self.tokens,
                &types,
                scores,
                space_prefix,
                self.bos_id.filter(|_| self.add_bos.unwrap_or(true)),
                self.eos_id.filter(|_| self.add_eos.unwrap_or(false)),
            );
            tok.set_trie_encoder(encoder);
        }
        Ok(tok)
    }
}

impl GgufTokenizerData {
    /// An RWKV "world" vocabulary (`tokenizer.ggml.model = "rwkv"`: RWKV-6/7 GGUF files), as
    /// llama.cpp runs it: each token the bytes its escaped spelling stands for
    /// ([`unescape_rwkv_token`](crate::tokenizer_trie::unescape_rwkv_token)), the text taken
    /// greedily, the longest token at each position
    /// ([`TrieEncoder::rwkv`](crate::tokenizer_trie::TrieEncoder::rwkv)), control tokens
    /// (`<s>`) split out first; no BOS or EOS is added. The backend holds the tokens spelled
    /// in GPT-2's byte alphabet with a byte-level decoder, so decoding, streaming and grammars
    /// see each token's bytes.
    fn build_rwkv(&self) -> Result<Tokenizer> {
        use crate::tokenizer_trie::{unescape_rwkv_token, TrieEncoder};

        let types = self.token_types()?;
        self.check_special_ids()?;
        let spelled: Vec<String> = self
            .tokens
            .iter()
            .map(|t| {
                unescape_rwkv_token(t)
                    .into_iter()
                    .map(byte_to_unicode)
                    .collect()
            })
            .collect();
        let vocab = token_vocab(&spelled);
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, Vec::new())
            .build()
            .map_err(|e| TokenizerError::Backend(format!("building the RWKV vocabulary: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_decoder(Some(ByteLevel::default()));
        let control: Vec<AddedToken> = spelled
            .iter()
            .zip(&types)
            .filter(|(t, ty)| **ty == 3 && !t.is_empty())
            .map(|(t, _)| AddedToken::from(t.clone(), true).normalized(false))
            .collect();
        add_control_tokens(&mut inner, control)?;
        let data = GgufTokenizerData {
            add_bos: Some(false),
            add_eos: Some(false),
            ..self.clone()
        };
        let mut tok = data.finish(inner, &spelled, false)?;
        tok.set_trie_encoder(TrieEncoder::rwkv(&self.tokens, &types, self.unk_id));
        Ok(tok)
    }
}

impl GgufTokenizerData {
    /// PLaMo 2's vocabulary (`tokenizer.ggml.model = "plamo2"`), as llama.cpp runs it
    /// ([`TrieEncoder::plamo2`](crate::tokenizer_trie::TrieEncoder::plamo2): the segmentation
    /// of best total score, byte tokens `<0xXX>` (type 6) for what no token covers), control
    /// tokens split out first, BOS in front when `add_bos_token` says so; llama.cpp's default
    /// ids where the file names none (unk 0, bos 1, eos 2, pad 3). Decoding: the tokens' text,
    /// byte tokens as their bytes.
    fn build_plamo2(&self) -> Result<Tokenizer> {
        use crate::tokenizer_trie::TrieEncoder;
        use tokenizers::decoders::byte_fallback::ByteFallback;
        use tokenizers::decoders::fuse::Fuse;
        use tokenizers::decoders::sequence::Sequence as DecoderSequence;
        use tokenizers::DecoderWrapper;

        let n = self.tokens.len();
        let types = self.token_types()?;
        let scores = self.scores.as_ref().ok_or_else(|| {
            TokenizerError::Invalid("GGUF PLaMo 2 vocabulary has no tokenizer.ggml.scores".into())
        })?;
        if scores.len() != n {
            return Err(TokenizerError::Invalid(format!(
                "GGUF tokenizer.ggml.scores has {} entries for {n} tokens",
                scores.len()
            )));
        }
        let default = |id: Option<u32>, d: u32| id.or(Some(d).filter(|&d| (d as usize) < n));
        let data = GgufTokenizerData {
            unk_id: default(self.unk_id, 0),
            bos_id: default(self.bos_id, 1),
            eos_id: default(self.eos_id, 2),
            pad_id: default(self.pad_id, 3),
            add_bos: Some(self.add_bos.unwrap_or(false)),
            add_eos: Some(false),
            ..self.clone()
        };
        data.check_ids(&[
            ("bos", data.bos_id),
            ("eos", data.eos_id),
            ("unk", data.unk_id),
            ("pad", data.pad_id),
        ])?;
        let encoder = TrieEncoder::plamo2(
            &self.tokens,
            &types,
            scores,
            data.bos_id.filter(|_| data.add_bos == Some(true)),
        )?;
        let vocab = token_vocab(&self.tokens);
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, Vec::new())
            .byte_fallback(true)
            .build()
            .map_err(|e| {
                TokenizerError::Backend(format!("building the PLaMo 2 vocabulary: {e}"))
            })?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(vec![
            DecoderWrapper::ByteFallback(ByteFallback::new()),
            DecoderWrapper::Fuse(Fuse::new()),
        ]))));
        let control: Vec<AddedToken> = self
            .tokens
            .iter()
            .zip(&types)
            .filter(|(t, ty)| matches!(**ty, 2 | 3) && !t.is_empty())
            .map(|(t, _)| AddedToken::from(t.clone(), true).normalized(false))
            .collect();
        add_control_tokens(&mut inner, control)?;
        // The backend's post-processor adds nothing: the encoder adds BOS itself.
        let mut tok = GgufTokenizerData {
            add_bos: Some(false),
            ..data.clone()
        }
        .finish(inner, &self.tokens, false)?;
        tok.set_trie_encoder(encoder);
        Ok(tok)
    }

    /// A BPE over raw UTF-8 words split at whitespace (`tokenizer.ggml.model = "whitespace"`,
    /// llama.cpp's `llm_tokenizer_whitespace_session`: jina-embeddings-v2-base-zh): the text
    /// split at Unicode white space, which is dropped, each word lower-cased when
    /// `tokenizer.ggml.normalizer.lowercase` says so (llama.cpp's default here: no), then
    /// merged by the file's merges; a character outside the vocabulary is its byte tokens
    /// (`<0xXX>`) where the vocabulary has them, else dropped, and no merge crosses it. BOS /
    /// EOS as the file says. Decoding joins the tokens with spaces (the split dropped them).
    fn build_whitespace(&self) -> Result<Tokenizer> {
        use tokenizers::normalizers::utils::Lowercase;
        use tokenizers::pre_tokenizers::whitespace::WhitespaceSplit;
        use tokenizers::NormalizerWrapper;

        let types = self.token_types()?;
        self.check_special_ids()?;
        if self.pre.as_deref().is_some_and(|p| p != "whitespace") {
            return Err(TokenizerError::Invalid(format!(
                "GGUF tokenizer.ggml.pre {:?} with tokenizer.ggml.model \"whitespace\": llama.cpp \
                 pins the pre-tokenizer \"whitespace\" for it",
                self.pre.as_deref().unwrap_or("")
            )));
        }
        let vocab = token_vocab(&self.tokens);
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, self.merge_pairs()?)
            .byte_fallback(true)
            .build()
            .map_err(|e| TokenizerError::Backend(format!("building BPE: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        if self.lowercase.unwrap_or(false) {
            inner
                .with_normalizer(Some(NormalizerWrapper::Lowercase(Lowercase)))
                .map_err(|e| TokenizerError::Backend(format!("setting the normalizer: {e}")))?;
        }
        // Characters that are no token of their own stand alone, so that no merge crosses them
        // (llama.cpp keeps them as symbols between their neighbours).
        let singles: std::collections::BTreeSet<char> = self
            .tokens
            .iter()
            .filter_map(|t| {
                let mut c = t.chars();
                match (c.next(), c.next()) {
                    (Some(ch), None) => Some(ch),
                    _ => None,
                }
            })
            .collect();
        let class: String = singles
            .iter()
            .map(|c| format!("\\x{{{:x}}}", *c as u32))
            .collect();
        let mut steps = vec![PreTokenizerWrapper::WhitespaceSplit(WhitespaceSplit)];
        if !class.is_empty() {
            steps.push(split(&format!("[^\\s{class}]"))?);
        }
        inner.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(steps))));
        let control: Vec<AddedToken> = self
            .tokens
            .iter()
            .zip(&types)
            .filter(|(t, ty)| **ty == 3 && !t.is_empty())
            .map(|(t, _)| AddedToken::from(t.clone(), true).normalized(false))
            .collect();
        add_control_tokens(&mut inner, control)?;
        let user: Vec<AddedToken> = self
            .tokens
            .iter()
            .zip(&types)
            .filter(|(t, ty)| **ty == 4 && !t.is_empty())
            .map(|(t, _)| AddedToken::from(t.clone(), false).normalized(false))
            .collect();
        add_user_tokens(&mut inner, user)?;
        self.finish(inner, &self.tokens, false)
    }

    /// `tokenizer.ggml.merges` as pairs.
    fn merge_pairs(&self) -> Result<Vec<(String, String)>> {
        self.merges
            .iter()
            .map(|m| {
                let mut parts = m.split(' ');
                match (parts.next(), parts.next(), parts.next()) {
                    (Some(a), Some(b), None) => Ok((a.to_string(), b.to_string())),
                    _ => Err(TokenizerError::Invalid(format!(
                        "GGUF tokenizer.ggml.merges entry {m:?} is not two tokens separated by \
                         one space"
                    ))),
                }
            })
            .collect()
    }

    /// A BPE over raw UTF-8 pieces with SentencePiece's spelling (`tokenizer.ggml.model =
    /// "gemma4"`, and `"gpt2"` with the `gemma4`, `granite-embed-multi-311m` or `sarvam-moe`
    /// pre-tokenizer), as llama.cpp runs it: spaces written `▁`, the text split into runs of
    /// newlines and runs of anything else (no word splitting), a run of newlines that is a
    /// vocabulary token taken whole, byte pieces (`<0xXX>`) for what the merges leave outside
    /// the vocabulary. llama.cpp adds BOS for Gemma 4 whatever the file says. Under `mmbert`
    /// (mmBERT) each run of non-newlines also gets a leading `▁` and is split in front of every
    /// `▁` (llama.cpp's Metaspace split), and `<mask>` takes the spaces before it.
    fn build_raw_bpe(&self) -> Result<Tokenizer> {
        use tokenizers::decoders::byte_fallback::ByteFallback;
        use tokenizers::decoders::fuse::Fuse;
        use tokenizers::decoders::sequence::Sequence as DecoderSequence;
        use tokenizers::normalizers::replace::Replace;
        use tokenizers::{DecoderWrapper, NormalizerWrapper};

        let types = self.token_types()?;
        self.check_special_ids()?;
        let vocab = token_vocab(&self.tokens);
        let mut builder = BPE::builder()
            .vocab_and_merges(vocab, self.merge_pairs()?)
            .byte_fallback(true);
        if let Some(unk) = self.unk_id.and_then(|i| self.tokens.get(i as usize)) {
            builder = builder.unk_token(unk.clone()).fuse_unk(true);
        }
        let bpe = builder
            .build()
            .map_err(|e| TokenizerError::Backend(format!("building BPE: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        let replace = |from: &str, to: &str| {
            Replace::new(from, to)
                .map_err(|e| TokenizerError::Backend(format!("building a Replace: {e}")))
        };
        inner
            .with_normalizer(Some(NormalizerWrapper::Replace(replace(" ", "\u{2581}")?)))
            .map_err(|e| TokenizerError::Backend(format!("setting the normalizer: {e}")))?;
        let mmbert = self.pre.as_deref() == Some("mmbert");
        if mmbert {
            // llama.cpp's MMBERT: each run of non-newlines gets a leading `▁` and is split in
            // front of every `▁` (a Metaspace split).
            inner.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(vec![
                split(r"[^\n]+|[\n]+")?,
                PreTokenizerWrapper::Metaspace(Metaspace::new(
                    '\u{2581}',
                    PrependScheme::Always,
                    true,
                )),
            ]))));
        } else {
            inner.with_pre_tokenizer(Some(split(r"[^\n]+|[\n]+")?));
        }
        inner.with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(vec![
            DecoderWrapper::Replace(replace("\u{2581}", " ")?),
            DecoderWrapper::ByteFallback(ByteFallback::new()),
            DecoderWrapper::Fuse(Fuse::new()),
        ]))));
        let added = |keep: &dyn Fn(&str, i32) -> bool, special: bool| -> Vec<AddedToken> {
            self.tokens
                .iter()
                .zip(&types)
                .filter(|(t, ty)| keep(t, **ty))
                .map(|(t, _)| AddedToken::from(t.clone(), special).normalized(false))
                .collect()
        };
        let mut control = added(&|_, ty| ty == 3, true);
        if mmbert {
            // llama.cpp gives mmBERT's `<mask>` the spaces before it (`LLAMA_TOKEN_ATTR_LSTRIP`).
            for t in &mut control {
                if t.content == "<mask>" {
                    *t = t.clone().lstrip(true);
                }
            }
        }
        add_control_tokens(&mut inner, control)?;
        // llama.cpp takes a run of newlines that is a token whole (its Gemma 4 fix); the
        // longest-first match of added tokens does the same.
        let user = added(
            &|t, ty| ty == 4 || (ty == 1 && !t.is_empty() && t.bytes().all(|b| b == b'\n')),
            false,
        );
        add_user_tokens(&mut inner, user)?;
        let data = GgufTokenizerData {
            add_bos: if self.model == "gemma4"
                || matches!(
                    self.pre.as_deref(),
                    Some("gemma4" | "granite-embed-multi-311m")
                ) {
                Some(true)
            } else {
                self.add_bos
            },
            ..self.clone()
        };
        data.finish(inner, &self.tokens, true)
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
        add_control_tokens(&mut inner, control)?;
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

impl GgufTokenizerData {
    /// A SentencePiece Unigram vocabulary (`"t5"`, llama.cpp's UGM) as transformers'
    /// `SpmConverter.build_tokenizer_from_spm_proto` builds one to encode as SentencePiece
    /// does: a Unigram over the pieces and their scores (unknown characters fused into one
    /// `<unk>`); the normalizer in SentencePiece's order: the precompiled charsmap, then (when
    /// `remove_extra_whitespaces`) leading and trailing spaces dropped and runs of spaces made
    /// one, spaces written `▁`, and (when `add_space_prefix`) the dummy `▁` prefix, which
    /// Metaspace adds even before a leading `▁`; control pieces as special tokens. llama.cpp
    /// adds EOS for this model unless the file says otherwise.
    fn build_ugm(&self) -> Result<Tokenizer> {
        use tokenizers::decoders::fuse::Fuse;
        use tokenizers::decoders::sequence::Sequence as DecoderSequence;
        use tokenizers::decoders::strip::Strip;
        use tokenizers::models::unigram::Unigram;
        use tokenizers::normalizers::replace::{Replace, ReplacePattern};
        use tokenizers::normalizers::utils::Sequence as NormalizerSequence;
        use tokenizers::normalizers::Precompiled;
        use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
        use tokenizers::{DecoderWrapper, NormalizerWrapper};

        let bad = |m: String| TokenizerError::Invalid(m);
        let n = self.tokens.len();
        let scores = self
            .scores
            .as_ref()
            .ok_or_else(|| bad("GGUF Unigram vocabulary has no tokenizer.ggml.scores".into()))?;
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
        self.check_special_ids()?;
        // llama.cpp's UGM needs an unknown token; the file's, else the first of type 2.
        let unk = match self.unk_id {
            Some(u) => u as usize,
            None => types.iter().position(|&t| t == 2).ok_or_else(|| {
                bad("GGUF Unigram vocabulary names no unknown token \
                     (tokenizer.ggml.unknown_token_id or a token of type 2)"
                    .into())
            })?,
        };
        let vocab: Vec<(String, f64)> = self
            .tokens
            .iter()
            .zip(scores)
            .map(|(t, &s)| (t.clone(), f64::from(s)))
            .collect();
        let model = Unigram::from(vocab, Some(unk), false)
            .map_err(|e| TokenizerError::Backend(format!("building Unigram: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(model);

        let replace = |from: ReplacePattern, to: &str| {
            Replace::new(from, to)
                .map(NormalizerWrapper::Replace)
                .map_err(|e| TokenizerError::Backend(format!("building a Replace: {e}")))
        };
        let regex = |r: &str| ReplacePattern::Regex(r.into());
        let mut normalizers = Vec::new();
        match self.precompiled_charsmap.as_deref() {
            Some(map) if !map.is_empty() => {
                let p = Precompiled::from(map)
                    .map_err(|e| bad(format!("GGUF tokenizer.ggml.precompiled_charsmap: {e}")))?;
                normalizers.push(NormalizerWrapper::Precompiled(p));
            }
            _ => {}
        }
        if self.remove_extra_whitespaces.unwrap_or(true) {
            // Only spaces count: SentencePiece leaves other whitespace alone.
            normalizers.push(replace(regex(r"\A +| +\z"), "")?);
            normalizers.push(replace(regex(" {2,}"), " ")?);
        }
        normalizers.push(replace(ReplacePattern::String(" ".into()), "\u{2581}")?);
        let prefix = self.add_space_prefix.unwrap_or(true);
        if prefix {
            normalizers.push(replace(regex("\\A\u{2581}"), "\u{2581}\u{2581}")?);
        }
        inner
            .with_normalizer(Some(NormalizerWrapper::Sequence(NormalizerSequence::new(
                normalizers,
            ))))
            .map_err(|e| TokenizerError::Backend(format!("setting the normalizer: {e}")))?;
        if prefix {
            inner.with_pre_tokenizer(Some(PreTokenizerWrapper::Metaspace(Metaspace::new(
                '\u{2581}',
                PrependScheme::Always,
                false,
            ))));
        }
        let mut decoders = vec![DecoderWrapper::Replace(
            tokenizers::normalizers::replace::Replace::new("\u{2581}", " ")
                .map_err(|e| TokenizerError::Backend(format!("building a Replace: {e}")))?,
        )];
        if prefix {
            decoders.push(DecoderWrapper::Fuse(Fuse::new()));
            decoders.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
        }
        inner.with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(
            decoders,
        ))));
        let added = |ty: i32, special: bool| -> Vec<AddedToken> {
            self.tokens
                .iter()
                .zip(&types)
                .filter(|(_, t)| **t == ty)
                .map(|(p, _)| AddedToken::from(p.clone(), special).normalized(false))
                .collect()
        };
        let control = added(3, true);
        add_control_tokens(&mut inner, control)?;
        let user = added(4, false);
        add_user_tokens(&mut inner, user)?;
        let data = GgufTokenizerData {
            unk_id: Some(unk as u32),
            add_eos: Some(self.add_eos.unwrap_or(true)),
            ..self.clone()
        };
        data.finish(inner, &self.tokens, false)
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
        precompiled_charsmap: match meta.get("tokenizer.ggml.precompiled_charsmap") {
            Some(GgufValue::Array(a)) => Some(
                a.astype(Dtype::Int32)
                    .and_then(|a| a.to_vec::<i32>())
                    .map_err(|e| {
                        TokenizerError::Config(format!(
                            "GGUF tokenizer.ggml.precompiled_charsmap: {e}"
                        ))
                    })?
                    .into_iter()
                    .map(|b| {
                        u8::try_from(b).map_err(|_| {
                            TokenizerError::Config(format!(
                                "GGUF tokenizer.ggml.precompiled_charsmap holds {b}, not a byte"
                            ))
                        })
                    })
                    .collect::<Result<Vec<u8>>>()?,
            ),
            _ => None,
        },
        remove_extra_whitespaces: flag("tokenizer.ggml.remove_extra_whitespaces"),
        config_overrides: Map::new(),
    })
}

/// Adds `tokens` (where there are any) as the tokenizer's special tokens: the file's control
/// tokens.
fn add_control_tokens(inner: &mut tokenizers::Tokenizer, tokens: Vec<AddedToken>) -> Result<()> {
    if !tokens.is_empty() {
        inner
            .add_special_tokens(tokens)
            .map_err(|e| TokenizerError::Backend(format!("adding control tokens: {e}")))?;
    }
    Ok(())
}

/// Adds `tokens` (where there are any) as the tokenizer's added, non-special tokens: the
/// file's user-defined tokens.
fn add_user_tokens(inner: &mut tokenizers::Tokenizer, tokens: Vec<AddedToken>) -> Result<()> {
    if !tokens.is_empty() {
        inner
            .add_tokens(tokens)
            .map_err(|e| TokenizerError::Backend(format!("adding user-defined tokens: {e}")))?;
    }
    Ok(())
}

/// Tokens as a BPE vocabulary: each token its index.
fn token_vocab(tokens: &[String]) -> tokenizers::models::bpe::Vocab {
    tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect()
}

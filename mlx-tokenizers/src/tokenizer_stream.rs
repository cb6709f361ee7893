//! Streaming detokenizers: text from a growing token sequence, one token at a time, that never
//! shows a partial UTF-8 character. A port of mlx-lm 0.32.2's `NaiveStreamingDetokenizer`,
//! `SPMStreamingDetokenizer` and `BPEStreamingDetokenizer`, including their quirks:
//!
//! - The BPE and SPM detokenizers drop one leading space of the very first text they emit
//!   (SPM only when `trim_space`), so their text can differ from `decode` by that space.
//! - The BPE detokenizer holds a lone space token back until the next token arrives.
//! - mlx-lm's BPE byte map treats byte 0 as "not a byte" while streaming (`if res:` on the value
//!   0), so the token `Ā` streams as `"Ā"` rather than `"\0"`; `finalize` maps it to `"\0"`.
//!   This is reproduced. Where mlx-lm would raise (a token id outside the vocabulary for the SPM
//!   detokenizer, a non-byte character at `finalize`), the port uses the token's UTF-8 bytes, or
//!   nothing for an unknown id, instead.
//!
//! Offsets follow Python's, counted in characters: `last_segment` returns the text added since the
//! previous call.

use std::sync::Arc;

use crate::error::Result;
pub use crate::tokenizer::DetokenizerKind;
use crate::tokenizer::{TokenMap, Tokenizer};

/// GPT-2's byte-to-unicode map, inverted: `char -> byte` (mlx-lm `_byte_decoder`).
pub fn byte_decoder(c: char) -> Option<u8> {
    let c = c as u32;
    // Printable ranges map to themselves.
    if (0x21..=0x7e).contains(&c) || (0xa1..=0xac).contains(&c) || (0xae..=0xff).contains(&c) {
        return Some(c as u8);
    }
    // The other 68 bytes map, in order, to U+0100 onwards.
    if (0x100..0x100 + 68).contains(&c) {
        let n = c - 0x100;
        let mut k = 0;
        for b in 0u32..256 {
            let printable = (0x21..=0x7e).contains(&b)
                || (0xa1..=0xac).contains(&b)
                || (0xae..=0xff).contains(&b);
            if !printable {
                if k == n {
                    return Some(b as u8);
                }
                k += 1;
            }
        }
    }
    None
}

/// GPT-2's byte-to-unicode map: `byte -> char`.
pub fn byte_to_unicode(b: u8) -> char {
    let printable = (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    if printable {
        return char::from(b);
    }
    let n = (0..b)
        .filter(|&x| !((0x21..=0x7e).contains(&x) || (0xa1..=0xac).contains(&x) || x >= 0xae))
        .count() as u32;
    char::from_u32(0x100 + n).unwrap_or('\u{fffd}')
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Every token's bytes ([`spm_token_bytes`]; none for an id without a token) back to back,
/// and where each starts: one buffer where a `Vec` per token took ~15 MB for Gemma 3's
/// 262k-token vocabulary (issue #31's peak memory).
struct SpmBytes {
    bytes: Vec<u8>,
    /// `n + 1` offsets into `bytes`.
    starts: Vec<u32>,
}

impl SpmBytes {
    fn new(map: &TokenMap) -> SpmBytes {
        let mut m = SpmBytes {
            bytes: Vec::new(),
            starts: Vec::with_capacity(map.len() + 1),
        };
        m.starts.push(0);
        for t in map.iter() {
            if let Some(t) = t {
                m.bytes.extend_from_slice(&spm_token_bytes(t));
            }
            // Vocabularies are far below 4 GB of text; saturate rather than wrap past it.
            m.starts
                .push(u32::try_from(m.bytes.len()).unwrap_or(u32::MAX));
        }
        m.bytes.shrink_to_fit();
        m
    }

    /// Token `i`'s bytes; `None` past the map.
    fn get(&self, i: usize) -> Option<&[u8]> {
        let (a, b) = (*self.starts.get(i)?, *self.starts.get(i + 1)?);
        self.bytes.get(a as usize..b as usize)
    }
}

#[derive(Clone)]
enum State {
    Naive {
        tokenizer: Box<Tokenizer>,
        clean_spaces: bool,
        text: String,
        text_chars: usize,
        current_tokens: Vec<u32>,
        current_text: String,
    },
    Spm {
        token_bytes: Arc<SpmBytes>,
        trim_space: bool,
        unflushed: Vec<u8>,
        text: String,
    },
    Bpe {
        token_map: Arc<TokenMap>,
        unflushed: String,
        text: String,
        /// Every byte as its token holds it, nothing trimmed (llama.cpp's RWKV vocabularies,
        /// which mlx-lm has no detokenizer for): the text is the full decode's.
        exact: bool,
    },
}

/// A streaming detokenizer (see the module docs). Get one from [`Tokenizer::detokenizer`].
#[derive(Clone)]
pub struct StreamingDetokenizer {
    state: State,
    tokens: Vec<u32>,
    /// Characters of text already returned by `last_segment`.
    offset_chars: usize,
}

impl std::fmt::Debug for StreamingDetokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.state {
            State::Naive { .. } => "naive",
            State::Spm { .. } => "spm",
            State::Bpe { .. } => "bpe",
        };
        f.debug_struct("StreamingDetokenizer")
            .field("kind", &kind)
            .field("tokens", &self.tokens.len())
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// A fresh streaming detokenizer (mlx-lm's `tokenizer.detokenizer`).
    pub fn detokenizer(&self) -> StreamingDetokenizer {
        StreamingDetokenizer::new(self)
    }
}

impl StreamingDetokenizer {
    /// The detokenizer mlx-lm picks for `tokenizer`.
    pub fn new(tokenizer: &Tokenizer) -> Self {
        Self::with_kind(tokenizer, tokenizer.detokenizer_kind())
    }

    /// A detokenizer of the given kind for `tokenizer`.
    pub fn with_kind(tokenizer: &Tokenizer, kind: DetokenizerKind) -> Self {
        let state = match kind {
            DetokenizerKind::Naive => {
                let clean_spaces = tokenizer
                    .encode("a ,b", false)
                    .and_then(|ids| tokenizer.decode(&ids, false))
                    .map(|t| !t.contains(" ,"))
                    .unwrap_or(false);
                State::Naive {
                    tokenizer: Box::new(tokenizer.clone()),
                    clean_spaces,
                    text: String::new(),
                    text_chars: 0,
                    current_tokens: Vec::new(),
                    current_text: String::new(),
                }
            }
            DetokenizerKind::Spm { trim_space } => {
                let map = tokenizer.token_map();
                State::Spm {
                    token_bytes: Arc::new(SpmBytes::new(&map)),
                    trim_space,
                    unflushed: Vec::new(),
                    text: String::new(),
                }
            }
            DetokenizerKind::Bpe => State::Bpe {
                token_map: tokenizer.token_map(),
                unflushed: String::new(),
                text: String::new(),
                exact: tokenizer.has_trie_encoder(),
            },
        };
        Self {
            state,
            tokens: Vec::new(),
            offset_chars: 0,
        }
    }

    /// Drops all streaming state.
    pub fn reset(&mut self) {
        self.tokens.clear();
        self.offset_chars = 0;
        match &mut self.state {
            State::Naive {
                text,
                text_chars,
                current_tokens,
                current_text,
                ..
            } => {
                text.clear();
                *text_chars = 0;
                current_tokens.clear();
                current_text.clear();
            }
            State::Spm {
                unflushed, text, ..
            } => {
                unflushed.clear();
                text.clear();
            }
            State::Bpe {
                unflushed, text, ..
            } => {
                unflushed.clear();
                text.clear();
            }
        }
    }

    /// Every token added so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Consumes one token id.
    pub fn add_token(&mut self, token: u32) {
        self.tokens.push(token);
        match &mut self.state {
            State::Naive { current_tokens, .. } => current_tokens.push(token),
            State::Spm {
                token_bytes,
                trim_space,
                unflushed,
                text,
            } => {
                if let Some(b) = token_bytes.get(token as usize) {
                    unflushed.extend_from_slice(b);
                }
                spm_try_flush(unflushed, text, *trim_space, false);
            }
            State::Bpe {
                token_map,
                unflushed,
                text,
                exact: true,
            } => {
                if let Some(Some(t)) = token_map.get(token as usize) {
                    unflushed.push_str(t);
                }
                let decoded = bpe_decode_exact(unflushed);
                if !decoded.ends_with('\u{fffd}') {
                    text.push_str(&decoded);
                    unflushed.clear();
                }
            }
            State::Bpe {
                token_map,
                unflushed,
                text,
                exact: false,
            } => {
                // mlx-lm's fallback for ids past the vocabulary.
                let v: &str = match token_map.get(token as usize) {
                    Some(Some(t)) => t,
                    Some(None) => "",
                    None => "!",
                };
                unflushed.push_str(v);
                let decoded = bpe_decode_streaming(unflushed);
                let mut chars = v.chars();
                let lone_space = matches!(
                    (chars.next(), chars.next()),
                    (Some(c), None) if byte_decoder(c) == Some(32)
                );
                if !decoded.ends_with('\u{fffd}') && !lone_space {
                    let t = maybe_trim_space(&decoded, text.is_empty());
                    text.push_str(t);
                    unflushed.clear();
                }
            }
        }
    }

    /// Flushes any text held back waiting for more tokens.
    pub fn finalize(&mut self) -> Result<()> {
        match &mut self.state {
            State::Naive {
                tokenizer,
                text,
                text_chars,
                current_tokens,
                current_text,
                ..
            } => {
                let t = tokenizer.decode(current_tokens, false)?;
                *text_chars += t.chars().count();
                text.push_str(&t);
                current_tokens.clear();
                current_text.clear();
            }
            State::Spm {
                trim_space,
                unflushed,
                text,
                ..
            } => {
                spm_try_flush(unflushed, text, *trim_space, true);
                unflushed.clear();
            }
            State::Bpe {
                unflushed,
                text,
                exact: true,
                ..
            } => {
                text.push_str(&bpe_decode_exact(unflushed));
                unflushed.clear();
            }
            State::Bpe {
                unflushed, text, ..
            } => {
                let bytes: Vec<u8> = unflushed
                    .chars()
                    .flat_map(|c| match byte_decoder(c) {
                        Some(b) => vec![b],
                        None => c.to_string().into_bytes(),
                    })
                    .collect();
                let current = lossy(&bytes);
                let t = maybe_trim_space(&current, text.is_empty());
                text.push_str(t);
                unflushed.clear();
            }
        }
        Ok(())
    }

    /// The whole text so far (mlx-lm's `text` property; for the naive detokenizer reading it
    /// moves completed lines into the stable text, as in mlx-lm).
    pub fn text(&mut self) -> Result<String> {
        match &mut self.state {
            State::Naive {
                tokenizer,
                clean_spaces,
                text,
                text_chars,
                current_tokens,
                current_text,
            } => {
                Self::naive_update(
                    tokenizer,
                    *clean_spaces,
                    text,
                    text_chars,
                    current_tokens,
                    current_text,
                )?;
                Ok(format!("{text}{current_text}"))
            }
            State::Spm { text, .. } | State::Bpe { text, .. } => Ok(text.clone()),
        }
    }

    fn naive_update(
        tokenizer: &Tokenizer,
        clean_spaces: bool,
        text: &mut String,
        text_chars: &mut usize,
        current_tokens: &mut Vec<u32>,
        current_text: &mut String,
    ) -> Result<()> {
        if !current_tokens.is_empty() {
            *current_text = tokenizer.decode(current_tokens, false)?;
            if current_text.ends_with('\u{fffd}') {
                let keep = current_text.trim_end_matches('\u{fffd}').len();
                current_text.truncate(keep);
            } else if clean_spaces && current_text.ends_with(' ') {
                current_text.pop();
            }
        }
        if current_text.ends_with('\n') {
            *text_chars += current_text.chars().count();
            text.push_str(current_text);
            current_tokens.clear();
            current_text.clear();
        }
        Ok(())
    }

    /// The text added since the previous call (mlx-lm's `last_segment`). Never ends inside a
    /// UTF-8 character: the detokenizers hold back incomplete bytes.
    pub fn last_segment(&mut self) -> Result<String> {
        let offset = self.offset_chars;
        let (segment, total) = match &mut self.state {
            State::Naive {
                tokenizer,
                clean_spaces,
                text,
                text_chars,
                current_tokens,
                current_text,
            } => {
                Self::naive_update(
                    tokenizer,
                    *clean_spaces,
                    text,
                    text_chars,
                    current_tokens,
                    current_text,
                )?;
                let cur_chars = current_text.chars().count();
                let total = *text_chars + cur_chars;
                let segment = if offset >= *text_chars {
                    current_text.chars().skip(offset - *text_chars).collect()
                } else {
                    let mut s: String = text.chars().skip(offset).collect();
                    s.push_str(current_text);
                    s
                };
                (segment, total)
            }
            State::Spm { text, .. } | State::Bpe { text, .. } => {
                let segment: String = text.chars().skip(offset).collect();
                (segment, text.chars().count())
            }
        };
        self.offset_chars = total;
        Ok(segment)
    }
}

/// mlx-lm's `SPMStreamingDetokenizer` token map entry.
pub fn spm_token_bytes(t: &str) -> Vec<u8> {
    if let Some(hex) = t.strip_prefix("<0x") {
        if let Some(h) = hex.get(0..2) {
            if let Ok(b) = u8::from_str_radix(h, 16) {
                return vec![b];
            }
        }
    }
    t.as_bytes().to_vec()
}

fn spm_try_flush(unflushed: &mut Vec<u8>, text: &mut String, trim_space: bool, force: bool) {
    const SEP: &[u8] = "\u{2581}".as_bytes();
    let mut replaced = Vec::with_capacity(unflushed.len());
    let mut i = 0;
    while i < unflushed.len() {
        if unflushed[i..].starts_with(SEP) {
            replaced.push(b' ');
            i += SEP.len();
        } else {
            replaced.push(unflushed[i]);
            i += 1;
        }
    }
    let decoded = lossy(&replaced);
    if !force && decoded.ends_with('\u{fffd}') {
        return;
    }
    let t = if text.is_empty() && trim_space {
        decoded.strip_prefix(' ').unwrap_or(&decoded)
    } else {
        &decoded
    };
    text.push_str(t);
    unflushed.clear();
}

/// mlx-lm's `BPEStreamingDetokenizer._decode_bytes`, with its byte-0 quirk.
fn bpe_decode_streaming(seq: &str) -> String {
    let mut bytes = Vec::with_capacity(seq.len());
    for c in seq.chars() {
        match byte_decoder(c) {
            Some(b) if b != 0 => bytes.push(b),
            _ => {
                let mut buf = [0u8; 4];
                bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    lossy(&bytes)
}

/// Byte-level characters back to their bytes, every byte (0 included).
fn bpe_decode_exact(seq: &str) -> String {
    let bytes: Vec<u8> = seq
        .chars()
        .flat_map(|c| match byte_decoder(c) {
            Some(b) => vec![b],
            None => c.to_string().into_bytes(),
        })
        .collect();
    lossy(&bytes)
}

fn maybe_trim_space(current: &str, nothing_yet: bool) -> &str {
    if nothing_yet {
        current.strip_prefix(' ').unwrap_or(current)
    } else {
        current
    }
}

#[cfg(test)]
mod tests {
    use super::{byte_decoder, byte_to_unicode};

    #[test]
    fn byte_map_round_trips() {
        for b in 0..=255u8 {
            assert_eq!(byte_decoder(byte_to_unicode(b)), Some(b), "byte {b}");
        }
        assert_eq!(byte_to_unicode(b' '), '\u{120}');
        assert_eq!(byte_to_unicode(b'\n'), '\u{10a}');
        assert_eq!(byte_to_unicode(0), '\u{100}');
        assert_eq!(byte_decoder('a'), Some(b'a'));
        assert_eq!(byte_decoder('\u{3042}'), None);
    }
}

//! Encoders of llama.cpp's that the `tokenizers` crate has no model for, used by
//! [`Tokenizer::encode`](crate::Tokenizer::encode) in place of the backend's model (the backend
//! still holds the vocabulary and decodes).
//!
//! - [`TrieEncoder::rwkv`]: llama.cpp's `LLM_TOKENIZER_RWKV` (`src/llama-vocab.cpp`,
//!   `llm_tokenizer_rwkv_session::tokenize`): the vocabulary's tokens, unescaped from the
//!   Python `repr` spelling the converter writes (`llama_unescape_rwkv_token`), in a byte trie;
//!   the text is taken greedily, at each position the longest token that starts there.
//!
//! Special tokens (types control, user-defined and unknown, as llama.cpp's
//! `cache_special_tokens`) are split out of the text first, the longest first, each at every
//! occurrence left to right (`tokenizer_st_partition` with `parse_special`).

use crate::tokenizer::{Result, TokenizerError};

/// llama.cpp's `llama_unescape_rwkv_token`: `\t`, `\n`, `\r`, `\xHH` (lower-case hex, as
/// Python's `repr` writes it) and `\` before any other character (that character) decode; the
/// rest is copied byte for byte. Ported step for step, including its reading of a non-hex
/// digit after `\x` (wrapping arithmetic on the character, as the C++ does on `uint8_t`).
pub fn unescape_rwkv_token(escaped: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(escaped.len());
    let mut escaping = false;
    let mut hex_remaining = 0u8;
    let mut hex_acc = 0u8;
    for &c in escaped.as_bytes() {
        if hex_remaining != 0 {
            let value = if c >= b'a' {
                c.wrapping_sub(b'a').wrapping_add(10)
            } else {
                c.wrapping_sub(b'0')
            };
            hex_acc = (hex_acc << 4).wrapping_add(value);
            hex_remaining -= 1;
            if hex_remaining == 0 {
                out.push(hex_acc);
                hex_acc = 0;
            }
            continue;
        }
        if escaping {
            match c {
                b't' => out.push(b'\t'),
                b'n' => out.push(b'\n'),
                b'r' => out.push(b'\r'),
                b'x' => hex_remaining = 2,
                _ => out.push(c),
            }
            escaping = false;
            continue;
        }
        if c == b'\\' {
            escaping = true;
            continue;
        }
        out.push(c);
    }
    out
}

/// A byte trie (llama.cpp's `naive_trie`): a later token with the same bytes replaces the
/// earlier one's id.
#[derive(Debug, Clone, Default)]
struct ByteTrie {
    /// Node 0 is the root; each node's children sorted by byte.
    nodes: Vec<TrieNode>,
}

#[derive(Debug, Clone, Default)]
struct TrieNode {
    children: Vec<(u8, u32)>,
    value: Option<u32>,
}

impl ByteTrie {
    fn new() -> Self {
        Self {
            nodes: vec![TrieNode::default()],
        }
    }

    fn child(&self, node: u32, b: u8) -> Option<u32> {
        let c = &self.nodes[node as usize].children;
        c.binary_search_by_key(&b, |(k, _)| *k).ok().map(|i| c[i].1)
    }

    fn insert(&mut self, key: &[u8], value: u32) {
        let mut node = 0u32;
        for &b in key {
            node = match self.child(node, b) {
                Some(n) => n,
                None => {
                    let n = self.nodes.len() as u32;
                    self.nodes.push(TrieNode::default());
                    let c = &mut self.nodes[node as usize].children;
                    let at = c.partition_point(|(k, _)| *k < b);
                    c.insert(at, (b, n));
                    n
                }
            };
        }
        self.nodes[node as usize].value = Some(value);
    }
}

/// Which of llama.cpp's algorithms a [`TrieEncoder`] runs (errors name it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrieKind {
    /// `LLM_TOKENIZER_RWKV`.
    Rwkv,
}

/// An encoder over a byte trie of the vocabulary, with llama.cpp's special-token split.
#[derive(Debug, Clone)]
pub struct TrieEncoder {
    kind: TrieKind,
    trie: ByteTrie,
    /// Special tokens' bytes and ids, longest first (ties in id order).
    specials: Vec<(Vec<u8>, u32)>,
    /// `tokenizer.ggml.unknown_token_id`: what a byte no token starts with becomes.
    unk: Option<u32>,
}

impl TrieEncoder {
    /// llama.cpp's RWKV tokenizer over `tokens` (the GGUF's `tokenizer.ggml.tokens`, escaped)
    /// with their `types`; `unk` is the file's unknown token id (llama.cpp's default for RWKV:
    /// none).
    pub fn rwkv(tokens: &[String], types: &[i32], unk: Option<u32>) -> Self {
        let mut trie = ByteTrie::new();
        for (id, t) in tokens.iter().enumerate() {
            trie.insert(&unescape_rwkv_token(t), id as u32);
        }
        Self {
            kind: TrieKind::Rwkv,
            trie,
            specials: special_tokens(tokens, types),
            unk,
        }
    }

    /// The ids of `text`: special tokens split out, the rest through the trie.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        for piece in partition(text.as_bytes(), &self.specials) {
            match piece {
                Fragment::Token(id) => out.push(id),
                Fragment::Text(bytes) => self.tokenize(bytes, &mut out)?,
            }
        }
        Ok(out)
    }

    /// `llm_tokenizer_rwkv_session::tokenize`. Where llama.cpp would push its null token (a
    /// byte no token starts with, no unknown token) or loop forever (a byte that starts tokens
    /// but is no token itself, the vocabulary lacking that byte), an error names the byte.
    fn tokenize(&self, text: &[u8], out: &mut Vec<u32>) -> Result<()> {
        let mut pos = 0usize;
        while pos < text.len() {
            let start = pos;
            let Some(mut node) = self.trie.child(0, text[pos]) else {
                match self.unk {
                    Some(u) => {
                        out.push(u);
                        pos += 1;
                        continue;
                    }
                    None => return Err(self.no_token(text, start)),
                }
            };
            let mut found: Option<(u32, usize)> = None;
            loop {
                if let Some(v) = self.trie.nodes[node as usize].value {
                    found = Some((v, pos + 1));
                }
                if pos + 1 >= text.len() {
                    break;
                }
                pos += 1;
                match self.trie.child(node, text[pos]) {
                    Some(n) => node = n,
                    None => break,
                }
            }
            let Some((id, end)) = found else {
                return Err(self.no_token(text, start));
            };
            out.push(id);
            pos = end;
        }
        Ok(())
    }

    fn no_token(&self, text: &[u8], at: usize) -> TokenizerError {
        TokenizerError::Invalid(format!(
            "GGUF {:?} vocabulary: no token starts with byte 0x{:02x} (at byte {at} of the text) \
             and tokenizer.ggml.unknown_token_id is not set",
            self.kind, text[at]
        ))
    }
}

/// llama.cpp's `cache_special_tokens`: types control (3), user-defined (4) and unknown (2),
/// longest first.
fn special_tokens(tokens: &[String], types: &[i32]) -> Vec<(Vec<u8>, u32)> {
    let mut specials: Vec<(Vec<u8>, u32)> = tokens
        .iter()
        .zip(types)
        .enumerate()
        .filter(|(_, (t, ty))| matches!(**ty, 2..=4) && !t.is_empty())
        .map(|(i, (t, _))| (t.as_bytes().to_vec(), i as u32))
        .collect();
    specials.sort_by_key(|(t, _)| std::cmp::Reverse(t.len()));
    specials
}

/// A piece of partitioned text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fragment<'a> {
    Text(&'a [u8]),
    Token(u32),
}

/// `tokenizer_st_partition` with `parse_special`: each special token in turn splits every text
/// fragment left at each of its occurrences, left to right.
fn partition<'a>(text: &'a [u8], specials: &[(Vec<u8>, u32)]) -> Vec<Fragment<'a>> {
    let mut frags = vec![Fragment::Text(text)];
    for (tok, id) in specials {
        let mut next = Vec::with_capacity(frags.len());
        for f in frags {
            let Fragment::Text(mut rest) = f else {
                next.push(f);
                continue;
            };
            while let Some(at) = find(rest, tok) {
                if at > 0 {
                    next.push(Fragment::Text(&rest[..at]));
                }
                next.push(Fragment::Token(*id));
                rest = &rest[at + tok.len()..];
            }
            if !rest.is_empty() {
                next.push(Fragment::Text(rest));
            }
        }
        frags = next;
    }
    frags
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || needle.len() > hay.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescape_reads_python_repr() {
        assert_eq!(unescape_rwkv_token(r"\xe4\xbd"), vec![0xe4, 0xbd]);
        assert_eq!(unescape_rwkv_token(r"a\tb\n\r"), b"a\tb\n\r".to_vec());
        assert_eq!(unescape_rwkv_token(r"\\\'"), b"\\'".to_vec());
        assert_eq!(unescape_rwkv_token("plain"), b"plain".to_vec());
    }

    #[test]
    fn greedy_longest_match_and_errors() {
        let toks: Vec<String> = ["a", "b", "ab", "abc", "<s>", "c"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let types = [1, 1, 1, 1, 3, 1];
        let e = TrieEncoder::rwkv(&toks, &types, None);
        // "abca": "abc" then "a"; "abab": "ab" "ab"; the special token split out.
        assert_eq!(e.encode("abca").unwrap(), vec![3, 0]);
        assert_eq!(e.encode("ab<s>abab").unwrap(), vec![2, 4, 2, 2]);
        let err = e.encode("az").unwrap_err().to_string();
        assert!(
            err.contains("0x7a") && err.contains("unknown_token_id"),
            "{err}"
        );
        let e = TrieEncoder::rwkv(&toks, &types, Some(5));
        assert_eq!(e.encode("az").unwrap(), vec![0, 5]);
    }
}

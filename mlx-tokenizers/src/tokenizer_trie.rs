//! Encoders of llama.cpp's that the `tokenizers` crate has no model for, used by
//! [`Tokenizer::encode`](crate::Tokenizer::encode) in place of the backend's model (the backend
//! still holds the vocabulary and decodes).
//!
//! - [`TrieEncoder::rwkv`]: llama.cpp's `LLM_TOKENIZER_RWKV` (`src/llama-vocab.cpp`,
//!   `llm_tokenizer_rwkv_session::tokenize`): the vocabulary's tokens, unescaped from the
//!   Python `repr` spelling the converter writes (`llama_unescape_rwkv_token`), in a byte trie;
//!   the text is taken greedily, at each position the longest token that starts there.
//! - [`TrieEncoder::plamo2`]: llama.cpp's `llm_tokenizer_plamo2` (PLaMo 2's own tokenizer): a
//!   Viterbi search over code points for the segmentation of least cost, each token costing
//!   minus its score (times 10^4, rounded), a code point no token covers costing 10^7 and
//!   spelled by its UTF-8 byte tokens. Ported with its suffix table, so that ties and its
//!   treatment of out-of-range scores are llama.cpp's.
//!
//! - [`TrieEncoder::hybriddna`]: llama.cpp's `llm_tokenizer_hybriddna_session` (HybriDNA):
//!   byte-level BPE outside `<dna>...</dna>`, the DNA between cut into 6-mers (upper-cased, the
//!   last padded with `A`), each its k-mer token (spelled with a U+E000 suffix) or `<oov>`.
//!
//! - [`TrieEncoder::spm`]: llama.cpp's `llm_tokenizer_spm_session` (SentencePiece `"llama"`
//!   vocabularies) for files without `tokenizer.ggml.scores` (llama.cpp's xverse converter
//!   writes none; llama.cpp reads every score as 0): see [`SpmVocab`]. With scores the
//!   `tokenizers` crate's BPE is used instead (transformers' converter, what mlx-lm users get);
//!   it cannot express merges that all rank the same.
//!
//! Special tokens (types control, user-defined and unknown, as llama.cpp's
//! `cache_special_tokens`) are split out of the text first, the longest first, each at every
//! occurrence left to right (`tokenizer_st_partition` with `parse_special`).

use crate::error::{Result, TokenizerError};

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
    /// `llm_tokenizer_plamo2`.
    Plamo2,
    /// `llm_tokenizer_hybriddna_session`.
    HybridDna,
    /// `llm_tokenizer_spm_session`.
    Spm,
}

#[derive(Debug, Clone)]
enum Algo {
    Rwkv(ByteTrie),
    Plamo2(Box<Plamo2Table>),
    HybridDna(Box<DnaKmers>),
    Spm(Box<SpmVocab>),
}

/// `llm_tokenizer_spm_session`'s vocabulary, as llama.cpp loads it: each token's text to its id
/// (a later duplicate wins; an empty token is spelled `[EMPTY_<id>]`) and each token's score.
///
/// The session, per text fragment: spaces written `▁` (after one leading space where
/// `tokenizer.ggml.add_space_prefix`, default on, and the fragment opens the text or follows a
/// special token), the text cut into UTF-8 characters, then every adjacent pair whose
/// concatenation is a token (any token, of any type) queued; the queue gives the pair of highest
/// score, among equal scores the leftmost; a pair whose halves changed since it was queued is
/// dropped; merging one queues its new pairs with the neighbours. With every score 0 (a file
/// without scores) this merges, again and again, the leftmost adjacent pair that spells a token.
/// Each symbol left is its token or, when it is none, its bytes' tokens (`<0xXX>`, else the
/// one-byte token). llama.cpp's `rev_merge` lookup is never reached: it holds only texts that
/// are tokens, which are emitted before it is consulted.
///
/// Decoding is llama.cpp's `llama_detokenize` for SentencePiece: each token's piece
/// (`token_to_piece`), the first's one leading space dropped where `add_space_prefix`.
#[derive(Debug, Clone)]
struct SpmVocab {
    token_to_id: std::collections::HashMap<String, u32>,
    scores: Vec<f32>,
    add_space_prefix: bool,
    /// Each token's piece, and whether it is control or unknown (rendered only when special
    /// tokens are).
    pieces: Vec<(Vec<u8>, bool)>,
}

/// llama.cpp's `token_to_piece` for a SentencePiece token of GGUF type `ty`: control (3) and
/// unknown (2) its text, flagged special; user-defined (4) its text; normal (1) its text with
/// `▁` as spaces; byte (6) the byte its text's characters 3..5 spell in hex (`strtol`: the hex
/// digits there, 0 if none); any other type nothing.
fn spm_piece(text: &str, ty: i32) -> (Vec<u8>, bool) {
    match ty {
        2 | 3 => (text.as_bytes().to_vec(), true),
        4 => (text.as_bytes().to_vec(), false),
        1 => (text.replace('\u{2581}', " ").into_bytes(), false),
        6 => {
            let digits = text.as_bytes().get(3..5.min(text.len())).unwrap_or(&[]);
            let mut v = 0u32;
            for &c in digits {
                match (c as char).to_digit(16) {
                    Some(d) => v = v * 16 + d,
                    None => break,
                }
            }
            (vec![v as u8], false)
        }
        _ => (Vec::new(), false),
    }
}

/// A queued pair of `llm_bigram_spm`: ordered as its comparator orders it (the greatest: the
/// highest score, then the smallest left index).
#[derive(Debug, Clone, Copy)]
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Scores are finite (the builder checks them).
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// One `llm_symbol`: a byte range of the escaped text, linked to its neighbours.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    n: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl SpmVocab {
    fn new(tokens: &[String], types: &[i32], scores: &[f32], add_space_prefix: bool) -> Self {
        let mut token_to_id = std::collections::HashMap::with_capacity(tokens.len());
        let mut pieces = Vec::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            let text = if t.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                t.clone()
            };
            pieces.push(spm_piece(&text, types.get(i).copied().unwrap_or(1)));
            token_to_id.insert(text, i as u32);
        }
        Self {
            token_to_id,
            scores: scores.to_vec(),
            add_space_prefix,
            pieces,
        }
    }

    /// `llama_detokenize(remove_special = false, unparse_special = special)`: ids outside the
    /// vocabulary give nothing.
    fn decode(&self, ids: &[u32], special: bool) -> String {
        let mut out = Vec::new();
        let mut strip = self.add_space_prefix;
        for &id in ids {
            if let Some((piece, is_special)) = self.pieces.get(id as usize) {
                if special || !is_special {
                    let skip = usize::from(strip && piece.first() == Some(&b' '));
                    out.extend_from_slice(&piece[skip..]);
                }
            }
            strip = false;
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// `llm_tokenizer_spm_session::tokenize` on `text` (already prefixed, not yet escaped).
    fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        use std::collections::BinaryHeap;
        let text = text.replace(' ', "\u{2581}");
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        let chars: Vec<(usize, char)> = text.char_indices().collect();
        for (k, &(start, c)) in chars.iter().enumerate() {
            symbols.push(Symbol {
                start,
                n: c.len_utf8(),
                prev: k.checked_sub(1),
                next: (k + 1 < chars.len()).then_some(k + 1),
            });
        }
        let mut queue = BinaryHeap::new();
        let try_add = |queue: &mut BinaryHeap<Bigram>,
                       symbols: &[Symbol],
                       l: Option<usize>,
                       r: Option<usize>| {
            let (Some(l), Some(r)) = (l, r) else {
                return;
            };
            let (a, b) = (symbols[l], symbols[r]);
            let piece = &text[a.start..a.start + a.n + b.n];
            if let Some(&id) = self.token_to_id.get(piece) {
                queue.push(Bigram {
                    left: l,
                    right: r,
                    score: self.scores[id as usize],
                    size: piece.len(),
                });
            }
        };
        for i in 1..symbols.len() {
            try_add(&mut queue, &symbols, Some(i - 1), Some(i));
        }
        while let Some(bigram) = queue.pop() {
            let (l, r) = (symbols[bigram.left], symbols[bigram.right]);
            if l.n == 0 || r.n == 0 || l.n + r.n != bigram.size {
                continue;
            }
            symbols[bigram.left].n += r.n;
            symbols[bigram.right].n = 0;
            symbols[bigram.left].next = r.next;
            if let Some(next) = r.next {
                symbols[next].prev = Some(bigram.left);
            }
            let (prev, next) = (symbols[bigram.left].prev, symbols[bigram.left].next);
            try_add(&mut queue, &symbols, prev, Some(bigram.left));
            try_add(&mut queue, &symbols, Some(bigram.left), next);
        }
        let mut at = (!symbols.is_empty()).then_some(0);
        while let Some(i) = at {
            let s = symbols[i];
            let piece = &text[s.start..s.start + s.n];
            match self.token_to_id.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for &b in piece.as_bytes() {
                        out.push(self.byte_token(b)?);
                    }
                }
            }
            at = s.next;
        }
        Ok(())
    }

    /// `llama_vocab::byte_to_token` for SentencePiece: `<0xXX>`, else the one-byte token; where
    /// llama.cpp throws (neither exists), an error names the byte.
    fn byte_token(&self, b: u8) -> Result<u32> {
        let hex = format!("<0x{b:02X}>");
        let one = (b < 0x80).then(|| (b as char).to_string());
        self.token_to_id
            .get(&hex)
            .or_else(|| one.and_then(|o| self.token_to_id.get(&o)))
            .copied()
            .ok_or_else(|| {
                TokenizerError::Invalid(format!(
                    "GGUF SentencePiece vocabulary: no byte token {hex} (or the byte itself) for \
                     a character that is no token"
                ))
            })
    }
}

/// llama.cpp's marker suffix (U+E000) on HybriDNA's k-mer tokens, which keeps them apart from
/// base-vocabulary tokens of the same letters.
pub const DNA_KMER_MARKER: &str = "\u{e000}";

/// `llm_tokenizer_hybriddna_session`'s data: the BPE for the text outside `<dna>...</dna>`, the
/// tag and `<oov>` ids, and the k-mer tokens (spelled with [`DNA_KMER_MARKER`]).
#[derive(Debug, Clone)]
struct DnaKmers {
    bpe: tokenizers::Tokenizer,
    begin: u32,
    end: u32,
    oov: u32,
    kmers: std::collections::HashMap<String, u32>,
}

impl DnaKmers {
    const K: usize = 6;
    const OPEN: &'static [u8] = b"<dna>";
    const CLOSE: &'static [u8] = b"</dna>";

    fn bpe(&self, text: &[u8], out: &mut Vec<u32>) -> Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        let text = String::from_utf8_lossy(text);
        let enc = self
            .bpe
            .encode_fast(text.as_ref(), false)
            .map_err(|e| TokenizerError::Backend(e.to_string()))?;
        out.extend_from_slice(enc.get_ids());
        Ok(())
    }

    /// `tokenize`: BPE outside the tags; between them (or to the end when unclosed) the
    /// sequence upper-cased (ASCII), cut into k-mers of 6, the last padded with `A`, each its
    /// token or `<oov>`.
    fn encode(&self, text: &[u8], out: &mut Vec<u32>) -> Result<()> {
        let mut pos = 0;
        while pos < text.len() {
            let Some(start) = find(&text[pos..], Self::OPEN).map(|i| i + pos) else {
                return self.bpe(&text[pos..], out);
            };
            self.bpe(&text[pos..start], out)?;
            out.push(self.begin);
            let content = start + Self::OPEN.len();
            let end = find(&text[content..], Self::CLOSE).map(|i| i + content);
            self.kmers(&text[content..end.unwrap_or(text.len())], out);
            let Some(end) = end else {
                break;
            };
            out.push(self.end);
            pos = end + Self::CLOSE.len();
        }
        Ok(())
    }

    fn kmers(&self, raw: &[u8], out: &mut Vec<u32>) {
        let seq: Vec<u8> = raw.iter().map(|b| b.to_ascii_uppercase()).collect();
        let token = |kmer: &[u8]| {
            std::str::from_utf8(kmer)
                .ok()
                .and_then(|k| self.kmers.get(&format!("{k}{DNA_KMER_MARKER}")))
                .copied()
                .unwrap_or(self.oov)
        };
        let mut chunks = seq.chunks(Self::K);
        for chunk in chunks.by_ref() {
            if chunk.len() == Self::K {
                out.push(token(chunk));
            } else {
                let mut last = chunk.to_vec();
                last.resize(Self::K, b'A');
                out.push(token(&last));
            }
        }
    }
}

/// An encoder of llama.cpp's over the vocabulary, with its special-token split.
#[derive(Debug, Clone)]
pub struct TrieEncoder {
    kind: TrieKind,
    algo: Algo,
    /// Special tokens' bytes and ids, longest first (ties in id order).
    specials: Vec<(Vec<u8>, u32)>,
    /// `tokenizer.ggml.unknown_token_id`: what a byte no token starts with becomes (RWKV).
    unk: Option<u32>,
    /// The BOS id added when special tokens are asked for (PLaMo 2 with `add_bos`).
    bos: Option<u32>,
    /// The EOS id added when special tokens are asked for (HybriDNA with `add_eos`).
    eos: Option<u32>,
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
            algo: Algo::Rwkv(trie),
            specials: special_tokens(tokens, types),
            unk,
            bos: None,
            eos: None,
        }
    }

    /// llama.cpp's PLaMo 2 tokenizer over `tokens` with their `types` and `scores`; `bos` is
    /// added in front when special tokens are asked for. Errors name a missing byte token.
    pub fn plamo2(
        tokens: &[String],
        types: &[i32],
        scores: &[f32],
        bos: Option<u32>,
    ) -> Result<Self> {
        Ok(Self {
            kind: TrieKind::Plamo2,
            algo: Algo::Plamo2(Box::new(Plamo2Table::build(tokens, types, scores)?)),
            specials: special_tokens(tokens, types),
            unk: None,
            bos,
            eos: None,
        })
    }

    /// llama.cpp's HybriDNA tokenizer: `bpe` (the byte-level BPE of the rest of the file, with
    /// no added tokens of its own to split) outside `<dna>...</dna>`, DNA k-mers between; `begin`,
    /// `end` and `oov` are the ids of `<dna>`, `</dna>` and `<oov>`; the k-mers are the tokens
    /// ending with [`DNA_KMER_MARKER`] (a later duplicate wins, as llama.cpp's `token_to_id`).
    /// `bos` / `eos` are added when special tokens are asked for.
    #[allow(clippy::too_many_arguments)]
    pub fn hybriddna(
        bpe: tokenizers::Tokenizer,
        tokens: &[String],
        types: &[i32],
        (begin, end, oov): (u32, u32, u32),
        bos: Option<u32>,
        eos: Option<u32>,
    ) -> Self {
        let kmers = tokens
            .iter()
            .enumerate()
            .filter(|(_, t)| t.ends_with(DNA_KMER_MARKER))
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        Self {
            kind: TrieKind::HybridDna,
            algo: Algo::HybridDna(Box::new(DnaKmers {
                bpe,
                begin,
                end,
                oov,
                kmers,
            })),
            specials: special_tokens(tokens, types),
            unk: None,
            bos,
            eos,
        }
    }

    /// llama.cpp's SentencePiece tokenizer over `tokens` with their `types` and `scores` (all 0
    /// for a file without `tokenizer.ggml.scores`); `add_space_prefix` puts a space before the
    /// text and after each special token; `bos` / `eos` are added when special tokens are asked
    /// for. See [`SpmVocab`].
    pub fn spm(
        tokens: &[String],
        types: &[i32],
        scores: &[f32],
        add_space_prefix: bool,
        bos: Option<u32>,
        eos: Option<u32>,
    ) -> Self {
        Self {
            kind: TrieKind::Spm,
            algo: Algo::Spm(Box::new(SpmVocab::new(
                tokens,
                types,
                scores,
                add_space_prefix,
            ))),
            specials: special_tokens(tokens, types),
            unk: None,
            bos,
            eos,
        }
    }

    /// Whether [`Self::encode`] adds a BOS and an EOS id when special tokens are asked for.
    pub(crate) fn adds(&self) -> (bool, bool) {
        (self.bos.is_some(), self.eos.is_some())
    }

    /// The ids of `text`: special tokens split out, the rest through the algorithm; BOS first
    /// when `add_special` and the encoder adds one.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        if add_special {
            out.extend(self.bos);
        }
        // SentencePiece: a space prefix on the text's first fragment and after special tokens.
        let mut prev_special = true;
        for piece in partition(text.as_bytes(), &self.specials) {
            match piece {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text([]) => {}
                Fragment::Text(bytes) => match &self.algo {
                    Algo::Spm(vocab) => {
                        let text = String::from_utf8_lossy(bytes);
                        if vocab.add_space_prefix && prev_special {
                            vocab.encode(&format!(" {text}"), &mut out)?;
                        } else {
                            vocab.encode(&text, &mut out)?;
                        }
                        prev_special = false;
                    }
                    Algo::Rwkv(trie) => self.tokenize(trie, bytes, &mut out)?,
                    Algo::Plamo2(table) => {
                        // Fragments split at special tokens' UTF-8 spellings stay UTF-8.
                        let text = String::from_utf8_lossy(bytes);
                        table.encode(&text, &mut out)?;
                    }
                    Algo::HybridDna(dna) => dna.encode(bytes, &mut out)?,
                },
            }
        }
        if add_special {
            out.extend(self.eos);
        }
        Ok(out)
    }

    /// llama.cpp's text of `ids` where it decodes differently from the backend (SentencePiece:
    /// `llama_detokenize`, control tokens rendered when `special`); `None` for the others.
    pub fn decode(&self, ids: &[u32], special: bool) -> Option<String> {
        match &self.algo {
            Algo::Spm(vocab) => Some(vocab.decode(ids, special)),
            _ => None,
        }
    }

    /// `llm_tokenizer_rwkv_session::tokenize`. Where llama.cpp would push its null token (a
    /// byte no token starts with, no unknown token) or loop forever (a byte that starts tokens
    /// but is no token itself, the vocabulary lacking that byte), an error names the byte.
    fn tokenize(&self, trie: &ByteTrie, text: &[u8], out: &mut Vec<u32>) -> Result<()> {
        let mut pos = 0usize;
        while pos < text.len() {
            let start = pos;
            let Some(mut node) = trie.child(0, text[pos]) else {
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
                if let Some(v) = trie.nodes[node as usize].value {
                    found = Some((v, pos + 1));
                }
                if pos + 1 >= text.len() {
                    break;
                }
                pos += 1;
                match trie.child(node, text[pos]) {
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

const INVALID_SCORE: i32 = -20_000_000;
const UNKNOWN_SCORE: i32 = -10_000_000;

/// One row of [`Plamo2Table`]: a piece that is a prefix of a suffix.
#[derive(Debug, Clone, Copy)]
struct Row {
    len: i32,
    token: i32,
    score: i32,
    piece: i32,
}

/// `llm_tokenizer_plamo2`'s tables, built as it builds them.
#[derive(Debug, Clone)]
struct Plamo2Table {
    bytes: [u32; 256],
    to_suffix_id: std::collections::HashMap<i64, i32>,
    table: Vec<Row>,
}

impl Plamo2Table {
    fn build(tokens: &[String], types: &[i32], scores: &[f32]) -> Result<Self> {
        use std::collections::HashMap;
        if scores.len() != tokens.len() || types.len() != tokens.len() {
            return Err(TokenizerError::Invalid(format!(
                "GGUF PLaMo 2 vocabulary: {} tokens, {} tokenizer.ggml.scores, {} \
                 tokenizer.ggml.token_type entries",
                tokens.len(),
                scores.len(),
                types.len()
            )));
        }
        let mut bytes = [0u32; 256];
        let mut suffix_to_score: HashMap<String, f32> = HashMap::new();
        let mut token_to_id: HashMap<&str, i32> = HashMap::new();
        for (id, text) in tokens.iter().enumerate() {
            token_to_id.insert(text.as_str(), id as i32);
            if types.get(id) == Some(&6) {
                let b = text.as_bytes();
                if b.len() == 6 && text.starts_with("<0x") && text.ends_with('>') {
                    if let Ok(v) = u8::from_str_radix(&text[3..5], 16) {
                        bytes[v as usize] = id as u32;
                    }
                }
                continue;
            }
            suffix_to_score.insert(text.clone(), scores[id]);
            let cps: Vec<char> = text.chars().collect();
            for i in 1..cps.len() {
                let suffix: String = cps[i..].iter().collect();
                suffix_to_score.entry(suffix).or_insert(f32::NAN);
            }
        }
        if let Some(b) = bytes.iter().position(|&id| id == 0) {
            return Err(TokenizerError::Invalid(format!(
                "GGUF PLaMo 2 vocabulary: no byte token <0x{b:02X}> (tokenizer.ggml.token_type 6)"
            )));
        }
        let mut suffixes: Vec<&str> = suffix_to_score.keys().map(String::as_str).collect();
        suffixes.push("");
        suffixes.sort_by(|a, b| a.bytes().rev().cmp(b.bytes().rev()));
        let mut suffix_to_id: HashMap<&str, i32> = HashMap::with_capacity(suffixes.len());
        let mut to_suffix_id: HashMap<i64, i32> = HashMap::new();
        let mut num_pieces = 0i32;
        for &suffix in &suffixes {
            suffix_to_id.insert(suffix, num_pieces);
            let mut cps = suffix.char_indices();
            match cps.next() {
                Some((_, c0)) => {
                    let rest = &suffix[c0.len_utf8()..];
                    let code = (i64::from(c0 as u32) << 32)
                        | i64::from(*suffix_to_id.get(rest).unwrap_or(&0));
                    to_suffix_id.insert(code, num_pieces);
                    let n = prefixes(suffix)
                        .filter(|p| suffix_to_score.contains_key(*p))
                        .count();
                    num_pieces += 1 + n as i32;
                }
                None => num_pieces += 1,
            }
        }
        let mut table = Vec::with_capacity(num_pieces as usize);
        for &suffix in &suffixes {
            for (piece, len) in prefixes(suffix).zip((1..=suffix.chars().count()).rev()) {
                let Some(&score) = suffix_to_score.get(piece) else {
                    continue;
                };
                table.push(Row {
                    len: len as i32,
                    token: token_to_id.get(piece).copied().unwrap_or(-1),
                    score: if score.is_finite() {
                        (f64::from(score) * 1e4).round() as i32
                    } else {
                        INVALID_SCORE
                    },
                    piece: *suffix_to_id.get(piece).unwrap_or(&0),
                });
            }
            table.push(Row {
                len: 1,
                token: -1,
                score: UNKNOWN_SCORE,
                piece: 0,
            });
        }
        Ok(Self {
            bytes,
            to_suffix_id,
            table,
        })
    }

    /// `llm_tokenizer_plamo2::encode`.
    fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let mut data: Vec<char> = text.chars().collect();
        if data.first() == Some(&'\u{feff}') {
            data.remove(0);
        }
        let n = data.len();
        if n == 0 {
            return Ok(());
        }
        let mut scores = vec![1i64 << 60; n + 1];
        scores[n] = 0;
        // (token length, token id, number of tokens)
        let mut path = vec![(0i32, 0i32, 0i32); n + 1];
        let mut suffix_id = 0i32;
        for i in (0..n).rev() {
            let c = data[i] as u32;
            for p in suffix_id.max(0) as usize..self.table.len() {
                let code = (i64::from(c) << 32) | i64::from(self.table[p].piece);
                suffix_id = self.to_suffix_id.get(&code).copied().unwrap_or(0);
                if suffix_id > 0 || self.table[p].score == UNKNOWN_SCORE {
                    break;
                }
            }
            for p in suffix_id.max(0) as usize..self.table.len() {
                let row = self.table[p];
                if row.score > INVALID_SCORE {
                    let end = i + row.len as usize;
                    if end <= n {
                        let s = scores[end] - i64::from(row.score);
                        if s < scores[i] {
                            scores[i] = s;
                            let mut count = path[end].2 + 1;
                            if row.score == UNKNOWN_SCORE {
                                count += i32::from(c >= 0x80)
                                    + i32::from(c >= 0x800)
                                    + i32::from(c >= 0x10000);
                            }
                            path[i] = (row.len, row.token, count);
                        }
                    }
                }
                if row.score == UNKNOWN_SCORE {
                    break;
                }
            }
        }
        let mut pos = 0usize;
        while pos < n {
            let (len, token, _) = path[pos];
            if token >= 0 {
                out.push(token as u32);
            } else {
                let mut buf = [0u8; 4];
                for b in data[pos].encode_utf8(&mut buf).bytes() {
                    out.push(self.bytes[b as usize]);
                }
            }
            if len <= 0 {
                return Err(TokenizerError::Invalid(format!(
                    "GGUF PLaMo 2 vocabulary: no segmentation at code point {pos} of the text"
                )));
            }
            pos += len as usize;
        }
        Ok(())
    }
}

/// The prefixes of `s` by code points, longest first.
fn prefixes(s: &str) -> impl Iterator<Item = &str> {
    let mut ends: Vec<usize> = s.char_indices().map(|(i, c)| i + c.len_utf8()).collect();
    ends.reverse();
    ends.into_iter().map(move |e| &s[..e])
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
        assert_eq!(e.encode("abca", false).unwrap(), vec![3, 0]);
        assert_eq!(e.encode("ab<s>abab", true).unwrap(), vec![2, 4, 2, 2]);
        let err = e.encode("az", false).unwrap_err().to_string();
        assert!(
            err.contains("0x7a") && err.contains("unknown_token_id"),
            "{err}"
        );
        let e = TrieEncoder::rwkv(&toks, &types, Some(5));
        assert_eq!(e.encode("az", false).unwrap(), vec![0, 5]);
    }
}

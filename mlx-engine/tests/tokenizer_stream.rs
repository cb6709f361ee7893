//! Property tests of the streaming detokenizers on real tokenizers: the segments, concatenated,
//! are the full decode (up to mlx-lm's documented first-space trim), and splitting never
//! introduces U+FFFD (no segment ends inside a UTF-8 character).

use std::sync::OnceLock;

use mlx_engine::tokenizer_testdata::npm_tokenizer;
use mlx_engine::{DetokenizerKind, StreamingDetokenizer, Tokenizer};
use proptest::prelude::*;

fn qwen3() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::from_dir_with_eos(npm_tokenizer("qwen3").unwrap(), &[]).unwrap())
}

fn gemma3() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::from_dir_with_eos(npm_tokenizer("gemma3").unwrap(), &[]).unwrap())
}

/// Streams `ids` and returns the segments (one per token, then the finalize flush).
fn stream(mut d: StreamingDetokenizer, ids: &[u32]) -> Vec<String> {
    let mut segments = Vec::new();
    for &t in ids {
        d.add_token(t);
        segments.push(d.last_segment().unwrap());
    }
    d.finalize().unwrap();
    segments.push(d.last_segment().unwrap());
    segments
}

/// Text made of pieces that exercise multi-byte UTF-8, whitespace and digits.
fn text_strategy() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just(" ".to_string()),
        Just("\n".to_string()),
        Just("  ".to_string()),
        Just("\t".to_string()),
        "[a-zA-Z]{1,8}",
        "[0-9]{1,5}",
        "[.,!?;:'\"()-]{1,3}",
        "[\u{00c0}-\u{024f}]{1,4}",
        "[\u{4e00}-\u{4fff}]{1,4}",
        "[\u{3040}-\u{30ff}]{1,4}",
        "[\u{0600}-\u{06ff}]{1,4}",
        "[\u{1f300}-\u{1f64f}]{1,3}",
        Just("👨\u{200d}👩\u{200d}👧".to_string()),
        Just("e\u{301}".to_string()),
    ];
    proptest::collection::vec(piece, 0..24).prop_map(|v| v.concat())
}

/// mlx-lm's BPE/SPM detokenizers drop one leading space of the first text they emit.
fn expected(decoded: &str, trims: bool) -> String {
    if trims {
        decoded.strip_prefix(' ').unwrap_or(decoded).to_string()
    } else {
        decoded.to_string()
    }
}

fn check_stream(tok: &Tokenizer, kind: DetokenizerKind, ids: &[u32]) -> Result<(), TestCaseError> {
    let decoded = tok.decode(ids, false).unwrap();
    let segments = stream(StreamingDetokenizer::with_kind(tok, kind), ids);
    let joined: String = segments.concat();
    let trims = !matches!(
        kind,
        DetokenizerKind::Naive | DetokenizerKind::Spm { trim_space: false }
    );
    let want = expected(&decoded, trims);
    prop_assert_eq!(&joined, &want, "ids {:?}", ids);
    let fffd = |s: &str| s.chars().filter(|&c| c == '\u{fffd}').count();
    prop_assert_eq!(fffd(&joined), fffd(&want));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn bpe_stream_of_text_is_decode(text in text_strategy()) {
        let tok = qwen3();
        let ids = tok.encode(&text, false).unwrap();
        check_stream(tok, DetokenizerKind::Bpe, &ids)?;
        check_stream(tok, DetokenizerKind::Naive, &ids)?;
    }

    #[test]
    fn spm_stream_of_text_is_decode(text in text_strategy()) {
        let tok = gemma3();
        let ids = tok.encode(&text, false).unwrap();
        // Not the naive detokenizer: with byte-fallback tokens it can repeat text, as mlx-lm's
        // does (see `naive_detokenizer_repeats_like_mlx_lm_on_byte_fallback`).
        check_stream(tok, tok.detokenizer_kind(), &ids)?;
    }

    /// Arbitrary ids, including ones that split characters and byte tokens that never form one:
    /// the stream still equals the decode, so no replacement character comes from splitting.
    #[test]
    fn bpe_stream_of_random_ids_is_decode(raw in proptest::collection::vec(0u32..151_643, 0..40)) {
        let tok = qwen3();
        // mlx-lm's streaming byte map reads byte 0 (the token "Ā") as a character: skip it.
        let ids: Vec<u32> = raw
            .into_iter()
            .filter(|&i| !tok.id_to_token(i).unwrap_or_default().contains('\u{100}'))
            .collect();
        check_stream(tok, DetokenizerKind::Bpe, &ids)?;
    }

    /// Text spelled entirely with Gemma's byte tokens `<0xNN>`: every multi-byte character
    /// arrives one byte at a time.
    #[test]
    fn spm_stream_of_byte_tokens_is_decode(text in text_strategy()) {
        let tok = gemma3();
        let ids: Vec<u32> = text
            .bytes()
            .map(|b| tok.token_to_id(&format!("<0x{b:02X}>")).unwrap())
            .collect();
        prop_assert_eq!(tok.decode(&ids, false).unwrap(), text.clone());
        check_stream(tok, tok.detokenizer_kind(), &ids)?;
    }
}

#[test]
fn segments_never_split_a_character() {
    let tok = qwen3();
    let text = "😀👍🏽日本語 naïve";
    let ids = tok.encode(text, false).unwrap();
    let segments = stream(tok.detokenizer(), &ids);
    assert!(
        segments.iter().all(|s| !s.contains('\u{fffd}')),
        "{segments:?}"
    );
    assert_eq!(segments.concat(), text);
    // Some tokens hold only part of a character: their segments are empty.
    assert!(segments.iter().any(String::is_empty));
}

/// mlx-lm's naive detokenizer re-decodes the line; with byte fallback, a cut character decodes to
/// one U+FFFD per byte, all stripped, so the text shrinks and then repeats. mlx-lm 0.32.2 gives
/// exactly these segments for Gemma 3's `<0xC8><0xA0><0xC7><0x84>` ("ȠǄ").
#[test]
fn naive_detokenizer_repeats_like_mlx_lm_on_byte_fallback() {
    let tok = gemma3();
    let ids = [438, 398, 437, 370];
    let naive = stream(
        StreamingDetokenizer::with_kind(tok, DetokenizerKind::Naive),
        &ids,
    );
    assert_eq!(naive, ["", "Ƞ", "", "ȠǄ", ""]);
    let spm = stream(tok.detokenizer(), &ids);
    assert_eq!(spm, ["", "Ƞ", "", "Ǆ", ""]);
}

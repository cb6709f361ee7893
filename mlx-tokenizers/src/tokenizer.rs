//! The tokenizer: Hugging Face `tokenizer.json` through the `tokenizers` crate, with the
//! special-token, BOS/EOS and chat-template handling of mlx-lm 0.32.2's `TokenizerWrapper`
//! (which wraps a transformers 5 `AutoTokenizer`).
//!
//! What is reproduced, and from where:
//! - Loading (`transformers` `TokenizersBackend.__init__`): the pipeline comes from
//!   `tokenizer.json`; named special tokens (`bos_token`, `eos_token`, `unk_token`, `sep_token`,
//!   `pad_token`, `cls_token`, `mask_token`, any other `*_token` string, `extra_special_tokens`,
//!   `additional_special_tokens`) from `tokenizer_config.json`, falling back to the defaults of the
//!   named `tokenizer_class` (e.g. `GemmaTokenizer`'s `<mask>`). A special token missing from the
//!   added vocabulary is added as a special token, as transformers does. When the config states
//!   `add_bos_token` or `add_eos_token`, the post-processor becomes the template transformers
//!   builds from them.
//! - [`Tokenizer::decode`]: the backend's decode; transformers' `clean_up_tokenization` only for
//!   non-BPE models with `clean_up_tokenization_spaces` (transformers skips it for BPE).
//! - [`Tokenizer::eos_token_ids`]: a set, the ids given by the model's config plus the
//!   tokenizer's `eos_token` (mlx-lm `TokenizerWrapper`).
//! - [`Tokenizer::encode_prompt`]: `mlx_lm.generate.stream_generate`'s rule, which adds special
//!   tokens only when the text does not already start with the BOS token (a chat template that
//!   wrote `<bos>` itself does not get a second one).
//! - [`Tokenizer::apply_chat_template`]: mlx-lm's wrapper over transformers'
//!   `apply_chat_template(..., tokenize=False)`, see [`crate::chat_template`].
//! - [`Tokenizer::detokenizer`]: the streaming detokenizer mlx-lm picks from the decoder, see
//!   [`crate::tokenizer_stream`].

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use serde_json::{Map, Value};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::AddedToken;

use crate::chat_template::{ChatTemplate, ChatTemplateOptions, ChatTemplates};
pub use crate::error::{Result, TokenizerError};

pub(crate) fn backend_err(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Backend(e.to_string())
}

/// Runs a call into the tokenizers crate, turning a panic inside it (it indexes past its
/// buffers for some malformed normalizers) into an error.
pub(crate) fn backend<T>(what: &str, f: impl FnOnce() -> T) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|_| {
        TokenizerError::Backend(format!(
            "{what}: the tokenizers crate failed (it panicked); the tokenizer files are malformed"
        ))
    })
}

/// Which of mlx-lm's detokenizers to use, chosen from the `tokenizer.json` decoder as mlx-lm's
/// `tokenizer_utils.load` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DetokenizerKind {
    /// Re-decodes the current line on every token (any tokenizer).
    Naive,
    /// SentencePiece-style `▁` and `<0xNN>` byte tokens; `trim_space` drops the first leading space.
    Spm {
        /// Whether the first leading space is dropped (decoder ends with `Strip(" ", 1, 0)`).
        trim_space: bool,
    },
    /// GPT-2 byte-level BPE.
    Bpe,
}

impl DetokenizerKind {
    /// The kind for a decoder (mlx-lm's `_is_spm_decoder`, `_is_spm_decoder_no_space`,
    /// `_is_bpe_decoder`).
    pub fn for_decoder(decoder: Option<&tokenizers::DecoderWrapper>) -> Self {
        let Some(decoder) = decoder else {
            return Self::Naive;
        };
        let Ok(json) = serde_json::to_value(decoder) else {
            return Self::Naive;
        };
        let spm = serde_json::json!({
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0},
            ],
        });
        let spm_no_space = serde_json::json!({
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ],
        });
        if json == spm {
            Self::Spm { trim_space: true }
        } else if json == spm_no_space {
            Self::Spm { trim_space: false }
        } else if json.get("type").and_then(|t| t.as_str()) == Some("ByteLevel") {
            Self::Bpe
        } else {
            Self::Naive
        }
    }
}

/// The special-token attributes transformers names, in its order (`SPECIAL_TOKENS_ATTRIBUTES`).
const NAMED_SPECIAL_TOKENS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// Special-token defaults of the transformers 5 tokenizer classes that declare them in their
/// `__init__` (used when `tokenizer_config.json` does not state the token at all).
fn class_defaults(class: &str) -> &'static [(&'static str, &'static str)] {
    let class = class.strip_suffix("Fast").unwrap_or(class);
    match class {
        "GemmaTokenizer" => &[
            ("unk_token", "<unk>"),
            ("bos_token", "<bos>"),
            ("eos_token", "<eos>"),
            ("pad_token", "<pad>"),
            ("mask_token", "<mask>"),
        ],
        "Qwen2Tokenizer" => &[
            ("unk_token", "<|endoftext|>"),
            ("eos_token", "<|endoftext|>"),
            ("pad_token", "<|endoftext|>"),
        ],
        "GPT2Tokenizer" => &[
            ("unk_token", "<|endoftext|>"),
            ("bos_token", "<|endoftext|>"),
            ("eos_token", "<|endoftext|>"),
        ],
        "LlamaTokenizer" => &[
            ("unk_token", "<unk>"),
            ("bos_token", "<s>"),
            ("eos_token", "</s>"),
        ],
        _ => &[],
    }
}

/// A token string from a config value: a string, or a serialized `AddedToken`
/// (`{"content": ...}`).
fn token_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(m) => m.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// Thinking markers, as mlx-lm's `_infer_thinking` finds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThinkingMarkers {
    /// Text that opens a reasoning block (`<think>`).
    pub start: String,
    /// Text that closes it (`</think>`).
    pub end: String,
    /// Token ids of `start`.
    pub start_ids: Vec<u32>,
    /// Token ids of `end`.
    pub end_ids: Vec<u32>,
}

/// A tokenizer with mlx-lm's special-token, EOS, streaming and chat-template behaviour.
#[derive(Clone)]
pub struct Tokenizer {
    /// The backend; `None` once [`Tokenizer::keep_decoding_only`] dropped it.
    inner: Option<std::sync::Arc<tokenizers::Tokenizer>>,
    /// Named special tokens (`special_tokens_map` of transformers), in its order.
    special_tokens: Vec<(String, String)>,
    bos_token: Option<String>,
    bos_token_id: Option<u32>,
    eos_token: Option<String>,
    eos_token_id: Option<u32>,
    eos_token_ids: BTreeSet<u32>,
    clean_up_tokenization_spaces: bool,
    chat_templates: Option<ChatTemplates>,
    /// Where the chat templates came from (a file, GGUF metadata), which render errors name.
    chat_template_origin: Option<String>,
    chat_template_type: Option<String>,
    thinking: Option<ThinkingMarkers>,
    detokenizer_kind: DetokenizerKind,
    /// `convert_ids_to_tokens(range(len(tokenizer)))`, shared by detokenizers.
    token_map: std::sync::Arc<TokenMap>,
    /// An encoder of llama.cpp's that the backend has no model for (RWKV's byte trie, PLaMo 2's
    /// Viterbi search, SentencePiece with every score 0): `encode` runs it instead of the
    /// backend, which still decodes (but for SentencePiece, decoded as llama.cpp decodes).
    trie_encoder: Option<std::sync::Arc<crate::tokenizer_trie::TrieEncoder>>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("eos_token_ids", &self.eos_token_ids)
            .field("detokenizer", &self.detokenizer_kind)
            .finish_non_exhaustive()
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| TokenizerError::Io(format!("reading {}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| TokenizerError::Config(format!("parsing {}: {e}", path.display())))
}

/// How deeply a tokenizer.json may nest (real ones nest about 6 levels).
const MAX_TOKENIZER_JSON_DEPTH: usize = 64;

/// `tokenizers::Tokenizer::from_bytes`, hardened: deeply nested documents are refused first
/// (the tokenizers crate panics on them, `expect("Helper")` in its decoder deserializer), and
/// any other panic inside the crate becomes an error.
/// Why [`parse_tokenizer_json`] refused a document; the loader adds the file
/// ([`TokenizerError::Backend`]).
#[derive(Debug)]
enum JsonRefusal {
    /// The document nests `max` levels deep, past [`MAX_TOKENIZER_JSON_DEPTH`].
    TooDeep(usize),
    /// The tokenizers crate's own error.
    Backend(String),
    /// The tokenizers crate panicked on it.
    Panicked,
}

impl std::fmt::Display for JsonRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JsonRefusal::TooDeep(max) => write!(
                f,
                "the document nests {max} levels deep (at most {MAX_TOKENIZER_JSON_DEPTH})"
            ),
            JsonRefusal::Backend(m) => f.write_str(m),
            JsonRefusal::Panicked => {
                f.write_str("the tokenizers crate could not parse it (it panicked)")
            }
        }
    }
}

fn parse_tokenizer_json(bytes: &[u8]) -> std::result::Result<tokenizers::Tokenizer, JsonRefusal> {
    let mut depth = 0usize;
    let mut max = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in bytes {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    if max > MAX_TOKENIZER_JSON_DEPTH {
        return Err(JsonRefusal::TooDeep(max));
    }
    match std::panic::catch_unwind(|| tokenizers::Tokenizer::from_bytes(bytes)) {
        Ok(r) => r.map_err(|e| JsonRefusal::Backend(e.to_string())),
        Err(_) => Err(JsonRefusal::Panicked),
    }
}

/// Ids from a config's `eos_token_id`: an int or a list of ints.
fn eos_ids_from(v: &Value) -> Vec<u32> {
    match v {
        // Ids past u32 are kept as u32::MAX (not truncated onto a real token), so that
        // generation refuses them as outside the vocabulary.
        Value::Number(n) => n
            .as_u64()
            .map(|n| vec![u32::try_from(n).unwrap_or(u32::MAX)])
            .unwrap_or_default(),
        Value::Array(a) => a
            .iter()
            .filter_map(Value::as_u64)
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
            .collect(),
        _ => Vec::new(),
    }
}

/// Python truthiness of a JSON value (`if eos_token_id := ...`).
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(m) => !m.is_empty(),
    }
}

/// Keyword arguments of transformers' `AutoTokenizer.from_pretrained` that it consumes itself
/// rather than passing on to the tokenizer's config (mlx-lm passes `trust_remote_code`).
const LOADING_KWARGS: [&str; 1] = ["trust_remote_code"];

/// Puts `overrides` into a tokenizer config (`tokenizer_config.json`'s entries, or the ones a
/// GGUF file's metadata gives), each replacing the entry of its name, as transformers'
/// `init_kwargs.update(kwargs)` does; the loading keywords ([`LOADING_KWARGS`]:
/// `trust_remote_code`) are skipped. Returns the keys it put.
pub(crate) fn apply_config_overrides<'a>(
    config: &mut Map<String, Value>,
    overrides: &'a Map<String, Value>,
) -> Vec<&'a str> {
    let mut put = Vec::new();
    for (k, v) in overrides {
        if !LOADING_KWARGS.contains(&k.as_str()) {
            config.insert(k.clone(), v.clone());
            put.push(k.as_str());
        }
    }
    put
}

impl Tokenizer {
    /// The tokenizer as a Hugging Face `tokenizer.json` document (pretty-printed), e.g. for
    /// `mlx convert` writing a GGUF file's tokenizer beside the converted weights.
    pub fn to_hf_json(&self) -> Result<String> {
        if self.trie_encoder.is_some() {
            return Err(TokenizerError::Invalid(
                "this tokenizer (llama.cpp's own algorithm, read from GGUF: RWKV, PLaMo 2, \
                 HybriDNA or SentencePiece without scores) has no tokenizer.json form"
                    .into(),
            ));
        }
        self.full("writing tokenizer.json")?
            .to_string(true)
            .map_err(|e| TokenizerError::Backend(e.to_string()))
    }

    /// The backend, or an error naming `what` needed it after
    /// [`Tokenizer::keep_decoding_only`].
    fn full(&self, what: &str) -> Result<&tokenizers::Tokenizer> {
        self.inner.as_deref().ok_or_else(|| {
            TokenizerError::Invalid(format!(
                "{what}: this tokenizer keeps only its decoding tables (keep_decoding_only \
                 dropped its encoder)"
            ))
        })
    }

    /// Drops the backend tokenizer (its vocabulary both ways, its merges: ~9 MiB on a
    /// 49k-token BPE, issue #31's peak memory) where what is left answers everything a
    /// streaming detokenizer and the EOS checks ask: the BPE and SentencePiece detokenizers read
    /// only the token map, which stays. Returns whether it dropped it: not for the naive
    /// detokenizer, which decodes through the backend, and not while a clone still shares the
    /// backend (nothing would be freed). Afterwards `encode`, `decode`, the chat template's ids,
    /// `to_hf_json` and `add_eos_token` by name are errors and `backend` is `None`;
    /// `id_to_token`, `token_to_id`, `vocab` and `vocab_size` are answered from the token map
    /// (`mlx generate` calls it once its prompt is encoded). The text every detokenizer of it
    /// streams is unchanged, byte for byte.
    pub fn keep_decoding_only(&mut self) -> bool {
        if self.detokenizer_kind == DetokenizerKind::Naive {
            return false;
        }
        match &self.inner {
            Some(inner) if std::sync::Arc::strong_count(inner) == 1 => {
                self.inner = None;
                true
            }
            _ => false,
        }
    }

    /// Whether [`Tokenizer::keep_decoding_only`] dropped the backend.
    pub fn is_decoding_only(&self) -> bool {
        self.inner.is_none()
    }

    /// Loads a model directory the way `mlx_lm.utils.load` does: `tokenizer.json`,
    /// `tokenizer_config.json` (optional), `chat_template.jinja` (optional, wins over the config's
    /// template), and the EOS ids from `config.json`'s `eos_token_id`, replaced by
    /// `generation_config.json`'s when that one is set.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        Self::from_dir_with_config(dir, &Map::new())
    }

    /// [`Tokenizer::from_dir`] with `overrides` replacing `tokenizer_config.json`'s entries (and
    /// `chat_template.jinja`'s template), as the keyword arguments of transformers'
    /// `AutoTokenizer.from_pretrained(path, **tokenizer_config)` do in mlx-lm's
    /// `load(path, tokenizer_config=...)`: an `eos_token` there becomes the tokenizer's EOS token
    /// (added as a special token when the vocabulary lacks it), and the EOS set is then the
    /// model config's ids plus that token's. `trust_remote_code` (which `from_pretrained`
    /// consumes itself) changes nothing (`apply_config_overrides`).
    pub fn from_dir_with_config(
        dir: impl AsRef<Path>,
        overrides: &Map<String, Value>,
    ) -> Result<Self> {
        let dir = dir.as_ref();
        let eos = Self::config_eos_ids(dir)?;
        Self::load_dir(dir, &eos, overrides)
    }

    /// The EOS ids `mlx_lm.utils.load` gives the tokenizer: `config.json`'s `eos_token_id`,
    /// replaced by `generation_config.json`'s when that one is set.
    fn config_eos_ids(dir: &Path) -> Result<Vec<u32>> {
        let mut eos: Option<Value> = None;
        let config = dir.join("config.json");
        if config.is_file() {
            eos = read_json(&config)?.get("eos_token_id").cloned();
        }
        let gen = dir.join("generation_config.json");
        if gen.is_file() {
            // mlx-lm ignores a generation config that does not parse.
            if let Ok(v) = read_json(&gen) {
                if let Some(e) = v.get("eos_token_id").filter(|e| truthy(e)) {
                    eos = Some(e.clone());
                }
            }
        }
        Ok(eos.map(|e| eos_ids_from(&e)).unwrap_or_default())
    }

    /// Like [`Tokenizer::from_dir`] but with the extra EOS ids given (mlx-lm's
    /// `load_tokenizer(path, eos_token_ids=...)`); `config.json` is not read.
    pub fn from_dir_with_eos(dir: impl AsRef<Path>, extra_eos_ids: &[u32]) -> Result<Self> {
        Self::load_dir(dir.as_ref(), extra_eos_ids, &Map::new())
    }

    /// [`Tokenizer::from_dir_with_eos`] with `overrides` applied to the config
    /// ([`Tokenizer::from_dir_with_config`]).
    fn load_dir(dir: &Path, extra_eos_ids: &[u32], overrides: &Map<String, Value>) -> Result<Self> {
        let tokenizer_json = dir.join("tokenizer.json");
        let bytes = std::fs::read(&tokenizer_json).map_err(|e| {
            TokenizerError::Io(format!("reading {}: {e}", tokenizer_json.display()))
        })?;
        let inner = parse_tokenizer_json(&bytes)
            .map_err(|e| TokenizerError::Backend(format!("{}: {e}", tokenizer_json.display())))?;
        let config_path = dir.join("tokenizer_config.json");
        let mut config = if config_path.is_file() {
            match read_json(&config_path)? {
                Value::Object(m) => m,
                _ => {
                    return Err(TokenizerError::Config(format!(
                        "{} is not a JSON object",
                        config_path.display()
                    )))
                }
            }
        } else {
            Map::new()
        };
        let mut origin = config
            .contains_key("chat_template")
            .then(|| config_path.display().to_string());
        let jinja = dir.join("chat_template.jinja");
        if jinja.is_file() {
            let t = std::fs::read_to_string(&jinja)
                .map_err(|e| TokenizerError::Io(format!("reading {}: {e}", jinja.display())))?;
            config.insert("chat_template".into(), Value::String(t));
            origin = Some(jinja.display().to_string());
        }
        // transformers updates the config with the keyword arguments after reading the
        // template files: an overriding template wins over both.
        if apply_config_overrides(&mut config, overrides).contains(&"chat_template") {
            origin = config
                .get("chat_template")
                .is_some_and(|t| !t.is_null())
                .then(|| "the tokenizer config overrides' `chat_template`".into());
        }
        let mut tok = Self::from_parts(inner, &config, extra_eos_ids)?;
        tok.chat_template_origin = origin;
        Ok(tok)
    }

    /// Builds from an already loaded backend tokenizer and a parsed `tokenizer_config.json`
    /// (an empty map when there is none).
    pub fn from_parts(
        mut inner: tokenizers::Tokenizer,
        config: &Map<String, Value>,
        extra_eos_ids: &[u32],
    ) -> Result<Self> {
        // Named special tokens: the config's, else the class's defaults. An explicit null in the
        // config removes the default.
        let class = config
            .get("tokenizer_class")
            .and_then(Value::as_str)
            .unwrap_or("");
        let mut named: Vec<(String, String)> = Vec::new();
        for key in NAMED_SPECIAL_TOKENS {
            let value = match config.get(key) {
                Some(v) => token_string(v),
                None => class_defaults(class)
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, v)| v.to_string()),
            };
            if let Some(v) = value {
                named.push((key.to_string(), v));
            }
        }
        // Model-specific named tokens: other `*_token` strings, then `extra_special_tokens` given
        // as a dict.
        let mut model_specific: Vec<(String, String)> = Vec::new();
        for (key, value) in config {
            if key.ends_with("_token") && !NAMED_SPECIAL_TOKENS.contains(&key.as_str()) {
                if let Some(s) = value.as_str() {
                    model_specific.push((key.clone(), s.to_string()));
                }
            }
        }
        let mut extra: Vec<String> = Vec::new();
        let extra_value = config
            .get("extra_special_tokens")
            .or_else(|| config.get("additional_special_tokens"));
        match extra_value {
            Some(Value::Object(m)) => {
                for (k, v) in m {
                    if let Some(s) = token_string(v) {
                        if let Some(slot) = model_specific.iter_mut().find(|(mk, _)| mk == k) {
                            slot.1 = s;
                        } else {
                            model_specific.push((k.clone(), s));
                        }
                    }
                }
            }
            Some(Value::Array(a)) => extra.extend(a.iter().filter_map(token_string)),
            _ => {}
        }
        named.extend(model_specific);

        // transformers adds every named and extra special token to the backend as a special
        // token (`TokenizersBackend._post_init`): a missing one gets a new id, an existing added
        // token becomes special (with the flags of a plain `AddedToken(t, special=True,
        // normalized=False)`, or of the config's serialized token).
        let mut to_add: Vec<AddedToken> = Vec::new();
        let config_token = |content: &str| -> AddedToken {
            let from_config = config.values().find_map(|v| match v {
                Value::Object(m) if m.get("content").and_then(Value::as_str) == Some(content) => {
                    Some(m)
                }
                _ => None,
            });
            let flag = |k: &str| from_config.and_then(|m| m.get(k)).and_then(Value::as_bool);
            AddedToken::from(content.to_string(), true)
                .normalized(flag("normalized").unwrap_or(false))
                .lstrip(flag("lstrip").unwrap_or(false))
                .rstrip(flag("rstrip").unwrap_or(false))
                .single_word(flag("single_word").unwrap_or(false))
        };
        for tok in named.iter().map(|(_, v)| v).chain(extra.iter()) {
            if !to_add.iter().any(|t| &t.content == tok) {
                to_add.push(config_token(tok));
            }
        }
        if !to_add.is_empty() {
            backend("adding special tokens", || inner.add_special_tokens(to_add))?
                .map_err(|e| TokenizerError::Backend(format!("adding special tokens: {e}")))?;
        }

        let lookup = |key: &str| -> Option<String> {
            named.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
        };
        let bos_token = lookup("bos_token");
        let eos_token = lookup("eos_token");
        let bos_token_id = bos_token.as_deref().and_then(|t| inner.token_to_id(t));
        let eos_token_id = eos_token.as_deref().and_then(|t| inner.token_to_id(t));

        // transformers rebuilds the post-processor when the config states add_bos/add_eos.
        let add_bos = config.get("add_bos_token").and_then(Value::as_bool);
        let add_eos = config.get("add_eos_token").and_then(Value::as_bool);
        if add_bos.is_some() || add_eos.is_some() || inner.get_post_processor().is_none() {
            let post = bos_eos_template(
                add_bos.unwrap_or(false),
                add_eos.unwrap_or(false),
                bos_token.as_deref().zip(bos_token_id),
                eos_token.as_deref().zip(eos_token_id),
            )?;
            inner.with_post_processor(Some(post));
        }

        let mut eos_token_ids: BTreeSet<u32> = extra_eos_ids.iter().copied().collect();
        if let Some(id) = eos_token_id {
            eos_token_ids.insert(id);
        }

        let chat_templates = match config.get("chat_template") {
            None | Some(Value::Null) => None,
            Some(v) => Some(ChatTemplates::from_config_value(v)?),
        };
        let chat_template_type = config
            .get("chat_template_type")
            .and_then(Value::as_str)
            .map(str::to_string);

        let clean_up_tokenization_spaces = config
            .get("clean_up_tokenization_spaces")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let is_bpe = matches!(inner.get_model(), tokenizers::ModelWrapper::BPE(_));
        let force_cleanup = config
            .get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output")
            .and_then(Value::as_bool)
            .unwrap_or(false);

        let detokenizer_kind = DetokenizerKind::for_decoder(inner.get_decoder());
        let size = inner.get_vocab_size(true);
        let token_map = TokenMap::new((0..size as u32).map(|i| inner.id_to_token(i)));

        let mut tok = Tokenizer {
            inner: Some(std::sync::Arc::new(inner)),
            special_tokens: named,
            bos_token,
            bos_token_id,
            eos_token,
            eos_token_id,
            eos_token_ids,
            clean_up_tokenization_spaces: clean_up_tokenization_spaces
                && (!is_bpe || force_cleanup),
            chat_templates,
            chat_template_origin: None,
            chat_template_type,
            thinking: None,
            detokenizer_kind,
            token_map: std::sync::Arc::new(token_map),
            trie_encoder: None,
        };
        tok.thinking = tok.infer_thinking()?;
        Ok(tok)
    }

    /// mlx-lm's `_infer_thinking`: single-token markers first, then multi-token ones.
    fn infer_thinking(&self) -> Result<Option<ThinkingMarkers>> {
        let vocab = self.vocab();
        for (s, e) in [
            ("<think>", "</think>"),
            ("<longcat_think>", "</longcat_think>"),
            ("<|think:start|>", "<|think:end|>"),
        ] {
            if let (Some(&si), Some(&ei)) = (vocab.get(s), vocab.get(e)) {
                return Ok(Some(ThinkingMarkers {
                    start: s.into(),
                    end: e.into(),
                    start_ids: vec![si],
                    end_ids: vec![ei],
                }));
            }
        }
        let multi = |s: &str, e: &str| -> Result<Option<ThinkingMarkers>> {
            Ok(Some(ThinkingMarkers {
                start: s.into(),
                end: e.into(),
                start_ids: self.encode(s, false)?,
                end_ids: self.encode(e, false)?,
            }))
        };
        if vocab.contains_key("<|channel>") && vocab.contains_key("<channel|>") {
            return multi("<|channel>thought", "<channel|>");
        }
        if ["<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"]
            .iter()
            .all(|t| vocab.contains_key(*t))
        {
            return multi("<|open|>think<|sep|>", "<|close|>think<|sep|>");
        }
        Ok(None)
    }

    /// The vocabulary including added tokens.
    pub fn vocab(&self) -> HashMap<String, u32> {
        match &self.inner {
            Some(inner) => inner.get_vocab(true),
            // Ids in order, a later id taking a repeated token string: the backend's added
            // tokens (the higher ids) win over its model's as in `get_vocab`.
            None => self
                .token_map
                .iter()
                .enumerate()
                .filter_map(|(i, t)| Some((t?.to_string(), i as u32)))
                .collect(),
        }
    }

    /// Encodes with `encoder` instead of the backend's model from now on.
    pub(crate) fn set_trie_encoder(&mut self, encoder: crate::tokenizer_trie::TrieEncoder) {
        self.trie_encoder = Some(std::sync::Arc::new(encoder));
    }

    /// Whether `encode` runs an algorithm of llama.cpp's (RWKV, PLaMo 2) rather than the
    /// backend.
    pub fn has_trie_encoder(&self) -> bool {
        self.trie_encoder.is_some()
    }

    /// With an encoder of llama.cpp's: whether it adds a BOS and an EOS id when special tokens
    /// are asked for.
    pub(crate) fn trie_encoder_adds(&self) -> Option<(bool, bool)> {
        self.trie_encoder.as_deref().map(|t| t.adds())
    }

    /// The backend `tokenizers::Tokenizer`. After [`Tokenizer::keep_decoding_only`] (see
    /// [`Tokenizer::is_decoding_only`]) it is an empty one: a word-level model without a
    /// vocabulary, which encodes nothing and decodes every id to nothing.
    pub fn backend(&self) -> &tokenizers::Tokenizer {
        static EMPTY: std::sync::OnceLock<tokenizers::Tokenizer> = std::sync::OnceLock::new();
        match &self.inner {
            Some(inner) => inner,
            None => EMPTY.get_or_init(|| {
                tokenizers::Tokenizer::new(tokenizers::models::wordlevel::WordLevel::default())
            }),
        }
    }

    /// Token ids of `text`; `add_special_tokens` applies the post-processor (e.g. BOS).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        if let Some(trie) = &self.trie_encoder {
            // llama.cpp adds BOS (PLaMo 2) or nothing (RWKV) itself.
            return trie.encode(text, add_special_tokens);
        }
        let inner = self.full("encoding")?;
        let enc = backend("encoding", || inner.encode_fast(text, add_special_tokens))?
            .map_err(backend_err)?;
        Ok(enc.get_ids().to_vec())
    }

    /// A prompt's ids the way `mlx_lm.generate.stream_generate` encodes a string prompt: special
    /// tokens are added unless the tokenizer has a BOS token and the text already starts with it.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let add = match &self.bos_token {
            None => true,
            Some(bos) => !text.starts_with(bos.as_str()),
        };
        self.encode(text, add)
    }

    /// The text of `ids` (transformers `decode`). Ids outside the vocabulary are skipped.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        if let Some(text) = self
            .trie_encoder
            .as_ref()
            .and_then(|t| t.decode(ids, !skip_special_tokens))
        {
            // llama.cpp's own rule (a SentencePiece GGUF without scores).
            return Ok(text);
        }
        let inner = self.full("decoding")?;
        let text =
            backend("decoding", || inner.decode(ids, skip_special_tokens))?.map_err(backend_err)?;
        Ok(if self.clean_up_tokenization_spaces {
            clean_up_tokenization(&text)
        } else {
            text
        })
    }

    /// The token string of `id` (`convert_ids_to_tokens`), if it exists.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        match &self.inner {
            Some(inner) => inner.id_to_token(id),
            // The token map is `id_to_token` over every id.
            None => self
                .token_map
                .get(id as usize)
                .flatten()
                .map(str::to_string),
        }
    }

    /// The id of a token string (`convert_tokens_to_ids`), if it exists.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        match &self.inner {
            Some(inner) => inner.token_to_id(token),
            // The highest id holding it, as `vocab` (a linear search: no index is kept).
            None => (0..self.token_map.len())
                .rev()
                .find(|&i| self.token_map.get(i).flatten() == Some(token))
                .map(|i| i as u32),
        }
    }

    /// `len(tokenizer)`: the vocabulary including added tokens.
    pub fn vocab_size(&self) -> usize {
        match &self.inner {
            Some(inner) => inner.get_vocab_size(true),
            None => self.token_map.len(),
        }
    }

    /// The BOS token string, if the tokenizer has one.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// The BOS token id, if the tokenizer has one.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token_id
    }

    /// The tokenizer's own EOS token string.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// The tokenizer's own EOS token id (`tokenizer.eos_token_id`).
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token_id
    }

    /// Every id that ends generation: the configured ones plus the tokenizer's EOS.
    pub fn eos_token_ids(&self) -> &BTreeSet<u32> {
        &self.eos_token_ids
    }

    /// Replaces the EOS set (mlx-lm's `eos_token_ids` setter).
    pub fn set_eos_token_ids(&mut self, ids: impl IntoIterator<Item = u32>) {
        self.eos_token_ids = ids.into_iter().collect();
    }

    /// Adds an EOS token by id or token string (mlx-lm's `add_eos_token`).
    pub fn add_eos_token(&mut self, token: &str) -> Result<()> {
        let id = match token.parse::<u32>() {
            Ok(id) => id,
            Err(_) => self
                .full("adding an EOS token by name")?
                .token_to_id(token)
                .ok_or_else(|| {
                    TokenizerError::Invalid(format!("'{token}' is not a token for this tokenizer"))
                })?,
        };
        self.eos_token_ids.insert(id);
        Ok(())
    }

    /// transformers' `special_tokens_map`: named special tokens, as the chat template sees them.
    pub fn special_tokens_map(&self) -> &[(String, String)] {
        &self.special_tokens
    }

    /// The reasoning markers, if the vocabulary has them.
    pub fn thinking(&self) -> Option<&ThinkingMarkers> {
        self.thinking.as_ref()
    }

    /// Whether the vocabulary has reasoning markers (mlx-lm `has_thinking`).
    pub fn has_thinking(&self) -> bool {
        self.thinking.is_some()
    }

    /// Whether a chat template is available.
    pub fn has_chat_template(&self) -> bool {
        self.chat_templates.is_some()
    }

    /// The chat templates from the config, if any.
    pub fn chat_templates(&self) -> Option<&ChatTemplates> {
        self.chat_templates.as_ref()
    }

    /// Replaces the chat template (e.g. with GGUF's `tokenizer.chat_template`).
    pub fn set_chat_template(&mut self, template: Option<ChatTemplates>) {
        self.chat_templates = template;
        self.chat_template_origin = None;
    }

    /// Names where the chat template came from (`tokenizer_config.json`'s path, a GGUF file's
    /// metadata, a command-line flag): template errors start with it.
    pub fn set_chat_template_origin(&mut self, origin: impl Into<String>) {
        self.chat_template_origin = Some(origin.into());
    }

    /// Where the chat template came from, when known.
    pub fn chat_template_origin(&self) -> Option<&str> {
        self.chat_template_origin.as_deref()
    }

    /// Renders `messages` with the chat template the way mlx-lm's
    /// `TokenizerWrapper.apply_chat_template(messages, tokenize=False, ...)` does: the template
    /// sees `messages`, `tools`, `documents`, `add_generation_prompt`, the special tokens
    /// (`bos_token`, `eos_token`, ...), `enable_thinking` (defaulting to whether the vocabulary
    /// has thinking markers) and `options.kwargs`.
    pub fn apply_chat_template(
        &self,
        messages: &[Value],
        options: &ChatTemplateOptions,
    ) -> Result<String> {
        if let Some(t) = &self.chat_template_type {
            return Err(TokenizerError::Invalid(format!(
                "chat_template_type {t:?} names an mlx-lm Python renderer, which is not supported"
            )));
        }
        let templates = self.chat_templates.as_ref().ok_or_else(|| {
            TokenizerError::Invalid(
                "cannot use chat template functions because tokenizer.chat_template is not set"
                    .into(),
            )
        })?;
        let (name, source) =
            templates.select_named(options.template_name.as_deref(), options.tools.is_some())?;
        let origin = |e: TokenizerError| match (e, &self.chat_template_origin) {
            (TokenizerError::Template(m), Some(o)) => TokenizerError::Template(format!("{o}: {m}")),
            (e, _) => e,
        };
        let template = ChatTemplate::named(name, source).map_err(origin)?;
        let mut opts = options.clone();
        if !opts.kwargs.contains_key("enable_thinking") {
            opts.kwargs
                .insert("enable_thinking".into(), Value::Bool(self.has_thinking()));
        }
        template
            .render(messages, &opts, &self.special_tokens)
            .map_err(origin)
    }

    /// [`Tokenizer::apply_chat_template`] then encoding without special tokens (mlx-lm's
    /// `tokenize=True`).
    pub fn apply_chat_template_ids(
        &self,
        messages: &[Value],
        options: &ChatTemplateOptions,
    ) -> Result<Vec<u32>> {
        let text = self.apply_chat_template(messages, options)?;
        self.encode(&text, false)
    }

    /// Which streaming detokenizer mlx-lm would pick for this tokenizer's decoder.
    pub fn detokenizer_kind(&self) -> DetokenizerKind {
        self.detokenizer_kind
    }

    /// `convert_ids_to_tokens(range(len(tokenizer)))`.
    pub(crate) fn token_map(&self) -> std::sync::Arc<TokenMap> {
        self.token_map.clone()
    }
}

/// `convert_ids_to_tokens(range(n))` in two buffers: every token's text back to back and
/// where each starts, an id without a token marked in `missing`. For a 49k-token vocabulary
/// ~0.6 MB where one `String` per token took ~1.6 MB live (issue #31's peak memory).
#[derive(Debug, Default)]
pub(crate) struct TokenMap {
    text: String,
    /// `n + 1` offsets into `text`: token `i` is `text[starts[i]..starts[i + 1]]`.
    starts: Vec<u32>,
    /// Bit `i` set: id `i` has no token.
    missing: Vec<u64>,
}

impl TokenMap {
    pub(crate) fn new(tokens: impl Iterator<Item = Option<String>>) -> TokenMap {
        let mut m = TokenMap {
            starts: vec![0],
            ..TokenMap::default()
        };
        for (i, t) in tokens.enumerate() {
            if i / 64 >= m.missing.len() {
                m.missing.push(0);
            }
            match t {
                Some(t) => m.text.push_str(&t),
                None => m.missing[i / 64] |= 1 << (i % 64),
            }
            // Vocabularies are far below 4 GB of text; saturate rather than wrap past it.
            m.starts
                .push(u32::try_from(m.text.len()).unwrap_or(u32::MAX));
        }
        m.text.shrink_to_fit();
        m.starts.shrink_to_fit();
        m
    }

    /// Ids in the map.
    pub(crate) fn len(&self) -> usize {
        self.starts.len() - 1
    }

    /// Token `i`: `None` past the map, `Some(None)` for an id without a token.
    pub(crate) fn get(&self, i: usize) -> Option<Option<&str>> {
        if i >= self.len() {
            return None;
        }
        if (self.missing[i / 64] >> (i % 64)) & 1 == 1 {
            return Some(None);
        }
        let (a, b) = (self.starts[i] as usize, self.starts[i + 1] as usize);
        Some(self.text.get(a..b))
    }

    /// Every id's token in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Option<&str>> + '_ {
        (0..self.len()).map(|i| self.get(i).flatten())
    }
}

/// The post-processor transformers' `update_post_processor` builds.
fn bos_eos_template(
    add_bos: bool,
    add_eos: bool,
    bos: Option<(&str, u32)>,
    eos: Option<(&str, u32)>,
) -> Result<TemplateProcessing> {
    let bos = if add_bos { bos } else { None };
    let eos = if add_eos { eos } else { None };
    let mut single = String::new();
    if let Some((b, _)) = bos {
        single.push_str(&format!("{b}:0 "));
    }
    single.push_str("$A:0");
    if let Some((e, _)) = eos {
        single.push_str(&format!(" {e}:0"));
    }
    let mut pair = single.clone();
    if let Some((b, _)) = bos {
        pair.push_str(&format!(" {b}:1"));
    }
    pair.push_str(" $B:1");
    if let Some((e, _)) = eos {
        pair.push_str(&format!(" {e}:1"));
    }
    let mut special: Vec<(String, u32)> = Vec::new();
    for (t, id) in bos.into_iter().chain(eos) {
        if !special.iter().any(|(s, _)| s == t) {
            special.push((t.to_string(), id));
        }
    }
    TemplateProcessing::builder()
        .try_single(single.as_str())
        .map_err(|e| TokenizerError::Config(format!("post-processor template: {e}")))?
        .try_pair(pair.as_str())
        .map_err(|e| TokenizerError::Config(format!("post-processor template: {e}")))?
        .special_tokens(special)
        .build()
        .map_err(|e| TokenizerError::Config(format!("post-processor template: {e}")))
}

/// transformers' `clean_up_tokenization`.
pub fn clean_up_tokenization(text: &str) -> String {
    text.replace(" .", ".")
        .replace(" ?", "?")
        .replace(" !", "!")
        .replace(" ,", ",")
        .replace(" ' ", "'")
        .replace(" n't", "n't")
        .replace(" 'm", "'m")
        .replace(" 's", "'s")
        .replace(" 've", "'ve")
        .replace(" 're", "'re")
}

#[cfg(test)]
mod token_map_tests {
    use super::TokenMap;

    /// The packed map gives back every token as the list of strings held it: empty tokens,
    /// missing ids (also the 64th and 65th: a second bitset word), multi-byte text, and
    /// `None` past the end.
    #[test]
    fn token_map_is_the_list_it_packs() {
        let mut list: Vec<Option<String>> = (0..70).map(|i| Some(format!("t{i}"))).collect();
        list[0] = Some(String::new());
        list[3] = None;
        list[63] = None;
        list[64] = None;
        list[5] = Some("\u{0120}é漢".into());
        let m = TokenMap::new(list.clone().into_iter());
        assert_eq!(m.len(), 70);
        for (i, t) in list.iter().enumerate() {
            assert_eq!(m.get(i), Some(t.as_deref()), "{i}");
        }
        assert_eq!(m.get(70), None);
        assert_eq!(
            m.iter().collect::<Vec<_>>(),
            list.iter().map(|t| t.as_deref()).collect::<Vec<_>>()
        );
        assert_eq!(TokenMap::new(std::iter::empty()).get(0), None);
    }
}

#[cfg(test)]
mod config_override_tests {
    use super::Tokenizer;
    use serde_json::{json, Map, Value};

    /// A model directory with a word-level `tokenizer.json` (`<unk> <s> </s> hello world
    /// tell`), a `tokenizer_config.json` naming `</s>` the EOS token, and a `config.json` with
    /// `eos_token_id` when given.
    fn model_dir(name: &str, config_eos: Option<Value>) -> std::path::PathBuf {
        use tokenizers::models::wordlevel::WordLevel;
        let dir = std::env::temp_dir().join(format!(
            "mlx-tokenizers-override-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let vocab = ["<unk>", "<s>", "</s>", "hello", "world", "tell"]
            .iter()
            .enumerate()
            .map(|(i, w)| (w.to_string(), i as u32))
            .collect();
        let model = WordLevel::builder()
            .vocab(vocab)
            .unk_token("<unk>".into())
            .build()
            .unwrap();
        let mut tok = tokenizers::Tokenizer::new(model);
        tok.with_pre_tokenizer(Some(
            tokenizers::pre_tokenizers::whitespace::WhitespaceSplit,
        ));
        tok.save(dir.join("tokenizer.json"), false).unwrap();
        let config = json!({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"});
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
        if let Some(e) = config_eos {
            let c = json!({"model_type": "llama", "eos_token_id": e});
            std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
        }
        dir
    }

    fn overrides(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!("an object"),
        }
    }

    /// `eos_token` in the overrides replaces `tokenizer_config.json`'s: the tokenizer's EOS
    /// token and id are the new one's, the EOS set holds it and the model config's ids, and
    /// the old token's id is gone unless the model config lists it; `trust_remote_code`
    /// changes nothing; a token outside the vocabulary is added as a special token.
    #[test]
    fn overrides_replace_the_tokenizer_config() {
        let plain_dir = model_dir("plain", None);
        let dir = plain_dir.clone();
        let plain = Tokenizer::from_dir(&dir).unwrap();
        assert_eq!(plain.eos_token(), Some("</s>"));
        assert_eq!(
            plain.eos_token_ids().iter().copied().collect::<Vec<_>>(),
            [2]
        );

        let same =
            Tokenizer::from_dir_with_config(&dir, &overrides(json!({"trust_remote_code": true})))
                .unwrap();
        assert_eq!(same.eos_token(), Some("</s>"));
        assert_eq!(same.eos_token_ids(), plain.eos_token_ids());
        assert_eq!(same.vocab_size(), plain.vocab_size());

        let tell = overrides(json!({"trust_remote_code": false, "eos_token": "tell"}));
        let t = Tokenizer::from_dir_with_config(&dir, &tell).unwrap();
        assert_eq!(t.eos_token(), Some("tell"));
        assert_eq!(t.eos_token_id(), Some(5));
        assert_eq!(t.eos_token_ids().iter().copied().collect::<Vec<_>>(), [5]);
        assert_eq!(t.vocab_size(), plain.vocab_size());
        assert_eq!(t.encode("hello tell world", false).unwrap(), [3, 5, 4]);

        // The model config's EOS ids stay in the set; the old token's id only through them.
        let list_dir = model_dir("config", Some(json!([2, 4])));
        let t = Tokenizer::from_dir_with_config(&list_dir, &tell).unwrap();
        assert_eq!(
            t.eos_token_ids().iter().copied().collect::<Vec<_>>(),
            [2, 4, 5]
        );
        let dir = model_dir("config1", Some(json!(4)));
        let t = Tokenizer::from_dir_with_config(&dir, &tell).unwrap();
        assert_eq!(
            t.eos_token_ids().iter().copied().collect::<Vec<_>>(),
            [4, 5]
        );

        // A token the vocabulary lacks: a new special token at the end, the EOS.
        let t = Tokenizer::from_dir_with_config(&dir, &overrides(json!({"eos_token": "<stop>"})))
            .unwrap();
        assert_eq!(t.eos_token_id(), Some(6));
        assert_eq!(
            t.eos_token_ids().iter().copied().collect::<Vec<_>>(),
            [4, 6]
        );
        assert_eq!(t.encode("hello<stop>", false).unwrap(), [3, 6]);
        assert_eq!(t.decode(&[3, 6], true).unwrap(), "hello");
        for d in [plain_dir, list_dir, dir] {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

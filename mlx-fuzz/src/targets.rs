//! The fuzz targets: each builds one input from seeded choices, writes it where the real
//! loader reads it (`<work>/current.*`, so the input of a crash is on disk), and runs the
//! loader, then uses what loaded (evaluates tensors, runs a forward, renders, encodes). A
//! refusal (`Err`) is the expected outcome for most inputs; only a panic, an abort, a hang or
//! an allocation past the cap is a finding.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arbitrary::Unstructured;
use mlx_cache::{load_prompt_cache, save_prompt_cache, Cache};
use mlx_core::io::{load_gguf, load_safetensors, save_safetensors};
use mlx_core::prelude::*;
use serde_json::{json, Value};

use crate::mutate::{below, chance, interesting_u64, mutate_bytes, mutate_json, pick};

mod argv;

/// What an input did.
pub enum Outcome {
    /// Loaded and used without error.
    Accepted,
    /// Refused with an error (its message).
    Refused(String),
}

impl<E: std::fmt::Display> From<Result<(), E>> for Outcome {
    fn from(r: Result<(), E>) -> Outcome {
        match r {
            Ok(()) => Outcome::Accepted,
            Err(e) => Outcome::Refused(e.to_string()),
        }
    }
}

/// Every target, by name.
pub const TARGETS: &[&str] = &[
    "config",
    "safetensors",
    "gguf",
    "tokenizer",
    "template",
    "prompt_cache",
    "argv",
];

/// State shared by the inputs of one target: seed files and the work directory.
pub struct Target {
    pub name: String,
    work: PathBuf,
    dense_dir: PathBuf,
    dense_config: Value,
    seed_safetensors: Vec<u8>,
    seed_cache: (BTreeMap<String, Array>, BTreeMap<String, String>),
}

/// The tiny test checkpoints: `$MLX_FUZZ_MODELS`, else this checkout's (a copied binary run
/// from another checkout's root finds them relative to it).
fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MLX_FUZZ_MODELS") {
        return PathBuf::from(d);
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../mlx-models/tests/models");
    if built.is_dir() {
        built
    } else {
        PathBuf::from("mlx-models/tests/models")
    }
}

impl Target {
    /// Prepares target `name` with its files under `work`.
    pub fn new(name: &str, work: &Path) -> Result<Target, String> {
        if !TARGETS.contains(&name) {
            return Err(format!(
                "unknown fuzz target {name:?}; targets: {}",
                TARGETS.join(", ")
            ));
        }
        let e = |e: &dyn std::fmt::Display| e.to_string();
        std::fs::create_dir_all(work).map_err(|x| e(&x))?;
        let dense_dir = models_dir().join("dense_f32");
        let dense_config: Value = serde_json::from_str(
            &std::fs::read_to_string(dense_dir.join("config.json")).map_err(|x| e(&x))?,
        )
        .map_err(|x| e(&x))?;
        // The model directory of the config target: its weights, a config written per input.
        let model_dir = work.join("model");
        std::fs::create_dir_all(&model_dir).map_err(|x| e(&x))?;
        if !model_dir.join("model.safetensors").exists() {
            std::fs::copy(
                dense_dir.join("model.safetensors"),
                model_dir.join("model.safetensors"),
            )
            .map_err(|x| e(&x))?;
        }
        // A small safetensors file of several dtypes.
        let seed_st = work.join("seed.safetensors");
        let a =
            Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).map_err(|x| e(&x))?;
        let b = Array::from_slice(&[1i32, -2, 3, -4], &[4]).map_err(|x| e(&x))?;
        let c = a.astype(Dtype::Bfloat16).map_err(|x| e(&x))?;
        let meta = BTreeMap::from([("format".to_string(), "mlx".to_string())]);
        save_safetensors(&seed_st, [("a", &a), ("b", &b), ("c", &c)], &meta).map_err(|x| e(&x))?;
        let seed_safetensors = std::fs::read(&seed_st).map_err(|x| e(&x))?;
        // A prompt cache of every kind.
        let seed_cache = {
            let mut caches: Vec<Box<dyn Cache>> = vec![
                Box::new(mlx_cache::KVCache::new()),
                Box::new(mlx_cache::QuantizedKVCache::new(32, 4).map_err(|x| e(&x))?),
                Box::new(mlx_cache::RotatingKVCache::new(6, 2).map_err(|x| e(&x))?),
                Box::new(mlx_cache::RotatingQuantizedKVCache::new(6, 1, 32, 8).map_err(|x| e(&x))?),
                Box::new(mlx_cache::ChunkedKVCache::new(8)),
                Box::new(mlx_cache::ConcatenateKVCache::new()),
            ];
            let kv = ops::ones(&[1, 2, 3, 32], Dtype::Float32, None).map_err(|x| e(&x))?;
            for c in caches.iter_mut() {
                c.update_and_fetch(&kv, &kv).map_err(|x| e(&x))?;
            }
            let mut arrays = mlx_cache::ArraysCache::new(2);
            arrays.set(0, kv.clone()).map_err(|x| e(&x))?;
            caches.push(Box::new(arrays));
            let p = work.join("seed_cache.safetensors");
            let meta = BTreeMap::from([("model".to_string(), "fuzz".to_string())]);
            save_prompt_cache(&p, &caches, &meta).map_err(|x| e(&x))?;
            load_safetensors(&p, None).map_err(|x| e(&x))?
        };
        Ok(Target {
            name: name.to_string(),
            work: work.to_path_buf(),
            dense_dir: model_dir,
            dense_config,
            seed_safetensors,
            seed_cache,
        })
    }

    /// Runs one input drawn from `u`.
    pub fn run(&self, u: &mut Unstructured) -> Outcome {
        match self.name.as_str() {
            "config" => self.config(u),
            "safetensors" => self.safetensors(u),
            "gguf" => self.gguf(u),
            "tokenizer" => self.tokenizer(u),
            "template" => self.template(u),
            "argv" => self.argv(u),
            _ => self.prompt_cache(u),
        }
    }

    fn current(&self, ext: &str) -> PathBuf {
        self.work.join(format!("current.{ext}"))
    }

    // -- config.json ---------------------------------------------------------------------

    /// A mutated config.json of the tiny dense model, as text.
    fn craft_config(&self, u: &mut Unstructured) -> String {
        const KEYS: &[&str] = &[
            "model_type",
            "hidden_size",
            "num_hidden_layers",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "vocab_size",
            "rms_norm_eps",
            "rope_theta",
            "rope_traditional",
            "rope_scaling",
            "quantization",
            "quantization_config",
            "tie_word_embeddings",
            "layer_types",
            "sliding_window",
            "max_position_embeddings",
            "attention_bias",
            "mlp_bias",
            "group_size",
            "bits",
            "mode",
            "type",
            "rope_type",
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "model.norm",
            "lm_head",
        ];
        let mut cfg = self.dense_config.clone();
        match below(u, 6) {
            0 => {
                cfg["rope_scaling"] = pick(
                    u,
                    &[
                        json!({"type": "linear", "factor": 2.0}),
                        json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
                        json!({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                               "beta_fast": 32, "beta_slow": 1}),
                        json!({"type": "dynamic", "factor": 2.0}),
                    ],
                )
                .clone();
                cfg["max_position_embeddings"] = json!(128);
            }
            1 => cfg["quantization"] = json!({"group_size": 64, "bits": 4}),
            2 => {
                cfg["layer_types"] = json!(["sliding_attention", "full_attention"]);
                cfg["sliding_window"] = json!(4);
            }
            _ => {}
        }
        mutate_json(u, &mut cfg, KEYS);
        cfg.to_string()
    }

    fn config(&self, u: &mut Unstructured) -> Outcome {
        let text = self.craft_config(u);
        let path = self.dense_dir.join("config.json");
        if let Err(e) = std::fs::write(&path, &text) {
            return Outcome::Refused(e.to_string());
        }
        let _ = std::fs::write(self.current("json"), &text);
        let r = (|| -> Result<(), String> {
            let (model, _) = mlx_models::load::load_model_dir(&self.dense_dir, &Default::default())
                .map_err(|e| e.to_string())?;
            let x = Array::from_slice(&[1i32, 2, 3], &[1, 3]).map_err(|e| e.to_string())?;
            let mut caches = model.make_cache();
            model
                .forward(&x, Some(&mut caches))
                .and_then(|y| Ok(y.eval()?))
                .map_err(|e| e.to_string())?;
            let y = Array::from_slice(&[4i32], &[1, 1]).map_err(|e| e.to_string())?;
            model
                .forward(&y, Some(&mut caches))
                .and_then(|y| Ok(y.eval()?))
                .map_err(|e| e.to_string())
        })();
        r.into()
    }

    // -- safetensors ---------------------------------------------------------------------

    fn safetensors(&self, u: &mut Unstructured) -> Outcome {
        const KEYS: &[&str] = &[
            "dtype",
            "shape",
            "data_offsets",
            "__metadata__",
            "a",
            "b",
            "c",
        ];
        let seed = &self.seed_safetensors;
        let n = u64::from_le_bytes(seed[..8].try_into().unwrap_or([0; 8])) as usize;
        let bytes = if chance(u, 70) && n + 8 <= seed.len() {
            // Structure-aware: mutate the header's JSON, keep the data.
            let mut header: Value =
                serde_json::from_slice(&seed[8..8 + n]).unwrap_or_else(|_| json!({}));
            mutate_json(u, &mut header, KEYS);
            let h = header.to_string();
            let mut data = seed[8 + n..].to_vec();
            if chance(u, 20) {
                mutate_bytes(u, &mut data, 3);
            }
            let mut out = (h.len() as u64).to_le_bytes().to_vec();
            if chance(u, 10) {
                out = interesting_u64(u).to_le_bytes().to_vec();
            }
            out.extend(h.as_bytes());
            out.extend(data);
            out
        } else {
            let mut b = seed.clone();
            mutate_bytes(u, &mut b, 6);
            b
        };
        let path = self.current("safetensors");
        if let Err(e) = std::fs::write(&path, &bytes) {
            return Outcome::Refused(e.to_string());
        }
        let r = load_safetensors(&path, None).and_then(|(arrays, _)| {
            for a in arrays.values() {
                a.eval()?;
                if a.size() > 0 {
                    a.astype(Dtype::Float32)?.sum_all(false)?.eval()?;
                }
            }
            Ok(())
        });
        r.into()
    }

    // -- GGUF ----------------------------------------------------------------------------

    fn gguf(&self, u: &mut Unstructured) -> Outcome {
        let g = GgufSpec::draw(u);
        let mut bytes = g.bytes(u);
        if chance(u, 25) {
            mutate_bytes(u, &mut bytes, 4);
        }
        let path = self.current("gguf");
        if let Err(e) = std::fs::write(&path, &bytes) {
            return Outcome::Refused(e.to_string());
        }
        let r = (|| -> Result<(), String> {
            let (arrays, meta) = load_gguf(&path, None).map_err(|e| e.to_string())?;
            for a in arrays.values() {
                a.eval().map_err(|e| e.to_string())?;
            }
            // The tokenizer and the model mapping read the same metadata.
            if let Ok(data) = mlx_engine::tokenizer_gguf::tokenizer_data(&meta) {
                if let Ok(tok) = data.build() {
                    let ids = tok.encode("hello world", true).map_err(|e| e.to_string())?;
                    tok.decode(&ids, false).map_err(|e| e.to_string())?;
                }
            }
            let (model, _) = mlx_models::gguf::load_gguf_model(&path, &Default::default())
                .map_err(|e| e.to_string())?;
            let x = Array::from_slice(&[0i32, 1], &[1, 2]).map_err(|e| e.to_string())?;
            model
                .forward(&x, None)
                .and_then(|y| Ok(y.eval()?))
                .map_err(|e| e.to_string())
        })();
        r.into()
    }

    // -- tokenizer.json + tokenizer_config.json --------------------------------------------

    fn tokenizer(&self, u: &mut Unstructured) -> Outcome {
        const KEYS: &[&str] = &[
            "model",
            "vocab",
            "merges",
            "added_tokens",
            "pre_tokenizer",
            "decoder",
            "normalizer",
            "post_processor",
            "type",
            "id",
            "content",
            "special",
            "bos_token",
            "eos_token",
            "unk_token",
            "pad_token",
            "add_bos_token",
            "add_eos_token",
            "chat_template",
            "additional_special_tokens",
            "extra_special_tokens",
            "clean_up_tokenization_spaces",
            "tokenizer_class",
            "byte_fallback",
            "ignore_merges",
            "add_prefix_space",
            "<s>",
            "</s>",
        ];
        let mut tok = tiny_tokenizer_json();
        let mut cfg = tiny_tokenizer_config();
        if chance(u, 60) {
            mutate_json(u, &mut tok, KEYS);
        }
        if chance(u, 60) {
            mutate_json(u, &mut cfg, KEYS);
        }
        let dir = self.work.join("tokenizer");
        let w = || -> std::io::Result<()> {
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("tokenizer.json"), tok.to_string())?;
            std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string())
        };
        if let Err(e) = w() {
            return Outcome::Refused(e.to_string());
        }
        let r = (|| -> Result<(), String> {
            let t = mlx_engine::Tokenizer::from_dir(&dir).map_err(|e| e.to_string())?;
            let ids = t
                .encode("hello world <s> héllo\u{0} </s> 123", true)
                .map_err(|e| e.to_string())?;
            t.decode(&ids, false).map_err(|e| e.to_string())?;
            let mut d = t.detokenizer();
            for &id in ids.iter().chain([u32::MAX, 3, 1 << 20].iter()) {
                d.add_token(id);
                let _ = d.last_segment();
            }
            let msgs = [json!({"role": "user", "content": "hi"})];
            t.apply_chat_template(&msgs, &mlx_engine::ChatTemplateOptions::generation(true))
                .map_err(|e| e.to_string())?;
            Ok(())
        })();
        r.into()
    }

    // -- chat templates --------------------------------------------------------------------

    fn template(&self, u: &mut Unstructured) -> Outcome {
        let mut src: String = pick(u, SEED_TEMPLATES).to_string();
        for _ in 0..=below(u, 5) {
            let at = floor_boundary(&src, below(u, src.len() + 1));
            // Tag boundaries, where a whole snippet keeps the template parseable.
            let mut seams = vec![0, src.len()];
            seams.extend(src.match_indices("}}").map(|(i, _)| i + 2));
            seams.extend(src.match_indices("%}").map(|(i, _)| i + 2));
            match below(u, 5) {
                0..=2 => {
                    let at = if chance(u, 80) { *pick(u, &seams) } else { at };
                    src.insert_str(at, pick::<&str>(u, SNIPPETS));
                }
                3 => {
                    let end = floor_boundary(&src, at + below(u, 20));
                    src.replace_range(at..end.max(at), "");
                }
                _ => {
                    let mut b = src.clone().into_bytes();
                    mutate_bytes(u, &mut b, 2);
                    src = String::from_utf8_lossy(&b).into_owned();
                }
            }
        }
        let _ = std::fs::write(self.current("jinja"), &src);
        let mut msgs = vec![
            json!({"role": "system", "content": "be brief"}),
            json!({"role": "user", "content": "hi", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]}),
            json!({"role": "assistant", "content": [{"type": "text", "text": "yo"}]}),
        ];
        if chance(u, 30) {
            let mut v = Value::Array(msgs);
            mutate_json(
                u,
                &mut v,
                &["role", "content", "tool_calls", "name", "text"],
            );
            msgs = match v {
                Value::Array(a) => a,
                other => vec![other],
            };
        }
        let mut opts = mlx_engine::ChatTemplateOptions::generation(chance(u, 50));
        if chance(u, 30) {
            opts.tools = Some(vec![json!({"type": "function", "function": {"name": "f"}})]);
        }
        let r = mlx_engine::ChatTemplate::new(&src).and_then(|t| {
            t.render(
                &msgs,
                &opts,
                &[
                    ("bos_token".into(), "<s>".into()),
                    ("eos_token".into(), "</s>".into()),
                ],
            )
            .map(|_| ())
        });
        r.into()
    }

    // -- prompt-cache files ----------------------------------------------------------------

    /// Writes a mutated prompt-cache file (the seed cache of every kind) to `path`.
    fn craft_prompt_cache(&self, u: &mut Unstructured, path: &Path) -> Result<(), String> {
        let (mut arrays, mut meta) = self.seed_cache.clone();
        const CLASSES: &[&str] = &[
            "KVCache",
            "QuantizedKVCache",
            "RotatingKVCache",
            "RotatingQuantizedKVCache",
            "ChunkedKVCache",
            "ConcatenateKVCache",
            "ArraysCache",
            "CacheList",
            "MambaCache",
            "",
        ];
        for _ in 0..=below(u, 3) {
            match below(u, 6) {
                0 if !meta.is_empty() => {
                    let k = meta
                        .keys()
                        .nth(below(u, meta.len()))
                        .cloned()
                        .unwrap_or_default();
                    meta.remove(&k);
                }
                1 => {
                    let k = format!("1.{}", below(u, 9));
                    meta.insert(k, pick(u, CLASSES).to_string());
                }
                2 if !meta.is_empty() => {
                    let k = meta
                        .keys()
                        .nth(below(u, meta.len()))
                        .cloned()
                        .unwrap_or_default();
                    let v = pick(u, &["scalar", "string", "none", "bogus", "KVCache", "0"]);
                    meta.insert(k, v.to_string());
                }
                3 if !arrays.is_empty() => {
                    let k = arrays
                        .keys()
                        .nth(below(u, arrays.len()))
                        .cloned()
                        .unwrap_or_default();
                    arrays.remove(&k);
                }
                4 if !arrays.is_empty() => {
                    let k = arrays
                        .keys()
                        .nth(below(u, arrays.len()))
                        .cloned()
                        .unwrap_or_default();
                    let v = interesting_u64(u) as i64;
                    let replacement = match below(u, 4) {
                        0 => Array::from_int(v, Dtype::Int64),
                        1 => Array::from_slice(&[v as i32; 3], &[3]),
                        2 => ops::zeros(&[1, 2, below(u, 9) as i32, 32], Dtype::Float32, None),
                        _ => ops::zeros(&[0], Dtype::Uint32, None),
                    };
                    if let Ok(a) = replacement {
                        arrays.insert(k, a);
                    }
                }
                _ => {
                    let depth = below(u, 12);
                    let key = (0..=depth)
                        .map(|_| below(u, 8).to_string())
                        .collect::<Vec<_>>();
                    if let Ok(a) = Array::from_int(below(u, 100) as i64, Dtype::Int32) {
                        arrays.insert(key.join("."), a);
                    }
                }
            }
        }
        save_safetensors(path, arrays.iter().map(|(k, a)| (k.as_str(), a)), &meta)
            .map_err(|e| e.to_string())
    }

    fn prompt_cache(&self, u: &mut Unstructured) -> Outcome {
        let path = self.current("safetensors");
        if let Err(e) = self.craft_prompt_cache(u, &path) {
            return Outcome::Refused(e);
        }
        let r = load_prompt_cache(&path).and_then(|(mut caches, _)| {
            let kv = ops::ones(&[1, 2, 1, 32], Dtype::Float32, None)?;
            for c in caches.iter_mut() {
                let _ = c.offset();
                let _ = c.state();
                if let Ok(kv) = c.update_and_fetch(&kv, &kv) {
                    for a in kv.arrays() {
                        a.eval()?;
                    }
                }
                if c.is_trimmable() {
                    c.trim(2);
                }
            }
            Ok(())
        });
        r.into()
    }
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

const SEED_TEMPLATES: &[&str] = &[
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content | trim }} [/INST]{% elif m.role == 'assistant' %}{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}",
    "{%- if tools %}{{- tools | tojson(indent=2) }}{%- endif %}{%- for m in messages %}{%- if m.tool_calls is defined %}{%- for c in m.tool_calls %}{{ c.function.name }}{{ c.function.arguments | tojson }}{%- endfor %}{%- endif %}{{ m.content if m.content is string else m.content[0].text }}{%- endfor %}",
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ loop.index }}:{{ m['content'] }}{% endfor %}{{ ns.n }}{{ strftime_now('%Y-%m-%d') }}",
];

const SNIPPETS: &[&str] = &[
    "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}",
    "{% for m in messages * 100000 %}{{ m }}{% endfor %}",
    "{% for m in messages %}{{ m | tojson(indent=4) }}{% endfor %}",
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% endif %}",
    "{% set ns = namespace(n=ns) %}{{ ns }}",
    "{% for i in range(100000) %}",
    "{% for i in range(1000000000) %}",
    "{% endfor %}",
    "{{ messages | tojson(indent=1000000000000) }}",
    "{{ messages | tojson(indent=-5) }}",
    "{{ messages | tojson(indent='\t\t') }}",
    "{{ 'x' * 100000000 }}",
    "{{ messages * 1000000 }}",
    "{% set ns = namespace(s='xx') %}",
    "{% set ns.s = ns.s ~ ns.s %}",
    // Doubling a list (`+`: minijinja copies a deep concatenation at once) or nesting it in
    // itself (prints as terabytes): issues #37 and #39.
    "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
    "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}",
    "{{ ns.l ~ '' }}{{ ns.l | join }}{{ ns.l == ns.s }}",
    "{% macro m(n) %}{{ m(n) }}{% endmacro %}{{ m(1) }}",
    "{{ raise_exception('bad') }}",
    "{{ messages[0]['content'][::-1] }}",
    "{{ messages[99] }}",
    "{{ '%s %d' | format('a') }}",
    "{{ messages | map(attribute='role') | join(', ') }}",
    "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}",
    "{{ (messages | first).content.split(' ') }}",
    "{{ messages[0].content.strip().startswith('h') }}",
    "{{ 1 / 0 }}",
    "{{ 10 ** 1000 }}",
    "{{ 99999999999999999999 }}",
    "{% if true %}",
    "{% endif %}",
    "{{",
    "}}",
    "{%",
    "%}",
    "{# #}",
    "{% generation %}x{% endgeneration %}",
    "{{ tools[0].function | tojson(sort_keys=true) }}",
    "{{ strftime_now('%') }}",
    "{{ range(5) | batch(100000000) | list }}",
    "{{ messages | dictsort }}",
    "{% filter upper %}{{ messages }}{% endfilter %}",
    "{% include 'x' %}",
    "{{ add_generation_prompt | string * 99999 }}",
];

fn tiny_tokenizer_json() -> Value {
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [
            {"id": 0, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 1, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
        ],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": {"<s>": 0, "</s>": 1, "h": 2, "e": 3, "l": 4, "o": 5, "Ġ": 6, "w": 7, "r": 8, "d": 9,
                      "he": 10, "ll": 11, "hell": 12, "hello": 13, "Ġw": 14, "or": 15, "Ġwor": 16, "Ġworld": 17,
                      "1": 18, "2": 19, "3": 20, "ld": 21},
            "merges": ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"]
        }
    })
}

fn tiny_tokenizer_config() -> Value {
    json!({
        "bos_token": "<s>",
        "eos_token": "</s>",
        "add_bos_token": true,
        "clean_up_tokenization_spaces": false,
        "chat_template": SEED_TEMPLATES[0],
        "tokenizer_class": "GPT2Tokenizer"
    })
}

/// A GGUF file described by its parts, so mutations can lie about one part at a time.
struct GgufSpec {
    version: u32,
    kv: Vec<(String, u32, Vec<u8>)>,
    /// Name, dims (innermost first), GGML type.
    tensors: Vec<(String, Vec<u64>, u32)>,
}

/// Bytes per block and elements per block of the types the spec draws.
fn ggml_size(t: u32) -> (u64, u64) {
    match t {
        0 => (4, 1),
        1 => (2, 1),
        2 => (18, 32),
        3 => (20, 32),
        8 => (34, 32),
        12 => (144, 256),
        14 => (210, 256),
        30 => (2, 1),
        _ => (1, 1),
    }
}

fn gguf_string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl GgufSpec {
    /// A llama-like file (hyper-parameters, a small tokenizer, a few tensors), then lies.
    fn draw(u: &mut Unstructured) -> GgufSpec {
        let u32v = |v: u32| v.to_le_bytes().to_vec();
        let f32v = |v: f32| v.to_le_bytes().to_vec();
        let mut strv = Vec::new();
        gguf_string(&mut strv, "llama");
        // Arrays: element type, count, elements.
        let mut tokens = 8u32.to_le_bytes().to_vec();
        tokens.extend(8u64.to_le_bytes());
        for s in ["<s>", "</s>", "h", "e", "l", "o", "he", "hello"] {
            gguf_string(&mut tokens, s);
        }
        let mut merges = 8u32.to_le_bytes().to_vec();
        merges.extend(2u64.to_le_bytes());
        gguf_string(&mut merges, "h e");
        gguf_string(&mut merges, "he l");
        let mut model = Vec::new();
        gguf_string(&mut model, "gpt2");
        let mut kv: Vec<(String, u32, Vec<u8>)> = vec![
            ("general.architecture".into(), 8, strv),
            ("llama.attention.head_count".into(), 4, u32v(2)),
            ("llama.attention.head_count_kv".into(), 4, u32v(1)),
            ("llama.embedding_length".into(), 4, u32v(32)),
            ("llama.block_count".into(), 4, u32v(1)),
            ("llama.feed_forward_length".into(), 4, u32v(64)),
            ("llama.vocab_size".into(), 4, u32v(8)),
            ("llama.context_length".into(), 4, u32v(64)),
            (
                "llama.attention.layer_norm_rms_epsilon".into(),
                6,
                f32v(1e-5),
            ),
            ("tokenizer.ggml.model".into(), 8, model),
            ("tokenizer.ggml.tokens".into(), 9, tokens),
            ("tokenizer.ggml.merges".into(), 9, merges),
            ("tokenizer.ggml.bos_token_id".into(), 4, u32v(0)),
            ("tokenizer.ggml.eos_token_id".into(), 4, u32v(1)),
        ];
        let q_type = *pick(u, &[0u32, 1, 2, 3, 8, 30]);
        let mut tensors: Vec<(String, Vec<u64>, u32)> = vec![
            ("token_embd.weight".into(), vec![32, 8], 0),
            ("output_norm.weight".into(), vec![32], 0),
            ("blk.0.attn_norm.weight".into(), vec![32], 0),
            ("blk.0.ffn_norm.weight".into(), vec![32], 0),
            ("blk.0.attn_q.weight".into(), vec![32, 32], q_type),
            ("blk.0.attn_k.weight".into(), vec![32, 16], q_type),
            ("blk.0.attn_v.weight".into(), vec![32, 16], 0),
            ("blk.0.attn_output.weight".into(), vec![32, 32], 1),
            ("blk.0.ffn_gate.weight".into(), vec![32, 64], 0),
            ("blk.0.ffn_up.weight".into(), vec![32, 64], 0),
            ("blk.0.ffn_down.weight".into(), vec![64, 32], 0),
        ];
        let mut g = GgufSpec {
            version: 3,
            kv: Vec::new(),
            tensors: Vec::new(),
        };
        for _ in 0..=below(u, 4) {
            match below(u, 12) {
                0 => g.version = *pick(u, &[0u32, 1, 2, 4, 99, u32::MAX]),
                1 if !kv.is_empty() => {
                    // Another value of another type under the same key.
                    let i = below(u, kv.len());
                    let t = below(u, 14) as u32;
                    let mut v = Vec::new();
                    match t {
                        8 => gguf_string(&mut v, pick::<&str>(u, &["", "llama", "gpt2", "x"])),
                        9 => {
                            v.extend((below(u, 13) as u32).to_le_bytes());
                            v.extend(interesting_u64(u).min(64).to_le_bytes());
                            v.extend(std::iter::repeat_n(0u8, below(u, 64)));
                        }
                        _ => v.extend(interesting_u64(u).to_le_bytes()[..4].iter()),
                    }
                    kv[i].1 = t;
                    kv[i].2 = v;
                }
                2 if !kv.is_empty() => {
                    let i = below(u, kv.len());
                    let v = interesting_u64(u) as u32;
                    kv[i].2 = v.to_le_bytes().to_vec();
                }
                3 if !kv.is_empty() => {
                    kv.remove(below(u, kv.len()));
                }
                4 if !tensors.is_empty() => {
                    tensors.remove(below(u, tensors.len()));
                }
                5 if !tensors.is_empty() => {
                    let i = below(u, tensors.len());
                    let d = below(u, tensors[i].1.len().max(1));
                    if let Some(x) = tensors[i].1.get_mut(d) {
                        *x = interesting_u64(u) % (1 << 40);
                    }
                }
                6 if !tensors.is_empty() => {
                    let i = below(u, tensors.len());
                    tensors[i].2 = *pick(u, &[0u32, 1, 2, 3, 8, 12, 14, 30, 4, 5, 99, 271]);
                }
                7 if !tensors.is_empty() => {
                    let t = tensors[below(u, tensors.len())].clone();
                    tensors.push(t);
                }
                8 => kv.push((
                    "general.alignment".into(),
                    4,
                    (interesting_u64(u) as u32).to_le_bytes().to_vec(),
                )),
                // Float hyper-parameters that mean nothing (a NaN rope base used to load),
                // and a vocabulary token that is not UTF-8: issue #37.
                10 => {
                    let key = *pick(
                        u,
                        &[
                            "llama.rope.freq_base",
                            "llama.attention.layer_norm_rms_epsilon",
                        ],
                    );
                    let v = *pick(u, &[f32::NAN, f32::INFINITY, 0.0, -1.0, 10000.0]);
                    kv.retain(|(k, _, _)| k != key);
                    kv.push((key.into(), 6, f32v(v)));
                }
                11 => {
                    let mut bad = 8u32.to_le_bytes().to_vec();
                    bad.extend(3u64.to_le_bytes());
                    gguf_string(&mut bad, "<s>");
                    bad.extend(2u64.to_le_bytes());
                    bad.extend(*pick(u, &[[0xffu8, 0xfe], [0xc3, 0x28], [0xe2, 0x82]]));
                    gguf_string(&mut bad, "<0x0A>");
                    kv.retain(|(k, _, _)| k != "tokenizer.ggml.tokens");
                    kv.push(("tokenizer.ggml.tokens".into(), 9, bad));
                }
                _ if !tensors.is_empty() => {
                    let i = below(u, tensors.len());
                    tensors[i].0 = pick(
                        u,
                        &[
                            "blk.9.attn_q.weight",
                            "output.weight",
                            "x",
                            "",
                            "blk.0.attn_q.weight",
                        ],
                    )
                    .to_string();
                }
                _ => {}
            }
        }
        g.kv = kv;
        g.tensors = tensors;
        g
    }

    fn bytes(&self, u: &mut Unstructured) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        let lie = |u: &mut Unstructured, n: usize| -> u64 {
            if chance(u, 3) {
                interesting_u64(u)
            } else {
                n as u64
            }
        };
        out.extend(lie(u, self.tensors.len()).to_le_bytes());
        out.extend(lie(u, self.kv.len()).to_le_bytes());
        for (k, t, v) in &self.kv {
            gguf_string(&mut out, k);
            out.extend(t.to_le_bytes());
            out.extend(v);
        }
        let mut offset = 0u64;
        let mut data_len = 0u64;
        for (name, dims, t) in &self.tensors {
            gguf_string(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.to_le_bytes());
            let at = if chance(u, 3) {
                offset.wrapping_add(*pick(u, &[1u64, 31, 32, u64::MAX - 31]))
            } else {
                offset
            };
            out.extend(at.to_le_bytes());
            let (bytes, block) = ggml_size(*t);
            let n: u64 = dims.iter().fold(1u64, |a, &d| a.saturating_mul(d));
            let size = (n / block).saturating_mul(bytes).min(1 << 16);
            let size = size.div_ceil(32) * 32;
            offset = offset.saturating_add(size);
            data_len = data_len.saturating_add(size);
        }
        while out.len() % 32 != 0 {
            out.push(0);
        }
        let data_len = if chance(u, 10) {
            data_len / 2
        } else {
            data_len
        };
        // Small random-ish data (f16/f32 zeros decode to zeros; a few bytes vary).
        let mut data = vec![0u8; data_len.min(1 << 20) as usize];
        for _ in 0..below(u, 8) {
            if !data.is_empty() {
                let i = below(u, data.len());
                data[i] = u.arbitrary().unwrap_or(0);
            }
        }
        out.extend(data);
        out
    }
}

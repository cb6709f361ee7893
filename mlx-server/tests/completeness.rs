//! Issue #36's server items: logprobs in the OpenAI shapes, stop strings that hold back only
//! a possible stop, `n > 1`, CORS, `/metrics`, unsupported fields, `--chat-template` and the
//! KV cache options.

mod common;

use common::{fixture, http, post, EventStream, TestServer};
use mlx_engine::generate::{generate_step, GenerateOptions};
use mlx_engine::Tokenizer;
use serde_json::{json, Value};

const PROMPT: &str = "Count: 1 2 3";

/// Greedy ids and log-probabilities `(vocab,)` of `generate_step` over the fixture with
/// `opts`, for `PROMPT` encoded as `/v1/completions` encodes it.
fn reference(opts: GenerateOptions) -> (Vec<u32>, Vec<Vec<f32>>) {
    reference_at(&fixture(), PROMPT, opts)
}

fn reference_at(
    dir: &std::path::Path,
    prompt: &str,
    opts: GenerateOptions,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let (model, _) =
        mlx_models::load::load_model_dir(dir, &Default::default()).expect("loading the fixture");
    let tok = Tokenizer::from_dir(dir).unwrap();
    let ids: Vec<i32> = tok
        .encode(prompt, true)
        .unwrap()
        .into_iter()
        .map(|t| t as i32)
        .collect();
    let mut tokens = Vec::new();
    let mut lps = Vec::new();
    for step in generate_step(&ids, model.as_ref(), None, opts).unwrap() {
        let step = step.unwrap();
        tokens.push(step.token);
        lps.push(
            step.logprobs
                .astype(mlx_core::Dtype::Float32)
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
        );
    }
    (tokens, lps)
}

fn completion_tokens(v: &Value) -> usize {
    v["usage"]["completion_tokens"].as_u64().unwrap() as usize
}

#[test]
fn logprobs_come_in_the_openai_shapes_with_generate_steps_values() {
    let (want_tokens, want_lps) = reference(GenerateOptions {
        max_tokens: Some(8),
        ..GenerateOptions::default()
    });
    let s = TestServer::start(&[]);
    let tok = Tokenizer::from_dir(fixture()).unwrap();
    let text = |id: u32| tok.decode(&[id], false).unwrap();

    // Completions, both spellings: `logprobs: true, top_logprobs: 2` (mlx_lm.server's) and the
    // legacy `logprobs: 2`.
    for body in [
        json!({"prompt": PROMPT, "max_tokens": 8, "logprobs": true, "top_logprobs": 2}),
        json!({"prompt": PROMPT, "max_tokens": 8, "logprobs": 2}),
    ] {
        let v = post(s.addr, "/v1/completions", &body).json();
        let lp = &v["choices"][0]["logprobs"];
        let n = completion_tokens(&v);
        assert!(n > 0);
        let tokens = lp["tokens"].as_array().unwrap();
        let token_lps = lp["token_logprobs"].as_array().unwrap();
        let tops = lp["top_logprobs"].as_array().unwrap();
        let offsets = lp["text_offset"].as_array().unwrap();
        assert_eq!(tokens.len(), n, "{lp}");
        assert_eq!(token_lps.len(), n);
        assert_eq!(tops.len(), n);
        assert_eq!(offsets.len(), n);
        let mut offset = 0;
        for i in 0..n {
            let id = want_tokens[i];
            assert_eq!(tokens[i], text(id), "token {i}");
            assert_eq!(
                token_lps[i].as_f64().unwrap() as f32,
                want_lps[i][id as usize],
                "token {i}'s logprob"
            );
            let top = tops[i].as_object().unwrap();
            assert_eq!(top.len(), 2, "top_logprobs[{i}] = {top:?}");
            // Greedy: the chosen token is the most likely one.
            assert_eq!(
                top[&text(id)].as_f64().unwrap() as f32,
                want_lps[i][id as usize]
            );
            assert_eq!(offsets[i], offset);
            offset += text(id).chars().count();
        }
    }
    // `logprobs: true` alone: the token log-probabilities, no alternatives.
    let v = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 4, "logprobs": true}),
    )
    .json();
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 4);
    assert!(lp["top_logprobs"].is_null(), "{lp}");

    // Chat: `logprobs.content[]` entries with token, logprob, bytes and their alternatives.
    let v = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5,
                "logprobs": true, "top_logprobs": 3}),
    )
    .json();
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), completion_tokens(&v));
    for e in content {
        let t = e["token"].as_str().unwrap();
        let bytes: Vec<u8> = e["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        assert_eq!(bytes, t.as_bytes());
        assert!(e["logprob"].as_f64().unwrap() <= 0.0);
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0]["token"], e["token"], "greedy: the first alternative");
        assert_eq!(top[0]["logprob"], e["logprob"]);
        assert!(top[0]["bytes"].is_array());
    }

    // Streamed completions: every chunk's logprobs cover its tokens, offsets continue.
    let mut body = json!({"prompt": PROMPT, "max_tokens": 8, "logprobs": 2, "stream": true});
    body["stream_options"] = json!({"include_usage": true});
    let data = EventStream::open(s.addr, "/v1/completions", &body).all();
    let mut all_tokens = Vec::new();
    let mut all_offsets = Vec::new();
    for d in &data[..data.len() - 1] {
        let c: Value = serde_json::from_str(d).unwrap();
        if let Some(lp) = c["choices"][0]["logprobs"].as_object() {
            all_tokens.extend(lp["tokens"].as_array().unwrap().iter().cloned());
            all_offsets.extend(lp["text_offset"].as_array().unwrap().iter().cloned());
            assert_eq!(
                lp["top_logprobs"].as_array().unwrap().len(),
                lp["tokens"].as_array().unwrap().len()
            );
        }
    }
    let want: Vec<Value> = want_tokens[..all_tokens.len()]
        .iter()
        .map(|&t| json!(text(t)))
        .collect();
    assert_eq!(all_tokens, want);
    assert_eq!(all_offsets[0], 0);
}

/// The `content` deltas of a streamed chat request.
fn deltas(s: &TestServer, extra: Value) -> Vec<String> {
    let mut body = json!({"messages": [{"role": "user", "content": "Hi there!"}],
                          "max_tokens": 24, "stream": true});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let data = EventStream::open(s.addr, "/v1/chat/completions", &body).all();
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .filter(|t| !t.is_empty())
        .collect()
}

#[test]
fn stop_strings_hold_back_only_what_could_still_become_one() {
    let s = TestServer::start(&[]);
    let plain = deltas(&s, json!({}));
    assert!(plain.len() > 4, "{plain:?}");
    // A stop string that never starts in the reply: the chunks are those without it.
    let unused = deltas(&s, json!({"stop": ["@@@@@@@@"]}));
    assert_eq!(unused, plain);
    // A stop string that does occur: the text before it arrives as it is generated, not in
    // one piece at the end.
    let whole: String = plain.concat();
    let cut = whole.char_indices().nth(12).unwrap().0;
    let stop = &whole[cut..whole.len().min(cut + 3)];
    let stopped = deltas(&s, json!({"stop": stop}));
    let first = whole.find(stop).unwrap();
    assert_eq!(stopped.concat(), &whole[..first]);
    assert!(stopped.len() > 4, "{stopped:?}");
}

#[test]
fn n_choices_streaming_and_not_each_sampled_on_its_own_and_seeded_reproducibly() {
    let s = TestServer::start(&["--max-n", "4"]);
    let chat = "/v1/chat/completions";
    let msgs = json!([{"role": "user", "content": "Name a color."}]);
    let body = json!({"messages": msgs, "max_tokens": 12, "n": 3, "temperature": 1.0,
                      "seed": 7});
    let a = post(s.addr, chat, &body).json();
    let b = post(s.addr, chat, &body).json();
    let texts = |v: &Value| -> Vec<String> {
        let choices = v["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 3);
        choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                assert_eq!(c["index"], i);
                c["message"]["content"].as_str().unwrap().to_string()
            })
            .collect()
    };
    let (ta, tb) = (texts(&a), texts(&b));
    assert_eq!(ta, tb, "a seeded request repeats");
    assert!(
        ta[0] != ta[1] || ta[1] != ta[2],
        "three samples at temperature 1 should not all be equal: {ta:?}"
    );
    let total: usize = ta.iter().map(|t| t.chars().count()).sum();
    assert!(completion_tokens(&a) >= total.min(1));
    // Greedy: every choice is the greedy reply.
    let greedy = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 8, "n": 2}),
    )
    .json();
    let one = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 8}),
    )
    .json();
    for c in greedy["choices"].as_array().unwrap() {
        assert_eq!(c["text"], one["choices"][0]["text"]);
    }
    assert_eq!(
        completion_tokens(&greedy),
        2 * completion_tokens(&one),
        "usage counts every choice"
    );
    // Streaming: chunks of each index; each choice's text is that of the same seeded request
    // not streamed; one usage chunk, one [DONE].
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let data = EventStream::open(s.addr, chat, &streamed).all();
    assert_eq!(data.last().unwrap(), "[DONE]");
    let mut by_index = vec![String::new(); 3];
    let mut finishes = 0;
    let mut usage = Vec::new();
    for d in &data[..data.len() - 1] {
        let c: Value = serde_json::from_str(d).unwrap();
        if let Some(u) = c.get("usage").filter(|u| !u.is_null()) {
            usage.push(u.clone());
            continue;
        }
        let ch = &c["choices"][0];
        let i = ch["index"].as_u64().unwrap() as usize;
        if let Some(t) = ch["delta"]["content"].as_str() {
            by_index[i].push_str(t);
        }
        finishes += usize::from(!ch["finish_reason"].is_null());
    }
    assert_eq!(by_index, ta);
    assert_eq!(finishes, 3);
    assert_eq!(usage.len(), 1);
    assert_eq!(
        usage[0]["completion_tokens"],
        a["usage"]["completion_tokens"]
    );
    // Above --max-n: a 400 naming `n`.
    let mut big = body.clone();
    big["n"] = json!(5);
    let r = post(s.addr, chat, &big);
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "n");
}

#[test]
fn cors_as_mlx_lm_server_answers_it() {
    // Default: every origin (`*`), on answers, errors and streams; preflight answered.
    let s = TestServer::start(&[]);
    let origin = [("Origin", "http://page.example")];
    let pre = http(
        s.addr,
        "OPTIONS",
        "/v1/chat/completions",
        &[
            ("Origin", "http://page.example"),
            ("Access-Control-Request-Method", "POST"),
            (
                "Access-Control-Request-Headers",
                "authorization, content-type",
            ),
        ],
        b"",
    );
    assert_eq!(pre.status, 204, "{}", pre.headers);
    let h = pre.headers.to_ascii_lowercase();
    assert!(h.contains("access-control-allow-origin: *"), "{h}");
    assert!(h.contains("access-control-allow-methods: *"), "{h}");
    assert!(h.contains("authorization"), "{h}");
    for (method, path, body, status) in [
        ("GET", "/v1/models", &b""[..], 200),
        ("GET", "/nowhere", &b""[..], 404),
        ("POST", "/v1/completions", &b"{\"prompt\": 5}"[..], 400),
        (
            "POST",
            "/v1/completions",
            &b"{\"prompt\": \"hi\", \"max_tokens\": 2, \"stream\": true}"[..],
            200,
        ),
    ] {
        let r = http(s.addr, method, path, &origin, body);
        assert_eq!(r.status, status, "{method} {path}: {}", r.body);
        assert!(
            r.headers
                .to_ascii_lowercase()
                .contains("access-control-allow-origin: *"),
            "{method} {path}: {}",
            r.headers
        );
    }
    drop(s);
    // A list: a listed origin is echoed (with Vary), another gets no grant.
    let s = TestServer::start(&["--allowed-origins", "http://a.example,http://b.example"]);
    let r = http(
        s.addr,
        "GET",
        "/v1/models",
        &[("Origin", "http://b.example")],
        b"",
    );
    let h = r.headers.to_ascii_lowercase();
    assert!(
        h.contains("access-control-allow-origin: http://b.example"),
        "{h}"
    );
    assert!(h.contains("vary: origin"), "{h}");
    let r = http(
        s.addr,
        "GET",
        "/v1/models",
        &[("Origin", "http://c.example")],
        b"",
    );
    assert!(!r
        .headers
        .to_ascii_lowercase()
        .contains("access-control-allow-origin"));
}

/// The value of a sample line `name` (with its labels) in Prometheus text.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn metrics_in_the_prometheus_text_format() {
    let s = TestServer::start(&[]);
    let body = json!({"prompt": PROMPT, "max_tokens": 6});
    let v = post(s.addr, "/v1/completions", &body).json();
    let again = post(s.addr, "/v1/completions", &body).json();
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    EventStream::open(s.addr, "/v1/completions", &streamed).all();
    let _ = post(s.addr, "/v1/completions", &json!({"prompt": 1}));
    let r = http(s.addr, "GET", "/metrics", &[], b"");
    assert_eq!(r.status, 200);
    assert!(
        r.headers.contains("text/plain; version=0.0.4"),
        "{}",
        r.headers
    );
    let m = &r.body;
    eprintln!("{m}");
    // Every sample line is `name{labels} value`, every metric has HELP and TYPE.
    for l in m.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (name, value) = l.rsplit_once(' ').unwrap();
        assert!(value.parse::<f64>().is_ok(), "{l}");
        let base = name.split('{').next().unwrap();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| base.strip_suffix(s))
            .unwrap_or(base);
        assert!(
            m.contains(&format!("# TYPE {family} ")) || m.contains(&format!("# TYPE {base} ")),
            "{l}"
        );
    }
    let ok = r#"mlx_requests_total{endpoint="/v1/completions",status="200"}"#;
    let bad = r#"mlx_requests_total{endpoint="/v1/completions",status="400"}"#;
    assert_eq!(sample(m, ok), Some(3.0));
    assert_eq!(sample(m, bad), Some(1.0));
    let prompt = v["usage"]["prompt_tokens"].as_f64().unwrap();
    assert_eq!(sample(m, "mlx_prompt_tokens_total"), Some(3.0 * prompt));
    assert_eq!(completion_tokens(&v), completion_tokens(&again));
    let generated = 3.0 * completion_tokens(&v) as f64;
    assert_eq!(sample(m, "mlx_generated_tokens_total"), Some(generated));
    assert_eq!(
        sample(m, "mlx_time_to_first_token_seconds_count"),
        Some(3.0)
    );
    assert_eq!(
        sample(m, r#"mlx_time_to_first_token_seconds_bucket{le="+Inf"}"#),
        Some(3.0)
    );
    assert!(sample(m, "mlx_inter_token_latency_seconds_count").unwrap() >= 3.0);
    // The second and third requests continued the first one's cached prompt.
    assert!(sample(m, "mlx_prompt_cache_hits_total").unwrap() >= 2.0);
    assert!(sample(m, "mlx_decode_steps_total").unwrap() > 0.0);
    assert_eq!(sample(m, "mlx_batch_size"), Some(0.0));
    assert!(sample(m, "mlx_memory_peak_bytes").unwrap() > 0.0);
    assert!(sample(m, "mlx_memory_active_bytes").is_some());
    assert!(sample(m, "mlx_memory_cache_bytes").is_some());
    // A request of two choices: one time to first token, both choices' tokens.
    let mut two = body.clone();
    two["n"] = json!(2);
    let v2 = post(s.addr, "/v1/completions", &two).json();
    let m = http(s.addr, "GET", "/metrics", &[], b"").body;
    assert_eq!(
        sample(&m, "mlx_time_to_first_token_seconds_count"),
        Some(4.0)
    );
    assert_eq!(
        sample(&m, "mlx_generated_tokens_total"),
        Some(generated + completion_tokens(&v2) as f64)
    );
    assert_eq!(sample(&m, "mlx_prompt_tokens_total"), Some(4.0 * prompt));
}

#[test]
fn unsupported_openai_fields_are_refused_unknown_ones_ignored() {
    let s = TestServer::start(&[]);
    let msgs = json!([{"role": "user", "content": "hi"}]);
    for (field, value) in [
        ("audio", json!({"voice": "alloy", "format": "wav"})),
        ("modalities", json!(["text", "audio"])),
        ("prediction", json!({"type": "content", "content": "x"})),
        ("functions", json!([{"name": "f"}])),
        ("function_call", json!("auto")),
        ("web_search_options", json!({})),
    ] {
        let mut body = json!({"messages": msgs, "max_tokens": 2});
        body[field] = value;
        let r = post(s.addr, "/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{field}: {}", r.body);
        let e = r.json();
        assert_eq!(e["error"]["param"], field);
        assert!(e["error"]["message"].as_str().unwrap().contains(field));
    }
    for (field, value) in [
        ("echo", json!(true)),
        ("suffix", json!("end")),
        ("best_of", json!(3)),
    ] {
        let mut body = json!({"prompt": "hi", "max_tokens": 2});
        body[field] = value;
        let r = post(s.addr, "/v1/completions", &body);
        assert_eq!(r.status, 400, "{field}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], field);
    }
    // Defaults of those fields, metadata and unknown extensions pass.
    let body = json!({"messages": msgs, "max_tokens": 2, "modalities": ["text"],
                      "user": "u1", "metadata": {"a": "b"}, "store": false,
                      "my_extension": {"x": 1}, "another_one": 3});
    let r = post(s.addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let r = post(s.addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let body = json!({"prompt": "hi", "max_tokens": 2, "echo": false, "best_of": 1});
    assert_eq!(post(s.addr, "/v1/completions", &body).status, 200);
}

#[test]
fn chat_template_flag_replaces_the_tokenizers_template() {
    let s = TestServer::start(&[
        "--chat-template",
        "{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}",
    ]);
    let v = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "abc"}], "max_tokens": 1}),
    )
    .json();
    let tok = Tokenizer::from_dir(fixture()).unwrap();
    // The template's text, encoded without special tokens added (as mlx-lm encodes it).
    let want = tok.encode("<<abc>>", false).unwrap().len();
    assert_eq!(v["usage"]["prompt_tokens"], want, "{v}");
}

/// A tiny mistral (head dimension 32, so its keys quantize in groups of 32) with the
/// word-level tokenizer.
fn mistral() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../mlx-cli/tests/models/mistral_bias_llama3rope")
}

/// Words whose ids are inside qwen3's vocabulary of 96.
const QWORDS: &str = "the cat , the dog . a bird ! hello world , the fish . the sun ? an";

const WORDS: &str =
    "the cat and the dog saw a bird , the sun was warm and the fish swam in the sea";

#[test]
fn kv_bits_and_max_kv_size_serve_what_generate_step_makes() {
    let dir = mistral();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let text_of = |ids: &[u32]| -> String { tok.decode(ids, false).unwrap() };
    let gen = |extra: GenerateOptions| {
        reference_at(
            &dir,
            WORDS,
            GenerateOptions {
                max_tokens: Some(12),
                ..extra
            },
        )
        .0
    };
    let plain = gen(GenerateOptions::default());
    let quant = gen(GenerateOptions {
        kv_bits: Some(4),
        kv_group_size: 32,
        quantized_kv_start: 0,
        ..GenerateOptions::default()
    });
    let body = json!({"prompt": WORDS, "max_tokens": 12});
    let served = |args: &[&str]| -> (String, String) {
        let s = TestServer::start_model(&dir, args);
        // Two requests at once: served one after the other, each as generate_step.
        let a = std::thread::spawn({
            let addr = s.addr;
            let body = body.clone();
            move || post(addr, "/v1/completions", &body).json()
        });
        let b = post(s.addr, "/v1/completions", &body).json();
        let a = a.join().unwrap();
        let mut n2 = body.clone();
        n2["n"] = json!(2);
        if !args.is_empty() {
            assert_eq!(post(s.addr, "/v1/completions", &n2).status, 400);
        }
        let t = |v: &Value| v["choices"][0]["text"].as_str().unwrap().to_string();
        (t(&a), t(&b))
    };
    let check = |want: &[u32], got: (String, String), what: &str| {
        let want = text_of(want);
        for g in [got.0, got.1] {
            assert!(
                !g.is_empty() && want.starts_with(&g),
                "{what}: {g:?} vs {want:?}"
            );
        }
    };
    check(&plain, served(&[]), "plain");
    assert_ne!(
        text_of(&quant),
        text_of(&plain),
        "4-bit keys and values change this reply"
    );
    check(
        &quant,
        served(&[
            "--kv-bits",
            "4",
            "--kv-group-size",
            "32",
            "--quantized-kv-start",
            "0",
        ]),
        "--kv-bits 4",
    );
    // mistral's class defines its own cache (mlx-lm ignores max_kv_size for it); qwen3's
    // does not: --max-kv-size gives it rotating caches.
    let qwen3 = mistral().with_file_name("qwen3");
    let rotating = |max_kv_size| {
        reference_at(
            &qwen3,
            QWORDS,
            GenerateOptions {
                max_tokens: Some(12),
                max_kv_size,
                ..GenerateOptions::default()
            },
        )
    };
    let (plain, rotated) = (rotating(None), rotating(Some(8)));
    // The chosen token's log-probability at each step.
    let chosen = |r: &(Vec<u32>, Vec<Vec<f32>>)| -> Vec<f32> {
        r.0.iter()
            .zip(&r.1)
            .map(|(&t, lp)| lp[t as usize])
            .collect()
    };
    assert_ne!(
        chosen(&plain),
        chosen(&rotated),
        "a rotating cache of 8 changes the log-probabilities"
    );
    let body = json!({"prompt": QWORDS, "max_tokens": 12, "logprobs": true});
    let s = TestServer::start_model(&qwen3, &["--max-kv-size", "8"]);
    let v = post(s.addr, "/v1/completions", &body).json();
    let got: Vec<f32> = v["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    assert!(!got.is_empty());
    assert_eq!(got[..], chosen(&rotated)[..got.len()]);
}

//! `mlx serve --decoder cpu` end to end on the tiny seeded llama: the batch runs on the CPU
//! decoder (`/health` says so); a request decoded together with others (concurrent streaming
//! clients, joining and leaving) gets the reply it gets alone (tier: bit-identical to the CPU
//! decoder alone, so greedy text and log-probabilities are equal); stop strings, `n` choices,
//! log-probabilities, seeded sampling and structured output work on it. The exact path's
//! goldens (mlx_lm.server) are checked by the other tests, which run with `--decoder mlx`.

mod common;

#[path = "../../mlx-engine/tests/support/schema_check.rs"]
mod schema_check;

use common::{post, EventStream, TestServer};
use schema_check::{parse_valid, person_schema};
use serde_json::{json, Value};

const COMPLETIONS: &str = "/v1/completions";
const CHAT: &str = "/v1/chat/completions";

/// Every test here seeds MLX's global key through the server (one process): one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn reply(s: &TestServer, path: &str, body: &Value) -> Value {
    let r = post(s.addr, path, body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

fn text(v: &Value, i: usize) -> String {
    let c = &v["choices"][i];
    c["text"]
        .as_str()
        .or_else(|| c["message"]["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// The streamed text of a completion.
fn streamed(addr: std::net::SocketAddr, body: &Value) -> String {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let ev = EventStream::open(addr, COMPLETIONS, &body);
    assert_eq!(ev.status, 200);
    let data = ev.all();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let mut out = String::new();
    for d in &data[..data.len() - 1] {
        let v: Value = serde_json::from_str(d).unwrap();
        out.push_str(v["choices"][0]["text"].as_str().unwrap_or_default());
    }
    out
}

#[test]
fn batched_requests_get_their_reply_alone_on_the_cpu_decoder() {
    let _turn = serial();
    let s = TestServer::start(&["--decoder", "cpu", "--threads", "2"]);
    let health = reply_get(&s);
    let d = health["decoder"].as_str().unwrap_or_default().to_string();
    assert!(d.starts_with("cpu ("), "{health}");
    let prompts = [
        "hello there",
        "a much longer prompt that spans more tokens",
        "x",
    ];
    let body = |p: &str, n: usize| json!({"prompt": p, "max_tokens": n, "logprobs": 2});
    let alone: Vec<Value> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| reply(&s, COMPLETIONS, &body(p, 20 + 7 * i)))
        .collect();
    // Non-streaming, together (each joins when its request arrives, leaves at its end).
    let addr = s.addr;
    let together: Vec<Value> = std::thread::scope(|sc| {
        let hs: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let b = body(p, 20 + 7 * i);
                sc.spawn(move || {
                    let r = post(addr, COMPLETIONS, &b);
                    assert_eq!(r.status, 200, "{}", r.body);
                    r.json()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (a, t) in alone.iter().zip(&together) {
        assert_eq!(text(a, 0), text(t, 0));
        assert_eq!(
            a["choices"][0]["logprobs"], t["choices"][0]["logprobs"],
            "log-probabilities, bit for bit"
        );
    }
    // Four streaming clients at once, two of each prompt.
    let texts: Vec<String> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4)
            .map(|i| {
                let b = json!({"prompt": prompts[i % 2], "max_tokens": 20 + 7 * (i % 2)});
                sc.spawn(move || streamed(addr, &b))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, t) in texts.iter().enumerate() {
        assert_eq!(*t, text(&alone[i % 2], 0), "streaming client {i}");
    }
    let health = reply_get(&s);
    assert!(health["max_batch_seen"].as_u64().unwrap() > 1, "{health}");
}

fn reply_get(s: &TestServer) -> Value {
    let r = common::http(s.addr, "GET", "/health", &[], b"");
    assert_eq!(r.status, 200);
    r.json()
}

#[test]
fn stop_strings_choices_seeds_and_schemas_work_on_the_cpu_decoder() {
    let _turn = serial();
    let s = TestServer::start(&["--decoder", "cpu", "--threads", "2"]);
    let p = "hello there";
    let full = text(
        &reply(&s, COMPLETIONS, &json!({"prompt": p, "max_tokens": 24})),
        0,
    );
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() > 6, "{full:?}");
    // A stop string: the text ends before its first occurrence.
    let stop: String = chars[4..6].iter().collect();
    let cut = full.find(&stop).unwrap();
    let v = reply(
        &s,
        COMPLETIONS,
        &json!({"prompt": p, "max_tokens": 24, "stop": [stop]}),
    );
    assert_eq!(text(&v, 0), full[..cut]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // `n` greedy choices: each is the reply alone.
    let v = reply(
        &s,
        COMPLETIONS,
        &json!({"prompt": p, "max_tokens": 24, "n": 3}),
    );
    for i in 0..3 {
        assert_eq!(text(&v, i), full, "choice {i}");
    }
    // Seeded sampling repeats; another seed differs somewhere over a few tries.
    let sampled = |seed: u64| {
        text(
            &reply(
                &s,
                COMPLETIONS,
                &json!({"prompt": p, "max_tokens": 24, "temperature": 1.0, "seed": seed}),
            ),
            0,
        )
    };
    let a = sampled(7);
    assert_eq!(a, sampled(7));
    assert!((8..12).any(|k| sampled(k) != a), "sampling draws");
    // Structured output: the reply follows the schema.
    let v = reply(
        &s,
        CHAT,
        &json!({
            "messages": [{"role": "user", "content": "Describe a person as JSON."}],
            "max_tokens": 600,
            "response_format": {"type": "json_schema",
                "json_schema": {"name": "person", "schema": person_schema(), "strict": true}},
        }),
    );
    parse_valid(&person_schema(), &text(&v, 0)).unwrap();
}

/// `/v1/embeddings` on the CPU decoder: mlx-lm's vectors (the serve golden) within the CPU
/// decoder's float rounding (tier L3: sums in another order; bound 1e-5 per component of a
/// unit vector).
#[test]
fn embeddings_on_the_cpu_decoder_are_mlx_lms_within_rounding() {
    let _turn = serial();
    let g = &common::serve_golden()["embeddings"];
    let s = TestServer::start_model(
        &common::server_fixture("embed_qwen3"),
        &["--decoder", "cpu", "--threads", "2"],
    );
    let r = post(s.addr, "/v1/embeddings", &json!({"input": g["texts"]}));
    assert_eq!(r.status, 200, "{}", r.body);
    let got = r.json();
    let n_ids = g["inputs"].as_array().unwrap().len();
    let want = &g["float32"].as_array().unwrap()[n_ids..];
    let rows = got["data"].as_array().unwrap();
    assert_eq!(rows.len(), want.len());
    for (i, (row, w)) in rows.iter().zip(want).enumerate() {
        let (a, b) = (row["embedding"].as_array().unwrap(), w.as_array().unwrap());
        assert_eq!(a.len(), b.len());
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x.as_f64().unwrap() - y.as_f64().unwrap()).abs())
            .fold(0f64, f64::max);
        assert!(worst <= 1e-5, "text {i}: max difference {worst}");
    }
}

//! The HTTP API over raw HTTP/1.1 on loopback: greedy replies equal mlx-lm's
//! (`stream_generate` on the same model and prompt, goldens from `cargo xtask goldens batch`),
//! streaming as server-sent events, prompt-cache reuse, every bad request a 4xx with an OpenAI error object, the
//! queue limit (503 with Retry-After), the API key, and a client that disconnects mid-stream.

use crate::common;

use common::{golden, http, post, EventStream, TestServer};
use serde_json::{json, Value};

fn case(kind: &str, i: usize) -> Value {
    golden()["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["kind"] == kind)
        .nth(i)
        .unwrap()
        .clone()
}

fn health(s: &TestServer) -> Value {
    http(s.addr, "GET", "/health", &[], b"").json()
}

#[test]
fn chat_and_completions_equal_mlx_lm_streaming_and_not() {
    let s = TestServer::start(&[]);
    assert_eq!(health(&s)["status"], "ok");
    let models = http(s.addr, "GET", "/v1/models", &[], b"").json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["object"], "model");

    for i in 0..2 {
        let c = case("chat", i);
        let want = c["text"].as_str().unwrap();
        let body = json!({"model": "tiny_chat", "messages": c["messages"], "max_tokens": 24});
        let r = post(s.addr, "/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(v["object"], "chat.completion");
        assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
        assert_eq!(v["choices"][0]["message"]["role"], "assistant");
        assert_eq!(v["choices"][0]["message"]["content"], want);
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        let prompt_len = c["prompt"].as_array().unwrap().len();
        assert_eq!(v["usage"]["prompt_tokens"], prompt_len);
        assert_eq!(v["usage"]["completion_tokens"], 24);
        assert_eq!(v["usage"]["total_tokens"], prompt_len + 24);

        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        streamed["stream_options"] = json!({"include_usage": true});
        let ev = EventStream::open(s.addr, "/v1/chat/completions", &streamed);
        assert_eq!(ev.status, 200);
        let data = ev.all();
        assert_eq!(data.last().unwrap(), "[DONE]");
        let chunks: Vec<Value> = data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, want);
        let finish: Vec<&Value> = chunks
            .iter()
            .map(|c| &c["choices"][0]["finish_reason"])
            .filter(|f| !f.is_null())
            .collect();
        assert_eq!(finish, vec![&json!("length")]);
        let usage = &chunks.last().unwrap()["usage"];
        assert_eq!(usage["completion_tokens"], 24);
        // The same prompt again: all but its last token come from the prompt cache, and the
        // reply is unchanged.
        assert_eq!(
            usage["prompt_tokens_details"]["cached_tokens"],
            prompt_len - 1
        );
        assert!(chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk"));
    }

    let c = case("completion", 0);
    let body = json!({"prompt": c["prompt_text"], "max_tokens": 24});
    let v = post(s.addr, "/v1/completions", &body).json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], c["text"]);
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let data = EventStream::open(s.addr, "/v1/completions", &streamed).all();
    let text: String = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, c["text"].as_str().unwrap());
}

#[test]
fn bad_requests_get_openai_errors_and_the_server_keeps_serving() {
    let s = TestServer::start(&["--max-tokens-limit", "64", "--max-body-bytes", "4096"]);
    let chat = "/v1/chat/completions";
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let cases: Vec<(Vec<u8>, u16, Option<&str>)> = vec![
        (b"{not json".to_vec(), 400, None),
        (b"[1, 2]".to_vec(), 400, None),
        (
            json!({"messages": msgs, "temperature": "hot"})
                .to_string()
                .into_bytes(),
            400,
            Some("temperature"),
        ),
        (
            json!({"messages": msgs, "temperature": -1})
                .to_string()
                .into_bytes(),
            400,
            Some("temperature"),
        ),
        (
            json!({"messages": msgs, "top_p": 2})
                .to_string()
                .into_bytes(),
            400,
            Some("top_p"),
        ),
        (
            json!({"messages": msgs, "max_tokens": 0})
                .to_string()
                .into_bytes(),
            400,
            Some("max_tokens"),
        ),
        (
            json!({"messages": msgs, "max_tokens": 65})
                .to_string()
                .into_bytes(),
            400,
            Some("max_tokens"),
        ),
        (
            json!({"messages": msgs, "max_tokens": 1.5})
                .to_string()
                .into_bytes(),
            400,
            Some("max_tokens"),
        ),
        (
            json!({"messages": msgs, "n": 9}).to_string().into_bytes(),
            400,
            Some("n"),
        ),
        (
            json!({"messages": msgs, "stop": 3})
                .to_string()
                .into_bytes(),
            400,
            Some("stop"),
        ),
        (
            json!({"messages": msgs, "logit_bias": {"999": 1}})
                .to_string()
                .into_bytes(),
            400,
            Some("logit_bias"),
        ),
        (
            json!({"messages": msgs, "top_logprobs": 50})
                .to_string()
                .into_bytes(),
            400,
            Some("top_logprobs"),
        ),
        (
            json!({"messages": msgs, "stream": "yes"})
                .to_string()
                .into_bytes(),
            400,
            Some("stream"),
        ),
        (
            json!({"messages": "hi"}).to_string().into_bytes(),
            400,
            Some("messages"),
        ),
        (
            json!({"messages": []}).to_string().into_bytes(),
            400,
            Some("messages"),
        ),
        (
            json!({"messages": [{"content": "x"}]})
                .to_string()
                .into_bytes(),
            400,
            Some("messages"),
        ),
        (json!({}).to_string().into_bytes(), 400, Some("messages")),
        (
            json!({"messages": msgs, "model": "gpt-4"})
                .to_string()
                .into_bytes(),
            404,
            Some("model"),
        ),
        (
            json!({"messages": msgs, "model": 7})
                .to_string()
                .into_bytes(),
            400,
            Some("model"),
        ),
        (vec![b' '; 5000], 413, None),
    ];
    for (body, status, param) in cases {
        let r = http(s.addr, "POST", chat, &[], &body);
        assert_eq!(
            r.status,
            status,
            "{} -> {}",
            String::from_utf8_lossy(&body[..body.len().min(80)]),
            r.body
        );
        let e = r.json();
        assert!(
            e["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{e}"
        );
        assert!(e["error"]["type"].is_string());
        if let Some(p) = param {
            assert_eq!(e["error"]["param"], p, "{e}");
        }
    }
    let r = post(s.addr, "/v1/completions", &json!({"prompt": ["a", "b"]}));
    assert_eq!(
        (r.status, r.json()["error"]["param"].clone()),
        (400, json!("prompt"))
    );
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 8, "max_context": 1}),
    );
    assert_eq!(r.status, 200, "unknown fields are ignored");
    let r = http(s.addr, "GET", "/v1/nothing", &[], b"");
    assert_eq!(r.status, 404);
    assert!(r.json()["error"]["message"].is_string());
    let r = http(s.addr, "GET", "/v1/chat/completions", &[], b"");
    assert_eq!(r.status, 405);
    assert!(r.json()["error"]["message"].is_string(), "{}", r.body);

    // Still serving.
    let r = post(s.addr, chat, &json!({"messages": msgs, "max_tokens": 4}));
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn context_limit_queue_limit_and_api_key() {
    let s = TestServer::start(&[
        "--max-batch",
        "1",
        "--queue-size",
        "1",
        "--max-context",
        "4096",
        "--api-key",
        "sekret",
    ]);
    let auth = [("Authorization", "Bearer sekret")];
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let body = |v: Value| v.to_string().into_bytes();

    let r = http(
        s.addr,
        "POST",
        "/v1/chat/completions",
        &[],
        &body(json!({"messages": msgs})),
    );
    assert_eq!(
        (r.status, r.json()["error"]["code"].clone()),
        (401, json!("invalid_api_key"))
    );
    let r = http(
        s.addr,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer wrong")],
        b"",
    );
    assert_eq!(r.status, 401);
    assert_eq!(http(s.addr, "GET", "/health", &[], b"").status, 200);

    // 20 prompt tokens + 4090 > 4096.
    let long = json!({"prompt": "x".repeat(20), "max_tokens": 4090});
    let r = http(s.addr, "POST", "/v1/completions", &auth, &body(long));
    let e = r.json()["error"].clone();
    assert_eq!(
        (r.status, e["param"].clone(), e["code"].clone()),
        (400, json!("prompt"), json!("context_length_exceeded"))
    );
    assert!(
        e["message"].as_str().unwrap().contains("(--max-context)"),
        "{e}"
    );

    // One decoding (it has sent a token), one waiting (accepted: its headers came), the
    // third refused.
    let streaming =
        json!({"prompt": "ab", "max_tokens": 4000, "stream": true, "logit_bias": {"2": -100}});
    let open = |v: &Value, wait_for_data: bool| {
        use std::io::{BufRead, BufReader, Write};
        let mut sock = std::net::TcpStream::connect(s.addr).unwrap();
        let b = v.to_string();
        write!(
            sock,
            "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer sekret\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        )
        .unwrap();
        let mut r = BufReader::new(sock);
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert!(line.contains(" 200 "), "{line}");
        while wait_for_data && !line.starts_with("data: ") {
            line.clear();
            assert!(r.read_line(&mut line).unwrap() > 0);
        }
        r
    };
    let first = open(&streaming, true);
    let second = open(&streaming, false);
    let r = http(
        s.addr,
        "POST",
        "/v1/completions",
        &auth,
        &body(streaming.clone()),
    );
    // The server is overloaded (not this client over a rate limit): 503 with Retry-After,
    // which OpenAI's clients honour when they retry.
    assert_eq!(
        (r.status, r.json()["error"]["code"].clone()),
        (503, json!("queue_full"))
    );
    assert!(
        r.headers.to_ascii_lowercase().contains("retry-after: 1"),
        "{}",
        r.headers
    );
    drop((first, second));
    // Both leave once the server notices (bounded polling, no timing assertion).
    for _ in 0..1000 {
        let h = http(s.addr, "GET", "/health", &[], b"").json();
        if h["active"] == 0 && h["queued"] == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let r = http(
        s.addr,
        "POST",
        "/v1/completions",
        &auth,
        &body(json!({"prompt": "ab", "max_tokens": 3})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn a_client_that_disconnects_mid_stream_frees_its_slot() {
    let s = TestServer::start(&["--max-batch", "2"]);
    let body =
        json!({"prompt": "abc", "max_tokens": 8000, "stream": true, "logit_bias": {"2": -100}});
    let mut ev = EventStream::open(s.addr, "/v1/completions", &body);
    assert_eq!(ev.status, 200);
    for _ in 0..3 {
        assert!(ev.next_data().is_some());
    }
    drop(ev);
    // The row leaves at the next step after the server notices; bounded polling, no timing
    // assertion: the check is that it left long before its 8000 tokens.
    let mut h = health(&s);
    for _ in 0..400 {
        if h["active"] == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
        h = health(&s);
    }
    assert_eq!(h["active"], 0, "{h}");
    assert!(h["decode_steps"].as_u64().unwrap() < 8000, "{h}");
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "abc", "max_tokens": 3}),
    );
    assert_eq!(r.status, 200);
}

#[test]
fn a_request_past_its_timeout_ends_with_an_error_event() {
    let s = TestServer::start(&["--request-timeout", "1"]);
    let body =
        json!({"prompt": "abc", "max_tokens": 8000, "stream": true, "logit_bias": {"2": -100}});
    let data = EventStream::open(s.addr, "/v1/completions", &body).all();
    assert_eq!(data.last().unwrap(), "[DONE]");
    let last: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert!(
        last["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("timed out")),
        "{last}"
    );
    assert!(data.len() < 8000);
}

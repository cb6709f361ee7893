//! The size limits of `mlx serve` (issue #38): a request over `--max-request-tokens`,
//! `--max-embedding-inputs` or `--max-embedding-input-tokens` gets a 413 naming the field;
//! past `--max-queued-tokens` a request gets a 429 with `Retry-After`; the server keeps
//! serving.

use crate::common;

use std::time::Duration;

use common::{http, post, TestServer};
use serde_json::{json, Value};

fn assert_error(r: &common::Reply, status: u16, param: &str, code: &str) {
    assert_eq!(r.status, status, "{}", r.body);
    let e = &r.json()["error"];
    assert_eq!(e["param"], param, "{}", r.body);
    assert_eq!(e["code"], code, "{}", r.body);
    assert!(
        e["message"].as_str().unwrap().contains("--max-"),
        "{}",
        r.body
    );
}

#[test]
fn requests_over_the_size_limits_get_413_naming_the_field() {
    let s = TestServer::start(&[
        "--max-request-tokens",
        "300",
        "--max-embedding-inputs",
        "4",
        "--max-embedding-input-tokens",
        "100",
    ]);
    let long: String = "ab".repeat(200);
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": long, "max_tokens": 1}),
    );
    assert_error(&r, 413, "prompt", "request_too_large");
    let r = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": long}], "max_tokens": 1}),
    );
    assert_error(&r, 413, "messages", "request_too_large");
    let r = post(s.addr, "/v1/embeddings", &json!({"input": vec!["a"; 5]}));
    assert_error(&r, 413, "input", "request_too_large");
    let r = post(s.addr, "/v1/embeddings", &json!({"input": [vec![5; 101]]}));
    assert_error(&r, 413, "input", "request_too_large");
    let r = post(
        s.addr,
        "/v1/embeddings",
        &json!({"input": vec![vec![5; 100]; 4]}),
    );
    assert_error(&r, 413, "input", "request_too_large");
    // At the limits: served.
    let r = post(
        s.addr,
        "/v1/embeddings",
        &json!({"input": vec![vec![5; 75]; 4]}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "ab".repeat(20), "max_tokens": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn past_the_queued_token_cap_requests_get_429_with_retry_after() {
    let s = TestServer::start(&["--max-queued-tokens", "1000"]);
    let addr = s.addr;
    // 30k tokens: over the cap, accepted as nothing is queued.
    let big = std::thread::spawn(move || {
        let inputs: Vec<Vec<u32>> = (0..300).map(|i| vec![3 + i % 100; 100]).collect();
        post(addr, "/v1/embeddings", &json!({ "input": inputs }))
    });
    let queued = |addr| -> u64 {
        http(addr, "GET", "/health", &[], b"").json()["queued_tokens"]
            .as_u64()
            .unwrap()
    };
    let mut seen = false;
    for _ in 0..2000 {
        if queued(addr) >= 10_000 {
            seen = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(seen, "the large request was never seen queued");
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 2}),
    );
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(
        r.headers.to_ascii_lowercase().contains("retry-after: 1"),
        "{}",
        r.headers
    );
    let e: Value = r.json()["error"].clone();
    assert_eq!(e["type"], "rate_limit_error");
    assert_eq!(e["code"], "too_many_queued_tokens");
    assert!(e["message"]
        .as_str()
        .unwrap()
        .contains("--max-queued-tokens"));
    let r = big.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(queued(addr), 0);
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

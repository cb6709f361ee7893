//! A chat template that doubles a list (issue #39: the process grew to 3.2 GB and aborted,
//! every client lost its stream) fails only the request that renders it: another client's
//! stream runs to its end and `/health` keeps answering.

use crate::common;

use std::path::PathBuf;

use common::{http, post, EventStream, TestServer};
use serde_json::{json, Value};

/// A copy of the tiny chat fixture whose template doubles a list 40 times when the request's
/// `chat_template_kwargs` set `bomb` (and renders as the fixture's otherwise).
fn bomb_model() -> PathBuf {
    let src = common::fixture();
    let dir = std::env::temp_dir().join(format!("mlx-serve-template-bomb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(src.join("tokenizer_config.json")).unwrap()).unwrap();
    let template = config["chat_template"].as_str().unwrap().to_string();
    config["chat_template"] = Value::from(format!(
        "{{% if bomb is defined and bomb %}}{{% set ns = namespace(x=[1]) %}}\
         {{% for i in range(40) %}}{{% set ns.x = ns.x + ns.x %}}{{% endfor %}}\
         {{{{ ns.x | length }}}}{{% endif %}}{template}"
    ));
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::to_vec(&config).unwrap(),
    )
    .unwrap();
    dir
}

#[test]
fn a_doubling_template_fails_its_request_and_the_server_keeps_streaming() {
    let dir = bomb_model();
    let s = TestServer::start_model(&dir, &[]);
    let chat = "/v1/chat/completions";
    let msgs = json!([{"role": "user", "content": "hi"}]);

    let stream_body = json!({"messages": msgs, "max_tokens": 48, "stream": true});
    let mut ev = EventStream::open(s.addr, chat, &stream_body);
    assert_eq!(ev.status, 200);
    let mut data = vec![ev.next_data().expect("a first chunk")];

    for _ in 0..3 {
        let r = post(
            s.addr,
            chat,
            &json!({"messages": msgs, "max_tokens": 8, "chat_template_kwargs": {"bomb": true}}),
        );
        assert!((400..600).contains(&r.status), "{} {}", r.status, r.body);
        let v = r.json();
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("tokenizer_config.json") && message.contains("stopped after"),
            "{v}"
        );
        assert!(v["error"]["type"].is_string(), "{v}");
        assert_eq!(http(s.addr, "GET", "/health", &[], b"").status, 200);
    }

    while let Some(d) = ev.next_data() {
        let done = d == "[DONE]";
        data.push(d);
        if done {
            break;
        }
    }
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let finish = chunks.iter().find_map(|c| {
        c["choices"][0]["finish_reason"]
            .as_str()
            .map(str::to_string)
    });
    assert!(
        matches!(finish.as_deref(), Some("length") | Some("stop")),
        "{chunks:?}"
    );

    // The same template without the kwarg renders as the fixture's does.
    let plain = post(s.addr, chat, &json!({"messages": msgs, "max_tokens": 4}));
    assert_eq!(plain.status, 200, "{}", plain.body);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

//! Structured output end to end: `response_format` (`json_schema`, `json_object`) on
//! `/v1/chat/completions` and `/v1/completions`, streaming and not, greedy and sampled, on the
//! tiny seeded llama (whose free reply is not JSON); constrained and unconstrained requests
//! decoded together in one batch, each keeping its own constraint; `tool_choice` forcing a call
//! with arguments valid against the tool's `parameters` (both tool formats the server parses);
//! bad schemas and choices as 400s naming the field.

mod common;

#[path = "../../mlx-engine/tests/support/schema_check.rs"]
mod schema_check;

use common::{post, server_fixture, EventStream, TestServer};
use schema_check::{parse_valid, person_schema, validate};
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";

/// MLX's global random key is shared by every thread of the process, and an array made on
/// one thread's stream cannot be evaluated on another's: tests that seed and sample take
/// turns.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn messages() -> Value {
    json!([{"role": "user", "content": "Describe a person as JSON."}])
}

fn schema_format() -> Value {
    json!({"type": "json_schema",
           "json_schema": {"name": "person", "schema": person_schema(), "strict": true}})
}

/// The text of a chat or completion response, and its finish reason.
fn text_of(v: &Value) -> (String, String) {
    let c = &v["choices"][0];
    let text = c["message"]["content"]
        .as_str()
        .or_else(|| c["text"].as_str())
        .unwrap_or_default()
        .to_string();
    (text, c["finish_reason"].as_str().unwrap_or_default().into())
}

/// The text of a stream (chat deltas or completion chunks) and its finish reason.
fn streamed(s: &TestServer, path: &str, body: &Value) -> (String, String) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let ev = EventStream::open(s.addr, path, &body);
    assert_eq!(ev.status, 200);
    let data = ev.all();
    assert_eq!(data.last().unwrap(), "[DONE]");
    let mut text = String::new();
    let mut finish = String::new();
    for d in &data[..data.len() - 1] {
        let v: Value = serde_json::from_str(d).unwrap();
        let c = &v["choices"][0];
        if let Some(t) = c["delta"]["content"]
            .as_str()
            .or_else(|| c["text"].as_str())
        {
            text.push_str(t);
        }
        if let Some(f) = c["finish_reason"].as_str() {
            finish = f.into();
        }
    }
    (text, finish)
}

fn reply(s: &TestServer, path: &str, body: &Value) -> (String, String) {
    let r = post(s.addr, path, body);
    assert_eq!(r.status, 200, "{}", r.body);
    text_of(&r.json())
}

#[test]
fn json_schema_and_json_object_replies_streaming_and_not_greedy_and_sampled() {
    let _turn = serial();
    let s = TestServer::start(&[]);
    let schema = person_schema();
    // Without a constraint the fixture's reply is not JSON.
    let free = json!({"messages": messages(), "max_tokens": 40});
    let (text, _) = reply(&s, CHAT, &free);
    assert!(serde_json::from_str::<Value>(&text).is_err(), "{text:?}");

    let sampling = [
        json!({}),
        json!({"temperature": 1.0, "seed": 11}),
        json!({"temperature": 0.8, "top_p": 0.9, "seed": 12}),
    ];
    for (path, base) in [
        (CHAT, json!({"messages": messages()})),
        ("/v1/completions", json!({"prompt": "A person as JSON: "})),
    ] {
        for extra in &sampling {
            let mut body = base.clone();
            body["max_tokens"] = json!(600);
            body["response_format"] = schema_format();
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            let (a, fa) = reply(&s, path, &body);
            parse_valid(&schema, &a).unwrap_or_else(|e| panic!("{path} {extra}: {e}"));
            assert_eq!(fa, "stop");
            let (b, fb) = streamed(&s, path, &body);
            parse_valid(&schema, &b).unwrap_or_else(|e| panic!("{path} {extra} streamed: {e}"));
            assert_eq!(fb, "stop");
            // Same request, same seed: the stream carries the same text.
            assert_eq!(a, b, "{path} {extra}");
        }
    }

    // json_object: a strong bias towards `}` makes the free reply `}}}...`; constrained it
    // is still one JSON object.
    let mut body = json!({"messages": messages(), "max_tokens": 8, "logit_bias": {"97": 30}});
    let (text, _) = reply(&s, CHAT, &body);
    assert!(serde_json::from_str::<Value>(&text).is_err(), "{text:?}");
    body["max_tokens"] = json!(600);
    body["response_format"] = json!({"type": "json_object"});
    for extra in &sampling {
        let mut body = body.clone();
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        for (text, finish) in [reply(&s, CHAT, &body), streamed(&s, CHAT, &body)] {
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert!(v.is_object(), "{text:?}");
            assert_eq!(finish, "stop");
        }
    }

    // "text" is no constraint: the free reply.
    let mut plain = free.clone();
    plain["response_format"] = json!({"type": "text"});
    assert_eq!(reply(&s, CHAT, &plain).0, reply(&s, CHAT, &free).0);
}

#[test]
fn a_batch_of_constrained_and_free_requests_each_keeps_its_own_constraint() {
    let _turn = serial();
    let s = TestServer::start(&["--max-batch", "8"]);
    let schema = person_schema();
    let free = json!({"messages": messages(), "max_tokens": 60});
    let lark_free = json!({"prompt": "A person as JSON: ", "max_tokens": 60});
    let alone_free = reply(&s, CHAT, &free).0;
    let alone_completion = reply(&s, "/v1/completions", &lark_free).0;
    let bodies = [
        (
            CHAT,
            json!({"messages": messages(), "max_tokens": 600, "response_format": schema_format()}),
        ),
        (CHAT, free.clone()),
        (
            CHAT,
            json!({"messages": messages(), "max_tokens": 600, "response_format": schema_format(),
                      "temperature": 1.0, "seed": 5}),
        ),
        (
            CHAT,
            json!({"messages": messages(), "max_tokens": 600, "logit_bias": {"97": 30},
                      "response_format": {"type": "json_object"}}),
        ),
        ("/v1/completions", lark_free.clone()),
        (
            "/v1/completions",
            json!({"prompt": "A person as JSON: ", "max_tokens": 600,
                                   "response_format": schema_format(), "temperature": 0.7,
                                   "seed": 6}),
        ),
    ];
    for round in 0..2 {
        let addr = s.addr;
        let threads: Vec<_> = bodies
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, (path, body))| {
                std::thread::spawn(move || {
                    let r = post(addr, path, &body);
                    assert_eq!(r.status, 200, "{}", r.body);
                    (i, body, text_of(&r.json()).0)
                })
            })
            .collect();
        for t in threads {
            let (i, body, text) = t.join().unwrap();
            match i {
                1 => assert_eq!(text, alone_free, "round {round}: the free chat changed"),
                4 => assert_eq!(text, alone_completion, "round {round}: the free completion"),
                3 => assert!(
                    serde_json::from_str::<Value>(&text).is_ok_and(|v| v.is_object()),
                    "round {round}: {text:?}"
                ),
                _ => {
                    parse_valid(&schema, &text)
                        .unwrap_or_else(|e| panic!("round {round}, {body}: {e}"));
                }
            }
        }
    }
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather", "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}},
                           "required": ["city"]}}},
        {"type": "function", "function": {
            "name": "get_time", "description": "The time in a zone.",
            "parameters": {"type": "object",
                           "properties": {"zone": {"enum": ["UTC", "CET"]},
                                          "hours": {"type": "integer", "minimum": 0, "maximum": 23}},
                           "required": ["zone", "hours"], "additionalProperties": false}}}
    ])
}

fn params_of(name: &str) -> Value {
    tools()
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == name)
        .unwrap()["function"]["parameters"]
        .clone()
}

/// The one call of a response (or of a stream's deltas), checked against its tool's schema.
fn check_call(name: Option<&str>, fname: &str, args: &str) {
    if let Some(n) = name {
        assert_eq!(fname, n);
    }
    let v: Value = serde_json::from_str(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    validate(&params_of(fname), &v).unwrap_or_else(|e| panic!("{fname} {args}: {e}"));
}

#[test]
fn tool_choice_forces_a_call_with_valid_arguments_in_both_tool_formats() {
    let _turn = serial();
    for fixture in ["tools_qwen3", "tools_llama3"] {
        let s = TestServer::start_model(&server_fixture(fixture), &[]);
        let ask = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
        // The fixtures' free reply calls get_weather; a named choice must call get_time.
        for (choice, want) in [
            (
                json!({"type": "function", "function": {"name": "get_time"}}),
                Some("get_time"),
            ),
            (json!("required"), None),
        ] {
            for extra in [json!({}), json!({"temperature": 1.0, "seed": 21})] {
                let mut body = json!({"messages": ask, "tools": tools(), "tool_choice": choice,
                                      "max_tokens": 300});
                for (k, v) in extra.as_object().unwrap() {
                    body[k] = v.clone();
                }
                let r = post(s.addr, CHAT, &body);
                assert_eq!(r.status, 200, "{fixture}: {}", r.body);
                let v = r.json();
                let c = &v["choices"][0];
                assert_eq!(c["finish_reason"], "tool_calls", "{fixture}: {v}");
                let calls = c["message"]["tool_calls"].as_array().unwrap();
                assert_eq!(calls.len(), 1, "{fixture}: {v}");
                let f = &calls[0]["function"];
                check_call(
                    want,
                    f["name"].as_str().unwrap(),
                    f["arguments"].as_str().unwrap(),
                );

                body["stream"] = json!(true);
                let ev = EventStream::open(s.addr, CHAT, &body);
                assert_eq!(ev.status, 200);
                let (mut name, mut args, mut finish) = (String::new(), String::new(), None);
                for d in ev.all() {
                    let Ok(v) = serde_json::from_str::<Value>(&d) else {
                        continue;
                    };
                    let c = &v["choices"][0];
                    for tc in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
                        name.push_str(tc["function"]["name"].as_str().unwrap_or_default());
                        args.push_str(tc["function"]["arguments"].as_str().unwrap_or_default());
                    }
                    if let Some(f) = c["finish_reason"].as_str() {
                        finish = Some(f.to_string());
                    }
                }
                assert_eq!(finish.as_deref(), Some("tool_calls"), "{fixture}");
                check_call(want, &name, &args);
            }
        }
    }
}

#[test]
fn bad_response_formats_and_tool_choices_are_400s_naming_the_field() {
    let _turn = serial();
    let s = TestServer::start(&[]);
    let bad = |body: Value, param: &str, needle: &str| {
        let r = post(s.addr, CHAT, &body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        let e = &r.json()["error"];
        assert_eq!(e["param"], param, "{}", r.body);
        let msg = e["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{msg}");
    };
    let m = messages();
    bad(
        json!({"messages": m, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}}}),
        "response_format.json_schema.schema",
        "nonsense",
    );
    bad(
        json!({"messages": m, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
        "response_format.json_schema.schema",
        "required",
    );
    bad(
        json!({"messages": m, "response_format": {"type": "yaml"}}),
        "response_format.type",
        "yaml",
    );
    bad(
        json!({"messages": m, "response_format": "json"}),
        "response_format",
        "object",
    );
    bad(
        json!({"messages": m, "tool_choice": "required"}),
        "tool_choice",
        "no `tools`",
    );
    bad(
        json!({"messages": m, "tools": tools(),
               "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
        "tool_choice",
        "nope",
    );
    // The tiny chat template marks no tool calls the server reads.
    bad(
        json!({"messages": m, "tools": tools(), "tool_choice": "required"}),
        "tool_choice",
        "tool-call format",
    );
    // Still serving.
    let r = post(s.addr, CHAT, &json!({"messages": m, "max_tokens": 4}));
    assert_eq!(r.status, 200);
}

//! `mlx serve --draft-model`: completions speculate with the draft model (mlx-lm's
//! `speculative_generate_step`, checked against mlx-lm in `mlx-engine/tests/speculative.rs`),
//! so greedy completions equal mlx-lm's speculative tokens and the server's own plain ones;
//! the per-request `num_draft_tokens` and `draft_model` fields are read as mlx_lm.server
//! reads them, and bad values are refused naming the field.

use crate::common;

use std::path::PathBuf;

use common::{post, TestServer};
use serde_json::{json, Value};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn completion(s: &TestServer, extra: Value) -> (u16, Value) {
    let mut body = json!({"prompt": "the cat is big", "max_tokens": 24, "temperature": 0.0});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let r = post(s.addr, "/v1/completions", &body);
    (r.status, r.json())
}

#[test]
fn a_draft_model_server_gives_plain_greedy_completions() {
    let target = repo().join("mlx-cli/tests/models/dense_f32");
    let draft = repo().join("mlx-cli/tests/models/dense_f32_draft");
    let plain = TestServer::start_model(&target, &[]);
    let (status, want) = completion(&plain, json!({}));
    assert_eq!(status, 200, "{want}");
    let want = want["choices"][0]["text"].clone();
    let spec = TestServer::start_model(&target, &["--draft-model", draft.to_str().unwrap()]);
    for extra in [
        json!({}),
        json!({"num_draft_tokens": 1}),
        json!({"num_draft_tokens": 5, "draft_model": "default_model"}),
        json!({"draft_model": draft.to_str().unwrap()}),
    ] {
        let (status, got) = completion(&spec, extra.clone());
        assert_eq!(status, 200, "{extra}: {got}");
        assert_eq!(got["choices"][0]["text"], want, "{extra}");
    }
    for (extra, field) in [
        (json!({"num_draft_tokens": -1}), "num_draft_tokens"),
        (json!({"draft_model": "other/model"}), "draft_model"),
        (json!({"draft_model": 3}), "draft_model"),
    ] {
        let (status, got) = completion(&spec, extra.clone());
        assert_eq!(status, 400, "{extra}: {got}");
        assert!(got.to_string().contains(field), "{extra}: {got}");
    }
    // Without --draft-model, naming a draft model is an error.
    let (status, got) = completion(&plain, json!({"draft_model": "x"}));
    assert_eq!(status, 400, "{got}");
}

/// A draft model that cannot load stops the server with an error naming the option, the path
/// and the loader's problem (typed: `EngineError::DraftModel`, issue #29).
#[test]
fn a_draft_model_that_fails_to_load_is_named() {
    let target = repo().join("mlx-cli/tests/models/dense_f32");
    let missing = repo().join("mlx-cli/tests/models/no_such_draft");
    let err = TestServer::bind_error(&target, &["--draft-model", missing.to_str().unwrap()]);
    let msg = err.to_string();
    assert!(matches!(err, mlx_server::ServeError::Load(_)), "{msg}");
    assert!(
        msg.contains(&format!("--draft-model {}", missing.display())),
        "{msg}"
    );
    assert!(msg.contains("no_such_draft"), "{msg}");
}

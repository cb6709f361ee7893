//! The server driven by the official `openai` Python package (installed into a venv under
//! `target/`, pinned), including a 32-client concurrent streaming load test. The checks are
//! in `openai_client.py`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{golden_path, server_fixture, TestServer};

const OPENAI: &str = "openai==3.57.0";

/// `target/openai-venv` with the pinned client, made on first use.
fn venv_python() -> PathBuf {
    // The tests run in parallel threads: one creates the venv, the others wait for it.
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = MAKING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let venv = root.join("target").join("openai-venv");
    let py = venv.join("bin").join("python");
    let ready = venv.join(format!(".installed-{OPENAI}"));
    if !ready.is_file() {
        let status = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("running python3 -m venv");
        assert!(
            status.success(),
            "python3 -m venv {} failed",
            venv.display()
        );
        let status = Command::new(&py)
            .args(["-m", "pip", "install", "--quiet", OPENAI])
            .status()
            .expect("running pip");
        assert!(status.success(), "pip install {OPENAI} failed");
        std::fs::write(&ready, b"").unwrap();
    }
    py
}

#[test]
fn the_official_openai_client_including_32_concurrent_streams() {
    let py = venv_python();
    let s = TestServer::start(&["--max-batch", "16", "--queue-size", "64"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let out = Command::new(py)
        .arg(script)
        .arg(s.url())
        .arg(golden_path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "openai_client.py failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all checks passed"));
    // How the 32 streams joined: prefills of several new requests together, the largest batch.
    let health = common::http(s.addr, "GET", "/health", &[], b"").json();
    eprintln!(
        "batched prefills: {}, largest decode batch: {}",
        health["batched_prefills"], health["max_batch_seen"]
    );
}

/// Tool calls and the context limit through the `openai` client (`openai_tools.py`), on the
/// fixture whose reply is a tool call.
#[test]
fn the_official_openai_client_gets_typed_tool_calls() {
    let py = venv_python();
    let s = TestServer::start_model(&server_fixture("tools_qwen3"), &[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_tools.py");
    let out = Command::new(py).arg(script).arg(s.url()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "openai_tools.py failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all checks passed"));
}

/// Structured output through the `openai` client (`openai_structured.py`): `parse` with a
/// Pydantic model, streaming and not, `json_object`, a bad schema, a forced tool call.
#[test]
fn the_official_openai_client_gets_structured_output() {
    let py = venv_python();
    let s = TestServer::start(&[]);
    let t = TestServer::start_model(&server_fixture("tools_qwen3"), &[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_structured.py");
    let out = Command::new(py)
        .arg(script)
        .arg(s.url())
        .arg(t.url())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "openai_structured.py failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all checks passed"));
}

/// Issue #36's server items through the `openai` client (`openai_complete.py`): `n > 1`,
/// logprobs shapes, unsupported fields, CORS and `/metrics`.
#[test]
fn the_official_openai_client_gets_n_choices_logprobs_cors_and_metrics() {
    let py = venv_python();
    let s = TestServer::start(&[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_complete.py");
    let out = Command::new(py).arg(script).arg(s.url()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "openai_complete.py failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all checks passed"));
}

//! For the connection tests: a server whose shutdown the test triggers and times, the
//! `mlx-serve` binary under signals, and raw sockets that misbehave (partial heads, readers
//! that stop).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "../common/mod.rs"]
mod common;

pub use common::fixture;
/// A server on the tiny fixture whose shutdown the test triggers (`TestServer::shutdown`).
pub use common::TestServer as Srv;

/// The `mlx-serve` binary on the fixture (`--decoder mlx` unless `extra` names one), its stderr
/// drained by a thread.
pub struct Bin {
    pub child: Child,
    pub addr: SocketAddr,
    pub stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Bin {
    pub fn start(extra: &[&str]) -> Bin {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mlx-serve"))
            .arg("--model")
            .arg(fixture())
            .args(["--port", "0", "--log-level", "warn"])
            // The exact path unless the test picks a decoder (as `common::TestServer`).
            .args(if extra.contains(&"--decoder") {
                &[][..]
            } else {
                &["--decoder", "mlx"][..]
            })
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let keep = text.clone();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stderr);
            let mut line = String::new();
            while r.read_line(&mut line).unwrap_or(0) > 0 {
                if let Some(a) = line.trim().strip_prefix("mlx serve: listening on http://") {
                    let _ = tx.send(a.parse::<SocketAddr>().unwrap());
                }
                keep.lock().unwrap().push_str(&line);
                line.clear();
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("mlx-serve did not start");
        Bin {
            child,
            addr,
            stderr: text,
        }
    }

    /// Sends a signal with the `kill` command.
    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{name} failed");
    }

    /// Waits for the exit (bounded); its status and how long it took.
    pub fn wait(&mut self, bound: Duration) -> Option<(std::process::ExitStatus, Duration)> {
        let t = Instant::now();
        while t.elapsed() < bound {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some((s, t.elapsed()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Bin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A connection that sent part of a request head and waits.
pub fn partial_head(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
        .unwrap();
    s
}

/// Whether the server closed `s` (end of stream or reset) within `bound`; whatever it sent
/// before is read and dropped.
pub fn closed_within(s: &mut TcpStream, bound: Duration) -> bool {
    let t = Instant::now();
    let mut buf = [0u8; 65536];
    while t.elapsed() < bound {
        let left = bound
            .saturating_sub(t.elapsed())
            .max(Duration::from_millis(1));
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return false
            }
            Err(_) => return true,
        }
    }
    false
}

/// Whether the server has closed `s` already (without waiting).
pub fn is_closed(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 1];
    let r = match (&*s).read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != ErrorKind::WouldBlock,
    };
    s.set_nonblocking(false).unwrap();
    r
}

/// A raw request; the connection, with the whole request written.
pub fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    s.write_all(&bytes).unwrap();
    s
}

/// A reply: status, head (lower case) and body (chunked framing removed).
pub struct Reply {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// Reads one whole reply to the end of the connection (send `Connection: close`), within
/// 30 s.
pub fn read_reply(s: TcpStream) -> Reply {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut raw = Vec::new();
    let _ = (&s).take(16 << 20).read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let head = head.to_ascii_lowercase();
    let body = if head.contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_string()
    };
    Reply { status, head, body }
}

fn dechunk(mut raw: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = raw.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        raw = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// One request on a fresh connection, closed after the reply.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let mut h = vec![("Connection", "close")];
    h.extend_from_slice(headers);
    read_reply(send(addr, method, path, &h, body))
}

pub fn host(addr: SocketAddr) -> String {
    addr.to_string()
}

/// `GET /health` as a client would send it.
pub fn health(addr: SocketAddr) -> Reply {
    request(addr, "GET", "/health", &[("Host", &host(addr))], b"")
}

/// A JSON POST as a client would send it.
pub fn post_json(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    request(
        addr,
        "POST",
        path,
        &[("Host", &host(addr)), ("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
}

/// Polls `/health` (bounded) until `done` holds on it; the last answer.
pub fn health_until(addr: SocketAddr, bound: Duration, done: impl Fn(&Value) -> bool) -> Value {
    let t = Instant::now();
    loop {
        let h = health(addr).json();
        if done(&h) || t.elapsed() > bound {
            return h;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// A streaming completion that never ends by itself (the end-of-text token barred), its
/// socket after the response head.
pub fn open_stream(
    addr: SocketAddr,
    max_tokens: usize,
    extra: &[(&str, Value)],
) -> BufReader<TcpStream> {
    let mut body = serde_json::json!({
        "prompt": "abc", "max_tokens": max_tokens, "stream": true, "logit_bias": {"2": -100},
    });
    for (k, v) in extra {
        body[*k] = v.clone();
    }
    let s = send(
        addr,
        "POST",
        "/v1/completions",
        &[("Host", &host(addr)), ("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    );
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.contains(" 200 "), "{line}");
    r
}

/// The next `data:` payload of a stream, `None` at its end.
pub fn next_data(r: &mut BufReader<TcpStream>) -> Option<String> {
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if let Some(d) = line.trim_end().strip_prefix("data: ") {
            return Some(d.to_string());
        }
    }
}

/// Reads a stream to its end; whether it ended with `[DONE]`.
pub fn drain(r: &mut BufReader<TcpStream>) -> bool {
    let mut last = None;
    while let Some(d) = next_data(r) {
        last = Some(d);
    }
    last.as_deref() == Some("[DONE]")
}

/// This process's resident memory in KiB (`VmRSS` of /proc/self/status).
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

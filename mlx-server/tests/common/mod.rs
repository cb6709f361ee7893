//! Starting a server on an ephemeral loopback port over the tiny fixture model, and a raw
//! HTTP/1.1 client.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::Value;

/// The tiny seeded llama with the character-level chat tokenizer (mlx-engine's fixture).
pub fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mlx-engine/tests/fixtures/tiny_chat")
}

/// A fixture of this crate (`cargo xtask goldens serve` writes them).
pub fn server_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// mlx_lm.server's responses and mlx-lm's embeddings (`cargo xtask goldens serve`).
pub fn serve_golden() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/goldens/serve.json");
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// mlx-lm's outputs for the fixture (`cargo xtask goldens batch`).
pub fn golden_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mlx-engine/tests/goldens/batch.json")
}

pub fn golden() -> Value {
    serde_json::from_slice(&std::fs::read(golden_path()).unwrap()).unwrap()
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    serve: mlx_server::ServeArgs,
}

pub struct TestServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// Sent to when the server thread has stopped serving.
    done: mpsc::Receiver<()>,
    thread: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Starts `mlx-serve --model <fixture> --port 0 <extra...>`, parsed as the CLI parses it.
    pub fn start(extra: &[&str]) -> TestServer {
        Self::start_model(&fixture(), extra)
    }

    /// Starts `mlx-serve --model <model> --port 0 <extra...>`, on the exact MLX path
    /// (`--decoder mlx`, whose replies the goldens of mlx_lm.server check) unless `extra`
    /// names a decoder.
    pub fn start_model(model: &Path, extra: &[&str]) -> TestServer {
        let mut argv = vec![
            "mlx-serve".to_string(),
            "--model".into(),
            model.display().to_string(),
            "--port".into(),
            "0".into(),
        ];
        if !extra.contains(&"--decoder") {
            argv.extend(["--decoder".into(), "mlx".into()]);
        }
        argv.extend(extra.iter().map(|s| s.to_string()));
        let args = Cli::parse_from(argv).serve;
        let (addr_tx, addr_rx) = mpsc::channel();
        let (done_tx, done) = mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let server = mlx_server::Server::bind(args, mlx_server::load_model_dir)
                    .await
                    .unwrap();
                addr_tx.send(server.addr).unwrap();
                server
                    .serve(async {
                        let _ = stop_rx.await;
                    })
                    .await
                    .unwrap();
            });
            let _ = done_tx.send(());
        });
        let addr = addr_rx.recv().expect("the server did not start");
        TestServer {
            addr,
            stop: Some(stop_tx),
            done,
            thread: Some(thread),
        }
    }

    /// The error `Server::bind` gives for `mlx-serve --model <model> --port 0 <extra...>`
    /// (panics if the server starts).
    pub fn bind_error(model: &Path, extra: &[&str]) -> mlx_server::ServeError {
        let mut argv = vec![
            "mlx-serve".to_string(),
            "--model".into(),
            model.display().to_string(),
            "--port".into(),
            "0".into(),
        ];
        argv.extend(extra.iter().map(|s| s.to_string()));
        let args = Cli::parse_from(argv).serve;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        match rt.block_on(mlx_server::Server::bind(args, mlx_server::load_model_dir)) {
            Ok(_) => panic!("the server started"),
            Err(e) => e,
        }
    }

    /// Triggers shutdown; how long the server took to stop serving, `None` past `bound`.
    pub fn shutdown(&mut self, bound: Duration) -> Option<Duration> {
        let t = Instant::now();
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.done.recv_timeout(bound).ok()?;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        Some(t.elapsed())
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        // A server that never stops (the bug the connection tests catch) is left behind, not
        // waited for.
        let _ = self.shutdown(Duration::from_secs(30));
    }
}

pub struct Reply {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

fn request_bytes(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Vec<u8> {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// One request on a fresh connection; the whole reply (chunked bodies decoded).
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&request_bytes(addr, method, path, headers, body))
        .unwrap();
    let mut r = BufReader::new(s);
    let (status, head) = read_head(&mut r);
    let mut raw = Vec::new();
    // The server may close early on a refused body; what was read is the reply.
    let _ = r.read_to_end(&mut raw);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(&raw)
    } else {
        raw
    };
    Reply {
        status,
        headers: head,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    http(addr, "POST", path, &[], body.to_string().as_bytes())
}

fn read_head(r: &mut impl BufRead) -> (u16, String) {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {head:?}"));
    (status, head)
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(nl) = raw.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size =
            usize::from_str_radix(std::str::from_utf8(&raw[..nl]).unwrap().trim(), 16).unwrap_or(0);
        if size == 0 || raw.len() < nl + 2 + size {
            return out;
        }
        out.extend_from_slice(&raw[nl + 2..nl + 2 + size]);
        raw = &raw[(nl + 4 + size).min(raw.len())..];
    }
}

/// A streaming request read event by event.
pub struct EventStream {
    pub status: u16,
    reader: BufReader<TcpStream>,
}

impl EventStream {
    pub fn open(addr: SocketAddr, path: &str, body: &Value) -> EventStream {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&request_bytes(
            addr,
            "POST",
            path,
            &[],
            body.to_string().as_bytes(),
        ))
        .unwrap();
        let mut reader = BufReader::new(s);
        let (status, _) = read_head(&mut reader);
        EventStream { status, reader }
    }

    /// The next `data:` payload (chunk framing skipped), `None` at the end of the stream.
    pub fn next_data(&mut self) -> Option<String> {
        loop {
            let mut line = String::new();
            if self.reader.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if let Some(d) = line.trim_end().strip_prefix("data: ") {
                return Some(d.to_string());
            }
        }
    }

    /// Every payload until `[DONE]` (included).
    pub fn all(mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(d) = self.next_data() {
            let done = d == "[DONE]";
            out.push(d);
            if done {
                break;
            }
        }
        out
    }
}

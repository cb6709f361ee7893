//! `cargo xtask bench serve`: aggregate decode throughput of `mlx serve` against
//! `mlx_lm.server` on the same model and machine, at 1, 4, 16 and 32 concurrent streaming
//! clients (`xtask/oracle/bench_serve_client.py` is the load generator; both servers are
//! greedy, EOS suppressed, the same prompt and length).
//!
//! The model is a directory with a tokenizer or a GGUF file (mlx_lm.server cannot load GGUF:
//! pass `--skip-mlx-lm`); the default is the tiny fixture (`mlx-engine/tests/fixtures/tiny_chat`),
//! where kernels cost next to nothing and the numbers measure the serving loop itself.
//! `--decoders auto,mlx` runs `mlx serve` once per `--decoder` (the CPU decoder, the exact MLX
//! path), with `--threads N` when given.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::bindings::workspace_root;
use crate::oracle;

struct Options {
    model: PathBuf,
    clients: String,
    max_tokens: usize,
    rounds: usize,
    max_batch: usize,
    skip_mlx_lm: bool,
    /// `--decoder` values, one run of `mlx serve` each.
    decoders: Vec<String>,
    threads: Option<usize>,
    /// A built `mlx-serve` to run instead of building the release one.
    bin: Option<PathBuf>,
    /// Also write the table (Markdown) here.
    out: Option<PathBuf>,
}

const USAGE: &str = "usage: cargo xtask bench serve [--model DIR|FILE.gguf] [--clients 1,4,16,32] \
                     [--max-tokens N] [--rounds R] [--max-batch B] [--decoders auto,mlx] \
                     [--threads N] [--bin MLX_SERVE] [--skip-mlx-lm] [--out FILE.md]";

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        model: workspace_root().join("mlx-engine/tests/fixtures/tiny_chat"),
        clients: "1,4,16,32".into(),
        max_tokens: 64,
        rounds: 2,
        max_batch: 32,
        skip_mlx_lm: false,
        decoders: vec!["auto".into()],
        threads: None,
        bin: None,
        out: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{a} needs a value\n{USAGE}"))
        };
        let num = |v: String| v.parse::<usize>().map_err(|e| format!("{a} {v}: {e}"));
        match a.as_str() {
            "--model" => o.model = PathBuf::from(val()?),
            "--clients" => o.clients = val()?,
            "--max-tokens" => o.max_tokens = num(val()?)?,
            "--rounds" => o.rounds = num(val()?)?,
            "--max-batch" => o.max_batch = num(val()?)?,
            "--skip-mlx-lm" => o.skip_mlx_lm = true,
            "--decoders" => {
                o.decoders = val()?.split(',').map(str::to_string).collect();
                if let Some(d) = o
                    .decoders
                    .iter()
                    .find(|d| !matches!(d.as_str(), "auto" | "mlx" | "cpu"))
                {
                    return Err(format!(
                        "--decoders: {d:?} is not auto, mlx or cpu\n{USAGE}"
                    ));
                }
            }
            "--threads" => o.threads = Some(num(val()?)?),
            "--bin" => o.bin = Some(PathBuf::from(val()?)),
            "--out" => o.out = Some(PathBuf::from(val()?)),
            "--help" | "-h" => return Err(USAGE.into()),
            other => return Err(format!("unknown option {other}\n{USAGE}")),
        }
    }
    Ok(o)
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// Kills the server when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until `GET path` answers 200 (the server loaded its model).
fn wait_ready(port: u16, path: &str, server: &mut Server) -> Result<(), String> {
    use std::io::{Read, Write};
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(600) {
        if let Ok(Some(status)) = server.0.try_wait() {
            return Err(format!("the server exited ({status}) before it was ready"));
        }
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            let _ = write!(
                s,
                "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
            );
            let mut buf = String::new();
            let _ = s.read_to_string(&mut buf);
            if buf.starts_with("HTTP/1.1 200") || buf.starts_with("HTTP/1.0 200") {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err("the server did not become ready in 600 s".into())
}

/// `/proc/loadavg`'s first three figures (the machine is shared: the figures depend on them).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

/// The `decoder` field of the server's `/health`.
fn health_decoder(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(
        s,
        "GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let body = &buf[buf.find("\r\n\r\n")? + 4..];
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    v["decoder"].as_str().map(str::to_string)
}

fn load(py: &Path, port: u16, o: &Options) -> Result<Vec<Value>, String> {
    let script = workspace_root().join("xtask/oracle/bench_serve_client.py");
    let out = Command::new(py)
        .arg(script)
        .arg(format!("http://127.0.0.1:{port}"))
        .args(["--clients", &o.clients])
        .args(["--max-tokens", &o.max_tokens.to_string()])
        .args(["--rounds", &o.rounds.to_string()])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running the load generator: {e}"))?;
    if !out.status.success() {
        return Err(format!("the load generator failed ({})", out.status));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).map_err(|e| format!("{l}: {e}")))
        .collect()
}

pub fn run(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    let py = oracle::ensure()?;
    let bin = match &o.bin {
        Some(b) => b.clone(),
        None => {
            let status = Command::new("cargo")
                .args([
                    "build",
                    "--release",
                    "-p",
                    "mlx-server",
                    "--bin",
                    "mlx-serve",
                ])
                .current_dir(workspace_root())
                .status()
                .map_err(|e| format!("cargo build: {e}"))?;
            if !status.success() {
                return Err("building mlx-serve failed".into());
            }
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| workspace_root().join("target"));
            target.join("release/mlx-serve")
        }
    };
    let model = o.model.display().to_string();
    let load_before = load_average();

    let mut ours = Vec::new();
    for decoder in &o.decoders {
        let port = free_port()?;
        let mut cmd = Command::new(&bin);
        cmd.args(["--model", &model, "--port", &port.to_string()])
            .args([
                "--max-batch",
                &o.max_batch.to_string(),
                "--queue-size",
                "256",
            ])
            .args(["--decoder", decoder])
            .args(["--log-level", "warn"]);
        if let Some(t) = o.threads {
            cmd.args(["--threads", &t.to_string()]);
        }
        let mut server = Server(
            cmd.spawn()
                .map_err(|e| format!("starting {}: {e}", bin.display()))?,
        );
        wait_ready(port, "/health", &mut server)?;
        let which = health_decoder(port).unwrap_or_default();
        eprintln!("bench serve: mlx serve --decoder {decoder} ({which}) on port {port}");
        ours.push((decoder.clone(), which, load(&py, port, &o)?));
    }
    let ours_rows = ours.first().map(|x| x.2.clone()).unwrap_or_default();

    let theirs_rows = if o.skip_mlx_lm {
        Vec::new()
    } else {
        let port = free_port()?;
        let mut theirs = Server(
            Command::new(&py)
                .args(["-m", "mlx_lm", "server", "--model", &model])
                .args(["--port", &port.to_string()])
                .args(["--decode-concurrency", &o.max_batch.to_string()])
                .args(["--log-level", "WARNING"])
                .spawn()
                .map_err(|e| format!("starting mlx_lm.server: {e}"))?,
        );
        wait_ready(port, "/health", &mut theirs)?;
        eprintln!("bench serve: mlx_lm.server on port {port}");
        load(&py, port, &o)?
    };

    let load_after = load_average();
    let mut lines = vec![
        format!(
            "model `{}`; {} tokens per request, {} rounds per client, `--max-batch {}`{}; \
             aggregate generated tokens/s over all clients (streaming, greedy, EOS suppressed); \
             load average {} before, {} after",
            model,
            o.max_tokens,
            o.rounds,
            o.max_batch,
            o.threads
                .map_or(String::new(), |t| format!(", `--threads {t}`")),
            load_before,
            load_after
        ),
        String::new(),
    ];
    if ours.len() > 1 {
        lines.push(
            "| clients | ".to_string()
                + &ours
                    .iter()
                    .map(|(d, w, _)| format!("`--decoder {d}` ({w}) tok/s"))
                    .collect::<Vec<_>>()
                    .join(" | ")
                + " | errors |",
        );
        lines.push(format!("|---:|{}---:|", "---:|".repeat(ours.len())));
        for (i, r) in ours_rows.iter().enumerate() {
            let cells: Vec<String> = ours
                .iter()
                .map(|(_, _, rows)| {
                    rows.get(i)
                        .and_then(|x| x["tokens_per_s"].as_f64())
                        .map_or("-".into(), |t| format!("{t:.1}"))
                })
                .collect();
            let errors: u64 = ours
                .iter()
                .filter_map(|(_, _, rows)| rows.get(i).and_then(|x| x["errors"].as_u64()))
                .sum();
            lines.push(format!(
                "| {} | {} | {errors} |",
                r["clients"],
                cells.join(" | ")
            ));
        }
        lines.push(String::new());
        for (d, _, rows) in &ours {
            let one = rows.first().and_then(|r| r["tokens_per_s"].as_f64());
            for r in rows.iter().skip(1) {
                if let (Some(one), Some(t)) = (one, r["tokens_per_s"].as_f64()) {
                    lines.push(format!(
                        "- `--decoder {d}`: {} clients = {:.2}x one client",
                        r["clients"],
                        t / one
                    ));
                }
            }
        }
        lines.push(String::new());
    }
    lines.extend([
        "| clients | mlx serve tok/s | mlx_lm.server tok/s | ratio | errors (ours / mlx_lm) |"
            .into(),
        "|---:|---:|---:|---:|---:|".into(),
    ]);
    let single = ours_rows
        .first()
        .and_then(|r| r["tokens_per_s"].as_f64())
        .unwrap_or(0.0);
    for (i, r) in ours_rows.iter().enumerate() {
        let ours_tps = r["tokens_per_s"].as_f64().unwrap_or(0.0);
        let theirs = theirs_rows.get(i);
        let theirs_tps = theirs.and_then(|t| t["tokens_per_s"].as_f64());
        for (who, row) in [("mlx serve", Some(r)), ("mlx_lm.server", theirs)] {
            if let Some(e) = row.and_then(|x| x["first_error"].as_str()) {
                eprintln!("bench serve: {who} at {} clients: {e}", r["clients"]);
            }
        }
        lines.push(format!(
            "| {} | {:.1} | {} | {} | {} / {} |",
            r["clients"],
            ours_tps,
            theirs_tps.map_or("-".into(), |t| format!("{t:.1}")),
            theirs_tps.map_or("-".into(), |t| format!("{:.2}", ours_tps / t)),
            r["errors"].as_u64().unwrap_or(0),
            theirs.and_then(|t| t["errors"].as_u64()).unwrap_or(0),
        ));
    }
    if single > 0.0 {
        if let Some(r16) = ours_rows.iter().find(|r| r["clients"] == 16) {
            let x = r16["tokens_per_s"].as_f64().unwrap_or(0.0) / single;
            lines.push(String::new());
            lines.push(format!(
                "mlx serve at 16 clients = {x:.2}x mlx serve at 1 client (target >= 4x)"
            ));
        }
    }
    let table = lines.join("\n") + "\n";
    print!("{table}");
    if let Some(path) = &o.out {
        std::fs::write(path, format!("# `cargo xtask bench serve`\n\n{table}"))
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        eprintln!("bench serve: wrote {}", path.display());
    }
    Ok(())
}

//! The chat page at `/`, driven by headless Chromium over the DevTools protocol: the page's
//! self-test (`/?selftest=TEXT`) sends TEXT through `fetch` and its SSE reader and records
//! the outcome in `<body data-selftest>`, which the test polls; then a screenshot, whose path
//! is printed. Skipped (with the reason printed) when `chromium` is not installed.

use crate::common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{http, TestServer};
use serde_json::{json, Value};

fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// Headless Chromium driven over the DevTools protocol on `--remote-debugging-pipe` (file
/// descriptors 3 and 4, given to it through two named pipes by `sh`): NUL-terminated JSON
/// messages.
struct Browser {
    child: std::process::Child,
    to: std::fs::File,
    from: std::io::BufReader<std::fs::File>,
    next_id: u64,
    dir: PathBuf,
    /// Tells the watchdog the browser is gone (so it never kills a reused process id).
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Browser {
    fn start(bin: &std::path::Path) -> Browser {
        let dir = tempdir("chromium");
        let (fifo_in, fifo_out) = (dir.join("in"), dir.join("out"));
        for f in [&fifo_in, &fifo_out] {
            let ok = Command::new("mkfifo")
                .arg(f)
                .status()
                .expect("mkfifo")
                .success();
            assert!(ok, "mkfifo {}", f.display());
        }
        let script = format!(
            "exec \"$0\" --headless --no-sandbox --disable-gpu \
             --disable-background-networking --disable-component-update --disable-sync \
             --no-first-run --window-size=900,600 --user-data-dir='{profile}' \
             --remote-debugging-pipe about:blank 3<'{i}' 4>'{o}'",
            profile = dir.join("profile").display(),
            i = fifo_in.display(),
            o = fifo_out.display(),
        );
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg(bin)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting chromium");
        // A watchdog: a browser that hangs is killed after 120 s (its pipe then closes and
        // the test fails instead of waiting forever).
        let pid = child.id().to_string();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watch = done.clone();
        std::thread::spawn(move || {
            let until = std::time::Instant::now() + Duration::from_secs(120);
            while std::time::Instant::now() < until {
                if watch.load(std::sync::atomic::Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = Command::new("kill").arg("-9").arg(&pid).status();
        });
        // The order `sh` opens them in: its fd 3 (our writing end) first.
        let to = std::fs::OpenOptions::new()
            .write(true)
            .open(&fifo_in)
            .unwrap();
        let from = std::io::BufReader::new(std::fs::File::open(&fifo_out).unwrap());
        Browser {
            child,
            to,
            from,
            next_id: 0,
            dir,
            done,
        }
    }

    /// Sends a command (to a page's session when given) and waits for its result.
    fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        use std::io::{BufRead, Write};
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = msg.to_string().into_bytes();
        bytes.push(0);
        self.to.write_all(&bytes).unwrap();
        loop {
            let mut buf = Vec::new();
            let n = self.from.read_until(0, &mut buf).unwrap();
            assert!(n > 0, "chromium closed the pipe during {method}");
            buf.pop();
            let v: Value = serde_json::from_slice(&buf).unwrap();
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.done.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Standard base64 (the screenshot's PNG).
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let bytes: Vec<u8> = s
        .bytes()
        .filter(|&c| c != b'=' && !c.is_ascii_whitespace())
        .collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= u32::from(val(c)) << (18 - 6 * i);
        }
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

fn tempdir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn the_chat_page_is_one_static_file_without_external_resources() {
    let s = TestServer::start(&[]);
    let r = http(s.addr, "GET", "/", &[], b"");
    assert_eq!(r.status, 200);
    assert!(r
        .headers
        .to_ascii_lowercase()
        .contains("content-type: text/html"));
    let page = &r.body;
    for needle in [
        "fetch(",
        "/v1/chat/completions",
        "getReader",
        "AbortController",
    ] {
        assert!(page.contains(needle), "{needle}");
    }
    // Nothing loaded from elsewhere.
    for bad in ["src=\"http", "href=\"http", "@import", "<link "] {
        assert!(!page.contains(bad), "{bad}");
    }
}

#[test]
fn headless_chromium_streams_a_reply_through_the_chat_page() {
    let Some(bin) = chromium() else {
        eprintln!(
            "SKIPPED: chromium not found at /usr/bin/chromium (apt-get install -y chromium, or \
             set CHROMIUM=PATH)"
        );
        return;
    };
    let s = TestServer::start(&[]);
    let url = format!("{}/?selftest=Hi%20there!&max_tokens=24", s.url());
    let mut b = Browser::start(&bin);
    let target = b.call(None, "Target.createTarget", json!({"url": url}));
    let attached = b.call(
        None,
        "Target.attachToTarget",
        json!({"targetId": target["targetId"], "flatten": true}),
    );
    let session = attached["sessionId"].as_str().unwrap().to_string();
    let eval = |b: &mut Browser, expr: &str| -> Value {
        b.call(
            Some(&session),
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true}),
        )["result"]["value"]
            .clone()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let outcome = loop {
        let v = eval(
            &mut b,
            "document.body ? (document.body.dataset.selftest || '') : ''",
        );
        let v = v.as_str().unwrap_or("").to_string();
        if !v.is_empty() {
            break v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the page's self-test did not finish in 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let user = eval(&mut b, "document.querySelector('.msg.user').textContent");
    let reply = eval(
        &mut b,
        "document.querySelector('.msg.assistant span').textContent",
    );
    assert!(outcome.starts_with("ok chunks="), "self-test: {outcome}");
    let chunks: usize = outcome["ok chunks=".len()..].parse().unwrap();
    assert!(chunks > 1, "the reply arrived in {chunks} chunk(s)");
    assert_eq!(user, "Hi there!");
    // The fixture's greedy reply to this message, as mlx-lm makes it.
    let golden = common::golden();
    let case = golden["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            c["kind"] == "chat"
                && c["messages"] == json!([{"role": "user", "content": "Hi there!"}])
        })
        .unwrap()
        .clone();
    assert_eq!(reply, case["text"]);
    eprintln!("chat page: {outcome}, reply {reply}");

    let shot = b.call(
        Some(&session),
        "Page.captureScreenshot",
        json!({"format": "png"}),
    );
    let png = base64_decode(shot["data"].as_str().unwrap());
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chat_page.png");
    std::fs::write(&path, &png).unwrap();
    println!("chat page screenshot: {}", path.display());
    eprintln!("chat page screenshot: {}", path.display());
    let _ = b.call(None, "Browser.close", json!({}));
}

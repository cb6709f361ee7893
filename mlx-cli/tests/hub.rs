//! Models by name (`--model ORG/NAME[@REVISION]`) against a local HTTP server that answers the
//! Hub's endpoints as huggingface.co does (there is no internet here): the revision API, `HEAD`
//! and `GET` on `resolve/<commit>/<file>` (LFS files redirected to a CDN path with
//! `X-Linked-Etag`/`X-Linked-Size`, the others answered with their git blob sha1 as `ETag`),
//! `Range` requests. The cache must come out in huggingface_hub's layout, so Python tools
//! share it.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const REPO: &str = "test-org/tiny-chat";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mlx-engine/tests/fixtures/tiny_chat")
}

struct HubFile {
    name: String,
    body: Vec<u8>,
    lfs: bool,
}

impl HubFile {
    fn etag(&self) -> String {
        if self.lfs {
            format!("{:x}", Sha256::digest(&self.body))
        } else {
            let mut h = sha1_smol::Sha1::new();
            h.update(format!("blob {}\0", self.body.len()).as_bytes());
            h.update(&self.body);
            h.digest().to_string()
        }
    }
}

#[derive(Default)]
struct Behaviour {
    /// Break the next LFS download after half its bytes.
    break_once: AtomicBool,
    /// Serve wrong bytes for LFS files.
    corrupt: AtomicBool,
}

struct FakeHub {
    addr: String,
    behaviour: Arc<Behaviour>,
    /// Request lines (and `Range` headers) seen.
    log: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    api_calls: Arc<AtomicUsize>,
}

impl FakeHub {
    fn start() -> FakeHub {
        let mut files = Vec::new();
        for name in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
            files.push(HubFile {
                name: name.into(),
                body: std::fs::read(fixture().join(name)).unwrap(),
                lfs: false,
            });
        }
        files.push(HubFile {
            name: "model.safetensors".into(),
            body: std::fs::read(fixture().join("model.safetensors")).unwrap(),
            lfs: true,
        });
        // Not wanted by a load: never fetched.
        files.push(HubFile {
            name: "modeling_custom.py".into(),
            body: b"raise SystemExit".to_vec(),
            lfs: false,
        });
        let files: Arc<HashMap<String, HubFile>> =
            Arc::new(files.into_iter().map(|f| (f.name.clone(), f)).collect());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        let hub = FakeHub {
            addr,
            behaviour: Arc::default(),
            log: Arc::default(),
            stop: Arc::default(),
            api_calls: Arc::default(),
        };
        let (b, log, stop, api) = (
            hub.behaviour.clone(),
            hub.log.clone(),
            hub.stop.clone(),
            hub.api_calls.clone(),
        );
        std::thread::spawn(move || {
            // Bounded: the server lives at most as long as the test binary, and at most 5 min.
            let deadline = std::time::Instant::now() + Duration::from_secs(300);
            while !stop.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
                match listener.accept() {
                    Ok((s, _)) => {
                        let (files, b, log, api) =
                            (files.clone(), b.clone(), log.clone(), api.clone());
                        std::thread::spawn(move || {
                            let _ = serve(s, &files, &b, &log, &api);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        hub
    }

    fn saw(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn serve(
    stream: TcpStream,
    files: &HashMap<String, HubFile>,
    b: &Behaviour,
    log: &Mutex<Vec<String>>,
    api: &AtomicUsize,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut headers = HashMap::new();
        loop {
            let mut h = String::new();
            reader.read_line(&mut h)?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
        let mut parts = line.split_whitespace();
        let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let mut entry = format!("{method} {path}");
        if let Some(r) = headers.get("range") {
            entry += &format!(" range={r}");
        }
        log.lock().unwrap().push(entry);
        let head = method == "HEAD";
        let respond =
            |out: &mut TcpStream, status: &str, hdrs: &[(String, String)], body: &[u8]| {
                let mut s = format!("HTTP/1.1 {status}\r\n");
                for (k, v) in hdrs {
                    s += &format!("{k}: {v}\r\n");
                }
                s += &format!("Content-Length: {}\r\n\r\n", body.len());
                out.write_all(s.as_bytes())?;
                if !head {
                    out.write_all(body)?;
                }
                out.flush()
            };
        let api_path = format!("/api/models/{REPO}/revision/main");
        let resolve = format!("/{REPO}/resolve/{COMMIT}/");
        if path == api_path {
            api.fetch_add(1, Ordering::SeqCst);
            let mut names: Vec<&String> = files.keys().collect();
            names.sort();
            let siblings: Vec<serde_json::Value> = names
                .iter()
                .map(|n| serde_json::json!({"rfilename": n}))
                .collect();
            let body = serde_json::json!({"id": REPO, "sha": COMMIT, "siblings": siblings});
            respond(
                &mut out,
                "200 OK",
                &[("Content-Type".into(), "application/json".into())],
                body.to_string().as_bytes(),
            )?;
        } else if let Some(name) = path.strip_prefix(&resolve) {
            let Some(f) = files.get(name) else {
                respond(&mut out, "404 Not Found", &[], b"Entry not found")?;
                continue;
            };
            let etag = f.etag();
            if f.lfs {
                respond(
                    &mut out,
                    "302 Found",
                    &[
                        ("Location".into(), format!("/cdn/{etag}")),
                        ("X-Linked-Etag".into(), format!("\"{etag}\"")),
                        ("X-Linked-Size".into(), f.body.len().to_string()),
                        ("X-Repo-Commit".into(), COMMIT.into()),
                    ],
                    b"",
                )?;
            } else {
                respond(
                    &mut out,
                    "200 OK",
                    &[
                        ("ETag".into(), format!("\"{etag}\"")),
                        ("X-Repo-Commit".into(), COMMIT.into()),
                    ],
                    &f.body,
                )?;
            }
        } else if let Some(etag) = path.strip_prefix("/cdn/") {
            let Some(f) = files.values().find(|f| f.lfs && f.etag() == etag) else {
                respond(&mut out, "404 Not Found", &[], b"")?;
                continue;
            };
            let mut body = f.body.clone();
            if b.corrupt.load(Ordering::SeqCst) {
                let n = body.len();
                body[n / 2] ^= 0xff;
            }
            let start: usize = headers
                .get("range")
                .and_then(|r| r.strip_prefix("bytes="))
                .and_then(|r| r.trim_end_matches('-').parse().ok())
                .unwrap_or(0);
            if start > 0 {
                let rest = &body[start.min(body.len())..];
                let range = format!("bytes {start}-{}/{}", body.len() - 1, body.len());
                respond(
                    &mut out,
                    "206 Partial Content",
                    &[("Content-Range".into(), range)],
                    rest,
                )?;
            } else if !head && b.break_once.swap(false, Ordering::SeqCst) {
                // Announce the whole file, send half, and drop the connection.
                let s = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
                out.write_all(s.as_bytes())?;
                out.write_all(&body[..body.len() / 2])?;
                out.flush()?;
                return Ok(());
            } else {
                respond(&mut out, "200 OK", &[], &body)?;
            }
        } else {
            respond(&mut out, "404 Not Found", &[], b"")?;
        }
        if headers
            .get("connection")
            .is_some_and(|c| c.eq_ignore_ascii_case("close"))
        {
            return Ok(());
        }
    }
}

fn mlx(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mlx"));
    c.args(args);
    for k in [
        "HF_HUB_OFFLINE",
        "HF_TOKEN",
        "HF_HOME",
        "HF_ENDPOINT",
        "HF_HUB_CACHE",
    ] {
        c.env_remove(k);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn generate_args() -> Vec<&'static str> {
    vec![
        "generate",
        "--model",
        REPO,
        "--prompt",
        "hello",
        "-m",
        "4",
        "--verbose",
        "false",
        "--dtype",
        "stored",
    ]
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mlx-hub-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_model_by_name_is_downloaded_into_the_hugging_face_cache_then_used_offline() {
    let hub = FakeHub::start();
    let cache = temp_dir("download");
    let cache_s = cache.to_str().unwrap();
    let env = [
        ("HF_ENDPOINT", hub.addr.as_str()),
        ("HF_HUB_CACHE", cache_s),
    ];

    // The same reply as the fixture's directory gives.
    let direct = mlx(
        &[
            "generate",
            "--model",
            fixture().to_str().unwrap(),
            "--prompt",
            "hello",
            "-m",
            "4",
            "--verbose",
            "false",
            "--dtype",
            "stored",
        ],
        &[],
    );
    assert!(direct.status.success(), "{}", text(&direct));
    let by_name = mlx(&generate_args(), &env);
    assert!(by_name.status.success(), "{}", text(&by_name));
    assert_eq!(by_name.stdout, direct.stdout);

    // huggingface_hub's layout: refs/main -> commit, snapshot links into blobs named by etag.
    let repo_dir = cache.join("models--test-org--tiny-chat");
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(),
        COMMIT
    );
    let snap = repo_dir.join("snapshots").join(COMMIT);
    for name in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
    ] {
        let link = std::fs::read_link(snap.join(name)).unwrap();
        assert!(link.starts_with("../../blobs"), "{name}: {link:?}");
        assert_eq!(
            std::fs::read(snap.join(name)).unwrap(),
            std::fs::read(fixture().join(name)).unwrap(),
            "{name}"
        );
    }
    assert!(
        !snap.join("modeling_custom.py").exists(),
        "code is never fetched"
    );
    assert!(!hub.saw("modeling_custom.py"));

    // Offline, with the server gone: the cache answers.
    drop(hub);
    let offline = mlx(
        &generate_args(),
        &[("HF_HUB_CACHE", cache_s), ("HF_HUB_OFFLINE", "1")],
    );
    assert!(offline.status.success(), "{}", text(&offline));
    assert_eq!(offline.stdout, direct.stdout);

    // `mlx manage` lists it and deletes it.
    let scan = mlx(
        &["manage", "--scan", "--pattern", "tiny"],
        &[("HF_HUB_CACHE", cache_s)],
    );
    assert!(scan.status.success(), "{}", text(&scan));
    let listing = String::from_utf8_lossy(&scan.stdout);
    assert!(listing.contains("test-org/tiny-chat"), "{listing}");
    assert!(listing.contains("REPO ID"), "{listing}");
    let del = mlx(
        &["manage", "--delete", "--pattern", "tiny", "--yes"],
        &[("HF_HUB_CACHE", cache_s)],
    );
    assert!(del.status.success(), "{}", text(&del));
    assert!(!repo_dir.exists());
    let _ = std::fs::remove_dir_all(&cache);
}

#[test]
fn an_interrupted_download_resumes_and_a_corrupt_one_is_refused() {
    let hub = FakeHub::start();
    let cache = temp_dir("resume");
    let cache_s = cache.to_str().unwrap();
    let env = [
        ("HF_ENDPOINT", hub.addr.as_str()),
        ("HF_HUB_CACHE", cache_s),
    ];

    hub.behaviour.break_once.store(true, Ordering::SeqCst);
    let first = mlx(&generate_args(), &env);
    assert!(!first.status.success(), "{}", text(&first));
    let err = String::from_utf8_lossy(&first.stderr);
    assert!(err.contains("resume"), "{err}");
    let blobs = cache.join("models--test-org--tiny-chat/blobs");
    let partial: Vec<_> = std::fs::read_dir(&blobs)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".incomplete"))
        .collect();
    assert_eq!(partial.len(), 1, "one partial blob kept for resuming");
    let half = partial[0].metadata().unwrap().len();
    assert!(half > 0);

    let second = mlx(&generate_args(), &env);
    assert!(second.status.success(), "{}", text(&second));
    assert!(
        hub.saw(&format!("range=bytes={half}-")),
        "resumed with a Range request: {:?}",
        hub.log.lock().unwrap()
    );

    // Corrupt bytes under a known etag: refused, nothing kept.
    let cache2 = temp_dir("corrupt");
    let cache2_s = cache2.to_str().unwrap();
    hub.behaviour.corrupt.store(true, Ordering::SeqCst);
    let bad = mlx(
        &generate_args(),
        &[
            ("HF_ENDPOINT", hub.addr.as_str()),
            ("HF_HUB_CACHE", cache2_s),
        ],
    );
    assert!(!bad.status.success(), "{}", text(&bad));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("does not match"), "{err}");
    let blobs2 = cache2.join("models--test-org--tiny-chat/blobs");
    let left: Vec<_> = std::fs::read_dir(&blobs2)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.len() == 64 || n.ends_with(".incomplete"))
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // Offline and not cached: a clear error naming the cache.
    let cache3 = temp_dir("offline");
    let off = mlx(
        &generate_args(),
        &[
            ("HF_HUB_CACHE", cache3.to_str().unwrap()),
            ("HF_HUB_OFFLINE", "1"),
        ],
    );
    assert!(!off.status.success());
    let err = String::from_utf8_lossy(&off.stderr);
    assert!(
        err.contains("HF_HUB_OFFLINE") && err.contains("test-org/tiny-chat"),
        "{err}"
    );

    // A missing repository: the Hub's 404 with a hint.
    let missing = mlx(
        &[
            "generate",
            "--model",
            "test-org/nothing-here",
            "--prompt",
            "hi",
        ],
        &[
            ("HF_ENDPOINT", hub.addr.as_str()),
            ("HF_HUB_CACHE", cache3.to_str().unwrap()),
        ],
    );
    assert!(!missing.status.success());
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("404"), "{err}");
    for d in [cache, cache2, cache3] {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn names_and_missing_paths_are_told_apart() {
    let o = mlx(
        &["generate", "--model", "./no/such/dir", "--prompt", "hi"],
        &[],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not found"), "{err}");
    let o = mlx(
        &["generate", "--model", "bad--name/x", "--prompt", "hi"],
        &[],
    );
    assert!(!o.status.success());
}

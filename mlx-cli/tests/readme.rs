//! The README's commands, run as written: the main job (the default model, fetched on first
//! use) and every example of "One example per subcommand", with `mlx` the built binary, `DIR`
//! a tiny model directory and `DIR2` a tiny dataset. A flag renamed in the code and not in the
//! README (or the reverse) fails here.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The shell commands of the ```sh blocks of the section under `heading` (to the next `## `),
/// comment lines dropped and backslash continuations joined.
fn commands_under(readme: &str, heading: &str) -> Vec<String> {
    let from = readme
        .find(heading)
        .unwrap_or_else(|| panic!("README has no {heading:?} section"));
    let mut section = &readme[from + heading.len()..];
    if let Some(end) = section.find("\n## ") {
        section = &section[..end];
    }
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut rest = section;
    while let Some(start) = rest.find("```sh\n") {
        let body = &rest[start + "```sh\n".len()..];
        let end = body.find("```").expect("the block's end");
        for line in body[..end].lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(head) = line.strip_suffix('\\') {
                cur.push_str(head);
                continue;
            }
            cur.push_str(line);
            out.push(std::mem::take(&mut cur));
        }
        rest = &body[end + 3..];
    }
    out
}

/// Replaces whole-word `from` with `to` (so `DIR` does not touch `DIR2`).
fn replace_word(s: &str, from: &str, to: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find(from) {
        let before_ok = i == 0
            || !rest[..i]
                .chars()
                .last()
                .is_some_and(|c| c.is_alphanumeric() || c == '_');
        let after = &rest[i + from.len()..];
        let after_ok = !after
            .chars()
            .next()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        out.push_str(&rest[..i]);
        out.push_str(if before_ok && after_ok { to } else { from });
        rest = after;
    }
    out.push_str(rest);
    out
}

fn sh(cmd: &str, cwd: &Path, stdin: &str) -> (bool, String, String) {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sh");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_healthy(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            let _ = write!(
                s,
                "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            );
            let mut buf = String::new();
            let _ = std::io::Read::read_to_string(&mut s, &mut buf);
            if buf.starts_with("HTTP/1.1 200") {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the README's server did not come up on port {port}");
}

/// The tiny llama fixture grown to 16 layers (each a copy of its layer 0), the layer count
/// `mlx train` adapts by default, as mlx_lm.lora does.
fn sixteen_layers(src: &Path, dst: &Path) -> PathBuf {
    std::fs::create_dir_all(dst).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dst.join(f)).unwrap();
    }
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config["num_hidden_layers"] = 16.into();
    std::fs::write(dst.join("config.json"), config.to_string()).unwrap();
    let (weights, meta) =
        mlx_core::io::load_safetensors(src.join("model.safetensors"), None).unwrap();
    let mut out: Vec<(String, mlx_core::Array)> = Vec::new();
    for (name, a) in weights.iter() {
        match name.strip_prefix("model.layers.0.") {
            Some(rest) => {
                for l in 0..16 {
                    out.push((format!("model.layers.{l}.{rest}"), a.clone()));
                }
            }
            None if name.starts_with("model.layers.") => {}
            None => out.push((name.clone(), a.clone())),
        }
    }
    mlx_core::io::save_safetensors(
        dst.join("model.safetensors"),
        out.iter().map(|(n, a)| (n.as_str(), a)),
        &meta,
    )
    .unwrap();
    dst.to_path_buf()
}

#[test]
fn every_readme_example_runs() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let bin = env!("CARGO_BIN_EXE_mlx");
    let cwd = std::env::temp_dir().join(format!("mlx-readme-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cwd);
    std::fs::create_dir_all(&cwd).unwrap();
    let dir = sixteen_layers(
        &root().join("mlx-cli/tests/models/dense_f32"),
        &cwd.join("model"),
    );
    let data = root().join("mlx-train/tests/data/text");
    std::fs::write(
        cwd.join("long_document.txt"),
        "A long document, in short. It has two sentences.\n",
    )
    .unwrap();

    let examples = commands_under(&readme, "## One example per subcommand");
    assert!(examples.len() >= 10, "{examples:?}");
    let mut server: Option<(Server, u16)> = None;
    let mut ran = Vec::new();
    for ex in &examples {
        let mut cmd = replace_word(ex, "DIR2", &data.display().to_string());
        cmd = replace_word(&cmd, "DIR", &dir.display().to_string());
        if let Some(rest) = cmd.strip_prefix("mlx ") {
            cmd = format!("{bin} {rest}");
        }
        if ex.starts_with("mlx serve") {
            let port = free_port();
            let cmd = cmd.replace("8080", &port.to_string());
            let child = Command::new("sh")
                .arg("-c")
                .arg(format!("exec {cmd}"))
                .current_dir(&cwd)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("serve");
            let s = Server(child);
            wait_healthy(port);
            server = Some((s, port));
            ran.push(ex.clone());
            continue;
        }
        if ex.starts_with("curl ") {
            let Some((_, port)) = &server else {
                panic!("a curl example before any `mlx serve`: {ex}");
            };
            if Command::new("curl").arg("--version").output().is_err() {
                eprintln!("skipping (no curl on this machine): {ex}");
                continue;
            }
            let cmd = cmd.replace("8080", &port.to_string());
            let (ok, out, err) = sh(&cmd, &cwd, "");
            assert!(ok && out.contains("\"choices\""), "{ex}\n{out}\n{err}");
            ran.push(ex.clone());
            continue;
        }
        assert!(
            ex.starts_with("mlx "),
            "a README example that is not an `mlx` command: {ex}"
        );
        // The chat's interactive loop: one turn, then q.
        let stdin = if ex.starts_with("mlx chat") {
            "Hello\nq\n"
        } else {
            ""
        };
        let (ok, out, err) = sh(&cmd, &cwd, stdin);
        assert!(
            ok,
            "README example failed: {ex}\nstdout: {out}\nstderr: {err}"
        );
        ran.push(ex.clone());
    }
    drop(server);
    for sub in [
        "generate",
        "chat",
        "cache-prompt",
        "serve",
        "train",
        "fuse",
        "embed",
        "info",
        "models",
    ] {
        assert!(
            ran.iter()
                .any(|c| c.starts_with(&format!("mlx {sub} ")) || c == &format!("mlx {sub}")),
            "the README has no example of `mlx {sub}` that ran"
        );
    }

    // The main job, as the README's first command runs it (without `cargo run`): the default
    // model, fetched on first use.
    let main_job = commands_under(&readme, "## The two commands");
    let gen = main_job
        .iter()
        .find(|c| c.contains("-- generate"))
        .expect("the main job's command");
    let args = gen
        .split_once("-- ")
        .expect("`cargo run ... -- ARGS`")
        .1
        .to_string();
    let (ok, out, err) = sh(&format!("{bin} {args}"), &cwd, "");
    assert!(
        ok && out.contains("Paris"),
        "{gen}\nstdout: {out}\nstderr: {err}"
    );
    assert!(
        main_job.iter().any(|c| c == "cargo test --workspace"),
        "the README's test command is what .ci/run runs"
    );
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    assert!(ci.lines().any(|l| l.trim() == "cargo test --workspace"));
    let _ = std::fs::remove_dir_all(&cwd);
}

/// What a `.gguf` loads, as the README and `--help` say it, is what the loader maps.
#[test]
fn readme_and_help_name_every_gguf_architecture() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let help = Command::new(env!("CARGO_BIN_EXE_mlx"))
        .args(["generate", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout).replace(char::is_whitespace, " ");
    let readme = readme.replace(char::is_whitespace, " ");
    for arch in mlx_models::gguf::supported_gguf_architectures() {
        for (what, text) in [("README.md", &readme), ("mlx generate --help", &help)] {
            let words: Vec<&str> = text
                .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-'))
                .collect();
            assert!(
                words.contains(&arch),
                "{what} does not name the GGUF architecture {arch}"
            );
        }
    }
    assert!(!help.contains("No model hub is contacted"), "{help}");
}

//! Partial files of interrupted writes (`mlx_core::partial`): a partial left by a writer that
//! no longer runs is removed by the next write of the same target (and only that one), and
//! SIGINT/SIGTERM during a write removes the partial being written, in a child process of
//! this test binary (a real write is too short to interrupt reliably, so the child holds a
//! registered partial open while the parent signals it).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mlx_core::partial::{self, PartialGuard};
use mlx_core::prelude::*;

const CHILD: &str = "MLX_CORE_PARTIAL_CHILD";

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mlx_core_partial_{name}_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The pid of a process that has exited (and been reaped).
fn dead_pid() -> u32 {
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

#[test]
fn a_write_removes_the_partials_of_dead_writers_of_its_target_only() {
    let dir = tmp("stale");
    let target = dir.join("cache.safetensors");
    let dead = dead_pid();
    let live = std::process::id();
    let stale = dir.join(format!(".cache.safetensors.{dead}.partial.safetensors"));
    let stale_json = dir.join(format!(".cache.safetensors.{dead}.partial"));
    let ours = dir.join(format!(".cache.safetensors.{live}.partial.safetensors"));
    let other = dir.join(format!(".other.safetensors.{dead}.partial.safetensors"));
    let unrelated = dir.join(format!(".cache.safetensors.x{dead}.partial.safetensors"));
    for f in [&stale, &stale_json, &ours, &other, &unrelated] {
        std::fs::write(f, b"half a file").unwrap();
    }
    let a = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    mlx_core::io::save_safetensors(&target, [("a", &a)], &Default::default()).unwrap();
    assert!(target.is_file());
    assert!(
        !stale.exists() && !stale_json.exists(),
        "stale partials kept"
    );
    // This process's own partial name is the one the write just used and renamed.
    assert!(!ours.exists());
    assert!(
        other.exists() && unrelated.exists(),
        "foreign files removed"
    );
    let (back, _) = mlx_core::io::load_safetensors(&target, None).unwrap();
    assert_eq!(back["a"].to_vec::<f32>().unwrap(), [1.0, 2.0]);

    // A live writer's partial stays.
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let busy = dir.join(format!(
        ".cache.safetensors.{}.partial.safetensors",
        sleeper.id()
    ));
    std::fs::write(&busy, b"being written").unwrap();
    assert_eq!(partial::remove_stale_partials(&target), 0);
    assert!(busy.exists());
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    assert_eq!(partial::remove_stale_partials(&target), 1);
    assert!(!busy.exists());

    // `write_atomic` and a dropped guard leave no partial either.
    partial::write_atomic(&dir.join("state.json"), b"{}").unwrap();
    drop(PartialGuard::new(&dir.join("x.bin"), ""));
    let left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".partial") && !n.starts_with(".other") && !n.contains(".x"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The child: a partial registered and on disk, "ready" on stdout, then waits for a signal.
/// In scope mode it polls `interrupted()` and exits 0 once it turns true.
fn child(mode: &str, target: &Path) -> ! {
    partial::cleanup_on_interrupt();
    let _scope = (mode == "scope").then(partial::InterruptScope::enter);
    let guard = PartialGuard::new(target, ".safetensors");
    std::fs::write(guard.path(), b"being written").unwrap();
    // Straight to the descriptor: the test harness captures `println!`.
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(out, "ready {}", guard.path().display()).unwrap();
        out.flush().unwrap();
    }
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(20) {
        if mode == "scope" && partial::interrupted() {
            // The handler removed the partial already; a fetch would now stop on its own.
            let gone = !guard.path().exists();
            std::mem::forget(guard);
            std::process::exit(if gone { 0 } else { 4 });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::process::exit(5)
}

fn interrupt_child(mode: &str, signal: &str) -> (std::process::ExitStatus, PathBuf) {
    let dir = tmp(&format!("sig_{mode}_{signal}"));
    let target = dir.join("cache.safetensors");
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "interrupted_writes_leave_no_partial",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, format!("{mode} {}", target.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let mut partial_path = None;
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 {
        // The harness's own "test ... " may precede it on the line.
        if let Some((_, p)) = line.trim().split_once("ready ") {
            partial_path = Some(PathBuf::from(p));
            break;
        }
        line.clear();
    }
    let p = partial_path.expect("the child never got ready");
    assert!(p.exists());
    let st = Command::new("kill")
        .args([signal, &c.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let status = c.wait().unwrap();
    let gone = !p.exists();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(gone, "{mode} {signal}: the partial {} is left", p.display());
    (status, p)
}

#[test]
fn interrupted_writes_leave_no_partial() {
    if let Ok(v) = std::env::var(CHILD) {
        let (mode, target) = v.split_once(' ').unwrap();
        child(mode, Path::new(target));
    }
    use std::os::unix::process::ExitStatusExt;
    // Outside a scope: the partial is removed and the signal's default action ends the
    // process, as without the handler.
    for (signal, number) in [("-INT", 2), ("-TERM", 15)] {
        let (status, _) = interrupt_child("plain", signal);
        assert_eq!(status.signal(), Some(number), "{signal}: {status:?}");
    }
    // Inside a scope (a download): the partial is removed and the work stops on its own.
    let (status, _) = interrupt_child("scope", "-INT");
    assert_eq!(status.code(), Some(0), "{status:?}");
}

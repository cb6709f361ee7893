//! `mlx cache-prompt` removes what an earlier, killed write of the same target left: a
//! `.<name>.<pid>.partial.safetensors` whose writer no longer runs. Partials of other targets
//! and of live writers stay. (That SIGINT/SIGTERM during the write itself removes the partial
//! is tested in mlx-core's `tests/partial.rs`: the tiny model's write is too short to
//! interrupt reliably from here.)

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The pid of a process that has exited (and been reaped).
fn dead_pid() -> u32 {
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

#[test]
fn cache_prompt_removes_partials_of_killed_writes_of_its_target() {
    let dir = std::env::temp_dir().join(format!("mlx-cli-partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let target = dir.join("cache.safetensors");
    let dead = dead_pid();
    let stale = dir.join(format!(".cache.safetensors.{dead}.partial.safetensors"));
    let other = dir.join(format!(".other.safetensors.{dead}.partial.safetensors"));
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    let live = dir.join(format!(
        ".cache.safetensors.{}.partial.safetensors",
        sleeper.id()
    ));
    for f in [&stale, &other, &live] {
        std::fs::write(f, b"half of a prompt cache").unwrap();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_mlx"))
        .args([
            "cache-prompt",
            "--model",
            "mlx-cli/tests/models/dense_f32",
            "--prompt",
            "the cat and the dog",
            "--prompt-cache-file",
            target.to_str().unwrap(),
        ])
        .current_dir(root())
        .output()
        .unwrap();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(target.is_file());
    assert!(
        !stale.exists(),
        "the killed writer's partial is still there"
    );
    assert!(other.exists(), "another target's partial was removed");
    assert!(live.exists(), "a running writer's partial was removed");
    let _ = std::fs::remove_dir_all(&dir);
}

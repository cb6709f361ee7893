//! SIGTERM during a fetch stops pip and removes everything the fetch wrote. Alone in its test
//! binary: the signal goes to the whole process.
#![cfg(unix)]

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use mlx_engine::fetch::{fetch_pypi_file, FetchError};

#[test]
fn sigterm_during_a_download_cleans_up() {
    let dir = std::env::temp_dir().join(format!("mlx-fetch-sigterm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A "python" whose pip never finishes.
    let py = dir.join("python");
    std::fs::write(&py, "#!/bin/sh\nexec sleep 60\n").unwrap();
    std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::env::set_var("MLX_RS_PYTHON", &py);
    let cache = dir.join("cache");
    let pid = std::process::id().to_string();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
    });
    let err = fetch_pypi_file("pkg", "1.0", "a/b.bin", &"0".repeat(64), &cache).unwrap_err();
    killer.join().unwrap();
    assert_eq!(err, FetchError::Interrupted, "{err}");
    let left: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with(".fetch-"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

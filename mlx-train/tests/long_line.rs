//! A training file with a 64 MiB line is refused with its file and line number, and the
//! process never holds the line: the peak resident size stays far below the line's size
//! times anything (mlx_lm.lora itself needs about 245 MB for it). One test in its own binary,
//! so the peak (`VmHWM`) is this test's alone.

use std::io::Write;
use std::path::PathBuf;

use clap::Parser;
use mlx_train::cli::{run, TrainArgs};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: TrainArgs,
}

/// The process's peak resident set, in bytes (`VmHWM` of /proc/self/status).
fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[test]
fn a_64_mib_line_is_refused_naming_file_and_line_in_bounded_memory() {
    let dir = std::env::temp_dir().join(format!("mlx_train_long_line_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let train = data.join("train.jsonl");
    {
        // Written in 1 MiB pieces: the test itself never holds the line either.
        let mut f = std::io::BufWriter::new(std::fs::File::create(&train).unwrap());
        writeln!(f, "{{\"text\": \"the cat sat\"}}").unwrap();
        write!(f, "{{\"text\": \"").unwrap();
        let piece = vec![b'a'; 1 << 20];
        for _ in 0..64 {
            f.write_all(&piece).unwrap();
        }
        writeln!(f, "\"}}").unwrap();
        writeln!(f, "{{\"text\": \"the dog ran\"}}").unwrap();
    }
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/models/dense");
    let adapters = dir.join("adapters");
    let argv = [
        "mlx-train",
        "--model",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--num-layers",
        "1",
        "--batch-size",
        "1",
        "--iters",
        "1",
        "--adapter-path",
        adapters.to_str().unwrap(),
    ];
    let e = run(&Cli::try_parse_from(argv).unwrap().args)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("train.jsonl:2") && e.contains("longer than 16777216 bytes"),
        "{e}"
    );
    if let Some(peak) = peak_rss() {
        eprintln!("peak resident size: {} MB", peak >> 20);
        assert!(
            peak < 300 << 20,
            "peak resident size {} MB while refusing a 64 MiB line",
            peak >> 20
        );
    }
    // A line under the limit but not JSON, and one that is not UTF-8: named the same way.
    std::fs::write(&train, b"{\"text\": \"a\"}\n{\"text\": \"\xff\"}\n").unwrap();
    let e = run(&Cli::try_parse_from(argv).unwrap().args)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("train.jsonl:2") && e.contains("not UTF-8"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

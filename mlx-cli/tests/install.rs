//! An installed or copied `mlx` runs away from its build folder: libmlx is found through the
//! binary's run paths (the copy `mlx-sys` keeps in the user's cache, or an `mlx-runtime/`
//! folder carried beside the binary), never through cargo's library path. The dynamic loader
//! says which file it loaded (`LD_DEBUG=libs`).
#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::process::Command;

fn built() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_mlx"))
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mlx-engine/tests/fixtures/tiny_chat")
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mlx-install-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `bin generate` on the tiny fixture with no library path, and returns the libmlx the
/// loader initialised.
fn run_and_find_libmlx(bin: &Path) -> PathBuf {
    let out = Command::new(bin)
        .args(["generate", "--model"])
        .arg(fixture())
        .args(["--prompt", "hello", "-m", "2", "--verbose", "false"])
        .env_remove("LD_LIBRARY_PATH")
        .env("LD_DEBUG", "libs")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {err}", bin.display());
    let line = err
        .lines()
        .find(|l| l.contains("calling init:") && l.contains("libmlx."))
        .unwrap_or_else(|| panic!("the loader did not report libmlx: {err}"));
    PathBuf::from(line.split("calling init:").nth(1).unwrap().trim())
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type().unwrap().is_dir() {
            copy_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

#[test]
fn a_copied_binary_finds_libmlx_outside_the_target_directory() {
    let target = built().parent().unwrap().to_path_buf();
    let dir = temp_dir("alone");
    let bin = dir.join("mlx");
    std::fs::copy(built(), &bin).unwrap();
    let lib = run_and_find_libmlx(&bin);
    assert!(
        !lib.starts_with(&target),
        "{} was loaded from the target directory {}: an installed binary would not find it",
        lib.display(),
        target.display()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_binary_with_mlx_runtime_beside_it_uses_that_copy() {
    let target = built().parent().unwrap().to_path_buf();
    // The wheel the build fetched (`target/<profile>/mlx-runtime/<package>-<version>/wheel`).
    let Some(wheel) = std::fs::read_dir(target.join("mlx-runtime"))
        .ok()
        .and_then(|rd| {
            rd.flatten()
                .map(|e| e.path().join("wheel"))
                .find(|p| p.is_dir())
        })
    else {
        eprintln!("skipped: MLX_DIR builds have no fetched wheel to carry along");
        return;
    };
    let dir = temp_dir("beside");
    let bin = dir.join("mlx");
    std::fs::copy(built(), &bin).unwrap();
    let runtime = dir.join("mlx-runtime");
    copy_tree(&wheel.join("mlx/lib"), &runtime.join("mlx/lib"));
    for e in std::fs::read_dir(&wheel).unwrap().flatten() {
        if e.file_name().to_string_lossy().ends_with(".libs") {
            copy_tree(&e.path(), &runtime.join(e.file_name()));
        }
    }
    let lib = run_and_find_libmlx(&bin);
    assert!(lib.starts_with(&runtime), "{}", lib.display());
    let _ = std::fs::remove_dir_all(&dir);
}

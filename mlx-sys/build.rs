//! Build script for `mlx-sys`: find (or fetch) MLX 0.32.4, compile the C ABI shim, link.
//!
//! Where MLX comes from, in order:
//! 1. `MLX_DIR`: a directory laid out like the unpacked wheel (`mlx/include/mlx/mlx.h`,
//!    `mlx/lib/libmlx.so` or `.dylib`).
//! 2. Otherwise the pinned wheel for the platform, fetched with pip into
//!    `<target>/<profile>/mlx-runtime/<package>-0.32.4/`, verified (pinned sha256 where known, and
//!    always every file against the wheel's own `RECORD`), and unpacked keeping its layout.
//!
//! The library directory lies inside the target directory, so `cargo run` / `cargo test`
//! put it on the dynamic library path of what they run. Dependents get the directory as
//! `DEP_MLX_LIBDIR` (this crate `links = "mlx"`) to add an rpath to their binaries.
//!
//! A fetched wheel's run-time part (`mlx/lib` and the wheel's bundled `*.libs`, in the wheel's
//! layout, which libmlx's own RUNPATH expects) is also copied once into the user's cache
//! (`$MLX_RS_CACHE`, else `$XDG_CACHE_HOME/mlx-rs`, else `~/.cache/mlx-rs`, under
//! `runtime/<package>-<version>/`) and given to dependents as `DEP_MLX_RUNTIME`: binaries that
//! outlive the target directory (`cargo install`, a copied `mlx`) find libmlx there.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const MLX_VERSION: &str = "0.32.4";

/// sha256 of the wheels this project has checked by hand.
const PINNED: &[(&str, &str)] = &[
    (
        "mlx_cpu-0.32.4-py3-none-manylinux_2_35_x86_64.whl",
        "0e0a24fa2ce8b6b94d2e6a90604e8813aa8e29fcb918bb2aa01cfb6d133d8cee",
    ),
    (
        "mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl",
        "94cb48fba73e5ee39467e51c35c51c691123359ca17bafd1a24cf92ad6732bee",
    ),
    (
        "mlx_metal-0.32.4-py3-none-macosx_15_0_arm64.whl",
        "9f0a3cc26d89724434d9684932fc6f3e4e83669d2a895d858ed2c8a55eb84e8b",
    ),
];

/// Verifies a wheel (pinned sha256 when known, RECORD always) and unpacks it.
/// argv: wheel path, destination, expected sha256 or "-".
const VERIFY_AND_UNPACK: &str = r#"
import base64, csv, hashlib, io, os, sys, zipfile
whl, dest, expect = sys.argv[1], sys.argv[2], sys.argv[3]
h = hashlib.sha256(open(whl, 'rb').read()).hexdigest()
if expect != '-' and h != expect:
    sys.exit(f'sha256 mismatch for {whl}: got {h}, expected {expect}')
z = zipfile.ZipFile(whl)
records = [n for n in z.namelist() if n.endswith('.dist-info/RECORD')]
if len(records) != 1:
    sys.exit(f'{whl}: no RECORD file; not a wheel?')
checked = 0
for row in csv.reader(io.TextIOWrapper(z.open(records[0]), 'utf-8')):
    if len(row) < 2 or not row[1]:
        continue
    algo, _, digest = row[1].partition('=')
    got = base64.urlsafe_b64encode(hashlib.new(algo, z.read(row[0])).digest()).rstrip(b'=').decode()
    if got != digest:
        sys.exit(f'{whl}: {row[0]} does not match its RECORD hash')
    checked += 1
z.extractall(dest)
print(f'verified {checked} files, sha256 {h}')
"#;

fn main() {
    if let Err(msg) = run() {
        // One clear message, then fail the build.
        eprintln!("\nerror: mlx-sys could not set up MLX {MLX_VERSION}:\n  {msg}\n");
        eprintln!(
            "  Fix: install Python 3 with pip (the build fetches the wheel), or set MLX_DIR to a\n  \
             directory laid out like the unpacked wheel (mlx/include, mlx/lib/libmlx.*).\n"
        );
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=shim");
    println!("cargo:rerun-if-env-changed=MLX_DIR");
    println!("cargo:rerun-if-env-changed=MLX_SYS_PYTHON");

    let root = match env::var_os("MLX_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            check_layout(&dir).map_err(|e| format!("MLX_DIR={}: {e}", dir.display()))?;
            dir
        }
        None => fetch_wheel()?,
    };
    let include = root.join("mlx").join("include");
    let libdir = root.join("mlx").join("lib");

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++20")
        .include(&include)
        .include("shim")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .warnings(false);
    let mut sources: Vec<PathBuf> = fs::read_dir("shim")
        .map_err(|e| format!("reading shim/: {e}"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cpp"))
        // Our CUDA runtime (`mlx_core::gpurt`) is built with the `cuda` feature only; its
        // declarations stay in the header (and the committed bindings), unused without it.
        .filter(|p| {
            env::var_os("CARGO_FEATURE_CUDA").is_some()
                || p.file_name().is_none_or(|n| n != "gpurt.cpp")
        })
        .collect();
    sources.sort();
    build.files(&sources);
    build
        .try_compile("mlxshim")
        .map_err(|e| format!("compiling the shim: {e}"))?;

    println!("cargo:rustc-link-search=native={}", libdir.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    // Metadata for dependents (DEP_MLX_ROOT, DEP_MLX_LIBDIR, DEP_MLX_INCLUDE).
    println!("cargo:root={}", root.display());
    println!("cargo:libdir={}", libdir.display());
    println!("cargo:include={}", include.display());
    // This crate's own tests and examples find libmlx without cargo's help too.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", libdir.display());
    println!("cargo:rerun-if-env-changed=MLX_RS_CACHE");
    if env::var_os("MLX_DIR").is_none() {
        match persist_runtime(&root) {
            Ok(dir) => println!("cargo:runtime={}", dir.display()),
            Err(e) => println!(
                "cargo:warning=libmlx was not copied into the user cache ({e}): installed \
                 binaries will need it beside them (mlx-runtime/) or on the library path"
            ),
        }
    } else {
        println!("cargo:runtime={}", root.display());
    }
    Ok(())
}

/// The user's cache directory, as `mlx_engine::fetch::default_cache_dir` finds it.
fn user_cache() -> Option<PathBuf> {
    let non_empty = |k: &str| env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    non_empty("MLX_RS_CACHE")
        .or_else(|| non_empty("XDG_CACHE_HOME").map(|d| d.join("mlx-rs")))
        .or_else(|| non_empty("HOME").map(|h| h.join(".cache").join("mlx-rs")))
}

/// Copies the wheel's run-time files (`mlx/lib`, `*.libs`) into
/// `<user cache>/runtime/<package>-<version>/` once (a staging sibling renamed into place),
/// so binaries built here keep running after the target directory is gone.
fn persist_runtime(root: &Path) -> Result<PathBuf, String> {
    let pkg = package()?;
    let base = user_cache()
        .ok_or("no MLX_RS_CACHE, XDG_CACHE_HOME or HOME")?
        .join("runtime");
    let dest = base.join(format!("{pkg}-{MLX_VERSION}"));
    let marker = dest.join(".complete");
    let lib_name = if cfg!(target_os = "macos") {
        "libmlx.dylib"
    } else {
        "libmlx.so"
    };
    let src_lib = root.join("mlx/lib").join(lib_name);
    let size = |p: &Path| fs::metadata(p).map(|m| m.len()).ok();
    if marker.is_file() && size(&dest.join("mlx/lib").join(lib_name)) == size(&src_lib) {
        return Ok(dest);
    }
    fs::create_dir_all(&base).map_err(|e| format!("creating {}: {e}", base.display()))?;
    let staging = base.join(format!(
        ".{pkg}-{MLX_VERSION}.{}.partial",
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&staging);
    let mut parts = vec![PathBuf::from("mlx/lib")];
    for e in fs::read_dir(root).map_err(|e| format!("reading {}: {e}", root.display()))? {
        let e = e.map_err(|e| e.to_string())?;
        if e.file_name().to_string_lossy().ends_with(".libs") {
            parts.push(PathBuf::from(e.file_name()));
        }
    }
    for part in &parts {
        copy_tree(&root.join(part), &staging.join(part))?;
    }
    fs::write(staging.join(".complete"), MLX_VERSION).map_err(|e| e.to_string())?;
    let _ = fs::remove_dir_all(&dest);
    if let Err(e) = fs::rename(&staging, &dest) {
        let _ = fs::remove_dir_all(&staging);
        // Another build may have put it there first.
        if !marker.is_file() {
            return Err(format!("moving the runtime into {}: {e}", dest.display()));
        }
    }
    Ok(dest)
}

fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    fs::create_dir_all(to).map_err(|e| format!("creating {}: {e}", to.display()))?;
    for e in fs::read_dir(from).map_err(|e| format!("reading {}: {e}", from.display()))? {
        let e = e.map_err(|e| e.to_string())?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let ty = e.file_type().map_err(|e| e.to_string())?;
        if ty.is_symlink() {
            let link = fs::read_link(&src).map_err(|e| e.to_string())?;
            #[cfg(unix)]
            std::os::unix::fs::symlink(&link, &dst).map_err(|e| e.to_string())?;
            #[cfg(not(unix))]
            fs::copy(&src, &dst).map_err(|e| e.to_string())?;
        } else if ty.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            fs::copy(&src, &dst).map_err(|e| format!("copying {}: {e}", src.display()))?;
        }
    }
    Ok(())
}

fn check_layout(dir: &Path) -> Result<(), String> {
    let header = dir.join("mlx/include/mlx/mlx.h");
    if !header.is_file() {
        return Err(format!("missing {}", header.display()));
    }
    let lib = dir.join("mlx/lib");
    if !(lib.join("libmlx.so").is_file() || lib.join("libmlx.dylib").is_file()) {
        return Err(format!("missing {}/libmlx.so (or .dylib)", lib.display()));
    }
    Ok(())
}

fn package() -> Result<&'static str, String> {
    let os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let cuda = env::var_os("CARGO_FEATURE_CUDA").is_some();
    match (os.as_str(), cuda) {
        ("macos", false) => Ok("mlx-metal"),
        ("macos", true) => Err("the `cuda` feature is for Linux only".into()),
        ("linux", false) => Ok("mlx-cpu"),
        ("linux", true) => Ok("mlx-cuda-13"),
        (other, _) => Err(format!("no MLX wheel for target OS `{other}`; set MLX_DIR")),
    }
}

/// `<target>/<profile>/mlx-runtime`, found by walking up from OUT_DIR
/// (`<target>/<profile>/build/<pkg>/out`). Cargo puts native search paths under
/// `<target>/<profile>` on the library path of what it runs; `<target>` itself is not enough.
fn cache_root() -> Result<PathBuf, String> {
    let out = PathBuf::from(env::var("OUT_DIR").map_err(|_| "OUT_DIR not set".to_string())?);
    let build_dir = out
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "build"))
        .ok_or("OUT_DIR is not under a `build` directory")?;
    let profile_dir = build_dir.parent().ok_or("no profile directory")?;
    Ok(profile_dir.join("mlx-runtime"))
}

fn python() -> String {
    env::var("MLX_SYS_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn fetch_wheel() -> Result<PathBuf, String> {
    let pkg = package()?;
    let dir = cache_root()?.join(format!("{pkg}-{MLX_VERSION}"));
    let root = dir.join("wheel");
    if dir.join(".complete").is_file() && check_layout(&root).is_ok() {
        return Ok(root);
    }
    let download = dir.join("download");
    fs::create_dir_all(&download).map_err(|e| format!("creating {}: {e}", download.display()))?;
    let py = python();
    let status = Command::new(&py)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
        ])
        .arg(format!("{pkg}=={MLX_VERSION}"))
        .arg("-d")
        .arg(&download)
        .status()
        .map_err(|e| {
            format!("running `{py} -m pip` failed ({e}); is Python 3 with pip installed?")
        })?;
    if !status.success() {
        return Err(format!(
            "`{py} -m pip download {pkg}=={MLX_VERSION}` failed ({status}); is the package index reachable?"
        ));
    }
    let wheel = fs::read_dir(&download)
        .map_err(|e| format!("reading {}: {e}", download.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&pkg.replace('-', "_")) && n.ends_with(".whl"))
        })
        .ok_or_else(|| {
            format!(
                "pip reported success but no {pkg} wheel is in {}",
                download.display()
            )
        })?;
    let name = wheel
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let expect = PINNED
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, h)| *h)
        .unwrap_or("-");
    let staging = dir.join("wheel.partial");
    let _ = fs::remove_dir_all(&staging);
    let out = Command::new(&py)
        .arg("-c")
        .arg(VERIFY_AND_UNPACK)
        .arg(&wheel)
        .arg(&staging)
        .arg(expect)
        .output()
        .map_err(|e| format!("running {py} to verify the wheel: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "verifying {}: {}",
            wheel.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let _ = fs::remove_dir_all(&root);
    fs::rename(&staging, &root)
        .map_err(|e| format!("moving the unpacked wheel into place: {e}"))?;
    check_layout(&root)?;
    fs::write(
        dir.join(".complete"),
        String::from_utf8_lossy(&out.stdout).as_bytes(),
    )
    .map_err(|e| format!("writing the completion marker: {e}"))?;
    Ok(root)
}

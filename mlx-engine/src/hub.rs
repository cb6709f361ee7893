//! Models by name: `ORG/NAME[@REVISION]` resolved as `huggingface_hub` resolves it, so the
//! Python tools and this crate share one cache.
//!
//! First the local Hugging Face cache (`HF_HUB_CACHE`, else `HF_HOME/hub`, else
//! `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`) in its own layout:
//! `models--ORG--NAME/refs/<revision>` holds a commit, `snapshots/<commit>/<file>` links to
//! `blobs/<etag>`. Then, unless `HF_HUB_OFFLINE` is set, the Hub's HTTP API (`HF_ENDPOINT`,
//! `HF_TOKEN`): the revision's file list, then each file a load needs (mlx-lm's
//! `DEFAULT_ALLOW_PATTERNS` less `*.py`: nothing here runs a repository's code) into
//! `blobs/<etag>.incomplete`, resumed with a `Range` request after an interruption, checked
//! against its etag (sha256 for LFS files, git's blob sha1 for the others), then renamed and
//! linked from the snapshot.

use std::fmt;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::fetch::{agent_builder, transport_message, FetchProgress};

/// The files a load needs, as mlx-lm's `DEFAULT_ALLOW_PATTERNS` (without `*.py`).
pub const ALLOW_PATTERNS: &[&str] = &[
    "*.json",
    "model*.safetensors",
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "*.txt",
    "*.jsonl",
    "*.jinja",
];

const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Why a model could not be had by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HubError {
    /// The name is not `ORG/NAME[@REVISION]`.
    InvalidName { name: String, problem: String },
    /// `HF_HUB_OFFLINE` is set and the cache has no complete snapshot.
    NotCached { repo: String, cache: PathBuf },
    /// The Hub answered with an error status.
    Http {
        url: String,
        status: u16,
        message: String,
    },
    /// The Hub could not be reached, or the connection broke.
    Network { url: String, message: String },
    /// The Hub's answer is not what its API returns.
    BadResponse { url: String, problem: String },
    /// A downloaded file does not match its etag or size.
    Mismatch {
        file: String,
        expected: String,
        actual: String,
    },
    /// A filesystem operation failed.
    Io { path: PathBuf, message: String },
}

impl fmt::Display for HubError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HubError::InvalidName { name, problem } => {
                write!(
                    f,
                    "model {name:?}: not a Hub name (ORG/NAME[@REVISION]): {problem}"
                )
            }
            HubError::NotCached { repo, cache } => write!(
                f,
                "model {repo:?} is not in the Hugging Face cache {} and HF_HUB_OFFLINE is set",
                cache.display()
            ),
            HubError::Http {
                url,
                status,
                message,
            } => {
                let hint = match status {
                    401 | 403 => " (a gated or private repository: set HF_TOKEN)",
                    404 => " (no such repository, revision or file)",
                    _ => "",
                };
                write!(f, "{url}: HTTP {status}{hint}: {message}")
            }
            HubError::Network { url, message } => write!(f, "{url}: {message}"),
            HubError::BadResponse { url, problem } => write!(f, "{url}: {problem}"),
            HubError::Mismatch {
                file,
                expected,
                actual,
            } => write!(
                f,
                "{file}: downloaded content does not match the Hub's etag (expected \
                 {expected}, got {actual}); the partial file was removed"
            ),
            HubError::Io { path, message } => write!(f, "{}: {message}", path.display()),
        }
    }
}

impl std::error::Error for HubError {}

fn io_err(path: &Path, e: impl fmt::Display) -> HubError {
    HubError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// A repository on the Hub and the revision asked for (`main` when none is given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoRef {
    pub repo_id: String,
    pub revision: String,
}

fn name_part_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 96
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !s.starts_with(['-', '.'])
        && !s.ends_with(['-', '.'])
        && !s.contains("--")
        && !s.contains("..")
}

impl RepoRef {
    /// Parses `ORG/NAME` or `ORG/NAME@REVISION` with huggingface_hub's rules for repository
    /// ids (letters, digits, `-`, `_`, `.`; no `--` or `..`; at most 96 characters a part).
    pub fn parse(name: &str) -> Result<RepoRef, HubError> {
        let bad = |problem: &str| HubError::InvalidName {
            name: name.to_string(),
            problem: problem.to_string(),
        };
        let (id, revision) = match name.split_once('@') {
            Some((id, rev)) => (id, rev),
            None => (name, "main"),
        };
        let Some((org, repo)) = id.split_once('/') else {
            return Err(bad("expected ORG/NAME"));
        };
        if !name_part_ok(org) || !name_part_ok(repo) {
            return Err(bad(
                "each part takes letters, digits, '-', '_' and '.', without '--' or '..'",
            ));
        }
        let rev_ok = !revision.is_empty()
            && revision.len() <= 256
            && revision
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
            && revision
                .split('/')
                .all(|p| !p.is_empty() && p != "." && p != "..");
        if !rev_ok {
            return Err(bad(
                "the revision takes letters, digits, '-', '_', '.' and '/'",
            ));
        }
        Ok(RepoRef {
            repo_id: id.to_string(),
            revision: revision.to_string(),
        })
    }

    /// The repository's folder in the cache: `models--ORG--NAME`.
    pub fn folder_name(&self) -> String {
        format!("models--{}", self.repo_id.replace('/', "--"))
    }
}

impl fmt::Display for RepoRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.revision == "main" {
            write!(f, "{}", self.repo_id)
        } else {
            write!(f, "{}@{}", self.repo_id, self.revision)
        }
    }
}

/// Whether `s` is a full commit hash.
fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn env_non_empty(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

fn hf_home() -> PathBuf {
    if let Some(h) = env_non_empty("HF_HOME") {
        return PathBuf::from(h);
    }
    if let Some(x) = env_non_empty("XDG_CACHE_HOME") {
        return Path::new(&x).join("huggingface");
    }
    let home = env_non_empty("HOME").unwrap_or_else(|| "/tmp".into());
    Path::new(&home).join(".cache").join("huggingface")
}

/// The Hub cache: `HF_HUB_CACHE` (or its old name `HUGGINGFACE_HUB_CACHE`), else
/// `HF_HOME/hub`, as huggingface_hub reads them.
pub fn cache_dir() -> PathBuf {
    env_non_empty("HF_HUB_CACHE")
        .or_else(|| env_non_empty("HUGGINGFACE_HUB_CACHE"))
        .map(PathBuf::from)
        .unwrap_or_else(|| hf_home().join("hub"))
}

/// Whether `HF_HUB_OFFLINE` forbids network access (`1`, `ON`, `YES`, `TRUE`).
pub fn offline() -> bool {
    env_non_empty("HF_HUB_OFFLINE")
        .is_some_and(|v| matches!(v.to_ascii_uppercase().as_str(), "1" | "ON" | "YES" | "TRUE"))
}

/// Where and how to reach the Hub.
#[derive(Debug, Clone)]
pub struct HubOptions {
    pub cache: PathBuf,
    pub endpoint: String,
    pub token: Option<String>,
    pub offline: bool,
}

impl HubOptions {
    /// From the environment, as huggingface_hub reads it: `HF_HUB_CACHE`/`HF_HOME`,
    /// `HF_ENDPOINT`, `HF_TOKEN` (else the token file `HF_TOKEN_PATH` or `HF_HOME/token`),
    /// `HF_HUB_OFFLINE`.
    pub fn from_env() -> HubOptions {
        let token = env_non_empty("HF_TOKEN").or_else(|| {
            let path = env_non_empty("HF_TOKEN_PATH")
                .map(PathBuf::from)
                .unwrap_or_else(|| hf_home().join("token"));
            std::fs::read_to_string(path)
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
        });
        HubOptions {
            cache: cache_dir(),
            endpoint: env_non_empty("HF_ENDPOINT")
                .unwrap_or_else(|| DEFAULT_ENDPOINT.into())
                .trim_end_matches('/')
                .to_string(),
            token,
            offline: offline(),
        }
    }
}

/// Whether a snapshot folder holds what a load needs: `config.json`, and every shard its
/// safetensors index names (else at least one `model*.safetensors`).
fn snapshot_complete(dir: &Path) -> bool {
    if !dir.join("config.json").is_file() {
        return false;
    }
    let index = dir.join("model.safetensors.index.json");
    if let Ok(text) = std::fs::read_to_string(&index) {
        let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
            return false;
        };
        let Some(map) = json.get("weight_map").and_then(|m| m.as_object()) else {
            return false;
        };
        return map
            .values()
            .filter_map(|v| v.as_str())
            .all(|f| safe_relative(f) && dir.join(f).is_file());
    }
    std::fs::read_dir(dir).is_ok_and(|rd| {
        rd.flatten().any(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.starts_with("model") && n.ends_with(".safetensors") && e.path().is_file()
        })
    })
}

/// The commit `revision` points at in the cache (`refs/<revision>`), or the revision itself
/// when it is a commit hash.
fn cached_commit(repo_dir: &Path, revision: &str) -> Option<String> {
    if is_commit(revision) {
        return Some(revision.to_string());
    }
    let commit = std::fs::read_to_string(repo_dir.join("refs").join(revision)).ok()?;
    let commit = commit.trim();
    is_commit(commit).then(|| commit.to_string())
}

/// The cached snapshot of `repo`, when it is complete.
pub fn cached_snapshot(cache: &Path, repo: &RepoRef) -> Option<PathBuf> {
    let repo_dir = cache.join(repo.folder_name());
    let commit = cached_commit(&repo_dir, &repo.revision)?;
    let snap = repo_dir.join("snapshots").join(commit);
    snapshot_complete(&snap).then_some(snap)
}

/// A path inside a repository that stays inside it: relative, no `..`, no root.
fn safe_relative(p: &str) -> bool {
    !p.is_empty()
        && !p.contains('\\')
        && Path::new(p)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

/// Shell-style match of `name` against `pattern` (`*` any run of characters, `?` one), as
/// `fnmatch` matches huggingface_hub's allow patterns against whole paths.
fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// Whether a repository file is one a load needs.
pub fn wanted(file: &str) -> bool {
    ALLOW_PATTERNS.iter().any(|p| glob_match(p, file))
}

/// Percent-encodes a path segment for a URL (RFC 3986 unreserved characters kept).
fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'_' | b'.' | b'~')
            || (keep_slash && b == b'/')
        {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

struct Client {
    opts: HubOptions,
    follow: ureq::Agent,
    no_follow: ureq::Agent,
}

/// Bytes of JSON the revision endpoint may answer with (a repository lists its files there;
/// thousands of files fit in a few MB).
const MAX_API_BYTES: u64 = 64 << 20;

impl Client {
    fn new(opts: HubOptions) -> Client {
        let builder = agent_builder;
        Client {
            opts,
            follow: builder().redirects(8).build(),
            no_follow: builder().redirects(0).build(),
        }
    }

    fn request(&self, agent: &ureq::Agent, method: &str, url: &str) -> ureq::Request {
        let r = agent.request(method, url);
        match &self.opts.token {
            Some(t) => r.set("Authorization", &format!("Bearer {t}")),
            None => r,
        }
    }

    fn call(&self, req: ureq::Request, url: &str) -> Result<ureq::Response, HubError> {
        match req.call() {
            Ok(r) => Ok(r),
            Err(ureq::Error::Status(status, r)) => {
                let mut body = String::new();
                let _ = r.into_reader().take(4096).read_to_string(&mut body);
                Err(HubError::Http {
                    url: url.to_string(),
                    status,
                    message: body.trim().chars().take(300).collect(),
                })
            }
            Err(ureq::Error::Transport(t)) => Err(HubError::Network {
                url: url.to_string(),
                message: transport_message(&t),
            }),
        }
    }

    /// The revision's commit and file list.
    fn revision(&self, repo: &RepoRef) -> Result<(String, Vec<String>), HubError> {
        let url = format!(
            "{}/api/models/{}/revision/{}",
            self.opts.endpoint,
            encode(&repo.repo_id, true),
            encode(&repo.revision, false)
        );
        let r = self.call(self.request(&self.follow, "GET", &url), &url)?;
        let mut text = String::new();
        r.into_reader()
            .take(MAX_API_BYTES)
            .read_to_string(&mut text)
            .map_err(|e| HubError::Network {
                url: url.clone(),
                message: e.to_string(),
            })?;
        let bad = |problem: &str| HubError::BadResponse {
            url: url.clone(),
            problem: problem.to_string(),
        };
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(&format!("not JSON: {e}")))?;
        let sha = json
            .get("sha")
            .and_then(|s| s.as_str())
            .filter(|s| is_commit(s))
            .ok_or_else(|| bad("no commit hash in field `sha`"))?
            .to_string();
        let siblings = json
            .get("siblings")
            .and_then(|s| s.as_array())
            .ok_or_else(|| bad("no file list in field `siblings`"))?;
        let mut files = Vec::new();
        for s in siblings {
            let name = s
                .get("rfilename")
                .and_then(|n| n.as_str())
                .ok_or_else(|| bad("a `siblings` entry has no `rfilename`"))?;
            if !safe_relative(name) {
                return Err(bad(&format!("file name {name:?} leaves the repository")));
            }
            files.push(name.to_string());
        }
        Ok((sha, files))
    }
}

/// What the Hub says of one file: its etag (the blob's name) and size.
struct FileMeta {
    etag: String,
    size: Option<u64>,
}

fn header_etag(r: &ureq::Response) -> Option<String> {
    let raw = r.header("x-linked-etag").or_else(|| r.header("etag"))?;
    let e = raw.trim().trim_start_matches("W/").trim_matches('"');
    (!e.is_empty()
        && e.len() <= 128
        && e.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_')))
    .then(|| e.to_string())
}

/// How a downloaded blob is checked: sha256 for an LFS file (its etag), git's blob sha1 for
/// the others (their etag), the size where the etag is neither.
fn verify(path: &Path, meta: &FileMeta, file: &str) -> Result<(), HubError> {
    let len = std::fs::metadata(path).map_err(|e| io_err(path, e))?.len();
    if let Some(size) = meta.size {
        if len != size {
            return Err(HubError::Mismatch {
                file: file.to_string(),
                expected: format!("{size} bytes"),
                actual: format!("{len} bytes"),
            });
        }
    }
    let etag = meta.etag.to_ascii_lowercase();
    let hex = etag.bytes().all(|b| b.is_ascii_hexdigit());
    let actual = match (etag.len(), hex) {
        (64, true) => {
            let mut h = Sha256::new();
            hash_file(path, |b| h.update(b))?;
            format!("{:x}", h.finalize())
        }
        (40, true) => {
            let mut h = sha1_smol::Sha1::new();
            h.update(format!("blob {len}\0").as_bytes());
            hash_file(path, |b| h.update(b))?;
            h.digest().to_string()
        }
        _ => return Ok(()),
    };
    if actual != etag {
        return Err(HubError::Mismatch {
            file: file.to_string(),
            expected: etag,
            actual,
        });
    }
    Ok(())
}

fn hash_file(path: &Path, mut f: impl FnMut(&[u8])) -> Result<(), HubError> {
    let mut file = std::fs::File::open(path).map_err(|e| io_err(path, e))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| io_err(path, e))?;
        if n == 0 {
            return Ok(());
        }
        f(&buf[..n]);
    }
}

/// Links `snapshots/<commit>/<file>` to `blobs/<etag>` with a relative link, as
/// huggingface_hub does (a copy where links are not available).
fn link(blob: &Path, target: &Path, file: &str) -> Result<(), HubError> {
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io_err(parent, e))?;
    }
    let _ = std::fs::remove_file(target);
    #[cfg(unix)]
    {
        // From snapshots/<commit>/<file>: one `..` per directory of `file`, plus two.
        let depth = Path::new(file).components().count() + 1;
        let mut rel = PathBuf::new();
        for _ in 0..depth {
            rel.push("..");
        }
        rel.push("blobs");
        rel.push(blob.file_name().unwrap_or_default());
        std::os::unix::fs::symlink(&rel, target).map_err(|e| io_err(target, e))
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        std::fs::copy(blob, target)
            .map(|_| ())
            .map_err(|e| io_err(target, e))
    }
}

impl Client {
    fn meta(&self, url: &str) -> Result<FileMeta, HubError> {
        let r = self.call(self.request(&self.no_follow, "HEAD", url), url)?;
        let etag = header_etag(&r).ok_or_else(|| HubError::BadResponse {
            url: url.to_string(),
            problem: "no ETag or X-Linked-Etag header".into(),
        })?;
        let size = r
            .header("x-linked-size")
            .or_else(|| {
                // A redirect's own Content-Length is its body's, not the file's.
                (r.status() == 200)
                    .then(|| r.header("content-length"))
                    .flatten()
            })
            .and_then(|s| s.trim().parse().ok());
        Ok(FileMeta { etag, size })
    }

    /// Downloads `url` into `partial`, resuming from its length.
    fn download(
        &self,
        url: &str,
        partial: &Path,
        meta: &FileMeta,
        file: &str,
        progress: &mut dyn FnMut(&FetchProgress),
    ) -> Result<(), HubError> {
        let mut have = std::fs::metadata(partial).map(|m| m.len()).unwrap_or(0);
        if meta.size.is_some_and(|s| have > s) {
            have = 0;
        }
        progress(&FetchProgress::Downloading {
            file: file.to_string(),
            total: meta.size,
        });
        let mut req = self.request(&self.follow, "GET", url);
        if have > 0 {
            req = req.set("Range", &format!("bytes={have}-"));
        }
        let r = self.call(req, url)?;
        let append = have > 0 && r.status() == 206;
        if !append {
            have = 0;
        }
        let mut out = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(partial)
            .map_err(|e| io_err(partial, e))?;
        let limit = meta.size.map_or(u64::MAX, |s| s - have);
        let mut reader = r.into_reader().take(limit);
        let mut buf = vec![0u8; 1 << 16];
        let mut done = have;
        loop {
            let n = reader.read(&mut buf).map_err(|e| HubError::Network {
                url: url.to_string(),
                message: format!(
                    "the download broke after {done} bytes ({e}); run again to resume"
                ),
            })?;
            if n == 0 {
                break;
            }
            out.write_all(&buf[..n]).map_err(|e| io_err(partial, e))?;
            done += n as u64;
            progress(&FetchProgress::Downloaded {
                bytes: done,
                total: meta.size,
            });
        }
        out.flush().map_err(|e| io_err(partial, e))?;
        if meta.size.is_some_and(|s| done < s) {
            return Err(HubError::Network {
                url: url.to_string(),
                message: format!(
                    "the connection closed after {done} of {} bytes; run again to resume",
                    meta.size.unwrap_or(0)
                ),
            });
        }
        Ok(())
    }
}

/// Downloads what a load needs of `repo` into the cache and returns its snapshot folder.
/// Files already in the cache (same etag) are not fetched again; an interrupted file resumes.
pub fn download(
    repo: &RepoRef,
    opts: &HubOptions,
    progress: &mut dyn FnMut(&FetchProgress),
) -> Result<PathBuf, HubError> {
    let client = Client::new(opts.clone());
    let (commit, files) = client.revision(repo)?;
    let repo_dir = opts.cache.join(repo.folder_name());
    let blobs = repo_dir.join("blobs");
    let snap = repo_dir.join("snapshots").join(&commit);
    std::fs::create_dir_all(&blobs).map_err(|e| io_err(&blobs, e))?;
    std::fs::create_dir_all(&snap).map_err(|e| io_err(&snap, e))?;
    let wanted_files: Vec<&String> = files.iter().filter(|f| wanted(f)).collect();
    if !wanted_files.iter().any(|f| f.as_str() == "config.json") {
        return Err(HubError::BadResponse {
            url: format!("{}/{}", opts.endpoint, repo.repo_id),
            problem: "the repository has no config.json: not a model MLX can load".into(),
        });
    }
    for file in wanted_files {
        let url = format!(
            "{}/{}/resolve/{}/{}",
            opts.endpoint,
            encode(&repo.repo_id, true),
            commit,
            encode(file, true)
        );
        let target = snap.join(file);
        let meta = client.meta(&url)?;
        let blob = blobs.join(&meta.etag);
        if !blob.is_file() {
            let partial = blobs.join(format!("{}.incomplete", meta.etag));
            client.download(&url, &partial, &meta, file, progress)?;
            if let Err(e) = verify(&partial, &meta, file) {
                let _ = std::fs::remove_file(&partial);
                return Err(e);
            }
            std::fs::rename(&partial, &blob).map_err(|e| io_err(&blob, e))?;
        }
        link(&blob, &target, file)?;
    }
    if !is_commit(&repo.revision) || repo.revision != commit {
        let r = repo_dir.join("refs").join(&repo.revision);
        if let Some(parent) = r.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io_err(parent, e))?;
        }
        if !is_commit(&repo.revision) {
            std::fs::write(&r, &commit).map_err(|e| io_err(&r, e))?;
        }
    }
    if !snapshot_complete(&snap) {
        return Err(HubError::BadResponse {
            url: format!("{}/{}", opts.endpoint, repo.repo_id),
            problem: "the downloaded snapshot has no model*.safetensors (or misses a shard its \
                      index names)"
                .into(),
        });
    }
    Ok(snap)
}

/// The local folder of `repo`: the cached snapshot when complete, else downloaded (unless
/// offline).
pub fn resolve(
    repo: &RepoRef,
    opts: &HubOptions,
    progress: &mut dyn FnMut(&FetchProgress),
) -> Result<PathBuf, HubError> {
    if let Some(snap) = cached_snapshot(&opts.cache, repo) {
        return Ok(snap);
    }
    if opts.offline {
        return Err(HubError::NotCached {
            repo: repo.to_string(),
            cache: opts.cache.clone(),
        });
    }
    download(repo, opts, progress)
}

/// One cached repository, as `huggingface_hub.scan_cache_dir` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedRepo {
    pub repo_id: String,
    pub repo_type: String,
    pub path: PathBuf,
    /// Bytes of its blobs.
    pub size_on_disk: u64,
    /// Files across its snapshots.
    pub nb_files: usize,
    pub last_modified: Option<std::time::SystemTime>,
    pub last_accessed: Option<std::time::SystemTime>,
}

/// Every repository in the cache (`models--`, `datasets--`, `spaces--` folders).
pub fn scan_cache(cache: &Path) -> Result<Vec<CachedRepo>, HubError> {
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(cache) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io_err(cache, e)),
    };
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some((kind, rest)) = name.split_once("--") else {
            continue;
        };
        let repo_type = match kind {
            "models" => "model",
            "datasets" => "dataset",
            "spaces" => "space",
            _ => continue,
        };
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        let (mut size, mut modified, mut accessed) = (0u64, None, None);
        if let Ok(blobs) = std::fs::read_dir(path.join("blobs")) {
            for b in blobs.flatten() {
                if let Ok(m) = b.metadata() {
                    size += m.len();
                    modified = modified.max(m.modified().ok());
                    accessed = accessed.max(m.accessed().ok());
                }
            }
        }
        let mut nb_files = 0;
        if let Ok(snaps) = std::fs::read_dir(path.join("snapshots")) {
            for s in snaps.flatten() {
                nb_files += count_files(&s.path());
            }
        }
        out.push(CachedRepo {
            repo_id: rest.replace("--", "/"),
            repo_type: repo_type.into(),
            path,
            size_on_disk: size,
            nb_files,
            last_modified: modified,
            last_accessed: accessed,
        });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |rd| {
        rd.flatten()
            .map(|e| {
                let p = e.path();
                if p.is_dir() && !e.file_type().is_ok_and(|t| t.is_symlink()) {
                    count_files(&p)
                } else {
                    1
                }
            })
            .sum()
    })
}

/// Removes a cached repository's folder (every revision), as `mlx_lm.manage --delete` does.
pub fn delete_repo(repo: &CachedRepo) -> Result<(), HubError> {
    std::fs::remove_dir_all(&repo.path).map_err(|e| io_err(&repo.path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let r = RepoRef::parse("HuggingFaceTB/SmolLM2-360M-Instruct").unwrap();
        assert_eq!(r.revision, "main");
        assert_eq!(
            r.folder_name(),
            "models--HuggingFaceTB--SmolLM2-360M-Instruct"
        );
        let r = RepoRef::parse("mlx-community/Qwen3-0.6B-4bit@refs/pr/1").unwrap();
        assert_eq!(r.revision, "refs/pr/1");
        for bad in [
            "noslash", "a/b/c", "../x", "a/..", "a--b/c", "a/b@", "a/b@../x", "a/b@x y", "/a/b",
            "a/.b",
        ] {
            assert!(RepoRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn patterns() {
        for f in [
            "config.json",
            "model.safetensors",
            "model-00001-of-00002.safetensors",
            "tokenizer.model",
            "chat_template.jinja",
            "sub/dir/x.json",
        ] {
            assert!(wanted(f), "{f}");
        }
        for f in [
            "modeling_x.py",
            "pytorch_model.bin",
            "consolidated.safetensors",
            ".gitattributes",
        ] {
            assert!(!wanted(f), "{f}");
        }
        assert!(safe_relative("a/b.json"));
        assert!(!safe_relative("../a"));
        assert!(!safe_relative("/etc/passwd"));
        assert!(!safe_relative("a/../../b"));
    }
}

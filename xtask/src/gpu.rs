//! `cargo xtask gpu pack|run`: the one entry point to the GPU recipe of `xtask/gpu`.
//!
//! The scripts stay the implementation (`prepare_product.sh`, `prepare_product_c.sh`,
//! `product_setup.sh`, `product.sh`); this dispatcher runs them with the right environment,
//! checks what a device call would carry, and prints the device command lines.
//!
//! A device call carries the checkout it was started in (tracked files and untracked files git
//! does not ignore) plus the folders named in `carry`, 64 MiB in all. The checkout goes sparse
//! (without `mlx-models/tests/` and `mlx-train/tests/`, the large fixture folders the device
//! runs never read; `product.sh` unpacks the three fixtures its test needs from the bundle),
//! and each call carries one half of the bundle: `.gpu/a` (libmlx with its sm_90 kernels, the
//! CUDA wheel's support files, the mlx and mlx-lm wheels, the tokenizer, `product_setup.sh`)
//! in call 1, `.gpu/c` (the release `mlx` and the `graph_decode_cuda` test built with `cuda`,
//! the fixtures, `product.sh`) in call 2.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bindings::workspace_root;

/// What one device call may carry: the working tree plus the carried folders.
pub const CARRY_LIMIT: u64 = 64 << 20;

/// Folders a sparse checkout for the device leaves out (fixtures only the CPU test suite reads).
pub const SPARSE_EXCLUDED: &[&str] = &["mlx-models/tests/", "mlx-train/tests/"];

/// The bundle's two halves: (folder under the destination, device command of its call).
const CALLS: &[(&str, &str)] = &[
    ("a", "bash .gpu/a/product_setup.sh"),
    ("c", "bash .gpu/c/product.sh"),
];

const USAGE: &str =
    "usage: cargo xtask gpu pack [--tmp DIR --tok DIR] [--from-a DIR] [--check-only] \
                     | gpu run [--exec] [setup|bench] [NAME=VALUE ...]\n\
  pack: builds the bundle under .gpu/ (with --tmp and --tok: all of it through \
xtask/gpu/prepare_product.sh; without them: only .gpu/c through prepare_product_c.sh, \
reusing .gpu/a or --from-a DIR), then checks each call's carried size (sparse checkout + one \
half) against 64 MiB and prints the sparse-checkout commands. --check-only: no build.\n\
  run: prints the two device calls (carry and command line; NAME=VALUE pairs such as \
MODELS=llama-135m-bf16 ROUNDS=3 go before the scripts). --exec: runs the named call's script \
here (a machine with the GPU and the image's venv), OUT defaulting to .gpu/out.";

/// `cargo xtask gpu ARGS`.
pub fn run(args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        Some("pack") => pack(&args[1..]),
        Some("run") => run_calls(&args[1..]),
        Some("--help" | "-h" | "help") => {
            println!("{USAGE}");
            Ok(())
        }
        _ => Err(USAGE.into()),
    }
}

#[derive(Debug, Default, PartialEq)]
struct PackArgs {
    tmp: Option<String>,
    tok: Option<String>,
    from_a: Option<String>,
    check_only: bool,
}

fn parse_pack(args: &[String]) -> Result<PackArgs, String> {
    let mut p = PackArgs::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("gpu pack: {name} needs a value\n{USAGE}"))
        };
        match a.as_str() {
            "--tmp" => p.tmp = Some(value("--tmp")?),
            "--tok" => p.tok = Some(value("--tok")?),
            "--from-a" => p.from_a = Some(value("--from-a")?),
            "--check-only" => p.check_only = true,
            other => return Err(format!("gpu pack: unknown argument `{other}`\n{USAGE}")),
        }
    }
    if p.tmp.is_some() != p.tok.is_some() {
        return Err("gpu pack: --tmp and --tok go together (the full bundle needs both)".into());
    }
    Ok(p)
}

fn pack(args: &[String]) -> Result<(), String> {
    let p = parse_pack(args)?;
    let root = workspace_root();
    let dest = root.join(".gpu");
    if !p.check_only {
        let (script, env): (&str, Vec<(&str, String)>) = match (&p.tmp, &p.tok) {
            (Some(tmp), Some(tok)) => (
                "xtask/gpu/prepare_product.sh",
                vec![("TMP", tmp.clone()), ("TOK", tok.clone())],
            ),
            _ => {
                let a = p
                    .from_a
                    .clone()
                    .unwrap_or_else(|| dest.join("a").display().to_string());
                if !Path::new(&a).join("product_setup.sh").is_file() {
                    return Err(format!(
                        "gpu pack: {a} holds no earlier .gpu/a (product_setup.sh missing): pass \
                         --tmp DIR --tok DIR for the whole bundle, or --from-a DIR"
                    ));
                }
                ("xtask/gpu/prepare_product_c.sh", vec![("A", a)])
            }
        };
        eprintln!("gpu pack: bash {script}");
        let status = Command::new("bash")
            .arg(script)
            .current_dir(&root)
            .env("DEST", &dest)
            .envs(env)
            .status()
            .map_err(|e| format!("gpu pack: starting bash {script}: {e}"))?;
        if !status.success() {
            return Err(format!("gpu pack: {script} failed ({status})"));
        }
    }
    let checkout = sparse_checkout_bytes(&root)?;
    let mut failures = Vec::new();
    println!(
        "sparse checkout (without {}): {}",
        SPARSE_EXCLUDED.join(", "),
        mib(checkout)
    );
    for (half, cmd) in CALLS {
        let dir = dest.join(half);
        if !dir.is_dir() {
            failures.push(format!(
                "{}: missing (build it with `cargo xtask gpu pack`)",
                dir.display()
            ));
            continue;
        }
        let bundle = dir_bytes(&dir)?;
        let total = checkout + bundle;
        let verdict = if total < CARRY_LIMIT {
            "fits"
        } else {
            "TOO LARGE"
        };
        println!(
            "call `{cmd}`: checkout {} + .gpu/{half} {} = {} of {}: {verdict}",
            mib(checkout),
            mib(bundle),
            mib(total),
            mib(CARRY_LIMIT)
        );
        if total >= CARRY_LIMIT {
            failures.push(format!(
                ".gpu/{half}: {} carried, over {}",
                mib(total),
                mib(CARRY_LIMIT)
            ));
        }
    }
    println!("{}", sparse_commands());
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("gpu pack: {}", failures.join("; ")))
    }
}

/// The commands that make the checkout the device tool sends sparse (and undo it).
pub fn sparse_commands() -> String {
    let excluded: Vec<String> = SPARSE_EXCLUDED.iter().map(|p| format!("'!/{p}'")).collect();
    format!(
        "In the checkout the device tool sends (once; the bundle must be ignored there):\n  \
         grep -qx '/.gpu/' .git/info/exclude || echo /.gpu/ >> .git/info/exclude\n  \
         git sparse-checkout set --no-cone '/*' {}\n\
         and afterwards: git sparse-checkout disable",
        excluded.join(" ")
    )
}

/// Bytes of what a device call sends of `root` once it is sparse: tracked files and untracked
/// files git does not ignore, less [`SPARSE_EXCLUDED`].
pub fn sparse_checkout_bytes(root: &Path) -> Result<u64, String> {
    let out = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(root)
        .output()
        .map_err(|e| format!("git ls-files in {}: {e}", root.display()))?;
    if !out.status.success() {
        return Err(format!(
            "git ls-files in {}: {}",
            root.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let mut total = 0;
    for name in out.stdout.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name = String::from_utf8_lossy(name);
        if SPARSE_EXCLUDED.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        // A tracked file deleted from the work tree travels as nothing.
        if let Ok(m) = std::fs::symlink_metadata(root.join(name.as_ref())) {
            total += m.len();
        }
    }
    Ok(total)
}

/// Bytes of every file under `dir`.
pub fn dir_bytes(dir: &Path) -> Result<u64, String> {
    let mut total = 0;
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for e in entries {
        let e = e.map_err(|e| format!("{}: {e}", dir.display()))?;
        let m = e
            .metadata()
            .map_err(|err| format!("{}: {err}", e.path().display()))?;
        total += if m.is_dir() {
            dir_bytes(&e.path())?
        } else {
            m.len()
        };
    }
    Ok(total)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

#[derive(Debug, PartialEq)]
struct RunArgs {
    exec: bool,
    calls: Vec<usize>,
    env: Vec<(String, String)>,
}

fn parse_run(args: &[String]) -> Result<RunArgs, String> {
    let mut r = RunArgs {
        exec: false,
        calls: Vec::new(),
        env: Vec::new(),
    };
    for a in args {
        match a.as_str() {
            "--exec" => r.exec = true,
            "setup" => r.calls.push(0),
            "bench" => r.calls.push(1),
            other => match other.split_once('=') {
                Some((k, v))
                    if !k.is_empty()
                        && k.chars()
                            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_') =>
                {
                    r.env.push((k.to_string(), v.to_string()))
                }
                _ => return Err(format!("gpu run: unknown argument `{other}`\n{USAGE}")),
            },
        }
    }
    if r.calls.is_empty() {
        r.calls = (0..CALLS.len()).collect();
    }
    Ok(r)
}

/// The device command line of call `i` with `env` before it.
fn command_line(i: usize, env: &[(String, String)]) -> String {
    let mut s: Vec<String> = env
        .iter()
        .map(|(k, v)| format!("{k}={}", quote(v)))
        .collect();
    s.push(CALLS[i].1.to_string());
    s.join(" ")
}

fn quote(v: &str) -> String {
    if !v.is_empty()
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.,:/=+@".contains(c))
    {
        v.to_string()
    } else {
        format!("'{}'", v.replace('\'', r"'\''"))
    }
}

fn run_calls(args: &[String]) -> Result<(), String> {
    let r = parse_run(args)?;
    let root = workspace_root();
    for &i in &r.calls {
        let (half, _) = CALLS[i];
        let line = command_line(i, &r.env);
        if !r.exec {
            println!(
                "device call {} (kind nvidia-h200, carry [\".gpu/{half}\"]):\n  {line}",
                i + 1
            );
            continue;
        }
        if !root.join(".gpu").join(half).is_dir() {
            return Err(format!(
                "gpu run: {} is missing: run `cargo xtask gpu pack` first",
                root.join(".gpu").join(half).display()
            ));
        }
        let out: PathBuf = std::env::var_os("OUT")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join(".gpu/out"));
        std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
        eprintln!("gpu run: {line} (OUT={})", out.display());
        let status = Command::new("bash")
            .args(["-c", &line])
            .current_dir(&root)
            .env("OUT", &out)
            .status()
            .map_err(|e| format!("gpu run: starting bash: {e}"))?;
        if !status.success() {
            return Err(format!("gpu run: `{line}` failed ({status})"));
        }
    }
    if !r.exec {
        println!(
            "Make both calls back to back (a machine stays warm 30 s after a call); results land \
             in $OUT. `cargo xtask gpu pack` first."
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn pack_arguments() {
        assert_eq!(parse_pack(&[]).unwrap(), PackArgs::default());
        let p = parse_pack(&strs(&["--tmp", "/t", "--tok", "/k"])).unwrap();
        assert_eq!(
            (p.tmp.as_deref(), p.tok.as_deref()),
            (Some("/t"), Some("/k"))
        );
        assert!(parse_pack(&strs(&["--tmp", "/t"]))
            .unwrap_err()
            .contains("--tok"));
        assert!(parse_pack(&strs(&["--from-a"]))
            .unwrap_err()
            .contains("needs a value"));
        assert!(parse_pack(&strs(&["--bogus"]))
            .unwrap_err()
            .contains("`--bogus`"));
    }

    #[test]
    fn run_lines_put_the_environment_before_each_script() {
        let r = parse_run(&strs(&["MODELS=llama-135m-bf16 llama-135m-q4", "ROUNDS=3"])).unwrap();
        assert_eq!(r.calls, vec![0, 1]);
        assert_eq!(
            command_line(1, &r.env),
            "MODELS='llama-135m-bf16 llama-135m-q4' ROUNDS=3 bash .gpu/c/product.sh"
        );
        let r = parse_run(&strs(&["setup", "--exec"])).unwrap();
        assert_eq!((r.calls, r.exec), (vec![0], true));
        assert_eq!(command_line(0, &[]), "bash .gpu/a/product_setup.sh");
        assert!(parse_run(&strs(&["lower=1"])).is_err());
    }

    #[test]
    fn the_sparse_checkout_and_each_half_fit_one_call() {
        // The checkout alone must leave room for the larger half of the bundle (~23 MiB).
        let root = workspace_root();
        let sparse = sparse_checkout_bytes(&root).unwrap();
        assert!(sparse > 0);
        assert!(
            sparse + (24 << 20) < CARRY_LIMIT,
            "the sparse checkout is {}: no room left for .gpu/a",
            mib(sparse)
        );
        let cmds = sparse_commands();
        assert!(
            cmds.contains("'!/mlx-models/tests/' '!/mlx-train/tests/'"),
            "{cmds}"
        );
    }
}

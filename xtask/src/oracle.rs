//! The Python oracle (mlx-lm 0.32.2 on mlx 0.32.4) in `target/oracle-venv`, and the golden
//! generators under `xtask/oracle/goldens_<set>.py` that run inside it.

use std::path::PathBuf;
use std::process::Command;

use crate::bindings::workspace_root;

/// `target/oracle-venv`, or `MLX_ORACLE_VENV` to share one venv between checkouts.
fn venv_dir() -> PathBuf {
    std::env::var_os("MLX_ORACLE_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target").join("oracle-venv"))
}

fn venv_python() -> PathBuf {
    venv_dir().join("bin").join("python")
}

fn oracle_dir() -> PathBuf {
    workspace_root().join("xtask").join("oracle")
}

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("{what}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status})"))
    }
}

const CHECK: &str = "import mlx.core as mx, mlx_lm; \
    assert mx.__version__ == '0.32.4', mx.__version__; \
    assert mlx_lm.__version__ == '0.32.2', mlx_lm.__version__";

/// Creates the venv with the pinned oracle unless it is already there; returns its python.
pub fn ensure() -> Result<PathBuf, String> {
    let py = venv_python();
    if py.is_file()
        && Command::new(&py)
            .args(["-c", CHECK])
            .status()
            .is_ok_and(|s| s.success())
    {
        return Ok(py);
    }
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    run(
        Command::new(&python).args(["-m", "venv"]).arg(venv_dir()),
        "creating the oracle venv",
    )?;
    run(
        Command::new(&py)
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "-q",
                "-r",
            ])
            .arg(oracle_dir().join("requirements.txt")),
        "installing the oracle (pip install -r xtask/oracle/requirements.txt)",
    )?;
    run(
        Command::new(&py).args(["-c", CHECK]),
        "checking the oracle's versions",
    )?;
    Ok(py)
}

fn all_sets() -> Result<Vec<String>, String> {
    let mut sets: Vec<String> = std::fs::read_dir(oracle_dir())
        .map_err(|e| format!("reading xtask/oracle: {e}"))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix("goldens_")?
                .strip_suffix(".py")
                .map(str::to_string)
        })
        .collect();
    sets.sort();
    Ok(sets)
}

/// `cargo xtask goldens [SET ...]`: runs `xtask/oracle/goldens_<set>.py` (all sets if none
/// named) with the oracle's python, from the workspace root.
pub fn goldens(sets: &[String]) -> Result<(), String> {
    let py = ensure()?;
    let sets = if sets.is_empty() {
        all_sets()?
    } else {
        sets.to_vec()
    };
    for set in sets {
        let script: PathBuf = oracle_dir().join(format!("goldens_{set}.py"));
        if !script.is_file() {
            return Err(format!(
                "no generator {} (sets: {:?})",
                script.display(),
                all_sets()?
            ));
        }
        eprintln!("goldens: {set}");
        run(
            Command::new(&py)
                .arg(&script)
                .current_dir(workspace_root())
                .env("PYTHONPATH", oracle_dir()),
            &format!("generating goldens `{set}`"),
        )?;
    }
    Ok(())
}

/// `cargo xtask oracle [ARGS]`: runs the oracle's python with ARGS (after ensuring it).
pub fn python(args: &[String]) -> Result<(), String> {
    let py = ensure()?;
    run(
        Command::new(py).args(args).current_dir(workspace_root()),
        "oracle python",
    )
}

/// `port-check DIR [--ids ...]`: runs `mlx-models/examples/port_check.rs` (which runs
/// `xtask/oracle/port_check.py` in the oracle venv) on DIR: the first layer and sub-step whose
/// hidden state differs from mlx-lm's.
/// Without arguments: every model type of mlx-lm's `models/` against `mlx models --json`
/// (`xtask/oracle/port_types.py`), failing on a type neither served nor listed with a reason.
pub fn port_check(args: &[String]) -> Result<(), String> {
    let py = ensure()?;
    if args.is_empty() {
        let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(workspace_root())
            .args([
                "run", "-q", "-p", "mlx-cli", "--bin", "mlx", "--", "models", "--json",
            ])
            .output()
            .map_err(|e| format!("running `mlx models --json`: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "`mlx models --json` failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let listing = std::env::temp_dir().join(format!("mlx-models-{}.json", std::process::id()));
        std::fs::write(&listing, &out.stdout)
            .map_err(|e| format!("writing {}: {e}", listing.display()))?;
        let result = run(
            Command::new(&py)
                .arg(oracle_dir().join("port_types.py"))
                .arg(&listing)
                .current_dir(workspace_root()),
            "port_types.py",
        );
        std::fs::remove_file(&listing).ok();
        return result;
    }
    let venv = py
        .parent()
        .and_then(|bin| bin.parent())
        .map(PathBuf::from)
        .ok_or("oracle venv path")?;
    run(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(workspace_root())
            .args([
                "run",
                "-q",
                "-p",
                "mlx-models",
                "--example",
                "port_check",
                "--",
            ])
            .args(args)
            .env("MLX_ORACLE_VENV", venv),
        "port_check",
    )
}

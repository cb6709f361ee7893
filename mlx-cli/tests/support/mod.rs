//! What the `mlx` command's test files share.

use std::process::Command;

/// Runs the built `mlx` with `args`: its exit code (-1 when killed by a signal), stdout and
/// stderr.
pub fn mlx(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mlx"))
        .args(args)
        .output()
        .expect("run mlx");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

//! Run paths for the `mlx` binary and the library's test binaries (see `mlx-sys/rpaths.rs`),
//! and packed relative relocations for the binary where the toolchain here makes them.
include!("../mlx-sys/rpaths.rs");

use std::path::PathBuf;
use std::process::Command;

fn main() {
    emit_rpaths("");
    if packs_relative_relocs() {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether the binary is linked with `-z pack-relative-relocs` (`DT_RELR`: binutils 2.38+,
/// lld 15+, glibc 2.36+). A position-independent `mlx` carries ~44k relative relocations;
/// as `.rela.dyn` entries (24 bytes each) the dynamic linker reads ~1 MB of them at every start,
/// resident for the whole run (issue #31's peak memory counts the process's touched pages),
/// where `DT_RELR` packs them into a few KB. Nothing else changes. Only for a native Linux/glibc
/// build, and only where a tiny C program linked with the flag here both links and runs (an
/// older linker ignores the flag; an older glibc cannot load the result, so then it is left
/// off). `MLX_NO_RELR=1` leaves it off.
fn packs_relative_relocs() -> bool {
    println!("cargo:rerun-if-env-changed=MLX_NO_RELR");
    println!("cargo:rerun-if-env-changed=CC");
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    if env("MLX_NO_RELR") == "1"
        || env("CARGO_CFG_TARGET_OS") != "linux"
        || env("CARGO_CFG_TARGET_ENV") != "gnu"
        || env("TARGET") != env("HOST")
    {
        return false;
    }
    let Ok(out) = std::env::var("OUT_DIR").map(PathBuf::from) else {
        return false;
    };
    let src = out.join("relr_probe.c");
    let exe = out.join("relr_probe");
    if std::fs::write(&src, "int main(void) { return 0; }\n").is_err() {
        return false;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let linked = Command::new(cc)
        .args(["-fPIE", "-pie", "-Wl,-z,pack-relative-relocs", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .is_ok_and(|o| o.status.success());
    linked && Command::new(&exe).status().is_ok_and(|s| s.success())
}

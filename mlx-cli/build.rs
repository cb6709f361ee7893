//! Run paths for the `mlx` binary and the library's test binaries (see `mlx-sys/rpaths.rs`),
//! packed relative relocations for the binary where the toolchain here makes them, and, in
//! release builds, a position-dependent binary with its functions in the order a run touches
//! them (`link-order/`).
include!("../mlx-sys/rpaths.rs");

use std::path::PathBuf;
use std::process::Command;

fn main() {
    emit_rpaths("");
    if packs_relative_relocs() {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    if links_non_pie() {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
    if let Some(order) = symbol_order() {
        println!("cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={order}");
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
}

/// The symbol ordering file for a release `mlx` (`link-order/mlx.order`, made by
/// `link-order/make.sh` from traces of the functions `mlx generate` runs execute): the ~2.6k
/// functions (2.7 MiB) those runs execute sit together at the front of the text instead of
/// spread over all 18 MiB of it. The kernel maps code in 64 KiB windows around every page
/// fault, so a one-token run had ~180 windows (~10 MiB) of the binary resident; ordered, ~36
/// (~2 MiB): issue #31's peak memory counts the process's resident pages. Only the layout
/// changes: the same functions, the same code. Names the file lacks (new or renamed
/// functions) are placed after it as before, so a stale file costs memory, never correctness.
/// Only where rustc, with this build's flags and linker, links a tiny program with the option
/// (lld: Rust's default linker on x86_64 Linux since 1.90; GNU ld before 2.43 has no such
/// option); `MLX_NO_LINK_ORDER=1` leaves it off. Debug builds (the tests) never use it.
fn symbol_order() -> Option<String> {
    println!("cargo:rerun-if-env-changed=MLX_NO_LINK_ORDER");
    println!("cargo:rerun-if-changed=link-order/mlx.order");
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    let order = PathBuf::from(env("CARGO_MANIFEST_DIR")).join("link-order/mlx.order");
    let order_arg = order.to_str()?.to_owned();
    if env("MLX_NO_LINK_ORDER") == "1"
        || env("PROFILE") != "release"
        || env("CARGO_CFG_TARGET_OS") != "linux"
        || !order.is_file()
        || order_arg.contains(',')
    {
        return None;
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR")?);
    let src = out.join("order_probe.rs");
    let list = out.join("order_probe.order");
    std::fs::write(&src, "fn main() {}\n").ok()?;
    std::fs::write(&list, "main\n").ok()?;
    let mut rustc = Command::new(std::env::var_os("RUSTC")?);
    rustc.arg("--target").arg(env("TARGET"));
    for flag in env("CARGO_ENCODED_RUSTFLAGS")
        .split('\x1f')
        .filter(|f| !f.is_empty())
    {
        rustc.arg(flag);
    }
    if let Some(linker) = std::env::var_os("RUSTC_LINKER") {
        rustc.arg("-C").arg(format!("linker={}", linker.to_str()?));
    }
    let linked = rustc
        .arg("-C")
        .arg(format!(
            "link-arg=-Wl,--symbol-ordering-file={}",
            list.to_str()?
        ))
        .args(["-C", "link-arg=-Wl,--no-warn-symbol-ordering", "-o"])
        .arg(out.join("order_probe"))
        .arg(&src)
        .output()
        .is_ok_and(|o| o.status.success());
    linked.then_some(order_arg)
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

/// Whether the release `mlx` links as a position-dependent executable (`-no-pie`, after the
/// `-pie` rustc passes: the last one wins). A position-independent `mlx` has its ~44k
/// pointers in read-only-after-relocation data (`.data.rel.ro`: vtables, string and slice
/// tables, 766 KiB) rewritten by the dynamic linker at every start, so all of it is private
/// dirty memory for the whole run; linked at a fixed address those pointers are final in the
/// file, and only the pages a run reads are resident, shared with the page cache (issue #31's
/// peak memory counts the process's resident pages). The code is the same object code
/// (compiled position-independent), linked at a fixed address: the binary's own text and
/// data lose address randomization (its libraries, heap and stacks keep theirs).
/// Release builds only (the tests never use it), native Linux/glibc, and only where rustc
/// here links a tiny program with the flag that then runs; `MLX_PIE=1` leaves it off.
fn links_non_pie() -> bool {
    println!("cargo:rerun-if-env-changed=MLX_PIE");
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    if env("MLX_PIE") == "1"
        || env("PROFILE") != "release"
        || env("CARGO_CFG_TARGET_OS") != "linux"
        || env("CARGO_CFG_TARGET_ENV") != "gnu"
        || env("TARGET") != env("HOST")
    {
        return false;
    }
    let Some(out) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        return false;
    };
    let src = out.join("nopie_probe.rs");
    let exe = out.join("nopie_probe");
    if std::fs::write(&src, "fn main() {}\n").is_err() {
        return false;
    }
    let Some(rustc_bin) = std::env::var_os("RUSTC") else {
        return false;
    };
    let mut rustc = Command::new(rustc_bin);
    rustc.arg("--target").arg(env("TARGET"));
    for flag in env("CARGO_ENCODED_RUSTFLAGS")
        .split('\x1f')
        .filter(|f| !f.is_empty())
    {
        rustc.arg(flag);
    }
    if let Some(linker) = std::env::var("RUSTC_LINKER").ok().filter(|l| !l.is_empty()) {
        rustc.arg("-C").arg(format!("linker={linker}"));
    }
    let linked = rustc
        .args(["-C", "link-arg=-no-pie", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .is_ok_and(|o| o.status.success());
    linked && Command::new(&exe).status().is_ok_and(|s| s.success())
}

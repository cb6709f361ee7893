// Included by the build scripts of the crates that make binaries (`mlx-cli`, `mlx-server`):
// where those binaries look for libmlx, in order: `mlx-runtime/mlx/lib` beside the binary (a
// copied binary carries that folder along: the wheel's layout, which libmlx's own RUNPATH
// expects), `../lib/mlx-runtime/mlx/lib` (an install prefix), the copy `mlx-sys` keeps in the
// user's cache (`DEP_MLX_RUNTIME`: what `cargo install` binaries use), then the directory
// `mlx-sys` found or fetched (`DEP_MLX_LIBDIR`, inside the target directory).

/// Prints the run paths as `cargo:rustc-link-arg{kind}` (`""`: every target; `"-bins"`).
fn emit_rpaths(kind: &str) {
    let origin = if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("macos") {
        "@loader_path"
    } else {
        "$ORIGIN"
    };
    let mut dirs = vec![
        format!("{origin}/mlx-runtime/mlx/lib"),
        format!("{origin}/../lib/mlx-runtime/mlx/lib"),
    ];
    if let Ok(dir) = std::env::var("DEP_MLX_RUNTIME") {
        dirs.push(format!("{dir}/mlx/lib"));
    }
    if let Ok(dir) = std::env::var("DEP_MLX_LIBDIR") {
        dirs.push(dir);
    }
    for dir in dirs {
        println!("cargo:rustc-link-arg{kind}=-Wl,-rpath,{dir}");
    }
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIBDIR");
    println!("cargo:rerun-if-env-changed=DEP_MLX_RUNTIME");
    println!("cargo:rerun-if-changed=../mlx-sys/rpaths.rs");
}

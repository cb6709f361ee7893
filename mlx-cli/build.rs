//! Gives the `mlx` binary (and the library's test binaries) an rpath to the libmlx that `mlx-sys` found or fetched, so the
//! binary runs outside `cargo run` too (as long as that directory stays where it is).
fn main() {
    if let Ok(dir) = std::env::var("DEP_MLX_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIBDIR");
}

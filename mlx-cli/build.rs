//! Run paths for the `mlx` binary and the library's test binaries (see `mlx-sys/rpaths.rs`).
include!("../mlx-sys/rpaths.rs");

fn main() {
    emit_rpaths("");
}

//! Run paths for the `mlx-serve` binary (see `mlx-sys/rpaths.rs`).
include!("../mlx-sys/rpaths.rs");

fn main() {
    emit_rpaths("-bins");
}

//! `mlx`: the command users run.
//!
//! Text generation lands with the model slice. Until then the only subcommand is `demo`,
//! which proves the MLX runtime works on this machine: it reports the MLX version and
//! device and runs a small matrix computation, checked against the values worked out here.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use mlx_core::prelude::*;

fn demo() -> std::result::Result<(), String> {
    run_demo()
        .map_err(|e| e.to_string())?
        .then_some(())
        .ok_or_else(|| "the demo computed wrong values".to_string())
}

fn run_demo() -> Result<bool> {
    println!(
        "MLX {} on {:?}",
        mlx_core::mlx_version(),
        Device::default_device()?
    );
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    let b = ((&a.matmul(&a)? * 0.5)? + 1.0)?;
    println!("a = {a}");
    println!("a @ a * 0.5 + 1 = {b}");
    let expect = [4.5f32, 6.0, 8.5, 12.0];
    let got = b.to_vec::<f32>()?;
    if got != expect {
        eprintln!("demo computed {got:?}, expected {expect:?}");
        return Ok(false);
    }
    println!("ok: matches the values worked out by hand");
    println!("(text generation is not implemented yet; this is a runtime check only)");
    Ok(true)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("demo") => match demo() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!("usage: mlx demo\n\n  demo   check the MLX runtime (text generation is not implemented yet)");
            ExitCode::from(2)
        }
    }
}

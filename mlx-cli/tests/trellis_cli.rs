//! `mlx convert --q-mode trellis` on the tiny seeded llama: the config's quantization block,
//! the stored tensors, loading, `-d` back to dense, logits nearer the source's with more bits,
//! and the refusals.

use crate::support;
use support::mlx;

use std::path::{Path, PathBuf};

use mlx_core::prelude::*;
use mlx_models::load::{load_model_dir, LoadOptions};
use serde_json::Value;

fn src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/convert/llama")
}

fn logits(dir: &Path) -> Vec<f32> {
    let (model, _) = load_model_dir(dir, &LoadOptions::default()).unwrap();
    let ids = Array::from_slice(&[1i32, 5, 9, 17, 33, 60, 2, 4], &[1, 8]).unwrap();
    let y = model
        .forward(&ids, None)
        .unwrap()
        .astype(Dtype::Float32)
        .unwrap();
    y.eval().unwrap();
    y.as_slice::<f32>().unwrap().to_vec()
}

fn rel(a: &[f32], b: &[f32]) -> f32 {
    let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f32 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

/// `mlx convert` of `src` into `dst` as trellis `bits` at L `l` with sign seed `seed`, then
/// `extra`: the exit code, stdout and stderr.
fn convert_trellis(
    src: &Path,
    dst: &Path,
    bits: &str,
    l: &str,
    seed: &str,
    extra: &[&str],
) -> (i32, String, String) {
    let mut args = vec![
        "convert",
        "--hf-path",
        src.to_str().unwrap(),
        "--mlx-path",
        dst.to_str().unwrap(),
        "-q",
        "--q-mode",
        "trellis",
        "--q-bits",
        bits,
        "--q-trellis-l",
        l,
        "--q-seed",
        seed,
    ];
    args.extend_from_slice(extra);
    mlx(&args)
}

#[test]
fn trellis_conversions_load_dequantize_and_improve_with_bits() {
    let out = std::env::temp_dir().join(format!("mlx-trellis-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let source = logits(&src());
    let mut errors = Vec::new();
    for bits in ["2", "3", "4"] {
        let dst = out.join(format!("t{bits}"));
        let (code, stdout, stderr) = convert_trellis(&src(), &dst, bits, "10", "7", &[]);
        assert_eq!(code, 0, "{stderr}");
        assert!(stdout.contains("bits per weight"), "{stdout}");
        let config: Value =
            serde_json::from_str(&std::fs::read_to_string(dst.join("config.json")).unwrap())
                .unwrap();
        let q = &config["quantization"];
        assert_eq!(q["mode"], "trellis");
        assert_eq!(q["bits"].as_i64(), Some(bits.parse().unwrap()));
        assert_eq!(q["group_size"], 64);
        assert_eq!(q["trellis_l"], 10);
        assert_eq!(q["seed"], 7);
        // The embedding is not a linear: affine 4-bit, as its own entry.
        assert_eq!(q["model.embed_tokens"]["mode"], "affine");
        assert_eq!(q["model.embed_tokens"]["bits"], 4);
        let tensors = mlx_core::io::load_safetensors(dst.join("model.safetensors"), None)
            .unwrap()
            .0;
        let w = &tensors["model.layers.0.mlp.down_proj.weight"];
        assert_eq!(w.dtype(), Dtype::Uint32);
        assert_eq!(w.shape(), vec![64, 128 * bits.parse::<i32>().unwrap() / 32]);
        assert_eq!(
            tensors["model.layers.0.mlp.down_proj.scales"].shape(),
            vec![64, 1]
        );

        let coded = logits(&dst);
        // `-d` gives the dense matrices the trellis layers multiply by.
        let dense = out.join(format!("d{bits}"));
        let (code, _, stderr) = mlx(&[
            "convert",
            "--hf-path",
            dst.to_str().unwrap(),
            "--mlx-path",
            dense.to_str().unwrap(),
            "-d",
        ]);
        assert_eq!(code, 0, "{stderr}");
        let config: Value =
            serde_json::from_str(&std::fs::read_to_string(dense.join("config.json")).unwrap())
                .unwrap();
        assert!(config.get("quantization").is_none());
        let back = logits(&dense);
        assert!(
            rel(&coded, &back) < 2e-3,
            "{bits} bits: {}",
            rel(&coded, &back)
        );
        errors.push(rel(&coded, &source));
    }
    assert!(errors[0] > errors[1] && errors[1] > errors[2], "{errors:?}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn trellis_options_are_checked_before_loading() {
    let dst = std::env::temp_dir().join(format!("mlx-trellis-refuse-{}", std::process::id()));
    let source = src();
    for (extra, want) in [
        (vec!["--q-bits", "5"], "trellis bits"),
        (vec!["--q-trellis-l", "17"], "L must be"),
        (vec!["--quant-predicate", "mixed_2_6"], "affine"),
        (vec!["--q-group-size", "20"], "32-bit words"),
    ] {
        let mut args = vec![
            "convert",
            "--hf-path",
            source.to_str().unwrap(),
            "--mlx-path",
            dst.to_str().unwrap(),
            "-q",
            "--q-mode",
            "trellis",
        ];
        args.extend(extra.iter().copied());
        let (code, _, stderr) = mlx(&args);
        assert_ne!(code, 0, "{extra:?}");
        assert!(stderr.contains(want), "{extra:?}: {stderr}");
        assert!(!dst.exists());
    }
}

/// The second moment `X^T X / n` of `n` seeded correlated inputs of width `d`.
fn second_moment(d: i32, seed: u64) -> Array {
    let normal = |shape: &[i32], s: u64| {
        let key = mlx_core::random::key(s).unwrap();
        mlx_core::random::normal(shape, Dtype::Float32, None, None, Some(&key), None).unwrap()
    };
    let x = ops::matmul(&normal(&[256, 6], seed), &normal(&[6, d], seed + 1), None).unwrap();
    let x =
        (&x + &(&normal(&[256, d], seed + 2) * &Array::scalar(0.3f32).unwrap()).unwrap()).unwrap();
    (&ops::matmul(&x.transpose_all().unwrap(), &x, None).unwrap()
        / &Array::scalar(256.0f32).unwrap())
        .unwrap()
}

/// `--q-select-hessians`: each linear is coded under `--q-seed-candidates` seeds (default 4)
/// and keeps the least held-out error; a kept seed other than `--q-seed` is the linear's own
/// config entry, which loading and `-d` both honour; `--q-seed-candidates 1` writes what no
/// `--q-select-hessians` writes, byte for byte.
#[test]
fn held_out_hessians_choose_each_linears_seed() {
    let out = std::env::temp_dir().join(format!("mlx-trellis-select-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let tensors = mlx_core::io::load_safetensors(src().join("model.safetensors"), None)
        .unwrap()
        .0;
    let linears: Vec<(String, i32)> = tensors
        .iter()
        .filter(|(n, a)| n.ends_with("_proj.weight") && a.shape().len() == 2)
        .map(|(n, a)| (n.trim_end_matches(".weight").to_string(), a.shape()[1]))
        .collect();
    assert_eq!(linears.len(), 28);
    let write = |name: &str, seed: u64| {
        let hs: Vec<(String, Array)> = linears
            .iter()
            .enumerate()
            .map(|(i, (p, d))| {
                (
                    format!("{p}.hessian"),
                    second_moment(*d, seed + 10 * i as u64),
                )
            })
            .collect();
        let path = out.join(name);
        mlx_core::io::save_safetensors(
            &path,
            hs.iter().map(|(n, a)| (n.as_str(), a)),
            &Default::default(),
        )
        .unwrap();
        path
    };
    let (calib, held) = (
        write("calib.safetensors", 1000),
        write("held.safetensors", 5000),
    );
    let source_dir = src();
    let convert = |name: &str, extra: &[&str]| {
        let dst = out.join(name);
        let calib = ["--q-hessians", calib.to_str().unwrap()];
        let (code, stdout, stderr) = convert_trellis(
            &source_dir,
            &dst,
            "2",
            "8",
            "7",
            &[&calib[..], extra].concat(),
        );
        assert_eq!(code, 0, "{stderr}");
        (dst, stdout)
    };
    let (plain, _) = convert("plain", &[]);
    let (chosen, stdout) = convert("chosen", &["--q-select-hessians", held.to_str().unwrap()]);
    assert!(stdout.contains("seed by held-out error"), "{stdout}");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(chosen.join("config.json")).unwrap())
            .unwrap();
    let q = &config["quantization"];
    let mut own = 0;
    for (p, _) in &linears {
        if let Some(e) = q.get(p) {
            own += 1;
            assert_eq!(e["mode"], "trellis", "{p}");
            assert_eq!(e["trellis_l"], 8, "{p}");
            assert_eq!(e["bits"], 2, "{p}");
            let s = e["seed"].as_u64().unwrap();
            assert!((8..=10).contains(&s), "{p}: seed {s}");
        }
    }
    assert!(own > 0, "every linear kept --q-seed");
    // The per-linear seeds load: the coded model's logits are as near the source's as the
    // plain seed's, and `-d` (which decodes with the recorded seeds) gives the same logits.
    let source = logits(&src());
    let (a, b) = (logits(&chosen), logits(&plain));
    assert!(
        rel(&a, &source) < 1.5 * rel(&b, &source),
        "{} vs {}",
        rel(&a, &source),
        rel(&b, &source)
    );
    let dense = out.join("dense");
    let (code, _, stderr) = mlx(&[
        "convert",
        "--hf-path",
        chosen.to_str().unwrap(),
        "--mlx-path",
        dense.to_str().unwrap(),
        "-d",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(rel(&logits(&dense), &a) < 2e-3);
    // One candidate: no choice, the plain conversion's bytes.
    let (one, _) = convert(
        "one",
        &[
            "--q-select-hessians",
            held.to_str().unwrap(),
            "--q-seed-candidates",
            "1",
        ],
    );
    for f in ["model.safetensors", "config.json"] {
        assert_eq!(
            std::fs::read(one.join(f)).unwrap(),
            std::fs::read(plain.join(f)).unwrap(),
            "{f}"
        );
    }
    // Refused: no candidate, more candidates than the cap (no allocation of that size),
    // candidates without the held-out Hessians that would choose among them, and (below) a
    // choice without --q-mode trellis.
    for (n, says) in [
        ("0", "from 1"),
        ("18446744073709551615", "from 1"),
        ("65", "from 1"),
        ("8", "only with --q-select-hessians"),
    ] {
        let (code, _, stderr) = mlx(&[
            "convert",
            "--hf-path",
            src().to_str().unwrap(),
            "--mlx-path",
            out.join("x").to_str().unwrap(),
            "-q",
            "--q-mode",
            "trellis",
            "--q-seed-candidates",
            n,
        ]);
        assert!(code != 0 && stderr.contains(says), "{n}: {stderr}");
    }
    let (code, _, stderr) = mlx(&[
        "convert",
        "--hf-path",
        src().to_str().unwrap(),
        "--mlx-path",
        out.join("x").to_str().unwrap(),
        "-q",
        "--q-select-hessians",
        held.to_str().unwrap(),
    ]);
    assert!(
        code != 0 && stderr.contains("only with --q-mode trellis"),
        "{stderr}"
    );
    assert!(!out.join("x").exists());
    let _ = std::fs::remove_dir_all(&out);
}

/// `--q-trellis-v-code`: the attention value projections take their own code (each one's own
/// config entry), the rest the model's; every linear is coded alone, so the mixed model's
/// tensors are a plain conversion's under each code, and it loads.
#[test]
fn value_projections_take_their_own_code() {
    let out = std::env::temp_dir().join(format!("mlx-trellis-vcode-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let source = src();
    let convert = |name: &str, extra: &[&str]| -> (i32, String, PathBuf) {
        let dst = out.join(name);
        let (code, _, stderr) = convert_trellis(&source, &dst, "3", "10", "3", extra);
        (code, stderr, dst)
    };
    let (code, stderr, mixed) = convert(
        "mixed",
        &["--q-trellis-code", "gauss7s", "--q-trellis-v-code", "1mad"],
    );
    assert_eq!(code, 0, "{stderr}");
    let (code, stderr, g7) = convert("g7", &["--q-trellis-code", "gauss7s"]);
    assert_eq!(code, 0, "{stderr}");
    let (code, stderr, mad) = convert("mad", &["--q-trellis-code", "1mad"]);
    assert_eq!(code, 0, "{stderr}");
    // Neither code given at 3 bits (L 10): the 3-bit recipe, the mixed model bit for bit.
    let (code, stderr, default) = convert("default", &[]);
    assert_eq!(code, 0, "{stderr}");
    let config_of = |d: &Path| -> Value {
        serde_json::from_str(&std::fs::read_to_string(d.join("config.json")).unwrap()).unwrap()
    };
    assert_eq!(
        config_of(&default)["quantization"],
        config_of(&mixed)["quantization"]
    );
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(mixed.join("config.json")).unwrap()).unwrap();
    let q = &config["quantization"];
    assert_eq!(q["trellis_code"], "gauss7s");
    let tensors = |d: &Path| {
        mlx_core::io::load_safetensors(d.join("model.safetensors"), None)
            .unwrap()
            .0
    };
    let (tm, tg, ta) = (tensors(&mixed), tensors(&g7), tensors(&mad));
    let td = tensors(&default);
    assert_eq!(td.len(), tm.len());
    for (name, a) in &td {
        let eq = mlx_core::ops::array_equal(a, &tm[name], false, None)
            .unwrap()
            .item::<bool>()
            .unwrap();
        assert!(
            eq,
            "{name}: the default 3-bit conversion is not the recipe's"
        );
    }
    let mut values = 0;
    for (name, a) in &tm {
        let Some(path) = name.strip_suffix(".weight") else {
            continue;
        };
        if a.dtype() != Dtype::Uint32 || path.ends_with("embed_tokens") {
            continue;
        }
        let value = path.ends_with(".v_proj");
        let entry = &q[path];
        if value {
            values += 1;
            // 1mad is the entry's default code: the entry says trellis without a code.
            assert_eq!(entry["mode"], "trellis", "{path}");
            assert!(entry.get("trellis_code").is_none(), "{path}: {entry}");
            assert_eq!(entry["bits"], 3, "{path}");
        } else {
            assert!(entry.is_null(), "{path}: {entry}");
        }
        let want = if value { &ta[name] } else { &tg[name] };
        let eq = mlx_core::ops::array_equal(a, want, false, None)
            .unwrap()
            .item::<bool>()
            .unwrap();
        assert!(eq, "{name}: not the plain conversion's under its code");
    }
    assert!(values > 0, "no value projection in the fixture");
    assert!(logits(&mixed).iter().all(|v| v.is_finite()));
    // A value code whose shape does not hold (1mad8 wants L 8 or less) names the option.
    let (code, stderr, dst) = convert(
        "bad",
        &["--q-trellis-code", "gauss7s", "--q-trellis-v-code", "1mad8"],
    );
    assert_ne!(code, 0);
    assert!(stderr.contains("--q-trellis-v-code 1mad8"), "{stderr}");
    assert!(!dst.exists());
    let (code, _, stderr) = mlx(&[
        "convert",
        "--hf-path",
        src().to_str().unwrap(),
        "--mlx-path",
        out.join("affine").to_str().unwrap(),
        "-q",
        "--q-trellis-v-code",
        "1mad",
    ]);
    assert_ne!(code, 0);
    assert!(stderr.contains("only with --q-mode trellis"), "{stderr}");
    let _ = std::fs::remove_dir_all(&out);
}

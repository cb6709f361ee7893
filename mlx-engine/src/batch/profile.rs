//! Where the engine thread's time goes (`MLX_SERVE_PROFILE=1`): wall time of the prefill
//! slices (the MLX forward of prompts, first tokens and joins to the graph decoder), of the
//! graph decoder's joins alone, of the decode steps (forward and token choice) and of handing
//! the tokens to the rows (detokenizing, stop strings, sending). One line on stderr each time
//! the engine goes idle (so once per round of a benchmark) and when it stops; nothing is
//! measured when the variable is unset.

use std::time::{Duration, Instant};

/// One kind of work: how often, in all, the longest.
#[derive(Default, Clone, Copy)]
struct Part {
    n: usize,
    total: Duration,
    max: Duration,
}

impl Part {
    fn add(&mut self, d: Duration) {
        self.n += 1;
        self.total += d;
        self.max = self.max.max(d);
    }

    fn line(&self, name: &str) -> String {
        format!(
            "{name} {} in {:.1} ms (max {:.2})",
            self.n,
            self.total.as_secs_f64() * 1e3,
            self.max.as_secs_f64() * 1e3
        )
    }
}

/// The engine's profile since it last went idle.
#[derive(Default)]
pub(super) struct Profile {
    on: bool,
    since: Option<Instant>,
    prefill: Part,
    /// Within prefill: the prompt chunks' forwards (all rows of a group at once, their caches
    /// evaluated), and the last prompt token's step with the first tokens and the joins.
    chunk: Part,
    finish: Part,
    join: Part,
    step: Part,
    emit: Part,
    /// Rows over the decode steps.
    rows: usize,
    /// Decode steps whose tokens were picked on the graph decoder (device greedy).
    device_steps: usize,
}

impl Profile {
    pub(super) fn from_env() -> Self {
        Profile {
            on: std::env::var("MLX_SERVE_PROFILE").is_ok_and(|v| v == "1"),
            ..Default::default()
        }
    }

    pub(super) fn on(&self) -> bool {
        self.on
    }

    /// The clock for a part, when profiling.
    pub(super) fn start(&mut self) -> Option<Instant> {
        if !self.on {
            return None;
        }
        let now = Instant::now();
        self.since.get_or_insert(now);
        Some(now)
    }

    pub(super) fn prefill(&mut self, t: Option<Instant>) {
        if let Some(t) = t {
            self.prefill.add(t.elapsed());
        }
    }

    pub(super) fn chunk(&mut self, t: Option<Instant>) {
        if let Some(t) = t {
            self.chunk.add(t.elapsed());
        }
    }

    pub(super) fn finish(&mut self, t: Option<Instant>) {
        if let Some(t) = t {
            self.finish.add(t.elapsed());
        }
    }

    pub(super) fn join(&mut self, t: Option<Instant>) {
        if let Some(t) = t {
            self.join.add(t.elapsed());
        }
    }

    pub(super) fn emit(&mut self, t: Option<Instant>) {
        if let Some(t) = t {
            self.emit.add(t.elapsed());
        }
    }

    /// A decode step of `rows` rows; `device`: tokens picked on the graph decoder.
    pub(super) fn step(&mut self, t: Option<Instant>, rows: usize, device: bool) {
        if let Some(t) = t {
            self.step.add(t.elapsed());
            self.rows += rows;
            self.device_steps += usize::from(device);
        }
    }

    /// Prints the profile since the last report (`what`: why now) and starts a new one.
    pub(super) fn report(&mut self, what: &str) {
        let Some(since) = self.since.take() else {
            return;
        };
        let wall = since.elapsed().as_secs_f64() * 1e3;
        let steps = self.step.n.max(1) as f64;
        eprintln!(
            "[serve profile] {what}: wall {wall:.1} ms; {}; {}, {} (within prefill); {} (within \
             the last); {} ({} rows, \
             mean {:.2} rows, {:.3} ms a step, {} on the device greedy path); {} (within the \
             steps: {:.3} ms a step)",
            self.prefill.line("prefill slices"),
            self.chunk.line("prompt chunks"),
            self.finish
                .line("last prompt tokens with first tokens and joins"),
            self.join.line("graph joins"),
            self.step.line("decode steps"),
            self.rows,
            self.rows as f64 / steps,
            self.step.total.as_secs_f64() * 1e3 / steps,
            self.device_steps,
            self.emit.line("token hand-outs"),
            self.emit.total.as_secs_f64() * 1e3 / steps,
        );
        *self = Profile {
            on: self.on,
            ..Default::default()
        };
    }
}

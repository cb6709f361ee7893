//! `MLX_GRAPH_STEP_PROFILE=1`: where a graph-decoder run's time goes, token by token, on the
//! host (issue #30's small-model target: the token interval against the kernels' time).
//!
//! Off (the default), nothing here runs: [`StepProfile::from_env`] gives `None` and the
//! decoder reads no clock. On, [`crate::graph_decode::GraphDecoder::next_token`] notes, per
//! token: the graph launches it queued (`cuGraphLaunch`), the token reads it queued (a
//! device-to-host copy and an event each), the wait for the oldest read (the device's time
//! the host could not hide), the rest of the call, and the time between two calls (the
//! caller's: the engine, the stream's detokenizer, the benchmark's loop). Once per process
//! (the first run: `mlx benchmark`'s warm-up) the whole step is also replayed back to back
//! without reads ([`StepProfile::step_alone_us`]), the device's own time a step. Each run's
//! figures are printed to stderr when it ends, one line, as averages a token.

use std::time::Instant;

/// Whether `MLX_GRAPH_STEP_PROFILE` is set (to anything but `0` or empty), read once.
pub(crate) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var("MLX_GRAPH_STEP_PROFILE").is_ok_and(|v| !v.is_empty() && v != "0")
    })
}

/// One decoder's host-time accounts (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct StepProfile {
    model: String,
    runs: u32,
    /// The whole step replayed alone, back to back (microseconds a step), once measured.
    pub(crate) step_alone_us: Option<f64>,
    // The current run.
    tokens: u64,
    launches: u64,
    launch_us: f64,
    reads: u64,
    read_us: f64,
    wait_us: f64,
    rest_us: f64,
    caller_us: f64,
    prefix_us: f64,
    start_us: f64,
    started: Option<Instant>,
    first_token_us: f64,
    first_exit: Option<Instant>,
    last_exit: Option<Instant>,
    // The call in progress.
    call_parts_us: f64,
}

fn us(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e6
}

impl StepProfile {
    /// A profile for a decoder of `model`, or `None` where the variable is not set.
    pub(crate) fn from_env(model: &str) -> Option<Box<Self>> {
        enabled().then(|| {
            Box::new(StepProfile {
                model: model.to_string(),
                ..Self::default()
            })
        })
    }

    /// `set_prefix` took the time since `t` (a new run follows).
    pub(crate) fn prefix(&mut self, t: Instant) {
        self.prefix_us += us(t);
    }

    /// `start` (its state upload, the steps it queued) took the time since `t`.
    pub(crate) fn start(&mut self, t: Instant) {
        self.start_us += us(t);
        self.started = Some(Instant::now());
    }

    /// One graph launch took the time since `t`.
    pub(crate) fn launched(&mut self, t: Instant) {
        let d = us(t);
        self.launches += 1;
        self.launch_us += d;
        self.call_parts_us += d;
    }

    /// One token read was queued in the time since `t`.
    pub(crate) fn read_queued(&mut self, t: Instant) {
        let d = us(t);
        self.reads += 1;
        self.read_us += d;
        self.call_parts_us += d;
    }

    /// The wait for the oldest read took the time since `t`.
    pub(crate) fn waited(&mut self, t: Instant) {
        let d = us(t);
        self.wait_us += d;
        self.call_parts_us += d;
    }

    /// A `next_token` call begins: the time since the last one returned was the caller's.
    pub(crate) fn enter(&mut self) -> Instant {
        let now = Instant::now();
        if let Some(last) = self.last_exit {
            self.caller_us += now.duration_since(last).as_secs_f64() * 1e6;
        }
        self.call_parts_us = 0.0;
        now
    }

    /// The `next_token` call that began at `entered` returns a token.
    pub(crate) fn exit(&mut self, entered: Instant) {
        let now = Instant::now();
        let total = now.duration_since(entered).as_secs_f64() * 1e6;
        self.rest_us += (total - self.call_parts_us).max(0.0);
        self.tokens += 1;
        if self.tokens == 1 {
            self.first_exit = Some(now);
            if let Some(s) = self.started {
                self.first_token_us = now.duration_since(s).as_secs_f64() * 1e6;
            }
        }
        self.last_exit = Some(now);
    }

    /// The run ended (its last token taken, or a new run begins): prints its line, if it
    /// took a token, and starts the next run's accounts.
    pub(crate) fn report(&mut self) {
        // No token yet: the run's accounts (set_prefix, start) are kept.
        if self.tokens == 0 {
            return;
        }
        {
            self.runs += 1;
            let n = self.tokens as f64;
            // From the first token's return to the last's: the steady token interval.
            let span = match (self.first_exit, self.last_exit) {
                (Some(a), Some(b)) if self.tokens > 1 => {
                    format!(
                        "{:.1} us a token from the first to the last",
                        b.duration_since(a).as_secs_f64() * 1e6 / (n - 1.0)
                    )
                }
                _ => "one token".to_string(),
            };
            let alone = self.step_alone_us.map_or(String::new(), |s| {
                format!("; the whole step replayed alone: {s:.1} us")
            });
            eprintln!(
                "[graph step profile] `{}` run {}: {} tokens, {span}: launch {:.1} ({} \
                 launches), read queued {:.1}, wait {:.1}, rest of next_token {:.1}, caller \
                 {:.1} us a token; set_prefix {:.0} us, start {:.0} us, the first token {:.0} \
                 us after start{alone}",
                self.model,
                self.runs,
                self.tokens,
                self.launch_us / n,
                self.launches,
                self.read_us / n,
                self.wait_us / n,
                self.rest_us / n,
                // Gaps between calls: one fewer than the tokens.
                self.caller_us / (n - 1.0).max(1.0),
                self.prefix_us,
                self.start_us,
                self.first_token_us,
            );
        }
        let (model, runs, alone) = (
            std::mem::take(&mut self.model),
            self.runs,
            self.step_alone_us,
        );
        *self = StepProfile {
            model,
            runs,
            step_alone_us: alone,
            ..Self::default()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_accounted_then_reset() {
        let mut p = StepProfile {
            model: "llama".into(),
            ..StepProfile::default()
        };
        let t = Instant::now();
        p.prefix(t);
        p.start(t);
        for _ in 0..3 {
            let e = p.enter();
            p.launched(Instant::now());
            p.read_queued(Instant::now());
            p.waited(Instant::now());
            p.exit(e);
        }
        assert_eq!((p.tokens, p.launches, p.reads), (3, 3, 3));
        assert!(p.first_exit.is_some() && p.last_exit.is_some());
        p.step_alone_us = Some(1.0);
        p.report();
        assert_eq!((p.tokens, p.runs, p.model.as_str()), (0, 1, "llama"));
        assert_eq!(p.step_alone_us, Some(1.0));
        assert!(p.last_exit.is_none() && p.prefix_us == 0.0);
        // A run without tokens prints nothing, counts no run and keeps its accounts.
        p.prefix(t);
        p.report();
        assert_eq!(p.runs, 1);
        assert!(p.prefix_us > 0.0);
    }
}

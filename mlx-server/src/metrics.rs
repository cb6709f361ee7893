//! `GET /metrics`: counters and histograms in the Prometheus text format (0.0.4). Everything
//! is an atomic add on the request path; the text is built only when scraped. Memory figures
//! are what the engine thread last published (it owns every MLX call).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use mlx_engine::batch::EngineStats;

/// Latency bucket bounds in seconds.
const LATENCY_BOUNDS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A histogram of durations with fixed buckets.
pub struct Histogram {
    /// Per bucket (not cumulative); the last is `+Inf`.
    counts: [AtomicU64; LATENCY_BOUNDS.len() + 1],
    sum_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = LATENCY_BOUNDS
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(LATENCY_BOUNDS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut total = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            total += c.load(Ordering::Relaxed);
            let le = LATENCY_BOUNDS
                .get(i)
                .map_or_else(|| "+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {total}");
        }
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {total}");
    }
}

/// The server's own counters (the engine keeps the rest in [`EngineStats`]).
#[derive(Default)]
pub struct Metrics {
    /// Responses by endpoint and status.
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    /// From the request's arrival to its first token.
    pub ttft: Histogram,
    /// Between two tokens of one reply.
    pub itl: Histogram,
}

/// The endpoints counted by name; any other path is counted as `other` (bounded labels).
const ENDPOINTS: [&str; 8] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/models",
    "/health",
    "/metrics",
    "/",
    "/chat/completions",
];

impl Metrics {
    pub fn count_request(&self, path: &str, status: u16) {
        let endpoint = ENDPOINTS
            .iter()
            .find(|&&e| e == path)
            .copied()
            .unwrap_or("other");
        let mut m = self
            .requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *m.entry((endpoint, status)).or_insert(0) += 1;
    }

    pub fn add_tokens(&self, prompt: usize, generated: usize) {
        self.prompt_tokens
            .fetch_add(prompt as u64, Ordering::Relaxed);
        self.generated_tokens
            .fetch_add(generated as u64, Ordering::Relaxed);
    }

    /// The Prometheus text of every metric.
    pub fn render(&self, engine: &EngineStats) -> String {
        let mut out = String::with_capacity(4096);
        let load = |a: &std::sync::atomic::AtomicUsize| a.load(Ordering::Relaxed);
        out.push_str("# HELP mlx_requests_total HTTP responses by endpoint and status.\n");
        out.push_str("# TYPE mlx_requests_total counter\n");
        {
            let m = self
                .requests
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for ((endpoint, status), n) in m.iter() {
                let _ = writeln!(
                    out,
                    "mlx_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}"
                );
            }
        }
        let mut counter = |name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        };
        counter(
            "mlx_prompt_tokens_total",
            "Prompt tokens of completed requests.",
            self.prompt_tokens.load(Ordering::Relaxed),
        );
        counter(
            "mlx_generated_tokens_total",
            "Tokens generated for completed requests.",
            self.generated_tokens.load(Ordering::Relaxed),
        );
        counter(
            "mlx_prompt_cache_hits_total",
            "Requests that continued a cached prompt prefix.",
            load(&engine.prompt_cache_hits) as u64,
        );
        counter(
            "mlx_prompt_cache_reused_tokens_total",
            "Prompt tokens taken from the prompt cache.",
            load(&engine.reused_tokens) as u64,
        );
        counter(
            "mlx_prefilled_tokens_total",
            "Prompt tokens prefilled by the engine.",
            load(&engine.prefilled_tokens) as u64,
        );
        counter(
            "mlx_decode_steps_total",
            "Batched decode steps.",
            load(&engine.decode_steps) as u64,
        );
        counter(
            "mlx_decoded_rows_total",
            "Rows over all decode steps (divided by mlx_decode_steps_total: the mean batch size).",
            load(&engine.decoded_rows) as u64,
        );
        let mut gauge = |name: &str, help: &str, v: usize| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge(
            "mlx_batch_size",
            "Sequences in the running batch.",
            load(&engine.active),
        );
        gauge(
            "mlx_batch_size_max",
            "Largest batch a decode step ran with.",
            load(&engine.max_batch_seen),
        );
        gauge(
            "mlx_queued_requests",
            "Requests waiting for a batch slot.",
            load(&engine.queued),
        );
        gauge(
            "mlx_memory_active_bytes",
            "MLX active memory.",
            load(&engine.active_memory),
        );
        gauge(
            "mlx_memory_peak_bytes",
            "MLX peak memory.",
            load(&engine.peak_memory),
        );
        gauge(
            "mlx_memory_cache_bytes",
            "MLX buffer cache memory.",
            load(&engine.cache_memory),
        );
        self.ttft.render(
            &mut out,
            "mlx_time_to_first_token_seconds",
            "Time from a request's arrival to its first token.",
        );
        self.itl.render(
            &mut out,
            "mlx_inter_token_latency_seconds",
            "Time between two tokens of one reply.",
        );
        out
    }
}

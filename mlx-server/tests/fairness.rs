//! One large request does not stall the server (issue #38): while a 100k-token embeddings
//! request and an 8k-token prompt are processed, a running stream keeps getting tokens (the
//! engine alternates one slice of large work with one decode step), small requests sent
//! meanwhile are answered before the large ones finish, and the process's resident memory
//! returns near its level before once the work is done.
//!
//! The prompt is 8k tokens, not the 32k of the issue, to keep the test CI-sized: MLX's CPU
//! attention is quadratic and unfused, and a 32k prompt alone takes minutes on a loaded 2-core
//! machine. `MLX_FAIRNESS_FULL=1` runs the sizes (a 32k prompt, 50 embedding inputs of
//! 2,000 tokens), for measurements (the latency bounds are not asserted then).
//!
//! The only test of this binary: it reads the resident size of its own process, which other
//! tests running beside it would disturb.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{post, EventStream, TestServer};
use serde_json::json;

/// The engine's slice: prefill chunks of this many positions, embedding inputs of this many
/// tokens together.
const STEP: &str = "512";

/// A stream's largest gap between two tokens while the large work runs: the engine's bound is
/// one decode step plus one slice (here a 512-position chunk attending to at most 8k positions,
/// or embedding inputs of 512 tokens together, a fraction of a second on a 2-core machine).
/// Generous for a loaded machine, and far under the stall this replaced (the whole large
/// work: minutes for the request).
const GAP_BOUND: Duration = Duration::from_secs(8);

/// A small completion sent during the large work is answered within this (it waits for at
/// most a few slices, one per task ahead of it in turn).
const SMALL_BOUND: Duration = Duration::from_secs(15);

/// Resident memory after the large work may exceed the level before by at most this much, or
/// half the rise at the peak when that is more. What stays is mostly free memory at the top
/// of the engine thread's glibc arena, which `malloc_trim` does not return for a thread's
/// arena and `free` keeps below glibc's trim threshold (adaptive, at most 64 MiB), plus
/// library pages the large work touched for the first time.
const RSS_SLACK_KB: u64 = 64 * 1024;

/// A `kB` field of `/proc/self/status`.
fn status_kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn rss_kb() -> u64 {
    status_kb("VmRSS")
}

#[test]
fn large_requests_neither_stall_the_others_nor_keep_their_memory() {
    let full = std::env::var_os("MLX_FAIRNESS_FULL").is_some();
    let (prompt_len, n_inputs, input_len) = if full {
        (32_000, 50, 2000)
    } else {
        (8_000, 1000, 100)
    };
    let s = TestServer::start(&[
        "--max-context",
        "40000",
        "--prefill-step-size",
        STEP,
        "--prompt-cache-size",
        "0",
        "--max-request-tokens",
        "200000",
        "--max-tokens-limit",
        "30000",
    ]);
    let addr = s.addr;
    // Warm up every path once (first calls allocate for good).
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 4}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = post(addr, "/v1/embeddings", &json!({"input": [[5, 6, 7]]}));
    assert_eq!(r.status, 200, "{}", r.body);
    std::thread::sleep(Duration::from_millis(200));
    let rss_before = rss_kb();
    let (anon_before, file_before) = (status_kb("RssAnon"), status_kb("RssFile"));

    // Resident memory, sampled until told to stop.
    let sampling = Arc::new(AtomicBool::new(true));
    let peak = Arc::new(AtomicU64::new(rss_before));
    let sampler = {
        let (sampling, peak) = (sampling.clone(), peak.clone());
        std::thread::spawn(move || {
            while sampling.load(Ordering::SeqCst) {
                peak.fetch_max(rss_kb(), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };

    // A running stream (EOS suppressed): its token times. Its length must outlast the large
    // work: on a machine under a load average of ~200, an 8k-token stream ran out before the
    // large requests were done (their bodies are read and parsed off the engine thread while
    // the stream decodes alone), and the test failed on that alone.
    let stream_body = json!({
        "prompt": "ab", "max_tokens": 30000, "stream": true, "logit_bias": {"2": -100},
    });
    let mut stream = EventStream::open(addr, "/v1/completions", &stream_body);
    assert_eq!(stream.status, 200);
    for _ in 0..5 {
        stream.next_data().expect("the stream started");
    }
    let stop_stream = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = stop_stream.clone();
        std::thread::spawn(move || {
            let mut times = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                match stream.next_data() {
                    Some(d) if d != "[DONE]" => times.push(Instant::now()),
                    _ => break,
                }
            }
            times
        })
    };

    // The large requests: 100k tokens of embedding inputs, a long prompt.
    let start = Instant::now();
    let inputs: Vec<Vec<u32>> = (0..n_inputs)
        .map(|i| (0..input_len).map(|j| 3 + (i * 31 + j * 7) % 120).collect())
        .collect();
    let embed = std::thread::spawn(move || {
        let r = post(addr, "/v1/embeddings", &json!({ "input": inputs }));
        (r, start.elapsed())
    });
    let prompt: String = (0..prompt_len)
        .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
        .collect();
    let long = std::thread::spawn(move || {
        let r = post(
            addr,
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 2}),
        );
        (r, start.elapsed())
    });
    // Small requests while they run.
    std::thread::sleep(Duration::from_millis(300));
    let mut small = Vec::new();
    for i in 0..3 {
        let t = Instant::now();
        let r = post(
            addr,
            "/v1/completions",
            &json!({"prompt": format!("small {i}"), "max_tokens": 4}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        small.push((t.elapsed(), start.elapsed()));
        let t = Instant::now();
        let r = post(addr, "/v1/embeddings", &json!({"input": [[5, 6, 7, 8]]}));
        assert_eq!(r.status, 200, "{}", r.body);
        small.push((t.elapsed(), start.elapsed()));
    }
    let (embed_reply, embed_done) = embed.join().unwrap();
    let (long_reply, long_done) = long.join().unwrap();
    let large_end = start + embed_done.max(long_done);
    stop_stream.store(true, Ordering::SeqCst);
    let times = reader.join().unwrap();

    assert_eq!(embed_reply.status, 200, "{}", embed_reply.body);
    assert_eq!(
        embed_reply.json()["data"].as_array().unwrap().len(),
        n_inputs as usize
    );
    assert_eq!(embed_reply.json()["usage"]["prompt_tokens"], 100_000);
    assert_eq!(long_reply.status, 200, "{}", long_reply.body);
    let prompt_tokens = long_reply.json()["usage"]["prompt_tokens"]
        .as_u64()
        .unwrap();
    assert!(prompt_tokens >= prompt_len, "{prompt_tokens} prompt tokens");

    // The stream ran all along, and its gaps stayed bounded.
    let during: Vec<Instant> = times
        .iter()
        .copied()
        .filter(|&t| t >= start && t <= large_end)
        .collect();
    assert!(
        times.last().is_some_and(|&t| t >= large_end),
        "the stream ended before the large work did"
    );
    let mut worst = during.first().map_or(Duration::ZERO, |&t| t - start);
    for w in during.windows(2) {
        worst = worst.max(w[1] - w[0]);
    }
    let small_worst = small.iter().map(|s| s.0).max().unwrap();
    eprintln!(
        "large work {:.2} s (embeddings {:.2} s, {prompt_tokens}-token prompt {:.2} s); stream: {} tokens \
         meanwhile, worst gap {:.3} s; small requests: worst {:.3} s ({:?})",
        (large_end - start).as_secs_f64(),
        embed_done.as_secs_f64(),
        long_done.as_secs_f64(),
        during.len(),
        worst.as_secs_f64(),
        small_worst.as_secs_f64(),
        small
            .iter()
            .map(|s| format!("{:.3}", s.0.as_secs_f64()))
            .collect::<Vec<_>>()
    );
    assert!(
        during.len() >= 20,
        "the stream stalled: {} tokens",
        during.len()
    );
    // The sizes are for measuring: their slices (2,000-token inputs, chunks attending
    // to 32k positions) take seconds each on a loaded CPU, so only the ordering is asserted.
    if !full {
        assert!(worst <= GAP_BOUND, "worst inter-token gap {worst:?}");
        assert!(
            small_worst <= SMALL_BOUND,
            "a small request took {small_worst:?}"
        );
    }
    // The first small request finished long before the large work.
    assert!(small[0].1 < embed_done.min(long_done), "{small:?}");

    // Memory: wait until the engine is idle (it hands memory back then), then compare.
    for _ in 0..500 {
        let h = common::http(addr, "GET", "/health", &[], b"").json();
        if h["active"] == 0 && h["queued_tokens"] == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    sampling.store(false, Ordering::SeqCst);
    sampler.join().unwrap();
    let rss_after = rss_kb();
    let rss_peak = peak.load(Ordering::SeqCst).max(rss_after);
    eprintln!(
        "RSS: before {rss_before} kB, peak {rss_peak} kB, after {rss_after} kB (RssAnon {} kB, \
         RssFile {} kB; before: {anon_before} kB, {file_before} kB)",
        status_kb("RssAnon"),
        status_kb("RssFile")
    );
    let slack = RSS_SLACK_KB.max((rss_peak - rss_before) / 2);
    assert!(
        rss_after <= rss_before + slack,
        "RSS before {rss_before} kB, peak {rss_peak} kB, after {rss_after} kB"
    );
}

//! A CI-sized soak (issue #37), loopback only, bounded in count and time: 1,000 requests while
//! slowloris connections, clients that disconnect mid-stream and clients that stop reading
//! come and go, with every request answered, every row freed and memory flat; and shutdown
//! under load ending within its grace.

mod support_conn;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use support_conn::*;

/// A small request: chat or completion, streamed or not.
fn small(addr: std::net::SocketAddr, i: usize) {
    let chat = i % 2 == 0;
    let stream = i % 4 < 2;
    let (path, mut body) = if chat {
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": format!("hi {}", i % 7)}], "max_tokens": 4}),
        )
    } else {
        (
            "/v1/completions",
            json!({"prompt": format!("ab{}", i % 5), "max_tokens": 4}),
        )
    };
    if stream {
        body["stream"] = json!(true);
    }
    let r = post_json(addr, path, &body);
    assert_eq!(r.status, 200, "request {i}: {}", r.body);
    if stream {
        assert!(
            r.body.trim_end().ends_with("data: [DONE]"),
            "request {i}: {}",
            r.body
        );
    } else {
        assert!(
            r.json()["choices"][0]["finish_reason"].is_string(),
            "request {i}"
        );
    }
}

#[test]
fn a_thousand_requests_among_slow_and_vanishing_clients_keep_memory_flat() {
    let s = Srv::start(&[
        "--max-connections",
        "64",
        "--header-timeout",
        "1",
        "--write-timeout",
        "1",
        "--log-level",
        "error",
    ]);
    let addr = s.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let attacker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut held = std::collections::VecDeque::new();
            let (mut partial, mut vanished, mut stalled) = (0, 0, 0);
            let t = Instant::now();
            // Bounded in count and time.
            for i in 0..2000 {
                if stop.load(Ordering::Relaxed) || t.elapsed() > Duration::from_secs(40) {
                    break;
                }
                held.push_back(partial_head(addr));
                partial += 1;
                if held.len() > 100 {
                    held.pop_front();
                }
                if i % 10 == 0 {
                    // Disconnects mid-stream.
                    let mut r = open_stream(addr, 8000, &[]);
                    assert!(next_data(&mut r).is_some());
                    vanished += 1;
                }
                if i % 50 == 0 {
                    // Stops reading (dropped by --write-timeout), kept open meanwhile.
                    let mut r = open_stream(addr, 8000, &[("logprobs", json!(20))]);
                    assert!(next_data(&mut r).is_some());
                    held.push_back(r.into_inner());
                    stalled += 1;
                }
                std::thread::sleep(Duration::from_millis(15));
            }
            (partial, vanished, stalled)
        })
    };
    // Warm-up under the same load: buffers, thread stacks and the allocator's arenas reach
    // their working size.
    for i in 0..200 {
        small(addr, i);
    }
    let before = rss_kib();
    let t = Instant::now();
    for i in 0..1000 {
        small(addr, i);
        if i % 100 == 0 {
            assert_eq!(health(addr).status, 200, "health during the soak");
        }
    }
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (partial, vanished, stalled) = attacker.join().unwrap();
    // Every row leaves: the vanished and stalled clients' included.
    let h = health_until(addr, Duration::from_secs(30), |h| {
        h["active"] == 0 && h["queued"] == 0
    });
    assert_eq!(
        (h["active"].clone(), h["queued"].clone()),
        (json!(0), json!(0)),
        "{h}"
    );
    let after = rss_kib();
    let grew = after as i64 - before as i64;
    eprintln!(
        "1000 requests in {took:?} among {partial} partial heads, {vanished} vanished and \
         {stalled} stalled streams; RSS {before} -> {after} KiB ({grew:+} KiB)"
    );
    // Generous (the attack's own buffers come and go by several MiB): a leak of a few KiB a
    // request would pass unseen below it, but not the unbounded buffering of stalled streams
    // or held connections.
    assert!(
        grew < 32 * 1024,
        "RSS grew by {grew} KiB over 1,000 requests"
    );
}

#[test]
fn shutdown_under_load_ends_within_the_grace() {
    let mut s = Srv::start(&[
        "--shutdown-timeout",
        "3",
        "--max-tokens-limit",
        "60000",
        "--max-context",
        "60000",
        "--log-level",
        "error",
    ]);
    let addr = s.addr;
    // 8 streams that finish within the grace, 8 that cannot, half-sent and idle connections.
    let mut readers = Vec::new();
    for i in 0..16 {
        let max_tokens = if i % 2 == 0 { 200 } else { 50000 };
        let mut r = open_stream(addr, max_tokens, &[]);
        assert!(next_data(&mut r).is_some());
        readers.push(std::thread::spawn(move || (max_tokens, drain(&mut r))));
    }
    let mut partial: Vec<_> = (0..20).map(|_| partial_head(addr)).collect();
    let mut idle: Vec<_> = (0..5)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    let took = s
        .shutdown(Duration::from_secs(30))
        .expect("the server did not stop");
    assert!(took < Duration::from_secs(3 + 8), "stopping took {took:?}");
    let ends: Vec<(usize, bool)> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    for (max_tokens, done) in &ends {
        if *max_tokens == 50000 {
            assert!(!done, "a 50,000-token stream finished within the grace");
        } else {
            assert!(done, "a 200-token stream was cut within the grace");
        }
    }
    let finished = ends.iter().filter(|(_, d)| *d).count();
    for c in partial.iter_mut().chain(idle.iter_mut()) {
        assert!(closed_within(c, Duration::from_secs(1)));
    }
    eprintln!("stopped in {took:?}; {finished} of 16 streams finished, the rest were cut");
}

//! Connections under attack and interruption (issues #37 and #39), over raw HTTP/1.1 on
//! loopback: slow and idle clients are closed, `--max-connections` holds and `/health` keeps
//! answering through a slowloris attack, a client that stops reading is dropped with its
//! generation, shutdown (in-process and by signal to `mlx-serve`) ends within its grace, the
//! `Host` and `Content-Type` checks, and an OpenAI error object on every error status.

mod support_conn;

use std::io::Write;
use std::time::Duration;

use serde_json::{json, Value};
use support_conn::*;

const S: fn(u64) -> Duration = Duration::from_secs;

#[test]
fn slowloris_does_not_starve_health_and_its_connections_are_closed() {
    // A header timeout longer than the test: the connections past the cap must be closed by
    // the cap, not by the timeout.
    let s = Srv::start(&["--max-connections", "32", "--header-timeout", "60"]);
    let mut held = Vec::new();
    for round in 0..6 {
        for _ in 0..50 {
            held.push(partial_head(s.addr));
        }
        let h = health(s.addr);
        assert_eq!(h.status, 200, "round {round}: {}", h.body);
        assert_eq!(h.json()["status"], "ok");
    }
    // 300 attempted against a cap of 32 (with /health's connections among them): all but
    // the newest are closed by the server, long before their header timeout.
    let mut open = held.len();
    for _ in 0..400 {
        open = held.iter().filter(|c| !is_closed(c)).count();
        if open <= 32 {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert!(open <= 32, "{open} of 300 partial connections still open");
    // A real request still works.
    let r = post_json(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "ab", "max_tokens": 3}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn slow_heads_and_idle_keep_alive_connections_are_closed() {
    let s = Srv::start(&["--header-timeout", "1", "--keep-alive-timeout", "1"]);
    let mut partial = partial_head(s.addr);
    let mut silent = std::net::TcpStream::connect(s.addr).unwrap();
    // A keep-alive connection after a whole request and reply, then idle.
    let mut kept = send(s.addr, "GET", "/health", &[("Host", &host(s.addr))], b"");
    let mut first = [0u8; 12];
    std::io::Read::read_exact(&mut kept, &mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    for (name, c) in [
        ("partial head", &mut partial),
        ("silent", &mut silent),
        ("idle keep-alive", &mut kept),
    ] {
        assert!(closed_within(c, S(15)), "{name} connection still open");
    }
    assert_eq!(health(s.addr).status, 200);
}

#[test]
fn connections_past_the_cap_get_503_with_retry_after_when_all_are_busy() {
    let s = Srv::start(&["--max-connections", "2"]);
    let mut a = open_stream(s.addr, 8000, &[]);
    let mut b = open_stream(s.addr, 8000, &[]);
    assert!(next_data(&mut a).is_some() && next_data(&mut b).is_some());
    let r = post_json(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "ab", "max_tokens": 3}),
    );
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.head.contains("retry-after: 1"), "{}", r.head);
    assert_eq!(r.json()["error"]["code"], "too_many_connections");
    assert!(r.json()["error"]["message"].is_string());
    drop((a, b));
    // Once the streams are gone their connections close and room is made again.
    let h = health_until(s.addr, S(20), |h| h["active"] == 0);
    assert_eq!(h["active"], 0, "{h}");
    let r = post_json(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "ab", "max_tokens": 3}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn a_client_that_stops_reading_is_dropped_and_its_row_freed() {
    let mut args = vec!["--write-timeout", "1"];
    args.extend(long_args());
    let s = Srv::start(&args);
    // Large events (20 alternatives per token) fill the socket buffers (the server bounds
    // its side) long before the 50,000 tokens; the client reads the head and one event, then
    // nothing.
    let extra = [("logprobs", json!(20))];
    let mut r = open_stream(s.addr, 50000, &extra);
    assert!(next_data(&mut r).is_some());
    let h = health_until(s.addr, S(120), |h| h["active"] == 0);
    assert_eq!(h["active"], 0, "{h}");
    let steps = h["decode_steps"].as_u64().unwrap();
    assert!(steps < 50000, "the row ran to its end: {h}");
    // The server closed the connection: what it had buffered, then the end, no `[DONE]`.
    assert!(!drain(&mut r), "the stream was not cut");
    // Still serving, and the client that reads gets everything.
    let mut ok = open_stream(s.addr, 50, &[]);
    assert!(drain(&mut ok));
    eprintln!("slow reader dropped after {steps} decode steps");
}

#[test]
fn a_slow_body_gets_408_and_other_statuses_get_openai_error_objects() {
    let s = Srv::start(&["--header-timeout", "1", "--max-body-bytes", "1000"]);
    let h = host(s.addr);
    let json_ct = ("Content-Type", "application/json");
    // A body that never arrives whole.
    let mut c = std::net::TcpStream::connect(s.addr).unwrap();
    write!(
        c,
        "POST /v1/completions HTTP/1.1\r\nHost: {h}\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n{{\"prompt\""
    )
    .unwrap();
    let r = read_reply(c);
    assert_eq!(r.status, 408, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "request_timeout");

    type Case<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>, Vec<u8>, u16);
    let cases: Vec<Case> = vec![
        ("GET", "/nothing", vec![("Host", &h)], vec![], 404),
        (
            "GET",
            "/v1/chat/completions",
            vec![("Host", &h)],
            vec![],
            405,
        ),
        ("DELETE", "/health", vec![("Host", &h)], vec![], 405),
        (
            "POST",
            "/v1/completions",
            vec![("Host", &h), json_ct],
            vec![b' '; 2000],
            413,
        ),
        (
            "POST",
            "/v1/completions",
            vec![("Host", &h), ("Content-Type", "text/plain")],
            br#"{"prompt": "ab", "max_tokens": 3}"#.to_vec(),
            415,
        ),
        (
            "POST",
            "/v1/embeddings",
            vec![("Host", &h)],
            b"{}".to_vec(),
            415,
        ),
        (
            "GET",
            "/health",
            vec![("Host", "evil.example")],
            vec![],
            403,
        ),
    ];
    for (method, path, headers, body, status) in cases {
        let r = request(s.addr, method, path, &headers, &body);
        assert_eq!(r.status, status, "{method} {path}: {}", r.body);
        assert!(
            r.head.contains("content-type: application/json"),
            "{}",
            r.head
        );
        let e = r.json()["error"].clone();
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
        assert!(e["type"].is_string(), "{e}");
        assert!(e.get("param").is_some() && e.get("code").is_some(), "{e}");
        if status == 405 {
            assert!(r.head.contains("allow: "), "{}", r.head);
        }
    }
}

#[test]
fn hosts_other_than_this_server_and_non_json_bodies_are_refused() {
    let s = Srv::start(&[]);
    let port = s.addr.port().to_string();
    let body = br#"{"prompt": "ab", "max_tokens": 3}"#;
    let post = |host: &str, ct: Option<&str>| {
        let mut h = vec![("Host", host)];
        if let Some(ct) = ct {
            h.push(("Content-Type", ct));
        }
        request(s.addr, "POST", "/v1/completions", &h, body)
    };
    for host in [
        format!("127.0.0.1:{port}"),
        "127.0.0.1".into(),
        format!("localhost:{port}"),
        "localhost".into(),
        format!("[::1]:{port}"),
    ] {
        let r = post(&host, Some("application/json"));
        assert_eq!(r.status, 200, "Host {host}: {}", r.body);
    }
    let r = post(
        &format!("127.0.0.1:{port}"),
        Some("application/json; charset=utf-8"),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    for host in [
        "evil.example",
        &format!("evil.example:{port}"),
        "localhost.evil.example",
    ] {
        let r = post(host, Some("application/json"));
        assert_eq!(r.status, 403, "Host {host}: {}", r.body);
        assert_eq!(r.json()["error"]["code"], "host_not_allowed");
        let r = request(s.addr, "GET", "/v1/models", &[("Host", host)], b"");
        assert_eq!(r.status, 403, "Host {host}: {}", r.body);
    }
    // An absolute-form target names the host too.
    let r = request(
        s.addr,
        "GET",
        "http://evil.example/v1/models",
        &[("Host", "127.0.0.1")],
        b"",
    );
    assert_eq!(r.status, 403, "{}", r.body);
    // What a web page can post across sites without a preflight.
    for ct in [
        Some("text/plain"),
        Some("text/plain;charset=UTF-8"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        None,
    ] {
        let r = post("127.0.0.1", ct);
        assert_eq!(r.status, 415, "{ct:?}: {}", r.body);
        assert_eq!(r.json()["error"]["code"], "unsupported_media_type");
    }
    drop(s);
    // Names given with --allowed-hosts, or any with `*`.
    let s = Srv::start(&["--allowed-hosts", "box.lan,.example.com"]);
    for (host, status) in [
        ("box.lan:1", 200),
        ("a.example.com", 200),
        ("evil.example", 403),
    ] {
        let r = request(s.addr, "GET", "/v1/models", &[("Host", host)], b"");
        assert_eq!(r.status, status, "{host}: {}", r.body);
    }
    drop(s);
    let s = Srv::start(&["--allowed-hosts", "*"]);
    let r = request(
        s.addr,
        "GET",
        "/v1/models",
        &[("Host", "evil.example")],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

fn long_args() -> [&'static str; 4] {
    ["--max-tokens-limit", "60000", "--max-context", "60000"]
}

#[test]
fn shutdown_closes_idle_and_half_sent_connections_and_cancels_streams_past_the_grace() {
    let mut args = vec!["--shutdown-timeout", "2"];
    args.extend(long_args());
    let mut s = Srv::start(&args);
    let mut partial = partial_head(s.addr);
    let mut silent = std::net::TcpStream::connect(s.addr).unwrap();
    let mut stream = open_stream(s.addr, 50000, &[]);
    assert!(next_data(&mut stream).is_some());
    let took = s.shutdown(S(20)).expect("the server did not stop");
    assert!(took < S(2 + 8), "stopping took {took:?}");
    assert!(
        closed_within(&mut partial, S(1)),
        "half-sent connection left open"
    );
    assert!(
        closed_within(&mut silent, S(1)),
        "idle connection left open"
    );
    assert!(
        !drain(&mut stream),
        "a 50,000-token stream finished within the grace"
    );
    assert!(
        std::net::TcpStream::connect(s.addr).is_err() || {
            let mut c = std::net::TcpStream::connect(s.addr).unwrap();
            closed_within(&mut c, S(1))
        }
    );
    eprintln!("stopped in {took:?} with a half-sent request and a stream");
}

#[test]
fn shutdown_lets_a_stream_finish_within_the_grace() {
    let mut s = Srv::start(&["--shutdown-timeout", "30"]);
    let mut stream = open_stream(s.addr, 400, &[]);
    assert!(next_data(&mut stream).is_some());
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let _ = tx.send(drain(&mut stream));
    });
    let took = s.shutdown(S(40)).expect("the server did not stop");
    assert!(rx.recv_timeout(S(5)).unwrap(), "the stream did not finish");
    reader.join().unwrap();
    eprintln!("stopped in {took:?} after the stream finished");
}

#[test]
fn sigterm_with_a_half_sent_request_exits_within_the_grace_and_a_second_signal_at_once() {
    let mut args = vec!["--shutdown-timeout", "2"];
    args.extend(long_args());
    let mut b = Bin::start(&args);
    let _partial = partial_head(b.addr);
    let _silent = std::net::TcpStream::connect(b.addr).unwrap();
    let mut stream = open_stream(b.addr, 50000, &[]);
    assert!(next_data(&mut stream).is_some());
    b.signal("TERM");
    let (status, took) = b
        .wait(S(20))
        .unwrap_or_else(|| panic!("no exit after SIGTERM: {}", b.stderr.lock().unwrap()));
    assert!(status.success(), "{status}: {}", b.stderr.lock().unwrap());
    assert!(took < S(2 + 8), "exit took {took:?}");
    eprintln!("mlx-serve exited {took:?} after SIGTERM");

    // A grace longer than the test: the second signal ends it.
    let mut args = vec!["--shutdown-timeout", "600"];
    args.extend(long_args());
    let mut b = Bin::start(&args);
    let mut stream = open_stream(b.addr, 50000, &[]);
    assert!(next_data(&mut stream).is_some());
    b.signal("INT");
    // The first signal was taken (the server stops accepting) before the second is sent.
    for _ in 0..500 {
        if b.stderr.lock().unwrap().contains("shutting down") {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    b.signal("TERM");
    let (status, took) = b.wait(S(10)).unwrap_or_else(|| {
        panic!(
            "no exit after a second signal: {}",
            b.stderr.lock().unwrap()
        )
    });
    eprintln!("second signal: exit {status} after {took:?}");
    assert!(b.stderr.lock().unwrap().contains("exiting now"));
}

#[test]
fn the_error_bodies_of_the_api_are_openai_objects_for_every_json_endpoint() {
    // The three JSON endpoints refuse `text/plain` alike, and a JSON body still works.
    let s = Srv::start(&[]);
    let h = host(s.addr);
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        ),
        ("/v1/completions", json!({"prompt": "ab", "max_tokens": 2})),
    ] {
        let b = body.to_string();
        let r = request(
            s.addr,
            "POST",
            path,
            &[("Host", &h), ("Content-Type", "text/plain")],
            b.as_bytes(),
        );
        assert_eq!(r.status, 415, "{path}: {}", r.body);
        let r = post_json(s.addr, path, &body);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        let v: Value = r.json();
        assert!(v["choices"].is_array());
    }
}

//! A chat template cannot make one render build far more than its fuel pays for: this
//! binary's peak resident memory (Linux `VmHWM`; one test only, so no other test's
//! allocations mix in) stays small while a runaway `str.format` is stopped.

use mlx_engine::{ChatTemplate, ChatTemplateOptions};

/// The process's peak resident set, in bytes (`None` where `/proc` does not say).
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// `('{0}' * 100).format('x' * 3000000)` built its 300 MB result before the fuel was charged
/// (and `('{0}' * 100000).format(...)` would have asked for terabytes): each field now pays
/// for the largest argument it may print before the text is built.
#[test]
fn str_format_pays_for_repeated_arguments_before_building() {
    let t = ChatTemplate::new("{{ (('{0}' * 100).format('x' * 3000000)) | length }}").unwrap();
    let msgs = vec![serde_json::json!({"role": "user", "content": "hi"})];
    let e = t
        .render(&msgs, &ChatTemplateOptions::generation(true), &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("too much text"), "{e}");
    if let Some(peak) = peak_rss() {
        assert!(peak < 200 << 20, "peak resident memory {peak} bytes");
    }
}

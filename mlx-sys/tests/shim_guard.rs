//! Every shim entry point either runs its body inside `mlxs::guard` (or `guard_cb`, or its
//! own `try`), or cannot throw: no C++ exception may cross `extern "C"`. This reads the shim's
//! sources and checks the second kind for what can throw (allocation, strings, containers,
//! MLX calls other than plain accessors).

use std::path::Path;

/// `(name, body)` of every `mlxs_*` function defined in `src`.
fn definitions(src: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let bytes = src.as_bytes();
    let mut search = 0;
    while let Some(pos) = src[search..].find("mlxs_") {
        let start = search + pos;
        search = start + 5;
        // A definition: at the start of a line's declaration, `name(...) {`.
        let line_start = src[..start].rfind('\n').map_or(0, |i| i + 1);
        let before = &src[line_start..start];
        if before.trim().is_empty() || before.contains('=') || before.contains('(') {
            continue;
        }
        let name_end = start
            + src[start..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(0);
        let name = &src[start..name_end];
        let rest = &src[name_end..];
        if !rest.starts_with('(') {
            continue;
        }
        let Some(close) = rest.find(')') else {
            continue;
        };
        let after = rest[close + 1..].trim_start();
        if !after.starts_with('{') {
            continue;
        }
        let open = name_end + close + 1 + (rest[close + 1..].len() - after.len());
        let mut depth = 0;
        let mut end = open;
        for (i, &b) in bytes.iter().enumerate().skip(open) {
            match b {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push((name.to_string(), src[open..=end].to_string()));
        search = end;
    }
    out
}

#[test]
fn entry_points_outside_guard_cannot_throw() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("shim");
    let mut checked = 0;
    let mut problems = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "cpp") {
            continue;
        }
        let src = std::fs::read_to_string(&path).unwrap();
        for (name, body) in definitions(&src) {
            checked += 1;
            if body.contains("guard(") || body.contains("guard_cb(") || body.contains("try {") {
                continue;
            }
            // Type names in `std::holds_alternative<T>(v)` construct nothing.
            let mut body = body;
            while let Some(i) = body.find("holds_alternative<") {
                let end = body[i..].find(">(").map_or(body.len(), |e| i + e + 2);
                body.replace_range(i..end, "");
            }
            let plain_new = body.replace("new (std::nothrow)", "").contains("new ");
            for (bad, why) in [
                (plain_new, "allocates with a throwing `new`"),
                (body.contains("std::string"), "builds a std::string"),
                (body.contains("std::vector"), "builds a std::vector"),
                (
                    body.contains("make_"),
                    "allocates (make_unique/make_shared)",
                ),
                (
                    body.contains("push_back") || body.contains(".insert("),
                    "grows a container",
                ),
                (body.contains(".at("), "uses a throwing accessor"),
            ] {
                if bad {
                    problems.push(format!("{}: {name} {why} outside guard", path.display()));
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} entry points found: is the scanner broken?"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

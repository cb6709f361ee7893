//! JSON written as Python's `json.dump` writes it (what mlx-lm's files are made with): the
//! same indentation and separators, Python's `repr` of floats (`1e-05`, `1.0`), and
//! `ensure_ascii` escapes, so a file we write equals mlx-lm's byte for byte.

use serde_json::Value;

/// `json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)` (keys in the value's order;
/// no trailing newline, as `json.dump`).
pub fn dumps(value: &Value, indent: usize, ensure_ascii: bool) -> String {
    let mut out = String::new();
    write_value(&mut out, value, indent, 0, ensure_ascii);
    out
}

/// `json.dumps(value, ensure_ascii=ensure_ascii)` without `indent`: one line, `", "` and
/// `": "` separators.
pub fn dumps_inline(value: &Value, ensure_ascii: bool) -> String {
    let mut out = String::new();
    write_inline(&mut out, value, ensure_ascii);
    out
}

fn write_inline(out: &mut String, v: &Value, ascii: bool) {
    match v {
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_inline(out, item, ascii);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_str(out, k, ascii);
                out.push_str(": ");
                write_inline(out, item, ascii);
            }
            out.push('}');
        }
        scalar => write_value(out, scalar, 0, 0, ascii),
    }
}

fn newline(out: &mut String, indent: usize, level: usize) {
    out.push('\n');
    for _ in 0..indent * level {
        out.push(' ');
    }
}

fn write_value(out: &mut String, v: &Value, indent: usize, level: usize, ascii: bool) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                out.push_str(&i.to_string());
            } else if let Some(u) = n.as_u64() {
                out.push_str(&u.to_string());
            } else {
                out.push_str(&float_repr(n.as_f64().unwrap_or(f64::NAN)));
            }
        }
        Value::String(s) => write_str(out, s, ascii),
        Value::Array(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(out, indent, level + 1);
                write_value(out, item, indent, level + 1, ascii);
            }
            newline(out, indent, level);
            out.push(']');
        }
        Value::Object(map) => {
            if map.is_empty() {
                out.push_str("{}");
                return;
            }
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(out, indent, level + 1);
                write_str(out, k, ascii);
                out.push_str(": ");
                write_value(out, item, indent, level + 1, ascii);
            }
            newline(out, indent, level);
            out.push('}');
        }
    }
}

fn write_str(out: &mut String, s: &str, ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ascii && (c as u32) > 0x7e) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest digits that round-trip, fixed notation when the
/// decimal exponent is in [-4, 16), else `d.ddde±XX`.
pub fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "1.2345e-5".
    let sci = format!("{:e}", x.abs());
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mant.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if x < 0.0 { "-" } else { "" };
    let decpt = exp + 1;
    let n = digits.len() as i32;
    let body = if !(-4 < decpt && decpt <= 16) {
        let mut m = digits[..1].to_string();
        if n > 1 {
            m.push('.');
            m.push_str(&digits[1..]);
        }
        let e = decpt - 1;
        format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
    } else if decpt <= 0 {
        format!("0.{}{digits}", "0".repeat((-decpt) as usize))
    } else if decpt >= n {
        format!("{digits}{}.0", "0".repeat((decpt - n) as usize))
    } else {
        let d = decpt as usize;
        format!("{}.{}", &digits[..d], &digits[d..])
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_as_python_repr() {
        for (x, s) in [
            (1e-5, "1e-05"),
            (1e-6, "1e-06"),
            (0.0001, "0.0001"),
            (1.0, "1.0"),
            (1000000.0, "1000000.0"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (0.02, "0.02"),
            (-2.5e-7, "-2.5e-07"),
            (123456.789, "123456.789"),
            (1.5e300, "1.5e+300"),
        ] {
            assert_eq!(float_repr(x), s, "{x}");
        }
    }

    #[test]
    fn dumps_as_python() {
        let v: Value = serde_json::from_str(
            r#"{"a": [1, 2.0, {"b": null}], "c": {}, "d": [], "é": "x\u00e9\n"}"#,
        )
        .unwrap();
        assert_eq!(
            dumps(&v, 4, true),
            "{\n    \"a\": [\n        1,\n        2.0,\n        {\n            \"b\": null\n        }\n    ],\n    \"c\": {},\n    \"d\": [],\n    \"\\u00e9\": \"x\\u00e9\\n\"\n}"
        );
    }
}

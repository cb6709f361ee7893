//! A small JSON-schema checker for the tests of structured output (shared by mlx-engine's and
//! mlx-server's tests through `#[path]`): the keywords the test schemas use (`type`,
//! `properties`, `required`, `additionalProperties: false`, `enum`, `const`, `maxLength`,
//! `minLength`, `minimum`, `maximum`, `items`, `minItems`, `maxItems`, `anyOf`). A keyword it
//! does not know fails the check, so a test cannot pass by a keyword being ignored here.
#![allow(dead_code)]

use serde_json::Value;

const KNOWN: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "enum",
    "const",
    "maxLength",
    "minLength",
    "minimum",
    "maximum",
    "items",
    "minItems",
    "maxItems",
    "anyOf",
    "description",
    "title",
];

/// `Err` with the path and the problem when `v` does not satisfy `schema`.
pub fn validate(schema: &Value, v: &Value) -> Result<(), String> {
    check(schema, v, "$")
}

fn check(schema: &Value, v: &Value, at: &str) -> Result<(), String> {
    let Some(s) = schema.as_object() else {
        return match schema {
            Value::Bool(true) => Ok(()),
            _ => Err(format!("{at}: schema {schema} rejects everything")),
        };
    };
    for k in s.keys() {
        if !KNOWN.contains(&k.as_str()) {
            return Err(format!(
                "{at}: the test checker does not know keyword {k:?}"
            ));
        }
    }
    if let Some(any) = s.get("anyOf").and_then(Value::as_array) {
        if !any.iter().any(|sub| check(sub, v, at).is_ok()) {
            return Err(format!("{at}: {v} matches no anyOf branch"));
        }
    }
    if let Some(c) = s.get("const") {
        if c != v {
            return Err(format!("{at}: {v} is not the const {c}"));
        }
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            return Err(format!("{at}: {v} is not one of {e:?}"));
        }
    }
    if let Some(t) = s.get("type").and_then(Value::as_str) {
        let ok = match t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            "null" => v.is_null(),
            _ => false,
        };
        if !ok {
            return Err(format!("{at}: {v} is not of type {t}"));
        }
    }
    if let Some(x) = v.as_str() {
        let n = x.chars().count() as u64;
        if s.get("maxLength")
            .and_then(Value::as_u64)
            .is_some_and(|m| n > m)
        {
            return Err(format!("{at}: {x:?} is longer than maxLength"));
        }
        if s.get("minLength")
            .and_then(Value::as_u64)
            .is_some_and(|m| n < m)
        {
            return Err(format!("{at}: {x:?} is shorter than minLength"));
        }
    }
    if let Some(x) = v.as_f64() {
        if s.get("minimum")
            .and_then(Value::as_f64)
            .is_some_and(|m| x < m)
        {
            return Err(format!("{at}: {x} is below minimum"));
        }
        if s.get("maximum")
            .and_then(Value::as_f64)
            .is_some_and(|m| x > m)
        {
            return Err(format!("{at}: {x} is above maximum"));
        }
    }
    if let Some(a) = v.as_array() {
        let n = a.len() as u64;
        if s.get("maxItems")
            .and_then(Value::as_u64)
            .is_some_and(|m| n > m)
        {
            return Err(format!("{at}: {n} items, more than maxItems"));
        }
        if s.get("minItems")
            .and_then(Value::as_u64)
            .is_some_and(|m| n < m)
        {
            return Err(format!("{at}: {n} items, fewer than minItems"));
        }
        if let Some(items) = s.get("items") {
            for (i, x) in a.iter().enumerate() {
                check(items, x, &format!("{at}[{i}]"))?;
            }
        }
    }
    if let Some(o) = v.as_object() {
        let props = s.get("properties").and_then(Value::as_object);
        if let Some(req) = s.get("required").and_then(Value::as_array) {
            for r in req {
                let r = r.as_str().unwrap_or_default();
                if !o.contains_key(r) {
                    return Err(format!("{at}: the required property {r:?} is missing"));
                }
            }
        }
        for (k, x) in o {
            match props.and_then(|p| p.get(k)) {
                Some(sub) => check(sub, x, &format!("{at}.{k}"))?,
                None if s.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    return Err(format!("{at}: the property {k:?} is not allowed"))
                }
                None => {}
            }
        }
    }
    Ok(())
}

/// The test schema: an object with required string, integer, enum and array fields.
pub fn person_schema() -> Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "color": {"enum": ["red", "green", "blue"]},
            "tags": {
                "type": "array",
                "items": {"type": "string", "maxLength": 6},
                "maxItems": 3
            }
        },
        "required": ["name", "age", "color", "tags"],
        "additionalProperties": false
    })
}

/// `text` parsed as JSON and checked against `schema`, with the text in the message.
pub fn parse_valid(schema: &Value, text: &str) -> Result<Value, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("{text:?} is not JSON: {e}"))?;
    validate(schema, &v).map_err(|e| format!("{text:?}: {e}"))?;
    Ok(v)
}

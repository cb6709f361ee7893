//! Tool calls in generated text, for the families whose chat templates define them:
//! Qwen3 / Hermes (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`) and Llama 3
//! (a bare `{"name": ..., "parameters": ...}` reply).

use serde_json::Value;

/// One call: the function name and its arguments as a JSON string (as the OpenAI API sends
/// them).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

const START: &str = "<tool_call>";
const END: &str = "</tool_call>";

fn call_from(v: &Value) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v
        .get("arguments")
        .or_else(|| v.get("parameters"))
        .cloned()
        .unwrap_or(Value::Object(Default::default()));
    let arguments = match args {
        Value::String(s) => s,
        other => other.to_string(),
    };
    Some(ToolCall { name, arguments })
}

/// Splits `text` into the content outside tool calls and the calls. Text that only looks like
/// a call (unparsable JSON) stays content.
pub fn extract(text: &str) -> (String, Vec<ToolCall>) {
    let mut calls = Vec::new();
    let mut content = String::new();
    let mut rest = text;
    while let Some(start) = rest.find(START) {
        let after = &rest[start + START.len()..];
        let (body, next) = match after.find(END) {
            Some(end) => (&after[..end], &after[end + END.len()..]),
            None => (after, ""),
        };
        match serde_json::from_str::<Value>(body.trim())
            .ok()
            .as_ref()
            .and_then(call_from)
        {
            Some(c) => {
                content.push_str(&rest[..start]);
                calls.push(c);
            }
            None => content.push_str(&rest[..start + START.len() + body.len()]),
        }
        rest = next;
    }
    content.push_str(rest);
    if calls.is_empty() {
        let t = content.trim();
        if t.starts_with('{') {
            if let Some(c) = serde_json::from_str::<Value>(t)
                .ok()
                .as_ref()
                .and_then(call_from)
            {
                return (String::new(), vec![c]);
            }
        }
    }
    (content.trim().to_string(), calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen_markers_and_llama_json() {
        let (c, calls) =
            extract("ok <tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>");
        assert_eq!(c, "ok");
        assert_eq!(
            calls,
            vec![ToolCall {
                name: "f".into(),
                arguments: "{\"x\":1}".into()
            }]
        );
        let (c, calls) = extract("{\"name\": \"g\", \"parameters\": {}}");
        assert_eq!(c, "");
        assert_eq!(calls[0].name, "g");
        let (c, calls) = extract("<tool_call>not json</tool_call> tail");
        assert!(calls.is_empty());
        assert!(c.contains("not json"));
    }
}

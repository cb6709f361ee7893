//! Tool calls in generated text, found as `mlx_lm.server` finds them.
//!
//! - [`ToolFormat::Markers`]: mlx-lm's `json_tools` parser (Qwen3, Hermes), picked when the
//!   chat template names `<tool_call>` and `tool_call.name` (mlx-lm's `_infer_tool_parser`).
//!   The reply text runs through [`ToolText`], mlx-lm's `TextStateMachine` with its two tool
//!   transitions: text between `<tool_call>` and `</tool_call>` is a call (`json.loads` of the
//!   stripped text), the markers are removed, everything else is content. As in mlx-lm this
//!   applies whether or not the request passed `tools`, and text that does not parse is dropped.
//! - [`ToolFormat::Llama3Json`]: Llama 3.1's format, a reply that is one JSON object
//!   `{"name": ..., "parameters": ...}` (templates with `<|start_header_id|>` that describe
//!   `"parameters"`). mlx-lm 0.32.2 has no parser for it; we parse it only when the request
//!   passed `tools`, from the whole reply.

use mlx_engine::chat_template::py_json_dumps;
use serde_json::{json, Value};

/// How a model's chat template marks tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>{"name": ..., "arguments": ...}</tool_call>`.
    Markers,
    /// A whole reply `{"name": ..., "parameters": ...}`.
    Llama3Json,
}

const START: &str = "<tool_call>";
const END: &str = "</tool_call>";

/// Markers of the tool formats mlx-lm checks before `json_tools` (its `_infer_tool_parser`
/// order). We do not parse these; a template naming one gets no tool parsing rather than the
/// wrong one.
const OTHER_FORMATS: [&str; 12] = [
    "<minimax:tool_call>",
    "<|tool_call>",
    "<start_function_call>",
    "<longcat_tool_call>",
    "<arg_key>",
    "<|tool_list_start|>",
    "<|tool_call_start|>",
    "<tool_call>\\n<function=",
    "<tool_call>\n<function=",
    "<|tool_calls_section_begin|>",
    "[TOOL_CALLS]",
    "<atem:function_calls>",
];

/// The tool format a chat template defines, if any.
pub fn detect(template: &str) -> Option<ToolFormat> {
    if OTHER_FORMATS.iter().any(|m| template.contains(m))
        || (template.contains("<function name=\"") && template.contains("<param name=\""))
    {
        return None;
    }
    if template.contains(START) && template.contains("tool_call.name") {
        return Some(ToolFormat::Markers);
    }
    if template.contains("<|start_header_id|>") && template.contains("\"parameters\"") {
        return Some(ToolFormat::Llama3Json);
    }
    None
}

/// One call as the OpenAI API sends it: the function name and its arguments as a JSON string
/// (Python's `json.dumps` of them, as mlx_lm.server writes it).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

impl ToolCall {
    /// The `tool_calls` entry; `index` is set in streamed deltas.
    pub fn to_json(&self, id: String, index: Option<usize>) -> Value {
        let mut v = json!({
            "id": id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        });
        if let Some(i) = index {
            v["index"] = json!(i);
        }
        v
    }
}

fn call_from(v: &Value) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v
        .get("arguments")
        .or_else(|| v.get("parameters"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    let arguments = py_json_dumps(&args).ok()?;
    Some(ToolCall { name, arguments })
}

/// mlx-lm's `json_tools.parse_tool_call` (`json.loads(text.strip())`, an object or a list of
/// them). Text that does not parse gives no call (mlx-lm logs and drops it).
pub fn parse_calls(text: &str) -> Vec<ToolCall> {
    match serde_json::from_str::<Value>(text.trim()) {
        Ok(Value::Array(items)) => items.iter().filter_map(call_from).collect(),
        Ok(v) => call_from(&v).into_iter().collect(),
        Err(e) => {
            tracing::warn!(error = %e, "failed to parse a tool call; the text was likely truncated");
            Vec::new()
        }
    }
}

/// A reply in Llama 3's format: the whole (trimmed) text is one call object.
pub fn parse_llama3(text: &str) -> Option<ToolCall> {
    let t = text.trim();
    if !t.starts_with('{') {
        return None;
    }
    let v: Value = serde_json::from_str(t).ok()?;
    v.get("parameters").or_else(|| v.get("arguments"))?;
    call_from(&v)
}

/// What a piece of reply text gave: content, and the tool calls that closed in it (their raw
/// text, before parsing).
#[derive(Debug, Default, PartialEq)]
pub struct Split {
    pub content: String,
    pub calls: Vec<String>,
}

/// mlx-lm's `TextStateMachine` restricted to the `normal <-> tool` transitions: strips the
/// markers, holds back text that may be the start of one, and collects the text of each call.
#[derive(Debug, Default)]
pub struct ToolText {
    in_tool: bool,
    /// Text that may be the beginning of the marker that ends the current state.
    pending: String,
    /// The text of the call being read.
    tool_text: String,
}

/// Length of the longest suffix of `s` that is a proper prefix of `pat`, at a char boundary.
fn partial_suffix(s: &str, pat: &str) -> usize {
    (1..pat.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && s.ends_with(&pat[..n]))
        .unwrap_or(0)
}

impl ToolText {
    /// Whether the text so far ends inside a call.
    pub fn in_tool(&self) -> bool {
        self.in_tool
    }

    /// Consumes a chunk of decoded text (mlx-lm's `TextStateMachine.split`).
    pub fn push(&mut self, chunk: &str) -> Split {
        let mut out = Split::default();
        let mut buf = std::mem::take(&mut self.pending);
        buf.push_str(chunk);
        let mut rest = buf.as_str();
        loop {
            let marker = if self.in_tool { END } else { START };
            match rest.find(marker) {
                Some(i) => {
                    self.take(&rest[..i], &mut out);
                    if self.in_tool {
                        out.calls.push(std::mem::take(&mut self.tool_text));
                    }
                    self.in_tool = !self.in_tool;
                    rest = &rest[i + marker.len()..];
                }
                None => {
                    let keep = partial_suffix(rest, marker);
                    self.take(&rest[..rest.len() - keep], &mut out);
                    self.pending = rest[rest.len() - keep..].to_string();
                    return out;
                }
            }
        }
    }

    fn take(&mut self, text: &str, out: &mut Split) {
        if self.in_tool {
            self.tool_text.push_str(text);
        } else {
            out.content.push_str(text);
        }
    }

    /// The end of the reply: held-back text is kept when the reply was cut by the token limit
    /// (`flush`) and dropped when it stopped (`discard`); an unterminated call is still tried.
    pub fn finish(&mut self, keep_pending: bool) -> Split {
        let mut out = Split::default();
        let pending = std::mem::take(&mut self.pending);
        if keep_pending {
            self.take(&pending, &mut out);
        }
        if self.in_tool && !self.tool_text.is_empty() {
            out.calls.push(std::mem::take(&mut self.tool_text));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pieces: &[&str], keep: bool) -> (String, Vec<String>) {
        let mut t = ToolText::default();
        let (mut content, mut calls) = (String::new(), Vec::new());
        for p in pieces.iter().copied() {
            let s = t.push(p);
            content.push_str(&s.content);
            calls.extend(s.calls);
        }
        let s = t.finish(keep);
        content.push_str(&s.content);
        calls.extend(s.calls);
        (content, calls)
    }

    #[test]
    fn markers_split_across_pieces() {
        let (c, calls) = run(
            &[
                "ok <tool",
                "_call>\n{\"name\": \"f\", ",
                "\"arguments\": {\"x\": 1}}\n</tool_",
                "call> bye <",
            ],
            false,
        );
        assert_eq!(c, "ok  bye ");
        assert_eq!(calls.len(), 1);
        assert_eq!(
            parse_calls(&calls[0]),
            vec![ToolCall {
                name: "f".into(),
                arguments: "{\"x\": 1}".into()
            }]
        );
        // Cut by the token limit: the held-back "<" is content.
        assert_eq!(run(&["a <"], true).0, "a <");
        // An unterminated call is tried; unparsable text gives no call.
        let (_, calls) = run(&["<tool_call>{\"name\": \"g\", \"arguments\": {}}"], true);
        assert_eq!(parse_calls(&calls[0])[0].name, "g");
        assert!(parse_calls("{\"name\": ").is_empty());
    }

    #[test]
    fn formats_from_templates() {
        assert_eq!(
            detect("{{ '<tool_call>' }}{{ tool_call.name }}"),
            Some(ToolFormat::Markers)
        );
        assert_eq!(detect("<tool_call>\n<function=x> tool_call.name"), None);
        assert_eq!(
            detect("<|start_header_id|> {\"name\": f, \"parameters\": d}"),
            Some(ToolFormat::Llama3Json)
        );
        assert_eq!(detect("{{ messages }}"), None);
        assert_eq!(
            parse_llama3("{\"name\": \"g\", \"parameters\": {\"a\": [1, 2]}}"),
            Some(ToolCall {
                name: "g".into(),
                arguments: "{\"a\": [1, 2]}".into()
            })
        );
        assert_eq!(parse_llama3("{\"name\": \"g\"}"), None);
    }
}

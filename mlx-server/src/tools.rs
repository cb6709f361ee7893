//! Tool calls in generated text, found as `mlx_lm.server` finds them.
//!
//! - [`ToolFormat::Markers`]: mlx-lm's `json_tools` parser (Qwen3, Hermes), picked when the
//!   chat template names `<tool_call>` and `tool_call.name` (mlx-lm's `_infer_tool_parser`).
//!   The reply text runs through [`ReplyText`], mlx-lm's `TextStateMachine` with its reasoning
//!   and tool transitions: text between `<tool_call>` and `</tool_call>` is a call (`json.loads`
//!   of the stripped text), `<think>` ... `</think>` (when the tokenizer has those markers) is
//!   `reasoning`, the markers are removed, everything else is content. As in mlx-lm this
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

/// Length of the longest suffix of `s` that is a proper prefix of `pat`, at a char boundary.
fn partial_suffix(s: &str, pat: &str) -> usize {
    (1..pat.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && s.ends_with(&pat[..n]))
        .unwrap_or(0)
}

/// What a piece of reply text gave: content, reasoning, and the tool calls that closed in it
/// (their raw text, before parsing).
#[derive(Debug, Default, PartialEq)]
pub struct Split {
    pub content: String,
    pub reasoning: String,
    pub calls: Vec<String>,
}

/// Where the reply is: mlx-lm's `normal`, `reasoning` and `tool` states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Normal,
    Reasoning,
    Tool,
}

/// mlx-lm's `TextStateMachine` (`make_text_state_machine`) with its reasoning and tool
/// transitions: `<think>` ... `</think>` is reasoning, `<tool_call>` ... `</tool_call>` a call
/// (also straight from reasoning), the markers are removed, text that may be the start of a
/// marker is held back.
#[derive(Debug)]
pub struct ReplyText {
    /// The thinking markers (`<think>`, `</think>`), when the tokenizer has them.
    think: Option<(String, String)>,
    /// Whether `<tool_call>` markers are read.
    tools: bool,
    state: State,
    /// Text that may be the beginning of a marker leaving the current state.
    pending: String,
    /// The text of the call being read.
    tool_text: String,
}

impl ReplyText {
    pub fn new(think: Option<(String, String)>, tools: bool, initial: State) -> Self {
        ReplyText {
            think,
            tools,
            state: initial,
            pending: String::new(),
            tool_text: String::new(),
        }
    }

    /// Whether the text so far ends inside a call.
    pub fn in_tool(&self) -> bool {
        self.state == State::Tool
    }

    /// The markers that leave `state`, and where they lead.
    fn edges(&self) -> Vec<(&str, State)> {
        let mut out = Vec::new();
        match self.state {
            State::Normal => {
                if let Some((start, _)) = &self.think {
                    out.push((start.as_str(), State::Reasoning));
                }
                if self.tools {
                    out.push((START, State::Tool));
                }
            }
            State::Reasoning => {
                if let Some((_, end)) = &self.think {
                    out.push((end.as_str(), State::Normal));
                }
                if self.tools {
                    out.push((START, State::Tool));
                }
            }
            State::Tool => out.push((END, State::Normal)),
        }
        out
    }

    fn take(&mut self, text: &str, out: &mut Split) {
        match self.state {
            State::Normal => out.content.push_str(text),
            State::Reasoning => out.reasoning.push_str(text),
            State::Tool => self.tool_text.push_str(text),
        }
    }

    /// Consumes a chunk of decoded text (mlx-lm's `TextStateMachine.split`).
    pub fn push(&mut self, chunk: &str) -> Split {
        let mut out = Split::default();
        let mut buf = std::mem::take(&mut self.pending);
        buf.push_str(chunk);
        let mut begin = 0;
        let ends: Vec<usize> = buf.char_indices().map(|(i, c)| i + c.len_utf8()).collect();
        for end in ends {
            let hit = self
                .edges()
                .into_iter()
                .find(|(m, _)| end - begin >= m.len() && buf[begin..end].ends_with(m))
                .map(|(m, to)| (m.len(), to));
            if let Some((len, to)) = hit {
                self.take(&buf[begin..end - len], &mut out);
                if self.state == State::Tool {
                    out.calls.push(std::mem::take(&mut self.tool_text));
                }
                self.state = to;
                begin = end;
            }
        }
        let rest = &buf[begin..];
        let keep = self
            .edges()
            .iter()
            .map(|(m, _)| partial_suffix(rest, m))
            .max()
            .unwrap_or(0);
        let text = rest[..rest.len() - keep].to_string();
        self.pending = rest[rest.len() - keep..].to_string();
        self.take(&text, &mut out);
        out
    }

    /// The end of the reply: held-back text is kept when the reply was cut by the token limit
    /// (`flush`) and dropped when it stopped (`discard`); an unterminated call is still tried.
    pub fn finish(&mut self, keep_pending: bool) -> Split {
        let mut out = Split::default();
        let pending = std::mem::take(&mut self.pending);
        if keep_pending {
            self.take(&pending, &mut out);
        }
        if self.state == State::Tool && !self.tool_text.is_empty() {
            out.calls.push(std::mem::take(&mut self.tool_text));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pieces: &[&str], keep: bool) -> (String, Vec<String>) {
        run_all(pieces, keep).0
    }

    fn run_all(pieces: &[&str], keep: bool) -> ((String, Vec<String>), String) {
        let mut t = ReplyText::new(
            Some(("<think>".into(), "</think>".into())),
            true,
            State::Normal,
        );
        let (mut content, mut calls, mut reasoning) = (String::new(), Vec::new(), String::new());
        for p in pieces.iter().copied().map(Some).chain([None]) {
            let s = match p {
                Some(p) => t.push(p),
                None => t.finish(keep),
            };
            content.push_str(&s.content);
            reasoning.push_str(&s.reasoning);
            calls.extend(s.calls);
        }
        ((content, calls), reasoning)
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
        // Reasoning, then a call straight from it; a split `</think>`.
        let ((c, calls), r) = run_all(
            &[
                "<th",
                "ink>hm</thi",
                "nk>ok<tool_call>{\"name\": \"f\"}</tool_call>",
            ],
            false,
        );
        assert_eq!((c.as_str(), r.as_str(), calls.len()), ("ok", "hm", 1));
        let ((c, calls), r) = run_all(&["<think>a<tool_call>{}</tool_call>b"], false);
        assert_eq!((c.as_str(), r.as_str(), calls.len()), ("b", "a", 1));
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

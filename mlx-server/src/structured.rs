//! Structured output: `response_format` (`json_object`, `json_schema`) and `tool_choice`
//! (`"required"` or a named function) turned into a grammar for constrained decoding
//! ([`mlx_engine::grammar`]). A forced tool call is constrained to the format this server
//! parses for the model's template ([`crate::tools`]): `<tool_call>\n{"name": ..., "arguments":
//! ...}\n</tool_call>` (Qwen3, Hermes) or a whole reply `{"name": ..., "parameters": ...}`
//! (Llama 3), with the arguments matching the tool's `parameters` schema.

use std::sync::Arc;

use mlx_engine::grammar::{Grammar, GrammarCompiler, GrammarSpec};
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::state::AppState;
use crate::tools::ToolFormat;

fn field<'a>(body: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    body.get(name).filter(|v| !v.is_null())
}

/// The grammar compiler of the served model, built on first use (it walks the vocabulary).
fn compiler(state: &AppState, param: &str) -> Result<Arc<GrammarCompiler>, ApiError> {
    state
        .grammar
        .get_or_init(|| {
            GrammarCompiler::new(state.engine.tokenizer(), state.engine.vocab_size())
                .map(Arc::new)
                .map_err(Arc::new)
        })
        .clone()
        .map_err(|e| ApiError::invalid(param, e.to_string()))
}

fn compile(state: &AppState, param: &str, spec: &GrammarSpec) -> Result<Grammar, ApiError> {
    compiler(state, param)?
        .compile(spec)
        .map_err(|e| ApiError::invalid(param, format!("invalid `{param}`: {e}")))
}

/// The grammar a request asks for, if any: a forced tool call (`chat`: a chat request, the
/// only kind that takes `tool_choice`; with `tool_choice` `"required"` or a named function)
/// first, else `response_format`.
pub fn grammar(
    state: &AppState,
    chat: bool,
    body: &Map<String, Value>,
    tools: Option<&[Value]>,
) -> Result<Option<Grammar>, ApiError> {
    if chat {
        if let Some(spec) = tool_grammar(state, body, tools)? {
            return compile(state, "tool_choice", &spec).map(Some);
        }
    }
    let Some(rf) = field(body, "response_format") else {
        return Ok(None);
    };
    let rf = rf.as_object().ok_or_else(|| {
        ApiError::invalid(
            "response_format",
            "`response_format` must be an object such as {\"type\": \"json_object\"}",
        )
    })?;
    let ty = rf.get("type").and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid(
            "response_format.type",
            "`response_format.type` must be \"text\", \"json_object\" or \"json_schema\"",
        )
    })?;
    match ty {
        "text" => Ok(None),
        "json_object" => compile(state, "response_format", &GrammarSpec::JsonObject).map(Some),
        "json_schema" => {
            let js = rf
                .get("json_schema")
                .and_then(Value::as_object)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "response_format.json_schema",
                        "`response_format.json_schema` must be an object with `name` and \
                         `schema`",
                    )
                })?;
            if let Some(n) = js.get("name") {
                if !n.is_string() {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.name",
                        "`response_format.json_schema.name` must be a string",
                    ));
                }
            }
            if let Some(s) = js.get("strict").filter(|v| !v.is_null()) {
                if !s.is_boolean() {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.strict",
                        "`response_format.json_schema.strict` must be a boolean",
                    ));
                }
            }
            let schema = match js.get("schema") {
                Some(s @ (Value::Object(_) | Value::Bool(_))) => s.clone(),
                None | Some(Value::Null) => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.schema",
                        "`response_format.json_schema.schema` is required (a JSON schema)",
                    ))
                }
                Some(_) => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.schema",
                        "`response_format.json_schema.schema` must be a JSON schema object",
                    ))
                }
            };
            compile(
                state,
                "response_format.json_schema.schema",
                &GrammarSpec::JsonSchema(schema),
            )
            .map(Some)
        }
        other => Err(ApiError::invalid(
            "response_format.type",
            format!(
                "`response_format.type` must be \"text\", \"json_object\" or \"json_schema\", \
                 got {other:?}"
            ),
        )),
    }
}

/// A tool's name and parameters schema (`{"type": "function", "function": {...}}`).
fn tool_parts(tool: &Value) -> Option<(&str, Value)> {
    let f = tool.get("function")?;
    let name = f.get("name")?.as_str()?;
    let params = match f.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object"}),
        Some(p) => p.clone(),
    };
    Some((name, params))
}

/// A Lark string literal for `text`, or the special token it is.
fn literal(state: &AppState, text: &str) -> String {
    let tok = state.engine.tokenizer();
    if let Some(id) = tok.token_to_id(text) {
        let special = tok
            .backend()
            .get_added_tokens_decoder()
            .get(&id)
            .is_some_and(|t| t.special);
        if special {
            return format!("<[{id}]>");
        }
    }
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
}

fn tool_grammar(
    state: &AppState,
    body: &Map<String, Value>,
    tools: Option<&[Value]>,
) -> Result<Option<GrammarSpec>, ApiError> {
    let wanted: Option<String> = match field(body, "tool_choice") {
        None => return Ok(None),
        Some(Value::String(s)) if s == "auto" || s == "none" => return Ok(None),
        Some(Value::String(s)) if s == "required" => None,
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice",
                        "`tool_choice` as an object must be {\"type\": \"function\", \
                         \"function\": {\"name\": ...}}",
                    )
                })?;
            Some(name.to_string())
        }
        Some(v) => {
            return Err(ApiError::invalid(
                "tool_choice",
                format!(
                    "`tool_choice` must be \"auto\", \"none\", \"required\" or \
                     {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {v}"
                ),
            ))
        }
    };
    let tools = tools.unwrap_or(&[]);
    if tools.is_empty() {
        return Err(ApiError::invalid(
            "tool_choice",
            "`tool_choice` requires a tool call, but the request has no `tools`",
        ));
    }
    let mut chosen = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let (name, params) = tool_parts(t).ok_or_else(|| {
            ApiError::invalid(
                "tools",
                format!("`tools[{i}]` must be {{\"type\": \"function\", \"function\": {{\"name\": ..., \"parameters\": ...}}}}"),
            )
        })?;
        if wanted.as_deref().is_none_or(|w| w == name) {
            chosen.push((name.to_string(), params));
        }
    }
    if chosen.is_empty() {
        return Err(ApiError::invalid(
            "tool_choice",
            format!(
                "`tool_choice` names the function {:?}, which is not among `tools`",
                wanted.unwrap_or_default()
            ),
        ));
    }
    let Some(format) = state.tool_format else {
        return Err(ApiError::invalid(
            "tool_choice",
            "this model's chat template defines no tool-call format this server reads, so a \
             tool call cannot be required",
        ));
    };
    let args_key = match format {
        ToolFormat::Markers => "arguments",
        ToolFormat::Llama3Json => "parameters",
    };
    let calls: Vec<Value> = chosen
        .into_iter()
        .map(|(name, params)| {
            json!({
                "type": "object",
                "properties": {"name": {"const": name}, args_key: params},
                "required": ["name", args_key],
                "additionalProperties": false,
            })
        })
        .collect();
    let schema = if calls.len() == 1 {
        calls.into_iter().next().unwrap_or_default()
    } else {
        json!({"anyOf": calls})
    };
    let schema = mlx_engine::grammar::with_layout(&schema);
    let schema_text = serde_json::to_string(&schema)
        .map_err(|e| ApiError::invalid("tools", format!("serializing the schema: {e}")))?;
    Ok(Some(match format {
        ToolFormat::Markers => GrammarSpec::Lark(format!(
            "start: {} \"\\n\" call \"\\n\" {}\ncall: %json {schema_text}\n",
            literal(state, "<tool_call>"),
            literal(state, "</tool_call>"),
        )),
        ToolFormat::Llama3Json => GrammarSpec::JsonSchema(schema),
    }))
}

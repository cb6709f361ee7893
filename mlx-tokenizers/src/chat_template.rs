//! Chat templates: Hugging Face Jinja templates rendered with minijinja so that the output equals
//! transformers' `apply_chat_template(..., tokenize=False)` (transformers 5, Jinja2 3.1), which
//! mlx-lm uses.
//!
//! The environment matches transformers' `_compile_jinja_template`: `trim_blocks` and
//! `lstrip_blocks`, loop controls, a `tojson` filter that is Python's
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, and the
//! globals `raise_exception(message)` and `strftime_now(format)`. Python's string and dict methods
//! (`.strip()`, `.startswith()`, `.split()`, `.get()`, `.items()`, ...) come from
//! `minijinja-contrib`'s pycompat. Printed values are formatted as Python's `str()` would
//! (`True`, `None`, `['a', 1]`, `1.0`). The `{% generation %}` tag of transformers'
//! `AssistantTracker` is accepted and renders its body.
//!
//! A render is bounded by its fuel ([`TEMPLATE_FUEL`]): besides minijinja's own charges, the
//! template is instrumented so that list concatenation, `~`, comparisons and the filters that
//! print their input pay for what they build or print (see `template_bounds.rs`).
//!
//! Differences left: `strftime_now` formats the current time in UTC (Python uses local time);
//! tuples (e.g. from `dictsort`) print as lists;
//! string methods use Rust's Unicode whitespace and case tables.

use serde_json::{Map, Value as Json};

use minijinja::value::{Kwargs, Rest, Serde, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State, Value};

use crate::error::{Result, TokenizerError};
/// The render's size and depth bounds, kept beside the checks that apply them.
pub use crate::template_bounds::{MAX_RENDERED_TEXT, MAX_VALUE_DEPTH};

/// The chat template(s) a tokenizer config holds: one template, or named templates
/// (`[{"name": "default", "template": ...}, {"name": "tool_use", ...}]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatTemplates {
    /// A single template.
    Single(String),
    /// Named templates, in the config's order.
    Named(Vec<(String, String)>),
}

impl ChatTemplates {
    /// Parses `tokenizer_config.json`'s `chat_template` value.
    pub fn from_config_value(v: &Json) -> Result<Self> {
        match v {
            Json::String(s) => Ok(Self::Single(s.clone())),
            Json::Array(items) => {
                let mut named = Vec::new();
                for item in items {
                    let name = item.get("name").and_then(Json::as_str);
                    let template = item.get("template").and_then(Json::as_str);
                    match (name, template) {
                        (Some(n), Some(t)) => named.push((n.to_string(), t.to_string())),
                        _ => {
                            return Err(TokenizerError::Config(
                                "chat_template list entries need \"name\" and \"template\" strings"
                                    .into(),
                            ))
                        }
                    }
                }
                Ok(Self::Named(named))
            }
            Json::Object(m) => Ok(Self::Named(
                m.iter()
                    .filter_map(|(k, v)| v.as_str().map(|t| (k.clone(), t.to_string())))
                    .collect(),
            )),
            _ => Err(TokenizerError::Config(
                "chat_template must be a string or a list of named templates".into(),
            )),
        }
    }

    /// The template transformers' `get_chat_template` picks: the one named `name` (or `name`
    /// itself as a template when it is no known name), else `tool_use` when tools are given,
    /// else `default`.
    pub fn select<'a>(&'a self, name: Option<&'a str>, has_tools: bool) -> Result<&'a str> {
        self.select_named(name, has_tools).map(|(_, source)| source)
    }

    /// [`ChatTemplates::select`], also returning the picked template's name
    /// ([`DEFAULT_TEMPLATE_NAME`] for a single template or a template given as source).
    pub fn select_named<'a>(
        &'a self,
        name: Option<&'a str>,
        has_tools: bool,
    ) -> Result<(&'a str, &'a str)> {
        match self {
            Self::Single(t) => Ok((DEFAULT_TEMPLATE_NAME, name.unwrap_or(t))),
            Self::Named(list) => {
                let find = |n: &str| {
                    list.iter()
                        .find(|(k, _)| k == n)
                        .map(|(k, t)| (k.as_str(), t.as_str()))
                };
                if let Some(n) = name {
                    return Ok(find(n).unwrap_or((DEFAULT_TEMPLATE_NAME, n)));
                }
                if has_tools {
                    if let Some(t) = find("tool_use") {
                        return Ok(t);
                    }
                }
                find("default").ok_or_else(|| {
                    let mut names: Vec<&str> = list.iter().map(|(k, _)| k.as_str()).collect();
                    names.sort();
                    TokenizerError::Invalid(format!(
                        "this model has multiple chat templates with no default specified; \
                         available template names are {names:?}"
                    ))
                })
            }
        }
    }
}

/// Options of one render (transformers' `apply_chat_template` arguments).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatTemplateOptions {
    /// Append the header of an assistant turn.
    pub add_generation_prompt: bool,
    /// Leave the final message open for continuation: `Some("content")` is transformers'
    /// `continue_final_message=True`; another field name continues that field.
    pub continue_final_message: Option<String>,
    /// Tool schemas (`tools=`), passed to the template as given.
    pub tools: Option<Vec<Json>>,
    /// Documents for RAG templates (`documents=`).
    pub documents: Option<Vec<Json>>,
    /// The name of one of several named templates (or a template source).
    pub template_name: Option<String>,
    /// Extra template variables (`enable_thinking`, ...). They override the special tokens.
    pub kwargs: Map<String, Json>,
}

impl ChatTemplateOptions {
    /// Options with `add_generation_prompt` set as given.
    pub fn generation(add_generation_prompt: bool) -> Self {
        Self {
            add_generation_prompt,
            ..Self::default()
        }
    }
}

/// The work one render may do, in minijinja fuel (one unit per instruction, per 64 bytes of text
/// built, per item a filter visits, ...): a template cannot run forever or fill memory. A render
/// gets this much, plus [`TEMPLATE_FUEL_PER_ITEM`] per message, tool and document and
/// [`TEMPLATE_FUEL_PER_BYTE`] per byte of its input, so a runaway template on a short chat stops
/// early while a long chat still renders.
///
/// Sized from measurement (`real_templates_use_a_small_part_of_their_fuel` in
/// `tests/tokenizer_goldens.rs`: the real Qwen3 (with two tools), Llama 3 and Gemma 3 templates;
/// figures of a release build): one turn uses at most 721 fuel, each further message 60-100
/// (Qwen3 with reasoning, a tool call and its reply per turn: 362,503 fuel for 4,001 messages and
/// 1.1 MB of text). So the base is over 300 times the fixed part, and the per-message part alone
/// over 20 times what a message needs. (Paying for comparisons and concatenations,
/// `template_bounds.rs`, added about a tenth: 831 fuel for Qwen3's first turn, about 110 a
/// message.) Sized from the input rather than fixed, so a runaway template on a short chat
/// stops early; the fuzzing campaign's times are in `results/fuzz/template.md`.
pub const TEMPLATE_FUEL: u64 = 250_000;
/// The fuel a render gets per message, tool and document it is given.
pub const TEMPLATE_FUEL_PER_ITEM: u64 = 2_000;
/// The fuel a render gets per byte of its input (strings and keys of the messages, tools,
/// documents and variables): each byte may be copied 64 times.
pub const TEMPLATE_FUEL_PER_BYTE: u64 = 1;
/// Bytes that serializing (`tojson`, printing a list or a dict) may produce per unit of fuel of
/// the render: 4, the price minijinja puts on its own serialization (16 of the 64 sub-units of a
/// fuel per byte), as serializing is far slower than copying text.
pub const SERIALIZED_BYTES_PER_FUEL: u64 = 4;
/// The longest Python `str()` of one value a template may print, whatever fuel is left (a
/// render with a large budget could otherwise print hundreds of megabytes at once).
pub const MAX_PRINTED_VALUE: usize = 4 << 20;

/// The largest `tojson` indent (Python accepts any; a huge one only exhausts memory).
pub const MAX_TOJSON_INDENT: usize = 256;
/// The most text one `tojson` call may produce.
pub const MAX_TOJSON_OUTPUT: usize = 64 << 20;

const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    name: String,
    /// A fixed budget per render ([`ChatTemplate::with_fuel`]) instead of one sized from the input.
    fuel: Option<u64>,
    /// Whether the source was instrumented (see [`ChatTemplate::bounded`]).
    bounded: bool,
}

/// The name errors give a template that was not given one.
pub const DEFAULT_TEMPLATE_NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source` in transformers' Jinja environment.
    pub fn new(source: &str) -> Result<Self> {
        Self::named(DEFAULT_TEMPLATE_NAME, source)
    }

    /// Compiles `source` under `name` (e.g. `tool_use` of a config's named templates), which
    /// its errors name.
    pub fn named(name: &str, source: &str) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|e| TokenizerError::Template(format!("{e:#}")))?;
        env.set_syntax(syntax.clone());
        env.set_unknown_method_callback(python_method);
        // What operators, filters and comparisons build or print is paid for
        // (`template_bounds`).
        env.add_function("__mlx_add", crate::template_bounds::add);
        env.add_function("__mlx_concat", crate::template_bounds::concat);
        env.add_function("__mlx_small", crate::template_bounds::small);
        env.add_filter("__mlx_small", crate::template_bounds::small);
        env.add_filter("sum", crate::template_bounds::sum);
        env.add_filter(
            "format",
            |state: &mut State,
             format: &Value,
             args: Rest<minijinja::value::ValueOrKwargs>|
             -> Result2<Value> {
                // `%s` prints its arguments: they pay first.
                for a in args.iter() {
                    crate::template_bounds::small(state, Value::clone(a))?;
                }
                minijinja::filters::format(state, format, args)
            },
        );
        env.set_formatter(|out, state, value| {
            let written = match value.as_str() {
                Some(s) => out.write_str(s),
                None => out.write_str(&py_repr(value, Meter(Some(state)))?),
            };
            written.map_err(Error::from)
        });
        env.add_filter("tojson", tojson_filter);
        // Jinja2's `trim` and `string` stringify with Python's `str()` first.
        env.add_filter(
            "trim",
            |state: &State, value: &Value, chars: Option<String>| -> Result2<String> {
                let s = py_str(value, Meter(Some(state)))?;
                Ok(match chars {
                    None => py_strip(&s).to_string(),
                    Some(c) => s.trim_matches(|x| c.contains(x)).to_string(),
                })
            },
        );
        env.add_filter(
            "string",
            |state: &State, value: &Value| -> Result2<String> { py_str(value, Meter(Some(state))) },
        );
        env.add_function(
            "raise_exception",
            |state: &State, message: Value| -> std::result::Result<Value, Error> {
                let message = crate::template_bounds::small(state, message)?;
                Err(Error::new(ErrorKind::InvalidOperation, message.to_string()))
            },
        );
        env.add_function(
            "strftime_now",
            |state: &State, format: Value| -> Result2<String> {
                let format = crate::template_bounds::small(state, format)?;
                Ok(strftime_now(&format.to_string()))
            },
        );
        let source_rewritten = rewrite_generation_tags(source);
        let instrumented = crate::template_bounds::instrument(&source_rewritten, syntax);
        let bounded = instrumented.is_some();
        env.add_template_owned(name.to_string(), instrumented.unwrap_or(source_rewritten))
            .map_err(|e| TokenizerError::Template(format!("{e:#}")))?;
        Ok(Self {
            env,
            source: source.to_string(),
            name: name.to_string(),
            fuel: None,
            bounded,
        })
    }

    /// The same template with a fixed fuel budget of `fuel` per render instead of one sized from
    /// the input ([`TEMPLATE_FUEL`]).
    pub fn with_fuel(mut self, fuel: u64) -> Self {
        self.fuel = Some(fuel);
        self
    }

    /// The fuel a render of this input gets (see [`TEMPLATE_FUEL`]).
    pub fn fuel_for(&self, messages: &[Json], options: &ChatTemplateOptions) -> u64 {
        if let Some(fuel) = self.fuel {
            return fuel;
        }
        let len = |v: &Option<Vec<Json>>| v.as_ref().map_or(0, Vec::len) as u64;
        let items = messages.len() as u64 + len(&options.tools) + len(&options.documents);
        let bytes = messages
            .iter()
            .chain(options.tools.iter().flatten())
            .chain(options.documents.iter().flatten())
            .chain(options.kwargs.values())
            .map(json_bytes)
            .fold(0u64, u64::saturating_add);
        TEMPLATE_FUEL
            .saturating_add(items.saturating_mul(TEMPLATE_FUEL_PER_ITEM))
            .saturating_add(bytes.saturating_mul(TEMPLATE_FUEL_PER_BYTE))
    }

    /// Whether list concatenation, `~`, comparisons and printing filters pay for what they
    /// build (`template_bounds.rs`): true for every template whose instrumented source parses,
    /// which is every template minijinja parses unless a node's position was misread.
    pub fn bounded(&self) -> bool {
        self.bounded
    }

    /// The name errors give this template.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` as transformers' `render_jinja_template` does for one conversation.
    /// `special_tokens` are transformers' `special_tokens_map` (`bos_token`, `eos_token`, ...);
    /// `options.kwargs` override them.
    pub fn render(
        &self,
        messages: &[Json],
        options: &ChatTemplateOptions,
        special_tokens: &[(String, String)],
    ) -> Result<String> {
        self.render_counted(messages, options, special_tokens)
            .map(|(text, _)| text)
    }

    /// [`ChatTemplate::render`], also returning the fuel the render used (what
    /// [`TEMPLATE_FUEL`] was sized from).
    pub fn render_counted(
        &self,
        messages: &[Json],
        options: &ChatTemplateOptions,
        special_tokens: &[(String, String)],
    ) -> Result<(String, u64)> {
        let fuel = self.fuel_for(messages, options);
        let mut chat: Vec<Json> = Vec::with_capacity(messages.len());
        for m in messages {
            let Json::Object(map) = m else {
                return Err(TokenizerError::Invalid(format!(
                    "chat messages should be objects, but got {m}"
                )));
            };
            chat.push(Json::Object(alias_reasoning_fields(map)));
        }

        // continue_final_message: tag the final message so the render can be cut after it.
        let mut final_message: Option<String> = None;
        if let Some(field) = &options.continue_final_message {
            let last = chat.last_mut().ok_or_else(|| {
                TokenizerError::Invalid(
                    "continue_final_message is set but the conversation is empty!".into(),
                )
            })?;
            let Json::Object(last) = last else {
                return Err(TokenizerError::Invalid("bad final message".into()));
            };
            let value = last.get(field).filter(|v| !v.is_null()).cloned().ok_or_else(|| {
                TokenizerError::Invalid(format!(
                    "continue_final_message is set but the final message has no \"{field}\" to continue!"
                ))
            })?;
            let mut fields = vec![field.clone()];
            if REASONING_FIELDS.contains(&field.as_str()) {
                fields = REASONING_FIELDS
                    .iter()
                    .filter(|f| last.get(**f) == Some(&value))
                    .map(|f| f.to_string())
                    .collect();
            }
            if !fields.iter().any(|f| self.source.contains(f.as_str())) {
                return Err(TokenizerError::Invalid(format!(
                    "continue_final_message is set to \"{field}\" but this is not an accepted field in the chat_template"
                )));
            }
            match value {
                Json::Array(_) => {
                    let Some(Json::Array(blocks)) = last.get_mut(field) else {
                        return Err(TokenizerError::Invalid("bad final message".into()));
                    };
                    let mut found = None;
                    for block in blocks.iter_mut().rev() {
                        if let Some(Json::String(text)) = block.get("text") {
                            let text = text.clone();
                            if let Json::Object(b) = block {
                                b.insert(
                                    "text".into(),
                                    Json::String(format!("{text}{CONTINUE_TAG}")),
                                );
                            }
                            found = Some(text);
                            break;
                        }
                    }
                    final_message = Some(found.ok_or_else(|| {
                        TokenizerError::Invalid(
                            "continue_final_message is set but we could not find any text to continue in the final message!"
                                .into(),
                        )
                    })?);
                }
                Json::String(s) => {
                    for f in &fields {
                        if let Some(Json::String(v)) = last.get(f.as_str()) {
                            let v = format!("{v}{CONTINUE_TAG}");
                            last.insert(f.clone(), Json::String(v));
                        }
                    }
                    final_message = Some(s);
                }
                other => {
                    return Err(TokenizerError::Invalid(format!(
                        "continue_final_message: cannot continue a final message of {other}"
                    )))
                }
            }
        }

        let mut ctx: Vec<(String, Value)> = vec![
            ("messages".into(), Value::from(Serde(&chat))),
            (
                "tools".into(),
                options
                    .tools
                    .as_ref()
                    .map_or(Value::from(()), |v| Value::from(Serde(v))),
            ),
            (
                "documents".into(),
                options
                    .documents
                    .as_ref()
                    .map_or(Value::from(()), |v| Value::from(Serde(v))),
            ),
            (
                "add_generation_prompt".into(),
                Value::from(options.add_generation_prompt),
            ),
        ];
        let mut extra: Vec<(String, Value)> = special_tokens
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        for (k, v) in &options.kwargs {
            let v = Value::from(Serde(v));
            if let Some(slot) = extra.iter_mut().find(|(ek, _)| ek == k) {
                slot.1 = v;
            } else {
                extra.push((k.clone(), v));
            }
        }
        for (k, v) in extra {
            if !ctx.iter().any(|(ck, _)| *ck == k) {
                ctx.push((k, v));
            }
        }
        let ctx: Value = ctx
            .into_iter()
            .collect::<std::collections::BTreeMap<_, _>>()
            .into();

        // The fuel is the environment's: a cheap copy (its parts are shared) carries this one's.
        let mut env = self.env.clone();
        env.set_fuel(Some(fuel));
        let template = env
            .get_template(&self.name)
            .map_err(|e| TokenizerError::Template(format!("{e:#}")))?;
        let mut out = BoundedText::default();
        let (mut rendered, fuel_used) = match template.render_captured_to(ctx, &mut out) {
            Ok(captured) => {
                let used = captured.state().fuel_levels().map_or(0, |(used, _)| used);
                drop(captured);
                let text = String::from_utf8(out.bytes).map_err(|_| {
                    TokenizerError::Template(format!(
                        "rendering {:?} produced text that is not UTF-8",
                        self.name
                    ))
                })?;
                (text, used)
            }
            Err(e) => return Err(self.render_error(e, fuel, out.overflowed)),
        };

        if let Some(final_message) = final_message {
            let tag = CONTINUE_TAG.trim();
            if !rendered.contains(py_strip(&final_message)) || !rendered.contains(tag) {
                return Err(TokenizerError::Invalid(format!(
                    "continue_final_message is set but the final message does not appear in the chat after \
                     applying the chat template! Final message to continue: {}\nRendered chat:\n{rendered}",
                    py_strip(&final_message)
                )));
            }
            if let Some(loc) = rendered.rfind(tag) {
                if rendered[loc..].starts_with(CONTINUE_TAG) {
                    rendered.truncate(loc);
                } else {
                    let keep = py_rstrip(&rendered[..loc]).len();
                    rendered.truncate(keep);
                }
            }
        }
        Ok((rendered, fuel_used))
    }

    /// The error of a failed render, naming the template and what stopped it.
    fn render_error(&self, e: Error, fuel: u64, overflowed: bool) -> TokenizerError {
        let name = &self.name;
        if overflowed {
            return TokenizerError::Template(format!(
                "rendering {name:?} stopped: the rendered text passed {MAX_RENDERED_TEXT} bytes \
                 (the template produces too much text)"
            ));
        }
        if e.kind() == ErrorKind::OutOfFuel {
            return TokenizerError::Template(format!(
                "rendering {name:?} stopped after {fuel} units of work (about that many steps, \
                 or 64 times that many bytes built; this input's budget): the template loops \
                 too long or builds too much text"
            ));
        }
        template_error(e)
    }
}

/// Python's string, dict and list methods (`minijinja-contrib`'s pycompat), with `split` and
/// `splitlines` paying one fuel per piece before they build the pieces (minijinja charges
/// the list only after it exists, so `('a ' * 10000000).split()` would otherwise build ten
/// million strings before running out), and `format` paying for the widths and precisions
/// of its spec before it pads to them (`'{:>999999999999}'.format('a')` would otherwise
/// allocate a terabyte at once).
fn python_method(state: &mut State, value: &Value, method: &str, args: &[Value]) -> Result2<Value> {
    // The methods print their arguments (`'a'.startswith(list)`) or compare them.
    for a in args {
        crate::template_bounds::small(state, a.clone())?;
    }
    if let Some(s) = value.as_str() {
        if method == "format" {
            // Each field may print the largest argument (padded to its spec's width).
            let (fields, widths) = format_fields(s);
            let cap = match state.fuel_levels() {
                Some((_, left)) => left.saturating_mul(64).saturating_add(64),
                None => MAX_RENDERED_TEXT as u64,
            };
            let largest = args.iter().map(|a| value_bytes(a, cap)).max().unwrap_or(0);
            let bytes = widths.saturating_add(fields.saturating_mul(largest));
            state.consume_fuel(bytes / 64)?;
        }
        let pieces = match method {
            "split" => match args.first().and_then(Value::as_str) {
                Some(sep) if !sep.is_empty() => s.matches(sep).count() + 1,
                _ => s.split_whitespace().count(),
            },
            "splitlines" => s.lines().count(),
            _ => 0,
        };
        let max_split = args.get(1).and_then(Value::as_i64);
        let pieces = match max_split {
            Some(n) if n >= 0 => pieces.min(n as usize + 1),
            _ => pieces,
        };
        state.consume_fuel(pieces as u64)?;
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// The replacement fields of a `str.format` string and the bytes their specs may pad or print
/// to: the sum of every number in the specs (`{:>20}`, `{0:.3f}`), saturating.
fn format_fields(format: &str) -> (u64, u64) {
    let (mut fields, mut widths) = (0u64, 0u64);
    let mut rest = format;
    while let Some(open) = rest.find('{') {
        rest = &rest[open + 1..];
        if let Some(after) = rest.strip_prefix('{') {
            // `{{`: a literal brace.
            rest = after;
            continue;
        }
        fields += 1;
        let field = rest.split('}').next().unwrap_or_default();
        rest = &rest[field.len()..];
        let Some((_, spec)) = field.split_once(':') else {
            continue;
        };
        for digits in spec.split(|c: char| !c.is_ascii_digit()) {
            let n = digits.bytes().fold(0u64, |n, d| {
                n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
            });
            widths = widths.saturating_add(n);
        }
    }
    (fields, widths)
}

/// About how many bytes printing `v` takes (strings their length, other scalars 32, and 4 more
/// per item of a sequence or map), counted up to `cap` (the walk stops there, so a large or
/// self-containing value costs at most `cap / 4` steps).
fn value_bytes(v: &Value, cap: u64) -> u64 {
    let mut total = 0u64;
    let mut stack = vec![v.clone()];
    while let Some(v) = stack.pop() {
        if total >= cap {
            break;
        }
        match v.kind() {
            ValueKind::String => {
                total = total.saturating_add(v.as_str().map_or(0, str::len) as u64)
            }
            // Not `Iterable`: a one-shot iterator would be used up here.
            ValueKind::Seq | ValueKind::Map => {
                let Ok(items) = v.try_iter() else {
                    total = total.saturating_add(32);
                    continue;
                };
                let is_map = v.kind() == ValueKind::Map;
                for item in items {
                    total = total.saturating_add(4);
                    if total >= cap {
                        break;
                    }
                    if is_map {
                        if let Ok(x) = v.get_item(&item) {
                            stack.push(x);
                        }
                    }
                    stack.push(item);
                }
            }
            _ => total = total.saturating_add(32),
        }
    }
    total
}

/// Pays for serializing (`tojson`, printing a list or a dict) out of the render's fuel, at
/// [`SERIALIZED_BYTES_PER_FUEL`]. Outside a render (`py_json_dumps`) only the fixed caps apply.
#[derive(Clone, Copy)]
struct Meter<'a, 's, 'e>(Option<&'a State<'s, 'e>>);

impl Meter<'_, '_, '_> {
    /// The most bytes one serialization may produce now: `cap`, or less when the render's fuel
    /// pays for less.
    fn cap(&self, cap: usize) -> usize {
        match self.0.and_then(State::fuel_levels) {
            Some((_, left)) => usize::try_from(left.saturating_mul(SERIALIZED_BYTES_PER_FUEL))
                .map_or(cap, |n| n.min(cap)),
            None => cap,
        }
    }

    /// Pays for `bytes` serialized.
    fn pay(&self, bytes: usize) -> Result2<()> {
        match self.0 {
            Some(state) => state.consume_fuel(bytes as u64 / SERIALIZED_BYTES_PER_FUEL),
            None => Ok(()),
        }
    }

    /// The error of a serialization past [`Meter::cap`]`(cap)` bytes: out of fuel when the
    /// fuel was the smaller bound.
    fn too_long(&self, what: &str, cap: usize) -> Error {
        if self.cap(cap) < cap {
            return Error::from(ErrorKind::OutOfFuel);
        }
        Error::new(
            ErrorKind::InvalidOperation,
            format!("{what} is longer than {cap} bytes"),
        )
    }
}

/// The length of the strings and keys in `v` (no recursion: a value may nest deeply).
fn json_bytes(v: &Json) -> u64 {
    let mut total = 0u64;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Json::String(s) => total = total.saturating_add(s.len() as u64),
            Json::Array(items) => stack.extend(items),
            Json::Object(map) => {
                for (k, x) in map {
                    total = total.saturating_add(k.len() as u64);
                    stack.push(x);
                }
            }
            _ => total = total.saturating_add(1),
        }
    }
    total
}

/// The sink of one render: the text, refusing to grow past [`MAX_RENDERED_TEXT`].
#[derive(Default)]
struct BoundedText {
    bytes: Vec<u8>,
    overflowed: bool,
}

impl std::io::Write for BoundedText {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > MAX_RENDERED_TEXT {
            self.overflowed = true;
            return Err(std::io::Error::other("the rendered text is too long"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn template_error(e: Error) -> TokenizerError {
    if e.kind() == ErrorKind::InvalidOperation {
        if let Some(detail) = e.detail() {
            // raise_exception(message): transformers raises `TemplateError(message)`.
            return TokenizerError::Template(format!("TemplateError: {detail}"));
        }
    }
    TokenizerError::Template(format!("{e:#}"))
}

fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

fn py_strip(s: &str) -> &str {
    s.trim_matches(is_py_space)
}

fn py_rstrip(s: &str) -> &str {
    s.trim_end_matches(is_py_space)
}

/// transformers' `_alias_reasoning_fields` for one message:
/// `{"thinking": r, **message, "reasoning_content": r}` when any reasoning field is set.
fn alias_reasoning_fields(message: &Map<String, Json>) -> Map<String, Json> {
    let reasoning = REASONING_FIELDS
        .iter()
        .find_map(|k| message.get(*k).filter(|v| !v.is_null()))
        .cloned();
    let Some(r) = reasoning else {
        return message.clone();
    };
    let mut out = Map::new();
    out.insert("thinking".into(), r.clone());
    for (k, v) in message {
        out.insert(k.clone(), v.clone());
    }
    out.insert("reasoning_content".into(), r);
    out
}

/// Turns transformers' `{% generation %}` / `{% endgeneration %}` (keeping whitespace control)
/// into a block minijinja knows.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        // The closing `%}` comes after the opening `{%` (in `{%}` they overlap).
        let Some(end) = tag[2..].find("%}").map(|e| e + 2) else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (lead, body) = match inner.strip_prefix('-') {
            Some(b) => ("-", b),
            None => match inner.strip_prefix('+') {
                Some(b) => ("+", b),
                None => ("", inner),
            },
        };
        let (body, trail) = match body.strip_suffix('-') {
            Some(b) => (b, "-"),
            None => match body.strip_suffix('+') {
                Some(b) => (b, "+"),
                None => (body, ""),
            },
        };
        match body.trim() {
            "generation" => out.push_str(&format!("{{%{lead} if true {trail}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{lead} endif {trail}%}}")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

// ---------------------------------------------------------------------------------------------
// Python formatting

/// Python's `repr` of a float (`float.__repr__`): shortest round-trip digits, scientific
/// notation outside `1e-4 <= |x| < 1e16`.
pub fn py_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if x == 0.0 {
        return if x.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "d.ddde[-]x".
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if x < 0.0 { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let s = if exp >= n - 1 {
            format!("{digits}{}.0", "0".repeat((exp - (n - 1)) as usize))
        } else if exp >= 0 {
            let (a, b) = digits.split_at((exp + 1) as usize);
            format!("{a}.{b}")
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        };
        format!("{sign}{s}")
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{m}e{esign}{:02}", exp.abs())
    }
}

/// Appends Python's `repr` of a string to `out`.
fn py_str_repr_into(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.reserve(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

fn number_repr(v: &Value) -> Result2<String> {
    if v.is_integer() {
        if let Some(i) = v.as_i64() {
            return Ok(i.to_string());
        }
        return Ok(v.to_string());
    }
    match f64::try_from(v.clone()) {
        Ok(f) => Ok(py_float_repr(f)),
        Err(_) => Ok(v.to_string()),
    }
}

type Result2<T> = std::result::Result<T, Error>;

/// Python's `repr` of a template value.
fn py_repr(v: &Value, meter: Meter) -> Result2<String> {
    let mut out = String::new();
    let r = py_repr_into(v, &mut out, 0, &meter, meter.cap(MAX_PRINTED_VALUE));
    meter.pay(out.len())?;
    r?;
    Ok(out)
}

fn too_deep(what: &str) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "{what} a value nested more than {MAX_VALUE_DEPTH} levels deep \
             (a value that contains itself?)"
        ),
    )
}

/// Fails once `out` holds more than `cap` bytes.
fn check_printed_len(out: &str, meter: &Meter, cap: usize) -> Result2<()> {
    if out.len() > cap {
        return Err(meter.too_long("a printed value", MAX_PRINTED_VALUE));
    }
    Ok(())
}

/// Appends Python's `repr` of `v` to `out` (one buffer for the whole value: no string per
/// item).
fn py_repr_into(
    v: &Value,
    out: &mut String,
    depth: usize,
    meter: &Meter,
    cap: usize,
) -> Result2<()> {
    if depth > MAX_VALUE_DEPTH {
        return Err(too_deep("printing"));
    }
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number => out.push_str(&number_repr(v)?),
        ValueKind::String => py_str_repr_into(v.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, x) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr_into(&x, out, depth + 1, meter, cap)?;
                check_printed_len(out, meter, cap)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, k) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr_into(&k, out, depth + 1, meter, cap)?;
                out.push_str(": ");
                py_repr_into(&v.get_item(&k)?, out, depth + 1, meter, cap)?;
                check_printed_len(out, meter, cap)?;
            }
            out.push('}');
        }
        _ => out.push_str(&v.to_string()),
    }
    check_printed_len(out, meter, cap)
}

/// Python's `str()` of a template value (what `{{ value }}` prints in Jinja2).
fn py_str(v: &Value, meter: Meter) -> Result2<String> {
    Ok(match v.kind() {
        ValueKind::String => v.as_str().unwrap_or_default().to_string(),
        _ => py_repr(v, meter)?,
    })
}

/// Options of Python's `json.dumps`.
struct JsonStyle<'a, 's, 'e> {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    /// The most bytes to produce.
    cap: usize,
    meter: Meter<'a, 's, 'e>,
}

fn json_string(s: &str, ensure_ascii: bool, out: &mut String) {
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
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && (c as u32) > 0x7e => {
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

fn json_dump(v: &Value, style: &JsonStyle, level: usize, out: &mut String) -> Result2<()> {
    if level > MAX_VALUE_DEPTH {
        return Err(too_deep("tojson of"));
    }
    if out.len() > style.cap {
        return Err(style
            .meter
            .too_long("tojson: the output", MAX_TOJSON_OUTPUT));
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(ind) = &style.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    };
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&number_repr(v)?);
            } else {
                let f = f64::try_from(v.clone())?;
                if f.is_nan() {
                    out.push_str("NaN");
                } else if f.is_infinite() {
                    out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
                } else {
                    out.push_str(&py_float_repr(f));
                }
            }
        }
        ValueKind::String => json_string(v.as_str().unwrap_or_default(), style.ensure_ascii, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, level + 1);
                json_dump(item, style, level + 1, out)?;
            }
            newline(out, level);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if style.sort_keys {
                keys.sort_by_cached_key(|k| py_str(k, style.meter).unwrap_or_default());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, level + 1);
                let key = match k.kind() {
                    ValueKind::String => k.as_str().unwrap_or_default().to_string(),
                    ValueKind::None => "null".into(),
                    ValueKind::Bool => if k.is_true() { "true" } else { "false" }.into(),
                    ValueKind::Number => {
                        let mut s = String::new();
                        json_dump(k, style, level, &mut s)?;
                        s
                    }
                    _ => {
                        return Err(Error::new(
                            ErrorKind::InvalidOperation,
                            format!(
                                "keys must be str, int, float, bool or None, not {}",
                                k.kind()
                            ),
                        ))
                    }
                };
                json_string(&key, style.ensure_ascii, out);
                out.push_str(&style.key_sep);
                json_dump(&v.get_item(k)?, style, level + 1, out)?;
            }
            newline(out, level);
            out.push('}');
        }
        ValueKind::Undefined => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "Object of type Undefined is not JSON serializable",
            ))
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("Object of type {other} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

/// Python's `json.dumps(v, ensure_ascii=False)` (separators `", "` and `": "`, keys in their
/// order): how mlx_lm.server writes tool-call arguments.
pub fn py_json_dumps(v: &Json) -> Result<String> {
    let style = JsonStyle {
        ensure_ascii: false,
        indent: None,
        item_sep: ", ".into(),
        key_sep: ": ".into(),
        sort_keys: false,
        cap: MAX_TOJSON_OUTPUT,
        meter: Meter(None),
    };
    let mut out = String::new();
    json_dump(&Value::from(Serde(v)), &style, 0, &mut out).map_err(template_error)?;
    Ok(out)
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson_filter(
    state: &State,
    value: &Value,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> Result2<Value> {
    let mut ensure_ascii = args.first().is_some_and(Value::is_true);
    let mut indent_v = args.get(1).cloned();
    let mut separators_v = args.get(2).cloned();
    let mut sort_keys = args.get(3).is_some_and(Value::is_true);
    if let Some(v) = kwargs.get::<Option<Value>>("ensure_ascii")? {
        ensure_ascii = v.is_true();
    }
    if let Some(v) = kwargs.get::<Option<Value>>("indent")? {
        indent_v = Some(v);
    }
    if let Some(v) = kwargs.get::<Option<Value>>("separators")? {
        separators_v = Some(v);
    }
    if let Some(v) = kwargs.get::<Option<Value>>("sort_keys")? {
        sort_keys = v.is_true();
    }
    kwargs.assert_all_used()?;
    let indent = match indent_v {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => {
            let indent = match v.as_str() {
                Some(s) => s.to_string(),
                None => {
                    let n = v.as_i64().unwrap_or(0).max(0);
                    if n > MAX_TOJSON_INDENT as i64 {
                        return Err(Error::new(
                            ErrorKind::InvalidOperation,
                            format!("tojson: indent {n} is larger than {MAX_TOJSON_INDENT}"),
                        ));
                    }
                    " ".repeat(n as usize)
                }
            };
            if indent.len() > MAX_TOJSON_INDENT {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "tojson: an indent of {} characters is longer than {MAX_TOJSON_INDENT}",
                        indent.len()
                    ),
                ));
            }
            Some(indent)
        }
    };
    let (item_sep, key_sep) = match separators_v {
        Some(v) if !v.is_none() && !v.is_undefined() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match (parts.first(), parts.get(1)) {
                (Some(a), Some(b)) => (
                    a.as_str().unwrap_or(",").to_string(),
                    b.as_str().unwrap_or(":").to_string(),
                ),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "separators must be an (item_separator, key_separator) pair",
                    ))
                }
            }
        }
        _ => (
            if indent.is_some() { "," } else { ", " }.to_string(),
            ": ".to_string(),
        ),
    };
    let style = JsonStyle {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys,
        cap: Meter(Some(state)).cap(MAX_TOJSON_OUTPUT),
        meter: Meter(Some(state)),
    };
    let mut out = String::new();
    let r = json_dump(value, &style, 0, &mut out);
    style.meter.pay(out.len())?;
    r?;
    Ok(Value::from(out))
}

// ---------------------------------------------------------------------------------------------
// strftime

/// Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// `strftime(format)` of the current UTC time.
pub fn strftime_now(format: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime_utc(secs, format)
}

/// `strftime(format)` of the UTC time `secs` after the Unix epoch (C/glibc conventions, with
/// glibc's `%-d` style unpadded fields).
pub fn strftime_utc(secs: i64, format: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (sod / 3600, (sod % 3600) / 60, sod % 60);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let wd = (days + 3).rem_euclid(7) as usize;
    let jan1 = {
        // Days from epoch to Jan 1 of year y.
        let mut n = 0i64;
        let mut yy = 1970;
        while yy < y {
            n += if (yy % 4 == 0 && yy % 100 != 0) || yy % 400 == 0 {
                366
            } else {
                365
            };
            yy += 1;
        }
        while yy > y {
            yy -= 1;
            n -= if (yy % 4 == 0 && yy % 100 != 0) || yy % 400 == 0 {
                366
            } else {
                365
            };
        }
        n
    };
    let yday = days - jan1 + 1;
    let h12 = if hh % 12 == 0 { 12 } else { hh % 12 };
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let nopad = chars.peek() == Some(&'-');
        if nopad {
            chars.next();
        }
        let num = |v: i64, w: usize| {
            if nopad {
                v.to_string()
            } else {
                format!("{v:0w$}")
            }
        };
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&num(y.rem_euclid(100), 2)),
            Some('m') => out.push_str(&num(m as i64, 2)),
            Some('d') => out.push_str(&num(d as i64, 2)),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('H') => out.push_str(&num(hh, 2)),
            Some('I') => out.push_str(&num(h12, 2)),
            Some('M') => out.push_str(&num(mm, 2)),
            Some('S') => out.push_str(&num(ss, 2)),
            Some('j') => out.push_str(&num(yday, 3)),
            Some('p') => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(MONTHS[(m - 1) as usize]),
            Some('b') | Some('h') => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            Some('A') => out.push_str(DAYS[wd]),
            Some('a') => out.push_str(&DAYS[wd][..3]),
            Some('u') => out.push_str(&(wd + 1).to_string()),
            Some('w') => out.push_str(&((wd + 1) % 7).to_string()),
            Some('F') => out.push_str(&format!("{y}-{m:02}-{d:02}")),
            Some('T') => out.push_str(&format!("{hh:02}:{mm:02}:{ss:02}")),
            Some('Z') | Some('z') => {}
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if nopad {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        for (x, s) in [
            (1.0, "1.0"),
            (7.5, "7.5"),
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.0, "123456789012345.0"),
            (-2.25, "-2.25"),
            (1e300, "1e+300"),
            (3.0e-10, "3e-10"),
        ] {
            assert_eq!(py_float_repr(x), s, "{x}");
        }
    }

    #[test]
    fn strftime_fixed_times() {
        // 2024-07-23 14:05:09 UTC, a Tuesday.
        let t = 1_721_743_509;
        assert_eq!(strftime_utc(t, "%d %b %Y"), "23 Jul 2024");
        assert_eq!(strftime_utc(t, "%Y-%m-%d %H:%M:%S"), "2024-07-23 14:05:09");
        assert_eq!(
            strftime_utc(t, "%A %B %-d, %I%p %j"),
            "Tuesday July 23, 02PM 205"
        );
        assert_eq!(strftime_utc(0, "%a %d %b %Y"), "Thu 01 Jan 1970");
        assert_eq!(strftime_utc(951_782_400, "%F"), "2000-02-29");
    }

    #[test]
    fn generation_tags_are_rewritten() {
        assert_eq!(
            rewrite_generation_tags("a{%- generation -%}b{% endgeneration %}c{{ x }}"),
            "a{%- if true -%}b{% endif %}c{{ x }}"
        );
    }

    #[test]
    fn python_style_printing_and_tojson() {
        let t = ChatTemplate::new(
            "{{ flag }} {{ nothing }} {{ items }} {{ m }} {{ f }}|{{ m | tojson }}|{{ m | tojson(indent=2) }}|{{ s | tojson }}",
        )
        .unwrap();
        let mut opts = ChatTemplateOptions::default();
        let kw: Json = serde_json::json!({
            "flag": true, "nothing": null, "items": ["a", 1, 2.5, "it's"],
            "m": {"b": [1, {}], "a": "ü<>&"}, "f": 3.0, "s": "line\n\"q\"\t\u{1}"
        });
        opts.kwargs = kw.as_object().unwrap().clone();
        let out = t.render(&[], &opts, &[]).unwrap();
        assert_eq!(
            out,
            "True None ['a', 1, 2.5, \"it's\"] {'b': [1, {}], 'a': 'ü<>&'} 3.0|\
             {\"b\": [1, {}], \"a\": \"ü<>&\"}|{\n  \"b\": [\n    1,\n    {}\n  ],\n  \"a\": \"ü<>&\"\n}|\
             \"line\\n\\\"q\\\"\\t\\u0001\""
        );
    }
}

//! mlx-lm's `tuner/datasets.py` and `iterate_batches`: JSONL data in the `text`,
//! `prompt`/`completion` and `messages` (+ `tools`) formats, prompt masking, and batches
//! sorted, shuffled (numpy's global generator) and padded as mlx-lm makes them.

use std::path::Path;

use mlx_core::prelude::*;
use serde_json::{Map, Value};

use crate::error::{io_err, Result, TrainError};
use crate::nprand::NumpyRandom;
use crate::tokenize::{self, Tokenizer};

/// The feature names and masking of `create_dataset` (mlx-lm's defaults).
#[derive(Clone, Debug)]
pub struct DataConfig {
    pub mask_prompt: bool,
    pub prompt_feature: String,
    pub completion_feature: String,
    pub text_feature: String,
    pub chat_feature: String,
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            mask_prompt: false,
            prompt_feature: "prompt".into(),
            completion_feature: "completion".into(),
            text_feature: "text".into(),
            chat_feature: "messages".into(),
        }
    }
}

/// One tokenized example: the tokens and the number of leading tokens excluded from the
/// loss (the prompt, with `mask_prompt`).
#[derive(Clone, Debug, PartialEq)]
pub struct Example {
    pub tokens: Vec<u32>,
    pub offset: usize,
    /// What mlx-lm's `CacheDataset.itemlen` sorts by: `len()` of the raw row, i.e. its
    /// number of JSON keys (not its token count).
    pub item_len: usize,
    /// Preference data: the rejected completion `(tokens, offset)` beside the chosen one.
    pub rejected: Option<(Vec<u32>, usize)>,
}

/// A tokenized split.
#[derive(Clone, Debug, Default)]
pub struct Dataset {
    pub examples: Vec<Example>,
}

impl Dataset {
    pub fn len(&self) -> usize {
        self.examples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.examples.is_empty()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Format {
    Preference,
    Completions,
    Chat,
    Text,
}

/// Why one row of a dataset is refused; [`create_dataset`] gives it the file and line
/// ([`TrainError::Data`]).
#[derive(Debug)]
enum RowError {
    /// The field is missing.
    Missing(String),
    /// The field is there but not a string.
    NotString(String),
    /// `tools` is there but not a list.
    ToolsNotList,
    /// The text field encodes to no tokens.
    NoTokens(String),
    /// The chat field is not a list of messages.
    NotMessages(String),
    /// The chat field is an empty list.
    NoMessages(String),
    /// Message `i` of the chat field is not an object.
    MessageNotObject(String, usize),
    /// Tokenizing or templating the row failed.
    Tokenize(TrainError),
}

impl std::fmt::Display for RowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RowError::Missing(k) => write!(f, "missing field `{k}`"),
            RowError::NotString(k) => write!(f, "field `{k}` must be a string"),
            RowError::ToolsNotList => f.write_str("field `tools` must be a list"),
            RowError::NoTokens(k) => write!(f, "field `{k}` encodes to no tokens"),
            RowError::NotMessages(k) => write!(f, "field `{k}` must be a list of messages"),
            RowError::NoMessages(k) => write!(f, "`{k}` is empty"),
            RowError::MessageNotObject(k, i) => write!(f, "`{k}`[{i}] is not an object"),
            RowError::Tokenize(e) => e.fmt(f),
        }
    }
}

fn str_field<'a>(row: &'a Map<String, Value>, key: &str) -> std::result::Result<&'a str, RowError> {
    match row.get(key) {
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(RowError::NotString(key.into())),
        None => Err(RowError::Missing(key.into())),
    }
}

fn tools_field(row: &Map<String, Value>) -> std::result::Result<Option<&Vec<Value>>, RowError> {
    match row.get("tools") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a)),
        Some(_) => Err(RowError::ToolsNotList),
    }
}

fn process(
    row: &Map<String, Value>,
    format: Format,
    tok: &Tokenizer,
    cfg: &DataConfig,
) -> std::result::Result<Example, RowError> {
    let e = RowError::Tokenize;
    let mut rejected = None;
    let (tokens, offset) = match format {
        Format::Preference => {
            let tools = tools_field(row)?;
            let prompt = str_field(row, &cfg.prompt_feature)?;
            let turn = |answer: &str| {
                vec![
                    serde_json::json!({"role": "user", "content": prompt}),
                    serde_json::json!({"role": "assistant", "content": answer}),
                ]
            };
            let chosen = turn(str_field(row, "chosen")?);
            let offset = tokenize::chat_ids(tok, &chosen[..1], tools, true)
                .map_err(e)?
                .len();
            let c = tokenize::chat_ids(tok, &chosen, tools, false).map_err(e)?;
            let r = tokenize::chat_ids(tok, &turn(str_field(row, "rejected")?), tools, false)
                .map_err(e)?;
            rejected = Some((r, offset));
            (c, offset)
        }
        Format::Text => {
            let mut d = tokenize::encode(tok, str_field(row, &cfg.text_feature)?).map_err(e)?;
            let eos = tokenize::eos_token_id(tok);
            if d.is_empty() {
                return Err(RowError::NoTokens(cfg.text_feature.clone()));
            }
            if let Some(eos) = eos {
                if d.last() != Some(&eos) {
                    d.push(eos);
                }
            }
            (d, 0)
        }
        Format::Completions => {
            let tools = tools_field(row)?;
            let messages = vec![
                serde_json::json!({"role": "user", "content": str_field(row, &cfg.prompt_feature)?}),
                serde_json::json!({"role": "assistant", "content": str_field(row, &cfg.completion_feature)?}),
            ];
            let tokens = tokenize::chat_ids(tok, &messages, tools, false).map_err(e)?;
            let offset = if cfg.mask_prompt {
                tokenize::chat_ids(tok, &messages[..1], tools, true)
                    .map_err(e)?
                    .len()
            } else {
                0
            };
            (tokens, offset)
        }
        Format::Chat => {
            let tools = tools_field(row)?;
            let messages = match row.get(&cfg.chat_feature) {
                Some(Value::Array(m)) if !m.is_empty() => m,
                Some(Value::Array(_)) => {
                    return Err(RowError::NoMessages(cfg.chat_feature.clone()))
                }
                _ => return Err(RowError::NotMessages(cfg.chat_feature.clone())),
            };
            if let Some(i) = messages.iter().position(|m| !m.is_object()) {
                return Err(RowError::MessageNotObject(cfg.chat_feature.clone(), i));
            }
            let tokens = tokenize::chat_ids(tok, messages, tools, false).map_err(e)?;
            let offset = if cfg.mask_prompt {
                let last_is_assistant = messages
                    .last()
                    .and_then(|m| m.get("role"))
                    .and_then(Value::as_str)
                    == Some("assistant");
                tokenize::chat_ids(
                    tok,
                    &messages[..messages.len() - 1],
                    tools,
                    last_is_assistant,
                )
                .map_err(e)?
                .len()
            } else {
                0
            };
            (tokens, offset)
        }
    };
    Ok(Example {
        tokens,
        offset,
        item_len: row.len(),
        rejected,
    })
}

/// `create_dataset` over the rows of one JSONL file (the format is decided by the first row,
/// as mlx-lm does); `file` names the source in errors.
pub fn create_dataset(
    rows: &[Map<String, Value>],
    tok: &Tokenizer,
    cfg: &DataConfig,
    file: &str,
) -> Result<Dataset> {
    let Some(sample) = rows.first() else {
        return Ok(Dataset::default());
    };
    let format = if sample.contains_key("chosen") && sample.contains_key("rejected") {
        Format::Preference
    } else if sample.contains_key(&cfg.prompt_feature)
        && sample.contains_key(&cfg.completion_feature)
    {
        Format::Completions
    } else if sample.contains_key(&cfg.chat_feature) {
        Format::Chat
    } else if sample.contains_key(&cfg.text_feature) {
        if cfg.mask_prompt {
            return Err(TrainError::Data {
                file: file.into(),
                line: 1,
                message: "prompt masking is not supported for a text dataset".into(),
            });
        }
        Format::Text
    } else {
        return Err(TrainError::Data {
            file: file.into(),
            line: 1,
            message: format!(
                "unsupported data format: expected `{}`/`{}`, `{}` or `{}` fields",
                cfg.prompt_feature, cfg.completion_feature, cfg.chat_feature, cfg.text_feature
            ),
        });
    };
    let examples = rows
        .iter()
        .enumerate()
        .map(|(i, row)| {
            process(row, format, tok, cfg).map_err(|e| TrainError::Data {
                file: file.into(),
                line: i + 1,
                message: e.to_string(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Dataset { examples })
}

/// The longest JSONL line read, in bytes (16 MiB). A row this long is millions of tokens,
/// far past any `max_seq_length`; a longer one is refused with its file and line number
/// before more than this many bytes of it are held in memory.
pub const MAX_LINE_BYTES: usize = 16 << 20;

/// Reads a JSONL file: one JSON object per line (blank lines are an error, as in mlx-lm),
/// line by line, each at most [`MAX_LINE_BYTES`] long.
pub fn read_jsonl(path: &Path) -> Result<Vec<Map<String, Value>>> {
    read_jsonl_limited(path, MAX_LINE_BYTES)
}

/// [`read_jsonl`] with another line-length limit.
pub fn read_jsonl_limited(path: &Path, max_line_bytes: usize) -> Result<Vec<Map<String, Value>>> {
    use std::io::{BufRead, Read};
    let file = std::fs::File::open(path).map_err(|e| io_err(path, e))?;
    let mut reader = std::io::BufReader::with_capacity(1 << 16, file);
    let bad = |line: usize, message: String| TrainError::Data {
        file: path.display().to_string(),
        line,
        message,
    };
    let mut rows = Vec::new();
    let mut buf = Vec::new();
    for line in 1.. {
        buf.clear();
        // The limit plus room for "\r\n": a longer line stops here, unread past the limit.
        let n = (&mut reader)
            .take(max_line_bytes as u64 + 2)
            .read_until(b'\n', &mut buf)
            .map_err(|e| io_err(path, format!("line {line}: {e}")))?;
        if n == 0 {
            break;
        }
        let ended = buf.last() == Some(&b'\n');
        if ended {
            buf.pop();
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
        }
        if buf.len() > max_line_bytes {
            return Err(bad(
                line,
                format!(
                    "line longer than {max_line_bytes} bytes (the limit for one JSONL row); \
                     split the example or shorten it"
                ),
            ));
        }
        let text = std::str::from_utf8(&buf).map_err(|e| {
            bad(
                line,
                format!(
                    "not UTF-8 text (bad byte at column {})",
                    e.valid_up_to() + 1
                ),
            )
        })?;
        rows.push(match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(bad(line, "expected a JSON object".into())),
            Err(e) => return Err(bad(line, format!("invalid JSON: {e}"))),
        });
    }
    Ok(rows)
}

/// `load_local_dataset`: `{train,valid,test}.jsonl` in `dir`; a missing file is an empty set.
pub fn load_local_dataset(
    dir: &Path,
    tok: &Tokenizer,
    cfg: &DataConfig,
) -> Result<(Dataset, Dataset, Dataset)> {
    if !dir.is_dir() {
        return Err(io_err(dir, "not a directory with {train,valid,test}.jsonl"));
    }
    let load = |name: &str| -> Result<Dataset> {
        let p = dir.join(format!("{name}.jsonl"));
        if !p.exists() {
            return Ok(Dataset::default());
        }
        create_dataset(&read_jsonl(&p)?, tok, cfg, &p.display().to_string())
    };
    Ok((load("train")?, load("valid")?, load("test")?))
}

/// One padded batch: `tokens` `(batch, width)` int32 and `lengths` `(batch, 2)` int32 rows
/// of `(offset, length)`.
#[derive(Clone, Debug)]
pub struct Batch {
    pub tokens: Array,
    pub lengths: Array,
    /// Whether a sequence was cut at `max_seq_length`.
    pub truncated: bool,
}

/// mlx-lm's `iterate_batches` as an explicit state machine: sorted by `item_len`, grouped
/// in consecutive batches, visited in `np.random.permutation` order (drawn from `rng` when
/// the generator starts and, with `looping`, each time it runs out), padded to one plus a
/// multiple of 32 (at most `max_seq_length`).
#[derive(Clone, Debug)]
pub struct BatchIter {
    batch_idx: Vec<Vec<usize>>,
    batch_size: usize,
    max_seq_length: usize,
    looping: bool,
    order: Vec<usize>,
    pos: usize,
    started: bool,
}

impl BatchIter {
    pub fn new(
        data: &Dataset,
        batch_size: usize,
        max_seq_length: usize,
        looping: bool,
    ) -> Result<Self> {
        Self::sharded(data, batch_size, max_seq_length, looping, World::single())
    }

    /// The batches of rank `world.rank` of `world.size` data-parallel workers, as
    /// `iterate_batches(comm_group=...)` makes them: each batch of `batch_size` consecutive
    /// (sorted) examples is split by striding, so this rank takes `batch_size / size` of
    /// them, starting at its rank. Every rank draws the same batch order.
    pub fn sharded(
        data: &Dataset,
        batch_size: usize,
        max_seq_length: usize,
        looping: bool,
        world: World,
    ) -> Result<Self> {
        if batch_size == 0 {
            return Err(TrainError::option("batch_size", "must be positive"));
        }
        if max_seq_length < 2 {
            return Err(TrainError::option("max_seq_length", "must be at least 2"));
        }
        let mut idx: Vec<usize> = (0..data.len()).collect();
        idx.sort_by_key(|&i| data.examples[i].item_len);
        if data.len() < batch_size {
            return Err(TrainError::Config(format!(
                "Dataset must have at least batch_size={batch_size} examples but only has {}.",
                data.len()
            )));
        }
        if world.size == 0 || world.rank >= world.size {
            return Err(TrainError::Config(format!(
                "rank {} of a world of {} processes",
                world.rank, world.size
            )));
        }
        if batch_size % world.size != 0 {
            return Err(TrainError::Config(format!(
                "The batch size must be divisible by the number of workers: batch_size={batch_size}, \
                 {} workers",
                world.size
            )));
        }
        let batch_idx = (0..=data.len() - batch_size)
            .step_by(batch_size)
            .map(|i| {
                idx[i + world.rank..i + batch_size]
                    .iter()
                    .step_by(world.size)
                    .copied()
                    .collect()
            })
            .collect();
        Ok(BatchIter {
            batch_idx,
            batch_size: batch_size / world.size,
            max_seq_length,
            looping,
            order: Vec::new(),
            pos: 0,
            started: false,
        })
    }

    pub fn num_batches(&self) -> usize {
        self.batch_idx.len()
    }

    /// Where the iterator stands: the batch order of the current pass (empty before the
    /// first draw) and how many of it were taken.
    pub fn position(&self) -> BatchPosition {
        BatchPosition {
            num_batches: self.batch_idx.len(),
            order: if self.started {
                self.order.clone()
            } else {
                Vec::new()
            },
            taken: self.pos,
        }
    }

    /// Continues from `p` (a [`BatchIter::position`] of an iterator over the same data);
    /// `false`, changing nothing, when `p` does not fit this data.
    pub fn restore(&mut self, p: &BatchPosition) -> bool {
        let n = self.batch_idx.len();
        let mut seen = vec![false; n];
        let is_permutation = p.order.len() == n
            && p.order
                .iter()
                .all(|&i| i < n && !std::mem::replace(&mut seen[i], true));
        if p.num_batches != n || !(p.order.is_empty() || is_permutation) || p.taken > p.order.len()
        {
            return false;
        }
        self.started = !p.order.is_empty();
        self.order = p.order.clone();
        self.pos = p.taken;
        true
    }

    /// The next batch, or `None` when a non-looping pass is over.
    pub fn next_batch(&mut self, data: &Dataset, rng: &mut NumpyRandom) -> Result<Option<Batch>> {
        if !self.started || (self.pos == self.order.len() && self.looping) {
            self.order = rng.permutation(self.batch_idx.len());
            self.pos = 0;
            self.started = true;
        }
        if self.pos == self.order.len() {
            return Ok(None);
        }
        let members = &self.batch_idx[self.order[self.pos]];
        self.pos += 1;
        let examples: Vec<&Example> = members.iter().map(|&j| &data.examples[j]).collect();
        Ok(Some(pad_batch(
            &examples,
            self.batch_size,
            self.max_seq_length,
        )?))
    }
}

/// Where this process stands among data-parallel workers (mlx-lm's `comm_group` rank and
/// size); [`World::single`] for one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct World {
    pub rank: usize,
    pub size: usize,
}

impl World {
    pub const fn single() -> Self {
        World { rank: 0, size: 1 }
    }

    pub fn is_distributed(&self) -> bool {
        self.size > 1
    }
}

impl Default for World {
    fn default() -> Self {
        World::single()
    }
}

/// A [`BatchIter`]'s position, saved with a checkpoint so a resumed run takes the batches
/// the uninterrupted run would have taken.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BatchPosition {
    pub num_batches: usize,
    pub order: Vec<usize>,
    pub taken: usize,
}

/// The padding of `iterate_batches`. Preference examples give `2 * batch_size` rows: the
/// chosen sequences, then the rejected ones (prompt masked in both).
pub fn pad_batch(examples: &[&Example], batch_size: usize, max_seq_length: usize) -> Result<Batch> {
    if examples.iter().any(|e| e.rejected.is_some()) {
        let rejected: Vec<Example> = examples
            .iter()
            .map(|e| {
                let (tokens, offset) = e.rejected.clone().ok_or_else(|| {
                    TrainError::Config("preference and plain examples in one batch".into())
                })?;
                Ok(Example {
                    tokens,
                    offset,
                    item_len: e.item_len,
                    rejected: None,
                })
            })
            .collect::<Result<_>>()?;
        let mut rows: Vec<Example> = examples
            .iter()
            .map(|e| Example {
                rejected: None,
                ..(*e).clone()
            })
            .collect();
        rows.extend(rejected);
        let refs: Vec<&Example> = rows.iter().collect();
        return pad_batch(&refs, 2 * batch_size, max_seq_length);
    }
    let max_len = examples.iter().map(|e| e.tokens.len()).max().unwrap_or(0);
    let pad_to = 32;
    let width = (1 + pad_to * max_len.div_ceil(pad_to)).min(max_seq_length);
    let mut tokens = vec![0i32; batch_size * width];
    let mut lengths = Vec::with_capacity(batch_size * 2);
    let mut truncated = false;
    for (j, e) in examples.iter().enumerate().take(batch_size) {
        let n = e.tokens.len().min(max_seq_length);
        truncated |= n < e.tokens.len();
        for (k, &t) in e.tokens[..n].iter().enumerate() {
            tokens[j * width + k] = i32::try_from(t)
                .map_err(|_| TrainError::Config(format!("token id {t} does not fit in int32")))?;
        }
        lengths.push(e.offset as i32);
        lengths.push(n as i32);
    }
    Ok(Batch {
        tokens: Array::from_slice(&tokens, &[batch_size as i32, width as i32])?,
        lengths: Array::from_slice(&lengths, &[batch_size as i32, 2])?,
        truncated,
    })
}

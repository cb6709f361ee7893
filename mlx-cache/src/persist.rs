//! Prompt-cache files in mlx-lm 0.32.2's format (`save_prompt_cache` / `load_prompt_cache`):
//! one safetensors file whose arrays are the flattened cache states (`"<layer>.<i>.<j>"`,
//! ints, strings and `None` stored as arrays) and whose metadata holds the user metadata
//! (`"0.<key>"`), the cache class names (`"1.<layer>"`) and which entries were scalars
//! (`"2.<n>.0"` = key, `"2.<n>.1"` = `scalar` | `string` | `none`).
//!
//! A file written by mlx-lm loads here and one written here loads in mlx-lm, except for
//! [`crate::RotatingQuantizedKVCache`] and [`crate::TrellisKVCache`], which mlx-lm does not
//! have.

use std::collections::BTreeMap;
use std::path::Path;

use mlx_core::io::{load_safetensors, save_safetensors, StringMap};
use mlx_core::prelude::*;

use crate::state::StateValue;
use crate::{cache_from_state, Cache};

fn bad(path: &Path, message: String) -> Error {
    Error::InvalidArgument {
        op: "load_prompt_cache",
        message: format!("{}: {message}", path.display()),
    }
}

fn flatten(
    prefix: String,
    v: &StateValue,
    arrays: &mut Vec<(String, Array)>,
    scalars: &mut Vec<(String, &'static str)>,
) -> Result<()> {
    match v {
        StateValue::Array(a) => arrays.push((prefix, a.clone())),
        StateValue::Int(i) => {
            let a = Array::from_int(*i, Dtype::Int32)?;
            scalars.push((prefix.clone(), "scalar"));
            arrays.push((prefix, a));
        }
        StateValue::Str(s) => {
            let codes: Vec<i32> = s.chars().map(|c| c as i32).collect();
            scalars.push((prefix.clone(), "string"));
            arrays.push((prefix, Array::from_slice(&codes, &[codes.len() as i32])?));
        }
        StateValue::None => {
            scalars.push((prefix.clone(), "none"));
            arrays.push((prefix, Array::from_slice::<f32>(&[], &[0])?));
        }
        StateValue::List(items) => {
            for (j, item) in items.iter().enumerate() {
                flatten(format!("{prefix}.{j}"), item, arrays, scalars)?;
            }
        }
    }
    Ok(())
}

/// Writes `caches` (one per layer) and `metadata` to `path` as mlx-lm does.
pub fn save_prompt_cache(
    path: impl AsRef<Path>,
    caches: &[Box<dyn Cache>],
    metadata: &StringMap,
) -> Result<()> {
    // A file the loader could not read back is refused before anything is written.
    if let Some((i, c)) = caches
        .iter()
        .enumerate()
        .find(|(_, c)| !crate::KNOWN_CLASSES.contains(&c.class_name()))
    {
        return Err(Error::InvalidArgument {
            op: "save_prompt_cache",
            message: format!(
                "layer {i}: a {} cannot be saved to a prompt-cache file (the loader knows {})",
                c.class_name(),
                crate::KNOWN_CLASSES.join(", ")
            ),
        });
    }
    let mut arrays = Vec::new();
    let mut scalars = Vec::new();
    for (i, c) in caches.iter().enumerate() {
        flatten(i.to_string(), &c.state(), &mut arrays, &mut scalars)?;
    }
    let mut meta = StringMap::new();
    for (k, v) in metadata {
        meta.insert(format!("0.{k}"), v.clone());
    }
    for (i, c) in caches.iter().enumerate() {
        meta.insert(format!("1.{i}"), c.class_name().to_string());
    }
    meta.insert("2.0".into(), String::new());
    for (n, (key, kind)) in scalars.iter().enumerate() {
        meta.insert(format!("2.{}.0", n + 1), key.clone());
        meta.insert(format!("2.{}.1", n + 1), (*kind).to_string());
    }
    save_safetensors(path, arrays.iter().map(|(k, a)| (k.as_str(), a)), &meta)
}

/// How deep a flattened key (`<layer>.<i>.<j>...`) may nest.
const MAX_KEY_DEPTH: usize = 8;

/// A tree being rebuilt from flattened keys.
enum Node {
    Leaf(StateValue),
    Branch(BTreeMap<usize, Node>),
}

/// Why flattened keys do not rebuild a cache's state tree; the loader adds the file and the
/// array or layer.
#[derive(Debug)]
enum TreeError {
    /// A key with no indices.
    EmptyKey,
    /// Two keys name the same entry.
    Duplicate(usize),
    /// An entry is a value under one key and a list under another.
    ValueAndList(usize),
    /// A list's indices are not `0..n`.
    Gap(Vec<usize>),
}

impl std::fmt::Display for TreeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TreeError::EmptyKey => f.write_str("empty key"),
            TreeError::Duplicate(i) => write!(f, "duplicate entry {i}"),
            TreeError::ValueAndList(i) => write!(f, "entry {i} is both a value and a list"),
            TreeError::Gap(keys) => write!(f, "list indices {keys:?} are not 0..{}", keys.len()),
        }
    }
}

fn insert(
    node: &mut BTreeMap<usize, Node>,
    path: &[usize],
    value: StateValue,
) -> std::result::Result<(), TreeError> {
    match path {
        [] => Err(TreeError::EmptyKey),
        [last] => match node.insert(*last, Node::Leaf(value)) {
            None => Ok(()),
            Some(_) => Err(TreeError::Duplicate(*last)),
        },
        [first, rest @ ..] => {
            let child = node
                .entry(*first)
                .or_insert_with(|| Node::Branch(BTreeMap::new()));
            match child {
                Node::Branch(m) => insert(m, rest, value),
                Node::Leaf(_) => Err(TreeError::ValueAndList(*first)),
            }
        }
    }
}

fn build(node: Node) -> std::result::Result<StateValue, TreeError> {
    match node {
        Node::Leaf(v) => Ok(v),
        Node::Branch(m) => {
            if m.keys().copied().ne(0..m.len()) {
                return Err(TreeError::Gap(m.keys().copied().collect()));
            }
            Ok(StateValue::List(
                m.into_values()
                    .map(build)
                    .collect::<std::result::Result<_, _>>()?,
            ))
        }
    }
}

fn scalar_value(a: &Array, kind: &str) -> Result<StateValue> {
    Ok(match kind {
        "scalar" => match a.dtype() {
            Dtype::Bool => StateValue::Int(i64::from(a.item::<bool>()?)),
            _ => StateValue::Int(a.astype(Dtype::Int64)?.item::<i64>()?),
        },
        "string" => {
            let codes = a.astype(Dtype::Int32)?.to_vec::<i32>()?;
            StateValue::Str(
                codes
                    .iter()
                    .map(|&c| char::from_u32(c as u32).unwrap_or('\u{fffd}'))
                    .collect(),
            )
        }
        "none" => StateValue::None,
        other => {
            return Err(Error::InvalidArgument {
                op: "load_prompt_cache",
                message: format!("unknown scalar type {other:?}"),
            })
        }
    })
}

/// Reads a prompt-cache file written by mlx-lm or [`save_prompt_cache`]: the caches (one per
/// layer) and the user metadata.
pub fn load_prompt_cache(path: impl AsRef<Path>) -> Result<(Vec<Box<dyn Cache>>, StringMap)> {
    let path = path.as_ref();
    let (arrays, meta) = load_safetensors(path, None)?;
    let mut user = StringMap::new();
    let mut classes = BTreeMap::new();
    let mut scalar_keys: BTreeMap<usize, (Option<String>, Option<String>)> = BTreeMap::new();
    for (k, v) in &meta {
        let parts: Vec<&str> = k.splitn(3, '.').collect();
        match parts.as_slice() {
            ["0", rest @ ..] => {
                user.insert(rest.join("."), v.clone());
            }
            ["1", i] => {
                let i: usize = i
                    .parse()
                    .map_err(|_| bad(path, format!("bad class key {k:?}")))?;
                classes.insert(i, v.clone());
            }
            ["2", "0"] => {}
            ["2", n, which] => {
                let n: usize = n
                    .parse()
                    .map_err(|_| bad(path, format!("bad scalar key {k:?}")))?;
                let e = scalar_keys.entry(n).or_default();
                match *which {
                    "0" => e.0 = Some(v.clone()),
                    "1" => e.1 = Some(v.clone()),
                    _ => return Err(bad(path, format!("bad scalar key {k:?}"))),
                }
            }
            _ => {
                return Err(bad(
                    path,
                    format!("unexpected metadata key {k:?} (not a prompt-cache file?)"),
                ))
            }
        }
    }
    if classes.keys().copied().ne(0..classes.len()) {
        return Err(bad(
            path,
            "cache class entries are not numbered 0..n".into(),
        ));
    }
    let mut kinds = BTreeMap::new();
    for (n, (key, kind)) in scalar_keys {
        match (key, kind) {
            (Some(key), Some(kind)) => {
                kinds.insert(key, kind);
            }
            _ => return Err(bad(path, format!("scalar entry {n} is incomplete"))),
        }
    }
    let mut trees: BTreeMap<usize, Node> = BTreeMap::new();
    for (key, a) in &arrays {
        let value = match kinds.get(key) {
            Some(kind) => scalar_value(a, kind)?,
            None => StateValue::Array(a.clone()),
        };
        let path_ints: Vec<usize> = key
            .split('.')
            .map(|p| p.parse::<usize>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| bad(path, format!("unexpected array key {key:?}")))?;
        // Cache states nest at most a few levels; a deeper key would only recurse.
        if path_ints.len() > MAX_KEY_DEPTH {
            return Err(bad(
                path,
                format!(
                    "array key {:?}... nests {} levels (at most {MAX_KEY_DEPTH})",
                    key.chars().take(40).collect::<String>(),
                    path_ints.len()
                ),
            ));
        }
        insert(&mut trees, &path_ints, value)
            .map_err(|e| bad(path, format!("array {key:?}: {e}")))?;
    }
    let mut caches: Vec<Box<dyn Cache>> = Vec::with_capacity(classes.len());
    for (i, class) in classes {
        let state = match trees.remove(&i) {
            Some(node) => build(node).map_err(|e| bad(path, format!("layer {i}: {e}")))?,
            None => StateValue::List(Vec::new()),
        };
        caches.push(
            cache_from_state(&class, state)
                .map_err(|e| bad(path, format!("layer {i} ({class}): {e}")))?,
        );
    }
    if let Some(extra) = trees.keys().next() {
        return Err(bad(
            path,
            format!(
                "arrays for layer {extra} but only {} cache classes",
                caches.len()
            ),
        ));
    }
    Ok((caches, user))
}

/// Checks that `loaded` can stand in for `expected` (what the model's `make_cache` gives):
/// same number of layers and the same cache kind per layer. The error lists every difference.
pub fn check_compatible(expected: &[Box<dyn Cache>], loaded: &[Box<dyn Cache>]) -> Result<()> {
    let mut problems = Vec::new();
    if expected.len() != loaded.len() {
        problems.push(format!(
            "the model has {} layers, the prompt cache {}",
            expected.len(),
            loaded.len()
        ));
    }
    for (i, (e, l)) in expected.iter().zip(loaded).enumerate() {
        if e.class_name() != l.class_name() {
            problems.push(format!(
                "layer {i}: the model uses {}, the prompt cache holds {}",
                e.class_name(),
                l.class_name()
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::InvalidArgument {
            op: "restore_prompt_cache",
            message: problems.join("; "),
        })
    }
}

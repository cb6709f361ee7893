//! Cache state as a tree, mirroring the Python values mlx-lm's `state` properties return
//! (tuples of arrays, ints, strings and `None`).

use mlx_core::prelude::*;

/// One node of a cache's state.
#[derive(Clone, Debug)]
pub enum StateValue {
    Array(Array),
    Int(i64),
    Str(String),
    None,
    List(Vec<StateValue>),
}

fn bad(class: &'static str, what: String) -> Error {
    Error::InvalidArgument {
        op: "from_state",
        message: format!("{class}: {what}"),
    }
}

impl StateValue {
    pub fn list(self, class: &'static str, n: usize) -> Result<Vec<StateValue>> {
        match self {
            StateValue::List(v) if v.len() == n => Ok(v),
            StateValue::List(v) => Err(bad(
                class,
                format!("state has {} entries, expected {n}", v.len()),
            )),
            other => Err(bad(class, format!("state must be a list, got {other:?}"))),
        }
    }

    pub fn into_list(self, class: &'static str) -> Result<Vec<StateValue>> {
        match self {
            StateValue::List(v) => Ok(v),
            other => Err(bad(class, format!("expected a list, got {other:?}"))),
        }
    }

    pub fn array(self, class: &'static str) -> Result<Array> {
        match self {
            StateValue::Array(a) => Ok(a),
            other => Err(bad(class, format!("expected an array, got {other:?}"))),
        }
    }

    pub fn opt_array(self, class: &'static str) -> Result<Option<Array>> {
        match self {
            StateValue::Array(a) => Ok(Some(a)),
            StateValue::None => Ok(None),
            other => Err(bad(
                class,
                format!("expected an array or None, got {other:?}"),
            )),
        }
    }

    pub fn int(self, class: &'static str) -> Result<i64> {
        match self {
            StateValue::Int(i) => Ok(i),
            other => Err(bad(class, format!("expected an int, got {other:?}"))),
        }
    }

    pub fn usize(self, class: &'static str) -> Result<usize> {
        let i = self.int(class)?;
        usize::try_from(i).map_err(|_| bad(class, format!("expected a non-negative int, got {i}")))
    }

    pub fn string(self, class: &'static str) -> Result<String> {
        match self {
            StateValue::Str(s) => Ok(s),
            other => Err(bad(class, format!("expected a string, got {other:?}"))),
        }
    }

    /// Every array in the tree, depth first (what `mx.eval(cache.state)` evaluates).
    pub fn into_arrays(self) -> Vec<Array> {
        match self {
            StateValue::Array(a) => vec![a],
            StateValue::List(v) => v.into_iter().flat_map(StateValue::into_arrays).collect(),
            _ => Vec::new(),
        }
    }

    pub(crate) fn opt(a: &Option<Array>) -> StateValue {
        a.as_ref()
            .map_or(StateValue::None, |a| StateValue::Array(a.clone()))
    }

    pub(crate) fn count(v: usize) -> StateValue {
        StateValue::Int(v as i64)
    }
}

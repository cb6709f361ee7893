//! The unevaluated graph behind arrays, as text: to compare what a computation builds with
//! what mlx-lm builds for the same step (primitive kinds and counts, dtypes of intermediates).

use std::collections::BTreeMap;

use crate::array::{Array, VecHandle};
use crate::error::Result;
use crate::ffi::{check, StringHandle};

fn graph_text<'a>(outputs: impl IntoIterator<Item = &'a Array>, dot: bool) -> Result<String> {
    let op = if dot { "export_to_dot" } else { "print_graph" };
    let v = VecHandle::from_arrays(op, outputs)?;
    let mut s = StringHandle::null();
    // SAFETY: live vector handle; on success s.0 is an owned string, freed by StringHandle.
    check(op, unsafe { mlx_sys::mlxs_graph_text(&mut s.0, v.0, dot) })?;
    Ok(s.text())
}

/// MLX's `print_graph`: the inputs, the outputs, then one line per primitive in evaluation
/// order, `Primitive in [shape, dtype] ... -> out [shape, dtype]`.
pub fn print_graph<'a>(outputs: impl IntoIterator<Item = &'a Array>) -> Result<String> {
    graph_text(outputs, false)
}

/// MLX's `export_to_dot`, the format Python's `mx.export_to_dot` writes.
pub fn to_dot<'a>(outputs: impl IntoIterator<Item = &'a Array>) -> Result<String> {
    graph_text(outputs, true)
}

/// How many primitive nodes of each kind a DOT graph ([`to_dot`], or `mx.export_to_dot`)
/// holds: its `[label ="Kind", shape=rectangle]` nodes, by label.
pub fn primitive_counts(dot: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for line in dot.lines() {
        let Some(start) = line.find("[label =\"") else {
            continue;
        };
        if !line.contains("shape=rectangle") {
            continue;
        }
        let rest = &line[start + 9..];
        let label = rest.split('"').next().unwrap_or_default();
        *counts.entry(label.to_string()).or_insert(0) += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_graph_prints_and_counts() -> Result<()> {
        let a = Array::from_slice(&[1.0f32, 2.0], &[2])?;
        let b = (&(&a + &a)? * &a)?;
        let c = crate::ops::exp(&b, None)?;
        let dot = to_dot([&c])?;
        let counts = primitive_counts(&dot);
        assert_eq!(counts.get("Add"), Some(&1), "{dot}");
        assert_eq!(counts.get("Multiply"), Some(&1), "{dot}");
        assert_eq!(counts.get("Exp"), Some(&1), "{dot}");
        assert_eq!(counts.values().sum::<usize>(), 3, "{dot}");
        let text = print_graph([&c])?;
        assert!(text.contains("float32"), "{text}");
        Ok(())
    }
}

//! Reading golden files written by `cargo xtask goldens` (see `xtask/oracle/golden.py`), and
//! bit-exact comparison with a readable report. Used by the tests of every crate.
//!
//! A golden file is one `.safetensors` file: arrays `<case>.in<i>` / `<case>.out<i>`, and
//! metadata `case.<case>` = `op=<op>;inputs=<n>;outputs=<m>;<key>=<value>;...`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::array::Array;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::io::{load_safetensors, ArrayMap, StringMap};

/// A loaded golden file.
pub struct Goldens {
    path: PathBuf,
    arrays: ArrayMap,
    meta: StringMap,
}

/// One case: the op, its parameters, its inputs and the oracle's outputs.
pub struct Case {
    pub name: String,
    pub op: String,
    pub params: BTreeMap<String, String>,
    pub inputs: Vec<Array>,
    pub outputs: Vec<Array>,
}

fn bad(what: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op: "goldens",
        message: what.into(),
    }
}

impl Goldens {
    /// Loads `path`; the error says how to regenerate a missing file.
    pub fn load(path: impl AsRef<Path>) -> Result<Goldens> {
        let path = path.as_ref().to_path_buf();
        if !path.is_file() {
            return Err(bad(format!(
                "golden file {} is missing; regenerate with `cargo xtask goldens`",
                path.display()
            )));
        }
        let (arrays, meta) = load_safetensors(&path, None)?;
        Ok(Goldens { path, arrays, meta })
    }

    /// Every case, sorted by name.
    pub fn cases(&self) -> Result<Vec<Case>> {
        self.meta
            .iter()
            .filter_map(|(k, v)| k.strip_prefix("case.").map(|name| (name, v)))
            .map(|(name, spec)| self.build_case(name, spec))
            .collect()
    }

    /// The case called `name`.
    pub fn case(&self, name: &str) -> Result<Case> {
        let spec = self
            .meta
            .get(&format!("case.{name}"))
            .ok_or_else(|| bad(format!("{}: no case {name}", self.path.display())))?;
        self.build_case(name, spec)
    }

    /// Runs every case through `run` and compares its outputs with the oracle's, bit for bit.
    /// Fails when there are fewer than `min_cases` cases (a generator that silently lost cases)
    /// or when any case differs or errors; the message lists every such case.
    pub fn check_all<E: std::fmt::Display>(
        &self,
        min_cases: usize,
        mut run: impl FnMut(&Case) -> std::result::Result<Vec<Array>, E>,
    ) -> std::result::Result<usize, String> {
        let cases = self.cases().map_err(|e| e.to_string())?;
        if cases.len() < min_cases {
            return Err(format!(
                "{}: only {} cases (expected at least {min_cases})",
                self.path.display(),
                cases.len()
            ));
        }
        let failures: Vec<String> = cases
            .iter()
            .filter_map(|c| match run(c) {
                Ok(out) => c.check(&out).err(),
                Err(e) => Some(format!("case {}: {e}", c.name)),
            })
            .collect();
        if failures.is_empty() {
            Ok(cases.len())
        } else {
            Err(format!(
                "{} of {} cases differ:\n{}",
                failures.len(),
                cases.len(),
                failures.join("\n")
            ))
        }
    }

    /// An array by its full name.
    pub fn array(&self, key: &str) -> Result<&Array> {
        self.arrays
            .get(key)
            .ok_or_else(|| bad(format!("{}: no array {key}", self.path.display())))
    }

    /// The file's metadata (including the `case.*` entries and `__generator__`).
    pub fn metadata(&self) -> &StringMap {
        &self.meta
    }

    fn build_case(&self, name: &str, spec: &str) -> Result<Case> {
        let mut params = BTreeMap::new();
        for field in spec.split(';').filter(|f| !f.is_empty()) {
            let (k, v) = field
                .split_once('=')
                .ok_or_else(|| bad(format!("case {name}: bad field {field:?}")))?;
            params.insert(k.to_string(), v.to_string());
        }
        let count = |k: &str| -> Result<usize> {
            params
                .get(k)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| bad(format!("case {name}: missing {k}")))
        };
        let (n_in, n_out) = (count("inputs")?, count("outputs")?);
        let inputs = (0..n_in)
            .map(|i| self.array(&format!("{name}.in{i}")).cloned())
            .collect::<Result<_>>()?;
        let outputs = (0..n_out)
            .map(|i| self.array(&format!("{name}.out{i}")).cloned())
            .collect::<Result<_>>()?;
        let op = params
            .remove("op")
            .ok_or_else(|| bad(format!("case {name}: no op")))?;
        params.remove("inputs");
        params.remove("outputs");
        Ok(Case {
            name: name.to_string(),
            op,
            params,
            inputs,
            outputs,
        })
    }
}

impl Case {
    fn raw(&self, key: &str) -> Result<&str> {
        self.params
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| bad(format!("case {}: no parameter {key}", self.name)))
    }

    /// Whether the parameter is present and not `none`.
    pub fn has(&self, key: &str) -> bool {
        self.params.get(key).is_some_and(|v| v != "none")
    }

    pub fn str(&self, key: &str) -> Result<&str> {
        self.raw(key)
    }

    pub fn int(&self, key: &str) -> Result<i64> {
        let v = self.raw(key)?;
        v.parse()
            .map_err(|_| bad(format!("case {}: {key}={v} is not an int", self.name)))
    }

    pub fn float(&self, key: &str) -> Result<f64> {
        let v = self.raw(key)?;
        v.parse()
            .map_err(|_| bad(format!("case {}: {key}={v} is not a float", self.name)))
    }

    pub fn bool(&self, key: &str) -> Result<bool> {
        match self.raw(key)? {
            "true" => Ok(true),
            "false" => Ok(false),
            v => Err(bad(format!("case {}: {key}={v} is not a bool", self.name))),
        }
    }

    pub fn ints(&self, key: &str) -> Result<Vec<i64>> {
        let v = self.raw(key)?;
        let inner = v
            .strip_prefix('[')
            .and_then(|x| x.strip_suffix(']'))
            .ok_or_else(|| bad(format!("case {}: {key}={v} is not a list", self.name)))?;
        inner
            .split(',')
            .filter(|x| !x.is_empty())
            .map(|x| {
                x.parse().map_err(|_| {
                    bad(format!(
                        "case {}: {key}={v} is not a list of ints",
                        self.name
                    ))
                })
            })
            .collect()
    }

    /// `ints` as `i32` (axes, shapes).
    pub fn i32s(&self, key: &str) -> Result<Vec<i32>> {
        self.ints(key)?
            .into_iter()
            .map(|x| {
                i32::try_from(x)
                    .map_err(|_| bad(format!("case {}: {key} out of i32 range", self.name)))
            })
            .collect()
    }

    /// Input `i`.
    pub fn input(&self, i: usize) -> Result<&Array> {
        self.inputs
            .get(i)
            .ok_or_else(|| bad(format!("case {}: no input {i}", self.name)))
    }

    /// Compares `actual` with every output, bit for bit; the error describes the first
    /// mismatch (shape, dtype, or the largest difference and where it is).
    pub fn check(&self, actual: &[Array]) -> std::result::Result<(), String> {
        if actual.len() != self.outputs.len() {
            return Err(format!(
                "case {}: {} outputs, oracle has {}",
                self.name,
                actual.len(),
                self.outputs.len()
            ));
        }
        for (i, (a, e)) in actual.iter().zip(&self.outputs).enumerate() {
            assert_bit_equal(a, e)
                .map_err(|m| format!("case {} ({}) output {i}: {m}", self.name, self.op))?;
        }
        Ok(())
    }
}

/// `Ok` when both arrays have the same shape, dtype and bytes. Otherwise a report naming the
/// number of differing elements and the largest absolute difference with its index.
pub fn assert_bit_equal(actual: &Array, expected: &Array) -> std::result::Result<(), String> {
    if actual.shape() != expected.shape() {
        return Err(format!(
            "shape {:?}, expected {:?}",
            actual.shape(),
            expected.shape()
        ));
    }
    if actual.dtype() != expected.dtype() {
        return Err(format!(
            "dtype {}, expected {}",
            actual.dtype(),
            expected.dtype()
        ));
    }
    let (a, e) = match (actual.to_bytes(), expected.to_bytes()) {
        (Ok(a), Ok(e)) => (a, e),
        (Err(x), _) | (_, Err(x)) => return Err(format!("reading data: {x}")),
    };
    if a == e {
        return Ok(());
    }
    let item = actual.dtype().size();
    let differing = a
        .chunks(item)
        .zip(e.chunks(item))
        .filter(|(x, y)| x != y)
        .count();
    let detail = describe_difference(actual, expected).unwrap_or_else(|x| format!("({x})"));
    Err(format!(
        "{differing} of {} elements differ; {detail}",
        actual.size()
    ))
}

fn describe_difference(actual: &Array, expected: &Array) -> Result<String> {
    if actual.dtype() == Dtype::Complex64 || actual.dtype() == Dtype::Bool {
        return Ok(String::new());
    }
    let a = actual.astype(Dtype::Float64)?.to_vec::<f64>()?;
    let e = expected.astype(Dtype::Float64)?.to_vec::<f64>()?;
    let (mut worst, mut at) = (0.0f64, 0usize);
    for (i, (x, y)) in a.iter().zip(&e).enumerate() {
        let d = if x.to_bits() == y.to_bits() {
            0.0
        } else if x.is_nan() || y.is_nan() {
            f64::INFINITY
        } else {
            (x - y).abs()
        };
        if d > worst || (at == 0 && d > 0.0 && worst == 0.0) {
            worst = d;
            at = i;
        }
    }
    Ok(format!(
        "largest |diff| {worst:e} at flat index {at}: got {}, expected {}",
        a[at], e[at]
    ))
}

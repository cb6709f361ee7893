//! Structure-aware mutation driven by [`arbitrary::Unstructured`]: every choice (which node of
//! a JSON document, which field of a binary header, which value) is drawn from a buffer of
//! seeded random bytes, so an input is reproduced from its seed and iteration alone.

use arbitrary::Unstructured;
use serde_json::{Map, Value};

/// A small, fast, seeded generator (xorshift64*) for the bytes an input is drawn from.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 8);
        while out.len() < n {
            out.extend(self.next_u64().to_le_bytes());
        }
        out.truncate(n);
        out
    }
}

/// Draws in `0..n` (0 when the bytes run out or `n` is 0).
pub fn below(u: &mut Unstructured, n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    u.int_in_range(0..=n - 1).unwrap_or(0)
}

pub fn chance(u: &mut Unstructured, percent: usize) -> bool {
    below(u, 100) < percent
}

pub fn pick<'a, T>(u: &mut Unstructured, items: &'a [T]) -> &'a T {
    &items[below(u, items.len())]
}

/// Integers that break size arithmetic.
pub const INTERESTING_INTS: &[i64] = &[
    0,
    1,
    -1,
    2,
    3,
    7,
    9,
    16,
    31,
    32,
    33,
    64,
    127,
    128,
    129,
    255,
    256,
    65_535,
    65_536,
    1_000_000,
    i32::MAX as i64,
    i32::MAX as i64 + 1,
    i32::MIN as i64,
    u32::MAX as i64,
    (1i64 << 32) + 8,
    i64::MAX,
    i64::MIN,
];

pub fn interesting_u64(u: &mut Unstructured) -> u64 {
    match below(u, 4) {
        0 => *pick(u, INTERESTING_INTS) as u64,
        1 => u.arbitrary::<u64>().unwrap_or(0),
        2 => below(u, 64) as u64,
        _ => u64::MAX - below(u, 16) as u64,
    }
}

fn interesting_value(u: &mut Unstructured, keys: &[&str]) -> Value {
    match below(u, 14) {
        0..=3 => Value::from(*pick(u, INTERESTING_INTS)),
        4 => Value::from(*pick(
            u,
            &[0.0, -0.0, 1e-30, 1e308, -1e308, 0.5, 1.5, f64::MAX, 1e-320],
        )),
        5 => Value::Null,
        6 => Value::Bool(chance(u, 50)),
        7 => Value::String(String::new()),
        8 => Value::String(
            pick(
                u,
                &[
                    "nan", "inf", "-inf", "llama", "affine", "mxfp4", "nvfp4", "yarn", "linear",
                    "llama3", "dynamic", "longrope", "su", "{{", "<s>", "</s>", "\u{0}",
                ],
            )
            .to_string(),
        ),
        9 => Value::String("x".repeat(below(u, 5000))),
        10 => Value::Array(vec![Value::from(*pick(u, INTERESTING_INTS)); below(u, 40)]),
        11 => {
            let mut m = Map::new();
            for _ in 0..below(u, 4) {
                m.insert(
                    pick(u, keys).to_string(),
                    Value::from(*pick(u, INTERESTING_INTS)),
                );
            }
            Value::Object(m)
        }
        12 => {
            // Deep nesting (serde_json stops at 128).
            let mut v = Value::from(1);
            for _ in 0..below(u, 200) {
                v = Value::Array(vec![v]);
            }
            v
        }
        _ => Value::String(pick(u, keys).to_string()),
    }
}

/// Applies one to four mutations at random places of `v`; `keys` are field names worth
/// inserting (the loader's own).
pub fn mutate_json(u: &mut Unstructured, v: &mut Value, keys: &[&str]) {
    for _ in 0..=below(u, 4) {
        mutate_at(u, v, keys, 0);
    }
}

fn mutate_at(u: &mut Unstructured, v: &mut Value, keys: &[&str], depth: usize) {
    let descend = depth < 12 && chance(u, 65);
    match v {
        Value::Object(m) if descend && !m.is_empty() => {
            let i = below(u, m.len());
            if let Some((_, child)) = m.iter_mut().nth(i) {
                return mutate_at(u, child, keys, depth + 1);
            }
        }
        Value::Array(a) if descend && !a.is_empty() => {
            let i = below(u, a.len());
            return mutate_at(u, &mut a[i], keys, depth + 1);
        }
        _ => {}
    }
    match v {
        Value::Object(m) => match below(u, 4) {
            0 if !m.is_empty() => {
                let k = m.keys().nth(below(u, m.len())).cloned().unwrap_or_default();
                m.remove(&k);
            }
            1 => {
                let val = interesting_value(u, keys);
                m.insert(pick(u, keys).to_string(), val);
            }
            2 if !m.is_empty() => {
                // Copy one field's value onto another key.
                let (k, val) = m
                    .iter()
                    .nth(below(u, m.len()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .unwrap_or_default();
                let target = if chance(u, 50) {
                    pick(u, keys).to_string()
                } else {
                    k
                };
                m.insert(target, val);
            }
            _ => *v = interesting_value(u, keys),
        },
        Value::Array(a) => match below(u, 4) {
            0 if !a.is_empty() => {
                a.remove(below(u, a.len()));
            }
            1 if !a.is_empty() => {
                let item = a[below(u, a.len())].clone();
                for _ in 0..=below(u, 8) {
                    a.push(item.clone());
                }
            }
            2 => a.push(interesting_value(u, keys)),
            _ => *v = interesting_value(u, keys),
        },
        Value::Number(n) => {
            *v = if chance(u, 50) {
                interesting_value(u, keys)
            } else {
                let x = n.as_i64().unwrap_or(1);
                Value::from(x.wrapping_add(*pick(u, &[-1i64, 1, -2, 2, 1 << 31])))
            }
        }
        Value::String(s) => {
            *v = match below(u, 3) {
                0 => interesting_value(u, keys),
                1 => {
                    let mut b = s.clone().into_bytes();
                    mutate_bytes(u, &mut b, 2);
                    Value::String(String::from_utf8_lossy(&b).into_owned())
                }
                _ => Value::String(format!("{s}{s}")),
            }
        }
        _ => *v = interesting_value(u, keys),
    }
}

/// Byte-level havoc: flips, overwrites with interesting values, inserts, deletes, truncation.
pub fn mutate_bytes(u: &mut Unstructured, b: &mut Vec<u8>, max_ops: usize) {
    for _ in 0..=below(u, max_ops) {
        let len = b.len();
        match below(u, 7) {
            0 if len > 0 => {
                let i = below(u, len);
                b[i] ^= 1 << below(u, 8);
            }
            1 if len > 0 => {
                let i = below(u, len);
                b[i] = *pick(u, &[0u8, 0xff, 0x7f, 0x80, 1, b'{', b'"', b'%']);
            }
            2 if len >= 8 => {
                let i = below(u, len - 7);
                b[i..i + 8].copy_from_slice(&interesting_u64(u).to_le_bytes());
            }
            3 if len >= 4 => {
                let i = below(u, len - 3);
                b[i..i + 4].copy_from_slice(&(interesting_u64(u) as u32).to_le_bytes());
            }
            4 => {
                let i = below(u, len + 1);
                let n = below(u, 16);
                let fill = u.arbitrary::<u8>().unwrap_or(0);
                b.splice(i..i, std::iter::repeat_n(fill, n));
            }
            5 if len > 0 => {
                let i = below(u, len);
                let n = below(u, (len - i).min(32) + 1);
                b.drain(i..i + n);
            }
            _ => {
                let n = below(u, len + 1);
                b.truncate(n);
            }
        }
    }
}

//! `KVCache` and `QuantizedKVCache`: one buffer that grows in steps of 256 tokens.

use mlx_core::prelude::*;

use crate::mask::{create_attention_mask, AttentionMask};
use crate::state::StateValue;
use crate::store::{incoming, zeros_for, QuantSpec, Store};
use crate::{as_i32, seq_of, Cache, Kv};

/// Growth step of the buffers, as in mlx-lm.
pub const STEP: usize = 256;

/// The shared mechanism: keys/values buffers of capacity a multiple of [`STEP`], of which
/// the first `offset` tokens are valid.
#[derive(Clone, Debug, Default)]
pub(crate) struct StepBuffer {
    pub keys: Option<Store>,
    pub values: Option<Store>,
    pub offset: usize,
}

impl StepBuffer {
    /// mlx-lm's `KVCache.update_and_fetch` (`quant: None`) and
    /// `QuantizedKVCache.update_and_fetch` (`quant: Some`), which differ only in how new
    /// capacity is made.
    fn update(
        &mut self,
        keys: &Array,
        values: &Array,
        quant: Option<QuantSpec>,
    ) -> Result<(Store, Store)> {
        let n = seq_of(keys, values, "update_and_fetch")?;
        let prev = self.offset;
        let capacity = self.keys.as_ref().map(|k| k.seq_len() as usize);
        if capacity.is_none_or(|c| prev + n > c) {
            let new_steps = as_i32(n.div_ceil(STEP) * STEP, "update_and_fetch")?;
            let p = as_i32(prev, "update_and_fetch")?;
            match (self.keys.take(), self.values.take()) {
                (Some(mut k), Some(mut v)) => {
                    if prev % STEP != 0 {
                        k = k.slice(0, p)?;
                        v = v.slice(0, p)?;
                    }
                    // KVCache makes zeros from the new data; QuantizedKVCache from the
                    // stored arrays (`expand_quant`).
                    let (nk, nv) = match quant {
                        None => (
                            zeros_for(keys, new_steps, None)?,
                            zeros_for(values, new_steps, None)?,
                        ),
                        Some(_) => (k.zeros_like_seq(new_steps)?, v.zeros_like_seq(new_steps)?),
                    };
                    self.keys = Some(Store::concat(&[&k, &nk])?);
                    self.values = Some(Store::concat(&[&v, &nv])?);
                }
                _ => {
                    self.keys = Some(zeros_for(keys, new_steps, quant)?);
                    self.values = Some(zeros_for(values, new_steps, quant)?);
                }
            }
        }
        self.offset += n;
        let (start, stop) = (
            as_i32(prev, "update_and_fetch")?,
            as_i32(self.offset, "update_and_fetch")?,
        );
        let (k_new, v_new) = (incoming(keys, quant)?, incoming(values, quant)?);
        let (k, v) = match (&self.keys, &self.values) {
            (Some(k), Some(v)) => (
                k.update(&k_new, start, stop)?,
                v.update(&v_new, start, stop)?,
            ),
            _ => unreachable_state()?,
        };
        self.keys = Some(k);
        self.values = Some(v);
        self.fetch()
    }

    /// The filled prefix: views `[..., :offset, :]` unless the buffer is exactly full.
    pub fn fetch(&self) -> Result<(Store, Store)> {
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) => {
                if (self.offset as i32) < k.seq_len() {
                    let o = as_i32(self.offset, "fetch")?;
                    Ok((k.slice(0, o)?, v.slice(0, o)?))
                } else {
                    Ok((k.clone(), v.clone()))
                }
            }
            _ => Err(Error::InvalidArgument {
                op: "fetch",
                message: "the cache is empty".into(),
            }),
        }
    }

    /// [`StepBuffer::update`] as attention takes it.
    fn update_kv(&mut self, keys: &Array, values: &Array, quant: Option<QuantSpec>) -> Result<Kv> {
        let (k, v) = self.update(keys, values, quant)?;
        Kv::from_stores(k, v, quant)
    }

    /// The filled prefix as attention takes it; `None` before the first write.
    fn fetch_kv(&self, quant: Option<QuantSpec>) -> Result<Option<Kv>> {
        if self.keys.is_none() {
            return Ok(None);
        }
        let (k, v) = self.fetch()?;
        Kv::from_stores(k, v, quant).map(Some)
    }

    fn make_mask(
        &self,
        n: usize,
        window_size: Option<usize>,
        return_array: bool,
    ) -> Result<AttentionMask> {
        create_attention_mask(n, self.offset, return_array, window_size)
    }

    fn trim(&mut self, n: usize) -> usize {
        let n = n.min(self.offset);
        self.offset -= n;
        n
    }

    fn nbytes(&self) -> usize {
        self.keys.as_ref().map_or(0, Store::nbytes) + self.values.as_ref().map_or(0, Store::nbytes)
    }
}

fn unreachable_state<T>() -> Result<T> {
    Err(Error::InvalidArgument {
        op: "update_and_fetch",
        message: "cache buffers missing".into(),
    })
}

pub(crate) fn store_state(s: &Option<Store>) -> StateValue {
    match s {
        None => StateValue::None,
        Some(Store::Dense(a)) => StateValue::Array(a.clone()),
        Some(Store::Quantized(q)) => StateValue::List(
            q.arrays()
                .iter()
                .map(|a| StateValue::Array((*a).clone()))
                .collect(),
        ),
    }
}

pub(crate) fn store_from_state(v: StateValue, class: &'static str) -> Result<Option<Store>> {
    match v {
        StateValue::None => Ok(None),
        StateValue::Array(a) => Ok(Some(Store::Dense(a))),
        StateValue::List(items) if items.len() == 3 => {
            let mut it = items.into_iter();
            let mut next = || it.next().map_or_else(unreachable_state, |x| x.array(class));
            Ok(Some(Store::Quantized(crate::QTensor {
                weight: next()?,
                scales: next()?,
                biases: next()?,
            })))
        }
        other => Err(Error::InvalidArgument {
            op: "from_state",
            message: format!(
                "{class}: expected an array, a quantized triple or None, got {other:?}"
            ),
        }),
    }
}

/// The float dtypes a cache's keys, values, scales and biases may have.
const FLOAT_DTYPES: &str = "float16, bfloat16, float32 or float64";

fn dtype_err(class: &'static str, message: String) -> Error {
    Error::InvalidArgument {
        op: "from_state",
        message: format!("{class}: {message}"),
    }
}

/// Checks that `a` (the cache's `what`) has a floating-point dtype.
pub(crate) fn check_float(a: &Array, class: &'static str, what: &str) -> Result<()> {
    if a.dtype().is_floating() {
        return Ok(());
    }
    Err(dtype_err(
        class,
        format!(
            "{what} are {}; expected a floating-point dtype ({FLOAT_DTYPES}), as the model's \
             attention produces",
            a.dtype().name()
        ),
    ))
}

/// The float dtype `s` holds (its array's, or its scales') after checking each part: a dense
/// store floating point, a quantized one `uint32` data with floating-point scales and biases of
/// one dtype; `quantized` says which the class keeps.
fn check_store(
    s: &Store,
    class: &'static str,
    what: &str,
    quantized: bool,
) -> Result<mlx_core::Dtype> {
    match (s, quantized) {
        (Store::Dense(a), false) => {
            check_float(a, class, what)?;
            Ok(a.dtype())
        }
        (Store::Quantized(q), true) => {
            if q.weight.dtype() != mlx_core::Dtype::Uint32 {
                return Err(dtype_err(
                    class,
                    format!(
                        "quantized {what} are {}; expected uint32 (packed affine data)",
                        q.weight.dtype().name()
                    ),
                ));
            }
            check_float(&q.scales, class, &format!("{what} scales"))?;
            check_float(&q.biases, class, &format!("{what} biases"))?;
            if q.scales.dtype() != q.biases.dtype() {
                return Err(dtype_err(
                    class,
                    format!(
                        "{what} scales are {} but their biases {}; expected one dtype",
                        q.scales.dtype().name(),
                        q.biases.dtype().name()
                    ),
                ));
            }
            Ok(q.scales.dtype())
        }
        (_, true) => Err(dtype_err(
            class,
            format!("{what} are a plain array; this cache keeps quantized triples"),
        )),
        (_, false) => Err(dtype_err(
            class,
            format!("{what} are a quantized triple; this cache keeps plain arrays"),
        )),
    }
}

/// Keys and values from a prompt-cache file's state, their dtypes checked (see
/// [`check_store`]; keys and values of one dtype): a file whose tensors were relabelled
/// (`int32` keys) is refused here rather than fed to attention.
pub(crate) fn kv_from_state(
    k: StateValue,
    v: StateValue,
    class: &'static str,
    quantized: bool,
) -> Result<(Option<Store>, Option<Store>)> {
    let keys = store_from_state(k, class)?;
    let values = store_from_state(v, class)?;
    let kd = keys
        .as_ref()
        .map(|s| check_store(s, class, "keys", quantized))
        .transpose()?;
    let vd = values
        .as_ref()
        .map(|s| check_store(s, class, "values", quantized))
        .transpose()?;
    if let (Some(kd), Some(vd)) = (kd, vd) {
        if kd != vd {
            return Err(dtype_err(
                class,
                format!(
                    "keys are {} but values {}; expected one dtype",
                    kd.name(),
                    vd.name()
                ),
            ));
        }
    }
    Ok((keys, values))
}

/// mlx-lm's `KVCache`.
#[derive(Clone, Debug, Default)]
pub struct KVCache {
    pub(crate) buf: StepBuffer,
}

impl KVCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// Quantizes the whole buffer (mlx-lm's `to_quantized`; defaults there are 64 / 4).
    pub fn to_quantized(&self, group_size: i32, bits: i32) -> Result<QuantizedKVCache> {
        let spec = QuantSpec::new(group_size, bits)?;
        let q = |s: &Option<Store>| s.as_ref().map(|s| s.quantized(spec)).transpose();
        Ok(QuantizedKVCache {
            buf: StepBuffer {
                keys: q(&self.buf.keys)?,
                values: q(&self.buf.values)?,
                offset: self.buf.offset,
            },
            spec,
        })
    }

    /// Codes the filled prefix into a [`TrellisKVCache`] of `bits` and state window `l`.
    pub fn to_trellis(&self, bits: i32, l: u32) -> Result<crate::TrellisKVCache> {
        let spec = crate::TrellisKvSpec::new(bits, l)?;
        if self.buf.keys.is_none() || self.buf.offset == 0 {
            return crate::TrellisKVCache::new(bits, l);
        }
        match self.buf.fetch()? {
            (Store::Dense(k), Store::Dense(v)) => crate::TrellisKVCache::from_dense(spec, &k, &v),
            _ => Err(Error::InvalidArgument {
                op: "to_trellis",
                message: "the cache holds quantized data".into(),
            }),
        }
    }

    pub fn from_state(state: StateValue) -> Result<Self> {
        let [k, v, o]: [StateValue; 3] = array3(state.list("KVCache", 3)?)?;
        let (keys, values) = kv_from_state(k, v, "KVCache", false)?;
        Ok(KVCache {
            buf: StepBuffer {
                keys,
                values,
                offset: o.usize("KVCache")?,
            },
        })
    }
}

pub(crate) fn array3(v: Vec<StateValue>) -> Result<[StateValue; 3]> {
    v.try_into().map_err(|_| Error::InvalidArgument {
        op: "from_state",
        message: "expected 3 entries".into(),
    })
}

impl Cache for KVCache {
    fn class_name(&self) -> &'static str {
        "KVCache"
    }
    fn offset(&self) -> usize {
        self.buf.offset
    }
    fn size(&self) -> usize {
        self.buf.offset
    }
    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<Kv> {
        self.buf.update_kv(keys, values, None)
    }
    fn depend_on(&mut self, dep: &Array) -> Result<bool> {
        match &mut self.buf.keys {
            Some(Store::Dense(k)) => {
                *k = mlx_core::ops::depends(k, dep)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
    fn fetch(&self) -> Result<Option<Kv>> {
        self.buf.fetch_kv(None)
    }
    fn make_mask(
        &self,
        n: usize,
        window: Option<usize>,
        return_array: bool,
    ) -> Result<AttentionMask> {
        self.buf.make_mask(n, window, return_array)
    }
    fn state(&self) -> StateValue {
        StateValue::List(vec![
            store_state(&self.buf.keys),
            store_state(&self.buf.values),
            StateValue::count(self.buf.offset),
        ])
    }
    fn is_trimmable(&self) -> bool {
        true
    }
    fn trim(&mut self, n: usize) -> usize {
        self.buf.trim(n)
    }
    fn nbytes(&self) -> usize {
        self.buf.nbytes()
    }
    fn is_empty(&self) -> bool {
        self.buf.keys.is_none()
    }
}

/// mlx-lm's `QuantizedKVCache` (affine; mlx-lm's defaults are group 64, 8 bits).
#[derive(Clone, Debug)]
pub struct QuantizedKVCache {
    pub(crate) buf: StepBuffer,
    pub(crate) spec: QuantSpec,
}

impl QuantizedKVCache {
    /// Fails for settings MLX cannot quantize with (see [`QuantSpec::new`]).
    pub fn new(group_size: i32, bits: i32) -> Result<Self> {
        Ok(QuantizedKVCache {
            buf: StepBuffer::default(),
            spec: QuantSpec::new(group_size, bits)?,
        })
    }

    pub fn spec(&self) -> QuantSpec {
        self.spec
    }

    pub fn from_state(state: StateValue) -> Result<Self> {
        let c = "QuantizedKVCache";
        let mut it = state.list(c, 5)?.into_iter();
        let mut next = || {
            it.next().ok_or_else(|| Error::InvalidArgument {
                op: "from_state",
                message: c.into(),
            })
        };
        let (k, v) = (next()?, next()?);
        let (keys, values) = kv_from_state(k, v, c, true)?;
        let offset = next()?.usize(c)?;
        let group_size = next()?.int(c)?;
        let bits = next()?.int(c)?;
        let spec = QuantSpec::from_state(c, group_size, bits)?;
        Ok(QuantizedKVCache {
            buf: StepBuffer {
                keys,
                values,
                offset,
            },
            spec,
        })
    }
}

impl Cache for QuantizedKVCache {
    fn class_name(&self) -> &'static str {
        "QuantizedKVCache"
    }
    fn offset(&self) -> usize {
        self.buf.offset
    }
    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<Kv> {
        self.buf.update_kv(keys, values, Some(self.spec))
    }
    fn fetch(&self) -> Result<Option<Kv>> {
        self.buf.fetch_kv(Some(self.spec))
    }
    fn make_mask(
        &self,
        n: usize,
        window: Option<usize>,
        return_array: bool,
    ) -> Result<AttentionMask> {
        self.buf.make_mask(n, window, return_array)
    }
    fn state(&self) -> StateValue {
        StateValue::List(vec![
            store_state(&self.buf.keys),
            store_state(&self.buf.values),
            StateValue::count(self.buf.offset),
            StateValue::Int(self.spec.group_size.into()),
            StateValue::Int(self.spec.bits.into()),
        ])
    }
    fn is_trimmable(&self) -> bool {
        true
    }
    fn trim(&mut self, n: usize) -> usize {
        self.buf.trim(n)
    }
    fn nbytes(&self) -> usize {
        self.buf.nbytes()
    }
    fn is_empty(&self) -> bool {
        self.buf.keys.is_none()
    }
}

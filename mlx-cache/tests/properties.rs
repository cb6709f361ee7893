//! Property tests of the caches' stateful invariants.

use mlx_cache::*;
use mlx_core::prelude::*;
use mlx_core::testing::assert_bit_equal;
use proptest::prelude::*;

const H: i32 = 2;
const D: i32 = 32;

/// Distinct, exactly representable rows: token `t` of the sequence, head `h`, dim `d`.
fn tokens(start: usize, n: usize, salt: f32) -> Array {
    let mut data = Vec::with_capacity(H as usize * n * D as usize);
    for h in 0..H {
        for t in start..start + n {
            for d in 0..D {
                data.push(salt + (t as f32) + (h as f32) * 0.5 + (d as f32) / 64.0);
            }
        }
    }
    Array::from_slice(&data, &[1, H, n as i32, D]).unwrap()
}

fn write(c: &mut dyn Cache, start: usize, n: usize) -> Kv {
    c.update_and_fetch(&tokens(start, n, 0.0), &tokens(start, n, 1000.0))
        .unwrap()
}

fn dense(kv: &Kv) -> (Array, Array) {
    match kv {
        Kv::Dense { keys, values } => (keys.clone(), values.clone()),
        Kv::Quantized { .. } => panic!("expected dense"),
    }
}

fn store_dense(s: &Store) -> Array {
    match s {
        Store::Dense(a) => a.clone(),
        Store::Quantized(_) => panic!("expected dense"),
    }
}

fn eq(a: &Array, b: &Array) -> Result<(), TestCaseError> {
    assert_bit_equal(a, b).map_err(TestCaseError::fail)
}

fn slice_seq(a: &Array, start: i32, stop: i32) -> Array {
    ops::slice_axis(a, 2, start, stop, None).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn offset_is_written_minus_trimmed(ops in prop::collection::vec((1usize..40, 0usize..30), 1..12)) {
        let mut caches: Vec<Box<dyn Cache>> = vec![
            Box::new(KVCache::new()),
            Box::new(QuantizedKVCache::new(32, 4).unwrap()),
            Box::new(ConcatenateKVCache::new()),
            Box::new(ChunkedKVCache::new(1 << 20)),
            Box::new(BatchKVCache::new(&[0])),
            Box::new(TrellisKVCache::new(3, 6).unwrap()),
            Box::new(TrellisKVCache::with_spec(coded(3, 6))),
        ];
        for c in caches.iter_mut() {
            let mut expected = 0usize;
            for &(w, t) in &ops {
                write(c.as_mut(), expected, w);
                expected += w;
                let got = c.trim(t);
                prop_assert_eq!(got, t.min(expected));
                expected -= got;
                prop_assert_eq!(c.offset(), expected, "{}", c.class_name());
            }
        }
    }

    #[test]
    fn trim_then_rewrite_equals_a_fresh_cache(a in 1usize..300, t in 0usize..300, b in 1usize..40) {
        let t = t.min(a);
        let kinds: [fn() -> Box<dyn Cache>; 2] =
            [|| Box::new(KVCache::new()), || Box::new(BatchKVCache::new(&[0]))];
        for make in kinds {
            let mut c = make();
            write(c.as_mut(), 0, a);
            prop_assert_eq!(c.trim(t), t);
            let x = dense(&write(c.as_mut(), a - t, b));
            let mut fresh = make();
            if a - t > 0 {
                write(fresh.as_mut(), 0, a - t);
            }
            let y = dense(&write(fresh.as_mut(), a - t, b));
            eq(&x.0, &y.0)?;
            eq(&x.1, &y.1)?;
        }
    }

    /// Two sequences joined into one batch, decoded one step together and trimmed, then
    /// separated again: each row holds exactly what its own cache holds after the same
    /// writes and trim, at its own rope offset, with its padding masked.
    #[test]
    fn batch_rows_trim_like_their_own_caches(a in 1usize..40, b in 1usize..40, steps in 1usize..4, t in 0usize..40) {
        let (mut c1, mut c2) = (KVCache::new(), KVCache::new());
        write(&mut c1, 0, a);
        c2.update_and_fetch(&tokens(0, b, 500.0), &tokens(0, b, 1500.0)).unwrap();
        let mut batch = BatchKVCache::from_single(&c1).unwrap();
        batch.extend(&BatchKVCache::from_single(&c2).unwrap()).unwrap();
        for s in 0..steps {
            let (k1, v1) = (tokens(a + s, 1, 0.0), tokens(a + s, 1, 1000.0));
            let (k2, v2) = (tokens(b + s, 1, 500.0), tokens(b + s, 1, 1500.0));
            c1.update_and_fetch(&k1, &v1).unwrap();
            c2.update_and_fetch(&k2, &v2).unwrap();
            let k = ops::concatenate(&[&k1, &k2], 0, None).unwrap();
            let v = ops::concatenate(&[&v1, &v2], 0, None).unwrap();
            batch.update_and_fetch(&k, &v).unwrap();
        }
        // A trim within every row's own tokens.
        let t = t.min(a.min(b) + steps);
        prop_assert_eq!(batch.trim(t), t);
        prop_assert_eq!(c1.trim(t), t);
        prop_assert_eq!(c2.trim(t), t);
        let offsets = batch.offsets().unwrap().to_vec::<i32>().unwrap();
        prop_assert_eq!(offsets, vec![c1.offset() as i32, c2.offset() as i32]);
        let AttentionMask::Array(m) = batch.make_mask(1, None, false).unwrap() else {
            return Err(TestCaseError::fail("a batch always has an explicit mask"));
        };
        let total = batch.offset() + 1;
        let m = m.to_vec::<bool>().unwrap();
        for (row, pad) in batch.left_padding().iter().enumerate() {
            let row_mask = &m[row * total..(row + 1) * total];
            let visible = row_mask.iter().filter(|&&x| x).count();
            prop_assert_eq!(visible, total - *pad as usize, "row {} sees its own tokens", row);
        }
        for (keep, own) in [(0usize, &c1), (1, &c2)] {
            let mut one = batch.clone();
            one.filter(&[keep]).unwrap();
            prop_assert_eq!(one.left_padding(), &[0]);
            prop_assert_eq!(one.offset(), own.offset());
            let x = dense(&one.fetch().unwrap().unwrap());
            let y = dense(&own.fetch().unwrap().unwrap());
            eq(&x.0, &y.0)?;
            eq(&x.1, &y.1)?;
        }
    }

    #[test]
    fn rotating_holds_keep_prefix_and_latest_suffix(
        max_size in 4usize..24, keep in 0usize..4, writes in prop::collection::vec(1usize..6, 1..20)
    ) {
        let keep = keep.min(max_size - 1);
        let mut rot = RotatingKVCache::new(max_size, keep).unwrap();
        let mut plain = KVCache::new();
        let mut pos = 0;
        for w in writes {
            write(&mut rot, pos, w);
            let all = dense(&write(&mut plain, pos, w)).0;
            pos += w;
            let (tk, _) = rot.temporal().unwrap().unwrap();
            let tk = store_dense(&tk);
            let held = tk.shape()[2] as usize;
            prop_assert!(held >= pos.min(max_size), "holds {held} < {}", pos.min(max_size));
            // keep prefix then the most recent (held - keep) tokens, in order.
            let k = keep.min(held);
            let expect = if held >= pos {
                all.clone()
            } else {
                ops::concatenate(
                    &[&slice_seq(&all, 0, k as i32), &slice_seq(&all, (pos - (held - k)) as i32, pos as i32)],
                    2,
                    None,
                )
                .unwrap()
            };
            eq(&tk, &expect)?;
        }
    }

    #[test]
    fn before_wrapping_rotating_and_plain_agree(max_size in 8usize..64, writes in prop::collection::vec(1usize..5, 1..10)) {
        let mut rot = RotatingKVCache::new(max_size, 2).unwrap();
        let mut plain = KVCache::new();
        let mut pos = 0;
        for w in writes {
            if pos + w > max_size {
                break;
            }
            let a = dense(&write(&mut rot, pos, w));
            let b = dense(&write(&mut plain, pos, w));
            pos += w;
            eq(&a.0, &b.0)?;
            eq(&a.1, &b.1)?;
            for n in [1usize, 3].into_iter().filter(|n| pos + n <= max_size) {
                match (rot.make_mask(n, None, false).unwrap(), plain.make_mask(n, None, false).unwrap()) {
                    (AttentionMask::None, AttentionMask::None) | (AttentionMask::Causal, AttentionMask::Causal) => {}
                    (AttentionMask::Array(x), AttentionMask::Array(y)) => eq(&x, &y)?,
                    (x, y) => prop_assert!(false, "masks differ: {x:?} vs {y:?}"),
                }
            }
        }
    }

    #[test]
    fn to_quantized_equals_quantizing_the_plain_contents(n in 1usize..300, bits in prop::sample::select(vec![2, 4, 8])) {
        let mut plain = KVCache::new();
        let (k, _) = dense(&write(&mut plain, 0, n));
        let q = plain.to_quantized(32, bits).unwrap();
        let spec = QuantSpec { group_size: 32, bits };
        let direct = spec.quantize(&k).unwrap();
        match q.fetch().unwrap().unwrap() {
            Kv::Quantized { keys, .. } => {
                eq(&keys.weight, &direct.weight)?;
                eq(&keys.scales, &direct.scales)?;
                eq(&keys.biases, &direct.biases)?;
            }
            Kv::Dense { .. } => prop_assert!(false, "not quantized"),
        }
    }

    #[test]
    fn rollback_then_rewrite_equals_writing_only_the_accepted(
        max_size in 4usize..16, prefix in 1usize..40, drafts in 2usize..6, accepted in 0usize..6
    ) {
        let accepted = accepted.min(drafts);
        let mut a = RotatingKVCache::new(max_size, 1).unwrap();
        let mut b = RotatingKVCache::new(max_size, 1).unwrap();
        for t in 0..prefix {
            write(&mut a, t, 1);
            write(&mut b, t, 1);
        }
        write(&mut a, prefix, drafts);
        a.rollback(drafts - accepted).unwrap();
        if accepted > 0 {
            write(&mut b, prefix, accepted);
        }
        prop_assert_eq!(a.offset(), b.offset());
        let (ta, tb) = (a.temporal().unwrap().unwrap(), b.temporal().unwrap().unwrap());
        eq(&store_dense(&ta.0), &store_dense(&tb.0))?;
        // Both continue identically.
        let (x, y) = (dense(&write(&mut a, prefix + accepted, 1)), dense(&write(&mut b, prefix + accepted, 1)));
        let (ta, tb) = (a.temporal().unwrap().unwrap(), b.temporal().unwrap().unwrap());
        eq(&store_dense(&ta.0), &store_dense(&tb.0))?;
        prop_assert_eq!(x.0.shape()[2] > 0, y.0.shape()[2] > 0);
    }

    #[test]
    fn an_impossible_trim_changes_nothing(max_size in 4usize..12, extra in 1usize..10, n in 1usize..10) {
        let mut a = RotatingKVCache::new(max_size, 0).unwrap();
        let mut b = RotatingKVCache::new(max_size, 0).unwrap();
        for t in 0..max_size + extra {
            write(&mut a, t, 1);
            write(&mut b, t, 1);
        }
        prop_assert!(!a.is_trimmable());
        prop_assert_eq!(a.trim(n), 0);
        prop_assert_eq!(a.offset(), b.offset());
        let (x, y) = (dense(&write(&mut a, max_size + extra, 1)), dense(&write(&mut b, max_size + extra, 1)));
        eq(&x.0, &y.0)?;
        eq(&x.1, &y.1)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// The quantized rotating cache (not in mlx-lm) is the rotating cache with each write
    /// quantized: its contents equal quantizing the dense rotating cache's, step by step, and
    /// converting a dense one midway gives the same as having quantized all along.
    #[test]
    fn rotating_quantized_equals_quantized_rotating(
        max_size in 4usize..20, keep in 0usize..3, writes in prop::collection::vec(1usize..5, 1..14), switch in 0usize..14
    ) {
        let spec = QuantSpec { group_size: 32, bits: 4 };
        let mut plain = RotatingKVCache::new(max_size, keep.min(max_size - 1)).unwrap();
        let mut quant = RotatingQuantizedKVCache::new(max_size, keep.min(max_size - 1), 32, 4).unwrap();
        let mut converted: Option<RotatingQuantizedKVCache> = None;
        let mut pos = 0;
        for (step, w) in writes.into_iter().enumerate() {
            if step == switch {
                converted = Some(plain.to_quantized(32, 4).unwrap());
            }
            let d = dense(&write(&mut plain, pos, w));
            let q = write(&mut quant, pos, w);
            let c = converted.as_mut().map(|c| write(c, pos, w));
            pos += w;
            let direct = spec.quantize(&d.0).unwrap();
            for kv in std::iter::once(q).chain(c) {
                match kv {
                    Kv::Quantized { keys, .. } => {
                        eq(&keys.weight, &direct.weight)?;
                        eq(&keys.scales, &direct.scales)?;
                        eq(&keys.biases, &direct.biases)?;
                    }
                    Kv::Dense { .. } => prop_assert!(false, "not quantized"),
                }
            }
            prop_assert_eq!(quant.offset(), plain.offset());
        }
    }
}

#[test]
fn rollback_preconditions_are_checked() {
    let mut c = RotatingKVCache::new(8, 0).unwrap();
    for t in 0..10 {
        write(&mut c, t, 1);
    }
    let err = c.rollback(1).unwrap_err().to_string();
    assert!(err.contains("multi-token"), "{err}");
    write(&mut c, 10, 3);
    assert!(c.rollback(4).is_err());
    c.rollback(2).unwrap();
    assert_eq!(c.offset(), 11);
    assert!(
        c.rollback(2).is_err(),
        "only one token of the write remains"
    );
    c.rollback(1).unwrap();
    assert_eq!(c.offset(), 10);
}

#[test]
fn recurrent_state_snapshot_and_restore() {
    let mut c = ArraysCache::new(2);
    c.set(0, tokens(0, 1, 0.0)).unwrap();
    let snap = c.snapshot();
    c.set(0, tokens(5, 1, 0.0)).unwrap();
    c.set(1, tokens(6, 1, 0.0)).unwrap();
    c.restore(&snap).unwrap();
    assert_bit_equal(c.get(0).unwrap(), &tokens(0, 1, 0.0)).unwrap();
    assert!(c.get(1).is_none());
    assert!(c.set(2, tokens(0, 1, 0.0)).is_err());
    assert!(!c.is_trimmable());
    assert_eq!(c.trim(3), 0);
    assert!(c
        .update_and_fetch(&tokens(0, 1, 0.0), &tokens(0, 1, 0.0))
        .is_err());
    assert!(c.restore(&ArraysCache::new(3).snapshot()).is_err());
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    let mut c = KVCache::new();
    let bad = Array::from_slice(&[1.0f32; 4], &[2, 2]).unwrap();
    assert!(c.update_and_fetch(&bad, &bad).is_err());
    let k = tokens(0, 2, 0.0);
    let v = Array::from_slice(&[1.0f32; 4 * 32], &[1, 2, 2, 32]).unwrap();
    assert!(
        c.update_and_fetch(&k, &tokens(0, 3, 0.0)).is_err(),
        "seq lengths differ"
    );
    c.update_and_fetch(&k, &v).unwrap();
    assert!(RotatingKVCache::new(4, 4).is_err());
    assert!(RotatingKVCache::new(0, 0).is_err());
}

/// Writes `chunks` through an ArraysCache as a recurrent layer would (state after token `p` is
/// `tokens(p, 1, 0.0)` in slot 0 and `tokens(p, 1, 7.0)` in slot 1), recording per-token states.
fn recurrent(max_rollback: usize, chunks: &[usize]) -> ArraysCache {
    let mut c = ArraysCache::with_history(2, max_rollback);
    for &n in chunks {
        let start = c.position();
        let steps = (1..=n)
            .map(|i| {
                vec![
                    Some(tokens(start + i, 1, 0.0)),
                    Some(tokens(start + i, 1, 7.0)),
                ]
            })
            .collect();
        c.checkpoint_steps(steps).unwrap();
        c.set(0, tokens(start + n, 1, 0.0)).unwrap();
        c.set(1, tokens(start + n, 1, 7.0)).unwrap();
        c.advance(n).unwrap();
    }
    c
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Rolling a recurrent cache back `n` tokens restores exactly the state recorded there,
    /// when `n` is within the kept history; otherwise nothing changes.
    #[test]
    fn recurrent_rollback_restores_recorded_state(
        chunks in prop::collection::vec(1usize..5, 1..6),
        max_rollback in 0usize..6,
        n in 0usize..8,
    ) {
        let mut c = recurrent(max_rollback, &chunks);
        let total: usize = chunks.iter().sum();
        let depth = c.rollback_depth();
        prop_assert_eq!(depth, max_rollback.min(total));
        let trimmed = c.trim(n);
        if n >= 1 && n <= depth {
            prop_assert_eq!(trimmed, n);
            prop_assert!(c.can_trim(0));
            let p = total - n;
            prop_assert_eq!(c.position(), p);
            let want0 = if p == 0 { None } else { Some(tokens(p, 1, 0.0)) };
            match (c.get(0), want0) {
                (Some(a), Some(b)) => assert_bit_equal(a, &b).map_err(TestCaseError::fail)?,
                (None, None) => {}
                (a, b) => prop_assert!(false, "slot 0 {:?} vs {:?}", a.is_some(), b.is_some()),
            }
            if p > 0 {
                assert_bit_equal(c.get(1).unwrap(), &tokens(p, 1, 7.0))
                    .map_err(TestCaseError::fail)?;
            }
            // Going on from there records again, and can be rolled back again.
            let start = c.position();
            c.checkpoint_steps(vec![vec![Some(tokens(99, 1, 0.0)), None]]).unwrap();
            c.set(0, tokens(99, 1, 0.0)).unwrap();
            c.advance(1).unwrap();
            prop_assert_eq!(c.trim(1), 1);
            prop_assert_eq!(c.position(), start);
        } else {
            prop_assert_eq!(trimmed, 0);
            prop_assert_eq!(c.position(), total);
            assert_bit_equal(c.get(0).unwrap(), &tokens(total, 1, 0.0))
                .map_err(TestCaseError::fail)?;
        }
    }
}

/// Every array and count of a cache's state, for exact comparison (arrays as their bits).
fn flat_state(s: StateValue, out: &mut Vec<String>, arrays: &mut Vec<Array>) {
    match s {
        StateValue::Array(a) => {
            out.push(format!("array{:?}", a.shape()));
            arrays.push(a);
        }
        StateValue::List(v) => v.into_iter().for_each(|s| flat_state(s, out, arrays)),
        other => out.push(format!("{other:?}")),
    }
}

fn same_state(a: &dyn Cache, b: &dyn Cache) -> Result<(), TestCaseError> {
    let (mut ma, mut aa, mut mb, mut ab) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    flat_state(a.state(), &mut ma, &mut aa);
    flat_state(b.state(), &mut mb, &mut ab);
    prop_assert_eq!(ma, mb);
    for (x, y) in aa.iter().zip(&ab) {
        eq(x, y)?;
    }
    Ok(())
}

/// The first `n` tokens of a write sequence, as the writes a direct decode makes (the last
/// one cut short).
fn prefix_writes(writes: &[usize], n: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut left = n;
    for &w in writes {
        if left == 0 {
            break;
        }
        out.push(w.min(left));
        left -= w.min(left);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// With history a rotating cache (dense or quantized) can be trimmed after it has wrapped:
    /// trimming `n <= max_rollback` tokens leaves exactly the cache that writing only the first
    /// `total - n` tokens (the last write cut short, as a direct decode would make it) leaves:
    /// the same ring buffers bit for bit, the same `offset`, `idx`, `keep`, and the same
    /// future. Deeper than the history, a wrapped cache refuses (0, unchanged).
    #[test]
    fn rotating_with_history_trims_exactly_after_wrapping(
        max_size in 3usize..10, keep in 0usize..2, quantized in any::<bool>(),
        writes in prop::collection::vec(prop_oneof![3 => Just(1usize), 1 => 2usize..6], 1..24),
        max_rollback in 1usize..7, n in 1usize..9, then in 1usize..4,
    ) {
        let keep = keep.min(max_size - 1);
        let make = |rollback: usize| -> Box<dyn Cache> {
            if quantized {
                let mut c = RotatingQuantizedKVCache::new(max_size, keep, 32, 4).unwrap();
                c.set_max_rollback(rollback);
                Box::new(c)
            } else {
                let mut c = RotatingKVCache::new(max_size, keep).unwrap();
                c.set_max_rollback(rollback);
                Box::new(c)
            }
        };
        let feed = |c: &mut Box<dyn Cache>, ws: &[usize]| {
            let mut t = 0;
            for &w in ws {
                write(c.as_mut(), t, w);
                t += w;
            }
        };
        let total: usize = writes.iter().sum();
        let mut a = make(max_rollback);
        feed(&mut a, &writes);
        let before = a.boxed_clone();
        let trimmed = a.trim(n);
        // Within the history a trim is exact; deeper it may still be (a recorded write that
        // reaches further back), and once wrapped it is exact or refused.
        if n <= max_rollback && n <= total {
            prop_assert_eq!(trimmed, n);
        }
        let exact = n <= total && (n <= max_rollback || (trimmed == n && total >= max_size));
        if exact {
            let mut b = make(0);
            feed(&mut b, &prefix_writes(&writes, total - n));
            prop_assert_eq!(a.offset(), total - n);
            same_state(a.as_ref(), b.as_ref())?;
            // The same future, one token at a time and in one write.
            let mut t = total - n;
            for _ in 0..then {
                let (x, y) = (write(a.as_mut(), t, 1), write(b.as_mut(), t, 1));
                for (p, q) in x.arrays().iter().zip(y.arrays()) {
                    eq(p, q)?;
                }
                t += 1;
            }
            write(a.as_mut(), t, 3);
            write(b.as_mut(), t, 3);
            same_state(a.as_ref(), b.as_ref())?;
        } else if total >= max_size {
            // Wrapped and beyond what was recorded: refused, nothing changed.
            prop_assert_eq!(trimmed, 0);
            same_state(a.as_ref(), before.as_ref())?;
        }
    }
}

/// Without history (mlx-lm's behaviour) a wrapped rotating cache cannot be trimmed, and
/// `trim_prompt_cache` refuses the whole trim when one cache cannot go back.
#[test]
fn a_wrapped_rotating_cache_without_history_refuses_and_so_does_the_prompt_cache() {
    let mut caches: Vec<Box<dyn Cache>> = vec![
        Box::new(KVCache::new()),
        Box::new(RotatingKVCache::new(4, 0).unwrap()),
    ];
    for t in 0..6 {
        for c in caches.iter_mut() {
            write(c.as_mut(), t, 1);
        }
    }
    assert!(!can_trim_prompt_cache(&caches));
    assert_eq!(trim_prompt_cache(&mut caches, 1), 0);
    assert_eq!(caches[0].offset(), 6);
    // With history enabled on fresh caches the same sequence can go back.
    let mut caches: Vec<Box<dyn Cache>> = vec![
        Box::new(KVCache::new()),
        Box::new(RotatingKVCache::new(4, 0).unwrap()),
    ];
    enable_rollback(&mut caches, 3);
    for t in 0..6 {
        for c in caches.iter_mut() {
            write(c.as_mut(), t, 1);
        }
    }
    assert!(can_trim_prompt_cache(&caches));
    assert_eq!(
        trim_prompt_cache(&mut caches, 4),
        0,
        "deeper than the history"
    );
    assert_eq!(trim_prompt_cache(&mut caches, 3), 3);
    assert_eq!(caches[1].offset(), 3);
}

/// Seeded pseudo-Gaussian `(1, H, n, D)` rows (token `start + i`'s row depends only on the
/// token), with a per-channel offset as keys have.
fn gaussian(start: usize, n: usize, salt: u64) -> Array {
    let mut data = Vec::with_capacity(H as usize * n * D as usize);
    for h in 0..H as u64 {
        for t in start as u64..(start + n) as u64 {
            let mut z = (salt ^ (h << 40) ^ t).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            for d in 0..D {
                // Sum of 4 uniforms, centered: roughly Gaussian, variance 1/3.
                let mut s = 0.0f32;
                for _ in 0..4 {
                    z ^= z << 13;
                    z ^= z >> 7;
                    z ^= z << 17;
                    s += (z >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                }
                data.push(s + if d % 7 == 0 { 4.0 } else { 0.0 });
            }
        }
    }
    Array::from_slice(&data, &[1, H, n as i32, D]).unwrap()
}

fn twrite(c: &mut dyn Cache, start: usize, n: usize) -> Kv {
    c.update_and_fetch(&gaussian(start, n, 1), &gaussian(start, n, 2))
        .unwrap()
}

fn tfeed(c: &mut dyn Cache, writes: &[usize]) {
    let mut t = 0;
    for &w in writes {
        twrite(c, t, w);
        t += w;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// The trellis cache's trim contract: a token's code depends only on the token and the
    /// center fixed by the first write, so trimming `n` tokens leaves exactly the cache that
    /// writing only the kept tokens (the same first write, the last write cut short) leaves,
    /// with the same future; trimming everything leaves a fresh cache. Writes in another
    /// chunking after the same first write give the same state.
    #[test]
    fn trellis_trim_equals_writing_only_the_kept_tokens(
        bits in 2i32..=4, sink in 0usize..4,
        writes in prop::collection::vec(prop_oneof![3 => Just(1usize), 1 => 2usize..9], 1..10),
        n in 0usize..20, then in 1usize..4,
    ) {
        let total: usize = writes.iter().sum();
        let n = n.min(total);
        let spec = coded(bits, 6).with_sink(sink);
        let make = || -> Box<dyn Cache> { Box::new(TrellisKVCache::with_spec(spec)) };
        let mut a = make();
        tfeed(a.as_mut(), &writes);
        prop_assert_eq!(a.trim(n), n);
        prop_assert_eq!(a.offset(), total - n);
        let kept = total - n;
        let mut b = make();
        if kept == 0 {
            prop_assert!(a.is_empty());
        } else if kept >= writes[0] {
            tfeed(b.as_mut(), &prefix_writes(&writes, kept));
            same_state(a.as_ref(), b.as_ref())?;
        } else {
            // The first write was cut: the center stays the one it fixed.
            return Ok(());
        }
        // The same future, one token at a time, then a longer write.
        let mut t = kept;
        for _ in 0..then {
            let (x, y) = (twrite(a.as_mut(), t, 1), twrite(b.as_mut(), t, 1));
            for (p, q) in x.arrays().iter().zip(y.arrays()) {
                eq(p, q)?;
            }
            t += 1;
        }
        twrite(a.as_mut(), t, 3);
        twrite(b.as_mut(), t, 3);
        same_state(a.as_ref(), b.as_ref())?;
        // Another chunking of the same tokens after the same first write.
        let mut c = make();
        let first = if kept == 0 { 1 } else { writes[0] };
        twrite(c.as_mut(), 0, first);
        for p in first..t + 3 {
            twrite(c.as_mut(), p, 1);
        }
        if kept > 0 {
            same_state(a.as_ref(), c.as_ref())?;
        }
    }

    /// Decoded keys and values are close to what was written (relative mean squared error
    /// bounds per bit width, well above what the code gives on these rows), in the dtype
    /// written, and `KVCache::to_trellis` codes like one first write of the same tokens.
    #[test]
    fn trellis_decodes_close_to_the_written_values(
        bits in 2i32..=4, n in 1usize..40, half in any::<bool>(),
    ) {
        let mut c = TrellisKVCache::with_spec(coded(bits, 8));
        let (k, v) = (gaussian(0, n, 1), gaussian(0, n, 2));
        let (k, v) = if half {
            (k.astype(Dtype::Float16).unwrap(), v.astype(Dtype::Float16).unwrap())
        } else {
            (k, v)
        };
        let (dk, dv) = dense(&c.update_and_fetch(&k, &v).unwrap());
        prop_assert_eq!(dk.dtype(), k.dtype());
        prop_assert_eq!(dk.shape(), k.shape());
        let bound = [0.0, 0.0, 0.15, 0.05, 0.015][bits as usize];
        for (x, y) in [(&k, &dk), (&v, &dv)] {
            let (x, y) = (x.to_vec_f32().unwrap(), y.to_vec_f32().unwrap());
            // Error relative to each row's spread around the center (the part coded).
            let mean: f32 = x.iter().sum::<f32>() / x.len() as f32;
            let var: f32 = x.iter().map(|a| (a - mean) * (a - mean)).sum::<f32>();
            let err: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum::<f32>();
            prop_assert!(err / var < bound, "{bits} bits: relative error {}", err / var);
        }
        let mut plain = KVCache::new();
        write_kv(&mut plain, &k, &v);
        let t = plain.to_trellis(bits, 8).unwrap();
        prop_assert_eq!(t.spec(), TrellisKvSpec::new(bits, 8).unwrap());
        let (tk, tv) = dense(&t.fetch().unwrap().unwrap());
        let mut d = TrellisKVCache::new(bits, 8).unwrap();
        let (dk2, dv2) = dense(&d.update_and_fetch(&k, &v).unwrap());
        eq(&tk, &dk2)?;
        eq(&tv, &dv2)?;
    }
}

/// Settings with no exact recent window (every token past the sink read from its code).
fn coded(bits: i32, l: u32) -> TrellisKvSpec {
    TrellisKvSpec::new(bits, l).unwrap().with_window(0, 0)
}

fn write_kv(c: &mut dyn Cache, k: &Array, v: &Array) {
    c.update_and_fetch(k, v).unwrap();
}

#[test]
fn trellis_state_round_trips_and_bad_settings_are_errors() {
    let mut c = TrellisKVCache::with_spec(coded(3, 8).with_sink(4));
    tfeed(&mut c, &[5, 1, 1]);
    let back = cache_from_state("TrellisKVCache", c.state()).unwrap();
    same_state(&c, back.as_ref()).unwrap();
    let (x, y) = (c.fetch().unwrap().unwrap(), back.fetch().unwrap().unwrap());
    for (p, q) in x.arrays().iter().zip(y.arrays()) {
        assert_bit_equal(p, q).unwrap();
    }
    // Codes take 3 bits a value plus a float32 scale a token and head, plus the centers and
    // the first 4 tokens exactly.
    let per_token = (D as usize * 3 / 32 + 1) * 4;
    let exact = 4 * D as usize * 4;
    assert_eq!(
        c.nbytes(),
        2 * H as usize * (3 * per_token + exact + 2 * D as usize * 4)
    );
    let dir = std::env::temp_dir().join(format!("trellis_kv_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.safetensors");
    let caches: Vec<Box<dyn Cache>> = vec![Box::new(c.clone())];
    save_prompt_cache(&path, &caches, &Default::default()).unwrap();
    let (loaded, _) = load_prompt_cache(&path).unwrap();
    same_state(&c, loaded[0].as_ref()).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    for (bits, l) in [(1, 8), (5, 8), (3, 3), (3, 17)] {
        assert!(TrellisKVCache::new(bits, l).is_err(), "{bits} {l}");
    }
    // head_dim 40 at 3 bits is not a whole number of words: coded padded to 64, decoded back
    // to 40 (a constant vector is its own center: decoded exactly).
    let mut c = TrellisKVCache::with_spec(coded(3, 8).with_sink(0));
    let x = Array::from_slice(&[0.5f32; 40], &[1, 1, 1, 40]).unwrap();
    let (k, _) = dense(&c.update_and_fetch(&x, &x).unwrap());
    assert_bit_equal(&k, &x).unwrap();
    let mut c = TrellisKVCache::new(3, 8).unwrap();
    // Non-finite values are refused.
    let x = Array::from_slice(&[f32::NAN; 32], &[1, 1, 1, 32]).unwrap();
    assert!(c.update_and_fetch(&x, &x).is_err());
    assert!(c.is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// With an exact recent window the trellis cache reads the last `window` tokens exactly;
    /// a trim of up to `history` tokens leaves what writing only the kept tokens gives (the
    /// same decoded keys and values, the same future); a deeper one (short of everything) is
    /// refused when it would leave the window short of exact tokens.
    #[test]
    fn trellis_window_reads_recent_tokens_exactly_and_trims_within_history(
        window in 1usize..6, history in 0usize..4, sink in 0usize..3,
        writes in prop::collection::vec(prop_oneof![3 => Just(1usize), 1 => 2usize..7], 1..10),
        n in 0usize..12,
    ) {
        let total: usize = writes.iter().sum();
        let n = n.min(total);
        let spec = TrellisKvSpec::new(3, 6).unwrap().with_sink(sink).with_window(window, history);
        let make = || -> Box<dyn Cache> { Box::new(TrellisKVCache::with_spec(spec)) };
        let mut a = make();
        tfeed(a.as_mut(), &writes);
        // The last min(window, total - sink) tokens come back exactly.
        let (k, _) = dense(&a.fetch().unwrap().unwrap());
        let exact = window.min(total.saturating_sub(sink)) + sink.min(total);
        let all = gaussian(0, total, 1);
        let tail = |x: &Array, from: usize| slice_seq(x, from as i32, total as i32);
        eq(&tail(&k, total - window.min(total.saturating_sub(sink))), &tail(&all, total - window.min(total.saturating_sub(sink))))?;
        prop_assert!(exact <= total);
        let before = a.boxed_clone();
        let trimmed = a.trim(n);
        if n <= history || n == total || total - n <= sink {
            prop_assert_eq!(trimmed, n);
        }
        if trimmed == 0 && n > 0 {
            same_state(a.as_ref(), before.as_ref())?;
            return Ok(());
        }
        let kept = total - n;
        if kept == 0 || kept < writes[0] {
            return Ok(());
        }
        let mut b = make();
        tfeed(b.as_mut(), &prefix_writes(&writes, kept));
        let mut t = kept;
        for step in 0..3 {
            let w = if step == 2 { 3 } else { 1 };
            let (x, y) = (twrite(a.as_mut(), t, w), twrite(b.as_mut(), t, w));
            for (p, q) in x.arrays().iter().zip(y.arrays()) {
                eq(p, q)?;
            }
            t += w;
        }
    }
}

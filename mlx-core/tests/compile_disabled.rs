//! `disable_compile` is process-wide, so it has its own test binary (and a lock).

use std::sync::Mutex;

use mlx_core::compile::{disable_compile, enable_compile};
use mlx_core::prelude::*;
use mlx_core::testing::assert_bit_equal;

static MODE: Mutex<()> = Mutex::new(());

fn g_poly(a: &[Array]) -> Result<Vec<Array>> {
    let x = &a[0];
    let t = ((ops::exp(x, None)? * 2.0)? + ops::tanh(x, None)?)?;
    Ok(vec![ops::sigmoid(&t, None)?])
}

#[test]
fn disabled_compile_runs_the_closure_every_call() {
    let _lock = MODE.lock().unwrap_or_else(|e| e.into_inner());
    disable_compile().unwrap();
    let f = compile(g_poly, false).unwrap();
    let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let runs: Vec<_> = (0..3).map(|_| f.call(std::slice::from_ref(&x))).collect();
    enable_compile().unwrap();
    for got in runs {
        assert_bit_equal(
            &got.unwrap()[0],
            &g_poly(std::slice::from_ref(&x)).unwrap()[0],
        )
        .unwrap();
    }
    assert_eq!(f.trace_count(), 3);
    // Enabled again: traced once, then replayed.
    f.call(std::slice::from_ref(&x)).unwrap();
    f.call(std::slice::from_ref(&x)).unwrap();
    assert_eq!(f.trace_count(), 4);
}

#[test]
fn disabling_applies_to_functions_compiled_before() {
    let _lock = MODE.lock().unwrap_or_else(|e| e.into_inner());
    let f = compile(g_poly, false).unwrap();
    let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    f.call(std::slice::from_ref(&x)).unwrap();
    assert_eq!(f.trace_count(), 1);
    disable_compile().unwrap();
    let r = f.call(std::slice::from_ref(&x));
    enable_compile().unwrap();
    assert_bit_equal(
        &r.unwrap()[0],
        &g_poly(std::slice::from_ref(&x)).unwrap()[0],
    )
    .unwrap();
    // The mode is checked at every call (as in Python): the closure ran.
    assert_eq!(f.trace_count(), 2);
    // Enabled again: the earlier trace is replayed.
    f.call(std::slice::from_ref(&x)).unwrap();
    assert_eq!(f.trace_count(), 2);
}

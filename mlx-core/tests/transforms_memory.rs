//! Nothing leaks when a transform fails halfway: active memory returns to its baseline and
//! every payload (the closures handed to MLX) is dropped. Its own test binary, because active
//! memory is process-wide.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Active memory is process-wide: the tests of this file run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

use mlx_core::memory;
use mlx_core::prelude::*;

/// Counts its drops.
struct Tracked(Arc<AtomicUsize>);
impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn sum2(x: &Array) -> Result<Array> {
    let s = x.shape();
    let l = ops::ones(&[1, s[0]], x.dtype(), None)?;
    let r = ops::ones(&[s[1], 1], x.dtype(), None)?;
    l.matmul(x)?.matmul(&r)?.reshape(&[])
}

fn big() -> Array {
    Array::from_slice(&vec![0.5f32; 256 * 256], &[256, 256]).unwrap()
}

/// One round of every failure path. Returns how many payloads were created.
fn failing_round(drops: &Arc<AtomicUsize>) -> usize {
    let x = big();
    let mut made = 0;

    // value_and_grad: a panic after building a large intermediate, then an Err.
    let f = |a: &[Array]| -> Result<Vec<Array>> {
        let y = a[0].matmul(&a[0])?;
        y.eval()?;
        std::panic::panic_any(7u8);
    };
    let r = catch_unwind(AssertUnwindSafe(|| {
        value_and_grad(f, &[0])(std::slice::from_ref(&x))
    }));
    assert!(r.is_err());
    let g = |a: &[Array]| -> Result<Vec<Array>> {
        let y = a[0].matmul(&a[0])?;
        y.eval()?;
        Err(Error::Callback("no".into()))
    };
    assert!(value_and_grad(g, &[0])(std::slice::from_ref(&x)).is_err());

    // compile: a panic during the trace.
    {
        let c = compile(
            |a: &[Array]| -> Result<Vec<Array>> {
                let _y = a[0].matmul(&a[0])?;
                std::panic::panic_any(8u8);
            },
            false,
        )
        .unwrap();
        assert!(catch_unwind(AssertUnwindSafe(|| c.call(std::slice::from_ref(&x)))).is_err());
    }

    // custom_vjp whose backward fails, owning tracked payloads and a captured array.
    {
        let t1 = Tracked(Arc::clone(drops));
        let t2 = Tracked(Arc::clone(drops));
        made += 2;
        let held = big();
        let custom = custom_vjp(
            move |a: &[Array]| {
                let _keep = &t1;
                Ok(vec![(&a[0] * &held)?])
            },
            move |_p, _c, _o| {
                let _keep = &t2;
                std::panic::panic_any(9u8)
            },
        )
        .unwrap();
        let loss = |a: &[Array]| sum2(&custom.call(a)?[0]).map(|s| vec![s]);
        let r = catch_unwind(AssertUnwindSafe(|| {
            value_and_grad(loss, &[0])(std::slice::from_ref(&x))
        }));
        assert!(r.is_err());
    }

    // checkpoint whose function fails in the recompute only.
    {
        let t = Tracked(Arc::clone(drops));
        made += 1;
        let calls = AtomicUsize::new(0);
        let ck = checkpoint(move |a: &[Array]| {
            let _keep = &t;
            if calls.fetch_add(1, Ordering::SeqCst) == 1 {
                return Err(Error::Callback("recompute".into()));
            }
            Ok(vec![ops::exp(&a[0], None)?])
        })
        .unwrap();
        let loss = |a: &[Array]| sum2(&ck.call(a)?[0]).map(|s| vec![s]);
        let e = value_and_grad(loss, &[0])(std::slice::from_ref(&x)).unwrap_err();
        assert_eq!(e, Error::Callback("recompute".into()));
    }
    made
}

#[test]
fn failing_transforms_leak_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Quiet the expected panics.
    std::panic::set_hook(Box::new(|_| {}));
    let drops = Arc::new(AtomicUsize::new(0));
    // Warm up: allocator, this thread's stream, compile machinery.
    failing_round(&drops);
    memory::clear_cache().unwrap();
    let start = memory::active_memory().unwrap();
    let before = drops.load(Ordering::SeqCst);
    let mut made = 0;
    for _ in 0..5 {
        made += failing_round(&drops);
    }
    memory::clear_cache().unwrap();
    let end = memory::active_memory().unwrap();
    let _ = std::panic::take_hook();
    assert_eq!(end, start, "active memory before {start}, after {end}");
    assert_eq!(
        drops.load(Ordering::SeqCst) - before,
        made,
        "every payload dropped"
    );
    // And things still work afterwards.
    let (v, _) =
        value_and_grad(|a: &[Array]| sum2(&a[0]).map(|s| vec![s]), &[0])(&[big()]).unwrap();
    assert_eq!(v[0].item::<f32>().unwrap(), 0.5 * 256.0 * 256.0);
}

#[test]
fn successful_transforms_drop_their_payloads_with_the_graph() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let drops = Arc::new(AtomicUsize::new(0));
    let t = Tracked(Arc::clone(&drops));
    let ck = checkpoint(move |a: &[Array]| {
        let _keep = &t;
        Ok(vec![ops::exp(&a[0], None)?])
    })
    .unwrap();
    let x = Array::from_slice(&[1.0f32, 2.0], &[1, 2]).unwrap();
    let y = ck.call(std::slice::from_ref(&x)).unwrap();
    drop(ck);
    // The graph node of `y` still holds the function.
    assert_eq!(drops.load(Ordering::SeqCst), 0);
    y[0].eval().unwrap();
    drop(y);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

//! Transforms: vjp, jvp, value_and_grad (flat and over a parameter tree), custom_vjp,
//! checkpoint, compile, and how a failing closure (panic or `Err`) comes back to the caller.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use mlx_core::prelude::*;
use mlx_core::testing::assert_bit_equal;

fn arr(v: &[f32], shape: &[i32]) -> Array {
    Array::from_slice(v, shape).unwrap()
}

/// sum of all elements of a 2-D array, as a 0-d array (via matmuls with ones).
fn sum2(x: &Array) -> Result<Array> {
    let s = x.shape();
    let dt = x.dtype();
    let l = ops::ones(&[1, s[0]], dt, None)?;
    let r = ops::ones(&[s[1], 1], dt, None)?;
    l.matmul(x)?.matmul(&r)?.reshape(&[])
}

fn same(a: &Array, b: &Array) {
    assert_bit_equal(a, b).unwrap();
}

/// f(x, y) = sum(sin(x) * y + x^2)
fn f_xy(a: &[Array]) -> Result<Vec<Array>> {
    let t = (ops::sin(&a[0], None)? * &a[1])?;
    let t = (t + ops::square(&a[0], None)?)?;
    Ok(vec![sum2(&t)?])
}

#[test]
fn value_and_grad_matches_the_analytic_gradient() {
    let x = arr(&[0.5, -1.0, 2.0, 0.0, 1.5, 3.0], &[2, 3]);
    let y = arr(&[1.0, 2.0, -1.0, 0.5, 0.25, 4.0], &[2, 3]);
    let (v, g) = value_and_grad(f_xy, &[0, 1])(&[x.clone(), y.clone()]).unwrap();
    same(&v[0], &f_xy(&[x.clone(), y.clone()]).unwrap()[0]);
    // d/dx = cos(x) * y + 2x ; d/dy = sin(x)
    let dx = ((ops::cos(&x, None).unwrap() * &y).unwrap() + (&x * 2.0).unwrap()).unwrap();
    let dy = ops::sin(&x, None).unwrap();
    same(&g[0], &dx);
    same(&g[1], &dy);
    // argnums order is kept.
    let g2 = grad(f_xy, &[1, 0])(&[x.clone(), y.clone()]).unwrap();
    same(&g2[0], &dy);
    same(&g2[1], &dx);
    let g3 = grad(f_xy, &[1])(&[x, y]).unwrap();
    assert_eq!(g3.len(), 1);
    same(&g3[0], &dy);
}

#[test]
fn value_and_grad_returns_aux_outputs_and_checks_argnums() {
    let x = arr(&[1.0, 2.0], &[1, 2]);
    let f = |a: &[Array]| -> Result<Vec<Array>> {
        let aux = (&a[0] * 10.0)?;
        Ok(vec![sum2(&ops::square(&a[0], None)?)?, aux])
    };
    let (v, g) = value_and_grad(f, &[0])(std::slice::from_ref(&x)).unwrap();
    assert_eq!(v.len(), 2);
    assert_eq!(v[0].item::<f32>().unwrap(), 5.0);
    assert_eq!(v[1].to_vec::<f32>().unwrap(), vec![10.0, 20.0]);
    assert_eq!(g[0].to_vec::<f32>().unwrap(), vec![2.0, 4.0]);

    let vg = value_and_grad(f, &[1]);
    let e = vg(std::slice::from_ref(&x)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    let e = value_and_grad(f, &[0, 0])(std::slice::from_ref(&x)).unwrap_err();
    assert!(e.to_string().contains("duplicate"), "{e}");
    let e = value_and_grad(f, &[])(std::slice::from_ref(&x)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
}

#[test]
fn value_and_grad_of_a_non_scalar_is_an_mlx_error() {
    let x = arr(&[1.0, 2.0], &[2]);
    let f = |a: &[Array]| -> Result<Vec<Array>> { Ok(vec![ops::square(&a[0], None)?]) };
    let e = value_and_grad(f, &[0])(&[x]).unwrap_err();
    // MLX's own message, as Python shows it.
    assert!(
        e.message()
            .contains("[vjp] Output shape (2) does not match cotangent shape ()"),
        "{e}"
    );
}

#[test]
fn vjp_and_jvp() {
    let x = arr(&[0.1, 0.2, 0.3], &[3]);
    let f =
        |a: &[Array]| -> Result<Vec<Array>> { Ok(vec![ops::exp(&a[0], None)?, (&a[0] * 3.0)?]) };
    let c0 = arr(&[1.0, 2.0, 3.0], &[3]);
    let c1 = arr(&[1.0, 1.0, -1.0], &[3]);
    let (outs, vjps) = vjp(f, std::slice::from_ref(&x), &[c0.clone(), c1.clone()]).unwrap();
    assert_eq!(outs.len(), 2);
    assert_eq!(vjps.len(), 1);
    let expect = ((ops::exp(&x, None).unwrap() * &c0).unwrap() + (&c1 * 3.0).unwrap()).unwrap();
    same(&vjps[0], &expect);

    let t = arr(&[1.0, 0.0, 2.0], &[3]);
    let (outs, jvps) = jvp(f, std::slice::from_ref(&x), std::slice::from_ref(&t)).unwrap();
    assert_eq!(outs.len(), 2);
    assert_eq!(jvps.len(), 2);
    same(&jvps[0], &(ops::exp(&x, None).unwrap() * &t).unwrap());
    same(&jvps[1], &(&t * 3.0).unwrap());
}

#[test]
fn value_and_grad_over_a_parameter_tree() {
    let mut params = ParamMap::new();
    params.insert("w".into(), arr(&[1.0, 2.0, 3.0, 4.0], &[2, 2]));
    params.insert("b".into(), arr(&[0.5, -0.5], &[1, 2]));
    let x = arr(&[1.0, -1.0, 2.0, 0.0], &[2, 2]);
    let frozen = arr(&[2.0], &[1, 1]);
    let loss = |p: &ParamMap, o: &[Array]| -> Result<Vec<Array>> {
        let h = (o[0].matmul(&p["w"])? + &p["b"])?;
        let h = (ops::square(&h, None)? * &o[1])?;
        Ok(vec![sum2(&h)?])
    };
    let vg = value_and_grad_tree(loss);
    let (v, g) = vg(&params, &[x.clone(), frozen.clone()]).unwrap();
    assert_eq!(g.keys().collect::<Vec<_>>(), vec!["b", "w"]);
    // Same as the flat form.
    let flat = |a: &[Array]| -> Result<Vec<Array>> {
        let mut p = ParamMap::new();
        p.insert("b".into(), a[0].clone());
        p.insert("w".into(), a[1].clone());
        loss(&p, &a[2..])
    };
    let (v2, g2) =
        value_and_grad(flat, &[0, 1])(&[params["b"].clone(), params["w"].clone(), x, frozen])
            .unwrap();
    same(&v[0], &v2[0]);
    same(&g["b"], &g2[0]);
    same(&g["w"], &g2[1]);
    assert!(vg(&ParamMap::new(), &[]).is_err());
}

#[test]
fn stop_gradient_blocks_the_gradient() {
    let x = arr(&[1.0, 2.0], &[1, 2]);
    let f = |a: &[Array]| -> Result<Vec<Array>> {
        let s = stop_gradient(&a[0], None)?;
        Ok(vec![sum2(&(&s * &a[0])?)?])
    };
    let g = grad(f, &[0])(std::slice::from_ref(&x)).unwrap();
    // d/dx (c * x) with c = x held constant = x
    same(&g[0], &x);
}

#[test]
fn custom_vjp_uses_the_backward_and_can_reproduce_the_plain_gradient() {
    let x = arr(&[0.5, 1.0, -2.0], &[1, 3]);
    let plain = |a: &[Array]| -> Result<Vec<Array>> { Ok(vec![ops::sin(&a[0], None)?]) };
    let calls = Arc::new(AtomicUsize::new(0));
    let c2 = Arc::clone(&calls);
    let custom = custom_vjp(plain, move |p, c, _o| {
        c2.fetch_add(1, Ordering::SeqCst);
        Ok(vec![(ops::cos(&p[0], None)? * &c[0])?])
    })
    .unwrap();
    let loss_plain = |a: &[Array]| -> Result<Vec<Array>> { sum2(&plain(a)?[0]).map(|s| vec![s]) };
    let loss_custom =
        |a: &[Array]| -> Result<Vec<Array>> { sum2(&custom.call(a)?[0]).map(|s| vec![s]) };
    let (v1, g1) = value_and_grad(loss_plain, &[0])(std::slice::from_ref(&x)).unwrap();
    let (v2, g2) = value_and_grad(loss_custom, &[0])(std::slice::from_ref(&x)).unwrap();
    same(&v1[0], &v2[0]);
    same(&g1[0], &g2[0]);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // A backward that differs from the true derivative is what the gradient follows.
    let doubled = custom_vjp(plain, |_p, c, _o| Ok(vec![(&c[0] * 2.0)?])).unwrap();
    let g = grad(
        |a: &[Array]| sum2(&doubled.call(a)?[0]).map(|s| vec![s]),
        &[0],
    )(std::slice::from_ref(&x))
    .unwrap();
    assert_eq!(g[0].to_vec::<f32>().unwrap(), vec![2.0, 2.0, 2.0]);
    // The forward is the plain function.
    same(
        &doubled.call(std::slice::from_ref(&x)).unwrap()[0],
        &plain(&[x]).unwrap()[0],
    );
}

#[test]
fn checkpoint_gives_the_plain_gradients_and_recomputes() {
    let w = arr(&[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], &[3, 2]);
    let x = arr(&[1.0, 2.0, 3.0, -1.0, 0.5, 0.0], &[2, 3]);
    let body = |a: &[Array]| -> Result<Vec<Array>> {
        let h = ops::tanh(&a[0].matmul(&a[1])?, None)?;
        Ok(vec![(ops::sigmoid(&h, None)? * &h)?])
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let r2 = Arc::clone(&runs);
    let ck = checkpoint(move |a: &[Array]| {
        r2.fetch_add(1, Ordering::SeqCst);
        body(a)
    })
    .unwrap();
    let plain = |a: &[Array]| sum2(&body(a)?[0]).map(|s| vec![s]);
    let ckd = |a: &[Array]| sum2(&ck.call(a)?[0]).map(|s| vec![s]);
    let (v1, g1) = value_and_grad(plain, &[0, 1])(&[x.clone(), w.clone()]).unwrap();
    let (v2, g2) = value_and_grad(ckd, &[0, 1])(&[x, w]).unwrap();
    same(&v1[0], &v2[0]);
    same(&g1[0], &g2[0]);
    same(&g1[1], &g2[1]);
    // Once forward, once recomputed in the backward pass.
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

fn g_poly(a: &[Array]) -> Result<Vec<Array>> {
    let x = &a[0];
    let t = ((ops::exp(x, None)? * 2.0)? + ops::tanh(x, None)?)?;
    let t = (ops::square(&t, None)? - (x * 0.5)?)?;
    Ok(vec![ops::sigmoid(&t, None)?, (x * 3.0)?])
}

#[test]
fn compile_gives_identical_results_and_retraces_per_shape() {
    let f = compile(g_poly, false).unwrap();
    assert_eq!(f.trace_count(), 0);
    let x = arr(&[0.1, -0.7, 1.3, 2.0], &[4]);
    let y = f.call(std::slice::from_ref(&x)).unwrap();
    let z = g_poly(std::slice::from_ref(&x)).unwrap();
    same(&y[0], &z[0]);
    same(&y[1], &z[1]);
    assert_eq!(f.trace_count(), 1);
    f.call(&[arr(&[5.0, 6.0, 7.0, 8.0], &[4])]).unwrap();
    assert_eq!(f.trace_count(), 1, "same shape: no retrace");
    f.call(&[arr(&[5.0, 6.0], &[2])]).unwrap();
    assert_eq!(f.trace_count(), 2, "new shape: retrace");
}

#[test]
fn shapeless_compile_runs_on_several_shapes_with_one_trace() {
    let f = compile(g_poly, true).unwrap();
    assert!(f.is_shapeless());
    for (n, shape) in [
        (4, vec![4]),
        (6, vec![2, 3]),
        (12, vec![3, 4]),
        (1, vec![1]),
    ] {
        let x = ops::arange(0.0, n as f64, 1.0, Dtype::Float32, None).unwrap();
        let x = ((x * 0.37).unwrap() - 1.0)
            .unwrap()
            .reshape(&shape)
            .unwrap();
        let got = f.call(std::slice::from_ref(&x)).unwrap();
        let want = g_poly(&[x]).unwrap();
        same(&got[0], &want[0]);
        same(&got[1], &want[1]);
    }
    // Ranks 1 and 2 each traced once.
    assert_eq!(f.trace_count(), 2);
    let g = compile(g_poly, true).unwrap();
    for n in [3, 5, 8, 13] {
        let x = ops::arange(0.0, n as f64, 1.0, Dtype::Float32, None).unwrap();
        let got = g.call(std::slice::from_ref(&x)).unwrap();
        same(&got[0], &g_poly(&[x]).unwrap()[0]);
    }
    assert_eq!(g.trace_count(), 1);
}

#[test]
fn compile_borrows_and_works_inside_value_and_grad() {
    let scale = arr(&[2.0], &[1]);
    let f = compile(
        |a: &[Array]| Ok(vec![sum2(&(ops::exp(&a[0], None)? * &scale)?)?]),
        false,
    )
    .unwrap();
    let x = arr(&[0.1, 0.2, 0.3, 0.4], &[2, 2]);
    let g = grad(|a: &[Array]| f.call(a), &[0])(std::slice::from_ref(&x)).unwrap();
    let want = (ops::exp(&x, None).unwrap() * 2.0).unwrap();
    same(&g[0], &want);
}

// ---- failures inside closures ----

#[derive(Debug, PartialEq)]
struct Boom(u32);

fn payload_of(r: std::thread::Result<impl Sized>) -> Boom {
    match r {
        Ok(_) => panic!("expected a panic"),
        Err(p) => *p.downcast::<Boom>().expect("the original panic payload"),
    }
}

#[test]
fn a_panic_under_value_and_grad_resumes_in_the_caller() {
    let x = arr(&[1.0, 2.0], &[1, 2]);
    let armed = Cell::new(true);
    let f = |a: &[Array]| -> Result<Vec<Array>> {
        let y = ops::square(&a[0], None)?;
        if armed.get() {
            std::panic::panic_any(Boom(7));
        }
        Ok(vec![sum2(&y)?])
    };
    let vg = value_and_grad(f, &[0]);
    let r = catch_unwind(AssertUnwindSafe(|| vg(std::slice::from_ref(&x))));
    assert_eq!(payload_of(r), Boom(7));
    armed.set(false);
    let (_, g) = vg(std::slice::from_ref(&x)).unwrap();
    assert_eq!(g[0].to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
}

#[test]
fn an_err_under_value_and_grad_comes_back_unchanged() {
    let x = arr(&[1.0, 2.0], &[1, 2]);
    let armed = Cell::new(true);
    let f = |a: &[Array]| -> Result<Vec<Array>> {
        if armed.get() {
            return Err(Error::Io {
                path: "nowhere".into(),
                message: "from the closure".into(),
            });
        }
        Ok(vec![sum2(&ops::square(&a[0], None)?)?])
    };
    let vg = value_and_grad(f, &[0]);
    let e = vg(std::slice::from_ref(&x)).unwrap_err();
    assert_eq!(
        e,
        Error::Io {
            path: "nowhere".into(),
            message: "from the closure".into()
        }
    );
    // An MLX error inside the closure comes back as that same MLX error.
    let bad = |a: &[Array]| -> Result<Vec<Array>> { Ok(vec![a[0].matmul(&a[0])?]) };
    let e = value_and_grad(bad, &[0])(&[arr(&[1.0, 2.0, 3.0], &[1, 3])]).unwrap_err();
    assert!(matches!(e, Error::Mlx { op: "matmul", .. }), "{e:?}");
    armed.set(false);
    assert!(vg(&[x]).is_ok());
}

#[test]
fn a_panic_and_an_err_under_compile_come_back_and_a_later_call_works() {
    let mode = Cell::new(1u8); // 1 panic, 2 err, 0 fine
    let f = compile(
        |a: &[Array]| -> Result<Vec<Array>> {
            let y = (&a[0] * 2.0)?;
            match mode.get() {
                1 => std::panic::panic_any(Boom(11)),
                2 => Err(Error::Callback("compile err".into())),
                _ => Ok(vec![(y + 1.0)?]),
            }
        },
        false,
    )
    .unwrap();
    let x = arr(&[1.0, 2.0], &[2]);
    let r = catch_unwind(AssertUnwindSafe(|| f.call(std::slice::from_ref(&x))));
    assert_eq!(payload_of(r), Boom(11));
    mode.set(2);
    assert_eq!(
        f.call(std::slice::from_ref(&x)).unwrap_err(),
        Error::Callback("compile err".into())
    );
    mode.set(0);
    let y = f.call(std::slice::from_ref(&x)).unwrap();
    assert_eq!(y[0].to_vec::<f32>().unwrap(), vec![3.0, 5.0]);
    assert_eq!(f.trace_count(), 3);
    // Now cached: the closure is not run again.
    let y = f.call(&[arr(&[0.0, 1.0], &[2])]).unwrap();
    assert_eq!(y[0].to_vec::<f32>().unwrap(), vec![1.0, 3.0]);
    assert_eq!(f.trace_count(), 3);
}

#[test]
fn failures_nest_through_several_transforms() {
    // A panic inside a custom_vjp backward, under compile, under value_and_grad.
    let custom = custom_vjp(
        |a: &[Array]| Ok(vec![ops::exp(&a[0], None)?]),
        |_p, _c, _o| std::panic::panic_any(Boom(3)),
    )
    .unwrap();
    let inner = compile(|a: &[Array]| custom.call(a), false).unwrap();
    let loss = |a: &[Array]| sum2(&inner.call(a)?[0]).map(|s| vec![s]);
    let x = arr(&[1.0, 2.0], &[1, 2]);
    let r = catch_unwind(AssertUnwindSafe(|| {
        value_and_grad(loss, &[0])(std::slice::from_ref(&x))
    }));
    assert_eq!(payload_of(r), Boom(3));
    // The forward alone is fine.
    assert!(inner.call(std::slice::from_ref(&x)).is_ok());

    // An Err from a checkpointed function under grad.
    let ck = checkpoint(|_a: &[Array]| Err(Error::Callback("ck".into()))).unwrap();
    let e = grad(|a: &[Array]| sum2(&ck.call(a)?[0]).map(|s| vec![s]), &[0])(&[x]).unwrap_err();
    assert_eq!(e, Error::Callback("ck".into()));
}

#[test]
fn custom_vjp_backward_must_return_one_array_per_primal() {
    let custom = custom_vjp(
        |a: &[Array]| Ok(vec![(&a[0] * &a[1])?]),
        |_p, c, _o| Ok(vec![c[0].clone()]),
    )
    .unwrap();
    let x = arr(&[1.0, 2.0], &[1, 2]);
    let e = grad(
        |a: &[Array]| sum2(&custom.call(a)?[0]).map(|s| vec![s]),
        &[0],
    )(&[x.clone(), x])
    .unwrap_err();
    assert!(matches!(e, Error::Callback(_)), "{e:?}");
}

#[test]
fn transform_functions_can_move_to_another_thread() {
    let ck = checkpoint(|a: &[Array]| Ok(vec![ops::exp(&a[0], None)?])).unwrap();
    let h = std::thread::spawn(move || {
        let x = arr(&[0.0, 1.0], &[1, 2]);
        let g = grad(|a: &[Array]| sum2(&ck.call(a)?[0]).map(|s| vec![s]), &[0])(
            std::slice::from_ref(&x),
        )
        .unwrap();
        assert_bit_equal(&g[0], &ops::exp(&x, None).unwrap()).unwrap();
    });
    h.join().unwrap();
}

//! Bad arguments to ops give `Err` naming the op (never a panic or a crash), and the
//! non-golden conveniences (`slice_axis`, method sugar, operators) do what they say.

use mlx_core::prelude::*;

fn arange(n: i32, shape: &[i32]) -> Array {
    ops::arange(0.0, f64::from(n), 1.0, Dtype::Float32, None)
        .unwrap()
        .reshape(shape)
        .unwrap()
}

/// `r` is an error whose message starts with `op`.
#[track_caller]
fn fails<T: std::fmt::Debug>(r: Result<T>, op: &str) {
    match r {
        Ok(v) => panic!("expected an error from {op}, got {v:?}"),
        Err(e) => {
            let text = e.to_string();
            assert!(
                text.starts_with(&format!("{op}: ")),
                "error {text:?} does not name {op}"
            );
            assert!(!e.message().is_empty());
        }
    }
}

#[test]
fn bad_axes_are_errors() {
    let a = arange(6, &[2, 3]);
    fails(ops::sum(&a, &[2], false, None), "sum");
    fails(ops::mean(&a, &[-3], false, None), "mean");
    fails(ops::max(&a, &[0, 0], false, None), "max");
    fails(ops::argmax(&a, 5, false, None), "argmax");
    fails(ops::logsumexp(&a, &[7], false, None), "logsumexp");
    fails(ops::softmax(&a, &[2], false, None), "softmax");
    fails(ops::var(&a, &[3], false, 0, None), "var");
    fails(ops::cumsum(&a, 2, false, true, None), "cumsum");
    fails(ops::sort(&a, 2, None), "sort");
    fails(ops::transpose(&a, &[0, 0], None), "transpose");
    fails(ops::transpose(&a, &[0], None), "transpose");
    fails(ops::swapaxes(&a, 0, 2, None), "swapaxes");
    fails(ops::moveaxis(&a, -3, 0, None), "moveaxis");
    fails(ops::expand_dims(&a, &[4], None), "expand_dims");
    fails(ops::squeeze(&a, &[0], None), "squeeze");
    fails(ops::flatten(&a, 1, 0, None), "flatten");
    fails(
        ops::take(&a, &Array::from_slice(&[0i32], &[1]).unwrap(), 3, None),
        "take",
    );
    fails(ops::slice_axis(&a, 2, 0, 1, None), "slice_axis");
    fails(ops::slice_axis(&a, -3, 0, 1, None), "slice_axis");
    fails(ops::repeat(&a, 2, 2, None), "repeat");
    fails(ops::topk(&a, 2, 3, None), "topk");
    fails(ops::concatenate(&[&a, &a], 2, None), "concatenate");
}

#[test]
fn shape_mismatches_are_errors() {
    let a = arange(6, &[2, 3]);
    let b = arange(8, &[2, 4]);
    fails(ops::concatenate(&[&a, &b], 0, None), "concatenate");
    fails(ops::concatenate(&[], 0, None), "concatenate");
    fails(ops::stack(&[&a, &b], 0, None), "stack");
    fails(ops::stack(&[], 0, None), "stack");
    fails(ops::add(&a, &b, None), "add");
    fails(ops::where_(&a.greater(&a).unwrap(), &a, &b, None), "where");
    fails(ops::matmul(&a, &a, None), "matmul");
    fails(ops::reshape(&a, &[4, 2], None), "reshape");
    fails(ops::reshape(&a, &[-1, -1], None), "reshape");
    fails(ops::unflatten(&a, 1, &[2, 2], None), "unflatten");
    fails(ops::broadcast_to(&a, &[3, 3], None), "broadcast_to");
    fails(ops::broadcast_arrays(&[&a, &b], None), "broadcast_arrays");
    fails(ops::addmm(&a, &a, &b, 1.0, 1.0, None), "addmm");
    fails(ops::tensordot(&a, &b, &[0, 1], &[0], None), "tensordot");
    fails(
        ops::put_along_axis(&a, &b.astype(Dtype::Int32).unwrap(), &a, 0, None),
        "put_along_axis",
    );
    let x = arange(12, &[1, 4, 3]);
    let w = arange(12, &[2, 3, 2]);
    fails(ops::conv1d(&x, &w, 1, 0, 1, 1, None), "conv1d");
    fails(
        ops::conv2d(&x, &w, (1, 1), (0, 0), (1, 1), 1, None),
        "conv2d",
    );
}

#[test]
fn out_of_range_arguments_are_errors() {
    let a = arange(6, &[2, 3]);
    // Slices: wrong lengths, zero stride, wrong rank.
    fails(ops::slice(&a, &[0, 0], &[1, 1], &[1, 0], None), "slice");
    fails(ops::slice(&a, &[0, 0], &[1], &[1, 1], None), "slice");
    fails(ops::slice(&a, &[0], &[1], &[1], None), "slice");
    fails(
        ops::slice_update(&a, &a, &[0, 0], &[2, 3], &[0, 1], None),
        "slice_update",
    );
    fails(
        ops::slice_update(&a, &arange(4, &[2, 2]), &[0, 0], &[2, 3], &[1, 1], None),
        "slice_update",
    );
    let start = Array::from_slice(&[1i32], &[1]).unwrap();
    fails(
        ops::slice_dynamic(&a, &start, &[0], &[1], None),
        "slice_dynamic",
    );
    fails(
        ops::slice_dynamic(&a, &start, &[5], &[1, 3], None),
        "slice_dynamic",
    );
    // Splits.
    fails(ops::split_equal(&a, 0, 1, None), "split_equal");
    fails(ops::split_equal(&a, -2, 1, None), "split_equal");
    fails(ops::split_equal(&a, 2, 1, None), "split_equal");
    fails(ops::split_at(&a, &[1], 4, None), "split_at");
    // Padding.
    let zero = Array::from_f32(0.0, Dtype::Float32).unwrap();
    fails(
        ops::pad(&a, &[0, 1], &[1], &[1, 1], &zero, "constant", None),
        "pad",
    );
    fails(
        ops::pad(&a, &[0], &[-1], &[1], &zero, "constant", None),
        "pad",
    );
    fails(ops::pad(&a, &[0], &[1], &[1], &zero, "wrap", None), "pad");
    fails(
        ops::pad(&a, &[0], &[1], &[1], &zero, "con\0stant", None),
        "pad",
    );
    fails(
        ops::pad(&a, &[3], &[1], &[1], &zero, "constant", None),
        "pad",
    );
    // Selection.
    fails(ops::topk(&a, 4, -1, None), "topk");
    fails(ops::partition(&a, 3, -1, None), "partition");
    fails(ops::argpartition(&a, -4, -1, None), "argpartition");
    // Creation.
    fails(
        ops::linspace(0.0, 1.0, -1, true, Dtype::Float32, None),
        "linspace",
    );
    fails(ops::eye(-1, 2, 0, Dtype::Float32, None), "eye");
    fails(ops::zeros(&[-1, 2], Dtype::Float32, None), "zeros");
    fails(ops::full(&[2], &a, Dtype::Float32, None), "full");
    fails(ops::meshgrid(&[&a], false, "yx", None), "meshgrid");
    // Conversions and misc.
    fails(ops::view(&arange(3, &[3]), Dtype::Float64, None), "view");
    fails(ops::clip(&a, None, None, None), "clip");
    fails(ops::repeat(&a, -1, 0, None), "repeat");
    fails(ops::tile(&a, &[-1], None), "tile");
    fails(
        ops::conv1d(
            &arange(12, &[1, 4, 3]),
            &arange(6, &[2, 1, 3]),
            0,
            0,
            1,
            1,
            None,
        ),
        "conv1d",
    );
    fails(
        ops::conv1d(
            &arange(12, &[1, 4, 3]),
            &arange(6, &[2, 1, 3]),
            1,
            0,
            1,
            2,
            None,
        ),
        "conv1d",
    );
    let idx = Array::from_slice(&[0i32], &[1]).unwrap();
    fails(
        ops::gather(&a, &[&idx, &idx], &[0], &[1, 3], None),
        "gather",
    );
    fails(ops::scatter(&a, &[&idx], &a, &[0, 1], None), "scatter");
    fails(ops::scatter_add(&a, &[], &a, &[0], None), "scatter_add");
    fails(ops::bitwise_and(&a, &a, None), "bitwise_and");
    fails(ops::left_shift_scalar(&a, 1, None), "left_shift");
}

#[test]
fn errors_leave_later_ops_working() {
    let a = arange(6, &[2, 3]);
    assert!(ops::sum(&a, &[9], false, None).is_err());
    let s = ops::sum(&a, &[1], false, None).unwrap();
    assert_eq!(s.to_vec::<f32>().unwrap(), vec![3.0, 12.0]);
}

#[test]
fn conveniences_and_methods() -> Result<()> {
    let a = arange(24, &[2, 3, 4]);
    // slice_axis is slice with full ranges elsewhere, negative bounds from the end.
    let x = a.slice_axis(-1, 1, -1)?;
    let y = ops::slice(&a, &[0, 0, 1], &[2, 3, 3], &[1, 1, 1], None)?;
    assert_eq!(x.shape(), vec![2, 3, 2]);
    assert!(ops::array_equal(&x, &y, false, None)?.item::<bool>()?);
    // t() swaps the last two axes.
    assert_eq!(a.t()?.shape(), vec![2, 4, 3]);
    assert_eq!(a.transpose_all()?.shape(), vec![4, 3, 2]);
    // Method sugar agrees with the free functions.
    assert!(ops::array_equal(
        &a.sum(&[1], true)?,
        &ops::sum(&a, &[1], true, None)?,
        false,
        None
    )?
    .item::<bool>()?);
    assert_eq!(a.argmax(-1, false)?.to_vec::<u32>()?, vec![3; 6]);
    assert_eq!(a.expand_dims(&[0])?.squeeze(&[0])?.shape(), vec![2, 3, 4]);
    assert_eq!(
        a.softmax(&[-1], false)?.sum(&[-1], false)?.shape(),
        vec![2, 3]
    );
    // Operators: % follows the divisor's sign, & | ^ on bools are logical, ! on bool is not.
    let m = Array::from_slice(&[-3.0f32, 3.0], &[2])?;
    assert_eq!((&m % 2.0)?.to_vec::<f32>()?, vec![1.0, 1.0]);
    let t = Array::from_slice(&[true, false], &[2])?;
    assert_eq!((!&t)?.to_vec::<bool>()?, vec![false, true]);
    assert_eq!((&t & true)?.to_vec::<bool>()?, vec![true, false]);
    assert_eq!((&t | &t)?.to_vec::<bool>()?, vec![true, false]);
    let i = Array::from_slice(&[3i32, 5], &[2])?;
    assert_eq!((!&i)?.to_vec::<i32>()?, vec![-4, -6]);
    assert_eq!((&i << 1)?.to_vec::<i32>()?, vec![6, 10]);
    assert_eq!((&i >> 1)?.to_vec::<i32>()?, vec![1, 2]);
    assert_eq!((&i ^ 1)?.to_vec::<i32>()?, vec![2, 4]);
    // Multi-output ops return every piece.
    let parts = ops::split_equal(&a, 3, 1, None)?;
    assert_eq!(parts.len(), 3);
    assert!(parts.iter().all(|p| p.shape() == vec![2, 1, 4]));
    let back = ops::concatenate(&parts.iter().collect::<Vec<_>>(), 1, None)?;
    assert!(ops::array_equal(&back, &a, false, None)?.item::<bool>()?);
    Ok(())
}

#[test]
fn cholesky_and_its_inverse_solve_a_small_system_and_refuse_bad_shapes() {
    let a = Array::from_slice(&[4.0f32, 2.0, 2.0, 3.0], &[2, 2]).unwrap();
    let cpu = Stream::cpu().unwrap();
    let l = ops::cholesky(&a, false, Some(&cpu)).unwrap();
    let lv: Vec<f32> = l.to_vec().unwrap();
    assert_eq!(&lv[..3], &[2.0, 0.0, 1.0]);
    assert!((lv[3] - 2.0f32.sqrt()).abs() < 1e-6);
    let u: Vec<f32> = ops::cholesky(&a, true, Some(&cpu))
        .unwrap()
        .to_vec()
        .unwrap();
    assert_eq!(&u[..3], &[2.0, 1.0, 0.0]);
    let inv: Vec<f32> = ops::cholesky_inv(&l, false, Some(&cpu))
        .unwrap()
        .to_vec()
        .unwrap();
    for (g, w) in inv
        .iter()
        .zip([3.0f32 / 8.0, -2.0 / 8.0, -2.0 / 8.0, 4.0 / 8.0])
    {
        assert!((g - w).abs() < 1e-6, "{inv:?}");
    }
    fails(ops::cholesky(&arange(6, &[2, 3]), false, None), "cholesky");
    fails(ops::cholesky(&arange(4, &[4]), false, None), "cholesky");
    fails(
        ops::cholesky(&a.astype(Dtype::Float16).unwrap(), false, None),
        "cholesky",
    );
    fails(
        ops::cholesky_inv(&arange(6, &[3, 2]), false, None),
        "cholesky_inv",
    );
}

//! The foundation: dtype round trips, arithmetic against independent values, MLX errors as
//! `Err`, streams, and no leaked memory.

use mlx_core::prelude::*;
use mlx_core::{Complex64, DeviceType, Element};

fn round_trip<T: Element + PartialEq + std::fmt::Debug>(values: &[T]) {
    let n = values.len() as i32;
    let a = Array::from_slice(values, &[n]).unwrap();
    assert_eq!(a.dtype(), T::DTYPE);
    assert_eq!(a.shape(), vec![n]);
    assert_eq!(a.size(), values.len());
    assert_eq!(a.itemsize(), T::DTYPE.size());
    assert_eq!(a.nbytes(), values.len() * T::DTYPE.size());
    assert_eq!(
        a.to_vec::<T>().unwrap(),
        values,
        "round trip of {}",
        T::DTYPE
    );
    // Through a reshape too, so the data travels through an op and back.
    let b = a.reshape(&[1, n]).unwrap();
    assert_eq!(b.shape(), vec![1, n]);
    assert_eq!(b.to_vec::<T>().unwrap(), values);
    assert_eq!(
        Array::scalar(values[0]).unwrap().item::<T>().unwrap(),
        values[0]
    );
}

#[test]
fn every_dtype_round_trips() {
    round_trip(&[true, false, true]);
    round_trip(&[0u8, 1, 255]);
    round_trip(&[0u16, 1, u16::MAX]);
    round_trip(&[0u32, 7, u32::MAX]);
    round_trip(&[0u64, 7, u64::MAX]);
    round_trip(&[i8::MIN, -1, i8::MAX]);
    round_trip(&[i16::MIN, -1, i16::MAX]);
    round_trip(&[i32::MIN, -1, i32::MAX]);
    round_trip(&[i64::MIN, -1, i64::MAX]);
    round_trip(&[f16::from_f32(-1.5), f16::MAX, f16::MIN_POSITIVE_SUBNORMAL]);
    round_trip(&[-1.5f32, f32::MAX, f32::MIN_POSITIVE, f32::INFINITY]);
    round_trip(&[-1.5f64, f64::MAX, f64::MIN_POSITIVE]);
    round_trip(&[bf16::from_f32(-1.5), bf16::MAX, bf16::from_bits(1)]);
    round_trip(&[
        Complex64 { re: 1.0, im: -2.0 },
        Complex64 { re: 0.5, im: 3.25 },
    ]);
    // Every dtype has a Rust counterpart exercised above.
    assert_eq!(Dtype::ALL.len(), 14);
}

#[test]
fn half_types_convert_exactly_through_astype() {
    // 1/3 in f32 -> f16 / bf16 by MLX must equal half's round-to-nearest-even conversion.
    let xs = [1.0f32 / 3.0, -2.7182817, 65504.0, 1e-6, 0.1];
    let a = Array::from_slice(&xs, &[5]).unwrap();
    let h = a.astype(Dtype::Float16).unwrap().to_vec::<f16>().unwrap();
    let b = a.astype(Dtype::Bfloat16).unwrap().to_vec::<bf16>().unwrap();
    for (i, x) in xs.iter().enumerate() {
        assert_eq!(h[i].to_bits(), f16::from_f32(*x).to_bits(), "f16 of {x}");
        assert_eq!(b[i].to_bits(), bf16::from_f32(*x).to_bits(), "bf16 of {x}");
    }
}

#[test]
fn to_vec_with_the_wrong_type_is_an_error() {
    let a = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let err = a.to_vec::<i32>().unwrap_err();
    assert!(err.to_string().contains("float32"), "{err}");
    assert!(a.item::<f32>().is_err(), "two elements have no single item");
    assert!(
        Array::from_slice(&[1.0f32, 2.0], &[3]).is_err(),
        "shape/len mismatch"
    );
    assert!(
        Array::from_slice(&[1.0f32], &[-1]).is_err(),
        "negative dimension"
    );
}

#[test]
fn arithmetic_matches_values_worked_out_by_hand() {
    // [[1,2],[3,4]] @ [[5,6],[7,8]] = [[19,22],[43,50]]
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let b = Array::from_slice(&[5.0f32, 6.0, 7.0, 8.0], &[2, 2]).unwrap();
    let c = a.matmul(&b).unwrap();
    assert_eq!(c.shape(), vec![2, 2]);
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![19.0, 22.0, 43.0, 50.0]);

    // ((a + b) * 2 - a) / 4, broadcasting a row vector.
    let row = Array::from_slice(&[10.0f32, 20.0], &[2]).unwrap();
    let d = ((((&a + &row).unwrap() * 2.0).unwrap() - &a).unwrap() / 4.0).unwrap();
    let expect: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .zip([10.0f32, 20.0, 10.0, 20.0])
        .map(|(x, r)| ((x + r) * 2.0 - x) / 4.0)
        .collect();
    assert_eq!(d.to_vec::<f32>().unwrap(), expect);

    // Integer arithmetic and arange.
    let r = ops::arange(0.0, 5.0, 1.0, Dtype::Int32, None).unwrap();
    let sq = (&r * &r).unwrap();
    assert_eq!(sq.to_vec::<i32>().unwrap(), vec![0, 1, 4, 9, 16]);

    // exp(0) = 1, sqrt(16) = 4: exact in IEEE arithmetic.
    let z = ops::zeros(&[3], Dtype::Float32, None).unwrap();
    assert_eq!(z.exp().unwrap().to_vec::<f32>().unwrap(), vec![1.0; 3]);
    let sixteen = ops::full(&[2], &Array::scalar(16.0f32).unwrap(), Dtype::Float32, None).unwrap();
    assert_eq!(
        sixteen.sqrt().unwrap().to_vec::<f32>().unwrap(),
        vec![4.0, 4.0]
    );

    // astype float -> int truncates toward zero.
    let f = Array::from_slice(&[1.9f32, -1.9, 2.5], &[3]).unwrap();
    assert_eq!(
        f.astype(Dtype::Int32).unwrap().to_vec::<i32>().unwrap(),
        vec![1, -1, 2]
    );
}

#[test]
fn scalars_are_weak_like_python() {
    let x = Array::from_slice(&[bf16::from_f32(1.5), bf16::from_f32(-3.0)], &[2]).unwrap();
    let y = (&x * 2.0f32).unwrap();
    assert_eq!(
        y.dtype(),
        Dtype::Bfloat16,
        "a float scalar keeps bf16 (Python semantics)"
    );
    assert_eq!(
        y.to_vec::<bf16>().unwrap(),
        vec![bf16::from_f32(3.0), bf16::from_f32(-6.0)]
    );
    let i = Array::from_slice(&[1i32, 2], &[2]).unwrap();
    assert_eq!((&i + 1).unwrap().dtype(), Dtype::Int32);
    assert_eq!(
        (&i * 0.5f32).unwrap().dtype(),
        Dtype::Float32,
        "int array * float -> f32"
    );
    let h = Array::from_slice(&[f16::from_f32(1.0)], &[1]).unwrap();
    assert_eq!((2 - &h).unwrap().dtype(), Dtype::Float16);
    // A strong f32 array, by contrast, promotes.
    let two = Array::scalar(2.0f32).unwrap();
    assert_eq!((&x * &two).unwrap().dtype(), Dtype::Float32);
    // An int that does not fit the array's narrow int dtype is an error, as in Python.
    let u = Array::from_slice(&[1u8], &[1]).unwrap();
    assert!((&u + 300).is_err());
}

#[test]
fn mlx_exceptions_arrive_as_errors_naming_the_op() {
    let a = ops::ones(&[2, 3], Dtype::Float32, None).unwrap();
    let err = a.matmul(&a).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("[matmul]"),
        "MLX's message names the op: {msg}"
    );
    assert!(matches!(err, Error::Mlx { op: "matmul", .. }));
    let err = a.reshape(&[7]).unwrap_err();
    assert!(err.to_string().contains("[reshape]"), "{err}");
    // The thread is fine afterwards.
    assert_eq!((&a + &a).unwrap().to_vec::<f32>().unwrap(), vec![2.0; 6]);
}

#[test]
fn streams_and_devices() {
    let cpu = Stream::cpu().unwrap();
    assert_eq!(cpu.device().unwrap(), Device::cpu());
    let a = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let b = ops::add(&a, &a, Some(&cpu)).unwrap();
    cpu.synchronize().unwrap();
    assert_eq!(b.to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
    let dev = Device::default_device().unwrap();
    assert!(dev.is_available().unwrap());
    assert!(Device::count(DeviceType::Cpu).unwrap() >= 1);
    let other = Stream::new(Device::cpu()).unwrap();
    assert_ne!(other.index(), cpu.index());
    let c = ops::multiply(&b, &b, Some(&other)).unwrap();
    mlx_core::eval([&c]).unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![4.0, 16.0]);
    mlx_core::async_eval([&c]).unwrap();
    mlx_core::synchronize().unwrap();
    assert!(mlx_core::mlx_version().starts_with("0.32.4"));
}

#[test]
fn clones_share_and_display_prints() {
    let a = Array::from_slice(&[1i32, 2, 3], &[3]).unwrap();
    let b = a.clone();
    assert_eq!(a.id(), b.id());
    drop(a);
    assert_eq!(b.to_vec::<i32>().unwrap(), vec![1, 2, 3]);
    assert_eq!(b.to_string(), "array([1, 2, 3], dtype=int32)");
    assert_eq!(format!("{b:?}"), "Array(shape=[3], dtype=int32)");
}

/// `to_vec` copies a contiguous array straight from its buffer and makes strided views
/// contiguous first: both read row-major.
#[test]
fn to_vec_reads_views_row_major() -> Result<()> {
    let a = Array::from_slice(&[0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3])?;
    let t = ops::transpose(&a, &[1, 0], None)?;
    assert_eq!(t.to_vec::<f32>()?, vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    let row = ops::slice_axis(&a, 0, 1, 2, None)?;
    assert_eq!(row.to_vec::<f32>()?, vec![3.0, 4.0, 5.0]);
    let col = ops::slice_axis(&a, 1, 1, 2, None)?;
    assert_eq!(col.to_vec::<f32>()?, vec![1.0, 4.0]);
    let b = ops::broadcast_to(&Array::from_slice(&[7.0f32], &[1])?, &[3], None)?;
    assert_eq!(b.to_vec::<f32>()?, vec![7.0; 3]);
    let h = a.astype(Dtype::Bfloat16)?;
    assert_eq!(h.to_vec_f32()?, vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    Ok(())
}

/// `as_slice` borrows an evaluated row-contiguous array's own buffer (a row slice too) and
/// refuses a wrong dtype, a transposed view and a broadcast.
#[test]
fn as_slice_borrows_contiguous_and_refuses_views() -> Result<()> {
    let a = Array::from_slice(&[0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3])?;
    let s = a.as_slice::<f32>()?;
    assert_eq!(s, &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    assert_eq!(a.as_slice::<f32>()?.as_ptr(), s.as_ptr(), "no copy");
    let row = ops::slice_axis(&a, 0, 1, 2, None)?;
    assert_eq!(row.as_slice::<f32>()?, &[3.0, 4.0, 5.0]);
    assert!(a.as_slice::<i32>().is_err());
    let t = ops::transpose(&a, &[1, 0], None)?;
    assert!(t.as_slice::<f32>().is_err());
    let b = ops::broadcast_to(&Array::from_slice(&[7.0f32], &[1])?, &[3], None)?;
    assert!(b.as_slice::<f32>().is_err());
    let lazy = (&a * 2.0f32)?;
    assert_eq!(lazy.as_slice::<f32>()?, &[0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
    Ok(())
}

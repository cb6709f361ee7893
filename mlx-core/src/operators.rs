//! `+ - * /` and unary `-` on arrays and weak scalars. Every operator returns
//! `Result<Array>`, so expressions read `((&a * &b)? + 1.0)?`.

use std::ops::{Add, Div, Mul, Neg, Sub};

use crate::array::Array;
use crate::error::Result;
use crate::ops;
use crate::scalar::Scalar;

macro_rules! array_operator {
    ($tr:ident, $method:ident, $op:path) => {
        impl $tr<&Array> for &Array {
            type Output = Result<Array>;
            fn $method(self, rhs: &Array) -> Result<Array> {
                $op(self, rhs, None)
            }
        }
        impl $tr<Array> for Array {
            type Output = Result<Array>;
            fn $method(self, rhs: Array) -> Result<Array> {
                $op(&self, &rhs, None)
            }
        }
        impl $tr<&Array> for Array {
            type Output = Result<Array>;
            fn $method(self, rhs: &Array) -> Result<Array> {
                $op(&self, rhs, None)
            }
        }
        impl $tr<Array> for &Array {
            type Output = Result<Array>;
            fn $method(self, rhs: Array) -> Result<Array> {
                $op(self, &rhs, None)
            }
        }
        // One float and one int type only, so unsuffixed literals (`2.0`, `1`) infer.
        array_operator!(@scalar $tr, $method, $op, f32, i32, bool);
    };
    (@scalar $tr:ident, $method:ident, $op:path, $($t:ty),*) => {$(
        impl $tr<$t> for &Array {
            type Output = Result<Array>;
            fn $method(self, rhs: $t) -> Result<Array> {
                $op(self, &Scalar::from(rhs).to_array_like(self.dtype())?, None)
            }
        }
        impl $tr<$t> for Array {
            type Output = Result<Array>;
            fn $method(self, rhs: $t) -> Result<Array> {
                $op(&self, &Scalar::from(rhs).to_array_like(self.dtype())?, None)
            }
        }
        impl $tr<&Array> for $t {
            type Output = Result<Array>;
            fn $method(self, rhs: &Array) -> Result<Array> {
                $op(&Scalar::from(self).to_array_like(rhs.dtype())?, rhs, None)
            }
        }
        impl $tr<Array> for $t {
            type Output = Result<Array>;
            fn $method(self, rhs: Array) -> Result<Array> {
                $op(&Scalar::from(self).to_array_like(rhs.dtype())?, &rhs, None)
            }
        }
    )*};
}

array_operator!(Add, add, ops::add);
array_operator!(Sub, sub, ops::subtract);
array_operator!(Mul, mul, ops::multiply);
array_operator!(Div, div, ops::divide);

impl Neg for &Array {
    type Output = Result<Array>;
    fn neg(self) -> Result<Array> {
        ops::negative(self, None)
    }
}

impl Neg for Array {
    type Output = Result<Array>;
    fn neg(self) -> Result<Array> {
        ops::negative(&self, None)
    }
}

//! `+ - * / %`, `& | ^ << >>`, unary `-` and `!` on arrays and weak scalars. Every operator
//! returns `Result<Array>`, so expressions read `((&a * &b)? + 1.0)?`. As in Python, `%` is
//! [`ops::remainder`] (the sign of the divisor), `& | ^` are bitwise (logical on bools) and
//! `!` is Python's `~` (logical not on bools, bitwise not on integers). Comparisons are
//! methods (`a.less(&b)`), since `PartialOrd` cannot return an array.

use std::ops::{Add, BitAnd, BitOr, BitXor, Div, Mul, Neg, Not, Rem, Shl, Shr, Sub};

use crate::dtype::Dtype;

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
array_operator!(Rem, rem, ops::remainder);
array_operator!(BitAnd, bitand, ops::bitwise_and);
array_operator!(BitOr, bitor, ops::bitwise_or);
array_operator!(BitXor, bitxor, ops::bitwise_xor);
array_operator!(Shl, shl, ops::left_shift);
array_operator!(Shr, shr, ops::right_shift);

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

fn invert(a: &Array) -> Result<Array> {
    if a.dtype() == Dtype::Bool {
        ops::logical_not(a, None)
    } else {
        ops::bitwise_invert(a, None)
    }
}

impl Not for &Array {
    type Output = Result<Array>;
    fn not(self) -> Result<Array> {
        invert(self)
    }
}

impl Not for Array {
    type Output = Result<Array>;
    fn not(self) -> Result<Array> {
        invert(&self)
    }
}

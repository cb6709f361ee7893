use std::arch::x86_64::*;
// Which order does Rust's _mm512_reduce_add_ps add in? Compare with the halving tree
// (i, i+8), (i, i+4), (i, i+2), (0, 1) on values where the order changes the rounding.
fn tree(v: &[f32; 16]) -> f32 {
    let mut a = *v;
    for w in [8, 4, 2, 1] {
        for i in 0..w {
            a[i] += a[i + w];
        }
    }
    a[0]
}
fn seq(v: &[f32; 16]) -> f32 { v.iter().fold(0.0, |s, x| s + x) }
#[target_feature(enable = "avx512f")]
unsafe fn red(v: &[f32; 16]) -> f32 { _mm512_reduce_add_ps(_mm512_loadu_ps(v.as_ptr())) }
fn main() {
    let mut s: u64 = 1;
    let (mut t_ok, mut s_ok, mut n) = (0, 0, 0);
    for _ in 0..100000 {
        let mut v = [0f32; 16];
        for x in v.iter_mut() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let e = ((s >> 40) % 40) as i32 - 20;
            *x = ((s >> 11) as u32 as f32 / 4294967296.0 - 0.5) * 2f32.powi(e);
        }
        let r = unsafe { red(&v) };
        t_ok += (r.to_bits() == tree(&v).to_bits()) as u32;
        s_ok += (r.to_bits() == seq(&v).to_bits()) as u32;
        n += 1;
    }
    println!("rustc _mm512_reduce_add_ps over {n} random vectors: equal to the halving tree (i,i+8),(i,i+4),(i,i+2),(0,1) in {t_ok}; equal to a left-to-right sum in {s_ok}");
}

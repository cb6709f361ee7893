//! No leaks: creating and dropping many arrays returns MLX's active memory to where it was.
//! Its own test binary, because active memory is process-wide and other tests allocate.

use mlx_core::memory;
use mlx_core::prelude::*;

#[test]
fn dropping_arrays_returns_active_memory() {
    // Warm up the allocator and this thread's stream first.
    let warm = (&ops::ones(&[1024], Dtype::Float32, None).unwrap() + 1.0).unwrap();
    warm.eval().unwrap();
    drop(warm);
    memory::clear_cache().unwrap();
    let start = memory::active_memory().unwrap();
    for i in 0..500 {
        let a = Array::from_slice(&vec![i as f32; 4096], &[64, 64]).unwrap();
        let b = (&a.matmul(&a).unwrap() + &a).unwrap();
        let c = b.clone();
        c.eval().unwrap();
        assert_eq!(c.shape(), vec![64, 64]);
        let _ = a.matmul(&ops::ones(&[3, 3], Dtype::Float32, None).unwrap()); // an Err
    }
    memory::clear_cache().unwrap();
    let end = memory::active_memory().unwrap();
    assert_eq!(end, start, "active memory before {start}, after {end}");
    assert!(memory::peak_memory().unwrap() >= 2 * 64 * 64 * 4);
    // The measurement can see a leak: an array still held shows up.
    let kept = Array::from_slice(&vec![1.0f32; 4096], &[4096]).unwrap();
    kept.eval().unwrap();
    assert_eq!(memory::active_memory().unwrap(), start + 4096 * 4);
}

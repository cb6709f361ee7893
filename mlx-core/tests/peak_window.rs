//! Peak windows (`memory::restart_peak_window`): the process's peak survives a window's restart.
//! Its own test binary, because the peak counter is process-wide and other tests allocate.

use mlx_core::memory;
use mlx_core::prelude::*;

#[test]
fn a_peak_window_keeps_the_process_peak() {
    let big = ops::ones(&[1 << 20], Dtype::Float32, None).unwrap();
    big.eval().unwrap();
    drop(big);
    let before = memory::peak_memory().unwrap();
    assert!(before >= 4 << 20, "{before}");
    let (ended, live) = memory::restart_peak_window().unwrap();
    assert_eq!(ended, before, "the window that ended held the peak so far");
    assert_eq!(live, memory::active_memory().unwrap());
    // A small allocation after the restart: the window's peak is small, the process's is not.
    let small = Array::from_slice(&[1.0f32; 256], &[256]).unwrap();
    small.eval().unwrap();
    let w = memory::window_peak(live).unwrap();
    assert!(
        w >= live + 1024 && w < live + (4 << 20),
        "{w} (live {live})"
    );
    assert_eq!(memory::peak_memory().unwrap(), before);
    // A reset forgets both.
    memory::reset_peak_memory().unwrap();
    assert!(memory::peak_memory().unwrap() < before);
}

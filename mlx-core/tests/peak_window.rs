//! Peak windows (`memory::restart_peak_window`): the process's peak survives a window's restart.
//! Its own test binary, because the peak counter is process-wide and other tests allocate.

use mlx_core::memory;
use mlx_core::prelude::*;

/// The tests read and reset the one process-wide counter: one at a time.
static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_peak_window_keeps_the_process_peak() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
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

/// The device peak noted beside MLX's (`note_device_peak`: the graph decoder's own buffers)
/// is the process's, as mlx-lm's `mx.get_peak_memory()`: it never falls back between
/// generations, only with a reset.
#[test]
fn a_noted_device_peak_is_the_processes_until_a_reset() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let mlx = memory::peak_memory().unwrap();
    assert_eq!(memory::device_peak_memory().unwrap(), mlx);
    memory::note_device_peak(mlx + (1 << 30));
    memory::note_device_peak(mlx + 1);
    assert_eq!(memory::device_peak_memory().unwrap(), mlx + (1 << 30));
    memory::reset_peak_memory().unwrap();
    assert!(memory::device_peak_memory().unwrap() < mlx + (1 << 30));
}

//! Our CUDA runtime (`gpurt` and its shim `gpurt.cpp`) is compiled only with the `cuda`
//! feature: without it the types exist, nothing reaches the driver, and `new` names the
//! feature (issue #29).
#![cfg(not(feature = "cuda"))]

use mlx_core::gpurt::GpuRuntime;

#[test]
fn without_the_cuda_feature_the_runtime_is_absent_and_says_why() {
    assert!(!GpuRuntime::available());
    let err = GpuRuntime::new("extern \"C\" __global__ void k() {}", &[("k", 0)]).unwrap_err();
    assert!(err.to_string().contains("`cuda` feature"), "{err}");
}

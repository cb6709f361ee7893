//! Custom kernels. This libmlx is the CPU build: no Metal, no CUDA. Building or calling a
//! kernel must give a clear `Err` (never a panic), so that callers fall back to their
//! plain-ops reference.

use mlx_core::kernels::{CustomKernel, KernelBackend, Launch, TemplateArg};
use mlx_core::prelude::*;

const SOURCE: &str = "uint elem = thread_position_in_grid.x; out[elem] = inp[elem] * T(2);";

fn builder() -> mlx_core::kernels::KernelBuilder {
    CustomKernel::builder("double_it")
        .inputs(["inp"])
        .outputs(["out"])
        .source(SOURCE)
        .header("// nothing")
        .ensure_row_contiguous(true)
}

fn launch() -> Launch {
    Launch::new([4, 1, 1], [4, 1, 1])
        .output(&[4], Dtype::Float32)
        .template("T", TemplateArg::Dtype(Dtype::Float32))
        .template("N", TemplateArg::Int(4))
        .template("FLAG", TemplateArg::Bool(true))
        .init_value(0.0)
        .verbose(false)
}

fn cpu_only() -> bool {
    KernelBackend::native().is_none()
}

#[test]
fn no_kernel_backend_on_the_cpu_build() {
    assert!(cpu_only(), "these tests describe the CPU build");
    assert!(!KernelBackend::Metal.is_available());
    assert!(!KernelBackend::Cuda.is_available());
}

#[test]
fn building_with_the_native_backend_is_a_clear_error() {
    if !cpu_only() {
        return;
    }
    let e = builder().build().unwrap_err();
    match &e {
        Error::Mlx { op, message } => {
            assert_eq!(*op, "custom_kernel");
            assert!(message.contains("no Metal or CUDA back-end"), "{message}");
            assert!(message.contains("plain-ops reference"), "{message}");
            assert!(message.contains("double_it"), "{message}");
        }
        other => panic!("unexpected error {other:?}"),
    }
}

#[test]
fn forcing_metal_builds_but_calling_fails_with_mlx_message() {
    if !cpu_only() {
        return;
    }
    let k = builder().backend(KernelBackend::Metal).build().unwrap();
    assert_eq!(k.backend(), KernelBackend::Metal);
    assert_eq!(k.name(), "double_it");
    let x = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
    let e = k.call(&[x], &launch(), None).unwrap_err();
    assert!(
        matches!(&e, Error::Mlx { message, .. } if message.contains("[metal_kernel] No Metal back-end")),
        "{e:?}"
    );
}

#[test]
fn forcing_cuda_fails_at_build_with_mlx_message() {
    if !cpu_only() {
        return;
    }
    let e = builder()
        .backend(KernelBackend::Cuda)
        .shared_memory(0)
        .build()
        .unwrap_err();
    assert!(
        matches!(&e, Error::Mlx { message, .. } if message.contains("[cuda_kernel] No CUDA back-end")),
        "{e:?}"
    );
}

#[test]
fn backend_specific_options_and_arity_are_checked() {
    let e = builder()
        .backend(KernelBackend::Cuda)
        .atomic_outputs(true)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("Metal-only"), "{e}");
    let e = builder()
        .backend(KernelBackend::Metal)
        .shared_memory(128)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("CUDA-only"), "{e}");
    let e = builder()
        .source("")
        .backend(KernelBackend::Metal)
        .build()
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    let e = builder()
        .inputs(["a\0b"])
        .backend(KernelBackend::Metal)
        .build()
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");

    let k = builder().backend(KernelBackend::Metal).build().unwrap();
    let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let e = k
        .call(&[x.clone(), x.clone()], &launch(), None)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    let two_outputs = launch().output(&[2], Dtype::Float32);
    let e = k.call(&[x], &two_outputs, None).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
}

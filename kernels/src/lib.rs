//! porter's compute kernels.
//!
//! Everything here works on plain slices and knows no model: `core` wraps these
//! kernels into tensors and shared blocks, and model crates compose those blocks.
//! The CPU kernels are the reference implementation that every other backend
//! (CUDA, later) is tested against.

pub mod cpu;
pub mod cuda;

#[cfg(all(feature = "cuda-12", feature = "cuda-13"))]
compile_error!(
    "porter-kernels: features `cuda-12` and `cuda-13` exclude each other (cudarc takes one CUDA version); \
     build with `--no-default-features --features cuda-12` for CUDA 12"
);
#[cfg(not(any(feature = "cuda-12", feature = "cuda-13")))]
compile_error!("porter-kernels: enable one of the features `cuda-13` (the default) or `cuda-12`");

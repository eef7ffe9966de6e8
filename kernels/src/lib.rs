//! porter's compute kernels.
//!
//! Everything here works on plain slices and knows no model: `core` wraps these
//! kernels into tensors and shared blocks, and model crates compose those blocks.
//! The CPU kernels are the reference implementation that every other backend
//! (CUDA, later) is tested against.

pub mod cpu;
pub mod cuda;

//! The ops the shared blocks need, with a CPU and a CUDA implementation side by side.

pub mod cuda;

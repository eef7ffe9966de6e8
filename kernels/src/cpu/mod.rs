//! CPU kernels: row-major `f32` slices, rayon parallelism, a real GEMM.

pub mod act;
pub mod erf;
pub mod fp8;
pub mod gdn;
pub mod kv_quant;
pub mod ops;
pub use act::Act;

//! Element types of weights and activations.

use half::{bf16, f16};
use std::fmt;
use std::str::FromStr;

/// The compute dtype of a model instance.
///
/// On the CPU backend values are held in `f32` buffers and rounded to the dtype after
/// every op ("bf16 compute with f32 accumulation"), which reproduces the rounding points
/// of a bf16 / f16 model while keeping one set of kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    BF16,
    F16,
}

impl DType {
    /// Rounds one value to this dtype (kept in an `f32`).
    #[inline]
    pub fn round(self, v: f32) -> f32 {
        match self {
            DType::F32 => v,
            DType::BF16 => bf16::from_f32(v).to_f32(),
            DType::F16 => f16::from_f32(v).to_f32(),
        }
    }

    /// Rounds every value of `xs` in place (a no-op for `F32`).
    pub fn round_slice(self, xs: &mut [f32]) {
        if self != DType::F32 {
            xs.iter_mut().for_each(|v| *v = self.round(*v));
        }
    }

    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::BF16 | DType::F16 => 2,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
        })
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(DType::F32),
            "bf16" | "bfloat16" => Ok(DType::BF16),
            "f16" | "float16" | "half" => Ok(DType::F16),
            other => Err(format!("unknown dtype `{other}` (expected f32, bf16 or f16)")),
        }
    }
}

//! The element type of a KV cache: the model dtype, or one byte per element with a scale per
//! (token, KV head) (`--kv-cache-dtype auto|fp8|int8`, vLLM's flag).

use crate::tensor::DType;
pub use porter_kernels::cpu::kv_quant::KvQuant;

/// What a KV cache stores K and V as.
///
/// `Fp8` / `Int8` keep one byte per element and one `f32` scale per (token, KV head),
/// computed at append time (`porter_kernels::cpu::kv_quant`): "per-head scales", at the
/// granularity LMDeploy / TurboMind use (each token's head row has its own), so no
/// calibration and no outlier from another token widens a row's step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvDtype {
    /// The model dtype (f32 values rounded to it on the CPU).
    #[default]
    Auto,
    /// float8 e4m3fn, `scale = amax / 448`.
    Fp8,
    /// Symmetric int8, `scale = amax / 127`.
    Int8,
}

impl KvDtype {
    /// The 1-byte format, or `None` for the model dtype.
    pub fn quant(self) -> Option<KvQuant> {
        match self {
            KvDtype::Auto => None,
            KvDtype::Fp8 => Some(KvQuant::Fp8),
            KvDtype::Int8 => Some(KvQuant::Int8),
        }
    }

    /// Bytes one token takes in one attention layer: K and V of `kv_heads · head_dim`
    /// elements, plus one `f32` scale per KV head each for K and V when quantized.
    pub fn bytes_per_token(self, kv_heads: usize, head_dim: usize, model: DType) -> usize {
        match self.quant() {
            None => 2 * kv_heads * head_dim * model.size_in_bytes(),
            Some(_) => 2 * kv_heads * (head_dim + 4),
        }
    }

    /// The flag value (`auto`, `fp8`, `int8`).
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::Auto => "auto",
            KvDtype::Fp8 => "fp8",
            KvDtype::Int8 => "int8",
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvDtype {
    type Err = String;

    /// `auto`, `fp8` (also `fp8_e4m3`, vLLM's alias) or `int8`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(KvDtype::Auto),
            "fp8" | "fp8_e4m3" => Ok(KvDtype::Fp8),
            "int8" => Ok(KvDtype::Int8),
            _ => Err(format!("unknown KV cache dtype `{s}` (expected auto, fp8 or int8)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_sizes() {
        assert_eq!("FP8".parse::<KvDtype>(), Ok(KvDtype::Fp8));
        assert_eq!("int8".parse::<KvDtype>(), Ok(KvDtype::Int8));
        assert!("fp4".parse::<KvDtype>().is_err());
        // Qwen3-Next: 2 KV heads of 256: 2048 bytes a token in bf16, 1040 quantized (1.97x).
        assert_eq!(KvDtype::Auto.bytes_per_token(2, 256, DType::BF16), 2048);
        assert_eq!(KvDtype::Fp8.bytes_per_token(2, 256, DType::BF16), 1040);
        assert_eq!(KvDtype::Int8.bytes_per_token(8, 128, DType::F32), 2 * 8 * 132);
    }
}

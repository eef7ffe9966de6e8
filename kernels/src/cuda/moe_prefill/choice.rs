//! The prefill path's A/B knobs: [`MOE_GEMM_ENV`] (mma.sync, streamed or wmma GEMMs) and
//! [`MOE_ALIGN_ENV`] (parallel or single-block alignment), and the per-call [`Choice`].

/// Environment variable choosing the dense bf16 / f16 prefill GEMMs: `auto` (the default:
/// on sm_90 `wgmma` at every size — 1.54× `mma` at t = 4096 and 1.03–1.13× `pipe` at
/// t = 512 / 1024 on an H200, docs/benchmarks.md, session 12; elsewhere
/// `pipe` where its tiles are 64 rows, i.e. up to ≈ 33 rows an expert — t ≤ ~1.6k tokens at
/// the 80B shape, where it measured 1.38–1.44× the mma GEMMs on an H200 — else `mma`, which
/// its 128-row tiles did not beat at t = 4096; docs/benchmarks.md, session 11), `mma` (the
/// mma.sync GEMMs of moe_prefill.cu), `pipe` (moe_prefill.cu's streamed mma.sync GEMMs: one
/// tile an expert, 128-byte k-steps, column blocks chained in one pipeline; where their stages
/// do not fit, `mma`) or `wmma` (moe.cu's wmma GEMMs, the A/B baseline). Read
/// on every call; another value warns once on stderr and means `auto`. Where the mma.sync
/// GEMMs do not fit (below sm_80, forced fallback, less shared memory than their stages need,
/// f32, unaligned rows) the wmma or CUDA-core GEMMs run whatever it says; FP8 experts always
/// take their own GEMMs (fp8_gemm.cu). `wgmma` (moe_wgmma.cu's warpgroup-MMA GEMMs, tokens as
/// wgmma's N, the streamed form's tiles and column-block chaining; sm_90 only, compiled for
/// sm_90a; elsewhere or where they do not fit, as `pipe`).
pub const MOE_GEMM_ENV: &str = "PORTER_MOE_GEMM";

/// Environment variable choosing the prefill path's alignment: `parallel` (the default: moe_prefill.cu's
/// `moe_palign_*` over many blocks, beyond 4096 pairs) or `one` (moe.cu's single-block
/// `moe_align` at every size, the A/B baseline). Read on every call; another value warns once on
/// stderr and means `parallel`.
pub const MOE_ALIGN_ENV: &str = "PORTER_MOE_ALIGN";

/// Whether [`MOE_ALIGN_ENV`]'s value `v` asks for the single-block alignment (`Err`: the value,
/// unknown).
fn one_block_align(v: Option<&std::ffi::OsStr>) -> std::result::Result<bool, String> {
    let Some(v) = v else { return Ok(false) };
    match v.to_string_lossy().trim().to_ascii_lowercase().as_str() {
        "" | "parallel" => Ok(false),
        "one" => Ok(true),
        _ => Err(v.to_string_lossy().into_owned()),
    }
}

/// [`one_block_align`] for the process environment, warning once about a value it does not know.
pub(super) fn one_block_align_env() -> bool {
    let parsed = one_block_align(std::env::var_os(MOE_ALIGN_ENV).as_deref());
    crate::cuda::env::one_of_or(MOE_ALIGN_ENV, parsed, &["parallel", "one"], "parallel", false)
}

/// The prefill path's choices: GEMM form, tile fragments (`None`: the host's choice) and
/// whether the alignment is the single-block one.
#[derive(Clone, Copy, Debug)]
pub(super) struct Choice {
    /// The dense GEMM form.
    pub(super) gemm: MoeGemm,
    /// Row fragments of a tile (tiles of 16·frags rows), or the host's choice.
    pub(super) frags: Option<usize>,
    /// The single-block alignment at every size.
    pub(super) one_block_align: bool,
}

/// Which dense tensor-core GEMMs the prefill path runs ([`MOE_GEMM_ENV`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MoeGemm {
    /// [`MoeGemm::Wgmma`] where it runs (sm_90), else [`MoeGemm::Pipe`] where its tiles are 64
    /// rows, else [`MoeGemm::Mma`] (resolved per call from the device and the shape:
    /// `moe_prefill.rs`).
    Auto,
    /// moe_prefill.cu's mma.sync GEMMs (8 warps, 16·MI × 512 block tiles), where they fit.
    Mma,
    /// moe.cu's wmma GEMMs (4 warps, 16·MI × 256 block tiles).
    Wmma,
    /// moe_prefill.cu's streamed mma.sync GEMMs (one tile an expert, 64 or 128 rows), where
    /// they fit; else as [`MoeGemm::Mma`].
    Pipe,
    /// moe_wgmma.cu's warpgroup-MMA GEMMs (sm_90: tokens as wgmma's N, 256 weight rows a
    /// column block), where they fit; else as [`MoeGemm::Pipe`].
    Wgmma,
}

impl MoeGemm {
    /// The form [`MOE_GEMM_ENV`] asks for ([`MoeGemm::Auto`] when unset or unknown).
    pub(super) fn from_env() -> Self {
        let v = std::env::var_os(MOE_GEMM_ENV);
        let words = ["auto", "mma", "pipe", "wgmma", "wmma"];
        crate::cuda::env::one_of_or(MOE_GEMM_ENV, Self::from_value(v.as_deref()), &words, "auto", MoeGemm::Auto)
    }

    /// The value of [`MOE_GEMM_ENV`] that names this form.
    pub(super) fn name(self) -> &'static str {
        match self {
            MoeGemm::Auto => "auto",
            MoeGemm::Mma => "mma",
            MoeGemm::Wmma => "wmma",
            MoeGemm::Pipe => "pipe",
            MoeGemm::Wgmma => "wgmma",
        }
    }

    /// [`MoeGemm::from_env`] for a given value of the variable (`Err`: the value, unknown).
    pub(super) fn from_value(v: Option<&std::ffi::OsStr>) -> std::result::Result<Self, String> {
        let Some(v) = v else { return Ok(MoeGemm::Auto) };
        match v.to_string_lossy().trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(MoeGemm::Auto),
            "mma" => Ok(MoeGemm::Mma),
            "wmma" => Ok(MoeGemm::Wmma),
            "pipe" => Ok(MoeGemm::Pipe),
            "wgmma" => Ok(MoeGemm::Wgmma),
            _ => Err(v.to_string_lossy().into_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{one_block_align, MoeGemm};
    use std::ffi::OsStr;

    #[test]
    fn moe_gemm_env_values() {
        assert_eq!(MoeGemm::from_value(None), Ok(MoeGemm::Auto));
        assert_eq!(MoeGemm::from_value(Some(OsStr::new(""))), Ok(MoeGemm::Auto));
        assert_eq!(MoeGemm::from_value(Some(OsStr::new("Auto"))), Ok(MoeGemm::Auto));
        assert_eq!(MoeGemm::from_value(Some(OsStr::new(" MMA "))), Ok(MoeGemm::Mma));
        assert_eq!(MoeGemm::from_value(Some(OsStr::new("wmma"))), Ok(MoeGemm::Wmma));
        assert_eq!(MoeGemm::from_value(Some(OsStr::new("Pipe"))), Ok(MoeGemm::Pipe));
        assert_eq!(MoeGemm::from_value(Some(OsStr::new("tc"))), Err("tc".to_string()));
        assert_eq!(MoeGemm::from_value(Some(OsStr::new("WGMMA"))), Ok(MoeGemm::Wgmma));
        for f in [MoeGemm::Auto, MoeGemm::Mma, MoeGemm::Wmma, MoeGemm::Pipe, MoeGemm::Wgmma] {
            assert_eq!(MoeGemm::from_value(Some(OsStr::new(f.name()))), Ok(f));
        }
    }

    #[test]
    fn moe_align_env_values() {
        assert_eq!(one_block_align(None), Ok(false));
        assert_eq!(one_block_align(Some(OsStr::new("Parallel"))), Ok(false));
        assert_eq!(one_block_align(Some(OsStr::new("one"))), Ok(true));
        assert_eq!(one_block_align(Some(OsStr::new("single"))), Err("single".to_string()));
    }
}

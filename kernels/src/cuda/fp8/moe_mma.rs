//! Launch code of the tensor-core FP8 routed experts for decode batches
//! (kernels/cuda/fp8_moe_mma.cu): `moe_align`, then gate+up (`fp8_moe_mma_gu_<T>`), down
//! (`fp8_moe_mma_down_<T>`) and the combine (`moe_combine[8]_<T>`), bf16 / f16 activations on
//! sm_80+. Chosen over the GEMV form by [`FP8_MOE_DEC_ENV`] (default: beyond the direct GEMV
//! form's pairs; H200, session 12: 3.69 TB/s of FP8 weights at t = 64 against 1.25 for v1).

use super::super::moe::{io_ptrs, vec_ok};
use super::super::moe_decode::{check_dims, DIRECT_MAX_PAIRS};
use super::super::moe_mma::{mma_smem, MmaCall};
use super::super::{CudaError, CudaFloat, CudaKernels, Result, FP8};
use super::Fp8Dev;
use cudarc::driver::{DevicePtr, DevicePtrMut};

/// Environment variable choosing the FP8 routed experts' decode form: `gemv` (the
/// moe_decode.cu GEMVs with the FP8 row reader), `mma` (or unset: the default; tensor cores,
/// [`CudaKernels::moe_experts_fp8_mma`], where [`CudaKernels::moe_fp8_mma_fits`], beyond
/// `DIRECT_MAX_PAIRS` pairs; the GEMV direct form up to it) or
/// `mma-all` (the tensor-core form at every batch). Read once per process; another value
/// warns once on stderr and means `mma`. Batch-invariant mode always takes the GEMV form.
pub const FP8_MOE_DEC_ENV: &str = "PORTER_FP8_MOE_DEC";

/// The FP8 routed experts' decode form ([`FP8_MOE_DEC_ENV`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8MoeDec {
    /// The GEMV form (CUDA cores; batch-invariant).
    Gemv,
    /// The tensor-core form (swap-AB mma.sync; not batch-invariant) beyond
    /// `DIRECT_MAX_PAIRS` pairs, the GEMV form up to it.
    Mma,
    /// The tensor-core form at every batch.
    MmaAll,
}

impl Fp8MoeDec {
    /// Parses a value of a decode-form switch ([`FP8_MOE_DEC_ENV`], and the dense experts'
    /// `PORTER_MOE_DEC`): unset or empty is `mma` (`Err`: the value, unknown).
    pub fn parse(v: Option<&str>) -> std::result::Result<Self, String> {
        match v.map(|s| s.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") | Some("mma") => Ok(Self::Mma),
            Some("gemv") => Ok(Self::Gemv),
            Some("mma-all") => Ok(Self::MmaAll),
            Some(_) => Err(v.unwrap_or_default().to_string()),
        }
    }

    /// The form the environment variable `var` names ([`Fp8MoeDec::parse`]; an unknown value
    /// warns on stderr and means `mma`). The callers read it once a process.
    pub(crate) fn from_env(var: &str) -> Self {
        let v = std::env::var(var).ok();
        Self::parse(v.as_deref()).unwrap_or_else(|bad| {
            eprintln!("warning: {var}={bad:?} is not gemv, mma or mma-all; using mma");
            Self::Mma
        })
    }

    /// The form of this process ([`FP8_MOE_DEC_ENV`], read once).
    pub fn of_process() -> Self {
        static FORM: std::sync::OnceLock<Fp8MoeDec> = std::sync::OnceLock::new();
        *FORM.get_or_init(|| Self::from_env(FP8_MOE_DEC_ENV))
    }

    /// Whether this form runs the tensor-core kernels for `pairs` (row, expert) pairs.
    pub fn mma_at(self, pairs: usize) -> bool {
        match self {
            Self::Gemv => false,
            Self::Mma => pairs > DIRECT_MAX_PAIRS,
            Self::MmaAll => true,
        }
    }
}

/// Dynamic shared memory a block: 4 stages of 128 × 128 weight bytes and 8 × 128 activations
/// of 2 bytes.
const SMEM: usize = mma_smem(1);

impl CudaKernels {
    /// Whether [`CudaKernels::moe_experts_fp8_mma`] runs for activations `T` and rows of
    /// `hidden` / `inter` weights: bf16 or f16, tensor cores (sm_80+, not the forced fallback),
    /// enough shared memory a block, both row lengths multiples of 16.
    pub fn moe_fp8_mma_fits<T: CudaFloat>(&self, hidden: usize, inter: usize) -> bool {
        self.mma_dec_fits::<T>(hidden, inter, 16, SMEM)
    }

    /// [`CudaKernels::moe_experts_fp8`] on tensor cores (fp8_moe_mma.cu): the pairs grouped by
    /// expert (`moe_align`), each expert's weight rows the M side of bf16 / f16 MMAs against its
    /// routed rows 8 at a time, the e4m3 bytes converted exactly in registers, each 128-column
    /// block's f32 partial sum times its scale; h and o rounded to `T` as the GEMV form, the
    /// same combine. Same semantics as the GEMV form up to f32 summation order; not
    /// batch-invariant.
    ///
    /// # Shapes
    /// As [`CudaKernels::moe_experts_fp8`].
    ///
    /// # Errors
    /// [`CudaError::Invalid`] on a length mismatch, a shape [`CudaKernels::moe_fp8_mma_fits`]
    /// refuses or unaligned buffers; as [`CudaKernels::moe_experts`] otherwise.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_experts_fp8_mma<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        gate: Fp8Dev<'_>,
        up: Fp8Dev<'_>,
        down: Fp8Dev<'_>,
        out: &mut impl DevicePtrMut<f32>,
        dims: [usize; 5],
    ) -> Result<()> {
        let [t, _, _, hidden, inter] = dims;
        check_dims("moe_experts_fp8_mma", dims)?;
        if !self.moe_fp8_mma_fits::<T>(hidden, inter) {
            return Err(CudaError::Invalid(format!(
                "moe_experts_fp8_mma: {} activations, hidden {hidden}, inter {inter} on this device do not fit",
                T::NAME
            )));
        }
        self.check_routed(x, idx, w, &gate, &up, &down, out, dims)?;
        if t == 0 {
            return Ok(());
        }
        let s = &self.stream;
        let ((gate, _gg), (up, _gu), (down, _gd)) = (gate.args(s), up.args(s), down.args(s));
        let ([px, pi, pw, po], _gio) = io_ptrs(s, x, idx, w, out);
        let (pg, pu, pd) = (gate[0], up[0], down[0]);
        if !(vec_ok::<T>(px, hidden) && vec_ok::<u8>(pg, hidden) && vec_ok::<u8>(pu, hidden) && vec_ok::<u8>(pd, inter))
        {
            return Err(CudaError::Invalid("moe_experts_fp8_mma: x and the weights must be 16-byte aligned".into()));
        }
        let call = MmaCall {
            src: &FP8,
            prefix: "fp8_moe_mma",
            tname: T::NAME,
            esize: std::mem::size_of::<T>(),
            x: px,
            idx: pi,
            w: pw,
            out: po,
            gate: &gate,
            up: &up,
            down: &down,
            dims,
            smem: SMEM,
        };
        self.moe_mma_run(&call)
    }
}

#[cfg(test)]
mod tests {
    use super::Fp8MoeDec;

    #[test]
    fn parses_the_switch() {
        assert_eq!(Fp8MoeDec::parse(None), Ok(Fp8MoeDec::Mma));
        assert_eq!(Fp8MoeDec::parse(Some(" MMA ")), Ok(Fp8MoeDec::Mma));
        assert_eq!(Fp8MoeDec::parse(Some("gemv")), Ok(Fp8MoeDec::Gemv));
        assert!(Fp8MoeDec::parse(Some("wgmma")).is_err());
        assert_eq!(Fp8MoeDec::parse(Some("mma-all")), Ok(Fp8MoeDec::MmaAll));
        assert!(!Fp8MoeDec::Mma.mma_at(40) && Fp8MoeDec::Mma.mma_at(41) && Fp8MoeDec::MmaAll.mma_at(1));
        assert!(!Fp8MoeDec::Gemv.mma_at(640));
    }
}

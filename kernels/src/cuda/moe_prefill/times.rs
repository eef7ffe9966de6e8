//! The prefill path's profiling entry points: [`CudaKernels::moe_prefill_stage_times`] and
//! its forms (split from moe_prefill.rs).

use super::choice::{one_block_align_env, Choice, MoeGemm};
use super::{ExpertWeights, PrefillTimes};
use crate::cuda::moe::{Dense, MOE_MAX_E};
use crate::cuda::{CudaError, CudaFloat, CudaKernels, Result};
use cudarc::driver::{DevicePtr, DevicePtrMut};

impl CudaKernels {
    /// The prefill path of [`CudaKernels::moe_experts`] (same arguments and
    /// checks; `t·k` must exceed the decode threshold), synchronising the
    /// stream after every stage: returns the seconds of the alignment, the
    /// gate+up GEMM, the down GEMM and the combine (host clock around each
    /// launch + synchronise). For profiling only.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub fn moe_prefill_stage_times<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        gate: &impl DevicePtr<T>,
        up: &impl DevicePtr<T>,
        down: &impl DevicePtr<T>,
        out: &mut impl DevicePtrMut<f32>,
        t: usize,
        k: usize,
        e: usize,
        hidden: usize,
        inter: usize,
    ) -> Result<[f64; 4]> {
        let dims = [t, k, e, hidden, inter];
        // The form the model path takes for this environment (auto, wgmma, mma, pipe or wmma).
        let form = MoeGemm::from_env().name();
        let one = one_block_align_env();
        Ok(self.moe_prefill_stage_times_form(x, idx, w, gate, up, down, out, dims, form, None, one)?.secs)
    }

    /// [`CudaKernels::moe_prefill_stage_times`] (`dims` = t, k, e, hidden, inter) with the
    /// GEMM form `mma` (true: the mma.sync GEMMs, false: the wmma ones, as `PORTER_MOE_GEMM`
    /// = `mma` / `wmma`; where it does not fit, the one that does) and, with `frags`, tiles of
    /// `16·frags` rows (1, 2, 3, 4, 6 or 8; the wmma form: at most 4) instead of
    /// [`CudaKernels::moe_prefill_mma_frags`]'s / [`CudaKernels::moe_prefill_tile_frags`]'s
    /// choice (fewer where the wmma form's stages do not fit), and with `one_block_align` the
    /// single-block alignment at every size (as `PORTER_MOE_ALIGN=one`). `out` gets the
    /// call's result. For A/B runs and profiling only.
    ///
    /// # Errors
    /// As [`CudaKernels::moe_experts`]; [`CudaError::Invalid`] for t = 0, other bad dims or other
    /// `frags`.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub fn moe_prefill_stage_times_with<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        gate: &impl DevicePtr<T>,
        up: &impl DevicePtr<T>,
        down: &impl DevicePtr<T>,
        out: &mut impl DevicePtrMut<f32>,
        dims: [usize; 5],
        mma: bool,
        frags: Option<usize>,
        one_block_align: bool,
    ) -> Result<PrefillTimes> {
        let form = if mma { "mma" } else { "wmma" };
        self.moe_prefill_stage_times_form(x, idx, w, gate, up, down, out, dims, form, frags, one_block_align)
    }

    /// [`CudaKernels::moe_prefill_stage_times_with`] with the GEMM form named as
    /// `PORTER_MOE_GEMM`'s values: `mma`, `pipe` / `wgmma` (tiles of 64 or 128 rows: `frags` 4
    /// or 8) or `wmma`. For A/B runs and profiling only.
    ///
    /// # Errors
    /// As [`CudaKernels::moe_prefill_stage_times_with`]; [`CudaError::Invalid`] for another
    /// form name.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub fn moe_prefill_stage_times_form<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        gate: &impl DevicePtr<T>,
        up: &impl DevicePtr<T>,
        down: &impl DevicePtr<T>,
        out: &mut impl DevicePtrMut<f32>,
        dims: [usize; 5],
        form: &str,
        frags: Option<usize>,
        one_block_align: bool,
    ) -> Result<PrefillTimes> {
        let gemm = MoeGemm::from_value(Some(std::ffi::OsStr::new(form))).map_err(|bad| {
            CudaError::Invalid(format!("moe prefill: GEMM form {bad:?}, not mma, pipe, wgmma or wmma"))
        })?;
        let [t, k, e, hidden, inter] = dims;
        // (Decode shapes too: the prefill path takes any t >= 1; the model path sends them to the
        // decode GEMVs.)
        if t == 0 || k == 0 || k > e || e > MOE_MAX_E || hidden == 0 || inter == 0 {
            return Err(CudaError::Invalid("moe_prefill_stage_times: not a prefill shape".into()));
        }
        self.check_routed(x, idx, w, &Dense(gate), &Dense(up), &Dense(down), out, dims)?;
        // Stages 0..4 (alignment, gate+up, down, combine), 4: the scratch allocation.
        let mut secs = [0.0f64; 5];
        let s = &self.stream;
        let ((pg, _gg), (pu, _gu), (pd, _gd)) = (gate.device_ptr(s), up.device_ptr(s), down.device_ptr(s));
        let weights = ExpertWeights::Dense { gate: pg, up: pu, down: pd };
        self.stream.synchronize()?;
        let mut clock = std::time::Instant::now();
        let choice = Choice { gemm, frags, one_block_align };
        let (form, tile_rows, align_blocks) =
            self.moe_prefill_in::<T>(x, idx, w, weights, out, dims, choice, &mut |stage| {
                self.stream.synchronize()?;
                let now = std::time::Instant::now();
                secs[stage] = (now - clock).as_secs_f64();
                clock = now;
                Ok(())
            })?;
        let [a, g, d, c, alloc_secs] = secs;
        Ok(PrefillTimes { secs: [a, g, d, c], form, tile_rows, align_blocks, alloc_secs })
    }
}

//! Launch wrappers of the Gated DeltaNet kernels (Qwen3-Next linear
//! attention): gates, causal conv1d (decode update and prefill), and one
//! recurrent step of the gated delta rule. Semantics of [`crate::cpu::gdn`].

use super::{ew_cfg, opt_ptr, prod, u32_of, CudaError, CudaFloat, CudaKernels, Result, GDN};
use cudarc::driver::{CudaView, DevicePtr, DevicePtrMut, LaunchConfig};

/// Largest key head dim of [`CudaKernels::gdn_recurrent_step`]
/// (`REC_NW · REC_MAXR` in gdn.cu).
pub const GDN_MAX_DK: usize = 256;

/// Warps per block of the recurrent step (`REC_NW` in gdn.cu).
const REC_NW: u32 = 8;

impl CudaKernels {
    /// GDN gates per token and value head (`cpu::gdn::gdn_gates`):
    /// `g = −exp(A_log) · softplus(a + dt_bias)` (softplus threshold 20) and
    /// `beta = σ(b)`, in f32.
    ///
    /// # Shapes
    /// - `a`, `b`: `[t, hv]` (`T`)
    /// - `a_log`, `dt_bias`: `[hv]` (`f32`)
    /// - `g`, `beta`: `[t, hv]` (`f32`)
    ///
    /// # Errors
    /// [`CudaError::Invalid`] if `hv == 0` or on a length mismatch; driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_gates<T: CudaFloat>(
        &self,
        a: &impl DevicePtr<T>,
        b: &impl DevicePtr<T>,
        a_log: &impl DevicePtr<f32>,
        dt_bias: &impl DevicePtr<f32>,
        g: &mut impl DevicePtrMut<f32>,
        beta: &mut impl DevicePtrMut<f32>,
        t: usize,
        hv: usize,
    ) -> Result<()> {
        if hv == 0 {
            return Err(CudaError::Invalid("gdn_gates: hv must be > 0".into()));
        }
        let n = prod(&[t, hv])?;
        self.check("a", a, n)?;
        self.check("b", b, n)?;
        self.check("a_log", a_log, hv)?;
        self.check("dt_bias", dt_bias, hv)?;
        self.check("g", g, n)?;
        self.check("beta", beta, n)?;
        if n == 0 {
            return Ok(());
        }
        let (n64, hv32) = (n as u64, u32_of("hv", hv)?);
        // SAFETY: arguments match `gdn_gates_<T>` in gdn.cu; lengths checked.
        // Kernel: `gdn_gates_<T>(const T* a, const T* b, const float* a_log, const float* dt_bias, float* g,
        // float* beta, u64 n, u32 hv)`.
        unsafe {
            launch!(
                self,
                GDN,
                format!("gdn_gates_{}", T::NAME),
                ew_cfg(n),
                [ptr(a), ptr(b), ptr(a_log), ptr(dt_bias), ptr_mut(g), ptr_mut(beta), n64, hv32]
            )
        }
    }

    /// One decode step of the causal depthwise conv1d + SiLU for `n` sequences
    /// (`cpu::gdn::causal_conv1d_update` per row, same arithmetic order):
    /// `y[c] = silu(Σ_{i<K−1} w[c,i]·state[c,i] + w[c,K−1]·x[c] + bias[c])`,
    /// then the row's state shifts left by one and takes `x`.
    ///
    /// Row `r` uses state slot `slots[r]` (or slot `r` without `slots`). A slot
    /// `>= num_slots` gives a NaN output row and leaves every state untouched;
    /// the slots of one call must be distinct.
    ///
    /// # Shapes
    /// - `x`: `[n, c]` (`T`, one token per row)
    /// - `w`: `[c, k]` (`T`)
    /// - `bias`: `[c]` (`T`) or `None`
    /// - `state`: `[num_slots, c, k − 1]` (`T`, oldest input first), updated
    /// - `slots`: `[n]` (`u32`) or `None`
    /// - `out`: `[n, c]` (`T`)
    ///
    /// # Errors
    /// [`CudaError::Invalid`] if `c == 0`, `k == 0`, `n > num_slots` without
    /// `slots`, or on a length mismatch; driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn conv1d_update<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        w: &impl DevicePtr<T>,
        bias: Option<&CudaView<'_, T>>,
        state: &mut impl DevicePtrMut<T>,
        slots: Option<&CudaView<'_, u32>>,
        out: &mut impl DevicePtrMut<T>,
        n: usize,
        c: usize,
        k: usize,
        num_slots: usize,
    ) -> Result<()> {
        if c == 0 || k == 0 {
            return Err(CudaError::Invalid("conv1d_update: channels and kernel size must be > 0".into()));
        }
        self.check("x", x, prod(&[n, c])?)?;
        self.check("w", w, prod(&[c, k])?)?;
        if let Some(bv) = bias {
            self.check("bias", bv, c)?;
        }
        self.check("state", state, prod(&[num_slots, c, k - 1])?)?;
        match slots {
            Some(sv) => self.check("slots", sv, n)?,
            None if n > num_slots => {
                return Err(CudaError::Invalid(format!("conv1d_update: {n} rows but {num_slots} state slots")))
            }
            None => {}
        }
        self.check("out", out, prod(&[n, c])?)?;
        let total = prod(&[n, c])?;
        if total == 0 {
            return Ok(());
        }
        let (n32, c32, k32, ns32) =
            (u32_of("n", n)?, u32_of("c", c)?, u32_of("k", k)?, u32_of("num_slots", num_slots)?);
        let s = &*self.stream;
        let (pb, _gb) = opt_ptr(bias, s);
        let (pslots, _gsl) = opt_ptr(slots, s);
        // SAFETY: arguments match `conv1d_update_<T>` in gdn.cu (null bias /
        // slots are handled there); lengths checked; the kernel bounds-checks
        // the slots.
        // Kernel: `conv1d_update_<T>(const T* x, const T* w, const T* bias, T* state, const u32* slots, T* out, u32 n,
        // u32 c, u32 k, u32 num_slots)`.
        unsafe {
            launch!(
                self,
                GDN,
                format!("conv1d_update_{}", T::NAME),
                ew_cfg(total),
                [ptr(x), ptr(w), pb, ptr_mut(state), pslots, ptr_mut(out), n32, c32, k32, ns32]
            )
        }
    }

    /// Causal depthwise conv1d + SiLU over `t` tokens of one sequence,
    /// continuing from and updating `state` (`cpu::gdn::causal_conv1d_prefill`):
    /// inputs before the first token come from `state`; afterwards `state`
    /// holds the last `k − 1` inputs, oldest first. `t = 0` is a no-op.
    ///
    /// # Shapes
    /// - `x`: `[t, c]` (`T`)
    /// - `w`: `[c, k]` (`T`)
    /// - `bias`: `[c]` (`T`) or `None`
    /// - `state`: `[c, k − 1]` (`T`), updated
    /// - `out`: `[t, c]` (`T`)
    ///
    /// # Errors
    /// [`CudaError::Invalid`] if `c == 0`, `k == 0` or on a length mismatch;
    /// driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn conv1d_prefill<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        w: &impl DevicePtr<T>,
        bias: Option<&CudaView<'_, T>>,
        state: &mut impl DevicePtrMut<T>,
        out: &mut impl DevicePtrMut<T>,
        t: usize,
        c: usize,
        k: usize,
    ) -> Result<()> {
        if c == 0 || k == 0 {
            return Err(CudaError::Invalid("conv1d_prefill: channels and kernel size must be > 0".into()));
        }
        self.check("x", x, prod(&[t, c])?)?;
        self.check("w", w, prod(&[c, k])?)?;
        if let Some(bv) = bias {
            self.check("bias", bv, c)?;
        }
        self.check("state", state, prod(&[c, k - 1])?)?;
        self.check("out", out, prod(&[t, c])?)?;
        let total = prod(&[t, c])?;
        if total == 0 {
            return Ok(());
        }
        let (t32, c32, k32) = (u32_of("t", t)?, u32_of("c", c)?, u32_of("k", k)?);
        let s = &*self.stream;
        let (px, _gx) = x.device_ptr(s);
        let (pb, _gb) = opt_ptr(bias, s);
        let (pst, _gst) = state.device_ptr_mut(s);
        // SAFETY: arguments match `conv1d_prefill_<T>` in gdn.cu; lengths checked.
        // Kernel: `conv1d_prefill_<T>(const T* x, const T* w, const T* bias, const T* state, T* out, u32 t, u32 c,
        // u32 k)`.
        unsafe {
            launch!(
                self,
                GDN,
                format!("conv1d_prefill_{}", T::NAME),
                ew_cfg(total),
                [px, ptr(w), pb, pst, ptr_mut(out), t32, c32, k32]
            )
        }?;
        if k > 1 {
            // SAFETY: arguments match `conv1d_prefill_state_<T>`; same stream,
            // so it runs after the conv above has read the old state.
            // Kernel: `conv1d_prefill_state_<T>(const T* x, T* state, u32 t, u32 c, u32 k)`.
            unsafe {
                launch!(self, GDN, format!("conv1d_prefill_state_{}", T::NAME), ew_cfg(c), [px, pst, t32, c32, k32])
            }?;
        }
        Ok(())
    }

    /// One recurrent step of the gated delta rule for `n` rows, each one token
    /// of a distinct sequence (the decode path; `cpu::gdn::l2norm_rows` on q
    /// and k followed by `cpu::gdn::recurrent_gated_delta_rule` with `T = 1`).
    ///
    /// In the kernel, per row and value head `j` (key head `j / (hv / hk)`):
    /// q and k are L2-normalised in f32 (`x · rsqrt(Σx² + 1e-6)`), q scaled by
    /// `dk^-0.5`; then with `S = state[slot, j]`:
    /// `S ← exp(g)·S; δ = β·(v − Sᵀk); S ← S + k⊗δ; out = Sᵀq` (f32, `exp(g)`
    /// flushed to 0 below `g = −60`), `out` rounded to `T` once.
    ///
    /// Row `r` uses slot `slots[r]` (or slot `r` without `slots`). A slot
    /// `>= num_slots` gives NaN outputs and leaves every state untouched; the
    /// slots of one call must be distinct.
    ///
    /// # Shapes
    /// - `q`, `k`: `[n, hk, dk]` (`T`, raw conv outputs)
    /// - `v`: `[n, hv, dv]` (`T`)
    /// - `g`, `beta`: `[n, hv]` (`f32`, see [`CudaKernels::gdn_gates`])
    /// - `state`: `[num_slots, hv, dk, dv]` (`f32`, k-major), updated in place
    /// - `slots`: `[n]` (`u32`) or `None`
    /// - `out`: `[n, hv, dv]` (`T`)
    ///
    /// # Errors
    /// [`CudaError::Invalid`] if a dimension is zero, `hv % hk != 0`,
    /// `dk > 256`, `n > num_slots` without `slots`, or on a length mismatch;
    /// driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_recurrent_step<T: CudaFloat>(
        &self,
        q: &impl DevicePtr<T>,
        k: &impl DevicePtr<T>,
        v: &impl DevicePtr<T>,
        g: &impl DevicePtr<f32>,
        beta: &impl DevicePtr<f32>,
        state: &mut impl DevicePtrMut<f32>,
        slots: Option<&CudaView<'_, u32>>,
        out: &mut impl DevicePtrMut<T>,
        n: usize,
        hk: usize,
        hv: usize,
        dk: usize,
        dv: usize,
        num_slots: usize,
    ) -> Result<()> {
        if hk == 0 || hv == 0 || dk == 0 || dv == 0 {
            return Err(CudaError::Invalid("gdn_recurrent_step: hk, hv, dk and dv must be > 0".into()));
        }
        if !hv.is_multiple_of(hk) {
            return Err(CudaError::Invalid(format!("gdn_recurrent_step: hv {hv} is not a multiple of hk {hk}")));
        }
        if dk > GDN_MAX_DK {
            return Err(CudaError::Invalid(format!("gdn_recurrent_step: dk {dk} > {GDN_MAX_DK}")));
        }
        self.check("q", q, prod(&[n, hk, dk])?)?;
        self.check("k", k, prod(&[n, hk, dk])?)?;
        self.check("v", v, prod(&[n, hv, dv])?)?;
        self.check("g", g, prod(&[n, hv])?)?;
        self.check("beta", beta, prod(&[n, hv])?)?;
        self.check("state", state, prod(&[num_slots, hv, dk, dv])?)?;
        match slots {
            Some(sv) => self.check("slots", sv, n)?,
            None if n > num_slots => {
                return Err(CudaError::Invalid(format!("gdn_recurrent_step: {n} rows but {num_slots} state slots")))
            }
            None => {}
        }
        self.check("out", out, prod(&[n, hv, dv])?)?;
        if n == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (u32_of("dv / 32", dv.div_ceil(32))?, u32_of("hv", hv)?, u32_of("n", n)?),
            block_dim: (32, REC_NW, 1),
            shared_mem_bytes: 0,
        };
        if n > 65_535 || hv > 65_535 {
            return Err(CudaError::Invalid(format!("gdn_recurrent_step: n {n} or hv {hv} exceeds 65535")));
        }
        let (hk32, hv32, dk32, dv32, ns32) = (
            u32_of("hk", hk)?,
            u32_of("hv", hv)?,
            u32_of("dk", dk)?,
            u32_of("dv", dv)?,
            u32_of("num_slots", num_slots)?,
        );
        let q_scale = 1.0 / (dk as f32).sqrt();
        let s = &*self.stream;
        let (pslots, _gsl) = opt_ptr(slots, s);
        // SAFETY: arguments match `gdn_recurrent_step_<T>` in gdn.cu; lengths,
        // dk <= 256 and the grid limits checked; the kernel bounds-checks the
        // slots.
        // Kernel: `gdn_recurrent_step_<T>(const T* q, const T* k, const T* v, const float* g, const float* beta,
        // float* state, const u32* slots, T* out, u32 hk, u32 hv, u32 dk, u32 dv, u32 num_slots, float q_scale)`.
        unsafe {
            launch!(
                self,
                GDN,
                format!("gdn_recurrent_step_{}", T::NAME),
                cfg,
                [
                    ptr(q),
                    ptr(k),
                    ptr(v),
                    ptr(g),
                    ptr(beta),
                    ptr_mut(state),
                    pslots,
                    ptr_mut(out),
                    hk32,
                    hv32,
                    dk32,
                    dv32,
                    ns32,
                    q_scale
                ]
            )
        }
    }
}

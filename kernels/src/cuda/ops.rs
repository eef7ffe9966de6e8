//! Launch wrappers of the dense kernels: embedding gather, RMSNorm (standard,
//! zero-centred, gated), partial NeoX RoPE, SwiGLU, sigmoid gate, MoE router,
//! greedy argmax.

use super::{
    ew_cfg, prod, row_threads, rows_cfg, u32_of, CudaError, CudaFloat, CudaKernels, Result, ELEMENTWISE, NORM, ROUTER,
};
use cudarc::driver::{DevicePtr, DevicePtrMut};

/// Largest `k` of [`CudaKernels::moe_router`] (`ROUTER_MAX_K` in router.cu).
pub const ROUTER_MAX_K: usize = 16;

/// Largest expert count of [`CudaKernels::moe_router`] (its dynamic shared
/// memory holds one `f32` per expert, within the default 48 KiB).
pub const ROUTER_MAX_E: usize = 8192;

/// Up to this many experts the router runs one warp a row (`moe_router_warp_f32`, the
/// selections as warp shuffles; router.cu's `ROUTER_WARP_J` × 32); beyond, one block a row.
/// `PORTER_ROUTER_BLOCK` (any value) keeps the block form for A/B.
pub const ROUTER_WARP_E: usize = 512;

/// Whether `PORTER_ROUTER_BLOCK` (any value) keeps the router's block form (read once).
fn router_block_forced() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("PORTER_ROUTER_BLOCK").is_some())
}

/// Whether [`CudaKernels::moe_router`] runs its one-warp form (`moe_router_warp_f32`, router.cu's
/// `router_warp_row`) for `e` experts: up to [`ROUTER_WARP_E`], unless `PORTER_ROUTER_BLOCK`.
pub(super) fn router_warp_form(e: usize) -> bool {
    e <= ROUTER_WARP_E && !router_block_forced()
}

/// Which RMSNorm formula [`CudaKernels::rms_norm`] applies (`porter_core::nn::NormKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RmsNormKind {
    /// Llama style: `round(w · round(x · rstd))` (Qwen3, Qwen3-MoE, Mistral).
    Standard,
    /// Zero-centred: `round(x · rstd · (1 + w))`, `1 + w` in f32 (Qwen3-Next).
    ZeroCentred,
}

impl CudaKernels {
    /// Embedding gather: `out[r] = table[ids[r]]`, as `f32` (the residual stream).
    ///
    /// Ids are not validated on the host (they live on the device): an id
    /// `>= vocab` yields a NaN row, never an out-of-bounds read. Validate ids
    /// before (as `Model::forward` does).
    ///
    /// # Shapes
    /// - `table`: `[vocab, hidden]` (`T`)
    /// - `ids`: `[rows]` (`u32`)
    /// - `out`: `[rows, hidden]` (`f32`)
    ///
    /// # Errors
    /// [`CudaError::Invalid`] on a length mismatch; driver errors of the launch.
    pub fn embedding<T: CudaFloat>(
        &self,
        table: &impl DevicePtr<T>,
        ids: &impl DevicePtr<u32>,
        out: &mut impl DevicePtrMut<f32>,
        vocab: usize,
        hidden: usize,
    ) -> Result<()> {
        let rows = ids.len();
        self.check("table", table, prod(&[vocab, hidden])?)?;
        self.check("ids", ids, rows)?;
        self.check("out", out, prod(&[rows, hidden])?)?;
        if rows == 0 || hidden == 0 {
            return Ok(());
        }
        let (hidden32, vocab32) = (u32_of("hidden", hidden)?, u32_of("vocab", vocab)?);
        let cfg = rows_cfg(rows, row_threads(hidden, 256), 0)?;
        // SAFETY: the arguments match `embedding_<T>` in elementwise.cu; every
        // buffer has the length the kernel indexes (checked above), and the
        // kernel bounds-checks the ids.
        // Kernel: `embedding_<T>(const T* table, const u32* ids, float* out, u32 hidden, u32 vocab)`.
        unsafe {
            launch!(
                self,
                ELEMENTWISE,
                format!("embedding_{}", T::NAME),
                cfg,
                [ptr(table), ptr(ids), ptr_mut(out), hidden32, vocab32]
            )
        }
    }

    /// RMSNorm of each row (`porter_core::nn::RmsNorm`): `rstd = 1/sqrt(mean(x²) + eps)`
    /// in f32, then [`RmsNormKind::Standard`] `round(w · round(x·rstd))` or
    /// [`RmsNormKind::ZeroCentred`] `round(x·rstd·(1 + w))`, rounding to `O`.
    ///
    /// # Shapes
    /// - `x`: `[rows, d]` (`X`: `f32` residual stream, or the model dtype)
    /// - `w`: `[d]` (`O`)
    /// - `out`: `[rows, d]` (`O`)
    ///
    /// # Errors
    /// [`CudaError::Invalid`] on a length mismatch or `d == 0`; driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm<X: CudaFloat, O: CudaFloat>(
        &self,
        x: &impl DevicePtr<X>,
        w: &impl DevicePtr<O>,
        out: &mut impl DevicePtrMut<O>,
        rows: usize,
        d: usize,
        eps: f32,
        kind: RmsNormKind,
    ) -> Result<()> {
        if d == 0 {
            return Err(CudaError::Invalid("rms_norm: d must be > 0".into()));
        }
        self.check("x", x, prod(&[rows, d])?)?;
        self.check("w", w, d)?;
        self.check("out", out, prod(&[rows, d])?)?;
        if rows == 0 {
            return Ok(());
        }
        let d32 = u32_of("d", d)?;
        let zc = super::misc::norm_flags(kind, super::misc::norm_preload());
        let cfg = rows_cfg(rows, row_threads(d, 512), 0)?;
        // SAFETY: arguments match `rms_norm_<X>_<O>` in norm.cu; lengths checked.
        // Kernel: `rms_norm_<X>_<O>(const X* x, const O* w, O* out, u32 d, float eps, int zero_centred)`.
        unsafe {
            launch!(
                self,
                NORM,
                format!("rms_norm_{}_{}", X::NAME, O::NAME),
                cfg,
                [ptr(x), ptr(w), ptr_mut(out), d32, eps, zc]
            )
        }
    }

    /// Gated RMSNorm (`cpu::gdn::gated_rms_norm`, Qwen3-Next `linear_attn.norm`):
    /// `out = round((x · rstd · w) · silu(z))`, `rstd = 1/sqrt(Σx²·(1/d) + eps)`,
    /// plain `w` (no `1 + w`), all f32 before the one rounding to `O`.
    ///
    /// # Shapes
    /// - `x`: `[rows, d]` (`X`; one row per token and value head)
    /// - `z`: `[rows, d]` (`O`, the gate)
    /// - `w`: `[d]` (`O`)
    /// - `out`: `[rows, d]` (`O`)
    ///
    /// # Errors
    /// [`CudaError::Invalid`] on a length mismatch or `d == 0`; driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn gated_rms_norm<X: CudaFloat, O: CudaFloat>(
        &self,
        x: &impl DevicePtr<X>,
        z: &impl DevicePtr<O>,
        w: &impl DevicePtr<O>,
        out: &mut impl DevicePtrMut<O>,
        rows: usize,
        d: usize,
        eps: f32,
    ) -> Result<()> {
        if d == 0 {
            return Err(CudaError::Invalid("gated_rms_norm: d must be > 0".into()));
        }
        let n = prod(&[rows, d])?;
        self.check("x", x, n)?;
        self.check("z", z, n)?;
        self.check("w", w, d)?;
        self.check("out", out, n)?;
        if rows == 0 {
            return Ok(());
        }
        let d32 = u32_of("d", d)?;
        let cfg = rows_cfg(rows, row_threads(d, 512), 0)?;
        // SAFETY: arguments match `gated_rms_norm_<X>_<O>` in norm.cu; lengths checked.
        // Kernel: `gated_rms_norm_<X>_<O>(const X* x, const O* z, const O* w, O* out, u32 d, float eps)`.
        unsafe {
            launch!(
                self,
                NORM,
                format!("gated_rms_norm_{}_{}", X::NAME, O::NAME),
                cfg,
                [ptr(x), ptr(z), ptr(w), ptr_mut(out), d32, eps]
            )
        }
    }

    /// Partial NeoX rotary embedding, in place (`cpu::ops::rope_neox` with the
    /// tables of `porter_core::nn::Rope::tables`): angle `pos · inv_freq[d]` in
    /// f32, cos/sin rounded to `T`, dimension `d < rot_dim/2` paired with
    /// `d + rot_dim/2`, dimensions `rot_dim..head_dim` untouched, output
    /// rounded to `T`.
    ///
    /// # Shapes
    /// - `x`: `[t, heads, head_dim]` (`T`), rotated in place
    /// - `positions`: `[t]` (`u32`, absolute positions)
    /// - `inv_freq`: `[rot_dim / 2]` (`f32`)
    ///
    /// # Errors
    /// [`CudaError::Invalid`] if `rot_dim` is odd, zero or `> head_dim`, or on
    /// a length mismatch; driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_neox<T: CudaFloat>(
        &self,
        x: &mut impl DevicePtrMut<T>,
        positions: &impl DevicePtr<u32>,
        inv_freq: &impl DevicePtr<f32>,
        t: usize,
        heads: usize,
        head_dim: usize,
        rot_dim: usize,
        attn_scale: f32,
    ) -> Result<()> {
        if rot_dim == 0 || !rot_dim.is_multiple_of(2) || rot_dim > head_dim {
            return Err(CudaError::Invalid(format!("rope: rot_dim {rot_dim} invalid for head_dim {head_dim}")));
        }
        let half = rot_dim / 2;
        self.check("x", x, prod(&[t, heads, head_dim])?)?;
        self.check("positions", positions, t)?;
        self.check("inv_freq", inv_freq, half)?;
        let n = prod(&[t, heads, half])?;
        if n == 0 {
            return Ok(());
        }
        let (t32, h32, hd32, half32) =
            (u32_of("t", t)?, u32_of("heads", heads)?, u32_of("head_dim", head_dim)?, u32_of("rot_dim", half)?);
        // SAFETY: arguments match `rope_neox_<T>` in elementwise.cu; lengths checked.
        // Kernel: `rope_neox_<T>(T* x, const u32* positions, const float* inv_freq, u32 t, u32 heads, u32 head_dim,
        // u32 half, float attn_scale)`.
        unsafe {
            launch!(
                self,
                ELEMENTWISE,
                format!("rope_neox_{}", T::NAME),
                ew_cfg(n),
                [ptr_mut(x), ptr(positions), ptr(inv_freq), t32, h32, hd32, half32, attn_scale]
            )
        }
    }

    /// SwiGLU activation with one rounding: `out = round(silu(g) · u)`.
    ///
    /// # Shapes
    /// - `g`, `u`, `out`: `[n]` (`T`; any row-major shape, element-wise)
    ///
    /// # Errors
    /// [`CudaError::Invalid`] on a length mismatch; driver errors.
    pub fn swiglu<T: CudaFloat>(
        &self,
        g: &impl DevicePtr<T>,
        u: &impl DevicePtr<T>,
        out: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        let n = g.len();
        self.check("u", u, n)?;
        self.check("out", out, n)?;
        if n == 0 {
            return Ok(());
        }
        let n64 = n as u64;
        // SAFETY: arguments match `swiglu_<T>` in elementwise.cu; lengths checked.
        // Kernel: `swiglu_<T>(const T* g, const T* u, T* out, u64 n)`.
        unsafe {
            launch!(self, ELEMENTWISE, format!("swiglu_{}", T::NAME), ew_cfg(n), [ptr(g), ptr(u), ptr_mut(out), n64])
        }
    }

    /// SwiGLU activation on a merged `[gate | up]` projection:
    /// `out[r, c] = round(silu(gu[r, c]) · gu[r, inter + c])`.
    ///
    /// # Shapes
    /// - `gu`: `[rows, 2 · inter]` (`T`)
    /// - `out`: `[rows, inter]` (`T`)
    ///
    /// # Errors
    /// [`CudaError::Invalid`] on a length mismatch; driver errors.
    pub fn swiglu_fused<T: CudaFloat>(
        &self,
        gu: &impl DevicePtr<T>,
        out: &mut impl DevicePtrMut<T>,
        rows: usize,
        inter: usize,
    ) -> Result<()> {
        self.check("gu", gu, prod(&[rows, 2, inter])?)?;
        let n = prod(&[rows, inter])?;
        self.check("out", out, n)?;
        if n == 0 {
            return Ok(());
        }
        let (rows64, inter32) = (rows as u64, u32_of("inter", inter)?);
        // SAFETY: arguments match `swiglu_fused_<T>` in elementwise.cu; lengths checked.
        // Kernel: `swiglu_fused_<T>(const T* gu, T* out, u64 rows, u32 inter)`.
        unsafe {
            launch!(
                self,
                ELEMENTWISE,
                format!("swiglu_fused_{}", T::NAME),
                ew_cfg(n),
                [ptr(gu), ptr_mut(out), rows64, inter32]
            )
        }
    }

    /// Sigmoid-gate multiply in place (the attention output gate):
    /// `x = round(x · round(σ(gate)))`, with one gate per element
    /// (`gate_dim == d`) or per row (`gate_dim == 1`).
    ///
    /// # Shapes
    /// - `x`: `[rows, d]` (`T`), gated in place
    /// - `gate`: `[rows, gate_dim]` (`T`)
    ///
    /// # Errors
    /// [`CudaError::Invalid`] if `gate_dim` is neither `d` nor 1, or on a
    /// length mismatch; driver errors.
    pub fn sigmoid_gate_mul<T: CudaFloat>(
        &self,
        x: &mut impl DevicePtrMut<T>,
        gate: &impl DevicePtr<T>,
        rows: usize,
        d: usize,
        gate_dim: usize,
    ) -> Result<()> {
        if gate_dim != d && gate_dim != 1 {
            return Err(CudaError::Invalid(format!("sigmoid_gate_mul: gate_dim {gate_dim} must be {d} or 1")));
        }
        let n = prod(&[rows, d])?;
        self.check("x", x, n)?;
        self.check("gate", gate, prod(&[rows, gate_dim])?)?;
        if n == 0 {
            return Ok(());
        }
        let (rows64, d32, gd32) = (rows as u64, u32_of("d", d)?, u32_of("gate_dim", gate_dim)?);
        // SAFETY: arguments match `sigmoid_gate_mul_<T>` in elementwise.cu; lengths checked.
        // Kernel: `sigmoid_gate_mul_<T>(T* x, const T* gate, u64 rows, u32 d, u32 gd)`.
        unsafe {
            launch!(
                self,
                ELEMENTWISE,
                format!("sigmoid_gate_mul_{}", T::NAME),
                ew_cfg(n),
                [ptr_mut(x), ptr(gate), rows64, d32, gd32]
            )
        }
    }

    /// MoE router (`porter_core::nn::Moe::route`): per row, `p = softmax(logits)`
    /// in f32, the `k` largest `p` in descending order (ties to the lower
    /// expert index), and with `renorm` (`norm_topk_prob`) each weight divided
    /// by the sum of the selected `p`.
    ///
    /// # Shapes
    /// - `logits`: `[rows, e]` (`f32`)
    /// - `idx`: `[rows, k]` (`u32`, expert indices)
    /// - `weights`: `[rows, k]` (`f32`)
    ///
    /// # Errors
    /// [`CudaError::Invalid`] unless `1 ≤ k ≤ min(e, 16)` and `e ≤ 8192`, or on
    /// a length mismatch; driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_router(
        &self,
        logits: &impl DevicePtr<f32>,
        idx: &mut impl DevicePtrMut<u32>,
        weights: &mut impl DevicePtrMut<f32>,
        rows: usize,
        e: usize,
        k: usize,
        renorm: bool,
    ) -> Result<()> {
        self.moe_router_strided(logits, e, idx, weights, rows, e, k, renorm)
    }

    /// As [`CudaKernels::moe_router`] with `logits` rows `stride` apart (the router columns of a
    /// stacked GEMM output).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_router_strided(
        &self,
        logits: &impl DevicePtr<f32>,
        stride: usize,
        idx: &mut impl DevicePtrMut<u32>,
        weights: &mut impl DevicePtrMut<f32>,
        rows: usize,
        e: usize,
        k: usize,
        renorm: bool,
    ) -> Result<()> {
        if k == 0 || k > e || k > ROUTER_MAX_K || e > ROUTER_MAX_E {
            return Err(CudaError::Invalid(format!(
                "moe_router: need 1 <= k <= min(e, {ROUTER_MAX_K}) and e <= {ROUTER_MAX_E}, got k = {k}, e = {e}"
            )));
        }
        if stride < e {
            return Err(CudaError::Invalid(format!("moe_router: stride {stride} < e {e}")));
        }
        self.check("logits", logits, prod(&[rows, stride])?)?;
        self.check("idx", idx, prod(&[rows, k])?)?;
        self.check("weights", weights, prod(&[rows, k])?)?;
        if rows == 0 {
            return Ok(());
        }
        let (e32, k32, rn) = (u32_of("e", e)?, u32_of("k", k)?, i32::from(renorm));
        let st32 = u32_of("stride", stride)?;
        // One warp a row up to ROUTER_WARP_E experts (registers), else one block a row
        // (dynamic shared memory of e floats).
        let (name, cfg) = if router_warp_form(e) {
            ("moe_router_warp_f32", rows_cfg(rows, 32, 0)?)
        } else {
            ("moe_router_f32", rows_cfg(rows, row_threads(e, 256), u32_of("shared memory", e * 4)?)?)
        };
        // SAFETY: arguments match `moe_router_warp_f32` / `moe_router_f32` in router.cu (one
        // list); lengths and k ≤ min(e, 16), e ≤ ROUTER_MAX_E checked, e ≤ ROUTER_WARP_E for
        // the warp form; the block form's dynamic shared memory holds e floats.
        // Kernels: `moe_router_warp_f32` / `moe_router_f32(const float* logits, u32* idx,
        // float* weights, u32 e, u32 k, int renorm, u32 stride)`.
        unsafe { launch!(self, ROUTER, name, cfg, [ptr(logits), ptr_mut(idx), ptr_mut(weights), e32, k32, rn, st32]) }
    }

    /// Greedy argmax of each row (`porter_core::sampling::argmax`): the first
    /// index of the largest value. NaN values never win; an all-NaN row gives 0.
    ///
    /// # Shapes
    /// - `logits`: `[rows, vocab]` (`f32`)
    /// - `out`: `[rows]` (`u32`)
    ///
    /// # Errors
    /// [`CudaError::Invalid`] on a length mismatch or `vocab == 0`; driver errors.
    pub fn argmax(
        &self,
        logits: &impl DevicePtr<f32>,
        out: &mut impl DevicePtrMut<u32>,
        rows: usize,
        vocab: usize,
    ) -> Result<()> {
        if vocab == 0 {
            return Err(CudaError::Invalid("argmax: vocab must be > 0".into()));
        }
        self.check("logits", logits, prod(&[rows, vocab])?)?;
        self.check("out", out, rows)?;
        if rows == 0 {
            return Ok(());
        }
        let v32 = u32_of("vocab", vocab)?;
        let cfg = rows_cfg(rows, row_threads(vocab, 1024), 0)?;
        // SAFETY: arguments match `argmax_f32` in router.cu; lengths checked.
        // Kernel: `argmax_f32(const float* logits, u32* out, u32 v)`.
        unsafe { launch!(self, ROUTER, "argmax_f32", cfg, [ptr(logits), ptr_mut(out), v32]) }
    }
}

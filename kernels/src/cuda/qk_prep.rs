//! Launch wrapper of an attention block's query / key preparation in one kernel
//! (kernels/cuda/qk_prep.cu): the per-head q / k RMSNorms, the partial NeoX RoPE and the split
//! of a gated query projection into q and gate.

use super::{
    opt_ptr, opt_ptr_mut, prod, row_threads, u32_of, CudaError, CudaFloat, CudaKernels, Result, RmsNormKind, NORM,
};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};

/// Environment variable: `apart` runs an attention block's query / key preparation as the
/// separate launches (column copies, norms, RoPEs) instead of [`CudaKernels::qk_prep`], for
/// A/B; `fused` or unset is the default (read once; another value warns once and means the
/// default).
pub const QK_PREP_ENV: &str = "PORTER_QK_PREP";

/// Whether the backend prepares q / k in one launch ([`QK_PREP_ENV`], read once).
pub fn qk_prep_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| super::env::env_fused(QK_PREP_ENV, true))
}

/// Largest head dim of [`CudaKernels::qk_prep`] (one element a thread of a 512-thread block).
pub const QK_PREP_MAX_HD: usize = 512;

/// One head norm of [`CudaKernels::qk_prep`]: its `[hd]` weight, epsilon and formula.
#[derive(Clone, Copy)]
pub struct QkNorm<'a, T> {
    /// `[hd]`.
    pub w: &'a CudaSlice<T>,
    /// The norm's epsilon.
    pub eps: f32,
    /// Standard or zero-centred.
    pub kind: RmsNormKind,
}

/// Where [`CudaKernels::qk_prep`]'s launch reads its inputs: device addresses and row strides
/// (elements) of qg, k and (packed projections) v with its output.
struct QkSrc {
    qg: (u64, u64),
    k: (u64, u64),
    /// `(v, row stride, v_out)`: all 0 for apart projections.
    v: (u64, u64, u64),
}

impl CudaKernels {
    /// The query / key preparation of an attention block in one launch, with the values of
    /// [`CudaKernels::rms_norm`] (per head, when a norm is given) followed by
    /// [`CudaKernels::rope_neox`], bit for bit; with `gate_out`, `qg` holds per head
    /// `[q | gate]` (Qwen3-Next's gated query projection) and the gate is copied out unchanged.
    /// `dims` = `[t, heads, kvh, hd, rot_dim]`; `attn_scale` multiplies cos / sin (YaRN's
    /// attention factor, 1 otherwise).
    ///
    /// # Shapes
    /// - `qg`: `[t, heads, hd · (1 + gated)]`, `k`: `[t, kvh, hd]` (`T`)
    /// - `positions`: `[t]`, `inv_freq`: `[rot_dim / 2]` (`f32`)
    /// - `q_out`: `[t, heads, hd]`, `k_out`: `[t, kvh, hd]`, `gate_out`: `[t, heads, hd]` (`T`)
    ///
    /// # Errors
    /// [`CudaError::Invalid`] on a length mismatch, `hd` of 0 or above [`QK_PREP_MAX_HD`], or a
    /// `rot_dim` that is odd or above `hd`; driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn qk_prep<T: CudaFloat>(
        &self,
        qg: &impl DevicePtr<T>,
        k: &impl DevicePtr<T>,
        q_norm: Option<QkNorm<'_, T>>,
        k_norm: Option<QkNorm<'_, T>>,
        q_out: &mut impl DevicePtrMut<T>,
        k_out: &mut impl DevicePtrMut<T>,
        gate_out: Option<&mut CudaSlice<T>>,
        positions: &impl DevicePtr<u32>,
        inv_freq: &impl DevicePtr<f32>,
        dims: [usize; 5],
        attn_scale: f32,
    ) -> Result<()> {
        let (t, qw, kw) = row_widths(dims, gate_out.is_some())?;
        self.check("qg", qg, prod(&[t, qw])?)?;
        self.check("k", k, prod(&[t, kw])?)?;
        let s = &*self.stream;
        let (qp, _gq) = qg.device_ptr(s);
        let (kp, _gk) = k.device_ptr(s);
        let src = QkSrc { qg: (qp, qw as u64), k: (kp, kw as u64), v: (0, 0, 0) };
        self.qk_prep_launch::<T>(src, (q_norm, k_norm), q_out, k_out, gate_out, positions, inv_freq, dims, attn_scale)
    }

    /// [`CudaKernels::qk_prep`] of a packed projection: each row of `qkv` is `[qg | k | v]`
    /// (one GEMV for the three), and v is copied out beside q, k and the gate (same launch,
    /// same values as [`CudaKernels::qk_prep`] on the columns apart).
    ///
    /// # Shapes
    /// - `qkv`: `[t, heads · hd · (1 + gated) + 2 · kvh · hd]` (`T`)
    /// - `v_out`: `[t, kvh, hd]`; the rest as [`CudaKernels::qk_prep`]
    ///
    /// # Errors
    /// Those of [`CudaKernels::qk_prep`].
    #[allow(clippy::too_many_arguments)]
    pub fn qkv_prep<T: CudaFloat>(
        &self,
        qkv: &impl DevicePtr<T>,
        (q_norm, k_norm): (Option<QkNorm<'_, T>>, Option<QkNorm<'_, T>>),
        q_out: &mut impl DevicePtrMut<T>,
        k_out: &mut impl DevicePtrMut<T>,
        v_out: &mut impl DevicePtrMut<T>,
        gate_out: Option<&mut CudaSlice<T>>,
        positions: &impl DevicePtr<u32>,
        inv_freq: &impl DevicePtr<f32>,
        dims: [usize; 5],
        attn_scale: f32,
    ) -> Result<()> {
        let (t, qw, kw) = row_widths(dims, gate_out.is_some())?;
        let row = qw + 2 * kw;
        self.check("qkv", qkv, prod(&[t, row])?)?;
        self.check("v_out", v_out, prod(&[t, kw])?)?;
        let s = &*self.stream;
        let (p, _g) = qkv.device_ptr(s);
        let (vo, _gv) = v_out.device_ptr_mut(s);
        let es = std::mem::size_of::<T>() as u64;
        let r = row as u64;
        let src = QkSrc { qg: (p, r), k: (p + qw as u64 * es, r), v: (p + (qw + kw) as u64 * es, r, vo) };
        self.qk_prep_launch::<T>(src, (q_norm, k_norm), q_out, k_out, gate_out, positions, inv_freq, dims, attn_scale)
    }

    /// The launch of [`CudaKernels::qk_prep`] / [`CudaKernels::qkv_prep`] once the sources
    /// are checked.
    #[allow(clippy::too_many_arguments)]
    fn qk_prep_launch<T: CudaFloat>(
        &self,
        src: QkSrc,
        (q_norm, k_norm): (Option<QkNorm<'_, T>>, Option<QkNorm<'_, T>>),
        q_out: &mut impl DevicePtrMut<T>,
        k_out: &mut impl DevicePtrMut<T>,
        gate_out: Option<&mut CudaSlice<T>>,
        positions: &impl DevicePtr<u32>,
        inv_freq: &impl DevicePtr<f32>,
        dims: [usize; 5],
        attn_scale: f32,
    ) -> Result<()> {
        let [t, heads, kvh, hd, rot_dim] = dims;
        let gated = gate_out.is_some();
        self.check("q_out", q_out, prod(&[t, heads, hd])?)?;
        self.check("k_out", k_out, prod(&[t, kvh, hd])?)?;
        if let Some(g) = gate_out.as_deref() {
            self.check("gate_out", g, prod(&[t, heads, hd])?)?;
        }
        for n in [&q_norm, &k_norm].into_iter().flatten() {
            self.check("norm weight", n.w, hd)?;
        }
        self.check("positions", positions, t)?;
        self.check("inv_freq", inv_freq, rot_dim / 2)?;
        let v_heads = if src.v.0 != 0 { kvh } else { 0 };
        if t == 0 || heads + kvh + v_heads == 0 {
            return Ok(());
        }
        let bits = |n: &Option<QkNorm<'_, T>>| match n {
            None => 0u32,
            Some(n) => 1 | (u32::from(n.kind == RmsNormKind::ZeroCentred) << 1),
        };
        let flags = bits(&q_norm) | (bits(&k_norm) << 2) | (u32::from(gated) << 4);
        let eps = |n: &Option<QkNorm<'_, T>>| n.as_ref().map_or(0.0, |n| n.eps);
        let (q_eps, k_eps) = (eps(&q_norm), eps(&k_norm));
        let s = &*self.stream;
        let (qw, _gq) = opt_ptr(q_norm.as_ref().map(|n| n.w), s);
        let (kw, _gk) = opt_ptr(k_norm.as_ref().map(|n| n.w), s);
        let (go, _gg) = opt_ptr_mut(gate_out, s);
        let cfg = LaunchConfig {
            grid_dim: (u32_of("heads + 2 kv_heads", heads + kvh + v_heads)?, u32_of("t", t)?, 1),
            // rms_norm's block for a row of hd: its block_sum runs over the same threads.
            block_dim: (row_threads(hd, 512), 1, 1),
            shared_mem_bytes: 0,
        };
        let (h32, kv32, hd32, half32) = (
            u32_of("heads", heads)?,
            u32_of("kv_heads", kvh)?,
            u32_of("head_dim", hd)?,
            u32_of("rot_dim", rot_dim / 2)?,
        );
        let QkSrc { qg: (qp, qs), k: (kp, ks), v: (vp, vs, vo) } = src;
        // SAFETY: arguments match `qk_prep_<T>` in qk_prep.cu; the sources' rows were checked
        // by the callers (`t` rows of their strides, each holding its heads), the outputs
        // above (the norm weights and the gate output are null exactly when their flag bit
        // is clear, and never read or written then; v and v_out null exactly when the grid
        // has no v blocks); hd <= 512 = the kernel's row buffer and block bound.
        // Kernel: `qk_prep_<T>(const T* qg, const T* k, const T* v, const T* qw, const T* kw,
        // T* q_out, T* k_out, T* v_out, T* gate_out, const u32* positions, const float*
        // inv_freq, u64 qs, u64 ks, u64 vs, u32 heads, u32 kvh, u32 hd, u32 half, float
        // attn_scale, float q_eps, float k_eps, u32 flags)`.
        unsafe {
            launch!(
                self,
                NORM,
                format!("qk_prep_{}", T::NAME),
                cfg,
                [
                    qp,
                    kp,
                    vp,
                    qw,
                    kw,
                    ptr_mut(q_out),
                    ptr_mut(k_out),
                    vo,
                    go,
                    ptr(positions),
                    ptr(inv_freq),
                    qs,
                    ks,
                    vs,
                    h32,
                    kv32,
                    hd32,
                    half32,
                    attn_scale,
                    q_eps,
                    k_eps,
                    flags
                ]
            )
        }
    }
}

/// `dims` = `[t, heads, kvh, hd, rot_dim]` of [`CudaKernels::qk_prep`], checked: `(t, the
/// query projection's columns (·2 `gated`), the key projection's columns)`.
fn row_widths(dims: [usize; 5], gated: bool) -> Result<(usize, usize, usize)> {
    let [t, heads, kvh, hd, rot_dim] = dims;
    if hd == 0 || hd > QK_PREP_MAX_HD || rot_dim == 0 || !rot_dim.is_multiple_of(2) || rot_dim > hd {
        return Err(CudaError::Invalid(format!(
            "qk_prep: head_dim {hd} (at most {QK_PREP_MAX_HD}), rot_dim {rot_dim}"
        )));
    }
    Ok((t, prod(&[heads, hd, if gated { 2 } else { 1 }])?, prod(&[kvh, hd])?))
}

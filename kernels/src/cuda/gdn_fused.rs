//! Launch wrapper of kernels/cuda/gdn_fused.cu: a Gated DeltaNet decode / speculative-verify
//! step (conv + window update, gates, delta rule, gated RMSNorm) in one launch.

use super::gdn_seq::{delta_lanes, GDN_CONV_MAXK};
use super::{prod, u32_of, CudaError, CudaFloat, CudaKernels, Result, GDN_SEQ};
use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};

/// Environment variable: `on` runs a decode / verify step's Gated DeltaNet core and its gated
/// RMSNorm through the fused kernel ([`CudaKernels::gdn_fused_seq`]) wherever it takes the head
/// sizes; `off` or unset: the three launches it is made of (conv + gates, delta rule, gated
/// RMSNorm). Off by default because it measured no faster in the model: H200, 24-layer 80B
/// bf16, graphs on, 2026-12-04 (docs/benchmarks.md "Session 15"): alone the fused step takes
/// 6.5–9.7 µs at batch 1 against 13.9 µs for the three launches, but decode is 465.3 tok/s
/// with it (the separate delta rule's 8 lanes a column: 1024-thread blocks) and 484.0 with 4
/// lanes, against 480.2–481.7 without; 3,736 against 3,884 tok/s at batch 64 (the conv of a
/// head's 384 channels by its own block, where the separate conv spreads 8192 channels over
/// the GPU). Under PDL the three short launches already overlap the GEMVs around them. Read
/// on every call; an unknown value warns once and means `off`.
pub const GDN_FUSED_ENV: &str = "PORTER_GDN_FUSED";

/// Whether the backend should run decode / verify steps through the fused kernel
/// ([`GDN_FUSED_ENV`], [`super::env_on_off`]).
pub fn gdn_fused_enabled() -> bool {
    super::env_on_off(GDN_FUSED_ENV, false)
}

/// Most key heads the fused kernel takes: its window counters are `[num_slots, this]` `u32`s a
/// layer, allocated with the layer's cache before the head count is known to it.
pub const GDN_FUSED_MAX_KEY_HEADS: usize = 64;

/// Longest conv window the fused kernel stages in shared memory.
const GF_MAX_WIN: usize = 16;

/// Register rows per lane of the fused kernel that are instantiated (`GDN_FUSED_SEQ_ALL`).
const GF_RS: [usize; 4] = [16, 32, 64, 128];

/// Threads × state rows a lane of a fused block at most (`GF_THREADS_R`, its launch bounds).
const GF_THREAD_ROWS: usize = 16384;

/// Shared memory of a block at most (no opt-in needed on any GPU).
const GF_MAX_SMEM: usize = 48 * 1024;

/// Environment variable: the fused kernel's lanes per state column (1, 2, 4 or 8) instead of
/// the default rule ([`CudaKernels::gdn_fused_lanes`]), for measurements. Read once a process;
/// another value warns once and is ignored.
pub const GDN_FUSED_LANES_ENV: &str = "PORTER_GDN_FUSED_LANES";

/// Padding of a part's staged q / k rows (`DS_PAD` in gdn_seq.cu).
const DS_PAD: usize = 4;

/// The launch shape of [`CudaKernels::gdn_fused_seq`] for these sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdnFusedShape {
    /// Lanes per state column.
    pub p: usize,
    /// State rows per lane (`p · r >= dk`).
    pub r: usize,
    /// Threads of a block (all `dv` columns of a value head).
    pub threads: usize,
    /// Dynamic shared memory, bytes.
    pub smem: usize,
}

/// The sizes of one fused call.
#[derive(Clone, Copy, Debug)]
pub struct GdnFusedDims {
    /// Rows of `x` (tokens of the step).
    pub t: usize,
    pub n_spans: usize,
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
    /// Conv kernel size.
    pub k: usize,
    /// Conv window length (`k − 1` + speculative tokens).
    pub win: usize,
    pub num_slots: usize,
    /// State buffers per slot (`spec + 1`).
    pub nbuf: usize,
    /// First column of z in `x`.
    pub zoff: usize,
    /// The gated RMSNorm's epsilon.
    pub eps: f32,
    /// Lanes per state column (1, 2, 4, 8): [`CudaKernels::gdn_fused_lanes`].
    pub lanes: usize,
}

impl GdnFusedDims {
    /// Conv channels `2·hk·dk + hv·dv`.
    pub fn conv_dim(&self) -> usize {
        2 * self.hk * self.dk + self.hv * self.dv
    }
}

impl CudaKernels {
    /// Lanes per state column of a fused step over `n_spans` spans: the separate delta rule's
    /// (`delta_lanes`, so that the two give the same bits), with `invariant` that of one span
    /// whatever the batch (a row's arithmetic must not depend on the other rows); overridden
    /// by [`GDN_FUSED_LANES_ENV`] (read once a process).
    pub fn gdn_fused_lanes(n_spans: usize, hv: usize, dk: usize, dv: usize, invariant: bool) -> usize {
        // Read once: this runs for every Gated DeltaNet layer of every eager step.
        static FORCED: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
        let forced = *FORCED
            .get_or_init(|| super::env_count(GDN_FUSED_LANES_ENV, |p| matches!(p, 1 | 2 | 4 | 8), "1, 2, 4 or 8"));
        if let Some(p) = forced {
            return p;
        }
        delta_lanes(if invariant { 1 } else { n_spans }, hv, dk, dv)
    }

    /// The launch shape of the fused step with `p` lanes a state column, or `None` when the
    /// kernel does not take these sizes (the caller runs the three launches): `hv` a multiple
    /// of `hk`, `hk` at most [`GDN_FUSED_MAX_KEY_HEADS`], `k` in `1..=8`, `k − 1 <= win <= 16`,
    /// `p` in 1, 2, 4, 8, a whole value head's columns in one block (`32 · ⌈dv / (32 / p)⌉`
    /// threads) with at most 128 state rows a lane and 16384 threads × rows, and 48 KiB of
    /// shared memory.
    pub fn gdn_fused_shape(
        (hk, hv, dk, dv): (usize, usize, usize, usize),
        k: usize,
        win: usize,
        p: usize,
    ) -> Option<GdnFusedShape> {
        if hk == 0
            || hv == 0
            || dk == 0
            || dv == 0
            || !hv.is_multiple_of(hk)
            || hk > GDN_FUSED_MAX_KEY_HEADS
            || k == 0
            || k > GDN_CONV_MAXK
            || win + 1 < k
            || win > GF_MAX_WIN
            || ![1, 2, 4, 8].contains(&p)
        {
            return None;
        }
        let threads = 32 * dv.div_ceil(32 / p);
        let r = GF_RS.into_iter().find(|&r| r * p >= dk)?;
        if threads * r > GF_THREAD_ROWS {
            return None;
        }
        let nch = 2 * dk + dv;
        let floats = 2 * p * (r + DS_PAD) + nch + 4 + dv + nch * (win + GDN_CONV_MAXK);
        let smem = 4 * floats;
        (smem <= GF_MAX_SMEM).then_some(GdnFusedShape { p, r, threads, smem })
    }

    /// A Gated DeltaNet decode / speculative-verify step over spans in one launch:
    /// [`CudaKernels::gdn_conv_gates_seq`] (conv + SiLU continuing the slot's window, its
    /// update, the gates), [`CudaKernels::gdn_delta_seq`] (the delta rule on the slot's state,
    /// optional per-token snapshots) and the gated RMSNorm with SiLU(z) of
    /// [`CudaKernels::gated_norm_z`], with those kernels' bits when the separate delta-rule
    /// launch takes the same lanes per column (`d.lanes`, [`CudaKernels::gdn_fused_lanes`]).
    ///
    /// Span `s` = `spans[s] = (row0, len, slot, lag, src_buf, snapshot)`: the conv's
    /// `(row0, len, slot, lag)` and the delta rule's `(row0, len, slot, src_buf, snapshot)`. A
    /// span either would refuse gives NaN output rows and leaves its window and states alone;
    /// rows outside every span are not written. Spans must use distinct slots.
    ///
    /// # Shapes
    /// - `x`: `[t, x_stride]` (`T`; conv channels at columns `0..conv_dim`, z at
    ///   `zoff..zoff + hv·dv`; without `ba` also `[b | a]` at `ba_col`)
    /// - `ba`: `[t, ba_stride]` (`T`), when the gate inputs are a tensor of their own
    /// - `w`: `[conv_dim, k]`, `a_log`, `dt_bias`: `[hv]` (`f32`)
    /// - `window`: `[num_slots, conv_dim, win]` (`f32`), updated
    /// - `state`: `[num_slots, nbuf, hv, dk, dv]` (`f32`), updated
    /// - `spans`: `[n_spans, 6]` (`u32`)
    /// - `norm_w`: `[dv]` (`T`)
    /// - `out`: `[t, hv, dv]` (`T`)
    /// - `counters`: `[num_slots, GDN_FUSED_MAX_KEY_HEADS]` (`u32`, zero, and zero again after
    ///   the call)
    ///
    /// # Errors
    /// [`CudaError::Invalid`] when [`CudaKernels::gdn_fused_shape`] refuses the sizes, the
    /// strides or columns do not fit, or on a length mismatch; driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_fused_seq<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        x_stride: usize,
        ba: Option<(&impl DevicePtr<T>, usize)>,
        ba_col: usize,
        w: &impl DevicePtr<f32>,
        a_log: &impl DevicePtr<f32>,
        dt_bias: &impl DevicePtr<f32>,
        window: &mut impl DevicePtrMut<f32>,
        state: &mut impl DevicePtrMut<f32>,
        spans: &impl DevicePtr<u32>,
        norm_w: &impl DevicePtr<T>,
        out: &mut impl DevicePtrMut<T>,
        counters: &mut impl DevicePtrMut<u32>,
        d: GdnFusedDims,
    ) -> Result<()> {
        const NAME: &str = "gdn_fused_seq";
        let GdnFusedDims { t, n_spans, hk, hv, dk, dv, k, win, num_slots, nbuf, zoff, eps, lanes } = d;
        let shape = Self::gdn_fused_shape((hk, hv, dk, dv), k, win, lanes)
            .ok_or_else(|| CudaError::Invalid(format!("{NAME}: sizes {d:?} are not taken")))?;
        let c = d.conv_dim();
        let ba_stride = ba.map_or(x_stride, |(_, s)| s);
        if nbuf == 0
            || x_stride < c
            || zoff.checked_add(hv * dv).is_none_or(|e| e > x_stride)
            || ba_col.checked_add(2 * hv).is_none_or(|e| e > ba_stride)
        {
            return Err(CudaError::Invalid(format!(
                "{NAME}: nbuf {nbuf}, x_stride {x_stride} (conv {c}, z at {zoff}) or gate columns {ba_col}+2·{hv} \
                 past {ba_stride}"
            )));
        }
        self.check("x", x, prod(&[t, x_stride])?)?;
        if let Some((b, s)) = ba {
            self.check("ba", b, prod(&[t, s])?)?;
        }
        self.check("w", w, prod(&[c, k])?)?;
        self.check("a_log", a_log, hv)?;
        self.check("dt_bias", dt_bias, hv)?;
        self.check("window", window, prod(&[num_slots, c, win])?)?;
        self.check("state", state, prod(&[num_slots, nbuf, hv, dk, dv])?)?;
        self.check("spans", spans, prod(&[n_spans, 6])?)?;
        self.check("norm_w", norm_w, dv)?;
        self.check("out", out, prod(&[t, hv, dv])?)?;
        self.check("counters", &*counters, prod(&[num_slots, GDN_FUSED_MAX_KEY_HEADS])?)?;
        if n_spans == 0 {
            return Ok(());
        }
        if n_spans > 65_535 {
            return Err(CudaError::Invalid(format!("{NAME}: n_spans {n_spans} exceeds 65535")));
        }
        let cfg = LaunchConfig {
            grid_dim: (u32_of("hv", hv)?, n_spans as u32, 1),
            block_dim: (shape.threads as u32, 1, 1),
            shared_mem_bytes: u32_of("shared memory", shape.smem)?,
        };
        let u = |what: &str, v: usize| u32_of(what, v);
        let (xs32, bas32, bac32, t32, c32, k32, win32) = (
            u("x_stride", x_stride)?,
            u("ba_stride", ba_stride)?,
            u("ba_col", ba_col)?,
            u("t", t)?,
            u("c", c)?,
            u("k", k)?,
            u("win", win)?,
        );
        let (slots32, nbuf32, hk32, hv32, dk32, dv32, zoff32) = (
            u("num_slots", num_slots)?,
            u("nbuf", nbuf)?,
            u("hk", hk)?,
            u("hv", hv)?,
            u("dk", dk)?,
            u("dv", dv)?,
            u("zoff", zoff)?,
        );
        let p32 = shape.p as u32;
        let q_scale = 1.0 / (dk as f32).sqrt();
        let st = &*self.stream;
        let (pba, _gba) = match ba {
            Some((b, _)) => b.device_ptr(st),
            None => x.device_ptr(st),
        };
        // SAFETY: arguments match `gdn_fused_seq_r<R>_<T>` in gdn_fused.cu; every length, the
        // strides and columns checked above; the shape (P · R >= dk, threads · R within the
        // launch bounds, shared memory within 48 KiB) is the kernel's layout; the kernel bounds-checks
        // every span (slot, rows, lag, src_buf, snapshot length) before using it; counters
        // holds num_slots · GDN_FUSED_MAX_KEY_HEADS >= num_slots · hk entries.
        // Kernel: `gdn_fused_seq_r<R>_<T>(const T* x, u32 x_stride, const T* ba, u32 ba_stride,
        // u32 ba_col, const float* cw, float* window, const float* a_log, const float* dt_bias,
        // float* state, const u32* spans, const T* norm_w, T* out, u32* counters, u32 t, u32 c,
        // u32 k, u32 win, u32 num_slots, u32 nbuf, u32 hk, u32 hv, u32 dk, u32 dv, u32 P,
        // float q_scale, u32 zoff, float eps)`.
        unsafe {
            launch!(
                self,
                GDN_SEQ,
                format!("gdn_fused_seq_r{}_{}", shape.r, T::NAME),
                cfg,
                [
                    ptr(x),
                    xs32,
                    pba,
                    bas32,
                    bac32,
                    ptr(w),
                    ptr_mut(window),
                    ptr(a_log),
                    ptr(dt_bias),
                    ptr_mut(state),
                    ptr(spans),
                    ptr(norm_w),
                    ptr_mut(out),
                    ptr_mut(counters),
                    t32,
                    c32,
                    k32,
                    win32,
                    slots32,
                    nbuf32,
                    hk32,
                    hv32,
                    dk32,
                    dv32,
                    p32,
                    q_scale,
                    zoff32,
                    eps
                ]
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 80B heads: the separate delta rule's lanes (8 at one span … 1 from eight), each a
    /// block of all 128 columns; sizes beyond the kernel are refused.
    #[test]
    fn shapes() {
        let h80 = (16, 32, 128, 128);
        let lanes: Vec<usize> = [1, 2, 4, 8, 64].iter().map(|&n| delta_lanes(n, 32, 128, 128)).collect();
        assert_eq!(lanes, [8, 4, 2, 1, 1]);
        let got = |p| CudaKernels::gdn_fused_shape(h80, 4, 3, p).map(|s| (s.r, s.threads));
        assert_eq!(
            [got(8), got(4), got(2), got(1)],
            [Some((16, 1024)), Some((32, 512)), Some((64, 256)), Some((128, 128))]
        );
        let s = CudaKernels::gdn_fused_shape((2, 4, 16, 16), 4, 5, 8).unwrap();
        assert_eq!((s.p, s.r, s.threads), (8, 16, 128));
        // dv = 256 at dk = 128: 2048 threads, or threads × rows past the registers, at every p.
        assert!([1, 2, 4, 8].iter().all(|&p| CudaKernels::gdn_fused_shape((16, 32, 128, 256), 4, 3, p).is_none()));
        assert!(CudaKernels::gdn_fused_shape((16, 32, 64, 256), 4, 3, 4).is_some());
        assert_eq!(CudaKernels::gdn_fused_shape((16, 32, 256, 128), 4, 3, 1), None); // 256 rows a lane
        assert_eq!(CudaKernels::gdn_fused_shape((16, 24, 128, 128), 4, 3, 8), None); // hv % hk
        assert_eq!(CudaKernels::gdn_fused_shape((128, 128, 32, 32), 4, 3, 8), None); // key heads
        assert_eq!(CudaKernels::gdn_fused_shape(h80, 4, 17, 8), None); // window
        assert_eq!(CudaKernels::gdn_fused_shape(h80, 9, 8, 8), None); // conv kernel
        assert_eq!(CudaKernels::gdn_fused_shape(h80, 4, 3, 3), None); // lanes
    }
}

//! Launch wrappers of kernels/cuda/moe.cu: the routed experts of a sparse MoE
//! block (`porter_core::nn::Moe::forward` after the router), grouped by expert
//! on the device: alignment (counting sort of the (row, slot) pairs by
//! expert), gate+up with the fused SwiGLU activation, down, and the weighted
//! combine. No host loop over experts and no host synchronisation. The decode
//! (GEMV) path's launches are in `moe_decode.rs`, shared with the FP8 experts.

use super::moe_decode::{check_dims, DecodeCall, MoeGemv, SharedCall, MOE_PHASES_ALL};
use super::moe_mma::moe_dec_of_process;
use super::moe_prefill::ExpertWeights;
use super::moe_route::RouteCall;
use super::{prod, CudaError, CudaFloat, CudaKernels, Fp8Dev, Result, MOE};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};

/// Largest expert count of [`CudaKernels::moe_experts`] (the alignment kernel
/// keeps one `u32` counter per expert in shared memory).
pub const MOE_MAX_E: usize = 8192;

/// Threads of the alignment kernel (`moe_align`, one block).
pub(super) const ALIGN_THREADS: u32 = 1024;
/// Relative speed per executed row of the tensor-core GEMMs by row fragments
/// per warp (`MI` = 1..4: tiles of 16·MI rows; fewer fragments reuse each
/// weight fragment less). Estimates from the shared-memory traffic per FLOP.
const TC_SPEED: [f64; 4] = [0.45, 0.72, 0.9, 1.0];
/// Largest dynamic shared memory of the decode kernels' in-block grouping
/// (`e + n + 3·min(e, n)` u32); beyond it `moe_align` groups the pairs first.
pub(super) const FUSED_GROUPING_BYTES: usize = 40 * 1024;
/// The decode (GEMV) path is taken up to this many (row, slot) pairs, or up to
/// [`DECODE_PAIRS_PER_EXPERT`] per expert on average, whichever is larger.
const DECODE_MAX_PAIRS: usize = 256;
/// See [`DECODE_MAX_PAIRS`]. Measured on the H200 (2026-12-04, 80B geometry, 512 experts,
/// top-10, decode tok/s with 2 / 4 / 8): FP8 (48 layers) batch 128 2,349 / 3,776 / 3,773,
/// batch 256 3,823 / 3,822 / 5,364; bf16 (24 layers) batch 128 5,291 / 5,811 / 5,812, batch
/// 256 8,802 / 8,811 / 8,856. The grouped tiled GEMMs (the FP8 ones dequantize whole tiles for
/// ~2.5 rows an expert) lose to the decode kernels at every measured size; 5 takes the decode
/// kernels exactly as far as measured (batch 256 of top-10 over 512 experts) — beyond, the
/// measurement is still to be made (FP8 will likely gain from more).
const DECODE_PAIRS_PER_EXPERT: usize = 5;
/// Environment variable: `DECODE_PAIRS_PER_EXPERT` for A/B runs (1–64; read once, another
/// value warns once and is ignored).
pub const MOE_DECODE_PER_EXPERT_ENV: &str = "PORTER_MOE_DECODE_PER_EXPERT";

/// [`DECODE_PAIRS_PER_EXPERT`], or the value of [`MOE_DECODE_PER_EXPERT_ENV`].
fn decode_pairs_per_expert() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        super::env_count(MOE_DECODE_PER_EXPERT_ENV, |n| (1..=64).contains(&n), "a count in 1..=64")
            .unwrap_or(DECODE_PAIRS_PER_EXPERT)
    })
}

/// Rounds `n` up to a multiple of 256 bytes (scratch sub-buffer alignment).
pub(super) fn align256(n: usize) -> usize {
    n.div_ceil(256) * 256
}

/// Whether `ptr` and rows of `row_elems` elements of `T` allow 16-byte loads.
pub(super) fn vec_ok<T>(ptr: u64, row_elems: usize) -> bool {
    ptr.is_multiple_of(16) && (row_elems * std::mem::size_of::<T>()).is_multiple_of(16)
}

/// A routed-experts weight as the launch code checks it: dense `T` (`[e, rows, cols]`) or FP8
/// ([`Fp8Dev`], `[e·rows, cols]`).
pub(super) trait ExpertWeight<T> {
    /// Checks the weight of `e` experts of `rows × cols` (`what` names it).
    fn check_experts(&self, k: &CudaKernels, what: &str, e: usize, rows: usize, cols: usize) -> Result<()>;
}

/// A dense routed-experts weight (`[e, rows, cols]` of `T`) as an [`ExpertWeight`].
pub(super) struct Dense<'a, D>(pub &'a D);

impl<T: CudaFloat, D: DevicePtr<T>> ExpertWeight<T> for Dense<'_, D> {
    fn check_experts(&self, k: &CudaKernels, what: &str, e: usize, rows: usize, cols: usize) -> Result<()> {
        k.check(what, self.0, prod(&[e, rows, cols])?)
    }
}

impl<T: CudaFloat> ExpertWeight<T> for Fp8Dev<'_> {
    fn check_experts(&self, k: &CudaKernels, what: &str, e: usize, rows: usize, cols: usize) -> Result<()> {
        self.check(k, what, prod(&[e, rows])?, cols)
    }
}

/// Device addresses of a routed-experts call's activations `[x, idx, w, out]` (the guards
/// live to the launch).
pub(super) fn io_ptrs<'a, T>(
    s: &'a CudaStream,
    x: &'a impl DevicePtr<T>,
    idx: &'a impl DevicePtr<u32>,
    w: &'a impl DevicePtr<f32>,
    out: &'a mut impl DevicePtrMut<f32>,
) -> ([u64; 4], [SyncOnDrop<'a>; 4]) {
    let ((px, gx), (pi, gi), (pw, gw)) = (x.device_ptr(s), idx.device_ptr(s), w.device_ptr(s));
    let (po, go) = out.device_ptr_mut(s);
    ([px, pi, pw, po], [gx, gi, gw, go])
}

/// [`CudaKernels::moe_experts`]'s decode (GEMV) path with dense experts, `which` form
/// ([`MoeGemv`]), stopping after `phases` (see [`CudaKernels::moe_decode_with`]); `io` the device
/// addresses of x, idx, w and out ([`io_ptrs`], checked by the caller), `route` the fused
/// router (which writes idx and w).
#[allow(clippy::too_many_arguments)]
pub(super) fn decode_dense<T: CudaFloat>(
    k: &CudaKernels,
    io: [u64; 4],
    gate: &impl DevicePtr<T>,
    up: &impl DevicePtr<T>,
    down: &impl DevicePtr<T>,
    dims: [usize; 5],
    which: MoeGemv,
    phases: u32,
    shared: Option<&MoeSharedDev<'_, &CudaSlice<T>>>,
    route: Option<RouteCall>,
) -> Result<()> {
    let [_, _, _, hidden, inter] = dims;
    let s = k.stream();
    let ((pg, _gg), (pu, _gu), (pd, _gd)) = (gate.device_ptr(s), up.device_ptr(s), down.device_ptr(s));
    let [px, pi, pw, po] = io;
    // The shared expert's addresses (0 without one; the guards live to the launch).
    let none = || (0, SyncOnDrop::Sync(None));
    let ((pgl, _ggl), (psd, _gsd)) = match shared {
        Some(m) => (m.gate.device_ptr(s), m.down.device_ptr(s)),
        None => (none(), none()),
    };
    let ((pgu, _ggu), (psw, _gsw)) = match shared.map(|m| m.gu) {
        Some(SharedGu::Cols { gu, .. }) => (gu.device_ptr(s), none()),
        Some(SharedGu::Weights(w)) => (none(), w.device_ptr(s)),
        None => (none(), none()),
    };
    let (sdown, sgu) = ([psd], [psw]);
    let gu_w = shared.and_then(|m| match m.gu {
        SharedGu::Weights(_) => Some((&sgu[..], vec_ok::<T>(psw, hidden))),
        SharedGu::Cols { .. } => None,
    });
    let call = DecodeCall {
        src: &MOE,
        kind: "",
        tname: T::NAME,
        esize: std::mem::size_of::<T>(),
        x: px,
        idx: pi,
        w: pw,
        out: po,
        gate: &[pg],
        up: &[pu],
        down: &[pd],
        w_vec_gu: vec_ok::<T>(pg, hidden) && vec_ok::<T>(pu, hidden),
        w_vec_d: vec_ok::<T>(pd, inter),
        dims,
        shared: shared.map(|m| m.call(pgu, gu_w, pgl, &sdown, vec_ok::<T>(psd, m.inter))),
        route,
    };
    k.moe_decode_run(&call, which, phases)
}

/// The shared expert of a MoE block, fused into the direct decode form by
/// [`CudaKernels::moe_experts_shared`] (dense, `W` = `&CudaSlice<T>`) and
/// [`CudaKernels::moe_experts_fp8_shared`] (FP8, `W` = [`super::Fp8Dev`]): its gate / up
/// products ([`SharedGu`]: f32 columns of a GEMM output, or its `[gate; up]` weight for the
/// gate+up launch to multiply itself) and its gate logit (an f32 column of a GEMM output,
/// `porter_core::nn::Moe`'s input projection).
///
/// # Shapes
/// - `gu`: see [`SharedGu`]
/// - `gate`: f32 `[t, gate_stride]`: the shared expert gate logit at column `gate_col`
/// - `down`: `[hidden, inter]`
#[derive(Clone, Copy, Debug)]
pub struct MoeSharedDev<'a, W> {
    /// The shared gate / up products, or their weight.
    pub gu: SharedGu<'a, W>,
    /// The shared expert gate logits (f32).
    pub gate: &'a CudaSlice<f32>,
    /// Row stride of `gate`.
    pub gate_stride: usize,
    /// Column of the gate logit in `gate`.
    pub gate_col: usize,
    /// The down projection `[hidden, inter]`.
    pub down: W,
    /// Intermediate size `I_s` (may differ from the routed experts').
    pub inter: usize,
}

/// Where the fused shared expert's gate / up products come from.
///
/// # Shapes
/// - `Cols`: `gu` f32 `[t, stride]`: the shared gate at columns `col0 .. col0 + inter`, up at
///   `col0 + inter .. col0 + 2·inter` (the model's packed input projection, or a product of
///   their own)
/// - `Weights`: the `[gate; up]` weight `[2·inter, hidden]`, of the routed weights' kind: the
///   gate+up launch computes `g`, `u` from `x` itself (its dot products' summation order, so
///   `h_s` may differ from the `Cols` form of a GEMM's products by a rounding of T)
#[derive(Clone, Copy, Debug)]
pub enum SharedGu<'a, W> {
    /// f32 columns of a GEMM output.
    Cols {
        /// The products `[t, stride]`.
        gu: &'a CudaSlice<f32>,
        /// Row stride of `gu`.
        stride: usize,
        /// First column of the shared gate in `gu`.
        col0: usize,
    },
    /// The `[gate; up]` weight `[2·inter, hidden]`.
    Weights(W),
}

impl<W> MoeSharedDev<'_, W> {
    /// The call's [`SharedCall`]: `gu` the device address of the f32 columns (0 with
    /// [`SharedGu::Weights`]), `gu_w` the `[gate; up]` weight's kernel arguments with
    /// `gu_vec` whether its rows allow 16-byte loads (with [`SharedGu::Weights`]), `gate` the
    /// logits' address, `down` the down weight's kernel arguments, `w_vec` whether its rows
    /// allow 16-byte loads.
    pub(super) fn call<'a>(
        &self,
        gu: u64,
        gu_w: Option<(&'a [u64], bool)>,
        gate: u64,
        down: &'a [u64],
        w_vec: bool,
    ) -> SharedCall<'a> {
        let (gu_stride, gu_col0) = match self.gu {
            SharedGu::Cols { stride, col0, .. } => (stride, col0),
            SharedGu::Weights(_) => (0, 0),
        };
        SharedCall {
            gu,
            gu_stride,
            gu_col0,
            gu_w,
            glog: gate,
            g_stride: self.gate_stride,
            g_col: self.gate_col,
            down,
            w_vec,
            inter: self.inter,
        }
    }

    /// Checks the f32 inputs for `t` rows (the weights are checked by the caller).
    pub(super) fn check_inputs(&self, k: &CudaKernels, t: usize) -> Result<()> {
        let cols_ok = match self.gu {
            SharedGu::Cols { stride, col0, .. } => col0.saturating_add(self.inter.saturating_mul(2)) <= stride,
            SharedGu::Weights(_) => true,
        };
        if self.inter == 0 || !cols_ok || self.gate_col >= self.gate_stride {
            let cols = match self.gu {
                SharedGu::Cols { stride, col0, .. } => format!("gu_col0 = {col0}, gu_stride = {stride}"),
                SharedGu::Weights(_) => "gate / up from weights".to_string(),
            };
            return Err(CudaError::Invalid(format!(
                "moe shared expert: need inter > 0, gu_col0 + 2·inter <= gu_stride, gate_col < gate_stride; got \
                 inter = {}, {cols}, gate_col = {}, gate_stride = {}",
                self.inter, self.gate_col, self.gate_stride
            )));
        }
        if let SharedGu::Cols { gu, stride, .. } = self.gu {
            k.check("shared gu", gu, prod(&[t, stride])?)?;
        }
        k.check("shared gate", self.gate, prod(&[t, self.gate_stride])?)
    }
}

impl<'a, T> MoeSharedDev<'a, &'a CudaSlice<T>> {
    /// Checks the dense weights for `hidden` columns of the routed experts.
    pub(super) fn check_dense(&self, k: &CudaKernels, hidden: usize) -> Result<()> {
        k.check("shared down", self.down, prod(&[hidden, self.inter])?)?;
        if let SharedGu::Weights(w) = self.gu {
            k.check("shared gate / up", w, prod(&[2, self.inter, hidden])?)?;
        }
        Ok(())
    }
}

impl CudaKernels {
    /// Whether [`CudaKernels::moe_experts`] takes the decode (GEMV) path for
    /// `t` rows with `k` experts each out of `e` (else the tiled GEMM path).
    pub fn moe_decode_path(t: usize, k: usize, e: usize) -> bool {
        t.saturating_mul(k) <= DECODE_MAX_PAIRS.max(decode_pairs_per_expert().saturating_mul(e))
    }

    /// Routed experts of a sparse MoE block (`porter_core::nn::Moe::forward`
    /// without the router and the shared expert). For every row `r` and slot
    /// `j`, with expert `x = idx[r, j]`:
    /// `g = x_r·gate_xᵀ`, `u = x_r·up_xᵀ` (f32 accumulation),
    /// `h = round(silu(round(g)) · round(u))`, `o = h·down_xᵀ` (f32), and
    /// `out[r] = Σ_j round(o_j) · w[r, j]` in f32 (`round` to `T`; the sum runs
    /// over slots in order, not over ascending experts as on the CPU).
    ///
    /// The pairs are grouped by expert on the device (counting sort); then
    /// either GEMV kernels that stream each routed expert's weights once
    /// (decode, [`CudaKernels::moe_decode_path`]; with [`super::MOE_DEC_ENV`] `=mma`
    /// beyond 40 pairs, the swap-AB tensor-core form [`CudaKernels::moe_experts_mma`]
    /// instead) or tiled GEMMs over row
    /// tiles of each expert's rows (tensor cores for `bf16` / `f16` on sm_80+,
    /// tiles of 16–64 rows, [`CudaKernels::moe_prefill_tile_frags`]; exact f32
    /// CUDA-core math, 64-row tiles, for `f32`). Scratch is allocated on the stream.
    ///
    /// Expert ids are trusted (they come from [`CudaKernels::moe_router`]),
    /// but an id `>= e` is skipped (contributes nothing), never read out of
    /// bounds.
    ///
    /// # Shapes
    /// - `x`: `[t, hidden]` (`T`)
    /// - `idx`: `[t, k]` (`u32`), `w`: `[t, k]` (`f32`) from `moe_router`
    /// - `gate`, `up`: `[e, inter, hidden]` (`T`); `down`: `[e, hidden, inter]` (`T`)
    /// - `out`: `[t, hidden]` (`f32`), overwritten
    ///
    /// # Errors
    /// [`CudaError::Invalid`] unless `1 ≤ k ≤ e ≤ 8192`, `hidden, inter > 0`,
    /// on a length mismatch or a size beyond the kernels' `u32` indexing;
    /// driver errors (allocation, launch).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_experts<T: CudaFloat>(
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
    ) -> Result<()> {
        self.moe_experts_in(x, idx, w, gate, up, down, out, [t, k, e, hidden, inter], false)
    }

    /// [`CudaKernels::moe_experts`] whose every row's result is independent of
    /// the other rows in the call (batch-invariant): always the decode GEMV
    /// path, which computes each (row, expert) pair by one warp in a fixed
    /// order whatever the row count (the tensor-core prefill tiles and the
    /// tensor-core decode form of [`super::MOE_DEC_ENV`] round and accumulate
    /// differently). Slower for long prefills; for deterministic
    /// serving.
    ///
    /// # Shapes
    /// As [`CudaKernels::moe_experts`].
    ///
    /// # Errors
    /// As [`CudaKernels::moe_experts`].
    #[allow(clippy::too_many_arguments)]
    pub fn moe_experts_invariant<T: CudaFloat>(
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
    ) -> Result<()> {
        self.moe_experts_in(x, idx, w, gate, up, down, out, [t, k, e, hidden, inter], true)
    }

    /// Checked body of [`CudaKernels::moe_experts`] (`dims` = t, k, e, hidden,
    /// inter); `invariant` pins the decode path.
    #[allow(clippy::too_many_arguments)]
    fn moe_experts_in<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        gate: &impl DevicePtr<T>,
        up: &impl DevicePtr<T>,
        down: &impl DevicePtr<T>,
        out: &mut impl DevicePtrMut<f32>,
        dims: [usize; 5],
        invariant: bool,
    ) -> Result<()> {
        let [t, k, e, _, _] = dims;
        self.check_experts(x, idx, w, gate, up, down, out, dims)?;
        if t == 0 {
            return Ok(());
        }
        if !invariant
            && Self::moe_decode_path(t, k, e)
            && moe_dec_of_process().mma_at(t.saturating_mul(k))
            && self.moe_mma_fits::<T>(dims[3], dims[4])
        {
            self.moe_experts_mma(x, idx, w, gate, up, down, out, dims)
        } else if invariant || Self::moe_decode_path(t, k, e) {
            let (io, _gio) = io_ptrs(self.stream(), x, idx, w, out);
            decode_dense::<T>(self, io, gate, up, down, dims, MoeGemv::from_env(), MOE_PHASES_ALL, None, None)
        } else {
            let s = &self.stream;
            let ((pg, _gg), (pu, _gu), (pd, _gd)) = (gate.device_ptr(s), up.device_ptr(s), down.device_ptr(s));
            let weights = ExpertWeights::Dense { gate: pg, up: pu, down: pd };
            self.moe_prefill::<T>(x, idx, w, weights, out, dims, &mut |_| Ok(()))
        }
    }

    /// [`CudaKernels::moe_experts`]'s decode (GEMV) path whatever `t` is, in the form `which`
    /// ([`MoeGemv`]; both give the same bits), stopping after `phases`: 0 the grouping, 1
    /// gate+up, 2 down (v1: down and combine), [`MOE_PHASES_ALL`] the whole call (`out`
    /// is written only then). For timing each stage and A/B runs.
    ///
    /// # Shapes
    /// As [`CudaKernels::moe_experts`] (`dims` = t, k, e, hidden, inter).
    ///
    /// # Errors
    /// As [`CudaKernels::moe_experts`].
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub fn moe_decode_with<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        gate: &impl DevicePtr<T>,
        up: &impl DevicePtr<T>,
        down: &impl DevicePtr<T>,
        out: &mut impl DevicePtrMut<f32>,
        dims: [usize; 5],
        which: MoeGemv,
        phases: u32,
    ) -> Result<()> {
        self.check_experts(x, idx, w, gate, up, down, out, dims)?;
        if dims[0] == 0 {
            return Ok(());
        }
        let (io, _gio) = io_ptrs(self.stream(), x, idx, w, out);
        decode_dense::<T>(self, io, gate, up, down, dims, which, phases, None, None)
    }

    /// [`CudaKernels::moe_experts`] plus the shared expert `shared`, fused into the direct
    /// decode form ([`MoeGemv::Direct`], whatever `t`; [`CudaKernels::moe_shared_fuses`] says
    /// when the unfused sequence would run it too): the gate+up launch also writes
    /// `h_s = round(silu(round(g_s)) · round(u_s))` from `shared.gu`'s f32 columns, and the
    /// down launch adds `σ(round(g)) · round(h_s · down_sᵀ)` (`g` the gate logit) to each row's
    /// routed sum: the formulas and order of `swiglu_f32in`, the shared down GEMV and
    /// `shared_expert_add_f32g`, but for the summation order of the shared down dot product
    /// (the routed pairs' warp order instead of the GEMV's), so the result is within a
    /// rounding of `T` of the unfused one per element of the shared expert's output.
    /// Batch-invariant, as the direct form.
    ///
    /// # Shapes
    /// As [`CudaKernels::moe_experts`] (`dims` = t, k, e, hidden, inter); `shared` as
    /// [`MoeSharedDev`] with `down` `[hidden, shared.inter]` (`T`).
    ///
    /// # Errors
    /// As [`CudaKernels::moe_experts`], and [`CudaError::Invalid`] for a shared expert whose
    /// columns do not fit its buffers.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_experts_shared<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        gate: &impl DevicePtr<T>,
        up: &impl DevicePtr<T>,
        down: &impl DevicePtr<T>,
        shared: &MoeSharedDev<'_, &CudaSlice<T>>,
        out: &mut impl DevicePtrMut<f32>,
        dims: [usize; 5],
    ) -> Result<()> {
        let [t, _, _, hidden, _] = dims;
        self.check_experts(x, idx, w, gate, up, down, out, dims)?;
        shared.check_inputs(self, t)?;
        shared.check_dense(self, hidden)?;
        if t == 0 {
            return Ok(());
        }
        let (io, _gio) = io_ptrs(self.stream(), x, idx, w, out);
        decode_dense::<T>(self, io, gate, up, down, dims, MoeGemv::from_env(), MOE_PHASES_ALL, Some(shared), None)
    }

    /// The argument checks of [`CudaKernels::moe_experts`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn check_experts<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        gate: &impl DevicePtr<T>,
        up: &impl DevicePtr<T>,
        down: &impl DevicePtr<T>,
        out: &mut impl DevicePtrMut<f32>,
        dims: [usize; 5],
    ) -> Result<()> {
        check_dims("moe_experts", dims)?;
        self.check_routed(x, idx, w, &Dense(gate), &Dense(up), &Dense(down), out, dims)
    }

    /// The buffer checks of a routed-experts call (dense or FP8 weights; `dims` = t, k, e,
    /// hidden, inter, checked by the caller): `x`, `idx`, `w`, the weights, `out`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn check_routed<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        gate: &impl ExpertWeight<T>,
        up: &impl ExpertWeight<T>,
        down: &impl ExpertWeight<T>,
        out: &impl DevicePtrMut<f32>,
        dims: [usize; 5],
    ) -> Result<()> {
        let [t, k, e, hidden, inter] = dims;
        self.check("x", x, prod(&[t, hidden])?)?;
        self.check("idx", idx, prod(&[t, k])?)?;
        self.check("w", w, prod(&[t, k])?)?;
        gate.check_experts(self, "gate", e, inter, hidden)?;
        up.check_experts(self, "up", e, inter, hidden)?;
        down.check_experts(self, "down", e, hidden, inter)?;
        self.check("out", out, prod(&[t, hidden])?)
    }

    /// Row fragments per warp (`MI`; tiles of 16·MI rows) of the tensor-core
    /// prefill GEMMs for `t` rows with `k` experts each out of `e`: the one with
    /// the least expected work, Σ over experts of the rows padded to whole tiles
    /// (per-expert counts taken as Poisson of mean t·k/e), over its relative
    /// speed `TC_SPEED`. Any choice is correct; this only sets the padding.
    pub fn moe_prefill_tile_frags(t: usize, k: usize, e: usize) -> usize {
        let lambda = t as f64 * k as f64 / e.max(1) as f64;
        if lambda <= 0.0 || lambda > 2048.0 {
            return 4;
        }
        let hi = (lambda + 12.0 * lambda.sqrt() + 32.0).ceil() as usize;
        let ln_l = lambda.ln();
        let mut best = (f64::INFINITY, 4);
        for mi in 1..=4usize {
            let bm = 16 * mi;
            // E[ceil(c / bm) · bm], c ~ Poisson(lambda), pmf in log space.
            let (mut lp, mut rows) = (-lambda, 0.0);
            for c in 0..=hi {
                if c > 0 {
                    lp += ln_l - (c as f64).ln();
                }
                rows += lp.exp() * (c.div_ceil(bm) * bm) as f64;
            }
            let cost = rows / TC_SPEED[mi - 1];
            if cost < best.0 {
                best = (cost, mi);
            }
        }
        best.1
    }
}

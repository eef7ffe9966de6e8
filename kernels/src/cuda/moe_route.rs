//! The MoE router inside the routed experts' direct decode form ([`MoeRouter::Fused`],
//! [`MOE_ROUTER_ENV`]): the direct gate+up kernel (kernels/cuda/moe_direct.cu, `DirRoute`)
//! selects the top-k experts of the rows its items need from the f32 router logits, with the
//! separate router's one-warp code (kernels/cuda/router_sel.cu, `router_warp_row`, which
//! `moe_router_warp_f32` runs too), so the expert ids and weights are that router's, bit for
//! bit, and the router launch goes. Why: at batch-1 decode of Qwen3-Next-80B (512 experts,
//! top-10) the router is a one-warp launch of 6.3 µs on the H200, pure latency between the MoE
//! input GEMV and the gate+up kernel, in every MoE layer.
//!
//! Opt-in (`PORTER_MOE_ROUTER=fused`): measured slower (H200, 2026-12-04, docs/benchmarks.md
//! "Session 15"): 24-layer 80B bf16 decode at batch 1 453.1 / 454.1 tok/s fused against 482.2 /
//! 481.0 apart, FP8 (48 layers) 241.5 against 257.7 at batch 1 and 463.1 against 525.7 at
//! batch 4; equal from batch 8. Every gate+up block runs the selection before its first
//! routed weight load, which delays the whole weight stream by the selection's latency, where
//! the separate router's launch overlaps the kernels around it under PDL.
//!
//! Wherever the direct form does not run, or the warp router does not take the shape (e > 512,
//! k > [`ROUTER_MAX_K`], or `PORTER_ROUTER_BLOCK` set), or
//! [`MoeRouter::Apart`] is asked for, the separate router ([`CudaKernels::moe_router_strided`])
//! runs first, as before.

use super::fp8::Fp8MoeDec;
use super::moe_decode::MoeGemv;
use super::moe_mma::moe_dec_of_process;
use super::ops::{router_warp_form, ROUTER_MAX_K};
use super::{prod, u32_of, CudaError, CudaFloat, CudaKernels, Fp8Dev, MoeSharedDev, Result, MOE_PHASES_ALL};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

/// Environment variable choosing where the routed experts' top-k selection runs when the
/// direct decode form runs: `fused` (inside its gate+up kernel) or `apart` (the default: the
/// separate router launch first). Read once a process; another value warns once on stderr and
/// means `apart`.
pub const MOE_ROUTER_ENV: &str = "PORTER_MOE_ROUTER";

/// Where a routed-experts call's router runs ([`MOE_ROUTER_ENV`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeRouter {
    /// Inside the direct decode form's gate+up kernel where that form runs and the one-warp
    /// router takes the shape; the separate router launch elsewhere.
    Fused,
    /// The separate router launch ([`CudaKernels::moe_router_strided`]) always.
    Apart,
}

impl MoeRouter {
    /// The choice of this process ([`MOE_ROUTER_ENV`], read once).
    pub fn of_process() -> Self {
        static ONCE: std::sync::OnceLock<MoeRouter> = std::sync::OnceLock::new();
        *ONCE.get_or_init(|| {
            Self::from_value(std::env::var_os(MOE_ROUTER_ENV).as_deref()).unwrap_or_else(|bad| {
                eprintln!("warning: {MOE_ROUTER_ENV}={bad:?} is not one of fused, apart; using apart");
                MoeRouter::Apart
            })
        })
    }

    /// [`MoeRouter::of_process`] for a given value of the variable (`Err`: the value, unknown).
    fn from_value(v: Option<&std::ffi::OsStr>) -> std::result::Result<Self, String> {
        let Some(v) = v else { return Ok(MoeRouter::Apart) };
        match v.to_string_lossy().trim().to_ascii_lowercase().as_str() {
            "fused" => Ok(MoeRouter::Fused),
            "" | "apart" => Ok(MoeRouter::Apart),
            _ => Err(v.to_string_lossy().into_owned()),
        }
    }

    /// Whether this choice routes a row of `e` experts, top-`k`, inside the gate+up kernel (when
    /// the direct form runs): [`MoeRouter::Fused`], and the shape the separate router runs in its
    /// one-warp form, whose code the fused kernel shares.
    fn takes(self, e: usize, k: usize) -> bool {
        self == MoeRouter::Fused && k >= 1 && k <= e && k <= ROUTER_MAX_K && router_warp_form(e)
    }

    /// Whether a routed call ([`CudaKernels::moe_experts_routed`],
    /// [`CudaKernels::moe_experts_fp8_routed`]) of `dims` (t, k, e, hidden, inter) in the form
    /// `which`, with FP8 experts (`fp8`) or dense, the shared expert fused in (`shared`) or not,
    /// routes inside its gate+up kernel with this choice (else the separate router runs first).
    pub fn routes_inside(self, which: MoeGemv, dims: [usize; 5], fp8: bool, shared: bool) -> bool {
        let [t, k, e, _, _] = dims;
        self.takes(e, k) && runs_direct(which, t.saturating_mul(k), fp8, shared)
    }
}

/// Whether the decode call of `n` pairs in the form `which` (FP8 `fp8`, with a fused shared
/// expert `shared`) runs the direct form (`CudaKernels::moe_decode_run`'s rule: the down
/// kernel's choice does not change it).
pub(super) fn runs_direct(which: MoeGemv, n: usize, fp8: bool, shared: bool) -> bool {
    shared || which.resolve(n, fp8).is_direct()
}

/// The router inputs of a routed-experts call that routes itself
/// ([`CudaKernels::moe_experts_routed`], [`CudaKernels::moe_experts_fp8_routed`]).
///
/// # Shapes
/// - `logits`: f32 `[t, stride]`, the router logits its first `e` columns (`stride ≥ e`: the
///   MoE input projection's packed output, or the router's own)
#[derive(Clone, Copy, Debug)]
pub struct MoeRouteDev<'a> {
    /// The router logits (f32).
    pub logits: &'a CudaSlice<f32>,
    /// Row stride of `logits`.
    pub stride: usize,
    /// Divide the selected weights by their sum (`norm_topk_prob`).
    pub renorm: bool,
    /// Where the selection runs.
    pub router: MoeRouter,
}

/// The fused router's kernel arguments (moe_direct.cu's `DirRoute` but the weights' output,
/// the call's `w`).
#[derive(Clone, Copy, Debug)]
pub(super) struct RouteCall {
    /// Device address of the logits.
    pub logits: u64,
    /// Their row stride.
    pub stride: u32,
    /// Bit 0: route in the gate+up kernel; bit 1: renorm.
    pub flags: i32,
}

impl CudaKernels {
    /// Whether `porter_core`'s MoE block hands its routing to the routed-experts call
    /// ([`CudaKernels::moe_experts_routed`], [`CudaKernels::moe_experts_fp8_routed`]) for `t` rows
    /// of `k` experts out of `e`, FP8 (`fp8`) or dense, with the shared expert fused in
    /// (`shared`) or not, batch-invariant (`invariant`) or not: where the process's
    /// [`MoeRouter`] takes the shape and the call would run the direct decode form (the fused
    /// shared expert's; else the decode GEMVs, not the tensor-core decode form
    /// ([`super::MOE_DEC_ENV`], [`super::FP8_MOE_DEC_ENV`]), in the direct form of
    /// [`MoeGemv::from_env`]). The routed calls are right whatever this says (they run the
    /// separate router where they cannot fuse it); this keeps the other paths as they were.
    pub fn moe_router_fuses(t: usize, k: usize, e: usize, fp8: bool, shared: bool, invariant: bool) -> bool {
        if !MoeRouter::of_process().takes(e, k) {
            return false;
        }
        if shared {
            return true;
        }
        let n = t.saturating_mul(k);
        let mma = if fp8 { Fp8MoeDec::of_process().mma_at(n) } else { moe_dec_of_process().mma_at(n) };
        let gemv = invariant || (Self::moe_decode_path(t, k, e) && !mma);
        gemv && runs_direct(MoeGemv::from_env(), n, fp8, false)
    }

    /// The routed experts' decode GEMVs in the form `which` ([`CudaKernels::moe_decode_with`];
    /// with `shared`, the shared expert fused into the direct form as
    /// [`CudaKernels::moe_experts_shared`]) with their router: the top-k of `route.logits`
    /// (`CudaKernels::moe_router`'s selection) into `idx` / `w`, computed inside the direct
    /// form's gate+up kernel where `route.router` is [`MoeRouter::Fused`], the direct form runs
    /// and the one-warp router takes `e` and `k`, else by the separate router launch first. Both
    /// give the same `idx`, `w` and `out`, bit for bit.
    ///
    /// # Shapes
    /// As [`CudaKernels::moe_experts`] (`dims` = t, k, e, hidden, inter), `idx` / `w` written;
    /// `route` as [`MoeRouteDev`]; `shared` as for [`CudaKernels::moe_experts_shared`].
    ///
    /// # Errors
    /// As [`CudaKernels::moe_experts_shared`], and [`CudaError::Invalid`] for logits that do not
    /// hold `t` rows of `stride ≥ e` columns, or where the separate router does not take `e` and
    /// `k` ([`CudaKernels::moe_router`]).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_experts_routed<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        route: &MoeRouteDev<'_>,
        idx: &mut CudaSlice<u32>,
        w: &mut CudaSlice<f32>,
        gate: &impl DevicePtr<T>,
        up: &impl DevicePtr<T>,
        down: &impl DevicePtr<T>,
        shared: Option<&MoeSharedDev<'_, &CudaSlice<T>>>,
        out: &mut impl DevicePtrMut<f32>,
        dims: [usize; 5],
        which: MoeGemv,
    ) -> Result<()> {
        let [t, _, _, hidden, _] = dims;
        self.check_experts(x, &*idx, &*w, gate, up, down, out, dims)?;
        if let Some(sh) = shared {
            sh.check_inputs(self, t)?;
            sh.check_dense(self, hidden)?;
        }
        let fused = self.route_first(route, idx, w, dims, which, false, shared.is_some())?;
        if t == 0 {
            return Ok(());
        }
        let s = self.stream();
        let (pl, _gl) = route.logits.device_ptr(s);
        let rc = fused.then(|| route_call(pl, route)).transpose()?;
        let ((px, _gx), (pi, _gi), (pw, _gw)) = (x.device_ptr(s), idx.device_ptr_mut(s), w.device_ptr_mut(s));
        let (po, _go) = out.device_ptr_mut(s);
        super::moe::decode_dense::<T>(self, [px, pi, pw, po], gate, up, down, dims, which, MOE_PHASES_ALL, shared, rc)
    }

    /// [`CudaKernels::moe_experts_routed`] with FP8 experts: the decode GEMVs of
    /// [`CudaKernels::moe_experts_fp8_with`] (with `shared`, [`CudaKernels::moe_experts_fp8_shared`])
    /// with their router.
    ///
    /// # Shapes
    /// As [`CudaKernels::moe_experts_fp8`], `idx` / `w` written; `route` as [`MoeRouteDev`];
    /// `shared` as for [`CudaKernels::moe_experts_fp8_shared`].
    ///
    /// # Errors
    /// As [`CudaKernels::moe_experts_routed`].
    #[allow(clippy::too_many_arguments)]
    pub fn moe_experts_fp8_routed<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        route: &MoeRouteDev<'_>,
        idx: &mut CudaSlice<u32>,
        w: &mut CudaSlice<f32>,
        gate: Fp8Dev<'_>,
        up: Fp8Dev<'_>,
        down: Fp8Dev<'_>,
        shared: Option<&MoeSharedDev<'_, Fp8Dev<'_>>>,
        out: &mut impl DevicePtrMut<f32>,
        dims: [usize; 5],
        which: MoeGemv,
    ) -> Result<()> {
        self.moe_fp8_check(x, &*idx, &*w, gate, up, down, out, dims, shared)?;
        let fused = self.route_first(route, idx, w, dims, which, true, shared.is_some())?;
        if dims[0] == 0 {
            return Ok(());
        }
        let s = self.stream();
        let (pl, _gl) = route.logits.device_ptr(s);
        let rc = fused.then(|| route_call(pl, route)).transpose()?;
        let ((px, _gx), (pi, _gi), (pw, _gw)) = (x.device_ptr(s), idx.device_ptr_mut(s), w.device_ptr_mut(s));
        let (po, _go) = out.device_ptr_mut(s);
        self.moe_fp8_decode_at::<T>([px, pi, pw, po], gate, up, down, dims, which, MOE_PHASES_ALL, shared, rc)
    }

    /// Checks `route`'s logits for `dims` (t, k, e, ..), and runs the separate router into `idx`
    /// / `w` unless the decode call (form `which`, FP8 `fp8`, a fused shared expert `shared`)
    /// routes in its gate+up kernel: whether it does.
    #[allow(clippy::too_many_arguments)]
    fn route_first(
        &self,
        route: &MoeRouteDev<'_>,
        idx: &mut CudaSlice<u32>,
        w: &mut CudaSlice<f32>,
        dims: [usize; 5],
        which: MoeGemv,
        fp8: bool,
        shared: bool,
    ) -> Result<bool> {
        let [t, k, e, _, _] = dims;
        if route.stride < e {
            return Err(CudaError::Invalid(format!("moe router: stride {} < e {e}", route.stride)));
        }
        self.check("logits", route.logits, prod(&[t, route.stride])?)?;
        if route.router.routes_inside(which, dims, fp8, shared) {
            return Ok(true);
        }
        self.moe_router_strided(route.logits, route.stride, idx, w, t, e, k, route.renorm)?;
        Ok(false)
    }
}

/// The fused router's arguments for logits at device address `logits`.
fn route_call(logits: u64, route: &MoeRouteDev<'_>) -> Result<RouteCall> {
    Ok(RouteCall { logits, stride: u32_of("logits stride", route.stride)?, flags: 1 | i32::from(route.renorm) << 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_env_values() {
        let v = |s: &str| MoeRouter::from_value(Some(std::ffi::OsStr::new(s)));
        assert_eq!(MoeRouter::from_value(None), Ok(MoeRouter::Apart));
        assert_eq!((v("fused"), v(" Fused ")), (Ok(MoeRouter::Fused), Ok(MoeRouter::Fused)));
        assert_eq!((v("apart"), v("APART"), v("")), (Ok(MoeRouter::Apart), Ok(MoeRouter::Apart), Ok(MoeRouter::Apart)));
        assert_eq!(v("separate"), Err("separate".to_string()), "an unknown value is reported, not taken silently");
    }

    /// The fused router takes what the one-warp router takes (e ≤ 512, k ≤ 16, k ≤ e), and
    /// nothing with `apart`.
    #[test]
    fn fused_router_takes_the_warp_router_shapes() {
        let f = MoeRouter::Fused;
        // PORTER_ROUTER_BLOCK (read once) keeps the block form, and so the router apart.
        let warp = router_warp_form(512);
        assert_eq!((f.takes(512, 10), f.takes(33, 16), f.takes(8, 8)), (warp, warp, warp));
        assert!(!f.takes(513, 10), "beyond 32 · ROUTER_WARP_J experts");
        assert!(!f.takes(512, ROUTER_MAX_K + 1));
        assert!(!f.takes(8, 9) && !f.takes(8, 0));
        assert!(!MoeRouter::Apart.takes(512, 10));
    }

    /// The direct form runs where `moe_decode_run` takes it: the fused shared expert's, or a
    /// resolved direct form.
    #[test]
    fn direct_form_rule() {
        assert!(runs_direct(MoeGemv::Auto, 10, false, false));
        assert!(!runs_direct(MoeGemv::Auto, 20, false, false), "dense: v1 beyond 16 pairs");
        assert!(runs_direct(MoeGemv::Auto, 40, true, false));
        assert!(runs_direct(MoeGemv::V1, 10, false, true), "the fused shared expert's direct form");
        assert!(runs_direct(MoeGemv::Direct, 100, false, false));
        assert!(runs_direct(MoeGemv::DirectL2, 100, false, false));
        assert!(!runs_direct(MoeGemv::V2, 10, false, false));
    }
}

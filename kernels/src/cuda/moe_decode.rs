//! Launch code of the MoE decode GEMVs (kernels/cuda/moe_decode.cu), shared by the dense experts
//! ([`CudaKernels::moe_experts`]'s decode path) and the FP8 experts
//! ([`CudaKernels::moe_experts_fp8`]): the scratch layout, the grouping, and the forms of the
//! GEMVs ([`MoeGemv`]):
//! - direct (up to [`DIRECT_MAX_PAIRS`] pairs): two launches without any grouping, a pair its
//!   own slot, the combine inside the down kernel; its down-L2 variant ([`MoeGemv::DirectL2`]:
//!   the gate+up launch also asks the routed experts' down weights into L2) is opt-in, measured
//!   slower on the H200;
//! - v1 (the default beyond): two persistent launches over the pairs grouped by expert (each
//!   routed expert's rows streamed once), gate+up then down + combine;
//! - v2: one persistent launch for gate+up, down and the combine, its work items handed out
//!   as tickets (measured slower than v1; kept for A/B).
//!
//! The direct and v1 forms have a streamed down kernel (the default) and the legacy one
//! ([`MOE_DOWN_ENV`], [`MoeGemv::DirectLegacy`], [`MoeGemv::V1Legacy`]): direct's asks all of
//! a warp's rows into L2 first, v1's (`moe_dec_down_s*`) owns a block of hidden columns for
//! every slot and combines them in shared memory, without counters, fences or atomics.
//!
//! All compute every (row, expert) pair by one warp in the same order, so they give the same
//! bits, and a row's result does not depend on the other rows.

use super::moe::{align256, ALIGN_THREADS, FUSED_GROUPING_BYTES, MOE_MAX_E};
use super::moe_route::RouteCall;
use super::{prod, u32_of, CudaError, CudaKernels, KernelArg, KernelSource, Result};
use cudarc::driver::{DevicePtrMut, LaunchConfig};

mod direct;
use direct::DirectDown;

/// Environment variable choosing the MoE decode GEMVs: `direct`, `v1`, `v2` or `auto` (the
/// default: [`MoeGemv::Auto`]). Read on every call; another value warns once on stderr and
/// means `auto`.
pub const MOE_GEMV_ENV: &str = "PORTER_MOE_GEMV";

/// Environment variable for A/B runs of the shared expert's fusion into the direct form
/// ([`CudaKernels::moe_shared_fuses`]): `apart` keeps it apart (its own three launches after
/// the routed experts); unset or `fused`: fused; another value warns once on stderr and
/// means `fused`.
pub const MOE_SHARED_ENV: &str = "PORTER_MOE_SHARED";

/// Environment variable for A/B runs of the MoE decode down kernels: `legacy` runs the
/// legacy down kernels of the direct and v1 forms (direct: no L2 prefetch of its rows; v1:
/// `moe_dec_down_*`, counters and a fence per item) where [`MoeGemv::Auto`],
/// [`MoeGemv::Direct`] or [`MoeGemv::V1`] runs; `direct-legacy` / `v1-legacy` only that
/// form's; `stream`: the streamed ones of both. Unset: `DOWN_DEFAULT` where the form is
/// [`MoeGemv::Auto`] (the model path) or the fused shared expert's, the kernel an explicit form
/// names otherwise. Another value warns once on stderr and means unset. Read on every call.
pub const MOE_DOWN_ENV: &str = "PORTER_MOE_DOWN";

/// The down kernels of the model path when [`MOE_DOWN_ENV`] is unset, as (direct legacy, v1
/// legacy): the direct form's legacy kernel and v1's streamed one. H200, 24-layer 80B bf16,
/// graphs on, 2026-12-02 (docs/benchmarks.md "Session 9"): batch 1 453.3 tok/s with the legacy
/// direct down kernel against 445.8 with the streamed one; batch 8 / 64 1,554.8 / 3,197.2 with
/// the streamed v1 kernel against 1,386.3 / 2,628.4 (session 8) with the legacy one.
const DOWN_DEFAULT: (bool, bool) = (true, false);

/// Bytes of down weights the down-L2 form ([`MoeGemv::DirectL2`]) asks into L2 at most (with
/// evict_last priority): under half the H100 / H200's 50 MB L2, so that the gate / up rows
/// streaming past them and the kernels after still find room. Pairs past the budget are not
/// prefetched (their down rows come from HBM in the down launch, as in the direct form): 80B
/// bf16 covers all pairs at t = 1 (10 experts × 2 MiB), FP8 at t ≤ 2.
const DIRECT_L2_BYTES: usize = 24 << 20;

/// Which forms [`MOE_DOWN_ENV`]'s value `v` gives the legacy down kernel: (direct, v1), or
/// `None` when unset (`Err`: the value, unknown).
fn down_legacy(v: Option<&std::ffi::OsStr>) -> std::result::Result<Option<(bool, bool)>, String> {
    let Some(v) = v else { return Ok(None) };
    match v.to_string_lossy().trim().to_ascii_lowercase().as_str() {
        "" => Ok(None),
        "stream" => Ok(Some((false, false))),
        "legacy" => Ok(Some((true, true))),
        "direct-legacy" => Ok(Some((true, false))),
        "v1-legacy" => Ok(Some((false, true))),
        _ => Err(v.to_string_lossy().into_owned()),
    }
}

/// [`down_legacy`] for the process environment, warning once about a value it does not know.
fn down_legacy_env() -> Option<(bool, bool)> {
    let parsed = down_legacy(std::env::var_os(MOE_DOWN_ENV).as_deref());
    let words = ["stream", "legacy", "direct-legacy", "v1-legacy"];
    super::env::one_of_or(MOE_DOWN_ENV, parsed, &words, "the default", None)
}

/// Whether [`MOE_SHARED_ENV`]'s value `v` keeps the shared expert apart (`Err`: the value,
/// unknown).
fn shared_apart(v: Option<&std::ffi::OsStr>) -> std::result::Result<bool, String> {
    let Some(v) = v else { return Ok(false) };
    match v.to_string_lossy().trim().to_ascii_lowercase().as_str() {
        "" | "fused" => Ok(false),
        "apart" => Ok(true),
        _ => Err(v.to_string_lossy().into_owned()),
    }
}

/// [`shared_apart`] for the process environment, warning once about a value it does not know.
fn shared_apart_env() -> bool {
    let parsed = shared_apart(std::env::var_os(MOE_SHARED_ENV).as_deref());
    super::env::one_of_or(MOE_SHARED_ENV, parsed, &["fused", "apart"], "fused", false)
}

/// `phases` of [`CudaKernels::moe_decode_with`] that runs the whole call (grouping, gate+up,
/// down, combine).
pub const MOE_PHASES_ALL: u32 = 3;

/// [`MoeGemv::Auto`] takes the direct form (its down-L2 variant unless [`MOE_DOWN_ENV`] is set)
/// up to this many (row, slot) pairs, v1 beyond.
/// H200, 80B shapes (hidden 2048, inter 512, top-10 of 512), `cuda_moe_decode`, 2026-12-02,
/// µs per call direct / v1: 31.2 / 37.9 at t = 1, 52.7 / 58.9 at t = 2, 90.2 / 92.2 at t = 4,
/// 164.6 / 154.7 at t = 8 (more rows on one expert read its weights more than once;
/// docs/benchmarks.md). 40 pairs: t ≤ 4 at top-10, the verify rows of MTP with K ≤ 3.
pub const DIRECT_MAX_PAIRS: usize = 40;

/// With dense (bf16 / f16 / f32) experts [`MoeGemv::Auto`] takes the direct form only up to
/// this many pairs (a row at top-k ≤ 16) and v1 beyond, up to [`DIRECT_MAX_PAIRS`]: v1 has
/// become the faster form there (H200, session 13, `moe_decode_small_t_timing`, µs direct /
/// v1: 49.1 / 46.6 at t = 2, 88.2 / 76.4 at t = 4; the 24-layer bench at batch 4: 987.6
/// against 933.8 tok/s). FP8 experts keep the direct form up to [`DIRECT_MAX_PAIRS`] (73.9 /
/// 85.0 at t = 4).
pub const DIRECT_MAX_PAIRS_DENSE: usize = 16;

/// Largest `k · inter` of h (bytes) that the direct down kernel stages in shared memory per
/// row (below the 48 KiB a block gets without opting in).
const DIRECT_STAGE_BYTES: usize = 40 * 1024;

/// Largest o of one block of the streamed v1 down kernel, `t·k · DS_NR` elements (bytes; below
/// the 48 KiB a block gets without opting in); beyond it the legacy down kernel runs.
const DS_SMEM_BYTES: usize = 40 * 1024;
/// Streamed v1 down: hidden columns per block (`MOE_DS_NR`).
const DS_NR: usize = 8;
/// Streamed v1 down: warps per block (`MOE_DS_WARPS`).
const DS_WARPS: usize = 8;
/// Direct down kernel's `staged` bit: prefetch the warp's rows into L2 first.
const DIRECT_PREFETCH: i32 = 4;
/// Direct down kernel's `staged` bit: set the routed rows' L2 priority back to normal after
/// use (the down-L2 form's gate+up launch asked them in with evict_last).
const DIRECT_DEMOTE: i32 = 8;
/// Direct down kernel's `staged` bit: the expert ids are the launch before's output (the fused
/// router), so the routed rows' prefetch (bit [`DIRECT_PREFETCH`]) comes after the PDL wait.
const DIRECT_LATE_IDS: i32 = 16;
/// Environment variable for A/B runs of the in-flight direct down kernel
/// (`moe_dir_downa_*`: every weight load of a warp issued before its PDL wait, see
/// moe_direct.cu): `off` keeps the direct form's other down kernels; unset or `on` takes it
/// wherever it fits (`downa_fits`). Another value warns once on stderr and means `on`
/// ([`super::env_on_off`]).
pub const MOE_DOWNA_ENV: &str = "PORTER_MOE_DOWNA";

/// The in-flight down kernel's reach, dense experts: chunks of 16 bytes a lane and row
/// (`MOE_DOWNA_CH`), rows a warp (`MOE_DOWNA_KMAX`: top-10 and a shared expert).
const DOWNA_CH: usize = 2;
const DOWNA_KMAX: usize = 11;
/// The same with FP8 experts (`MOE_DOWNA_FP8_CH`, `MOE_DOWNA_FP8_KMAX`).
const DOWNA_FP8_CH: usize = 1;
const DOWNA_FP8_KMAX: usize = 12;

/// Whether [`MOE_DOWNA_ENV`] leaves the in-flight down kernel on (read once).
fn downa_env() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| super::env_on_off(MOE_DOWNA_ENV, true))
}

/// Whether the in-flight down kernel takes a direct-form call: `rows` weight rows a warp (k,
/// plus one for a shared expert of the routed rows' length), each `inter` weights of
/// `elem_bytes` (1 for FP8) in 16-byte chunks, within the kernel's reach for `fp8` or dense.
fn downa_fits(fp8: bool, elem_bytes: usize, inter: usize, rows: usize) -> bool {
    let (ch, kmax) = if fp8 { (DOWNA_FP8_CH, DOWNA_FP8_KMAX) } else { (DOWNA_CH, DOWNA_KMAX) };
    let per_chunk = 16 / elem_bytes.clamp(1, 16);
    inter.is_multiple_of(per_chunk) && inter / per_chunk <= 32 * ch && rows <= kmax
}

/// v1 gate+up kernel's `vec` bit: block 0 stores its in-block lists to global memory.
const GU_STORE_LISTS: i32 = 2;

/// Which form of the MoE decode GEMVs runs (all give the same bits).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeGemv {
    /// Up to [`DIRECT_MAX_PAIRS`] pairs [`MoeGemv::DirectLegacy`] (or, with [`MOE_DOWN_ENV`]
    /// set, [`MoeGemv::Direct`] as it says), else V1.
    Auto,
    /// Two launches without grouping: one warp per (pair, inter column) for gate+up, one per
    /// (row, hidden column) for down over the row's k pairs with the combine (its rows
    /// prefetched into L2 first unless [`MOE_DOWN_ENV`] says `legacy`).
    Direct,
    /// Two launches over the pairs grouped by expert (gate+up; down + combine): the streamed
    /// down kernel unless [`MOE_DOWN_ENV`] says `legacy`.
    V1,
    /// One persistent launch, ticketed items, L2 prefetch of the next item.
    V2,
    /// [`MoeGemv::Direct`] with its legacy down kernel (no prefetch), whatever the environment.
    DirectLegacy,
    /// [`MoeGemv::V1`] with its legacy down kernel (`moe_dec_down_*`), whatever the environment.
    V1Legacy,
    /// [`MoeGemv::Direct`] whose gate+up launch also asks the routed experts' down weights into
    /// L2 (evict_last, up to [`DIRECT_L2_BYTES`]; each gate+up warp a slice of its pair's
    /// expert), so that the down launch reads them from L2 instead of streaming them from HBM
    /// in one wave after the gate+up launch; its down kernel without a prefetch of its own
    /// (but the shared expert's row), setting the rows back to normal priority after use. The
    /// same loads, arithmetic and bits as the direct form.
    DirectL2,
}

impl MoeGemv {
    /// The form [`MOE_GEMV_ENV`] asks for ([`MoeGemv::Auto`] when unset or unknown).
    pub fn from_env() -> Self {
        let v = std::env::var_os(MOE_GEMV_ENV);
        let words = ["auto", "direct", "direct-l2", "v1", "v2", "direct-legacy", "v1-legacy"];
        super::env::one_of_or(MOE_GEMV_ENV, Self::from_value(v.as_deref()), &words, "auto", MoeGemv::Auto)
    }

    /// [`MoeGemv::from_env`] for a given value of the variable (`Err`: the value, unknown).
    fn from_value(v: Option<&std::ffi::OsStr>) -> std::result::Result<Self, String> {
        let Some(v) = v else { return Ok(MoeGemv::Auto) };
        let t = v.to_string_lossy().trim().to_ascii_lowercase();
        match t.as_str() {
            "" | "auto" => Ok(MoeGemv::Auto),
            "direct" => Ok(MoeGemv::Direct),
            "v1" => Ok(MoeGemv::V1),
            "v2" => Ok(MoeGemv::V2),
            "direct-legacy" => Ok(MoeGemv::DirectLegacy),
            "v1-legacy" => Ok(MoeGemv::V1Legacy),
            "direct-l2" => Ok(MoeGemv::DirectL2),
            _ => Err(v.to_string_lossy().into_owned()),
        }
    }

    /// The form that runs for `n` (row, slot) pairs of FP8 (`fp8`) or dense experts.
    pub(super) fn resolve(self, n: usize, fp8: bool) -> Self {
        let direct_max = if fp8 { DIRECT_MAX_PAIRS } else { DIRECT_MAX_PAIRS_DENSE };
        match self {
            MoeGemv::Auto if n <= direct_max => MoeGemv::Direct,
            MoeGemv::Auto => MoeGemv::V1,
            w => w,
        }
    }

    /// The form that runs for `n` pairs with `env` ([`MOE_DOWN_ENV`]: direct, v1 legacy; `None`:
    /// unset, [`DOWN_DEFAULT`] for `Auto`, the named kernel for an explicit form) applied.
    /// The default (`Auto`, variable unset) is [`MoeGemv::DirectLegacy`] where the direct form
    /// runs: [`MoeGemv::DirectL2`] measured slower at every t on the H200 (session 13: t = 1
    /// bf16 32.9 against 28.6 µs, FP8 25.1 against 23.2), so it stays opt-in.
    fn resolve_down(self, n: usize, fp8: bool, env: Option<(bool, bool)>) -> Self {
        let legacy = env.unwrap_or(if self == MoeGemv::Auto { DOWN_DEFAULT } else { (false, false) });
        match self.resolve(n, fp8) {
            MoeGemv::Direct if legacy.0 => MoeGemv::DirectLegacy,
            MoeGemv::V1 if legacy.1 => MoeGemv::V1Legacy,
            w => w,
        }
    }

    /// Whether this (resolved) form is the direct one.
    pub(super) fn is_direct(self) -> bool {
        matches!(self, MoeGemv::Direct | MoeGemv::DirectLegacy | MoeGemv::DirectL2)
    }
}

/// Warps per GEMV block (`MOE_GEMV_WARPS`).
const GEMV_WARPS: usize = 8;
/// v1: down rows per item (`MOE_DOWN_NR`).
const DOWN_NR: usize = 4;
/// v2: down rows per item (`MOE_V2_DR`).
const V2_DR: usize = 8;
/// v2: the most consecutive items per ticket (`ch`).
const V2_CH: usize = 2;
/// v2 takes tickets of [`V2_CH`] items from this many items a warp on (fewer: one item, so
/// that the start does not hand out all the work; see moe_decode.cu).
const V2_CH_ITEMS_PER_WARP: usize = 16;
/// v1: resident blocks per SM (`__launch_bounds__(256, 3)`).
const V1_BLOCKS_PER_SM: usize = 3;
/// v2: resident blocks per SM (`MOE_V2_BLOCKS`).
const V2_BLOCKS_PER_SM: usize = 2;
/// Words of the v2 counter buffer: ticket, blocks done, a readiness counter per active expert
/// (at most [`MOE_MAX_E`]) and a combine counter per [`V2_DR`] hidden columns (hidden up to
/// 65536). A call that needs more runs v1.
pub(super) const SYNC_WORDS: usize = 2 + MOE_MAX_E + 65536 / V2_DR;

/// Device addresses and shape of one decode call (arguments checked by the caller).
pub(super) struct DecodeCall<'a> {
    /// Module of the kernels (`MOE` for dense experts, `FP8`).
    pub src: &'static KernelSource,
    /// Infix of the kernel names: `""` (dense) or `"fp8_"`.
    pub kind: &'static str,
    /// Suffix of the kernel names: the activation type (`T::NAME`).
    pub tname: &'static str,
    /// Bytes of an activation element (`size_of::<T>()`).
    pub esize: usize,
    /// `x` `[t, hidden]`, `idx` / `w` `[t, k]`, `out` `[t, hidden]` f32.
    pub x: u64,
    pub idx: u64,
    pub w: u64,
    pub out: u64,
    /// Kernel arguments of each weight: `[q]` (dense) or `[q, scales, row_scale]` (FP8).
    pub gate: &'a [u64],
    pub up: &'a [u64],
    pub down: &'a [u64],
    /// Whether the gate / up rows (`hidden` weights) and the down rows (`inter` weights)
    /// allow 16-byte chunk loads; the activations' alignment is checked here.
    pub w_vec_gu: bool,
    pub w_vec_d: bool,
    /// `[t, k, e, hidden, inter]`.
    pub dims: [usize; 5],
    /// The shared expert, fused into the direct form (the call then runs the direct form).
    pub shared: Option<SharedCall<'a>>,
    /// The router fused into the direct form's gate+up kernel (only where the direct form
    /// runs, [`super::moe_route::runs_direct`]): it writes `idx` and `w`.
    pub route: Option<RouteCall>,
}

/// Device addresses and shape of the shared expert of a direct-form call (moe_shared.cu;
/// arguments checked by the caller).
pub(super) struct SharedCall<'a> {
    /// f32 `[t, gu_stride]`: the shared gate at columns `gu_col0..`, up at `gu_col0 + inter..`
    /// (0 with `gu_w`).
    pub gu: u64,
    pub gu_stride: usize,
    pub gu_col0: usize,
    /// Instead of `gu`: the kernel arguments of the `[gate; up]` weight `[2·inter, hidden]`
    /// (as the routed weights') and whether its rows allow 16-byte loads.
    pub gu_w: Option<(&'a [u64], bool)>,
    /// f32 `[t, g_stride]`: the shared expert gate logit at column `g_col`.
    pub glog: u64,
    pub g_stride: usize,
    pub g_col: usize,
    /// Kernel arguments of the down weight `[hidden, inter]` (as the routed weights').
    pub down: &'a [u64],
    /// Whether the down rows (`inter` weights) allow 16-byte chunk loads.
    pub w_vec: bool,
    /// The shared expert's intermediate size `I_s`.
    pub inter: usize,
}

/// The kernel arguments of one weight (`[q]` or `[q, scales, row_scale]`).
fn weights(m: &[u64]) -> impl Iterator<Item = &dyn KernelArg> {
    m.iter().map(|p| p as &dyn KernelArg)
}

/// Whether `ptr` and rows of `row_bytes` bytes allow 16-byte loads.
fn vec16(ptr: u64, row_bytes: usize) -> bool {
    ptr.is_multiple_of(16) && row_bytes.is_multiple_of(16)
}

impl CudaKernels {
    /// Whether the routed experts of `t` rows with `k` experts each out of `e`, FP8 (`fp8`) or
    /// dense ([`CudaKernels::moe_experts`], [`CudaKernels::moe_experts_fp8`]), run the direct decode
    /// form ([`MoeGemv`], [`MOE_GEMV_ENV`]), and the shared expert is then fused into it
    /// ([`CudaKernels::moe_experts_shared`], [`CudaKernels::moe_experts_fp8_shared`]) unless
    /// [`MOE_SHARED_ENV`] keeps it apart. Read on every call.
    pub fn moe_shared_fuses(t: usize, k: usize, e: usize, fp8: bool) -> bool {
        Self::moe_decode_path(t, k, e)
            && MoeGemv::from_env().resolve(t.saturating_mul(k), fp8).is_direct()
            && !shared_apart_env()
    }

    /// Resident blocks of a persistent decode kernel: `per_sm` per SM, no more than `items`
    /// warp items need.
    fn moe_persistent_grid(&self, items: usize, per_sm: usize) -> Result<u32> {
        let sms = self.caps().sms;
        u32_of("gemv blocks", (sms * per_sm).min(items.div_ceil(GEMV_WARPS)).max(1))
    }

    /// The decode path (dense or FP8 experts): scratch, grouping (in every block when it fits
    /// in shared memory, else `moe_align` first), then `which` GEMVs. `phases` < 3 stops after
    /// the grouping (0), gate+up (1) or down (2; v1: down + combine), leaving `out` unwritten
    /// (timing only).
    pub(super) fn moe_decode_run(&self, c: &DecodeCall<'_>, which: MoeGemv, phases: u32) -> Result<()> {
        let [t, k, e, hidden, inter] = c.dims;
        let n = prod(&[t, k])?;
        let which = which.resolve_down(n, c.kind == "fp8_", down_legacy_env());
        if !(which.is_direct() || c.shared.is_some()) && c.route.is_some() {
            return Err(CudaError::Invalid("moe decode: the fused router outside the direct form".into()));
        }
        if which.is_direct() || c.shared.is_some() {
            // With a shared expert the caller passes its process form (Auto by default, resolved
            // above with the default); an explicit V1 / V2 there runs direct with the
            // environment's choice or the default.
            let down = match which {
                MoeGemv::DirectL2 => DirectDown::L2,
                MoeGemv::Direct => DirectDown::Prefetch,
                MoeGemv::DirectLegacy => DirectDown::Legacy,
                // The direct form's down kernel as [`MOE_DOWN_ENV`] says, else its default.
                _ if down_legacy_env().unwrap_or(DOWN_DEFAULT).0 => DirectDown::Legacy,
                _ => DirectDown::Prefetch,
            };
            return self.moe_decode_direct(c, phases, down);
        }
        let slots = e.min(n);
        let dsm = prod(&[e + n + 3 * slots, 4])?;
        let fused = dsm <= FUSED_GROUPING_BYTES;
        // v2 needs its counters to fit the buffer, and its ticket counter (the items, plus at
        // most three tickets of V2_CH items a warp past them) a u32.
        let nq2 = hidden.div_ceil(V2_DR);
        let v2_items = prod(&[slots, inter + nq2])?;
        let v2_grid = self.moe_persistent_grid(v2_items, V2_BLOCKS_PER_SM)?;
        let v2_fits = 2 + slots + nq2 <= SYNC_WORDS
            && v2_items.saturating_add(4 * V2_CH * GEMV_WARPS * v2_grid as usize) < u32::MAX as usize;
        let which = if which == MoeGemv::V2 && !v2_fits { MoeGemv::V1 } else { which };
        // The streamed v1 down kernel while its block's o fits shared memory.
        let ds_bytes = prod(&[n, DS_NR, c.esize])?;
        let which = if which == MoeGemv::V1 && ds_bytes > DS_SMEM_BYTES { MoeGemv::V1Legacy } else { which };
        let v2_warps = GEMV_WARPS * v2_grid as usize;
        let ch = if v2_items >= V2_CH_ITEMS_PER_WARP * v2_warps { V2_CH as u32 } else { 1u32 };
        let nq = match which {
            MoeGemv::V2 => nq2,
            _ => hidden.div_ceil(DOWN_NR),
        };
        // Scratch, one allocation: sorted [n], tile_expert [n], seg [3·slots], meta [2],
        // ctr [nq] (u32; the first four only without `fused`, ctr only for v1);
        // h [n, inter] (T); o [n, hidden] (T).
        let off_tile = align256(n * 4);
        let off_seg = off_tile + align256(n * 4);
        let off_meta = off_seg + align256(slots * 3 * 4);
        let off_ctr = off_meta + 256;
        let off_h = off_ctr + align256(nq * 4);
        let off_o = off_h + align256(prod(&[n, inter, c.esize])?);
        let bytes = off_o + align256(prod(&[n, hidden, c.esize])?);
        let (n32, e32, k32, t32) = (u32_of("t·k", n)?, u32_of("e", e)?, u32_of("k", k)?, u32_of("t", t)?);
        let (h32, i32_, nq32) = (u32_of("hidden", hidden)?, u32_of("inter", inter)?, u32_of("column groups", nq)?);
        let fused32 = i32::from(fused);
        let dsm32 = if fused { u32_of("shared memory", dsm)? } else { 0 };

        let s = &self.stream;
        // SAFETY: uninitialised scratch; every byte a kernel reads is written before: the
        // index lists by moe_align (or built in shared memory instead), v1's counters by
        // block 0 of its gate+up kernel, h for every valid pair by the gate+up items (v2: a
        // down item reads its slot's h only once all its gate+up items have published it), o
        // for every valid pair by the down items before their column group is counted done.
        let mut scratch = unsafe { s.alloc::<u8>(bytes) }?;
        let (base, _gs) = scratch.device_ptr_mut(s);
        let (p_sorted, p_tile, p_seg) = (base, base + off_tile as u64, base + off_seg as u64);
        let (p_meta, p_ctr) = (base + off_meta as u64, base + off_ctr as u64);
        let (p_h, p_o) = (base + off_h as u64, base + off_o as u64);
        let vec_gu = i32::from(c.w_vec_gu && vec16(c.x, hidden * c.esize));
        let vec_d = i32::from(c.w_vec_d && vec16(p_h, inter * c.esize));
        let cfg = |blocks: u32| LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (GEMV_WARPS as u32 * 32, 1, 1),
            shared_mem_bytes: dsm32,
        };
        if !fused {
            let cfg = LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (ALIGN_THREADS, 1, 1),
                shared_mem_bytes: u32_of("shared memory", e * 4)?,
            };
            let one = 1u32;
            // SAFETY: arguments match `moe_align`; pad 1: sorted and tile_expert have n
            // entries, seg 3·min(e, n), meta 2; dynamic shared memory e u32 (e ≤ 8192: 32 KiB).
            // Kernel: `moe_align(const u32* idx, u32 n, u32 e, u32 pad, u32 cap, u32 tiles_cap, u32* sorted,
            // u32* tile_expert, u32* seg, u32* meta)`.
            let args: [&dyn KernelArg; 10] =
                [&c.idx, &n32, &e32, &one, &n32, &n32, &p_sorted, &p_tile, &p_seg, &p_meta];
            unsafe { self.launch(c.src, "moe_align", cfg, &args) }?;
        }
        match which {
            MoeGemv::V2 => {
                let mut sync = self.moe_sync.lock().unwrap_or_else(|e| e.into_inner());
                let (p_sync, _gy) = sync.device_ptr_mut(s);
                let mut args: Vec<&dyn KernelArg> = vec![&c.x];
                args.extend(weights(c.gate));
                args.extend(weights(c.up));
                args.extend(weights(c.down));
                let rest: [&dyn KernelArg; 20] = [
                    &c.idx, &c.w, &n32, &e32, &fused32, &p_sorted, &p_seg, &p_meta, &p_sync, &p_h, &p_o, &c.out, &h32,
                    &i32_, &k32, &t32, &vec_gu, &vec_d, &ch, &phases,
                ];
                args.extend(rest);
                // SAFETY: arguments match `moe_dec_v2_<kind><T>(const T* x, <gate>, <up>, <down>,
                // const u32* idx, const float* wt, u32 n, u32 e, int fused, const u32* g_sorted,
                // const u32* g_seg, const u32* g_meta, u32* sync, T* h, T* o, float* out, u32 H,
                // u32 I, u32 k, u32 t, int vec_gu, int vec_d, u32 ch, u32 phases)` (a weight: `const T*`,
                // or `const u8* q, const float* scales, const u32* row_scale` for FP8; lengths
                // checked by the caller, FP8 scale rows exist by `Fp8Dev`'s contract). sync is
                // the zeroed counter buffer, 2 + min(e, n) + ceil(H / 8) ≤ SYNC_WORDS words,
                // locked for the launch and zeroed again by the kernel's last block; stream
                // order keeps calls apart. Items past the active experts are never visited;
                // 16-byte loads only with vec_*; the global lists are read only without
                // `fused`; out [t, H] is written in full when phases = 3.
                unsafe { self.launch(c.src, &format!("moe_dec_v2_{}{}", c.kind, c.tname), cfg(v2_grid), &args) }
            }
            _ => {
                if phases == 0 {
                    return Ok(());
                }
                let grid_gu = self.moe_persistent_grid(prod(&[slots, inter])?, V1_BLOCKS_PER_SM)?;
                let grid_down = self.moe_persistent_grid(prod(&[slots, nq])?, V1_BLOCKS_PER_SM)?;
                let mut args: Vec<&dyn KernelArg> = vec![&c.x];
                args.extend(weights(c.gate));
                args.extend(weights(c.up));
                // The streamed down kernel reads the lists from global memory: stored there by
                // block 0 of the gate+up kernel when it groups in shared memory.
                let streamed = which == MoeGemv::V1;
                let gu_flags = vec_gu | if streamed && fused { GU_STORE_LISTS } else { 0 };
                let rest: [&dyn KernelArg; 14] = [
                    &c.idx, &n32, &e32, &fused32, &p_sorted, &p_seg, &p_meta, &p_ctr, &nq32, &p_h, &h32, &i32_, &k32,
                    &gu_flags,
                ];
                args.extend(rest);
                // SAFETY: arguments match `moe_dec_gu_<kind><T>(const T* x, <gate>, <up>,
                // const u32* idx, u32 n, u32 e, int fused, const u32* g_sorted, const u32* g_seg,
                // const u32* g_meta, u32* ctr, u32 nctr, T* h, u32 H, u32 I, u32 k, int vec)`
                // (weights as for v2); h rows per pair (< n); ctr has nq entries, zeroed by
                // block 0; with vec bit 1 (only with `fused`) block 0 writes sorted [n], seg
                // [3·active ≤ 3·slots] and meta[0] into the scratch's list areas, which nothing
                // else reads or writes in this launch; otherwise as v2.
                unsafe { self.launch(c.src, &format!("moe_dec_gu_{}{}", c.kind, c.tname), cfg(grid_gu), &args) }?;
                if phases == 1 {
                    return Ok(());
                }
                let mut args: Vec<&dyn KernelArg> = vec![&p_h];
                args.extend(weights(c.down));
                if streamed {
                    let rest: [&dyn KernelArg; 12] =
                        [&c.idx, &c.w, &e32, &p_sorted, &p_seg, &p_meta, &c.out, &h32, &i32_, &k32, &t32, &vec_d];
                    args.extend(rest);
                    let cfg = LaunchConfig {
                        grid_dim: (u32_of("column blocks", hidden.div_ceil(DS_NR))?, 1, 1),
                        block_dim: (DS_WARPS as u32 * 32, 1, 1),
                        shared_mem_bytes: u32_of("shared memory", ds_bytes)?,
                    };
                    let name = format!("moe_dec_downs_{}{}", c.kind, c.tname);
                    // SAFETY: arguments match `moe_dec_downs_<kind><T>(const T* h, <down>,
                    // const u32* idx, const float* wt, u32 e, const u32* g_sorted, const u32* g_seg,
                    // const u32* g_meta, float* out, u32 H, u32 I, u32 k, u32 t, int vec)`; the
                    // lists were written in stream order before (moe_align, or block 0 of the
                    // gate+up launch with `fused`): meta[0] active slots, seg [3·active], sorted
                    // the valid pairs (< n); h rows per valid pair; block x covers columns
                    // 8x.. (those < H), its dynamic shared memory o [n, 8] (T, ds_bytes ≤ 40 KiB)
                    // written for the valid pairs before the barrier and read only for them;
                    // out [t, H] written in full.
                    return unsafe { self.launch(c.src, &name, cfg, &args) };
                }
                let rest: [&dyn KernelArg; 16] = [
                    &c.idx, &c.w, &n32, &e32, &fused32, &p_sorted, &p_seg, &p_meta, &p_ctr, &p_o, &c.out, &h32, &i32_,
                    &k32, &t32, &vec_d,
                ];
                args.extend(rest);
                // SAFETY: arguments match `moe_dec_down_<kind><T>(const T* h, <down>, const u32* idx,
                // const float* wt, u32 n, u32 e, int fused, const u32* g_sorted, const u32* g_seg,
                // const u32* g_meta, u32* ctr, T* o, float* out, u32 H, u32 I, u32 k, u32 t, int vec)`;
                // o has n rows of hidden, written for valid pairs only and read back (combine)
                // only for them; out [t, hidden] written in full (by the completing warp of every
                // column group, or zeroed when no id is valid).
                unsafe { self.launch(c.src, &format!("moe_dec_down_{}{}", c.kind, c.tname), cfg(grid_down), &args) }
            }
        }
    }
}

/// Checks `[t, k, e, hidden, inter]` of a routed-experts call (`what` names it).
pub(super) fn check_dims(what: &str, dims: [usize; 5]) -> Result<()> {
    let [_, k, e, hidden, inter] = dims;
    if k == 0 || k > e || e > MOE_MAX_E || hidden == 0 || inter == 0 {
        return Err(CudaError::Invalid(format!(
            "{what}: need 1 <= k <= e <= {MOE_MAX_E}, hidden > 0, inter > 0; got k = {k}, e = {e}, \
             hidden = {hidden}, inter = {inter}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downa_reach() {
        // 80B: inter 512, top-10 + the shared expert = 11 rows; bf16 rows are 64 chunks (2 a
        // lane), FP8 rows 32 (1 a lane).
        assert!(downa_fits(false, 2, 512, 11));
        assert!(downa_fits(true, 1, 512, 11));
        assert!(downa_fits(true, 1, 512, 12));
        assert!(!downa_fits(false, 2, 512, 12), "12 bf16 rows pass the registers");
        assert!(!downa_fits(false, 2, 768, 8), "3 chunks a lane");
        assert!(!downa_fits(true, 1, 768, 8), "FP8: 2 chunks a lane");
        assert!(!downa_fits(false, 4, 512, 8), "f32 rows of 512: 4 chunks a lane");
        assert!(downa_fits(false, 4, 256, 8));
        assert!(!downa_fits(false, 2, 500, 8), "not whole chunks");
    }

    #[test]
    fn gemv_env_values() {
        let v = |s: &str| MoeGemv::from_value(Some(std::ffi::OsStr::new(s)));
        assert_eq!(MoeGemv::from_value(None), Ok(MoeGemv::Auto));
        assert_eq!(v(" V1 "), Ok(MoeGemv::V1));
        assert_eq!(v(" V2"), Ok(MoeGemv::V2));
        assert_eq!(v("Direct"), Ok(MoeGemv::Direct));
        assert_eq!(v(" direct-L2"), Ok(MoeGemv::DirectL2));
        assert!(MoeGemv::DirectL2.is_direct());
        assert_eq!(v(""), Ok(MoeGemv::Auto));
        assert_eq!(v("v3"), Err("v3".to_string()));
    }

    #[test]
    fn gemv_legacy_values() {
        let v = |s: &str| MoeGemv::from_value(Some(std::ffi::OsStr::new(s)));
        assert_eq!(v("direct-legacy"), Ok(MoeGemv::DirectLegacy));
        assert_eq!(v(" V1-Legacy "), Ok(MoeGemv::V1Legacy));
        assert_eq!(MoeGemv::Auto.resolve_down(10, false, Some((true, true))), MoeGemv::DirectLegacy);
        assert_eq!(MoeGemv::Auto.resolve_down(10, false, Some((false, true))), MoeGemv::Direct);
        assert_eq!(MoeGemv::Auto.resolve_down(DIRECT_MAX_PAIRS + 1, true, Some((true, true))), MoeGemv::V1Legacy);
        assert_eq!(MoeGemv::Auto.resolve_down(DIRECT_MAX_PAIRS + 1, true, Some((true, false))), MoeGemv::V1);
        assert_eq!(
            MoeGemv::V1Legacy.resolve_down(1, false, Some((false, false))),
            MoeGemv::V1Legacy,
            "explicit legacy stays"
        );
        assert_eq!(MoeGemv::V2.resolve_down(100, false, Some((true, true))), MoeGemv::V2);
        assert!(MoeGemv::DirectLegacy.is_direct() && !MoeGemv::V1Legacy.is_direct());
    }

    #[test]
    fn down_env_values() {
        let v = |s: &str| down_legacy(Some(std::ffi::OsStr::new(s)));
        assert_eq!((down_legacy(None), v("")), (Ok(None), Ok(None)));
        assert_eq!((v("legacy"), v(" Legacy")), (Ok(Some((true, true))), Ok(Some((true, true)))));
        assert_eq!((v("direct-legacy"), v("V1-legacy")), (Ok(Some((true, false))), Ok(Some((false, true)))));
        assert_eq!(v("stream"), Ok(Some((false, false))));
        assert_eq!(v("old"), Err("old".to_string()));
        // Unset: the default for Auto, the named kernel for an explicit form.
        assert_eq!(MoeGemv::Auto.resolve_down(10, false, None), MoeGemv::DirectLegacy);
        assert_eq!(MoeGemv::Auto.resolve_down(DIRECT_MAX_PAIRS_DENSE, false, None), MoeGemv::DirectLegacy);
        assert_eq!(MoeGemv::Auto.resolve_down(DIRECT_MAX_PAIRS_DENSE + 1, false, None), MoeGemv::V1);
        assert_eq!(MoeGemv::Auto.resolve_down(DIRECT_MAX_PAIRS, true, None), MoeGemv::DirectLegacy);
        assert_eq!(MoeGemv::Auto.resolve_down(DIRECT_MAX_PAIRS + 1, true, None), MoeGemv::V1);
        assert_eq!(MoeGemv::Direct.resolve_down(10, false, None), MoeGemv::Direct);
    }

    /// The streamed v1 down kernel takes the 80B shapes up to t = 256 (top-10) in bf16.
    const _: () = assert!(256 * 10 * DS_NR * 2 <= DS_SMEM_BYTES);

    #[test]
    fn shared_env_values() {
        let v = |s: &str| shared_apart(Some(std::ffi::OsStr::new(s)));
        assert_eq!(shared_apart(None), Ok(false));
        assert_eq!((v("apart"), v(" Apart ")), (Ok(true), Ok(true)));
        assert_eq!((v("fused"), v("")), (Ok(false), Ok(false)));
        assert_eq!(v("0"), Err("0".to_string()), "an unknown value is reported, not taken silently");
    }

    #[test]
    fn auto_takes_direct_for_few_pairs() {
        // Dense: direct for one row at top-10, v1 from 17 pairs; FP8: direct up to 40.
        assert_eq!(MoeGemv::Auto.resolve(10, false), MoeGemv::Direct);
        assert_eq!(MoeGemv::Auto.resolve(DIRECT_MAX_PAIRS_DENSE, false), MoeGemv::Direct);
        assert_eq!(MoeGemv::Auto.resolve(DIRECT_MAX_PAIRS_DENSE + 1, false), MoeGemv::V1);
        assert_eq!(MoeGemv::Auto.resolve(DIRECT_MAX_PAIRS, true), MoeGemv::Direct);
        assert_eq!(MoeGemv::Auto.resolve(DIRECT_MAX_PAIRS + 1, true), MoeGemv::V1);
        assert_eq!(MoeGemv::V2.resolve(1, false), MoeGemv::V2);
    }

    /// The counter buffer holds what the largest call v2 takes needs (else it runs v1).
    #[test]
    fn sync_words_cover_the_limits() {
        assert!(2 + MOE_MAX_E + 65536usize.div_ceil(V2_DR) <= SYNC_WORDS);
    }
}

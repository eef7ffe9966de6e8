//! The direct form of the MoE decode GEMVs ([`super::MoeGemv::Direct`], up to
//! [`super::DIRECT_MAX_PAIRS`] pairs): no grouping, a (row, expert) pair its own slot, the
//! gate+up launch (with the router and the shared expert's gate/up fused in where asked) and
//! the down launch, which also combines (kernels/cuda/moe_direct.cu).

use super::super::moe::align256;
use super::super::moe_route::RouteCall;
use super::super::{prod, u32_of, CudaKernels, KernelArg, Result};
use super::{
    downa_env, downa_fits, vec16, weights, DecodeCall, DIRECT_DEMOTE, DIRECT_L2_BYTES, DIRECT_LATE_IDS,
    DIRECT_PREFETCH, DIRECT_STAGE_BYTES, GEMV_WARPS,
};
use cudarc::driver::{DevicePtrMut, LaunchConfig};

/// The down kernel of a direct-form call (and what its gate+up launch prefetches).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DirectDown {
    /// No prefetch ([`super::MoeGemv::DirectLegacy`]).
    Legacy,
    /// The down kernel asks its rows into L2 first ([`super::MoeGemv::Direct`]).
    Prefetch,
    /// The gate+up launch asks the down rows into L2 ([`super::MoeGemv::DirectL2`]).
    L2,
}

impl CudaKernels {
    /// The direct form ([`super::MoeGemv::Direct`]) of [`CudaKernels::moe_decode_run`]: no grouping,
    /// scratch only for h `[t·k, inter]` (and h_s `[t, I_s]` with a shared expert); `phases` as
    /// there (0: nothing runs, 1: gate+up).
    pub(super) fn moe_decode_direct(&self, c: &DecodeCall<'_>, phases: u32, down: DirectDown) -> Result<()> {
        if phases == 0 {
            return Ok(());
        }
        let [t, k, e, hidden, inter] = c.dims;
        let n = prod(&[t, k])?;
        let (n32, e32, k32, t32) = (u32_of("t·k", n)?, u32_of("e", e)?, u32_of("k", k)?, u32_of("t", t)?);
        let (h32, i32_) = (u32_of("hidden", hidden)?, u32_of("inter", inter)?);
        let sh = c.shared.as_ref();
        let is = sh.map_or(0, |s| s.inter);
        let s = &self.stream;
        // Scratch, one allocation: h [n, inter], then h_s [t, I_s] (T).
        let off_hs = align256(prod(&[n, inter, c.esize])?);
        // SAFETY: uninitialised scratch: h of every valid pair and all of h_s are written by the
        // gate+up kernel before the down kernel (later in stream order) reads them; invalid
        // pairs' rows are never read.
        let mut scratch = unsafe { s.alloc::<u8>(off_hs + prod(&[t, is, c.esize])?) }?;
        let (p_h, _gh) = scratch.device_ptr_mut(s);
        let p_hs = p_h + off_hs as u64;
        let vec_gu = i32::from(c.w_vec_gu && vec16(c.x, hidden * c.esize));
        let vec_d = i32::from(c.w_vec_d && vec16(p_h, inter * c.esize));
        // One warp per (pair, inter column), every item at once; then, with a shared expert,
        // a thread per element of h_s (from the f32 columns gu), or a warp per element (its
        // gate / up products from the weight, `gu_w`).
        let gu_w = sh.and_then(|sc| sc.gu_w);
        let routed_blocks = prod(&[n, inter])?.div_ceil(GEMV_WARPS);
        let per_block = if gu_w.is_some() { GEMV_WARPS } else { GEMV_WARPS * 32 };
        let shared_blocks = prod(&[t, is])?.div_ceil(per_block);
        let cfg = LaunchConfig {
            grid_dim: (u32_of("gemv blocks", routed_blocks + shared_blocks)?, 1, 1),
            block_dim: (GEMV_WARPS as u32 * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut args: Vec<&dyn KernelArg> = vec![&c.x];
        args.extend(weights(c.gate));
        args.extend(weights(c.up));
        // The down-L2 form: the down weights' first argument (q, T or e4m3 bytes), an expert's
        // block of them [hidden, inter], and how many pairs fit the L2 budget.
        let wbytes = if c.kind.is_empty() { c.esize } else { 1 };
        let dbytes = prod(&[hidden, inter, wbytes])? as u64;
        let npf = match down {
            DirectDown::L2 => u32_of("prefetched pairs", n.min(DIRECT_L2_BYTES / dbytes.max(1) as usize))?,
            _ => 0,
        };
        let dpf = c.down[0];
        let rest: [&dyn KernelArg; 11] = [&c.idx, &n32, &e32, &p_h, &h32, &i32_, &k32, &vec_gu, &dpf, &dbytes, &npf];
        args.extend(rest);
        // The fused router's arguments (flags 0: idx and w hold the separate router's output).
        let rt = c.route.unwrap_or(RouteCall { logits: 0, stride: 0, flags: 0 });
        let route_args: [&dyn KernelArg; 4] = [&rt.logits, &rt.stride, &rt.flags, &c.w];
        args.extend(route_args);
        let (gu_stride, gu_col0, is32) = match sh {
            Some(sc) => (
                u32_of("shared gu stride", sc.gu_stride)?,
                u32_of("shared gu column", sc.gu_col0)?,
                u32_of("shared inter", is)?,
            ),
            None => (0, 0, 0),
        };
        let gu_ptr = sh.map_or(0u64, |sc| sc.gu);
        // The [gate; up] weight's arguments (zeros without one: 1 dense, 3 FP8), gu_w, gu_vec.
        let zeros = [0u64; 3];
        let gu_args = gu_w.map_or(&zeros[..c.gate.len()], |(a, _)| a);
        let gu_flag = i32::from(gu_w.is_some());
        let gu_vec = i32::from(gu_w.is_some_and(|(_, v)| v) && vec16(c.x, hidden * c.esize));
        if sh.is_some() {
            let extra: [&dyn KernelArg; 6] = [&gu_ptr, &gu_stride, &gu_col0, &p_hs, &is32, &t32];
            args.extend(extra);
            args.extend(weights(gu_args));
            let flags: [&dyn KernelArg; 2] = [&gu_flag, &gu_vec];
            args.extend(flags);
        }
        let gu_name = if sh.is_some() { "moe_dir_gu_sh_" } else { "moe_dir_gu_" };
        // SAFETY: arguments match `moe_dir_gu_<kind><T>(const T* x, <gate>, <up>, u32* idx,
        // u32 n, u32 e, T* h, u32 H, u32 I, u32 k, int vec, const u8* dpf, u64 dbytes, u32 npf,
        // const float* rlog, u32 rstride, int rflags, float* rwt)` (flags bit 0, the fused router:
        // rlog has t rows of rstride ≥ e f32 logits, e ≤ 32·ROUTER_WARP_J, k ≤ ROUTER_MAX_K
        // (checked by RouteCall's maker), idx and rwt [t, k] are written, each row by one block;
        // flags 0: idx is read, rlog and rwt unused)
        // (weights as for v2; the pairs p < npf ≤ n with a valid id prefetch, non-binding,
        // lines of dpf's expert block [id·dbytes, (id + 1)·dbytes): within the down weight of
        // e·hidden·inter weights), or
        // `moe_dir_gu_sh_<kind><T>` with `const float* gu, u32 gu_stride, u32 gu_col0, T* hs,
        // u32 Is, u32 t, <gu weight>, int gu_w, int gu_vec` after them; items past n · I exit;
        // a pair with an id >= e writes no h and is never read (the down kernel skips it); h
        // has n rows of I; the blocks past ceil(n·I / 8) write h_s [t, Is] (its elements <
        // t·Is), reading gu's columns gu_col0 .. gu_col0 + 2·Is < gu_stride of t rows, or with
        // gu_w the weight's 2·Is rows of hidden (checked by the caller) against x's t rows.
        unsafe { self.launch(c.src, &format!("{gu_name}{}{}", c.kind, c.tname), cfg, &args) }?;
        if phases == 1 {
            return Ok(());
        }
        // A row's k rows of h (and h_s's row) in shared memory when they fit (16-byte rows).
        let h_row = prod(&[k, inter, c.esize])?;
        let hs_row = prod(&[is, c.esize])?;
        let stage_h = vec_d == 1 && h_row <= DIRECT_STAGE_BYTES;
        let vec_s = sh.is_some_and(|sc| sc.w_vec && vec16(p_hs, hs_row));
        let stage_s = vec_s && if stage_h { h_row } else { 0 } + hs_row <= DIRECT_STAGE_BYTES;
        // Its own L2 prefetch: the direct form's; in the down-L2 form only for the shared row (the
        // routed rows are asked in by the gate+up launch, set back to normal after use here).
        let prefetch = match down {
            DirectDown::Prefetch => DIRECT_PREFETCH,
            DirectDown::L2 => DIRECT_DEMOTE | if sh.is_some() { DIRECT_PREFETCH } else { 0 },
            DirectDown::Legacy => 0,
        };
        // With the fused router the ids are the gate+up launch's output: the routed rows' prefetch
        // waits for the PDL wait.
        let late = if c.route.is_some() && prefetch & DIRECT_PREFETCH != 0 { DIRECT_LATE_IDS } else { 0 };
        let staged = i32::from(stage_h) | (i32::from(stage_s) << 1) | prefetch | late;
        let dsm = if stage_h { h_row } else { 0 } + if stage_s { hs_row } else { 0 };
        // The shared row as one more pair of the routed groups when it has their length and
        // load width (mode 1), else a dot product of its own (mode 2).
        let mode = match sh {
            None => 0i32,
            Some(_) if is == inter && i32::from(vec_s) == vec_d => 1,
            Some(_) => 2,
        };
        let svec = i32::from(vec_s);
        let mut args: Vec<&dyn KernelArg> = vec![&p_h];
        args.extend(weights(c.down));
        let rest: [&dyn KernelArg; 9] = [&c.idx, &c.w, &e32, &c.out, &h32, &i32_, &k32, &vec_d, &staged];
        args.extend(rest);
        let (g_stride, g_col) = match sh {
            Some(sc) => (u32_of("shared gate stride", sc.g_stride)?, u32_of("shared gate column", sc.g_col)?),
            None => (0, 0),
        };
        let glog = sh.map_or(0u64, |sc| sc.glog);
        if let Some(sc) = sh {
            args.extend(weights(sc.down));
            let extra: [&dyn KernelArg; 7] = [&p_hs, &glog, &g_stride, &g_col, &is32, &mode, &svec];
            args.extend(extra);
        }
        // The in-flight kernel (in the down-L2 form it sets the routed rows' L2 priority back
        // after reading them, as the direct kernel does): ids from the separate router (read
        // before its PDL wait), h and h_s staged, the shared row (if any) one more row of the
        // routed length, and the rows within its registers. Never with the fused router, in
        // any down form: its ids and weights are the gate+up launch's own output (`late` is set
        // only where the form prefetches, so testing it let the legacy form through: the ids
        // and weights read before the wait were stale, cuda_moe_route's Special rows at t = 1).
        let fp8 = c.kind == "fp8_";
        let wbytes = if fp8 { 1 } else { c.esize };
        let inflight = downa_env()
            && c.route.is_none()
            && stage_h
            && (mode == 0 || (mode == 1 && stage_s))
            && downa_fits(fp8, wbytes, inter, k + usize::from(mode == 1));
        let cfg = LaunchConfig {
            grid_dim: (u32_of("column blocks", hidden.div_ceil(GEMV_WARPS))?, t32, 1),
            block_dim: (GEMV_WARPS as u32 * 32, 1, 1),
            shared_mem_bytes: u32_of("shared memory", dsm)?,
        };
        let down_name = match (sh.is_some(), inflight) {
            (true, false) => "moe_dir_down_sh_",
            (false, false) => "moe_dir_down_",
            (true, true) => "moe_dir_downa_sh_",
            (false, true) => "moe_dir_downa_",
        };
        // SAFETY: arguments match `moe_dir_down_<kind><T>(const T* h, <down>, const u32* idx,
        // const float* wt, u32 e, float* out, u32 H, u32 I, u32 k, int vec, int staged)`, or
        // `moe_dir_down_sh_<kind><T>` with `<shared down>, const T* hs, const float* glog,
        // u32 g_stride, u32 g_col, u32 Is, int mode, int svec` after them (`moe_dir_downa_*`:
        // the same parameters; it reads idx and w before its PDL wait, which the separate
        // router wrote two launches back (not late), stages h and, mode 1, h_s (both in dsm:
        // stage_h, stage_s), and its rows fit its registers (downa_fits)); block (x, y) covers
        // row y < t and columns 8x.. (those < H write their out element; with staged bit 2
        // they also prefetch, non-binding, lines of their rows, with bit 3 set those lines'
        // L2 priority back to normal (a cache hint, no access): valid ids only); staged bit 0: the
        // row's k·I elements of h (16-byte multiple, 16-byte aligned: vec), bit 1: h_s's row
        // of Is elements after them (svec), within the dynamic shared memory given; h rows
        // are used only for valid ids; the shared down weight has H rows of Is, mode 1 only
        // when Is = I with the routed rows' load width; glog's column g_col < g_stride of t
        // rows (checked by the caller).
        unsafe { self.launch(c.src, &format!("{down_name}{}{}", c.kind, c.tname), cfg, &args) }
    }
}

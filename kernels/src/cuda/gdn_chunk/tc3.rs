//! The `tc3` form of [`CudaKernels::gdn_chunked_seq`] (`PORTER_GDN_CHUNK=tc3`): two launches
//! after the chunk offsets instead of three, kernels/cuda/gdn_chunk_tc2.cu.
//!
//! - `gdn_chunk_tc3_wu_d<dk>_<T>`: per (chunk, value head) −W, K̃, U, exp(G_last) as
//!   `gdn_chunk_tc_wu`, plus the state-free half of the outputs, Qg = Q ⊙ e^G and
//!   Pb = tril(Q Kᵀ ⊙ Γ) (rounded to T);
//!   (`tc4`: `gdn_chunk_tc4_wu_d<dk>_<T>`, the same on mma.sync, gdn_chunk_tc4.cu);
//! - `gdn_chunk_tc3_state_d<dk>_<T>_w<nw>`: the state sweep on mma.sync with the state in
//!   registers, which also writes the outputs O = Qg S + Pb Vn chunk by chunk, so that the
//!   chunk-start states (hb, 67 MB at 4096 tokens) and Vn never go through memory and
//!   `gdn_chunk_tc_out` does not run;
//! - (`tc5`: `gdn_chunk_tc5_state_d<dk>_<T>`, the same sweep on 4 warps a block, each of tc3's
//!   16-column warps split into a pair by tokens and state rows, gdn_chunk_tc5.cu; same bits;
//!   `tc6`: its stages shared across a cluster, gdn_chunk_tc6.cu; `tc7`: tc6 on a lean scratch,
//!   the decays applied in the sweep, gdn_chunk_tc6.cu and the wu launch's `_lean` entries).

use super::super::{prod, u32_of, CudaFloat, CudaKernels, DeviceCaps, Result, GDN_CHUNK};
use super::{Laps, GC_C, GC_THREADS, TC_STATIC_SMEM};
use cudarc::driver::{DevicePtrMut, LaunchConfig};

/// Environment variable: blocks an SM the tc4 wu launch is compiled for at dk = 128, `3`
/// (unset: the default; `gdn_chunk_tc4_wu_d128_<T>_o3`, `_pad_o3` under tc6: 80 registers,
/// no spills since q / k / v come in the activation type) or `2` (the plain / `_pad` build,
/// 102–106 registers; the only one at dk = 64), for A/B. H100, session 33, 80B layout, the
/// whole tc6 call at 4k / 16k tokens: 268.1 / 997.7 µs with 3, 277.3–278.7 / 998.7–1,006.1
/// with 2 (with f32 q / k / v, session 20, 3 spilled and was slower). Other values warn once
/// and count as unset.
pub const GDN_WU_OCC_ENV: &str = "PORTER_GDN_WU_OCC";

/// Environment variable: blocks a cluster of the `tc6` state sweep, `1`, `2` or `4` (unset:
/// the default, 2; where dv / 32 is not a multiple, tc5's sweep runs; 1 is an A/B of the bulk
/// copies without sharing). H100, session 32, the sweep at 4k / 16k tokens of the 80B layout:
/// 89.9 / 320.1 µs at 2, 154.0 / 567.5 at 4, 100.9 / 367.3 at 1 (tc5: 126.9 / 476.9). Other
/// values warn once and count as unset.
pub const GDN_TC6_CLUSTER_ENV: &str = "PORTER_GDN_TC6_CLUSTER";

/// Shared memory and warps per block of the tc3 kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Tc3Smem {
    /// Dynamic shared memory of the wu launch, bytes (`GT3_WU_SMEM`, or `GT4_WU_SMEM` with `tc4`).
    pub wu: usize,
    /// Whether the wu launch is `gdn_chunk_tc4_wu` (gdn_chunk_tc4.cu, `PORTER_GDN_CHUNK=tc4`)
    /// instead of `gdn_chunk_tc3_wu`; both write the same scratch.
    pub tc4: bool,
    /// Warps per block of the state launch (16 state columns each).
    pub nw: usize,
    /// Dynamic shared memory of the state launch, bytes (3 × `Gt2Stage<dk, nw, true>::BYTES`;
    /// with `pair`, `GT5_SMEM(dk)`).
    pub state: usize,
    /// Whether the state launch is `gdn_chunk_tc5_state` (gdn_chunk_tc5.cu, `PORTER_GDN_CHUNK=tc5`:
    /// 4 warps a block of 32 columns, each 16-column warp of tc3 split into a pair; same bits).
    pub pair: bool,
    /// Blocks a cluster of the state launch when it is `gdn_chunk_tc6_state` (gdn_chunk_tc6.cu,
    /// `PORTER_GDN_CHUNK=tc6`: tc5's sweep with the stages multicast across the cluster; same
    /// bits), else 0.
    pub cluster: usize,
    /// Whether the state launch is `gdn_chunk_tc7_state` (gdn_chunk_tc6.cu, `PORTER_GDN_CHUNK=tc7`:
    /// tc6's sweep, clusters of 2, on the wu launch's `_lean` scratch: K̂ / Q̂ per key head, U in
    /// the activation type, the decays applied in the sweep; not tc6's bits).
    pub lean: bool,
}

/// Bytes of one pipeline stage of the tc2 (`fuse` false) / tc3 (`fuse` true) state sweep
/// (`Gt2Stage` in gdn_chunk_tc2.cu): −W, K̃ (`T [64][dk + 8]`), U (`f32 [64][16·nw + 4]`)
/// and, fused, Qg (`T [64][dk + 8]`) and Pb (`T [64][72]`).
pub(super) fn tc2_stage_bytes(dk: usize, nw: usize, fuse: bool) -> usize {
    let kb = 2 * GC_C * (dk + 8);
    2 * kb + 4 * GC_C * (16 * nw + 4) + if fuse { kb + 2 * GC_C * 72 } else { 0 }
}

/// The tc3 kernels' shared memory for head dims `dk`, `dv` (dims the tensor-core form takes)
/// with `nw` warps asked for per state block: the first of `nw`, 2, 1 that divides dv into
/// 16-column warps and fits the device (3 stages), or `None`.
pub(super) fn tc3_smem(dk: usize, dv: usize, nw: usize, caps: DeviceCaps) -> Option<Tc3Smem> {
    let limit = caps.smem_limit().checked_sub(TC_STATIC_SMEM)?;
    let wu = 2 * GC_C * (dk + 8) + 2 * GC_C * (dk.max(dv) + 8) + 4 * GC_C * 68 + 4 * GC_C * 72;
    if wu > limit {
        return None;
    }
    [nw, 2, 1].into_iter().find_map(|nw| {
        let state = 3 * tc2_stage_bytes(dk, nw, true);
        (dv.is_multiple_of(16 * nw) && state <= limit).then_some(Tc3Smem {
            wu,
            tc4: false,
            nw,
            state,
            pair: false,
            cluster: 0,
            lean: false,
        })
    })
}

/// Dynamic shared memory of `gdn_chunk_tc5_state_d<dk>` (`GT5_SMEM`): 3 tc3 stages of 32
/// columns, then the warp pairs' exchange (per warp 2 + dk / 32 fragments of 16 bytes a lane).
pub(super) fn tc5_state_smem(dk: usize) -> usize {
    3 * tc2_stage_bytes(dk, 2, true) + 4 * (2 + dk / 32) * 32 * 16
}

/// `m` with the tc5 state launch (`gdn_chunk_tc5_state`: 128 threads, 32 columns a block)
/// where its shared memory fits the device (dv is a multiple of 32 on every tensor-core
/// path), else `m`.
pub(super) fn tc5_state(m: Tc3Smem, dk: usize, dv: usize, caps: DeviceCaps) -> Tc3Smem {
    let state = tc5_state_smem(dk);
    if dv.is_multiple_of(32) && state + TC_STATIC_SMEM <= caps.smem_limit() {
        Tc3Smem { nw: 2, state, pair: true, ..m }
    } else {
        m
    }
}

/// `m` (with tc5's state launch) with the tc6 state launch (`gdn_chunk_tc6_state`: tc5's
/// kernel in clusters of [`GDN_TC6_CLUSTER_ENV`] blocks, 2 unless set) where it runs: an sm_90
/// device outside the fallback build (the module is compiled for sm_90a there) and dv / 32 a
/// multiple of the cluster; else `m`.
pub(super) fn tc6_state(m: Tc3Smem, dv: usize, caps: DeviceCaps) -> Tc3Smem {
    // 1: the bulk-copy pipe with no sharing, an A/B of what the sharing gains.
    let cl = crate::cuda::env_count(GDN_TC6_CLUSTER_ENV, |n| n == 1 || n == 2 || n == 4, "1, 2 or 4").unwrap_or(2);
    if m.pair && caps.sm90a() && (dv / 32).is_multiple_of(cl) {
        Tc3Smem { cluster: cl, ..m }
    } else {
        m
    }
}

/// Row stride of tc7's U blocks, elements (`GT7_LDU` in gdn_chunk_tc4.cu: 32 columns, 8 of pad).
const GT7_LDU: usize = 40;
/// Bytes of one U block of tc7 (T `[64][GT7_LDU]`, `Gt7Stage::UT`) and of a chunk's decays (f32
/// `[2][64]`).
const GT7_UT: usize = GC_C * GT7_LDU * 2;
const GT7_DECAYS: usize = 2 * GC_C * 4;

/// Bytes of `uf` per (chunk, value head) in tc7's scratch (`GT7_UFB` in gdn_chunk_tc4.cu): the
/// decays, then dv / 32 U blocks.
pub(super) fn tc7_ufb(dv: usize) -> usize {
    GT7_DECAYS + dv / 32 * GT7_UT
}

/// Dynamic shared memory of `gdn_chunk_tc7_state_d<dk>` (`GT7_SMEM`): 3 stages (`Gt7Stage`:
/// W, K̂, Q̂ `T [64][dk + 8]`, U `T [64][40]`, the decays `f32 [2][64]`, Pb `T [64][72]`), then
/// the exchange (per warp 4 + dk / 32 fragments of 16 bytes a lane).
pub(super) fn tc7_state_smem(dk: usize) -> usize {
    let stage = 3 * 2 * GC_C * (dk + 8) + GT7_UT + GT7_DECAYS + 2 * GC_C * 72;
    3 * stage + 4 * (4 + dk / 32) * 32 * 16
}

/// `m` (with tc6's state launch) with the tc7 state launch where tc6 runs in clusters of 2 and
/// its shared memory fits the device, else `m`.
pub(super) fn tc7_state(m: Tc3Smem, dk: usize, caps: DeviceCaps) -> Tc3Smem {
    let state = tc7_state_smem(dk);
    if m.cluster == 2 && state + TC_STATIC_SMEM <= caps.smem_limit() {
        Tc3Smem { state, lean: true, ..m }
    } else {
        m
    }
}

/// `m` with the tc4 wu launch (`gdn_chunk_tc4_wu`, `GT4_WU_SMEM`: Kb, Qb (`T [64][dk + 8]`), Vb
/// (`T [64][dv + 8]`), As (`f32 [64][68]`)) where its shared memory fits the device, else `m`.
pub(super) fn tc4_wu(m: Tc3Smem, dk: usize, dv: usize, caps: DeviceCaps) -> Tc3Smem {
    let wu = 4 * GC_C * (dk + 8) + 2 * GC_C * (dv + 8) + 4 * GC_C * 68;
    if wu + TC_STATIC_SMEM <= caps.smem_limit() {
        Tc3Smem { wu, tc4: true, ..m }
    } else {
        m
    }
}

/// Device addresses and dims of one tc3 call (validated by the caller).
pub(super) struct Tc3Call {
    pub qkv: u64,
    pub g: u64,
    pub beta: u64,
    pub spans: u64,
    pub off: u64,
    pub state: u64,
    pub out: u64,
    /// Scratch chunks (`cap` of [`CudaKernels::gdn_chunked_seq`]).
    pub cap: usize,
    pub t: u32,
    pub n_spans: u32,
    /// Largest chunk count of a span (`⌈max_len / 64⌉`).
    pub max_chunks: u32,
    pub hk: u32,
    pub hv: u32,
    pub dk: usize,
    pub dv: u32,
    pub nbuf: u32,
    pub q_scale: f32,
}

impl CudaKernels {
    /// Queues the tc3 wu and state launches (after `gdn_chunk_prep`), laps after each (the
    /// out lap is empty).
    ///
    /// # Shapes
    /// As [`CudaKernels::gdn_chunked_seq`]; scratch from the stream's pool: wn, kb, qg
    /// `[cap, hv, 64, dk]` (T), uf `[cap, hv, 64, dv]` (f32), pb `[cap, hv, 64, 64]` (T),
    /// gl `[cap, hv]` (f32).
    ///
    /// # Errors
    /// Driver errors (allocation, compilation, launch).
    pub(super) fn gdn_tc3<T: CudaFloat>(&self, m: Tc3Smem, a: &Tc3Call, laps: &mut Laps) -> Result<()> {
        let (cap, hv, dk, dv) = (a.cap, a.hv as usize, a.dk, a.dv as usize);
        // SAFETY (all six): every element the kernels read is written first, on this stream,
        // by gdn_chunk_tc3_wu for every chunk of a valid span (rows past a chunk's length as
        // zeros); the state launch reads only chunks of valid spans.
        // tc6 reads the scratch in its stage layout (the wu launch's `_pad` entries): rows of
        // dk + 8 and 72, U in blocks of [64][36] per 32 columns.
        // tc7 (lean): kb / qg per (chunk, key head), uf tc7_ufb(dv) bytes a (chunk, value head).
        let pad = m.cluster > 0;
        let (rk, rp, ru) = if pad { (dk + 8, GC_C + 8, dv / 32 * 36) } else { (dk, GC_C, dv) };
        let (hq, uf_len) = if m.lean {
            (a.hk as usize, prod(&[cap, hv, tc7_ufb(dv) / 4])?)
        } else {
            (hv, prod(&[cap, hv, GC_C, ru])?)
        };
        let mut wn = unsafe { self.stream.alloc::<T>(prod(&[cap, hv, GC_C, rk])?) }?;
        let mut kb = unsafe { self.stream.alloc::<T>(prod(&[cap, hq, GC_C, rk])?) }?;
        let mut qg = unsafe { self.stream.alloc::<T>(prod(&[cap, hq, GC_C, rk])?) }?;
        let mut pb = unsafe { self.stream.alloc::<T>(prod(&[cap, hv, GC_C, rp])?) }?;
        let mut uf = unsafe { self.stream.alloc::<f32>(uf_len) }?;
        let mut gl = unsafe { self.stream.alloc::<f32>(prod(&[cap, hv])?) }?;
        let wu_name = if m.tc4 { "gdn_chunk_tc4_wu" } else { "gdn_chunk_tc3_wu" };
        // The tc4 wu launch at 3 blocks an SM unless asked for 2 (dk = 128; dk = 64 has only
        // the 2-block build).
        let o3 =
            m.tc4 && dk == 128 && crate::cuda::env_count(GDN_WU_OCC_ENV, |n| n == 2 || n == 3, "2 or 3") != Some(2);
        let suffix = match (o3, pad, m.lean) {
            (true, _, true) => "_lean_o3",
            (false, _, true) => "_lean",
            (true, true, false) => "_pad_o3",
            (true, false, false) => "_o3",
            (false, true, false) => "_pad",
            (false, false, false) => "",
        };
        let f_wu = self.function_smem(&GDN_CHUNK, &format!("{wu_name}_d{dk}_{}{suffix}", T::NAME), m.wu)?;
        let state_name = if m.lean {
            format!("gdn_chunk_tc7_state_d{dk}_{}_c2", T::NAME)
        } else if m.cluster > 0 {
            format!("gdn_chunk_tc6_state_d{dk}_{}_c{}", T::NAME, m.cluster)
        } else if m.pair {
            format!("gdn_chunk_tc5_state_d{dk}_{}", T::NAME)
        } else {
            format!("gdn_chunk_tc3_state_d{dk}_{}_w{}", T::NAME, m.nw)
        };
        let f_state = self.function_smem(&GDN_CHUNK, &state_name, m.state)?;
        let s = &*self.stream;
        let (pwn, _gwn) = wn.device_ptr_mut(s);
        let (pkb, _gkb) = kb.device_ptr_mut(s);
        let (pqg, _gqg) = qg.device_ptr_mut(s);
        let (ppb, _gpb) = pb.device_ptr_mut(s);
        let (puf, _guf) = uf.device_ptr_mut(s);
        let (pgl, _ggl) = gl.device_ptr_mut(s);
        let cfg = LaunchConfig {
            grid_dim: (a.max_chunks, a.hv, a.n_spans),
            block_dim: (GC_THREADS, 1, 1),
            shared_mem_bytes: u32_of("smem", m.wu)?,
        };
        // SAFETY: arguments match `gdn_chunk_tc3_wu_d<dk>_<T>` and `gdn_chunk_tc4_wu_d<dk>_<T>`
        // alike; dk is 64 or 128 and dv a multiple of 32 up to 256 (tc_smem); the shared memory
        // size is the kernel's layout; a valid span (per `off`) has rows inside 0..t and scratch
        // indices below cap.
        // Kernel: `gdn_chunk_tc3_wu_d<DK>_<T>(const T* qkv, const float* g, const float* beta,
        // const u32* spans, const u32* off, T* wn, T* kb, float* uf, float* gl, T* qg, T* pb, u32 hk,
        // u32 hv, u32 dv, float q_scale)`.
        unsafe {
            launch_fn!(
                self,
                f_wu,
                cfg,
                [a.qkv, a.g, a.beta, a.spans, a.off, pwn, pkb, puf, pgl, pqg, ppb, a.hk, a.hv, a.dv, a.q_scale]
            )
        }?;
        laps.lap(s)?;
        // tc5: 32 columns (two warp pairs) a block (tc6: and a producer warp); tc3: 16 columns a warp.
        let threads = match (m.cluster, m.pair) {
            (1.., _) => 160,
            (0, true) => 128,
            (0, false) => 32 * m.nw,
        };
        let cfg = LaunchConfig {
            grid_dim: (u32_of("column blocks", dv / (16 * m.nw))?, a.hv, a.n_spans),
            block_dim: (u32_of("threads", threads)?, 1, 1),
            shared_mem_bytes: u32_of("smem", m.state)?,
        };
        // SAFETY: arguments match `gdn_chunk_tc3_state_d<dk>_<T>_w<nw>`,
        // `gdn_chunk_tc5_state_d<dk>_<T>`, `gdn_chunk_tc6_state_d<dk>_<T>_c<cl>` and
        // `gdn_chunk_tc7_state_d<dk>_<T>_c2` alike;
        // dv % (16·nw) == 0 (tc3_smem; tc5: nw = 2 and dv % 32 == 0; tc6 / tc7: the grid's dv / 32
        // blocks a multiple of its compile-time cluster, tc6_state / tc7_state); the shared memory
        // size is the kernel's layout (tc6: tc5's; tc7: GT7_SMEM); tc7's scratch is the `_lean` wu
        // entries' (kb / qg per key head, uf tc7_ufb bytes a chunk-head); slot / src_buf of a valid
        // span are in range; rows of valid spans lie inside 0..t, NaN rows are clipped to t.
        // Kernel: `gdn_chunk_tc3_state_d<DK>_<T>_w<NW>(float* state, const u32* spans, const u32* off,
        // const T* wn, const T* kb, const float* uf, const float* gl, const T* qg, const T* pb, T* out,
        // u32 t, u32 mc, u32 hv, u32 dv, u32 nbuf, u32 hk)` (hk read by tc7's only).
        unsafe {
            launch_fn!(
                self,
                f_state,
                cfg,
                [
                    a.state,
                    a.spans,
                    a.off,
                    pwn,
                    pkb,
                    puf,
                    pgl,
                    pqg,
                    ppb,
                    a.out,
                    a.t,
                    a.max_chunks,
                    a.hv,
                    a.dv,
                    a.nbuf,
                    a.hk
                ]
            )
        }?;
        laps.lap(s)?;
        laps.lap(s)
    }
}

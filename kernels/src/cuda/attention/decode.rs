//! The tensor-core decode path of [`CudaKernels::attention`] (kernels/cuda/attention_decode.cu):
//! launches whose every span has `q_len <= 8` (decode, draft verification) over 16-bit pools
//! of the model dtype on sm_80+, split-K over the paged cache at key boundaries fixed by each
//! sequence's own length, `mma.sync` for S = Q·Kᵀ and O += P·V, K / V streamed by per-warp
//! cp.async rings, then a combine kernel for rows spanning several splits. Chosen by
//! [`ATTN_DECODE_ENV`] (default: this kernel where it applies; measured 1.6–8× the CUDA-core
//! kernels of attention.cu on the H200, session 12).

use super::{window_arg, Args, AttnMode, Paged, Pools, ATT_SPLIT_Q};
use crate::cuda::{prod, u32_of, CudaFloat, CudaKernels, Result, ATTENTION_DECODE};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};
use std::cell::Cell;
use std::ffi::c_void;

/// Environment variable choosing the decode kernel (launches with `max_q_len <= 8`, read on
/// every call): `legacy` (the CUDA-core split-K kernels of attention.cu), `mma` (the
/// tensor-core kernel of attention_decode.cu: 4 warps, the deepest K/V ring that fits the
/// device), `mma2` / `mma3` (2 or 3 ring stages per warp), `mmaw2` (2 warps and 3 stages
/// a block, two blocks an SM at head_dim 256; A/B forms), `mma4` / `mma4w2` (the V2 kernel:
/// Q by cp.async, two tiles of block-table lookahead, and the wider combine whose loads are
/// all in flight at once, launched on sm_90+ as a programmatic dependent of the split kernel
/// so that its launch overlaps the split kernel's tail; 4 or 2 warps; `mma4` or unset is the
/// default: H200, session 12, 80B shape at 32k keys, batch 1: 28.5 µs a call against 33.5
/// for `mma` and 128.7 for `legacy`), `mma4s` (`mma4` with the combine launched plainly),
/// `mma4-n8` (`mma4` whose blocks with at most 8 items, such as batch-1 decode at GQA group
/// 8, take the transposed 8-item form; opt-in: within 1 % of `mma4` on an H100, session 22;
/// A/B forms). Another value warns once and means the default. The mma kernel applies to
/// bf16 / f16 pools of the model dtype, head_dim 64 / 128 / 256, 16-byte aligned pools,
/// sm_80+, outside [`AttnMode::Invariant`]; elsewhere the CUDA-core kernels run.
pub const ATTN_DECODE_ENV: &str = "PORTER_ATTN_DECODE";
/// Environment variable: the number of key splits the mma decode kernel aims at per
/// sequence, a power of two in 1..=256 (default `DEC_SPLITS`). A sequence of `n` keys is
/// split every `ks` keys, `ks` the smallest power of two `>= n / splits` and `>=` the
/// minimum of [`ATTN_DECODE_MIN_KEYS_ENV`]: a function of the sequence alone (batch
/// invariance), fixed for the process.
pub const ATTN_DECODE_SPLITS_ENV: &str = "PORTER_ATTN_DECODE_SPLITS";
/// Environment variable: `off` keeps the V2 decode kernel's PDL wait first also after
/// [`CudaKernels::append_attention`]'s append (`on`, the default: the early loads of
/// attention_decode.cu's `ADEC_PRE`); read once a process. For A/B runs.
pub const ATTN_DECODE_EARLY_ENV: &str = "PORTER_ATTN_DECODE_EARLY";
/// Environment variable: the fewest keys of a split of the mma decode kernel, a power of two
/// in 64..=65536 (default `DEC_MIN_KEYS`).
pub const ATTN_DECODE_MIN_KEYS_ENV: &str = "PORTER_ATTN_DECODE_MIN_KEYS";
/// Default of [`ATTN_DECODE_SPLITS_ENV`]: 32k keys → 64 splits of 512 (128 blocks at 2 KV
/// heads, one wave on an H200's 132 SMs).
pub const DEC_SPLITS: usize = 64;
/// Default of [`ATTN_DECODE_MIN_KEYS_ENV`]: a split of 256 keys reads 256 KiB of K/V per KV
/// head at head_dim 256 against 8 KiB of partials (group 8), so the combine stays cheap.
pub const DEC_MIN_KEYS: usize = 256;
/// Most splits of a sequence (`ADEC_MAXZ`).
const DEC_MAXZ: usize = 256;
/// Threads of a combine block (`ADEC_CTHREADS`).
const DEC_CTHREADS: u32 = 256;
/// Keys of a warp tile (`ADEC_BN`).
const DEC_BN: usize = 16;
/// Head dims with a decode kernel (`_d<DP>`, D == DP).
const DEC_DIMS: [usize; 3] = [64, 128, 256];

/// The decode kernel of [`CudaKernels::attention`] ([`ATTN_DECODE_ENV`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum AttnDecode {
    /// The CUDA-core split-K kernels of attention.cu (128 keys a split).
    Legacy,
    /// attention_decode.cu, the deepest ring that fits (3 stages, else 2).
    Mma,
    /// attention_decode.cu with 2-stage rings.
    Mma2,
    /// attention_decode.cu with 3-stage rings (2 where 3 do not fit).
    Mma3,
    /// attention_decode.cu with 2-warp blocks and 3-stage rings (half the shared memory: two
    /// blocks an SM at head_dim 256), 4 warps where that does not fit.
    MmaW2,
    /// attention_decode.cu's V2 kernel (`_v2`: Q by cp.async, two tiles of table
    /// lookahead; 3 stages, 4 warps, else 2 stages of V1) and the V2 combine (`combine2`).
    #[default]
    Mma4,
    /// [`AttnDecode::Mma4`] with 2-warp blocks (two blocks an SM at head_dim 256), 4 warps
    /// where that does not fit.
    Mma4W2,
    /// [`AttnDecode::Mma4`] with the combine launched after the split kernel completes (no
    /// programmatic dependent launch): the A/B of PDL.
    Mma4S,
    /// [`AttnDecode::Mma4`] with its 8-item form where a block has at most 8 items
    /// (batch-1 decode at GQA group 8): S^T = K·Q^T and O^T += V^T·P^T, no padded MMA rows.
    /// Opt-in: passes on an H100 and is within 1 % of `Mma4` there (session 22: 30.3 against
    /// 30.5 µs for the split kernel at 32k keys, batch 1).
    Mma4N8,
}

thread_local! {
    static FORCED: Cell<Option<AttnDecode>> = const { Cell::new(None) };
    static FORCED_SPLITS: Cell<Option<(u32, u32)>> = const { Cell::new(None) };
    static TIMING: Cell<DecodeTiming> = const { Cell::new(DecodeTiming::PerCall) };
    static SCRATCH: std::cell::RefCell<Option<CudaSlice<f32>>> = const { std::cell::RefCell::new(None) };
    static PRE_FORCED: Cell<bool> = const { Cell::new(false) };
}

/// [`ATTN_DECODE_EARLY_ENV`] of this process.
fn early_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::cuda::env::env_on_off(ATTN_DECODE_EARLY_ENV, true))
}

/// Lets the calling thread's decode calls through [`CudaKernels::attention`] read early (as
/// after [`CudaKernels::append_attention`]'s append), for timing loops whose launch before
/// each call writes neither Q nor the pools. For timing tests only.
#[doc(hidden)]
pub fn force_attn_decode_early(on: bool) {
    PRE_FORCED.with(|c| c.set(on));
}

/// What a decode call of the calling thread runs, for timing the parts apart
/// ([`force_attn_decode_timing`]).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DecodeTiming {
    /// As the model runs it: the partial scratch allocated per call, then both kernels.
    #[default]
    PerCall,
    /// The partial scratch kept across calls of this thread (allocated once, grown when too
    /// small): the kernels without the allocation.
    Prealloc,
    /// As `Prealloc`, without the combine launch: the split kernel alone (the rows that
    /// span several splits are then left unwritten: no output to check).
    SplitOnly,
}

/// Sets how the calling thread's decode calls run ([`DecodeTiming`]); back to
/// `PerCall` frees the kept scratch. For timing tests only.
#[doc(hidden)]
pub fn force_attn_decode_timing(t: DecodeTiming) {
    TIMING.with(|c| c.set(t));
    if t == DecodeTiming::PerCall {
        SCRATCH.with(|s| s.borrow_mut().take());
    }
}

/// Overrides [`ATTN_DECODE_SPLITS_ENV`] and [`ATTN_DECODE_MIN_KEYS_ENV`] for the calling
/// thread: `Some((splits, min_keys))`, powers of two in their ranges (others are clamped
/// to them); `None`: back to the environment. For A/B timing in one process.
#[doc(hidden)]
pub fn force_attn_decode_splits(splits: Option<(usize, usize)>) {
    let log2 = |n: usize, lo: usize, hi: usize| n.clamp(lo, hi).next_power_of_two().min(hi).trailing_zeros();
    FORCED_SPLITS.with(|f| f.set(splits.map(|(s, m)| (log2(s, 1, DEC_MAXZ), log2(m, 64, 65_536)))));
}

/// Overrides [`ATTN_DECODE_ENV`] for the calling thread (`None`: back to the environment).
/// For tests and A/B timing in one process.
#[doc(hidden)]
pub fn force_attn_decode(kernel: Option<AttnDecode>) {
    FORCED.with(|f| f.set(kernel));
}

/// [`ATTN_DECODE_ENV`]'s value `v` (`Err`: the value, unknown).
fn decode_from(v: Option<&std::ffi::OsStr>) -> std::result::Result<AttnDecode, String> {
    let Some(v) = v else { return Ok(AttnDecode::Mma4) };
    match v.to_string_lossy().trim().to_ascii_lowercase().as_str() {
        "legacy" => Ok(AttnDecode::Legacy),
        "mma" => Ok(AttnDecode::Mma),
        "mma2" => Ok(AttnDecode::Mma2),
        "mma3" => Ok(AttnDecode::Mma3),
        "mmaw2" => Ok(AttnDecode::MmaW2),
        "" | "mma4" => Ok(AttnDecode::Mma4),
        "mma4w2" => Ok(AttnDecode::Mma4W2),
        "mma4s" => Ok(AttnDecode::Mma4S),
        "mma4-n8" => Ok(AttnDecode::Mma4N8),
        _ => Err(v.to_string_lossy().into_owned()),
    }
}

/// The decode kernel in force: the thread's override, else the environment (warning once
/// about a value it does not know).
fn decode_choice() -> AttnDecode {
    if let Some(k) = FORCED.with(Cell::get) {
        return k;
    }
    let parsed = decode_from(std::env::var_os(ATTN_DECODE_ENV).as_deref());
    let words = ["legacy", "mma", "mma2", "mma3", "mmaw2", "mma4", "mma4w2", "mma4s", "mma4-n8"];
    crate::cuda::env::one_of_or(ATTN_DECODE_ENV, parsed, &words, "mma4", AttnDecode::Mma4)
}

/// Whether [`ATTN_DECODE_ENV`] selects a tensor-core decode kernel (its module is then
/// compiled in the background when the kernels open).
pub(crate) fn decode_env_selected() -> bool {
    !matches!(decode_from(std::env::var_os(ATTN_DECODE_ENV).as_deref()), Ok(AttnDecode::Legacy))
}

/// log2 of a power-of-two environment value in `lo..=hi` (`default` when unset or invalid,
/// with a warning once per variable).
fn pow2_env(var: &str, lo: usize, hi: usize, default: usize) -> u32 {
    crate::cuda::env_count(
        var,
        |n| n.is_power_of_two() && (lo..=hi).contains(&n),
        &format!("a power of two in {lo}..={hi}"),
    )
    .unwrap_or(default)
    .trailing_zeros()
}

/// log2 of the split size of a sequence of `ctx` keys (`adec_ks_log2`).
#[cfg(test)]
fn ks_log2(ctx: u64, ks_min_log2: u32, nsplit_log2: u32) -> u32 {
    let per = ctx.div_ceil(1u64 << nsplit_log2);
    let mut l = 0u32;
    while l < 31 && (1u64 << l) < per {
        l += 1;
    }
    l.max(ks_min_log2).min(31)
}

/// Splits a launch provides per sequence: enough for any sequence of at most `width` keys.
pub(super) fn grid_splits(width: usize, ks_min_log2: u32, nsplit_log2: u32) -> usize {
    (1usize << nsplit_log2).min(width.div_ceil(1usize << ks_min_log2)).max(1)
}

/// Dynamic shared memory of `attention_decode_<T>_d<dp>_s<st>` (`nw` warps, 16-bit T): the Q
/// tile, then the warps' K/V rings, reused by the merge (per warp 16 rows of `dp + 8` f32 and
/// (m, l)).
fn smem(dp: usize, st: usize, nw: usize) -> usize {
    let rings = nw * st * 2 * DEC_BN * dp * 2;
    let merge = nw * 16 * (dp + 8) * 4 + nw * 16 * 2 * 4;
    16 * dp * 2 + rings.max(merge)
}

/// A decode launch: the kernel, its ring depth's shared memory and the split parameters.
pub(super) struct DecodePlan {
    name: String,
    combine: String,
    warps: u32,
    smem: usize,
    /// The V2 combine (`combine2`, grid y = head_dim / 64).
    v2: bool,
    /// The V2 combine launched as a programmatic dependent of the split kernel (sm_90+).
    pdl: bool,
    /// The V2 kernel's 8-item form where a block has at most 8 items (kernel flag bit 0).
    n8: bool,
    ks_min_log2: u32,
    nsplit_log2: u32,
}

impl CudaKernels {
    /// The decode plan of a launch of `T` (`None`: another path): see [`ATTN_DECODE_ENV`].
    /// `aligned`: both pools 16-byte aligned.
    pub(super) fn decode_plan<T: CudaFloat>(
        &self,
        head_dim: usize,
        max_q_len: usize,
        mode: AttnMode,
        tag: &str,
        aligned: bool,
    ) -> Option<DecodePlan> {
        let choice = decode_choice();
        if choice == AttnDecode::Legacy || mode == AttnMode::Invariant || max_q_len > ATT_SPLIT_Q {
            return None;
        }
        let caps = self.caps();
        if std::mem::size_of::<T>() != 2 || !caps.tensor_cores() || !tag.is_empty() || !aligned {
            return None;
        }
        if !DEC_DIMS.contains(&head_dim) {
            return None;
        }
        // (stages, warps) in order of preference.
        // (stages, warps, V2 kernel) in order of preference.
        let order: &[(usize, usize, bool)] = match choice {
            AttnDecode::Mma2 => &[(2, 4, false)],
            AttnDecode::MmaW2 => &[(3, 2, false), (3, 4, false), (2, 4, false)],
            AttnDecode::Mma4 => &[(3, 4, true), (2, 4, false)],
            AttnDecode::Mma4W2 => &[(3, 2, true), (3, 4, true), (2, 4, false)],
            AttnDecode::Mma4S | AttnDecode::Mma4N8 => &[(3, 4, true), (2, 4, false)],
            _ => &[(3, 4, false), (2, 4, false)],
        };
        let (st, nw, v2k) = order.iter().copied().find(|&(st, nw, _)| smem(head_dim, st, nw) <= caps.smem_limit())?;
        let v2 = matches!(choice, AttnDecode::Mma4 | AttnDecode::Mma4W2 | AttnDecode::Mma4S | AttnDecode::Mma4N8);
        // PDL needs the V2 split kernel's trigger (else it only helps at block exit) and sm_90.
        let pdl = v2 && v2k && choice != AttnDecode::Mma4S && caps.major >= 9;
        let (nsplit_log2, ks_min_log2) = FORCED_SPLITS.with(Cell::get).unwrap_or_else(|| {
            (
                pow2_env(ATTN_DECODE_SPLITS_ENV, 1, DEC_MAXZ, DEC_SPLITS),
                pow2_env(ATTN_DECODE_MIN_KEYS_ENV, 64, 65_536, DEC_MIN_KEYS),
            )
        });
        Some(DecodePlan {
            name: format!(
                "attention_decode_{}_d{head_dim}_s{st}{}{}",
                T::NAME,
                if nw == 2 { "_w2" } else { "" },
                if v2k { "_v2" } else { "" }
            ),
            combine: format!("attention_decode_combine{}_{}_d{head_dim}", if v2 { "2" } else { "" }, T::NAME),
            warps: nw as u32,
            smem: smem(head_dim, st, nw),
            v2,
            pdl,
            n8: choice == AttnDecode::Mma4N8,
            ks_min_log2,
            nsplit_log2,
        })
    }

    /// The decode kernel [`CudaKernels::attention`] runs for a launch of `T` with `head_dim`,
    /// `max_q_len` and `mode` over aligned pools of `T` on this device (`None`: another
    /// path). For tests and benchmarks that report which kernel they timed.
    #[doc(hidden)]
    pub fn attention_decode_kernel<T: CudaFloat>(
        &self,
        head_dim: usize,
        max_q_len: usize,
        mode: AttnMode,
    ) -> Option<String> {
        self.decode_plan::<T>(head_dim, max_q_len, mode, "", true).map(|p| p.name)
    }

    /// [`CudaKernels::attention`] on the tensor-core decode kernel (then its combine when a
    /// sequence may span several splits); the arguments are checked by the caller and
    /// `decode_plan` chose `p` (so `max_q_len <= 8`, `head_dim` is the kernel's). `gate`
    /// (`[t, heads, head_dim]`, checked): the output gate, applied by whichever kernel writes
    /// a row (`out = round(o · round(σ(gate)))`, as [`CudaKernels::sigmoid_gate_mul`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_decode<T: CudaFloat>(
        &self,
        q: &impl DevicePtr<T>,
        pools: &Pools,
        block_tables: &impl DevicePtr<u32>,
        spans: &impl DevicePtr<u32>,
        out: &mut impl DevicePtrMut<T>,
        gate: Option<&impl DevicePtr<T>>,
        a: &Args,
        p: &DecodePlan,
    ) -> Result<()> {
        let (heads, head_dim) = (a.heads, a.head_dim);
        let group = heads / a.kv_heads;
        let qcap = a.max_q_len.min(ATT_SPLIT_Q);
        let mtiles = prod(&[qcap, group])?.div_ceil(16);
        let width = prod(&[a.pg.max_blocks as usize, 1 << a.pg.bs_log2])?;
        let nzg = grid_splits(width, p.ks_min_log2, p.nsplit_log2);
        let seq_heads = prod(&[a.n_seqs, a.kv_heads])?;
        let f = self.function_smem(&ATTENTION_DECODE, &p.name, p.smem)?;
        let cfg = LaunchConfig {
            grid_dim: (u32_of("decode blocks", prod(&[nzg, mtiles])?)?, u32_of("n_seqs * kv_heads", seq_heads)?, 1),
            block_dim: (32 * p.warps, 1, 1),
            shared_mem_bytes: u32_of("shared memory", p.smem)?,
        };
        let (t32, h32, kvh32) = (u32_of("t", a.t)?, u32_of("heads", heads)?, u32_of("kv_heads", a.kv_heads)?);
        let (win32, qc32, nz32) = (window_arg(a.window), qcap as u32, nzg as u32);
        let Paged { max_blocks, bs_log2, n_slots } = a.pg;
        let timing = TIMING.with(Cell::get);
        let part: Option<CudaSlice<f32>> = if nzg > 1 {
            let len = prod(&[a.n_seqs, qcap, heads, nzg, head_dim + 4])?;
            let kept = match timing {
                DecodeTiming::PerCall => None,
                _ => SCRATCH.with(|c| c.borrow_mut().take()).filter(|b| b.len() >= len),
            };
            match kept {
                Some(b) => Some(b),
                // SAFETY: f32 scratch; the combine reads only the partials the decode kernel
                // wrote (the splits of a row that spans several).
                None => Some(unsafe { self.stream.alloc::<f32>(len) }?),
            }
        } else {
            None
        };
        let s = &*self.stream;
        let (po, _go) = out.device_ptr_mut(s);
        let (ppart, gpart) = crate::cuda::opt_ptr(part.as_ref(), s);
        let (pgate, _gg) = crate::cuda::opt_ptr(gate, s);
        let (ksl, nsl) = (p.ks_min_log2, p.nsplit_log2);
        // SAFETY: arguments match `attention_decode_<T>_d<DP>_s<ST>[_w2]` (attention_decode.cu,
        // 32 · NW threads, D == DP, 16-byte aligned pools of T: `decode_plan`); `q`, `out`, `spans`,
        // `block_tables` have the lengths checked by `attention` and the pools `n_slots` rows
        // (no slot >= n_slots, table entry beyond `max_blocks` or row >= t is touched); the
        // partial buffer holds `n_seqs * qcap * heads * nzg * (head_dim + 4)` f32 when nzg > 1
        // (null otherwise and never written: every row lies in split 0); the gate, null or as
        // long as `out` (checked by the caller); the dynamic shared memory is the size the
        // kernel carves, within the device's opt-in limit.
        // Kernel: `attention_decode_<T>_d<DP>_s<ST>(const T* q, const T* kpool, const T* vpool,
        // const u32* tables, const u32* spans, T* out, float* part, const T* gate, u32 t,
        // u32 heads, u32 kvh, float scale, u32 window, u32 max_blocks, u32 bs_log2, u32 n_slots,
        // u32 qcap, u32 nzg, u32 ks_min_log2, u32 nsplit_log2, u32 flags)`.
        // Bit 0: the 8-item form; bit 1 (ADEC_PRE): early loads, V2 after the append only
        // (or when a timing test forces them: its launch before is the last call's combine).
        let pre = p.v2 && ((a.after_append && early_on()) || PRE_FORCED.with(Cell::get));
        let flags = u32::from(p.n8) | (u32::from(pre) << 1);
        unsafe {
            launch_fn!(
                self,
                f,
                cfg,
                [
                    ptr(q),
                    pools.k,
                    pools.v,
                    ptr(block_tables),
                    ptr(spans),
                    po,
                    ppart,
                    pgate,
                    t32,
                    h32,
                    kvh32,
                    a.scale,
                    win32,
                    max_blocks,
                    bs_log2,
                    n_slots,
                    qc32,
                    nz32,
                    ksl,
                    nsl,
                    flags
                ]
            )
        }?;
        if let Some(pt) = part.as_ref().filter(|_| timing != DecodeTiming::SplitOnly) {
            let grid_dim = if p.v2 {
                (u32_of("qcap * heads", qcap * heads)?, (head_dim / 64) as u32, u32_of("n_seqs", a.n_seqs)?)
            } else {
                (u32_of("qcap * heads", qcap * heads)?, u32_of("n_seqs", a.n_seqs)?, 1)
            };
            let cfg = LaunchConfig { grid_dim, block_dim: (DEC_CTHREADS, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: arguments match `attention_decode_combine_<T>_d<DP>`; the partial buffer,
            // `out` and the gate (null or as long as `out`) have the sizes above (splits < nzg,
            // rows < t only; combine2: dims of its 64-dim chunk blockIdx.y < head_dim / 64,
            // head_dim a multiple of 64).
            // Kernel: `attention_decode_combine_<T>_d<DP>(const float* part, const u32* spans,
            // T* out, const T* gate, u32 t, u32 heads, u32 window, u32 qcap, u32 nzg,
            // u32 ks_min_log2, u32 nsplit_log2)`.
            if p.pdl {
                let f = self.function(&ATTENTION_DECODE, &p.combine)?;
                let (pspans, _gs) = spans.device_ptr(s);
                let (ppt, _gpt) = pt.device_ptr(s);
                let mut args = ([ppt, pspans, po, pgate], [t32, h32, win32, qc32, nz32, ksl, nsl]);
                let ([a0, a1, a2, a3], r) = (&mut args.0, &mut args.1);
                let [r0, r1, r2, r3, r4, r5, r6] = r;
                let mut params: [*mut c_void; 11] = [
                    (a0 as *mut u64).cast(),
                    (a1 as *mut u64).cast(),
                    (a2 as *mut u64).cast(),
                    (a3 as *mut u64).cast(),
                    (r0 as *mut u32).cast(),
                    (r1 as *mut u32).cast(),
                    (r2 as *mut u32).cast(),
                    (r3 as *mut u32).cast(),
                    (r4 as *mut u32).cast(),
                    (r5 as *mut u32).cast(),
                    (r6 as *mut u32).cast(),
                ];
                for _ in 0..self.launches(&f, &cfg) {
                    // SAFETY: as above; `params` points at the 11 parameters of the combine,
                    // in order, alive across the call (the driver copies them at launch). The
                    // combine waits (griddepcontrol.wait) for the split grid before its first
                    // partial read and before it can complete.
                    unsafe { self.launch_pdl(&f, &cfg, &mut params) }?;
                }
            } else {
                // SAFETY: see above.
                unsafe {
                    launch!(
                        self,
                        ATTENTION_DECODE,
                        p.combine.clone(),
                        cfg,
                        [ptr(pt), ptr(spans), po, pgate, t32, h32, win32, qc32, nz32, ksl, nsl]
                    )
                }?;
            }
        }
        drop(gpart);
        if timing != DecodeTiming::PerCall {
            SCRATCH.with(|c| *c.borrow_mut() = part);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_env_values() {
        assert_eq!(decode_from(None), Ok(AttnDecode::Mma4));
        assert_eq!(decode_from(Some(" MMA ".as_ref())), Ok(AttnDecode::Mma));
        assert_eq!(decode_from(Some("mma2".as_ref())), Ok(AttnDecode::Mma2));
        assert_eq!(decode_from(Some("mma4".as_ref())), Ok(AttnDecode::Mma4));
        assert_eq!(decode_from(Some("Mma4W2".as_ref())), Ok(AttnDecode::Mma4W2));
        assert_eq!(decode_from(Some("legacy".as_ref())), Ok(AttnDecode::Legacy));
        assert!(decode_from(Some("fast".as_ref())).is_err());
    }

    #[test]
    fn splits_follow_the_sequence_length() {
        let (kmin, ns) = (DEC_MIN_KEYS.trailing_zeros(), DEC_SPLITS.trailing_zeros());
        // 32k keys: 64 splits of 512; 8k and 4k: 256-key splits (the minimum); 1 key: one.
        assert_eq!(ks_log2(32_768, kmin, ns), 9);
        assert_eq!(ks_log2(8_192, kmin, ns), 8);
        assert_eq!(ks_log2(4_096, kmin, ns), 8);
        assert_eq!(ks_log2(1, kmin, ns), 8);
        assert_eq!(ks_log2(u64::from(u32::MAX) + 9, kmin, ns), 27);
        assert_eq!(ks_log2(u64::from(u32::MAX) + 9, kmin, 0), 31);
        // The grid's splits cover every sequence that fits the table.
        for width in [1usize, 16, 255, 256, 257, 4_112, 32_768, 40_000, 1 << 20] {
            let nz = grid_splits(width, kmin, ns);
            for ctx in [1, width / 3 + 1, width / 2 + 1, width] {
                let ks = 1usize << ks_log2(ctx as u64, kmin, ns);
                assert!(ctx.div_ceil(ks) <= nz, "width {width} ctx {ctx}: {} splits > {nz}", ctx.div_ceil(ks));
            }
        }
    }

    #[test]
    fn decode_rings_fit() {
        // H200 (227 KiB): 3 stages at every head dim, two 2-warp blocks an SM at 256; 99 KiB
        // (sm_86 / sm_89): 2 stages at 128.
        for dp in DEC_DIMS {
            assert!(smem(dp, 3, 4) <= 232_448);
        }
        assert_eq!(smem(256, 3, 4), 8_192 + 196_608);
        assert!(2 * smem(256, 3, 2) <= 232_448);
        assert!(smem(128, 2, 4) <= 101_376 && smem(128, 3, 4) > 101_376);
    }
}

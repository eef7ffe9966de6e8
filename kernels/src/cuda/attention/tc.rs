//! The tensor-core prefill paths of [`CudaKernels::attention`] (16-bit storage, `head_dim %
//! 16 == 0`, `max_q_len >= 16`, sm_80+): the wmma kernels (kernels/cuda/attention_tc.cu, S
//! and P through shared memory) and the raw mma.sync kernels (kernels/cuda/attention_mma.cu,
//! FlashAttention-2 with S, P and O in registers), which one chosen by [`ATTN_TC_ENV`] or
//! [`AttnMode::Tc`], and the shared-memory plans that decide whether a kernel fits the device.

use super::{window_arg, Args, AttnMode, Paged, Pools};
use crate::cuda::{u32_of, CudaFloat, CudaKernels, Result, ATTENTION, ATTENTION_MMA, ATTENTION_WGMMA};
use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};

/// Environment variable choosing the tensor-core prefill kernel of [`AttnMode::Fast`]: `mma`
/// (raw mma.sync, attention_mma.cu, the first of its tile shapes that fits the device),
/// `mma8` / `mma4` (its 8-warp, 64-key or 4-warp, 32-key tiles first), `mma1` (8-warp tiles
/// with P rounded to one `T` term, one P·V MMA instead of two: A/B and parity runs only),
/// `mma2` (head_dim 256: 8 warps in pairs that share 32 rows and split head_dim, 32-key tiles),
/// `wgmma` (Hopper warpgroup MMAs, attention_wgmma.cu: sm_90, padded head_dim 128 / 256, pools
/// of the model dtype; elsewhere `mma`), `wmma` (the wmma kernel, attention_tc.cu). Unset: [`ATTN_TC_DEFAULT`]; another value warns once on stderr
/// and means the default. Read on every call. Where the chosen kernel does not fit the
/// device's shared memory the other tensor-core kernels are tried, then the CUDA cores.
pub const ATTN_TC_ENV: &str = "PORTER_ATTN_TC";

/// A tensor-core prefill kernel of [`CudaKernels::attention`] ([`ATTN_TC_ENV`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttnTc {
    /// wmma 16×16×16, S and P staged in shared memory (`attention_tc_*`): the baseline.
    Wmma,
    /// Raw `mma.sync.m16n8k16`, S / P / O in registers (`attention_mma_*`), the tile shapes
    /// in the default order (8 warps and 64-key tiles first).
    Mma,
    /// [`AttnTc::Mma`] with the 8-warp, 64-key tiles first.
    MmaW8,
    /// [`AttnTc::Mma`] with the 4-warp, 32-key tiles first (two blocks an SM at head_dim 256).
    MmaW4,
    /// The 8-warp mma kernel with P rounded to `T` once (one P·V MMA, not P_hi + P_lo): to
    /// measure what the split costs and whether parity holds without it. Pools of the model
    /// dtype only (a quantized pool runs [`AttnTc::Mma`]).
    MmaP1,
    /// At padded head_dim 256: warp pairs sharing 32 rows, each warp holding O for half of
    /// head_dim (the S halves summed through shared memory), so that each K / V fragment
    /// serves 32 rows (less shared-memory traffic per MMA); 8 warps, 32-key tiles. Pools of
    /// the model dtype only; elsewhere [`AttnTc::Mma`].
    MmaX2,
    /// Hopper (sm_90, compiled for `sm_90a`): `wgmma.mma_async` in two warpgroups of 64 rows
    /// (`attention_wgmma_*`), S = Q·Kᵀ and P·V with K, V (and Q) read by the tensor cores from
    /// shared memory, P rounded to `T` once. Padded head_dim 128 / 256 and pools of the model
    /// dtype only; elsewhere [`AttnTc::Mma`].
    Wgmma,
}

/// The kernel of [`AttnMode::Fast`] when [`ATTN_TC_ENV`] is unset: the wgmma kernel on an
/// sm_90 device (head_dim 128 / 256, pools of the model dtype), 293 TFLOP/s at 4k tokens and
/// head_dim 256 on an H200 against 111 for the 8-warp mma.sync kernel and 50 for wmma; prefill
/// 32k 40.2k against 29.6k tok/s end to end (docs/benchmarks.md, session 11). Where it does not
/// apply, the plan takes the mma.sync kernels, then wmma, then the CUDA cores.
pub const ATTN_TC_DEFAULT: AttnTc = AttnTc::Wgmma;

/// Smallest `max_q_len` that takes a tensor-core path.
const ATC_MIN_Q: usize = 16;
/// Padded head dims with tensor-core kernels (`_d<DP>`).
const ATC_DIMS: [usize; 3] = [64, 128, 256];
/// Threads of a wmma attention block (`ATC_THREADS`).
const ATC_THREADS: usize = 128;
/// Warps of a wmma attention block (`ATC_WARPS`).
const ATC_WARPS: usize = 4;
/// Items (query row, head) per wmma attention block (`ATC_BM`).
const ATC_BM: usize = 64;
/// Keys per wmma K/V tile (`ATC_BN`).
const ATC_BN: usize = 64;
/// f32 row stride of a warp's S tile (`ATC_SS`).
const ATC_SS: usize = 72;
/// Row stride of a warp's P tile in elements (`ATC_PSS`).
const ATC_PSS: usize = 72;
/// (warps, keys per tile) of the mma kernels attention_mma.cu instantiates (`_w<NW>n<BN>`),
/// in the default order of preference.
const MMA_TILES: [(usize, usize); 2] = [(8, 64), (4, 32)];
/// The 4-warp, 32-key mma tiles and the warp-pair form exist at this padded head dim only
/// (attention_mma.cu).
const MMA_W4_DP: usize = 256;

/// [`ATTN_TC_ENV`]'s value `v` (`Err`: the value, unknown).
fn tc_from(v: Option<&std::ffi::OsStr>) -> std::result::Result<AttnTc, String> {
    let Some(v) = v else { return Ok(ATTN_TC_DEFAULT) };
    match v.to_string_lossy().trim().to_ascii_lowercase().as_str() {
        "" => Ok(ATTN_TC_DEFAULT),
        "wmma" => Ok(AttnTc::Wmma),
        "mma" => Ok(AttnTc::Mma),
        "mma8" => Ok(AttnTc::MmaW8),
        "mma4" => Ok(AttnTc::MmaW4),
        "mma1" => Ok(AttnTc::MmaP1),
        "mma2" => Ok(AttnTc::MmaX2),
        "wgmma" => Ok(AttnTc::Wgmma),
        _ => Err(v.to_string_lossy().into_owned()),
    }
}

/// [`tc_from`] for the process environment, warning once about a value it does not know.
fn tc_env() -> AttnTc {
    let parsed = tc_from(std::env::var_os(ATTN_TC_ENV).as_deref());
    let words = ["wmma", "mma", "mma8", "mma4", "mma1", "mma2", "wgmma"];
    crate::cuda::env::one_of_or(ATTN_TC_ENV, parsed, &words, format_args!("{ATTN_TC_DEFAULT:?}"), ATTN_TC_DEFAULT)
}

/// A tensor-core kernel's shape: the wmma kernel, or the mma kernel with `warps` warps
/// and `bn`-key tiles, P split in two terms (`p1`: one), one warp a 16-row group (`x2`: two
/// warps a 32-row group, head_dim split between them), or the wgmma kernel (sm_90a).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Wmma,
    Mma { warps: usize, bn: usize, p1: bool, x2: bool },
    Wgmma,
}

/// The mma kernels' 4-warp, 32-key shape (P split).
const MMA_W4: Shape = Shape::Mma { warps: 4, bn: 32, p1: false, x2: false };
/// The mma kernels' 8-warp, 64-key shape (P split).
const MMA_W8: Shape = Shape::Mma { warps: 8, bn: 64, p1: false, x2: false };
/// The single-MMA P form (8 warps, 64 keys; pools of T).
const MMA_P1: Shape = Shape::Mma { warps: 8, bn: 64, p1: true, x2: false };
/// Warp pairs splitting head_dim (8 warps, 32 keys; padded head_dim 256, pools of T).
const MMA_X2: Shape = Shape::Mma { warps: 8, bn: 32, p1: false, x2: true };
/// Items per wgmma block (`BM`: two warpgroups of 64 rows).
const WG_BM: usize = 128;
/// Keys per wgmma K/V tile (`BN`).
const WG_BN: usize = 64;
/// Padded head dims with wgmma kernels (`attention_wgmma_<T>_d<DP>`).
const WG_DIMS: [usize; 2] = [128, 256];

impl Shape {
    /// Items (query row, head) per block.
    fn bm(self) -> usize {
        match self {
            Shape::Wmma => ATC_BM,
            // x2: 32-row groups of two warps, the same 16 rows a warp.
            Shape::Mma { warps, .. } => 16 * warps,
            Shape::Wgmma => WG_BM,
        }
    }

    /// Threads per block.
    fn threads(self) -> usize {
        match self {
            Shape::Wmma => ATC_THREADS,
            Shape::Mma { warps, .. } => 32 * warps,
            Shape::Wgmma => 256,
        }
    }

    /// Dynamic shared memory in bytes at padded head dim `dp`, storage type size `esz`.
    /// wmma: Q tile, two K and two V tiles of `dp + 8` elements a row, per warp the f32 S
    /// tile, the two P tiles (P = P_hi + P_lo) and 16 row factors, two key-slot tables.
    /// mma: Q tile, two K and two V tiles of `dp` elements a row (swizzled, no padding),
    /// two key-slot tables; `x2`: each warp's partial S (32 rows × `bn` f32). wgmma: as mma
    /// (128 rows, 64-key tiles) and 1024 bytes of slack to align the tiles to 1024 bytes.
    fn smem(self, esz: usize, dp: usize) -> usize {
        match self {
            Shape::Wmma => {
                (ATC_BM + 4 * ATC_BN) * (dp + 8) * esz
                    + ATC_WARPS * 16 * (ATC_SS * 4 + 2 * ATC_PSS * esz + 4)
                    + 2 * ATC_BN * 4
            }
            Shape::Mma { warps, bn, x2, .. } => {
                (16 * warps + 4 * bn) * dp * esz + 2 * bn * 4 + if x2 { warps * 32 * bn * 4 } else { 0 }
            }
            Shape::Wgmma => (WG_BM + 4 * WG_BN) * dp * esz + 2 * WG_BN * 4 + 1024,
        }
    }

    /// The kernel's entry point for storage type `name`, pool tag `tag`, padded head dim `dp`.
    fn kernel(self, name: &str, tag: &str, dp: usize) -> String {
        match self {
            Shape::Wmma => format!("attention_tc_{name}{tag}_d{dp}"),
            Shape::Mma { warps, bn, p1, x2 } => {
                let form = if p1 {
                    "_p1"
                } else if x2 {
                    "_x2"
                } else {
                    ""
                };
                format!("attention_mma_{name}{tag}_d{dp}_w{warps}n{bn}{form}")
            }
            Shape::Wgmma => format!("attention_wgmma_{name}{tag}_d{dp}"),
        }
    }
}

/// The shapes to try for `kernel`, in order: its own first, then the other tensor-core ones.
fn shapes(kernel: AttnTc) -> Vec<Shape> {
    let [a, b] = MMA_TILES.map(|(warps, bn)| Shape::Mma { warps, bn, p1: false, x2: false });
    match kernel {
        AttnTc::Wmma => vec![Shape::Wmma, a, b],
        AttnTc::Mma => vec![a, b, Shape::Wmma],
        AttnTc::MmaW8 => vec![MMA_W8, MMA_W4, Shape::Wmma],
        AttnTc::MmaW4 => vec![MMA_W4, MMA_W8, Shape::Wmma],
        AttnTc::MmaP1 => vec![MMA_P1, a, b, Shape::Wmma],
        AttnTc::MmaX2 => vec![MMA_X2, a, b, Shape::Wmma],
        AttnTc::Wgmma => vec![Shape::Wgmma, a, b, Shape::Wmma],
    }
}

/// The tensor-core plan of a launch: (shape, padded head dim, shared memory bytes), or
/// `None` for the CUDA-core kernels. Needs a 16-bit type (`esz == 2`), `head_dim % 16 ==
/// 0`, `max_q_len >= ATC_MIN_Q`, tensor cores (`tc`: sm_80+, not forced to the fallback)
/// and a shape within `limit` bytes of shared memory that exists for the padded head dim
/// and the pools (`quant`: quantized pools, which have no `_p1` / `_x2` / wgmma kernels);
/// the wgmma kernels also need `hopper` (an sm_90 device, not forced to the fallback).
#[allow(clippy::too_many_arguments)]
fn plan(
    esz: usize,
    head_dim: usize,
    max_q_len: usize,
    tc: bool,
    hopper: bool,
    limit: usize,
    kernel: AttnTc,
    quant: bool,
) -> Option<(Shape, usize, usize)> {
    if esz != 2 || !head_dim.is_multiple_of(16) || max_q_len < ATC_MIN_Q || !tc {
        return None;
    }
    let dp = ATC_DIMS.iter().copied().find(|&d| d >= head_dim)?;
    shapes(kernel)
        .into_iter()
        .filter(|&s| (s != MMA_W4 && s != MMA_X2) || dp == MMA_W4_DP)
        .filter(|&s| !quant || (s != MMA_P1 && s != MMA_X2))
        .filter(|&s| s != Shape::Wgmma || (hopper && !quant && WG_DIMS.contains(&dp)))
        .map(|s| (s, dp, s.smem(esz, dp)))
        .find(|&(_, _, smem)| smem <= limit)
}

/// A chosen tensor-core launch: its entry point, block size, items per block, shared memory.
pub(super) struct TcPlan {
    name: String,
    threads: usize,
    bm: usize,
    smem: usize,
}

impl CudaKernels {
    /// The tensor-core plan of a launch in `mode` over pools tagged `tag` (`None`: the
    /// CUDA-core kernels): [`AttnMode::Invariant`] never; [`AttnMode::Fast`] the kernel
    /// of [`ATTN_TC_ENV`]; [`AttnMode::Tc`] the one given.
    pub(super) fn tc_plan<T: CudaFloat>(
        &self,
        head_dim: usize,
        max_q_len: usize,
        mode: AttnMode,
        tag: &str,
    ) -> Option<TcPlan> {
        let kernel = match mode {
            AttnMode::Invariant => return None,
            AttnMode::Fast => tc_env(),
            AttnMode::Tc(k) => k,
        };
        let caps = self.caps();
        let (esz, tc, limit) = (std::mem::size_of::<T>(), caps.tensor_cores(), caps.smem_limit());
        let hopper = caps.sm90a();
        let (shape, dp, smem) = plan(esz, head_dim, max_q_len, tc, hopper, limit, kernel, !tag.is_empty())?;
        Some(TcPlan { name: shape.kernel(T::NAME, tag, dp), threads: shape.threads(), bm: shape.bm(), smem })
    }

    /// The entry point [`CudaKernels::attention`] runs for a launch of `T` with `head_dim`,
    /// `max_q_len` and `mode` on this device, if a tensor-core one (`None`: the CUDA-core
    /// kernels). For tests and benchmarks that report which kernel they timed.
    #[doc(hidden)]
    pub fn attention_tc_kernel<T: CudaFloat>(
        &self,
        head_dim: usize,
        max_q_len: usize,
        mode: AttnMode,
    ) -> Option<String> {
        self.tc_plan::<T>(head_dim, max_q_len, mode, "").map(|p| p.name)
    }

    /// [`CudaKernels::attention`] on tensor cores (`attention_tc_*` or `attention_mma_*`,
    /// one signature); the arguments are checked by the caller and `tc_plan` chose `p`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_tc<T: CudaFloat>(
        &self,
        q: &impl DevicePtr<T>,
        pools: &Pools,
        block_tables: &impl DevicePtr<u32>,
        spans: &impl DevicePtr<u32>,
        out: &mut impl DevicePtrMut<T>,
        a: &Args,
        p: &TcPlan,
    ) -> Result<()> {
        let group = a.heads / a.kv_heads;
        let tiles_m = crate::cuda::prod(&[a.max_q_len, group])?.div_ceil(p.bm);
        let seq_heads = crate::cuda::prod(&[a.n_seqs, a.kv_heads])?;
        // The mma.sync and wgmma kernels live in modules of their own (compiled on first use).
        let module = if p.name.starts_with("attention_mma") {
            &ATTENTION_MMA
        } else if p.name.starts_with("attention_wgmma") {
            &ATTENTION_WGMMA
        } else {
            &ATTENTION
        };
        let f = self.function_smem(module, &p.name, p.smem)?;
        let cfg = LaunchConfig {
            grid_dim: (u32_of("item tiles", tiles_m)?, seq_heads as u32, 1),
            block_dim: (p.threads as u32, 1, 1),
            shared_mem_bytes: u32_of("shared memory", p.smem)?,
        };
        let (t32, h32, kvh32, d32) = (
            u32_of("t", a.t)?,
            u32_of("heads", a.heads)?,
            u32_of("kv_heads", a.kv_heads)?,
            u32_of("head_dim", a.head_dim)?,
        );
        let win32 = window_arg(a.window);
        let Paged { max_blocks, bs_log2, n_slots } = a.pg;
        // SAFETY: arguments match `attention_tc_<T><Q>_d<DP>` (attention_tc.cu),
        // `attention_mma_<T><Q>_d<DP>_w<NW>n<BN>` (attention_mma.cu) and
        // `attention_wgmma_<T>_d<DP>` (attention_wgmma.cu, planned on sm_90 only, where its
        // module is compiled for sm_90a), which share the signature (head_dim % 16 == 0,
        // head_dim <= DP, the block size the kernel's 32 · NW / ATC_THREADS / 256); `q`, `out`, `spans`, `block_tables` have the lengths checked
        // by `attention` and the pools `n_slots` rows (no slot >= n_slots, table entry beyond
        // `max_blocks` or row >= t is touched); the dynamic shared memory is the size the
        // kernel carves (attribute raised above 48 KiB, within the device's opt-in limit).
        // Kernel: `attention_{tc,mma}_<T><Q>_d<DP>[_w<NW>n<BN>](const T* q, const void* kpool,
        // const void* vpool, const u32* tables, const u32* spans, T* out, u32 t, u32 heads, u32 kvh,
        // u32 D, float scale, u32 window, u32 max_blocks, u32 bs_log2, u32 n_slots, const float* ksc,
        // const float* vsc)`.
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
                    ptr_mut(out),
                    t32,
                    h32,
                    kvh32,
                    d32,
                    a.scale,
                    win32,
                    max_blocks,
                    bs_log2,
                    n_slots,
                    pools.ks,
                    pools.vs
                ]
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H200: usize = 232_448;
    const A100: usize = 166_912;
    const SM86: usize = 101_376;
    const KERNELS: [AttnTc; 7] =
        [AttnTc::Wmma, AttnTc::Mma, AttnTc::MmaW8, AttnTc::MmaW4, AttnTc::MmaP1, AttnTc::MmaX2, AttnTc::Wgmma];

    #[test]
    fn tensor_core_plans_fit_the_devices() {
        // H200: every kernel at every head dim (the 4-warp tiles exist at 256 only, the wgmma
        // ones at 128 and 256).
        for k in KERNELS {
            for hd in (16..=256).step_by(16) {
                let (s, dp, smem) = plan(2, hd, 64, true, true, H200, k, false).expect("a tensor-core plan");
                assert!(dp >= hd && smem <= H200);
                let first = match shapes(k)[0] {
                    MMA_W4 | MMA_X2 if dp != MMA_W4_DP => shapes(k)[1],
                    Shape::Wgmma if !WG_DIMS.contains(&dp) => shapes(k)[1],
                    s => s,
                };
                assert_eq!(s, first, "{k:?} head_dim {hd}");
                // Quantized pools: no single-MMA P, warp-pair or wgmma kernels.
                let (sq, _, _) = plan(2, hd, 64, true, true, H200, k, true).expect("a tensor-core plan");
                assert!(sq != MMA_P1 && sq != MMA_X2 && sq != Shape::Wgmma, "{k:?} head_dim {hd}: {sq:?}");
                // Not an sm_90 (an sm_100 with as much shared memory): no wgmma kernel.
                let (sn, _, _) = plan(2, hd, 64, true, false, H200, k, false).expect("a tensor-core plan");
                assert!(sn != Shape::Wgmma, "{k:?} head_dim {hd}: {sn:?}");
            }
        }
        assert_eq!(Shape::Wgmma.smem(2, 256), 198_144);
        assert_eq!(Shape::Wgmma.smem(2, 128), 99_840);
        assert_eq!(Shape::Wgmma.kernel("bf16", "", 256), "attention_wgmma_bf16_d256");
        assert_eq!(plan(2, 256, 64, true, true, H200, AttnTc::Wgmma, false).map(|p| p.0), Some(Shape::Wgmma));
        assert_eq!(plan(2, 64, 64, true, true, H200, AttnTc::Wgmma, false).map(|p| p.0), Some(MMA_W8));
        assert_eq!(MMA_W8.smem(2, 256), 197_120);
        assert_eq!(MMA_W4.smem(2, 256), 98_560);
        assert_eq!(MMA_X2.smem(2, 256), 164_096);
        // A100 and sm_86 / sm_89 at head_dim 256: the 4-warp mma tiles (wmma needs 202 KiB);
        // the warp-pair form fits an A100.
        for limit in [A100, SM86] {
            for k in KERNELS {
                let (s, _, smem) = plan(2, 256, 64, true, false, limit, k, false).expect("a plan");
                let want = if k == AttnTc::MmaX2 && limit == A100 { MMA_X2 } else { MMA_W4 };
                assert_eq!(s, want, "{k:?} limit {limit}");
                assert!(smem <= limit);
            }
        }
        // Not 16-bit, not a multiple of 16, too few rows, no tensor cores: CUDA cores.
        assert!(plan(4, 128, 64, true, true, H200, AttnTc::Mma, false).is_none());
        assert!(plan(2, 120, 64, true, true, H200, AttnTc::Mma, false).is_none());
        assert!(plan(2, 128, 15, true, true, H200, AttnTc::Mma, false).is_none());
        assert!(plan(2, 128, 64, false, true, H200, AttnTc::Mma, false).is_none());
        assert_eq!(MMA_W8.kernel("bf16", "_fp8", 256), "attention_mma_bf16_fp8_d256_w8n64");
        assert_eq!(MMA_P1.kernel("f16", "", 128), "attention_mma_f16_d128_w8n64_p1");
        assert_eq!(MMA_X2.kernel("bf16", "", 256), "attention_mma_bf16_d256_w8n32_x2");
        assert_eq!(Shape::Wmma.kernel("bf16", "_i8", 64), "attention_tc_bf16_i8_d64");
    }

    #[test]
    fn tc_env_values() {
        assert_eq!(tc_from(None), Ok(ATTN_TC_DEFAULT));
        assert_eq!(tc_from(Some("".as_ref())), Ok(ATTN_TC_DEFAULT));
        assert_eq!(tc_from(Some(" WMMA ".as_ref())), Ok(AttnTc::Wmma));
        assert_eq!(tc_from(Some("mma".as_ref())), Ok(AttnTc::Mma));
        assert_eq!(tc_from(Some("mma8".as_ref())), Ok(AttnTc::MmaW8));
        assert_eq!(tc_from(Some("mma4".as_ref())), Ok(AttnTc::MmaW4));
        assert_eq!(tc_from(Some("mma1".as_ref())), Ok(AttnTc::MmaP1));
        assert_eq!(tc_from(Some("mma2".as_ref())), Ok(AttnTc::MmaX2));
        assert_eq!(tc_from(Some("wgmma".as_ref())), Ok(AttnTc::Wgmma));
        assert_eq!(tc_from(Some("fast".as_ref())), Err("fast".into()));
        assert_eq!(shapes(AttnTc::MmaW4)[0], MMA_W4);
        assert_eq!(shapes(AttnTc::MmaW8)[0], MMA_W8);
    }
}

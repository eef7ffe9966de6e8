// The prefill path of the routed experts, second form (appended to moe.cu in its module;
// kernels/src/cuda/moe_prefill.rs launches it): a parallel alignment and grouped GEMMs on raw
// mma.sync with large warp tiles. moe.cu keeps the single-block alignment (`moe_align`, also
// the decode path's) and the wmma GEMMs (`moe_gemm_*_tc*`, the A/B baseline behind
// PORTER_MOE_GEMM=wmma, and the FP8 tile-dequantizing GEMMs' body).
//
// 1. Parallel alignment (moe_palign_*): the counting sort of moe_align over nb blocks instead
//    of one: (a) moe_palign_hist: block b counts the experts of pairs [b·per, (b + 1)·per) in
//    shared memory and writes its row hist[b][e]; (b) moe_palign_scan (one block): per expert
//    the exclusive prefix over the blocks, the padded segment layout (the same layout as
//    align_core: segments padded to `pad`, sorted / tile_expert / seg / meta), hist[b][x]
//    becoming block b's first position in expert x's segment; (c) moe_palign_scatter: block b
//    places its pairs from those cursors (shared-memory atomics; the order within a segment is
//    not deterministic, as in align_core; nothing downstream depends on it). Outputs are
//    exactly moe_align's contract.
//
// 2. Grouped GEMMs (moe_gemm_{gu,down}_mma{MI}_{bf16,f16}), mma.sync.m16n8k16 (f32
//    accumulate), see the analysis before gemm_mma_impl.

// ---------------------------------------------------------------------------
// 1. Parallel alignment
// ---------------------------------------------------------------------------

#define MOE_PALIGN_THREADS 512  // (the literal in the kernels' __launch_bounds__)

// hist [nb][e]: row b = the expert counts of pairs [b·per, min((b + 1)·per, n)).
// Grid nb blocks of MOE_PALIGN_THREADS; dynamic shared memory e u32.
extern "C" __global__ void __launch_bounds__(512)
    moe_palign_hist(const u32* __restrict__ idx, u32 n, u32 e, u32 per, u32* __restrict__ hist) { porter_pdl_enter();
    extern __shared__ u32 pa_cnt[];
    const u32 tid = threadIdx.x, nt = blockDim.x;
    for (u32 i = tid; i < e; i += nt) pa_cnt[i] = 0u;
    __syncthreads();
    const u32 p0 = blockIdx.x * per, p1 = min(p0 + per, n);
    for (u32 p = p0 + tid; p < p1; p += nt) {
        const u32 ex = __ldg(idx + p);
        if (ex < e) atomicAdd(&pa_cnt[ex], 1u);
    }
    __syncthreads();
    for (u32 i = tid; i < e; i += nt) hist[(u64)blockIdx.x * e + i] = pa_cnt[i];
}

// One block of MOE_ALIGN_THREADS; dynamic shared memory e u32. hist [nb][e] from
// moe_palign_hist becomes the scatter cursors: hist[b][x] = start of expert x's segment +
// Σ_{b' < b} hist[b'][x]. Writes sorted (MOE_INVALID in the padding), tile_expert, seg, meta
// as moe_align does (see align_core; requires cap = tiles_cap · pad >= Σ roundup(count, pad)).
extern "C" __global__ void __launch_bounds__(1024)
    moe_palign_scan(u32* __restrict__ hist, u32 nb, u32 e, u32 pad, u32 cap, u32 tiles_cap,
                    u32* __restrict__ sorted, u32* __restrict__ tile_expert, u32* __restrict__ seg,
                    u32* __restrict__ meta) { porter_pdl_enter();
    extern __shared__ u32 pa_cnt[];
    __shared__ u32 sh[64];
    const u32 tid = threadIdx.x, nt = blockDim.x;
    // Thread tid owns experts lo..hi (contiguous, as align_core).
    const u32 per = (e + nt - 1) / nt;
    const u32 lo = min(tid * per, e), hi = min(lo + per, e);
    u32 rows = 0, act = 0;
    for (u32 i = lo; i < hi; ++i) {
        u32 c = 0;
        for (u32 b = 0; b < nb; ++b) {
            u32* h = hist + (u64)b * e + i;
            const u32 v = *h;
            *h = c;
            c += v;
        }
        pa_cnt[i] = c;
        rows += (c + pad - 1) / pad * pad;
        act += c > 0 ? 1u : 0u;
    }
    u32 total, nact;
    block_scan2(rows, act, total, nact, sh, tid, nt);
    u32 r = rows, a = act;
    for (u32 i = lo; i < hi; ++i) {
        const u32 c = pa_cnt[i];
        const u32 pr = (c + pad - 1) / pad * pad;
        if (c > 0) {
            seg[3 * a] = i;
            seg[3 * a + 1] = r;
            seg[3 * a + 2] = c;
            ++a;
        }
        for (u32 q = r / pad; q < (r + pr) / pad; ++q) tile_expert[q] = i;
        for (u32 q = r + c; q < r + pr; ++q) sorted[q] = MOE_INVALID;
        for (u32 b = 0; b < nb; ++b) hist[(u64)b * e + i] += r;
        r += pr;
    }
    for (u32 q = total + tid; q < cap; q += nt) sorted[q] = MOE_INVALID;
    for (u32 q = total / pad + tid; q < tiles_cap; q += nt) tile_expert[q] = MOE_INVALID;
    if (tid == 0) {
        meta[0] = nact;
        meta[1] = total / pad;
    }
}

// Block b places pairs [b·per, min((b + 1)·per, n)) at sorted[cursor], the cursors starting at
// hist[b][·] (moe_palign_scan). Grid nb blocks of MOE_PALIGN_THREADS; dynamic shared memory e u32.
extern "C" __global__ void __launch_bounds__(512)
    moe_palign_scatter(const u32* __restrict__ idx, u32 n, u32 e, u32 per, const u32* __restrict__ hist,
                       u32* __restrict__ sorted) { porter_pdl_enter();
    extern __shared__ u32 pa_cnt[];
    const u32 tid = threadIdx.x, nt = blockDim.x;
    for (u32 i = tid; i < e; i += nt) pa_cnt[i] = hist[(u64)blockIdx.x * e + i];
    __syncthreads();
    const u32 p0 = blockIdx.x * per, p1 = min(p0 + per, n);
    for (u32 p = p0 + tid; p < p1; p += nt) {
        const u32 ex = __ldg(idx + p);
        if (ex < e) sorted[atomicAdd(&pa_cnt[ex], 1u)] = p;
    }
}

// ---------------------------------------------------------------------------
// 2. Grouped GEMMs on mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16} (sm_80+)
// ---------------------------------------------------------------------------
//
// Same grouping, tile list and roundings as moe.cu's gemm_tc_impl (tiles of BM = 16·MI rows
// of the sorted list; block b: tile b / nblk, column block b % nblk; gate+up: h =
// round(silu(round(g)) · round(u)), down: o[pair] = round(C)). Different tiling:
// - 8 warps (MOE_MMA_THREADS); every warp computes all BM rows × WN = 8·WN8 weight rows
//   (MI × WN8 m16n8 accumulators, 4·MI·WN8 f32 a thread); block tile BM × BN, BN = 8·WN.
//   Two shapes: "wide" MI = 1..4 with WN = 64 (BN 512: gate+up 256 gate + the 256 matching
//   up rows -> 256 h columns, down 512 o columns) and "tall" MI = 6, 8 with WN = 32 (BN 256).
//   Per k16 a warp issues WN8 / 2 ldmatrix.x4 of W (two n8 tiles each) and MI of A for
//   MI · WN8 MMAs: 4 MMAs per fragment load at 64 × 64, 3.2 at 128 × 32 (moe.cu's wmma form,
//   48 × 64 warp tiles: 3.4). gate+up: a warp's first WN8 / 2 n8 tiles are gate rows, the
//   others the same up rows, so SiLU·up is applied in registers.
// - Skipped padding: a tile's real rows are a prefix (segments start at tile boundaries), so
//   m16 fragments of padding rows only are skipped (no ldmatrix, no MMA; their A rows are
//   zero-filled, not read) and the MMA work is Σ_experts 16·⌈count / 16⌉ rows whatever BM.
//   What BM still decides is how often an expert's weights are streamed (once per tile: at
//   t = 4096 of the 80B shape, ≈ 80 rows an expert, 48-row tiles stream every expert ≈ 2.1
//   times, 128-row tiles once: 3.2 instead of 6.6 GB of weight reads from L2 a layer, whose
//   weights are 3.2 GB of HBM: at ≈ 80 FLOP per weight byte the layer is near the H200's
//   ridge, so this matters as much as the MMA rate). The host takes the smallest BM that
//   covers an expert's rows with high probability (moe_prefill_mma_frags; cap at 128 rows).
// - Shared memory per k-step (BK = 32) and block: W written by cp.async and read once by
//   ldmatrix (2 × BN × 64 B), A written once and read by 8 warps (9 × BM × 64 B): wide BM 64:
//   100 KiB for 2.1 MFLOP, 20.5 FLOP/B; tall BM 128 (all fragments real): 104 KiB for 2.1
//   MFLOP, 19.7 FLOP/B; at 128 B/clk an SM that allows ≈ 2600 FLOP/clk, about the mma.sync
//   rate. (The wmma form at BM 48: 16.3; the W stream alone, 2 bytes per 2·BM FLOP, is the
//   floor of any shared-memory-staged weight tile.)
// - Swizzled 64-byte rows (BK 32 = four 16-byte chunks; chunk c of row r stored at c ^ ((r >>
//   1) & 3)): the 8 row addresses of an ldmatrix 8×8 matrix (8 consecutive rows, one chunk) hit
//   8 distinct 16-byte bank groups, and a warp's cp.async stores (8 rows × 4 chunks) cover 512
//   contiguous bytes: both conflict-free without padding.
// - MOE_MMA_STAGES = 4 cp.async stages of (BM + BN) × 64 B: wide 132–144 KiB, tall 88–96 KiB
//   (one block of 8 warps an SM; ptxas, sm_90: 88–188 registers, no spills). Wide fits sm_80
//   (163 KiB) and sm_90 (227 KiB), tall also sm_86 / sm_89 (99 KiB: the host takes the 96-row
//   tiles there); where none fits, the host runs the wmma form.
// - Epilogue: the C fragments rounded to T into shared memory [BM][NC + 8] (conflict-free
//   4-byte stores), then 16-byte stores of 8 columns (N % 8 == 0: the host checks) of the
//   tile's real rows only (the down GEMM reads no padding row of h).
// Grid at t = 4096 (tall, BM 128): tiles_cap = 320 + 512 (≈ 512 real): gate+up ≈ 512·4, down
// ≈ 512·8 blocks, ≈ 16 / 31 waves of 132 SMs; t = 512 (wide, BM 32, ≈ 512 real tiles):
// gate+up ≈ 512·2, down ≈ 512·4 blocks.
//
// Needs K % 8 == 0, N % 8 == 0 and 16-byte aligned rows (checked by the host).

#define MOE_MMA_THREADS 256
#define MOE_MMA_BK 32
#define MOE_MMA_STAGES 4

// Byte offset of 16-byte chunk c (0..3) of row r of a swizzled [rows][64-byte] tile.
__device__ __forceinline__ u32 mma_sw(u32 r, u32 c) { return r * 64u + ((c ^ ((r >> 1) & 3u)) << 4); }

// (sm_80+ instructions: defined only where gemm_mma_impl's body is built.)
#if defined(PORTER_SM80)
__device__ __forceinline__ void ldsm_x4(u32 (&d)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(addr));
}

// d += a · b for one m16n8k16 tile (a: the A fragment, b0 / b1: the B fragment).
template <typename T> __device__ __forceinline__ void mma16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1);
template <> __device__ __forceinline__ void mma16816<bf16>(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma16816<f16>(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

// Two f32 rounded to T (from_f, nearest even) and packed, the first in the low half.
template <typename T> __device__ __forceinline__ u32 mma_pack2(float a, float b) {
    union {
        u32 v;
        T h[2];
    } u;
    u.h[0] = from_f<T>(a);
    u.h[1] = from_f<T>(b);
    return u.v;
}

template <typename T, int MODE, int MI, int WN8>
__device__ __forceinline__ void gemm_mma_impl(const T* __restrict__ a, const T* __restrict__ w0,
                                              const T* __restrict__ w1, const u32* __restrict__ sorted,
                                              const u32* __restrict__ tile_expert, T* __restrict__ dst, u32 K, u32 N,
                                              u32 k, u32 nblk) {
#if defined(PORTER_SM80)
    constexpr bool GU = MODE == TC_GU;
    constexpr u32 WN = 8u * WN8, BM = 16u * MI, BN = 8u * WN, NC = GU ? BN / 2 : BN, LDC = NC + 8;
    constexpr int WC = (int)(BN / 64u);  // W chunks a thread loads per k-step
    constexpr u32 A_BYTES = BM * 64u, STAGE = (BM + BN) * 64u, S = MOE_MMA_STAGES;
    extern __shared__ __align__(128) unsigned char moe_mma_smem[];
    __shared__ u32 s_pair[BM];
    const u32 tile = blockIdx.x / nblk, cb = blockIdx.x % nblk;
    const u32 ex = tile_expert[tile];
    if (ex == MOE_INVALID) return;
    const u32 tid = threadIdx.x, warp = tid >> 5, lane = tid & 31u;
    const u32 c0 = cb * NC;
    u32 p = MOE_INVALID;
    if (tid < BM) {
        p = sorted[tile * BM + tid];
        s_pair[tid] = p;
    }
    // Real rows of the tile (a prefix of it).
    const u32 nv = (u32)__syncthreads_count(p != MOE_INVALID);
    // Loader: 16-byte chunk ch of A rows lrow + 64s (< BM) and of W tile rows lrow + 64s (s < WC).
    const u32 lrow = tid >> 2, ch = tid & 3u;
    // A rows lrow + 64s (s < AC; tall tiles have two): nullptr for padding (zero-filled).
    constexpr int AC = (int)((BM + 63u) / 64u);
    const T* ap[AC];
#pragma unroll
    for (int s = 0; s < AC; ++s) {
        const u32 r = lrow + 64u * s;
        ap[s] = r < nv ? (GU ? a + (u64)(s_pair[r] / k) * K : a + (u64)(tile * BM + r) * K) : nullptr;
    }
    // W tile row lrow + 64s (s < WC): GU: gate row c0 + lrow + 64s (s < WC / 2), else up row
    // c0 + lrow + 64(s − WC / 2); down: row c0 + lrow + 64s (of expert ex).
    const u64 wrow = (u64)ex * N + c0 + lrow;
    const T* bg = w0 + wrow * K;
    const T* bu = (GU ? w1 : w0) + wrow * K;
    u32 bvalid = 0;
#pragma unroll
    for (int s = 0; s < WC; ++s)
        if (c0 + lrow + 64u * (GU ? (u32)(s % (WC / 2)) : (u32)s) < N) bvalid |= 1u << s;
    const u32 sbase = (u32)__cvta_generic_to_shared(moe_mma_smem);
    auto load = [&](u32 st, u32 k0) {
        unsigned char* sa = moe_mma_smem + st * STAGE;
        unsigned char* sb = sa + A_BYTES;
        const u32 kc = k0 + 8u * ch;
        const bool in = kc < K;
#pragma unroll
        for (int s = 0; s < AC; ++s) {
            const u32 r = lrow + 64u * s;
            if (r < BM) {
                const bool v = ap[s] != nullptr && in;
                cp_async16(sa + mma_sw(r, ch), v ? ap[s] + kc : a, v);
            }
        }
#pragma unroll
        for (int s = 0; s < WC; ++s) {
            const bool v = ((bvalid >> s) & 1u) != 0u && in;
            const T* src =
                GU ? (s < WC / 2 ? bg : bu) + (u64)(64 * (s % (WC / 2))) * K : bg + (u64)(64 * s) * K;
            cp_async16(sb + mma_sw(lrow + 64u * s, ch), v ? src + kc : w0, v);
        }
    };
    // Warp w's B tile rows of ldmatrix jp (< WN8 / 2; two n8 tiles, 16 rows): GU: gate
    // (WN / 2)·w + 16jp (jp < WN8 / 4), up BN / 2 + (WN / 2)·w + 16(jp − WN8 / 4); down: WN·w + 16jp.
    constexpr int JH = WN8 / 4;
    auto brow = [&](int jp) -> u32 {
        return GU ? (u32)(jp / JH) * (BN / 2u) + (WN / 2u) * warp + 16u * (u32)(jp % JH) : WN * warp + 16u * (u32)jp;
    };
    float acc[MI][WN8][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < WN8; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
    const u32 nk = (K + MOE_MMA_BK - 1) / MOE_MMA_BK;
    // Pipeline as gemm_tc_impl: commit groups G0..G(S−2) first; iteration kt commits G(kt + S
    // − 1), so "all but the newest S − 2 groups done" means tile kt has landed (this thread's
    // chunks; the barrier makes every thread's visible); the stage refilled in iteration kt,
    // (kt − 1) % S, was last read in iteration kt − 1, which every warp has left at the barrier.
#pragma unroll
    for (u32 s = 0; s < S - 1; ++s) {
        if (s < nk) load(s, s * MOE_MMA_BK);
        cp_async_commit();
    }
    for (u32 kt = 0; kt < nk; ++kt) {
        cp_async_wait<S - 2>();
        __syncthreads();
        const u32 kn = kt + S - 1;
        if (kn < nk) load(kn % S, kn * MOE_MMA_BK);
        cp_async_commit();
        const u32 sa = sbase + (kt % S) * STAGE, sb = sa + A_BYTES;
#pragma unroll
        for (u32 kk = 0; kk < MOE_MMA_BK / 16u; ++kk) {
            // B matrices: weight rows 0-7 × k 0-7 / 8-15 (b0, b1 of n8 tile 2jp), then rows 8-15.
            u32 b[WN8 / 2][4];
#pragma unroll
            for (int jp = 0; jp < WN8 / 2; ++jp)
                ldsm_x4(b[jp], sb + mma_sw(brow(jp) + ((lane >> 4) << 3) + (lane & 7u), 2u * kk + ((lane >> 3) & 1u)));
#pragma unroll
            for (int i = 0; i < MI; ++i)
                if (16u * i < nv) {
                    // A matrices: rows 0-7 / 8-15 of the m16 tile × k 0-7 / 8-15 (a0..a3).
                    u32 af[4];
                    ldsm_x4(af, sa + mma_sw(16u * i + (lane & 15u), 2u * kk + (lane >> 4)));
#pragma unroll
                    for (int jp = 0; jp < WN8 / 2; ++jp) {
                        mma16816<T>(acc[i][2 * jp], af, b[jp][0], b[jp][1]);
                        mma16816<T>(acc[i][2 * jp + 1], af, b[jp][2], b[jp][3]);
                    }
                }
        }
    }
    // Only empty groups can be pending; the stages become the C staging area [BM][LDC] of T.
    cp_async_wait<0>();
    __syncthreads();
    T* Cs = reinterpret_cast<T*>(moe_mma_smem);
    const u32 g = lane >> 2, t4 = lane & 3u;
    // C fragment: q = 0, 1 row g, columns 2t4, 2t4 + 1 of the n8 tile; q = 2, 3 row g + 8.
#pragma unroll
    for (int i = 0; i < MI; ++i) {
        if (16u * i >= nv) continue;  // padding rows only: never stored
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            u32* crow = reinterpret_cast<u32*>(Cs + (16u * i + g + 8u * h) * LDC);
            if (GU) {
                // n8 tiles j < WN8 / 2: gate columns (WN / 2)·w + 8j + 2t4 (+1); j + WN8 / 2: the
                // same up columns.
#pragma unroll
                for (int j = 0; j < WN8 / 2; ++j) {
                    const float* gq = acc[i][j] + 2 * h;
                    const float* uq = acc[i][j + WN8 / 2] + 2 * h;
                    crow[((WN / 2u) * warp + 8u * j + 2u * t4) / 2u] =
                        mma_pack2<T>(silu_f(round_to<T>(gq[0])) * round_to<T>(uq[0]),
                                     silu_f(round_to<T>(gq[1])) * round_to<T>(uq[1]));
                }
            } else {
#pragma unroll
                for (int j = 0; j < WN8; ++j)
                    crow[(WN * warp + 8u * j + 2u * t4) / 2u] = mma_pack2<T>(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
            }
        }
    }
    __syncthreads();
    // 16-byte stores of 8 columns of the real rows: gate+up at h[tile row], down at o[pair].
    constexpr u32 VPR = NC / 8u;
    for (u32 q = tid; q < nv * VPR; q += MOE_MMA_THREADS) {
        const u32 i = q / VPR, v = q % VPR, c = c0 + 8u * v;
        if (c >= N) continue;
        const u64 row = GU ? (u64)tile * BM + i : (u64)s_pair[i];
        *reinterpret_cast<uint4*>(dst + row * N + c) = *reinterpret_cast<const uint4*>(Cs + i * LDC + 8u * v);
    }
#else
    // Fallback build (below sm_80 or PORTER_FALLBACK): the host never launches this kernel.
    __trap();
#endif
}

// Entries moe_gemm_{gu,down}_mma{MI}_{bf16,f16} (MI = 1..4: wide, WN8 = 8, BN = 512; MI = 6, 8:
// tall, WN8 = 4, BN = 256): the arguments of moe.cu's moe_gemm_{gu,down}_tc{MI}_*; dynamic
// shared memory max(MOE_MMA_STAGES · (16·MI + BN) · 64, 16·MI · (NC + 8) · sizeof(T)) bytes, NC
// = BN / 2 (gate+up) or BN (down) (the host computes it).
#define MOE_MMA_ENTRY(T, NAME, MI, WN8)                                                                           \
    extern "C" __global__ void __launch_bounds__(MOE_MMA_THREADS, 1)                                              \
        moe_gemm_gu_mma##MI##_##NAME(const T* a, const T* w0, const T* w1, const u32* sorted,                     \
                                     const u32* tile_expert, T* dst, u32 K, u32 N, u32 k, u32 nblk) { porter_pdl_enter();             \
        gemm_mma_impl<T, TC_GU, MI, WN8>(a, w0, w1, sorted, tile_expert, dst, K, N, k, nblk);                    \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(MOE_MMA_THREADS, 1)                                              \
        moe_gemm_down_mma##MI##_##NAME(const T* a, const T* w0, const T* w1, const u32* sorted,                   \
                                       const u32* tile_expert, T* dst, u32 K, u32 N, u32 k, u32 nblk) { porter_pdl_enter();           \
        gemm_mma_impl<T, TC_DOWN, MI, WN8>(a, w0, w0, sorted, tile_expert, dst, K, N, k, nblk);                  \
    }
#define MOE_MMA_ENTRIES(T, NAME)                                                                                  \
    MOE_MMA_ENTRY(T, NAME, 1, 8)                                                                                  \
    MOE_MMA_ENTRY(T, NAME, 2, 8)                                                                                  \
    MOE_MMA_ENTRY(T, NAME, 3, 8)                                                                                  \
    MOE_MMA_ENTRY(T, NAME, 4, 8)                                                                                  \
    MOE_MMA_ENTRY(T, NAME, 6, 4)                                                                                  \
    MOE_MMA_ENTRY(T, NAME, 8, 4)

MOE_MMA_ENTRIES(bf16, bf16)
MOE_MMA_ENTRIES(f16, f16)

// ---------------------------------------------------------------------------
// 3. Streamed grouped GEMMs (moe_gemm_{gu,down}_pipe{MI}_s{S}_{bf16,f16}; PORTER_MOE_GEMM=pipe)
// ---------------------------------------------------------------------------
//
// The mma.sync GEMMs above at t = 4096 of the 80B shape read the expert weights at 1.7–1.9
// TB/s. This form is built to stream them at HBM rate:
// - One M-tile an expert where it fits: tiles of BM = 64 or 128 rows (the host takes the
//   smallest that holds λ + 3√λ + 1 rows), so every weight tile is read once from HBM (48-row
//   tiles read ≈ 2.1× the weights through L2 at ≈ 80 rows an expert). Padding m16 fragments
//   are skipped (no MMA, no ldmatrix, no cp.async: only the rows of the last real fragment
//   past the real rows are zero-filled), so MMA work stays Σ 16·⌈count / 16⌉.
// - BK = 64: a staged weight row is 128 bytes, a whole L2 line (the 32-column stages above
//   read half lines, the other half a k-step later); cp.async with the L2::128B prefetch
//   and an evict_first policy on weights (streamed once; x / h stay in L2).
// - S stages (4 on sm_90: 4 × (BM + 256) × 128 B = 192 KiB at BM 128; 3 on sm_80: 144 KiB):
//   96 KiB of weights in flight an SM, enough for ≈ 4 TB/s at ≈ 3 µs of loaded latency.
// - A CTA runs CPB consecutive column blocks of its tile in one pipeline (the k-steps of
//   the next column block are in flight while the last of the current one computes; the
//   epilogue stores from registers, using no shared memory): no pipeline fill an SM between
//   column blocks, and a grid of tiles · ⌈nblk / CPB⌉ CTAs (host: ≥ 4 CTAs an SM).
// - 8 warps, each all BM rows × 32 weight rows (MI × 4 m16n8 accumulators, 128 f32 at MI =
//   8; the tall shape above, whose balance with skipped fragments is exact); gate+up: warp w
//   holds gate rows 16w..16w + 15 of the column block and the same up rows (block rows 128 +
//   16w..), so SiLU·up is applied in registers and a column block is 128 h columns; down:
//   warp w holds weight rows 32w..32w + 31, a column block 256 o columns.
// - Swizzled 128-byte rows (chunk c of row r at c ^ (r & 7)): ldmatrix (8 rows, one chunk)
//   and cp.async (a warp: 4 rows × 8 chunks) conflict-free.
// Same roundings as gemm_mma_impl (h = round(silu(round(g)) · round(u)), o = round(C)).
// Needs K % 8 == 0, N % 8 == 0, 16-byte aligned rows (checked by the host).

#define MOE_PIPE_THREADS 256
#define MOE_PIPE_BK 64
#define MOE_PIPE_BN 256

// Byte offset of 16-byte chunk c (0..7) of row r of a swizzled [rows][128-byte] tile.
__device__ __forceinline__ u32 pipe_sw(u32 r, u32 c) { return r * 128u + ((c ^ (r & 7u)) << 4); }

#if defined(PORTER_SM80)
// cp.async of 16 bytes (src-size 16) with an L2 cache policy and a 128-byte L2 prefetch.
__device__ __forceinline__ void cp_async16_pol(u32 s, const void* gmem, u64 pol) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, 16, %2;\n" ::"r"(s), "l"(gmem),
                 "l"(pol));
}
// cp.async of 16 bytes, zero-filled (src-size 0) when !valid.
__device__ __forceinline__ void cp_async16_z(u32 s, const void* gmem, bool valid) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}
#endif

// Block b: tile b / ngrp, column blocks (b % ngrp)·cpb .. min(+cpb, nblk) (each 128 h columns
// for gate+up, 256 o columns for down). Dynamic shared memory S · (16·MI + 256) · 128 bytes.
template <typename T, int MODE, int MI, int S>
__device__ __forceinline__ void gemm_pipe_impl(const T* __restrict__ a, const T* __restrict__ w0,
                                               const T* __restrict__ w1, const u32* __restrict__ sorted,
                                               const u32* __restrict__ tile_expert, T* __restrict__ dst, u32 K,
                                               u32 N, u32 k, u32 ngrp, u32 cpb, u32 nblk) {
#if defined(PORTER_SM80)
    constexpr bool GU = MODE == TC_GU;
    constexpr u32 BM = 16u * MI, BN = MOE_PIPE_BN, NC = GU ? BN / 2 : BN;
    constexpr u32 A_BYTES = BM * 128u, STAGE = (BM + BN) * 128u;
    constexpr int AP = (int)(BM / 32u);  // A rows a thread loads per k-step (rows lrow + 32s)
    extern __shared__ __align__(128) unsigned char moe_pipe_smem[];
    __shared__ u32 s_pair[BM];
    const u32 tile = blockIdx.x / ngrp, grp = blockIdx.x % ngrp;
    const u32 ex = tile_expert[tile];
    if (ex == MOE_INVALID) return;
    const u32 cb0 = grp * cpb, cb1 = min(cb0 + cpb, nblk);
    if (cb0 >= cb1) return;
    const u32 tid = threadIdx.x, warp = tid >> 5, lane = tid & 31u;
    u32 p = MOE_INVALID;
    if (tid < BM) {
        p = sorted[tile * BM + tid];
        s_pair[tid] = p;
    }
    // Real rows (a prefix of the tile) and the rows of real m16 fragments.
    const u32 nv = (u32)__syncthreads_count(p != MOE_INVALID);
    const u32 nf = (nv + 15u) & ~15u;
    // Loader: 16-byte chunk ch of rows lrow + 32s.
    const u32 lrow = tid >> 3, ch = tid & 7u;
    const T* ap[AP];
#pragma unroll
    for (int s = 0; s < AP; ++s) {
        const u32 r = lrow + 32u * s;
        ap[s] = r < nv ? (GU ? a + (u64)(s_pair[r] / k) * K : a + (u64)(tile * BM + r) * K) : a;
    }
    u64 pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
    const u32 sbase = (u32)__cvta_generic_to_shared(moe_pipe_smem);
    const u32 nk = (K + MOE_PIPE_BK - 1) / MOE_PIPE_BK;
    const u32 steps = (cb1 - cb0) * nk;
    // Step q: column block cb0 + q / nk, k-step q % nk.
    auto load = [&](u32 q) {
        const u32 cb = cb0 + q / nk, k0 = (q % nk) * MOE_PIPE_BK;
        const u32 sa = sbase + (q % S) * STAGE, sb = sa + A_BYTES;
        const u32 kc = k0 + 8u * ch;
        const bool in = kc < K;
#pragma unroll
        for (int s = 0; s < AP; ++s) {
            const u32 r = lrow + 32u * s;
            if (r < nf) cp_async16_z(sa + pipe_sw(r, ch), ap[s] + (in ? kc : 0u), in && r < nv);
        }
        // W rows: GU: block row r < 128: gate row cb·128 + r, else up row cb·128 + r − 128;
        // down: row cb·256 + r (of expert ex).
#pragma unroll
        for (int s = 0; s < (int)(BN / 32u); ++s) {
            const u32 r = lrow + 32u * s;
            const u32 wr = GU ? cb * NC + (r & (NC - 1u)) : cb * NC + r;
            const T* base = (GU && r >= NC) ? w1 : w0;
            const u32 d = sb + pipe_sw(r, ch);
            if (wr < N && in)
                cp_async16_pol(d, base + ((u64)ex * N + wr) * K + kc, pol);
            else
                cp_async16_z(d, w0, false);
        }
    };
    // Warp w's B rows of ldmatrix jp (16 rows: n8 tiles 2jp, 2jp + 1): GU: jp = 0 gate rows 16w..,
    // jp = 1 the up rows 128 + 16w..; down: 32w + 16jp.
    auto brow = [&](int jp) -> u32 { return GU ? (u32)jp * NC + 16u * warp : 32u * warp + 16u * (u32)jp; };
    float acc[MI][4][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
    // Pipeline as gemm_mma_impl, over the flattened (column block, k-step) sequence.
#pragma unroll
    for (u32 s = 0; s < S - 1; ++s) {
        if (s < steps) load(s);
        cp_async_commit();
    }
    const u32 g = lane >> 2, t4 = lane & 3u;
    for (u32 q = 0; q < steps; ++q) {
        cp_async_wait<S - 2>();
        __syncthreads();
        const u32 qn = q + S - 1;
        if (qn < steps) load(qn);
        cp_async_commit();
        const u32 sa = sbase + (q % S) * STAGE, sb = sa + A_BYTES;
#pragma unroll
        for (u32 kk = 0; kk < MOE_PIPE_BK / 16u; ++kk) {
            u32 b[2][4];
#pragma unroll
            for (int jp = 0; jp < 2; ++jp)
                ldsm_x4(b[jp], sb + pipe_sw(brow(jp) + ((lane >> 4) << 3) + (lane & 7u), 2u * kk + ((lane >> 3) & 1u)));
#pragma unroll
            for (int i = 0; i < MI; ++i)
                if (16u * i < nv) {
                    u32 af[4];
                    ldsm_x4(af, sa + pipe_sw(16u * i + (lane & 15u), 2u * kk + (lane >> 4)));
#pragma unroll
                    for (int jp = 0; jp < 2; ++jp) {
                        mma16816<T>(acc[i][2 * jp], af, b[jp][0], b[jp][1]);
                        mma16816<T>(acc[i][2 * jp + 1], af, b[jp][2], b[jp][3]);
                    }
                }
        }
        if (q % nk == nk - 1u) {
            // Epilogue of column block cb (from registers; C fragment q = 0, 1: row g, columns
            // 2t4, 2t4 + 1 of the n8 tile; q = 2, 3: row g + 8), then the accumulators restart.
            const u32 c0 = (cb0 + q / nk) * NC;
#pragma unroll
            for (int i = 0; i < MI; ++i) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const u32 r = 16u * i + g + 8u * h;
                    if (r < nv) {
                        if (GU) {
                            T* o = dst + ((u64)tile * BM + r) * N + c0 + 16u * warp + 2u * t4;
#pragma unroll
                            for (int j = 0; j < 2; ++j) {
                                const float* gq = acc[i][j] + 2 * h;
                                const float* uq = acc[i][j + 2] + 2 * h;
                                if (c0 + 16u * warp + 8u * j < N)
                                    *reinterpret_cast<u32*>(o + 8u * j) =
                                        mma_pack2<T>(silu_f(round_to<T>(gq[0])) * round_to<T>(uq[0]),
                                                     silu_f(round_to<T>(gq[1])) * round_to<T>(uq[1]));
                            }
                        } else {
                            T* o = dst + (u64)s_pair[r] * N + c0 + 32u * warp + 2u * t4;
#pragma unroll
                            for (int j = 0; j < 4; ++j)
                                if (c0 + 32u * warp + 8u * j < N)
                                    *reinterpret_cast<u32*>(o + 8u * j) =
                                        mma_pack2<T>(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                        }
                    }
                }
#pragma unroll
                for (int j = 0; j < 4; ++j)
#pragma unroll
                    for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.0f;
            }
        }
    }
    cp_async_wait<0>();
#else
    // Fallback build (below sm_80 or PORTER_FALLBACK): the host never launches this kernel.
    __trap();
#endif
}

// Entries moe_gemm_{gu,down}_pipe{MI}_s{S}_{bf16,f16} (MI = 4, 8; S = 3, 4): the arguments of
// moe_gemm_{gu,down}_mma* and ngrp, cpb, nblk (grid tiles_cap · ngrp, ngrp = ⌈nblk / cpb⌉).
#define MOE_PIPE_ENTRY(T, NAME, MI, S)                                                                            \
    extern "C" __global__ void __launch_bounds__(MOE_PIPE_THREADS, 1)                                             \
        moe_gemm_gu_pipe##MI##_s##S##_##NAME(const T* a, const T* w0, const T* w1, const u32* sorted,            \
                                             const u32* tile_expert, T* dst, u32 K, u32 N, u32 k, u32 ngrp,       \
                                             u32 cpb, u32 nblk) { porter_pdl_enter();                                                 \
        gemm_pipe_impl<T, TC_GU, MI, S>(a, w0, w1, sorted, tile_expert, dst, K, N, k, ngrp, cpb, nblk);           \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(MOE_PIPE_THREADS, 1)                                             \
        moe_gemm_down_pipe##MI##_s##S##_##NAME(const T* a, const T* w0, const T* w1, const u32* sorted,          \
                                               const u32* tile_expert, T* dst, u32 K, u32 N, u32 k, u32 ngrp,     \
                                               u32 cpb, u32 nblk) { porter_pdl_enter();                                               \
        gemm_pipe_impl<T, TC_DOWN, MI, S>(a, w0, w0, sorted, tile_expert, dst, K, N, k, ngrp, cpb, nblk);         \
    }
#define MOE_PIPE_ENTRIES(T, NAME)                                                                                 \
    MOE_PIPE_ENTRY(T, NAME, 4, 3)                                                                                 \
    MOE_PIPE_ENTRY(T, NAME, 4, 4)                                                                                 \
    MOE_PIPE_ENTRY(T, NAME, 8, 3)                                                                                 \
    MOE_PIPE_ENTRY(T, NAME, 8, 4)

MOE_PIPE_ENTRIES(bf16, bf16)
MOE_PIPE_ENTRIES(f16, f16)

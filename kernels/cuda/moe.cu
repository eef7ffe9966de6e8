// MoE dispatch: the routed experts of a sparse MoE block, grouped by expert,
// with no host loop over experts (porter_core::nn::Moe::forward, the part
// after the router). Preceded by common.cuh.
//
// Pipeline (kernels/src/cuda/moe.rs, CudaKernels::moe_experts):
//   1. moe_align: counting sort of the t·k (row, slot) pairs by expert; each
//      expert's segment padded to `pad` entries (the GEMM tile height, or 1 on
//      the decode path); writes the sorted pair list, the tile -> expert map and
//      the list of active experts (slot -> expert, start, count).
//   2. gate+up with the fused activation h = round(silu(round(g)) · round(u)),
//      h stored per sorted position [cap, inter] (T);
//   3. down, o = round(h · downᵀ) stored per pair [t·k, hidden] (T);
//   4. moe_combine: out[r] = Σ_j o[r, j] · w[r, j] in f32, slots in order.
// Steps 2 and 3 have two forms: GEMV kernels (decode: few rows per expert; a
// warp streams an expert's weight rows once, 16-byte loads, and serves every
// row routed to that expert; moe_decode.cu, appended to this file, which also
// fuses steps 2-4 into one launch) and tiled GEMMs over row tiles of the
// sorted list (prefill, here: tensor cores via wmma for bf16 / f16 on sm_80+,
// tiles of 16·MI rows chosen from t·k/e; CUDA cores in exact f32, 64-row
// tiles, otherwise). moe_prefill.cu, appended to this module, has the prefill
// path's default form for dense bf16 / f16: a parallel alignment (many blocks;
// moe_align below runs when the pairs fit one block) and grouped GEMMs on raw
// mma.sync with larger warp tiles (the wmma GEMMs here stay as the A/B baseline,
// PORTER_MOE_GEMM=wmma, and as the body of fp8_gemm.cu's FP8 GEMMs).
//
// Pair p = r·k + j (row r, slot j). Expert ids >= e are skipped (never sorted,
// never read back by moe_combine).

#include <mma.h>

#define MOE_INVALID 0xffffffffu
#define MOE_ALIGN_THREADS 1024
#define MOE_BM 64        // GEMM tile height (rows of the sorted list per tile)
#define MOE_BN 128       // GEMM tile width (weight rows per tile; gate+up: 64 of each)
#define MOE_GEMM_THREADS 256

// ---------------------------------------------------------------------------
// 1. Alignment (one block of MOE_ALIGN_THREADS; dynamic shared memory: e u32)
// ---------------------------------------------------------------------------

// Block-wide exclusive scan of two counters; tot_* get the block totals.
__device__ __forceinline__ void block_scan2(u32& a, u32& b, u32& tot_a, u32& tot_b, u32* sh, u32 tid, u32 nt) {
    const u32 lane = tid & 31u, w = tid >> 5, nw = nt >> 5;
    u32 ia = a, ib = b;
#pragma unroll
    for (u32 o = 1; o < 32; o <<= 1) {
        const u32 xa = __shfl_up_sync(0xffffffffu, ia, o), xb = __shfl_up_sync(0xffffffffu, ib, o);
        if (lane >= o) {
            ia += xa;
            ib += xb;
        }
    }
    if (lane == 31) {
        sh[w] = ia;
        sh[32 + w] = ib;
    }
    __syncthreads();
    if (w == 0) {
        u32 va = lane < nw ? sh[lane] : 0u, vb = lane < nw ? sh[32 + lane] : 0u;
#pragma unroll
        for (u32 o = 1; o < 32; o <<= 1) {
            const u32 xa = __shfl_up_sync(0xffffffffu, va, o), xb = __shfl_up_sync(0xffffffffu, vb, o);
            if (lane >= o) {
                va += xa;
                vb += xb;
            }
        }
        sh[lane] = va;
        sh[32 + lane] = vb;
    }
    __syncthreads();
    const u32 pa = w > 0 ? sh[w - 1] : 0u, pb = w > 0 ? sh[32 + w - 1] : 0u;
    tot_a = sh[nw - 1];
    tot_b = sh[32 + nw - 1];
    a = pa + ia - a;
    b = pb + ib - b;
}

// Counting sort of the n pairs by expert, for one block (nt threads, a
// multiple of 32, at most 1024). cnt: e u32 of scratch (shared memory); sh: 64
// u32 of shared memory. Writes sorted [cap] (pair ids, MOE_INVALID in padding),
// seg [3 · active] (active expert, start, count, in expert order) and, with
// TILES, tile_expert [tiles_cap] (expert of each `pad`-entry tile, MOE_INVALID
// past the last). Returns the active expert count and the padded total. The
// order of the pairs within an expert's segment is not deterministic (atomic
// cursors); nothing downstream depends on it. Ends without a barrier.
template <bool TILES>
__device__ __forceinline__ void align_core(const u32* __restrict__ idx, u32 n, u32 e, u32 pad, u32 cap, u32 tiles_cap,
                                           u32* cnt, u32* sh, u32* sorted, u32* tile_expert, u32* seg, u32& nact_out,
                                           u32& total_out) {
    const u32 tid = threadIdx.x, nt = blockDim.x;
    for (u32 i = tid; i < e; i += nt) cnt[i] = 0u;
    __syncthreads();
    for (u32 p = tid; p < n; p += nt) {
        const u32 ex = idx[p];
        if (ex < e) atomicAdd(&cnt[ex], 1u);
    }
    __syncthreads();
    // Each thread owns a contiguous range of experts.
    const u32 per = (e + nt - 1) / nt;
    const u32 lo = min(tid * per, e), hi = min(lo + per, e);
    u32 rows = 0, act = 0;
    for (u32 i = lo; i < hi; ++i) {
        const u32 c = cnt[i];
        rows += (c + pad - 1) / pad * pad;
        act += c > 0 ? 1u : 0u;
    }
    u32 total, nact;
    block_scan2(rows, act, total, nact, sh, tid, nt);
    u32 r = rows, a = act;
    for (u32 i = lo; i < hi; ++i) {
        const u32 c = cnt[i];
        const u32 pr = (c + pad - 1) / pad * pad;
        if (c > 0) {
            seg[3 * a] = i;
            seg[3 * a + 1] = r;
            seg[3 * a + 2] = c;
            ++a;
        }
        if (TILES)
            for (u32 q = r / pad; q < (r + pr) / pad; ++q) tile_expert[q] = i;
        for (u32 q = r + c; q < r + pr; ++q) sorted[q] = MOE_INVALID;
        cnt[i] = r;  // becomes the scatter cursor (only this thread touches expert i here)
        r += pr;
    }
    for (u32 q = total + tid; q < cap; q += nt) sorted[q] = MOE_INVALID;
    if (TILES)
        for (u32 q = total / pad + tid; q < tiles_cap; q += nt) tile_expert[q] = MOE_INVALID;
    __syncthreads();
    for (u32 p = tid; p < n; p += nt) {
        const u32 ex = idx[p];
        if (ex < e) sorted[atomicAdd(&cnt[ex], 1u)] = p;
    }
    nact_out = nact;
    total_out = total;
}

// idx [n] (n = t·k expert ids). Outputs: sorted [cap] (pair ids, MOE_INVALID
// in padding), tile_expert [tiles_cap] (expert of each `pad`-entry tile,
// MOE_INVALID past the last), seg [3 · min(e, n)] (active expert, start,
// count, in expert order), meta [2] (active experts, tiles).
// Requires cap = tiles_cap · pad >= Σ_e roundup(count_e, pad).
extern "C" __global__ void __launch_bounds__(1024)
    moe_align(const u32* __restrict__ idx, u32 n, u32 e, u32 pad, u32 cap, u32 tiles_cap, u32* __restrict__ sorted,
              u32* __restrict__ tile_expert, u32* __restrict__ seg, u32* __restrict__ meta) { porter_pdl_enter();
    extern __shared__ u32 cnt[];
    __shared__ u32 sh[64];
    u32 nact, total;
    align_core<true>(idx, n, e, pad, cap, tiles_cap, cnt, sh, sorted, tile_expert, seg, nact, total);
    if (threadIdx.x == 0) {
        meta[0] = nact;
        meta[1] = total / pad;
    }
}

// ---------------------------------------------------------------------------
// 2b/3b. Prefill GEMMs over MOE_BM-row tiles of the sorted list. 1-D grid of
// tiles_cap · nblk blocks (block b: tile b / nblk, column block b % nblk, so
// the column blocks of one tile, and the tiles of one expert, run together);
// tiles whose tile_expert is MOE_INVALID exit. MOE_GEMM_THREADS threads.
//
// C[i][j] (i < MOE_BM, j < MOE_BN) = A_i · W_jᵀ over K, where
// - GU (gate+up): A_i = x[sorted[i] / k] (zero for padding), W_j = gate[c0 + j]
//   for j < 64 and up[c0 + j − 64] for j >= 64, c0 = 64 · column block; the
//   epilogue writes h[tile row i][c0 + j] = round(silu(round(C[i][j])) ·
//   round(C[i][j + 64])) for every row of the tile (padding rows get 0).
// - down: A_i = h[tile row i], W_j = down[c0 + j], c0 = 128 · column block;
//   the epilogue writes o[sorted[i]][c0 + j] = round(C[i][j]) for real rows.
// ---------------------------------------------------------------------------

#define MOE_LDC (MOE_BN + 4)

// Shared epilogue: C staged in shared memory as f32 [MOE_BM][MOE_LDC].
template <typename T, bool GU>
__device__ __forceinline__ void gemm_epilogue(const float* Cs, const u32* s_pair, u32 tile, u32 c0, u32 N,
                                              T* __restrict__ dst, u32 tid) {
    if (GU) {
        for (u32 q = tid; q < MOE_BM * (MOE_BN / 2); q += MOE_GEMM_THREADS) {
            const u32 i = q / (MOE_BN / 2), j = q % (MOE_BN / 2);
            if (c0 + j < N) {
                const float g = round_to<T>(Cs[i * MOE_LDC + j]), u = round_to<T>(Cs[i * MOE_LDC + j + MOE_BN / 2]);
                dst[(u64)(tile * MOE_BM + i) * N + c0 + j] = from_f<T>(silu_f(g) * u);
            }
        }
    } else {
        for (u32 q = tid; q < MOE_BM * MOE_BN; q += MOE_GEMM_THREADS) {
            const u32 i = q / MOE_BN, j = q % MOE_BN;
            const u32 p = s_pair[i];
            if (p != MOE_INVALID && c0 + j < N) dst[(u64)p * N + c0 + j] = from_f<T>(Cs[i * MOE_LDC + j]);
        }
    }
}

// Row pointer j of the weight tile (nullptr past N).
template <typename T, bool GU>
__device__ __forceinline__ const T* w_row(const T* w0, const T* w1, u32 ex, u32 c0, u32 j, u32 K, u32 N) {
    if (GU) {
        const u32 half = MOE_BN / 2;
        const u32 c = c0 + (j % half);
        if (c >= N) return nullptr;
        return (j < half ? w0 : w1) + ((u64)ex * N + c) * K;
    }
    const u32 c = c0 + j;
    return c < N ? w0 + ((u64)ex * N + c) * K : nullptr;
}

// A row pointer i of the tile (nullptr for padding).
template <typename T, bool GU, u32 BM>
__device__ __forceinline__ const T* a_row(const T* a, const u32* s_pair, u32 tile, u32 i, u32 K, u32 k) {
    if (GU) {
        const u32 p = s_pair[i];
        return p == MOE_INVALID ? nullptr : a + (u64)(p / k) * K;
    }
    return a + (u64)(tile * BM + i) * K;
}

// --- CUDA-core fallback (exact f32 math; any T, any alignment) -------------

#define SIMT_BK 16

template <typename T, bool GU>
__device__ __forceinline__ void gemm_simt_impl(const T* __restrict__ a, const T* __restrict__ w0,
                                               const T* __restrict__ w1, const u32* __restrict__ sorted,
                                               const u32* __restrict__ tile_expert, T* __restrict__ dst, u32 K,
                                               u32 N, u32 k, u32 nblk) {
    __shared__ __align__(16) float smem[MOE_BM * MOE_LDC];
    __shared__ u32 s_pair[MOE_BM];
    const u32 tile = blockIdx.x / nblk, cb = blockIdx.x % nblk;
    const u32 ex = tile_expert[tile];
    if (ex == MOE_INVALID) return;
    const u32 tid = threadIdx.x;
    const u32 c0 = cb * (GU ? MOE_BN / 2 : MOE_BN);
    if (tid < MOE_BM) s_pair[tid] = sorted[tile * MOE_BM + tid];
    __syncthreads();
    float* As = smem;                       // [SIMT_BK][MOE_BM + 1]
    float* Bs = smem + SIMT_BK * (MOE_BM + 1);  // [SIMT_BK][MOE_BN + 1]
    // Loader: element q of the A tile -> (row q / SIMT_BK, kk q % SIMT_BK).
    const u32 kk = tid % SIMT_BK, lr = tid / SIMT_BK;  // lr < 16
    const T* ap[MOE_BM / 16];
#pragma unroll
    for (int s = 0; s < MOE_BM / 16; ++s) ap[s] = a_row<T, GU, MOE_BM>(a, s_pair, tile, lr + 16 * s, K, k);
    const T* bp[MOE_BN / 16];
#pragma unroll
    for (int s = 0; s < MOE_BN / 16; ++s) bp[s] = w_row<T, GU>(w0, w1, ex, c0, lr + 16 * s, K, N);
    // Compute: thread -> rows ty·4 + {0..3}, columns tx + 16·{0..7}.
    const u32 tx = tid % 16, ty = tid / 16;
    float acc[4][8];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
    for (u32 k0 = 0; k0 < K; k0 += SIMT_BK) {
        const u32 kc = k0 + kk;
#pragma unroll
        for (int s = 0; s < MOE_BM / 16; ++s)
            As[kk * (MOE_BM + 1) + lr + 16 * s] = (ap[s] != nullptr && kc < K) ? to_f(ap[s][kc]) : 0.0f;
#pragma unroll
        for (int s = 0; s < MOE_BN / 16; ++s)
            Bs[kk * (MOE_BN + 1) + lr + 16 * s] = (bp[s] != nullptr && kc < K) ? to_f(bp[s][kc]) : 0.0f;
        __syncthreads();
#pragma unroll
        for (int q = 0; q < SIMT_BK; ++q) {
            float av[4], bv[8];
#pragma unroll
            for (int i = 0; i < 4; ++i) av[i] = As[q * (MOE_BM + 1) + ty * 4 + i];
#pragma unroll
            for (int j = 0; j < 8; ++j) bv[j] = Bs[q * (MOE_BN + 1) + tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) smem[(ty * 4 + i) * MOE_LDC + tx + 16 * j] = acc[i][j];
    __syncthreads();
    gemm_epilogue<T, GU>(smem, s_pair, tile, c0, N, dst, tid);
}

// --- Tensor cores (wmma 16×16×16, bf16 / f16 in, f32 accumulate; sm_80+) ---
//
// Analysis of the previous form (64×128 tiles, 8 warps of 32×32, BK 32, 3
// stages, 256 threads), Qwen3-Next-80B at t = 4096 (n = 40960 pairs, e = 512,
// ≈ 80 rows per expert, Poisson-like):
// - grid: tiles_cap = n/64 + 512 = 1152 tiles (≈ 1024 real: 2 per expert);
//   gate+up 1152·8 = 9216 blocks (K = 2048: 64 k-steps), down 1152·16 = 18432
//   blocks (K = 512: only 16 k-steps each, so prologue + epilogue weigh a lot).
// - residency (ptxas, sm_90): 64 registers × 256 threads, 46.3 KB static
//   shared memory -> 4 blocks (32 warps) per SM, both limits at 4.
// - shared memory per k-step and block: ldmatrix reads 8 warps × (32×32 A +
//   32×32 W) × 2 B = 32 KB, cp.async writes (64 + 128) × 32 × 2 B = 12 KB:
//   44 KB for 64·128·32·2 = 524 kFLOP, 11.9 FLOP/B. At 128 B/clk/SM that caps
//   the SM at ≈ 1520 FLOP/clk (≈ 400 TFLOP/s on 132 SMs), well under the
//   mma.sync rate: the kernel is shared-memory (ldmatrix) bound, 4 MMAs per 4
//   fragment loads per warp.
// - epilogue: the 64×128 f32 tile staged in shared memory (33.8 KB), then
//   8192 scalar 2-byte stores per block (32 per thread); against 16 k-steps in
//   down that is a large share of the down GEMM.
// - padding: ≈ 80 rows per expert in two 64-row tiles -> 65.5k rows computed
//   for 40960 real ones: 37.5 % of the 412 GFLOP executed is padding (the 98
//   TFLOP/s measured is ≈ 157 TFLOP/s on the executed work).
//
// This form: 4 warps (MOE_TC_THREADS), tiles of BM = 16·MI rows (MI = 1..4,
// chosen on the host from the expected rows per expert, t·k/e, to cut the
// padding: 48 rows at t·k/e = 80, ≈ 98 rows per expert, 18 % padding) ×
// MOE_TC_BN = 256 weight rows; every warp computes all BM rows × 64 weight
// rows (MI×4 fragments: MI + 4 fragment loads per 4·MI MMAs). gate+up: the
// tile holds gate rows c0..c0+127 and up rows c0..c0+127, warp w the gate and
// up rows 32w..32w+31, so SiLU·up is applied in registers (same fragment
// type, so element e of the gate and of the up fragment is the same (i, j))
// and the block writes 128 h columns. BK 32, MOE_TC_STAGES = 4 stages of
// cp.async in dynamic shared memory, 320·(BM + 256) B (BM 48: 97 KB; 2 blocks
// per SM). Per k-step and block at MI = 3: reads 4 × (48 + 64) × 32 × 2 B =
// 28 KB, writes 19 KB: 48 KB for 786 kFLOP, 16.3 FLOP/B (MI = 4: 19.7 FLOP/B)
// against 11.9. Epilogue: C staged as f32 (gate+up: only the 128 h columns),
// written as 16-byte vectors of 8 elements (N % 8 == 0, checked by the host).
// Grid at t = 4096 (BM 48): tiles_cap = 854 + 512 = 1366 (≈ 1030 real);
// gate+up 1366·4 blocks, down 1366·8 blocks.
//
// What this form leaves (moe_prefill.cu's mma.sync GEMMs take it up): the
// padding rows are computed (fragments of padding only included), and at ≈ 80
// rows an expert every expert's weights are streamed ≈ 2.1 times (one pass per
// 48-row tile); its warp tiles give 3.4 MMAs per fragment load at MI = 3; 4
// warps a block re-read A for each 64 weight rows. moe_prefill.cu: 8 warps,
// ldmatrix.x4 from swizzled rows, padding fragments skipped, tiles up to 128
// rows (each expert streamed about once), 4 MMAs per fragment load at 64 × 64.
//
// Needs K % 8 == 0, N % 8 == 0 and 16-byte aligned rows (checked by the host).

#define MOE_TC_THREADS 128
#define MOE_TC_BN 256
#define MOE_TC_BK 32
#define MOE_TC_LDS (MOE_TC_BK + 8)  // 80-byte rows: conflict-free ldmatrix
#define MOE_TC_STAGES 4

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
#if defined(PORTER_SM80)
    const u32 s = (u32)__cvta_generic_to_shared(smem);
    const int sz = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(sz));
#else
    *reinterpret_cast<uint4*>(smem) = valid ? *reinterpret_cast<const uint4*>(gmem) : make_uint4(0u, 0u, 0u, 0u);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(PORTER_SM80)
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
#if defined(PORTER_SM80)
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// 8 f32 -> 8 T packed in 16 bytes.
template <typename T> __device__ __forceinline__ uint4 pack8(const float* f) {
    union {
        uint4 v;
        T h[8];
    } u;
#pragma unroll
    for (int i = 0; i < 8; ++i) u.h[i] = from_f<T>(f[i]);
    return u.v;
}

// 8 f32 -> 8 O at p (16-byte aligned): packed T, or two float4 for f32.
template <typename O> __device__ __forceinline__ void store8(O* p, const float* f) {
    *reinterpret_cast<uint4*>(p) = pack8<O>(f);
}
template <> __device__ __forceinline__ void store8<float>(float* p, const float* f) {
    reinterpret_cast<float4*>(p)[0] = make_float4(f[0], f[1], f[2], f[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(f[4], f[5], f[6], f[7]);
}

// What gemm_tc_impl's A rows and C rows are.
#define TC_GU 0     // gate+up: A = x rows of the tile's pairs; C = h rows of the tile (SiLU·up fused)
#define TC_DOWN 1   // down: A = h rows of the tile; C = o rows of the tile's pairs
#define TC_DENSE 2  // one weight, no grouping: A = rows tile·BM.. (< m) of a [m, K]; C = those rows of [m, N]

// Weight-tile loaders of gemm_tc_impl. Tile row r (r < MOE_TC_BN) of column block c0 of expert
// ex is weight row ex·N + c0 + r, or with GU gate row ex·N + c0 + r (r < 128) / up row
// ex·N + c0 + r − 128. Per k-step a loader stages its rows' MOE_TC_BK columns with cp.async
// (`load`, into STAGE_BYTES of a pipeline stage), turns the landed stage into T [MOE_TC_BN]
// [MOE_TC_LDS] (`convert`: each thread its own chunks, before the block's barrier, into one of
// two CONV_BYTES buffers) and hands that tile to the MMAs (`tile`). This one: weights already T,
// staged as they are (no conversion). fp8_gemm.cu has the FP8 loader (tiles dequantized in
// shared memory).
template <typename T, bool GU> struct TcWeightsT {
    const T* w0;  // gate or down (or the dense weight)
    const T* w1;  // up (GU), else unused
    static constexpr u32 STAGE_BYTES = MOE_TC_BN * MOE_TC_LDS * sizeof(T);
    static constexpr u32 CONV_BYTES = 0;
    // Thread's chunk: 16 bytes (8 elements) ch of tile rows lrow + 32s (s < 8).
    const T* bg;
    const T* bu;
    u32 bvalid, lrow, ch;
    __device__ __forceinline__ void init(u32 tid, u32 ex, u32 c0, u32 N, u32 K) {
        lrow = tid >> 2;
        ch = (tid & 3u) * 8u;
        const u64 wrow = (u64)ex * N + c0 + lrow;
        bg = w0 + wrow * K;
        bu = (GU ? w1 : w0) + wrow * K;
        bvalid = 0;
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            const u32 c = c0 + lrow + 32u * (GU ? (s & 3) : s);
            if (c < N) bvalid |= 1u << s;
        }
    }
    __device__ __forceinline__ void load(unsigned char* stage, u32 k0, u32 K) const {
        T* bs = reinterpret_cast<T*>(stage);
        const u32 kc = k0 + ch;
        const bool in = kc < K;
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            const bool v = ((bvalid >> s) & 1u) != 0u && in;
            const T* src = GU ? (s < 4 ? bg : bu) + (u64)(32 * (s & 3)) * K : bg + (u64)(32 * s) * K;
            cp_async16(bs + (lrow + 32u * s) * MOE_TC_LDS + ch, v ? src + kc : w0, v);
        }
    }
    __device__ __forceinline__ void convert(const unsigned char*, unsigned char*, u32) const {}
    __device__ __forceinline__ const T* tile(const unsigned char* stage, const unsigned char*) const {
        return reinterpret_cast<const T*>(stage);
    }
};

// Block b: tile b / nblk of BM = 16·MI rows, column block b % nblk (gate+up:
// 128 columns of h, c0 = 128·cb; down / dense: 256 columns, c0 = 256·cb). MODE: TC_GU,
// TC_DOWN (sorted / tile_expert from moe_align) or TC_DENSE (m rows; sorted, tile_expert and
// k unused). WL: the weight loader (TcWeightsT, or fp8_gemm.cu's TcWeightsFp8). O: the output
// type (T, or f32 with TC_DENSE). Split-K (TC_DENSE): block row blockIdx.y sums k-steps
// [y·ksteps, (y + 1)·ksteps) and writes its [m, N] partial at dst + y·m·N (gridDim.y = 1 and
// ksteps ≥ the k-steps of K otherwise).
template <typename T, typename O, int MODE, int MI, typename WL>
__device__ __forceinline__ void gemm_tc_impl(const T* __restrict__ a, WL wl, const u32* __restrict__ sorted,
                                             const u32* __restrict__ tile_expert, O* __restrict__ dst, u32 K, u32 N,
                                             u32 k, u32 nblk, u32 m, u32 ksteps) {
#if defined(PORTER_SM80)
    using namespace nvcuda;
    constexpr bool GU = MODE == TC_GU;
    constexpr u32 BM = 16 * MI;
    constexpr u32 A_ELEMS = BM * MOE_TC_LDS;
    constexpr u32 NC = GU ? MOE_TC_BN / 2 : MOE_TC_BN;  // output columns per block
    constexpr u32 LDC = NC + 4;
    constexpr int AS = (int)((BM + 31) / 32);  // A chunks per thread and k-step
    extern __shared__ __align__(128) unsigned char moe_tc_smem[];
    __shared__ u32 s_pair[BM];
    const u32 tile = blockIdx.x / nblk, cb = blockIdx.x % nblk;
    const u32 ex = MODE == TC_DENSE ? 0u : tile_expert[tile];
    if (ex == MOE_INVALID) return;
    const u32 tid = threadIdx.x, warp = tid >> 5;
    const u32 c0 = cb * NC;
    if (MODE != TC_DENSE) {
        if (tid < BM) s_pair[tid] = sorted[tile * BM + tid];
        __syncthreads();
    }
    T* As = reinterpret_cast<T*>(moe_tc_smem);                                             // [STAGES][BM][LDS]
    unsigned char* Ws = moe_tc_smem + MOE_TC_STAGES * A_ELEMS * sizeof(T);                 // [STAGES][STAGE_BYTES]
    unsigned char* Wc = Ws + MOE_TC_STAGES * WL::STAGE_BYTES;                              // [2][CONV_BYTES]
    // A loader: 16-byte chunk ch (8 elements) of A rows lrow + 32s (s < AS, row < BM).
    const u32 lrow = tid >> 2, ch = (tid & 3u) * 8u;
    const T* ap[AS];
#pragma unroll
    for (int s = 0; s < AS; ++s) {
        const u32 r = lrow + 32u * s;
        if (MODE == TC_DENSE)
            ap[s] = r < BM && tile * BM + r < m ? a + (u64)(tile * BM + r) * K : nullptr;
        else
            ap[s] = r < BM ? a_row<T, GU, BM>(a, s_pair, tile, r, K, k) : nullptr;
    }
    wl.init(tid, ex, c0, N, K);
    auto load = [&](u32 st, u32 k0) {
        const u32 kc = k0 + ch;
        const bool in = kc < K;
        T* as = As + st * A_ELEMS;
#pragma unroll
        for (int s = 0; s < AS; ++s) {
            const u32 r = lrow + 32u * s;
            if (r < BM) {
                const bool v = ap[s] != nullptr && in;
                cp_async16(as + r * MOE_TC_LDS + ch, v ? ap[s] + kc : a, v);
            }
        }
        wl.load(Ws + st * WL::STAGE_BYTES, k0, K);
    };
    // Warp w: B fragment j (16 tile rows) at brow(j): GU: gate 32w + 16j (j <
    // 2), up 128 + 32w + 16(j − 2); down / dense: 64w + 16j.
    auto brow = [&](int j) -> u32 {
        return GU ? (u32)(j >> 1) * 128u + 32u * warp + 16u * (u32)(j & 1) : 64u * warp + 16u * (u32)j;
    };
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[MI][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
    const u32 nk_all = (K + MOE_TC_BK - 1) / MOE_TC_BK;
    const u32 kt0 = min(blockIdx.y * ksteps, nk_all);  // blockIdx.y = 0 without a split
    const u32 nk = min(nk_all - kt0, ksteps);
    if (MODE == TC_DENSE) dst += (u64)blockIdx.y * m * N;
    // Commit groups G0..G(S−2) (tiles 0..S−2, empty past the last); iteration
    // kt commits G(kt + S − 1), so "all but the newest S − 2 groups done" means
    // tile kt has landed (this thread's chunks: the loader converts only its own
    // before the barrier). The stage refilled in iteration kt, (kt − 1) % S, was
    // last read in iteration kt − 1, which every warp has left at the barrier;
    // conversion buffer kt % 2 was last read in iteration kt − 2, likewise.
#pragma unroll
    for (u32 s = 0; s < MOE_TC_STAGES - 1; ++s) {
        if (s < nk) load(s, (kt0 + s) * MOE_TC_BK);
        cp_async_commit();
    }
    for (u32 kt = 0; kt < nk; ++kt) {
        cp_async_wait<MOE_TC_STAGES - 2>();
        const u32 st = kt % MOE_TC_STAGES;
        unsigned char* conv = Wc + (kt & 1u) * WL::CONV_BYTES;
        wl.convert(Ws + st * WL::STAGE_BYTES, conv, (kt0 + kt) * MOE_TC_BK);
        __syncthreads();
        const u32 kn = kt + MOE_TC_STAGES - 1;
        if (kn < nk) load(kn % MOE_TC_STAGES, (kt0 + kn) * MOE_TC_BK);
        cp_async_commit();
        const T* as = As + st * A_ELEMS;
        const T* bs = wl.tile(Ws + st * WL::STAGE_BYTES, conv);
#pragma unroll
        for (u32 kk = 0; kk < MOE_TC_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[MI];
#pragma unroll
            for (int i = 0; i < MI; ++i) wmma::load_matrix_sync(fa[i], as + 16 * i * MOE_TC_LDS + kk, MOE_TC_LDS);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
                wmma::load_matrix_sync(fb, bs + brow(j) * MOE_TC_LDS + kk, MOE_TC_LDS);
#pragma unroll
                for (int i = 0; i < MI; ++i) wmma::mma_sync(acc[i][j], fa[i], fb, acc[i][j]);
            }
        }
    }
    // Only empty groups can be pending; the stages become the C staging area
    // [BM][LDC] f32 (the host sizes the dynamic shared memory for the larger of the
    // stages + conversion buffers and this).
    cp_async_wait<0>();
    __syncthreads();
    float* Cs = reinterpret_cast<float*>(moe_tc_smem);
    if (GU) {
        // h = silu(round(g)) · round(u) (rounded to T at the store below).
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
#pragma unroll
                for (int q = 0; q < acc[i][j].num_elements; ++q) {
                    const float g = round_to<T>(acc[i][j].x[q]), u = round_to<T>(acc[i][j + 2].x[q]);
                    acc[i][j].x[q] = silu_f(g) * u;
                }
                wmma::store_matrix_sync(Cs + 16 * i * LDC + 32 * warp + 16 * j, acc[i][j], LDC, wmma::mem_row_major);
            }
    } else {
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
                wmma::store_matrix_sync(Cs + 16 * i * LDC + 64 * warp + 16 * j, acc[i][j], LDC, wmma::mem_row_major);
    }
    __syncthreads();
    // 16-byte stores: vector v (8 columns) of row i. gate+up: every row of the
    // tile (padding rows get silu(0)·0 = 0); down: rows of real pairs, at
    // o[pair]; dense: rows below m.
    constexpr u32 VPR = NC / 8;
    for (u32 q = tid; q < BM * VPR; q += MOE_TC_THREADS) {
        const u32 i = q / VPR, v = q % VPR, c = c0 + 8 * v;
        if (c >= N) continue;
        u64 row;
        if (MODE == TC_GU) {
            row = (u64)tile * BM + i;
        } else if (MODE == TC_DOWN) {
            const u32 p = s_pair[i];
            if (p == MOE_INVALID) continue;
            row = p;
        } else {
            if (tile * BM + i >= m) continue;
            row = (u64)tile * BM + i;
        }
        const float4 f0 = *reinterpret_cast<const float4*>(Cs + i * LDC + 8 * v);
        const float4 f1 = *reinterpret_cast<const float4*>(Cs + i * LDC + 8 * v + 4);
        const float f[8] = {f0.x, f0.y, f0.z, f0.w, f1.x, f1.y, f1.z, f1.w};
        store8<O>(dst + row * N + c, f);
    }
#else
    // Fallback build (below sm_80 or PORTER_FALLBACK): the host never launches this kernel.
    __trap();
#endif
}

// a: x [t, H] (gate+up) or h [cap, I] (down); w0: gate or down; w1: up (or
// down again, unused); dst: h [cap, I] or o [n, H]; K = H, N = I (gate+up) or
// K = I, N = H (down); k: slots per row; nblk: column blocks per tile.
extern "C" __global__ void __launch_bounds__(256)
    moe_gemm_gu_simt_f32(const float* a, const float* w0, const float* w1, const u32* sorted, const u32* tile_expert,
                         float* dst, u32 K, u32 N, u32 k, u32 nblk) { porter_pdl_enter();
    gemm_simt_impl<float, true>(a, w0, w1, sorted, tile_expert, dst, K, N, k, nblk);
}
extern "C" __global__ void __launch_bounds__(256)
    moe_gemm_gu_simt_bf16(const bf16* a, const bf16* w0, const bf16* w1, const u32* sorted, const u32* tile_expert,
                          bf16* dst, u32 K, u32 N, u32 k, u32 nblk) { porter_pdl_enter();
    gemm_simt_impl<bf16, true>(a, w0, w1, sorted, tile_expert, dst, K, N, k, nblk);
}
extern "C" __global__ void __launch_bounds__(256)
    moe_gemm_gu_simt_f16(const f16* a, const f16* w0, const f16* w1, const u32* sorted, const u32* tile_expert,
                         f16* dst, u32 K, u32 N, u32 k, u32 nblk) { porter_pdl_enter();
    gemm_simt_impl<f16, true>(a, w0, w1, sorted, tile_expert, dst, K, N, k, nblk);
}
extern "C" __global__ void __launch_bounds__(256)
    moe_gemm_down_simt_f32(const float* a, const float* w0, const float* w1, const u32* sorted,
                           const u32* tile_expert, float* dst, u32 K, u32 N, u32 k, u32 nblk) { porter_pdl_enter();
    gemm_simt_impl<float, false>(a, w0, w1, sorted, tile_expert, dst, K, N, k, nblk);
}
extern "C" __global__ void __launch_bounds__(256)
    moe_gemm_down_simt_bf16(const bf16* a, const bf16* w0, const bf16* w1, const u32* sorted,
                            const u32* tile_expert, bf16* dst, u32 K, u32 N, u32 k, u32 nblk) { porter_pdl_enter();
    gemm_simt_impl<bf16, false>(a, w0, w1, sorted, tile_expert, dst, K, N, k, nblk);
}
extern "C" __global__ void __launch_bounds__(256)
    moe_gemm_down_simt_f16(const f16* a, const f16* w0, const f16* w1, const u32* sorted, const u32* tile_expert,
                           f16* dst, u32 K, u32 N, u32 k, u32 nblk) { porter_pdl_enter();
    gemm_simt_impl<f16, false>(a, w0, w1, sorted, tile_expert, dst, K, N, k, nblk);
}
// Tensor-core entries: moe_gemm_{gu,down}_tc{MI}_{bf16,f16}, tiles of 16·MI rows;
// dynamic shared memory max(MOE_TC_STAGES · (16·MI + 256) · MOE_TC_LDS ·
// sizeof(T), 16·MI · (NC + 4) · 4) bytes (the host computes it).
#define MOE_TC_ENTRY(T, NAME, MI)                                                                                 \
    extern "C" __global__ void __launch_bounds__(MOE_TC_THREADS)                                                  \
        moe_gemm_gu_tc##MI##_##NAME(const T* a, const T* w0, const T* w1, const u32* sorted,                      \
                                    const u32* tile_expert, T* dst, u32 K, u32 N, u32 k, u32 nblk) { porter_pdl_enter();              \
        gemm_tc_impl<T, T, TC_GU, MI>(a, TcWeightsT<T, true>{w0, w1}, sorted, tile_expert, dst, K, N, k, nblk, 0u, \
                                      0xffffffffu);                                                               \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(MOE_TC_THREADS)                                                  \
        moe_gemm_down_tc##MI##_##NAME(const T* a, const T* w0, const T* w1, const u32* sorted,                    \
                                      const u32* tile_expert, T* dst, u32 K, u32 N, u32 k, u32 nblk) { porter_pdl_enter();            \
        gemm_tc_impl<T, T, TC_DOWN, MI>(a, TcWeightsT<T, false>{w0, w0}, sorted, tile_expert, dst, K, N, k, nblk,  \
                                        0u, 0xffffffffu);                                                         \
    }

MOE_TC_ENTRY(bf16, bf16, 1)
MOE_TC_ENTRY(bf16, bf16, 2)
MOE_TC_ENTRY(bf16, bf16, 3)
MOE_TC_ENTRY(bf16, bf16, 4)
MOE_TC_ENTRY(f16, f16, 1)
MOE_TC_ENTRY(f16, f16, 2)
MOE_TC_ENTRY(f16, f16, 3)
MOE_TC_ENTRY(f16, f16, 4)

// ---------------------------------------------------------------------------
// 4. Combine: out[r, c] = Σ_j round(o)[r·k + j, c] · w[r, j] (f32, j ascending;
// slots with an expert id >= e contribute nothing). Grid-stride over t·H.
// ---------------------------------------------------------------------------

// o as written by another block of the same kernel (the decode GEMVs' combine):
// read through L2 (ld.global.cg), never a stale L1 line.
template <typename T> __device__ __forceinline__ float ld_cg_f(const T* p);
template <> __device__ __forceinline__ float ld_cg_f<float>(const float* p) { return __ldcg(p); }
template <> __device__ __forceinline__ float ld_cg_f<bf16>(const bf16* p) {
    return __bfloat162float(__ushort_as_bfloat16(__ldcg(reinterpret_cast<const unsigned short*>(p))));
}
template <> __device__ __forceinline__ float ld_cg_f<f16>(const f16* p) {
    return __half2float(__ushort_as_half(__ldcg(reinterpret_cast<const unsigned short*>(p))));
}

#define MOE_COMBINE_K 16  // slots whose terms are loaded at once (all of them up to this k)

// out[r, c] of the combine (the one definition of its order: f32, slots
// ascending, invalid ids skipped). Up to MOE_COMBINE_K slots every term is
// loaded first (independent loads, one memory latency, not k in a chain), then
// summed in slot order; beyond, one slot at a time.
template <typename T>
__device__ __forceinline__ float combine_at(const T* __restrict__ o, const u32* __restrict__ idx,
                                            const float* __restrict__ w, u64 r, u32 c, u32 H, u32 k, u32 e) {
    float acc = 0.0f;
    if (k <= MOE_COMBINE_K) {
        float term[MOE_COMBINE_K];
        bool ok[MOE_COMBINE_K];
#pragma unroll
        for (u32 j = 0; j < MOE_COMBINE_K; ++j) {
            const u64 p = r * k + j;
            ok[j] = j < k && __ldg(idx + p) < e;
            term[j] = ok[j] ? __fmul_rn(ld_cg_f<T>(o + p * H + c), __ldg(w + p)) : 0.0f;
        }
#pragma unroll
        for (u32 j = 0; j < MOE_COMBINE_K; ++j)
            if (ok[j]) acc = __fadd_rn(acc, term[j]);
        return acc;
    }
    for (u32 j = 0; j < k; ++j) {
        const u64 p = r * k + j;
        if (__ldg(idx + p) < e) acc = __fadd_rn(acc, __fmul_rn(ld_cg_f<T>(o + p * H + c), __ldg(w + p)));
    }
    return acc;
}

template <typename T>
__device__ __forceinline__ void combine_impl(const T* __restrict__ o, const u32* __restrict__ idx,
                                             const float* __restrict__ w, float* __restrict__ out, u64 total, u32 H,
                                             u32 k, u32 e) {
    for (u64 q = (u64)blockIdx.x * blockDim.x + threadIdx.x; q < total; q += (u64)gridDim.x * blockDim.x)
        out[q] = combine_at<T>(o, idx, w, q / H, (u32)(q % H), H, k, e);
}

// The combine of 8 consecutive columns a thread for 2-byte T (H % 8 == 0): 16-byte loads of
// o (one per valid slot, all issued before the sums), the same per-element terms and slot
// order as combine_at (same bits), two float4 stores. total8 = rows · H / 8.
template <typename T>
__device__ __forceinline__ void combine8_impl(const T* __restrict__ o, const u32* __restrict__ idx,
                                              const float* __restrict__ w, float* __restrict__ out, u64 total8, u32 H,
                                              u32 k, u32 e) {
    const u32 h8 = H / 8u;
    for (u64 q = (u64)blockIdx.x * blockDim.x + threadIdx.x; q < total8; q += (u64)gridDim.x * blockDim.x) {
        const u64 r = q / h8;
        const u32 c = (u32)(q % h8) * 8u;
        float acc[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
        uint4 v[MOE_COMBINE_K];
        float wj[MOE_COMBINE_K];
        bool ok[MOE_COMBINE_K];
#pragma unroll
        for (u32 j = 0; j < MOE_COMBINE_K; ++j) {
            const u64 p = r * k + j;
            ok[j] = j < k && __ldg(idx + p) < e;
            v[j] = ok[j] ? __ldcg(reinterpret_cast<const uint4*>(o + p * H + c)) : make_uint4(0u, 0u, 0u, 0u);
            wj[j] = ok[j] ? __ldg(w + p) : 0.0f;
        }
#pragma unroll
        for (u32 j = 0; j < MOE_COMBINE_K; ++j) {
            if (!ok[j]) continue;
            const T* h = reinterpret_cast<const T*>(&v[j]);
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[i] = __fadd_rn(acc[i], __fmul_rn(to_f(h[i]), wj[j]));
        }
        float4* dst = reinterpret_cast<float4*>(out + r * H + c);
        dst[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        dst[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    }
}
extern "C" __global__ void moe_combine8_bf16(const bf16* o, const u32* idx, const float* w, float* out, u64 total8,
                                             u32 H, u32 k, u32 e) { porter_pdl_enter();
    combine8_impl<bf16>(o, idx, w, out, total8, H, k, e);
}
extern "C" __global__ void moe_combine8_f16(const f16* o, const u32* idx, const float* w, float* out, u64 total8,
                                            u32 H, u32 k, u32 e) { porter_pdl_enter();
    combine8_impl<f16>(o, idx, w, out, total8, H, k, e);
}

extern "C" __global__ void moe_combine_f32(const float* o, const u32* idx, const float* w, float* out, u64 total,
                                           u32 H, u32 k, u32 e) { porter_pdl_enter();
    combine_impl<float>(o, idx, w, out, total, H, k, e);
}
extern "C" __global__ void moe_combine_bf16(const bf16* o, const u32* idx, const float* w, float* out, u64 total,
                                            u32 H, u32 k, u32 e) { porter_pdl_enter();
    combine_impl<bf16>(o, idx, w, out, total, H, k, e);
}
extern "C" __global__ void moe_combine_f16(const f16* o, const u32* idx, const float* w, float* out, u64 total,
                                           u32 H, u32 k, u32 e) { porter_pdl_enter();
    combine_impl<f16>(o, idx, w, out, total, H, k, e);
}

// FP8 prefill GEMMs (weights: fp8.cu's layout, e4m3 bytes + 128×128 block scales + row →
// scale-row map). Compiled after moe.cu and fp8.cu in one text (kernels/src/cuda/compile.rs): it
// reuses moe.cu's tensor-core GEMM (`gemm_tc_impl`, `cp_async16`, `pack8`) and fp8.cu's
// e4m3 conversion (`fp8_unpack16`, `fp8_f`).
//
// Two ways to feed tensor cores from FP8 weights (docs/architecture.md §6.1 says which one runs):
// 1. Tile dequantization (weights-only, sm_80+): moe.cu's cp.async + wmma GEMM with a weight
//    loader that stages the e4m3 bytes of each k-step (half the bytes of a bf16 tile) and
//    dequantizes them in shared memory to the activation type with their block scale,
//    exactly as fp8_dequant does (W = round_T(e4m3 · scale)): the dense GEMM (`fp8_gemm_tc*`)
//    and the grouped MoE GEMMs (`moe_gemm_{gu,down}_fp8_tc*`, moe.cu's grouping) without a
//    dequantized copy of the weight in memory.
// 2. e4m3 MMA (sm_89+): activations quantized per token and per 128 columns (scale = amax /
//    448, `fp8_act_quant_*`), `mma.sync.m16n8k32.e4m3.e4m3.f32` over each 128-column block,
//    the block's sum added to the f32 accumulator times a_scale[row, kb] · w_scale[col, kb]
//    (the DeepSeek-V3 / vLLM `w8a8_block_fp8_matmul` scheme): dense `fp8_gemm_mma8_*` and
//    grouped `moe_gemm_{gu,down}_fp8_mma8_*` (x and h quantized per row).

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !defined(PORTER_FALLBACK)
#define PORTER_SM89 1
#endif

// ---------------------------------------------------------------------------
// 1. Tile dequantization: the FP8 weight loader of gemm_tc_impl (see TcWeightsT in moe.cu).
// A k-step stages MOE_TC_BN rows × MOE_TC_BK e4m3 bytes (8 KiB, 32-byte rows); thread tid
// owns 16-byte chunk tid & 1 of tile rows (tid >> 1) + 64s (s < 4): it cp.asyncs them, and
// after its own wait dequantizes them (16 values, one scale: a chunk never crosses a 128-column
// block; fp8_dequant16_packed) into the T tile [MOE_TC_BN][MOE_TC_LDS] the MMAs read. Shared memory at MI = 3, bf16:
// A 4 × 3.75 KiB + bytes 4 × 8 KiB + conversion 2 × 20 KiB = 87 KiB (the bf16 weights: 97 KiB).
// ---------------------------------------------------------------------------

// 16 e4m3 bytes times s, rounded to T, packed (o[0]: elements 0-7, o[1]: 8-15): fp8_unpack16's
// values (the same e4m3 · s product, one rounding), without the f32 round trip and repacking
// (half the conversion instructions: the loader converts every weight byte).
template <typename T> __device__ __forceinline__ void fp8_dequant16_packed(const uint4& v, float s, uint4 (&o)[2]) {
    const unsigned short* p = reinterpret_cast<const unsigned short*>(&v);
    u32* w = reinterpret_cast<u32*>(o);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float2 t = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)p[i], __NV_E4M3)));
        w[i] = pack2_rn<T>(t.x * s, t.y * s);
    }
}

template <typename T, bool GU> struct TcWeightsFp8 {
    const unsigned char* q0;  // gate or down (or the dense weight): [rows, K] bytes
    const float* s0;          // its scales [scale_rows, ceil(K/128)]
    const u32* rs0;           // its row -> scale-row map
    const unsigned char* q1;  // up (GU), else unused
    const float* s1;
    const u32* rs1;
    static constexpr u32 STAGE_BYTES = MOE_TC_BN * MOE_TC_BK;
    static constexpr u32 CONV_BYTES = MOE_TC_BN * MOE_TC_LDS * sizeof(T);
    const unsigned char* src[4];  // the thread's chunks at k = 0
    const float* srow[4];         // their scale rows
    u32 valid, row, half;
    __device__ __forceinline__ void init(u32 tid, u32 ex, u32 c0, u32 N, u32 K) {
        half = tid & 1u;
        row = tid >> 1;
        valid = 0;
        const u32 nsc = (K + FP8_BLOCK - 1) / FP8_BLOCK;
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            // GU: tile rows 0..127 are gate rows c0.., 128..255 up rows c0..
            const bool second = GU && s >= 2;
            const u32 c = c0 + row + 64u * (GU ? (u32)(s & 1) : (u32)s);
            if (c < N) valid |= 1u << s;
            const u64 g = (u64)ex * N + min(c, N - 1);
            src[s] = (second ? q1 : q0) + g * K + 16u * half;
            srow[s] = (second ? s1 : s0) + (u64)__ldg((second ? rs1 : rs0) + g) * nsc;
        }
    }
    __device__ __forceinline__ void load(unsigned char* stage, u32 k0, u32 K) const {
        const bool in = k0 + 16u * half < K;
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const bool v = ((valid >> s) & 1u) != 0u && in;
            cp_async16(stage + (row + 64u * s) * MOE_TC_BK + 16u * half, v ? src[s] + k0 : q0, v);
        }
    }
    // Chunks past K or past N were zero-filled: they dequantize to 0.
    __device__ __forceinline__ void convert(const unsigned char* stage, unsigned char* conv, u32 k0) const {
        T* o = reinterpret_cast<T*>(conv);
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const u32 r = row + 64u * s;
            const uint4 v = *reinterpret_cast<const uint4*>(stage + r * MOE_TC_BK + 16u * half);
            uint4 d[2];
            fp8_dequant16_packed<T>(v, __ldg(srow[s] + k0 / FP8_BLOCK), d);
            uint4* dst = reinterpret_cast<uint4*>(o + r * MOE_TC_LDS + 16u * half);
            dst[0] = d[0];
            dst[1] = d[1];
        }
    }
    __device__ __forceinline__ const T* tile(const unsigned char*, const unsigned char* conv) const {
        return reinterpret_cast<const T*>(conv);
    }
};

// Dense: out[m, N] = x[m, K] · W[N, K]ᵀ, grid (ceil(m / 16·MI) · nblk, splits) blocks (nblk =
// ceil(N / 256); split-K: split y sums k-steps [y·ksteps, (y + 1)·ksteps) into out + y·m·N, an
// f32 workspace that fp8_splitk_reduce sums), MOE_TC_THREADS threads; dynamic shared memory
// max(4 · (16·MI · 40 · sizeof(A) + 8192) + 2 · 256 · 40 · sizeof(A), 16·MI · 260 · 4) bytes
// (the host computes it). Needs K % 16 == 0, N % 8 == 0, 16-byte aligned x, q and out (checked
// by the host).
#define FP8_TC_DENSE(NA, A, NO, O, MI)                                                                         \
    extern "C" __global__ void __launch_bounds__(MOE_TC_THREADS) fp8_gemm_tc##MI##_##NA##_##NO(               \
        const A* x, const unsigned char* q, const float* sc, const u32* rs, O* out, u32 K, u32 N, u32 m,      \
        u32 nblk, u32 ksteps) { porter_pdl_enter();                                                                                \
        gemm_tc_impl<A, O, TC_DENSE, MI>(x, TcWeightsFp8<A, false>{q, sc, rs, q, sc, rs}, nullptr, nullptr, out, \
                                         K, N, 1u, nblk, m, ksteps);                                           \
    }
#define FP8_TC_DENSE_MI(NA, A, NO, O)                                                               \
    FP8_TC_DENSE(NA, A, NO, O, 1)                                                                   \
    FP8_TC_DENSE(NA, A, NO, O, 2) FP8_TC_DENSE(NA, A, NO, O, 3) FP8_TC_DENSE(NA, A, NO, O, 4)
FP8_TC_DENSE_MI(bf16, bf16, bf16, bf16)
FP8_TC_DENSE_MI(bf16, bf16, f32, float)
FP8_TC_DENSE_MI(f16, f16, f16, f16)
FP8_TC_DENSE_MI(f16, f16, f32, float)

// Split-K sum: out[i] = Σ_y ws[y · total + i] (f32, y ascending: deterministic), one rounding
// to O. Grid-stride over total.
template <typename O>
__device__ __forceinline__ void fp8_splitk_reduce_impl(const float* __restrict__ ws, O* __restrict__ out, u32 splits,
                                                       u64 total) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (u32 y = 0; y < splits; ++y) s += __ldg(ws + y * total + i);
        out[i] = from_f<O>(s);
    }
}
#define FP8_SPLITK_REDUCE(NO, O)                                                                                 \
    extern "C" __global__ void fp8_splitk_reduce_##NO(const float* ws, O* out, u32 splits, u64 total) { porter_pdl_enter();         \
        fp8_splitk_reduce_impl<O>(ws, out, splits, total);                                                       \
    }
FP8_SPLITK_REDUCE(bf16, bf16)
FP8_SPLITK_REDUCE(f16, f16)
FP8_SPLITK_REDUCE(f32, float)

// Grouped MoE GEMMs with FP8 experts (moe.cu's moe_gemm_{gu,down}_tc{MI}_<T> with the weights
// given as bytes, scales and scale-row maps; the same grouping, tiles, launch shape; dynamic
// shared memory as the dense form above). gate / up [e·I, H], down [e·H, I].
#define FP8_TC_MOE(T, NAME, MI)                                                                                 \
    extern "C" __global__ void __launch_bounds__(MOE_TC_THREADS) moe_gemm_gu_fp8_tc##MI##_##NAME(              \
        const T* a, const unsigned char* q0, const float* s0, const u32* rs0, const unsigned char* q1,          \
        const float* s1, const u32* rs1, const u32* sorted, const u32* tile_expert, T* dst, u32 K, u32 N, u32 k, \
        u32 nblk) { porter_pdl_enter();                                                                                             \
        gemm_tc_impl<T, T, TC_GU, MI>(a, TcWeightsFp8<T, true>{q0, s0, rs0, q1, s1, rs1}, sorted, tile_expert,  \
                                      dst, K, N, k, nblk, 0u, 0xffffffffu);                                     \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(MOE_TC_THREADS) moe_gemm_down_fp8_tc##MI##_##NAME(            \
        const T* a, const unsigned char* q, const float* s, const u32* rs, const u32* sorted,                   \
        const u32* tile_expert, T* dst, u32 K, u32 N, u32 k, u32 nblk) { porter_pdl_enter();                                        \
        gemm_tc_impl<T, T, TC_DOWN, MI>(a, TcWeightsFp8<T, false>{q, s, rs, q, s, rs}, sorted, tile_expert, dst, \
                                        K, N, k, nblk, 0u, 0xffffffffu);                                        \
    }
#define FP8_TC_MOE_MI(T, NAME) \
    FP8_TC_MOE(T, NAME, 1) FP8_TC_MOE(T, NAME, 2) FP8_TC_MOE(T, NAME, 3) FP8_TC_MOE(T, NAME, 4)
FP8_TC_MOE_MI(bf16, bf16)
FP8_TC_MOE_MI(f16, f16)

// ---------------------------------------------------------------------------
// 2a. Activation quantization per token and 128-column group: one warp per (row, group), 4
// values per lane; scale = amax / 448 (1 for an all-zero group), q = e4m3(x / scale) rounded
// to nearest even and saturated: the CPU's quantize_blocks formula on 1 × 128 blocks.
// x [m, K] -> q [m, K] bytes, s [m, ceil(K/128)] f32. Grid: ceil(m · groups / 8), 256 threads.
// ---------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void fp8_act_quant_impl(const T* __restrict__ x, unsigned char* __restrict__ q,
                                                   float* __restrict__ s, u32 m, u32 K) {
    const u32 nkb = (K + FP8_BLOCK - 1) / FP8_BLOCK, lane = threadIdx.x & 31u;
    const u64 w = (u64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (w >= (u64)m * nkb) return;
    const u32 r = (u32)(w / nkb), kb = (u32)(w % nkb), c = kb * FP8_BLOCK + 4u * lane;
    float v[4];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[i] = c + i < K ? to_f(x[(u64)r * K + c + i]) : 0.0f;
        amax = fmaxf(amax, fabsf(v[i]));
    }
    amax = warp_max(amax);
    const float sc = amax > 0.0f ? __fdiv_rn(amax, FP8_MAX) : 1.0f;
    if (lane == 0) s[(u64)r * nkb + kb] = sc;
#pragma unroll
    for (int i = 0; i < 4; ++i)
        if (c + i < K)
            q[(u64)r * K + c + i] = (unsigned char)__nv_cvt_float_to_fp8(__fdiv_rn(v[i], sc), __NV_SATFINITE, __NV_E4M3);
}

#define FP8_ACT_QUANT(NT, T)                                                                                      \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        fp8_act_quant_##NT(const T* x, unsigned char* q, float* s, u32 m, u32 K) { porter_pdl_enter();                                \
        fp8_act_quant_impl<T>(x, q, s, m, K);                                                                     \
    }
FP8_ACT_QUANT(bf16, bf16)
FP8_ACT_QUANT(f16, f16)

// ---------------------------------------------------------------------------
// 2b. e4m3 MMA GEMMs: C[r, j] = Σ_kb a_s[r, kb] · w_s[rs[j], kb] · Σ_{c in kb} e4m3(aq[r, c]) ·
// e4m3(wq[j, c]). BK = 128 (one scale block per k-step), S cp.async stages of (BM + BN) · 128
// bytes (A then W, 128-byte rows with the 16-byte chunks XOR-swizzled by row so that ldmatrix
// and the cp.async stores are conflict-free), 16 warps of 32 × 32 (WM × WN = 16; 2 m16 × 4 n8
// MMA tiles each; ldmatrix.x4 yields the 8-bit A / B fragments directly: an 8 × 16-byte matrix
// is a fragment's 8 rows × 4 bytes per lane). 32 × 32 warp tiles rather than 64 × 32: the
// accumulators and the k-step's partial sums (2 × 32 f32 a thread) fit the 128 registers of
// 512 threads without spills (64 × 32 needed 255 and spilled). Each k-step sums its 4 k32 MMAs
// into fresh f32 registers and adds them times the two scales (DeepGEMM's promotion: the
// tensor cores' accumulation stays within one 128-column block). Needs K % 16 == 0 and 16-byte
// aligned aq / wq (the host checks). The block scales of a k-step (BM A rows, BN W rows) are
// staged with its tiles (plain loads into shared memory, read after the barrier). FP8_MMA_THREADS
// threads, S · (BM + BN) · 132 bytes of dynamic shared memory.
// - TC_DENSE (WM = WN = 4, 128 × 128 tiles): out[m, n] = x · Wᵀ, grid (ceil(n/128), ceil(m/128)).
// - TC_GU / TC_DOWN (WM = 2, WN = 8: 64 × 256 tiles, moe.cu's grouping padded to 64 rows):
//   block b: tile b / nblk, column block b % nblk. aq: x quantized per token (GU; pair p reads
//   row p / k) or h quantized per sorted row (DOWN). GU: warp wn's 32 tile rows are gate rows
//   c0 + 16wn.. (16) then up rows c0 + 16wn.. (16), c0 = 128·cb, so a thread's n8 tiles 0, 1
//   (gate) and 2, 3 (up) hold the same (row, h column): h = silu(round(g)) · round(u) in
//   registers, 128 h columns a block (every row of the tile; padding rows get 0). DOWN: 256
//   o columns a block, rows of real pairs at o[pair].
// ---------------------------------------------------------------------------
#define FP8_MMA_BK 128u
#define FP8_MMA_THREADS 512
#define FP8_MMA_MI 2  // m16 tiles per warp

// Byte offset of 16-byte chunk c (0..7) of row r of a swizzled [rows][128]-byte tile.
__device__ __forceinline__ u32 fp8_sw(u32 r, u32 c) { return r * 128u + ((c ^ (r & 7u)) << 4); }

// Two adjacent outputs (a at column c, b at c + 1) of row `row` (bounds: c < n).
template <typename O> __device__ __forceinline__ void fp8_store2(O* row, u32 n, u32 c, float a, float b) {
    if (c < n) row[c] = from_f<O>(a);
    if (c + 1 < n) row[c + 1] = from_f<O>(b);
}

template <typename O, int S, int MODE, int WM>
__device__ __forceinline__ void fp8_mma8_impl(const unsigned char* __restrict__ aq, const float* __restrict__ as,
                                              const unsigned char* __restrict__ wq0, const float* __restrict__ ws0,
                                              const u32* __restrict__ wrs0, const unsigned char* __restrict__ wq1,
                                              const float* __restrict__ ws1, const u32* __restrict__ wrs1,
                                              const u32* __restrict__ sorted, const u32* __restrict__ tile_expert,
                                              O* __restrict__ out, u32 m, u32 K, u32 n, u32 k, u32 nblk) {
#if defined(PORTER_SM89)
    constexpr int WN = 16 / WM;
    constexpr u32 BM = 32u * WM, BN = 32u * WN;
    // Stage: A tile, W tile, then the k-step's scales (A rows, then W rows = C columns).
    constexpr u32 A_TILE = BM * 128u, SCALES = (BM + BN) * 128u, STAGE = (BM + BN) * 132u;
    constexpr int AC = (int)(BM * 8u / FP8_MMA_THREADS), WC = (int)(BN * 8u / FP8_MMA_THREADS);
    constexpr bool GU = MODE == TC_GU;
    extern __shared__ __align__(128) unsigned char fp8_mma_smem[];
    __shared__ u32 s_pair[MODE == TC_DENSE ? 1 : BM];
    const u32 tid = threadIdx.x, warp = tid >> 5, lane = tid & 31u;
    u32 m0, c0, ex;
    if (MODE == TC_DENSE) {
        m0 = blockIdx.y * BM;
        c0 = blockIdx.x * BN;
        ex = 0;
    } else {
        const u32 tile = blockIdx.x / nblk, cb = blockIdx.x % nblk;
        ex = tile_expert[tile];
        if (ex == MOE_INVALID) return;
        m0 = tile * BM;
        c0 = cb * (GU ? BN / 2 : BN);
        if (tid < BM) s_pair[tid] = sorted[m0 + tid];
        __syncthreads();
    }
    const u32 nkb = (K + FP8_BLOCK - 1) / FP8_BLOCK;
    // Source row of A tile row r (MOE_INVALID: none, zeros).
    auto a_src = [&](u32 r) -> u32 {
        if (MODE == TC_DENSE) return m0 + r < m ? m0 + r : MOE_INVALID;
        if (MODE == TC_DOWN) return m0 + r;
        const u32 p = s_pair[r];
        return p == MOE_INVALID ? MOE_INVALID : p / k;
    };
    // W tile row (= C column) t: weight column c (< n: valid) and whether it is an up row.
    auto w_col = [&](u32 t, bool& up) -> u32 {
        up = GU && (t & 16u) != 0u;
        return GU ? c0 + 16u * (t >> 5) + (t & 15u) : c0 + t;
    };
    // Loader: 16-byte chunk lc of A tile rows lr + 64s (s < AC) and W tile rows lr + 64s (s < WC).
    // (The W rows are recomputed at each load: held in registers, the grouped forms spilled.)
    const u32 lr = tid >> 3, lc = tid & 7u;
    u32 arow[AC];
#pragma unroll
    for (int s = 0; s < AC; ++s) arow[s] = a_src(lr + 64u * s);
    // Scales: thread tid < BM stages A row tid's, BM <= tid < BM + BN W row tid − BM's (clamped
    // to a real column: columns past n are never stored), each k-step, with the stage.
    const float* sc_src = nullptr;
    if (tid < BM) {
        const u32 r = a_src(tid);
        if (r != MOE_INVALID) sc_src = as + (u64)r * nkb;
    } else if (tid < BM + BN) {
        bool up;
        const u32 c = min(w_col(tid - BM, up), n - 1), row = ex * n + c;
        sc_src = up ? ws1 + (u64)__ldg(wrs1 + row) * nkb : ws0 + (u64)__ldg(wrs0 + row) * nkb;
    }
    auto load = [&](u32 st, u32 k0) {
        unsigned char* sa = fp8_mma_smem + st * STAGE;
        unsigned char* sb = sa + A_TILE;
        const u32 kc = k0 + 16u * lc;
        const bool in = kc < K;
#pragma unroll
        for (int s = 0; s < AC; ++s) {
            const bool v = arow[s] != MOE_INVALID && in;
            cp_async16(sa + fp8_sw(lr + 64u * s, lc), v ? aq + (u64)arow[s] * K + kc : aq, v);
        }
#pragma unroll
        for (int s = 0; s < WC; ++s) {
            bool up;
            const u32 c = w_col(lr + 64u * s, up);
            const bool v = c < n && in;
            const unsigned char* w = up ? wq1 : wq0;
            cp_async16(sb + fp8_sw(lr + 64u * s, lc), v ? w + ((u64)ex * n + c) * K + kc : wq0, v);
        }
        if (tid < BM + BN)
            reinterpret_cast<float*>(sa + SCALES)[tid] = sc_src != nullptr ? __ldg(sc_src + k0 / FP8_BLOCK) : 0.0f;
    };
    const u32 wm = warp / (u32)WN, wn = warp % (u32)WN;  // warp tile: rows 32·wm.., columns 32·wn..
    const u32 g = lane >> 2, t4 = lane & 3u;
    float acc[FP8_MMA_MI][4][4];
#pragma unroll
    for (int i = 0; i < FP8_MMA_MI; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
    const u32 sbase = (u32)__cvta_generic_to_shared(fp8_mma_smem);
    // Pipeline as moe.cu's gemm_tc_impl (commit groups G0..G(S−2) first; stage kt has landed
    // once all but the newest S − 2 groups are done; the stage refilled in iteration kt was
    // last read in iteration kt − 1).
#pragma unroll
    for (u32 s = 0; s < (u32)S - 1; ++s) {
        if (s < nkb) load(s, s * FP8_MMA_BK);
        cp_async_commit();
    }
    for (u32 kb = 0; kb < nkb; ++kb) {
        cp_async_wait<S - 2>();
        __syncthreads();
        const u32 kn = kb + S - 1;
        if (kn < nkb) load(kn % S, kn * FP8_MMA_BK);
        cp_async_commit();
        float part[FP8_MMA_MI][4][4];
#pragma unroll
        for (int i = 0; i < FP8_MMA_MI; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int q = 0; q < 4; ++q) part[i][j][q] = 0.0f;
        const u32 sa_base = sbase + (kb % S) * STAGE, sb_base = sa_base + A_TILE;
        // Not unrolled: unrolled, the fragments of all four k32 steps stay live and spill.
#pragma unroll 1
        for (u32 kk = 0; kk < FP8_MMA_BK / 32u; ++kk) {
            u32 af[FP8_MMA_MI][4];
#pragma unroll
            for (int i = 0; i < FP8_MMA_MI; ++i) {
                // Matrices: rows 0-7 / 8-15 of the m16 tile × k bytes 0-15 / 16-31 (a0..a3).
                const u32 r = 32u * wm + 16u * i + (lane & 15u), c = 2u * kk + (lane >> 4);
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                             : "=r"(af[i][0]), "=r"(af[i][1]), "=r"(af[i][2]), "=r"(af[i][3])
                             : "r"(sa_base + fp8_sw(r, c)));
            }
#pragma unroll
            for (int jp = 0; jp < 2; ++jp) {
                // Matrices: columns 0-7 × k 0-15 / 16-31 (b0, b1 of n8 tile 2jp), then columns 8-15.
                const u32 r = 32u * wn + 16u * jp + ((lane >> 4) << 3) + (lane & 7u), c = 2u * kk + ((lane >> 3) & 1u);
                u32 b[4];
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                             : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                             : "r"(sb_base + fp8_sw(r, c)));
#pragma unroll
                for (int i = 0; i < FP8_MMA_MI; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        float* d = part[i][2 * jp + h];
                        asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                            "{%8, %9}, {%0, %1, %2, %3};\n"
                            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                            : "r"(af[i][0]), "r"(af[i][1]), "r"(af[i][2]), "r"(af[i][3]), "r"(b[2 * h]),
                              "r"(b[2 * h + 1]));
                    }
            }
        }
        // This k-step's scales (staged with the tiles, visible since the barrier): of the
        // thread's A rows 32wm + 16i + g + 8h and C columns 32wn + 8j + 2t4 + e.
        const float* scs = reinterpret_cast<const float*>(fp8_mma_smem + (kb % S) * STAGE + SCALES);
        float sa[FP8_MMA_MI][2], sw[4][2];
#pragma unroll
        for (int i = 0; i < FP8_MMA_MI; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) sa[i][h] = scs[32u * wm + 16u * i + g + 8u * h];
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) sw[j][e] = scs[BM + 32u * wn + 8u * j + 2u * t4 + e];
        // C fragment: q = 0, 1 row g, columns 2t4, 2t4 + 1; q = 2, 3 row g + 8.
#pragma unroll
        for (int i = 0; i < FP8_MMA_MI; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int q = 0; q < 4; ++q)
                    acc[i][j][q] = fmaf(part[i][j][q], sa[i][q >> 1] * sw[j][q & 1], acc[i][j][q]);
    }
    if (MODE == TC_DENSE) {
#pragma unroll
        for (int i = 0; i < FP8_MMA_MI; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const u32 r = m0 + 32u * wm + 16u * i + g + 8u * h;
                if (r >= m) continue;
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    fp8_store2<O>(out + (u64)r * n, n, c0 + 32u * wn + 8u * j + 2u * t4, acc[i][j][2 * h],
                                  acc[i][j][2 * h + 1]);
            }
        return;
    }
    // Grouped: C staged as f32 [BM][NC + 4] over the stages (gate+up: the NC = 128 h columns,
    // SiLU·up applied here), then 16-byte stores of 8 columns (n % 8 == 0: the host checks).
    // (Direct stores from the fragments, as the dense form, made these forms spill.)
    constexpr u32 NC = GU ? BN / 2 : BN, LDC = NC + 4;
    cp_async_wait<0>();
    __syncthreads();
    float* Cs = reinterpret_cast<float*>(fp8_mma_smem);
#pragma unroll
    for (int i = 0; i < FP8_MMA_MI; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float* crow = Cs + (32u * wm + 16u * i + g + 8u * h) * LDC;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                if (GU) {
                    // n8 tiles 0, 1: gate columns 16wn + 8j + 2t4 (+1); 2, 3: the same up columns.
#pragma unroll
                    for (int j = 0; j < 2; ++j)
                        crow[16u * wn + 8u * j + 2u * t4 + e] =
                            silu_f(round_to<O>(acc[i][j][2 * h + e])) * round_to<O>(acc[i][j + 2][2 * h + e]);
                } else {
#pragma unroll
                    for (int j = 0; j < 4; ++j) crow[32u * wn + 8u * j + 2u * t4 + e] = acc[i][j][2 * h + e];
                }
            }
        }
    __syncthreads();
    // gate+up: every row of the tile (padding rows hold 0); down: rows of real pairs, at o[pair].
    for (u32 q = tid; q < BM * (NC / 8u); q += FP8_MMA_THREADS) {
        const u32 i = q / (NC / 8u), v = q % (NC / 8u), c = c0 + 8u * v;
        if (c >= n) continue;
        u64 row = (u64)m0 + i;
        if (!GU) {
            const u32 p = s_pair[i];
            if (p == MOE_INVALID) continue;
            row = p;
        }
        store8<O>(out + row * n + c, Cs + i * LDC + 8u * v);
    }
#else
    // Below sm_89 or in a fallback build: the host never launches this kernel.
    __trap();
#endif
}

#define FP8_MMA8_DENSE(NO, O, S)                                                                                \
    extern "C" __global__ void __launch_bounds__(FP8_MMA_THREADS, 1) fp8_gemm_mma8_##NO##_s##S(                \
        const unsigned char* aq, const float* as, const unsigned char* wq, const float* ws, const u32* wrs,    \
        O* out, u32 m, u32 K, u32 n) { porter_pdl_enter();                                                                          \
        fp8_mma8_impl<O, S, TC_DENSE, 4>(aq, as, wq, ws, wrs, wq, ws, wrs, nullptr, nullptr, out, m, K, n, 1u, 1u); \
    }
FP8_MMA8_DENSE(bf16, bf16, 3)
FP8_MMA8_DENSE(bf16, bf16, 4)
FP8_MMA8_DENSE(f16, f16, 3)
FP8_MMA8_DENSE(f16, f16, 4)
FP8_MMA8_DENSE(f32, float, 3)
FP8_MMA8_DENSE(f32, float, 4)

// Grouped MoE e4m3 MMA GEMMs (tiles of 64 rows; see above). gate / up [e·I, H], down [e·H, I];
// K = H, N = I (gate+up) or K = I, N = H (down); aq / as: x [t, H] (gate+up) or h [cap, I]
// (down) quantized per row and 128 columns; dst: h [cap, I] or o [t·k, H].
#define FP8_MMA8_MOE(T, NAME, S)                                                                               \
    extern "C" __global__ void __launch_bounds__(FP8_MMA_THREADS, 1) moe_gemm_gu_fp8_mma8_##NAME##_s##S(          \
        const unsigned char* aq, const float* as, const unsigned char* q0, const float* s0, const u32* rs0,   \
        const unsigned char* q1, const float* s1, const u32* rs1, const u32* sorted, const u32* tile_expert,  \
        T* dst, u32 K, u32 N, u32 k, u32 nblk) { porter_pdl_enter();                                                                \
        fp8_mma8_impl<T, S, TC_GU, 2>(aq, as, q0, s0, rs0, q1, s1, rs1, sorted, tile_expert, dst, 0u, K, N, k, nblk); \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(FP8_MMA_THREADS, 1) moe_gemm_down_fp8_mma8_##NAME##_s##S(        \
        const unsigned char* aq, const float* as, const unsigned char* q, const float* s, const u32* rs,      \
        const u32* sorted, const u32* tile_expert, T* dst, u32 K, u32 N, u32 k, u32 nblk) { porter_pdl_enter();                    \
        fp8_mma8_impl<T, S, TC_DOWN, 2>(aq, as, q, s, rs, q, s, rs, sorted, tile_expert, dst, 0u, K, N, k, nblk); \
    }
// (4 stages only: 3 need 124 KiB, more than the sm_89 / sm_120 parts allow, and an H100 /
// H200 takes 4.)
FP8_MMA8_MOE(bf16, bf16, 4)
FP8_MMA8_MOE(f16, f16, 4)

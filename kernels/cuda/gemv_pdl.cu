// The decode GEMV with its weights loaded before the PDL wait (part of the misc module,
// kernels/src/cuda/compile.rs; preceded by common.cuh and misc.cu).
//
// out[r, j] = Σ_c x[r, c] · w[j, c] for m ≤ M rows: one warp a column j (8 columns a block of
// 256 threads, grid ceil(n / 8)). A lane holds G 16-byte weight chunks in registers (chunk
// c = lane + 32·q, q = 0 .. G-1 of a batch); the first batch is loaded BEFORE porter_pdl_enter()
// (the weights never depend on an earlier kernel), so under programmatic dependent launch the
// whole first batch of every resident block streams while the previous kernel finishes; x is
// read after the wait. Loads of a batch are all in flight together (G·16 bytes a lane: 128 or
// 256), so a mid-size GEMV (≤ ~17 MB on an H200) sits in registers in one wave.
//
// Bits: identical to gemv_block's (misc.cu) for the same `split` S: chunk q belongs to part
// q mod S, whose f32 FMA chain runs over its chunks in increasing q (gemv_block's warp
// `part`, lane order), each part's chain is butterfly-summed as there, and the parts are
// added in order 0, 1, .. S-1 (gemv_block's red[] sum). So the column's result does not
// depend on m (batch-invariant), nor on which of the two kernels ran, nor on the fused
// norm + GEMV (norm_gemv.cu), which uses gemv_block with the same host-picked split.
// The caller guarantees w is not written by the kernel launched just before (a weight).
// ---------------------------------------------------------------------------
template <typename T, typename O, int M, int S, int G>
__device__ __forceinline__ void gemvw_col(const T* __restrict__ x, const uint4* __restrict__ wr,
                                          O* __restrict__ out, u32 m, u32 k, u32 n, u32 j, u32 kv, u32 lane,
                                          uint4 (&wv)[G]) {
    constexpr int E = 16 / sizeof(T);
    static_assert(G % S == 0, "a batch holds whole rounds of the parts");
    float acc[S][M];
#pragma unroll
    for (int p = 0; p < S; ++p)
#pragma unroll
        for (int r = 0; r < M; ++r) acc[p][r] = 0.0f;
#pragma unroll 1
    for (u32 q0 = 0; 32u * q0 < kv; q0 += G) {
        if (q0 > 0) {
#pragma unroll
            for (int u = 0; u < G; ++u) {
                const u32 c = lane + 32u * (q0 + u);
                wv[u] = c < kv ? __ldg(wr + c) : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < G; ++u) {
            const u32 c = lane + 32u * (q0 + u);
            if (c < kv) {
                const T* we = reinterpret_cast<const T*>(&wv[u]);
#pragma unroll
                for (int r = 0; r < M; ++r) {
                    if ((u32)r < m) {
                        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + (u64)r * k) + c);
                        const T* xe = reinterpret_cast<const T*>(&xv);
#pragma unroll
                        for (int i = 0; i < E; ++i) acc[u % S][r] = fmaf(to_f(we[i]), to_f(xe[i]), acc[u % S][r]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < M; ++r) {
        float v = warp_sum(acc[0][r]);
#pragma unroll
        for (int p = 1; p < S; ++p) v += warp_sum(acc[p][r]);
        if (kv > 0 && lane == 0 && (u32)r < m) out[(u64)r * n + j] = from_f<O>(v);
    }
}

// The whole kernel, porter_pdl_enter() included (after the first weight batch is issued).
template <typename T, typename O, int M, int G>
__device__ __forceinline__ void gemvw_pdl(const T* __restrict__ x, const T* __restrict__ w, O* __restrict__ out,
                                          u32 m, u32 k, u32 n, u32 split) {
    constexpr int E = 16 / sizeof(T);
    const u32 lane = threadIdx.x & 31u, j = blockIdx.x * 8u + (threadIdx.x >> 5);
    const bool live = j < n;
    const uint4* wr = reinterpret_cast<const uint4*>(w + (u64)(live ? j : 0u) * k);
    const u32 kv = live ? k / E : 0u;
    uint4 wv[G];
#pragma unroll
    for (int u = 0; u < G; ++u) {
        const u32 c = lane + 32u * u;
        wv[u] = c < kv ? __ldg(wr + c) : make_uint4(0, 0, 0, 0);
    }
    porter_pdl_enter();
    if (split == 1)
        gemvw_col<T, O, M, 1, G>(x, wr, out, m, k, n, j, kv, lane, wv);
    else if (split == 2)
        gemvw_col<T, O, M, 2, G>(x, wr, out, m, k, n, j, kv, lane, wv);
    else
        gemvw_col<T, O, M, 4, G>(x, wr, out, m, k, n, j, kv, lane, wv);
}

#define PORTER_GEMVW(NT, T, NO, O, M, G)                                                                    \
    extern "C" __global__ void __launch_bounds__(256, 1) gemvw_##NT##_##NO##_m##M##_g##G(                      \
        const T* x, const T* w, O* out, u32 m, u32 k, u32 n, u32 split) {                                   \
        gemvw_pdl<T, O, M, G>(x, w, out, m, k, n, split);                                                   \
    }
#define PORTER_GEMVW_M(NT, T, NO, O)                                                                        \
    PORTER_GEMVW(NT, T, NO, O, 1, 8) PORTER_GEMVW(NT, T, NO, O, 2, 8) PORTER_GEMVW(NT, T, NO, O, 4, 8)      \
    PORTER_GEMVW(NT, T, NO, O, 8, 8) PORTER_GEMVW(NT, T, NO, O, 1, 16) PORTER_GEMVW(NT, T, NO, O, 2, 16)    \
    PORTER_GEMVW(NT, T, NO, O, 4, 16) PORTER_GEMVW(NT, T, NO, O, 8, 16)
PORTER_GEMVW_M(f32, float, f32, float)
PORTER_GEMVW_M(bf16, bf16, bf16, bf16)
PORTER_GEMVW_M(bf16, bf16, f32, float)
PORTER_GEMVW_M(f16, f16, f16, f16)
PORTER_GEMVW_M(f16, f16, f32, float)

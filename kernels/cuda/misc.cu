// Glue kernels of the model path: residual adds, dtype casts, strided column
// copies, row gathers, bias adds, the shared-expert combine, and random fills
// for benchmark weights. Preceded by common.cuh. Grid-stride loops throughout.

#define GRID_LOOP(i, n) for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

// x (f32, the residual stream) += y (T), elementwise over n values.
template <typename T> __device__ __forceinline__ void add_into_f32_impl(float* __restrict__ x, const T* __restrict__ y, u64 n) {
    GRID_LOOP(i, n) x[i] += to_f(y[i]);
}

// y = B(x), rounding once.
template <typename A, typename B> __device__ __forceinline__ void cast_impl(const A* __restrict__ x, B* __restrict__ y, u64 n) {
    GRID_LOOP(i, n) y[i] = from_f<B>(to_f(x[i]));
}

// dst[r, c] = src[r·src_stride + col0 + c] for r < rows, c < ncols.
template <typename T>
__device__ __forceinline__ void copy_cols_impl(const T* __restrict__ src, T* __restrict__ dst, u64 rows, u32 src_stride,
                                               u32 col0, u32 ncols) {
    GRID_LOOP(i, rows * ncols) {
        const u64 r = i / ncols, c = i % ncols;
        dst[i] = src[r * src_stride + col0 + c];
    }
}

// dst[r, :] = src[idx[r], :] (d columns); an index >= src_rows gives NaN.
template <typename T>
__device__ __forceinline__ void gather_rows_impl(const T* __restrict__ src, const u32* __restrict__ idx, T* __restrict__ dst,
                                                 u64 rows, u32 d, u32 src_rows) {
    GRID_LOOP(i, rows * d) {
        const u64 r = i / d, c = i % d;
        const u32 s = idx[r];
        dst[i] = s < src_rows ? src[(u64)s * d + c] : from_f<T>(PORTER_NAN);
    }
}

// y[r, c] = round(y[r, c] + b[c]).
template <typename T> __device__ __forceinline__ void add_bias_impl(T* __restrict__ y, const T* __restrict__ b, u64 rows, u32 n) {
    GRID_LOOP(i, rows * n) y[i] = from_f<T>(to_f(y[i]) + to_f(b[i % n]));
}

// Shared expert: y[r, :] += σ(g[r]) · s[r, :] (y f32; s, g T).
template <typename T>
__device__ __forceinline__ void shared_expert_add_impl(float* __restrict__ y, const T* __restrict__ s, const T* __restrict__ g,
                                                       u64 rows, u32 h) {
    GRID_LOOP(i, rows * h) y[i] += sigmoid_f(to_f(g[i / h])) * to_f(s[i]);
}

// out[r] = [a[r] | b[r]] (a [rows, da], b [rows, db]).
template <typename T>
__device__ __forceinline__ void concat_cols_impl(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                                                 u64 rows, u32 da, u32 db) {
    const u32 w = da + db;
    GRID_LOOP(i, rows * w) {
        const u64 r = i / w, c = i % w;
        out[i] = c < da ? a[r * da + c] : b[r * db + (c - da)];
    }
}

// Benchmark weights: uniform in [offset − scale, offset + scale), from a
// counter-based hash of (seed, i) (no state; any grid gives the same values).
__device__ __forceinline__ float hash_uniform(u64 seed, u64 i) {
    u64 z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
}
template <typename T> __device__ __forceinline__ void fill_uniform_impl(T* __restrict__ y, u64 n, u64 seed, float scale, float offset) {
    GRID_LOOP(i, n) y[i] = from_f<T>(offset + scale * hash_uniform(seed, i));
}

// Residual add fused with the next RMSNorm (norm.cu's formulas): per row,
// x (f32) += y, then out = norm(x) in TO. One block per row. The whole kernel,
// porter_pdl_enter() included: the norm weights (register path) are read and the residual
// row x is prefetched into L2 BEFORE the wait (weights never change; an L2 prefetch is only a
// hint: L2 is coherent, so a write by the previous kernel still wins). Bit 1 of `zc` (the
// host's PORTER_NORM_PRELOAD=off) turns both off (A/B); bit 0 is zero-centred.
template <typename TY, typename TO>
__device__ __forceinline__ void add_rms_norm_pdl(float* __restrict__ x, const TY* __restrict__ y, const TO* __restrict__ w,
                                                 TO* __restrict__ out, u32 d, float eps, int zc) {
    __shared__ float sh[32];
    const u64 r = blockIdx.x;
    float* xr = x + r * d;
    const TY* yr = y + r * d;
    TO* orow = out + r * d;
    const bool pre = (zc & 2) == 0;
    const int zero_centred = zc & 1;
    const bool regs = d <= blockDim.x * NORM_NPT;
    float wv[NORM_NPT];
    if (regs && pre) norm_row_weights(w, d, wv);
    if (pre)
        for (u32 i = threadIdx.x * 32u; i < d; i += blockDim.x * 32u) porter_prefetch_l2(xr + i);
    porter_pdl_enter();
    if (regs) {
        if (!pre) norm_row_weights(w, d, wv);
        // One read of the row and the weights before the reduction (as rms_norm_pdl).
        float v[NORM_NPT];
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < NORM_NPT; ++j) {
            const u32 i = threadIdx.x + j * blockDim.x;
            v[j] = i < d ? xr[i] + to_f(yr[i]) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < NORM_NPT; ++j) {
            const u32 i = threadIdx.x + j * blockDim.x;
            if (i < d) xr[i] = v[j];
            ss += v[j] * v[j];
        }
        ss = block_sum(ss, sh, threadIdx.x, blockDim.x);
        const float inv = 1.0f / sqrtf(ss / (float)d + eps);
#pragma unroll
        for (int j = 0; j < NORM_NPT; ++j) {
            const u32 i = threadIdx.x + j * blockDim.x;
            if (i < d)
                orow[i] = zero_centred ? from_f<TO>(v[j] * inv * (1.0f + wv[j])) : from_f<TO>(wv[j] * round_to<TO>(v[j] * inv));
        }
        return;
    }
    float ss = 0.0f;
    for (u32 i = threadIdx.x; i < d; i += blockDim.x) {
        const float v = xr[i] + to_f(yr[i]);
        xr[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss, sh, threadIdx.x, blockDim.x);
    const float inv = 1.0f / sqrtf(ss / (float)d + eps);
    for (u32 i = threadIdx.x; i < d; i += blockDim.x) {
        const float v = xr[i];
        const float wv = to_f(w[i]);
        orow[i] = zero_centred ? from_f<TO>(v * inv * (1.0f + wv)) : from_f<TO>(wv * round_to<TO>(v * inv));
    }
}

// Gated RMSNorm with SiLU(z) (norm.cu's gated formula) reading z in place from the
// in-projection output: row ρ = token·hv + head of x [t·hv, d] uses
// z = p[token·pw + zoff + head·d ..]. One warp per row (gdn_norm.cu's gated_norm_row),
// GNZ_ROWS rows a block: the rows are short (d = 128 in Qwen3-Next), and a block per row (the
// former shape: 131,072 blocks of 128 threads at a 4k prefill, two barriers each) left the
// kernel bound by block scheduling rather than by memory. No barrier.
#define GNZ_ROWS 8
template <typename T>
__device__ __forceinline__ void gated_norm_z_impl(const T* __restrict__ x, const T* __restrict__ p, const T* __restrict__ w,
                                                  T* __restrict__ out, u32 d, float eps, u32 hv, u32 pw, u32 zoff,
                                                  u32 rows) {
    const u32 lane = threadIdx.x & 31u;
    const u64 r = (u64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;  // warp-uniform
    gated_norm_row<T>(x + r * d, p + (r / hv) * pw + zoff + (r % hv) * d, w, out + r * d, d, eps, lane);
}

// SwiGLU from f32 GEMM outputs that the CPU model rounds to T first: per row r of a
// [rows, stride] f32 matrix with [gate | up] at columns col0..col0 + 2·inter,
// out[r, c] = round(silu(round(g)) · round(u)).
template <typename T>
__device__ __forceinline__ void swiglu_f32in_impl(const float* __restrict__ src, T* __restrict__ out, u64 rows, u32 inter,
                                                  u32 stride, u32 col0) {
    GRID_LOOP(i, rows * inter) {
        const u64 r = i / inter, c = i % inter;
        const float* row = src + r * stride + col0;
        out[i] = from_f<T>(silu_f(round_to<T>(row[c])) * round_to<T>(row[inter + c]));
    }
}

// Shared expert with its gate logit in an f32 matrix: y[r] += σ(round(g[r])) · s[r],
// g[r] = src[r·stride + gcol].
template <typename T>
__device__ __forceinline__ void shared_expert_add_f32g_impl(float* __restrict__ y, const T* __restrict__ s,
                                                            const float* __restrict__ src, u64 rows, u32 h, u32 stride,
                                                            u32 gcol) {
    GRID_LOOP(i, rows * h) {
        const u64 r = i / h;
        y[i] += sigmoid_f(round_to<T>(src[r * stride + gcol])) * to_f(s[i]);
    }
}

#define PORTER_MISC(N, T)                                                                                              \
    extern "C" __global__ void add_into_f32_##N(float* x, const T* y, u64 n) { porter_pdl_enter(); add_into_f32_impl<T>(x, y, n); }       \
    extern "C" __global__ void copy_cols_##N(const T* src, T* dst, u64 rows, u32 stride, u32 col0, u32 ncols) { porter_pdl_enter();        \
        copy_cols_impl<T>(src, dst, rows, stride, col0, ncols);                                                        \
    }                                                                                                                  \
    extern "C" __global__ void gather_rows_##N(const T* src, const u32* idx, T* dst, u64 rows, u32 d, u32 src_rows) { porter_pdl_enter();  \
        gather_rows_impl<T>(src, idx, dst, rows, d, src_rows);                                                         \
    }                                                                                                                  \
    extern "C" __global__ void add_bias_##N(T* y, const T* b, u64 rows, u32 n) { porter_pdl_enter(); add_bias_impl<T>(y, b, rows, n); }   \
    extern "C" __global__ void shared_expert_add_##N(float* y, const T* s, const T* g, u64 rows, u32 h) { porter_pdl_enter();             \
        shared_expert_add_impl<T>(y, s, g, rows, h);                                                                   \
    }                                                                                                                  \
    extern "C" __global__ void concat_cols_##N(const T* a, const T* b, T* out, u64 rows, u32 da, u32 db) { porter_pdl_enter();          \
        concat_cols_impl<T>(a, b, out, rows, da, db);                                                                  \
    }                                                                                                                  \
    extern "C" __global__ void add_rms_norm_##N##_##N(float* x, const T* y, const T* w, T* out, u32 d, float eps,     \
                                                     int zc) {                                                                             \
        add_rms_norm_pdl<T, T>(x, y, w, out, d, eps, zc);                                                           \
    }                                                                                                                  \
    extern "C" __global__ void add_rms_norm_f32y_##N(float* x, const float* y, const T* w, T* out, u32 d, float eps,  \
                                                     int zc) {                                                                             \
        add_rms_norm_pdl<float, T>(x, y, w, out, d, eps, zc);                                                       \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * GNZ_ROWS) gated_norm_z_##N(const T* x, const T* p, const T* w,  \
                                                T* out, u32 d, float eps, u32 hv, u32 pw, u32 zoff, u32 rows) {       \
        porter_pdl_enter();                                                                                            \
        gated_norm_z_impl<T>(x, p, w, out, d, eps, hv, pw, zoff, rows);                                              \
    }                                                                                                                  \
    extern "C" __global__ void swiglu_f32in_##N(const float* src, T* out, u64 rows, u32 inter, u32 stride, u32 col0) { porter_pdl_enter(); \
        swiglu_f32in_impl<T>(src, out, rows, inter, stride, col0);                                                   \
    }                                                                                                                  \
    extern "C" __global__ void shared_expert_add_f32g_##N(float* y, const T* s, const float* src, u64 rows, u32 h,     \
                                                          u32 stride, u32 gcol) { porter_pdl_enter();                                      \
        shared_expert_add_f32g_impl<T>(y, s, src, rows, h, stride, gcol);                                            \
    }                                                                                                                  \
    extern "C" __global__ void fill_uniform_##N(T* y, u64 n, u64 seed, float scale, float offset) { porter_pdl_enter();                   \
        fill_uniform_impl<T>(y, n, seed, scale, offset);                                                               \
    }

PORTER_MISC(f32, float)
PORTER_MISC(bf16, bf16)
PORTER_MISC(f16, f16)

#define PORTER_CAST(NA, A, NB, B) \
    extern "C" __global__ void cast_##NA##_##NB(const A* x, B* y, u64 n) { porter_pdl_enter(); cast_impl<A, B>(x, y, n); }
PORTER_CAST(f32, float, bf16, bf16)
PORTER_CAST(f32, float, f16, f16)
PORTER_CAST(bf16, bf16, f32, float)
PORTER_CAST(f16, f16, f32, float)
PORTER_CAST(bf16, bf16, f16, f16)
PORTER_CAST(f16, f16, bf16, bf16)

// ---------------------------------------------------------------------------
// Skinny GEMM for decode: out[r, j] = Σ_c x[r, c] · w[j, c] for m ≤ M rows, f32
// accumulation, one rounding to O. `split` (1, 2 or 4) warps per output column j
// stream w's row j with 16-byte loads (4 in flight per lane) and reuse it for every
// x row (x is small and stays in L1/L2); 8 / split columns per block of 8 warps.
// Split: with few columns (n · split below the resident warps of the GPU: an
// out_proj [2048, 4096] gives 2048 warps, a quarter of an H200) one warp per
// column leaves the memory pipe half empty; warp s of a column takes the 16-byte
// chunks c ≡ 32·s + lane (mod 32·split), and the column's sum is the warps'
// butterfly sums added in order s = 0, 1, ... The host picks split from (n, k)
// alone, so a column's bits never depend on m (batch-invariant); split = 1 is
// the one-warp order. Needs k % (16 / sizeof(T)) == 0 and 16-byte aligned rows
// (checked by the host). Grid: ceil(n / (8 / split)).
// ---------------------------------------------------------------------------
#define GEMV_UNROLL 4
// Column block `jb` of the launch (8 / split columns). XS: x is in shared memory (the fused
// norm + GEMV of norm_gemv.cu), else global (read through the non-coherent cache). `red` is
// the block's [8][M] scratch of the split sums; with split > 1 every thread of the block must
// call this (a barrier), and a caller that calls it again must put a barrier in between.
template <typename T, typename O, int M, bool XS>
__device__ __forceinline__ void gemv_block(const T* __restrict__ x, const T* __restrict__ w, O* __restrict__ out, u32 m,
                                           u32 k, u32 n, u32 split, u32 jb, float (*red)[M]) {
    constexpr int E = 16 / sizeof(T);
    const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const u32 j = jb * (8u / split) + warp / split, part = warp % split;
    const bool live = j < n;
    const uint4* wr = reinterpret_cast<const uint4*>(w + (u64)(live ? j : 0u) * k);
    const u32 kv = live ? k / E : 0u, step = 32u * split;
    float acc[M];
#pragma unroll
    for (int r = 0; r < M; ++r) acc[r] = 0.0f;
    for (u32 c0 = 32u * part + lane; c0 < kv; c0 += step * GEMV_UNROLL) {
        uint4 wv[GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) {
            const u32 c = c0 + step * u;
            wv[u] = c < kv ? __ldg(wr + c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) {
            const u32 c = c0 + step * u;
            if (c < kv) {
                const T* we = reinterpret_cast<const T*>(&wv[u]);
#pragma unroll
                for (int r = 0; r < M; ++r) {
                    if ((u32)r < m) {
                        const uint4* xr = reinterpret_cast<const uint4*>(x + (u64)r * k) + c;
                        const uint4 xv = XS ? *xr : __ldg(xr);
                        const T* xe = reinterpret_cast<const T*>(&xv);
#pragma unroll
                        for (int i = 0; i < E; ++i) acc[r] = fmaf(to_f(we[i]), to_f(xe[i]), acc[r]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < M; ++r) acc[r] = warp_sum(acc[r]);
    if (split == 1) {
#pragma unroll
        for (int r = 0; r < M; ++r)
            if (live && lane == 0 && (u32)r < m) out[(u64)r * n + j] = from_f<O>(acc[r]);
        return;
    }
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < M; ++r) red[warp][r] = acc[r];
    __syncthreads();
    if (live && part == 0 && lane == 0)
#pragma unroll
        for (int r = 0; r < M; ++r) {
            float v = red[warp][r];
            for (u32 s2 = 1; s2 < split; ++s2) v += red[warp + s2][r];
            if ((u32)r < m) out[(u64)r * n + j] = from_f<O>(v);
        }
}

template <typename T, typename O, int M>
__device__ __forceinline__ void gemv_impl(const T* __restrict__ x, const T* __restrict__ w, O* __restrict__ out, u32 m,
                                          u32 k, u32 n, u32 split) {
    __shared__ float red[8][M];
    gemv_block<T, O, M, false>(x, w, out, m, k, n, split, blockIdx.x, red);
}

#define PORTER_GEMV(NT, T, NO, O, M)                                                                          \
    extern "C" __global__ void __launch_bounds__(256) gemv_##NT##_##NO##_m##M(const T* x, const T* w, O* out, \
                                                                               u32 m, u32 k, u32 n, u32 split) { porter_pdl_enter(); \
        gemv_impl<T, O, M>(x, w, out, m, k, n, split);                                                        \
    }
#define PORTER_GEMV_M(NT, T, NO, O) \
    PORTER_GEMV(NT, T, NO, O, 1) PORTER_GEMV(NT, T, NO, O, 2) PORTER_GEMV(NT, T, NO, O, 4) PORTER_GEMV(NT, T, NO, O, 8)
PORTER_GEMV_M(f32, float, f32, float)
PORTER_GEMV_M(bf16, bf16, bf16, bf16)
PORTER_GEMV_M(bf16, bf16, f32, float)
PORTER_GEMV_M(f16, f16, f16, f16)
PORTER_GEMV_M(f16, f16, f32, float)

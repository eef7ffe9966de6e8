// RMSNorm (or the residual add + RMSNorm) fused into the skinny GEMV that reads its output:
// decode's input norm and the first projection of the mixer, the post-attention add + norm and
// the first projection of the feed-forward block (kernels/src/cuda/misc.rs norm_gemv).
// Appended to misc.cu (same module: gemv_block, add_rms_norm_impl's formulas).
//
// out[r] = norm(x[r] (+ y[r])) · wᵀ for m ≤ M rows, bit for bit what rms_norm / add_rms_norm
// (norm.cu / misc.cu, launched with NT = row_threads(d, 512) threads a row) followed by gemv
// computes. Every block first normalises the m rows into shared memory, emulating the norm
// kernel's NT threads with its own 256: virtual thread tv = tid + 256·s (s < 2, tv < NT) sums
// v² over i = tv + j·NT in j order (the norm kernel's per-thread order, register path or
// loop), virtual warp tv / 32 takes the same butterfly sum, and the NT / 32 warp partials the
// same final warp sum; the normalisation is the norm kernel's expression. Then the block runs
// gemv_block over column blocks jb = blockIdx.x, + gridDim.x, ...: a grid of a few blocks an
// SM, since each block recomputes the norm (m·d values read from L2, the second pass from L1).
// Block 0 also writes the normalised rows (`normed`, T: the other readers of the norm's output
// — k/v projections, the routed experts — take them from there) and, with ADD, the new
// residual x + y (`sum`, f32: its own buffer, since the other blocks still read x).
// Dynamic shared memory: m · d · sizeof(T) bytes (the host checks the limit).
template <typename T, typename O, int M, bool ADD>
__device__ __forceinline__ void norm_gemv_impl(const float* __restrict__ x, const T* __restrict__ y,
                                               const T* __restrict__ nw, float eps, int zc, u32 nt,
                                               const T* __restrict__ w, O* __restrict__ out, T* __restrict__ normed,
                                               float* __restrict__ sum, u32 m, u32 k, u32 n, u32 split, u32 nblk) {
    extern __shared__ __align__(16) unsigned char ng_smem[];
    T* xs = reinterpret_cast<T*>(ng_smem);
    __shared__ float sh[M][32];
    __shared__ float red[8][M];
    const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5, nwarps = nt >> 5;
    // 1. Σ v² per virtual thread, then per virtual warp.
#pragma unroll
    for (int r = 0; r < M; ++r) {
        if ((u32)r >= m) break;
        const float* xr = x + (u64)r * k;
        const T* yr = ADD ? y + (u64)r * k : nullptr;
#pragma unroll
        for (u32 s = 0; s < 2; ++s) {
            const u32 tv = tid + 256u * s;
            float ss = 0.0f;
            if (tv < nt) {
                for (u32 i = tv; i < k; i += nt) {
                    const float v = ADD ? xr[i] + to_f(yr[i]) : xr[i];
                    ss += v * v;
                }
            }
            ss = warp_sum(ss);
            if (lane == 0 && warp + 8u * s < nwarps) sh[r][warp + 8u * s] = ss;
        }
    }
    __syncthreads();
    // 2. The normalised rows, into shared memory (and by block 0 to global).
    const bool first = blockIdx.x == 0;
#pragma unroll
    for (int r = 0; r < M; ++r) {
        if ((u32)r >= m) break;
        const float tot = warp_sum(lane < nwarps ? sh[r][lane] : 0.0f);
        const float inv = 1.0f / sqrtf(tot / (float)k + eps);
        const float* xr = x + (u64)r * k;
        const T* yr = ADD ? y + (u64)r * k : nullptr;
        for (u32 i = tid; i < k; i += 256u) {
            const float v = ADD ? xr[i] + to_f(yr[i]) : xr[i];
            const float wv = to_f(nw[i]);
            const T o = zc ? from_f<T>(v * inv * (1.0f + wv)) : from_f<T>(wv * round_to<T>(v * inv));
            xs[(u64)r * k + i] = o;
            if (first) {
                normed[(u64)r * k + i] = o;
                if (ADD) sum[(u64)r * k + i] = v;
            }
        }
    }
    __syncthreads();
    // 3. The GEMV over this block's column blocks.
    for (u32 jb = blockIdx.x; jb < nblk; jb += gridDim.x) {
        gemv_block<T, O, M, true>(xs, w, out, m, k, n, split, jb, red);
        if (split > 1) __syncthreads();  // red is reused by the next column block
    }
}

// Entries: norm_gemv_{T}_{O}_m{M} (x f32, no add) and add_norm_gemv_{T}_{O}_m{M} (x f32 + y T).
#define PORTER_NORM_GEMV(NT_, T, NO, O, M)                                                                       \
    extern "C" __global__ void __launch_bounds__(256)                                                            \
        norm_gemv_##NT_##_##NO##_m##M(const float* x, const T* nw, float eps, int zc, u32 nt, const T* w, O* out, \
                                      T* normed, u32 m, u32 k, u32 n, u32 split, u32 nblk) {                     \
        norm_gemv_impl<T, O, M, false>(x, nullptr, nw, eps, zc, nt, w, out, normed, nullptr, m, k, n, split,     \
                                       nblk);                                                                    \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(256)                                                            \
        add_norm_gemv_##NT_##_##NO##_m##M(const float* x, const T* y, const T* nw, float eps, int zc, u32 nt,    \
                                          const T* w, O* out, T* normed, float* sum, u32 m, u32 k, u32 n,        \
                                          u32 split, u32 nblk) {                                                 \
        norm_gemv_impl<T, O, M, true>(x, y, nw, eps, zc, nt, w, out, normed, sum, m, k, n, split, nblk);         \
    }
#define PORTER_NORM_GEMV_M(NT_, T, NO, O) \
    PORTER_NORM_GEMV(NT_, T, NO, O, 1) PORTER_NORM_GEMV(NT_, T, NO, O, 2) PORTER_NORM_GEMV(NT_, T, NO, O, 4)
PORTER_NORM_GEMV_M(f32, float, f32, float)
PORTER_NORM_GEMV_M(bf16, bf16, bf16, bf16)
PORTER_NORM_GEMV_M(bf16, bf16, f32, float)
PORTER_NORM_GEMV_M(f16, f16, f16, f16)
PORTER_NORM_GEMV_M(f16, f16, f32, float)

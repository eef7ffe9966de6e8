// The RMSNorm (or residual add + RMSNorm) of a few rows into shared memory, bit for bit as
// the norm kernels (norm.cu rms_norm_pdl, misc.cu add_rms_norm_pdl) compute it, for the
// GEMVs that take the norm as their prologue (norm_gemv.cu; fp8_norm.cu). Part of the misc
// and fp8 modules (kernels/src/cuda/compile.rs); preceded by common.cuh.
//
// The norm kernels run NT = row_threads(d, 512) threads a row. A block of 256 threads here
// emulates them: virtual thread tv = tid + 256·s (s < 2, tv < NT) sums v² over i = tv + j·NT
// in j order (the norm kernel's per-thread order, register path or loop), virtual warp tv / 32
// takes the same butterfly sum, and the NT / 32 warp partials the same final warp sum; the
// normalisation is the norm kernel's expression. Block 0 also writes the normalised rows
// (`normed`, T: the other readers of the norm's output — k / v projections, the routed
// experts — take them from there) and, with ADD, the new residual x + y (`sum`, f32: a buffer
// of its own, since the other blocks still read x). Ends with a barrier.
//
// x [m, k] f32; y [m, k] TY (ADD: T or f32); nw [k] T; xs [m, k] T (shared); m <= M; 256 threads.
template <typename T, int M, bool ADD, typename TY = T>
__device__ __forceinline__ void norm_rows_smem(const float* __restrict__ x, const TY* __restrict__ y,
                                               const T* __restrict__ nw, float eps, int zc, u32 nt, T* xs,
                                               T* __restrict__ normed, float* __restrict__ sum, u32 m, u32 k) {
    __shared__ float sh[M][32];
    const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5, nwarps = nt >> 5;
    // 1. Σ v² per virtual thread, then per virtual warp.
#pragma unroll
    for (int r = 0; r < M; ++r) {
        if ((u32)r >= m) break;
        const float* xr = x + (u64)r * k;
        const TY* yr = ADD ? y + (u64)r * k : nullptr;
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
        const TY* yr = ADD ? y + (u64)r * k : nullptr;
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
}

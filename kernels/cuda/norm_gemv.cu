// RMSNorm (or the residual add + RMSNorm) fused into the skinny GEMV that reads its output:
// decode's input norm and the first projection of the mixer, the post-attention add + norm and
// the first projection of the feed-forward block (kernels/src/cuda/misc.rs norm_gemv).
// Appended to misc.cu and norm_rows.cu (same module: gemv_block, norm_rows_smem).
//
// out[r] = norm(x[r] (+ y[r])) · wᵀ for m ≤ M rows, bit for bit what rms_norm / add_rms_norm
// (norm.cu / misc.cu, launched with NT = row_threads(d, 512) threads a row) followed by gemv
// computes. Every block first normalises the m rows into shared memory (norm_rows_smem,
// norm_rows.cu: the norm kernels' sums and expression, bit for bit), then runs gemv_block
// over column blocks jb = blockIdx.x, + gridDim.x, ...: a grid of a few blocks an SM, since
// each block recomputes the norm (m·d values read from L2, the second pass from L1).
// Dynamic shared memory: m · d · sizeof(T) bytes (the host checks the limit).
template <typename T, typename O, int M, bool ADD, typename TY = T>
__device__ __forceinline__ void norm_gemv_impl(const float* __restrict__ x, const TY* __restrict__ y,
                                               const T* __restrict__ nw, float eps, int zc, u32 nt,
                                               const T* __restrict__ w, O* __restrict__ out, T* __restrict__ normed,
                                               float* __restrict__ sum, u32 m, u32 k, u32 n, u32 split, u32 nblk) {
    extern __shared__ __align__(16) unsigned char ng_smem[];
    T* xs = reinterpret_cast<T*>(ng_smem);
    __shared__ float red[8][M];
    norm_rows_smem<T, M, ADD, TY>(x, y, nw, eps, zc, nt, xs, normed, sum, m, k);
    // The GEMV over this block's column blocks.
    for (u32 jb = blockIdx.x; jb < nblk; jb += gridDim.x) {
        gemv_block<T, O, M, true>(xs, w, out, m, k, n, split, jb, red);
        if (split > 1) __syncthreads();  // red is reused by the next column block
    }
}

// Entries: norm_gemv_{T}_{O}_m{M} (x f32, no add), add_norm_gemv_{T}_{O}_m{M} (x f32 + y T) and
// add_norm_gemv_f32y_{T}_{O}_m{M} (x f32 + y f32; for T = f32 the same as the one before).
#define PORTER_NORM_GEMV(NT_, T, NO, O, M)                                                                       \
    extern "C" __global__ void __launch_bounds__(256)                                                            \
        norm_gemv_##NT_##_##NO##_m##M(const float* x, const T* nw, float eps, int zc, u32 nt, const T* w, O* out, \
                                      T* normed, u32 m, u32 k, u32 n, u32 split, u32 nblk) { porter_pdl_enter();                     \
        norm_gemv_impl<T, O, M, false, T>(x, nullptr, nw, eps, zc, nt, w, out, normed, nullptr, m, k, n, split,     \
                                       nblk);                                                                    \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(256)                                                            \
        add_norm_gemv_##NT_##_##NO##_m##M(const float* x, const T* y, const T* nw, float eps, int zc, u32 nt,    \
                                          const T* w, O* out, T* normed, float* sum, u32 m, u32 k, u32 n,        \
                                          u32 split, u32 nblk) { porter_pdl_enter();                                                 \
        norm_gemv_impl<T, O, M, true>(x, y, nw, eps, zc, nt, w, out, normed, sum, m, k, n, split, nblk);         \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(256)                                                            \
        add_norm_gemv_f32y_##NT_##_##NO##_m##M(const float* x, const float* y, const T* nw, float eps, int zc,   \
                                               u32 nt, const T* w, O* out, T* normed, float* sum, u32 m, u32 k,  \
                                               u32 n, u32 split, u32 nblk) { porter_pdl_enter();                                     \
        norm_gemv_impl<T, O, M, true, float>(x, y, nw, eps, zc, nt, w, out, normed, sum, m, k, n, split, nblk);  \
    }
#define PORTER_NORM_GEMV_M(NT_, T, NO, O) \
    PORTER_NORM_GEMV(NT_, T, NO, O, 1) PORTER_NORM_GEMV(NT_, T, NO, O, 2) PORTER_NORM_GEMV(NT_, T, NO, O, 4)
PORTER_NORM_GEMV_M(f32, float, f32, float)
PORTER_NORM_GEMV_M(bf16, bf16, bf16, bf16)
PORTER_NORM_GEMV_M(bf16, bf16, f32, float)
PORTER_NORM_GEMV_M(f16, f16, f16, f16)
PORTER_NORM_GEMV_M(f16, f16, f32, float)

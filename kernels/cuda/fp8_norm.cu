// The RMSNorm before a decode projection fused into the FP8 GEMV (fp8.cu fp8_gemvx_pdl), as
// norm_gemv.cu does for dense weights: every block normalises the m rows into shared memory
// (norm_rows_smem, norm_rows.cu: bit for bit the norm kernel), then runs the GEMV over column
// blocks jb = blockIdx.x, + gridDim.x, ... with x read from shared memory — the same dot
// products, in the same order, as the unfused default kernel (fp8_gemvx_<A>_<A>_m<M>[_r<NR>])
// of Fp8GemvForm::AUTO. Part of the fp8 module after fp8.cu and norm_rows.cu
// (kernels/src/cuda/compile.rs). Dynamic shared memory: m · k · sizeof(A) bytes.
template <typename A, int M, int NR>
__device__ __forceinline__ void norm_fp8_gemvx_impl(const float* __restrict__ x, const A* __restrict__ nw, float eps,
                                                    int zc, u32 nt, const unsigned char* __restrict__ w,
                                                    const float* __restrict__ sc, const u32* __restrict__ rs,
                                                    A* __restrict__ out, A* __restrict__ normed, u32 m, u32 k, u32 n,
                                                    u32 nblk) {
    extern __shared__ __align__(16) unsigned char nf_smem[];
    A* xs = reinterpret_cast<A*>(nf_smem);
    norm_rows_smem<A, M, false, A>(x, nullptr, nw, eps, zc, nt, xs, normed, nullptr, m, k);
    for (u32 jb = blockIdx.x; jb < nblk; jb += gridDim.x)
        fp8_gemvx_pdl<A, A, M, NR, FP8_GEMVX_HW, true>(w, sc, rs, xs, out, m, k, n, jb);
}

// Entries norm_fp8_gemvx_{A}_{A}_m{M}_r{NR}: the (M, NR) pairs Fp8GemvForm::AUTO picks.
#define PORTER_NORM_FP8(NA, A, M, NR)                                                                             \
    extern "C" __global__ void __launch_bounds__(256) norm_fp8_gemvx_##NA##_##NA##_m##M##_r##NR(                  \
        const float* x, const A* nw, float eps, int zc, u32 nt, const unsigned char* w, const float* sc,         \
        const u32* rs, A* out, A* normed, u32 m, u32 k, u32 n, u32 nblk) { porter_pdl_enter();                                       \
        norm_fp8_gemvx_impl<A, M, NR>(x, nw, eps, zc, nt, w, sc, rs, out, normed, m, k, n, nblk);                \
    }
#define PORTER_NORM_FP8_A(NA, A)                                                                                  \
    PORTER_NORM_FP8(NA, A, 1, 1) PORTER_NORM_FP8(NA, A, 1, 2) PORTER_NORM_FP8(NA, A, 1, 4)                        \
        PORTER_NORM_FP8(NA, A, 2, 1) PORTER_NORM_FP8(NA, A, 2, 2) PORTER_NORM_FP8(NA, A, 4, 1)                    \
            PORTER_NORM_FP8(NA, A, 4, 2)
PORTER_NORM_FP8_A(f32, float)
PORTER_NORM_FP8_A(bf16, bf16)
PORTER_NORM_FP8_A(f16, f16)

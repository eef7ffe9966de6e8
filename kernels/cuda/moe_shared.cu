// The direct MoE decode form with the shared expert fused in (moe_decode.cu's
// dir_gu_impl / dir_down_impl with a DirShared; see there for the formulas). Appended
// to the MOE module after moe_decode.cu (dense entry points) and to the FP8 module after
// fp8.cu (PORTER_FP8_MODULE: FP8 entry points, the routed and the shared weights both FP8).
//
// Why (Qwen3-Next-80B at batch 1, H200): the unfused shared expert is three launches after
// the routed experts, swiglu_f32in (2.6 µs), the down GEMV (~3.3 µs) and
// shared_expert_add_f32g (2.4 µs), for 2 MB of weights (~0.5 µs of bandwidth). Here h_s
// comes from extra blocks of the routed gate+up launch (an elementwise SwiGLU of columns
// the input GEMM already computed), and the down launch's warp for (row r, column c) adds
// the shared row's dot product after the routed pairs: with I_s = I (mode 1) as one more
// pair of the last zip group (k = 10, groups of 8: 2 of its 8 slots were live), so its
// loads are in flight with the routed ones.
//
// Entry points: moe_dir_gu_sh_<T>, moe_dir_down_sh_<T> (dense), moe_dir_gu_sh_fp8_<T>,
// moe_dir_down_sh_fp8_<T> (FP8). Arguments: those of moe_dir_gu_* / moe_dir_down_*, then
// gate+up: gu (f32), gu_stride, gu_col0, hs [t, Is], Is, t;
// down: the shared down weight [H, Is], hs, glog (f32), g_stride, g_col, Is, mode, svec.

#define MOE_SH_GU_ARGS(T) const float *sgu, u32 gu_stride, u32 gu_col0, T *hs, u32 Is, u32 t
#define MOE_SH_DOWN_ARGS(T) const T *hs, const float *glog, u32 g_stride, u32 g_col, u32 Is, int mode, int svec
#define MOE_SH_GU(T, M) (DirShared<T, M>{sgu, gu_stride, gu_col0, nullptr, 0u, 0u, M{}, hs, Is, t, 0, 0})
#define MOE_SH_DOWN(T, M, D) (DirShared<T, M>{nullptr, 0u, 0u, glog, g_stride, g_col, D, const_cast<T*>(hs), Is, 0u, mode, svec})

#ifndef PORTER_FP8_MODULE

#define MOE_SH_ENTRY(T, NAME)                                                                                        \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 3) moe_dir_gu_sh_##NAME(                        \
        const T* x, const T* gate, const T* up, const u32* idx, u32 n, u32 e, T* h, u32 H, u32 I, u32 k, int vec,  \
        MOE_SH_GU_ARGS(T)) {                                                                                            \
        dir_gu_impl<T, DenseMat<T>, 4>(x, DenseMat<T>{gate}, DenseMat<T>{up}, idx, n, e, h, H, I, k, vec,           \
                                       MOE_SH_GU(T, DenseMat<T>));                                                     \
    }                                                                                                                \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 2) moe_dir_down_sh_##NAME(                      \
        const T* h, const T* down, const u32* idx, const float* wt, u32 e, float* out, u32 H, u32 I, u32 k, int vec, \
        int staged, const T* sdown, MOE_SH_DOWN_ARGS(T)) {                                                              \
        dir_down_impl<T, DenseMat<T>, 2>(h, DenseMat<T>{down}, idx, wt, e, out, H, I, k, vec, staged,               \
                                         MOE_SH_DOWN(T, DenseMat<T>, DenseMat<T>{sdown}));                             \
    }

MOE_SH_ENTRY(float, f32)
MOE_SH_ENTRY(bf16, bf16)
MOE_SH_ENTRY(f16, f16)

#else

#define MOE_SH_FP8_ENTRY(T, NAME)                                                                                    \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 2) moe_dir_gu_sh_fp8_##NAME(                    \
        const T* x, const unsigned char* gate, const float* gs, const u32* grs, const unsigned char* up,             \
        const float* us, const u32* urs, const u32* idx, u32 n, u32 e, T* h, u32 H, u32 I, u32 k, int vec,           \
        MOE_SH_GU_ARGS(T)) {                                                                                            \
        dir_gu_impl<T, Fp8Mat<T>, 2>(x, FP8_MAT(T, gate, gs, grs, H), FP8_MAT(T, up, us, urs, H), idx, n, e, h, H,    \
                                     I, k, vec, MOE_SH_GU(T, Fp8Mat<T>));                                              \
    }                                                                                                                \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 2) moe_dir_down_sh_fp8_##NAME(                  \
        const T* h, const unsigned char* down, const float* ds, const u32* drs, const u32* idx, const float* wt,     \
        u32 e, float* out, u32 H, u32 I, u32 k, int vec, int staged, const unsigned char* sdown, const float* sds,   \
        const u32* sdrs, MOE_SH_DOWN_ARGS(T)) {                                                                         \
        dir_down_impl<T, Fp8Mat<T>, 1>(h, FP8_MAT(T, down, ds, drs, I), idx, wt, e, out, H, I, k, vec, staged,       \
                                       MOE_SH_DOWN(T, Fp8Mat<T>, FP8_MAT(T, sdown, sds, sdrs, Is)));                   \
    }

MOE_SH_FP8_ENTRY(float, f32)
MOE_SH_FP8_ENTRY(bf16, bf16)
MOE_SH_FP8_ENTRY(f16, f16)

#endif

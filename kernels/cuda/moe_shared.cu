// The MoE decode kernels appended after the row readers (to the MOE module after
// moe_decode.cu, to the FP8 module after fp8.cu): the streamed v1 down kernel (first
// below) and the direct form with the shared expert fused in.
//
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
// loads are in flight with the routed ones. FP8 checkpoints keep the router rows in bf16 and
// the shared gate / up in FP8, so no input GEMM computes the products; with gu_w the extra
// blocks compute them (a warp per element of h_s, warp_dots as the routed items) instead of
// an FP8 GEMV launch of their own (2.3 µs in place a layer, H100).
//
// Entry points: moe_dec_downs_<T> / moe_dec_downs_fp8_<T> (streamed v1 down);
// moe_dir_gu_sh_<T>, moe_dir_down_sh_<T> (dense), moe_dir_gu_sh_fp8_<T>,
// moe_dir_down_sh_fp8_<T> (FP8). Arguments: those of moe_dir_gu_* (with the fused router's,
// MOE_RT_ARGS) / moe_dir_down_*, then
// gate+up: gu (f32), gu_stride, gu_col0, hs [t, Is], Is, t, then the shared [gate; up] weight
//   [2·Is, H] (dense: its pointer; FP8: q, scales, row scale), gu_w, gu_vec (gu_w: h_s from that
//   weight and x, a warp an element; gu is then unused);
// down: the shared down weight [H, Is], hs, glog (f32), g_stride, g_col, Is, mode, svec.

// v1, streamed down + combine (moe_dec_downs_*; the default, PORTER_MOE_DOWN=legacy takes
// moe_dec_down_*). Why (80B shapes, t = 8..64, H200): moe_dec_down_* streamed ~1.7 TB/s. Its
// item is 4 KB of weights (4 rows of 1 KB), and every item ends in a fence and an atomic
// round trip (the column group's counter) with no load in flight, so a warp has weights in
// flight for well under half of its time; each block also redoes the grouping prologue
// before its first load (and at the 80 registers of 3 blocks an SM it spills). Here a block owns MOE_DS_NR hidden columns for *all* slots: its
// warps take the active slots in turn (slot w, w + warps, ...), each slot an ordinary
// down_item (the same warp_dots, so the same bits) whose o lands in the block's shared
// memory, o_s [n][MOE_DS_NR]; after one barrier the block combines its columns for every
// row (combine_at's terms and order: Σ_j round(o_j) · w_j in j order, invalid ids skipped).
// No o buffer, no counters, no fences, no atomics, and a warp goes from one slot's
// weights straight to the next slot's. The lists come from global memory: moe_align's, or
// stored by block 0 of the gate+up kernel (vec bit 1), so no grouping prologue either.
// The host takes it while o_s (n · NR · sizeof(T) bytes) fits DS_SMEM_BYTES (40 KiB,
// kernels/src/cuda/moe_decode.rs), else the legacy kernel. 8 warps of 8 columns: at H =
// 2048, 256 blocks, all resident at 2 an SM (16 warps, 8 KB of weights in flight each).
#define MOE_DS_NR 8     // streamed down: hidden columns per block
#define MOE_DS_WARPS 8  // streamed down: warps per block (taking the slots in turn)

// U: chunks in flight per lane and row; MB: routed rows per pass (dense 2, FP8 1: its
// 16-wide dequantized chunks take the registers).
template <typename T, typename M, int U, int MB>
__device__ __forceinline__ void dec_downs_impl(const T* __restrict__ h, const M down, const u32* __restrict__ idx,
                                               const float* __restrict__ wt, u32 e, const u32* __restrict__ g_sorted,
                                               const u32* __restrict__ g_seg, const u32* __restrict__ g_meta,
                                               float* __restrict__ out, u32 H, u32 I, u32 k, u32 t, int vec) {
    constexpr u32 NR = MOE_DS_NR;
    extern __shared__ uint4 dsm_o[];
    T* os = reinterpret_cast<T*>(dsm_o);
    const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, wpb = blockDim.x >> 5;
    const u32 c0 = blockIdx.x * NR;
    const u32 nact = __ldg(g_meta);
    for (u32 s = warp; s < nact; s += wpb)
        down_item<T, M, (int)NR, MB, U, false>(h, down, g_sorted, g_seg, s, c0, os, NR, 0u, H, I, vec, lane);
    __syncthreads();
    // out[r][c0 + cc] for every row, thread q: (r, cc) = (q / NR, q % NR).
    for (u32 q = threadIdx.x; q < t * NR; q += blockDim.x) {
        const u32 r = q / NR, cc = q % NR;
        if (c0 + cc >= H) continue;
        float acc = 0.0f;
        for (u32 j = 0; j < k; ++j) {
            const u64 p = (u64)r * k + j;
            if (__ldg(idx + p) < e) acc = __fadd_rn(acc, __fmul_rn(to_f(os[p * NR + cc]), __ldg(wt + p)));
        }
        out[(u64)r * H + c0 + cc] = acc;
    }
}

// Gate+up: the f32 columns (unused with gu_w), h_s, then (after the weight's own arguments,
// MOE_SH_GUW_*) gu_w and gu_vec (DirShared).
#define MOE_SH_GU_ARGS(T) const float *sgu, u32 gu_stride, u32 gu_col0, T *hs, u32 Is, u32 t
#define MOE_SH_GUW_DENSE(T) const T *sgw, int gu_w, int gu_vec
#define MOE_SH_GUW_FP8 const unsigned char *sgw, const float *sgs, const u32 *sgrs, int gu_w, int gu_vec
#define MOE_SH_DOWN_ARGS(T) const T *hs, const float *glog, u32 g_stride, u32 g_col, u32 Is, int mode, int svec
#define MOE_SH_GU(T, M, GUM) \
    (DirShared<T, M>{sgu, gu_stride, gu_col0, nullptr, 0u, 0u, M{}, hs, Is, t, 0, 0, GUM, gu_w, gu_vec})
#define MOE_SH_DOWN(T, M, D) \
    (DirShared<T, M>{nullptr, 0u, 0u, glog, g_stride, g_col, D, const_cast<T*>(hs), Is, 0u, mode, svec, M{}, 0, 0})

#ifndef PORTER_FP8_MODULE

#define MOE_DS_ENTRY(T, NAME)                                                                                        \
    extern "C" __global__ void __launch_bounds__(MOE_DS_WARPS * 32, 2) moe_dec_downs_##NAME(                          \
        const T* h, const T* down, const u32* idx, const float* wt, u32 e, const u32* g_sorted, const u32* g_seg,     \
        const u32* g_meta, float* out, u32 H, u32 I, u32 k, u32 t, int vec) { porter_pdl_enter();                                       \
        dec_downs_impl<T, DenseMat<T>, 2, 2>(h, DenseMat<T>{down}, idx, wt, e, g_sorted, g_seg, g_meta, out, H, I, k, \
                                             t, vec);                                                                  \
    }

MOE_DS_ENTRY(float, f32)
MOE_DS_ENTRY(bf16, bf16)
MOE_DS_ENTRY(f16, f16)

#define MOE_SH_ENTRY(T, NAME, DIR_U)                                                                                        \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 3) moe_dir_gu_sh_##NAME(                        \
        const T* x, const T* gate, const T* up, u32* idx, u32 n, u32 e, T* h, u32 H, u32 I, u32 k, int vec,        \
        const unsigned char* dpf, u64 dbytes, u32 npf, MOE_RT_ARGS, MOE_SH_GU_ARGS(T), MOE_SH_GUW_DENSE(T)) {        \
        porter_pdl_enter();                                                                                          \
        dir_gu_impl<T, DenseMat<T>, 4>(x, DenseMat<T>{gate}, DenseMat<T>{up}, idx, n, e, h, H, I, k, vec, dpf,      \
                                       dbytes, npf, MOE_RT, MOE_SH_GU(T, DenseMat<T>, DenseMat<T>{sgw}));         \
    }                                                                                                                \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 2) moe_dir_down_sh_##NAME(                      \
        const T* h, const T* down, const u32* idx, const float* wt, u32 e, float* out, u32 H, u32 I, u32 k, int vec, \
        int staged, const T* sdown, MOE_SH_DOWN_ARGS(T)) {                                                              \
        dir_down_impl_pdl<T, DenseMat<T>, DIR_U>(h, DenseMat<T>{down}, idx, wt, e, out, H, I, k, vec, staged,           \
                                         MOE_SH_DOWN(T, DenseMat<T>, DenseMat<T>{sdown}));                             \
    }                                                                                                                \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 2) moe_dir_downa_sh_##NAME(                     \
        const T* h, const T* down, const u32* idx, const float* wt, u32 e, float* out, u32 H, u32 I, u32 k, int vec, \
        int staged, const T* sdown, MOE_SH_DOWN_ARGS(T)) {                                                              \
        dir_downa_impl_pdl<T, DenseMat<T>, MOE_DOWNA_CH, MOE_DOWNA_KMAX>(                                              \
            h, DenseMat<T>{down}, idx, wt, e, out, H, I, k, staged, MOE_SH_DOWN(T, DenseMat<T>, DenseMat<T>{sdown}));  \
    }

// Down chunks in flight per lane and row (as moe_dir_down_*).
MOE_SH_ENTRY(float, f32, 1)
MOE_SH_ENTRY(bf16, bf16, 2)
MOE_SH_ENTRY(f16, f16, 2)

#else

#define MOE_SH_FP8_ENTRY(T, NAME)                                                                                    \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 2) moe_dir_gu_sh_fp8_##NAME(                    \
        const T* x, const unsigned char* gate, const float* gs, const u32* grs, const unsigned char* up,             \
        const float* us, const u32* urs, u32* idx, u32 n, u32 e, T* h, u32 H, u32 I, u32 k, int vec,                 \
        const unsigned char* dpf, u64 dbytes, u32 npf, MOE_RT_ARGS, MOE_SH_GU_ARGS(T), MOE_SH_GUW_FP8) {             \
        porter_pdl_enter();                                                                                          \
        dir_gu_impl<T, Fp8Mat<T>, 2>(x, FP8_MAT(T, gate, gs, grs, H), FP8_MAT(T, up, us, urs, H), idx, n, e, h, H,    \
                                     I, k, vec, dpf, dbytes, npf, MOE_RT,                                            \
                                     MOE_SH_GU(T, Fp8Mat<T>, FP8_MAT(T, sgw, sgs, sgrs, H)));                      \
    }                                                                                                                \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 2) moe_dir_down_sh_fp8_##NAME(                  \
        const T* h, const unsigned char* down, const float* ds, const u32* drs, const u32* idx, const float* wt,     \
        u32 e, float* out, u32 H, u32 I, u32 k, int vec, int staged, const unsigned char* sdown, const float* sds,   \
        const u32* sdrs, MOE_SH_DOWN_ARGS(T)) {                                                                         \
        dir_down_impl_pdl<T, Fp8Mat<T>, 1>(h, FP8_MAT(T, down, ds, drs, I), idx, wt, e, out, H, I, k, vec, staged,       \
                                       MOE_SH_DOWN(T, Fp8Mat<T>, FP8_MAT(T, sdown, sds, sdrs, Is)));                   \
    }                                                                                                                \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 2) moe_dir_downa_sh_fp8_##NAME(                 \
        const T* h, const unsigned char* down, const float* ds, const u32* drs, const u32* idx, const float* wt,     \
        u32 e, float* out, u32 H, u32 I, u32 k, int vec, int staged, const unsigned char* sdown, const float* sds,   \
        const u32* sdrs, MOE_SH_DOWN_ARGS(T)) {                                                                         \
        dir_downa_impl_pdl<T, Fp8Mat<T>, MOE_DOWNA_FP8_CH, MOE_DOWNA_FP8_KMAX>(                                        \
            h, FP8_MAT(T, down, ds, drs, I), idx, wt, e, out, H, I, k, staged,                                         \
            MOE_SH_DOWN(T, Fp8Mat<T>, FP8_MAT(T, sdown, sds, sdrs, Is)));                                              \
    }

// The streamed v1 down kernel (moe_decode.cu's dec_downs_impl) with FP8 experts: fp8.cu's
// entry points are fp8.cu's, this one is appended here, after Fp8Mat.
#define MOE_DS_FP8_ENTRY(T, NAME)                                                                                    \
    extern "C" __global__ void __launch_bounds__(MOE_DS_WARPS * 32, 2) moe_dec_downs_fp8_##NAME(                      \
        const T* h, const unsigned char* down, const float* ds, const u32* drs, const u32* idx, const float* wt,     \
        u32 e, const u32* g_sorted, const u32* g_seg, const u32* g_meta, float* out, u32 H, u32 I, u32 k, u32 t,     \
        int vec) { porter_pdl_enter();                                                                                                     \
        dec_downs_impl<T, Fp8Mat<T>, 1, 1>(h, FP8_MAT(T, down, ds, drs, I), idx, wt, e, g_sorted, g_seg, g_meta, out, H, \
                                        I, k, t, vec);                                                                 \
    }

MOE_DS_FP8_ENTRY(float, f32)
MOE_DS_FP8_ENTRY(bf16, bf16)
MOE_DS_FP8_ENTRY(f16, f16)

MOE_SH_FP8_ENTRY(float, f32)
MOE_SH_FP8_ENTRY(bf16, bf16)
MOE_SH_FP8_ENTRY(f16, f16)

#endif

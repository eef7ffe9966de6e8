// FP8 routed experts at decode batches on tensor cores (PORTER_FP8_MOE_DEC=mma; kernels/src/cuda/
// fp8/moe_mma.rs launches them): the FP8 weight format of moe_dec_mma.cu's swap-AB core
// (mdm_impl; the work split, the cp.async ring, the epilogue and the why are described there).
// Appended to the FP8 module's text after moe_dec_mma.cu.
//
// Format: a stage is one scale block of k (128 e4m3 bytes a row); each stage's products go to a
// fresh f32 fragment, then acc += partial · scale (the row's block scale): W = e4m3 · scale in
// f32 as the GEMV form, up to summation order. A weight byte costs one e4m3 → 16-bit conversion
// (2.5 integer ops a byte for bf16, half a conversion for f16).
//
// Fragments: in each 64-byte k sub-block the thread reads 16 bytes at byte 16q of rows g and
// g + 8; word s (0..3) serves k16 step s, its bytes (0, 1) as MMA k slots (2q, 2q + 1) and (2, 3)
// as (2q + 8, 2q + 9), i.e. physical k 16q + 4s + j. B then takes, for pair n = g, the 16
// activations at k 16q.. of the sub-block (32 bytes): words (2s, 2s + 1) for step s.
// Activations in shared memory: [8 pairs][16 chunks], chunk c of pair n at c ^ (n & 1).

// Four e4m3 bytes (k order 0..3) as two 16-bit pairs: lo = (b0, b1), hi = (b2, b3), each the
// exact e4m3 value (bf16) or the exact value (f16, hardware conversion on sm_89+).
template <typename T> __device__ __forceinline__ void fmm_cvt(u32 w, u32& lo, u32& hi);
// Two bf16 pairs holding e4m3 values times 2⁻¹²⁰ (sign, exponent and mantissa already placed)
// to their values: one exact bf16 multiply by 2¹²⁰ each (every e4m3 value is a bf16 normal).
// Shared by the tensor-core FP8 routed experts (fmm_cvt) and decode GEMV (fgt_cvt, fp8_gemvt.cu).
__device__ __forceinline__ void e4m3_bf16x2_scale_up(u32 y0, u32 y1, u32& lo, u32& hi) {
    const __nv_bfloat162 big = __halves2bfloat162(__ushort_as_bfloat16((unsigned short)0x7b80u),
                                                  __ushort_as_bfloat16((unsigned short)0x7b80u));
    const __nv_bfloat162 r0 = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&y0), big);
    const __nv_bfloat162 r1 = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&y1), big);
    lo = *reinterpret_cast<const u32*>(&r0);
    hi = *reinterpret_cast<const u32*>(&r1);
}
template <> __device__ __forceinline__ void fmm_cvt<bf16>(u32 w, u32& lo, u32& hi) {
    // Byte b at bits 8..15 (24..31) of a bf16 pair: sign in place, exponent and mantissa moved
    // down 4 (bf16 bits 4..10): the value times 2⁻¹²⁰ (subnormal e4m3 → bf16 subnormal), then
    // a bf16 multiply by 2¹²⁰, exact (all e4m3 values are bf16 normals).
    const u32 x0 = __byte_perm(w, 0u, 0x1404u), x1 = __byte_perm(w, 0u, 0x3424u);
    const u32 y0 = ((x0 >> 4) & 0x07f007f0u) | (x0 & 0x80008000u);
    const u32 y1 = ((x1 >> 4) & 0x07f007f0u) | (x1 & 0x80008000u);
    e4m3_bf16x2_scale_up(y0, y1, lo, hi);
}
template <> __device__ __forceinline__ void fmm_cvt<f16>(u32 w, u32& lo, u32& hi) {
    const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3);
    const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3);
    lo = *reinterpret_cast<const u32*>(&a);
    hi = *reinterpret_cast<const u32*>(&b);
}

// The FP8 format of mdm_impl (see moe_dec_mma.cu for the members).
struct FmmFp8 {
    static constexpr u32 WB = 1u;
    static constexpr u32 BCH = 16u;
    static constexpr bool SCALED = true;
    static __device__ __forceinline__ u32 bsw(u32 c, u32 n) { return c ^ (n & 1u); }
    static __device__ __forceinline__ void bfetch(const unsigned char* brow, u32 b, u32 g, u32 q, u32 (&bw)[8]) {
        // Pair g's activations at k 64b + 16q .. + 15: chunks 8b + 2q, + 1.
        const uint4 b0 = *reinterpret_cast<const uint4*>(brow + (bsw(8u * b + 2u * q, g) << 4));
        const uint4 b1 = *reinterpret_cast<const uint4*>(brow + (bsw(8u * b + 2u * q + 1u, g) << 4));
        bw[0] = b0.x;
        bw[1] = b0.y;
        bw[2] = b0.z;
        bw[3] = b0.w;
        bw[4] = b1.x;
        bw[5] = b1.y;
        bw[6] = b1.z;
        bw[7] = b1.w;
    }
    template <typename T>
    static __device__ __forceinline__ void tile(float (&d)[4], const uint4& wa, const uint4& wb, const u32 (&bw)[8]) {
        const u32 av[4] = {wa.x, wa.y, wa.z, wa.w}, bv[4] = {wb.x, wb.y, wb.z, wb.w};
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            u32 a0, a1, a2, a3;
            fmm_cvt<T>(av[s], a0, a2);
            fmm_cvt<T>(bv[s], a1, a3);
            mdm_mma<T>(d, a0, a1, a2, a3, bw[2 * s], bw[2 * s + 1]);
        }
    }
};

// fp8_moe_mma_gu_<T>: grid (ceil(I / 64), min(e, n)); fp8_moe_mma_down_<T>: grid (ceil(H / 128), min(e, n));
// MDM_THREADS threads, MDM_STAGES · 18 KiB of dynamic shared memory.
#define FMM_ENTRY(T, NAME)                                                                                        \
    extern "C" __global__ void __launch_bounds__(MDM_THREADS, 3) fp8_moe_mma_gu_##NAME(                           \
        const T* x, const unsigned char* gate, const float* gs, const u32* grs, const unsigned char* up,          \
        const float* us, const u32* urs, const u32* sorted, const u32* seg, const u32* meta, T* h, u32 H, u32 I,  \
        u32 k) { porter_pdl_enter();                                                                                                  \
        mdm_impl<T, FmmFp8, true>(x, gate, gs, grs, up, us, urs, sorted, seg, meta, h, H, I, k);                  \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(MDM_THREADS, 3) fp8_moe_mma_down_##NAME(                         \
        const T* h, const unsigned char* down, const float* ds, const u32* drs, const u32* sorted,                \
        const u32* seg, const u32* meta, T* o, u32 H, u32 I) { porter_pdl_enter();                                                    \
        mdm_impl<T, FmmFp8, false>(h, down, ds, drs, down, ds, drs, sorted, seg, meta, o, I, H, 1u);              \
    }
FMM_ENTRY(bf16, bf16)
FMM_ENTRY(f16, f16)

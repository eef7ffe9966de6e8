// FP8 weights (e4m3fn bytes with 128×128 block scales, porter_core::tensor::fp8): kernels that
// read them directly. Preceded by common.cuh, moe.cu and moe_decode.cu (this source instantiates
// the MoE decode GEMVs with an FP8 row reader and uses `load_act`; kernels/src/cuda/compile.rs builds
// the text).
//
// Device layout of an FP8 weight [rows, cols] (core/src/tensor/cuda.rs, DevFp8): q [rows, cols]
// u8; scales [scale_rows, ceil(cols/128)] f32 (multiplied); rs [rows] u32, the scale row of each
// weight row (r / 128 for one checkpoint tensor; packed / stacked / regrouped weights keep each
// part's own scales). W[r, c] = round_T(e4m3(q[r, c]) · scales[rs[r], c / 128]) with round_T the
// compute dtype's rounding, exactly as the CPU backend dequantizes (kernels/src/cpu/fp8.rs); the
// decode GEMV (fp8_gemvx_*) and the MoE decode GEMVs (Fp8Row below) compute with the unrounded
// e4m3 · scale instead (see fp8_gemvx_pdl).

#include <cuda_fp8.h>

#define FP8_BLOCK 128u
#define FP8_MAX 448.0f

// One e4m3fn byte as f32 (exact; NaN for 0x7f / 0xff).
__device__ __forceinline__ float fp8_f(unsigned char b) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3)));
}

// 2·PAIRS e4m3 bytes at p (byte i = element i) times `s`, each rounded to T: the dequantized
// weights.
template <typename T, int PAIRS>
__device__ __forceinline__ void fp8_unpack_pairs(const unsigned short* p, float s, float* f) {
#pragma unroll
    for (int i = 0; i < PAIRS; ++i) {
        const __half2 h = __half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)p[i], __NV_E4M3));
        const float2 t = __half22float2(h);
        f[2 * i] = round_to<T>(t.x * s);
        f[2 * i + 1] = round_to<T>(t.y * s);
    }
}

// 16 e4m3 bytes (byte i = element i) times `s`, each rounded to T.
template <typename T> __device__ __forceinline__ void fp8_unpack16(const uint4& v, float s, float* f) {
    fp8_unpack_pairs<T, 8>(reinterpret_cast<const unsigned short*>(&v), s, f);
}

// ---------------------------------------------------------------------------
// Decode GEMV, older form (A/B runs only, PORTER_FP8_GEMV=legacy; W rounded to T per weight):
// out[r, j] = Σ_c x[r, c] · W[j, c] for m ≤ M rows; a warp per FP8_GEMV_NR(M)
// weight rows streams their bytes with 16-byte loads (U in flight per lane and row),
// dequantizes in registers and reuses them for every x row, and each x chunk (loaded and
// converted once) for every weight row; f32 accumulation in a fixed order per (row, weight
// row) (lane-strided chunks, then a warp sum) whatever m is, one rounding to O. Needs k % 16
// == 0 and 16-byte aligned buffers (checked by the host). Grid: ceil(n / (NR · warps per
// block)). Several rows of x: converting x's chunk per weight row made the GEMV issue-bound
// (449 GB/s at 4 rows against 1,359 at 1 on [12288, 2048]); 2 weight rows a warp halve that.
// ---------------------------------------------------------------------------
#define FP8_GEMV_UNROLL 4
#define FP8_GEMV_NR(M) ((M) >= 2 ? 2 : 1)
template <typename A, typename O, int M>
__device__ __forceinline__ void fp8_gemv_impl(const unsigned char* __restrict__ w, const float* __restrict__ sc,
                                              const u32* __restrict__ rs, const A* __restrict__ x,
                                              O* __restrict__ out, u32 m, u32 k, u32 n) {
    constexpr int NR = FP8_GEMV_NR(M);
    const u32 lane = threadIdx.x & 31u;
    const u32 j0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * NR;
    if (j0 >= n) return;
    const u32 nsc = (k + FP8_BLOCK - 1) / FP8_BLOCK;
    const uint4* wr[NR];
    const float* srow[NR];
#pragma unroll
    for (int q = 0; q < NR; ++q) {
        const u32 j = min(j0 + q, n - 1);  // a row past n repeats the last; never stored
        wr[q] = reinterpret_cast<const uint4*>(w + (u64)j * k);
        srow[q] = sc + (u64)rs[j] * nsc;
    }
    const u32 kv = k / 16u;
    float acc[M][NR];
#pragma unroll
    for (int r = 0; r < M; ++r)
#pragma unroll
        for (int q = 0; q < NR; ++q) acc[r][q] = 0.0f;
    for (u32 c0 = lane; c0 < kv; c0 += 32u * FP8_GEMV_UNROLL) {
        uint4 wv[FP8_GEMV_UNROLL][NR];
#pragma unroll
        for (int u = 0; u < FP8_GEMV_UNROLL; ++u) {
            const u32 c = c0 + 32u * u;
#pragma unroll
            for (int q = 0; q < NR; ++q) wv[u][q] = c < kv ? __ldg(wr[q] + c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < FP8_GEMV_UNROLL; ++u) {
            const u32 c = c0 + 32u * u;
            if (c < kv) {
                float wf[NR][16];
#pragma unroll
                for (int q = 0; q < NR; ++q) fp8_unpack16<A>(wv[u][q], __ldg(srow[q] + (c >> 3)), wf[q]);
#pragma unroll
                for (int r = 0; r < M; ++r) {
                    if ((u32)r < m) {
                        float xf[16];
                        load_act<A, 16, false>(x + (u64)r * k + 16u * c, xf);
#pragma unroll
                        for (int q = 0; q < NR; ++q)
#pragma unroll
                            for (int i = 0; i < 16; ++i) acc[r][q] = fmaf(wf[q][i], xf[i], acc[r][q]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < M; ++r)
#pragma unroll
        for (int q = 0; q < NR; ++q) {
            const float v = warp_sum(acc[r][q]);
            if (lane == 0 && (u32)r < m && j0 + q < n) out[(u64)r * n + j0 + q] = from_f<O>(v);
        }
}

#define PORTER_FP8_GEMV(NA, A, NO, O, M)                                                                       \
    extern "C" __global__ void __launch_bounds__(256) fp8_gemv_##NA##_##NO##_m##M(                            \
        const unsigned char* w, const float* sc, const u32* rs, const A* x, O* out, u32 m, u32 k, u32 n) { porter_pdl_enter();   \
        fp8_gemv_impl<A, O, M>(w, sc, rs, x, out, m, k, n);                                                  \
    }
#define PORTER_FP8_GEMV_M(NA, A, NO, O)                                                                 \
    PORTER_FP8_GEMV(NA, A, NO, O, 1) PORTER_FP8_GEMV(NA, A, NO, O, 2) PORTER_FP8_GEMV(NA, A, NO, O, 4) \
        PORTER_FP8_GEMV(NA, A, NO, O, 8)
// The older form for A/B runs (PORTER_FP8_GEMV=legacy), bf16 activations only.
PORTER_FP8_GEMV_M(bf16, bf16, bf16, bf16)
PORTER_FP8_GEMV_M(bf16, bf16, f32, float)

// ---------------------------------------------------------------------------
// Decode GEMV, scale after the chunk ("x" kernels, the default; the kernels above are the
// older form, kept for A/B runs: PORTER_FP8_GEMV=legacy). A 16-byte chunk lies in one
// 128-column scale block, so out[r, j] = Σ_chunks s_chunk · (Σ_i e4m3_i · x[r, i]): the
// weights enter the FMAs as their exact e4m3 values, each chunk's f32 dot is multiplied by its
// scale once. That is the f32 dequantization W = e4m3 · s without rounding W to T (the
// reference "f32 on the dequantized weights"; it differs from round_T(e4m3 · s), what the
// CPU backend and the prefill GEMMs use, by at most half an ulp of T per weight), and it takes
// the conversion pipe off the hot loop: the older form rounded every weight to T (an F2F, 16 a
// clock per SM on sm_90, plus the e4m3 → f16 F2FP: 1.5 conversions a byte, ~2.8 TB/s at best;
// it measured 1.2–1.9). Here a byte costs half an F2FP (HW) or ~2 integer ops (ALU), one f16 →
// f32 HADD2 and one FFMA per x row.
//
// Two e4m3 → f16 conversions (both exact, bit-identical results): HW, the sm_89+ instruction
// (`cvt.rn.f16x2.e4m3x2`; emulated below sm_89); ALU, shifts and masks placing the byte's
// sign / exponent / mantissa into an f16 (f16 bias 15 against e4m3's 7: the value is e4m3 ·
// 2⁻⁸, subnormals included, always an f16 normal or zero), the chunk multiplier then s · 2⁸,
// so every product and sum is the HW one times 2⁻⁸ exactly and the scaled chunk sums are the
// same f32 values. (ALU reads the two NaN bytes 0x7f / 0xff as ±480; quantizers saturate to
// ±448 and never write them.)
//
// A warp takes NR weight rows (x chunk loaded and converted once for all NR, each weight chunk
// converted once for all m rows of x), U chunks per lane and row in flight. Row-invariant: lane
// l takes chunks c ≡ l (mod 32) in ascending order whatever NR, U, M, m or the conversion are,
// then a warp butterfly sum; a row's bits depend on nothing else (asserted by
// kernels/tests/cuda_fp8.rs across all of them). Needs k % 16 == 0 and 16-byte aligned
// buffers (checked by the host). Grid: ceil(n / (8 · NR)), 8 warps a block.
// ---------------------------------------------------------------------------

// 16 e4m3 bytes (byte i = element i) as f32: e4m3_i (HW) or e4m3_i · 2⁻⁸ (ALU), exact.
template <bool HW> __device__ __forceinline__ void fp8_chunk_f(const uint4& v, float* f) {
    const u32* w = reinterpret_cast<const u32*>(&v);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        if constexpr (HW) {
            // Bytes (0, 1) and (2, 3) of the word, a conversion each pair.
            const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[j] & 0xffffu), __NV_E4M3);
            const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[j] >> 16), __NV_E4M3);
            const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
            f[4 * j] = a.x;
            f[4 * j + 1] = a.y;
            f[4 * j + 2] = b.x;
            f[4 * j + 3] = b.y;
        } else {
            // Byte b at bits 8..15 of a half: sign kept at 15, exponent and mantissa moved down
            // one (bits 7..13), bit 14 (the f16 exponent's top bit) clear. Halves of h02:
            // elements 4j, 4j + 2; of h13: 4j + 1, 4j + 3.
            const u32 t02 = w[j] << 8, t13 = w[j];
            const u32 h02 = ((t02 >> 1) & 0x3f803f80u) | (t02 & 0x80008000u);
            const u32 h13 = ((t13 >> 1) & 0x3f803f80u) | (t13 & 0x80008000u);
            const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&h02));
            const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&h13));
            f[4 * j] = a.x;
            f[4 * j + 1] = b.x;
            f[4 * j + 2] = a.y;
            f[4 * j + 3] = b.y;
        }
    }
}

#define FP8_GEMVX_U(NR) ((NR) >= 4 ? 2 : 4)
// Column block `blk` (8 warps of NR weight rows). XS: x is in shared memory (the fused norm +
// GEMV of fp8_norm.cu), else global (read through the non-coherent cache). PDL: the kernel's
// porter_pdl_enter() is here, after the first batch of weight chunks and their scales (and
// the row → scale-row map) are asked for: they never depend on an earlier kernel, so under
// programmatic dependent launch the resident blocks stream them while the launch before this
// one finishes (as gemv_pdl and fp8_gemvt do; session 26's device timeline had the in_proj
// launch at 13 µs in place for 8.4 µs of bytes on the H100 without it); x is read after the
// wait. The arithmetic and its order are unchanged.
template <typename A, typename O, int M, int NR, bool HW, bool XS = false, bool PDL = false>
__device__ __forceinline__ void fp8_gemvx_pdl(const unsigned char* __restrict__ w, const float* __restrict__ sc,
                                               const u32* __restrict__ rs, const A* __restrict__ x,
                                               O* __restrict__ out, u32 m, u32 k, u32 n, u32 blk) {
    constexpr int U = FP8_GEMVX_U(NR);
    const float mul = HW ? 1.0f : 256.0f;  // back from the ALU conversion's 2⁻⁸ (exact)
    const u32 lane = threadIdx.x & 31u;
    const u32 j0 = (blk * (blockDim.x >> 5) + (threadIdx.x >> 5)) * NR;
    if (j0 >= n) {
        if (PDL) porter_pdl_enter();
        return;
    }
    const u32 nsc = (k + FP8_BLOCK - 1) / FP8_BLOCK;
    const uint4* wr[NR];
    const float* srow[NR];
#pragma unroll
    for (int q = 0; q < NR; ++q) {
        const u32 j = min(j0 + q, n - 1);  // a row past n repeats the last; never stored
        wr[q] = reinterpret_cast<const uint4*>(w + (u64)j * k);
        srow[q] = sc + (u64)__ldg(rs + j) * nsc;
    }
    const u32 kv = k / 16u;
    float acc[M][NR];
#pragma unroll
    for (int r = 0; r < M; ++r)
#pragma unroll
        for (int q = 0; q < NR; ++q) acc[r][q] = 0.0f;
    uint4 wv[U][NR];
    float s[U][NR];
    const auto load = [&](u32 c0) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const u32 c = c0 + 32u * u;
#pragma unroll
            for (int q = 0; q < NR; ++q) {
                wv[u][q] = c < kv ? __ldg(wr[q] + c) : make_uint4(0, 0, 0, 0);
                s[u][q] = c < kv ? __ldg(srow[q] + (c >> 3)) * mul : 0.0f;
            }
        }
    };
    load(lane);
    if (PDL) porter_pdl_enter();
    for (u32 c0 = lane; c0 < kv; c0 += 32u * U) {
        if (c0 != lane) load(c0);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const u32 c = c0 + 32u * u;
            if (c < kv) {
                float wf[NR][16];
#pragma unroll
                for (int q = 0; q < NR; ++q) fp8_chunk_f<HW>(wv[u][q], wf[q]);
#pragma unroll
                for (int r = 0; r < M; ++r) {
                    if ((u32)r < m) {
                        float xf[16];
                        if (XS) {
#pragma unroll
                            for (u32 v = 0; v < 16 / VecOf<A>::N; ++v)
                                unpack<A>(reinterpret_cast<const uint4*>(x + (u64)r * k + 16u * c)[v], xf + v * VecOf<A>::N);
                        } else {
                            load_act<A, 16, false>(x + (u64)r * k + 16u * c, xf);
                        }
#pragma unroll
                        for (int q = 0; q < NR; ++q) {
                            float d = wf[q][0] * xf[0];
#pragma unroll
                            for (int i = 1; i < 16; ++i) d = fmaf(wf[q][i], xf[i], d);
                            acc[r][q] = fmaf(d, s[u][q], acc[r][q]);
                        }
                    }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < M; ++r)
#pragma unroll
        for (int q = 0; q < NR; ++q) {
            const float v = warp_sum(acc[r][q]);
            if (lane == 0 && (u32)r < m && j0 + q < n) out[(u64)r * n + j0 + q] = from_f<O>(v);
        }
}

// The conversion of the default kernels: the native one where it exists.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define FP8_GEMVX_HW true
#else
#define FP8_GEMVX_HW false
#endif
// Default kernels (kernels/src/cuda/fp8.rs Fp8GemvForm::rows picks): at one row of x for 1, 2
// and 4 weight rows a warp (by the number of weight rows), from two rows of x on at 2 or 1.
// The one-row kernels are held to 3 blocks an SM (85 registers): with the first weight batch
// loaded before the PDL wait, the 4-row form took 92 and 2 blocks, so the 80B in_proj's 384
// blocks no longer fitted one wave.
#define PORTER_FP8_GEMVX1(NA, A, NO, O, NR)                                                                 \
    extern "C" __global__ void __launch_bounds__(256, 3) fp8_gemvx_##NA##_##NO##_m1_r##NR(                    \
        const unsigned char* w, const float* sc, const u32* rs, const A* x, O* out, u32 m, u32 k, u32 n) {      \
        fp8_gemvx_pdl<A, O, 1, NR, FP8_GEMVX_HW, false, true>(w, sc, rs, x, out, m, k, n, blockIdx.x);               \
    }
#define PORTER_FP8_GEMVX(NA, A, NO, O, M)                                                                    \
    extern "C" __global__ void __launch_bounds__(256) fp8_gemvx_##NA##_##NO##_m##M(                        \
        const unsigned char* w, const float* sc, const u32* rs, const A* x, O* out, u32 m, u32 k, u32 n) {      \
        fp8_gemvx_pdl<A, O, M, 2, FP8_GEMVX_HW, false, true>(w, sc, rs, x, out, m, k, n, blockIdx.x);                \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(256) fp8_gemvx_##NA##_##NO##_m##M##_r1(                   \
        const unsigned char* w, const float* sc, const u32* rs, const A* x, O* out, u32 m, u32 k, u32 n) {      \
        fp8_gemvx_pdl<A, O, M, 1, FP8_GEMVX_HW, false, true>(w, sc, rs, x, out, m, k, n, blockIdx.x);                \
    }
#define PORTER_FP8_GEMVX_M(NA, A, NO, O)                                                                        \
    PORTER_FP8_GEMVX1(NA, A, NO, O, 1) PORTER_FP8_GEMVX1(NA, A, NO, O, 2) PORTER_FP8_GEMVX1(NA, A, NO, O, 4)   \
        PORTER_FP8_GEMVX(NA, A, NO, O, 2) PORTER_FP8_GEMVX(NA, A, NO, O, 4) PORTER_FP8_GEMVX(NA, A, NO, O, 8)
PORTER_FP8_GEMVX_M(f32, float, f32, float)
PORTER_FP8_GEMVX_M(bf16, bf16, bf16, bf16)
PORTER_FP8_GEMVX_M(bf16, bf16, f32, float)
PORTER_FP8_GEMVX_M(f16, f16, f16, f16)
PORTER_FP8_GEMVX_M(f16, f16, f32, float)

// A/B variants, bf16 only (each kernel costs NVRTC time at start-up): the hardware conversion
// at 1, 2 and 4 weight rows a warp from two rows of x on (at one row the default kernels
// serve), the integer one at 2 weight rows a warp (4 from 4 rows of x) (its bits checked
// against the others on any GPU).
#define PORTER_FP8_GEMVX_AB(M, NR, CV, HW)                                                                   \
    extern "C" __global__ void __launch_bounds__(256) fp8_gemvx_bf16_bf16_m##M##_r##NR##_##CV(               \
        const unsigned char* w, const float* sc, const u32* rs, const bf16* x, bf16* out, u32 m, u32 k, u32 n) {   \
        fp8_gemvx_pdl<bf16, bf16, M, NR, HW, false, true>(w, sc, rs, x, out, m, k, n, blockIdx.x);                      \
    }
#define PORTER_FP8_GEMVX_AB_M(M)                                                                       \
    PORTER_FP8_GEMVX_AB(M, 1, hw, true) PORTER_FP8_GEMVX_AB(M, 2, hw, true) PORTER_FP8_GEMVX_AB(M, 4, hw, true)
PORTER_FP8_GEMVX_AB_M(2)
PORTER_FP8_GEMVX_AB_M(4)
PORTER_FP8_GEMVX_AB_M(8)
PORTER_FP8_GEMVX_AB(1, 2, alu, false)
PORTER_FP8_GEMVX_AB(2, 2, alu, false)
PORTER_FP8_GEMVX_AB(4, 4, alu, false)
PORTER_FP8_GEMVX_AB(8, 4, alu, false)

// ---------------------------------------------------------------------------
// Dequantize to T (the prefill path: the result feeds cuBLAS). With `vec` (cols % 16 == 0, a
// 16-byte aligned output): blocks of blockDim.x threads over (row, run of 8·blockDim.x
// columns), a thread 8 elements (one 8-byte load, 16 bytes of bf16 / f16 out), the row's
// scale row read once a block; else a thread an element, grid-stride.
// Why: the first form (a thread 16 elements, sixteen 2-byte stores at the lanes' 32-byte stride,
// two 64-bit divisions and a dependent row-map load per thread) ran at 0.3 TB/s (272 µs for a
// [12288, 2048] weight on the H100; 110 µs with 16-byte stores).
// ---------------------------------------------------------------------------

// 8 values f (already values of T) to o (16-byte aligned for 2-byte T, 32 for f32).
// bf16 / f16: packed pairs (exact: f holds values of T).
template <typename T> __device__ __forceinline__ void fp8_store8(T* o, const float* f) {
    u32 w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = pack2_rn<T>(f[2 * i], f[2 * i + 1]);
    *reinterpret_cast<uint4*>(o) = make_uint4(w[0], w[1], w[2], w[3]);
}
template <> __device__ __forceinline__ void fp8_store8<float>(float* o, const float* f) {
    float4* v = reinterpret_cast<float4*>(o);
    v[0] = make_float4(f[0], f[1], f[2], f[3]);
    v[1] = make_float4(f[4], f[5], f[6], f[7]);
}

template <typename T>
__device__ __forceinline__ void fp8_dequant_impl(const unsigned char* __restrict__ q, const float* __restrict__ sc,
                                                 const u32* __restrict__ rs, T* __restrict__ out, u32 rows, u32 cols,
                                                 int vec) {
    const u32 nsc = (cols + FP8_BLOCK - 1) / FP8_BLOCK;
    if (vec) {
        const u32 per_row = cols / 8u, runs = (per_row + blockDim.x - 1) / blockDim.x;
        const u64 items = (u64)rows * runs;
        for (u64 it = blockIdx.x; it < items; it += gridDim.x) {
            const u32 r = (u32)(it / runs), g = (u32)(it % runs) * blockDim.x + threadIdx.x;
            if (g >= per_row) continue;
            const u32 c = 8u * g;
            const uint2 v = __ldg(reinterpret_cast<const uint2*>(q + (u64)r * cols + c));
            const float s = __ldg(sc + (u64)__ldg(rs + r) * nsc + c / FP8_BLOCK);
            float f[8];
            fp8_unpack_pairs<T, 4>(reinterpret_cast<const unsigned short*>(&v), s, f);
            fp8_store8<T>(out + (u64)r * cols + c, f);
        }
    } else {
        const u64 total = (u64)rows * cols, stride = (u64)gridDim.x * blockDim.x;
        for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
            const u32 r = (u32)(i / cols), c = (u32)(i % cols);
            out[i] = from_f<T>(fp8_f(q[i]) * sc[(u64)rs[r] * nsc + c / FP8_BLOCK]);
        }
    }
}

// ---------------------------------------------------------------------------
// Block quantization of a [rows, cols] weight (random benchmark weights made on the device):
// one block of 256 threads per 128×128 block; scale = amax / 448 (1 for an all-zero block),
// q = e4m3(w / scale) rounded to nearest even, saturated to ±448: the CPU's quantize_blocks.
// Grid: (ceil(cols / 128), ceil(rows / 128)); scales [ceil(rows/128), ceil(cols/128)].
// ---------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void fp8_quantize_impl(const T* __restrict__ w, unsigned char* __restrict__ q,
                                                  float* __restrict__ scales, u32 rows, u32 cols) {
    __shared__ float sh[32];
    const u32 r0 = blockIdx.y * FP8_BLOCK, c0 = blockIdx.x * FP8_BLOCK;
    const u32 br = min(FP8_BLOCK, rows - r0), bc = min(FP8_BLOCK, cols - c0);
    float amax = 0.0f;
    for (u32 i = threadIdx.x; i < br * bc; i += blockDim.x) {
        const u32 r = r0 + i / bc, c = c0 + i % bc;
        amax = fmaxf(amax, fabsf(to_f(w[(u64)r * cols + c])));
    }
    amax = block_max(amax, sh, threadIdx.x, blockDim.x);
    const float s = amax > 0.0f ? __fdiv_rn(amax, FP8_MAX) : 1.0f;
    if (threadIdx.x == 0) scales[(u64)blockIdx.y * gridDim.x + blockIdx.x] = s;
    for (u32 i = threadIdx.x; i < br * bc; i += blockDim.x) {
        const u64 at = (u64)(r0 + i / bc) * cols + c0 + i % bc;
        q[at] = (unsigned char)__nv_cvt_float_to_fp8(__fdiv_rn(to_f(w[at]), s), __NV_SATFINITE, __NV_E4M3);
    }
}

#define PORTER_FP8_CONV(NT, T)                                                                                    \
    extern "C" __global__ void fp8_dequant_##NT(const unsigned char* q, const float* sc, const u32* rs, T* out,   \
                                                u32 rows, u32 cols, int vec) { porter_pdl_enter();                                    \
        fp8_dequant_impl<T>(q, sc, rs, out, rows, cols, vec);                                                     \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        fp8_quantize_##NT(const T* w, unsigned char* q, float* scales, u32 rows, u32 cols) { porter_pdl_enter();                      \
        fp8_quantize_impl<T>(w, q, scales, rows, cols);                                                           \
    }
PORTER_FP8_CONV(f32, float)
PORTER_FP8_CONV(bf16, bf16)
PORTER_FP8_CONV(f16, f16)

// ---------------------------------------------------------------------------
// MoE decode with FP8 experts: moe_decode.cu's GEMVs (v1: two launches, v2: one, direct: two
// without grouping; the same items, order, scratch and combine; see there) instantiated with an
// FP8 row reader:
// the weight rows read as e4m3 bytes (16 a chunk) and dequantized in registers. gate / up
// [e·I, H], down [e·H, I], each with its scales and row → scale-row map. Launch bounds allow 2
// blocks / SM (up to 128 registers: the 16-wide dequantized vectors spill at 80).
// ---------------------------------------------------------------------------

// A weight row of e4m3 bytes: chunk c (bytes 16c .. 16c + 15) lies in scale block c / 8.
template <typename T> struct Fp8Row {
    static constexpr u32 E = 16;
    static constexpr bool CHEAP = false;
    const unsigned char* p;
    const float* s;  // the row's scales: s[j / 128] for column j
    __device__ __forceinline__ uint4 load(u32 c) const { return __ldg(reinterpret_cast<const uint4*>(p) + c); }
    // The chunk's e4m3 values (exact; times 2⁻⁸ by the ALU conversion, undone in dot_acc).
    __device__ __forceinline__ void expand(const uint4& v, u32, float* f) const { fp8_chunk_f<FP8_GEMVX_HW>(v, f); }
    // acc + scale · Σ_i e4m3_i · a_i: the GEMV's per-chunk formula (fp8_gemvx_pdl), so the
    // experts see W = e4m3 · scale in f32, not rounded to T; dot_acc = dot_side with side(c),
    // the chunk's block scale (the in-flight down kernel, dir_downa_impl_pdl, loads it with
    // the chunk, before its PDL wait).
    __device__ __forceinline__ float side(u32 c) const { return __ldg(s + (c >> 3)); }
    static __device__ __forceinline__ float dot_side(const float* wf, const float* af, float sc, float acc) {
        float d = wf[0] * af[0];
#pragma unroll
        for (int i = 1; i < 16; ++i) d = fmaf(wf[i], af[i], d);
        return fmaf(d, sc * (FP8_GEMVX_HW ? 1.0f : 256.0f), acc);
    }
    __device__ __forceinline__ float dot_acc(const float* wf, const float* af, u32 c, float acc) const {
        return dot_side(wf, af, side(c), acc);
    }
    __device__ __forceinline__ float at(u32 i) const { return fp8_f(p[i]) * s[i / FP8_BLOCK]; }
    __device__ __forceinline__ const void* base() const { return p; }
};

// Stacked FP8 expert weights [e·rows, K]: bytes q, scales sc [.., nsc], row -> scale row rs;
// W = e4m3 · scale in f32 (not rounded to T: the decode GEMV's semantics).
template <typename T> struct Fp8Mat {
    typedef Fp8Row<T> Row;
    static constexpr u32 BYTES = 1;
    const unsigned char* q;
    const float* sc;
    const u32* rs;
    u32 nsc;
    // rs null (Fp8Dev::row_scale_affine): the scale row is r / 128, computed, not loaded.
    __device__ __forceinline__ Row row(u64 r, u32 K) const {
        return Row{q + r * K, sc + (rs ? (u64)__ldg(rs + r) : r / FP8_BLOCK) * nsc};
    }
};

#define FP8_MAT(T, Q, S, R, K) (Fp8Mat<T>{Q, S, R, ((K) + FP8_BLOCK - 1) / FP8_BLOCK})

#define FP8_MOE_DEC_ENTRY(T, NAME, GU_U, DN_MB)                                                                   \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 2) moe_dec_gu_fp8_##NAME(                   \
        const T* x, const unsigned char* gate, const float* gs, const u32* grs, const unsigned char* up,          \
        const float* us, const u32* urs, const u32* idx, u32 n, u32 e, int fused, const u32* g_sorted,            \
        const u32* g_seg, const u32* g_meta, u32* ctr, u32 nctr, T* h, u32 H, u32 I, u32 k, int vec) { porter_pdl_enter();            \
        dec_gu_impl<T, Fp8Mat<T>, 2>(x, FP8_MAT(T, gate, gs, grs, H), FP8_MAT(T, up, us, urs, H), idx, n, e, fused,     \
                                     g_sorted, g_seg, g_meta, ctr, nctr, h, H, I, k, vec);                        \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 2) moe_dec_down_fp8_##NAME(                 \
        const T* h, const unsigned char* down, const float* ds, const u32* drs, const u32* idx, const float* wt,  \
        u32 n, u32 e, int fused, const u32* g_sorted, const u32* g_seg, const u32* g_meta, u32* ctr, T* o,        \
        float* out, u32 H, u32 I, u32 k, u32 t, int vec) { porter_pdl_enter();                                                        \
        dec_down_impl<T, Fp8Mat<T>, 1>(h, FP8_MAT(T, down, ds, drs, I), idx, wt, n, e, fused, g_sorted, g_seg,       \
                                       g_meta, ctr, o, out, H, I, k, t, vec);                                     \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, MOE_V2_BLOCKS) moe_dec_v2_fp8_##NAME(       \
        const T* x, const unsigned char* gate, const float* gs, const u32* grs, const unsigned char* up,          \
        const float* us, const u32* urs, const unsigned char* down, const float* ds, const u32* drs,              \
        const u32* idx, const float* wt, u32 n, u32 e, int fused, const u32* g_sorted, const u32* g_seg,          \
        const u32* g_meta, u32* sync, T* h, T* o, float* out, u32 H, u32 I, u32 k, u32 t, int vec_gu, int vec_d,  \
        u32 ch, u32 phases) { porter_pdl_enter();                                                                                             \
        dec_v2_impl<T, Fp8Mat<T>, GU_U, 1, DN_MB>(x, FP8_MAT(T, gate, gs, grs, H), FP8_MAT(T, up, us, urs, H),                    \
                                        FP8_MAT(T, down, ds, drs, I), idx, wt, n, e, fused, g_sorted, g_seg, g_meta, \
                                        sync, h, o, out, H, I, k, t, vec_gu, vec_d, ch, phases);                      \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 2) moe_dir_gu_fp8_##NAME(                   \
        const T* x, const unsigned char* gate, const float* gs, const u32* grs, const unsigned char* up,          \
        const float* us, const u32* urs, u32* idx, u32 n, u32 e, T* h, u32 H, u32 I, u32 k, int vec,             \
        const unsigned char* dpf, u64 dbytes, u32 npf, MOE_RT_ARGS) {                                             \
        porter_pdl_enter();                                                                                       \
        dir_gu_impl<T, Fp8Mat<T>, 2>(x, FP8_MAT(T, gate, gs, grs, H), FP8_MAT(T, up, us, urs, H), idx, n, e, h, H, \
                                     I, k, vec, dpf, dbytes, npf, MOE_RT);                                        \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 2) moe_dir_down_fp8_##NAME(                 \
        const T* h, const unsigned char* down, const float* ds, const u32* drs, const u32* idx, const float* wt,  \
        u32 e, float* out, u32 H, u32 I, u32 k, int vec, int staged) {                                           \
        dir_down_impl_pdl<T, Fp8Mat<T>, 1>(h, FP8_MAT(T, down, ds, drs, I), idx, wt, e, out, H, I, k, vec, staged); \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 2) moe_dir_downa_fp8_##NAME(                \
        const T* h, const unsigned char* down, const float* ds, const u32* drs, const u32* idx, const float* wt,  \
        u32 e, float* out, u32 H, u32 I, u32 k, int vec, int staged) {                                           \
        dir_downa_impl_pdl<T, Fp8Mat<T>, MOE_DOWNA_FP8_CH, MOE_DOWNA_FP8_KMAX>(h, FP8_MAT(T, down, ds, drs, I), idx, wt, \
                                                                             e, out, H, I, k, staged);          \
    }

// The in-flight down kernel's reach with FP8 experts (MOE_DOWNA_FP8_* in
// kernels/src/cuda/moe_decode.rs): one 16-byte chunk a lane (I <= 512), up to 12 rows.
#define MOE_DOWNA_FP8_CH 1
#define MOE_DOWNA_FP8_KMAX 12

// v2 gate+up chunks in flight per lane and row, routed rows per down pass (see dec_v2_impl; f32
// activations take more registers).
FP8_MOE_DEC_ENTRY(float, f32, 2, 1)
FP8_MOE_DEC_ENTRY(bf16, bf16, 4, 1)
FP8_MOE_DEC_ENTRY(f16, f16, 4, 1)

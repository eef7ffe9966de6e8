// Decode GEMV with an FP8 weight on tensor cores (the default form from session 13 where
// tensor cores exist and x is bf16 / f16; kernels/src/cuda/fp8.rs Fp8GemvConv::Tc). Appended
// to the FP8 module's text after fp8.cu (uses FP8_BLOCK, FP8_GEMVX_HW and PMma of common.cuh).
//
// Why: the f32-FMA forms of fp8.cu (fp8_gemvx_*) spend CUDA-core instructions on every weight
// byte and x row (a conversion, an f16 → f32 widening and one FFMA per row of x: ~12
// instructions a byte at m = 8, more than the SM issues at HBM speed), so they read 0.75–2.5
// TB/s. Here the weight rows are the M side of mma.sync m16n8k16 (bf16 / f16 in, f32
// accumulators) and each group of ≤ 8 rows of x the N = 8 side ("swap AB"; up to 64 rows, a
// block per group): a weight byte costs ~2.5
// integer ops (bf16; half a conversion and a PRMT for f16 on sm_89+) plus 1/256 of an MMA,
// whatever m is, so the kernel is bound by the weight stream, not by issue.
//
// Semantics: W = e4m3 · scale in f32 (not rounded to A), as fp8_gemvx: each 128-column scale
// block's products go to a fresh f32 fragment (the tensor core's f32 sums of exact bf16 / f16
// products; e4m3 converts exactly to both), then acc += partial · scale of the row. Only the
// summation order differs from the FMA forms, so the bits do (not the values beyond f32
// rounding). Row-invariant: one kernel for every m (a row of x is an MMA column, and a
// column's sums never see another column), the work split chosen from (n, k) only.
//
// Work: 8 warps a block; the block takes RT = `rt` tiles of 16 weight rows, warp w tile w % RT
// and the scale blocks kb ≡ w / RT (mod 8 / RT), FGT_U of them in flight (4 × 16-byte loads a
// lane each: rows g and g + 8, two 64-byte halves); the 8 / RT warps of a tile are summed in
// warp order through shared memory, one rounding to O. The first loads of weights, scales and
// row → scale-row map are issued BEFORE porter_pdl_enter (they do not depend on earlier kernels:
// under programmatic dependent launch they overlap the previous kernel's tail); x is read only
// after it.
//
// Fragments (thread g = lane / 4, q = lane % 4): in each 64-byte half of a scale block the
// thread holds the 16 bytes at byte 16q of rows g and g + 8; word s (0..3) serves k16 step s,
// its bytes (0, 2) as MMA k slots (2q, 2q + 1) and (1, 3) as (2q + 8, 2q + 9) (a dot product does
// not care about the order of k as long as A and B agree). B (column n = g: row g of x) takes
// the 16 activations at the same k (32 bytes, two 16-byte loads) and pairs them the same way.
// Needs k % 16 == 0 and 16-byte aligned x and w (checked by the host; the last partial 64-byte
// half has whole 16-byte chunks); rows past n repeat row n − 1 and are not stored.

#define FGT_WARPS 8
#define FGT_U 4

// Four e4m3 bytes b0..b3 of a word as two pairs of A (exact values): lo = (b0, b2), hi = (b1, b3).
template <typename A> __device__ __forceinline__ void fgt_cvt(u32 w, u32& lo, u32& hi);
template <> __device__ __forceinline__ void fgt_cvt<bf16>(u32 w, u32& lo, u32& hi) {
    // Byte at bits 0..7 / 16..23 (8..15 / 24..31): sign to bit 15 (31), exponent and mantissa to
    // bf16 bits 4..10: the value times 2⁻¹²⁰ (a subnormal e4m3 becomes a bf16 subnormal), then a
    // bf16 multiply by 2¹²⁰, exact (every e4m3 value is a bf16 normal). No byte permutes.
    const u32 y0 = ((w << 4) & 0x07f007f0u) | ((w << 8) & 0x80008000u);
    const u32 y1 = ((w >> 4) & 0x07f007f0u) | (w & 0x80008000u);
    e4m3_bf16x2_scale_up(y0, y1, lo, hi);
}
template <> __device__ __forceinline__ void fgt_cvt<f16>(u32 w, u32& lo, u32& hi) {
#if FP8_GEMVX_HW
    // The sm_89+ conversion of a byte pair; the pairs (b0, b2) and (b1, b3) gathered first.
    const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)__byte_perm(w, 0u, 0x4420u), __NV_E4M3);
    const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)__byte_perm(w, 0u, 0x4431u), __NV_E4M3);
    lo = *reinterpret_cast<const u32*>(&a);
    hi = *reinterpret_cast<const u32*>(&b);
#else
    // fp8_chunk_f's integer conversion (the value times 2⁻⁸, always an f16 normal or zero),
    // then an f16 multiply by 2⁸, exact.
    const u32 t = w << 8;
    const u32 y0 = ((t >> 1) & 0x3f803f80u) | (t & 0x80008000u);
    const u32 y1 = ((w >> 1) & 0x3f803f80u) | (w & 0x80008000u);
    const __half2 big = __halves2half2(__ushort_as_half((unsigned short)0x5c00u), __ushort_as_half((unsigned short)0x5c00u));
    const __half2 r0 = __hmul2(*reinterpret_cast<const __half2*>(&y0), big);
    const __half2 r1 = __hmul2(*reinterpret_cast<const __half2*>(&y1), big);
    lo = *reinterpret_cast<const u32*>(&r0);
    hi = *reinterpret_cast<const u32*>(&r1);
#endif
}

// d += A · B (m16n8k16, f32 accumulators); nothing without the sm_80 paths (the host does not
// pick this form there).
template <typename A>
__device__ __forceinline__ void fgt_mma(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if defined(PORTER_SM80)
    const u32 a[4] = {a0, a1, a2, a3};
    PMma<A>::mma(d, a, b0, b1);
#endif
}

// The weight bytes and scales of one batch: scale blocks kb0 + i·kw, i < FGT_U.
__device__ __forceinline__ void fgt_load(const unsigned char* __restrict__ wa, const unsigned char* __restrict__ wb,
                                         const float* __restrict__ sa, const float* __restrict__ sb, u32 kb0, u32 kw,
                                         u32 q, u32 k, uint4 (&wv)[FGT_U][2][2], float (&s)[FGT_U][2]) {
    const u32 nkb = (k + FP8_BLOCK - 1) / FP8_BLOCK;
#pragma unroll
    for (int i = 0; i < FGT_U; ++i) {
        const u32 kb = kb0 + (u32)i * kw;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u32 o = kb * FP8_BLOCK + 64u * h + 16u * q;
            const bool ok = kb < nkb && o < k;
            wv[i][h][0] = ok ? __ldg(reinterpret_cast<const uint4*>(wa + o)) : make_uint4(0, 0, 0, 0);
            wv[i][h][1] = ok ? __ldg(reinterpret_cast<const uint4*>(wb + o)) : make_uint4(0, 0, 0, 0);
        }
        s[i][0] = kb < nkb ? __ldg(sa + kb) : 0.0f;
        s[i][1] = kb < nkb ? __ldg(sb + kb) : 0.0f;
    }
}

// The whole GEMV of one block, porter_pdl_enter() included (after the first weight loads: a
// kernel body that starts with this call enters through the PDL wait before it reads x).
// NG groups of 8 rows of x a block: each converted weight fragment feeds NG MMAs.
template <typename A, typename O, int NG>
__device__ __forceinline__ void fp8_gemvt_pdl(const unsigned char* __restrict__ w, const float* __restrict__ sc,
                                              const u32* __restrict__ rs, const A* __restrict__ x,
                                              O* __restrict__ out, u32 m, u32 k, u32 n, u32 rt) {
    __shared__ float red[FGT_WARPS][32][4 * NG];
    const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const u32 g = lane >> 2, q = lane & 3u;
    const u32 kw = FGT_WARPS / rt, kslot = warp / rt;  // warps a tile, this warp's place
    // Rows of x in groups of 8 (the MMA's N side), NG groups a block: block b takes groups
    // (b % nb)·NG … of tile b / nb, so that the blocks of a tile run side by side and its weight
    // bytes come from HBM once (the other blocks' reads hit L2). Per row the arithmetic is the
    // same whatever m and NG.
    const u32 ng = (m + 7u) / 8u, nb = (ng + NG - 1u) / NG;
    const u32 mg0 = (blockIdx.x % nb) * NG, tile = blockIdx.x / nb;
    const u32 j0 = (tile * rt + warp % rt) * 16u;
    const u32 ra = min(j0 + g, n - 1), rb = min(j0 + g + 8u, n - 1);
    const u32 nkb = (k + FP8_BLOCK - 1) / FP8_BLOCK;
    const unsigned char* wa = w + (u64)ra * k;
    const unsigned char* wb = w + (u64)rb * k;
    const float* sa = sc + (u64)__ldg(rs + ra) * nkb;
    const float* sb = sc + (u64)__ldg(rs + rb) * nkb;
    uint4 wv[FGT_U][2][2];
    float s[FGT_U][2];
    fgt_load(wa, wb, sa, sb, kslot, kw, q, k, wv, s);
    porter_pdl_enter();
    // Row g of group mg0 + t of x (the MMA column g of that group).
    bool xrow[NG];
    const A* xr[NG];
#pragma unroll
    for (int t = 0; t < NG; ++t) {
        const u32 r = (mg0 + (u32)t) * 8u + g;
        xrow[t] = r < m;
        xr[t] = x + (u64)(xrow[t] ? r : 0u) * k;
    }
    float acc[NG][4];
#pragma unroll
    for (int t = 0; t < NG; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
    for (u32 kb0 = kslot; kb0 < nkb; kb0 += kw * FGT_U) {
        if (kb0 != kslot) fgt_load(wa, wb, sa, sb, kb0, kw, q, k, wv, s);
#pragma unroll
        for (int i = 0; i < FGT_U; ++i) {
            const u32 kb = kb0 + (u32)i * kw;
            if (kb >= nkb) break;
            float d[NG][4];
#pragma unroll
            for (int t = 0; t < NG; ++t) d[t][0] = d[t][1] = d[t][2] = d[t][3] = 0.0f;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const u32 o = kb * FP8_BLOCK + 64u * h + 16u * q;
                u32 xv[NG][8];
#pragma unroll
                for (int t = 0; t < NG; ++t) {
                    uint4 x0 = make_uint4(0, 0, 0, 0), x1 = make_uint4(0, 0, 0, 0);
                    if (xrow[t] && o < k) {
                        x0 = __ldg(reinterpret_cast<const uint4*>(xr[t] + o));
                        x1 = __ldg(reinterpret_cast<const uint4*>(xr[t] + o) + 1);
                    }
                    xv[t][0] = x0.x, xv[t][1] = x0.y, xv[t][2] = x0.z, xv[t][3] = x0.w;
                    xv[t][4] = x1.x, xv[t][5] = x1.y, xv[t][6] = x1.z, xv[t][7] = x1.w;
                }
                const u32 av[4] = {wv[i][h][0].x, wv[i][h][0].y, wv[i][h][0].z, wv[i][h][0].w};
                const u32 bv[4] = {wv[i][h][1].x, wv[i][h][1].y, wv[i][h][1].z, wv[i][h][1].w};
#pragma unroll
                for (int st = 0; st < 4; ++st) {
                    u32 a0, a1, a2, a3;
                    fgt_cvt<A>(av[st], a0, a2);  // row g: k slots (2q, 2q + 1), (2q + 8, 2q + 9)
                    fgt_cvt<A>(bv[st], a1, a3);  // row g + 8
#pragma unroll
                    for (int t = 0; t < NG; ++t) {
                        // x at k 4st + (0, 2) and 4st + (1, 3) of the thread's 16: the weights' pairing.
                        const u32 b0 = __byte_perm(xv[t][2 * st], xv[t][2 * st + 1], 0x5410u);
                        const u32 b1 = __byte_perm(xv[t][2 * st], xv[t][2 * st + 1], 0x7632u);
                        fgt_mma<A>(d[t], a0, a1, a2, a3, b0, b1);
                    }
                }
            }
            // d[t]: (row g, x rows 2q, 2q + 1 of group t), (row g + 8, the same x rows).
#pragma unroll
            for (int t = 0; t < NG; ++t) {
                acc[t][0] = fmaf(d[t][0], s[i][0], acc[t][0]);
                acc[t][1] = fmaf(d[t][1], s[i][0], acc[t][1]);
                acc[t][2] = fmaf(d[t][2], s[i][1], acc[t][2]);
                acc[t][3] = fmaf(d[t][3], s[i][1], acc[t][3]);
            }
        }
    }
    if (kw > 1) {
#pragma unroll
        for (int t = 0; t < NG; ++t)
#pragma unroll
            for (int i = 0; i < 4; ++i) red[warp][lane][4 * t + i] = acc[t][i];
        __syncthreads();
        if (kslot != 0) return;
        // The tile's warps in slot order (warp + rt·slot), whatever m is.
        for (u32 u = 1; u < kw; ++u)
#pragma unroll
            for (int t = 0; t < NG; ++t)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[t][i] += red[warp + u * rt][lane][4 * t + i];
    }
    const u32 jr[2] = {j0 + g, j0 + g + 8u};
#pragma unroll
    for (int t = 0; t < NG; ++t) {
        const u32 r0 = (mg0 + (u32)t) * 8u + 2u * q;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 r = r0 + (u32)(i & 1), j = jr[i >> 1];
            if (r < m && j < n) out[(u64)r * n + j] = from_f<O>(acc[t][i]);
        }
    }
}

// fp8_gemvt_<A>_<O>[_g2](w, sc, rs, x, out, m, k, n, rt): grid ceil(ceil(m / 8) / NG) ·
// ceil(n / (16 · rt)), 256 threads; NG = 1 (m ≤ 8), 2 (_g2, more rows; bf16 only: the f16
// conversion's extra registers spilled at two groups).
#define PORTER_FP8_GEMVT_NG(NA, A, NO, O, SUF, NG)                                                            \
    extern "C" __global__ void __launch_bounds__(FGT_WARPS * 32, 2) fp8_gemvt_##NA##_##NO##SUF(              \
        const unsigned char* w, const float* sc, const u32* rs, const A* x, O* out, u32 m, u32 k, u32 n,      \
        u32 rt) {                                                                                             \
        fp8_gemvt_pdl<A, O, NG>(w, sc, rs, x, out, m, k, n, rt);                                              \
    }
PORTER_FP8_GEMVT_NG(bf16, bf16, bf16, bf16, , 1)
PORTER_FP8_GEMVT_NG(bf16, bf16, f32, float, , 1)
PORTER_FP8_GEMVT_NG(f16, f16, f16, f16, , 1)
PORTER_FP8_GEMVT_NG(f16, f16, f32, float, , 1)
PORTER_FP8_GEMVT_NG(bf16, bf16, bf16, bf16, _g2, 2)
PORTER_FP8_GEMVT_NG(bf16, bf16, f32, float, _g2, 2)

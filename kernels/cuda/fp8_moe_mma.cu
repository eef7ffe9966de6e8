// FP8 routed experts at decode batches on tensor cores (PORTER_FP8_MOE_DEC=mma; kernels/src/cuda/
// fp8/moe_mma.rs launches them). Appended to the FP8 module's text (after moe.cu, moe_decode.cu,
// fp8.cu, ...: uses cp_async16 / cp_async_commit / cp_async_wait, silu_f, round_to, from_f).
//
// Why: the GEMV form (moe_decode.cu with Fp8Row) spends CUDA-core instructions per weight byte
// (16 f32 values a 16-byte chunk, a 16-term FMA chain per routed row) and reads the experts at
// 1.2–1.7 TB/s. Here the weight rows are the M side of mma.sync m16n8k16 (bf16 or f16 in, f32
// accumulators) and an expert's routed rows the N = 8 side ("swap AB"): a weight byte costs one
// e4m3 → 16-bit conversion (2.5 integer ops a byte for bf16, half a conversion for f16) and
// 1/16 of an MMA per 8 routed rows, whatever their number.
//
// Work: after moe_align (pad 1: sorted pairs, seg = (expert, start, count) per active slot, meta[0]
// the active slots), a block per (row block, slot) — grid (ceil(R / rows a block), min(e, n)),
// blocks past the active slots return at once:
// - gate+up (fp8_moe_mma_gu_*): 64 inter columns a block, 128 weight rows (64 gate then 64 up rows of
//   the same columns), K = H; warp w takes gate rows 16w.. and the up rows of the same columns,
//   so the SiLU(gate)·up of a (column, pair) is in one thread: h[p, c] = round(silu(round(g)) ·
//   round(u)) (the GEMV form's formula);
// - down (fp8_moe_mma_down_*): 128 hidden columns a block, K = I, o[p, c] = round(h_p · down_c);
// - then moe_combine*_<T> (moe.cu): out[r, c] = Σ_j round(o) · w[r, j] in slot order.
// An expert's pairs are taken 8 at a time (one n8 tile); more than 8 re-stream its rows (from
// L2 mostly). Weights stream through a FMM_STAGES-deep cp.async ring of 128 rows × 128 bytes
// (one scale block of k) plus the 8 activation rows' 128 k; each k block's products go to a
// fresh f32 fragment, then acc += partial · scale (the row's block scale): W = e4m3 · scale in
// f32 as the GEMV form, up to summation order (not batch-invariant: the host keeps the GEMV form
// for --deterministic / f32).
//
// Fragments (m16n8k16, row.col): thread (g = lane / 4, q = lane % 4). The k order inside each
// 64-byte k sub-block is permuted identically for A and B (a dot product does not care): the
// thread reads 16 bytes at byte 16q of rows g and g + 8; word s (0..3) serves k16 step s, its
// bytes (0, 1) as MMA k slots (2q, 2q + 1) and (2, 3) as (2q + 8, 2q + 9), i.e. physical k
// 16q + 4s + j. B then takes, for pair n = g, the 16 activations at k 16q.. of the sub-block
// (32 bytes): words (2s, 2s + 1) for step s.
//
// Shared memory (dynamic, FMM_STAGES × 18 KiB): weights [128 rows][8 chunks of 16 bytes],
// chunk c of row r at c ^ ((r & 1) << 2) (the 8 lanes of a quarter-warp read rows 2i, 2i + 1 at
// chunks 0..3 or 4..7: distinct banks); activations [8 pairs][16 chunks], chunk c of pair n
// at c ^ (n & 1).

#define FMM_ROWS 128u
#define FMM_BK 128u
#define FMM_STAGES 4
#define FMM_THREADS 128
#define FMM_W_BYTES (FMM_ROWS * FMM_BK)
#define FMM_B_BYTES (8u * FMM_BK * 2u)
#define FMM_STAGE_BYTES (FMM_W_BYTES + FMM_B_BYTES)

// Four e4m3 bytes (k order 0..3) as two 16-bit pairs: lo = (b0, b1), hi = (b2, b3), each the
// exact e4m3 value (bf16) or the exact value (f16, hardware conversion on sm_89+).
template <typename T> __device__ __forceinline__ void fmm_cvt(u32 w, u32& lo, u32& hi);
template <> __device__ __forceinline__ void fmm_cvt<bf16>(u32 w, u32& lo, u32& hi) {
    // Byte b at bits 8..15 (24..31) of a bf16 pair: sign in place, exponent and mantissa moved
    // down 4 (bf16 bits 4..10): the value times 2⁻¹²⁰ (subnormal e4m3 → bf16 subnormal), then
    // a bf16 multiply by 2¹²⁰, exact (all e4m3 values are bf16 normals).
    const u32 x0 = __byte_perm(w, 0u, 0x1404u), x1 = __byte_perm(w, 0u, 0x3424u);
    const u32 y0 = ((x0 >> 4) & 0x07f007f0u) | (x0 & 0x80008000u);
    const u32 y1 = ((x1 >> 4) & 0x07f007f0u) | (x1 & 0x80008000u);
    const __nv_bfloat162 big = __halves2bfloat162(__ushort_as_bfloat16((unsigned short)0x7b80u),
                                                  __ushort_as_bfloat16((unsigned short)0x7b80u));
    const __nv_bfloat162 r0 = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&y0), big);
    const __nv_bfloat162 r1 = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&y1), big);
    lo = *reinterpret_cast<const u32*>(&r0);
    hi = *reinterpret_cast<const u32*>(&r1);
}
template <> __device__ __forceinline__ void fmm_cvt<f16>(u32 w, u32& lo, u32& hi) {
    const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3);
    const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3);
    lo = *reinterpret_cast<const u32*>(&a);
    hi = *reinterpret_cast<const u32*>(&b);
}

template <typename T> __device__ __forceinline__ void fmm_mma(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                                              u32 b1);
template <> __device__ __forceinline__ void fmm_mma<bf16>(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                                          u32 b1) {
#if defined(PORTER_SM80)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}
template <> __device__ __forceinline__ void fmm_mma<f16>(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                                         u32 b1) {
#if defined(PORTER_SM80)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// One block: slot blockIdx.y's 128 weight rows of block blockIdx.x against its pairs, 8 at a
// time. GU: rows 0..63 gate (w0) and 64..127 up (w1) of inter columns 64·x.., R = I rows an
// expert, K = H, act = x (pair p's row p / k), out = h [n, I]. Down: rows of w0 (128·x..),
// R = H, K = I, act = h (row p), out = o [n, H]. K % 16 == 0, 16-byte aligned rows (the host).
template <typename T, bool GU>
__device__ __forceinline__ void fmm_impl(const T* __restrict__ act, const unsigned char* __restrict__ w0,
                                         const float* __restrict__ s0, const u32* __restrict__ rs0,
                                         const unsigned char* __restrict__ w1, const float* __restrict__ s1,
                                         const u32* __restrict__ rs1, const u32* __restrict__ sorted,
                                         const u32* __restrict__ seg, const u32* __restrict__ meta,
                                         T* __restrict__ out, u32 K, u32 R, u32 k) {
#if defined(PORTER_SM80)
    extern __shared__ uint4 fmm_smem[];
    const u32 slot = blockIdx.y;
    if (slot >= __ldg(meta)) return;
    const u32 ex = __ldg(seg + 3 * slot), start = __ldg(seg + 3 * slot + 1), cnt = __ldg(seg + 3 * slot + 2);
    const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5, g = lane >> 2, q = lane & 3u;
    const u32 col0 = blockIdx.x * (GU ? FMM_ROWS / 2 : FMM_ROWS);
    const u32 nsc = (K + FMM_BK - 1) / FMM_BK, nk = nsc;
    unsigned char* sm = reinterpret_cast<unsigned char*>(fmm_smem);

    // The weight rows this thread copies: row (tid / 8) + 16i, chunk tid % 8, i < 8.
    const u32 wch = tid & 7u;
    const unsigned char* wsrc[8];
    u32 wok = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const u32 r = (tid >> 3) + 16u * i;
        const u32 c = GU ? col0 + (r & 63u) : col0 + r;
        const bool up = GU && r >= 64u;
        const bool ok = c < R;
        wok |= (ok ? 1u : 0u) << i;
        wsrc[i] = (up ? w1 : w0) + ((u64)ex * R + (ok ? c : 0u)) * K + 16u * wch;
    }
    // The warp's two m16 tiles (smem rows) and the scale rows of this thread's rows g, g + 8.
    const u32 mt0 = GU ? 16u * warp : 32u * warp, mt1 = GU ? 64u + 16u * warp : 32u * warp + 16u;
    const float* srow[2][2];
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u32 r = (t ? mt1 : mt0) + g + 8u * h;
            const u32 c = min(GU ? col0 + (r & 63u) : col0 + r, R - 1u);
            const bool up = GU && r >= 64u;
            srow[t][h] = (up ? s1 : s0) + (u64)__ldg((up ? rs1 : rs0) + (u64)ex * R + c) * nsc;
        }
    // The activation chunk this thread copies: pair row bn = tid / 16, chunk tid % 16.
    const u32 bn = tid >> 4, bch = tid & 15u;

    for (u32 m0 = 0; m0 < cnt; m0 += 8u) {
        const u32 mb = min(8u, cnt - m0);
        const bool bok = bn < mb;
        const u32 bp = bok ? __ldg(sorted + start + m0 + bn) : 0u;
        const T* bsrc = act + (u64)(GU ? bp / k : bp) * K + 8u * bch;

        auto load_stage = [&](u32 kb) {
            unsigned char* st = sm + (kb % FMM_STAGES) * FMM_STAGE_BYTES;
            const u32 kc = kb * FMM_BK + 16u * wch;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const u32 r = (tid >> 3) + 16u * i;
                const bool v = (wok >> i & 1u) && kc < K;
                cp_async16(st + r * FMM_BK + ((wch ^ ((r & 1u) << 2)) << 4), v ? wsrc[i] + kb * FMM_BK : w0, v);
            }
            const u32 ka = kb * FMM_BK + 8u * bch;
            const bool v = bok && ka < K;
            cp_async16(st + FMM_W_BYTES + bn * 256u + ((bch ^ (bn & 1u)) << 4), v ? bsrc + kb * FMM_BK : act, v);
        };

        float acc[2][4];
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[t][i] = 0.0f;
#pragma unroll
        for (u32 s = 0; s < FMM_STAGES - 1; ++s) {
            if (s < nk) load_stage(s);
            cp_async_commit();
        }
        for (u32 kb = 0; kb < nk; ++kb) {
            float sc[2][2];
#pragma unroll
            for (int t = 0; t < 2; ++t)
#pragma unroll
                for (int h = 0; h < 2; ++h) sc[t][h] = __ldg(srow[t][h] + kb);
            cp_async_wait<FMM_STAGES - 2>();
            __syncthreads();
            if (kb + FMM_STAGES - 1 < nk) load_stage(kb + FMM_STAGES - 1);
            cp_async_commit();
            const unsigned char* st = sm + (kb % FMM_STAGES) * FMM_STAGE_BYTES;
            float part[2][4];
#pragma unroll
            for (int t = 0; t < 2; ++t)
#pragma unroll
                for (int i = 0; i < 4; ++i) part[t][i] = 0.0f;
#pragma unroll
            for (u32 b = 0; b < 2; ++b) {
                // Pair g's activations at k 64b + 16q .. + 15: chunks 8b + 2q, + 1.
                const unsigned char* brow = st + FMM_W_BYTES + g * 256u;
                const uint4 b0 = *reinterpret_cast<const uint4*>(brow + (((8u * b + 2u * q) ^ (g & 1u)) << 4));
                const uint4 b1 = *reinterpret_cast<const uint4*>(brow + (((8u * b + 2u * q + 1u) ^ (g & 1u)) << 4));
                const u32 bw[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
                for (int t = 0; t < 2; ++t) {
                    const u32 r0 = (t ? mt1 : mt0) + g, r1 = r0 + 8u;
                    const u32 ch = 4u * b + q;
                    const uint4 wa = *reinterpret_cast<const uint4*>(st + r0 * FMM_BK + ((ch ^ ((r0 & 1u) << 2)) << 4));
                    const uint4 wb = *reinterpret_cast<const uint4*>(st + r1 * FMM_BK + ((ch ^ ((r1 & 1u) << 2)) << 4));
                    const u32 av[4] = {wa.x, wa.y, wa.z, wa.w}, bv[4] = {wb.x, wb.y, wb.z, wb.w};
#pragma unroll
                    for (int s = 0; s < 4; ++s) {
                        u32 a0, a1, a2, a3;
                        fmm_cvt<T>(av[s], a0, a2);
                        fmm_cvt<T>(bv[s], a1, a3);
                        fmm_mma<T>(part[t], a0, a1, a2, a3, bw[2 * s], bw[2 * s + 1]);
                    }
                }
            }
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                acc[t][0] = fmaf(part[t][0], sc[t][0], acc[t][0]);
                acc[t][1] = fmaf(part[t][1], sc[t][0], acc[t][1]);
                acc[t][2] = fmaf(part[t][2], sc[t][1], acc[t][2]);
                acc[t][3] = fmaf(part[t][3], sc[t][1], acc[t][3]);
            }
        }
        cp_async_wait<0>();
        __syncthreads();  // the ring is refilled by the next pass
        // acc[t][i]: row (mt_t + g + 8·(i / 2)), pair 2q + i % 2.
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 n = 2u * q + (u32)(i & 1);
            if (n >= mb) continue;
            const u32 p = __ldg(sorted + start + m0 + n);
            if (GU) {
                const u32 c = col0 + 16u * warp + g + 8u * (u32)(i >> 1);
                if (c < R) out[(u64)p * R + c] = from_f<T>(silu_f(round_to<T>(acc[0][i])) * round_to<T>(acc[1][i]));
            } else {
#pragma unroll
                for (int t = 0; t < 2; ++t) {
                    const u32 c = col0 + (t ? mt1 : mt0) + g + 8u * (u32)(i >> 1);
                    if (c < R) out[(u64)p * R + c] = from_f<T>(acc[t][i]);
                }
            }
        }
    }
#else
    __trap();  // sm_80+ only (the host checks)
#endif
}

// fp8_moe_mma_gu_<T>: grid (ceil(I / 64), min(e, n)); fp8_moe_mma_down_<T>: grid (ceil(H / 128), min(e, n));
// FMM_THREADS threads, FMM_STAGES · FMM_STAGE_BYTES of dynamic shared memory.
#define FMM_ENTRY(T, NAME)                                                                                        \
    extern "C" __global__ void __launch_bounds__(FMM_THREADS, 3) fp8_moe_mma_gu_##NAME(                                   \
        const T* x, const unsigned char* gate, const float* gs, const u32* grs, const unsigned char* up,          \
        const float* us, const u32* urs, const u32* sorted, const u32* seg, const u32* meta, T* h, u32 H, u32 I,  \
        u32 k) {                                                                                                  \
        fmm_impl<T, true>(x, gate, gs, grs, up, us, urs, sorted, seg, meta, h, H, I, k);                          \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(FMM_THREADS, 3) fp8_moe_mma_down_##NAME(                                 \
        const T* h, const unsigned char* down, const float* ds, const u32* drs, const u32* sorted,                \
        const u32* seg, const u32* meta, T* o, u32 H, u32 I) {                                                    \
        fmm_impl<T, false>(h, down, ds, drs, down, ds, drs, sorted, seg, meta, o, I, H, 1u);                      \
    }
FMM_ENTRY(bf16, bf16)
FMM_ENTRY(f16, f16)

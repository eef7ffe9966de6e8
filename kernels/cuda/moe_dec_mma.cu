// Routed experts at decode batches on tensor cores, the shared core of the dense (bf16 / f16
// weights, PORTER_MOE_DEC=mma; kernels/src/cuda/moe_mma.rs) and the FP8 forms (fp8_moe_mma.cu,
// PORTER_FP8_MOE_DEC; kernels/src/cuda/fp8/moe_mma.rs). Appended to the MOE module's text (after
// moe.cu, moe_decode.cu: cp_async16 / cp_async_commit / cp_async_wait, silu_f, round_to, from_f)
// and, before fp8_moe_mma.cu, to the FP8 module's (PORTER_FP8_MODULE: the dense entry points are
// left out there).
//
// Why: the GEMV forms (moe_decode.cu) spend CUDA-core instructions on every weight element (a
// multiply-add per element and routed row) and read the experts at ~3.1 TB/s (bf16, t = 64) or
// 1.2–1.7 TB/s (FP8). Here the weight rows are the M side of mma.sync m16n8k16 (bf16 or f16 in,
// f32 accumulators) and an expert's routed rows the N = 8 side ("swap AB"): a weight element
// costs 1/16 of an MMA per 8 routed rows, whatever their number (plus, for FP8, an e4m3 → 16-bit
// conversion in registers).
//
// Work: after moe_align (pad 1: sorted pairs, seg = (expert, start, count) per active slot,
// meta[0] the active slots), a block per (row block, slot) — grid (ceil(R / rows a block),
// min(e, n)), blocks past the active slots return at once:
// - gate+up (GU): 64 inter columns a block, 128 weight rows (64 gate then 64 up rows of the same
//   columns), K = H; warp w takes gate rows 16w.. and the up rows of the same columns, so the
//   SiLU(gate)·up of a (column, pair) is in one thread: h[p, c] = round(silu(round(g)) ·
//   round(u)) (the GEMV form's formula);
// - down: 128 hidden columns a block, K = I, o[p, c] = round(h_p · down_c);
// - then moe_combine*_<T> (moe.cu): out[r, c] = Σ_j round(o) · w[r, j] in slot order.
// An expert's pairs are taken 8 at a time (one n8 tile); more than 8 re-stream its rows (from
// L2 mostly). Weights stream through an MDM_STAGES-deep cp.async ring of 128 rows × 128 bytes
// (64 k of 16-bit weights, 128 k of FP8 = one scale block) plus the 8 activation rows' k of the
// stage. Dense: the MMAs accumulate into the f32 accumulators directly; FP8: each stage's
// products go to a fresh f32 fragment, then acc += partial · scale (the row's block scale).
// Same values as the GEMV forms up to f32 summation order (not batch-invariant: the host keeps
// the GEMV forms for --deterministic / f32).
//
// Fragments (m16n8k16, row.col): thread (g = lane / 4, q = lane % 4). The k order inside each
// 64-byte sub-block of a weight row is permuted identically for A and B (a dot product does not
// care): the thread reads the 16 bytes at byte 16q of rows g and g + 8 (plain 16-byte shared
// loads, no ldmatrix), and its format `F` maps their words to MMA k slots (2q, 2q + 1, 2q + 8,
// 2q + 9) of one or more k16 steps; B (pair n = g) takes the activations of the same physical k.
//
// Shared memory (dynamic, MDM_STAGES stages): weights [128 rows][8 chunks of 16 bytes], chunk c
// of row r at c ^ ((r & 1) << 2) (the 8 lanes of a quarter-warp read rows 2i, 2i + 1 at chunks
// 0..3 or 4..7: distinct banks); then activations [8 pairs][F::BCH chunks], at F::bsw(c, n).
//
// A format F (MdmDense below, FmmFp8 in fp8_moe_mma.cu) gives:
// - WB: bytes a weight element; BCH: 16-byte activation chunks a pair and stage (16 / WB);
// - SCALED: whether the weights carry per-row, per-128-k block scales (s, rs arguments);
// - bsw(c, n): the shared-memory chunk of activation chunk c of pair n;
// - bfetch(brow, b, g, q, bw): pair g's activation words for sub-block b (0, 1);
// - tile<T>(d, wa, wb, bw): the MMAs of one m16 tile and sub-block, rows g (wa), g + 8 (wb).

#define MDM_ROWS 128u
#define MDM_SB 128u
#define MDM_STAGES 4
#define MDM_THREADS 128
#define MDM_W_BYTES (MDM_ROWS * MDM_SB)

// d += A · B, m16n8k16, f32 accumulators (a0..a3, b0, b1: the PTX fragment registers).
template <typename T> __device__ __forceinline__ void mdm_mma(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                                              u32 b1);
template <> __device__ __forceinline__ void mdm_mma<bf16>(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                                          u32 b1) {
#if defined(PORTER_SM80)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}
template <> __device__ __forceinline__ void mdm_mma<f16>(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                                         u32 b1) {
#if defined(PORTER_SM80)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// Dense 16-bit weights (the activations' type): a stage is 64 k; in sub-block b (32 k) the
// thread's 16 bytes of a row are k 32b + 8q .. + 7, words (2s, 2s + 1) for k16 step s (0, 1):
// MMA k slots (2q, 2q + 1) ↔ physical 8q + 4s + (0, 1), (2q + 8, 2q + 9) ↔ 8q + 4s + (2, 3).
// Activations: 8 chunks a pair, chunk c of pair n at c ^ ((n & 1) << 2) (the weights' swizzle).
struct MdmDense {
    static constexpr u32 WB = 2u;
    static constexpr u32 BCH = 8u;
    static constexpr bool SCALED = false;
    static __device__ __forceinline__ u32 bsw(u32 c, u32 n) { return c ^ ((n & 1u) << 2); }
    static __device__ __forceinline__ void bfetch(const unsigned char* brow, u32 b, u32 g, u32 q, u32 (&bw)[8]) {
        const uint4 v = *reinterpret_cast<const uint4*>(brow + (bsw(4u * b + q, g) << 4));
        bw[0] = v.x;
        bw[1] = v.y;
        bw[2] = v.z;
        bw[3] = v.w;
    }
    template <typename T>
    static __device__ __forceinline__ void tile(float (&d)[4], const uint4& wa, const uint4& wb, const u32 (&bw)[8]) {
        mdm_mma<T>(d, wa.x, wb.x, wa.y, wb.y, bw[0], bw[1]);
        mdm_mma<T>(d, wa.z, wb.z, wa.w, wb.w, bw[2], bw[3]);
    }
};

// One block: slot blockIdx.y's 128 weight rows of block blockIdx.x against its pairs, 8 at a
// time. GU: rows 0..63 gate (w0) and 64..127 up (w1) of inter columns 64·x.., R = I rows an
// expert, K = H, act = x (pair p's row p / k), out = h [n, I]. Down: rows of w0 (128·x..),
// R = H, K = I, act = h (row p), out = o [n, H]. Weights: K · F::WB bytes a row; s / rs: the
// block scales and scale-row indices (F::SCALED; unused otherwise). 16-byte rows, 16-byte
// aligned (the host: K % 8 == 0 dense, K % 16 == 0 FP8).
template <typename T, typename F, bool GU>
__device__ __forceinline__ void mdm_impl(const T* __restrict__ act, const unsigned char* __restrict__ w0,
                                         const float* __restrict__ s0, const u32* __restrict__ rs0,
                                         const unsigned char* __restrict__ w1, const float* __restrict__ s1,
                                         const u32* __restrict__ rs1, const u32* __restrict__ sorted,
                                         const u32* __restrict__ seg, const u32* __restrict__ meta,
                                         T* __restrict__ out, u32 K, u32 R, u32 k) {
#if defined(PORTER_SM80)
    constexpr u32 KS = MDM_SB / F::WB;  // k a stage
    constexpr u32 STAGE = MDM_W_BYTES + 8u * F::BCH * 16u;
    extern __shared__ uint4 mdm_smem[];
    const u32 slot = blockIdx.y;
    if (slot >= __ldg(meta)) return;
    const u32 ex = __ldg(seg + 3 * slot), start = __ldg(seg + 3 * slot + 1), cnt = __ldg(seg + 3 * slot + 2);
    const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5, g = lane >> 2, q = lane & 3u;
    const u32 col0 = blockIdx.x * (GU ? MDM_ROWS / 2 : MDM_ROWS);
    const u32 kbytes = K * F::WB, nk = (kbytes + MDM_SB - 1) / MDM_SB;
    unsigned char* sm = reinterpret_cast<unsigned char*>(mdm_smem);

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
        wsrc[i] = (up ? w1 : w0) + ((u64)ex * R + (ok ? c : 0u)) * kbytes + 16u * wch;
    }
    // The warp's two m16 tiles (smem rows) and, scaled, the scale rows of its rows g, g + 8.
    const u32 mt0 = GU ? 16u * warp : 32u * warp, mt1 = GU ? 64u + 16u * warp : 32u * warp + 16u;
    const float* srow[2][2];
    if constexpr (F::SCALED) {
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const u32 r = (t ? mt1 : mt0) + g + 8u * h;
                const u32 c = min(GU ? col0 + (r & 63u) : col0 + r, R - 1u);
                const bool up = GU && r >= 64u;
                srow[t][h] = (up ? s1 : s0) + (u64)__ldg((up ? rs1 : rs0) + (u64)ex * R + c) * nk;
            }
    }
    // The activation chunk this thread copies: pair row bn = tid / BCH, chunk tid % BCH.
    const u32 bn = tid / F::BCH, bch = tid % F::BCH;

    for (u32 m0 = 0; m0 < cnt; m0 += 8u) {
        const u32 mb = min(8u, cnt - m0);
        const bool bok = bn < mb;
        const u32 bp = bok ? __ldg(sorted + start + m0 + bn) : 0u;
        const T* bsrc = act + (u64)(GU ? bp / k : bp) * K + 8u * bch;

        auto load_stage = [&](u32 kb) {
            unsigned char* st = sm + (kb % MDM_STAGES) * STAGE;
            const u32 kc = kb * MDM_SB + 16u * wch;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const u32 r = (tid >> 3) + 16u * i;
                const bool v = (wok >> i & 1u) && kc < kbytes;
                cp_async16(st + r * MDM_SB + ((wch ^ ((r & 1u) << 2)) << 4), v ? wsrc[i] + kb * MDM_SB : w0, v);
            }
            if (F::BCH == 16u || bn < 8u) {  // 8 pairs: 64 (dense) or 128 (FP8) chunks
                const u32 ka = kb * KS + 8u * bch;
                const bool v = bok && ka < K;
                cp_async16(st + MDM_W_BYTES + bn * F::BCH * 16u + (F::bsw(bch, bn) << 4), v ? bsrc + kb * KS : act, v);
            }
        };

        float acc[2][4];
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[t][i] = 0.0f;
#pragma unroll
        for (u32 s = 0; s < MDM_STAGES - 1; ++s) {
            if (s < nk) load_stage(s);
            cp_async_commit();
        }
        for (u32 kb = 0; kb < nk; ++kb) {
            float sc[2][2];
            if constexpr (F::SCALED) {
#pragma unroll
                for (int t = 0; t < 2; ++t)
#pragma unroll
                    for (int h = 0; h < 2; ++h) sc[t][h] = __ldg(srow[t][h] + kb);
            }
            cp_async_wait<MDM_STAGES - 2>();
            __syncthreads();
            if (kb + MDM_STAGES - 1 < nk) load_stage(kb + MDM_STAGES - 1);
            cp_async_commit();
            const unsigned char* st = sm + (kb % MDM_STAGES) * STAGE;
            float part[2][4];
            if constexpr (F::SCALED) {
#pragma unroll
                for (int t = 0; t < 2; ++t)
#pragma unroll
                    for (int i = 0; i < 4; ++i) part[t][i] = 0.0f;
            }
            float (&dst)[2][4] = F::SCALED ? part : acc;
#pragma unroll
            for (u32 b = 0; b < 2; ++b) {
                u32 bw[8];
                F::bfetch(st + MDM_W_BYTES + g * F::BCH * 16u, b, g, q, bw);
#pragma unroll
                for (int t = 0; t < 2; ++t) {
                    const u32 r0 = (t ? mt1 : mt0) + g, r1 = r0 + 8u;
                    const u32 ch = 4u * b + q;
                    const uint4 wa = *reinterpret_cast<const uint4*>(st + r0 * MDM_SB + ((ch ^ ((r0 & 1u) << 2)) << 4));
                    const uint4 wb = *reinterpret_cast<const uint4*>(st + r1 * MDM_SB + ((ch ^ ((r1 & 1u) << 2)) << 4));
                    F::template tile<T>(dst[t], wa, wb, bw);
                }
            }
            if constexpr (F::SCALED) {
#pragma unroll
                for (int t = 0; t < 2; ++t) {
                    acc[t][0] = fmaf(part[t][0], sc[t][0], acc[t][0]);
                    acc[t][1] = fmaf(part[t][1], sc[t][0], acc[t][1]);
                    acc[t][2] = fmaf(part[t][2], sc[t][1], acc[t][2]);
                    acc[t][3] = fmaf(part[t][3], sc[t][1], acc[t][3]);
                }
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

#ifndef PORTER_FP8_MODULE
// moe_dec_mma_gu_<T>: grid (ceil(I / 64), min(e, n)); moe_dec_mma_down_<T>: grid
// (ceil(H / 128), min(e, n)); MDM_THREADS threads, MDM_STAGES · (16 KiB + 1 KiB) of dynamic
// shared memory. gate, up: [e, I, H]; down: [e, H, I] (T).
#define MDM_ENTRY(T, NAME)                                                                                        \
    extern "C" __global__ void __launch_bounds__(MDM_THREADS, 3)                                                  \
        moe_dec_mma_gu_##NAME(const T* x, const T* gate, const T* up, const u32* sorted, const u32* seg,          \
                              const u32* meta, T* h, u32 H, u32 I, u32 k) { porter_pdl_enter();                                       \
        mdm_impl<T, MdmDense, true>(x, reinterpret_cast<const unsigned char*>(gate), nullptr, nullptr,           \
                                    reinterpret_cast<const unsigned char*>(up), nullptr, nullptr, sorted, seg,   \
                                    meta, h, H, I, k);                                                            \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(MDM_THREADS, 3)                                                  \
        moe_dec_mma_down_##NAME(const T* h, const T* down, const u32* sorted, const u32* seg, const u32* meta,    \
                                T* o, u32 H, u32 I) { porter_pdl_enter();                                                             \
        const unsigned char* d = reinterpret_cast<const unsigned char*>(down);                                    \
        mdm_impl<T, MdmDense, false>(h, d, nullptr, nullptr, d, nullptr, nullptr, sorted, seg, meta, o, I, H, 1u); \
    }
MDM_ENTRY(bf16, bf16)
MDM_ENTRY(f16, f16)
#endif

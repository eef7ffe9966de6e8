// MoE decode: the routed-expert GEMVs (few rows per expert), appended to moe.cu
// (its grouping align_core, moe_align and the combine's combine_at) by
// kernels/src/cuda/compile.rs. One set of templates over a weight *row reader*
// (DenseRow here, Fp8Row in fp8.cu, appended after this file), so the bf16 /
// f16 / f32 experts and the FP8 experts share every loop, item and order.
//
// Arithmetic (both forms, every weight type): each (pair, column) dot product
// is one warp's, lane-strided over 16-byte chunks (lane l takes chunks l, l+32,
// l+64, ... in that order, the elements of a chunk in order, f32 FMAs), then a
// butterfly warp_sum; whatever the unroll depth, rows per pass or item shape,
// the order per accumulator is the same, so v1 and v2 give the same bits, and
// a row's result never depends on the other rows (batch-invariant). h =
// round(silu(round(g)) · round(u)), o = round(h · downᵀ), out = combine_at.
// h is stored per pair [n, I] and o per pair [n, H], so the order of the pairs
// within an expert's segment never matters.
//
// Grouping: with `fused`, every block sorts the pairs by expert itself in
// dynamic shared memory (align_core: e + n + 3·min(e, n) u32), so that no
// separate alignment kernel runs; otherwise moe_align wrote sorted / seg / meta
// to global memory (pad 1) before.
//
// v1 (moe_dec_gu_*, moe_dec_down_*): two persistent launches, gate+up then
// down + combine; warps loop over items statically (item q, q + warps, ...).
// The down kernel combines: each warp, after writing o for its (slot,
// MOE_DOWN_NR columns) item, counts the item done on the column group's
// counter; the warp that completes a column group (all active slots) writes
// out for those columns and every row. The counters ctr [ceil(H /
// MOE_DOWN_NR)] are zeroed by block 0 of the gate+up kernel. That down kernel is the
// legacy one (PORTER_MOE_DOWN=legacy): by default v1's down is moe_shared.cu's streamed
// moe_dec_downs_* (a block per 8 columns of every expert, o in shared memory, no counters).
//
// v2 (moe_dec_v2_*): one persistent launch for gate+up, down and combine. Why
// (Qwen3-Next-80B at t = 1: 10 experts, 63 MB of bf16 weights, 15 µs at the
// H200's copy bandwidth; v1 took 36 µs): two launches each pay a launch gap, a
// grouping prologue and a ramp-up / tail; a static item split leaves warps
// with 1 or 2 items (5120 items on 3168 warps); each v1 down item ends in a
// fence + atomic chain with no load in flight; and nothing overlaps the
// gate+up -> down dependency. v2:
// - work items are handed out as tickets of `ch` consecutive items from one
//   counter (atomicAdd; two tickets for one atomic at the start): gate+up items
//   (slot, column) first, expert-major, then down items (slot, MOE_V2_DR
//   columns), so the load balances itself (the tail is a ticket). The host
//   takes ch = 2 (half the same-address atomics) only when there are many
//   items a warp: at t = 1 (7680 items, ~3.6 a warp) two tickets of two would
//   hand out nearly everything at the start, and the warps holding down items
//   would idle through the whole gate+up phase; with ch = 1 the warps that
//   finish their gate+up items early take the down items of the first experts;
// - a warp holds the next ticket while it works on one (the one after is
//   asked for when a ticket starts) and prefetches the rows of its next item
//   into L2 (prefetch.global.L2), so its memory pipe never drains between items;
// - a down item of slot s waits (acquire spin, __nanosleep) until all I
//   gate+up items of s have published h (fence + ready[s]++), its weights
//   already prefetched. No deadlock whatever the residency: a ticket is only
//   handed to a running warp, gate+up items never wait, and every gate+up
//   ticket precedes every down ticket;
// - the combine is v1's (last arriver per column group, combine_at);
// - the counters (ticket, blocks done, ready [min(e, n)], ctr [ceil(H /
//   MOE_V2_DR)]) live in a persistent zeroed buffer of the CudaKernels (`sync`)
//   that the last block to finish zeroes again for the next call (stream
//   order), so no memset and no second launch. `phases` (timing only) stops
//   after the grouping (0), gate+up (1), down (2); 3 is the whole call.

#define MOE_GEMV_WARPS 8 // warps per GEMV block
#define MOE_GEMV_MB 4    // routed rows per GEMV pass
#define MOE_DOWN_NR 4    // v1: down rows (hidden columns) per item
#define MOE_V2_DR 8      // v2: down rows (hidden columns) per item
#define MOE_V2_BLOCKS 2  // v2: resident blocks per SM the launch bounds ask for

// ---------------------------------------------------------------------------
// Vector helpers: 16-byte loads, unpacked to f32.
// ---------------------------------------------------------------------------

template <typename T> struct VecOf {
    static constexpr u32 N = 16 / sizeof(T);
};

template <typename T> __device__ __forceinline__ void unpack(const uint4& v, float* f);
template <> __device__ __forceinline__ void unpack<float>(const uint4& v, float* f) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
}
template <> __device__ __forceinline__ void unpack<bf16>(const uint4& v, float* f) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 t = __bfloat1622float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}
template <> __device__ __forceinline__ void unpack<f16>(const uint4& v, float* f) {
    const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 t = __half22float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

// E consecutive activations of type T from a 16-byte aligned address: through
// L2 only with CG (h, written earlier in the same kernel), else the read-only path.
template <typename T, u32 E, bool CG> __device__ __forceinline__ void load_act(const T* a, float* f) {
    constexpr u32 PER = VecOf<T>::N;
#pragma unroll
    for (u32 v = 0; v < E / PER; ++v) {
        const uint4* p = reinterpret_cast<const uint4*>(a) + v;
        unpack<T>(CG ? __ldcg(p) : __ldg(p), f + v * PER);
    }
}

// Starts moving the `nr` rows of `bytes` bytes at rows[0..nr) into L2
// (non-binding: 128-byte lines split over the lanes; nothing waits for it).
template <int NR>
__device__ __forceinline__ void prefetch_rows(const void* const (&rows)[NR], int nr, u32 bytes, u32 lane) {
    const u32 lines = (bytes + 127u) / 128u;
    for (u32 l = lane; l < (u32)nr * lines; l += 32u) {
        // The row by a select chain (an indexed array would live in local memory).
        const u32 r = l / lines;
        const void* row = rows[0];
#pragma unroll
        for (int i = 1; i < NR; ++i)
            if (r == (u32)i) row = rows[i];
        const char* p = static_cast<const char*>(row) + (l - r * lines) * 128u;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
    }
}

// ---------------------------------------------------------------------------
// Weight row readers. A row is read as 16-byte chunks of E weights (chunk c:
// weights E·c .. E·c + E − 1); `expand` turns a chunk into f32 values and
// `dot_acc(wf, af, c, acc)` adds the chunk's dot product with E activations to
// acc (dense: the weights themselves, one FMA chain; FP8: the unscaled e4m3
// values, a fresh 16-term chain times the chunk's block scale, fp8.cu), `at` one
// weight (the scalar tail). CHEAP: expanding costs less than re-reading the
// activations (a conversion; FP8's is a conversion of 16 bytes), which sets
// warp_dots' loop order.
// A matrix (`*Mat`) makes the reader of its row r of K weights.
// ---------------------------------------------------------------------------

template <typename T> struct DenseRow {
    static constexpr u32 E = VecOf<T>::N;
    static constexpr bool CHEAP = true;
    const T* p;
    __device__ __forceinline__ uint4 load(u32 c) const { return __ldg(reinterpret_cast<const uint4*>(p) + c); }
    __device__ __forceinline__ void expand(const uint4& v, u32, float* f) const { unpack<T>(v, f); }
    // dot_acc split for the in-flight down kernel (dir_downa_impl_pdl): the chunk's side value,
    // loaded with the chunk (none here), and the formula given it.
    __device__ __forceinline__ float side(u32) const { return 0.0f; }
    static __device__ __forceinline__ float dot_side(const float* wf, const float* af, float, float acc) {
#pragma unroll
        for (u32 i = 0; i < E; ++i) acc = fmaf(wf[i], af[i], acc);
        return acc;
    }
    __device__ __forceinline__ float dot_acc(const float* wf, const float* af, u32 c, float acc) const {
        return dot_side(wf, af, side(c), acc);
    }
    __device__ __forceinline__ float at(u32 i) const { return to_f(p[i]); }
    __device__ __forceinline__ const void* base() const { return p; }
};

// Stacked expert weights [e·rows, K] of T.
template <typename T> struct DenseMat {
    typedef DenseRow<T> Row;
    static constexpr u32 BYTES = sizeof(T);  // bytes per weight
    const T* w;
    __device__ __forceinline__ Row row(u64 r, u32 K) const { return Row{w + r * K}; }
};

// One warp: acc[m][r] = Σ_i w_r[i] · a[m][i] over i < K, for m < mb (f32,
// the order of the file header; every lane gets every sum). With `vec`, rows
// are 16-byte aligned and K % R::E == 0 (16-byte loads, U chunks of each row in
// flight per lane); otherwise scalar loads. CG: activations through L2 only.
template <typename T, typename R, int NR, int MB, int U, bool CG>
__device__ __forceinline__ void warp_dots(const R (&w)[NR], const T* (&a)[MB], int mb, u32 K, int vec, u32 lane,
                                          float (&acc)[MB][NR]) {
    constexpr u32 E = R::E;
#pragma unroll
    for (int m = 0; m < MB; ++m)
#pragma unroll
        for (int r = 0; r < NR; ++r) acc[m][r] = 0.0f;
    const u32 kv = vec ? K / E : 0u;
    for (u32 c0 = lane; c0 < kv; c0 += 32u * U) {
        uint4 wv[U][NR];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < NR; ++r) {
                const u32 c = c0 + 32u * u;
                wv[u][r] = c < kv ? w[r].load(c) : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const u32 c = c0 + 32u * u;
            if (c < kv) {
                if constexpr (R::CHEAP) {
                    // Each activation chunk once; the weight chunk expanded per row pass.
#pragma unroll
                    for (int m = 0; m < MB; ++m) {
                        if (m < mb) {
                            float af[E];
                            load_act<T, E, CG>(a[m] + E * c, af);
#pragma unroll
                            for (int r = 0; r < NR; ++r) {
                                float wf[E];
                                w[r].expand(wv[u][r], c, wf);
#pragma unroll
                                acc[m][r] = w[r].dot_acc(wf, af, c, acc[m][r]);
                            }
                        }
                    }
                } else {
                    // Each weight chunk expanded once; the activations re-read (L1) per row.
#pragma unroll
                    for (int r = 0; r < NR; ++r) {
                        float wf[E];
                        w[r].expand(wv[u][r], c, wf);
#pragma unroll
                        for (int m = 0; m < MB; ++m) {
                            if (m < mb) {
                                float af[E];
                                load_act<T, E, CG>(a[m] + E * c, af);
#pragma unroll
                                acc[m][r] = w[r].dot_acc(wf, af, c, acc[m][r]);
                            }
                        }
                    }
                }
            }
        }
    }
    for (u32 i = kv * E + lane; i < K; i += 32u) {
        float wf[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) wf[r] = w[r].at(i);
#pragma unroll
        for (int m = 0; m < MB; ++m) {
            if (m < mb) {
                const float av = CG ? ld_cg_f<T>(a[m] + i) : to_f(a[m][i]);
#pragma unroll
                for (int r = 0; r < NR; ++r) acc[m][r] = fmaf(wf[r], av, acc[m][r]);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < MB; ++m)
        if (m < mb)
#pragma unroll
            for (int r = 0; r < NR; ++r) acc[m][r] = warp_sum(acc[m][r]);
}

// The grouping of the pairs (see above): sorted / seg / nact, in shared memory
// (fused) or from global memory. Ends with a barrier when fused.
__device__ __forceinline__ void dec_lists(const u32* __restrict__ idx, u32 n, u32 e, int fused,
                                          const u32* __restrict__ g_sorted, const u32* __restrict__ g_seg,
                                          const u32* __restrict__ g_meta, u32* dsm, u32* sh, const u32*& sorted,
                                          const u32*& seg, u32& nact) {
    if (fused) {
        u32* cnt = dsm;
        u32* s_sorted = dsm + e;
        u32* s_seg = s_sorted + n;
        u32 total;
        align_core<false>(idx, n, e, 1u, n, 0u, cnt, sh, s_sorted, nullptr, s_seg, nact, total);
        __syncthreads();
        sorted = s_sorted;
        seg = s_seg;
    } else {
        sorted = g_sorted;
        seg = g_seg;
        nact = g_meta[0];
    }
}

// ---------------------------------------------------------------------------
// Items, shared by v1 and v2.
// ---------------------------------------------------------------------------

// gate+up and activation of item (slot s, column c of inter), one warp: the
// slot's rows in passes of MOE_GEMV_MB; h [n, I] per pair.
template <typename T, typename M, int U>
__device__ __forceinline__ void gu_item(const T* __restrict__ x, const M& gate, const M& up,
                                        const u32* __restrict__ sorted, const u32* __restrict__ seg, u32 s, u32 c,
                                        T* __restrict__ h, u32 H, u32 I, u32 k, int vec, u32 lane) {
    const u32 ex = seg[3 * s], start = seg[3 * s + 1], cnt = seg[3 * s + 2];
    const typename M::Row w[2] = {gate.row((u64)ex * I + c, H), up.row((u64)ex * I + c, H)};
    for (u32 m0 = 0; m0 < cnt; m0 += MOE_GEMV_MB) {
        const int mb = (int)min((u32)MOE_GEMV_MB, cnt - m0);
        const T* a[MOE_GEMV_MB];
#pragma unroll
        for (int m = 0; m < MOE_GEMV_MB; ++m) a[m] = x + (u64)(sorted[start + m0 + (m < mb ? m : 0)] / k) * H;
        float acc[MOE_GEMV_MB][2];
        warp_dots<T, typename M::Row, 2, MOE_GEMV_MB, U, false>(w, a, mb, H, vec, lane, acc);
        float g = 0.0f, u = 0.0f;
#pragma unroll
        for (int m = 0; m < MOE_GEMV_MB; ++m)
            if ((int)lane == m) {
                g = acc[m][0];
                u = acc[m][1];
            }
        if ((int)lane < mb) {
            const u32 p = sorted[start + m0 + lane];
            h[(u64)p * I + c] = from_f<T>(silu_f(round_to<T>(g)) * round_to<T>(u));
        }
    }
}

// The NR down rows of item (slot s, columns c0..c0+NR−1 of hidden): rows past
// H repeat row H − 1 (computed, never stored).
template <typename M, int NR>
__device__ __forceinline__ void down_rows(const M& down, u32 ex, u32 c0, u32 H, u32 I, typename M::Row (&w)[NR]) {
#pragma unroll
    for (int r = 0; r < NR; ++r) w[r] = down.row((u64)ex * H + min(c0 + r, H - 1), I);
}

// down of item (slot s, NR columns from c0), one warp: o[p · ostride + ocol + r] of
// pair p and column c0 + r, rounded to T (v1 / v2: o [n, H], ostride H, ocol c0; the
// streamed down kernel: its block's columns in shared memory). CG: h through L2 (written
// by this kernel).
template <typename T, typename M, int NR, int MB, int U, bool CG>
__device__ __forceinline__ void down_item(const T* __restrict__ h, const M& down, const u32* __restrict__ sorted,
                                          const u32* __restrict__ seg, u32 s, u32 c0, T* __restrict__ o, u32 ostride,
                                          u32 ocol, u32 H, u32 I, int vec, u32 lane) {
    static_assert(MB * NR <= 32, "a lane per (row, column) of a pass");
    const u32 ex = seg[3 * s], start = seg[3 * s + 1], cnt = seg[3 * s + 2];
    typename M::Row w[NR];
    down_rows<M, NR>(down, ex, c0, H, I, w);
    for (u32 m0 = 0; m0 < cnt; m0 += MB) {
        const int mb = (int)min((u32)MB, cnt - m0);
        const T* a[MB];
#pragma unroll
        for (int m = 0; m < MB; ++m) a[m] = h + (u64)sorted[start + m0 + (m < mb ? m : 0)] * I;
        float acc[MB][NR];
        warp_dots<T, typename M::Row, NR, MB, U, CG>(w, a, mb, I, vec, lane, acc);
        // lane = m · NR + r writes (row m, column c0 + r).
        const int lm = (int)lane / NR, lr = (int)lane % NR;
        float v = 0.0f;
#pragma unroll
        for (int m = 0; m < MB; ++m)
#pragma unroll
            for (int r = 0; r < NR; ++r)
                if (lm == m && lr == r) v = acc[m][r];
        if (lm < mb && c0 + lr < H) o[(u64)sorted[start + m0 + lm] * ostride + ocol + lr] = from_f<T>(v);
    }
}

// After a down item's o stores: counts column group cq done; the warp that
// completes it (all nact slots) writes out[r][c0..c0+NR) for every row.
template <typename T, int NR>
__device__ __forceinline__ void count_and_combine(u32* __restrict__ ctr, u32 cq, u32 nact, const T* __restrict__ o,
                                                  const u32* __restrict__ idx, const float* __restrict__ wt,
                                                  float* __restrict__ out, u32 c0, u32 H, u32 k, u32 e, u32 t,
                                                  u32 lane) {
    __threadfence();
    __syncwarp();
    u32 old = 0;
    if (lane == 0) old = atomicAdd(&ctr[cq], 1u);
    old = __shfl_sync(0xffffffffu, old, 0);
    if (old == nact - 1) {
        __threadfence();
        for (u32 q = lane; q < t * NR; q += 32u) {
            const u32 r = q / NR, c = c0 + q % NR;
            if (c < H) out[(u64)r * H + c] = combine_at<T>(o, idx, wt, r, c, H, k, e);
        }
    }
}

// No valid expert id at all: the output is zero (grid-stride).
__device__ __forceinline__ void zero_out(float* __restrict__ out, u64 total) {
    for (u64 q = (u64)blockIdx.x * blockDim.x + threadIdx.x; q < total; q += (u64)gridDim.x * blockDim.x)
        out[q] = 0.0f;
}

// ---------------------------------------------------------------------------
// v1: two persistent kernels, static items.
// ---------------------------------------------------------------------------

template <typename T, typename M, int U>
__device__ __forceinline__ void dec_gu_impl(const T* __restrict__ x, const M gate, const M up,
                                            const u32* __restrict__ idx, u32 n, u32 e, int fused,
                                            const u32* __restrict__ g_sorted, const u32* __restrict__ g_seg,
                                            const u32* __restrict__ g_meta, u32* __restrict__ ctr, u32 nctr,
                                            T* __restrict__ h, u32 H, u32 I, u32 k, int vec) {
    extern __shared__ u32 dsm[];
    __shared__ u32 sh[64];
    if (blockIdx.x == 0)
        for (u32 i = threadIdx.x; i < nctr; i += blockDim.x) ctr[i] = 0u;
    const u32* sorted;
    const u32* seg;
    u32 nact;
    dec_lists(idx, n, e, fused, g_sorted, g_seg, g_meta, dsm, sh, sorted, seg, nact);
    // vec bit 1 (with `fused`): block 0 also stores its lists where moe_align would have
    // (the g_* scratch, not read by this kernel), for the streamed down kernel, which then
    // starts on its weights without a grouping prologue of its own.
    if ((vec & 2) && fused && blockIdx.x == 0) {
        u32* gs = const_cast<u32*>(g_sorted);
        u32* gg = const_cast<u32*>(g_seg);
        for (u32 i = threadIdx.x; i < n; i += blockDim.x) gs[i] = sorted[i];
        for (u32 i = threadIdx.x; i < 3u * nact; i += blockDim.x) gg[i] = seg[i];
        if (threadIdx.x == 0) const_cast<u32*>(g_meta)[0] = nact;
    }
    const u32 lane = threadIdx.x & 31u, wpb = blockDim.x >> 5;
    const u64 items = (u64)nact * I, stride = (u64)gridDim.x * wpb;
    for (u64 q = (u64)blockIdx.x * wpb + (threadIdx.x >> 5); q < items; q += stride)
        gu_item<T, M, U>(x, gate, up, sorted, seg, (u32)(q / I), (u32)(q % I), h, H, I, k, vec & 1, lane);
}

template <typename T, typename M, int U>
__device__ __forceinline__ void dec_down_impl(const T* __restrict__ h, const M down, const u32* __restrict__ idx,
                                              const float* __restrict__ wt, u32 n, u32 e, int fused,
                                              const u32* __restrict__ g_sorted, const u32* __restrict__ g_seg,
                                              const u32* __restrict__ g_meta, u32* __restrict__ ctr,
                                              T* __restrict__ o, float* __restrict__ out, u32 H, u32 I, u32 k, u32 t,
                                              int vec) {
    extern __shared__ u32 dsm[];
    __shared__ u32 sh[64];
    const u32* sorted;
    const u32* seg;
    u32 nact;
    dec_lists(idx, n, e, fused, g_sorted, g_seg, g_meta, dsm, sh, sorted, seg, nact);
    const u32 lane = threadIdx.x & 31u, wpb = blockDim.x >> 5;
    if (nact == 0) {
        zero_out(out, (u64)t * H);
        return;
    }
    const u32 nq = (H + MOE_DOWN_NR - 1) / MOE_DOWN_NR;
    const u64 items = (u64)nact * nq, stride = (u64)gridDim.x * wpb;
    for (u64 q = (u64)blockIdx.x * wpb + (threadIdx.x >> 5); q < items; q += stride) {
        const u32 s = (u32)(q / nq), cq = (u32)(q % nq), c0 = cq * MOE_DOWN_NR;
        // h was written by the previous kernel: the read-only path is fine.
        down_item<T, M, MOE_DOWN_NR, MOE_GEMV_MB, U, false>(h, down, sorted, seg, s, c0, o, H, c0, H, I, vec, lane);
        count_and_combine<T, MOE_DOWN_NR>(ctr, cq, nact, o, idx, wt, out, c0, H, k, e, t, lane);
    }
}

// v1, streamed down + combine: moe_shared.cu (dec_downs_impl).

// ---------------------------------------------------------------------------
// v2: one persistent kernel, ticketed items (see the file header).
// ---------------------------------------------------------------------------

__device__ __forceinline__ u32 ld_acquire_u32(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// GU_U, DN_U: chunks in flight per lane and row (gate+up, down); DN_MB: routed
// rows per down pass (MOE_V2_DR columns × DN_MB rows of accumulators).
template <typename T, typename M, int GU_U, int DN_U, int DN_MB>
__device__ __forceinline__ void dec_v2_impl(const T* __restrict__ x, const M gate, const M up, const M down,
                                            const u32* __restrict__ idx, const float* __restrict__ wt, u32 n, u32 e,
                                            int fused, const u32* __restrict__ g_sorted,
                                            const u32* __restrict__ g_seg, const u32* __restrict__ g_meta,
                                            u32* __restrict__ sync, T* __restrict__ h, T* __restrict__ o,
                                            float* __restrict__ out, u32 H, u32 I, u32 k, u32 t, int vec_gu,
                                            int vec_d, u32 ch, u32 phases) {
    constexpr int DR = MOE_V2_DR;
    const u32 CH = ch;
    extern __shared__ u32 dsm[];
    __shared__ u32 sh[64];
    __shared__ u32 s_last;
    u32* ticket = sync;
    u32* done = sync + 1;
    u32* ready = sync + 2;
    u32* ctr = ready + min(e, n);
    const u32 lane = threadIdx.x & 31u;
    // The warp's first two tickets (2·CH items) in one atomic, asked for before the grouping
    // (its latency overlaps it).
    u32 r0 = 0;
    if (lane == 0) r0 = atomicAdd(ticket, 2u * CH);
    const u32* sorted;
    const u32* seg;
    u32 nact;
    dec_lists(idx, n, e, fused, g_sorted, g_seg, g_meta, dsm, sh, sorted, seg, nact);
    const u32 nq = (H + DR - 1) / DR;
    const u32 G = phases >= 1 ? nact * I : 0u;
    const u32 total = G + (phases >= 2 ? nact * nq : 0u);
    const bool comb = phases >= 3;
    if (nact == 0 && comb) zero_out(out, (u64)t * H);
    const u32 gu_bytes = H * M::BYTES, dn_bytes = I * M::BYTES;
    // Items [q, end) of the current ticket, then the next ticket's from nxt; the ticket after
    // that (nxt2) is asked for when a ticket starts and read when it ends.
    u32 q = __shfl_sync(0xffffffffu, r0, 0);
    u32 end = q + CH, nxt = q + CH, nxt2 = 0;
    while (q < total) {
        if (end - q == CH && nxt < total && lane == 0) nxt2 = atomicAdd(ticket, CH);
        // The next item's weight rows into L2 while this one computes.
        const u32 q1 = q + 1 < end ? q + 1 : nxt;
        if (q1 < total) {
            if (q1 < G) {
                const u32 s = q1 / I, c = q1 % I;
                const u64 r = (u64)seg[3 * s] * I + c;
                const void* const rows[2] = {gate.row(r, H).base(), up.row(r, H).base()};
                prefetch_rows<2>(rows, 2, gu_bytes, lane);
            } else {
                const u32 s = (q1 - G) / nq, c0 = (q1 - G) % nq * DR;
                typename M::Row w[DR];
                down_rows<M, DR>(down, seg[3 * s], c0, H, I, w);
                const void* rows[DR];
#pragma unroll
                for (int r = 0; r < DR; ++r) rows[r] = w[r].base();
                prefetch_rows<DR>(rows, (int)min((u32)DR, H - c0), dn_bytes, lane);
            }
        }
        if (q < G) {
            const u32 s = q / I;
            gu_item<T, M, GU_U>(x, gate, up, sorted, seg, s, q % I, h, H, I, k, vec_gu, lane);
            // Publish this column of h: every lane's stores, then the count.
            __threadfence();
            __syncwarp();
            if (lane == 0) atomicAdd(&ready[s], 1u);
        } else {
            const u32 s = (q - G) / nq, cq = (q - G) % nq, c0 = cq * DR;
            // All I columns of the slot's h: gate+up items are handed out before any down
            // item, only to running warps, and never wait, so this ends (in microseconds; a
            // wait of 2^24 sleeps, seconds, can only be a bug: trap, a launch error, not a hang).
            for (u32 spins = 0; ld_acquire_u32(ready + s) < I; ++spins) {
                if (spins == (1u << 24)) __trap();
                __nanosleep(128);
            }
            __syncwarp();
            down_item<T, M, DR, DN_MB, DN_U, true>(h, down, sorted, seg, s, c0, o, H, c0, H, I, vec_d, lane);
            if (comb) count_and_combine<T, DR>(ctr, cq, nact, o, idx, wt, out, c0, H, k, e, t, lane);
        }
        if (++q == end) {
            // On to the next ticket (past the end: nxt2 was not asked for, and the loop ends).
            q = nxt;
            end = nxt + CH;
            nxt = __shfl_sync(0xffffffffu, nxt2, 0);
        }
    }
    // The last block out zeroes the counters for the next call.
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        s_last = atomicAdd(done, 1u) == gridDim.x - 1 ? 1u : 0u;
    }
    __syncthreads();
    if (s_last) {
        __threadfence();
        for (u32 i = threadIdx.x; i < nact; i += blockDim.x) ready[i] = 0u;
        for (u32 i = threadIdx.x; i < nq; i += blockDim.x) ctr[i] = 0u;
        if (threadIdx.x == 0) {
            *ticket = 0u;
            *done = 0u;
        }
    }
}

// Entry points: moe_dec_gu_<T> / moe_dec_down_<T> (v1), moe_dec_v2_<T>; the direct form's
// moe_dir_gu_<T> / moe_dir_down_<T> are moe_direct.cu's.
#define MOE_DEC_ENTRY(T, NAME, GU_U, DN_U)                                                                        \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 3) moe_dec_gu_##NAME(                         \
        const T* x, const T* gate, const T* up, const u32* idx, u32 n, u32 e, int fused, const u32* g_sorted,     \
        const u32* g_seg, const u32* g_meta, u32* ctr, u32 nctr, T* h, u32 H, u32 I, u32 k, int vec) { porter_pdl_enter();            \
        dec_gu_impl<T, DenseMat<T>, 4>(x, DenseMat<T>{gate}, DenseMat<T>{up}, idx, n, e, fused, g_sorted, g_seg,  \
                                       g_meta, ctr, nctr, h, H, I, k, vec);                                       \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 3) moe_dec_down_##NAME(                       \
        const T* h, const T* down, const u32* idx, const float* wt, u32 n, u32 e, int fused, const u32* g_sorted, \
        const u32* g_seg, const u32* g_meta, u32* ctr, T* o, float* out, u32 H, u32 I, u32 k, u32 t, int vec) { porter_pdl_enter();   \
        dec_down_impl<T, DenseMat<T>, 2>(h, DenseMat<T>{down}, idx, wt, n, e, fused, g_sorted, g_seg, g_meta,     \
                                         ctr, o, out, H, I, k, t, vec);                                           \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, MOE_V2_BLOCKS) moe_dec_v2_##NAME(             \
        const T* x, const T* gate, const T* up, const T* down, const u32* idx, const float* wt, u32 n, u32 e,     \
        int fused, const u32* g_sorted, const u32* g_seg, const u32* g_meta, u32* sync, T* h, T* o, float* out,   \
        u32 H, u32 I, u32 k, u32 t, int vec_gu, int vec_d, u32 ch, u32 phases) { porter_pdl_enter();                                  \
        dec_v2_impl<T, DenseMat<T>, GU_U, DN_U, 2>(x, DenseMat<T>{gate}, DenseMat<T>{up}, DenseMat<T>{down}, idx, wt, n,   \
                                          e, fused, g_sorted, g_seg, g_meta, sync, h, o, out, H, I, k, t, vec_gu, \
                                          vec_d, ch, phases);                                                         \
    }

// v2 chunks in flight per lane and row (gate+up, down; see dec_v2_impl).
MOE_DEC_ENTRY(float, f32, 4, 1)
MOE_DEC_ENTRY(bf16, bf16, 4, 1)
MOE_DEC_ENTRY(f16, f16, 4, 1)

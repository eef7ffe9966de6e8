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
// loads are in flight with the routed ones.
//
// Entry points: moe_dec_downs_<T> / moe_dec_downs_fp8_<T> (streamed v1 down);
// moe_dir_gu_sh_<T>, moe_dir_down_sh_<T> (dense), moe_dir_gu_sh_fp8_<T>,
// moe_dir_down_sh_fp8_<T> (FP8). Arguments: those of moe_dir_gu_* / moe_dir_down_*, then
// gate+up: gu (f32), gu_stride, gu_col0, hs [t, Is], Is, t;
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

// ---------------------------------------------------------------------------
// Direct down + combine with every weight row of the block in flight at once
// (moe_dir_downa_*, PORTER_MOE_DOWN=async; the host takes it on sm_80+ when its shared
// memory fits, else the legacy direct down kernel). Why (80B at t = 1, H200): the legacy
// kernel (dir_down_impl) streamed 23 MB at ~1.5 TB/s: its warp (row r, column c) issues
// the loads of one zip group of 8 pairs (16 KB of 16-byte loads a lane could hold in
// registers), waits, reduces, then issues the next group (2 routed rows + the shared row),
// behind an idx load, the h staging (an L2 round trip) and a barrier; one wave of 256 blocks
// at 2 an SM, so every one of those serial latencies is the kernel's. The L2 prefetch of
// its rows (bit 2) was slower still (a second pass over 23 MB of addresses, docs/benchmarks.md
// "Session 9"). Here each lane cp.asyncs (16 bytes, L2 only, no register held) the chunks it
// will itself use, chunks l, l + 32, ... of every valid row of its warp (the k routed rows
// down[idx[r, j]][c], then the shared row down_s[c]) into the warp's own slice of dynamic
// shared memory, right after the block's cp.async of h [k, I] and h_s [Is] (no dependence
// on the ids: issued while the id load is in flight; the shared row even before it); one
// wait and one barrier, then the dot products read weights and h from shared memory.
// HBM sees every byte of the launch requested in its first microsecond (176 KB an SM at
// 2 blocks of 8 warps × 11 KB); nothing else waits. Registers: the ids (one a lane, by
// shuffle), the zip group's accumulators and U·G chunks of shared memory loads.
//
// Arithmetic: dir_down_impl's exactly. The same zip groups (warp_dots_zip over a reader
// whose chunk c comes from shared memory instead of __ldg: same chunks, same lane order,
// same FMAs, same butterfly), the same combine order and formula, the shared row as pair k
// of the last group (mode 1) or a dot product of its own (mode 2): the same bits.
//
// Shared memory (host: dir_downa_smem in moe_decode.rs): h [k·I] T, h_s [Is] T, then per
// warp k·ncr + ncs 16-byte chunks (ncr = I·BYTES / 16, ncs = Is·BYTES / 16); needs vec (16-byte
// rows of h, h_s and the weights) and k <= 32 (an id a lane).

// A weight row reader whose 16-byte chunk c lives at s[c] in shared memory (the rest of R:
// expand, dot_acc and the FP8 scales, from R).
template <typename R> struct SmemRow {
    static constexpr u32 E = R::E;
    static constexpr bool CHEAP = R::CHEAP;
    R r;
    const uint4* s;
    __device__ __forceinline__ uint4 load(u32 c) const { return s[c]; }
    __device__ __forceinline__ void expand(const uint4& v, u32 c, float* f) const { r.expand(v, c, f); }
    __device__ __forceinline__ float dot_acc(const float* wf, const float* af, u32 c, float acc) const {
        return r.dot_acc(wf, af, c, acc);
    }
    __device__ __forceinline__ float at(u32 i) const { return r.at(i); }
};

// cp.async of 16 bytes global -> shared (L2 only), its group commit and wait, with "memory"
// clobbers (moe.cu's cp_async16 has none: here nothing but these orders the shared memory
// reads of the gate+up ring against its copies). Below sm_80 / fallback: a plain copy.
__device__ __forceinline__ void cpa16(void* smem, const void* gmem) {
#if defined(PORTER_SM80)
    const u32 s = (u32)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
#else
    *reinterpret_cast<uint4*>(smem) = *reinterpret_cast<const uint4*>(gmem);
#endif
}
__device__ __forceinline__ void cpa_commit() {
#if defined(PORTER_SM80)
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void cpa_wait() {
#if defined(PORTER_SM80)
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// The 16-byte chunks lane, lane + 32, ... < nc of the row at src into dst (same index).
__device__ __forceinline__ void cp_row_lane(uint4* dst, const void* src, u32 nc, u32 lane) {
    const uint4* s = static_cast<const uint4*>(src);
    for (u32 q = lane; q < nc; q += 32u) cpa16(dst + q, s + q);
}

template <typename T, typename M, int U>
__device__ __forceinline__ void dir_downa_impl(const T* __restrict__ h, const M down, const u32* __restrict__ idx,
                                               const float* __restrict__ wt, u32 e, float* __restrict__ out, u32 H,
                                               u32 I, u32 k, const DirShared<T, M>& sh) {
    constexpr int G = MOE_DIR_KG;
    extern __shared__ uint4 dsm_a[];
    const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const u32 r = blockIdx.y, c = blockIdx.x * (blockDim.x >> 5) + warp;
    const bool col = c < H;  // warp-uniform
    const u32 ncr = I * M::BYTES / 16u, ncs = sh.mode ? sh.Is * M::BYTES / 16u : 0u;
    const u32 n16h = k * I * (u32)sizeof(T) / 16u, n16s = sh.mode ? sh.Is * (u32)sizeof(T) / 16u : 0u;
    uint4* sw = dsm_a + n16h + n16s + warp * (k * ncr + ncs);  // this warp's rows
    // Pair `lane`'s expert and weight (k <= 32), read back by shuffle, and the shared gate
    // logit: in flight during the copies below, none of them read from L2 after the wait.
    const u32 myex = lane < k ? __ldg(idx + (u64)r * k + lane) : e;
    const float mywt = lane < k ? __ldg(wt + (u64)r * k + lane) : 0.0f;
    const float glog = sh.mode ? sh.glog[(u64)r * sh.g_stride + sh.g_col] : 0.0f;
    if (col && sh.mode) cp_row_lane(sw + k * ncr, sh.down.row(c, sh.Is).base(), ncs, lane);
    {
        const uint4* hsrc = reinterpret_cast<const uint4*>(h + (u64)r * k * I);
        const uint4* ssrc = reinterpret_cast<const uint4*>(sh.hs + (u64)r * sh.Is);
        for (u32 i = threadIdx.x; i < n16h + n16s; i += blockDim.x)
            cpa16(dsm_a + i, i < n16h ? hsrc + i : ssrc + (i - n16h));
    }
    if (col)
        for (u32 j = 0; j < k; ++j) {
            const u32 ex = __shfl_sync(0xffffffffu, myex, j);
            if (ex < e) cp_row_lane(sw + j * ncr, down.row((u64)ex * H + c, I).base(), ncr, lane);
        }
    cpa_commit();
    cpa_wait<0>();
    __syncthreads();
    if (!col) return;
    typedef SmemRow<typename M::Row> SR;
    const T* hr = reinterpret_cast<const T*>(dsm_a);
    const T* hsr = reinterpret_cast<const T*>(dsm_a + n16h);
    float total = 0.0f, sdot = 0.0f;
    // dir_down_impl's loop: the pairs, and with mode 1 the shared row as pair k.
    const u32 kk = k + (sh.mode == 1 ? 1u : 0u);
    for (u32 j0 = 0; j0 < kk; j0 += G) {
        SR w[G];
        const T* a[G];
        u32 live = 0u;
#pragma unroll
        for (int g = 0; g < G; ++g) {
            const u32 j = j0 + g;
            if (j == k && sh.mode == 1) {
                live |= 1u << g;
                w[g] = SR{sh.down.row(c, I), sw + k * ncr};
                a[g] = hsr;
            } else {
                const u32 ex = __shfl_sync(0xffffffffu, myex, j & 31u);
                const bool ok = j < k && ex < e;
                live |= (ok ? 1u : 0u) << g;
                w[g] = SR{down.row((u64)(ok ? ex : 0u) * H + c, I), sw + (ok ? j : 0u) * ncr};
                a[g] = hr + (u64)(ok ? j : 0u) * I;
            }
        }
        float acc[G];
        warp_dots_zip<T, SR, G, U>(w, a, live, I, 1, lane, acc);
#pragma unroll
        for (int g = 0; g < G; ++g) {
            if (sh.mode == 1 && j0 + g == k) sdot = acc[g];
            else if (live >> g & 1u) {
                const float wj = __shfl_sync(0xffffffffu, mywt, (j0 + g) & 31u);
                total = __fadd_rn(total, __fmul_rn(round_to<T>(acc[g]), wj));
            }
        }
    }
    if (sh.mode == 2) {
        const SR ws[1] = {SR{sh.down.row(c, sh.Is), sw + k * ncr}};
        const T* as[1] = {hsr};
        float acc[1];
        warp_dots_zip<T, SR, 1, U>(ws, as, 1u, sh.Is, 1, lane, acc);
        sdot = acc[0];
    }
    if (sh.mode) total += sigmoid_f(round_to<T>(glog)) * round_to<T>(sdot);
    if (lane == 0) out[(u64)r * H + c] = total;
}

// ---------------------------------------------------------------------------
// Direct gate+up with a cp.async ring (moe_dir_gua_*, PORTER_MOE_GU=async; the host takes it
// on sm_80+ with 16-byte rows when its shared memory fits, else moe_dir_gu_*). Why (80B at
// t = 1, H200): moe_dir_gu_* read 42 MB at ~2.6 TB/s: a warp per item (pair p, column c;
// 5120 items of 8 KB), 640 blocks at 3 an SM, so 1.6 waves: every block of the second wave
// pays the id load and its first weight latency again, and the last blocks run alone. Here a
// persistent grid (one wave) of warps each streams items q, q + W, ... (W warps in all)
// through a two-stage ring in its own slice of shared memory: the gate and up rows of item
// q + 2W are cp.async'd (16 bytes, L2 only, lane l the chunks l, l + 32, ... it will use
// itself: no barrier) as soon as item q's dots are done, so every warp has one to two items
// (8 to 16 KB) in flight all the time, and no register holds a load.
// Arithmetic: dir_gu_impl's (warp_dots with one row of x and the rows gate, up: per
// accumulator the chunks lane, lane + 32, ... in order, the same FMAs and butterfly; h =
// round(silu(round(g)) · round(u))): the same bits. Blocks from `nblk` on compute h_s as
// dir_gu_impl's blocks past the routed items do.
// Shared memory: per warp 2 stages × (gate, up) × nc 16-byte chunks (nc = H · BYTES / 16).
#define MOE_GUA_WARPS 4  // warps per block (3 blocks an SM at the 80B shapes: 64 KB each)

template <typename T, typename M>
__device__ __forceinline__ void dir_gua_impl(const T* __restrict__ x, const M gate, const M up,
                                             const u32* __restrict__ idx, u32 n, u32 e, T* __restrict__ h, u32 H,
                                             u32 I, u32 k, u32 nblk, const DirShared<T, M>& sh) {
    extern __shared__ uint4 dsm_g[];
    const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, wpb = blockDim.x >> 5;
    if (blockIdx.x >= nblk) {
        const u64 q = (u64)(blockIdx.x - nblk) * blockDim.x + threadIdx.x;
        if (q < (u64)sh.t * sh.Is) {
            const u64 r = q / sh.Is, c = q % sh.Is;
            const float* row = sh.gu + r * sh.gu_stride + sh.gu_col0;
            sh.hs[q] = from_f<T>(silu_f(round_to<T>(row[c])) * round_to<T>(row[sh.Is + c]));
        }
        return;
    }
    const u32 nc = H * M::BYTES / 16u;
    uint4* ring = dsm_g + (u64)warp * 4u * nc;  // [stage][gate, up][nc]
    const u64 items = (u64)n * I, W = (u64)nblk * wpb;
    // Starts item qq's two rows into stage st (nothing past the items or for an invalid id);
    // returns its expert (e when there is nothing to compute).
    auto issue = [&](u64 qq, u32 st) -> u32 {
        u32 ok = e;
        if (qq < items) {
            const u32 p = (u32)(qq / I), c = (u32)(qq % I);
            const u32 ex = __ldg(idx + p);
            if (ex < e) {
                ok = ex;
                const u64 r = (u64)ex * I + c;
                cp_row_lane(ring + (2u * st) * nc, gate.row(r, H).base(), nc, lane);
                cp_row_lane(ring + (2u * st + 1u) * nc, up.row(r, H).base(), nc, lane);
            }
        }
        cpa_commit();
        return ok;
    };
    u64 q = (u64)blockIdx.x * wpb + warp;
    u32 ex0 = issue(q, 0u), ex1 = issue(q + W, 1u);
    for (u32 st = 0; q < items; q += W, st ^= 1u) {
        cpa_wait<1>();  // item q's group (the next one may still be in flight)
        const u32 ex = st ? ex1 : ex0;
        if (ex < e) {
            const u32 p = (u32)(q / I), c = (u32)(q % I);
            const u64 r = (u64)ex * I + c;
            const SmemRow<typename M::Row> w[2] = {{gate.row(r, H), ring + (2u * st) * nc},
                                                   {up.row(r, H), ring + (2u * st + 1u) * nc}};
            const T* a[1] = {x + (u64)(p / k) * H};
            float acc[1][2];
            warp_dots<T, SmemRow<typename M::Row>, 2, 1, 4, false>(w, a, 1, H, 1, lane, acc);
            if (lane == 0) h[(u64)p * I + c] = from_f<T>(silu_f(round_to<T>(acc[0][0])) * round_to<T>(acc[0][1]));
        }
        // Stage st is free again (each lane read only its own chunks): item q + 2W into it.
        const u32 nex = issue(q + 2u * W, st);
        if (st) ex1 = nex;
        else ex0 = nex;
    }
    cpa_wait<0>();  // no copy may land after the block has gone

}

#define MOE_SH_GU_ARGS(T) const float *sgu, u32 gu_stride, u32 gu_col0, T *hs, u32 Is, u32 t
#define MOE_SH_DOWN_ARGS(T) const T *hs, const float *glog, u32 g_stride, u32 g_col, u32 Is, int mode, int svec
#define MOE_SH_GU(T, M) (DirShared<T, M>{sgu, gu_stride, gu_col0, nullptr, 0u, 0u, M{}, hs, Is, t, 0, 0})
#define MOE_SH_DOWN(T, M, D) (DirShared<T, M>{nullptr, 0u, 0u, glog, g_stride, g_col, D, const_cast<T*>(hs), Is, 0u, mode, svec})

#ifndef PORTER_FP8_MODULE

#define MOE_DS_ENTRY(T, NAME)                                                                                        \
    extern "C" __global__ void __launch_bounds__(MOE_DS_WARPS * 32, 2) moe_dec_downs_##NAME(                          \
        const T* h, const T* down, const u32* idx, const float* wt, u32 e, const u32* g_sorted, const u32* g_seg,     \
        const u32* g_meta, float* out, u32 H, u32 I, u32 k, u32 t, int vec) {                                       \
        dec_downs_impl<T, DenseMat<T>, 2, 2>(h, DenseMat<T>{down}, idx, wt, e, g_sorted, g_seg, g_meta, out, H, I, k, \
                                             t, vec);                                                                  \
    }

MOE_DS_ENTRY(float, f32)
MOE_DS_ENTRY(bf16, bf16)
MOE_DS_ENTRY(f16, f16)

#define MOE_SH_ENTRY(T, NAME, DIR_U)                                                                                        \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 3) moe_dir_gu_sh_##NAME(                        \
        const T* x, const T* gate, const T* up, const u32* idx, u32 n, u32 e, T* h, u32 H, u32 I, u32 k, int vec,  \
        MOE_SH_GU_ARGS(T)) {                                                                                            \
        dir_gu_impl<T, DenseMat<T>, 4>(x, DenseMat<T>{gate}, DenseMat<T>{up}, idx, n, e, h, H, I, k, vec,           \
                                       MOE_SH_GU(T, DenseMat<T>));                                                     \
    }                                                                                                                \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 2) moe_dir_down_sh_##NAME(                      \
        const T* h, const T* down, const u32* idx, const float* wt, u32 e, float* out, u32 H, u32 I, u32 k, int vec, \
        int staged, const T* sdown, MOE_SH_DOWN_ARGS(T)) {                                                              \
        dir_down_impl<T, DenseMat<T>, DIR_U>(h, DenseMat<T>{down}, idx, wt, e, out, H, I, k, vec, staged,           \
                                         MOE_SH_DOWN(T, DenseMat<T>, DenseMat<T>{sdown}));                             \
    }

// The async direct down kernels (dir_downa_impl), without and with the shared expert (one chunk
// a lane and row at a time: the loads come from shared memory; two spilled); the
// arguments of moe_dir_down_* / moe_dir_down_sh_* (vec must be 1; staged is ignored).
#define MOE_DA_ENTRY(T, NAME, DIR_U)                                                                                   \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 2) moe_dir_downa_##NAME(                        \
        const T* h, const T* down, const u32* idx, const float* wt, u32 e, float* out, u32 H, u32 I, u32 k, int vec, \
        int staged) {                                                                                                  \
        DirShared<T, DenseMat<T>> none{};                                                                              \
        dir_downa_impl<T, DenseMat<T>, DIR_U>(h, DenseMat<T>{down}, idx, wt, e, out, H, I, k, none);                  \
    }                                                                                                                \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 2) moe_dir_downa_sh_##NAME(                     \
        const T* h, const T* down, const u32* idx, const float* wt, u32 e, float* out, u32 H, u32 I, u32 k, int vec, \
        int staged, const T* sdown, MOE_SH_DOWN_ARGS(T)) {                                                              \
        dir_downa_impl<T, DenseMat<T>, DIR_U>(h, DenseMat<T>{down}, idx, wt, e, out, H, I, k,                         \
                                              MOE_SH_DOWN(T, DenseMat<T>, DenseMat<T>{sdown}));                        \
    }
#define MOE_GUA_ENTRY(T, NAME)                                                                                       \
    extern "C" __global__ void __launch_bounds__(MOE_GUA_WARPS * 32, 3) moe_dir_gua_##NAME(                           \
        const T* x, const T* gate, const T* up, const u32* idx, u32 n, u32 e, T* h, u32 H, u32 I, u32 k, u32 nblk) {  \
        DirShared<T, DenseMat<T>> none{};                                                                              \
        dir_gua_impl<T, DenseMat<T>>(x, DenseMat<T>{gate}, DenseMat<T>{up}, idx, n, e, h, H, I, k, nblk, none);       \
    }                                                                                                                \
    extern "C" __global__ void __launch_bounds__(MOE_GUA_WARPS * 32, 3) moe_dir_gua_sh_##NAME(                        \
        const T* x, const T* gate, const T* up, const u32* idx, u32 n, u32 e, T* h, u32 H, u32 I, u32 k, u32 nblk,    \
        MOE_SH_GU_ARGS(T)) {                                                                                            \
        dir_gua_impl<T, DenseMat<T>>(x, DenseMat<T>{gate}, DenseMat<T>{up}, idx, n, e, h, H, I, k, nblk,               \
                                     MOE_SH_GU(T, DenseMat<T>));                                                       \
    }
MOE_GUA_ENTRY(float, f32)
MOE_GUA_ENTRY(bf16, bf16)
MOE_GUA_ENTRY(f16, f16)
MOE_DA_ENTRY(float, f32, 1)
MOE_DA_ENTRY(bf16, bf16, 1)
MOE_DA_ENTRY(f16, f16, 1)
// Down chunks in flight per lane and row (as moe_dir_down_*).
MOE_SH_ENTRY(float, f32, 1)
MOE_SH_ENTRY(bf16, bf16, 2)
MOE_SH_ENTRY(f16, f16, 2)

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

// The streamed v1 down kernel (moe_decode.cu's dec_downs_impl) with FP8 experts: fp8.cu's
// entry points are fp8.cu's, this one is appended here, after Fp8Mat.
#define MOE_DS_FP8_ENTRY(T, NAME)                                                                                    \
    extern "C" __global__ void __launch_bounds__(MOE_DS_WARPS * 32, 2) moe_dec_downs_fp8_##NAME(                      \
        const T* h, const unsigned char* down, const float* ds, const u32* drs, const u32* idx, const float* wt,     \
        u32 e, const u32* g_sorted, const u32* g_seg, const u32* g_meta, float* out, u32 H, u32 I, u32 k, u32 t,     \
        int vec) {                                                                                                     \
        dec_downs_impl<T, Fp8Mat<T>, 1, 1>(h, FP8_MAT(T, down, ds, drs, I), idx, wt, e, g_sorted, g_seg, g_meta, out, H, \
                                        I, k, t, vec);                                                                 \
    }

MOE_DS_FP8_ENTRY(float, f32)
MOE_DS_FP8_ENTRY(bf16, bf16)
MOE_DS_FP8_ENTRY(f16, f16)

#define MOE_DA_FP8_ENTRY(T, NAME)                                                                                    \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 2) moe_dir_downa_fp8_##NAME(                    \
        const T* h, const unsigned char* down, const float* ds, const u32* drs, const u32* idx, const float* wt,     \
        u32 e, float* out, u32 H, u32 I, u32 k, int vec, int staged) {                                                \
        DirShared<T, Fp8Mat<T>> none{};                                                                                \
        dir_downa_impl<T, Fp8Mat<T>, 1>(h, FP8_MAT(T, down, ds, drs, I), idx, wt, e, out, H, I, k, none);             \
    }                                                                                                                \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 2) moe_dir_downa_sh_fp8_##NAME(                 \
        const T* h, const unsigned char* down, const float* ds, const u32* drs, const u32* idx, const float* wt,     \
        u32 e, float* out, u32 H, u32 I, u32 k, int vec, int staged, const unsigned char* sdown, const float* sds,   \
        const u32* sdrs, MOE_SH_DOWN_ARGS(T)) {                                                                         \
        dir_downa_impl<T, Fp8Mat<T>, 1>(h, FP8_MAT(T, down, ds, drs, I), idx, wt, e, out, H, I, k,                    \
                                        MOE_SH_DOWN(T, Fp8Mat<T>, FP8_MAT(T, sdown, sds, sdrs, Is)));                  \
    }
#define MOE_GUA_FP8_ENTRY(T, NAME)                                                                                   \
    extern "C" __global__ void __launch_bounds__(MOE_GUA_WARPS * 32, 3) moe_dir_gua_fp8_##NAME(                       \
        const T* x, const unsigned char* gate, const float* gs, const u32* grs, const unsigned char* up,             \
        const float* us, const u32* urs, const u32* idx, u32 n, u32 e, T* h, u32 H, u32 I, u32 k, u32 nblk) {        \
        DirShared<T, Fp8Mat<T>> none{};                                                                                \
        dir_gua_impl<T, Fp8Mat<T>>(x, FP8_MAT(T, gate, gs, grs, H), FP8_MAT(T, up, us, urs, H), idx, n, e, h, H, I,   \
                                   k, nblk, none);                                                                     \
    }                                                                                                                \
    extern "C" __global__ void __launch_bounds__(MOE_GUA_WARPS * 32, 3) moe_dir_gua_sh_fp8_##NAME(                    \
        const T* x, const unsigned char* gate, const float* gs, const u32* grs, const unsigned char* up,             \
        const float* us, const u32* urs, const u32* idx, u32 n, u32 e, T* h, u32 H, u32 I, u32 k, u32 nblk,          \
        MOE_SH_GU_ARGS(T)) {                                                                                            \
        dir_gua_impl<T, Fp8Mat<T>>(x, FP8_MAT(T, gate, gs, grs, H), FP8_MAT(T, up, us, urs, H), idx, n, e, h, H, I,   \
                                   k, nblk, MOE_SH_GU(T, Fp8Mat<T>));                                                  \
    }
MOE_GUA_FP8_ENTRY(float, f32)
MOE_GUA_FP8_ENTRY(bf16, bf16)
MOE_GUA_FP8_ENTRY(f16, f16)
MOE_DA_FP8_ENTRY(float, f32)
MOE_DA_FP8_ENTRY(bf16, bf16)
MOE_DA_FP8_ENTRY(f16, f16)
MOE_SH_FP8_ENTRY(float, f32)
MOE_SH_FP8_ENTRY(bf16, bf16)
MOE_SH_FP8_ENTRY(f16, f16)

#endif

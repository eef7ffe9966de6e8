// MoE decode, direct form: appended after moe_decode.cu (its vector helpers, row readers and
// warp_dots) by kernels/src/cuda/compile.rs, in the MoE module and in the FP8 module (fp8.cu and
// moe_shared.cu use DirShared, dir_gu_impl and dir_down_impl_pdl with their own row readers).

// ---------------------------------------------------------------------------
// Direct form (few pairs, the default up to DIRECT_MAX_PAIRS on the host): no
// grouping at all. Why: at t = 1 the grouping prologue of each v1 kernel
// (counting sort over e experts in shared memory, five barriers, the idx load in
// front) is ~5 µs in which no weight load is in flight, a quarter of each
// kernel. With a handful of pairs there is nothing to group: a pair p = r·k + j
// is its own slot, expert idx[p]. Two pairs of different rows on one expert read
// its rows twice (from L2 when the warps run together); at t·k ≪ e that is rare.
// - gate+up (moe_dir_gu_*): one warp per item (pair p, column c), item q = p·I + c
//   (consecutive warps: consecutive rows of one expert), h[p][c] as gu_item.
// - down + combine (moe_dir_down_*): one warp per item (row r, hidden column c),
//   a block per (8 columns, row) with the row's k rows of h staged in shared
//   memory when they fit: the k down rows down[idx[r, j]][c] against h[r·k + j]
//   in groups of MOE_DIR_KG pairs (all their loads in flight at once), then out[r][c] =
//   Σ_j round(o_j) · w[r, j] in j order: combine_at's terms and order, so no o
//   buffer, no counters and no fence. Invalid ids are skipped (no loads).
// Every dot product is warp_dots' (same lane-strided chunk order, same FMAs,
// same butterfly), so the direct form gives v1's bits.
// ---------------------------------------------------------------------------

#define MOE_DIR_KG 8 // down: pairs of a row whose loads are in flight together

// acc[g] = Σ_i w_g[i] · a_g[i] over i < K for the live g < G (bit g of `live`), one
// warp: the same per-accumulator order as warp_dots (every lane gets every sum).
template <typename T, typename R, int G, int U>
__device__ __forceinline__ void warp_dots_zip(const R (&w)[G], const T* (&a)[G], u32 live, u32 K, int vec, u32 lane,
                                              float (&acc)[G]) {
    constexpr u32 E = R::E;
#pragma unroll
    for (int g = 0; g < G; ++g) acc[g] = 0.0f;
    const u32 kv = vec ? K / E : 0u;
    for (u32 c0 = lane; c0 < kv; c0 += 32u * U) {
        uint4 wv[U][G];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int g = 0; g < G; ++g) {
                const u32 c = c0 + 32u * u;
                wv[u][g] = c < kv && (live >> g & 1u) ? w[g].load(c) : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const u32 c = c0 + 32u * u;
            if (c < kv) {
#pragma unroll
                for (int g = 0; g < G; ++g) {
                    if (live >> g & 1u) {
                        float wf[E], af[E];
                        w[g].expand(wv[u][g], c, wf);
                        // a[g] may point to shared memory: a generic 16-byte load.
                        const uint4* ap = reinterpret_cast<const uint4*>(a[g] + E * c);
#pragma unroll
                        for (u32 v = 0; v < E / VecOf<T>::N; ++v) unpack<T>(ap[v], af + v * VecOf<T>::N);
                        acc[g] = w[g].dot_acc(wf, af, c, acc[g]);
                    }
                }
            }
        }
    }
    for (u32 i = kv * E + lane; i < K; i += 32u)
#pragma unroll
        for (int g = 0; g < G; ++g)
            if (live >> g & 1u) acc[g] = fmaf(w[g].at(i), to_f(a[g][i]), acc[g]);
#pragma unroll
    for (int g = 0; g < G; ++g)
        if (live >> g & 1u) acc[g] = warp_sum(acc[g]);
}

// The shared expert of the direct form (moe_shared.cu's entry points; none in moe_dir_*):
// gate+up: h_s [t, Is] (T) = round(silu(round(g)) · round(u)) from the f32 columns
//   gu[r·gu_stride + gu_col0 + c] (g) and [.. + Is + c] (u) — swiglu_f32in's formula;
// down: out[r][c] += σ(round(g_r)) · round(down_s[c] · h_s[r]), g_r = glog[r·g_stride + g_col]
//   — shared_expert_add_f32g's formula, after the routed sum as there. Only the order of the
//   shared down dot product (warp_dots') differs from the unfused GEMV.
template <typename T, typename M> struct DirShared {
    const float* gu;
    u32 gu_stride, gu_col0;
    const float* glog;
    u32 g_stride, g_col;
    M down;  // [H, Is]
    T* hs;   // [t, Is]
    u32 Is, t;
    // Down: 0 none; 1 the shared row is slot k of the routed zip groups (Is = I, same
    // vec); 2 a dot product of its own after them. vec: 16-byte loads of its rows.
    int mode, vec;
    // Gate+up with gu_w: g and u are the gate+up kernel's own dot products of x's rows with
    // the weight rows gum[c] and gum[Is + c] ([2·Is, H], the shared expert's [gate; up]; the
    // FP8 checkpoints hold it apart from the bf16 router rows, so no input GEMM computes it),
    // instead of the f32 columns gu. gu_vec: 16-byte loads of its rows (and of x).
    M gum;
    int gu_w, gu_vec;
};

// The direct down kernel's L2 prefetch (staged bit 2): the 128-byte lines of warp
// (row, column c)'s rows, routed pair j's down[idx_r[j]][c] (valid ids only) and with a
// shared expert its row down_s[c], lane-strided over (row, line).
// DEMOTE: instead, give those lines back their normal L2 eviction priority (applypriority),
// after the down-L2 form's gate+up kernel asked them in with evict_last (dir_down_prefetch).
// `routed` / `shared`: which of the two (the routed rows read the expert ids; the fused
// router's down kernel asks for them only after its PDL wait).
template <typename T, typename M, bool DEMOTE = false>
__device__ __forceinline__ void dir_prefetch_rows(const M& down, const u32* __restrict__ idx_r, u32 e, u32 H, u32 I,
                                                  u32 k, u32 c, const DirShared<T, M>& sh, u32 lane,
                                                  bool routed = true, bool shared = true) {
    const u32 nl = (I * M::BYTES + 127u) / 128u;
    for (u32 q = lane; routed && q < k * nl; q += 32u) {
        const u32 j = q / nl;
        const u32 ex = __ldg(idx_r + j);
        if (ex < e) {
            const char* p = static_cast<const char*>(down.row((u64)ex * H + c, I).base()) + (q - j * nl) * 128u;
            if (DEMOTE) {
#if __CUDA_ARCH__ >= 800  // applypriority: sm_80+ (nothing to undo below, see dir_down_prefetch)
                asm volatile("applypriority.global.L2::evict_normal [%0], 128;" ::"l"(p) : "memory");
#endif
            } else {
                asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
            }
        }
    }
    if (DEMOTE) return;  // the shared row was never asked in with evict_last
    if (shared && sh.mode) {
        const u32 ns = (sh.Is * M::BYTES + 127u) / 128u;
        const char* row = static_cast<const char*>(sh.down.row(c, sh.Is).base());
        for (u32 l = lane; l < ns; l += 32u) asm volatile("prefetch.global.L2 [%0];" ::"l"(row + l * 128u));
    }
}

// The down-L2 form (MoeGemv::DirectL2): gate+up item (pair p, column c) of I asks its share of
// expert ex's down weights (`dpf` + ex·dbytes, dbytes contiguous bytes: the expert's [H, I]
// block of e4m3 or T) into L2 with evict_last priority: 128-byte lines c·32 + lane + 32·I·j, so
// the I items of a pair cover the block once (t = 1, 80B bf16: 2 MiB an expert, one line a
// lane). Why: the direct form's down launch streamed its 21 MB (bf16, t = 1) from HBM in one
// wave after the gate+up launch had ended, the bandwidth idle at its ramp and tail; asked for
// here, those bytes share the gate+up launch's HBM stream (more bytes in flight per SM) and the
// down launch reads them from L2. evict_last keeps them from being pushed out by the 42 MB of
// gate / up rows streamed meanwhile; the down kernel (staged bit 3) sets them back to normal.
// Non-binding (no value is read), so the arithmetic and bits are the direct form's.
__device__ __forceinline__ void dir_down_prefetch(const unsigned char* dpf, u64 dbytes, u32 ex, u32 c, u32 I,
                                                  u32 lane) {
    const unsigned char* blk = dpf + (u64)ex * dbytes;
    const u64 nl = (dbytes + 127u) / 128u;
    for (u64 l = (u64)c * 32u + lane; l < nl; l += (u64)I * 32u)
#if __CUDA_ARCH__ >= 800  // eviction priorities: sm_80+; a plain prefetch below
        asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(blk + l * 128u));
#else
        asm volatile("prefetch.global.L2 [%0];" ::"l"(blk + l * 128u));
#endif
}

// The router fused into the direct gate+up kernel (PORTER_MOE_ROUTER=fused; kernels/src/cuda/
// moe_route.rs). Why: at batch-1 decode the separate router launch (moe_router_warp_f32, one
// warp, 6.3 µs a call on the H200 at e = 512, k = 10) is pure latency between the MoE input
// GEMV and this kernel. With flags bit 0 each block of routed items runs router_warp_row
// (router_sel.cu: the separate router's code, so the same ids and weights bit for bit) for
// the rows its items need, one warp a row, after its PDL wait (the logits are the previous
// launch's output), into shared memory; the block holding a row's first item (pair r·k,
// column 0) also writes the row's ids to idx and weights to wt for the down kernel (the next
// launch, which reads them after its own wait). Flags bit 1: renorm (norm_topk_prob).
struct DirRoute {
    const float* logits;  // f32 [t, stride]: the router logits, its first e columns
    u32 stride;
    int flags;
    float* wt;  // [t, k]
};

// `dpf`, `dbytes`: the down prefetch of the down-L2 form (dir_down_prefetch), for the pairs
// p < npf (0: none; the host bounds npf · dbytes by part of the L2). `rt`: the fused router
// (flags 0: idx holds the ids, from the separate router).
template <typename T, typename M, int U>
__device__ __forceinline__ void dir_gu_impl(const T* __restrict__ x, const M gate, const M up, u32* __restrict__ idx,
                                            u32 n, u32 e, T* __restrict__ h, u32 H, u32 I, u32 k, int vec,
                                            const unsigned char* dpf, u64 dbytes, u32 npf, const DirRoute& rt,
                                            const DirShared<T, M>& sh) {
    const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, wpb = blockDim.x >> 5;
    // Blocks past the routed items' compute h_s: with gu_w a warp an element (its gate and up
    // dot products, warp_dots' as the routed items'), else a thread an element (an elementwise
    // SwiGLU of the columns gu).
    const u64 nq = (u64)n * I, nb = (nq + wpb - 1) / wpb;
    if (blockIdx.x >= nb && sh.gu_w) {
        const u64 q = (u64)(blockIdx.x - nb) * wpb + warp;
        if (q >= (u64)sh.t * sh.Is) return;
        const u32 r = (u32)(q / sh.Is), c = (u32)(q % sh.Is);
        const typename M::Row w[2] = {sh.gum.row(c, H), sh.gum.row((u64)sh.Is + c, H)};
        const T* a[1] = {x + (u64)r * H};
        float acc[1][2];
        warp_dots<T, typename M::Row, 2, 1, U, false>(w, a, 1, H, sh.gu_vec, lane, acc);
        if (lane == 0) sh.hs[q] = from_f<T>(silu_f(round_to<T>(acc[0][0])) * round_to<T>(acc[0][1]));
        return;
    }
    if (blockIdx.x >= nb) {
        const u64 q = (blockIdx.x - nb) * blockDim.x + threadIdx.x;
        if (q < (u64)sh.t * sh.Is) {
            const u64 r = q / sh.Is, c = q % sh.Is;
            const float* row = sh.gu + r * sh.gu_stride + sh.gu_col0;
            sh.hs[q] = from_f<T>(silu_f(round_to<T>(row[c])) * round_to<T>(row[sh.Is + c]));
        }
        return;
    }
    const u64 q0 = (u64)blockIdx.x * wpb, q = q0 + warp;
    u32 ex;
    if (rt.flags & 1) {
        // The block's items q0 .. qe - 1 span rows r0 .. r0 + nr - 1: nr <= the items <= wpb
        // (MOE_GEMV_WARPS at most, __launch_bounds__), so warp w routes row r0 + w.
        __shared__ u32 rsel[MOE_GEMV_WARPS * ROUTER_MAX_K];
        __shared__ float rwt[MOE_GEMV_WARPS * ROUTER_MAX_K];
        const u64 qe = min(q0 + wpb, nq);
        const u32 r0 = (u32)(q0 / I / k), nr = (u32)((qe - 1) / I / k) - r0 + 1u;
        if (warp < nr) {
            const u32 r = r0 + warp;
            u32* si = rsel + warp * ROUTER_MAX_K;
            float* sw = rwt + warp * ROUTER_MAX_K;
            router_warp_row(rt.logits + (u64)r * rt.stride, e, k, (rt.flags >> 1) & 1, lane, si, sw);
            __syncwarp();
            const u64 first = (u64)r * k * I;  // the row's first item: its block writes the row
            if (first >= q0 && first < qe && lane < k) {
                idx[(u64)r * k + lane] = si[lane];
                rt.wt[(u64)r * k + lane] = sw[lane];
            }
        }
        __syncthreads();
        if (q >= nq) return;
        const u32 p = (u32)(q / I);
        ex = rsel[(p / k - r0) * ROUTER_MAX_K + p % k];
    } else {
        if (q >= nq) return;
        ex = __ldg(idx + q / I);
    }
    const u32 p = (u32)(q / I), c = (u32)(q % I);
    if (ex >= e) return;
    if (p < npf) dir_down_prefetch(dpf, dbytes, ex, c, I, lane);
    const typename M::Row w[2] = {gate.row((u64)ex * I + c, H), up.row((u64)ex * I + c, H)};
    const T* a[1] = {x + (u64)(p / k) * H};
    float acc[1][2];
    warp_dots<T, typename M::Row, 2, 1, U, false>(w, a, 1, H, vec, lane, acc);
    if (lane == 0) h[(u64)p * I + c] = from_f<T>(silu_f(round_to<T>(acc[0][0])) * round_to<T>(acc[0][1]));
}

// Without a shared expert (moe_dir_gu_*).
template <typename T, typename M, int U>
__device__ __forceinline__ void dir_gu_impl(const T* __restrict__ x, const M gate, const M up, u32* __restrict__ idx,
                                            u32 n, u32 e, T* __restrict__ h, u32 H, u32 I, u32 k, int vec,
                                            const unsigned char* dpf, u64 dbytes, u32 npf, const DirRoute& rt) {
    DirShared<T, M> none{};
    dir_gu_impl<T, M, U>(x, gate, up, idx, n, e, h, H, I, k, vec, dpf, dbytes, npf, rt, none);
}

// `staged`: bit 0, the row's k rows of h in shared memory; bit 1, the row of h_s after them;
// bit 2, the rows prefetched into L2 first (dir_prefetch_rows); bit 3, the routed rows' L2
// priority set back to normal after use (the down-L2 form); bit 4, the expert ids come from the
// launch just before (the gate+up kernel's fused router): the routed rows' prefetch of bit 2
// waits for the PDL wait (only the shared row's is issued before it).
template <typename T, typename M, int U>
__device__ __forceinline__ void dir_down_impl_pdl(const T* __restrict__ h, const M down,
                                                  const u32* __restrict__ idx, const float* __restrict__ wt, u32 e,
                                                  float* __restrict__ out, u32 H, u32 I, u32 k, int vec, int staged,
                                                  const DirShared<T, M>& sh) {
    constexpr int G = MOE_DIR_KG;
    extern __shared__ uint4 dsm_h[];
    const u32 lane = threadIdx.x & 31u;
    // Block (column block x, row y): the row's k rows of h, [k, I], in shared memory when
    // staged (every warp of the block reads all of them: from L2 each read of the group
    // waited its own latency), else read from global memory; so the shared expert's row.
    const u32 r = blockIdx.y, c = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const T* hr = h + (u64)r * k * I;
    const T* hsr = sh.mode ? sh.hs + (u64)r * sh.Is : nullptr;
    // staged bit 2 (the streamed form; PORTER_MOE_DOWN=legacy clears it): every weight row
    // this warp will read (its k routed rows, then the shared row) is asked into L2 before
    // the staging below, so HBM works on the whole launch's bytes from its start; without
    // it the first zip group's loads were issued only after the idx load, the h staging
    // and the barrier (one wave at t = 1: each of those latencies was the kernel's), and
    // the second group's only after the first group's dots. Registers: one expert id and
    // one address a lane (no row array: the earlier try with prefetch_rows spilled).
    const bool late = staged & 16;
    if ((staged & 4) && c < H) dir_prefetch_rows<T, M>(down, idx + (u64)r * k, e, H, I, k, c, sh, lane, !late);
    // Before the PDL wait: the prefetch above reads only weights and the router's expert ids,
    // written two launches back (router, then gate+up, then this kernel): a kernel starts only
    // once every block of the launch before it is past its own wait, i.e. once the launch
    // before that one has completed. So the down rows stream into L2 during the gate+up
    // launch's tail; h (the gate+up output) is read only after the wait. With the fused router
    // (bit 4) the ids are the gate+up launch's own output: the routed rows only after it.
    porter_pdl_enter();
    if ((staged & 4) && late && c < H)
        dir_prefetch_rows<T, M>(down, idx + (u64)r * k, e, H, I, k, c, sh, lane, true, false);
    if (staged & 3) {
        const u32 n16 = (staged & 1) ? k * I * (u32)sizeof(T) / 16u : 0u;
        const u32 s16 = (staged & 2) ? sh.Is * (u32)sizeof(T) / 16u : 0u;
        const uint4* src = reinterpret_cast<const uint4*>(hr);
        const uint4* ssrc = reinterpret_cast<const uint4*>(hsr);
        for (u32 i = threadIdx.x; i < n16 + s16; i += blockDim.x)
            dsm_h[i] = i < n16 ? __ldg(src + i) : __ldg(ssrc + (i - n16));
        __syncthreads();
        if (staged & 1) hr = reinterpret_cast<const T*>(dsm_h);
        if (staged & 2) hsr = reinterpret_cast<const T*>(dsm_h + n16);
    }
    if (c >= H) return;
    float total = 0.0f, sdot = 0.0f;
    // The pairs, and with mode 1 the shared row as pair k (the last of the last group).
    const u32 kk = k + (sh.mode == 1 ? 1u : 0u);
    for (u32 j0 = 0; j0 < kk; j0 += G) {
        typename M::Row w[G];
        const T* a[G];
        u32 live = 0u;
#pragma unroll
        for (int g = 0; g < G; ++g) {
            const u32 j = j0 + g;
            if (j == k && sh.mode == 1) {
                live |= 1u << g;
                w[g] = sh.down.row(c, I);
                a[g] = hsr;
            } else {
                const u32 ex = j < k ? __ldg(idx + (u64)r * k + j) : e;
                const bool ok = ex < e;
                live |= (ok ? 1u : 0u) << g;
                w[g] = down.row((u64)(ok ? ex : 0u) * H + c, I);
                a[g] = hr + (u64)(ok ? j : 0u) * I;
            }
        }
        float acc[G];
        warp_dots_zip<T, typename M::Row, G, U>(w, a, live, I, vec, lane, acc);
#pragma unroll
        for (int g = 0; g < G; ++g) {
            if (sh.mode == 1 && j0 + g == k) sdot = acc[g];
            else if (live >> g & 1u)
                total = __fadd_rn(total, __fmul_rn(round_to<T>(acc[g]), __ldg(wt + (u64)r * k + j0 + g)));
        }
    }
    if (sh.mode == 2) {
        const typename M::Row ws[1] = {sh.down.row(c, sh.Is)};
        const T* as[1] = {hsr};
        float acc[1];
        warp_dots_zip<T, typename M::Row, 1, U>(ws, as, 1u, sh.Is, sh.vec, lane, acc);
        sdot = acc[0];
    }
    if (sh.mode) total += sigmoid_f(round_to<T>(sh.glog[(u64)r * sh.g_stride + sh.g_col])) * round_to<T>(sdot);
    if (lane == 0) out[(u64)r * H + c] = total;
    // staged bit 3 (the down-L2 form): the rows just read were asked into L2 with evict_last
    // by the gate+up launch; back to normal priority, so that they do not crowd out the
    // next kernels' data (after the loads above: this warp's values are in registers).
    if (staged & 8) dir_prefetch_rows<T, M, true>(down, idx + (u64)r * k, e, H, I, k, c, sh, lane);
}

// Without a shared expert (moe_dir_down_*).
template <typename T, typename M, int U>
__device__ __forceinline__ void dir_down_impl_pdl(const T* __restrict__ h, const M down,
                                                  const u32* __restrict__ idx, const float* __restrict__ wt, u32 e,
                                                  float* __restrict__ out, u32 H, u32 I, u32 k, int vec, int staged) {
    DirShared<T, M> none{};
    dir_down_impl_pdl<T, M, U>(h, down, idx, wt, e, out, H, I, k, vec, staged, none);
}

// The in-flight direct down kernel (moe_dir_downa_*; kernels/src/cuda/moe_decode.rs takes it
// where it fits: k + shared ≤ KMAX rows of ≤ 32·CH chunks, 16-byte rows, h staged, ids from the
// separate router). Why: in a graphed decode step at batch 1 (H200, 80B, session 17's knockout
// runs: each launch left out in turn, the step's drop its cost in place) the down launch cost
// 12.6 µs (bf16, 23 MB: 5.5 µs of bytes) and 17.0 µs (FP8, 11.5 MB: 2.7 µs) a layer. After its
// PDL wait dir_down_impl_pdl walks a chain of dependent round trips (ids, then the first zip
// group's rows, FP8 also their scale-row map and scales, then the second group). Here every
// load that does not need the gate+up output is issued *before* the wait — the row's ids and
// weights wt (the router's, two launches back: see dir_down_impl_pdl), every weight chunk of
// every pair into registers, and per chunk its side value (the FP8 block scale) — so that
// they overlap the gate+up launch's tail; after the wait only h is staged (one L2 round trip)
// and the dots run from registers. The arithmetic is dir_down_impl_pdl's: per pair the same
// lane-strided chunks in the same order, the same per-chunk formula (R::dot_side is
// dot_acc with the side value given), the same butterfly, the same Σ_j in j order and shared
// term, so the same bits.
template <typename T, typename M, int CH, int KMAX>
__device__ __forceinline__ void dir_downa_impl_pdl(const T* __restrict__ h, const M down, const u32* __restrict__ idx,
                                                   const float* __restrict__ wt, u32 e, float* __restrict__ out, u32 H,
                                                   u32 I, u32 k, int staged, const DirShared<T, M>& sh) {
    typedef typename M::Row R;
    constexpr u32 E = R::E;
    extern __shared__ uint4 dsm_h[];
    const u32 lane = threadIdx.x & 31u;
    const u32 r = blockIdx.y, c = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const u32 kv = I / E;                              // chunks of a row (host: I % E == 0, kv <= 32·CH)
    const u32 kk = k + (sh.mode == 1 ? 1u : 0u);       // rows of the warp (host: kk <= KMAX)
    uint4 wv[KMAX][CH];
    float sd[KMAX][CH];
    u32 live = 0u;
    if (c < H) {
#pragma unroll
        for (int j = 0; j < KMAX; ++j) {
            if ((u32)j >= kk) break;
            bool ok = true;
            R row;
            if (sh.mode == 1 && (u32)j == k) {
                row = sh.down.row(c, I);
            } else {
                const u32 ex = __ldg(idx + (u64)r * k + j);
                ok = ex < e;
                row = down.row((u64)(ok ? ex : 0u) * H + c, I);
            }
            if (!ok) continue;
            live |= 1u << j;
#pragma unroll
            for (int q = 0; q < CH; ++q) {
                const u32 cc = lane + 32u * q;
                if (cc < kv) {
                    wv[j][q] = row.load(cc);
                    sd[j][q] = row.side(cc);
                }
            }
        }
    }
    porter_pdl_enter();
    // h (and h_s) into shared memory, each row's 16-byte pieces permuted: a weight chunk of E
    // elements takes P pieces of h (P = 2 for FP8 chunks of 16 and 16-bit h), and piece v of
    // chunk cc goes to v·kv + cc of its row, so that the lanes (consecutive chunks) read
    // consecutive pieces: without it the FP8 kernel read h at a 32-byte lane stride, bank
    // conflicts that made it issue-bound (ncu, session 17: 83 % excess shared wavefronts,
    // 17.3 µs for 10.5 MB). Values, not order, move: the same bits.
    constexpr u32 P = E * (u32)sizeof(T) / 16u;
    const u32 ppr = kv * P;  // pieces of a row
    {
        const u32 n16 = k * ppr;
        const u32 s16 = sh.mode == 1 ? ppr : 0u;
        const uint4* src = reinterpret_cast<const uint4*>(h + (u64)r * k * I);
        const uint4* ssrc = reinterpret_cast<const uint4*>(sh.mode == 1 ? sh.hs + (u64)r * sh.Is : nullptr);
        for (u32 i = threadIdx.x; i < n16 + s16; i += blockDim.x) {
            const u32 j = i / ppr, pc = i - j * ppr;
            dsm_h[j * ppr + (pc % P) * kv + pc / P] = i < n16 ? __ldg(src + i) : __ldg(ssrc + (i - n16));
        }
        __syncthreads();
    }
    if (c >= H) return;
    float total = 0.0f, sdot = 0.0f;
#pragma unroll
    for (int j = 0; j < KMAX; ++j) {
        if ((u32)j >= kk) break;
        if (!(live >> j & 1u)) continue;
        float acc = 0.0f;
        // Row j's pieces (the shared row, j = k, follows the k routed rows).
        const uint4* a = dsm_h + (u64)j * ppr;
#pragma unroll
        for (int q = 0; q < CH; ++q) {
            const u32 cc = lane + 32u * q;
            if (cc < kv) {
                float wf[E], af[E];
                R{}.expand(wv[j][q], cc, wf);
#pragma unroll
                for (u32 v = 0; v < P; ++v) unpack<T>(a[v * kv + cc], af + v * VecOf<T>::N);
                acc = R::dot_side(wf, af, sd[j][q], acc);
            }
        }
        acc = warp_sum(acc);
        if (sh.mode == 1 && (u32)j == k) sdot = acc;
        else total = __fadd_rn(total, __fmul_rn(round_to<T>(acc), __ldg(wt + (u64)r * k + j)));
    }
    if (sh.mode) total += sigmoid_f(round_to<T>(sh.glog[(u64)r * sh.g_stride + sh.g_col])) * round_to<T>(sdot);
    if (lane == 0) out[(u64)r * H + c] = total;
    // staged bit 3 (the down-L2 form): the routed rows were asked into L2 with evict_last by the
    // gate+up launch; back to normal priority now that they are in registers.
    if (staged & 8) dir_prefetch_rows<T, M, true>(down, idx + (u64)r * k, e, H, I, k, c, sh, lane);
}

// Without a shared expert (moe_dir_downa_*).
template <typename T, typename M, int CH, int KMAX>
__device__ __forceinline__ void dir_downa_impl_pdl(const T* __restrict__ h, const M down, const u32* __restrict__ idx,
                                                   const float* __restrict__ wt, u32 e, float* __restrict__ out, u32 H,
                                                   u32 I, u32 k, int staged) {
    DirShared<T, M> none{};
    dir_downa_impl_pdl<T, M, CH, KMAX>(h, down, idx, wt, e, out, H, I, k, staged, none);
}

// The fused router's arguments of every direct gate+up entry point (after npf; the shared
// expert's after them): logits, their row stride, flags (bit 0 route here, bit 1 renorm), and
// the weights' output (the ids' is the kernel's idx).
#define MOE_RT_ARGS const float *rlog, u32 rstride, int rflags, float *rwt
#define MOE_RT (DirRoute{rlog, rstride, rflags, rwt})

// The in-flight down kernel's reach (moe_dir_downa_*, all dtypes; MOE_DOWNA_* in
// kernels/src/cuda/moe_decode.rs): rows of up to 2 chunks a lane (bf16: I <= 512), up to 11 of
// them (top-10 and a shared expert).
#define MOE_DOWNA_CH 2
#define MOE_DOWNA_KMAX 11

// Entry points: moe_dir_gu_<T> / moe_dir_down_<T> / moe_dir_downa_<T>; DIR_U: chunks in flight per lane and row of
// the down kernel.
#define MOE_DIR_ENTRY(T, NAME, DIR_U)                                                                              \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 3) moe_dir_gu_##NAME(                         \
        const T* x, const T* gate, const T* up, u32* idx, u32 n, u32 e, T* h, u32 H, u32 I, u32 k, int vec,       \
        const unsigned char* dpf, u64 dbytes, u32 npf, MOE_RT_ARGS) {                                             \
        porter_pdl_enter();                                                                                       \
        dir_gu_impl<T, DenseMat<T>, 4>(x, DenseMat<T>{gate}, DenseMat<T>{up}, idx, n, e, h, H, I, k, vec, dpf,  \
                                       dbytes, npf, MOE_RT);                                                      \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 2) moe_dir_down_##NAME(                       \
        const T* h, const T* down, const u32* idx, const float* wt, u32 e, float* out, u32 H, u32 I, u32 k,         \
        int vec, int staged) {                                                                                    \
        dir_down_impl_pdl<T, DenseMat<T>, DIR_U>(h, DenseMat<T>{down}, idx, wt, e, out, H, I, k, vec, staged);      \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(MOE_GEMV_WARPS * 32, 2) moe_dir_downa_##NAME(                      \
        const T* h, const T* down, const u32* idx, const float* wt, u32 e, float* out, u32 H, u32 I, u32 k,         \
        int vec, int staged) {                                                                                    \
        dir_downa_impl_pdl<T, DenseMat<T>, MOE_DOWNA_CH, MOE_DOWNA_KMAX>(h, DenseMat<T>{down}, idx, wt, e, out, H, I, k, \
                                                                         staged);                                 \
    }

// f32: one chunk (two spilled: 4 weights a chunk, twice the chunks a row).
MOE_DIR_ENTRY(float, f32, 1)
MOE_DIR_ENTRY(bf16, bf16, 2)
MOE_DIR_ENTRY(f16, f16, 2)

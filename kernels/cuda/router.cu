// Selection kernels on f32 scores: the MoE router (softmax -> top-k ->
// optional renormalisation) and greedy argmax over the vocabulary.
// Preceded by common.cuh and router_sel.cu (ROUTER_MAX_K, ROUTER_WARP_J, router_warp_row).

// MoE router, one block per row. logits [rows, e] (f32), idx [rows, k] (u32),
// weights [rows, k] (f32). Dynamic shared memory: e floats.
// p = softmax(logits) (p_i = exp(l_i − max) · (1 / Σ)); the k largest p in
// descending order, ties to the lower index (torch.topk on CPU, and
// porter_core::nn::Moe::route); with `renorm`, each weight is divided by the
// sum of the selected p, summed in selection order. A row whose logits are all
// −inf gives p = 0 everywhere, like the CPU softmax.
// Requires 1 <= k <= min(e, ROUTER_MAX_K) (checked by the Rust wrapper).
// `stride` is the row stride of `logits` (e, or wider when the router logits are the
// first e columns of a stacked GEMM output).
extern "C" __global__ void moe_router_f32(const float* __restrict__ logits, u32* __restrict__ idx,
                                          float* __restrict__ weights, u32 e, u32 k, int renorm, u32 stride) { porter_pdl_enter();
    extern __shared__ float p[];
    __shared__ float shv[32];
    __shared__ u32 shi[32];
    __shared__ float selw[ROUTER_MAX_K];
    __shared__ u32 seli[ROUTER_MAX_K];
    const u32 tid = threadIdx.x, nt = blockDim.x;
    const u64 r = blockIdx.x;
    const float* l = logits + r * stride;

    float m = PORTER_NEG_INF;
    for (u32 i = tid; i < e; i += nt) m = fmaxf(m, l[i]);
    m = block_max(m, shv, tid, nt);
    if (m == PORTER_NEG_INF) {
        for (u32 i = tid; i < e; i += nt) p[i] = 0.0f;
    } else {
        float s = 0.0f;
        for (u32 i = tid; i < e; i += nt) {
            const float v = expf(l[i] - m);
            p[i] = v;
            s += v;
        }
        s = block_sum(s, shv, tid, nt);
        const float inv = 1.0f / s;
        for (u32 i = tid; i < e; i += nt) p[i] *= inv;
    }
    __syncthreads();

    for (u32 j = 0; j < k; ++j) {
        float bv = PORTER_NEG_INF;
        u32 bi = 0xffffffffu;
        for (u32 i = tid; i < e; i += nt) {
            const float v = p[i];
            if (beats(v, i, bv, bi)) {
                bv = v;
                bi = i;
            }
        }
        block_argmax(bv, bi, shv, shi, tid, nt);
        if (tid == 0) {
            // There are e - j >= 1 unselected entries, all >= 0 or NaN. An all-NaN remainder
            // (no number won: bv is the -inf of a selected entry or of the start) falls back to
            // the lowest unselected index; testing bi >= e instead picked the lowest selected
            // entry again once one was taken.
            if (bv == PORTER_NEG_INF) {
                for (u32 i = 0; i < e; ++i) {
                    if (p[i] != PORTER_NEG_INF) {
                        bi = i;
                        break;
                    }
                }
            }
            seli[j] = bi;
            selw[j] = p[bi];
            p[bi] = PORTER_NEG_INF;  // selected: never picked again
        }
        __syncthreads();
    }

    if (tid == 0) {
        float s = 0.0f;
        for (u32 j = 0; j < k; ++j) s += selw[j];
        for (u32 j = 0; j < k; ++j) {
            idx[r * k + j] = seli[j];
            weights[r * k + j] = renorm ? selw[j] / s : selw[j];
        }
    }
}

// The router of moe_router_f32 for e <= 32 * ROUTER_WARP_J experts, one warp per row (a block
// of 32 threads): router_warp_row (router_sel.cu, shared with the direct MoE decode form's
// fused router). Why: the decode step's router is one row, latency-bound (8 µs a call in the
// block form at e = 512, k = 10 on the H200). Same selection rule as moe_router_f32 (ties to
// the lower index, NaN never wins, an all-NaN remainder falls back to the lowest unselected
// index) and the same weights up to the order of the softmax sum.
extern "C" __global__ void __launch_bounds__(32) moe_router_warp_f32(const float* __restrict__ logits,
                                                                    u32* __restrict__ idx,
                                                                    float* __restrict__ weights, u32 e, u32 k,
                                                                    int renorm, u32 stride) { porter_pdl_enter();
    const u64 r = blockIdx.x;
    router_warp_row(logits + r * stride, e, k, renorm, threadIdx.x, idx + r * k, weights + r * k);
}

// Greedy argmax per row (the first index on ties, as torch.argmax and
// porter_core::sampling::argmax). logits [rows, v] (f32), out [rows] (u32).
// One block per row. NaN values never win; an all-NaN row gives 0.
// A 16-byte aligned row is read as float4, four loads in flight a thread before any compare:
// one block reads a whole vocabulary row (608 KB at 151,936 entries), and a loop of single
// dependent loads waited one L2 round trip per 4 bytes a thread (about 150 in a row).
extern "C" __global__ void argmax_f32(const float* __restrict__ logits, u32* __restrict__ out, u32 v) { porter_pdl_enter();
    __shared__ float shv[32];
    __shared__ u32 shi[32];
    const u32 tid = threadIdx.x, nt = blockDim.x;
    const u64 r = blockIdx.x;
    const float* l = logits + r * v;
    float bv = PORTER_NEG_INF;
    u32 bi = 0xffffffffu;
    auto take = [&](float x, u32 i) {
        if (beats(x, i, bv, bi)) {
            bv = x;
            bi = i;
        }
    };
    // float4 part (none when the row is not 16-byte aligned), then the scalar tail.
    const u32 n4 = (reinterpret_cast<u64>(l) & 15u) == 0 ? v / 4u : 0u;
    const float4* l4 = reinterpret_cast<const float4*>(l);
    u32 j = tid;
    for (; j + 3u * nt < n4; j += 4u * nt) {
        float4 a[4];
#pragma unroll
        for (u32 u = 0; u < 4u; ++u) a[u] = l4[j + u * nt];
#pragma unroll
        for (u32 u = 0; u < 4u; ++u) {
            const u32 i = 4u * (j + u * nt);
            take(a[u].x, i);
            take(a[u].y, i + 1u);
            take(a[u].z, i + 2u);
            take(a[u].w, i + 3u);
        }
    }
    for (; j < n4; j += nt) {
        const float4 a = l4[j];
        take(a.x, 4u * j);
        take(a.y, 4u * j + 1u);
        take(a.z, 4u * j + 2u);
        take(a.w, 4u * j + 3u);
    }
    for (u32 i = 4u * n4 + tid; i < v; i += nt) take(l[i], i);
    block_argmax(bv, bi, shv, shi, tid, nt);
    if (tid == 0) out[r] = bi < v ? bi : 0u;
}

// The MoE router's one-warp top-k selection as a device function: moe_router_warp_f32
// (router.cu) runs it one warp a row, and the direct MoE decode form's gate+up kernels
// (moe_direct.cu, PORTER_MOE_ROUTER=fused) run the very same code for the rows their items
// need, so that their expert ids and weights are those of the separate router, bit for bit.
// Put before router.cu in the ROUTER module and before moe_direct.cu in the MOE and FP8
// modules by kernels/src/cuda/compile.rs. Preceded by common.cuh (beats, warp_argmax).

#define ROUTER_MAX_K 16
// Registers of p a lane: rows of e <= 32 * ROUTER_WARP_J experts (ROUTER_WARP_E on the host).
#define ROUTER_WARP_J 16

// One row of the router, one warp (all 32 lanes, converged): l the row's e f32 logits,
// p = softmax(l) (p_i = exp(l_i − max) · (1 / Σ), Σ over lanes after each lane's own sum),
// the k largest p in descending order, ties to the lower index, NaN never wins, an all-NaN
// remainder falls back to the lowest unselected index; a row whose logits are all −inf gives
// p = 0 everywhere. Lane 0 writes idx_out[j] for each selection j; lane j < k writes
// w_out[j], divided (renorm) by the sum of the selected p taken in selection order. The
// outputs may be global or shared memory. Requires 1 <= k <= min(e, ROUTER_MAX_K) and
// e <= 32 * ROUTER_WARP_J (checked on the host).
// Lane l holds p[l + 32 j] in registers, the k selections are k warp-shuffle argmaxes with
// no barrier (the block form moe_router_f32 pays a block reduction, two barriers, a
// selection: the decode step's router is one row, latency-bound).
__device__ __forceinline__ void router_warp_row(const float* l, u32 e, u32 k, int renorm, u32 lane,
                                                u32* idx_out, float* w_out) {
    float p[ROUTER_WARP_J];
    float m = PORTER_NEG_INF;
#pragma unroll
    for (int j = 0; j < ROUTER_WARP_J; ++j) {
        const u32 i = lane + 32u * j;
        p[j] = i < e ? l[i] : PORTER_NEG_INF;
        m = fmaxf(m, p[j]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (m == PORTER_NEG_INF) {
#pragma unroll
        for (int j = 0; j < ROUTER_WARP_J; ++j) p[j] = (lane + 32u * j) < e ? 0.0f : PORTER_NEG_INF;
    } else {
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < ROUTER_WARP_J; ++j) {
            const u32 i = lane + 32u * j;
            p[j] = i < e ? expf(p[j] - m) : 0.0f;
            s += p[j];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        const float inv = 1.0f / s;
#pragma unroll
        for (int j = 0; j < ROUTER_WARP_J; ++j) p[j] = (lane + 32u * j) < e ? p[j] * inv : PORTER_NEG_INF;
    }
    // Selected entries become -inf (never picked again); the padding beyond e is -inf from the
    // start, and never chosen: there are e - j >= 1 unselected entries, all >= 0 or NaN.
    float selw = 0.0f, sum = 0.0f;
    for (u32 j = 0; j < k; ++j) {
        float bv = PORTER_NEG_INF;
        u32 bi = 0xffffffffu;
#pragma unroll
        for (int jj = 0; jj < ROUTER_WARP_J; ++jj) {
            const u32 i = lane + 32u * jj;
            if (beats(p[jj], i, bv, bi)) {
                bv = p[jj];
                bi = i;
            }
        }
        warp_argmax(bv, bi);
        if (bi >= e) {
            // An all-NaN remainder: the lowest unselected index.
            u32 lo = 0xffffffffu;
#pragma unroll
            for (int jj = ROUTER_WARP_J - 1; jj >= 0; --jj) {
                const u32 i = lane + 32u * jj;
                if (i < e && p[jj] != PORTER_NEG_INF) lo = i;
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
            bi = lo;
        }
        // The owner lane holds the selected value; it takes it out and broadcasts it.
        float w = 0.0f;
#pragma unroll
        for (int jj = 0; jj < ROUTER_WARP_J; ++jj) {
            if (lane + 32u * jj == bi) {
                w = p[jj];
                p[jj] = PORTER_NEG_INF;
            }
        }
        w = __shfl_sync(0xffffffffu, w, bi & 31u);
        sum += w;
        if (lane == j) selw = w;
        if (lane == 0) idx_out[j] = bi;
    }
    // Lane j < k holds selection j's weight; the sum was taken in selection order.
    if (lane < k) w_out[lane] = renorm ? selw / sum : selw;
}

// The MoE router's one-warp top-k selection as a device function: moe_router_warp_f32
// (router.cu) runs it one warp a row, and the direct MoE decode form's gate+up kernels
// (moe_direct.cu, PORTER_MOE_ROUTER=fused) run the very same code for the rows their items
// need, so that their expert ids and weights are those of the separate router, bit for bit.
// Put before router.cu in the ROUTER module and before moe_direct.cu in the MOE and FP8
// modules by kernels/src/cuda/compile.rs. Preceded by common.cuh (PORTER_SM80, PORTER_NAN).

#define ROUTER_MAX_K 16
// Registers of p a lane: rows of e <= 32 * ROUTER_WARP_J experts (ROUTER_WARP_E on the host).
#define ROUTER_WARP_J 16

// The warp's largest (MAX) or smallest u32 (every lane gets it): one redux.sync on sm_80+,
// five shuffle steps on the fallback paths (same result).
template <bool MAX>
__device__ __forceinline__ u32 warp_ext_u32(u32 v) {
#if defined(PORTER_SM80)
    return MAX ? __reduce_max_sync(0xffffffffu, v) : __reduce_min_sync(0xffffffffu, v);
#else
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const u32 w = __shfl_xor_sync(0xffffffffu, v, o);
        v = MAX ? max(v, w) : min(v, w);
    }
    return v;
#endif
}

// One row of the router, one warp (all 32 lanes, converged): l the row's e f32 logits,
// p = softmax(l) (p_i = exp(l_i − max) · (1 / Σ), Σ over lanes after each lane's own sum),
// the k largest p in descending order, ties to the lower index, NaN never wins over a number,
// a remainder of NaNs gives its lowest indices in order; a row whose logits are all −inf gives
// p = 0 everywhere. Lane 0 writes idx_out[j] for each selection j; lane j < k writes
// w_out[j], divided (renorm) by the sum of the selected p taken in selection order. The
// outputs may be global or shared memory. Requires 1 <= k <= min(e, ROUTER_MAX_K) and
// e <= 32 * ROUTER_WARP_J (checked on the host).
//
// Lane l holds p[l + 32 j] in registers as an order key: a number p (>= +0: an exp times a
// positive 1 / Σ) is 2 + its bits (±0 alike), NaN 1, the padding beyond e and a selected entry
// 0, so that the unsigned order of the keys is the selection order up to the index. A
// selection is then the warp's largest key (a tree over the lane's registers, one redux.sync),
// the lowest index holding it (one redux.sync), and its weight read back from the key: no
// compare-and-branch chain over the registers and no shuffle argmax (the decode step's router
// is one row, latency-bound: that chain, ten rounds of it, was its cost).
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
    u32 key[ROUTER_WARP_J];
    if (m == PORTER_NEG_INF) {
#pragma unroll
        for (int j = 0; j < ROUTER_WARP_J; ++j) key[j] = (lane + 32u * j) < e ? 2u : 0u;
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
        for (int j = 0; j < ROUTER_WARP_J; ++j) {
            const float v = p[j] * inv;
            key[j] = (lane + 32u * j) >= e ? 0u : v != v ? 1u : v == 0.0f ? 2u : __float_as_uint(v) + 2u;
        }
    }
    // There are e - j >= 1 unselected entries (keys >= 1), so the largest key is never 0.
    float selw = 0.0f, sum = 0.0f;
    for (u32 j = 0; j < k; ++j) {
        u32 t[ROUTER_WARP_J / 2];
#pragma unroll
        for (int jj = 0; jj < ROUTER_WARP_J / 2; ++jj) t[jj] = max(key[jj], key[jj + ROUTER_WARP_J / 2]);
#pragma unroll
        for (int w = ROUTER_WARP_J / 4; w > 0; w >>= 1)
#pragma unroll
            for (int jj = 0; jj < w; ++jj) t[jj] = max(t[jj], t[jj + w]);
        const u32 best = warp_ext_u32<true>(t[0]);
        u32 mine = 0xffffffffu;
#pragma unroll
        for (int jj = ROUTER_WARP_J - 1; jj >= 0; --jj)
            if (key[jj] == best) mine = lane + 32u * jj;
        const u32 bi = warp_ext_u32<false>(mine);
        // The owner lane takes it out.
#pragma unroll
        for (int jj = 0; jj < ROUTER_WARP_J; ++jj)
            if (lane + 32u * jj == bi) key[jj] = 0u;
        const float w = best >= 2u ? __uint_as_float(best - 2u) : PORTER_NAN;
        sum += w;
        if (lane == j) selw = w;
        if (lane == 0) idx_out[j] = bi;
    }
    // Lane j < k holds selection j's weight; the sum was taken in selection order.
    if (lane < k) w_out[lane] = renorm ? selw / sum : selw;
}

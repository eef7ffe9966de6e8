// The gated RMSNorm of one Gated DeltaNet output row, one warp: shared by misc.cu's
// gated_norm_z (a warp per row) and gdn_fused.cu's decode step (the row in shared memory), so
// that both give the same bits. Preceded by common.cuh.
//
// orow[i] = round((x[i] · rs · w[i]) · silu(z[i])), rs = 1 / sqrt(Σx² / d + eps), x, z, w read
// as f32. Lane l sums x² over i = l, l + 32, … in that order (held in registers up to
// 32·GNZ_NPT values, else read twice; the same sums either way), then a butterfly warp sum.
#define GNZ_NPT 8
template <typename T>
__device__ __forceinline__ void gated_norm_row(const T* xr, const T* __restrict__ zr, const T* __restrict__ w,
                                               T* __restrict__ orow, u32 d, float eps, u32 lane) {
    const float inv_d = 1.0f / (float)d;
    if (d <= 32u * GNZ_NPT) {
        float v[GNZ_NPT];
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < GNZ_NPT; ++j) {
            const u32 i = lane + 32u * j;
            v[j] = i < d ? to_f(xr[i]) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < GNZ_NPT; ++j) ss += v[j] * v[j];
        ss = warp_sum(ss);
        const float rs = 1.0f / sqrtf(ss * inv_d + eps);
#pragma unroll
        for (int j = 0; j < GNZ_NPT; ++j) {
            const u32 i = lane + 32u * j;
            if (i < d) orow[i] = from_f<T>((v[j] * rs * to_f(w[i])) * silu_f(to_f(zr[i])));
        }
        return;
    }
    float ss = 0.0f;
    for (u32 i = lane; i < d; i += 32u) {
        const float v = to_f(xr[i]);
        ss += v * v;
    }
    ss = warp_sum(ss);
    const float rs = 1.0f / sqrtf(ss * inv_d + eps);
    for (u32 i = lane; i < d; i += 32u) {
        orow[i] = from_f<T>((to_f(xr[i]) * rs * to_f(w[i])) * silu_f(to_f(zr[i])));
    }
}

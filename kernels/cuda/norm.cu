// RMSNorm kernels: standard (Llama), zero-centred (Qwen3-Next, `1 + w`) and
// gated (Qwen3-Next linear attention: x·rstd·w·silu(z)).
// Preceded by common.cuh. One block per row; block size a multiple of 32.

// Standard:     out = round(w · round(x · inv)),  inv = 1 / sqrt(Σx²/d + eps)
// Zero-centred: out = round(x · inv · (1 + w))     (1 + w in f32, one rounding)
// x may be f32 (the residual stream) or the model dtype; w and out are TO.
//
// A row of at most NORM_NPT (common.cuh) elements a thread is read once, with the weights, before the
// reduction (one round trip to memory instead of two: decode runs these on a few rows, so
// their latency is the cost); the per-thread sums keep the loop's order (same bits).
//
// The whole kernel, porter_pdl_enter() included: on the register path the weights are read
// before the wait (they never change), unless bit 1 of `zc` is set (the host's
// PORTER_NORM_PRELOAD=off, for A/B); bit 0 is zero-centred.
template <typename TX, typename TO>
__device__ __forceinline__ void rms_norm_pdl(const TX* __restrict__ x, const TO* __restrict__ w, TO* __restrict__ out,
                                             u32 d, float eps, int zc) {
    __shared__ float sh[32];
    const u64 r = blockIdx.x;
    const TX* xr = x + r * d;
    TO* orow = out + r * d;
    const bool pre = (zc & 2) == 0, regs = d <= blockDim.x * NORM_NPT;
    const int zero_centred = zc & 1;
    float wv[NORM_NPT];
    if (regs && pre) norm_row_weights(w, d, wv);
    porter_pdl_enter();
    if (regs) {
        if (!pre) norm_row_weights(w, d, wv);
        float v[NORM_NPT];
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < NORM_NPT; ++j) {
            const u32 i = threadIdx.x + j * blockDim.x;
            v[j] = i < d ? to_f(xr[i]) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < NORM_NPT; ++j) ss += v[j] * v[j];
        ss = block_sum(ss, sh, threadIdx.x, blockDim.x);
        const float inv = 1.0f / sqrtf(ss / (float)d + eps);
#pragma unroll
        for (int j = 0; j < NORM_NPT; ++j) {
            const u32 i = threadIdx.x + j * blockDim.x;
            if (i < d)
                orow[i] = zero_centred ? from_f<TO>(v[j] * inv * (1.0f + wv[j])) : from_f<TO>(wv[j] * round_to<TO>(v[j] * inv));
        }
        return;
    }
    float ss = 0.0f;
    for (u32 i = threadIdx.x; i < d; i += blockDim.x) {
        const float v = to_f(xr[i]);
        ss += v * v;
    }
    ss = block_sum(ss, sh, threadIdx.x, blockDim.x);
    const float inv = 1.0f / sqrtf(ss / (float)d + eps);
    for (u32 i = threadIdx.x; i < d; i += blockDim.x) {
        const float v = to_f(xr[i]);
        const float wv = to_f(w[i]);
        if (zero_centred) {
            orow[i] = from_f<TO>(v * inv * (1.0f + wv));
        } else {
            orow[i] = from_f<TO>(wv * round_to<TO>(v * inv));
        }
    }
}

// Gated: out = round((x · r · w) · silu(z)), r = 1 / sqrt(Σx² · (1/d) + eps),
// plain w (no 1 + w). x [rows, d] (TX), z [rows, d] and w [d] (TO).
template <typename TX, typename TO>
__device__ __forceinline__ void gated_rms_norm_impl(const TX* __restrict__ x, const TO* __restrict__ z,
                                                    const TO* __restrict__ w, TO* __restrict__ out, u32 d, float eps) {
    __shared__ float sh[32];
    const u64 r = blockIdx.x;
    const TX* xr = x + r * d;
    const TO* zr = z + r * d;
    TO* orow = out + r * d;
    float ss = 0.0f;
    for (u32 i = threadIdx.x; i < d; i += blockDim.x) {
        const float v = to_f(xr[i]);
        ss += v * v;
    }
    ss = block_sum(ss, sh, threadIdx.x, blockDim.x);
    const float inv_d = 1.0f / (float)d;
    const float rs = 1.0f / sqrtf(ss * inv_d + eps);
    for (u32 i = threadIdx.x; i < d; i += blockDim.x) {
        const float v = to_f(xr[i]);
        orow[i] = from_f<TO>((v * rs * to_f(w[i])) * silu_f(to_f(zr[i])));
    }
}

#define PORTER_NORMS(NX, TX, NO, TO)                                                                           \
    extern "C" __global__ void rms_norm_##NX##_##NO(const TX* x, const TO* w, TO* out, u32 d, float eps,      \
                                                   int zero_centred) {                                                            \
        rms_norm_pdl<TX, TO>(x, w, out, d, eps, zero_centred);                                               \
    }                                                                                                          \
    extern "C" __global__ void gated_rms_norm_##NX##_##NO(const TX* x, const TO* z, const TO* w, TO* out, u32 d, \
                                                         float eps) { porter_pdl_enter();                                         \
        gated_rms_norm_impl<TX, TO>(x, z, w, out, d, eps);                                                    \
    }

PORTER_NORMS(f32, float, f32, float)
PORTER_NORMS(f32, float, bf16, bf16)
PORTER_NORMS(bf16, bf16, f32, float)
PORTER_NORMS(bf16, bf16, bf16, bf16)
PORTER_NORMS(f32, float, f16, f16)
PORTER_NORMS(f16, f16, f32, float)
PORTER_NORMS(f16, f16, f16, f16)

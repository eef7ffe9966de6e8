// An attention block's query / key preparation in one launch (qk_prep_*): the per-head q / k
// RMSNorms (Qwen3's standard ones, Qwen3-Next's zero-centred ones, or none), the partial NeoX
// RoPE of both, and the split of Qwen3-Next's gated query projection into q and gate.
// Appended after norm.cu in the NORM module (kernels/src/cuda/compile.rs); launch wrapper
// `CudaKernels::qk_prep` (kernels/src/cuda/ops.rs).
//
// Why: at decode these were six launches an attention layer (two column copies, two norms, two
// RoPEs) of ≈ 1.2–1.4 µs each in place and almost no bytes (session 23's knock-in table).
//
// Same values, bit for bit, as those kernels in that order: the norm is rms_norm_pdl's register
// path with the block size its wrapper picks for a row of hd (row_threads(hd, 512) threads, one
// element a thread, block_sum), its output rounded to T; the RoPE is rope_neox_impl's
// expressions on those rounded values; the gate is copied unchanged.
//
// qg: token r's row at qg + r·qs, [heads, hd·(1 + gated)] (T: per head [q | gate] when gated,
// else q); k: token r's row at k + r·ks, [kvh, hd] (T); v (packed projections only, else
// null): token r's row at v + r·vs, [kvh, hd], copied to v_out [t, kvh, hd] unchanged. Apart
// projections have qs = heads·hd·(1 + gated), ks = kvh·hd; a packed [T, q | k | v] projection
// (one GEMV for the three) has qs = ks = vs = its row width and k, v point into it.
// qw, kw [hd] (T, the norms' weights; unused without the norm); positions [t]; inv_freq [half]
// (f32); q_out [t, heads, hd], k_out [t, kvh, hd], gate_out [t, heads, hd] (T, gated only).
// flags: bit 0 q norm, bit 1 q norm zero-centred, bit 2 k norm, bit 3 k norm zero-centred,
// bit 4 gated. half = rot_dim / 2 (dims 2·half..hd pass through).
// grid (heads + kvh (+ kvh with v), t), block blockDim.x >= hd (a multiple of 32, at most 512):
// block (u, r) prepares head u of q (u < heads) or head u − heads of k of token r, or copies
// head u − heads − kvh of v.
template <typename T>
__device__ __forceinline__ void qk_prep_impl_pdl(const T* __restrict__ qg, const T* __restrict__ k,
                                             const T* __restrict__ vsrc, const T* __restrict__ qw,
                                             const T* __restrict__ kw, T* __restrict__ q_out, T* __restrict__ k_out,
                                             T* __restrict__ v_out, T* __restrict__ gate_out,
                                             const u32* __restrict__ positions, const float* __restrict__ inv_freq,
                                             u64 qs, u64 ks, u64 vs, u32 heads, u32 kvh, u32 hd, u32 half,
                                             float attn_scale, float q_eps, float k_eps, u32 flags) {
    __shared__ float sh[32];
    __shared__ float row[512];
    const u32 u = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
    const u64 r = blockIdx.y;
    if (u >= heads + kvh) {
        // A packed projection's v head: copied out unchanged (the whole block returns here).
        porter_pdl_enter();
        const u64 j = u - heads - kvh;
        if (tid < hd) v_out[(r * kvh + j) * hd + tid] = vsrc[r * vs + j * hd + tid];
        return;
    }
    const bool isq = u < heads, gated = (flags >> 4) & 1;
    const u32 sh_bits = isq ? flags : flags >> 2;
    const bool norm = sh_bits & 1, zc = (sh_bits >> 1) & 1;
    const float eps = isq ? q_eps : k_eps;
    const T* src = isq ? qg + r * qs + (u64)u * hd * (gated ? 2u : 1u) : k + r * ks + (u64)(u - heads) * hd;
    T* dst = isq ? q_out + (r * heads + u) * (u64)hd : k_out + (r * kvh + (u - heads)) * (u64)hd;
    // The norm weight before the wait (weights never change), as rms_norm_pdl does.
    const float wv = norm && tid < hd ? to_f((isq ? qw : kw)[tid]) : 0.0f;
    porter_pdl_enter();
    float v = tid < hd ? to_f(src[tid]) : 0.0f;
    if (norm) {
        // rms_norm_pdl's register path at one element a thread: the same sum, the same bits.
        float ss = 0.0f;
        ss += v * v;
        ss = block_sum(ss, sh, tid, nt);
        const float inv = 1.0f / sqrtf(ss / (float)hd + eps);
        v = zc ? round_to<T>(v * inv * (1.0f + wv)) : round_to<T>(wv * round_to<T>(v * inv));
    }
    if (tid < hd) row[tid] = v;
    __syncthreads();
    if (tid < half) {
        // rope_neox_impl's pair (tid, tid + half).
        const float a = (float)positions[r] * inv_freq[tid];
        float s, c;
        sincosf(a, &s, &c);
        c = round_to<T>(c * attn_scale);
        s = round_to<T>(s * attn_scale);
        const float x1 = row[tid], x2 = row[tid + half];
        dst[tid] = from_f<T>(x1 * c - x2 * s);
        dst[tid + half] = from_f<T>(x2 * c + x1 * s);
    } else if (tid >= 2 * half && tid < hd) {
        dst[tid] = from_f<T>(v);
    }
    if (isq && gated && tid < hd) gate_out[(r * heads + u) * (u64)hd + tid] = src[hd + tid];
}

#define QK_PREP(T, NAME)                                                                                        \
    extern "C" __global__ void __launch_bounds__(512) qk_prep_##NAME(                                          \
        const T* qg, const T* k, const T* v, const T* qw, const T* kw, T* q_out, T* k_out, T* v_out, T* gate_out,  \
        const u32* positions, const float* inv_freq, u64 qs, u64 ks, u64 vs, u32 heads, u32 kvh, u32 hd, u32 half,  \
        float attn_scale, float q_eps, float k_eps, u32 flags) {                                                \
        qk_prep_impl_pdl<T>(qg, k, v, qw, kw, q_out, k_out, v_out, gate_out, positions, inv_freq, qs, ks, vs, heads, \
                            kvh, hd, half, attn_scale, q_eps, k_eps, flags);                                    \
    }
QK_PREP(float, f32)
QK_PREP(bf16, bf16)
QK_PREP(f16, f16)

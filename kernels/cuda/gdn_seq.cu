// Gated DeltaNet kernels of Qwen3-Next for batches of sequences ("spans": one
// sequence's run of consecutive rows of a batch): causal conv1d + SiLU over a
// per-slot window of raw inputs, gates from the fused [b | a] projection, and
// the gated delta rule over many tokens (recurrent form, optional per-token
// snapshots of the state). Semantics of porter_kernels::cpu::gdn; all math in
// f32. Preceded by common.cuh. Launch wrappers: kernels/src/cuda/gdn_seq.rs.

__device__ __forceinline__ float gs_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float gs_decay(float x) { return x < -60.0f ? 0.0f : expf(x); }

// ---------------------------------------------------------------------------
// Causal conv1d + SiLU over spans, reading the history from a window pool.
// x [t, x_stride] (T; channels are columns 0..c); w [c, k] (f32);
// window [num_slots, c, win] (f32, oldest first); spans [n_spans, 4] =
// (row0, len, slot, lag); out [t, c] (f32).
// Span rows see u = window[slot, ch, 0..win−lag] ++ x[row0.., ch]; the output
// of span position p is silu(Σ_{i<k} w[ch, i] · u[H + p − (k−1) + i]) with
// H = win − lag. An invalid span (slot >= num_slots, rows past t, lag too
// large) gives NaN rows and leaves the window alone. Rows outside every span
// are not written.
// grid (ceil(t / CONV_ROWS), ceil(c / 256)), block 256: thread = channel.
// ---------------------------------------------------------------------------
#define CONV_ROWS 16
#define CONV_MAXK 8
#define CONV_THREADS 256

__device__ __forceinline__ bool conv_span_ok(const u32* sp, u32 t, u32 k, u32 win, u32 num_slots) {
    return sp[2] < num_slots && (u64)sp[0] + sp[1] <= t && sp[3] + (k - 1) <= win;
}

template <typename T>
__device__ __forceinline__ void gdn_conv_seq_impl(const T* __restrict__ x, u32 x_stride, const float* __restrict__ w,
                                                  const float* __restrict__ window, const u32* __restrict__ spans,
                                                  float* __restrict__ out, u32 t, u32 n_spans, u32 c, u32 k, u32 win,
                                                  u32 num_slots) {
    __shared__ int row_span[CONV_ROWS];
    const u32 tid = threadIdx.x;
    const u32 r0 = blockIdx.x * CONV_ROWS;
    if (tid < CONV_ROWS) row_span[tid] = -1;
    __syncthreads();
    for (u32 s = tid; s < n_spans; s += blockDim.x) {
        const u32 a = spans[4 * s], len = spans[4 * s + 1];
        const u64 e = (u64)a + len;
        const u32 lo = a > r0 ? a : r0;
        const u64 hi = e < (u64)r0 + CONV_ROWS ? e : (u64)r0 + CONV_ROWS;
        for (u64 r = lo; r < hi; ++r) row_span[r - r0] = (int)s;
    }
    __syncthreads();
    const u32 ch = blockIdx.y * blockDim.x + tid;
    if (ch >= c) return;
    float wr[CONV_MAXK];
#pragma unroll
    for (u32 i = 0; i < CONV_MAXK; ++i) wr[i] = i < k ? w[(u64)ch * k + i] : 0.0f;
    for (u32 rr = 0; rr < CONV_ROWS; ++rr) {
        const u32 r = r0 + rr;
        if (r >= t) break;
        const int s = row_span[rr];
        if (s < 0) continue;
        const u32* sp = spans + 4 * (u32)s;
        if (!conv_span_ok(sp, t, k, win, num_slots)) {
            out[(u64)r * c + ch] = PORTER_NAN;
            continue;
        }
        const u32 row0 = sp[0], slot = sp[2], lag = sp[3];
        const int p = (int)(r - row0);
        const int h = (int)(win - lag);
        const float* wnd = window + ((u64)slot * c + ch) * win;
        float acc = 0.0f;
#pragma unroll
        for (u32 i = 0; i < CONV_MAXK; ++i) {
            if (i < k) {
                const int j = p + (int)i - (int)(k - 1);
                const float v = j >= 0 ? to_f(x[(u64)(row0 + j) * x_stride + ch]) : wnd[h + j];
                acc += wr[i] * v;
            }
        }
        out[(u64)r * c + ch] = silu_f(acc);
    }
}

// The window update after gdn_conv_seq (a separate launch on the same stream,
// so that every output has read the old window): the slot's window becomes the
// last `win` entries of (effective history ++ span inputs), zeros where that
// sequence is shorter than `win`. grid (ceil(c / 256), n_spans), block 256.
template <typename T>
__device__ __forceinline__ void gdn_conv_seq_window_impl(const T* __restrict__ x, u32 x_stride,
                                                         float* __restrict__ window, const u32* __restrict__ spans,
                                                         u32 t, u32 c, u32 k, u32 win, u32 num_slots) {
    const u32 ch = blockIdx.x * blockDim.x + threadIdx.x;
    const u32* sp = spans + 4 * blockIdx.y;
    if (ch >= c || !conv_span_ok(sp, t, k, win, num_slots)) return;
    const u32 row0 = sp[0], len = sp[1], slot = sp[2], lag = sp[3];
    if (len == 0 && lag == 0) return;
    float* wnd = window + ((u64)slot * c + ch) * win;
    const long long h = (long long)win - lag;  // effective history length
    const long long shift = (long long)len - lag;  // new[w] = u[w + shift]
    // u[j]: j < 0 → 0, j < h → old window, else input row j − h.
    if (shift >= 0) {
        for (u32 wi = 0; wi < win; ++wi) {
            const long long j = (long long)wi + shift;
            wnd[wi] = j < h ? wnd[j] : to_f(x[(u64)(row0 + (j - h)) * x_stride + ch]);
        }
    } else {  // reads lower indices: go down
        for (u32 wi = win; wi-- > 0;) {
            const long long j = (long long)wi + shift;
            wnd[wi] = j < 0 ? 0.0f : j < h ? wnd[j] : to_f(x[(u64)(row0 + (j - h)) * x_stride + ch]);
        }
    }
}

#define GDN_CONV_SEQ(T, NAME)                                                                                       \
    extern "C" __global__ void __launch_bounds__(CONV_THREADS)                                                     \
        gdn_conv_seq_##NAME(const T* x, u32 x_stride, const float* w, const float* window, const u32* spans,      \
                            float* out, u32 t, u32 n_spans, u32 c, u32 k, u32 win, u32 num_slots) {                \
        gdn_conv_seq_impl<T>(x, x_stride, w, window, spans, out, t, n_spans, c, k, win, num_slots);               \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(CONV_THREADS)                                                     \
        gdn_conv_seq_window_##NAME(const T* x, u32 x_stride, float* window, const u32* spans, u32 t, u32 c, u32 k, \
                                   u32 win, u32 num_slots) {                                                       \
        gdn_conv_seq_window_impl<T>(x, x_stride, window, spans, t, c, k, win, num_slots);                          \
    }
GDN_CONV_SEQ(float, f32)
GDN_CONV_SEQ(bf16, bf16)
GDN_CONV_SEQ(f16, f16)

// ---------------------------------------------------------------------------
// Gates from the fused projection: ba [t, 2·hv] rows [b | a] (T);
// g = −exp(a_log) · softplus(a + dt_bias) (threshold 20), beta = σ(b);
// g, beta [t, hv] (f32). n = t·hv.
// ---------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void gdn_gates_ba_impl(const T* __restrict__ ba, const float* __restrict__ a_log,
                                                  const float* __restrict__ dt_bias, float* __restrict__ g,
                                                  float* __restrict__ beta, u64 n, u32 hv, u32 stride) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const u64 r = i / hv;
        const u32 h = (u32)(i - r * hv);
        const T* row = ba + r * stride;
        const float b = to_f(row[h]), a = to_f(row[hv + h]);
        g[i] = -expf(a_log[h]) * gs_softplus(a + dt_bias[h]);
        beta[i] = sigmoid_f(b);
    }
}

#define GDN_GATES_BA(T, NAME)                                                                                   \
    extern "C" __global__ void gdn_gates_ba_##NAME(const T* ba, const float* a_log, const float* dt_bias,      \
                                                   float* g, float* beta, u64 n, u32 hv, u32 stride) {         \
        gdn_gates_ba_impl<T>(ba, a_log, dt_bias, g, beta, n, hv, stride);                                      \
    }
GDN_GATES_BA(float, f32)
GDN_GATES_BA(bf16, bf16)
GDN_GATES_BA(f16, f16)

// ---------------------------------------------------------------------------
// Gated delta rule over spans of tokens (recurrent form).
// qkv [t, 2·hk·dk + hv·dv] (f32 conv output: q at 0, k at hk·dk, v at 2·hk·dk);
// g, beta [t, hv] (f32); state pool [num_slots, nbuf, hv, dk, dv] (f32,
// k-major); spans [n_spans, 5] = (row0, len, slot, src_buf, snapshot);
// out [t, hv, dv] (T, rounded once).
// Per span and value head j (key head j / (hv / hk)), S = state[slot, src, j];
// per token: q, k L2-normalised (q also times q_scale), S ← exp(g)·S,
// δ = β (v − Sᵀk), S ← S + k ⊗ δ, out = Sᵀq; with snapshot ≠ 0 the state after
// token i goes to buffer i, else the final state back to buffer src.
// An invalid span (slot / src out of range, rows past t, a snapshot span
// longer than nbuf) gives NaN rows and leaves every state alone.
//
// Layout: each state column is split over P lanes of one warp (P = 1, 2, 4,
// 8), each holding R rows in registers (rows part·R .. part·R + R − 1, those
// >= dk are zero); the warp holds 32/P columns, the block blockDim.x/P
// columns. Per token, the partial Sᵀk and Sᵀq are summed over the P lanes with
// shuffles; there is no block-wide reduction. Tokens are processed in tiles
// of DS_TT: the tile's normalised q and k (all dk rows, padded per part),
// the block's v columns, decay and β are staged in shared memory at once.
// grid (ceil(dv / (blockDim.x / P)), hv, n_spans).
// ---------------------------------------------------------------------------
#define DS_TT 16
#define DS_PAD 4
#define DS_GROUP 8

// Rows part·R .. part·R + R − 1 (those < dk) of column c of a [dk, dv] state,
// to / from registers. The empty asm hides the pointer from the optimiser, so
// that it cannot hoist R row addresses out of the token loop into registers.
template <int R>
__device__ __forceinline__ void store_rows(const float (&S)[R], float* base, u32 part, u32 dk, u32 dv, u32 c) {
    float* p = base + (u64)part * R * dv + c;
    const u32 n = dk > part * R ? dk - part * R : 0;
#pragma unroll
    for (int m = 0; m < R; ++m) {
        if ((u32)m < n) *p = S[m];
        p += dv;
        asm volatile("" : "+l"(p));
    }
}
template <int R>
__device__ __forceinline__ void load_rows(float (&S)[R], const float* base, bool active, u32 part, u32 dk, u32 dv,
                                          u32 c) {
    const float* p = base + (u64)part * R * dv + c;
    const u32 n = active && dk > part * R ? dk - part * R : 0;
#pragma unroll
    for (int m = 0; m < R; ++m) {
        S[m] = (u32)m < n ? *p : 0.0f;
        p += dv;
        asm volatile("" : "+l"(p));
    }
}

__device__ __forceinline__ bool delta_span_ok(const u32* sp, u32 t, u32 num_slots, u32 nbuf) {
    return sp[2] < num_slots && sp[3] < nbuf && (u64)sp[0] + sp[1] <= t && (sp[4] == 0 || sp[1] <= nbuf);
}

template <typename T, int R>
__device__ __forceinline__ void gdn_delta_seq_impl(const float* __restrict__ qkv, const float* __restrict__ g,
                                                   const float* __restrict__ beta, float* __restrict__ state,
                                                   const u32* __restrict__ spans, T* __restrict__ out, u32 t,
                                                   u32 hk, u32 hv, u32 dk, u32 dv, u32 num_slots, u32 nbuf, u32 P,
                                                   float q_scale) {
    extern __shared__ float4 ds_smem4[];
    float* smem = reinterpret_cast<float*>(ds_smem4);
    const u32 nt = blockDim.x, tid = threadIdx.x, lane = tid & 31u, wid = tid >> 5, nw = nt >> 5;
    const u32 cpw = 32u / P;  // columns per warp
    const u32 cb = nt / P;    // columns per block
    const u32 part = lane / cpw;
    const u32 cib = wid * cpw + lane % cpw;  // column in block
    const u32 c = blockIdx.x * cb + cib;
    const bool active = c < dv;
    const u32 j = blockIdx.y, kh = j / (hv / hk);
    const u32* sp = spans + 5 * blockIdx.z;
    const u32 row0 = sp[0], len = sp[1], slot = sp[2], src = sp[3], snap = sp[4];
    const u64 rw = 2ull * hk * dk + (u64)hv * dv;  // qkv row width

    if (!delta_span_ok(sp, t, num_slots, nbuf)) {
        if (part == 0 && active) {
            const u64 e = (u64)row0 + len < t ? (u64)row0 + len : t;
            for (u64 r = row0; r < e; ++r) out[(r * hv + j) * dv + c] = from_f<T>(PORTER_NAN);
        }
        return;
    }
    if (len == 0) return;

    const u32 rs = R + DS_PAD;      // row stride of a part in the staged q / k
    const u32 ts = P * rs;          // stride of a token
    float* qs = smem;               // [DS_TT][P][R + PAD]
    float* ks = qs + DS_TT * ts;    // [DS_TT][P][R + PAD]
    float* vs = ks + DS_TT * ts;    // [DS_TT][cb]
    float* as = vs + DS_TT * cb;    // [DS_TT]
    float* bs = as + DS_TT;         // [DS_TT]

    const u64 hs = (u64)dk * dv;  // one head's state
    const u64 bufs = (u64)hv * hs;  // one buffer
    float* slot_base = state + (u64)slot * nbuf * bufs + (u64)j * hs;

    float S[R];
    load_rows<R>(S, slot_base + (u64)src * bufs, active, part, dk, dv, c);

    for (u32 t0 = 0; t0 < len; t0 += DS_TT) {
        const u32 tl = len - t0 < DS_TT ? len - t0 : DS_TT;
        __syncthreads();  // the previous tile is consumed
        // q, k of the tile: one warp per token, normalised, padded per part.
        for (u32 tt = wid; tt < tl; tt += nw) {
            const float* qr = qkv + (u64)(row0 + t0 + tt) * rw + (u64)kh * dk;
            const float* kr = qr + (u64)hk * dk;
            float sq = 0.0f, sk = 0.0f;
            for (u32 i = lane; i < dk; i += 32) {
                const float qv = qr[i], kv = kr[i];
                sq += qv * qv;
                sk += kv * kv;
            }
            sq = warp_sum(sq);
            sk = warp_sum(sk);
            const float fq = (1.0f / sqrtf(sq + 1e-6f)) * q_scale;
            const float fk = 1.0f / sqrtf(sk + 1e-6f);
            for (u32 i = lane; i < P * R; i += 32) {
                const u32 o = tt * ts + (i / R) * rs + i % R;
                qs[o] = i < dk ? qr[i] * fq : 0.0f;
                ks[o] = i < dk ? kr[i] * fk : 0.0f;
            }
        }
        for (u32 x = tid; x < tl * cb; x += nt) {
            const u32 tt = x / cb, cc = x % cb, cg = blockIdx.x * cb + cc;
            vs[x] = cg < dv ? qkv[(u64)(row0 + t0 + tt) * rw + 2ull * hk * dk + (u64)j * dv + cg] : 0.0f;
        }
        if (tid < tl) {
            const u64 gi = (u64)(row0 + t0 + tid) * hv + j;
            as[tid] = gs_decay(g[gi]);
            bs[tid] = beta[gi];
        }
        __syncthreads();

        for (u32 tt = 0; tt < tl; ++tt) {
            const float a = as[tt], b = bs[tt];
            // q / k are read through a pointer that is hidden from the optimiser
            // every DS_GROUP rows, so that loads are not all hoisted ahead of the
            // FMAs (R registers each).
            const float4* k4 = reinterpret_cast<const float4*>(ks + tt * ts + part * rs);
            const u32 qo = DS_TT * ts / 4;  // q is qo float4s before k
            // Decay, then Sᵀk.
            float p0 = 0.0f, p1 = 0.0f, p2 = 0.0f, p3 = 0.0f;
            {
                const float4* kp = k4;
#pragma unroll
                for (int m = 0; m < R; m += 4) {
                    if (m % DS_GROUP == 0) asm volatile("" : "+l"(kp));
                    const float4 kk = kp[m / 4];
                    S[m] *= a;
                    S[m + 1] *= a;
                    S[m + 2] *= a;
                    S[m + 3] *= a;
                    p0 = fmaf(kk.x, S[m], p0);
                    p1 = fmaf(kk.y, S[m + 1], p1);
                    p2 = fmaf(kk.z, S[m + 2], p2);
                    p3 = fmaf(kk.w, S[m + 3], p3);
                }
            }
            float kv = (p0 + p1) + (p2 + p3);
            for (u32 o = 16; o >= cpw; o >>= 1) kv += __shfl_xor_sync(0xffffffffu, kv, o);
            const float delta = b * (vs[tt * cb + cib] - kv);
            // Rank-1 update, then Sᵀq.
            p0 = p1 = p2 = p3 = 0.0f;
            {
                const float4* kp = k4;
#pragma unroll
                for (int m = 0; m < R; m += 4) {
                    if (m % DS_GROUP == 0) asm volatile("" : "+l"(kp));
                    const float4 kk = kp[m / 4];
                    const float4 qq = kp[m / 4 - (int)qo];
                    S[m] = fmaf(kk.x, delta, S[m]);
                    S[m + 1] = fmaf(kk.y, delta, S[m + 1]);
                    S[m + 2] = fmaf(kk.z, delta, S[m + 2]);
                    S[m + 3] = fmaf(kk.w, delta, S[m + 3]);
                    p0 = fmaf(qq.x, S[m], p0);
                    p1 = fmaf(qq.y, S[m + 1], p1);
                    p2 = fmaf(qq.z, S[m + 2], p2);
                    p3 = fmaf(qq.w, S[m + 3], p3);
                }
            }
            float o = (p0 + p1) + (p2 + p3);
            for (u32 d = 16; d >= cpw; d >>= 1) o += __shfl_xor_sync(0xffffffffu, o, d);
            const u32 row = row0 + t0 + tt;
            if (part == 0 && active) out[((u64)row * hv + j) * dv + c] = from_f<T>(o);
            if (snap && active) store_rows<R>(S, slot_base + (u64)(t0 + tt) * bufs, part, dk, dv, c);
        }
    }
    if (!snap && active) store_rows<R>(S, slot_base + (u64)src * bufs, part, dk, dv, c);
}

#define GDN_DELTA_SEQ(T, NAME, R)                                                                                  \
    extern "C" __global__ void __launch_bounds__(256) gdn_delta_seq_r##R##_##NAME(                                 \
        const float* qkv, const float* g, const float* beta, float* state, const u32* spans, T* out, u32 t, u32 hk, \
        u32 hv, u32 dk, u32 dv, u32 num_slots, u32 nbuf, u32 P, float q_scale) {                                   \
        gdn_delta_seq_impl<T, R>(qkv, g, beta, state, spans, out, t, hk, hv, dk, dv, num_slots, nbuf, P, q_scale);  \
    }
#define GDN_DELTA_SEQ_ALL(R) GDN_DELTA_SEQ(float, f32, R) GDN_DELTA_SEQ(bf16, bf16, R) GDN_DELTA_SEQ(f16, f16, R)
GDN_DELTA_SEQ_ALL(16)
GDN_DELTA_SEQ_ALL(32)
GDN_DELTA_SEQ_ALL(64)
GDN_DELTA_SEQ_ALL(128)

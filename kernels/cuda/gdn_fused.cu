// Gated DeltaNet decode / speculative-verify step in one launch (gdn_fused_seq_*): the causal
// conv + SiLU with its window update, the gates, the L2-normalised q / k, the gated delta rule
// and the gated RMSNorm with SiLU(z), over spans of a few tokens. Appended after gdn_seq.cu
// (conv_out, conv_window_update, stage_qk, delta_token, load_rows / store_rows, the span
// checks) and gdn_norm.cu (gated_norm_row) in the GDN_SEQ module. Launch wrapper:
// kernels/src/cuda/gdn_fused.rs.
//
// Why: at decode these were three launches (gdn_conv_gates_seq, gdn_delta_seq, gated_norm_z) of
// a few µs each for almost no bytes besides the state (H200, 80B geometry, batch 1: 4.4, 6.8
// and 2.6 µs a layer). Every value is computed by the same expressions in the same order as
// those kernels, with the delta rule's lanes per column (P) and rows per lane (R) chosen by the
// host from the head sizes alone, so the outputs, states and windows are theirs bit for bit
// whenever the separate delta-rule launch picks the same P. Opt-in (PORTER_GDN_FUSED=on): alone it
// is 6.5–9.7 µs against 13.9 at batch 1, but in the model, where the three launches overlap the
// GEMVs around them under PDL, decode was no faster (docs/benchmarks.md, session 15).
//
// Layout: block (value head j, span s); thread = (column, part) as gdn_delta_seq's (P lanes a
// column, R state rows a lane, 32 / P columns a warp, all dv columns of head j in the block),
// and thread i owns conv channels i, i + threads, … of the 2·dk + dv of its heads: q channel c,
// k channel c − dk of key head kh = j / (hv / hk), then v channel c − 2·dk of head j. Per token: the conv outputs go to
// shared memory, warp 0 normalises and stages q / k (stage_qk), every column runs one delta
// step (delta_token), the rounded outputs go to shared memory and warp 0 writes the gated
// norm of the row (gated_norm_row).
//
// The conv window: the v channels belong to this block alone and are updated by it at the
// end. The q / k channels of key head kh are read by all hv / hk blocks of its value heads, so
// they are updated by the last of those blocks to arrive (an atomic count per (slot, key
// head), counters[slot·hk + kh], reset to zero by that block): each block copies its channels'
// windows to shared memory, then counts itself in, so no block reads a window after it was
// rewritten. Spans use distinct slots.
//
// Span s = spans[s] = (row0, len, slot, lag, src_buf, snapshot): the conv continues the
// slot's window with the newest `lag` entries rolled back (gdn_conv_gates_seq), the delta rule
// starts from state buffer src_buf and, with snapshot != 0, stores the state after token i in
// buffer i (gdn_delta_seq). A span that either kernel would refuse gives NaN rows and leaves
// the window and every state alone. x [t, x_stride] (T): the conv channels at columns 0..c, z
// at zoff..zoff + hv·dv; ba [t, ba_stride] (T), [b | a] at ba_col; w [c, k] (f32); window
// [num_slots, c, win] (f32); state [num_slots, nbuf, hv, dk, dv] (f32); norm_w [dv] (T);
// out [t, hv, dv] (T); counters [num_slots, hk] (u32, zero between launches).
// grid (hv, n_spans), block 32 · ceil(dv / (32 / P)) threads, at most GF_THREADS_R / R.
// Dynamic shared memory (floats): q, k staged [P][R + DS_PAD] each; the conv outputs
// [2·dk + dv]; decay and β [4]; the rounded outputs [dv] (T); the windows [2·dk + dv][win];
// the conv weights [2·dk + dv][CONV_MAXK].

template <typename T, int R>
__device__ __forceinline__ void gdn_fused_seq_impl_pdl(
    const T* __restrict__ x, u32 x_stride, const T* __restrict__ ba, u32 ba_stride, u32 ba_col,
    const float* __restrict__ cw, float* __restrict__ window, const float* __restrict__ a_log,
    const float* __restrict__ dt_bias, float* __restrict__ state, const u32* __restrict__ spans,
    const T* __restrict__ norm_w, T* __restrict__ out, u32* __restrict__ counters, u32 t, u32 c, u32 k, u32 win,
    u32 num_slots, u32 nbuf, u32 hk, u32 hv, u32 dk, u32 dv, u32 P, float q_scale, u32 zoff, float eps) {
    extern __shared__ float4 gf_smem4[];
    __shared__ int last;  // this block rewrites the q / k windows
    float* smem = reinterpret_cast<float*>(gf_smem4);
    const u32 tid = threadIdx.x, lane = tid & 31u, wid = tid >> 5;
    const u32 cpw = 32u / P, part = lane / cpw;
    const u32 col = wid * cpw + lane % cpw;  // column of value head j
    const bool active = col < dv;
    const u32 j = blockIdx.x, grp = hv / hk, kh = j / grp;
    const u32* sp = spans + 6 * blockIdx.y;
    const u32 row0 = sp[0], len = sp[1], slot = sp[2], lag = sp[3], src = sp[4], snap = sp[5];
    // conv_span_ok, and delta_span_ok's further conditions (a table of its own in registers
    // would go to the stack).
    const bool ok = conv_span_ok(sp, t, k, win, num_slots) && src < nbuf && (snap == 0 || len <= nbuf);

    const u32 nch = 2 * dk + dv, rs = R + DS_PAD;
    float* qs = smem;                  // [P][R + PAD]
    float* ks = qs + P * rs;           // [P][R + PAD]
    float* conv_s = ks + P * rs;       // [nch]
    float* gb = conv_s + nch;          // decay, β
    T* o_s = reinterpret_cast<T*>(gb + 4);  // [dv]
    float* wnd_s = gb + 4 + dv;        // [nch][win]
    float* w_s = wnd_s + nch * win;    // [nch][CONV_MAXK]

    // Conv channel i: q channel i, k channel i − dk of key head kh, then v channel i − 2·dk of
    // head j; thread tid owns i = tid, tid + nt, ….
    const u32 nt = blockDim.x;
    auto chan = [&](u32 i) -> u32 {
        return i < dk ? kh * dk + i : i < 2 * dk ? hk * dk + kh * dk + (i - dk) : 2 * hk * dk + j * dv + (i - 2 * dk);
    };
    const u64 hs = (u64)dk * dv, bufs = (u64)hv * hs;
    float* slot_base = state + (u64)slot * nbuf * bufs + (u64)j * hs;
    float* slot_win = window + (u64)slot * c * win;

    // Before the PDL wait: only weights, this layer's state and windows (written by an earlier
    // step, at least two launches back: see gdn_delta_seq) and the counters (this kernel's
    // own, zero since the last launch of it finished) are touched. The inputs x and ba (the
    // projections, the launch before) are read after the wait.
    float S[R];
    for (u32 i = tid; i < nch; i += nt) {
        const u32 ch = chan(i);
        for (u32 m = 0; m < CONV_MAXK; ++m) w_s[i * CONV_MAXK + m] = m < k ? cw[(u64)ch * k + m] : 0.0f;
        if (ok)
            for (u32 w = 0; w < win; ++w) wnd_s[i * win + w] = slot_win[(u64)ch * win + w];
    }
    if (ok && len != 0) load_rows<R>(S, slot_base + (u64)src * bufs, active, part, dk, dv, col);
    __syncthreads();  // every window this block reads is in shared memory
    if (tid == 0) {
        int l = 0;
        if (ok) {
            __threadfence();
            u32* cn = counters + (u64)slot * hk + kh;
            l = atomicAdd(cn, 1u) == grp - 1;
            if (l) atomicExch(cn, 0u);
        }
        last = l;
    }
    porter_pdl_enter();

    if (!ok) {
        if (part == 0 && active) {
            const u64 e = (u64)row0 + len < t ? (u64)row0 + len : t;
            for (u64 r = row0; r < e; ++r) out[(r * hv + j) * dv + col] = from_f<T>(PORTER_NAN);
        }
        return;
    }
    for (u32 tt = 0; tt < len; ++tt) {
        const u64 r = (u64)row0 + tt;
        for (u32 i = tid; i < nch; i += nt) {
            // The weights from shared memory for the conv alone (registers are the state's).
            float wr[CONV_MAXK];
#pragma unroll
            for (u32 m = 0; m < CONV_MAXK; ++m) wr[m] = w_s[i * CONV_MAXK + m];
            // Rounded to T as gdn_conv_gates_seq writes its output.
            conv_s[i] =
                round_to<T>(conv_out<T>(x, x_stride, wr, wnd_s + i * win, row0, (int)tt, (int)(win - lag), k, chan(i)));
        }
        if (tid == nt - 1) {  // the gates (gdn_conv_gates_seq's, then the delta rule's decay)
            const T* brow = ba + r * ba_stride + ba_col;
            const float b = to_f(brow[j]), a = to_f(brow[hv + j]);
            gb[0] = gs_decay(-expf(a_log[j]) * gs_softplus(a + dt_bias[j]));
            gb[1] = sigmoid_f(b);
        }
        __syncthreads();
        if (wid == 0) stage_qk(conv_s, conv_s + dk, qs, ks, dk, P, R, q_scale, lane);
        __syncthreads();
        const float4* k4 = reinterpret_cast<const float4*>(ks + part * rs);
        const float v = active ? conv_s[2 * dk + col] : 0.0f;
        const float o = delta_token<R>(S, k4, P * rs / 4, gb[0], gb[1], v, cpw);
        if (part == 0 && active) o_s[col] = from_f<T>(o);
        if (snap && active) store_rows<R>(S, slot_base + (u64)tt * bufs, part, dk, dv, col);
        __syncthreads();
        if (wid == 0) gated_norm_row<T>(o_s, x + r * x_stride + zoff + (u64)j * dv, norm_w, out + (r * hv + j) * dv, dv, eps, lane);
    }
    if (!snap && active && len != 0) store_rows<R>(S, slot_base + (u64)src * bufs, part, dk, dv, col);
    __syncthreads();  // `last` (a span without tokens has had no barrier since it was set)
    for (u32 i = tid; i < nch; i += nt) {
        const u32 ch = chan(i);
        if (i >= 2 * dk || last) conv_window_update<T>(x, x_stride, slot_win + (u64)ch * win, row0, len, lag, win, ch);
    }
}

// Threads × state rows a lane of a block at most (GF_THREAD_ROWS in gdn_fused.rs): 1024 threads
// at R = 16 … 128 at R = 128, so that a block's state registers stay within the register file's
// share that lets other grids' blocks stay resident beside it.
#define GF_THREADS_R 16384
#define GDN_FUSED_SEQ(T, NAME, R)                                                                                   \
    extern "C" __global__ void __launch_bounds__(GF_THREADS_R / R) gdn_fused_seq_r##R##_##NAME(                                 \
        const T* x, u32 x_stride, const T* ba, u32 ba_stride, u32 ba_col, const float* cw, float* window,          \
        const float* a_log, const float* dt_bias, float* state, const u32* spans, const T* norm_w, T* out,          \
        u32* counters, u32 t, u32 c, u32 k, u32 win, u32 num_slots, u32 nbuf, u32 hk, u32 hv, u32 dk, u32 dv,       \
        u32 P, float q_scale, u32 zoff, float eps) {                                                                \
        gdn_fused_seq_impl_pdl<T, R>(x, x_stride, ba, ba_stride, ba_col, cw, window, a_log, dt_bias, state, spans,  \
                                     norm_w, out, counters, t, c, k, win, num_slots, nbuf, hk, hv, dk, dv, P,       \
                                     q_scale, zoff, eps);                                                           \
    }
#define GDN_FUSED_SEQ_ALL(R) GDN_FUSED_SEQ(float, f32, R) GDN_FUSED_SEQ(bf16, bf16, R) GDN_FUSED_SEQ(f16, f16, R)
GDN_FUSED_SEQ_ALL(16)
GDN_FUSED_SEQ_ALL(32)
GDN_FUSED_SEQ_ALL(64)
GDN_FUSED_SEQ_ALL(128)

// Causal GQA attention, tensor-core prefill path on raw mma.sync: appended to attention.cu
// after attention_tc.cu (same module, kernels/src/cuda/compile.rs), whose helpers it uses
// (key_slot, PagedKv, cp_async16, atc_load8, bits16; kvq_load8 from kv_quant.cu).

// ---------------------------------------------------------------------------
// Attention, FlashAttention-2 in registers (bf16 / f16, head_dim a multiple of 16)
// ---------------------------------------------------------------------------
//
// The same items, tiles, paging, masking and zero-fill as attention_tc_impl (the wmma
// form, kept as the A/B baseline): a block of NW warps takes BM = 16·NW items (query row,
// query head of the group; row-major, so the heads of a GQA group share the K/V tiles) of
// one sequence and one KV head; warp w owns items 16w..16w+15; BN-key K/V tiles are staged
// with cp.async into two buffers (the next tile loads while this one is used); key tiles
// wholly outside a warp's causal / window range are skipped by the warp, those outside the
// block's by the block. What differs is that nothing but the tiles goes through shared
// memory: everything per warp lives in the registers of mma.sync.m16n8k16 fragments.
//
// Fragments (g = lane / 4, t = lane % 4): an m16n8 f32 accumulator holds (row g, columns
// 2t, 2t+1) in c0, c1 and (row g + 8, the same columns) in c2, c3; an m16k16 A operand
// holds (row g, k 2t, 2t+1), (row g + 8, k 2t..), (row g, k 2t+8..), (row g + 8, k 2t+8..)
// as four pairs of 16-bit values; a k16n8 B operand (k 2t, 2t+1; column g) and (k 2t+8..).
// - S = Q·Kᵀ: A = the warp's 16 Q rows × 16 dims, ldmatrix.x4 from the Q tile (re-read per
//   key tile: held in registers, Q would take DP/2 more registers a lane); B = K rows, which
//   are Kᵀ's columns, ldmatrix.x4 (non-transposed) from the K tile. S (16 × BN, f32) stays in
//   BN/2 accumulator registers a lane.
// - Online softmax in registers: a lane holds 2·BN/8 scores of rows g and g + 8; row maxima
//   are reduced over the 4 lanes of a quad (two xor shuffles); the row sums l stay per-lane
//   partial sums (the quad is summed once, at the end); O is rescaled in registers.
// - P·V: the accumulator layout of two adjacent S tiles (keys 16kk..16kk+15) is exactly the
//   A-operand layout of the m16n8k16 MMA, so P is packed to 16-bit pairs in registers, no
//   shared memory; B = V rows via ldmatrix.x4.trans (V is [key][dim], B wants k = key pairs).
//   P = P_hi + P_lo (both T; P_lo = round(p − P_hi)) and P·V runs as two MMAs, as in the wmma
//   form: with P in bf16 alone the output drifts by about one bf16 step from the f32
//   reference (see attention_tc.cu). The split costs a third of the MMAs; the `_p1` kernels
//   (P rounded once, one MMA; PORTER_ATTN_TC=mma1) exist to measure that cost and to let the
//   parity tests judge whether the split is needed.
// - O: 16 × DP f32 per warp, DP/2 accumulator registers a lane; at the end O / l is rounded
//   to T once into the warp's own rows of the Q tile (no longer read) and copied out in
//   16-byte row chunks.
// Register budget at DP = 256, BN = 64: O 128 + S 32 + P 8 + B 4 + ~40 of addresses and row
// state: under the 255 a thread may have at 8 warps / SM (__launch_bounds__ asks for 256
// threads a block; ptxas: 221 registers, no spills, nvrtc_attention_ptxas_info). Shared-memory
// traffic per warp and 64-key tile at DP = 256 (ldmatrix): Q 8 KiB + K 32 KiB + V 32 KiB for
// 384 MMAs (256 of them P·V), close to the MMA time at 128 B / clock: the 16-row warp tile is
// the smallest MMA M, and a taller one would not fit O in registers.
//
// Shared memory tiles are [rows][DP] of T with the 16-byte chunks XOR-swizzled by row
// (chunk c of row r at c ^ (r % 8)): the 8 rows an ldmatrix 8 × 8 matrix reads, and the 8
// chunks of a row that neighbouring threads store, fall into distinct bank groups, without
// padding (which would not fit two 64-key DP = 256 K/V buffers and a 64-row Q tile into an
// A100's 164 KiB). Dynamic shared memory (bytes): (BM + 4·BN)·DP·sizeof(T) + 2·BN·4 (the
// two key-slot tables). Configurations (NW, BN): (8, 64), one block of 8 warps an SM at
// DP = 256 (192 KiB), and (4, 32), two blocks of 4 warps an SM (96 KiB each), the latter
// also the form that fits sm_80 / sm_86 / sm_89 at DP = 256 (attention/tc.rs `plan`).
//
// Warp pairs (`_x2`, MI = DS = 2, DP = 256, 8 warps, BN = 32): the ldmatrix traffic above is
// what a 16-row warp tile costs; two warps sharing 32 rows, each holding O for 128 of the
// dims (2 m16 tiles × 16 n8 tiles = 128 registers), read each K / V fragment once for 32
// rows. Each computes S over its 128 dims, stores the partial (32 × 32 f32) to shared memory,
// meets its partner at a named barrier and adds the partner's: traffic per 32 × 32 tile and
// warp Q 8 + K 8 + V 8 + S 8 KiB, against 2 × 40 KiB for two 16-row warps over 256 dims.
// 250 registers, no spills; 160 KiB of shared memory (+ 32 KiB of S halves).

#if defined(PORTER_SM80)
// pm_sw, pm_ldsm[_t] and PMma<T> (the mma.sync helpers) are common.cuh's.

// P_hi = round(x, y), P_lo = round((x, y) − P_hi).
template <typename T>
__device__ __forceinline__ void amma_split(float x, float y, u32& hi, u32& lo) {
    hi = PMma<T>::pack(x, y);
    const float2 h = PMma<T>::unpack(hi);
    lo = PMma<T>::pack(x - h.x, y - h.y);
}
#endif

// Grid: (item tiles, n_seqs * kvh); 32·NW threads. D % 16 == 0, D <= DP. KQ as in
// attention_impl (quantized tiles are dequantized to T as they are stored, plain loads).
// PS: 2 splits P into P_hi + P_lo (two MMAs, the default); 1 rounds P to T once (one MMA:
// the A/B form that measures what the split costs, see the layout comment).
// MI m16 tiles (16·MI rows) per warp group of DS warps; DS = 2 splits head_dim between the
// two warps of a group (each holds O for DP/2 dims and computes S over them, the halves
// summed through shared memory), so that K / V fragments serve twice the rows.
template <typename T, int KQ, int DP, int NW, int BN, int PS, int MI, int DS>
__device__ __forceinline__ void attention_mma_impl(const T* __restrict__ q, const void* __restrict__ kpool_,
                                                   const void* __restrict__ vpool_, const u32* __restrict__ tables,
                                                   const u32* __restrict__ spans, T* __restrict__ out, u32 t,
                                                   u32 heads, u32 kvh, u32 D, float scale, u32 window, PagedKv kv,
                                                   const float* __restrict__ ksc, const float* __restrict__ vsc) {
    const T* kpool = reinterpret_cast<const T*>(kpool_);
    const T* vpool = reinterpret_cast<const T*>(vpool_);
    const unsigned char* kq = reinterpret_cast<const unsigned char*>(kpool_);
    const unsigned char* vq = reinterpret_cast<const unsigned char*>(vpool_);
#if defined(PORTER_SM80)
    static_assert(DP % 64 == 0 && (BN == 32 || BN == 64) && 32 * NW >= BN && (PS == 1 || PS == 2), "tile shape");
    static_assert((DS == 1 || DS == 2) && NW % DS == 0 && (MI == 1 || MI == 2), "warp groups");
    constexpr u32 THREADS = 32u * NW;
    constexpr u32 RW = 16u * MI;           // rows (items) per warp group
    constexpr u32 BM = RW * (NW / DS);     // items per block
    constexpr u32 CH = DP / 8;             // 16-byte chunks per row
    constexpr int DW = DP / DS;            // dims per warp
    constexpr int NS = BN / 8;             // S accumulator tiles (keys 8j..8j+7)
    constexpr int NO = DW / 8;             // O accumulator tiles per warp (dims 8f..8f+7)
    constexpr float LOG2E = 1.4426950408889634f;
    extern __shared__ __align__(128) unsigned char amma_smem[];

    const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    T* Qs = reinterpret_cast<T*>(amma_smem);
    T* Kb = Qs + BM * DP;      // [2][BN][DP]
    T* Vb = Kb + 2 * BN * DP;  // [2][BN][DP]
    u32* Sl = reinterpret_cast<u32*>(Vb + 2 * BN * DP);  // [2][BN] key slots
    float* Xs = reinterpret_cast<float*>(Sl + 2 * BN);   // DS == 2: [NW][MI·16·BN] partial S

    const u32 s = blockIdx.y / kvh, kh = blockIdx.y % kvh;
    const u32 row0 = spans[3 * s], qlen = spans[3 * s + 1], pos0 = spans[3 * s + 2];
    const u32 group = heads / kvh;
    const u32 rows_in = row0 < t ? min(qlen, t - row0) : 0;  // rows < t only
    const u32 n_items = rows_in * group;
    // Heaviest (latest) item tiles first.
    const u32 m0 = (gridDim.x - 1 - blockIdx.x) * BM;
    if (m0 >= n_items) return;
    const u32 m_last = min(m0 + BM, n_items) - 1;
    const u32 p_first = pos0 + m0 / group, p_last = pos0 + m_last / group;
    const u32 lo_first = (window != 0 && p_first + 1 > window) ? p_first + 1 - window : 0;
    const u32 jt0 = lo_first / BN, jt1 = p_last / BN;

    const u32* bt = tables + (u64)s * kv.max_blocks;
    const bool async =
        ((reinterpret_cast<u64>(kpool) | reinterpret_cast<u64>(vpool) | reinterpret_cast<u64>(q)) & 15u) == 0;
    const u64 kv_stride = (u64)kvh * D;

    // Q tile.
    for (u32 c = tid; c < BM * CH; c += THREADS) {
        const u32 slot = c / CH, ch = c % CH, d0 = ch * 8;
        const u32 m = m0 + slot;
        const bool ok = m <= m_last && d0 < D;
        const T* src = q;
        if (ok) src = q + ((u64)(row0 + m / group) * heads + kh * group + m % group) * D + d0;
        atc_load8(Qs + pm_sw<DP>(slot, ch), src, ok, async);
    }
    // Tile jt's K/V into buffer `buf`, through slot table `buf` (tile jt's slots).
    auto load_kv = [&](u32 jt, u32 buf) {
        T* kd = Kb + buf * BN * DP;
        T* vd = Vb + buf * BN * DP;
        const u32* sl = Sl + buf * BN;
        const u32 kbase = jt * BN;
#pragma unroll 4
        for (u32 c = tid; c < BN * CH; c += THREADS) {
            const u32 j = c / CH, ch = c % CH, d0 = ch * 8;
            const u32 kpos = kbase + j;
            const u32 ks = sl[j];
            const bool ok = kpos >= lo_first && kpos <= p_last && d0 < D && ks != ATT_NOSLOT;
            const u64 off = ok ? (u64)ks * kv_stride + (u64)kh * D + d0 : 0;
            const u32 at = pm_sw<DP>(j, ch);
            if constexpr (KQ != 0) {
                const u64 si = ok ? (u64)ks * kvh + kh : 0;
                const float ksv = ok ? __ldg(ksc + si) : 0.0f, vsv = ok ? __ldg(vsc + si) : 0.0f;
                kvq_load8<T, KQ>(kd + at, kq + off, ksv, ok);
                kvq_load8<T, KQ>(vd + at, vq + off, vsv, ok);
            } else {
                atc_load8(kd + at, kpool + off, ok, async);
                atc_load8(vd + at, vpool + off, ok, async);
            }
        }
    };
    // Slot tables of the first two tiles; tile jt + 2's is filled during tile jt.
    if (tid < (u32)BN) {
        Sl[tid] = key_slot(bt, jt0 * BN + tid, kv.max_blocks, kv.bs_log2, kv.n_slots);
        if (jt0 < jt1) Sl[BN + tid] = key_slot(bt, (jt0 + 1) * BN + tid, kv.max_blocks, kv.bs_log2, kv.n_slots);
    }
    __syncthreads();
    load_kv(jt0, 0);
    cp_async_commit();

    // The warp group's items (DS warps share RW rows, each with DW of the dims) and this
    // lane's rows: 16mi + g + 8h of the group's RW.
    const u32 g = lane >> 2, t4 = lane & 3u;
    const u32 wg = warp / DS, hf = warp % DS;
    const u32 cw0 = hf * (DW / 8);  // the warp's first 16-byte chunk (dim 8·cw0)
    const u32 mw0 = m0 + wg * RW;
    const bool warp_any = mw0 <= m_last;
    const u32 wm_last = min(mw0 + RW - 1, m_last);
    const u32 wp_first = pos0 + mw0 / group, wp_last = pos0 + wm_last / group;
    const u32 wlo = (window != 0 && wp_first + 1 > window) ? wp_first + 1 - window : 0;
    // Keys every row of the group attends: tiles within them need no mask.
    const u32 wlo_all = (window != 0 && wp_last + 1 > window) ? wp_last + 1 - window : 0;
    const bool warp_full = mw0 + RW - 1 <= m_last;
    u32 rpos[MI][2], rlo[MI][2];
    bool rok[MI][2];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u32 m = mw0 + 16 * mi + g + 8u * h;
            rok[mi][h] = m <= m_last;
            rpos[mi][h] = pos0 + m / group;
            rlo[mi][h] = (window != 0 && rpos[mi][h] + 1 > window) ? rpos[mi][h] + 1 - window : 0;
        }
    const float sl2 = scale * LOG2E;
    float m_run[MI][2], l_run[MI][2];
    float o[MI][NO][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            m_run[mi][h] = PORTER_NEG_INF;
            l_run[mi][h] = 0.0f;
        }
#pragma unroll
        for (int f = 0; f < NO; ++f)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[mi][f][e] = 0.0f;
    }

    // Byte addresses in shared memory. ldmatrix.x4: lane l gives the row address of matrix
    // l / 8, row l % 8. Q (A operand, rows RW·wg + 16mi..): row l % 16, chunk 2kk + l / 16.
    // K (B of S, n = key): key 8·(l / 16) + l % 8 (+ 16np), chunk 2kk + (l / 8) % 2. V (B of
    // P·V, transposed, k = key): key l % 16 (+ 16kk), chunk 2fp + l / 16. Chunks from cw0.
    const u32 sbase = (u32)__cvta_generic_to_shared(amma_smem);
    const u32 q_row = wg * RW + (lane & 15u), q_ch = cw0 + (lane >> 4);
    const u32 k_row = ((lane >> 4) << 3) + (lane & 7u), k_ch = cw0 + ((lane >> 3) & 1u);
    const u32 v_row = lane & 15u, v_ch = cw0 + (lane >> 4);
    const u32 dw0 = cw0 * 8;  // the warp's first dim

    for (u32 jt = jt0; jt <= jt1; ++jt) {
        const u32 buf = (jt - jt0) & 1u;
        if (jt < jt1) load_kv(jt + 1, buf ^ 1u);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        // Slot table `buf` was last read by load_kv(jt), issued before this barrier.
        if (jt + 2 <= jt1 && tid < (u32)BN)
            Sl[buf * BN + tid] = key_slot(bt, (jt + 2) * BN + tid, kv.max_blocks, kv.bs_log2, kv.n_slots);
        const u32 kbase = jt * BN;
        // The same for every warp of a group (the same rows).
        if (warp_any && kbase <= wp_last && kbase + BN - 1 >= wlo) {
            const u32 kt = sbase + (BM * DP + buf * BN * DP) * (u32)sizeof(T);
            const u32 vt = kt + 2 * BN * DP * (u32)sizeof(T);
            // S = Q Kᵀ (RW x BN per group; over the warp's DW dims when DS > 1).
            float sc[MI][NS][4];
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                for (int j = 0; j < NS; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) sc[mi][j][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < DW / 16; ++kk) {
                if (dw0 + kk * 16 < D) {
                    u32 a[MI][4];
#pragma unroll
                    for (int mi = 0; mi < MI; ++mi)
                        pm_ldsm(a[mi], sbase + pm_sw<DP>(q_row + 16 * mi, 2 * kk + q_ch) * (u32)sizeof(T));
#pragma unroll
                    for (int np = 0; np < BN / 16; ++np) {
                        u32 b[4];
                        pm_ldsm(b, kt + pm_sw<DP>(16 * np + k_row, 2 * kk + k_ch) * (u32)sizeof(T));
#pragma unroll
                        for (int mi = 0; mi < MI; ++mi) {
                            PMma<T>::mma(sc[mi][2 * np], a[mi], b[0], b[1]);
                            PMma<T>::mma(sc[mi][2 * np + 1], a[mi], b[2], b[3]);
                        }
                    }
                }
            }
            if constexpr (DS == 2) {
                // The two halves of S through shared memory: each warp stores its partial
                // fragments (float4 q of lane l at [q][l]: conflict-free), the pair meets at
                // named barrier 1 + wg, and each adds the other's. own + other is the same sum
                // in both warps (addition commutes), so both run the same softmax. The tile's
                // closing __syncthreads orders these reads before the next tile's stores.
                float4* xo = reinterpret_cast<float4*>(Xs) + warp * (MI * NS * 32);
                const float4* xp = reinterpret_cast<const float4*>(Xs) + (warp ^ 1u) * (MI * NS * 32);
#pragma unroll
                for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                    for (int j = 0; j < NS; ++j)
                        xo[(mi * NS + j) * 32 + lane] = make_float4(sc[mi][j][0], sc[mi][j][1], sc[mi][j][2], sc[mi][j][3]);
                asm volatile("bar.sync %0, %1;\n" ::"r"(1u + wg), "r"(32 * DS) : "memory");
#pragma unroll
                for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                    for (int j = 0; j < NS; ++j) {
                        const float4 v = xp[(mi * NS + j) * 32 + lane];
                        sc[mi][j][0] += v.x;
                        sc[mi][j][1] += v.y;
                        sc[mi][j][2] += v.z;
                        sc[mi][j][3] += v.w;
                    }
            }
            // Scale (log2 domain) and mask: element e of tile j of m-tile mi is row 16mi + g +
            // 8(e / 2), key kbase + 8j + 2t + e % 2. Tiles inside every row's range skip the mask.
            const bool full = warp_full && kbase >= wlo_all && kbase + BN - 1 <= wp_first;
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                for (int j = 0; j < NS; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int h = e >> 1;
                        const u32 key = kbase + 8 * j + 2 * t4 + (e & 1);
                        const bool ok = full || (rok[mi][h] && key >= rlo[mi][h] && key <= rpos[mi][h]);
                        sc[mi][j][e] = ok ? sc[mi][j][e] * sl2 : PORTER_NEG_INF;
                    }
            // Online softmax of the lane's rows: the row max over the quad.
#pragma unroll
            for (int mi = 0; mi < MI; ++mi) {
                float corr[2];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float mx = PORTER_NEG_INF;
#pragma unroll
                    for (int j = 0; j < NS; ++j) mx = fmaxf(mx, fmaxf(sc[mi][j][2 * h], sc[mi][j][2 * h + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    const float m_new = fmaxf(m_run[mi][h], mx);
                    // A row with no unmasked key yet keeps O = 0, l = 0 (P = 0).
                    const float mu = m_new == PORTER_NEG_INF ? 0.0f : m_new;
                    corr[h] = exp2f(m_run[mi][h] - mu);
                    float ps = 0.0f;
#pragma unroll
                    for (int j = 0; j < NS; ++j) {
                        sc[mi][j][2 * h] = exp2f(sc[mi][j][2 * h] - mu);
                        sc[mi][j][2 * h + 1] = exp2f(sc[mi][j][2 * h + 1] - mu);
                        ps += sc[mi][j][2 * h] + sc[mi][j][2 * h + 1];
                    }
                    m_run[mi][h] = m_new;
                    l_run[mi][h] = l_run[mi][h] * corr[h] + ps;
                }
#pragma unroll
                for (int f = 0; f < NO; ++f) {
                    o[mi][f][0] *= corr[0];
                    o[mi][f][1] *= corr[0];
                    o[mi][f][2] *= corr[1];
                    o[mi][f][3] *= corr[1];
                }
            }
            // O += P V, 16 keys at a time: S tiles 2kk, 2kk + 1 are the A operand.
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
                u32 ph[MI][4], pl[MI][4];
#pragma unroll
                for (int mi = 0; mi < MI; ++mi) {
                    const float* s0 = sc[mi][2 * kk];
                    const float* s1 = sc[mi][2 * kk + 1];
                    if constexpr (PS == 2) {
                        amma_split<T>(s0[0], s0[1], ph[mi][0], pl[mi][0]);
                        amma_split<T>(s0[2], s0[3], ph[mi][1], pl[mi][1]);
                        amma_split<T>(s1[0], s1[1], ph[mi][2], pl[mi][2]);
                        amma_split<T>(s1[2], s1[3], ph[mi][3], pl[mi][3]);
                    } else {
                        ph[mi][0] = PMma<T>::pack(s0[0], s0[1]);
                        ph[mi][1] = PMma<T>::pack(s0[2], s0[3]);
                        ph[mi][2] = PMma<T>::pack(s1[0], s1[1]);
                        ph[mi][3] = PMma<T>::pack(s1[2], s1[3]);
                    }
                }
#pragma unroll
                for (int fp = 0; fp < DW / 16; ++fp) {
                    if (dw0 + fp * 16 < D) {
                        u32 b[4];
                        pm_ldsm_t(b, vt + pm_sw<DP>(16 * kk + v_row, 2 * fp + v_ch) * (u32)sizeof(T));
#pragma unroll
                        for (int mi = 0; mi < MI; ++mi) {
                            if constexpr (PS == 2) PMma<T>::mma(o[mi][2 * fp], pl[mi], b[0], b[1]);
                            PMma<T>::mma(o[mi][2 * fp], ph[mi], b[0], b[1]);
                            if constexpr (PS == 2) PMma<T>::mma(o[mi][2 * fp + 1], pl[mi], b[2], b[3]);
                            PMma<T>::mma(o[mi][2 * fp + 1], ph[mi], b[2], b[3]);
                        }
                    }
                }
            }
        }
        __syncthreads();
    }
    cp_async_wait<0>();
    if (!warp_any) return;

    // O / l, rounded to T into the warp's own part of the Q tile (its group's rows, its
    // dims: only this warp read them), then 16-byte chunks to global memory.
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = l_run[mi][h];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const float inv = l > 0.0f ? 1.0f / l : 0.0f;
            const u32 r = wg * RW + 16 * mi + g + 8u * h;
#pragma unroll
            for (int f = 0; f < NO; ++f)
                *reinterpret_cast<u32*>(Qs + pm_sw<DP>(r, cw0 + f) + 2 * t4) =
                    PMma<T>::pack(o[mi][f][2 * h] * inv, o[mi][f][2 * h + 1] * inv);
        }
    __syncwarp();
    const bool ovec = (reinterpret_cast<u64>(out) & 15u) == 0;
#pragma unroll 4
    for (u32 c = lane; c < RW * NO; c += 32) {
        const u32 r = c / NO, ch = cw0 + c % NO, d0 = ch * 8;
        const u32 m = mw0 + r;
        if (m > m_last || d0 >= D) continue;
        T* dst = out + ((u64)(row0 + m / group) * heads + kh * group + m % group) * D + d0;
        const T* src = Qs + pm_sw<DP>(wg * RW + r, ch);
        if (ovec) {
            *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) dst[e] = src[e];
        }
    }
#else
    // Fallback build (below sm_80 or PORTER_FALLBACK): the host never launches this kernel.
    __trap();
#endif
}

// Name: attention_mma_<NAME><QN>_d<DP>_w<NW>n<BN><P>, QN as in ATTENTION_RCQ, P empty (P split,
// PS = 2, one warp a 16-row group), _p1 (PS = 1) or _x2 (MI = DS = 2: 32-row groups of two
// warps that split head_dim).
#define ATTENTION_MMAG(T, NAME, KQ, QN, DP, NW, BN, PS, MI, DS, P)                                               \
    extern "C" __global__ void __launch_bounds__(32 * NW, 8 / NW)                                                \
        attention_mma_##NAME##QN##_d##DP##_w##NW##n##BN##P(                                                      \
            const T* q, const void* kpool, const void* vpool, const u32* tables, const u32* spans, T* out, u32 t, \
            u32 heads, u32 kvh, u32 D, float scale, u32 window, u32 max_blocks, u32 bs_log2, u32 n_slots,        \
            const float* ksc, const float* vsc) { porter_pdl_enter();                                                                \
        attention_mma_impl<T, KQ, DP, NW, BN, PS, MI, DS>(q, kpool, vpool, tables, spans, out, t, heads, kvh, D, scale,      \
                                              window, PagedKv{max_blocks, bs_log2, n_slots}, ksc, vsc);          \
    }
// PS = 2, MI = DS = 1 (the default form), pools of T / fp8 / int8.
#define ATTENTION_MMAQ(T, NAME, KQ, QN, DP, NW, BN) ATTENTION_MMAG(T, NAME, KQ, QN, DP, NW, BN, 2, 1, 1, )
#define ATTENTION_MMA(T, NAME, DP, NW, BN)              \
    ATTENTION_MMAQ(T, NAME, 0, , DP, NW, BN)            \
    ATTENTION_MMAQ(T, NAME, KVQ_FP8, _fp8, DP, NW, BN)  \
    ATTENTION_MMAQ(T, NAME, KVQ_I8, _i8, DP, NW, BN)

// The 8-warp, 64-key tiles at every padded head dim (at DP <= 128 they fit 99 KiB); the
// 4-warp, 32-key tiles at DP = 256 only, where the 8-warp ones need more than an sm_80 /
// sm_86 / sm_89 allows (and for A/B on larger devices). A/B forms, pools of T only: the
// single-MMA P form (PS = 1, 8 warps, 64 keys) and, at DP = 256, 32-row groups of two warps
// splitting head_dim (8 warps, 32 keys). Each instantiation adds to the module's NVRTC time
// (a few seconds at DP = 256).
#define ATTENTION_MMA_ALL(T, NAME)                                  \
    ATTENTION_MMA(T, NAME, 64, 8, 64)                               \
    ATTENTION_MMA(T, NAME, 128, 8, 64)                              \
    ATTENTION_MMA(T, NAME, 256, 8, 64)                              \
    ATTENTION_MMA(T, NAME, 256, 4, 32)                              \
    ATTENTION_MMAG(T, NAME, 0, , 64, 8, 64, 1, 1, 1, _p1)           \
    ATTENTION_MMAG(T, NAME, 0, , 128, 8, 64, 1, 1, 1, _p1)          \
    ATTENTION_MMAG(T, NAME, 0, , 256, 8, 64, 1, 1, 1, _p1)          \
    ATTENTION_MMAG(T, NAME, 0, , 256, 8, 32, 2, 2, 2, _x2)

ATTENTION_MMA_ALL(bf16, bf16)
ATTENTION_MMA_ALL(f16, f16)

// Causal GQA attention, Hopper prefill path on wgmma (sm_90a): a module of its own
// (kernels/src/cuda/compile.rs ATTENTION_WGMMA) on the helpers of kv_quant.cu, attention.cu and
// attention_tc.cu (key_slot, PagedKv, cp_async16, atc_load8), compiled for `sm_90a` where the
// device is sm_90 (elsewhere the entry points trap and the host never picks them).

// ---------------------------------------------------------------------------
// Attention, FlashAttention-3-style warpgroup MMAs (bf16 / f16, pools of T, DP 128 / 256)
// ---------------------------------------------------------------------------
//
// The same items, tiles, paging, masking and zero-fill as attention_mma_impl: a block takes
// BM = 128 items (query row, query head of the group; row-major, so the heads of a GQA group
// share the K/V tiles) of one sequence and one KV head, in two warpgroups of 64 items (warp q
// of a warpgroup owns its items 16q..16q+15); 64-key K/V tiles are staged with cp.async by all
// 256 threads into two buffers (the next tile loads while this one is used; one barrier a
// tile). What differs is the MMA: `wgmma.mma_async.m64nNk16`, one instruction a warpgroup for
// 64 rows:
// - S = Q·Kᵀ (64 × 64 f32, 32 registers a thread): A = the warpgroup's Q rows and B = the K
//   tile, both read by the tensor cores straight from shared memory (descriptors), DP / 16
//   instructions. Each K element is read once for 64 rows (mma.sync: once per 16-row warp,
//   through ldmatrix and the registers): a quarter of the shared-memory traffic.
// - Online softmax in registers, exp2 with the scale folded in (as attention_mma_impl): the
//   wgmma accumulator of warp q is an m16nN mma.sync accumulator of rows 16q.., so the quad
//   reductions and the row state are those of the mma.sync kernel.
// - O += P·V (64 × DP f32, DP / 2 registers a thread): A = P from registers (the accumulator
//   layout of two adjacent S n8 tiles is the A fragment of k16, as with mma.sync), rounded to
//   T once (FA2 / FA3 do the same; the P_hi + P_lo split of the mma kernel would double the
//   P·V MMAs); B = the V tile from shared memory, N-major (V is [key][dim]: imm-trans-b = 1),
//   one m64n<DP>k16 instruction per 16 keys.
// Shared memory (128-byte swizzle, the wgmma canonical layouts): a [R rows][DP] tile is DP / 64
// slabs of R × 128 bytes (dims 64s..64s+63), row r at 128r, its 16-byte chunk c at chunk
// c ^ (r % 8); slabs 1024-byte aligned. K-major operands (Q, K): the descriptor starts at the
// slab of the k step, + 32 bytes per 16 dims within it, SBO = 1024 (8 rows); N-major V: the
// start at key 16kk (2048 bytes a step), LBO = R × 128 (the next 64 dims), SBO = 1024 (8 keys).
// Dynamic shared memory: (BM + 4·BN)·DP·sizeof(T) + 2·BN·4 + 1024 (alignment slack) bytes:
// 198 144 at DP = 256 (one block, 8 warps an SM), 99 840 at DP = 128.
// cp.async writes are generic-proxy stores: every thread fences them to the async proxy
// (fence.proxy.async) before the barrier that precedes the wgmma reads.

#if defined(PORTER_SM80) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PORTER_WGMMA 1
#endif

#if defined(PORTER_WGMMA)
// Byte offset of 16-byte chunk c (dims 8c..8c+7) of row r of an R-row swizzled tile.
template <u32 R>
__device__ __forceinline__ u32 awg_off(u32 r, u32 c) {
    return (c >> 3) * (R * 128u) + r * 128u + (((c & 7u) ^ (r & 7u)) << 4);
}

// wgmma shared-memory descriptor: start address, leading / stride byte offsets, 128-byte swizzle.
__device__ __forceinline__ u64 awg_desc(u32 addr, u32 lbo, u32 sbo) {
    return (u64)((addr & 0x3FFFFu) >> 4) | ((u64)((lbo >> 4) & 0x3FFFu) << 16) |
           ((u64)((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

__device__ __forceinline__ void awg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void awg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void awg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of accumulator registers across the
// asynchronous wgmma (the asm that issued it returned before the hardware wrote them).
template <int N>
__device__ __forceinline__ void awg_hold(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ void awg_fence_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// The warpgroup MMAs of T (the element type is part of the instruction).
template <typename T>
struct Awg;
template <>
struct Awg<bf16> {
    // d (64 x 64 f32) += A (smem, K-major) * B (smem, K-major), or = when !acc.
    static __device__ __forceinline__ void ss_n64(float (&d)[32], u64 da, u64 db, int acc) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                     "%32, %33, p, 1, 1, 0, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                     : "l"(da), "l"(db), "r"(acc));
    }
    // d (64 x 128 f32) += A (registers) * B (smem, N-major: transposed).
    static __device__ __forceinline__ void rs_n128_t(float (&d)[64], const u32 (&a)[4], u64 db) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                     "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
    }
    // d (64 x 256 f32) += A (registers) * B (smem, N-major: transposed).
    static __device__ __forceinline__ void rs_n256_t(float (&d)[128], const u32 (&a)[4], u64 db) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
                     "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
    }
};
template <>
struct Awg<f16> {
    // d (64 x 64 f32) += A (smem, K-major) * B (smem, K-major), or = when !acc.
    static __device__ __forceinline__ void ss_n64(float (&d)[32], u64 da, u64 db, int acc) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                     "%32, %33, p, 1, 1, 0, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                     : "l"(da), "l"(db), "r"(acc));
    }
    // d (64 x 128 f32) += A (registers) * B (smem, N-major: transposed).
    static __device__ __forceinline__ void rs_n128_t(float (&d)[64], const u32 (&a)[4], u64 db) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                     "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
    }
    // d (64 x 256 f32) += A (registers) * B (smem, N-major: transposed).
    static __device__ __forceinline__ void rs_n256_t(float (&d)[128], const u32 (&a)[4], u64 db) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
                     "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
    }
};

// O (64 × DP) += P (registers) · V (shared memory, N-major).
template <typename T, int DP>
__device__ __forceinline__ void awg_pv(float (&o)[DP / 2], const u32 (&a)[4], u64 db) {
    if constexpr (DP == 256) {
        Awg<T>::rs_n256_t(o, a, db);
    } else {
        Awg<T>::rs_n128_t(o, a, db);
    }
}

// (x, y) rounded to T, x in the low half (as common.cuh's PMma<T>::pack; this module is sm_90a only).
__device__ __forceinline__ u32 awg_pack(bf16, float x, float y) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<const u32*>(&h);
}
__device__ __forceinline__ u32 awg_pack(f16, float x, float y) {
    const __half2 h = __floats2half2_rn(x, y);
    return *reinterpret_cast<const u32*>(&h);
}
#endif

// Grid: (item tiles of BM = 128, n_seqs * kvh); 256 threads (two warpgroups). D % 16 == 0,
// D <= DP, DP 128 or 256; pools of T. The signature of attention_mma_impl's entry points
// (ksc / vsc unused).
template <typename T, int DP>
__device__ __forceinline__ void attention_wgmma_impl(const T* __restrict__ q, const void* __restrict__ kpool_,
                                                     const void* __restrict__ vpool_, const u32* __restrict__ tables,
                                                     const u32* __restrict__ spans, T* __restrict__ out, u32 t,
                                                     u32 heads, u32 kvh, u32 D, float scale, u32 window, PagedKv kv) {
#if defined(PORTER_WGMMA)
    static_assert(DP == 128 || DP == 256, "head dim");
    constexpr u32 THREADS = 256;
    constexpr u32 BM = 128;          // items per block, 64 a warpgroup
    constexpr u32 BN = 64;           // keys per tile
    constexpr u32 CH = DP / 8;       // 16-byte chunks per row
    constexpr int NS = BN / 8;       // S n8 tiles (32 registers)
    constexpr int NO = DP / 8;       // O n8 tiles (DP / 2 registers)
    constexpr u32 TILE = BN * DP * (u32)sizeof(T);  // bytes of one K or V tile
    constexpr float LOG2E = 1.4426950408889634f;
    const T* kpool = reinterpret_cast<const T*>(kpool_);
    const T* vpool = reinterpret_cast<const T*>(vpool_);
    extern __shared__ __align__(128) unsigned char awg_smem_raw[];
    // 1024-byte aligned base (the swizzle atoms' alignment); the host adds 1024 bytes of slack.
    const u32 raw = (u32)__cvta_generic_to_shared(awg_smem_raw);
    const u32 sbase = (raw + 1023u) & ~1023u;
    unsigned char* smem = awg_smem_raw + (sbase - raw);
    // [BM][DP] Q, [2][BN][DP] K, [2][BN][DP] V (swizzled slabs), [2][BN] key slots.
    const u32 q_at = 0, k_at = BM * DP * (u32)sizeof(T), v_at = k_at + 2 * TILE;
    u32* Sl = reinterpret_cast<u32*>(smem + v_at + 2 * TILE);

    const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
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

    // Q tile (rows past m_last and dims past D zero).
    for (u32 c = tid; c < BM * CH; c += THREADS) {
        const u32 slot = c / CH, ch = c % CH, d0 = ch * 8;
        const u32 m = m0 + slot;
        const bool ok = m <= m_last && d0 < D;
        const T* src = q;
        if (ok) src = q + ((u64)(row0 + m / group) * heads + kh * group + m % group) * D + d0;
        atc_load8(reinterpret_cast<T*>(smem + q_at + awg_off<BM>(slot, ch)), src, ok, async);
    }
    // Tile jt's K/V into buffer `buf`, through slot table `buf` (tile jt's slots).
    auto load_kv = [&](u32 jt, u32 buf) {
        unsigned char* kd = smem + k_at + buf * TILE;
        unsigned char* vd = smem + v_at + buf * TILE;
        const u32* sl = Sl + buf * BN;
        const u32 kbase = jt * BN;
#pragma unroll 4
        for (u32 c = tid; c < BN * CH; c += THREADS) {
            const u32 j = c / CH, ch = c % CH, d0 = ch * 8;
            const u32 kpos = kbase + j;
            const u32 ks = sl[j];
            const bool ok = kpos >= lo_first && kpos <= p_last && d0 < D && ks != ATT_NOSLOT;
            const u64 off = ok ? (u64)ks * kv_stride + (u64)kh * D + d0 : 0;
            const u32 at = awg_off<BN>(j, ch);
            atc_load8(reinterpret_cast<T*>(kd + at), kpool + off, ok, async);
            atc_load8(reinterpret_cast<T*>(vd + at), vpool + off, ok, async);
        }
    };
    // Slot tables of the first two tiles; tile jt + 2's is filled during tile jt.
    if (tid < BN) {
        Sl[tid] = key_slot(bt, jt0 * BN + tid, kv.max_blocks, kv.bs_log2, kv.n_slots);
        if (jt0 < jt1) Sl[BN + tid] = key_slot(bt, (jt0 + 1) * BN + tid, kv.max_blocks, kv.bs_log2, kv.n_slots);
    }
    __syncthreads();
    load_kv(jt0, 0);
    cp_async_commit();

    // The warpgroup's items (64 from mg0; uniform over its 128 threads, as the wgmma
    // instructions require) and this lane's rows: 16wq + g + 8h of them.
    const u32 g = lane >> 2, t4 = lane & 3u;
    const u32 wg = warp >> 2, wq = warp & 3u;
    const u32 mg0 = m0 + wg * 64;
    const bool wg_any = mg0 <= m_last;
    const u32 gm_last = min(mg0 + 63, m_last);
    const u32 gp_first = pos0 + mg0 / group, gp_last = pos0 + gm_last / group;
    const u32 glo = (window != 0 && gp_first + 1 > window) ? gp_first + 1 - window : 0;
    // The warp's 16 items: tiles within every row's key range need no mask.
    const u32 mw0 = mg0 + 16 * wq;
    const u32 wm_last = min(mw0 + 15, m_last);
    const bool warp_full = mw0 + 15 <= m_last;
    const u32 wp_first = pos0 + mw0 / group, wp_last = pos0 + wm_last / group;
    const u32 wlo_all = (window != 0 && wp_last + 1 > window) ? wp_last + 1 - window : 0;
    u32 rpos[2], rlo[2];
    bool rok[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const u32 m = mw0 + g + 8u * h;
        rok[h] = m <= m_last;
        rpos[h] = pos0 + m / group;
        rlo[h] = (window != 0 && rpos[h] + 1 > window) ? rpos[h] + 1 - window : 0;
    }
    const float sl2 = scale * LOG2E;
    float m_run[2] = {PORTER_NEG_INF, PORTER_NEG_INF}, l_run[2] = {0.0f, 0.0f};
    float o[DP / 2];
#pragma unroll
    for (int i = 0; i < DP / 2; ++i) o[i] = 0.0f;

    // Descriptor bases: the warpgroup's Q rows (slab stride BM·128), K / V buffer 0.
    const u32 q_desc0 = sbase + q_at + wg * 64u * 128u;

    // One barrier a tile: past it, tile jt is in buffer `buf` for every thread (and fenced to
    // the async proxy), and every warpgroup is done with tile jt - 1, whose buffer the load
    // of tile jt + 1 then overwrites (while tile jt is computed).
    for (u32 jt = jt0; jt <= jt1; ++jt) {
        const u32 buf = (jt - jt0) & 1u;
        cp_async_wait<0>();
        awg_fence_proxy();
        __syncthreads();
        if (jt < jt1) load_kv(jt + 1, buf ^ 1u);
        cp_async_commit();
        // Slot table `buf` was last read by load_kv(jt), issued before this barrier; table
        // buf ^ 1, which load_kv(jt + 1) reads, was filled before it.
        if (jt + 2 <= jt1 && tid < BN)
            Sl[buf * BN + tid] = key_slot(bt, (jt + 2) * BN + tid, kv.max_blocks, kv.bs_log2, kv.n_slots);
        const u32 kbase = jt * BN;
        // Uniform over the warpgroup.
        if (wg_any && kbase <= gp_last && kbase + BN - 1 >= glo) {
            const u32 kt = sbase + k_at + buf * TILE, vt = sbase + v_at + buf * TILE;
            // S = Q Kᵀ (64 × 64 a warpgroup): DP / 16 k steps of 16 dims.
            float sc[NS * 4];
#pragma unroll
            for (int i = 0; i < NS * 4; ++i) sc[i] = 0.0f;
            awg_fence();
#pragma unroll
            for (int kk = 0; kk < DP / 16; ++kk) {
                const u32 slab = (u32)kk >> 2, in = ((u32)kk & 3u) * 32u;
                const u64 da = awg_desc(q_desc0 + slab * (BM * 128u) + in, 16, 1024);
                const u64 db = awg_desc(kt + slab * (BN * 128u) + in, 16, 1024);
                Awg<T>::ss_n64(sc, da, db, kk > 0);
            }
            awg_commit();
            awg_wait<0>();
            awg_hold(sc);
            // Scale (log2 domain) and mask: element e of n8 tile j is row g + 8(e / 2) of the
            // warp's 16, key kbase + 8j + 2t + e % 2. Tiles inside every row's range skip the mask.
            const bool full = warp_full && kbase >= wlo_all && kbase + BN - 1 <= wp_first;
#pragma unroll
            for (int j = 0; j < NS; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int h = e >> 1;
                    const u32 key = kbase + 8 * j + 2 * t4 + (e & 1);
                    const bool ok = full || (rok[h] && key >= rlo[h] && key <= rpos[h]);
                    sc[4 * j + e] = ok ? sc[4 * j + e] * sl2 : PORTER_NEG_INF;
                }
            // Online softmax of the lane's rows: the row max over the quad.
            float corr[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float mx = PORTER_NEG_INF;
#pragma unroll
                for (int j = 0; j < NS; ++j) mx = fmaxf(mx, fmaxf(sc[4 * j + 2 * h], sc[4 * j + 2 * h + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float m_new = fmaxf(m_run[h], mx);
                // A row with no unmasked key yet keeps O = 0, l = 0 (P = 0).
                const float mu = m_new == PORTER_NEG_INF ? 0.0f : m_new;
                corr[h] = exp2f(m_run[h] - mu);
                float ps = 0.0f;
#pragma unroll
                for (int j = 0; j < NS; ++j) {
                    sc[4 * j + 2 * h] = exp2f(sc[4 * j + 2 * h] - mu);
                    sc[4 * j + 2 * h + 1] = exp2f(sc[4 * j + 2 * h + 1] - mu);
                    ps += sc[4 * j + 2 * h] + sc[4 * j + 2 * h + 1];
                }
                m_run[h] = m_new;
                l_run[h] = l_run[h] * corr[h] + ps;
            }
#pragma unroll
            for (int f = 0; f < NO; ++f) {
                o[4 * f] *= corr[0];
                o[4 * f + 1] *= corr[0];
                o[4 * f + 2] *= corr[1];
                o[4 * f + 3] *= corr[1];
            }
            // P rounded to T once: S n8 tiles 2kk, 2kk + 1 are the A fragment of keys 16kk..
            u32 p[BN / 16][4];
#pragma unroll
            for (int kk = 0; kk < (int)BN / 16; ++kk) {
                const float* s0 = sc + 8 * kk;
                const float* s1 = s0 + 4;
                p[kk][0] = awg_pack(T(), s0[0], s0[1]);
                p[kk][1] = awg_pack(T(), s0[2], s0[3]);
                p[kk][2] = awg_pack(T(), s1[0], s1[1]);
                p[kk][3] = awg_pack(T(), s1[2], s1[3]);
            }
            // O += P V: one m64n<DP>k16 a 16-key step.
            awg_hold(o);
            awg_fence();
#pragma unroll
            for (int kk = 0; kk < (int)BN / 16; ++kk)
                awg_pv<T, DP>(o, p[kk], awg_desc(vt + (u32)kk * 2048u, BN * 128u, 1024));
            awg_commit();
            awg_wait<0>();
            awg_hold(o);
        }
    }
    cp_async_wait<0>();
    __syncthreads();
    if (!wg_any) return;

    // O / l, rounded to T into the warp's own rows of the Q tile (only its warpgroup's wgmma
    // read them, all finished), then 16-byte chunks to global memory.
    const u32 wrow0 = wg * 64 + 16 * wq;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = l_run[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const u32 r = wrow0 + g + 8u * h;
#pragma unroll
        for (int f = 0; f < NO; ++f)
            *reinterpret_cast<u32*>(smem + q_at + awg_off<BM>(r, f) + 4 * t4) =
                awg_pack(T(), o[4 * f + 2 * h] * inv, o[4 * f + 2 * h + 1] * inv);
    }
    __syncwarp();
    const bool ovec = (reinterpret_cast<u64>(out) & 15u) == 0;
#pragma unroll 4
    for (u32 c = lane; c < 16 * CH; c += 32) {
        const u32 r = c / CH, ch = c % CH, d0 = ch * 8;
        const u32 m = mw0 + r;
        if (m > m_last || d0 >= D) continue;
        T* dst = out + ((u64)(row0 + m / group) * heads + kh * group + m % group) * D + d0;
        const T* src = reinterpret_cast<const T*>(smem + q_at + awg_off<BM>(wrow0 + r, ch));
        if (ovec) {
            *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) dst[e] = src[e];
        }
    }
#else
    // Not sm_90a (or the fallback build): the host never launches this kernel.
    __trap();
#endif
}

// Name: attention_wgmma_<NAME>_d<DP>; the signature of attention_mma_* (ksc / vsc unused).
#define ATTENTION_WGMMA(T, NAME, DP)                                                                              \
    extern "C" __global__ void __launch_bounds__(256, 1) attention_wgmma_##NAME##_d##DP(                         \
        const T* q, const void* kpool, const void* vpool, const u32* tables, const u32* spans, T* out, u32 t,     \
        u32 heads, u32 kvh, u32 D, float scale, u32 window, u32 max_blocks, u32 bs_log2, u32 n_slots,            \
        const float* ksc, const float* vsc) { porter_pdl_enter();                                                                    \
        (void)ksc;                                                                                               \
        (void)vsc;                                                                                               \
        attention_wgmma_impl<T, DP>(q, kpool, vpool, tables, spans, out, t, heads, kvh, D, scale, window,        \
                                    PagedKv{max_blocks, bs_log2, n_slots});                                      \
    }

ATTENTION_WGMMA(bf16, bf16, 128)
ATTENTION_WGMMA(bf16, bf16, 256)
ATTENTION_WGMMA(f16, f16, 128)
ATTENTION_WGMMA(f16, f16, 256)

// The prefill path's grouped GEMMs on Hopper warpgroup MMAs (PORTER_MOE_GEMM=wgmma): a module
// of its own (kernels/src/cuda/compile.rs MOE_WGMMA, self-contained on common.cuh), compiled
// for `sm_90a` where the device is sm_90 (elsewhere the entry points trap and the host never
// picks them). kernels/src/cuda/moe_prefill.rs launches them on the alignment of
// moe_prefill.cu (sorted pair list padded to tiles of `tm` = 64 or 128 rows, tile_expert) and
// moe.cu's combine reads what the down GEMM writes (o[pair][hidden]).
//
// Tokens are wgmma's N dimension (A and B swapped): out^T[n_out][tok] = W[n_out][:] ·
// x[tok][:]^T. Operand A = 64 weight rows × 16 k (K-major: how expert weights are stored,
// [n_out][k] row-major), operand B = the tile's token rows (K-major, gathered x rows for
// gate+up, h rows for down), both read by the tensor cores from shared memory (descriptors,
// 128-byte swizzle). N = the tile's real rows rounded up to 16 (one of 8 instantiations of
// the main loop, chosen per CTA): ≈ 80-row experts (t = 4096 of the 80B shape) waste ≈ 9 %
// of the MMA work, not the 37 % of 64-row M tiles, and padding rows past N are never staged.
// - CTA: one tile × CPB consecutive column blocks (as moe_prefill.cu's streamed `pipe` GEMMs:
//   the k-steps of the next column block are in flight while the current one finishes) of
//   256 weight rows a column block: gate+up 128 gate rows and the 128 matching up rows (128
//   h columns), down 256 o columns. Two warpgroups (256 threads), each 2 × m64 of the
//   column block's weight rows: gate+up warpgroup w: gate rows 64w.. and up rows 128 + 64w..
//   (SiLU·up in registers), down: rows 128w.. and 128w + 64..; accumulators 2 × N / 2 f32 a
//   thread (128 at N = 128).
// - k-steps of BK = 64 (128-byte rows, whole L2 lines), S = 4 cp.async stages of 256 weight
//   rows + 128 token rows (48 KiB each, 192 KiB): 2–3 steps (64–96 KiB of weights) in flight
//   an SM, what ≈ 4 TB/s needs. Weights with an evict_first L2 policy (streamed once a tile;
//   one tile an expert up to 128 rows), token rows with the default one (read by every column
//   block). Every thread fences its cp.async writes to the async proxy (fence.proxy.async)
//   before the barrier that precedes the wgmma reads; a step's wgmma group is waited for
//   before the next barrier, so the stage refilled after it ((q − 1) % S) is free.
// - Bound: at t = 4096 every layer streams the 3.2 GB of expert weights once (0.8 ms at
//   4 TB/s) for 258 GFLOP (≈ 0.4 ms at ≈ 650 TFLOP/s of wgmma): memory decides, as long as a
//   step's MMAs (≈ 640 clocks at N = 80) stay under its weight bytes' HBM time (32 KiB at ≈ 20
//   B/clk an SM: ≈ 1600 clocks).
// - Epilogue from registers (accumulator: warp q of a warpgroup holds weight rows 16q + g,
//   16q + g + 8 of its m64, tokens 8j + 2t4, + 1): each warp transposes its 16 output
//   columns × N tokens through a [128][16] T staging area of its own (4 KiB; 32 KiB a CTA,
//   apart from the stages), then 16-byte stores of the real rows: gate+up h[tile·tm + r][c],
//   down o[pair][c]. Same roundings as the mma.sync GEMMs (h = round(silu(round(g)) ·
//   round(u)), o = round(C)).
// Dynamic shared memory: MWG_STAGES · MWG_STAGE + 8 · MWG_EPI_WARP + 1024 (alignment slack) =
// 230 400 bytes (+ 512 static): one CTA an SM.
// Needs K % 8 == 0, N % 8 == 0, 16-byte aligned rows, tm <= 128 (checked by the host).
// FP8 experts (moe_wg_{gu,down}_fp8_*, mwg_body_f8 below): the same tiles, MMAs and epilogue,
// the weights staged as e4m3 and dequantized in shared memory (K % 16 == 0).

#define MWG_INVALID 0xffffffffu
#define MWG_THREADS 256
#define MWG_BK 64
#define MWG_WR 256                                // weight rows a stage (a column block)
#define MWG_TM 128                                // token rows a tile, at most
#define MWG_STAGES 4
#define MWG_STAGE ((MWG_WR + MWG_TM) * 128)       // bytes of a stage
#define MWG_EPI_WARP (MWG_TM * 32)                // bytes of a warp's epilogue staging area

// An FP8 expert weight [e·NO, K]: e4m3 bytes q, scales s [.., ⌈K/128⌉], row -> scale row rs
// (null: row / 128). W = round_T(e4m3 · scale), as fp8_dequant and the tile-dequant GEMMs.
struct MwgF8 {
    const unsigned char* q;
    const float* s;
    const u32* rs;
};

#if defined(PORTER_SM80) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PORTER_MOE_WG 1
#endif

#if defined(PORTER_MOE_WG)
// d (64 × N f32) += A (smem, K-major) · B (smem, K-major), or = when !acc.
template <typename T, int N> __device__ __forceinline__ void mwg_ss(float (&d)[N / 2], u64 da, u64 db, int acc);
template <> __device__ __forceinline__ void mwg_ss<bf16, 16>(float (&d)[8], u64 da, u64 db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, "
                 "%8, %9, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(da), "l"(db), "r"(acc));
}
template <> __device__ __forceinline__ void mwg_ss<bf16, 32>(float (&d)[16], u64 da, u64 db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                 "%16, %17, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "l"(da), "l"(db), "r"(acc));
}
template <> __device__ __forceinline__ void mwg_ss<bf16, 48>(float (&d)[24], u64 da, u64 db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, "
                 "%24, %25, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
                 : "l"(da), "l"(db), "r"(acc));
}
template <> __device__ __forceinline__ void mwg_ss<bf16, 64>(float (&d)[32], u64 da, u64 db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(acc));
}
template <> __device__ __forceinline__ void mwg_ss<bf16, 80>(float (&d)[40], u64 da, u64 db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, "
                 "%40, %41, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
                 : "l"(da), "l"(db), "r"(acc));
}
template <> __device__ __forceinline__ void mwg_ss<bf16, 96>(float (&d)[48], u64 da, u64 db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, "
                 "%48, %49, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
                 : "l"(da), "l"(db), "r"(acc));
}
template <> __device__ __forceinline__ void mwg_ss<bf16, 112>(float (&d)[56], u64 da, u64 db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %58, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n112k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55}, "
                 "%56, %57, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55])
                 : "l"(da), "l"(db), "r"(acc));
}
template <> __device__ __forceinline__ void mwg_ss<bf16, 128>(float (&d)[64], u64 da, u64 db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "%64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(acc));
}
template <> __device__ __forceinline__ void mwg_ss<f16, 16>(float (&d)[8], u64 da, u64 db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, "
                 "%8, %9, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(da), "l"(db), "r"(acc));
}
template <> __device__ __forceinline__ void mwg_ss<f16, 32>(float (&d)[16], u64 da, u64 db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                 "%16, %17, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "l"(da), "l"(db), "r"(acc));
}
template <> __device__ __forceinline__ void mwg_ss<f16, 48>(float (&d)[24], u64 da, u64 db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n48k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, "
                 "%24, %25, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
                 : "l"(da), "l"(db), "r"(acc));
}
template <> __device__ __forceinline__ void mwg_ss<f16, 64>(float (&d)[32], u64 da, u64 db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(acc));
}
template <> __device__ __forceinline__ void mwg_ss<f16, 80>(float (&d)[40], u64 da, u64 db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n80k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, "
                 "%40, %41, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
                 : "l"(da), "l"(db), "r"(acc));
}
template <> __device__ __forceinline__ void mwg_ss<f16, 96>(float (&d)[48], u64 da, u64 db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, "
                 "%48, %49, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
                 : "l"(da), "l"(db), "r"(acc));
}
template <> __device__ __forceinline__ void mwg_ss<f16, 112>(float (&d)[56], u64 da, u64 db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %58, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n112k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55}, "
                 "%56, %57, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55])
                 : "l"(da), "l"(db), "r"(acc));
}
template <> __device__ __forceinline__ void mwg_ss<f16, 128>(float (&d)[64], u64 da, u64 db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "%64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(acc));
}

// Byte offset of 16-byte chunk c (0..7) of row r of a swizzled [rows][128-byte] tile.
__device__ __forceinline__ u32 mwg_sw(u32 r, u32 c) { return r * 128u + ((c ^ (r & 7u)) << 4); }

// wgmma shared-memory descriptor: start address, leading / stride byte offsets, 128-byte swizzle.
__device__ __forceinline__ u64 mwg_desc(u32 addr, u32 lbo, u32 sbo) {
    return (u64)((addr & 0x3FFFFu) >> 4) | ((u64)((lbo >> 4) & 0x3FFFu) << 16) |
           ((u64)((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}
__device__ __forceinline__ void mwg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void mwg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void mwg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Keeps the compiler from moving reads of accumulator registers above the wait.
template <int N> __device__ __forceinline__ void mwg_hold(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ void mwg_fence_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void mwg_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void mwg_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// cp.async of 16 bytes with an L2 cache policy and a 128-byte L2 prefetch.
__device__ __forceinline__ void mwg_cp16_pol(u32 s, const void* gmem, u64 pol) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, 16, %2;\n" ::"r"(s), "l"(gmem),
                 "l"(pol));
}
// cp.async of 16 bytes, zero-filled (src-size 0: nothing read) when !valid.
__device__ __forceinline__ void mwg_cp16_z(u32 s, const void* gmem, bool valid) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}

// Token rows (operand B) of a k-step at k0 into the stage's token area `st`: thread (lrow, ch)
// stages 16-byte chunk ch of rows lrow + 32s (zero-filled past the real rows and K).
template <typename T, int N, int TP>
__device__ __forceinline__ void mwg_load_tok(u32 st, const T* const (&ap)[TP], u32 k0, u32 K, u32 nv, u32 lrow,
                                             u32 ch) {
    const u32 kc = k0 + 8u * ch;
    const bool in = kc < K;
#pragma unroll
    for (int s = 0; s < TP; ++s) {
        const u32 r = lrow + 32u * s;
        if (r < (u32)N) mwg_cp16_z(st + mwg_sw(r, ch), ap[s] + (in ? kc : 0u), in && r < nv);
    }
}

// The token rows a thread stages (rows lrow + 32s of the tile): gate+up gathers x's rows of
// the tile's pairs, down reads the tile's own rows of h; rows past nv point at a (not read).
template <typename T, bool GU, int TP>
__device__ __forceinline__ void mwg_token_rows(const T* (&ap)[TP], const T* a, const u32* s_pair, u32 K, u32 k,
                                               u32 tile, u32 tm, u32 nv, u32 lrow) {
#pragma unroll
    for (int s = 0; s < TP; ++s) {
        const u32 r = lrow + 32u * s;
        ap[s] = r < nv ? (GU ? a + (u64)(s_pair[r] / k) * K : a + (u64)(tile * tm + r) * K) : a;
    }
}

// Weight row (of the expert's NO) of stage row r in column block cb: gate+up, row r < 128 the
// gate row cb·128 + r, else the up row cb·128 + r − 128; down, row cb·256 + r.
template <bool GU> __device__ __forceinline__ u32 mwg_weight_row(u32 cb, u32 r) {
    constexpr u32 NC = GU ? MWG_WR / 2 : MWG_WR;
    return GU ? cb * NC + (r & (NC - 1u)) : cb * NC + r;
}

// The L2 policy of the weight loads: streamed once a tile, evict first.
__device__ __forceinline__ u64 mwg_evict_first() {
    u64 pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
    return pol;
}

// One k-step's MMAs (issued and committed, not waited for): the warpgroup's two m64 weight-row
// blocks (rows arow0.., arow1.. of the [256][128-byte] tile at `sa`) against the token tile at
// `st`; `first`: the column block's first step (D = A·B).
template <typename T, int N>
__device__ __forceinline__ void mwg_mma_step(float (&acc0)[N / 2], float (&acc1)[N / 2], u32 sa, u32 arow0, u32 arow1,
                                             u32 st, bool first) {
    mwg_fence();
#pragma unroll
    for (u32 kk = 0; kk < MWG_BK / 16u; ++kk) {
        const u64 db = mwg_desc(st + 32u * kk, 16, 1024);
        const int acc = first && kk == 0 ? 0 : 1;
        mwg_ss<T, N>(acc0, mwg_desc(sa + arow0 * 128u + 32u * kk, 16, 1024), db, acc);
        mwg_ss<T, N>(acc1, mwg_desc(sa + arow1 * 128u + 32u * kk, 16, 1024), db, acc);
    }
    mwg_commit();
}

// Epilogue of column block cb: element e of n8 tile j is weight row g + 8(e / 2) of the warp's
// 16, token 8j + 2t4 + e % 2. Each warp transposes through its staging area `ep` ([128 tokens]
// [16 columns] of T), then 16-byte stores of the real rows: gate+up h[tile·tm + r][c] =
// round(silu(round(g)) · round(u)), down o[pair][c] = round(C).
template <typename T, bool GU, int N>
__device__ __forceinline__ void mwg_epilogue(const float (&acc0)[N / 2], const float (&acc1)[N / 2], T* ep,
                                             T* __restrict__ dst, const u32* __restrict__ s_pair, u32 NO, u32 cb,
                                             u32 tile, u32 tm, u32 nv, u32 wg, u32 wq, u32 lane) {
    constexpr u32 NC = GU ? MWG_WR / 2 : MWG_WR;
    const u32 g = lane >> 2, t4 = lane & 3u;
#pragma unroll
    for (int half = 0; half < (GU ? 1 : 2); ++half) {
        const float* src = half == 0 ? acc0 : acc1;
        const u32 c0 = GU ? cb * NC + 64u * wg + 16u * wq : cb * NC + 128u * wg + 64u * half + 16u * wq;
#pragma unroll
        for (int j = 0; j < N / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const u32 tok = 8u * j + 2u * t4 + (e & 1), col = g + 8u * (e >> 1);
                const float v = GU ? silu_f(round_to<T>(acc0[4 * j + e])) * round_to<T>(acc1[4 * j + e]) : src[4 * j + e];
                ep[tok * 16u + col] = from_f<T>(v);
            }
        __syncwarp();
        // 16-byte stores: two a token row (columns c0.., c0 + 8..), real rows only.
        for (u32 i = lane; i < 2u * nv; i += 32u) {
            const u32 r = i >> 1, c = c0 + 8u * (i & 1u);
            if (c >= NO) continue;
            const u64 row = GU ? (u64)tile * tm + r : (u64)s_pair[r];
            *reinterpret_cast<uint4*>(dst + row * NO + c) = *reinterpret_cast<const uint4*>(ep + r * 16u + 8u * (i & 1u));
        }
        __syncwarp();
    }
}

// The main loop and epilogue of a CTA for N (16..128, multiple of 16) staged token rows, the
// tile's nv <= N real ones first (pairs s_pair[0..nv)). `sbase`: the 1024-byte aligned shared
// address of the stages, `epi` the generic address of the epilogue staging areas.
template <typename T, bool GU, int N>
__device__ __forceinline__ void mwg_body(const T* __restrict__ a, const T* __restrict__ w0, const T* __restrict__ w1,
                                         const u32* __restrict__ s_pair, T* __restrict__ dst, u32 K, u32 NO, u32 k,
                                         u32 tile, u32 tm, u32 ex, u32 cb0, u32 cb1, u32 nv, u32 sbase,
                                         unsigned char* epi) {
    constexpr u32 NC = GU ? MWG_WR / 2 : MWG_WR;  // output columns of a column block
    constexpr int TP = (N + 31) / 32;              // token rows a thread stages (lrow + 32s)
    constexpr u32 S = MWG_STAGES;
    const u32 tid = threadIdx.x, warp = tid >> 5, lane = tid & 31u, wg = warp >> 2, wq = warp & 3u;
    const u32 lrow = tid >> 3, ch = tid & 7u;
    const T* ap[TP];
    mwg_token_rows<T, GU, TP>(ap, a, s_pair, K, k, tile, tm, nv, lrow);
    const u64 pol = mwg_evict_first();
    const u32 nk = (K + MWG_BK - 1) / MWG_BK;
    const u32 steps = (cb1 - cb0) * nk;
    // Step q: column block cb0 + q / nk, k-step q % nk. Stage: [256 weight rows][128 B], then
    // [128 token rows][128 B] (rows >= N not staged).
    auto load = [&](u32 q) {
        const u32 cb = cb0 + q / nk, k0 = (q % nk) * MWG_BK;
        const u32 sw = sbase + (q % S) * MWG_STAGE, st = sw + MWG_WR * 128u;
        mwg_load_tok<T, N, TP>(st, ap, k0, K, nv, lrow, ch);
        const u32 kc = k0 + 8u * ch;
        const bool in = kc < K;
        // Weight rows (of expert ex): mwg_weight_row; rows r >= NC of gate+up are up's.
#pragma unroll
        for (int s = 0; s < MWG_WR / 32; ++s) {
            const u32 r = lrow + 32u * s;
            const u32 wr = mwg_weight_row<GU>(cb, r);
            const T* base = (GU && r >= NC) ? w1 : w0;
            const u32 d = sw + mwg_sw(r, ch);
            if (wr < NO && in)
                mwg_cp16_pol(d, base + ((u64)ex * NO + wr) * K + kc, pol);
            else
                mwg_cp16_z(d, w0, false);
        }
    };
    // The warpgroup's two m64 weight-row blocks of a stage.
    const u32 arow0 = GU ? 64u * wg : 128u * wg, arow1 = GU ? NC + 64u * wg : 128u * wg + 64u;
    float acc0[N / 2], acc1[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc0[i] = acc1[i] = 0.0f;
#pragma unroll
    for (u32 s = 0; s < S - 1; ++s) {
        if (s < steps) load(s);
        mwg_cp_commit();
    }
    T* ep = reinterpret_cast<T*>(epi + warp * MWG_EPI_WARP);  // [128 tokens][16 columns]
    for (u32 q = 0; q < steps; ++q) {
        // Past the barrier: step q's stage has landed for every thread (fenced to the async
        // proxy), and step q − 1's wgmma (waited for) no longer reads stage (q − 1) % S.
        mwg_cp_wait<S - 2>();
        mwg_fence_proxy();
        __syncthreads();
        if (q + S - 1 < steps) load(q + S - 1);
        mwg_cp_commit();
        const u32 sw = sbase + (q % S) * MWG_STAGE, st = sw + MWG_WR * 128u;
        mwg_mma_step<T, N>(acc0, acc1, sw, arow0, arow1, st, q % nk == 0u);
        mwg_wait0();
        mwg_hold(acc0);
        mwg_hold(acc1);
        if (q % nk == nk - 1u)
            mwg_epilogue<T, GU, N>(acc0, acc1, ep, dst, s_pair, NO, cb0 + q / nk, tile, tm, nv, wg, wq, lane);
    }
    mwg_cp_wait<0>();
}

// Two e4m3 bytes (low byte first) as two f32, exactly (cvt.rn.f16x2.e4m3x2: sm_89+).
__device__ __forceinline__ float2 mwg_e4m3x2(unsigned short b) {
    u32 h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h) : "h"(b));
    return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// Shared memory of the FP8 form (the same total as the dense one's): MWG_STAGES stages of
// [128 token rows][128 B] then [256 weight rows][64 e4m3 bytes], then two [256][128-byte] T
// weight tiles (the dequantized operand A, alternate steps), then the epilogue areas.
#define MWG_F8_STAGE (MWG_TM * 128 + MWG_WR * 64)
#define MWG_F8_ATILE (MWG_WR * 128)

// mwg_body with FP8 weights (moe_wg_*_fp8_*). Why: the tile-dequant wmma GEMMs of fp8_gemm.cu
// ran the 80B's 4k-token MoE at 2.34 ms a layer (H100, session 31's profile) against 1.49 for
// these wgmma GEMMs on bf16 weights, which stream twice the bytes. Here the weight rows come
// in as e4m3 (cp.async, 64 bytes a row a k-step), each thread dequantizes the chunks it
// loaded (16 bytes: rows wrow + 64j, k offset 16·wc) into the swizzled T tile the wgmma
// reads, for step q + 1 while step q's MMAs run; two T tiles alternate. The token rows and
// the MMAs, accumulation and epilogue are mwg_body's; the weights are those of the
// tile-dequant GEMMs (round_T(e4m3 · scale)), so the results are theirs up to the order of
// the f32 sums.
template <typename T, bool GU, int N>
__device__ __forceinline__ void mwg_body_f8(const T* __restrict__ a, const MwgF8 w0, const MwgF8 w1,
                                            const u32* __restrict__ s_pair, T* __restrict__ dst, u32 K, u32 NO, u32 k,
                                            u32 tile, u32 tm, u32 ex, u32 cb0, u32 cb1, u32 nv, u32 sbase,
                                            unsigned char* gsm, unsigned char* epi) {
    constexpr u32 NC = GU ? MWG_WR / 2 : MWG_WR;
    constexpr int TP = (N + 31) / 32;
    constexpr u32 S = MWG_STAGES;
    const u32 tid = threadIdx.x, warp = tid >> 5, lane = tid & 31u, wg = warp >> 2, wq = warp & 3u;
    const u32 lrow = tid >> 3, ch = tid & 7u;
    const u32 wrow = tid >> 2, wc = tid & 3u;  // this thread's weight chunks: rows wrow + 64j
    const T* ap[TP];
    mwg_token_rows<T, GU, TP>(ap, a, s_pair, K, k, tile, tm, nv, lrow);
    const u64 pol = mwg_evict_first();
    const u32 nk = (K + MWG_BK - 1) / MWG_BK, nsc = (K + 127u) / 128u;
    const u32 steps = (cb1 - cb0) * nk;
    const u32 abase = sbase + S * MWG_F8_STAGE;
    auto load = [&](u32 q) {
        const u32 cb = cb0 + q / nk, k0 = (q % nk) * MWG_BK;
        const u32 st = sbase + (q % S) * MWG_F8_STAGE, s8 = st + MWG_TM * 128u;
        mwg_load_tok<T, N, TP>(st, ap, k0, K, nv, lrow, ch);
        const u32 kq = k0 + 16u * wc;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u32 r = wrow + 64u * j, wr = mwg_weight_row<GU>(cb, r);
            const unsigned char* q8 = (GU && r >= NC) ? w1.q : w0.q;
            const u32 d = s8 + r * 64u + 16u * wc;
            if (wr < NO && kq < K)
                mwg_cp16_pol(d, q8 + ((u64)ex * NO + wr) * K + kq, pol);
            else
                mwg_cp16_z(d, w0.q, false);
        }
    };
    // This thread's rows' scale rows, for the column block of the step being converted.
    const float* srow[4];
    u32 srow_cb = 0xffffffffu;
    auto convert = [&](u32 q) {
        const u32 cb = cb0 + q / nk, k0 = (q % nk) * MWG_BK;
        if (cb != srow_cb) {
            srow_cb = cb;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const u32 r = wrow + 64u * j, wr = mwg_weight_row<GU>(cb, r);
                const MwgF8& m = (GU && r >= NC) ? w1 : w0;
                const u64 row = (u64)ex * NO + wr;
                srow[j] = wr < NO ? m.s + (u64)(m.rs ? __ldg(m.rs + row) : (u32)(row / 128u)) * nsc : nullptr;
            }
        }
        const unsigned char* s8 = gsm + (q % S) * MWG_F8_STAGE + MWG_TM * 128u;
        unsigned char* at = gsm + S * MWG_F8_STAGE + (q & 1u) * MWG_F8_ATILE;
        const u32 kb = k0 / 128u;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u32 r = wrow + 64u * j;
            const uint4 v = *reinterpret_cast<const uint4*>(s8 + r * 64u + 16u * wc);
            const float sc = srow[j] ? __ldg(srow[j] + kb) : 0.0f;
            const unsigned short* b = reinterpret_cast<const unsigned short*>(&v);
            u32 o[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const float2 f = mwg_e4m3x2(b[i]);
                o[i] = pack2_rn<T>(f.x * sc, f.y * sc);
            }
            *reinterpret_cast<uint4*>(at + mwg_sw(r, 2u * wc)) = make_uint4(o[0], o[1], o[2], o[3]);
            *reinterpret_cast<uint4*>(at + mwg_sw(r, 2u * wc + 1u)) = make_uint4(o[4], o[5], o[6], o[7]);
        }
    };
    const u32 arow0 = GU ? 64u * wg : 128u * wg, arow1 = GU ? NC + 64u * wg : 128u * wg + 64u;
    float acc0[N / 2], acc1[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc0[i] = acc1[i] = 0.0f;
#pragma unroll
    for (u32 s = 0; s < S - 1; ++s) {
        if (s < steps) load(s);
        mwg_cp_commit();
    }
    // Step 0's weights: this thread's own chunks have landed (cp.async groups are per thread).
    mwg_cp_wait<S - 2>();
    if (steps > 0) convert(0);
    T* ep = reinterpret_cast<T*>(epi + warp * MWG_EPI_WARP);
    for (u32 q = 0; q < steps; ++q) {
        // Past the barrier: step q's T tile is complete and its token rows have landed (each
        // thread waited for its own groups of step q before converting it, and fenced its
        // writes to the async proxy), step q − 1's wgmma (waited for by both warpgroups) no
        // longer reads the other T tile or stage (q − 1) % S.
        mwg_fence_proxy();
        __syncthreads();
        if (q + S - 1 < steps) load(q + S - 1);
        mwg_cp_commit();
        const u32 st = sbase + (q % S) * MWG_F8_STAGE;
        mwg_mma_step<T, N>(acc0, acc1, abase + (q & 1u) * MWG_F8_ATILE, arow0, arow1, st, q % nk == 0u);
        // While the MMAs run: step q + 1's weights (its groups: all but the newest S − 2).
        if (q + 1 < steps) {
            mwg_cp_wait<S - 2>();
            convert(q + 1);
        }
        mwg_wait0();
        mwg_hold(acc0);
        mwg_hold(acc1);
        if (q % nk == nk - 1u)
            mwg_epilogue<T, GU, N>(acc0, acc1, ep, dst, s_pair, NO, cb0 + q / nk, tile, tm, nv, wg, wq, lane);
    }
    mwg_cp_wait<0>();
}
#endif

#if defined(PORTER_MOE_WG)
// The main loop of a CTA: dense (T) weights.
template <typename T, bool GU, int N>
__device__ __forceinline__ void mwg_run(const T* a, const T* w0, const T* w1, const u32* s_pair, T* dst, u32 K,
                                        u32 NO, u32 k, u32 tile, u32 tm, u32 ex, u32 cb0, u32 cb1, u32 nv, u32 sbase,
                                        unsigned char*, unsigned char* epi) {
    mwg_body<T, GU, N>(a, w0, w1, s_pair, dst, K, NO, k, tile, tm, ex, cb0, cb1, nv, sbase, epi);
}
// FP8 weights.
template <typename T, bool GU, int N>
__device__ __forceinline__ void mwg_run(const T* a, const MwgF8 w0, const MwgF8 w1, const u32* s_pair, T* dst, u32 K,
                                        u32 NO, u32 k, u32 tile, u32 tm, u32 ex, u32 cb0, u32 cb1, u32 nv, u32 sbase,
                                        unsigned char* gsm, unsigned char* epi) {
    mwg_body_f8<T, GU, N>(a, w0, w1, s_pair, dst, K, NO, k, tile, tm, ex, cb0, cb1, nv, sbase, gsm, epi);
}
// Both forms' stages and T tiles take the same shared memory (the host's wg::SMEM).
static_assert(MWG_STAGES * MWG_F8_STAGE + 2 * MWG_F8_ATILE == MWG_STAGES * MWG_STAGE, "FP8 stages");
#endif

// Block b: tile b / ngrp, column blocks (b % ngrp)·cpb .. min(+cpb, nblk) (gate+up: 128 h
// columns each, down: 256 o columns). Tiles of tm (<= 128) rows of the sorted list. W: the
// weights, `const T*` or MwgF8.
template <typename T, bool GU, typename W>
__device__ __forceinline__ void mwg_impl(const T* __restrict__ a, const W w0, const W w1,
                                         const u32* __restrict__ sorted, const u32* __restrict__ tile_expert,
                                         T* __restrict__ dst, u32 K, u32 N, u32 k, u32 ngrp, u32 cpb, u32 nblk,
                                         u32 tm) {
#if defined(PORTER_MOE_WG)
    extern __shared__ __align__(128) unsigned char mwg_smem_raw[];
    __shared__ u32 s_pair[MWG_TM];
    const u32 tile = blockIdx.x / ngrp, grp = blockIdx.x % ngrp;
    const u32 ex = tile_expert[tile];
    if (ex == MWG_INVALID) return;
    const u32 cb0 = grp * cpb, cb1 = min(cb0 + cpb, nblk);
    if (cb0 >= cb1) return;
    const u32 tid = threadIdx.x;
    u32 p = MWG_INVALID;
    if (tid < tm) {
        p = sorted[tile * tm + tid];
        s_pair[tid] = p;
    }
    // Real rows: a prefix of the tile (segments start at tile boundaries).
    const u32 nv = (u32)__syncthreads_count(p != MWG_INVALID);
    // 1024-byte aligned stages (the swizzle atoms' alignment; the host adds 1024 bytes of slack).
    const u32 raw = (u32)__cvta_generic_to_shared(mwg_smem_raw);
    const u32 sbase = (raw + 1023u) & ~1023u;
    unsigned char* gsm = mwg_smem_raw + (sbase - raw);
    unsigned char* epi = gsm + MWG_STAGES * MWG_STAGE;
#define MWG_CASE(NN)                                                                                              \
    case NN / 16:                                                                                                 \
        mwg_run<T, GU, NN>(a, w0, w1, s_pair, dst, K, N, k, tile, tm, ex, cb0, cb1, nv, sbase, gsm, epi);          \
        break;
    switch ((nv + 15u) / 16u) {
        MWG_CASE(16)
        MWG_CASE(32)
        MWG_CASE(48)
        MWG_CASE(64)
        MWG_CASE(80)
        MWG_CASE(96)
        MWG_CASE(112)
        MWG_CASE(128)
        default:
            break;
    }
#undef MWG_CASE
#else
    // Not sm_90a (or the fallback build): the host never launches this kernel.
    __trap();
#endif
}

// Entries moe_wg_{gu,down}_{bf16,f16}: the arguments of moe_prefill.cu's pipe GEMMs and tm
// (grid tiles_cap · ngrp, MWG_THREADS threads; dynamic shared memory MWG_STAGES · MWG_STAGE +
// 8 · MWG_EPI_WARP + 1024 bytes). moe_wg_{gu,down}_fp8_{bf16,f16}: FP8 experts, each weight
// (q, scales, row scale) in place of its pointer (gate+up: gate's, then up's; down: one).
#define MOE_WG_ENTRY(T, NAME)                                                                                     \
    extern "C" __global__ void __launch_bounds__(MWG_THREADS, 1)                                                  \
        moe_wg_gu_##NAME(const T* a, const T* w0, const T* w1, const u32* sorted, const u32* tile_expert, T* dst,  \
                         u32 K, u32 N, u32 k, u32 ngrp, u32 cpb, u32 nblk, u32 tm) { porter_pdl_enter();          \
        mwg_impl<T, true>(a, w0, w1, sorted, tile_expert, dst, K, N, k, ngrp, cpb, nblk, tm);                     \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(MWG_THREADS, 1)                                                  \
        moe_wg_down_##NAME(const T* a, const T* w0, const T* w1, const u32* sorted, const u32* tile_expert,       \
                           T* dst, u32 K, u32 N, u32 k, u32 ngrp, u32 cpb, u32 nblk, u32 tm) { porter_pdl_enter(); \
        mwg_impl<T, false>(a, w0, w0, sorted, tile_expert, dst, K, N, k, ngrp, cpb, nblk, tm);                    \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(MWG_THREADS, 1) moe_wg_gu_fp8_##NAME(                            \
        const T* a, const unsigned char* q0, const float* s0, const u32* rs0, const unsigned char* q1,            \
        const float* s1, const u32* rs1, const u32* sorted, const u32* tile_expert, T* dst, u32 K, u32 N, u32 k,  \
        u32 ngrp, u32 cpb, u32 nblk, u32 tm) { porter_pdl_enter();                                                \
        mwg_impl<T, true>(a, MwgF8{q0, s0, rs0}, MwgF8{q1, s1, rs1}, sorted, tile_expert, dst, K, N, k, ngrp, cpb, \
                          nblk, tm);                                                                              \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(MWG_THREADS, 1) moe_wg_down_fp8_##NAME(                          \
        const T* a, const unsigned char* q, const float* s, const u32* rs, const u32* sorted,                     \
        const u32* tile_expert, T* dst, u32 K, u32 N, u32 k, u32 ngrp, u32 cpb, u32 nblk, u32 tm) {               \
        porter_pdl_enter();                                                                                       \
        mwg_impl<T, false>(a, MwgF8{q, s, rs}, MwgF8{q, s, rs}, sorted, tile_expert, dst, K, N, k, ngrp, cpb, nblk, \
                           tm);                                                                                   \
    }

MOE_WG_ENTRY(bf16, bf16)
MOE_WG_ENTRY(f16, f16)

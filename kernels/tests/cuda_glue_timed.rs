//! GPU time of the per-token glue kernels of a Qwen3-Next-80B layer at a 4k prefill (bf16):
//! the Gated DeltaNet output's gated RMSNorm (`gated_norm_z`), the residual add + RMSNorm
//! and the RMSNorm over `[4096, 2048]`; and the MoE input GEMM (`[router; shared gate; shared
//! up; shared expert gate]`, f32 out) at its own 1,537 rows against the 1,544 that the load
//! now pads it to. CUDA events over back-to-back calls queued behind a
//! hold (`common::timing`); prints µs a call and the bytes moved per second. Parity lives in
//! `cuda_kernels` (`cuda_gated_norm_z`, `cuda_add_rms_norm`, `cuda_rms_norm`).
//!
//! `#[ignore = "needs a CUDA GPU"]`: run with
//! `cargo test -p porter-kernels --release --test cuda_glue_timed -- --ignored --nocapture`.

mod common;

use common::timing::{time_calls, Hold};
use common::*;
use half::bf16;
use porter_kernels::cuda::{Gemm, RmsNormKind};

const T: usize = 4096;
/// The in-projection width of a Gated DeltaNet layer: `[q | k | v | z | b | a]`.
const PW: usize = 2 * LIN_HK * LIN_D + 2 * LIN_HV * LIN_D + 2 * LIN_HV;

fn report(what: &str, sec: f64, bytes: usize) {
    println!("{what}: {:.1} µs, {:.0} GB/s", sec * 1e6, bytes as f64 / sec / 1e9);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn glue_80b_prefill_timed() {
    let k = gpu("glue_80b_prefill_timed");
    let mut rng = Rng::new(90);
    let mut hold = Hold::new(&k);
    let iters = 50;

    // gated_norm_z: x [T·Hv, dv], z read in place from p [T, PW], out [T·Hv, dv].
    let (rows, d) = (T * LIN_HV, LIN_D);
    let x = up::<bf16>(&k, &rng.vec(rows * d, 2.0));
    let p = up::<bf16>(&k, &rng.vec(T * PW, 2.0));
    let w = up::<bf16>(&k, &rng.vec(d, 1.0));
    let mut out = poisoned::<bf16>(&k, rows * d);
    let zoff = 2 * LIN_HK * LIN_D + LIN_HV * LIN_D;
    let sec = time_calls(&k, &mut hold, iters, &mut |_| {
        k.gated_norm_z(&x, &p, &w, &mut out, T, LIN_HV, d, PW, zoff, 1e-6).expect("gated_norm_z");
    });
    report(&format!("gated_norm_z bf16 [{T}·{LIN_HV}, {d}]"), sec, 3 * rows * d * 2);

    // add_rms_norm: x f32 += y (f32, the MoE output; bf16, an out_proj), out bf16.
    let n = T * HIDDEN;
    let mut xr = up::<f32>(&k, &rng.vec(n, 1.0));
    let nw = up::<bf16>(&k, &rng.vec(HIDDEN, 1.0));
    let mut normed = poisoned::<bf16>(&k, n);
    let yf = up::<f32>(&k, &rng.vec(n, 0.01));
    let sec = time_calls(&k, &mut hold, iters, &mut |_| {
        k.add_rms_norm::<f32, bf16>(&mut xr, &yf, &nw, &mut normed, T, HIDDEN, 1e-6, RmsNormKind::ZeroCentred)
            .expect("add_rms_norm");
    });
    report(&format!("add_rms_norm f32+f32->bf16 [{T}, {HIDDEN}]"), sec, n * (4 + 4 + 4 + 2));
    let yb = up::<bf16>(&k, &rng.vec(n, 0.01));
    let sec = time_calls(&k, &mut hold, iters, &mut |_| {
        k.add_rms_norm::<bf16, bf16>(&mut xr, &yb, &nw, &mut normed, T, HIDDEN, 1e-6, RmsNormKind::ZeroCentred)
            .expect("add_rms_norm");
    });
    report(&format!("add_rms_norm f32+bf16->bf16 [{T}, {HIDDEN}]"), sec, n * (4 + 2 + 4 + 2));
    let sec = time_calls(&k, &mut hold, iters, &mut |_| {
        k.rms_norm::<f32, bf16>(&xr, &nw, &mut normed, T, HIDDEN, 1e-6, RmsNormKind::ZeroCentred).expect("rms_norm");
    });
    report(&format!("rms_norm f32->bf16 [{T}, {HIDDEN}]"), sec, n * (4 + 2));
}

/// cuBLAS for the MoE block's packed input projection: `[4096, 2048] × [n, 2048]ᵀ` → f32 at
/// n = 1,537 (512 router + 2·512 shared gate / up + 1 shared expert gate: an odd leading
/// dimension of the output) and at the padded 1,544 (and, for scale, 1,536).
#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_input_gemm_80b_prefill_timed() {
    let k = gpu("moe_input_gemm_80b_prefill_timed");
    let gemm = Gemm::new(&k).expect("cuBLAS");
    let mut rng = Rng::new(91);
    let mut hold = Hold::new(&k);
    let x = up::<bf16>(&k, &rng.vec(T * HIDDEN, 1.0));
    for n in [1537usize, 1544, 1536] {
        let w = up::<bf16>(&k, &rng.vec(n * HIDDEN, 0.02));
        let mut out = poisoned::<f32>(&k, T * n);
        let sec = time_calls(&k, &mut hold, 50, &mut |_| {
            gemm.matmul_t::<bf16, f32>(&x, &w, &mut out, T, HIDDEN, n).expect("gemm");
        });
        let tflops = 2.0 * (T * HIDDEN * n) as f64 / sec / 1e12;
        println!(
            "moe input gemm bf16->f32 [{T}, {HIDDEN}] x [{n}, {HIDDEN}]^T: {:.1} µs, {tflops:.0} TFLOP/s",
            sec * 1e6
        );
    }
}

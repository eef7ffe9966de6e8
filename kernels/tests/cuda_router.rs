//! The MoE router (kernels/cuda/router.cu): the warp top-k + rank-count form
//! (`moe_router_f32`) against its first form (`moe_router_rounds_f32`, k rounds of a block
//! argmax) bit for bit, indices and weights, on random rows, exact ties, underflowed
//! probabilities (many p = 0), every supported k up to 16 and expert counts from 8 to 8192;
//! rows whose probabilities are NaN against the documented rule; then µs per call of both
//! forms at the Qwen3-Next shapes (512 experts, top-10) for 1 and 8 rows (CUDA events over
//! many launches). The CPU reference is checked in cuda_kernels.rs (`cuda_moe_router`).
//!
//! The GPU tests are `#[ignore = "needs a CUDA GPU"]` (run them with `--include-ignored`).

mod common;

use common::*;
use cudarc::driver::CudaSlice;
use porter_kernels::cuda::CudaKernels;

/// Which router form a launch runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    New,
    Rounds,
}

/// One launch of `form` on device logits `[rows, e]`; `(idx, weights)` read back.
fn launch(
    k: &CudaKernels,
    form: Form,
    logits: &CudaSlice<f32>,
    rows: usize,
    e: usize,
    top_k: usize,
    renorm: bool,
) -> (Vec<u32>, Vec<f32>) {
    let mut di = poisoned_u32(k, rows * top_k);
    let mut dw = poisoned::<f32>(k, rows * top_k);
    match form {
        Form::New => k.moe_router(logits, &mut di, &mut dw, rows, e, top_k, renorm),
        Form::Rounds => k.moe_router_rounds(logits, &mut di, &mut dw, rows, e, top_k, renorm),
    }
    .unwrap_or_else(|err| panic!("router {form:?} e={e} k={top_k}: {err}"));
    (down_u32(k, &di), down::<f32>(k, &dw))
}

/// Both forms on `logits` (`[rows, e]`): indices and weight bits must agree; names the
/// first differing (row, slot) and both values.
fn same_case(k: &CudaKernels, logits: &[f32], e: usize, top_k: usize, renorm: bool, what: &str) {
    let rows = logits.len() / e;
    let dl = k.stream().clone_htod(logits).expect("htod");
    let (ni, nw) = launch(k, Form::New, &dl, rows, e, top_k, renorm);
    let (oi, ow) = launch(k, Form::Rounds, &dl, rows, e, top_k, renorm);
    for q in 0..rows * top_k {
        assert!(
            ni[q] == oi[q] && nw[q].to_bits() == ow[q].to_bits(),
            "router {what} (e={e} k={top_k} renorm={renorm}): row {} slot {}: new ({}, {:e}) vs rounds ({}, {:e})",
            q / top_k,
            q % top_k,
            ni[q],
            nw[q],
            oi[q],
            ow[q]
        );
    }
    println!("  router {what} e={e} k={top_k} renorm={renorm}: {rows} rows, bit-identical");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn router_new_form_matches_rounds() {
    let k = gpu("router_new_form_matches_rounds");
    let mut rng = Rng::new(31);
    for renorm in [true, false] {
        // Qwen3-Next: 512 experts, top-10, at several row counts.
        for rows in [1, 8, 67] {
            same_case(&k, &rng.vec(rows * EXPERTS, 4.0), EXPERTS, TOP_K, renorm, &format!("random {rows} rows"));
        }
        for (e, top_k) in [(8, 8), (20, 16), (33, 5), (60, 4), (128, 8), (256, 16), (1024, 16), (1500, 10), (8192, 16)]
        {
            same_case(&k, &rng.vec(5 * e, 3.0), e, top_k, renorm, "random");
        }
        // k = 1..16 at 512 experts.
        for top_k in 1..=16 {
            same_case(&k, &rng.vec(3 * EXPERTS, 4.0), EXPERTS, top_k, renorm, "every k");
        }
    }
    // Exact ties: all equal (the lowest indices win), a planted duplicate maximum, ties on a
    // coarse grid (many equal values across warps), and large spreads (p underflows to 0 for
    // most entries: ties among zeros).
    let mut ties = vec![0.5f32; 3 * EXPERTS];
    ties[EXPERTS + 300] = 2.0;
    ties[EXPERTS + 7] = 2.0;
    ties[EXPERTS + 100] = 1.0;
    for (i, v) in ties[2 * EXPERTS..].iter_mut().enumerate() {
        *v = ((i * 7919) % 5) as f32;
    }
    for top_k in [1, 10, 16] {
        same_case(&k, &ties, EXPERTS, top_k, true, "ties");
    }
    let mut spread = rng.vec(4 * EXPERTS, 200.0);
    spread[EXPERTS..2 * EXPERTS].fill(f32::NEG_INFINITY);
    spread[2 * EXPERTS + 3] = f32::NEG_INFINITY;
    for top_k in [10, 16] {
        same_case(&k, &spread, EXPERTS, top_k, true, "spread, an all -inf row");
        same_case(&k, &spread, EXPERTS, top_k, false, "spread, an all -inf row");
    }
}

/// A row with a NaN (or +inf) logit has NaN probabilities everywhere: the new form selects
/// the lowest k indices (NaN ranks below every number, ties to the lower index), each with a
/// NaN weight; the other rows are unaffected.
#[test]
#[ignore = "needs a CUDA GPU"]
fn router_nan_rows() {
    let k = gpu("router_nan_rows");
    let mut rng = Rng::new(32);
    let mut logits = rng.vec(3 * EXPERTS, 4.0);
    logits[5] = f32::NAN;
    logits[2 * EXPERTS + 400] = f32::INFINITY;
    let dl = k.stream().clone_htod(&logits).expect("htod");
    for renorm in [true, false] {
        let (idx, w) = launch(&k, Form::New, &dl, 3, EXPERTS, TOP_K, renorm);
        for r in [0usize, 2] {
            let want: Vec<u32> = (0..TOP_K as u32).collect();
            assert_eq!(&idx[r * TOP_K..(r + 1) * TOP_K], &want[..], "NaN row {r} (renorm {renorm}): indices");
            assert!(w[r * TOP_K..(r + 1) * TOP_K].iter().all(|v| v.is_nan()), "NaN row {r}: weights {w:?}");
        }
        // Row 1 as the first form gives it alone.
        let d1 = k.stream().clone_htod(&logits[EXPERTS..2 * EXPERTS]).expect("htod");
        let (oi, ow) = launch(&k, Form::Rounds, &d1, 1, EXPERTS, TOP_K, renorm);
        assert_eq!(&idx[TOP_K..2 * TOP_K], &oi[..], "row 1 next to NaN rows: indices");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&w[TOP_K..2 * TOP_K]), bits(&ow), "row 1 next to NaN rows: weights");
    }
    println!("  router NaN rows: lowest {TOP_K} indices, NaN weights; the finite row unchanged");
}

/// µs per call (CUDA events around `iters` launches after warm-ups).
fn time_form(k: &CudaKernels, form: Form, logits: &CudaSlice<f32>, rows: usize, iters: usize) -> f64 {
    let mut di = poisoned_u32(k, rows * TOP_K);
    let mut dw = poisoned::<f32>(k, rows * TOP_K);
    let mut go = |kk: &CudaKernels| match form {
        Form::New => kk.moe_router(logits, &mut di, &mut dw, rows, EXPERTS, TOP_K, true),
        Form::Rounds => kk.moe_router_rounds(logits, &mut di, &mut dw, rows, EXPERTS, TOP_K, true),
    };
    for _ in 0..10 {
        go(k).expect("router launch");
    }
    let s = k.stream().clone();
    s.synchronize().expect("sync");
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let a = s.record_event(flags).expect("event");
    for _ in 0..iters {
        go(k).expect("router launch");
    }
    let b = s.record_event(flags).expect("event");
    let ms = a.elapsed_ms(&b).expect("elapsed") as f64;
    ms * 1e3 / iters as f64
}

/// Timing of both forms, 512 experts, top-10, renormalised, 1 and 8 rows (back-to-back
/// launches: includes the launch gap, as in a CUDA graph; ncu's kernel time is lower).
#[test]
#[ignore = "needs a CUDA GPU"]
fn router_timing() {
    let k = gpu("router_timing");
    let mut rng = Rng::new(33);
    for rows in [1usize, 8] {
        let logits = k.stream().clone_htod(&rng.vec(rows * EXPERTS, 4.0)).expect("htod");
        let new = time_form(&k, Form::New, &logits, rows, 2000);
        let old = time_form(&k, Form::Rounds, &logits, rows, 2000);
        println!(
            "router e={EXPERTS} k={TOP_K} t={rows}: new {new:.2} us/call, rounds (old) {old:.2} us/call, {:.2}x",
            old / new
        );
    }
}

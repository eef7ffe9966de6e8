//! The MoE router and greedy argmax kernels (kernels/cuda/router.cu) against the CPU
//! reference: softmax → top-k → optional renormalisation with ties to the lower index, and
//! argmax with the first index on ties. GPU tests are `#[ignore = "needs a CUDA GPU"]` (run
//! with `--include-ignored`; see kernels/tests/cuda_kernels.rs for the conventions).

mod common;

use common::*;
use porter_kernels::cpu::ops;
use porter_kernels::cuda::CudaKernels;

/// CPU router as `porter_core::nn::Moe::route`.
fn route_ref(logits: &[f32], e: usize, top_k: usize, renorm: bool) -> Vec<Vec<(usize, f32)>> {
    logits
        .chunks(e)
        .map(|row| {
            let mut p = row.to_vec();
            ops::softmax_inplace(&mut p);
            let mut idx: Vec<usize> = (0..e).collect();
            idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
            let mut sel: Vec<(usize, f32)> = idx[..top_k].iter().map(|&i| (i, p[i])).collect();
            if renorm {
                let s: f32 = sel.iter().map(|(_, w)| w).sum();
                sel.iter_mut().for_each(|(_, w)| *w /= s);
            }
            sel
        })
        .collect()
}

fn router_case(k: &CudaKernels, logits: &[f32], e: usize, top_k: usize, renorm: bool, what: &str) {
    let rows = logits.len() / e;
    let want = route_ref(logits, e, top_k, renorm);
    let dl = k.stream().clone_htod(logits).expect("htod");
    let mut di = poisoned_u32(k, rows * top_k);
    let mut dw = poisoned::<f32>(k, rows * top_k);
    k.moe_router(&dl, &mut di, &mut dw, rows, e, top_k, renorm).expect("moe_router launch");
    let (gi, gw) = (down_u32(k, &di), down(k, &dw));
    let want_i: Vec<u32> = want.iter().flat_map(|s| s.iter().map(|&(i, _)| i as u32)).collect();
    let want_w: Vec<f32> = want.iter().flat_map(|s| s.iter().map(|&(_, w)| w)).collect();
    assert_eq!(gi, want_i, "router {what}: expert indices differ");
    check(&format!("router {what} weights (indices exact)"), &gw, &want_w, TOL_F32);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_moe_router() {
    let k = gpu("cuda_moe_router");
    let mut rng = Rng::new(7);
    for renorm in [true, false] {
        let logits = rng.vec(9 * EXPERTS, 4.0);
        router_case(&k, &logits, EXPERTS, TOP_K, renorm, &format!("E={EXPERTS} k={TOP_K} renorm={renorm}"));
    }
    // Ties go to the lower index: equal logits, and a planted duplicate maximum.
    let mut logits = vec![0.5f32; 2 * EXPERTS];
    logits[EXPERTS + 300] = 2.0;
    logits[EXPERTS + 7] = 2.0;
    logits[EXPERTS + 100] = 1.0;
    router_case(&k, &logits, EXPERTS, TOP_K, true, "ties");
    // Small shapes, k = 16 and k = e.
    let logits = rng.vec(5 * 20, 2.0);
    router_case(&k, &logits, 20, 16, true, "E=20 k=16");
    let logits = rng.vec(4 * 8, 2.0);
    router_case(&k, &logits, 8, 8, false, "E=8 k=8");
    let logits = rng.vec(3 * 60, 2.0);
    router_case(&k, &logits, 60, 4, true, "E=60 k=4 (Qwen3-MoE-like)");
    // The one-warp form's edges (e ≤ 512): a partly filled last register, one expert more
    // than a warp, k = 16 at e = 512.
    let logits = rng.vec(3 * 500, 3.0);
    router_case(&k, &logits, 500, 10, true, "E=500 k=10 (warp form, partial registers)");
    let logits = rng.vec(2 * 33, 3.0);
    router_case(&k, &logits, 33, 16, false, "E=33 k=16 (warp form)");
    let logits = rng.vec(2 * EXPERTS, 3.0);
    router_case(&k, &logits, EXPERTS, 16, true, "E=512 k=16 (warp form)");
    // Larger expert counts (more entries than threads per row; the block form beyond 512).
    let logits = rng.vec(3 * 1024, 3.0);
    router_case(&k, &logits, 1024, 16, true, "E=1024 k=16");
    let logits = rng.vec(3 * 1500, 3.0);
    router_case(&k, &logits, 1500, 10, true, "E=1500 k=10");
    // Many rows.
    let logits = rng.vec(67 * EXPERTS, 4.0);
    router_case(&k, &logits, EXPERTS, TOP_K, true, "67 rows");
    // A NaN or +inf logit makes the whole softmax row NaN: no number is left to win, so both
    // forms take the lowest indices in order, each once, with NaN weights (the reference's
    // total order would rank NaN by its sign bit instead, so this is asserted apart). Both
    // forms once picked the lowest selected expert again after the first pick.
    for e in [EXPERTS, 500, 1024] {
        let mut logits = rng.vec(3 * e, 3.0);
        logits[e / 3] = f32::NAN;
        logits[e + 5] = f32::INFINITY;
        logits[2 * e..].fill(f32::NAN);
        let dl = k.stream().clone_htod(&logits).expect("htod");
        let mut di = poisoned_u32(&k, 3 * TOP_K);
        let mut dw = poisoned::<f32>(&k, 3 * TOP_K);
        k.moe_router(&dl, &mut di, &mut dw, 3, e, TOP_K, true).expect("moe_router launch");
        let want: Vec<u32> = (0..3).flat_map(|_| 0..TOP_K as u32).collect();
        assert_eq!(down_u32(&k, &di), want, "router E={e}: NaN rows take the lowest indices, each once");
        assert!(down(&k, &dw).iter().all(|w| w.is_nan()), "router E={e}: NaN rows give NaN weights");
    }
    // One decode row of the 80B router (e = 512, k = 10), as a graphed step issues it.
    let one = k.stream().clone_htod(&rng.vec(EXPERTS, 4.0)).expect("htod");
    let (mut i1, mut w1) = (poisoned_u32(&k, TOP_K), poisoned::<f32>(&k, TOP_K));
    let mut hold = timing::Hold::new(&k);
    let us = 1e6
        * timing::time_calls(&k, &mut hold, 200, &mut |_| {
            k.moe_router(&one, &mut i1, &mut w1, 1, EXPERTS, TOP_K, true).expect("moe_router launch")
        });
    println!("  router [1, {EXPERTS}] k={TOP_K}: {us:.2} us a call");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_argmax() {
    let k = gpu("cuda_argmax");
    let mut rng = Rng::new(8);
    let rows = 4;
    let mut logits = rng.vec(rows * VOCAB, 10.0);
    // Row 1: tie between two maxima (the first wins); row 2: maximum at the end;
    // row 3: all equal.
    logits[VOCAB + 5000] = 50.0;
    logits[VOCAB + 4000] = 50.0;
    logits[3 * VOCAB - 1] = 60.0;
    logits[3 * VOCAB..].fill(-1.0);
    let want: Vec<u32> = logits
        .chunks(VOCAB)
        .map(|r| {
            let mut best = 0;
            for (i, &v) in r.iter().enumerate() {
                if v > r[best] {
                    best = i;
                }
            }
            best as u32
        })
        .collect();
    assert_eq!(&want[1..], &[4000, VOCAB as u32 - 1, 0]);
    let dl = k.stream().clone_htod(&logits).expect("htod");
    let mut out = poisoned_u32(&k, rows);
    k.argmax(&dl, &mut out, rows, VOCAB).expect("argmax launch");
    assert_eq!(down_u32(&k, &out), want);
    println!("  argmax [{rows}, {VOCAB}]: exact {want:?}");
    // Vocabularies that are no multiple of 4 (rows after the first are not 16-byte aligned:
    // the scalar path) or leave a float4 tail past the unrolled loop, with NaNs that never
    // win and maxima in the tail.
    for v in [VOCAB + 3, VOCAB + 4, 4 * 1024 * 4 + 12, 1001, 5] {
        let rows = 3;
        let mut x = rng.vec(rows * v, 10.0);
        x[1] = f32::NAN;
        x[v + v / 2] = f32::NAN;
        x[v + v - 1] = 70.0;
        x[2 * v + v / 3] = f32::INFINITY;
        let want: Vec<u32> = x
            .chunks(v)
            .map(|r| {
                let mut best = 0;
                for (i, &y) in r.iter().enumerate() {
                    if y > r[best] || r[best].is_nan() {
                        best = i;
                    }
                }
                best as u32
            })
            .collect();
        let dx = k.stream().clone_htod(&x).expect("htod");
        let mut out = poisoned_u32(&k, rows);
        k.argmax(&dx, &mut out, rows, v).expect("argmax launch");
        assert_eq!(down_u32(&k, &out), want, "vocabulary {v}");
    }
    // One row of the 80B vocabulary, as a greedy decode step takes it (CUDA events).
    let one = k.stream().clone_htod(&logits[..VOCAB]).expect("htod");
    let mut o1 = poisoned_u32(&k, 1);
    let mut hold = timing::Hold::new(&k);
    let us = 1e6
        * timing::time_calls(&k, &mut hold, 200, &mut |_| k.argmax(&one, &mut o1, 1, VOCAB).expect("argmax launch"));
    println!("  argmax [1, {VOCAB}]: {us:.1} us a call ({:.0} GB/s)", VOCAB as f64 * 4.0 / us / 1e3);
}

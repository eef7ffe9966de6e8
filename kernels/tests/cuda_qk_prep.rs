//! An attention block's query / key preparation in one launch (`CudaKernels::qk_prep`, and
//! `CudaKernels::qkv_prep` of a packed `[q | k | v]` projection; kernels/cuda/qk_prep.cu)
//! against the launches it replaces (column copies of the gated query
//! projection, `rms_norm` per head, `rope_neox`): bit for bit. GPU tests are
//! `#[ignore = "needs a CUDA GPU"]` (run with `--include-ignored`; see
//! kernels/tests/cuda_kernels.rs for the conventions).

mod common;

use common::*;
use cudarc::driver::CudaSlice;
use half::{bf16, f16};
use porter_kernels::cuda::{CudaFloat, CudaKernels, QkNorm, RmsNormKind};

/// One shape: heads, kv heads, head dim, rotated dims, gated, the q and k norms, tokens, the
/// RoPE scale.
struct Case {
    heads: usize,
    kvh: usize,
    hd: usize,
    rot: usize,
    gated: bool,
    q_norm: Option<RmsNormKind>,
    k_norm: Option<RmsNormKind>,
    t: usize,
    scale: f32,
}

fn inv_freq(rot: usize) -> Vec<f32> {
    (0..rot / 2).map(|i| 1.0 / 10_000f32.powf(2.0 * i as f32 / rot as f32)).collect()
}

fn case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, c: &Case) {
    let Case { heads, kvh, hd, rot, gated, t, scale, .. } = *c;
    let qcols = hd * if gated { 2 } else { 1 };
    let qg = up::<T>(k, &rng.vec(t * heads * qcols, 2.0));
    let kp = up::<T>(k, &rng.vec(t * kvh * hd, 2.0));
    let qw = up::<T>(k, &rng.vec(hd, 0.5));
    let kw = up::<T>(k, &rng.vec(hd, 0.5));
    let pos: Vec<u32> = (0..t as u32).map(|i| 7 * i + if i % 2 == 0 { 4_000 } else { 3 }).collect();
    let pos = up_u32(k, &pos);
    let inv = k.stream().clone_htod(&inv_freq(rot)).expect("htod");

    // The separate launches.
    let norm_apart = |x: &CudaSlice<T>, w: &CudaSlice<T>, kind: Option<RmsNormKind>, rows: usize| -> CudaSlice<T> {
        match kind {
            Some(kind) => {
                let mut o = poisoned::<T>(k, rows * hd);
                k.rms_norm::<T, T>(x, w, &mut o, rows, hd, 1e-6, kind).expect("rms_norm");
                o
            }
            None => k.stream().clone_dtod(x).expect("dtod"),
        }
    };
    let (q_src, want_gate) = if gated {
        let mut q = poisoned::<T>(k, t * heads * hd);
        let mut g = poisoned::<T>(k, t * heads * hd);
        k.copy_cols::<T>(&qg, &mut q, t * heads, 2 * hd, 0, hd).expect("copy_cols");
        k.copy_cols::<T>(&qg, &mut g, t * heads, 2 * hd, hd, hd).expect("copy_cols");
        (q, Some(g))
    } else {
        (k.stream().clone_dtod(&qg).expect("dtod"), None)
    };
    let mut want_q = norm_apart(&q_src, &qw, c.q_norm, t * heads);
    let mut want_k = norm_apart(&kp, &kw, c.k_norm, t * kvh);
    k.rope_neox::<T>(&mut want_q, &pos, &inv, t, heads, hd, rot, scale).expect("rope q");
    k.rope_neox::<T>(&mut want_k, &pos, &inv, t, kvh, hd, rot, scale).expect("rope k");

    // One launch.
    let (mut q, mut ko) = (poisoned::<T>(k, t * heads * hd), poisoned::<T>(k, t * kvh * hd));
    let mut gate = gated.then(|| poisoned::<T>(k, t * heads * hd));
    let qn = c.q_norm.map(|kind| QkNorm { w: &qw, eps: 1e-6, kind });
    let kn = c.k_norm.map(|kind| QkNorm { w: &kw, eps: 1e-6, kind });
    k.qk_prep::<T>(&qg, &kp, qn, kn, &mut q, &mut ko, gate.as_mut(), &pos, &inv, [t, heads, kvh, hd, rot], scale)
        .expect("qk_prep");

    let what = format!(
        "{} heads {heads}/{kvh} hd {hd} rot {rot} gated {gated} norms {:?}/{:?} t {t} scale {scale}",
        T::NAME,
        c.q_norm,
        c.k_norm
    );
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    assert_eq!(bits(down(k, &q)), bits(down(k, &want_q)), "{what}: q differs");
    assert_eq!(bits(down(k, &ko)), bits(down(k, &want_k)), "{what}: k differs");
    if let (Some(g), Some(w)) = (&gate, &want_gate) {
        assert_eq!(bits(down(k, g)), bits(down(k, w)), "{what}: gate differs");
    }

    // The packed projection: each row [qg | k | v], one launch, the same q / k / gate bits,
    // and v copied out unchanged.
    let v = rng.vec(t * kvh * hd, 2.0);
    let (qgh, kh) = (down(k, &qg), down(k, &kp));
    let (qrow, krow) = (heads * qcols, kvh * hd);
    let mut packed = Vec::with_capacity(t * (qrow + 2 * krow));
    for r in 0..t {
        packed.extend_from_slice(&qgh[r * qrow..(r + 1) * qrow]);
        packed.extend_from_slice(&kh[r * krow..(r + 1) * krow]);
        packed.extend_from_slice(&v[r * krow..(r + 1) * krow]);
    }
    let qkv = up::<T>(k, &packed);
    let (mut pq, mut pk, mut pv) =
        (poisoned::<T>(k, t * heads * hd), poisoned::<T>(k, t * kvh * hd), poisoned::<T>(k, t * kvh * hd));
    let mut pgate = gated.then(|| poisoned::<T>(k, t * heads * hd));
    let qn = c.q_norm.map(|kind| QkNorm { w: &qw, eps: 1e-6, kind });
    let kn = c.k_norm.map(|kind| QkNorm { w: &kw, eps: 1e-6, kind });
    k.qkv_prep::<T>(
        &qkv,
        (qn, kn),
        &mut pq,
        &mut pk,
        &mut pv,
        pgate.as_mut(),
        &pos,
        &inv,
        [t, heads, kvh, hd, rot],
        scale,
    )
    .expect("qkv_prep");
    assert_eq!(bits(down(k, &pq)), bits(down(k, &want_q)), "{what}: packed q differs");
    assert_eq!(bits(down(k, &pk)), bits(down(k, &want_k)), "{what}: packed k differs");
    assert_eq!(bits(down(k, &pv)), bits(down(k, &up::<T>(k, &v))), "{what}: packed v differs");
    if let (Some(g), Some(w)) = (&pgate, &want_gate) {
        assert_eq!(bits(down(k, g)), bits(down(k, w)), "{what}: packed gate differs");
    }
    println!("  {what}: bit for bit (apart and packed)");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_qk_prep() {
    let k = gpu("cuda_qk_prep");
    let mut rng = Rng::new(21);
    let zc = Some(RmsNormKind::ZeroCentred);
    let st = Some(RmsNormKind::Standard);
    let base = Case { heads: 16, kvh: 2, hd: 256, rot: 64, gated: true, q_norm: zc, k_norm: zc, t: 1, scale: 1.0 };
    let cases = [
        // Qwen3-Next: gated, zero-centred norms, a quarter of the dims rotated; decode, verify.
        Case { ..base },
        Case { t: 4, ..base },
        // Qwen3 / Qwen3-MoE: standard norms, all dims rotated.
        Case { heads: 8, kvh: 2, hd: 128, rot: 128, gated: false, q_norm: st, k_norm: st, t: 3, ..base },
        // Llama / Mistral: no norms; YaRN's attention factor; a head dim that is no multiple of
        // 32 (a partly idle warp); the largest head dim.
        Case { heads: 9, kvh: 3, hd: 64, rot: 64, gated: false, q_norm: None, k_norm: None, t: 5, ..base },
        Case { heads: 4, kvh: 4, hd: 64, rot: 32, gated: false, q_norm: None, k_norm: st, t: 2, scale: 1.25 },
        Case { heads: 3, kvh: 1, hd: 80, rot: 80, gated: true, q_norm: st, k_norm: None, t: 3, ..base },
        Case { heads: 2, kvh: 1, hd: 512, rot: 128, gated: true, q_norm: zc, k_norm: zc, t: 2, ..base },
    ];
    for c in &cases {
        case::<bf16>(&k, &mut rng, c);
        case::<f16>(&k, &mut rng, c);
        case::<f32>(&k, &mut rng, c);
    }
    // Refused: a head dim above 512, an odd rotation.
    let x = poisoned::<f32>(&k, 2 * 1024);
    let (mut a, mut b) = (poisoned::<f32>(&k, 1024), poisoned::<f32>(&k, 1024));
    let (pos, inv) = (up_u32(&k, &[0]), k.stream().clone_htod(&inv_freq(1024)).expect("htod"));
    assert!(k
        .qk_prep::<f32>(&x, &x, None, None, &mut a, &mut b, None, &pos, &inv, [1, 1, 1, 1024, 1024], 1.0)
        .is_err());
    assert!(k.qk_prep::<f32>(&x, &x, None, None, &mut a, &mut b, None, &pos, &inv, [1, 1, 1, 64, 33], 1.0).is_err());
}

//! CUDA kernels against the CPU reference (`porter_kernels::cpu`), on fresh
//! random inputs, in f32 and bf16 storage, at small and at the real
//! Qwen3-Next-80B-A3B dimensions.
//!
//! The GPU tests are `#[ignore = "needs a CUDA GPU"]`: run them with
//! `--include-ignored` (`scripts/gpu-check.sh` does); without a usable GPU
//! (`cuda::gpu_available`) they then fail, saying so. `nvrtc_compiles_all_kernels`
//! needs only NVRTC and the CUDA headers (`PORTER_CUDA_INCLUDE`): it is
//! `#[ignore = "needs NVRTC ..."]`, and `.ci/run` runs it once it has installed NVRTC.
//!
//! Outputs are filled with NaN before every launch, so an element a kernel
//! fails to write shows up. Errors are reported as `max |gpu − cpu| / max |cpu|`
//! per tensor (f32 storage ≤ 1e-5, bf16 storage ≤ 1e-2); indices must match
//! exactly. The seed is printed; set `PORTER_CUDA_SEED` to replay one.

mod common;

use common::*;
use half::bf16;
use porter_kernels::cpu::{gdn, ops, Act};
use porter_kernels::cuda::{self, CudaFloat, CudaKernels, RmsNormKind};

// ---------------------------------------------------------------------------
// NVRTC only
// ---------------------------------------------------------------------------

#[test]
#[ignore = "needs NVRTC (bash .ci/run installs it)"]
fn nvrtc_compiles_all_kernels() {
    need_nvrtc("nvrtc_compiles_all_kernels");
    for src in cuda::sources() {
        let t0 = std::time::Instant::now();
        let ptx = cuda::compile(src, "sm_90").unwrap_or_else(|e| panic!("{e}"));
        let text = ptx.to_src();
        // Every `extern "C"` kernel of the source (macro-generated ones included, via the
        // PTX of the whole file) must be in the PTX; a source with kernels must export some.
        let names: Vec<String> = src
            .code
            .split("extern \"C\" __global__ void ")
            .skip(1)
            .filter_map(|rest| {
                let rest = rest.trim_start_matches("__launch_bounds__(").trim_start();
                let rest = rest
                    .find(')')
                    .filter(|_| rest.starts_with(|c: char| c.is_ascii_digit()))
                    .map_or(rest, |i| rest[i + 1..].trim_start());
                rest.split('(').next().map(|n| n.trim().to_string())
            })
            // Macro bodies (names pasted with ##, or an attribute macro such as
            // GT6_CLUSTER(CL) where the name would be) are covered by their expansions.
            .filter(|n| !n.contains('#') && n.chars().any(|c| c.is_ascii_lowercase()))
            .collect();
        for name in &names {
            assert!(text.contains(&format!(".entry {name}(")), "{}: no entry point {name} in the PTX", src.name);
        }
        println!(
            "{}: {} bytes of PTX, {} entry points, {:.2} s",
            src.name,
            text.len(),
            names.len(),
            t0.elapsed().as_secs_f64()
        );
    }
}

/// Every source compiles for every architecture porter supports (docs/older-gpus.md): with
/// NVRTC 13 for sm_75, sm_80, sm_86, sm_89 and sm_90, and as the forced fallback build
/// (`-DPORTER_FALLBACK=1`) for sm_90; with NVRTC 12 (12.9, the last that targets Volta) for
/// sm_70. Which NVRTC the process loaded decides (`cuda::nvrtc_version`): `.ci/run` runs this
/// test twice, once with each library on the path.
#[test]
#[ignore = "needs NVRTC (bash .ci/run installs it)"]
fn nvrtc_compiles_all_kernels_all_archs() {
    need_nvrtc("nvrtc_compiles_all_kernels_all_archs");
    let (major, minor) = cuda::nvrtc_version().unwrap_or_else(|e| panic!("{e}"));
    // `.ci/run` says which library it put on the path; a different one loaded is an error.
    if let Ok(want) = std::env::var("PORTER_EXPECT_NVRTC") {
        assert_eq!(want.trim(), major.to_string(), "loaded NVRTC {major}.{minor}, expected {want}");
    }
    // sm_90 without the fallback is `nvrtc_compiles_all_kernels`.
    let builds: &[(&str, bool)] = match major {
        13.. => &[("sm_75", false), ("sm_80", false), ("sm_86", false), ("sm_89", false), ("sm_90", true)],
        12 => &[("sm_70", false)],
        _ => panic!("NVRTC {major}.{minor}: expected 12.x or 13.x"),
    };
    // Every (build, source) compile is independent: spread them over the cores (NVRTC
    // programs compile concurrently; a CI machine has 2 cores).
    let jobs: Vec<(&str, bool, &cuda::KernelSource)> =
        builds.iter().flat_map(|&(a, f)| cuda::sources().into_iter().map(move |s| (a, f, s))).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(jobs.len());
    let t0 = std::time::Instant::now();
    let bytes: usize = std::thread::scope(|sc| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                sc.spawn(|| {
                    let mut bytes = 0;
                    while let Some(&(arch, fallback, src)) =
                        jobs.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                    {
                        let ptx = cuda::compile_with(src, arch, fallback)
                            .unwrap_or_else(|e| panic!("NVRTC {major}.{minor}, {arch}, fallback {fallback}: {e}"));
                        let text = ptx.to_src();
                        // The fallback build leaves cp.async out (and, without tensor-core
                        // launches, mma).
                        if fallback || arch == "sm_70" || arch == "sm_75" {
                            assert!(
                                !text.contains("cp.async"),
                                "{} ({arch}, fallback {fallback}) has cp.async",
                                src.name
                            );
                        }
                        bytes += text.len();
                    }
                    bytes
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).sum()
    });
    println!(
        "NVRTC {major}.{minor} {builds:?}: {bytes} bytes of PTX in {:.1} s on {threads} threads",
        t0.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------
// Embedding, norms, RoPE, activations
// ---------------------------------------------------------------------------

fn embedding_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, vocab: usize, hidden: usize) {
    let table = rnd_vec::<T>(&rng.vec(vocab * hidden, 1.0));
    let mut ids: Vec<u32> = (0..9).map(|_| rng.below(vocab) as u32).collect();
    ids.extend([0, vocab as u32 - 1]);
    let want: Vec<f32> =
        ids.iter().flat_map(|&i| table[i as usize * hidden..(i as usize + 1) * hidden].to_vec()).collect();
    let dt = up::<T>(k, &table);
    let di = up_u32(k, &ids);
    let mut out = poisoned::<f32>(k, ids.len() * hidden);
    k.embedding(&dt, &di, &mut out, vocab, hidden).expect("embedding launch");
    let got = down(k, &out);
    assert_eq!(got, want, "embedding {} {vocab}x{hidden}: not an exact copy", T::NAME);
    println!("  embedding {} {vocab}x{hidden}: exact", T::NAME);

    // An out-of-range id gives a NaN row, nothing else changes.
    let bad = up_u32(k, &[1, vocab as u32 + 5]);
    let mut out = poisoned::<f32>(k, 2 * hidden);
    k.embedding(&dt, &bad, &mut out, vocab, hidden).expect("embedding launch");
    let got = down(k, &out);
    assert_eq!(&got[..hidden], &table[hidden..2 * hidden]);
    assert!(got[hidden..].iter().all(|v| v.is_nan()));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_embedding() {
    let k = gpu("cuda_embedding");
    let mut rng = Rng::new(1);
    embedding_case::<f32>(&k, &mut rng, 4096, HIDDEN);
    embedding_case::<bf16>(&k, &mut rng, 4096, HIDDEN);
    embedding_case::<bf16>(&k, &mut rng, 37, 100);
}

/// CPU RMSNorm as `porter_core::nn::RmsNorm::forward` (x already holds X values).
fn rms_norm_ref<O: CudaFloat>(x: &[f32], w: &[f32], d: usize, eps: f32, kind: RmsNormKind) -> Vec<f32> {
    let mut y = x.to_vec();
    let scale: Vec<f32> = match kind {
        RmsNormKind::Standard => w.to_vec(),
        RmsNormKind::ZeroCentred => w.iter().map(|v| 1.0 + v).collect(),
    };
    for r in y.chunks_mut(d) {
        let inv = ops::rms_inv(r, eps);
        for (v, s) in r.iter_mut().zip(&scale) {
            *v = match kind {
                RmsNormKind::Standard => rnd::<O>(s * rnd::<O>(*v * inv)),
                RmsNormKind::ZeroCentred => rnd::<O>(*v * inv * s),
            };
        }
    }
    y
}

fn rms_norm_case<X: CudaFloat, O: CudaFloat>(k: &CudaKernels, rng: &mut Rng, rows: usize, d: usize) {
    for kind in [RmsNormKind::Standard, RmsNormKind::ZeroCentred] {
        let x = rnd_vec::<X>(&rng.vec(rows * d, 3.0));
        let w = rnd_vec::<O>(&rng.vec(d, 1.0));
        let want = rms_norm_ref::<O>(&x, &w, d, EPS, kind);
        let (dx, dw) = (up::<X>(k, &x), up::<O>(k, &w));
        let mut out = poisoned::<O>(k, rows * d);
        k.rms_norm(&dx, &dw, &mut out, rows, d, EPS, kind).expect("rms_norm launch");
        check(&format!("rms_norm {kind:?} {}->{} [{rows}, {d}]", X::NAME, O::NAME), &down(k, &out), &want, tol::<O>());
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_rms_norm() {
    let k = gpu("cuda_rms_norm");
    let mut rng = Rng::new(2);
    // Layer norms over the f32 residual stream, q/k norms per head, odd widths.
    rms_norm_case::<f32, f32>(&k, &mut rng, 7, HIDDEN);
    rms_norm_case::<f32, bf16>(&k, &mut rng, 7, HIDDEN);
    rms_norm_case::<bf16, bf16>(&k, &mut rng, 5 * ATT_HEADS, ATT_HEAD_DIM);
    rms_norm_case::<f32, f32>(&k, &mut rng, 5 * ATT_KV_HEADS, ATT_HEAD_DIM);
    rms_norm_case::<f32, f32>(&k, &mut rng, 3, 100);
    rms_norm_case::<bf16, bf16>(&k, &mut rng, 3, 1000);
    rms_norm_case::<f32, f32>(&k, &mut rng, 2, 5000);
}

fn gated_norm_case<X: CudaFloat, O: CudaFloat>(k: &CudaKernels, rng: &mut Rng, rows: usize, d: usize) {
    let x = rnd_vec::<X>(&rng.vec(rows * d, 2.0));
    let z = rnd_vec::<O>(&rng.vec(rows * d, 3.0));
    let w = rnd_vec::<O>(&rng.vec(d, 1.0));
    let mut want = x.clone();
    gdn::gated_rms_norm(&mut want, &z, &w, EPS).expect("cpu gated_rms_norm");
    let want = rnd_vec::<O>(&want);
    let (dx, dz, dw) = (up::<X>(k, &x), up::<O>(k, &z), up::<O>(k, &w));
    let mut out = poisoned::<O>(k, rows * d);
    k.gated_rms_norm(&dx, &dz, &dw, &mut out, rows, d, EPS).expect("gated_rms_norm launch");
    check(&format!("gated_rms_norm {}->{} [{rows}, {d}]", X::NAME, O::NAME), &down(k, &out), &want, tol::<O>());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gated_rms_norm() {
    let k = gpu("cuda_gated_rms_norm");
    let mut rng = Rng::new(3);
    gated_norm_case::<f32, f32>(&k, &mut rng, 5 * LIN_HV, LIN_D);
    gated_norm_case::<f32, bf16>(&k, &mut rng, 5 * LIN_HV, LIN_D);
    gated_norm_case::<bf16, bf16>(&k, &mut rng, 5 * LIN_HV, LIN_D);
    gated_norm_case::<f32, f32>(&k, &mut rng, 3, 77);
}

fn inv_freq(rot_dim: usize, theta: f32) -> Vec<f32> {
    (0..rot_dim / 2).map(|i| 1.0f32 / theta.powf((2 * i) as f32 / rot_dim as f32)).collect()
}

#[allow(clippy::too_many_arguments)]
fn rope_case<T: CudaFloat>(
    k: &CudaKernels,
    rng: &mut Rng,
    t: usize,
    heads: usize,
    head_dim: usize,
    rot_dim: usize,
    theta: f32,
    max_pos: usize,
) {
    let x = rnd_vec::<T>(&rng.vec(t * heads * head_dim, 2.0));
    let mut pos: Vec<u32> = (0..t).map(|_| rng.below(max_pos) as u32).collect();
    pos[0] = 0;
    let freq = inv_freq(rot_dim, theta);
    // Tables as porter_core::nn::Rope::tables (rounded to the dtype).
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for &p in &pos {
        for f in &freq {
            let a = p as f32 * f;
            cos.push(rnd::<T>(a.cos()));
            sin.push(rnd::<T>(a.sin()));
        }
    }
    let mut want = x.clone();
    ops::rope_neox(&mut want, &cos, &sin, t, heads, head_dim, rot_dim);
    let want = rnd_vec::<T>(&want);
    let mut dx = up::<T>(k, &x);
    let (dp, df) = (up_u32(k, &pos), k.stream().clone_htod(&freq).expect("htod"));
    k.rope_neox(&mut dx, &dp, &df, t, heads, head_dim, rot_dim, 1.0).expect("rope launch");
    let got = down(k, &dx);
    check(&format!("rope {} t={t} heads={heads} head_dim={head_dim} rot={rot_dim}", T::NAME), &got, &want, tol::<T>());
    // Pass-through dims are bit-identical.
    for (row_g, row_x) in got.chunks(head_dim).zip(x.chunks(head_dim)) {
        assert_eq!(&row_g[rot_dim..], &row_x[rot_dim..], "rope touched dims past rot_dim");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_rope() {
    let k = gpu("cuda_rope");
    let mut rng = Rng::new(4);
    for (heads, max_pos) in [(ATT_HEADS, 4096), (ATT_KV_HEADS, 262_144)] {
        rope_case::<f32>(&k, &mut rng, 6, heads, ATT_HEAD_DIM, ROT_DIM, ROPE_THETA, max_pos);
        rope_case::<bf16>(&k, &mut rng, 6, heads, ATT_HEAD_DIM, ROT_DIM, ROPE_THETA, max_pos);
    }
    // Full rotary (Qwen3: head_dim 128, theta 1e6).
    rope_case::<f32>(&k, &mut rng, 9, 8, 128, 128, 1_000_000.0, 40_000);
    rope_case::<bf16>(&k, &mut rng, 9, 8, 128, 128, 1_000_000.0, 40_000);
}

fn swiglu_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, rows: usize, inter: usize) {
    let n = rows * inter;
    let g = rnd_vec::<T>(&rng.vec(n, 6.0));
    let u = rnd_vec::<T>(&rng.vec(n, 3.0));
    let want: Vec<f32> = g.iter().zip(&u).map(|(&gv, &uv)| rnd::<T>(ops::silu(gv) * uv)).collect();
    let (dg, du) = (up::<T>(k, &g), up::<T>(k, &u));
    let mut out = poisoned::<T>(k, n);
    k.swiglu(&dg, &du, &mut out).expect("swiglu launch");
    check(&format!("swiglu {} [{rows}, {inter}]", T::NAME), &down(k, &out), &want, tol::<T>());

    // Fused [gate | up] rows.
    let mut gu = Vec::with_capacity(2 * n);
    for r in 0..rows {
        gu.extend_from_slice(&g[r * inter..(r + 1) * inter]);
        gu.extend_from_slice(&u[r * inter..(r + 1) * inter]);
    }
    let dgu = up::<T>(k, &gu);
    let mut out = poisoned::<T>(k, n);
    k.swiglu_fused(&dgu, &mut out, rows, inter).expect("swiglu_fused launch");
    check(&format!("swiglu_fused {} [{rows}, {inter}]", T::NAME), &down(k, &out), &want, tol::<T>());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_swiglu() {
    let k = gpu("cuda_swiglu");
    let mut rng = Rng::new(5);
    swiglu_case::<f32>(&k, &mut rng, 7, 512);
    swiglu_case::<bf16>(&k, &mut rng, 7, 512);
    swiglu_case::<bf16>(&k, &mut rng, 300, 5120);
    swiglu_case::<f32>(&k, &mut rng, 3, 33);
}

fn gate_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, rows: usize, d: usize, gd: usize) {
    let x = rnd_vec::<T>(&rng.vec(rows * d, 4.0));
    let gate = rnd_vec::<T>(&rng.vec(rows * gd, 8.0));
    let want: Vec<f32> = (0..rows * d)
        .map(|i| {
            let gv = gate[(i / d) * gd + if gd == 1 { 0 } else { i % d }];
            rnd::<T>(x[i] * rnd::<T>(ops::sigmoid(gv)))
        })
        .collect();
    let mut dx = up::<T>(k, &x);
    let dg = up::<T>(k, &gate);
    k.sigmoid_gate_mul(&mut dx, &dg, rows, d, gd).expect("sigmoid_gate_mul launch");
    check(&format!("sigmoid_gate_mul {} [{rows}, {d}] gate_dim {gd}", T::NAME), &down(k, &dx), &want, tol::<T>());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_sigmoid_gate() {
    let k = gpu("cuda_sigmoid_gate");
    let mut rng = Rng::new(6);
    let d = ATT_HEADS * ATT_HEAD_DIM;
    gate_case::<f32>(&k, &mut rng, 5, d, d);
    gate_case::<bf16>(&k, &mut rng, 5, d, d);
    gate_case::<f32>(&k, &mut rng, 5, HIDDEN, 1);
    gate_case::<bf16>(&k, &mut rng, 5, HIDDEN, 1);
}

// ---------------------------------------------------------------------------
// Gated DeltaNet
// ---------------------------------------------------------------------------

fn gates_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, t: usize, hv: usize) {
    let mut a = rnd_vec::<T>(&rng.vec(t * hv, 8.0));
    a[0] = rnd::<T>(25.0); // above the softplus threshold
    a[1] = rnd::<T>(19.0);
    let b = rnd_vec::<T>(&rng.vec(t * hv, 6.0));
    let a_log = rng.vec(hv, 2.0);
    let dt_bias = rng.vec(hv, 1.0);
    let (mut wg, mut wb) = (vec![0.0; t * hv], vec![0.0; t * hv]);
    gdn::gdn_gates(&a, &b, &a_log, &dt_bias, &mut wg, &mut wb).expect("cpu gates");
    let (da, db) = (up::<T>(k, &a), up::<T>(k, &b));
    let (dl, dd) = (k.stream().clone_htod(&a_log).expect("htod"), k.stream().clone_htod(&dt_bias).expect("htod"));
    let mut g = poisoned::<f32>(k, t * hv);
    let mut beta = poisoned::<f32>(k, t * hv);
    k.gdn_gates(&da, &db, &dl, &dd, &mut g, &mut beta, t, hv).expect("gdn_gates launch");
    // f32 outputs of identical inputs: f32 tolerance for both storage types.
    check(&format!("gdn_gates g {} [{t}, {hv}]", T::NAME), &down(k, &g), &wg, TOL_F32);
    check(&format!("gdn_gates beta {} [{t}, {hv}]", T::NAME), &down(k, &beta), &wb, TOL_F32);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_gates() {
    let k = gpu("cuda_gdn_gates");
    let mut rng = Rng::new(9);
    gates_case::<f32>(&k, &mut rng, 7, LIN_HV);
    gates_case::<bf16>(&k, &mut rng, 7, LIN_HV);
    gates_case::<f32>(&k, &mut rng, 3, 5);
}

fn conv_update_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, c: usize, kk: usize, with_bias: bool) {
    let (n, num_slots) = (3, 5);
    let slots: Vec<u32> = vec![2, 0, 4];
    let km1 = kk - 1;
    let x = rnd_vec::<T>(&rng.vec(n * c, 2.0));
    let w = rnd_vec::<T>(&rng.vec(c * kk, 1.0));
    let bias = rnd_vec::<T>(&rng.vec(c, 0.5));
    let state0 = rnd_vec::<T>(&rng.vec(num_slots * c * km1, 2.0));
    let (mut want_out, mut want_state) = (vec![0.0f32; n * c], state0.clone());
    for (r, &s) in slots.iter().enumerate() {
        let st = &mut want_state[s as usize * c * km1..(s as usize + 1) * c * km1];
        gdn::causal_conv1d_update(
            &x[r * c..(r + 1) * c],
            &w,
            with_bias.then_some(&bias[..]),
            st,
            &mut want_out[r * c..(r + 1) * c],
            c,
            kk,
            Act::Silu,
        )
        .expect("cpu conv update");
    }
    let want_out = rnd_vec::<T>(&want_out);
    let (dx, dw, db) = (up::<T>(k, &x), up::<T>(k, &w), up::<T>(k, &bias));
    let mut dst = up::<T>(k, &state0);
    let dsl = up_u32(k, &slots);
    let mut out = poisoned::<T>(k, n * c);
    let bv = db.as_view();
    k.conv1d_update(&dx, &dw, with_bias.then_some(&bv), &mut dst, Some(&dsl.as_view()), &mut out, n, c, kk, num_slots)
        .expect("conv1d_update launch");
    let what = format!("conv1d_update {} c={c} k={kk} bias={with_bias}", T::NAME);
    check(&format!("{what} out"), &down(k, &out), &want_out, tol::<T>());
    // States are copies of inputs: exact.
    assert_eq!(down(k, &dst), want_state, "{what}: state (untouched slots included)");

    // A bad slot: NaN row, no state touched.
    let before = down(k, &dst);
    let bad = up_u32(k, &[num_slots as u32 + 1]);
    let mut out1 = up::<T>(k, &vec![0.0; c]);
    k.conv1d_update(&dx.slice(0..c), &dw, None, &mut dst, Some(&bad.as_view()), &mut out1, 1, c, kk, num_slots)
        .expect("conv1d_update launch");
    assert!(down(k, &out1).iter().all(|v| v.is_nan()), "{what}: bad slot must give NaN");
    assert_eq!(down(k, &dst), before, "{what}: bad slot touched the state");
}

fn conv_prefill_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, t: usize, c: usize, kk: usize, with_bias: bool) {
    let km1 = kk - 1;
    let x = rnd_vec::<T>(&rng.vec(t * c, 2.0));
    let w = rnd_vec::<T>(&rng.vec(c * kk, 1.0));
    let bias = rnd_vec::<T>(&rng.vec(c, 0.5));
    let state0 = rnd_vec::<T>(&rng.vec(c * km1, 2.0));
    let (mut want_out, mut want_state) = (vec![0.0f32; t * c], state0.clone());
    gdn::causal_conv1d_prefill(
        &x,
        &w,
        with_bias.then_some(&bias[..]),
        &mut want_state,
        &mut want_out,
        t,
        c,
        kk,
        Act::Silu,
    )
    .expect("cpu conv prefill");
    let want_out = rnd_vec::<T>(&want_out);
    let (dx, dw, db) = (up::<T>(k, &x), up::<T>(k, &w), up::<T>(k, &bias));
    let mut dst = up::<T>(k, &state0);
    let mut out = poisoned::<T>(k, t * c);
    let bv = db.as_view();
    k.conv1d_prefill(&dx, &dw, with_bias.then_some(&bv), &mut dst, &mut out, t, c, kk).expect("conv1d_prefill launch");
    let what = format!("conv1d_prefill {} t={t} c={c} k={kk} bias={with_bias}", T::NAME);
    check(&format!("{what} out"), &down(k, &out), &want_out, tol::<T>());
    assert_eq!(down(k, &dst), want_state, "{what}: final state");
    println!("  {what}: state exact");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_conv1d() {
    let k = gpu("cuda_conv1d");
    let mut rng = Rng::new(10);
    let conv = 2 * LIN_HK * LIN_D + LIN_HV * LIN_D; // 8192
    conv_update_case::<f32>(&k, &mut rng, conv, CONV_K, false);
    conv_update_case::<bf16>(&k, &mut rng, conv, CONV_K, false);
    conv_update_case::<f32>(&k, &mut rng, 37, 3, true);
    conv_update_case::<bf16>(&k, &mut rng, 37, 2, true);
    for t in [1, 2, 5, 64] {
        conv_prefill_case::<f32>(&k, &mut rng, t, conv, CONV_K, false);
        conv_prefill_case::<bf16>(&k, &mut rng, t, conv, CONV_K, false);
    }
    conv_prefill_case::<f32>(&k, &mut rng, 7, 37, 2, true);
    conv_prefill_case::<bf16>(&k, &mut rng, 3, 37, 3, true);
}

#[allow(clippy::too_many_arguments)]
fn recurrent_case<T: CudaFloat>(
    k: &CudaKernels,
    rng: &mut Rng,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
    steps: usize,
    slots: &[u32],
    num_slots: usize,
) {
    let n = slots.len();
    let slot_len = hv * dk * dv;
    // Small states, as after a prefill (the recurrence keeps them bounded).
    let state0 = rng.vec(num_slots * slot_len, 0.2);
    let mut want_state = state0.clone();
    let mut dst = k.stream().clone_htod(&state0).expect("htod");
    let dsl = up_u32(k, slots);
    let what = format!("gdn_recurrent_step {} hk={hk} hv={hv} dk={dk} dv={dv} n={n}", T::NAME);
    let mut worst = 0.0f32;
    for step in 0..steps {
        let q = rnd_vec::<T>(&rng.vec(n * hk * dk, 2.0));
        let kx = rnd_vec::<T>(&rng.vec(n * hk * dk, 2.0));
        let v = rnd_vec::<T>(&rng.vec(n * hv * dv, 2.0));
        // Log-decays from mild to a full reset (< -60 flushes to 0).
        let mut g: Vec<f32> = (0..n * hv).map(|_| -rng.f(1.0).abs() * 3.0).collect();
        g[0] = -70.0;
        let beta: Vec<f32> = (0..n * hv).map(|_| rng.f(0.5) + 0.5).collect();

        let mut want_out = vec![0.0f32; n * hv * dv];
        for (r, &s) in slots.iter().enumerate() {
            let mut qr = q[r * hk * dk..(r + 1) * hk * dk].to_vec();
            let mut kr = kx[r * hk * dk..(r + 1) * hk * dk].to_vec();
            gdn::l2norm_rows(&mut qr, dk, 1.0 / (dk as f32).sqrt()).expect("cpu l2norm");
            gdn::l2norm_rows(&mut kr, dk, 1.0).expect("cpu l2norm");
            let st = &mut want_state[s as usize * slot_len..(s as usize + 1) * slot_len];
            gdn::recurrent_gated_delta_rule(
                &qr,
                &kr,
                &v[r * hv * dv..(r + 1) * hv * dv],
                &g[r * hv..(r + 1) * hv],
                &beta[r * hv..(r + 1) * hv],
                st,
                &mut want_out[r * hv * dv..(r + 1) * hv * dv],
                1,
                hk,
                hv,
                dk,
                dv,
            )
            .expect("cpu recurrent");
        }
        let want_out = rnd_vec::<T>(&want_out);

        let (dq, dkx, dvv) = (up::<T>(k, &q), up::<T>(k, &kx), up::<T>(k, &v));
        let (dg, db) = (k.stream().clone_htod(&g).expect("htod"), k.stream().clone_htod(&beta).expect("htod"));
        let mut out = poisoned::<T>(k, n * hv * dv);
        k.gdn_recurrent_step(
            &dq,
            &dkx,
            &dvv,
            &dg,
            &db,
            &mut dst,
            Some(&dsl.as_view()),
            &mut out,
            n,
            hk,
            hv,
            dk,
            dv,
            num_slots,
        )
        .expect("gdn_recurrent_step launch");
        let e1 = check(&format!("{what} step {step} out"), &down(k, &out), &want_out, tol::<T>());
        // The state is f32 in both storage modes.
        let e2 = check(&format!("{what} step {step} state (all slots)"), &down(k, &dst), &want_state, TOL_F32);
        worst = worst.max(e1);
        let _ = e2;
    }
    println!("  {what}: worst out error over {steps} steps {worst:.3e}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_recurrent_step() {
    let k = gpu("cuda_gdn_recurrent_step");
    let mut rng = Rng::new(11);
    // Real dims, one sequence and a batch of three in a pool of four slots.
    recurrent_case::<f32>(&k, &mut rng, LIN_HK, LIN_HV, LIN_D, LIN_D, 4, &[0], 1);
    recurrent_case::<f32>(&k, &mut rng, LIN_HK, LIN_HV, LIN_D, LIN_D, 4, &[1, 3, 0], 4);
    recurrent_case::<bf16>(&k, &mut rng, LIN_HK, LIN_HV, LIN_D, LIN_D, 4, &[2, 0, 3], 4);
    // Ragged dims: dv not a multiple of 32, dk not a multiple of 8, Hv = Hk.
    recurrent_case::<f32>(&k, &mut rng, 2, 6, 40, 50, 3, &[1, 0], 2);
    recurrent_case::<bf16>(&k, &mut rng, 3, 3, 256, 20, 3, &[0], 1);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_conv_prefill_then_updates() {
    // Prefill a conv state on the GPU, then decode with updates: matches the
    // CPU doing the same (state carried across kernels and calls).
    let k = gpu("cuda_conv_prefill_then_updates");
    let mut rng = Rng::new(12);
    let (c, kk, t) = (2 * LIN_HK * LIN_D + LIN_HV * LIN_D, CONV_K, 9);
    let x = rnd_vec::<bf16>(&rng.vec((t + 3) * c, 2.0));
    let w = rnd_vec::<bf16>(&rng.vec(c * kk, 1.0));
    let mut st = vec![0.0f32; c * (kk - 1)];
    let mut want = vec![0.0f32; (t + 3) * c];
    gdn::causal_conv1d_prefill(&x[..t * c], &w, None, &mut st, &mut want[..t * c], t, c, kk, Act::Silu).expect("cpu");
    for i in t..t + 3 {
        gdn::causal_conv1d_update(
            &x[i * c..(i + 1) * c],
            &w,
            None,
            &mut st,
            &mut want[i * c..(i + 1) * c],
            c,
            kk,
            Act::Silu,
        )
        .expect("cpu");
    }
    let want = rnd_vec::<bf16>(&want);
    let (dx, dw) = (up::<bf16>(&k, &x), up::<bf16>(&k, &w));
    let mut dst = up::<bf16>(&k, &vec![0.0; c * (kk - 1)]);
    let mut out = poisoned::<bf16>(&k, (t + 3) * c);
    {
        let mut o = out.slice_mut(..t * c);
        k.conv1d_prefill(&dx.slice(..t * c), &dw, None, &mut dst, &mut o, t, c, kk).expect("prefill launch");
    }
    for i in t..t + 3 {
        let mut o = out.slice_mut(i * c..(i + 1) * c);
        k.conv1d_update(&dx.slice(i * c..(i + 1) * c), &dw, None, &mut dst, None, &mut o, 1, c, kk, 1)
            .expect("update launch");
    }
    check("conv prefill(9) + 3 updates bf16", &down(&k, &out), &want, TOL_BF16);
    assert_eq!(down(&k, &dst), rnd_vec::<bf16>(&st), "final conv state");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_rejects_bad_arguments() {
    let k = gpu("cuda_rejects_bad_arguments");
    let x = up::<f32>(&k, &[1.0; 10]);
    let w = up::<f32>(&k, &[1.0; 4]);
    let mut out = poisoned::<f32>(&k, 10);
    let e = k.rms_norm(&x, &w, &mut out, 2, 5, EPS, RmsNormKind::Standard).unwrap_err();
    assert!(e.to_string().contains("`w` has 4 elements, expected 5"), "{e}");
    let logits = up::<f32>(&k, &[0.0; 40]);
    let (mut i, mut wt) = (poisoned_u32(&k, 34), poisoned::<f32>(&k, 34));
    assert!(k.moe_router(&logits, &mut i, &mut wt, 2, 20, 17, true).is_err(), "k > 16 must be rejected");
    let mut xr = up::<f32>(&k, &[0.0; 16]);
    let p = up_u32(&k, &[0]);
    let f = up::<f32>(&k, &[1.0; 3]);
    assert!(k.rope_neox(&mut xr, &p, &f, 1, 2, 8, 7, 1.0).is_err(), "odd rot_dim must be rejected");
    println!("  bad arguments rejected with errors, no launch");
}

// ---------------------------------------------------------------------------
// Fused glue of the model path
// ---------------------------------------------------------------------------

fn add_rms_norm_case<Y: CudaFloat, O: CudaFloat>(k: &CudaKernels, rng: &mut Rng, rows: usize, d: usize) {
    for kind in [RmsNormKind::Standard, RmsNormKind::ZeroCentred] {
        let x = rng.vec(rows * d, 3.0);
        let y = rnd_vec::<Y>(&rng.vec(rows * d, 2.0));
        let w = rnd_vec::<O>(&rng.vec(d, 1.0));
        let sum: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
        let want = rms_norm_ref::<O>(&sum, &w, d, EPS, kind);
        let (mut dx, dy, dw) = (up::<f32>(k, &x), up::<Y>(k, &y), up::<O>(k, &w));
        let mut out = poisoned::<O>(k, rows * d);
        k.add_rms_norm(&mut dx, &dy, &dw, &mut out, rows, d, EPS, kind).expect("add_rms_norm launch");
        let what = format!("add_rms_norm {kind:?} {}+{}->{} [{rows}, {d}]", Y::NAME, "f32", O::NAME);
        check(&format!("{what}: sum"), &down(k, &dx), &sum, TOL_F32);
        check(&format!("{what}: out"), &down(k, &out), &want, tol::<O>());
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_add_rms_norm() {
    let k = gpu("cuda_add_rms_norm");
    let mut rng = Rng::new(40);
    add_rms_norm_case::<f32, f32>(&k, &mut rng, 5, HIDDEN);
    add_rms_norm_case::<bf16, bf16>(&k, &mut rng, 7, HIDDEN);
    add_rms_norm_case::<f32, bf16>(&k, &mut rng, 3, HIDDEN);
    add_rms_norm_case::<half::f16, half::f16>(&k, &mut rng, 4, 1000);
    add_rms_norm_case::<f32, half::f16>(&k, &mut rng, 2, 77);
    // Wider than NORM_NPT elements a thread: the two-pass loop.
    add_rms_norm_case::<f32, f32>(&k, &mut rng, 2, 5000);
}

fn gated_norm_z_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, t: usize, hv: usize, d: usize) {
    // p = [t, pw] with z at columns zoff..zoff + hv·d.
    let (zoff, extra) = (13, 5);
    let pw = zoff + hv * d + extra;
    let p = rnd_vec::<T>(&rng.vec(t * pw, 3.0));
    let x = rnd_vec::<T>(&rng.vec(t * hv * d, 2.0));
    let w = rnd_vec::<T>(&rng.vec(d, 1.0));
    let mut z = Vec::with_capacity(t * hv * d);
    for r in 0..t {
        z.extend_from_slice(&p[r * pw + zoff..r * pw + zoff + hv * d]);
    }
    let mut want = x.clone();
    gdn::gated_rms_norm(&mut want, &z, &w, EPS).expect("cpu gated_rms_norm");
    let want = rnd_vec::<T>(&want);
    let (dx, dp, dw) = (up::<T>(k, &x), up::<T>(k, &p), up::<T>(k, &w));
    let mut out = poisoned::<T>(k, t * hv * d);
    k.gated_norm_z(&dx, &dp, &dw, &mut out, t, hv, d, pw, zoff, EPS).expect("gated_norm_z launch");
    check(&format!("gated_norm_z {} [{t}·{hv}, {d}]", T::NAME), &down(k, &out), &want, tol::<T>());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gated_norm_z() {
    let k = gpu("cuda_gated_norm_z");
    let mut rng = Rng::new(41);
    gated_norm_z_case::<f32>(&k, &mut rng, 3, LIN_HV, LIN_D);
    gated_norm_z_case::<bf16>(&k, &mut rng, 17, LIN_HV, LIN_D);
    gated_norm_z_case::<half::f16>(&k, &mut rng, 2, 3, 50);
    // A warp a row: rows not a multiple of a block's 8, a row wider than the 256 values
    // held in registers (the loop), and the 80B layer at a 4k prefill.
    gated_norm_z_case::<bf16>(&k, &mut rng, 3, 5, 300);
    gated_norm_z_case::<bf16>(&k, &mut rng, 4096, LIN_HV, LIN_D);
}

fn gemv_case<A: CudaFloat, O: CudaFloat>(k: &CudaKernels, rng: &mut Rng, m: usize, kk: usize, n: usize) {
    let (dx, dw, want) = gemv_inputs::<A, O>(k, rng, m, kk, n);
    let mut out = poisoned::<O>(k, m * n);
    k.gemv::<A, O>(&dx, &dw, &mut out, m, kk, n).expect("gemv launch");
    check(&format!("gemv {}->{} [{m}, {kk}] x [{n}, {kk}]", A::NAME, O::NAME), &down(k, &out), &want, tol::<O>());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gemv() {
    let k = gpu("cuda_gemv");
    let mut rng = Rng::new(42);
    for m in [1, 3, 8] {
        gemv_case::<f32, f32>(&k, &mut rng, m, 24, 101);
        gemv_case::<bf16, bf16>(&k, &mut rng, m, HIDDEN, 2 * LIN_HK * LIN_D + 5);
        gemv_case::<bf16, f32>(&k, &mut rng, m, HIDDEN, 1000);
        gemv_case::<half::f16, half::f16>(&k, &mut rng, m, 4096, 64);
        gemv_case::<half::f16, f32>(&k, &mut rng, m, 40, 7);
    }
    assert!(!CudaKernels::gemv_fits::<bf16, bf16>(9, 64), "9 rows must not fit");
    assert!(!CudaKernels::gemv_fits::<bf16, bf16>(1, 12), "k = 12 is not a multiple of 8");
}

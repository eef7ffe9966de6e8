//! Tests of the gated delta rule against a brute-force reference (and a micro-benchmark).

use super::super::tests::{max_abs, max_diff, Rng};
use super::*;

/// Random GDN problem with realistic gates and normalised q, k.
struct Prob {
    t: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    s0: Vec<f32>,
}

impl Prob {
    fn new(seed: u64, t: usize, hk: usize, hv: usize, dk: usize, dv: usize, s0: bool) -> Self {
        let mut r = Rng::new(seed);
        let mut q = r.vec(t * hk * dk, 1.0);
        let mut k = r.vec(t * hk * dk, 1.0);
        l2norm_rows(&mut q, dk, (dk as f32).powf(-0.5)).unwrap();
        l2norm_rows(&mut k, dk, 1.0).unwrap();
        let v = r.vec(t * hv * dv, 1.0);
        let a = r.vec(t * hv, 4.0);
        let b = r.vec(t * hv, 4.0);
        // exp(A_log) from ~0.02 (slow decay) to ~12 (fast decay) across heads.
        let a_log: Vec<f32> = (0..hv).map(|h| -4.0 + 6.5 * h as f32 / (hv.max(2) - 1) as f32).collect();
        let dt_bias = r.vec(hv, 1.0);
        let mut g = vec![0.0; t * hv];
        let mut beta = vec![0.0; t * hv];
        gdn_gates(&a, &b, &a_log, &dt_bias, &mut g, &mut beta).unwrap();
        let s0 = if s0 { r.vec(hv * dk * dv, 0.5) } else { vec![0.0; hv * dk * dv] };
        Prob { t, hk, hv, dk, dv, q, k, v, g, beta, s0 }
    }

    /// Token range [a, b) of the inputs.
    fn slice(&self, a: usize, b: usize) -> Prob {
        let (hk, hv, dk, dv) = (self.hk, self.hv, self.dk, self.dv);
        Prob {
            t: b - a,
            hk,
            hv,
            dk,
            dv,
            q: self.q[a * hk * dk..b * hk * dk].to_vec(),
            k: self.k[a * hk * dk..b * hk * dk].to_vec(),
            v: self.v[a * hv * dv..b * hv * dv].to_vec(),
            g: self.g[a * hv..b * hv].to_vec(),
            beta: self.beta[a * hv..b * hv].to_vec(),
            s0: Vec::new(),
        }
    }

    /// Runs `f` (recurrent or chunked) from `state`; returns the output.
    fn run(&self, f: RuleFn, state: &mut [f32]) -> Vec<f32> {
        let mut out = vec![0.0; self.t * self.hv * self.dv];
        f(&self.q, &self.k, &self.v, &self.g, &self.beta, state, &mut out, self.t, self.hk, self.hv, self.dk, self.dv)
            .unwrap();
        out
    }
}

type RuleFn = fn(
    &[f32],
    &[f32],
    &[f32],
    &[f32],
    &[f32],
    &mut [f32],
    &mut [f32],
    usize,
    usize,
    usize,
    usize,
    usize,
) -> Result<(), GdnError>;

/// [`recurrent_gated_delta_rule`] forced onto the portable (non-AVX2) code.
#[allow(clippy::too_many_arguments)]
fn recurrent_portable(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    out: &mut [f32],
    t: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
) -> Result<(), GdnError> {
    let p = validate(q, k, v, g, beta, state.len(), out.len(), t, hk, hv, dk, dv)?;
    if t > 0 {
        for_each_head(&p, state, out, recurrent_head_impl::<false>);
    }
    Ok(())
}

/// The recurrence as plainly as possible, in f64, with dense updates.
fn brute_force(p: &Prob, state: &mut [f32]) -> Vec<f32> {
    let (hk, hv, dk, dv) = (p.hk, p.hv, p.dk, p.dv);
    let mut out = vec![0.0f32; p.t * hv * dv];
    for j in 0..hv {
        let kh = j / (hv / hk);
        let mut s: Vec<Vec<f64>> =
            (0..dk).map(|i| (0..dv).map(|c| state[(j * dk + i) * dv + c] as f64).collect()).collect();
        for tt in 0..p.t {
            let q: Vec<f64> = (0..dk).map(|i| p.q[(tt * hk + kh) * dk + i] as f64).collect();
            let k: Vec<f64> = (0..dk).map(|i| p.k[(tt * hk + kh) * dk + i] as f64).collect();
            let v: Vec<f64> = (0..dv).map(|c| p.v[(tt * hv + j) * dv + c] as f64).collect();
            let alpha = (p.g[tt * hv + j] as f64).exp();
            let beta = p.beta[tt * hv + j] as f64;
            for row in s.iter_mut() {
                for x in row.iter_mut() {
                    *x *= alpha;
                }
            }
            let mut delta = vec![0.0f64; dv];
            for c in 0..dv {
                let mut kv = 0.0;
                for i in 0..dk {
                    kv += s[i][c] * k[i];
                }
                delta[c] = beta * (v[c] - kv);
            }
            for i in 0..dk {
                for c in 0..dv {
                    s[i][c] += k[i] * delta[c];
                }
            }
            for c in 0..dv {
                let mut o = 0.0;
                for i in 0..dk {
                    o += s[i][c] * q[i];
                }
                out[(tt * hv + j) * dv + c] = o as f32;
            }
        }
        for i in 0..dk {
            for c in 0..dv {
                state[(j * dk + i) * dv + c] = s[i][c] as f32;
            }
        }
    }
    out
}

// 300 spans two slabs of `for_each_head`.
const TS: [usize; 8] = [1, 5, 63, 64, 65, 150, 200, 300];
// (hk, hv, dk, dv)
const CFGS: [(usize, usize, usize, usize); 2] = [(2, 4, 16, 24), (3, 3, 16, 24)];

#[test]
fn recurrent_and_chunked_match_brute_force() {
    for (name, f, tol) in [
        ("recurrent", recurrent_gated_delta_rule as RuleFn, 1e-5f32),
        ("chunked", chunked_gated_delta_rule as RuleFn, 1e-5f32),
        ("recurrent (portable path)", recurrent_portable as RuleFn, 1e-5f32),
    ] {
        let mut worst = 0.0f32;
        for &(hk, hv, dk, dv) in &CFGS {
            for &t in &TS {
                for s0 in [false, true] {
                    let p = Prob::new(7 + t as u64, t, hk, hv, dk, dv, s0);
                    let mut s_ref = p.s0.clone();
                    let o_ref = brute_force(&p, &mut s_ref);
                    let mut s = p.s0.clone();
                    let o = p.run(f, &mut s);
                    let d = max_diff(&o, &o_ref) / max_abs(&o_ref).max(1e-3);
                    let ds = max_diff(&s, &s_ref) / max_abs(&s_ref).max(1e-3);
                    worst = worst.max(d).max(ds);
                    assert!(
                        d <= tol && ds <= tol,
                        "{name} t={t} cfg={hk},{hv},{dk},{dv} s0={s0}: out {d:e} state {ds:e}"
                    );
                }
            }
        }
        println!("{name} vs f64 brute force: worst relative diff {worst:.2e}");
    }
}

#[test]
fn chunked_matches_recurrent() {
    let mut worst = 0.0f32;
    let mut cases: Vec<(usize, usize, usize, usize, usize)> = Vec::new();
    for &(hk, hv, dk, dv) in &CFGS {
        for &t in &TS {
            cases.push((t, hk, hv, dk, dv));
        }
    }
    cases.push((150, 1, 2, 128, 128));
    for (t, hk, hv, dk, dv) in cases {
        for s0 in [false, true] {
            let p = Prob::new(100 + t as u64, t, hk, hv, dk, dv, s0);
            let mut s_r = p.s0.clone();
            let o_r = p.run(recurrent_gated_delta_rule, &mut s_r);
            let mut s_c = p.s0.clone();
            let o_c = p.run(chunked_gated_delta_rule, &mut s_c);
            let scale = max_abs(&o_r).max(1e-3);
            let d = max_diff(&o_c, &o_r) / scale;
            let ds = max_diff(&s_c, &s_r) / max_abs(&s_r).max(1e-3);
            println!(
                "chunked vs recurrent t={t:3} hk={hk} hv={hv} dk={dk:3} dv={dv:3} s0={s0:5}: out scale {scale:.3e} rel diff {d:.2e}, state rel diff {ds:.2e}"
            );
            worst = worst.max(d).max(ds);
            assert!(d <= 1e-5 && ds <= 1e-5, "t={t}: out {d:e} state {ds:e}");
        }
    }
    println!("chunked vs recurrent: worst relative diff {worst:e}");
}

#[test]
fn state_carried_across_calls() {
    // Splits at 1, mid-chunk (30, 100), on a chunk boundary (64), past a
    // slab boundary (290) and one before the end (399).
    let (t, hk, hv, dk, dv) = (400, 2, 4, 16, 24);
    let p = Prob::new(42, t, hk, hv, dk, dv, true);
    let mut s_full = p.s0.clone();
    let o_full = p.run(recurrent_gated_delta_rule, &mut s_full);
    let scale = max_abs(&o_full);
    let n = hv * dv;
    let mut worst = 0.0f32;
    for t1 in [1, 30, 64, 100, 290, 399] {
        let (a, b) = (p.slice(0, t1), p.slice(t1, t));
        for (name, f1, f2) in [
            ("rec+rec", recurrent_gated_delta_rule as RuleFn, recurrent_gated_delta_rule as RuleFn),
            ("chunk+chunk", chunked_gated_delta_rule as RuleFn, chunked_gated_delta_rule as RuleFn),
            ("chunk+rec", chunked_gated_delta_rule as RuleFn, recurrent_gated_delta_rule as RuleFn),
            ("rec+chunk", recurrent_gated_delta_rule as RuleFn, chunked_gated_delta_rule as RuleFn),
        ] {
            let mut s = p.s0.clone();
            let mut o = a.run(f1, &mut s);
            o.extend(b.run(f2, &mut s));
            let d = max_diff(&o, &o_full) / scale;
            let ds = max_diff(&s, &s_full) / max_abs(&s_full);
            worst = worst.max(d).max(ds);
            assert!(d <= 1e-5 && ds <= 1e-5, "{name} t1={t1}: {d:e} {ds:e}");
        }
        // Chunked prefill, then recurrent decode token by token.
        let mut s = p.s0.clone();
        let mut o = a.run(chunked_gated_delta_rule, &mut s);
        for tt in t1..t {
            let one = p.slice(tt, tt + 1);
            let ot = one.run(recurrent_gated_delta_rule, &mut s);
            assert_eq!(ot.len(), n);
            o.extend(ot);
        }
        let d = max_diff(&o, &o_full) / scale;
        let ds = max_diff(&s, &s_full) / max_abs(&s_full);
        worst = worst.max(d).max(ds);
        assert!(d <= 1e-5 && ds <= 1e-5, "chunk prefill + decode t1={t1}: {d:e} {ds:e}");
    }
    println!("split calls vs one call: worst relative diff {worst:e}");
}

/// Micro-benchmark, run with
/// `cargo test -p porter-kernels --release -- --ignored --nocapture bench_gdn`.
/// Prefill: one call over T = 4096 tokens (Qwen3-Next GDN layer shapes),
/// best of 2. Decode: 256 single-token recurrent calls.
#[test]
#[ignore = "micro-benchmark: run with --ignored --nocapture"]
fn bench_gdn() {
    let (t, hk, hv, dk, dv) = (4096, 16, 32, 128, 128);
    let p = Prob::new(1, t, hk, hv, dk, dv, false);
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut counts = vec![1, 2, 4, 8, 16, all];
    counts.retain(|&n| n <= all);
    counts.dedup();
    for threads in counts {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            for (name, f) in [
                ("recurrent", recurrent_gated_delta_rule as RuleFn),
                ("chunked", chunked_gated_delta_rule as RuleFn),
            ] {
                let w = p.slice(0, 256);
                let mut s = vec![0.0; hv * dk * dv];
                let _ = w.run(f, &mut s);
                let mut best = f64::MAX;
                for _ in 0..2 {
                    let mut s = vec![0.0; hv * dk * dv];
                    let t0 = std::time::Instant::now();
                    let o = p.run(f, &mut s);
                    best = best.min(t0.elapsed().as_secs_f64());
                    std::hint::black_box(&o);
                }
                println!(
                    "{threads:2} threads  prefill {name:9}: T={t} Hv={hv} Hk={hk} dk={dk} dv={dv}: {:.3} s, {:.0} tokens/s",
                    best,
                    t as f64 / best
                );
            }
            let n = 256;
            let toks: Vec<Prob> = (0..n).map(|tt| p.slice(tt, tt + 1)).collect();
            let mut s = vec![0.0; hv * dk * dv];
            let mut out = vec![0.0; hv * dv];
            let t0 = std::time::Instant::now();
            for one in &toks {
                recurrent_gated_delta_rule(
                    &one.q, &one.k, &one.v, &one.g, &one.beta, &mut s, &mut out, 1, hk, hv,
                    dk, dv,
                )
                .unwrap();
            }
            let dt = t0.elapsed().as_secs_f64();
            println!(
                "{threads:2} threads  decode  recurrent: T=1 calls: {:.1} us/token/layer, {:.0} tokens/s",
                dt / n as f64 * 1e6,
                n as f64 / dt
            );
        });
    }
}

//! Programmatic dependent launch (kernels/src/cuda/pdl.rs): long chains of dependent
//! launches give exactly the values of plain stream order, and what a launch costs with
//! and without it.
//!
//! `#[ignore = "needs a CUDA GPU"]`: run with `--include-ignored --test-threads=1` (the test
//! sets `PORTER_PDL` for the second set of kernels it opens).

mod common;

use common::*;
use porter_kernels::cuda::{CudaKernels, PDL_ENV};
use std::time::Instant;

/// Elements of the chained buffers: several waves of blocks per launch, so a kernel that
/// started before its predecessor finished would overlap it.
const N: usize = 1 << 20;
/// Rounds of the chain (two launches each).
const ROUNDS: usize = 500;

/// `x += 1` then `acc += x`, `ROUNDS` times: `acc` reads what the launch before wrote (a
/// read after write) and the next `x += 1` overwrites what it read (a write after read).
/// Exact in f32: x = ROUNDS, acc = ROUNDS·(ROUNDS + 1)/2 everywhere. Returns µs a launch.
fn chain(k: &CudaKernels) -> f64 {
    let ones = up::<f32>(k, &vec![1.0; N]);
    let mut x = up::<f32>(k, &vec![0.0; N]);
    let mut acc = up::<f32>(k, &vec![0.0; N]);
    k.stream().synchronize().expect("sync");
    let t0 = Instant::now();
    for _ in 0..ROUNDS {
        k.add_into_f32::<f32>(&mut x, &ones).expect("x += 1");
        k.add_into_f32::<f32>(&mut acc, &x).expect("acc += x");
    }
    k.stream().synchronize().expect("sync");
    let us = t0.elapsed().as_secs_f64() * 1e6 / (2 * ROUNDS) as f64;
    let (xv, av) = (down(k, &x), down(k, &acc));
    let want = (ROUNDS * (ROUNDS + 1) / 2) as f32;
    let bad_x = xv.iter().filter(|&&v| v != ROUNDS as f32).count();
    let bad_a = av.iter().filter(|&&v| v != want).count();
    assert!(
        bad_x == 0 && bad_a == 0,
        "PDL {}: {bad_x} of {N} x elements != {ROUNDS}, {bad_a} acc elements != {want} (first: x {} acc {})",
        k.pdl(),
        xv.iter().find(|&&v| v != ROUNDS as f32).copied().unwrap_or(0.0),
        av.iter().find(|&&v| v != want).copied().unwrap_or(0.0),
    );
    us
}

/// Many tiny launches (one block of 32 elements): the launch-to-launch cost itself.
fn tiny(k: &CudaKernels) -> f64 {
    let ones = up::<f32>(k, &[1.0; 32]);
    let mut x = up::<f32>(k, &[0.0; 32]);
    k.stream().synchronize().expect("sync");
    let n = 4000;
    let t0 = Instant::now();
    for _ in 0..n {
        k.add_into_f32::<f32>(&mut x, &ones).expect("x += 1");
    }
    k.stream().synchronize().expect("sync");
    let us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
    assert!(down(k, &x).iter().all(|&v| v == n as f32), "PDL {}: tiny chain lost an update", k.pdl());
    us
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_pdl_chain() {
    let on = gpu("cuda_pdl_chain");
    println!("{}: PDL {} by default", on.arch(), if on.pdl() { "on" } else { "off" });
    let (c_on, t_on) = (chain(&on), tiny(&on));
    // Process-global: the scripts run this test alone (--test-threads=1).
    std::env::set_var(PDL_ENV, "0");
    let off = gpu("cuda_pdl_chain (PDL off)");
    std::env::remove_var(PDL_ENV);
    assert!(!off.pdl(), "{PDL_ENV}=0 must turn PDL off");
    let (c_off, t_off) = (chain(&off), tiny(&off));
    println!(
        "µs a launch (host-timed, queue-bound chain): {N}-element add {c_on:.2} with PDL / {c_off:.2} without; \
         32-element add {t_on:.2} / {t_off:.2}"
    );
}

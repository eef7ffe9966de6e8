//! CUDA graphs (`porter_core::model::graph`): a cache that replays decode and verify steps
//! from captured graphs gives the same logits as one that runs every forward eagerly — bit
//! for bit in f32 (f32 kernels are batch-invariant, so padding a batch up to its graph's size
//! changes nothing for the real rows) — on every architecture, through batch sizes that pad
//! (1..5 sequences on the 1, 2, 4, 8 buckets), a block-table width change (a context past
//! 256 positions), speculative verify rows with rollback, and the serving engine.
//!
//! `#[ignore = "needs a CUDA GPU"]`, run by `scripts/gpu-check.sh`.

use porter_core::engine::{EngineCore, SamplingParams};
use porter_core::{Batch, DType, LogitsFor, Model, StateCache};
use tests::engine_util::{cfg, greedy, run_all};
use tests::*;

/// Runs a fixed script of steps over 5 sequences and returns every step's logits.
fn script(m: &Model, graphs: bool) -> (Vec<Vec<f32>>, Option<porter_core::backend::cuda::graph::GraphStats>) {
    porter_core::backend::cuda::graph::set_enabled(true);
    let mut cache = m.new_cache_spec(5, 3).unwrap();
    if !graphs {
        cache.disable_graphs();
    }
    let vocab = m.info.vocab_size as u32;
    let tok = |i: usize| (i as u32 * 7919 + 11) % vocab;
    let seqs: Vec<_> = (0..5).map(|_| cache.alloc_seq().unwrap()).collect();
    // Prompts of 270 (past the 16-block table width), 3, 17, 1 and 40 tokens, in one batch.
    let lens = [270usize, 3, 17, 1, 40];
    let mut pos = [0usize; 5];
    let mut b = Batch::default();
    for (j, (&s, &n)) in seqs.iter().zip(&lens).enumerate() {
        let ids: Vec<u32> = (0..n).map(|i| tok(i + 100 * j)).collect();
        b.push(s, 0, &ids);
        pos[j] = n;
    }
    let mut out = vec![m.forward(&b, &mut cache, LogitsFor::Last).unwrap().logits.host_vec().unwrap()];
    let mut step = 0usize;
    // Decode steps over 1..5 sequences (pads to 1, 2, 4, 4, 8).
    for round in 0..3 {
        for n in 1..=5 {
            let mut b = Batch::default();
            for j in 0..n {
                b.push(seqs[j], pos[j], &[tok(step * 13 + j + round)]);
                pos[j] += 1;
            }
            step += 1;
            out.push(m.forward(&b, &mut cache, LogitsFor::Last).unwrap().logits.host_vec().unwrap());
        }
    }
    // Verify steps: 3 sequences × 4 rows, keep 1..3 of them, then a decode step.
    for round in 0..2 {
        let mut b = Batch::default();
        for j in 0..3 {
            let ids: Vec<u32> = (0..4).map(|i| tok(step * 17 + 4 * j + i)).collect();
            b.push(seqs[j], pos[j], &ids);
        }
        step += 1;
        out.push(m.forward(&b, &mut cache, LogitsFor::All).unwrap().logits.host_vec().unwrap());
        for j in 0..3 {
            let keep = 1 + (j + round) % 3;
            pos[j] += keep;
            cache.truncate(seqs[j], pos[j]).unwrap();
        }
        let mut b = Batch::default();
        for j in 0..3 {
            b.push(seqs[j], pos[j], &[tok(step + j)]);
            pos[j] += 1;
        }
        out.push(m.forward(&b, &mut cache, LogitsFor::Last).unwrap().logits.host_vec().unwrap());
    }
    let stats = cache.graph_stats();
    let (keys, failed) = cache.graph_shapes();
    if graphs {
        assert!(failed.is_empty(), "graph captures failed: {failed:?}");
        println!("  graphs captured: {keys:?}");
    }
    (out, stats)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_graphs_equal_eager_f32_every_architecture() {
    let _g = serial();
    let Some(dev) = cuda_or_skip("cuda_graphs_equal_eager_f32_every_architecture") else {
        panic!("cuda_graphs_equal_eager_f32_every_architecture: needs a CUDA GPU")
    };
    for name in ["qwen3_next_a", "qwen3_next_b", "qwen3_moe", "qwen3", "mistral", "mistral_swa"] {
        let m = load_on(name, DType::F32, dev).unwrap();
        let (eager, none) = script(&m, false);
        assert!(none.is_none());
        let (graphed, stats) = script(&m, true);
        let stats = stats.expect("graph stats");
        println!("cuda {name}: {stats:?}");
        assert!(stats.replays >= 19 && stats.failed == 0, "{name}: {stats:?}");
        assert_eq!(eager.len(), graphed.len());
        for (i, (a, b)) in eager.iter().zip(&graphed).enumerate() {
            let same = a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "cuda {name}: step {i}: graph replay differs from the eager forward");
        }
    }
}

/// bf16: the graphs replay the same kernels (a padded batch of at most 8 rows takes the same
/// row-invariant GEMV path), so the logits stay within the bf16 bar of eager ones.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_graphs_bf16_close_to_eager() {
    let _g = serial();
    let Some(dev) = cuda_or_skip("cuda_graphs_bf16_close_to_eager") else {
        panic!("cuda_graphs_bf16_close_to_eager: needs a CUDA GPU")
    };
    for name in ["qwen3_next_a", "qwen3_moe"] {
        let m = load_on(name, DType::BF16, dev).unwrap();
        let (eager, _) = script(&m, false);
        let (graphed, stats) = script(&m, true);
        println!("cuda {name} bf16: {stats:?}");
        for (i, (a, b)) in eager.iter().zip(&graphed).enumerate() {
            let d = assert_close(&format!("cuda {name} bf16 step {i} graph vs eager"), b, a, 5e-2);
            if i < 3 {
                println!("  step {i}: max|d| = {d:.3e} std");
            }
        }
    }
}

/// The serving engine with graphs (warm-up captured at start) answers as without: greedy
/// with log-probabilities (logits on the host) and plain greedy (argmax on the device).
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_engine_with_graphs_equals_eager() {
    let _g = serial();
    let Some(dev) = cuda_or_skip("cuda_engine_with_graphs_equals_eager") else {
        panic!("cuda_engine_with_graphs_equals_eager: needs a CUDA GPU")
    };
    let m = load_on("qwen3_next_a", DType::F32, dev).unwrap();
    let prompts: Vec<Vec<u32>> = (0..6u32).map(|j| (0..(5 + 9 * j)).map(|i| (i * 31 + j) % 200).collect()).collect();
    let device_greedy = SamplingParams {
        stop: porter_core::engine::StopParams { max_tokens: Some(12), ignore_eos: true, ..Default::default() },
        ..Default::default()
    };
    for params in [greedy(12), device_greedy] {
        let run = |graphs: bool| {
            porter_core::backend::cuda::graph::set_enabled(graphs);
            let e = EngineCore::new(&m, cfg(4, 256, 64));
            porter_core::backend::cuda::graph::set_enabled(true);
            let mut e = e.unwrap();
            let reqs: Vec<_> = prompts.iter().enumerate().map(|(i, p)| (i as u64, p.clone(), params.clone())).collect();
            let done = run_all(&mut e, &reqs);
            // The tokens (ids, log-probabilities): the final events carry timings.
            (0..prompts.len() as u64).map(|i| done[&i].0.clone()).collect::<Vec<_>>()
        };
        let eager = run(false);
        let graphed = run(true);
        assert_eq!(graphed, eager, "engine outputs differ with CUDA graphs");
    }
}

/// The tests of this file toggle the process-wide graph switch: one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static M: std::sync::Mutex<()> = std::sync::Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

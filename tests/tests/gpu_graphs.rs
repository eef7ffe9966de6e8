//! CUDA graphs (`porter_core::model::graph`): a cache that replays decode and verify steps
//! from captured graphs gives the same logits as one that runs every forward eagerly — bit
//! for bit in f32 (f32 kernels are batch-invariant, so padding a batch up to its graph's size
//! changes nothing for the real rows) — on every architecture, through batch sizes that pad
//! (1..5 sequences on the 1, 2, 4, 8 buckets), a block-table width change (a context past
//! 256 positions), speculative verify rows with rollback, and the serving engine.
//!
//! `#[ignore = "needs a CUDA GPU"]`, run by `scripts/gpu-check.sh`.

use porter_core::draft::DraftHead;
use porter_core::engine::{EngineCore, SamplingParams};
use porter_core::state::CacheConfig;
use porter_core::{config, registry, Batch, DType, LogitsFor, Model, StateCache};
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

/// Runs a fixed script of draft steps of `d` (after `m`'s prefill of a prompt): a catch-up of
/// 7 rows, 3 chained steps, a rollback to 2 positions past the catch-up and a catch-up of 3
/// rows, 2 chained steps; returns every step's logits and hidden, and the draft cache's graph
/// use.
fn draft_script(
    m: &Model,
    d: &dyn DraftHead,
    graphs: bool,
) -> (Vec<Vec<f32>>, Option<porter_core::backend::cuda::graph::GraphStats>) {
    porter_core::backend::cuda::graph::set_enabled(graphs);
    let dc = d.new_cache(&CacheConfig::for_tokens(1, 0, 64));
    porter_core::backend::cuda::graph::set_enabled(true);
    let mut dc = dc.unwrap();
    let ds = dc.alloc_seq().unwrap();
    let mut mc = m.new_cache_spec(1, 0).unwrap();
    let ms = mc.alloc_seq().unwrap();
    let prompt: Vec<u32> = vec![5, 77, 300, 12, 9, 41, 256, 3];
    let main = m.forward(&Batch::single(ms, 0, &prompt), &mut mc, LogitsFor::All).unwrap();
    let hid = d.main_hidden(m, &main.hidden).unwrap();
    let mut out = Vec::new();
    let mut keep = |o: &porter_core::draft::DraftOutput| {
        out.push(o.logits.host_vec().unwrap());
        out.push(o.hidden.host_vec().unwrap());
    };
    // Catch-up: rows 0..7 take tokens 1..8 and the main hidden of positions 0..7.
    let o = d
        .forward(m, &Batch::single(ds, 0, &prompt[1..]), &hid.narrow_rows(0, 7).unwrap(), &mut dc, LogitsFor::Last)
        .unwrap();
    keep(&o);
    let mut h = o.hidden.narrow_rows(6, 1).unwrap();
    for (i, t) in [17u32, 4, 99].into_iter().enumerate() {
        let o = d.forward(m, &Batch::single(ds, 7 + i, &[t]), &h, &mut dc, LogitsFor::Last).unwrap();
        keep(&o);
        h = o.hidden;
    }
    dc.truncate(ds, 5).unwrap();
    let o = d
        .forward(
            m,
            &Batch::single(ds, 5, &prompt[6..8].iter().chain(&[42]).copied().collect::<Vec<_>>()),
            &hid.narrow_rows(5, 3).unwrap(),
            &mut dc,
            LogitsFor::Last,
        )
        .unwrap();
    keep(&o);
    let mut h = o.hidden.narrow_rows(2, 1).unwrap();
    for (i, t) in [8u32, 250].into_iter().enumerate() {
        let o = d.forward(m, &Batch::single(ds, 8 + i, &[t]), &h, &mut dc, LogitsFor::Last).unwrap();
        keep(&o);
        h = o.hidden;
    }
    if graphs {
        let (keys, failed) = dc.graph_shapes();
        assert!(failed.is_empty(), "draft graph captures failed: {failed:?}");
        println!("  draft graphs captured: {keys:?}");
    }
    (out, dc.graph_stats())
}

/// The Qwen3-Next MTP head's steps replayed from CUDA graphs (catch-up rows and chained
/// steps, across a rollback) equal its eager steps bit for bit in f32, logits and hidden.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_draft_graphs_equal_eager_f32() {
    let _g = serial();
    let Some(dev) = cuda_or_skip("cuda_draft_graphs_equal_eager_f32") else {
        panic!("cuda_draft_graphs_equal_eager_f32: needs a CUDA GPU")
    };
    let m = load_on("qwen3_next_mtp", DType::F32, dev).unwrap();
    let cfg = config::read_config(&fixture("qwen3_next_mtp")).unwrap();
    let d = registry::load_draft(&fixture("qwen3_next_mtp"), &cfg, &m).unwrap();
    let (eager, none) = draft_script(&m, d.as_ref(), false);
    assert!(none.is_none());
    let (graphed, stats) = draft_script(&m, d.as_ref(), true);
    let stats = stats.expect("draft graph stats");
    println!("cuda qwen3_next_mtp draft: {stats:?}");
    // 7 steps: shapes (1, 7), (1, 1) and (1, 3) captured, every step replayed.
    assert!(stats.replays == 7 && stats.captures == 3 && stats.failed == 0, "{stats:?}");
    assert_eq!(eager.len(), graphed.len());
    for (i, (a, b)) in eager.iter().zip(&graphed).enumerate() {
        let same = a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "draft output {i} ({}): graph replay differs from the eager step", ["logits", "hidden"][i % 2]);
    }
}

/// The tests of this file toggle the process-wide graph switch: one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static M: std::sync::Mutex<()> = std::sync::Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

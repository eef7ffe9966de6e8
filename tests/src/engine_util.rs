//! Shared helpers of the engine tests (CPU in tests/engine.rs, CUDA in tests/gpu.rs).

use porter_core::engine::{EngineConfig, EngineCore, Event, SamplingParams, StopParams, TokenOut};
use porter_core::{DType, Device, Model};
use std::collections::HashMap;

/// A deterministic xorshift generator for prompts and schedules.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub fn prompt(&mut self, len: usize, vocab: usize) -> Vec<u32> {
        (0..len).map(|_| self.below(vocab) as u32).collect()
    }
}

pub fn cfg(seqs: usize, budget: usize, blocks: usize) -> EngineConfig {
    EngineConfig {
        max_num_batched_tokens: budget,
        max_num_seqs: seqs,
        block_size: 16,
        num_blocks: blocks,
        kv_dtype: Default::default(),
        state_checkpoints: 8 * seqs,
        checkpoint_stride: porter_core::state::CHECKPOINT_INTERVAL,
        prefix_caching: true,
        priority_scheduling: false,
    }
}

pub fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        logprobs: Some(5),
        stop: StopParams { max_tokens: Some(max_tokens), ignore_eos: true, ..Default::default() },
        ..Default::default()
    }
}

/// Runs every request to completion; returns each one's tokens and final event.
pub fn run_all(
    e: &mut EngineCore<&Model>,
    reqs: &[(u64, Vec<u32>, SamplingParams)],
) -> HashMap<u64, (Vec<TokenOut>, Event)> {
    for (id, p, params) in reqs {
        e.add_request(*id, p.clone(), params.clone()).unwrap();
    }
    let mut toks: HashMap<u64, Vec<TokenOut>> = HashMap::new();
    let mut done = HashMap::new();
    let mut steps = 0;
    while e.has_work() {
        for (id, ev) in e.step().unwrap() {
            match ev {
                Event::Token(t) => toks.entry(id).or_default().push(t),
                end => {
                    done.insert(id, (toks.remove(&id).unwrap_or_default(), end));
                }
            }
        }
        steps += 1;
        assert!(steps < 100_000, "engine did not finish");
    }
    done
}

/// Batch invariance of one f32 model on `device`: the probe request's output: alone, then in each hostile setting, bit for bit.
pub fn invariance(name: &str, recurrent: bool, device: Device) {
    invariance_in(name, recurrent, device, DType::F32)
}

/// [`invariance`] in `dtype` (bf16 needs deterministic mode on CUDA).
pub fn invariance_in(name: &str, recurrent: bool, device: Device, dtype: DType) {
    let m = crate::load_on(name, dtype, device).unwrap();
    let vocab = m.info.vocab_size;
    let mut rng = Rng(0x1234_5678);
    let probe = rng.prompt(150, vocab);
    let want = {
        let mut e = EngineCore::new(&m, cfg(1, 512, 64)).unwrap();
        run_all(&mut e, &[(0, probe.clone(), greedy(12))]).remove(&0).unwrap()
    };
    assert_eq!(want.0.len(), 12);
    let same = |what: &str, got: &(Vec<TokenOut>, Event)| {
        assert_eq!(got.0, want.0, "{name}: {what}: tokens / logprobs differ from the request alone");
    };
    // Among 31 others of mixed lengths (prefills and decodes share steps).
    let mut reqs = vec![(0, probe.clone(), greedy(12))];
    for i in 1..32 {
        let len = 1 + rng.below(200);
        reqs.push((i, rng.prompt(len, vocab), greedy(1 + rng.below(16))));
    }
    let mut e = EngineCore::new(&m, cfg(32, 256, 2048)).unwrap();
    let got = run_all(&mut e, &reqs);
    same("among 31 others", &got[&0]);
    // Split by chunked prefill: a budget far below the prompt (aligned chunks for GDN).
    let budget = if recurrent { 1 + 64 } else { 37 };
    let mut e = EngineCore::new(&m, cfg(1, budget, 64)).unwrap();
    let got = run_all(&mut e, &[(0, probe.clone(), greedy(12))]);
    // Three prefill steps (two chunks before the last piece) and 11 decode steps.
    assert!(e.stats().steps >= 3 + 11, "{name}: the prompt was not chunked");
    same("chunked prefill", &got[&0]);
    // With a prefix-cache hit: a first request leaves the probe's first 128 tokens cached.
    let mut e = EngineCore::new(&m, cfg(2, 512, 64)).unwrap();
    let mut first = probe[..130].to_vec();
    first.extend([1, 2, 3]);
    run_all(&mut e, &[(7, first, greedy(2))]);
    let got = run_all(&mut e, &[(0, probe.clone(), greedy(12))]);
    if let Event::Done(f) = &got[&0].1 {
        // Attention models: the 8 full 16-token blocks of the 130 shared tokens. Recurrent
        // models resume from the state checkpoint at 128 (chunk-aligned).
        assert_eq!(f.cached_tokens, 128, "{name}: hit within one block of the 130 shared tokens");
    }
    same("prefix-cache hit", &got[&0]);
    // After a preemption: a pool too small for both, the probe admitted second; it is
    // recomputed from its prompt (prefill pieces as before) and its generated tokens (decode-
    // sized pieces; one per step through recurrent layers), as they were first computed.
    let mut e = EngineCore::new(&m, cfg(2, 512, 14)).unwrap();
    let other = rng.prompt(60, vocab);
    let got = run_all(&mut e, &[(1, other, greedy(40)), (0, probe.clone(), greedy(12))]);
    assert!(e.stats().preemptions > 0, "{name}: nothing was preempted");
    if let Event::Done(f) = &got[&0].1 {
        assert!(f.preemptions > 0, "{name}: the probe itself was not preempted");
    }
    same("after a preemption", &got[&0]);
}

/// A hybrid model's prefix cache saving checkpoints only every 1024 positions (the GPU
/// default) on `device`: a first prompt `a` (system prompt + 90) saves one at its last
/// aligned position (256); `b` (system + 150) hits 3 KV blocks (192) but no checkpoint, so it
/// saves one at that branch point besides its own end (320); `c` (system + 30) then resumes
/// at 192; a follow-up turn of `a` (its prompt, its answer and more) resumes at 256. Every
/// output equals its cold run bit for bit (f32), and no checkpoint leaks.
pub fn hybrid_branch_point_checkpoints(device: Device) {
    let m = crate::load_on("qwen3_next_a", DType::F32, device).unwrap();
    let vocab = m.info.vocab_size;
    let mut rng = Rng(99);
    let system = rng.prompt(200, vocab);
    let c_cfg = EngineConfig { block_size: 64, checkpoint_stride: 1024, ..cfg(4, 512, 64) };
    let mut warm = EngineCore::new(&m, c_cfg).unwrap();
    let mut run = |id: u64, prompt: Vec<u32>, want_cached: usize| {
        let r = (id, prompt, greedy(8));
        let cold = {
            let mut e = EngineCore::new(&m, c_cfg).unwrap();
            run_all(&mut e, std::slice::from_ref(&r)).remove(&id).unwrap()
        };
        let got = run_all(&mut warm, std::slice::from_ref(&r)).remove(&id).unwrap();
        assert_eq!(got.0, cold.0, "request {id} on {device}: a prefix-cache hit changed the output");
        let Event::Done(f) = got.1 else { panic!("request {id} did not finish") };
        assert_eq!(f.cached_tokens, want_cached, "request {id} on {device}: cached tokens");
        got.0.iter().map(|t| t.id).collect::<Vec<u32>>()
    };
    let a = [system.clone(), rng.prompt(90, vocab)].concat();
    let answer = run(0, a.clone(), 0);
    run(1, [system.clone(), rng.prompt(150, vocab)].concat(), 0);
    run(2, [system.clone(), rng.prompt(30, vocab)].concat(), 192);
    run(3, [a, answer, rng.prompt(20, vocab)].concat(), 256);
    let s = warm.stats();
    assert_eq!(s.prefix_hit_tokens, 192 + 256);
    // Request 1's 192 matched tokens had no checkpoint: recomputed, and counted so.
    assert_eq!(s.prefix_unresumed_tokens, 192);
    assert!(s.state_checkpoints_cached > 0 && s.state_checkpoints_cached <= s.state_checkpoints_total);
    assert_eq!(s.kv_blocks_free, s.kv_blocks_total);
    let (total, reusable) = warm.cache().checkpoints();
    assert_eq!(reusable, total, "recurrent checkpoints leaked");
}

/// The engine's device sampling path (CUDA, requests without logprobs or penalties: only
/// the ids come back) picks the tokens the host path picks: 8 requests, greedy and seeded
/// temperature / top-k / top-p, batched on `device`, against the same requests on the CPU.
pub fn device_sampling_matches_host(name: &str, device: Device) {
    let gpu = crate::load_on(name, DType::F32, device).unwrap();
    let cpu = crate::load_on(name, DType::F32, Device::Cpu).unwrap();
    let vocab = gpu.info.vocab_size;
    let mut rng = Rng(0xD5_A3);
    let mut reqs = Vec::new();
    for i in 0..8u64 {
        let stop = StopParams { max_tokens: Some(16), ignore_eos: true, ..Default::default() };
        let p = match i % 4 {
            0 => SamplingParams { stop, ..Default::default() },
            1 => SamplingParams { temperature: 0.8, top_k: Some(20), seed: Some(i), stop, ..Default::default() },
            2 => SamplingParams { temperature: 1.0, top_p: Some(0.9), seed: Some(i), stop, ..Default::default() },
            _ => SamplingParams {
                temperature: 0.7,
                top_k: Some(50),
                top_p: Some(0.8),
                seed: Some(i),
                stop,
                ..Default::default()
            },
        };
        let len = 3 + rng.below(40);
        reqs.push((i, rng.prompt(len, vocab), p));
    }
    let mut eg = EngineCore::new(&gpu, cfg(8, 256, 64)).unwrap();
    let mut ec = EngineCore::new(&cpu, cfg(8, 256, 64)).unwrap();
    let (g, c) = (run_all(&mut eg, &reqs), run_all(&mut ec, &reqs));
    for (id, _, p) in &reqs {
        let ids = |m: &HashMap<u64, (Vec<TokenOut>, Event)>| m[id].0.iter().map(|t| t.id).collect::<Vec<_>>();
        assert_eq!(ids(&g), ids(&c), "{name} request {id} ({p:?}): device and host sampling disagree");
        assert_eq!(ids(&g).len(), 16);
    }
}

//! The serving engine on the CPU: batch invariance (f32 greedy tokens and log-probabilities
//! bit-identical alone, among 31 others of mixed lengths, split by chunked prefill, after a
//! preemption, with a prefix-cache hit), the scheduler's accounting under a few thousand
//! randomized requests with aborts and preemptions (no leaked block or slot), admission
//! errors, and the threaded engine's streams.

use porter_core::engine::{Engine, EngineConfig, EngineCore, Event, Finish, SamplingParams, StopParams, TokenOut};
use porter_core::{DType, Device};
use std::collections::HashMap;
use tests::engine_util::{cfg, greedy, invariance, run_all, Rng};
use tests::load;

#[test]
fn batch_invariance_attention_model() {
    invariance("qwen3", false, Device::Cpu);
}

#[test]
fn batch_invariance_moe_model() {
    invariance("qwen3_moe", false, Device::Cpu);
}

#[test]
fn batch_invariance_hybrid_gdn_model() {
    invariance("qwen3_next_a", true, Device::Cpu);
}

/// Greedy output through the engine equals the single-request `generate` path on the same
/// prompt (the reference path checked against transformers in parity.rs).
#[test]
fn engine_matches_generate() {
    let m = load("qwen3", DType::F32).unwrap();
    let prompt: Vec<u32> = (0..20).map(|i| (i * 7 + 3) % 512).collect();
    let g = porter_core::generate::generate(&m, &prompt, SamplingParams::default(), 10, &[]).unwrap();
    let mut e = EngineCore::new(&m, cfg(4, 512, 64)).unwrap();
    let got = run_all(&mut e, &[(0, prompt, greedy(10))]);
    assert_eq!(got[&0].0.iter().map(|t| t.id).collect::<Vec<_>>(), g.ids);
}

/// A few thousand randomized requests with aborts and preemptions on a small pool: every
/// request ends exactly once, and the pool and slots come back whole.
#[test]
fn no_leaks_no_lost_requests() {
    leak_test("qwen3", 3000, 16);
}

/// The same on the hybrid GDN model (checkpoints saved and restored by the prefix cache too),
/// with 64-token blocks.
#[test]
fn no_leaks_no_lost_requests_hybrid() {
    leak_test("qwen3_next_a", 400, 64);
}

fn leak_test(name: &str, n_requests: u64, block_size: usize) {
    let m = load(name, DType::F32).unwrap();
    let vocab = m.info.vocab_size;
    let mut rng = Rng(0xfeed_beef);
    let blocks = 320 / block_size;
    let mut e = EngineCore::new(&m, EngineConfig { block_size, ..cfg(8, 96, blocks) }).unwrap();
    let (total, slots) = (e.stats().kv_blocks_total, e.stats().state_slots_total);
    let t0 = std::time::Instant::now();
    let (mut next, mut ended, mut aborted) = (0u64, 0usize, 0usize);
    let mut open: Vec<u64> = Vec::new();
    while next < n_requests || e.has_work() {
        // A few arrivals per step, with shared prefixes now and then.
        for _ in 0..rng.below(4) {
            if next < n_requests {
                let len = 1 + rng.below(40 * block_size / 16);
                let mut p = rng.prompt(len, vocab);
                if rng.below(3) == 0 {
                    p[..len.min(block_size)].iter_mut().for_each(|t| *t = 5);
                }
                let stop = StopParams { max_tokens: Some(1 + rng.below(24 * block_size / 16)), ..Default::default() };
                let params = SamplingParams { stop, ..Default::default() };
                e.add_request(next, p, params).unwrap();
                open.push(next);
                next += 1;
            }
        }
        if !open.is_empty() && rng.below(10) == 0 {
            let id = open.swap_remove(rng.below(open.len()));
            if let Some(Event::Done(f)) = e.abort(id).unwrap() {
                assert_eq!(f.reason, Finish::Abort);
                aborted += 1;
                ended += 1;
            }
        }
        for (id, ev) in e.step().unwrap() {
            if let Event::Done(_) = ev {
                open.retain(|&x| x != id);
                ended += 1;
            }
        }
        assert!(t0.elapsed().as_secs() < 240, "leak test ran too long");
    }
    let s = e.stats();
    assert_eq!(ended as u64, n_requests, "every request ends exactly once");
    assert!(
        aborted > 0 && s.preemptions > 0,
        "the mix must include aborts ({aborted}) and preemptions ({})",
        s.preemptions
    );
    assert_eq!(s.kv_blocks_free, total, "KV blocks leaked");
    assert_eq!(s.state_slots_free, slots, "state slots leaked");
    assert_eq!((s.running, s.waiting), (0, 0));
    let (ck_total, ck_reusable) = e.cache().checkpoints();
    assert_eq!(ck_reusable, ck_total, "recurrent checkpoints leaked");
    eprintln!(
        "{n_requests} requests, {aborted} aborted, {} preemptions, {} steps, prefix hits {} tokens",
        s.preemptions, s.steps, s.prefix_hit_tokens
    );
}

#[test]
fn admission_errors_name_the_problem() {
    let m = load("qwen3", DType::F32).unwrap();
    let mut e = EngineCore::new(&m, cfg(2, 64, 4)).unwrap();
    let too_long = e.add_request(1, vec![1; 60], greedy(10)).unwrap_err().to_string();
    assert!(too_long.contains("whole KV cache"), "{too_long}");
    let empty = e.add_request(2, vec![], greedy(1)).unwrap_err().to_string();
    assert!(empty.contains("empty"), "{empty}");
    let vocab = e.add_request(3, vec![9999], greedy(1)).unwrap_err().to_string();
    assert!(vocab.contains("out of range"), "{vocab}");
    let bad = SamplingParams {
        stop: StopParams { min_tokens: 5, max_tokens: Some(2), ..Default::default() },
        ..Default::default()
    };
    assert!(e.add_request(4, vec![1], bad).unwrap_err().to_string().contains("min_tokens"));
    let lp = SamplingParams { logprobs: Some(21), ..Default::default() };
    assert!(e.add_request(5, vec![1], lp).unwrap_err().to_string().contains("logprobs"));
    assert!(!e.has_work(), "nothing refused is queued");
    let zero = EngineCore::new(&m, cfg(0, 64, 4)).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(zero.contains("must be > 0"), "{zero}");
}

#[test]
fn min_tokens_and_stop_ids() {
    let m = load("qwen3", DType::F32).unwrap();
    let prompt: Vec<u32> = (0..12).collect();
    let mut e = EngineCore::new(&m, cfg(2, 64, 16)).unwrap();
    let free = run_all(&mut e, &[(0, prompt.clone(), greedy(8))]).remove(&0).unwrap();
    let first = free.0[0].id;
    // Stopping at the first greedy token...
    let mut stop = greedy(8);
    stop.stop.stop_token_ids = vec![first];
    let got = run_all(&mut e, &[(1, prompt.clone(), stop.clone())]).remove(&1).unwrap();
    assert_eq!(got.0.len(), 1);
    assert!(matches!(got.1, Event::Done(ref f) if f.reason == Finish::Stop));
    // ...unless min_tokens masks it.
    let mut min = stop;
    min.stop.min_tokens = 3;
    let got = run_all(&mut e, &[(2, prompt, min)]).remove(&2).unwrap();
    assert!(got.0.len() >= 3 && got.0[0].id != first);
    // Log-probabilities: the chosen (greedy) token is the top alternative.
    assert_eq!(free.0[0].top[0].0, first);
    assert_eq!(Some(free.0[0].top[0].1), free.0[0].logprob);
    assert!(free.0[0].top.windows(2).all(|w| w[0].1 >= w[1].1));
}

#[test]
fn threaded_engine_streams_and_aborts() {
    let m = load("qwen3", DType::F32).unwrap();
    let engine = std::sync::Arc::new(Engine::start(m, cfg(8, 256, 256)).unwrap());
    let handles: Vec<_> = (0..6u32)
        .map(|i| {
            let e = engine.clone();
            std::thread::spawn(move || {
                let s = e.add((0..(5 + i)).collect(), greedy(6)).unwrap();
                s.collect()
            })
        })
        .collect();
    for h in handles {
        let (toks, end) = h.join().unwrap();
        assert_eq!(toks.len(), 6);
        assert!(matches!(end, Some(Event::Done(ref f)) if f.reason == Finish::Length && f.completion_tokens == 6));
    }
    let s = engine.add(vec![1, 2, 3], greedy(4000)).unwrap();
    engine.abort(s.id).unwrap();
    let (_, end) = s.collect();
    assert!(matches!(end, Some(Event::Done(ref f)) if f.reason == Finish::Abort), "{end:?}");
    let st = engine.stats();
    assert_eq!(st.kv_blocks_free, st.kv_blocks_total);
    let err = engine.add(vec![], greedy(1)).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("empty"), "{err}");
    engine.shutdown();
}

/// MTP inside the batch: 6 requests of mixed lengths drafting K tokens each per step, one
/// verify forward for all; every request's greedy output equals the engine without drafts
/// token for token (f32), for a stateful (attention) draft on a hybrid GDN model and on MoE.
#[test]
fn mtp_in_the_batch_is_exact() {
    use porter_core::engine::batcher::SpecConfig;
    use porter_core::speculative::MtpMode;
    use porter_core::{config, registry};
    for (main, draft) in [("qwen3_next_mtp", "qwen3_next_mtp"), ("qwen3_moe", "qwen3_moe_mtp_draft")] {
        let m = load(main, DType::F32).unwrap();
        let mcfg = config::read_config(&tests::fixture(main)).unwrap();
        let mut rng = Rng(77);
        let reqs: Vec<(u64, Vec<u32>, SamplingParams)> = (0..6u64)
            .map(|i| {
                let len = 3 + rng.below(90);
                (i, rng.prompt(len, m.info.vocab_size), greedy(8 + rng.below(24)))
            })
            .collect();
        let plain = {
            let mut e = EngineCore::new(&m, cfg(6, 512, 256)).unwrap();
            run_all(&mut e, &reqs)
        };
        for k in [1, 3] {
            let d = registry::load_draft(&tests::fixture(draft), &mcfg, &m).unwrap();
            let spec = SpecConfig { drafts: vec![d], k, mode: MtpMode::Eagle };
            let mut e = EngineCore::with_spec(&m, cfg(6, 512, 256), Some(spec)).unwrap();
            let got = run_all(&mut e, &reqs);
            let s = e.stats();
            for (id, _, _) in &reqs {
                let ids =
                    |x: &(Vec<porter_core::engine::TokenOut>, Event)| x.0.iter().map(|t| t.id).collect::<Vec<_>>();
                assert_eq!(ids(&got[id]), ids(&plain[id]), "{main} k={k} request {id}: differs from plain greedy");
            }
            assert!(s.spec_drafted > 0 && s.spec_accepted_at.len() == k);
            assert_eq!(s.spec_accepted, s.spec_accepted_at.iter().sum::<u64>());
            eprintln!(
                "{main} k={k}: {} verify steps, acceptance {:.2}, {:.2} tokens per verify step, by position {:?}",
                s.spec_steps,
                s.spec_accepted as f64 / s.spec_drafted as f64,
                (s.spec_accepted + s.spec_steps) as f64 / s.spec_steps as f64,
                s.spec_accepted_at
            );
            assert_eq!(s.kv_blocks_free, s.kv_blocks_total);
        }
    }
}

/// A draft that knows the answers: it proposes the plain greedy continuation of whichever
/// reference sequence its history matches, except at every `wrong`-th position, where it
/// proposes a wrong token, so verification accepts runs of drafts and rejects at varying
/// positions (exercising per-sequence rollback of the KV and recurrent state).
struct Oracle {
    seqs: Vec<Vec<u32>>,
    vocab: usize,
    wrong: usize,
    hist: std::sync::Mutex<HashMap<usize, Vec<u32>>>,
}

impl porter_core::draft::DraftHead for Oracle {
    fn name(&self) -> &str {
        "oracle"
    }

    fn forward(
        &self,
        _main: &porter_core::Model,
        batch: &porter_core::Batch,
        hidden: &porter_core::Tensor,
        _cache: &mut dyn porter_core::StateCache,
        _rows: porter_core::LogitsFor,
    ) -> porter_core::Result<porter_core::draft::DraftOutput> {
        let mut hist = self.hist.lock().unwrap();
        let mut logits = vec![0.0f32; batch.spans.len() * self.vocab];
        for (i, s) in batch.spans.iter().enumerate() {
            // Row r holds token pos0 + r + 1; history = tokens 1..=pos0 + len.
            let h = hist.entry(s.seq.0).or_default();
            h.truncate(s.pos0);
            h.extend_from_slice(&batch.ids[s.start..s.start + s.len]);
            let n = h.len();
            let next = self.seqs.iter().find(|q| q.len() > n + 1 && q[1..=n] == h[..]).map_or(0, |q| q[n + 1]);
            let tok = if (n + 1).is_multiple_of(self.wrong) { (next + 1) % self.vocab as u32 } else { next };
            logits[i * self.vocab + tok as usize] = 30.0;
        }
        let logits = porter_core::Tensor::from_vec(logits, [batch.spans.len(), self.vocab], porter_core::DType::F32)?;
        Ok(porter_core::draft::DraftOutput { logits, hidden: hidden.try_clone()? })
    }
}

/// With drafts that are mostly right, acceptance is high and the output is still exactly the
/// plain greedy output, for every request of the batch (hybrid GDN + attention model: the
/// recurrent state rolls back per sequence).
#[test]
fn mtp_in_the_batch_accepts_and_rolls_back_exactly() {
    use porter_core::engine::batcher::SpecConfig;
    use porter_core::speculative::MtpMode;
    for main in ["qwen3_next_a", "qwen3"] {
        let m = load(main, DType::F32).unwrap();
        let mut rng = Rng(99);
        let reqs: Vec<(u64, Vec<u32>, SamplingParams)> = (0..6u64)
            .map(|i| {
                let len = 3 + rng.below(90);
                (i, rng.prompt(len, m.info.vocab_size), greedy(20 + rng.below(20)))
            })
            .collect();
        let plain = {
            let mut e = EngineCore::new(&m, cfg(6, 512, 256)).unwrap();
            run_all(&mut e, &reqs)
        };
        let ids = |x: &(Vec<TokenOut>, Event)| x.0.iter().map(|t| t.id).collect::<Vec<_>>();
        let seqs: Vec<Vec<u32>> = reqs.iter().map(|(id, p, _)| [p.clone(), ids(&plain[id])].concat()).collect();
        // Plain greedy (no log-probabilities): drafts are argmaxes kept as one-hot (empty)
        // distributions, which the verify reads as such.
        let plain_reqs: Vec<_> =
            reqs.iter().map(|(i, p, s)| (*i, p.clone(), SamplingParams { logprobs: None, ..s.clone() })).collect();
        for (k, lp) in [(2, true), (4, true), (3, false)] {
            let oracle = Oracle { seqs: seqs.clone(), vocab: m.info.vocab_size, wrong: 5, hist: Default::default() };
            let spec = SpecConfig { drafts: vec![Box::new(oracle)], k, mode: MtpMode::Eagle };
            let mut e = EngineCore::with_spec(&m, cfg(6, 512, 256), Some(spec)).unwrap();
            let got = run_all(&mut e, if lp { &reqs } else { &plain_reqs });
            for (id, _, _) in &reqs {
                assert_eq!(ids(&got[id]), ids(&plain[id]), "{main} k={k} request {id}");
                if lp {
                    assert_eq!(got[id].0, plain[id].0, "{main} k={k} request {id}: logprobs differ");
                }
            }
            let s = e.stats();
            let rate = s.spec_accepted as f64 / s.spec_drafted as f64;
            eprintln!("{main} k={k}: acceptance {rate:.2}, by position {:?}", s.spec_accepted_at);
            assert!(rate > 0.5, "{main} k={k}: the oracle should be accepted mostly, got {rate}");
            assert!(s.spec_accepted_at.iter().all(|&a| a > 0));
            assert_eq!((s.kv_blocks_free, s.state_slots_free), (s.kv_blocks_total, s.state_slots_total));
        }
    }
}

/// A stop id among a verify step's accepted drafts (not its last token) ends the request at
/// that token: the output is the plain greedy output up to the stop (inclusive), reason stop,
/// and every block and state slot comes back. (This used to panic the engine thread: the
/// step's computed length counted the drafts after the stop.)
#[test]
fn mtp_stop_among_accepted_drafts_ends_there() {
    use porter_core::engine::batcher::SpecConfig;
    use porter_core::engine::Finish;
    use porter_core::speculative::MtpMode;
    for main in ["qwen3_next_a", "qwen3"] {
        let m = load(main, DType::F32).unwrap();
        let mut rng = Rng(5);
        let prompt = rng.prompt(20, m.info.vocab_size);
        let plain = {
            let mut e = EngineCore::new(&m, cfg(2, 512, 256)).unwrap();
            run_all(&mut e, &[(0, prompt.clone(), greedy(24))])
        };
        let out: Vec<u32> = plain[&0].0.iter().map(|t| t.id).collect();
        let seqs = vec![[prompt.clone(), out.clone()].concat()];
        for at in [2, 5, 9] {
            let first = out.iter().position(|&t| t == out[at]).unwrap_or(at);
            let mut params = greedy(24);
            params.stop.stop_token_ids = vec![out[at]];
            for k in [2, 4] {
                let oracle =
                    Oracle { seqs: seqs.clone(), vocab: m.info.vocab_size, wrong: 1000, hist: Default::default() };
                let spec = SpecConfig { drafts: vec![Box::new(oracle)], k, mode: MtpMode::Eagle };
                let mut e = EngineCore::with_spec(&m, cfg(2, 512, 256), Some(spec)).unwrap();
                let got = run_all(&mut e, &[(0, prompt.clone(), params.clone())]);
                let ids: Vec<u32> = got[&0].0.iter().map(|t| t.id).collect();
                assert_eq!(ids, out[..=first], "{main} stop at {at} k={k}");
                assert!(matches!(&got[&0].1, Event::Done(f) if f.reason == Finish::Stop), "{main} at {at} k={k}");
                let s = e.stats();
                assert_eq!((s.kv_blocks_free, s.state_slots_free), (s.kv_blocks_total, s.state_slots_total));
            }
        }
    }
}

/// The hybrid prefix cache: requests sharing a 200-token "system prompt" with unique
/// suffixes resume from the deepest recurrent-state checkpoint (every 64 positions) inside the
/// shared part: the hit is within one 64-token block of the true shared prefix (192), and each
/// request's output equals its cold run bit for bit (f32, CPU).
#[test]
fn hybrid_prefix_cache_hits_within_one_block_and_is_exact() {
    let m = load("qwen3_next_a", DType::F32).unwrap();
    let vocab = m.info.vocab_size;
    let mut rng = Rng(4242);
    let system = rng.prompt(200, vocab);
    let reqs: Vec<(u64, Vec<u32>, SamplingParams)> = (0..4u64)
        .map(|i| {
            let len = 20 + rng.below(60);
            ([system.clone(), rng.prompt(len, vocab)].concat(), i)
        })
        .map(|(p, i)| (i, p, greedy(6)))
        .collect();
    let block = EngineConfig { block_size: 64, ..cfg(4, 512, 64) };
    let mut warm = EngineCore::new(&m, block).unwrap();
    for (i, r) in reqs.iter().enumerate() {
        let cold = {
            let mut e = EngineCore::new(&m, block).unwrap();
            run_all(&mut e, std::slice::from_ref(r)).remove(&r.0).unwrap()
        };
        let got = run_all(&mut warm, std::slice::from_ref(r)).remove(&r.0).unwrap();
        assert_eq!(got.0, cold.0, "request {i}: a prefix-cache hit changed the output");
        let Event::Done(f) = got.1 else { panic!("request {i} did not finish") };
        assert_eq!(f.cached_tokens, if i == 0 { 0 } else { 192 }, "request {i}");
    }
    // A prompt shorter than one block has nothing to share.
    let short = rng.prompt(40, vocab);
    let got = run_all(&mut warm, &[(9, short, greedy(2))]).remove(&9).unwrap();
    assert!(matches!(got.1, Event::Done(ref f) if f.cached_tokens == 0));
    let s = warm.stats();
    assert_eq!(s.kv_blocks_free, s.kv_blocks_total);
    assert_eq!(s.prefix_hit_tokens, 3 * 192);
}

/// Checkpoints saved only every 1024 positions (the GPU default): a branch point and a
/// span's end are saved besides, so later prompts still resume within a block of what they
/// share (see `hybrid_branch_point_checkpoints`).
#[test]
fn hybrid_prefix_cache_saves_branch_points() {
    tests::engine_util::hybrid_branch_point_checkpoints(Device::Cpu);
}

/// `prefix_caching: false` (`--no-enable-prefix-caching`): a repeated prompt is computed
/// whole, on an attention model and a hybrid one, with the same output.
#[test]
fn prefix_caching_can_be_turned_off() {
    for name in ["qwen3", "qwen3_next_a"] {
        let m = load(name, DType::F32).unwrap();
        let prompt: Vec<u32> = (0..150).map(|i| (i * 13 + 5) % 200).collect();
        let on = EngineConfig { block_size: 64, ..cfg(2, 512, 16) };
        let off = EngineConfig { prefix_caching: false, ..on };
        for (c, want_hit) in [(on, 128), (off, 0)] {
            let mut e = EngineCore::new(&m, c).unwrap();
            let first = run_all(&mut e, &[(0, prompt.clone(), greedy(4))]).remove(&0).unwrap();
            let again = run_all(&mut e, &[(1, prompt.clone(), greedy(4))]).remove(&1).unwrap();
            assert_eq!(again.0, first.0, "{name}: the repeated prompt's output");
            assert!(matches!(again.1, Event::Done(ref f) if f.cached_tokens == want_hit), "{name}: {:?}", again.1);
            assert_eq!(e.stats().prefix_hit_tokens, want_hit as u64);
        }
    }
}

/// vLLM's `cache_salt`: requests share cached blocks (and, on a hybrid, state checkpoints)
/// only with requests of the same salt; the outputs are the same either way.
#[test]
fn cache_salt_isolates_prefixes() {
    for name in ["qwen3", "qwen3_next_a"] {
        let m = load(name, DType::F32).unwrap();
        let prompt: Vec<u32> = (0..150).map(|i| (i * 13 + 5) % 200).collect();
        let mut e = EngineCore::new(&m, EngineConfig { block_size: 64, ..cfg(2, 512, 16) }).unwrap();
        let mut first = None;
        for (id, salt, want_hit) in [(0, None, 0), (1, Some(7), 0), (2, Some(8), 0), (3, Some(7), 128), (4, None, 128)]
        {
            let params = SamplingParams { cache_salt: salt, ..greedy(4) };
            let got = run_all(&mut e, &[(id, prompt.clone(), params)]).remove(&id).unwrap();
            assert!(matches!(got.1, Event::Done(ref f) if f.cached_tokens == want_hit), "{name} {id}: {:?}", got.1);
            assert_eq!(&got.0, first.get_or_insert_with(|| got.0.clone()), "{name} {id}: the output");
        }
    }
}

/// Prompt log-probabilities (OpenAI's `echo` with `logprobs`): each prompt token's
/// log-softmax from transformers' f32 logits of the row before it (`reference.safetensors`),
/// within 1e-4, its top-3 alternatives the reference's; the same bits when the prompt is
/// prefilled in pieces beside other requests; sent once, before the first token.
#[test]
fn prompt_logprobs_match_transformers() {
    for name in ["qwen3", "qwen3_next_a"] {
        let m = load(name, DType::F32).unwrap();
        let r = tests::Reference::open(name).unwrap();
        let ids = r.ids("ids_long").unwrap();
        let want = r.f32("logits_long").unwrap();
        let vocab = want.len() / ids.len();
        let params = SamplingParams { prompt_logprobs: Some(3), ..greedy(2) };
        let run = |budget: usize, others: usize| {
            let mut e = EngineCore::new(&m, cfg(4, budget, 64)).unwrap();
            let mut reqs = vec![(0, ids.clone(), params.clone())];
            reqs.extend((1..=others as u64).map(|i| (i, vec![i as u32 + 3; 40], greedy(3))));
            for (id, p, sp) in &reqs {
                e.add_request(*id, p.clone(), sp.clone()).unwrap();
            }
            let mut events = Vec::new();
            while e.has_work() {
                events.extend(e.step().unwrap().into_iter().filter(|(id, _)| *id == 0).map(|(_, ev)| ev));
            }
            events
        };
        let events = run(512, 0);
        let Some(Event::Prompt(lp)) = events.first() else { panic!("{name}: the prompt event comes first") };
        assert_eq!(events.iter().filter(|e| matches!(e, Event::Prompt(_))).count(), 1);
        assert!(matches!(events[1], Event::Token(_)));
        assert_eq!(lp.len(), ids.len());
        assert!(lp[0].is_none());
        for p in 1..ids.len() {
            let row = &want[(p - 1) * vocab..p * vocab];
            let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let lse = max as f64 + row.iter().map(|&v| ((v - max) as f64).exp()).sum::<f64>().ln();
            let t = lp[p].as_ref().unwrap_or_else(|| panic!("{name}: position {p} has no log-probability"));
            assert_eq!(t.id, ids[p]);
            let d = (t.logprob as f64 - (row[ids[p] as usize] as f64 - lse)).abs();
            let rank = 1 + row.iter().filter(|&&x| x > row[ids[p] as usize]).count() as u32;
            assert!(t.rank.abs_diff(rank) <= 1, "{name}: position {p}: rank {} against {rank}", t.rank);
            assert!(d < 1e-4, "{name}: position {p}: |Δ logprob| = {d}");
            let mut order: Vec<usize> = (0..vocab).collect();
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            if row[order[2]] - row[order[3]] > 1e-3 {
                let top: Vec<u32> = t.top.iter().map(|e| e.0).collect();
                assert_eq!(top, order[..3].iter().map(|&i| i as u32).collect::<Vec<_>>(), "{name}: position {p}");
            }
        }
        // Prefilled in pieces of 65 rows beside two other requests: the same bits.
        let pieces = run(65 + 8, 2);
        assert_eq!(pieces.first(), events.first(), "{name}: chunked prefill changed the prompt log-probabilities");
    }
}

/// Priority scheduling (vLLM's `--scheduling-policy priority`): one request at a time runs in
/// (priority, arrival) order, and a full pool preempts the lowest priority, not the youngest;
/// the first-come-first-served engine refuses a priority.
#[test]
fn priority_scheduling_orders_admission_and_preemption() {
    let m = load("qwen3", DType::F32).unwrap();
    let with = |prio: i64, n: usize| SamplingParams { priority: prio, ..greedy(n) };
    let mut fcfs = EngineCore::new(&m, cfg(1, 512, 64)).unwrap();
    let e = fcfs.add_request(0, vec![1, 2, 3], with(2, 2)).unwrap_err().to_string();
    assert!(e.contains("priority scheduling"), "{e}");
    // One slot: admitted in priority order, ties by arrival.
    let mut e = EngineCore::new(&m, EngineConfig { priority_scheduling: true, ..cfg(1, 512, 64) }).unwrap();
    for (id, prio) in [(0, 5), (1, 0), (2, 5), (3, -1)] {
        e.add_request(id, vec![id as u32 + 1; 8], with(prio, 2)).unwrap();
    }
    let mut done = Vec::new();
    while e.has_work() {
        done.extend(e.step().unwrap().into_iter().filter(|(_, ev)| matches!(ev, Event::Done(_))).map(|(id, _)| id));
    }
    assert_eq!(done, [3, 1, 0, 2]);
    // A pool too small for both: the later but higher-priority request keeps its blocks.
    let prompt: Vec<u32> = (0..80).map(|i| (i * 7 + 1) % 500).collect();
    let preemptions = |priority: bool| {
        let mut e = EngineCore::new(&m, EngineConfig { priority_scheduling: priority, ..cfg(2, 512, 14) }).unwrap();
        e.add_request(0, prompt.clone(), with(priority as i64, 40)).unwrap();
        e.step().unwrap();
        e.add_request(1, prompt.iter().map(|t| t + 1).collect(), with(0, 40)).unwrap();
        let mut preempted = HashMap::new();
        while e.has_work() {
            for (id, ev) in e.step().unwrap() {
                if let Event::Done(f) = ev {
                    preempted.insert(id, f.preemptions);
                }
            }
        }
        (preempted[&0], preempted[&1])
    };
    let (p0, p1) = preemptions(true);
    assert!(p0 > 0 && p1 == 0, "priority: {p0} / {p1}");
    // First come, first served: the younger one is preempted.
    let (p0, p1) = preemptions(false);
    assert!(p0 == 0 && p1 > 0, "fcfs: {p0} / {p1}");
}

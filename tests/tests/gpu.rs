//! The CUDA backend against the same references as the CPU (`parity.rs`, `mtp.rs`):
//! every registered model in f32 (1e-3·std(ref)) and bf16 (5e-2·std(ref)) — and f16 with
//! the bf16 bar — prefill and token-by-token, greedy continuations identical; MTP
//! speculative decoding on the device equals plain greedy decoding; several sequences in
//! one batch equal separate runs; rollback of rejected tokens on the device.
//!
//! Every test is `#[ignore = "needs a CUDA GPU"]`: `scripts/gpu-check.sh` runs them on the
//! GPU machine with `--include-ignored`; asked for where there is no GPU, they fail.

use porter_core::generate::generate;
use porter_core::sampling::SamplingParams;
use porter_core::speculative::{generate_speculative, MtpMode};
use porter_core::{config, registry, Batch, DType, Device, LogitsFor, StateCache};
use tests::*;

const F32_TOL: f32 = 1e-3;
const BF16_TOL: f32 = 5e-2;

fn check_fixture(name: &str) {
    let Some(dev) = cuda_or_skip(name) else { panic!("{name}: needs a CUDA GPU") };
    let r = Reference::open(name).expect("reference");
    for (dtype, tol) in [(DType::F32, F32_TOL), (DType::BF16, BF16_TOL), (DType::F16, BF16_TOL)] {
        let m = load_on(name, dtype, dev).unwrap_or_else(|e| panic!("{name} {dtype} on {dev}: {e:#}"));
        for case in ["short", "long"] {
            let ids = r.ids(&format!("ids_{case}")).unwrap();
            let want = r.f32(&format!("logits_{case}")).unwrap();
            let pre = prefill_logits(&m, &ids).unwrap_or_else(|e| panic!("{name} {dtype}: {e:#}"));
            assert_close(&format!("cuda {name} {case} {dtype} prefill"), &pre, &want, tol);
            let inc = incremental_logits(&m, &ids).unwrap_or_else(|e| panic!("{name} {dtype}: {e:#}"));
            assert_close(&format!("cuda {name} {case} {dtype} incremental"), &inc, &want, tol);
        }
        if dtype != DType::F16 {
            let prompt = r.ids("greedy_prompt").unwrap();
            let want = r.ids("greedy_ids").unwrap();
            let got = generate(&m, &prompt, SamplingParams::default(), want.len(), &[]).unwrap().ids;
            assert_eq!(got, want, "cuda {name}: {dtype} greedy continuation differs from transformers");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_qwen3() {
    check_fixture("qwen3");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_qwen3_tied_v5_config_with_biases() {
    check_fixture("qwen3_tied");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_qwen3_moe() {
    check_fixture("qwen3_moe");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_qwen3_moe_sparse2() {
    check_fixture("qwen3_moe_sparse2");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_mistral() {
    check_fixture("mistral");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_mistral_sliding_window() {
    check_fixture("mistral_swa");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_qwen3_next_a() {
    check_fixture("qwen3_next_a");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_qwen3_next_b() {
    check_fixture("qwen3_next_b");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_qwen3_next_mtp() {
    check_fixture("qwen3_next_mtp");
}

/// Several sequences of different lengths in one batch (prefill, then decode steps)
/// give the logits of separate runs, on the device.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_batched_sequences_equal_separate_runs() {
    let Some(dev) = cuda_or_skip("cuda_batched_sequences_equal_separate_runs") else {
        panic!("cuda_batched_sequences_equal_separate_runs: needs a CUDA GPU")
    };
    for name in ["qwen3_next_a", "qwen3_moe", "mistral_swa"] {
        let m = load_on(name, DType::F32, dev).unwrap();
        let prompts: Vec<Vec<u32>> = vec![vec![3, 17, 99, 5], vec![42], vec![7, 8, 9, 10, 11, 12, 13]];
        let mut alone = Vec::new();
        for p in &prompts {
            alone.push(prefill_logits(&m, p).unwrap());
        }
        let mut cache = m.new_cache_spec(prompts.len(), 0).unwrap();
        let seqs: Vec<_> = prompts.iter().map(|_| cache.alloc_seq().unwrap()).collect();
        let mut batch = Batch::default();
        for (s, p) in seqs.iter().zip(&prompts) {
            batch.push(*s, 0, p);
        }
        let out = m.forward(&batch, &mut cache, LogitsFor::All).unwrap().logits.host_vec().unwrap();
        let v = m.info.vocab_size;
        let mut off = 0;
        for (i, p) in prompts.iter().enumerate() {
            let got = &out[off * v..(off + p.len()) * v];
            assert_close(&format!("cuda {name} batched seq {i}"), got, &alone[i], 1e-4);
            off += p.len();
        }
    }
}

/// Draft heads on the device: speculative greedy output equals plain greedy output.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_mtp_speculative_equals_greedy() {
    let Some(dev) = cuda_or_skip("cuda_mtp_speculative_equals_greedy") else {
        panic!("cuda_mtp_speculative_equals_greedy: needs a CUDA GPU")
    };
    for (main_name, draft_dir) in [
        ("qwen3_next_mtp", "qwen3_next_mtp"),
        ("qwen3_moe", "qwen3_moe_mtp_draft"),
        ("qwen3", "qwen3_dense_mtp_draft"),
        ("mistral", "mistral_mtp_draft"),
    ] {
        let m = load_on(main_name, DType::F32, dev).unwrap();
        let cfg = config::read_config(&fixture(main_name)).unwrap();
        let d = registry::load_draft(&fixture(draft_dir), &cfg, &m).unwrap_or_else(|e| panic!("{draft_dir}: {e:#}"));
        let drafts = vec![d];
        let prompt: Vec<u32> = vec![5, 77, 300, 12, 9, 41, 256];
        let plain = generate(&m, &prompt, SamplingParams::default(), 32, &[]).unwrap().ids;
        for k in 1..=3 {
            let spec =
                generate_speculative(&m, &drafts, &prompt, SamplingParams::default(), 32, &[], k, MtpMode::Eagle)
                    .unwrap_or_else(|e| panic!("{main_name} k={k}: {e:#}"));
            println!("cuda {main_name} + {draft_dir}, k = {k}: {:.2} tokens/step", spec.tokens_per_step());
            assert_eq!(spec.ids, plain, "cuda {main_name} k={k}: speculative output differs from greedy");
        }
    }
}

/// Verify K + 1 rows, keep some, continue: equals a fresh run (device rollback).
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_rollback_equals_fresh_run() {
    let Some(dev) = cuda_or_skip("cuda_rollback_equals_fresh_run") else {
        panic!("cuda_rollback_equals_fresh_run: needs a CUDA GPU")
    };
    let m = load_on("qwen3_next_a", DType::F32, dev).unwrap();
    let ids: Vec<u32> = vec![11, 22, 33, 44, 55, 66, 77, 88];
    let fresh = prefill_logits(&m, &ids).unwrap();
    let v = m.info.vocab_size;
    let mut cache = m.new_cache_spec(1, 3).unwrap();
    let s = cache.alloc_seq().unwrap();
    m.forward(&Batch::single(s, 0, &ids[..4]), &mut cache, LogitsFor::All).unwrap();
    // Verify 4 rows (2 of them wrong), keep 2, then continue with the true tokens.
    m.forward(&Batch::single(s, 4, &[ids[4], ids[5], 1, 2]), &mut cache, LogitsFor::All).unwrap();
    cache.truncate(s, 6).unwrap();
    let rest = m.forward(&Batch::single(s, 6, &ids[6..]), &mut cache, LogitsFor::All).unwrap();
    let got = rest.logits.host_vec().unwrap();
    assert_close("cuda rollback", &got, &fresh[6 * v..], 1e-4);
}

/// `--device cuda` on a model folder and the CPU give the same greedy tokens with sampling
/// parameters too (the device sampler reproduces the host sampler's draws).
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_sampling_matches_cpu() {
    let Some(dev) = cuda_or_skip("cuda_sampling_matches_cpu") else {
        panic!("cuda_sampling_matches_cpu: needs a CUDA GPU")
    };
    let cpu = load("qwen3", DType::F32).unwrap();
    let gpu = load_on("qwen3", DType::F32, dev).unwrap();
    let prompt: Vec<u32> = vec![1, 2, 3, 4];
    for (t, k, p) in [(0.8, Some(20), None), (1.0, None, Some(0.9)), (0.7, Some(50), Some(0.8))] {
        let params = SamplingParams { temperature: t, top_k: k, top_p: p, seed: Some(1234), ..Default::default() };
        let a = generate(&cpu, &prompt, params.clone(), 16, &[]).unwrap().ids;
        let b = generate(&gpu, &prompt, params, 16, &[]).unwrap().ids;
        assert_eq!(a, b, "sampling t={t} k={k:?} p={p:?}: device and host samplers disagree");
    }
    let _ = Device::Cpu;
}

/// FP8 checkpoints on CUDA (weights dequantized to the model dtype at load until FP8 kernels
/// exist): f32 logits against transformers' f32 forward on the dequantized weights, prefill
/// and token by token, within 1e-3·std, and greedy equal.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_fp8_checkpoints_match_transformers() {
    let Some(dev) = cuda_or_skip("cuda_fp8_checkpoints_match_transformers") else {
        panic!("cuda_fp8_checkpoints_match_transformers: needs a CUDA GPU")
    };
    for name in ["qwen3_fp8", "qwen3_next_a_fp8"] {
        let r = Reference::open(name).expect("reference");
        let ids = r.ids("ids_short").unwrap();
        let want = r.f32("logits_short").unwrap();
        let m = load_on(name, DType::F32, dev).unwrap();
        assert_close(&format!("cuda {name} f32 prefill"), &prefill_logits(&m, &ids).unwrap(), &want, 1e-3);
        assert_close(&format!("cuda {name} f32 incremental"), &incremental_logits(&m, &ids).unwrap(), &want, 1e-3);
        let (prompt, gids) = (r.ids("greedy_prompt").unwrap(), r.ids("greedy_ids").unwrap());
        let got = generate(&m, &prompt, SamplingParams::default(), gids.len(), &[]).unwrap().ids;
        assert_eq!(got, gids, "cuda {name}: f32 greedy continuation differs from transformers");
    }
}

/// The engine tests switch the process-wide deterministic mode; they take this lock so
/// that none of them runs while another has the mode flipped.
fn engine_mode(deterministic: bool) -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    porter_core::tensor::cuda::set_deterministic(deterministic);
    g
}

/// The serving engine on CUDA, f32: a request's greedy tokens and log-probabilities are
/// bit-identical alone, among 31 others, split by chunked prefill, after a preemption and
/// with a prefix-cache hit (tests/src/engine_util.rs).
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_engine_batch_invariance_attention() {
    if let Some(d) = cuda_or_skip("cuda_engine_batch_invariance_attention") {
        let _mode = engine_mode(false);
        tests::engine_util::invariance("qwen3", false, d);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_engine_batch_invariance_moe() {
    if let Some(d) = cuda_or_skip("cuda_engine_batch_invariance_moe") {
        let _mode = engine_mode(false);
        tests::engine_util::invariance("qwen3_moe", false, d);
    }
}

/// The engine samples plain decode rows on the device (ids only): same tokens as the host.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_engine_device_sampling_matches_host() {
    if let Some(d) = cuda_or_skip("cuda_engine_device_sampling_matches_host") {
        let _mode = engine_mode(false);
        tests::engine_util::device_sampling_matches_host("qwen3", d);
    }
}

/// bf16 in deterministic mode (`--deterministic`: GEMV-path GEMMs and MoE, attention
/// without tensor cores): the same bit-identity as f32.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_engine_batch_invariance_bf16_deterministic() {
    if let Some(d) = cuda_or_skip("cuda_engine_batch_invariance_bf16_deterministic") {
        let _mode = engine_mode(true);
        tests::engine_util::invariance_in("qwen3_moe", false, d, DType::BF16);
        tests::engine_util::invariance_in("qwen3_next_a", true, d, DType::BF16);
        porter_core::tensor::cuda::set_deterministic(false);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_engine_batch_invariance_hybrid() {
    if let Some(d) = cuda_or_skip("cuda_engine_batch_invariance_hybrid") {
        let _mode = engine_mode(false);
        tests::engine_util::invariance("qwen3_next_a", true, d);
    }
}

// ---------------------------------------------------------------------------------------
// Quantized KV cache (fp8 / int8, one f32 scale per token and KV head; kvquant branch)
// ---------------------------------------------------------------------------------------

/// CUDA logits with an fp8 / int8 KV cache vs the CPU with the same quantized cache (the
/// device quantizes the same bytes and scales, kernels/tests/cuda_kv_quant.rs): f32 within the
/// f32 tolerance, bf16 within the bf16 one, prefill and token by token, plus a CUDA greedy
/// continuation equal to the CPU's with the same KV dtype.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_quantized_kv_matches_cpu() {
    let Some(d) = cuda_or_skip("cuda_quantized_kv_matches_cpu") else { return };
    use porter_core::state::KvDtype;
    for name in ["qwen3", "qwen3_next_a", "mistral_swa"] {
        let r = Reference::open(name).expect("reference");
        for kv in [KvDtype::Fp8, KvDtype::Int8] {
            for (dtype, tol) in [(DType::F32, F32_TOL), (DType::BF16, BF16_TOL)] {
                let mut cpu = load(name, DType::F32).expect("cpu");
                cpu.info.kv_cache_dtype = kv;
                let mut gpu = load_on(name, dtype, d).expect("gpu");
                gpu.info.kv_cache_dtype = kv;
                for case in ["short", "long"] {
                    let ids = r.ids(&format!("ids_{case}")).unwrap();
                    let want = prefill_logits(&cpu, &ids).unwrap();
                    let pre = prefill_logits(&gpu, &ids).unwrap();
                    assert_close(&format!("cuda {name} {case} {dtype} {kv} KV prefill vs cpu"), &pre, &want, tol);
                    let inc = incremental_logits(&gpu, &ids).unwrap();
                    assert_close(
                        &format!("cuda {name} {case} {dtype} {kv} KV token by token vs cpu"),
                        &inc,
                        &want,
                        tol,
                    );
                }
                if dtype == DType::F32 {
                    let prompt = r.ids("greedy_prompt").unwrap();
                    let n = r.ids("greedy_ids").unwrap().len();
                    let want = generate(&cpu, &prompt, SamplingParams::default(), n, &[]).unwrap().ids;
                    let got = generate(&gpu, &prompt, SamplingParams::default(), n, &[]).unwrap().ids;
                    assert_eq!(got, want, "cuda {name} {kv} KV greedy differs from the CPU");
                }
            }
        }
    }
}

/// The engine on CUDA with a quantized pool: prefix-cache hits reuse quantized blocks and give
/// the cold run's tokens and log-probabilities bit for bit (f32).
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_engine_quantized_kv_prefix_hits_are_exact() {
    let Some(d) = cuda_or_skip("cuda_engine_quantized_kv_prefix_hits_are_exact") else { return };
    use porter_core::engine::{EngineConfig, EngineCore};
    use porter_core::state::KvDtype;
    use tests::engine_util::{cfg, greedy, run_all, Rng};
    for kv in [KvDtype::Fp8, KvDtype::Int8] {
        let m = load_on("qwen3", DType::F32, d).unwrap();
        let mut rng = Rng(7);
        let system = rng.prompt(48, m.info.vocab_size);
        let reqs: Vec<_> = (0..3u64)
            .map(|i| (i, [system.clone(), rng.prompt(5 + i as usize, m.info.vocab_size)].concat(), greedy(8)))
            .collect();
        let c = EngineConfig { kv_dtype: kv, ..cfg(4, 256, 64) };
        let mut warm = EngineCore::new(&m, c).unwrap();
        for r in &reqs {
            let mut e = EngineCore::new(&m, c).unwrap();
            let cold = run_all(&mut e, std::slice::from_ref(r)).remove(&r.0).unwrap();
            let got = run_all(&mut warm, std::slice::from_ref(r)).remove(&r.0).unwrap();
            assert_eq!(got.0, cold.0, "cuda {kv} request {}: a prefix hit changed the output", r.0);
        }
        assert_eq!(warm.stats().prefix_hit_tokens, 2 * 48);
    }
}

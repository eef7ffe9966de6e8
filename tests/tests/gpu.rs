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
/// CUDA vs CPU with a quantized KV cache in f32 (see `cuda_quantized_kv_matches_cpu`).
const QUANT_KV_F32_TOL: f32 = 2e-2;

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

/// The engine with MTP drafts on the device, plain greedy requests (no log-probabilities):
/// drafts drawn as device argmaxes and verify decisions from the device's argmaxes of every
/// verify row (only ids come back) give the engine's output without drafts, token for token.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_engine_mtp_plain_greedy_equals_plain() {
    use porter_core::engine::batcher::SpecConfig;
    use porter_core::engine::{EngineCore, StopParams};
    use tests::engine_util::{cfg, run_all};
    let Some(dev) = cuda_or_skip("cuda_engine_mtp_plain_greedy_equals_plain") else {
        panic!("cuda_engine_mtp_plain_greedy_equals_plain: needs a CUDA GPU")
    };
    let m = load_on("qwen3_next_mtp", DType::F32, dev).unwrap();
    let mcfg = config::read_config(&fixture("qwen3_next_mtp")).unwrap();
    let params = |n: usize| SamplingParams {
        stop: StopParams { max_tokens: Some(n), ignore_eos: true, ..Default::default() },
        ..Default::default()
    };
    let reqs: Vec<(u64, Vec<u32>, SamplingParams)> = (0..5u64)
        .map(|i| {
            (i, (0..(4 + 11 * i as u32)).map(|t| (t * 37 + i as u32) % 300).collect(), params(10 + 3 * i as usize))
        })
        .collect();
    let plain = run_all(&mut EngineCore::new(&m, cfg(5, 512, 256)).unwrap(), &reqs);
    let ids = |x: &(Vec<porter_core::engine::TokenOut>, porter_core::engine::Event)| {
        x.0.iter().map(|t| t.id).collect::<Vec<_>>()
    };
    for k in [1, 3] {
        let d = registry::load_draft(&fixture("qwen3_next_mtp"), &mcfg, &m).unwrap();
        let spec = SpecConfig { drafts: vec![d], k, mode: MtpMode::Eagle };
        let mut e = EngineCore::with_spec(&m, cfg(5, 512, 256), Some(spec)).unwrap();
        let got = run_all(&mut e, &reqs);
        for (id, _, _) in &reqs {
            assert_eq!(
                ids(&got[id]),
                ids(&plain[id]),
                "cuda k={k} request {id}: differs from the engine without drafts"
            );
        }
        let s = e.stats();
        println!(
            "cuda engine mtp k={k}: {} verify steps, {} of {} drafts accepted",
            s.spec_steps, s.spec_accepted, s.spec_drafted
        );
        assert!(s.spec_steps > 0);
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
/// NCCL collectives (`comm::nccl::NcclComm`) with one rank per visible GPU, each on its own
/// thread. One GPU gives a group of one (the collectives still go through NCCL on the
/// device); with several the sums and the gathered layout are checked across them.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_nccl_all_reduce_and_all_gather() {
    use porter_core::comm::{nccl::NcclComm, Communicator};
    use porter_core::Tensor;
    let Some(_) = cuda_or_skip("nccl") else { panic!("nccl: needs a CUDA GPU") };
    let n = porter_core::device::cuda_device_count().unwrap();
    let comms = NcclComm::group(&(0..n).collect::<Vec<_>>()).unwrap_or_else(|e| panic!("{e:#}"));
    let out: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                s.spawn(move || {
                    let dev = Device::Cuda(r);
                    let mut t = Tensor::from_vec(vec![r as f32 + 1.0; 6], [2, 3], DType::F32)?.into_device(dev)?;
                    c.all_reduce_sum(&mut t)?;
                    let mut h =
                        Tensor::from_vec(vec![0.5 * (r as f32 + 1.0); 4], [4], DType::BF16)?.into_device(dev)?;
                    c.all_reduce_sum(&mut h)?;
                    let part: Vec<f32> = (0..4).map(|i| (10 * r + i) as f32).collect();
                    let g = c.all_gather_last(&Tensor::from_vec(part, [2, 2], DType::F32)?.into_device(dev)?)?;
                    assert_eq!(g.shape(), &[2, 2 * n]);
                    Ok::<_, porter_core::Error>((t.host_vec()?, h.host_vec()?, g.host_vec()?))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
    });
    let tri = (n * (n + 1) / 2) as f32;
    let row =
        |i: usize| (0..n).flat_map(|r| [(10 * r + 2 * i) as f32, (10 * r + 2 * i + 1) as f32]).collect::<Vec<_>>();
    for (sum, half, gathered) in &out {
        assert_eq!(sum, &vec![tri; 6]);
        assert_eq!(half, &vec![0.5 * tri; 4]);
        assert_eq!(gathered, &[row(0), row(1)].concat());
    }
    println!("nccl: {n} rank(s), all-reduce f32/bf16 and all-gather correct");
}

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

/// FP8 checkpoints on CUDA through the FP8 kernels: the weights stay FP8 on the device (1 byte
/// per parameter plus scales and row maps), f32 logits against transformers' f32 forward on the
/// dequantized weights, prefill and token by token, within 1e-3·std, and greedy equal.
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
        let host = load(name, DType::F32).unwrap();
        // Same bytes held on the device as on the host, where FP8 slots are 1 byte a parameter.
        assert_eq!(m.weight_bytes(), host.weight_bytes(), "cuda {name}: device bytes differ from the host's");
        let fp8 = fp8_slots_on_device(name, dev);
        assert!(fp8 >= 4, "cuda {name}: only {fp8} weights are fp8 on the device");
        assert_close(&format!("cuda {name} f32 prefill"), &prefill_logits(&m, &ids).unwrap(), &want, 1e-3);
        assert_close(&format!("cuda {name} f32 incremental"), &incremental_logits(&m, &ids).unwrap(), &want, 1e-3);
        let (prompt, gids) = (r.ids("greedy_prompt").unwrap(), r.ids("greedy_ids").unwrap());
        let got = generate(&m, &prompt, SamplingParams::default(), gids.len(), &[]).unwrap().ids;
        assert_eq!(got, gids, "cuda {name}: f32 greedy continuation differs from transformers");
    }
}

/// Slots of fixture `name` taken onto `dev`: checks every FP8 one stays FP8 there (more than 1
/// byte a parameter, at most 1 byte a parameter plus a row map and a scale row per row);
/// returns how many are FP8.
fn fp8_slots_on_device(name: &str, dev: Device) -> usize {
    let p = registry::prepare(&fixture(name)).unwrap();
    let mut w = p.map.load(p.checkpoint.clone(), DType::F32).unwrap();
    w.set_device(dev);
    let mut n = 0;
    for s in w.remaining() {
        let t = w.take(&s).unwrap();
        if t.is_fp8() {
            let (rows, cols) = (t.elem_count() / t.last_dim(), t.last_dim());
            // At most one scale row per weight row (stacked experts of < 128 rows each).
            let max = t.elem_count() + 4 * rows + 4 * rows * cols.div_ceil(128);
            assert!(
                t.bytes() > t.elem_count() && t.bytes() <= max,
                "{name} {s}: {} bytes for {rows}x{cols}",
                t.bytes()
            );
            n += 1;
        }
    }
    n
}

/// Fixture `name` with every FP8 weight dequantized at load (values rounded to `dtype`, the
/// dense kernels), on `dev`.
fn load_dequantized(name: &str, dtype: DType, dev: Device) -> porter_core::Model {
    let dir = fixture(name);
    let p = registry::prepare(&dir).unwrap();
    let mut w = p.map.load(p.checkpoint.clone(), dtype).unwrap();
    // A store of the model dtype (packed slots are assembled in the store's dtype); every
    // slot is replaced by its dequantized tensor below, so no random value is ever generated.
    let mut d = porter_core::Weights::random(&p.map, dtype, 0, dev);
    for s in w.remaining() {
        let t = w.take(&s).unwrap();
        let shape = t.shape().to_vec();
        let t = porter_core::Tensor::from_vec(t.host_vec().unwrap(), shape, DType::F32).unwrap();
        d.insert(&s, t.try_to_dtype(dtype).unwrap());
    }
    d.set_device(dev);
    let lc = porter_core::LoadContext { dir: &dir, config: &p.config, dtype, device: dev };
    (p.entry.build)(&lc, &mut d).unwrap()
}

/// The FP8 kernels equal the dense kernels on the dequantized weights: decode (1 row) and
/// prefill (80 rows) logits within 1e-5·std in f32 and 5e-2·std in bf16; and, with
/// deterministic mode on, a request's f32 tokens and log-probabilities through the FP8 GEMV and
/// MoE paths are bit-identical alone and among 31 others (1 vs 32 decode rows).
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_fp8_kernels_match_dequantized_weights() {
    let Some(dev) = cuda_or_skip("cuda_fp8_kernels_match_dequantized_weights") else {
        panic!("cuda_fp8_kernels_match_dequantized_weights: needs a CUDA GPU")
    };
    for name in ["qwen3_fp8", "qwen3_next_a_fp8"] {
        let ids: Vec<u32> = (0..80u32).map(|i| (i * 7919 + 3) % 200).collect();
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 5e-2)] {
            let fp8 = load_on(name, dtype, dev).unwrap();
            let dense = load_dequantized(name, dtype, dev);
            let (a, b) = (prefill_logits(&fp8, &ids).unwrap(), prefill_logits(&dense, &ids).unwrap());
            assert_close(&format!("cuda {name} {dtype} fp8 vs dequantized prefill (80 rows)"), &a, &b, tol);
            let (a, b) = (incremental_logits(&fp8, &ids[..8]).unwrap(), incremental_logits(&dense, &ids[..8]).unwrap());
            assert_close(&format!("cuda {name} {dtype} fp8 vs dequantized decode (1 row)"), &a, &b, tol);
        }
    }
    // A request alone and among 31 others (tokens and log-probabilities bit for bit), f32 and
    // deterministic: the FP8 GEMV and MoE paths are batch-invariant.
    let _mode = engine_mode(true);
    tests::engine_util::invariance_in("qwen3_next_a_fp8", true, dev, DType::F32);
    porter_core::tensor::cuda::set_deterministic(false);
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

/// The hybrid prefix cache on the device: checkpoints saved in rounds of the chunked delta
/// rule and by `gdn_window_at`, restored by copies; hits at branch points and span ends,
/// every output equal to its cold run bit for bit (f32).
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_engine_hybrid_prefix_checkpoints() {
    if let Some(d) = cuda_or_skip("cuda_engine_hybrid_prefix_checkpoints") {
        let _mode = engine_mode(false);
        tests::engine_util::hybrid_branch_point_checkpoints(d);
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
            // f32: the CUDA K/V differ from the CPU's in the last bits (different kernels), so an
            // element at a rounding boundary can take the neighbouring code (int8: 1/127 of its
            // head row's amax): qwen3 long with int8 KV measured 3.6e-3·std on the H200
            // (2026-12-01), fp8 1.3e-6. The bound is that flip's size with room, 2e-2; the
            // greedy continuation must still equal the CPU's.
            for (dtype, bar) in [(DType::F32, QUANT_KV_F32_TOL), (DType::BF16, BF16_TOL)] {
                let mut cpu = load(name, DType::F32).expect("cpu");
                cpu.info.kv_cache_dtype = kv;
                let mut gpu = load_on(name, dtype, d).expect("gpu");
                gpu.info.kv_cache_dtype = kv;
                // The CPU's own run in this dtype: with a quantized KV a bf16 model rounds K/V
                // to bf16 before quantizing, so codes near a rounding boundary flip and the
                // reference implementation's own bf16 error can pass the bf16 bar (qwen3 long
                // with fp8 KV: 6.96e-2·std on the CPU, 7.10e-2 on the H200, 2026-12-01). The
                // GPU must be within the bar or no worse than the CPU's own dtype error (with a
                // quarter for the two runs' independent rounding).
                let mut cpu_dt = load(name, dtype).expect("cpu");
                cpu_dt.info.kv_cache_dtype = kv;
                for case in ["short", "long"] {
                    let ids = r.ids(&format!("ids_{case}")).unwrap();
                    let want = prefill_logits(&cpu, &ids).unwrap();
                    let own = max_abs_diff(&prefill_logits(&cpu_dt, &ids).unwrap(), &want) / std(&want);
                    let tol = bar.max(1.25 * own);
                    println!("cpu {name} {case} {dtype} {kv} KV vs cpu f32: {own:.3e}·std (tol {tol:.3e})");
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

/// The refusal of `config::check_act_device`: what a non-SiLU model loaded on a GPU reports.
fn hidden_act_refusal(act: &str) -> String {
    format!(
        "config key `hidden_act` = \"{act}\": runs on the CPU backend only (the CUDA kernels fuse silu); use --device cpu"
    )
}

/// A model (or FFN-only draft head) whose `hidden_act` is not SiLU is refused at load on a
/// GPU, naming the key and `--device cpu`; never later in a forward (`hidden_act.rs` checks
/// the same without a GPU, before any weight is placed).
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_refuses_non_silu_hidden_act_at_load() {
    let test = "cuda_refuses_non_silu_hidden_act_at_load";
    let Some(dev) = cuda_or_skip(test) else { panic!("{test}: needs a CUDA GPU") };
    for (name, act) in
        [("qwen3_gelu_tanh", "gelu_pytorch_tanh"), ("qwen3_moe_gelu", "gelu"), ("qwen3_next_relu2", "relu2")]
    {
        for dtype in [DType::F32, DType::BF16] {
            let e = load_on(name, dtype, dev).err().map(|e| format!("{e:#}"));
            let e = e.unwrap_or_else(|| panic!("{name} {dtype}: loaded on {dev}"));
            assert!(e.contains(&hidden_act_refusal(act)), "{name} {dtype}: {e}");
        }
    }
    let main = load_on("qwen3_moe", DType::BF16, dev).unwrap();
    let main_cfg = config::read_config(&fixture("qwen3_moe")).unwrap();
    let dir = std::env::temp_dir().join(format!("porter-gpu-relu2-draft-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["model.safetensors", "config.json"] {
        std::fs::copy(fixture("qwen3_moe_mtp_draft").join(f), dir.join(f)).unwrap();
    }
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    v["hidden_act"] = serde_json::json!("relu2");
    std::fs::write(dir.join("config.json"), v.to_string()).unwrap();
    let e = registry::load_draft(&dir, &main_cfg, &main).err().map(|e| format!("{e:#}"));
    let _ = std::fs::remove_dir_all(&dir);
    let e = e.unwrap_or_else(|| panic!("a relu2 draft head loaded on {dev}"));
    assert!(e.contains(&hidden_act_refusal("relu2")), "{e}");
}

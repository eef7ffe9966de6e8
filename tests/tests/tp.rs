//! Tensor parallelism on the CPU (in-process ranks, one thread each): TP = 2 and 4 give the
//! logits of TP = 1 within 1e-5·std (f32) on a fixture of every registered architecture — in
//! prefill, token-by-token decode, a batch of two sequences, a speculative verify step and the
//! rollback after it — greedy outputs (plain, batched in the engine, speculative with an MTP
//! draft) are identical, and group sizes that do not divide the model are clear errors.
//! SmolLM2-135M (Llama, 9 heads / 3 KV heads) runs at TP = 3 against transformers.

use porter_core::engine::{EngineCore, Event};
use porter_core::generate::generate;
use porter_core::registry::{self, LoadOptions};
use porter_core::sampling::SamplingParams;
use porter_core::speculative::{generate_speculative, MtpMode};
use porter_core::{config, Batch, DType, Device, LogitsFor, Model, StateCache};
use std::path::Path;
use tests::engine_util::{cfg, greedy};
use tests::*;

/// The bound for TP vs TP = 1 in f32.
const TOL: f32 = 1e-5;

fn load_tp(dir: &Path, tp: usize) -> porter_core::Result<Model> {
    registry::load_with(
        dir,
        &LoadOptions {
            dtype: DType::F32,
            device: Device::Cpu,
            show_progress: false,
            quantize: None,
            tensor_parallel: tp,
        },
    )
}

/// Logits of one model through every path the cache has: prefill, decode steps, a second
/// sequence prefilled in the same batch as a decode step, a verify step of 4 rows (spec 3),
/// the rollback to 2 accepted rows and a decode after it.
fn trace(m: &Model, vocab: usize) -> Vec<(&'static str, Vec<f32>)> {
    let prompt: Vec<u32> = (0..23).map(|i| ((i * 37 + 5) % vocab) as u32).collect();
    let mut c = m.new_cache_spec(2, 3).unwrap();
    let a = c.alloc_seq().unwrap();
    let mut out = Vec::new();
    let mut run = |c: &mut dyn StateCache, b: Batch, what: &'static str| {
        let l = m.forward(&b, c, LogitsFor::All).unwrap().logits.host_vec().unwrap();
        out.push((what, l));
    };
    run(&mut c, Batch::single(a, 0, &prompt), "prefill");
    let mut pos = prompt.len();
    for t in [7u32, 11] {
        run(&mut c, Batch::single(a, pos, &[t]), "decode");
        pos += 1;
    }
    let b = c.alloc_seq().unwrap();
    let mut two = Batch::single(a, pos, &[3]);
    two.push(b, 0, &prompt[..9]);
    run(&mut c, two, "decode + prefill in one batch");
    pos += 1;
    let verify = [13u32, 17, 19, 23];
    run(&mut c, Batch::single(a, pos, &verify), "verify (4 rows)");
    c.truncate(a, pos + 2).unwrap();
    pos += 2;
    run(&mut c, Batch::single(a, pos, &[29]), "decode after rollback");
    out
}

fn check(name: &str, dir: &Path, worlds: &[usize]) {
    let one = load_tp(dir, 1).unwrap();
    let vocab = one.info.vocab_size;
    let want = trace(&one, vocab);
    let prompt: Vec<u32> = (0..9).map(|i| ((i * 53 + 2) % vocab) as u32).collect();
    let plain = generate(&one, &prompt, SamplingParams::default(), 12, &[]).unwrap().ids;
    for &tp in worlds {
        let m = load_tp(dir, tp).unwrap_or_else(|e| panic!("{name} tp={tp}: {e:#}"));
        for ((what, got), (_, reference)) in trace(&m, vocab).iter().zip(&want) {
            assert_close(&format!("{name} tp={tp} {what}"), got, reference, TOL);
        }
        let ids = generate(&m, &prompt, SamplingParams::default(), 12, &[]).unwrap().ids;
        assert_eq!(ids, plain, "{name} tp={tp}: greedy continuation differs from tp=1");
    }
}

#[test]
fn qwen3_next_tp2_and_tp4_match_tp1() {
    // 2 key heads / 4 value heads: at TP 4 each key head is shared by two ranks.
    check("qwen3_next_a", &fixture("qwen3_next_a"), &[2, 4]);
}

#[test]
fn qwen3_next_mtp_checkpoint_tp2_and_tp4_match_tp1() {
    check("qwen3_next_mtp", &fixture("qwen3_next_mtp"), &[2, 4]);
}

#[test]
fn qwen3_moe_tp2_and_tp4_match_tp1() {
    check("qwen3_moe", &fixture("qwen3_moe"), &[2, 4]);
    // One KV head shared by every rank, tied embeddings (a vocab-parallel slice of the table).
    check("qwen3_moe_sparse2", &fixture("qwen3_moe_sparse2"), &[2, 4]);
}

#[test]
fn qwen3_tp2_and_tp4_match_tp1() {
    check("qwen3", &fixture("qwen3"), &[2, 4]);
    // Attention biases (column-parallel q/k/v biases) and tied embeddings.
    check("qwen3_tied", &fixture("qwen3_tied"), &[2, 4]);
}

#[test]
fn mistral_tp2_and_tp4_match_tp1() {
    check("mistral", &fixture("mistral"), &[2, 4]);
    check("mistral_swa", &fixture("mistral_swa"), &[2, 4]);
}

/// Llama: the `mistral` fixture uses the Llama layout; the same weights under a
/// `LlamaForCausalLM` config (no sliding window) are a tiny Llama.
#[test]
fn llama_tp2_and_tp4_match_tp1() {
    let src = fixture("mistral");
    let dir = std::env::temp_dir().join(format!("porter-tp-llama-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        let name = e.file_name();
        if name.to_string_lossy().ends_with(".safetensors") && name != "reference.safetensors" {
            std::fs::copy(e.path(), dir.join(&name)).unwrap();
        }
    }
    let mut c = config::read_config(&src).unwrap();
    c["architectures"] = serde_json::json!(["LlamaForCausalLM"]);
    c["model_type"] = serde_json::json!("llama");
    if let Some(o) = c.as_object_mut() {
        o.remove("sliding_window");
    }
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    assert_eq!(registry::prepare(&dir).unwrap().entry.architecture, "LlamaForCausalLM");
    check("llama", &dir, &[2, 4]);
    std::fs::remove_dir_all(&dir).ok();
}

/// The real SmolLM2-135M-Instruct (Llama; 9 query heads, 3 KV heads, 30 layers) at TP = 3,
/// against transformers' f32 logits and greedy continuations (`tests/fixtures/smollm2_ref`,
/// the references of `tests/smollm2.rs`), with the standard f32 bar, and against TP = 1 with
/// the TP bar on those chat prompts (measured 6.6–7.2e-6·std, 2026-12-01). Over 30 layers the
/// reassociated f32 sums of the row-parallel projections add up: on a synthetic id sequence
/// (the fixtures' `trace`) TP = 3 landed 1.16e-5·std from TP = 1, the size of porter's own f32
/// distance to transformers on this model, so the synthetic trace is kept for the fixtures.
#[test]
fn llama_smollm2_tp3_matches_transformers() {
    let dir = std::env::var_os("PORTER_SMOLLM2")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/smollm2"));
    assert!(dir.join("config.json").is_file(), "{} is missing: run scripts/test-setup.sh", dir.display());
    models::link();
    let r = Reference::open("smollm2_ref").unwrap();
    let (one, three) = (load_tp(&dir, 1).unwrap(), load_tp(&dir, 3).unwrap());
    let vocab = one.info.vocab_size;
    let mut k = 0;
    while r.has(&format!("ids_{k}")) {
        let ids = r.ids(&format!("ids_{k}")).unwrap();
        let pos = r.ids(&format!("positions_{k}")).unwrap();
        let want = r.f32(&format!("logits_{k}")).unwrap();
        let rows = |all: &[f32]| -> Vec<f32> {
            pos.iter().flat_map(|&p| all[p as usize * vocab..(p as usize + 1) * vocab].to_vec()).collect()
        };
        let got = prefill_logits(&three, &ids).unwrap();
        assert_close(&format!("smollm2 tp=3 prompt {k} vs transformers f32"), &rows(&got), &want, 1e-3);
        let base = prefill_logits(&one, &ids).unwrap();
        assert_close(&format!("smollm2 tp=3 prompt {k} vs tp=1"), &got, &base, TOL);
        let cont = r.ids(&format!("greedy_{k}")).unwrap();
        let eos = three.info.generation.eos_token_ids.clone();
        let g = generate(&three, &ids, SamplingParams::default(), cont.len(), &eos).unwrap().ids;
        assert_eq!(g, cont, "smollm2 tp=3 prompt {k}: greedy continuation differs from transformers");
        k += 1;
    }
    assert!(k >= 2, "smollm2_ref holds {k} prompts");
}

/// The serving engine on a TP = 2 model: several requests batched together give TP = 1's
/// tokens, and log-probabilities within the bound.
#[test]
fn engine_serves_a_tp2_model_like_tp1() {
    let run = |m: &Model| {
        let mut e = EngineCore::new(m, cfg(4, 256, 64)).unwrap();
        let mut out: std::collections::BTreeMap<u64, Vec<(u32, f32)>> = Default::default();
        for id in 0..4u64 {
            let p: Vec<u32> = (0..(10 + 7 * id as usize)).map(|i| ((i * 31 + id as usize * 7) % 500) as u32).collect();
            e.add_request(id, p, greedy(10)).unwrap();
        }
        while e.has_work() {
            for (id, ev) in e.step().unwrap() {
                if let Event::Token(t) = ev {
                    out.entry(id).or_default().push((t.id, t.logprob.unwrap_or(f32::NAN)));
                }
            }
        }
        out
    };
    for name in ["qwen3_next_a", "qwen3_moe"] {
        let one = run(&load_tp(&fixture(name), 1).unwrap());
        let two = run(&load_tp(&fixture(name), 2).unwrap());
        for (id, toks) in &one {
            let ids: Vec<u32> = toks.iter().map(|t| t.0).collect();
            let got: Vec<u32> = two[id].iter().map(|t| t.0).collect();
            assert_eq!(got, ids, "{name} request {id}: tokens differ between tp=2 and tp=1");
            for (a, b) in toks.iter().zip(&two[id]) {
                assert!((a.1 - b.1).abs() <= 1e-4, "{name} request {id}: logprob {} vs {}", b.1, a.1);
            }
        }
    }
}

/// Speculative decoding with the checkpoint's own MTP head on a TP = 2 main model (the draft
/// runs on one rank, using the vocab-parallel lm_head): greedy output equals plain greedy.
#[test]
fn mtp_speculative_on_a_tp2_model_is_exact() {
    let dir = fixture("qwen3_next_mtp");
    let m = load_tp(&dir, 2).unwrap();
    let cfg_json = config::read_config(&dir).unwrap();
    let drafts = vec![registry::load_draft(&dir, &cfg_json, &m).unwrap()];
    let prompt: Vec<u32> = vec![5, 77, 300, 12, 9, 41, 256];
    let plain = generate(&load_tp(&dir, 1).unwrap(), &prompt, SamplingParams::default(), 24, &[]).unwrap().ids;
    for k in 1..=3 {
        let spec =
            generate_speculative(&m, &drafts, &prompt, SamplingParams::default(), 24, &[], k, MtpMode::Eagle).unwrap();
        assert_eq!(spec.ids, plain, "k = {k}: speculative greedy on tp=2 differs from tp=1 plain greedy");
    }
}

/// Group sizes the model cannot be split into are errors naming the size and what it does not
/// divide — never a panic or a silent replication.
#[test]
fn indivisible_group_sizes_are_clear_errors() {
    let cases = [
        ("qwen3_next_b", 2, "does not divide 3"),                      // 3 query heads
        ("qwen3_next_b", 4, "cannot share a part"),                    // 2 value heads of layer 0 over 4 ranks
        ("qwen3", 3, "tensor-parallel size 3 is not a multiple of 2"), // 2 KV heads
        ("qwen3_fp8", 2, "FP8"),
    ];
    for (name, tp, needle) in cases {
        let e = load_tp(&fixture(name), tp).err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(e.contains(needle), "{name} tp={tp}: {e}");
    }
    let e = load_tp(&fixture("qwen3"), 0).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("at least 1"), "{e}");
}

/// Each rank holds its shard only: the per-rank weight bytes are about 1/world of the model's
/// sharded weights (the embedding, norms and router stay whole).
#[test]
fn ranks_hold_only_their_shard() {
    let dir = fixture("qwen3_next_a");
    let one = load_tp(&dir, 1).unwrap().weight_bytes();
    let two = load_tp(&dir, 2).unwrap().weight_bytes();
    let four = load_tp(&dir, 4).unwrap().weight_bytes();
    println!("weight bytes per rank: tp1 {one}, tp2 {two}, tp4 {four}");
    assert!(two * 10 < one * 6 && two * 10 > one * 4, "tp2 rank holds {two} of {one} bytes");
    assert!(four < two, "tp4 rank holds {four}, tp2 {two}");
}

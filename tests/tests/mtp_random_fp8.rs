//! MTP draft heads in FP8 and with random weights (issue #12 items 1, 2 and 6):
//! `--quantize fp8` of each fixture draft head against the same head loaded from a checkpoint
//! whose weights were block-quantized and dequantized by the reference rule written out here
//! (which tensors, and the scale / e4m3 rule of `tests/gen_fp8_fixtures.py`); speculative
//! decoding with an FP8 draft stays exact; a random-weight build of a Qwen3-Next config has its
//! MTP head, FP8 under `--quantize fp8`, and speculates exactly.

use porter_core::checkpoint::Checkpoint;
use porter_core::draft::{DraftHead, ForcedDraft, OracleDraft};
use porter_core::generate::generate;
use porter_core::quant::{QuantConfig, Quantize};
use porter_core::registry::{self, DraftLoadContext, LoadOptions};
use porter_core::sampling::SamplingParams;
use porter_core::speculative::{draft_logits, generate_speculative, MtpMode};
use porter_core::tensor::CpuStorage;
use porter_core::weight_map::WeightMap;
use porter_core::{config, DType, Device, Model, Weights};
use std::path::{Path, PathBuf};
use tests::*;

/// The f32 tolerance of tests/tests/fp8.rs (max |Δ| ≤ 1e-3 · std of the reference logits).
const F32_TOL: f32 = 1e-3;

/// (main fixture, draft folder) of every registered draft head.
const PAIRS: &[(&str, &str)] = &[
    ("qwen3_next_mtp", "qwen3_next_mtp"),
    ("qwen3_moe", "qwen3_moe_mtp_draft"),
    ("qwen3", "qwen3_dense_mtp_draft"),
    ("mistral", "mistral_mtp_draft"),
];

/// The reference rule for a draft head's tensors, as issue #12 states it: in the MTP layer the
/// attention projections and the expert / shared-expert / dense MLP projections are FP8; the
/// input projection (`mtp.fc`, `eh_proj`, LightLLM's `proj`), every norm, the router
/// (`mlp.gate`) and `shared_expert_gate` stay dense.
fn reference_quantizes(name: &str, shape: &[usize]) -> bool {
    let attn =
        ["q_proj", "k_proj", "v_proj", "o_proj"].iter().any(|p| name.ends_with(&format!("self_attn.{p}.weight")));
    let mlp = ["gate_proj", "up_proj", "down_proj"].iter().any(|p| name.ends_with(&format!(".{p}.weight")))
        && name.contains(".mlp.");
    shape.len() == 2 && (attn || mlp)
}

/// Block quantization then dequantization (scale = amax / 448 per 128 × 128 block, 1 for a
/// zero block, `e4m3(encode(w / scale)) · scale`: the rule of `tests/gen_fp8_fixtures.py`).
fn quant_dequant(w: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    use porter_core::tensor::fp8::{e4m3, encode};
    let sc = cols.div_ceil(128);
    let block = |i: usize| (i / cols / 128) * sc + (i % cols) / 128;
    let mut amax = vec![0.0f32; rows.div_ceil(128) * sc];
    for (i, v) in w.iter().enumerate() {
        amax[block(i)] = amax[block(i)].max(v.abs());
    }
    let scales: Vec<f32> = amax.iter().map(|&a| if a > 0.0 { a / 448.0 } else { 1.0 }).collect();
    w.iter().enumerate().map(|(i, v)| e4m3(encode(v / scales[block(i)])) * scales[block(i)]).collect()
}

/// Writes `tensors` (all F32) as one safetensors file.
fn write_f32(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
    let bytes: Vec<Vec<u8>> =
        tensors.iter().map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let file = tests::safetensors_bytes(
        tensors.iter().zip(&bytes).map(|((n, shape, _), b)| (n.as_str(), "F32", &shape[..], &b[..])),
    );
    std::fs::write(path, file).unwrap();
}

/// A temporary folder removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The draft folder `draft` rewritten with every tensor of its map in f32, the ones the
/// reference rule quantizes replaced by their quantized-dequantized values. Returns the folder
/// and the names replaced.
fn dequantized_reference(draft: &str, main: &Model, main_cfg: &serde_json::Value) -> (Scratch, Vec<String>) {
    let src = fixture(draft);
    let dir = std::env::temp_dir().join(format!("porter-mtpfp8-{draft}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let scratch = Scratch(dir.clone());
    if src.join("config.json").exists() {
        std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    }
    let pd = registry::prepare_draft(&src, main_cfg, &main.info, DType::F32).unwrap();
    let mut tensors = Vec::new();
    let mut quantized = Vec::new();
    for slot in &pd.map.slots {
        for (name, shape) in slot.sources.iter().zip(&slot.source_shapes) {
            let v = pd.checkpoint.read_f32(name).unwrap();
            let v = if reference_quantizes(name, shape) {
                quantized.push(name.clone());
                quant_dequant(&v, shape[0], shape[1])
            } else {
                v
            };
            tensors.push((name.clone(), shape.clone(), v));
        }
    }
    write_f32(&dir.join("model.safetensors"), &tensors);
    (scratch, quantized)
}

fn main_config(name: &str) -> serde_json::Value {
    config::read_config(&fixture(name)).unwrap()
}

/// Every slot of a draft map from `dir`, optionally quantized online.
fn draft_slots(dir: &Path, main: &Model, cfg: &serde_json::Value, fp8: bool) -> Vec<(String, porter_core::Tensor)> {
    let pd = registry::prepare_draft(dir, cfg, &main.info, DType::F32).unwrap();
    let mut w = pd.map.load(pd.checkpoint.clone(), DType::F32).unwrap();
    if fp8 {
        w.set_quantize(Some(QuantConfig::fp8()));
    }
    let mut names = w.remaining();
    names.sort();
    names.into_iter().map(|s| (s.clone(), w.take(&s).unwrap())).collect()
}

/// `--quantize fp8` of every fixture draft head: exactly the reference rule's tensors become
/// FP8 (1 byte a parameter plus scales) and their values are the reference's quantized-
/// dequantized values bit for bit; the others are unchanged. The draft logits equal those of
/// the head loaded from the dequantized checkpoint within the f32 tolerance of fp8.rs, and
/// differ from the dense head's (the quantization is real).
#[test]
fn fp8_draft_heads_match_the_dequantized_reference() {
    for &(main_name, draft) in PAIRS {
        let m = load(main_name, DType::F32).unwrap();
        let cfg = main_config(main_name);
        let (refdir, quantized) = dequantized_reference(draft, &m, &cfg);
        assert!(quantized.len() >= 3, "{draft}: only {} tensors the reference quantizes", quantized.len());
        let q = draft_slots(&fixture(draft), &m, &cfg, true);
        let r = draft_slots(&refdir.0, &m, &cfg, false);
        assert_eq!(q.len(), r.len());
        let pd = registry::prepare_draft(&fixture(draft), &cfg, &m.info, DType::F32).unwrap();
        let mut n_fp8 = 0;
        for ((sq, tq), (sr, tr)) in q.iter().zip(&r) {
            assert_eq!(sq, sr);
            let fp8 = matches!(tq.host().unwrap(), CpuStorage::F8E4M3(_));
            let slot = pd.map.slots.iter().find(|s| &s.slot == sq).unwrap();
            let want_fp8 = slot.sources.iter().all(|s| quantized.contains(s));
            assert_eq!(fp8, want_fp8, "{draft} slot {sq} ({:?}): FP8 {fp8}, reference rule {want_fp8}", slot.sources);
            if fp8 {
                // 1 byte a parameter, one f32 scale per 128 x 128 block of each source, and
                // the row -> scale-row map.
                let blocks: usize = slot.source_shapes.iter().map(|sh| sh[0].div_ceil(128) * sh[1].div_ceil(128)).sum();
                let rows = tq.elem_count() / tq.last_dim();
                assert_eq!(tq.bytes(), tq.elem_count() + 4 * blocks + 4 * rows, "{draft} slot {sq}: FP8 bytes");
                n_fp8 += 1;
            }
            assert_eq!(tq.host_vec().unwrap(), tr.host_vec().unwrap(), "{draft} slot {sq}: values differ");
        }
        assert!(n_fp8 >= 2, "{draft}: {n_fp8} FP8 slots");
        let ids: Vec<u32> = Checkpoint::open_files(&[fixture(main_name).join("mtp_reference.safetensors")])
            .unwrap()
            .read_i64("ids")
            .unwrap()
            .into_iter()
            .map(|v| v as u32)
            .collect();
        let dq = registry::load_draft_with(&fixture(draft), &cfg, &m, Some(Quantize::Fp8)).unwrap();
        let dr = registry::load_draft(&refdir.0, &cfg, &m).unwrap();
        let dd = registry::load_draft(&fixture(draft), &cfg, &m).unwrap();
        let got = draft_logits(&m, dq.as_ref(), &ids).unwrap().host_vec().unwrap();
        let want = draft_logits(&m, dr.as_ref(), &ids).unwrap().host_vec().unwrap();
        let dense = draft_logits(&m, dd.as_ref(), &ids).unwrap().host_vec().unwrap();
        assert_close(&format!("{draft} fp8 draft vs dequantized reference"), &got, &want, F32_TOL);
        let moved = max_abs_diff(&dense, &want) / std(&want);
        println!("{draft}: {n_fp8} FP8 slots; FP8 moves the draft logits by {moved:.3e} x std");
        assert!(moved > 10.0 * F32_TOL, "{draft}: FP8 barely moves the logits ({moved:e}): nothing quantized?");
    }
}

fn load_fp8(name: &str) -> Model {
    let o = LoadOptions {
        dtype: DType::F32,
        device: Device::Cpu,
        show_progress: false,
        quantize: Some(Quantize::Fp8),
        tensor_parallel: 1,
    };
    registry::load_with(&fixture(name), &o).unwrap()
}

const PROMPT: &[u32] = &[5, 77, 300, 12, 9, 41, 256];
const N: usize = 48;

/// Greedy speculative output with `drafts` equals plain greedy output of `m`, K = 1..=3
/// (returns the tokens per step of each K).
fn check_exact(what: &str, m: &Model, drafts: &[Box<dyn DraftHead>], mode: MtpMode) -> Vec<f64> {
    let plain = generate(m, PROMPT, SamplingParams::default(), N, &[]).unwrap().ids;
    let mut per_step = Vec::new();
    for k in 1..=3 {
        let g = generate_speculative(m, drafts, PROMPT, SamplingParams::default(), N, &[], k, mode).unwrap();
        println!("{what}, k = {k}: {:.2} tokens/step, {} of {} accepted", g.tokens_per_step(), g.accepted, g.proposed);
        assert_eq!(g.ids, plain, "{what} k={k}: speculative greedy output differs from plain greedy");
        per_step.push(g.tokens_per_step());
    }
    per_step
}

/// Speculative decoding with an FP8 draft head is exact (verification is exact): for every
/// draft, beside a dense main model and beside the main model quantized the same way; the FP8
/// head alone (nothing accepted: random fixture weights) and guided to 2 of 3 proposals right.
#[test]
fn speculative_decoding_with_an_fp8_draft_is_exact() {
    for &(main_name, draft) in PAIRS {
        let cfg = main_config(main_name);
        for (tag, m) in [("dense main", load(main_name, DType::F32).unwrap()), ("fp8 main", load_fp8(main_name))] {
            let d = registry::load_draft_with(&fixture(draft), &cfg, &m, Some(Quantize::Fp8)).unwrap();
            check_exact(&format!("{main_name} ({tag}) + fp8 {draft}"), &m, &[d], MtpMode::Eagle);
            let inner = registry::load_draft_with(&fixture(draft), &cfg, &m, Some(Quantize::Fp8)).unwrap();
            let mut seq = PROMPT.to_vec();
            seq.extend(generate(&m, PROMPT, SamplingParams::default(), N + 8, &[]).unwrap().ids);
            let oracle = OracleDraft { sequence: seq, wrong_every: Some(3), vocab_size: m.info.vocab_size };
            let guided: Vec<Box<dyn DraftHead>> = vec![Box::new(ForcedDraft { head: inner, oracle })];
            let per_step =
                check_exact(&format!("{main_name} ({tag}) + guided fp8 {draft}"), &m, &guided, MtpMode::Eagle);
            assert!(
                per_step.iter().all(|&t| t > 1.3),
                "{draft}: the guided draft got too little accepted: {per_step:?}"
            );
        }
    }
}

/// A Qwen3-Next config built with random weights has its MTP head (qwen3_next_mtp), in FP8
/// under `--quantize fp8` (each slot the reference rule quantizes is the block quantization of
/// the dense random slot of the same seed, the rest equal), and speculative decoding with it
/// is exact; an architecture without an MTP layer has no random draft.
#[test]
fn random_build_has_a_draft_head_and_speculates() {
    let cfg = main_config("qwen3_next_mtp");
    for quantize in [None, Some(Quantize::Fp8)] {
        let m = registry::build_random_with(&cfg, Path::new("."), DType::F32, Device::Cpu, 0, quantize).unwrap();
        let d = registry::build_random_draft(&cfg, &m, 1, quantize).unwrap().expect("qwen3_next has an MTP head");
        assert_eq!(d.name(), "qwen3_next_mtp");
        let logits = draft_logits(&m, d.as_ref(), &[1, 2, 3, 4]).unwrap().host_vec().unwrap();
        assert!(logits.iter().all(|v| v.is_finite()));
        check_exact(&format!("random qwen3_next + random draft ({quantize:?})"), &m, &[d], MtpMode::Eagle);
    }
    // The random draft's slots: the same map as a checkpoint's, FP8 by the reference rule.
    let m = registry::build_random(&cfg, Path::new("."), DType::F32, Device::Cpu, 0).unwrap();
    let entry = registry::draft_entries().into_iter().find(|e| e.name == "qwen3_next_mtp").unwrap();
    assert!(entry.in_main_checkpoint);
    let empty = Checkpoint::open_files(&[]).unwrap();
    let lc = DraftLoadContext {
        dir: Path::new("."),
        config: &cfg,
        main_config: &cfg,
        main: &m.info,
        checkpoint: &empty,
        dtype: DType::F32,
    };
    let map = WeightMap::parse(entry.weight_map).unwrap().resolve(&(entry.map_context)(&lc).unwrap()).unwrap();
    let mut dense = Weights::random(&map, DType::F32, 1, Device::Cpu);
    let mut q = Weights::random(&map, DType::F32, 1, Device::Cpu);
    q.set_quantize(Some(QuantConfig::fp8()));
    let mut n_fp8 = 0;
    for slot in &map.slots {
        let (a, b) = (dense.take(&slot.slot).unwrap(), q.take(&slot.slot).unwrap());
        let want = slot.sources.iter().zip(&slot.source_shapes).all(|(s, sh)| reference_quantizes(s, sh));
        let fp8 = matches!(b.host().unwrap(), CpuStorage::F8E4M3(_));
        assert_eq!(fp8, want, "random draft slot {}", slot.slot);
        let av = a.host_vec().unwrap();
        let expect = if fp8 { quant_dequant(&av, a.elem_count() / a.last_dim(), a.last_dim()) } else { av };
        assert_eq!(b.host_vec().unwrap(), expect, "random draft slot {}", slot.slot);
        n_fp8 += usize::from(fp8);
    }
    assert!(n_fp8 >= 6, "only {n_fp8} FP8 slots in the random draft");
    // Dense Qwen3: no MTP layer in the architecture.
    let cfg3 = main_config("qwen3");
    let m3 = registry::build_random(&cfg3, Path::new("."), DType::F32, Device::Cpu, 0).unwrap();
    assert!(registry::build_random_draft(&cfg3, &m3, 1, None).unwrap().is_none());
}

//! The hybrid state cache on a real Qwen3-Next model: speculative steps roll back the KV
//! and the recurrent (conv + SSM) state without recomputation, slots are reused, and many
//! sequences share one cache.

use porter_core::{Batch, DType, LogitsFor, Model, StateCache};
use tests::*;

fn logits_after(model: &Model, ids: &[u32]) -> Vec<f32> {
    let all = prefill_logits(model, ids).unwrap();
    let v = model.info.vocab_size;
    all[(ids.len() - 1) * v..].to_vec()
}

#[test]
fn rejected_draft_tokens_roll_back_exactly() {
    let m = load("qwen3_next_a", DType::F32).unwrap();
    let prompt: Vec<u32> = (0..70).map(|i| (i * 37 % 500 + 3) as u32).collect();
    for spec in 1..=3usize {
        for accepted in 1..=spec + 1 {
            let mut cache = m.new_cache_spec(1, spec).unwrap();
            let seq = cache.alloc_seq().unwrap();
            m.forward(&Batch::single(seq, 0, &prompt), &mut cache, LogitsFor::Last).unwrap();
            // A verify step of spec + 1 rows: the last accepted token plus `spec` drafts.
            let step: Vec<u32> = (0..=spec).map(|j| 11 + j as u32).collect();
            m.forward(&Batch::single(seq, prompt.len(), &step), &mut cache, LogitsFor::All).unwrap();
            // Keep `accepted` rows, roll back the rest, then continue with a new token.
            cache.truncate(seq, prompt.len() + accepted).unwrap();
            let next = 200u32;
            let out =
                m.forward(&Batch::single(seq, prompt.len() + accepted, &[next]), &mut cache, LogitsFor::Last).unwrap();
            let mut reference_ids = prompt.clone();
            reference_ids.extend_from_slice(&step[..accepted]);
            reference_ids.push(next);
            let want = logits_after(&m, &reference_ids);
            assert_close(&format!("spec {spec}, accepted {accepted}"), out.logits.data(), &want, 1e-4);
        }
    }
}

#[test]
fn rollback_beyond_the_last_step_is_an_error() {
    let m = load("qwen3_next_a", DType::F32).unwrap();
    let mut cache = m.new_cache_spec(1, 2).unwrap();
    let seq = cache.alloc_seq().unwrap();
    m.forward(&Batch::single(seq, 0, &[3, 4, 5, 6, 7]), &mut cache, LogitsFor::Last).unwrap();
    let e = cache.truncate(seq, 2).unwrap_err().to_string();
    assert!(e.contains("cannot roll the recurrent state"), "{e}");
    // The failed rollback changed nothing: the sequence still has its 5 tokens.
    assert_eq!(cache.seq_len(seq), 5);
}

#[test]
fn many_sequences_share_one_cache_without_leaks() {
    let m = load("qwen3_next_b", DType::F32).unwrap();
    let mut cache = m.new_cache(4).unwrap();
    let a_ids: Vec<u32> = vec![5, 9, 14, 200, 31, 7];
    let b_ids: Vec<u32> = vec![17, 3, 99];
    for _ in 0..200 {
        let a = cache.alloc_seq().unwrap();
        let b = cache.alloc_seq().unwrap();
        cache.free_seq(a).unwrap();
        cache.free_seq(b).unwrap();
    }
    assert!(cache.slots_created() <= 2, "slots leaked: {}", cache.slots_created());
    // Two sequences in one batch give the same logits as each alone.
    let a = cache.alloc_seq().unwrap();
    let b = cache.alloc_seq().unwrap();
    let mut batch = Batch::default();
    batch.push(a, 0, &a_ids);
    batch.push(b, 0, &b_ids);
    let out = m.forward(&batch, &mut cache, LogitsFor::Last).unwrap();
    let v = m.info.vocab_size;
    assert_close("seq a in batch", &out.logits.data()[..v], &logits_after(&m, &a_ids), 1e-4);
    assert_close("seq b in batch", &out.logits.data()[v..], &logits_after(&m, &b_ids), 1e-4);
    // Then a decode step for both at different positions.
    let mut batch = Batch::default();
    batch.push(a, a_ids.len(), &[42]);
    batch.push(b, b_ids.len(), &[43]);
    let out = m.forward(&batch, &mut cache, LogitsFor::Last).unwrap();
    let mut a2 = a_ids.clone();
    a2.push(42);
    let mut b2 = b_ids.clone();
    b2.push(43);
    assert_close("seq a decode", &out.logits.data()[..v], &logits_after(&m, &a2), 1e-4);
    assert_close("seq b decode", &out.logits.data()[v..], &logits_after(&m, &b2), 1e-4);
    // A freed slot starts clean.
    cache.free_seq(a).unwrap();
    let c = cache.alloc_seq().unwrap();
    let out = m.forward(&Batch::single(c, 0, &b_ids), &mut cache, LogitsFor::Last).unwrap();
    assert_close("reused slot", out.logits.data(), &logits_after(&m, &b_ids), 1e-4);
}

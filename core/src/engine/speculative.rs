//! Speculative decoding with MTP draft heads: propose K tokens with the draft, verify
//! them in one main-model forward of K+1 rows, accept the longest matching prefix plus a
//! bonus token, and roll the main cache (KV and recurrent state) back to the accepted
//! position without recomputation. At temperature > 0 acceptance is rejection sampling,
//! so the output distribution equals the main model's.

use crate::backend::cuda::profile::host_span;
use crate::bail;
use crate::batch::Batch;
use crate::engine::generate::FinishReason;
use crate::engine::sampling::{SamplingParams, SeqSampler, StopParams};
use crate::error::Result;
use crate::model::draft::DraftHead;
use crate::model::{LogitsFor, Model};
use crate::state::{CacheConfig, SeqId, StateCache};
use crate::tensor::Tensor;

/// Largest number of draft tokens per step.
pub const MAX_MTP_STEP: usize = 15;

/// How draft modules are used across the K draft steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MtpMode {
    /// One module run K times, feeding back its own hidden.
    Eagle,
    /// Module i drafts step i (K stateless modules).
    Vanilla,
}

impl std::str::FromStr for MtpMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "eagle" => Ok(MtpMode::Eagle),
            "vanilla" => Ok(MtpMode::Vanilla),
            o => Err(format!("unknown MTP mode `{o}` (expected eagle or vanilla)")),
        }
    }
}

/// Result of speculative generation.
#[derive(Clone, Debug)]
pub struct SpecGeneration {
    pub ids: Vec<u32>,
    pub finish: FinishReason,
    /// Verify forwards run.
    pub steps: usize,
    /// Draft tokens proposed and accepted.
    pub proposed: usize,
    pub accepted: usize,
    /// How the first draft module's steps used CUDA graphs (`None`: its cache keeps none),
    /// and the shapes whose capture failed, with why.
    pub draft_graphs: Option<(crate::backend::cuda::graph::GraphStats, Vec<String>)>,
}

impl SpecGeneration {
    /// Average tokens emitted per verify step (accepted drafts + the bonus token).
    pub fn tokens_per_step(&self) -> f64 {
        if self.steps == 0 {
            0.0
        } else {
            (self.accepted + self.steps) as f64 / self.steps as f64
        }
    }
}

/// Checks a draft configuration.
pub fn check_config(drafts: &[Box<dyn DraftHead>], k: usize, mode: MtpMode) -> Result<()> {
    if k == 0 || k > MAX_MTP_STEP {
        bail!(Input, "--mtp-step must be in 1..={MAX_MTP_STEP}, got {k}");
    }
    match mode {
        MtpMode::Eagle if drafts.len() != 1 => bail!(Input, "eagle mode runs one draft module, got {}", drafts.len()),
        MtpMode::Vanilla if drafts.len() < k => {
            bail!(Input, "vanilla mode needs one draft module per step: {k} steps, {} modules", drafts.len())
        }
        MtpMode::Vanilla if drafts.iter().any(|d| d.is_stateful()) => {
            bail!(Input, "vanilla mode needs FFN-only (stateless) draft modules; use eagle mode for attention drafts")
        }
        _ => Ok(()),
    }
}

/// The draft's output for the rows of one sequence: `[T-1, vocab]` logits, row p predicting
/// token p+2 from token p+1 and the main hidden at p (what `porter logits` writes as
/// `mtp_logits`).
pub fn draft_logits(main: &Model, draft: &dyn DraftHead, ids: &[u32]) -> Result<Tensor> {
    if ids.len() < 2 {
        bail!(Input, "draft logits need at least 2 token ids");
    }
    let mut cache = main.new_cache_spec(1, 0)?;
    let seq = cache.alloc_seq()?;
    let out = main.forward(&Batch::single(seq, 0, ids), &mut cache, LogitsFor::Last)?;
    let t = ids.len();
    let hid = draft.main_hidden(main, &out.hidden.narrow_rows(0, t - 1)?)?;
    let mut dc = draft.new_cache(&CacheConfig::for_tokens(1, 0, ids.len()))?;
    let dseq = dc.alloc_seq()?;
    Ok(draft.forward(main, &Batch::single(dseq, 0, &ids[1..]), &hid, &mut dc, LogitsFor::All)?.logits)
}

struct Drafter<'a> {
    main: &'a Model,
    drafts: &'a [Box<dyn DraftHead>],
    caches: Vec<(crate::state::ModelCache, SeqId)>,
    mode: MtpMode,
    k: usize,
}

impl Drafter<'_> {
    /// Catch-up over accepted rows (tokens `toks` with main hidden `hid` at positions
    /// `pos0..`), then K−1 chained steps. Returns the K draft tokens and their distributions
    /// (draft i sampled at output position `out_len + i`; `eos` as in [`SeqSampler::probs`]).
    #[allow(clippy::too_many_arguments)]
    fn propose(
        &mut self,
        toks: &[u32],
        hid: &Tensor,
        pos0: usize,
        sampler: &mut SeqSampler,
        out_len: usize,
        eos: &[u32],
    ) -> Result<(Vec<u32>, Vec<Vec<f32>>)> {
        let (d0, c0) = (&self.drafts[0], &mut self.caches[0]);
        if d0.is_stateful() {
            c0.0.truncate(c0.1, pos0)?;
        }
        let hid0 = d0.main_hidden(self.main, hid)?;
        let span = host_span("spec: draft step (issue)");
        let out = d0.forward(self.main, &Batch::single(c0.1, pos0, toks), &hid0, &mut c0.0, LogitsFor::Last)?;
        drop(span);
        let span = host_span("spec: draft token (wait)");
        let (mut tok, mut q) = draw_draft(sampler, &out.logits, out_len, eos)?;
        drop(span);
        let mut h = out.hidden.narrow_rows(out.hidden.rows() - 1, 1)?;
        let (mut drafts, mut dists) = (vec![tok], vec![q]);
        for i in 1..self.k {
            let m = if self.mode == MtpMode::Eagle { 0 } else { i };
            let (d, c) = (&self.drafts[m], &mut self.caches[m]);
            let pos = pos0 + toks.len() - 1 + i;
            let span = host_span("spec: draft step (issue)");
            let out = d.forward(self.main, &Batch::single(c.1, pos, &[tok]), &h, &mut c.0, LogitsFor::Last)?;
            drop(span);
            let span = host_span("spec: draft token (wait)");
            (tok, q) = draw_draft(sampler, &out.logits, out_len + i, eos)?;
            drop(span);
            h = out.hidden;
            drafts.push(tok);
            dists.push(q);
        }
        Ok((drafts, dists))
    }
}

/// Device sampler parameters of a greedy row (`sample_rows`: temperature 0 is the argmax).
pub(crate) const GREEDY_ROW: [f32; 4] = [0.0, 0.0, 1.0, 0.0];

/// One draft token from the draft's last logits row and its distribution `q`; greedy on a
/// CUDA device ([`SeqSampler::greedy_on_device`]) the argmax is taken there and `q` is left
/// empty, meaning one-hot at the token (what `probs` would give), without the row coming to
/// the host.
fn draw_draft(sampler: &mut SeqSampler, logits: &Tensor, out_len: usize, eos: &[u32]) -> Result<(u32, Vec<f32>)> {
    let (rows, vocab) = (logits.rows(), logits.last_dim());
    if rows == 0 || vocab == 0 {
        bail!(Shape, "a draft's logits have no row to sample ({:?})", logits.shape());
    }
    if sampler.greedy_plain(out_len) {
        // A greedy draft token is the argmax of the raw row (what `probs` makes one-hot):
        // on a CUDA device only its id comes back; on the host it is one scan of the row,
        // without the vocabulary-sized distribution (a host draft such as the oracle's
        // spent over 1 ms a token there, which the step timings counted as draft cost).
        let tok = match logits.storage() {
            crate::tensor::Storage::Cuda(_) => {
                let last = logits.narrow_rows(rows - 1, 1)?;
                let ids = crate::backend::cuda::blocks::sample_rows(&last, &[GREEDY_ROW])?;
                ids.first().copied().ok_or_else(|| crate::err!(Internal, "the device argmax returned no id"))?
            }
            crate::tensor::Storage::Cpu(_) => {
                let all = logits.host_f32()?;
                crate::engine::sampling::argmax(&all[(rows - 1) * vocab..]) as u32
            }
        };
        return Ok((tok, Vec::new()));
    }
    let last = logits.narrow_rows(rows - 1, 1)?;
    let q = sampler.probs(last.to_host()?.row(0), out_len, eos)?;
    Ok((sampler.sample_from(&q), q))
}

/// The draft's probability of token `d` (`q` empty: one-hot at the proposed token `proposed`).
pub(crate) fn q_of(q: &[f32], d: usize, proposed: u32) -> f32 {
    if q.is_empty() {
        f32::from(d == proposed as usize)
    } else {
        q[d]
    }
}

/// Rejection sampling's test of draft `d`, drawn from `q` (empty: one-hot at `d`), against the
/// target distribution `p` of its row: accepted with probability min(1, p(d) / q(d)).
pub(crate) fn draft_accepted(sampler: &mut SeqSampler, p: &[f32], q: &[f32], d: u32) -> bool {
    let (pd, qd) = (p[d as usize] as f64, q_of(q, d as usize, d) as f64);
    qd > 0.0 && sampler.uniform() < (pd / qd).min(1.0)
}

/// The token drawn where draft `d` (from `q`, empty: one-hot at `d`) was rejected at a row of
/// target distribution `p`: from the residual max(0, p − q) renormalised, or from `p` when that
/// is all zero.
pub(crate) fn resample_rejected(sampler: &mut SeqSampler, p: &[f32], q: &[f32], d: u32) -> u32 {
    let mut r: Vec<f32> = p.iter().enumerate().map(|(i, a)| (a - q_of(q, i, d)).max(0.0)).collect();
    let s: f32 = r.iter().sum();
    if s > 0.0 {
        r.iter_mut().for_each(|v| *v /= s);
        sampler.sample_from(&r)
    } else {
        sampler.sample_from(p)
    }
}

/// The tokens a plain greedy verify emits from the argmaxes `ids` of its K + 1 rows: the
/// drafts up to the first that is not its row's argmax, then the argmax of that row (or of the
/// last row): what rejection sampling decides for one-hot distributions.
pub(crate) fn greedy_verdict(proposal: &[u32], ids: &[u32]) -> Vec<u32> {
    let accepted = proposal.iter().zip(ids).take_while(|(d, t)| d == t).count();
    let mut out = proposal[..accepted].to_vec();
    if let Some(&bonus) = ids.get(accepted) {
        out.push(bonus);
    }
    out
}

/// Generates up to `max_tokens` ids after `prompt` with K-token speculative decoding.
#[allow(clippy::too_many_arguments)]
pub fn generate_speculative(
    main: &Model,
    drafts: &[Box<dyn DraftHead>],
    prompt: &[u32],
    params: SamplingParams,
    max_tokens: usize,
    stop_ids: &[u32],
    k: usize,
    mode: MtpMode,
) -> Result<SpecGeneration> {
    check_config(drafts, k, mode)?;
    let stop = params.stop.clone();
    let max_tokens = max_tokens.min(stop.max_tokens.unwrap_or(usize::MAX));
    // A verify step looks K positions past the last accepted token.
    crate::engine::generate::check_context(main, prompt.len(), max_tokens, k)?;
    let mut sampler = SeqSampler::new(params)?;
    sampler.observe_prompt(prompt);
    let mut cache = main.new_cache_spec(1, k)?;
    let seq = cache.alloc_seq()?;
    let mut caches = Vec::with_capacity(drafts.len());
    for d in drafts {
        let mut c = d.new_cache(&CacheConfig::for_tokens(1, 0, prompt.len() + max_tokens + k + 1))?;
        let s = c.alloc_seq()?;
        caches.push((c, s));
    }
    let mut drafter = Drafter { main, drafts, caches, mode, k };
    let mut gen = SpecGeneration {
        ids: Vec::new(),
        finish: FinishReason::Length,
        steps: 0,
        proposed: 0,
        accepted: 0,
        draft_graphs: None,
    };
    if max_tokens == 0 {
        return Ok(gen);
    }
    // Prefill.
    let out = main.forward(&Batch::single(seq, 0, prompt), &mut cache, LogitsFor::Last)?;
    let mut last = sampler.sample_tensor(&out.logits, 0, 0, stop_ids)?;
    sampler.accept(last);
    if push(&mut gen, last, max_tokens, stop_ids, &stop) {
        return Ok(gen);
    }
    let mut len = prompt.len();
    let mut toks: Vec<u32> = prompt[1..].to_vec();
    toks.push(last);
    let (mut proposal, mut dists) = drafter.propose(&toks, &out.hidden, 0, &mut sampler, gen.ids.len(), stop_ids)?;
    loop {
        // Verify [last, d1..dK] at positions len..len+K.
        let mut rows = vec![last];
        rows.extend_from_slice(&proposal);
        let span = host_span("spec: verify (issue)");
        let out = main.forward(&Batch::single(seq, len, &rows), &mut cache, LogitsFor::All)?;
        drop(span);
        let span = host_span("spec: verify ids (wait)");
        gen.steps += 1;
        gen.proposed += k;
        let base = gen.ids.len();
        let (accepted, bonus) = if (0..=k).all(|j| sampler.greedy_on_device(&out.logits, base + j)) {
            // Greedy on a GPU: the K + 1 argmaxes on the device, only their ids come back. A
            // greedy target is one-hot at its argmax, so a draft is accepted exactly when it
            // is that argmax, and the bonus is the argmax of the first rejected (or the last)
            // row: the decisions of the distribution path below, without the rows.
            let ids = crate::backend::cuda::blocks::sample_rows(&out.logits, &vec![GREEDY_ROW; k + 1])?;
            if ids.len() != k + 1 {
                bail!(Internal, "the device argmax returned {} ids for {} rows", ids.len(), k + 1);
            }
            let mut toks = greedy_verdict(&proposal, &ids);
            let bonus = toks.pop().ok_or_else(|| crate::err!(Internal, "a greedy verify without a bonus token"))?;
            toks.iter().for_each(|&t| sampler.accept(t));
            (toks.len(), bonus)
        } else {
            // The K + 1 verify rows come to the host for the accept / reject decisions.
            let logits = out.logits.to_host()?;
            let mut accepted = 0;
            let mut bonus = None;
            // Row j is scored with the drafts before it accepted (their penalties apply).
            for j in 0..k {
                let p = sampler.probs(logits.row(j), base + j, stop_ids)?;
                if draft_accepted(&mut sampler, &p, &dists[j], proposal[j]) {
                    accepted += 1;
                    sampler.accept(proposal[j]);
                } else {
                    bonus = Some(resample_rejected(&mut sampler, &p, &dists[j], proposal[j]));
                    break;
                }
            }
            let bonus = match bonus {
                Some(b) => b,
                None => sampler.sample(logits.row(k), base + k, stop_ids)?.token,
            };
            (accepted, bonus)
        };
        drop(span);
        sampler.accept(bonus);
        gen.accepted += accepted;
        let mut done = false;
        for &t in proposal[..accepted].iter().chain(std::iter::once(&bonus)) {
            if push(&mut gen, t, max_tokens, stop_ids, &stop) {
                done = true;
                break;
            }
        }
        if done {
            gen.draft_graphs = drafter.caches.first().and_then(|(c, _)| {
                let failed = c.graph_shapes().1.into_iter().map(|(k, e)| format!("{k:?}: {e}")).collect();
                c.graph_stats().map(|st| (st, failed))
            });
            return Ok(gen);
        }
        // Roll back the rejected rows: main consumed last + the accepted drafts.
        cache.truncate(seq, len + accepted + 1)?;
        let hid = out.hidden.narrow_rows(0, accepted + 1)?;
        let mut next: Vec<u32> = proposal[..accepted].to_vec();
        next.push(bonus);
        (proposal, dists) = drafter.propose(&next, &hid, len, &mut sampler, gen.ids.len(), stop_ids)?;
        len += accepted + 1;
        last = bonus;
    }
}

/// Appends a token; true when generation is finished.
fn push(gen: &mut SpecGeneration, t: u32, max_tokens: usize, stop_ids: &[u32], stop: &StopParams) -> bool {
    gen.ids.push(t);
    if stop.finish(t, gen.ids.len(), stop_ids) == Some(FinishReason::Eos) {
        gen.finish = FinishReason::Eos;
        return true;
    }
    gen.ids.len() >= max_tokens
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::SeqId;
    use crate::model::draft::OracleDraft;

    /// A greedy draft token from host logits is the argmax the distribution path picks
    /// (one-hot `probs`, then `sample_from`), first index on ties, with `q` left empty.
    #[test]
    fn greedy_host_draft_token_is_the_distribution_paths_argmax() {
        let v = 1000;
        let mut row: Vec<f32> = (0..v).map(|i| ((i * 7919) % 613) as f32 * 0.01 - 3.0).collect();
        row[417] = 9.0;
        row[823] = 9.0; // a tie: the first index wins
        let mut two = vec![0.0f32; v];
        two.extend_from_slice(&row);
        let logits = Tensor::from_vec(two, [2, v], crate::tensor::DType::F32).unwrap();
        let mut s = SeqSampler::new(SamplingParams::default()).unwrap();
        let (tok, q) = draw_draft(&mut s, &logits, 3, &[]).unwrap();
        assert_eq!((tok, q.is_empty()), (417, true));
        let p = s.probs(&row, 3, &[]).unwrap();
        assert_eq!(s.sample_from(&p), tok);
        let empty = Tensor::from_vec(Vec::new(), [0, v], crate::tensor::DType::F32).unwrap();
        assert!(draw_draft(&mut s, &empty, 3, &[]).is_err());
    }

    /// The oracle builds only the rows asked for: each span's last for `LogitsFor::Last`.
    #[test]
    fn oracle_builds_the_rows_asked_for() {
        let o = OracleDraft { sequence: (100..120).collect(), wrong_every: None, vocab_size: 128 };
        let b = Batch::single(SeqId(0), 5, &[1, 2, 3]);
        let last = o.logits(&b, LogitsFor::Last).unwrap();
        assert_eq!(last.shape(), &[1, 128]);
        // Position 7 predicts sequence[9].
        assert_eq!(crate::engine::sampling::argmax(last.row(0)), 109);
        let all = o.logits(&b, LogitsFor::All).unwrap();
        assert_eq!(all.shape(), &[3, 128]);
        let ids: Vec<usize> = (0..3).map(|r| crate::engine::sampling::argmax(all.row(r))).collect();
        assert_eq!(ids, [107, 108, 109]);
    }
}

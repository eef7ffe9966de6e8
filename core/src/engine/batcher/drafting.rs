//! The speculative half of an engine step: batched drafting with the MTP heads, and the
//! verify decisions of plain greedy requests on the device.
//!
//! A request that is plain greedy (temperature 0, nothing the device sampler lacks:
//! `SeqSampler::greedy_plain`) has one-hot target and draft distributions, so rejection
//! sampling reduces to comparing ids: a draft is accepted exactly when it is the target's
//! argmax, and the bonus is the argmax of the first rejected (or the last) row. Such requests
//! draw their drafts as argmaxes (the distribution is kept empty, meaning one-hot at the
//! token) and, on a GPU, are verified from the device's argmaxes (only the ids come back),
//! where the host path turned every draft and verify row into a vocabulary-sized
//! distribution (over 1 ms a row of 151,936 on a CPU core).

use super::{CatchUp, EngineCore, Live};
use crate::engine::request::RequestId;
pub(super) use crate::engine::speculative::{draft_accepted, greedy_verdict, resample_rejected};
use crate::engine::speculative::{MtpMode, GREEDY_ROW};
use crate::error::Result;
use crate::model::{LogitsFor, Model};
use crate::state::StateCache;
use crate::tensor::Tensor;
use std::collections::HashMap;
use std::ops::Deref;

/// Draws each proposing request's next draft token from its row of a draft forward's logits
/// (`rows`: request, logits row, output position) and records it: the proposal, the
/// distribution it was drawn from (empty: one-hot at the token), counted by the sampler. A
/// request that is plain greedy at that position takes the row's argmax: on the device for
/// every row at once when all are (only the ids come back), else on the host.
fn draw_drafts(
    live: &mut HashMap<RequestId, Live>,
    logits: &Tensor,
    rows: &[(RequestId, usize, usize)],
    eos: &[u32],
) -> Result<()> {
    let greedy: Vec<bool> =
        rows.iter().map(|(id, _, out)| live.get(id).is_some_and(|l| l.sampler.greedy_plain(*out))).collect();
    let dev = if logits.is_cuda() && !rows.is_empty() && greedy.iter().all(|&g| g) {
        Some(crate::backend::cuda::blocks::sample_rows(logits, &vec![GREEDY_ROW; logits.rows()])?)
    } else {
        None
    };
    let host = if dev.is_none() { Some(logits.to_host()?) } else { None };
    for (j, &(id, row, out_len)) in rows.iter().enumerate() {
        let l = live.get_mut(&id).ok_or_else(|| crate::err!(Internal, "request {id} vanished"))?;
        let (tok, q) = match (&dev, &host) {
            (Some(ids), _) => (
                ids.get(row).copied().ok_or_else(|| crate::err!(Internal, "no device argmax for row {row}"))?,
                Vec::new(),
            ),
            (None, Some(h)) if greedy[j] => (crate::engine::sampling::argmax(h.row(row)) as u32, Vec::new()),
            (None, Some(h)) => {
                // Drafts are drawn from the request's own distribution.
                let q = l.sampler.probs(h.row(row), out_len, eos)?;
                (l.sampler.sample_from(&q), q)
            }
            (None, None) => crate::bail!(Internal, "draft logits neither on the device nor on the host"),
        };
        // Counted (penalties) while the later drafts are drawn, then forgotten.
        l.sampler.accept(tok);
        l.proposal.push(tok);
        l.dists.push(q);
    }
    Ok(())
}

impl<M: Deref<Target = Model>> EngineCore<M> {
    /// Batched drafting: one catch-up forward of the first draft over every request's new
    /// main rows, then K − 1 chained one-row-per-request steps for the requests that propose.
    pub(super) fn draft(&mut self, hidden: &Tensor, work: Vec<CatchUp>) -> Result<()> {
        let Some(d) = self.drafting.as_mut() else { return Ok(()) };
        let main: &Model = &self.model;
        let eos = self.eos.clone();
        let k = d.spec.k;
        // Slots for requests new to the drafts (first step after admission).
        for w in &work {
            let l = self.live.get_mut(&w.id).ok_or_else(|| crate::err!(Internal, "request {} vanished", w.id))?;
            if l.dseqs.is_empty() {
                l.dseqs = d.caches.iter_mut().map(|c| c.alloc_seq()).collect::<Result<Vec<_>>>()?;
            }
        }
        // Catch-up of draft 0 over [Σ ids] rows.
        let (d0, c0) = (&d.spec.drafts[0], &mut d.caches[0]);
        let mut batch = crate::batch::Batch::default();
        let mut hid_parts = Vec::with_capacity(work.len());
        for w in &work {
            let s = self.live[&w.id].dseqs[0];
            if d0.is_stateful() {
                c0.truncate(s, w.pos0)?;
            }
            batch.push(s, w.pos0, &w.ids);
            hid_parts.push(hidden.narrow_rows(w.hid_start, w.ids.len())?);
        }
        let hid = Tensor::concat_rows(&hid_parts.iter().collect::<Vec<_>>())?;
        let hid0 = d0.main_hidden(main, &hid)?;
        let out = d0.forward(main, &batch, &hid0, c0, LogitsFor::Last)?;
        // Requests that propose: (id, row in the draft output, output position of the draft).
        let mut props: Vec<(RequestId, usize, usize)> = Vec::new();
        // Their next positions and hidden rows.
        let mut next: Vec<usize> = Vec::new();
        let mut hs = Vec::new();
        for (i, w) in work.iter().enumerate() {
            if !w.propose {
                continue;
            }
            let l = self.live.get_mut(&w.id).ok_or_else(|| crate::err!(Internal, "request {} vanished", w.id))?;
            l.proposal.clear();
            l.dists.clear();
            props.push((w.id, i, l.generated));
            let s = batch.spans[i];
            hs.push(out.hidden.narrow_rows(s.start + s.len - 1, 1)?);
            next.push(w.pos0 + w.ids.len());
        }
        draw_drafts(&mut self.live, &out.logits, &props, &eos)?;
        for step in 1..k {
            if props.is_empty() {
                break;
            }
            let m = if d.spec.mode == MtpMode::Eagle { 0 } else { step };
            let (dm, cm) = (&d.spec.drafts[m], &mut d.caches[m]);
            let mut b = crate::batch::Batch::default();
            for ((id, _, _), pos) in props.iter().zip(&next) {
                let l = &self.live[id];
                b.push(l.dseqs[m], pos + step - 1, &[l.proposal[step - 1]]);
            }
            let h = Tensor::concat_rows(&hs.iter().collect::<Vec<_>>())?;
            let o = dm.forward(main, &b, &h, cm, LogitsFor::Last)?;
            let rows: Vec<(RequestId, usize, usize)> =
                props.iter().enumerate().map(|(j, &(id, _, out))| (id, j, out + step)).collect();
            draw_drafts(&mut self.live, &o.logits, &rows, &eos)?;
            hs = (0..props.len()).map(|j| o.hidden.narrow_rows(j, 1)).collect::<Result<_>>()?;
        }
        for (id, _, _) in &props {
            if let Some(r) = self.seqs.get_mut(id) {
                r.lookahead = k;
            }
            if let Some(l) = self.live.get_mut(id) {
                l.sampler.truncate_output(l.generated);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_verdict_is_rejection_sampling_of_one_hot_distributions() {
        // All accepted: the drafts and the last row's argmax.
        assert_eq!(greedy_verdict(&[5, 6, 7], &[5, 6, 7, 8]), vec![5, 6, 7, 8]);
        // The second draft rejected: the first draft, then row 1's argmax.
        assert_eq!(greedy_verdict(&[5, 6, 7], &[5, 9, 7, 8]), vec![5, 9]);
        // None accepted.
        assert_eq!(greedy_verdict(&[5], &[4, 3]), vec![4]);
        use crate::engine::speculative::q_of;
        assert_eq!(q_of(&[], 3, 3), 1.0);
        assert_eq!(q_of(&[], 2, 3), 0.0);
        assert_eq!(q_of(&[0.25, 0.75], 1, 0), 0.75);
    }
}

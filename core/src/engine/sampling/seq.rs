//! [`SeqSampler`]: one request's sampler (params, RNG stream, token counts).

use std::collections::BTreeMap;

use super::row::{self, Row};
use super::schema::SchemaState;
use super::SamplingParams;
use crate::error::Result;
use crate::{bail, err};

/// One sampled token.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    /// The chosen id.
    pub token: u32,
    /// Its logprob (after penalties and the min_tokens mask, before temperature and truncation;
    /// see the module docs); `None` unless the request asked for logprobs.
    pub logprob: Option<f32>,
    /// The `logprobs` best `(id, logprob)` pairs, largest first (lower id first on ties); empty
    /// unless the request asked for logprobs.
    pub top: Vec<(u32, f32)>,
}

/// How often a token was seen.
#[derive(Clone, Copy, Debug, Default)]
struct Seen {
    prompt: bool,
    out: u32,
}

/// The distribution a row is sampled from.
enum Dist {
    /// A single token survives: no draw.
    One(u32),
    /// The kept tokens in index order with their probabilities (normalised, float32).
    Kept(Vec<(u32, f32)>),
    /// Every token, `p_i = exp(f64(v_i / t − ms)) / z`.
    Full { t: f32, ms: f32, z: f64 },
}

/// One request's sampler: its [`SamplingParams`], its own SplitMix64 stream and the token
/// counts of its prompt and output (see the [module docs](super) for the processing order).
///
/// The engine calls [`SeqSampler::observe_prompt`] once, then per step
/// [`SeqSampler::sample`] and [`SeqSampler::accept`] (separate, so a verify path can score
/// drafted tokens with [`SeqSampler::probs`] and accept only some; [`SeqSampler::truncate_output`]
/// rolls accepted tokens back).
#[derive(Clone, Debug)]
pub struct SeqSampler {
    params: SamplingParams,
    state: u64,
    seen: BTreeMap<u32, Seen>,
    output: Vec<u32>,
    /// Structured output: the recogniser's state after each accepted output prefix (`json[i]`
    /// after `i` tokens); empty without it.
    json: Vec<SchemaState>,
}

impl SeqSampler {
    /// A sampler for `params` (validated). The stream starts from `seed ^ 0x9E3779B97F4A7C15`;
    /// without a seed it starts from a random value of the process's hasher keys.
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        let seed = params.seed.unwrap_or_else(random_seed);
        let state = seed ^ 0x9E37_79B9_7F4A_7C15;
        let json = params.json.as_ref().map(|m| vec![m.schema.start()]).unwrap_or_default();
        Ok(Self { params, state, seen: BTreeMap::new(), output: Vec::new(), json })
    }

    /// The request's parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The accepted output tokens.
    pub fn output(&self) -> &[u32] {
        &self.output
    }

    /// Records prompt tokens (the repetition penalty's set). May be called for several chunks.
    pub fn observe_prompt(&mut self, ids: &[u32]) {
        for &id in ids {
            self.seen.entry(id).or_default().prompt = true;
        }
    }

    /// Records `token` as the next output token (presence/frequency counts, repetition set).
    pub fn accept(&mut self, token: u32) {
        let s = self.seen.entry(token).or_default();
        s.out = s.out.saturating_add(1);
        self.output.push(token);
        if let (Some(m), Some(&last)) = (&self.params.json, self.json.last()) {
            // A token the mask refused (an end id, or one chosen another way) leaves the state.
            self.json.push(last.feed(&m.schema, m.vocab.of(token)).unwrap_or(last));
        }
    }

    /// Forgets output tokens after the first `len` (rolling back rejected drafts).
    pub fn truncate_output(&mut self, len: usize) {
        self.json.truncate(len + 1);
        while self.output.len() > len {
            let Some(t) = self.output.pop() else { break };
            if let Some(s) = self.seen.get_mut(&t) {
                s.out = s.out.saturating_sub(1);
                if s.out == 0 && !s.prompt {
                    self.seen.remove(&t);
                }
            }
        }
    }

    /// A uniform draw in [0, 1) from this request's stream.
    pub fn uniform(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The biased / penalised / masked entries of a row of `vocab` logits, sorted by id.
    fn overrides(&self, raw: &[f32], out_len: usize, eos: &[u32]) -> Vec<(u32, f32)> {
        let p = &self.params;
        let mut ov = Vec::new();
        let limit = raw.len().min(u32::MAX as usize) as u32;
        let pen = p.has_penalties();
        if pen || !p.logit_bias.is_empty() {
            let (r, pres, freq) = (p.repetition_penalty, p.presence_penalty, p.frequency_penalty);
            // Both lists are sorted by id: walk them together, the bias first (vLLM's order).
            let mut seen = self.seen.range(..limit).filter(|_| pen).peekable();
            let mut bias = p.logit_bias.iter().filter(|e| e.0 < limit).peekable();
            loop {
                let id = match (seen.peek().map(|e| *e.0), bias.peek().map(|e| e.0)) {
                    (None, None) => break,
                    (Some(a), Some(b)) => a.min(b),
                    (Some(a), None) | (None, Some(a)) => a,
                };
                let mut v = raw[id as usize];
                if let Some(&(_, b)) = bias.next_if(|e| e.0 == id) {
                    v += b;
                }
                if let Some((_, s)) = seen.next_if(|e| *e.0 == id) {
                    if r != 1.0 {
                        v = if v > 0.0 { v / r } else { v * r };
                    }
                    if s.out > 0 {
                        v -= freq * s.out as f32 + pres;
                    }
                }
                ov.push((id, v));
            }
        }
        if let (Some(m), Some(&st)) = (&p.json, self.json.last()) {
            let bits = m.schema.allowed_set(&m.vocab, st);
            let end = (st.may_end(&m.schema), st.complete());
            return Self::json_mask(&bits, end, ov, raw.len(), p.stop.masks(out_len), self.stop_ids(eos));
        }
        if p.stop.masks(out_len) {
            for id in self.stop_ids(eos) {
                if (id as usize) >= raw.len() {
                    continue;
                }
                match ov.binary_search_by_key(&id, |e: &(u32, f32)| e.0) {
                    Ok(j) => ov[j].1 = f32::NEG_INFINITY,
                    Err(j) => ov.insert(j, (id, f32::NEG_INFINITY)),
                }
            }
        }
        ov
    }

    /// The stop ids of a row: `stop_token_ids`, and `eos` unless `ignore_eos`.
    fn stop_ids<'a>(&'a self, eos: &'a [u32]) -> impl Iterator<Item = u32> + 'a {
        let p = &self.params;
        let eos = if p.stop.ignore_eos { &[][..] } else { eos };
        eos.iter().chain(&p.stop.stop_token_ids).copied()
    }

    /// `ov` (sorted by id) under structured output over a row of `n` logits: every token
    /// outside `bits` (the state's allowed set) at −∞; the stop ids pass only where the text
    /// may end (`end.0`; not while `min_tokens` masks them), and once it is complete (`end.1`)
    /// only they do.
    fn json_mask(
        bits: &[u64],
        end: (bool, bool),
        ov: Vec<(u32, f32)>,
        n: usize,
        min_tokens: bool,
        stops: impl Iterator<Item = u32>,
    ) -> Vec<(u32, f32)> {
        let bit = |id: usize| bits.get(id / 64).is_some_and(|w| (w >> (id % 64)) & 1 == 1);
        let mut stop: Vec<u32> = stops.filter(|&id| (id as usize) < n).collect();
        stop.sort_unstable();
        let stop_ok = end.0 && !min_tokens;
        // Once the text is complete only a stop id may follow (the model may prefer more
        // whitespace, forever); whitespace only where no stop id can end the request.
        let stop_only = end.1 && stop_ok && !stop.is_empty();
        let mut out = Vec::new();
        let mut old = ov.into_iter().peekable();
        for id in 0..n {
            let kept = old.next_if(|e| e.0 as usize == id);
            let a = if stop.binary_search(&(id as u32)).is_ok() { stop_ok } else { !stop_only && bit(id) };
            match (a, kept) {
                (true, Some(e)) => out.push(e),
                (true, None) => {}
                (false, _) => out.push((id as u32, f32::NEG_INFINITY)),
            }
        }
        out
    }

    /// The row's scan, checked: a NaN or no finite maximum is an error.
    fn checked_scan(row: &Row, n_top: usize) -> Result<row::Scan> {
        if row.len() == 0 {
            bail!(Shape, "sampling an empty logits row");
        }
        let s = row::scan(row, n_top);
        if s.nan {
            bail!(Input, "the logits row holds NaN");
        }
        if !s.max.is_finite() {
            bail!(Input, "the logits row has no finite maximum (largest value {})", s.max);
        }
        Ok(s)
    }

    /// Steps 5 of the module docs: the distribution after temperature and truncation.
    fn dist(&self, row: &Row, scan: &row::Scan) -> Dist {
        let p = &self.params;
        if p.temperature == 0.0 {
            return Dist::One(scan.argmax as u32);
        }
        let (t, n) = (p.temperature, row.len());
        let ms = scan.max / t;
        let w = |v: f32| row::weight(v, t, ms);
        // Candidates by `desc` (largest first); `None`: the whole row.
        let mut cand: Option<Vec<(u32, f32)>> = p.top_k.filter(|&k| k < n).map(|k| row::top_k(row, k));
        if let Some(tp) = p.top_p.filter(|&tp| tp < 1.0) {
            let tp = tp as f64;
            cand = Some(match cand {
                Some(mut c) => {
                    let z: f64 = c.iter().map(|e| w(e.1)).sum();
                    c.truncate(prefix(&c, z, tp, &w).unwrap_or(c.len()));
                    c
                }
                None => {
                    let z = row::sum_exp(row, t, ms);
                    // Tokens below c·z carry less than n·c·z of mass: at c = (1 − p)/n the
                    // candidates provably reach p; try a much smaller candidate set first.
                    // Candidates above a threshold are a prefix of the sorted row, so a
                    // prefix that reaches p among them is the exact answer.
                    let mut kept = Vec::new();
                    for c in [(1.0 - tp) / 64.0, (1.0 - tp) / n as f64, 0.0] {
                        let x_min = if c > 0.0 { (c * z).ln() - 1e-9 } else { f64::NEG_INFINITY };
                        match row::nucleus(row::gather(row, t, ms, x_min), z, tp, w) {
                            Ok(k) => {
                                kept = k;
                                break;
                            }
                            // Rounding kept the whole row below p: everything stays.
                            Err(all) => kept = all,
                        }
                    }
                    kept
                }
            });
        }
        if let Some(mp) = p.min_p.filter(|&m| m > 0.0) {
            let mp = mp as f64;
            cand = Some(match cand {
                Some(c) => c.into_iter().filter(|e| w(e.1) >= mp).collect(),
                None => row::gather(row, t, ms, mp.ln() - 1e-9).into_iter().filter(|e| w(e.1) >= mp).collect(),
            });
        }
        let Some(mut c) = cand else {
            return Dist::Full { t, ms, z: row::sum_exp(row, t, ms) };
        };
        if c.is_empty() {
            return Dist::One(scan.argmax as u32);
        }
        let total: f64 = c.iter().map(|e| w(e.1)).sum();
        c.sort_unstable_by_key(|e| e.0);
        let kept: Vec<(u32, f32)> =
            c.into_iter().map(|(i, v)| (i, (w(v) / total) as f32)).filter(|e| e.1 > 0.0).collect();
        match kept.as_slice() {
            [] => Dist::One(scan.argmax as u32),
            [(i, _)] => Dist::One(*i),
            _ => Dist::Kept(kept),
        }
    }

    /// The final distribution over the `logits.len()` tokens at output position `out_len`
    /// (one-hot when greedy), for rejection sampling. `eos`: the model's end ids (masked
    /// while `out_len < min_tokens`). Errors on an empty row, NaN, or no finite logit.
    pub fn probs(&self, logits: &[f32], out_len: usize, eos: &[u32]) -> Result<Vec<f32>> {
        let ov = self.overrides(logits, out_len, eos);
        let row = Row { raw: logits, ov: &ov };
        let scan = Self::checked_scan(&row, 0)?;
        let mut out = vec![0.0f32; logits.len()];
        match self.dist(&row, &scan) {
            Dist::One(i) => out[i as usize] = 1.0,
            Dist::Kept(k) => k.into_iter().for_each(|(i, p)| out[i as usize] = p),
            Dist::Full { t, ms, z } => row.each(|i, v| out[i] = (row::weight(v, t, ms) / z) as f32),
        }
        Ok(out)
    }

    /// Samples one token from a row of logits at output position `out_len` (tokens generated
    /// so far), `eos` being the model's end ids. Does not record the token: call
    /// [`SeqSampler::accept`]. Errors on an empty row, NaN, or no finite logit.
    pub fn sample(&mut self, logits: &[f32], out_len: usize, eos: &[u32]) -> Result<Sampled> {
        let ov = self.overrides(logits, out_len, eos);
        let row = Row { raw: logits, ov: &ov };
        let n_top = self.params.logprobs.unwrap_or(0);
        let scan = Self::checked_scan(&row, n_top)?;
        let token = match self.dist(&row, &scan) {
            Dist::One(i) => i,
            Dist::Kept(k) => {
                let u = self.uniform();
                draw(u, k.iter().copied())
            }
            Dist::Full { t, ms, z } => {
                let u = self.uniform();
                let (mut acc, mut last, mut hit) = (0.0f64, 0u32, None);
                // Early exit is not available through `each`; walk until the draw is passed.
                row.each(|i, v| {
                    if hit.is_some() {
                        return;
                    }
                    let p = (row::weight(v, t, ms) / z) as f32;
                    if p > 0.0 {
                        acc += p as f64;
                        last = i as u32;
                        if u < acc {
                            hit = Some(i as u32);
                        }
                    }
                });
                hit.unwrap_or(last)
            }
        };
        let (logprob, top) = self.report(&row, &scan, token);
        Ok(Sampled { token, logprob, top })
    }

    /// The chosen token's log-probability and the top alternatives (when the request asks
    /// for log-probabilities), as [`SeqSampler::sample`] reports them.
    fn report(&self, row: &Row, scan: &row::Scan, token: u32) -> (Option<f32>, Vec<(u32, f32)>) {
        if self.params.logprobs.is_none() {
            return (None, Vec::new());
        }
        let lse = scan.max as f64 + row::sum_exp(row, 1.0, scan.max).ln();
        let lp = |v: f32| (v as f64 - lse) as f32;
        let chosen = row.get(token as usize);
        (Some(lp(chosen)), scan.top.iter().map(|&(i, v)| (i, lp(v))).collect())
    }

    /// What [`SeqSampler::sample`] would report for `token` chosen another way (a draft token
    /// accepted by speculative verification, or a token drawn from the residual).
    pub fn report_for(&self, logits: &[f32], out_len: usize, eos: &[u32], token: u32) -> Result<Sampled> {
        let ov = self.overrides(logits, out_len, eos);
        let row = Row { raw: logits, ov: &ov };
        let scan = Self::checked_scan(&row, self.params.logprobs.unwrap_or(0))?;
        let (logprob, top) = self.report(&row, &scan, token);
        Ok(Sampled { token, logprob, top })
    }

    /// A prompt token's report: the log-probability of `token` under the raw `logits`
    /// (log-softmax, no penalty, bias, mask or temperature), its rank and the top `n_top`.
    pub fn raw_report(logits: &[f32], token: u32, n_top: usize) -> Result<crate::engine::PromptToken> {
        let row = Row { raw: logits, ov: &[] };
        let scan = Self::checked_scan(&row, n_top)?;
        let lse = scan.max as f64 + row::sum_exp(&row, 1.0, scan.max).ln();
        let lp = |v: f32| (v as f64 - lse) as f32;
        let top = scan.top.iter().map(|&(i, v)| (i, lp(v))).collect();
        let v = row.get(token as usize);
        let rank = 1 + logits.iter().filter(|&&x| x > v).count() as u32;
        Ok(crate::engine::PromptToken { id: token, logprob: lp(v), rank, top })
    }

    /// Draws from an explicit distribution (the argmax when at most one entry is positive,
    /// without a draw).
    pub fn sample_from(&mut self, p: &[f32]) -> u32 {
        let nonzero = p.iter().filter(|&&v| v > 0.0).count();
        if nonzero <= 1 {
            return super::argmax(p) as u32;
        }
        let u = self.uniform();
        draw(u, p.iter().enumerate().map(|(i, &v)| (i as u32, v)))
    }

    /// The device sampler's row parameters (temperature, top_k, top_p, u; see
    /// `backend::cuda::blocks::sample_rows`) for the token at output position `out_len`, when
    /// this request needs nothing else (no logit bias, penalties, min-p, masks or logprobs); `None`
    /// otherwise. Draws the uniform `u` from this request's stream (not for greedy), so call it
    /// only for a row that is then sampled on the device. Whether a request takes this path
    /// depends on its own parameters and `out_len` only, never on its batch mates.
    pub fn device_params(&mut self, out_len: usize, vocab: usize) -> Option<[f32; 4]> {
        if !self.params.device_compatible(out_len) {
            return None;
        }
        let u = if self.params.temperature == 0.0 { 0.0 } else { self.uniform() as f32 };
        let p = &self.params;
        let top_k = p.top_k.unwrap_or(0).min(vocab) as f32;
        Some([p.temperature, top_k, p.top_p.unwrap_or(1.0), u])
    }

    /// Whether the token at output position `out_len` is the plain argmax of device logits:
    /// greedy (temperature 0) with nothing the device sampler lacks (no logit bias, penalties,
    /// min-p, masks or logprobs), and `logits` on a CUDA device. Speculative decoding then takes
    /// its argmaxes on the device and compares ids, which decides exactly what the
    /// distributions would (a greedy target distribution is one-hot at its argmax).
    pub fn greedy_on_device(&self, logits: &crate::tensor::Tensor, out_len: usize) -> bool {
        matches!(logits.storage(), crate::tensor::Storage::Cuda(_)) && self.greedy_plain(out_len)
    }

    /// Whether the token at output position `out_len` is the plain argmax of the raw logits
    /// (wherever they are): greedy with nothing that changes a row (no logit bias,
    /// penalties, min-p, masks or logprobs). Its distribution is one-hot at that argmax.
    pub fn greedy_plain(&self, out_len: usize) -> bool {
        self.params.temperature == 0.0 && self.params.device_compatible(out_len)
    }

    /// Samples row `row` of a logits tensor at output position `out_len`: on a CUDA device
    /// with the device sampler when the request needs only temperature / top-k / top-p (only
    /// the id comes back; the uniform draw comes from this stream, so a seed reproduces a
    /// run), otherwise on the host with [`SeqSampler::sample`]. Does not record the token.
    pub fn sample_tensor(
        &mut self,
        logits: &crate::tensor::Tensor,
        row: usize,
        out_len: usize,
        eos: &[u32],
    ) -> Result<u32> {
        if row >= logits.rows() {
            bail!(Shape, "sampling row {row} of {} logit rows", logits.rows());
        }
        if let crate::tensor::Storage::Cpu(_) = logits.storage() {
            let (v, d) = (logits.host_f32()?, logits.last_dim());
            return Ok(self.sample(&v[row * d..(row + 1) * d], out_len, eos)?.token);
        }
        if !self.params.device_compatible(out_len) {
            // Penalties, min-p, masks or logprobs: the row comes to the host.
            let host = logits.narrow_rows(row, 1)?.to_host()?;
            let v = host.host_f32()?;
            return Ok(self.sample(&v, out_len, eos)?.token);
        }
        let params = self
            .device_params(out_len, logits.last_dim())
            .ok_or_else(|| err!(Internal, "device sampling of a request that needs the host"))?;
        let one = logits.narrow_rows(row, 1)?;
        let ids = crate::backend::cuda::blocks::sample_rows(&one, &[params])?;
        ids.first().copied().ok_or_else(|| err!(Internal, "the device sampler returned no id"))
    }
}

/// The first id whose cumulative probability (in the given order) exceeds `u`; the last
/// positive one when rounding leaves `u` above the total.
fn draw(u: f64, items: impl Iterator<Item = (u32, f32)>) -> u32 {
    let (mut acc, mut last) = (0.0f64, 0u32);
    for (i, v) in items {
        if v > 0.0 {
            acc += v as f64;
            last = i;
            if u < acc {
                return i;
            }
        }
    }
    last
}

/// Length of the shortest prefix of `c` (sorted largest first) whose mass `Σ w / z` reaches
/// `tp` (at least one entry); `None` when all of `c` does not reach it.
fn prefix(c: &[(u32, f32)], z: f64, tp: f64, w: &impl Fn(f32) -> f64) -> Option<usize> {
    let mut acc = 0.0;
    for (i, e) in c.iter().enumerate() {
        acc += w(e.1) / z;
        if acc >= tp {
            return Some(i + 1);
        }
    }
    None
}

/// A seed from the process's random hasher keys (no seed given).
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x5EED);
    h.finish()
}

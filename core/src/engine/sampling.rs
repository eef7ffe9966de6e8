//! Token sampling: greedy at temperature 0, otherwise temperature → top-k → top-p
//! (the order of HF's logits warpers), with a seeded PRNG.

use crate::bail;
use crate::error::Result;

/// Sampling parameters of one request.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self { temperature: 0.0, top_k: None, top_p: None, seed: 0 }
    }
}

impl SamplingParams {
    /// Rejects out-of-range values with a message naming the parameter.
    pub fn validate(&self) -> Result<()> {
        if self.temperature.is_nan() || self.temperature < 0.0 || !self.temperature.is_finite() {
            bail!(Input, "`temperature` must be a finite number >= 0, got {}", self.temperature);
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                bail!(Input, "`top_p` must be in (0, 1], got {p}");
            }
        }
        if self.top_k == Some(0) {
            bail!(Input, "`top_k` must be >= 1");
        }
        Ok(())
    }
}

/// A seeded sampler (SplitMix64).
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    state: u64,
}

/// Index of the largest value; the first one on ties (as `torch.argmax`).
pub fn argmax(xs: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in xs.iter().enumerate() {
        if v > xs[best] {
            best = i;
        }
    }
    best
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        let state = params.seed ^ 0x9E37_79B9_7F4A_7C15;
        Ok(Self { params, state })
    }

    fn next_f64(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The filtered, normalised distribution the sampler draws from (all zeros but one
    /// entry when greedy).
    pub fn distribution(&self, logits: &[f32]) -> Vec<f32> {
        let n = logits.len();
        let mut p = vec![0.0f32; n];
        if self.params.temperature == 0.0 {
            p[argmax(logits)] = 1.0;
            return p;
        }
        let t = self.params.temperature;
        let mut idx: Vec<usize> = (0..n).collect();
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        let k = self.params.top_k.unwrap_or(n).min(n);
        let kept = &idx[..k];
        let max = logits[kept[0]] / t;
        let mut probs: Vec<f64> = kept.iter().map(|&i| ((logits[i] / t - max) as f64).exp()).collect();
        let sum: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|v| *v /= sum);
        let mut keep = k;
        if let Some(tp) = self.params.top_p {
            // Keep the smallest prefix whose mass reaches top_p (at least one token).
            let mut acc = 0.0;
            for (i, v) in probs.iter().enumerate() {
                acc += v;
                if acc >= tp as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        let mass: f64 = probs[..keep].iter().sum();
        for (j, &i) in kept[..keep].iter().enumerate() {
            p[i] = (probs[j] / mass) as f32;
        }
        p
    }

    /// A uniform draw in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        self.next_f64()
    }

    /// Draws from an explicit distribution (greedy when it is one-hot).
    pub fn sample_from(&mut self, p: &[f32]) -> u32 {
        let nonzero = p.iter().filter(|&&v| v > 0.0).count();
        if nonzero <= 1 {
            return argmax(p) as u32;
        }
        let u = self.next_f64();
        let mut acc = 0.0f64;
        let mut last = 0;
        for (i, &v) in p.iter().enumerate() {
            if v > 0.0 {
                acc += v as f64;
                last = i;
                if u < acc {
                    return i as u32;
                }
            }
        }
        last as u32
    }

    /// Draws one token id from row `row` of a logits tensor: on the CPU as
    /// [`Sampler::sample`], on a CUDA device with the device sampler (only the id comes back;
    /// the uniform draw comes from this sampler's stream, so a seed reproduces a run).
    pub fn sample_tensor(&mut self, logits: &crate::tensor::Tensor, row: usize) -> Result<u32> {
        if let crate::tensor::Storage::Cpu(_) = logits.storage() {
            let (v, d) = (logits.host_f32()?, logits.last_dim());
            if row >= logits.rows() {
                crate::bail!(Shape, "sampling row {row} of {} logit rows", logits.rows());
            }
            return Ok(self.sample(&v[row * d..(row + 1) * d]));
        }
        let u = if self.params.temperature == 0.0 { 0.0 } else { self.next_f64() as f32 };
        let p = &self.params;
        let top_k = p.top_k.unwrap_or(0).min(logits.last_dim()) as f32;
        let params = [p.temperature, top_k, p.top_p.unwrap_or(1.0), u];
        let one = logits.narrow_rows(row, 1)?;
        let ids = crate::backend::cuda::blocks::sample_rows(&one, &[params])?;
        ids.first().copied().ok_or_else(|| crate::err!(Internal, "the device sampler returned no id"))
    }

    /// Draws one token id.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.temperature == 0.0 {
            return argmax(logits) as u32;
        }
        let p = self.distribution(logits);
        self.sample_from(&p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_argmax_first_on_ties() {
        let mut s = Sampler::new(SamplingParams::default()).unwrap();
        assert_eq!(s.sample(&[0.1, 2.0, 2.0, -1.0]), 1);
    }

    #[test]
    fn top_k_one_is_greedy_and_seed_is_deterministic() {
        let p = SamplingParams { temperature: 0.8, top_k: Some(1), top_p: None, seed: 7 };
        let mut s = Sampler::new(p).unwrap();
        assert_eq!(s.sample(&[0.1, 2.0, 1.9]), 1);
        let q = SamplingParams { temperature: 1.0, top_k: None, top_p: Some(0.9), seed: 3 };
        let a: Vec<u32> = {
            let mut s = Sampler::new(q.clone()).unwrap();
            (0..20).map(|_| s.sample(&[0.0, 0.5, 1.0, 0.2])).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(q).unwrap();
            (0..20).map(|_| s.sample(&[0.0, 0.5, 1.0, 0.2])).collect()
        };
        assert_eq!(a, b);
    }

    #[test]
    fn top_p_truncates_and_sampling_frequencies_match() {
        let q = SamplingParams { temperature: 1.0, top_k: None, top_p: Some(0.5), seed: 1 };
        let s = Sampler::new(q).unwrap();
        let d = s.distribution(&[0.0, (3.0f32).ln(), -10.0]);
        // p = [0.25, 0.75, ~0] → top_p 0.5 keeps only the 0.75 token.
        assert_eq!(d, vec![0.0, 1.0, 0.0]);
        let q = SamplingParams { temperature: 1.0, top_k: None, top_p: None, seed: 5 };
        let mut s = Sampler::new(q).unwrap();
        let n = 20000;
        let hits = (0..n).filter(|_| s.sample(&[0.0, (3.0f32).ln()]) == 1).count();
        let f = hits as f64 / n as f64;
        assert!((f - 0.75).abs() < 0.02, "frequency {f}");
    }

    #[test]
    fn bad_params_are_rejected() {
        assert!(Sampler::new(SamplingParams { temperature: -1.0, ..Default::default() }).is_err());
        assert!(Sampler::new(SamplingParams { top_p: Some(0.0), ..Default::default() }).is_err());
        assert!(Sampler::new(SamplingParams { top_k: Some(0), ..Default::default() }).is_err());
    }
}

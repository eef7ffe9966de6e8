//! Rotary position embedding.

use super::*;

/// How rotary frequencies are scaled.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    Default,
    /// Positions divided by `factor` (HF `rope_type: linear`).
    Linear { factor: f32 },
    /// YaRN (HF `rope_type: yarn`): per-frequency blend of interpolation and extrapolation,
    /// cos/sin scaled by `attention_factor`.
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        attention_factor: f64,
        truncate: bool,
    },
    /// Llama 3.1 (HF `rope_type: llama3`, `_compute_llama3_parameters`): low frequencies
    /// divided by `factor`, high ones kept, a smooth blend in between.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: f64 },
    /// Dynamic NTK (HF `rope_type: dynamic`, `_compute_dynamic_ntk_parameters` under
    /// `dynamic_rope_update`): the base grows with `factor` only once a forward reaches past
    /// `max_position_embeddings`; up to there the frequencies are plain RoPE's. porter never
    /// runs such a forward ([`crate::Model`] refuses a sequence longer than
    /// `max_position_embeddings`), so this is plain RoPE on every position it accepts.
    Dynamic { factor: f64 },
    /// Proportional RoPE (HF `rope_type: proportional`, `_compute_proportional_rope_parameters`):
    /// the table spans the whole head (`head_dim / 2` frequencies, pairs `d ↔ d + head_dim/2`),
    /// the first `floor(partial_rotary_factor · head_dim / 2)` are `1/θ^(2i/head_dim)` and the
    /// rest 0 (those pairs pass through), all divided by `factor`.
    Proportional { factor: f32 },
}

/// Rotary-embedding parameters of a model.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeParams {
    pub theta: f32,
    /// f64 as in the config: transformers takes `int(head_dim · partial_rotary_factor)` of
    /// the Python float product, which an f32 product can round across an integer.
    pub partial_rotary_factor: f64,
    pub scaling: RopeScaling,
}

/// Rotary position embedding (NeoX half pairing), full or partial.
///
/// # Shapes
/// `inv_freq`: `[rot_dim / 2]` f32, on the model's device
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Tensor,
    rot_dim: usize,
    head_dim: usize,
    /// Scale applied to cos / sin (YaRN's attention factor; 1 otherwise).
    attention_scaling: f32,
}

impl Rope {
    /// The rotary dims follow transformers: `dim = int(head_dim · partial_rotary_factor)`
    /// frequencies `1 / theta^(2i / dim)` for `i < ceil(dim / 2)`, and the rotation covers the
    /// table's width, `rot_dim = 2 · ceil(dim / 2)` ([`rotary_dims`]).
    ///
    /// The inverse frequencies follow transformers' `ROPE_INIT_FUNCTIONS` in f32: plain,
    /// `linear`, `yarn`, `llama3` (`_compute_llama3_parameters`) and `dynamic` (plain within
    /// `max_position_embeddings`, see [`RopeScaling::Dynamic`]).
    pub fn new(params: &RopeParams, head_dim: usize) -> Result<Self> {
        // Config values reach here checked by `load::config`; these are the block's own
        // invariants (a shape error, naming the config key that sets them).
        if !(params.theta.is_finite() && params.theta > 0.0) {
            bail!(Shape, "RoPE: rope_theta {} must be a positive finite number", params.theta);
        }
        let (dim, rot_dim) = rotary_dims(head_dim, params)?;
        // HF: inv_freq = 1 / base^(arange(0, dim, 2) / dim), in f32.
        let mut inv_freq: Vec<f32> =
            (0..rot_dim / 2).map(|i| 1.0f32 / params.theta.powf((2 * i) as f32 / dim as f32)).collect();
        if let RopeScaling::Proportional { factor } = params.scaling {
            // HF: `int(p * head_dim // 2)` rotated angles (exponents over head_dim, which is dim
            // here), zeros after them, then `inv_freq /= factor`.
            let angles = (params.partial_rotary_factor * head_dim as f64 / 2.0).floor() as usize;
            for (i, f) in inv_freq.iter_mut().enumerate() {
                *f = if i < angles { *f / factor } else { 0.0 };
            }
        }
        let mut attention_scaling = 1.0f32;
        match params.scaling {
            // Dynamic: plain RoPE up to max_position_embeddings, the only positions porter runs.
            RopeScaling::Default | RopeScaling::Dynamic { .. } | RopeScaling::Proportional { .. } => {}
            RopeScaling::Linear { factor } => inv_freq.iter_mut().for_each(|f| *f /= factor),
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate,
            } => {
                // HF `_compute_yarn_parameters` (`rotary_dims` checked that dim is even).
                let (dim, base) = (dim as f64, params.theta as f64);
                let corr = |rot: f64| {
                    dim * (original_max_position_embeddings / (rot * 2.0 * std::f64::consts::PI)).ln()
                        / (2.0 * base.ln())
                };
                let (mut low, mut high) = (corr(beta_fast), corr(beta_slow));
                if truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let low = low.max(0.0);
                let mut high = high.min(dim - 1.0);
                if low == high {
                    high += 0.001;
                }
                for (i, f) in inv_freq.iter_mut().enumerate() {
                    let pos_freq = (params.theta).powf((2 * i) as f32 / dim as f32);
                    let extrapolation = 1.0 / pos_freq;
                    let interpolation = 1.0 / (factor as f32 * pos_freq);
                    let ramp = (((i as f64 - low) / (high - low)).clamp(0.0, 1.0)) as f32;
                    let extra_factor = 1.0 - ramp;
                    *f = interpolation * (1.0 - extra_factor) + extrapolation * extra_factor;
                }
                attention_scaling = attention_factor as f32;
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => {
                // HF `_compute_llama3_parameters`: tensor ops in f32, Python scalars cast to f32.
                let (factor, low) = (factor as f32, low_freq_factor as f32);
                let low_freq_wavelen = (old / low_freq_factor) as f32;
                let high_freq_wavelen = (old / high_freq_factor) as f32;
                let two_pi = (2.0 * std::f64::consts::PI) as f32;
                let span = (high_freq_factor - low_freq_factor) as f32;
                for f in inv_freq.iter_mut() {
                    let wavelen = two_pi / *f;
                    let scaled = if wavelen > low_freq_wavelen { *f / factor } else { *f };
                    let smooth = (old as f32 / wavelen - low) / span;
                    let smoothed = (1.0 - smooth) * scaled / factor + smooth * scaled;
                    // `~(wavelen < high) * ~(wavelen > low)`; wavelen is never NaN (inv_freq > 0 or inf).
                    let medium = wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen;
                    *f = if medium { smoothed } else { scaled };
                }
            }
        }
        let n = inv_freq.len();
        Ok(Self { inv_freq: Tensor::from_vec(inv_freq, [n], DType::F32)?, rot_dim, head_dim, attention_scaling })
    }

    pub fn rot_dim(&self) -> usize {
        self.rot_dim
    }

    pub fn attention_scaling(&self) -> f32 {
        self.attention_scaling
    }

    /// This RoPE with its frequency table on `device`.
    pub fn to_device(self, device: crate::tensor::Device) -> Result<Self> {
        Ok(Self { inv_freq: self.inv_freq.into_device(device)?, ..self })
    }

    /// The inverse frequencies (host values).
    pub fn inv_freq(&self) -> Result<Vec<f32>> {
        self.inv_freq.host_vec()
    }

    /// cos / sin tables for the given positions, rounded to `dtype` like HF.
    ///
    /// # Shapes
    /// returns two `[positions.len(), rot_dim / 2]` tables
    pub fn tables(&self, positions: &[usize], dtype: DType) -> Result<(Vec<f32>, Vec<f32>)> {
        Ok(crate::backend::cpu::rope_tables(&self.inv_freq()?, positions, self.attention_scaling, dtype))
    }

    /// The head width this rotation is for.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// The backend's arguments of this rotation.
    pub fn args(&self) -> RopeArgs<'_> {
        RopeArgs {
            inv_freq: &self.inv_freq,
            rot_dim: self.rot_dim,
            head_dim: self.head_dim,
            scaling: self.attention_scaling,
        }
    }

    /// Rotates `x: [T, heads, head_dim]` in place at the batch's positions.
    pub fn forward(&self, x: &mut Tensor, batch: &Batch) -> Result<()> {
        if x.shape().len() != 3 || x.dim(2) != self.head_dim {
            bail!(Shape, "rope: expected [T, heads, {}], got {:?}", self.head_dim, x.shape());
        }
        ops(x).rope(x, &self.args(), batch)
    }
}

/// `(dim, rot_dim)` of a head: transformers' `dim = int(head_dim · partial_rotary_factor)`
/// (the denominator of the frequency exponents; `ceil(dim / 2)` frequencies) and the rotated
/// width `rot_dim = 2 · ceil(dim / 2)` (NeoX pairs `d ↔ d + rot_dim / 2`). An odd `dim`
/// rotates one dim more than `dim`, as transformers' `apply_rotary_pos_emb` does.
///
/// # Errors
/// [`Error::Shape`](crate::error::Error::Shape) naming `partial_rotary_factor` when `dim` is 0 or the rotated width
/// exceeds `head_dim` (an odd head rotated whole), or `yarn` with an odd `dim` (transformers'
/// ramp has `dim / 2` entries against `ceil(dim / 2)` frequencies and fails).
pub fn rotary_dims(head_dim: usize, params: &RopeParams) -> Result<(usize, usize)> {
    let partial = params.partial_rotary_factor;
    if matches!(params.scaling, RopeScaling::Proportional { .. }) {
        // The table spans the whole head whatever the factor (0 rotates nothing).
        if !(0.0..=1.0).contains(&partial) || head_dim % 2 == 1 || head_dim == 0 {
            bail!(
                Shape,
                "RoPE: proportional needs an even head_dim and partial_rotary_factor in [0, 1]; \
                 got head_dim {head_dim}, partial_rotary_factor {partial}"
            );
        }
        return Ok((head_dim, head_dim));
    }
    if !(partial > 0.0 && partial <= 1.0) {
        bail!(Shape, "RoPE: partial_rotary_factor {partial} must be in (0, 1]");
    }
    let dim = (head_dim as f64 * partial) as usize;
    let rot_dim = 2 * dim.div_ceil(2);
    if dim == 0 || rot_dim > head_dim {
        bail!(
            Shape,
            "RoPE: head_dim {head_dim} × partial_rotary_factor {partial} gives a rotary dim of {dim} \
             (rotating {rot_dim} dims; must be at least 1 and rotate at most head_dim)"
        );
    }
    if dim % 2 == 1 && matches!(params.scaling, RopeScaling::Yarn { .. }) {
        bail!(
            Shape,
            "RoPE: yarn needs an even rotary dim; head_dim {head_dim} × partial_rotary_factor {partial} gives {dim}"
        );
    }
    Ok((dim, rot_dim))
}

#[cfg(test)]
#[path = "rope_tests.rs"]
mod tests;

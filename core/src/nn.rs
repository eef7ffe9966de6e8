//! Shared building blocks: linear layers, the RMSNorm variants, RoPE, GQA attention,
//! SwiGLU and sparse MoE, plus the embedding pre-layer and the norm + lm_head post-layer.
//!
//! Each block lives here once; model crates compose them. Rounding follows the HF
//! reference: on a bf16 model every op's output is rounded to bf16 while reductions
//! (norms, softmax, GEMM accumulation) run in f32.

use crate::cache::LayerCache;
use crate::config::{RopeParams, RopeScaling};
use crate::dtype::DType;
use crate::layers::{Batch, PostLayer, PreLayer};
use crate::tensor::Tensor;
use anyhow::{bail, Result};
use porter_kernels::cpu::ops;
use rayon::prelude::*;

/// `y = x·Wᵀ + b`.
///
/// # Shapes
/// - `w`: `[out, in]`, `b`: `[out]`
/// - input `[.., in]` → output `[.., out]`
#[derive(Debug, Clone)]
pub struct Linear {
    pub w: Tensor,
    pub b: Option<Tensor>,
}

impl Linear {
    pub fn new(w: Tensor, b: Option<Tensor>) -> Self {
        Self { w, b }
    }

    pub fn out_features(&self) -> usize {
        self.w.dim(0)
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut y = x.matmul_t(&self.w)?;
        if y.is_cuda() {
            if let Some(b) = &self.b {
                crate::gpu_blocks::add_bias(&mut y, b)?;
            }
            return Ok(y);
        }
        if let Some(b) = &self.b {
            let n = b.elem_count();
            let dt = y.dtype();
            let bd = b.data();
            ops::for_each_row(y.data_mut(), n, |_, r| {
                for (v, bb) in r.iter_mut().zip(bd) {
                    *v = dt.round(*v + bb);
                }
            });
        }
        Ok(y)
    }
}

/// Which RMSNorm formula a norm uses (models.md §3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormKind {
    /// Llama style: `w · round(x·rsqrt(mean(x²)+eps))` (Qwen3, Qwen3-MoE, Mistral).
    Standard,
    /// Zero-centred: `x·rsqrt(mean(x²)+eps)·(1+w)`, all f32, one rounding (Qwen3-Next).
    ZeroCentred,
}

/// RMSNorm over the last dimension (or over each head when applied to `[T, heads, d]`).
///
/// # Shapes
/// - `w`: `[d]`; input `[.., d]` → output `[.., d]`
#[derive(Debug, Clone)]
pub struct RmsNorm {
    /// The effective multiplier (`1 + w` in f32 for zero-centred norms).
    scale: Vec<f32>,
    eps: f32,
    kind: NormKind,
    /// Output dtype (the model's compute dtype; the input may be the f32 residual stream).
    dtype: DType,
    /// The weight as stored (`w`, not `1 + w`) on the device, for CUDA inputs.
    w_dev: Option<Tensor>,
}

impl RmsNorm {
    /// A norm with weight `w` (on the CPU or a CUDA device).
    pub fn new(w: Tensor, eps: f32, kind: NormKind) -> Self {
        let dtype = w.dtype();
        // (A failed device copy leaves `w_dev` empty: the forward then reports it.)
        let w_dev = if w.is_cuda() { w.try_clone().ok() } else { None };
        let scale = match kind {
            NormKind::Standard => w.into_vec(),
            NormKind::ZeroCentred => w.into_vec().into_iter().map(|v| 1.0 + v).collect(),
        };
        Self { scale, eps, kind, dtype, w_dev }
    }

    pub fn dim(&self) -> usize {
        self.scale.len()
    }

    pub fn kind(&self) -> NormKind {
        self.kind
    }

    /// The output dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The weight on the device (CUDA models).
    pub fn device_weight(&self) -> Option<&Tensor> {
        self.w_dev.as_ref()
    }

    pub fn eps(&self) -> f32 {
        self.eps
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.is_cuda() {
            let w =
                self.w_dev.as_ref().ok_or_else(|| anyhow::anyhow!("internal: RMSNorm weight is not on the device"))?;
            return crate::gpu_blocks::rms_norm(self, w, x);
        }
        let d = self.scale.len();
        if d == 0 || !x.elem_count().is_multiple_of(d) {
            bail!("rms_norm: input {:?} is not a multiple of the norm width {d}", x.shape());
        }
        let mut y = x.clone().to_dtype(DType::F32);
        let dt = self.dtype;
        let (scale, eps, kind) = (&self.scale, self.eps, self.kind);
        ops::for_each_row(y.data_mut(), d, |_, r| {
            let inv = ops::rms_inv(r, eps);
            match kind {
                NormKind::Standard => {
                    for (v, w) in r.iter_mut().zip(scale) {
                        *v = dt.round(w * dt.round(*v * inv));
                    }
                }
                NormKind::ZeroCentred => {
                    for (v, w) in r.iter_mut().zip(scale) {
                        *v = dt.round(*v * inv * w);
                    }
                }
            }
        });
        Ok(y.to_dtype(dt))
    }
}

/// Rotary position embedding (NeoX half pairing), full or partial.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    rot_dim: usize,
    head_dim: usize,
    /// Scale applied to cos / sin (YaRN's attention factor; 1 otherwise).
    attention_scaling: f32,
    /// `inv_freq` on the device (uploaded at first CUDA use).
    inv_freq_dev: std::sync::OnceLock<cudarc::driver::CudaSlice<f32>>,
}

impl Rope {
    /// `rot_dim = head_dim · partial_rotary_factor` (rounded down to an even number).
    pub fn new(params: &RopeParams, head_dim: usize) -> Result<Self> {
        let rot_dim = ((head_dim as f32 * params.partial_rotary_factor) as usize) & !1;
        if rot_dim == 0 || rot_dim > head_dim {
            bail!("rotary dim {rot_dim} invalid for head_dim {head_dim}");
        }
        // HF: inv_freq = 1 / base^(arange(0, dim, 2) / dim), in f32.
        let mut inv_freq: Vec<f32> =
            (0..rot_dim / 2).map(|i| 1.0f32 / params.theta.powf((2 * i) as f32 / rot_dim as f32)).collect();
        let mut attention_scaling = 1.0f32;
        match params.scaling {
            RopeScaling::Default => {}
            RopeScaling::Linear { factor } => inv_freq.iter_mut().for_each(|f| *f /= factor),
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate,
            } => {
                // HF `_compute_yarn_parameters`.
                let (dim, base) = (rot_dim as f64, params.theta as f64);
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
                    let pos_freq = (params.theta).powf((2 * i) as f32 / rot_dim as f32);
                    let extrapolation = 1.0 / pos_freq;
                    let interpolation = 1.0 / (factor as f32 * pos_freq);
                    let ramp = (((i as f64 - low) / (high - low)).clamp(0.0, 1.0)) as f32;
                    let extra_factor = 1.0 - ramp;
                    *f = interpolation * (1.0 - extra_factor) + extrapolation * extra_factor;
                }
                attention_scaling = attention_factor as f32;
            }
        }
        Ok(Self { inv_freq, rot_dim, head_dim, attention_scaling, inv_freq_dev: std::sync::OnceLock::new() })
    }

    pub fn rot_dim(&self) -> usize {
        self.rot_dim
    }

    pub fn attention_scaling(&self) -> f32 {
        self.attention_scaling
    }

    /// The inverse frequencies on `gpu` (uploaded once).
    pub fn inv_freq_on(&self, gpu: &crate::gpu::Gpu) -> Result<&cudarc::driver::CudaSlice<f32>> {
        if self.inv_freq_dev.get().is_none() {
            let d = crate::gpu::upload::<f32>(gpu, &self.inv_freq)?;
            let _ = self.inv_freq_dev.set(d);
        }
        self.inv_freq_dev.get().ok_or_else(|| anyhow::anyhow!("internal: RoPE table upload"))
    }

    /// cos / sin tables for the given positions, rounded to `dtype` like HF.
    ///
    /// # Shapes
    /// returns two `[positions.len(), rot_dim / 2]` tables
    pub fn tables(&self, positions: &[usize], dtype: DType) -> (Vec<f32>, Vec<f32>) {
        let half = self.rot_dim / 2;
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for f in &self.inv_freq {
                let a = p as f32 * f;
                cos.push(dtype.round(a.cos() * self.attention_scaling));
                sin.push(dtype.round(a.sin() * self.attention_scaling));
            }
        }
        (cos, sin)
    }

    /// Rotates `x` in place.
    ///
    /// # Shapes
    /// `x: [T, heads, head_dim]`, tables `[T, rot_dim/2]`
    pub fn apply(&self, x: &mut Tensor, cos: &[f32], sin: &[f32]) -> Result<()> {
        let t = x.dim(0);
        let heads = x.dim(1);
        if x.shape().len() != 3 || x.dim(2) != self.head_dim {
            bail!("rope: expected [T, heads, {}], got {:?}", self.head_dim, x.shape());
        }
        ops::rope_neox(x.data_mut(), cos, sin, t, heads, self.head_dim, self.rot_dim);
        x.round_();
        Ok(())
    }
}

/// Static description of an attention block.
#[derive(Debug, Clone)]
pub struct AttentionConfig {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Sliding-window length (a key is visible while `pos_q − pos_k < window`).
    pub window: Option<usize>,
    /// Qwen3-Next gated attention: `q_proj` yields `[q, gate]` per head and the output is
    /// multiplied by `sigmoid(gate)` before `o_proj`.
    pub output_gate: bool,
    pub scale: f32,
}

impl AttentionConfig {
    /// Plain GQA with scale `head_dim^-½` and no output gate.
    pub fn gqa(heads: usize, kv_heads: usize, head_dim: usize, window: Option<usize>) -> Self {
        Self { heads, kv_heads, head_dim, window, output_gate: false, scale: 1.0 / (head_dim as f32).sqrt() }
    }
}

/// Causal GQA self-attention with optional q/k norms, (partial) RoPE, sliding window and
/// output gate.
///
/// # Shapes
/// - `q_proj`: `[heads·head_dim·(1 + output_gate), hidden]`, `k_proj`/`v_proj`: `[kv_heads·head_dim, hidden]`
/// - `o_proj`: `[hidden, heads·head_dim]`
/// - input `[T, hidden]` → output `[T, hidden]`
#[derive(Debug, Clone)]
pub struct Attention {
    pub cfg: AttentionConfig,
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub o_proj: Linear,
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
    pub rope: Rope,
}

impl Attention {
    /// Checks the weight shapes against the config (at load time).
    pub fn check(&self) -> Result<()> {
        let c = &self.cfg;
        if c.kv_heads == 0 || !c.heads.is_multiple_of(c.kv_heads) {
            bail!("num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", c.heads, c.kv_heads);
        }
        let qrows = c.heads * c.head_dim * if c.output_gate { 2 } else { 1 };
        if self.q_proj.out_features() != qrows || self.k_proj.out_features() != c.kv_heads * c.head_dim {
            bail!("attention projections do not match heads/head_dim");
        }
        Ok(())
    }

    pub fn forward(&self, x: &Tensor, batch: &Batch, cache: &mut LayerCache) -> Result<Tensor> {
        if x.is_cuda() {
            return crate::gpu_blocks::attention(self, x, batch, cache);
        }
        let c = &self.cfg;
        let (t, hd) = (x.rows(), c.head_dim);
        let dt = x.dtype();
        let qg = self.q_proj.forward(x)?;
        // Split q and gate: [T, heads·hd·2] viewed per head as [q(hd), gate(hd)].
        let (q, gate) = if c.output_gate {
            let mut q = Vec::with_capacity(t * c.heads * hd);
            let mut g = Vec::with_capacity(t * c.heads * hd);
            for blk in qg.data().chunks(2 * hd) {
                q.extend_from_slice(&blk[..hd]);
                g.extend_from_slice(&blk[hd..]);
            }
            (Tensor::from_vec(q, [t, c.heads, hd], dt)?, Some(g))
        } else {
            (qg.reshape([t, c.heads, hd])?, None)
        };
        // [T, kv·hd] -> [T, kv, hd]
        let k = self.k_proj.forward(x)?.reshape([t, c.kv_heads, hd])?;
        let v = self.v_proj.forward(x)?;
        let mut q = match &self.q_norm {
            Some(n) => n.forward(&q)?,
            None => q,
        };
        let mut k = match &self.k_norm {
            Some(n) => n.forward(&k)?,
            None => k,
        };
        let (cos, sin) = self.rope.tables(&batch.positions(), dt);
        self.rope.apply(&mut q, &cos, &sin)?;
        self.rope.apply(&mut k, &cos, &sin)?;
        let LayerCache::Kv(kv) = cache else { bail!("attention layer was given a non-KV cache") };
        let row_q = c.heads * hd;
        let row_kv = c.kv_heads * hd;
        let mut out = vec![0.0f32; t * row_q];
        for s in &batch.spans {
            let (kc, vc) = kv.write(
                s.seq,
                s.pos0,
                &k.data()[s.start * row_kv..(s.start + s.len) * row_kv],
                &v.data()[s.start * row_kv..(s.start + s.len) * row_kv],
            )?;
            ops::causal_attention(
                &q.data()[s.start * row_q..(s.start + s.len) * row_q],
                kc,
                vc,
                &mut out[s.start * row_q..(s.start + s.len) * row_q],
                s.len,
                s.pos0,
                c.heads,
                c.kv_heads,
                hd,
                c.scale,
                c.window,
            );
        }
        dt.round_slice(&mut out);
        if let Some(g) = gate {
            for (o, gv) in out.iter_mut().zip(&g) {
                *o = dt.round(*o * dt.round(ops::sigmoid(*gv)));
            }
        }
        // [T, heads, hd] -> [T, heads·hd]
        let o = Tensor::from_vec(out, [t, row_q], dt)?;
        self.o_proj.forward(&o)
    }
}

/// `down(silu(gate(x)) · up(x))`.
///
/// # Shapes
/// - `gate`, `up`: `[inter, hidden]`, `down`: `[hidden, inter]`
/// - input `[T, hidden]` → output `[T, hidden]`
#[derive(Debug, Clone)]
pub struct SwiGlu {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
    /// On a CUDA device: `[gate; up]` stacked (`[2·inter, hidden]`), one GEMM for both.
    pub gate_up: Option<Tensor>,
}

impl SwiGlu {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.is_cuda() {
            return crate::gpu_blocks::swiglu(self, x);
        }
        let g = self.gate.forward(x)?;
        let mut u = self.up.forward(x)?;
        let dt = u.dtype();
        // Fused activation: one rounding of silu(g)·u.
        for (uv, gv) in u.data_mut().iter_mut().zip(g.data()) {
            *uv = dt.round(ops::silu(*gv) * *uv);
        }
        self.down.forward(&u)
    }
}

/// The shared expert of Qwen3-Next MoE blocks: `sigmoid(x·g) · SwiGLU(x)`.
#[derive(Debug, Clone)]
pub struct SharedExpert {
    pub mlp: SwiGlu,
    /// `[1, hidden]`
    pub gate: Linear,
}

/// Sparse mixture of experts: softmax router → top-k → optional renormalisation, experts
/// evaluated on the rows routed to them (grouped by expert), plus an optional shared expert.
///
/// # Shapes
/// - `router`: `[E, hidden]`
/// - `gate`, `up`: `[E, inter, hidden]`, `down`: `[E, hidden, inter]`
/// - input `[T, hidden]` → output `[T, hidden]`
#[derive(Debug, Clone)]
pub struct Moe {
    pub router: Linear,
    pub gate: Tensor,
    pub up: Tensor,
    pub down: Tensor,
    pub top_k: usize,
    pub norm_topk_prob: bool,
    pub shared: Option<SharedExpert>,
    /// On a CUDA device with a shared expert: `[router; shared gate; shared up; shared
    /// expert gate]` stacked (`[E + 2·I_s + 1, hidden]`), one f32-output GEMM for all four.
    pub stacked_in: Option<Tensor>,
}

impl Moe {
    pub fn check(&self) -> Result<()> {
        let e = self.router.out_features();
        if self.top_k == 0 || self.top_k > e {
            bail!("num_experts_per_tok = {} must be in 1..={e}", self.top_k);
        }
        if self.gate.dim(0) != e || self.up.dim(0) != e || self.down.dim(0) != e {
            bail!("expert count of the weights does not match the router ({e})");
        }
        Ok(())
    }

    /// Router: per row, the top-k `(expert, weight)` pairs.
    pub fn route(&self, x: &Tensor) -> Result<Vec<Vec<(usize, f32)>>> {
        // Router logits stay in f32 (no bf16 rounding of the scores that pick experts):
        // near-ties between experts are decided as the f32 model decides them.
        let logits = x.matmul_t_to(&self.router.w, DType::F32)?;
        let e = logits.last_dim();
        Ok((0..logits.rows())
            .map(|r| {
                let mut p = logits.row(r).to_vec();
                ops::softmax_inplace(&mut p);
                // top-k, ties by lower index first (torch.topk order on CPU).
                let mut idx: Vec<usize> = (0..e).collect();
                idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
                let mut sel: Vec<(usize, f32)> = idx[..self.top_k].iter().map(|&i| (i, p[i])).collect();
                if self.norm_topk_prob {
                    let s: f32 = sel.iter().map(|(_, w)| w).sum();
                    sel.iter_mut().for_each(|(_, w)| *w /= s);
                }
                sel
            })
            .collect())
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.is_cuda() {
            return crate::gpu_blocks::moe(self, x);
        }
        let (t, h) = (x.rows(), x.last_dim());
        let dt = x.dtype();
        let routes = self.route(x)?;
        let e = self.router.out_features();
        // Group rows by expert: for expert j, (row, weight) pairs.
        let mut groups: Vec<Vec<(usize, f32)>> = vec![Vec::new(); e];
        for (r, sel) in routes.iter().enumerate() {
            for &(j, w) in sel {
                groups[j].push((r, w));
            }
        }
        let inter = self.gate.dim(1);
        let hit: Vec<usize> = (0..e).filter(|&j| !groups[j].is_empty()).collect();
        // Each hit expert runs on its gathered rows: [n, H] -> [n, I] -> [n, H].
        let outs: Vec<Vec<f32>> = hit
            .par_iter()
            .map(|&j| {
                let rows = &groups[j];
                let n = rows.len();
                let mut xs = Vec::with_capacity(n * h);
                for &(r, _) in rows {
                    xs.extend_from_slice(x.row(r));
                }
                let wg = &self.gate.data()[j * inter * h..(j + 1) * inter * h];
                let wu = &self.up.data()[j * inter * h..(j + 1) * inter * h];
                let wd = &self.down.data()[j * h * inter..(j + 1) * h * inter];
                let mut g = vec![0.0; n * inter];
                let mut u = vec![0.0; n * inter];
                ops::matmul_t(&xs, wg, &mut g, n, h, inter, false);
                ops::matmul_t(&xs, wu, &mut u, n, h, inter, false);
                // Fused activation: bf16 GEMM outputs in, f32 math, one rounding out.
                for (uv, gv) in u.iter_mut().zip(&g) {
                    *uv = dt.round(ops::silu(dt.round(*gv)) * dt.round(*uv));
                }
                let mut o = vec![0.0; n * h];
                ops::matmul_t(&u, wd, &mut o, n, inter, h, false);
                // Routing weight applied in f32 to the bf16 expert output.
                for (ri, &(_, w)) in rows.iter().enumerate() {
                    for v in &mut o[ri * h..(ri + 1) * h] {
                        *v = dt.round(*v) * w;
                    }
                }
                o
            })
            .collect();
        // Accumulate in f32 in ascending expert order (a fused top-k sum), round once.
        let mut y = vec![0.0f32; t * h];
        for (&j, o) in hit.iter().zip(&outs) {
            for (ri, &(r, _)) in groups[j].iter().enumerate() {
                for (a, b) in y[r * h..(r + 1) * h].iter_mut().zip(&o[ri * h..(ri + 1) * h]) {
                    *a += b;
                }
            }
        }
        if let Some(s) = &self.shared {
            let so = s.mlp.forward(x)?;
            let g = s.gate.forward(x)?;
            for r in 0..t {
                let gr = ops::sigmoid(g.data()[r]);
                for (a, b) in y[r * h..(r + 1) * h].iter_mut().zip(so.row(r)) {
                    *a += gr * b;
                }
            }
        }
        Tensor::from_vec(y, [t, h], dt)
    }
}

/// Token embedding lookup.
///
/// # Shapes
/// - `table`: `[vocab, hidden]`; `ids: [T]` → `[T, hidden]`
#[derive(Debug, Clone)]
pub struct Embedding {
    pub table: Tensor,
}

impl PreLayer for Embedding {
    fn forward(&self, ids: &[u32]) -> Result<Tensor> {
        let v = self.table.dim(0);
        let idx: Vec<usize> = ids.iter().map(|&i| i as usize).collect();
        if let Some(&bad) = idx.iter().find(|&&i| i >= v) {
            bail!("token id {bad} is out of range for a vocabulary of {v}");
        }
        if self.table.is_cuda() {
            return crate::gpu_blocks::embedding(&self.table, ids);
        }
        // The residual stream is kept in f32 (one rounding per GEMM output instead of one
        // per residual add); embedding rows are exact in any dtype.
        Ok(self.table.gather_rows(&idx)?.to_dtype(DType::F32))
    }
}

/// Final norm followed by the lm_head (possibly the tied embedding table).
///
/// # Shapes
/// - `lm_head`: `[vocab, hidden]`; `[R, hidden]` → `[R, vocab]`
#[derive(Debug, Clone)]
pub struct NormHead {
    pub norm: RmsNorm,
    pub lm_head: Tensor,
}

/// Bytes of a weight tensor in its dtype.
pub fn tensor_bytes(t: &Tensor) -> usize {
    t.elem_count() * t.dtype().size_in_bytes()
}

impl Linear {
    /// Weight (and bias) bytes.
    pub fn bytes(&self) -> usize {
        tensor_bytes(&self.w) + self.b.as_ref().map_or(0, tensor_bytes)
    }
}

impl PostLayer for NormHead {
    fn weight_bytes(&self) -> usize {
        tensor_bytes(&self.lm_head) + self.norm.dim() * self.lm_head.dtype().size_in_bytes()
    }

    fn norm(&self, h: &Tensor) -> Result<Tensor> {
        self.norm.forward(h)
    }

    fn logits(&self, normed: &Tensor) -> Result<Tensor> {
        // f32 logits (the GEMM accumulates in f32; no final bf16 rounding).
        normed.matmul_t_to(&self.lm_head, DType::F32)
    }
}

/// The feed-forward half of a decoder layer.
#[derive(Debug, Clone)]
pub enum FeedForward {
    Dense(Box<SwiGlu>),
    Moe(Box<Moe>),
}

impl FeedForward {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            FeedForward::Dense(m) => m.forward(x),
            FeedForward::Moe(m) => m.forward(x),
        }
    }
}

/// The token mixer of a decoder layer.
#[derive(Debug, Clone)]
pub enum Mixer {
    /// Softmax self-attention with a KV cache.
    Attention(Box<Attention>),
    /// Gated DeltaNet linear attention with a recurrent state.
    GatedDeltaNet(Box<crate::linear_attn::GatedDeltaNet>),
}

impl Mixer {
    pub fn forward(&self, x: &Tensor, batch: &Batch, cache: &mut LayerCache) -> Result<Tensor> {
        match self {
            Mixer::Attention(a) => a.forward(x, batch, cache),
            Mixer::GatedDeltaNet(g) => g.forward(x, batch, cache),
        }
    }
}

/// A pre-norm decoder layer: `h += mixer(norm1(h)); h += ffn(norm2(h))`.
///
/// # Shapes
/// `[T, hidden]` → `[T, hidden]`
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    pub input_norm: RmsNorm,
    pub attn: Mixer,
    pub post_norm: RmsNorm,
    pub ffn: FeedForward,
}

impl crate::layers::TransformerLayer for DecoderLayer {
    fn kind(&self) -> crate::layers::LayerKind {
        match &self.attn {
            Mixer::Attention(a) => {
                crate::layers::LayerKind::Attention { kv_heads: a.cfg.kv_heads, head_dim: a.cfg.head_dim }
            }
            Mixer::GatedDeltaNet(g) => crate::layers::LayerKind::Recurrent {
                conv_dim: g.cfg.conv_dim(),
                kernel: g.cfg.conv_kernel,
                state_len: g.cfg.state_len(),
            },
        }
    }

    fn cost(&self) -> crate::layers::LayerCost {
        let mut c = crate::layers::LayerCost::default();
        let dsize = self.input_norm.dtype().size_in_bytes();
        c.dense_bytes = (self.input_norm.dim() + self.post_norm.dim()) * dsize;
        match &self.attn {
            Mixer::Attention(a) => {
                c.dense_bytes += a.q_proj.bytes() + a.k_proj.bytes() + a.v_proj.bytes() + a.o_proj.bytes();
                c.kv_bytes_per_token = 2 * a.cfg.kv_heads * a.cfg.head_dim * dsize;
            }
            Mixer::GatedDeltaNet(g) => {
                c.dense_bytes += g.in_proj_qkvz.bytes() + g.in_proj_ba.bytes() + g.out_proj.bytes();
                c.dense_bytes += (g.conv_w.len() + g.a_log.len() + g.dt_bias.len()) * 4 + g.norm_w.len() * dsize;
                c.state_bytes = g.cfg.state_len() * 4 + g.cfg.conv_dim() * g.cfg.conv_kernel.saturating_sub(1) * 4;
            }
        }
        match &self.ffn {
            FeedForward::Dense(m) => c.dense_bytes += m.gate.bytes() + m.up.bytes() + m.down.bytes(),
            FeedForward::Moe(m) => {
                c.dense_bytes += m.router.bytes();
                if let Some(s) = &m.shared {
                    c.dense_bytes += s.mlp.gate.bytes() + s.mlp.up.bytes() + s.mlp.down.bytes() + s.gate.bytes();
                }
                let e = m.router.out_features().max(1);
                c.expert_bytes = (tensor_bytes(&m.gate) + tensor_bytes(&m.up) + tensor_bytes(&m.down)) / e;
                c.experts = e;
                c.top_k = m.top_k;
            }
        }
        c
    }

    fn forward(&self, mut x: Tensor, batch: &Batch, cache: &mut LayerCache) -> Result<Tensor> {
        let a = self.attn.forward(&self.input_norm.forward(&x)?, batch, cache)?;
        if let (true, Some(w)) = (x.is_cuda(), self.post_norm.device_weight()) {
            // One kernel for the residual add and the post-attention norm.
            let h = crate::gpu_blocks::add_rms_norm(&self.post_norm, w, &mut x, &a)?;
            let f = self.ffn.forward(&h)?;
            x.add_(&f)?;
            return Ok(x);
        }
        x.add_(&a)?;
        let f = self.ffn.forward(&self.post_norm.forward(&x)?)?;
        x.add_(&f)?;
        Ok(x)
    }
}

/// Helpers that take weight slots by the naming convention of the weight maps:
/// a linear layer `P` has its weight at slot `P` and an optional bias at `P.bias`.
pub mod load {
    use super::*;
    use crate::weight_map::Weights;

    pub fn linear(w: &mut Weights, slot: &str) -> Result<Linear> {
        let weight = w.take(slot)?;
        let bias = w.take_opt(&format!("{slot}.bias"));
        Ok(Linear::new(weight, bias))
    }

    pub fn norm(w: &mut Weights, slot: &str, eps: f32, kind: NormKind) -> Result<RmsNorm> {
        Ok(RmsNorm::new(w.take(slot)?, eps, kind))
    }

    /// The feed-forward half of a layer whose slots start with `prefix` (e.g. `"layers.3."`):
    /// the MoE at `{prefix}moe` when `moe` gives `(top_k, norm_topk_prob)`, else the dense
    /// SwiGLU at `{prefix}mlp`.
    pub fn feed_forward(w: &mut Weights, prefix: &str, moe: Option<(usize, bool)>) -> Result<FeedForward> {
        Ok(match moe {
            Some((top_k, norm_topk_prob)) => {
                FeedForward::Moe(Box::new(self::moe(w, &format!("{prefix}moe"), top_k, norm_topk_prob)?))
            }
            None => FeedForward::Dense(Box::new(swiglu(w, &format!("{prefix}mlp"))?)),
        })
    }

    /// `P.gate_proj`, `P.up_proj`, `P.down_proj`.
    pub fn swiglu(w: &mut Weights, prefix: &str) -> Result<SwiGlu> {
        let gate = linear(w, &format!("{prefix}.gate_proj"))?;
        let up = linear(w, &format!("{prefix}.up_proj"))?;
        // Bias-free projections on a device are stacked into one GEMM.
        let gate_up = match (gate.w.is_cuda(), &gate.b, &up.b) {
            (true, None, None) => Some(crate::gpu::stack_rows(&gate.w, &up.w)?),
            _ => None,
        };
        Ok(SwiGlu { gate, up, down: linear(w, &format!("{prefix}.down_proj"))?, gate_up })
    }

    /// `P.router` and the stacked experts `P.gate_proj`, `P.up_proj`, `P.down_proj`;
    /// the shared expert at `P.shared_expert.*` and `P.shared_expert_gate` when present.
    pub fn moe(w: &mut Weights, prefix: &str, top_k: usize, norm_topk_prob: bool) -> Result<Moe> {
        let shared = if w.contains(&format!("{prefix}.shared_expert_gate")) {
            Some(SharedExpert {
                mlp: swiglu(w, &format!("{prefix}.shared_expert"))?,
                gate: linear(w, &format!("{prefix}.shared_expert_gate"))?,
            })
        } else {
            None
        };
        let router = linear(w, &format!("{prefix}.router"))?;
        let stacked_in = match &shared {
            Some(s) if router.w.is_cuda() && router.b.is_none() && s.gate.b.is_none() => match &s.mlp.gate_up {
                Some(gu) => Some(crate::gpu::stack_rows(&crate::gpu::stack_rows(&router.w, gu)?, &s.gate.w)?),
                None => None,
            },
            _ => None,
        };
        let m = Moe {
            router,
            gate: w.take(&format!("{prefix}.gate_proj"))?,
            up: w.take(&format!("{prefix}.up_proj"))?,
            down: w.take(&format!("{prefix}.down_proj"))?,
            top_k,
            norm_topk_prob,
            shared,
            stacked_in,
        };
        m.check()?;
        Ok(m)
    }

    /// Gated DeltaNet at `P.in_proj_qkvz`, `P.in_proj_ba`, `P.conv1d` (`[C, 1, K]`),
    /// `P.A_log`, `P.dt_bias`, `P.norm`, `P.out_proj`.
    pub fn gated_delta_net(w: &mut Weights, prefix: &str, cfg: crate::linear_attn::GdnConfig) -> Result<Mixer> {
        let conv_w = w.take(&format!("{prefix}.conv1d"))?.into_vec();
        let a_log = w.take(&format!("{prefix}.A_log"))?.into_vec();
        let dt_bias = w.take(&format!("{prefix}.dt_bias"))?.into_vec();
        let norm = w.take(&format!("{prefix}.norm"))?;
        let in_proj_qkvz = linear(w, &format!("{prefix}.in_proj_qkvz"))?;
        let in_proj_ba = linear(w, &format!("{prefix}.in_proj_ba"))?;
        let dev = match norm.gpu() {
            Some(_) if in_proj_qkvz.b.is_some() || in_proj_ba.b.is_some() => {
                bail!("{prefix}: biases on the Gated DeltaNet in-projections are not supported on CUDA")
            }
            Some(gpu) => {
                let in_proj = crate::gpu::stack_rows(&in_proj_qkvz.w, &in_proj_ba.w)?;
                Some(crate::gpu_blocks::GdnDev::new(gpu, in_proj, &conv_w, &a_log, &dt_bias, norm.try_clone()?)?)
            }
            None => None,
        };
        let g = crate::linear_attn::GatedDeltaNet {
            cfg,
            in_proj_qkvz,
            in_proj_ba,
            conv_w,
            a_log,
            dt_bias,
            norm_w: norm.into_vec(),
            out_proj: linear(w, &format!("{prefix}.out_proj"))?,
            dev,
        };
        g.check()?;
        Ok(Mixer::GatedDeltaNet(Box::new(g)))
    }

    /// Assembles a decoder-only model from its transformer layers: the embedding pre-layer
    /// (`embed`), the final norm (`norm`) and the lm_head (`lm_head`, or the embedding when
    /// `tie_word_embeddings`).
    pub fn assemble(
        lc: &crate::registry::LoadContext,
        w: &mut Weights,
        architecture: &str,
        base: &crate::config::DecoderConfig,
        norm_kind: NormKind,
        layers: Vec<Box<dyn crate::layers::TransformerLayer>>,
    ) -> Result<crate::layers::Model> {
        let embed = w.take("embed")?;
        let lm_head = if base.tie_word_embeddings { embed.try_clone()? } else { w.take("lm_head")? };
        let norm = norm(w, "norm", base.rms_norm_eps as f32, norm_kind)?;
        Ok(crate::layers::Model {
            info: crate::layers::ModelInfo {
                architecture: architecture.into(),
                vocab_size: base.vocab_size,
                hidden_size: base.hidden_size,
                num_layers: base.num_hidden_layers,
                dtype: lc.dtype,
                device: lc.device,
                max_position_embeddings: base.max_position_embeddings,
                generation: crate::config::generation_config(lc.dir, lc.config)?,
            },
            pre: Box::new(Embedding { table: embed }),
            layers,
            post: Box::new(NormHead { norm, lm_head }),
        })
    }

    /// `P.{q,k,v,o}_proj` and, when `qk_norm` is given, `P.q_norm` / `P.k_norm`.
    pub fn attention(
        w: &mut Weights,
        prefix: &str,
        cfg: AttentionConfig,
        rope: Rope,
        qk_norm: Option<(f32, NormKind)>,
    ) -> Result<Mixer> {
        let (q_norm, k_norm) = match qk_norm {
            Some((eps, kind)) => (
                Some(norm(w, &format!("{prefix}.q_norm"), eps, kind)?),
                Some(norm(w, &format!("{prefix}.k_norm"), eps, kind)?),
            ),
            None => (None, None),
        };
        let a = Attention {
            cfg,
            q_proj: linear(w, &format!("{prefix}.q_proj"))?,
            k_proj: linear(w, &format!("{prefix}.k_proj"))?,
            v_proj: linear(w, &format!("{prefix}.v_proj"))?,
            o_proj: linear(w, &format!("{prefix}.o_proj"))?,
            q_norm,
            k_norm,
            rope,
        };
        a.check()?;
        Ok(Mixer::Attention(Box::new(a)))
    }
}

/// Load-time checks shared by the attention models.
pub fn check_dims(
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    vocab: usize,
    layers: usize,
) -> Result<()> {
    if hidden == 0 || heads == 0 || kv_heads == 0 || head_dim == 0 || vocab == 0 || layers == 0 {
        bail!("hidden_size, num_attention_heads, num_key_value_heads, head_dim, vocab_size and num_hidden_layers must be positive");
    }
    if !heads.is_multiple_of(kv_heads) {
        bail!("num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})");
    }
    if !head_dim.is_multiple_of(2) {
        bail!("head_dim ({head_dim}) must be even for RoPE");
    }
    Ok(())
}

/// Only SiLU-gated MLPs are implemented.
pub fn check_act(act: &str) -> Result<()> {
    match act {
        "silu" | "swish" => Ok(()),
        other => bail!("hidden_act `{other}` is not supported (supported: silu)"),
    }
}

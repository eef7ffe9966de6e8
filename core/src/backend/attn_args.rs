//! The arguments of an attention block's ops ([`Ops::qk_prep`], [`Ops::qkv_prep`],
//! [`Ops::attention`]) and their compositions from simpler ops, which the CPU backend runs
//! (and the CUDA backend where its fused kernels do not apply).

use super::{NormKind, Ops};
use crate::bail;
use crate::batch::Batch;
use crate::error::Result;
use crate::tensor::Tensor;

/// RoPE arguments of one attention block.
#[derive(Debug, Clone, Copy)]
pub struct RopeArgs<'a> {
    /// `[rot_dim / 2]` f32 inverse frequencies, on the activations' device.
    pub inv_freq: &'a Tensor,
    pub rot_dim: usize,
    pub head_dim: usize,
    /// Scale applied to cos / sin (YaRN's attention factor; 1 otherwise).
    pub scaling: f32,
}

/// One per-head RMSNorm of [`QkPrep`] (an attention block's `q_norm` / `k_norm`).
#[derive(Debug, Clone, Copy)]
pub struct HeadNorm<'a> {
    /// `[head_dim]`.
    pub w: &'a Tensor,
    pub eps: f32,
    pub kind: NormKind,
}

/// What [`Ops::qk_prep`] does to an attention block's query and key projections.
#[derive(Debug, Clone, Copy)]
pub struct QkPrep<'a> {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Qwen3-Next's gated query projection: per head `[q | gate]`.
    pub gated: bool,
    pub q_norm: Option<HeadNorm<'a>>,
    pub k_norm: Option<HeadNorm<'a>>,
    pub rope: RopeArgs<'a>,
}

impl QkPrep<'_> {
    /// Columns of the query projection (`heads·hd·(1 + gated)`) and of the key (= value)
    /// projection (`kv_heads·hd`).
    pub fn widths(&self) -> (usize, usize) {
        (self.heads * self.head_dim * if self.gated { 2 } else { 1 }, self.kv_heads * self.head_dim)
    }
}

/// The outputs of [`Ops::qk_prep`].
///
/// # Shapes
/// `q`: `[T, heads, hd]`, `k`: `[T, kv_heads, hd]`, `gate`: `[T·heads, hd]`
#[derive(Debug)]
pub struct QkPrepared {
    pub q: Tensor,
    pub k: Tensor,
    /// The gate of a gated query projection.
    pub gate: Option<Tensor>,
}

/// [`Ops::qk_prep`] as the separate ops: the gate split by column copies, the norms, then
/// RoPE on each (the CPU backend's body, and the CUDA backend's where its kernel does not
/// apply).
///
/// # Shapes
/// `qg`: `[T, heads·hd·(1 + gated)]`, `k`: `[T, kv_heads·hd]` → [`QkPrepared`]
pub fn qk_prep_composed<O: Ops + ?Sized>(
    o: &O,
    qg: Tensor,
    k: Tensor,
    p: &QkPrep<'_>,
    batch: &Batch,
) -> Result<QkPrepared> {
    let (t, hd) = (qg.rows(), p.head_dim);
    // Gated: [T, heads·hd·2] viewed as [T·heads, 2·hd]: q = columns 0..hd, gate = hd..2hd.
    let (q, gate) = if p.gated {
        let qg = qg.reshape([t * p.heads, 2 * hd])?;
        (o.cols(&qg, 0, hd)?, Some(o.cols(&qg, hd, hd)?))
    } else {
        (qg, None)
    };
    // [T, heads·hd] -> [T, heads, hd]; [T, kv·hd] -> [T, kv, hd]
    let q = q.reshape([t, p.heads, hd])?;
    let k = k.reshape([t, p.kv_heads, hd])?;
    let norm = |x: Tensor, n: &Option<HeadNorm<'_>>| match n {
        Some(n) => o.rms_norm(&x, n.w, n.eps, n.kind),
        None => Ok(x),
    };
    let mut q = norm(q, &p.q_norm)?;
    let mut k = norm(k, &p.k_norm)?;
    o.rope(&mut q, &p.rope, batch)?;
    o.rope(&mut k, &p.rope, batch)?;
    Ok(QkPrepared { q, k, gate })
}

/// [`Ops::qkv_prep`] as the column copies of q, k and v, then [`Ops::qk_prep`] (the CPU
/// backend's body, and the CUDA backend's where its kernel does not apply).
///
/// # Shapes
/// `qkv`: `[T, heads·hd·(1 + gated) + 2·kv_heads·hd]` → ([`QkPrepared`], v `[T, kv_heads·hd]`)
pub fn qkv_prep_composed<O: Ops + ?Sized>(
    o: &O,
    qkv: Tensor,
    p: &QkPrep<'_>,
    batch: &Batch,
) -> Result<(QkPrepared, Tensor)> {
    let (qw, kw) = p.widths();
    if qkv.last_dim() != qw + 2 * kw {
        bail!(Shape, "packed q / k / v projection of {} columns, expected {qw} + 2·{kw}", qkv.last_dim());
    }
    let (qg, k, v) = (o.cols(&qkv, 0, qw)?, o.cols(&qkv, qw, kw)?, o.cols(&qkv, qw + kw, kw)?);
    Ok((o.qk_prep(qg, k, p, batch)?, v))
}

/// `out` (`[T, heads, hd]`) times `sigmoid(gate)` (`[T·heads, hd]`) when a gate is given
/// ([`Ops::attention_gated`]'s second op).
pub fn gate_after<O: Ops + ?Sized>(o: &O, out: Tensor, gate: Option<&Tensor>, a: &AttnArgs) -> Result<Tensor> {
    let Some(g) = gate else { return Ok(out) };
    let t = out.dim(0);
    // [T, heads, hd] viewed as [T·heads, hd], like the gate.
    let mut out = out.reshape([t * a.heads, a.head_dim])?;
    o.sigmoid_gate_mul(&mut out, g)?;
    out.reshape([t, a.heads, a.head_dim])
}

/// Attention geometry of one block.
#[derive(Debug, Clone, Copy)]
pub struct AttnArgs {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// Sliding-window length (a key is visible while `pos_q − pos_k < window`).
    pub window: Option<usize>,
}

//! The CPU backend's per-layer state: the host key / value pool of an attention layer
//! ([`CpuKv`]) and the conv windows and SSM states of a Gated DeltaNet layer ([`CpuRec`]),
//! with their rollback checkpoints. Re-exported by [`super::cpu`].

use crate::bail;
use crate::batch::{PageStep, SeqId, PAD};
use crate::error::Result;
use crate::tensor::DType;
use porter_kernels::cpu::kv_quant::{self, KvQuant};

/// Host key / value pool of one attention layer: `[rows, kv_heads·head_dim]` each, grown to
/// the highest row written (at most `cap` rows): f32 values (rounded to the model dtype) or,
/// quantized ([`KvQuant`]), one byte per element plus `[rows, kv_heads]` f32 scales, the
/// rows dequantized (and rounded to the model dtype) as a span gathers them.
#[derive(Debug, Clone)]
pub struct CpuKv {
    row: usize,
    head_dim: usize,
    cap: usize,
    dtype: DType,
    quant: Option<KvQuant>,
    k: Vec<f32>,
    v: Vec<f32>,
    kq: Vec<u8>,
    vq: Vec<u8>,
    ks: Vec<f32>,
    vs: Vec<f32>,
}

impl CpuKv {
    /// An empty pool of up to `cap` rows of `kv_heads · head_dim` elements.
    pub fn new(kv_heads: usize, head_dim: usize, cap: usize, dtype: DType, quant: Option<KvQuant>) -> Self {
        let row = kv_heads * head_dim;
        let (k, v, kq, vq, ks, vs) = Default::default();
        Self { row, head_dim, cap, dtype, quant, k, v, kq, vq, ks, vs }
    }

    /// Rows held now (grown as rows are written).
    fn rows(&self) -> usize {
        match self.quant {
            None => self.k.len() / self.row.max(1),
            Some(_) => self.kq.len() / self.row.max(1),
        }
    }

    /// Writes batch row `r` of `k` / `v` to pool row `slots[r]` ([`PAD`] rows are skipped),
    /// quantized per (row, KV head) when the pool is.
    pub fn write(&mut self, slots: &[u32], k: &[f32], v: &[f32]) -> Result<()> {
        let (row, hd) = (self.row, self.head_dim);
        let heads = row / hd.max(1);
        for (r, &slot) in slots.iter().enumerate() {
            if slot == PAD {
                continue;
            }
            let slot = slot as usize;
            if slot >= self.cap {
                bail!(Cache, "KV pool row {slot} is outside the pool of {} rows", self.cap);
            }
            if self.rows() < slot + 1 {
                // Grow by whole blocks of at least 64 rows so appends are amortised.
                let rows = (slot + 1).next_multiple_of(64).min(self.cap);
                match self.quant {
                    None => {
                        self.k.resize(rows * row, 0.0);
                        self.v.resize(rows * row, 0.0);
                    }
                    Some(_) => {
                        self.kq.resize(rows * row, 0);
                        self.vq.resize(rows * row, 0);
                        self.ks.resize(rows * heads, 1.0);
                        self.vs.resize(rows * heads, 1.0);
                    }
                }
            }
            let (src_k, src_v) = (&k[r * row..(r + 1) * row], &v[r * row..(r + 1) * row]);
            let dst = slot * row..(slot + 1) * row;
            match self.quant {
                None => {
                    self.k[dst.clone()].copy_from_slice(src_k);
                    self.v[dst].copy_from_slice(src_v);
                }
                Some(qk) => {
                    let sc = slot * heads..(slot + 1) * heads;
                    kv_quant::quantize_row(qk, src_k, hd, &mut self.kq[dst.clone()], &mut self.ks[sc.clone()]);
                    kv_quant::quantize_row(qk, src_v, hd, &mut self.vq[dst], &mut self.vs[sc]);
                }
            }
        }
        Ok(())
    }

    /// Keys and values of positions `0..len` of span `i` gathered into `[len, row]` buffers
    /// (f32; a quantized pool's rows dequantized and rounded to the model dtype).
    pub fn gather(&self, step: &PageStep, i: usize, len: usize, k: &mut Vec<f32>, v: &mut Vec<f32>) -> Result<()> {
        let (row, hd) = (self.row, self.head_dim);
        let heads = row / hd.max(1);
        let held = self.rows();
        let dt = self.dtype;
        k.clear();
        v.clear();
        if self.quant.is_some() {
            k.resize(len * row, 0.0);
            v.resize(len * row, 0.0);
        }
        for p in 0..len {
            let slot = step.row(i, p);
            if slot + 1 > held {
                bail!(Cache, "KV pool row {slot} (position {p} of span {i}) was never written");
            }
            let src = slot * row..(slot + 1) * row;
            match self.quant {
                None => {
                    k.extend_from_slice(&self.k[src.clone()]);
                    v.extend_from_slice(&self.v[src]);
                }
                Some(qk) => {
                    let sc = slot * heads..(slot + 1) * heads;
                    let round = |x: f32| dt.round(x);
                    let out = p * row..(p + 1) * row;
                    kv_quant::dequantize_row(
                        qk,
                        &self.kq[src.clone()],
                        &self.ks[sc.clone()],
                        hd,
                        &mut k[out.clone()],
                        &round,
                    );
                    kv_quant::dequantize_row(qk, &self.vq[src], &self.vs[sc], hd, &mut v[out], &round);
                }
            }
        }
        Ok(())
    }
}

/// One slot of a [`CpuRec`].
#[derive(Debug, Clone, Default)]
pub struct CpuRecSlot {
    /// Raw conv inputs of the last `kernel − 1 + spec` tokens, time-major `[n, conv_dim]`.
    pub conv_hist: Vec<f32>,
    /// `spec + 1` SSM state buffers (allocated at first use).
    pub ssm: Vec<Vec<f32>>,
}

impl CpuRecSlot {
    /// The conv state for the next token: the last `kernel − 1` inputs, channel-major
    /// `[conv_dim, kernel − 1]`, oldest first, zero-padded at the start of a sequence.
    pub(super) fn conv_state(&self, c: usize, kernel: usize) -> Vec<f32> {
        let w = kernel.saturating_sub(1);
        let n = self.conv_hist.len() / c.max(1);
        let mut st = vec![0.0; c * w];
        for j in 0..w.min(n) {
            let row = &self.conv_hist[(n - 1 - j) * c..(n - j) * c];
            for ch in 0..c {
                st[ch * w + (w - 1 - j)] = row[ch];
            }
        }
        st
    }

    pub(super) fn push_conv_inputs(&mut self, x: &[f32], keep: usize) {
        self.conv_hist.extend_from_slice(x);
        if self.conv_hist.len() > keep {
            let cut = self.conv_hist.len() - keep;
            self.conv_hist.drain(..cut);
        }
    }
}

/// One saved recurrent state (a prefix-cache checkpoint): the conv inputs before the
/// checkpoint position and the SSM state after it.
#[derive(Debug, Clone, Default)]
pub struct CpuCkpt {
    pub conv_hist: Vec<f32>,
    pub ssm: Vec<f32>,
}

/// Host conv windows and SSM states of one linear-attention layer, per slot.
#[derive(Debug, Clone, Default)]
pub struct CpuRec {
    slots: Vec<CpuRecSlot>,
    /// Prefix-cache checkpoints (indexed by checkpoint slot).
    ckpts: Vec<CpuCkpt>,
}

impl CpuRec {
    pub(super) fn slot(&mut self, seq: SeqId, nbuf: usize, state_len: usize) -> &mut CpuRecSlot {
        if self.slots.len() <= seq.0 {
            self.slots.resize_with(seq.0 + 1, CpuRecSlot::default);
        }
        let s = &mut self.slots[seq.0];
        if s.ssm.len() != nbuf {
            s.ssm = vec![vec![0.0; state_len]; nbuf];
        }
        s
    }

    pub fn clear(&mut self, seq: SeqId) {
        if let Some(s) = self.slots.get_mut(seq.0) {
            *s = CpuRecSlot::default();
        }
    }

    /// Stores checkpoint `c`.
    pub(super) fn save(&mut self, c: usize, ck: CpuCkpt) {
        if self.ckpts.len() <= c {
            self.ckpts.resize_with(c + 1, CpuCkpt::default);
        }
        self.ckpts[c] = ck;
    }

    /// Makes slot `seq` hold checkpoint `c` (its current state buffer 0).
    pub fn restore(&mut self, seq: SeqId, c: usize, nbuf: usize, state_len: usize) -> Result<()> {
        let Some(ck) = self.ckpts.get(c).cloned() else { bail!(Internal, "checkpoint {c} was never saved") };
        if ck.ssm.len() != state_len {
            bail!(Internal, "checkpoint {c} holds {} state floats, the layer {state_len}", ck.ssm.len());
        }
        let slot = self.slot(seq, nbuf, state_len);
        slot.conv_hist = ck.conv_hist;
        slot.ssm[0].copy_from_slice(&ck.ssm);
        Ok(())
    }
}

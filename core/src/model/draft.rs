//! Multi-token-prediction draft heads: the [`DraftHead`] trait and the two shared head
//! blocks (an attention head in the style of DeepSeek / Qwen3-Next MTP, and LightLLM's
//! FFN-only head). Draft crates configure and register them.
//!
//! A draft row at position `p` takes the token `x_{p+1}` and a hidden state `h_p` and
//! predicts `x_{p+2}`. The hidden comes from the main model for the first draft step and
//! from the draft itself when steps are chained.

use crate::bail;
use crate::batch::Batch;
use crate::error::Result;
use crate::layer::TransformerLayer;
use crate::model::{LogitsFor, Model};
use crate::nn::{DecoderLayer, FeedForward, Linear, RmsNorm};
use crate::state::{CacheConfig, LayerCache, ModelCache, StateCache};
use crate::tensor::dtype::DType;
use crate::tensor::Tensor;

/// Output of a draft forward.
#[derive(Debug)]
pub struct DraftOutput {
    /// `[R, vocab]` f32 logits (rows as requested).
    pub logits: Tensor,
    /// `[T, hidden]`: the hidden to feed the next chained step, in the draft's input space.
    pub hidden: Tensor,
}

/// A draft head attached to a main model.
pub trait DraftHead: Send + Sync {
    /// The registered draft name (its crate).
    fn name(&self) -> &str;

    /// Per-request state of the draft (a KV cache for attention heads; by default none).
    fn new_cache(&self, cfg: &CacheConfig) -> Result<ModelCache> {
        Ok(ModelCache::new(vec![LayerCache::Stateless], cfg))
    }

    /// Whether the draft keeps per-request state (then chained steps must be rolled back).
    fn is_stateful(&self) -> bool {
        false
    }

    /// Converts main-model hidden rows (the residual stream before the final norm) into
    /// the hidden the draft consumes (by default, unchanged).
    ///
    /// # Shapes
    /// `[T, hidden]` → `[T, hidden]`
    fn main_hidden(&self, _main: &Model, h: &Tensor) -> Result<Tensor> {
        h.try_clone()
    }

    /// Runs the draft: row `r` takes token `batch.ids[r]` and `hidden` row `r` at the
    /// position given by the batch (the position of the hidden).
    ///
    /// # Shapes
    /// `hidden: [T, hidden]` → logits `[R, vocab]`, next hidden `[T, hidden]`
    fn forward(
        &self,
        main: &Model,
        batch: &Batch,
        hidden: &Tensor,
        cache: &mut dyn StateCache,
        rows: LogitsFor,
    ) -> Result<DraftOutput>;
}

fn select_rows(x: &Tensor, batch: &Batch, rows: LogitsFor) -> Result<Tensor> {
    match rows {
        LogitsFor::All => x.try_clone(),
        LogitsFor::Last => x.gather_rows(&rows.rows(batch)),
    }
}

/// `[a | b]` along the last dimension.
///
/// # Shapes
/// `[T, d1]`, `[T, d2]` → `[T, d1 + d2]`
pub fn concat_last(a: &Tensor, b: &Tensor, dtype: DType) -> Result<Tensor> {
    if a.rows() != b.rows() {
        bail!(Shape, "concat: {} vs {} rows", a.rows(), b.rows());
    }
    // Cast only an input that is not in `dtype` yet (the norms already give it).
    let cast = |t: &Tensor| -> Result<Option<Tensor>> {
        if t.dtype() == dtype {
            Ok(None)
        } else {
            t.try_clone()?.try_to_dtype(dtype).map(Some)
        }
    };
    let (ca, cb) = (cast(a)?, cast(b)?);
    ca.as_ref().unwrap_or(a).concat_last(cb.as_ref().unwrap_or(b))
}

fn check_batch(main: &Model, batch: &Batch, hidden: &Tensor) -> Result<()> {
    if hidden.rows() != batch.len() || hidden.last_dim() != main.info.hidden_size {
        bail!(Shape, "draft input: {} token rows but hidden {:?}", batch.len(), hidden.shape());
    }
    if let Some(&bad) = batch.ids.iter().find(|&&t| t as usize >= main.info.vocab_size) {
        bail!(Shape, "token id {bad} is out of range for a vocabulary of {}", main.info.vocab_size);
    }
    Ok(())
}

/// The input fusion shared by MTP heads: `proj([norm_e(embed(ids)) | norm_h(hidden)])`
/// (embedding first), returned as an f32 residual stream. Validates ids and shapes.
///
/// # Shapes
/// `hidden: [T, H]` → `[T, H]` (via `[T, 2H]`)
fn fuse(
    main: &Model,
    batch: &Batch,
    hidden: &Tensor,
    norm_e: &RmsNorm,
    norm_h: &RmsNorm,
    proj: &Linear,
) -> Result<Tensor> {
    check_batch(main, batch, hidden)?;
    let e = norm_e.forward(&main.pre.forward(&batch.ids)?)?;
    let hh = norm_h.forward(hidden)?;
    proj.forward(&concat_last(&e, &hh, main.info.dtype)?)?.try_to_dtype(DType::F32)
}

/// An MTP head with one decoder layer (Qwen3-Next `mtp.*`, DeepSeek-style):
/// `u = fc([norm_e(embed(x_{p+1})) | norm_h(h_p)])`, `u = layer(u)` (own KV cache),
/// `logits = lm_head(norm(u))`; the hidden handed to a chained step is `norm(u)`.
/// The main hidden is taken after the main model's final norm.
pub struct AttentionMtpHead {
    pub name: String,
    pub fc: Linear,
    pub norm_embedding: RmsNorm,
    pub norm_hidden: RmsNorm,
    pub layer: DecoderLayer,
    pub norm: RmsNorm,
}

impl AttentionMtpHead {
    /// The head's forward without the checks of the batch against the cache (a CUDA graph's
    /// padded batch has [`crate::state::SeqId::PAD`] spans, which own no state): logits for
    /// the batch rows `rows`, the post-`norm` hidden of every row.
    ///
    /// # Shapes
    /// `hidden: [T, H]` → logits `[rows.len(), vocab]`, hidden `[T, H]`
    fn step(
        &self,
        main: &Model,
        batch: &Batch,
        hidden: &Tensor,
        cache: &mut dyn StateCache,
        rows: &[usize],
    ) -> Result<crate::model::ForwardOutput> {
        let u = fuse(main, batch, hidden, &self.norm_embedding, &self.norm_hidden, &self.fc)?;
        cache.prepare(batch)?;
        let u = self.layer.forward(u, batch, cache.layer_mut(0)?)?;
        for s in batch.spans.iter().filter(|s| !s.seq.is_pad()) {
            cache.advance(s.seq, s.len)?;
        }
        let d = self.norm.forward(&u)?;
        let logits = if crate::model::every_row(rows, batch.len()) {
            main.post.logits(&d)?
        } else {
            main.post.logits(&d.gather_rows(rows)?)?
        };
        Ok(crate::model::ForwardOutput { logits, hidden: d })
    }

    /// The step from a CUDA graph of its shape (captured at first use, as the main model's
    /// decode and verify steps are: `crate::model::graph`) when every span has the same
    /// number of rows and this cache keeps graphs; `None` otherwise (the caller runs it
    /// eagerly). The hidden rows are copied first into a buffer outside the graphs (f32, as
    /// many rows as the largest graph), which the graphs read. Logits for every row.
    fn step_graphed(
        &self,
        main: &Model,
        batch: &Batch,
        hidden: &Tensor,
        cache: &mut dyn StateCache,
    ) -> Result<Option<crate::model::ForwardOutput>> {
        let crate::tensor::Storage::Cuda(c) = hidden.storage() else { return Ok(None) };
        let all: Vec<usize> = (0..batch.len()).collect();
        if !crate::backend::cuda::graph::enabled() || crate::model::graph::uniform_rows(batch, &all).is_none() {
            return Ok(None);
        }
        let gpu = c.gpu.clone();
        let Some(mut gs) = cache.take_graphs() else { return Ok(None) };
        let res = (|| {
            // One input buffer for every graph of this cache (its address is in them all);
            // another owner's graphs are dropped with it when the target binds.
            let cap = gs.max_spans * crate::backend::cuda::graph::MAX_ROWS;
            let id = self as *const AttentionMtpHead as usize;
            let fits = |t: &Tensor| t.dtype() == DType::F32 && t.last_dim() == hidden.last_dim() && t.rows() >= cap;
            let mut input = match gs.input.take() {
                Some((owner, t)) if owner == id && fits(&t) => t,
                _ => {
                    // A new buffer: graphs captured with another one are dropped (bound to no
                    // owner) before any is captured with this one.
                    gs.bind(0, false, Vec::new);
                    Tensor::empty_on(&gpu, [cap, hidden.last_dim()], DType::F32)?
                }
            };
            if batch.len() > cap {
                gs.input = Some((id, input));
                return Ok(None);
            }
            // f32 holds every input dtype exactly; the hidden norm then reads f32 where the
            // eager step reads the input's dtype (the same values; in bf16 its rounding may
            // differ in the last place, which can move a draft's acceptance, never the output).
            let h32 =
                if hidden.dtype() == DType::F32 { None } else { Some(hidden.try_clone()?.try_to_dtype(DType::F32)?) };
            crate::backend::cuda::copy_rows_into(h32.as_ref().unwrap_or(hidden), &mut input, batch.len())?;
            let run = |b: &Batch, c: &mut dyn StateCache, r: &[usize]| {
                self.step(main, b, &crate::backend::cuda::head_rows(&input, b.len())?, c, r)
            };
            let none = Vec::new;
            let t = crate::model::graph::Target {
                id,
                gpu: gpu.clone(),
                layers: 1,
                has_kv: true,
                recurrent: &none,
                run: &run,
            };
            let out = crate::model::graph::forward_graphed(&t, &mut gs, batch, cache, &all);
            gs.input = Some((id, input));
            out
        })();
        cache.put_graphs(gs);
        res
    }
}

impl DraftHead for AttentionMtpHead {
    fn name(&self) -> &str {
        &self.name
    }

    fn new_cache(&self, cfg: &CacheConfig) -> Result<ModelCache> {
        let device = self.fc.w.device();
        let layer = LayerCache::new(self.layer.kind(), device, self.fc.w.dtype(), cfg)?;
        let mut cache = ModelCache::new(vec![layer], cfg);
        // The draft's steps are graphed as the main model's are (`AttentionMtpHead::step_graphed`).
        if matches!(device, crate::tensor::device::Device::Cuda(_)) && crate::backend::cuda::graph::enabled() {
            cache.enable_graphs(cfg.max_seqs);
        }
        Ok(cache)
    }

    fn is_stateful(&self) -> bool {
        true
    }

    fn main_hidden(&self, main: &Model, h: &Tensor) -> Result<Tensor> {
        main.post.norm(h)
    }

    fn forward(
        &self,
        main: &Model,
        batch: &Batch,
        hidden: &Tensor,
        cache: &mut dyn StateCache,
        rows: LogitsFor,
    ) -> Result<DraftOutput> {
        for s in &batch.spans {
            if cache.seq_len(s.seq) != s.pos0 {
                bail!(
                    Shape,
                    "draft cache of sequence {} holds {} positions, the batch starts at {}",
                    s.seq.0,
                    cache.seq_len(s.seq),
                    s.pos0
                );
            }
        }
        check_batch(main, batch, hidden)?;
        if let Some(out) = self.step_graphed(main, batch, hidden, cache)? {
            // The graph gave every row's logits; the rows asked for are taken outside it (no
            // copy when they are every row: chained steps and 1-row catch-ups).
            let idx = rows.rows(batch);
            let logits = if idx.len() == batch.len() { out.logits } else { out.logits.gather_rows(&idx)? };
            return Ok(DraftOutput { logits, hidden: out.hidden });
        }
        let out = self.step(main, batch, hidden, cache, &rows.rows(batch))?;
        Ok(DraftOutput { logits: out.logits, hidden: out.hidden })
    }
}

/// LightLLM's FFN-only MTP head (`qwen3_moe_mtp`, `mistral_mtp`):
/// `x = eh_proj([enorm(embed(x_{p+1})) | hnorm(h')])`, `x += ffn(ffn_norm(x))`,
/// `logits = lm_head(main_norm(x))`, with `h' = main_norm(h_p)` when
/// `main_norm_on_hidden` (mistral_mtp) and `h' = h_p` otherwise (qwen3_moe_mtp). The main
/// hidden is the pre-final-norm residual stream; chained steps get the draft's `x`.
pub struct FfnMtpHead {
    pub name: String,
    pub eh_proj: Linear,
    pub enorm: RmsNorm,
    pub hnorm: RmsNorm,
    pub main_norm_on_hidden: bool,
    pub ffn_norm: RmsNorm,
    pub ffn: FeedForward,
}

impl DraftHead for FfnMtpHead {
    fn name(&self) -> &str {
        &self.name
    }

    fn forward(
        &self,
        main: &Model,
        batch: &Batch,
        hidden: &Tensor,
        cache: &mut dyn StateCache,
        rows: LogitsFor,
    ) -> Result<DraftOutput> {
        let h = if self.main_norm_on_hidden { main.post.norm(hidden)? } else { hidden.try_clone()? };
        let mut x = fuse(main, batch, &h, &self.enorm, &self.hnorm, &self.eh_proj)?;
        let f = self.ffn.forward(&self.ffn_norm.forward(&x)?)?;
        x.add_(&f)?;
        let _ = cache; // stateless: positions do not matter
        let sel = select_rows(&x, batch, rows)?;
        let logits = main.post.logits(&main.post.norm(&sel)?)?;
        Ok(DraftOutput { logits, hidden: x })
    }
}

/// A draft that proposes tokens from a known sequence (the main model's own greedy
/// continuation): it measures the verify path at a forced acceptance rate, and tests the
/// accept / rollback logic with acceptance patterns that random-weight drafts never reach.
/// With `wrong_every = Some(n)`, the proposal for every position `p` with `p % n == n − 1`
/// is deliberately wrong.
pub struct OracleDraft {
    pub sequence: Vec<u32>,
    pub wrong_every: Option<usize>,
    pub vocab_size: usize,
}

impl OracleDraft {
    /// The oracle's one-hot logits for the rows asked for (`LogitsFor::Last`: each span's
    /// last), so its host work per draft token is one vocabulary row, not one per catch-up
    /// row.
    ///
    /// # Shapes
    /// → `[R, vocab]` on the host
    pub fn logits(&self, batch: &Batch, rows: LogitsFor) -> Result<Tensor> {
        let v = self.vocab_size;
        let positions: Vec<usize> = match rows {
            LogitsFor::All => batch.positions(),
            LogitsFor::Last => batch.spans.iter().map(|s| s.pos0 + s.len - 1).collect(),
        };
        let mut logits = vec![0.0f32; positions.len() * v];
        for (r, &p) in positions.iter().enumerate() {
            let mut t = self.sequence.get(p + 2).copied().unwrap_or(0) as usize % v;
            if self.wrong_every.is_some_and(|n| n > 0 && p % n == n - 1) {
                t = (t + 1) % v;
            }
            logits[r * v + t] = 1.0;
        }
        Tensor::from_vec(logits, [positions.len(), v], DType::F32)
    }
}

impl DraftHead for OracleDraft {
    fn name(&self) -> &str {
        "oracle"
    }

    fn forward(
        &self,
        _main: &Model,
        batch: &Batch,
        hidden: &Tensor,
        _cache: &mut dyn StateCache,
        rows: LogitsFor,
    ) -> Result<DraftOutput> {
        Ok(DraftOutput { logits: self.logits(batch, rows)?, hidden: hidden.try_clone()? })
    }
}

/// A real draft head's compute with an oracle's proposals: every step runs `head` (its
/// layers, its cache, its logits) and then proposes what `oracle` says. It times what a
/// trained head that is always right costs, where the bare [`OracleDraft`] proposes for free,
/// and (with `wrong_every`) takes a random-weight head's own state through the accept and
/// partial-accept paths that its proposals never reach.
pub struct ForcedDraft {
    pub head: Box<dyn DraftHead>,
    pub oracle: OracleDraft,
}

impl DraftHead for ForcedDraft {
    fn name(&self) -> &str {
        self.head.name()
    }

    fn new_cache(&self, cfg: &CacheConfig) -> Result<ModelCache> {
        self.head.new_cache(cfg)
    }

    fn is_stateful(&self) -> bool {
        self.head.is_stateful()
    }

    fn main_hidden(&self, main: &Model, h: &Tensor) -> Result<Tensor> {
        self.head.main_hidden(main, h)
    }

    fn forward(
        &self,
        main: &Model,
        batch: &Batch,
        hidden: &Tensor,
        cache: &mut dyn StateCache,
        rows: LogitsFor,
    ) -> Result<DraftOutput> {
        let out = self.head.forward(main, batch, hidden, cache, rows)?;
        // The head's own greedy token, taken as a real greedy head's is (on a CUDA device
        // its id comes back: one wait a draft token) and then replaced by the oracle's. The
        // greedy row's parameters are spelled out: `model` sits below `engine`, whose
        // `GREEDY_ROW` it may not use (core/tests/layering.rs).
        if let (crate::tensor::Storage::Cuda(_), Some(last)) = (out.logits.storage(), out.logits.rows().checked_sub(1))
        {
            crate::backend::cuda::blocks::sample_rows(&out.logits.narrow_rows(last, 1)?, &[[0.0, 0.0, 1.0, 0.0]])?;
        }
        Ok(DraftOutput { logits: self.oracle.logits(batch, rows)?, hidden: out.hidden })
    }
}

/// A shared draft head is a draft head (one loaded head serves several runs, e.g. the
/// bench's rows with and without [`ForcedDraft`]).
impl<T: DraftHead + ?Sized> DraftHead for std::sync::Arc<T> {
    fn name(&self) -> &str {
        (**self).name()
    }

    fn new_cache(&self, cfg: &CacheConfig) -> Result<ModelCache> {
        (**self).new_cache(cfg)
    }

    fn is_stateful(&self) -> bool {
        (**self).is_stateful()
    }

    fn main_hidden(&self, main: &Model, h: &Tensor) -> Result<Tensor> {
        (**self).main_hidden(main, h)
    }

    fn forward(
        &self,
        main: &Model,
        batch: &Batch,
        hidden: &Tensor,
        cache: &mut dyn StateCache,
        rows: LogitsFor,
    ) -> Result<DraftOutput> {
        (**self).forward(main, batch, hidden, cache, rows)
    }
}

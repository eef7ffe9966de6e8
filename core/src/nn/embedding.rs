//! Token embedding (the pre-layer).

use super::*;
use std::sync::Arc;

/// Token embedding lookup (the table may be shared with a tied lm_head).
///
/// # Shapes
/// - `table`: `[vocab, hidden]`; `ids: [T]` → `[T, hidden]` f32 (the residual stream)
#[derive(Debug, Clone)]
pub struct Embedding {
    pub table: Arc<Tensor>,
}

impl PreLayer for Embedding {
    fn forward(&self, ids: &[u32]) -> Result<Tensor> {
        let v = self.table.dim(0);
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= v) {
            bail!(Input, "token id {bad} is out of range for a vocabulary of {v}");
        }
        // The residual stream is kept in f32 (one rounding per GEMM output instead of one
        // per residual add); embedding rows are exact in any dtype.
        ops(&self.table).embedding(&self.table, ids)
    }
}

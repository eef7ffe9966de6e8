//! Token embedding (the pre-layer).

use super::*;

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
            bail!(Shape, "token id {bad} is out of range for a vocabulary of {v}");
        }
        if self.table.is_cuda() {
            return crate::backend::cuda::blocks::embedding(&self.table, ids);
        }
        // The residual stream is kept in f32 (one rounding per GEMM output instead of one
        // per residual add); embedding rows are exact in any dtype.
        Ok(self.table.gather_rows(&idx)?.to_dtype(DType::F32))
    }
}

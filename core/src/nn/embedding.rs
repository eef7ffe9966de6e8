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

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;
    use crate::error::Error;
    use crate::tensor::CpuStorage;
    use half::bf16;

    fn table(rng: &mut Rng) -> (Vec<f32>, Embedding) {
        let v: Vec<bf16> = rng.vec(5 * 3, 2.0).into_iter().map(bf16::from_f32).collect();
        let f: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
        let t = Tensor::from_host(CpuStorage::BF16(v), [5, 3], DType::BF16).unwrap();
        (f, Embedding { table: Arc::new(t) })
    }

    /// Rows of a bf16 table, exactly, as the f32 residual stream.
    #[test]
    fn looks_up_rows_exactly_as_f32() {
        let (f, e) = table(&mut Rng::new(71));
        let y = e.forward(&[4, 0, 4, 2]).unwrap();
        assert_eq!((y.shape(), y.dtype()), (&[4, 3][..], DType::F32));
        let want: Vec<f32> = [4, 0, 4, 2].iter().flat_map(|&i| f[i * 3..(i + 1) * 3].to_vec()).collect();
        assert_eq!(y.data(), &want[..]);
    }

    #[test]
    fn out_of_range_id_is_an_error() {
        let (_, e) = table(&mut Rng::new(72));
        for ids in [&[5u32][..], &[0, 1, 7], &[u32::MAX]] {
            let r = e.forward(ids);
            assert!(matches!(r.as_ref().err().map(Error::root), Some(Error::Input(_))), "ids {ids:?}");
        }
    }
}

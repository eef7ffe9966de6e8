//! Sparse mixture of experts with an optional shared expert.

use super::*;

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
            bail!(Shape, "num_experts_per_tok = {} must be in 1..={e}", self.top_k);
        }
        if self.gate.dim(0) != e || self.up.dim(0) != e || self.down.dim(0) != e {
            bail!(Shape, "expert count of the weights does not match the router ({e})");
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
            return crate::backend::cuda::blocks::moe(self, x);
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

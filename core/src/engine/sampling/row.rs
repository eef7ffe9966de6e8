//! One logits row as the sampler sees it (the borrowed row plus a few overridden entries),
//! and the passes over it: max/argmax/top-N scan, top-k selection, exp sums, thresholds.

use std::cmp::Ordering;

/// Top-k at or below this size uses a bounded insertion list; above it `select_nth_unstable`.
const SMALL_K: usize = 1024;

/// A logits row with some entries replaced (penalised or masked), without copying the row.
///
/// `ov` is sorted by id, ids unique and `< raw.len()`.
pub(crate) struct Row<'a> {
    pub raw: &'a [f32],
    pub ov: &'a [(u32, f32)],
}

impl Row<'_> {
    /// Number of entries (the vocabulary).
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    /// Calls `f(index, value)` for every entry, in index order.
    #[inline]
    pub fn each(&self, mut f: impl FnMut(usize, f32)) {
        let mut start = 0;
        for &(id, v) in self.ov {
            let id = id as usize;
            for (i, &x) in self.raw[start..id].iter().enumerate() {
                f(start + i, x);
            }
            f(id, v);
            start = id + 1;
        }
        for (i, &x) in self.raw[start..].iter().enumerate() {
            f(start + i, x);
        }
    }

    /// The value at `i` (`i < len`).
    pub fn get(&self, i: usize) -> f32 {
        match self.ov.binary_search_by_key(&(i as u32), |e| e.0) {
            Ok(j) => self.ov[j].1,
            Err(_) => self.raw[i],
        }
    }
}

/// `(index, value)` pairs.
pub(crate) type Entries = Vec<(u32, f32)>;

/// Larger value first, lower index first on ties (the order of a stable descending sort).
pub(crate) fn desc(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The `cap` best `(index, value)` pairs by [`desc`], fed in index order.
pub(crate) struct TopN {
    cap: usize,
    /// Sorted by [`desc`].
    pub items: Vec<(u32, f32)>,
}

impl TopN {
    pub fn new(cap: usize) -> Self {
        Self { cap, items: Vec::with_capacity(cap + 1) }
    }

    /// Offers entry `i`; entries must come in increasing index order (so an equal value
    /// never displaces an earlier one). NaN is never kept.
    #[inline]
    pub fn push(&mut self, i: usize, v: f32) {
        if self.cap == 0 {
            return;
        }
        if self.items.len() == self.cap {
            match self.items.last() {
                Some(w) if v > w.1 => {}
                _ => return,
            }
            self.items.pop();
        } else if v.is_nan() {
            return;
        }
        let pos = self.items.partition_point(|e| e.1 >= v);
        self.items.insert(pos, (i as u32, v));
    }
}

/// What one pass over a row finds.
pub(crate) struct Scan {
    /// Largest value (−∞ if every entry is −∞).
    pub max: f32,
    /// First index of `max`.
    pub argmax: usize,
    /// Whether some entry is NaN.
    pub nan: bool,
    /// The `n_top` best entries, by [`desc`].
    pub top: Vec<(u32, f32)>,
}

/// Max, first argmax, NaN check and the `n_top` best entries in one pass (lane-parallel
/// when `n_top` = 0).
pub(crate) fn scan(row: &Row, n_top: usize) -> Scan {
    if n_top == 0 {
        let (mut max, mut argmax, mut nan) = (f32::NEG_INFINITY, 0usize, false);
        // Segments come in index order: a later one wins only with a strictly larger value.
        let mut take = |m: f32, i: usize| {
            if m > max {
                (max, argmax) = (m, i);
            }
        };
        let mut start = 0;
        for &(id, v) in row.ov {
            let (m, i, n) = max_nan(&row.raw[start..id as usize]);
            take(m, start + i);
            take(v, id as usize);
            nan |= n | v.is_nan();
            start = id as usize + 1;
        }
        let (m, i, n) = max_nan(&row.raw[start..]);
        take(m, start + i);
        nan |= n;
        return Scan { max, argmax, nan, top: Vec::new() };
    }
    let (mut max, mut argmax, mut nan) = (f32::NEG_INFINITY, 0usize, false);
    let mut top = TopN::new(n_top);
    row.each(|i, v| {
        if v > max {
            max = v;
            argmax = i;
        }
        nan |= v.is_nan();
        top.push(i, v);
    });
    Scan { max, argmax, nan, top: top.items }
}

/// Largest value (NaN ignored), its first index, and whether a NaN occurs, over 8
/// independent lanes (each keeps its first maximum; the smallest index wins among equal lanes).
fn max_nan(xs: &[f32]) -> (f32, usize, bool) {
    const L: usize = 8;
    let (mut m, mut at, mut nan) = ([f32::NEG_INFINITY; L], [0u32; L], [0u32; L]);
    let chunks = xs.chunks_exact(L);
    let rest = chunks.remainder();
    for (c, base) in chunks.zip((0u32..).step_by(L)) {
        for j in 0..L {
            let x = c[j];
            let better = x > m[j];
            m[j] = if better { x } else { m[j] };
            at[j] = if better { base + j as u32 } else { at[j] };
            nan[j] |= x.is_nan() as u32;
        }
    }
    let (mut max, mut arg) = (f32::NEG_INFINITY, 0usize);
    for j in 0..L {
        if m[j] > max || (m[j] == max && (at[j] as usize) < arg) {
            (max, arg) = (m[j], at[j] as usize);
        }
    }
    let tail = xs.len() - rest.len();
    let mut any = nan.iter().any(|&n| n != 0);
    for (i, &x) in rest.iter().enumerate() {
        if x > max {
            (max, arg) = (x, tail + i);
        }
        any |= x.is_nan();
    }
    (max, arg, any)
}

/// The `k` best entries by [`desc`] (`k < len`).
pub(crate) fn top_k(row: &Row, k: usize) -> Vec<(u32, f32)> {
    if k <= SMALL_K {
        let mut top = TopN::new(k);
        row.each(|i, v| top.push(i, v));
        return top.items;
    }
    let mut all = Vec::with_capacity(row.len());
    row.each(|i, v| all.push((i as u32, v)));
    if k < all.len() {
        all.select_nth_unstable_by(k - 1, desc);
        all.truncate(k);
    }
    all.sort_unstable_by(desc);
    all
}

/// The unnormalised probability `exp(f64(v / t) − f64(ms))` (the scaled logit in float32, as
/// HF's warpers compute it, the rest in float64).
#[inline]
pub(crate) fn weight(v: f32, t: f32, ms: f32) -> f64 {
    ((v / t) as f64 - ms as f64).exp()
}

/// `Σ weight(v, t, ms)` over the row (in index order).
pub(crate) fn sum_exp(row: &Row, t: f32, ms: f32) -> f64 {
    let mut z = 0.0f64;
    row.each(|_, v| z += weight(v, t, ms));
    z
}

/// Entries whose scaled logit `f64(v / t) − f64(ms)` (the exponent of [`weight`]) is at
/// least `x_min`, in index order. Any threshold selects a prefix of the row's [`desc`] order.
pub(crate) fn gather(row: &Row, t: f32, ms: f32, x_min: f64) -> Vec<(u32, f32)> {
    let mut out = Vec::new();
    let ms = ms as f64;
    row.each(|i, v| {
        if (v / t) as f64 - ms >= x_min {
            out.push((i as u32, v));
        }
    });
    out
}

/// The top-p set: the shortest [`desc`]-prefix of `c` whose mass `Σ w(v) / z` reaches `tp`,
/// found by quickselect (expected O(len), no full sort); its entries in no particular order.
/// `c` must itself be a prefix of the row's [`desc`] order. `Err(c)` when all of `c` does not
/// reach `tp`.
pub(crate) fn nucleus(c: Vec<(u32, f32)>, z: f64, tp: f64, w: impl Fn(f32) -> f64) -> Result<Entries, Entries> {
    // Each candidate's normalised probability, computed once.
    let mut c: Vec<(u32, f32, f64)> = c.into_iter().map(|(i, v)| (i, v, w(v) / z)).collect();
    let total: f64 = c.iter().map(|e| e.2).sum();
    let strip = |c: Vec<(u32, f32, f64)>| c.into_iter().map(|e| (e.0, e.1)).collect::<Vec<_>>();
    if total < tp {
        return Err(strip(c));
    }
    let order = |a: &(u32, f32, f64), b: &(u32, f32, f64)| desc(&(a.0, a.1), &(b.0, b.1));
    // Invariant: c[..lo] are the lo best (mass `acc` < tp); the answer has length in (lo, hi].
    let (mut lo, mut hi, mut acc) = (0usize, c.len(), 0.0f64);
    while hi - lo > 64 {
        let mid = lo + (hi - lo) / 2;
        c[lo..hi].select_nth_unstable_by(mid - lo, order);
        let m: f64 = c[lo..=mid].iter().map(|e| e.2).sum();
        if acc + m >= tp {
            hi = mid + 1;
        } else {
            acc += m;
            lo = mid + 1;
        }
    }
    c[lo..hi].sort_unstable_by(order);
    for i in lo..hi {
        acc += c[i].2;
        if acc >= tp {
            c.truncate(i + 1);
            return Ok(strip(c));
        }
    }
    // Summation order left the total a hair below tp: the top `hi` reach it by construction.
    c.truncate(hi);
    Ok(strip(c))
}

//! Declarative weight maps: checkpoint tensor names → engine slots.
//!
//! A map is a TOML file in `weight-maps/` (one per model). Each `[[tensor]]` rule names
//! an engine `slot`, the checkpoint tensor(s) it comes `from`, the expected `shape` as
//! expressions over config values, an optional `when` condition and an optional
//! transform (`stack` over experts, `concat` of several tensors along dim 0).
//! `[[ignore]]` rules list checkpoint tensors that are deliberately not loaded (for
//! example a tied `lm_head.weight`, or the `mtp.*` tensors of a draft head that another
//! crate maps). Placeholders `{layer}` and `{expert}` expand over the layers and experts.
//! A map can start from a shared layout (`extends = "llama"`) and drop, override or add
//! rules: see [`crate::load::map_file`].
//!
//! ```toml
//! architecture = "Qwen3ForCausalLM"
//!
//! [[tensor]]
//! slot  = "layers.{layer}.attn.q_proj"
//! from  = "model.layers.{layer}.self_attn.q_proj.weight"
//! shape = ["num_attention_heads*head_dim", "hidden_size"]
//!
//! [[tensor]]
//! slot  = "layers.{layer}.moe.gate_proj"          # [num_experts, moe_intermediate_size, hidden_size]
//! from  = "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight"
//! shape = ["moe_intermediate_size", "hidden_size"]
//! stack = "expert"
//! when  = "moe_layer"
//! ```
//!
//! Resolution against a config gives a table (checkpoint name → slot, shape, transform)
//! that is snapshot-tested with insta; validation against a checkpoint reports every
//! missing, unexpected and mis-shaped tensor in one error.

use crate::error::{Context, Result};
use crate::load::checkpoint::Checkpoint;
use crate::load::map_file::{self, MapFile, ShardRule, TensorRule};
pub use crate::load::shard::{Shard, ShardAxis, TpRank};
pub use crate::load::weights::Weights;
use crate::tensor::dtype::DType;
use crate::{bail, err};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// A parsed weight map.
#[derive(Debug, Clone)]
pub struct WeightMap {
    file: MapFile,
}

/// Config values a map is resolved against: dims, global flags and per-layer flags.
///
/// [`MapContext::from_config`] takes every integer and boolean at the top level of
/// `config.json`; model crates add derived dims (for example a defaulted `head_dim`) and
/// per-layer flags (for example `moe_layer`).
#[derive(Debug, Clone, Default)]
pub struct MapContext {
    pub num_layers: usize,
    pub num_experts: usize,
    dims: BTreeMap<String, usize>,
    flags: BTreeMap<String, bool>,
    layer_flags: Vec<BTreeMap<String, bool>>,
}

impl MapContext {
    /// Dims and flags from the top level of a `config.json`.
    pub fn from_config(raw: &serde_json::Value, num_layers: usize, num_experts: usize) -> Self {
        let mut ctx = MapContext {
            num_layers,
            num_experts,
            layer_flags: vec![BTreeMap::new(); num_layers],
            ..Default::default()
        };
        if let Some(obj) = raw.as_object() {
            for (k, v) in obj {
                if let Some(n) = v.as_u64() {
                    ctx.dims.insert(k.clone(), n as usize);
                } else if let Some(b) = v.as_bool() {
                    ctx.flags.insert(k.clone(), b);
                }
            }
        }
        ctx
    }

    /// [`MapContext::from_config`] for a decoder of `num_experts` experts (0: dense) with the
    /// dims and flags the model class may default resolved from the parsed config: the sizes
    /// (`vocab_size`, `hidden_size`, `num_hidden_layers`, `num_attention_heads`,
    /// `intermediate_size`), `head_dim`, `num_key_value_heads`, `tie_word_embeddings` and
    /// `attention_bias` (an absent key is then its class default, not an unknown dim).
    pub fn decoder(
        raw: &serde_json::Value,
        base: &crate::load::config::DecoderConfig,
        kv_heads: usize,
        head_dim: usize,
        num_experts: usize,
    ) -> Self {
        let mut ctx = Self::from_config(raw, base.num_hidden_layers, num_experts);
        ctx.set_dim("head_dim", head_dim)
            .set_dim("num_key_value_heads", kv_heads)
            .set_dim("intermediate_size", base.intermediate_size)
            .set_dim("vocab_size", base.vocab_size)
            .set_dim("hidden_size", base.hidden_size)
            .set_dim("num_hidden_layers", base.num_hidden_layers)
            .set_dim("num_attention_heads", base.num_attention_heads);
        ctx.set_flag("tie_word_embeddings", base.tie_word_embeddings).set_flag("attention_bias", base.attention_bias);
        ctx
    }

    /// Sets (or overrides) a dim.
    pub fn set_dim(&mut self, name: &str, v: usize) -> &mut Self {
        self.dims.insert(name.to_owned(), v);
        self
    }

    /// Sets (or overrides) a global flag.
    pub fn set_flag(&mut self, name: &str, v: bool) -> &mut Self {
        self.flags.insert(name.to_owned(), v);
        self
    }

    /// Sets a per-layer flag.
    pub fn set_layer_flag(&mut self, layer: usize, name: &str, v: bool) -> &mut Self {
        if layer >= self.layer_flags.len() {
            self.layer_flags.resize(layer + 1, BTreeMap::new());
        }
        self.layer_flags[layer].insert(name.to_owned(), v);
        self
    }

    fn dim(&self, name: &str) -> Option<usize> {
        self.dims.get(name).copied()
    }

    /// Evaluates a shape expression: integers and dim names joined by `*` and `+`.
    fn eval(&self, expr: &str) -> Result<usize> {
        let mut total = 0usize;
        for term in expr.split('+') {
            let mut prod = 1usize;
            for f in term.split('*') {
                let f = f.trim();
                let v = match f.parse::<usize>() {
                    Ok(n) => n,
                    Err(_) => self
                        .dim(f)
                        .ok_or_else(|| err!(WeightMap, "shape expression `{expr}`: unknown config value `{f}`"))?,
                };
                prod *= v;
            }
            total += prod;
        }
        Ok(total)
    }

    /// Evaluates a condition: `a`, `!a`, `a && b`, `a || b` over flags (layer flags first).
    fn cond(&self, expr: &str, layer: Option<usize>) -> Result<bool> {
        let mut any = false;
        for alt in expr.split("||") {
            let mut all = true;
            for atom in alt.split("&&") {
                let atom = atom.trim();
                let (neg, name) = match atom.strip_prefix('!') {
                    Some(n) => (true, n.trim()),
                    None => (false, atom),
                };
                let v = layer
                    .and_then(|l| self.layer_flags.get(l).and_then(|f| f.get(name)).copied())
                    .or_else(|| self.flags.get(name).copied())
                    .ok_or_else(|| {
                        err!(
                            WeightMap,
                            "condition `{expr}`: unknown flag `{name}`{}",
                            if layer.is_some() { " (per-layer)" } else { "" }
                        )
                    })?;
                all &= v != neg;
            }
            any |= all;
        }
        Ok(any)
    }
}

/// How a slot is assembled from its sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transform {
    /// One tensor, loaded as is.
    Identity,
    /// Per-expert tensors stacked into `[num_experts, ...]`.
    StackExperts,
    /// Several tensors concatenated along dim 0.
    Concat,
    /// Rows `[groups, Σparts]` reordered part-major (see the `regroup` rule).
    Regroup { groups: usize, parts: Vec<usize> },
}

impl fmt::Display for Transform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transform::Identity => f.write_str("-"),
            Transform::StackExperts => f.write_str("stack(expert)"),
            Transform::Concat => f.write_str("concat(0)"),
            Transform::Regroup { groups, parts } => write!(f, "regroup({groups}x{parts:?})"),
        }
    }
}

/// One engine slot with the checkpoint tensors it is built from.
#[derive(Debug, Clone)]
pub struct ResolvedSlot {
    pub slot: String,
    /// Checkpoint names, in stacking / concatenation order.
    pub sources: Vec<String>,
    /// Expected shape of each source.
    pub source_shapes: Vec<Vec<usize>>,
    /// Shape of the assembled slot.
    pub shape: Vec<usize>,
    pub transform: Transform,
    /// How each source splits over tensor-parallel ranks (`None`: replicated).
    pub shard: Option<Shard>,
}

impl ResolvedSlot {
    /// The slot as rank `tp` loads it: each source cut to its shard (`source_shapes`, `shape`
    /// and a `regroup` made local), with the ranges to read. Replicated slots are unchanged.
    pub fn sharded(&self, tp: TpRank) -> Result<(ResolvedSlot, Option<Ranges>)> {
        let Some(sh) = self.shard.as_ref().filter(|_| tp.world > 1) else { return Ok((self.clone(), None)) };
        let ranges = sh.ranges(tp).with_context(|| format!("weight slot `{}`", self.slot))?;
        let n: usize = ranges.iter().map(|r| r.1).sum();
        let mut out = self.clone();
        for shp in &mut out.source_shapes {
            let d = match sh.axis {
                ShardAxis::Column => shp.first_mut(),
                ShardAxis::Row => shp.last_mut(),
            };
            if let Some(d) = d {
                *d = n;
            }
        }
        let src = out.source_shapes.first().cloned().unwrap_or_default();
        out.shape = match (&self.transform, sh.axis) {
            (Transform::StackExperts, _) => std::iter::once(self.shape[0]).chain(src).collect(),
            (Transform::Concat, ShardAxis::Column) => {
                let mut s = src;
                s[0] *= self.sources.len();
                s
            }
            (Transform::Concat, ShardAxis::Row) => {
                let mut s = self.shape.clone();
                if let Some(l) = s.last_mut() {
                    *l = n;
                }
                s
            }
            _ => src,
        };
        if let Transform::Regroup { .. } = self.transform {
            let (groups, parts) = sh.local_layout(tp);
            out.transform = Transform::Regroup { groups, parts };
        }
        Ok((out, Some(ranges)))
    }
}

/// `(start, len)` ranges along a shard's axis.
pub type Ranges = Vec<(usize, usize)>;

/// A checkpoint tensor that is deliberately not loaded.
#[derive(Debug, Clone)]
pub enum IgnoreSpec {
    Name { name: String, reason: String },
    Prefix { prefix: String, reason: String },
}

/// A map resolved against one config.
#[derive(Debug, Clone)]
pub struct ResolvedMap {
    pub architecture: String,
    pub slots: Vec<ResolvedSlot>,
    pub ignores: Vec<IgnoreSpec>,
}

/// Everything that is wrong between a resolved map and a checkpoint.
#[derive(Debug, Clone, Default, thiserror::Error)]
pub struct WeightMapError {
    /// `(name, expected shape)`
    pub missing: Vec<(String, Vec<usize>)>,
    /// `(name, expected shape, found shape)`
    pub mismatched: Vec<(String, Vec<usize>, Vec<usize>)>,
    /// `(name, found shape)`
    pub unexpected: Vec<(String, Vec<usize>)>,
}

impl WeightMapError {
    pub fn is_empty(&self) -> bool {
        self.missing.is_empty() && self.mismatched.is_empty() && self.unexpected.is_empty()
    }
}

/// At most this many names are listed per kind of problem; the rest are counted.
pub const MAX_LISTED: usize = 20;

impl fmt::Display for WeightMapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn more(f: &mut fmt::Formatter<'_>, total: usize) -> fmt::Result {
            if total > MAX_LISTED {
                writeln!(f, "    … and {} more", total - MAX_LISTED)?;
            }
            Ok(())
        }
        writeln!(f, "checkpoint does not match the weight map:")?;
        if !self.missing.is_empty() {
            writeln!(f, "  missing tensors ({}):", self.missing.len())?;
            for (n, s) in self.missing.iter().take(MAX_LISTED) {
                writeln!(f, "    {n}: expected {s:?}")?;
            }
            more(f, self.missing.len())?;
        }
        if !self.mismatched.is_empty() {
            writeln!(f, "  shape mismatches ({}):", self.mismatched.len())?;
            for (n, e, g) in self.mismatched.iter().take(MAX_LISTED) {
                writeln!(f, "    {n}: expected {e:?}, found {g:?}")?;
            }
            more(f, self.mismatched.len())?;
        }
        if !self.unexpected.is_empty() {
            writeln!(f, "  unexpected tensors ({}):", self.unexpected.len())?;
            for (n, s) in self.unexpected.iter().take(MAX_LISTED) {
                writeln!(f, "    {n}: {s:?}")?;
            }
            more(f, self.unexpected.len())?;
        }
        Ok(())
    }
}

impl WeightMap {
    /// Parses a map file's text (applying the layout it `extends`, see [`crate::load::map_file`]).
    pub fn parse(text: &str) -> Result<Self> {
        Ok(Self { file: map_file::parse(text)? })
    }

    pub fn architecture(&self) -> &str {
        &self.file.architecture
    }

    /// Expands placeholders and conditions for one config.
    pub fn resolve(&self, ctx: &MapContext) -> Result<ResolvedMap> {
        let mut slots = Vec::new();
        for rule in &self.file.tensor {
            let per_layer = rule.slot.contains("{layer}") || rule.from.list().iter().any(|f| f.contains("{layer}"));
            let layers: Vec<Option<usize>> =
                if per_layer { (0..ctx.num_layers).map(Some).collect() } else { vec![None] };
            for layer in layers {
                if let Some(w) = &rule.when {
                    if !ctx.cond(w, layer).with_context(|| format!("rule `{}`", rule.slot))? {
                        continue;
                    }
                }
                // Shapes are evaluated only for rules that apply (a dense config has no
                // `num_experts`, say).
                let shape: Vec<usize> = rule
                    .shape
                    .iter()
                    .map(|e| ctx.eval(e))
                    .collect::<Result<_>>()
                    .with_context(|| format!("rule `{}`", rule.slot))?;
                let sub = |s: &str| match layer {
                    Some(l) => s.replace("{layer}", &l.to_string()),
                    None => s.to_owned(),
                };
                let slot = sub(&rule.slot);
                if rule.stack.is_some() {
                    let pattern = sub(&rule.from.list()[0]);
                    let sources: Vec<String> =
                        (0..ctx.num_experts).map(|e| pattern.replace("{expert}", &e.to_string())).collect();
                    let mut full = vec![ctx.num_experts];
                    full.extend_from_slice(&shape);
                    let shard = resolve_shard(rule, ctx, &shape, None)?;
                    slots.push(ResolvedSlot {
                        slot,
                        source_shapes: vec![shape.clone(); sources.len()],
                        sources,
                        shape: full,
                        transform: Transform::StackExperts,
                        shard,
                    });
                } else {
                    let sources: Vec<String> = rule.from.list().iter().map(|s| sub(s)).collect();
                    let (transform, full) = if let Some(rg) = &rule.regroup {
                        let groups = ctx.eval(&rg.groups)?;
                        let parts: Vec<usize> = rg.parts.iter().map(|e| ctx.eval(e)).collect::<Result<_>>()?;
                        let rows = groups * parts.iter().sum::<usize>();
                        if shape.first() != Some(&rows) {
                            bail!(
                                WeightMap,
                                "rule `{}`: regroup {groups}x{parts:?} needs {rows} rows, the shape says {:?}",
                                rule.slot,
                                shape
                            );
                        }
                        (Transform::Regroup { groups, parts }, shape.clone())
                    } else if sources.len() > 1 {
                        let mut full = shape.clone();
                        if let Some(d0) = full.first_mut() {
                            *d0 *= sources.len();
                        }
                        (Transform::Concat, full)
                    } else {
                        (Transform::Identity, shape.clone())
                    };
                    let regroup = match &transform {
                        Transform::Regroup { groups, parts } => Some((*groups, parts.clone())),
                        _ => None,
                    };
                    let shard = resolve_shard(rule, ctx, &shape, regroup)?;
                    slots.push(ResolvedSlot {
                        slot,
                        source_shapes: vec![shape.clone(); sources.len()],
                        sources,
                        shape: full,
                        transform,
                        shard,
                    });
                }
            }
        }
        let mut seen = BTreeSet::new();
        for s in &slots {
            if !seen.insert(s.slot.clone()) {
                bail!(WeightMap, "weight map for {}: slot `{}` is produced by two rules", self.architecture(), s.slot);
            }
        }
        let mut ignores = Vec::new();
        for rule in &self.file.ignore {
            if let Some(w) = &rule.when {
                if !ctx.cond(w, None)? {
                    continue;
                }
            }
            let reason = rule.reason.clone().unwrap_or_default();
            match (&rule.from, &rule.prefix) {
                (Some(n), None) => ignores.push(IgnoreSpec::Name { name: n.clone(), reason }),
                (None, Some(p)) => ignores.push(IgnoreSpec::Prefix { prefix: p.clone(), reason }),
                _ => bail!(WeightMap, "weight map ignore rule needs exactly one of `from` or `prefix`"),
            }
        }
        Ok(ResolvedMap { architecture: self.architecture().to_owned(), slots, ignores })
    }
}

/// Evaluates a rule's `shard` against the shape of its sources (and its `regroup`, whose groups
/// and parts a shard table on the same rule defaults to).
fn resolve_shard(
    rule: &TensorRule,
    ctx: &MapContext,
    shape: &[usize],
    regroup: Option<(usize, Vec<usize>)>,
) -> Result<Option<Shard>> {
    let Some(r) = &rule.shard else { return Ok(None) };
    let what = || format!("rule `{}`: shard", rule.slot);
    let axis = match r {
        ShardRule::Plain(p) if p == "row" => ShardAxis::Row,
        ShardRule::Grouped(g) if g.row.is_some() => ShardAxis::Row,
        _ => ShardAxis::Column,
    };
    let len = match axis {
        ShardAxis::Column => shape.first(),
        ShardAxis::Row => shape.last(),
    }
    .copied()
    .unwrap_or(1);
    let sh = match r {
        ShardRule::Plain(_) => Shard::plain(axis, len),
        ShardRule::Grouped(g) => {
            let expr = g.column.as_ref().or(g.row.as_ref()).ok_or_else(|| err!(WeightMap, "{}: no axis", what()))?;
            let groups = ctx.eval(expr).with_context(what)?;
            let parts: Vec<usize> = if !g.parts.is_empty() {
                g.parts.iter().map(|e| ctx.eval(e)).collect::<Result<_>>().with_context(what)?
            } else if let Some((_, p)) = regroup.as_ref().filter(|(rg, _)| *rg == groups) {
                p.clone()
            } else if groups > 0 && len.is_multiple_of(groups) {
                vec![len / groups]
            } else {
                bail!(WeightMap, "{}: {len} elements do not form {groups} groups", what());
            };
            let split = if g.split.is_empty() { vec![false; parts.len()] } else { g.split.clone() };
            if split.len() != parts.len() {
                bail!(WeightMap, "{}: `split` needs one flag per part ({} parts)", what(), parts.len());
            }
            Shard { axis, groups, parts, split, part_major: g.part_major }
        }
    };
    if sh.len() != len {
        bail!(
            WeightMap,
            "{}: {} groups of {:?} cover {} elements, the tensor has {len}",
            what(),
            sh.groups,
            sh.parts,
            sh.len()
        );
    }
    if let Some((groups, parts)) = &regroup {
        if sh.axis != ShardAxis::Column || sh.part_major || sh.groups != *groups || &sh.parts != parts {
            bail!(WeightMap, "{}: a regrouped tensor splits by its regroup's groups and parts", what());
        }
    }
    Ok(Some(sh))
}

impl ResolvedMap {
    fn is_ignored(&self, name: &str) -> bool {
        self.ignores.iter().any(|i| match i {
            IgnoreSpec::Name { name: n, .. } => n == name,
            IgnoreSpec::Prefix { prefix, .. } => name.starts_with(prefix.as_str()),
        })
    }

    /// The table "checkpoint name → engine slot, shape, transform", one line per
    /// checkpoint tensor, in map order; ignore rules at the end.
    pub fn render_table(&self) -> String {
        let mut out = format!("# {}\n", self.architecture);
        for s in &self.slots {
            for (i, (src, shp)) in s.sources.iter().zip(&s.source_shapes).enumerate() {
                let target = match s.transform {
                    Transform::StackExperts | Transform::Concat => format!("{}[{i}]", s.slot),
                    Transform::Identity | Transform::Regroup { .. } => s.slot.clone(),
                };
                let tp = s.shard.as_ref().map(|t| format!(" {t}")).unwrap_or_default();
                out.push_str(&format!("{src} -> {target} {shp:?} {}{tp}\n", s.transform));
            }
        }
        for i in &self.ignores {
            match i {
                IgnoreSpec::Name { name, reason } => out.push_str(&format!("{name} -> (ignored) {reason}\n")),
                IgnoreSpec::Prefix { prefix, reason } => out.push_str(&format!("{prefix}* -> (ignored) {reason}\n")),
            }
        }
        out
    }

    /// Checks the checkpoint against the map: every source present with the right shape,
    /// every checkpoint tensor consumed or ignored.
    pub fn validate(&self, ckpt: &Checkpoint) -> std::result::Result<(), WeightMapError> {
        let mut err = WeightMapError::default();
        let mut used = BTreeSet::new();
        for s in &self.slots {
            for (src, shp) in s.sources.iter().zip(&s.source_shapes) {
                used.insert(src.as_str());
                match ckpt.get(src) {
                    None => err.missing.push((src.clone(), shp.clone())),
                    Some(info) if &info.shape != shp => {
                        err.mismatched.push((src.clone(), shp.clone(), info.shape.clone()))
                    }
                    Some(_) => {}
                }
            }
        }
        // FP8 weights bring their block scales (`X.weight_scale_inv`, [ceil(out/128),
        // ceil(in/128)] f32), declared here once for every model.
        let scales: Vec<(String, Vec<usize>)> = used
            .iter()
            .filter(|src| ckpt.is_fp8(src))
            .filter_map(|src| ckpt.get(src).map(|i| (crate::load::quant::scale_name(src), i.shape.clone())))
            .collect();
        for (scale, wshape) in &scales {
            let want = crate::load::quant::scale_shape(wshape);
            match ckpt.get(scale) {
                None => err.missing.push((scale.clone(), want)),
                Some(info) if info.shape != want || wshape.len() != 2 => {
                    err.mismatched.push((scale.clone(), want, info.shape.clone()))
                }
                Some(info) if info.dtype != safetensors::Dtype::F32 => err.mismatched.push((
                    format!("{scale} (dtype {:?}, expected F32)", info.dtype),
                    want,
                    info.shape.clone(),
                )),
                Some(_) => {}
            }
        }
        let scale_names: BTreeSet<&str> = scales.iter().map(|(s, _)| s.as_str()).collect();
        for (name, info) in ckpt.tensors() {
            if !used.contains(name.as_str()) && !scale_names.contains(name.as_str()) && !self.is_ignored(name) {
                err.unexpected.push((name.clone(), info.shape.clone()));
            }
        }
        if err.is_empty() {
            Ok(())
        } else {
            Err(err)
        }
    }

    /// Number of checkpoint tensors the map consumes, and the number it ignores.
    pub fn coverage(&self, ckpt: &Checkpoint) -> (usize, usize) {
        let used: BTreeSet<&str> = self.slots.iter().flat_map(|s| s.sources.iter().map(String::as_str)).collect();
        // An FP8 weight's scale tensor is consumed with it.
        let is_used = |n: &str| {
            used.contains(n)
                || n.strip_suffix(crate::load::quant::SCALE_SUFFIX).is_some_and(|w| used.contains(w) && ckpt.is_fp8(w))
        };
        let consumed = ckpt.tensors().keys().filter(|n| is_used(n)).count();
        let ignored = ckpt.tensors().keys().filter(|n| !is_used(n) && self.is_ignored(n)).count();
        (consumed, ignored)
    }

    /// Validates the checkpoint against the map and returns the slots, read when taken.
    pub fn load(&self, ckpt: std::sync::Arc<Checkpoint>, dtype: DType) -> Result<Weights> {
        Weights::from_checkpoint(self, ckpt, dtype)
    }
}

pub use crate::tensor::regroup_rows;

impl From<WeightMapError> for crate::error::Error {
    fn from(e: WeightMapError) -> Self {
        crate::error::Error::WeightMap(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regroup_deinterleaves() {
        // 2 groups of [a(1), b(2)] rows, 1 column: [a0 b0 b0' a1 b1 b1'] -> [a0 a1 b0 b0' b1 b1']
        let d = [10.0, 20.0, 21.0, 11.0, 30.0, 31.0];
        assert_eq!(regroup_rows(&d, 2, &[1, 2], 1), vec![10.0, 11.0, 20.0, 21.0, 30.0, 31.0]);
    }

    #[test]
    fn conditions_and_expressions() {
        let mut ctx = MapContext::from_config(&serde_json::json!({"a": 3, "b": 4, "f": true}), 2, 0);
        ctx.set_layer_flag(1, "g", true).set_layer_flag(0, "g", false);
        assert_eq!(ctx.eval("a*b+2").unwrap(), 14);
        assert!(ctx.eval("nope").is_err());
        assert!(ctx.cond("f && g", Some(1)).unwrap());
        assert!(!ctx.cond("f && g", Some(0)).unwrap());
        assert!(ctx.cond("!f || g", Some(1)).unwrap());
        assert!(ctx.cond("missing", None).is_err());
    }

    #[test]
    fn long_lists_are_capped() {
        let names = |n: usize| (0..n).map(|i| (format!("t.{i}"), vec![i])).collect::<Vec<_>>();
        let e = WeightMapError {
            missing: names(1000),
            mismatched: (0..25).map(|i| (format!("m.{i}"), vec![1], vec![2])).collect(),
            unexpected: names(3),
        };
        let text = e.to_string();
        assert!(text.contains("missing tensors (1000):") && text.contains("t.19: expected [19]"), "{text}");
        assert!(!text.contains("t.20:") && text.contains("… and 980 more"), "{text}");
        assert!(text.contains("shape mismatches (25):") && text.contains("… and 5 more"), "{text}");
        assert!(text.contains("unexpected tensors (3):") && text.ends_with("    t.2: [2]\n"), "{text}");
        assert_eq!(text.lines().count(), 1 + (1 + 20 + 1) + (1 + 20 + 1) + (1 + 3));
    }
}

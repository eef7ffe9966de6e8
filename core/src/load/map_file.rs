//! The weight-map file format: rules as written in `weight-maps/*.toml`, shared layouts and
//! `extends`.
//!
//! A map may start from a shared **layout** (`weight-maps/layouts/NAME.toml`, embedded at
//! compile time) with `extends = "NAME"`, and then change it:
//!
//! - **drop** rules: `drop = ["layers.{layer}.mlp.*.bias"]` removes every layout rule whose
//!   slot matches a pattern (`*` matches any run of characters). A pattern that matches no
//!   rule is an error.
//! - **override** a rule: a `[[tensor]]` whose `slot` is a layout rule's slot replaces only the
//!   fields it gives (`when = "!moe_layer"`, say) and keeps the rule's place.
//! - **add** rules: any other `[[tensor]]` is a full rule (`from` and `shape` required),
//!   appended, or placed with `before = "SLOT"` / `after = "SLOT"` (a slot of the layout or of
//!   a rule added earlier).
//!
//! A rule may carry a tensor-parallel plan, `shard = "column"`, `"row"` or a table
//! `{ column|row = "GROUPS", parts = [...], split = [...], part_major = bool }`
//! ([`crate::load::shard`]); an override replaces the layout rule's plan.
//!
//! `[[ignore]]` rules of the map are added after the layout's. A layout names no
//! `architecture` and extends nothing; the map that extends it names the architecture.
//!
//! ```toml
//! architecture = "Qwen3ForCausalLM"
//! extends = "llama"
//! drop = ["layers.{layer}.mlp.*.bias"]
//!
//! [[tensor]]
//! slot = "layers.{layer}.attn.q_norm"
//! from = "model.layers.{layer}.self_attn.q_norm.weight"
//! shape = ["head_dim"]
//! before = "layers.{layer}.post_norm"
//! ```

use crate::error::{Context, Result};
use crate::{bail, err};
use serde::Deserialize;

/// The shared layouts a map can extend: `(name, text)`.
const LAYOUTS: &[(&str, &str)] = &[("llama", include_str!("../../../weight-maps/layouts/llama.toml"))];

/// One or several names in a rule.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub(crate) fn list(&self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

/// A complete tensor rule.
#[derive(Debug, Clone)]
pub(crate) struct TensorRule {
    pub(crate) slot: String,
    pub(crate) from: OneOrMany,
    /// Shape of each source tensor, one expression per dim.
    pub(crate) shape: Vec<String>,
    pub(crate) when: Option<String>,
    /// `"expert"`: stack the per-expert tensors into `[num_experts, ...]`.
    pub(crate) stack: Option<String>,
    /// De-interleave rows: the rows form `groups` blocks of `parts` rows each; the result
    /// holds part 0 of every group, then part 1 of every group, and so on.
    pub(crate) regroup: Option<RegroupRule>,
    /// How the sources split over tensor-parallel ranks (absent: replicated).
    pub(crate) shard: Option<ShardRule>,
}

/// `shard = "column" | "row"`, or a table naming the axis by its group count:
/// `{ column = "num_key_value_heads" }`, `{ row = "G", parts = ["p0", "p1"], split = [true, false],
/// part_major = true }` (see [`crate::load::shard`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum ShardRule {
    Plain(String),
    Grouped(GroupedShard),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GroupedShard {
    pub(crate) column: Option<String>,
    pub(crate) row: Option<String>,
    /// Elements of each part of a group (default: one part, the whole group).
    #[serde(default)]
    pub(crate) parts: Vec<String>,
    /// Per part: cut among ranks sharing a group (default: replicated).
    #[serde(default)]
    pub(crate) split: Vec<bool>,
    #[serde(default)]
    pub(crate) part_major: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RegroupRule {
    pub(crate) groups: String,
    pub(crate) parts: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct IgnoreRule {
    #[serde(default)]
    pub(crate) from: Option<String>,
    #[serde(default)]
    pub(crate) prefix: Option<String>,
    #[serde(default)]
    pub(crate) when: Option<String>,
    /// Why the tensor is not loaded (shown by `porter inspect`).
    #[serde(default)]
    pub(crate) reason: Option<String>,
}

/// A map with its layout applied: the rules in resolution order.
#[derive(Debug, Clone)]
pub(crate) struct MapFile {
    pub(crate) architecture: String,
    pub(crate) tensor: Vec<TensorRule>,
    pub(crate) ignore: Vec<IgnoreRule>,
}

/// A `[[tensor]]` entry as written: complete, or an override of a layout rule.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    slot: String,
    from: Option<OneOrMany>,
    shape: Option<Vec<String>>,
    when: Option<String>,
    stack: Option<String>,
    regroup: Option<RegroupRule>,
    shard: Option<ShardRule>,
    before: Option<String>,
    after: Option<String>,
}

impl RawRule {
    /// The rule as a complete one (`from` and `shape` required, no placement).
    fn complete(self, what: &str) -> Result<TensorRule> {
        if self.before.is_some() || self.after.is_some() {
            bail!(WeightMap, "{what}: rule `{}`: `before` / `after` need `extends`", self.slot);
        }
        let (Some(from), Some(shape)) = (self.from, self.shape) else {
            bail!(WeightMap, "{what}: rule `{}` needs `from` and `shape`", self.slot);
        };
        Ok(TensorRule {
            slot: self.slot,
            from,
            shape,
            when: self.when,
            stack: self.stack,
            regroup: self.regroup,
            shard: self.shard,
        })
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    architecture: Option<String>,
    extends: Option<String>,
    #[serde(default)]
    drop: Vec<String>,
    #[serde(default)]
    tensor: Vec<RawRule>,
    #[serde(default)]
    ignore: Vec<IgnoreRule>,
}

/// `pattern` with `*` matching any run of characters, against the whole of `s`.
fn glob(pattern: &str, s: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = s.strip_prefix(first) else { return false };
    let mut parts: Vec<&str> = parts.collect();
    let Some(last) = parts.pop() else { return rest.is_empty() };
    for p in parts {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// The layout `name` with its rules complete.
fn layout(name: &str) -> Result<(Vec<TensorRule>, Vec<IgnoreRule>)> {
    let Some((_, text)) = LAYOUTS.iter().find(|(n, _)| *n == name) else {
        let known: Vec<&str> = LAYOUTS.iter().map(|(n, _)| *n).collect();
        bail!(WeightMap, "weight map extends unknown layout `{name}` (known: {})", known.join(", "));
    };
    let what = format!("layout `{name}`");
    let raw: RawFile = toml::from_str(text).with_context(|| format!("parsing weight-map {what}"))?;
    if raw.architecture.is_some() || raw.extends.is_some() || !raw.drop.is_empty() {
        bail!(WeightMap, "{what}: a layout has no `architecture`, `extends` or `drop`");
    }
    let rules = raw.tensor.into_iter().map(|r| r.complete(&what)).collect::<Result<_>>()?;
    Ok((rules, raw.ignore))
}

/// Applies a map's drops, overrides and additions to its layout.
fn extend(name: &str, raw: RawFile) -> Result<(Vec<TensorRule>, Vec<IgnoreRule>)> {
    let (mut rules, mut ignore) = layout(name)?;
    for pattern in &raw.drop {
        let before = rules.len();
        rules.retain(|r| !glob(pattern, &r.slot));
        if rules.len() == before {
            bail!(WeightMap, "drop pattern `{pattern}` matches no rule of layout `{name}`");
        }
    }
    for r in raw.tensor {
        if let Some(base) = rules.iter_mut().find(|b| b.slot == r.slot) {
            if r.before.is_some() || r.after.is_some() {
                bail!(WeightMap, "rule `{}` overrides a layout rule, which keeps its place", r.slot);
            }
            base.from = r.from.unwrap_or_else(|| base.from.clone());
            base.shape = r.shape.unwrap_or_else(|| base.shape.clone());
            base.when = r.when.or(base.when.take());
            base.stack = r.stack.or(base.stack.take());
            base.regroup = r.regroup.or(base.regroup.take());
            base.shard = r.shard.or(base.shard.take());
            continue;
        }
        let place = match (&r.before, &r.after) {
            (Some(_), Some(_)) => bail!(WeightMap, "rule `{}`: give `before` or `after`, not both", r.slot),
            (Some(s), None) | (None, Some(s)) => {
                let i = rules
                    .iter()
                    .position(|b| &b.slot == s)
                    .ok_or_else(|| err!(WeightMap, "rule `{}`: no rule `{s}` to place it next to", r.slot))?;
                Some(if r.before.is_some() { i } else { i + 1 })
            }
            (None, None) => None,
        };
        let rule = RawRule { before: None, after: None, ..r }.complete(&format!("map extending `{name}`"))?;
        match place {
            Some(i) => rules.insert(i, rule),
            None => rules.push(rule),
        }
    }
    ignore.extend(raw.ignore);
    Ok((rules, ignore))
}

/// Parses a map file's text, applies its layout and checks every rule.
pub(crate) fn parse(text: &str) -> Result<MapFile> {
    let raw: RawFile = toml::from_str(text).context("parsing weight map")?;
    let architecture = raw.architecture.clone().ok_or_else(|| err!(WeightMap, "weight map has no `architecture`"))?;
    let (tensor, ignore) = match raw.extends.clone() {
        Some(name) => extend(&name, raw)?,
        None => {
            if !raw.drop.is_empty() {
                bail!(WeightMap, "weight map for {architecture}: `drop` needs `extends`");
            }
            let what = format!("weight map for {architecture}");
            (raw.tensor.into_iter().map(|r| r.complete(&what)).collect::<Result<_>>()?, raw.ignore)
        }
    };
    for r in &tensor {
        if let Some(s) = &r.stack {
            if s != "expert" {
                bail!(WeightMap, "weight map rule `{}`: unknown stack axis `{s}` (only `expert`)", r.slot);
            }
        }
        if r.regroup.is_some() && (r.stack.is_some() || matches!(r.from, OneOrMany::Many(_))) {
            bail!(WeightMap, "weight map rule `{}`: `regroup` applies to a single tensor", r.slot);
        }
        match &r.shard {
            Some(ShardRule::Plain(p)) if p != "column" && p != "row" => {
                bail!(WeightMap, "weight map rule `{}`: unknown shard `{p}` (`column`, `row` or a table)", r.slot)
            }
            Some(ShardRule::Grouped(g)) if g.column.is_some() == g.row.is_some() => {
                bail!(WeightMap, "weight map rule `{}`: a shard table names exactly one of `column` / `row`", r.slot)
            }
            _ => {}
        }
        if r.stack.is_some() && matches!(r.from, OneOrMany::Many(_)) {
            bail!(WeightMap, "weight map rule `{}`: `stack` and a list of sources cannot be combined", r.slot);
        }
    }
    Ok(MapFile { architecture, tensor, ignore })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(text: &str) -> Vec<String> {
        parse(text).unwrap().tensor.into_iter().map(|r| r.slot).collect()
    }

    #[test]
    fn glob_matches_whole_slots() {
        assert!(glob("*.bias", "layers.{layer}.attn.q_proj.bias"));
        assert!(glob("layers.{layer}.mlp.*.bias", "layers.{layer}.mlp.up_proj.bias"));
        assert!(!glob("layers.{layer}.mlp.*.bias", "layers.{layer}.attn.q_proj.bias"));
        assert!(glob("embed", "embed") && !glob("embed", "embedding") && !glob("a*a", "a"));
    }

    #[test]
    fn plain_llama_is_the_layout() {
        let s = slots("architecture = \"LlamaForCausalLM\"\nextends = \"llama\"\n");
        assert_eq!(s.len(), 19);
        assert_eq!(&s[..4], ["embed", "lm_head", "norm", "layers.{layer}.input_norm"]);
        assert_eq!(parse("architecture = \"X\"\nextends = \"llama\"\n").unwrap().ignore.len(), 1);
    }

    #[test]
    fn drop_override_and_place() {
        let m = parse(
            r#"
architecture = "X"
extends = "llama"
drop = ["*.bias"]
[[tensor]]
slot = "layers.{layer}.mlp.up_proj"
when = "dense"
[[tensor]]
slot = "layers.{layer}.attn.q_norm"
from = "q_norm"
shape = ["head_dim"]
before = "layers.{layer}.post_norm"
[[tensor]]
slot = "layers.{layer}.attn.k_norm"
from = "k_norm"
shape = ["head_dim"]
after = "layers.{layer}.attn.q_norm"
[[tensor]]
slot = "extra"
from = "extra.weight"
shape = ["hidden_size"]
"#,
        )
        .unwrap();
        let s: Vec<&str> = m.tensor.iter().map(|r| r.slot.as_str()).collect();
        assert!(!s.iter().any(|s| s.ends_with(".bias")));
        let o = s.iter().position(|s| *s == "layers.{layer}.attn.o_proj").unwrap();
        assert_eq!(
            &s[o + 1..o + 4],
            ["layers.{layer}.attn.q_norm", "layers.{layer}.attn.k_norm", "layers.{layer}.post_norm"]
        );
        assert_eq!(s.last(), Some(&"extra"));
        let up = m.tensor.iter().find(|r| r.slot == "layers.{layer}.mlp.up_proj").unwrap();
        assert_eq!((up.when.as_deref(), up.shape[0].as_str()), (Some("dense"), "intermediate_size"));
    }

    /// Shard plans parse, an override replaces one, and malformed plans are errors.
    #[test]
    fn shard_plans() {
        let m = parse(
            "architecture = \"X\"\nextends = \"llama\"\n[[tensor]]\nslot = \"layers.{layer}.mlp.down_proj\"\nshard = { row = \"g\", parts = [\"p\"], split = [true] }\n",
        )
        .unwrap();
        let down = m.tensor.iter().find(|r| r.slot == "layers.{layer}.mlp.down_proj").unwrap();
        assert!(matches!(&down.shard, Some(ShardRule::Grouped(g)) if g.row.as_deref() == Some("g")));
        let lm = m.tensor.iter().find(|r| r.slot == "lm_head").unwrap();
        assert!(matches!(&lm.shard, Some(ShardRule::Plain(p)) if p == "column"));
        for (plan, needle) in [
            ("\"diagonal\"", "unknown shard `diagonal`"),
            ("{ column = \"a\", row = \"b\" }", "exactly one of"),
            ("{ parts = [\"a\"] }", "exactly one of"),
        ] {
            let text = format!(
                "architecture = \"X\"\n[[tensor]]\nslot = \"a\"\nfrom = \"a\"\nshape = [\"n\"]\nshard = {plan}\n"
            );
            let e = parse(&text).expect_err(plan).to_string();
            assert!(e.contains(needle), "{plan}: {e}");
        }
    }

    #[test]
    fn bad_extensions_are_errors() {
        let bad = [
            ("architecture = \"X\"\nextends = \"gpt\"\n", "unknown layout `gpt`"),
            ("architecture = \"X\"\nextends = \"llama\"\ndrop = [\"nope*\"]\n", "matches no rule"),
            ("architecture = \"X\"\ndrop = [\"embed\"]\n", "`drop` needs `extends`"),
            ("extends = \"llama\"\n", "no `architecture`"),
            ("architecture = \"X\"\nextends = \"llama\"\n[[tensor]]\nslot = \"new\"\nwhen = \"a\"\n", "needs `from` and `shape`"),
            (
                "architecture = \"X\"\nextends = \"llama\"\n[[tensor]]\nslot = \"n\"\nfrom = \"n\"\nshape = []\nafter = \"zz\"\n",
                "no rule `zz`",
            ),
            (
                "architecture = \"X\"\nextends = \"llama\"\n[[tensor]]\nslot = \"embed\"\nbefore = \"norm\"\n",
                "keeps its place",
            ),
            ("architecture = \"X\"\n[[tensor]]\nslot = \"a\"\nfrom = \"a\"\nshape = []\nafter = \"b\"\n", "need `extends`"),
        ];
        for (text, needle) in bad {
            let e = parse(text).expect_err(text).to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }
}

//! Launch diagnostics for measuring where a graphed decode step's time goes (no hardware
//! counters or Nsight Systems on the GPU machine): [`KNOCKOUT_ENV`] leaves chosen kernels out
//! so that the step time's drop is their marginal cost *in place* (with programmatic dependent
//! launch a kernel's own duration overlaps its neighbours, so a kernel timed alone says little
//! about what it costs the step); [`KNOCKIN_ENV`] issues them twice (the clean reading for an
//! idempotent kernel); [`LAUNCH_TRACE_ENV`] prints the launches, to find the names and grids.
//! All are for `porter bench` runs only (`CudaKernels::launches` applies them): a knocked-out
//! kernel's outputs are whatever its buffers held, so logits and tokens are wrong.

use std::sync::OnceLock;

/// Environment variable (diagnostic; **the outputs are wrong** while it is set): a
/// comma-separated list of rules `name` or `name@gx`; a launch whose entry-point name contains
/// `name` (and, with `@gx`, whose grid's x dimension is `gx`) is skipped.
pub const KNOCKOUT_ENV: &str = "PORTER_KNOCKOUT";

/// Environment variable (diagnostic; outputs are wrong where a launch is not idempotent): the
/// same rules as [`KNOCKOUT_ENV`]; a matching launch is issued twice. For an idempotent kernel
/// (one that does not read what it writes, such as the MoE router) the step time's rise is
/// its cost in place with its inputs and outputs intact, where a knockout would change what
/// the kernels after it do (stale expert ids).
pub const KNOCKIN_ENV: &str = "PORTER_KNOCKIN";

/// Environment variable (diagnostic): `n` prints the first `n` launches of the process to
/// stderr, one line each: entry point, grid, block, dynamic shared memory.
pub const LAUNCH_TRACE_ENV: &str = "PORTER_LAUNCH_TRACE";

/// One knockout rule: a name substring and an optional grid x dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Substring of the entry point's name.
    pub name: String,
    /// The grid's x dimension, when given (`name@gx`).
    pub grid_x: Option<u32>,
}

/// Parses [`KNOCKOUT_ENV`]'s value.
///
/// # Errors
/// The offending item's text, for an empty name or a grid that is not a count.
pub fn parse_rules(v: &str) -> Result<Vec<Rule>, String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| {
            let (name, gx) = match item.split_once('@') {
                Some((n, g)) => (n.trim(), Some(g.trim().parse::<u32>().map_err(|_| item.to_string())?)),
                None => (item, None),
            };
            if name.is_empty() {
                return Err(item.to_string());
            }
            Ok(Rule { name: name.to_string(), grid_x: gx })
        })
        .collect()
}

/// The process's diagnostics, read once: knockout rules and the trace budget.
pub(crate) struct Diag {
    pub rules: Vec<Rule>,
    pub twice: Vec<Rule>,
    pub trace: usize,
}

/// The rules of environment variable `var` (none, with a warning, when it does not parse).
fn rules_of(var: &str, what: &str) -> Vec<Rule> {
    let rules = match std::env::var(var) {
        Ok(v) => parse_rules(&v).unwrap_or_else(|bad| {
            eprintln!("warning: {var}: {bad:?} is not `name` or `name@grid_x`; ignored");
            Vec::new()
        }),
        Err(_) => Vec::new(),
    };
    if !rules.is_empty() {
        eprintln!("warning: {var} {what} every launch matching {rules:?} (timing diagnostic only)");
    }
    rules
}

pub(crate) fn diag() -> &'static Diag {
    static D: OnceLock<Diag> = OnceLock::new();
    D.get_or_init(|| {
        let rules = rules_of(KNOCKOUT_ENV, "leaves out (outputs are WRONG)");
        let twice = rules_of(KNOCKIN_ENV, "issues twice");
        let trace = super::env_count(LAUNCH_TRACE_ENV, |_| true, "a launch count").unwrap_or(0);
        Diag { rules, twice, trace }
    })
}

impl Diag {
    /// Whether any diagnostic is on (the launch path looks no further otherwise).
    pub fn active(&self) -> bool {
        !self.rules.is_empty() || !self.twice.is_empty() || self.trace > 0
    }

    /// Whether a launch of `name` with grid x `gx` is knocked out.
    pub fn skips(&self, name: &str, gx: u32) -> bool {
        matches(&self.rules, name, gx)
    }

    /// Whether a launch of `name` with grid x `gx` is issued twice.
    pub fn doubles(&self, name: &str, gx: u32) -> bool {
        matches(&self.twice, name, gx)
    }
}

fn matches(rules: &[Rule], name: &str, gx: u32) -> bool {
    rules.iter().any(|r| name.contains(r.name.as_str()) && r.grid_x.is_none_or(|g| g == gx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_and_match() {
        let r = parse_rules(" moe_dir_down , gemv_bf16@1544,,").expect("valid");
        assert_eq!(r.len(), 2);
        let d = Diag { rules: r.clone(), twice: r, trace: 0 };
        assert!(d.doubles("moe_dir_down_sh_bf16", 256));
        assert!(d.active());
        assert!(d.skips("moe_dir_down_sh_bf16", 256));
        assert!(d.skips("gemv_bf16_x", 1544));
        assert!(!d.skips("gemv_bf16_x", 1543));
        assert!(!d.skips("rms_norm_bf16", 1));
        assert_eq!(parse_rules("a@x"), Err("a@x".to_string()));
        assert_eq!(parse_rules("@3"), Err("@3".to_string()));
        assert!(parse_rules("").expect("empty").is_empty());
    }
}

//! The input fuzzer as a test: a few hundred malformed configs, checkpoints and flags, each
//! run as a child `porter` process under a virtual-memory limit and a timeout.
//!
//! Every case carries an oracle, decided from what transformers does with the same input:
//! *legal* (porter must exit 0) or *illegal* (porter must exit non-zero with an error that
//! names the offending key, flag or tensor). The test asserts 0 panics (`panicked at`,
//! exit 101), 0 aborts / OOM kills (a signal), 0 hangs (the timeout), 0 wrong acceptances,
//! 0 wrong rejections, 0 errors that do not name the culprit and 0 error messages over
//! [`MAX_STDERR`] bytes.
//!
//! The cases are generated from a fixed seed (a small xorshift), so every run is the same.
//! `PORTER_FUZZ_BIN=/path/to/porter` runs the same cases against another binary (e.g. an
//! older build, to count what it gets wrong); `PORTER_FUZZ_VERBOSE=1` lists every failure.

mod checkpoints;
mod configs;
mod flags;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Virtual-memory limit of each child, in KiB (`ulimit -v`): 1 GiB. A normal run of the
/// tiny fixtures needs well under 256 MiB.
const MEM_LIMIT_KIB: u64 = 1 << 20;
/// Wall-clock limit of each child.
const TIMEOUT: Duration = Duration::from_secs(20);
/// Longest acceptable stderr of one case (an error message listing a million missing
/// tensors is a failure too).
const MAX_STDERR: usize = 64 << 10;
/// The fixed seed of the case generator.
const SEED: u64 = 0x5eed_f022_2026_0009;

/// A small deterministic xorshift64* generator.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.next_u64() % den < num
    }
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[(self.next_u64() % xs.len() as u64) as usize]
    }
}

/// What a case must do.
#[derive(Clone, Debug)]
pub enum Oracle {
    /// Exit 0 (and, for `generate --json`, print a `finish_reason` of `stop` or `length`).
    Legal,
    /// Exit non-zero, with stderr holding every string of at least one group.
    Illegal(Vec<Vec<String>>),
}

impl Oracle {
    /// Illegal; the error must contain `needle`.
    pub fn names(needle: &str) -> Self {
        Oracle::Illegal(vec![vec![needle.to_owned()]])
    }
    /// Illegal; the error must contain every one of `needles`.
    pub fn names_all(needles: &[&str]) -> Self {
        Oracle::Illegal(vec![needles.iter().map(|s| s.to_string()).collect()])
    }
    /// Also accept an error containing `needle`.
    pub fn or(self, needle: &str) -> Self {
        match self {
            Oracle::Legal => Oracle::names(needle),
            Oracle::Illegal(mut g) => {
                g.push(vec![needle.to_owned()]);
                Oracle::Illegal(g)
            }
        }
    }
    /// Illegal; the key or a weight-map mismatch (a count that is in range but does not fit
    /// the checkpoint).
    pub fn key_or_map(key: &str) -> Self {
        Oracle::names(key).or("does not match the weight map")
    }
}

/// Builds a case's model folder.
pub type Setup = Box<dyn Fn(&Path) + Send + Sync>;

/// One fuzz case.
pub struct Case {
    /// What is being tried (for reports only; never part of a path or an argument, so it
    /// cannot satisfy an oracle's needle by accident).
    pub label: String,
    /// Fills the case folder (`{dir}` in `args`); `None` for flag cases on the fixtures.
    pub setup: Option<Setup>,
    pub args: Vec<String>,
    pub oracle: Oracle,
}

impl Case {
    pub fn new(label: impl Into<String>, setup: Option<Setup>, args: &[&str], oracle: Oracle) -> Self {
        Self { label: label.into(), setup, args: args.iter().map(|s| s.to_string()).collect(), oracle }
    }
}

/// `tests/fixtures/<name>` of the workspace.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("tests").join("fixtures").join(name)
}

/// Makes `dest` a copy of a fixture: `config.json` (and the index, when there is one)
/// copied, the other files symlinked.
pub fn clone_fixture(name: &str, dest: &Path) {
    let src = fixture(name);
    for e in std::fs::read_dir(&src).expect("fixture folder") {
        let p = e.expect("fixture entry").path();
        let file = p.file_name().expect("file name");
        let to = dest.join(file);
        let copy = file == "config.json" || file == "model.safetensors.index.json";
        if copy {
            std::fs::copy(&p, &to).expect("copy");
        } else {
            std::os::unix::fs::symlink(&p, &to).expect("symlink");
        }
    }
}

/// Replaces a symlinked file of a case folder by a real copy (before editing it).
pub fn materialise(dir: &Path, file: &str) -> PathBuf {
    let p = dir.join(file);
    let bytes = std::fs::read(&p).expect("read");
    std::fs::remove_file(&p).expect("remove");
    std::fs::write(&p, bytes).expect("write");
    p
}

/// The fixture's `config.json`.
pub fn fixture_config(name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(fixture(name).join("config.json")).expect("fixture config");
    serde_json::from_str(&text).expect("fixture config is JSON")
}

/// `generate` on the case folder: two prompt ids, two new tokens, JSON output.
pub fn gen_args() -> Vec<&'static str> {
    vec!["generate", "--model", "{dir}", "--ids", "3,4", "--max-tokens", "2", "--device", "cpu", "--json"]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Verdict {
    Pass,
    Panic,
    Signal,
    Hang,
    WrongAccept,
    WrongReject,
    Unnamed,
    LongError,
}

struct Outcome {
    verdict: Verdict,
    detail: String,
}

fn binary() -> PathBuf {
    std::env::var_os("PORTER_FUZZ_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_porter")))
}

/// Reads a pipe to the end, keeping the first `MAX_STDERR * 2` bytes and the total count.
fn drain(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<(Vec<u8>, usize)> {
    std::thread::spawn(move || {
        let (mut kept, mut total, mut buf) = (Vec::new(), 0usize, [0u8; 8192]);
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            total += n;
            if kept.len() < MAX_STDERR * 2 {
                kept.extend_from_slice(&buf[..n]);
            }
        }
        (kept, total)
    })
}

fn run_case(bin: &Path, case: &Case, dir: &Path) -> Outcome {
    use std::os::unix::process::ExitStatusExt;
    let args: Vec<String> = case.args.iter().map(|a| a.replace("{dir}", &dir.to_string_lossy())).collect();
    let mut child = match Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {MEM_LIMIT_KIB}; exec \"$0\" \"$@\""))
        .arg(bin)
        .args(&args)
        .env("RAYON_NUM_THREADS", "1")
        .env("MALLOC_ARENA_MAX", "2")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return Outcome { verdict: Verdict::Signal, detail: format!("spawn failed: {e}") },
    };
    let out = drain(child.stdout.take().expect("stdout"));
    let err = drain(child.stderr.take().expect("stderr"));
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if start.elapsed() > TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(_) => break None,
        }
    };
    let (stdout, _) = out.join().unwrap_or_default();
    let (stderr, err_total) = err.join().unwrap_or_default();
    let stdout = String::from_utf8_lossy(&stdout).into_owned();
    let stderr = String::from_utf8_lossy(&stderr).into_owned();
    let short = |s: &str| s.chars().take(400).collect::<String>();
    let Some(status) = status else {
        return Outcome { verdict: Verdict::Hang, detail: format!("no exit after {TIMEOUT:?}") };
    };
    if status.code() == Some(101) || stderr.contains("panicked at") {
        return Outcome { verdict: Verdict::Panic, detail: short(&stderr) };
    }
    if let Some(sig) = status.signal() {
        return Outcome { verdict: Verdict::Signal, detail: format!("signal {sig}: {}", short(&stderr)) };
    }
    if err_total > MAX_STDERR {
        return Outcome { verdict: Verdict::LongError, detail: format!("{err_total} bytes of stderr") };
    }
    match &case.oracle {
        Oracle::Legal if status.success() => {
            if args.first().map(String::as_str) == Some("generate") && args.iter().any(|a| a == "--json") {
                let v: Option<serde_json::Value> = serde_json::from_str(stdout.trim()).ok();
                let reason = v.as_ref().and_then(|v| v.get("finish_reason")).and_then(|r| r.as_str());
                if !matches!(reason, Some("stop") | Some("length")) {
                    return Outcome {
                        verdict: Verdict::WrongReject,
                        detail: format!("no finish_reason stop/length in: {}", short(&stdout)),
                    };
                }
            }
            Outcome { verdict: Verdict::Pass, detail: String::new() }
        }
        Oracle::Legal => Outcome { verdict: Verdict::WrongReject, detail: short(&stderr) },
        Oracle::Illegal(_) if status.success() => {
            Outcome { verdict: Verdict::WrongAccept, detail: format!("exit 0: {}", short(&stdout)) }
        }
        Oracle::Illegal(groups) => {
            if groups.iter().any(|g| g.iter().all(|n| stderr.contains(n.as_str()))) {
                Outcome { verdict: Verdict::Pass, detail: String::new() }
            } else {
                Outcome { verdict: Verdict::Unnamed, detail: format!("expected {groups:?} in: {}", short(&stderr)) }
            }
        }
    }
}

fn all_cases() -> Vec<Case> {
    let mut rng = Rng::new(SEED);
    let mut v = configs::cases(&mut rng);
    v.extend(checkpoints::cases(&mut rng));
    v.extend(flags::cases(&mut rng));
    v
}

#[test]
fn fuzz_inputs() {
    let cases = all_cases();
    let bin = binary();
    let root = std::env::temp_dir().join(format!("porter-fuzz-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).expect("temp root");
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, Outcome)>> = Mutex::new(Vec::new());
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(case) = cases.get(i) else { break };
                // Numbered folders only: the label never appears in a path.
                let dir = root.join(format!("c{i:04}"));
                std::fs::create_dir_all(&dir).expect("case dir");
                if let Some(setup) = &case.setup {
                    setup(&dir);
                }
                let o = run_case(&bin, case, &dir);
                let _ = std::fs::remove_dir_all(&dir);
                results.lock().expect("results").push((i, o));
            });
        }
    });
    let _ = std::fs::remove_dir_all(&root);
    let mut results = results.into_inner().expect("results");
    results.sort_by_key(|(i, _)| *i);
    let mut counts: BTreeMap<Verdict, usize> = BTreeMap::new();
    for (_, o) in &results {
        *counts.entry(o.verdict).or_default() += 1;
    }
    let legal = cases.iter().filter(|c| matches!(c.oracle, Oracle::Legal)).count();
    eprintln!(
        "fuzz: {} cases ({legal} legal, {} illegal) in {:.1} s against {}",
        cases.len(),
        cases.len() - legal,
        started.elapsed().as_secs_f64(),
        bin.display()
    );
    eprintln!("fuzz verdicts: {counts:?}");
    let failures: Vec<String> = results
        .iter()
        .filter(|(_, o)| o.verdict != Verdict::Pass)
        .map(|(i, o)| format!("#{i} {:?} [{}] {}: {}", o.verdict, cases[*i].label, cases[*i].args.join(" "), o.detail))
        .collect();
    let show = if std::env::var_os("PORTER_FUZZ_VERBOSE").is_some() { failures.len() } else { 40 };
    for f in failures.iter().take(show) {
        eprintln!("  {f}");
    }
    assert!(failures.is_empty(), "{} of {} fuzz cases failed (see above)", failures.len(), cases.len());
}

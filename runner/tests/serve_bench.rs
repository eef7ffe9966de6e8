//! `porter bench --serve` end to end on the bundled tiny CPU fixture: the JSON's counts agree
//! with the requests it lists (each length inside its range, exact output lengths) and with
//! the engine's own counters (rows run = prompt + generated tokens − one per request − prefix
//! hits), the same seed gives the same requests under another arrival pattern, and bad flags
//! fail with a message naming the flag.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

fn porter(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_porter")).args(args).output().expect("run porter")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("porter-serve-{}-{name}.json", std::process::id()))
}

fn serve(extra: &[&str], json: &PathBuf) -> Value {
    let mut args = vec![
        "bench",
        "--device",
        "cpu",
        "--serve",
        "--num-requests",
        "12",
        "--input-len",
        "4:20",
        "--output-len",
        "2:6",
        "--json",
        json.to_str().expect("utf-8 path"),
    ];
    args.extend_from_slice(extra);
    let o = porter(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("random token ids") && out.contains("(random)"), "{out}");
    assert!(out.contains("Serving Benchmark Result") && out.contains("P99 TTFT (ms):"), "{out}");
    let v: Value = serde_json::from_slice(&std::fs::read(json).expect("json written")).expect("valid JSON");
    let _ = std::fs::remove_file(json);
    v
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} missing or not an integer: {v}"))
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or_else(|| panic!("{k} missing or not a number: {v}"))
}

/// The per-request `(input_len, output_len)` pairs.
fn lengths(v: &Value) -> Vec<(u64, u64)> {
    v["requests"].as_array().expect("requests").iter().map(|r| (u(r, "input_len"), u(r, "output_len"))).collect()
}

#[test]
fn serve_bench_counts_add_up() {
    let v = serve(&[], &tmp("a"));
    assert_eq!(v["prompts"], "random token ids");
    assert_eq!(v["device"], "cpu");
    let r = &v["results"][0];
    assert_eq!(r["kind"], "serve");
    assert_eq!((u(r, "num_requests"), u(r, "completed")), (12, 12));
    let lens = lengths(&v);
    assert_eq!(lens.len(), 12);
    for &(i, o) in &lens {
        assert!((4..=20).contains(&i) && (2..=6).contains(&o), "lengths {i}, {o} outside 4:20, 2:6");
    }
    // 12 draws from 17 and 5 values: not all equal.
    assert!(lens.iter().any(|l| l.0 != lens[0].0) && lens.iter().any(|l| l.1 != lens[0].1), "{lens:?}");
    let (sum_in, sum_out): (u64, u64) = (lens.iter().map(|l| l.0).sum(), lens.iter().map(|l| l.1).sum());
    assert_eq!(u(r, "total_input_tokens"), sum_in);
    assert_eq!(u(r, "total_output_tokens"), sum_out);
    // The engine's counters: every prompt token and every generated token but the last of
    // each request went through a forward once (nothing was preempted: the CPU pool holds
    // every sequence's context), less the prompt tokens found in the prefix cache.
    assert_eq!(u(r, "preemptions"), 0);
    let hits = u(r, "prefix_hit_tokens");
    assert_eq!(u(r, "batched_tokens"), sum_in + sum_out - 12 - hits);
    let steps = u(r, "steps");
    let max_out = lens.iter().map(|l| l.1).max().unwrap_or(0);
    assert!(steps >= max_out && steps <= u(r, "batched_tokens"), "steps {steps}");
    assert!((f(r, "mean_batch_size") - u(r, "batched_tokens") as f64 / steps as f64).abs() < 1e-9);
    assert_eq!(u(r, "state_slots_total"), 8);
    let (peak, total) = (u(r, "peak_kv_blocks_used"), u(r, "kv_blocks_total"));
    assert!(peak >= 1 && peak <= total, "peak {peak} of {total}");
    // Times: TTFT and every latency within the run; throughputs are counts over the duration.
    let d = f(r, "duration_s");
    assert!(d > 0.0);
    for k in ["ttft_ms", "itl_ms", "tpot_ms", "e2el_ms"] {
        let s = &r[k];
        let (mean, p50, p99) = (f(s, "mean"), f(s, "p50"), f(s, "p99"));
        assert!(mean >= 0.0 && p50 >= 0.0 && p50 <= p99 && p99 <= d * 1e3 + 1e-6, "{k}: {s} over {d} s");
    }
    assert!(f(&r["ttft_ms"], "p99") <= f(&r["e2el_ms"], "p99") + 1e-6);
    assert!((f(r, "request_throughput") - 12.0 / d).abs() < 1e-6 * (12.0 / d));
    assert!((f(r, "output_tokens_per_s") - sum_out as f64 / d).abs() < 1e-6 * (sum_out as f64 / d));
    assert!(
        (f(r, "total_tokens_per_s") - (sum_in + sum_out) as f64 / d).abs() < 1e-6 * ((sum_in + sum_out) as f64 / d)
    );
    for q in v["requests"].as_array().expect("requests") {
        let (sent, first, done) = (f(q, "sent_s"), f(q, "first_token_s"), f(q, "done_s"));
        assert!(sent <= first && first <= done && done <= d + 1e-9, "{q}");
    }

    // The same seed under Poisson arrivals and a concurrency limit: the same requests, no
    // more than 3 running at once.
    let w = serve(&["--request-rate", "200", "--max-concurrency", "3", "--warmup", "0"], &tmp("b"));
    assert_eq!(lengths(&w), lens);
    let r = &w["results"][0];
    assert!(u(r, "peak_running") <= 3, "{r}");
    assert_eq!(r["request_rate"], 200.0);
    assert!(w["requests"]
        .as_array()
        .expect("requests")
        .windows(2)
        .all(|p| f(&p[0], "arrival_s") <= f(&p[1], "arrival_s")));
}

#[test]
fn serve_bench_bad_flags_fail_clearly() {
    let base = ["bench", "--device", "cpu", "--serve"];
    for (extra, needle) in [
        (&["--request-rate", "0"][..], "must be a rate > 0"),
        (&["--request-rate", "-2"][..], "must be a rate > 0"),
        (&["--input-len", "9:3"][..], "is empty"),
        (&["--output-len", "5:x"][..], "is not a length"),
        (&["--num-requests", "0"][..], "--num-requests 0: must be at least 1"),
        (&["--max-concurrency", "0"][..], "--max-concurrency 0: must be at least 1"),
        (&["--input-len", "0:4"][..], "--input-len 0:4: prompts need at least 1 token"),
        (&["--input-len", "4000", "--output-len", "100"][..], "beyond the model's context"),
        (&["--kv-cache-memory", "1KiB"][..], "more than the whole KV cache holds"),
        (&["--gpu-memory-utilization", "1.5"][..], "must be a fraction in (0, 1]"),
        (&["--gpu-memory-utilization", "0.5"][..], "applies to a CUDA device"),
        (&["--prefill", "128"][..], "cannot be used with"),
        (&["--no-enable-prefix-caching", "--state-checkpoints", "4"][..], "turns off"),
    ] {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        let o = porter(&args);
        let e = stderr(&o);
        assert!(!o.status.success(), "{extra:?} should fail: {e}");
        assert!(!e.contains("panicked"), "{extra:?} panicked: {e}");
        assert!(e.contains(needle), "{extra:?}: expected `{needle}` in: {e}");
    }
    // Recurrent-state checkpoints on a model without recurrent layers.
    let qwen3 = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen3");
    let o = porter(&[&base[..], &["--model", &qwen3.to_string_lossy(), "--state-checkpoints", "4"][..]].concat());
    let e = stderr(&o);
    assert!(!o.status.success() && e.contains("applies to hybrid models"), "{e}");
    // A serve flag without --serve.
    let o = porter(&["bench", "--device", "cpu", "--num-requests", "3"]);
    assert!(!o.status.success() && stderr(&o).contains("--serve"), "{}", stderr(&o));
}

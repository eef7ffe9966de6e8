//! `porter bench`: prefill / decode / speculative timings of a loaded model or of a
//! random-weight geometry (`--config`), and the serving benchmark (`--serve`).

use crate::{
    checks, generate, load, load_drafts, model_dir, registry, serve_bench, speculative, Batch, DType, Device,
    DraftArgs, DraftHead, LogitsFor, Model, MtpMode, RandomArgs, RunArgs, SamplingParams, StateCache, DEFAULT_MODEL,
};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    pub(crate) random: RandomArgs,
    #[command(flatten)]
    pub(crate) run: RunArgs,
    /// Prompt lengths to time prefill on (comma-separated).
    #[arg(long, conflicts_with = "serve", value_delimiter = ',', default_values_t = vec![128usize, 512])]
    pub(crate) prefill: Vec<usize>,
    /// Decode batch sizes (comma-separated).
    #[arg(long, conflicts_with = "serve", value_delimiter = ',', default_values_t = vec![1usize, 8])]
    pub(crate) batch: Vec<usize>,
    /// Prompt length before decode.
    #[arg(long, conflicts_with = "serve", default_value_t = 32)]
    pub(crate) context: usize,
    /// Decode steps per batch size.
    #[arg(long, conflicts_with = "serve", default_value_t = 16)]
    pub(crate) steps: usize,
    /// Write the results as JSON here.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Also time speculative decoding at batch 1 with K = 1..=this many draft tokens.
    #[arg(long, conflicts_with = "serve")]
    pub(crate) mtp_step: Option<usize>,
    #[command(flatten)]
    pub(crate) draft: DraftArgs,
    #[command(flatten)]
    pub(crate) serve: serve_bench::ServeArgs,
}

/// The text of `--config`: a preset name or a file.
pub(crate) fn config_text(c: &str) -> Result<String> {
    match preset(c) {
        Some(t) => Ok(t.to_owned()),
        None => std::fs::read_to_string(c).with_context(|| {
            format!("--config `{c}` is neither a preset (qwen3-next-80b-a3b, qwen3-next-mid) nor a readable file")
        }),
    }
}

fn preset(name: &str) -> Option<&'static str> {
    match name {
        "qwen3-next-80b-a3b" => Some(include_str!("../presets/qwen3-next-80b-a3b.json")),
        "qwen3-next-mid" => Some(include_str!("../presets/qwen3-next-mid.json")),
        _ => None,
    }
}

/// The `--config` JSON with `--layers` applied (its depth, and `layer_types` cycled to it).
pub(crate) fn random_config(c: &str, layers: Option<usize>) -> Result<serde_json::Value> {
    let text = config_text(c)?;
    let mut cfg: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| anyhow!("--config `{c}` is not valid JSON: {e}"))?;
    if let Some(n) = layers {
        checks::layers(n)?;
        cfg["num_hidden_layers"] = serde_json::json!(n);
        if let Some(t) = cfg.get("layer_types").and_then(|t| t.as_array()).cloned() {
            cfg["layer_types"] = serde_json::Value::Array(t.into_iter().cycle().take(n).collect());
        }
    }
    Ok(cfg)
}

/// A random-weight model of the `--config` geometry (`--layers` overrides its depth).
pub(crate) fn random_model(c: &str, layers: Option<usize>, run: &RunArgs, device: Device) -> Result<Model> {
    let cfg = random_config(c, layers)?;
    if run.tensor_parallel_size > 1 {
        bail!("--tensor-parallel-size applies to --model checkpoints; random-weight models (--config) run on one rank");
    }
    checks::random_weights_fit(&cfg, run.dtype, device)?;
    porter_core::tensor::cuda::set_deterministic(run.deterministic);
    if run.enforce_eager {
        porter_core::backend::cuda::graph::set_enabled(false);
    }
    let mut model = registry::build_random_with(&cfg, Path::new("."), run.dtype, device, 0, run.quantize)?;
    model.info.kv_cache_dtype = run.kv_cache_dtype;
    Ok(model)
}

/// One decode row: `b` sequences of `--context` tokens prefilled, the decode graph of the
/// batch captured, then `--steps` timed steps; the row's JSON.
fn decode_row(
    model: &Model,
    device: Device,
    a: &BenchArgs,
    b: usize,
    positions: usize,
    roofline: Option<f64>,
    tok: &impl Fn(usize) -> u32,
) -> Result<serde_json::Value> {
    let decode_cache =
        porter_core::state::CacheConfig::for_tokens(b, 0, positions).with_kv_dtype(model.info.kv_cache_dtype);
    let mut cache = model.new_cache_with(&decode_cache).with_context(|| {
        format!("decode batch {b}: allocating the KV cache ({positions} positions a sequence) and the state")
    })?;
    let mut batch = Batch::default();
    let mut seqs = Vec::with_capacity(b);
    for j in 0..b {
        let seq = cache.alloc_seq()?;
        let ids: Vec<u32> = (0..a.context).map(|i| tok(i + j)).collect();
        batch.push(seq, 0, &ids);
        seqs.push(seq);
    }
    model.forward(&batch, &mut cache, LogitsFor::Last)?;
    // The device timeline (PORTER_TIMELINE): the names of the launches the capture records.
    let gpu = match device {
        Device::Cuda(i) => Some(porter_core::tensor::cuda::gpu(i)?),
        _ => None,
    };
    if let Some(g) = &gpu {
        g.k.timeline_reset(true).context("resetting the device timeline")?;
    }
    // The decode graph of this batch size (CUDA; not with --enforce-eager).
    let tg = Instant::now();
    let failed = model.capture_graphs(&mut cache, &[(b, 1)], a.context + a.steps, &mut |_, _| {})?;
    if let Some((k, why)) = failed.first() {
        println!("  CUDA graph {k:?} not captured ({why}): decode runs eagerly");
    } else if let (Device::Cuda(i), true) = (device, porter_core::backend::cuda::graph::enabled()) {
        let held = porter_core::backend::cuda::graph::reserved_bytes(&*porter_core::tensor::cuda::gpu(i)?);
        println!(
            "  CUDA graph of batch {b} captured in {:.1} ms (graph memory held: {})",
            tg.elapsed().as_secs_f64() * 1e3,
            held.map_or("unknown".into(), |v| format!("{:.1} MB", v as f64 / 1e6))
        );
    }
    model.sync()?;
    let _ = porter_core::backend::cuda::profile::take();
    if let Some(g) = &gpu {
        g.k.timeline_reset(false).context("resetting the device timeline")?;
    }
    let t0 = Instant::now();
    let (mut issue, mut issue_first) = (0.0, 0.0);
    for step in 0..a.steps {
        let mut batch = Batch::default();
        for (j, &seq) in seqs.iter().enumerate() {
            batch.push(seq, a.context + step, &[tok(step * 31 + j)]);
        }
        let ti = Instant::now();
        model.forward(&batch, &mut cache, LogitsFor::Last)?;
        let dt = ti.elapsed().as_secs_f64();
        issue += dt;
        if step == 0 {
            // The device queue is empty here, so this is the host's own cost of a step.
            issue_first = dt;
        }
    }
    model.sync()?;
    let s = t0.elapsed().as_secs_f64();
    // Host time spent issuing the work (forward returns before the device finishes):
    // when it is close to the step time, the step is bound by the host, not the GPU.
    println!(
        "  host issue time {:.3} ms/step (first step, empty device queue: {:.3} ms)",
        issue * 1e3 / a.steps as f64,
        issue_first * 1e3
    );
    print_profile(a.steps, "/step");
    let timeline = match &gpu {
        Some(g) => print_timeline(&g.k).context("reading the device timeline")?,
        None => None,
    };
    let tps = (b * a.steps) as f64 / s;
    let step_s = s / a.steps as f64;
    // Bytes per step at the mean context of the timed steps.
    let bytes = model.decode_bytes(b, a.context + a.steps / 2);
    let bw = bytes / step_s;
    let frac = roofline.map(|r| bw / r);
    println!(
        "decode batch {b:>4}: {tps:>10.1} tok/s ({:.3} ms/step, {:.1} MB/step, {:.0} GB/s{})",
        step_s * 1e3,
        bytes / 1e6,
        bw / 1e9,
        frac.map_or(String::new(), |f| format!(", {:.1}% of the HBM roofline", f * 100.0))
    );
    let mut row = serde_json::json!({"kind": "decode", "batch": b, "steps": a.steps, "context": a.context, "seconds": s, "tokens_per_s": tps, "ms_per_step": step_s * 1e3, "host_issue_ms_per_step": issue * 1e3 / a.steps as f64, "host_ms_first_step": issue_first * 1e3, "bytes_per_step": bytes, "bandwidth_bytes_per_s": bw, "roofline_bytes_per_s": roofline, "roofline_fraction": frac});
    if let (Some(t), Some(o)) = (timeline, row.as_object_mut()) {
        o.insert("timeline".into(), t);
    }
    Ok(row)
}

/// Prints the device timeline of the decode steps just timed (PORTER_TIMELINE; nothing
/// without it): each launch of the graphed step with its mean µs on the critical path, then
/// the totals by kernel. Returns them for the row's JSON (`timeline`: `launches` in order as
/// `[name, µs]`, `between_us`, `steps`).
fn print_timeline(k: &porter_kernels::cuda::CudaKernels) -> Result<Option<serde_json::Value>> {
    let r = match k.timeline_report()? {
        None => return Ok(None),
        Some(Err(why)) => {
            println!("  timeline: {why}");
            return Ok(None);
        }
        Some(Ok(r)) => r,
    };
    let total: f64 = r.rows.iter().filter(|x| x.mean_ns.is_finite()).map(|x| x.mean_ns).sum::<f64>() + r.between_ns;
    println!(
        "  timeline: {} launches a step over {} steps, {:.1} µs a step (the last launch and the gap to the next replay: {:.1} µs){}",
        r.per_step,
        r.steps,
        total / 1e3,
        r.between_ns / 1e3,
        if r.leftover > 0 { format!("; {} records outside whole steps: other launches ran", r.leftover) } else { String::new() }
    );
    for (i, x) in r.rows.iter().enumerate() {
        println!("  timeline {i:>4} {:>8.2} µs  {}", x.mean_ns / 1e3, x.name);
    }
    for (n, c, us) in r.by_name() {
        println!("  timeline by kernel {us:>9.1} µs a step {c:>4} launches ({:.2} µs each)  {n}", us / c as f64);
    }
    // NaN (the last launch, which runs into the next replay) is null in JSON.
    let launches: Vec<serde_json::Value> = r
        .rows
        .iter()
        .map(|x| serde_json::json!([x.name, if x.mean_ns.is_finite() { Some(x.mean_ns / 1e3) } else { None }]))
        .collect();
    Ok(Some(serde_json::json!({"steps": r.steps, "launches": launches, "between_us": r.between_ns / 1e3})))
}

/// Whether `e` is, under its context, porter's typed out-of-memory error (an allocation
/// that did not fit the device).
fn out_of_device_memory(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<porter_core::Error>().is_some_and(porter_core::Error::is_out_of_memory))
}

/// One timed prefill of `n` tokens (after an untimed one at the same length on a GPU); its
/// seconds.
fn prefill_row(model: &Model, device: Device, n: usize, tok: &impl Fn(usize) -> u32) -> Result<f64> {
    let ids: Vec<u32> = (0..n).map(tok).collect();
    // A KV pool for the whole prompt (the default GPU pool holds 4096 positions).
    let prefill_cache =
        porter_core::state::CacheConfig::for_tokens(1, 0, n.max(1)).with_kv_dtype(model.info.kv_cache_dtype);
    if device != Device::Cpu {
        // One untimed run at this length (first use of the prefill kernels at this size:
        // the memory pool grows, cuBLAS picks its algorithms), as hf_bench.py does.
        let mut c = model.new_cache_with(&prefill_cache)?;
        let s = c.alloc_seq()?;
        model.forward(&Batch::single(s, 0, &ids), &mut c, LogitsFor::Last)?;
    }
    let mut cache = model.new_cache_with(&prefill_cache)?;
    let seq = cache.alloc_seq()?;
    model.sync()?;
    let _ = porter_core::backend::cuda::profile::take();
    let t0 = Instant::now();
    model.forward(&Batch::single(seq, 0, &ids), &mut cache, LogitsFor::Last)?;
    model.sync()?;
    let s = t0.elapsed().as_secs_f64();
    println!("prefill {n:>6} tokens: {:>10.1} tok/s ({:.3} s)", n as f64 / s, s);
    print_profile(1, "");
    Ok(s)
}

/// The MTP rows' long runs are this many times `--steps` tokens.
const MTP_RUNS_LONG: usize = 3;

/// Most runs [`oracle_sequence`] makes to find a sequence the speculative path accepts whole.
const MTP_ORACLE_ROUNDS: usize = 16;

/// The oracle draft's sequence for `k` drafts a step, `prompt` and `long` generated tokens:
/// plain greedy's (`seq`, the prompt and its tokens) where the speculative path accepts it
/// whole. In bf16 / f16 / FP8 the K + 1-row verify forward runs other kernels than the 1-row
/// decode (FP8: the tensor-core GEMV from two rows on, the FMA one for one row of a large
/// weight), so a random model's near-ties can take the speculative output off plain greedy's
/// sequence, and an oracle proposing that sequence is wrong from there on. Then the output of
/// an oracle run becomes the next run's sequence, until a run accepts every draft: a draft
/// always right for this engine's own verify forward, which is what the oracle rows measure.
/// Returns the sequence and the runs it took beyond the first (`Err` past
/// [`MTP_ORACLE_ROUNDS`]).
fn oracle_sequence(
    model: &Model,
    prompt: &[u32],
    seq: &[u32],
    p: &SamplingParams,
    long: usize,
    k: usize,
) -> Result<(Vec<u32>, usize)> {
    let mut cur = seq.to_vec();
    for round in 0..MTP_ORACLE_ROUNDS {
        let oracle = porter_core::draft::OracleDraft {
            sequence: cur.clone(),
            wrong_every: None,
            vocab_size: model.info.vocab_size,
        };
        let drafts: Vec<Box<dyn DraftHead>> = vec![Box::new(oracle)];
        let g = speculative::generate_speculative(model, &drafts, prompt, p.clone(), long, &[], k, MtpMode::Eagle)?;
        if g.accepted == g.proposed {
            return Ok((cur, round));
        }
        cur = prompt.iter().chain(&g.ids).copied().collect();
    }
    bail!("k = {k}: no oracle sequence accepted whole after {MTP_ORACLE_ROUNDS} runs (the verify forward's numerics)")
}

/// Tokens a second of a generation: over its first `n` tokens (prefill, graph capture and
/// other first-use costs included) and steady (the extra tokens of a `long` run over the
/// extra time: the one-time costs, the same in both runs, cancel).
struct Rate {
    first: f64,
    steady: f64,
}

/// With `PORTER_PROFILE` set, the profiled blocks since the last reset, each divided by `per`
/// (`unit`: what it counts, e.g. `/step`; with `host` the MTP rows' tokens, whose waits for the
/// device's token are spans too). Nothing without profiling (the table is empty).
fn print_profile(per: usize, unit: &str) {
    let per = per.max(1) as f64;
    for (name, secs, calls) in porter_core::backend::cuda::profile::take() {
        println!("  profile {name:<36} {:>9.3} ms{unit} {:>7.2} calls{unit}", secs * 1e3 / per, calls as f64 / per);
    }
}

/// Runs `run(n)` and `run(long)` (each returns its ids) and their [`Rate`]; returns the long
/// run's ids (the short one's should be their prefix: a note says where not).
fn timed_pair(n: usize, long: usize, mut run: impl FnMut(usize) -> Result<Vec<u32>>) -> Result<(Vec<u32>, Rate)> {
    let t0 = Instant::now();
    let short = run(n)?;
    let ts = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let ids = run(long)?;
    let tl = t0.elapsed().as_secs_f64();
    if ids.len() != long || short.len() != n {
        bail!("the greedy runs of {n} and {long} tokens gave {} and {} tokens", short.len(), ids.len());
    }
    if let Some(at) = short.iter().zip(&ids).position(|(a, b)| a != b) {
        // Greedy decoding on fixed kernels repeats itself; say so if this run did not.
        println!("  note: the {long}-token run differs from the {n}-token one at token {at}");
    }
    // A long run no slower than the short one (timer noise on a tiny model): no steady rate.
    let steady = if tl > ts { (long - n) as f64 / (tl - ts) } else { f64::NAN };
    Ok((ids, Rate { first: n as f64 / ts, steady }))
}

/// KV positions a sequence for the decode rows of batch `b`: the default pool
/// ([`Model::default_cache_tokens`]) where it fits the device's free memory, else the `tight`
/// positions the row needs (a note says so), else `None` with a line saying what the row
/// needs against what is free (the row is skipped, the others still run). CPU: the default.
fn decode_positions(model: &Model, device: Device, b: usize, tight: usize) -> Result<Option<usize>> {
    let full = tight.max(model.default_cache_tokens());
    let Device::Cuda(i) = device else { return Ok(Some(full)) };
    // Activations, graphs and the pool's own rounding take the rest: keep 512 MB aside.
    const MARGIN: u128 = 512 << 20;
    let (free, _) = porter_core::tensor::cuda::mem_info(i)?;
    let need = |positions: usize| {
        b as u128 * (positions as u128 * model.kv_bytes_per_token() as u128 + model.state_bytes_per_slot(0) as u128)
    };
    let free = free as u128;
    if need(full) + MARGIN <= free {
        return Ok(Some(full));
    }
    if need(tight) + MARGIN <= free {
        println!("  batch {b}: a KV pool of {tight} positions a sequence (the default {full} do not fit)");
        return Ok(Some(tight));
    }
    println!(
        "decode batch {b:>4}: skipped: its KV cache ({tight} positions a sequence) and state need {:.2} GB, {:.2} GB of device memory are free",
        need(tight) as f64 / 1e9,
        free as f64 / 1e9
    );
    Ok(None)
}

pub(crate) fn cmd_bench(a: &BenchArgs) -> Result<()> {
    checks::mtp_step(a.mtp_step)?;
    let device = a.run.device.unwrap_or_else(porter_core::device::default_device);
    if a.serve.serve {
        serve_bench::check_args(&a.serve, device)?;
    }
    let (label, model) = match &a.random.config {
        Some(c) => (c.clone(), random_model(c, a.random.layers, &a.run, device)?),
        None => {
            if a.random.layers.is_some() {
                bail!("--layers applies to a --config geometry only (it would be ignored for a model folder)");
            }
            let (dir, m) = load(&a.run)?;
            (dir.display().to_string(), m)
        }
    };
    if a.serve.serve {
        let weights = match (&a.random.config, &a.run.model.model) {
            (Some(_), _) => "random (built from --config)".to_owned(),
            (None, None) => format!("the bundled fixture {DEFAULT_MODEL} (random)"),
            (None, Some(d)) => format!("loaded from {}", d.display()),
        };
        let setup = serve_bench::Setup { label: &label, weights: &weights, json: a.json.as_deref() };
        return serve_bench::run(model, &a.serve, &setup);
    }
    checks::bench_sizes(&model, &a.prefill, &a.batch, a.context, a.steps)?;
    if let Some(k) = a.mtp_step {
        // The MTP rows run MTP_RUNS_LONG · --steps tokens (steady-state rates, below).
        let n = a.steps.max(2).saturating_mul(MTP_RUNS_LONG);
        if a.context.saturating_add(n).saturating_add(k) > checks::context(&model) {
            bail!(
                "--context {} plus {MTP_RUNS_LONG} × --steps {} plus --mtp-step {k} exceed the model's context of max_position_embeddings = {} (the MTP rows generate {MTP_RUNS_LONG} × --steps tokens)",
                a.context,
                a.steps,
                checks::context(&model)
            );
        }
    }
    let vocab = model.info.vocab_size as u32;
    let tok = |i: usize| (i as u32 * 7919 + 3) % vocab;
    let mut results = Vec::new();
    println!(
        "bench {label}: {} layers, {}, KV cache {}, {device}",
        model.info.num_layers, a.run.dtype, model.info.kv_cache_dtype
    );
    // What the weights take and what is left for KV blocks and recurrent state slots.
    if let Device::Cuda(i) = device {
        let (free, total) = porter_core::tensor::cuda::mem_info(i)?;
        let (kv, state) = (model.kv_bytes_per_token(), model.state_bytes_per_slot(0));
        println!(
            "device memory after load: {:.2} GB used of {:.2} GB, weights {:.2} GB; free {:.2} GB = {:.2}M KV tokens ({kv} B/token) or {} state slots ({:.1} MB/slot)",
            (total - free) as f64 / 1e9,
            total as f64 / 1e9,
            model.weight_bytes() as f64 / 1e9,
            free as f64 / 1e9,
            free as f64 / kv.max(1) as f64 / 1e6,
            free / state.max(1),
            state as f64 / 1e6
        );
    }
    // The HBM roofline: measured device-to-device copy bandwidth of this GPU.
    let roofline = match device {
        Device::Cuda(i) => {
            let bw = porter_core::backend::cuda::copy_bandwidth(&*porter_core::tensor::cuda::gpu(i)?)?;
            println!("HBM copy bandwidth (roofline): {:.0} GB/s", bw / 1e9);
            Some(bw)
        }
        Device::Cpu => None,
    };
    // Warm-up: compiles the kernels (NVRTC, first use) and touches every code path once.
    {
        let mut cache = model.new_cache_spec(1, 0)?;
        let seq = cache.alloc_seq()?;
        let ids: Vec<u32> = (0..8).map(tok).collect();
        model.forward(&Batch::single(seq, 0, &ids), &mut cache, LogitsFor::Last)?;
        model.forward(&Batch::single(seq, 8, &[tok(8)]), &mut cache, LogitsFor::Last)?;
        model.sync()?;
    }
    for &n in &a.prefill {
        // A prompt whose activations do not fit beside the weights is skipped with a line
        // (the other rows still run); any other failure ends the bench.
        match prefill_row(&model, device, n, &tok) {
            Ok(s) => results
                .push(serde_json::json!({"kind": "prefill", "tokens": n, "seconds": s, "tokens_per_s": n as f64 / s})),
            Err(e) if out_of_device_memory(&e) => {
                println!("prefill {n:>6} tokens: skipped: out of device memory ({e:#})");
                results.push(serde_json::json!({"kind": "prefill", "tokens": n, "skipped": "device memory"}));
            }
            Err(e) => return Err(e.context(format!("prefill of {n} tokens"))),
        }
    }
    for &b in &a.batch {
        // The default GPU pool holds 4096 positions a sequence: a longer --context gets a pool
        // for its own length.
        let tight = a.context.saturating_add(a.steps).saturating_add(1);
        let Some(positions) = decode_positions(&model, device, b, tight)? else {
            results.push(serde_json::json!({"kind": "decode", "batch": b, "skipped": "device memory"}));
            continue;
        };
        match decode_row(&model, device, a, b, positions, roofline, &tok) {
            Ok(row) => results.push(row),
            Err(e) if out_of_device_memory(&e) => {
                println!("decode batch {b:>4}: skipped: out of device memory ({e:#})");
                results.push(serde_json::json!({"kind": "decode", "batch": b, "skipped": "device memory"}));
            }
            Err(e) => return Err(e.context(format!("decode batch {b}"))),
        }
    }
    if let Some(kmax) = a.mtp_step {
        let prompt: Vec<u32> = (0..a.context).map(tok).collect();
        let n = a.steps.max(2);
        let long = n * MTP_RUNS_LONG;
        let p = SamplingParams::default();
        let _ = porter_core::backend::cuda::profile::take();
        let (plain, base) = timed_pair(n, long, |m| Ok(generate(&model, &prompt, p.clone(), m, &[])?.ids))?;
        print_profile(n + long, "/token");
        println!(
            "mtp baseline (batch 1, plain greedy decode): {:>10.1} tok/s steady ({n} → {long} tokens), {:>10.1} tok/s over {n} tokens incl. prefill and graph capture",
            base.steady, base.first
        );
        results.push(serde_json::json!({"kind": "mtp_baseline", "tokens": n, "tokens_per_s": base.first, "tokens_long": long, "tokens_per_s_steady": base.steady}));
        let mut seq = prompt.clone();
        seq.extend_from_slice(&plain);
        // The real draft head: the --draft folders or the checkpoint's own; for a --config
        // geometry whose architecture has an MTP layer (Qwen3-Next), that layer with random
        // weights (seed 1; the main model's is 0), quantized as the main model is.
        let (real, real_label): (Vec<Box<dyn DraftHead>>, &str) = match &a.random.config {
            Some(c) if a.draft.drafts.is_empty() => {
                let cfg = random_config(c, a.random.layers)?;
                match registry::build_random_draft(&cfg, &model, 1, a.run.quantize)? {
                    Some(d) => {
                        println!(
                            "mtp draft head {} with RANDOM weights{}: it proposes noise, so its acceptance is ~0 and its row times the draft head's cost, not the speed-up a trained head gives",
                            d.name(),
                            if a.run.quantize.is_some() { " (FP8 like the main model)" } else { "" }
                        );
                        (vec![d], "random draft head")
                    }
                    None => {
                        println!(
                            "mtp: {} has no MTP layer in its architecture; timing the oracle draft only",
                            model.info.architecture
                        );
                        (vec![], "draft head")
                    }
                }
            }
            _ => {
                let dir = model_dir(&a.run.model);
                (load_drafts(&dir, &model, &a.draft, false, a.run.quantize)?, "draft head")
            }
        };
        // One loaded head serves its own row and the forced row (its compute, the oracle's
        // proposals: what a trained head that is always right would cost).
        let real: Vec<std::sync::Arc<dyn DraftHead>> = real.into_iter().map(std::sync::Arc::from).collect();
        for k in 1..=kmax {
            let (oseq, rounds) = oracle_sequence(&model, &prompt, &seq, &p, long, k)?;
            if rounds > 0 {
                println!(
                    "  note: k={k}: the oracle proposes the speculative path's own greedy output (plain greedy's left it; {} numerics of the verify rows), found in {rounds} more run(s)",
                    model.info.dtype
                );
            }
            let oracle_of = || porter_core::draft::OracleDraft {
                sequence: oseq.clone(),
                wrong_every: None,
                vocab_size: model.info.vocab_size,
            };
            let oracle: Vec<Box<dyn DraftHead>> = vec![Box::new(oracle_of())];
            let mut runs = vec![("forced 100% acceptance", oracle)];
            if let [head] = real.as_slice() {
                let forced = porter_core::draft::ForcedDraft { head: Box::new(head.clone()), oracle: oracle_of() };
                runs.push(("forced, head's compute", vec![Box::new(forced)]));
            }
            if !real.is_empty() {
                runs.push((real_label, real.iter().map(|d| Box::new(d.clone()) as Box<dyn DraftHead>).collect()));
            }
            for (what, drafts) in runs {
                let _ = porter_core::backend::cuda::profile::take();
                let mut last = None;
                let (ids, rate) = timed_pair(n, long, |m| {
                    let g = speculative::generate_speculative(
                        &model,
                        &drafts,
                        &prompt,
                        p.clone(),
                        m,
                        &[],
                        k,
                        MtpMode::Eagle,
                    )?;
                    let ids = g.ids.clone();
                    last = Some(g);
                    Ok(ids)
                })?;
                print_profile(n + long, "/token");
                let g = last.ok_or_else(|| anyhow!("no speculative run"))?;
                if ids != plain {
                    let at = ids.iter().zip(&plain).position(|(a, b)| a != b).unwrap_or(0);
                    if model.info.dtype == DType::F32 {
                        bail!("speculative output differs from plain greedy output at token {at} (k = {k}, {what})");
                    }
                    // In bf16 / f16 the K + 1-row verify forward and the 1-row decode forward
                    // round differently (other kernels and accumulation orders for other
                    // batch shapes), so a near-tie in a random-weight model's logits can flip
                    // the argmax; f32 runs must match exactly (tests/tests/gpu.rs, mtp.rs).
                    println!(
                        "  note: k={k} {what}: output first differs from plain greedy at token {at} ({} numerics of the verify vs decode batch shapes)",
                        model.info.dtype
                    );
                }
                if let Some((st, failed)) = &g.draft_graphs {
                    // Once a head (the oracle has no device steps to graph).
                    if k == 1 && st.captures + st.failed > 0 {
                        println!(
                            "  {what}: draft steps from CUDA graphs: {} replays, {} shapes captured, {} failed{}",
                            st.replays,
                            st.captures,
                            st.failed,
                            if failed.is_empty() { String::new() } else { format!(" ({})", failed.join("; ")) }
                        );
                    }
                }
                let acc = g.accepted as f64 / g.proposed.max(1) as f64;
                println!(
                    "mtp k={k} {what:<24}: {:>10.1} tok/s steady, speed-up {:.2}x; over {n} tokens incl. prefill {:>10.1} tok/s, {:.2}x; acceptance {:.1}%, {:.2} tokens/step",
                    rate.steady,
                    rate.steady / base.steady,
                    rate.first,
                    rate.first / base.first,
                    acc * 100.0,
                    g.tokens_per_step()
                );
                results.push(serde_json::json!({"kind": "mtp", "k": k, "draft": what, "tokens_per_s": rate.first, "speedup": rate.first / base.first, "tokens_per_s_steady": rate.steady, "speedup_steady": rate.steady / base.steady, "acceptance": acc, "tokens_per_step": g.tokens_per_step()}));
            }
        }
    }
    if let Some(p) = &a.json {
        let v = serde_json::json!({"model": label, "layers": model.info.num_layers, "dtype": a.run.dtype.to_string(), "device": device.to_string(), "threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1), "hbm_copy_bandwidth_bytes_per_s": roofline, "results": results});
        std::fs::write(p, serde_json::to_string_pretty(&v)?).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_device_memory_is_the_typed_error_under_any_context() {
        let typed: porter_core::Result<()> = Err(porter_core::Error::OutOfMemory("CUDA: a KV pool".into()));
        // porter's typed context, then anyhow's, as a bench row's error has them.
        let e = porter_core::error::Context::context(typed, "layer 3").unwrap_err();
        let e = anyhow::Error::from(e).context("prefill of 512 tokens").context("bench");
        assert!(out_of_device_memory(&e));
        let device = anyhow::Error::from(porter_core::Error::Device("CUDA: launch failed".into())).context("bench");
        assert!(!out_of_device_memory(&device));
        // Text alone is not the typed error.
        assert!(!out_of_device_memory(&anyhow!("CUDA_ERROR_OUT_OF_MEMORY: out of memory").context("bench")));
    }
}

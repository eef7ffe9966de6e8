//! `porter`: load a Hugging Face checkpoint and run it.
//!
//! Subcommands: `logits`, `generate`, `inspect`, `models`. Without `--model`, the bundled
//! tiny checkpoint in `tests/fixtures/` is used.

mod checks;
mod serve;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use porter_core::draft::DraftHead;
use porter_core::generate::generate;
use porter_core::sampling::SamplingParams;
use porter_core::speculative::{self, MtpMode};
use porter_core::{registry, Batch, DType, Device, LogitsFor, Model, StateCache};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod chat;
mod load_cmd;
mod serve_bench;
mod serve_parsers;

/// The bundled default model, relative to the repository root.
const DEFAULT_MODEL: &str = "tests/fixtures/qwen3_next_mtp";

#[derive(Parser)]
#[command(
    name = "porter",
    version,
    about = "Port Hugging Face language models to a fast inference engine and run them"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Compute logits for a sequence of token ids and write them as safetensors.
    Logits(LogitsArgs),
    /// Generate a continuation.
    Generate(GenerateArgs),
    /// Show the selected model crate, a config summary and weight-map coverage.
    Inspect(InspectArgs),
    /// List the registered architectures.
    Models,
    /// Measure prefill and decode throughput (random weights from a config, or a model folder),
    /// or with `--serve` the serving engine under a stream of requests.
    Bench(BenchArgs),
    /// Load a model and report load time, throughput, peak host memory and device memory
    /// (or print the tensors a checkpoint for a config must hold).
    Load(load_cmd::LoadArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (chat and text completions,
    /// streaming, /v1/models, /health, /metrics, /tokenize, /detokenize).
    Serve(ServeCmd),
}

#[derive(Args)]
struct ServeCmd {
    #[command(flatten)]
    run: RunArgs,
    #[command(flatten)]
    random: RandomArgs,
    #[command(flatten)]
    spec: SpecArgs,
    #[command(flatten)]
    serve: serve::ServeArgs,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    random: RandomArgs,
    #[command(flatten)]
    run: RunArgs,
    /// Prompt lengths to time prefill on (comma-separated).
    #[arg(long, conflicts_with = "serve", value_delimiter = ',', default_values_t = vec![128usize, 512])]
    prefill: Vec<usize>,
    /// Decode batch sizes (comma-separated).
    #[arg(long, conflicts_with = "serve", value_delimiter = ',', default_values_t = vec![1usize, 8])]
    batch: Vec<usize>,
    /// Prompt length before decode.
    #[arg(long, conflicts_with = "serve", default_value_t = 32)]
    context: usize,
    /// Decode steps per batch size.
    #[arg(long, conflicts_with = "serve", default_value_t = 16)]
    steps: usize,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also time speculative decoding at batch 1 with K = 1..=this many draft tokens.
    #[arg(long, conflicts_with = "serve")]
    mtp_step: Option<usize>,
    #[command(flatten)]
    draft: DraftArgs,
    #[command(flatten)]
    serve: serve_bench::ServeArgs,
}

#[derive(Args)]
struct ModelArgs {
    /// Model folder (config.json + safetensors). Defaults to the bundled tiny checkpoint.
    #[arg(long)]
    model: Option<PathBuf>,
}

#[derive(Args)]
struct InspectArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    draft: DraftArgs,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// cpu, cuda or cuda:N (default: cuda when usable, else cpu).
    #[arg(long, value_parser = parse_device)]
    device: Option<Device>,
    /// Compute dtype: f32, bf16 or f16.
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    dtype: DType,
    /// Batch-invariant kernels on CUDA in every dtype (GEMMs on the GEMV path, attention
    /// without tensor cores): a request's output does not depend on what else runs. f32 is
    /// batch-invariant without it. Slower.
    #[arg(long)]
    deterministic: bool,
    /// Quantize the weights at load: fp8 (block-128 e4m3, the layout of Qwen's FP8
    /// checkpoints; embeddings, lm_head, norms, routers and gates stay in the model dtype).
    #[arg(long)]
    quantize: Option<porter_core::quant::Quantize>,
}

#[derive(Args)]
struct DraftArgs {
    /// MTP draft folder (repeat for vanilla mode: one per step). Qwen3-Next checkpoints
    /// carry their own draft (`mtp.*`), used when this is absent.
    #[arg(long = "draft")]
    drafts: Vec<PathBuf>,
}

#[derive(Args)]
struct LogitsArgs {
    #[command(flatten)]
    draft: DraftArgs,
    #[command(flatten)]
    run: RunArgs,
    /// Comma-separated token ids, e.g. 3,17,42.
    #[arg(long, value_parser = parse_ids)]
    ids: Ids,
    /// Output safetensors file (tensor `logits`, f32 [T, vocab]).
    #[arg(long)]
    out: PathBuf,
    /// Feed the ids one at a time through the decode path and the state cache.
    #[arg(long)]
    incremental: bool,
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Prompt text (tokenized with the model's tokenizer.json).
    #[arg(long, conflicts_with = "ids", required_unless_present = "ids")]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids.
    #[arg(long, value_parser = parse_ids)]
    ids: Option<Ids>,
    /// Send `--prompt` as one user message through the folder's chat template (as
    /// transformers' `apply_chat_template(add_generation_prompt=True)`).
    #[arg(long, requires = "prompt")]
    chat: bool,
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f32,
    #[arg(long, allow_negative_numbers = true)]
    top_p: Option<f32>,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Do not stop at end-of-sequence ids.
    #[arg(long)]
    ignore_eos: bool,
    /// Print one JSON object (`ids`, `text`, `finish_reason`, ...).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    spec: SpecArgs,
}

/// Speculative decoding flags (`generate`, `serve`).
#[derive(Args)]
struct SpecArgs {
    #[command(flatten)]
    draft: DraftArgs,
    /// Speculative decoding with K draft tokens per step (1..=15).
    #[arg(long)]
    mtp_step: Option<usize>,
    /// eagle: one draft module run K times; vanilla: module i drafts step i.
    #[arg(long, default_value = "eagle", value_parser = parse_mtp_mode)]
    mtp_mode: MtpMode,
}

/// A random-weight model built from a config (`bench`, `serve`), instead of `--model`.
#[derive(Args)]
struct RandomArgs {
    /// A config.json to build with random weights, or a preset name
    /// (qwen3-next-80b-a3b, qwen3-next-mid). Without it, `--model` (or the default) is loaded.
    #[arg(long)]
    config: Option<String>,
    /// Override num_hidden_layers of the config (to fit a device).
    #[arg(long)]
    layers: Option<usize>,
}

fn parse_mtp_mode(s: &str) -> Result<MtpMode, String> {
    s.parse()
}

/// Draft heads for a loaded model: the `--draft` folders, else the draft inside the main
/// checkpoint when there is one. `required` makes "no draft" an error.
fn load_drafts(dir: &Path, model: &Model, args: &DraftArgs, required: bool) -> Result<Vec<Box<dyn DraftHead>>> {
    let cfg = porter_core::config::read_config(dir)?;
    if !args.drafts.is_empty() {
        return Ok(args
            .drafts
            .iter()
            .map(|d| registry::load_draft(d, &cfg, model))
            .collect::<porter_core::Result<_>>()?);
    }
    let builtin = porter_core::checkpoint::Checkpoint::open_dir(dir)?;
    let has_builtin = registry::draft_entries().iter().any(|e| {
        e.main_architectures.contains(&model.info.architecture.as_str()) && builtin.get(e.signature).is_some()
    });
    if has_builtin {
        return Ok(vec![registry::load_draft(dir, &cfg, model)?]);
    }
    if required {
        bail!("no MTP draft: {} carries no draft head; pass --draft DIR", dir.display());
    }
    Ok(vec![])
}

#[derive(Clone, Debug)]
struct Ids(Vec<u32>);

fn parse_ids(s: &str) -> Result<Ids, String> {
    let ids: Result<Vec<u32>, String> = s
        .split(',')
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
        .map(|t| t.parse::<u32>().map_err(|_| format!("`{t}` is not a token id (expected a non-negative integer)")))
        .collect();
    let ids = ids?;
    if ids.is_empty() {
        return Err("no token ids given".into());
    }
    Ok(Ids(ids))
}

fn parse_device(s: &str) -> Result<Device, String> {
    s.parse()
}

fn parse_dtype(s: &str) -> Result<DType, String> {
    s.parse()
}

/// The bundled default model: next to the source tree this binary was built from, or
/// relative to the working directory.
fn default_model() -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(DEFAULT_MODEL);
    if built.join("config.json").exists() {
        built
    } else {
        PathBuf::from(DEFAULT_MODEL)
    }
}

fn model_dir(a: &ModelArgs) -> PathBuf {
    a.model.clone().unwrap_or_else(default_model)
}

fn load(run: &RunArgs) -> Result<(PathBuf, Model)> {
    porter_core::tensor::cuda::set_deterministic(run.deterministic);
    let dir = model_dir(&run.model);
    let device = run.device.unwrap_or_else(porter_core::device::default_device);
    let opts = registry::LoadOptions { dtype: run.dtype, device, show_progress: true, quantize: run.quantize };
    let model = registry::load_with(&dir, &opts).with_context(|| format!("loading model from {}", dir.display()))?;
    Ok((dir, model))
}

fn cmd_logits(a: &LogitsArgs) -> Result<()> {
    let (dir, model) = load(&a.run)?;
    let drafts = load_drafts(&dir, &model, &a.draft, false)?;
    let ids = &a.ids.0;
    checks::logits_ids(ids, &model)?;
    let mut cache = model.new_cache_spec(1, 0)?;
    let seq = cache.alloc_seq()?;
    let vocab = model.info.vocab_size;
    let mut logits: Vec<f32> = Vec::new();
    let n = ids.len().saturating_mul(vocab);
    logits
        .try_reserve_exact(n)
        .map_err(|_| anyhow!("--ids: {} ids × vocab_size {vocab} = {n} logits do not fit in memory", ids.len()))?;
    if a.incremental {
        for (p, &id) in ids.iter().enumerate() {
            let out = model.forward(&Batch::single(seq, p, &[id]), &mut cache, LogitsFor::All)?;
            logits.extend_from_slice(&out.logits.host_vec()?);
        }
    } else {
        let out = model.forward(&Batch::single(seq, 0, ids), &mut cache, LogitsFor::All)?;
        logits.extend_from_slice(&out.logits.host_vec()?);
    }
    let mut tensors: Vec<(&str, &[f32], Vec<usize>)> = vec![("logits", &logits, vec![ids.len(), vocab])];
    let mtp = match drafts.first() {
        Some(d) if ids.len() >= 2 => Some(speculative::draft_logits(&model, d.as_ref(), ids)?.host_vec()?),
        _ => None,
    };
    if let Some(m) = &mtp {
        tensors.push(("mtp_logits", m, vec![ids.len() - 1, vocab]));
    }
    write_f32_safetensors(&a.out, &tensors)?;
    eprintln!(
        "wrote logits [{}, {}]{} to {}",
        ids.len(),
        vocab,
        if mtp.is_some() { " and mtp_logits" } else { "" },
        a.out.display()
    );
    Ok(())
}

fn write_f32_safetensors(path: &Path, tensors: &[(&str, &[f32], Vec<usize>)]) -> Result<()> {
    let bytes: Vec<Vec<u8>> =
        tensors.iter().map(|(_, d, _)| d.iter().flat_map(|v| v.to_le_bytes()).collect()).collect();
    let views: Vec<(&str, safetensors::tensor::TensorView)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((n, _, s), b)| Ok((*n, safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)?)))
        .collect::<Result<_, safetensors::SafeTensorError>>()
        .map_err(|e| anyhow!("building safetensors: {e}"))?;
    let data = safetensors::serialize(views, None).map_err(|e| anyhow!("serializing safetensors: {e}"))?;
    std::fs::write(path, data).with_context(|| format!("writing {}", path.display()))
}

fn load_tokenizer(dir: &Path) -> Result<tokenizers::Tokenizer> {
    let path = dir.join("tokenizer.json");
    if !path.exists() {
        bail!("--prompt needs {} (or pass --ids)", path.display());
    }
    tokenizers::Tokenizer::from_file(&path).map_err(|e| anyhow!("loading {}: {e}", path.display()))
}

fn cmd_generate(a: &GenerateArgs) -> Result<()> {
    let params = checks::sampling(a.temperature, a.top_k, a.top_p, a.seed)?;
    checks::max_tokens(a.max_tokens)?;
    checks::mtp_step(a.spec.mtp_step)?;
    let (dir, model) = load(&a.run)?;
    let drafts = match a.spec.mtp_step {
        Some(_) => load_drafts(&dir, &model, &a.spec.draft, true)?,
        None => vec![],
    };
    let tokenizer =
        if a.prompt.is_some() || dir.join("tokenizer.json").exists() { Some(load_tokenizer(&dir)) } else { None };
    let prompt: Vec<u32> = match (&a.prompt, &a.ids) {
        (Some(text), _) => {
            let tok =
                tokenizer.as_ref().ok_or_else(|| anyhow!("no tokenizer"))?.as_ref().map_err(|e| anyhow!("{e:#}"))?;
            let text = if a.chat { chat::render(&dir, text)? } else { text.clone() };
            tok.encode(text.as_str(), false).map_err(|e| anyhow!("tokenizing the prompt: {e}"))?.get_ids().to_vec()
        }
        (None, Some(ids)) => ids.0.clone(),
        (None, None) => bail!("pass --prompt or --ids"),
    };
    if prompt.is_empty() {
        bail!("--prompt: the text gives no tokens; at least one is needed");
    }
    checks::ids_in_vocab(if a.prompt.is_some() { "--prompt" } else { "--ids" }, &prompt, &model)?;
    // Before anything runs: the prompt and every token asked for fit the context.
    let lookahead = a.spec.mtp_step.unwrap_or(0);
    porter_core::generate::check_context(&model, prompt.len(), a.max_tokens, lookahead).with_context(|| {
        match a.spec.mtp_step {
            Some(k) => format!("--max-tokens {} with --mtp-step {k} does not fit", a.max_tokens),
            None => format!("--max-tokens {} does not fit", a.max_tokens),
        }
    })?;
    let stop = if a.ignore_eos { vec![] } else { model.info.generation.eos_token_ids.clone() };
    let (gen, per_step) = match a.spec.mtp_step {
        Some(k) => {
            let g = speculative::generate_speculative(
                &model,
                &drafts,
                &prompt,
                params,
                a.max_tokens,
                &stop,
                k,
                a.spec.mtp_mode,
            )?;
            let tps = g.tokens_per_step();
            (
                porter_core::generate::Generation { ids: g.ids, finish: g.finish },
                Some((tps, g.steps, g.accepted, g.proposed)),
            )
        }
        None => (generate(&model, &prompt, params, a.max_tokens, &stop)?, None),
    };
    let text = match tokenizer {
        Some(Ok(t)) => t.decode(&gen.ids, true).map_err(|e| anyhow!("decoding: {e}"))?,
        _ => String::new(),
    };
    if a.json {
        let mut v = serde_json::json!({
            "prompt_ids": prompt,
            "ids": gen.ids,
            "text": text,
            "finish_reason": gen.finish.as_str(),
        });
        if let Some((tps, steps, acc, prop)) = per_step {
            v["mtp"] = serde_json::json!({
                "tokens_per_step": tps,
                "accepted_per_step": acc as f64 / steps.max(1) as f64,
                "acceptance_rate": acc as f64 / prop.max(1) as f64,
                "steps": steps,
            });
        }
        println!("{v}");
    } else {
        println!("{text}");
        eprintln!("[{} tokens, finish: {}]", gen.ids.len(), gen.finish.as_str());
    }
    Ok(())
}

/// The text of `--config`: a preset name or a file.
fn config_text(c: &str) -> Result<String> {
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

/// A random-weight model of the `--config` geometry (`--layers` overrides its depth).
fn random_model(c: &str, layers: Option<usize>, run: &RunArgs, device: Device) -> Result<Model> {
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
    checks::random_weights_fit(&cfg, run.dtype, device)?;
    if run.quantize.is_some() {
        bail!("--quantize applies to --model checkpoints; random-weight models (--config) are not quantized yet");
    }
    porter_core::tensor::cuda::set_deterministic(run.deterministic);
    Ok(registry::build_random(&cfg, Path::new("."), run.dtype, device, 0)?)
}

fn cmd_serve(a: &ServeCmd) -> Result<()> {
    checks::mtp_step(a.spec.mtp_step)?;
    let device = a.run.device.unwrap_or_else(porter_core::device::default_device);
    let (dir, model, random) = match &a.random.config {
        Some(c) => {
            // A benchmark server: random weights, the tokenizer from --tokenizer.
            let tok = a.serve.tokenizer.as_ref().ok_or_else(|| {
                anyhow!("--config serves random weights and needs --tokenizer FILE (a tokenizer.json for the text)")
            })?;
            if a.spec.mtp_step.is_some() {
                bail!("--mtp-step needs a model folder with a draft head (--model), not --config");
            }
            let m = random_model(c, a.random.layers, &a.run, device)?;
            eprintln!("porter serve: RANDOM weights of the --config `{c}` geometry; the text is meaningless");
            let dir = tok.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
            (dir, m, Some(c.clone()))
        }
        None => {
            if a.random.layers.is_some() {
                bail!("--layers applies to a --config geometry only (it would be ignored for a model folder)");
            }
            let (dir, m) = load(&a.run)?;
            (dir, m, None)
        }
    };
    let spec = match a.spec.mtp_step {
        Some(k) => Some(porter_core::engine::SpecConfig {
            drafts: load_drafts(&dir, &model, &a.spec.draft, true)?,
            k,
            mode: a.spec.mtp_mode,
        }),
        None => {
            if !a.spec.draft.drafts.is_empty() {
                bail!("--draft needs --mtp-step K (the draft tokens per step)");
            }
            None
        }
    };
    serve::run(model, serve::Source { dir, random, spec }, &a.serve)
}

fn cmd_bench(a: &BenchArgs) -> Result<()> {
    use std::time::Instant;
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
        let n = a.steps.max(2);
        if a.context.saturating_add(n).saturating_add(k) > checks::context(&model) {
            bail!(
                "--context {} plus --steps {n} plus --mtp-step {k} exceed the model's context of max_position_embeddings = {}",
                a.context,
                checks::context(&model)
            );
        }
    }
    let vocab = model.info.vocab_size as u32;
    let tok = |i: usize| (i as u32 * 7919 + 3) % vocab;
    let mut results = Vec::new();
    println!("bench {label}: {} layers, {}, {device}", model.info.num_layers, a.run.dtype);
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
        let ids: Vec<u32> = (0..n).map(tok).collect();
        if device != Device::Cpu {
            // One untimed run at this length (first use of the prefill kernels at this size:
            // the memory pool grows, cuBLAS picks its algorithms), as hf_bench.py does.
            let mut c = model.new_cache_spec(1, 0)?;
            let s = c.alloc_seq()?;
            model.forward(&Batch::single(s, 0, &ids), &mut c, LogitsFor::Last)?;
        }
        let mut cache = model.new_cache_spec(1, 0)?;
        let seq = cache.alloc_seq()?;
        model.sync()?;
        let _ = porter_core::backend::cuda::profile::take();
        let t0 = Instant::now();
        model.forward(&Batch::single(seq, 0, &ids), &mut cache, LogitsFor::Last)?;
        model.sync()?;
        let s = t0.elapsed().as_secs_f64();
        println!("prefill {n:>6} tokens: {:>10.1} tok/s ({:.3} s)", n as f64 / s, s);
        for (name, secs, calls) in porter_core::backend::cuda::profile::take() {
            println!("  profile {name:<36} {:>9.3} ms {:>6} calls", secs * 1e3, calls);
        }
        results.push(serde_json::json!({"kind": "prefill", "tokens": n, "seconds": s, "tokens_per_s": n as f64 / s}));
    }
    for &b in &a.batch {
        let mut cache = model.new_cache_spec(b, 0)?;
        let mut batch = Batch::default();
        let mut seqs = Vec::with_capacity(b);
        for j in 0..b {
            let seq = cache.alloc_seq()?;
            let ids: Vec<u32> = (0..a.context).map(|i| tok(i + j)).collect();
            batch.push(seq, 0, &ids);
            seqs.push(seq);
        }
        model.forward(&batch, &mut cache, LogitsFor::Last)?;
        model.sync()?;
        let _ = porter_core::backend::cuda::profile::take();
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
        for (name, secs, calls) in porter_core::backend::cuda::profile::take() {
            println!("  profile {name:<36} {:>9.3} ms/step {:>6} calls", secs * 1e3 / a.steps as f64, calls / a.steps);
        }
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
        results.push(serde_json::json!({"kind": "decode", "batch": b, "steps": a.steps, "context": a.context, "seconds": s, "tokens_per_s": tps, "ms_per_step": step_s * 1e3, "host_issue_ms_per_step": issue * 1e3 / a.steps as f64, "host_ms_first_step": issue_first * 1e3, "bytes_per_step": bytes, "bandwidth_bytes_per_s": bw, "roofline_bytes_per_s": roofline, "roofline_fraction": frac}));
    }
    if let Some(kmax) = a.mtp_step {
        let prompt: Vec<u32> = (0..a.context).map(tok).collect();
        let n = a.steps.max(2);
        let p = SamplingParams::default();
        let t0 = Instant::now();
        let plain = generate(&model, &prompt, p.clone(), n, &[])?;
        let base = n as f64 / t0.elapsed().as_secs_f64();
        println!("mtp baseline (batch 1, plain decode incl. prefill): {base:>10.1} tok/s");
        results.push(serde_json::json!({"kind": "mtp_baseline", "tokens": n, "tokens_per_s": base}));
        let mut seq = prompt.clone();
        seq.extend_from_slice(&plain.ids);
        let real: Vec<Box<dyn DraftHead>> = match &a.random.config {
            Some(_) if a.draft.drafts.is_empty() => vec![],
            _ => {
                let dir = model_dir(&a.run.model);
                load_drafts(&dir, &model, &a.draft, false)?
            }
        };
        for k in 1..=kmax {
            let oracle: Vec<Box<dyn DraftHead>> = vec![Box::new(porter_core::draft::OracleDraft {
                sequence: seq.clone(),
                wrong_every: None,
                vocab_size: model.info.vocab_size,
            })];
            let mut runs = vec![("forced 100% acceptance", &oracle)];
            if !real.is_empty() {
                runs.push(("draft head", &real));
            }
            for (what, drafts) in runs {
                let t0 = Instant::now();
                let g =
                    speculative::generate_speculative(&model, drafts, &prompt, p.clone(), n, &[], k, MtpMode::Eagle)?;
                let tps = n as f64 / t0.elapsed().as_secs_f64();
                if g.ids != plain.ids {
                    let at = g.ids.iter().zip(&plain.ids).position(|(a, b)| a != b).unwrap_or(0);
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
                let acc = g.accepted as f64 / g.proposed.max(1) as f64;
                println!(
                    "mtp k={k} {what:<24}: {tps:>10.1} tok/s, speed-up {:.2}x, acceptance {:.1}%, {:.2} tokens/step",
                    tps / base,
                    acc * 100.0,
                    g.tokens_per_step()
                );
                results.push(serde_json::json!({"kind": "mtp", "k": k, "draft": what, "tokens_per_s": tps, "speedup": tps / base, "acceptance": acc, "tokens_per_step": g.tokens_per_step()}));
            }
        }
    }
    if let Some(p) = &a.json {
        let v = serde_json::json!({"model": label, "layers": model.info.num_layers, "dtype": a.run.dtype.to_string(), "device": device.to_string(), "threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1), "hbm_copy_bandwidth_bytes_per_s": roofline, "results": results});
        std::fs::write(p, serde_json::to_string_pretty(&v)?).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

fn cmd_inspect(a: &InspectArgs) -> Result<()> {
    let dir = model_dir(&a.model);
    let p = registry::prepare(&dir)?;
    let (consumed, ignored) = p.map.coverage(&p.checkpoint);
    let total = p.checkpoint.tensors().len();
    println!("model folder : {}", dir.display());
    println!("architecture : {}", p.entry.architecture);
    println!("model crate  : {}", p.entry.crate_name);
    println!("config       : {}", (p.entry.describe)(&p.config)?);
    println!(
        "checkpoint   : {} tensors in {} file(s), {:.1} MiB",
        total,
        p.checkpoint.paths().count(),
        p.checkpoint.total_bytes() as f64 / (1 << 20) as f64
    );
    println!(
        "weight map   : {} slots; {consumed} tensors consumed, {ignored} ignored, {} unmatched",
        p.map.slots.len(),
        total - consumed - ignored
    );
    match p.map.validate(&p.checkpoint) {
        Ok(()) => println!("status       : every checkpoint tensor is mapped"),
        Err(e) => println!("status       : {e}"),
    }
    println!("quantization : {}", porter_core::quant::inspect_line(&p));
    // Drafts: the --draft folders, or the head inside the main checkpoint.
    let draft_dirs: Vec<PathBuf> = if a.draft.drafts.is_empty() {
        let arch = p.entry.architecture;
        let builtin = registry::draft_entries()
            .iter()
            .any(|e| e.main_architectures.contains(&arch) && p.checkpoint.get(e.signature).is_some());
        if builtin {
            vec![dir.clone()]
        } else {
            vec![]
        }
    } else {
        a.draft.drafts.clone()
    };
    if draft_dirs.is_empty() {
        println!("draft        : none");
    }
    // Draft checks need the main model's facts; a light load of the config gives them.
    for d in draft_dirs {
        let info = porter_core::ModelInfo {
            architecture: p.entry.architecture.to_owned(),
            vocab_size: p.config.get("vocab_size").and_then(|v| v.as_u64()).unwrap_or(0) as usize,
            hidden_size: p.config.get("hidden_size").and_then(|v| v.as_u64()).unwrap_or(0) as usize,
            num_layers: 0,
            dtype: DType::F32,
            device: Device::Cpu,
            max_position_embeddings: None,
            generation: Default::default(),
        };
        let pd = registry::prepare_draft(&d, &p.config, &info, DType::F32)?;
        let (consumed, ignored) = pd.map.coverage(&pd.checkpoint);
        println!(
            "draft        : {} from {} ({} slots; {consumed} tensors consumed, {ignored} left to the main model)",
            pd.entry.name,
            d.display(),
            pd.map.slots.len()
        );
        match pd.map.validate(&pd.checkpoint) {
            Ok(()) => println!("draft status : every draft tensor is mapped"),
            Err(e) => println!("draft status : {e}"),
        }
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    models::link();
    match cli.cmd {
        Cmd::Logits(a) => cmd_logits(&a),
        Cmd::Generate(a) => cmd_generate(&a),
        Cmd::Inspect(a) => cmd_inspect(&a),
        Cmd::Bench(a) => cmd_bench(&a),
        Cmd::Serve(a) => cmd_serve(&a),
        Cmd::Load(a) => load_cmd::cmd_load(&a),
        Cmd::Models => {
            for e in registry::entries() {
                println!("{}\t{}", e.architecture, e.crate_name);
            }
            Ok(())
        }
    }
}

/// The error and its causes on one line. A typed `porter_core::Error` with context shows
/// its cause in its own message, so a cause that the text already ends with is skipped.
fn render(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if out.ends_with(&s) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&s);
    }
    out
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", render(&e));
            ExitCode::FAILURE
        }
    }
}

//! `porter`: load a Hugging Face checkpoint and run it.
//!
//! Subcommands: `logits`, `generate`, `inspect`, `models`, `bench`, `load`, `serve`,
//! `kernels`. Without `--model`, the bundled tiny checkpoint in `tests/fixtures/` is used.

mod checks;
mod serve;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use porter_core::draft::DraftHead;
use porter_core::generate::generate;
use porter_core::sampling::SamplingParams;
use porter_core::speculative::{self, MtpMode};
use porter_core::state::KvDtype;
use porter_core::{registry, Batch, DType, Device, LogitsFor, Model, StateCache};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod bench_cmd;
mod chat;
mod engine_sizes;
mod kernels_cmd;
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
    Bench(bench_cmd::BenchArgs),
    /// Load a model and report load time, throughput, peak host memory and device memory
    /// (or print the tensors a checkpoint for a config must hold).
    Load(load_cmd::LoadArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (chat and text completions,
    /// streaming, /v1/models, /health, /metrics, /tokenize, /detokenize).
    Serve(ServeCmd),
    /// Compile the CUDA kernels for the named architectures into the on-disk PTX cache
    /// (needs NVRTC, no GPU), so that a GPU machine's first start skips NVRTC.
    Kernels(kernels_cmd::KernelsArgs),
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
    /// Run every CUDA forward eagerly: no CUDA graphs. (By default, decode and speculative
    /// verify steps on CUDA replay graphs captured per batch shape; `PORTER_CUDA_GRAPHS=0`
    /// turns them off too.)
    #[arg(long)]
    enforce_eager: bool,
    /// Quantize the weights at load: fp8 (block-128 e4m3, the layout of Qwen's FP8
    /// checkpoints; embeddings, lm_head, norms, routers and gates stay in the model dtype).
    /// MTP draft heads are quantized by the same rules (their input projection `mtp.fc` /
    /// `eh_proj` stays in the model dtype).
    #[arg(long)]
    quantize: Option<porter_core::quant::Quantize>,
    /// Tensor-parallel ranks: each loads its shard of the weights (heads, MLP and expert
    /// slices, vocabulary rows) and runs on its own thread; on the CPU for now.
    #[arg(long = "tensor-parallel-size", short = 't', default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    tensor_parallel_size: u16,
    /// KV cache element type: auto (the model dtype), fp8 (e4m3) or int8, both with one
    /// f32 scale per token and KV head (about half the bytes of bf16 per token).
    #[arg(long, default_value = "auto", value_parser = parse_kv_dtype)]
    kv_cache_dtype: KvDtype,
}

fn parse_kv_dtype(s: &str) -> Result<KvDtype, String> {
    s.parse()
}

#[derive(Args, Clone, Default)]
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
    /// Tokens to generate at most (fewer when an end-of-sequence id comes first).
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f32,
    /// Nucleus sampling: keep the most likely tokens whose probabilities add up to p, in (0, 1].
    #[arg(long, allow_negative_numbers = true)]
    top_p: Option<f32>,
    /// Keep the k most likely tokens before sampling.
    #[arg(long)]
    top_k: Option<usize>,
    /// Seed of the sampler.
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
    /// vLLM's form of the same: a JSON object `{"method": "mtp" | "qwen3_next_mtp" | …,
    /// "num_speculative_tokens": K, "model": DRAFT_DIR (optional)}`, instead of --mtp-step and
    /// --draft.
    #[arg(long, value_name = "JSON")]
    speculative_config: Option<String>,
}

impl SpecArgs {
    /// The draft tokens per step and the draft folders: from --mtp-step / --draft, or from
    /// --speculative-config (vLLM's JSON).
    fn resolve(&self) -> Result<(Option<usize>, DraftArgs)> {
        let Some(text) = &self.speculative_config else { return Ok((self.mtp_step, self.draft.clone())) };
        if self.mtp_step.is_some() || !self.draft.drafts.is_empty() {
            bail!("--speculative-config replaces --mtp-step and --draft: give one or the other");
        }
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| anyhow!("--speculative-config is not JSON: {e}"))?;
        let o = v.as_object().ok_or_else(|| anyhow!("--speculative-config must be a JSON object"))?;
        const METHODS: [&str; 6] =
            ["mtp", "qwen3_next_mtp", "qwen3_moe_mtp", "mistral_mtp", "deepseek_mtp", "ernie_mtp"];
        for (k, x) in o {
            match k.as_str() {
                "method" => match x.as_str() {
                    Some(m) if METHODS.contains(&m) => {}
                    _ => bail!(
                        "--speculative-config: method {x} is not supported (porter drafts with MTP heads: {})",
                        METHODS.join(", ")
                    ),
                },
                "num_speculative_tokens" | "model" => {}
                other => bail!(
                    "--speculative-config: the key `{other}` is not supported (method, num_speculative_tokens, model)"
                ),
            }
        }
        let k = o
            .get("num_speculative_tokens")
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| anyhow!("--speculative-config needs `num_speculative_tokens` (an integer)"))?;
        let drafts = match o.get("model") {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(serde_json::Value::String(m)) => vec![PathBuf::from(m)],
            Some(m) => bail!("--speculative-config: `model` must be a draft folder path, got {m}"),
        };
        Ok((Some(k as usize), DraftArgs { drafts }))
    }
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
/// checkpoint when there is one. `required` makes "no draft" an error. `quantize` is the main
/// model's `--quantize`: the drafts are quantized by the same rules.
fn load_drafts(
    dir: &Path,
    model: &Model,
    args: &DraftArgs,
    required: bool,
    quantize: Option<porter_core::quant::Quantize>,
) -> Result<Vec<Box<dyn DraftHead>>> {
    let cfg = porter_core::config::read_config(dir)?;
    if !args.drafts.is_empty() {
        return Ok(args
            .drafts
            .iter()
            .map(|d| registry::load_draft_with(d, &cfg, model, quantize))
            .collect::<porter_core::Result<_>>()?);
    }
    let builtin = porter_core::checkpoint::Checkpoint::open_dir(dir)?;
    let has_builtin = registry::draft_entries().iter().any(|e| {
        e.main_architectures.contains(&model.info.architecture.as_str()) && builtin.get(e.signature).is_some()
    });
    if has_builtin {
        return Ok(vec![registry::load_draft_with(dir, &cfg, model, quantize)?]);
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
    if run.enforce_eager {
        porter_core::backend::cuda::graph::set_enabled(false);
    }
    let dir = model_dir(&run.model);
    let device = run.device.unwrap_or_else(porter_core::device::default_device);
    let opts = registry::LoadOptions {
        dtype: run.dtype,
        device,
        show_progress: true,
        quantize: run.quantize,
        tensor_parallel: usize::from(run.tensor_parallel_size),
    };
    let mut model =
        registry::load_with(&dir, &opts).with_context(|| format!("loading model from {}", dir.display()))?;
    model.info.kv_cache_dtype = run.kv_cache_dtype;
    Ok((dir, model))
}

fn cmd_logits(a: &LogitsArgs) -> Result<()> {
    let (dir, model) = load(&a.run)?;
    let drafts = load_drafts(&dir, &model, &a.draft, false, a.run.quantize)?;
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
    let (mtp_step, draft) = a.spec.resolve()?;
    checks::mtp_step(mtp_step)?;
    let (dir, model) = load(&a.run)?;
    let drafts = match mtp_step {
        Some(_) => load_drafts(&dir, &model, &draft, true, a.run.quantize)?,
        None => vec![],
    };
    let tokenizer =
        if a.prompt.is_some() || dir.join("tokenizer.json").exists() { Some(load_tokenizer(&dir)) } else { None };
    let prompt: Vec<u32> = match (&a.prompt, &a.ids) {
        (Some(text), _) => {
            let tok =
                tokenizer.as_ref().ok_or_else(|| anyhow!("no tokenizer"))?.as_ref().map_err(|e| anyhow!("{e:#}"))?;
            let text = if a.chat { chat::render(&dir, text)? } else { text.clone() };
            // A raw prompt gets the tokenizer's special tokens (a Llama / Mistral BOS), as
            // transformers' tokenizer and `porter serve`'s completions do; a rendered chat
            // carries its own.
            tok.encode(text.as_str(), !a.chat).map_err(|e| anyhow!("tokenizing the prompt: {e}"))?.get_ids().to_vec()
        }
        (None, Some(ids)) => ids.0.clone(),
        (None, None) => bail!("pass --prompt or --ids"),
    };
    if prompt.is_empty() {
        bail!("--prompt: the text gives no tokens; at least one is needed");
    }
    checks::ids_in_vocab(if a.prompt.is_some() { "--prompt" } else { "--ids" }, &prompt, &model)?;
    // Before anything runs: the prompt and every token asked for fit the context.
    let lookahead = mtp_step.unwrap_or(0);
    porter_core::generate::check_context(&model, prompt.len(), a.max_tokens, lookahead).with_context(
        || match mtp_step {
            Some(k) => format!("--max-tokens {} with --mtp-step {k} does not fit", a.max_tokens),
            None => format!("--max-tokens {} does not fit", a.max_tokens),
        },
    )?;
    let stop = if a.ignore_eos { vec![] } else { model.info.generation.eos_token_ids.clone() };
    let (gen, per_step) = match mtp_step {
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

fn cmd_serve(a: &ServeCmd) -> Result<()> {
    serve::init_logging();
    let (mtp_step, draft) = a.spec.resolve()?;
    checks::mtp_step(mtp_step)?;
    let device = a.run.device.unwrap_or_else(porter_core::device::default_device);
    let (dir, model, random) = match &a.random.config {
        Some(c) => {
            // A benchmark server: random weights, the tokenizer from --tokenizer.
            let tok = a.serve.tokenizer.as_ref().ok_or_else(|| {
                anyhow!("--config serves random weights and needs --tokenizer FILE (a tokenizer.json for the text)")
            })?;
            if mtp_step.is_some() {
                bail!("--mtp-step needs a model folder with a draft head (--model), not --config");
            }
            let m = bench_cmd::random_model(c, a.random.layers, &a.run, device)?;
            tracing::warn!("RANDOM weights of the --config `{c}` geometry: the text is meaningless");
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
    let spec = match mtp_step {
        Some(k) => Some(porter_core::engine::SpecConfig {
            drafts: load_drafts(&dir, &model, &draft, true, a.run.quantize)?,
            k,
            mode: a.spec.mtp_mode,
        }),
        None => {
            if !draft.drafts.is_empty() {
                bail!("--draft needs --mtp-step K (the draft tokens per step)");
            }
            None
        }
    };
    serve::run(model, serve::Source { dir, random, spec }, &a.serve)
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
            kv_cache_dtype: Default::default(),
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
        let dq = porter_core::quant::QuantConfig::from_config(&pd.config)?;
        println!("draft quant  : {}", porter_core::quant::inspect_line_for(&pd.map, &pd.checkpoint, dq.as_ref()));
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    models::link();
    match cli.cmd {
        Cmd::Logits(a) => cmd_logits(&a),
        Cmd::Generate(a) => cmd_generate(&a),
        Cmd::Inspect(a) => cmd_inspect(&a),
        Cmd::Bench(a) => bench_cmd::cmd_bench(&a),
        Cmd::Serve(a) => cmd_serve(&a),
        Cmd::Load(a) => load_cmd::cmd_load(&a),
        Cmd::Kernels(a) => kernels_cmd::cmd_kernels(&a),
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

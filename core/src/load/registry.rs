//! The model registry: each model crate submits a [`ModelEntry`] keyed by its HF
//! `architectures` string; [`load`] selects the entry from `config.json`, resolves the
//! entry's declarative weight map, loads the checkpoint and builds the [`Model`].

use crate::error::{Context, Result};
use crate::load::checkpoint::Checkpoint;
use crate::load::config;
use crate::load::quant::{QuantConfig, Quantize};
use crate::load::weight_map::{MapContext, ResolvedMap, WeightMap, Weights};
use crate::model::Model;
use crate::tensor::device::Device;
use crate::tensor::dtype::DType;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// What a model crate gets when it builds a model.
pub struct LoadContext<'a> {
    pub dir: &'a Path,
    pub config: &'a Value,
    pub dtype: DType,
    pub device: Device,
}

/// A registered model implementation.
pub struct ModelEntry {
    /// The HF `architectures` string, e.g. `"Qwen3ForCausalLM"`.
    pub architecture: &'static str,
    /// The crate implementing it.
    pub crate_name: &'static str,
    /// Text of the crate's weight map (`weight-maps/<model>.toml`).
    pub weight_map: &'static str,
    /// Parses and validates the config, returning the values the map is resolved against.
    pub map_context: fn(&Value) -> Result<MapContext>,
    /// One-paragraph config summary for `porter inspect`.
    pub describe: fn(&Value) -> Result<String>,
    /// Builds the model from its loaded weight slots.
    pub build: fn(&LoadContext, &mut Weights) -> Result<Model>,
}

inventory::collect!(ModelEntry);

/// The registry could not serve a config.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("unknown architecture `{arch}`; registered architectures: {}", known.join(", "))]
    UnknownArchitecture { arch: String, known: Vec<String> },
    #[error("architecture `{0}` is registered twice")]
    Duplicate(String),
}

/// Every registered entry, sorted by architecture.
pub fn entries() -> Vec<&'static ModelEntry> {
    let mut v: Vec<&'static ModelEntry> = inventory::iter::<ModelEntry>.into_iter().collect();
    v.sort_by_key(|e| e.architecture);
    v
}

/// The sorted list of registered architectures.
pub fn architectures() -> Vec<&'static str> {
    entries().iter().map(|e| e.architecture).collect()
}

/// Finds the entry for an architecture.
pub fn lookup(arch: &str) -> Result<&'static ModelEntry, RegistryError> {
    let all = entries();
    let mut found = all.iter().filter(|e| e.architecture == arch);
    match (found.next(), found.next()) {
        (Some(e), None) => Ok(e),
        (Some(_), Some(_)) => Err(RegistryError::Duplicate(arch.to_owned())),
        (None, _) => Err(RegistryError::UnknownArchitecture {
            arch: arch.to_owned(),
            known: all.iter().map(|e| e.architecture.to_owned()).collect(),
        }),
    }
}

/// A model folder opened and matched against its registry entry, before loading weights.
pub struct Prepared {
    pub dir: PathBuf,
    pub config: Value,
    pub entry: &'static ModelEntry,
    pub map: ResolvedMap,
    pub checkpoint: std::sync::Arc<Checkpoint>,
    /// The checkpoint's `quantization_config` (block-128 FP8), if any.
    pub quant: Option<QuantConfig>,
}

/// The checkpoint's `quantization_config`, checked against its tensors: FP8 tensors need the
/// config, and the config needs FP8 tensors.
fn check_quant(config: &Value, ckpt: &Checkpoint, dir: &Path) -> Result<Option<QuantConfig>> {
    let quant = QuantConfig::from_config(config).with_context(|| format!("config.json in {}", dir.display()))?;
    let fp8 = ckpt.tensors().keys().find(|n| ckpt.is_fp8(n));
    match (&quant, fp8) {
        (None, Some(n)) => crate::bail!(
            Checkpoint,
            "tensor `{n}` is F8_E4M3 but config.json in {} has no quantization_config",
            dir.display()
        ),
        (Some(_), None) => crate::bail!(
            Checkpoint,
            "config.json in {} declares an fp8 quantization_config but the checkpoint has no F8_E4M3 tensor",
            dir.display()
        ),
        _ => Ok(quant),
    }
}

/// How [`load_with`] loads a model.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// The compute dtype.
    pub dtype: DType,
    /// Where the weights go.
    pub device: Device,
    /// A progress bar for large checkpoints.
    pub show_progress: bool,
    /// Online quantization of a dense checkpoint (`--quantize`); FP8 checkpoints are FP8
    /// without it.
    pub quantize: Option<Quantize>,
    /// Tensor-parallel ranks (`--tensor-parallel-size`; 1: none). Each rank loads its shard
    /// of the weights (the weight map's `shard` rules) and runs on its own thread.
    pub tensor_parallel: usize,
}

/// Reads the config, selects the entry, resolves its weight map and opens the checkpoint.
pub fn prepare(dir: &Path) -> Result<Prepared> {
    if !dir.is_dir() {
        crate::bail!(Registry, "model folder {} does not exist", dir.display());
    }
    let config = config::read_config(dir)?;
    let arch = config::architecture(&config)?;
    let entry = lookup(&arch)?;
    let ctx = (entry.map_context)(&config).with_context(|| format!("invalid {arch} config in {}", dir.display()))?;
    let map = WeightMap::parse(entry.weight_map)
        .with_context(|| format!("weight map of {}", entry.crate_name))?
        .resolve(&ctx)
        .with_context(|| format!("resolving the weight map of {}", entry.crate_name))?;
    let checkpoint = std::sync::Arc::new(Checkpoint::open_dir(dir)?);
    let quant = check_quant(&config, &checkpoint, dir)?;
    Ok(Prepared { dir: dir.to_owned(), config, entry, map, checkpoint, quant })
}

/// The resolved weight map of a config alone (what a checkpoint for it must hold).
pub fn resolve_config(config: &Value) -> Result<ResolvedMap> {
    let arch = config::architecture(config)?;
    let entry = lookup(&arch)?;
    let ctx = (entry.map_context)(config).with_context(|| format!("invalid {arch} config"))?;
    WeightMap::parse(entry.weight_map)?.resolve(&ctx)
}

/// Builds a model with random weights from a config alone (benchmarks). `dir` is used
/// only for `generation_config.json` when it exists.
pub fn build_random(config: &Value, dir: &Path, dtype: DType, device: Device, seed: u64) -> Result<Model> {
    build_random_with(config, dir, dtype, device, seed, None)
}

/// [`build_random`] with online quantization: under `Some(Quantize::Fp8)` every slot that
/// [`QuantConfig::quantizes`] is generated in `dtype` and block-quantized to FP8 (on a GPU by a
/// device kernel, so the FP8 80B geometry never exists dense).
pub fn build_random_with(
    config: &Value,
    dir: &Path,
    dtype: DType,
    device: Device,
    seed: u64,
    quantize: Option<Quantize>,
) -> Result<Model> {
    crate::tensor::device::check_device(device)?;
    let arch = config::architecture(config)?;
    let entry = lookup(&arch)?;
    let ctx = (entry.map_context)(config).with_context(|| format!("invalid {arch} config"))?;
    let map = WeightMap::parse(entry.weight_map)?.resolve(&ctx)?;
    // On a GPU each slot is generated on the device when the model takes it (an 80B-class
    // geometry never exists on the host); on the CPU, all at once.
    let mut weights = Weights::random(&map, dtype, seed, device);
    if quantize == Some(Quantize::Fp8) {
        weights.set_quantize(Some(QuantConfig::fp8()));
    }
    let lc = LoadContext { dir, config, dtype, device };
    (entry.build)(&lc, &mut weights)
}

/// Loads a model folder end to end.
pub fn load(dir: &Path, dtype: DType, device: Device, show_progress: bool) -> Result<Model> {
    load_with(dir, &LoadOptions { dtype, device, show_progress, quantize: None, tensor_parallel: 1 })
}

/// [`load`] with every option: also online FP8 quantization (`quantize`), which turns each
/// eligible linear weight ([`QuantConfig::quantizes`]) of a dense checkpoint into block-128 FP8
/// as it is read.
pub fn load_with(dir: &Path, o: &LoadOptions) -> Result<Model> {
    crate::tensor::device::check_device(o.device)?;
    let p = prepare(dir)?;
    match o.tensor_parallel {
        0 => crate::bail!(Config, "tensor-parallel size must be at least 1"),
        1 => build_rank(dir, &p, o, None),
        world => {
            if p.quant.is_some() || o.quantize.is_some() {
                crate::bail!(Config, "tensor parallelism with FP8 weights is not supported yet");
            }
            if o.device != Device::Cpu {
                crate::bail!(
                    Config,
                    "tensor parallelism runs on the CPU (in-process ranks) for now; NCCL across GPUs is not wired in yet"
                );
            }
            let group = std::sync::Arc::new(crate::comm::LocalGroup::new(world)?);
            let ranks = (0..world)
                .map(|r| {
                    build_rank(dir, &p, o, Some(crate::comm::TpGroup::comm(&*group, r)))
                        .with_context(|| format!("tensor-parallel rank {r} of {world}"))
                })
                .collect::<Result<Vec<_>>>()?;
            Model::tensor_parallel(group, ranks)
        }
    }
}

/// Builds one rank's model (the whole model without tensor parallelism).
fn build_rank(
    dir: &Path,
    p: &Prepared,
    o: &LoadOptions,
    comm: Option<std::sync::Arc<dyn crate::comm::Communicator>>,
) -> Result<Model> {
    let (dtype, device, show_progress) = (o.dtype, o.device, o.show_progress);
    let mut weights = p.map.load(p.checkpoint.clone(), dtype)?;
    if let Some(c) = comm {
        weights.set_tensor_parallel(c)?;
    }
    weights.set_device(device);
    if o.quantize == Some(Quantize::Fp8) && p.quant.is_none() {
        weights.set_quantize(Some(QuantConfig::fp8()));
    }
    let bar = if show_progress && p.checkpoint.total_bytes() > (64 << 20) {
        let b = indicatif::ProgressBar::new(weights.tensors_to_read());
        b.set_style(
            indicatif::ProgressStyle::with_template("loading weights {bar:40} {pos}/{len} tensors {elapsed}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Some(b)
    } else {
        None
    };
    weights.set_progress(bar.clone());
    let lc = LoadContext { dir, config: &p.config, dtype, device };
    let model = (p.entry.build)(&lc, &mut weights)?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let left = weights.remaining();
    if !left.is_empty() {
        crate::bail!(Registry, "internal error: {} built without using weight slots {:?}", p.entry.crate_name, left);
    }
    Ok(model)
}

/// What a draft crate gets when it builds a draft head.
pub struct DraftLoadContext<'a> {
    pub dir: &'a Path,
    /// The draft folder's `config.json`, or the main model's when the draft lives inside
    /// the main checkpoint.
    pub config: &'a Value,
    pub main_config: &'a Value,
    pub main: &'a crate::model::ModelInfo,
    pub checkpoint: &'a Checkpoint,
    pub dtype: DType,
}

/// A registered draft head implementation, attached to one or more main architectures.
pub struct DraftEntry {
    /// The draft crate, e.g. `"qwen3_next_mtp"`.
    pub name: &'static str,
    /// Main architectures the draft attaches to.
    pub main_architectures: &'static [&'static str],
    /// A checkpoint tensor whose presence identifies this draft layout.
    pub signature: &'static str,
    /// Text of the crate's weight map.
    pub weight_map: &'static str,
    /// The head is stored inside the main model's checkpoint (Qwen3-Next's `mtp.*`): it is
    /// part of the architecture, so a random-weight build of the main config builds it too
    /// ([`build_random_draft`]). Heads shipped as separate folders (LightLLM's) are not.
    pub in_main_checkpoint: bool,
    pub map_context: fn(&DraftLoadContext) -> Result<MapContext>,
    pub build: fn(&DraftLoadContext, &mut Weights) -> Result<Box<dyn crate::model::draft::DraftHead>>,
}

inventory::collect!(DraftEntry);

/// Every registered draft, sorted by name.
pub fn draft_entries() -> Vec<&'static DraftEntry> {
    let mut v: Vec<&'static DraftEntry> = inventory::iter::<DraftEntry>.into_iter().collect();
    v.sort_by_key(|e| e.name);
    v
}

/// A draft folder matched against the registry and resolved, before loading weights.
pub struct PreparedDraft {
    pub entry: &'static DraftEntry,
    pub config: Value,
    pub map: ResolvedMap,
    pub checkpoint: std::sync::Arc<Checkpoint>,
}

/// Selects the draft implementation for `dir` (by main architecture and tensor signature)
/// and resolves its weight map.
pub fn prepare_draft(
    dir: &Path,
    main_config: &Value,
    main: &crate::model::ModelInfo,
    dtype: DType,
) -> Result<PreparedDraft> {
    if !dir.is_dir() {
        crate::bail!(Registry, "draft folder {} does not exist", dir.display());
    }
    let checkpoint = std::sync::Arc::new(Checkpoint::open_dir(dir)?);
    let config = if dir.join("config.json").exists() { config::read_config(dir)? } else { main_config.clone() };
    let all = draft_entries();
    let entry = all
        .iter()
        .find(|e| e.main_architectures.contains(&main.architecture.as_str()) && checkpoint.get(e.signature).is_some())
        .ok_or_else(|| {
            let known: Vec<String> = all
                .iter()
                .map(|e| format!("{} (tensor `{}`, for {})", e.name, e.signature, e.main_architectures.join("/")))
                .collect();
            crate::err!(
                Registry,
                "draft folder {} matches no registered draft head for {}; registered drafts: {}",
                dir.display(),
                main.architecture,
                known.join("; ")
            )
        })?;
    for (key, want) in [("hidden_size", main.hidden_size), ("vocab_size", main.vocab_size)] {
        if let Some(got) = config.get(key).and_then(Value::as_u64) {
            if got as usize != want {
                crate::bail!(Registry, "draft {} has {key} = {got} but the main model has {want}", dir.display());
            }
        }
    }
    let lc = DraftLoadContext { dir, config: &config, main_config, main, checkpoint: &checkpoint, dtype };
    let ctx = (entry.map_context)(&lc).with_context(|| format!("draft {} in {}", entry.name, dir.display()))?;
    let map = WeightMap::parse(entry.weight_map)?.resolve(&ctx)?;
    Ok(PreparedDraft { entry, config, map, checkpoint })
}

/// Loads a draft head for `main` from `dir`.
pub fn load_draft(dir: &Path, main_config: &Value, main: &Model) -> Result<Box<dyn crate::model::draft::DraftHead>> {
    load_draft_with(dir, main_config, main, None)
}

/// [`load_draft`] with online quantization: under `Some(Quantize::Fp8)` each eligible linear
/// weight of a dense draft checkpoint ([`QuantConfig::quantizes`], the main model's rules:
/// Qwen3-Next's `mtp.fc`, the FFN heads' `eh_proj` / `proj`, norms, router and
/// `shared_expert_gate` stay in the model dtype) becomes block-128 FP8 as it is read. A draft
/// whose checkpoint is FP8 already (the `mtp.*` of an FP8 Qwen3-Next checkpoint) loads as
/// stored, with or without it.
pub fn load_draft_with(
    dir: &Path,
    main_config: &Value,
    main: &Model,
    quantize: Option<Quantize>,
) -> Result<Box<dyn crate::model::draft::DraftHead>> {
    let dtype = main.info.dtype;
    let p = prepare_draft(dir, main_config, &main.info, dtype)?;
    let mut weights = p
        .map
        .load(p.checkpoint.clone(), dtype)
        .with_context(|| format!("draft {} in {}", p.entry.name, dir.display()))?;
    weights.set_device(main.info.device);
    let stored_fp8 = p.checkpoint.tensors().keys().any(|n| p.checkpoint.is_fp8(n));
    if quantize == Some(Quantize::Fp8) && !stored_fp8 {
        weights.set_quantize(Some(QuantConfig::fp8()));
    }
    let lc =
        DraftLoadContext { dir, config: &p.config, main_config, main: &main.info, checkpoint: &p.checkpoint, dtype };
    let head = (p.entry.build)(&lc, &mut weights)?;
    let left = weights.remaining();
    if !left.is_empty() {
        crate::bail!(Registry, "internal error: draft {} built without using weight slots {:?}", p.entry.name, left);
    }
    Ok(head)
}

/// The draft head that is part of `main`'s architecture ([`DraftEntry::in_main_checkpoint`]:
/// Qwen3-Next's MTP layer), built with random weights from the main config alone, on `main`'s
/// device and in its dtype (benchmarks: `porter bench --config ... --mtp-step K` times it next
/// to the oracle draft; with random weights its acceptance is about 0). `quantize` as in
/// [`build_random_with`]: the eligible slots are generated and block-quantized to FP8 by the
/// rules of [`load_draft_with`]. `Ok(None)` when the architecture carries no draft head.
pub fn build_random_draft(
    main_config: &Value,
    main: &Model,
    seed: u64,
    quantize: Option<Quantize>,
) -> Result<Option<Box<dyn crate::model::draft::DraftHead>>> {
    let arch = main.info.architecture.as_str();
    let Some(entry) =
        draft_entries().into_iter().find(|e| e.in_main_checkpoint && e.main_architectures.contains(&arch))
    else {
        return Ok(None);
    };
    let (dtype, device) = (main.info.dtype, main.info.device);
    // No checkpoint: the map is resolved from the main config alone.
    let checkpoint = Checkpoint::open_files(&[])?;
    let dir = Path::new(".");
    let lc =
        DraftLoadContext { dir, config: main_config, main_config, main: &main.info, checkpoint: &checkpoint, dtype };
    let ctx = (entry.map_context)(&lc).with_context(|| format!("random draft {}", entry.name))?;
    let map = WeightMap::parse(entry.weight_map)?.resolve(&ctx)?;
    let mut weights = Weights::random(&map, dtype, seed, device);
    if quantize == Some(Quantize::Fp8) {
        weights.set_quantize(Some(QuantConfig::fp8()));
    }
    let head = (entry.build)(&lc, &mut weights)?;
    let left = weights.remaining();
    if !left.is_empty() {
        crate::bail!(Registry, "internal error: draft {} built without using weight slots {:?}", entry.name, left);
    }
    Ok(Some(head))
}

impl From<RegistryError> for crate::error::Error {
    fn from(e: RegistryError) -> Self {
        crate::error::Error::Registry(e.to_string())
    }
}

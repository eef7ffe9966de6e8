//! `porter load`: load a model and report what loading cost (time, throughput, peak host
//! memory, device memory against the checkpoint's bytes), or print the tensors a checkpoint
//! for a config must hold (to make test checkpoints of real geometry).

use anyhow::{bail, Context, Result};
use porter_core::{registry, DType, Device};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct LoadArgs {
    /// Model folder to load.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Instead of loading: a config file or preset whose checkpoint tensors to print as JSON
    /// (`{"config": …, "tensors": [[name, shape], …]}`).
    #[arg(long)]
    pub print_tensors: Option<String>,
    /// Override num_hidden_layers of `--print-tensors`' config.
    #[arg(long)]
    pub layers: Option<usize>,
    /// cpu, cuda or cuda:N (default: cuda when usable, else cpu).
    #[arg(long, value_parser = crate::parse_device)]
    pub device: Option<Device>,
    /// Model dtype: f32, bf16 or f16.
    #[arg(long, default_value = "bf16", value_parser = crate::parse_dtype)]
    pub dtype: DType,
    /// Quantize the weights at load (fp8), as `--quantize` of the other commands.
    #[arg(long)]
    pub quantize: Option<porter_core::quant::Quantize>,
    /// Write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Resident and peak resident host memory of this process, in bytes (Linux `/proc`).
fn rss() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |k: &str| {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

pub fn cmd_load(a: &LoadArgs) -> Result<()> {
    if let Some(c) = &a.print_tensors {
        let mut cfg: serde_json::Value = serde_json::from_str(&crate::bench_cmd::config_text(c)?)
            .with_context(|| format!("--print-tensors `{c}` is not valid JSON"))?;
        if let Some(n) = a.layers {
            crate::checks::layers(n)?;
            cfg["num_hidden_layers"] = n.into();
            cfg.as_object_mut().map(|o| o.remove("layer_types"));
        }
        let map = registry::resolve_config(&cfg)?;
        let tensors: Vec<serde_json::Value> = map
            .slots
            .iter()
            .flat_map(|s| s.sources.iter().zip(&s.source_shapes).map(|(n, sh)| serde_json::json!([n, sh])))
            .collect();
        println!("{}", serde_json::json!({"config": cfg, "tensors": tensors}));
        return Ok(());
    }
    if a.layers.is_some() {
        bail!("--layers applies to --print-tensors only (a model folder is loaded as it is)");
    }
    let dir = a.model.clone().context("--model DIR (or --print-tensors CONFIG) is required")?;
    let device = a.device.unwrap_or_else(porter_core::device::default_device);
    let ckpt_bytes = porter_core::checkpoint::Checkpoint::open_dir(&dir)?.total_bytes() as u64;
    let free0 = match device {
        Device::Cuda(i) => Some(porter_core::tensor::cuda::mem_info(i)?.0),
        Device::Cpu => None,
    };
    let (rss0, _) = rss();
    let t0 = std::time::Instant::now();
    let opts = registry::LoadOptions {
        dtype: a.dtype,
        device,
        show_progress: false,
        quantize: a.quantize,
        tensor_parallel: 1,
    };
    let model = registry::load_with(&dir, &opts)?;
    model.sync()?;
    let secs = t0.elapsed().as_secs_f64();
    let (rss1, peak) = rss();
    let dev_used = match (device, free0) {
        (Device::Cuda(i), Some(f0)) => Some(f0.saturating_sub(porter_core::tensor::cuda::mem_info(i)?.0) as u64),
        _ => None,
    };
    let gb = |b: u64| b as f64 / 1e9;
    let report = serde_json::json!({
        "model": dir.display().to_string(),
        "architecture": model.info.architecture,
        "device": device.to_string(),
        "dtype": a.dtype.to_string(),
        "checkpoint_bytes": ckpt_bytes,
        "quantize": a.quantize.map(|_| "fp8"),
        "weight_bytes": model.weight_bytes(),
        "load_seconds": secs,
        "load_gb_per_s": gb(ckpt_bytes) / secs,
        "host_rss_before": rss0,
        "host_rss_after": rss1,
        "host_peak_rss": peak,
        "host_peak_above_baseline": peak.saturating_sub(rss0),
        "device_bytes_used": dev_used,
        "device_over_checkpoint": dev_used.map(|d| d as f64 / ckpt_bytes.max(1) as f64),
    });
    println!(
        "loaded {} ({}) on {device} as {}: {:.2} GB in {secs:.2} s = {:.2} GB/s; host RSS {:.3} GB before, peak {:.3} GB ({:.3} GB above){}",
        dir.display(),
        model.info.architecture,
        a.dtype,
        gb(ckpt_bytes),
        gb(ckpt_bytes) / secs,
        gb(rss0),
        gb(peak),
        gb(peak.saturating_sub(rss0)),
        match dev_used {
            Some(d) => format!("; device {:.3} GB = {:.4}x the checkpoint", gb(d), d as f64 / ckpt_bytes.max(1) as f64),
            None => String::new(),
        }
    );
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

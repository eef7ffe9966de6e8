//! `porter kernels`: compile every CUDA kernel module with NVRTC for the named architectures
//! into the on-disk kernel cache (the PTX and the cubin of each), without a GPU, so that the
//! first process on a GPU machine with the same NVRTC version loads the cubins as they are,
//! instead of spending a minute or more in NVRTC and then in the driver's PTX JIT (e.g. in a
//! container build, or before carrying the cache to a fresh GPU machine: `scripts/gpu-check.sh
//! stage` does).

use anyhow::{bail, Context, Result};
use porter_kernels::cuda;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct KernelsArgs {
    /// Architectures to compile for, comma-separated (`sm_90`, `90` or `9.0`); default: the
    /// first GPU's.
    #[arg(long, value_delimiter = ',')]
    pub arch: Vec<String>,
    /// Also compile the forced-fallback build of each architecture (`PORTER_CUDA_FALLBACK=1`:
    /// no bf16, cp.async or tensor-core paths; docs/older-gpus.md).
    #[arg(long)]
    pub with_fallback: bool,
    /// The cache directory (default: `$PORTER_KERNEL_CACHE`, else `~/.cache/porter/ptx`).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Only these modules, comma-separated (`moe.cu`, `attention.cu`, …; default: every one).
    #[arg(long, value_delimiter = ',')]
    pub module: Vec<String>,
    /// Compilations at a time (default: the number of cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Then delete every other `.ptx` / `.cubin` file of the compiled modules in the cache
    /// directory (entries of older kernel texts, other builds or NVRTC versions), so that a
    /// carried cache holds only what this build loads.
    #[arg(long)]
    pub prune: bool,
}

pub fn cmd_kernels(a: &KernelsArgs) -> Result<()> {
    if let Some(d) = &a.cache_dir {
        if d.as_os_str().is_empty() || d.to_string_lossy().trim().eq_ignore_ascii_case("off") {
            bail!("--cache-dir `{}`: name a directory to write the PTX into", d.display());
        }
        std::fs::create_dir_all(d).with_context(|| format!("--cache-dir {}: cannot create it", d.display()))?;
        // Read by the kernel crate at every compilation; set before any thread starts.
        std::env::set_var(cuda::KERNEL_CACHE_ENV, d);
    }
    let Some(dir) = cuda::kernel_cache_dir() else {
        bail!(
            "no PTX cache directory: {} is `off` or unset and there is no HOME; pass --cache-dir",
            cuda::KERNEL_CACHE_ENV
        );
    };
    let archs: Vec<&'static str> = if a.arch.is_empty() {
        let caps = cuda::CudaKernels::new(0)
            .context("no --arch given and no usable GPU to take it from: pass --arch, e.g. --arch sm_90")?;
        vec![caps.arch()]
    } else {
        a.arch
            .iter()
            .map(|s| {
                cuda::arch_named(s).with_context(|| {
                    format!("--arch `{s}`: unknown CUDA architecture (known: {})", cuda::ARCHS.join(", "))
                })
            })
            .collect::<Result<_>>()?
    };
    if a.threads == Some(0) {
        bail!("--threads 0: give at least 1");
    }
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let all = cuda::sources();
    let srcs: Vec<&'static cuda::KernelSource> = if a.module.is_empty() {
        all.to_vec()
    } else {
        let names: Vec<&str> = all.iter().map(|s| s.name).collect();
        a.module
            .iter()
            .map(|m| {
                let m = m.trim();
                all.iter()
                    .copied()
                    .find(|s| s.name == m || s.name.trim_end_matches(".cu") == m)
                    .with_context(|| format!("--module `{m}`: no such kernel module (modules: {})", names.join(", ")))
            })
            .collect::<Result<_>>()?
    };
    let builds: Vec<(&'static str, bool)> = archs
        .iter()
        .flat_map(|&arch| [(arch, false)].into_iter().chain(a.with_fallback.then_some((arch, true))))
        .collect();
    let (major, minor) = cuda::nvrtc_version()?;
    eprintln!(
        "porter kernels: NVRTC {major}.{minor}, {} build(s) × {} modules on {threads} threads into {}",
        builds.len(),
        srcs.len(),
        dir.display()
    );
    let t0 = std::time::Instant::now();
    let done = cuda::precompile(&srcs, &builds, threads)?;
    for p in &done {
        println!(
            "{:<18} {:<6} {:<8} {:>11} bytes  {}",
            p.source,
            p.arch,
            if p.fallback { "fallback" } else { "default" },
            p.bytes,
            if p.cached { "already cached".to_string() } else { format!("{:.1} s", p.seconds) }
        );
    }
    let mut pruned = 0usize;
    if a.prune {
        let keep: std::collections::HashSet<&PathBuf> = done.iter().flat_map(|p| &p.files).collect();
        let entries = std::fs::read_dir(&dir).with_context(|| format!("--prune: cannot list {}", dir.display()))?;
        for e in entries {
            let path = e.with_context(|| format!("--prune: cannot list {}", dir.display()))?.path();
            // Only entries of the modules this run compiled (all, without --module).
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let module = srcs.iter().any(|s| name.starts_with(&format!("{}-", s.name.trim_end_matches(".cu"))));
            let ours = module && matches!(path.extension().and_then(|x| x.to_str()), Some("ptx" | "cubin"));
            if ours && !keep.contains(&path) {
                std::fs::remove_file(&path).with_context(|| format!("--prune: cannot delete {}", path.display()))?;
                pruned += 1;
            }
        }
    }
    let bytes: usize = done.iter().map(|p| p.bytes).sum();
    println!(
        "{} modules, {:.1} MB of cubins in {:.1} s ({} compiled, {} already cached{}), NVRTC {major}.{minor}, cache {}",
        done.len(),
        bytes as f64 / 1e6,
        t0.elapsed().as_secs_f64(),
        done.iter().filter(|p| !p.cached).count(),
        done.iter().filter(|p| p.cached).count(),
        if a.prune { format!(", {pruned} old files deleted") } else { String::new() },
        dir.display()
    );
    Ok(())
}

//! Shared helpers for the integration tests: fixture paths, reference tensors and the
//! parity metric.

pub mod engine_util;
use porter_core::checkpoint::Checkpoint;
use porter_core::Result;
use porter_core::{registry, Batch, DType, Device, LogitsFor, Model, StateCache};
use std::path::PathBuf;

/// `tests/fixtures/<name>`.
/// Falls back to `tests/fixtures` under the working directory when the source tree the
/// binary was built from is absent (test binaries carried to the GPU machine).
pub fn fixture(name: &str) -> PathBuf {
    models::link();
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let dir = if built.is_dir() { built } else { PathBuf::from("tests").join("fixtures") };
    dir.join(name)
}

/// A copy of fixture `name` under the temp dir (config.json copied, every other file linked)
/// with `edit` applied to its config; the caller removes it. `tag` keeps copies apart.
pub fn variant(name: &str, tag: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let mut edit = Some(edit);
    let dir = std::env::temp_dir().join(format!("porter-variant-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("variant dir");
    for e in std::fs::read_dir(fixture(name)).expect("fixture dir") {
        let p = e.expect("fixture entry").path();
        let to = dir.join(p.file_name().expect("file name"));
        if p.file_name().is_some_and(|f| f == "config.json") {
            let text = std::fs::read_to_string(&p).expect("config.json");
            let mut v: serde_json::Value = serde_json::from_str(&text).expect("config json");
            if let Some(f) = edit.take() {
                f(&mut v);
            }
            std::fs::write(&to, v.to_string()).expect("write config");
        } else {
            std::os::unix::fs::symlink(&p, &to).expect("link fixture file");
        }
    }
    dir
}

/// The reference tensors written by `tests/gen_fixtures.py`.
pub struct Reference {
    ckpt: Checkpoint,
}

impl Reference {
    pub fn open(name: &str) -> Result<Self> {
        Ok(Self { ckpt: Checkpoint::open_files(&[fixture(name).join("reference.safetensors")])? })
    }

    pub fn ids(&self, key: &str) -> Result<Vec<u32>> {
        Ok(self.ckpt.read_i64(key)?.into_iter().map(|v| v as u32).collect())
    }

    pub fn f32(&self, key: &str) -> Result<Vec<f32>> {
        self.ckpt.read_f32(key)
    }

    pub fn has(&self, key: &str) -> bool {
        self.ckpt.get(key).is_some()
    }
}

pub fn load(name: &str, dtype: DType) -> Result<Model> {
    registry::load(&fixture(name), dtype, Device::Cpu, false)
}

/// Loads a fixture on a given device.
pub fn load_on(name: &str, dtype: DType, device: Device) -> Result<Model> {
    registry::load(&fixture(name), dtype, device, false)
}

/// `Some(device)` for CUDA device 0, or `None` after printing why there is none (the GPU tests
/// are `#[ignore]`d and then fail when asked to run).
pub fn cuda_or_skip(test: &str) -> Option<Device> {
    match porter_core::device::cuda_device_count() {
        Ok(_) => Some(Device::Cuda(0)),
        Err(reason) => {
            // The GPU tests are #[ignore]d; run with --include-ignored they fail here.
            println!("{test}: no CUDA device ({reason})");
            None
        }
    }
}

/// Population standard deviation.
pub fn std(xs: &[f32]) -> f32 {
    let n = xs.len() as f64;
    let mean = xs.iter().map(|&v| v as f64).sum::<f64>() / n;
    (xs.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n).sqrt() as f32
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Logits of every position from one full-sequence forward.
pub fn prefill_logits(model: &Model, ids: &[u32]) -> Result<Vec<f32>> {
    let mut cache = model.new_cache_spec(1, 0)?;
    let seq = cache.alloc_seq()?;
    model.forward(&Batch::single(seq, 0, ids), &mut cache, LogitsFor::All)?.logits.host_vec()
}

/// Logits of every position, feeding one token at a time through the cache.
pub fn incremental_logits(model: &Model, ids: &[u32]) -> Result<Vec<f32>> {
    let mut cache = model.new_cache_spec(1, 0)?;
    let seq = cache.alloc_seq()?;
    let mut out = Vec::new();
    for (p, &id) in ids.iter().enumerate() {
        out.extend(model.forward(&Batch::single(seq, p, &[id]), &mut cache, LogitsFor::All)?.logits.host_vec()?);
    }
    Ok(out)
}

/// Asserts `max|a − ref| ≤ tol · std(ref)` and returns the ratio `max|Δ| / std(ref)`.
pub fn assert_close(what: &str, got: &[f32], reference: &[f32], tol: f32) -> f32 {
    let s = std(reference);
    let d = max_abs_diff(got, reference);
    let ratio = d / s;
    println!("{what}: max|Δ| = {d:.3e}, std(ref) = {s:.3e}, ratio = {ratio:.3e} (tol {tol:.0e})");
    assert!(ratio <= tol, "{what}: max|Δ| = {d:e} exceeds {tol:e}·std(ref) = {:e}", tol * s);
    ratio
}

/// The bytes of a safetensors file holding `tensors` as `(name, dtype, shape, raw bytes)`
/// (dtype as safetensors spells it: `"F32"`, `"BF16"`, `"F8_E4M3"`, ...), in that order.
pub fn safetensors_bytes<'a>(tensors: impl IntoIterator<Item = (&'a str, &'a str, &'a [usize], &'a [u8])>) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let start = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut h = serde_json::Value::Object(header).to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    out
}

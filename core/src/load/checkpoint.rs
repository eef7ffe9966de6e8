//! Safetensors checkpoints: a single `model.safetensors` or shards listed in
//! `model.safetensors.index.json`.
//!
//! The headers are validated through a memory map (only the header pages are touched);
//! tensor data is read with positioned reads (`pread`) straight into buffers of the
//! tensor's own element type, so loading never keeps a second, page-cache-backed copy of
//! the checkpoint resident in the process and never inflates bf16 / f16 to f32.

use crate::error::{Context, Result};
use crate::tensor::{CpuStorage, DType};
use crate::{bail, err};
use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};

/// Where one tensor lives inside the memory-mapped files.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub file: usize,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Absolute byte range inside the file.
    pub start: usize,
    pub end: usize,
}

/// An opened checkpoint: every tensor's name, dtype, shape and bytes.
pub struct Checkpoint {
    files: Vec<(PathBuf, File)>,
    tensors: BTreeMap<String, TensorInfo>,
}

impl Checkpoint {
    /// Opens the checkpoint of a model folder (`model.safetensors`, or the shards named by
    /// `model.safetensors.index.json`, or else every `*.safetensors` file in the folder).
    pub fn open_dir(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let paths: Vec<PathBuf> = if index.exists() {
            let text = std::fs::read_to_string(&index).with_context(|| format!("reading {}", index.display()))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", index.display()))?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| err!(Checkpoint, "{} has no `weight_map` object", index.display()))?;
            let files: BTreeSet<String> = map.values().filter_map(|f| f.as_str().map(str::to_owned)).collect();
            if files.is_empty() {
                bail!(Checkpoint, "{} lists no shard files", index.display());
            }
            files.into_iter().map(|f| dir.join(f)).collect()
        } else if single.exists() {
            vec![single]
        } else {
            let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
                .with_context(|| format!("reading model folder {}", dir.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            found.sort();
            if found.is_empty() {
                bail!(
                    Checkpoint,
                    "no safetensors checkpoint in {} (expected model.safetensors or model.safetensors.index.json)",
                    dir.display()
                );
            }
            found
        };
        Self::open_files(&paths)
    }

    /// Opens and validates the given safetensors files.
    pub fn open_files(paths: &[PathBuf]) -> Result<Self> {
        let mut files = Vec::new();
        let mut tensors = BTreeMap::new();
        for (fi, path) in paths.iter().enumerate() {
            let file = File::open(path).with_context(|| format!("opening checkpoint file {}", path.display()))?;
            // SAFETY: the file is mapped read-only; porter never writes to checkpoint files while loaded.
            let mmap = unsafe { Mmap::map(&file) }.with_context(|| format!("memory-mapping {}", path.display()))?;
            let (header_len, meta) = SafeTensors::read_metadata(&mmap[..]).map_err(|e| {
                err!(Checkpoint, "{} is not a valid safetensors file (truncated or corrupt?): {e}", path.display())
            })?;
            let data_start = 8 + header_len;
            let data_len = mmap.len().saturating_sub(data_start);
            for (name, info) in meta.tensors() {
                let (s, e) = info.data_offsets;
                if e > data_len || s > e {
                    bail!(Checkpoint,
                        "{}: tensor `{name}` needs bytes {s}..{e} but the file has only {data_len} data bytes (truncated or corrupt)",
                        path.display()
                    );
                }
                let n: usize = info.shape.iter().product();
                if n * info.dtype.bitsize() / 8 != e - s {
                    bail!(
                        Checkpoint,
                        "{}: tensor `{name}` has {} bytes for shape {:?} of {:?}",
                        path.display(),
                        e - s,
                        info.shape,
                        info.dtype
                    );
                }
                if tensors.contains_key(&name) {
                    bail!(Checkpoint, "tensor `{name}` appears in more than one checkpoint file");
                }
                tensors.insert(
                    name.clone(),
                    TensorInfo {
                        file: fi,
                        dtype: info.dtype,
                        shape: info.shape.clone(),
                        start: data_start + s,
                        end: data_start + e,
                    },
                );
            }
            drop(mmap);
            files.push((path.clone(), file));
        }
        Ok(Self { files, tensors })
    }

    /// Every tensor, by name.
    pub fn tensors(&self) -> &BTreeMap<String, TensorInfo> {
        &self.tensors
    }

    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    /// Total bytes of tensor data.
    pub fn total_bytes(&self) -> usize {
        self.tensors.values().map(|t| t.end - t.start).sum()
    }

    /// Reads the raw little-endian bytes of tensor `name` into `dst` (exactly its size).
    pub fn read_bytes(&self, name: &str, dst: &mut [u8]) -> Result<()> {
        let info = self.get(name).ok_or_else(|| err!(Checkpoint, "tensor `{name}` not in checkpoint"))?;
        if dst.len() != info.end - info.start {
            bail!(Internal, "tensor `{name}`: {} bytes requested, {} stored", dst.len(), info.end - info.start);
        }
        self.read_bytes_at(name, 0, dst)
    }

    /// Reads bytes `offset..offset + dst.len()` of tensor `name` into `dst`.
    pub fn read_bytes_at(&self, name: &str, offset: usize, dst: &mut [u8]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let info = self.get(name).ok_or_else(|| err!(Checkpoint, "tensor `{name}` not in checkpoint"))?;
        if offset + dst.len() > info.end - info.start {
            bail!(Internal, "tensor `{name}`: bytes {offset}+{} of {}", dst.len(), info.end - info.start);
        }
        let (path, file) = &self.files[info.file];
        file.read_exact_at(dst, (info.start + offset) as u64)
            .map_err(|e| err!(Checkpoint, "{}: reading tensor `{name}`: {e}", path.display()))
    }

    /// The element type porter stores a tensor of this checkpoint dtype in, if it loads it.
    pub fn dtype_of(&self, name: &str) -> Option<DType> {
        match self.get(name)?.dtype {
            Dtype::F32 => Some(DType::F32),
            Dtype::BF16 => Some(DType::BF16),
            Dtype::F16 => Some(DType::F16),
            _ => None,
        }
    }

    /// Whether tensor `name` is stored as FP8 (`F8_E4M3`, a block-quantized weight).
    pub fn is_fp8(&self, name: &str) -> bool {
        self.get(name).is_some_and(|i| i.dtype == Dtype::F8_E4M3)
    }

    /// Reads an `F8_E4M3` tensor's bytes.
    pub fn read_fp8(&self, name: &str) -> Result<Vec<u8>> {
        let info = self.get(name).ok_or_else(|| err!(Checkpoint, "tensor `{name}` not in checkpoint"))?;
        if info.dtype != Dtype::F8_E4M3 {
            bail!(DType, "tensor `{name}` has dtype {:?}, expected F8_E4M3", info.dtype);
        }
        let mut v = vec![0u8; info.end - info.start];
        self.read_bytes(name, &mut v)?;
        Ok(v)
    }

    /// Reads a floating-point tensor into host storage of its own element type
    /// (`bf16` stays `bf16`: one positioned read, no conversion).
    pub fn read_native(&self, name: &str) -> Result<CpuStorage> {
        let info = self.get(name).ok_or_else(|| err!(Checkpoint, "tensor `{name}` not in checkpoint"))?;
        let n: usize = info.shape.iter().product();
        Ok(match info.dtype {
            Dtype::F32 => {
                let mut v = vec![0f32; n];
                self.read_bytes(name, as_bytes_mut(&mut v))?;
                fix_endian_f32(&mut v);
                CpuStorage::F32(v)
            }
            Dtype::BF16 => {
                let mut v = vec![bf16::ZERO; n];
                self.read_bytes(name, as_bytes_mut(&mut v))?;
                CpuStorage::BF16(fix_endian16(v, bf16::from_bits))
            }
            Dtype::F16 => {
                let mut v = vec![f16::ZERO; n];
                self.read_bytes(name, as_bytes_mut(&mut v))?;
                CpuStorage::F16(fix_endian16(v, f16::from_bits))
            }
            other => bail!(DType, "tensor `{name}` has dtype {other:?}; porter loads f32, bf16 and f16 weights"),
        })
    }

    /// Reads a floating-point tensor as `f32` values (exact for bf16 / f16 / f32).
    pub fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        Ok(match self.read_native(name)? {
            CpuStorage::F32(v) => v,
            h => h.to_f32_vec(),
        })
    }

    /// Reads an integer tensor (i64 / i32 / u32) as `i64` values.
    pub fn read_i64(&self, name: &str) -> Result<Vec<i64>> {
        let info = self.get(name).ok_or_else(|| err!(Checkpoint, "tensor `{name}` not in checkpoint"))?;
        let mut bytes = vec![0u8; info.end - info.start];
        self.read_bytes(name, &mut bytes)?;
        Ok(match info.dtype {
            Dtype::I64 => bytes.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8]))).collect(),
            Dtype::I32 => bytes.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64).collect(),
            Dtype::U32 => bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64).collect(),
            other => bail!(DType, "tensor `{name}` has dtype {other:?}, expected an integer type"),
        })
    }

    /// The paths of the opened files.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|(p, _)| p.as_path())
    }
}

/// The bytes of a slice of plain numbers (for reading file data into it).
pub(crate) fn as_bytes_mut<T: Copy>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: f32 / bf16 / f16 are plain old data without padding or invalid bit patterns;
    // the byte view covers exactly the slice's memory and borrows it mutably.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}

/// Safetensors data is little-endian: reinterpret on big-endian hosts.
fn fix_endian_f32(v: &mut [f32]) {
    if cfg!(target_endian = "big") {
        v.iter_mut().for_each(|x| *x = f32::from_bits(x.to_bits().swap_bytes()));
    }
}

fn fix_endian16<T: Copy + HalfBits>(mut v: Vec<T>, from_bits: fn(u16) -> T) -> Vec<T> {
    if cfg!(target_endian = "big") {
        v.iter_mut().for_each(|x| *x = from_bits(x.bits().swap_bytes()));
    }
    v
}

trait HalfBits {
    fn bits(self) -> u16;
}
impl HalfBits for bf16 {
    fn bits(self) -> u16 {
        self.to_bits()
    }
}
impl HalfBits for f16 {
    fn bits(self) -> u16 {
        self.to_bits()
    }
}

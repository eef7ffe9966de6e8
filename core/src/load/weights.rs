//! [`Weights`]: the engine slots of a resolved weight map, materialised one at a time as
//! the model takes them.
//!
//! Nothing is read before a block asks for its slot. Taking a slot reads its checkpoint
//! tensors with positioned reads straight into host buffers of the model dtype (a bf16
//! checkpoint loaded as bf16 is never converted), applies the map's transform (expert
//! stacking, concatenation, row regrouping), uploads the result to the model's device and
//! drops the host copy — so the host holds at most one slot at a time and the device holds
//! each weight once. Packed layouts (`[gate; up]`, the Gated DeltaNet in-projections, the
//! MoE router with its shared expert) are assembled here, once, by [`Weights::take_packed`].

use crate::comm::{Communicator, TpRank};
use crate::error::{Context, Result};
use crate::load::checkpoint::Checkpoint;
use crate::load::quant::{scale_name, QuantConfig};
use crate::load::shard::{read_shard, ShardAxis};
use crate::load::weight_map::{regroup_rows, ResolvedMap, ResolvedSlot, Transform};
use crate::tensor::cuda::{gpu, DevType, Gpu};
use crate::tensor::{CpuStorage, DType, Device, Fp8Weight, Tensor};
use crate::{bail, err};
use half::{bf16, f16};
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;

mod fp8;
mod stager;
use fp8::{concat_fp8, random_fp8};
use stager::DeviceStager;

/// A slot not taken yet.
#[derive(Debug)]
enum Pending {
    /// Read from the checkpoint when taken.
    Map(ResolvedSlot),
    /// Random values (benchmarks): `index` seeds the slot's generator.
    Random { shape: Vec<usize>, index: u64 },
    /// A tensor given directly.
    Ready(Tensor),
}

/// Bytes moved while loading, for the load-throughput figures of `porter bench`.
#[derive(Debug, Default, Clone, Copy)]
pub struct LoadStats {
    /// Checkpoint bytes read.
    pub bytes_read: u64,
    /// Bytes of the tensors handed to the model (in the model dtype).
    pub bytes_taken: u64,
}

/// The weight slots of a model, taken one by one by its blocks.
pub struct Weights {
    slots: HashMap<String, Pending>,
    dtype: DType,
    device: Device,
    seed: u64,
    ckpt: Option<Arc<Checkpoint>>,
    progress: Option<indicatif::ProgressBar>,
    stats: LoadStats,
    /// Pinned staging of the direct checkpoint → device path (created at first use).
    stager: Option<DeviceStager>,
    /// Online quantization (`--quantize fp8`): the rules of what is quantized.
    quantize: Option<QuantConfig>,
    /// The map's slots of a random-weight store (their source names decide online quantization).
    random_slots: HashMap<String, ResolvedSlot>,
    /// Tensor parallelism: this store's rank, its communicator, and per sharded slot the axis
    /// and the ranges of each source that the rank reads.
    tp: TpRank,
    comm: Option<Arc<dyn Communicator>>,
    select: HashMap<String, (ShardAxis, Vec<(usize, usize)>)>,
}

impl std::fmt::Debug for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Weights")
            .field("slots", &self.slots.len())
            .field("dtype", &self.dtype)
            .field("device", &self.device)
            .finish()
    }
}

impl Default for Weights {
    fn default() -> Self {
        Self {
            slots: HashMap::new(),
            dtype: DType::F32,
            device: Device::Cpu,
            seed: 0,
            ckpt: None,
            progress: None,
            stats: LoadStats::default(),
            stager: None,
            quantize: None,
            random_slots: HashMap::new(),
            tp: TpRank::SINGLE,
            comm: None,
            select: HashMap::new(),
        }
    }
}

impl Weights {
    /// The slots of `map`, read from `ckpt` in `dtype` when taken. Validates the checkpoint
    /// against the map first (every problem listed in one error).
    pub fn from_checkpoint(map: &ResolvedMap, ckpt: Arc<Checkpoint>, dtype: DType) -> Result<Self> {
        map.validate(&ckpt)?;
        let slots = map.slots.iter().map(|s| (s.slot.clone(), Pending::Map(s.clone()))).collect();
        Ok(Self { slots, dtype, ckpt: Some(ckpt), ..Default::default() })
    }

    /// Random weights for every slot of `map` (benchmarks): uniform with σ-like scale
    /// 1/sqrt(last dim) for matrices and 0.1 for vectors, generated when taken (on a GPU,
    /// on the device: an 80B-class geometry never exists on the host).
    pub fn random(map: &ResolvedMap, dtype: DType, seed: u64, device: Device) -> Self {
        let slots = map
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| (s.slot.clone(), Pending::Random { shape: s.shape.clone(), index: i as u64 }))
            .collect();
        let random_slots = map.slots.iter().map(|s| (s.slot.clone(), s.clone())).collect();
        Self { slots, dtype, device, seed, random_slots, ..Default::default() }
    }

    /// Quantizes every eligible linear weight read from now on to block-128 FP8
    /// ([`QuantConfig::quantizes`]); weights already FP8 in the checkpoint are FP8 anyway.
    pub fn set_quantize(&mut self, q: Option<QuantConfig>) {
        self.quantize = q;
    }

    /// Makes this store load rank `comm.tp()`'s shard of every sharded slot (the map's `shard`
    /// rules); replicated slots load whole. Checks every slot's plan now, so a size the group
    /// does not divide is an error before anything is read.
    pub fn set_tensor_parallel(&mut self, comm: Arc<dyn Communicator>) -> Result<()> {
        let tp = comm.tp();
        // In name order, so the error for a size that does not divide is the same every run.
        let mut slots: Vec<(&String, &mut Pending)> = self.slots.iter_mut().collect();
        slots.sort_by(|a, b| a.0.cmp(b.0));
        for (name, p) in slots {
            match p {
                Pending::Map(s) => {
                    let (local, ranges) = s.sharded(tp)?;
                    if let (Some(r), Some(sh)) = (ranges, &s.shard) {
                        self.select.insert(name.clone(), (sh.axis, r));
                    }
                    *s = local;
                }
                Pending::Random { .. } | Pending::Ready(_) if tp.world > 1 => {
                    bail!(Config, "weight slot `{name}`: tensor parallelism needs checkpoint weights")
                }
                _ => {}
            }
        }
        self.tp = tp;
        self.comm = Some(comm);
        Ok(())
    }

    /// This store's tensor-parallel rank.
    pub fn tp(&self) -> TpRank {
        self.tp
    }

    /// The communicator of this store's rank (`None` without tensor parallelism).
    pub fn comm(&self) -> Option<Arc<dyn Communicator>> {
        self.comm.clone().filter(|c| c.tp().world > 1)
    }

    /// The axis slot `slot` is cut along on this rank (`None`: loaded whole).
    pub fn shard_axis(&self, slot: &str) -> Option<ShardAxis> {
        self.select.get(slot).map(|s| s.0)
    }

    /// Whether slot `slot` is taken as an FP8 weight: every source is FP8 in the checkpoint
    /// or quantized online. (Packing helpers keep FP8 and dense parts apart.)
    pub fn is_fp8(&self, slot: &str) -> Result<bool> {
        match self.slots.get(slot) {
            Some(Pending::Map(s)) => Ok(self.slot_fp8(s)),
            Some(Pending::Ready(t)) => Ok(t.is_fp8()),
            Some(Pending::Random { .. }) => Ok(self.random_fp8(slot)),
            None => bail!(WeightMap, "weight slot `{slot}` was not loaded (weight map and model disagree)"),
        }
    }

    /// Whether random slot `slot` is made FP8: online quantization is on and it quantizes every
    /// source of the slot (values generated in the model dtype, then block-quantized over the
    /// slot's `[rows, cols]`: on a GPU by the device kernel, never dense in full on the host).
    fn random_fp8(&self, slot: &str) -> bool {
        let (Some(q), Some(s)) = (&self.quantize, self.random_slots.get(slot)) else { return false };
        !s.sources.is_empty() && s.sources.iter().zip(&s.source_shapes).all(|(src, sh)| q.quantizes(src, sh))
    }

    fn slot_fp8(&self, s: &ResolvedSlot) -> bool {
        let Some(ckpt) = &self.ckpt else { return false };
        !s.sources.is_empty()
            && s.sources
                .iter()
                .zip(&s.source_shapes)
                .all(|(src, shape)| ckpt.is_fp8(src) || self.quantize.as_ref().is_some_and(|q| q.quantizes(src, shape)))
    }

    /// Reads an FP8 slot: each source's e4m3 bytes and scales from the checkpoint, or its
    /// values block-quantized now; then the map's transform, with the scales following the rows.
    fn read_fp8_slot(&mut self, s: &ResolvedSlot, dt: DType) -> Result<Tensor> {
        if self.select.contains_key(&s.slot) {
            bail!(Config, "weight slot `{}`: tensor parallelism with FP8 weights is not supported yet", s.slot);
        }
        let ckpt = self.ckpt.clone().ok_or_else(|| err!(Internal, "weight slot `{}` has no checkpoint", s.slot))?;
        let parts: Vec<Fp8Weight> = s
            .sources
            .par_iter()
            .zip(&s.source_shapes)
            .map(|(src, shape)| {
                let cols = shape.last().copied().unwrap_or(1);
                let rows = shape.iter().product::<usize>() / cols.max(1);
                let (q, scales) = if ckpt.is_fp8(src) {
                    (ckpt.read_fp8(src)?, ckpt.read_f32(&scale_name(src))?)
                } else {
                    porter_kernels::cpu::fp8::quantize_blocks(&ckpt.read_f32(src)?, rows, cols)
                };
                Fp8Weight::new(q, scales, rows, cols, dt).with_context(|| format!("fp8 tensor `{src}`"))
            })
            .collect::<Result<_>>()?;
        let mut w = Fp8Weight::concat(parts)?;
        if let Transform::Regroup { groups, parts } = &s.transform {
            w = w.regroup(*groups, parts);
        }
        self.count_read(&ckpt, s);
        Tensor::from_host(CpuStorage::F8E4M3(w), s.shape.clone(), dt)
    }

    /// Shows progress on `bar` (one tick per checkpoint tensor read).
    pub fn set_progress(&mut self, bar: Option<indicatif::ProgressBar>) {
        self.progress = bar;
    }

    /// Places every tensor taken from now on on `device`.
    pub fn set_device(&mut self, device: Device) {
        self.device = device;
    }

    /// The device taken tensors are placed on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The model dtype slots are converted to.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// What has been read and taken so far.
    pub fn stats(&self) -> LoadStats {
        self.stats
    }

    pub fn contains(&self, slot: &str) -> bool {
        self.slots.contains_key(slot)
    }

    /// The shape a slot will have when taken.
    pub fn slot_shape(&self, slot: &str) -> Result<Vec<usize>> {
        match self.slots.get(slot) {
            Some(Pending::Map(s)) => Ok(s.shape.clone()),
            Some(Pending::Random { shape, .. }) => Ok(shape.clone()),
            Some(Pending::Ready(t)) => Ok(t.shape().to_vec()),
            None => bail!(WeightMap, "weight slot `{slot}` was not loaded (weight map and model disagree)"),
        }
    }

    /// Takes a slot (each slot is owned by exactly one block), in the model dtype, on the
    /// store's device.
    pub fn take(&mut self, slot: &str) -> Result<Tensor> {
        let p = self.pop(slot)?;
        self.materialize(slot, p, self.dtype)
    }

    /// Takes a slot as an `f32` tensor whose values are rounded to the model dtype (the
    /// small parameters that kernels read in f32, e.g. Gated DeltaNet's conv and gates).
    pub fn take_f32(&mut self, slot: &str) -> Result<Tensor> {
        let dt = self.dtype;
        let p = self.pop(slot)?;
        let t = match p {
            Pending::Map(s) => {
                let (host, shape) = self.read_slot(&s, dt)?;
                Tensor::from_vec(host.to_f32_vec(), shape, DType::F32)?
            }
            Pending::Random { shape, index } => {
                Tensor::from_vec(random_values(&shape, self.seed, index, dt), shape, DType::F32)?
            }
            Pending::Ready(t) => Tensor::from_vec(t.host_vec()?, t.shape().to_vec(), dt)?.try_to_dtype(DType::F32)?,
        };
        self.stats.bytes_taken += t.bytes() as u64;
        t.into_device(self.device).with_context(|| format!("weight slot `{slot}`"))
    }

    /// Takes a slot if the map produced it.
    pub fn take_opt(&mut self, slot: &str) -> Result<Option<Tensor>> {
        if self.contains(slot) {
            self.take(slot).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Takes several slots with the same trailing dimensions and packs them along the first
    /// dimension into one tensor (`[Σ rows_i, ...]`), assembled on the host and uploaded
    /// once, so the device holds only the packed copy.
    pub fn take_packed(&mut self, slots: &[String]) -> Result<Tensor> {
        if slots.len() == 1 {
            return self.take(&slots[0]);
        }
        let dt = self.dtype;
        let mut parts = Vec::with_capacity(slots.len());
        for s in slots {
            parts.push((s.as_str(), self.pop(s)?));
        }
        let random_fp8: Vec<bool> =
            parts.iter().map(|(n, p)| matches!(p, Pending::Random { .. }) && self.random_fp8(n)).collect();
        if random_fp8.iter().any(|&f| f) {
            if !random_fp8.iter().all(|&f| f) {
                bail!(Internal, "packing {slots:?}: fp8 and dense random parts");
            }
            let mut ts = Vec::with_capacity(parts.len());
            for (name, p) in parts {
                ts.push(self.materialize(name, p, dt)?);
            }
            return concat_fp8(ts, dt).with_context(|| format!("packing {slots:?}"));
        }
        let on_device_random =
            matches!(self.device, Device::Cuda(_)) && parts.iter().any(|(_, p)| matches!(p, Pending::Random { .. }));
        if on_device_random {
            // Random parts are generated on the device; concatenate there.
            let mut ts = Vec::with_capacity(parts.len());
            for (name, p) in parts {
                ts.push(self.materialize(name, p, dt)?);
            }
            let refs: Vec<&Tensor> = ts.iter().collect();
            return Tensor::concat_rows(&refs).with_context(|| format!("packing {slots:?}"));
        }
        if parts.iter().all(|(_, p)| matches!(p, Pending::Map(s) if self.slot_fp8(s))) {
            let mut ws = Vec::with_capacity(parts.len());
            for (name, p) in &parts {
                if let Pending::Map(s) = p {
                    ws.push(self.read_fp8_slot(s, dt).with_context(|| format!("weight slot `{name}`"))?);
                }
            }
            let mut rows = 0;
            let mut fp8 = Vec::with_capacity(ws.len());
            let tail = ws[0].shape()[1..].to_vec();
            for t in ws {
                if t.shape()[1..] != tail[..] {
                    bail!(WeightMap, "packing {slots:?}: shape {:?} does not match [_, {tail:?}]", t.shape());
                }
                rows += t.dim(0);
                match t.host()? {
                    CpuStorage::F8E4M3(w) => fp8.push(w.clone()),
                    _ => bail!(Internal, "packing {slots:?}: an fp8 part is not fp8"),
                }
            }
            let mut shape = vec![rows];
            shape.extend(tail);
            let t = Tensor::from_host(CpuStorage::F8E4M3(Fp8Weight::concat(fp8)?), shape, dt)?;
            self.stats.bytes_taken += t.bytes() as u64;
            return t.into_device(self.device).with_context(|| format!("packed weight slots {slots:?}"));
        }
        if parts.iter().all(|(_, p)| matches!(p, Pending::Map(_))) {
            let maps: Vec<ResolvedSlot> = parts
                .iter()
                .filter_map(|(_, p)| if let Pending::Map(s) = p { Some(s.clone()) } else { None })
                .collect();
            if let Some(t) = self.stream_to_device(&maps, dt)? {
                self.stats.bytes_taken += t.bytes() as u64;
                return Ok(t);
            }
        }
        let mut hosts = Vec::with_capacity(parts.len());
        let mut rows = 0;
        let mut rest: Option<Vec<usize>> = None;
        for (name, p) in parts {
            let (h, shape) = match p {
                Pending::Map(s) => self.read_slot(&s, dt)?,
                Pending::Random { shape, index } => {
                    (to_storage(random_values(&shape, self.seed, index, dt), dt), shape)
                }
                Pending::Ready(t) => (to_storage(t.host_vec()?, dt), t.shape().to_vec()),
            };
            let tail = shape.get(1..).unwrap_or(&[]).to_vec();
            match &rest {
                Some(r) if *r != tail => {
                    bail!(WeightMap, "packing {slots:?}: `{name}` has shape {shape:?}, the first part [_, {r:?}]")
                }
                _ => rest = Some(tail),
            }
            rows += shape.first().copied().unwrap_or(1);
            hosts.push(h);
        }
        let mut shape = vec![rows];
        shape.extend(rest.unwrap_or_default());
        let t = Tensor::from_host(concat_storage(hosts, dt)?, shape, dt)?;
        self.stats.bytes_taken += t.bytes() as u64;
        t.into_device(self.device).with_context(|| format!("packed weight slots {slots:?}"))
    }

    /// Slots nobody took (a model bug if non-empty after construction).
    pub fn remaining(&self) -> Vec<String> {
        let mut v: Vec<String> = self.slots.keys().cloned().collect();
        v.sort();
        v
    }

    /// Adds a ready tensor as a slot.
    pub fn insert(&mut self, slot: &str, t: Tensor) {
        self.slots.insert(slot.to_owned(), Pending::Ready(t));
    }

    fn pop(&mut self, slot: &str) -> Result<Pending> {
        self.slots
            .remove(slot)
            .ok_or_else(|| err!(WeightMap, "weight slot `{slot}` was not loaded (weight map and model disagree)"))
    }

    fn materialize(&mut self, slot: &str, p: Pending, dt: DType) -> Result<Tensor> {
        if let Pending::Map(s) = &p {
            if self.slot_fp8(s) {
                let t = self.read_fp8_slot(s, dt).with_context(|| format!("weight slot `{slot}`"))?;
                self.stats.bytes_taken += t.bytes() as u64;
                return t.into_device(self.device).with_context(|| format!("weight slot `{slot}`"));
            }
            if let Some(t) = self.stream_to_device(std::slice::from_ref(s), dt)? {
                self.stats.bytes_taken += t.bytes() as u64;
                return Ok(t);
            }
        }
        let t = match p {
            Pending::Map(s) => {
                let (host, shape) = self.read_slot(&s, dt)?;
                Tensor::from_host(host, shape, dt)?
            }
            Pending::Random { shape, index } if self.random_fp8(slot) => {
                random_fp8(self.device, &shape, dt, self.seed, index)
                    .with_context(|| format!("weight slot `{slot}`"))?
            }
            Pending::Random { shape, index } => match self.device {
                Device::Cuda(i) => random_on_device(&gpu(i)?, &shape, dt, self.seed, index)?,
                Device::Cpu => {
                    Tensor::from_host(to_storage(random_values(&shape, self.seed, index, dt), dt), shape, dt)?
                }
            },
            Pending::Ready(t) => t,
        };
        self.stats.bytes_taken += t.bytes() as u64;
        t.into_device(self.device).with_context(|| format!("weight slot `{slot}`"))
    }

    /// Reads a mapped slot into host storage of `dt` (its transform applied). Sources stored
    /// in `dt` are read in parallel straight into their place in one buffer; others are
    /// converted one by one.
    fn read_slot(&mut self, s: &ResolvedSlot, dt: DType) -> Result<(CpuStorage, Vec<usize>)> {
        let ckpt = self.ckpt.clone().ok_or_else(|| err!(Internal, "weight slot `{}` has no checkpoint", s.slot))?;
        if let Some((axis, ranges)) = self.select.get(&s.slot).cloned() {
            return self.read_sharded(&ckpt, s, axis, &ranges, dt);
        }
        let n: usize = s.shape.iter().product();
        let sizes: Vec<usize> = s.source_shapes.iter().map(|sh| sh.iter().product()).collect();
        if sizes.iter().sum::<usize>() != n {
            bail!(
                Internal,
                "weight slot `{}`: sources hold {} values for shape {:?}",
                s.slot,
                sizes.iter().sum::<usize>(),
                s.shape
            );
        }
        fn fill<T: Copy + Send>(
            ckpt: &Checkpoint,
            s: &ResolvedSlot,
            sizes: &[usize],
            dt: DType,
            out: &mut [T],
            convert_one: fn(CpuStorage) -> Option<Vec<T>>,
        ) -> Result<()> {
            let mut chunks = Vec::with_capacity(sizes.len());
            let mut rest = out;
            for &k in sizes {
                let (a, b) = rest.split_at_mut(k);
                chunks.push(a);
                rest = b;
            }
            s.sources.par_iter().zip(chunks).try_for_each(|(src, chunk)| {
                if ckpt.dtype_of(src) == Some(dt) {
                    ckpt.read_bytes(src, crate::load::checkpoint::as_bytes_mut(chunk))
                } else {
                    let native = if ckpt.is_fp8(src) { dequantize(ckpt, src, dt)? } else { ckpt.read_native(src)? };
                    let v = convert_one(convert(native, dt, src)?)
                        .ok_or_else(|| err!(Internal, "conversion of `{src}` to {dt}"))?;
                    chunk.copy_from_slice(&v);
                    Ok(())
                }
            })
        }
        let host = match dt {
            DType::F32 => {
                let mut v = vec![0f32; n];
                fill(&ckpt, s, &sizes, dt, &mut v, |h| if let CpuStorage::F32(v) = h { Some(v) } else { None })?;
                CpuStorage::F32(v)
            }
            DType::BF16 => {
                let mut v = vec![bf16::ZERO; n];
                fill(&ckpt, s, &sizes, dt, &mut v, |h| if let CpuStorage::BF16(v) = h { Some(v) } else { None })?;
                CpuStorage::BF16(v)
            }
            DType::F16 => {
                let mut v = vec![f16::ZERO; n];
                fill(&ckpt, s, &sizes, dt, &mut v, |h| if let CpuStorage::F16(v) = h { Some(v) } else { None })?;
                CpuStorage::F16(v)
            }
        };
        self.count_read(&ckpt, s);
        Ok((regroup_storage(host, s), s.shape.clone()))
    }

    /// A sharded slot: each source's ranges read (`shard::read_shard`), converted to `dt`,
    /// assembled as the map's transform says (with the regroup made local).
    fn read_sharded(
        &mut self,
        ckpt: &Checkpoint,
        s: &ResolvedSlot,
        axis: ShardAxis,
        ranges: &[(usize, usize)],
        dt: DType,
    ) -> Result<(CpuStorage, Vec<usize>)> {
        let parts = s
            .sources
            .par_iter()
            .map(|src| {
                let shape = ckpt.get(src).map(|i| i.shape.clone()).unwrap_or_default();
                convert(read_shard(ckpt, src, &shape, axis, ranges)?, dt, src)
            })
            .collect::<Result<Vec<_>>>()
            .with_context(|| format!("weight slot `{}`", s.slot))?;
        let host = concat_storage(parts, dt)?;
        self.count_read(ckpt, s);
        Ok((regroup_storage(host, s), s.shape.clone()))
    }

    fn count_read(&mut self, ckpt: &Checkpoint, s: &ResolvedSlot) {
        self.stats.bytes_read +=
            s.sources.iter().filter_map(|n| ckpt.get(n)).map(|i| (i.end - i.start) as u64).sum::<u64>();
        if let Some(p) = &self.progress {
            p.inc(s.sources.len() as u64);
        }
    }

    /// The direct path to a CUDA device: when every source of `slots` is stored in `dt`, the
    /// slots (packed along their first dimension, transforms applied as copy offsets) are
    /// read chunk by chunk into pinned staging buffers and copied asynchronously into one
    /// device buffer — the host never holds more than the staging buffers. `None` when the
    /// path does not apply (host device, or a dtype conversion is needed).
    fn stream_to_device(&mut self, slots: &[ResolvedSlot], dt: DType) -> Result<Option<Tensor>> {
        let Device::Cuda(ordinal) = self.device else { return Ok(None) };
        let Some(ckpt) = self.ckpt.clone() else { return Ok(None) };
        if slots.iter().any(|s| self.slot_fp8(s) || self.select.contains_key(&s.slot)) {
            return Ok(None);
        }
        if !slots.iter().all(|s| s.sources.iter().all(|src| ckpt.dtype_of(src) == Some(dt))) {
            return Ok(None);
        }
        let es = dt.size_in_bytes();
        // Copy jobs: (source, byte offset in the source, bytes); destinations are consecutive.
        let mut jobs: Vec<(&str, usize, usize)> = Vec::new();
        let mut rows = 0;
        let tail = slots[0].shape.get(1..).unwrap_or(&[]).to_vec();
        for s in slots {
            if s.shape.get(1..).unwrap_or(&[]) != tail.as_slice() {
                bail!(WeightMap, "packing {}: shape {:?} does not match [_, {tail:?}]", s.slot, s.shape);
            }
            rows += s.shape.first().copied().unwrap_or(1);
            match &s.transform {
                Transform::Regroup { groups, parts } => {
                    let row = s.shape[1..].iter().product::<usize>() * es;
                    let per_group: usize = parts.iter().sum();
                    let mut off = 0;
                    for &p in parts {
                        for g in 0..*groups {
                            jobs.push((&s.sources[0], (g * per_group + off) * row, p * row));
                        }
                        off += p;
                    }
                }
                Transform::Identity | Transform::Concat | Transform::StackExperts => {
                    for (src, sh) in s.sources.iter().zip(&s.source_shapes) {
                        jobs.push((src, 0, sh.iter().product::<usize>() * es));
                    }
                }
            }
        }
        let mut shape = vec![rows];
        shape.extend(tail);
        let g = gpu(ordinal)?;
        if self.stager.is_none() {
            self.stager = Some(DeviceStager::new(&g)?);
        }
        let stager = self.stager.as_mut().ok_or_else(|| err!(Internal, "staging"))?;
        let t = stager.upload(&g, &ckpt, &jobs, shape, dt)?;
        for s in slots {
            self.count_read(&ckpt, s);
        }
        Ok(Some(t))
    }

    /// The number of checkpoint tensors the store reads when every slot is taken.
    pub fn tensors_to_read(&self) -> u64 {
        self.slots.values().map(|p| if let Pending::Map(s) = p { s.sources.len() as u64 } else { 0 }).sum()
    }
}

/// Applies a slot's `regroup` (if any) to its assembled rows.
fn regroup_storage(host: CpuStorage, s: &ResolvedSlot) -> CpuStorage {
    let Transform::Regroup { groups, parts } = &s.transform else { return host };
    let cols: usize = s.shape[1..].iter().product();
    match host {
        CpuStorage::F32(v) => CpuStorage::F32(regroup_rows(&v, *groups, parts, cols)),
        CpuStorage::BF16(v) => CpuStorage::BF16(regroup_rows(&v, *groups, parts, cols)),
        CpuStorage::F16(v) => CpuStorage::F16(regroup_rows(&v, *groups, parts, cols)),
        CpuStorage::F8E4M3(w) => CpuStorage::F8E4M3(w.regroup(*groups, parts)),
    }
}

/// An FP8 checkpoint tensor dequantized (where a dense weight is needed: a parameter read in
/// f32, or a part packed with dense parts).
fn dequantize(ckpt: &Checkpoint, src: &str, dt: DType) -> Result<CpuStorage> {
    let shape = ckpt.get(src).map(|i| i.shape.clone()).unwrap_or_default();
    let cols = shape.last().copied().unwrap_or(1);
    let rows = shape.iter().product::<usize>() / cols.max(1);
    let w = Fp8Weight::new(ckpt.read_fp8(src)?, ckpt.read_f32(&scale_name(src))?, rows, cols, dt)
        .with_context(|| format!("fp8 tensor `{src}`"))?;
    Ok(CpuStorage::F32(w.to_f32_vec()))
}

/// Host storage of the model dtype from host storage of any dtype (no copy when equal).
///
/// # Errors
/// [`crate::Error::DType`] when tensor `src` holds finite values beyond f16's range (±65504)
/// and `dt` is f16: they would become infinities (a bf16 or f32 checkpoint loaded with
/// `--dtype f16`).
fn convert(h: CpuStorage, dt: DType, src: &str) -> Result<CpuStorage> {
    Ok(match (h, dt) {
        (CpuStorage::BF16(v), DType::BF16) => CpuStorage::BF16(v),
        (CpuStorage::F16(v), DType::F16) => CpuStorage::F16(v),
        (CpuStorage::F32(v), DType::F32) => CpuStorage::F32(v),
        (h, DType::F16) => {
            let v = h.to_f32_vec();
            let (n, worst) = v
                .iter()
                .filter(|x| x.is_finite() && x.abs() > f16::MAX.to_f32())
                .fold((0usize, 0f32), |(n, w), &x| (n + 1, if x.abs() > w.abs() { x } else { w }));
            if n > 0 {
                bail!(
                    DType,
                    "tensor `{src}` has {n} values beyond f16's range (±65504, the largest {worst:e}): it cannot be loaded as f16; use --dtype bf16 or f32"
                );
            }
            to_storage(v, DType::F16)
        }
        (h, dt) => to_storage(h.to_f32_vec(), dt),
    })
}

/// `f32` values as host storage of `dt` (rounded to nearest even).
fn to_storage(v: Vec<f32>, dt: DType) -> CpuStorage {
    match dt {
        DType::F32 => CpuStorage::F32(v),
        DType::BF16 => CpuStorage::BF16(v.into_iter().map(bf16::from_f32).collect()),
        DType::F16 => CpuStorage::F16(v.into_iter().map(f16::from_f32).collect()),
    }
}

/// Concatenates host buffers of one element type.
fn concat_storage(mut parts: Vec<CpuStorage>, dt: DType) -> Result<CpuStorage> {
    if parts.len() == 1 {
        return parts.pop().ok_or_else(|| err!(Internal, "empty concat"));
    }
    let n: usize = parts.iter().map(CpuStorage::len).sum();
    macro_rules! cat {
        ($variant:ident, $t:ty) => {{
            let mut out: Vec<$t> = Vec::with_capacity(n);
            for p in parts {
                match p {
                    CpuStorage::$variant(v) => out.extend_from_slice(&v),
                    _ => bail!(Internal, "concat of mixed host storage"),
                }
            }
            CpuStorage::$variant(out)
        }};
    }
    Ok(match dt {
        DType::F32 => cat!(F32, f32),
        DType::BF16 => cat!(BF16, bf16),
        DType::F16 => cat!(F16, f16),
    })
}

fn random_scale(shape: &[usize]) -> f32 {
    let vector = shape.iter().filter(|&&d| d > 1).count() <= 1;
    let fan_in = *shape.last().unwrap_or(&1) as f32;
    if vector {
        0.1
    } else {
        (3.0 / fan_in).sqrt()
    }
}

/// The host random values of slot `index` (xorshift, uniform in ±scale), rounded to `dt`.
fn random_values(shape: &[usize], seed: u64, index: u64, dt: DType) -> Vec<f32> {
    let n: usize = shape.iter().product();
    let mut state = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0
    };
    let a = random_scale(shape);
    (0..n).map(|_| dt.round(a * next())).collect()
}

/// One random weight tensor filled on the device (uniform, scale as [`random_values`]).
fn random_on_device(g: &Arc<Gpu>, shape: &[usize], dtype: DType, seed: u64, index: u64) -> Result<Tensor> {
    let seed = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let scale = random_scale(shape);
    let mut t = Tensor::empty_on(g, shape.to_vec(), dtype)?;
    fn fill<T: DevType>(g: &Gpu, t: &mut Tensor, seed: u64, scale: f32) -> Result<()> {
        g.k.fill_uniform::<T>(t.dev_mut::<T>()?, seed, scale, 0.0).map_err(crate::tensor::cuda::cuda_err)
    }
    crate::by_dtype!(dtype, fill(g, &mut t, seed, scale))?;
    Ok(t)
}

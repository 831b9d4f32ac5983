//! Device filtering with counted rejection reasons, and device-policy ordering (contract §4.2).

use std::cmp::Ordering;

use crate::model::{GpuDevice, NodeDeviceInventory, SchedulingPolicy};

use super::reason::{ReasonCode, ReasonCounts};
use super::request::{ContainerNeed, PodRequest};
use super::usage::DeviceUsage;

/// A GPU that passed the filter for one container, with what the orderings need.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Candidate {
    /// Position in the inventory.
    pub pos: usize,
    /// GPU index.
    pub index: u32,
    /// NUMA node.
    pub numa: Option<u32>,
    /// `Device.Score()`: mean free fraction of slots, memory and cores, × 100.
    pub score: f64,
    /// Used (slots, cores, memory).
    pub used: [f64; 3],
    /// Capacity (slots, cores, memory).
    pub total: [f64; 3],
}

fn frac(num: f64, den: f64) -> f64 {
    if den > 0.0 { num / den } else { 0.0 }
}

/// One GPU under a usage, as the per-GPU filter reads it (everything but the type and UUID lists). A
/// scheduler can keep it per GPU and reject nodes without a placement attempt
/// ([`quick_reject_summary`](super::quick_reject_summary)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GpuFree {
    /// Healthy.
    pub healthy: bool,
    /// In MIG mode.
    pub mig: bool,
    /// At least one vGPU slot free.
    pub has_slot: bool,
    /// Free cores.
    pub free_cores: u64,
    /// Free memory, MiB.
    pub free_memory_mib: u64,
    /// Memory, MiB (what a vGPU asking no memory takes).
    pub memory_mib: u64,
    /// NUMA node.
    pub numa: Option<u32>,
}

impl GpuFree {
    /// A GPU under usage `u`.
    pub fn of(d: &GpuDevice, u: DeviceUsage) -> Self {
        Self {
            healthy: d.health.is_healthy(),
            mig: d.mig_enabled,
            has_slot: d.split_count.saturating_sub(u.number) > 0,
            free_cores: d.cores.saturating_sub(u.cores),
            free_memory_mib: d.memory_mib.saturating_sub(u.memory_mib),
            memory_mib: d.memory_mib,
            numa: d.numa_node,
        }
    }

    /// Why the GPU cannot take one vGPU of `need`, before the type and UUID lists: health, MIG, free slot,
    /// memory, cores (`None`: it can).
    pub(crate) fn exclusion(&self, need: &ContainerNeed) -> Option<ReasonCode> {
        let want_mem = if need.memory_mib == 0 { self.memory_mib } else { need.memory_mib };
        if !self.healthy {
            Some(ReasonCode::DeviceUnhealthy)
        } else if self.mig {
            Some(ReasonCode::DeviceMigEnabled)
        } else if !self.has_slot {
            Some(ReasonCode::InsufficientVgpuSlot)
        } else if want_mem > self.free_memory_mib {
            Some(ReasonCode::InsufficientVgpuMemory)
        } else if need.cores > self.free_cores || self.free_cores == 0 {
            Some(ReasonCode::InsufficientVgpuCore)
        } else {
            None
        }
    }
}

/// Why the request's type or UUID lists exclude a GPU (`None`: they admit it).
pub(crate) fn list_exclusion(d: &GpuDevice, request: &PodRequest) -> Option<ReasonCode> {
    if !request.filter.types.admits(&d.type_name) {
        Some(ReasonCode::DeviceTypeMismatch)
    } else if !request.filter.uuids.admits(&d.uuid) {
        Some(ReasonCode::DeviceUuidMismatch)
    } else {
        None
    }
}

/// Why one GPU under usage `u` cannot take one vGPU of `need` (`None`: it can) — the per-GPU test of
/// [`filter_devices`], in its order: health, MIG, free slot, memory, cores, type lists, UUID lists.
pub(crate) fn exclusion(
    d: &GpuDevice,
    u: DeviceUsage,
    need: &ContainerNeed,
    request: &PodRequest,
) -> Option<ReasonCode> {
    GpuFree::of(d, u).exclusion(need).or_else(|| list_exclusion(d, request))
}

/// Filters the inventory for one container need against `work` usage (indexed by inventory position).
/// GPUs outside `window` (when given) are skipped without being counted.
pub(crate) fn filter_devices(
    inventory: &NodeDeviceInventory,
    work: &[DeviceUsage],
    need: &ContainerNeed,
    request: &PodRequest,
    window: Option<&[u32]>,
) -> (Vec<Candidate>, ReasonCounts) {
    let mut out = Vec::new();
    let mut counts = ReasonCounts::new();
    for (pos, d) in inventory.devices.iter().enumerate() {
        if window.is_some_and(|w| !w.contains(&d.index)) {
            continue;
        }
        let u = work.get(pos).copied().unwrap_or_default();
        if let Some(code) = exclusion(d, u, need, request) {
            *counts.entry(code).or_default() += 1;
            continue;
        }
        let free_num = d.split_count.saturating_sub(u.number);
        let free_mem = d.memory_mib.saturating_sub(u.memory_mib);
        let free_core = d.cores.saturating_sub(u.cores);
        let total = [f64::from(d.split_count), d.cores as f64, d.memory_mib as f64];
        let used = [f64::from(u.number), u.cores as f64, u.memory_mib as f64];
        let score = 100.0
            * (frac(f64::from(free_num), total[0])
                + frac(free_mem as f64, total[2])
                + frac(free_core as f64, total[1]))
            / 3.0;
        out.push(Candidate { pos, index: d.index, numa: d.numa_node, score, used, total });
    }
    (out, counts)
}

/// Sorts candidates by the device policy (`NewDevicePolicyPriority`): binpack Score ascending, spread Score
/// descending, none NUMA ascending with unknown NUMA last; GPU index ascending breaks every tie.
pub(crate) fn sort_candidates(cands: &mut [Candidate], policy: SchedulingPolicy) {
    cands.sort_by(|a, b| {
        let primary = match policy {
            SchedulingPolicy::Binpack => a.score.total_cmp(&b.score),
            SchedulingPolicy::Spread => b.score.total_cmp(&a.score),
            SchedulingPolicy::None => match (a.numa, b.numa) {
                (Some(x), Some(y)) => x.cmp(&y),
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (None, None) => Ordering::Equal,
            },
        };
        primary.then(a.index.cmp(&b.index))
    });
}

/// Utilization score of a group of candidates (`Score(NumaUtilization(group), UniformProfile, policy)`):
/// binpack = mean used fraction × 100 (fullest first), spread = mean free fraction × 100, none = 0.
pub(crate) fn group_score(cands: &[Candidate], members: &[usize], policy: SchedulingPolicy) -> f64 {
    let mut used = [0.0; 3];
    let mut total = [0.0; 3];
    for &m in members {
        if let Some(c) = cands.get(m) {
            for d in 0..3 {
                used[d] += c.used[d];
                total[d] += c.total[d];
            }
        }
    }
    let u: f64 = (0..3).map(|d| frac(used[d], total[d])).sum::<f64>() / 3.0;
    match policy {
        SchedulingPolicy::Binpack => 100.0 * u,
        SchedulingPolicy::Spread => 100.0 * (1.0 - u),
        SchedulingPolicy::None => 0.0,
    }
}

//! Per-node allocation of a whole pod (contract §4.2).

use std::collections::BTreeSet;

use crate::model::{ContainerDeviceClaim, DeviceClaim, PodDeviceClaim, TopologyMode};

use super::align::{Alignment, AlignmentWindow};
use super::filter::{Candidate, GpuFree, filter_devices, list_exclusion, sort_candidates};
use super::link::{self, LinkPlan};
use super::node::{LinkTier, NodeLinks, NodeView};
use super::numa;
use super::reason::{NodeFailure, ReasonCode};
use super::request::{ContainerNeed, ContainerRole, PodRequest, ResolvedRequest};
use super::usage::DeviceUsage;

/// What kind of notice a successful allocation carries (a scheduler turns them into events).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NoticeKind {
    /// Link or NUMA placement fell back to a weaker topology (`TopologyFallback` warning event).
    TopologyFallback,
}

/// A warning attached to a successful allocation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Notice {
    /// The container concerned.
    pub container: String,
    /// Kind of notice.
    pub kind: NoticeKind,
    /// Human-readable message.
    pub message: String,
}

/// A successful per-node allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodAllocation {
    /// The claim, in request order, ready for the `pre-allocated` codec.
    pub claim: PodDeviceClaim,
    /// Topology fallbacks and similar warnings.
    pub notices: Vec<Notice>,
    /// With an [`Alignment`] ([`place_aligned`]), the loosest window any link-placed container came from;
    /// `None` without alignment or when no container went through link placement.
    pub alignment: Option<AlignmentWindow>,
}

/// Allocates a pod's vGPUs on one node, or says why it cannot.
///
/// Runs the node checks ([`NodeView::check`]), the structural gates of the filter (cards, per-vGPU maxima,
/// node totals, include/exclude matches), then places containers in request order against the node's usage
/// plus the pod's own earlier containers. With sequential init containers it takes the two-pass path:
/// sidecars, then app containers, then each init container alone against the sidecar-only usage, first on the
/// pod's GPUs and then on the whole node. Deterministic: equal inputs give equal outputs.
///
/// ```
/// use vgpu_core::alloc::{NodeUsage, NodeView, PodContainer, PodRequest, PodSpec, allocate};
/// use vgpu_core::codec::pod_devices;
/// use vgpu_core::domain::ResourceDomain;
/// use vgpu_core::model::{GpuDevice, NodeDeviceInventory, NodeVgpuConfig};
///
/// let domain = ResourceDomain::default();
/// let gpu = |i: u32| GpuDevice {
///     index: i, uuid: format!("GPU-{i}"), type_name: "A100".into(), memory_mib: 40960, cores: 100,
///     split_count: 4, numa_node: Some(0), ..Default::default()
/// };
/// let inventory = NodeDeviceInventory::new(vec![gpu(0), gpu(1)]);
/// let config = NodeVgpuConfig::default();
/// let usage = NodeUsage::new();
/// let node = NodeView { name: "n1", inventory: &inventory, config: &config, links: None, usage: &usage };
///
/// let pod = PodSpec::new()
///     .container(PodContainer::app("main").limit(domain.vgpu_number(), 2).limit(domain.vgpu_cores(), 50)
///         .limit(domain.vgpu_memory(), 4096))
///     .annotation(domain.device_scheduler_policy(), "binpack");
/// let request = PodRequest::from_pod(&pod, &domain)?;
/// let got = allocate(&request, &node)?;
/// assert_eq!(pod_devices::encode(&got.claim)?, "main[0_GPU-0_50_4096,1_GPU-1_50_4096]");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn allocate(request: &PodRequest, node: &NodeView<'_>) -> Result<PodAllocation, NodeFailure> {
    node.check(request)?;
    let resolved = request.resolve(node.inventory, node.config);
    precheck(request, &resolved, node)?;
    place(request, &resolved, node)
}

/// The structural gates of the filter (contract §3.1 step 6) on a resolved request.
pub fn precheck(
    request: &PodRequest,
    resolved: &ResolvedRequest,
    node: &NodeView<'_>,
) -> Result<(), NodeFailure> {
    match failed_gate(request, resolved, node) {
        Some(gate) => Err(gate.failure()),
        None => Ok(()),
    }
}

/// A structural gate of [`precheck`] that failed, with the numbers its detail names.
#[derive(Debug, Clone, Copy)]
enum Gate {
    Cards { want: u64, have: u64 },
    MaxCores { want: u64, have: u64 },
    MaxMemory { want: u64, have: u64 },
    Slots { want: u64, free: u64 },
    Cores { want: u64, free: u64 },
    Memory { want: u64, free: u64 },
    Uuids { matching: usize },
    Types { matching: usize },
}

impl Gate {
    fn code(self) -> ReasonCode {
        match self {
            Self::Cards { .. } => ReasonCode::InsufficientGpuCards,
            Self::MaxCores { .. } | Self::Cores { .. } => ReasonCode::InsufficientVgpuCore,
            Self::MaxMemory { .. } | Self::Memory { .. } => ReasonCode::InsufficientVgpuMemory,
            Self::Slots { .. } => ReasonCode::InsufficientVgpuSlot,
            Self::Uuids { .. } => ReasonCode::DeviceUuidMismatch,
            Self::Types { .. } => ReasonCode::DeviceTypeMismatch,
        }
    }

    fn failure(self) -> NodeFailure {
        let detail = match self {
            Self::Cards { want, have } => {
                format!("a container requests {want} vGPUs, node has {have} schedulable GPUs")
            }
            Self::MaxCores { want, have } => format!("{want} cores per vGPU > largest GPU {have}"),
            Self::MaxMemory { want, have } => format!("{want} MiB per vGPU > largest GPU {have} MiB"),
            Self::Slots { want, free } => format!("{want} slots needed, {free} free"),
            Self::Cores { want, free } => format!("{want} cores needed, {free} free"),
            Self::Memory { want, free } => format!("{want} MiB needed, {free} MiB free"),
            Self::Uuids { matching } => format!("{matching} GPUs match the UUID lists"),
            Self::Types { matching } => format!("{matching} GPUs match the type lists"),
        };
        NodeFailure::new(self.code()).with_detail(detail)
    }
}

/// What the size gates of [`precheck`] read of a node: its schedulable GPUs' count, largest cores and
/// memory, and free slots, cores and memory summed over them. A scheduler can keep it per node
/// ([`gate_inputs`]) and reject nodes with [`size_gate`] without a placement attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GateInputs {
    /// Schedulable GPUs.
    pub schedulable: u64,
    /// Largest cores of a schedulable GPU.
    pub max_cores: u64,
    /// Largest memory of a schedulable GPU, MiB.
    pub max_memory_mib: u64,
    /// Free slots, cores and memory (MiB) over schedulable GPUs.
    pub avail: [u64; 3],
}

/// A node's [`GateInputs`] under its usage.
pub fn gate_inputs(node: &NodeView<'_>) -> GateInputs {
    let mut g = GateInputs::default();
    for d in node.inventory.schedulable() {
        let u = node.usage.device(d.index);
        g.schedulable += 1;
        g.max_cores = g.max_cores.max(d.cores);
        g.max_memory_mib = g.max_memory_mib.max(d.memory_mib);
        g.avail[0] += u64::from(d.split_count.saturating_sub(u.number));
        g.avail[1] += d.cores.saturating_sub(u.cores);
        g.avail[2] += d.memory_mib.saturating_sub(u.memory_mib);
    }
    g
}

/// The first size gate of [`precheck`] (cards, cores and memory per vGPU, free slots, cores and memory) that a
/// resolved request fails on a node with these inputs; `None`: they pass (the include/exclude gates, which
/// come after, are not looked at).
pub fn size_gate(resolved: &ResolvedRequest, inputs: &GateInputs) -> Option<ReasonCode> {
    failed_size_gate(resolved, inputs).map(Gate::code)
}

fn failed_size_gate(resolved: &ResolvedRequest, g: &GateInputs) -> Option<Gate> {
    let (max, total) = (resolved.max, resolved.total);
    if max.number > g.schedulable {
        return Some(Gate::Cards { want: max.number, have: g.schedulable });
    }
    if max.cores > g.max_cores {
        return Some(Gate::MaxCores { want: max.cores, have: g.max_cores });
    }
    if max.memory_mib > g.max_memory_mib {
        return Some(Gate::MaxMemory { want: max.memory_mib, have: g.max_memory_mib });
    }
    if total.number > g.avail[0] {
        return Some(Gate::Slots { want: total.number, free: g.avail[0] });
    }
    if total.cores > g.avail[1] {
        return Some(Gate::Cores { want: total.cores, free: g.avail[1] });
    }
    if total.memory_mib > g.avail[2] {
        return Some(Gate::Memory { want: total.memory_mib, free: g.avail[2] });
    }
    None
}

/// The first structural gate that fails, in the contract's order; computed without allocating.
fn failed_gate(request: &PodRequest, resolved: &ResolvedRequest, node: &NodeView<'_>) -> Option<Gate> {
    if let Some(gate) = failed_size_gate(resolved, &gate_inputs(node)) {
        return Some(gate);
    }
    let sched = || node.inventory.schedulable();
    let max = resolved.max;
    if !request.filter.uuids.is_unset() {
        let matching = sched().filter(|d| request.filter.uuids.admits(&d.uuid)).count();
        if (matching as u64) < max.number {
            return Some(Gate::Uuids { matching });
        }
    }
    if !request.filter.types.is_unset() {
        let matching = sched().filter(|d| request.filter.types.admits(&d.type_name)).count();
        if (matching as u64) < max.number {
            return Some(Gate::Types { matching });
        }
    }
    None
}

/// Why [`precheck`] then [`place_aligned`] would reject the pod — at a structural gate, at the GPU filter of
/// the first container placed, or (`numa-strict`) at that container's NUMA placement — found without
/// allocating; `None` when both pass (the placement may still fail later: another container, the topology).
/// Exact: `Some(code)` only where `precheck` + `place_aligned` fail with `code`, whatever the alignment. A
/// filter trying thousands of nodes that cannot take the pod pays this instead of a placement attempt per
/// node.
pub fn quick_reject(
    request: &PodRequest,
    resolved: &ResolvedRequest,
    node: &NodeView<'_>,
) -> Option<ReasonCode> {
    if let Some(gate) = failed_gate(request, resolved, node) {
        return Some(gate.code());
    }
    let gpus = node.inventory.devices.iter().map(|d| {
        let g = GpuFree::of(d, node.usage.device(d.index));
        (g, list_exclusion(d, request))
    });
    first_container_reject(request, resolved, node.inventory.schedulable().count(), gpus)
}

/// [`quick_reject`] from a node summary — its [`GateInputs`] and every GPU of its inventory, in order, as
/// [`GpuFree`] — for a node that passes [`NodeView::check`]: the same answer for a request without
/// include/exclude lists; with lists, only the size gates are answered.
pub fn quick_reject_summary(
    request: &PodRequest,
    resolved: &ResolvedRequest,
    gates: &GateInputs,
    gpus: impl IntoIterator<Item = GpuFree>,
) -> Option<ReasonCode> {
    if let Some(code) = size_gate(resolved, gates) {
        return Some(code);
    }
    if !request.filter.uuids.is_unset() || !request.filter.types.is_unset() {
        return None;
    }
    let schedulable = usize::try_from(gates.schedulable).unwrap_or(usize::MAX);
    first_container_reject(request, resolved, schedulable, gpus.into_iter().map(|g| (g, None)))
}

/// The first container's GPU filter (and `numa-strict` NUMA placement) of [`quick_reject`], over the node's
/// GPUs with their list exclusions.
fn first_container_reject(
    request: &PodRequest,
    resolved: &ResolvedRequest,
    schedulable: usize,
    gpus: impl Iterator<Item = (GpuFree, Option<ReasonCode>)>,
) -> Option<ReasonCode> {
    // The container `place_aligned` runs first: the first one without sequential init containers, else the
    // first sidecar, else the first app container (sequential init containers alone: no quick answer).
    let first = if !resolved.has_sequential_init {
        resolved.containers.first()
    } else {
        let role = |r: ContainerRole| resolved.containers.iter().find(|c| c.role == r);
        role(ContainerRole::Sidecar).or_else(|| role(ContainerRole::App))
    }?;
    let number = first.number as usize;
    if number > schedulable {
        return Some(ReasonCode::InsufficientGpuCards);
    }
    // `filter_devices` with `ReasonCounts` as a fixed array, and `NodeFailure::from_counts`' choice: the
    // highest count, ties to the code first in `ReasonCode` order.
    let mut fit = 0usize;
    let mut counts = [(ReasonCode::DeviceUnhealthy, 0u32); EXCLUSIONS.len()];
    for (slot, code) in counts.iter_mut().zip(EXCLUSIONS) {
        slot.0 = code;
    }
    // Fitting GPUs per NUMA node (`numa::pick`'s groups), while there are at most NUMA_GROUPS of them.
    let mut numa = [(0u32, 0usize); NUMA_GROUPS];
    let mut groups = Some(0usize);
    for (g, listed) in gpus {
        match g.exclusion(first).or(listed) {
            None => {
                fit += 1;
                if let (Some(n), Some(len)) = (g.numa, groups) {
                    groups = match numa[..len].iter_mut().find(|(id, _)| *id == n) {
                        Some(group) => {
                            group.1 += 1;
                            Some(len)
                        }
                        None => numa.get_mut(len).map(|group| {
                            *group = (n, 1);
                            len + 1
                        }),
                    };
                }
            }
            Some(code) => {
                if let Some(slot) = counts.iter_mut().find(|(c, _)| *c == code) {
                    slot.1 += 1;
                }
            }
        }
    }
    if fit >= number {
        // `numa-strict`: the first container's NUMA placement fails when no NUMA node holds enough of the GPUs
        // that fit (`dispatch`).
        let strict_numa = request.topology.base() == TopologyMode::Numa && request.topology.is_strict();
        if let (true, Some(len)) = (strict_numa, groups)
            && numa[..len].iter().all(|(_, c)| *c < number)
        {
            return Some(ReasonCode::NumaTopologyUnsatisfied);
        }
        return None;
    }
    counts.sort_by_key(|(c, _)| *c);
    let mut code = ReasonCode::InsufficientGpuResources;
    let mut best = 0;
    for (c, n) in counts {
        if n > best {
            best = n;
            code = c;
        }
    }
    Some(code)
}

/// NUMA nodes [`quick_reject`] keeps counts for (more: it leaves the NUMA question to the placement).
const NUMA_GROUPS: usize = 16;

/// Every code [`exclusion`] gives.
const EXCLUSIONS: [ReasonCode; 7] = [
    ReasonCode::DeviceUnhealthy,
    ReasonCode::DeviceMigEnabled,
    ReasonCode::InsufficientVgpuSlot,
    ReasonCode::InsufficientVgpuMemory,
    ReasonCode::InsufficientVgpuCore,
    ReasonCode::DeviceTypeMismatch,
    ReasonCode::DeviceUuidMismatch,
];

/// Places every container (fast path or two-pass path) without the node checks and gates.
pub fn place(
    request: &PodRequest,
    resolved: &ResolvedRequest,
    node: &NodeView<'_>,
) -> Result<PodAllocation, NodeFailure> {
    place_aligned(request, resolved, node, None)
}

/// [`place`] with cross-pod windows for link placement (contract §4.3 "cross-pod windows").
///
/// For each container placed in link mode on a node with links, the attempts are: the rail window (when it
/// holds at least the container's need), the anchor window (same condition), and no window — the last left
/// out when the mode is strict and an anchor is given. A strict request whose anchor component is smaller
/// than the need is rejected with `LinkTopologyUnsatisfied`. The first attempt whose plan satisfies the mode
/// (any plan; strict: one NVLink component) wins; [`PodAllocation::alignment`] reports which. Other modes
/// ignore `alignment`. With `None` this is exactly [`place`].
pub fn place_aligned(
    request: &PodRequest,
    resolved: &ResolvedRequest,
    node: &NodeView<'_>,
    alignment: Option<&Alignment>,
) -> Result<PodAllocation, NodeFailure> {
    let mut window_used: Option<AlignmentWindow> = None;
    let mut work: Vec<DeviceUsage> =
        node.inventory.devices.iter().map(|d| node.usage.device(d.index)).collect();
    let mut notices = Vec::new();
    let mut out: Vec<Option<Vec<DeviceClaim>>> = vec![None; resolved.containers.len()];
    let mut run = |i: usize,
                   work: &mut Vec<DeviceUsage>,
                   notices: &mut Vec<Notice>|
     -> Result<(), NodeFailure> {
        let need =
            resolved.containers.get(i).ok_or_else(|| NodeFailure::new(ReasonCode::AllocatorInternalError))?;
        let (claims, notice, used) = allocate_one(request, node, work, need, None, alignment)?;
        apply(node, work, &claims);
        notices.extend(notice);
        window_used = window_used.max(used);
        if let Some(slot) = out.get_mut(i) {
            *slot = Some(claims);
        }
        Ok(())
    };
    if !resolved.has_sequential_init {
        for i in 0..resolved.containers.len() {
            run(i, &mut work, &mut notices)?;
        }
    } else {
        let roles: Vec<ContainerRole> = resolved.containers.iter().map(|c| c.role).collect();
        for (i, _) in roles.iter().enumerate().filter(|(_, r)| **r == ContainerRole::Sidecar) {
            run(i, &mut work, &mut notices)?;
        }
        let snapshot = work.clone();
        for (i, _) in roles.iter().enumerate().filter(|(_, r)| **r == ContainerRole::App) {
            run(i, &mut work, &mut notices)?;
        }
        let pod_gpus: Vec<u32> =
            out.iter().flatten().flatten().map(|c| c.index).collect::<BTreeSet<u32>>().into_iter().collect();
        for (i, need) in resolved.containers.iter().enumerate() {
            if need.role != ContainerRole::SequentialInit {
                continue;
            }
            let mut scratch = snapshot.clone();
            let windowed = if pod_gpus.len() >= need.number as usize {
                allocate_one(request, node, &mut scratch, need, Some(&pod_gpus), alignment).ok()
            } else {
                None
            };
            let (claims, notice, used) = match windowed {
                Some(r) => r,
                None => allocate_one(request, node, &mut scratch, need, None, alignment)?,
            };
            notices.extend(notice);
            window_used = window_used.max(used);
            if let Some(slot) = out.get_mut(i) {
                *slot = Some(claims);
            }
        }
    }
    let mut containers = Vec::with_capacity(out.len());
    for (need, claims) in resolved.containers.iter().zip(out) {
        let devices = claims.ok_or_else(|| {
            NodeFailure::new(ReasonCode::AllocatorInternalError)
                .with_detail(format!("container {} not placed", need.name))
        })?;
        containers.push(ContainerDeviceClaim { name: need.name.clone(), devices });
    }
    Ok(PodAllocation { claim: PodDeviceClaim { containers }, notices, alignment: window_used })
}

fn apply(node: &NodeView<'_>, work: &mut [DeviceUsage], claims: &[DeviceClaim]) {
    for c in claims {
        if let Some(pos) = node.inventory.devices.iter().position(|d| d.index == c.index)
            && let Some(w) = work.get_mut(pos)
        {
            *w = w.plus(DeviceUsage::of_claim(c));
        }
    }
}

/// One container's claims, its notice, and the cross-pod window its link placement came from.
type Placed = (Vec<DeviceClaim>, Option<Notice>, Option<AlignmentWindow>);

/// `allocateOne`: filter, order, topology dispatch, claims sorted by GPU index.
fn allocate_one(
    request: &PodRequest,
    node: &NodeView<'_>,
    work: &mut [DeviceUsage],
    need: &ContainerNeed,
    window: Option<&[u32]>,
    alignment: Option<&Alignment>,
) -> Result<Placed, NodeFailure> {
    let number = need.number as usize;
    let schedulable = node.inventory.schedulable().count();
    if number > schedulable {
        return Err(NodeFailure::new(ReasonCode::InsufficientGpuCards).with_detail(format!(
            "container {} requests {number} vGPUs, node has {schedulable} schedulable GPUs",
            need.name
        )));
    }
    let (mut cands, counts) = filter_devices(node.inventory, work, need, request, window);
    if cands.len() < number {
        let fit = cands.len();
        return Err(NodeFailure::from_counts(counts)
            .with_detail(format!("container {}: {fit} of {number} requested GPUs fit", need.name)));
    }
    sort_candidates(&mut cands, request.device_policy);
    let (picks, notice, used) = dispatch(request, node, &cands, need, alignment)?;
    let mut claims: Vec<DeviceClaim> = picks
        .iter()
        .filter_map(|&p| cands.get(p))
        .filter_map(|c| node.inventory.devices.get(c.pos))
        .map(|d| DeviceClaim {
            index: d.index,
            uuid: d.uuid.clone(),
            cores: need.cores,
            memory_mib: if need.memory_mib == 0 { d.memory_mib } else { need.memory_mib },
        })
        .collect();
    if claims.len() != number {
        return Err(NodeFailure::new(ReasonCode::AllocatorInternalError).with_detail(format!(
            "container {}: placed {} of {number}",
            need.name,
            claims.len()
        )));
    }
    claims.sort_by_key(|c| c.index);
    Ok((claims, notice, used))
}

type Picks = (Vec<usize>, Option<Notice>, Option<AlignmentWindow>);

fn first_n(n: usize) -> Vec<usize> {
    (0..n).collect()
}

fn dispatch(
    request: &PodRequest,
    node: &NodeView<'_>,
    cands: &[Candidate],
    need: &ContainerNeed,
    alignment: Option<&Alignment>,
) -> Result<Picks, NodeFailure> {
    let n = need.number as usize;
    let strict = request.topology.is_strict();
    let notice = |message: String| Notice {
        container: need.name.clone(),
        kind: NoticeKind::TopologyFallback,
        message,
    };
    match request.topology.base() {
        TopologyMode::Numa => match numa::pick(cands, n, request.device_policy) {
            Ok(p) => Ok((p, None, None)),
            Err(max) => {
                let has_numa = node.inventory.devices.iter().any(|d| d.numa_node.is_some());
                let detail = if has_numa {
                    format!("no NUMA node has {n} GPUs (max single-NUMA capacity {max})")
                } else {
                    "node has no NUMA topology".to_owned()
                };
                if strict {
                    Err(NodeFailure::new(ReasonCode::NumaTopologyUnsatisfied).with_detail(detail))
                } else {
                    let msg = format!(
                        "NUMA topology unsatisfiable on node {:?}: {detail}; falling back to cross-NUMA allocation",
                        node.name
                    );
                    Ok((first_n(n), Some(notice(msg)), None))
                }
            }
        },
        TopologyMode::Link => {
            let links = node.links.filter(|l| l.has_links());
            let (plan, used) = match (links, alignment) {
                (Some(l), Some(a)) => {
                    let (plan, used) = plan_aligned(l, cands, n, request, a)?;
                    (plan, Some(used))
                }
                (l, a) => {
                    let plan = l.and_then(|l| link::plan(l, cands, n, request.device_policy));
                    (plan, a.map(|_| AlignmentWindow::None))
                }
            };
            let nvlink = plan.as_ref().is_some_and(|p| p.tier == LinkTier::NvLink && !p.spanned);
            if nvlink {
                return Ok((plan.map(|p| p.picks).unwrap_or_default(), None, used));
            }
            let detail = match links {
                None => "node has no GPU link topology".to_owned(),
                Some(l) => format!(
                    "no NVLink-connected set of {n} GPUs (largest NVLink component {})",
                    l.largest_component(LinkTier::NvLink)
                ),
            };
            if strict {
                return Err(NodeFailure::new(ReasonCode::LinkTopologyUnsatisfied).with_detail(detail));
            }
            match plan {
                Some(p) => {
                    let at = if p.spanned { "spanning components" } else { p.tier.as_str() };
                    let msg = format!(
                        "Link topology downgraded on node {:?}: {n} GPUs connected at {at:?}, not NVLink; \
                         use link-strict to require NVLink",
                        node.name
                    );
                    Ok((p.picks, Some(notice(msg)), used))
                }
                None => Ok((
                    first_n(n),
                    Some(notice(format!("{detail}; falling back to policy order"))),
                    used.map(|_| AlignmentWindow::None),
                )),
            }
        }
        _ => Ok((first_n(n), None, None)),
    }
}

/// `allocateLink` with cross-pod windows: the attempts (rail, anchor, unwindowed) in order until a plan
/// satisfies the mode. Returns the accepted plan (for a strict request, the first plan found when none
/// satisfies it, so the caller rejects) and its window.
fn plan_aligned(
    links: &NodeLinks,
    cands: &[Candidate],
    n: usize,
    request: &PodRequest,
    alignment: &Alignment,
) -> Result<(Option<LinkPlan>, AlignmentWindow), NodeFailure> {
    let strict = request.topology.is_strict();
    let rail = alignment.rail_gpus.as_deref().filter(|w| w.len() >= n);
    let anchor = match alignment.anchor_gpus.as_deref() {
        Some(w) if w.len() >= n => Some(w),
        Some(w) if strict => {
            return Err(NodeFailure::new(ReasonCode::LinkTopologyUnsatisfied)
                .with_detail(format!("gang anchor NVLink component has {} GPUs, {n} requested", w.len())));
        }
        _ => None,
    };
    let mut attempts: Vec<(AlignmentWindow, Option<&[u32]>)> = Vec::with_capacity(3);
    if let Some(w) = rail {
        attempts.push((AlignmentWindow::Rail, Some(w)));
    }
    if let Some(w) = anchor {
        attempts.push((AlignmentWindow::Component, Some(w)));
    }
    if !(strict && alignment.anchor_gpus.is_some()) {
        attempts.push((AlignmentWindow::None, None));
    }
    let mut first: Option<(LinkPlan, AlignmentWindow)> = None;
    for (by, window) in attempts {
        let got = match window {
            None => link::plan(links, cands, n, request.device_policy),
            Some(w) => {
                let inside: Vec<usize> = (0..cands.len())
                    .filter(|&p| cands.get(p).is_some_and(|c| w.contains(&c.index)))
                    .collect();
                let sub: Vec<Candidate> = inside.iter().filter_map(|&p| cands.get(p).cloned()).collect();
                link::plan(links, &sub, n, request.device_policy).map(|mut p| {
                    p.picks = p.picks.iter().filter_map(|&i| inside.get(i).copied()).collect();
                    p
                })
            }
        };
        let Some(plan) = got else { continue };
        if !strict || (plan.tier == LinkTier::NvLink && !plan.spanned) {
            return Ok((Some(plan), by));
        }
        if first.is_none() {
            first = Some((plan, by));
        }
    }
    Ok(match first {
        Some((p, by)) => (Some(p), by),
        None => (None, AlignmentWindow::None),
    })
}

//! The pod's vGPU request (contract §4.1): per-container needs, policies, and per-node totals and maxima.

use std::collections::BTreeMap;

use crate::codec::device_filter::DeviceFilter;
use crate::domain::ResourceDomain;
use crate::model::{
    ComputePolicy, ContainerKind, ContainerVgpuRequest, MemoryPolicy, NodeDeviceInventory, NodeVgpuConfig,
    ParsePolicyError, RequestError, SchedulingPolicy, TopologyMode, VgpuRequest,
};

use super::pod::{PodContainer, PodSpec, parse_quantity};

/// Why a pod's request cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestBuildError {
    /// A vGPU limit is not a non-negative integer quantity.
    #[error(
        "container {container} has an invalid {resource} quantity {value:?}: expected a non-negative integer"
    )]
    Quantity {
        /// Container name.
        container: String,
        /// Full resource name.
        resource: String,
        /// The rejected text.
        value: String,
    },
    /// A container exceeds the scheduler's hard limits (number ≤ 16, cores ≤ 100); the whole call fails.
    #[error(transparent)]
    Invalid(#[from] RequestError),
}

/// The role of a vGPU container in the pod's lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ContainerRole {
    /// Restartable init container: runs alongside the app containers.
    Sidecar,
    /// Non-restartable init container: runs alone, before the app containers.
    SequentialInit,
    /// App container.
    App,
}

impl ContainerRole {
    /// The role of a container request.
    pub fn of(request: &ContainerVgpuRequest) -> Self {
        match (request.kind, request.restartable) {
            (ContainerKind::Init, true) => ContainerRole::Sidecar,
            (ContainerKind::Init, false) => ContainerRole::SequentialInit,
            (ContainerKind::App, _) => ContainerRole::App,
        }
    }
}

/// The three schedulable quantities, summed or maximised over containers or devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Footprint {
    /// vGPU slots.
    pub number: u64,
    /// Cores (percent units).
    pub cores: u64,
    /// Memory in MiB.
    pub memory_mib: u64,
}

impl Footprint {
    fn add(self, o: Self) -> Self {
        Self {
            number: self.number.saturating_add(o.number),
            cores: self.cores.saturating_add(o.cores),
            memory_mib: self.memory_mib.saturating_add(o.memory_mib),
        }
    }

    fn max(self, o: Self) -> Self {
        Self {
            number: self.number.max(o.number),
            cores: self.cores.max(o.cores),
            memory_mib: self.memory_mib.max(o.memory_mib),
        }
    }
}

/// One container's need on a particular node (memory resolved with the node's factor).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ContainerNeed {
    /// Container name.
    pub name: String,
    /// Lifecycle role.
    pub role: ContainerRole,
    /// vGPUs, each on a distinct GPU.
    pub number: u32,
    /// Cores per vGPU (100 for whole-card requests).
    pub cores: u64,
    /// MiB per vGPU; 0 = the whole memory of whichever card is chosen.
    pub memory_mib: u64,
}

impl ContainerNeed {
    /// The container's `Total` contribution: number, cores × number, memory × number.
    pub fn footprint(&self) -> Footprint {
        let n = u64::from(self.number);
        Footprint {
            number: n,
            cores: self.cores.saturating_mul(n),
            memory_mib: self.memory_mib.saturating_mul(n),
        }
    }
}

/// A request resolved against one node: needs in request order, `Total` and `Max` (contract §4.1).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ResolvedRequest {
    /// Container needs in request order (init containers, then app containers).
    pub containers: Vec<ContainerNeed>,
    /// `sidecarSum + max(regularSum, maxSequentialInit)` per dimension.
    pub total: Footprint,
    /// Per-field maximum over containers (per vGPU, not × number).
    pub max: Footprint,
    /// Some non-restartable init container requests vGPUs.
    pub has_sequential_init: bool,
}

/// Node-independent weights of the three dimensions in node scores (contract §3.2, `NewRequestProfile`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestProfile {
    /// Weight of vGPU slots.
    pub number: f64,
    /// Weight of cores.
    pub cores: f64,
    /// Weight of memory.
    pub memory: f64,
}

impl RequestProfile {
    /// Equal weights (⅓ each).
    pub const UNIFORM: Self = Self { number: 1.0 / 3.0, cores: 1.0 / 3.0, memory: 1.0 / 3.0 };

    /// Weights from a build-time total (memory in request units): `rNum = number`, `rCore = cores/100`,
    /// `rMem = number` when memory is 0 else `max(ceil(memory/1024), number)`; normalised, uniform when all 0.
    pub fn from_total(total: Footprint) -> Self {
        let r_num = total.number as f64;
        let r_core = total.cores as f64 / 100.0;
        let r_mem =
            if total.memory_mib == 0 { r_num } else { (total.memory_mib.div_ceil(1024) as f64).max(r_num) };
        let sum = r_num + r_core + r_mem;
        if sum > 0.0 && sum.is_finite() {
            Self { number: r_num / sum, cores: r_core / sum, memory: r_mem / sum }
        } else {
            Self::UNIFORM
        }
    }
}

/// A pod's vGPU request and placement policies, parsed once (contract §4.1, `BuildAllocationRequest`).
#[derive(Debug, Clone, PartialEq)]
pub struct PodRequest {
    /// vGPU containers only (`vgpu-number > 0`), init containers first, then app containers, declaration order;
    /// raw user values.
    pub containers: Vec<ContainerVgpuRequest>,
    /// `node-scheduler-policy` (unknown → `none`).
    pub node_policy: SchedulingPolicy,
    /// `device-scheduler-policy` (unknown → `none`).
    pub device_policy: SchedulingPolicy,
    /// `device-topology-mode` (unknown → `none`).
    pub topology: TopologyMode,
    /// `memory-scheduler-policy`, when set and valid.
    pub memory_policy: Option<MemoryPolicy>,
    /// Pod `vgpu-compute-policy`, when set and valid (it wins over the node's).
    pub compute_policy: Option<ComputePolicy>,
    /// `cross-pod-topology: "true"` (case-insensitive).
    pub cross_pod_topology: bool,
    /// Include/exclude GPU type and UUID lists.
    pub filter: DeviceFilter,
    /// Policy annotations that did not parse (a scheduler reports them as `PolicyInvalid` events).
    pub invalid_policies: Vec<ParsePolicyError>,
    /// Node-score weights from the build-time total.
    pub profile: RequestProfile,
}

impl PodRequest {
    /// Builds the request from a pod description; annotation keys use `domain`.
    ///
    /// Fails on a vGPU limit that is not an integer quantity, or a container over the hard limits
    /// (number > 16, cores > 100) — upstream fails the whole filter call for those.
    pub fn from_pod(pod: &PodSpec, domain: &ResourceDomain) -> Result<Self, RequestBuildError> {
        Self::from_parts(&pod.containers, &pod.annotations, domain)
    }

    /// [`from_pod`](Self::from_pod) from a pod's containers and annotations where they are held apart (no
    /// [`PodSpec`] copied together for the call).
    pub fn from_parts(
        containers: &[PodContainer],
        annotations: &BTreeMap<String, String>,
        domain: &ResourceDomain,
    ) -> Result<Self, RequestBuildError> {
        let (k_num, k_core, k_mem) = (domain.vgpu_number(), domain.vgpu_cores(), domain.vgpu_memory());
        let mut inits = Vec::new();
        let mut apps = Vec::new();
        for c in containers {
            let get = |key: &str| -> Result<u64, RequestBuildError> {
                match c.limits.get(key) {
                    None => Ok(0),
                    Some(v) => parse_quantity(v).ok_or_else(|| RequestBuildError::Quantity {
                        container: c.name.clone(),
                        resource: key.to_owned(),
                        value: v.clone(),
                    }),
                }
            };
            let number = u32::try_from(get(&k_num)?).unwrap_or(u32::MAX);
            if number == 0 {
                continue;
            }
            let cores = u32::try_from(get(&k_core)?).unwrap_or(u32::MAX);
            let memory = get(&k_mem)?;
            let req = ContainerVgpuRequest {
                name: c.name.clone(),
                kind: c.kind,
                restartable: c.kind == ContainerKind::Init && c.restartable,
                request: VgpuRequest { number, cores, memory },
            };
            req.validate()?;
            match c.kind {
                ContainerKind::Init => inits.push(req),
                ContainerKind::App => apps.push(req),
            }
        }
        inits.extend(apps);

        let ann = |key: String| annotations.get(&key).map(String::as_str);
        let mut invalid = Vec::new();
        let parse = |key: String| -> Option<String> { ann(key).map(str::to_owned) };
        let node_policy = parse_or_default(parse(domain.node_scheduler_policy()), &mut invalid);
        let device_policy = parse_or_default(parse(domain.device_scheduler_policy()), &mut invalid);
        let topology = parse_or_default(parse(domain.device_topology_mode()), &mut invalid);
        let memory_policy = parse_opt(parse(domain.memory_scheduler_policy()), &mut invalid);
        let compute_policy = parse_opt(parse(domain.vgpu_compute_policy()), &mut invalid);
        let cross_pod_topology =
            ann(domain.cross_pod_topology()).is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        let filter = DeviceFilter::from_annotations(domain, |k| annotations.get(k).map(String::as_str));

        let build_total = total_of(inits.iter().map(|c| {
            let r = c.request;
            let cores = if r.cores == 0 && r.memory == 0 { 100 } else { u64::from(r.cores) };
            (
                ContainerRole::of(c),
                ContainerNeed {
                    name: String::new(),
                    role: ContainerRole::of(c),
                    number: r.number,
                    cores,
                    memory_mib: r.memory,
                },
            )
        }));
        Ok(Self {
            containers: inits,
            node_policy,
            device_policy,
            topology,
            memory_policy,
            compute_policy,
            cross_pod_topology,
            filter,
            invalid_policies: invalid,
            profile: RequestProfile::from_total(build_total),
        })
    }

    /// No container requests vGPUs (the pod is not the allocator's business).
    pub fn is_empty(&self) -> bool {
        self.containers.is_empty()
    }

    /// Some non-restartable init container requests vGPUs (the two-pass path applies).
    pub fn has_sequential_init(&self) -> bool {
        self.containers.iter().any(ContainerVgpuRequest::is_sequential_init)
    }

    /// The compute policy in force: the pod's when set, else the node's, else `fixed`.
    pub fn effective_compute_policy(&self, node: Option<ComputePolicy>) -> ComputePolicy {
        self.compute_policy.or(node).unwrap_or_default()
    }

    /// Resolves the needs on a node (`resolveContainerNeeds`): memory × memory factor; no cores and no memory
    /// → 100 cores; no memory and every schedulable GPU of the same size → that size (else 0 = per-card).
    pub fn resolve(&self, inventory: &NodeDeviceInventory, config: &NodeVgpuConfig) -> ResolvedRequest {
        let mut sizes = inventory.schedulable().map(|d| d.memory_mib);
        let uniform = sizes.next().filter(|first| sizes.all(|s| s == *first));
        let containers: Vec<ContainerNeed> = self
            .containers
            .iter()
            .map(|c| {
                let r = c.request;
                let factor = config.memory_factor.max(1);
                let cores = if r.cores == 0 && r.memory == 0 { 100 } else { u64::from(r.cores) };
                let memory_mib = if r.memory == 0 { uniform.unwrap_or(0) } else { r.memory_mib(factor) };
                ContainerNeed {
                    name: c.name.clone(),
                    role: ContainerRole::of(c),
                    number: r.number,
                    cores,
                    memory_mib,
                }
            })
            .collect();
        let total = total_of(containers.iter().map(|c| (c.role, c.clone())));
        let max = containers.iter().fold(Footprint::default(), |m, c| {
            m.max(Footprint { number: u64::from(c.number), cores: c.cores, memory_mib: c.memory_mib })
        });
        ResolvedRequest { total, max, has_sequential_init: self.has_sequential_init(), containers }
    }
}

/// `sidecarSum + max(regularSum, maxSequentialInit)` per dimension.
fn total_of(needs: impl Iterator<Item = (ContainerRole, ContainerNeed)>) -> Footprint {
    let (mut side, mut regular, mut init) =
        (Footprint::default(), Footprint::default(), Footprint::default());
    for (role, need) in needs {
        let f = need.footprint();
        match role {
            ContainerRole::Sidecar => side = side.add(f),
            ContainerRole::App => regular = regular.add(f),
            ContainerRole::SequentialInit => init = init.max(f),
        }
    }
    side.add(regular.max(init))
}

fn parse_or_default<T: std::str::FromStr<Err = ParsePolicyError> + Default>(
    value: Option<String>,
    invalid: &mut Vec<ParsePolicyError>,
) -> T {
    parse_opt(value, invalid).unwrap_or_default()
}

fn parse_opt<T: std::str::FromStr<Err = ParsePolicyError>>(
    value: Option<String>,
    invalid: &mut Vec<ParsePolicyError>,
) -> Option<T> {
    match value?.parse() {
        Ok(v) => Some(v),
        Err(e) => {
            invalid.push(e);
            None
        }
    }
}

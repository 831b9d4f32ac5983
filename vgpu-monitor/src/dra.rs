//! The DRA side of the monitor (`--enable-dra-monitor`, contract §8/§9): where a container's GPU shares come
//! from when the DRA kubelet plugin, not the device plugin, gave them.
//!
//! | source | impl | what is kept |
//! |---|---|---|
//! | pods | [`KubePods::start_on_node`](crate::pods::KubePods::start_on_node) | pods with field `spec.nodeName=<node>` (DRA pods carry no metrics-node label) |
//! | ResourceSlices, ResourceClaims | [`DraSource`]: [`KubeDra`] (two kube-runtime reflectors, all slices and all claims; filtered at scrape time) or [`InMemoryDra`] | slices of the driver whose pool is this node; claims with an allocation |
//! | readiness | [`DraPods`] | `/readyz` once the pod, slice and claim caches have all synced |
//!
//! Resolution, per scrape ([`NodeDevices::from_slices`], [`resolve_pod`]):
//!
//! | step | rule |
//! |---|---|
//! | node devices | devices of `spec.driver == <driver>` (`manager.nvidia.com` unless configured) and `spec.pool.name == <node>`, attribute `type` `vgpu` or `gpu`, with a `uuid` attribute (matched to the backend's GPU case-insensitively) |
//! | pod claim → ResourceClaim | `spec.resourceClaims[].resourceClaimName`, or for a template the name in `status.resourceClaimStatuses`; the claim must be allocated and reserved for the pod (`status.reservedFor[].uid`) |
//! | container → results | each `resources.claims[]` entry: every result of the claim, or with `request: r` the results of `r` and its subrequests (`r/<sub>`); plus DRA extended resources (`status.extendedResourceClaimStatus.requestMappings` of the container); only results of the driver on this node's pool and on a node device; each (claim, request, device, share) once |
//! | limits | `consumedCapacity` `cores` and `memory` (names may be driver-qualified, `<driver>/cores`); absent → the device's whole capacity (`cores` 100 when the device has none; `memory` 0 here, which the collector replaces by the GPU's memory for a device without a `memory` capacity: an exclusive whole GPU) |
//!
//! What [`NodeCollector`](crate::collect::NodeCollector) makes of it (same families and labels as the
//! device-plugin path):
//!
//! | series | DRA value |
//! |---|---|
//! | `container_vgpu_device_memory_limit_in_bytes` | consumed `memory` |
//! | `container_vgpu_device_physical_memory_limit_in_bytes` | consumed `memory` × 100 / `memoryRatio` when the ratio is above 100, else the same |
//! | `container_vgpu_device_memory_usage_in_bytes` | = physical usage: the vmem ledger is not read on DRA (contract §8) |
//! | `vdevice_idx` | ordinal among the container's results, ordered by GPU index, then request, then share |
//! | `vgpu_device_total_cores_number`, `vgpu_device_total_memory_in_bytes` | the slice device's `cores` (100 when absent) and `memory` capacities |
//! | `vgpu_device_assigned_*` | `ReducePodFootprint` (sidecars + max(apps, sequential inits)) of each pod's results, summed over pods; memory counted in whole MiB |
//! | `vgpu_device_peak_shared_containers_number` | the same reduction's container count (no split count on DRA) |
//! | `vgpu_device_current_shared_containers_number` | containers running now with a result on the GPU |
//! | `node_gpu_device_configuration_info` | `cores_scaling`/`memory_scaling` = `coreRatio`/`memoryRatio` ÷ 100 of the first vGPU device by name |

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fmt,
    sync::{
        Arc, PoisonError, RwLock,
        atomic::{AtomicBool, Ordering},
    },
};

use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{DeviceRequestAllocationResult, ResourceClaim, ResourceSlice},
};
use kube::runtime::{reflector, watcher};
use vgpu_api::pod::actual_claim_name;
use vgpu_core::alloc::parse_quantity;
use vgpu_core::dra::{CAPACITY_CORES, CAPACITY_MEMORY, DeviceType};

use crate::pods::PodSource;

/// The ResourceSlices and ResourceClaims the DRA collector reads.
pub trait DraSource: Send + Sync + fmt::Debug {
    /// The current slices (all drivers and nodes; the collector filters).
    fn slices(&self) -> Vec<Arc<ResourceSlice>>;
    /// The current claims (all namespaces).
    fn claims(&self) -> Vec<Arc<ResourceClaim>>;
    /// Both caches have seen one full list.
    fn synced(&self) -> bool;
}

/// An in-memory [`DraSource`], always synced.
#[derive(Debug, Default)]
pub struct InMemoryDra {
    slices: RwLock<Vec<Arc<ResourceSlice>>>,
    claims: RwLock<Vec<Arc<ResourceClaim>>>,
}

impl InMemoryDra {
    /// A source holding `slices` and `claims`.
    pub fn new(
        slices: impl IntoIterator<Item = ResourceSlice>,
        claims: impl IntoIterator<Item = ResourceClaim>,
    ) -> Self {
        let source = Self::default();
        source.set_slices(slices);
        source.set_claims(claims);
        source
    }

    /// Replaces the slices.
    pub fn set_slices(&self, slices: impl IntoIterator<Item = ResourceSlice>) {
        *self.slices.write().unwrap_or_else(PoisonError::into_inner) =
            slices.into_iter().map(Arc::new).collect();
    }

    /// Replaces the claims.
    pub fn set_claims(&self, claims: impl IntoIterator<Item = ResourceClaim>) {
        *self.claims.write().unwrap_or_else(PoisonError::into_inner) =
            claims.into_iter().map(Arc::new).collect();
    }
}

impl DraSource for InMemoryDra {
    fn slices(&self) -> Vec<Arc<ResourceSlice>> {
        self.slices.read().unwrap_or_else(PoisonError::into_inner).clone()
    }
    fn claims(&self) -> Vec<Arc<ResourceClaim>> {
        self.claims.read().unwrap_or_else(PoisonError::into_inner).clone()
    }
    fn synced(&self) -> bool {
        true
    }
}

/// Watch caches of every ResourceSlice and every ResourceClaim (resource.k8s.io/v1), kept by kube-runtime
/// reflectors that reconnect with backoff. Slices are not field-selected: the collector keeps those of its
/// driver whose pool is the node (the pool, not `spec.nodeName`, is the driver's key).
#[derive(Clone)]
pub struct KubeDra {
    slices: reflector::Store<ResourceSlice>,
    claims: reflector::Store<ResourceClaim>,
    slices_synced: Arc<AtomicBool>,
    claims_synced: Arc<AtomicBool>,
}

impl fmt::Debug for KubeDra {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeDra")
            .field("slices", &self.slices.len())
            .field("claims", &self.claims.len())
            .field("synced", &self.synced())
            .finish()
    }
}

impl KubeDra {
    /// Starts both watches on the current tokio runtime; they run until the runtime stops.
    pub fn start(client: kube::Client) -> Self {
        let (slices, slices_synced) = crate::pods::watch(
            kube::Api::<ResourceSlice>::all(client.clone()),
            watcher::Config::default(),
            "ResourceSlice",
        );
        let (claims, claims_synced) = crate::pods::watch(
            kube::Api::<ResourceClaim>::all(client),
            watcher::Config::default(),
            "ResourceClaim",
        );
        Self { slices, claims, slices_synced, claims_synced }
    }
}

impl DraSource for KubeDra {
    fn slices(&self) -> Vec<Arc<ResourceSlice>> {
        self.slices.state()
    }
    fn claims(&self) -> Vec<Arc<ResourceClaim>> {
        self.claims.state()
    }
    fn synced(&self) -> bool {
        self.slices_synced.load(Ordering::Acquire) && self.claims_synced.load(Ordering::Acquire)
    }
}

/// The node's pods, synced (for `/readyz`) only once the pods and the DRA objects have all synced.
#[derive(Debug, Clone)]
pub struct DraPods {
    pods: Arc<dyn PodSource>,
    dra: Arc<dyn DraSource>,
}

impl DraPods {
    /// `pods` gated on `dra` for readiness.
    pub fn new(pods: Arc<dyn PodSource>, dra: Arc<dyn DraSource>) -> Self {
        Self { pods, dra }
    }
}

impl PodSource for DraPods {
    fn pods(&self) -> Vec<Arc<Pod>> {
        self.pods.pods()
    }
    fn synced(&self) -> bool {
        self.pods.synced() && self.dra.synced()
    }
}

/// One device of this node's slices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceDevice {
    /// Device name (`vgpu-<minor>`, `gpu-<minor>`).
    pub name: String,
    /// The `type` attribute (`vgpu` or `gpu`).
    pub kind: String,
    /// The `uuid` attribute (lower-case as published).
    pub uuid: String,
    /// The `coreRatio` attribute (100 when absent).
    pub core_ratio: u64,
    /// The `memoryRatio` attribute (100 when absent).
    pub memory_ratio: u64,
    /// The `cores` capacity.
    pub cores: Option<u64>,
    /// The `memory` capacity, bytes.
    pub memory_bytes: Option<u64>,
}

impl SliceDevice {
    /// Bytes of real memory behind `bytes` of this device's memory (÷ `memoryRatio` / 100 when above 100).
    pub fn physical(&self, bytes: u64) -> u64 {
        if self.memory_ratio > 100 {
            u64::try_from(u128::from(bytes) * 100 / u128::from(self.memory_ratio)).unwrap_or(u64::MAX)
        } else {
            bytes
        }
    }
}

/// The short name of a possibly driver-qualified capacity (`manager.nvidia.com/cores` → `cores`).
fn short(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// The devices the driver publishes for this node, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeDevices {
    by_name: BTreeMap<String, SliceDevice>,
}

impl NodeDevices {
    /// The devices of `driver`'s slices whose pool is `node` (module table); devices of another type or
    /// without a `uuid` attribute are left out.
    pub fn from_slices<'a>(
        slices: impl IntoIterator<Item = &'a ResourceSlice>,
        driver: &str,
        node: &str,
    ) -> Self {
        let kinds = [DeviceType::Vgpu.as_str(), DeviceType::Gpu.as_str()];
        let mut by_name = BTreeMap::new();
        for slice in slices {
            let spec = &slice.spec;
            if spec.driver != driver || spec.pool.name != node {
                continue;
            }
            for d in spec.devices.iter().flatten() {
                let attr = |k: &str| d.attributes.as_ref().and_then(|a| a.get(k));
                let string = |k: &str| attr(k).and_then(|a| a.string.clone());
                let int = |k: &str| attr(k).and_then(|a| a.int).and_then(|v| u64::try_from(v).ok());
                let Some(kind) = string("type").filter(|k| kinds.contains(&k.as_str())) else { continue };
                let Some(uuid) = string("uuid").filter(|u| !u.is_empty()) else {
                    tracing::debug!(device = %d.name, "slice device without a uuid attribute skipped");
                    continue;
                };
                let capacity = |k: &str| {
                    d.capacity.as_ref().and_then(|c| {
                        c.iter().find(|(n, _)| short(n) == k).and_then(|(_, v)| parse_quantity(&v.value.0))
                    })
                };
                by_name.insert(
                    d.name.clone(),
                    SliceDevice {
                        name: d.name.clone(),
                        kind,
                        uuid,
                        core_ratio: int("coreRatio").unwrap_or(100),
                        memory_ratio: int("memoryRatio").unwrap_or(100),
                        cores: capacity(CAPACITY_CORES),
                        memory_bytes: capacity(CAPACITY_MEMORY),
                    },
                );
            }
        }
        Self { by_name }
    }

    /// The device of this name.
    pub fn get(&self, name: &str) -> Option<&SliceDevice> {
        self.by_name.get(name)
    }

    /// The devices, by name.
    pub fn iter(&self) -> impl Iterator<Item = &SliceDevice> {
        self.by_name.values()
    }

    /// The device whose `uuid` attribute is `uuid` (case-insensitive).
    pub fn by_uuid(&self, uuid: &str) -> Option<&SliceDevice> {
        self.by_name.values().find(|d| d.uuid.eq_ignore_ascii_case(uuid))
    }
}

/// One allocation result a container holds on a node device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerResult {
    /// The claim's UID.
    pub claim_uid: String,
    /// The result's request (`req` or `req/sub`).
    pub request: String,
    /// The device name.
    pub device: String,
    /// The share ID, for a share of a multi-allocatable device.
    pub share_id: Option<String>,
    /// The device's `uuid` attribute.
    pub uuid: String,
    /// Consumed cores (the device's capacity when not consumed).
    pub cores: u64,
    /// Consumed memory, bytes (the device's capacity when not consumed).
    pub memory_bytes: u64,
}

/// One container's results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerAlloc {
    /// Container name.
    pub name: String,
    /// Its results on this node's devices.
    pub results: Vec<ContainerResult>,
}

/// Allocated claims by `(namespace, name)`.
#[derive(Debug, Default)]
pub struct ClaimIndex {
    by_name: HashMap<(String, String), Arc<ResourceClaim>>,
}

impl ClaimIndex {
    /// Indexes `claims` (those without an allocation are left out).
    pub fn new(claims: impl IntoIterator<Item = Arc<ResourceClaim>>) -> Self {
        let by_name = claims
            .into_iter()
            .filter(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some()))
            .filter_map(|c| {
                let key = (c.metadata.namespace.clone()?, c.metadata.name.clone()?);
                Some((key, c))
            })
            .collect();
        Self { by_name }
    }

    /// The allocated claim `namespace/name`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<&Arc<ResourceClaim>> {
        self.by_name.get(&(namespace.to_owned(), name.to_owned()))
    }
}

fn reserved_for(claim: &ResourceClaim, pod_uid: &str) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .is_some_and(|r| r.iter().any(|c| c.uid == pod_uid))
}

fn results(claim: &ResourceClaim) -> impl Iterator<Item = &DeviceRequestAllocationResult> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
}

/// The result's request, or a subrequest of it (`req/sub`), is `request`.
fn of_request(result: &str, request: &str) -> bool {
    result == request || result.strip_prefix(request).is_some_and(|rest| rest.starts_with('/'))
}

/// Each container of `pod` (app, init, sidecar; in spec order) with its results on `devices` (module table).
/// Containers referencing nothing on this node have an empty list.
pub fn resolve_pod(
    pod: &Pod,
    claims: &ClaimIndex,
    driver: &str,
    node: &str,
    devices: &NodeDevices,
) -> Vec<ContainerAlloc> {
    let Some(spec) = pod.spec.as_ref() else { return Vec::new() };
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let held = |name: &str| claims.get(namespace, name).filter(|c| reserved_for(c, uid));
    let resolve =
        |claim: &ResourceClaim, result: &DeviceRequestAllocationResult| -> Option<ContainerResult> {
            if result.driver != driver || result.pool != node {
                return None;
            }
            let device = devices.get(&result.device)?;
            let consumed = |k: &str| {
                result
                    .consumed_capacity
                    .as_ref()
                    .and_then(|c| c.iter().find(|(n, _)| short(n) == k))
                    .and_then(|(_, q)| parse_quantity(&q.0))
            };
            Some(ContainerResult {
                claim_uid: claim.metadata.uid.clone().unwrap_or_default(),
                request: result.request.clone(),
                device: result.device.clone(),
                share_id: result.share_id.clone(),
                uuid: device.uuid.clone(),
                cores: consumed(CAPACITY_CORES).or(device.cores).unwrap_or(100),
                memory_bytes: consumed(CAPACITY_MEMORY).or(device.memory_bytes).unwrap_or(0),
            })
        };
    let extended = pod.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref());
    let containers = spec.init_containers.iter().flatten().chain(&spec.containers);
    let mut out = Vec::new();
    for c in containers {
        let mut seen = HashSet::new();
        let mut list = Vec::new();
        let mut push = |r: ContainerResult| {
            if seen.insert((r.claim_uid.clone(), r.request.clone(), r.device.clone(), r.share_id.clone())) {
                list.push(r);
            }
        };
        for reference in c.resources.as_ref().and_then(|r| r.claims.as_ref()).into_iter().flatten() {
            let Some(claim) = actual_claim_name(pod, &reference.name).and_then(&held) else { continue };
            for result in results(claim) {
                if reference.request.as_deref().is_none_or(|r| of_request(&result.request, r))
                    && let Some(r) = resolve(claim, result)
                {
                    push(r);
                }
            }
        }
        if let Some(ext) = extended
            && let Some(claim) = held(&ext.resource_claim_name)
        {
            for mapping in ext.request_mappings.iter().filter(|m| m.container_name == c.name) {
                for result in results(claim).filter(|r| r.request == mapping.request_name) {
                    if let Some(r) = resolve(claim, result) {
                        push(r);
                    }
                }
            }
        }
        out.push(ContainerAlloc { name: c.name.clone(), results: list });
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use k8s_openapi::api::resource::v1::{
        Device, DeviceAttribute, DeviceCapacity, ResourcePool, ResourceSliceSpec,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use vgpu_dra::claims::{allocated, allocation_result, claim};

    use super::*;

    const DRIVER: &str = "manager.nvidia.com";

    fn device(name: &str, kind: &str, uuid: Option<&str>, caps: &[(&str, &str)]) -> Device {
        let mut attrs = BTreeMap::new();
        attrs.insert(
            "type".to_owned(),
            DeviceAttribute { string: Some(kind.to_owned()), ..Default::default() },
        );
        if let Some(u) = uuid {
            attrs.insert(
                "uuid".to_owned(),
                DeviceAttribute { string: Some(u.to_owned()), ..Default::default() },
            );
        }
        attrs.insert("memoryRatio".to_owned(), DeviceAttribute { int: Some(200), ..Default::default() });
        Device {
            name: name.to_owned(),
            attributes: Some(attrs),
            capacity: Some(
                caps.iter()
                    .map(|(k, v)| {
                        (
                            (*k).to_owned(),
                            DeviceCapacity { value: Quantity((*v).to_owned()), request_policy: None },
                        )
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn slice(driver: &str, pool: &str, devices: Vec<Device>) -> ResourceSlice {
        ResourceSlice {
            metadata: Default::default(),
            spec: ResourceSliceSpec {
                driver: driver.to_owned(),
                pool: ResourcePool { name: pool.to_owned(), generation: 1, resource_slice_count: 1 },
                node_name: Some(pool.to_owned()),
                devices: Some(devices),
                ..Default::default()
            },
        }
    }

    fn devices() -> NodeDevices {
        let slices = [
            slice(
                DRIVER,
                "n1",
                vec![
                    device("vgpu-0", "vgpu", Some("gpu-aa"), &[("cores", "100"), ("memory", "48Gi")]),
                    device("gpu-1", "gpu", Some("gpu-bb"), &[]),
                    device("mig-x", "mig", Some("mig-1"), &[]),
                    device("vgpu-9", "vgpu", None, &[]),
                ],
            ),
            slice(DRIVER, "n2", vec![device("vgpu-5", "vgpu", Some("gpu-cc"), &[])]),
            slice("other.example.com", "n1", vec![device("vgpu-6", "vgpu", Some("gpu-dd"), &[])]),
        ];
        NodeDevices::from_slices(&slices, DRIVER, "n1")
    }

    #[test]
    fn only_this_nodes_driver_devices_with_a_uuid() {
        let d = devices();
        let names: Vec<&str> = d.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["gpu-1", "vgpu-0"]);
        let v = d.get("vgpu-0").unwrap();
        assert_eq!(
            (v.cores, v.memory_bytes, v.memory_ratio, v.core_ratio),
            (Some(100), Some(48 << 30), 200, 100)
        );
        assert_eq!(v.physical(2 << 30), 1 << 30);
        assert_eq!(d.by_uuid("GPU-AA").unwrap().name, "vgpu-0");
    }

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn containers_get_their_claims_results() {
        let d = devices();
        let direct = allocated(
            claim("ns", "direct", "c-1"),
            vec![
                allocation_result(
                    "a",
                    DRIVER,
                    "n1",
                    "vgpu-0",
                    Some("s1"),
                    &[("cores", "10"), ("memory", "1Gi")],
                ),
                allocation_result(
                    "b/small",
                    DRIVER,
                    "n1",
                    "vgpu-0",
                    Some("s2"),
                    &[("manager.nvidia.com/cores", "20")],
                ),
                allocation_result("b/small", DRIVER, "n2", "vgpu-0", None, &[]),
                allocation_result("b/small", "other.example.com", "n1", "vgpu-0", None, &[]),
                allocation_result("c", DRIVER, "n1", "gpu-1", None, &[]),
                allocation_result("c", DRIVER, "n1", "vgpu-77", None, &[]),
            ],
            &["pod-uid"],
        );
        let templated = allocated(
            claim("ns", "tmpl-xyz", "c-2"),
            vec![allocation_result(
                "r",
                DRIVER,
                "n1",
                "vgpu-0",
                Some("s3"),
                &[("cores", "5"), ("memory", "2Gi")],
            )],
            &["pod-uid"],
        );
        let not_mine = allocated(
            claim("ns", "other", "c-3"),
            vec![allocation_result("r", DRIVER, "n1", "vgpu-0", Some("s4"), &[])],
            &["someone-else"],
        );
        let index = ClaimIndex::new([direct, templated, not_mine].map(Arc::new));
        let p = pod(serde_json::json!({
            "metadata": { "name": "p", "namespace": "ns", "uid": "pod-uid" },
            "spec": {
                "resourceClaims": [
                    { "name": "one", "resourceClaimName": "direct" },
                    { "name": "two", "resourceClaimTemplateName": "t" },
                    { "name": "three", "resourceClaimName": "other" },
                    { "name": "four", "resourceClaimTemplateName": "t2" }
                ],
                "initContainers": [{ "name": "init", "resources": { "claims": [{ "name": "one", "request": "b" }] } }],
                "containers": [
                    { "name": "all", "resources": { "claims": [{ "name": "one" }, { "name": "one", "request": "a" }] } },
                    { "name": "tmpl", "resources": { "claims": [{ "name": "two" }, { "name": "three" }, { "name": "four" }] } },
                    { "name": "ext" },
                    { "name": "none" }
                ]
            },
            "status": {
                "resourceClaimStatuses": [{ "name": "two", "resourceClaimName": "tmpl-xyz" }, { "name": "four" }],
                "extendedResourceClaimStatus": {
                    "resourceClaimName": "direct",
                    "requestMappings": [{ "containerName": "ext", "resourceName": "nvidia.com/gpu", "requestName": "c" }]
                }
            }
        }));
        let allocs = resolve_pod(&p, &index, DRIVER, "n1", &d);
        type Row<'a> = (&'a str, Vec<(&'a str, &'a str, u64, u64)>);
        let view: Vec<Row<'_>> = allocs
            .iter()
            .map(|a| {
                (
                    a.name.as_str(),
                    a.results
                        .iter()
                        .map(|r| (r.request.as_str(), r.device.as_str(), r.cores, r.memory_bytes))
                        .collect(),
                )
            })
            .collect();
        assert_eq!(
            view,
            [
                ("init", vec![("b/small", "vgpu-0", 20, 48 << 30)]),
                (
                    "all",
                    vec![
                        ("a", "vgpu-0", 10, 1 << 30),
                        ("b/small", "vgpu-0", 20, 48 << 30),
                        ("c", "gpu-1", 100, 0)
                    ]
                ),
                ("tmpl", vec![("r", "vgpu-0", 5, 2 << 30)]),
                ("ext", vec![("c", "gpu-1", 100, 0)]),
                ("none", vec![]),
            ]
        );
    }

    #[test]
    fn request_prefixes_need_a_slash() {
        assert!(of_request("gpu", "gpu"));
        assert!(of_request("gpu/small", "gpu"));
        assert!(!of_request("gpus", "gpu"));
        assert!(!of_request("gp", "gpu"));
    }

    #[test]
    fn readiness_needs_every_cache() {
        #[derive(Debug)]
        struct Unsynced;
        impl DraSource for Unsynced {
            fn slices(&self) -> Vec<Arc<ResourceSlice>> {
                Vec::new()
            }
            fn claims(&self) -> Vec<Arc<ResourceClaim>> {
                Vec::new()
            }
            fn synced(&self) -> bool {
                false
            }
        }
        let pods: Arc<dyn PodSource> = Arc::new(crate::pods::InMemoryPods::default());
        assert!(DraPods::new(Arc::clone(&pods), Arc::new(InMemoryDra::default())).synced());
        assert!(!DraPods::new(pods, Arc::new(Unsynced)).synced());
    }
}

//! The adapter's part of the GPU module's PhysicalGPU status (issue #20, "Adapters"): the kubelet plugin of
//! each vendor (NVIDIA: `manager.nvidia.com`, MetaX: `gpu.metax-tech.com`; the backend says which) writes the
//! vendor driver's version, the GPU's memory and compute capability, whether the driver answers for it and
//! its hardware health, for the PhysicalGPUs of its node.
//!
//! | what | source | PhysicalGPU field |
//! |---|---|---|
//! | driver version | [`AllocatableDevices::driver_versions`] (the backend's `driver_versions`) | `status.driverVersion` (absent when the backend reports none) |
//! | memory | the backend's GPU (`memory_mib`) | `status.memoryMiB` (absent when 0) |
//! | compute capability | the backend's GPU (`capability`, `major.minor`) | `status.computeCapability` (absent when `0.0`: not reported, e.g. MetaX) |
//! | driver answering | a [`DriverProbe`] at each sync: the backend's device list, asked again ([`StatusSync::with_driver_probe`]) | condition `DriverReady` |
//! | hardware health | the [`HealthSnapshot`] of the GPU's devices ([`crate::health`]) | condition `HardwareHealthy` |
//!
//! `DriverReady` of one GPU:
//!
//! | driver probe | status | reason |
//! |---|---|---|
//! | the backend call failed (driver unloaded, library error) | `False` | `DriverNotAnswering` (the error as message) |
//! | answered, the GPU's UUID not among its GPUs | `False` | `GpuNotListed` |
//! | answered, a device of the GPU has taint `<driver>/gpu-lost` | `False` | `GpuLost` |
//! | answered, the GPU listed | `True` | `DriverAnswering` |
//!
//! `HardwareHealthy` of one GPU (every published device of the GPU counts; the first unhealthy one gives the reason):
//!
//! | devices | status | reason |
//! |---|---|---|
//! | health not watched (gate `NVMLDeviceHealthCheck` off) | `Unknown` | `NotMonitored` |
//! | a device with taint `<driver>/gpu-lost` | `False` | `GpuLost` |
//! | a device with a `NoSchedule` taint `<driver>/xid` = N | `False` | `XidN` (`Xid79`) |
//! | a device with taint `<driver>/unmonitored` (the health stream ended) | `Unknown` | `HealthStreamLost` |
//! | all healthy | `True` | `Healthy` |
//!
//! A PhysicalGPU is matched to the backend's GPU by PCI address (`spec.pciAddress` against the backend's bus id,
//! both parsed as [`PciAddress`], so `00000000:3B:00.0` names `0000:3b:00.0`), else by `spec.index`. A
//! PhysicalGPU matching no GPU gets no patch.
//!
//! Writes ([`KubePhysicalGpus`]):
//!
//! | call | request | result |
//! |---|---|---|
//! | [`PhysicalGpuStore::list`] | `GET /apis/gpu.deckhouse.io/v1alpha1/physicalgpus?fieldSelector=spec.nodeName=<node>` | `Ok(None)` on 404 (no GPU module: no CRD) |
//! | [`PhysicalGpuStore::apply`] | server-side apply of `status` (`driverVersion`, the `HardwareHealthy` condition) on `.../physicalgpus/<name>/status`, field manager `vgpu-kubelet-plugin`, forced | the node agent's and the controller's fields are untouched |
//!
//! [`StatusSync`] applies the patches at start, whenever the health snapshot changes and every resync interval
//! (PhysicalGPUs created later by the node agent); only patches that differ from the last applied one are sent.
//! Without the CRD it logs that once at info and checks again each resync interval.

use std::{collections::BTreeMap, future::Future, sync::Arc, time::Duration};

use tokio::sync::watch;
use vgpu_api::{Condition, ConditionStatus, PhysicalGPU};
use vgpu_core::discovery::PciAddress;

use crate::{
    devices::AllocatableDevices,
    health::{HealthSnapshot, HealthStatus, TAINT_GPU_LOST, TAINT_UNMONITORED, TAINT_XID, TaintEffect},
};

/// The field manager of the adapter's status writes.
pub const FIELD_MANAGER: &str = "vgpu-kubelet-plugin";
/// The hardware-health condition this module writes.
pub const CONDITION_HARDWARE_HEALTHY: &str = "HardwareHealthy";
/// The driver condition this module writes.
pub const CONDITION_DRIVER_READY: &str = "DriverReady";
/// The default resync interval of [`StatusSync`].
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(30);

/// A PhysicalGPU store call failed (not a 404 on the list).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PhysicalGpuError {
    /// Listing this node's PhysicalGPUs failed.
    #[error("list PhysicalGPUs of node {node}: {message}")]
    List {
        /// The node.
        node: String,
        /// Why.
        message: String,
    },
    /// Applying a status failed.
    #[error("apply the status of PhysicalGPU {name}: {message}")]
    Apply {
        /// The PhysicalGPU.
        name: String,
        /// Why.
        message: String,
    },
}

/// What identifies a PhysicalGPU's GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuRef {
    /// The PhysicalGPU's name.
    pub name: String,
    /// `spec.index`.
    pub index: u32,
    /// `spec.pciAddress`.
    pub pci_address: String,
}

impl GpuRef {
    /// The reference of a PhysicalGPU object.
    pub fn of(gpu: &PhysicalGPU) -> Self {
        Self {
            name: gpu.metadata.name.clone().unwrap_or_default(),
            index: gpu.spec.index,
            pci_address: gpu.spec.pci_address.clone(),
        }
    }
}

/// The fields of one PhysicalGPU's status this module owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusPatch {
    /// The PhysicalGPU.
    pub name: String,
    /// `status.driverVersion`.
    pub driver_version: Option<String>,
    /// `status.memoryMiB`.
    pub memory_mib: Option<u64>,
    /// `status.computeCapability`.
    pub compute_capability: Option<String>,
    /// The `DriverReady` condition.
    pub driver_ready: Condition,
    /// The `HardwareHealthy` condition.
    pub hardware_healthy: Condition,
}

impl StatusPatch {
    /// The server-side apply body (only the owned fields).
    pub fn to_apply_body(&self, api_version: &str) -> serde_json::Value {
        let mut status = serde_json::json!({ "conditions": [self.driver_ready, self.hardware_healthy] });
        if let Some(version) = &self.driver_version {
            status["driverVersion"] = serde_json::Value::String(version.clone());
        }
        if let Some(memory) = self.memory_mib {
            status["memoryMiB"] = serde_json::Value::from(memory);
        }
        if let Some(capability) = &self.compute_capability {
            status["computeCapability"] = serde_json::Value::String(capability.clone());
        }
        serde_json::json!({
            "apiVersion": api_version,
            "kind": "PhysicalGPU",
            "metadata": { "name": self.name },
            "status": status,
        })
    }
}

/// A PCI address in canonical form, or `None` when `text` is not one.
pub fn normalise_pci(text: &str) -> Option<PciAddress> {
    text.trim().parse().ok()
}

/// What the vendor driver answered when asked for its GPUs at a sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverProbe {
    /// The UUIDs of the GPUs it lists.
    Answered(Vec<String>),
    /// The call failed; the error.
    Failed(String),
}

impl DriverProbe {
    /// Asks `backend` for its GPUs now (a blocking call into the vendor library).
    pub fn ask(backend: &dyn vgpu_core::backend::DeviceBackend) -> Self {
        match backend.devices() {
            Ok(gpus) => Self::Answered(gpus.into_iter().map(|g| g.uuid).collect()),
            Err(error) => Self::Failed(error.to_string()),
        }
    }

    /// The answer the start-up device list gave (no backend to ask again).
    pub fn from_devices(devices: &AllocatableDevices) -> Self {
        let mut uuids: Vec<String> = devices.iter().map(|d| d.gpu.uuid.clone()).collect();
        uuids.dedup();
        Self::Answered(uuids)
    }
}

fn condition(type_: &str, status: ConditionStatus, reason: &str, message: String) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status,
        reason: Some(reason.to_owned()),
        message: Some(message),
        last_transition_time: None,
        observed_generation: None,
    }
}

/// The `DriverReady` condition of the GPU with backend index `index`. See the module docs.
pub fn driver_ready(
    devices: &AllocatableDevices,
    health: &HealthSnapshot,
    probe: &DriverProbe,
    index: u32,
) -> Condition {
    let ready =
        |status, reason: &str, message: String| condition(CONDITION_DRIVER_READY, status, reason, message);
    let uuids = match probe {
        DriverProbe::Failed(error) => {
            return ready(
                ConditionStatus::False,
                "DriverNotAnswering",
                format!("the driver did not answer: {error}"),
            );
        }
        DriverProbe::Answered(uuids) => uuids,
    };
    let mut gpu_devices = devices.iter().filter(|d| d.gpu.index == index).peekable();
    let Some(uuid) = gpu_devices.peek().map(|d| d.gpu.uuid.clone()) else {
        return ready(
            ConditionStatus::False,
            "GpuNotListed",
            format!("no device of GPU {index} is published"),
        );
    };
    if !uuids.contains(&uuid) {
        return ready(
            ConditionStatus::False,
            "GpuNotListed",
            format!("the driver no longer lists GPU {uuid}"),
        );
    }
    let lost = gpu_devices.any(|d| {
        health.get(&d.name).is_some_and(|state| {
            state.taints.iter().any(|t| t.key.rsplit('/').next() == Some(TAINT_GPU_LOST))
        })
    });
    if lost {
        return ready(ConditionStatus::False, "GpuLost", format!("the driver lost GPU {uuid}"));
    }
    let version = devices.driver_versions().map(|v| format!(" {}", v.driver_version)).unwrap_or_default();
    ready(ConditionStatus::True, "DriverAnswering", format!("the driver{version} lists GPU {uuid}"))
}

/// The `HardwareHealthy` condition of the GPU with backend index `index`. See the module docs.
pub fn hardware_healthy(devices: &AllocatableDevices, health: &HealthSnapshot, index: u32) -> Condition {
    let condition = |status, reason: &str, message: String| {
        condition(CONDITION_HARDWARE_HEALTHY, status, reason, message)
    };
    if !health.is_monitored() {
        return condition(ConditionStatus::Unknown, "NotMonitored", "device health is not watched".into());
    }
    let mut unknown = None;
    for device in devices.iter().filter(|d| d.gpu.index == index) {
        let Some(state) = health.get(&device.name) else { continue };
        for taint in &state.taints {
            let name = taint.key.rsplit('/').next().unwrap_or_default();
            let reason = match name {
                TAINT_GPU_LOST => "GpuLost".to_owned(),
                TAINT_XID if taint.effect == TaintEffect::NoSchedule => {
                    format!("Xid{}", taint.value.as_deref().unwrap_or_default())
                }
                TAINT_UNMONITORED => {
                    unknown.get_or_insert_with(|| device.name.clone());
                    continue;
                }
                _ => continue,
            };
            let message = if state.message.is_empty() {
                format!("device {} has taint {}", device.name, taint.key)
            } else {
                format!("device {}: {}", device.name, state.message)
            };
            return condition(ConditionStatus::False, &reason, message);
        }
        if state.status == HealthStatus::Unhealthy {
            return condition(
                ConditionStatus::False,
                "Unhealthy",
                format!("device {} is unhealthy", device.name),
            );
        }
        if state.status == HealthStatus::Unknown {
            unknown.get_or_insert_with(|| device.name.clone());
        }
    }
    match unknown {
        Some(device) => condition(
            ConditionStatus::Unknown,
            "HealthStreamLost",
            format!("device {device}: health not known"),
        ),
        None => condition(ConditionStatus::True, "Healthy", "no hardware errors".into()),
    }
}

/// The status patches for this node's PhysicalGPUs `gpus`. See the module docs.
pub fn compute_patches(
    gpus: &[GpuRef],
    devices: &AllocatableDevices,
    health: &HealthSnapshot,
    probe: &DriverProbe,
) -> Vec<StatusPatch> {
    let driver_version = devices.driver_versions().map(|v| v.driver_version.clone());
    let mut by_address = BTreeMap::new();
    let mut by_index = BTreeMap::new();
    for device in devices.iter() {
        if let Some(address) = normalise_pci(&device.gpu.bus_id) {
            by_address.entry(address).or_insert(device.gpu.index);
        }
        by_index.entry(device.gpu.index).or_insert(());
    }
    gpus.iter()
        .filter_map(|gpu| {
            let index = normalise_pci(&gpu.pci_address)
                .and_then(|address| by_address.get(&address).copied())
                .or_else(|| by_index.contains_key(&gpu.index).then_some(gpu.index))?;
            let physical = devices.iter().find(|d| d.gpu.index == index).map(|d| &d.gpu)?;
            let capability = physical.compute_capability;
            Some(StatusPatch {
                name: gpu.name.clone(),
                driver_version: driver_version.clone(),
                memory_mib: (physical.memory_mib() > 0).then(|| physical.memory_mib()),
                compute_capability: (capability.major > 0).then(|| capability.to_string()),
                driver_ready: driver_ready(devices, health, probe, index),
                hardware_healthy: hardware_healthy(devices, health, index),
            })
        })
        .collect()
}

// === store ===

/// Where PhysicalGPUs are read and their status written.
#[tonic::async_trait]
pub trait PhysicalGpuStore: Send + Sync + std::fmt::Debug + 'static {
    /// The PhysicalGPUs of `node`, or `None` when the API has no PhysicalGPU resource (404).
    async fn list(&self, node: &str) -> Result<Option<Vec<GpuRef>>, PhysicalGpuError>;

    /// Applies the owned status fields of one PhysicalGPU.
    async fn apply(&self, patch: &StatusPatch) -> Result<(), PhysicalGpuError>;
}

/// [`PhysicalGpuStore`] over the API server.
#[derive(Clone)]
pub struct KubePhysicalGpus {
    api: kube::Api<PhysicalGPU>,
}

impl std::fmt::Debug for KubePhysicalGpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubePhysicalGpus").finish_non_exhaustive()
    }
}

impl KubePhysicalGpus {
    /// Wraps a client.
    pub fn new(client: kube::Client) -> Self {
        Self { api: kube::Api::all(client) }
    }
}

#[tonic::async_trait]
impl PhysicalGpuStore for KubePhysicalGpus {
    async fn list(&self, node: &str) -> Result<Option<Vec<GpuRef>>, PhysicalGpuError> {
        let params = kube::api::ListParams::default().fields(&format!("spec.nodeName={node}"));
        match self.api.list(&params).await {
            Ok(list) => Ok(Some(list.items.iter().map(GpuRef::of).collect())),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
            Err(e) => Err(PhysicalGpuError::List { node: node.to_owned(), message: e.to_string() }),
        }
    }

    async fn apply(&self, patch: &StatusPatch) -> Result<(), PhysicalGpuError> {
        let body = patch.to_apply_body(&format!("{}/{}", vgpu_api::DEFAULT_GROUP, vgpu_api::VERSION));
        let params = kube::api::PatchParams::apply(FIELD_MANAGER).force();
        self.api
            .patch_status(&patch.name, &params, &kube::api::Patch::Apply(&body))
            .await
            .map(drop)
            .map_err(|e| PhysicalGpuError::Apply { name: patch.name.clone(), message: e.to_string() })
    }
}

/// An in-memory [`PhysicalGpuStore`]: PhysicalGPUs by node and the last patch applied to each.
#[derive(Debug, Default)]
pub struct MemoryPhysicalGpus {
    inner: std::sync::Mutex<MemoryInner>,
}

#[derive(Debug, Default)]
struct MemoryInner {
    crd: bool,
    gpus: BTreeMap<String, Vec<GpuRef>>,
    applied: BTreeMap<String, StatusPatch>,
    applies: usize,
}

impl MemoryPhysicalGpus {
    /// A store with the CRD installed (`crd`) or not.
    pub fn new(crd: bool) -> Self {
        Self { inner: std::sync::Mutex::new(MemoryInner { crd, ..MemoryInner::default() }) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryInner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Installs (or removes) the CRD.
    pub fn set_crd(&self, crd: bool) {
        self.lock().crd = crd;
    }

    /// Adds a PhysicalGPU of `node`.
    pub fn add(&self, node: &str, gpu: GpuRef) {
        self.lock().gpus.entry(node.to_owned()).or_default().push(gpu);
    }

    /// The last patch applied to PhysicalGPU `name`.
    pub fn status(&self, name: &str) -> Option<StatusPatch> {
        self.lock().applied.get(name).cloned()
    }

    /// How many applies were made.
    pub fn applies(&self) -> usize {
        self.lock().applies
    }
}

#[tonic::async_trait]
impl PhysicalGpuStore for MemoryPhysicalGpus {
    async fn list(&self, node: &str) -> Result<Option<Vec<GpuRef>>, PhysicalGpuError> {
        let inner = self.lock();
        Ok(inner.crd.then(|| inner.gpus.get(node).cloned().unwrap_or_default()))
    }

    async fn apply(&self, patch: &StatusPatch) -> Result<(), PhysicalGpuError> {
        let mut inner = self.lock();
        let known = inner.gpus.values().flatten().any(|g| g.name == patch.name);
        if !known {
            return Err(PhysicalGpuError::Apply { name: patch.name.clone(), message: "not found".into() });
        }
        inner.applies += 1;
        inner.applied.insert(patch.name.clone(), patch.clone());
        Ok(())
    }
}

// === sync ===

/// What one [`StatusSync::sync_once`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncOutcome {
    /// The API has no PhysicalGPU resource.
    NoCrd,
    /// This many patches were applied (the others were unchanged).
    Applied(usize),
}

/// Keeps this node's PhysicalGPU status (driver version, `HardwareHealthy`) up to date. See the module docs.
pub struct StatusSync {
    store: Arc<dyn PhysicalGpuStore>,
    node: String,
    devices: Arc<AllocatableDevices>,
    health: watch::Receiver<HealthSnapshot>,
    driver: Option<Arc<dyn vgpu_core::backend::DeviceBackend>>,
    resync: Duration,
    applied: BTreeMap<String, StatusPatch>,
}

impl std::fmt::Debug for StatusSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusSync")
            .field("node", &self.node)
            .field("driver_probe", &self.driver.as_ref().map(|b| b.name()))
            .field("resync", &self.resync)
            .finish_non_exhaustive()
    }
}

impl StatusSync {
    /// A sync for `node`'s PhysicalGPUs.
    pub fn new(
        store: Arc<dyn PhysicalGpuStore>,
        node: &str,
        devices: Arc<AllocatableDevices>,
        health: watch::Receiver<HealthSnapshot>,
    ) -> Self {
        Self {
            store,
            node: node.to_owned(),
            devices,
            health,
            driver: None,
            resync: DEFAULT_RESYNC,
            applied: BTreeMap::new(),
        }
    }

    /// Asks `backend` for its GPUs at each sync ([`DriverProbe::ask`]) for `DriverReady`; without it the
    /// start-up device list answers.
    pub fn with_driver_probe(mut self, backend: Arc<dyn vgpu_core::backend::DeviceBackend>) -> Self {
        self.driver = Some(backend);
        self
    }

    /// Sets the resync interval.
    pub fn with_resync(mut self, resync: Duration) -> Self {
        self.resync = resync;
        self
    }

    /// Lists this node's PhysicalGPUs and applies the patches that changed since the last successful apply.
    ///
    /// # Errors
    ///
    /// The first store error (the patches applied before it are remembered).
    pub async fn sync_once(&mut self) -> Result<SyncOutcome, PhysicalGpuError> {
        let Some(gpus) = self.store.list(&self.node).await? else { return Ok(SyncOutcome::NoCrd) };
        let snapshot = self.health.borrow_and_update().clone();
        let probe = match &self.driver {
            Some(backend) => {
                let backend = Arc::clone(backend);
                tokio::task::spawn_blocking(move || DriverProbe::ask(backend.as_ref()))
                    .await
                    .unwrap_or_else(|e| DriverProbe::Failed(format!("the driver probe did not finish: {e}")))
            }
            None => DriverProbe::from_devices(&self.devices),
        };
        let patches = compute_patches(&gpus, &self.devices, &snapshot, &probe);
        let mut applied = 0;
        for patch in patches {
            if self.applied.get(&patch.name) == Some(&patch) {
                continue;
            }
            self.store.apply(&patch).await?;
            applied += 1;
            self.applied.insert(patch.name.clone(), patch);
        }
        self.applied.retain(|name, _| gpus.iter().any(|g| &g.name == name));
        Ok(SyncOutcome::Applied(applied))
    }

    /// Runs until `stop` resolves: a sync at start, on every health change and every resync interval.
    pub fn spawn<F>(mut self, stop: F) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        tokio::spawn(async move {
            tokio::pin!(stop);
            let mut logged_no_crd = false;
            let mut health_open = true;
            loop {
                match self.sync_once().await {
                    Ok(SyncOutcome::NoCrd) if !logged_no_crd => {
                        logged_no_crd = true;
                        tracing::info!(
                            "no PhysicalGPU resource in the API (GPU module not installed): PhysicalGPU status is not written"
                        );
                    }
                    Ok(SyncOutcome::Applied(n)) if n > 0 => {
                        logged_no_crd = false;
                        tracing::info!(node = %self.node, applied = n, "PhysicalGPU status written");
                    }
                    Ok(_) => {}
                    Err(error) => tracing::warn!(%error, "PhysicalGPU status"),
                }
                tokio::select! {
                    () = &mut stop => return,
                    changed = self.health.changed(), if health_open => {
                        if changed.is_err() {
                            health_open = false;
                        }
                    }
                    () = tokio::time::sleep(self.resync) => {}
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use proptest::prelude::*;
    use vgpu_core::backend::{HealthEvent, HealthEventKind, mock::MockBackend};

    use super::*;
    use crate::{
        devices::DeviceConfig,
        health::{HealthConfig, HealthMonitor},
    };

    const MOCK: &str = "driver: { version: 570.86.10, cudaVersion: '12.8' }
gpus:
  - { uuid: GPU-A, name: A100, memoryMiB: 1024, busId: '0000:3b:00.0' }
  - { uuid: GPU-B, name: A100, memoryMiB: 1024, busId: '0000:86:00.0' }
";

    fn devices(yaml: &str) -> Arc<AllocatableDevices> {
        let backend = MockBackend::from_yaml_str(yaml).unwrap();
        Arc::new(AllocatableDevices::from_backend(&backend, &DeviceConfig::default()).unwrap())
    }

    fn answered(devices: &AllocatableDevices) -> DriverProbe {
        DriverProbe::from_devices(devices)
    }

    fn gpu(name: &str, index: u32, address: &str) -> GpuRef {
        GpuRef { name: name.into(), index, pci_address: address.into() }
    }

    fn event(index: u32, uuid: &str, kind: HealthEventKind) -> HealthEvent {
        HealthEvent { index, uuid: uuid.into(), kind, message: String::new() }
    }

    #[test]
    fn pci_addresses_normalise() {
        assert_eq!(normalise_pci("00000000:3B:00.0"), normalise_pci("0000:3b:00.0"));
        assert!(normalise_pci("0000:3b:00.0").is_some());
        assert_eq!(normalise_pci("3b:00.0"), None);
    }

    #[test]
    fn unmonitored_health_is_unknown_and_the_version_is_written() {
        let devices = devices(MOCK);
        let gpus = [gpu("w1-a", 0, "0000:3b:00.0"), gpu("w1-b", 1, "0000:86:00.0")];
        let patches =
            compute_patches(&gpus, &devices, &HealthSnapshot::unmonitored_default(), &answered(&devices));
        assert_eq!(patches.len(), 2);
        for p in &patches {
            assert_eq!(p.driver_version.as_deref(), Some("570.86.10"));
            assert_eq!(p.hardware_healthy.status, ConditionStatus::Unknown);
            assert_eq!(p.hardware_healthy.reason.as_deref(), Some("NotMonitored"));
        }
    }

    #[test]
    fn matching_prefers_the_pci_address_over_the_index() {
        let devices = devices(MOCK);
        let monitor = HealthMonitor::new(HealthConfig::new("manager.nvidia.com", &[]), &devices);
        let health = monitor.subscribe();
        assert!(monitor.apply(&event(1, "GPU-B", HealthEventKind::Xid { code: 79 })));
        // Index 0 but the address of GPU 1 (indices shifted): the address wins.
        let gpus =
            [gpu("moved", 0, "0000:86:00.0"), gpu("by-index", 0, "0000:99:00.0"), gpu("none", 7, "bad")];
        let patches = compute_patches(&gpus, &devices, &health.borrow(), &answered(&devices));
        assert_eq!(patches.len(), 2, "{patches:?}");
        let moved = &patches[0].hardware_healthy;
        assert_eq!((moved.status, moved.reason.as_deref()), (ConditionStatus::False, Some("Xid79")));
        let by_index = &patches[1].hardware_healthy;
        assert_eq!((by_index.status, by_index.reason.as_deref()), (ConditionStatus::True, Some("Healthy")));
    }

    #[test]
    fn lost_gpus_and_application_xids() {
        let devices = devices(MOCK);
        let monitor = HealthMonitor::new(HealthConfig::new("gpu.metax-tech.com", &[]), &devices);
        let health = monitor.subscribe();
        assert!(monitor.apply(&event(0, "GPU-A", HealthEventKind::Xid { code: 13 })));
        assert!(monitor.apply(&event(1, "GPU-B", HealthEventKind::DeviceLost)));
        let gpus = [gpu("a", 0, "0000:3b:00.0"), gpu("b", 1, "0000:86:00.0")];
        let patches = compute_patches(&gpus, &devices, &health.borrow(), &answered(&devices));
        assert_eq!(
            patches[0].hardware_healthy.status,
            ConditionStatus::True,
            "an application Xid is not a fault"
        );
        assert_eq!(patches[1].hardware_healthy.reason.as_deref(), Some("GpuLost"));
        assert_eq!(patches[1].hardware_healthy.status, ConditionStatus::False);
    }

    #[test]
    fn no_driver_versions_no_field() {
        let devices = devices("gpus:\n  - { uuid: GPU-A, name: MXC500, vendor: metax, memoryMiB: 1024 }\n");
        let patches = compute_patches(
            &[gpu("m", 0, "0000:01:00.0")],
            &devices,
            &HealthSnapshot::default(),
            &answered(&devices),
        );
        assert_eq!(patches[0].driver_version, None);
        let body = patches[0].to_apply_body("gpu.deckhouse.io/v1alpha1");
        assert!(body["status"].get("driverVersion").is_none());
        assert!(body["status"].get("computeCapability").is_none(), "MetaX reports none");
        assert_eq!(body["status"]["memoryMiB"], 1024);
        assert_eq!(body["status"]["conditions"][0]["type"], "DriverReady");
        assert_eq!(body["status"]["conditions"][1]["type"], "HardwareHealthy");
        assert_eq!(body["metadata"]["name"], "m");
    }

    #[test]
    fn memory_capability_and_driver_ready() {
        let devices = devices(
            "driver: { version: 570.86.10 }\ngpus:\n  - { uuid: GPU-A, name: A100, memoryMiB: 40960, computeCapability: '8.0', busId: '0000:3b:00.0' }\n  - { uuid: GPU-B, name: A100, memoryMiB: 40960, computeCapability: '8.0', busId: '0000:86:00.0' }\n",
        );
        let monitor = HealthMonitor::new(HealthConfig::new("manager.nvidia.com", &[]), &devices);
        let health = monitor.subscribe();
        let gpus = [gpu("a", 0, "0000:3b:00.0"), gpu("b", 1, "0000:86:00.0")];
        let ready = |probe: &DriverProbe| -> Vec<(ConditionStatus, String)> {
            compute_patches(&gpus, &devices, &health.borrow(), probe)
                .into_iter()
                .map(|p| (p.driver_ready.status, p.driver_ready.reason.unwrap_or_default()))
                .collect()
        };
        let patches = compute_patches(&gpus, &devices, &health.borrow(), &answered(&devices));
        assert_eq!(patches[0].memory_mib, Some(40960));
        assert_eq!(patches[0].compute_capability.as_deref(), Some("8.0"));
        let body = patches[0].to_apply_body("gpu.deckhouse.io/v1alpha1");
        assert_eq!(
            (&body["status"]["memoryMiB"], &body["status"]["computeCapability"]),
            (&40960.into(), &"8.0".into())
        );
        let message = patches[0].driver_ready.message.clone().unwrap_or_default();
        assert!(message.contains("570.86.10") && message.contains("GPU-A"), "{message}");
        let answering = (ConditionStatus::True, "DriverAnswering".to_owned());
        assert_eq!(ready(&answered(&devices)), [answering.clone(), answering.clone()]);
        // GPU-B gone from the driver's list; then the driver not answering at all.
        assert_eq!(
            ready(&DriverProbe::Answered(vec!["GPU-A".into()])),
            [answering.clone(), (ConditionStatus::False, "GpuNotListed".to_owned())]
        );
        let failed = ready(&DriverProbe::Failed("NVML: driver not loaded".into()));
        assert!(failed.iter().all(|r| *r == (ConditionStatus::False, "DriverNotAnswering".to_owned())));
        // A lost GPU: the driver no longer reaches it.
        assert!(monitor.apply(&event(1, "GPU-B", HealthEventKind::DeviceLost)));
        assert_eq!(ready(&answered(&devices)), [answering, (ConditionStatus::False, "GpuLost".to_owned())]);
    }

    #[tokio::test]
    async fn the_driver_is_asked_again_at_each_sync() {
        let dir = tempfile::tempdir().unwrap();
        // The mock reads its MIG state file on every device list: a broken one makes the list fail, as a
        // driver that stopped answering does.
        let state = dir.path().join("mig.json");
        let backend =
            MockBackend::from_yaml_str(&format!("{MOCK}migStateFile: {}\n", state.display())).unwrap();
        let devices = Arc::new(AllocatableDevices::from_backend(&backend, &DeviceConfig::default()).unwrap());
        let monitor = HealthMonitor::new(HealthConfig::new("manager.nvidia.com", &[]), &devices);
        let store = Arc::new(MemoryPhysicalGpus::new(true));
        store.add("w1", gpu("w1-a", 0, "0000:3b:00.0"));
        let mut sync = StatusSync::new(
            Arc::clone(&store) as Arc<dyn PhysicalGpuStore>,
            "w1",
            devices,
            monitor.subscribe(),
        )
        .with_driver_probe(Arc::new(backend));
        assert_eq!(sync.sync_once().await.unwrap(), SyncOutcome::Applied(1));
        assert_eq!(store.status("w1-a").unwrap().driver_ready.status, ConditionStatus::True);
        assert_eq!(sync.sync_once().await.unwrap(), SyncOutcome::Applied(0));
        std::fs::write(&state, "{ not json").unwrap();
        assert_eq!(sync.sync_once().await.unwrap(), SyncOutcome::Applied(1));
        let ready = store.status("w1-a").unwrap().driver_ready;
        assert_eq!(
            (ready.status, ready.reason.as_deref()),
            (ConditionStatus::False, Some("DriverNotAnswering"))
        );
        assert!(ready.message.unwrap_or_default().contains("mig.json"));
        std::fs::remove_file(&state).unwrap();
        assert_eq!(sync.sync_once().await.unwrap(), SyncOutcome::Applied(1), "answering again");
        assert_eq!(store.status("w1-a").unwrap().driver_ready.status, ConditionStatus::True);
    }

    #[tokio::test]
    async fn sync_writes_changes_only_and_waits_for_the_crd() {
        let devices = devices(MOCK);
        let monitor = HealthMonitor::new(HealthConfig::new("manager.nvidia.com", &[]), &devices);
        let store = Arc::new(MemoryPhysicalGpus::new(false));
        store.add("w1", gpu("w1-a", 0, "0000:3b:00.0"));
        store.add("w2", gpu("w2-a", 0, "0000:3b:00.0"));
        let mut sync = StatusSync::new(
            Arc::clone(&store) as Arc<dyn PhysicalGpuStore>,
            "w1",
            Arc::clone(&devices),
            monitor.subscribe(),
        );
        assert_eq!(sync.sync_once().await.unwrap(), SyncOutcome::NoCrd);
        store.set_crd(true);
        assert_eq!(sync.sync_once().await.unwrap(), SyncOutcome::Applied(1));
        assert_eq!(sync.sync_once().await.unwrap(), SyncOutcome::Applied(0), "unchanged: not re-sent");
        assert_eq!(store.status("w2-a"), None, "another node's GPU is not touched");
        assert!(monitor.apply(&event(0, "GPU-A", HealthEventKind::Xid { code: 48 })));
        assert_eq!(sync.sync_once().await.unwrap(), SyncOutcome::Applied(1));
        let status = store.status("w1-a").unwrap();
        assert_eq!(status.hardware_healthy.reason.as_deref(), Some("Xid48"));
        assert_eq!(status.driver_version.as_deref(), Some("570.86.10"));
        assert_eq!(store.applies(), 2);
    }

    #[tokio::test]
    async fn spawned_sync_follows_health_changes() {
        let devices = devices(MOCK);
        let monitor = HealthMonitor::new(HealthConfig::new("manager.nvidia.com", &[]), &devices);
        let store = Arc::new(MemoryPhysicalGpus::new(true));
        store.add("w1", gpu("w1-b", 1, "0000:86:00.0"));
        let sync = StatusSync::new(
            Arc::clone(&store) as Arc<dyn PhysicalGpuStore>,
            "w1",
            Arc::clone(&devices),
            monitor.subscribe(),
        )
        .with_resync(Duration::from_secs(3600));
        let stop = tokio_util::sync::CancellationToken::new();
        let task = sync.spawn(stop.clone().cancelled_owned());
        let reason = || store.status("w1-b").and_then(|s| s.hardware_healthy.reason);
        while reason().is_none() {
            tokio::task::yield_now().await;
        }
        assert!(monitor.apply(&event(1, "GPU-B", HealthEventKind::DeviceLost)));
        while reason().as_deref() != Some("GpuLost") {
            tokio::task::yield_now().await;
        }
        stop.cancel();
        task.await.unwrap();
    }

    proptest! {
        #[test]
        fn pci_case_and_domain_width_do_not_matter(domain in 0u32..0xffff, bus: u8, dev in 0u8..32, func in 0u8..8) {
            let short = format!("{domain:04x}:{bus:02x}:{dev:02x}.{func}");
            let long = format!("{domain:08X}:{bus:02X}:{dev:02X}.{func}");
            prop_assert!(normalise_pci(&short).is_some());
            prop_assert_eq!(normalise_pci(&short), normalise_pci(&long));
        }
    }
}

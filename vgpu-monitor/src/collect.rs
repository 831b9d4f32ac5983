//! One scrape's worth of facts ([`Snapshot`]), gathered at scrape time by [`NodeCollector::gather`] from
//! the backend, the pod cache and the per-container files.
//!
//! | step | source |
//! |---|---|
//! | GPUs, memory, health, minor numbers, MIG layout, driver versions | [`DeviceBackend`] |
//! | processes and utilization samples per GPU | `watcher/sm_util.config` with `SharedSMUtilizationWatcher` (when present), else the backend |
//! | pods and their containers | [`PodSource`]: pods with a `real-allocated` (else `pre-allocated`) claim, not Succeeded/Failed; on the DRA path ([`NodeCollector::new_dra`]) the pods bound to the node with claims allocated from the driver's ResourceSlices ([`crate::dra`], which documents that path's rules) |
//! | collectable containers | app containers, sidecars (restartable init), init containers that are running |
//! | limits | `<manager-dir>/<podUID>_<ctr>/config/vgpu.config`, memory-mapped and kept mapped between scrapes ([`crate::mapped`]: re-mapped when the file is replaced, seqlock re-read; about 2× faster than reading it) |
//! | container PIDs | `cgroup.procs` ([`CgroupLayout`]) |
//! | virtual memory | `<podUID>_<ctr>/vmem_node/vmem_node.config` with `VirtualMemoryTracking` and `vmem_node=1` |
//! | which container holds which MIG device | the kubelet's pod-resources API ([`crate::podres`]), with [`NodeCollector::with_pod_resources`] |
//! | assigned totals | `ReducePodFootprint` ([`PodFootprint::from_claim_with_roles`]) over the pods' claims |
//!
//! Per container and active device slot (`activate=1`, in host-index order; `vdevice_idx` is the ordinal):
//! physical usage = Σ `usedGpuMemory` of the GPU's compute and graphics processes whose PID is in the
//! container's cgroup; usage = physical + the ledger's bytes on that GPU (gate on); memory utilization =
//! usage / limit × 100, capped at 100; core utilization = Σ over the container's processes' newest sample
//! of `sm + 0.85 × (enc + dec)`, each term counted only when ≤ 100, capped at 100. A file of the wrong
//! size, magic or layout is skipped with one warning per path (never a panic, never a partial row).

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
};

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use vgpu_core::{
    abi::{sm_util, vgpu_config, vmem_node},
    alloc::{ContainerRole, PodFootprint},
    backend::{DeviceBackend, DriverVersions, MigMode, ProcessUtilizationSample},
    codec::pod_devices,
    domain::ResourceDomain,
    model::{ContainerDeviceClaim, DeviceClaim, GpuDevice, PodDeviceClaim},
    node_config::NodeSettings,
};

use crate::{
    cgroup::{CgroupLayout, QosClass, container_id},
    dra::{ClaimIndex, ContainerAlloc, DraSource, NodeDevices, resolve_pod},
    mapped::MappedFiles,
    podres::{PodResourcesSource, mig_holders},
    pods::PodSource,
};

/// Build identity for `exporter_build_info`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BuildInfo {
    /// Version.
    pub version: String,
    /// Git branch.
    pub branch: String,
    /// Git commit.
    pub commit: String,
    /// `os/arch`.
    pub platform: String,
    /// Build date.
    pub date: String,
}

impl BuildInfo {
    /// This build: crate version, `VGPU_GIT_BRANCH` / `VGPU_GIT_COMMIT` / `VGPU_BUILD_DATE` at compile time.
    pub fn current() -> Self {
        Self {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            branch: option_env!("VGPU_GIT_BRANCH").unwrap_or_default().to_owned(),
            commit: option_env!("VGPU_GIT_COMMIT").unwrap_or_default().to_owned(),
            platform: format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
            date: option_env!("VGPU_BUILD_DATE").unwrap_or_default().to_owned(),
        }
    }
}

/// What the collector needs besides its sources.
#[derive(Debug, Clone)]
pub struct MonitorConfig {
    /// `--node-name`.
    pub node_name: String,
    /// Resource domain (`nvidia.com`): annotation keys.
    pub domain: ResourceDomain,
    /// The manager directory as mounted in the monitor (`/etc/vgpu-manager`).
    pub manager_dir: PathBuf,
    /// The cgroup hierarchy.
    pub cgroup: CgroupLayout,
    /// Node settings (split count, scaling, factor) from `--node-config-path`.
    pub settings: NodeSettings,
    /// Gate `SharedSMUtilizationWatcher`.
    pub sm_watcher: bool,
    /// Gate `VirtualMemoryTracking`.
    pub vmem_tracking: bool,
    /// `--stuck-grace-period`: a pod with only a `pre-allocated` claim (the device plugin has not allocated
    /// it yet) counts as assigned while its `predicate-time` is at most this old.
    pub stuck_grace_period: std::time::Duration,
    /// Build identity.
    pub build: BuildInfo,
    /// The DRA driver whose slices and claims the DRA collector reads (`manager.nvidia.com`).
    pub dra_driver: String,
}

impl MonitorConfig {
    /// Defaults for `node_name` (domain `nvidia.com`, `/etc/vgpu-manager`, `/sys/fs/cgroup`, gates off).
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            domain: ResourceDomain::default(),
            manager_dir: PathBuf::from("/etc/vgpu-manager"),
            cgroup: CgroupLayout::default(),
            settings: NodeSettings::default(),
            sm_watcher: false,
            vmem_tracking: false,
            stuck_grace_period: std::time::Duration::from_secs(30),
            build: BuildInfo::current(),
            dra_driver: vgpu_core::dra::DRIVER_NAME.to_owned(),
        }
    }
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct PhysicalGpu {
    /// The device.
    pub device: GpuDevice,
    /// `/dev/nvidia<minor>`.
    pub minor: u32,
    /// Total memory, bytes.
    pub total_bytes: u64,
    /// Used memory, bytes.
    pub used_bytes: u64,
    /// Σ of every process's newest sample (`sm + 0.85 × (enc + dec)`), capped at 100.
    pub core_percent: f64,
}

/// One vGPU-capable device's sharing state.
#[derive(Debug, Clone, PartialEq)]
pub struct VgpuDevice {
    /// Host index.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Type name.
    pub type_name: String,
    /// `coresScaling × 100`.
    pub total_cores: f64,
    /// Σ cores of the claims on it.
    pub assigned_cores: u64,
    /// vGPU slots (split count): the most containers that can share it.
    pub peak_shared: u32,
    /// Claims on it now.
    pub current_shared: u32,
    /// Physical memory × memory scaling, bytes.
    pub total_memory: u64,
    /// Physical memory, bytes.
    pub total_physical_memory: u64,
    /// Σ memory of the claims, bytes.
    pub assigned_memory: u64,
    /// Assigned / scaling when scaling > 1, bytes.
    pub assigned_physical_memory: u64,
}

/// One device of one container.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerDevice {
    /// Pod namespace.
    pub pod_namespace: String,
    /// Pod name.
    pub pod_name: String,
    /// Container name.
    pub container_name: String,
    /// Ordinal among the container's active devices.
    pub vdevice_idx: usize,
    /// GPU UUID.
    pub device_uuid: String,
    /// `total_memory` of the slot, bytes.
    pub memory_limit: u64,
    /// `real_memory` of the slot, bytes.
    pub physical_memory_limit: u64,
    /// Physical + virtual (ledger) bytes.
    pub memory_usage: u64,
    /// Physical bytes of the container's processes.
    pub physical_memory_usage: u64,
    /// `memory_usage / memory_limit × 100`, capped at 100.
    pub memory_percent: f64,
    /// Core utilization, capped at 100.
    pub core_percent: f64,
}

/// One MIG device.
#[derive(Debug, Clone, PartialEq)]
pub struct MigDevice {
    /// Parent index.
    pub device_idx: u32,
    /// MIG UUID.
    pub uuid: String,
    /// Parent UUID.
    pub parent_uuid: String,
    /// Compute instance.
    pub ci_id: u32,
    /// GPU instance.
    pub gi_id: u32,
    /// Profile (`3g.40gb`).
    pub profile: String,
    /// Memory, bytes.
    pub total_memory: u64,
    /// Memory in use inside the instance, bytes, when the backend reports it.
    pub used_memory: Option<u64>,
}

/// One MIG device held by one container (kubelet pod-resources).
#[derive(Debug, Clone, PartialEq)]
pub struct MigAllocation {
    /// Parent index.
    pub device_idx: u32,
    /// MIG UUID.
    pub device_uuid: String,
    /// Parent UUID.
    pub parent_uuid: String,
    /// Pod namespace.
    pub pod_namespace: String,
    /// Pod name.
    pub pod_name: String,
    /// Container name.
    pub container_name: String,
}

/// Everything one scrape shows.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Snapshot {
    /// Node name.
    pub node: String,
    /// Build identity.
    pub build: BuildInfo,
    /// Node settings shown by `node_gpu_device_configuration_info`.
    pub split_count: u32,
    /// `deviceCoresScaling`.
    pub cores_scaling: f64,
    /// `deviceMemoryScaling`.
    pub memory_scaling: f64,
    /// `deviceMemoryFactor`.
    pub memory_factor: u32,
    /// Driver versions, when the backend reports them.
    pub driver: Option<DriverVersions>,
    /// Physical GPUs.
    pub physical: Vec<PhysicalGpu>,
    /// Per device sharing state (non-MIG GPUs).
    pub vgpu: Vec<VgpuDevice>,
    /// Per container device.
    pub containers: Vec<ContainerDevice>,
    /// MIG devices.
    pub mig: Vec<MigDevice>,
    /// MIG devices held by containers (only with a pod-resources source, see [`NodeCollector::with_pod_resources`]).
    pub mig_allocations: Vec<MigAllocation>,
    /// `Some(present)` with `SharedSMUtilizationWatcher` on: whether `watcher/sm_util.config` was read.
    pub sm_watcher_file_present: Option<bool>,
}

/// Per GPU: `(pid → used bytes)` and `(pid → newest sample)`.
#[derive(Debug, Default)]
struct GpuProcs {
    memory: HashMap<u32, u64>,
    samples: HashMap<u32, ProcessUtilizationSample>,
}

impl GpuProcs {
    fn add_sample(&mut self, s: ProcessUtilizationSample) {
        let e = self.samples.entry(s.pid).or_insert(s);
        if s.timestamp_us > e.timestamp_us {
            *e = s;
        }
    }
}

/// `sm + 0.85 × (enc + dec)`, each term only when ≤ 100.
fn sample_load(s: &ProcessUtilizationSample) -> f64 {
    let v = |x: u32| if x <= 100 { f64::from(x) } else { 0.0 };
    v(s.sm_percent) + 0.85 * (v(s.encoder_percent) + v(s.decoder_percent))
}

pub(crate) fn percent(num: u64, den: u64) -> f64 {
    if den == 0 { 0.0 } else { (num as f64 * 100.0 / den as f64).min(100.0) }
}

/// Reads the node's facts at scrape time.
pub struct NodeCollector {
    config: MonitorConfig,
    backend: Arc<dyn DeviceBackend>,
    pods: Arc<dyn PodSource>,
    /// `Some` on the DRA path: limits and assignments from ResourceSlices and ResourceClaims.
    dra: Option<Arc<dyn DraSource>>,
    /// The kubelet's pod resources: which container holds which MIG device.
    pod_resources: Option<Arc<dyn PodResourcesSource>>,
    warned: Mutex<HashSet<PathBuf>>,
    /// `vgpu.config` mappings kept between scrapes ([`crate::mapped`]).
    mapped: Mutex<MappedFiles>,
    sm_missing_logged: AtomicBool,
}

impl std::fmt::Debug for NodeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCollector")
            .field("node", &self.config.node_name)
            .field("backend", &self.backend.name())
            .field("pods", &self.pods)
            .field("dra", &self.dra)
            .finish_non_exhaustive()
    }
}

impl NodeCollector {
    /// A collector of the device-plugin path over `backend` and `pods` (pods labelled
    /// `<domain>/metrics-node=<node>`, per-container `vgpu.config`).
    pub fn new(config: MonitorConfig, backend: Arc<dyn DeviceBackend>, pods: Arc<dyn PodSource>) -> Self {
        Self {
            config,
            backend,
            pods,
            dra: None,
            pod_resources: None,
            warned: Mutex::default(),
            mapped: Mutex::default(),
            sm_missing_logged: AtomicBool::new(false),
        }
    }

    /// A collector of the DRA path (`--enable-dra-monitor`): `pods` are the pods bound to the node, limits
    /// and assigned totals come from `dra`'s ResourceSlices and ResourceClaims of
    /// [`MonitorConfig::dra_driver`] ([`crate::dra`]); the vmem ledger is not read.
    pub fn new_dra(
        config: MonitorConfig,
        backend: Arc<dyn DeviceBackend>,
        pods: Arc<dyn PodSource>,
        dra: Arc<dyn DraSource>,
    ) -> Self {
        Self { dra: Some(dra), ..Self::new(config, backend, pods) }
    }

    /// Reports `container_mig_device_allocation_info` from `source` (the kubelet's pod-resources API): MIG
    /// devices of the MIG plugins' resources (`<domain>/mig-<profile>`) and the containers holding them.
    pub fn with_pod_resources(mut self, source: Arc<dyn PodResourcesSource>) -> Self {
        self.pod_resources = Some(source);
        self
    }

    /// The configuration.
    pub fn config(&self) -> &MonitorConfig {
        &self.config
    }

    /// The pod source (for `/readyz`).
    pub fn pods(&self) -> &Arc<dyn PodSource> {
        &self.pods
    }

    fn warn_once(&self, path: &Path, what: &str, err: &dyn std::fmt::Display) {
        let mut warned = self.warned.lock().unwrap_or_else(PoisonError::into_inner);
        if warned.len() > 4096 {
            warned.clear();
        }
        if warned.insert(path.to_path_buf()) {
            tracing::warn!(file = %path.display(), %err, "{what} skipped");
        }
    }

    /// Gathers one [`Snapshot`] (blocking file and backend I/O: call it off the async runtime).
    pub fn gather(&self) -> Snapshot {
        let cfg = &self.config;
        let s = &cfg.settings;
        let mut snap = Snapshot {
            node: cfg.node_name.clone(),
            build: cfg.build.clone(),
            split_count: s.device_split_count,
            cores_scaling: s.device_cores_scaling,
            memory_scaling: s.device_memory_scaling,
            memory_factor: s.device_memory_factor,
            ..Snapshot::default()
        };
        snap.driver = self.backend.driver_versions().unwrap_or_else(|err| {
            tracing::debug!(%err, "driver versions unavailable");
            None
        });
        let devices = match self.backend.devices() {
            Ok(d) => d,
            Err(err) => {
                tracing::warn!(%err, "listing GPUs failed; the page has no GPU series");
                Vec::new()
            }
        };
        let procs = self.gpu_processes(&devices, &mut snap);
        for d in &devices {
            let mem = self.backend.memory_usage(d.index).unwrap_or_else(|err| {
                tracing::debug!(gpu = d.index, %err, "memory usage unavailable");
                Default::default()
            });
            let load = procs
                .get(&d.index)
                .map_or(0.0, |p| p.samples.values().map(sample_load).fold(0.0, |a, b| a + b));
            snap.physical.push(PhysicalGpu {
                device: d.clone(),
                minor: self.backend.minor_number(d.index).unwrap_or(d.index),
                total_bytes: mem.total_bytes,
                used_bytes: mem.used_bytes,
                core_percent: load.min(100.0),
            });
            if d.mig_enabled
                && let Ok(layout) = self.backend.mig_layout(d.index)
                && layout.mode == MigMode::Enabled
            {
                for m in layout.instances {
                    snap.mig.push(MigDevice {
                        device_idx: d.index,
                        uuid: m.uuid,
                        parent_uuid: d.uuid.clone(),
                        ci_id: m.compute_instance_id,
                        gi_id: m.gpu_instance_id,
                        profile: m.profile.to_string(),
                        total_memory: m.memory_mib << 20,
                        used_memory: m.memory_used_bytes,
                    });
                }
            }
        }
        if let Some(source) = &self.pod_resources
            && !snap.mig.is_empty()
        {
            let pods = source.pod_resources();
            for m in &snap.mig {
                let resource = cfg.domain.mig_resource(&m.profile);
                for (namespace, pod, container) in mig_holders(&pods, &resource, &m.uuid) {
                    snap.mig_allocations.push(MigAllocation {
                        device_idx: m.device_idx,
                        device_uuid: m.uuid.clone(),
                        parent_uuid: m.parent_uuid.clone(),
                        pod_namespace: namespace.to_owned(),
                        pod_name: pod.to_owned(),
                        container_name: container.to_owned(),
                    });
                }
            }
        }
        match &self.dra {
            Some(dra) => self.dra_containers(dra.as_ref(), &devices, &procs, &mut snap),
            None => self.containers(&devices, &procs, &mut snap),
        }
        snap
    }

    /// Processes per GPU index: from `sm_util.config` with the gate (when readable), else the backend.
    fn gpu_processes(&self, devices: &[GpuDevice], snap: &mut Snapshot) -> HashMap<u32, GpuProcs> {
        let mut out: HashMap<u32, GpuProcs> = HashMap::new();
        if self.config.sm_watcher {
            let path = self.config.manager_dir.join(sm_util::DIR_NAME).join(sm_util::FILE_NAME);
            match sm_util::read(&path) {
                Ok(util) => {
                    if self.sm_missing_logged.swap(false, Ordering::Relaxed) {
                        tracing::info!(file = %path.display(), "SM watcher file present again");
                    }
                    snap.sm_watcher_file_present = Some(true);
                    for d in devices {
                        let Some(slot) = util.devices.get(d.index as usize) else { continue };
                        let p = out.entry(d.index).or_default();
                        for i in slot.compute.iter().chain(&slot.graphics) {
                            *p.memory.entry(i.pid).or_default() += i.used_memory_bytes.unwrap_or(0);
                        }
                        for s in &slot.samples {
                            p.add_sample(*s);
                        }
                    }
                    return out;
                }
                Err(err) => {
                    snap.sm_watcher_file_present = Some(false);
                    if !self.sm_missing_logged.swap(true, Ordering::Relaxed) {
                        tracing::warn!(file = %path.display(), %err,
                            "SharedSMUtilizationWatcher is on but the SM watcher file cannot be read; sampling the backend directly");
                    }
                }
            }
        }
        for d in devices {
            let p = out.entry(d.index).or_default();
            match self.backend.processes(d.index) {
                Ok(list) => {
                    for proc_ in list {
                        *p.memory.entry(proc_.pid).or_default() += proc_.used_memory_bytes.unwrap_or(0);
                    }
                }
                Err(err) => tracing::debug!(gpu = d.index, %err, "process list unavailable"),
            }
            match self.backend.process_utilization(d.index, 0) {
                Ok(samples) => samples.into_iter().for_each(|s| p.add_sample(s)),
                Err(err) => tracing::debug!(gpu = d.index, %err, "process samples unavailable"),
            }
        }
        out
    }

    fn containers(&self, devices: &[GpuDevice], procs: &HashMap<u32, GpuProcs>, snap: &mut Snapshot) {
        let cfg = &self.config;
        let scaling = cfg.settings.device_memory_scaling;
        let mut assigned: HashMap<u32, (u64, u64, u32)> = HashMap::new(); // cores, MiB, containers
        for pod in self.pods.pods() {
            let now_ns = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
            let Some(claim) = pod_claim_at(&pod, &cfg.domain, now_ns, cfg.stuck_grace_period) else {
                continue;
            };
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            if matches!(phase, Some("Succeeded" | "Failed")) {
                continue;
            }
            let roles = roles(&pod);
            let footprint = PodFootprint::from_claim_with_roles(&claim, |n| {
                roles.get(n).copied().unwrap_or(ContainerRole::App)
            });
            for (index, u) in footprint.devices() {
                let e = assigned.entry(index).or_default();
                e.0 += u.cores;
                e.1 += u.memory_mib;
                e.2 += u.number;
            }
            self.pod_containers(&pod, &claim, &roles, procs, snap);
        }
        // Unmap the files of containers that are gone.
        self.mapped.lock().unwrap_or_else(PoisonError::into_inner).retain_read();
        for d in devices.iter().filter(|d| !d.mig_enabled) {
            let physical =
                snap.physical.iter().find(|p| p.device.index == d.index).map_or(0, |p| p.total_bytes);
            let (cores, mib, number) = assigned.get(&d.index).copied().unwrap_or_default();
            let assigned_memory = mib.saturating_mul(1 << 20);
            snap.vgpu.push(VgpuDevice {
                index: d.index,
                uuid: d.uuid.clone(),
                type_name: d.type_name.clone(),
                total_cores: cfg.settings.device_cores_scaling * 100.0,
                assigned_cores: cores,
                peak_shared: cfg.settings.device_split_count,
                current_shared: number,
                total_memory: (physical as f64 * scaling.max(0.0)) as u64,
                total_physical_memory: physical,
                assigned_memory,
                assigned_physical_memory: if scaling > 1.0 {
                    (assigned_memory as f64 / scaling) as u64
                } else {
                    assigned_memory
                },
            });
        }
    }

    fn pod_containers(
        &self,
        pod: &Pod,
        claim: &PodDeviceClaim,
        roles: &HashMap<String, ContainerRole>,
        procs: &HashMap<u32, GpuProcs>,
        snap: &mut Snapshot,
    ) {
        let cfg = &self.config;
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let status = pod.status.as_ref();
        let qos = QosClass::parse(status.and_then(|s| s.qos_class.as_deref()));
        let statuses: Vec<&ContainerStatus> = status
            .into_iter()
            .flat_map(|s| {
                s.container_statuses.iter().flatten().chain(s.init_container_statuses.iter().flatten())
            })
            .collect();
        for c in &claim.containers {
            if c.devices.is_empty() {
                continue;
            }
            let st = statuses.iter().find(|s| s.name == c.name);
            let running = st.is_some_and(|s| s.state.as_ref().is_some_and(|x| x.running.is_some()));
            match roles.get(&c.name) {
                Some(ContainerRole::App | ContainerRole::Sidecar) => {}
                Some(ContainerRole::SequentialInit) if running => {}
                _ => continue,
            }
            let dir = cfg.manager_dir.join(format!("{uid}_{}", c.name));
            let path = dir.join("config").join(vgpu_config::FILE_NAME);
            let read = self.mapped.lock().unwrap_or_else(PoisonError::into_inner).vgpu_config(&path);
            let config = match read {
                Ok(v) => v,
                Err(err) => {
                    if path.exists() {
                        self.warn_once(&path, "vgpu.config", &err);
                    }
                    continue;
                }
            };
            let pids: HashSet<u32> = st
                .and_then(|s| s.container_id.as_deref())
                .map(|id| cfg.cgroup.container_pids(uid, qos, container_id(id)))
                .unwrap_or_default()
                .into_iter()
                .collect();
            let active: Vec<usize> = config
                .devices
                .iter()
                .enumerate()
                .filter(|(_, d)| d.activate == 1 && !d.uuid.is_empty())
                .map(|(i, _)| i)
                .collect();
            let vmem = if cfg.vmem_tracking && config.vmem_node == 1 {
                let p = dir.join(vmem_node::DIR_NAME).join(vmem_node::FILE_NAME);
                let read = self.mapped.lock().unwrap_or_else(PoisonError::into_inner).vmem_slots(&p, &active);
                match read {
                    Ok(v) => Some(v),
                    Err(err) => {
                        if p.exists() {
                            self.warn_once(&p, "vmem_node.config", &err);
                        }
                        None
                    }
                }
            } else {
                None
            };
            for (vdevice_idx, &slot) in active.iter().enumerate() {
                let Some(d) = config.devices.get(slot) else { continue };
                let gpu = procs.get(&(slot as u32));
                let physical: u64 = gpu.map_or(0, |g| pids.iter().filter_map(|p| g.memory.get(p)).sum());
                let load = gpu.map_or(0.0, |g| {
                    pids.iter().filter_map(|p| g.samples.get(p)).map(sample_load).fold(0.0, |a, b| a + b)
                });
                let virtual_bytes = vmem.as_ref().map_or(0, |v| v.used_by(slot, |_| true));
                let usage = physical.saturating_add(virtual_bytes);
                snap.containers.push(ContainerDevice {
                    pod_namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                    pod_name: pod.metadata.name.clone().unwrap_or_default(),
                    container_name: c.name.clone(),
                    vdevice_idx,
                    device_uuid: d.uuid.clone(),
                    memory_limit: d.total_memory,
                    physical_memory_limit: d.real_memory,
                    memory_usage: usage,
                    physical_memory_usage: physical,
                    memory_percent: percent(usage, d.total_memory),
                    core_percent: load.min(100.0),
                });
            }
        }
    }

    /// The DRA path's containers and per-device totals ([`crate::dra`] module table).
    fn dra_containers(
        &self,
        dra: &dyn DraSource,
        devices: &[GpuDevice],
        procs: &HashMap<u32, GpuProcs>,
        snap: &mut Snapshot,
    ) {
        let cfg = &self.config;
        let slices = dra.slices();
        let node_devices =
            NodeDevices::from_slices(slices.iter().map(AsRef::as_ref), &cfg.dra_driver, &cfg.node_name);
        if let Some(first) = node_devices.iter().find(|d| d.kind == vgpu_core::dra::DeviceType::Vgpu.as_str())
        {
            snap.cores_scaling = first.core_ratio as f64 / 100.0;
            snap.memory_scaling = first.memory_ratio as f64 / 100.0;
        }
        let claims = ClaimIndex::new(dra.claims());
        let index_of =
            |uuid: &str| devices.iter().find(|d| d.uuid.eq_ignore_ascii_case(uuid)).map(|d| d.index);
        // GPU index → (assigned cores, assigned MiB, peak containers, running containers).
        let mut assigned: HashMap<u32, (u64, u64, u32, u32)> = HashMap::new();
        for pod in self.pods.pods() {
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            if matches!(phase, Some("Succeeded" | "Failed")) {
                continue;
            }
            let mut allocs = resolve_pod(&pod, &claims, &cfg.dra_driver, &cfg.node_name, &node_devices);
            // An exclusive whole GPU publishes no memory capacity: its limit is the GPU's memory.
            for r in allocs.iter_mut().flat_map(|a| a.results.iter_mut()) {
                if node_devices.get(&r.device).is_some_and(|d| d.memory_bytes.is_none())
                    && let Some(p) =
                        snap.physical.iter().find(|p| p.device.uuid.eq_ignore_ascii_case(&r.uuid))
                {
                    r.memory_bytes = p.total_bytes;
                }
            }
            if allocs.iter().all(|a| a.results.is_empty()) {
                continue;
            }
            let roles = roles(&pod);
            let claim = PodDeviceClaim {
                containers: allocs
                    .iter()
                    .map(|a| ContainerDeviceClaim {
                        name: a.name.clone(),
                        devices: a
                            .results
                            .iter()
                            .filter_map(|r| {
                                Some(DeviceClaim {
                                    index: index_of(&r.uuid)?,
                                    uuid: r.uuid.clone(),
                                    cores: r.cores,
                                    memory_mib: r.memory_bytes / (1 << 20),
                                })
                            })
                            .collect(),
                    })
                    .collect(),
            };
            let footprint = PodFootprint::from_claim_with_roles(&claim, |n| {
                roles.get(n).copied().unwrap_or(ContainerRole::App)
            });
            for (index, u) in footprint.devices() {
                let e = assigned.entry(index).or_default();
                e.0 += u.cores;
                e.1 += u.memory_mib;
                e.2 += u.number;
            }
            let running = running_containers(&pod);
            for c in claim.containers.iter().filter(|c| running.contains(c.name.as_str())) {
                let gpus: HashSet<u32> = c.devices.iter().map(|d| d.index).collect();
                for g in gpus {
                    assigned.entry(g).or_default().3 += 1;
                }
            }
            self.dra_pod_containers(&pod, &allocs, &roles, &running, &node_devices, &index_of, procs, snap);
        }
        for d in devices.iter().filter(|d| !d.mig_enabled) {
            let Some(sd) = node_devices.by_uuid(&d.uuid) else { continue };
            let physical =
                snap.physical.iter().find(|p| p.device.index == d.index).map_or(0, |p| p.total_bytes);
            let (cores, mib, peak, current) = assigned.get(&d.index).copied().unwrap_or_default();
            let assigned_memory = mib.saturating_mul(1 << 20);
            snap.vgpu.push(VgpuDevice {
                index: d.index,
                uuid: d.uuid.clone(),
                type_name: d.type_name.clone(),
                total_cores: sd.cores.unwrap_or(100) as f64,
                assigned_cores: cores,
                peak_shared: peak,
                current_shared: current,
                total_memory: sd.memory_bytes.unwrap_or(physical),
                total_physical_memory: physical,
                assigned_memory,
                assigned_physical_memory: sd.physical(assigned_memory),
            });
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn dra_pod_containers(
        &self,
        pod: &Pod,
        allocs: &[ContainerAlloc],
        roles: &HashMap<String, ContainerRole>,
        running: &HashSet<&str>,
        node_devices: &NodeDevices,
        index_of: &dyn Fn(&str) -> Option<u32>,
        procs: &HashMap<u32, GpuProcs>,
        snap: &mut Snapshot,
    ) {
        let cfg = &self.config;
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let status = pod.status.as_ref();
        let qos = QosClass::parse(status.and_then(|s| s.qos_class.as_deref()));
        for a in allocs.iter().filter(|a| !a.results.is_empty()) {
            match roles.get(&a.name) {
                Some(ContainerRole::App | ContainerRole::Sidecar) => {}
                Some(ContainerRole::SequentialInit) if running.contains(a.name.as_str()) => {}
                _ => continue,
            }
            let pids: HashSet<u32> = status
                .into_iter()
                .flat_map(|s| {
                    s.container_statuses.iter().flatten().chain(s.init_container_statuses.iter().flatten())
                })
                .find(|s| s.name == a.name)
                .and_then(|s| s.container_id.as_deref())
                .map(|id| cfg.cgroup.container_pids(uid, qos, container_id(id)))
                .unwrap_or_default()
                .into_iter()
                .collect();
            let mut results: Vec<(u32, &crate::dra::ContainerResult)> =
                a.results.iter().filter_map(|r| Some((index_of(&r.uuid)?, r))).collect();
            results.sort_by(|(ia, a), (ib, b)| {
                (ia, &a.request, &a.share_id, &a.claim_uid).cmp(&(ib, &b.request, &b.share_id, &b.claim_uid))
            });
            for (vdevice_idx, (index, r)) in results.into_iter().enumerate() {
                let gpu = procs.get(&index);
                let physical: u64 = gpu.map_or(0, |g| pids.iter().filter_map(|p| g.memory.get(p)).sum());
                let load = gpu.map_or(0.0, |g| {
                    pids.iter().filter_map(|p| g.samples.get(p)).map(sample_load).fold(0.0, |a, b| a + b)
                });
                let physical_limit =
                    node_devices.get(&r.device).map_or(r.memory_bytes, |d| d.physical(r.memory_bytes));
                snap.containers.push(ContainerDevice {
                    pod_namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                    pod_name: pod.metadata.name.clone().unwrap_or_default(),
                    container_name: a.name.clone(),
                    vdevice_idx,
                    device_uuid: devices_uuid(snap, index).unwrap_or_else(|| r.uuid.clone()),
                    memory_limit: r.memory_bytes,
                    physical_memory_limit: physical_limit,
                    // No vmem ledger on DRA (contract §8): usage is the physical usage.
                    memory_usage: physical,
                    physical_memory_usage: physical,
                    memory_percent: percent(physical, r.memory_bytes),
                    core_percent: load.min(100.0),
                });
            }
        }
    }
}

/// The backend's spelling of GPU `index`'s UUID (the slice's `uuid` attribute is lower-case).
fn devices_uuid(snap: &Snapshot, index: u32) -> Option<String> {
    snap.physical.iter().find(|p| p.device.index == index).map(|p| p.device.uuid.clone())
}

/// Names of the pod's containers (app and init) whose state is running.
fn running_containers(pod: &Pod) -> HashSet<&str> {
    pod.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten().chain(s.init_container_statuses.iter().flatten()))
        .filter(|s| s.state.as_ref().is_some_and(|x| x.running.is_some()))
        .map(|s| s.name.as_str())
        .collect()
}

/// The pod's claim: `real-allocated`, else `pre-allocated`; `None` when neither decodes.
pub fn pod_claim(pod: &Pod, domain: &ResourceDomain) -> Option<PodDeviceClaim> {
    pod_claim_at(pod, domain, 0, std::time::Duration::MAX)
}

/// [`pod_claim`], but a `pre-allocated`-only claim counts only while the pod's `predicate-time` (Unix ns)
/// is within `grace` of `now_ns` (a pod stuck between Filter and Allocate stops counting after it).
pub fn pod_claim_at(
    pod: &Pod,
    domain: &ResourceDomain,
    now_ns: i64,
    grace: std::time::Duration,
) -> Option<PodDeviceClaim> {
    let ann = pod.metadata.annotations.as_ref()?;
    if let Some(v) = ann.get(&domain.real_allocated())
        && let Ok(c) = pod_devices::decode_real_allocated(v)
        && !c.is_empty()
    {
        return Some(c);
    }
    if grace != std::time::Duration::MAX {
        let at: i64 = ann.get(&domain.predicate_time()).and_then(|v| v.trim().parse().ok())?;
        let grace_ns = i64::try_from(grace.as_nanos()).unwrap_or(i64::MAX);
        if at <= 0 || now_ns.saturating_sub(at) > grace_ns {
            return None;
        }
    }
    ann.get(&domain.pre_allocated()).and_then(|v| pod_devices::decode_pre_allocated(v).ok())
}

/// Each container's role: app, sidecar (init with `restartPolicy: Always`) or sequential init.
pub fn roles(pod: &Pod) -> HashMap<String, ContainerRole> {
    let mut out = HashMap::new();
    if let Some(spec) = &pod.spec {
        for c in spec.init_containers.iter().flatten() {
            let role = if c.restart_policy.as_deref() == Some("Always") {
                ContainerRole::Sidecar
            } else {
                ContainerRole::SequentialInit
            };
            out.insert(c.name.clone(), role);
        }
        for c in &spec.containers {
            out.insert(c.name.clone(), ContainerRole::App);
        }
    }
    out
}

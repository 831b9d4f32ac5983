//! The vnumber plugin (`<domain>/vgpu-number` on `nvidia-vgpu.sock`, contract §5.2): `<uuid>::<i>` devices,
//! preferred allocation from the scheduler's `pre-allocated` claim, `Allocate` (find the admitted pod,
//! check the claim, build envs and mounts, write the per-container files, patch the pod) and
//! `PreStartContainer`.

use std::{
    collections::{HashMap, HashSet},
    path::Path,
    sync::Arc,
};

use vgpu_core::{
    abi::{
        devices_json, runtime_files,
        vgpu_config::{self, BuildOptions, ContainerIdentity, VgpuConfig},
    },
    codec::pod_devices,
    model::{AssignedPhase, ComputePolicy, ContainerDeviceClaim, GpuDevice, PodDeviceClaim},
    node_config::DeviceListStrategy,
};
use vgpu_gates::CoreGate;

use crate::{
    cdi,
    cluster::{ClusterClient, PHASE_FAILED, PHASE_SUCCEEDED, PodInfo, PodPatch},
    config::PluginConfig,
    error::PluginError,
    ids,
    inventory::DeviceState,
    locate::{self, LocatedContainer, PodKey},
    plugin::{PluginHandler, default_preferred_allocation, health_text, topology},
};
use vgpu_kubelet::api::v1beta1::{
    AllocateRequest, AllocateResponse, CdiDevice, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, Device, DevicePluginOptions, DeviceSpec, Mount,
    PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse,
};

/// `MANAGER_VISIBLE_DEVICES` placeholder of an unused slot.
pub const EMPTY_UUID: &str = "GPU-00000000-0000-0000-0000-000000000000";
/// `predicate-time` after success or failure.
pub const PREDICATE_TIME_DONE: &str = "9223372036854775807";
/// Container path of the per-container config directory.
pub const CONTAINER_CONFIG_DIR: &str = "/etc/vgpu-manager/config";
/// Container-side root of NVIDIA's volume-mounts device list (the vendor adapter names the one in use).
pub const VOLUME_MOUNTS_ROOT: &str = vgpu_core::backend::vendor::NVIDIA_VOLUME_MOUNTS_ROOT;
/// CDI kind of the NVIDIA GPUs the device plugin hands out (the vendor adapter names the one in use).
pub const CDI_KIND: &str = cdi::GPU_KIND;
/// The env var listing the IMEX channels under the `envvar` strategy.
pub const NVIDIA_IMEX_CHANNELS: &str = "NVIDIA_IMEX_CHANNELS";

/// NVIDIA's control device nodes, passed to every vGPU container when present (contract §5.2); the
/// vendor adapter names the ones in use.
pub const CONTROL_DEVICES: [&str; 4] = vgpu_core::backend::vendor::NVIDIA_CONTROL_DEVICES;

fn device_spec(config: &PluginConfig, path: String) -> DeviceSpec {
    DeviceSpec {
        host_path: config.host_driver_root.join(path.trim_start_matches('/')).display().to_string(),
        container_path: path,
        permissions: "rw".to_owned(),
    }
}

/// The `DeviceSpecs` (rw) of a container: each claimed GPU's device nodes from the vendor adapter
/// ([`PluginConfig::gpu_device_nodes`]: NVIDIA `/dev/nvidia<minor>` with the minor from
/// `config.device_minors`, else the index; MetaX its `/dev/dri` nodes), then the vendor's control nodes
/// present under `config.device_root` (`--container-driver-root`). Host paths are under
/// `config.host_driver_root` (`--host-driver-root`); container paths are the plain `/dev/...` paths.
pub fn device_specs(config: &PluginConfig, gpu_indices: &[u32]) -> Vec<DeviceSpec> {
    let mut specs: Vec<DeviceSpec> = gpu_indices
        .iter()
        .flat_map(|i| config.gpu_device_nodes(*i))
        .map(|path| device_spec(config, path))
        .collect();
    specs.extend(config.present_control_nodes().into_iter().map(|path| device_spec(config, path)));
    specs
}

/// The IMEX channels' share of a container response (`config.imex_channels`, empty unless the vendor is
/// NVIDIA and channels are configured), as the upstream NVIDIA device plugin adds it:
/// `NVIDIA_IMEX_CHANNELS=<ids>` with `envvar`; `/dev/null` mounted at `<volume-mounts root>/imex/<id>`
/// with `volume-mounts`; the CDI devices `k8s.device-plugin.nvidia.com/imex-channel=<id>` after the GPUs'
/// (`cdi_names`); the device nodes `/dev/nvidia-caps-imex-channels/channel<id>` when device nodes are
/// passed (`device_nodes`).
pub fn add_imex_channels(
    config: &PluginConfig,
    envs: &mut HashMap<String, String>,
    mounts: &mut Vec<Mount>,
    cdi_names: &mut Vec<String>,
    device_nodes: Option<&mut Vec<DeviceSpec>>,
) {
    let channels = &config.imex_channels;
    if channels.is_empty() {
        return;
    }
    let strategies = &config.settings.device_list_strategy;
    if strategies.contains(&DeviceListStrategy::Envvar) {
        let ids: Vec<String> = channels.iter().map(u32::to_string).collect();
        envs.insert(NVIDIA_IMEX_CHANNELS.to_owned(), ids.join(","));
    }
    if strategies.contains(&DeviceListStrategy::VolumeMounts)
        && let Some(root) = config.vendor.volume_mounts_root()
    {
        for id in channels {
            mounts.push(mount(&format!("{root}/imex/{id}"), Path::new("/dev/null"), true));
        }
    }
    cdi_names.extend(channels.iter().map(|id| cdi::imex_channel_device(*id)));
    if let Some(nodes) = device_nodes {
        nodes.extend(channels.iter().map(|id| device_spec(config, crate::config::imex_channel_node(*id))));
    }
}

/// `1`, `true` or `enabled`, case-insensitive.
pub fn is_truthy(value: &str) -> bool {
    ["1", "true", "enabled"].iter().any(|t| value.trim().eq_ignore_ascii_case(t))
}

/// The vnumber plugin.
pub struct VgpuNumberPlugin {
    config: Arc<PluginConfig>,
    resource_name: String,
    state: DeviceState,
    cluster: Option<Arc<dyn ClusterClient>>,
    allocating: tokio::sync::Mutex<()>,
}

impl VgpuNumberPlugin {
    /// Without a cluster client `Allocate` and the pre-allocated preference fail / fall back.
    pub fn new(
        config: Arc<PluginConfig>,
        state: DeviceState,
        cluster: Option<Arc<dyn ClusterClient>>,
    ) -> Self {
        let resource_name = config.domain.vgpu_number();
        Self { config, resource_name, state, cluster, allocating: tokio::sync::Mutex::new(()) }
    }

    fn cluster(&self) -> Result<&Arc<dyn ClusterClient>, String> {
        self.cluster.as_ref().ok_or_else(|| "no cluster client configured".to_owned())
    }

    /// This node's pods labelled `assigned-phase=allocating`, the only ones [`current_pod`](Self::current_pod)
    /// can pick: the API server filters them (a node's other pods are never sent, decoded or copied).
    async fn allocating_pods(&self) -> Result<Vec<PodInfo>, String> {
        self.cluster()?
            .list_node_pods_labelled(
                &self.config.node_name,
                &self.config.domain.assigned_phase(),
                AssignedPhase::Allocating.as_str(),
            )
            .await
            .map_err(|e| e.to_string())
    }

    /// The pod being admitted on this node: label `assigned-phase=allocating`, not Succeeded/Failed, not
    /// deleting, with `pre-allocated`, `predicate-node == spec.nodeName` and `predicate-time` in
    /// `(0, MaxInt64)`; the oldest `predicate-time` wins (ties by namespace/name).
    pub fn current_pod(&self, pods: Vec<PodInfo>) -> Option<PodInfo> {
        let d = &self.config.domain;
        let (phase_key, pre_key, node_key, time_key) =
            (d.assigned_phase(), d.pre_allocated(), d.predicate_node(), d.predicate_time());
        pods.into_iter()
            .filter(|p| {
                p.labels.get(&phase_key).map(String::as_str) == Some(AssignedPhase::Allocating.as_str())
            })
            .filter(|p| p.phase != PHASE_SUCCEEDED && p.phase != PHASE_FAILED && !p.deleting)
            .filter(|p| p.annotations.get(&pre_key).is_some_and(|v| !v.is_empty()))
            .filter(|p| p.annotations.get(&node_key) == Some(&p.node_name))
            .filter_map(|p| {
                let t = p.annotations.get(&time_key)?.trim().parse::<i64>().ok()?;
                (t > 0 && t < i64::MAX).then_some((t, p))
            })
            .min_by(|(ta, a), (tb, b)| {
                ta.cmp(tb).then_with(|| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)))
            })
            .map(|(_, p)| p)
    }

    fn claims_of(&self, pod: &PodInfo) -> Result<(PodDeviceClaim, PodDeviceClaim), String> {
        let get = |key: String| pod.annotations.get(&key).cloned().unwrap_or_default();
        let pre = pod_devices::decode_pre_allocated(&get(self.config.domain.pre_allocated()))
            .map_err(|e| e.to_string())?;
        let real_text = get(self.config.domain.real_allocated());
        let real = if real_text.trim().is_empty() {
            PodDeviceClaim::default()
        } else {
            pod_devices::decode_real_allocated(&real_text).map_err(|e| e.to_string())?
        };
        Ok((pre, real))
    }

    async fn preferred(
        &self,
        request: &PreferredAllocationRequest,
    ) -> Result<PreferredAllocationResponse, String> {
        let pods = self.allocating_pods().await?;
        let pod = self.current_pod(pods).ok_or("no pod is being allocated")?;
        let (pre, real) = self.claims_of(&pod)?;
        let mut used = HashSet::new();
        let mut container_responses = Vec::new();
        for (cursor, req) in (real.containers.len()..).zip(&request.container_requests) {
            let claim = pre.containers.get(cursor).ok_or("no pre-allocated container left")?;
            if usize::try_from(req.allocation_size).ok() != Some(claim.devices.len()) {
                return Err("allocation size does not match the pre-allocated claim".to_owned());
            }
            let mut picked = Vec::new();
            for device in &claim.devices {
                let id = req
                    .available_device_i_ds
                    .iter()
                    .find(|id| ids::gpu_uuid_of(id) == Some(device.uuid.as_str()) && !used.contains(*id))
                    .ok_or_else(|| format!("no available device on {}", device.uuid))?;
                used.insert(id.clone());
                picked.push(id.clone());
            }
            container_responses.push(ContainerPreferredAllocationResponse { device_i_ds: picked });
        }
        Ok(PreferredAllocationResponse { container_responses })
    }

    async fn try_allocate(
        &self,
        pod: &PodInfo,
        request: &AllocateRequest,
    ) -> Result<(AllocateResponse, PodDeviceClaim, bool), String> {
        let (pre, mut real) = self.claims_of(pod)?;
        let gpus = self.state.devices();
        let mut responses = Vec::new();
        for req in &request.container_requests {
            let cursor = real.containers.len();
            let claim = pre.containers.get(cursor).ok_or_else(|| {
                format!("pod {}/{} has no pre-allocated container left", pod.namespace, pod.name)
            })?;
            if req.devices_ids.len() != claim.devices.len() {
                return Err(format!(
                    "requested number of devices does not match: container {} requested {}, pre-allocated {}",
                    claim.name,
                    req.devices_ids.len(),
                    claim.devices.len()
                ));
            }
            let mut devices = claim.devices.clone();
            devices.sort_by_key(|d| d.index);
            for d in &devices {
                if !gpus.iter().any(|g| g.uuid == d.uuid) {
                    return Err(format!(
                        "device {} does not exist on node {}",
                        d.uuid, self.config.node_name
                    ));
                }
            }
            let claim = ContainerDeviceClaim { name: claim.name.clone(), devices };
            responses.push(self.container_response(pod, &claim, &req.devices_ids, &gpus)?);
            real.containers.push(claim);
        }
        let done = real.containers.len() >= pre.containers.len();
        Ok((AllocateResponse { container_responses: responses }, real, done))
    }

    fn compute_policy(&self, pod: &PodInfo) -> ComputePolicy {
        pod.annotations
            .get(&self.config.domain.vgpu_compute_policy())
            .and_then(|v| v.parse().ok())
            .unwrap_or_default()
    }

    fn container_response(
        &self,
        pod: &PodInfo,
        claim: &ContainerDeviceClaim,
        device_ids: &[String],
        gpus: &[GpuDevice],
    ) -> Result<ContainerAllocateResponse, String> {
        let cfg = &self.config;
        let gates = &cfg.gates;
        let settings = &cfg.settings;
        let policy = self.compute_policy(pod);
        let env_of = pod.containers.iter().find(|c| c.name == claim.name).map(|c| &c.env);
        let env_flag = |key: &str| env_of.and_then(|e| e.get(key)).is_some_and(|v| is_truthy(v));
        // The host files the response mounts must exist, or the runtime creates directories in their place.
        runtime_files::check(&cfg.manager_dir, &cfg.library_version, !env_flag("DISABLE_VGPU_CONTROL"))
            .map_err(|e| e.to_string())?;

        let mut envs = HashMap::new();
        let mut set = |k: &str, v: String| {
            envs.insert(k.to_owned(), v);
        };
        set("VGPU_POD_NAME", pod.name.clone());
        set("VGPU_POD_NAMESPACE", pod.namespace.clone());
        set("VGPU_POD_UID", pod.uid.clone());
        set("VGPU_CONTAINER_NAME", claim.name.clone());
        set("CUDA_MEM_RATIO", format!("{:.2}", settings.device_memory_scaling));
        set("EXTERNAL_SM_WATCHER_ENABLED", gates.enabled(CoreGate::SharedSMUtilizationWatcher).to_string());
        set("CUDA_CORE_LIMIT", String::new());
        set("CUDA_CORE_SOFT_LIMIT", String::new());
        set("MANAGER_CLIENT_REGISTER_UUID", String::new());
        set("MANAGER_COMPATIBILITY_MODE", cfg.compatibility_mode().to_string());
        set("CUDA_SM_SHARED_BUCKET", "true".to_owned());
        set("VMEMORY_NODE_ENABLED", gates.enabled(CoreGate::VirtualMemoryTracking).to_string());
        let mut visible = vec![EMPTY_UUID.to_owned(); vgpu_config::MAX_DEVICE_COUNT];
        for d in &claim.devices {
            let (hard, soft) = policy.core_limits(d.cores);
            set(&format!("CUDA_MEM_LIMIT_{}", d.index), format!("{}m", d.memory_mib));
            set(&format!("CUDA_CORE_LIMIT_{}", d.index), hard);
            set(&format!("CUDA_CORE_SOFT_LIMIT_{}", d.index), soft);
            if let Some(slot) = usize::try_from(d.index).ok().and_then(|i| visible.get_mut(i)) {
                slot.clone_from(&d.uuid);
            }
        }
        set("MANAGER_VISIBLE_DEVICES", visible.join(","));
        for (key, value) in cfg.vendor.feature_env(settings) {
            set(key, value);
        }

        let uuids: Vec<&str> = claim.devices.iter().map(|d| d.uuid.as_str()).collect();
        let mut mounts = Vec::new();
        let mut cdi_devices = Vec::new();
        let strategies = &settings.device_list_strategy;
        let all_cdi = !strategies.is_empty()
            && strategies
                .iter()
                .all(|s| matches!(s, DeviceListStrategy::CdiAnnotations | DeviceListStrategy::CdiCri));
        let mut device_nodes = if all_cdi {
            Vec::new()
        } else {
            device_specs(cfg, &claim.devices.iter().map(|d| d.index).collect::<Vec<_>>())
        };
        let vendor = &cfg.vendor;
        if strategies.contains(&DeviceListStrategy::Envvar)
            && let Some(env) = vendor.visible_devices_env()
        {
            set(env, uuids.join(","));
        }
        if strategies.contains(&DeviceListStrategy::VolumeMounts)
            && let (Some(env), Some(root)) = (vendor.visible_devices_env(), vendor.volume_mounts_root())
        {
            set(env, root.to_owned());
            for uuid in &uuids {
                mounts.push(mount(&format!("{root}/{uuid}"), Path::new("/dev/null"), true));
            }
        }
        let mut qualified: Vec<String> = uuids.iter().map(|u| vendor.cdi_device(u)).collect();
        add_imex_channels(
            cfg,
            &mut envs,
            &mut mounts,
            &mut qualified,
            (!all_cdi).then_some(&mut device_nodes),
        );
        if strategies.contains(&DeviceListStrategy::CdiCri) {
            cdi_devices = qualified.iter().map(|name| CdiDevice { name: name.clone() }).collect();
        }
        let mut annotations = HashMap::new();
        if strategies.contains(&DeviceListStrategy::CdiAnnotations) {
            // One key per pod: the annotations of a response apply to its container only.
            let (key, value) =
                cdi::annotation(&cfg.cdi_annotation_prefix, cdi::VGPU_PLUGIN_NAME, &pod.uid, &qualified)
                    .map_err(|e| e.to_string())?;
            annotations.insert(key, value);
        }

        let host = &cfg.host_manager_dir;
        let dir_name = format!("{}_{}", pod.uid, claim.name);
        let host_dir = host.join(&dir_name);
        if gates.enabled(CoreGate::DevicePluginClientMode) {
            mounts.push(mount("/etc/vgpu-manager/registry", &host.join("registry"), true));
        } else {
            mounts.push(mount("/etc/vgpu-manager/.host_proc", Path::new("/proc"), true));
        }
        if gates.enabled(CoreGate::SharedSMUtilizationWatcher) {
            mounts.push(mount("/etc/vgpu-manager/watcher", &host.join("watcher"), true));
        }
        mounts.push(mount(
            runtime_files::CONTAINER_LIBRARY,
            &host.join(runtime_files::library_file_name(&cfg.library_version)),
            true,
        ));
        mounts.push(mount(CONTAINER_CONFIG_DIR, &host_dir.join("config"), true));
        mounts.push(mount("/tmp/.vgpu_lock", &host_dir.join("vgpu_lock"), false));
        mounts.push(mount("/tmp/.vmem_node", &host_dir.join("vmem_node"), false));
        mounts.push(mount("/tmp/.sm_node", &host_dir.join("sm_node"), false));
        if !env_flag("DISABLE_VGPU_CONTROL") {
            mounts.push(mount("/etc/ld.so.preload", &host.join(runtime_files::PRELOAD_FILE), true));
        }

        // Side effects: the per-container tree, devices.json and a fresh vgpu.config.
        let local_dir = cfg.manager_dir.join(&dir_name);
        for sub in ["", "vgpu_lock", "vmem_node", "sm_node", "config"] {
            make_dir(&local_dir.join(sub))?;
        }
        devices_json::write(&local_dir.join(devices_json::FILE_NAME), device_ids)
            .map_err(|e| e.to_string())?;
        let config_path = local_dir.join("config").join(vgpu_config::FILE_NAME);
        remove_if_present(&config_path)?;
        self.write_vgpu_config(&config_path, pod, claim, gpus)?;

        Ok(ContainerAllocateResponse { envs, mounts, devices: device_nodes, annotations, cdi_devices })
    }

    /// Builds the container's `vgpu.config` (contract §7.1) and writes it atomically to `path`.
    fn write_vgpu_config(
        &self,
        path: &Path,
        pod: &PodInfo,
        claim: &ContainerDeviceClaim,
        gpus: &[GpuDevice],
    ) -> Result<(), String> {
        let cfg = &self.config;
        let env_of = pod.containers.iter().find(|c| c.name == claim.name).map(|c| &c.env);
        let env_flag = |key: &str| env_of.and_then(|e| e.get(key)).is_some_and(|v| is_truthy(v));
        let identity = ContainerIdentity {
            pod_uid: pod.uid.clone(),
            pod_name: pod.name.clone(),
            pod_namespace: pod.namespace.clone(),
            container_name: claim.name.clone(),
            register_uuid: String::new(),
        };
        let options = BuildOptions {
            memory_scaling: cfg.settings.device_memory_scaling,
            compute_policy: self.compute_policy(pod),
            memory_oversold: env_flag("CUDA_MEM_OVERSOLD"),
            compatibility_mode: cfg.compatibility_mode(),
            sm_watcher: cfg.gates.enabled(CoreGate::SharedSMUtilizationWatcher),
            vmem_node: cfg.gates.enabled(CoreGate::VirtualMemoryTracking),
            cuda_version: cfg.cuda_version,
            driver_version: cfg.driver_version.clone(),
        };
        let config =
            VgpuConfig::build(&identity, &options, &claim.devices, gpus).map_err(|e| e.to_string())?;
        vgpu_config::write(path, &config).map_err(|e| e.to_string())
    }

    /// The container `PreStartContainer` is called for: the kubelet's device checkpoint first (a local file
    /// the kubelet writes when `Allocate` answered, before it starts the container; it names the pod's UID),
    /// then pod-resources `List` (which names the pod by namespace and name).
    async fn locate(&self, ids: &[String]) -> Result<LocatedContainer, String> {
        let cfg = &self.config;
        let mut tried = Vec::new();
        match locate::read_checkpoint(&cfg.kubelet_checkpoint()) {
            Ok(entries) => match locate::find_in_checkpoint(&entries, &self.resource_name, ids) {
                Some(found) => return Ok(found),
                None => tried.push(format!(
                    "{} has no {} entry holding exactly these devices",
                    cfg.kubelet_checkpoint().display(),
                    self.resource_name
                )),
            },
            Err(err) => tried.push(err.to_string()),
        }
        match vgpu_kubelet::podresources::list_pod_resources(
            &cfg.pod_resources_socket,
            cfg.pod_resources_timeout,
        )
        .await
        {
            Ok(list) => match locate::find_in_pod_resources(&list, &self.resource_name, ids) {
                Some(found) => return Ok(found),
                None => tried.push(format!(
                    "pod-resources on {} lists no container holding exactly these devices",
                    cfg.pod_resources_socket.display()
                )),
            },
            Err(err) => tried.push(err.to_string()),
        }
        Err(format!("no container was allocated devices {ids:?}: {}", tried.join("; ")))
    }

    async fn node_pods(&self) -> Result<Vec<PodInfo>, String> {
        self.cluster()?.list_node_pods(&self.config.node_name).await.map_err(|e| e.to_string())
    }

    async fn pre_start(&self, ids: &[String]) -> Result<(), String> {
        let found = self.locate(ids).await?;
        // The pod's UID: the checkpoint names it; a pod-resources match (namespace/name) needs this node's pods,
        // read live. The kubelet waits for this answer before it starts the container, so the list is read
        // only when needed (here, or below to rebuild a missing vgpu.config).
        let (uid, mut pod) = match &found.pod {
            PodKey::Uid(uid) => (uid.clone(), None),
            PodKey::Name { namespace, name } => {
                let pods = self
                    .node_pods()
                    .await
                    .map_err(|err| format!("pod {namespace}/{name}: cannot resolve its UID: {err}"))?;
                let pod =
                    pods.into_iter().find(|p| &p.namespace == namespace && &p.name == name).ok_or_else(
                        || format!("pod {namespace}/{name} is not on node {}", self.config.node_name),
                    )?;
                (pod.uid.clone(), Some(pod))
            }
        };
        let dir = self.config.manager_dir.join(format!("{uid}_{}", found.container));

        // Consistency: what Allocate recorded for this container is what the kubelet starts it with.
        let recorded = devices_json::read(&dir.join(devices_json::FILE_NAME)).map_err(|e| {
            format!("container {} of pod {uid} has no allocation record: {e}", found.container)
        })?;
        if recorded.iter().collect::<HashSet<_>>() != ids.iter().collect::<HashSet<_>>() {
            return Err(format!(
                "inconsistent allocation results of container equipment: container {} of pod {uid} was \
                 allocated {recorded:?}, kubelet starts it with {ids:?}",
                found.container
            ));
        }

        let config = dir.join("config").join(vgpu_config::FILE_NAME);
        if !config.exists() {
            if pod.is_none() {
                pod = self.node_pods().await.ok().and_then(|pods| pods.into_iter().find(|p| p.uid == uid));
            }
            let pod = pod.ok_or_else(|| {
                format!("{} is missing and pod {uid} cannot be read to rebuild it", config.display())
            })?;
            let (_, real) = self.claims_of(&pod)?;
            let claim = real.containers.iter().find(|c| c.name == found.container).ok_or_else(|| {
                format!(
                    "{} is missing and pod {uid} has no real-allocated claim for container {}",
                    config.display(),
                    found.container
                )
            })?;
            make_dir(&dir.join("config"))?;
            self.write_vgpu_config(&config, &pod, claim, &self.state.devices())?;
        }
        let meta = std::fs::metadata(&config).map_err(|e| format!("{}: {e}", config.display()))?;
        if self.config.gates.enabled(CoreGate::AllocationFailureReschedule)
            && meta.len() != vgpu_config::FILE_SIZE as u64
        {
            return Err(format!(
                "{}: size {} is not {}",
                config.display(),
                meta.len(),
                vgpu_config::FILE_SIZE
            ));
        }
        for stale in ["config/pids.config", "vmem_node/vmem_node.config", "sm_node/sm_node.config"] {
            remove_if_present(&dir.join(stale))?;
        }

        // Best effort, after the answer: directories of pods that are gone. Only with a successful pod list:
        // never delete on a guess.
        if let Ok(cluster) = self.cluster() {
            let (cluster, node) = (Arc::clone(cluster), self.config.node_name.clone());
            let (manager_dir, grace) = (self.config.manager_dir.clone(), self.config.stale_dir_grace);
            tokio::spawn(async move {
                let Ok(pods) = cluster.list_node_pods(&node).await else { return };
                let mut live: HashSet<String> = pods.into_iter().map(|p| p.uid).collect();
                live.insert(uid);
                for removed in locate::remove_stale_dirs(
                    &manager_dir,
                    &locate::LivePods::Uids(live),
                    grace,
                    std::time::SystemTime::now(),
                ) {
                    tracing::info!(dir = %removed.display(), "removed the files of a pod that no longer exists");
                }
            });
        }
        Ok(())
    }

    /// Patches `pod`, and only it: not another pod that took its name since it was read.
    async fn patch(&self, pod: &PodInfo, patch: PodPatch) -> Result<(), String> {
        let patch = patch.with_uid(&pod.uid);
        self.cluster()?.patch_pod(&pod.namespace, &pod.name, &patch).await.map_err(|e| e.to_string())
    }

    fn success_patch(&self, real: &PodDeviceClaim, done: bool) -> Result<PodPatch, String> {
        let d = &self.config.domain;
        let mut patch = PodPatch::default();
        let real_text = pod_devices::encode(real).map_err(|e| e.to_string())?;
        patch.annotations.insert(d.real_allocated(), Some(real_text));
        let phase = if done { "succeed" } else { "allocating" };
        patch.labels.insert(d.assigned_phase(), Some(phase.to_owned()));
        patch.labels.insert(d.metrics_node(), Some(self.config.node_name.clone()));
        if done {
            patch.annotations.insert(d.predicate_time(), Some(PREDICATE_TIME_DONE.to_owned()));
        }
        Ok(patch)
    }

    fn failed_patch(&self) -> PodPatch {
        let d = &self.config.domain;
        let mut patch = PodPatch::default();
        patch.labels.insert(d.assigned_phase(), Some("failed".to_owned()));
        patch.labels.insert(d.metrics_node(), None);
        patch.annotations.insert(d.predicate_time(), Some(PREDICATE_TIME_DONE.to_owned()));
        patch
    }
}

fn mount(container: &str, host: &Path, read_only: bool) -> Mount {
    Mount { container_path: container.to_owned(), host_path: host.display().to_string(), read_only }
}

/// Creates a per-container directory with mode 0777 (the container's processes, of any user, write it),
/// refusing a symbolic link planted at `path` rather than widening its target's mode.
fn make_dir(path: &Path) -> Result<(), String> {
    vgpu_core::abi::perms::create_dir_all_mode(path, 0o777).map_err(|e| e.to_string())
}

fn remove_if_present(path: &Path) -> Result<(), String> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("{}: remove: {e}", path.display())),
    }
}

#[tonic::async_trait]
impl PluginHandler for VgpuNumberPlugin {
    fn name(&self) -> &'static str {
        "vnumber-plugin"
    }

    fn socket_name(&self) -> &str {
        crate::VGPU_SOCKET
    }

    fn resource_name(&self) -> &str {
        &self.resource_name
    }

    fn options(&self) -> DevicePluginOptions {
        DevicePluginOptions {
            pre_start_required: true,
            get_preferred_allocation_available: self
                .config
                .gates
                .enabled(CoreGate::HonorPreAllocatedDeviceIDs),
        }
    }

    fn devices(&self, gpus: &[GpuDevice]) -> Vec<Device> {
        let mut out = Vec::new();
        for gpu in gpus.iter().filter(|g| !g.mig_enabled) {
            let health = health_text(gpu);
            let topology = topology(gpu);
            for i in 0..gpu.split_count {
                out.push(Device {
                    id: ids::vgpu_device_id(&gpu.uuid, i),
                    health: health.clone(),
                    topology: topology.clone(),
                });
            }
        }
        out
    }

    /// With gate `HonorPreAllocatedDeviceIDs`: the IDs of the scheduler's pre-allocated GPUs for the next
    /// containers; any failure (or the gate off) gives the default preference.
    async fn preferred_allocation(
        &self,
        request: PreferredAllocationRequest,
    ) -> Result<PreferredAllocationResponse, PluginError> {
        if self.config.gates.enabled(CoreGate::HonorPreAllocatedDeviceIDs) {
            match self.preferred(&request).await {
                Ok(resp) => return Ok(resp),
                Err(err) => tracing::info!(%err, "pre-allocated preference unavailable; using the default"),
            }
        }
        Ok(default_preferred_allocation(&request))
    }

    async fn allocate(&self, request: AllocateRequest) -> Result<AllocateResponse, PluginError> {
        let _serial = self.allocating.lock().await;
        let pods = self.allocating_pods().await.map_err(PluginError::Allocate)?;
        let pod = self.current_pod(pods).ok_or_else(|| {
            PluginError::Allocate(format!("no pod in allocating phase on node {}", self.config.node_name))
        })?;
        let result = self.try_allocate(&pod, &request).await;
        let outcome = match result {
            Ok((response, real, done)) => match self.success_patch(&real, done) {
                Ok(patch) => self.patch(&pod, patch).await.map(|()| response),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        match outcome {
            Ok(response) => Ok(response),
            Err(err) => {
                if let Err(patch_err) = self.patch(&pod, self.failed_patch()).await {
                    tracing::error!(%patch_err, pod = %pod.name, "could not mark the pod failed");
                }
                Err(PluginError::Allocate(err))
            }
        }
    }

    /// Finds the container (the kubelet checkpoint, then pod-resources `List`), checks that its
    /// `devices.json` holds exactly the IDs the kubelet passes, rebuilds a missing `vgpu.config` from the
    /// pod's `real-allocated` claim, checks its size (exactly 8192 bytes with gate
    /// `AllocationFailureReschedule`), deletes `config/pids.config`, `vmem_node/vmem_node.config` and
    /// `sm_node/sm_node.config` so the library starts clean, and then, after answering, removes the
    /// directories of pods that are gone (a pod LIST off the kubelet's critical path).
    async fn pre_start_container(
        &self,
        request: PreStartContainerRequest,
    ) -> Result<PreStartContainerResponse, PluginError> {
        self.pre_start(&request.devices_ids).await.map_err(PluginError::PreStart)?;
        Ok(PreStartContainerResponse {})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::InMemoryCluster;
    use std::collections::BTreeMap;

    fn pod(name: &str, time: &str) -> PodInfo {
        let labels = BTreeMap::from([("nvidia.com/assigned-phase".to_owned(), "allocating".to_owned())]);
        let annotations = BTreeMap::from([
            ("nvidia.com/pre-allocated".to_owned(), "main[0_GPU-a_10_10]".to_owned()),
            ("nvidia.com/predicate-node".to_owned(), "n1".to_owned()),
            ("nvidia.com/predicate-time".to_owned(), time.to_owned()),
        ]);
        PodInfo { name: name.into(), node_name: "n1".into(), labels, annotations, ..PodInfo::default() }
    }

    #[test]
    fn current_pod_is_the_oldest_eligible_one() {
        let config = Arc::new(PluginConfig::new("n1"));
        let state = DeviceState::new(Vec::new(), &config.settings);
        let plugin = VgpuNumberPlugin::new(config, state, Some(Arc::new(InMemoryCluster::default())));
        let mut deleting = pod("deleting", "1");
        deleting.deleting = true;
        let mut failed = pod("failed", "2");
        failed.phase = PHASE_FAILED.into();
        let mut elsewhere = pod("elsewhere", "3");
        elsewhere.annotations.insert("nvidia.com/predicate-node".into(), "n2".into());
        let mut filtering = pod("filtering", "4");
        filtering.labels.insert("nvidia.com/assigned-phase".into(), "filtering".into());
        let pods = vec![
            deleting,
            failed,
            elsewhere,
            filtering,
            pod("done", PREDICATE_TIME_DONE),
            pod("zero", "0"),
            pod("junk", "x"),
            pod("b", "20"),
            pod("a", "10"),
        ];
        assert_eq!(plugin.current_pod(pods).unwrap().name, "a");
        assert!(plugin.current_pod(vec![pod("done", PREDICATE_TIME_DONE)]).is_none());
    }

    /// A pod deleted and re-created under the same name after the plugin read it (a StatefulSet's) keeps its
    /// labels: the plugin's patches carry the UID it read.
    #[tokio::test]
    async fn patches_land_only_on_the_pod_that_was_read() {
        let cluster = Arc::new(InMemoryCluster::default());
        let mut recreated = pod("web", "10");
        recreated.uid = "uid-new".into();
        cluster.upsert(recreated.clone());
        let config = Arc::new(PluginConfig::new("n1"));
        let state = DeviceState::new(Vec::new(), &config.settings);
        let plugin = VgpuNumberPlugin::new(config, state, Some(cluster.clone()));
        let mut read = recreated.clone();
        read.uid = "uid-old".into();
        let err = plugin.patch(&read, plugin.failed_patch()).await.unwrap_err();
        assert!(err.contains("metadata.uid") && err.contains("uid-old"), "{err}");
        assert_eq!(cluster.pod("", "web").unwrap(), recreated, "untouched");
        plugin.patch(&recreated, plugin.failed_patch()).await.unwrap();
        assert_eq!(cluster.pod("", "web").unwrap().labels["nvidia.com/assigned-phase"], "failed");
    }

    #[test]
    fn truthy_values() {
        assert!(is_truthy(" Enabled") && is_truthy("1") && !is_truthy("yes"));
    }

    #[test]
    fn device_specs_per_gpu_minor_and_present_control_nodes() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("dev")).unwrap();
        for f in ["nvidiactl", "nvidia-uvm"] {
            std::fs::write(root.path().join("dev").join(f), b"").unwrap();
        }
        let mut config = PluginConfig::new("n1");
        config.device_root = root.path().to_path_buf();
        config.device_minors = BTreeMap::from([(1, 7)]);
        let specs = device_specs(&config, &[0, 1]);
        let paths: Vec<_> = specs.iter().map(|s| (s.container_path.as_str(), s.host_path.as_str())).collect();
        assert_eq!(
            paths,
            [
                ("/dev/nvidia0", "/dev/nvidia0"),
                ("/dev/nvidia7", "/dev/nvidia7"),
                ("/dev/nvidiactl", "/dev/nvidiactl"),
                ("/dev/nvidia-uvm", "/dev/nvidia-uvm"),
            ]
        );
        assert!(specs.iter().all(|s| s.permissions == "rw"));
        config.host_driver_root = "/run/nvidia/driver".into();
        let specs = device_specs(&config, &[0]);
        assert_eq!(specs[0].host_path, "/run/nvidia/driver/dev/nvidia0");
        assert_eq!(specs[0].container_path, "/dev/nvidia0");
        assert_eq!(specs[1].host_path, "/run/nvidia/driver/dev/nvidiactl");
    }
}

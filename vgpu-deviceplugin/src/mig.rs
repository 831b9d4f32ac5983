//! The MIG plugins (contract §5.4, `--mig-strategy single|mixed`): one plugin per distinct MIG profile on the
//! node, resource `<domain>/mig-<profile>` (`+` → `.`) on socket `nvidia-mig-<profile>.sock`; devices are the
//! MIG instances (ID = MIG UUID, health of the parent GPU, topology = the parent's NUMA node). `Allocate`
//! hands out only the devices — device-list strategy, CDI names, device nodes — and no vGPU environment; no
//! PreStart, no preferred allocation.
//!
//! `single` requires a uniform node: every GPU MIG-enabled, all instances of one profile
//! ([`mig_devices`] refuses anything else); the vnumber plugin is then not served. `mixed` serves one plugin
//! per profile next to the vnumber plugin (which skips MIG-enabled GPUs). `none` serves no MIG plugin.
//!
//! Device nodes of a MIG instance: the parent's `/dev/nvidia<minor>`, and the capability nodes
//! `/dev/nvidia-caps/nvidia-cap<N>` of its GPU instance and compute instance, whose minor `N` is the
//! `DeviceFileMinor:` line of `/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<g>/access` and
//! `.../gi<g>/ci<c>/access` (read under the container driver root; absent files add no node), then the
//! control nodes present, then the IMEX channels' nodes (as the vnumber plugin adds them). MIG is NVIDIA's:
//! the vendor adapter still names the visible-devices env, the `volume-mounts` root and the CDI kind.

use std::{collections::BTreeMap, collections::HashMap, path::Path, sync::Arc};

use vgpu_core::{
    backend::{DeviceBackend, MigMode},
    model::GpuDevice,
    node_config::{DeviceListStrategy, MigStrategy},
};

use crate::{
    cdi,
    config::{MigDevice, PluginConfig},
    error::{PluginError, ServerError},
    plugin::{PluginHandler, default_preferred_allocation, health_text, topology},
    vnumber::add_imex_channels,
};
use vgpu_kubelet::api::v1beta1::{
    AllocateRequest, AllocateResponse, CdiDevice, ContainerAllocateResponse, Device, DevicePluginOptions,
    DeviceSpec, Mount, PreferredAllocationRequest, PreferredAllocationResponse,
};

/// The MIG instances to serve under `strategy` (empty for `none`), in GPU then instance order. `single`
/// fails unless every GPU is MIG-enabled and all instances share one profile.
pub fn mig_devices(
    backend: &dyn DeviceBackend,
    strategy: MigStrategy,
) -> Result<Vec<MigDevice>, ServerError> {
    if strategy == MigStrategy::None {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    let mut without_mig = Vec::new();
    for gpu in backend.devices()? {
        let layout = backend.mig_layout(gpu.index)?;
        if layout.mode != MigMode::Enabled {
            without_mig.push(gpu.uuid.clone());
            continue;
        }
        for inst in layout.instances {
            out.push(MigDevice {
                parent_index: gpu.index,
                uuid: inst.uuid,
                profile: inst.profile.to_string(),
                gpu_instance_id: inst.gpu_instance_id,
                compute_instance_id: inst.compute_instance_id,
            });
        }
    }
    if strategy == MigStrategy::Single {
        if !without_mig.is_empty() {
            return Err(ServerError::Config(format!(
                "migStrategy single needs MIG enabled on every GPU; not enabled on {}",
                without_mig.join(", ")
            )));
        }
        let profiles: std::collections::BTreeSet<&str> = out.iter().map(|d| d.profile.as_str()).collect();
        if profiles.len() > 1 {
            return Err(ServerError::Config(format!(
                "migStrategy single needs one MIG profile on the node, found {}",
                profiles.into_iter().collect::<Vec<_>>().join(", ")
            )));
        }
    }
    Ok(out)
}

/// One plugin per profile of `devices`, in profile order.
pub fn mig_plugins(config: &Arc<PluginConfig>, devices: &[MigDevice]) -> Vec<MigPlugin> {
    let mut by_profile: BTreeMap<&str, Vec<MigDevice>> = BTreeMap::new();
    for d in devices {
        by_profile.entry(d.profile.as_str()).or_default().push(d.clone());
    }
    by_profile
        .into_iter()
        .map(|(profile, devices)| MigPlugin::new(Arc::clone(config), profile, devices))
        .collect()
}

/// The plugin of one MIG profile.
#[derive(Debug)]
pub struct MigPlugin {
    config: Arc<PluginConfig>,
    socket_name: String,
    resource_name: String,
    devices: Vec<MigDevice>,
}

impl MigPlugin {
    /// `profile` names the socket and the resource; `devices` are its instances.
    pub fn new(config: Arc<PluginConfig>, profile: &str, devices: Vec<MigDevice>) -> Self {
        Self {
            socket_name: format!("nvidia-mig-{profile}.sock"),
            resource_name: config.domain.mig_resource(profile),
            config,
            devices,
        }
    }

    fn container_response(&self, ids: &[String]) -> Result<ContainerAllocateResponse, String> {
        let mut picked = Vec::with_capacity(ids.len());
        for id in ids {
            let d = self
                .devices
                .iter()
                .find(|d| &d.uuid == id)
                .ok_or_else(|| format!("unknown {} device {id:?}", self.resource_name))?;
            picked.push(d);
        }
        let uuids: Vec<&str> = picked.iter().map(|d| d.uuid.as_str()).collect();
        whole_device_response(&self.config, &uuids, cdi::MIG_PLUGIN_NAME, || {
            mig_device_specs(&self.config, &picked)
        })
    }
}

/// The container response of a plugin handing out whole units (MIG instances, [`crate::whole_gpu`]'s
/// GPUs) whose UUIDs are `uuids`: the device-list strategies (`envvar`, `volume-mounts`, `cdi-cri`,
/// `cdi-annotations`, the annotation keyed by `plugin_name` and the first UUID), the units' device nodes
/// from `device_specs` (not with CDI strategies only), the IMEX channels and the vendor's feature env. No
/// vGPU environment and no limiter mounts.
pub fn whole_device_response(
    cfg: &PluginConfig,
    uuids: &[&str],
    plugin_name: &str,
    device_specs: impl FnOnce() -> Vec<DeviceSpec>,
) -> Result<ContainerAllocateResponse, String> {
    let strategies = &cfg.settings.device_list_strategy;
    let all_cdi = !strategies.is_empty()
        && strategies
            .iter()
            .all(|s| matches!(s, DeviceListStrategy::CdiAnnotations | DeviceListStrategy::CdiCri));
    let mut envs = HashMap::new();
    let mut mounts = Vec::new();
    let mut annotations = HashMap::new();
    let mut cdi_devices = Vec::new();
    let vendor = &cfg.vendor;
    if strategies.contains(&DeviceListStrategy::Envvar)
        && let Some(env) = vendor.visible_devices_env()
    {
        envs.insert(env.to_owned(), uuids.join(","));
    }
    if strategies.contains(&DeviceListStrategy::VolumeMounts)
        && let (Some(env), Some(root)) = (vendor.visible_devices_env(), vendor.volume_mounts_root())
    {
        envs.insert(env.to_owned(), root.to_owned());
        for uuid in uuids {
            mounts.push(Mount {
                container_path: format!("{root}/{uuid}"),
                host_path: "/dev/null".to_owned(),
                read_only: true,
            });
        }
    }
    let mut devices = if all_cdi { Vec::new() } else { device_specs() };
    let mut qualified: Vec<String> = uuids.iter().map(|u| vendor.cdi_device(u)).collect();
    add_imex_channels(cfg, &mut envs, &mut mounts, &mut qualified, (!all_cdi).then_some(&mut devices));
    if strategies.contains(&DeviceListStrategy::CdiCri) {
        cdi_devices = qualified.iter().map(|name| CdiDevice { name: name.clone() }).collect();
    }
    if strategies.contains(&DeviceListStrategy::CdiAnnotations)
        && let Some(first) = uuids.first()
    {
        // No pod is known here: the first unit's UUID names the key.
        let (key, value) = cdi::annotation(&cfg.cdi_annotation_prefix, plugin_name, first, &qualified)
            .map_err(|e| e.to_string())?;
        annotations.insert(key, value);
    }
    for (key, value) in vendor.feature_env(&cfg.settings) {
        envs.insert(key.to_owned(), value);
    }
    Ok(ContainerAllocateResponse { envs, mounts, devices, annotations, cdi_devices })
}

/// The `DeviceFileMinor:` of a capability `access` file, `None` when absent or unreadable.
fn cap_minor(file: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|l| l.trim().strip_prefix("DeviceFileMinor:")).and_then(|v| v.trim().parse().ok())
}

/// Device nodes of MIG instances (see the module docs), each once.
pub fn mig_device_specs(config: &PluginConfig, devices: &[&MigDevice]) -> Vec<DeviceSpec> {
    let mut paths: Vec<String> = Vec::new();
    let mut push = |p: String| {
        if !paths.contains(&p) {
            paths.push(p);
        }
    };
    for d in devices {
        let minor = config.device_minors.get(&d.parent_index).copied().unwrap_or(d.parent_index);
        push(format!("/dev/nvidia{minor}"));
        let caps = config
            .device_root
            .join(format!("proc/driver/nvidia/capabilities/gpu{minor}/mig/gi{}", d.gpu_instance_id));
        for file in [caps.join("access"), caps.join(format!("ci{}", d.compute_instance_id)).join("access")] {
            if let Some(n) = cap_minor(&file) {
                push(format!("/dev/nvidia-caps/nvidia-cap{n}"));
            }
        }
    }
    for path in config.present_control_nodes() {
        push(path);
    }
    paths
        .into_iter()
        .map(|path| DeviceSpec {
            host_path: config.host_driver_root.join(path.trim_start_matches('/')).display().to_string(),
            container_path: path,
            permissions: "rw".to_owned(),
        })
        .collect()
}

#[tonic::async_trait]
impl PluginHandler for MigPlugin {
    fn name(&self) -> &'static str {
        "mig-plugin"
    }

    fn socket_name(&self) -> &str {
        &self.socket_name
    }

    fn resource_name(&self) -> &str {
        &self.resource_name
    }

    fn options(&self) -> DevicePluginOptions {
        DevicePluginOptions::default()
    }

    /// The instances whose parent GPU is in `gpus`, with the parent's health and NUMA node.
    fn devices(&self, gpus: &[GpuDevice]) -> Vec<Device> {
        self.devices
            .iter()
            .filter_map(|d| {
                let parent = gpus.iter().find(|g| g.index == d.parent_index)?;
                Some(Device { id: d.uuid.clone(), health: health_text(parent), topology: topology(parent) })
            })
            .collect()
    }

    async fn preferred_allocation(
        &self,
        request: PreferredAllocationRequest,
    ) -> Result<PreferredAllocationResponse, PluginError> {
        Ok(default_preferred_allocation(&request))
    }

    async fn allocate(&self, request: AllocateRequest) -> Result<AllocateResponse, PluginError> {
        let container_responses = request
            .container_requests
            .iter()
            .map(|req| self.container_response(&req.devices_ids))
            .collect::<Result<_, _>>()
            .map_err(PluginError::Allocate)?;
        Ok(AllocateResponse { container_responses })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_core::backend::mock::MockBackend;

    const MIXED: &str = "
gpus:
  - uuid: GPU-a
    name: A100
    memoryMiB: 81920
    minor: 4
    mig:
      mode: Enabled
      instances:
        - { uuid: MIG-1, profile: 3g.40gb, gpuInstanceId: 1, computeInstanceId: 0, placementStart: 0, placementSize: 4, memoryMiB: 40320 }
        - { uuid: MIG-2, profile: 1g.10gb, gpuInstanceId: 9, computeInstanceId: 0, placementStart: 4, placementSize: 1, memoryMiB: 9856 }
  - { uuid: GPU-b, name: A100, memoryMiB: 81920, mig: { mode: Disabled } }
";

    #[test]
    fn strategies_select_instances() {
        let backend = MockBackend::from_yaml_str(MIXED).unwrap();
        assert!(mig_devices(&backend, MigStrategy::None).unwrap().is_empty());
        let mixed = mig_devices(&backend, MigStrategy::Mixed).unwrap();
        assert_eq!(mixed.iter().map(|d| d.uuid.as_str()).collect::<Vec<_>>(), ["MIG-1", "MIG-2"]);
        let err = mig_devices(&backend, MigStrategy::Single).unwrap_err().to_string();
        assert!(err.contains("not enabled on GPU-b"), "{err}");
        let config = Arc::new(PluginConfig::new("n"));
        let plugins = mig_plugins(&config, &mixed);
        let names: Vec<(&str, &str)> = plugins.iter().map(|p| (p.socket_name(), p.resource_name())).collect();
        assert_eq!(
            names,
            [
                ("nvidia-mig-1g.10gb.sock", "nvidia.com/mig-1g.10gb"),
                ("nvidia-mig-3g.40gb.sock", "nvidia.com/mig-3g.40gb")
            ]
        );
    }

    #[test]
    fn single_needs_one_profile() {
        let text =
            MIXED.replace("  - { uuid: GPU-b, name: A100, memoryMiB: 81920, mig: { mode: Disabled } }\n", "");
        let backend = MockBackend::from_yaml_str(&text).unwrap();
        let err = mig_devices(&backend, MigStrategy::Single).unwrap_err().to_string();
        assert!(err.contains("one MIG profile on the node, found 1g.10gb, 3g.40gb"), "{err}");
    }

    #[test]
    fn device_nodes_from_capability_files() {
        let root = tempfile::tempdir().unwrap();
        let gi = root.path().join("proc/driver/nvidia/capabilities/gpu4/mig/gi1");
        std::fs::create_dir_all(gi.join("ci0")).unwrap();
        std::fs::write(gi.join("access"), "DeviceFileMinor: 12\nDeviceFileMode: 292\n").unwrap();
        std::fs::write(gi.join("ci0/access"), "DeviceFileMinor: 13\n").unwrap();
        let mut config = PluginConfig::new("n");
        config.device_root = root.path().to_path_buf();
        config.device_minors.insert(0, 4);
        let d = MigDevice {
            parent_index: 0,
            uuid: "MIG-1".into(),
            profile: "3g.40gb".into(),
            gpu_instance_id: 1,
            compute_instance_id: 0,
        };
        let specs = mig_device_specs(&config, &[&d, &d]);
        let paths: Vec<&str> = specs.iter().map(|s| s.container_path.as_str()).collect();
        assert_eq!(paths, ["/dev/nvidia4", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"]);
    }
}

//! The whole-GPU plugin (`--whole-gpus`, the GPU module's device-plugin mode): resource `<domain>/gpu` on
//! socket `nvidia-gpu.sock`, one device per GPU not in MIG mode (ID = the GPU's UUID, its health, its NUMA
//! node as topology), placed by kube-scheduler alone: no extender, no annotations, no vGPU limits.
//!
//! It replaces the vGPU-number plugin rather than running beside it: a GPU handed out whole here would also
//! be shared by the extender's `vgpu-number` placements, which do not see this resource.
//!
//! `Allocate` answers what the NVIDIA device plugin answers for a GPU: the device-list strategies over the
//! UUIDs (`NVIDIA_VISIBLE_DEVICES`, volume mounts, CDI), the GPU's device nodes from the vendor adapter
//! ([`crate::vnumber::device_specs`]: NVIDIA `/dev/nvidia<minor>`, MetaX its DRM nodes) and the control
//! nodes present, the IMEX channels ([`crate::mig::whole_device_response`], shared with the MIG plugins).
//! `GetPreferredAllocation` prefers GPUs on one NUMA node, then the kubelet's order.
//!
//! ```
//! use std::sync::Arc;
//! use vgpu_core::backend::{DeviceBackend, mock::MockBackend};
//! use vgpu_deviceplugin::{config::PluginConfig, inventory::DeviceState, plugin::PluginHandler, whole_gpu::WholeGpuPlugin};
//!
//! let backend = MockBackend::from_yaml_str("gpus:\n  - { uuid: GPU-a, name: L4, memoryMiB: 23034 }\n")?;
//! let state = DeviceState::new(backend.devices()?, &Default::default());
//! let plugin = WholeGpuPlugin::new(Arc::new(PluginConfig::new("node-1")), state.clone());
//! assert_eq!((plugin.resource_name(), plugin.socket_name()), ("nvidia.com/gpu", "nvidia-gpu.sock"));
//! assert_eq!(plugin.devices(&state.devices())[0].id, "GPU-a");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::Arc;

use crate::{
    config::PluginConfig,
    error::PluginError,
    inventory::DeviceState,
    mig::whole_device_response,
    plugin::{PluginHandler, default_preferred_allocation, health_text, topology},
    vnumber::device_specs,
};
use vgpu_core::model::GpuDevice;
use vgpu_kubelet::api::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse, Device, DevicePluginOptions,
    PreferredAllocationRequest, PreferredAllocationResponse,
};

/// The plugin's socket, in the device-plugin folder.
pub const SOCKET: &str = "nvidia-gpu.sock";
/// The annotation-key plugin name of its CDI annotations (`cdi-annotations` strategy).
pub const CDI_PLUGIN_NAME: &str = "vgpu-gpu-plugin";

/// The plugin of whole GPUs (see the module docs).
#[derive(Debug)]
pub struct WholeGpuPlugin {
    config: Arc<PluginConfig>,
    state: DeviceState,
    resource_name: String,
}

impl WholeGpuPlugin {
    /// The plugin over the GPUs of `state`.
    pub fn new(config: Arc<PluginConfig>, state: DeviceState) -> Self {
        Self { resource_name: config.domain.gpu(), config, state }
    }

    fn container_response(
        &self,
        gpus: &[GpuDevice],
        ids: &[String],
    ) -> Result<ContainerAllocateResponse, String> {
        let mut picked = Vec::with_capacity(ids.len());
        for id in ids {
            let gpu = gpus
                .iter()
                .find(|g| &g.uuid == id && !g.mig_enabled)
                .ok_or_else(|| format!("unknown {} device {id:?}", self.resource_name))?;
            picked.push(gpu);
        }
        let uuids: Vec<&str> = picked.iter().map(|g| g.uuid.as_str()).collect();
        let indices: Vec<u32> = picked.iter().map(|g| g.index).collect();
        whole_device_response(&self.config, &uuids, CDI_PLUGIN_NAME, || device_specs(&self.config, &indices))
    }
}

#[tonic::async_trait]
impl PluginHandler for WholeGpuPlugin {
    fn name(&self) -> &'static str {
        "gpu-plugin"
    }

    fn socket_name(&self) -> &str {
        SOCKET
    }

    fn resource_name(&self) -> &str {
        &self.resource_name
    }

    fn options(&self) -> DevicePluginOptions {
        DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: true }
    }

    /// One device per GPU not in MIG mode.
    fn devices(&self, gpus: &[GpuDevice]) -> Vec<Device> {
        gpus.iter()
            .filter(|g| !g.mig_enabled)
            .map(|g| Device { id: g.uuid.clone(), health: health_text(g), topology: topology(g) })
            .collect()
    }

    /// For each container: the kubelet's must-include IDs, then the available GPUs of the NUMA node that
    /// holds the most of them (so a multi-GPU container stays on one node when it can), then the rest in the
    /// kubelet's order; never more than asked, never an ID twice.
    async fn preferred_allocation(
        &self,
        request: PreferredAllocationRequest,
    ) -> Result<PreferredAllocationResponse, PluginError> {
        let gpus = self.state.devices();
        let numa = |id: &str| gpus.iter().find(|g| g.uuid == id).and_then(|g| g.numa_node);
        let mut request = request;
        for container in &mut request.container_requests {
            let mut by_node: std::collections::BTreeMap<Option<u32>, usize> = Default::default();
            for id in &container.available_device_i_ds {
                *by_node.entry(numa(id)).or_default() += 1;
            }
            let best = by_node
                .iter()
                .max_by_key(|(node, count)| (**count, std::cmp::Reverse(**node)))
                .map(|(n, _)| *n);
            // Stable: the best node's GPUs first, each group in the kubelet's order.
            container.available_device_i_ds.sort_by_key(|id| Some(numa(id)) != best);
        }
        Ok(default_preferred_allocation(&request))
    }

    async fn allocate(&self, request: AllocateRequest) -> Result<AllocateResponse, PluginError> {
        let gpus = self.state.devices();
        let container_responses = request
            .container_requests
            .iter()
            .map(|req| self.container_response(&gpus, &req.devices_ids))
            .collect::<Result<_, _>>()
            .map_err(PluginError::Allocate)?;
        Ok(AllocateResponse { container_responses })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use vgpu_core::backend::{DeviceBackend, mock::MockBackend};
    use vgpu_kubelet::api::v1beta1::{ContainerAllocateRequest, ContainerPreferredAllocationRequest};

    const GPUS: &str = "
gpus:
  - { uuid: GPU-a, name: A100, memoryMiB: 81920, minor: 3, numaNode: 0 }
  - { uuid: GPU-b, name: A100, memoryMiB: 81920, numaNode: 1, healthy: false }
  - { uuid: GPU-c, name: A100, memoryMiB: 81920, numaNode: 1 }
  - { uuid: GPU-d, name: A100, memoryMiB: 81920, numaNode: 1 }
  - { uuid: GPU-m, name: A100, memoryMiB: 81920, mig: { mode: Enabled } }
";

    fn plugin(root: &std::path::Path) -> WholeGpuPlugin {
        let backend = MockBackend::from_yaml_str(GPUS).unwrap();
        let mut config = PluginConfig::new("n1");
        config.device_root = root.to_path_buf();
        config.host_driver_root = "/run/nvidia/driver".into();
        for gpu in backend.devices().unwrap() {
            config.device_minors.insert(gpu.index, backend.minor_number(gpu.index).unwrap());
        }
        let settings = config.settings.clone();
        WholeGpuPlugin::new(Arc::new(config), DeviceState::new(backend.devices().unwrap(), &settings))
    }

    #[test]
    fn every_gpu_not_in_mig_mode_is_a_device() {
        let dir = tempfile::tempdir().unwrap();
        let plugin = plugin(dir.path());
        let devices = plugin.devices(&plugin.state.devices());
        let ids: Vec<(&str, &str)> = devices.iter().map(|d| (d.id.as_str(), d.health.as_str())).collect();
        assert_eq!(
            ids,
            [("GPU-a", "Healthy"), ("GPU-b", "Unhealthy"), ("GPU-c", "Healthy"), ("GPU-d", "Healthy")]
        );
        assert_eq!(devices[0].topology.as_ref().unwrap().nodes[0].id, 0);
        assert!(!plugin.options().pre_start_required && plugin.options().get_preferred_allocation_available);
    }

    #[tokio::test]
    async fn allocate_hands_out_the_gpus_device_nodes_and_uuids() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("dev")).unwrap();
        std::fs::write(dir.path().join("dev/nvidiactl"), b"").unwrap();
        let plugin = plugin(dir.path());
        let request = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec!["GPU-c".into(), "GPU-a".into()],
            }],
        };
        let response = plugin.allocate(request).await.unwrap();
        let c = &response.container_responses[0];
        assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-c,GPU-a");
        let nodes: Vec<(&str, &str)> =
            c.devices.iter().map(|d| (d.container_path.as_str(), d.host_path.as_str())).collect();
        assert_eq!(
            nodes,
            [
                ("/dev/nvidia2", "/run/nvidia/driver/dev/nvidia2"),
                ("/dev/nvidia3", "/run/nvidia/driver/dev/nvidia3"),
                ("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl")
            ]
        );
        assert!(c.mounts.is_empty(), "no limiter mounts: {:?}", c.mounts);
        assert!(!c.envs.keys().any(|k| k.starts_with("CUDA_")), "no vGPU limits: {:?}", c.envs);

        for bad in ["GPU-x", "GPU-m"] {
            let request = AllocateRequest {
                container_requests: vec![ContainerAllocateRequest { devices_ids: vec![bad.into()] }],
            };
            let err = plugin.allocate(request).await.unwrap_err().to_string();
            assert!(err.contains("unknown nvidia.com/gpu device") && err.contains(bad), "{err}");
        }
    }

    #[tokio::test]
    async fn preference_keeps_a_container_on_one_numa_node() {
        let dir = tempfile::tempdir().unwrap();
        let plugin = plugin(dir.path());
        let ask = |available: &[&str], must: &[&str], size: i32| PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: available.iter().map(|s| (*s).to_owned()).collect(),
                must_include_device_i_ds: must.iter().map(|s| (*s).to_owned()).collect(),
                allocation_size: size,
            }],
        };
        let preferred = |r: PreferredAllocationResponse| r.container_responses[0].device_i_ds.clone();
        let two = plugin.preferred_allocation(ask(&["GPU-a", "GPU-c", "GPU-d"], &[], 2)).await.unwrap();
        assert_eq!(preferred(two), ["GPU-c", "GPU-d"], "node 1 holds two of them");
        let must =
            plugin.preferred_allocation(ask(&["GPU-a", "GPU-c", "GPU-d"], &["GPU-a"], 2)).await.unwrap();
        let must = preferred(must);
        assert_eq!((must.len(), must[0].as_str()), (2, "GPU-a"), "must-include first");
    }
}

//! The internal plugin trait ([`PluginHandler`]) behind the generated tonic `DevicePlugin` trait, and the
//! visibility-only vcore / vmemory plugins (contract §5.3).
//!
//! A handler only says what to advertise and how to answer; [`crate::service::DevicePluginService`]
//! translates gRPC and streams `ListAndWatch`, [`crate::manager::PluginManager`] serves and registers.

use vgpu_core::model::GpuDevice;

use crate::{error::PluginError, ids};
use vgpu_kubelet::api::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse, ContainerPreferredAllocationResponse,
    Device, DevicePluginOptions, HEALTHY, NumaNode, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse, TopologyInfo, UNHEALTHY,
};

/// What one device plugin advertises and how it answers; everything gRPC-specific lives elsewhere.
#[tonic::async_trait]
pub trait PluginHandler: Send + Sync + 'static {
    /// A short name for logs (`vnumber-plugin`).
    fn name(&self) -> &'static str;
    /// The socket file name inside the device-plugin directory.
    fn socket_name(&self) -> &str;
    /// The extended resource, e.g. `nvidia.com/vgpu-number`.
    fn resource_name(&self) -> &str;
    /// `GetDevicePluginOptions` (also sent in `Register`).
    fn options(&self) -> DevicePluginOptions;
    /// The kubelet devices for the current GPU list (sent by `ListAndWatch` on every change).
    fn devices(&self, gpus: &[GpuDevice]) -> Vec<Device>;
    /// `GetPreferredAllocation`.
    async fn preferred_allocation(
        &self,
        request: PreferredAllocationRequest,
    ) -> Result<PreferredAllocationResponse, PluginError>;
    /// `Allocate`.
    async fn allocate(&self, request: AllocateRequest) -> Result<AllocateResponse, PluginError>;
    /// `PreStartContainer`; the kubelet calls it only when [`options`](Self::options) asks for it, so the
    /// default answers with an empty response.
    async fn pre_start_container(
        &self,
        request: PreStartContainerRequest,
    ) -> Result<PreStartContainerResponse, PluginError> {
        let _ = request;
        Ok(PreStartContainerResponse {})
    }
}

/// `Device.health` text.
pub fn health_text(gpu: &GpuDevice) -> String {
    if gpu.health.is_healthy() { HEALTHY } else { UNHEALTHY }.to_owned()
}

/// `TopologyInfo` with the GPU's NUMA node, if known.
pub fn topology(gpu: &GpuDevice) -> Option<TopologyInfo> {
    gpu.numa_node.map(|n| TopologyInfo { nodes: vec![NumaNode { id: i64::from(n) }] })
}

/// The kubelet's default preference: the must-include IDs, then available ones, never an ID twice in one
/// response.
pub fn default_preferred_allocation(request: &PreferredAllocationRequest) -> PreferredAllocationResponse {
    let mut used = std::collections::HashSet::new();
    let container_responses = request
        .container_requests
        .iter()
        .map(|req| {
            let size = usize::try_from(req.allocation_size).unwrap_or(0);
            let mut picked = Vec::with_capacity(size);
            for id in req.must_include_device_i_ds.iter().chain(&req.available_device_i_ds) {
                if picked.len() >= size {
                    break;
                }
                if !picked.contains(id) && used.insert(id.clone()) {
                    picked.push(id.clone());
                }
            }
            ContainerPreferredAllocationResponse { device_i_ds: picked }
        })
        .collect();
    PreferredAllocationResponse { container_responses }
}

/// Which visibility resource a [`ResourcePlugin`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceKind {
    /// `vgpu-cores`: `cores` IDs per GPU.
    Cores,
    /// `vgpu-memory`: `memory / memoryFactor` IDs per GPU.
    Memory,
}

/// The vcore / vmemory plugin: only makes the resources visible (for ResourceQuota). No options,
/// `Allocate` returns one empty response per container, no PreStart.
#[derive(Debug, Clone)]
pub struct ResourcePlugin {
    kind: ResourceKind,
    resource_name: String,
    memory_factor: u32,
}

impl ResourcePlugin {
    /// `<domain>/vgpu-cores` on `nvidia-vgpu-core.sock`.
    pub fn cores(domain: &vgpu_core::domain::ResourceDomain) -> Self {
        Self { kind: ResourceKind::Cores, resource_name: domain.vgpu_cores(), memory_factor: 1 }
    }

    /// `<domain>/vgpu-memory` on `nvidia-vgpu-memory.sock`, one ID per `memory_factor` MiB.
    pub fn memory(domain: &vgpu_core::domain::ResourceDomain, memory_factor: u32) -> Self {
        Self {
            kind: ResourceKind::Memory,
            resource_name: domain.vgpu_memory(),
            memory_factor: memory_factor.max(1),
        }
    }

    /// The kind.
    pub fn kind(&self) -> ResourceKind {
        self.kind
    }
}

#[tonic::async_trait]
impl PluginHandler for ResourcePlugin {
    fn name(&self) -> &'static str {
        match self.kind {
            ResourceKind::Cores => "vcore-plugin",
            ResourceKind::Memory => "vmemory-plugin",
        }
    }

    fn socket_name(&self) -> &str {
        match self.kind {
            ResourceKind::Cores => crate::VGPU_CORE_SOCKET,
            ResourceKind::Memory => crate::VGPU_MEMORY_SOCKET,
        }
    }

    fn resource_name(&self) -> &str {
        &self.resource_name
    }

    fn options(&self) -> DevicePluginOptions {
        DevicePluginOptions::default()
    }

    /// GPUs with an index above 255 cannot be encoded and are left out (with a log line).
    fn devices(&self, gpus: &[GpuDevice]) -> Vec<Device> {
        let mut out = Vec::new();
        for gpu in gpus.iter().filter(|g| !g.mig_enabled) {
            let count = match self.kind {
                ResourceKind::Cores => gpu.cores,
                ResourceKind::Memory => gpu.memory_mib / u64::from(self.memory_factor),
            };
            let health = health_text(gpu);
            for i in 0..count {
                match ids::resource_device_id(i, gpu.index) {
                    Ok(id) => out.push(Device { id, health: health.clone(), topology: None }),
                    Err(err) => {
                        tracing::warn!(plugin = self.name(), %err, "skipping GPU");
                        break;
                    }
                }
            }
        }
        out
    }

    async fn preferred_allocation(
        &self,
        request: PreferredAllocationRequest,
    ) -> Result<PreferredAllocationResponse, PluginError> {
        Ok(default_preferred_allocation(&request))
    }

    async fn allocate(&self, request: AllocateRequest) -> Result<AllocateResponse, PluginError> {
        Ok(AllocateResponse {
            container_responses: vec![ContainerAllocateResponse::default(); request.container_requests.len()],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_kubelet::api::v1beta1::ContainerPreferredAllocationRequest;

    #[test]
    fn default_preference_does_not_reuse_ids() {
        let req = PreferredAllocationRequest {
            container_requests: vec![
                ContainerPreferredAllocationRequest {
                    available_device_i_ds: vec!["a".into(), "b".into(), "c".into()],
                    must_include_device_i_ds: vec!["b".into()],
                    allocation_size: 2,
                },
                ContainerPreferredAllocationRequest {
                    available_device_i_ds: vec!["a".into(), "b".into(), "c".into()],
                    must_include_device_i_ds: vec![],
                    allocation_size: 2,
                },
            ],
        };
        let resp = default_preferred_allocation(&req);
        assert_eq!(resp.container_responses[0].device_i_ds, ["b", "a"]);
        assert_eq!(resp.container_responses[1].device_i_ds, ["c"]);
    }

    #[test]
    fn resource_ids_per_gpu() {
        let domain = vgpu_core::domain::ResourceDomain::default();
        let gpu = GpuDevice { index: 1, cores: 3, memory_mib: 4096, ..GpuDevice::default() };
        let cores = ResourcePlugin::cores(&domain).devices(std::slice::from_ref(&gpu));
        assert_eq!(cores.len(), 3);
        assert_eq!(ids::parse_resource_device_id(&cores[2].id).unwrap(), (2, 1));
        let mem = ResourcePlugin::memory(&domain, 1024).devices(&[gpu]);
        assert_eq!(mem.len(), 4);
        assert_eq!(ResourcePlugin::memory(&domain, 1024).resource_name(), "nvidia.com/vgpu-memory");
    }
}

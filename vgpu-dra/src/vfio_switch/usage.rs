//! What holds a GPU before a vfio-switch Job takes it off `nvidia` ([`GpuUsage`]): unbinding a GPU from its
//! driver under a running container ends that container's work. The [`super::controller::SwitchController`]
//! asks before it creates a Job to `vfio-pci` and waits while anything holds the GPU (condition
//! `VfioSwitch=False`, reason `InUse`, naming the holders).
//!
//! [`ClaimsAndProcesses`] is the kubelet plugin's answer: the claims its checkpoint holds prepared on the GPU
//! and the processes the driver reports on it.

use std::sync::Arc;

use vgpu_core::{backend::DeviceBackend, discovery::PciAddress};

use crate::state::DeviceState;

/// Who holds a GPU of this node.
#[tonic::async_trait]
pub trait GpuUsage: Send + Sync + std::fmt::Debug {
    /// The holders of the GPU at `pci` now, each as a short phrase for a condition message (`claim ns/name`,
    /// `process 1234`); empty when nothing holds it. An error means the usage cannot be told (the switch
    /// waits, never guesses).
    async fn holders(&self, pci: &PciAddress) -> Result<Vec<String>, String>;
}

/// The prepared claims of the kubelet plugin's checkpoint and the driver's processes on the GPU.
pub struct ClaimsAndProcesses {
    state: Arc<DeviceState>,
    backend: Arc<dyn DeviceBackend>,
}

impl std::fmt::Debug for ClaimsAndProcesses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimsAndProcesses").field("backend", &self.backend.name()).finish_non_exhaustive()
    }
}

impl ClaimsAndProcesses {
    /// Usage from `state`'s checkpoint and `backend`'s processes.
    pub fn new(state: Arc<DeviceState>, backend: Arc<dyn DeviceBackend>) -> Self {
        Self { state, backend }
    }
}

#[tonic::async_trait]
impl GpuUsage for ClaimsAndProcesses {
    async fn holders(&self, pci: &PciAddress) -> Result<Vec<String>, String> {
        let gpus = self.backend.devices().map_err(|e| format!("list the GPUs: {e}"))?;
        // A GPU the driver does not show (already off `nvidia`) has no claims or processes of ours.
        let Some(gpu) = gpus.iter().find(|g| g.bus_id.parse::<PciAddress>().is_ok_and(|a| a == *pci)) else {
            return Ok(Vec::new());
        };
        let checkpoint = self.state.checkpoint().await.map_err(|e| format!("read the checkpoint: {e}"))?;
        let mut holders: Vec<String> = checkpoint
            .claims()
            .values()
            .filter(|c| c.prepared_devices.iter().any(|d| d.uuid == gpu.uuid))
            .map(|c| format!("claim {}/{}", c.namespace, c.name))
            .collect();
        let processes = self
            .backend
            .processes(gpu.index)
            .map_err(|e| format!("list the processes on {}: {e}", gpu.uuid))?;
        holders.extend(processes.iter().map(|p| format!("process {}", p.pid)));
        Ok(holders)
    }
}

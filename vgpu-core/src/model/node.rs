//! Node-level vGPU settings (the `node-config-info` annotation).

/// How a node shares its GPUs: split count, scaling factors and memory unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeVgpuConfig {
    /// vGPU slots per physical GPU (`deviceSplit`).
    pub device_split: u32,
    /// Multiplier of the 100-core total per GPU (`coresScaling`).
    pub cores_scaling: f64,
    /// Multiplier of the physical memory; `> 1` means virtual (oversubscribed) memory (`memoryScaling`).
    pub memory_scaling: f64,
    /// MiB per `vgpu-memory` unit (`memoryFactor`).
    pub memory_factor: u32,
}

impl Default for NodeVgpuConfig {
    /// The device plugin's flag defaults (also the monitor's fallback): split 10, scaling 1, factor 1.
    fn default() -> Self {
        Self { device_split: 10, cores_scaling: 1.0, memory_scaling: 1.0, memory_factor: 1 }
    }
}

impl NodeVgpuConfig {
    /// The node over-subscribes memory (`memoryScaling > 1`).
    pub fn is_virtual_memory(&self) -> bool {
        self.memory_scaling > 1.0
    }
}

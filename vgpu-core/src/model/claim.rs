//! Per-pod device claims: the devices the scheduler pre-allocated (`pre-allocated`) or the device plugin
//! allocated (`real-allocated`).

/// One vGPU placed on one physical GPU.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DeviceClaim {
    /// GPU index on the node.
    pub index: u32,
    /// GPU UUID.
    pub uuid: String,
    /// Cores granted (percent of the GPU).
    pub cores: u64,
    /// Memory granted in MiB (already × memory factor; whole-card requests resolved to the card size).
    pub memory_mib: u64,
}

/// The claims of one container.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ContainerDeviceClaim {
    /// Container name.
    pub name: String,
    /// Its device claims (possibly none).
    pub devices: Vec<DeviceClaim>,
}

/// All containers' claims of a pod, in request order (vGPU init containers first, then app containers).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct PodDeviceClaim {
    /// Per-container claims.
    pub containers: Vec<ContainerDeviceClaim>,
}

impl PodDeviceClaim {
    /// The claims of a container, by name.
    pub fn container(&self, name: &str) -> Option<&ContainerDeviceClaim> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// `true` when no container is listed.
    pub fn is_empty(&self) -> bool {
        self.containers.is_empty()
    }

    /// Every device claim of every container, in order.
    pub fn devices(&self) -> impl Iterator<Item = &DeviceClaim> {
        self.containers.iter().flat_map(|c| c.devices.iter())
    }
}

//! The DRA wire names every vgpu component agrees on: the kubelet plugin publishes devices under them, the
//! webhook writes claims and CEL selectors against them, the monitor reads allocations by them.
//!
//! | name | value | where it appears |
//! |---|---|---|
//! | [`DRIVER_NAME`] | `manager.nvidia.com` | ResourceSlice `spec.driver`, claim results, opaque configs, the attribute domain |
//! | [`CDI_VENDOR`], [`CDI_CLASS`] | `k8s.manager.nvidia.com`, `claim` | CDI device kind of prepared claims |
//! | [`CAPACITY_CORES`], [`CAPACITY_MEMORY`], [`CAPACITY_SHARES`] | `cores`, `memory`, `shares` | device capacities, claim `capacity.requests`, `consumedCapacity` |
//! | [`ATTRIBUTE_TYPE`] | `type` (`vgpu`, `gpu`, `mig`, `vfio`) | device attribute in the driver's domain; DeviceClass selectors |
//! | [`ATTRIBUTE_UUID`] | `uuid` (lower case) | device attribute in the driver's domain; `distinctAttribute` of multi-GPU claims |
//! | [`ATTRIBUTE_NUMA_NODE`] | `numaNode` | device attribute in the driver's domain; `matchAttribute` of NUMA-aligned claims |
//! | [`ATTRIBUTE_PCI_BUS_ID`], [`ATTRIBUTE_PCIE_ROOT`] | `resource.kubernetes.io/pciBusID`, `…/pcieRoot` | the standard attributes; `matchAttribute` of link-aligned claims |
//!
//! A constraint or selector names an attribute fully qualified: [`qualified`] puts an unqualified name in the
//! driver's domain (`manager.nvidia.com/numaNode`), as the API server does for published attributes.
//!
//! ```
//! use vgpu_core::dra;
//! assert_eq!(dra::qualified(dra::DRIVER_NAME, dra::ATTRIBUTE_NUMA_NODE), "manager.nvidia.com/numaNode");
//! assert_eq!(dra::qualified(dra::DRIVER_NAME, dra::ATTRIBUTE_PCIE_ROOT), "resource.kubernetes.io/pcieRoot");
//! ```

/// The DRA driver name (configurable in the kubelet plugin; this is the default every component assumes).
pub const DRIVER_NAME: &str = "manager.nvidia.com";
/// CDI vendor of the DRA plugin's devices.
pub const CDI_VENDOR: &str = "k8s.manager.nvidia.com";
/// CDI class of the DRA plugin's devices.
pub const CDI_CLASS: &str = "claim";
/// Capacity of a device's compute share (percent of one GPU × the cores ratio).
pub const CAPACITY_CORES: &str = "cores";
/// Capacity of a device's memory (bytes).
pub const CAPACITY_MEMORY: &str = "memory";
/// Capacity of a whole GPU's share count (`--consumable-shares N`).
pub const CAPACITY_SHARES: &str = "shares";
/// Device type attribute.
pub const ATTRIBUTE_TYPE: &str = "type";
/// GPU UUID attribute (lower case).
pub const ATTRIBUTE_UUID: &str = "uuid";
/// NUMA node attribute (an int, or a list of ints with `DRAListTypeAttributes`).
pub const ATTRIBUTE_NUMA_NODE: &str = "numaNode";
/// The standard PCI bus id attribute.
pub const ATTRIBUTE_PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
/// The standard PCIe root attribute.
pub const ATTRIBUTE_PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
/// Device type of a shareable vGPU device.
pub const DEVICE_TYPE_VGPU: &str = "vgpu";

/// The `type` attribute of a device (the DeviceClass selects on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceType {
    /// A whole GPU (`gpu-<minor>`, class `gpu-manager`).
    Gpu,
    /// A shareable vGPU (`vgpu-<minor>`, class `vgpu-manager`).
    Vgpu,
    /// A MIG device (`gpu-<minor>-mig-<profileId>-<start>-<size>`, class `mig-manager`; gate `DynamicMIG`).
    Mig,
    /// A GPU for passthrough bound to `vfio-pci` on Prepare (`gpu-vfio-<index>`, class `vfio-manager`; gate
    /// `PassthroughSupport`).
    Vfio,
}

impl DeviceType {
    /// The attribute value: `gpu`, `vgpu` ([`DEVICE_TYPE_VGPU`]), `mig` or `vfio`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gpu => "gpu",
            Self::Vgpu => DEVICE_TYPE_VGPU,
            Self::Mig => "mig",
            Self::Vfio => "vfio",
        }
    }
}

impl std::fmt::Display for DeviceType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `attribute` fully qualified: unchanged when it has a domain (`a/b`), else in `driver`'s domain.
pub fn qualified(driver: &str, attribute: &str) -> String {
    if attribute.contains('/') { attribute.to_owned() } else { format!("{driver}/{attribute}") }
}

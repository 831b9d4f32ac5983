//! The allocatable device model: what the DRA driver offers per GPU, built from a [`DeviceBackend`] and the
//! plugin's configuration, and the lookup the Prepare side uses to resolve allocation results.
//!
//! One device per physical GPU, named by the GPU's character-device minor (`/dev/nvidia<minor>`), as the
//! contract (§9) names them:
//!
//! | config | device | `type` | capacities (value) | shared |
//! |---|---|---|---|---|
//! | `VGPUSupport` on | `vgpu-<minor>` | `vgpu` | `cores` = `--device-cores-ratio`; `memory` = physical bytes × `--device-memory-ratio` / 100 | yes (`allowMultipleAllocations`) |
//! | `VGPUSupport` off, `--consumable-shares disabled` | `gpu-<minor>` | `gpu` | none | no |
//! | `VGPUSupport` off, `--consumable-shares unlimited\|memory` | `gpu-<minor>` | `gpu` | `memory` = physical bytes | yes |
//! | `VGPUSupport` off, `--consumable-shares N` | `gpu-<minor>` | `gpu` | `memory` = physical bytes; `shares` = N | yes |
//!
//! With `VGPUSupport` the whole-GPU entry is *replaced* by the vGPU device (never both). GPUs in MIG mode
//! are not offered as vGPUs (a vGPU share of a MIG-enabled GPU cannot run); MIG devices are the next
//! issue's `mig-manager` class. How the `slices` module turns capacities into request policies is documented
//! there.
//!
//! Only NVIDIA GPUs become vGPUs ([`vgpu_capable`]): the vGPU limits are enforced by the CUDA hook library
//! (`libvgpu-control.so`), which cannot limit another vendor's runtime. A MetaX GPU (or any other vendor's)
//! is published as a whole `gpu-<minor>` device (exclusive, as with `--consumable-shares disabled`) even with
//! `VGPUSupport`, and Prepare gives it only its vendor adapter's device nodes (MetaX: its DRM card and render
//! nodes, and `/dev/mxcd`; see `vgpu_core::backend::MetaxAdapter`).
//!
//! Consumed capacity → limits ([`AllocatableDevices::limits`]), what the Prepare side writes into the CDI
//! env of one allocation result:
//!
//! | consumed | [`ShareLimits`] field | env (contract §9) |
//! |---|---|---|
//! | `cores` absent | `cores: None` (unlimited) | `CUDA_CORE_LIMIT_<i>` empty |
//! | `cores: "10"` | `cores: Some(10)` | `CUDA_CORE_LIMIT_<i>=10` |
//! | `memory` absent or ≥ the device's `memory` capacity | `memory_mib: None` (unlimited) | `CUDA_MEM_LIMIT_<i>` empty |
//! | `memory: 1Gi` | `memory_bytes: Some(1 << 30)`, `memory_mib: Some(1024)` | `CUDA_MEM_LIMIT_<i>=1024m` |
//! | `shares: "1"` | `shares: Some(1)` | – |
//!
//! A consumed value above the device's capacity, a capacity the device does not have, or a quantity that is
//! not a whole number is an error naming the device, the capacity and the value.
//!
//! ```
//! use vgpu_core::{backend::mock::MockBackend, dra::DeviceType};
//! use vgpu_dra::devices::{AllocatableDevices, DeviceConfig};
//!
//! let yaml = "gpus:\n  - { uuid: GPU-A, name: NVIDIA A30, memoryMiB: 24576, minor: 3 }\n";
//! let backend = MockBackend::from_yaml_str(yaml)?;
//! let config = DeviceConfig { cores_ratio: 100, memory_ratio: 200, ..DeviceConfig::default() };
//! let devices = AllocatableDevices::from_backend(&backend, &config)?;
//! let vgpu = devices.get("vgpu-3").expect("named by the minor");
//! assert_eq!((vgpu.kind, vgpu.gpu.index, vgpu.gpu.uuid.as_str()), (DeviceType::Vgpu, 0, "GPU-A"));
//! assert_eq!(vgpu.capacity.cores, Some(100));
//! assert_eq!(vgpu.capacity.memory_bytes, Some(2 * 24576 << 20), "memory ratio 200 doubles the memory");
//!
//! let consumed = [("cores", "10"), ("memory", "1Gi")].map(|(k, v)| (k.to_owned(), v.to_owned()));
//! let limits = devices.limits("vgpu-3", consumed.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
//! assert_eq!((limits.cores, limits.memory_mib), (Some(10), Some(1024)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::{
    collections::{BTreeMap, HashMap},
    fmt,
    num::NonZeroU32,
    path::Path,
    str::FromStr,
};

use vgpu_core::{
    alloc::parse_quantity,
    backend::{BackendError, DeviceBackend, DriverVersions},
    dra::DeviceType,
    model::{ComputeCapability, GpuDevice, Vendor},
};

/// One mebibyte, the memory capacity's step.
pub const MIB: u64 = 1 << 20;
/// Name of the cores capacity.
pub const CAPACITY_CORES: &str = vgpu_core::dra::CAPACITY_CORES;
/// Name of the memory capacity.
pub const CAPACITY_MEMORY: &str = vgpu_core::dra::CAPACITY_MEMORY;
/// Name of the shares capacity (`--consumable-shares N`).
pub const CAPACITY_SHARES: &str = vgpu_core::dra::CAPACITY_SHARES;

/// Errors of the device model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// The backend failed.
    #[error("device backend: {action}: {source}")]
    Backend {
        /// What was being read.
        action: &'static str,
        /// The backend's error.
        #[source]
        source: BackendError,
    },
    /// Two GPUs report the same minor number (their device names would collide).
    #[error("GPUs {first} and {second} both report minor number {minor}; device names must be unique")]
    DuplicateMinor {
        /// The minor number.
        minor: u32,
        /// Index of the first GPU.
        first: u32,
        /// Index of the second GPU.
        second: u32,
    },
    /// Two GPUs report the same UUID.
    #[error("GPUs {first} and {second} both report UUID {uuid:?}")]
    DuplicateUuid {
        /// The UUID.
        uuid: String,
        /// Index of the first GPU.
        first: u32,
        /// Index of the second GPU.
        second: u32,
    },
    /// The memory capacity does not fit in 64 bits or is below 1 MiB (e.g. `--device-memory-ratio 0`).
    #[error(
        "device {device}: memory capacity of {memory_mib} MiB × --device-memory-ratio {ratio} / 100 is outside 1 MiB..=16 EiB"
    )]
    MemoryCapacity {
        /// The device name.
        device: String,
        /// Physical memory, MiB.
        memory_mib: u64,
        /// The memory ratio.
        ratio: u32,
    },
    /// `--consumable-shares` is not one of the accepted forms.
    #[error(
        "invalid value for --consumable-shares: {0:?} (must be 'disabled', 'memory', 'unlimited', or a positive integer)"
    )]
    ConsumableShares(String),
    /// An allocation result names a device this node does not publish.
    #[error("unknown device {0:?}: this node publishes no device of that name")]
    UnknownDevice(String),
    /// A consumed capacity the device does not have.
    #[error(
        "device {device}: consumed capacity {capacity:?} is not one of the device's capacities ({known})"
    )]
    UnknownCapacity {
        /// The device name.
        device: String,
        /// The capacity name.
        capacity: String,
        /// The device's capacity names, comma separated.
        known: String,
    },
    /// A consumed value that is not a whole non-negative quantity.
    #[error("device {device}: consumed {capacity} {value:?} is not a whole non-negative quantity")]
    BadQuantity {
        /// The device name.
        device: String,
        /// The capacity name.
        capacity: String,
        /// The value as given.
        value: String,
    },
    /// Two devices of the node have the same name ([`AllocatableDevices::add`]).
    #[error("device {0:?} is published twice: device names must be unique on a node")]
    DuplicateDevice(String),
    /// A device consumes a counter set the node does not publish ([`AllocatableDevices::add`]).
    #[error("device {device} consumes counters of set {set:?}, which this node does not publish")]
    UnknownCounterSet {
        /// The device name.
        device: String,
        /// The counter set.
        set: String,
    },
    /// A consumed value above the device's capacity.
    #[error("device {device}: consumed {capacity} {requested} exceeds the device's capacity {available}")]
    OverCapacity {
        /// The device name.
        device: String,
        /// The capacity name.
        capacity: String,
        /// The consumed value.
        requested: u64,
        /// The capacity value.
        available: u64,
    },
}

// === config ===

/// The `--consumable-shares` policy (gate `ConsumableShares`, whole GPUs only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ConsumableShares {
    /// `disabled` (default): whole GPUs are allocated exclusively.
    #[default]
    Disabled,
    /// `unlimited`: any number of claims share a GPU; `memory` defaults to 0 (nothing reserved).
    Unlimited,
    /// `memory`: claims share a GPU by memory; `memory` defaults to all of it, at least 1 MiB.
    Memory,
    /// `N`: at most N claims share a GPU (capacity `shares` = N, default 1 per claim); `memory` defaults to 0.
    Shares(NonZeroU32),
}

impl ConsumableShares {
    /// Whether GPUs are shared at all.
    pub fn is_enabled(self) -> bool {
        self != Self::Disabled
    }
}

impl FromStr for ConsumableShares {
    type Err = DeviceError;

    /// Parses `disabled`, `memory`, `unlimited` or a positive integer (upstream's forms and message).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "disabled" | "" => Ok(Self::Disabled),
            "memory" => Ok(Self::Memory),
            "unlimited" => Ok(Self::Unlimited),
            t => t
                .parse::<NonZeroU32>()
                .map(Self::Shares)
                .map_err(|_| DeviceError::ConsumableShares(s.to_owned())),
        }
    }
}

impl fmt::Display for ConsumableShares {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Disabled => f.write_str("disabled"),
            Self::Unlimited => f.write_str("unlimited"),
            Self::Memory => f.write_str("memory"),
            Self::Shares(n) => write!(f, "{n}"),
        }
    }
}

/// What the device model needs from the plugin's flags and gates.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DeviceConfig {
    /// `--device-cores-ratio` (default 100): the `cores` capacity of each vGPU device.
    pub cores_ratio: u32,
    /// `--device-memory-ratio` (default 100): percent of physical memory offered as `memory`.
    pub memory_ratio: u32,
    /// Gate `VGPUSupport` (default on): `vgpu-<minor>` devices instead of `gpu-<minor>`.
    pub vgpu_support: bool,
    /// `--consumable-shares` (gate `ConsumableShares`); only used without `VGPUSupport`.
    pub consumable_shares: ConsumableShares,
}

/// Whether GPUs of `vendor` can be offered as vGPU shares: only NVIDIA's, whose CUDA runtime the vGPU
/// control library limits (module docs).
pub fn vgpu_capable(vendor: Vendor) -> bool {
    vendor == Vendor::Nvidia
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            cores_ratio: 100,
            memory_ratio: 100,
            vgpu_support: true,
            consumable_shares: ConsumableShares::Disabled,
        }
    }
}

// === devices ===

/// The physical GPU behind a device.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GpuInfo {
    /// Backend index (`0..n`).
    pub index: u32,
    /// UUID as the backend reports it (e.g. `GPU-49aa…`).
    pub uuid: String,
    /// Character-device minor (`/dev/nvidia<minor>`).
    pub minor: u32,
    /// Product name, e.g. `NVIDIA A30`.
    pub product_name: String,
    /// Maker.
    pub vendor: Vendor,
    /// Physical memory, bytes.
    pub memory_bytes: u64,
    /// PCI bus id, e.g. `0000:01:00.0` (may be empty).
    pub bus_id: String,
    /// The PCIe root complex, e.g. `pci0000:00` (read from sysfs; `None` when unknown).
    pub pcie_root: Option<String>,
    /// NUMA node, when known.
    pub numa_node: Option<u32>,
    /// CUDA compute capability.
    pub compute_capability: ComputeCapability,
    /// MIG mode on.
    pub mig_enabled: bool,
}

impl GpuInfo {
    fn from_device(device: &GpuDevice, minor: u32) -> Self {
        Self {
            index: device.index,
            uuid: device.uuid.clone(),
            minor,
            product_name: device.type_name.clone(),
            vendor: device.vendor,
            memory_bytes: device.memory_mib.saturating_mul(MIB),
            bus_id: device.bus_id.clone(),
            pcie_root: None,
            numa_node: device.numa_node,
            compute_capability: device.capability,
            mig_enabled: device.mig_enabled,
        }
    }

    /// Physical memory in MiB.
    pub fn memory_mib(&self) -> u64 {
        self.memory_bytes / MIB
    }

    /// The GPU architecture by compute capability (NVML's `nvmlDeviceGetArchitecture` names), `Unknown` for
    /// capabilities no NVIDIA architecture has or other vendors.
    pub fn architecture(&self) -> &'static str {
        if self.vendor != Vendor::Nvidia {
            return "Unknown";
        }
        match (self.compute_capability.major, self.compute_capability.minor) {
            (3, _) => "Kepler",
            (5, _) => "Maxwell",
            (6, _) => "Pascal",
            (7, 0 | 2) => "Volta",
            (7, 5) => "Turing",
            (8, 9) => "Ada Lovelace",
            (8, _) => "Ampere",
            (9, _) => "Hopper",
            (10..=12, _) => "Blackwell",
            _ => "Unknown",
        }
    }

    /// The brand by product name (NVML's `nvmlDeviceGetBrand` names; the backend seam does not carry the
    /// brand, so it is read from the name): `GeForce`, `Titan`, `Quadro`, `NvidiaRTX`, `Tesla` for data-centre
    /// parts, `Nvidia` for other NVIDIA names, `Unknown` for other vendors.
    pub fn brand(&self) -> &'static str {
        if self.vendor != Vendor::Nvidia {
            return "Unknown";
        }
        let name = self.product_name.to_ascii_lowercase();
        if name.contains("geforce") {
            "GeForce"
        } else if name.contains("titan") {
            "Titan"
        } else if name.contains("quadro") {
            "Quadro"
        } else if name.contains("rtx") {
            "NvidiaRTX"
        } else if name.contains("tesla")
            || [
                "a10", "a16", "a30", "a40", "a100", "h100", "h200", "h20", "h800", "a800", "l4", "l40",
                "b200", "gb200", "t4", "v100", "p100", "p40", "p4",
            ]
            .iter()
            .any(|model| name.split(|c: char| !c.is_ascii_alphanumeric()).any(|word| word == *model))
        {
            "Tesla"
        } else {
            "Nvidia"
        }
    }
}

/// The consumable capacities of a device (`None`: not offered).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DeviceCapacity {
    /// `cores` (vGPU only): the cores ratio.
    pub cores: Option<u64>,
    /// `memory` in bytes.
    pub memory_bytes: Option<u64>,
    /// `shares` (`--consumable-shares N`).
    pub shares: Option<u64>,
}

impl DeviceCapacity {
    /// The capacity names this device has, in publishing order.
    pub fn names(&self) -> Vec<&'static str> {
        let mut names = Vec::new();
        if self.cores.is_some() {
            names.push(CAPACITY_CORES);
        }
        if self.memory_bytes.is_some() {
            names.push(CAPACITY_MEMORY);
        }
        if self.shares.is_some() {
            names.push(CAPACITY_SHARES);
        }
        names
    }

    /// The capacity value by name.
    pub fn get(&self, name: &str) -> Option<u64> {
        match name {
            CAPACITY_CORES => self.cores,
            CAPACITY_MEMORY => self.memory_bytes,
            CAPACITY_SHARES => self.shares,
            _ => None,
        }
    }
}

/// One device the driver publishes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AllocatableDevice {
    /// Device name in the ResourceSlice (`vgpu-<minor>` or `gpu-<minor>`).
    pub name: String,
    /// The `type` attribute.
    pub kind: DeviceType,
    /// The GPU behind it.
    pub gpu: GpuInfo,
    /// Consumable capacities.
    pub capacity: DeviceCapacity,
    /// `allowMultipleAllocations`: several claims may consume capacity of this device.
    pub shared: bool,
    /// What a mode adds to the device beyond the GPU's own attributes and capacities (MIG, VFIO, Fabric
    /// Manager partitions); empty for the plain `gpu`/`vgpu` devices.
    pub extra: DeviceExtras,
}

/// An attribute value a mode adds to a device ([`DeviceExtras::attributes`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ExtraAttribute {
    /// `string`.
    String(String),
    /// `int`.
    Int(i64),
    /// `bool`.
    Bool(bool),
    /// `version` (semantic version, e.g. `1.2.0`).
    Version(String),
}

/// A quantity of a capacity or counter a mode adds: bytes (`binary` quantities such as `40Gi`) or a count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Amount {
    /// Bytes, published as a binary quantity.
    Bytes(u64),
    /// A plain count.
    Count(u64),
}

impl Amount {
    /// The number, whatever its unit.
    pub fn value(self) -> u64 {
        match self {
            Self::Bytes(n) | Self::Count(n) => n,
        }
    }
}

/// What a device consumes from one of the node's shared counter sets (KEP-4815 partitionable devices).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CounterConsumption {
    /// The counter set's name ([`CounterSet::name`]).
    pub counter_set: String,
    /// Counter name → amount consumed.
    pub counters: BTreeMap<String, Amount>,
}

/// A set of counters shared by several devices (e.g. one GPU's memory slices and engines): the scheduler
/// never allocates devices whose consumption together exceeds a counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CounterSet {
    /// The set's name, unique in the pool (upstream: `<gpu canonical name>-counter-set`).
    pub name: String,
    /// Counter name → amount available.
    pub counters: BTreeMap<String, Amount>,
}

/// Attributes, fixed capacities and counter consumption a mode adds to a device.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DeviceExtras {
    /// Attribute name → value; published after (and over) the GPU's own attributes.
    pub attributes: BTreeMap<String, ExtraAttribute>,
    /// Capacity name → value, published without a request policy (the whole value is consumed).
    pub capacities: BTreeMap<String, Amount>,
    /// Shared counters this device consumes when allocated.
    pub consumes_counters: Vec<CounterConsumption>,
}

impl DeviceExtras {
    /// True when nothing is added.
    pub fn is_empty(&self) -> bool {
        self.attributes.is_empty() && self.capacities.is_empty() && self.consumes_counters.is_empty()
    }
}

/// The limits one allocation result puts on its share of a GPU (see the module table).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShareLimits {
    /// The device name.
    pub device: String,
    /// The GPU's backend index.
    pub index: u32,
    /// The GPU's UUID.
    pub uuid: String,
    /// Consumed `cores`; `None` = unlimited.
    pub cores: Option<u64>,
    /// Consumed `memory` in bytes; `None` when absent or not below the device's memory capacity (unlimited).
    pub memory_bytes: Option<u64>,
    /// `memory_bytes` in whole MiB (rounded down; the request policy's 1 MiB step keeps it exact).
    pub memory_mib: Option<u64>,
    /// Consumed `shares`.
    pub shares: Option<u64>,
}

/// The devices of this node, with lookups by device name, UUID and index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatableDevices {
    config: DeviceConfig,
    driver_versions: Option<DriverVersions>,
    devices: Vec<AllocatableDevice>,
    by_name: HashMap<String, usize>,
    counter_sets: Vec<CounterSet>,
}

impl AllocatableDevices {
    /// Reads the GPUs, their minors and the driver versions from `backend`.
    pub fn from_backend(backend: &dyn DeviceBackend, config: &DeviceConfig) -> Result<Self, DeviceError> {
        let gpus =
            backend.devices().map_err(|source| DeviceError::Backend { action: "list devices", source })?;
        let mut with_minors = Vec::with_capacity(gpus.len());
        for gpu in gpus {
            let minor = backend
                .minor_number(gpu.index)
                .map_err(|source| DeviceError::Backend { action: "read minor number", source })?;
            with_minors.push((gpu, minor));
        }
        let driver_versions = backend
            .driver_versions()
            .map_err(|source| DeviceError::Backend { action: "read driver versions", source })?;
        let mut devices = Self::new(config, with_minors, driver_versions)?;
        // The mock's bus ids are made up: looking them up would attach this machine's PCI layout.
        if backend.name() != "mock" {
            devices.resolve_pcie_roots(Path::new("/sys"));
        }
        Ok(devices)
    }

    /// Fills each GPU's PCIe root from `<sysfs>/bus/pci/devices/<busId>` ([`pcie_root`]); GPUs whose bus id
    /// is not there keep `None`. [`AllocatableDevices::from_backend`] does this with `/sys` for every backend
    /// but the mock.
    pub fn resolve_pcie_roots(&mut self, sysfs: &Path) {
        for device in &mut self.devices {
            device.gpu.pcie_root = pcie_root(sysfs, &device.gpu.bus_id);
        }
    }

    /// Builds the model from GPUs with their minor numbers (pure). Devices are ordered by GPU index.
    pub fn new(
        config: &DeviceConfig,
        gpus: Vec<(GpuDevice, u32)>,
        driver_versions: Option<DriverVersions>,
    ) -> Result<Self, DeviceError> {
        let mut gpus = gpus;
        gpus.sort_by_key(|(gpu, _)| gpu.index);
        let mut minors: HashMap<u32, u32> = HashMap::new();
        let mut uuids: HashMap<&str, u32> = HashMap::new();
        for (gpu, minor) in &gpus {
            if let Some(first) = minors.insert(*minor, gpu.index) {
                return Err(DeviceError::DuplicateMinor { minor: *minor, first, second: gpu.index });
            }
            if let Some(first) = uuids.insert(gpu.uuid.as_str(), gpu.index) {
                return Err(DeviceError::DuplicateUuid { uuid: gpu.uuid.clone(), first, second: gpu.index });
            }
        }
        let mut devices = Vec::with_capacity(gpus.len());
        for (gpu, minor) in &gpus {
            let info = GpuInfo::from_device(gpu, *minor);
            let device = if config.vgpu_support && vgpu_capable(info.vendor) {
                if info.mig_enabled {
                    continue;
                }
                let name = format!("vgpu-{minor}");
                let memory = scaled_memory(&name, gpu.memory_mib, config.memory_ratio)?;
                AllocatableDevice {
                    name,
                    kind: DeviceType::Vgpu,
                    capacity: DeviceCapacity {
                        cores: Some(u64::from(config.cores_ratio)),
                        memory_bytes: Some(memory),
                        shares: None,
                    },
                    gpu: info,
                    shared: true,
                    extra: DeviceExtras::default(),
                }
            } else {
                let name = format!("gpu-{minor}");
                // With VGPUSupport the consumable-shares policies are off (the gates exclude each other).
                let shares =
                    if config.vgpu_support { ConsumableShares::Disabled } else { config.consumable_shares };
                let capacity = match shares {
                    ConsumableShares::Disabled => DeviceCapacity::default(),
                    policy => DeviceCapacity {
                        cores: None,
                        memory_bytes: Some(scaled_memory(&name, gpu.memory_mib, 100)?),
                        shares: match policy {
                            ConsumableShares::Shares(n) => Some(u64::from(n.get())),
                            _ => None,
                        },
                    },
                };
                AllocatableDevice {
                    name,
                    kind: DeviceType::Gpu,
                    gpu: info,
                    capacity,
                    shared: shares.is_enabled(),
                    extra: DeviceExtras::default(),
                }
            };
            devices.push(device);
        }
        let by_name = devices.iter().enumerate().map(|(i, d)| (d.name.clone(), i)).collect();
        Ok(Self { config: config.clone(), driver_versions, devices, by_name, counter_sets: Vec::new() })
    }

    /// Adds a device a mode publishes (MIG, VFIO). Its name must be new, and every counter set it consumes
    /// must have been added first ([`AllocatableDevices::add_counter_set`]).
    pub fn add(&mut self, device: AllocatableDevice) -> Result<(), DeviceError> {
        if self.by_name.contains_key(&device.name) {
            return Err(DeviceError::DuplicateDevice(device.name));
        }
        if let Some(missing) = device
            .extra
            .consumes_counters
            .iter()
            .find(|c| !self.counter_sets.iter().any(|s| s.name == c.counter_set))
        {
            return Err(DeviceError::UnknownCounterSet {
                device: device.name.clone(),
                set: missing.counter_set.clone(),
            });
        }
        self.by_name.insert(device.name.clone(), self.devices.len());
        self.devices.push(device);
        Ok(())
    }

    /// Removes every device for which `drop` is true (e.g. the whole-GPU device of a GPU that a mode
    /// publishes otherwise); the rest keep their order.
    pub fn remove_where(&mut self, drop: impl Fn(&AllocatableDevice) -> bool) {
        self.devices.retain(|d| !drop(d));
        self.by_name = self.devices.iter().enumerate().map(|(i, d)| (d.name.clone(), i)).collect();
    }

    /// The extras of the device of this name, to change before the devices are shared.
    pub fn extras_mut(&mut self, name: &str) -> Option<&mut DeviceExtras> {
        let i = *self.by_name.get(name)?;
        self.devices.get_mut(i).map(|d| &mut d.extra)
    }

    /// Adds (or replaces, by name) a shared counter set.
    pub fn add_counter_set(&mut self, set: CounterSet) {
        match self.counter_sets.iter_mut().find(|s| s.name == set.name) {
            Some(existing) => *existing = set,
            None => self.counter_sets.push(set),
        }
    }

    /// The node's shared counter sets (empty unless a mode adds partitionable devices).
    pub fn counter_sets(&self) -> &[CounterSet] {
        &self.counter_sets
    }

    /// The configuration the devices were built with.
    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// The driver and CUDA versions, when the backend reports them.
    pub fn driver_versions(&self) -> Option<&DriverVersions> {
        self.driver_versions.as_ref()
    }

    /// The devices, ordered by GPU index.
    pub fn iter(&self) -> std::slice::Iter<'_, AllocatableDevice> {
        self.devices.iter()
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// `true` when no device is published.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The device of this name (as an allocation result's `device` field names it).
    pub fn get(&self, name: &str) -> Option<&AllocatableDevice> {
        self.by_name.get(name).and_then(|&i| self.devices.get(i))
    }

    /// The device of the GPU with this UUID (compared case-insensitively: the `uuid` attribute is lower-case).
    pub fn by_uuid(&self, uuid: &str) -> Option<&AllocatableDevice> {
        self.devices.iter().find(|d| d.gpu.uuid.eq_ignore_ascii_case(uuid))
    }

    /// The device of the GPU with this backend index.
    pub fn by_index(&self, index: u32) -> Option<&AllocatableDevice> {
        self.devices.iter().find(|d| d.gpu.index == index)
    }

    /// Turns an allocation result's consumed capacity (`consumedCapacity`: capacity name → quantity) on
    /// device `name` into limits (module table). An empty map (an exclusive allocation) gives no limits.
    pub fn limits<'a>(
        &self,
        name: &str,
        consumed: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<ShareLimits, DeviceError> {
        let device = self.get(name).ok_or_else(|| DeviceError::UnknownDevice(name.to_owned()))?;
        let mut limits = ShareLimits {
            device: device.name.clone(),
            index: device.gpu.index,
            uuid: device.gpu.uuid.clone(),
            cores: None,
            memory_bytes: None,
            memory_mib: None,
            shares: None,
        };
        for (capacity, value) in consumed {
            // The allocator may qualify the driver's own capacity names with the driver domain.
            let short = capacity.rsplit('/').next().unwrap_or(capacity);
            let available = device.capacity.get(short).ok_or_else(|| DeviceError::UnknownCapacity {
                device: device.name.clone(),
                capacity: capacity.to_owned(),
                known: device.capacity.names().join(", "),
            })?;
            let requested = parse_quantity(value).ok_or_else(|| DeviceError::BadQuantity {
                device: device.name.clone(),
                capacity: capacity.to_owned(),
                value: value.to_owned(),
            })?;
            if requested > available {
                return Err(DeviceError::OverCapacity {
                    device: device.name.clone(),
                    capacity: short.to_owned(),
                    requested,
                    available,
                });
            }
            match short {
                CAPACITY_CORES => limits.cores = Some(requested),
                CAPACITY_MEMORY if requested < available => {
                    limits.memory_bytes = Some(requested);
                    limits.memory_mib = Some(requested / MIB);
                }
                CAPACITY_MEMORY => {}
                _ => limits.shares = Some(requested),
            }
        }
        Ok(limits)
    }
}

impl<'a> IntoIterator for &'a AllocatableDevices {
    type Item = &'a AllocatableDevice;
    type IntoIter = std::slice::Iter<'a, AllocatableDevice>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// The PCIe root complex of a PCI device: the `pci<domain>:<bus>` component of the target of
/// `<sysfs>/bus/pci/devices/<bus_id>` (e.g. `../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0` →
/// `pci0000:00`), as the standard `resource.kubernetes.io/pcieRoot` attribute names it. `None` when the
/// link is missing or has no such component. The bus id is matched lower-case.
pub fn pcie_root(sysfs: &Path, bus_id: &str) -> Option<String> {
    if bus_id.is_empty() || bus_id.contains('/') {
        return None;
    }
    let link = std::fs::read_link(sysfs.join("bus/pci/devices").join(bus_id.to_ascii_lowercase())).ok()?;
    link.components().find_map(|c| {
        let part = c.as_os_str().to_str()?;
        (part.starts_with("pci") && part.len() > 3).then(|| part.to_owned())
    })
}

/// `memory_mib` MiB × `ratio` / 100 in bytes, at least 1 MiB.
fn scaled_memory(device: &str, memory_mib: u64, ratio: u32) -> Result<u64, DeviceError> {
    let bytes = u128::from(memory_mib) * u128::from(MIB) * u128::from(ratio) / 100;
    u64::try_from(bytes).ok().filter(|&b| b >= MIB).ok_or_else(|| DeviceError::MemoryCapacity {
        device: device.to_owned(),
        memory_mib,
        ratio,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use proptest::prelude::*;

    fn gpu(index: u32, uuid: &str, memory_mib: u64) -> GpuDevice {
        GpuDevice {
            index,
            uuid: uuid.into(),
            type_name: "NVIDIA A100-SXM4-40GB".into(),
            memory_mib,
            bus_id: format!("0000:0{index}:00.0"),
            capability: ComputeCapability { major: 8, minor: 0 },
            ..GpuDevice::default()
        }
    }

    fn build(config: &DeviceConfig) -> AllocatableDevices {
        AllocatableDevices::new(config, vec![(gpu(1, "GPU-B", 2048), 7), (gpu(0, "GPU-A", 1024), 4)], None)
            .unwrap()
    }

    #[test]
    fn vgpu_devices_by_minor_with_ratios() {
        let devices = build(&DeviceConfig { cores_ratio: 150, memory_ratio: 250, ..DeviceConfig::default() });
        let names: Vec<_> = devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["vgpu-4", "vgpu-7"], "ordered by index, named by minor");
        let d = devices.get("vgpu-7").unwrap();
        assert_eq!((d.kind, d.gpu.index, d.gpu.minor, d.shared), (DeviceType::Vgpu, 1, 7, true));
        assert_eq!(
            d.capacity,
            DeviceCapacity { cores: Some(150), memory_bytes: Some(5120 * MIB), shares: None }
        );
        assert_eq!(devices.by_uuid("gpu-b").unwrap().name, "vgpu-7");
        assert_eq!(devices.by_index(0).unwrap().name, "vgpu-4");
        assert!(devices.get("gpu-4").is_none(), "the whole-GPU entry is replaced");
        assert_eq!(d.gpu.architecture(), "Ampere");
        assert_eq!(d.gpu.brand(), "Tesla");
    }

    #[test]
    fn whole_gpus_and_consumable_shares() {
        let off = DeviceConfig { vgpu_support: false, ..DeviceConfig::default() };
        let devices = build(&off);
        let d = devices.get("gpu-4").unwrap();
        assert_eq!((d.kind, d.shared, d.capacity), (DeviceType::Gpu, false, DeviceCapacity::default()));

        let shares = DeviceConfig { consumable_shares: "3".parse().unwrap(), ..off.clone() };
        let d = build(&shares).get("gpu-4").cloned().unwrap();
        assert!(d.shared);
        assert_eq!(
            d.capacity,
            DeviceCapacity { cores: None, memory_bytes: Some(1024 * MIB), shares: Some(3) }
        );
        assert_eq!(d.capacity.names(), ["memory", "shares"]);

        let memory = DeviceConfig { consumable_shares: ConsumableShares::Memory, memory_ratio: 300, ..off };
        let d = build(&memory).get("gpu-7").cloned().unwrap();
        assert_eq!(d.capacity.memory_bytes, Some(2048 * MIB), "whole GPUs ignore the memory ratio");
    }

    #[test]
    fn mig_gpus_are_not_vgpus() {
        let mut mig = gpu(0, "GPU-M", 1024);
        mig.mig_enabled = true;
        let devices = AllocatableDevices::new(&DeviceConfig::default(), vec![(mig, 0)], None).unwrap();
        assert!(devices.is_empty());
    }

    #[test]
    fn bad_inputs_are_named() {
        let config = DeviceConfig::default();
        let err = AllocatableDevices::new(&config, vec![(gpu(0, "A", 1), 3), (gpu(1, "B", 1), 3)], None)
            .unwrap_err();
        assert_eq!(err.to_string(), "GPUs 0 and 1 both report minor number 3; device names must be unique");
        let err = AllocatableDevices::new(&config, vec![(gpu(0, "A", 1), 0), (gpu(1, "A", 1), 1)], None)
            .unwrap_err();
        assert!(matches!(err, DeviceError::DuplicateUuid { .. }), "{err}");
        let zero = DeviceConfig { memory_ratio: 0, ..config };
        let err = AllocatableDevices::new(&zero, vec![(gpu(0, "A", 1024), 0)], None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "device vgpu-0: memory capacity of 1024 MiB × --device-memory-ratio 0 / 100 is outside 1 MiB..=16 EiB"
        );
        let err = "0".parse::<ConsumableShares>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid value for --consumable-shares: \"0\" (must be 'disabled', 'memory', 'unlimited', or a positive integer)"
        );
        for (text, policy) in [
            ("disabled", ConsumableShares::Disabled),
            ("memory", ConsumableShares::Memory),
            ("unlimited", ConsumableShares::Unlimited),
            ("12", ConsumableShares::Shares(NonZeroU32::new(12).unwrap())),
        ] {
            assert_eq!(text.parse::<ConsumableShares>().unwrap(), policy);
            assert_eq!(policy.to_string(), text);
        }
        for bad in ["-1", "1.5", "Memory", "lots"] {
            assert!(bad.parse::<ConsumableShares>().is_err(), "{bad}");
        }
    }

    #[test]
    fn consumed_capacity_to_limits() {
        let devices = build(&DeviceConfig::default());
        let limits = devices.limits("vgpu-4", [("cores", "10"), ("memory", "512Mi")]).unwrap();
        assert_eq!(
            limits,
            ShareLimits {
                device: "vgpu-4".into(),
                index: 0,
                uuid: "GPU-A".into(),
                cores: Some(10),
                memory_bytes: Some(512 * MIB),
                memory_mib: Some(512),
                shares: None,
            }
        );
        let all = devices.limits("vgpu-4", [("manager.nvidia.com/memory", "1Gi")]).unwrap();
        assert_eq!(
            (all.memory_bytes, all.memory_mib, all.cores),
            (None, None, None),
            "all memory = no limit"
        );
        assert_eq!(devices.limits("vgpu-4", []).unwrap().cores, None);

        let err = devices.limits("vgpu-9", []).unwrap_err();
        assert_eq!(err.to_string(), "unknown device \"vgpu-9\": this node publishes no device of that name");
        let err = devices.limits("vgpu-4", [("cores", "101")]).unwrap_err();
        assert_eq!(err.to_string(), "device vgpu-4: consumed cores 101 exceeds the device's capacity 100");
        let err = devices.limits("vgpu-4", [("shares", "1")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "device vgpu-4: consumed capacity \"shares\" is not one of the device's capacities (cores, memory)"
        );
        let err = devices.limits("vgpu-4", [("cores", "1.5")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "device vgpu-4: consumed cores \"1.5\" is not a whole non-negative quantity"
        );
    }

    #[test]
    fn from_mock_backend() {
        let yaml = "driver: { version: 570.86.10, cudaVersion: '12.8' }\ngpus:\n  - { uuid: GPU-X, name: NVIDIA GeForce RTX 4090, memoryMiB: 24564, minor: 2, computeCapability: '8.9', numaNode: 1 }\n";
        let backend = vgpu_core::backend::mock::MockBackend::from_yaml_str(yaml).unwrap();
        let devices = AllocatableDevices::from_backend(&backend, &DeviceConfig::default()).unwrap();
        let d = devices.get("vgpu-2").unwrap();
        assert_eq!(
            (d.gpu.numa_node, d.gpu.architecture(), d.gpu.brand()),
            (Some(1), "Ada Lovelace", "GeForce")
        );
        assert_eq!(devices.driver_versions().unwrap().cuda_version, Some((12, 8)));
    }

    #[test]
    fn pcie_roots_from_sysfs() {
        let sysfs = tempfile::tempdir().unwrap();
        let devices_dir = sysfs.path().join("bus/pci/devices");
        std::fs::create_dir_all(&devices_dir).unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:17/0000:17:00.0/0000:18:00.0",
            devices_dir.join("0000:18:00.0"),
        )
        .unwrap();
        assert_eq!(pcie_root(sysfs.path(), "0000:18:00.0").as_deref(), Some("pci0000:17"));
        assert_eq!(
            pcie_root(sysfs.path(), "0000:18:00.0".to_uppercase().as_str()).as_deref(),
            Some("pci0000:17")
        );
        assert_eq!(pcie_root(sysfs.path(), "0000:19:00.0"), None);
        assert_eq!(pcie_root(sysfs.path(), ""), None);
        assert_eq!(pcie_root(sysfs.path(), "../../x"), None);

        let mut one = gpu(0, "A", 1024);
        one.bus_id = "0000:18:00.0".into();
        let mut devices = AllocatableDevices::new(&DeviceConfig::default(), vec![(one, 0)], None).unwrap();
        assert_eq!(devices.get("vgpu-0").unwrap().gpu.pcie_root, None);
        devices.resolve_pcie_roots(sysfs.path());
        assert_eq!(devices.get("vgpu-0").unwrap().gpu.pcie_root.as_deref(), Some("pci0000:17"));
    }

    proptest! {
        #[test]
        fn memory_capacity_is_the_ratio_of_physical(mib in 1u64..1 << 24, ratio in 1u32..1000) {
            let config = DeviceConfig { memory_ratio: ratio, ..DeviceConfig::default() };
            let got = AllocatableDevices::new(&config, vec![(gpu(0, "A", mib), 0)], None);
            let expected = u128::from(mib) * u128::from(MIB) * u128::from(ratio) / 100;
            match got {
                Ok(devices) => prop_assert_eq!(u128::from(devices.get("vgpu-0").unwrap().capacity.memory_bytes.unwrap()), expected),
                Err(_) => prop_assert!(expected < u128::from(MIB)),
            }
        }

        #[test]
        fn limits_never_exceed_capacity(cores in 0u64..300, mib in 0u64..4096) {
            let devices = build(&DeviceConfig::default());
            let cores_text = cores.to_string();
            let memory_text = format!("{mib}Mi");
            match devices.limits("vgpu-7", [("cores", cores_text.as_str()), ("memory", memory_text.as_str())]) {
                Ok(l) => {
                    prop_assert!(cores <= 100 && mib <= 2048);
                    prop_assert_eq!(l.cores, Some(cores));
                    prop_assert_eq!(l.memory_mib, (mib < 2048).then_some(mib));
                }
                Err(_) => prop_assert!(cores > 100 || mib > 2048),
            }
        }
    }
}

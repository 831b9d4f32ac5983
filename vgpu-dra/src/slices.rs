//! ResourceSlices (resource.k8s.io/v1): the pure builder ([`build_slices`]) and the [`SlicePublisher`](publisher::SlicePublisher) that
//! keeps the API server holding exactly the built set.
//!
//! One pool per node (pool name = node name, `spec.nodeName` = node name, `spec.driver` = the driver,
//! `manager.nvidia.com` unless configured). Each [`AllocatableDevice`] becomes one `Device`:
//!
//! | field | value (contract §9) |
//! |---|---|
//! | `name` | `vgpu-<minor>` / `gpu-<minor>` / `gpu-<minor>-mig-<profileId>-<start>-<size>` (gate `DynamicMIG`) |
//! | attribute `type` (string) | `vgpu` / `gpu` / `mig` |
//! | `uuid` (string) | the GPU UUID, lower-case |
//! | `minor` (int) | `/dev/nvidia<minor>` |
//! | `productName`, `brand`, `architecture` (string) | product name (cut to 64 bytes), brand and architecture ([`GpuInfo`]) |
//! | `cudaComputeCapability` (version) | `8.0.0` for 8.0 |
//! | `driverVersion`, `cudaDriverVersion` (version) | semver of the backend's versions (`535.104.05` → `535.104.5`, `12.8` → `12.8.0`); absent when unknown |
//! | `coreRatio`, `memoryRatio` (int, vGPU only) | `--device-cores-ratio`, `--device-memory-ratio` |
//! | `numaNode` (int; `ints: [n]` with `DRAListTypeAttributes`) | the GPU's NUMA node; absent when unknown |
//! | `resource.kubernetes.io/pciBusID` (string) | the PCI bus id; absent when unknown |
//! | `resource.kubernetes.io/pcieRoot` (string) | the PCIe root complex from sysfs (`pci0000:17`; [`crate::devices::pcie_root`]); absent when unknown (always for the mock backend) |
//! | capacity `cores` (vGPU) | value = cores ratio; request policy default = min(ratio, 100), valid range 0..=min(ratio, 100) step 1 |
//! | capacity `memory` (vGPU) | value = bytes × memory ratio / 100; default = all, valid range 1Mi..=all step 1Mi |
//! | capacity `memory` (`--consumable-shares unlimited`) | value = bytes; default 0 |
//! | capacity `memory` (`--consumable-shares memory`) | value = bytes; default = all, valid range 1Mi..=all step 1Mi |
//! | capacities `memory`, `shares` (`--consumable-shares N`) | memory default 0; `shares` value N, default 1, valid range 1..=N step 1 (valid values `[1]` for N = 1) |
//! | `allowMultipleAllocations` | `true` for shared devices (every vGPU; whole GPUs with consumable shares) |
//! | `taints` | the device's [`HealthSnapshot`] taints (`<driver>/xid`, `gpu-lost`, `unmonitored`) |
//!
//! | `consumesCounters` | the device's [`DeviceExtras::consumes_counters`](crate::devices::DeviceExtras) (gate `DynamicMIG`: [`crate::mig`]) |
//! | MIG devices (`type` `mig`) | no `uuid` attribute (the MIG UUID exists only after Prepare; `parentUUID` names the GPU) |
//!
//! "All" memory in a policy is rounded down to whole MiB (a default and a max must be multiples of the
//! step).
//!
//! API limits (resource.k8s.io/v1 validation, Kubernetes 1.37) the builder respects: at most 32 attributes
//! and capacities per device ([`MAX_ATTRIBUTES_AND_CAPACITIES`], an error: never cut silently), 128 devices
//! per slice, 64 when any device of the slice has taints, consumes counters or has a list attribute
//! ([`MAX_DEVICES_PER_SLICE`], [`MAX_DEVICES_PER_SLICE_WITH_TAINTS`]), 16 taints per device, 64-byte
//! attribute strings; shared counters: at most 2 counter consumptions per device, 32 counters per counter
//! set and per consumption ([`MAX_COUNTERS`], errors), 8 counter sets per slice
//! ([`MAX_COUNTER_SETS_PER_SLICE`]).
//!
//! A slice holds either devices or shared counters, never both (Kubernetes ≥ 1.35): the node's counter sets
//! ([`AllocatableDevices::counter_sets`]) are published in slices of their own, after the device slices,
//! 8 sets each, with no `devices` field; the scheduler reads a pool's counter sets from all its slices. A
//! pool larger than one slice is split into several slices of the same pool and generation, named
//! `<node>-<driver>-<i>` (a long node name is cut and hashed to stay within 253 characters), each with
//! `resourceSliceCount` = the number of slices.
//!
//! The republish rule, the store seam and the run loop are in [`publisher`] and [`store`]; the DeviceClasses
//! selecting these devices in [`classes`].
//!
//! ```
//! use std::sync::Arc;
//! use vgpu_core::backend::mock::MockBackend;
//! use vgpu_dra::{devices::{AllocatableDevices, DeviceConfig}, health::HealthSnapshot, slices::{SliceConfig, build_slices}};
//!
//! let backend = MockBackend::from_yaml_str("gpus:\n  - { uuid: GPU-A, name: NVIDIA A30, memoryMiB: 24576 }\n")?;
//! let devices = AllocatableDevices::from_backend(&backend, &DeviceConfig::default())?;
//! let slices = build_slices(&SliceConfig::new("node-a"), &devices, &HealthSnapshot::default(), 1)?;
//! let spec = &slices[0].spec;
//! assert_eq!((spec.driver.as_str(), spec.pool.name.as_str(), spec.node_name.as_deref()), ("manager.nvidia.com", "node-a", Some("node-a")));
//! let device = &spec.devices.as_ref().expect("devices")[0];
//! assert_eq!(device.name, "vgpu-0");
//! let capacity = device.capacity.as_ref().expect("capacity");
//! assert_eq!(capacity["cores"].value.0, "100");
//! assert_eq!(capacity["memory"].value.0, "24Gi");
//! assert_eq!(device.allow_multiple_allocations, Some(true));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod classes;
pub mod publisher;
pub mod store;

use std::collections::BTreeMap;

use k8s_openapi::{
    api::resource::v1::{
        CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet as ApiCounterSet, Device,
        DeviceAttribute, DeviceCapacity as ApiCapacity, DeviceCounterConsumption, ResourcePool,
        ResourceSlice, ResourceSliceSpec,
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{ObjectMeta, OwnerReference},
    },
};
use vgpu_core::backend::DriverVersions;

use crate::{
    devices::AllocatableDevice, devices::AllocatableDevices, devices::Amount, devices::CAPACITY_CORES,
    devices::CAPACITY_MEMORY, devices::CAPACITY_SHARES, devices::ConsumableShares, devices::ExtraAttribute,
    devices::GpuInfo, devices::MIB, health::HealthSnapshot,
};
use vgpu_core::dra::DeviceType;

/// Most attributes plus capacities one device may have.
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// Most devices in one ResourceSlice.
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// Most devices in one ResourceSlice when any of them has taints, consumes counters or has a list attribute.
pub const MAX_DEVICES_PER_SLICE_WITH_TAINTS: usize = 64;
/// Most counter sets in one ResourceSlice.
pub const MAX_COUNTER_SETS_PER_SLICE: usize = 8;
/// Most counters in one counter set, and in one device's consumption of a set.
pub const MAX_COUNTERS: usize = 32;
/// Most counter consumptions (distinct counter sets) of one device.
pub const MAX_COUNTER_CONSUMPTIONS_PER_DEVICE: usize = 2;
/// Most taints on one device.
pub const MAX_TAINTS_PER_DEVICE: usize = 16;
/// Longest attribute string or version value, in bytes.
pub const MAX_ATTRIBUTE_VALUE_LEN: usize = 64;
/// Longest object name.
pub const MAX_NAME_LEN: usize = 253;
/// The standard PCI bus id attribute.
pub const ATTRIBUTE_PCI_BUS_ID: &str = vgpu_core::dra::ATTRIBUTE_PCI_BUS_ID;
/// The standard PCIe root attribute.
pub const ATTRIBUTE_PCIE_ROOT: &str = vgpu_core::dra::ATTRIBUTE_PCIE_ROOT;

/// Errors of the slice builder and publisher.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SliceError {
    /// The node name is empty.
    #[error("the node name is empty: ResourceSlices need --node-name (NODE_NAME)")]
    NoNodeName,
    /// A device would have more attributes and capacities than the API allows.
    #[error(
        "device {device}: {count} attributes and capacities, more than the API's {MAX_ATTRIBUTES_AND_CAPACITIES}"
    )]
    TooManyAttributes {
        /// The device name.
        device: String,
        /// Attributes + capacities.
        count: usize,
    },
    /// A device would have more taints than the API allows.
    #[error("device {device}: {count} taints, more than the API's {MAX_TAINTS_PER_DEVICE}")]
    TooManyTaints {
        /// The device name.
        device: String,
        /// Taints.
        count: usize,
    },
    /// A counter set or a device's counter consumption exceeds an API limit ([`MAX_COUNTERS`],
    /// [`MAX_COUNTER_CONSUMPTIONS_PER_DEVICE`]).
    #[error("{what}: {count} {items}, more than the API's {limit}")]
    TooManyCounters {
        /// The counter set or device.
        what: String,
        /// `counters` or `counter consumptions`.
        items: &'static str,
        /// How many.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// An API request failed.
    #[error("ResourceSlice {name}: {action}: {source}")]
    Api {
        /// `list`, `create`, `replace`, `delete`.
        action: &'static str,
        /// The slice name (the node's pool for `list`).
        name: String,
        /// The client error.
        #[source]
        source: Box<kube::Error>,
    },
    /// An in-memory store failure (tests).
    #[error("ResourceSlice {name}: {action}: {message}")]
    Store {
        /// What was done.
        action: &'static str,
        /// The slice name.
        name: String,
        /// Why it failed.
        message: String,
    },
}

/// What the builder needs besides the devices and their health.
#[derive(Debug, Clone, PartialEq)]
pub struct SliceConfig {
    /// The driver name (`spec.driver`, the attribute and taint domain).
    pub driver: String,
    /// The node name: `spec.nodeName` and the pool name.
    pub node_name: String,
    /// Gate `DRAListTypeAttributes`: the NUMA attribute in list form (`ints`).
    pub list_type_attributes: bool,
    /// The Node object to own the slices (upstream sets it, so the slices go with the node); `None`: no owner.
    pub owner: Option<OwnerReference>,
}

impl SliceConfig {
    /// The default driver `manager.nvidia.com` on `node_name`, scalar attributes, no owner.
    pub fn new(node_name: &str) -> Self {
        Self {
            driver: crate::DRIVER_NAME.to_owned(),
            node_name: node_name.to_owned(),
            list_type_attributes: false,
            owner: None,
        }
    }

    /// The owner reference for a Node of this name and UID.
    pub fn node_owner(name: &str, uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: "v1".to_owned(),
            kind: "Node".to_owned(),
            name: name.to_owned(),
            uid: uid.to_owned(),
            controller: Some(true),
            block_owner_deletion: None,
        }
    }

    /// Name of the `index`-th slice of the pool: `<node>-<driver>-<index>`, made a valid object name (the node
    /// part is cut and a hash of the full prefix appended when too long).
    pub fn slice_name(&self, index: usize) -> String {
        let suffix = format!("-{index}");
        let prefix = format!("{}-{}", self.node_name, self.driver).to_ascii_lowercase();
        if prefix.len() + suffix.len() <= MAX_NAME_LEN {
            return format!("{prefix}{suffix}");
        }
        let hash = format!("-{:016x}", fnv1a(prefix.as_bytes()));
        let keep = MAX_NAME_LEN - suffix.len() - hash.len();
        let mut cut = prefix[..keep.min(prefix.len())].trim_end_matches(['-', '.']).to_owned();
        cut.push_str(&hash);
        cut.push_str(&suffix);
        cut
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

// === quantities ===

/// The canonical text of a whole number of bytes, as the API server prints it (largest exact binary
/// suffix: `25769803776` → `24Gi`, `1536Mi` stays `1536Mi`).
pub fn binary_quantity(bytes: u64) -> Quantity {
    const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let mut value = bytes;
    let mut exp = 0;
    while value != 0 && value.is_multiple_of(1024) && exp + 1 < SUFFIXES.len() {
        value /= 1024;
        exp += 1;
    }
    Quantity(format!("{value}{}", SUFFIXES.get(exp).copied().unwrap_or("")))
}

/// A plain count (`cores`, `shares`).
pub fn count_quantity(n: u64) -> Quantity {
    Quantity(n.to_string())
}

// === attributes ===

fn string_attr(value: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(truncate(value, MAX_ATTRIBUTE_VALUE_LEN).to_owned()),
        ..DeviceAttribute::default()
    }
}

fn int_attr(value: i64) -> DeviceAttribute {
    DeviceAttribute { int: Some(value), ..DeviceAttribute::default() }
}

fn version_attr(value: String) -> DeviceAttribute {
    DeviceAttribute { version: Some(value), ..DeviceAttribute::default() }
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A version as semver 2.0 `major.minor.patch`: numeric dot-separated parts with leading zeros dropped,
/// missing parts 0, anything after the third part ignored; `None` when the first part is not a number.
///
/// ```
/// use vgpu_dra::slices::semver;
/// assert_eq!(semver("535.104.05").as_deref(), Some("535.104.5"));
/// assert_eq!(semver("12.8").as_deref(), Some("12.8.0"));
/// assert_eq!(semver("n/a"), None);
/// ```
pub fn semver(text: &str) -> Option<String> {
    let mut parts = [0u64; 3];
    for (i, part) in text.trim().split('.').take(3).enumerate() {
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        match (digits.parse::<u64>(), i) {
            (Ok(n), _) => {
                if let Some(slot) = parts.get_mut(i) {
                    *slot = n;
                }
            }
            (Err(_), 0) => return None,
            (Err(_), _) => break,
        }
        if digits.len() != part.len() {
            break;
        }
    }
    Some(format!("{}.{}.{}", parts[0], parts[1], parts[2]))
}

fn attributes(
    config: &SliceConfig,
    device: &AllocatableDevice,
    driver: Option<&DriverVersions>,
    devices: &AllocatableDevices,
) -> BTreeMap<String, DeviceAttribute> {
    let gpu: &GpuInfo = &device.gpu;
    let mut attrs = BTreeMap::new();
    attrs.insert(vgpu_core::dra::ATTRIBUTE_TYPE.to_owned(), string_attr(device.kind.as_str()));
    if device.kind != DeviceType::Mig {
        attrs.insert(vgpu_core::dra::ATTRIBUTE_UUID.to_owned(), string_attr(&gpu.uuid.to_ascii_lowercase()));
    }
    attrs.insert("productName".to_owned(), string_attr(&gpu.product_name));
    // A VFIO device is a PCI function for a VM, not a CUDA device of this host (as upstream: no minor, CUDA or
    // driver attributes; its GPU may be bound to vfio-pci already, unseen by NVML).
    let cuda = device.kind != DeviceType::Vfio;
    if cuda {
        attrs.insert("minor".to_owned(), int_attr(i64::from(gpu.minor)));
        attrs.insert("brand".to_owned(), string_attr(gpu.brand()));
        attrs.insert("architecture".to_owned(), string_attr(gpu.architecture()));
        let cap = gpu.compute_capability;
        attrs.insert(
            "cudaComputeCapability".to_owned(),
            version_attr(format!("{}.{}.0", cap.major, cap.minor)),
        );
    }
    if let Some(versions) = driver.filter(|_| cuda) {
        if let Some(v) = semver(&versions.driver_version) {
            attrs.insert("driverVersion".to_owned(), version_attr(v));
        }
        if let Some((major, minor)) = versions.cuda_version {
            attrs.insert("cudaDriverVersion".to_owned(), version_attr(format!("{major}.{minor}.0")));
        }
    }
    if device.kind == DeviceType::Vgpu {
        let c = devices.config();
        attrs.insert("coreRatio".to_owned(), int_attr(i64::from(c.cores_ratio)));
        attrs.insert("memoryRatio".to_owned(), int_attr(i64::from(c.memory_ratio)));
    }
    if let Some(numa) = gpu.numa_node {
        let attr = if config.list_type_attributes {
            DeviceAttribute { ints: Some(vec![i64::from(numa)]), ..DeviceAttribute::default() }
        } else {
            int_attr(i64::from(numa))
        };
        attrs.insert(vgpu_core::dra::ATTRIBUTE_NUMA_NODE.to_owned(), attr);
    }
    if !gpu.bus_id.is_empty() {
        attrs.insert(ATTRIBUTE_PCI_BUS_ID.to_owned(), string_attr(&gpu.bus_id.to_ascii_lowercase()));
    }
    if let Some(root) = &gpu.pcie_root {
        attrs.insert(ATTRIBUTE_PCIE_ROOT.to_owned(), string_attr(root));
    }
    for (name, value) in &device.extra.attributes {
        let attr = match value {
            ExtraAttribute::String(v) => string_attr(v),
            ExtraAttribute::Int(v) => int_attr(*v),
            ExtraAttribute::Bool(v) => DeviceAttribute { bool: Some(*v), ..DeviceAttribute::default() },
            ExtraAttribute::Version(v) => version_attr(v.clone()),
        };
        attrs.insert(name.clone(), attr);
    }
    attrs
}

/// An [`Amount`] as an API quantity (bytes binary, counts plain).
pub fn amount_quantity(amount: Amount) -> Quantity {
    match amount {
        Amount::Bytes(n) => binary_quantity(n),
        Amount::Count(n) => count_quantity(n),
    }
}

// === capacities ===

fn range_policy(default: Quantity, min: Quantity, max: Quantity, step: Quantity) -> CapacityRequestPolicy {
    CapacityRequestPolicy {
        default: Some(default),
        valid_range: Some(CapacityRequestPolicyRange { min, max: Some(max), step: Some(step) }),
        valid_values: None,
    }
}

/// `memory`: default all, 1Mi..=all step 1Mi (no policy below 2 MiB, where min + step would pass the value).
fn memory_all_policy(bytes: u64) -> Option<CapacityRequestPolicy> {
    let all = bytes / MIB * MIB;
    (bytes >= 2 * MIB).then(|| {
        range_policy(binary_quantity(all), binary_quantity(MIB), binary_quantity(all), binary_quantity(MIB))
    })
}

fn capacities(device: &AllocatableDevice, shares: ConsumableShares) -> BTreeMap<String, ApiCapacity> {
    let mut out = BTreeMap::new();
    let c = &device.capacity;
    if let Some(cores) = c.cores {
        let max = cores.min(100);
        let policy = (cores >= 1).then(|| {
            range_policy(count_quantity(max), count_quantity(0), count_quantity(max), count_quantity(1))
        });
        out.insert(
            CAPACITY_CORES.to_owned(),
            ApiCapacity { value: count_quantity(cores), request_policy: policy },
        );
    }
    if let Some(bytes) = c.memory_bytes {
        let policy = match (device.kind, shares) {
            (DeviceType::Vgpu, _) | (DeviceType::Gpu, ConsumableShares::Memory) => memory_all_policy(bytes),
            _ => Some(CapacityRequestPolicy {
                default: Some(binary_quantity(0)),
                valid_range: None,
                valid_values: None,
            }),
        };
        out.insert(
            CAPACITY_MEMORY.to_owned(),
            ApiCapacity { value: binary_quantity(bytes), request_policy: policy },
        );
    }
    if let Some(n) = c.shares {
        let policy = if n >= 2 {
            range_policy(count_quantity(1), count_quantity(1), count_quantity(n), count_quantity(1))
        } else {
            CapacityRequestPolicy {
                default: Some(count_quantity(1)),
                valid_range: None,
                valid_values: Some(vec![count_quantity(1)]),
            }
        };
        out.insert(
            CAPACITY_SHARES.to_owned(),
            ApiCapacity { value: count_quantity(n), request_policy: Some(policy) },
        );
    }
    for (name, amount) in &device.extra.capacities {
        out.insert(name.clone(), ApiCapacity { value: amount_quantity(*amount), request_policy: None });
    }
    out
}

/// The API `Device` of one allocatable device with its taints.
pub fn build_device(
    config: &SliceConfig,
    devices: &AllocatableDevices,
    device: &AllocatableDevice,
    health: &HealthSnapshot,
) -> Result<Device, SliceError> {
    let attributes = attributes(config, device, devices.driver_versions(), devices);
    let capacity = capacities(device, devices.config().consumable_shares);
    let count = attributes.len() + capacity.len();
    if count > MAX_ATTRIBUTES_AND_CAPACITIES {
        return Err(SliceError::TooManyAttributes { device: device.name.clone(), count });
    }
    let taints = health.device_taints(&device.name);
    if taints.len() > MAX_TAINTS_PER_DEVICE {
        return Err(SliceError::TooManyTaints { device: device.name.clone(), count: taints.len() });
    }
    let consumes = &device.extra.consumes_counters;
    if consumes.len() > MAX_COUNTER_CONSUMPTIONS_PER_DEVICE {
        return Err(SliceError::TooManyCounters {
            what: format!("device {}", device.name),
            items: "counter consumptions",
            count: consumes.len(),
            limit: MAX_COUNTER_CONSUMPTIONS_PER_DEVICE,
        });
    }
    let mut consumes_counters = Vec::with_capacity(consumes.len());
    for c in consumes {
        consumes_counters.push(DeviceCounterConsumption {
            counter_set: c.counter_set.clone(),
            counters: api_counters(&format!("device {} (set {})", device.name, c.counter_set), &c.counters)?,
            ..DeviceCounterConsumption::default()
        });
    }
    Ok(Device {
        name: device.name.clone(),
        attributes: Some(attributes),
        capacity: (!capacity.is_empty()).then_some(capacity),
        allow_multiple_allocations: device.shared.then_some(true),
        taints: (!taints.is_empty()).then_some(taints),
        consumes_counters: (!consumes_counters.is_empty()).then_some(consumes_counters),
        ..Device::default()
    })
}

/// Counters as API counters, at most [`MAX_COUNTERS`] of them.
fn api_counters(
    what: &str,
    counters: &BTreeMap<String, Amount>,
) -> Result<BTreeMap<String, Counter>, SliceError> {
    if counters.len() > MAX_COUNTERS {
        return Err(SliceError::TooManyCounters {
            what: what.to_owned(),
            items: "counters",
            count: counters.len(),
            limit: MAX_COUNTERS,
        });
    }
    Ok(counters
        .iter()
        .map(|(name, amount)| (name.clone(), Counter { value: amount_quantity(*amount) }))
        .collect())
}

/// Whether the device uses a feature that lowers the slice's device limit to 64 (taints, counters, list
/// attributes).
fn uses_advanced_features(device: &Device) -> bool {
    device.taints.as_ref().is_some_and(|t| !t.is_empty())
        || device.consumes_counters.as_ref().is_some_and(|c| !c.is_empty())
        || device
            .attributes
            .iter()
            .flat_map(|a| a.values())
            .any(|a| a.ints.is_some() || a.strings.is_some() || a.bools.is_some() || a.versions.is_some())
}

/// Builds the pool's slices at `generation`: devices in GPU order, cut into slices within the API's
/// per-slice limit. A node without devices still gets one empty slice, so the pool says "no devices".
pub fn build_slices(
    config: &SliceConfig,
    devices: &AllocatableDevices,
    health: &HealthSnapshot,
    generation: i64,
) -> Result<Vec<ResourceSlice>, SliceError> {
    if config.node_name.is_empty() {
        return Err(SliceError::NoNodeName);
    }
    let built: Vec<Device> =
        devices.iter().map(|d| build_device(config, devices, d, health)).collect::<Result<_, _>>()?;
    // Cut greedily: a slice may hold 128 devices, or 64 once one of them uses taints, counters or lists.
    let mut chunks: Vec<Vec<Device>> = vec![Vec::new()];
    let mut chunk_advanced = false;
    for device in built {
        let advanced = chunk_advanced || uses_advanced_features(&device);
        let limit = if advanced { MAX_DEVICES_PER_SLICE_WITH_TAINTS } else { MAX_DEVICES_PER_SLICE };
        match chunks.last_mut() {
            Some(chunk) if chunk.len() < limit => {
                chunk.push(device);
                chunk_advanced = advanced;
            }
            _ => {
                chunk_advanced = uses_advanced_features(&device);
                chunks.push(vec![device]);
            }
        }
    }
    // Counter sets: slices of their own (a slice has devices or shared counters, never both).
    let mut counter_chunks: Vec<Vec<ApiCounterSet>> = Vec::new();
    for set in devices.counter_sets() {
        let counters = api_counters(&format!("counter set {}", set.name), &set.counters)?;
        let api = ApiCounterSet { name: set.name.clone(), counters };
        match counter_chunks.last_mut() {
            Some(chunk) if chunk.len() < MAX_COUNTER_SETS_PER_SLICE => chunk.push(api),
            _ => counter_chunks.push(vec![api]),
        }
    }
    let count = i64::try_from(chunks.len() + counter_chunks.len()).unwrap_or(i64::MAX);
    let slice =
        |i: usize, devices: Option<Vec<Device>>, shared_counters: Option<Vec<ApiCounterSet>>| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(config.slice_name(i)),
                owner_references: config.owner.clone().map(|o| vec![o]),
                ..ObjectMeta::default()
            },
            spec: ResourceSliceSpec {
                driver: config.driver.clone(),
                node_name: Some(config.node_name.clone()),
                pool: ResourcePool {
                    name: config.node_name.clone(),
                    generation,
                    resource_slice_count: count,
                },
                devices,
                shared_counters,
                ..ResourceSliceSpec::default()
            },
        };
    let first_counter_slice = chunks.len();
    let mut slices: Vec<ResourceSlice> =
        chunks.into_iter().enumerate().map(|(i, chunk)| slice(i, Some(chunk), None)).collect();
    slices.extend(
        counter_chunks
            .into_iter()
            .enumerate()
            .map(|(i, sets)| slice(first_counter_slice + i, None, Some(sets))),
    );
    Ok(slices)
}

/// The spec with what the API server may rewrite or what does not count as a change taken out: the pool
/// generation, every capacity quantity in canonical integer form, and taints' `timeAdded`. Two slices with
/// equal normalized specs publish the same thing.
pub fn normalized_spec(spec: &ResourceSliceSpec) -> ResourceSliceSpec {
    fn q(quantity: &mut Quantity) {
        if let Some(n) = vgpu_core::alloc::parse_quantity(&quantity.0) {
            quantity.0 = n.to_string();
        }
    }
    let mut spec = spec.clone();
    spec.pool.generation = 0;
    for device in spec.devices.iter_mut().flatten() {
        for capacity in device.capacity.iter_mut().flat_map(|c| c.values_mut()) {
            q(&mut capacity.value);
            if let Some(policy) = capacity.request_policy.as_mut() {
                policy.default.iter_mut().for_each(q);
                policy.valid_values.iter_mut().flatten().for_each(q);
                if let Some(range) = policy.valid_range.as_mut() {
                    q(&mut range.min);
                    range.max.iter_mut().for_each(q);
                    range.step.iter_mut().for_each(q);
                }
            }
        }
        for taint in device.taints.iter_mut().flatten() {
            taint.time_added = None;
        }
        for consumption in device.consumes_counters.iter_mut().flatten() {
            consumption.counters.values_mut().for_each(|c| q(&mut c.value));
        }
    }
    for set in spec.shared_counters.iter_mut().flatten() {
        set.counters.values_mut().for_each(|c| q(&mut c.value));
    }
    spec
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::devices::DeviceConfig;
    use proptest::prelude::*;
    use vgpu_core::model::{ComputeCapability, GpuDevice};

    fn gpus(n: u32) -> Vec<(GpuDevice, u32)> {
        (0..n)
            .map(|i| {
                let gpu = GpuDevice {
                    index: i,
                    uuid: format!("GPU-ABC-{i}"),
                    type_name: "NVIDIA H100 80GB HBM3".into(),
                    memory_mib: 81559,
                    numa_node: Some(i % 2),
                    bus_id: format!("0000:{:02X}:00.0", i + 1),
                    capability: ComputeCapability { major: 9, minor: 0 },
                    ..GpuDevice::default()
                };
                (gpu, i)
            })
            .collect()
    }

    fn devices(config: &DeviceConfig, n: u32) -> AllocatableDevices {
        let versions = DriverVersions { driver_version: "535.104.05".into(), cuda_version: Some((12, 2)) };
        AllocatableDevices::new(config, gpus(n), Some(versions)).unwrap()
    }

    #[test]
    fn vgpu_device_wire_form() {
        let devices =
            devices(&DeviceConfig { cores_ratio: 200, memory_ratio: 150, ..DeviceConfig::default() }, 1);
        let slices = build_slices(&SliceConfig::new("n1"), &devices, &HealthSnapshot::default(), 3).unwrap();
        let json = serde_json::to_value(&slices[0]).unwrap();
        let device = &json["spec"]["devices"][0];
        assert_eq!(json["metadata"]["name"], "n1-manager.nvidia.com-0");
        assert_eq!(
            json["spec"]["pool"],
            serde_json::json!({"name": "n1", "generation": 3, "resourceSliceCount": 1})
        );
        assert_eq!(
            device["attributes"],
            serde_json::json!({
                "architecture": {"string": "Hopper"},
                "brand": {"string": "Tesla"},
                "coreRatio": {"int": 200},
                "cudaComputeCapability": {"version": "9.0.0"},
                "cudaDriverVersion": {"version": "12.2.0"},
                "driverVersion": {"version": "535.104.5"},
                "memoryRatio": {"int": 150},
                "minor": {"int": 0},
                "numaNode": {"int": 0},
                "productName": {"string": "NVIDIA H100 80GB HBM3"},
                "resource.kubernetes.io/pciBusID": {"string": "0000:01:00.0"},
                "type": {"string": "vgpu"},
                "uuid": {"string": "gpu-abc-0"},
            })
        );
        // 81559 MiB × 1.5 = 122338.5 MiB = 125274624 KiB: the value is exact, the policy's "all" whole MiB.
        assert_eq!(
            device["capacity"],
            serde_json::json!({
                "cores": {"value": "200", "requestPolicy": {"default": "100", "validRange": {"min": "0", "max": "100", "step": "1"}}},
                "memory": {"value": "125274624Ki", "requestPolicy": {"default": "122338Mi", "validRange": {"min": "1Mi", "max": "122338Mi", "step": "1Mi"}}},
            })
        );
        assert_eq!(device["allowMultipleAllocations"], true);
        assert!(device.get("taints").is_none());
    }

    #[test]
    fn pcie_root_attribute_when_known() {
        let sysfs = tempfile::tempdir().unwrap();
        let dir = sysfs.path().join("bus/pci/devices");
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0",
            dir.join("0000:01:00.0"),
        )
        .unwrap();
        let mut devices = devices(&DeviceConfig::default(), 2);
        devices.resolve_pcie_roots(sysfs.path());
        let slices = build_slices(&SliceConfig::new("n"), &devices, &HealthSnapshot::default(), 1).unwrap();
        let json = serde_json::to_value(&slices[0]).unwrap();
        let attrs = |i: usize| json["spec"]["devices"][i]["attributes"].clone();
        assert_eq!(attrs(0)[ATTRIBUTE_PCIE_ROOT], serde_json::json!({"string": "pci0000:00"}));
        assert!(attrs(1).get(ATTRIBUTE_PCIE_ROOT).is_none(), "0000:02:00.0 is not in this sysfs");
    }

    #[test]
    fn list_type_numa_and_whole_gpus() {
        let config = DeviceConfig { vgpu_support: false, ..DeviceConfig::default() };
        let devices = devices(&config, 2);
        let slice_config = SliceConfig { list_type_attributes: true, ..SliceConfig::new("n1") };
        let slices = build_slices(&slice_config, &devices, &HealthSnapshot::default(), 1).unwrap();
        let json = serde_json::to_value(&slices[0]).unwrap();
        let device = &json["spec"]["devices"][1];
        assert_eq!(device["name"], "gpu-1");
        assert_eq!(device["attributes"]["numaNode"], serde_json::json!({"ints": [1]}));
        assert_eq!(device["attributes"]["type"], serde_json::json!({"string": "gpu"}));
        assert!(device["attributes"].get("coreRatio").is_none());
        assert!(device.get("capacity").is_none() && device.get("allowMultipleAllocations").is_none());
    }

    #[test]
    fn consumable_shares_policies() {
        let policy = |shares: &str| {
            let config = DeviceConfig {
                vgpu_support: false,
                consumable_shares: shares.parse().unwrap(),
                ..DeviceConfig::default()
            };
            let slices =
                build_slices(&SliceConfig::new("n"), &devices(&config, 1), &HealthSnapshot::default(), 1)
                    .unwrap();
            let json = serde_json::to_value(&slices[0]).unwrap();
            assert_eq!(json["spec"]["devices"][0]["allowMultipleAllocations"], true);
            json["spec"]["devices"][0]["capacity"].clone()
        };
        assert_eq!(policy("unlimited")["memory"]["requestPolicy"], serde_json::json!({"default": "0"}));
        assert_eq!(policy("memory")["memory"]["requestPolicy"]["default"], "81559Mi");
        let n = policy("4");
        assert_eq!(n["memory"]["requestPolicy"], serde_json::json!({"default": "0"}));
        assert_eq!(
            n["shares"],
            serde_json::json!({"value": "4", "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}}})
        );
        assert_eq!(
            policy("1")["shares"]["requestPolicy"],
            serde_json::json!({"default": "1", "validValues": ["1"]})
        );
    }

    #[test]
    fn split_at_the_api_limits() {
        let devices = devices(&DeviceConfig::default(), 130);
        let slices = build_slices(&SliceConfig::new("n"), &devices, &HealthSnapshot::default(), 7).unwrap();
        let sizes: Vec<_> = slices.iter().map(|s| s.spec.devices.as_ref().unwrap().len()).collect();
        assert_eq!(sizes, [128, 2]);
        assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == 2 && s.spec.pool.generation == 7));
        assert_eq!(slices[1].metadata.name.as_deref(), Some("n-manager.nvidia.com-1"));

        let monitor = crate::health::HealthMonitor::new(
            crate::health::HealthConfig::new("manager.nvidia.com", &[]),
            &devices,
        );
        monitor.mark_unmonitored("test");
        let slices = build_slices(&SliceConfig::new("n"), &devices, &monitor.snapshot(), 7).unwrap();
        let sizes: Vec<_> = slices.iter().map(|s| s.spec.devices.as_ref().unwrap().len()).collect();
        assert_eq!(sizes, [64, 64, 2], "tainted devices: 64 per slice");

        let empty = AllocatableDevices::new(&DeviceConfig::default(), vec![], None).unwrap();
        let slices = build_slices(&SliceConfig::new("n"), &empty, &HealthSnapshot::default(), 1).unwrap();
        assert_eq!(slices.len(), 1);
        assert!(slices[0].spec.devices.as_ref().unwrap().is_empty());
        assert!(matches!(
            build_slices(&SliceConfig::new(""), &empty, &HealthSnapshot::default(), 1),
            Err(SliceError::NoNodeName)
        ));
    }

    #[test]
    fn long_names_and_values_stay_valid() {
        let long = "a".repeat(250);
        let config = SliceConfig::new(&long);
        let name = config.slice_name(12);
        assert!(name.len() <= MAX_NAME_LEN && name.ends_with("-12"), "{name}");
        assert_ne!(name, SliceConfig::new(&"a".repeat(249)).slice_name(12));
        assert_eq!(truncate("ééé", 3), "é");
    }

    #[test]
    fn normalization_ignores_server_rewrites() {
        let devices = devices(&DeviceConfig::default(), 1);
        let slice =
            build_slices(&SliceConfig::new("n"), &devices, &HealthSnapshot::default(), 1).unwrap().remove(0);
        let mut json = serde_json::to_value(&slice).unwrap();
        json["spec"]["devices"][0]["capacity"]["memory"]["value"] = serde_json::json!("85520809984");
        json["spec"]["pool"]["generation"] = serde_json::json!(9);
        let rewritten: ResourceSlice = serde_json::from_value(json).unwrap();
        assert_eq!(normalized_spec(&rewritten.spec), normalized_spec(&slice.spec));
    }

    /// `mig` A100 80GB GPUs in MIG mode (gate DynamicMIG published) then `plain` H100s, by index.
    fn mig_devices(mig: u32, plain: u32, list_type: bool) -> (AllocatableDevices, SliceConfig) {
        let mut yaml = String::from(if mig + plain == 0 { "gpus: []\n" } else { "gpus:\n" });
        for i in 0..mig {
            yaml.push_str(&format!("  - {{ uuid: GPU-M{i}, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, numaNode: 0, mig: {{ mode: Enabled }} }}\n"));
        }
        for i in 0..plain {
            yaml.push_str(&format!(
                "  - {{ uuid: GPU-P{i}, name: NVIDIA H100 80GB HBM3, memoryMiB: 81559, numaNode: 1 }}\n"
            ));
        }
        let backend = vgpu_core::backend::mock::MockBackend::from_yaml_str(&yaml).unwrap();
        let mut devices = AllocatableDevices::from_backend(&backend, &DeviceConfig::default()).unwrap();
        crate::mig::publish(&mut devices, &backend).unwrap();
        (devices, SliceConfig { list_type_attributes: list_type, ..SliceConfig::new("n") })
    }

    #[test]
    fn counter_sets_get_slices_of_their_own() {
        let (devices, config) = mig_devices(10, 1, false);
        let slices = build_slices(&config, &devices, &HealthSnapshot::default(), 2).unwrap();
        let shape: Vec<_> = slices
            .iter()
            .map(|s| (s.spec.devices.as_ref().map(Vec::len), s.spec.shared_counters.as_ref().map(Vec::len)))
            .collect();
        // 250 MIG devices + 1 vGPU: 64 per slice (they consume counters), then 10 sets: 8 + 2.
        assert_eq!(
            shape,
            [
                (Some(64), None),
                (Some(64), None),
                (Some(64), None),
                (Some(59), None),
                (None, Some(8)),
                (None, Some(2))
            ]
        );
        assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == 6));
        assert_eq!(slices[5].metadata.name.as_deref(), Some("n-manager.nvidia.com-5"));
        let json = serde_json::to_value(&slices[4]).unwrap();
        assert!(json["spec"].get("devices").is_none(), "a counter slice has no devices field");
        assert_eq!(
            json["spec"]["sharedCounters"][0]["counters"]["compute-slices"],
            serde_json::json!({"value": "7"})
        );
        // The server's canonical quantities do not count as a change.
        let mut rewritten = json.clone();
        rewritten["spec"]["sharedCounters"][0]["counters"]["memory"]["value"] =
            serde_json::json!("82678120448");
        let rewritten: ResourceSlice = serde_json::from_value(rewritten).unwrap();
        assert_eq!(normalized_spec(&rewritten.spec), normalized_spec(&slices[4].spec));
        assert_ne!(
            serde_json::to_value(&rewritten.spec).unwrap()["sharedCounters"][0]["counters"]["memory"],
            json["spec"]["sharedCounters"][0]["counters"]["memory"]
        );
    }

    #[test]
    fn list_attributes_lower_the_device_limit() {
        let plain = devices(&DeviceConfig::default(), 130);
        let list = SliceConfig { list_type_attributes: true, ..SliceConfig::new("n") };
        let slices = build_slices(&list, &plain, &HealthSnapshot::default(), 1).unwrap();
        let sizes: Vec<_> = slices.iter().map(|s| s.spec.devices.as_ref().unwrap().len()).collect();
        assert_eq!(sizes, [64, 64, 2]);
    }

    #[test]
    fn counter_limits_are_errors() {
        let (mut devices, config) = mig_devices(1, 0, false);
        let mut set = devices.counter_sets()[0].clone();
        for i in 0..40 {
            set.counters.insert(format!("extra-{i}"), crate::devices::Amount::Count(1));
        }
        devices.add_counter_set(set);
        let err = build_slices(&config, &devices, &HealthSnapshot::default(), 1).unwrap_err();
        assert_eq!(err.to_string(), "counter set gpu-0-counter-set: 50 counters, more than the API's 32");
    }

    proptest! {
        #[test]
        fn binary_quantities_round_trip(bytes in any::<u64>()) {
            let q = binary_quantity(bytes);
            prop_assert_eq!(vgpu_core::alloc::parse_quantity(&q.0), Some(bytes));
        }

        #[test]
        fn every_device_lands_in_exactly_one_slice(n in 0u32..300) {
            let devices = devices(&DeviceConfig::default(), n);
            let slices = build_slices(&SliceConfig::new("n"), &devices, &HealthSnapshot::default(), 1).unwrap();
            let names: Vec<String> = slices.iter().flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone())).collect();
            prop_assert_eq!(names.len(), n as usize);
            prop_assert!(slices.iter().all(|s| s.spec.devices.as_ref().unwrap().len() <= MAX_DEVICES_PER_SLICE));
            prop_assert_eq!(slices.len(), (n as usize).div_ceil(MAX_DEVICES_PER_SLICE).max(1));
        }

        /// With partitionable devices: every device in exactly one slice, no slice with both devices and
        /// counters, the per-slice limits kept, and every counter a device consumes published in a set.
        #[test]
        fn partitionable_pools_are_complete_and_valid(mig in 0u32..12, plain in 0u32..4, list in any::<bool>()) {
            let (devices, config) = mig_devices(mig, plain, list);
            let slices = build_slices(&config, &devices, &HealthSnapshot::default(), 1).unwrap();
            let mut names: Vec<String> =
                slices.iter().flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone())).collect();
            prop_assert_eq!(names.len(), devices.len());
            names.sort();
            names.dedup();
            prop_assert_eq!(names.len(), devices.len());
            let sets: Vec<&ApiCounterSet> = slices.iter().flat_map(|s| s.spec.shared_counters.iter().flatten()).collect();
            prop_assert_eq!(sets.len(), mig as usize);
            for s in &slices {
                prop_assert!(s.spec.devices.is_none() || s.spec.shared_counters.is_none());
                prop_assert_eq!(s.spec.pool.resource_slice_count, slices.len() as i64);
                prop_assert!(s.spec.shared_counters.as_ref().map_or(0, Vec::len) <= MAX_COUNTER_SETS_PER_SLICE);
                let devs = s.spec.devices.as_deref().unwrap_or_default();
                let limit = if devs.iter().any(uses_advanced_features) { MAX_DEVICES_PER_SLICE_WITH_TAINTS } else { MAX_DEVICES_PER_SLICE };
                prop_assert!(devs.len() <= limit);
                for d in devs {
                    prop_assert!(d.attributes.as_ref().map_or(0, BTreeMap::len) + d.capacity.as_ref().map_or(0, BTreeMap::len) <= MAX_ATTRIBUTES_AND_CAPACITIES);
                    for c in d.consumes_counters.iter().flatten() {
                        let set = sets.iter().find(|s| s.name == c.counter_set);
                        prop_assert!(set.is_some(), "{} consumes unpublished set {}", d.name, c.counter_set);
                        for k in c.counters.keys() {
                            prop_assert!(set.unwrap().counters.contains_key(k), "{} consumes {}", d.name, k);
                        }
                    }
                }
            }
        }
    }
}

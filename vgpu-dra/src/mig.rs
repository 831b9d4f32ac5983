//! Gate `DynamicMIG`: MIG devices published as partitionable devices (KEP-4815 shared counters) and created
//! on Prepare, destroyed on Unprepare, through the [`DeviceBackend`] (NVML's GPU/compute instance calls; the
//! mock backend's MIG state machine in tests and e2e).
//!
//! # Published devices ([`publish`])
//!
//! Every GPU whose MIG mode is `Enabled` and whose backend lists MIG profiles
//! ([`DeviceBackend::mig_profiles`]) gets one counter set and one device per (profile, allowed placement):
//!
//! | what | name | content |
//! |---|---|---|
//! | counter set | `gpu-<minor>-counter-set` | `memory` (bytes: slice memory × slices), `compute-slices`, `memory-slice-<i>` = 1 for each memory slice `i` |
//! | MIG device | `gpu-<minor>-mig-<profileId>-<start>-<size>` | `type=mig`, the parent's attributes (`minor`, `productName`, `brand`, `architecture`, versions, NUMA, PCI), `parentUUID`, `profile` (`3g.40gb`), `profileID`, `placementStart`, `placementSize`; capacities `memory` (bytes), `computeSlices`, `memorySlice<i>` = 1 for the slices of its placement; consumes `memory`, `compute-slices` and exactly the `memory-slice-<i>` counters of its placement |
//! | whole GPU `gpu-<minor>` (`VGPUSupport` off) | unchanged | additionally consumes every counter of the set (upstream's full device): allocating it excludes every MIG device of the GPU and the other way round |
//! | vGPU `vgpu-<minor>` (`VGPUSupport` on) | – | not published for a MIG-enabled GPU ([`crate::devices`]): a vGPU share cannot run beside MIG partitions, so such a GPU offers only its MIG devices |
//!
//! Two MIG devices whose placements share a memory slice both consume that slice's counter (value 1), so the
//! scheduler never allocates both; placements that do not overlap fit together. Counter names are DNS labels
//! (the API requires it), hence `memory-slice-<i>`; capacity names are C identifiers, hence `memorySlice<i>`.
//! The device's `uuid` attribute is not published for MIG devices: the MIG device UUID exists only once
//! Prepare has created the instance (`parentUUID` names the GPU).
//!
//! GPUs in MIG mode `Disabled` get no MIG devices (turning MIG mode on needs a GPU reset, which this plugin
//! does not do: the MIG manager does). Instances that exist when the plugin starts are not modelled by the
//! counters (the scheduler cannot see them); a claim whose placement overlaps one fails at Prepare with the
//! instance named, before anything is created.
//!
//! # Host actions ([`MigMode`])
//!
//! One action per allocated MIG device ([`MigAction`], recorded in the checkpoint before it runs):
//!
//! | step | what |
//! |---|---|
//! | plan | reads the GPU's MIG layout: an instance overlapping the placement (other than one of the same profile at the same start) fails the claim; nothing is changed |
//! | apply | creates the GPU instance of the profile at the placement and its compute instance ([`DeviceBackend::create_mig_device`]); an instance of that profile already at that start is adopted (idempotent) |
//! | revert | destroys the instance of that profile at that start if present ([`DeviceBackend::destroy_mig_device`]); none: nothing to do |
//!
//! The GPU is found by UUID each time (indices may change across restarts). CDI edits of the device: the
//! parent's `/dev/nvidia<minor>` and the capability nodes `/dev/nvidia-caps/nvidia-cap<N>` of the GPU
//! instance and compute instance, `N` read from the `DeviceFileMinor:` line of
//! `<container-driver-root>/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<g>/access` and
//! `.../ci<c>/access` (files that do not exist — the mock backend — add no node); env
//! `NVIDIA_VISIBLE_DEVICES=<MIG UUID>` and `CUDA_VISIBLE_DEVICES=<MIG UUID>`. The control nodes
//! (`/dev/nvidiactl`, …) are the claim's common nodes ([`crate::state`]). A container given two MIG devices
//! of one claim sees one `NVIDIA_VISIBLE_DEVICES` value (CDI env is per device; the last wins).
//!
//! Opaque `MigDeviceConfig` parameters are not read here (the opaque-config module validates them).
//!
//! ```
//! use std::sync::Arc;
//! use vgpu_core::backend::{DeviceBackend, mock::MockBackend};
//! use vgpu_dra::{devices::{AllocatableDevices, DeviceConfig}, mig};
//!
//! let yaml = "gpus:\n  - { uuid: GPU-0, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, mig: { mode: Enabled } }\n";
//! let backend = MockBackend::from_yaml_str(yaml)?;
//! let mut devices = AllocatableDevices::from_backend(&backend, &DeviceConfig::default())?;
//! assert!(devices.is_empty(), "a MIG-enabled GPU is no vGPU");
//! let published = mig::publish(&mut devices, &backend)?;
//! assert_eq!(published, 1);
//! assert!(devices.get("gpu-0-mig-9-4-4").is_some(), "3g.40gb (id 9) at slice 4, 4 slices");
//! assert_eq!(devices.counter_sets()[0].name, "gpu-0-counter-set");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use serde::{Deserialize, Serialize};
use vgpu_core::backend::{
    BackendError, DeviceBackend, MigInstance, MigLayout, MigMode as GpuMigMode, MigProfile,
};

use crate::{
    devices::AllocatableDevice,
    devices::AllocatableDevices,
    devices::Amount,
    devices::CounterConsumption,
    devices::CounterSet,
    devices::DeviceCapacity,
    devices::DeviceError,
    devices::DeviceExtras,
    devices::ExtraAttribute,
    devices::GpuInfo,
    devices::MIB,
    modes::{ClaimContext, ClaimMode, ModeEdits, ModeError, decode, encode},
};
use vgpu_core::cdi::{ContainerEdits, DeviceNode};
use vgpu_core::dra::DeviceType;

/// The mode's name in the checkpoint's host actions.
pub const MODE: &str = "mig";
/// The gate that enables it.
pub const GATE: &str = "DynamicMIG";
/// Attribute: the parent GPU's UUID (lower-case).
pub const ATTRIBUTE_PARENT_UUID: &str = "parentUUID";
/// Attribute: the profile name (`3g.40gb`).
pub const ATTRIBUTE_PROFILE: &str = "profile";
/// Attribute: the GPU instance profile id (`nvidia-smi mig -lgip`).
pub const ATTRIBUTE_PROFILE_ID: &str = "profileID";
/// Attribute: the placement's first memory slice.
pub const ATTRIBUTE_PLACEMENT_START: &str = "placementStart";
/// Attribute: the placement's number of memory slices.
pub const ATTRIBUTE_PLACEMENT_SIZE: &str = "placementSize";
/// Capacity and counter: memory in bytes.
pub const MEMORY: &str = "memory";
/// Capacity: compute slices of the instance.
pub const CAPACITY_COMPUTE_SLICES: &str = "computeSlices";
/// Counter: compute slices (a DNS label).
pub const COUNTER_COMPUTE_SLICES: &str = "compute-slices";

/// The counter set of the GPU with this minor: `gpu-<minor>-counter-set`.
pub fn counter_set_name(minor: u32) -> String {
    format!("gpu-{minor}-counter-set")
}

/// The counter of memory slice `i`: `memory-slice-<i>`.
pub fn memory_slice_counter(i: u32) -> String {
    format!("memory-slice-{i}")
}

/// The capacity of memory slice `i` on a MIG device: `memorySlice<i>`.
pub fn memory_slice_capacity(i: u32) -> String {
    format!("memorySlice{i}")
}

/// A MIG device's name: `gpu-<minor>-mig-<profileId>-<start>-<size>`.
pub fn device_name(minor: u32, profile_id: u32, start: u32, size: u32) -> String {
    format!("gpu-{minor}-mig-{profile_id}-{start}-{size}")
}

/// Why MIG devices could not be published.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigPublishError {
    /// The backend failed to answer.
    #[error("GPU {index}: {action}: {source}")]
    Backend {
        /// The GPU's backend index.
        index: u32,
        /// What was being read.
        action: &'static str,
        /// The backend's error.
        #[source]
        source: BackendError,
    },
    /// Listing the GPUs failed.
    #[error("listing the GPUs: {0}")]
    Devices(#[source] BackendError),
    /// A device could not be added to the model.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// One MIG placement of one GPU as published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Placement<'a> {
    info: &'a vgpu_core::backend::MigProfileInfo,
    start: u32,
}

/// Adds the MIG devices and counter sets of every MIG-enabled GPU of `backend` to `devices` (module table);
/// returns how many GPUs got MIG devices. Other vendors' GPUs, GPUs whose backend cannot tell a MIG layout
/// ([`BackendError::NotSupported`]) and GPUs whose backend lists no MIG profiles (an unknown model) are left
/// as they are.
pub fn publish(
    devices: &mut AllocatableDevices,
    backend: &dyn DeviceBackend,
) -> Result<usize, MigPublishError> {
    let gpus = backend.devices().map_err(MigPublishError::Devices)?;
    let mut published = 0;
    for gpu in gpus {
        let index = gpu.index;
        if gpu.vendor != vgpu_core::model::Vendor::Nvidia {
            continue;
        }
        let layout = match backend.mig_layout(index) {
            Ok(layout) => layout,
            Err(BackendError::NotSupported { .. }) => continue,
            Err(source) => {
                return Err(MigPublishError::Backend { index, action: "read the MIG layout", source });
            }
        };
        if layout.mode != GpuMigMode::Enabled {
            continue;
        }
        let profiles = match backend.mig_profiles(index) {
            Ok(p) if !p.is_empty() => p,
            Ok(_) | Err(BackendError::NotSupported { .. } | BackendError::Mig { .. }) => {
                tracing::warn!(gpu = %gpu.uuid, "MIG is enabled but the backend lists no MIG profiles for this GPU: no MIG devices");
                continue;
            }
            Err(source) => {
                return Err(MigPublishError::Backend { index, action: "list the MIG profiles", source });
            }
        };
        let minor = backend.minor_number(index).map_err(|source| MigPublishError::Backend {
            index,
            action: "read the minor number",
            source,
        })?;
        let parent = parent_info(devices, backend, &gpu, minor);
        add_gpu(devices, &parent, &profiles)?;
        published += 1;
    }
    Ok(published)
}

/// The parent's [`GpuInfo`]: the published whole-GPU device's when there is one, else built from the backend.
fn parent_info(
    devices: &AllocatableDevices,
    backend: &dyn DeviceBackend,
    gpu: &vgpu_core::model::GpuDevice,
    minor: u32,
) -> GpuInfo {
    if let Some(d) = devices
        .iter()
        .find(|d| d.gpu.uuid == gpu.uuid && matches!(d.kind, DeviceType::Gpu | DeviceType::Vgpu))
    {
        return d.gpu.clone();
    }
    let pcie_root = if backend.name() == "mock" {
        None
    } else {
        crate::devices::pcie_root(Path::new("/sys"), &gpu.bus_id)
    };
    GpuInfo {
        index: gpu.index,
        uuid: gpu.uuid.clone(),
        minor,
        product_name: gpu.type_name.clone(),
        vendor: gpu.vendor,
        memory_bytes: gpu.memory_mib.saturating_mul(MIB),
        bus_id: gpu.bus_id.clone(),
        pcie_root,
        numa_node: gpu.numa_node,
        compute_capability: gpu.capability,
        mig_enabled: true,
    }
}

fn add_gpu(
    devices: &mut AllocatableDevices,
    parent: &GpuInfo,
    profiles: &[vgpu_core::backend::MigProfileInfo],
) -> Result<(), MigPublishError> {
    let placements: Vec<Placement<'_>> = profiles
        .iter()
        .flat_map(|info| info.placements.iter().map(move |p| Placement { info, start: p.start }))
        .collect();
    let slices = placements.iter().map(|p| p.start + p.info.memory_slices).max().unwrap_or(0);
    let compute = profiles.iter().map(|p| p.compute_slices).max().unwrap_or(0);
    // Memory of one slice, from the profile whose memory is known per slice (the smallest, most exact).
    let slice_bytes = profiles
        .iter()
        .filter(|p| p.memory_slices > 0)
        .map(|p| p.memory_mib.saturating_mul(MIB) / u64::from(p.memory_slices))
        .min()
        .unwrap_or(0);
    let set = counter_set_name(parent.minor);
    let mut counters = BTreeMap::from([
        (MEMORY.to_owned(), Amount::Bytes(slice_bytes.saturating_mul(u64::from(slices)))),
        (COUNTER_COMPUTE_SLICES.to_owned(), Amount::Count(u64::from(compute))),
    ]);
    for i in 0..slices {
        counters.insert(memory_slice_counter(i), Amount::Count(1));
    }
    devices.add_counter_set(CounterSet { name: set.clone(), counters: counters.clone() });
    // The whole GPU consumes everything (upstream's full device).
    let whole: Vec<String> = devices
        .iter()
        .filter(|d| d.gpu.uuid == parent.uuid && d.kind == DeviceType::Gpu)
        .map(|d| d.name.clone())
        .collect();
    for name in whole {
        if let Some(extra) = devices.extras_mut(&name) {
            extra.consumes_counters.retain(|c| c.counter_set != set);
            extra
                .consumes_counters
                .push(CounterConsumption { counter_set: set.clone(), counters: counters.clone() });
        }
    }
    for p in placements {
        let size = p.info.memory_slices;
        let memory = Amount::Bytes(slice_bytes.saturating_mul(u64::from(size)));
        let mut consumed = BTreeMap::from([
            (MEMORY.to_owned(), memory),
            (COUNTER_COMPUTE_SLICES.to_owned(), Amount::Count(u64::from(p.info.compute_slices))),
        ]);
        let mut capacities = BTreeMap::from([
            (MEMORY.to_owned(), Amount::Bytes(p.info.memory_mib.saturating_mul(MIB))),
            (CAPACITY_COMPUTE_SLICES.to_owned(), Amount::Count(u64::from(p.info.compute_slices))),
        ]);
        for i in p.start..p.start + size {
            consumed.insert(memory_slice_counter(i), Amount::Count(1));
            capacities.insert(memory_slice_capacity(i), Amount::Count(1));
        }
        let attributes = BTreeMap::from([
            (ATTRIBUTE_PARENT_UUID.to_owned(), ExtraAttribute::String(parent.uuid.to_ascii_lowercase())),
            (ATTRIBUTE_PROFILE.to_owned(), ExtraAttribute::String(p.info.profile.to_string())),
            (ATTRIBUTE_PROFILE_ID.to_owned(), ExtraAttribute::Int(i64::from(p.info.profile_id))),
            (ATTRIBUTE_PLACEMENT_START.to_owned(), ExtraAttribute::Int(i64::from(p.start))),
            (ATTRIBUTE_PLACEMENT_SIZE.to_owned(), ExtraAttribute::Int(i64::from(size))),
        ]);
        devices.add(AllocatableDevice {
            name: device_name(parent.minor, p.info.profile_id, p.start, size),
            kind: DeviceType::Mig,
            gpu: parent.clone(),
            capacity: DeviceCapacity::default(),
            shared: false,
            extra: DeviceExtras {
                attributes,
                capacities,
                consumes_counters: vec![CounterConsumption { counter_set: set.clone(), counters: consumed }],
            },
        })?;
    }
    Ok(())
}

// === the mode ===

/// One MIG device to create for a claim (the checkpoint's record of the host action).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigAction {
    /// The allocated device (`gpu-<minor>-mig-<profileId>-<start>-<size>`).
    pub device: String,
    /// The device's name in the claim's CDI spec.
    pub cdi_name: String,
    /// The parent GPU's UUID (as the backend reports it).
    pub parent_uuid: String,
    /// The parent's minor (`/dev/nvidia<minor>`).
    pub parent_minor: u32,
    /// The profile (`3g.40gb`).
    pub profile: String,
    /// First memory slice.
    pub start: u32,
    /// Memory slices.
    pub size: u32,
}

/// The `DynamicMIG` claim mode (module docs).
#[derive(Clone)]
pub struct MigMode {
    backend: Arc<dyn DeviceBackend>,
}

impl std::fmt::Debug for MigMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MigMode").field("backend", &self.backend.name()).finish()
    }
}

impl MigMode {
    /// The mode over `backend` (the same backend the devices were published from).
    pub fn new(backend: Arc<dyn DeviceBackend>) -> Self {
        Self { backend }
    }

    /// The backend index of the GPU with this UUID, `None` when the node has no such GPU.
    fn index_of(&self, uuid: &str) -> Result<Option<u32>, ModeError> {
        let gpus = self.backend.devices().map_err(|e| ModeError::host(MODE, "list the GPUs", e))?;
        Ok(gpus.iter().find(|g| g.uuid.eq_ignore_ascii_case(uuid)).map(|g| g.index))
    }

    fn layout(&self, index: u32, uuid: &str) -> Result<MigLayout, ModeError> {
        self.backend
            .mig_layout(index)
            .map_err(|e| ModeError::host(MODE, format!("read the MIG layout of {uuid}"), e))
    }
}

/// The instance of `profile` at `start`, if any.
fn adoptable<'a>(layout: &'a MigLayout, profile: &MigProfile, start: u32) -> Option<&'a MigInstance> {
    layout.instances.iter().find(|i| i.placement_start == start && &i.profile == profile)
}

fn mask(start: u32, size: u32) -> u64 {
    (start..start.saturating_add(size)).filter(|&i| i < 64).fold(0, |m, i| m | (1u64 << i))
}

/// An instance other than an adoptable one whose placement overlaps `action`'s.
fn blocking<'a>(layout: &'a MigLayout, action: &MigAction, profile: &MigProfile) -> Option<&'a MigInstance> {
    let want = mask(action.start, action.size);
    layout.instances.iter().find(|i| {
        !(i.placement_start == action.start && &i.profile == profile)
            && mask(i.placement_start, i.placement_size) & want != 0
    })
}

fn overlap_message(action: &MigAction, other: &MigInstance) -> String {
    format!(
        "device {}: {} at memory slices {}..{} of GPU {} overlaps existing MIG instance {} ({} at {}..{})",
        action.device,
        action.profile,
        action.start,
        action.start + action.size,
        action.parent_uuid,
        other.uuid,
        other.profile,
        other.placement_start,
        other.placement_start + other.placement_size,
    )
}

fn int_attribute(device: &AllocatableDevice, name: &str) -> Result<u32, ModeError> {
    match device.extra.attributes.get(name) {
        Some(ExtraAttribute::Int(v)) => u32::try_from(*v).map_err(|_| {
            ModeError::claim(MODE, format!("device {}: attribute {name} = {v} is out of range", device.name))
        }),
        _ => Err(ModeError::claim(MODE, format!("device {} has no integer attribute {name}", device.name))),
    }
}

fn plan_device(device: &AllocatableDevice, cdi_name: &str) -> Result<MigAction, ModeError> {
    let profile = match device.extra.attributes.get(ATTRIBUTE_PROFILE) {
        Some(ExtraAttribute::String(p)) => p.clone(),
        _ => return Err(ModeError::claim(MODE, format!("device {} has no profile attribute", device.name))),
    };
    Ok(MigAction {
        device: device.name.clone(),
        cdi_name: cdi_name.to_owned(),
        parent_uuid: device.gpu.uuid.clone(),
        parent_minor: device.gpu.minor,
        profile,
        start: int_attribute(device, ATTRIBUTE_PLACEMENT_START)?,
        size: int_attribute(device, ATTRIBUTE_PLACEMENT_SIZE)?,
    })
}

fn parse_profile(action: &MigAction) -> Result<MigProfile, ModeError> {
    action.profile.parse().map_err(|e| ModeError::claim(MODE, format!("device {}: {e}", action.device)))
}

/// The `DeviceFileMinor:` of a capability `access` file, `None` when absent or unreadable.
fn cap_minor(file: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|l| l.trim().strip_prefix("DeviceFileMinor:")).and_then(|v| v.trim().parse().ok())
}

/// The device nodes of a MIG instance (module docs): the parent's node, then the GI and CI capability nodes
/// found under `container_driver_root`.
pub fn instance_nodes(
    container_driver_root: &Path,
    parent_minor: u32,
    instance: &MigInstance,
) -> Vec<String> {
    let mut nodes = vec![format!("/dev/nvidia{parent_minor}")];
    let gi: PathBuf = container_driver_root.join(format!(
        "proc/driver/nvidia/capabilities/gpu{parent_minor}/mig/gi{}",
        instance.gpu_instance_id
    ));
    for file in [gi.join("access"), gi.join(format!("ci{}", instance.compute_instance_id)).join("access")] {
        if let Some(n) = cap_minor(&file) {
            nodes.push(format!("/dev/nvidia-caps/nvidia-cap{n}"));
        }
    }
    nodes
}

impl ClaimMode for MigMode {
    fn name(&self) -> &'static str {
        MODE
    }

    fn gate(&self) -> &'static str {
        GATE
    }

    fn plan(&self, ctx: &ClaimContext<'_>) -> Result<Vec<serde_json::Value>, ModeError> {
        let mut actions: Vec<MigAction> = Vec::new();
        for d in ctx.devices.iter().filter(|d| d.device.kind == DeviceType::Mig) {
            let action = plan_device(&d.device, &d.cdi_name)?;
            let profile = parse_profile(&action)?;
            if let Some(other) = actions.iter().find(|a| {
                a.parent_uuid == action.parent_uuid
                    && mask(a.start, a.size) & mask(action.start, action.size) != 0
            }) {
                return Err(ModeError::claim(
                    MODE,
                    format!(
                        "devices {} and {} of the claim overlap on GPU {}",
                        other.device, action.device, action.parent_uuid
                    ),
                ));
            }
            let index = self.index_of(&action.parent_uuid)?.ok_or_else(|| {
                ModeError::claim(
                    MODE,
                    format!("device {}: GPU {} is not on this node", action.device, action.parent_uuid),
                )
            })?;
            let layout = self.layout(index, &action.parent_uuid)?;
            if layout.mode != GpuMigMode::Enabled {
                return Err(ModeError::claim(
                    MODE,
                    format!(
                        "device {}: MIG mode of GPU {} is {}",
                        action.device, action.parent_uuid, layout.mode
                    ),
                ));
            }
            if let Some(other) = blocking(&layout, &action, &profile) {
                return Err(ModeError::claim(MODE, overlap_message(&action, other)));
            }
            actions.push(action);
        }
        actions.iter().map(|a| encode(MODE, a)).collect()
    }

    fn apply(&self, ctx: &ClaimContext<'_>, action: &serde_json::Value) -> Result<ModeEdits, ModeError> {
        let action: MigAction = decode(MODE, action)?;
        let profile = parse_profile(&action)?;
        let index = self.index_of(&action.parent_uuid)?.ok_or_else(|| {
            ModeError::claim(
                MODE,
                format!("device {}: GPU {} is not on this node", action.device, action.parent_uuid),
            )
        })?;
        let layout = self.layout(index, &action.parent_uuid)?;
        let instance = match adoptable(&layout, &profile, action.start) {
            Some(existing) => existing.clone(),
            None => {
                if let Some(other) = blocking(&layout, &action, &profile) {
                    return Err(ModeError::claim(MODE, overlap_message(&action, other)));
                }
                self.backend.create_mig_device(index, &profile, action.start).map_err(|e| {
                    ModeError::host(
                        MODE,
                        format!(
                            "create {} at memory slice {} on GPU {}",
                            action.profile, action.start, action.parent_uuid
                        ),
                        e,
                    )
                })?
            }
        };
        tracing::info!(claim = %ctx.claim.uid, device = %action.device, mig = %instance.uuid, "MIG device ready");
        let nodes = instance_nodes(&ctx.config.container_driver_root, action.parent_minor, &instance)
            .iter()
            .map(|n| DeviceNode::under(n, &ctx.config.host_driver_root))
            .collect();
        let edits = ContainerEdits {
            env: vec![
                format!("NVIDIA_VISIBLE_DEVICES={}", instance.uuid),
                format!("CUDA_VISIBLE_DEVICES={}", instance.uuid),
            ],
            device_nodes: nodes,
            mounts: Vec::new(),
            ..ContainerEdits::default()
        };
        let mut out = ModeEdits::default();
        out.devices.insert(action.cdi_name.clone(), edits);
        Ok(out)
    }

    fn revert(&self, action: &serde_json::Value) -> Result<(), ModeError> {
        let action: MigAction = decode(MODE, action)?;
        let profile = parse_profile(&action)?;
        let Some(index) = self.index_of(&action.parent_uuid)? else {
            tracing::warn!(device = %action.device, gpu = %action.parent_uuid, "GPU gone: no MIG instance to destroy");
            return Ok(());
        };
        let layout = self.layout(index, &action.parent_uuid)?;
        let Some(instance) = adoptable(&layout, &profile, action.start) else {
            return Ok(());
        };
        self.backend.destroy_mig_device(index, instance.gpu_instance_id).map_err(|e| {
            ModeError::host(
                MODE,
                format!(
                    "destroy MIG instance {} (GPU instance {}) on GPU {}",
                    instance.uuid, instance.gpu_instance_id, action.parent_uuid
                ),
                e,
            )
        })?;
        tracing::info!(device = %action.device, mig = %instance.uuid, "MIG device destroyed");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use vgpu_core::backend::mock::MockBackend;

    use crate::devices::DeviceConfig;

    const A100: &str = "gpus:\n  - { uuid: GPU-M, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, minor: 3, mig: { mode: Enabled } }\n  - { uuid: GPU-P, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, minor: 4, mig: { mode: Disabled } }\n";

    fn published(vgpu: bool) -> AllocatableDevices {
        let backend = MockBackend::from_yaml_str(A100).unwrap();
        let config = DeviceConfig { vgpu_support: vgpu, ..DeviceConfig::default() };
        let mut devices = AllocatableDevices::from_backend(&backend, &config).unwrap();
        assert_eq!(publish(&mut devices, &backend).unwrap(), 1);
        devices
    }

    #[test]
    fn one_device_per_placement_and_one_counter_set() {
        let devices = published(true);
        let mig: Vec<_> =
            devices.iter().filter(|d| d.kind == DeviceType::Mig).map(|d| d.name.as_str()).collect();
        // 7 + 7 + 4 + 3 + 2 + 1 + 1 placements of the A100 80GB table.
        assert_eq!(mig.len(), 25, "{mig:?}");
        assert!(mig.contains(&"gpu-3-mig-0-0-8") && mig.contains(&"gpu-3-mig-19-6-1"));
        assert!(devices.get("vgpu-4").is_some(), "the MIG-disabled GPU stays a vGPU");
        assert!(devices.get("vgpu-3").is_none());
        let sets = devices.counter_sets();
        assert_eq!(sets.len(), 1);
        assert_eq!(sets[0].name, "gpu-3-counter-set");
        assert_eq!(sets[0].counters.len(), 10, "memory, compute-slices, 8 memory slices");
        assert_eq!(sets[0].counters["memory"], Amount::Bytes(8 * 9856 * MIB));
        assert_eq!(sets[0].counters["compute-slices"], Amount::Count(7));

        let d = devices.get("gpu-3-mig-9-4-4").unwrap();
        assert_eq!(d.extra.attributes[ATTRIBUTE_PROFILE], ExtraAttribute::String("3g.40gb".into()));
        assert_eq!(d.extra.attributes[ATTRIBUTE_PARENT_UUID], ExtraAttribute::String("gpu-m".into()));
        let consumed = &d.extra.consumes_counters[0].counters;
        let slices: Vec<_> = consumed.keys().filter(|k| k.starts_with("memory-slice-")).cloned().collect();
        assert_eq!(slices, ["memory-slice-4", "memory-slice-5", "memory-slice-6", "memory-slice-7"]);
        assert_eq!(consumed["compute-slices"], Amount::Count(3));
        assert_eq!(d.extra.capacities["memorySlice4"], Amount::Count(1));
        assert!(!d.shared);
    }

    #[test]
    fn the_whole_gpu_consumes_everything() {
        let devices = published(false);
        let whole = devices.get("gpu-3").unwrap();
        assert_eq!(whole.extra.consumes_counters.len(), 1);
        assert_eq!(whole.extra.consumes_counters[0].counters, devices.counter_sets()[0].counters);
        assert!(devices.get("gpu-4").unwrap().extra.consumes_counters.is_empty());
    }

    #[test]
    fn other_vendors_and_unknown_models_are_left_alone() {
        let yaml = "gpus:\n  - { uuid: GPU-A30, name: NVIDIA A30, memoryMiB: 24576, minor: 0, mig: { mode: Enabled } }\n  - { uuid: GPU-NVL, name: NVIDIA H100 NVL, memoryMiB: 95830, minor: 1, mig: { mode: Enabled } }\n  - { uuid: MX-0, name: MXC500, vendor: metax, memoryMiB: 65536, minor: 2 }\n";
        let backend = MockBackend::from_yaml_str(yaml).unwrap();
        let mut devices = AllocatableDevices::from_backend(&backend, &DeviceConfig::default()).unwrap();
        let before: Vec<_> = devices.iter().map(|d| d.name.clone()).collect();
        assert_eq!(publish(&mut devices, &backend).unwrap(), 1, "only the A30 has a MIG table");
        let added: Vec<_> =
            devices.iter().filter(|d| !before.contains(&d.name)).map(|d| d.name.as_str()).collect();
        assert_eq!(added.len(), 4 + 4 + 2 + 2 + 1, "{added:?}");
        assert!(added.iter().all(|n| n.starts_with("gpu-0-mig-")));
        let set = &devices.counter_sets()[0];
        assert_eq!((set.name.as_str(), set.counters.len()), ("gpu-0-counter-set", 6), "4 memory slices");
        assert_eq!(set.counters["compute-slices"], Amount::Count(4));
    }

    #[test]
    fn actions_round_trip_and_overlap_masks() {
        let action = MigAction {
            device: "gpu-0-mig-9-0-4".into(),
            cdi_name: "uid-gpu".into(),
            parent_uuid: "GPU-M".into(),
            parent_minor: 0,
            profile: "3g.40gb".into(),
            start: 0,
            size: 4,
        };
        let v = encode(MODE, &action).unwrap();
        assert_eq!(v["parentUuid"], "GPU-M");
        assert_eq!(decode::<MigAction>(MODE, &v).unwrap(), action);
        assert_eq!(mask(4, 4), 0xf0);
        assert_eq!(mask(6, 1) & mask(4, 4), 1 << 6);
        assert_eq!(mask(0, 2) & mask(2, 2), 0);
    }

    #[test]
    fn capability_nodes_from_the_proc_tree() {
        let root = tempfile::tempdir().unwrap();
        let gi = root.path().join("proc/driver/nvidia/capabilities/gpu2/mig/gi5");
        std::fs::create_dir_all(gi.join("ci0")).unwrap();
        std::fs::write(gi.join("access"), "DeviceFileMinor: 48\nDeviceFileMode: 292\n").unwrap();
        std::fs::write(gi.join("ci0/access"), "DeviceFileMinor: 49\n").unwrap();
        let instance = MigInstance {
            uuid: "MIG-x".into(),
            profile: "1g.10gb".parse().unwrap(),
            gpu_instance_id: 5,
            compute_instance_id: 0,
            placement_start: 0,
            placement_size: 1,
            memory_mib: 1,
            memory_used_bytes: None,
        };
        assert_eq!(
            instance_nodes(root.path(), 2, &instance),
            ["/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap48", "/dev/nvidia-caps/nvidia-cap49"]
        );
        assert_eq!(instance_nodes(root.path(), 3, &instance), ["/dev/nvidia3"], "no caps files: parent only");
    }
}

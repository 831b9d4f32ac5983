//! The vendor-neutral device backend seam ([`DeviceBackend`]) and the [`mock`] backend.
//!
//! Node-side programs (device plugin, DRA kubelet plugin, device monitor) talk to GPUs only through
//! [`DeviceBackend`]: enumerate devices ([`GpuDevice`]), read memory use, the GPU-to-GPU link matrix, a stream
//! of health events, running processes with their utilization samples, and the MIG layout. NVML and MetaX
//! implement it in `vgpu-nvml`; [`mock::MockBackend`] implements it from a YAML/JSON description so every
//! binary runs without GPUs (`--backend mock --mock-config FILE`). The [`crate::discovery`] module is the
//! vendor-neutral sysfs scan that backends can use to find PCI facts the vendor library does not give.
//!
//! Submodules: [`health`] (events and their runtime-agnostic channel), [`links`] (link codes and matrix),
//! [`types`] (memory, processes, samples, MIG), [`compute`] (compute mode and time slice), [`mig`] (MIG profiles and placement rules of each model,
//! the packing of a requested layout), [`vendor`] (the container edits of each vendor:
//! [`VendorAdapter`], chosen by [`DeviceBackend::vendor_adapter`]), [`mock`], [`error`].
//!
//! ```
//! use vgpu_core::backend::{BackendKind, DeviceBackend, mock::MockBackend};
//!
//! let yaml = "gpus:\n  - uuid: GPU-0\n    name: NVIDIA A30\n    memoryMiB: 24576\n    computeCapability: '8.0'\n";
//! let backend: Box<dyn DeviceBackend> = Box::new(MockBackend::from_yaml_str(yaml)?);
//! assert_eq!("mock".parse::<BackendKind>(), Ok(BackendKind::Mock));
//! let devices = backend.devices()?;
//! assert_eq!(devices[0].type_name, "NVIDIA A30");
//! assert_eq!(backend.memory_usage(0)?.free_bytes(), 24576 << 20);
//! # Ok::<(), vgpu_core::backend::BackendError>(())
//! ```

pub mod compute;
pub mod error;
pub mod health;
pub mod links;
pub mod mig;
pub mod mock;
pub mod types;
pub mod vendor;

use std::{fmt, str::FromStr, sync::Arc};

pub use self::{
    compute::{ComputeMode, TimeSlice, UnknownTimeSlice},
    error::{BackendError, MockConfigError},
    health::{HealthEvent, HealthEventKind, HealthEventSender, HealthEvents, health_channel},
    links::{LinkCode, LinkMatrix},
    types::{
        DriverVersions, GpuProcess, MemoryUsage, MigInstance, MigLayout, MigMode, MigPlacement, MigProfile,
        MigProfileInfo, ProcessKind, ProcessUtilizationSample,
    },
    vendor::{MetaxAdapter, NvidiaAdapter, VendorAdapter},
};
use crate::model::{GpuDevice, NodeDeviceInventory};

/// Parses a PCI device id as mig-parted and NVML tools write it: `0x` (or `0X`) and 1 to 8 hex digits
/// (`0x20B010DE`); `None` for anything else.
pub fn parse_pci_device_id(text: &str) -> Option<u32> {
    let digits = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X"))?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(digits, 16).ok()
}

/// Access to the GPUs of one node, whatever their vendor.
///
/// Devices are addressed by their index (`GpuDevice::index`, `0..n`). Implementations must be cheap to call
/// repeatedly and safe to share between threads; they never panic, every failure is a [`BackendError`].
pub trait DeviceBackend: Send + Sync {
    /// A short name for logs and errors (`nvml`, `metax`, `mock`).
    fn name(&self) -> &'static str;

    /// The node's GPUs, ordered by index.
    fn devices(&self) -> Result<Vec<GpuDevice>, BackendError>;

    /// Memory of one GPU.
    fn memory_usage(&self, index: u32) -> Result<MemoryUsage, BackendError>;

    /// Links between every pair of GPUs, by index.
    fn topology(&self) -> Result<LinkMatrix, BackendError>;

    /// Subscribes to health events. Each call returns a new receiver that sees the events from then on; the
    /// stream ends when the backend stops watching (e.g. it is dropped).
    fn health_events(&self) -> Result<HealthEvents, BackendError>;

    /// Processes running on one GPU.
    fn processes(&self, index: u32) -> Result<Vec<GpuProcess>, BackendError>;

    /// Per-process utilization samples of one GPU taken after `since_timestamp_us` (microseconds since the Unix
    /// epoch; `0` for all the driver keeps).
    fn process_utilization(
        &self,
        index: u32,
        since_timestamp_us: u64,
    ) -> Result<Vec<ProcessUtilizationSample>, BackendError>;

    /// MIG mode and instances of one GPU ([`MigMode::NotSupported`] for GPUs that cannot be partitioned).
    fn mig_layout(&self, index: u32) -> Result<MigLayout, BackendError>;

    /// The MIG profiles one GPU offers, with their placements. MIG control (this and the next three
    /// methods) is optional: the defaults answer [`BackendError::NotSupported`].
    fn mig_profiles(&self, index: u32) -> Result<Vec<MigProfileInfo>, BackendError> {
        let _ = index;
        Err(BackendError::NotSupported { backend: self.name(), operation: "listing MIG profiles" })
    }

    /// Turns MIG mode on or off. Refused ([`BackendError::Mig`]) while MIG instances exist.
    fn set_mig_mode(&self, index: u32, enabled: bool) -> Result<(), BackendError> {
        let _ = (index, enabled);
        Err(BackendError::NotSupported { backend: self.name(), operation: "setting the MIG mode" })
    }

    /// Creates one MIG device: a GPU instance of `profile` at memory slice `placement_start` and one compute
    /// instance spanning it. Refused ([`BackendError::Mig`]) for an unknown profile, a start the profile does
    /// not allow, or a placement that overlaps an existing instance.
    fn create_mig_device(
        &self,
        index: u32,
        profile: &MigProfile,
        placement_start: u32,
    ) -> Result<MigInstance, BackendError> {
        let _ = (index, profile, placement_start);
        Err(BackendError::NotSupported { backend: self.name(), operation: "creating MIG instances" })
    }

    /// Destroys a MIG device: the compute instances of GPU instance `gpu_instance_id`, then the GPU instance.
    fn destroy_mig_device(&self, index: u32, gpu_instance_id: u32) -> Result<(), BackendError> {
        let _ = (index, gpu_instance_id);
        Err(BackendError::NotSupported { backend: self.name(), operation: "destroying MIG instances" })
    }

    /// Resets the GPU, which applies a pending MIG mode ([`mig::MigError::ResetRequired`]). Refused
    /// ([`BackendError::ResetRefused`]) while processes use the GPU; the default answers
    /// [`BackendError::NotSupported`] (the node must then be rebooted).
    fn reset_gpu(&self, index: u32) -> Result<(), BackendError> {
        let _ = index;
        Err(BackendError::NotSupported { backend: self.name(), operation: "resetting the GPU" })
    }

    /// The GPU's compute mode ([`compute`]). Sharing control (this and the next two methods) is optional:
    /// the defaults answer [`BackendError::NotSupported`].
    fn compute_mode(&self, index: u32) -> Result<ComputeMode, BackendError> {
        let _ = index;
        Err(BackendError::NotSupported { backend: self.name(), operation: "reading the compute mode" })
    }

    /// Sets the GPU's compute mode (MPS needs [`ComputeMode::ExclusiveProcess`]); setting the current mode
    /// again changes nothing.
    fn set_compute_mode(&self, index: u32, mode: ComputeMode) -> Result<(), BackendError> {
        let _ = (index, mode);
        Err(BackendError::NotSupported { backend: self.name(), operation: "setting the compute mode" })
    }

    /// Sets the GPU's time-slice length for processes that share it ([`TimeSlice`]).
    fn set_time_slice(&self, index: u32, slice: TimeSlice) -> Result<(), BackendError> {
        let _ = (index, slice);
        Err(BackendError::NotSupported { backend: self.name(), operation: "setting the time slice" })
    }

    /// The character-device minor number of one GPU (`/dev/nvidia<minor>`, used for the device plugin's
    /// `DeviceSpecs`). The default, for backends without device nodes of that shape, is the index.
    fn minor_number(&self, index: u32) -> Result<u32, BackendError> {
        Ok(index)
    }

    /// The GPU's PCI device id as NVML reports it (`pciDeviceId`: device id in the high 16 bits, vendor id in the
    /// low ones, e.g. `0x20B010DE` for an A100 40GB): what mig-parted's `device-filter` matches. The default
    /// answers [`BackendError::NotSupported`].
    fn pci_device_id(&self, index: u32) -> Result<u32, BackendError> {
        let _ = index;
        Err(BackendError::NotSupported { backend: self.name(), operation: "reading the PCI device id" })
    }

    /// The driver and CUDA driver API versions; `None` (the default) for backends that have none to report.
    fn driver_versions(&self) -> Result<Option<DriverVersions>, BackendError> {
        Ok(None)
    }

    /// What a container needs to use these GPUs (device nodes, visible-devices env, CDI kind); see
    /// [`vendor`]. The default is [`NvidiaAdapter`] (NVML, and the mock whatever its GPUs' vendor).
    fn vendor_adapter(&self) -> Result<Arc<dyn VendorAdapter>, BackendError> {
        Ok(Arc::new(NvidiaAdapter))
    }

    /// The devices as a node inventory.
    fn inventory(&self) -> Result<NodeDeviceInventory, BackendError> {
        self.devices().map(NodeDeviceInventory::new)
    }
}

impl<B: DeviceBackend + ?Sized> DeviceBackend for Box<B> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn devices(&self) -> Result<Vec<GpuDevice>, BackendError> {
        (**self).devices()
    }
    fn memory_usage(&self, index: u32) -> Result<MemoryUsage, BackendError> {
        (**self).memory_usage(index)
    }
    fn minor_number(&self, index: u32) -> Result<u32, BackendError> {
        (**self).minor_number(index)
    }
    fn topology(&self) -> Result<LinkMatrix, BackendError> {
        (**self).topology()
    }
    fn health_events(&self) -> Result<HealthEvents, BackendError> {
        (**self).health_events()
    }
    fn processes(&self, index: u32) -> Result<Vec<GpuProcess>, BackendError> {
        (**self).processes(index)
    }
    fn process_utilization(
        &self,
        index: u32,
        since_timestamp_us: u64,
    ) -> Result<Vec<ProcessUtilizationSample>, BackendError> {
        (**self).process_utilization(index, since_timestamp_us)
    }
    fn mig_layout(&self, index: u32) -> Result<MigLayout, BackendError> {
        (**self).mig_layout(index)
    }
    fn mig_profiles(&self, index: u32) -> Result<Vec<MigProfileInfo>, BackendError> {
        (**self).mig_profiles(index)
    }
    fn set_mig_mode(&self, index: u32, enabled: bool) -> Result<(), BackendError> {
        (**self).set_mig_mode(index, enabled)
    }
    fn create_mig_device(
        &self,
        index: u32,
        profile: &MigProfile,
        placement_start: u32,
    ) -> Result<MigInstance, BackendError> {
        (**self).create_mig_device(index, profile, placement_start)
    }
    fn destroy_mig_device(&self, index: u32, gpu_instance_id: u32) -> Result<(), BackendError> {
        (**self).destroy_mig_device(index, gpu_instance_id)
    }
    fn reset_gpu(&self, index: u32) -> Result<(), BackendError> {
        (**self).reset_gpu(index)
    }
    fn pci_device_id(&self, index: u32) -> Result<u32, BackendError> {
        (**self).pci_device_id(index)
    }
    fn driver_versions(&self) -> Result<Option<DriverVersions>, BackendError> {
        (**self).driver_versions()
    }
    fn compute_mode(&self, index: u32) -> Result<ComputeMode, BackendError> {
        (**self).compute_mode(index)
    }
    fn set_compute_mode(&self, index: u32, mode: ComputeMode) -> Result<(), BackendError> {
        (**self).set_compute_mode(index, mode)
    }
    fn set_time_slice(&self, index: u32, slice: TimeSlice) -> Result<(), BackendError> {
        (**self).set_time_slice(index, slice)
    }
    fn vendor_adapter(&self) -> Result<Arc<dyn VendorAdapter>, BackendError> {
        (**self).vendor_adapter()
    }
}

/// Which backend a binary uses (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BackendKind {
    /// NVIDIA NVML (`vgpu-nvml`).
    #[default]
    Nvml,
    /// MetaX MXSML (`vgpu-nvml`).
    MetaX,
    /// [`mock::MockBackend`], from `--mock-config`.
    Mock,
}

/// The text is not a backend name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown backend {0:?}: expected nvml, metax or mock")]
pub struct UnknownBackend(pub String);

impl FromStr for BackendKind {
    type Err = UnknownBackend;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "nvml" | "nvidia" => Ok(Self::Nvml),
            "metax" | "mxsml" => Ok(Self::MetaX),
            "mock" => Ok(Self::Mock),
            _ => Err(UnknownBackend(crate::discovery::fields::excerpt(s))),
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Nvml => "nvml",
            Self::MetaX => "metax",
            Self::Mock => "mock",
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::parse_pci_device_id;
    use proptest::prelude::*;

    #[test]
    fn pci_device_ids() {
        assert_eq!(parse_pci_device_id("0x20B010DE"), Some(0x20B0_10DE));
        assert_eq!(parse_pci_device_id("0X20b010de"), Some(0x20B0_10DE));
        assert_eq!(parse_pci_device_id("0x10DE"), Some(0x10DE));
        for bad in ["", "0x", "20B010DE", "0x20B010DE0", "0x20B0 10DE", "0x+1", "0xG0"] {
            assert_eq!(parse_pci_device_id(bad), None, "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn pci_device_ids_round_trip(id in any::<u32>(), upper in any::<bool>()) {
            let text = if upper { format!("0x{id:08X}") } else { format!("0x{id:x}") };
            prop_assert_eq!(parse_pci_device_id(&text), Some(id));
        }

        #[test]
        fn a_parsed_id_is_written_as_given(text in "\\PC{0,12}") {
            if let Some(id) = parse_pci_device_id(&text) {
                prop_assert_eq!(u32::from_str_radix(&text[2..], 16).ok(), Some(id));
            }
        }
    }
}

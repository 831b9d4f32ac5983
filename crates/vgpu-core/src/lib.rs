//! vgpu-core: the shared vocabulary of vgpu, with no Kubernetes client dependency.
//!
//! Domain model, annotation codecs (wire-compatible with vgpu-manager), node config, device
//! backends, sysfs/PCI discovery, allocators and topology scoring.
//!
//! Module map:
//! - [`backend`]: the vendor-neutral `DeviceBackend` seam (devices, memory, links, health, processes, MIG) and a mock.
//! - [`discovery`]: vendor-neutral GPU scan of sysfs, `pci.ids` naming, vendor table, bare-metal detection.

pub mod backend;
pub mod discovery;
pub mod domain;
pub mod model;

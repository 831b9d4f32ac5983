//! vgpu-nvml: the NVIDIA and MetaX device backends of vgpu.
//!
//! This crate will implement `vgpu-core`'s `DeviceBackend` trait over NVML (`nvml-wrapper`,
//! loading the driver library at run time) and over MetaX's sysfs entries and management library,
//! so the device plugin, DRA plugin and monitor never branch on the vendor. The backends are
//! tracked in issue #7; for now the crate holds the library names and search paths they load.
//!
//! ```
//! use vgpu_nvml::{METAX_LIBRARY_DIRS, NVML_LIBRARY};
//!
//! assert_eq!(NVML_LIBRARY, "libnvidia-ml.so.1");
//! assert!(METAX_LIBRARY_DIRS.contains(&"/opt/mxdriver/lib"));
//! ```

/// The NVML shared library loaded at run time.
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";
/// The MetaX management library.
pub const METAX_LIBRARY: &str = "libmxsml.so";
/// Where the MetaX management library is searched, in order.
pub const METAX_LIBRARY_DIRS: &[&str] = &["/opt/mxdriver/lib", "/opt/maca/lib", "/opt/mxn100/lib"];
/// PCI vendor id of NVIDIA.
pub const NVIDIA_PCI_VENDOR: u16 = 0x10de;
/// PCI vendor id of MetaX.
pub const METAX_PCI_VENDOR: u16 = 0x9999;

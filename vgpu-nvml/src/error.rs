//! Errors of this crate.

use std::path::PathBuf;

use vgpu_core::{
    backend::{BackendError, MockConfigError},
    discovery::DiscoveryError,
};

/// What to check when the NVIDIA driver library cannot be loaded.
pub const DRIVER_HINT: &str = "check that the NVIDIA driver is installed on this node (`nvidia-smi` works), that \
     the directory holding libnvidia-ml.so.1 is known to the dynamic loader (ldconfig or LD_LIBRARY_PATH), and, \
     in a container, that the NVIDIA container toolkit mounts the driver libraries (runtime class `nvidia` or \
     NVIDIA_VISIBLE_DEVICES/NVIDIA_DRIVER_CAPABILITIES set)";

/// A backend could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The NVML library (`libnvidia-ml.so.1`) could not be loaded: no driver, or not visible.
    #[error("NVIDIA driver library {library} not found ({detail}); {hint}", hint = DRIVER_HINT)]
    DriverNotFound {
        /// The library name or path that was tried.
        library: String,
        /// The loader's message.
        detail: String,
    },
    /// The library loaded but NVML did not initialise (kernel module not loaded, version mismatch, ...).
    #[error("NVML initialisation failed: {message}")]
    NvmlInit {
        /// What NVML said, with a hint.
        message: String,
    },
    /// The PCI scan failed.
    #[error("cannot scan the PCI bus: {0}")]
    Discovery(#[from] DiscoveryError),
    /// `auto` found no GPU of a supported vendor.
    #[error(
        "no NVIDIA (10de) or MetaX (9999) GPU found under {}/bus/pci/devices; pass --backend nvml|metax|mock \
         explicitly, or --sysfs-root if sysfs is mounted elsewhere",
        sysfs_root.display()
    )]
    NoGpus {
        /// The sysfs root scanned.
        sysfs_root: PathBuf,
    },
    /// `--backend mock` without a description file.
    #[error("the mock backend needs a description file (--mock-config FILE)")]
    MockConfigMissing,
    /// The mock description is invalid.
    #[error(transparent)]
    Mock(#[from] MockConfigError),
    /// The MetaX management library was found but is unusable.
    #[error("cannot use the MetaX management library {}: {message}", path.display())]
    MetaxLibrary {
        /// The library file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// A backend call failed while opening.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

//! Backend selection for the binaries' `--backend auto|nvml|metax|mock` (`--mock-config FILE`).

use std::{fmt, path::PathBuf, str::FromStr};

use vgpu_core::{
    backend::{BackendKind, DeviceBackend, mock::MockBackend},
    discovery::{self, DiscoveryConfig, VendorTable},
};

use crate::{
    METAX_PCI_VENDOR, NVIDIA_PCI_VENDOR,
    error::Error,
    metax::{MetaxBackend, MetaxOptions},
    nvml::{DriverInfo, NvmlBackend, NvmlOptions},
};

/// The `--backend` value: a backend, or `auto` to pick by the GPUs on the PCI bus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BackendChoice {
    /// NVIDIA if an NVIDIA GPU is on the PCI bus, else MetaX if a MetaX GPU is, else an error.
    #[default]
    Auto,
    /// This backend.
    Kind(BackendKind),
}

/// The text is not `auto`, `nvml`, `metax` or `mock`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown backend {0:?}: expected auto, nvml, metax or mock")]
pub struct UnknownChoice(pub String);

impl FromStr for BackendChoice {
    type Err = UnknownChoice;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().eq_ignore_ascii_case("auto") {
            return Ok(Self::Auto);
        }
        s.parse().map(Self::Kind).map_err(|_| UnknownChoice(s.chars().take(40).collect()))
    }
}

impl fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Kind(kind) => kind.fmt(f),
        }
    }
}

/// What [`open_backend`] needs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SelectOptions {
    /// The mock description (`--mock-config`), required for `mock`.
    pub mock_config: Option<PathBuf>,
    /// NVML options (its `sysfs_root` is also the one `auto` scans).
    pub nvml: NvmlOptions,
    /// MetaX options.
    pub metax: MetaxOptions,
}

impl SelectOptions {
    /// Uses `sysfs_root` for the `auto` scan and both backends.
    pub fn with_sysfs_root(mut self, sysfs_root: impl Into<PathBuf>) -> Self {
        let root = sysfs_root.into();
        self.nvml.sysfs_root.clone_from(&root);
        self.metax.sysfs_root = root;
        self
    }

    /// Sets the mock description file.
    pub fn with_mock_config(mut self, path: impl Into<PathBuf>) -> Self {
        self.mock_config = Some(path.into());
        self
    }
}

/// An opened backend with what the caller may want to show besides the devices.
pub struct OpenedBackend {
    /// The backend.
    pub backend: Box<dyn DeviceBackend>,
    /// Which backend was opened (never `auto`).
    pub kind: BackendKind,
    /// Driver versions (NVML only).
    pub driver: Option<DriverInfo>,
    /// What the backend could not read (MetaX without its library, ...).
    pub warnings: Vec<String>,
}

impl fmt::Debug for OpenedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenedBackend")
            .field("backend", &self.backend.name())
            .field("kind", &self.kind)
            .field("driver", &self.driver)
            .field("warnings", &self.warnings)
            .finish()
    }
}

/// Decides the backend for `auto` from the vendors on the PCI bus under `sysfs_root`.
pub fn detect_backend(sysfs_root: &std::path::Path) -> Result<BackendKind, Error> {
    let config = DiscoveryConfig::default()
        .with_sysfs_root(sysfs_root)
        .with_pci_ids_paths(Vec::<PathBuf>::new())
        .with_vendors(VendorTable::builtin());
    let report = discovery::discover(&config)?;
    let has = |vendor: u16| report.gpus.iter().any(|g| g.vendor_id == vendor);
    if has(NVIDIA_PCI_VENDOR) {
        Ok(BackendKind::Nvml)
    } else if has(METAX_PCI_VENDOR) {
        Ok(BackendKind::MetaX)
    } else {
        Err(Error::NoGpus { sysfs_root: sysfs_root.to_path_buf() })
    }
}

/// Opens the chosen backend.
pub fn open_backend(choice: BackendChoice, options: &SelectOptions) -> Result<OpenedBackend, Error> {
    let kind = match choice {
        BackendChoice::Auto => detect_backend(&options.nvml.sysfs_root)?,
        BackendChoice::Kind(kind) => kind,
    };
    match kind {
        BackendKind::Nvml => {
            let backend = NvmlBackend::new(options.nvml.clone())?;
            let driver = backend.driver_info().ok();
            Ok(OpenedBackend { backend: Box::new(backend), kind, driver, warnings: Vec::new() })
        }
        BackendKind::MetaX => {
            let backend = MetaxBackend::new(options.metax.clone())?;
            let warnings = backend.warnings().to_vec();
            Ok(OpenedBackend { backend: Box::new(backend), kind, driver: None, warnings })
        }
        BackendKind::Mock => {
            let path = options.mock_config.as_deref().ok_or(Error::MockConfigMissing)?;
            let backend = MockBackend::from_path(path)?;
            Ok(OpenedBackend { backend: Box::new(backend), kind, driver: None, warnings: Vec::new() })
        }
    }
}

/// Opens the chosen backend, as a trait object.
///
/// ```
/// use vgpu_nvml::select::{BackendChoice, SelectOptions, select_backend};
///
/// let options = SelectOptions::default().with_mock_config(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/mock/dgx-h100-8gpu.yaml"));
/// let backend = select_backend("mock".parse()?, &options)?;
/// assert_eq!(backend.devices()?.len(), 8);
///
/// let empty = tempfile::tempdir()?;
/// std::fs::create_dir_all(empty.path().join("bus/pci/devices"))?;
/// let err = select_backend(BackendChoice::Auto, &SelectOptions::default().with_sysfs_root(empty.path())).err().unwrap();
/// assert!(err.to_string().starts_with("no NVIDIA (10de) or MetaX (9999) GPU found"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn select_backend(
    choice: BackendChoice,
    options: &SelectOptions,
) -> Result<Box<dyn DeviceBackend>, Error> {
    open_backend(choice, options).map(|opened| opened.backend)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_parse() {
        assert_eq!("AUTO".parse(), Ok(BackendChoice::Auto));
        assert_eq!("nvidia".parse(), Ok(BackendChoice::Kind(BackendKind::Nvml)));
        assert_eq!("metax".parse::<BackendChoice>().map(|c| c.to_string()), Ok("metax".to_owned()));
        assert!("cuda".parse::<BackendChoice>().is_err());
    }

    #[test]
    fn mock_needs_a_file() {
        let err = open_backend(BackendChoice::Kind(BackendKind::Mock), &SelectOptions::default()).err();
        assert!(matches!(err, Some(Error::MockConfigMissing)));
    }
}

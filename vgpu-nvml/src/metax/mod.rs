//! The MetaX backend: [`MetaxBackend`], GPUs (PCI vendor `9999`) found in sysfs, described further by the
//! management library `libmxsml.so` when it is installed.
//!
//! Without the library the backend still lists every MetaX GPU from sysfs, and says in
//! [`MetaxBackend::warnings`] what it could not read: the memory size (reported as 0 MiB), the vendor
//! UUID (replaced by `METAX-<pci address>`), utilisation and topology beyond the NUMA node. Device nodes are
//! the control device `/dev/mxcd` and each GPU's DRM nodes (`/dev/dri/cardN`, `/dev/dri/renderDN`, found
//! through `<sysfs>/bus/pci/devices/<address>/drm`). The backend's vendor adapter
//! ([`vgpu_core::backend::MetaxAdapter`], from `vendor_adapter`) hands these to the device plugin as container
//! paths (`/dev/dri/card1`, `/dev/mxcd`), so `Allocate` and the CDI spec pass MetaX nodes, not NVIDIA ones.
//! All paths are options, so tests run on fake trees.
//!
//! The library calls live in the `ffi` submodule, the only place of the crate allowed to use `unsafe`.

mod ffi;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError},
};

use vgpu_core::{
    backend::{
        BackendError, DeviceBackend, GpuProcess, HealthEventSender, HealthEvents, LinkMatrix, MemoryUsage,
        MetaxAdapter, MigLayout, ProcessUtilizationSample, VendorAdapter, health_channel,
    },
    discovery::{
        self, DiscoveryConfig, VendorTable, pci_ids::DEFAULT_PCI_IDS_PATHS, vendors::METAX_VENDOR_ID,
    },
    model::{ComputeCapability, DeviceHealth, GpuDevice, Vendor},
};

use crate::{
    METAX_LIBRARY, METAX_LIBRARY_DIRS,
    error::Error,
    topology::{self, PcieLevel},
};

use self::ffi::MxSml;

/// Options of [`MetaxBackend`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaxOptions {
    /// The sysfs mount (`/sys`).
    pub sysfs_root: PathBuf,
    /// Where device nodes live (`/dev`).
    pub dev_root: PathBuf,
    /// The library file to load; when set, failing to load it is an error.
    pub library_path: Option<PathBuf>,
    /// Directories searched for `libmxsml.so` when `library_path` is unset, in order.
    pub library_dirs: Vec<PathBuf>,
    /// `pci.ids` candidates for device names.
    pub pci_ids_paths: Vec<PathBuf>,
}

impl Default for MetaxOptions {
    fn default() -> Self {
        Self {
            sysfs_root: PathBuf::from(discovery::DEFAULT_SYSFS_ROOT),
            dev_root: PathBuf::from("/dev"),
            library_path: None,
            library_dirs: METAX_LIBRARY_DIRS.iter().map(PathBuf::from).collect(),
            pci_ids_paths: DEFAULT_PCI_IDS_PATHS.iter().map(PathBuf::from).collect(),
        }
    }
}

impl MetaxOptions {
    /// Options reading sysfs under `sysfs_root` (everything else default).
    pub fn with_sysfs_root(mut self, sysfs_root: impl Into<PathBuf>) -> Self {
        self.sysfs_root = sysfs_root.into();
        self
    }

    /// The library file to load: `library_path`, else the first `libmxsml.so` found in `library_dirs`.
    pub fn find_library(&self) -> Option<PathBuf> {
        if let Some(path) = &self.library_path {
            return Some(path.clone());
        }
        self.library_dirs.iter().map(|dir| dir.join(METAX_LIBRARY)).find(|path| path.is_file())
    }
}

#[derive(Debug)]
struct MetaxDevice {
    gpu: GpuDevice,
    library_index: Option<u32>,
    nodes: Vec<PathBuf>,
}

/// The MetaX backend (see the module docs).
#[derive(Debug)]
pub struct MetaxBackend {
    devices: Vec<MetaxDevice>,
    dev_root: PathBuf,
    library: Option<Mutex<MxSml>>,
    library_path: Option<PathBuf>,
    warnings: Vec<String>,
    subscribers: Mutex<Vec<HealthEventSender>>,
}

/// The synthetic UUID of a GPU the library does not describe.
pub fn fallback_uuid(address: &str) -> String {
    format!("METAX-{address}")
}

/// The DRM device nodes of a PCI device: `<dev_root>/dri/<name>` for each `card*` / `renderD*` entry of
/// `<device sysfs dir>/drm`, that exists, sorted.
pub fn drm_nodes(device_sysfs_dir: &Path, dev_root: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(device_sysfs_dir.join("drm")) else { return Vec::new() };
    let mut nodes: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|name| name.starts_with("card") || name.starts_with("renderD"))
        .map(|name| dev_root.join("dri").join(name))
        .filter(|path| path.exists())
        .collect();
    nodes.sort();
    nodes
}

impl MetaxBackend {
    /// Scans sysfs for MetaX GPUs and loads the management library if there is one.
    pub fn new(options: MetaxOptions) -> Result<Self, Error> {
        let mut vendors = VendorTable::empty();
        if let Some(metax) = VendorTable::builtin().get(METAX_VENDOR_ID) {
            vendors.insert(metax.clone());
        }
        let config = DiscoveryConfig::default()
            .with_sysfs_root(&options.sysfs_root)
            .with_pci_ids_paths(options.pci_ids_paths.clone())
            .with_vendors(vendors);
        let report = discovery::discover(&config)?;
        let mut warnings: Vec<String> = report.warnings.iter().map(ToString::to_string).collect();

        let library_path = options.find_library();
        let library = match &library_path {
            Some(path) => match MxSml::load(path) {
                Ok(library) => Some(library),
                Err(message) if options.library_path.is_some() => {
                    return Err(Error::MetaxLibrary { path: path.clone(), message });
                }
                Err(message) => {
                    warnings.push(format!(
                        "cannot use {}: {message}; memory, UUIDs, utilisation and topology are not read",
                        path.display()
                    ));
                    None
                }
            },
            None => {
                let dirs: Vec<String> =
                    options.library_dirs.iter().map(|d| d.display().to_string()).collect();
                warnings.push(format!(
                    "{METAX_LIBRARY} not found in {}: memory size, vendor UUIDs, utilisation and topology are not \
                     read (memory is reported as 0 MiB, UUIDs as METAX-<pci address>)",
                    dirs.join(", ")
                ));
                None
            }
        };

        let library_devices: Vec<(u32, ffi::DeviceInfo)> = match &library {
            Some(lib) => (0..lib.device_count())
                .filter_map(|i| match lib.device_info(i) {
                    Ok(info) => Some((i, info)),
                    Err(message) => {
                        warnings.push(format!("MetaX device {i}: {message}"));
                        None
                    }
                })
                .collect(),
            None => Vec::new(),
        };

        let control = options.dev_root.join("mxcd");
        let has_control = control.exists();
        if !has_control && !report.gpus.is_empty() {
            warnings.push(format!("the MetaX control device {} does not exist", control.display()));
        }

        let mut devices = Vec::with_capacity(report.gpus.len());
        for (index, found) in report.gpus.iter().enumerate() {
            let address = found.address.to_string();
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            let matched = library_devices.iter().find(|(_, info)| {
                topology::normalize_bus_id(&info.bdf_id).as_deref() == Some(address.as_str())
            });
            let (library_index, uuid, name) = match matched {
                Some((i, info)) if !info.uuid.is_empty() => {
                    let name =
                        if info.name.is_empty() { found.device_name.clone() } else { info.name.clone() };
                    (Some(*i), info.uuid.clone(), name)
                }
                Some((i, _)) => (Some(*i), fallback_uuid(&address), found.device_name.clone()),
                None => {
                    if library.is_some() {
                        warnings.push(format!(
                            "{address}: not reported by {METAX_LIBRARY}; memory and UUID unknown"
                        ));
                    }
                    (None, fallback_uuid(&address), found.device_name.clone())
                }
            };
            let memory_mib = match (library.as_ref(), library_index) {
                (Some(lib), Some(i)) => match lib.memory_kib(i) {
                    Ok(Some((total, _))) => total >> 10,
                    Ok(None) => 0,
                    Err(message) => {
                        warnings.push(format!("{address}: {message}; memory reported as 0 MiB"));
                        0
                    }
                },
                _ => 0,
            };
            let mut nodes = Vec::new();
            if has_control {
                nodes.push(control.clone());
            }
            let drm = drm_nodes(&found.sysfs_path, &options.dev_root);
            if drm.is_empty() {
                warnings.push(format!(
                    "{address}: no DRM device node under {}",
                    options.dev_root.join("dri").display()
                ));
            }
            nodes.extend(drm);
            devices.push(MetaxDevice {
                gpu: GpuDevice {
                    index,
                    uuid,
                    type_name: name,
                    vendor: Vendor::MetaX,
                    memory_mib,
                    cores: 100,
                    split_count: 10,
                    numa_node: found.numa_node,
                    mig_enabled: false,
                    bus_id: address,
                    capability: ComputeCapability::default(),
                    health: DeviceHealth::Healthy,
                },
                library_index,
                nodes,
            });
        }
        Ok(Self {
            devices,
            dev_root: options.dev_root,
            library: library.map(Mutex::new),
            library_path,
            warnings,
            subscribers: Mutex::new(Vec::new()),
        })
    }

    /// What could not be read, one sentence each.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The management library in use, if any.
    pub fn library_path(&self) -> Option<&Path> {
        self.library.as_ref().and(self.library_path.as_deref())
    }

    /// The device nodes a container needs for GPU `index`: `/dev/mxcd` and its DRM nodes.
    pub fn device_nodes(&self, index: u32) -> Result<&[PathBuf], BackendError> {
        self.device(index).map(|d| d.nodes.as_slice())
    }

    /// The DRM device nodes of GPU `index` as container paths: each `<dev_root>/dri/<name>` of
    /// [`Self::device_nodes`] becomes `/dev/dri/<name>` (the control device is not included).
    pub fn container_drm_nodes(&self, index: u32) -> Result<Vec<String>, BackendError> {
        let dri = self.dev_root.join("dri");
        Ok(self
            .device(index)?
            .nodes
            .iter()
            .filter_map(|node| node.strip_prefix(&dri).ok())
            .map(|name| Path::new("/dev/dri").join(name).display().to_string())
            .collect())
    }

    /// Compute (XCORE) utilisation of GPU `index`, percent.
    pub fn utilization(&self, index: u32) -> Result<u32, BackendError> {
        let device = self.device(index)?;
        let (Some(library), Some(i)) = (self.library.as_ref(), device.library_index) else {
            return Err(BackendError::NotSupported {
                backend: "metax",
                operation: "utilization without libmxsml",
            });
        };
        let library = library.lock().unwrap_or_else(PoisonError::into_inner);
        match library.xcore_usage(i) {
            Ok(Some(percent)) => Ok(percent),
            Ok(None) => {
                Err(BackendError::NotSupported { backend: "metax", operation: "mxSmlGetDeviceIpUsage" })
            }
            Err(message) => Err(library_error("mxSmlGetDeviceIpUsage", message)),
        }
    }

    fn device(&self, index: u32) -> Result<&MetaxDevice, BackendError> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.devices.get(i))
            .ok_or(BackendError::NoSuchDevice { index, count: self.devices.len() })
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct MxSmlError(String);

fn library_error(operation: &'static str, message: String) -> BackendError {
    BackendError::Library { operation, source: Box::new(MxSmlError(message)) }
}

impl DeviceBackend for MetaxBackend {
    fn name(&self) -> &'static str {
        "metax"
    }

    fn devices(&self) -> Result<Vec<GpuDevice>, BackendError> {
        Ok(self.devices.iter().map(|d| d.gpu.clone()).collect())
    }

    fn memory_usage(&self, index: u32) -> Result<MemoryUsage, BackendError> {
        let device = self.device(index)?;
        let (Some(library), Some(i)) = (self.library.as_ref(), device.library_index) else {
            return Err(BackendError::NotSupported {
                backend: "metax",
                operation: "memory usage without libmxsml",
            });
        };
        let library = library.lock().unwrap_or_else(PoisonError::into_inner);
        match library.memory_kib(i) {
            Ok(Some((total, used))) => Ok(MemoryUsage { total_bytes: total << 10, used_bytes: used << 10 }),
            Ok(None) => Err(BackendError::NotSupported { backend: "metax", operation: "mxSmlGetMemoryInfo" }),
            Err(message) => Err(library_error("mxSmlGetMemoryInfo", message)),
        }
    }

    /// MXSML's topology level per pair when the library answers, else the NUMA comparison.
    fn topology(&self) -> Result<LinkMatrix, BackendError> {
        let n = self.devices.len();
        let mut matrix = LinkMatrix::new(n);
        let library = self.library.as_ref().map(|l| l.lock().unwrap_or_else(PoisonError::into_inner));
        for (i, a) in self.devices.iter().enumerate() {
            for (j, b) in self.devices.iter().enumerate().skip(i + 1) {
                let from_library = match (&library, a.library_index, b.library_index) {
                    (Some(lib), Some(x), Some(y)) => {
                        lib.topology_level(x, y).ok().flatten().and_then(topology::metax_level_code)
                    }
                    _ => None,
                };
                let code = from_library
                    .or_else(|| PcieLevel::from_numa(a.gpu.numa_node, b.gpu.numa_node).map(PcieLevel::code));
                matrix.set_pair(i, j, code.into_iter().collect());
            }
        }
        Ok(matrix)
    }

    /// MetaX health is not watched yet: the stream stays open and silent while the backend lives.
    fn health_events(&self) -> Result<HealthEvents, BackendError> {
        let (tx, rx) = health_channel();
        let mut subscribers = self.subscribers.lock().unwrap_or_else(PoisonError::into_inner);
        subscribers.retain(HealthEventSender::is_open);
        subscribers.push(tx);
        Ok(rx)
    }

    fn processes(&self, index: u32) -> Result<Vec<GpuProcess>, BackendError> {
        self.device(index)?;
        Err(BackendError::NotSupported { backend: "metax", operation: "process listing" })
    }

    fn process_utilization(
        &self,
        index: u32,
        _since: u64,
    ) -> Result<Vec<ProcessUtilizationSample>, BackendError> {
        self.device(index)?;
        Err(BackendError::NotSupported { backend: "metax", operation: "process utilization" })
    }

    /// A [`MetaxAdapter`] with each GPU's DRM nodes ([`Self::container_drm_nodes`]) and `/dev/mxcd`.
    fn vendor_adapter(&self) -> Result<Arc<dyn VendorAdapter>, BackendError> {
        let mut nodes = BTreeMap::new();
        for device in &self.devices {
            nodes.insert(device.gpu.index, self.container_drm_nodes(device.gpu.index)?);
        }
        Ok(Arc::new(MetaxAdapter::new(nodes)))
    }

    /// MetaX GPUs have no MIG: always [`vgpu_core::backend::MigMode::NotSupported`].
    fn mig_layout(&self, index: u32) -> Result<MigLayout, BackendError> {
        self.device(index).map(|_| MigLayout::default())
    }
}

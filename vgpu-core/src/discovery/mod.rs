//! Vendor-neutral GPU discovery from sysfs and the PCI ID database, as a node agent does it.
//!
//! [`discover`] lists `<sysfs-root>/bus/pci/devices`, keeps the display controllers (class `0x03xxxx`) of the
//! vendors in a [`VendorTable`] (built in: NVIDIA `10de`, MetaX `9999`; extendable by a `gpu-supported-vendors`
//! file), names them from `pci.ids` ([`PciIdDatabase`]), and tells bare metal from a VM by DMI
//! ([`dmi::detect_platform`]). It reads those files and nothing else.
//!
//! Problems are split in two (the table in [`sysfs`] gives the rule per attribute):
//! - [`DiscoveryError`]: the scan cannot run (`bus/pci/devices` unlistable, an explicit vendors file unreadable
//!   or invalid);
//! - [`DiscoveryWarning`]: one device or one field is ignored, or `pci.ids` is missing or partly malformed.
//!   Each names the file and what was expected; one bad device never hides the others.
//!
//! Submodules: [`fields`] (sysfs value parsers), [`pci_ids`] (database parser), [`vendors`] (vendor table),
//! [`sysfs`] (device scan), [`dmi`] (platform detection), [`address`] (PCI addresses), [`error`].
//!
//! ```no_run
//! use vgpu_core::discovery::{DiscoveryConfig, discover};
//!
//! let report = discover(&DiscoveryConfig::default())?;
//! for gpu in &report.gpus {
//!     println!("{} {} {} numa={:?} driver={:?}", gpu.index, gpu.address, gpu.device_name, gpu.numa_node, gpu.driver);
//! }
//! for warning in &report.warnings {
//!     eprintln!("warning: {warning}");
//! }
//! # Ok::<(), vgpu_core::discovery::DiscoveryError>(())
//! ```

pub mod address;
pub mod dmi;
pub mod error;
pub mod fields;
pub mod pci_ids;
pub mod sysfs;
pub mod vendors;

use std::path::{Path, PathBuf};

pub use self::{
    address::{PciAddress, PciAddressError},
    dmi::{Hypervisor, Platform},
    error::{DiscoveryError, DiscoveryWarning, WarningEffect},
    pci_ids::{PciIdDatabase, PciIdsSearch},
    sysfs::PciDevice,
    vendors::{Vendor, VendorTable},
};

/// The default sysfs root.
pub const DEFAULT_SYSFS_ROOT: &str = "/sys";

/// Where and what to discover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryConfig {
    /// The sysfs mount (`/sys`, or e.g. `/host-sys` in a container).
    pub sysfs_root: PathBuf,
    /// `pci.ids` candidates, first readable wins; empty means no names (hex ids only).
    pub pci_ids_paths: Vec<PathBuf>,
    /// Supported vendors.
    pub vendors: VendorTable,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        Self {
            sysfs_root: PathBuf::from(DEFAULT_SYSFS_ROOT),
            pci_ids_paths: pci_ids::DEFAULT_PCI_IDS_PATHS.iter().map(PathBuf::from).collect(),
            vendors: VendorTable::builtin(),
        }
    }
}

impl DiscoveryConfig {
    /// Sets the sysfs root.
    pub fn with_sysfs_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.sysfs_root = root.into();
        self
    }

    /// Sets the `pci.ids` candidates.
    pub fn with_pci_ids_paths(mut self, paths: impl IntoIterator<Item = impl Into<PathBuf>>) -> Self {
        self.pci_ids_paths = paths.into_iter().map(Into::into).collect();
        self
    }

    /// Sets the vendor table.
    pub fn with_vendors(mut self, vendors: VendorTable) -> Self {
        self.vendors = vendors;
        self
    }

    /// Merges a vendors file (ConfigMap or vendors document, YAML or JSON) into the vendor table.
    pub fn with_vendors_file(mut self, path: &Path) -> Result<Self, DiscoveryError> {
        self.vendors.merge_path(path)?;
        Ok(self)
    }
}

/// A discovered GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredGpu {
    /// Position in PCI address order, from 0.
    pub index: usize,
    /// PCI address.
    pub address: PciAddress,
    /// The vendor-table entry (its `key` is the vendor label value).
    pub vendor: Vendor,
    /// PCI vendor id.
    pub vendor_id: u16,
    /// Vendor name from `pci.ids`, else the id in hex (`10de`).
    pub vendor_name: String,
    /// PCI device id.
    pub device_id: u16,
    /// Device name from `pci.ids`, else the id in hex (`20b7`).
    pub device_name: String,
    /// Subsystem (board) ids and, if known, name.
    pub subsystem: Option<Subsystem>,
    /// 24-bit class code `0xCCSSPP`.
    pub class_code: u32,
    /// Class name from `pci.ids`, else the class and subclass in hex (`0302`).
    pub class_name: String,
    /// NUMA node, `None` for none (`-1`) or unknown.
    pub numa_node: Option<u32>,
    /// The bound driver (`nvidia`, `vfio-pci`, `metax`...), `None` when unbound.
    pub driver: Option<String>,
    /// IOMMU group number.
    pub iommu_group: Option<u32>,
    /// The device's sysfs directory.
    pub sysfs_path: PathBuf,
}

/// A subsystem: the board vendor and model of a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subsystem {
    /// `subsystem_vendor`.
    pub vendor_id: u16,
    /// `subsystem_device`.
    pub device_id: u16,
    /// Name from `pci.ids`.
    pub name: Option<String>,
}

impl DiscoveredGpu {
    /// The 16-bit class and subclass (`0x0302` for a 3D controller).
    pub fn class_id(&self) -> u16 {
        // The class code has 24 bits, so the shifted value fits in 16.
        u16::try_from(self.class_code >> 8).unwrap_or(u16::MAX)
    }

    /// A label-safe model name: the last bracketed part of the device name if any (`GA100GL [A30 PCIe]` →
    /// `a30-pcie`), lower-cased, with runs of other characters turned into `-`.
    pub fn model_slug(&self) -> String {
        let name = self.device_name.as_str();
        let core = match (name.rfind('['), name.rfind(']')) {
            (Some(open), Some(close)) if open < close => name.get(open + 1..close).unwrap_or(name),
            _ => name,
        };
        let mut slug = String::with_capacity(core.len());
        for c in core.chars() {
            if c.is_ascii_alphanumeric() {
                slug.push(c.to_ascii_lowercase());
            } else if !slug.ends_with('-') && !slug.is_empty() {
                slug.push('-');
            }
        }
        while slug.ends_with('-') {
            slug.pop();
        }
        slug
    }
}

/// The result of [`discover`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryReport {
    /// The GPUs, in PCI address order.
    pub gpus: Vec<DiscoveredGpu>,
    /// Bare metal or VM.
    pub platform: Platform,
    /// The `pci.ids` file used, if any.
    pub pci_ids_path: Option<PathBuf>,
    /// Everything that was ignored, with the file and the reason.
    pub warnings: Vec<DiscoveryWarning>,
}

/// Scans sysfs for GPUs of the supported vendors and names them. See the module docs.
pub fn discover(config: &DiscoveryConfig) -> Result<DiscoveryReport, DiscoveryError> {
    let mut warnings = Vec::new();
    let vendors = &config.vendors;
    let devices = sysfs::scan_pci_devices(
        &config.sysfs_root,
        |vendor, class| vendors.contains(vendor) && sysfs::is_display_class(class),
        &mut warnings,
    )?;

    let search = PciIdDatabase::load_first(&config.pci_ids_paths);
    for (path, reason) in search.unreadable {
        warnings.push(DiscoveryWarning::PciIdsUnreadable { path, reason });
    }
    let (pci_ids_path, db) = match search.loaded {
        Some((path, db)) => {
            if let Some(first) = db.issues().first() {
                warnings.push(DiscoveryWarning::PciIdsMalformed {
                    path: path.clone(),
                    count: db.issues().len(),
                    first_line: first.line,
                    expected: first.expected,
                });
            }
            (Some(path), db)
        }
        None => {
            if !devices.is_empty() {
                warnings.push(DiscoveryWarning::PciIdsMissing { tried: config.pci_ids_paths.clone() });
            }
            (None, PciIdDatabase::default())
        }
    };

    let gpus = devices
        .into_iter()
        .filter_map(|device| {
            let vendor = vendors.get(device.vendor_id)?.clone();
            Some((vendor, device))
        })
        .enumerate()
        .map(|(index, (vendor, device))| name_device(index, vendor, device, &db))
        .collect();

    Ok(DiscoveryReport { gpus, platform: dmi::detect_platform(&config.sysfs_root), pci_ids_path, warnings })
}

fn name_device(index: usize, vendor: Vendor, device: PciDevice, db: &PciIdDatabase) -> DiscoveredGpu {
    let vendor_name =
        db.vendor_name(device.vendor_id).map_or_else(|| format!("{:04x}", device.vendor_id), str::to_owned);
    let device_name = db
        .device_name(device.vendor_id, device.device_id)
        .map_or_else(|| format!("{:04x}", device.device_id), str::to_owned);
    let class_name = db
        .class_name(device.class_code)
        .map_or_else(|| format!("{:04x}", device.class_code >> 8), str::to_owned);
    let subsystem = device.subsystem.map(|(sub_vendor, sub_device)| Subsystem {
        vendor_id: sub_vendor,
        device_id: sub_device,
        name: db
            .subsystem_name(device.vendor_id, device.device_id, sub_vendor, sub_device)
            .map(str::to_owned),
    });
    DiscoveredGpu {
        index,
        address: device.address,
        vendor,
        vendor_id: device.vendor_id,
        vendor_name,
        device_id: device.device_id,
        device_name,
        subsystem,
        class_code: device.class_code,
        class_name,
        numa_node: device.numa_node,
        driver: device.driver,
        iommu_group: device.iommu_group,
        sysfs_path: device.sysfs_path,
    }
}

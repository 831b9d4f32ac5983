//! Reading PCI devices from `<sysfs-root>/bus/pci/devices/*`.
//!
//! What each attribute does when it is missing, unreadable or malformed:
//!
//! | attribute | missing | unreadable or malformed |
//! |---|---|---|
//! | directory name (address) | — | warning, device skipped |
//! | `vendor`, `class` | warning, device skipped | warning, device skipped |
//! | `device` (read for kept devices only) | warning, device skipped | warning, device skipped |
//! | `subsystem_vendor`, `subsystem_device` | no subsystem, silently | warning, no subsystem |
//! | `numa_node` | no NUMA node, silently (kernel without NUMA) | warning, no NUMA node |
//! | `driver` symlink | no driver, silently (unbound device) | warning, no driver |
//! | `iommu_group` symlink | no group, silently (IOMMU off) | warning, no group |
//!
//! The identity fields decide whether the device is a GPU at all, so a device without them cannot be reported;
//! the others are descriptive and a device is more useful with them unset than missing.

use std::{
    fs,
    io::{self, Read},
    path::{Path, PathBuf},
};

use super::{
    address::PciAddress,
    error::{DiscoveryError, DiscoveryWarning, WarningEffect},
    fields::{FieldError, parse_class_code, parse_numa_node, parse_pci_id},
};

/// Attribute files are one short line; anything longer than this is cut (and will fail to parse).
const MAX_ATTRIBUTE_BYTES: u64 = 4096;

/// A PCI device as read from sysfs, before naming.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciDevice {
    /// The address (the directory name).
    pub address: PciAddress,
    /// The device's sysfs directory.
    pub sysfs_path: PathBuf,
    /// `vendor`.
    pub vendor_id: u16,
    /// `device`.
    pub device_id: u16,
    /// `class`, 24 bits `0xCCSSPP`.
    pub class_code: u32,
    /// `subsystem_vendor` and `subsystem_device`, when both are present and valid.
    pub subsystem: Option<(u16, u16)>,
    /// `numa_node`; `None` for `-1` or when absent.
    pub numa_node: Option<u32>,
    /// Basename of the `driver` symlink target (`nvidia`, `vfio-pci`, ...).
    pub driver: Option<String>,
    /// Basename of the `iommu_group` symlink target.
    pub iommu_group: Option<u32>,
}

/// Whether a 24-bit class code is a display controller (base class `0x03`: VGA `0x0300`, XGA `0x0301`,
/// 3D `0x0302`, other `0x0380`).
pub fn is_display_class(class_code: u32) -> bool {
    class_code >> 16 == 0x03
}

/// Reads a small attribute file. `Ok(None)` when it does not exist.
fn read_attribute(path: &Path) -> io::Result<Option<String>> {
    let file = match fs::File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err),
    };
    let mut bytes = Vec::new();
    file.take(MAX_ATTRIBUTE_BYTES).read_to_end(&mut bytes)?;
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

/// Reads the basename of a symlink's target. `Ok(None)` when the link does not exist.
fn read_link_name(path: &Path) -> io::Result<Option<String>> {
    match fs::read_link(path) {
        Ok(target) => match target.file_name().and_then(|n| n.to_str()) {
            Some(name) if !name.is_empty() => Ok(Some(name.to_owned())),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("link target {} has no UTF-8 basename", target.display()),
            )),
        },
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err),
    }
}

/// Collects the warnings of one device.
struct DeviceReader<'a> {
    dir: &'a Path,
    warnings: &'a mut Vec<DiscoveryWarning>,
}

impl DeviceReader<'_> {
    fn unreadable(&mut self, file: PathBuf, reason: String, effect: WarningEffect) {
        self.warnings.push(DiscoveryWarning::UnreadableFile { file, reason, effect });
    }

    fn malformed(&mut self, file: PathBuf, error: FieldError, effect: WarningEffect) {
        self.warnings.push(DiscoveryWarning::MalformedFile { file, error, effect });
    }

    /// Reads and parses an attribute: `None` if it is missing (a warning too when `required`), unreadable or
    /// malformed (always a warning, with `effect`).
    fn field<T>(
        &mut self,
        name: &str,
        parse: impl Fn(&str) -> Result<T, FieldError>,
        required: bool,
        effect: WarningEffect,
    ) -> Option<T> {
        let file = self.dir.join(name);
        match read_attribute(&file) {
            Ok(Some(raw)) => match parse(&raw) {
                Ok(value) => Some(value),
                Err(error) => {
                    self.malformed(file, error, effect);
                    None
                }
            },
            Ok(None) => {
                if required {
                    self.unreadable(file, "the file does not exist".to_owned(), effect);
                }
                None
            }
            Err(err) => {
                self.unreadable(file, err.to_string(), effect);
                None
            }
        }
    }

    fn link(&mut self, name: &str) -> Option<String> {
        let file = self.dir.join(name);
        match read_link_name(&file) {
            Ok(value) => value,
            Err(err) => {
                self.unreadable(file, err.to_string(), WarningEffect::FieldIgnored);
                None
            }
        }
    }
}

/// Lists `<sysfs_root>/bus/pci/devices` and reads every device for which `keep(vendor_id, class_code)` is true.
///
/// The result is sorted by address. Problems with single devices become `warnings` (see the module docs);
/// only an unlistable directory is an error.
pub fn scan_pci_devices(
    sysfs_root: &Path,
    keep: impl Fn(u16, u32) -> bool,
    warnings: &mut Vec<DiscoveryWarning>,
) -> Result<Vec<PciDevice>, DiscoveryError> {
    let devices_dir = sysfs_root.join("bus/pci/devices");
    let entries = fs::read_dir(&devices_dir)
        .map_err(|source| DiscoveryError::ScanDirectory { path: devices_dir.clone(), source })?;
    let mut devices = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(err) => {
                warnings.push(DiscoveryWarning::UnreadableEntry {
                    dir: devices_dir.clone(),
                    reason: err.to_string(),
                });
                continue;
            }
        };
        let dir = entry.path();
        let Some(address) = entry.file_name().to_str().and_then(|name| name.parse::<PciAddress>().ok())
        else {
            warnings.push(DiscoveryWarning::BadAddress { path: dir });
            continue;
        };
        if let Some(device) = read_device(address, &dir, &keep, warnings) {
            devices.push(device);
        }
    }
    devices.sort_by_key(|d| d.address);
    Ok(devices)
}

fn read_device(
    address: PciAddress,
    dir: &Path,
    keep: &impl Fn(u16, u32) -> bool,
    warnings: &mut Vec<DiscoveryWarning>,
) -> Option<PciDevice> {
    let mut reader = DeviceReader { dir, warnings };
    let skip = WarningEffect::DeviceSkipped;
    let vendor_id = reader.field("vendor", parse_pci_id, true, skip);
    let class_code = reader.field("class", parse_class_code, true, skip);
    let (vendor_id, class_code) = (vendor_id?, class_code?);
    if !keep(vendor_id, class_code) {
        return None;
    }
    let device_id = reader.field("device", parse_pci_id, true, skip)?;

    let ignore = WarningEffect::FieldIgnored;
    let sub_vendor = reader.field("subsystem_vendor", parse_pci_id, false, ignore);
    let sub_device = reader.field("subsystem_device", parse_pci_id, false, ignore);
    let numa_node = reader.field("numa_node", parse_numa_node, false, ignore).flatten();
    let driver = reader.link("driver");
    let iommu_file = dir.join("iommu_group");
    let iommu_group = reader.link("iommu_group").and_then(|group| match group.parse::<u32>() {
        Ok(group) => Some(group),
        Err(_) => {
            let error = FieldError::Invalid {
                expected: "a symlink to a numbered IOMMU group",
                found: super::fields::excerpt(&group),
            };
            reader.malformed(iommu_file, error, WarningEffect::FieldIgnored);
            None
        }
    });

    Some(PciDevice {
        address,
        sysfs_path: dir.to_path_buf(),
        vendor_id,
        device_id,
        class_code,
        subsystem: sub_vendor.zip(sub_device),
        numa_node,
        driver,
        iommu_group,
    })
}

//! Errors (the scan cannot run) and warnings (one device or one field was ignored) of the discovery.

use std::path::PathBuf;

use super::fields::FieldError;

/// A failure that stops the discovery: nothing useful can be reported.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiscoveryError {
    /// `<sysfs-root>/bus/pci/devices` could not be listed (wrong sysfs root, or not mounted).
    #[error("cannot list PCI devices in {}: {source}", path.display())]
    ScanDirectory {
        /// The directory that was listed.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The vendors config file could not be read.
    #[error("cannot read the vendors file {}: {source}", path.display())]
    VendorsRead {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The vendors config file is not a vendors document or a ConfigMap holding one.
    #[error("invalid vendors file {source_name}: {message}")]
    VendorsParse {
        /// The file (or `<string>`, or `file (data.key)` for a ConfigMap entry).
        source_name: String,
        /// The parser's message.
        message: String,
    },
    /// A vendor id in the vendors config file is not a 16-bit hexadecimal id.
    #[error("invalid vendor id {value:?} in {source_name}: {source}")]
    VendorId {
        /// The file.
        source_name: String,
        /// The value found.
        value: String,
        /// Why it was rejected.
        #[source]
        source: FieldError,
    },
}

/// What a [`DiscoveryWarning`] did to the device it concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarningEffect {
    /// The device was left out of the result.
    DeviceSkipped,
    /// The device was kept, with this field unset.
    FieldIgnored,
}

impl std::fmt::Display for WarningEffect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::DeviceSkipped => "device skipped",
            Self::FieldIgnored => "field ignored",
        })
    }
}

/// A problem that did not stop the discovery; each names the file and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DiscoveryWarning {
    /// A sysfs file (or symlink) exists but could not be read, or a required one is missing.
    #[error("cannot read {}: {reason} ({effect})", file.display())]
    UnreadableFile {
        /// The file.
        file: PathBuf,
        /// The I/O error, as text.
        reason: String,
        /// What happened to the device.
        effect: WarningEffect,
    },
    /// A sysfs file does not hold what it should.
    #[error("malformed {}: {error} ({effect})", file.display())]
    MalformedFile {
        /// The file.
        file: PathBuf,
        /// What was expected and what was found.
        error: FieldError,
        /// What happened to the device.
        effect: WarningEffect,
    },
    /// An entry of `bus/pci/devices` is not named like a PCI address (`dddd:bb:dd.f`); the device is skipped.
    #[error("{}: the name is not a PCI address dddd:bb:dd.f (device skipped)", path.display())]
    BadAddress {
        /// The entry.
        path: PathBuf,
    },
    /// An entry of `bus/pci/devices` could not be read; the device is skipped.
    #[error("cannot read an entry of {}: {reason} (device skipped)", dir.display())]
    UnreadableEntry {
        /// The directory being listed.
        dir: PathBuf,
        /// The I/O error, as text.
        reason: String,
    },
    /// No `pci.ids` database was found: names fall back to hexadecimal ids.
    #[error("no pci.ids database found (tried {tried:?}); using hexadecimal ids as names")]
    PciIdsMissing {
        /// The paths tried.
        tried: Vec<PathBuf>,
    },
    /// A `pci.ids` file exists but could not be read; the next path is tried.
    #[error("cannot read {}: {reason}", path.display())]
    PciIdsUnreadable {
        /// The file.
        path: PathBuf,
        /// The I/O error, as text.
        reason: String,
    },
    /// The `pci.ids` file has malformed lines, which were skipped.
    #[error("{}: {count} malformed line(s) skipped; first at line {first_line}: expected {expected}", path.display())]
    PciIdsMalformed {
        /// The file.
        path: PathBuf,
        /// How many lines were skipped.
        count: usize,
        /// 1-based number of the first one.
        first_line: usize,
        /// What the first one should have looked like.
        expected: &'static str,
    },
}

//! A parser and lookup table for the `pci.ids` database (the format of <https://pci-ids.ucw.cz>).
//!
//! The format, line by line:
//!
//! ```text
//! # comment
//! vvvv  Vendor name                       (4 hex digits, then whitespace, then the name)
//! <TAB>dddd  Device name                  (a device of the vendor above)
//! <TAB><TAB>ssss tttt  Subsystem name     (subsystem vendor + subsystem device of the device above)
//! C cc  Class name                        (the class section, normally at the end of the file)
//! <TAB>ss  Subclass name
//! <TAB><TAB>pp  Programming interface name
//! ```
//!
//! The parser is lenient: a malformed line is skipped and reported as a [`PciIdsIssue`], and lines that belong
//! to a skipped parent are skipped with it (so a device is never attached to the wrong vendor). It never panics.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

/// The places searched for `pci.ids` when none is configured, in order.
pub const DEFAULT_PCI_IDS_PATHS: [&str; 2] = ["/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids"];

/// A malformed line found while parsing `pci.ids`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciIdsIssue {
    /// 1-based line number.
    pub line: usize,
    /// What the line should have looked like.
    pub expected: &'static str,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct DeviceEntry {
    name: String,
    subsystems: HashMap<(u16, u16), String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct VendorEntry {
    name: String,
    devices: HashMap<u16, DeviceEntry>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct SubclassEntry {
    name: String,
    prog_ifs: HashMap<u8, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ClassEntry {
    name: String,
    subclasses: HashMap<u8, SubclassEntry>,
}

/// A parsed `pci.ids` database.
///
/// ```
/// use vgpu_core::discovery::pci_ids::PciIdDatabase;
///
/// let db = PciIdDatabase::parse("10de  NVIDIA Corporation\n\t20b7  GA100GL [A30 PCIe]\nC 03  Display controller\n\t02  3D controller\n");
/// assert_eq!(db.vendor_name(0x10de), Some("NVIDIA Corporation"));
/// assert_eq!(db.device_name(0x10de, 0x20b7), Some("GA100GL [A30 PCIe]"));
/// assert_eq!(db.class_name(0x030200), Some("3D controller"));
/// assert!(db.issues().is_empty());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PciIdDatabase {
    vendors: HashMap<u16, VendorEntry>,
    classes: HashMap<u8, ClassEntry>,
    issues: Vec<PciIdsIssue>,
}

/// The outcome of [`PciIdDatabase::load_first`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PciIdsSearch {
    /// The first readable file and its database; `None` if no candidate exists.
    pub loaded: Option<(PathBuf, PciIdDatabase)>,
    /// Candidates that exist but could not be read, with the I/O error as text.
    pub unreadable: Vec<(PathBuf, String)>,
}

/// Where the parser is: which parent the next indented line belongs to.
#[derive(Debug, Clone, Copy)]
enum Context {
    /// Before any vendor or class line, or after a malformed one.
    None,
    Vendor(u16),
    Device(u16, u16),
    Class(u8),
    Subclass(u8, u8),
    /// Inside a skipped parent: indented lines are ignored until the next top-level line.
    Skipped,
}

/// Splits `"<hex id><whitespace><name>"`; the id must have exactly `digits` hex digits.
fn split_id(text: &str, digits: usize) -> Option<(u32, &str)> {
    let id_part = text.get(..digits)?;
    if !id_part.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let rest = text.get(digits..)?;
    // The name must be separated from the id by whitespace (the database uses two spaces).
    if !rest.starts_with([' ', '\t']) {
        return None;
    }
    let name = rest.trim();
    if name.is_empty() {
        return None;
    }
    let id = u32::from_str_radix(id_part, 16).ok()?;
    Some((id, name))
}

fn split_u16(text: &str) -> Option<(u16, &str)> {
    split_id(text, 4).and_then(|(id, name)| u16::try_from(id).ok().map(|id| (id, name)))
}

fn split_u8(text: &str) -> Option<(u8, &str)> {
    split_id(text, 2).and_then(|(id, name)| u8::try_from(id).ok().map(|id| (id, name)))
}

/// Parses `"ssss tttt  name"` (a subsystem line without its two tabs).
fn split_subsystem(text: &str) -> Option<(u16, u16, &str)> {
    let sub_vendor = u16::from_str_radix(text.get(..4)?, 16).ok()?;
    if !text.get(..4)?.bytes().all(|b| b.is_ascii_hexdigit()) || text.get(4..5)? != " " {
        return None;
    }
    let (sub_device, name) = split_u16(text.get(5..)?)?;
    Some((sub_vendor, sub_device, name))
}

impl PciIdDatabase {
    /// Parses the text of a `pci.ids` file. Malformed lines are skipped and listed in [`Self::issues`].
    pub fn parse(text: &str) -> Self {
        let mut db = Self::default();
        let mut context = Context::None;
        for (index, raw_line) in text.lines().enumerate() {
            let line_no = index + 1;
            let line = raw_line.trim_end();
            if line.trim_start().is_empty() || line.trim_start().starts_with('#') {
                continue;
            }
            if let Some(rest) = line.strip_prefix("\t\t") {
                context = db.parse_level2(rest, context, line_no);
            } else if let Some(rest) = line.strip_prefix('\t') {
                context = db.parse_level1(rest, context, line_no);
            } else if let Some(rest) = line.strip_prefix("C ") {
                context = match split_u8(rest) {
                    Some((class, name)) => {
                        db.classes.entry(class).or_default().name = name.to_owned();
                        Context::Class(class)
                    }
                    None => db.issue(line_no, "a class line `C cc  name`"),
                };
            } else if line.starts_with(|c: char| c.is_ascii_hexdigit()) {
                context = match split_u16(line) {
                    Some((vendor, name)) => {
                        db.vendors.entry(vendor).or_default().name = name.to_owned();
                        Context::Vendor(vendor)
                    }
                    None => db.issue(line_no, "a vendor line `vvvv  name`"),
                };
            } else {
                // Another top-level section (the format reserves single letters, e.g. `C`): not used here.
                context = db.issue(line_no, "a vendor line `vvvv  name` or a class line `C cc  name`");
            }
        }
        db
    }

    fn issue(&mut self, line: usize, expected: &'static str) -> Context {
        self.issues.push(PciIdsIssue { line, expected });
        Context::Skipped
    }

    fn parse_level1(&mut self, text: &str, context: Context, line_no: usize) -> Context {
        match context {
            Context::Vendor(vendor) | Context::Device(vendor, _) => match split_u16(text) {
                Some((device, name)) => {
                    let vendor_entry = self.vendors.entry(vendor).or_default();
                    vendor_entry.devices.entry(device).or_default().name = name.to_owned();
                    Context::Device(vendor, device)
                }
                None => {
                    self.issues
                        .push(PciIdsIssue { line: line_no, expected: "a device line `\\tdddd  name`" });
                    // Keep the vendor: later devices still belong to it; subsystems of this line are dropped.
                    Context::Vendor(vendor)
                }
            },
            Context::Class(class) | Context::Subclass(class, _) => match split_u8(text) {
                Some((subclass, name)) => {
                    let class_entry = self.classes.entry(class).or_default();
                    class_entry.subclasses.entry(subclass).or_default().name = name.to_owned();
                    Context::Subclass(class, subclass)
                }
                None => {
                    self.issues
                        .push(PciIdsIssue { line: line_no, expected: "a subclass line `\\tss  name`" });
                    Context::Class(class)
                }
            },
            Context::Skipped => Context::Skipped,
            Context::None => self.issue(line_no, "a vendor or class line before indented lines"),
        }
    }

    fn parse_level2(&mut self, text: &str, context: Context, line_no: usize) -> Context {
        match context {
            Context::Device(vendor, device) => {
                match split_subsystem(text) {
                    Some((sub_vendor, sub_device, name)) => {
                        if let Some(entry) =
                            self.vendors.get_mut(&vendor).and_then(|v| v.devices.get_mut(&device))
                        {
                            entry.subsystems.insert((sub_vendor, sub_device), name.to_owned());
                        }
                    }
                    None => self.issues.push(PciIdsIssue {
                        line: line_no,
                        expected: "a subsystem line `\\t\\tssss tttt  name`",
                    }),
                }
                context
            }
            Context::Subclass(class, subclass) => {
                match split_u8(text) {
                    Some((prog_if, name)) => {
                        if let Some(entry) =
                            self.classes.get_mut(&class).and_then(|c| c.subclasses.get_mut(&subclass))
                        {
                            entry.prog_ifs.insert(prog_if, name.to_owned());
                        }
                    }
                    None => self.issues.push(PciIdsIssue {
                        line: line_no,
                        expected: "a programming interface line `\\t\\tpp  name`",
                    }),
                }
                context
            }
            Context::Skipped => Context::Skipped,
            Context::None | Context::Vendor(_) | Context::Class(_) => {
                self.issues.push(PciIdsIssue {
                    line: line_no,
                    expected: "a device or subclass line before doubly indented lines",
                });
                context
            }
        }
    }

    /// Reads and parses the first readable file among `paths`.
    ///
    /// Returns `Ok(None)` when none exists. Files that exist but cannot be read are reported in the returned
    /// list of `(path, reason)` and the search goes on. Non-UTF-8 bytes are replaced, not rejected.
    pub fn load_first(paths: &[PathBuf]) -> PciIdsSearch {
        let mut unreadable = Vec::new();
        for path in paths {
            match std::fs::read(path) {
                Ok(bytes) => {
                    let db = Self::parse(&String::from_utf8_lossy(&bytes));
                    return PciIdsSearch { loaded: Some((path.clone(), db)), unreadable };
                }
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => unreadable.push((path.clone(), err.to_string())),
            }
        }
        PciIdsSearch { loaded: None, unreadable }
    }

    /// Reads and parses one file.
    pub fn load(path: &Path) -> std::io::Result<Self> {
        std::fs::read(path).map(|bytes| Self::parse(&String::from_utf8_lossy(&bytes)))
    }

    /// The malformed lines that were skipped.
    pub fn issues(&self) -> &[PciIdsIssue] {
        &self.issues
    }

    /// Number of vendors known.
    pub fn vendor_count(&self) -> usize {
        self.vendors.len()
    }

    /// The vendor's name.
    pub fn vendor_name(&self, vendor: u16) -> Option<&str> {
        self.vendors.get(&vendor).map(|v| v.name.as_str())
    }

    /// The device's name.
    pub fn device_name(&self, vendor: u16, device: u16) -> Option<&str> {
        self.vendors.get(&vendor)?.devices.get(&device).map(|d| d.name.as_str())
    }

    /// The name of a subsystem (board) of a device.
    pub fn subsystem_name(&self, vendor: u16, device: u16, sub_vendor: u16, sub_device: u16) -> Option<&str> {
        self.vendors
            .get(&vendor)?
            .devices
            .get(&device)?
            .subsystems
            .get(&(sub_vendor, sub_device))
            .map(String::as_str)
    }

    /// The most specific name of a 24-bit class code (`0xCCSSPP`): the subclass name, or else the base class
    /// name. (The programming interface is available through [`Self::prog_if_name`].)
    pub fn class_name(&self, class_code: u32) -> Option<&str> {
        let [_, base, sub, _] = class_code.to_be_bytes();
        let class = self.classes.get(&base)?;
        Some(class.subclasses.get(&sub).map_or(class.name.as_str(), |s| s.name.as_str()))
    }

    /// The name of the programming interface of a 24-bit class code.
    pub fn prog_if_name(&self, class_code: u32) -> Option<&str> {
        let [_, base, sub, prog_if] = class_code.to_be_bytes();
        self.classes.get(&base)?.subclasses.get(&sub)?.prog_ifs.get(&prog_if).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SAMPLE: &str = "\
# List of PCI ID's
#\tVersion: 2026.01.01
#
0001  SafeNet (wrong ID)
10de  NVIDIA Corporation
\t20b0  GA100 [A100 SXM4 40GB]
\t\t10de 1450  A100-SXM4-40GB
\t\t10de 147f  A100-SXM4-80GB
\t2330  GH100 [H100 SXM5 80GB]
# a comment in the middle
9999  MetaX Integrated Circuits
\t4000  MXC500
c001  A vendor starting with C
\t0001  Cee device
C 00  Unclassified device
\t00  Non-VGA unclassified device
C 03  Display controller
\t00  VGA compatible controller
\t\t00  VGA controller
\t\t01  8514 controller
\t02  3D controller
\t80  Display controller
";

    #[test]
    fn parses_sample() {
        let db = PciIdDatabase::parse(SAMPLE);
        assert!(db.issues().is_empty(), "{:?}", db.issues());
        assert_eq!(db.vendor_count(), 4);
        assert_eq!(db.vendor_name(0x10de), Some("NVIDIA Corporation"));
        assert_eq!(db.device_name(0x10de, 0x20b0), Some("GA100 [A100 SXM4 40GB]"));
        assert_eq!(db.subsystem_name(0x10de, 0x20b0, 0x10de, 0x147f), Some("A100-SXM4-80GB"));
        assert_eq!(db.device_name(0x10de, 0x2330), Some("GH100 [H100 SXM5 80GB]"));
        assert_eq!(db.device_name(0x9999, 0x4000), Some("MXC500"));
        assert_eq!(db.vendor_name(0xc001), Some("A vendor starting with C"));
        assert_eq!(db.device_name(0xc001, 0x0001), Some("Cee device"));
        // The class section is not confused with vendors.
        assert_eq!(db.vendor_name(0x0003), None);
        assert_eq!(db.device_name(0xc001, 0x0002), None);
        assert_eq!(db.class_name(0x030200), Some("3D controller"));
        assert_eq!(db.class_name(0x030000), Some("VGA compatible controller"));
        assert_eq!(db.class_name(0x034500), Some("Display controller"));
        assert_eq!(db.prog_if_name(0x030001), Some("8514 controller"));
        assert_eq!(db.class_name(0x120000), None);
        // Class subclasses must not leak into the last vendor.
        assert_eq!(db.device_name(0xc001, 0x0000), None);
    }

    #[test]
    fn malformed_lines_are_skipped_with_their_children() {
        let text = "\
\t1234  orphan device
10de  NVIDIA Corporation
\tzzzz  bad device
\t\t10de 0001  child of bad device
\t20b7  GA100GL [A30 PCIe]
\t\t10de1532  missing space
xyz1  not a vendor
\t0001  device of a bad vendor
\t\t0001 0001  subsystem of a bad vendor
C zz  bad class
\t00  subclass of bad class
C 03
10de
";
        let db = PciIdDatabase::parse(text);
        assert_eq!(db.device_name(0x10de, 0x20b7), Some("GA100GL [A30 PCIe]"));
        assert_eq!(db.device_name(0x10de, 0x0001), None);
        assert_eq!(db.vendor_name(0x10de), Some("NVIDIA Corporation"));
        let lines: Vec<usize> = db.issues().iter().map(|i| i.line).collect();
        assert_eq!(lines, vec![1, 3, 4, 6, 7, 10, 12, 13]);
    }

    #[test]
    fn crlf_and_lossy_input() {
        let db = PciIdDatabase::parse("10de  NVIDIA\r\n\t20b7  A30\r\n");
        assert_eq!(db.device_name(0x10de, 0x20b7), Some("A30"));
    }

    #[test]
    fn load_first_skips_missing() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.ids");
        let present = dir.path().join("pci.ids");
        std::fs::write(&present, "10de  NVIDIA\n").unwrap();
        let search = PciIdDatabase::load_first(&[missing.clone(), present.clone()]);
        let (path, db) = search.loaded.unwrap();
        assert_eq!(path, present);
        assert_eq!(db.vendor_name(0x10de), Some("NVIDIA"));
        assert!(search.unreadable.is_empty());
        assert!(PciIdDatabase::load_first(&[missing]).loaded.is_none());
        // A directory exists but cannot be read as a file: reported, and the search goes on.
        let search = PciIdDatabase::load_first(&[dir.path().to_path_buf(), present.clone()]);
        assert_eq!(search.unreadable.len(), 1);
        assert_eq!(search.loaded.map(|(p, _)| p), Some(present));
    }

    proptest! {
        #[test]
        fn parser_never_panics(s in any::<String>()) {
            let _ = PciIdDatabase::parse(&s);
        }

        #[test]
        fn parser_never_panics_on_plausible_lines(
            lines in proptest::collection::vec(
                "(\t{0,3})(C )?[0-9a-fA-Fx ]{0,10}( {1,2}[ -~]{0,12})?", 0..40)
        ) {
            let text = lines.join("\n");
            let db = PciIdDatabase::parse(&text);
            for issue in db.issues() {
                prop_assert!(issue.line >= 1 && issue.line <= lines.len());
            }
        }
    }
}

//! The table of supported GPU vendors: built-in entries plus an optional `gpu-supported-vendors` config file.
//!
//! The file has the shape of the Kubernetes ConfigMap that the Deckhouse node agent reads (its exact schema is
//! not public, so this is ours). Either the whole ConfigMap, whose `data` values each hold a vendors document:
//!
//! ```yaml
//! apiVersion: v1
//! kind: ConfigMap
//! metadata:
//!   name: gpu-supported-vendors
//! data:
//!   vendors.yaml: |
//!     vendors:
//!       - id: "1002"        # PCI vendor id, hexadecimal, optional 0x prefix
//!         name: amd         # short key, used as the `gpu.deckhouse.io/vendor` label value
//!         displayName: AMD  # optional
//!       - id: "9999"
//!         enabled: false    # removes a built-in vendor
//! ```
//!
//! or just the vendors document itself (the `vendors:` mapping), as YAML or JSON. Entries replace built-in
//! entries with the same id.

use std::{collections::BTreeMap, path::Path};

use serde::Deserialize;

use super::{error::DiscoveryError, fields::parse_pci_id};

/// PCI vendor id of NVIDIA.
pub const NVIDIA_VENDOR_ID: u16 = 0x10de;
/// PCI vendor id of MetaX.
pub const METAX_VENDOR_ID: u16 = 0x9999;

/// One supported vendor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vendor {
    /// PCI vendor id.
    pub id: u16,
    /// Short lower-case key (`nvidia`, `metax`), suitable as a label value.
    pub key: String,
    /// Human-readable name.
    pub display_name: String,
}

/// The set of vendors whose display controllers are reported as GPUs.
///
/// ```
/// use vgpu_core::discovery::vendors::VendorTable;
///
/// let mut table = VendorTable::builtin();
/// assert_eq!(table.get(0x10de).map(|v| v.key.as_str()), Some("nvidia"));
/// table.merge_str("vendors:\n  - id: '0x1002'\n    name: amd\n").unwrap();
/// assert!(table.get(0x1002).is_some());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VendorTable {
    vendors: BTreeMap<u16, Vendor>,
}

impl Default for VendorTable {
    fn default() -> Self {
        Self::builtin()
    }
}

/// One entry of a vendors document.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct VendorEntry {
    id: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    display_name: Option<String>,
    #[serde(default = "default_true")]
    enabled: bool,
}

fn default_true() -> bool {
    true
}

/// A vendors document.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct VendorsDocument {
    vendors: Vec<VendorEntry>,
}

/// A ConfigMap carrying vendors documents in `data`.
#[derive(Debug, Clone, Deserialize)]
struct ConfigMapShape {
    #[serde(default)]
    data: BTreeMap<String, String>,
}

/// Either shape of the file.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum VendorsFile {
    Document(VendorsDocument),
    ConfigMap(ConfigMapShape),
}

impl VendorTable {
    /// The built-in table: NVIDIA (`10de`) and MetaX (`9999`).
    pub fn builtin() -> Self {
        let mut vendors = BTreeMap::new();
        for (id, key, display_name) in
            [(NVIDIA_VENDOR_ID, "nvidia", "NVIDIA"), (METAX_VENDOR_ID, "metax", "MetaX")]
        {
            vendors.insert(id, Vendor { id, key: key.to_owned(), display_name: display_name.to_owned() });
        }
        Self { vendors }
    }

    /// An empty table (no vendor is supported).
    pub fn empty() -> Self {
        Self { vendors: BTreeMap::new() }
    }

    /// Adds or replaces a vendor.
    pub fn insert(&mut self, vendor: Vendor) {
        self.vendors.insert(vendor.id, vendor);
    }

    /// Removes a vendor.
    pub fn remove(&mut self, id: u16) -> Option<Vendor> {
        self.vendors.remove(&id)
    }

    /// The vendor with this PCI id, if supported.
    pub fn get(&self, id: u16) -> Option<&Vendor> {
        self.vendors.get(&id)
    }

    /// Whether the vendor is supported.
    pub fn contains(&self, id: u16) -> bool {
        self.vendors.contains_key(&id)
    }

    /// The supported vendors, by id.
    pub fn iter(&self) -> impl Iterator<Item = &Vendor> {
        self.vendors.values()
    }

    /// Merges a vendors file given as YAML (JSON is accepted too, as YAML is a superset of it).
    pub fn merge_str(&mut self, text: &str) -> Result<(), DiscoveryError> {
        let file: VendorsFile = serde_saphyr::from_str(text).map_err(|err| DiscoveryError::VendorsParse {
            source_name: "<string>".into(),
            message: err.to_string(),
        })?;
        self.merge_file(file, "<string>")
    }

    /// Merges a vendors file given as JSON.
    pub fn merge_json_str(&mut self, text: &str) -> Result<(), DiscoveryError> {
        let file: VendorsFile = serde_json::from_str(text).map_err(|err| DiscoveryError::VendorsParse {
            source_name: "<string>".into(),
            message: err.to_string(),
        })?;
        self.merge_file(file, "<string>")
    }

    /// Reads a vendors file (`.json` is parsed as JSON, anything else as YAML) and merges it into the table.
    pub fn merge_path(&mut self, path: &Path) -> Result<(), DiscoveryError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| DiscoveryError::VendorsRead { path: path.to_path_buf(), source })?;
        let name = path.display().to_string();
        let is_json = path.extension().is_some_and(|ext| ext.eq_ignore_ascii_case("json"));
        let parsed: Result<VendorsFile, String> = if is_json {
            serde_json::from_str(&text).map_err(|err| err.to_string())
        } else {
            serde_saphyr::from_str(&text).map_err(|err| err.to_string())
        };
        let file =
            parsed.map_err(|message| DiscoveryError::VendorsParse { source_name: name.clone(), message })?;
        self.merge_file(file, &name)
    }

    /// Merges into a copy and keeps it only if every document is valid, so a bad file changes nothing.
    fn merge_file(&mut self, file: VendorsFile, source_name: &str) -> Result<(), DiscoveryError> {
        let mut next = self.clone();
        next.merge_file_into(file, source_name)?;
        *self = next;
        Ok(())
    }

    fn merge_file_into(&mut self, file: VendorsFile, source_name: &str) -> Result<(), DiscoveryError> {
        match file {
            VendorsFile::Document(doc) => self.merge_document(doc, source_name),
            VendorsFile::ConfigMap(map) => {
                if map.data.is_empty() {
                    return Err(DiscoveryError::VendorsParse {
                        source_name: source_name.to_owned(),
                        message: "expected a `vendors` list or a ConfigMap with `data` entries".to_owned(),
                    });
                }
                for (key, value) in map.data {
                    let entry_name = format!("{source_name} (data.{key})");
                    let doc: VendorsDocument =
                        serde_saphyr::from_str(&value).map_err(|err| DiscoveryError::VendorsParse {
                            source_name: entry_name.clone(),
                            message: err.to_string(),
                        })?;
                    self.merge_document(doc, &entry_name)?;
                }
                Ok(())
            }
        }
    }

    fn merge_document(&mut self, doc: VendorsDocument, source_name: &str) -> Result<(), DiscoveryError> {
        // Validate everything before changing anything, so a bad file leaves the table untouched.
        let mut parsed = Vec::with_capacity(doc.vendors.len());
        for entry in doc.vendors {
            let id = parse_pci_id(&entry.id).map_err(|source| DiscoveryError::VendorId {
                source_name: source_name.to_owned(),
                value: entry.id.clone(),
                source,
            })?;
            parsed.push((id, entry));
        }
        for (id, entry) in parsed {
            if !entry.enabled {
                self.vendors.remove(&id);
                continue;
            }
            let existing = self.vendors.get(&id);
            let key = entry
                .name
                .map(|n| n.trim().to_ascii_lowercase())
                .filter(|n| !n.is_empty())
                .or_else(|| existing.map(|v| v.key.clone()))
                .unwrap_or_else(|| format!("{id:04x}"));
            let display_name = entry
                .display_name
                .filter(|n| !n.trim().is_empty())
                .or_else(|| existing.map(|v| v.display_name.clone()))
                .unwrap_or_else(|| key.clone());
            self.vendors.insert(id, Vendor { id, key, display_name });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_has_nvidia_and_metax() {
        let table = VendorTable::builtin();
        let keys: Vec<&str> = table.iter().map(|v| v.key.as_str()).collect();
        assert_eq!(keys, vec!["nvidia", "metax"]);
        assert!(!table.contains(0x1002));
    }

    #[test]
    fn configmap_shape_yaml() {
        let mut table = VendorTable::builtin();
        table
            .merge_str(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gpu-supported-vendors\ndata:\n  vendors.yaml: |\n    vendors:\n      - id: \"1002\"\n        name: AMD\n        displayName: Advanced Micro Devices\n      - id: \"0x9999\"\n        enabled: false\n",
            )
            .unwrap();
        assert_eq!(table.get(0x1002).map(|v| v.key.as_str()), Some("amd"));
        assert_eq!(table.get(0x1002).map(|v| v.display_name.as_str()), Some("Advanced Micro Devices"));
        assert!(!table.contains(0x9999));
        assert!(table.contains(0x10de));
    }

    #[test]
    fn json_document_and_configmap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vendors.json");
        std::fs::write(&path, r#"{"vendors":[{"id":"8086","name":"intel"}]}"#).unwrap();
        let mut table = VendorTable::builtin();
        table.merge_path(&path).unwrap();
        assert_eq!(table.get(0x8086).map(|v| v.key.as_str()), Some("intel"));

        let cm = dir.path().join("cm.json");
        std::fs::write(&cm, r#"{"kind":"ConfigMap","data":{"v":"{\"vendors\":[{\"id\":\"1002\"}]}"}}"#)
            .unwrap();
        table.merge_path(&cm).unwrap();
        assert_eq!(table.get(0x1002).map(|v| v.key.as_str()), Some("1002"));
    }

    #[test]
    fn bad_files_are_typed_errors_and_leave_table_untouched() {
        let mut table = VendorTable::builtin();
        let before = table.clone();
        let err = table.merge_str("vendors:\n  - id: '1002'\n  - id: nvidia\n").unwrap_err();
        assert!(matches!(err, DiscoveryError::VendorId { ref value, .. } if value == "nvidia"), "{err}");
        assert_eq!(table, before);
        assert!(matches!(table.merge_str("vendors: 3"), Err(DiscoveryError::VendorsParse { .. })));
        assert!(matches!(table.merge_str("data: {}"), Err(DiscoveryError::VendorsParse { .. })));
        assert!(matches!(table.merge_json_str("{"), Err(DiscoveryError::VendorsParse { .. })));
        let missing = Path::new("/nonexistent/vendors.yaml");
        assert!(matches!(table.merge_path(missing), Err(DiscoveryError::VendorsRead { .. })));
        assert_eq!(table, before);
    }
}

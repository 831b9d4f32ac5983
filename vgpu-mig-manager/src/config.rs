//! The MIG configuration file in the mig-parted format (the `config.yaml` key of the ConfigMap):
//!
//! ```yaml
//! version: v1
//! mig-configs:
//!   all-disabled:
//!     - devices: all            # `all`, or a list of GPU indexes [0, 1]
//!       mig-enabled: false
//!   all-1g.10gb:
//!     - devices: all
//!       mig-enabled: true
//!       mig-devices:            # profile → count per GPU (absent or empty: MIG on, no instances)
//!         "1g.10gb": 7
//! ```
//!
//! An entry with `device-filter` (one PCI device id or a list, `0x20B010DE`: NVML's `pciDeviceId`, device id
//! in the high 16 bits, vendor id in the low ones) applies only to the GPUs of its `devices` whose id is one of
//! them, as in mig-parted; a file can so hold one entry per GPU model under one configuration name. GPUs no
//! entry selects are left as they are. A GPU selected by two entries is an error.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

use serde::Deserialize;
use vgpu_core::backend::MigProfile;

/// The configuration file is unusable, or the selected configuration cannot apply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// Not YAML of the expected shape.
    #[error("cannot parse the MIG configuration {source_name}: {message}")]
    Parse {
        /// Where the text came from (`<namespace>/<configmap>[<key>]`).
        source_name: String,
        /// The parser's message.
        message: String,
    },
    /// `version` is not `v1`.
    #[error("MIG configuration {source_name}: version {version:?} is not supported (expected v1)")]
    Version {
        /// Where the text came from.
        source_name: String,
        /// The version found.
        version: String,
    },
    /// A field holds a bad value.
    #[error("MIG configuration {source_name}: {field}: {message}")]
    Invalid {
        /// Where the text came from.
        source_name: String,
        /// The field, e.g. `mig-configs.all-1g.10gb[0].mig-devices.1g.1gb`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The node asks for a configuration the file does not have.
    #[error("MIG configuration {name:?} does not exist (known: {known})")]
    UnknownConfig {
        /// The name from the node label.
        name: String,
        /// The names the file has, comma-separated.
        known: String,
    },
    /// The selected configuration filters devices by PCI id and a GPU's id cannot be read.
    #[error(
        "MIG configuration {name:?}: entry {entry} has a device-filter, but the PCI device id of GPU {index} cannot be read: {message}"
    )]
    DeviceId {
        /// The configuration.
        name: String,
        /// The entry index.
        entry: usize,
        /// The GPU.
        index: u32,
        /// Why it cannot be read.
        message: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    version: String,
    #[serde(rename = "mig-configs")]
    mig_configs: BTreeMap<String, Vec<EntrySpec>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EntrySpec {
    devices: DevicesSpec,
    #[serde(rename = "device-filter", default)]
    device_filter: Option<DeviceFilterSpec>,
    #[serde(rename = "mig-enabled")]
    mig_enabled: bool,
    #[serde(rename = "mig-devices", default)]
    mig_devices: BTreeMap<String, u32>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum DevicesSpec {
    Word(String),
    List(Vec<u32>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum DeviceFilterSpec {
    One(String),
    Many(Vec<String>),
}

/// Which GPUs an entry applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSelector {
    /// Every GPU of the node.
    All,
    /// These indexes.
    Indexes(Vec<u32>),
}

impl DeviceSelector {
    /// Whether GPU `index` is selected.
    pub fn selects(&self, index: u32) -> bool {
        match self {
            Self::All => true,
            Self::Indexes(list) => list.contains(&index),
        }
    }
}

/// One entry of a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigConfigEntry {
    /// The GPUs.
    pub devices: DeviceSelector,
    /// The `device-filter` values (PCI device ids, NVML `pciDeviceId`); empty: no filter.
    pub device_filter: Vec<u32>,
    /// MIG mode wanted.
    pub mig_enabled: bool,
    /// Instances per GPU: profile → count.
    pub mig_devices: BTreeMap<MigProfile, u32>,
}

/// A parsed configuration file: name → entries.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MigConfigFile {
    /// The configurations.
    pub configs: BTreeMap<String, Vec<MigConfigEntry>>,
}

/// What one GPU should look like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuTarget {
    /// MIG on or off.
    pub mig_enabled: bool,
    /// Instances: profile → count (empty when off).
    pub mig_devices: BTreeMap<MigProfile, u32>,
}

impl MigConfigFile {
    /// Parses the YAML text; `source_name` names it in errors.
    pub fn parse(text: &str, source_name: &str) -> Result<Self, ConfigError> {
        let spec: FileSpec = serde_saphyr::from_str(text).map_err(|err| ConfigError::Parse {
            source_name: source_name.to_owned(),
            message: err.to_string(),
        })?;
        if spec.version != "v1" {
            return Err(ConfigError::Version { source_name: source_name.to_owned(), version: spec.version });
        }
        let invalid = |field: String, message: String| ConfigError::Invalid {
            source_name: source_name.to_owned(),
            field,
            message,
        };
        let mut configs = BTreeMap::new();
        for (name, entries) in spec.mig_configs {
            let mut parsed = Vec::with_capacity(entries.len());
            for (e, entry) in entries.into_iter().enumerate() {
                let field = |f: &str| format!("mig-configs.{name}[{e}].{f}");
                let devices = match entry.devices {
                    DevicesSpec::Word(w) if w == "all" => DeviceSelector::All,
                    DevicesSpec::Word(w) => {
                        return Err(invalid(
                            field("devices"),
                            format!("{w:?} is neither `all` nor a list of GPU indexes"),
                        ));
                    }
                    DevicesSpec::List(list) if list.is_empty() => {
                        return Err(invalid(field("devices"), "the list is empty".to_owned()));
                    }
                    DevicesSpec::List(list) => DeviceSelector::Indexes(list),
                };
                let mut mig_devices = BTreeMap::new();
                for (profile, count) in entry.mig_devices {
                    let parsed_profile = profile
                        .parse::<MigProfile>()
                        .map_err(|err| invalid(field(&format!("mig-devices.{profile}")), err.to_string()))?;
                    if count == 0 {
                        continue;
                    }
                    if !entry.mig_enabled {
                        return Err(invalid(
                            field("mig-devices"),
                            "instances are only allowed with mig-enabled: true".to_owned(),
                        ));
                    }
                    mig_devices.insert(parsed_profile, count);
                }
                let filter_texts = match entry.device_filter {
                    None => Vec::new(),
                    Some(DeviceFilterSpec::One(one)) => vec![one],
                    Some(DeviceFilterSpec::Many(many)) if many.is_empty() => {
                        return Err(invalid(field("device-filter"), "the list is empty".to_owned()));
                    }
                    Some(DeviceFilterSpec::Many(many)) => many,
                };
                let mut device_filter = Vec::with_capacity(filter_texts.len());
                for text in filter_texts {
                    let id = vgpu_core::backend::parse_pci_device_id(text.trim()).ok_or_else(|| {
                        invalid(
                            field("device-filter"),
                            format!("{text:?} is not a PCI device id such as 0x20B010DE"),
                        )
                    })?;
                    device_filter.push(id);
                }
                parsed.push(MigConfigEntry {
                    devices,
                    device_filter,
                    mig_enabled: entry.mig_enabled,
                    mig_devices,
                });
            }
            configs.insert(name, parsed);
        }
        Ok(Self { configs })
    }

    /// The target of each selected GPU of a node with `gpu_count` GPUs under configuration `name` (GPUs no
    /// entry selects are absent). `pci_device_id` reads a GPU's PCI device id; it is called only for entries
    /// with a `device-filter`, once per GPU.
    pub fn targets(
        &self,
        name: &str,
        gpu_count: u32,
        pci_device_id: impl Fn(u32) -> Result<u32, String>,
    ) -> Result<BTreeMap<u32, GpuTarget>, ConfigError> {
        let entries = self.configs.get(name).ok_or_else(|| ConfigError::UnknownConfig {
            name: name.to_owned(),
            known: self.configs.keys().cloned().collect::<Vec<_>>().join(", "),
        })?;
        let mut targets = BTreeMap::new();
        let mut ids: BTreeMap<u32, u32> = BTreeMap::new();
        for (e, entry) in entries.iter().enumerate() {
            let field = format!("mig-configs.{name}[{e}].devices");
            if let DeviceSelector::Indexes(list) = &entry.devices
                && let Some(bad) = list.iter().find(|i| **i >= gpu_count)
            {
                return Err(ConfigError::Invalid {
                    source_name: "the selected configuration".to_owned(),
                    field,
                    message: format!("GPU index {bad} does not exist (the node has {gpu_count} GPUs)"),
                });
            }
            for index in (0..gpu_count).filter(|i| entry.devices.selects(*i)) {
                if !entry.device_filter.is_empty() {
                    let id = match ids.entry(index) {
                        Entry::Occupied(known) => *known.get(),
                        Entry::Vacant(slot) => *slot.insert(pci_device_id(index).map_err(|message| {
                            ConfigError::DeviceId { name: name.to_owned(), entry: e, index, message }
                        })?),
                    };
                    if !entry.device_filter.contains(&id) {
                        continue;
                    }
                }
                let target =
                    GpuTarget { mig_enabled: entry.mig_enabled, mig_devices: entry.mig_devices.clone() };
                if targets.insert(index, target).is_some() {
                    return Err(ConfigError::Invalid {
                        source_name: "the selected configuration".to_owned(),
                        field: field.clone(),
                        message: format!("GPU {index} is selected by more than one entry"),
                    });
                }
            }
        }
        Ok(targets)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    pub(crate) const FILE: &str = r#"
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
  mixed:
    - devices: [0]
      mig-enabled: true
      mig-devices: { "3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1, "1g.20gb": 0 }
    - devices: [1]
      mig-enabled: false
  filtered:
    - device-filter: ["0x20B010DE", "0x20B110DE"]
      devices: all
      mig-enabled: true
"#;

    /// No GPU's PCI device id can be read.
    fn no_ids(_: u32) -> Result<u32, String> {
        Err("unknown".to_owned())
    }

    /// A100 40GB (`0x20B010DE`) and A100 80GB (`0x20B210DE`) on one node: each entry of one configuration applies
    /// to its model only, and the ids are read once per GPU.
    #[test]
    fn device_filters_select_gpus_by_pci_device_id() {
        let text = r#"
version: v1
mig-configs:
  per-model:
    - devices: all
      device-filter: "0x20B010DE"
      mig-enabled: true
      mig-devices: { "1g.5gb": 7 }
    - devices: [1, 2, 3]
      device-filter: ["0x20b210de", "0x20B510DE"]
      mig-enabled: true
      mig-devices: { "1g.10gb": 7 }
"#;
        let file = MigConfigFile::parse(text, "t").unwrap();
        assert_eq!(file.configs["per-model"][0].device_filter, [0x20B0_10DE]);
        assert_eq!(file.configs["per-model"][1].device_filter, [0x20B2_10DE, 0x20B5_10DE]);
        let models = [0x20B0_10DE, 0x20B2_10DE, 0x20B0_10DE, 0x20B2_10DE];
        let reads = std::cell::Cell::new(0);
        let targets = file
            .targets("per-model", 4, |i| {
                reads.set(reads.get() + 1);
                Ok(models[i as usize])
            })
            .unwrap();
        assert_eq!(reads.get(), 4);
        let small: MigProfile = "1g.5gb".parse().unwrap();
        let large: MigProfile = "1g.10gb".parse().unwrap();
        assert_eq!(targets.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert!(targets[&0].mig_devices.contains_key(&small) && targets[&2].mig_devices.contains_key(&small));
        assert!(targets[&1].mig_devices.contains_key(&large) && targets[&3].mig_devices.contains_key(&large));
        // A model no entry names is left alone; a filter matching no GPU selects nothing.
        let other = file.targets("per-model", 4, |_| Ok(0x2330_10DE)).unwrap();
        assert!(other.is_empty());
        for (filter, expected) in [
            ("\"20B010DE\"", "\"20B010DE\" is not a PCI device id such as 0x20B010DE"),
            ("\"0x1234567890\"", "is not a PCI device id"),
            ("[]", "mig-configs.c[0].device-filter: the list is empty"),
        ] {
            let text = format!(
                "version: v1\nmig-configs: {{ c: [ {{ devices: all, device-filter: {filter}, mig-enabled: false }} ] }}\n"
            );
            let err = MigConfigFile::parse(&text, "t").unwrap_err().to_string();
            assert!(err.contains(expected) && err.contains("device-filter"), "{err}");
        }
    }

    #[test]
    fn parses_the_mig_parted_format() {
        let file = MigConfigFile::parse(FILE, "test").unwrap();
        assert_eq!(file.configs.len(), 4);
        let all = file.targets("all-1g.10gb", 2, no_ids).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[&1].mig_devices[&"1g.10gb".parse().unwrap()], 7);
        let mixed = file.targets("mixed", 3, no_ids).unwrap();
        assert_eq!(mixed.keys().copied().collect::<Vec<_>>(), vec![0, 1], "GPU 2 is left alone");
        assert_eq!(mixed[&0].mig_devices.len(), 3, "a zero count is dropped");
        assert!(!mixed[&1].mig_enabled);
        assert_eq!(file.targets("all-disabled", 1, no_ids).unwrap()[&0].mig_devices.len(), 0);
    }

    #[test]
    fn errors_name_the_input() {
        let file = MigConfigFile::parse(FILE, "test").unwrap();
        assert_eq!(
            file.targets("nope", 1, no_ids).unwrap_err().to_string(),
            "MIG configuration \"nope\" does not exist (known: all-1g.10gb, all-disabled, filtered, mixed)"
        );
        assert_eq!(
            file.targets("filtered", 1, no_ids).unwrap_err().to_string(),
            "MIG configuration \"filtered\": entry 0 has a device-filter, but the PCI device id of GPU 0 cannot be read: unknown"
        );
        assert!(matches!(file.targets("mixed", 1, no_ids), Err(ConfigError::Invalid { .. })));
        let cases = [
            ("version: v2\nmig-configs: {}\n", "version \"v2\" is not supported"),
            (
                "version: v1\nmig-configs: { a: [ { devices: some, mig-enabled: true } ] }\n",
                "mig-configs.a[0].devices",
            ),
            (
                "version: v1\nmig-configs: { a: [ { devices: [], mig-enabled: true } ] }\n",
                "mig-configs.a[0].devices: the list is empty",
            ),
            (
                "version: v1\nmig-configs: { a: [ { devices: all, mig-enabled: true, mig-devices: { 1g.big: 1 } } ] }\n",
                "mig-configs.a[0].mig-devices.1g.big: \"1g.big\" is not a MIG profile",
            ),
            (
                "version: v1\nmig-configs: { a: [ { devices: all, mig-enabled: false, mig-devices: { 1g.10gb: 1 } } ] }\n",
                "only allowed with mig-enabled: true",
            ),
            ("version: v1\nmig-configs: { a: [ { devices: all } ] }\n", "cannot parse"),
            (
                "version: v1\nmig-configs: { a: [ { devices: all, mig-enabled: true, extra: 1 } ] }\n",
                "cannot parse",
            ),
            ("::", "cannot parse"),
        ];
        for (text, expected) in cases {
            let err = MigConfigFile::parse(text, "ns/cm[config.yaml]").unwrap_err().to_string();
            assert!(err.contains(expected), "{text}: {err}");
            assert!(err.contains("ns/cm[config.yaml]"), "{err}");
        }
        let twice = "version: v1\nmig-configs: { a: [ { devices: all, mig-enabled: false }, { devices: [0], mig-enabled: true } ] }\n";
        let err = MigConfigFile::parse(twice, "t").unwrap().targets("a", 1, no_ids).unwrap_err().to_string();
        assert!(err.contains("GPU 0 is selected by more than one entry"), "{err}");
    }

    proptest::proptest! {
        #[test]
        fn parsing_never_panics(text in proptest::prelude::any::<String>()) {
            let _ = MigConfigFile::parse(&text, "p");
        }

        #[test]
        fn parsing_plausible_configs_never_panics(
            devices in "(all|\\[[0-9]\\]|\\[\\]|some)",
            profile in "[0-9]{1,2}g\\.[0-9]{1,3}gb|x",
            count in 0u32..10,
            enabled in proptest::prelude::any::<bool>(),
        ) {
            let text = format!("version: v1\nmig-configs:\n  c:\n    - devices: {devices}\n      mig-enabled: {enabled}\n      mig-devices: {{ \"{profile}\": {count} }}\n");
            if let Ok(file) = MigConfigFile::parse(&text, "p") {
                let _ = file.targets("c", 4, |i| Ok(0x20B0_10DE + i));
            }
        }
    }
}

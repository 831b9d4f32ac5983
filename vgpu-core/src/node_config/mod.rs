//! The device plugin's per-node config file (contract §6) and the effective node settings it overrides.
//!
//! * `.json`: JSON with comments (and trailing commas), top level an array of specs.
//! * `.yaml` / `.yml`: `{version: v1, configs: [...]}` (missing version means `v1`).
//!
//! A spec applies to a node whose name equals its `nodeName`; if no spec matches exactly, the first spec whose
//! `nodeName`, as a regular expression anchored at both ends, matches the node name applies. Values in the
//! file override the flags ([`NodeSettings`]). Unlike upstream, `gdrcopyEnabled` is honoured and
//! `excludeDevices` also accepts `0-2` ranges.
//!
//! ```
//! use vgpu_core::node_config::{NodeConfigFile, NodeSettings};
//! let file = NodeConfigFile::parse_yaml("inline", "configs:\n- nodeName: gpu-.*\n  deviceSplitCount: 4\n")?;
//! let settings = file.resolve("gpu-7", NodeSettings::default())?;
//! assert_eq!(settings.device_split_count, 4);
//! # Ok::<(), vgpu_core::node_config::NodeConfigError>(())
//! ```

mod exclude;
mod jsonc;

use std::path::Path;

use serde::Deserialize;

pub use exclude::{ExcludeDevices, InvalidExcludeEntry};

use crate::model::NodeVgpuConfig;

/// A config file that cannot be read, parsed or applied.
#[derive(Debug, thiserror::Error)]
pub enum NodeConfigError {
    /// The file could not be read.
    #[error("cannot read node config file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file name ends in neither `.json`, `.yaml` nor `.yml`.
    #[error("unsupported config file format: {path} (expected a .json, .yaml or .yml file)")]
    UnsupportedFormat {
        /// The file.
        path: String,
    },
    /// The JSON file is malformed or has a field of the wrong type.
    #[error("invalid node config {source_name}: expected a JSON array of node config specs: {source}")]
    Json {
        /// The file (or input name).
        source_name: String,
        /// The JSON error (line/column refer to the original file).
        #[source]
        source: serde_json::Error,
    },
    /// The YAML file is malformed or has a field of the wrong type.
    #[error("invalid node config {source_name}: expected {{version: v1, configs: [...]}}: {source}")]
    Yaml {
        /// The file (or input name).
        source_name: String,
        /// The YAML error.
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    /// The YAML `version` is not `v1`.
    #[error("unknown config version: {version:?} (expected \"v1\")")]
    UnknownVersion {
        /// The rejected version.
        version: String,
    },
    /// A spec's `nodeName` is empty or not a valid regular expression.
    #[error("invalid nodeName {node_name:?} in spec {index}: {problem}")]
    InvalidNodeName {
        /// Position of the spec in the file.
        index: usize,
        /// The rejected `nodeName`.
        node_name: String,
        /// Why it was rejected.
        problem: String,
    },
    /// A setting is out of range or not one of its allowed values.
    #[error("invalid {field} value {value}: expected {expected}")]
    InvalidValue {
        /// The field, as spelled in the file (`deviceSplitCount`).
        field: &'static str,
        /// The rejected value, as text.
        value: String,
        /// What is allowed.
        expected: &'static str,
    },
}

fn invalid(field: &'static str, value: impl std::fmt::Display, expected: &'static str) -> NodeConfigError {
    NodeConfigError::InvalidValue { field, value: value.to_string(), expected }
}

// === Settings ===

/// How the device plugin tells the runtime which devices a container gets (`deviceListStrategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceListStrategy {
    /// `envvar`.
    Envvar,
    /// `volume-mounts`.
    VolumeMounts,
    /// `cdi-annotations`.
    CdiAnnotations,
    /// `cdi-cri`.
    CdiCri,
}

impl DeviceListStrategy {
    /// The string form.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceListStrategy::Envvar => "envvar",
            DeviceListStrategy::VolumeMounts => "volume-mounts",
            DeviceListStrategy::CdiAnnotations => "cdi-annotations",
            DeviceListStrategy::CdiCri => "cdi-cri",
        }
    }

    /// Parses one strategy name.
    pub fn parse(s: &str) -> Result<Self, NodeConfigError> {
        match s.trim() {
            "envvar" => Ok(DeviceListStrategy::Envvar),
            "volume-mounts" => Ok(DeviceListStrategy::VolumeMounts),
            "cdi-annotations" => Ok(DeviceListStrategy::CdiAnnotations),
            "cdi-cri" => Ok(DeviceListStrategy::CdiCri),
            _ => Err(invalid(
                "deviceListStrategy",
                format!("{s:?}"),
                "envvar, volume-mounts, cdi-annotations or cdi-cri",
            )),
        }
    }
}

/// MIG handling (`migStrategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MigStrategy {
    /// `none`: no MIG resources.
    None,
    /// `single`: every GPU is MIG-partitioned the same way.
    Single,
    /// `mixed` (default): `mig-<profile>` resources per profile.
    #[default]
    Mixed,
}

impl MigStrategy {
    /// Parses `none|single|mixed`.
    pub fn parse(s: &str) -> Result<Self, NodeConfigError> {
        match s {
            "none" => Ok(MigStrategy::None),
            "single" => Ok(MigStrategy::Single),
            "mixed" => Ok(MigStrategy::Mixed),
            _ => Err(invalid("migStrategy", format!("{s:?}"), "none, single or mixed")),
        }
    }
}

/// Cgroup driver of the node (`cgroupDriver`); any other value means auto-detect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CgroupDriver {
    /// Detect from the kubelet config.
    #[default]
    Auto,
    /// `cgroupfs`.
    Cgroupfs,
    /// `systemd`.
    Systemd,
}

impl CgroupDriver {
    /// `cgroupfs` / `systemd`; anything else is [`CgroupDriver::Auto`].
    pub fn parse(s: &str) -> Self {
        match s.trim() {
            "cgroupfs" => CgroupDriver::Cgroupfs,
            "systemd" => CgroupDriver::Systemd,
            _ => CgroupDriver::Auto,
        }
    }
}

/// IMEX channel settings.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ImexSettings {
    /// Channel ids to inject.
    pub channel_ids: Vec<u32>,
    /// Fail allocation when the channels are missing.
    pub required: bool,
}

/// The effective device-plugin node settings: flag defaults, overridden by the matching file spec.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSettings {
    /// `cgroupDriver`.
    pub cgroup_driver: CgroupDriver,
    /// `deviceListStrategy` (default `[envvar]`).
    pub device_list_strategy: Vec<DeviceListStrategy>,
    /// `deviceSplitCount` (default 10).
    pub device_split_count: u32,
    /// `deviceMemoryScaling` (default 1).
    pub device_memory_scaling: f64,
    /// `deviceMemoryFactor` (default 1, > 0).
    pub device_memory_factor: u32,
    /// `deviceCoresScaling` (default 1).
    pub device_cores_scaling: f64,
    /// `excludeDevices`.
    pub exclude_devices: ExcludeDevices,
    /// `gdsEnabled`.
    pub gds_enabled: bool,
    /// `mofedEnabled`.
    pub mofed_enabled: bool,
    /// `gdrcopyEnabled` (honoured from the file, unlike upstream).
    pub gdrcopy_enabled: bool,
    /// `migStrategy` (default mixed).
    pub mig_strategy: MigStrategy,
    /// `openKernelModules`.
    pub open_kernel_modules: bool,
    /// `imex`.
    pub imex: ImexSettings,
}

impl Default for NodeSettings {
    /// The device plugin's flag defaults.
    fn default() -> Self {
        Self {
            cgroup_driver: CgroupDriver::Auto,
            device_list_strategy: vec![DeviceListStrategy::Envvar],
            device_split_count: 10,
            device_memory_scaling: 1.0,
            device_memory_factor: 1,
            device_cores_scaling: 1.0,
            exclude_devices: ExcludeDevices::default(),
            gds_enabled: false,
            mofed_enabled: false,
            gdrcopy_enabled: false,
            mig_strategy: MigStrategy::Mixed,
            open_kernel_modules: false,
            imex: ImexSettings::default(),
        }
    }
}

impl NodeSettings {
    /// Checks the values that flags can also set (scaling ≥ 0 and finite, factor > 0, a strategy given).
    pub fn validate(&self) -> Result<(), NodeConfigError> {
        check_scaling("deviceMemoryScaling", self.device_memory_scaling)?;
        check_scaling("deviceCoresScaling", self.device_cores_scaling)?;
        if self.device_memory_factor == 0 {
            return Err(invalid("deviceMemoryFactor", 0, "an integer greater than 0"));
        }
        if self.device_list_strategy.is_empty() {
            return Err(invalid("deviceListStrategy", "[]", "at least one strategy"));
        }
        Ok(())
    }

    /// The values published in `node-config-info`.
    pub fn vgpu_config(&self) -> NodeVgpuConfig {
        NodeVgpuConfig {
            device_split: self.device_split_count,
            cores_scaling: self.device_cores_scaling,
            memory_scaling: self.device_memory_scaling,
            memory_factor: self.device_memory_factor,
        }
    }
}

fn check_scaling(field: &'static str, v: f64) -> Result<f64, NodeConfigError> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(invalid(field, v, "a number greater than or equal to 0"))
    }
}

// === File specs ===

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
enum Scalar {
    Int(i64),
    Str(String),
}

impl Scalar {
    fn text(&self) -> String {
        match self {
            Scalar::Int(i) => i.to_string(),
            Scalar::Str(s) => s.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(Scalar),
    Many(Vec<Scalar>),
}

impl OneOrMany {
    fn items(&self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => s.text().split(',').map(str::to_owned).collect(),
            OneOrMany::Many(v) => v.iter().map(Scalar::text).collect(),
        }
    }
}

/// `imex` block of a spec.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImexSpec {
    /// `channelIDs`.
    #[serde(rename = "channelIDs", default)]
    pub channel_ids: Option<Vec<i64>>,
    /// `required`.
    #[serde(default)]
    pub required: Option<bool>,
}

/// One entry of the config file, as written (every setting optional).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeConfigSpec {
    /// Node name, or a regular expression matched against the whole node name.
    pub node_name: String,
    /// `cgroupDriver`.
    #[serde(default)]
    pub cgroup_driver: Option<String>,
    #[serde(default)]
    device_list_strategy: Option<OneOrMany>,
    /// `deviceSplitCount`.
    #[serde(default)]
    pub device_split_count: Option<i64>,
    /// `deviceMemoryScaling`.
    #[serde(default)]
    pub device_memory_scaling: Option<f64>,
    /// `deviceMemoryFactor`.
    #[serde(default)]
    pub device_memory_factor: Option<i64>,
    /// `deviceCoresScaling`.
    #[serde(default)]
    pub device_cores_scaling: Option<f64>,
    #[serde(default)]
    exclude_devices: Option<OneOrMany>,
    /// `gdsEnabled`.
    #[serde(default)]
    pub gds_enabled: Option<bool>,
    /// `mofedEnabled`.
    #[serde(default)]
    pub mofed_enabled: Option<bool>,
    /// `gdrcopyEnabled`.
    #[serde(default)]
    pub gdrcopy_enabled: Option<bool>,
    /// `migStrategy`.
    #[serde(default)]
    pub mig_strategy: Option<String>,
    /// `openKernelModules`.
    #[serde(default)]
    pub open_kernel_modules: Option<bool>,
    /// `imex`.
    #[serde(default)]
    pub imex: Option<ImexSpec>,
}

impl NodeConfigSpec {
    /// Overrides `base` with every value this spec sets, validating each (errors name the field and value).
    pub fn apply(&self, mut base: NodeSettings) -> Result<NodeSettings, NodeConfigError> {
        if let Some(d) = &self.cgroup_driver {
            base.cgroup_driver = CgroupDriver::parse(d);
        }
        if let Some(s) = &self.device_list_strategy {
            let items: Vec<String> = s.items().into_iter().filter(|i| !i.trim().is_empty()).collect();
            base.device_list_strategy =
                items.iter().map(|i| DeviceListStrategy::parse(i)).collect::<Result<_, _>>()?;
        }
        if let Some(n) = self.device_split_count {
            base.device_split_count = u32::try_from(n)
                .map_err(|_| invalid("deviceSplitCount", n, "an integer greater than or equal to 0"))?;
        }
        if let Some(v) = self.device_memory_scaling {
            base.device_memory_scaling = check_scaling("deviceMemoryScaling", v)?;
        }
        if let Some(n) = self.device_memory_factor {
            base.device_memory_factor = u32::try_from(n)
                .ok()
                .filter(|&f| f > 0)
                .ok_or_else(|| invalid("deviceMemoryFactor", n, "an integer greater than 0"))?;
        }
        if let Some(v) = self.device_cores_scaling {
            base.device_cores_scaling = check_scaling("deviceCoresScaling", v)?;
        }
        if let Some(ex) = &self.exclude_devices {
            let mut parsed = ExcludeDevices::default();
            for item in ex.items() {
                parsed.push_entry(&item).map_err(|e| {
                    invalid(
                        "excludeDevices",
                        format!("{:?}", e.entry),
                        "GPU indices, 0..2 / 0-2 ranges or UUIDs",
                    )
                })?;
            }
            base.exclude_devices = parsed;
        }
        if let Some(b) = self.gds_enabled {
            base.gds_enabled = b;
        }
        if let Some(b) = self.mofed_enabled {
            base.mofed_enabled = b;
        }
        if let Some(b) = self.gdrcopy_enabled {
            base.gdrcopy_enabled = b;
        }
        if let Some(m) = &self.mig_strategy {
            base.mig_strategy = MigStrategy::parse(m)?;
        }
        if let Some(b) = self.open_kernel_modules {
            base.open_kernel_modules = b;
        }
        if let Some(imex) = &self.imex {
            if let Some(ids) = &imex.channel_ids {
                base.imex.channel_ids = ids
                    .iter()
                    .map(|&id| {
                        u32::try_from(id)
                            .map_err(|_| invalid("imex.channelIDs", id, "non-negative channel ids"))
                    })
                    .collect::<Result<_, _>>()?;
            }
            if let Some(r) = imex.required {
                base.imex.required = r;
            }
        }
        base.validate()?;
        Ok(base)
    }
}

#[derive(Deserialize)]
struct YamlFile {
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    configs: Vec<NodeConfigSpec>,
}

/// A parsed node config file: specs with their node-name patterns compiled.
#[derive(Debug, Clone)]
pub struct NodeConfigFile {
    specs: Vec<(NodeConfigSpec, regex::Regex)>,
}

impl NodeConfigFile {
    /// Reads a file, choosing the format by suffix (`.json`, `.yaml`, `.yml`).
    pub fn load(path: impl AsRef<Path>) -> Result<Self, NodeConfigError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
        let parse: fn(&str, &str) -> Result<Self, NodeConfigError> = match ext.as_deref() {
            Some("json") => Self::parse_json,
            Some("yaml" | "yml") => Self::parse_yaml,
            _ => return Err(NodeConfigError::UnsupportedFormat { path: name }),
        };
        let text = std::fs::read_to_string(path)
            .map_err(|source| NodeConfigError::Io { path: name.clone(), source })?;
        parse(&name, &text)
    }

    /// Parses the JSON-with-comments form (a top-level array of specs).
    pub fn parse_json(source_name: &str, text: &str) -> Result<Self, NodeConfigError> {
        let specs: Vec<NodeConfigSpec> = serde_json::from_str(&jsonc::strip(text))
            .map_err(|source| NodeConfigError::Json { source_name: source_name.to_owned(), source })?;
        Self::from_specs(specs)
    }

    /// Parses the YAML form (`{version: v1, configs: [...]}`).
    pub fn parse_yaml(source_name: &str, text: &str) -> Result<Self, NodeConfigError> {
        let file: YamlFile = serde_saphyr::from_str(text).map_err(|source| NodeConfigError::Yaml {
            source_name: source_name.to_owned(),
            source: Box::new(source),
        })?;
        match file.version.as_deref() {
            None | Some("v1") => Self::from_specs(file.configs),
            Some(other) => Err(NodeConfigError::UnknownVersion { version: other.to_owned() }),
        }
    }

    /// Builds from specs, compiling each `nodeName` as `^(?:nodeName)$`.
    pub fn from_specs(specs: Vec<NodeConfigSpec>) -> Result<Self, NodeConfigError> {
        let mut compiled = Vec::with_capacity(specs.len());
        for (index, spec) in specs.into_iter().enumerate() {
            if spec.node_name.trim().is_empty() {
                return Err(NodeConfigError::InvalidNodeName {
                    index,
                    node_name: spec.node_name,
                    problem: "must not be empty".to_owned(),
                });
            }
            let re = regex::Regex::new(&format!("^(?:{})$", spec.node_name)).map_err(|e| {
                NodeConfigError::InvalidNodeName {
                    index,
                    node_name: spec.node_name.clone(),
                    problem: format!("not a valid regular expression: {e}"),
                }
            })?;
            compiled.push((spec, re));
        }
        Ok(Self { specs: compiled })
    }

    /// The specs, in file order.
    pub fn specs(&self) -> impl Iterator<Item = &NodeConfigSpec> {
        self.specs.iter().map(|(s, _)| s)
    }

    /// The spec for a node: an exact `nodeName` match first, else the first whose anchored pattern matches.
    pub fn spec_for(&self, node_name: &str) -> Option<&NodeConfigSpec> {
        self.specs
            .iter()
            .find(|(s, _)| s.node_name == node_name)
            .or_else(|| self.specs.iter().find(|(_, re)| re.is_match(node_name)))
            .map(|(s, _)| s)
    }

    /// The effective settings for a node: `flags` overridden by its spec (if any), validated.
    pub fn resolve(&self, node_name: &str, flags: NodeSettings) -> Result<NodeSettings, NodeConfigError> {
        match self.spec_for(node_name) {
            Some(spec) => spec.apply(flags),
            None => {
                flags.validate()?;
                Ok(flags)
            }
        }
    }
}

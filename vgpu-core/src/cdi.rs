//! The Container Device Interface (CDI) spec model: the JSON a CDI spec file holds, field for field as the
//! CDI specification (`tags.cncf.io/container-device-interface/specs-go`) defines it, in its field order and
//! with its `omitempty` rules, plus the specification's validation rules for those fields ([`validate`]).
//!
//! The device plugin's node specs (`vgpu-deviceplugin`) and the DRA plugin's per-claim specs (`vgpu-dra`)
//! are both built from these types; what goes into them is theirs.
//!
//! | type | JSON | fields |
//! |---|---|---|
//! | [`Spec`] | the file | `cdiVersion`, `kind`, `annotations`, `devices`, `containerEdits` |
//! | [`Device`] | `devices[]` | `name`, `annotations`, `containerEdits` |
//! | [`ContainerEdits`] | `containerEdits` | `env`, `deviceNodes`, `hooks`, `mounts`, `additionalGids` |
//! | [`DeviceNode`] | `deviceNodes[]` | `path`, `hostPath`, `type`, `major`, `minor`, `fileMode`, `permissions`, `uid`, `gid` |
//! | [`Hook`] | `hooks[]` | `hookName`, `path`, `args`, `env`, `timeout` |
//! | [`Mount`] | `mounts[]` | `hostPath`, `containerPath`, `options`, `type` |
//!
//! Empty lists, maps and strings and absent numbers are left out of the JSON (`omitempty`); `devices`,
//! `containerEdits` (of the spec and of each device), `name`, `path`, `hostPath` of a mount and
//! `containerPath` are always written. Not modelled: `netDevices` and `intelRdt` (CDI 0.7 and later), which
//! vgpu never writes.
//!
//! ```
//! use vgpu_core::cdi::{ContainerEdits, Device, DeviceNode, SPEC_VERSION, Spec, validate};
//!
//! let spec = Spec {
//!     cdi_version: SPEC_VERSION.into(),
//!     kind: "example.com/gpu".into(),
//!     devices: vec![Device {
//!         name: "gpu0".into(),
//!         container_edits: ContainerEdits {
//!             device_nodes: vec![DeviceNode::new("/dev/nvidia0", "/dev/nvidia0")],
//!             ..ContainerEdits::default()
//!         },
//!         ..Device::default()
//!     }],
//!     ..Spec::default()
//! };
//! validate(&spec)?;
//! assert_eq!(
//!     serde_json::to_string(&spec)?,
//!     r#"{"cdiVersion":"0.5.0","kind":"example.com/gpu","devices":[{"name":"gpu0","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia0","hostPath":"/dev/nvidia0"}]}}],"containerEdits":{}}"#
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::{collections::BTreeMap, path::Path};

use serde::{Deserialize, Serialize};

/// The CDI version vgpu's specs declare (env, mounts and device nodes are all in 0.5.0).
pub const SPEC_VERSION: &str = "0.5.0";

/// The released CDI specification versions a spec may declare.
pub const CDI_VERSIONS: [&str; 8] = ["0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0"];

/// A CDI spec file.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// `cdiVersion`.
    pub cdi_version: String,
    /// `vendor/class`.
    pub kind: String,
    /// Spec annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The devices.
    #[serde(default)]
    pub devices: Vec<Device>,
    /// Edits applied whenever any device of the spec is used.
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

/// One device of a [`Spec`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// The name after `=` in the qualified device name (`<kind>=<name>`).
    pub name: String,
    /// Device annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// What the device adds to a container.
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

/// What a spec or device adds to a container.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `KEY=value` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// OCI hooks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    /// Mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// Additional group IDs of the container's process.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional_gids: Vec<u32>,
}

impl ContainerEdits {
    /// No edit at all.
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.hooks.is_empty()
            && self.mounts.is_empty()
            && self.additional_gids.is_empty()
    }
}

/// A device node of [`ContainerEdits`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the host (the container path when empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host_path: String,
    /// `b`, `c`, `u` or `p` (read from the host node when empty).
    #[serde(default, rename = "type", skip_serializing_if = "String::is_empty")]
    pub node_type: String,
    /// Major number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    /// Minor number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// File mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// Cgroup permissions (`r`, `w`, `m`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub permissions: String,
    /// Owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

impl DeviceNode {
    /// The node at container path `path`, `host_path` on the host.
    pub fn new(path: impl Into<String>, host_path: impl Into<String>) -> Self {
        Self { path: path.into(), host_path: host_path.into(), ..Self::default() }
    }

    /// The node at container path `path`, found on the host under `host_driver_root`.
    pub fn under(path: &str, host_driver_root: &Path) -> Self {
        Self::new(path, host_driver_root.join(path.trim_start_matches('/')).display().to_string())
    }
}

/// An OCI hook of [`ContainerEdits`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    /// The OCI hook point (`createContainer`, `startContainer`, ...).
    pub hook_name: String,
    /// The executable.
    pub path: String,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Its environment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Timeout in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

/// A mount of [`ContainerEdits`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// Source on the host.
    pub host_path: String,
    /// Destination in the container.
    pub container_path: String,
    /// Mount options (`ro`/`rw`, `nosuid`, `nodev`, `bind`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// Mount type.
    #[serde(default, rename = "type", skip_serializing_if = "String::is_empty")]
    pub mount_type: String,
}

impl Mount {
    /// A bind mount of `host` at `container`: options `ro` (or `rw`), `nosuid`, `nodev`, `bind`.
    pub fn bind(container: &str, host: &Path, read_only: bool) -> Self {
        Self {
            host_path: host.display().to_string(),
            container_path: container.to_owned(),
            options: [if read_only { "ro" } else { "rw" }, "nosuid", "nodev", "bind"]
                .map(str::to_owned)
                .to_vec(),
            mount_type: String::new(),
        }
    }
}

/// A rule of the CDI specification (v0.5.0 and later) that a [`Spec`] breaks, naming the field and what
/// was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// `cdiVersion` is not a released CDI version.
    #[error("cdiVersion {0:?}: expected one of {versions}", versions = CDI_VERSIONS.join(", "))]
    Version(String),
    /// `kind` is not `vendor/class` with valid names.
    #[error(
        "kind {0:?}: expected <vendor>/<class>, the vendor a letter then letters, digits, '-', '_', '.' \
         ending in a letter or digit, the class a letter then letters, digits, '-', '_' ending in a letter or digit"
    )]
    Kind(String),
    /// The spec has no device.
    #[error("devices: expected at least one device")]
    NoDevices,
    /// A device name breaks the name rule.
    #[error(
        "devices[{index}].name {name:?}: expected a letter or digit first and last, otherwise letters, digits, \
         '_', '-', '.', ':'"
    )]
    DeviceName {
        /// The device's position.
        index: usize,
        /// The name.
        name: String,
    },
    /// Two devices share a name.
    #[error("devices[{index}].name {name:?}: duplicate device name")]
    DuplicateName {
        /// The second device's position.
        index: usize,
        /// The name.
        name: String,
    },
    /// A device has no container edits.
    #[error(
        "devices[{index}] ({name}): containerEdits: expected at least one env, device node, hook, mount or additional GID"
    )]
    EmptyDevice {
        /// The device's position.
        index: usize,
        /// The name.
        name: String,
    },
    /// An env entry is not `KEY=value` with a non-empty key.
    #[error("{place}.env {entry:?}: expected KEY=value with a non-empty KEY")]
    Env {
        /// `containerEdits` or `devices[i].containerEdits`.
        place: String,
        /// The entry.
        entry: String,
    },
    /// A device node path is not absolute.
    #[error("{place}.deviceNodes {field} {path:?}: expected an absolute path")]
    DeviceNode {
        /// Where.
        place: String,
        /// `path` or `hostPath`.
        field: &'static str,
        /// The path.
        path: String,
    },
    /// A mount path is not absolute.
    #[error("{place}.mounts {field} {path:?}: expected an absolute path")]
    Mount {
        /// Where.
        place: String,
        /// `hostPath` or `containerPath`.
        field: &'static str,
        /// The path.
        path: String,
    },
}

/// The CDI vendor-name rule: a letter first, a letter or digit last, otherwise letters, digits, `-`, `_`, `.`.
pub fn valid_vendor_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The CDI class-name rule: a letter first, a letter or digit last, otherwise letters, digits, `-`, `_`.
pub fn valid_class_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
}

/// Checks `spec` against the CDI specification's rules for the fields this plugin writes: `cdiVersion`
/// released, `kind` `vendor/class`, at least one device, device names valid and unique, every device with
/// some edit, env `KEY=value`, device-node and mount paths absolute. Returns the first rule broken.
///
/// ```
/// use vgpu_core::cdi::{ContainerEdits, Device, SPEC_VERSION, Spec, SpecError, validate};
///
/// let device = |name: &str, env: &str| Device {
///     name: name.into(),
///     container_edits: ContainerEdits { env: vec![env.into()], ..ContainerEdits::default() },
///     ..Device::default()
/// };
/// let mut spec = Spec {
///     cdi_version: SPEC_VERSION.into(),
///     kind: "k8s.manager.nvidia.com/claim".into(),
///     devices: vec![device("uid-1-gpu-0", "A=1")],
///     ..Spec::default()
/// };
/// assert_eq!(validate(&spec), Ok(()));
/// spec.devices.push(device("uid-1-gpu-1", "=1"));
/// assert!(matches!(validate(&spec), Err(SpecError::Env { .. })));
/// ```
pub fn validate(spec: &Spec) -> Result<(), SpecError> {
    if !CDI_VERSIONS.contains(&spec.cdi_version.as_str()) {
        return Err(SpecError::Version(spec.cdi_version.clone()));
    }
    match spec.kind.split_once('/') {
        Some((vendor, class)) if valid_vendor_name(vendor) && valid_class_name(class) => {}
        _ => return Err(SpecError::Kind(spec.kind.clone())),
    }
    if spec.devices.is_empty() {
        return Err(SpecError::NoDevices);
    }
    let mut names = std::collections::BTreeSet::new();
    for (index, device) in spec.devices.iter().enumerate() {
        if !valid_device_name(&device.name) {
            return Err(SpecError::DeviceName { index, name: device.name.clone() });
        }
        if !names.insert(device.name.as_str()) {
            return Err(SpecError::DuplicateName { index, name: device.name.clone() });
        }
        let edits = &device.container_edits;
        if edits.is_empty() {
            return Err(SpecError::EmptyDevice { index, name: device.name.clone() });
        }
        validate_edits(&format!("devices[{index}].containerEdits"), edits)?;
    }
    validate_edits("containerEdits", &spec.container_edits)
}

fn validate_edits(place: &str, edits: &ContainerEdits) -> Result<(), SpecError> {
    for entry in &edits.env {
        if entry.find('=').is_none_or(|at| at == 0) {
            return Err(SpecError::Env { place: place.to_owned(), entry: entry.clone() });
        }
    }
    let absolute = |p: &str| p.starts_with('/');
    for node in &edits.device_nodes {
        for (field, path) in [("path", &node.path), ("hostPath", &node.host_path)] {
            if !absolute(path) {
                return Err(SpecError::DeviceNode { place: place.to_owned(), field, path: path.clone() });
            }
        }
    }
    for mount in &edits.mounts {
        for (field, path) in [("hostPath", &mount.host_path), ("containerPath", &mount.container_path)] {
            if !absolute(path) {
                return Err(SpecError::Mount { place: place.to_owned(), field, path: path.clone() });
            }
        }
    }
    Ok(())
}

/// The CDI specification's device-name rule: starts and ends with a letter or digit, otherwise letters,
/// digits, `_`, `-`, `.`, `:`.
pub fn valid_device_name(name: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    name.starts_with(alnum)
        && name.ends_with(alnum)
        && name.chars().all(|c| alnum(c) || matches!(c, '_' | '-' | '.' | ':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_is_the_cdi_specifications_field_order_and_omitempty() {
        let spec = Spec {
            cdi_version: SPEC_VERSION.into(),
            kind: "k8s.device-plugin.nvidia.com/gpu".into(),
            devices: vec![
                Device {
                    name: "GPU-a".into(),
                    container_edits: ContainerEdits {
                        device_nodes: vec![DeviceNode::under(
                            "/dev/nvidia3",
                            Path::new("/run/nvidia/driver"),
                        )],
                        ..ContainerEdits::default()
                    },
                    ..Device::default()
                },
                Device { name: "GPU-b".into(), ..Device::default() },
            ],
            ..Spec::default()
        };
        let text = serde_json::to_string(&spec).unwrap();
        assert_eq!(
            text,
            r#"{"cdiVersion":"0.5.0","kind":"k8s.device-plugin.nvidia.com/gpu","devices":[{"name":"GPU-a","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia3","hostPath":"/run/nvidia/driver/dev/nvidia3"}]}},{"name":"GPU-b","containerEdits":{}}],"containerEdits":{}}"#
        );
        assert_eq!(serde_json::from_str::<Spec>(&text).unwrap(), spec);
    }

    #[test]
    fn every_field_round_trips_under_its_cdi_name() {
        let text = r#"{"cdiVersion":"0.6.0","kind":"v.com/c","annotations":{"a":"1"},"devices":[{"name":"d","annotations":{"b":"2"},"containerEdits":{"env":["A=1"],"deviceNodes":[{"path":"/dev/x","hostPath":"/h/x","type":"c","major":195,"minor":0,"fileMode":438,"permissions":"rw","uid":0,"gid":44}],"hooks":[{"hookName":"createContainer","path":"/bin/h","args":["h","x"],"env":["E=1"],"timeout":5}],"mounts":[{"hostPath":"/h","containerPath":"/c","options":["ro"],"type":"bind"}],"additionalGids":[44]}}],"containerEdits":{}}"#;
        let spec: Spec = serde_json::from_str(text).unwrap();
        let node = &spec.devices[0].container_edits.device_nodes[0];
        assert_eq!(
            (node.node_type.as_str(), node.major, node.file_mode, node.gid),
            ("c", Some(195), Some(438), Some(44))
        );
        assert_eq!(spec.devices[0].container_edits.hooks[0].timeout, Some(5));
        assert_eq!(spec.devices[0].container_edits.mounts[0].mount_type, "bind");
        assert_eq!(serde_json::to_string(&spec).unwrap(), text);
        assert_eq!(validate(&spec), Ok(()));
    }

    fn valid_spec() -> Spec {
        Spec {
            cdi_version: SPEC_VERSION.into(),
            kind: "k8s.manager.nvidia.com/claim".into(),
            devices: vec![Device {
                name: "u-x".into(),
                container_edits: ContainerEdits {
                    env: vec!["A=".into()],
                    device_nodes: vec![DeviceNode::new("/dev/nvidia0", "/dev/nvidia0")],
                    mounts: vec![Mount::bind("/c", Path::new("/h"), true)],
                    ..ContainerEdits::default()
                },
                ..Device::default()
            }],
            container_edits: ContainerEdits { env: vec!["B=x=y".into()], ..ContainerEdits::default() },
            ..Spec::default()
        }
    }

    #[test]
    fn the_validator_names_each_broken_rule() {
        assert_eq!(validate(&valid_spec()), Ok(()));
        let broken = |edit: &dyn Fn(&mut Spec)| {
            let mut spec = valid_spec();
            edit(&mut spec);
            validate(&spec).unwrap_err()
        };
        assert_eq!(broken(&|s| s.cdi_version = "0.5".into()), SpecError::Version("0.5".into()));
        for kind in
            ["claim", "k8s.manager.nvidia.com/", "/claim", "1vendor/claim", "v/cla.ss", "v-/c", "v/c-"]
        {
            assert_eq!(broken(&|s| s.kind = kind.into()), SpecError::Kind(kind.into()), "{kind}");
        }
        assert_eq!(broken(&|s| s.devices.clear()), SpecError::NoDevices);
        assert!(matches!(
            broken(&|s| s.devices[0].name = "-x".into()),
            SpecError::DeviceName { index: 0, .. }
        ));
        let twice = broken(&|s| s.devices.push(s.devices[0].clone()));
        assert_eq!(twice, SpecError::DuplicateName { index: 1, name: "u-x".into() });
        assert!(matches!(
            broken(&|s| s.devices[0].container_edits = ContainerEdits::default()),
            SpecError::EmptyDevice { .. }
        ));
        let env = broken(&|s| s.devices[0].container_edits.env.push("NOEQUALS".into()));
        assert_eq!(
            env.to_string(),
            "devices[0].containerEdits.env \"NOEQUALS\": expected KEY=value with a non-empty KEY"
        );
        assert!(matches!(broken(&|s| s.container_edits.env.push("=v".into())), SpecError::Env { .. }));
        let node = broken(&|s| s.devices[0].container_edits.device_nodes[0].path = "dev/x".into());
        assert!(matches!(node, SpecError::DeviceNode { field: "path", .. }), "{node}");
        let node = broken(&|s| s.container_edits.device_nodes.push(DeviceNode::new("/x", "x")));
        assert!(matches!(node, SpecError::DeviceNode { field: "hostPath", .. }), "{node}");
        let mount = broken(&|s| s.devices[0].container_edits.mounts[0].container_path = "c".into());
        assert!(matches!(mount, SpecError::Mount { field: "containerPath", .. }), "{mount}");
        let mount = broken(&|s| s.devices[0].container_edits.mounts[0].host_path = String::new());
        assert!(matches!(mount, SpecError::Mount { field: "hostPath", .. }), "{mount}");
    }
}

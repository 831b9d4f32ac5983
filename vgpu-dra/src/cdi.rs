//! The per-claim CDI spec (contract §9): one file per prepared claim, written atomically, removed by
//! Unprepare.
//!
//! | what | value |
//! |---|---|
//! | file | `<cdi-root>/k8s.manager.nvidia.com-claim_<claimUID>.json` ([`spec_file_name`]: the transient-spec name of the CDI library, `/` in the UID turned into `_`; JSON, which every CDI reader accepts) |
//! | kind | `k8s.manager.nvidia.com/claim` ([`KIND`]) |
//! | device name | `<claimUID>-<request>-<device>-share-<shareID>` for a share, `<claimUID>-<request>-<device>-<ordinal>` otherwise, every character outside `[A-Za-z0-9_.-]` turned into `-` ([`sanitize`], [`device_name`]) |
//! | qualified ID (returned to the kubelet) | `k8s.manager.nvidia.com/claim=<device name>` |
//!
//! Container edits of a claim with vGPU devices (`vgpu-<minor>`), `<host>` = `--host-manager-dir`,
//! `<part>` = `<host>/claims/<claimUID>/<partitionKey>` (the device's partition: [`crate::partition`]):
//!
//! | where | env | mounts (container ← host) | device nodes |
//! |---|---|---|---|
//! | spec-wide | `LD_PRELOAD=/etc/vgpu-manager/driver/libvgpu-control.so`, `MANAGER_COMPATIBILITY_MODE`, `MANAGER_VISIBLE_DEVICES=`, `CUDA_MEM_RATIO=<ratio/100 %.2f>`, `CUDA_CORE_LIMIT=`, `CUDA_CORE_SOFT_LIMIT=`, `CUDA_MEM_LIMIT=`, `CUDA_MEM_OVERSOLD=TRUE\|FALSE`, `VMEMORY_NODE_ENABLED=TRUE`, `CUDA_SM_SHARED_BUCKET=TRUE`, `MANAGER_VGPU_CLAIM_UID=<uid>`, `EXTERNAL_SM_WATCHER_ENABLED=FALSE` (`TRUE` with gate `SharedSMUtilizationWatcher`) | `/etc/vgpu-manager/driver/libvgpu-control.so` ← `<host>/libvgpu-control.so.<ver>` (ro), `/etc/ld.so.preload` ← `<host>/ld.so.preload` (ro), `/etc/vgpu-manager/.host_proc` ← `/proc` (ro; with gate `DevicePluginClientMode` instead `/etc/vgpu-manager/registry` ← `<host>/registry` (ro)); with gate `SharedSMUtilizationWatcher` also `/etc/vgpu-manager/watcher` ← `<host>/watcher` (ro) | the control nodes present under the container driver root |
//! | per device `i` (its ordinal within its request) | `MANAGER_VISIBLE_DEVICE_<i>=<uuid>`, `CUDA_MEM_RATIO_<i>`, `CUDA_MEM_OVERSOLD_<i>`, `CUDA_MEM_LIMIT_<i>=<MiB>m` (empty: no limit), `CUDA_CORE_LIMIT_<i>`, `CUDA_CORE_SOFT_LIMIT_<i>` (from the consumed `cores` and the claim's `…/vgpu-compute-policy` annotation: fixed → both, balance → soft 100, none or ≥ 100 → empty); with gate `DevicePluginClientMode` `MANAGER_CLIENT_REGISTER_UUID=<uuid of the partition>` ([`crate::client_mode`]) | `/etc/vgpu-manager/config` ← `<part>/config` (rw), `/tmp/.vgpu_lock` ← `<part>/vgpu_lock`, `/tmp/.vmem_node` ← `<part>/vmem_node`, `/tmp/.sm_node` ← `<part>/sm_node` (rw), `/etc/vgpu-manager/config/pids.config` ← `<part>/config/pids.config` (ro) | the GPU's nodes (`/dev/nvidia<minor>`) |
//!
//! Whole-GPU devices (`gpu-<minor>`) get only their device nodes and the control nodes. No `vgpu.config` is
//! written: the in-container library builds it from this env. Every spec is checked with [`validate`]
//! (the CDI specification's rules for these fields) before [`write_spec`] writes it.
//!
//! ```
//! use vgpu_dra::cdi::{device_name, qualified, sanitize, spec_file_name};
//!
//! assert_eq!(sanitize("gpu/0 share"), "gpu-0-share");
//! assert_eq!(device_name("uid-1", "req-vgpu-0-share-ab12"), "uid-1-req-vgpu-0-share-ab12");
//! assert_eq!(qualified("uid-1-x"), "k8s.manager.nvidia.com/claim=uid-1-x");
//! assert_eq!(spec_file_name("uid-1"), "k8s.manager.nvidia.com-claim_uid-1.json");
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
pub use vgpu_deviceplugin::cdi::DeviceNode;

/// CDI kind of the claim specs: `<vendor>/<class>`.
pub const KIND: &str = "k8s.manager.nvidia.com/claim";
/// CDI spec version written (env, mounts and device nodes are all in 0.5.0).
pub const SPEC_VERSION: &str = vgpu_deviceplugin::cdi::SPEC_VERSION;
/// Container path of the vGPU control library.
pub const CONTROL_LIBRARY: &str = vgpu_core::abi::runtime_files::CONTAINER_LIBRARY;
/// Container path of the shared SM watcher's directory (gate `SharedSMUtilizationWatcher`).
pub const CONTAINER_WATCHER_DIR: &str = "/etc/vgpu-manager/watcher";
/// Container path of a partition's config directory.
pub const CONTAINER_CONFIG_DIR: &str = "/etc/vgpu-manager/config";

/// A CDI spec as written to the CDI root (the subset of the CDI specification this plugin fills).
///
/// The device plugin's [`vgpu_deviceplugin::cdi::Spec`] holds device nodes only; this one adds env and
/// mounts. Both should become one typed module in `vgpu-core` (see the crate docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// `cdiVersion`: [`SPEC_VERSION`].
    pub cdi_version: String,
    /// `vendor/class`: [`KIND`].
    pub kind: String,
    /// The devices.
    pub devices: Vec<Device>,
    /// Edits applied whenever any device of the spec is used.
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

/// One device of a [`Spec`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// The name after `=` in the qualified device name.
    pub name: String,
    /// What the device adds to a container.
    pub container_edits: ContainerEdits,
}

/// Container edits: env (`KEY=value`), device nodes, mounts.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `KEY=value` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// Bind mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

/// A bind mount of [`ContainerEdits`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// Source on the host.
    pub host_path: String,
    /// Destination in the container.
    pub container_path: String,
    /// Mount options (`ro`/`rw`, `nosuid`, `nodev`, `bind`).
    pub options: Vec<String>,
}

impl Mount {
    /// A bind mount of `host` at `container`.
    pub fn bind(container: &str, host: &Path, read_only: bool) -> Self {
        Self {
            host_path: host.display().to_string(),
            container_path: container.to_owned(),
            options: [if read_only { "ro" } else { "rw" }, "nosuid", "nodev", "bind"]
                .map(str::to_owned)
                .to_vec(),
        }
    }
}

/// Writing or removing a spec failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CdiError {
    /// The spec could not be serialised.
    #[error("cannot serialise the CDI spec of claim {claim_uid}: {source}")]
    Serialize {
        /// The claim.
        claim_uid: String,
        /// The serialiser's error.
        #[source]
        source: serde_json::Error,
    },
    /// The directory could not be created.
    #[error("{path}: create CDI directory: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The atomic write failed.
    #[error(transparent)]
    Write(#[from] vgpu_core::abi::AbiError),
    /// The spec breaks the CDI specification; nothing was written.
    #[error("CDI spec of claim {claim_uid} is not valid: {source}")]
    Invalid {
        /// The claim.
        claim_uid: String,
        /// The first rule broken.
        #[source]
        source: SpecError,
    },
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
    #[error("devices[{index}] ({name}): containerEdits: expected at least one env, device node or mount")]
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

/// The released CDI specification versions a spec may declare.
pub const CDI_VERSIONS: [&str; 8] = ["0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0"];

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
/// use vgpu_dra::cdi::{ContainerEdits, Device, KIND, SPEC_VERSION, Spec, SpecError, validate};
///
/// let device = |name: &str, env: &str| Device {
///     name: name.into(),
///     container_edits: ContainerEdits { env: vec![env.into()], ..ContainerEdits::default() },
/// };
/// let mut spec = Spec {
///     cdi_version: SPEC_VERSION.into(),
///     kind: KIND.into(),
///     devices: vec![device("uid-1-gpu-0", "A=1")],
///     container_edits: ContainerEdits::default(),
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
        if edits.env.is_empty() && edits.device_nodes.is_empty() && edits.mounts.is_empty() {
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

/// Every character outside `[A-Za-z0-9_.-]` turned into `-` (upstream's CDI device-ID rule).
pub fn sanitize(id: &str) -> String {
    id.chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '-' })
        .collect()
}

/// The device name `<claimUID>-<id>`, sanitised; a `0` is appended when it would not end in a letter or
/// digit (the CDI name rule), so the result always passes [`valid_device_name`].
pub fn device_name(claim_uid: &str, id: &str) -> String {
    let mut name = sanitize(&format!("{claim_uid}-{id}"));
    if !name.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        name.push('0');
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        name.insert(0, 'c');
    }
    name
}

/// The CDI specification's device-name rule: starts and ends with a letter or digit, otherwise letters,
/// digits, `_`, `-`, `.`, `:`.
pub fn valid_device_name(name: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    name.starts_with(alnum)
        && name.ends_with(alnum)
        && name.chars().all(|c| alnum(c) || matches!(c, '_' | '-' | '.' | ':'))
}

/// The claim-device ID before the claim prefix: `<request>-<device>-share-<shareID>` or
/// `<request>-<device>-<ordinal>`.
pub fn device_id(request: &str, device: &str, share_id: Option<&str>, ordinal: usize) -> String {
    match share_id {
        Some(share) => format!("{request}-{device}-share-{share}"),
        None => format!("{request}-{device}-{ordinal}"),
    }
}

/// `k8s.manager.nvidia.com/claim=<name>`.
pub fn qualified(name: &str) -> String {
    format!("{KIND}={name}")
}

/// `k8s.manager.nvidia.com-claim_<claimUID>.json` (`/` in the UID turned into `_`).
pub fn spec_file_name(claim_uid: &str) -> String {
    format!("{}_{}.json", KIND.replace('/', "-"), claim_uid.replace('/', "_"))
}

/// Checks `spec` ([`validate`]), then writes it to `path` atomically (mode 0644), creating the directory. An
/// invalid spec is refused ([`CdiError::Invalid`]) and nothing is written.
pub fn write_spec(path: &Path, claim_uid: &str, spec: &Spec) -> Result<(), CdiError> {
    validate(spec).map_err(|source| CdiError::Invalid { claim_uid: claim_uid.to_owned(), source })?;
    let text = serde_json::to_vec_pretty(spec)
        .map_err(|source| CdiError::Serialize { claim_uid: claim_uid.to_owned(), source })?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| CdiError::Dir { path: dir.to_path_buf(), source })?;
    }
    vgpu_core::abi::atomic::write_atomic(path, &text, 0o644)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn ids() {
        assert_eq!(device_id("r", "vgpu-0", Some("abc"), 3), "r-vgpu-0-share-abc");
        assert_eq!(device_id("r", "gpu-1", None, 2), "r-gpu-1-2");
        assert_eq!(device_name("u", "r-"), "u-r-0");
        assert_eq!(device_name("", "x"), "c-x");
        assert!(!valid_device_name("") && !valid_device_name("-a") && !valid_device_name("a b"));
        assert_eq!(spec_file_name("a/b"), "k8s.manager.nvidia.com-claim_a_b.json");
    }

    #[test]
    fn mount_options_and_spec_shape() {
        let spec = Spec {
            cdi_version: SPEC_VERSION.into(),
            kind: KIND.into(),
            devices: vec![Device {
                name: "u-x".into(),
                container_edits: ContainerEdits {
                    env: vec!["A=1".into()],
                    mounts: vec![Mount::bind("/c", Path::new("/h"), true)],
                    ..ContainerEdits::default()
                },
            }],
            container_edits: ContainerEdits::default(),
        };
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "cdiVersion": "0.5.0",
                "kind": "k8s.manager.nvidia.com/claim",
                "devices": [{"name": "u-x", "containerEdits": {
                    "env": ["A=1"],
                    "mounts": [{"hostPath": "/h", "containerPath": "/c", "options": ["ro", "nosuid", "nodev", "bind"]}]
                }}],
                "containerEdits": {}
            })
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cdi").join(spec_file_name("u"));
        write_spec(&path, "u", &spec).unwrap();
        let back: Spec = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(back, spec);
    }

    fn valid_spec() -> Spec {
        Spec {
            cdi_version: SPEC_VERSION.into(),
            kind: KIND.into(),
            devices: vec![Device {
                name: "u-x".into(),
                container_edits: ContainerEdits {
                    env: vec!["A=".into()],
                    device_nodes: vec![DeviceNode {
                        host_path: "/dev/nvidia0".into(),
                        path: "/dev/nvidia0".into(),
                    }],
                    mounts: vec![Mount::bind("/c", Path::new("/h"), true)],
                },
            }],
            container_edits: ContainerEdits { env: vec!["B=x=y".into()], ..ContainerEdits::default() },
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
        let node = broken(&|s| {
            s.container_edits.device_nodes.push(DeviceNode { host_path: "x".into(), path: "/x".into() })
        });
        assert!(matches!(node, SpecError::DeviceNode { field: "hostPath", .. }), "{node}");
        let mount = broken(&|s| s.devices[0].container_edits.mounts[0].container_path = "c".into());
        assert!(matches!(mount, SpecError::Mount { field: "containerPath", .. }), "{mount}");
        let mount = broken(&|s| s.devices[0].container_edits.mounts[0].host_path = String::new());
        assert!(matches!(mount, SpecError::Mount { field: "hostPath", .. }), "{mount}");
        // write_spec refuses an invalid spec and writes nothing.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(spec_file_name("u"));
        let mut spec = valid_spec();
        spec.kind = "bad".into();
        assert!(matches!(write_spec(&path, "u", &spec), Err(CdiError::Invalid { .. })));
        assert!(!path.exists());
    }

    proptest! {
        #[test]
        fn sanitized_names_are_valid_cdi_names(uid in "[0-9a-f-]{0,40}", id in "\\PC{0,40}") {
            let s = sanitize(&id);
            prop_assert_eq!(s.chars().count(), id.chars().count());
            prop_assert!(s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')));
            prop_assert_eq!(sanitize(&s), s.clone(), "idempotent");
            let name = device_name(&uid, &id);
            prop_assert!(valid_device_name(&name), "{:?}", name);
            prop_assert!(valid_device_name(qualified(&name).split_once('=').unwrap().1));
        }
    }
}

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
//! written: the in-container library builds it from this env. The spec is [`vgpu_core::cdi`]'s model; every
//! spec is checked with [`validate`] (the CDI specification's rules for these fields) before [`write_spec`]
//! writes it.
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

use vgpu_core::cdi::{Spec, SpecError, validate};

/// CDI kind of the claim specs: `<vendor>/<class>`.
pub const KIND: &str = "k8s.manager.nvidia.com/claim";
/// Container path of the vGPU control library.
pub const CONTROL_LIBRARY: &str = vgpu_core::abi::runtime_files::CONTAINER_LIBRARY;
/// Container path of the shared SM watcher's directory (gate `SharedSMUtilizationWatcher`).
pub const CONTAINER_WATCHER_DIR: &str = "/etc/vgpu-manager/watcher";
/// Container path of a partition's config directory.
pub const CONTAINER_CONFIG_DIR: &str = "/etc/vgpu-manager/config";

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

/// Every character outside `[A-Za-z0-9_.-]` turned into `-` (upstream's CDI device-ID rule).
pub fn sanitize(id: &str) -> String {
    id.chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '-' })
        .collect()
}

/// The device name `<claimUID>-<id>`, sanitised; a `0` is appended when it would not end in a letter or
/// digit (the CDI name rule), so the result always passes [`valid_device_name`](vgpu_core::cdi::valid_device_name).
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
    use vgpu_core::cdi::{ContainerEdits, Device, Mount, SPEC_VERSION, valid_device_name};

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
                ..Device::default()
            }],
            ..Spec::default()
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

    #[test]
    fn write_spec_refuses_an_invalid_spec_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(spec_file_name("u"));
        let spec = Spec {
            cdi_version: SPEC_VERSION.into(),
            kind: "bad".into(),
            devices: vec![Device {
                name: "u-x".into(),
                container_edits: ContainerEdits { env: vec!["A=1".into()], ..ContainerEdits::default() },
                ..Device::default()
            }],
            ..Spec::default()
        };
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

//! Gate `DeviceMetadata` (requires `PassthroughSupport`): KEP-5304 device metadata files, so a workload
//! can read the attributes of the devices it got (a VM launcher needs the passed-through GPU's PCI address,
//! IOMMU group, …) without API access.
//!
//! # Files
//!
//! One file per request of the claim (the base request name, subrequest stripped), written atomically under
//! the claim directory and bind-mounted read-only:
//!
//! | where | path |
//! |---|---|
//! | written (this process) | `<manager-dir>/claims/<claimUID>/device-metadata/<request>/<driver>-metadata.json` |
//! | mounted from (host) | `<host-manager-dir>/claims/<claimUID>/device-metadata/<request>/<driver>-metadata.json` |
//! | in the container, claim named in the pod | `/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claimName>/<request>/<driver>-metadata.json` |
//! | in the container, claim from a template (annotation `resource.kubernetes.io/pod-claim-name`) | `/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/<podClaimName>/<request>/<driver>-metadata.json` |
//!
//! The mount is a CDI edit of the request's first device, so a container gets the files of the requests it
//! uses. The file is a JSON stream of the same `DeviceMetadata` object once per API version, newest first;
//! this build writes `metadata.resource.k8s.io/v1alpha1` only:
//!
//! ```json
//! {"apiVersion":"metadata.resource.k8s.io/v1alpha1","kind":"DeviceMetadata",
//!  "metadata":{"name":"vm-gpu","namespace":"ns","uid":"…","generation":1},
//!  "podClaimName":"gpu",
//!  "requests":[{"name":"gpu","devices":[{"driver":"manager.nvidia.com","pool":"node-1","name":"gpu-vfio-0",
//!    "attributes":{"type":{"string":"vfio"},"resource.kubernetes.io/pciBusID":{"string":"0000:3b:00.0"},…}}]}]}
//! ```
//!
//! `attributes` are the device's ResourceSlice attributes ([`build_device`]).
//!
//! # Host action
//!
//! | step | what |
//! |---|---|
//! | plan | a claim with devices → [`MetadataAction`] `{dir, claimUid}` (`dir` = `<manager-dir>/claims/<uid>/device-metadata`) |
//! | apply | (re)writes every request's file (atomic: temp + fsync + rename; same bytes each time) and returns the mounts |
//! | revert | removes `dir` (only a `device-metadata` directory inside a directory named after the claim UID), then the claim directory when it is empty |

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use serde::{Deserialize, Serialize};

use crate::{
    devices::AllocatableDevices,
    health::HealthSnapshot,
    modes::{ClaimContext, ClaimMode, ModeEdits, ModeError, decode, encode},
    slices::{SliceConfig, build_device},
};
use vgpu_core::cdi::{ContainerEdits, Mount};

/// The mode's name in recorded actions.
pub const MODE: &str = "deviceMetadata";
/// The gate that enables the mode.
pub const GATE: &str = "DeviceMetadata";
/// The metadata API group/version written.
pub const API_VERSION: &str = "metadata.resource.k8s.io/v1alpha1";
/// The metadata kind.
pub const KIND: &str = "DeviceMetadata";
/// Root of the metadata files in a container.
pub const CONTAINER_ROOT: &str = "/var/run/kubernetes.io/dra-device-attributes";
/// The claim annotation with the pod-local claim name of a claim made from a template.
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";
/// The directory inside the claim directory.
pub const DIR_NAME: &str = "device-metadata";

/// What [`MetadataMode`] needs.
#[derive(Debug, Clone)]
pub struct MetadataConfig {
    /// How devices are published (driver name, list-type attributes).
    pub slice: SliceConfig,
    /// The node's devices (for their attributes).
    pub devices: Arc<AllocatableDevices>,
}

/// One recorded metadata action: the claim's metadata directory exists with its files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetadataAction {
    /// `<manager-dir>/claims/<uid>/device-metadata` as this process sees it.
    pub dir: String,
    /// The claim's UID.
    pub claim_uid: String,
}

/// The `deviceMetadata` claim mode (gate `DeviceMetadata`; module docs).
#[derive(Debug)]
pub struct MetadataMode {
    config: MetadataConfig,
}

impl MetadataMode {
    /// The mode.
    pub fn new(config: MetadataConfig) -> Self {
        Self { config }
    }

    /// The in-container path of `request`'s file for this claim.
    pub fn container_path(
        driver: &str,
        claim_name: &str,
        pod_claim_name: Option<&str>,
        request: &str,
    ) -> String {
        match pod_claim_name.filter(|n| !n.is_empty()) {
            Some(pod) => {
                format!("{CONTAINER_ROOT}/resourceclaimtemplates/{pod}/{request}/{driver}-metadata.json")
            }
            None => format!("{CONTAINER_ROOT}/resourceclaims/{claim_name}/{request}/{driver}-metadata.json"),
        }
    }

    /// The file's bytes for one request (module docs).
    fn document(
        &self,
        ctx: &ClaimContext<'_>,
        pod_claim_name: Option<&str>,
        request: &str,
        devices: &[&crate::modes::ClaimDevice],
    ) -> Result<Vec<u8>, ModeError> {
        let slice = &self.config.slice;
        let mut entries = Vec::new();
        for d in devices {
            let api = build_device(slice, &self.config.devices, &d.device, &HealthSnapshot::default())
                .map_err(|e| ModeError::host(MODE, format!("attributes of {}", d.device.name), e))?;
            entries.push(serde_json::json!({
                "driver": slice.driver,
                "pool": slice.node_name,
                "name": d.device.name,
                "attributes": api.attributes.unwrap_or_default(),
            }));
        }
        let mut doc = serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "name": ctx.claim.name,
                "namespace": ctx.claim.namespace,
                "uid": ctx.claim.uid,
                "generation": 1,
            },
            "requests": [{ "name": request, "devices": entries }],
        });
        if let (Some(pod), Some(obj)) = (pod_claim_name, doc.as_object_mut()) {
            obj.insert("podClaimName".to_owned(), serde_json::Value::String(pod.to_owned()));
        }
        let mut bytes =
            serde_json::to_vec(&doc).map_err(|e| ModeError::host(MODE, "encode the metadata", e))?;
        bytes.push(b'\n');
        Ok(bytes)
    }
}

/// The base request of `request` (`gpu/high-mem` → `gpu`).
fn base_request(request: &str) -> &str {
    request.split('/').next().unwrap_or(request)
}

/// Whether `dir` is a metadata directory of claim `uid` (the only thing revert removes).
fn ours(dir: &Path, uid: &str) -> bool {
    !uid.is_empty()
        && dir.file_name().is_some_and(|n| n == DIR_NAME)
        && dir.parent().and_then(Path::file_name).is_some_and(|n| n == uid)
}

impl ClaimMode for MetadataMode {
    fn name(&self) -> &'static str {
        MODE
    }

    fn gate(&self) -> &'static str {
        GATE
    }

    fn plan(&self, ctx: &ClaimContext<'_>) -> Result<Vec<serde_json::Value>, ModeError> {
        if ctx.devices.is_empty() {
            return Ok(Vec::new());
        }
        let dir = ctx.config.claim_dir(&ctx.claim.uid).join(DIR_NAME);
        let action = MetadataAction { dir: dir.display().to_string(), claim_uid: ctx.claim.uid.clone() };
        Ok(vec![encode(MODE, &action)?])
    }

    fn apply(&self, ctx: &ClaimContext<'_>, action: &serde_json::Value) -> Result<ModeEdits, ModeError> {
        let action: MetadataAction = decode(MODE, action)?;
        let dir = PathBuf::from(&action.dir);
        if !ours(&dir, &action.claim_uid) {
            return Err(ModeError::claim(
                MODE,
                format!(
                    "recorded directory {} is not a metadata directory of claim {}",
                    action.dir, action.claim_uid
                ),
            ));
        }
        let pod_claim_name = ctx
            .object
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(POD_CLAIM_NAME_ANNOTATION))
            .map(String::as_str);
        let mut by_request: BTreeMap<&str, (String, Vec<&crate::modes::ClaimDevice>)> = BTreeMap::new();
        for d in ctx.devices {
            let entry =
                by_request.entry(base_request(&d.request)).or_insert_with(|| (d.request.clone(), Vec::new()));
            entry.1.push(d);
        }
        let driver = &self.config.slice.driver;
        let host_dir = ctx.config.host_claim_dir(&ctx.claim.uid).join(DIR_NAME);
        let mut edits = ModeEdits::default();
        for (base, (request, devices)) in &by_request {
            let file_name = format!("{driver}-metadata.json");
            let path = dir.join(base).join(&file_name);
            let bytes = self.document(ctx, pod_claim_name, request, devices)?;
            let parent = dir.join(base);
            std::fs::create_dir_all(&parent)
                .map_err(|e| ModeError::host(MODE, format!("create {}", parent.display()), e))?;
            vgpu_core::abi::atomic::write_atomic(&path, &bytes, 0o644)
                .map_err(|e| ModeError::host(MODE, format!("write {}", path.display()), e.to_string()))?;
            let container = Self::container_path(driver, &ctx.claim.name, pod_claim_name, base);
            if let Some(first) = devices.first() {
                let mount = Mount::bind(&container, &host_dir.join(base).join(&file_name), true);
                edits
                    .devices
                    .entry(first.cdi_name.clone())
                    .or_insert_with(ContainerEdits::default)
                    .mounts
                    .push(mount);
            }
        }
        Ok(edits)
    }

    fn revert(&self, action: &serde_json::Value) -> Result<(), ModeError> {
        let action: MetadataAction = decode(MODE, action)?;
        let dir = PathBuf::from(&action.dir);
        if !ours(&dir, &action.claim_uid) {
            tracing::warn!(dir = %action.dir, claim = %action.claim_uid, "not removing a recorded metadata directory that is not the claim's");
            return Ok(());
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(ModeError::host(MODE, format!("remove {}", dir.display()), e)),
        }
        if let Some(claim_dir) = dir.parent() {
            // Only when empty: a vGPU claim's partitions are removed by the state itself.
            let _ = std::fs::remove_dir(claim_dir);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_paths_follow_kep_5304() {
        assert_eq!(
            MetadataMode::container_path("manager.nvidia.com", "vm-gpu", None, "gpu"),
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm-gpu/gpu/manager.nvidia.com-metadata.json"
        );
        assert_eq!(
            MetadataMode::container_path("manager.nvidia.com", "pod-x-gpu-abcde", Some("gpu"), "r0"),
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu/r0/manager.nvidia.com-metadata.json"
        );
        assert_eq!(base_request("gpu/high-mem"), "gpu");
    }

    #[test]
    fn only_the_claims_directory_is_ours() {
        assert!(ours(Path::new("/m/claims/uid-1/device-metadata"), "uid-1"));
        assert!(!ours(Path::new("/m/claims/uid-2/device-metadata"), "uid-1"));
        assert!(!ours(Path::new("/m/claims/uid-1"), "uid-1"));
        assert!(!ours(Path::new("/device-metadata"), ""));
    }
}

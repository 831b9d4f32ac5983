//! Client mode on the DRA path (gate `DevicePluginClientMode`, contract §5.8 and §9): each vGPU partition
//! of a prepared claim gets a register UUID; its containers register their PIDs through the device
//! plugin's registry socket ([`vgpu_node::registry`], the same server and code) with that UUID, and
//! the registry writes the partition's `pids.config`.
//!
//! | what | value |
//! |---|---|
//! | UUID | minted per partition at Prepare (`/proc/sys/kernel/random/uuid`), recorded in the checkpoint entry (`registerUUIDs`: UUID → partition key) before any side effect |
//! | CDI | per vGPU device `MANAGER_CLIENT_REGISTER_UUID=<uuid of its partition>`; spec-wide the registry mount `/etc/vgpu-manager/registry` ← `<host-manager-dir>/registry` (ro) instead of the `.host_proc` mount. With the gate off the env is absent |
//! | claim annotation | `<driver>/<uuid>: <partitionKey>` (merge patch) after the files are written; removed by Unprepare and rollback (best effort: the claim may be gone) |
//! | registry | [`RegisterTable`] is the [`RegisterResolver`]: UUID → `<manager-dir>/claims/<claimUID>/<partitionKey>/config` and the claim's consumer pods (`status.reservedFor`, resource `pods`), rebuilt from the checkpoint after every Prepare, Unprepare and start-up |
//!
//! ```
//! use vgpu_dra::client_mode::annotation_key;
//!
//! assert_eq!(annotation_key("manager.nvidia.com", "0f1e"), "manager.nvidia.com/0f1e");
//! ```

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{PoisonError, RwLock},
};

use vgpu_node::registry::{RegisterResolver, RegisterTarget};

use crate::{
    checkpoint::{Checkpoint, ClaimState},
    config::DriverConfig,
};

/// The env variable carrying a partition's register UUID.
pub const ENV: &str = "MANAGER_CLIENT_REGISTER_UUID";
/// Where the kernel hands out random UUIDs.
pub const KERNEL_UUID: &str = "/proc/sys/kernel/random/uuid";
/// Container path of the registry directory (the socket is `socket.sock` in it).
pub const CONTAINER_REGISTRY_DIR: &str = "/etc/vgpu-manager/registry";

/// The claim annotation key of a register UUID: `<driver>/<uuid>`.
pub fn annotation_key(driver: &str, uuid: &str) -> String {
    format!("{driver}/{uuid}")
}

/// A fresh random UUID read from `source` ([`KERNEL_UUID`]), checked to be 36 characters of hex digits
/// and `-`.
pub fn mint_uuid(source: &Path) -> std::io::Result<String> {
    let text = std::fs::read_to_string(source)?;
    let uuid = text.trim().to_ascii_lowercase();
    if uuid.len() != 36 || !uuid.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        return Err(std::io::Error::other(format!(
            "{}: {uuid:?} is not a UUID (expected 36 hex digits and '-')",
            source.display()
        )));
    }
    Ok(uuid)
}

/// The pod UIDs of a recorded `ResourceClaimStatus` (JSON): its `reservedFor` entries of resource `pods`.
pub fn consumer_pods(status: Option<&serde_json::Value>) -> Vec<String> {
    status
        .and_then(|s| s.get("reservedFor"))
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .filter(|r| r.get("resource").and_then(serde_json::Value::as_str) == Some("pods"))
        .filter_map(|r| r.get("uid").and_then(serde_json::Value::as_str).map(str::to_owned))
        .collect()
}

/// The register UUIDs of the prepared claims (see the module docs); shared with the registry server.
#[derive(Debug, Default)]
pub struct RegisterTable {
    targets: RwLock<BTreeMap<String, RegisterTarget>>,
}

impl RegisterTable {
    /// Replaces the table with the completed claims of `cp`.
    pub fn rebuild(&self, cp: &Checkpoint, config: &DriverConfig) {
        let mut targets = BTreeMap::new();
        for (uid, claim) in cp.claims() {
            if claim.checkpoint_state != ClaimState::PrepareCompleted {
                continue;
            }
            let pods = consumer_pods(claim.status.as_ref());
            for (uuid, key) in &claim.register_uuids {
                let target = RegisterTarget {
                    config_dir: config.claim_dir(uid).join(key).join("config"),
                    pod_uids: pods.clone(),
                };
                targets.insert(uuid.clone(), target);
            }
        }
        *self.targets.write().unwrap_or_else(PoisonError::into_inner) = targets;
    }

    /// How many register UUIDs are known.
    pub fn len(&self) -> usize {
        self.targets.read().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether no register UUID is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl RegisterResolver for RegisterTable {
    fn resolve(&self, uuid: &str) -> Option<RegisterTarget> {
        self.targets.read().unwrap_or_else(PoisonError::into_inner).get(uuid).cloned()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::checkpoint::PreparedClaim;

    #[test]
    fn the_table_holds_completed_claims_only() {
        let dir = tempfile::tempdir().unwrap();
        let config = DriverConfig::under("node-1", dir.path());
        let mut cp = Checkpoint::new("b");
        let mut done = PreparedClaim::started("ns", "c1", vec![]);
        done.checkpoint_state = ClaimState::PrepareCompleted;
        done.register_uuids.insert("u-1".into(), "pod-abc-app/main".into());
        done.status = Some(serde_json::json!({"reservedFor": [
            {"resource": "pods", "name": "p", "uid": "pod-1"},
            {"resource": "jobs", "name": "j", "uid": "job-1"}
        ]}));
        let mut started = PreparedClaim::started("ns", "c2", vec![]);
        started.register_uuids.insert("u-2".into(), "gpu".into());
        cp.claims_mut().insert("claim-1".into(), done);
        cp.claims_mut().insert("claim-2".into(), started);
        let table = RegisterTable::default();
        table.rebuild(&cp, &config);
        assert_eq!(table.len(), 1);
        let target = table.resolve("u-1").unwrap();
        assert_eq!(target.config_dir, config.claim_dir("claim-1").join("pod-abc-app/main/config"));
        assert_eq!(target.pod_uids, ["pod-1"]);
        assert!(table.resolve("u-2").is_none(), "a started claim is not registrable");
    }

    #[test]
    fn minted_uuids_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("uuid");
        std::fs::write(&source, "0B6C1C2E-7D1F-4B8E-9A51-2F8C2D9B1A10\n").unwrap();
        assert_eq!(mint_uuid(&source).unwrap(), "0b6c1c2e-7d1f-4b8e-9a51-2f8c2d9b1a10");
        std::fs::write(&source, "nope").unwrap();
        assert!(mint_uuid(&source).unwrap_err().to_string().contains("is not a UUID"));
        if Path::new(KERNEL_UUID).exists() {
            assert_ne!(
                mint_uuid(Path::new(KERNEL_UUID)).unwrap(),
                mint_uuid(Path::new(KERNEL_UUID)).unwrap()
            );
        }
    }
}

//! The recovery checkpoint of the reschedule controller: it writes `<manager_dir>/checkpoints/recovery-checkpoint.json`
//! (one entry per bare pod it is about to delete) and reads it back at start, so a pod deleted just before a
//! crash is still recreated.
//!
//! # Format (version 1)
//!
//! ```json
//! {
//!   "version": 1,
//!   "pods": {
//!     "<namespace>/<name>": { "recordedAt": "2026-03-01T10:00:00Z", "pod": { "apiVersion": "v1", "kind": "Pod", ... } }
//!   }
//! }
//! ```
//!
//! | field | meaning |
//! |---|---|
//! | `version` | `1`; any other value is refused |
//! | `pods` | keyed by `<namespace>/<name>` (the key must name its pod) |
//! | `recordedAt` | RFC 3339 time the entry was written, just before the delete request: the 24 h recovery window counts from it |
//! | `pod` | the whole pod as last read (UID included: a pod of that name with another UID means someone recreated it) |
//!
//! Upstream vgpu-manager's kubelet-checkpointmanager form, `{"checksum":N,"v1":{"recoveryPods":{"<ns>/<name>":Pod}}}`,
//! is read too (its checksum is not verified; `recordedAt` is the pod's `deletionTimestamp`, or the time of
//! reading), so a node switched from upstream mid-recovery keeps its entries; it is rewritten in our form on
//! the next change.
//!
//! # Write order
//!
//! Every change rewrites the whole file through [`write_atomic`] (temporary file, `fsync`, `rename`,
//! directory `fsync`; mode 0600, the pod specs may carry literal secrets): a reader sees the old or the new
//! file, never a mix. The controller writes an entry **before** it sends the delete and removes it only after
//! the replacement was created (or a pod of that name exists again), so a crash at any point leaves either
//! an undeleted pod (found again by the next poll) or an entry (recovered at start). A change whose write
//! fails is rolled back in memory, and the controller then does not delete the pod.
//!
//! A file that cannot be decoded is moved aside to `recovery-checkpoint.json.corrupt-<unix seconds>` and
//! the controller starts with an empty checkpoint ([`RecoveryCheckpoint::open`] reports it): refusing to
//! start would stop every future reschedule on the node for one bad file, and the moved file keeps the
//! evidence for an operator.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use serde::{Deserialize, Serialize};
use vgpu_core::abi::{AbiError, atomic::write_atomic};

/// The checkpoint directory inside the manager directory.
pub const CHECKPOINT_DIR: &str = "checkpoints";
/// The checkpoint file name.
pub const CHECKPOINT_FILE: &str = "recovery-checkpoint.json";
/// The format version written.
pub const CHECKPOINT_VERSION: u32 = 1;
/// File mode of the checkpoint.
pub const CHECKPOINT_MODE: u32 = 0o600;

/// The file's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointData {
    /// Format version ([`CHECKPOINT_VERSION`]).
    pub version: u32,
    /// Entries keyed by `<namespace>/<name>`.
    #[serde(default)]
    pub pods: BTreeMap<String, RecoveryEntry>,
}

impl Default for CheckpointData {
    fn default() -> Self {
        Self { version: CHECKPOINT_VERSION, pods: BTreeMap::new() }
    }
}

/// One bare pod to recreate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryEntry {
    /// When the entry was written (just before the delete request).
    pub recorded_at: Time,
    /// The pod as last read before deleting it.
    pub pod: Pod,
}

/// A checkpoint whose bytes do not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidCheckpoint {
    /// What is wrong.
    pub message: String,
}

/// A checkpoint operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// Reading, creating the directory or moving the file aside failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was attempted.
        action: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file does not decode.
    #[error("recovery checkpoint {}: {source}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: InvalidCheckpoint,
    },
    /// The atomic write failed.
    #[error("writing the recovery checkpoint: {source}")]
    Write {
        /// The write error (it names the path).
        #[source]
        source: AbiError,
    },
    /// The content did not serialise.
    #[error("encoding the recovery checkpoint {}: {source}", path.display())]
    Encode {
        /// The file.
        path: PathBuf,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
}

/// `<namespace>/<name>` of a pod.
pub fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The serialised file: pretty JSON with a trailing newline.
pub fn encode(data: &CheckpointData) -> Result<Vec<u8>, serde_json::Error> {
    let mut bytes = serde_json::to_vec_pretty(data)?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// Decodes our form, or upstream's (entries of which are dated by their `deletionTimestamp`, else `now`).
pub fn decode(bytes: &[u8], now: Timestamp) -> Result<CheckpointData, InvalidCheckpoint> {
    let invalid = |message: String| InvalidCheckpoint { message };
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| invalid(format!("not JSON: {e}")))?;
    let Some(object) = value.as_object() else {
        return Err(invalid("expected a JSON object".to_owned()));
    };
    if object.contains_key("version") {
        let data: CheckpointData =
            serde_json::from_value(value).map_err(|e| invalid(format!("not a version-1 checkpoint: {e}")))?;
        if data.version != CHECKPOINT_VERSION {
            return Err(invalid(format!(
                "version {} is not supported (this build reads version {CHECKPOINT_VERSION})",
                data.version
            )));
        }
        for (key, entry) in &data.pods {
            let named = pod_key(&entry.pod);
            if *key != named {
                return Err(invalid(format!("entry {key:?} holds pod {named:?}")));
            }
        }
        return Ok(data);
    }
    if object.contains_key("v1") || object.contains_key("checksum") {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct UpstreamV1 {
            #[serde(default)]
            recovery_pods: BTreeMap<String, Pod>,
        }
        #[derive(Deserialize)]
        struct Upstream {
            v1: Option<UpstreamV1>,
        }
        let upstream: Upstream = serde_json::from_value(value)
            .map_err(|e| invalid(format!("not a vgpu-manager recovery checkpoint: {e}")))?;
        let pods = upstream
            .v1
            .map(|v1| v1.recovery_pods)
            .unwrap_or_default()
            .into_values()
            .map(|pod| {
                let recorded_at = pod.metadata.deletion_timestamp.clone().unwrap_or(Time(now));
                (pod_key(&pod), RecoveryEntry { recorded_at, pod })
            })
            .collect();
        return Ok(CheckpointData { version: CHECKPOINT_VERSION, pods });
    }
    Err(invalid("neither a \"version\" nor a \"v1\" field".to_owned()))
}

/// What [`RecoveryCheckpoint::open`] found.
#[derive(Debug)]
pub struct Opened {
    /// The checkpoint to use.
    pub checkpoint: RecoveryCheckpoint,
    /// When the file did not decode: where it was moved, and why it was refused.
    pub set_aside: Option<(PathBuf, CheckpointError)>,
}

/// The recovery checkpoint: the file's content in memory, every change written through.
#[derive(Debug)]
pub struct RecoveryCheckpoint {
    path: PathBuf,
    data: CheckpointData,
}

impl RecoveryCheckpoint {
    /// `<manager_dir>/checkpoints/recovery-checkpoint.json`.
    pub fn path_in(manager_dir: &Path) -> PathBuf {
        manager_dir.join(CHECKPOINT_DIR).join(CHECKPOINT_FILE)
    }

    /// Reads `path`: a missing file is an empty checkpoint (nothing is written until the first change); a
    /// file that does not decode is moved aside (see the module docs) and reported in
    /// [`Opened::set_aside`]. Fails only when the file cannot be read or moved.
    pub fn open(path: PathBuf) -> Result<Opened, CheckpointError> {
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Opened {
                    checkpoint: Self { path, data: CheckpointData::default() },
                    set_aside: None,
                });
            }
            Err(source) => return Err(CheckpointError::Io { path, action: "read", source }),
        };
        let now = Timestamp::now();
        match decode(&bytes, now) {
            Ok(data) => Ok(Opened { checkpoint: Self { path, data }, set_aside: None }),
            Err(source) => {
                let mut name = path.file_name().map(std::ffi::OsString::from).unwrap_or_default();
                name.push(format!(".corrupt-{}", now.as_second()));
                let aside = path.with_file_name(name);
                std::fs::rename(&path, &aside).map_err(|source| CheckpointError::Io {
                    path: path.clone(),
                    action: "move aside the unreadable",
                    source,
                })?;
                let err = CheckpointError::Invalid { path: path.clone(), source };
                Ok(Opened {
                    checkpoint: Self { path, data: CheckpointData::default() },
                    set_aside: Some((aside, err)),
                })
            }
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The entries, keyed by `<namespace>/<name>`.
    pub fn entries(&self) -> &BTreeMap<String, RecoveryEntry> {
        &self.data.pods
    }

    /// Records `pod` (dated `now`) and writes the file; returns its key. An entry for the same pod (same
    /// key and UID) is kept as it is, with its original date, and nothing is written. On a failed write the
    /// entry is not kept.
    pub fn record(&mut self, pod: &Pod, now: Timestamp) -> Result<String, CheckpointError> {
        let key = pod_key(pod);
        if self.data.pods.get(&key).is_some_and(|e| e.pod.metadata.uid == pod.metadata.uid) {
            return Ok(key);
        }
        let previous =
            self.data.pods.insert(key.clone(), RecoveryEntry { recorded_at: Time(now), pod: pod.clone() });
        if let Err(err) = self.persist() {
            match previous {
                Some(p) => self.data.pods.insert(key, p),
                None => self.data.pods.remove(&key),
            };
            return Err(err);
        }
        Ok(key)
    }

    /// Removes an entry and writes the file; `false` (and no write) when there was none. On a failed write
    /// the entry stays.
    pub fn remove(&mut self, key: &str) -> Result<bool, CheckpointError> {
        let Some(entry) = self.data.pods.remove(key) else { return Ok(false) };
        if let Err(err) = self.persist() {
            self.data.pods.insert(key.to_owned(), entry);
            return Err(err);
        }
        Ok(true)
    }

    fn persist(&self) -> Result<(), CheckpointError> {
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| CheckpointError::Io {
                path: dir.to_path_buf(),
                action: "create the checkpoint directory",
                source,
            })?;
        }
        let bytes = encode(&self.data)
            .map_err(|source| CheckpointError::Encode { path: self.path.clone(), source })?;
        write_atomic(&self.path, &bytes, CHECKPOINT_MODE).map_err(|source| CheckpointError::Write { source })
    }
}

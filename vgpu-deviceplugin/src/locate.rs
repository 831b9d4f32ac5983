//! Which container a `PreStartContainer` call is for (contract §5.2), and the cleanup of per-container
//! directories whose pod is gone ([`remove_stale_dirs`], judged against [`LivePods`]).
//!
//! The kubelet passes only the device IDs. They are matched, as a set, against:
//!
//! 1. the kubelet pod-resources API `v1` ([`list_pod_resources`](vgpu_kubelet::podresources::list_pod_resources) over
//!    `/var/lib/kubelet/pod-resources/kubelet.sock`): each container's devices of our resource; the match
//!    names the pod by namespace/name;
//! 2. the kubelet's device-manager checkpoint ([`read_checkpoint`],
//!    `<device-plugin-path>/kubelet_internal_checkpoint`), when the API is unavailable or has no match:
//!    `Data.PodDeviceEntries[]` names the pod by UID. Newer kubelets store `DeviceIDs` as a map NUMA node →
//!    IDs, older ones as a plain list; both are read. The `Checksum` is not verified (the kubelet computes
//!    it over its Go struct encoding, which a reader cannot reproduce byte for byte), so a file with a
//!    missing or odd checksum is still usable.

use std::{
    collections::{BTreeMap, HashSet},
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use serde::Deserialize;
use vgpu_core::abi::vgpu_config;

use vgpu_kubelet::api::podresources::PodResources;

/// How a located pod is named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodKey {
    /// By UID (checkpoint).
    Uid(String),
    /// By namespace and name (pod-resources API).
    Name {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
}

/// Where a match came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The pod-resources API.
    PodResources,
    /// The kubelet checkpoint file.
    Checkpoint,
}

/// The container a set of device IDs was allocated to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocatedContainer {
    /// The pod.
    pub pod: PodKey,
    /// The container name.
    pub container: String,
    /// Where the match came from.
    pub source: Source,
}

/// Looking a container up failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LocateError {
    /// The pod-resources API could not be reached or answered with an error.
    #[error(transparent)]
    PodResources(#[from] vgpu_kubelet::podresources::PodResourcesError),
    /// The checkpoint file could not be read.
    #[error("{}: read kubelet checkpoint: {source}", path.display())]
    CheckpointIo {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The checkpoint file is not the kubelet's JSON.
    #[error(
        "{}: not a kubelet device-manager checkpoint (expected JSON {{\"Data\":{{\"PodDeviceEntries\":[{{\"PodUID\",\"ContainerName\",\"ResourceName\",\"DeviceIDs\"}}]}},\"Checksum\":N}}): {message}",
        path.display()
    )]
    CheckpointFormat {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
}

fn same_set(a: &[String], b: &[String]) -> bool {
    let a: HashSet<&String> = a.iter().collect();
    let b: HashSet<&String> = b.iter().collect();
    a == b
}

/// The container of `pods` whose `resource` devices (all its entries for that resource together) are
/// exactly `ids` as a set. An empty `ids` matches nothing.
pub fn find_in_pod_resources(
    pods: &[PodResources],
    resource: &str,
    ids: &[String],
) -> Option<LocatedContainer> {
    if ids.is_empty() {
        return None;
    }
    for pod in pods {
        for ctr in &pod.containers {
            let held: Vec<String> = ctr
                .devices
                .iter()
                .filter(|d| d.resource_name == resource)
                .flat_map(|d| d.device_ids.iter().cloned())
                .collect();
            if same_set(&held, ids) {
                return Some(LocatedContainer {
                    pod: PodKey::Name { namespace: pod.namespace.clone(), name: pod.name.clone() },
                    container: ctr.name.clone(),
                    source: Source::PodResources,
                });
            }
        }
    }
    None
}

/// One `PodDeviceEntries` item of the kubelet checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointEntry {
    /// `PodUID`.
    pub pod_uid: String,
    /// `ContainerName`.
    pub container_name: String,
    /// `ResourceName`.
    pub resource_name: String,
    /// `DeviceIDs`, flattened over NUMA nodes (in NUMA-key order) when stored as a map.
    pub device_ids: Vec<String>,
}

#[derive(Deserialize)]
struct CheckpointFile {
    #[serde(rename = "Data")]
    data: CheckpointData,
    // Read and ignored: any JSON value (or none) is accepted.
    #[serde(rename = "Checksum", default)]
    _checksum: serde_json::Value,
}

#[derive(Deserialize)]
struct CheckpointData {
    #[serde(rename = "PodDeviceEntries", default)]
    entries: Option<Vec<RawEntry>>,
}

#[derive(Deserialize)]
struct RawEntry {
    #[serde(rename = "PodUID")]
    pod_uid: String,
    #[serde(rename = "ContainerName")]
    container_name: String,
    #[serde(rename = "ResourceName")]
    resource_name: String,
    #[serde(rename = "DeviceIDs", default)]
    device_ids: Option<DeviceIds>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum DeviceIds {
    /// Kubelet ≥ 1.20: NUMA node → IDs.
    ByNuma(BTreeMap<String, Option<Vec<String>>>),
    /// Older kubelets.
    List(Vec<String>),
}

/// Parses checkpoint JSON (`path` only names the file in errors).
pub fn parse_checkpoint(path: &Path, text: &[u8]) -> Result<Vec<CheckpointEntry>, LocateError> {
    let file: CheckpointFile = serde_json::from_slice(text)
        .map_err(|e| LocateError::CheckpointFormat { path: path.to_path_buf(), message: e.to_string() })?;
    Ok(file
        .data
        .entries
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            let device_ids = match e.device_ids {
                None => Vec::new(),
                Some(DeviceIds::List(ids)) => ids,
                Some(DeviceIds::ByNuma(map)) => map.into_values().flatten().flatten().collect(),
            };
            CheckpointEntry {
                pod_uid: e.pod_uid,
                container_name: e.container_name,
                resource_name: e.resource_name,
                device_ids,
            }
        })
        .collect())
}

/// Reads and parses the checkpoint file at `path`.
pub fn read_checkpoint(path: &Path) -> Result<Vec<CheckpointEntry>, LocateError> {
    let text = std::fs::read(path)
        .map_err(|source| LocateError::CheckpointIo { path: path.to_path_buf(), source })?;
    parse_checkpoint(path, &text)
}

/// The checkpoint entry of `resource` holding exactly `ids` (as a set); the last such entry wins (the
/// kubelet appends). An empty `ids` matches nothing.
pub fn find_in_checkpoint(
    entries: &[CheckpointEntry],
    resource: &str,
    ids: &[String],
) -> Option<LocatedContainer> {
    if ids.is_empty() {
        return None;
    }
    entries.iter().rev().find(|e| e.resource_name == resource && same_set(&e.device_ids, ids)).map(|e| {
        LocatedContainer {
            pod: PodKey::Uid(e.pod_uid.clone()),
            container: e.container_name.clone(),
            source: Source::Checkpoint,
        }
    })
}

/// Top-level names under the manager dir that are not per-container directories.
pub const RESERVED_DIRS: [&str; 7] =
    ["checkpoints", "watcher", "registry", "claims", "tools", "driver", "config"];

/// The pod UID of a per-container directory name `<podUID>_<container>`, `None` for other names.
pub fn pod_uid_of_dir(name: &str) -> Option<&str> {
    if RESERVED_DIRS.contains(&name) || name.starts_with('.') {
        return None;
    }
    let (uid, ctr) = name.split_once('_')?;
    (!uid.is_empty() && !ctr.is_empty()).then_some(uid)
}

/// The pods still on the node, against which per-container directories are judged stale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LivePods {
    /// The UIDs of the node's pods, from the API server's pod list: a directory is live when the pod UID
    /// of its name is one of them.
    Uids(HashSet<String>),
    /// `(namespace, name)` of the kubelet's active pods, from the pod-resources API: the fallback when the
    /// API server cannot be asked (e.g. the plugin's RBAC is deleted before its pod stops at an uninstall).
    /// A directory is live when the pod its `config/vgpu.config` names (namespace and name, cut to
    /// [`vgpu_config::NAME_BUFFER_SIZE`] − 1 bytes there) is one of them; a directory without a readable
    /// `vgpu.config` is kept.
    Names(HashSet<(String, String)>),
}

impl LivePods {
    /// The active pods of a pod-resources `List` answer, by namespace and name.
    pub fn from_pod_resources(pods: &[PodResources]) -> Self {
        Self::Names(pods.iter().map(|p| (p.namespace.clone(), p.name.clone())).collect())
    }

    /// Whether the per-container directory `dir` (named `<uid>_<container>`) belongs to a live pod.
    fn holds(&self, uid: &str, dir: &Path) -> bool {
        match self {
            Self::Uids(uids) => uids.contains(uid),
            Self::Names(names) => {
                let path = dir.join("config").join(vgpu_config::FILE_NAME);
                match vgpu_config::read(&path) {
                    Ok(config) => names.iter().any(|(namespace, name)| {
                        recorded_as(namespace, &config.pod_namespace) && recorded_as(name, &config.pod_name)
                    }),
                    Err(err) => {
                        tracing::debug!(%err, "no pod name to match: the directory is kept");
                        true
                    }
                }
            }
        }
    }
}

/// Whether `full` is the name `vgpu.config` recorded as `recorded`: equal, or a prefix when the record
/// filled its buffer (at most `NAME_BUFFER_SIZE - 1` bytes, cut back to a character boundary).
fn recorded_as(full: &str, recorded: &str) -> bool {
    full == recorded
        || (recorded.len() + 4 >= vgpu_config::NAME_BUFFER_SIZE
            && full.len() > recorded.len()
            && full.starts_with(recorded))
}

/// Removes the per-container directories under `manager_dir` whose pod is not in `live` and whose
/// modification time is at least `grace` before `now`. Returns the removed directories; a directory that
/// cannot be removed is logged and skipped.
pub fn remove_stale_dirs(
    manager_dir: &Path,
    live: &LivePods,
    grace: Duration,
    now: SystemTime,
) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(manager_dir) else { return removed };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(uid) = name.to_str().and_then(pod_uid_of_dir) else { continue };
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_dir() {
            continue;
        }
        let path = entry.path();
        if live.holds(uid, &path) {
            continue;
        }
        let old_enough =
            meta.modified().ok().and_then(|m| now.duration_since(m).ok()).is_some_and(|age| age >= grace);
        if !old_enough {
            continue;
        }
        match std::fs::remove_dir_all(&path) {
            Ok(()) => removed.push(path),
            Err(err) => {
                tracing::warn!(dir = %path.display(), %err, "could not remove stale container directory")
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_kubelet::api::podresources::{ContainerDevices, ContainerResources};

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn checkpoint_map_and_list_forms_and_tolerant_checksum() {
        let path = Path::new("/x/kubelet_internal_checkpoint");
        let newer = br#"{"Data":{"PodDeviceEntries":[
            {"PodUID":"u1","ContainerName":"a","ResourceName":"nvidia.com/vgpu-number",
             "DeviceIDs":{"1":["GPU-b::0"],"0":["GPU-a::3"]},"AllocResp":"CgA="}],
            "RegisteredDevices":{"nvidia.com/vgpu-number":["GPU-a::3"]}},"Checksum":1234567}"#;
        let entries = parse_checkpoint(path, newer).unwrap();
        assert_eq!(entries[0].device_ids, ids(&["GPU-a::3", "GPU-b::0"]));
        let found = find_in_checkpoint(&entries, "nvidia.com/vgpu-number", &ids(&["GPU-b::0", "GPU-a::3"]));
        assert_eq!(found.unwrap().pod, PodKey::Uid("u1".into()));
        assert!(find_in_checkpoint(&entries, "nvidia.com/other", &ids(&["GPU-b::0", "GPU-a::3"])).is_none());
        assert!(find_in_checkpoint(&entries, "nvidia.com/vgpu-number", &ids(&["GPU-b::0"])).is_none());

        let older = br#"{"Data":{"PodDeviceEntries":[{"PodUID":"u2","ContainerName":"b",
            "ResourceName":"r","DeviceIDs":["x","y"]}]},"Checksum":"not-a-number"}"#;
        assert_eq!(parse_checkpoint(path, older).unwrap()[0].device_ids, ids(&["x", "y"]));
        let empty = br#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":null}}"#;
        assert!(parse_checkpoint(path, empty).unwrap().is_empty());
        let err = parse_checkpoint(path, b"{\"Checksum\":1}").unwrap_err();
        assert!(err.to_string().contains("kubelet_internal_checkpoint: not a kubelet"), "{err}");
        assert!(find_in_checkpoint(&entries, "nvidia.com/vgpu-number", &[]).is_none());
    }

    #[test]
    fn pod_resources_match_joins_a_containers_entries() {
        let dev = |r: &str, v: &[&str]| ContainerDevices {
            resource_name: r.into(),
            device_ids: ids(v),
            topology: None,
        };
        let pods = vec![PodResources {
            name: "p".into(),
            namespace: "ns".into(),
            containers: vec![
                ContainerResources {
                    name: "other".into(),
                    devices: vec![dev("r", &["a"])],
                    ..Default::default()
                },
                ContainerResources {
                    name: "main".into(),
                    devices: vec![dev("r", &["b"]), dev("x", &["zz"]), dev("r", &["c"])],
                    ..Default::default()
                },
            ],
            ..Default::default()
        }];
        let found = find_in_pod_resources(&pods, "r", &ids(&["c", "b"])).unwrap();
        assert_eq!(found.container, "main");
        assert_eq!(found.pod, PodKey::Name { namespace: "ns".into(), name: "p".into() });
        assert!(find_in_pod_resources(&pods, "r", &ids(&["b"])).is_none());
    }

    #[test]
    fn dir_names() {
        assert_eq!(pod_uid_of_dir("0b1a-22_main"), Some("0b1a-22"));
        assert_eq!(pod_uid_of_dir("uid_ctr_with_underscores"), Some("uid"));
        for name in
            ["watcher", "registry", "checkpoints", "claims", "tools", "nounderscore", "_x", "x_", ".tmp_x"]
        {
            assert_eq!(pod_uid_of_dir(name), None, "{name}");
        }
    }

    fn config_dir(manager: &Path, dir: &str, namespace: &str, name: &str) {
        let config = vgpu_config::VgpuConfig {
            pod_namespace: namespace.to_owned(),
            pod_name: name.to_owned(),
            ..vgpu_config::VgpuConfig::default()
        };
        let path = manager.join(dir).join("config").join(vgpu_config::FILE_NAME);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        vgpu_config::write(&path, &config).unwrap();
    }

    #[test]
    fn stale_dirs_by_uid_and_by_recorded_pod_name() {
        let tmp = tempfile::tempdir().unwrap();
        let m = tmp.path();
        let long = "p".repeat(100);
        config_dir(m, "u1_a", "ns", "live");
        config_dir(m, "u2_a", "ns", "gone");
        config_dir(m, "u3_a", "other", "live");
        config_dir(m, "u4_a", "ns", &long);
        std::fs::create_dir_all(m.join("u5_a")).unwrap(); // no vgpu.config
        std::fs::create_dir_all(m.join("registry")).unwrap();
        let now = SystemTime::now() + Duration::from_secs(60);

        let names = LivePods::Names(
            [("ns", "live"), ("ns", long.as_str())]
                .iter()
                .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
                .collect(),
        );
        let mut removed = remove_stale_dirs(m, &names, Duration::from_secs(10), now);
        removed.sort();
        assert_eq!(removed, vec![m.join("u2_a"), m.join("u3_a")]);
        for kept in ["u1_a", "u4_a", "u5_a", "registry"] {
            assert!(m.join(kept).is_dir(), "{kept}");
        }
        // Too young for the grace: kept whatever the pods.
        assert!(
            remove_stale_dirs(m, &LivePods::Uids(HashSet::new()), Duration::from_secs(600), now).is_empty()
        );
        let uids = LivePods::Uids(["u1".to_owned()].into_iter().collect());
        let mut removed = remove_stale_dirs(m, &uids, Duration::ZERO, now);
        removed.sort();
        assert_eq!(removed, vec![m.join("u4_a"), m.join("u5_a")]);
        assert!(m.join("u1_a").is_dir() && m.join("registry").is_dir());
    }

    #[test]
    fn cut_names_match_by_prefix_only_when_cut() {
        let cut = "x".repeat(vgpu_config::NAME_BUFFER_SIZE - 1);
        assert!(recorded_as(&"x".repeat(200), &cut));
        assert!(recorded_as(&cut, &cut));
        assert!(!recorded_as("xyz", "xy"), "a short record is the whole name");
        assert!(!recorded_as("ab", "abc"));
    }

    proptest::proptest! {
        #[test]
        fn a_name_matches_what_vgpu_config_records_of_it(name in "[a-z0-9.-]{1,253}", ns in "[a-z0-9-]{1,63}") {
            let tmp = tempfile::tempdir().unwrap();
            config_dir(tmp.path(), "u_c", &ns, &name);
            let live = LivePods::Names([(ns.clone(), name.clone())].into_iter().collect());
            proptest::prop_assert!(live.holds("u", &tmp.path().join("u_c")));
            let other = LivePods::Names([(ns, format!("{name}-other"))].into_iter().collect());
            // Only a cut record (≥ 60 bytes) is a prefix of a longer name.
            proptest::prop_assert_eq!(other.holds("u", &tmp.path().join("u_c")), name.len() >= 60);
        }
    }
}

//! Gate `NRISupport`: the NRI `CreateContainer` hook that gives each container of a vGPU claim its own
//! partition (contract §9), instead of one partition per claim mounted through the claim's CDI spec.
//!
//! With the gate on, Prepare writes the claim's CDI spec without partition mounts and creates only
//! `<manager>/claims/<claimUID>/` (see [`crate::state`]); a vGPU claim may then be reserved for several
//! pods. The in-process NRI plugin ([`vgpu_nri::plugin::Plugin`], name `manager.nvidia.com`, index
//! `--nri-plugin-idx`, socket `<nri-root>/nri.sock`) runs [`NriHook`]:
//!
//! | event | what the hook does |
//! |---|---|
//! | `CreateContainer` | reads `MANAGER_VGPU_CLAIM_UID` from the container's env (set by the claim's CDI spec); none, or a claim not `PrepareCompleted` in this node's checkpoint → no adjustment. Otherwise creates `claims/<claimUID>/<podUID>_<ctr>/{config,vgpu_lock,vmem_node,sm_node}` and `config/pids.config`, deletes stale `vmem_node/vmem_node.config` and `sm_node/sm_node.config`, caches `(podUID, ctr) → (claimUID, config dir)`, and answers the mounts and env below |
//! | `RemoveContainer` | drops the cache entry (the files go with the claim directory at Unprepare) |
//! | `Synchronize` | re-fills the cache from the containers that already have a partition (no file is touched) |
//!
//! Mounts (the same container paths as the CDI partition mounts without NRI; host paths under
//! `--host-manager-dir`):
//!
//! | container path | host path | options |
//! |---|---|---|
//! | `/etc/vgpu-manager/config` | `claims/<claimUID>/<podUID>_<ctr>/config` | `rw,nosuid,nodev,bind` |
//! | `/tmp/.vgpu_lock` | `…/vgpu_lock` | `rw,nosuid,nodev,bind` |
//! | `/tmp/.vmem_node` | `…/vmem_node` | `rw,nosuid,nodev,bind` |
//! | `/tmp/.sm_node` | `…/sm_node` | `rw,nosuid,nodev,bind` |
//! | `/etc/vgpu-manager/config/pids.config` | `…/config/pids.config` | `ro,nosuid,nodev,bind` |
//!
//! Env: `VGPU_POD_NAME`, `VGPU_POD_NAMESPACE`, `VGPU_POD_UID`, `VGPU_CONTAINER_NAME` (the pod's and the
//! container's), and `MANAGER_CLIENT_REGISTER_UUID`: empty with gate `DevicePluginClientMode` off; with it
//! on, the partition's register UUID ([`register_uuid`]: derived from claim, pod and container, so a
//! restarted plugin finds it again through `Synchronize`). The registry resolves it through
//! [`NriRegisterResolver`] (the per-container partitions of [`ContainerCache`], then the prepared claims'
//! [`RegisterTable`]) to the container's `config/` directory, for callers of that pod only. Prepare mints no
//! register UUID of its own with NRI (it makes no partition), so the claim's CDI spec carries none.
//!
//! A container the hook never saw (created while the plugin was not connected to the runtime, e.g. right
//! after a containerd restart) would run without a partition, so with no limits: the claim's CDI spec
//! therefore mounts [`guard_mount`](crate::partition::guard_mount), whose source never exists, on `/etc/vgpu-manager/config`. The runtime
//! fails such a container's creation (runc: no such file); the kubelet retries, and once the plugin is
//! back the hook's partition mount replaces the guard (an adjustment's mount removes the spec's mount on
//! the same path).
//!
//! A pod UID, container name or claim UID that is empty, `.`, `..` or holds a `/` fails the container's
//! creation with a message naming it (it would name a directory outside the claim's).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError},
};

use vgpu_nri::{
    api::{Container, ContainerAdjustment, ContainerUpdate, KeyValue, Mount, PodSandbox},
    plugin::{Handler, HookError, Plugin, PluginConfig},
};

use crate::{
    checkpoint::ClaimState,
    client_mode::{RegisterResolver, RegisterTable, RegisterTarget},
    state::DeviceState,
};

/// Re-exported so the binary wires the plugin through this crate alone.
pub use vgpu_nri::{health::NriHealth, plugin::NriError as PluginError, plugin::PluginIndex};

/// The container env the claim's CDI spec sets to the claim's UID.
pub const CLAIM_UID_ENV: &str = "MANAGER_VGPU_CLAIM_UID";

/// Where the plugin dials and which index it registers with (`--nri-root`, `--nri-plugin-idx`).
#[derive(Debug, Clone)]
pub struct NriConfig {
    /// `--nri-root` (`/var/run/nri`): the runtime's socket is `<root>/nri.sock`.
    pub root: PathBuf,
    /// `--nri-plugin-idx` (`00`).
    pub index: PluginIndex,
}

/// The hook failed on a container.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NriHookError {
    /// A pod UID, container name or claim UID that cannot name a directory.
    #[error("{what} {value:?} cannot name a partition directory (empty, '.', '..' or containing '/')")]
    BadName {
        /// `pod UID`, `container name`, `claim UID`.
        what: &'static str,
        /// The value.
        value: String,
    },
    /// The checkpoint could not be read.
    #[error("cannot read the prepared claims: {0}")]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// Creating or deleting a partition file failed.
    #[error("cannot {action} {path}: {message}")]
    Io {
        /// `create`, `remove`.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        message: String,
    },
}

impl From<NriHookError> for HookError {
    fn from(e: NriHookError) -> Self {
        HookError(e.to_string())
    }
}

/// `(podUID, container) → (claimUID, config dir)` of every container given a partition, for the
/// registry server (cheap to clone, shared).
#[derive(Debug, Clone, Default)]
pub struct ContainerCache(Arc<Mutex<CacheMap>>);

/// `(podUID, container)` → `(claimUID, config dir)`.
type CacheMap = HashMap<(String, String), (String, PathBuf)>;

impl ContainerCache {
    /// The claim and the partition's `config` directory (as this process sees it) of a container.
    pub fn lookup(&self, pod_uid: &str, container: &str) -> Option<(String, PathBuf)> {
        self.lock().get(&(pod_uid.to_owned(), container.to_owned())).cloned()
    }

    /// How many containers are cached.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// The register target of the container partition whose [`register_uuid`] is `uuid`: its `config`
    /// directory, writable by callers of its pod only.
    pub fn by_register_uuid(&self, uuid: &str) -> Option<RegisterTarget> {
        self.lock().iter().find(|((pod, ctr), (claim, _))| register_uuid(claim, pod, ctr) == uuid).map(
            |((pod, _), (_, config_dir))| RegisterTarget {
                config_dir: config_dir.clone(),
                pod_uids: vec![pod.clone()],
            },
        )
    }

    fn insert(&self, pod_uid: &str, container: &str, claim_uid: &str, config_dir: PathBuf) {
        self.lock().insert((pod_uid.to_owned(), container.to_owned()), (claim_uid.to_owned(), config_dir));
    }

    fn remove(&self, pod_uid: &str, container: &str) -> Option<(String, PathBuf)> {
        self.lock().remove(&(pod_uid.to_owned(), container.to_owned()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheMap> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The NRI hook of the DRA plugin.
#[derive(Debug)]
pub struct NriHook {
    state: Arc<DeviceState>,
    cache: ContainerCache,
}

impl NriHook {
    /// The hook over the plugin's prepared claims (its checkpoint and paths).
    pub fn new(state: Arc<DeviceState>) -> Self {
        Self { state, cache: ContainerCache::default() }
    }

    /// The container cache (for the registry server).
    pub fn cache(&self) -> ContainerCache {
        self.cache.clone()
    }

    /// The partition key of a container: `<podUID>_<ctr>`.
    pub fn partition_key(pod_uid: &str, container: &str) -> Result<String, NriHookError> {
        check_name("pod UID", pod_uid)?;
        check_name("container name", container)?;
        Ok(format!("{pod_uid}_{container}"))
    }

    /// The container's claim if it is prepared on this node.
    async fn prepared_claim(&self, container: &Container) -> Result<Option<String>, NriHookError> {
        let Some(uid) = claim_uid(container) else {
            return Ok(None);
        };
        let checkpoint = self.state.checkpoint().await?;
        let prepared =
            checkpoint.claims().get(&uid).is_some_and(|c| c.checkpoint_state == ClaimState::PrepareCompleted);
        if !prepared {
            tracing::debug!(claim = %uid, container = %container.name, "NRI CreateContainer: claim not prepared on this node, skipped");
            return Ok(None);
        }
        check_name("claim UID", &uid)?;
        Ok(Some(uid))
    }

    /// Creates the partition and answers its adjustment (see the module docs).
    pub async fn adjust(
        &self,
        pod: &PodSandbox,
        container: &Container,
    ) -> Result<ContainerAdjustment, NriHookError> {
        let Some(claim) = self.prepared_claim(container).await? else {
            return Ok(ContainerAdjustment::new());
        };
        let config = self.state.config();
        let key = Self::partition_key(&pod.uid, &container.name)?;
        let part = config.claim_dir(&claim).join(&key);
        crate::partition::create(&part).map_err(|e| NriHookError::Io {
            action: e.action,
            path: e.path,
            message: e.source.to_string(),
        })?;
        for stale in [
            part.join(vgpu_core::abi::vmem_node::DIR_NAME).join(vgpu_core::abi::vmem_node::FILE_NAME),
            part.join(vgpu_core::abi::sm_node::DIR_NAME).join(vgpu_core::abi::sm_node::FILE_NAME),
        ] {
            match std::fs::remove_file(&stale) {
                Ok(()) => tracing::debug!(path = %stale.display(), "stale partition file removed"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("remove", &stale, &e)),
            }
        }
        self.cache.insert(&pod.uid, &container.name, &claim, part.join("config"));
        let host = config.host_claim_dir(&claim).join(&key);
        // Client mode: the partition's register UUID (empty without the gate).
        let uuid = if config.client_mode() {
            register_uuid(&claim, &pod.uid, &container.name)
        } else {
            String::new()
        };
        let mut adjust = ContainerAdjustment::new();
        adjust.mounts = crate::partition::partition_mounts(&host).into_iter().map(nri_mount).collect();
        adjust.env = [
            ("VGPU_POD_NAME", pod.name.as_str()),
            ("VGPU_POD_NAMESPACE", pod.namespace.as_str()),
            ("VGPU_POD_UID", pod.uid.as_str()),
            ("VGPU_CONTAINER_NAME", container.name.as_str()),
            (crate::client_mode::ENV, uuid.as_str()),
        ]
        .into_iter()
        .map(|(key, value)| KeyValue { key: key.to_owned(), value: value.to_owned(), ..KeyValue::default() })
        .collect();
        tracing::info!(claim = %claim, pod = %pod.uid, container = %container.name, partition = %part.display(), "NRI: per-container vGPU partition injected");
        Ok(adjust)
    }
}

impl Handler for NriHook {
    async fn create_container(
        &self,
        pod: &PodSandbox,
        container: &Container,
    ) -> Result<ContainerAdjustment, HookError> {
        Ok(self.adjust(pod, container).await?)
    }

    async fn remove_container(&self, pod: &PodSandbox, container: &Container) -> Result<(), HookError> {
        if self.cache.remove(&pod.uid, &container.name).is_some() {
            tracing::debug!(pod = %pod.uid, container = %container.name, "NRI: container cache entry dropped");
        }
        Ok(())
    }

    async fn synchronize(
        &self,
        pods: &[PodSandbox],
        containers: &[Container],
    ) -> Result<Vec<ContainerUpdate>, HookError> {
        let config = self.state.config();
        for container in containers {
            let Some(pod) = pods.iter().find(|p| p.id == container.pod_sandbox_id) else {
                continue;
            };
            let (Some(claim), Ok(key)) =
                (claim_uid(container), Self::partition_key(&pod.uid, &container.name))
            else {
                continue;
            };
            if check_name("claim UID", &claim).is_err() {
                continue;
            }
            let config_dir = config.claim_dir(&claim).join(key).join("config");
            if config_dir.is_dir() {
                self.cache.insert(&pod.uid, &container.name, &claim, config_dir);
            }
        }
        Ok(Vec::new())
    }
}

/// The register UUID of the per-container partition of `container` of pod `pod_uid` in claim `claim_uid`
/// (gate `DevicePluginClientMode`): the first 128 bits of SHA-256 over the three names, written as a UUID
/// (version 8, RFC 9562). Derived, not stored: the registry still admits only callers of `pod_uid`.
pub fn register_uuid(claim_uid: &str, pod_uid: &str, container: &str) -> String {
    use sha2::Digest;
    let mut hash = sha2::Sha256::new();
    for part in ["vgpu-nri-partition", claim_uid, pod_uid, container] {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    let digest = hash.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    b[6] = (b[6] & 0x0f) | 0x80;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// The client-mode registry's resolver with gate `NRISupport` (module docs): the per-container partitions
/// the hook made, then the prepared claims' register UUIDs.
#[derive(Debug, Clone)]
pub struct NriRegisterResolver {
    table: Arc<RegisterTable>,
    cache: ContainerCache,
}

impl NriRegisterResolver {
    /// Resolves through `cache` ([`NriHook::cache`]), then `table` ([`DeviceState::register_table`]).
    pub fn new(table: Arc<RegisterTable>, cache: ContainerCache) -> Self {
        Self { table, cache }
    }
}

impl RegisterResolver for NriRegisterResolver {
    fn resolve(&self, uuid: &str) -> Option<RegisterTarget> {
        self.cache.by_register_uuid(uuid).or_else(|| self.table.resolve(uuid))
    }
}

/// The NRI plugin running `hook` with the contract's name and `config`'s socket and index.
pub fn plugin(hook: NriHook, config: &NriConfig) -> Result<Plugin<NriHook>, PluginError> {
    Plugin::new(PluginConfig::new(&config.root, config.index.clone()), Arc::new(hook))
}

fn nri_mount(m: vgpu_core::cdi::Mount) -> Mount {
    Mount {
        destination: m.container_path,
        type_: "bind".to_owned(),
        source: m.host_path,
        options: m.options,
        ..Mount::default()
    }
}

/// The last non-empty `MANAGER_VGPU_CLAIM_UID=` of the container's env.
fn claim_uid(container: &Container) -> Option<String> {
    container
        .env
        .iter()
        .rev()
        .find_map(|kv| kv.strip_prefix(CLAIM_UID_ENV)?.strip_prefix('='))
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

fn check_name(what: &'static str, value: &str) -> Result<(), NriHookError> {
    if value.is_empty() || value == "." || value == ".." || value.contains('/') || value.contains('\0') {
        return Err(NriHookError::BadName { what, value: value.to_owned() });
    }
    Ok(())
}

fn io(action: &'static str, path: &Path, e: &std::io::Error) -> NriHookError {
    NriHookError::Io { action, path: path.to_path_buf(), message: e.to_string() }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn claim_uid_is_the_last_non_empty_entry() {
        let mut c = Container::new();
        assert_eq!(claim_uid(&c), None);
        c.env = vec!["MANAGER_VGPU_CLAIM_UID=".into(), "A=1".into()];
        assert_eq!(claim_uid(&c), None);
        c.env.push("MANAGER_VGPU_CLAIM_UID=u1".into());
        c.env.push("MANAGER_VGPU_CLAIM_UID_X=u2".into());
        assert_eq!(claim_uid(&c).as_deref(), Some("u1"));
    }

    #[test]
    fn partition_keys_refuse_path_tricks() {
        assert_eq!(NriHook::partition_key("pod-1", "main").unwrap(), "pod-1_main");
        for (pod, ctr) in [("", "c"), ("..", "c"), ("p", "a/b"), ("p", ".")] {
            let err = NriHook::partition_key(pod, ctr).unwrap_err().to_string();
            assert!(err.contains("cannot name a partition directory"), "{err}");
        }
    }

    #[test]
    fn register_uuids_are_stable_distinct_and_well_formed() {
        let a = register_uuid("claim", "pod", "main");
        assert_eq!(a, register_uuid("claim", "pod", "main"), "derived again after a restart");
        assert_eq!(a.len(), 36);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit() || c == '-'));
        assert_eq!(a.as_bytes()[14], b'8', "version 8");
        for other in [
            register_uuid("claim", "pod", "side"),
            register_uuid("claim", "pod2", "main"),
            register_uuid("claim2", "pod", "main"),
            register_uuid("clai", "mpod", "main"),
        ] {
            assert_ne!(a, other);
        }
    }

    #[test]
    fn mounts_match_the_cdi_partition_mounts() {
        let m: Vec<Mount> = crate::partition::partition_mounts(Path::new("/h/claims/u/p_c"))
            .into_iter()
            .map(nri_mount)
            .collect();
        let rows: Vec<_> =
            m.iter().map(|m| (m.destination.as_str(), m.source.as_str(), m.options[0].as_str())).collect();
        assert_eq!(
            rows,
            [
                ("/etc/vgpu-manager/config", "/h/claims/u/p_c/config", "rw"),
                ("/tmp/.vgpu_lock", "/h/claims/u/p_c/vgpu_lock", "rw"),
                ("/tmp/.vmem_node", "/h/claims/u/p_c/vmem_node", "rw"),
                ("/tmp/.sm_node", "/h/claims/u/p_c/sm_node", "rw"),
                ("/etc/vgpu-manager/config/pids.config", "/h/claims/u/p_c/config/pids.config", "ro"),
            ]
        );
        assert!(
            m.iter().all(|m| m.type_ == "bind"
                && m.options.ends_with(&["nosuid".into(), "nodev".into(), "bind".into()]))
        );
    }
}

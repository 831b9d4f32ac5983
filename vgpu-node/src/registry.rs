//! The device registry of client mode (contract §5.8, gate `DevicePluginClientMode`):
//! `registry.VDeviceRegistry/RegisterContainerDevice` on `<manager-dir>/registry/socket.sock`.
//!
//! A process inside a vGPU container (the `device-client` the library runs) asks the plugin to record the
//! PIDs of its container. The plugin:
//!
//! 1. identifies the caller **once, when its connection is accepted** ([`peer`]): the socket credentials
//!    (`SO_PEERCRED` pid, uid, gid), a handle on that process that cannot follow its PID to another one
//!    (an open `/proc/<pid>/stat`), the process's uids (the socket's uid must be one of them, else the PID
//!    was reused before the accept), and `<proc-root>/<pid>/cgroup` (its `0::` line on a unified cgroup v2
//!    host, its `memory` line on v1 and hybrid hosts, [`cgroup_path_of`](cgroup::cgroup_path_of)) → the pod UID in that cgroup path
//!    (parsed per the node's cgroup driver: systemd `kubepods-<qos>-pod<uid with _>.slice`, cgroupfs
//!    `pod<uid>`; auto accepts both). The identity is bound to the connection; requests never look the
//!    PID up again;
//! 2. at each request, refuses (`PermissionDenied`, naming what failed) a connection whose caller could not
//!    be identified, or whose process has exited since (`caller process <pid> (uid <uid>) exited after
//!    connecting …`: its PID may already belong to someone else), and a caller that names another pod
//!    (`caller pod "<uid>" is not authorized for this register request`);
//! 3. checks the target container has a per-container directory (Allocate wrote it);
//! 4. polls the caller's accept-time cgroup (`<cgroup-root>/<path>/cgroup.procs`, v1 under `memory/`) every
//!    40 ms, for at most 60 s, until it holds PIDs;
//! 5. checks the caller's uid against the container (the **uid rule**): the caller's PID is one of the
//!    listed PIDs, or at least one listed process has the caller's uid as its effective uid
//!    (`<proc-root>/<pid>/status`, second field of `Uid:`); otherwise `caller uid <uid> (pid <pid>) is not a
//!    process of container cgroup <path> and owns none of its processes: refused`. A process of another
//!    user can so never register someone's container;
//! 6. checks the caller is still alive, then writes `<manager-dir>/<podUID>_<ctr>/config/pids.config`: the
//!    sorted PIDs, one decimal per line, atomically (refusing a symlink in its place).
//!
//! Limits: requests up to 16 KiB, 64 concurrent streams per connection, 256 registrations in flight and 8
//! per caller PID (`register concurrency budget exhausted, retry later`). The socket directory is created
//! with mode 0711 and refused when group- or world-writable; the socket is made **0660** and given the
//! group [`RegistryConfig::socket_group`] (`--registry-socket-group`; default: the group it is created
//! with, the plugin's effective gid): the processes that run `vgpu-device-client` need that group as
//! their primary or a supplementary group (`securityContext.supplementalGroups` of the vGPU pods), or
//! they cannot connect. It is republished by a guard when it is unlinked, and removed on stop only if it
//! is still the one this server bound.
//!
//! # Register UUIDs (DRA claim partitions)
//!
//! A request with `register_uuid` names a partition of a DRA claim instead of a pod and container: the DRA
//! kubelet plugin (gate `DevicePluginClientMode`) serves this same registry with a [`RegisterResolver`]
//! ([`serve_registry_with`]) that maps the UUID to the partition's `config/` directory
//! (`<manager-dir>/claims/<claimUID>/<partitionKey>/config`) and the pods the claim is reserved for. Steps 2
//! and 4–6 are the same; step 3 becomes: the UUID must be known (`NotFound`: `register UUID … names no
//! prepared claim partition on this node`) and the caller's pod one of the claim's consumers
//! (`PermissionDenied`, the same message as above). Without a resolver (the device plugin) a request with
//! a register UUID is `Unimplemented`.

use std::{
    collections::HashMap,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use tokio::{net::UnixListener, task::JoinHandle};
use tokio_stream::{StreamExt as _, wrappers::UnixListenerStream};
use tokio_util::sync::{CancellationToken, DropGuard};
use tonic::{Request, Response, Status};
use vgpu_core::{abi::atomic::write_atomic, node_config::CgroupDriver};

pub mod cgroup;
pub mod peer;

use self::peer::{CallerCgroup, CallerIdentity, IdentifiedStream, IdentifyConfig, Liveness, PeerCredentials};
use crate::api::registry::{
    ContainerDeviceRequest, ContainerDeviceResponse,
    v_device_registry_server::{VDeviceRegistry, VDeviceRegistryServer},
};
use vgpu_kubelet::{SocketError, authority::AuthorityRewrite};

/// Serving the registry failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Creating, binding or serving its socket failed.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The socket directory is unsafe (group- or world-writable).
    #[error("invalid device plugin configuration: {0}")]
    Config(String),
}

/// `registry/socket.sock` under the manager dir.
pub const SOCKET: &str = "registry/socket.sock";
/// Largest request accepted.
pub const MAX_REQUEST_BYTES: usize = 16 * 1024;
/// Registrations in flight, all callers.
pub const GLOBAL_IN_FLIGHT: usize = 256;
/// Registrations in flight per caller PID.
pub const PER_CALLER_IN_FLIGHT: usize = 8;
/// `pids.config` inside a container's `config/` directory.
pub const PIDS_FILE: &str = "pids.config";

/// Where the registry looks and what it waits for.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// The manager dir as this process sees it (socket and per-container directories).
    pub manager_dir: PathBuf,
    /// The host's `/proc` as this process sees it.
    pub proc_root: PathBuf,
    /// The host's cgroup mount (`/sys/fs/cgroup`).
    pub cgroup_root: PathBuf,
    /// The node's cgroup driver (how pod UIDs appear in cgroup paths).
    pub cgroup_driver: CgroupDriver,
    /// Poll period of the caller's cgroup (upstream 40 ms).
    pub poll_interval: Duration,
    /// Longest wait for PIDs (upstream 60 s).
    pub poll_timeout: Duration,
    /// The group the socket is given (mode 0660); `None` keeps the group it is created with (this
    /// process's effective gid, or the directory's with set-group-ID).
    pub socket_group: Option<u32>,
}

impl RegistryConfig {
    /// The socket path.
    pub fn socket(&self) -> PathBuf {
        self.manager_dir.join(SOCKET)
    }
}

/// Why a `--registry-socket-group` value names no group.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SocketGroupError {
    /// The value is empty.
    #[error("expected a group name or a numeric gid")]
    Empty,
    /// The group file could not be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The group file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// No group of that name.
    #[error("no group {name:?} in {} (give the numeric gid)", path.display())]
    Unknown {
        /// The name given.
        name: String,
        /// The group file searched.
        path: PathBuf,
    },
}

/// Resolves a socket group: a decimal gid as is, else a group name looked up in `group_file`
/// (`/etc/group` format, `name:password:gid:members`). Note that a name is resolved in the plugin's
/// image, not on the host: deployments should give the numeric gid.
pub fn resolve_socket_group(value: &str, group_file: &Path) -> Result<u32, SocketGroupError> {
    let value = value.trim();
    if value.is_empty() {
        return Err(SocketGroupError::Empty);
    }
    if let Ok(gid) = value.parse::<u32>() {
        return Ok(gid);
    }
    let text = std::fs::read_to_string(group_file)
        .map_err(|source| SocketGroupError::Read { path: group_file.to_path_buf(), source })?;
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let gid = fields.nth(1)?.trim().parse::<u32>().ok()?;
            (name == value).then_some(gid)
        })
        .next()
        .ok_or_else(|| SocketGroupError::Unknown { name: value.to_owned(), path: group_file.to_path_buf() })
}

/// Where a register UUID's PIDs are written, and who may write them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisterTarget {
    /// The partition's `config/` directory as this process sees it (`pids.config` is written into it).
    pub config_dir: PathBuf,
    /// The UIDs of the pods whose containers may register this UUID (the claim's consumers).
    pub pod_uids: Vec<String>,
}

/// Resolves register UUIDs (DRA claim partitions) to their [`RegisterTarget`]; the DRA kubelet plugin
/// provides one from its prepared claims.
pub trait RegisterResolver: Send + Sync + std::fmt::Debug {
    /// The target of `uuid`, or `None` when no prepared claim partition has it.
    fn resolve(&self, uuid: &str) -> Option<RegisterTarget>;
}

/// Whether `uuid` may be a register UUID: 1 to 64 ASCII letters, digits and `-`.
fn plain_uuid(uuid: &str) -> bool {
    (1..=64).contains(&uuid.len()) && uuid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

struct Budget {
    global: usize,
    per_caller: HashMap<u32, usize>,
}

/// Releases one slot of the in-flight budget on drop.
struct Slot<'a> {
    budget: &'a Mutex<Budget>,
    pid: u32,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut b = self.budget.lock().unwrap_or_else(PoisonError::into_inner);
        b.global = b.global.saturating_sub(1);
        if let Some(n) = b.per_caller.get_mut(&self.pid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                b.per_caller.remove(&self.pid);
            }
        }
    }
}

/// The `VDeviceRegistry` service.
pub struct RegistryService {
    config: RegistryConfig,
    budget: Mutex<Budget>,
    resolver: Option<Arc<dyn RegisterResolver>>,
}

impl RegistryService {
    /// A service over `config` (register UUIDs refused: no resolver).
    pub fn new(config: RegistryConfig) -> Self {
        Self { config, budget: Mutex::new(Budget { global: 0, per_caller: HashMap::new() }), resolver: None }
    }

    /// Serves register UUIDs through `resolver` (the DRA kubelet plugin's prepared claims).
    #[must_use]
    pub fn with_resolver(mut self, resolver: Arc<dyn RegisterResolver>) -> Self {
        self.resolver = Some(resolver);
        self
    }

    /// The `config/` directory of the request's target, after the authorization of step 3 (module docs).
    fn target(&self, cgroup: &CallerCgroup, req: &ContainerDeviceRequest) -> Result<PathBuf, Status> {
        let caller_pod = cgroup.pod_uid.as_deref().unwrap_or_default();
        let refused = || {
            Status::permission_denied(format!(
                "caller pod {caller_pod:?} is not authorized for this register request"
            ))
        };
        if !req.register_uuid.is_empty() {
            let Some(resolver) = &self.resolver else {
                return Err(Status::unimplemented(
                    "register_uuid (DRA claims) is not served by the device plugin; send pod_uid and container_name",
                ));
            };
            if !plain_uuid(&req.register_uuid) {
                return Err(Status::invalid_argument(format!(
                    "register_uuid {:?}: expected 1 to 64 letters, digits and '-'",
                    req.register_uuid
                )));
            }
            let target = resolver.resolve(&req.register_uuid).ok_or_else(|| {
                Status::not_found(format!(
                    "register UUID {} names no prepared claim partition on this node",
                    req.register_uuid
                ))
            })?;
            if caller_pod.is_empty() || !target.pod_uids.iter().any(|p| p == caller_pod) {
                return Err(refused());
            }
            if !target.config_dir.is_dir() {
                return Err(Status::not_found(format!(
                    "register UUID {}: the partition directory {} is missing",
                    req.register_uuid,
                    target.config_dir.display()
                )));
            }
            return Ok(target.config_dir);
        }
        if req.pod_uid.is_empty() || req.container_name.is_empty() {
            return Err(Status::invalid_argument("pod_uid and container_name are required"));
        }
        if req.container_name.contains('/') || req.pod_uid.contains('/') || req.container_name.contains("..")
        {
            return Err(Status::invalid_argument(format!(
                "container_name {:?} / pod_uid {:?}: expected plain names",
                req.container_name, req.pod_uid
            )));
        }
        if caller_pod != req.pod_uid {
            return Err(refused());
        }
        let config_dir =
            self.config.manager_dir.join(format!("{}_{}", req.pod_uid, req.container_name)).join("config");
        if !config_dir.is_dir() {
            return Err(Status::not_found(format!(
                "container {} of pod {} was not allocated on this node ({} is missing)",
                req.container_name,
                req.pod_uid,
                config_dir.display()
            )));
        }
        Ok(config_dir)
    }

    fn acquire(&self, pid: u32) -> Result<Slot<'_>, Status> {
        let mut b = self.budget.lock().unwrap_or_else(PoisonError::into_inner);
        let mine = b.per_caller.get(&pid).copied().unwrap_or(0);
        if b.global >= GLOBAL_IN_FLIGHT || mine >= PER_CALLER_IN_FLIGHT {
            return Err(Status::resource_exhausted("register concurrency budget exhausted, retry later"));
        }
        b.global += 1;
        b.per_caller.insert(pid, mine + 1);
        Ok(Slot { budget: &self.budget, pid })
    }

    async fn register(
        &self,
        identity: &CallerIdentity,
        caller: PeerCredentials,
        cgroup: &CallerCgroup,
        req: &ContainerDeviceRequest,
    ) -> Result<(), Status> {
        let cfg = &self.config;
        let config_dir = self.target(cgroup, req)?;
        let base = if cgroup.v2 { cfg.cgroup_root.clone() } else { cfg.cgroup_root.join("memory") };
        let procs = base.join(cgroup.path.trim_start_matches('/')).join("cgroup.procs");
        let deadline = Instant::now() + cfg.poll_timeout;
        let pids = loop {
            let mut pids: Vec<u32> = std::fs::read_to_string(&procs)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect();
            if !pids.is_empty() {
                pids.sort_unstable();
                pids.dedup();
                break pids;
            }
            if Instant::now() >= deadline {
                return Err(Status::deadline_exceeded(format!(
                    "no process in {} after {:?}",
                    procs.display(),
                    cfg.poll_timeout
                )));
            }
            tokio::time::sleep(cfg.poll_interval).await;
        };
        self.check_uid(caller, cgroup, &pids)?;
        alive(identity, caller)?;
        let file = config_dir.join(PIDS_FILE);
        if std::fs::symlink_metadata(&file).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(Status::failed_precondition(format!("{} is a symlink: refused", file.display())));
        }
        let body: String = pids.iter().map(|p| format!("{p}\n")).collect();
        write_atomic(&file, body.as_bytes(), 0o644).map_err(|e| Status::internal(e.to_string()))
    }

    /// The uid rule (module docs, step 5): the caller is one of the container's processes, or one of them
    /// runs with the caller's uid as its effective uid.
    fn check_uid(&self, caller: PeerCredentials, cgroup: &CallerCgroup, pids: &[u32]) -> Result<(), Status> {
        if pids.binary_search(&caller.pid).is_ok() {
            return Ok(());
        }
        let owns_one = pids.iter().any(|pid| {
            let status = self.config.proc_root.join(pid.to_string()).join("status");
            std::fs::read_to_string(status)
                .ok()
                .and_then(|text| peer::status_effective_uid(&text))
                .is_some_and(|uid| uid == caller.uid)
        });
        if owns_one {
            return Ok(());
        }
        Err(Status::permission_denied(format!(
            "caller uid {} (pid {}) is not a process of container cgroup {} and owns none of its processes: \
             refused",
            caller.uid, caller.pid, cgroup.path
        )))
    }
}

/// Refuses a caller whose process has exited since its connection was accepted.
fn alive(identity: &CallerIdentity, caller: PeerCredentials) -> Result<(), Status> {
    match identity.liveness() {
        Liveness::Alive => Ok(()),
        Liveness::Exited => Err(Status::permission_denied(format!(
            "caller process {} (uid {}) exited after connecting (its PID may already belong to another \
             process): refused",
            caller.pid, caller.uid
        ))),
    }
}

/// The accept-time identity of a request's connection, refused unless it names a live caller's cgroup.
fn authenticate<T>(request: &Request<T>) -> Result<(Arc<CallerIdentity>, PeerCredentials), Status> {
    let identity = request
        .extensions()
        .get::<Arc<CallerIdentity>>()
        .cloned()
        .ok_or_else(|| Status::permission_denied("the connection carries no caller identity: refused"))?;
    let caller = match (&identity.credentials, &identity.cgroup) {
        (Some(cred), Ok(_)) => *cred,
        (_, Err(err)) => return Err(Status::permission_denied(err.to_string())),
        (None, Ok(_)) => {
            return Err(Status::permission_denied("caller credentials (SO_PEERCRED) unavailable"));
        }
    };
    alive(&identity, caller)?;
    Ok((identity, caller))
}

#[tonic::async_trait]
impl VDeviceRegistry for RegistryService {
    async fn register_container_device(
        &self,
        request: Request<ContainerDeviceRequest>,
    ) -> Result<Response<ContainerDeviceResponse>, Status> {
        let (identity, caller) = match authenticate(&request) {
            Ok(found) => found,
            Err(status) => {
                tracing::warn!(%status, "register refused: caller not identified");
                return Err(status);
            }
        };
        let pid = caller.pid;
        let _slot = self.acquire(pid)?;
        let req = request.into_inner();
        let result = match &identity.cgroup {
            Ok(cgroup) => self.register(&identity, caller, cgroup, &req).await,
            Err(err) => Err(Status::permission_denied(err.to_string())),
        };
        match result {
            Ok(()) => {
                tracing::info!(pod = %req.pod_uid, container = %req.container_name, register_uuid = %req.register_uuid, pid, uid = caller.uid, "container PIDs registered");
                Ok(Response::new(ContainerDeviceResponse {}))
            }
            Err(status) => {
                tracing::warn!(pod = %req.pod_uid, container = %req.container_name, register_uuid = %req.register_uuid, pid, uid = caller.uid, %status, "register refused");
                Err(status)
            }
        }
    }
}

/// The registry being served; [`RunningRegistry::stop`] ends it and removes the socket (if it is still
/// ours).
#[derive(Debug)]
pub struct RunningRegistry {
    /// The socket.
    pub socket: PathBuf,
    /// Cancels the serve task's token on [`RunningRegistry::stop`], and when the registry is dropped.
    stop: DropGuard,
    handle: JoinHandle<Result<(), RegistryError>>,
    identity: Arc<Mutex<Option<(u64, u64)>>>,
}

impl RunningRegistry {
    /// Stops the server and removes the socket when it is the one this server bound last.
    pub async fn stop(self) {
        self.stop.disarm().cancel();
        match self.handle.await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(%err, "registry server ended with an error"),
            Err(err) => tracing::warn!(%err, "registry server task failed"),
        }
        let ours = *self.identity.lock().unwrap_or_else(PoisonError::into_inner);
        if ours.is_some() && identity(&self.socket) == ours {
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

/// The accepted connections of `listener`, each with its caller identified on accept and its `:authority`
/// rewritten ([`vgpu_kubelet::authority`]).
fn accepted(
    listener: UnixListener,
    identify: Arc<IdentifyConfig>,
) -> impl tokio_stream::Stream<Item = std::io::Result<AuthorityRewrite<IdentifiedStream>>> {
    UnixListenerStream::new(listener)
        .map(move |conn| conn.map(|s| AuthorityRewrite::new(IdentifiedStream::accept(s, &identify))))
}

fn identity(path: &Path) -> Option<(u64, u64)> {
    vgpu_kubelet::socket::socket_identity(path)
}

fn io<'a>(path: &'a Path, action: &'static str) -> impl FnOnce(std::io::Error) -> RegistryError + 'a {
    move |source| SocketError::Io { path: path.to_path_buf(), action, source }.into()
}

/// [`vgpu_kubelet::socket::bind_atomic`] with the registry socket's mode.
fn bind(socket: &Path, group: Option<u32>) -> Result<UnixListener, RegistryError> {
    Ok(vgpu_kubelet::socket::bind_atomic(socket, group, SOCKET_MODE)?)
}

/// The socket's mode: owner and group read/write, nobody else.
pub const SOCKET_MODE: u32 = 0o660;

/// How often the guard checks that the socket is still there.
pub const GUARD_INTERVAL: Duration = Duration::from_millis(500);

/// Creates the socket directory (0711; refused when group/world-writable), binds the socket (0660, group
/// [`RegistryConfig::socket_group`]) and serves the registry on it; each connection's caller is identified
/// when it is accepted ([`peer`]). A guard republishes the socket when it is unlinked (checked every
/// [`GUARD_INTERVAL`]).
pub fn serve_registry(config: RegistryConfig) -> Result<RunningRegistry, RegistryError> {
    serve_registry_with(config, GUARD_INTERVAL, None)
}

/// [`serve_registry`] with the guard checking every `guard` period.
pub fn serve_registry_with_guard(
    config: RegistryConfig,
    guard: Duration,
) -> Result<RunningRegistry, RegistryError> {
    serve_registry_with(config, guard, None)
}

/// [`serve_registry`] with the guard period and, for the DRA kubelet plugin, the [`RegisterResolver`] of
/// register UUIDs (`None`: they are refused, as the device plugin does).
pub fn serve_registry_with(
    config: RegistryConfig,
    guard: Duration,
    resolver: Option<Arc<dyn RegisterResolver>>,
) -> Result<RunningRegistry, RegistryError> {
    let socket = config.socket();
    let dir = socket.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    if !dir.exists() {
        // Never through a symbolic link planted meanwhile (it is refused, its target keeps its mode).
        vgpu_core::abi::perms::create_dir_all_mode(&dir, 0o711).map_err(|e| SocketError::Io {
            path: e.path().to_path_buf(),
            action: "create registry directory (mode 0711)",
            source: std::io::Error::other(e),
        })?;
    }
    let mode = std::fs::metadata(&dir).map_err(io(&dir, "stat registry directory"))?.permissions().mode();
    if mode & 0o022 != 0 {
        return Err(RegistryError::Config(format!(
            "{}: mode {:o} is group- or world-writable (expected 0711)",
            dir.display(),
            mode & 0o777
        )));
    }
    let group = config.socket_group;
    let mut listener = Some(bind(&socket, group)?);
    let identity_cell = Arc::new(Mutex::new(identity(&socket)));
    let stop = CancellationToken::new();
    let stop_guard = stop.clone().drop_guard();
    let identify = Arc::new(IdentifyConfig {
        own_proc: PathBuf::from(peer::OWN_PROC),
        proc_root: config.proc_root.clone(),
        cgroup_driver: config.cgroup_driver,
        unified: cgroup::is_unified(&config.cgroup_root),
    });
    let service = RegistryService::new(config);
    let service = Arc::new(match resolver {
        Some(resolver) => service.with_resolver(resolver),
        None => service,
    });
    let path = socket.clone();
    let ids = Arc::clone(&identity_cell);
    let handle = tokio::spawn(async move {
        loop {
            let current = match listener.take() {
                Some(l) => l,
                None => {
                    let l = bind(&path, group)?;
                    *ids.lock().unwrap_or_else(PoisonError::into_inner) = identity(&path);
                    tracing::warn!(socket = %path.display(), "registry socket was removed; republished");
                    l
                }
            };
            // The identity recorded right after binding (not re-read here: the file may already be gone).
            let ours = *ids.lock().unwrap_or_else(PoisonError::into_inner);
            let stopping = stop.clone();
            let watched = path.clone();
            let shutdown = async move {
                loop {
                    tokio::select! {
                        () = stopping.cancelled() => return,
                        () = tokio::time::sleep(guard) => {}
                    }
                    if identity(&watched) != ours {
                        return;
                    }
                }
            };
            tonic::transport::Server::builder()
                .max_concurrent_streams(64)
                .http2_keepalive_interval(Some(Duration::from_secs(30)))
                .add_service(
                    VDeviceRegistryServer::from_arc(Arc::clone(&service))
                        .max_decoding_message_size(MAX_REQUEST_BYTES),
                )
                .serve_with_incoming_shutdown(accepted(current, Arc::clone(&identify)), shutdown)
                .await
                .map_err(|source| SocketError::Transport { path: path.clone(), source })?;
            if stop.is_cancelled() {
                return Ok(());
            }
        }
    });
    Ok(RunningRegistry { socket, stop: stop_guard, handle, identity: identity_cell })
}

//! [`Driver`]: the plugin's two sockets, served until shutdown, and the stale-claim sweep.
//!
//! | socket | services | guard |
//! |---|---|---|
//! | `<registry-dir>/<driver>-reg.sock` | `pluginregistration.Registration` | re-bound (and so re-registered: the kubelet's plugin watcher sees a new socket) when the file disappears or is replaced, e.g. when the kubelet re-creates its `plugins_registry` directory |
//! | `<plugins-dir>/<driver>/dra.sock` | `DRAPlugin` v1 + v1beta1, `DRAResourceHealth` v1 + v1alpha1 | re-bound the same way |
//!
//! Both are bound atomically ([`vgpu_kubelet::socket::bind_atomic`]: bind a temporary name, chmod
//! 0660, rename into place), and the DRA socket exists before the registration socket appears, so the kubelet
//! never dials an endpoint that is not there yet. On shutdown both files are removed.
//!
//! With gate `SharedSMUtilizationWatcher` the driver also runs the device plugin's node-wide SM watcher
//! ([`vgpu_node::sm_watcher::SmWatcher`], the same code, not a copy) on the manager directory
//! ([`crate::config::DriverConfig::sm_watcher_file`]) until stopped: vGPU claims are told to read its samples,
//! so a file that cannot be set up (or a driver without a backend, see [`Driver::with_sm_watcher`]) fails
//! [`Driver::serve`] before any socket is bound.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use tokio::{
    net::{UnixListener, UnixStream},
    sync::{mpsc, watch},
    task::JoinHandle,
};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::Router;
use vgpu_kubelet::{
    authority::AuthorityRewrite,
    socket::{bind_atomic, socket_identity},
};
use vgpu_node::sm_watcher::SmWatcher;

use crate::{
    registration::{RegistrationService, RegistrationState},
    service::{DraService, HealthFeed, HealthService},
    state::DeviceState,
};
use vgpu_kubelet::api::{dra_v1, dra_v1beta1, health_v1, health_v1alpha1, pluginregistration};

/// Mode of both sockets.
pub const SOCKET_MODE: u32 = 0o660;
/// How long a stop waits for open connections to finish before closing them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Serving failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// A directory could not be created.
    #[error("{path}: create directory: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Binding or serving a socket failed.
    #[error(transparent)]
    Server(#[from] vgpu_kubelet::SocketError),
    /// Gate `SharedSMUtilizationWatcher` is on but the watcher cannot run.
    #[error("SharedSMUtilizationWatcher=true: {0}")]
    SmWatcher(String),
    /// A serve task panicked or was cancelled.
    #[error("serve task for {0}: {1}")]
    Join(PathBuf, String),
}

/// The DRA kubelet plugin's servers over a [`DeviceState`] and a [`HealthFeed`].
pub struct Driver {
    state: Arc<DeviceState>,
    health: HealthFeed,
    backend: Option<Arc<dyn vgpu_core::backend::DeviceBackend>>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("state", &self.state)
            .field("sm_watcher_backend", &self.backend.is_some())
            .finish_non_exhaustive()
    }
}

/// A running [`Driver`]: [`stop`](Self::stop) it, watch the kubelet's registration reports.
#[derive(Debug)]
pub struct RunningDriver {
    /// `<registry-dir>/<driver>-reg.sock`.
    pub registration_socket: PathBuf,
    /// `<plugins-dir>/<driver>/dra.sock`.
    pub dra_socket: PathBuf,
    /// The kubelet's registration reports.
    pub registration: watch::Receiver<RegistrationState>,
    /// The shared SM watcher's file while the watcher runs (gate `SharedSMUtilizationWatcher`).
    pub sm_watcher_file: Option<PathBuf>,
    stop: CancellationToken,
    tasks: Vec<(PathBuf, JoinHandle<Result<(), DriverError>>)>,
}

impl RunningDriver {
    /// Stops serving (open health streams end), waits for the tasks (at most [`SHUTDOWN_GRACE`] each: a client
    /// that keeps its connection open is cut off) and removes both socket files.
    pub async fn stop(self) -> Result<(), DriverError> {
        self.stop.cancel();
        self.join().await
    }

    async fn join(self) -> Result<(), DriverError> {
        let mut result = Ok(());
        for (path, mut task) in self.tasks {
            let r = match tokio::time::timeout(SHUTDOWN_GRACE, &mut task).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => Err(DriverError::Join(path.clone(), e.to_string())),
                Err(_) => {
                    tracing::warn!(socket = %path.display(), grace = ?SHUTDOWN_GRACE, "connections still open after the grace period; closing them");
                    task.abort();
                    Ok(())
                }
            };
            if result.is_ok() {
                result = r;
            }
        }
        for socket in [&self.registration_socket, &self.dra_socket] {
            if let Err(e) = std::fs::remove_file(socket)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(socket = %socket.display(), error = %e, "could not remove socket");
            }
        }
        result
    }

    /// Runs until `shutdown` completes or a server fails, then stops.
    pub async fn run_until(self, shutdown: impl std::future::Future<Output = ()>) -> Result<(), DriverError> {
        tokio::pin!(shutdown);
        let stopped = self.stop.clone();
        tokio::select! {
            () = &mut shutdown => {}
            () = stopped.cancelled() => {}
        }
        self.stop().await
    }
}

impl Driver {
    /// A driver over `state` reporting `health`.
    pub fn new(state: Arc<DeviceState>, health: HealthFeed) -> Self {
        Self { state, health, backend: None }
    }

    /// The device backend the shared SM watcher samples (needed when gate `SharedSMUtilizationWatcher` is
    /// on; unused otherwise).
    #[must_use]
    pub fn with_sm_watcher(mut self, backend: Arc<dyn vgpu_core::backend::DeviceBackend>) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Binds the DRA socket, then the registration socket, and serves both (and the stale-claim sweep, and
    /// with gate `SharedSMUtilizationWatcher` the shared SM watcher) in tasks.
    pub fn serve(self) -> Result<RunningDriver, DriverError> {
        let config = self.state.config().clone();
        let watcher = if config.sm_watcher() {
            let backend = self.backend.clone().ok_or_else(|| {
                DriverError::SmWatcher(
                    "no device backend was given to sample (Driver::with_sm_watcher)".into(),
                )
            })?;
            let watcher = SmWatcher::open(backend, &config.manager_dir).map_err(|e| {
                DriverError::SmWatcher(format!("cannot set up the shared SM watcher file: {e}"))
            })?;
            tracing::info!(file = %watcher.path().display(), period = ?config.sm_watcher_period, "shared SM watcher started");
            Some(watcher)
        } else {
            None
        };
        let dra_socket = config.dra_socket();
        let registration_socket = config.registration_socket();
        for dir in [config.plugin_dir(), config.registry_dir.clone()] {
            std::fs::create_dir_all(&dir).map_err(|source| DriverError::Dir { path: dir.clone(), source })?;
        }
        let stop = CancellationToken::new();
        let guard = config.registration_guard_interval;

        let dra = DraService::new(Arc::clone(&self.state));
        let names = self.state.devices().iter().map(|d| d.name.clone()).collect::<Vec<_>>();
        let health = HealthService::new(config.node_name.clone(), names, self.health.clone(), stop.clone());
        let dra_router = tonic::transport::Server::builder()
            .add_service(dra_v1::dra_plugin_server::DraPluginServer::new(dra.clone()))
            .add_service(dra_v1beta1::dra_plugin_server::DraPluginServer::new(dra.clone()))
            .add_service(health_v1::dra_resource_health_server::DraResourceHealthServer::new(health.clone()))
            .add_service(health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(health));
        let registration = RegistrationService::new(&config.driver_name, &dra_socket);
        let registration_status = registration.status();
        let registration_router = tonic::transport::Server::builder()
            .add_service(pluginregistration::registration_server::RegistrationServer::new(registration));

        let dra_listener = bind_atomic(&dra_socket, None, SOCKET_MODE)?;
        let mut tasks = vec![(
            dra_socket.clone(),
            tokio::spawn(serve_guarded(dra_socket.clone(), dra_listener, guard, stop.clone(), dra_router)),
        )];
        let registration_listener = bind_atomic(&registration_socket, None, SOCKET_MODE)?;
        tasks.push((
            registration_socket.clone(),
            tokio::spawn(serve_guarded(
                registration_socket.clone(),
                registration_listener,
                guard,
                stop.clone(),
                registration_router,
            )),
        ));
        let sm_watcher_file = watcher.as_ref().map(|w| w.path().to_path_buf());
        if let Some(watcher) = watcher {
            let watch_stop = stop.clone();
            let period = config.sm_watcher_period;
            tasks.push((
                config.sm_watcher_file(),
                tokio::spawn(async move {
                    watcher.run(period, watch_stop.cancelled_owned()).await;
                    Ok(())
                }),
            ));
        }
        let state = Arc::clone(&self.state);
        let sweep_stop = stop.clone();
        tasks.push((
            config.checkpoint_path(),
            tokio::spawn(async move {
                state.run_sweeper(sweep_stop.cancelled_owned()).await;
                Ok(())
            }),
        ));
        Ok(RunningDriver {
            registration_socket,
            dra_socket,
            registration: registration_status,
            sm_watcher_file,
            stop,
            tasks,
        })
    }
}

/// Serves `router` on `listener` until `stop`. The connections come through one channel: when the socket file
/// at `path` disappears or is replaced (checked every `guard`), a new socket is bound there and its accept
/// loop feeds the same server, so open connections (a kubelet's health stream) are not disturbed.
async fn serve_guarded(
    path: PathBuf,
    listener: UnixListener,
    guard: Duration,
    stop: CancellationToken,
    router: Router,
) -> Result<(), DriverError> {
    let (tx, rx) = mpsc::channel::<std::io::Result<AuthorityRewrite<UnixStream>>>(16);
    let mut acceptor = accept_into(listener, tx.clone(), path.clone());
    let mut ours = socket_identity(&path);
    let stopping = stop.clone();
    let watched = path.clone();
    let guard_loop = async move {
        loop {
            tokio::select! {
                () = stopping.cancelled() => break,
                () = tokio::time::sleep(guard) => {}
            }
            if socket_identity(&watched) == ours {
                continue;
            }
            match bind_atomic(&watched, None, SOCKET_MODE) {
                Ok(l) => {
                    ours = socket_identity(&watched);
                    acceptor.abort();
                    acceptor = accept_into(l, tx.clone(), watched.clone());
                    tracing::warn!(socket = %watched.display(), "socket was removed or replaced; bound again");
                }
                Err(e) => {
                    tracing::warn!(socket = %watched.display(), error = %e, "cannot bind the socket again; retrying")
                }
            }
        }
        acceptor.abort();
    };
    let shutdown = stop.cancelled_owned();
    let serve = router.serve_with_incoming_shutdown(ReceiverStream::new(rx), shutdown);
    let (served, ()) = tokio::join!(serve, guard_loop);
    served.map_err(|source| vgpu_kubelet::SocketError::Transport { path, source })?;
    Ok(())
}

/// Accepts connections of `listener` (each with its `:authority` rewritten: the kubelet's plugin watcher
/// sends the registration socket's path there) into `tx` until the channel closes (or the task is aborted).
fn accept_into(
    listener: UnixListener,
    tx: mpsc::Sender<std::io::Result<AuthorityRewrite<UnixStream>>>,
    path: PathBuf,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    if tx.send(Ok(AuthorityRewrite::new(stream))).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(socket = %path.display(), error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    })
}

/// Whether `path` names a socket file now.
pub fn socket_exists(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

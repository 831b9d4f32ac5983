//! The plugin runtime: connect to the runtime's socket, register, serve the `Plugin` service through a
//! [`Handler`], and reconnect with backoff when the runtime goes away.
//!
//! # Session
//!
//! | step | who | what |
//! |---|---|---|
//! | 1 | plugin | dials `<nri-root>/nri.sock`, multiplexes it ([`crate::mux`]): serves `Plugin` on connection 1, calls `Runtime` on connection 2 |
//! | 2 | plugin → runtime | `RegisterPlugin{plugin_name, plugin_idx, NRI_version}` (limit [`PluginConfig::registration_timeout`]) |
//! | 3 | runtime → plugin | `Configure` → the [`Handler::events`] mask (default CreateContainer + RemoveContainer); the link is now up ([`NriHealth`]) |
//! | 4 | runtime → plugin | `Synchronize` (possibly split, `more = true` parts are collected first) → [`Handler::synchronize`] |
//! | 5 | runtime → plugin | the subscribed events: `CreateContainer` → [`Handler::create_container`]'s adjustment, `RemoveContainer` (or `StateChange{REMOVE_CONTAINER}` from older runtimes) → [`Handler::remove_container`], `UpdateContainer`, `StopContainer`, `Shutdown` |
//! | 6 | either | the trunk closes: the link is down since then; the plugin dials again after [`PluginConfig::backoff_initial`], doubling to [`PluginConfig::backoff_max`] while dialing fails |
//!
//! Names and indexes follow upstream's checks: a name of `[a-zA-Z0-9_.+-]`, an index of exactly two digits
//! (the runtime calls plugins in ascending index order).

use std::{
    future::Future,
    path::{Path, PathBuf},
    pin::pin,
    str::FromStr,
    sync::{Arc, Mutex},
    time::Duration,
};

use protobuf::MessageField;
use tokio::{net::UnixStream, sync::watch};
use tokio_stream::StreamExt as _;
use ttrpc::r#async::{
    Client, Server,
    transport::{Listener, Socket},
};

use crate::{
    api::{
        ConfigureRequest, ConfigureResponse, Container, ContainerAdjustment, ContainerUpdate,
        CreateContainerRequest, CreateContainerResponse, Empty, Event, LinuxResources, PodSandbox,
        RegisterPluginRequest, RemoveContainerRequest, RemoveContainerResponse, StateChangeEvent,
        StopContainerRequest, StopContainerResponse, SynchronizeRequest, SynchronizeResponse,
        UpdateContainerRequest, UpdateContainerResponse, UpdateContainersRequest, UpdateContainersResponse,
    },
    health::{Clock, NriHealth, SystemClock, UNHEALTHY_AFTER},
    mux::{Mux, MuxEnd, MuxError, MuxWatcher, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN},
    service::{self, status},
};

/// The plugin name vgpu registers (contract §9).
pub const PLUGIN_NAME: &str = "manager.nvidia.com";
/// The default plugin index (`--nri-plugin-idx`).
pub const DEFAULT_INDEX: &str = "00";
/// The NRI version the plugin announces (the upstream release whose protocol this is).
pub const NRI_VERSION: &str = "v0.12.1";
/// Upstream's default registration timeout.
pub const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);
/// The socket file inside the NRI root.
pub const SOCKET_NAME: &str = "nri.sock";

/// The plugin runtime failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NriError {
    /// A plugin index that is not two digits.
    #[error("invalid plugin index {value:?}: {reason}")]
    InvalidIndex {
        /// The index given.
        value: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A plugin name with a character outside `[a-zA-Z0-9_.+-]`, or empty.
    #[error("invalid plugin name {value:?}: {reason}")]
    InvalidName {
        /// The name given.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// Dialing, binding or accepting on the socket failed.
    #[error("cannot {action} NRI socket {path}: {source}")]
    Socket {
        /// `connect to`, `bind`, `accept on`.
        action: &'static str,
        /// The socket.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The multiplexer refused.
    #[error("NRI multiplexer: {0}")]
    Mux(#[from] MuxError),
    /// A ttrpc call or the ttrpc server failed.
    #[error("NRI {what}: {}", describe(.source))]
    Ttrpc {
        /// The call or step (`RegisterPlugin`, `starting the plugin service`, …).
        what: String,
        /// The ttrpc error.
        #[source]
        source: ttrpc::Error,
    },
    /// Something did not happen in time.
    #[error("NRI {what}: no answer within {after:?}")]
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// The limit.
        after: Duration,
    },
    /// The runtime refused the registration, or the plugin's configuration failed.
    #[error("NRI {what} failed: {reason}")]
    Refused {
        /// `registration` or `configuration`.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// The connection ended before the session was set up.
    #[error("NRI connection closed during {0}")]
    Closed(&'static str),
}

/// A ttrpc error in words: an error status as `<code>: <message>` (ttrpc's own text is its `Debug`).
fn describe(e: &ttrpc::Error) -> String {
    match e {
        ttrpc::Error::RpcStatus(s) => format!("{:?}: {}", s.code(), s.message()),
        other => other.to_string(),
    }
}

/// A plugin index: exactly two digits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginIndex(String);

impl FromStr for PluginIndex {
    type Err = NriError;

    fn from_str(value: &str) -> Result<Self, NriError> {
        let invalid = |reason| NriError::InvalidIndex { value: value.to_owned(), reason };
        if value.len() != 2 {
            return Err(invalid("must be 2 digits"));
        }
        if !value.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid("not [0-9][0-9]"));
        }
        Ok(Self(value.to_owned()))
    }
}

impl PluginIndex {
    /// The two digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for PluginIndex {
    fn default() -> Self {
        Self(DEFAULT_INDEX.to_owned())
    }
}

/// Checks a plugin name as upstream does: not empty, only `[a-zA-Z0-9_.+-]`.
pub fn check_plugin_name(name: &str) -> Result<(), NriError> {
    let invalid = |reason: String| NriError::InvalidName { value: name.to_owned(), reason };
    if name.is_empty() {
        return Err(invalid("name is empty".to_owned()));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+')))
    {
        return Err(invalid(format!("contains invalid character {c:?}")));
    }
    Ok(())
}

/// A set of [`Event`]s as `ConfigureResponse.events` carries it: bit `e - 1` for event `e`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventMask(pub i32);

impl EventMask {
    /// Every event upstream defines (`UNKNOWN` < e < `LAST`).
    pub const VALID: Self = Self((1 << (Event::LAST as i32 - 1)) - 1);

    /// The mask of `events`.
    pub fn of(events: &[Event]) -> Self {
        let mut mask = Self::default();
        for &e in events {
            mask.0 |= Self::bit(e);
        }
        mask
    }

    /// Whether `event` is in the mask.
    pub fn contains(self, event: Event) -> bool {
        let bit = Self::bit(event);
        bit != 0 && self.0 & bit == bit
    }

    fn bit(event: Event) -> i32 {
        match event as i32 {
            e @ 1..=30 => 1 << (e - 1),
            _ => 0,
        }
    }
}

/// A hook failed: the runtime gets the message as the call's error status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HookError(pub String);

/// What the plugin does at each event. Every method has a default that changes nothing.
pub trait Handler: Send + Sync + 'static {
    /// The events to subscribe to (default: CreateContainer and RemoveContainer).
    fn events(&self) -> EventMask {
        EventMask::of(&[Event::CREATE_CONTAINER, Event::REMOVE_CONTAINER])
    }

    /// The runtime configures the plugin (its name, version and timeouts are in `request`).
    fn configure(&self, request: &ConfigureRequest) -> impl Future<Output = Result<(), HookError>> + Send {
        let _ = request;
        async { Ok(()) }
    }

    /// The pods and containers that exist (all parts of a split synchronization at once).
    fn synchronize(
        &self,
        pods: &[PodSandbox],
        containers: &[Container],
    ) -> impl Future<Output = Result<Vec<ContainerUpdate>, HookError>> + Send {
        let _ = (pods, containers);
        async { Ok(Vec::new()) }
    }

    /// A container is being created: the adjustment to apply to it.
    fn create_container(
        &self,
        pod: &PodSandbox,
        container: &Container,
    ) -> impl Future<Output = Result<ContainerAdjustment, HookError>> + Send {
        let _ = (pod, container);
        async { Ok(ContainerAdjustment::new()) }
    }

    /// A container's resources are being updated.
    fn update_container(
        &self,
        pod: &PodSandbox,
        container: &Container,
        resources: Option<&LinuxResources>,
    ) -> impl Future<Output = Result<Vec<ContainerUpdate>, HookError>> + Send {
        let _ = (pod, container, resources);
        async { Ok(Vec::new()) }
    }

    /// A container is being stopped.
    fn stop_container(
        &self,
        pod: &PodSandbox,
        container: &Container,
    ) -> impl Future<Output = Result<Vec<ContainerUpdate>, HookError>> + Send {
        let _ = (pod, container);
        async { Ok(Vec::new()) }
    }

    /// A container was removed.
    fn remove_container(
        &self,
        pod: &PodSandbox,
        container: &Container,
    ) -> impl Future<Output = Result<(), HookError>> + Send {
        let _ = (pod, container);
        async { Ok(()) }
    }

    /// The runtime is shutting down.
    fn shutdown(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// The plugin's settings.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    /// The runtime's socket (`<nri-root>/nri.sock`).
    pub socket: PathBuf,
    /// The plugin name ([`PLUGIN_NAME`]).
    pub name: String,
    /// The plugin index (`--nri-plugin-idx`).
    pub index: PluginIndex,
    /// How long RegisterPlugin, and then the runtime's Configure, may take.
    pub registration_timeout: Duration,
    /// First delay before dialing again.
    pub backoff_initial: Duration,
    /// Longest delay between dials.
    pub backoff_max: Duration,
    /// Disconnected longer than this → unhealthy ([`UNHEALTHY_AFTER`]).
    pub unhealthy_after: Duration,
}

impl PluginConfig {
    /// The defaults for the runtime socket under `nri_root` and plugin index `index`.
    pub fn new(nri_root: &Path, index: PluginIndex) -> Self {
        Self {
            socket: nri_root.join(SOCKET_NAME),
            name: PLUGIN_NAME.to_owned(),
            index,
            registration_timeout: REGISTRATION_TIMEOUT,
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(10),
            unhealthy_after: UNHEALTHY_AFTER,
        }
    }
}

/// The plugin: a [`Handler`] served to whichever runtime listens on the socket.
#[derive(Debug)]
pub struct Plugin<H> {
    config: PluginConfig,
    handler: Arc<H>,
    health: NriHealth,
}

impl<H: Handler> Plugin<H> {
    /// A plugin with `config` serving `handler` (the system clock; see [`Plugin::with_clock`]).
    pub fn new(config: PluginConfig, handler: Arc<H>) -> Result<Self, NriError> {
        check_plugin_name(&config.name)?;
        let health = NriHealth::new(Arc::new(SystemClock), config.unhealthy_after);
        Ok(Self { config, handler, health })
    }

    /// The same plugin reading time from `clock` (its health starts disconnected at `clock`'s now).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.health = NriHealth::new(clock, self.config.unhealthy_after);
        self
    }

    /// The link's health, shared with probes.
    pub fn health(&self) -> NriHealth {
        self.health.clone()
    }

    /// The settings.
    pub fn config(&self) -> &PluginConfig {
        &self.config
    }

    /// Connects, serves and reconnects until `shutdown` resolves.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let mut shutdown = pin!(shutdown);
        let mut delay = self.config.backoff_initial;
        loop {
            let attempt = tokio::select! {
                attempt = self.connect() => attempt,
                () = &mut shutdown => return,
            };
            match attempt {
                Ok(mut session) => {
                    delay = self.config.backoff_initial;
                    self.health.set_connected();
                    tracing::info!(socket = %self.config.socket.display(), name = %self.config.name, index = self.config.index.as_str(), "NRI plugin registered and configured");
                    let end = tokio::select! {
                        end = session.ended() => Some(end),
                        () = &mut shutdown => None,
                    };
                    session.close().await;
                    self.health.set_disconnected();
                    match end {
                        Some(end) => tracing::warn!(?end, "NRI runtime connection lost; reconnecting"),
                        None => return,
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, retry_in = ?delay, "NRI plugin not connected");
                }
            }
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = &mut shutdown => return,
            }
            delay = (delay * 2).min(self.config.backoff_max);
        }
    }

    /// One session: dial, register, wait for Configure. The session serves until the trunk closes.
    pub async fn connect(&self) -> Result<Session, NriError> {
        let path = &self.config.socket;
        let stream = UnixStream::connect(path).await.map_err(|source| NriError::Socket {
            action: "connect to",
            path: path.clone(),
            source,
        })?;
        let mut mux = Mux::new(stream, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN])?;
        let served = mux.take(PLUGIN_SERVICE_CONN)?;
        let calls = mux.take(RUNTIME_SERVICE_CONN)?;
        let (configured_tx, mut configured) = watch::channel(None);
        let state = Arc::new(SessionState { configured: configured_tx, sync: Mutex::new(None) });
        let mut server = serve_one(served, plugin_methods(Arc::clone(&self.handler), state))
            .await
            .map_err(|source| NriError::Ttrpc { what: "starting the plugin service".to_owned(), source })?;
        let client = Client::new(Socket::new(calls));
        let session = async {
            let request = RegisterPluginRequest {
                plugin_name: self.config.name.clone(),
                plugin_idx: self.config.index.as_str().to_owned(),
                NRI_version: NRI_VERSION.to_owned(),
                ..RegisterPluginRequest::default()
            };
            let limit = self.config.registration_timeout;
            service::call::<_, Empty>(
                &client,
                service::RUNTIME_SERVICE,
                service::REGISTER_PLUGIN,
                &request,
                limit,
            )
            .await
            .map_err(|source| NriError::Ttrpc { what: service::REGISTER_PLUGIN.to_owned(), source })?;
            let mut watcher = mux.watcher();
            let outcome = tokio::select! {
                outcome = tokio::time::timeout(limit, configured.wait_for(Option::is_some)) => outcome,
                _ = watcher.ended() => return Err(NriError::Closed("configuration")),
            };
            match outcome {
                Err(_) => Err(NriError::Timeout { what: "Configure after RegisterPlugin", after: limit }),
                Ok(Err(_)) => Err(NriError::Closed("configuration")),
                Ok(Ok(result)) => match result.clone() {
                    Some(Err(reason)) => Err(NriError::Refused { what: "configuration", reason }),
                    _ => Ok(()),
                },
            }
        }
        .await;
        match session {
            Ok(()) => Ok(Session { watcher: mux.watcher(), mux: Some(mux), server, client }),
            Err(e) => {
                drop(mux);
                let _ = server.shutdown().await;
                Err(e)
            }
        }
    }
}

/// A live session with the runtime.
pub struct Session {
    mux: Option<Mux>,
    watcher: MuxWatcher,
    server: Server,
    client: Client,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("mux", &self.mux).finish_non_exhaustive()
    }
}

impl Session {
    /// Waits until the trunk closes.
    pub async fn ended(&mut self) -> MuxEnd {
        self.watcher.ended().await
    }

    /// `Runtime.UpdateContainers`: asks for updates outside of any event; answers the ones that failed.
    pub async fn update_containers(
        &self,
        update: Vec<ContainerUpdate>,
    ) -> Result<Vec<ContainerUpdate>, NriError> {
        let request = UpdateContainersRequest { update, ..UpdateContainersRequest::default() };
        let response: UpdateContainersResponse = service::call(
            &self.client,
            service::RUNTIME_SERVICE,
            service::UPDATE_CONTAINERS,
            &request,
            REGISTRATION_TIMEOUT,
        )
        .await
        .map_err(|source| NriError::Ttrpc { what: service::UPDATE_CONTAINERS.to_owned(), source })?;
        Ok(response.failed)
    }

    /// Closes the trunk and stops serving.
    pub async fn close(mut self) {
        drop(self.mux.take());
        let _ = self.server.shutdown().await;
    }
}

/// What the plugin service shares within one session.
#[derive(Debug)]
struct SessionState {
    /// Set once Configure ran: `Ok` or the handler's refusal.
    configured: watch::Sender<Option<Result<(), String>>>,
    /// The parts of a split Synchronize collected so far.
    sync: Mutex<Option<SynchronizeRequest>>,
}

/// Starts a ttrpc server whose only connection is `stream`. The listener never ends (a pending stream
/// after the one connection) so that `Server::shutdown` finds its accept loop alive.
pub(crate) async fn serve_one(
    stream: tokio::io::DuplexStream,
    services: std::collections::HashMap<String, ttrpc::r#async::Service>,
) -> ttrpc::Result<Server> {
    let incoming = tokio_stream::once(Ok::<_, std::io::Error>(stream)).chain(tokio_stream::pending());
    let mut server = Server::new().register_service(services).add_listener(Listener::new(incoming));
    server.start().await?;
    Ok(server)
}

fn missing(what: &str) -> ttrpc::Status {
    status(ttrpc::Code::INVALID_ARGUMENT, format!("{what} is missing"))
}

fn failed(e: HookError) -> ttrpc::Status {
    status(ttrpc::Code::UNKNOWN, e.0)
}

/// The `Plugin` service's method table over `handler`.
fn plugin_methods<H: Handler>(
    handler: Arc<H>,
    state: Arc<SessionState>,
) -> std::collections::HashMap<String, ttrpc::r#async::Service> {
    let (h, s) = (Arc::clone(&handler), Arc::clone(&state));
    let configure = service::unary(move |req: ConfigureRequest| {
        let (h, s) = (Arc::clone(&h), Arc::clone(&s));
        async move {
            tracing::info!(runtime = %req.runtime_name, version = %req.runtime_version, nri = %req.NRI_version, "NRI Configure");
            let events = h.events();
            let outcome = match h.configure(&req).await {
                Err(e) => Err(e.0),
                Ok(()) if events.0 & !EventMask::VALID.0 != 0 => Err(format!(
                    "the handler subscribes to invalid events 0x{:x}",
                    events.0 & !EventMask::VALID.0
                )),
                Ok(()) => Ok(()),
            };
            s.configured.send_replace(Some(outcome.clone()));
            outcome
                .map(|()| ConfigureResponse { events: events.0, ..ConfigureResponse::default() })
                .map_err(|reason| status(ttrpc::Code::UNKNOWN, reason))
        }
    });
    let (h, s) = (Arc::clone(&handler), Arc::clone(&state));
    let synchronize = service::unary(move |req: SynchronizeRequest| {
        let (h, s) = (Arc::clone(&h), Arc::clone(&s));
        async move {
            let whole = {
                let mut collected = s.sync.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let whole = match collected.take() {
                    Some(mut so_far) => {
                        so_far.pods.extend(req.pods);
                        so_far.containers.extend(req.containers);
                        so_far
                    }
                    None => SynchronizeRequest {
                        pods: req.pods,
                        containers: req.containers,
                        ..Default::default()
                    },
                };
                if req.more {
                    *collected = Some(whole);
                    None
                } else {
                    Some(whole)
                }
            };
            let Some(whole) = whole else {
                return Ok(SynchronizeResponse { more: true, ..SynchronizeResponse::default() });
            };
            let update = h.synchronize(&whole.pods, &whole.containers).await.map_err(failed)?;
            Ok(SynchronizeResponse { update, more: false, ..SynchronizeResponse::default() })
        }
    });
    let h = Arc::clone(&handler);
    let shutdown = service::unary(move |_: Empty| {
        let h = Arc::clone(&h);
        async move {
            tracing::info!("NRI runtime shutting down");
            h.shutdown().await;
            Ok(Empty::new())
        }
    });
    let h = Arc::clone(&handler);
    let create = service::unary(move |req: CreateContainerRequest| {
        let h = Arc::clone(&h);
        async move {
            let pod = req.pod.as_ref().ok_or_else(|| missing("CreateContainerRequest.pod"))?;
            let container =
                req.container.as_ref().ok_or_else(|| missing("CreateContainerRequest.container"))?;
            let adjust = h.create_container(pod, container).await.map_err(failed)?;
            Ok(CreateContainerResponse {
                adjust: MessageField::some(adjust),
                ..CreateContainerResponse::default()
            })
        }
    });
    let h = Arc::clone(&handler);
    let update = service::unary(move |req: UpdateContainerRequest| {
        let h = Arc::clone(&h);
        async move {
            let pod = req.pod.as_ref().ok_or_else(|| missing("UpdateContainerRequest.pod"))?;
            let container =
                req.container.as_ref().ok_or_else(|| missing("UpdateContainerRequest.container"))?;
            let update =
                h.update_container(pod, container, req.linux_resources.as_ref()).await.map_err(failed)?;
            Ok(UpdateContainerResponse { update, ..UpdateContainerResponse::default() })
        }
    });
    let h = Arc::clone(&handler);
    let stop = service::unary(move |req: StopContainerRequest| {
        let h = Arc::clone(&h);
        async move {
            let pod = req.pod.as_ref().ok_or_else(|| missing("StopContainerRequest.pod"))?;
            let container =
                req.container.as_ref().ok_or_else(|| missing("StopContainerRequest.container"))?;
            let update = h.stop_container(pod, container).await.map_err(failed)?;
            Ok(StopContainerResponse { update, ..StopContainerResponse::default() })
        }
    });
    let h = Arc::clone(&handler);
    let remove = service::unary(move |req: RemoveContainerRequest| {
        let h = Arc::clone(&h);
        async move {
            let pod = req.pod.as_ref().ok_or_else(|| missing("RemoveContainerRequest.pod"))?;
            let container =
                req.container.as_ref().ok_or_else(|| missing("RemoveContainerRequest.container"))?;
            h.remove_container(pod, container).await.map_err(failed)?;
            Ok(RemoveContainerResponse::new())
        }
    });
    let h = Arc::clone(&handler);
    let state_change = service::unary(move |event: StateChangeEvent| {
        let h = Arc::clone(&h);
        async move {
            // Older runtimes relay RemoveContainer as a state change; other events are not subscribed to.
            if event.event.enum_value() == Ok(Event::REMOVE_CONTAINER) {
                let pod = event.pod.as_ref().ok_or_else(|| missing("StateChangeEvent.pod"))?;
                let container =
                    event.container.as_ref().ok_or_else(|| missing("StateChangeEvent.container"))?;
                h.remove_container(pod, container).await.map_err(failed)?;
            }
            Ok(Empty::new())
        }
    });
    service::service_map(
        service::PLUGIN_SERVICE,
        vec![
            (service::CONFIGURE, configure),
            (service::SYNCHRONIZE, synchronize),
            (service::SHUTDOWN, shutdown),
            (service::CREATE_CONTAINER, create),
            (service::UPDATE_CONTAINER, update),
            (service::STOP_CONTAINER, stop),
            (service::REMOVE_CONTAINER, remove),
            (service::STATE_CHANGE, state_change),
        ],
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn index_is_two_digits() {
        assert_eq!("07".parse::<PluginIndex>().unwrap().as_str(), "07");
        assert_eq!(PluginIndex::default().as_str(), "00");
        assert_eq!(
            "7".parse::<PluginIndex>().unwrap_err().to_string(),
            "invalid plugin index \"7\": must be 2 digits"
        );
        assert_eq!(
            "7a".parse::<PluginIndex>().unwrap_err().to_string(),
            "invalid plugin index \"7a\": not [0-9][0-9]"
        );
        assert!("100".parse::<PluginIndex>().is_err());
        assert!("".parse::<PluginIndex>().is_err());
    }

    #[test]
    fn names_follow_upstream() {
        assert!(check_plugin_name(PLUGIN_NAME).is_ok());
        assert!(check_plugin_name("a+b_c-1").is_ok());
        assert!(check_plugin_name("").unwrap_err().to_string().contains("name is empty"));
        assert!(check_plugin_name("a/b").unwrap_err().to_string().contains("invalid character '/'"));
    }

    #[test]
    fn event_bits_are_event_minus_one() {
        let mask = EventMask::of(&[Event::CREATE_CONTAINER, Event::REMOVE_CONTAINER]);
        assert_eq!(mask.0, (1 << 3) | (1 << 10));
        assert!(mask.contains(Event::CREATE_CONTAINER) && mask.contains(Event::REMOVE_CONTAINER));
        assert!(!mask.contains(Event::STOP_CONTAINER) && !mask.contains(Event::UNKNOWN));
        assert_eq!(EventMask::VALID.0, 0x3fff);
    }

    #[test]
    fn default_config_dials_nri_sock() {
        let c = PluginConfig::new(Path::new("/var/run/nri"), PluginIndex::default());
        assert_eq!(c.socket, Path::new("/var/run/nri/nri.sock"));
        assert_eq!(c.name, "manager.nvidia.com");
        assert_eq!(c.unhealthy_after, Duration::from_secs(120));
    }
}

//! The runtime side of NRI, as containerd's adaptation layer plays it: listen on the socket, accept a
//! plugin, take its registration, then call its `Plugin` service. Tests use it to drive a plugin over a
//! real unix socket; it checks the registration as upstream does (name `[a-zA-Z0-9_.+-]`, two-digit index).
//!
//! | step | what |
//! |---|---|
//! | [`RuntimeSide::bind`] | listens on the socket path (a stale socket file is replaced) |
//! | [`RuntimeSide::accept`] | accepts one plugin, multiplexes its stream, serves `Runtime` on connection 2 and waits for `RegisterPlugin` |
//! | [`PluginConnection::configure`] | `Configure` → the plugin's event mask |
//! | [`PluginConnection::synchronize`] … [`PluginConnection::state_change`] | the `Plugin` calls, as the runtime makes them |
//! | [`PluginConnection::close`] | drops the trunk (the plugin sees the runtime go away) |

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use protobuf::MessageField;
use tokio::{net::UnixListener, sync::mpsc};
use ttrpc::r#async::{Client, Server, transport::Socket};

use crate::{
    api::{
        ConfigureRequest, ConfigureResponse, Container, ContainerUpdate, CreateContainerRequest,
        CreateContainerResponse, Empty, Event, PodSandbox, RegisterPluginRequest, RemoveContainerRequest,
        RemoveContainerResponse, StateChangeEvent, StopContainerRequest, StopContainerResponse,
        SynchronizeRequest, SynchronizeResponse, UpdateContainersRequest, UpdateContainersResponse,
    },
    mux::{Mux, MuxWatcher, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN},
    plugin::{EventMask, NriError, PluginIndex, check_plugin_name, serve_one},
    service::{self, status},
};

/// How long each call to the plugin may take (upstream's default request timeout).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// A listening runtime socket.
#[derive(Debug)]
pub struct RuntimeSide {
    listener: UnixListener,
    socket: PathBuf,
    /// How long a plugin may take to register after connecting.
    pub registration_timeout: Duration,
}

impl RuntimeSide {
    /// Listens on `socket` (its directory is created; a leftover socket file is removed first).
    pub fn bind(socket: &Path) -> Result<Self, NriError> {
        let fail = |source| NriError::Socket { action: "bind", path: socket.to_path_buf(), source };
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir).map_err(fail)?;
        }
        match std::fs::remove_file(socket) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(fail(e)),
        }
        let listener = UnixListener::bind(socket).map_err(fail)?;
        Ok(Self { listener, socket: socket.to_path_buf(), registration_timeout: Duration::from_secs(5) })
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Accepts the next plugin and waits for its registration.
    pub async fn accept(&self) -> Result<PluginConnection, NriError> {
        let (stream, _) = self.listener.accept().await.map_err(|source| NriError::Socket {
            action: "accept on",
            path: self.socket.clone(),
            source,
        })?;
        let mut mux = Mux::new(stream, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN])?;
        let served = mux.take(RUNTIME_SERVICE_CONN)?;
        let calls = mux.take(PLUGIN_SERVICE_CONN)?;
        let (registered_tx, mut registered) = mpsc::unbounded_channel();
        let (updates_tx, updates) = mpsc::unbounded_channel();
        let register = service::unary(move |req: RegisterPluginRequest| {
            let registered = registered_tx.clone();
            async move {
                let check = check_plugin_name(&req.plugin_name)
                    .and_then(|()| req.plugin_idx.parse::<PluginIndex>().map(|_| ()));
                let answer = check
                    .as_ref()
                    .map(|()| Empty::new())
                    .map_err(|e| status(ttrpc::Code::INVALID_ARGUMENT, e.to_string()));
                let _ = registered.send(check.map(|()| req).map_err(|e| e.to_string()));
                answer
            }
        });
        let update = service::unary(move |req: UpdateContainersRequest| {
            let updates = updates_tx.clone();
            async move {
                let _ = updates.send(req);
                Ok(UpdateContainersResponse::new())
            }
        });
        let server = serve_one(
            served,
            service::service_map(
                service::RUNTIME_SERVICE,
                vec![(service::REGISTER_PLUGIN, register), (service::UPDATE_CONTAINERS, update)],
            ),
        )
        .await
        .map_err(|source| NriError::Ttrpc { what: "starting the runtime service".to_owned(), source })?;
        let client = Client::new(Socket::new(calls));
        let mut connection = PluginConnection {
            registration: RegisterPluginRequest::new(),
            events: EventMask::default(),
            watcher: mux.watcher(),
            mux: Some(mux),
            server,
            client,
            updates: tokio::sync::Mutex::new(updates),
        };
        let registration = tokio::select! {
            r = tokio::time::timeout(self.registration_timeout, registered.recv()) => r,
            _ = connection.watcher.ended() => Ok(None),
        };
        match registration {
            Ok(Some(Ok(req))) => {
                connection.registration = req;
                Ok(connection)
            }
            Ok(Some(Err(reason))) => {
                connection.close().await;
                Err(NriError::Refused { what: "registration", reason })
            }
            Ok(None) => {
                connection.close().await;
                Err(NriError::Closed("registration"))
            }
            Err(_) => {
                connection.close().await;
                Err(NriError::Timeout { what: "RegisterPlugin", after: self.registration_timeout })
            }
        }
    }
}

/// One registered plugin, seen from the runtime.
pub struct PluginConnection {
    registration: RegisterPluginRequest,
    events: EventMask,
    mux: Option<Mux>,
    watcher: MuxWatcher,
    server: Server,
    client: Client,
    updates: tokio::sync::Mutex<mpsc::UnboundedReceiver<UpdateContainersRequest>>,
}

impl std::fmt::Debug for PluginConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginConnection")
            .field("registration", &self.registration)
            .field("events", &self.events)
            .field("mux", &self.mux)
            .finish_non_exhaustive()
    }
}

impl PluginConnection {
    /// What the plugin registered with.
    pub fn registration(&self) -> &RegisterPluginRequest {
        &self.registration
    }

    /// The events the plugin subscribed to at [`PluginConnection::configure`].
    pub fn events(&self) -> EventMask {
        self.events
    }

    async fn call<Req: protobuf::Message, Resp: protobuf::Message>(
        &self,
        method: &'static str,
        req: &Req,
    ) -> Result<Resp, NriError> {
        service::call(&self.client, service::PLUGIN_SERVICE, method, req, REQUEST_TIMEOUT)
            .await
            .map_err(|source| NriError::Ttrpc { what: method.to_owned(), source })
    }

    /// `Configure` as containerd sends it; keeps and returns the subscribed events (0 means all, as
    /// upstream reads it).
    pub async fn configure(&mut self, runtime: &str, version: &str) -> Result<EventMask, NriError> {
        let req = ConfigureRequest {
            runtime_name: runtime.to_owned(),
            runtime_version: version.to_owned(),
            registration_timeout: 5000,
            request_timeout: i64::try_from(REQUEST_TIMEOUT.as_millis()).unwrap_or(i64::MAX),
            NRI_version: crate::plugin::NRI_VERSION.to_owned(),
            ..ConfigureRequest::default()
        };
        let response: ConfigureResponse = self.call(service::CONFIGURE, &req).await?;
        self.events = match response.events {
            0 => EventMask::VALID,
            bits => EventMask(bits),
        };
        Ok(self.events)
    }

    /// `Synchronize` in parts of at most `per_message` pods and containers each (every part but the last
    /// with `more = true`); the updates of the last answer.
    pub async fn synchronize(
        &self,
        pods: Vec<PodSandbox>,
        containers: Vec<Container>,
        per_message: usize,
    ) -> Result<Vec<ContainerUpdate>, NriError> {
        let per = per_message.max(1);
        let (mut pods, mut containers) = (pods.into_iter().peekable(), containers.into_iter().peekable());
        loop {
            let part_pods: Vec<_> = pods.by_ref().take(per).collect();
            let part_containers: Vec<_> = containers.by_ref().take(per).collect();
            let more = pods.peek().is_some() || containers.peek().is_some();
            let req = SynchronizeRequest {
                pods: part_pods,
                containers: part_containers,
                more,
                ..Default::default()
            };
            let response: SynchronizeResponse = self.call(service::SYNCHRONIZE, &req).await?;
            if !more {
                return Ok(response.update);
            }
            if !response.more || !response.update.is_empty() {
                return Err(NriError::Refused {
                    what: "synchronization",
                    reason: "plugin does not handle split sync requests".to_owned(),
                });
            }
        }
    }

    /// `CreateContainer` (skipped, as upstream, when the plugin did not subscribe: `None`).
    pub async fn create_container(
        &self,
        pod: &PodSandbox,
        container: &Container,
    ) -> Result<Option<CreateContainerResponse>, NriError> {
        if !self.events.contains(Event::CREATE_CONTAINER) {
            return Ok(None);
        }
        let req = CreateContainerRequest {
            pod: MessageField::some(pod.clone()),
            container: MessageField::some(container.clone()),
            ..Default::default()
        };
        self.call(service::CREATE_CONTAINER, &req).await.map(Some)
    }

    /// `StopContainer` (skipped when not subscribed).
    pub async fn stop_container(
        &self,
        pod: &PodSandbox,
        container: &Container,
    ) -> Result<Vec<ContainerUpdate>, NriError> {
        if !self.events.contains(Event::STOP_CONTAINER) {
            return Ok(Vec::new());
        }
        let req = StopContainerRequest {
            pod: MessageField::some(pod.clone()),
            container: MessageField::some(container.clone()),
            ..Default::default()
        };
        let response: StopContainerResponse = self.call(service::STOP_CONTAINER, &req).await?;
        Ok(response.update)
    }

    /// `RemoveContainer` (skipped when not subscribed: `false`).
    pub async fn remove_container(&self, pod: &PodSandbox, container: &Container) -> Result<bool, NriError> {
        if !self.events.contains(Event::REMOVE_CONTAINER) {
            return Ok(false);
        }
        let req = RemoveContainerRequest {
            pod: MessageField::some(pod.clone()),
            container: MessageField::some(container.clone()),
            ..Default::default()
        };
        let _: RemoveContainerResponse = self.call(service::REMOVE_CONTAINER, &req).await?;
        Ok(true)
    }

    /// `StateChange` (as older runtimes relay RemoveContainer).
    pub async fn state_change(
        &self,
        event: Event,
        pod: &PodSandbox,
        container: Option<&Container>,
    ) -> Result<(), NriError> {
        let req = StateChangeEvent {
            event: event.into(),
            pod: MessageField::some(pod.clone()),
            container: container.cloned().into(),
            ..Default::default()
        };
        let _: Empty = self.call(service::STATE_CHANGE, &req).await?;
        Ok(())
    }

    /// `Shutdown`: the runtime is going away.
    pub async fn shutdown(&self) -> Result<(), NriError> {
        let _: Empty = self.call(service::SHUTDOWN, &Empty::new()).await?;
        Ok(())
    }

    /// The next `UpdateContainers` request the plugin sent, if one came within `wait`.
    pub async fn next_update(&self, wait: Duration) -> Option<UpdateContainersRequest> {
        let mut updates = self.updates.lock().await;
        tokio::time::timeout(wait, updates.recv()).await.ok().flatten()
    }

    /// Drops the trunk: the plugin sees the runtime go away.
    pub async fn close(mut self) {
        drop(self.mux.take());
        let _ = self.server.shutdown().await;
    }
}

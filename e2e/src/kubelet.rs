//! A test kubelet for the device-plugin scenarios (there is no kubelet in the environment): it serves
//! `Registration` on `kubelet.sock` in a device-plugin folder, hands out the plugins' `Register` requests,
//! and connects to a plugin's endpoint as the kubelet does, to call `ListAndWatch` and `Allocate`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use vgpu_kubelet::api::v1beta1::{
    Empty, RegisterRequest,
    device_plugin_client::DevicePluginClient,
    registration_server::{Registration, RegistrationServer},
};
use vgpu_kubelet::socket::connect_unix;

/// The kubelet's registration socket name in the device-plugin folder.
pub const KUBELET_SOCKET: &str = "kubelet.sock";

/// Forwards every `Register` request to the test.
struct Registrar(mpsc::UnboundedSender<RegisterRequest>);

#[tonic::async_trait]
impl Registration for Registrar {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        // The receiver is gone only when the test dropped its kubelet: nothing left to tell.
        let _ = self.0.send(request.into_inner());
        Ok(Response::new(Empty {}))
    }
}

/// The `Registration` service on `<dir>/kubelet.sock`; stopped when dropped.
#[derive(Debug)]
pub struct TestKubelet {
    dir: PathBuf,
    registrations: mpsc::UnboundedReceiver<RegisterRequest>,
    server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl TestKubelet {
    /// Creates `dir` (the device-plugin folder a plugin is pointed at with `--device-plugin-path`) and
    /// serves `Registration` on its `kubelet.sock`. Needs a Tokio runtime.
    pub fn start(dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let socket = dir.join(KUBELET_SOCKET);
        let listener = tokio::net::UnixListener::bind(&socket)
            .with_context(|| format!("binding {}", socket.display()))?;
        let (tx, registrations) = mpsc::unbounded_channel();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(Registrar(tx)))
                .serve_with_incoming(UnixListenerStream::new(listener)),
        );
        Ok(Self { dir, registrations, server })
    }

    /// The device-plugin folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The next `Register` request for `resource` (requests for other resources are skipped); fails after
    /// `timeout`.
    pub async fn registration(&mut self, resource: &str, timeout: Duration) -> Result<RegisterRequest> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.registrations.recv()).await {
                Err(_) => bail!("no Register for {resource} within {timeout:?}"),
                Ok(None) => bail!("the test kubelet's Registration service stopped"),
                Ok(Some(r)) if r.resource_name == resource => return Ok(r),
                Ok(Some(_)) => {}
            }
        }
    }

    /// A `DevicePlugin` client on a registered endpoint (a socket name in the device-plugin folder).
    pub async fn connect(&self, endpoint: &str) -> Result<DevicePluginClient<Channel>> {
        let socket = self.dir.join(endpoint);
        let channel = connect_unix(&socket, Duration::from_secs(5))
            .await
            .with_context(|| format!("connecting to {}", socket.display()))?;
        Ok(DevicePluginClient::new(channel))
    }
}

impl Drop for TestKubelet {
    fn drop(&mut self) {
        self.server.abort();
    }
}

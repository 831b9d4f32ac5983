//! Serving a [`PluginHandler`] on a unix socket.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use tokio::{net::UnixListener, sync::watch, task::JoinHandle};
use tokio_util::sync::{CancellationToken, DropGuard};
use vgpu_core::model::GpuDevice;
use vgpu_kubelet::SocketError;

use crate::{error::ServerError, plugin::PluginHandler, service::DevicePluginService};
use vgpu_kubelet::api::v1beta1::device_plugin_server::DevicePluginServer;

/// A plugin being served: stop it with [`RunningServer::stop`]; [`RunningServer::handle`] ends when the
/// serve loop ends (`Ok` after a stop, `Err` when it crashed).
#[derive(Debug)]
pub struct RunningServer {
    /// The socket path.
    pub socket: PathBuf,
    /// Cancels the server's token on [`RunningServer::stop`], and when the server is dropped.
    stop: DropGuard,
    /// The serve task.
    pub handle: JoinHandle<Result<(), ServerError>>,
}

impl RunningServer {
    /// Asks the server to stop (open `ListAndWatch` streams end, then the server drains) and waits for it.
    /// The socket file is removed.
    pub async fn stop(self) -> Result<(), ServerError> {
        self.stop.disarm().cancel();
        let result = match self.handle.await {
            Ok(result) => result,
            Err(join) => Err(SocketError::Io {
                path: self.socket.clone(),
                action: "join serve task",
                source: std::io::Error::other(join.to_string()),
            }
            .into()),
        };
        remove_socket(&self.socket);
        result
    }
}

fn remove_socket(path: &Path) {
    if let Err(err) = std::fs::remove_file(path)
        && err.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(socket = %path.display(), %err, "could not remove socket");
    }
}

/// Binds `socket` (removing a stale file first) and serves `handler` on it in a task, each connection
/// through [`vgpu_kubelet::authority::AuthorityRewrite`].
pub fn serve(
    handler: Arc<dyn PluginHandler>,
    socket: PathBuf,
    gpus: watch::Receiver<Vec<GpuDevice>>,
) -> Result<RunningServer, ServerError> {
    remove_socket(&socket);
    let listener = UnixListener::bind(&socket).map_err(|source| SocketError::Io {
        path: socket.clone(),
        action: "bind unix socket",
        source,
    })?;
    let stop = CancellationToken::new();
    let service = DevicePluginService::new(handler, gpus, stop.clone());
    let path = socket.clone();
    let shutdown = stop.clone().cancelled_owned();
    let handle = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(service))
            .serve_with_incoming_shutdown(vgpu_kubelet::authority::incoming(listener), shutdown)
            .await
            .map_err(|source| SocketError::Transport { path, source }.into())
    });
    Ok(RunningServer { socket, stop: stop.drop_guard(), handle })
}

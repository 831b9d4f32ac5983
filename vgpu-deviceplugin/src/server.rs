//! Serving a [`PluginHandler`] on a unix socket.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use tokio::{net::UnixListener, sync::watch, task::JoinHandle};
use vgpu_core::model::GpuDevice;

use crate::{
    api::v1beta1::device_plugin_server::DevicePluginServer, error::ServerError, plugin::PluginHandler,
    service::DevicePluginService,
};

/// A plugin being served: stop it with [`RunningServer::stop`]; [`RunningServer::handle`] ends when the
/// serve loop ends (`Ok` after a stop, `Err` when it crashed).
#[derive(Debug)]
pub struct RunningServer {
    /// The socket path.
    pub socket: PathBuf,
    stop: watch::Sender<bool>,
    /// The serve task.
    pub handle: JoinHandle<Result<(), ServerError>>,
}

impl RunningServer {
    /// Asks the server to stop (open `ListAndWatch` streams end, then the server drains) and waits for it.
    /// The socket file is removed.
    pub async fn stop(self) -> Result<(), ServerError> {
        let _ = self.stop.send(true);
        let result = match self.handle.await {
            Ok(result) => result,
            Err(join) => Err(ServerError::Io {
                path: self.socket.clone(),
                action: "join serve task",
                source: std::io::Error::other(join.to_string()),
            }),
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
/// through [`crate::authority::AuthorityRewrite`].
pub fn serve(
    handler: Arc<dyn PluginHandler>,
    socket: PathBuf,
    gpus: watch::Receiver<Vec<GpuDevice>>,
) -> Result<RunningServer, ServerError> {
    remove_socket(&socket);
    let listener = UnixListener::bind(&socket).map_err(|source| ServerError::Io {
        path: socket.clone(),
        action: "bind unix socket",
        source,
    })?;
    let (stop, stop_rx) = watch::channel(false);
    let service = DevicePluginService::new(handler, gpus, stop_rx.clone());
    let path = socket.clone();
    let handle = tokio::spawn(async move {
        let mut stop_rx = stop_rx;
        let shutdown = async move {
            let _ = stop_rx.wait_for(|stopped| *stopped).await;
        };
        tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(service))
            .serve_with_incoming_shutdown(crate::authority::incoming(listener), shutdown)
            .await
            .map_err(|source| ServerError::Transport { path, source })
    });
    Ok(RunningServer { socket, stop, handle })
}

fn io<'a>(path: &'a Path, action: &'static str) -> impl FnOnce(std::io::Error) -> ServerError + 'a {
    move |source| ServerError::Io { path: path.to_path_buf(), action, source }
}

/// Binds and listens on a temporary name next to `socket` (`.<name>.<pid>.tmp`), sets its group (when given)
/// and `mode`, then renames it into place, so the path only ever names a socket that already accepts
/// connections (a client never sees "connection refused" between bind and listen) and a stale socket is
/// replaced in one step. Used by the client-mode registry and the DRA kubelet plugin.
pub fn bind_atomic(socket: &Path, group: Option<u32>, mode: u32) -> Result<UnixListener, ServerError> {
    use std::os::unix::fs::PermissionsExt;
    let name = socket.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = socket.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(&tmp, "remove stale temporary socket")(e)),
    }
    let listener = UnixListener::bind(&tmp).map_err(io(&tmp, "bind unix socket"))?;
    let published = group
        .map_or(Ok(()), |gid| {
            std::os::unix::fs::chown(&tmp, None, Some(gid)).map_err(io(&tmp, "chown the socket to its group"))
        })
        .and_then(|()| {
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
                .map_err(io(&tmp, "chmod the socket"))
        })
        .and_then(|()| std::fs::rename(&tmp, socket).map_err(io(socket, "publish unix socket")));
    if let Err(e) = published {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(listener)
}

/// The `(device, inode)` of the file at `path` (not following a symlink), `None` when there is none: a
/// guard compares it with the value recorded after [`bind_atomic`] to see that its socket was removed or
/// replaced.
pub fn socket_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

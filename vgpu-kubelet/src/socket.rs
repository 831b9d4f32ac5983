//! Unix sockets of gRPC servers and clients: [`bind_atomic`] (a socket path only ever names a socket that
//! accepts), [`socket_identity`] (was it removed or replaced?), [`connect_unix`] (a tonic channel to a
//! socket path). Servers take each accepted connection through [`crate::authority::incoming`].

use std::{path::Path, time::Duration};

use hyper_util::rt::TokioIo;
use tokio::net::UnixListener;
use tonic::transport::{Channel, Endpoint};

use crate::error::SocketError;

fn io<'a>(path: &'a Path, action: &'static str) -> impl FnOnce(std::io::Error) -> SocketError + 'a {
    move |source| SocketError::Io { path: path.to_path_buf(), action, source }
}

/// Binds and listens on a temporary name next to `socket` (`.<name>.<pid>.tmp`), sets its group (when given)
/// and `mode`, then renames it into place, so the path only ever names a socket that already accepts
/// connections (a client never sees "connection refused" between bind and listen) and a stale socket is
/// replaced in one step. Used by the client-mode registry and the DRA kubelet plugin.
pub fn bind_atomic(socket: &Path, group: Option<u32>, mode: u32) -> Result<UnixListener, SocketError> {
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

/// Connects a gRPC channel to a unix socket (the URI is a placeholder; the connector dials `path`).
pub async fn connect_unix(path: &Path, timeout: Duration) -> Result<Channel, SocketError> {
    let socket = path.to_path_buf();
    let endpoint = Endpoint::from_static("http://[::]:50051").connect_timeout(timeout);
    let connect = endpoint.connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
        let socket = socket.clone();
        async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(socket).await?)) }
    }));
    match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(source)) => Err(SocketError::Transport { path: path.to_path_buf(), source }),
        Err(_) => Err(SocketError::Timeout { what: format!("connecting to {}", path.display()), timeout }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bind_atomic_publishes_a_listening_socket_with_its_mode_and_replaces_a_stale_file() {
        use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plugin.sock");
        std::fs::write(&path, b"stale").unwrap();
        let before = socket_identity(&path);
        let _listener = bind_atomic(&path, None, 0o600).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_ne!(socket_identity(&path), before);
        assert_eq!(
            std::fs::read_dir(dir.path()).map(Iterator::count).unwrap_or_default(),
            1,
            "no temporary left"
        );
        assert!(std::os::unix::net::UnixStream::connect(&path).is_ok());
    }

    #[tokio::test]
    async fn bind_atomic_in_a_missing_directory_names_the_temporary_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing/plugin.sock");
        let err = bind_atomic(&path, None, 0o600).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains(".plugin.sock.") && err.contains("bind unix socket"), "{err}");
    }

    #[tokio::test]
    async fn connect_unix_to_no_socket_is_a_transport_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = connect_unix(&dir.path().join("none.sock"), Duration::from_secs(5)).await.err();
        assert!(matches!(err, Some(SocketError::Transport { .. })), "{err:?}");
    }
}

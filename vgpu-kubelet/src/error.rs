//! Errors of binding, dialing and calling on the kubelet's unix sockets.

use std::path::PathBuf;

/// A unix-socket operation failed: binding or publishing a socket, dialing one, or a call's deadline.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SocketError {
    /// A filesystem operation on a socket or directory failed.
    #[error("{}: {action}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The gRPC transport failed (serve or connect).
    #[error("gRPC transport on {}: {source}", path.display())]
    Transport {
        /// The socket.
        path: PathBuf,
        /// The transport error.
        #[source]
        source: tonic::transport::Error,
    },
    /// An operation did not finish in time.
    #[error("{what} timed out after {timeout:?}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// The limit.
        timeout: std::time::Duration,
    },
}

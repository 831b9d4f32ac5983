//! Errors of the device plugin.

use std::path::PathBuf;

/// A failure of one RPC; converted to a gRPC status by the service layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PluginError {
    /// The request is malformed (bad device ID, wrong count, ...).
    #[error("{0}")]
    InvalidArgument(String),
    /// `Allocate` could not admit the container; the message is prefixed `Allocate check failed: `.
    #[error("Allocate check failed: {0}")]
    Allocate(String),
    /// `PreStartContainer` failed; prefixed `PreStartContainer check failed: `.
    #[error("PreStartContainer check failed: {0}")]
    PreStart(String),
    /// The RPC is not served by this plugin.
    #[error("{0} is not supported by this plugin")]
    Unsupported(&'static str),
}

impl From<PluginError> for tonic::Status {
    fn from(err: PluginError) -> Self {
        match &err {
            PluginError::InvalidArgument(_) => tonic::Status::invalid_argument(err.to_string()),
            PluginError::Unsupported(_) => tonic::Status::unimplemented(err.to_string()),
            // Go returns plain errors, which gRPC reports as Unknown.
            PluginError::Allocate(_) | PluginError::PreStart(_) => tonic::Status::unknown(err.to_string()),
        }
    }
}

/// Serving, registering or running the plugins failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// Binding, serving or dialing a unix socket failed, or a call on one timed out.
    #[error(transparent)]
    Socket(#[from] vgpu_kubelet::SocketError),
    /// The client-mode registry could not be served.
    #[error(transparent)]
    Registry(#[from] vgpu_node::registry::RegistryError),
    /// The kubelet refused the registration.
    #[error("registering {resource} with the kubelet at {}: {status}", kubelet.display())]
    Register {
        /// The kubelet socket.
        kubelet: PathBuf,
        /// The resource name.
        resource: String,
        /// The kubelet's answer.
        status: tonic::Status,
    },
    /// A plugin's serve loop crashed too often.
    #[error("plugin {plugin} crashed {crashes} times, each within {window:?} of the previous: giving up")]
    CrashBudget {
        /// The plugin.
        plugin: String,
        /// Crashes counted.
        crashes: usize,
        /// The window.
        window: std::time::Duration,
    },
    /// The device backend failed.
    #[error("device backend: {0}")]
    Backend(#[from] vgpu_core::backend::BackendError),
    /// The configuration is invalid.
    #[error("invalid device plugin configuration: {0}")]
    Config(String),
}

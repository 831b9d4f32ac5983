//! Talking to the kubelet over unix sockets: dialing, readiness of our own socket, `Register`.

use std::{path::Path, time::Duration};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

use crate::{
    api::v1beta1::{
        DevicePluginOptions, Empty, RegisterRequest, VERSION, device_plugin_client::DevicePluginClient,
        registration_client::RegistrationClient,
    },
    error::ServerError,
};

/// Connects a gRPC channel to a unix socket (the URI is a placeholder; the connector dials `path`).
pub async fn connect_unix(path: &Path, timeout: Duration) -> Result<Channel, ServerError> {
    let socket = path.to_path_buf();
    let endpoint = Endpoint::from_static("http://[::]:50051").connect_timeout(timeout);
    let connect = endpoint.connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
        let socket = socket.clone();
        async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(socket).await?)) }
    }));
    match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(source)) => Err(ServerError::Transport { path: path.to_path_buf(), source }),
        Err(_) => Err(ServerError::Timeout { what: format!("connecting to {}", path.display()), timeout }),
    }
}

/// Dials our own socket and calls `GetDevicePluginOptions`, proving the server answers.
pub async fn wait_ready(socket: &Path, timeout: Duration) -> Result<(), ServerError> {
    let channel = connect_unix(socket, timeout).await?;
    let mut client = DevicePluginClient::new(channel);
    match tokio::time::timeout(timeout, client.get_device_plugin_options(Empty {})).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(status)) => Err(ServerError::Io {
            path: socket.to_path_buf(),
            action: "probe own socket",
            source: std::io::Error::other(status.to_string()),
        }),
        Err(_) => Err(ServerError::Timeout { what: format!("probing {}", socket.display()), timeout }),
    }
}

/// The `RegisterRequest` of a plugin: version `v1beta1`, the socket's base name, the resource, options.
pub fn register_request(
    endpoint: &str,
    resource_name: &str,
    options: DevicePluginOptions,
) -> RegisterRequest {
    RegisterRequest {
        version: VERSION.to_owned(),
        endpoint: endpoint.to_owned(),
        resource_name: resource_name.to_owned(),
        options: Some(options),
    }
}

/// Calls `Registration.Register` on the kubelet socket.
pub async fn register(
    kubelet: &Path,
    request: RegisterRequest,
    timeout: Duration,
) -> Result<(), ServerError> {
    let channel = connect_unix(kubelet, timeout).await?;
    let resource = request.resource_name.clone();
    let mut client = RegistrationClient::new(channel);
    match tokio::time::timeout(timeout, client.register(request)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(status)) => Err(ServerError::Register { kubelet: kubelet.to_path_buf(), resource, status }),
        Err(_) => Err(ServerError::Timeout {
            what: format!("Register {resource} at {}", kubelet.display()),
            timeout,
        }),
    }
}

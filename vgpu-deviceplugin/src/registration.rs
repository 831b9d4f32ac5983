//! Talking to the kubelet over unix sockets (dialed with [`vgpu_kubelet::socket::connect_unix`]): readiness of
//! our own socket, `Register`.

use std::{path::Path, time::Duration};

use crate::error::ServerError;
use vgpu_kubelet::api::v1beta1::{
    DevicePluginOptions, Empty, RegisterRequest, VERSION, device_plugin_client::DevicePluginClient,
    registration_client::RegistrationClient,
};
use vgpu_kubelet::{SocketError, socket::connect_unix};

/// Dials our own socket and calls `GetDevicePluginOptions`, proving the server answers.
pub async fn wait_ready(socket: &Path, timeout: Duration) -> Result<(), ServerError> {
    let channel = connect_unix(socket, timeout).await?;
    let mut client = DevicePluginClient::new(channel);
    match tokio::time::timeout(timeout, client.get_device_plugin_options(Empty {})).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(status)) => Err(SocketError::Io {
            path: socket.to_path_buf(),
            action: "probe own socket",
            source: std::io::Error::other(status.to_string()),
        }
        .into()),
        Err(_) => Err(SocketError::Timeout { what: format!("probing {}", socket.display()), timeout }.into()),
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
        Err(_) => Err(SocketError::Timeout {
            what: format!("Register {resource} at {}", kubelet.display()),
            timeout,
        }
        .into()),
    }
}

//! The client side of the client-mode registry (contract §1.6, §5.8): what `vgpu-device-client` runs
//! inside a vGPU container to have the plugin record its container's PIDs.
//!
//! One call, `registry.VDeviceRegistry/RegisterContainerDevice`, over the unix socket the plugin mounts at
//! `/etc/vgpu-manager/registry/socket.sock` ([`CONTAINER_SOCKET`]). The request names either the pod UID
//! and container name (device-plugin path) or a register UUID (DRA claims). The whole call — dial and
//! RPC — is bounded by one timeout (upstream 12 s), and the server's refusal comes back with its gRPC code
//! and message, so the library that runs the client can log exactly why.

use std::{path::Path, time::Duration};

use vgpu_kubelet::socket::connect_unix;
use vgpu_node::api::registry::{ContainerDeviceRequest, v_device_registry_client::VDeviceRegistryClient};

/// Where the registry socket is mounted in vGPU containers (the device plugin's `Allocate` mounts the
/// host's `registry/` directory at `/etc/vgpu-manager/registry`).
pub const CONTAINER_SOCKET: &str = "/etc/vgpu-manager/registry/socket.sock";
/// Upstream's default limit of the whole call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(12);

/// Whose devices to register.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegisterTarget {
    /// A container of a pod (device-plugin path).
    Container {
        /// The pod's UID.
        pod_uid: String,
        /// The container's name.
        container_name: String,
    },
    /// A DRA claim partition, by the register UUID the kubelet plugin put into `MANAGER_CLIENT_REGISTER_UUID`.
    RegisterUuid(String),
}

impl RegisterTarget {
    /// The request from flag values: a non-blank register UUID wins; otherwise both the pod UID and the
    /// container name must be non-blank.
    pub fn from_parts(
        pod_uid: Option<&str>,
        container_name: Option<&str>,
        register_uuid: Option<&str>,
    ) -> Result<Self, DeviceClientError> {
        let given = |v: Option<&str>| v.map(str::trim).filter(|v| !v.is_empty()).map(str::to_owned);
        if let Some(uuid) = given(register_uuid) {
            return Ok(Self::RegisterUuid(uuid));
        }
        match (given(pod_uid), given(container_name)) {
            (Some(pod_uid), Some(container_name)) => Ok(Self::Container { pod_uid, container_name }),
            (None, _) => Err(DeviceClientError::MissingTarget("--pod-uid")),
            (_, None) => Err(DeviceClientError::MissingTarget("--container-name")),
        }
    }

    /// The wire request.
    pub fn request(&self) -> ContainerDeviceRequest {
        match self {
            Self::Container { pod_uid, container_name } => ContainerDeviceRequest {
                pod_uid: pod_uid.clone(),
                container_name: container_name.clone(),
                register_uuid: String::new(),
            },
            Self::RegisterUuid(uuid) => ContainerDeviceRequest {
                pod_uid: String::new(),
                container_name: String::new(),
                register_uuid: uuid.clone(),
            },
        }
    }
}

/// Why a registration did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceClientError {
    /// Neither a register UUID nor this part of the pod/container pair was given.
    #[error("{0} is required unless --register-uuid is given")]
    MissingTarget(&'static str),
    /// The socket path does not exist (the registry is not mounted or not served).
    #[error(
        "registry socket {path} does not exist (is the device plugin running with DevicePluginClientMode=true?)"
    )]
    NoSocket {
        /// The path given.
        path: String,
    },
    /// Dialing the socket failed or timed out.
    #[error("connecting to the registry: {0}")]
    Connect(#[source] vgpu_kubelet::SocketError),
    /// The registry answered with an error.
    #[error("the registry refused the registration ({code:?}): {message}")]
    Refused {
        /// The gRPC code.
        code: tonic::Code,
        /// The server's message.
        message: String,
    },
    /// The call did not finish within the limit.
    #[error("the registration did not finish within {0:?}")]
    Timeout(Duration),
}

/// Registers `target` with the registry on `socket`; the dial and the call together take at most
/// `timeout`.
pub async fn register(
    socket: &Path,
    target: &RegisterTarget,
    timeout: Duration,
) -> Result<(), DeviceClientError> {
    if !socket.exists() {
        return Err(DeviceClientError::NoSocket { path: socket.display().to_string() });
    }
    let call = async {
        let channel = connect_unix(socket, timeout).await.map_err(DeviceClientError::Connect)?;
        VDeviceRegistryClient::new(channel)
            .register_container_device(target.request())
            .await
            .map(|_| ())
            .map_err(|s| DeviceClientError::Refused { code: s.code(), message: s.message().to_owned() })
    };
    tokio::time::timeout(timeout, call).await.map_err(|_| DeviceClientError::Timeout(timeout))?
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn target_from_flag_values() {
        assert_eq!(
            RegisterTarget::from_parts(Some("u1"), Some("main"), None).unwrap(),
            RegisterTarget::Container { pod_uid: "u1".into(), container_name: "main".into() }
        );
        // The register UUID wins; blank values count as absent (the plugin sets the env var to "").
        assert_eq!(
            RegisterTarget::from_parts(Some("u1"), None, Some("r-1")).unwrap(),
            RegisterTarget::RegisterUuid("r-1".into())
        );
        assert_eq!(
            RegisterTarget::from_parts(Some("u1"), Some("main"), Some("  ")).unwrap().request().register_uuid,
            ""
        );
        let err = RegisterTarget::from_parts(None, Some("main"), Some("")).unwrap_err();
        assert_eq!(err.to_string(), "--pod-uid is required unless --register-uuid is given");
        let err = RegisterTarget::from_parts(Some("u1"), Some(" "), None).unwrap_err();
        assert_eq!(err.to_string(), "--container-name is required unless --register-uuid is given");
        assert_eq!(RegisterTarget::RegisterUuid("r".into()).request().pod_uid, "");
    }

    #[tokio::test]
    async fn a_missing_socket_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("socket.sock");
        let target = RegisterTarget::RegisterUuid("r".into());
        let err = register(&path, &target, Duration::from_secs(1)).await.unwrap_err();
        assert!(matches!(err, DeviceClientError::NoSocket { .. }));
        assert!(err.to_string().contains(&path.display().to_string()));
    }
}

//! The liveness service on `--healthcheck-port` (`-1` off, `0` any free port): the standard
//! `grpc.health.v1.Health/Check` on TCP, which a kubelet `grpc` probe calls.
//!
//! | check | how | result |
//! |---|---|---|
//! | registration socket | dial it, `GetInfo` | |
//! | DRA socket | dial it, `NodePrepareResources` with no claims | |
//! | both answer within [`CHECK_TIMEOUT`] | | `SERVING` |
//! | either fails | | `NOT_SERVING` (the reason is logged) |
//!
//! The service name of the request is not looked at (the plugin is one service).

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};
use vgpu_kubelet::socket::connect_unix;

use crate::{
    api::grpc_health::HealthCheckRequest, api::grpc_health::HealthCheckResponse,
    api::grpc_health::health_check_response::ServingStatus, api::grpc_health::health_server::Health,
    api::grpc_health::health_server::HealthServer,
};
use vgpu_kubelet::api::{dra_v1, pluginregistration as pr};

/// How long each socket gets to answer.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// The health check over the plugin's two sockets.
#[derive(Debug, Clone)]
pub struct HealthCheck {
    registration_socket: PathBuf,
    dra_socket: PathBuf,
    timeout: Duration,
    nri: Option<crate::nri::NriHealth>,
}

impl HealthCheck {
    /// Checks `registration_socket` and `dra_socket`.
    pub fn new(registration_socket: PathBuf, dra_socket: PathBuf) -> Self {
        Self { registration_socket, dra_socket, timeout: CHECK_TIMEOUT, nri: None }
    }

    /// Also fails while the NRI plugin (gate `NRISupport`) has been without a runtime for 2 minutes.
    #[must_use]
    pub fn with_nri(mut self, health: crate::nri::NriHealth) -> Self {
        self.nri = Some(health);
        self
    }

    /// Why the plugin is not serving, or `Ok`.
    pub async fn probe(&self) -> Result<(), String> {
        if let Some(problem) = self.nri.as_ref().and_then(crate::nri::NriHealth::problem) {
            return Err(problem);
        }
        let within = |what: &str, path: &Path| {
            format!("{what} on {}: timed out after {:?}", path.display(), self.timeout)
        };
        let reg = async {
            let channel =
                connect_unix(&self.registration_socket, self.timeout).await.map_err(|e| e.to_string())?;
            pr::registration_client::RegistrationClient::new(channel)
                .get_info(pr::InfoRequest {})
                .await
                .map(drop)
                .map_err(|s| format!("GetInfo on {}: {s}", self.registration_socket.display()))
        };
        tokio::time::timeout(self.timeout, reg)
            .await
            .map_err(|_| within("GetInfo", &self.registration_socket))??;
        let dra = async {
            let channel = connect_unix(&self.dra_socket, self.timeout).await.map_err(|e| e.to_string())?;
            dra_v1::dra_plugin_client::DraPluginClient::new(channel)
                .node_prepare_resources(dra_v1::NodePrepareResourcesRequest { claims: Vec::new() })
                .await
                .map(drop)
                .map_err(|s| format!("NodePrepareResources on {}: {s}", self.dra_socket.display()))
        };
        tokio::time::timeout(self.timeout, dra)
            .await
            .map_err(|_| within("NodePrepareResources", &self.dra_socket))?
    }
}

#[tonic::async_trait]
impl Health for HealthCheck {
    async fn check(
        &self,
        _request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let status = match self.probe().await {
            Ok(()) => ServingStatus::Serving,
            Err(reason) => {
                tracing::warn!(%reason, "health check failed");
                ServingStatus::NotServing
            }
        };
        Ok(Response::new(HealthCheckResponse { status: status.into() }))
    }
}

/// Binding the health port failed.
#[derive(Debug, thiserror::Error)]
#[error("--healthcheck-port: bind {addr}: {source}")]
pub struct HealthcheckError {
    /// The address.
    pub addr: SocketAddr,
    /// The I/O error.
    #[source]
    pub source: std::io::Error,
}

/// Serves `check` on `addr` until `shutdown`; returns the bound address (port 0 picks one) and the task.
pub async fn serve(
    check: HealthCheck,
    addr: SocketAddr,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, JoinHandle<()>), HealthcheckError> {
    let listener =
        tokio::net::TcpListener::bind(addr).await.map_err(|source| HealthcheckError { addr, source })?;
    let bound = listener.local_addr().map_err(|source| HealthcheckError { addr, source })?;
    let task = tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(HealthServer::new(check))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
            .await;
        if let Err(error) = served {
            tracing::error!(%error, "the health-check server failed");
        }
    });
    Ok((bound, task))
}

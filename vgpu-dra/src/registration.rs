//! `pluginregistration.Registration`, served by the plugin on `<registry-dir>/<driver>-reg.sock`: the
//! kubelet's plugin watcher sees the socket appear, calls `GetInfo`, dials the endpoint it names, then
//! reports the outcome with `NotifyRegistrationStatus`.
//!
//! | field | value |
//! |---|---|
//! | `type` | `DRAPlugin` |
//! | `name` | the driver name (`manager.nvidia.com`) |
//! | `endpoint` | the absolute path of `dra.sock` |
//! | `supported_versions` | `v1.DRAPlugin`, `v1beta1.DRAPlugin`, `v1.DRAResourceHealth` ([`SUPPORTED_SERVICES`]) |
//!
//! The last status the kubelet reported is kept in a watch channel ([`RegistrationService::status`]).

use tokio::sync::watch;
use tonic::{Request, Response, Status};

use vgpu_kubelet::api::{dra_v1, dra_v1beta1, health_v1, pluginregistration as pr};

/// The services listed in `supported_versions`, most preferred first.
pub const SUPPORTED_SERVICES: [&str; 3] = [dra_v1::SERVICE, dra_v1beta1::SERVICE, health_v1::SERVICE];

/// What the kubelet last said about the registration.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RegistrationState {
    /// `NotifyRegistrationStatus` calls so far.
    pub notifications: u64,
    /// The last `plugin_registered`.
    pub registered: bool,
    /// The last `error`.
    pub error: String,
}

/// The registration service.
#[derive(Debug, Clone)]
pub struct RegistrationService {
    info: pr::PluginInfo,
    status: watch::Sender<RegistrationState>,
}

impl RegistrationService {
    /// Announces driver `driver_name` served on `endpoint` (an absolute socket path).
    pub fn new(driver_name: &str, endpoint: &std::path::Path) -> Self {
        let (status, _) = watch::channel(RegistrationState::default());
        Self {
            info: pr::PluginInfo {
                r#type: pr::DRA_PLUGIN.to_owned(),
                name: driver_name.to_owned(),
                endpoint: endpoint.display().to_string(),
                supported_versions: SUPPORTED_SERVICES.iter().map(|s| (*s).to_owned()).collect(),
            },
            status,
        }
    }

    /// The kubelet's reports, as they come.
    pub fn status(&self) -> watch::Receiver<RegistrationState> {
        self.status.subscribe()
    }
}

#[tonic::async_trait]
impl pr::registration_server::Registration for RegistrationService {
    async fn get_info(&self, _request: Request<pr::InfoRequest>) -> Result<Response<pr::PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<pr::RegistrationStatus>,
    ) -> Result<Response<pr::RegistrationStatusResponse>, Status> {
        let report = request.into_inner();
        if report.plugin_registered {
            tracing::info!(driver = %self.info.name, "registered with the kubelet");
        } else {
            tracing::error!(driver = %self.info.name, error = %report.error, "the kubelet refused the registration");
        }
        self.status.send_modify(|s| {
            s.notifications += 1;
            s.registered = report.plugin_registered;
            s.error = report.error;
        });
        Ok(Response::new(pr::RegistrationStatusResponse {}))
    }
}

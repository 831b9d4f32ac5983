//! The kubelet plugin's HTTP endpoint (`--http-endpoint`, `--metrics-path`, contract §1.5): health,
//! readiness ([`Readiness`]) and the Prometheus metrics of [`crate::metrics`], routed by
//! [`vgpu_serve::probes::ProbeRoutes`] and served by [`vgpu_serve::http::serve`].
//!
//! | route | answer |
//! |---|---|
//! | `GET /healthz` | `200 ok` while the process serves HTTP |
//! | `GET /readyz` | `200 ok` once both sockets exist and the kubelet reported a successful registration; `503` with the reason before (or after a failed registration, or while a socket file is missing) |
//! | `GET <metrics-path>` (`/metrics`) | [`DriverMetrics::encode`], OpenMetrics 1.0 text ([`CONTENT_TYPE`]) |
//!
//! With an [`Authorizer`] (`--enable-rbac`, [`router_with_authz`]) the metrics path answers only a bearer
//! token that a TokenReview authenticates (else 401) and a SubjectAccessReview allows `get` on the metrics
//! path (else 403) — [`vgpu_serve::authz`], as the controller, the extender and the device monitor do;
//! `/healthz` and `/readyz` stay open for the kubelet's probes.

use std::{path::PathBuf, sync::Arc};

use axum::Router;
use tokio::{net::TcpListener, sync::watch};
use vgpu_serve::{
    authz::Authorizer,
    http::HttpTimeouts,
    probes::{MetricsPathError, NotReady, ProbeRoutes},
};

use crate::{
    driver::RunningDriver,
    metrics::{CONTENT_TYPE, DriverMetrics},
    nri::NriHealth,
    registration::RegistrationState,
};

/// The metrics endpoint could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    /// The metrics path is not usable.
    #[error(transparent)]
    Path(#[from] MetricsPathError),
}

/// `--http-endpoint` as Go's `net.Listen` reads it: `""` = no server, `:<port>` = every interface,
/// `<ip>:<port>`, `[<ipv6>]:<port>` or `localhost:<port>`.
pub fn parse_http_endpoint(value: &str) -> Result<Option<std::net::SocketAddr>, String> {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    if value.is_empty() {
        return Ok(None);
    }
    let bad = || {
        format!(
            "invalid --http-endpoint {value:?}: expected \":<port>\", \"<ip>:<port>\", \"[<ipv6>]:<port>\" or \"localhost:<port>\" (\"\" = no metrics server)"
        )
    };
    let (host, port) = value.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    match host {
        "" => Ok(Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port))),
        "localhost" => Ok(Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port))),
        _ => value.parse::<SocketAddr>().map(Some).map_err(|_| bad()),
    }
}

/// What `/readyz` looks at: both socket files and the kubelet's registration report.
#[derive(Debug, Clone)]
pub struct Readiness {
    sockets: Vec<PathBuf>,
    registration: watch::Receiver<RegistrationState>,
    nri: Option<NriHealth>,
}

impl Readiness {
    /// Readiness of a running driver.
    pub fn of(driver: &RunningDriver) -> Self {
        Self::new(
            vec![driver.registration_socket.clone(), driver.dra_socket.clone()],
            driver.registration.clone(),
        )
    }

    /// Ready when every socket in `sockets` exists and `registration` says registered.
    pub fn new(sockets: Vec<PathBuf>, registration: watch::Receiver<RegistrationState>) -> Self {
        Self { sockets, registration, nri: None }
    }

    /// Also not ready while the NRI plugin (gate `NRISupport`) has been without a runtime for 2 minutes.
    #[must_use]
    pub fn with_nri(mut self, health: NriHealth) -> Self {
        self.nri = Some(health);
        self
    }

    /// `Ok` when ready, else why not.
    pub fn check(&self) -> Result<(), String> {
        if let Some(problem) = self.nri.as_ref().and_then(NriHealth::problem) {
            return Err(problem);
        }
        if let Some(missing) = self.sockets.iter().find(|s| !crate::driver::socket_exists(s)) {
            return Err(format!("socket {} is not served", missing.display()));
        }
        let state = self.registration.borrow();
        if state.registered {
            Ok(())
        } else if state.notifications == 0 {
            Err("the kubelet has not reported the plugin's registration yet".to_owned())
        } else {
            Err(format!("the kubelet reported a failed registration: {}", state.error))
        }
    }
}

/// The routes of the module table; `metrics_path` must start with `/` and differ from `/healthz`,
/// `/readyz` and `/version` ([`ProbeRoutes::metrics_at`]).
pub fn router(
    metrics: Arc<DriverMetrics>,
    readiness: Readiness,
    metrics_path: &str,
) -> Result<Router, MetricsError> {
    router_with_authz(metrics, readiness, metrics_path, None)
}

/// [`router`], with the metrics path guarded by `authorizer` when given (`--enable-rbac`: TokenReview +
/// SubjectAccessReview for `get` on `metrics_path`; 401 without a valid token, 403 when not allowed).
/// `/healthz` and `/readyz` are never guarded.
pub fn router_with_authz(
    metrics: Arc<DriverMetrics>,
    readiness: Readiness,
    metrics_path: &str,
    authorizer: Option<Arc<Authorizer>>,
) -> Result<Router, MetricsError> {
    Ok(ProbeRoutes::new()
        .ready_when(move || readiness.check().map_err(NotReady::unavailable))
        .metrics(CONTENT_TYPE, move || metrics.encode())
        .metrics_at(metrics_path)?
        .metrics_authorizer(authorizer)
        .into_router())
}

/// Serves [`router_with_authz`] on `listener` until `shutdown` (the upstream HTTP timeouts, no TLS);
/// `authorizer` guards the metrics path (`--enable-rbac`).
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<DriverMetrics>,
    readiness: Readiness,
    metrics_path: &str,
    authorizer: Option<Arc<Authorizer>>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), MetricsError> {
    let app = router_with_authz(metrics, readiness, metrics_path, authorizer)?;
    vgpu_serve::http::serve(listener, app, None, &HttpTimeouts::default(), shutdown).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn http_endpoints() {
        assert_eq!(parse_http_endpoint("").unwrap(), None);
        assert_eq!(parse_http_endpoint(":8080").unwrap(), Some("0.0.0.0:8080".parse().unwrap()));
        assert_eq!(parse_http_endpoint("127.0.0.1:0").unwrap(), Some("127.0.0.1:0".parse().unwrap()));
        assert_eq!(parse_http_endpoint("localhost:9").unwrap(), Some("127.0.0.1:9".parse().unwrap()));
        assert_eq!(parse_http_endpoint("[::1]:80").unwrap(), Some("[::1]:80".parse().unwrap()));
        for bad in ["8080", ":x", ":70000", "example.com:80", "::1:80", "1.2.3.4:"] {
            let e = parse_http_endpoint(bad).unwrap_err();
            assert!(e.starts_with(&format!("invalid --http-endpoint {bad:?}: expected")), "{e}");
        }
    }

    proptest::proptest! {
        #[test]
        fn parsed_endpoints_round_trip(ip: std::net::IpAddr, port: u16) {
            let addr = std::net::SocketAddr::new(ip, port);
            proptest::prop_assert_eq!(parse_http_endpoint(&addr.to_string()).unwrap(), Some(addr));
        }
    }

    #[test]
    fn bad_metrics_paths_are_named() {
        let (_tx, rx) = watch::channel(RegistrationState::default());
        let r = || Readiness::new(Vec::new(), rx.clone());
        let m = Arc::new(DriverMetrics::new());
        let e = router(Arc::clone(&m), r(), "metrics").unwrap_err().to_string();
        assert_eq!(e, "invalid --metrics-path \"metrics\": must start with '/'");
        assert!(
            router(Arc::clone(&m), r(), "/readyz")
                .unwrap_err()
                .to_string()
                .contains("/healthz, /readyz and /version")
        );
        assert!(router(m, r(), "/my{metrics}").is_ok());
    }
}

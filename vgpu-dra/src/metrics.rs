//! The kubelet plugin's HTTP endpoint (`--http-endpoint`, `--metrics-path`, contract §1.5): health,
//! readiness and Prometheus metrics, served by [`vgpu_serve::http::serve`].
//!
//! | route | answer |
//! |---|---|
//! | `GET /healthz` | `200 ok` while the process serves HTTP |
//! | `GET /readyz` | `200 ok` once both sockets exist and the kubelet reported a successful registration; `503` with the reason before (or after a failed registration, or while a socket file is missing) |
//! | `GET <metrics-path>` (`/metrics`) | the families below, then the `process_*` ones ([`vgpu_serve::process_metrics`]), OpenMetrics 1.0 text ([`CONTENT_TYPE`]) |
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `vgpu_kubelet_plugin_prepared_claims` | gauge | | claims prepared on this node (completed checkpoint entries), after each Prepare/Unprepare |
//! | `vgpu_kubelet_plugin_claim_operations_total` | counter | `operation` = `prepare`\|`unprepare`, `result` = `success`\|`failure` | claims handled, one per claim of a request |
//! | `vgpu_kubelet_plugin_request_duration_seconds` | histogram | `operation` | time of one NodePrepareResources/NodeUnprepareResources call (lock wait included) |
//!
//! | `vgpu_kubelet_plugin_resource_slice_pool_generation` | gauge | | the pool generation the API holds from this plugin (0 before the first successful round) |
//! | `vgpu_kubelet_plugin_resource_slice_publish_rounds_total` | counter | | publishing rounds finished, successful or not |
//! | `vgpu_kubelet_plugin_resource_slice_publish_failing` | gauge | | 1 while the last publishing round failed |
//!
//! | `vgpu_kubelet_plugin_device_health` | gauge | `device`, `uuid`, `status` = `Healthy`\|`Unhealthy`\|`Unknown` | 1 for the device's current status, 0 for the other two (a state set: three series per allocatable device) |
//! | `vgpu_kubelet_plugin_device_health_monitored` | gauge | | 1 while a health stream feeds the statuses (gate `NVMLDeviceHealthCheck` on and the backend's stream alive), else 0 |
//!
//! Every `operation`/`result` series exists from the start (zero), so rates work before the first claim.
//! The `resource_slice_*` ones are read at scrape time from the slice publisher's progress channel
//! ([`crate::slices::publisher::SlicePublisher::status`], given by [`DriverMetrics::set_publisher`]) and are
//! absent until it is given. The `device_health*` ones are read at scrape time from the health snapshot
//! ([`crate::health::HealthSnapshot`], given by [`DriverMetrics::set_health`]) and are absent until it is
//! given; a snapshot that tracks no devices (gate off) has `device_health_monitored 0` and no
//! `device_health` series. The label set is bounded: `device` and `uuid` come from this node's allocatable
//! devices, `status` from three values.
//!
//! With an [`Authorizer`] (`--enable-rbac`, [`router_with_authz`]) the metrics path answers only a bearer
//! token that a TokenReview authenticates (else 401) and a SubjectAccessReview allows `get` on the metrics
//! path (else 403) — [`vgpu_serve::authz`], as the controller, the extender and the device monitor do;
//! `/healthz` and `/readyz` stay open for the kubelet's probes.

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    Router,
    body::Body,
    extract::Request,
    http::{HeaderValue, Method, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use tokio::{net::TcpListener, sync::watch};
use vgpu_serve::http::{HEALTHZ_PATH, HttpTimeouts, READYZ_PATH};

use vgpu_serve::authz::{Authorizer, NonResourceRequest};

use crate::{
    devices::AllocatableDevices,
    driver::RunningDriver,
    health::{HealthSnapshot, HealthStatus},
    registration::RegistrationState,
    slices::publisher::PublisherStatus,
};

/// Content type of the metrics page.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Metric name prefix.
pub const PREFIX: &str = "vgpu_kubelet_plugin";
/// Request-duration histogram buckets (seconds): 1 ms … ~16 s.
pub const DURATION_BUCKETS: [f64; 15] = [
    0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096, 8.192, 16.384,
];

/// Which kubelet call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// NodePrepareResources.
    Prepare,
    /// NodeUnprepareResources.
    Unprepare,
}

impl Operation {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Prepare => "prepare",
            Self::Unprepare => "unprepare",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpResult {
    operation: &'static str,
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    operation: &'static str,
}

/// The metrics endpoint could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    /// The metrics path is not usable.
    #[error("invalid --metrics-path {path:?}: {reason}")]
    Path {
        /// The path given.
        path: String,
        /// What was expected.
        reason: &'static str,
    },
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

/// The driver's metric families (cheap to share: every family is reference-counted).
#[derive(Debug)]
pub struct DriverMetrics {
    registry: Registry,
    process: Registry,
    prepared_claims: Gauge,
    operations: Family<OpResult, Counter>,
    duration: Family<OpLabel, Histogram, fn() -> Histogram>,
    publisher: Arc<std::sync::OnceLock<watch::Receiver<PublisherStatus>>>,
    health: Arc<std::sync::OnceLock<HealthSource>>,
}

/// The health snapshot and the UUID of each device name (the `uuid` label).
#[derive(Debug)]
struct HealthSource {
    snapshot: watch::Receiver<HealthSnapshot>,
    uuids: std::collections::BTreeMap<String, String>,
}

/// The `device_health*` families, read from the health snapshot once it is set.
#[derive(Debug)]
struct HealthCollector(Arc<std::sync::OnceLock<HealthSource>>);

const STATUSES: [HealthStatus; 3] = [HealthStatus::Healthy, HealthStatus::Unhealthy, HealthStatus::Unknown];

impl Collector for HealthCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(source) = self.0.get() else { return Ok(()) };
        let snapshot = source.snapshot.borrow().clone();
        let monitored = ConstGauge::new(i64::from(snapshot.is_monitored()));
        monitored.encode(encoder.encode_descriptor(
            "vgpu_kubelet_plugin_device_health_monitored",
            "1 while a health stream feeds the device statuses, else 0",
            None,
            monitored.metric_type(),
        )?)?;
        let mut family = encoder.encode_descriptor(
            "vgpu_kubelet_plugin_device_health",
            "1 for the device's current health status (Healthy, Unhealthy, Unknown), 0 for the others",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (device, state) in snapshot.iter() {
            let uuid = source.uuids.get(device).map_or("", String::as_str);
            for status in STATUSES {
                let labels = [("device", device), ("uuid", uuid), ("status", status.as_str())];
                let g = ConstGauge::new(i64::from(state.status == status));
                g.encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// The `resource_slice_*` families, read from the publisher's progress channel once it is set.
#[derive(Debug)]
struct PublisherCollector(Arc<std::sync::OnceLock<watch::Receiver<PublisherStatus>>>);

impl Collector for PublisherCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(status) = self.0.get() else { return Ok(()) };
        let status = status.borrow().clone();
        let rounds = ConstCounter::new(status.rounds);
        rounds.encode(encoder.encode_descriptor(
            "vgpu_kubelet_plugin_resource_slice_publish_rounds",
            "ResourceSlice publishing rounds finished, successful or not",
            None,
            rounds.metric_type(),
        )?)?;
        let gauges = [
            (
                "vgpu_kubelet_plugin_resource_slice_pool_generation",
                "Pool generation of this node's ResourceSlices in the API (0 before the first success)",
                status.generation,
            ),
            (
                "vgpu_kubelet_plugin_resource_slice_publish_failing",
                "1 while the last ResourceSlice publishing round failed",
                i64::from(status.last_error.is_some()),
            ),
        ];
        for (name, help, value) in gauges {
            let g = ConstGauge::new(value);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        Ok(())
    }
}

fn histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

impl Default for DriverMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl DriverMetrics {
    /// Every family registered, every `operation`/`result` series at zero.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let prepared_claims = Gauge::default();
        let operations = Family::<OpResult, Counter>::default();
        let duration: Family<OpLabel, Histogram, fn() -> Histogram> = Family::new_with_constructor(histogram);
        registry.register("prepared_claims", "Claims prepared on this node", prepared_claims.clone());
        registry.register(
            "claim_operations",
            "Claims handled by Prepare and Unprepare, by result",
            operations.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Duration of one NodePrepareResources or NodeUnprepareResources call",
            duration.clone(),
        );
        for operation in [Operation::Prepare, Operation::Unprepare].map(Operation::as_str) {
            for result in ["success", "failure"] {
                let _ = operations.get_or_create(&OpResult { operation, result });
            }
            let _ = duration.get_or_create(&OpLabel { operation });
        }
        let publisher = Arc::new(std::sync::OnceLock::new());
        let mut process = Registry::default();
        let health = Arc::new(std::sync::OnceLock::new());
        process.register_collector(Box::new(PublisherCollector(Arc::clone(&publisher))));
        process.register_collector(Box::new(HealthCollector(Arc::clone(&health))));
        process.register_collector(Box::new(vgpu_serve::process_metrics::ProcessCollector));
        Self { registry, process, prepared_claims, operations, duration, publisher, health }
    }

    /// Reads the `device_health*` families from `snapshot` from now on, with the `uuid` label of each
    /// device name taken from `devices` (the first call wins).
    pub fn set_health(&self, snapshot: watch::Receiver<HealthSnapshot>, devices: &AllocatableDevices) {
        let uuids = devices.iter().map(|d| (d.name.clone(), d.gpu.uuid.clone())).collect();
        let _ = self.health.set(HealthSource { snapshot, uuids });
    }

    /// Reads the `resource_slice_*` families from `status` from now on (the first call wins).
    pub fn set_publisher(&self, status: watch::Receiver<PublisherStatus>) {
        let _ = self.publisher.set(status);
    }

    /// One request: `successes` and `failures` claims, taking `elapsed`.
    pub fn request(&self, operation: Operation, successes: usize, failures: usize, elapsed: Duration) {
        let op = operation.as_str();
        for (result, n) in [("success", successes), ("failure", failures)] {
            if n > 0 {
                self.operations.get_or_create(&OpResult { operation: op, result }).inc_by(n as u64);
            }
        }
        self.duration.get_or_create(&OpLabel { operation: op }).observe(elapsed.as_secs_f64());
    }

    /// Sets the number of prepared claims.
    pub fn set_prepared_claims(&self, n: usize) {
        self.prepared_claims.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The OpenMetrics text: the driver's families, the `resource_slice_*` ones, then the `process_*` ones.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        use prometheus_client::encoding::text;
        let mut out = String::new();
        text::encode_registry(&mut out, &self.registry)?;
        text::encode_registry(&mut out, &self.process)?;
        text::encode_eof(&mut out)?;
        Ok(out)
    }
}

/// What `/readyz` looks at: both socket files and the kubelet's registration report.
#[derive(Debug, Clone)]
pub struct Readiness {
    sockets: Vec<PathBuf>,
    registration: watch::Receiver<RegistrationState>,
    nri: Option<crate::nri::NriHealth>,
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
    pub fn with_nri(mut self, health: crate::nri::NriHealth) -> Self {
        self.nri = Some(health);
        self
    }

    /// `Ok` when ready, else why not.
    pub fn check(&self) -> Result<(), String> {
        if let Some(problem) = self.nri.as_ref().and_then(crate::nri::NriHealth::problem) {
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

/// The routes of the module table; `metrics_path` must start with `/` and differ from `/healthz` and
/// `/readyz`.
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
    let bad = |reason| MetricsError::Path { path: metrics_path.to_owned(), reason };
    if !metrics_path.starts_with('/') {
        return Err(bad("must start with '/'"));
    }
    if metrics_path == HEALTHZ_PATH || metrics_path == READYZ_PATH {
        return Err(bad("must differ from /healthz and /readyz"));
    }
    let path = metrics_path.to_owned();
    let router = Router::new()
        .route(HEALTHZ_PATH, get(|| async { "ok" }))
        .route(
            READYZ_PATH,
            get(move || {
                let readiness = readiness.clone();
                async move {
                    match readiness.check() {
                        Ok(()) => (StatusCode::OK, "ok".to_owned()),
                        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
                    }
                }
            }),
        )
        // The metrics path is matched exactly in the fallback: any string is a valid path there (a route
        // pattern with `{` or `*` would mean something else).
        .fallback(move |request: Request| {
            let metrics = Arc::clone(&metrics);
            let path = path.clone();
            let authorizer = authorizer.clone();
            async move {
                if request.uri().path() == path
                    && let Some(authz) = &authorizer
                    && let Err(denied) =
                        authz.authorize(request.headers(), &NonResourceRequest::get(&path)).await
                {
                    return denied.response().map(Body::new);
                }
                metrics_page(&metrics, &path, &request)
            }
        });
    Ok(router)
}

fn metrics_page(metrics: &DriverMetrics, path: &str, request: &Request) -> Response {
    if request.uri().path() != path {
        return (StatusCode::NOT_FOUND, "not found").into_response();
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return (StatusCode::METHOD_NOT_ALLOWED, "only GET").into_response();
    }
    match metrics.encode() {
        Ok(text) => {
            let mut r = Response::new(Body::from(text));
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
            r
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("encoding metrics: {e}")).into_response(),
    }
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

/// Times one request for [`DriverMetrics::request`].
#[derive(Debug)]
pub struct Timer(Instant);

impl Timer {
    /// Starts now.
    pub fn start() -> Self {
        Self(Instant::now())
    }

    /// Time since start.
    pub fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn families_start_at_zero_and_count() {
        let m = DriverMetrics::new();
        let text = m.encode().unwrap();
        assert!(
            text.contains(
                "vgpu_kubelet_plugin_claim_operations_total{operation=\"unprepare\",result=\"failure\"} 0"
            ),
            "{text}"
        );
        m.request(Operation::Prepare, 2, 1, Duration::from_millis(3));
        m.set_prepared_claims(2);
        let text = m.encode().unwrap();
        assert!(
            text.contains("claim_operations_total{operation=\"prepare\",result=\"success\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("claim_operations_total{operation=\"prepare\",result=\"failure\"} 1"),
            "{text}"
        );
        assert!(text.contains("vgpu_kubelet_plugin_prepared_claims 2"), "{text}");
        assert!(text.contains("request_duration_seconds_count{operation=\"prepare\"} 1"), "{text}");
        assert!(
            text.contains("request_duration_seconds_bucket{le=\"0.004\",operation=\"prepare\"} 1"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
        assert!(!text.contains("resource_slice"), "absent until the publisher is set");
    }

    #[test]
    fn publisher_progress_is_read_at_scrape_time() {
        let m = DriverMetrics::new();
        let (tx, rx) = watch::channel(PublisherStatus::default());
        m.set_publisher(rx);
        let text = m.encode().unwrap();
        assert!(text.contains("vgpu_kubelet_plugin_resource_slice_publish_rounds_total 0\n"), "{text}");
        assert!(text.contains("vgpu_kubelet_plugin_resource_slice_pool_generation 0\n"), "{text}");
        tx.send_replace(PublisherStatus {
            rounds: 3,
            generation: 2,
            last_error: Some("list: refused".into()),
        });
        let text = m.encode().unwrap();
        assert!(
            text.contains("# TYPE vgpu_kubelet_plugin_resource_slice_publish_rounds counter\n"),
            "{text}"
        );
        assert!(text.contains("vgpu_kubelet_plugin_resource_slice_publish_rounds_total 3\n"), "{text}");
        assert!(text.contains("vgpu_kubelet_plugin_resource_slice_pool_generation 2\n"), "{text}");
        assert!(text.contains("vgpu_kubelet_plugin_resource_slice_publish_failing 1\n"), "{text}");
    }

    #[test]
    fn device_health_is_a_bounded_state_set_read_at_scrape_time() {
        use vgpu_core::backend::{HealthEvent, HealthEventKind, mock::MockBackend};

        use crate::{
            devices::DeviceConfig,
            health::{HealthConfig, HealthMonitor},
        };
        let backend = MockBackend::from_yaml_str(
            "gpus:\n  - { uuid: GPU-A, name: A30, memoryMiB: 1024 }\n  - { uuid: GPU-B, name: A30, memoryMiB: 1024 }\n",
        )
        .unwrap();
        let devices = AllocatableDevices::from_backend(&backend, &DeviceConfig::default()).unwrap();
        let m = DriverMetrics::new();
        assert!(!m.encode().unwrap().contains("device_health"), "absent until the snapshot is set");

        // Gate off: the unmonitored default has no devices.
        let off = DriverMetrics::new();
        let (_tx, rx) = watch::channel(HealthSnapshot::unmonitored_default());
        off.set_health(rx, &devices);
        let text = off.encode().unwrap();
        assert!(text.contains("vgpu_kubelet_plugin_device_health_monitored 0\n"), "{text}");
        assert!(!text.contains("vgpu_kubelet_plugin_device_health{"), "{text}");

        let monitor = HealthMonitor::new(HealthConfig::new("manager.nvidia.com", &[]), &devices);
        m.set_health(monitor.subscribe(), &devices);
        let text = m.encode().unwrap();
        assert!(text.contains("# TYPE vgpu_kubelet_plugin_device_health gauge\n"), "{text}");
        assert!(text.contains("vgpu_kubelet_plugin_device_health_monitored 1\n"), "{text}");
        let series = text.lines().filter(|l| l.starts_with("vgpu_kubelet_plugin_device_health{")).count();
        assert_eq!(series, devices.len() * 3, "three statuses per device: {text}");
        let first = devices.iter().next().unwrap();
        let line = |status: &str| {
            format!(
                "vgpu_kubelet_plugin_device_health{{device=\"{}\",uuid=\"{}\",status=\"{status}\"}}",
                first.name, first.gpu.uuid
            )
        };
        assert!(text.contains(&format!("{} 1\n", line("Healthy"))), "{text}");
        assert!(text.contains(&format!("{} 0\n", line("Unhealthy"))), "{text}");
        let xid = HealthEvent {
            index: first.gpu.index,
            uuid: first.gpu.uuid.clone(),
            kind: HealthEventKind::Xid { code: 79 },
            message: String::new(),
        };
        assert!(monitor.apply(&xid));
        let text = m.encode().unwrap();
        assert!(text.contains(&format!("{} 1\n", line("Unhealthy"))), "{text}");
        assert!(text.contains(&format!("{} 0\n", line("Healthy"))), "{text}");
        assert_eq!(
            text.lines().filter(|l| l.starts_with("vgpu_kubelet_plugin_device_health{")).count(),
            devices.len() * 3,
            "no new series on a change"
        );
    }

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
            router(Arc::clone(&m), r(), "/readyz").unwrap_err().to_string().contains("/healthz and /readyz")
        );
        assert!(router(m, r(), "/my{metrics}").is_ok());
    }
}

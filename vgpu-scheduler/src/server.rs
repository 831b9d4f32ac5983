//! The extender's HTTP server: kube-scheduler's extender protocol over an [`Extender`], plus health, readiness,
//! metrics and version endpoints (contract §1.2, §3).
//!
//! | route | answer |
//! |---|---|
//! | `POST /scheduler/filter` | [`ExtenderFilterResult`] (live filter: one node, its GPUs reserved) |
//! | `POST /scheduler/filter-dryrun` | [`ExtenderFilterResult`] (every feasible node, no side effect) |
//! | `POST /scheduler/prioritize` | [`HostPriorityList`](crate::wire::HostPriorityList) (scores 0–10 from the node policy) |
//! | `POST /scheduler/bind` | [`ExtenderBindingResult`] |
//! | `POST /scheduler/preempt` | [`ExtenderPreemptionResult`] |
//! | `GET /healthz` | 200 `ok` |
//! | `GET /readyz` | 200 `ok` when [`Readiness::is_ready`]; else 500 naming why (caches not synced, or follower) |
//! | `GET /metrics` | OpenMetrics text ([`Metrics`]) |
//! | `GET /version` | [`VersionInfo`] as JSON |
//!
//! # Who may call
//!
//! By default the server listens on loopback only (`127.0.0.1:3456`): kube-scheduler runs beside it in the
//! same pod or on the same host, and nothing else can reach the verbs. With
//! [`ServerConfig::probes_only_beyond_loopback`] it listens on all addresses but answers callers beyond
//! loopback only on `/healthz` and `/readyz` (403 elsewhere): the kubelet's probes on the pod IP work, the
//! verbs stay loopback-only. For a listener other callers can
//! reach, the server authenticates them ([`AccessPolicy`]):
//!
//! | route | plain | client certificates ([`ServerConfig::tls`] with a client CA) | `/metrics` authorization ([`AppState::with_metrics_authz`]) |
//! |---|---|---|---|
//! | `/healthz`, `/readyz` | open | open (kubelet probes present no certificate) | — |
//! | `/metrics` | open | verified client certificate, else 401 | bearer token reviewed by the API server (TokenReview + SubjectAccessReview, `get` on `/metrics`): none or unknown 401, not allowed 403; a client certificate is then neither needed nor enough |
//! | verbs, `/version`, anything else | open | verified client certificate, else 401, before the body is read | — |
//!
//! Client certificates are verified during the TLS handshake against the CA bundle ([`vgpu_serve::tls`],
//! [`ClientAuth::Optional`](vgpu_serve::tls::ClientAuth::Optional)): a certificate of another CA fails the
//! handshake; a client without one finishes it and is refused per route, so that probes still answer.
//! [`run`] warns when it listens beyond loopback over plain HTTP (anyone who reaches the port can filter and
//! bind, and bearer tokens would travel in clear) or over TLS without client certificates.
//!
//! Errors, as upstream kube-scheduler and vgpu-manager expect them: filter, filter-dryrun and bind always answer
//! HTTP 200, with the reason in the result's `Error` when the body is malformed or too large, the caches
//! are not synced yet, or the server is busy (a non-empty `Error` fails the scheduler's call). Preempt and
//! prioritize, whose results have no `Error` field, answer 400 (malformed, or a pod whose vGPU limits are
//! invalid), 413 (too large), 408 (body not received in time) or 503 (not synced, busy) with the reason as text.
//! Request bodies are capped at [`MAX_BODY_BYTES`] (7 MiB). JSON syntax errors name the line and column.
//!
//! # Bounded work
//!
//! The verbs' CPU work (decoding the body, the verb, encoding the answer) runs under a [`WorkPool`]
//! ([`crate::work`]): on blocking threads for large bodies, so the async workers that answer `/healthz`,
//! `/readyz`, `/metrics` and `/version` are never busy with it for long; on the connection's own task for
//! bodies up to [`INLINE_BODY_BYTES`](crate::work::INLINE_BODY_BYTES) (every filter, prioritize and preempt
//! of a few hundred candidates: tens of microseconds, less than the hand-off to another thread and back).
//! Over HTTP/1.1 a call of kube-scheduler's thus takes no task hop between the connection and the verb
//! (`tests/hops.rs` counts the runtime's parks per call); over HTTP/2 hyper runs each stream on a task of its
//! own, one hop from the connection's. At most [`WorkLimits::max_admitted`] verb calls are in the server at
//! once (reading their body, queued, running); beyond it a call is refused before its body is read. At most
//! [`WorkLimits::max_running`] heavy calls (filter, filter-dryrun, prioritize, preempt) run at once; the
//! others wait up to [`WorkLimits::queue_timeout`] and are then refused. A refused call gets `Retry-After: 1`
//! and, like the not-synced answer, `Error` in a 200 answer (filter, filter-dryrun, bind) or a 503 with the
//! reason (prioritize, preempt). kube-scheduler does not read `Retry-After` and treats both forms alike: a
//! failed filter call (unless the extender is `ignorable`) fails the scheduling attempt and sends the pod to
//! the backoff queue to be retried; a failed prioritize call is logged and its scores are left out; a failed
//! preempt call ends that preemption attempt. The 200 form for filter and bind keeps the answer vgpu-manager
//! gives for every other refusal; the header is for other clients.
//!
//! Memory: request bodies held at once are at most `max_admitted × max_body_bytes` (plus
//! `max_admitted_binds ×` [`BIND_BODY_BYTES`](crate::work::BIND_BODY_BYTES) for binds), and each running call
//! holds its decoded request and answer (a few times its body at most), so peak memory is bounded by
//! `base + max_admitted × max_body_bytes + max_running × k × max_body_bytes` (+ the binds' part) with `k` about
//! 6 for a body of node names only (measured by the `load` test in `tests/load.rs`).
//!
//! [`serve`] runs a router on a listener with the upstream timeouts, optional TLS ([`vgpu_serve::tls`]) and graceful
//! shutdown; [`run`] does it all from a [`ServerConfig`]. The whole request (headers and body) must arrive
//! within [`ServerConfig::read_timeout`] of its first byte, and its headers within
//! [`ServerConfig::header_read_timeout`] (never more than the read timeout).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::extract::{ConnectInfo, Extension};
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::TcpListener;
use vgpu_core::model::TopologyMode;

use crate::api_pod::ApiPod;
use crate::cluster::{Cluster, Pod};
use crate::convert::pod_from_k8s;
use crate::extender::Extender;
use crate::metrics::{
    self, Metrics, PolicyLabels, Verb, bind_result_label, filter_result_label, protection_reason,
};
use crate::wire::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult, ExtenderPreemptionArgs,
    ExtenderPreemptionResult, HostPriority,
};
use crate::work::{Admission, Busy, RETRY_AFTER_SECS, WorkLimits, WorkPool};
use vgpu_core::clock::Clock;
use vgpu_lease::{Readiness, Role};
use vgpu_serve::authz::{Authorizer, NonResourceRequest};
use vgpu_serve::http::{BodyError, HttpTimeouts};
use vgpu_serve::probes::{NotReady, ProbeRoutes};
use vgpu_serve::tls::{TlsError, TlsFiles, VerifiedClientCert};

/// Largest accepted request body (7 MiB, vgpu-manager's `io.LimitReader`).
pub const MAX_BODY_BYTES: usize = 7 << 20;
use vgpu_serve::http::{
    DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_READ_TIMEOUT, DEFAULT_SHUTDOWN_TIMEOUT, HEALTHZ_PATH, METRICS_PATH,
    READYZ_PATH, RequestStart, VERSION_PATH,
};

/// Server settings (the binary fills them from its flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Listen address (`<--server-bind-address>:<--server-bind-port>`, default `127.0.0.1:3456`).
    pub bind_address: SocketAddr,
    /// TLS certificate and key (`--enable-tls`), and the client CA bundle (`--client-ca-file`: every route but
    /// the probes then needs a verified client certificate, module docs); `None` serves plain HTTP.
    pub tls: Option<TlsFiles>,
    /// Time to receive a request's headers (also bounds the TLS handshake).
    pub header_read_timeout: Duration,
    /// Time to receive a whole request, body included.
    pub read_timeout: Duration,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Wait for open connections after shutdown is asked, before giving up on them.
    pub shutdown_timeout: Duration,
    /// Verb calls admitted and running at once ([`crate::work`]).
    pub work: WorkLimits,
    /// Callers beyond loopback reach only `/healthz` and `/readyz` (403 elsewhere): a listener on all
    /// addresses whose verbs stay loopback-only, so that the kubelet's HTTP probes on the pod IP (what
    /// vgpu-manager's chart declares for its `device-scheduler` container) are answered.
    pub probes_only_beyond_loopback: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            bind_address: SocketAddr::from(([127, 0, 0, 1], crate::DEFAULT_PORT)),
            tls: None,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            read_timeout: DEFAULT_READ_TIMEOUT,
            max_body_bytes: MAX_BODY_BYTES,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            work: WorkLimits::default(),
            probes_only_beyond_loopback: false,
        }
    }
}

impl ServerConfig {
    /// The timeouts [`serve`] applies.
    pub fn timeouts(&self) -> HttpTimeouts {
        HttpTimeouts {
            header_read_timeout: self.header_read_timeout,
            read_timeout: self.read_timeout,
            shutdown_timeout: self.shutdown_timeout,
        }
    }

    /// Whether client certificates are verified ([`ServerConfig::tls`] with a client CA bundle).
    pub fn client_auth(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.client_ca.is_some())
    }
}

/// Who may call which route (module docs).
#[derive(Debug, Clone, Default)]
pub struct AccessPolicy {
    /// Every route but `/healthz` and `/readyz` (and `/metrics` under `metrics_authz`) needs a verified
    /// client certificate ([`VerifiedClientCert`] request extension, set by [`serve`]).
    pub client_cert_required: bool,
    /// `/metrics` needs a bearer token the API server allows `get` on `/metrics`.
    pub metrics_authz: Option<Arc<Authorizer>>,
    /// A caller whose address is not loopback (the request's [`ConnectInfo`], set by [`serve`]) reaches only
    /// `/healthz` and `/readyz`; a request without a peer address is treated as beyond loopback.
    pub probes_only_beyond_loopback: bool,
}

/// Why the server could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The listen address could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TLS certificate or configuration is not usable.
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// What the router serves: the extender, the readiness handle, the metrics, the body limits and the verb
/// work pool.
pub struct AppState<C, K> {
    extender: Arc<Extender<C, K>>,
    readiness: Readiness,
    metrics: Arc<Metrics>,
    max_body_bytes: usize,
    read_timeout: Duration,
    pool: Arc<WorkPool>,
    access: AccessPolicy,
}

impl<C, K> Clone for AppState<C, K> {
    fn clone(&self) -> Self {
        Self {
            extender: self.extender.clone(),
            readiness: self.readiness.clone(),
            metrics: self.metrics.clone(),
            max_body_bytes: self.max_body_bytes,
            read_timeout: self.read_timeout,
            pool: self.pool.clone(),
            access: self.access.clone(),
        }
    }
}

impl<C, K> std::fmt::Debug for AppState<C, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("readiness", &self.readiness)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("read_timeout", &self.read_timeout)
            .field("work", &self.pool.limits())
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

impl<C, K> AppState<C, K> {
    /// State with the default body limit, read timeout and work limits. Give the extender the same `metrics`
    /// as observer ([`Extender::with_observer`]) to get the filter's stage timings.
    pub fn new(extender: Arc<Extender<C, K>>, readiness: Readiness, metrics: Arc<Metrics>) -> Self {
        Self {
            extender,
            readiness,
            metrics,
            max_body_bytes: MAX_BODY_BYTES,
            read_timeout: DEFAULT_READ_TIMEOUT,
            pool: Arc::new(WorkPool::new(WorkLimits::default())),
            access: AccessPolicy::default(),
        }
    }

    /// Requires a verified client certificate on every route but the probes (module docs). [`run`] sets it
    /// when [`ServerConfig::tls`] has a client CA bundle.
    pub fn with_client_cert_required(mut self, required: bool) -> Self {
        self.access.client_cert_required = required;
        self
    }

    /// Callers beyond loopback reach only `/healthz` and `/readyz` ([`AccessPolicy::probes_only_beyond_loopback`]).
    pub fn with_probes_only_beyond_loopback(mut self, probes_only: bool) -> Self {
        self.access.probes_only_beyond_loopback = probes_only;
        self
    }

    /// Authorizes `/metrics` by bearer token (`--enable-rbac`): TokenReview + SubjectAccessReview for `get`
    /// on `/metrics`, cached ([`vgpu_serve::authz`]).
    pub fn with_metrics_authz(mut self, authz: Arc<Authorizer>) -> Self {
        self.access.metrics_authz = Some(authz);
        self
    }

    /// Who may call which route.
    pub fn access(&self) -> &AccessPolicy {
        &self.access
    }

    /// Takes the body limit, read timeout and work limits of a [`ServerConfig`].
    pub fn with_limits(mut self, config: &ServerConfig) -> Self {
        self.max_body_bytes = config.max_body_bytes;
        self.read_timeout = config.read_timeout;
        self.pool = Arc::new(WorkPool::new(config.work));
        self
    }

    /// The verb work pool.
    pub fn pool(&self) -> &Arc<WorkPool> {
        &self.pool
    }

    /// The extender.
    pub fn extender(&self) -> &Arc<Extender<C, K>> {
        &self.extender
    }

    /// The readiness handle.
    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }
}

use vgpu_serve::http::VersionInfo;

fn version_info() -> VersionInfo {
    VersionInfo::new("vgpu-scheduler-extender")
}

/// A request refused before its verb ran.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum RequestError {
    #[error("extender not ready: the cluster cache has not synced yet; retry later")]
    NotSynced,
    #[error(transparent)]
    Body(#[from] BodyError),
    #[error("malformed {what} JSON{}: {error}", path.as_deref().map(|p| format!(" at `{p}`")).unwrap_or_default())]
    Json { what: &'static str, path: Option<String>, error: String },
    #[error(
        "malformed {what} JSON: syntax error at line {line} column {column}{}: {error}",
        path.as_deref().map(|p| format!(" (in `{p}`)")).unwrap_or_default()
    )]
    Syntax { what: &'static str, line: usize, column: usize, path: Option<String>, error: String },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Busy(#[from] Busy),
}

impl RequestError {
    fn status(&self) -> StatusCode {
        match self {
            RequestError::NotSynced
            | RequestError::Busy(Busy::Full { .. } | Busy::QueueTimeout { .. } | Busy::BindsFull { .. }) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            RequestError::Busy(Busy::Stopped(_)) => StatusCode::INTERNAL_SERVER_ERROR,
            RequestError::Body(e) => e.status(),
            RequestError::Json { .. } | RequestError::Syntax { .. } | RequestError::Invalid(_) => {
                StatusCode::BAD_REQUEST
            }
        }
    }

    /// The non-200 answer (preempt, prioritize).
    fn into_response(self) -> Response {
        let status = self.status();
        with_retry_after(status, (status, format!("{self}\n")).into_response())
    }

    /// The 200 answer with `Error` (filter, filter-dryrun, bind).
    fn into_error_result<T: Serialize>(self, result: impl FnOnce(String) -> T) -> Response {
        let status = self.status();
        with_retry_after(status, json(StatusCode::OK, &result(self.to_string())))
    }
}

/// Adds `Retry-After` to the answer of a refusal that will pass (503: not synced, busy).
fn with_retry_after(status: StatusCode, mut response: Response) -> Response {
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    }
    response
}

impl<C: Cluster, K: Clock + 'static> AppState<C, K> {
    fn ensure_synced(&self) -> Result<(), RequestError> {
        if self.readiness.is_synced() { Ok(()) } else { Err(RequestError::NotSynced) }
    }

    /// Admits a bind call (bind slots, [`BIND_BODY_BYTES`](crate::work::BIND_BODY_BYTES)) and reads its body,
    /// once the caches are synced.
    async fn admit_bind(
        &self,
        headers: &HeaderMap,
        body: Body,
        start: Option<RequestStart>,
    ) -> Result<(Admission, Bytes), RequestError> {
        let limit = self.max_body_bytes.min(crate::work::BIND_BODY_BYTES);
        self.admit_with(|pool| pool.admit_bind(), limit, headers, body, start).await
    }

    /// Admits a verb call and reads its body, once the caches are synced (every verb refuses to answer before).
    async fn admit(
        &self,
        headers: &HeaderMap,
        body: Body,
        start: Option<RequestStart>,
    ) -> Result<(Admission, Bytes), RequestError> {
        self.admit_with(WorkPool::admit, self.max_body_bytes, headers, body, start).await
    }

    async fn admit_with(
        &self,
        admit: impl FnOnce(&WorkPool) -> Result<Admission, Busy>,
        limit: usize,
        headers: &HeaderMap,
        body: Body,
        start: Option<RequestStart>,
    ) -> Result<(Admission, Bytes), RequestError> {
        self.ensure_synced()?;
        let admission = admit(&self.pool)?;
        let bytes = vgpu_serve::http::read_body(headers, body, start, limit, self.read_timeout).await?;
        Ok((admission, bytes))
    }

    fn is_vgpu(&self, pod: &Pod) -> bool {
        pod.vgpu_request(&self.extender.config().domain).is_ok_and(|r| !r.is_empty())
    }

    /// `topology_placement_total` for a pod just placed on `node`, from the claim its filter chose.
    fn record_placement(&self, pod: &Pod, node: &str, mode: TopologyMode) {
        let cache = self.extender.cache();
        let Some(claim) = self.extender.placed_claim(&pod.uid) else { return };
        let Some(slot) = cache.node(node) else { return };
        let decoded = slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner).decoded.clone();
        let Ok(decoded) = decoded else { return };
        if let Some(result) = metrics::placement_result(mode, &claim, &decoded) {
            self.metrics.topology_placement(mode.as_str(), result);
        }
    }
}

fn decode_json<T: DeserializeOwned>(bytes: &[u8], what: &'static str) -> Result<T, RequestError> {
    // Go refuses anything but an object for these structs (serde would take an array as positional fields).
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        Some(_) => {
            return Err(RequestError::Json { what, path: None, error: "expected a JSON object".into() });
        }
        None => {
            return Err(RequestError::Json {
                what,
                path: None,
                error: "empty body; expected a JSON object".into(),
            });
        }
    }
    // Well-formed bodies (all of kube-scheduler's) decode without tracking the path, which costs about a
    // third more; only a body that fails is decoded again to name where.
    if let Ok(value) = serde_json::from_slice(bytes) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        // `?` marks a map key or sequence element the path cannot name; only a full path helps the reader.
        let path = (path != "." && !path.contains('?')).then_some(path);
        json_error(what, path, e.into_inner())
    })?;
    de.end().map_err(|e| json_error(what, None, e))?;
    Ok(value)
}

/// A syntax error (or a truncated body) by line and column; a data error by field path, with serde's message
/// (which ends with the line and column).
fn json_error(what: &'static str, path: Option<String>, e: serde_json::Error) -> RequestError {
    use serde_json::error::Category;
    match e.classify() {
        Category::Syntax | Category::Eof => {
            let text = e.to_string();
            let suffix = format!(" at line {} column {}", e.line(), e.column());
            let error = text.strip_suffix(&suffix).unwrap_or(&text).to_owned();
            RequestError::Syntax { what, line: e.line(), column: e.column(), path, error }
        }
        Category::Io | Category::Data => RequestError::Json { what, path, error: e.to_string() },
    }
}

fn json<T: Serialize>(status: StatusCode, value: &T) -> Response {
    json_bytes(status, serde_json::to_vec(value))
}

/// A JSON answer from already encoded bytes (or the encoding's error).
fn json_bytes(status: StatusCode, encoded: Result<Vec<u8>, serde_json::Error>) -> Response {
    match encoded {
        Ok(body) => {
            let mut r = (status, body).into_response();
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r
        }
        Err(e) => {
            (StatusCode::INTERNAL_SERVER_ERROR, format!("encoding the answer failed: {e}\n")).into_response()
        }
    }
}

/// The router over `state`: the verbs at [`FILTER_PATH`](crate::FILTER_PATH) & co., and the probes.
pub fn router<C: Cluster, K: Clock + 'static>(state: AppState<C, K>) -> Router {
    Router::new()
        .route(crate::FILTER_PATH, post(filter::<C, K>))
        .route(crate::FILTER_DRYRUN_PATH, post(filter_dry_run::<C, K>))
        .route(crate::PRIORITIZE_PATH, post(prioritize::<C, K>))
        .route(crate::BIND_PATH, post(bind::<C, K>))
        .route(crate::PREEMPT_PATH, post(preempt::<C, K>))
        .route(VERSION_PATH, get(version))
        .merge(probes(&state))
        .layer(axum::middleware::from_fn_with_state(state.clone(), access::<C, K>))
        .with_state(state)
}

/// Lets a request through to its route when [`AccessPolicy`] allows it (module docs).
async fn access<C: Cluster, K: Clock + 'static>(
    State(s): State<AppState<C, K>>,
    request: Request<Body>,
    next: Next,
) -> Response {
    let path = request.uri().path();
    if path == HEALTHZ_PATH || path == READYZ_PATH {
        return next.run(request).await;
    }
    if s.access.probes_only_beyond_loopback {
        let peer = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0);
        if !peer.is_some_and(|p| p.ip().is_loopback()) {
            tracing::debug!(%path, ?peer, "refused: only the probes answer beyond loopback");
            return (
                StatusCode::FORBIDDEN,
                "Forbidden: beyond loopback this server answers only /healthz and /readyz\n",
            )
                .into_response();
        }
    }
    if path == METRICS_PATH
        && let Some(authz) = &s.access.metrics_authz
    {
        return match authz.authorize(request.headers(), &NonResourceRequest::get(METRICS_PATH)).await {
            Ok(_) => next.run(request).await,
            Err(denied) => denied.response().map(Body::new),
        };
    }
    if s.access.client_cert_required && request.extensions().get::<VerifiedClientCert>().is_none() {
        tracing::debug!(%path, "refused: no client certificate");
        return (
            StatusCode::UNAUTHORIZED,
            "Unauthorized: this route needs a client certificate signed by the server's client CA\n",
        )
            .into_response();
    }
    next.run(request).await
}

async fn filter<C: Cluster, K: Clock + 'static>(
    State(s): State<AppState<C, K>>,
    start: Option<Extension<RequestStart>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    filter_verb(s, start.map(|e| e.0), headers, body, Verb::Filter).await
}

async fn filter_dry_run<C: Cluster, K: Clock + 'static>(
    State(s): State<AppState<C, K>>,
    start: Option<Extension<RequestStart>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    filter_verb(s, start.map(|e| e.0), headers, body, Verb::FilterDryRun).await
}

async fn filter_verb<C: Cluster, K: Clock + 'static>(
    s: AppState<C, K>,
    req_start: Option<RequestStart>,
    headers: HeaderMap,
    body: Body,
    verb: Verb,
) -> Response {
    let start = Instant::now();
    let (response, label) = match s.admit(&headers, body, req_start).await {
        Err(e) => (e.into_error_result(ExtenderFilterResult::error), "error"),
        Ok((admission, bytes)) => {
            let (state, len) = (s.clone(), bytes.len());
            let work = async move { state.filter_work(&bytes, verb).await };
            match s.pool.run_small_async(admission, len, work).await {
                Ok(done) => done,
                Err(busy) => {
                    (RequestError::from(busy).into_error_result(ExtenderFilterResult::error), "error")
                }
            }
        }
    };
    s.metrics.verb(verb, label, start.elapsed());
    response
}

impl<C: Cluster, K: Clock + 'static> AppState<C, K> {
    /// Filter or dry-run filter from the body to the encoded answer (on a worker thread).
    async fn filter_work(&self, bytes: &[u8], verb: Verb) -> (Response, &'static str) {
        let prepared = decode_json::<ExtenderArgs<ApiPod>>(bytes, "ExtenderArgs").and_then(|mut args| {
            let names = args.take_candidate_names().map_err(|e| RequestError::Invalid(e.to_string()))?;
            Ok((args, names))
        });
        let (out, label) = match prepared {
            Err(e) => (ExtenderFilterResult::error(e.to_string()), "error"),
            Ok((mut args, names)) => {
                let pod = args.pod.take().map(ApiPod::into_pod);
                let result = if verb == Verb::Filter {
                    self.extender.filter(pod.as_ref(), names).await
                } else {
                    self.extender.filter_dry_run(pod.as_ref(), names)
                };
                let label = filter_result_label(&result);
                let domain = &self.extender.config().domain;
                let policy = pod.as_ref().map(|p| PolicyLabels::from_pod(p, domain));
                self.metrics.filter_rejects(verb, &result, policy.map_or("none", |p| p.topology_mode));
                if let (Verb::Filter, Some(pod), Some(policy)) = (verb, &pod, policy)
                    && label != "error"
                    && self.is_vgpu(pod)
                {
                    self.metrics.pod_policy(policy);
                    let mode = policy.topology_mode.parse::<TopologyMode>().unwrap_or_default();
                    if let (Some(node), 1) = (result.passed().next(), result.passed().len()) {
                        self.record_placement(pod, node, mode);
                    }
                }
                // The live answer leaves out the rejected nodes once one passed (kube-scheduler drops them);
                // the dry run, read by people and vgpuctl, keeps every reason.
                let result = if verb == Verb::Filter { result.without_failures_if_passed() } else { result };
                (ExtenderFilterResult::from_result(&args, result), label)
            }
        };
        // The same bytes as `json()` would write, faster for thousands of `FailedNodes` (wire module docs).
        (json_bytes(StatusCode::OK, out.to_json()), label)
    }

    /// Prioritize from the body to the encoded answer (on a worker thread).
    fn prioritize_work(&self, bytes: &[u8]) -> Result<Response, RequestError> {
        let mut args: ExtenderArgs<ApiPod> = decode_json(bytes, "ExtenderArgs")?;
        let names = args.take_candidate_names().map_err(|e| RequestError::Invalid(e.to_string()))?;
        let pod = args
            .pod
            .take()
            .map(ApiPod::into_pod)
            .ok_or_else(|| RequestError::Invalid(crate::ExtenderError::NoPod.to_string()))?;
        let list = self
            .extender
            .prioritize(&pod, names)
            .map_err(|e| RequestError::Invalid(format!("pod {}: {e}", pod.key())))?;
        Ok(json(StatusCode::OK, &list.into_iter().map(HostPriority::from).collect::<Vec<_>>()))
    }

    /// Preempt from the body to the encoded answer (on a worker thread).
    async fn preempt_work(&self, bytes: &[u8]) -> Result<(Response, &'static str), RequestError> {
        let args: ExtenderPreemptionArgs = decode_json(bytes, "ExtenderPreemptionArgs")?;
        let pod = args.pod.as_ref().map(pod_from_k8s);
        let victims = args.victim_uids();
        let result = self.extender.preempt(pod.as_ref(), &victims).await;
        let label = match &pod {
            Some(p) if self.is_vgpu(p) => {
                let cache = self.extender.cache();
                for uid in victims.values().flatten() {
                    if let Some(reason) = cache.pod(uid).and_then(|v| protection_reason(&v, p)) {
                        self.metrics.preempt_protected(reason);
                    }
                }
                for (node, chosen) in &result.node_victims {
                    let sent = victims.get(node);
                    let added = chosen.iter().filter(|u| !sent.is_some_and(|v| v.contains(u))).count();
                    self.metrics.preempt_victims_added(added);
                }
                if result.node_victims.is_empty() { "no_victims" } else { "victims" }
            }
            _ => "passthrough",
        };
        let out = ExtenderPreemptionResult::from_result(&args, result);
        Ok((json(StatusCode::OK, &out), label))
    }
}

async fn prioritize<C: Cluster, K: Clock + 'static>(
    State(s): State<AppState<C, K>>,
    req_start: Option<Extension<RequestStart>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let start = Instant::now();
    let run = async {
        let (admission, bytes) = s.admit(&headers, body, req_start.map(|e| e.0)).await?;
        let (state, len) = (s.clone(), bytes.len());
        s.pool.run_small(admission, len, move || state.prioritize_work(&bytes)).await?
    };
    let (response, label) = match run.await {
        Ok(response) => (response, "success"),
        Err(e) => (e.into_response(), "error"),
    };
    s.metrics.verb(Verb::Prioritize, label, start.elapsed());
    response
}

async fn bind<C: Cluster, K: Clock + 'static>(
    State(s): State<AppState<C, K>>,
    req_start: Option<Extension<RequestStart>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let start = Instant::now();
    // Bind is two API calls: it takes no worker, and has admission slots of its own (module `work`).
    let args = s.admit_bind(&headers, body, req_start.map(|e| e.0)).await.and_then(|(admission, bytes)| {
        decode_json::<ExtenderBindingArgs>(&bytes, "ExtenderBindingArgs").map(|a| (admission, a))
    });
    let (response, label) = match args {
        Err(e) => (e.into_error_result(|error| ExtenderBindingResult { error }), "error"),
        Ok((_admission, a)) => {
            let r = s.extender.bind(&a.pod_namespace, &a.pod_name, &a.pod_uid, &a.node).await;
            let label = bind_result_label(&r.error);
            (json(StatusCode::OK, &ExtenderBindingResult::from(r)), label)
        }
    };
    s.metrics.verb(Verb::Bind, label, start.elapsed());
    response
}

async fn preempt<C: Cluster, K: Clock + 'static>(
    State(s): State<AppState<C, K>>,
    req_start: Option<Extension<RequestStart>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let start = Instant::now();
    let run = async {
        let (admission, bytes) = s.admit(&headers, body, req_start.map(|e| e.0)).await?;
        let (state, len) = (s.clone(), bytes.len());
        s.pool.run_small_async(admission, len, async move { state.preempt_work(&bytes).await }).await?
    };
    let (response, label) = match run.await {
        Ok(done) => done,
        Err(e) => (e.into_response(), "error"),
    };
    s.metrics.verb(Verb::Preempt, label, start.elapsed());
    response
}

/// `/healthz`, `/readyz` (caches synced and not a follower) and `/metrics`; the access middleware guards
/// `/metrics` (authorizer) and the loopback rule.
fn probes<C: Cluster, K: Clock + 'static>(s: &AppState<C, K>) -> Router<AppState<C, K>> {
    let readiness = s.readiness.clone();
    let metrics = s.metrics.clone();
    ProbeRoutes::new()
        .ready_when(move || {
            let not_ready = |message: &str| Err(NotReady::new(StatusCode::INTERNAL_SERVER_ERROR, message));
            if readiness.is_ready() {
                Ok(())
            } else if !readiness.is_synced() {
                not_ready("not ready: caches not synced\n")
            } else if readiness.role() == Role::Follower {
                not_ready("not ready: follower (another replica holds the leader lease)\n")
            } else {
                not_ready("not ready\n")
            }
        })
        .metrics(metrics::CONTENT_TYPE, move || metrics.encode())
        .into_router()
}

async fn version() -> Response {
    json(StatusCode::OK, &version_info())
}

/// Serves `app` on `listener` until `shutdown` completes ([`vgpu_serve::http::serve`] with this config's
/// timeouts): HTTP/1.1, the header timeout, a [`RequestStart`] per request, TLS when `tls` is given (requests of
/// a connection with a verified client certificate carry it as a [`VerifiedClientCert`] extension), graceful
/// drain at shutdown.
pub async fn serve<F>(
    listener: TcpListener,
    app: Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    config: &ServerConfig,
    shutdown: F,
) where
    F: Future<Output = ()> + Send,
{
    vgpu_serve::http::serve(listener, app, tls, &config.timeouts(), shutdown).await;
}

/// Logs a warning for a listener beyond loopback that does not authenticate its callers (module docs).
fn warn_if_exposed(config: &ServerConfig, metrics_authz: bool) {
    let address = config.bind_address;
    if address.ip().is_loopback() || config.probes_only_beyond_loopback {
        return;
    }
    if config.tls.is_none() {
        tracing::warn!(
            %address,
            metrics_authz,
            "plain-HTTP listener beyond loopback: anyone who reaches this port can call filter and bind \
             (and bearer tokens travel in clear); use --enable-tls with --client-ca-file, or bind 127.0.0.1"
        );
    } else if !config.client_auth() {
        tracing::warn!(
            %address,
            "TLS listener beyond loopback without client certificates: anyone who reaches this port can call \
             filter and bind; set --client-ca-file"
        );
    }
}

/// Binds [`ServerConfig::bind_address`], loads TLS when configured (and reloads the certificate and the
/// client CA bundle every refresh interval), and serves [`router`]`(state)` until `shutdown` completes, with
/// a verified client certificate required on every route but the probes when a client CA is configured.
pub async fn run<C, K, F>(config: ServerConfig, state: AppState<C, K>, shutdown: F) -> Result<(), ServerError>
where
    C: Cluster,
    K: Clock + 'static,
    F: Future<Output = ()> + Send,
{
    let tls = config.tls.as_ref().map(TlsFiles::start).transpose()?;
    let listener = TcpListener::bind(config.bind_address)
        .await
        .map_err(|source| ServerError::Bind { addr: config.bind_address, source })?;
    warn_if_exposed(&config, state.access.metrics_authz.is_some());
    let state = state
        .with_limits(&config)
        .with_client_cert_required(config.client_auth())
        .with_probes_only_beyond_loopback(config.probes_only_beyond_loopback);
    let connections = state.metrics.connections().clone();
    let app = router(state);
    let acceptor = tls.as_ref().map(|t| t.acceptor().clone());
    vgpu_serve::http::serve_with_stats(listener, app, acceptor, &config.timeouts(), &connections, shutdown)
        .await;
    // Dropping `tls` stops its refreshers.
    drop(tls);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_errors_name_the_type_and_path() {
        let e = decode_json::<ExtenderBindingArgs>(br#"{"PodName": 3}"#, "ExtenderBindingArgs").unwrap_err();
        assert_eq!(
            e.to_string(),
            "malformed ExtenderBindingArgs JSON at `PodName`: invalid type: integer `3`, expected a string at line 1 column 13"
        );
        let e = decode_json::<ExtenderBindingArgs>(b"", "ExtenderBindingArgs").unwrap_err();
        assert_eq!(e.to_string(), "malformed ExtenderBindingArgs JSON: empty body; expected a JSON object");
        let e = decode_json::<ExtenderBindingArgs>(b" [1]", "ExtenderBindingArgs").unwrap_err();
        assert_eq!(e.to_string(), "malformed ExtenderBindingArgs JSON: expected a JSON object");
        let e = decode_json::<ExtenderBindingArgs>(b"{", "ExtenderBindingArgs").unwrap_err();
        assert!(e.to_string().contains("EOF while parsing an object"), "{e}");
        let e = decode_json::<ExtenderBindingArgs>(b"{} x", "ExtenderBindingArgs").unwrap_err();
        assert!(e.to_string().contains("trailing characters"), "{e}");
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            RequestError::Body(BodyError::TooLarge { limit: 1 }).status(),
            StatusCode::PAYLOAD_TOO_LARGE
        );
        assert_eq!(RequestError::NotSynced.status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn version_info_names_the_extender() {
        assert_eq!(version_info().component, "vgpu-scheduler-extender");
    }

    #[test]
    fn default_config_matches_upstream_flags() {
        let c = ServerConfig::default();
        assert_eq!(c.bind_address.to_string(), "127.0.0.1:3456", "loopback unless told otherwise");
        assert_eq!((c.header_read_timeout.as_secs(), c.read_timeout.as_secs()), (15, 60));
        assert_eq!(c.max_body_bytes, 7 * 1024 * 1024);
        assert!(c.tls.is_none());
    }
}

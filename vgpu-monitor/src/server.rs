//! The monitor's HTTP routes as a plain [`axum::Router`] (served by `vgpu_serve::http::serve`, with TLS
//! when `--enable-tls`): the probes and `/version` from [`ProbeRoutes`], and its own `/metrics`.
//!
//! | route | answer |
//! |---|---|
//! | `GET /healthz` | 200 `ok` |
//! | `GET /readyz` | 200 `ok` once the pod cache has synced, else 503 `pod cache not synced` |
//! | `GET /version` | 200, [`VersionInfo`](vgpu_serve::http::VersionInfo) as JSON |
//! | `GET /metrics` | the page, read at scrape time on a blocking thread; OpenMetrics 1.0 when `Accept` names `application/openmetrics-text`, else Prometheus text 0.0.4 |
//!
//! `/metrics` admits one scrape per [`ServerConfig::min_scrape_interval`] (a token bucket of one token
//! refilled each interval, as upstream's limiter): a scrape inside the interval gets the last response
//! (status, `Content-Type` and body as they were) with `X-Rate-Limited: true`, or 429 with the same
//! header when that response was not a 200 (or there is none yet). With an [`Authorizer`]
//! (`--enable-rbac`), `/metrics` first needs a bearer token that a TokenReview authenticates (else 401)
//! and a SubjectAccessReview allows `get` on `/metrics` for (else 403); the other routes stay open, as
//! with controller-runtime's filter.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use axum::{
    Router,
    body::Body,
    extract::State,
    response::{IntoResponse, Response},
    routing::get,
};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use prometheus_client::registry::Registry;
use vgpu_serve::{
    authz::{Authorizer, NonResourceRequest},
    http::METRICS_PATH,
    probes::{NotReady, ProbeRoutes},
};

use crate::pods::PodSource;

/// `Content-Type` of an OpenMetrics page.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// `Content-Type` of a Prometheus text page.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The header marking a rate-limited answer.
pub const RATE_LIMITED_HEADER: &str = "x-rate-limited";
/// Default and smallest `--min-scrape-interval`.
pub const MIN_SCRAPE_INTERVAL: Duration = Duration::from_secs(1);

/// Settings of the routes.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// One real scrape per this interval.
    pub min_scrape_interval: Duration,
    /// `--enable-rbac`: who may read `/metrics`.
    pub authorizer: Option<Arc<Authorizer>>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self { min_scrape_interval: MIN_SCRAPE_INTERVAL, authorizer: None }
    }
}

#[derive(Debug, Clone)]
struct Cached {
    status: StatusCode,
    content_type: &'static str,
    body: Bytes,
}

#[derive(Debug, Default)]
struct Limiter {
    last_scrape: Option<Instant>,
    last: Option<Cached>,
}

/// The shared state of the routes.
#[derive(Debug)]
pub struct MonitorServer {
    registry: Arc<Registry>,
    pods: Arc<dyn PodSource>,
    config: ServerConfig,
    limiter: Mutex<Limiter>,
}

impl MonitorServer {
    /// Routes over `registry` (the page) and `pods` (readiness).
    pub fn new(registry: Registry, pods: Arc<dyn PodSource>, config: ServerConfig) -> Arc<Self> {
        Arc::new(Self { registry: Arc::new(registry), pods, config, limiter: Mutex::default() })
    }

    /// The router.
    pub fn router(self: &Arc<Self>) -> Router {
        let pods = Arc::clone(&self.pods);
        ProbeRoutes::new()
            .ready_when(move || {
                if pods.synced() { Ok(()) } else { Err(NotReady::unavailable("pod cache not synced")) }
            })
            .version("vgpu-device-monitor")
            .into_router()
            // The page is rate limited and negotiated (module docs), so it is routed here, not by `ProbeRoutes`.
            .route(METRICS_PATH, get(metrics))
            .with_state(Arc::clone(self))
    }

    /// Renders the page once (blocking: reads files and the backend). `openmetrics` picks the format.
    pub fn render(&self, openmetrics: bool) -> Result<String, std::fmt::Error> {
        let mut body = String::with_capacity(64 * 1024);
        if openmetrics {
            prometheus_client::encoding::text::encode(&mut body, &self.registry)?;
        } else {
            prometheus_client::encoding::prometheus_text::encode(&mut body, &self.registry)?;
        }
        Ok(body)
    }
}

/// Whether `Accept` asks for OpenMetrics.
pub fn wants_openmetrics(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|part| part.trim().starts_with("application/openmetrics-text")))
}

fn respond(c: &Cached, rate_limited: bool) -> Response {
    let mut r = Response::new(Body::from(c.body.clone()));
    *r.status_mut() = c.status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(c.content_type));
    if rate_limited {
        r.headers_mut().insert(RATE_LIMITED_HEADER, HeaderValue::from_static("true"));
    }
    r
}

async fn metrics(State(st): State<Arc<MonitorServer>>, headers: HeaderMap) -> Response {
    if let Some(authz) = &st.config.authorizer
        && let Err(denied) = authz.authorize(&headers, &NonResourceRequest::get(METRICS_PATH)).await
    {
        return denied.response().map(Body::new);
    }
    {
        let mut limiter = st.limiter.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if let Some(t) = limiter.last_scrape
            && now.duration_since(t) < st.config.min_scrape_interval
        {
            return match &limiter.last {
                Some(c) if c.status == StatusCode::OK => respond(c, true),
                _ => {
                    let mut r = (StatusCode::TOO_MANY_REQUESTS, "scrape rate limited and no cached page\n")
                        .into_response();
                    r.headers_mut().insert(RATE_LIMITED_HEADER, HeaderValue::from_static("true"));
                    r
                }
            };
        }
        limiter.last_scrape = Some(now);
    }
    let openmetrics = wants_openmetrics(&headers);
    let content_type = if openmetrics { OPENMETRICS_CONTENT_TYPE } else { PROMETHEUS_CONTENT_TYPE };
    let server = Arc::clone(&st);
    let rendered = tokio::task::spawn_blocking(move || server.render(openmetrics)).await;
    let cached = match rendered {
        Ok(Ok(body)) => Cached { status: StatusCode::OK, content_type, body: Bytes::from(body) },
        Ok(Err(err)) => {
            tracing::warn!(%err, "encoding the metrics page failed");
            Cached {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                content_type: "text/plain; charset=utf-8",
                body: Bytes::from_static(b"encoding the metrics failed\n"),
            }
        }
        Err(err) => {
            tracing::warn!(%err, "the scrape task failed");
            Cached {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                content_type: "text/plain; charset=utf-8",
                body: Bytes::from_static(b"the scrape failed\n"),
            }
        }
    };
    let response = respond(&cached, false);
    st.limiter.lock().unwrap_or_else(PoisonError::into_inner).last = Some(cached);
    response
}

//! The controller's HTTPS routes as an axum [`Router`], served by [`vgpu_serve::http::serve`] with the
//! reloading certificate of [`vgpu_serve::tls`] (one port for the API server's webhook calls and scrapes).
//!
//! | route | answer |
//! |---|---|
//! | `POST /gpuclasses/validate` | AdmissionReview ([`Admission::validate_gpu_classes`]) |
//! | `POST /deviceclasses/validate` | AdmissionReview ([`Admission::validate_device_classes`]) |
//! | `POST /resourceclaims/validate` | AdmissionReview ([`Admission::validate_claims`]) |
//! | `POST /pods/mutate` | AdmissionReview ([`Admission::mutate_pods`]) |
//! | `POST /pods/validate` | AdmissionReview ([`Admission::validate_pods`]) |
//! | `GET /healthz` | 200 `ok` |
//! | `GET /readyz` | 200 `ok` once the caches have synced, else 503 `caches not synced` |
//! | `GET /version` | 200, [`VersionInfo`] as JSON |
//! | `GET /metrics` | Prometheus text; with an [`Authorizer`] (`--enable-rbac`) only for a bearer token a TokenReview authenticates (else 401) and a SubjectAccessReview allows `get` on `/metrics` (else 403) — the kube-rbac-proxy contract, built in |
//!
//! Admission bodies are read under the admission body cap ([`vgpu_serve::admission::MAX_BODY_BYTES`], 413 above)
//! and the request deadline (408); a body that is not an AdmissionReview gets 400 with the reason.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use vgpu_kube::claims::ClusterApi;
use vgpu_serve::admission::{MAX_BODY_BYTES, answer};
use vgpu_serve::authz::{Authorizer, NonResourceRequest};
use vgpu_serve::http::{
    HEALTHZ_PATH, HttpTimeouts, METRICS_PATH, READYZ_PATH, RequestStart, VERSION_PATH, VersionInfo, read_body,
};
use vgpu_serve::tls::{TlsError, TlsFiles};

use crate::admission::{
    Admission, Inventory, MUTATE_PODS_PATH, VALIDATE_CLAIMS_PATH, VALIDATE_CLASSES_PATH,
    VALIDATE_DEVICE_CLASSES_PATH, VALIDATE_PODS_PATH,
};

/// `Content-Type` of the metrics page.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The routes' shared state.
pub struct ControllerServer<I, A> {
    admission: Arc<Admission<I, A>>,
    registry: Arc<Registry>,
    authorizer: Option<Arc<Authorizer>>,
    synced: Arc<AtomicBool>,
    read_timeout: Duration,
}

impl<I, A> std::fmt::Debug for ControllerServer<I, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerServer")
            .field("rbac", &self.authorizer.is_some())
            .field("synced", &self.synced.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<I: Inventory, A: ClusterApi> ControllerServer<I, A> {
    /// Routes over `admission` and `registry`; `/readyz` follows `synced`; `/metrics` is guarded by `authorizer`.
    pub fn new(
        admission: Arc<Admission<I, A>>,
        registry: Registry,
        authorizer: Option<Arc<Authorizer>>,
        synced: Arc<AtomicBool>,
        read_timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(Self { admission, registry: Arc::new(registry), authorizer, synced, read_timeout })
    }

    /// The router.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .route(VALIDATE_CLASSES_PATH, post(route::<I, A, 0>))
            .route(VALIDATE_DEVICE_CLASSES_PATH, post(route::<I, A, 1>))
            .route(VALIDATE_CLAIMS_PATH, post(route::<I, A, 2>))
            .route(MUTATE_PODS_PATH, post(route::<I, A, 3>))
            .route(VALIDATE_PODS_PATH, post(route::<I, A, 4>))
            .route(HEALTHZ_PATH, get(|| async { "ok" }))
            .route(READYZ_PATH, get(readyz::<I, A>))
            .route(VERSION_PATH, get(|| async { axum::Json(VersionInfo::new("vgpu-controller")) }))
            .route(METRICS_PATH, get(metrics::<I, A>))
            .with_state(Arc::clone(self))
    }
}

async fn route<I: Inventory, A: ClusterApi, const R: u8>(
    State(s): State<Arc<ControllerServer<I, A>>>,
    start: Option<Extension<RequestStart>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let bytes =
        match read_body(&headers, body, start.map(|Extension(s)| s), MAX_BODY_BYTES, s.read_timeout).await {
            Ok(b) => b,
            Err(e) => return (e.status(), format!("{e}\n")).into_response(),
        };
    let a = &s.admission;
    answer(match R {
        0 => a.validate_gpu_classes(&bytes),
        1 => a.validate_device_classes(&bytes),
        2 => a.validate_claims(&bytes),
        3 => a.mutate_pods(&bytes).await,
        _ => a.validate_pods(&bytes),
    })
}

async fn readyz<I, A>(State(s): State<Arc<ControllerServer<I, A>>>) -> Response {
    if s.synced.load(Ordering::Acquire) {
        (StatusCode::OK, "ok").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced").into_response()
    }
}

async fn metrics<I, A>(State(s): State<Arc<ControllerServer<I, A>>>, headers: HeaderMap) -> Response {
    if let Some(authz) = &s.authorizer
        && let Err(denied) = authz.authorize(&headers, &NonResourceRequest::get(METRICS_PATH)).await
    {
        return denied.response().map(Body::new);
    }
    let mut page = String::new();
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut page, &s.registry) {
        return (StatusCode::INTERNAL_SERVER_ERROR, format!("encoding the metrics failed: {e}\n"))
            .into_response();
    }
    ([(header::CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE)], page).into_response()
}

/// Serves the router over TLS on an already bound `listener` until `shutdown` completes; the certificate files
/// are re-read while it runs.
pub async fn serve<I: Inventory, A: ClusterApi>(
    listener: TcpListener,
    server: Arc<ControllerServer<I, A>>,
    tls: &TlsFiles,
    timeouts: HttpTimeouts,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), TlsError> {
    let tls = tls.start()?;
    let app = server.router();
    vgpu_serve::http::serve(listener, app, Some(tls.acceptor().clone()), &timeouts, shutdown).await;
    drop(tls);
    Ok(())
}

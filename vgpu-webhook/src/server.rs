//! The HTTPS server: the routes of [`crate::admit`] as an axum [`Router`], served by
//! [`vgpu_serve::http::serve`] with TLS from [`vgpu_serve::tls`] (the certificate is re-read when its files
//! change).
//!
//! | route | answer |
//! |---|---|
//! | `POST /pods/mutate` | AdmissionReview ([`Admission::mutate_pods`]) |
//! | `POST /pods/validate` | AdmissionReview ([`Admission::validate_pods`]) |
//! | `POST /resourceclaims/validate` | AdmissionReview ([`Admission::validate_claims`]) |
//! | `POST /volcano-jobs/mutate` | AdmissionReview ([`Admission::mutate_volcano_jobs`]) |
//! | `POST /volcano-jobs/validate` | AdmissionReview ([`Admission::validate_volcano_jobs`]) |
//! | `GET /healthz` | 200 `ok` |
//! | `GET /readyz` | 200 `ok` (the webhook keeps no cache to wait for) |
//!
//! A body that is not an AdmissionReview request gets 400 with the reason as text; a body over
//! [`MAX_BODY_BYTES`] 413; one that does not arrive within the read timeout 408.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use tokio::net::TcpListener;
use vgpu_serve::http::{HttpTimeouts, RequestStart, read_body};
use vgpu_serve::tls::{TlsError, TlsFiles};

use crate::admit::Admission;
use vgpu_kube::claims::ClusterApi;
use vgpu_serve::admission::{MAX_BODY_BYTES, answer};

/// Mutation route.
pub const MUTATE_PODS_PATH: &str = "/pods/mutate";
/// Pod validation route.
pub const VALIDATE_PODS_PATH: &str = "/pods/validate";
/// ResourceClaim validation route.
pub const VALIDATE_CLAIMS_PATH: &str = "/resourceclaims/validate";
/// Volcano Job mutation route.
pub const MUTATE_VOLCANO_JOBS_PATH: &str = "/volcano-jobs/mutate";
/// Volcano Job validation route.
pub const VALIDATE_VOLCANO_JOBS_PATH: &str = "/volcano-jobs/validate";

/// Where and how the server listens.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Listen address (`0.0.0.0:<--server-bind-port>`).
    pub bind_address: SocketAddr,
    /// Certificate and key (`<--cert-dir>/<--tls-cert-name>`, `<--cert-dir>/<--tls-key-name>`).
    pub tls: TlsFiles,
    /// Header and request timeouts.
    pub timeouts: HttpTimeouts,
}

impl ServerConfig {
    /// Listens on `bind_address` with the certificate files `cert_file` and `key_file` and the default timeouts.
    pub fn new(
        bind_address: SocketAddr,
        cert_file: impl Into<PathBuf>,
        key_file: impl Into<PathBuf>,
    ) -> Self {
        Self { bind_address, tls: TlsFiles::new(cert_file, key_file), timeouts: HttpTimeouts::default() }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The certificate files could not be loaded.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

struct AppState<C> {
    admission: Arc<Admission<C>>,
    read_timeout: Duration,
}

impl<C> std::fmt::Debug for AppState<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("admission", &self.admission)
            .field("read_timeout", &self.read_timeout)
            .finish()
    }
}

impl<C> Clone for AppState<C> {
    fn clone(&self) -> Self {
        Self { admission: self.admission.clone(), read_timeout: self.read_timeout }
    }
}

/// The routes (module docs), reading bodies within `read_timeout` of the request's first byte.
pub fn router<C: ClusterApi>(admission: Arc<Admission<C>>, read_timeout: Duration) -> Router {
    let state = AppState { admission, read_timeout };
    Router::new()
        .route(MUTATE_PODS_PATH, admission_route::<C>(Route::MutatePods))
        .route(VALIDATE_PODS_PATH, admission_route::<C>(Route::ValidatePods))
        .route(VALIDATE_CLAIMS_PATH, admission_route::<C>(Route::ValidateClaims))
        .route(MUTATE_VOLCANO_JOBS_PATH, admission_route::<C>(Route::MutateVolcanoJobs))
        .route(VALIDATE_VOLCANO_JOBS_PATH, admission_route::<C>(Route::ValidateVolcanoJobs))
        .route(vgpu_serve::http::HEALTHZ_PATH, get(|| async { "ok" }))
        .route(vgpu_serve::http::READYZ_PATH, get(|| async { "ok" }))
        .with_state(state)
}

async fn body_of<C>(
    state: &AppState<C>,
    headers: &HeaderMap,
    start: Option<Extension<RequestStart>>,
    body: Body,
) -> Result<axum::body::Bytes, Response> {
    read_body(headers, body, start.map(|Extension(s)| s), MAX_BODY_BYTES, state.read_timeout)
        .await
        .map_err(|e| (e.status(), format!("{e}\n")).into_response())
}

/// The admission routes, one handler for all ([`admission_route`]).
#[derive(Debug, Clone, Copy)]
enum Route {
    MutatePods,
    ValidatePods,
    ValidateClaims,
    MutateVolcanoJobs,
    ValidateVolcanoJobs,
}

/// `POST` of an admission route: the body read within the state's timeout, then the route's review.
fn admission_route<C: ClusterApi>(route: Route) -> MethodRouter<AppState<C>> {
    post(
        move |State(s): State<AppState<C>>,
              start: Option<Extension<RequestStart>>,
              headers: HeaderMap,
              body: Body| async move {
            let bytes = match body_of(&s, &headers, start, body).await {
                Ok(bytes) => bytes,
                Err(r) => return r,
            };
            let a = &s.admission;
            answer(match route {
                Route::MutatePods => a.mutate_pods(&bytes),
                Route::ValidatePods => a.validate_pods(&bytes).await,
                Route::ValidateClaims => a.validate_claims(&bytes).await,
                Route::MutateVolcanoJobs => a.mutate_volcano_jobs(&bytes).await,
                Route::ValidateVolcanoJobs => a.validate_volcano_jobs(&bytes).await,
            })
        },
    )
}

/// Serves [`router`] over TLS on an already bound `listener` until `shutdown` completes. The certificate files
/// are re-read while it runs (a rotated certificate is served without a restart).
pub async fn serve<C, F>(
    listener: TcpListener,
    admission: Arc<Admission<C>>,
    tls: &TlsFiles,
    timeouts: HttpTimeouts,
    shutdown: F,
) -> Result<(), ServerError>
where
    C: ClusterApi,
    F: Future<Output = ()> + Send,
{
    let tls = tls.start()?;
    let app = router(admission, timeouts.read_timeout);
    vgpu_serve::http::serve(listener, app, Some(tls.acceptor().clone()), &timeouts, shutdown).await;
    // Dropping `tls` stops its refreshers.
    drop(tls);
    Ok(())
}

/// Binds [`ServerConfig::bind_address`] and [`serve`]s until `shutdown` completes.
pub async fn run<C, F>(
    config: ServerConfig,
    admission: Arc<Admission<C>>,
    shutdown: F,
) -> Result<(), ServerError>
where
    C: ClusterApi,
    F: Future<Output = ()> + Send,
{
    // Load the certificate before binding, so a bad file fails before the port is taken.
    drop(config.tls.start()?);
    let listener = TcpListener::bind(config.bind_address)
        .await
        .map_err(|source| ServerError::Bind { addr: config.bind_address, source })?;
    serve(listener, admission, &config.tls, config.timeouts, shutdown).await
}

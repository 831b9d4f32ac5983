//! The probe and metrics routes every vgpu server carries, built in one place ([`ProbeRoutes`]): `/healthz`,
//! `/readyz`, `/metrics` and `/version`, as a stateless [`Router`] a component merges into its own.
//!
//! | route | answer |
//! |---|---|
//! | `GET /healthz` ([`HEALTHZ_PATH`]) | 200 `ok`, always (the process serves) |
//! | `GET /readyz` ([`READYZ_PATH`]) | 200 `ok` while the [`ProbeRoutes::ready_when`] check passes (always without one); else the check's [`NotReady`] status and message |
//! | `GET /metrics` ([`METRICS_PATH`]), with [`ProbeRoutes::metrics`] | 200 with the rendered page and its content type; 500 when rendering fails; with [`ProbeRoutes::metrics_authorizer`], 401/403 from the [`Authorizer`] first |
//! | `GET /version` ([`VERSION_PATH`]), with [`ProbeRoutes::version`] | 200, [`VersionInfo`] as JSON |
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicBool, Ordering};
//! use axum::body::Body;
//! use http::{Request, StatusCode};
//! use tower::ServiceExt as _;
//! use vgpu_serve::probes::{NotReady, ProbeRoutes};
//!
//! let synced = Arc::new(AtomicBool::new(false));
//! let flag = synced.clone();
//! let app = ProbeRoutes::new()
//!     .ready_when(move || {
//!         if flag.load(Ordering::Acquire) { Ok(()) } else { Err(NotReady::unavailable("caches not synced")) }
//!     })
//!     .metrics("text/plain; version=0.0.4; charset=utf-8", || Ok::<_, std::fmt::Error>("up 1\n".to_owned()))
//!     .version("my-component")
//!     .into_router();
//!
//! let rt = tokio::runtime::Builder::new_current_thread().build()?;
//! let get = |path: &str| {
//!     let app = app.clone();
//!     let request = Request::get(path).body(Body::empty()).unwrap();
//!     rt.block_on(async move { app.oneshot(request).await.unwrap().status() })
//! };
//! assert_eq!(get("/healthz"), StatusCode::OK);
//! assert_eq!(get("/readyz"), StatusCode::SERVICE_UNAVAILABLE);
//! synced.store(true, Ordering::Release);
//! assert_eq!(get("/readyz"), StatusCode::OK);
//! assert_eq!(get("/metrics"), StatusCode::OK);
//! assert_eq!(get("/version"), StatusCode::OK);
//! # Ok::<(), std::io::Error>(())
//! ```

use std::fmt::Display;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::authz::{Authorizer, NonResourceRequest};
use crate::http::{HEALTHZ_PATH, METRICS_PATH, READYZ_PATH, VERSION_PATH, VersionInfo};

/// Why a replica is not ready: the `/readyz` status and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotReady {
    /// The HTTP status (503 or 500).
    pub status: StatusCode,
    /// The body.
    pub message: String,
}

impl NotReady {
    /// Not ready with this status and message.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into() }
    }

    /// Not ready with 503 Service Unavailable.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }
}

type ReadyCheck = Arc<dyn Fn() -> Result<(), NotReady> + Send + Sync>;
type Render = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// Builder of the probe and metrics routes (module docs); [`into_router`](Self::into_router) gives the
/// [`Router`] to merge.
#[derive(Clone, Default)]
pub struct ProbeRoutes {
    ready: Option<ReadyCheck>,
    metrics: Option<(&'static str, Render)>,
    authorizer: Option<Arc<Authorizer>>,
    version: Option<&'static str>,
}

impl std::fmt::Debug for ProbeRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeRoutes")
            .field("ready_check", &self.ready.is_some())
            .field("metrics", &self.metrics.as_ref().map(|(content_type, _)| content_type))
            .field("authorizer", &self.authorizer.is_some())
            .field("version", &self.version)
            .finish()
    }
}

impl ProbeRoutes {
    /// `/healthz` and `/readyz`, both always `ok`.
    pub fn new() -> Self {
        Self::default()
    }

    /// `/readyz` answers `ok` only while `check` passes, else its [`NotReady`].
    pub fn ready_when(mut self, check: impl Fn() -> Result<(), NotReady> + Send + Sync + 'static) -> Self {
        self.ready = Some(Arc::new(check));
        self
    }

    /// `/metrics` serves what `render` returns, as `content_type` (500 with the error when it fails).
    pub fn metrics<E: Display>(
        mut self,
        content_type: &'static str,
        render: impl Fn() -> Result<String, E> + Send + Sync + 'static,
    ) -> Self {
        self.metrics = Some((content_type, Arc::new(move || render().map_err(|e| e.to_string()))));
        self
    }

    /// `/metrics` asks `authorizer` first (bearer token, `get` on the non-resource URL); `None` leaves it open.
    pub fn metrics_authorizer(mut self, authorizer: Option<Arc<Authorizer>>) -> Self {
        self.authorizer = authorizer;
        self
    }

    /// `/version` answers this build's [`VersionInfo`] as `component`.
    pub fn version(mut self, component: &'static str) -> Self {
        self.version = Some(component);
        self
    }

    /// The routes.
    pub fn into_router<S: Clone + Send + Sync + 'static>(self) -> Router<S> {
        let ready = self.ready;
        let mut router = Router::new().route(HEALTHZ_PATH, get(|| async { "ok" })).route(
            READYZ_PATH,
            get(move || {
                let outcome = ready.as_ref().map_or(Ok(()), |check| check());
                async move {
                    match outcome {
                        Ok(()) => (StatusCode::OK, "ok").into_response(),
                        Err(n) => (n.status, n.message).into_response(),
                    }
                }
            }),
        );
        if let Some((content_type, render)) = self.metrics {
            let authorizer = self.authorizer;
            router = router.route(
                METRICS_PATH,
                get(move |headers: HeaderMap| {
                    let render = Arc::clone(&render);
                    let authorizer = authorizer.clone();
                    async move { metrics_page(&headers, authorizer.as_deref(), content_type, &*render).await }
                }),
            );
        }
        if let Some(component) = self.version {
            router = router
                .route(VERSION_PATH, get(move || async move { axum::Json(VersionInfo::new(component)) }));
        }
        router
    }
}

async fn metrics_page(
    headers: &HeaderMap,
    authorizer: Option<&Authorizer>,
    content_type: &'static str,
    render: &(dyn Fn() -> Result<String, String> + Send + Sync),
) -> Response {
    if let Some(authz) = authorizer
        && let Err(denied) = authz.authorize(headers, &NonResourceRequest::get(METRICS_PATH)).await
    {
        return denied.response().map(Body::new);
    }
    match render() {
        Ok(page) => {
            let mut r = page.into_response();
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            r
        }
        Err(e) => {
            (StatusCode::INTERNAL_SERVER_ERROR, format!("encoding the metrics failed: {e}\n")).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::atomic::{AtomicBool, Ordering};

    use http::Request;
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;

    use super::*;
    use crate::authz::{MemoryReviewer, UserInfo};

    async fn call(app: &Router, path: &str, token: Option<&str>) -> (StatusCode, Option<String>, String) {
        let mut request = Request::get(path);
        if let Some(t) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let response = app.clone().oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
        let status = response.status();
        let content_type =
            response.headers().get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap().to_owned());
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, content_type, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn probes_metrics_and_version() {
        let bare = ProbeRoutes::new().into_router();
        assert_eq!(call(&bare, "/healthz", None).await.0, StatusCode::OK);
        assert_eq!(call(&bare, "/readyz", None).await.2, "ok");
        assert_eq!(call(&bare, "/metrics", None).await.0, StatusCode::NOT_FOUND, "no metrics unless asked");
        assert_eq!(call(&bare, "/version", None).await.0, StatusCode::NOT_FOUND);

        let ready = Arc::new(AtomicBool::new(false));
        let flag = ready.clone();
        let app = ProbeRoutes::new()
            .ready_when(move || {
                if flag.load(Ordering::Acquire) {
                    Ok(())
                } else {
                    Err(NotReady::new(StatusCode::INTERNAL_SERVER_ERROR, "not ready: follower\n"))
                }
            })
            .metrics("text/x-test", || Ok::<_, std::fmt::Error>("m 1\n".to_owned()))
            .version("probe-test")
            .into_router();
        let (status, _, body) = call(&app, "/readyz", None).await;
        assert_eq!((status, body.as_str()), (StatusCode::INTERNAL_SERVER_ERROR, "not ready: follower\n"));
        ready.store(true, Ordering::Release);
        assert_eq!(call(&app, "/readyz", None).await.0, StatusCode::OK);
        let (status, content_type, body) = call(&app, "/metrics", None).await;
        assert_eq!(
            (status, content_type.as_deref(), body.as_str()),
            (StatusCode::OK, Some("text/x-test"), "m 1\n")
        );
        let (_, _, body) = call(&app, "/version", None).await;
        assert!(body.contains("\"component\":\"probe-test\""), "{body}");

        let failing =
            ProbeRoutes::new().metrics("text/plain", || Err::<String, _>(std::fmt::Error)).into_router();
        assert_eq!(call(&failing, "/metrics", None).await.0, StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[tokio::test]
    async fn metrics_behind_the_authorizer() {
        let reviewer = Arc::new(MemoryReviewer::new());
        reviewer.add_token("prom", UserInfo::new("prometheus"));
        reviewer.add_token("other", UserInfo::new("other"));
        reviewer.allow("prometheus", "/metrics", "get");
        let app = ProbeRoutes::new()
            .metrics("text/plain", || Ok::<_, std::fmt::Error>(String::new()))
            .metrics_authorizer(Some(Arc::new(Authorizer::new(reviewer))))
            .into_router();
        assert_eq!(call(&app, "/metrics", None).await.0, StatusCode::UNAUTHORIZED);
        assert_eq!(call(&app, "/metrics", Some("other")).await.0, StatusCode::FORBIDDEN);
        assert_eq!(call(&app, "/metrics", Some("prom")).await.0, StatusCode::OK);
        assert_eq!(call(&app, "/healthz", None).await.0, StatusCode::OK, "probes stay open");
    }
}

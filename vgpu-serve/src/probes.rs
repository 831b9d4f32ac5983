//! The probe and metrics routes every vgpu server carries, built in one place ([`ProbeRoutes`]): `/healthz`,
//! `/readyz`, `/metrics` and `/version`, as a stateless [`Router`] a component merges into its own.
//!
//! | route | answer |
//! |---|---|
//! | `GET /healthz` ([`HEALTHZ_PATH`]) | 200 `ok`, always (the process serves) |
//! | `GET /readyz` ([`READYZ_PATH`]) | 200 `ok` while the [`ProbeRoutes::ready_when`] check passes (always without one); else the check's [`NotReady`] status and message |
//! | `GET /metrics` ([`METRICS_PATH`], or the path of [`ProbeRoutes::metrics_at`]), with [`ProbeRoutes::metrics`] | 200 with the rendered page and its content type; 500 when rendering fails; with [`ProbeRoutes::metrics_authorizer`], 401/403 from the [`Authorizer`] first (`get` on the metrics path) |
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

/// A metrics path that [`ProbeRoutes::metrics_at`] cannot serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid --metrics-path {path:?}: {reason}")]
pub struct MetricsPathError {
    /// The path given.
    pub path: String,
    /// What was expected.
    pub reason: &'static str,
}

/// Whether [`ProbeRoutes::metrics_at`] can serve the metrics page at `path` (a flag check before start-up):
/// it starts with `/`, is none of the probe paths, and no segment starts with `:` or `*`.
pub fn check_metrics_path(path: &str) -> Result<(), MetricsPathError> {
    let bad = |reason| MetricsPathError { path: path.to_owned(), reason };
    if !path.starts_with('/') {
        return Err(bad("must start with '/'"));
    }
    if [HEALTHZ_PATH, READYZ_PATH, VERSION_PATH].contains(&path) {
        return Err(bad("must differ from /healthz, /readyz and /version"));
    }
    if path.split('/').any(|segment| segment.starts_with(':') || segment.starts_with('*')) {
        return Err(bad("no path segment may start with ':' or '*'"));
    }
    Ok(())
}

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
    metrics_path: Option<String>,
    authorizer: Option<Arc<Authorizer>>,
    version: Option<&'static str>,
}

impl std::fmt::Debug for ProbeRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeRoutes")
            .field("ready_check", &self.ready.is_some())
            .field("metrics", &self.metrics.as_ref().map(|(content_type, _)| content_type))
            .field("metrics_path", &self.metrics_path())
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

    /// Serves the metrics page at `path` instead of [`METRICS_PATH`] (`--metrics-path`). Any path starting
    /// with `/` is matched literally (braces included), except the probe paths and a segment starting with
    /// `:` or `*` (which the router reads as a capture).
    pub fn metrics_at(mut self, path: &str) -> Result<Self, MetricsPathError> {
        check_metrics_path(path)?;
        self.metrics_path = Some(path.to_owned());
        Ok(self)
    }

    /// The path the metrics page is served at.
    pub fn metrics_path(&self) -> &str {
        self.metrics_path.as_deref().unwrap_or(METRICS_PATH)
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
        let path: Arc<str> = Arc::from(self.metrics_path());
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
            // Braces are escaped so that the path matches literally ([`Self::metrics_at`] rules out `:`/`*`).
            let pattern = path.replace('{', "{{").replace('}', "}}");
            router = router.route(
                &pattern,
                get(move |headers: HeaderMap| {
                    let render = Arc::clone(&render);
                    let authorizer = authorizer.clone();
                    let path = Arc::clone(&path);
                    async move {
                        metrics_page(&headers, authorizer.as_deref(), &path, content_type, &*render).await
                    }
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
    path: &str,
    content_type: &'static str,
    render: &(dyn Fn() -> Result<String, String> + Send + Sync),
) -> Response {
    if let Some(authz) = authorizer
        && let Err(denied) = authz.authorize(headers, &NonResourceRequest::get(path)).await
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

    #[tokio::test]
    async fn metrics_at_a_literal_path() {
        let reviewer = Arc::new(MemoryReviewer::new());
        reviewer.add_token("prom", UserInfo::new("prometheus"));
        reviewer.allow("prometheus", "/my{metrics}", "get");
        let app = ProbeRoutes::new()
            .metrics("text/plain", || Ok::<_, std::fmt::Error>("m 1\n".to_owned()))
            .metrics_at("/my{metrics}")
            .unwrap()
            .metrics_authorizer(Some(Arc::new(Authorizer::new(reviewer))))
            .into_router();
        assert_eq!(
            call(&app, "/my{metrics}", Some("prom")).await.0,
            StatusCode::OK,
            "reviewed on its own path"
        );
        assert_eq!(call(&app, "/my{metrics}", None).await.0, StatusCode::UNAUTHORIZED);
        assert_eq!(call(&app, "/myx", Some("prom")).await.0, StatusCode::NOT_FOUND, "braces are literal");
        assert_eq!(call(&app, "/metrics", Some("prom")).await.0, StatusCode::NOT_FOUND);

        for (bad, reason) in [
            ("metrics", "must start with '/'"),
            ("/readyz", "must differ from /healthz, /readyz and /version"),
            ("/version", "must differ from /healthz, /readyz and /version"),
            ("/a/:b", "no path segment may start with ':' or '*'"),
            ("/*all", "no path segment may start with ':' or '*'"),
        ] {
            let e = ProbeRoutes::new().metrics_at(bad).unwrap_err();
            assert_eq!(e.to_string(), format!("invalid --metrics-path {bad:?}: {reason}"));
        }
    }

    proptest::proptest! {
        /// Every accepted metrics path builds a router (no panic) that serves the page at exactly that path.
        #[test]
        fn accepted_metrics_paths_are_served_literally(tail in "[a-z{}:*._~-]{0,12}(/[a-z{}:*._~-]{0,6}){0,3}") {
            let path = format!("/{tail}");
            if let Ok(routes) = ProbeRoutes::new()
                .metrics("text/plain", || Ok::<_, std::fmt::Error>(String::new()))
                .metrics_at(&path)
            {
                let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
                let app = routes.into_router();
                let (status, _, _) = rt.block_on(call(&app, &path, None));
                proptest::prop_assert_eq!(status, StatusCode::OK, "{}", path);
            }
        }
    }
}

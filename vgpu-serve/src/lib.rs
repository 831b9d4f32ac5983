//! vgpu-serve: serving plumbing shared by the vgpu binaries (the extender today; the webhook and the device
//! monitor next), so that no component carries its own copy.
//!
//! | module | what it holds |
//! |---|---|
//! | [`tls`] | rustls (ring, ALPN `h2` then `http/1.1`) with a hot-reloaded certificate ([`tls::CertReloader`]) and optional client-certificate verification against a reloaded CA bundle ([`tls::ClientCaReloader`]) |
//! | [`http`] | the `serve` loop (HTTP/1.1, and HTTP/2 where a TLS client negotiates `h2`) with the upstream header/request timeouts, TLS accept and graceful shutdown; connection counts by protocol ([`http::ConnectionStats`]); body reading under a cap and the request deadline; `/version` info |
//! | [`probes`] | [`probes::ProbeRoutes`]: the one builder of `/healthz`, `/readyz` (with a readiness check), `/metrics` (a rendered page, optionally behind the [`authz::Authorizer`]) and `/version` that every server merges into its router |
//! | [`process_metrics`] | the Prometheus `process_*` collector (`/proc/self`) every binary's `/metrics` carries |
//! | [`pprof`] | `--pprof-bind-port`: CPU profiles at `/debug/pprof/profile?seconds=S` in pprof's gzip-compressed protobuf, as Go's `net/http/pprof` serves them ([`pprof::serve_pprof`]) |
//! | [`admission`] | `admission.k8s.io/v1` AdmissionReview decoding, the allowed/patched/denied answers ([`admission::respond`], [`admission::Denial`]), their wire JSON and HTTP answer ([`admission::answer`]), the body cap ([`admission::MAX_BODY_BYTES`]) |
//! | [`authz`] | bearer-token authorization of non-resource URLs (`/metrics`) by TokenReview + SubjectAccessReview, with a short decision cache ([`authz::Authorizer`]) over a [`authz::Reviewer`] seam ([`authz::KubeReviewer`], [`authz::MemoryReviewer`]) |
//!
//! # Example
//!
//! Who may scrape `/metrics`: a token the API server authenticates, of a user RBAC allows `get` on the
//! non-resource URL. Here with the in-memory reviewer; a server uses [`authz::KubeReviewer`].
//!
//! ```
//! use std::sync::Arc;
//! use http::{HeaderMap, HeaderValue, StatusCode, header};
//! use vgpu_serve::authz::{Authorizer, MemoryReviewer, NonResourceRequest, UserInfo};
//!
//! let reviewer = Arc::new(MemoryReviewer::new());
//! reviewer.add_token("t-prometheus", UserInfo::new("system:serviceaccount:monitoring:prometheus"));
//! reviewer.add_token("t-other", UserInfo::new("system:serviceaccount:default:other"));
//! reviewer.allow("system:serviceaccount:monitoring:prometheus", "/metrics", "get");
//! let authz = Authorizer::new(reviewer.clone());
//! let metrics = NonResourceRequest::get("/metrics");
//!
//! let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
//! let bearer = |token: &str| {
//!     let mut h = HeaderMap::new();
//!     h.insert(header::AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {token}")).unwrap());
//!     h
//! };
//! let user = rt.block_on(authz.authorize(&bearer("t-prometheus"), &metrics))?;
//! assert_eq!(user.username, "system:serviceaccount:monitoring:prometheus");
//! let denied = rt.block_on(authz.authorize(&HeaderMap::new(), &metrics)).unwrap_err();
//! assert_eq!(denied.status(), StatusCode::UNAUTHORIZED);
//! let denied = rt.block_on(authz.authorize(&bearer("t-unknown"), &metrics)).unwrap_err();
//! assert_eq!(denied.status(), StatusCode::UNAUTHORIZED);
//! let denied = rt.block_on(authz.authorize(&bearer("t-other"), &metrics)).unwrap_err();
//! assert_eq!(denied.status(), StatusCode::FORBIDDEN);
//! // The answer for an allowed token is cached: a second scrape asks the API server nothing.
//! let calls = reviewer.calls();
//! rt.block_on(authz.authorize(&bearer("t-prometheus"), &metrics))?;
//! assert_eq!(reviewer.calls(), calls);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod admission;
pub mod authz;
pub mod http;
pub mod pprof;
pub mod probes;
pub mod process_metrics;
pub mod tls;

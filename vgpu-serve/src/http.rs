//! HTTP/1.1 (and HTTP/2 for TLS clients that negotiate `h2`) serving with the upstream timeouts, optional TLS and
//! graceful shutdown: the one `serve` loop of every vgpu HTTP server (the extender, the device monitor, the admission
//! webhook, the kubelet plugin's endpoint).
//!
//! | piece | what it does |
//! |---|---|
//! | [`serve`] | accepts on a listener, TLS handshake under the header timeout, one task per connection, graceful drain at shutdown |
//! | [`serve_with_stats`] | [`serve`], counting connections by negotiated protocol in a [`ConnectionStats`] (exported as metrics) |
//! | [`RequestStart`] | request extension: when the first byte of the request arrived (the whole-request deadline counts from it) |
//! | [`VerifiedClientCert`] | request extension set when the TLS client presented a certificate the CA bundle verified |
//! | [`read_body`] | reads a body under a byte cap (declared `Content-Length` checked first) and the request's deadline |
//! | [`VersionInfo`] | the build's identity for `GET /version` |
//!
//! Defaults are vgpu-manager's (Go `http.Server`): headers within 15 s ([`DEFAULT_HEADER_READ_TIMEOUT`]), the
//! whole request within 60 s of its first byte ([`DEFAULT_READ_TIMEOUT`]), 10 s for open connections to
//! finish at shutdown ([`DEFAULT_SHUTDOWN_TIMEOUT`]). Idle time on a kept-alive connection between requests
//! does not count.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::Bytes;
use http::{HeaderMap, Request, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::service::Service as _;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;

pub use crate::tls::VerifiedClientCert;

/// Default time to receive a request's headers (`ReadHeaderTimeout`).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(15);
/// Default time to receive a whole request, body included (`ReadTimeout`).
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Default wait for open connections to finish after shutdown is asked.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// Health route.
pub const HEALTHZ_PATH: &str = "/healthz";
/// Readiness route.
pub const READYZ_PATH: &str = "/readyz";
/// Metrics route.
pub const METRICS_PATH: &str = "/metrics";
/// Version route.
pub const VERSION_PATH: &str = "/version";

/// The timeouts [`serve`] applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpTimeouts {
    /// Time to receive a request's headers (also bounds the TLS handshake).
    pub header_read_timeout: Duration,
    /// Time to receive a whole request, body included, from its first byte (enforced by [`read_body`]
    /// through [`RequestStart`]; headers never get longer than this either).
    pub read_timeout: Duration,
    /// Wait for open connections after shutdown is asked, before giving up on them.
    pub shutdown_timeout: Duration,
}

impl Default for HttpTimeouts {
    fn default() -> Self {
        Self {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            read_timeout: DEFAULT_READ_TIMEOUT,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
        }
    }
}

/// When the first byte of a request was read, set by [`serve`] as a request extension: the whole request must
/// arrive within [`HttpTimeouts::read_timeout`] of it. Without it (a router driven some other way) the body's
/// deadline counts from when the handler starts reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestStart(pub Instant);

/// Why a request body could not be read ([`read_body`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BodyError {
    /// The body (or its declared `Content-Length`) is larger than the cap: answer 413.
    #[error("request body exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The cap, bytes.
        limit: usize,
    },
    /// The body did not arrive within the read timeout of the request's first byte: answer 408.
    #[error("request body not received within {after:?} of the request's first byte")]
    Timeout {
        /// The read timeout.
        after: Duration,
    },
    /// The connection failed while the body was read: answer 400.
    #[error("reading the request body failed: {0}")]
    Read(String),
}

impl BodyError {
    /// The HTTP status that answers this error.
    pub fn status(&self) -> http::StatusCode {
        match self {
            BodyError::TooLarge { .. } => http::StatusCode::PAYLOAD_TOO_LARGE,
            BodyError::Timeout { .. } => http::StatusCode::REQUEST_TIMEOUT,
            BodyError::Read(_) => http::StatusCode::BAD_REQUEST,
        }
    }
}

/// Reads `body` whole: refused at once when `Content-Length` declares more than `limit` bytes, cut off when
/// more than `limit` arrive, and given up when it has not arrived `read_timeout` after `start` (the request's
/// first byte; now when `None`).
pub async fn read_body(
    headers: &HeaderMap,
    body: Body,
    start: Option<RequestStart>,
    limit: usize,
    read_timeout: Duration,
) -> Result<Bytes, BodyError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge { limit });
    }
    let start = start.map_or_else(Instant::now, |s| s.0);
    let deadline = tokio::time::Instant::from_std(start + read_timeout);
    match tokio::time::timeout_at(deadline, Limited::new(body, limit).collect()).await {
        Err(_) => Err(BodyError::Timeout { after: read_timeout }),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(BodyError::TooLarge { limit }),
        Ok(Err(e)) => Err(BodyError::Read(e.to_string())),
    }
}

/// The build's identity, served by `/version`. Git fields come from the `VGPU_GIT_COMMIT`,
/// `VGPU_GIT_TREE_STATE` and `VGPU_BUILD_DATE` environment variables at compile time, when set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionInfo {
    /// Component name.
    pub component: &'static str,
    /// Crate version.
    pub version: &'static str,
    /// Git commit, if known.
    pub git_commit: Option<&'static str>,
    /// `clean` or `dirty`, if known.
    pub git_tree_state: Option<&'static str>,
    /// Build date, if known.
    pub build_date: Option<&'static str>,
}

impl VersionInfo {
    /// This build, as `component`.
    pub fn new(component: &'static str) -> Self {
        Self {
            component,
            version: env!("CARGO_PKG_VERSION"),
            git_commit: option_env!("VGPU_GIT_COMMIT"),
            git_tree_state: option_env!("VGPU_GIT_TREE_STATE"),
            build_date: option_env!("VGPU_BUILD_DATE"),
        }
    }
}

// === impl ConnectionStats ===

/// The protocol a connection speaks, as the `protocol` and `tls` labels of [`ConnectionStats`].
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConnectionLabels {
    /// `http/1.1` or `h2`.
    protocol: &'static str,
    /// `true` when the connection is TLS.
    tls: &'static str,
}

/// A plain-HTTP connection.
const PLAIN_HTTP1: ConnectionLabels = ConnectionLabels { protocol: "http/1.1", tls: "false" };
/// A TLS connection whose client did not negotiate `h2`.
const TLS_HTTP1: ConnectionLabels = ConnectionLabels { protocol: "http/1.1", tls: "true" };
/// A TLS connection whose client negotiated `h2` (offered through ALPN only, never in clear text).
const TLS_H2: ConnectionLabels = ConnectionLabels { protocol: "h2", tls: "true" };
/// Every label set of [`ConnectionStats`].
const CONNECTION_KINDS: [ConnectionLabels; 3] = [PLAIN_HTTP1, TLS_HTTP1, TLS_H2];

/// Connections served by [`serve_with_stats`]: accepted ones by negotiated protocol, open ones, and failed TLS
/// handshakes. Clones share the counts. Registered in a server's registry ([`ConnectionStats::register`]) they
/// show how its clients connect: a Go client over plain HTTP/1.1 opens a connection per call in flight beyond
/// its idle pool (kube-scheduler's extender client keeps Go's default of 2 idle connections per host), one that
/// negotiated `h2` multiplexes every call on one connection.
#[derive(Clone, Default)]
pub struct ConnectionStats {
    accepted: Family<ConnectionLabels, Counter>,
    open: Gauge,
    failed_handshakes: Counter,
}

impl std::fmt::Debug for ConnectionStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionStats")
            .field("accepted", &self.accepted_total())
            .field("open", &self.open.get())
            .field("failed_handshakes", &self.failed_handshakes.get())
            .finish()
    }
}

impl ConnectionStats {
    /// New counts, every series at zero.
    pub fn new() -> Self {
        let stats = Self::default();
        for labels in &CONNECTION_KINDS {
            let _ = stats.accepted.get_or_create(labels);
        }
        stats
    }

    /// Registers the counts in `registry` (under its prefix): `http_connections_total{protocol, tls}` (accepted
    /// connections, by the protocol served: `http/1.1` or `h2`), `http_connections_open`, and
    /// `tls_handshake_failures_total`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "http_connections",
            "Connections accepted, by the protocol served (http/1.1, or h2 when the TLS client negotiated it)",
            self.accepted.clone(),
        );
        registry.register("http_connections_open", "Connections open now", self.open.clone());
        registry.register(
            "tls_handshake_failures",
            "TLS handshakes that failed or timed out",
            self.failed_handshakes.clone(),
        );
    }

    /// Connections accepted so far that served `protocol` (`http/1.1` or `h2`), with TLS or without.
    pub fn accepted(&self, protocol: &str, tls: bool) -> u64 {
        let tls = if tls { "true" } else { "false" };
        CONNECTION_KINDS
            .iter()
            .find(|k| k.protocol == protocol && k.tls == tls)
            .map_or(0, |k| self.accepted.get_or_create(k).get())
    }

    /// Connections accepted so far, every protocol.
    pub fn accepted_total(&self) -> u64 {
        CONNECTION_KINDS.iter().map(|k| self.accepted.get_or_create(k).get()).sum()
    }

    /// Connections open now.
    pub fn open(&self) -> i64 {
        self.open.get()
    }

    /// TLS handshakes that failed or timed out so far.
    pub fn failed_handshakes(&self) -> u64 {
        self.failed_handshakes.get()
    }

    fn served(&self, kind: &ConnectionLabels) {
        self.accepted.get_or_create(kind).inc();
    }
}

/// Counts a connection open from accept until its task ends.
struct OpenConnection(Gauge);

impl OpenConnection {
    fn new(open: &Gauge) -> Self {
        open.inc();
        Self(open.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

// === impl ConnClock ===

/// When the current request of a connection began: the first byte read after the previous request was
/// answered. Shared by the connection's [`StampedIo`] and its service.
#[derive(Debug)]
struct ConnClock {
    /// The connection's origin; `start_ns` counts from it.
    origin: Instant,
    start_ns: AtomicU64,
    /// The next byte read starts a request.
    armed: AtomicBool,
}

impl ConnClock {
    fn new() -> Self {
        Self { origin: Instant::now(), start_ns: AtomicU64::new(0), armed: AtomicBool::new(true) }
    }

    fn bytes_read(&self) {
        if self.armed.swap(false, Ordering::AcqRel) {
            let ns = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.start_ns.store(ns, Ordering::Release);
        }
    }

    /// The first byte of the request being served.
    fn request_start(&self) -> Instant {
        self.origin + Duration::from_nanos(self.start_ns.load(Ordering::Acquire))
    }

    /// The request was answered: the next byte read starts the next one.
    fn answered(&self) {
        self.armed.store(true, Ordering::Release);
    }
}

// === impl StampedIo ===

/// A connection's stream that stamps the first byte of each request on its [`ConnClock`].
struct StampedIo<S> {
    inner: S,
    clock: Arc<ConnClock>,
}

impl<S: AsyncRead + Unpin> AsyncRead for StampedIo<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.clock.bytes_read();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for StampedIo<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

// === serve ===

/// The two connection builders of [`serve`]: HTTP/1.1, and HTTP/2 for TLS connections that negotiated `h2`.
#[derive(Clone)]
struct Builders {
    http1: hyper::server::conn::http1::Builder,
    http2: hyper::server::conn::http2::Builder<TokioExecutor>,
}

/// Concurrent streams an HTTP/2 client may open on one connection (kube-scheduler sends one call per pod
/// and node batch; the Go default is 250 as well).
const MAX_CONCURRENT_STREAMS: u32 = 250;

impl Builders {
    fn new(timeouts: &HttpTimeouts) -> Self {
        let mut http1 = hyper::server::conn::http1::Builder::new();
        let header_timeout = timeouts.header_read_timeout.min(timeouts.read_timeout);
        http1.timer(TokioTimer::new()).header_read_timeout(header_timeout);
        let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        // A peer that stops answering pings within the header timeout is gone: its connection closes.
        http2
            .timer(TokioTimer::new())
            .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
            .keep_alive_interval(Some(timeouts.header_read_timeout))
            .keep_alive_timeout(timeouts.header_read_timeout);
        Self { http1, http2 }
    }
}

/// Serves one HTTP/1.1 connection: `app` with each request's [`RequestStart`] (the first byte of the
/// request), under the builder's header timeout.
async fn serve_connection<S>(
    stream: S,
    peer: SocketAddr,
    client_cert: Option<VerifiedClientCert>,
    app: Router,
    builder: hyper::server::conn::http1::Builder,
    watcher: hyper_util::server::graceful::Watcher,
) -> Result<(), hyper::Error>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let clock = Arc::new(ConnClock::new());
    let io = TokioIo::new(StampedIo { inner: stream, clock: clock.clone() });
    let inner = TowerToHyperService::new(app);
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(RequestStart(clock.request_start()));
        req.extensions_mut().insert(ConnectInfo(peer));
        if let Some(cert) = &client_cert {
            req.extensions_mut().insert(cert.clone());
        }
        let answer = inner.call(req);
        let clock = clock.clone();
        async move {
            let response = answer.await;
            clock.answered();
            response
        }
    });
    watcher.watch(builder.serve_connection(io, service)).await
}

/// Serves one HTTP/2 connection: requests are multiplexed, so each one's [`RequestStart`] is when its
/// headers arrived (a stream's header frames come whole).
async fn serve_h2_connection<S>(
    stream: S,
    peer: SocketAddr,
    client_cert: Option<VerifiedClientCert>,
    app: Router,
    builder: hyper::server::conn::http2::Builder<TokioExecutor>,
    watcher: hyper_util::server::graceful::Watcher,
) -> Result<(), hyper::Error>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let inner = TowerToHyperService::new(app);
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(RequestStart(Instant::now()));
        req.extensions_mut().insert(ConnectInfo(peer));
        if let Some(cert) = &client_cert {
            req.extensions_mut().insert(cert.clone());
        }
        inner.call(req)
    });
    watcher.watch(builder.serve_connection(TokioIo::new(stream), service)).await
}

/// Serves `app` on `listener` until `shutdown` completes, then stops accepting, lets open connections finish
/// (up to [`HttpTimeouts::shutdown_timeout`]) and returns.
///
/// HTTP/1.1, and HTTP/2 on TLS connections whose client negotiated `h2` through ALPN
/// ([`crate::tls::ALPN_PROTOCOLS`]): one multiplexed connection serves all of a Go client's calls
/// (kube-scheduler's extender client, kube-apiserver's webhook client), where HTTP/1.1 opens one per call
/// in flight. HTTP/1.1 headers must arrive within [`HttpTimeouts::header_read_timeout`] (the TLS handshake
/// too; an HTTP/2 peer must answer pings within it), and each request gets a [`RequestStart`] extension from
/// which [`read_body`] counts [`HttpTimeouts::read_timeout`]. With `tls`, connections are TLS (see
/// [`crate::tls::TlsFiles::start`]),
/// and the requests of a connection whose client presented a verified certificate carry it as a
/// [`VerifiedClientCert`] extension. Every request carries its connection's peer address as an
/// [`axum::extract::ConnectInfo`]`<SocketAddr>` extension (so handlers and middleware may extract it). Accept errors and failed handshakes are logged and never stop the server.
pub async fn serve<F>(
    listener: TcpListener,
    app: Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    timeouts: &HttpTimeouts,
    shutdown: F,
) where
    F: Future<Output = ()> + Send,
{
    serve_with_stats(listener, app, tls, timeouts, &ConnectionStats::default(), shutdown).await;
}

/// [`serve`], counting the connections it accepts, serves and fails to shake hands with in `stats`.
pub async fn serve_with_stats<F>(
    listener: TcpListener,
    app: Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    timeouts: &HttpTimeouts,
    stats: &ConnectionStats,
    shutdown: F,
) where
    F: Future<Output = ()> + Send,
{
    let graceful = GracefulShutdown::new();
    let builders = Builders::new(timeouts);
    let handshake_timeout = timeouts.header_read_timeout;
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let builders = builders.clone();
        let watcher = graceful.watcher();
        let tls = tls.clone();
        let stats = stats.clone();
        let open = OpenConnection::new(&stats.open);
        tokio::spawn(async move {
            let _open = open;
            let served = match tls {
                None => {
                    stats.served(&PLAIN_HTTP1);
                    serve_connection(stream, peer, None, app, builders.http1, watcher).await
                }
                Some(acceptor) => {
                    match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(tls_stream)) => {
                            let session = tls_stream.get_ref().1;
                            let cert = VerifiedClientCert::from_connection(session);
                            if session.alpn_protocol() == Some(b"h2".as_slice()) {
                                stats.served(&TLS_H2);
                                serve_h2_connection(tls_stream, peer, cert, app, builders.http2, watcher)
                                    .await
                            } else {
                                stats.served(&TLS_HTTP1);
                                serve_connection(tls_stream, peer, cert, app, builders.http1, watcher).await
                            }
                        }
                        Ok(Err(e)) => {
                            stats.failed_handshakes.inc();
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            stats.failed_handshakes.inc();
                            tracing::debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    }
                }
            };
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(timeouts.shutdown_timeout) => {
            tracing::warn!(timeout = ?timeouts.shutdown_timeout, "connections still open at shutdown; closing them");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use axum::routing::post;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn version_info_serializes_camel_case() {
        let v = serde_json::to_value(VersionInfo::new("vgpu-test")).unwrap();
        assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
        assert_eq!(v["component"], "vgpu-test");
        assert!(v.get("gitCommit").is_some());
    }

    #[tokio::test]
    async fn read_body_caps_size_and_checks_the_declared_length() {
        let mut headers = HeaderMap::new();
        let got = read_body(&headers, Body::from("abc"), None, 3, Duration::from_secs(1)).await.unwrap();
        assert_eq!(&got[..], b"abc");
        let e = read_body(&headers, Body::from("abcd"), None, 3, Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(e, BodyError::TooLarge { limit: 3 });
        assert_eq!(e.status(), http::StatusCode::PAYLOAD_TOO_LARGE);
        headers.insert(header::CONTENT_LENGTH, http::HeaderValue::from_static("99"));
        let e = read_body(&headers, Body::from("a"), None, 3, Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(e, BodyError::TooLarge { limit: 3 });
    }

    #[tokio::test]
    async fn read_body_deadline_counts_from_the_request_start() {
        let long_ago = RequestStart(Instant::now().checked_sub(Duration::from_secs(5)).unwrap());
        // A body that never ends.
        let (_tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        let e =
            read_body(&HeaderMap::new(), body, Some(long_ago), 10, Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(e.status(), http::StatusCode::REQUEST_TIMEOUT);
    }

    #[tokio::test]
    async fn serve_answers_and_stops_on_shutdown() {
        let app = Router::new().route(
            "/echo",
            post(|headers: HeaderMap, start: axum::Extension<RequestStart>, body: Body| async move {
                read_body(&headers, body, Some(*start), 1024, Duration::from_secs(5)).await.unwrap()
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let stopped = stop.clone().cancelled_owned();
        let server = tokio::spawn(async move {
            serve(listener, app, None, &HttpTimeouts::default(), stopped).await;
        });
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(
            b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello",
        )
        .await
        .unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("hello"), "{answer}");
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
    }
}

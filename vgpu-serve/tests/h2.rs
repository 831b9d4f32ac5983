//! [`vgpu_serve::http::serve`] over TLS speaks HTTP/2 to a client that negotiates `h2` (as kube-scheduler's
//! and kube-apiserver's Go clients do) and HTTP/1.1 to one that offers `http/1.1` alone or no ALPN: real
//! TLS on loopback, several requests multiplexed on one HTTP/2 connection, each with its `RequestStart`; the
//! connections counted by protocol in a [`ConnectionStats`].
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/test_ca.rs"]
mod test_ca;

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::{Extension, Router, body::Body, routing::post};
use bytes::Bytes;
use http::{HeaderMap, Request, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use test_ca::TestCa;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector, client::TlsStream};
use vgpu_serve::http::{ConnectionStats, HttpTimeouts, RequestStart, read_body, serve_with_stats};
use vgpu_serve::tls::{CertReloader, server_config};

/// Serves `POST /echo` (answers `<version> <body>`) with a certificate of `ca` until the test ends, counting
/// its connections in the returned stats.
async fn start(ca: &TestCa) -> (SocketAddr, ConnectionStats) {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = ca.leaf("localhost", true);
    std::fs::write(dir.path().join("tls.crt"), cert).unwrap();
    std::fs::write(dir.path().join("tls.key"), key).unwrap();
    let reloader =
        Arc::new(CertReloader::load(dir.path().join("tls.crt"), dir.path().join("tls.key")).unwrap());
    let acceptor = TlsAcceptor::from(server_config(reloader).unwrap());
    let app = Router::new().route(
        "/echo",
        post(|version: Version, headers: HeaderMap, start: Extension<RequestStart>, body: Body| async move {
            let body = read_body(&headers, body, Some(*start), 1024, Duration::from_secs(5)).await.unwrap();
            format!("{version:?} {}", String::from_utf8_lossy(&body))
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stats = ConnectionStats::new();
    let counted = stats.clone();
    tokio::spawn(async move {
        let _dir = dir;
        let pending = std::future::pending();
        serve_with_stats(listener, app, Some(acceptor), &HttpTimeouts::default(), &counted, pending).await;
    });
    (addr, stats)
}

/// Waits until no connection is open (a closed connection's task ends soon after its peer goes).
async fn until_none_open(stats: &ConnectionStats) {
    for _ in 0..200 {
        if stats.open() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("connections still open: {stats:?}");
}

async fn connect(ca: &TestCa, addr: SocketAddr, alpn: &[&[u8]]) -> TlsStream<TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(vgpu_serve::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(addr).await.unwrap();
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap()
}

fn echo(text: &str) -> Request<Full<Bytes>> {
    Request::post("https://localhost/echo").body(Full::new(Bytes::from(text.to_owned()))).unwrap()
}

#[tokio::test]
async fn an_h2_client_multiplexes_its_requests_on_one_connection() {
    let ca = TestCa::new("h2 CA");
    let (addr, stats) = start(&ca).await;
    let tls = connect(&ca, addr, &[b"h2", b"http/1.1"]).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(b"h2".as_slice()));
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await.unwrap();
    tokio::spawn(conn);
    // All in flight at once, on the one connection.
    let calls: Vec<_> = (0..8)
        .map(|i| {
            let mut sender = sender.clone();
            tokio::spawn(async move {
                let response = sender.send_request(echo(&format!("call {i}"))).await.unwrap();
                assert_eq!(response.version(), Version::HTTP_2);
                String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
            })
        })
        .collect();
    for (i, call) in calls.into_iter().enumerate() {
        assert_eq!(call.await.unwrap(), format!("HTTP/2.0 call {i}"));
    }
    // Eight calls, one connection.
    assert_eq!((stats.accepted("h2", true), stats.accepted_total()), (1, 1), "{stats:?}");
    assert_eq!(stats.open(), 1);
    drop(sender);
    until_none_open(&stats).await;
}

#[tokio::test]
async fn http11_clients_still_get_http11() {
    let ca = TestCa::new("h1 CA");
    let (addr, stats) = start(&ca).await;
    for alpn in [&[b"http/1.1".as_slice()][..], &[]] {
        let tls = connect(&ca, addr, alpn).await;
        assert_eq!(tls.get_ref().1.alpn_protocol(), alpn.first().copied());
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.unwrap();
        tokio::spawn(conn);
        let mut request = echo("one");
        request.headers_mut().insert("host", "localhost".parse().unwrap());
        let response = sender.send_request(request).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"HTTP/1.1 one");
    }
    assert_eq!((stats.accepted("http/1.1", true), stats.accepted_total()), (2, 2), "{stats:?}");
    until_none_open(&stats).await;
}

#[tokio::test]
async fn failed_handshakes_are_counted_and_close() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ca = TestCa::new("bad CA");
    let (addr, stats) = start(&ca).await;
    // Plain HTTP to a TLS port: the handshake fails, the connection closes.
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
    let mut rest = Vec::new();
    let _ = tcp.read_to_end(&mut rest).await;
    until_none_open(&stats).await;
    assert_eq!((stats.failed_handshakes(), stats.accepted_total()), (1, 0), "{stats:?}");
    // The series are registered under the registry's prefix, every kind from zero.
    let mut registry = prometheus_client::registry::Registry::with_prefix("test");
    stats.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for line in [
        r#"test_http_connections_total{protocol="h2",tls="true"} 0"#,
        r#"test_http_connections_total{protocol="http/1.1",tls="false"} 0"#,
        "test_http_connections_open 0",
        "test_tls_handshake_failures_total 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
    }
}

//! An HTTPS client for tests of our servers on loopback: trusts one [`TestCa`](crate::test_ca::TestCa),
//! sends one request per connection (HTTP/1.1, `Host: localhost`, optional bearer token) and returns the
//! status and body. Included with `#[path]` by the crates whose tests call an HTTPS server (the test file
//! declares `mod test_ca;` first).

use std::{net::SocketAddr, sync::Arc};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::test_ca::TestCa;

/// A TLS connector trusting `ca` only, with the provider our servers use.
pub fn connector(ca: &TestCa) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(vgpu_serve::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

/// One request; `Err` names the step that failed (connect, handshake, request, body).
pub async fn try_call(
    connector: &TlsConnector,
    addr: SocketAddr,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> Result<(StatusCode, String), String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    let tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.map_err(|e| format!("http: {e}"))?;
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost")
        .header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req.body(Full::new(Bytes::copy_from_slice(body))).map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| format!("request: {e}"))?;
    let status = resp.status();
    let body = resp.into_body().collect().await.map_err(|e| format!("body: {e}"))?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

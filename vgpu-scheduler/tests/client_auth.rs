#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

//! Callers are authenticated (issue #15 item 3), over loopback HTTPS with the real [`run`]:
//!
//! * with a client CA bundle, a client with a certificate of that CA filters and binds; an anonymous client
//!   finishes the handshake (probes) but is refused with 401 before its bind body is read; a certificate of
//!   another CA fails the handshake; with [`ClientAuth::Required`] an anonymous client fails the handshake;
//! * with `/metrics` authorization, no token is 401, a token not allowed is 403, an allowed one 200.

#[path = "../../vgpu-serve/tests/support/test_ca.rs"]
mod test_ca;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};
use test_ca::TestCa;
use tokio::net::TcpStream;
use tokio_rustls::{TlsConnector, rustls};
use tokio_util::sync::CancellationToken;
use vgpu_core::clock::ManualClock;
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{NodeDeviceInventory, NodeVgpuConfig};
use vgpu_lease::Readiness;
use vgpu_scheduler::fixture::{vgpu_node, vgpu_pod};
use vgpu_scheduler::server::{AppState, ServerConfig, run};
use vgpu_scheduler::{Extender, ExtenderConfig, MemoryCluster, Metrics, Pod};
use vgpu_serve::authz::{Authorizer, MemoryReviewer, UserInfo};
use vgpu_serve::tls::{ClientAuth, TlsFiles};

/// A client trusting `server_ca`, presenting a certificate of `client_ca` if any.
fn connector(server_ca: &TestCa, client_ca: Option<&TestCa>) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(server_ca.pem.as_bytes()).unwrap()).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(vgpu_serve::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let (cert, key) = ca.leaf("system:kube-scheduler", false);
            let cert = CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
            builder
                .with_client_auth_cert(vec![cert], PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap())
                .unwrap()
        }
    };
    TlsConnector::from(Arc::new(config))
}

/// One request over a fresh TLS connection: the status and body, or the error (handshake refused).
async fn call(
    connector: &TlsConnector,
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: Option<&Value>,
    token: Option<&str>,
) -> Result<(StatusCode, String), String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let mut req = Request::builder().method(method).uri(path).header("host", "localhost");
    if let Some(token) = token {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
    let req = req.header("content-type", "application/json").body(Full::new(body)).unwrap();
    // TLS 1.3: a refused client certificate shows as an error on the first exchange.
    let resp = sender.send_request(req).await.map_err(|e| format!("request: {e}"))?;
    let status = resp.status();
    let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn pod_json(p: &Pod) -> Value {
    let containers: Vec<Value> = p
        .spec
        .containers
        .iter()
        .map(|c| json!({"name": c.name, "image": "cuda", "resources": {"limits": c.limits, "requests": c.limits}}))
        .collect();
    json!({
        "metadata": {"name": p.name, "namespace": p.namespace, "uid": p.uid, "annotations": p.annotations},
        "spec": {"containers": containers},
        "status": {"phase": "Pending"}
    })
}

struct Server {
    addr: SocketAddr,
    cluster: MemoryCluster,
    d: ResourceDomain,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// [`run`] on a free loopback port with `tls` and, if given, `/metrics` authorization.
async fn start(tls: TlsFiles, metrics_authz: Option<Arc<Authorizer>>) -> Server {
    let d = ResourceDomain::default();
    let cluster = MemoryCluster::new();
    let inv = NodeDeviceInventory::uniform(2, 16384, 4);
    cluster.upsert_node(vgpu_node("n0", &inv, &NodeVgpuConfig::default(), None, &d).unwrap());
    let metrics = Arc::new(Metrics::new());
    let ext = Arc::new(
        Extender::new(
            cluster.clone(),
            Arc::new(ManualClock::new(1_700_000_000_000_000_000)),
            ExtenderConfig::default(),
        )
        .with_observer(metrics.clone()),
    );
    ext.attach();
    ext.sync().await.unwrap();
    let mut state = AppState::new(ext, Readiness::ready(), metrics);
    if let Some(authz) = metrics_authz {
        state = state.with_metrics_authz(authz);
    }
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let config = ServerConfig { bind_address: addr, tls: Some(tls), ..ServerConfig::default() };
    assert_eq!(config.client_auth(), config.tls.as_ref().unwrap().client_ca.is_some());
    let stop = CancellationToken::new();
    let stopped = stop.clone().cancelled_owned();
    let task = tokio::spawn(async move {
        run(config, state, stopped).await.unwrap();
    });
    for _ in 0..100 {
        if TcpStream::connect(addr).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Server { addr, cluster, d, stop, task }
}

impl Server {
    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.task).await.unwrap().unwrap();
    }
}

struct Pki {
    server_ca: TestCa,
    client_ca: TestCa,
    other_ca: TestCa,
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Self {
        let (server_ca, client_ca, other_ca) =
            (TestCa::new("server CA"), TestCa::new("client CA"), TestCa::new("other CA"));
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = server_ca.leaf("vgpu-scheduler-extender", true);
        std::fs::write(dir.path().join("tls.crt"), cert).unwrap();
        std::fs::write(dir.path().join("tls.key"), key).unwrap();
        std::fs::write(dir.path().join("client-ca.crt"), &client_ca.pem).unwrap();
        Self { server_ca, client_ca, other_ca, dir }
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        Path::new(self.dir.path()).join(name)
    }

    fn files(&self, mode: ClientAuth) -> TlsFiles {
        TlsFiles::new(self.path("tls.crt"), self.path("tls.key"))
            .with_client_ca(self.path("client-ca.crt"), mode)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_bind_is_refused_and_the_client_certificate_binds() {
    let pki = Pki::new();
    let s = start(pki.files(ClientAuth::Optional), None).await;
    let pod = s.cluster.upsert_pod(vgpu_pod("u1", 1, 50, 4096, &[], &s.d));
    let (trusted, anonymous, intruder) = (
        connector(&pki.server_ca, Some(&pki.client_ca)),
        connector(&pki.server_ca, None),
        connector(&pki.server_ca, Some(&pki.other_ca)),
    );
    let bind = json!({"PodName": pod.name, "PodNamespace": pod.namespace, "PodUID": pod.uid, "Node": "n0"});
    let filter = json!({"Pod": pod_json(&pod), "Nodes": null, "NodeNames": ["n0"]});

    // Anonymous: the probes answer; everything else is 401, the bind before its body is read.
    for path in ["/healthz", "/readyz"] {
        let (status, body) = call(&anonymous, s.addr, Method::GET, path, None, None).await.unwrap();
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"), "{path}");
    }
    for (method, path, body) in [
        (Method::POST, vgpu_scheduler::BIND_PATH, Some(&bind)),
        (Method::POST, vgpu_scheduler::FILTER_PATH, Some(&filter)),
        (Method::GET, "/metrics", None),
        (Method::GET, "/version", None),
        (Method::GET, "/nope", None),
    ] {
        let (status, text) = call(&anonymous, s.addr, method, path, body, None).await.unwrap();
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}: {text}");
        assert!(text.contains("client certificate"), "{text}");
    }
    assert!(
        s.cluster.pod("default", &pod.name).unwrap().node_name.is_none(),
        "the anonymous bind did nothing"
    );

    // Another CA's certificate: refused in the handshake.
    let e = call(&intruder, s.addr, Method::POST, vgpu_scheduler::BIND_PATH, Some(&bind), None)
        .await
        .unwrap_err();
    assert!(e.starts_with("handshake") || e.starts_with("request"), "refused at the TLS layer: {e}");
    assert!(
        s.cluster.pod("default", &pod.name).unwrap().node_name.is_none(),
        "the intruder's bind did nothing"
    );

    // kube-scheduler's certificate: filter, then bind.
    let (status, text) =
        call(&trusted, s.addr, Method::POST, vgpu_scheduler::FILTER_PATH, Some(&filter), None).await.unwrap();
    assert_eq!(status, StatusCode::OK, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["NodeNames"], json!(["n0"]), "{text}");
    let (status, text) =
        call(&trusted, s.addr, Method::POST, vgpu_scheduler::BIND_PATH, Some(&bind), None).await.unwrap();
    assert_eq!(
        (status, serde_json::from_str::<Value>(&text).unwrap()["Error"].clone()),
        (StatusCode::OK, json!(""))
    );
    assert_eq!(s.cluster.pod("default", &pod.name).unwrap().node_name.as_deref(), Some("n0"));
    let (status, text) = call(&trusted, s.addr, Method::GET, "/metrics", None, None).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("vgpu_scheduler_"), "{text:.200}");
    // Every call above came on its own connection: 7 anonymous, 3 trusted (this one included), all HTTP/1.1
    // over TLS; two handshakes failed: the intruder's, and `start`'s probe that connects and hangs up.
    for line in [
        r#"vgpu_scheduler_http_connections_total{protocol="http/1.1",tls="true"} 10"#,
        r#"vgpu_scheduler_http_connections_total{protocol="h2",tls="true"} 0"#,
        "vgpu_scheduler_tls_handshake_failures_total 2",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_client_certificates_refuse_anonymous_handshakes() {
    let pki = Pki::new();
    let s = start(pki.files(ClientAuth::Required), None).await;
    let anonymous = connector(&pki.server_ca, None);
    let bind = json!({"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "n0"});
    let e = call(&anonymous, s.addr, Method::POST, vgpu_scheduler::BIND_PATH, Some(&bind), None)
        .await
        .unwrap_err();
    assert!(e.starts_with("handshake") || e.starts_with("request"), "refused at the TLS layer: {e}");
    let trusted = connector(&pki.server_ca, Some(&pki.client_ca));
    let (status, _) = call(&trusted, s.addr, Method::GET, "/healthz", None, None).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_an_allowed_bearer_token() {
    let pki = Pki::new();
    let reviewer = Arc::new(MemoryReviewer::new());
    reviewer.add_token("t-prom", UserInfo::new("system:serviceaccount:monitoring:prometheus"));
    reviewer.add_token("t-nobody", UserInfo::new("system:serviceaccount:default:nobody"));
    reviewer.allow("system:serviceaccount:monitoring:prometheus", "/metrics", "get");
    let s = start(pki.files(ClientAuth::Optional), Some(Arc::new(Authorizer::new(reviewer.clone())))).await;
    // Prometheus presents a token, not a client certificate.
    let anonymous = connector(&pki.server_ca, None);
    let get = |token: Option<&'static str>| call(&anonymous, s.addr, Method::GET, "/metrics", None, token);

    let (status, text) = get(None).await.unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{text}");
    let (status, text) = get(Some("t-unknown")).await.unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{text}");
    let (status, text) = get(Some("t-nobody")).await.unwrap();
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    assert!(text.contains("user=system:serviceaccount:default:nobody, verb=get, path=/metrics"), "{text}");
    let (status, text) = get(Some("t-prom")).await.unwrap();
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.contains("vgpu_scheduler_"));
    // The token does not open the verbs: they still need the client certificate.
    let (status, _) = call(&anonymous, s.addr, Method::GET, "/version", None, Some("t-prom")).await.unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // A client certificate is not enough for /metrics under token authorization.
    let trusted = connector(&pki.server_ca, Some(&pki.client_ca));
    let (status, _) = call(&trusted, s.addr, Method::GET, "/metrics", None, None).await.unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    s.stop().await;
}

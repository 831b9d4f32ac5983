//! The webhook server over real HTTPS on loopback (`server::serve` with `vgpu_serve` TLS): probes, an
//! AdmissionReview answered with a patch, a malformed body answered 400 with the reason, a converted pod's
//! claims created through `/pods/validate`, plain HTTP refused, a rotated certificate served without a
//! restart, a graceful stop, and a Volcano Job converted through `/volcano-jobs/mutate` whose
//! ResourceClaimTemplates `/volcano-jobs/validate` creates.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../vgpu-serve/tests/support/https_client.rs"]
mod https_client;
#[path = "../../vgpu-serve/tests/support/test_ca.rs"]
mod test_ca;

/// One request without a token (`https_client::try_call`).
async fn call(
    connector: &TlsConnector,
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: &[u8],
) -> Result<(StatusCode, String), String> {
    https_client::try_call(connector, addr, method, path, None, body).await
}

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use https_client::connector;
use hyper::{Method, StatusCode};
use serde_json::{Value, json};
use test_ca::TestCa;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;
use tokio_util::sync::CancellationToken;
use vgpu_kube::claims::MemoryApi;
use vgpu_serve::http::HttpTimeouts;
use vgpu_serve::tls::TlsFiles;
use vgpu_webhook::admit::Admission;
use vgpu_webhook::config::WebhookConfig;

fn write_leaf(ca: &TestCa, dir: &Path) {
    let (cert, key) = ca.leaf("vgpu-webhook", true);
    // Key first, then certificate: the reloader keeps the old pair until both match.
    std::fs::write(dir.join("tls.key"), key).unwrap();
    std::fs::write(dir.join("tls.crt"), cert).unwrap();
}

struct Server {
    addr: SocketAddr,
    api: MemoryApi,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

async fn start(dir: &Path, config: WebhookConfig) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let api = MemoryApi::new();
    let admission = Arc::new(Admission::new(config, api.clone()));
    let tls = TlsFiles {
        refresh_interval: Duration::from_millis(50),
        ..TlsFiles::new(dir.join("tls.crt"), dir.join("tls.key"))
    };
    let stop = CancellationToken::new();
    let stopped = stop.clone().cancelled_owned();
    let task = tokio::spawn(async move {
        vgpu_webhook::server::serve(listener, admission, &tls, HttpTimeouts::default(), stopped)
            .await
            .unwrap();
    });
    Server { addr, api, stop, task }
}

fn review(operation: &str, pod: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-9", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": operation, "userInfo": {}, "namespace": "ml", "name": "web", "object": pod}}))
    .unwrap()
}

fn vgpu_pod() -> Value {
    json!({"metadata": {"name": "web", "namespace": "ml"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/vgpu-number": "1"}}}]}})
}

#[tokio::test]
async fn routes_over_https() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("webhook-ca");
    write_leaf(&ca, dir.path());
    let config = WebhookConfig { convert_to_dra: true, ..WebhookConfig::default() };
    let server = start(dir.path(), config.clone()).await;
    let tls = connector(&ca);

    for path in ["/healthz", "/readyz"] {
        assert_eq!(
            call(&tls, server.addr, Method::GET, path, b"").await.unwrap(),
            (StatusCode::OK, "ok".to_owned())
        );
    }

    let (status, body) =
        call(&tls, server.addr, Method::POST, "/pods/mutate", &review("CREATE", vgpu_pod())).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["kind"], "AdmissionReview");
    assert_eq!(
        (answer["response"]["uid"].clone(), answer["response"]["allowed"].clone()),
        (json!("u-9"), json!(true))
    );
    let patch: Vec<u8> = base64_patch(&answer["response"]["patch"]);
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    let mut pod = vgpu_pod();
    json_patch::patch(&mut pod, &patch).unwrap();
    assert!(pod["metadata"]["annotations"]["vgpu-manager.io/original-resources"].is_string(), "{pod}");

    // The converted pod through /pods/validate: its claim is created.
    let (status, body) =
        call(&tls, server.addr, Method::POST, "/pods/validate", &review("CREATE", pod)).await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["response"]["allowed"], true);
    assert_eq!(server.api.claims().len(), 1);

    for (path, bad, reason) in [
        ("/pods/mutate", &b"{"[..], "malformed AdmissionReview: EOF while parsing an object"),
        (
            "/pods/validate",
            b"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\"}",
            "malformed AdmissionReview: no request",
        ),
        ("/resourceclaims/validate", b"[]", "malformed AdmissionReview: invalid type: sequence"),
    ] {
        let (status, body) = call(&tls, server.addr, Method::POST, path, bad).await.unwrap();
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
        assert!(body.starts_with(reason), "{path}: {body}");
    }
    let (status, _) = call(&tls, server.addr, Method::GET, "/pods/mutate", b"").await.unwrap();
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);

    // Plain HTTP gets no HTTP answer.
    let mut plain = TcpStream::connect(server.addr).await.unwrap();
    plain.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n").await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut buf)).await;
    assert!(!String::from_utf8_lossy(&buf).contains("200 OK"));

    server.stop.cancel();
    tokio::time::timeout(Duration::from_secs(15), server.task).await.unwrap().unwrap();
}

fn job_review(operation: &str, job: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-10", "kind": {"group": "batch.volcano.sh", "version": "v1alpha1", "kind": "Job"},
        "resource": {"group": "batch.volcano.sh", "version": "v1alpha1", "resource": "jobs"},
        "operation": operation, "userInfo": {}, "namespace": "ml", "name": "train", "object": job}}))
    .unwrap()
}

#[tokio::test]
async fn volcano_job_routes_over_https() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("webhook-ca");
    write_leaf(&ca, dir.path());
    let server = start(dir.path(), WebhookConfig { convert_to_dra: true, ..WebhookConfig::default() }).await;
    let tls = connector(&ca);
    let mut job = json!({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"minAvailable": 1, "tasks": [{"name": "worker", "replicas": 2, "template": {"spec": {
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/vgpu-number": "1"}}}]}}}]}});

    let (status, body) =
        call(&tls, server.addr, Method::POST, "/volcano-jobs/mutate", &job_review("CREATE", &job))
            .await
            .unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], true);
    let patch: Vec<u8> = base64_patch(&answer["response"]["patch"]);
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    json_patch::patch(&mut job, &patch).unwrap();
    let claim =
        job["spec"]["tasks"][0]["template"]["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].clone();
    assert!(claim.is_string(), "{job}");

    let (status, body) =
        call(&tls, server.addr, Method::POST, "/volcano-jobs/validate", &job_review("CREATE", &job))
            .await
            .unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["response"]["allowed"], true);
    let templates = server.api.templates();
    assert_eq!(templates.len(), 1);
    assert_eq!(json!(templates[0].metadata.name), claim);

    let (status, body) = call(&tls, server.addr, Method::POST, "/volcano-jobs/validate", b"{").await.unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.starts_with("malformed AdmissionReview: EOF"), "{body}");

    server.stop.cancel();
    tokio::time::timeout(Duration::from_secs(15), server.task).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let old = TestCa::new("old-ca");
    write_leaf(&old, dir.path());
    let server = start(dir.path(), WebhookConfig::default()).await;
    assert!(call(&connector(&old), server.addr, Method::GET, "/healthz", b"").await.is_ok());

    let new = TestCa::new("new-ca");
    assert!(
        call(&connector(&new), server.addr, Method::GET, "/healthz", b"")
            .await
            .unwrap_err()
            .starts_with("handshake")
    );
    write_leaf(&new, dir.path());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if call(&connector(&new), server.addr, Method::GET, "/healthz", b"").await.is_ok() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the new certificate was not picked up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(call(&connector(&old), server.addr, Method::GET, "/healthz", b"").await.is_err());
    server.stop.cancel();
    tokio::time::timeout(Duration::from_secs(15), server.task).await.unwrap().unwrap();
}

/// `response.patch` as upstream sends it: base64 text (Go `[]byte`).
fn base64_patch(patch: &serde_json::Value) -> Vec<u8> {
    use base64::Engine as _;
    let text = patch.as_str().unwrap_or_else(|| panic!("patch is not base64 text: {patch}"));
    base64::engine::general_purpose::STANDARD.decode(text).unwrap()
}

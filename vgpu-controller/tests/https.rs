//! The controller's routes over real HTTPS on loopback (`server::serve` with `vgpu_serve` TLS): GPUClass,
//! DeviceClass and ResourceClaim reviews allowed and denied with the field named, a pod mutated with a patch
//! and its ResourceClaim created through vgpu-webhook's `MemoryApi`, pods validated on CREATE and UPDATE (an
//! unconverted GPUClass request, another pod's generated claim) and the UPDATE mutation's label patch, a
//! malformed body answered 400, `/readyz`
//! following the caches, and `/metrics` behind TokenReview + SubjectAccessReview (401, 403, 200).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../vgpu-serve/tests/support/https_client.rs"]
mod https_client;
#[path = "../../vgpu-serve/tests/support/test_ca.rs"]
mod test_ca;

/// One request that must get an answer (`https_client::try_call`).
async fn call(
    connector: &TlsConnector,
    addr: SocketAddr,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> (StatusCode, String) {
    https_client::try_call(connector, addr, method, path, token, body).await.unwrap()
}

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use https_client::connector;
use hyper::{Method, StatusCode};
use serde_json::{Value, json};
use test_ca::TestCa;
use tokio::net::TcpListener;
use tokio_rustls::TlsConnector;
use tokio_util::sync::CancellationToken;
use vgpu_controller::admission::Admission;
use vgpu_controller::cluster::InMemoryCluster;
use vgpu_controller::config::ControllerConfig;
use vgpu_controller::fixture;
use vgpu_controller::metrics::Metrics;
use vgpu_controller::server::{self, ControllerServer};
use vgpu_kube::claims::MemoryApi;
use vgpu_serve::authz::{Authorizer, MemoryReviewer, UserInfo};
use vgpu_serve::http::HttpTimeouts;
use vgpu_serve::tls::TlsFiles;

fn review(
    kind: (&str, &str, &str),
    resource: &str,
    operation: &str,
    namespace: Option<&str>,
    object: Value,
) -> Vec<u8> {
    let (group, version, k) = kind;
    serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": group, "version": version, "kind": k},
        "resource": {"group": group, "version": version, "resource": resource},
        "operation": operation, "userInfo": {}, "namespace": namespace, "name": object["metadata"]["name"], "object": object}}))
    .unwrap()
}

/// An UPDATE review of pod `object` with `old`.
fn pod_update(old: Value, object: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-2", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "UPDATE", "userInfo": {}, "namespace": "ml", "name": object["metadata"]["name"],
        "object": object, "oldObject": old}}))
    .unwrap()
}

/// The JSON patch of an allowed response (kube-core writes the bytes as a JSON array, which the API server
/// decodes like base64).
fn patch_of(r: &Value) -> Value {
    let bytes: Vec<u8> = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        r["patch"].as_str().expect("patch is base64 text"),
    )
    .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

fn response(body: &str) -> Value {
    serde_json::from_str::<Value>(body).unwrap()["response"].clone()
}

#[tokio::test]
async fn routes_over_https() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("controller-test-ca");
    let (cert, key) = ca.leaf("vgpu-controller", true);
    std::fs::write(dir.path().join("tls.key"), key).unwrap();
    std::fs::write(dir.path().join("tls.crt"), cert).unwrap();

    let inventory = Arc::new(InMemoryCluster::new());
    inventory.put_class(fixture::class("a100-shared", "nvidia", Some("a100-sxm4-40gb"), Some(4)));
    inventory.put_gpu(fixture::gpu("w1", 0, "nvidia", "a100-sxm4-40gb", Some(40960)));
    let api = MemoryApi::new();
    let (registry, metrics) = Metrics::with_registry();
    let admission =
        Arc::new(Admission::new(ControllerConfig::default(), inventory.clone(), api.clone(), metrics));
    let reviewer = Arc::new(MemoryReviewer::new());
    reviewer.add_token("t-prom", UserInfo::new("system:serviceaccount:monitoring:prometheus"));
    reviewer.add_token("t-other", UserInfo::new("system:serviceaccount:default:other"));
    reviewer.allow("system:serviceaccount:monitoring:prometheus", "/metrics", "get");
    let synced = Arc::new(AtomicBool::new(false));
    let routes = ControllerServer::new(
        admission,
        registry,
        Some(Arc::new(Authorizer::new(reviewer))),
        synced.clone(),
        Duration::from_secs(10),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let tls = TlsFiles::new(dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let stop = CancellationToken::new();
    let stopped = stop.clone().cancelled_owned();
    let task = tokio::spawn(async move {
        server::serve(listener, routes, &tls, HttpTimeouts::default(), stopped).await.unwrap();
    });
    let c = connector(&ca);

    // Probes.
    assert_eq!(call(&c, addr, Method::GET, "/healthz", None, b"").await, (StatusCode::OK, "ok".into()));
    assert_eq!(call(&c, addr, Method::GET, "/readyz", None, b"").await.0, StatusCode::SERVICE_UNAVAILABLE);
    synced.store(true, Ordering::Release);
    assert_eq!(call(&c, addr, Method::GET, "/readyz", None, b"").await.0, StatusCode::OK);

    // GPUClass: an unsupported vendor is denied with the field; a good class is allowed.
    let gpuclass = ("gpu.deckhouse.io", "v1alpha1", "GPUClass");
    let bad = json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": "amd"},
        "spec": {"vendor": "amd", "sharing": {"mode": "Exclusive"}}});
    let (status, body) = call(
        &c,
        addr,
        Method::POST,
        "/gpuclasses/validate",
        None,
        &review(gpuclass, "gpuclasses", "CREATE", None, bad),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let r = response(&body);
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 422);
    assert_eq!(
        r["status"]["message"],
        "GPUClass \"amd\": spec.vendor: Unsupported value: \"amd\": supported values: \"metax\", \"nvidia\""
    );
    let good = json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": "t4"},
        "spec": {"vendor": "nvidia", "deviceType": "t4", "sharing": {"mode": "Exclusive"}}});
    let (_, body) = call(
        &c,
        addr,
        Method::POST,
        "/gpuclasses/validate",
        None,
        &review(gpuclass, "gpuclasses", "CREATE", None, good),
    )
    .await;
    assert_eq!(response(&body)["allowed"], true);

    // DeviceClass naming a missing GPUClass.
    let dc = json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "h100.gpu.deckhouse.io"}, "spec": {}});
    let (_, body) = call(
        &c,
        addr,
        Method::POST,
        "/deviceclasses/validate",
        None,
        &review(("resource.k8s.io", "v1", "DeviceClass"), "deviceclasses", "CREATE", None, dc),
    )
    .await;
    assert_eq!(
        response(&body)["status"]["message"],
        "DeviceClass \"h100.gpu.deckhouse.io\": metadata.name: Not found: GPUClass \"h100\" does not exist"
    );

    // ResourceClaim asking more devices than one node has.
    let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "big", "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "a100-shared.gpu.deckhouse.io", "count": 2}}]}}});
    let (_, body) = call(
        &c,
        addr,
        Method::POST,
        "/resourceclaims/validate",
        None,
        &review(("resource.k8s.io", "v1", "ResourceClaim"), "resourceclaims", "CREATE", Some("ml"), claim),
    )
    .await;
    assert_eq!(
        response(&body)["status"]["message"],
        "ResourceClaim \"big\": spec.devices.requests[0].exactly: count: Invalid value: 2: GPUClass \"a100-shared\" has at most 1 matching GPU on one node"
    );

    // Pod mutation: a patch, and the claim created.
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "ml"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"gpu.deckhouse.io/a100-shared": "1"}}}]}});
    let (_, body) = call(
        &c,
        addr,
        Method::POST,
        "/pods/mutate",
        None,
        &review(("", "v1", "Pod"), "pods", "CREATE", Some("ml"), pod),
    )
    .await;
    let r = response(&body);
    assert_eq!(r["allowed"], true, "{body}");
    assert_eq!(r["patchType"], "JSONPatch");
    let claims = api.claims();
    assert_eq!(claims.len(), 1);
    assert_eq!(
        claims[0].metadata.name.as_deref(),
        Some(
            vgpu_api::names::safe_resource_name(&[
                "web",
                "main",
                "a100-shared",
                &vgpu_api::names::short_hash("u-1", vgpu_controller::admission::ADMISSION_ID_LENGTH)
            ])
            .as_str()
        )
    );
    // The claim carries the admission id (the pod's label of the same value is checked in admission.rs).
    assert_eq!(
        claims[0].metadata.labels.as_ref().unwrap()["gpu.deckhouse.io/admission-id"],
        vgpu_api::names::short_hash("u-1", vgpu_controller::admission::ADMISSION_ID_LENGTH)
    );

    // Pod validation: an unconverted GPUClass request, and a claim the mutation made for another pod.
    let unconverted = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "raw", "namespace": "ml"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"gpu.deckhouse.io/h100": "1"}}}]}});
    let (_, body) = call(
        &c,
        addr,
        Method::POST,
        "/pods/validate",
        None,
        &review(("", "v1", "Pod"), "pods", "CREATE", Some("ml"), unconverted),
    )
    .await;
    let r = response(&body);
    assert_eq!(r["allowed"], false, "{body}");
    assert_eq!(
        r["status"]["message"],
        "container \"main\": spec.containers[0].resources.limits[gpu.deckhouse.io/h100]: Not found: GPUClass \"h100\" does not exist"
    );
    inventory.put_claim(fixture::generated_claim("ml", "web-claim", "id-web", fixture::time(0)));
    let thief = serde_json::to_value(fixture::pod("ml", "thief", "", "id-thief", &["web-claim"])).unwrap();
    let (_, body) = call(
        &c,
        addr,
        Method::POST,
        "/pods/validate",
        None,
        &review(("", "v1", "Pod"), "pods", "CREATE", Some("ml"), thief),
    )
    .await;
    assert_eq!(
        response(&body)["status"]["message"],
        "spec.resourceClaims[0].resourceClaimName: Invalid value: \"web-claim\": ResourceClaim \"web-claim\" was made by the pod mutation for another pod (label gpu.deckhouse.io/admission-id \"id-web\"; this pod has \"id-thief\")"
    );
    let owner = serde_json::to_value(fixture::pod("ml", "web", "", "id-web", &["web-claim"])).unwrap();
    let (_, body) = call(
        &c,
        addr,
        Method::POST,
        "/pods/validate",
        None,
        &review(("", "v1", "Pod"), "pods", "CREATE", Some("ml"), owner.clone()),
    )
    .await;
    assert_eq!(response(&body)["allowed"], true, "{body}");

    // UPDATE: dropping the admission-id label is mutated back; validation refuses the label of another pod
    // only when the update brings it in.
    let mut unlabelled = owner.clone();
    unlabelled["metadata"]["labels"] = json!({"team": "a"});
    let (_, body) =
        call(&c, addr, Method::POST, "/pods/mutate", None, &pod_update(owner.clone(), unlabelled.clone()))
            .await;
    let r = response(&body);
    assert_eq!(r["allowed"], true, "{body}");
    assert_eq!(
        patch_of(&r),
        json!([{"op": "add", "path": "/metadata/labels/gpu.deckhouse.io~1admission-id", "value": "id-web"}])
    );
    let (_, body) =
        call(&c, addr, Method::POST, "/pods/mutate", None, &pod_update(owner.clone(), owner.clone())).await;
    assert!(response(&body).get("patch").is_none(), "an update keeping the label gets no patch: {body}");
    let (_, body) =
        call(&c, addr, Method::POST, "/pods/validate", None, &pod_update(owner.clone(), unlabelled.clone()))
            .await;
    assert!(response(&body)["status"]["message"].as_str().unwrap().ends_with("this pod has none)"), "{body}");
    let (_, body) =
        call(&c, addr, Method::POST, "/pods/validate", None, &pod_update(unlabelled.clone(), unlabelled))
            .await;
    assert_eq!(response(&body)["allowed"], true, "an existing violation does not block updates: {body}");

    // A body that is not a review.
    let (status, body) = call(&c, addr, Method::POST, "/gpuclasses/validate", None, b"{").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.starts_with("malformed AdmissionReview"), "{body}");

    // Metrics: 401 without a token, 403 for a user RBAC does not allow, the page for one it does.
    assert_eq!(call(&c, addr, Method::GET, "/metrics", None, b"").await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(call(&c, addr, Method::GET, "/metrics", Some("t-other"), b"").await.0, StatusCode::FORBIDDEN);
    let (status, page) = call(&c, addr, Method::GET, "/metrics", Some("t-prom"), b"").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains("vgpu_controller_admission_total{route=\"/gpuclasses/validate\",allowed=\"false\"} 1"),
        "{page}"
    );
    assert!(
        page.contains("vgpu_controller_admission_total{route=\"/pods/mutate\",allowed=\"true\"} 3"),
        "{page}"
    );
    assert!(
        page.contains("vgpu_controller_admission_total{route=\"/pods/validate\",allowed=\"false\"} 3"),
        "{page}"
    );
    assert!(page.contains("process_"), "{page}");

    stop.cancel();
    task.await.unwrap();
}

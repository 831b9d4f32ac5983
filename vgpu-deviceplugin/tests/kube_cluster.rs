//! `KubeCluster` at the HTTP layer: a `tower_test` mock service stands in for the API server, and every
//! request's method, path, query, content type and body is checked.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::{Handle, SendResponse};
use vgpu_deviceplugin::{
    cluster::{ClusterClient, NodeClient, NodePatch, PodPatch},
    kube_cluster::KubeCluster,
};

type ApiHandle = Handle<Request<Body>, Response<Body>>;

fn cluster() -> (KubeCluster, ApiHandle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (KubeCluster::new(kube::Client::new(service, "default")), handle)
}

struct Seen {
    method: String,
    uri: String,
    content_type: Option<String>,
    body: Value,
}

async fn next(handle: &mut ApiHandle) -> (Seen, SendResponse<Response<Body>>) {
    let (request, send) = handle.next_request().await.expect("a request");
    let method = request.method().to_string();
    let uri = request.uri().to_string();
    let content_type = request.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
    let bytes = request.into_body().collect_bytes().await.unwrap();
    let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap() };
    (Seen { method, uri, content_type, body }, send)
}

fn reply(send: SendResponse<Response<Body>>, status: u16, body: &Value) {
    send.send_response(
        Response::builder().status(status).body(Body::from(serde_json::to_vec(body).unwrap())).unwrap(),
    );
}

fn node(capacity: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node", "metadata": { "name": "n1" },
        "status": { "capacity": capacity.clone(), "allocatable": capacity }
    })
}

#[tokio::test]
async fn lists_pods_on_the_node_with_a_field_selector() {
    let (cluster, mut handle) = cluster();
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.method, "GET");
        assert_eq!(seen.uri, "/api/v1/pods?&fieldSelector=spec.nodeName%3Dn1");
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "p", "namespace": "ns", "uid": "u-1",
                "labels": { "nvidia.com/assigned-phase": "allocating" },
                "annotations": { "nvidia.com/predicate-node": "n1" },
                "deletionTimestamp": "2026-01-01T00:00:00Z"
            },
            "spec": {
                "nodeName": "n1",
                "initContainers": [{ "name": "init", "env": [{ "name": "A", "value": "1" }] }],
                "containers": [{ "name": "main", "env": [
                    { "name": "CUDA_MEM_OVERSOLD", "value": "true" },
                    { "name": "FROM_REF", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } }
                ] }]
            },
            "status": { "phase": "Pending" }
        });
        reply(send, 200, &json!({ "apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [pod] }));
    });
    let pods = cluster.list_node_pods("n1").await.unwrap();
    server.await.unwrap();
    assert_eq!(pods.len(), 1);
    let p = &pods[0];
    assert_eq!((p.namespace.as_str(), p.name.as_str(), p.uid.as_str()), ("ns", "p", "u-1"));
    assert_eq!((p.node_name.as_str(), p.phase.as_str(), p.deleting), ("n1", "Pending", true));
    assert_eq!(p.labels["nvidia.com/assigned-phase"], "allocating");
    assert_eq!(p.containers.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["init", "main"]);
    assert_eq!(p.containers[1].env, BTreeMap::from([("CUDA_MEM_OVERSOLD".into(), "true".into())]));
}

#[tokio::test]
async fn patches_pods_with_a_merge_patch() {
    let (cluster, mut handle) = cluster();
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.method, "PATCH");
        assert_eq!(seen.uri, "/api/v1/namespaces/ns/pods/p?");
        assert_eq!(seen.content_type.as_deref(), Some("application/merge-patch+json"));
        assert_eq!(
            seen.body,
            json!({ "metadata": {
                "labels": { "nvidia.com/assigned-phase": "succeed", "nvidia.com/metrics-node": null },
                "annotations": { "nvidia.com/real-allocated": "main[0_GPU-a_50_1024]" }
            } })
        );
        reply(send, 200, &json!({ "apiVersion": "v1", "kind": "Pod", "metadata": { "name": "p" } }));
    });
    let mut patch = PodPatch::default();
    patch.labels.insert("nvidia.com/assigned-phase".into(), Some("succeed".into()));
    patch.labels.insert("nvidia.com/metrics-node".into(), None);
    patch.annotations.insert("nvidia.com/real-allocated".into(), Some("main[0_GPU-a_50_1024]".into()));
    cluster.patch_pod("ns", "p", &patch).await.unwrap();
    server.await.unwrap();
}

#[tokio::test]
async fn api_errors_become_cluster_errors() {
    let (cluster, mut handle) = cluster();
    let server = tokio::spawn(async move {
        let (_, send) = next(&mut handle).await;
        let status = json!({
            "apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "Conflict",
            "message": "the object has been modified", "code": 409
        });
        reply(send, 409, &status);
    });
    let err = cluster.patch_pod("ns", "p", &PodPatch::default()).await.unwrap_err();
    server.await.unwrap();
    assert_eq!(err.operation, "patch pod ns/p");
    assert!(err.message.contains("the object has been modified"), "{err}");
}

#[tokio::test]
async fn patches_node_annotations_and_labels() {
    let (cluster, mut handle) = cluster();
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.method, "PATCH");
        assert_eq!(seen.uri, "/api/v1/nodes/n1?");
        assert_eq!(seen.content_type.as_deref(), Some("application/merge-patch+json"));
        assert_eq!(
            seen.body,
            json!({ "metadata": {
                "labels": { "nvidia.com/node-driver-version": "570.86.10" },
                "annotations": { "nvidia.com/node-config-info": "{}", "nvidia.com/node-device-heartbeat": null }
            } })
        );
        reply(send, 200, &node(json!({})));
    });
    let mut patch = NodePatch::default();
    patch.labels.insert("nvidia.com/node-driver-version".into(), Some("570.86.10".into()));
    patch.annotations.insert("nvidia.com/node-config-info".into(), Some("{}".into()));
    patch.annotations.insert("nvidia.com/node-device-heartbeat".into(), None);
    cluster.patch_node("n1", &patch).await.unwrap();
    server.await.unwrap();
}

#[tokio::test]
async fn removes_only_present_stale_resources_from_node_status() {
    let (cluster, mut handle) = cluster();
    let resources = vec!["nvidia.com/vgpu-cores".to_owned(), "nvidia.com/vgpu-memory".to_owned()];
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!((seen.method.as_str(), seen.uri.as_str()), ("GET", "/api/v1/nodes/n1"));
        reply(send, 200, &node(json!({ "nvidia.com/vgpu-cores": "800", "nvidia.com/vgpu-number": "80" })));
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.method, "PATCH");
        assert_eq!(seen.uri, "/api/v1/nodes/n1/status?");
        assert_eq!(seen.content_type.as_deref(), Some("application/merge-patch+json"));
        assert_eq!(
            seen.body,
            json!({ "status": {
                "capacity": { "nvidia.com/vgpu-cores": null },
                "allocatable": { "nvidia.com/vgpu-cores": null }
            } })
        );
        reply(send, 200, &node(json!({ "nvidia.com/vgpu-number": "80" })));
        // Second pass: nothing left, so no PATCH.
        let (seen, send) = next(&mut handle).await;
        assert_eq!((seen.method.as_str(), seen.uri.as_str()), ("GET", "/api/v1/nodes/n1"));
        reply(send, 200, &node(json!({ "nvidia.com/vgpu-number": "80" })));
    });
    assert!(cluster.remove_node_resources("n1", &resources).await.unwrap());
    assert!(!cluster.remove_node_resources("n1", &resources).await.unwrap());
    server.await.unwrap();
}

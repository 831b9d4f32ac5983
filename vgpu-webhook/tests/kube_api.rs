//! `KubeApi` at the HTTP layer (the shared `tower_test` mock API server): each method's request (method, path,
//! query, body) and how it reads the answers (404 → `None` or success, 409 → `already_exists`, other
//! errors named with the action).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../vgpu-serve/tests/support/mock_api_server.rs"]
mod mock_api_server;

use k8s_openapi::api::resource::v1::ResourceClaim;
use mock_api_server::{mock_client, next, reply};
use serde_json::json;
use vgpu_webhook::api::{ClusterApi, KubeApi};

fn not_found(kind: &str, name: &str) -> serde_json::Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
        "message": format!("{kind} \"{name}\" not found")})
}

#[tokio::test]
async fn reads() {
    let (client, mut handle) = mock_client();
    let api = KubeApi::new(client);
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!(
            (seen.method.as_str(), seen.uri.as_str()),
            ("GET", "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/c1")
        );
        reply(
            send,
            200,
            &json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c1", "namespace": "ml"}, "spec": {"devices": {"requests": []}}}),
        );
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.uri, "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/gone");
        reply(send, 404, &not_found("resourceclaims", "gone"));
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.uri, "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaimtemplates/t1");
        reply(send, 404, &not_found("resourceclaimtemplates", "t1"));
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.uri, "/apis/resource.k8s.io/v1/deviceclasses/gpus");
        reply(
            send,
            200,
            &json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpus"}}),
        );
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.uri, "/api/v1/namespaces/ml/pods/p1");
        reply(
            send,
            500,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500, "message": "etcd down"}),
        );
    });
    assert_eq!(api.get_claim("ml", "c1").await.unwrap().unwrap().metadata.name.as_deref(), Some("c1"));
    assert!(api.get_claim("ml", "gone").await.unwrap().is_none());
    assert!(api.get_claim_template("ml", "t1").await.unwrap().is_none());
    assert!(api.get_device_class("gpus").await.unwrap().is_some());
    let err = api.get_pod("ml", "p1").await.unwrap_err();
    assert!(err.to_string().starts_with("get Pod ml/p1: "), "{err}");
    assert!(err.to_string().contains("etcd down"), "{err}");
    assert!(!err.already_exists);
    server.await.unwrap();
}

#[tokio::test]
async fn writes() {
    let (client, mut handle) = mock_client();
    let api = KubeApi::new(client);
    let claim: ResourceClaim = serde_json::from_value(json!({"metadata": {"name": "c1", "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "vgpu", "exactly": {"deviceClassName": "vgpu-manager", "count": 1}}]}}}))
    .unwrap();
    let echo = serde_json::to_value(&claim).unwrap();
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!(
            (seen.method.as_str(), seen.uri.as_str()),
            ("POST", "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims?")
        );
        assert_eq!(seen.body["spec"], echo["spec"]);
        assert_eq!(seen.body["kind"], "ResourceClaim");
        reply(send, 201, &seen.body);
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.uri, "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims?&dryRun=All");
        reply(send, 201, &seen.body);
        let (_, send) = next(&mut handle).await;
        reply(
            send,
            409,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "AlreadyExists",
            "code": 409, "message": "resourceclaims \"c1\" already exists"}),
        );
        let (seen, send) = next(&mut handle).await;
        assert_eq!(
            (seen.method.as_str(), seen.uri.as_str()),
            ("DELETE", "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/c1?")
        );
        reply(send, 200, &json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}));
        let (_, send) = next(&mut handle).await;
        reply(send, 404, &not_found("resourceclaims", "c1"));
    });
    api.create_claim(&claim, false).await.unwrap();
    api.create_claim(&claim, true).await.unwrap();
    let err = api.create_claim(&claim, false).await.unwrap_err();
    assert!(err.already_exists, "{err}");
    assert!(err.to_string().starts_with("create ResourceClaim ml/c1: "), "{err}");
    api.delete_claim("ml", "c1").await.unwrap();
    api.delete_claim("ml", "c1").await.unwrap();
    server.await.unwrap();
}

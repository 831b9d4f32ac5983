//! `KubeApi` at the HTTP layer (the shared `tower_test` mock API server): each method's request (method, path,
//! query, body) and how it reads the answers (404 → `None` or success, 409 → `already_exists`, other
//! errors named with the action; a conflicting owner update read again and retried).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../vgpu-serve/tests/support/mock_api_server.rs"]
mod mock_api_server;

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use mock_api_server::{mock_client, next, reply};
use serde_json::json;
use vgpu_kube::claims::{ClusterApi, KubeApi, OwnerUpdate};

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

fn template(owners: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t1", "namespace": "ml", "resourceVersion": "7", "ownerReferences": owners},
        "spec": {"spec": {"devices": {"requests": []}}}})
}

#[tokio::test]
async fn template_writes_and_owner() {
    let (client, mut handle) = mock_client();
    let api = KubeApi::new(client);
    let t: ResourceClaimTemplate = serde_json::from_value(template(json!([]))).unwrap();
    let owner = OwnerReference {
        api_version: "batch.volcano.sh/v1alpha1".into(),
        kind: "Job".into(),
        name: "train".into(),
        uid: "uid-job".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let owner_json = serde_json::to_value(&owner).unwrap();
    let server = tokio::spawn(async move {
        let path = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaimtemplates";
        let (seen, send) = next(&mut handle).await;
        assert_eq!((seen.method.as_str(), seen.uri.as_str()), ("POST", &*format!("{path}?&dryRun=All")));
        assert_eq!(seen.body["kind"], "ResourceClaimTemplate");
        reply(send, 201, &seen.body);
        let (seen, send) = next(&mut handle).await;
        assert_eq!((seen.method.as_str(), seen.uri.as_str()), ("DELETE", &*format!("{path}/t1?")));
        reply(send, 404, &not_found("resourceclaimtemplates", "t1"));
        // No controller yet: read, then written with the owner; the first write conflicts and is retried.
        for status in [409, 200] {
            let (seen, send) = next(&mut handle).await;
            assert_eq!((seen.method.as_str(), seen.uri.as_str()), ("GET", &*format!("{path}/t1")));
            reply(send, 200, &template(json!([])));
            let (seen, send) = next(&mut handle).await;
            assert_eq!((seen.method.as_str(), seen.uri.as_str()), ("PUT", &*format!("{path}/t1?")));
            assert_eq!(seen.body["metadata"]["ownerReferences"], json!([owner_json.clone()]));
            assert_eq!(seen.body["metadata"]["resourceVersion"], "7");
            let conflict = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict",
                "code": 409, "message": "the object has been modified"});
            reply(send, status, &if status == 200 { seen.body } else { conflict });
        }
        // Already controlled: by the Job, then by someone else; then gone. No writes.
        let (_, send) = next(&mut handle).await;
        reply(send, 200, &template(json!([owner_json.clone()])));
        let (_, send) = next(&mut handle).await;
        reply(
            send,
            200,
            &template(
                json!([{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "x", "controller": true}]),
            ),
        );
        let (_, send) = next(&mut handle).await;
        reply(send, 404, &not_found("resourceclaimtemplates", "t1"));
    });
    api.create_claim_template(&t, true).await.unwrap();
    api.delete_claim_template("ml", "t1").await.unwrap();
    assert_eq!(api.set_template_owner("ml", "t1", &owner).await.unwrap(), OwnerUpdate::Adopted);
    assert_eq!(api.set_template_owner("ml", "t1", &owner).await.unwrap(), OwnerUpdate::AlreadyOwned);
    assert_eq!(
        api.set_template_owner("ml", "t1", &owner).await.unwrap(),
        OwnerUpdate::OtherController("Pod p".into())
    );
    assert_eq!(api.set_template_owner("ml", "t1", &owner).await.unwrap(), OwnerUpdate::NotFound);
    server.await.unwrap();
}

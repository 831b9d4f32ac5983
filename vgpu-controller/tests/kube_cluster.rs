//! `KubeCluster`'s writes at the HTTP layer: a `tower_test` mock service stands in for the API server, and each
//! request's method, path, query, content type and body is checked (DeviceClass server-side apply, delete with
//! 404 as success, GPUClass and PhysicalGPU status applies on `/status`, for the default group and another;
//! the generated claims' pod list by admission label, owner JSON patch with its UID test, and delete with UID
//! and resourceVersion preconditions), and a whole reconcile pass over the in-memory seam makes exactly those
//! writes in that order.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../vgpu-serve/tests/support/mock_api_server.rs"]
mod mock_api_server;

use mock_api_server::{next, reply};
use serde_json::json;
use vgpu_api::{Condition, ConditionStatus, GpuState, Occupancy};
use vgpu_controller::cluster::ControllerCluster;
use vgpu_controller::config::ControllerConfig;
use vgpu_controller::desired::{NodeLabels, desired_class};
use vgpu_controller::fixture;
use vgpu_controller::kube_cluster::KubeCluster;
use vgpu_controller::occupancy::GpuStatus;
use vgpu_controller::passthrough::PassthroughPolicy;

const APPLY: &str = "?&force=true&fieldManager=vgpu-controller";

#[tokio::test]
async fn writes_are_server_side_applies() {
    let (client, mut handle) = mock_api_server::mock_client();
    let (cluster, _watches) = KubeCluster::new(client, ControllerConfig::default()).unwrap();
    let class = fixture::class("a100-shared", "nvidia", Some("a100-sxm4-40gb"), Some(4));
    let gpus = [fixture::gpu("w1", 0, "nvidia", "a100-sxm4-40gb", Some(40960))];
    let desired = desired_class(&ControllerConfig::default(), &class, &gpus, &NodeLabels::new());
    let dc = desired.device_class.clone().unwrap();
    let expression =
        dc.spec.as_ref().unwrap().selectors.as_ref().unwrap()[0].cel.as_ref().unwrap().expression.clone();
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.method, "PATCH");
        assert_eq!(
            seen.uri,
            format!("/apis/resource.k8s.io/v1/deviceclasses/a100-shared.gpu.deckhouse.io{APPLY}")
        );
        assert_eq!(seen.content_type.as_deref(), Some("application/apply-patch+yaml"));
        assert_eq!(
            seen.body,
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": "a100-shared.gpu.deckhouse.io",
                    "labels": {"app.kubernetes.io/managed-by": "vgpu-controller", "gpu.deckhouse.io/gpuclass": "a100-shared"},
                    "ownerReferences": [{"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass", "name": "a100-shared",
                        "uid": "uid-a100-shared", "controller": true, "blockOwnerDeletion": true}]},
                "spec": {"selectors": [{"cel": {"expression": expression}}]}})
        );
        reply(send, 200, &seen.body);

        let (seen, send) = next(&mut handle).await;
        assert_eq!(
            (seen.method.as_str(), seen.uri.as_str()),
            ("DELETE", "/apis/resource.k8s.io/v1/deviceclasses/gone.gpu.deckhouse.io?")
        );
        reply(
            send,
            404,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
        );

        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.uri, format!("/apis/gpu.deckhouse.io/v1alpha1/gpuclasses/a100-shared/status{APPLY}"));
        assert_eq!(seen.content_type.as_deref(), Some("application/apply-patch+yaml"));
        assert_eq!(
            seen.body,
            json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": "a100-shared"},
                "status": {"valid": true, "message": "matches 1 PhysicalGPU on 1 node", "deviceClassName": "a100-shared.gpu.deckhouse.io",
                    "conditions": [{"type": "Valid", "status": "True", "reason": "Matched", "message": "matches 1 PhysicalGPU on 1 node", "observedGeneration": 1}]}})
        );
        reply(send, 200, &seen.body);

        let (seen, send) = next(&mut handle).await;
        assert_eq!(
            seen.uri,
            format!("/apis/gpu.deckhouse.io/v1alpha1/physicalgpus/w1-0-nvidia/status{APPLY}")
        );
        assert_eq!(
            seen.body,
            json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "PhysicalGPU", "metadata": {"name": "w1-0-nvidia"},
                "status": {"state": "Allocated", "occupancy": {"totalShares": 4, "usedShares": 1, "claims": ["ml/job"]}}})
        );
        reply(send, 200, &seen.body);

        // With a class wish: classPassthrough and the PassthroughPolicy condition join the same apply.
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.body["status"]["classPassthrough"], json!(true));
        assert_eq!(
            seen.body["status"]["conditions"],
            json!([{"type": "PassthroughPolicy", "status": "True", "reason": "ClassesAgree", "message": "passthrough true from GPUClass vm", "observedGeneration": 3}])
        );
        assert_eq!(seen.body["status"]["state"], "Allocated");
        reply(send, 200, &seen.body);

        let (_, send) = next(&mut handle).await;
        reply(
            send,
            500,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500, "message": "etcd down"}),
        );
    });
    cluster.apply_device_class(&dc).await.unwrap();
    cluster.delete_device_class("gone.gpu.deckhouse.io").await.unwrap();
    cluster.apply_class_status("a100-shared", &desired.status).await.unwrap();
    let mut status = GpuStatus {
        state: GpuState::Allocated,
        occupancy: Occupancy { total_shares: 4, used_shares: 1, claims: vec!["ml/job".into()] },
        passthrough: PassthroughPolicy::default(),
    };
    cluster.apply_gpu_status("w1-0-nvidia", &status).await.unwrap();
    status.passthrough = PassthroughPolicy {
        wish: Some(true),
        condition: Some(Condition {
            type_: "PassthroughPolicy".into(),
            status: ConditionStatus::True,
            reason: Some("ClassesAgree".into()),
            message: Some("passthrough true from GPUClass vm".into()),
            last_transition_time: None,
            observed_generation: Some(3),
        }),
    };
    cluster.apply_gpu_status("w1-0-nvidia", &status).await.unwrap();
    let err = cluster.apply_gpu_status("w1-0-nvidia", &status).await.unwrap_err();
    assert!(err.to_string().starts_with("apply status of PhysicalGPU w1-0-nvidia: "), "{err}");
    assert!(err.to_string().contains("etcd down"), "{err}");
    server.await.unwrap();
}

#[tokio::test]
async fn another_group() {
    let (client, mut handle) = mock_api_server::mock_client();
    let config = ControllerConfig::with_group("gpu.example.com").unwrap();
    let (cluster, _watches) = KubeCluster::new(client, config.clone()).unwrap();
    let class = fixture::class("t4", "nvidia", None, None);
    let desired = desired_class(&config, &class, &[], &NodeLabels::new());
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.uri, format!("/apis/resource.k8s.io/v1/deviceclasses/t4.gpu.example.com{APPLY}"));
        assert_eq!(seen.body["metadata"]["labels"]["gpu.example.com/gpuclass"], "t4");
        assert_eq!(seen.body["metadata"]["ownerReferences"][0]["apiVersion"], "gpu.example.com/v1alpha1");
        reply(send, 200, &seen.body);
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.uri, format!("/apis/gpu.example.com/v1alpha1/gpuclasses/t4/status{APPLY}"));
        assert_eq!(seen.body["apiVersion"], "gpu.example.com/v1alpha1");
        assert_eq!(seen.body["status"]["valid"], false);
        reply(send, 200, &seen.body);
    });
    cluster.apply_device_class(desired.device_class.as_ref().unwrap()).await.unwrap();
    cluster.apply_class_status("t4", &desired.status).await.unwrap();
    server.await.unwrap();
}

#[tokio::test]
async fn generated_claims_calls() {
    let (client, mut handle) = mock_api_server::mock_client();
    let (cluster, _watches) = KubeCluster::new(client, ControllerConfig::default()).unwrap();
    let claim = fixture::generated_claim("ml", "web-main-a", "id1", fixture::time(0));
    let pod = fixture::pod("ml", "web", "uid-web", "id1", &["web-main-a"]);
    let owner = vgpu_controller::claims::owner_reference(&pod).unwrap();
    let pod_json = serde_json::to_value(&pod).unwrap();
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.method, "GET");
        assert_eq!(
            seen.uri,
            "/api/v1/namespaces/ml/pods?&labelSelector=gpu.deckhouse.io%2Fadmission-id+in+%28id1%2Cid2%29"
        );
        reply(
            send,
            200,
            &json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [pod_json]}),
        );

        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.method, "PATCH");
        assert_eq!(seen.uri, "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/web-main-a?");
        assert_eq!(seen.content_type.as_deref(), Some("application/json-patch+json"));
        assert_eq!(
            seen.body,
            json!([{"op": "test", "path": "/metadata/uid", "value": "uid-web-main-a"},
                {"op": "add", "path": "/metadata/ownerReferences", "value": [
                    {"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "uid-web", "controller": true}]}])
        );
        reply(
            send,
            200,
            &json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "web-main-a", "namespace": "ml"}, "spec": {}}),
        );

        // The claim is gone by the time the owner is set: no error.
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.method, "PATCH");
        reply(
            send,
            404,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
        );
        // The UID test failed (the claim was replaced): an error naming the claim.
        let (_, send) = next(&mut handle).await;
        reply(
            send,
            422,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Invalid", "code": 422,
            "message": "the server rejected our request due to an error in our request"}),
        );

        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.method, "DELETE");
        assert_eq!(seen.uri, "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/web-main-a?");
        assert_eq!(seen.body["preconditions"], json!({"uid": "uid-web-main-a", "resourceVersion": "1"}));
        reply(send, 200, &json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200}));
        let (_, send) = next(&mut handle).await;
        reply(
            send,
            404,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
        );
        let (_, send) = next(&mut handle).await;
        reply(
            send,
            409,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
            "message": "Precondition failed: ResourceVersion in precondition: 1, ResourceVersion in object meta: 2"}),
        );
    });
    let selector = vgpu_controller::claims::pod_selector(&ControllerConfig::default(), ["id2", "id1"]);
    let pods = cluster.list_pods("ml", &selector).await.unwrap();
    assert_eq!(pods, [pod]);
    cluster.set_claim_owners(&claim, std::slice::from_ref(&owner)).await.unwrap();
    cluster.set_claim_owners(&claim, std::slice::from_ref(&owner)).await.unwrap();
    let err = cluster.set_claim_owners(&claim, &[owner]).await.unwrap_err().to_string();
    assert!(err.starts_with("set the owner of ResourceClaim ml/web-main-a: "), "{err}");
    cluster.delete_claim(&claim).await.unwrap();
    cluster.delete_claim(&claim).await.unwrap();
    let err = cluster.delete_claim(&claim).await.unwrap_err().to_string();
    assert!(err.starts_with("delete ResourceClaim ml/web-main-a: "), "{err}");
    assert!(err.contains("Precondition failed"), "{err}");
    server.await.unwrap();
}

//! `KubeCluster` at the HTTP layer: a `tower_test` mock service stands in for the API server, and every
//! request's method, path, query, content type and body is checked (pods and nodes for Allocate and the
//! publisher; eviction, delete with a UID precondition, create, get and events for the reschedule
//! controller, with the status codes each outcome maps from).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../vgpu-serve/tests/support/mock_api_server.rs"]
mod mock_api_server;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use mock_api_server::{ApiHandle, next, reply};
use serde_json::{Value, json};
use vgpu_deviceplugin::{
    cluster::{
        ClusterClient, CreateOutcome, DeleteOutcome, EventType, EvictOutcome, NodeClient, NodePatch,
        PodEvent, PodPatch, RescheduleClient,
    },
    kube_cluster::KubeCluster,
};

fn cluster() -> (KubeCluster, ApiHandle) {
    let (client, handle) = mock_api_server::mock_client();
    (KubeCluster::new(client), handle)
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
async fn lists_the_allocating_pods_with_a_label_selector_too() {
    let (cluster, mut handle) = cluster();
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.method, "GET");
        assert_eq!(
            seen.uri,
            "/api/v1/pods?&fieldSelector=spec.nodeName%3Dn1&labelSelector=nvidia.com%2Fassigned-phase%3Dallocating"
        );
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": "p", "namespace": "ns", "labels": { "nvidia.com/assigned-phase": "allocating" } },
            "spec": { "nodeName": "n1", "containers": [] }
        });
        reply(send, 200, &json!({ "apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [pod] }));
    });
    let pods =
        cluster.list_node_pods_labelled("n1", "nvidia.com/assigned-phase", "allocating").await.unwrap();
    server.await.unwrap();
    assert_eq!(pods.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["p"]);
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

// === RescheduleClient (AllocationFailureReschedule) ===

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": reason, "message": message, "code": code
    })
}

fn pod_object(name: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "namespace": "ns", "uid": uid },
        "spec": { "containers": [{ "name": "main", "image": "cuda:12" }] }
    })
}

#[tokio::test]
async fn lists_full_pods_on_the_node_from_the_watch_cache() {
    let (cluster, mut handle) = cluster();
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.method, "GET");
        assert_eq!(
            seen.uri,
            "/api/v1/pods?&fieldSelector=spec.nodeName%3Dn1&resourceVersion=0&resourceVersionMatch=NotOlderThan"
        );
        let items = json!([pod_object("p", "u-1")]);
        reply(send, 200, &json!({ "apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items }));
    });
    let pods = cluster.list_node_pod_objects("n1").await.unwrap();
    server.await.unwrap();
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0].spec.as_ref().unwrap().containers[0].image.as_deref(), Some("cuda:12"));
}

#[tokio::test]
async fn evicts_through_the_policy_v1_eviction_subresource() {
    let (cluster, mut handle) = cluster();
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.method, "POST");
        assert_eq!(seen.uri, "/api/v1/namespaces/ns/pods/web-abc/eviction?");
        assert_eq!(seen.content_type.as_deref(), Some("application/json"));
        assert_eq!(
            seen.body,
            json!({
                "apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": { "name": "web-abc", "namespace": "ns" },
                "deleteOptions": { "gracePeriodSeconds": 17 }
            })
        );
        reply(send, 201, &json!({ "apiVersion": "v1", "kind": "Status", "status": "Success", "code": 201 }));
        // A PodDisruptionBudget refuses the next one; the one after finds no pod.
        let (seen, send) = next(&mut handle).await;
        assert_eq!(
            seen.body["deleteOptions"],
            json!({ "gracePeriodSeconds": 0 }),
            "negative grace sent as 0"
        );
        reply(
            send,
            429,
            &status(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
            ),
        );
        let (seen, send) = next(&mut handle).await;
        assert!(seen.body.get("deleteOptions").is_none(), "no grace: the pod's own");
        reply(send, 404, &status(404, "NotFound", "pods \"web-abc\" not found"));
        let (_, send) = next(&mut handle).await;
        reply(send, 500, &status(500, "InternalError", "etcd is sad"));
    });
    assert_eq!(cluster.evict_pod("ns", "web-abc", Some(17)).await.unwrap(), EvictOutcome::Evicted);
    assert_eq!(
        cluster.evict_pod("ns", "web-abc", Some(-5)).await.unwrap(),
        EvictOutcome::Refused("Cannot evict pod as it would violate the pod's disruption budget.".into())
    );
    assert_eq!(cluster.evict_pod("ns", "web-abc", None).await.unwrap(), EvictOutcome::NotFound);
    let err = cluster.evict_pod("ns", "web-abc", None).await.unwrap_err();
    assert_eq!(err.operation, "evict pod ns/web-abc");
    server.await.unwrap();
}

#[tokio::test]
async fn deletes_with_a_uid_precondition() {
    let (cluster, mut handle) = cluster();
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.method, "DELETE");
        assert_eq!(seen.uri, "/api/v1/namespaces/ns/pods/solo?");
        assert_eq!(seen.content_type.as_deref(), Some("application/json"));
        assert_eq!(seen.body, json!({ "preconditions": { "uid": "u-1" } }));
        let mut deleting = pod_object("solo", "u-1");
        deleting["metadata"]["deletionTimestamp"] = json!("2026-03-01T10:00:00Z");
        reply(send, 200, &deleting);
        let (_, send) = next(&mut handle).await;
        let conflict = "Precondition failed: UID in precondition: u-1, UID in object meta: u-2";
        reply(send, 409, &status(409, "Conflict", conflict));
        let (_, send) = next(&mut handle).await;
        reply(send, 404, &status(404, "NotFound", "pods \"solo\" not found"));
    });
    assert_eq!(cluster.delete_pod("ns", "solo", "u-1").await.unwrap(), DeleteOutcome::Deleted);
    assert_eq!(cluster.delete_pod("ns", "solo", "u-1").await.unwrap(), DeleteOutcome::UidMismatch);
    assert_eq!(cluster.delete_pod("ns", "solo", "u-1").await.unwrap(), DeleteOutcome::NotFound);
    server.await.unwrap();
}

#[tokio::test]
async fn creates_gets_and_records_events() {
    let (cluster, mut handle) = cluster();
    let cluster = cluster.with_instance("vgpu-device-plugin-n1");
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!((seen.method.as_str(), seen.uri.as_str()), ("POST", "/api/v1/namespaces/ns/pods?"));
        assert_eq!(seen.body["metadata"], json!({ "name": "solo", "namespace": "ns" }));
        reply(send, 201, &pod_object("solo", "u-2"));
        let (_, send) = next(&mut handle).await;
        reply(send, 409, &status(409, "AlreadyExists", "pods \"solo\" already exists"));

        let (seen, send) = next(&mut handle).await;
        assert_eq!((seen.method.as_str(), seen.uri.as_str()), ("GET", "/api/v1/namespaces/ns/pods/solo"));
        reply(send, 200, &pod_object("solo", "u-2"));
        let (_, send) = next(&mut handle).await;
        reply(send, 404, &status(404, "NotFound", "pods \"gone\" not found"));

        let (seen, send) = next(&mut handle).await;
        assert_eq!(
            (seen.method.as_str(), seen.uri.as_str()),
            ("POST", "/apis/events.k8s.io/v1/namespaces/ns/events?")
        );
        let body = &seen.body;
        assert_eq!(
            (body["apiVersion"].as_str(), body["kind"].as_str()),
            (Some("events.k8s.io/v1"), Some("Event"))
        );
        assert!(body["metadata"]["name"].as_str().unwrap().starts_with("solo."));
        assert_eq!(body["metadata"]["namespace"], "ns");
        assert_eq!(
            body["regarding"],
            json!({ "apiVersion": "v1", "kind": "Pod", "namespace": "ns", "name": "solo", "uid": "u-2" })
        );
        assert_eq!(body["reportingController"], "vgpu-manager.io/reschedule");
        assert_eq!(body["reportingInstance"], "vgpu-device-plugin-n1");
        assert_eq!((body["type"].as_str(), body["reason"].as_str()), (Some("Normal"), Some("Recovery")));
        assert_eq!((body["action"].as_str(), body["note"].as_str()), (Some("Recovered"), Some("recreated")));
        assert!(body["eventTime"].as_str().unwrap().ends_with('Z'));
        reply(send, 201, body);
    });
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": { "name": "solo", "namespace": "ns" },
        "spec": { "containers": [{ "name": "main", "image": "cuda:12" }] }
    }))
    .unwrap();
    assert_eq!(cluster.create_pod(&pod).await.unwrap(), CreateOutcome::Created { uid: "u-2".into() });
    assert_eq!(cluster.create_pod(&pod).await.unwrap(), CreateOutcome::AlreadyExists);
    assert_eq!(cluster.get_pod("ns", "solo").await.unwrap().unwrap().metadata.uid.as_deref(), Some("u-2"));
    assert!(cluster.get_pod("ns", "gone").await.unwrap().is_none());
    let event = PodEvent {
        namespace: "ns".into(),
        name: "solo".into(),
        uid: "u-2".into(),
        type_: EventType::Normal,
        reason: "Recovery".into(),
        action: "Recovered".into(),
        note: "recreated".into(),
    };
    cluster.record_event(&event).await.unwrap();
    server.await.unwrap();
}

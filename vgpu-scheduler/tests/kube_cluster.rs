//! `KubeCluster` at the HTTP layer: a `tower_test` mock service stands in for the API server, and every
//! request's method, path, query, content type and body is checked.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../vgpu-serve/tests/support/mock_api_server.rs"]
mod mock_api_server;

use mock_api_server::{ApiHandle, next, reply};
use serde_json::{Value, json};
use vgpu_kube::error::ClusterError;
use vgpu_scheduler::cluster::{Binding, Event, EventType};
use vgpu_scheduler::{Cluster, KubeCluster, MetadataPatch, PodPhase};

/// 2026-01-02T03:04:05.123456789Z
const NOW_NS: i64 = 1_767_323_045_123_456_789;

fn cluster() -> (KubeCluster, ApiHandle) {
    let (client, handle) = mock_api_server::mock_client();
    let cluster = KubeCluster::new(client, "vgpu-scheduler");
    (cluster, handle)
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": reason, "message": message, "code": code})
}

fn pod(name: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": "7",
                     "annotations": {"nvidia.com/predicate-node": "n1"}},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/vgpu-number": "1"}}}]},
        "status": {"phase": "Running"}
    })
}

fn node(name: &str, vgpus: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        "status": {"allocatable": {"nvidia.com/vgpu-number": vgpus, "cpu": "8"}}
    })
}

fn list(kind: &str, items: Vec<Value>, cont: Option<&str>) -> Value {
    let mut meta = json!({"resourceVersion": "100"});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    json!({"apiVersion": "v1", "kind": kind, "metadata": meta, "items": items})
}

#[tokio::test]
async fn snapshot_pages_nodes_then_pods_with_continue_tokens() {
    let (cluster, mut handle) = cluster();
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!((seen.method.as_str(), seen.uri.as_str()), ("GET", "/api/v1/nodes?&limit=500"));
        reply(send, 200, &list("NodeList", vec![node("n1", "40")], Some("node-page-2")));
        let (seen, send) = next(&mut handle).await;
        assert_eq!(
            (seen.method.as_str(), seen.uri.as_str()),
            ("GET", "/api/v1/nodes?&limit=500&continue=node-page-2")
        );
        reply(send, 200, &list("NodeList", vec![node("n2", "0")], None));
        let (seen, send) = next(&mut handle).await;
        assert_eq!((seen.method.as_str(), seen.uri.as_str()), ("GET", "/api/v1/pods?&limit=500"));
        reply(send, 200, &list("PodList", vec![pod("a", "u-a")], Some("pod-page-2")));
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.uri, "/api/v1/pods?&limit=500&continue=pod-page-2");
        // An empty continue token ends the paging too.
        let mut last = list("PodList", vec![pod("b", "u-b")], None);
        last["metadata"]["continue"] = json!("");
        reply(send, 200, &last);
    });
    let (nodes, pods) = cluster.snapshot().await.unwrap();
    server.await.unwrap();
    assert_eq!(nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["n1", "n2"]);
    assert_eq!(nodes[0].allocatable.get("nvidia.com/vgpu-number"), Some(&40));
    assert!(!nodes[0].allocatable.contains_key("cpu"));
    assert_eq!(pods.iter().map(|p| p.uid.as_str()).collect::<Vec<_>>(), ["u-a", "u-b"]);
    assert_eq!(pods[0].phase, PodPhase::Running);
    assert_eq!(pods[0].resource_version, 7);
}

#[tokio::test]
async fn snapshot_fails_when_a_page_fails() {
    let (cluster, mut handle) = cluster();
    let server = tokio::spawn(async move {
        let (_, send) = next(&mut handle).await;
        reply(send, 200, &list("NodeList", vec![], None));
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.uri, "/api/v1/pods?&limit=500");
        reply(send, 503, &status(503, "ServiceUnavailable", "etcd is down"));
    });
    let err = cluster.snapshot().await.unwrap_err();
    server.await.unwrap();
    assert!(
        matches!(&err, ClusterError::Unavailable(m) if m.starts_with("list pods: etcd is down")),
        "{err}"
    );
}

#[tokio::test]
async fn gets_a_pod() {
    let (cluster, mut handle) = cluster();
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!((seen.method.as_str(), seen.uri.as_str()), ("GET", "/api/v1/namespaces/ns/pods/p"));
        assert_eq!(seen.body, Value::Null);
        reply(send, 200, &pod("p", "u-p"));
    });
    let p = cluster.get_pod("ns", "p").await.unwrap();
    server.await.unwrap();
    assert_eq!((p.namespace.as_str(), p.name.as_str(), p.uid.as_str()), ("ns", "p", "u-p"));
    assert_eq!(p.annotations["nvidia.com/predicate-node"], "n1");
}

#[tokio::test]
async fn patches_pod_metadata_with_exactly_the_merge_patch() {
    let (cluster, mut handle) = cluster();
    let patch = MetadataPatch::default()
        .label("nvidia.com/assigned-phase", "filtering")
        .label("nvidia.com/metrics-node", "n1")
        .remove_label("stale")
        .annotation("nvidia.com/pre-allocated", "main[0_GPU-0_50_4096]")
        .annotation("nvidia.com/real-allocated", "");
    let expected = patch.to_json();
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.method, "PATCH");
        assert_eq!(seen.uri, "/api/v1/namespaces/ns/pods/p?");
        assert_eq!(seen.content_type.as_deref(), Some("application/merge-patch+json"));
        assert_eq!(String::from_utf8(seen.raw).unwrap(), expected);
        assert_eq!(seen.body["metadata"]["labels"]["stale"], Value::Null);
        let mut updated = pod("p", "u-p");
        updated["metadata"]["labels"] = json!({"nvidia.com/assigned-phase": "filtering"});
        reply(send, 200, &updated);
    });
    let updated = cluster.patch_pod_metadata("ns", "p", &patch).await.unwrap();
    server.await.unwrap();
    assert_eq!(updated.labels["nvidia.com/assigned-phase"], "filtering");
}

#[tokio::test]
async fn binds_with_the_pod_uid_as_precondition() {
    let (cluster, mut handle) = cluster();
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.method, "POST");
        assert_eq!(seen.uri, "/api/v1/namespaces/ns/pods/p/binding?");
        assert_eq!(seen.content_type.as_deref(), Some("application/json"));
        assert_eq!(
            seen.body,
            json!({
                "apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": "p", "namespace": "ns", "uid": "u-p"},
                "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}
            })
        );
        reply(send, 201, &json!({"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 201}));
    });
    let b = Binding::new("ns", "p", "u-p", "n1");
    cluster.bind_pod(&b).await.unwrap();
    server.await.unwrap();
}

#[tokio::test]
async fn a_binding_carries_labels_and_annotations() {
    let (cluster, mut handle) = cluster();
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.uri, "/api/v1/namespaces/ns/pods/p/binding?");
        assert_eq!(
            seen.body,
            json!({
                "apiVersion": "v1", "kind": "Binding",
                "metadata": {
                    "name": "p", "namespace": "ns", "uid": "u-p",
                    "labels": {"nvidia.com/assigned-phase": "allocating"},
                    "annotations": {"nvidia.com/predicate-node": "n1", "nvidia.com/real-allocated": ""}
                },
                "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}
            })
        );
        reply(send, 201, &json!({"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 201}));
    });
    // A deletion in the patch cannot ride on a binding: it is left out.
    let patch = MetadataPatch::default()
        .label("nvidia.com/assigned-phase", "allocating")
        .remove_label("nvidia.com/gone")
        .annotation("nvidia.com/predicate-node", "n1")
        .annotation("nvidia.com/real-allocated", "");
    let b = Binding::new("ns", "p", "u-p", "n1").carrying(&patch);
    cluster.bind_pod(&b).await.unwrap();
    server.await.unwrap();
}

#[tokio::test]
async fn binding_a_recreated_pod_is_a_conflict() {
    let (cluster, mut handle) = cluster();
    let server = tokio::spawn(async move {
        let (_, send) = next(&mut handle).await;
        let msg = "Operation cannot be fulfilled on pods/binding \"p\": Precondition failed: UID in precondition: u-old, UID in object meta: u-new";
        reply(send, 409, &status(409, "Conflict", msg));
    });
    let b = Binding::new("ns", "p", "u-old", "n1");
    let err = cluster.bind_pod(&b).await.unwrap_err();
    server.await.unwrap();
    match &err {
        ClusterError::Conflict(m) => {
            assert!(m.starts_with("bind pod ns/p to node n1: Operation cannot be fulfilled"), "{m}");
            assert!(m.ends_with("(409)"), "{m}");
        }
        other => panic!("{other:?}"),
    }
    assert!(err.is_retriable());
}

#[tokio::test]
async fn records_core_v1_events() {
    let (cluster, mut handle) = cluster();
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.method, "POST");
        assert_eq!(seen.uri, "/api/v1/namespaces/ns/events?");
        assert_eq!(seen.content_type.as_deref(), Some("application/json"));
        assert_eq!(
            seen.body,
            json!({
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": format!("p.{NOW_NS:x}"), "namespace": "ns"},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "ns"},
                "reason": "FilteringFailed",
                "message": "0/2 nodes are available: Insufficient vGPU slots (n1, n2).",
                "type": "Warning",
                "source": {"component": "vgpu-scheduler"},
                "reportingComponent": "vgpu-scheduler",
                "firstTimestamp": "2026-01-02T03:04:05Z",
                "lastTimestamp": "2026-01-02T03:04:05Z",
                "count": 1
            })
        );
        reply(send, 201, &seen.body);
        // The second event fails: logged, not returned.
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.body["type"], "Normal");
        reply(send, 403, &status(403, "Forbidden", "events is forbidden"));
    });
    cluster
        .record_event(Event {
            namespace: "ns".into(),
            pod: "p".into(),
            kind: EventType::Warning,
            reason: "FilteringFailed",
            message: "0/2 nodes are available: Insufficient vGPU slots (n1, n2).".into(),
            at_ns: NOW_NS,
        })
        .await;
    cluster
        .record_event(Event {
            namespace: "ns".into(),
            pod: "p".into(),
            kind: EventType::Normal,
            reason: "FilteringSucceed",
            message: "Successfully matched node \"n1\"".into(),
            at_ns: NOW_NS,
        })
        .await;
    server.await.unwrap();
}

#[tokio::test]
async fn api_errors_map_to_cluster_errors() {
    let cases: [(u16, &str); 8] = [
        (404, "NotFound"),
        (409, "Conflict"),
        (429, "TooManyRequests"),
        (500, "InternalError"),
        (504, "Timeout"),
        (408, "Timeout"),
        (403, "Forbidden"),
        (422, "Invalid"),
    ];
    for (code, reason) in cases {
        let (cluster, mut handle) = cluster();
        let server = tokio::spawn(async move {
            let (_, send) = next(&mut handle).await;
            reply(send, code, &status(code, reason, "boom"));
        });
        let err = cluster.get_pod("ns", "p").await.unwrap_err();
        server.await.unwrap();
        let text = format!("get pod ns/p: boom ({code})");
        let expected = match code {
            404 => ClusterError::NotFound("pod ns/p [get]".into()),
            409 => ClusterError::Conflict(text),
            408 | 429 | 500 | 504 => ClusterError::Unavailable(text),
            _ => ClusterError::Other(text),
        };
        assert_eq!(err, expected, "status {code}");
    }
}

#[tokio::test]
async fn a_broken_connection_is_unavailable() {
    let (cluster, mut handle) = cluster();
    let server = tokio::spawn(async move {
        let (_, send) = next(&mut handle).await;
        send.send_error(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset"));
    });
    let err = cluster.patch_pod_metadata("ns", "p", &MetadataPatch::default()).await.unwrap_err();
    server.await.unwrap();
    assert!(matches!(&err, ClusterError::Unavailable(m) if m.starts_with("patch pod ns/p: ")), "{err:?}");
}

#[tokio::test]
async fn lists_pod_disruption_budgets_in_all_namespaces_with_paging() {
    let (cluster, mut handle) = cluster();
    let pdb = |name: &str, allowed: i64| {
        json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"selector": {"matchLabels": {"app": name}}},
            "status": {"disruptionsAllowed": allowed, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}
        })
    };
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!(
            (seen.method.as_str(), seen.uri.as_str()),
            ("GET", "/apis/policy/v1/poddisruptionbudgets?&limit=500")
        );
        reply(send, 200, &list("PodDisruptionBudgetList", vec![pdb("web", 0)], Some("p2")));
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.uri, "/apis/policy/v1/poddisruptionbudgets?&limit=500&continue=p2");
        reply(send, 200, &list("PodDisruptionBudgetList", vec![pdb("db", 2)], None));
        let (_, send) = next(&mut handle).await;
        reply(send, 403, &status(403, "Forbidden", "cannot list poddisruptionbudgets"));
    });
    let pdbs = cluster.list_pod_disruption_budgets().await.unwrap();
    assert_eq!(
        pdbs.iter().map(|p| (p.name.as_str(), p.disruptions_allowed)).collect::<Vec<_>>(),
        [("web", 0), ("db", 2)]
    );
    assert_eq!(pdbs[0].selector.as_ref().unwrap().match_labels["app"], "web");
    let err = cluster.list_pod_disruption_budgets().await.unwrap_err();
    server.await.unwrap();
    assert!(
        matches!(&err, ClusterError::Other(m) if m.starts_with("list poddisruptionbudgets: cannot list")),
        "{err}"
    );
}

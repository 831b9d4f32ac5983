//! `KubeCluster` at the HTTP layer: a `tower_test` mock service stands in for the API server, and each
//! request's method, path, query, content type and body is checked (node and ConfigMap reads with 404 as
//! "absent", the PhysicalGPU list by field selector, server-side apply of spec and status with the agent's
//! field manager, delete with 404 as success, node labels), for the default group and another one.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../vgpu-serve/tests/support/mock_api_server.rs"]
mod mock_api_server;

use std::collections::BTreeMap;

use mock_api_server::{ApiHandle, next, reply};
use serde_json::{Value, json};
use vgpu_node_agent::{
    AgentCluster, AgentConfig, GpuObject, KubeCluster, NodeAgent,
    fake_sysfs::{FakeDevice, FakeSysfs},
};

fn cluster(group: &str) -> (KubeCluster, ApiHandle) {
    let (client, handle) = mock_api_server::mock_client();
    (KubeCluster::new(client, group).unwrap(), handle)
}

fn not_found(kind: &str, name: &str) -> Value {
    json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
            "message": format!("{kind} \"{name}\" not found") })
}

fn gpu_object() -> GpuObject {
    let dir = tempfile::tempdir().unwrap();
    let sys = FakeSysfs::create(dir.path()).unwrap();
    sys.add("0000:3b:00.0", &FakeDevice::gpu("10de", "20b0", "nvidia")).unwrap();
    let config = vgpu_core::discovery::DiscoveryConfig::default()
        .with_sysfs_root(sys.sysfs_root())
        .with_pci_ids_paths([sys.pci_ids()]);
    let report = vgpu_core::discovery::discover(&config).unwrap();
    vgpu_node_agent::desired::gpu_object("w1", "gpu.deckhouse.io", &report.gpus[0]).unwrap()
}

#[tokio::test]
async fn reads_node_and_config_map_with_404_as_absent() {
    let (cluster, mut handle) = cluster("gpu.deckhouse.io");
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!((seen.method.as_str(), seen.uri.as_str()), ("GET", "/api/v1/nodes/w1"));
        reply(
            send,
            200,
            &json!({ "apiVersion": "v1", "kind": "Node",
            "metadata": { "name": "w1", "labels": { "node-role.kubernetes.io/control-plane": "" } } }),
        );
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.uri, "/api/v1/nodes/w2");
        reply(send, 404, &not_found("nodes", "w2"));
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.uri, "/api/v1/namespaces/d8-gpu/configmaps/gpu-supported-vendors");
        reply(
            send,
            200,
            &json!({ "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "gpu-supported-vendors", "namespace": "d8-gpu" },
            "data": { "vendors.yaml": "vendors: []" } }),
        );
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.uri, "/api/v1/namespaces/d8-gpu/configmaps/gone");
        reply(send, 404, &not_found("configmaps", "gone"));
        let (_, send) = next(&mut handle).await;
        reply(
            send,
            500,
            &json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500, "message": "etcd down" }),
        );
    });
    let labels = cluster.node_labels("w1").await.unwrap().unwrap();
    assert!(labels.contains_key("node-role.kubernetes.io/control-plane"));
    assert_eq!(cluster.node_labels("w2").await.unwrap(), None);
    let data = cluster.config_map_data("d8-gpu", "gpu-supported-vendors").await.unwrap().unwrap();
    assert_eq!(data["vendors.yaml"], "vendors: []");
    assert_eq!(cluster.config_map_data("d8-gpu", "gone").await.unwrap(), None);
    let err = cluster.node_labels("w3").await.unwrap_err();
    assert!(err.to_string().contains("get Node w3") && err.to_string().contains("etcd down"), "{err}");
    server.await.unwrap();
}

#[tokio::test]
async fn lists_by_field_selector_applies_spec_then_status_and_deletes() {
    let (cluster, mut handle) = cluster("gpu.deckhouse.io");
    let gpu = gpu_object();
    let expected_spec = serde_json::to_value(&gpu.spec).unwrap();
    let expected_status = serde_json::to_value(&gpu.status).unwrap();
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.method, "GET");
        assert_eq!(
            seen.uri,
            "/apis/gpu.deckhouse.io/v1alpha1/physicalgpus?&fieldSelector=spec.nodeName%3Dw1"
        );
        reply(
            send,
            200,
            &json!({ "apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "PhysicalGPUList",
            "metadata": {}, "items": [
                { "apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "PhysicalGPU", "metadata": { "name": "w1-a" } },
                { "apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "PhysicalGPU", "metadata": { "name": "w1-b" } }
            ] }),
        );

        let name = "w1-nvidia-20b0-0000-3b-00-0";
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.method, "PATCH");
        assert_eq!(
            seen.uri,
            format!(
                "/apis/gpu.deckhouse.io/v1alpha1/physicalgpus/{name}?&force=true&fieldManager=vgpu-node-agent"
            )
        );
        assert_eq!(seen.content_type.as_deref(), Some("application/apply-patch+yaml"));
        assert_eq!(
            seen.body,
            json!({
                "apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "PhysicalGPU",
                "metadata": { "name": name, "labels": { "gpu.deckhouse.io/node": "w1", "gpu.deckhouse.io/vendor": "nvidia" } },
                "spec": expected_spec,
            })
        );
        reply(send, 200, &seen.body);

        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.method, "PATCH");
        assert_eq!(
            seen.uri,
            format!(
                "/apis/gpu.deckhouse.io/v1alpha1/physicalgpus/{name}/status?&force=true&fieldManager=vgpu-node-agent"
            )
        );
        assert_eq!(seen.content_type.as_deref(), Some("application/apply-patch+yaml"));
        assert_eq!(
            seen.body,
            json!({
                "apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "PhysicalGPU",
                "metadata": { "name": name }, "status": expected_status,
            })
        );
        assert_eq!(seen.body["status"]["conditions"][0]["type"], "DriverBound");
        reply(send, 200, &seen.body);

        let (seen, send) = next(&mut handle).await;
        assert_eq!(
            (seen.method.as_str(), seen.uri.as_str()),
            ("DELETE", "/apis/gpu.deckhouse.io/v1alpha1/physicalgpus/w1-a?")
        );
        reply(send, 200, &json!({ "kind": "Status", "apiVersion": "v1", "status": "Success" }));
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.uri, "/apis/gpu.deckhouse.io/v1alpha1/physicalgpus/w1-b?");
        reply(send, 404, &not_found("physicalgpus.gpu.deckhouse.io", "w1-b"));
    });
    assert_eq!(cluster.list_gpus("w1").await.unwrap(), ["w1-a", "w1-b"]);
    cluster.apply_gpu(&gpu).await.unwrap();
    cluster.delete_gpu("w1-a").await.unwrap();
    cluster.delete_gpu("w1-b").await.unwrap();
    server.await.unwrap();
}

#[tokio::test]
async fn node_labels_are_applied_with_the_field_manager() {
    let (cluster, mut handle) = cluster("gpu.deckhouse.io");
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.method, "PATCH");
        assert_eq!(seen.uri, "/api/v1/nodes/w1?&force=true&fieldManager=vgpu-node-agent");
        assert_eq!(seen.content_type.as_deref(), Some("application/apply-patch+yaml"));
        assert_eq!(
            seen.body,
            json!({ "apiVersion": "v1", "kind": "Node",
            "metadata": { "name": "w1", "labels": { "gpu.deckhouse.io/vendor": "metax" } } })
        );
        reply(send, 200, &seen.body);
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.body["metadata"]["labels"], json!({}), "an empty set drops the agent's labels");
        reply(send, 200, &seen.body);
    });
    let labels = BTreeMap::from([("gpu.deckhouse.io/vendor".to_owned(), "metax".to_owned())]);
    cluster.apply_node_labels("w1", &labels).await.unwrap();
    cluster.apply_node_labels("w1", &BTreeMap::new()).await.unwrap();
    server.await.unwrap();
}

#[tokio::test]
async fn another_group_is_used_in_paths_and_api_version() {
    let (client, mut handle) = mock_api_server::mock_client();
    let cluster = KubeCluster::new(client, "gpu.example.com").unwrap();
    assert!(KubeCluster::new(mock_api_server::mock_client().0, "nodots").is_err());
    let dir = tempfile::tempdir().unwrap();
    let sys = FakeSysfs::create(dir.path()).unwrap();
    sys.add("0000:5e:00.0", &FakeDevice::gpu("9999", "4001", "metax")).unwrap();
    let mut config = AgentConfig::new("w1");
    config.sysfs_root = sys.sysfs_root();
    config.pci_ids_paths = vec![sys.pci_ids()];
    config.group = "gpu.example.com".into();
    config.label_domain = "example.com".into();
    let mut agent = NodeAgent::new(std::sync::Arc::new(cluster), config);
    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.uri, "/apis/gpu.example.com/v1alpha1/physicalgpus?&fieldSelector=spec.nodeName%3Dw1");
        reply(
            send,
            200,
            &json!({ "apiVersion": "gpu.example.com/v1alpha1", "kind": "PhysicalGPUList", "metadata": {}, "items": [] }),
        );
        for suffix in ["", "/status"] {
            let (seen, send) = next(&mut handle).await;
            assert_eq!(
                seen.uri,
                format!(
                    "/apis/gpu.example.com/v1alpha1/physicalgpus/w1-metax-4001-0000-5e-00-0{suffix}?&force=true&fieldManager=vgpu-node-agent"
                )
            );
            assert_eq!(seen.body["apiVersion"], "gpu.example.com/v1alpha1");
            reply(send, 200, &seen.body);
        }
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.uri, "/api/v1/nodes/w1?&force=true&fieldManager=vgpu-node-agent");
        assert_eq!(
            seen.body["metadata"]["labels"],
            json!({ "example.com/vendor": "metax", "example.com/vendor.metax": "true" })
        );
        reply(send, 200, &seen.body);
    });
    let outcome = agent.scan_once().await.unwrap();
    assert_eq!(outcome.applied, ["w1-metax-4001-0000-5e-00-0"]);
    server.await.unwrap();
}

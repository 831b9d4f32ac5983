//! `KubeSliceStore` and a `SlicePublisher` over it at the HTTP layer: a `tower_test` mock service stands in
//! for the API server, and every request's method, path, query and body is checked (the node+driver field
//! selector of the list, create, replace carrying the listed resourceVersion, delete with 404 as done,
//! and API errors named with the slice and action).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../vgpu-serve/tests/support/mock_api_server.rs"]
mod mock_api_server;

use std::sync::Arc;

use mock_api_server::{next, reply};
use serde_json::{Value, json};
use tokio::sync::watch;
use vgpu_core::model::GpuDevice;
use vgpu_dra::{
    devices::{AllocatableDevices, DeviceConfig},
    health::HealthSnapshot,
    slices::{
        SliceConfig,
        publisher::{PublishOutcome, SlicePublisher},
        store::{KubeSliceStore, SliceStore},
    },
};

const LIST_URI: &str = "/apis/resource.k8s.io/v1/resourceslices?&fieldSelector=spec.nodeName%3Dnode-a%2Cspec.driver%3Dmanager.nvidia.com";

fn devices() -> Arc<AllocatableDevices> {
    let gpu = GpuDevice { index: 0, uuid: "GPU-0".into(), memory_mib: 1024, ..GpuDevice::default() };
    Arc::new(AllocatableDevices::new(&DeviceConfig::default(), vec![(gpu, 0)], None).unwrap())
}

fn list(items: Vec<Value>) -> Value {
    json!({ "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "metadata": {}, "items": items })
}

fn stored(mut body: Value, version: &str) -> Value {
    body["metadata"]["resourceVersion"] = json!(version);
    body
}

fn slice(name: &str, pool: &str, generation: i64, version: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": { "name": name, "resourceVersion": version },
        "spec": { "driver": "manager.nvidia.com", "nodeName": "node-a",
                  "pool": { "name": pool, "generation": generation, "resourceSliceCount": 1 }, "devices": [] }
    })
}

#[tokio::test]
async fn publisher_requests_first_publish_then_replace_and_delete() {
    let (client, mut handle) = mock_api_server::mock_client();
    let store = KubeSliceStore::new(client, "node-a", "manager.nvidia.com");
    let mut publisher = SlicePublisher::new(
        store,
        SliceConfig::new("node-a"),
        devices(),
        watch::channel(HealthSnapshot::unmonitored_default()).1,
    );
    let server = tokio::spawn(async move {
        // Round 1: nothing listed (a slice of another pool is ignored), one created.
        let (seen, send) = next(&mut handle).await;
        assert_eq!((seen.method.as_str(), seen.uri.as_str()), ("GET", LIST_URI));
        reply(send, 200, &list(vec![slice("other", "node-b", 4, "3")]));
        let (seen, send) = next(&mut handle).await;
        assert_eq!(
            (seen.method.as_str(), seen.uri.as_str()),
            ("POST", "/apis/resource.k8s.io/v1/resourceslices?")
        );
        assert_eq!(seen.body["metadata"]["name"], "node-a-manager.nvidia.com-0");
        assert_eq!(
            seen.body["spec"]["pool"],
            json!({ "name": "node-a", "generation": 1, "resourceSliceCount": 1 })
        );
        assert_eq!(seen.body["spec"]["devices"][0]["name"], "vgpu-0");
        assert_eq!(seen.body["spec"]["devices"][0]["capacity"]["memory"]["value"], "1Gi");
        let created = stored(seen.body.clone(), "10");
        reply(send, 201, &created);

        // Round 2: the API holds what was written: nothing to do.
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.uri, LIST_URI);
        reply(send, 200, &list(vec![created.clone()]));

        // Round 3: someone rewrote it (new resourceVersion) and left a stray slice: replace with the listed
        // version at the next generation, delete the stray one (already gone: 404 is fine).
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.uri, LIST_URI);
        let mut tampered = stored(created.clone(), "12");
        tampered["spec"]["devices"] = json!([]);
        let stray = slice("node-a-manager.nvidia.com-1", "node-a", 1, "11");
        reply(send, 200, &list(vec![tampered, stray]));
        let (seen, send) = next(&mut handle).await;
        assert_eq!(
            (seen.method.as_str(), seen.uri.as_str()),
            ("PUT", "/apis/resource.k8s.io/v1/resourceslices/node-a-manager.nvidia.com-0?")
        );
        assert_eq!(seen.body["metadata"]["resourceVersion"], "12");
        assert_eq!(seen.body["spec"]["pool"]["generation"], 2);
        assert_eq!(seen.body["spec"]["devices"][0]["name"], "vgpu-0");
        reply(send, 200, &stored(seen.body.clone(), "13"));
        let (seen, send) = next(&mut handle).await;
        assert_eq!(
            (seen.method.as_str(), seen.uri.as_str()),
            ("DELETE", "/apis/resource.k8s.io/v1/resourceslices/node-a-manager.nvidia.com-1?")
        );
        reply(
            send,
            404,
            &json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found" }),
        );
    });
    let first = publisher.sync().await.unwrap();
    assert_eq!(first, PublishOutcome::Published { generation: 1, created: 1, replaced: 0, deleted: 0 });
    assert_eq!(publisher.sync().await.unwrap(), PublishOutcome::Unchanged);
    let third = publisher.sync().await.unwrap();
    assert_eq!(third, PublishOutcome::Published { generation: 2, created: 0, replaced: 1, deleted: 1 });
    server.await.unwrap();
}

#[tokio::test]
async fn api_errors_name_the_slice_and_the_action() {
    let (client, mut handle) = mock_api_server::mock_client();
    let store = KubeSliceStore::new(client, "node-a", "manager.nvidia.com");
    let server = tokio::spawn(async move {
        let (_, send) = next(&mut handle).await;
        reply(
            send,
            409,
            &json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409, "message": "the object has been modified" }),
        );
        let (_, send) = next(&mut handle).await;
        reply(
            send,
            403,
            &json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403, "message": "forbidden" }),
        );
    });
    let mut body = slice("s-0", "node-a", 1, "5");
    body["metadata"]["resourceVersion"] = json!("5");
    let object = serde_json::from_value(body).unwrap();
    let err = store.replace(&object).await.unwrap_err().to_string();
    assert!(err.starts_with("ResourceSlice s-0: replace: "), "{err}");
    assert!(err.contains("the object has been modified"), "{err}");
    let err = store.list().await.unwrap_err().to_string();
    assert!(err.starts_with("ResourceSlice pool node-a: list: "), "{err}");
    server.await.unwrap();
}

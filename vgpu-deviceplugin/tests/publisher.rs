//! The node publisher against the in-memory cluster, with short intervals.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;
use vgpu_core::{
    backend::{HealthEvent, HealthEventKind},
    codec::node_devices,
    domain::ResourceDomain,
    model::GpuDevice,
    node_config::NodeSettings,
    topology::DeviceTopology,
};
use vgpu_deviceplugin::{
    cluster::{InMemoryCluster, NodeInfo},
    inventory::{DeviceState, node_devices as apply_settings},
    publisher::{DriverLabels, NodePublisher, PublisherConfig},
};

fn gpus() -> Vec<GpuDevice> {
    (0..2)
        .map(|i| GpuDevice {
            index: i,
            uuid: format!("GPU-{i}"),
            type_name: "NVIDIA L4".into(),
            memory_mib: 23034,
            ..GpuDevice::default()
        })
        .collect()
}

fn fast() -> PublisherConfig {
    PublisherConfig {
        interval: Duration::from_secs(3600),
        retry_min: Duration::from_millis(20),
        retry_max: Duration::from_millis(40),
        stale_poll: Duration::from_millis(10),
        stale_clean_passes: 3,
        shutdown_attempts: 3,
    }
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..200 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

fn setup() -> (Arc<InMemoryCluster>, DeviceState, NodeSettings) {
    let cluster = Arc::new(InMemoryCluster::default());
    let mut node = NodeInfo::default();
    node.annotations.insert("nvidia.com/node-device-heartbeat".into(), "old".into());
    node.capacity.insert("nvidia.com/vgpu-cores".into(), "200".into());
    node.allocatable.insert("nvidia.com/vgpu-cores".into(), "200".into());
    node.capacity.insert("nvidia.com/vgpu-number".into(), "20".into());
    cluster.upsert_node("n1", node);
    let settings = NodeSettings::default();
    let state = DeviceState::new(apply_settings(&gpus(), &settings), &settings);
    (cluster, state, settings)
}

#[tokio::test]
async fn publishes_updates_on_health_change_and_cleans_up_on_shutdown() {
    let (cluster, state, settings) = setup();
    let topology =
        DeviceTopology::decode(r#"[{"index":0,"links":{"1":[5]}},{"index":1,"links":{"0":[5]}}]"#).unwrap();
    let publisher =
        NodePublisher::new("n1", ResourceDomain::default(), settings, state.clone(), cluster.clone())
            .with_config(fast())
            .with_topology(topology)
            .with_driver_labels(DriverLabels {
                driver_version: "570.86.10".into(),
                cuda_version: Some((12, 8)),
            })
            .with_gfd_labels(
                [
                    ("nvidia.com/gpu.product".to_owned(), "NVIDIA-L4".to_owned()),
                    ("nvidia.com/gpu.count".into(), "2".into()),
                ]
                .into(),
            )
            .with_stale_resources(vec!["nvidia.com/vgpu-cores".into()]);
    let stop = CancellationToken::new();
    let task = tokio::spawn(publisher.run(stop.clone().cancelled_owned()));

    let c = cluster.clone();
    eventually("first publish", || {
        c.node("n1").unwrap().annotations.contains_key("nvidia.com/node-device-register")
    })
    .await;
    let node = cluster.node("n1").unwrap();
    let inv = node_devices::decode(&node.annotations["nvidia.com/node-device-register"]).unwrap();
    assert_eq!(inv.len(), 2);
    assert!(inv.devices.iter().all(|d| d.health.is_healthy() && d.split_count == 10 && d.cores == 100));
    assert_eq!(
        node.annotations["nvidia.com/node-config-info"],
        r#"{"deviceSplit":10,"coresScaling":1,"memoryFactor":1,"memoryScaling":1}"#
    );
    assert_eq!(
        node.annotations["nvidia.com/node-device-topology"],
        r#"[{"index":0,"links":{"1":[5]}},{"index":1,"links":{"0":[5]}}]"#
    );
    assert!(!node.annotations.contains_key("nvidia.com/node-device-heartbeat"));
    assert_eq!(node.labels["nvidia.com/node-driver-version"], "570.86.10");
    assert_eq!(node.labels["nvidia.com/node-cuda-version"], "12.8");
    assert_eq!(node.labels["nvidia.com/node-cuda-major"], "12");
    assert_eq!(node.labels["nvidia.com/node-cuda-minor"], "8");
    assert_eq!(node.labels["nvidia.com/gpu.product"], "NVIDIA-L4");
    assert_eq!(node.labels["nvidia.com/gpu.count"], "2");

    let c = cluster.clone();
    eventually("stale capacity removed", || {
        let n = c.node("n1").unwrap();
        !n.capacity.contains_key("nvidia.com/vgpu-cores")
            && !n.allocatable.contains_key("nvidia.com/vgpu-cores")
    })
    .await;
    assert_eq!(cluster.node("n1").unwrap().capacity["nvidia.com/vgpu-number"], "20");

    // A health change is published at once (the interval is an hour).
    assert!(state.apply(&HealthEvent {
        index: 1,
        uuid: "GPU-1".into(),
        kind: HealthEventKind::DeviceLost,
        message: String::new()
    }));
    let c = cluster.clone();
    eventually("unhealthy GPU published", || {
        let n = c.node("n1").unwrap();
        let inv = node_devices::decode(&n.annotations["nvidia.com/node-device-register"]).unwrap();
        !inv.devices[1].health.is_healthy()
    })
    .await;

    stop.cancel();
    task.await.unwrap();
    let node = cluster.node("n1").unwrap();
    for key in ["node-device-register", "node-config-info", "node-device-topology"] {
        assert!(!node.annotations.contains_key(&format!("nvidia.com/{key}")), "{key} removed");
    }
    assert_eq!(node.labels["nvidia.com/node-driver-version"], "570.86.10", "labels stay");
}

#[tokio::test]
async fn api_errors_are_retried_not_fatal() {
    let (cluster, state, settings) = setup();
    cluster.fail_node_calls(3);
    let publisher = NodePublisher::new("n1", ResourceDomain::default(), settings, state, cluster.clone())
        .with_config(fast());
    let stop = CancellationToken::new();
    let task = tokio::spawn(publisher.run(stop.clone().cancelled_owned()));
    let c = cluster.clone();
    eventually("publish after retries", || {
        c.node("n1").unwrap().annotations.contains_key("nvidia.com/node-config-info")
    })
    .await;
    assert!(cluster.node_calls() >= 4);
    // Shutdown removal is retried too.
    cluster.fail_node_calls(2);
    stop.cancel();
    task.await.unwrap();
    assert!(!cluster.node("n1").unwrap().annotations.contains_key("nvidia.com/node-config-info"));
}

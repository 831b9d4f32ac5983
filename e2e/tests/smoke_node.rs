//! Smoke test of the e2e environment: a vGPU node round-trips through the real API server.
//!
//! Needs the control-plane binaries (`e2e/build-controlplane.sh`); run with
//! `cargo test -p vgpu-e2e -- --ignored --test-threads=1` or `e2e/run.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Api;
use vgpu_e2e::TestEnv;
use vgpu_e2e::fixtures::{self, NODE_DEVICE_REGISTER, VGPU_NUMBER};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn vgpu_node_capacity_and_device_register_round_trip() {
    let env = TestEnv::builder("vgpu_node_capacity_and_device_register_round_trip").start().await.unwrap();
    let client = env.client().await.unwrap();

    // 4 GPUs split 10 ways: nvidia.com/vgpu-number = 40.
    fixtures::create_vgpu_node(&client, "gpu-node-1", 4, 10).await.unwrap();

    let node = Api::<Node>::all(client).get("gpu-node-1").await.unwrap();
    let status = node.status.unwrap();
    assert_eq!(status.capacity.unwrap()[VGPU_NUMBER], Quantity("40".into()));
    assert_eq!(status.allocatable.unwrap()[VGPU_NUMBER], Quantity("40".into()));
    let register = &node.metadata.annotations.unwrap()[NODE_DEVICE_REGISTER];
    let register: serde_json::Value = serde_json::from_str(register).unwrap();
    assert_eq!(register, fixtures::device_register(4, 10));
    assert_eq!(register[3]["id"], 3);
    assert_eq!(register[0]["number"], 10);

    env.finish();
}

//! Prepare's rules at the state layer ([`DeviceState`] over real files, in-memory claims, mock backend):
//! each failing claim fails only its own entry with an error naming the claim and the cause (not found,
//! UID mismatch, not allocated, another pool, unknown device, over capacity, the claim-sharing rule,
//! overlapping devices); whole-GPU claims; the stale-claim sweep; the lock timeout.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use support::{DRIVER, NODE, TestNode};
use vgpu_dra::claims::ClaimRef;
use vgpu_dra::{
    claims::{allocated, allocation_result, claim},
    lock::PuLock,
};

fn r(name: &str, uid: &str) -> ClaimRef {
    ClaimRef::new("ns", name, uid)
}

#[tokio::test]
async fn every_failing_claim_fails_alone_with_its_reason() {
    let node = TestNode::new();
    node.add_vgpu_claim("good", "u-good", "vgpu-0", "s1", "10", "1Gi");
    node.add_vgpu_claim("renamed", "u-new", "vgpu-0", "s2", "10", "1Gi");
    node.claims.insert(claim("ns", "bare", "u-bare"));
    let other_pool = allocation_result("gpu", DRIVER, "node-2", "vgpu-0", Some("s3"), &[]);
    node.claims.insert(allocated(claim("ns", "pool", "u-pool"), vec![other_pool], &["p"]));
    let unknown = allocation_result("gpu", DRIVER, NODE, "vgpu-9", Some("s4"), &[]);
    node.claims.insert(allocated(claim("ns", "unknown", "u-unknown"), vec![unknown], &["p"]));
    let big = allocation_result("gpu", DRIVER, NODE, "vgpu-1", Some("s5"), &[("cores", "101")]);
    node.claims.insert(allocated(claim("ns", "big", "u-big"), vec![big], &["p"]));
    let shared = allocation_result("gpu", DRIVER, NODE, "vgpu-1", Some("s6"), &[("cores", "5")]);
    node.claims.insert(allocated(claim("ns", "shared", "u-shared"), vec![shared], &["p1", "p2"]));
    let twice = allocation_result("gpu", DRIVER, NODE, "vgpu-0", Some("s1"), &[]);
    node.claims.insert(allocated(claim("ns", "twice", "u-twice"), vec![twice], &["p"]));
    let foreign = allocation_result("gpu", "other.example.com", NODE, "x", None, &[]);
    node.claims.insert(allocated(claim("ns", "foreign", "u-foreign"), vec![foreign], &["p"]));

    let state = node.state().await;
    let results = state
        .prepare(&[
            r("good", "u-good"),
            r("missing", "u-missing"),
            r("renamed", "u-old"),
            r("bare", "u-bare"),
            r("pool", "u-pool"),
            r("unknown", "u-unknown"),
            r("big", "u-big"),
            r("shared", "u-shared"),
            r("twice", "u-twice"),
            r("foreign", "u-foreign"),
        ])
        .await;
    let err = |uid: &str| results[uid].as_ref().unwrap_err().to_string();
    assert_eq!(results["u-good"].as_ref().unwrap().len(), 1);
    assert_eq!(err("u-missing"), "ResourceClaim ns/missing not found");
    assert_eq!(err("u-old"), "ResourceClaim ns/renamed has UID u-new, the kubelet asked for u-old");
    assert_eq!(err("u-bare"), "ResourceClaim ns/bare is not allocated");
    assert!(
        err("u-pool").contains("is in pool \"node-2\", not this node's pool \"node-1\""),
        "{}",
        err("u-pool")
    );
    assert!(err("u-unknown").contains("vgpu-9"), "{}", err("u-unknown"));
    assert!(err("u-big").contains("cores 101 exceeds the device's capacity 100"), "{}", err("u-big"));
    assert_eq!(
        err("u-shared"),
        "ResourceClaim ns/shared: claim cannot be used for multiple Pods simultaneously (reserved for 2 consumers)"
    );
    assert_eq!(
        err("u-twice"),
        "ResourceClaim ns/twice: device vgpu-0 (share s1) is already prepared for claim ns/good (u-good)"
    );
    assert!(results["u-foreign"].as_ref().unwrap().is_empty(), "no device of this driver: nothing to do");
    assert_eq!(node.cdi_files(), ["k8s.manager.nvidia.com-claim_u-good.json"]);
    assert_eq!(node.claim_dirs(), ["u-good"]);
    assert_eq!(state.checkpoint().await.unwrap().claims().keys().collect::<Vec<_>>(), ["u-good"]);
}

#[tokio::test]
async fn multi_device_requests_get_their_own_ordinals_and_partitions() {
    let node = TestNode::new();
    // Two shares in one request (ordinals 0 and 1) and one in another request.
    let results = vec![
        allocation_result("train", DRIVER, NODE, "vgpu-0", Some("a"), &[("cores", "30"), ("memory", "2Gi")]),
        allocation_result("train", DRIVER, NODE, "vgpu-1", Some("b"), &[("cores", "100")]),
        allocation_result("infer", DRIVER, NODE, "vgpu-1", Some("c"), &[("memory", "24Gi")]),
    ];
    node.claims.insert(allocated(claim("ns", "multi", "u-m"), results, &["p"]));
    let state = node.state().await;
    let devices = state.prepare(&[r("multi", "u-m")]).await.remove("u-m").unwrap().unwrap();
    assert_eq!(devices.len(), 3);
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(node.config.cdi_spec_path("u-m")).unwrap()).unwrap();
    let env = |i: usize| -> Vec<String> {
        spec["devices"][i]["containerEdits"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    };
    assert!(
        env(0).contains(&"CUDA_MEM_LIMIT_0=2048m".to_owned())
            && env(0).contains(&"CUDA_CORE_LIMIT_0=30".to_owned())
    );
    assert!(env(1).contains(&"CUDA_CORE_LIMIT_1=".to_owned()), "100 cores: no limit; {:?}", env(1));
    assert!(env(1).contains(&"CUDA_MEM_LIMIT_1=".to_owned()), "no memory consumed: no limit");
    assert!(env(2).contains(&"CUDA_MEM_LIMIT_0=".to_owned()), "all the memory: no limit; {:?}", env(2));
    assert!(env(2).contains(&"MANAGER_VISIBLE_DEVICE_0=GPU-b".to_owned()));
    for part in ["train", "infer"] {
        assert!(node.config.claim_dir("u-m").join(part).join("config/pids.config").exists());
    }
    let unprepared = state.unprepare(&[r("multi", "u-m")]).await;
    assert!(unprepared["u-m"].is_ok());
    assert!(node.cdi_files().is_empty() && node.claim_dirs().is_empty());
}

#[tokio::test]
async fn stale_claims_are_swept() {
    let node = TestNode::new();
    node.add_vgpu_claim("c1", "uid-1", "vgpu-0", "s1", "10", "1Gi");
    node.add_vgpu_claim("c2", "uid-2", "vgpu-0", "s2", "10", "1Gi");
    node.add_vgpu_claim("c3", "uid-3", "vgpu-1", "s3", "10", "1Gi");
    let state = node.state().await;
    let all = [r("c1", "uid-1"), r("c2", "uid-2"), r("c3", "uid-3")];
    assert!(state.prepare(&all).await.values().all(Result::is_ok));
    node.claims.remove("ns", "c1");
    node.add_vgpu_claim("c2", "uid-2-recreated", "vgpu-0", "s2", "10", "1Gi");
    assert_eq!(state.sweep_stale().await.unwrap(), ["uid-1", "uid-2"]);
    assert_eq!(node.cdi_files(), ["k8s.manager.nvidia.com-claim_uid-3.json"]);
    assert_eq!(node.claim_dirs(), ["uid-3"]);
    // An API failure keeps the claim.
    node.claims.fail_next("apiserver down");
    assert!(state.sweep_stale().await.unwrap().is_empty());
    assert_eq!(node.claim_dirs(), ["uid-3"]);
}

#[tokio::test]
async fn a_held_lock_times_out_every_claim_of_the_call() {
    let node = TestNode::new();
    node.add_vgpu_claim("c1", "uid-1", "vgpu-0", "s1", "10", "1Gi");
    let mut config = (*node.config).clone();
    config.lock_timeout = Duration::from_millis(50);
    let state = vgpu_dra::state::DeviceState::new(
        std::sync::Arc::new(config),
        node.devices.clone(),
        std::sync::Arc::new(vgpu_core::backend::NvidiaAdapter),
        node.claims.clone(),
    )
    .await
    .unwrap();
    let held = PuLock::acquire(&node.config.lock_path(), Duration::from_secs(1)).await.unwrap();
    let results = state.prepare(&[r("c1", "uid-1")]).await;
    let err = results["uid-1"].as_ref().unwrap_err().to_string();
    assert!(err.contains("pu.lock") && err.contains("timed out after 50ms"), "{err}");
    let results = state.unprepare(&[r("c1", "uid-1")]).await;
    assert!(results["uid-1"].is_err());
    drop(held);
    assert!(state.prepare(&[r("c1", "uid-1")]).await["uid-1"].is_ok());
}

#[tokio::test]
async fn whole_gpus_get_device_nodes_only_and_are_exclusive() {
    let node = TestNode::new();
    let backend = vgpu_core::backend::mock::MockBackend::from_yaml_str(
        "gpus:\n  - { uuid: GPU-a, name: NVIDIA A30, memoryMiB: 24576, minor: 3 }\n",
    )
    .unwrap();
    let config = vgpu_dra::devices::DeviceConfig { vgpu_support: false, ..Default::default() };
    let devices = vgpu_dra::devices::AllocatableDevices::from_backend(&backend, &config).unwrap();
    let whole = |name: &str, uid: &str| {
        let result = allocation_result("gpu", DRIVER, NODE, "gpu-3", None, &[]);
        node.claims.insert(allocated(claim("ns", name, uid), vec![result], &["p1", "p2"]));
    };
    whole("w1", "u-w1");
    whole("w2", "u-w2");
    let state = vgpu_dra::state::DeviceState::new(
        node.config.clone(),
        std::sync::Arc::new(devices),
        std::sync::Arc::new(vgpu_core::backend::NvidiaAdapter),
        node.claims.clone(),
    )
    .await
    .unwrap();
    let results = state.prepare(&[r("w1", "u-w1"), r("w2", "u-w2")]).await;
    let devices = results["u-w1"].as_ref().unwrap();
    assert_eq!(devices[0].device_name, "gpu-3");
    assert_eq!(devices[0].cdi_device_ids, ["k8s.manager.nvidia.com/claim=u-w1-gpu-gpu-3-0"]);
    assert_eq!(
        results["u-w2"].as_ref().unwrap_err().to_string(),
        "ResourceClaim ns/w2: device gpu-3 is already prepared for claim ns/w1 (u-w1)"
    );
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(node.config.cdi_spec_path("u-w1")).unwrap()).unwrap();
    let edits = &spec["devices"][0]["containerEdits"];
    assert_eq!(edits["deviceNodes"][0]["path"], "/dev/nvidia3");
    assert!(edits.get("env").is_none() && edits.get("mounts").is_none(), "{edits}");
    assert!(spec["containerEdits"].get("env").is_none(), "no vGPU library for whole GPUs");
    assert!(node.claim_dirs().is_empty(), "whole GPUs have no partitions");
    assert!(state.unprepare(&[r("w1", "u-w1")]).await["u-w1"].is_ok());
    assert!(state.prepare(&[r("w2", "u-w2")]).await["u-w2"].is_ok(), "free again");
}

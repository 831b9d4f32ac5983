//! `vgpuctl simulate --from-cluster` against the real control plane (issue #22 item 4), after a scheduling
//! scenario: our extender under kube-scheduler places twelve vGPU pods on three nodes, then `vgpuctl` reads the
//! cluster (read-only, through the test kubeconfig) and streams a pod shape through its snapshot.
//!
//! Asserted: the snapshot holds exactly the allocations the API objects show (every bound pod's
//! `pre-allocated`, on its node, and nothing else); the answer is consistent with the cluster's free capacity
//! (placements only on vGPU nodes, fit + rejected = count); the cluster is untouched (no pod created, none
//! changed); a second run of the same shape gives byte-for-byte the same JSON.
//!
//! Needs the control-plane binaries and our binaries: run `e2e/run.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use vgpu_e2e::TestEnv;
use vgpu_e2e::plugin_node::{pod_state, schedule_mixed_vgpu_pods, vgpuctl};

const NODES: u32 = 3;
const GPUS: u32 = 4;
const SPLIT: u32 = 4;
const PODS: usize = 12;
const SHAPE: &str = "gpus=2,cores=50,memory=8Gi,topology=none";
const COUNT: usize = 40;

/// `vgpuctl simulate --from-cluster` of the shape, as JSON.
fn simulate(env: &TestEnv) -> serde_json::Value {
    let shape = format!("--pod={SHAPE}");
    let count = format!("--count={COUNT}");
    let stdout = vgpuctl(env, &["simulate", "--from-cluster", &shape, &count, "--json"]).unwrap();
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn simulate_from_cluster_reads_the_allocations_and_answers_deterministically() {
    let mut env = TestEnv::builder("simulate_from_cluster").start().await.unwrap();
    let client = env.client().await.unwrap();
    // The scheduling scenario: twelve pods of 1–2 GPUs on three nodes, every one bound.
    schedule_mixed_vgpu_pods(&mut env, NODES, GPUS, SPLIT, PODS).await.unwrap_or_else(|e| panic!("{e:#}"));

    let all: Api<Pod> = Api::all(client.clone());
    let before = pod_state(&all).await.unwrap();
    let first = simulate(&env);

    // The snapshot holds exactly the allocations the API objects show.
    let expected: Vec<(String, String, String)> = before
        .iter()
        .filter_map(|(k, (_, node, pre))| Some((k.clone(), node.clone()?, pre.clone()?)))
        .collect();
    assert_eq!(expected.len(), PODS);
    let got: Vec<(String, String, String)> = first["snapshot"]["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let s = |k: &str| a[k].as_str().unwrap().to_owned();
            (s("pod"), s("node"), s("pre_allocated"))
        })
        .collect();
    assert_eq!(got, expected, "snapshot allocations differ from the API objects");
    assert_eq!(first["snapshot"]["vgpu_nodes"], NODES);
    assert_eq!(first["count"], COUNT);
    assert_eq!(first["pod"], "gpus=2,cores=50,memory=8192Mi,topology=none");

    // The answer: fit + rejected = count, placements only on our nodes, and the shape's ceiling holds — each
    // placed pod takes 2 × 50 % cores, so no more than (capacity − already granted) / 100 fit.
    let fit = first["fit"].as_u64().unwrap();
    let rejected = first["rejected"].as_u64().unwrap();
    assert_eq!(fit + rejected, COUNT as u64, "{first:#}");
    let placed: u64 = first["placements"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(placed, fit);
    for node in first["placements"].as_object().unwrap().keys() {
        assert!(node.starts_with("gpu-node-"), "placement on {node}");
    }
    let granted_cores: u64 =
        (0..PODS as u64).map(|i| [1, 2, 1][i as usize % 3] * [25, 10, 50][i as usize % 3]).sum();
    let free_cores = u64::from(NODES * GPUS) * 100 - granted_cores;
    assert!(fit >= 1 && fit * 100 <= free_cores, "fit {fit} with {free_cores} % cores free: {first:#}");
    assert!(rejected > 0, "{COUNT} pods of {SHAPE} cannot all fit: {first:#}");
    assert!(!first["rejected_by_reason"].as_object().unwrap().is_empty());
    assert!(
        first["after"]["core_utilization_pct"].as_f64().unwrap()
            > first["before"]["core_utilization_pct"].as_f64().unwrap()
    );

    // Read-only: nothing in the cluster changed; and the same question gets the same answer.
    assert_eq!(pod_state(&all).await.unwrap(), before, "vgpuctl changed the cluster");
    let second = simulate(&env);
    assert_eq!(second, first, "a second run gave another answer");
    env.finish();
}

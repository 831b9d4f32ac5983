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

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, PostParams};
use vgpu_e2e::fixtures::{self, VGPU_CORES, VGPU_MEMORY, VGPU_NUMBER};
use vgpu_e2e::plugin_node::start_vgpu_scheduling;
use vgpu_e2e::{TestEnv, vgpu_binary};

const NODES: u32 = 3;
const GPUS: u32 = 4;
const SPLIT: u32 = 4;
const PODS: usize = 12;
const SHAPE: &str = "gpus=2,cores=50,memory=8Gi,topology=none";
const COUNT: usize = 40;

fn vgpuctl(env: &TestEnv) -> serde_json::Value {
    let out = std::process::Command::new(vgpu_binary("vgpuctl").unwrap())
        .arg("simulate")
        .arg("--from-cluster")
        .arg(format!("--kubeconfig={}", env.kubeconfig_path().display()))
        .arg(format!("--pod={SHAPE}"))
        .arg(format!("--count={COUNT}"))
        .arg("--json")
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "vgpuctl: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// `namespace/name` → (resourceVersion, node, pre-allocated) of every pod.
async fn pod_state(pods: &Api<Pod>) -> BTreeMap<String, (String, Option<String>, Option<String>)> {
    pods.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| {
            let key =
                format!("{}/{}", p.metadata.namespace.clone().unwrap(), p.metadata.name.clone().unwrap());
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            let pre =
                p.metadata.annotations.as_ref().and_then(|a| a.get("nvidia.com/pre-allocated").cloned());
            (key, (p.metadata.resource_version.clone().unwrap_or_default(), node, pre))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn simulate_from_cluster_reads_the_allocations_and_answers_deterministically() {
    let mut env = TestEnv::builder("simulate_from_cluster").start().await.unwrap();
    let client = env.client().await.unwrap();
    for n in 0..NODES {
        fixtures::create_vgpu_node(&client, &format!("gpu-node-{n}"), GPUS, SPLIT).await.unwrap();
    }
    start_vgpu_scheduling(&mut env).await.unwrap();

    // The scheduling scenario: twelve pods of 1–2 GPUs, then wait for every one to be bound.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for i in 0..PODS {
        let limits =
            [(VGPU_NUMBER, [1, 2, 1][i % 3]), (VGPU_CORES, [25, 10, 50][i % 3]), (VGPU_MEMORY, 2048)];
        let pod = fixtures::vgpu_pod_with("default", &format!("pod-{i:02}"), &limits, &[]);
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    for i in 0..PODS {
        fixtures::wait_for_pod_node(&client, "default", &format!("pod-{i:02}"), Duration::from_secs(120))
            .await
            .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tail("kube-scheduler", 30)));
    }

    let all: Api<Pod> = Api::all(client.clone());
    let before = pod_state(&all).await;
    let first = vgpuctl(&env);

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
    assert_eq!(pod_state(&all).await, before, "vgpuctl changed the cluster");
    let second = vgpuctl(&env);
    assert_eq!(second, first, "a second run gave another answer");
    env.finish();
}

//! `vgpuctl cluster` and `vgpuctl pod` against the real control plane (issue #21 item 6), after a scheduling
//! scenario: our extender under kube-scheduler places vGPU pods on three nodes, and one pod asks for more GPUs
//! than any node has. `vgpuctl` reads the cluster read-only through the test kubeconfig.
//!
//! Asserted: `vgpuctl cluster --json` prints, per node and GPU, exactly the vGPU slots, cores, memory and pods
//! that the bound pods' `pre-allocated` annotations hold (and nothing else), and the same bytes on a second
//! run; `vgpuctl pod` on the pod that cannot fit names the extender's reason on every node (local placement)
//! and shows the extender's `FilteringFailed` event; on a bound pod it names its node and GPUs; nothing in the
//! cluster changed.
//!
//! Needs the control-plane binaries and our binaries: run `e2e/run.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::{Value, json};
use vgpu_core::codec::pod_devices;
use vgpu_e2e::TestEnv;
use vgpu_e2e::fixtures::{self, VGPU_NUMBER};
use vgpu_e2e::plugin_node::{self, pod_state, schedule_mixed_vgpu_pods};

const NODES: u32 = 3;
const GPUS: u32 = 4;
const SPLIT: u32 = 4;
const PODS: usize = 9;
const TOO_BIG: &str = "too-big";

/// One GPU's (vGPU slots, cores, memory MiB, pods) as the pods' annotations hold them.
type GpuUse = (u64, u64, u64, Vec<String>);

fn vgpuctl(env: &TestEnv, args: &[&str]) -> String {
    plugin_node::vgpuctl(env, args).unwrap_or_else(|e| panic!("{e:#}"))
}

/// Waits for an event of `reason` about the pod; returns its message.
async fn wait_for_event(client: &kube::Client, pod: &str, reason: &str) -> String {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let lp = ListParams::default().fields(&format!("involvedObject.name={pod}"));
        let found =
            events.list(&lp).await.unwrap().items.into_iter().find(|e| e.reason.as_deref() == Some(reason));
        if let Some(e) = found {
            return e.message.unwrap_or_default();
        }
        assert!(Instant::now() < deadline, "no {reason} event for {pod}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn vgpuctl_cluster_prints_the_allocations_and_pod_explains_a_pending_pod() {
    let mut env = TestEnv::builder("vgpuctl_cluster").start().await.unwrap();
    let client = env.client().await.unwrap();
    schedule_mixed_vgpu_pods(&mut env, NODES, GPUS, SPLIT, PODS).await.unwrap_or_else(|e| panic!("{e:#}"));
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // More GPUs than any node has: the extender rejects every node and records why.
    let big = fixtures::vgpu_pod_with("default", TOO_BIG, &[(VGPU_NUMBER, u64::from(GPUS) + 1)], &[]);
    pods.create(&PostParams::default(), &big).await.unwrap();
    let filtering_failed = wait_for_event(&client, TOO_BIG, "FilteringFailed").await;
    assert!(filtering_failed.contains("Insufficient GPU cards"), "{filtering_failed}");

    let all: Api<Pod> = Api::all(client.clone());
    let before = pod_state(&all).await.unwrap();
    let text = vgpuctl(&env, &["cluster", "--json"]);
    let first: Value = serde_json::from_str(&text).unwrap();

    // Expected from the API objects: per (node, GPU index) the slots, cores, memory and pods.
    let mut expected: BTreeMap<(String, u64), GpuUse> = BTreeMap::new();
    let mut expected_allocations = Vec::new();
    for (key, (_, node, pre)) in &before {
        let (Some(node), Some(pre)) = (node, pre) else { continue };
        expected_allocations.push(json!({ "pod": key, "node": node, "pre_allocated": pre }));
        for c in pod_devices::decode_pre_allocated(pre).unwrap().devices() {
            let e = expected.entry((node.clone(), u64::from(c.index))).or_default();
            e.0 += 1;
            e.1 += c.cores;
            e.2 += c.memory_mib;
            if !e.3.contains(key) {
                e.3.push(key.clone());
            }
        }
    }
    assert_eq!(expected_allocations.len(), PODS);
    assert_eq!(first["allocations"], json!(expected_allocations), "allocations differ from the API objects");
    let nodes = first["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), NODES as usize);
    let mut rows = 0;
    for n in nodes {
        let name = n["name"].as_str().unwrap().to_owned();
        assert!(n.get("error").is_none(), "{n}");
        assert_eq!(n["gpus"].as_array().unwrap().len(), GPUS as usize);
        for g in n["gpus"].as_array().unwrap() {
            let index = g["index"].as_u64().unwrap();
            let (slots, cores, memory, mut holders) =
                expected.get(&(name.clone(), index)).cloned().unwrap_or_default();
            holders.sort();
            let got = (
                g["vgpus_allocated"].as_u64().unwrap(),
                g["cores_allocated"].as_u64().unwrap(),
                g["memory_mib_allocated"].as_u64().unwrap(),
                g["pods"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| p.as_str().unwrap().to_owned())
                    .collect::<Vec<_>>(),
            );
            assert_eq!(got, (slots, cores, memory, holders), "{name} GPU {index}");
            assert_eq!(g["uuid"], fixtures::fake_gpu_uuid(index as u32));
            assert_eq!(g["healthy"], true);
            rows += 1;
        }
    }
    assert_eq!(rows, (NODES * GPUS) as usize);
    let granted_cores: u64 = (0..PODS).map(|i| [1, 2, 1][i % 3] * [25, 10, 50][i % 3]).sum();
    let used: u64 = expected.values().map(|e| e.1).sum();
    assert_eq!(used, granted_cores);
    assert_eq!(first["summary"]["gpus"], NODES * GPUS);
    assert_eq!(first["summary"]["gpus_in_use"], expected.len());
    assert_eq!(first["unhealthy"], json!([]));

    // Stable: the same bytes on a second run; the table lists every GPU.
    assert_eq!(vgpuctl(&env, &["cluster", "--json"]), text, "a second run printed other JSON");
    let table = vgpuctl(&env, &["cluster"]);
    eprintln!("$ vgpuctl cluster\n{table}");
    assert_eq!(
        table.lines().filter(|l| l.starts_with("gpu-node-")).count(),
        (NODES * GPUS) as usize,
        "{table}"
    );

    // The pending pod: every node rejected for too few GPUs, by the local placement and in its events.
    let why: Value =
        serde_json::from_str(&vgpuctl(&env, &["pod", &format!("default/{TOO_BIG}"), "--json"])).unwrap();
    assert_eq!(why["status"], "pending");
    let placement = &why["placement"];
    assert_eq!(placement["fits"], json!([]));
    let codes: Vec<&str> =
        placement["nodes"].as_array().unwrap().iter().map(|n| n["code"].as_str().unwrap()).collect();
    assert_eq!(codes, vec!["InsufficientGPUCards"; NODES as usize], "{why:#}");
    assert!(placement["summary"].as_str().unwrap().contains("Insufficient GPU cards"), "{why:#}");
    let events = why["events"].as_array().unwrap();
    assert!(
        events.iter().any(|e| e["reason"] == "FilteringFailed" && e["message"] == filtering_failed.as_str()),
        "{why:#}"
    );
    let text = vgpuctl(&env, &["pod", &format!("default/{TOO_BIG}")]);
    eprintln!("$ vgpuctl pod default/{TOO_BIG}\n{text}");
    eprintln!("$ vgpuctl pod default/pod-01\n{}", vgpuctl(&env, &["pod", "default/pod-01"]));
    assert!(text.contains("InsufficientGPUCards") && text.contains("FilteringFailed"), "{text}");

    // A bound pod: its node and GPUs.
    let bound: Value = serde_json::from_str(&vgpuctl(&env, &["pod", "default/pod-01", "--json"])).unwrap();
    let (_, node, pre) = &before["default/pod-01"];
    assert_eq!(bound["status"], "bound");
    assert_eq!(bound["node"].as_str(), node.as_deref());
    assert_eq!(bound["allocation"]["pre_allocated"].as_str(), pre.as_deref());
    assert_eq!(bound["allocation"]["containers"][0]["devices"].as_array().unwrap().len(), 2);

    // Read-only.
    assert_eq!(pod_state(&all).await.unwrap(), before, "vgpuctl changed the cluster");
    env.finish();
}

//! `vgpu-scheduler-extender` under the real kube-scheduler (issue #8 §3, first scenario).
//!
//! Four nodes with four 16 GiB GPUs split 10 ways, as the device plugin publishes them. Thirty vGPU pods
//! with mixed requests and policies are created at once, plus one pod no node can hold. Mid-run the
//! extender is killed with SIGKILL and started again. Everything is asserted on objects read back from the
//! API server: every fitting pod is bound, its `pre-allocated` claim names GPUs of its node with the
//! requested shares, no GPU is over-committed, and the unfit pod stays Pending with a `FailedScheduling`
//! event carrying our reason text. A second scenario runs kube-apiserver with `PodTopologyLabelsAdmission`
//! off (a server that drops a binding's labels, as before 1.35): `--bind-writes=auto` sees the first bound
//! pod without its labels, patches them on, and patches before binding from then on — every pod ends with
//! its labels.
//!
//! Needs the control-plane binaries and our binaries: run `e2e/run.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Api;
use kube::api::{ListParams, PostParams};
use tokio::time::Instant;
use vgpu_core::codec::pod_devices;
use vgpu_e2e::fixtures::{self, FAKE_GPU_MEMORY_MIB, VGPU_CORES, VGPU_MEMORY, VGPU_NUMBER};
use vgpu_e2e::{ExtenderConfig, TestEnv, free_port, vgpu_binary, wait_ready};

const NODES: u32 = 4;
const GPUS: u32 = 4;
const SPLIT: u32 = 10;
const PODS: usize = 30;
const EXTENDER: &str = "vgpu-scheduler-extender";

/// One pod's request: GPUs, cores per GPU, memory per GPU (MiB), and policy annotations.
#[derive(Debug, Clone)]
struct Request {
    gpus: u64,
    cores: u64,
    memory: u64,
    annotations: Vec<(&'static str, &'static str)>,
}

/// A deterministic mix: 1–3 GPUs, 0–30 % cores, 1–4 GiB, binpack/spread at node and device level,
/// topology modes none/numa.
fn requests() -> Vec<Request> {
    let policies = ["binpack", "spread"];
    (0..PODS)
        .map(|i| {
            let mut annotations = vec![
                ("nvidia.com/node-scheduler-policy", policies[i % 2]),
                ("nvidia.com/device-scheduler-policy", policies[(i / 2) % 2]),
            ];
            if i % 5 == 0 {
                annotations.push(("nvidia.com/device-topology-mode", "numa"));
            }
            if i % 7 == 0 {
                annotations.push(("nvidia.com/vgpu-compute-policy", "balance"));
            }
            Request {
                gpus: [1, 1, 2, 1, 3][i % 5],
                cores: [10, 20, 0, 30, 10, 25][i % 6],
                memory: [1024, 2048, 3072, 4096][i % 4],
                annotations,
            }
        })
        .collect()
}

fn extender_args(env: &TestEnv, port: u16) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--server-bind-port={port}"),
        "--scheduler-name=vgpu-scheduler".to_owned(),
        "--feature-gates=SerializedNodeFilter=false".to_owned(),
    ]
}

async fn start_extender(env: &mut TestEnv, port: u16) {
    let bin = vgpu_binary(EXTENDER).unwrap();
    env.start_process(EXTENDER, &bin, &extender_args(env, port), &[("RUST_LOG".into(), "info".into())])
        .unwrap();
    if let Err(e) = wait_ready(port, Duration::from_secs(60)).await {
        panic!("{e:#}\n{}", env.log_tail(EXTENDER, 40));
    }
}

fn node_of(pod: &Pod) -> Option<String> {
    pod.spec.as_ref().and_then(|s| s.node_name.clone())
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str)
}

fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref().and_then(|a| a.get(key)).map(String::as_str)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn extender_places_30_pods_without_over_commit_across_a_restart() {
    let mut env = TestEnv::builder("extender_places_30_pods_without_over_commit_across_a_restart")
        .start()
        .await
        .unwrap();
    let client = env.client().await.unwrap();
    for n in 0..NODES {
        fixtures::create_vgpu_node(&client, &format!("gpu-node-{n}"), GPUS, SPLIT).await.unwrap();
    }
    let port = free_port().unwrap();
    start_extender(&mut env, port).await;
    env.start_scheduler(&ExtenderConfig::vgpu(format!("http://127.0.0.1:{port}/scheduler"))).await.unwrap();

    // Everything fits comfortably: the mix asks for well under the cluster's capacity.
    let reqs = requests();
    let (mut mem, mut cores, mut slots) = (0u64, 0u64, 0u64);
    for r in &reqs {
        let per_gpu_mem = if r.memory == 0 && r.cores == 0 { FAKE_GPU_MEMORY_MIB } else { r.memory };
        mem += r.gpus * per_gpu_mem;
        cores += r.gpus * if r.memory == 0 && r.cores == 0 { 100 } else { r.cores };
        slots += r.gpus;
    }
    let gpus_total = u64::from(NODES * GPUS);
    assert!(mem * 10 < gpus_total * FAKE_GPU_MEMORY_MIB * 6, "memory demand {mem} MiB too close to capacity");
    assert!(cores * 10 < gpus_total * 100 * 6, "core demand {cores} too close to capacity");
    assert!(slots < gpus_total * u64::from(SPLIT));

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut creates = tokio::task::JoinSet::new();
    for (i, r) in reqs.iter().enumerate() {
        let pods = pods.clone();
        let limits = [(VGPU_NUMBER, r.gpus), (VGPU_CORES, r.cores), (VGPU_MEMORY, r.memory)];
        let annotations = r.annotations.clone();
        creates.spawn(async move {
            let pod = fixtures::vgpu_pod_with("default", &format!("pod-{i:02}"), &limits, &annotations);
            pods.create(&PostParams::default(), &pod).await.map(drop)
        });
    }
    while let Some(done) = creates.join_next().await {
        done.unwrap().unwrap();
    }

    // Kill the extender (SIGKILL: no clean-up) once a third of the pods are bound, then start it again.
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut restarted = false;
    let bound = loop {
        let list = pods.list(&ListParams::default()).await.unwrap();
        let bound: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| node_of(p).is_some() && p.metadata.name.as_deref() != Some("too-big"))
            .collect();
        if !restarted && bound.len() >= PODS / 3 {
            env.kill_process(EXTENDER).unwrap();
            tokio::time::sleep(Duration::from_millis(500)).await;
            start_extender(&mut env, port).await;
            restarted = true;
        }
        if bound.len() == PODS {
            break bound;
        }
        if Instant::now() >= deadline {
            panic!(
                "only {} of {PODS} pods bound after 240 s (restarted: {restarted})\nextender log:\n{}\nscheduler log:\n{}",
                bound.len(),
                env.log_tail(EXTENDER, 40),
                env.log_tail("kube-scheduler", 40)
            );
        }
        env.check_process(EXTENDER).unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(restarted, "the extender was never restarted");
    // kube-apiserver 1.37 copies binding labels: after the first bound pod is read back, each bind is one write.
    let log = std::fs::read_to_string(env.log_path(EXTENDER)).unwrap_or_default();
    assert!(
        log.contains("copies binding labels onto pods"),
        "--bind-writes=auto never confirmed the binding's labels:\n{}",
        env.log_tail(EXTENDER, 40)
    );

    // Every claim names GPUs of the pod's node with the requested shares; no GPU is over-committed.
    let by_name: BTreeMap<String, Request> =
        reqs.iter().enumerate().map(|(i, r)| (format!("pod-{i:02}"), r.clone())).collect();
    let mut usage: BTreeMap<(String, u32), (u64, u64, u64)> = BTreeMap::new();
    for pod in &bound {
        let name = pod.metadata.name.clone().unwrap();
        let node = node_of(pod).unwrap();
        let req = &by_name[&name];
        let raw =
            annotation(pod, "nvidia.com/pre-allocated").unwrap_or_else(|| panic!("{name}: no pre-allocated"));
        let claim = pod_devices::decode_pre_allocated(raw).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(annotation(pod, "nvidia.com/predicate-node"), Some(node.as_str()), "{name}");
        assert_eq!(label(pod, "nvidia.com/assigned-phase"), Some("allocating"), "{name}");
        assert_eq!(label(pod, "nvidia.com/metrics-node"), Some(node.as_str()), "{name}");
        assert_eq!(claim.containers.len(), 1, "{name}: {raw}");
        let devices = &claim.containers[0].devices;
        assert_eq!(devices.len() as u64, req.gpus, "{name}: {raw}");
        let mut seen = std::collections::BTreeSet::new();
        for d in devices {
            assert!(
                d.index < GPUS && seen.insert(d.index),
                "{name}: GPU {} twice or out of range: {raw}",
                d.index
            );
            assert_eq!(d.uuid, fixtures::fake_gpu_uuid(d.index), "{name}: {raw}");
            assert_eq!(d.memory_mib, req.memory, "{name}: {raw}");
            assert_eq!(d.cores, req.cores, "{name}: {raw}");
            let u = usage.entry((node.clone(), d.index)).or_default();
            *u = (u.0 + d.cores, u.1 + d.memory_mib, u.2 + 1);
        }
    }
    for ((node, gpu), (cores, mem, count)) in &usage {
        assert!(*cores <= 100, "{node} GPU {gpu}: {cores} % cores granted");
        assert!(*mem <= FAKE_GPU_MEMORY_MIB, "{node} GPU {gpu}: {mem} MiB granted");
        assert!(*count <= u64::from(SPLIT), "{node} GPU {gpu}: {count} vGPUs granted");
    }

    // More GPUs than any node has: the extender must reject it on every node. It is created once the restart
    // is over, so its first scheduling attempt meets a running extender (during the restart the scheduler's
    // event would name the refused connection instead).
    let too_big = fixtures::vgpu_pod_with("default", "too-big", &[(VGPU_NUMBER, u64::from(GPUS) + 1)], &[]);
    pods.create(&PostParams::default(), &too_big).await.unwrap();
    // The unfit pod stays Pending with our reason in a FailedScheduling event.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let big = pods.get("too-big").await.unwrap();
    assert_eq!(node_of(&big), None);
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(30);
    let message = loop {
        let list = events
            .list(&ListParams::default().fields("involvedObject.name=too-big,reason=FailedScheduling"))
            .await
            .unwrap();
        if let Some(m) =
            list.items.iter().filter_map(|e| e.message.clone()).find(|m| m.contains("nodes are available"))
        {
            break m;
        }
        assert!(Instant::now() < deadline, "no FailedScheduling event for too-big");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        message.contains(&format!("0/{NODES} nodes are available"))
            && message.contains("Insufficient GPU cards"),
        "FailedScheduling message: {message}"
    );
    eprintln!("too-big: {message}");
    env.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn extender_repairs_labels_a_server_drops_from_bindings() {
    let mut env = TestEnv::builder("extender_repairs_labels_a_server_drops_from_bindings")
        .feature_gate("PodTopologyLabelsAdmission", false)
        .start()
        .await
        .unwrap();
    let client = env.client().await.unwrap();
    for n in 0..2 {
        fixtures::create_vgpu_node(&client, &format!("gpu-node-{n}"), GPUS, SPLIT).await.unwrap();
    }
    let port = free_port().unwrap();
    start_extender(&mut env, port).await;
    env.start_scheduler(&ExtenderConfig::vgpu(format!("http://127.0.0.1:{port}/scheduler"))).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    const N: usize = 6;
    for i in 0..N {
        let pod = fixtures::vgpu_pod_with(
            "default",
            &format!("pod-{i}"),
            &[(VGPU_NUMBER, 1), (VGPU_CORES, 10)],
            &[],
        );
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let bound = loop {
        let list = pods.list(&ListParams::default()).await.unwrap();
        let bound: Vec<Pod> = list.items.into_iter().filter(|p| node_of(p).is_some()).collect();
        if bound.len() == N {
            break bound;
        }
        assert!(Instant::now() < deadline, "{} of {N} bound\n{}", bound.len(), env.log_tail(EXTENDER, 40));
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    // The labels are what the device plugin finds the pod by: every pod has them, whichever way they came.
    let deadline = Instant::now() + Duration::from_secs(10);
    for pod in bound {
        let name = pod.metadata.name.clone().unwrap();
        let mut pod = pod;
        while label(&pod, "nvidia.com/assigned-phase").is_none() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            pod = pods.get(&name).await.unwrap();
        }
        let node = node_of(&pod).unwrap();
        assert_eq!(label(&pod, "nvidia.com/assigned-phase"), Some("allocating"), "{name}");
        assert_eq!(label(&pod, "nvidia.com/metrics-node"), Some(node.as_str()), "{name}");
        assert_eq!(annotation(&pod, "nvidia.com/predicate-node"), Some(node.as_str()), "{name}");
        assert!(annotation(&pod, "nvidia.com/pre-allocated").is_some(), "{name}");
    }
    let log = std::fs::read_to_string(env.log_path(EXTENDER)).unwrap_or_default();
    assert!(
        log.contains("dropped the labels of a binding"),
        "the extender never noticed the dropped labels:\n{}",
        env.log_tail(EXTENDER, 40)
    );
    assert!(!log.contains("copies binding labels onto pods"), "{}", env.log_tail(EXTENDER, 40));
    // The success events wait for a quiet moment (`--event-quiet-period`, 250 ms by default), then every pod
    // has both.
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list = events.list(&ListParams::default()).await.unwrap();
        let ours: BTreeSet<(String, String)> = list
            .items
            .iter()
            .filter(|e| matches!(e.reason.as_deref(), Some("FilteringSucceed" | "BindingSucceed")))
            .filter_map(|e| Some((e.involved_object.name.clone()?, e.reason.clone()?)))
            .collect();
        if ours.len() == 2 * N {
            break;
        }
        assert!(Instant::now() < deadline, "success events: {ours:?}\n{}", env.log_tail(EXTENDER, 40));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    env.finish();
}

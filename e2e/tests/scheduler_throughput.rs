//! Scheduling throughput under the real kube-scheduler (issue #22 item 1): M nodes (API objects with
//! capacity and our annotations, no kubelet), N pods created in parallel, the time from the first create to
//! the last pod bound, observed through a watch on the API server.
//!
//! Two configurations, each on its own control plane:
//! - `a`: kube-scheduler alone, pods asking a plain extended resource (`nvidia.com/gpu: 1`, 8 per node):
//!   the scheduler's own ceiling;
//! - `b`: kube-scheduler + `vgpu-scheduler-extender` (filter, prioritize, bind, preempt), vGPU pods (1 vGPU,
//!   10 % cores, 1 GiB; 8 GPUs split 10 ways per node).
//!
//! kube-scheduler's client QPS and burst are raised to 5,000 so its rate limiter is not what is measured
//! (our extender's kube-rs client has no client-side limiter). Sizes come from `VGPU_THROUGHPUT_NODES`
//! (default 50) and `VGPU_THROUGHPUT_PODS` (default 200); the defaults are CI's small configuration, which
//! asserts only that every pod binds. Each test prints one line `throughput config=<a|b> nodes=M pods=N
//! seconds=S pods_per_s=R`; `scripts/throughput.sh` runs the sizes of the issue and prints the ratio (b)/(a).
//!
//! Needs the control-plane binaries and our binaries: run `e2e/run.sh throughput` or `scripts/throughput.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use tokio::time::Instant;
use tokio_stream::StreamExt;
use vgpu_e2e::fixtures::{self, VGPU_CORES, VGPU_MEMORY, VGPU_NUMBER};
use vgpu_e2e::plugin_node::EXTENDER;
use vgpu_e2e::{ExtenderConfig, TestEnv, free_port, scheduler_configuration, vgpu_binary, wait_ready};

const GPUS: u32 = 8;
const SPLIT: u32 = 10;
const QPS: u32 = 5000;
/// Concurrent create (and node setup) requests.
const PARALLEL: usize = 64;
const NAMESPACE: &str = "default";

fn size(var: &str, default: usize) -> usize {
    match std::env::var(var) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{var}={v:?}: expected a positive integer")),
        Err(_) => default,
    }
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// `count` vGPU nodes, `PARALLEL` at a time; with `plain_gpus`, also `nvidia.com/gpu: 8` in their capacity.
async fn create_nodes(client: &kube::Client, count: usize, plain_gpus: bool) {
    let limit = Arc::new(tokio::sync::Semaphore::new(PARALLEL));
    let mut set = tokio::task::JoinSet::new();
    for n in 0..count {
        let (client, limit) = (client.clone(), limit.clone());
        set.spawn(async move {
            let _permit = limit.acquire_owned().await.unwrap();
            let name = format!("node-{n:05}");
            fixtures::create_vgpu_node(&client, &name, GPUS, SPLIT).await.unwrap();
            if plain_gpus {
                let gpus = serde_json::json!({"nvidia.com/gpu": GPUS.to_string()});
                let status = serde_json::json!({"status": {"capacity": gpus, "allocatable": gpus}});
                let nodes: Api<Node> = Api::all(client);
                nodes.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap();
    }
}

/// Creates `pods` pods in parallel and returns the seconds from the first create to the last pod bound.
async fn measure(client: &kube::Client, pods: usize, make: impl Fn(usize) -> Pod) -> f64 {
    let api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let list = api.list(&ListParams::default()).await.unwrap();
    let mut version = list.metadata.resource_version.clone().unwrap();
    let limit = Arc::new(tokio::sync::Semaphore::new(PARALLEL));
    let mut set = tokio::task::JoinSet::new();
    let started = Instant::now();
    for i in 0..pods {
        let (api, limit, pod) = (api.clone(), limit.clone(), make(i));
        set.spawn(async move {
            let _permit = limit.acquire_owned().await.unwrap();
            api.create(&PostParams::default(), &pod).await.map(drop)
        });
    }
    let creates = tokio::spawn(async move {
        while let Some(r) = set.join_next().await {
            r.unwrap().unwrap();
        }
    });
    let mut bound: BTreeSet<String> = BTreeSet::new();
    let deadline = started + Duration::from_secs(600);
    'watch: loop {
        let mut stream = Box::pin(api.watch(&WatchParams::default().timeout(60), &version).await.unwrap());
        while let Some(event) = stream.next().await {
            match event.unwrap() {
                WatchEvent::Added(p) | WatchEvent::Modified(p) => {
                    if let Some(v) = &p.metadata.resource_version {
                        version.clone_from(v);
                    }
                    if node_of(&p).is_some() {
                        bound.insert(p.metadata.name.clone().unwrap_or_default());
                        if bound.len() == pods {
                            break 'watch;
                        }
                    }
                }
                WatchEvent::Bookmark(b) => version = b.metadata.resource_version,
                WatchEvent::Deleted(_) => {}
                WatchEvent::Error(e) => panic!("watch error: {e:?}"),
            }
        }
        assert!(Instant::now() < deadline, "only {} of {pods} pods bound after 600 s", bound.len());
    }
    let seconds = started.elapsed().as_secs_f64();
    creates.await.unwrap();
    seconds
}

fn with_qps(mut config: serde_json::Value) -> serde_json::Value {
    config["clientConnection"]["qps"] = QPS.into();
    config["clientConnection"]["burst"] = QPS.into();
    config
}

fn report(config: &str, nodes: usize, pods: usize, seconds: f64) {
    println!(
        "throughput config={config} nodes={nodes} pods={pods} seconds={seconds:.3} pods_per_s={:.1}",
        pods as f64 / seconds
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn throughput_a_kube_scheduler_alone_with_plain_gpus() {
    let (nodes, pods) = (size("VGPU_THROUGHPUT_NODES", 50), size("VGPU_THROUGHPUT_PODS", 200));
    let mut env = TestEnv::builder("throughput_a").start().await.unwrap();
    let client = env.client().await.unwrap();
    create_nodes(&client, nodes, true).await;
    env.start_scheduler_with_config(&with_qps(scheduler_configuration(env.kubeconfig_path(), &[])))
        .await
        .unwrap();
    let seconds = measure(&client, pods, |i| {
        fixtures::vgpu_pod_with(NAMESPACE, &format!("pod-{i:05}"), &[("nvidia.com/gpu", 1)], &[])
    })
    .await;
    report("a", nodes, pods, seconds);
    env.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn throughput_b_kube_scheduler_with_our_extender() {
    let (nodes, pods) = (size("VGPU_THROUGHPUT_NODES", 50), size("VGPU_THROUGHPUT_PODS", 200));
    let mut env = TestEnv::builder("throughput_b").start().await.unwrap();
    let client = env.client().await.unwrap();
    create_nodes(&client, nodes, false).await;
    let port = free_port().unwrap();
    let args = vec![
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--server-bind-port={port}"),
    ];
    env.start_process(EXTENDER, &vgpu_binary(EXTENDER).unwrap(), &args, &[]).unwrap();
    if let Err(e) = wait_ready(port, Duration::from_secs(120)).await {
        panic!("{e}\n{}", env.log_tail(EXTENDER, 30));
    }
    let extender = ExtenderConfig::vgpu(format!("http://127.0.0.1:{port}/scheduler"));
    env.start_scheduler_with_config(&with_qps(scheduler_configuration(env.kubeconfig_path(), &[extender])))
        .await
        .unwrap();
    let seconds = measure(&client, pods, |i| {
        let limits = [(VGPU_NUMBER, 1), (VGPU_CORES, 10), (VGPU_MEMORY, 1024)];
        fixtures::vgpu_pod_with(NAMESPACE, &format!("pod-{i:05}"), &limits, &[])
    })
    .await;
    report("b", nodes, pods, seconds);
    env.check_process(EXTENDER).unwrap();
    env.finish();
}

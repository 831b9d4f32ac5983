//! Pod start-up on the real node, measured (issue #31): pod create → `Running` for plain busybox pods, vGPU
//! pods (our extender + `vgpu-device-plugin`: `GetPreferredAllocation`, `Allocate`, `PreStartContainer`)
//! and DRA claim pods (`vgpu-kubelet-plugin`: claim + pod created, kube-scheduler allocates, the kubelet
//! prepares, containerd injects the CDI spec). Pods are created one at a time, each waited for through a
//! watch, in interleaved rounds (plain, vGPU, DRA), so a figure is the path's latency and not a queue.
//!
//! A measurement, not a test: it prints p50/p99 per kind and the ratios, asserts only that every pod runs,
//! and runs only when `VGPU_NODE_STARTUP_PODS` is set (`scripts/node-startup.sh` sets it; otherwise it says
//! it skipped).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams},
};
use serde_json::{Value, json};
use tokio_stream::StreamExt as _;
use vgpu_core::abi::runtime_files;
use vgpu_e2e::{
    SCHEDULER_NAME,
    fixtures::{self, VGPU_CORES, VGPU_MEMORY, VGPU_NUMBER},
    plugin_node::{DEVICE_PLUGIN, start_vgpu_scheduling},
    probe,
    real_node::{self, RealNode},
    vgpu_binary,
};

const PODS_ENV: &str = "VGPU_NODE_STARTUP_PODS";
const TIMEOUT: Duration = Duration::from_secs(120);
const NAMESPACE: &str = "default";
const WAIT: &str = "trap 'exit 0' TERM; while true; do sleep 1; done";

fn pod(name: &str, image: &str, limits: Option<Value>, claim: Option<&str>) -> Pod {
    let mut container = json!({
        "name": "main", "image": image, "imagePullPolicy": "Never", "command": ["sh", "-c", WAIT],
    });
    if let Some(limits) = limits {
        container["resources"] = json!({ "limits": limits });
    }
    let mut spec = json!({
        "schedulerName": SCHEDULER_NAME, "terminationGracePeriodSeconds": 1, "containers": [container],
    });
    if let Some(claim) = claim {
        spec["containers"][0]["resources"] = json!({ "claims": [{ "name": "gpu" }] });
        spec["resourceClaims"] = json!([{ "name": "gpu", "resourceClaimName": claim }]);
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": { "name": name, "namespace": NAMESPACE }, "spec": spec,
    }))
    .unwrap()
}

/// One pod's start-up: create → bound (`spec.nodeName` seen by the watch), create → `Running`.
#[derive(Debug, Clone, Copy, Default)]
struct Startup {
    bound: Duration,
    running: Duration,
}

/// Creates `pod` and times it through a watch until it is `Running`.
async fn start_one(pods: &Api<Pod>, pod: &Pod) -> Startup {
    let name = pod.metadata.name.clone().unwrap();
    let started = Instant::now();
    let created = pods.create(&PostParams::default(), pod).await.unwrap();
    let version = created.metadata.resource_version.unwrap();
    let params = WatchParams::default().fields(&format!("metadata.name={name}")).timeout(110);
    let mut events = Box::pin(pods.watch(&params, &version).await.unwrap());
    let mut bound = None;
    let running = tokio::time::timeout(TIMEOUT, async {
        while let Some(event) = events.next().await {
            if let Ok(WatchEvent::Modified(p)) = event {
                if bound.is_none() && p.spec.as_ref().is_some_and(|s| s.node_name.is_some()) {
                    bound = Some(started.elapsed());
                }
                if p.status.and_then(|s| s.phase).as_deref() == Some("Running") {
                    return started.elapsed();
                }
            }
        }
        panic!("watch of {name} ended before it ran");
    })
    .await;
    let running = running.unwrap_or_else(|_| panic!("{name} not Running within {TIMEOUT:?}"));
    Startup { bound: bound.unwrap_or(running), running }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a measurement: run scripts/node-startup.sh"]
async fn pod_startup_on_the_real_node() {
    let Ok(count) = std::env::var(PODS_ENV).map(|v| v.parse::<usize>().expect("a pod count")) else {
        eprintln!("skipped: {PODS_ENV} is not set (scripts/node-startup.sh sets it)");
        return;
    };
    let Some(binaries) = real_node::locate_or_skip().unwrap() else { return };
    let mut env = real_node::env_builder("pod_startup_on_the_real_node").start().await.unwrap();
    // 3 × (pods + 1) pods stay on the node until the end: above the kubelet's default of 110.
    let mut node = RealNode::builder()
        .binaries(binaries)
        .kubelet_config("maxPods", json!(250))
        .start(&env)
        .await
        .unwrap();
    let client = env.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);

    // Fake GPUs for both plugins, the runtime files, then the plugins.
    let work = env.workdir().join("gpu-host");
    // Ten pods a GPU for each plugin (split 10; claims of 10 % cores), the warm-up pod included.
    let gpus = u32::try_from((count + 1).div_ceil(10)).unwrap();
    let host = probe::GpuHost::create(&work, 2 * gpus).unwrap();
    runtime_files::install(&host.manager_dir, "v1.0.0", b"not a real library").unwrap();
    let mock = |prefix: &str, name: &str, first: u32| {
        let mut yaml = String::from("gpus:\n");
        for i in 0..gpus {
            yaml.push_str(&format!(
                "  - {{ uuid: GPU-{prefix}-{i}, name: {name}, memoryMiB: 24576, computeCapability: '8.0', minor: {} }}\n",
                first + i
            ));
        }
        yaml
    };
    std::fs::write(work.join("dp.yaml"), mock("DP", "NVIDIA A30", 0)).unwrap();
    std::fs::write(work.join("dra.yaml"), mock("DRA", "NVIDIA A30", gpus)).unwrap();
    let mut dp_args = host.device_plugin_args(&env, &node, &work.join("dp.yaml"));
    dp_args.extend([
        "--device-split-count=10".to_owned(),
        "--feature-gates=HonorPreAllocatedDeviceIDs=true".to_owned(),
    ]);
    env.start_process(DEVICE_PLUGIN, &vgpu_binary(DEVICE_PLUGIN).unwrap(), &dp_args, &[]).unwrap();
    let dra_args = host.kubelet_plugin_args(&env, &node, &work.join("dra.yaml"));
    let dra_vars =
        [("NODE_NAME".to_owned(), node.node_name().to_owned()), ("FEATURE_GATES".to_owned(), String::new())];
    env.start_process("kubelet-plugin", &vgpu_binary("vgpu-kubelet-plugin").unwrap(), &dra_args, &dra_vars)
        .unwrap();
    start_vgpu_scheduling(&mut env).await.unwrap();
    fixtures::create_dra_device_classes(&client).await.unwrap();
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    env.poll("the DRA slice", TIMEOUT, || async {
        slices.list(&ListParams::default()).await.ok()?.items.first().cloned()
    })
    .await
    .unwrap();
    env.poll("the kubelet's registration of the DRA plugin", TIMEOUT, || async {
        let log = std::fs::read_to_string(env.log_path("kubelet-plugin")).ok()?;
        log.contains("registered with the kubelet").then_some(())
    })
    .await
    .unwrap();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    env.poll("vgpu-number advertised", TIMEOUT, || async {
        let alloc = nodes.get(node.node_name()).await.ok()?.status?.allocatable?;
        alloc.get(VGPU_NUMBER).filter(|q| q.0 != "0").map(|_| ())
    })
    .await
    .unwrap();

    // One warm-up pod of each kind, then the interleaved rounds.
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let capacity = json!({ "requests": { "cores": "10", "memory": "1Gi" } });
    let vgpu_limits = json!({ VGPU_NUMBER: "1", VGPU_CORES: "10", VGPU_MEMORY: "1024" });
    let mut times: [Vec<Startup>; 3] = Default::default();
    for i in 0..=count {
        let plain = start_one(&pods, &pod(&format!("plain-{i}"), node.busybox_image(), None, None)).await;
        let vgpu = start_one(
            &pods,
            &pod(&format!("vgpu-{i}"), node.busybox_image(), Some(vgpu_limits.clone()), None),
        )
        .await;
        let claim = format!("claim-{i}");
        let dra_started = Instant::now();
        claims
            .create(
                &PostParams::default(),
                &fixtures::dra_claim(NAMESPACE, &claim, "vgpu-manager", &capacity).unwrap(),
            )
            .await
            .unwrap();
        let claim_created = dra_started.elapsed();
        let mut dra =
            start_one(&pods, &pod(&format!("dra-{i}"), node.busybox_image(), None, Some(&claim))).await;
        dra.bound += claim_created;
        dra.running += claim_created;
        if i > 0 {
            for (kind, t) in times.iter_mut().zip([plain, vgpu, dra]) {
                kind.push(t);
            }
        }
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut p50 = Vec::new();
    println!("pod create → Running on the real node, {count} pods of each kind, one at a time (ms):");
    println!("  {:<22} {:>9} {:>9} {:>14} {:>18}", "kind", "p50", "p99", "p50 to bound", "p50 bound→Running");
    for (kind, t) in ["plain", "vGPU (device plugin)", "DRA claim"].iter().zip(times.iter()) {
        let mut running: Vec<Duration> = t.iter().map(|s| s.running).collect();
        let mut bound: Vec<Duration> = t.iter().map(|s| s.bound).collect();
        let mut node_side: Vec<Duration> = t.iter().map(|s| s.running - s.bound).collect();
        for v in [&mut running, &mut bound, &mut node_side] {
            v.sort();
        }
        p50.push(percentile(&running, 0.5));
        println!(
            "  {kind:<22} {:>9.1} {:>9.1} {:>14.1} {:>18.1}",
            ms(percentile(&running, 0.5)),
            ms(percentile(&running, 0.99)),
            ms(percentile(&bound, 0.5)),
            ms(percentile(&node_side, 0.5))
        );
    }
    println!(
        "  p50 ratio to plain: vGPU {:.2}, DRA {:.2}",
        p50[1].as_secs_f64() / p50[0].as_secs_f64(),
        p50[2].as_secs_f64() / p50[0].as_secs_f64()
    );
    let _ = pods.delete_collection(&DeleteParams::default(), &ListParams::default()).await;
    node.stop().unwrap();
    env.finish();
}

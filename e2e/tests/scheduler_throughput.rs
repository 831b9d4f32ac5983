//! Scheduling throughput under the real kube-scheduler (issue #22 item 1): M nodes (API objects with
//! capacity and our annotations, no kubelet), N pods created in parallel, the time from the first create to
//! the last pod bound, observed through a watch on the API server.
//!
//! Three configurations, each on its own control plane:
//! - `a`: kube-scheduler alone, pods asking a plain extended resource (`nvidia.com/gpu: 1`, 80 per node, as
//!   many as `b`'s vGPU shares, like time-slicing replicas):
//!   the scheduler's own ceiling;
//! - `v`: kube-scheduler alone with `b`'s vGPU pods (`vgpu-number` 1, `vgpu-cores` 10, `vgpu-memory` 1024),
//!   counted against the nodes' totals of those three extended resources as plain resources (no per-GPU
//!   placement, no extender): what kube-scheduler and kube-apiserver themselves pay for the vGPU pod shape
//!   (three extended resources per pod instead of one), so `b`/`v` is the cost of the extender alone;
//! - `b`: kube-scheduler + `vgpu-scheduler-extender` (filter, prioritize, bind, preempt), vGPU pods (1 vGPU,
//!   10 % cores, 1 GiB; 8 GPUs split 10 ways per node);
//! - `c`: kube-scheduler alone with DRA: each node's ResourceSlice as our kubelet plugin publishes it (built by
//!   `vgpu_dra::slices::build_slices` from 8 mock H100s, consumable `cores` 100 and `memory` per GPU), one
//!   ResourceClaim per pod of the `vgpu-manager` class asking `cores: 10, memory: 1Gi` (so 10 per GPU, as in
//!   `b`); the timed part creates each claim and then its pod (there is no kube-controller-manager to make
//!   claims from templates), so a pod costs one write more than in `a` and `b`.
//!
//! kube-scheduler's client QPS and burst are raised to 5,000 so its rate limiter is not what is measured
//! (our extender's kube-rs client has no client-side limiter). Sizes come from `VGPU_THROUGHPUT_NODES`
//! (default 50) and `VGPU_THROUGHPUT_PODS` (default 200), extra extender flags for `b` from
//! `VGPU_THROUGHPUT_EXTENDER_ARGS`, kube-scheduler's connection to the extender from
//! `VGPU_THROUGHPUT_EXTENDER_TLS` (default `1`: HTTPS, where kube-scheduler's Go client negotiates HTTP/2 and
//! sends every call on one connection, as the chart configures it; `0`: plain HTTP/1.1, a connection per call
//! in flight beyond the client's idle pool), the node policy of `b`'s pods from `VGPU_THROUGHPUT_NODE_POLICY` (none,
//! binpack, spread); the defaults are CI's small configuration, which
//! asserts only that every pod binds. Each test prints one line `throughput config=<a|b> nodes=M pods=N
//! seconds=S pods_per_s=R`; `scripts/throughput.sh` runs the sizes of the issue and prints the ratio (b)/(a).
//!
//! Needs the control-plane binaries and our binaries: run `e2e/run.sh throughput` or `scripts/throughput.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use tokio::time::Instant;
use tokio_stream::StreamExt;
use vgpu_e2e::fixtures::{self, VGPU_CORES, VGPU_MEMORY, VGPU_NUMBER};
use vgpu_e2e::plugin_node::EXTENDER;
use vgpu_e2e::{
    ExtenderConfig, TestEnv, free_port, http_get, https_get, scheduler_configuration, vgpu_binary,
    wait_ready, wait_ready_tls,
};

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

/// What a node carries besides our vGPU annotations and capacity.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Extra {
    /// Nothing (`b`).
    None,
    /// `nvidia.com/gpu: 80` in its capacity (`a`).
    PlainGpus,
    /// Its ResourceSlices ([`dra_slices`], `c`).
    DraSlices,
}

/// `count` vGPU nodes with `extra`, `PARALLEL` at a time.
async fn create_nodes(client: &kube::Client, count: usize, extra: Extra) {
    let limit = Arc::new(tokio::sync::Semaphore::new(PARALLEL));
    let mut set = tokio::task::JoinSet::new();
    for n in 0..count {
        let (client, limit) = (client.clone(), limit.clone());
        set.spawn(async move {
            let _permit = limit.acquire_owned().await.unwrap();
            let name = format!("node-{n:05}");
            fixtures::create_vgpu_node(&client, &name, GPUS, SPLIT).await.unwrap();
            match extra {
                Extra::None => {}
                Extra::PlainGpus => {
                    // As many plain slots as `b` has vGPU shares (8 GPUs x 10), so every size fits in both.
                    let gpus = serde_json::json!({"nvidia.com/gpu": (GPUS * SPLIT).to_string()});
                    let status = serde_json::json!({"status": {"capacity": gpus, "allocatable": gpus}});
                    let nodes: Api<Node> = Api::all(client);
                    nodes.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
                }
                Extra::DraSlices => {
                    let slices: Api<ResourceSlice> = Api::all(client);
                    for slice in dra_slices(&name) {
                        slices.create(&PostParams::default(), &slice).await.unwrap();
                    }
                }
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap();
    }
}

/// Creates `pods` pods in parallel (each after its claim, when it has one) and returns the seconds from the
/// first create to the last pod bound.
async fn measure(
    client: &kube::Client,
    pods: usize,
    make: impl Fn(usize) -> (Option<ResourceClaim>, Pod),
) -> f64 {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let list = api.list(&ListParams::default()).await.unwrap();
    let mut version = list.metadata.resource_version.clone().unwrap();
    let limit = Arc::new(tokio::sync::Semaphore::new(PARALLEL));
    let mut set = tokio::task::JoinSet::new();
    let started = Instant::now();
    for i in 0..pods {
        let (api, claims, limit, (claim, pod)) = (api.clone(), claims.clone(), limit.clone(), make(i));
        set.spawn(async move {
            let _permit = limit.acquire_owned().await.unwrap();
            if let Some(claim) = claim {
                claims.create(&PostParams::default(), &claim).await?;
            }
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

/// CPU seconds of each process since `before` (the machine is small: which process the run spent its CPU
/// in is part of the answer).
fn cpu_since(env: &TestEnv, before: &[(String, f64)]) -> String {
    let parts: Vec<String> = env
        .cpu_seconds()
        .into_iter()
        .map(|(name, now)| {
            let was = before.iter().find(|(n, _)| *n == name).map_or(0.0, |(_, s)| *s);
            format!("{name} {:.2}", now - was)
        })
        .collect();
    format!("cpu seconds: {}", parts.join(", "))
}

/// Configurations `a` and `v`: kube-scheduler alone, pods asking `limits` (extended resources).
async fn kube_scheduler_alone(config: &str, extra: Extra, limits: &[(&str, u64)]) {
    let (nodes, pods) = (size("VGPU_THROUGHPUT_NODES", 50), size("VGPU_THROUGHPUT_PODS", 200));
    let mut env = TestEnv::builder(format!("throughput_{config}")).start().await.unwrap();
    let client = env.client().await.unwrap();
    create_nodes(&client, nodes, extra).await;
    env.start_scheduler_with_config(&with_qps(scheduler_configuration(env.kubeconfig_path(), &[])))
        .await
        .unwrap();
    let cpu = env.cpu_seconds();
    let requests = api_requests(&client).await;
    let seconds = measure(&client, pods, |i| {
        (None, fixtures::vgpu_pod_with(NAMESPACE, &format!("pod-{i:05}"), limits, &[]))
    })
    .await;
    report(config, nodes, pods, seconds);
    println!("{}", cpu_since(&env, &cpu));
    println!("{}", api_requests_since(&client, &requests).await);
    env.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn throughput_a_kube_scheduler_alone_with_plain_gpus() {
    kube_scheduler_alone("a", Extra::PlainGpus, &[("nvidia.com/gpu", 1)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn throughput_v_kube_scheduler_alone_with_vgpu_shaped_pods() {
    // The nodes' capacity has the three vGPU resources (8 x 10 shares, 8 x 100 cores, the GPUs' memory):
    // 80 of these pods fit a node by its totals, as in `b`.
    kube_scheduler_alone("v", Extra::None, &[(VGPU_NUMBER, 1), (VGPU_CORES, 10), (VGPU_MEMORY, 1024)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn throughput_b_kube_scheduler_with_our_extender() {
    let (nodes, pods) = (size("VGPU_THROUGHPUT_NODES", 50), size("VGPU_THROUGHPUT_PODS", 200));
    let mut env = TestEnv::builder("throughput_b").start().await.unwrap();
    let client = env.client().await.unwrap();
    create_nodes(&client, nodes, Extra::None).await;
    let port = free_port().unwrap();
    let mut args = vec![
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--server-bind-port={port}"),
        // The same client rate as the kube-scheduler beside it (`with_qps`): the extender creates every binding,
        // and at its default rate (20 QPS, burst 30, as vgpu-manager's) binds would wait for tokens.
        format!("--kube-api-qps={QPS}"),
        format!("--kube-api-burst={QPS}"),
    ];
    // Extra extender flags for a comparison run, e.g. `--success-events=false`.
    args.extend(
        std::env::var("VGPU_THROUGHPUT_EXTENDER_ARGS")
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned),
    );
    let tls = std::env::var("VGPU_THROUGHPUT_EXTENDER_TLS").map_or(true, |v| v != "0");
    let (cert, key, ca) = env.loopback_tls_files();
    if tls {
        args.extend([
            "--enable-tls".to_owned(),
            format!("--tls-cert-file={}", cert.display()),
            format!("--tls-key-file={}", key.display()),
        ]);
    }
    env.start_process(EXTENDER, &vgpu_binary(EXTENDER).unwrap(), &args, &[]).unwrap();
    let ready = match tls {
        true => wait_ready_tls(port, &ca, Duration::from_secs(120)).await,
        false => wait_ready(port, Duration::from_secs(120)).await,
    };
    if let Err(e) = ready {
        panic!("{e}\n{}", env.log_tail(EXTENDER, 30));
    }
    let extender = match tls {
        true => ExtenderConfig::vgpu(format!("https://127.0.0.1:{port}/scheduler")).with_tls_ca(&ca),
        false => ExtenderConfig::vgpu(format!("http://127.0.0.1:{port}/scheduler")),
    };
    env.start_scheduler_with_config(&with_qps(scheduler_configuration(env.kubeconfig_path(), &[extender])))
        .await
        .unwrap();
    let cpu = env.cpu_seconds();
    let requests = api_requests(&client).await;
    // The pods' node policy (`VGPU_THROUGHPUT_NODE_POLICY`: none, the default, binpack or spread). With none or
    // binpack consecutive pods go to the same node until it is full, and `SerializedNodeBind` creates their
    // bindings one after the other; spread sends them to different nodes, as kube-scheduler's own scoring does
    // in (a).
    let policy = std::env::var("VGPU_THROUGHPUT_NODE_POLICY").unwrap_or_default();
    let annotations: Vec<(&str, &str)> = match policy.as_str() {
        "" | "none" => Vec::new(),
        p => vec![("nvidia.com/node-scheduler-policy", p)],
    };
    let seconds = measure(&client, pods, |i| {
        let limits = [(VGPU_NUMBER, 1), (VGPU_CORES, 10), (VGPU_MEMORY, 1024)];
        (None, fixtures::vgpu_pod_with(NAMESPACE, &format!("pod-{i:05}"), &limits, &annotations))
    })
    .await;
    report("b", nodes, pods, seconds);
    println!("{}", cpu_since(&env, &cpu));
    println!("{}", api_requests_since(&client, &requests).await);
    let (_, metrics) = match tls {
        true => https_get(port, "/metrics", &ca).await.unwrap(),
        false => http_get(port, "/metrics").await.unwrap(),
    };
    println!("{}", verb_means(&metrics));
    println!("{}", connections(&metrics));
    env.check_process(EXTENDER).unwrap();
    env.finish();
}

/// The ResourceSlices our kubelet plugin publishes for a node of 8 mock H100s (default device config).
fn dra_slices(node: &str) -> Vec<ResourceSlice> {
    use vgpu_dra::devices::{AllocatableDevices, DeviceConfig};
    use vgpu_dra::health::HealthSnapshot;
    use vgpu_dra::slices::{SliceConfig, build_slices};
    let gpus: String = (0..GPUS)
        .map(|i| {
            format!(
                "  - {{ uuid: GPU-{node}-{i}, name: NVIDIA H100 80GB HBM3, memoryMiB: 81559, computeCapability: '9.0', \
                 numaNode: {}, busId: '0000:{:02x}:00.0' }}\n",
                i / 4,
                0x18 + i
            )
        })
        .collect();
    let yaml = format!("name: {node}\ndriver: {{ version: 570.86.10, cudaVersion: '12.8' }}\ngpus:\n{gpus}");
    let backend = vgpu_core::backend::mock::MockBackend::from_yaml_str(&yaml).unwrap();
    let devices = AllocatableDevices::from_backend(&backend, &DeviceConfig::default()).unwrap();
    build_slices(&SliceConfig::new(node), &devices, &HealthSnapshot::unmonitored_default(), 1).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn throughput_c_kube_scheduler_with_dra_claims() {
    let (nodes, pods) = (size("VGPU_THROUGHPUT_NODES", 50), size("VGPU_THROUGHPUT_PODS", 200));
    let mut env = TestEnv::builder("throughput_c").start().await.unwrap();
    let client = env.client().await.unwrap();
    fixtures::create_dra_device_classes(&client).await.unwrap();
    create_nodes(&client, nodes, Extra::DraSlices).await;
    env.start_scheduler_with_config(&with_qps(scheduler_configuration(env.kubeconfig_path(), &[])))
        .await
        .unwrap();
    let cpu = env.cpu_seconds();
    let requests = api_requests(&client).await;
    let seconds = measure(&client, pods, |i| {
        let name = format!("pod-{i:05}");
        let capacity = serde_json::json!({ "requests": { "cores": "10", "memory": "1Gi" } });
        let claim = fixtures::dra_claim(NAMESPACE, &name, "vgpu-manager", &capacity).unwrap();
        (Some(claim), fixtures::dra_pod(NAMESPACE, &name, &name).unwrap())
    })
    .await;
    report("c", nodes, pods, seconds);
    println!("{}", cpu_since(&env, &cpu));
    println!("{}", api_requests_since(&client, &requests).await);
    env.finish();
}

/// The samples of one metric family member in a text exposition: each line `<name>{labels} value` as a
/// lookup of its label values ("" when absent) and the value.
fn samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (impl Fn(&str) -> &'a str, f64)> + 'a {
    text.lines().filter_map(move |line| {
        let (labels, value) = line.strip_prefix(name)?.strip_prefix('{')?.split_once("} ")?;
        let label = move |k: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(k)?.strip_prefix("=\"")?.strip_suffix('"'))
                .unwrap_or("")
        };
        Some((label, value.trim().parse().unwrap_or(0.0)))
    })
}

/// `apiserver_request_total` summed by verb and resource (`post pods/binding`, …): kube-apiserver's
/// request counts, read through `client` (the admin user may read `/metrics`).
async fn api_requests(client: &kube::Client) -> std::collections::BTreeMap<String, f64> {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(request).await.unwrap();
    let mut counts = std::collections::BTreeMap::new();
    for (label, value) in samples(&text, "apiserver_request_total") {
        let resource = match label("subresource") {
            "" => label("resource").to_owned(),
            sub => format!("{}/{sub}", label("resource")),
        };
        *counts.entry(format!("{} {resource}", label("verb").to_lowercase())).or_insert(0.0) += value;
    }
    counts
}

/// `api requests: post pods 1000, post pods/binding 1000, …`: what changed since `before`, largest first
/// (which writes a configuration costs the API server per pod is part of the answer).
async fn api_requests_since(
    client: &kube::Client,
    before: &std::collections::BTreeMap<String, f64>,
) -> String {
    let now = api_requests(client).await;
    let mut deltas: Vec<(String, f64)> = now
        .into_iter()
        .map(|(k, v)| {
            let was = before.get(&k).copied().unwrap_or(0.0);
            (k, v - was)
        })
        .filter(|(_, d)| *d >= 1.0)
        .collect();
    deltas.sort_by(|x, y| y.1.total_cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
    let parts: Vec<String> = deltas.iter().map(|(k, d)| format!("{k} {d}")).collect();
    format!("api requests: {}", parts.join(", "))
}

/// `extender verbs: filter/total 0.41 ms × 200, …`: the mean of each `vgpu_scheduler_verb_duration_seconds`
/// series (its `_sum` over its `_count`), so a slow run says which verb and stage took the time.
fn verb_means(metrics: &str) -> String {
    let mut sums: std::collections::BTreeMap<String, (f64, f64)> = std::collections::BTreeMap::new();
    for (kind, is_sum) in [("sum", true), ("count", false)] {
        let name = format!("vgpu_scheduler_verb_duration_seconds_{kind}");
        for (label, value) in samples(metrics, &name) {
            let entry = sums.entry(format!("{}/{}", label("verb"), label("stage"))).or_default();
            if is_sum { entry.0 = value } else { entry.1 = value }
        }
    }
    let parts: Vec<String> = sums
        .iter()
        .filter(|(_, (_, n))| *n > 0.0)
        .map(|(k, (sum, n))| format!("{k} {:.2} ms × {n}", sum / n * 1000.0))
        .collect();
    format!("extender verbs: {}", parts.join(", "))
}

/// `extender connections: 3 for 1204 calls (2.5 per 1,000 calls; h2 over TLS 1, http/1.1 over TLS 2, …)`:
/// how kube-scheduler connected (`vgpu_scheduler_http_connections_total`, which counts this test's own probes
/// and scrapes too) against the verb calls it made (`vgpu_scheduler_verb_total`).
fn connections(metrics: &str) -> String {
    let calls: f64 = samples(metrics, "vgpu_scheduler_verb_total").map(|(_, v)| v).sum();
    let mut total = 0.0;
    let mut parts = Vec::new();
    for (label, value) in samples(metrics, "vgpu_scheduler_http_connections_total") {
        total += value;
        let over = if label("tls") == "true" { "over TLS" } else { "plain" };
        parts.push(format!("{} {over} {value}", label("protocol")));
    }
    let per_1000 = if calls > 0.0 { total * 1000.0 / calls } else { 0.0 };
    format!(
        "extender connections: {total} for {calls} calls ({per_1000:.1} per 1,000 calls; {})",
        parts.join(", ")
    )
}

//! The DRA collector (`--enable-dra-monitor`) over a node in a temp tree (library layer, real files, real
//! HTTP on loopback): mock backend with process samples, the ResourceSlices the DRA plugin's own builder
//! publishes for that backend (memory ratio 200), allocated ResourceClaims (a direct claim with two shares,
//! a template claim used by an app and a finished init container, a claim reserved for another pod, a claim
//! of another node's pool; and an exclusive whole GPU without capacities), pods bound to the node and their
//! cgroups. The page shows the per-claim container numbers (limits from the consumed capacity, usage from
//! the container's processes, no vmem ledger even with the gate on), the per-device assigned totals (lifecycle peak, not a plain sum),
//! `promtool check metrics` accepts the page (skipped, saying so, only without promtool), and `/readyz` waits
//! for the DRA caches.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod support;

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{ResourceClaim, ResourceSlice},
};
use support::{Proc, get, value};
use vgpu_core::dra::DRIVER_NAME;
use vgpu_core::{
    abi::vmem_node::{self, ProcessUsed, VmemNode},
    backend::mock::MockBackend,
};
use vgpu_dra::{
    claims::{allocated, allocation_result, claim},
    devices::{AllocatableDevices, DeviceConfig},
    health::HealthSnapshot,
    slices::{SliceConfig, build_slices},
};
use vgpu_monitor::{
    cgroup::CgroupLayout,
    collect::{MonitorConfig, NodeCollector},
    dra::{DraPods, DraSource, InMemoryDra},
    metrics,
    pods::{InMemoryPods, PodSource},
    server::{MonitorServer, ServerConfig},
};

const MIB: f64 = 1024.0 * 1024.0;
const GIB: f64 = 1024.0 * MIB;

fn procs() -> Vec<Proc> {
    vec![
        Proc { gpu: 0, pid: 100, used_mib: 1024, sm: 40, enc: 0, dec: 0 }, // a/main on GPU 0
        Proc { gpu: 1, pid: 101, used_mib: 512, sm: 10, enc: 0, dec: 0 },  // a/main on GPU 1
        Proc { gpu: 0, pid: 200, used_mib: 2048, sm: 70, enc: 20, dec: 0 }, // b/worker: 70 + 0.85 × 20
        Proc { gpu: 0, pid: 300, used_mib: 4096, sm: 5, enc: 0, dec: 0 },  // c/main: its claim is not its own
    ]
}

fn slices(backend: &MockBackend) -> Vec<ResourceSlice> {
    let config = DeviceConfig { cores_ratio: 100, memory_ratio: 200, ..DeviceConfig::default() };
    let devices = AllocatableDevices::from_backend(backend, &config).unwrap();
    let mut out = build_slices(&SliceConfig::new("node-1"), &devices, &HealthSnapshot::default(), 1).unwrap();
    // Another node's pool with the same device names: never ours.
    out.extend(build_slices(&SliceConfig::new("node-2"), &devices, &HealthSnapshot::default(), 1).unwrap());
    out
}

fn claims() -> Vec<ResourceClaim> {
    let r = |req, device, share, cores, memory| {
        allocation_result(
            req,
            DRIVER_NAME,
            "node-1",
            device,
            Some(share),
            &[("cores", cores), ("memory", memory)],
        )
    };
    vec![
        allocated(
            claim("ns", "claim-a", "cuid-a"),
            vec![r("gpu", "vgpu-0", "s1", "30", "4Gi"), r("gpu", "vgpu-1", "s2", "20", "2Gi")],
            &["uid-a"],
        ),
        // Created from pod b's template; its app and its (finished) init container both use it.
        allocated(
            claim("ns", "b-gpu-x7k2", "cuid-b"),
            vec![r("gpu", "vgpu-0", "s3", "50", "8Gi")],
            &["uid-b"],
        ),
        // Pod c names this claim, but the claim is reserved for another pod.
        allocated(
            claim("ns", "claim-c", "cuid-c"),
            vec![r("gpu", "vgpu-0", "s4", "10", "1Gi")],
            &["uid-other"],
        ),
        // Allocated on another node's pool.
        allocated(
            claim("ns", "claim-d", "cuid-d"),
            vec![allocation_result("gpu", DRIVER_NAME, "node-2", "vgpu-0", Some("s5"), &[("cores", "40")])],
            &["uid-d"],
        ),
    ]
}

fn status(name: &str, id: &str, running: bool) -> serde_json::Value {
    let state = if running {
        serde_json::json!({ "running": {} })
    } else {
        serde_json::json!({ "terminated": { "exitCode": 0 } })
    };
    serde_json::json!({ "name": name, "containerID": format!("containerd://{id}"), "image": "i", "imageID": "",
                        "ready": running, "restartCount": 0, "state": state })
}

fn pods() -> Vec<Pod> {
    let pod = |v: serde_json::Value| -> Pod { serde_json::from_value(v).unwrap() };
    vec![
        pod(serde_json::json!({
            "metadata": { "name": "a", "namespace": "ns", "uid": "uid-a" },
            "spec": { "nodeName": "node-1",
                      "resourceClaims": [{ "name": "gpu", "resourceClaimName": "claim-a" }],
                      "containers": [{ "name": "main", "resources": { "claims": [{ "name": "gpu" }] } },
                                     { "name": "no-gpu" }] },
            "status": { "phase": "Running", "qosClass": "Guaranteed",
                        "containerStatuses": [status("main", "ca", true), status("no-gpu", "cx", true)] }
        })),
        pod(serde_json::json!({
            "metadata": { "name": "b", "namespace": "ns", "uid": "uid-b" },
            "spec": { "nodeName": "node-1",
                      "resourceClaims": [{ "name": "gpu", "resourceClaimTemplateName": "one-share" }],
                      "initContainers": [{ "name": "warmup", "resources": { "claims": [{ "name": "gpu", "request": "gpu" }] } }],
                      "containers": [{ "name": "worker", "resources": { "claims": [{ "name": "gpu" }] } }] },
            "status": { "phase": "Running", "qosClass": "Guaranteed",
                        "resourceClaimStatuses": [{ "name": "gpu", "resourceClaimName": "b-gpu-x7k2" }],
                        "initContainerStatuses": [status("warmup", "cw", false)],
                        "containerStatuses": [status("worker", "cb", true)] }
        })),
        pod(serde_json::json!({
            "metadata": { "name": "c", "namespace": "ns", "uid": "uid-c" },
            "spec": { "nodeName": "node-1",
                      "resourceClaims": [{ "name": "gpu", "resourceClaimName": "claim-c" }],
                      "containers": [{ "name": "main", "resources": { "claims": [{ "name": "gpu" }] } }] },
            "status": { "phase": "Running", "qosClass": "Guaranteed", "containerStatuses": [status("main", "cc", true)] }
        })),
        pod(serde_json::json!({
            "metadata": { "name": "d", "namespace": "ns", "uid": "uid-d" },
            "spec": { "nodeName": "node-1",
                      "resourceClaims": [{ "name": "gpu", "resourceClaimName": "claim-d" }],
                      "containers": [{ "name": "main", "resources": { "claims": [{ "name": "gpu" }] } }] },
            "status": { "phase": "Running", "qosClass": "Guaranteed", "containerStatuses": [status("main", "cd", true)] }
        })),
    ]
}

struct Node {
    _dir: tempfile::TempDir,
    server: Arc<MonitorServer>,
}

/// A pod source whose readiness the test flips.
#[derive(Debug)]
struct Flip(InMemoryPods, AtomicBool);

impl PodSource for Flip {
    fn pods(&self) -> Vec<Arc<Pod>> {
        self.0.pods()
    }
    fn synced(&self) -> bool {
        self.1.load(Ordering::SeqCst)
    }
}

fn node(pods: Arc<dyn PodSource>, dra: Arc<dyn DraSource>) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let (manager, cgroup) = (dir.path().join("manager"), dir.path().join("cgroup"));
    std::fs::create_dir_all(&cgroup).unwrap();
    std::fs::write(cgroup.join("cgroup.controllers"), "cpu memory").unwrap();
    for (uid, id, pids) in [
        ("uid-a", "ca", "100\n101\n"),
        ("uid-a", "cx", "150\n"),
        ("uid-b", "cb", "200\n"),
        ("uid-c", "cc", "300\n"),
        ("uid-d", "cd", "400\n"),
    ] {
        let dir = cgroup.join(format!("kubepods/pod{uid}/{id}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup.procs"), pids).unwrap();
    }
    // A ledger where the device-plugin path would look: the DRA path must not add it.
    let ledger = manager.join("uid-b_worker").join(vmem_node::DIR_NAME);
    std::fs::create_dir_all(&ledger).unwrap();
    let mut vmem = VmemNode::default();
    vmem.devices[0] = vec![ProcessUsed { pid: 200, used: 1 << 30 }];
    vmem_node::write(&ledger.join(vmem_node::FILE_NAME), &vmem).unwrap();

    let backend = Arc::new(MockBackend::from_yaml_str(&support::mock_yaml(2, &procs())).unwrap());
    let mut config = MonitorConfig::new("node-1");
    config.manager_dir = manager;
    config.cgroup = CgroupLayout { root: cgroup, ..CgroupLayout::default() };
    config.vmem_tracking = true;
    let ready: Arc<dyn PodSource> = Arc::new(DraPods::new(Arc::clone(&pods), Arc::clone(&dra)));
    let collector = Arc::new(NodeCollector::new_dra(config, backend, pods, dra));
    let mut registry = metrics::new_registry();
    metrics::register(&mut registry, collector);
    Node { _dir: dir, server: MonitorServer::new(registry, ready, ServerConfig::default()) }
}

fn dra() -> Arc<InMemoryDra> {
    let backend = MockBackend::from_yaml_str(&support::mock_yaml(2, &procs())).unwrap();
    Arc::new(InMemoryDra::new(slices(&backend), claims()))
}

fn ctr(pod: &'static str, name: &'static str, idx: &'static str) -> [(&'static str, &'static str); 4] {
    [("pod_name", pod), ("container_name", name), ("vdevice_idx", idx), ("pod_namespace", "ns")]
}

#[test]
fn per_claim_container_numbers_and_assigned_totals() {
    let node = node(Arc::new(InMemoryPods::new(pods())), dra());
    let page = node.server.render(false).unwrap();

    // a/main holds two shares of claim-a: vgpu-0 (index 0) and vgpu-1 (index 1), in GPU order.
    let a0 = ctr("a", "main", "0");
    assert!(
        page.contains(r#"pod_name="a",container_name="main",vdevice_idx="0",device_uuid="GPU-0000""#),
        "{page}"
    );
    assert_eq!(value(&page, "container_vgpu_device_memory_limit_in_bytes", &a0), 4.0 * GIB);
    // Memory ratio 200: half of the share is real memory.
    assert_eq!(value(&page, "container_vgpu_device_physical_memory_limit_in_bytes", &a0), 2.0 * GIB);
    assert_eq!(value(&page, "container_vgpu_device_physical_memory_usage_in_bytes", &a0), 1024.0 * MIB);
    assert_eq!(value(&page, "container_vgpu_device_memory_usage_in_bytes", &a0), 1024.0 * MIB);
    assert_eq!(value(&page, "container_vgpu_device_memory_utilization_percent", &a0), 25.0);
    assert_eq!(value(&page, "container_vgpu_device_core_utilization_percent", &a0), 40.0);
    let a1 = ctr("a", "main", "1");
    assert!(
        page.contains(r#"pod_name="a",container_name="main",vdevice_idx="1",device_uuid="GPU-0001""#),
        "{page}"
    );
    assert_eq!(value(&page, "container_vgpu_device_memory_limit_in_bytes", &a1), 2.0 * GIB);
    assert_eq!(value(&page, "container_vgpu_device_physical_memory_usage_in_bytes", &a1), 512.0 * MIB);
    assert_eq!(value(&page, "container_vgpu_device_core_utilization_percent", &a1), 10.0);

    // b/worker through its template claim; the ledger's 1 GiB is not added (VirtualMemoryTracking is on).
    let b0 = ctr("b", "worker", "0");
    assert_eq!(value(&page, "container_vgpu_device_memory_limit_in_bytes", &b0), 8.0 * GIB);
    assert_eq!(value(&page, "container_vgpu_device_memory_usage_in_bytes", &b0), 2048.0 * MIB);
    assert_eq!(value(&page, "container_vgpu_device_memory_utilization_percent", &b0), 25.0);
    assert_eq!(value(&page, "container_vgpu_device_core_utilization_percent", &b0), 87.0);

    // No series for: a container without claims, a finished init container, a claim reserved for another
    // pod, a claim on another node's pool.
    for absent in
        [r#"container_name="no-gpu""#, r#"container_name="warmup""#, r#"pod_name="c""#, r#"pod_name="d""#]
    {
        assert!(!page.contains(absent), "{absent} in\n{page}");
    }

    // GPU 0: a's 30 cores + b's 50 (its app and its init container never run together: counted once).
    let g0 = [("device_idx", "0"), ("device_uuid", "GPU-0000")];
    assert_eq!(value(&page, "vgpu_device_total_cores_number", &g0), 100.0);
    assert_eq!(value(&page, "vgpu_device_assigned_cores_number", &g0), 80.0);
    assert_eq!(value(&page, "vgpu_device_assigned_memory_in_bytes", &g0), 12.0 * GIB);
    assert_eq!(value(&page, "vgpu_device_assigned_physical_memory_in_bytes", &g0), 6.0 * GIB);
    assert_eq!(value(&page, "vgpu_device_total_memory_in_bytes", &g0), 48.0 * GIB);
    assert_eq!(value(&page, "vgpu_device_total_physical_memory_in_bytes", &g0), 24.0 * GIB);
    assert_eq!(value(&page, "vgpu_device_peak_shared_containers_number", &g0), 2.0);
    assert_eq!(value(&page, "vgpu_device_current_shared_containers_number", &g0), 2.0);
    let g1 = [("device_idx", "1"), ("device_uuid", "GPU-0001")];
    assert_eq!(value(&page, "vgpu_device_assigned_cores_number", &g1), 20.0);
    assert_eq!(value(&page, "vgpu_device_assigned_memory_in_bytes", &g1), 2.0 * GIB);
    assert_eq!(value(&page, "vgpu_device_current_shared_containers_number", &g1), 1.0);
    assert_eq!(value(&page, "node_vgpu_device_assigned_memory_in_bytes", &[]), 14.0 * GIB);
    assert_eq!(value(&page, "node_vgpu_device_assigned_physical_memory_in_bytes", &[]), 7.0 * GIB);
    assert_eq!(value(&page, "node_vgpu_device_total_memory_in_bytes", &[]), 96.0 * GIB);
    assert!(page.contains(r#"cores_scaling="1.00",memory_scaling="2.00""#), "{page}");
    // Physical series as on the device-plugin path; service="vGPU" on every series.
    assert_eq!(
        value(&page, "physical_gpu_device_memory_usage_in_bytes", &g0),
        (1024.0 + 2048.0 + 4096.0) * MIB
    );
    for line in page.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        assert!(line.contains(r#"service="vGPU""#), "{line}");
    }
    if support::promtool_installed() {
        support::promtool_check(&page, "DRA page, Prometheus text");
        support::promtool_check(&node.server.render(true).unwrap(), "DRA page, OpenMetrics");
    }
}

#[test]
fn without_slices_or_claims_there_are_no_vgpu_rows() {
    let empty = Arc::new(InMemoryDra::default());
    let node = node(Arc::new(InMemoryPods::new(pods())), empty.clone());
    let page = node.server.render(false).unwrap();
    assert!(!page.contains("container_vgpu_device_memory_limit_in_bytes{"), "{page}");
    assert!(!page.contains("vgpu_device_total_cores_number{"), "{page}");
    assert!(page.contains("physical_gpu_device_total_memory_in_bytes{"), "{page}");
    // Slices but no claims: the devices show, nothing assigned.
    let backend = MockBackend::from_yaml_str(&support::mock_yaml(2, &procs())).unwrap();
    empty.set_slices(slices(&backend));
    let page = node.server.render(false).unwrap();
    assert_eq!(value(&page, "vgpu_device_assigned_cores_number", &[("device_idx", "0")]), 0.0);
    assert!(!page.contains("container_vgpu_device_memory_limit_in_bytes{"), "{page}");
    empty.set_claims(claims());
    let page = node.server.render(false).unwrap();
    assert_eq!(value(&page, "vgpu_device_assigned_cores_number", &[("device_idx", "0")]), 80.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_on_loopback_ready_once_synced() {
    let pods = Arc::new(Flip(InMemoryPods::new(pods()), AtomicBool::new(false)));
    let node = node(pods.clone(), dra());
    let router = node.server.router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let stopped = stop.clone().cancelled_owned();
    let task = tokio::spawn(async move {
        vgpu_serve::http::serve(listener, router, None, &Default::default(), stopped).await;
    });
    let fetch = move |path: &'static str| tokio::task::spawn_blocking(move || get(addr, path, &[]));
    assert_eq!(fetch("/readyz").await.unwrap().status, 503);
    pods.1.store(true, Ordering::SeqCst);
    assert_eq!(fetch("/readyz").await.unwrap().status, 200);
    let r = fetch("/metrics").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        value(&r.body, "container_vgpu_device_memory_limit_in_bytes", &ctr("b", "worker", "0")),
        8.0 * GIB
    );
    stop.cancel();
    task.await.unwrap();
}

#[test]
fn an_exclusive_whole_gpu_is_limited_by_the_gpus_memory() {
    let backend = MockBackend::from_yaml_str(&support::mock_yaml(2, &procs())).unwrap();
    // VGPUSupport off: gpu-<minor> devices without capacities, allocated exclusively.
    let config = DeviceConfig { vgpu_support: false, ..DeviceConfig::default() };
    let devices = AllocatableDevices::from_backend(&backend, &config).unwrap();
    let slices = build_slices(&SliceConfig::new("node-1"), &devices, &HealthSnapshot::default(), 1).unwrap();
    let whole = allocated(
        claim("ns", "claim-a", "cuid-a"),
        vec![allocation_result("gpu", DRIVER_NAME, "node-1", "gpu-0", None, &[])],
        &["uid-a"],
    );
    let node = node(Arc::new(InMemoryPods::new(pods())), Arc::new(InMemoryDra::new(slices, [whole])));
    let page = node.server.render(false).unwrap();
    let a0 = ctr("a", "main", "0");
    assert_eq!(value(&page, "container_vgpu_device_memory_limit_in_bytes", &a0), 24.0 * GIB);
    assert_eq!(value(&page, "container_vgpu_device_physical_memory_limit_in_bytes", &a0), 24.0 * GIB);
    assert_eq!(value(&page, "container_vgpu_device_physical_memory_usage_in_bytes", &a0), 1024.0 * MIB);
    let percent = value(&page, "container_vgpu_device_memory_utilization_percent", &a0);
    assert!((percent - 1024.0 / 24576.0 * 100.0).abs() < 1e-9, "{percent}");
    let g0 = [("device_idx", "0"), ("device_uuid", "GPU-0000")];
    assert_eq!(value(&page, "vgpu_device_total_cores_number", &g0), 100.0);
    assert_eq!(value(&page, "vgpu_device_assigned_cores_number", &g0), 100.0);
    assert_eq!(value(&page, "vgpu_device_assigned_memory_in_bytes", &g0), 24.0 * GIB);
    assert_eq!(value(&page, "vgpu_device_total_memory_in_bytes", &g0), 24.0 * GIB);
    assert!(page.contains(r#"cores_scaling="1.00",memory_scaling="1.00""#), "{page}");
}

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `vgpuctl cluster` and `vgpuctl pod` as processes against a fake API server (plain HTTP/1.1 on loopback,
//! reached through a kubeconfig): the list answers hold vGPU nodes (one with an unhealthy GPU, one whose
//! register does not decode, one without vGPUs), bound pods with `pre-allocated` annotations, a pending pod
//! that fits nowhere and its `FilteringFailed` event. Asserted: the per-GPU allocations, pods per GPU,
//! fragmentation and unhealthy GPUs; byte-stable JSON with sorted keys; the pending pod's per-node reason codes
//! from the extender's placement and its events; a bound pod's GPUs; only GETs reach the server; the
//! `kubectl-vgpu` plugin name.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use assert_cmd::Command;
use serde_json::{Value, json};
use vgpu_core::codec::{node_config_info, node_devices, pod_devices};
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{
    ContainerDeviceClaim, DeviceClaim, DeviceHealth, GpuDevice, NodeDeviceInventory, NodeVgpuConfig,
    PodDeviceClaim,
};

/// Requests seen: `METHOD path?query`.
type Seen = Arc<Mutex<Vec<String>>>;

fn gpu(index: u32, uuid: &str, healthy: bool) -> GpuDevice {
    GpuDevice {
        index,
        uuid: uuid.into(),
        type_name: "NVIDIA A100".into(),
        memory_mib: 16384,
        cores: 100,
        split_count: 4,
        health: if healthy { DeviceHealth::Healthy } else { DeviceHealth::Unhealthy },
        ..GpuDevice::default()
    }
}

fn node(name: &str, register: Option<String>) -> Value {
    let d = ResourceDomain::default();
    let mut annotations = serde_json::Map::new();
    if let Some(r) = register {
        annotations.insert(d.node_device_register(), json!(r));
        annotations.insert(
            d.node_config_info(),
            json!(node_config_info::encode(&NodeVgpuConfig::default()).unwrap()),
        );
    }
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": annotations},
        "status": {"allocatable": {d.vgpu_number(): "8", "cpu": "8"}}
    })
}

fn inventory(devices: Vec<GpuDevice>) -> Option<String> {
    Some(node_devices::encode(&NodeDeviceInventory::new(devices)).unwrap())
}

/// A pod with one container `main` asking `gpus` × (`cores`, `memory`); bound to `node` with `claims`
/// (index, uuid, cores, memory) as its `pre-allocated`, or pending.
fn pod(
    ns: &str,
    name: &str,
    node: Option<&str>,
    gpus: u32,
    cores: u64,
    memory: u64,
    claims: &[(u32, &str, u64, u64)],
) -> Value {
    let d = ResourceDomain::default();
    let mut annotations = serde_json::Map::new();
    if let Some(n) = node {
        let claim = PodDeviceClaim {
            containers: vec![ContainerDeviceClaim {
                name: "main".into(),
                devices: claims
                    .iter()
                    .map(|(i, u, c, m)| DeviceClaim {
                        index: *i,
                        uuid: (*u).into(),
                        cores: *c,
                        memory_mib: *m,
                    })
                    .collect(),
            }],
        };
        annotations.insert(d.pre_allocated(), json!(pod_devices::encode(&claim).unwrap()));
        annotations.insert(d.predicate_node(), json!(n));
    }
    let mut limits = serde_json::Map::new();
    if gpus > 0 {
        limits.insert(d.vgpu_number(), json!(gpus.to_string()));
        limits.insert(d.vgpu_cores(), json!(cores.to_string()));
        limits.insert(d.vgpu_memory(), json!(memory.to_string()));
    }
    let mut spec =
        json!({"containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}]});
    if let Some(n) = node {
        spec["nodeName"] = json!(n);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}"), "resourceVersion": "5",
                     "creationTimestamp": "2026-01-01T00:00:00Z", "annotations": annotations},
        "spec": spec,
        "status": {"phase": if node.is_some() { "Running" } else { "Pending" }}
    })
}

const SUMMARY: &str = "0/3 nodes are available: Insufficient GPU cards (gpu-a), Insufficient vGPU cores (gpu-b), node vGPU registry invalid (gpu-bad).";
fn event(name: &str, reason: &str, source: &str, time: &str, message: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": "default"},
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": "big", "uid": "uid-default-big"},
        "reason": reason, "message": message, "type": "Warning", "count": 2,
        "source": {"component": source},
        "firstTimestamp": time, "lastTimestamp": time
    })
}

fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "100"}, "items": items})
}

/// The API server's answer for a path (query stripped).
fn answer(path: &str, query: &str) -> (u16, Value) {
    match path {
        "/api/v1/nodes" => (
            200,
            list(
                "NodeList",
                vec![
                    node("gpu-b", inventory(vec![gpu(0, "GPU-b0", true), gpu(1, "GPU-b1", true)])),
                    node("gpu-a", inventory(vec![gpu(0, "GPU-a0", true), gpu(1, "GPU-a1", false)])),
                    node("gpu-bad", Some("not a register".into())),
                    node("cpu-only", None),
                ],
            ),
        ),
        "/api/v1/pods" => (
            200,
            list(
                "PodList",
                vec![
                    pod("default", "p2", Some("gpu-a"), 1, 20, 2048, &[(0, "GPU-a0", 20, 2048)]),
                    pod(
                        "team",
                        "p3",
                        Some("gpu-b"),
                        2,
                        50,
                        8192,
                        &[(0, "GPU-b0", 50, 8192), (1, "GPU-b1", 50, 8192)],
                    ),
                    pod("default", "p1", Some("gpu-a"), 1, 30, 4096, &[(0, "GPU-a0", 30, 4096)]),
                    pod("default", "big", None, 2, 100, 1024, &[]),
                    pod("default", "web", Some("cpu-only"), 0, 0, 0, &[]),
                ],
            ),
        ),
        "/api/v1/namespaces/default/events" if query.contains("fieldSelector=involvedObject.name%3Dbig") => (
            200,
            list(
                "EventList",
                vec![
                    event(
                        "big.2",
                        "FailedScheduling",
                        "vgpu-scheduler",
                        "2026-01-01T00:00:09Z",
                        "0/4 nodes are available: ...",
                    ),
                    event("big.1", "FilteringFailed", "vgpu-scheduler", "2026-01-01T00:00:08Z", SUMMARY),
                ],
            ),
        ),
        p if p.starts_with("/api/v1/namespaces/") && p.ends_with("/events") => {
            (200, list("EventList", vec![]))
        }
        _ => (
            404,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}),
        ),
    }
}

fn serve(stream: TcpStream, seen: &Seen) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
        return;
    }
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
    }
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    seen.lock().unwrap().push(format!("{method} {target}"));
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let (status, body) = if method == "GET" { answer(path, query) } else { (405, json!({})) };
    let body = serde_json::to_vec(&body).unwrap();
    let mut out = stream;
    let head = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = out.write_all(head.as_bytes()).and_then(|()| out.write_all(&body));
}

/// Starts the fake API server (the listener stays bound for the test's life) and writes its kubeconfig.
fn fake_cluster(dir: &Path) -> (PathBuf, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            serve(stream, &log);
        }
    });
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{port}\n\
             users:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context:\n    cluster: fake\n    user: u\n\
             current-context: c\n"
        ),
    )
    .unwrap();
    (kubeconfig, seen)
}

fn vgpuctl(bin: &Path, args: &[&str], kubeconfig: &Path) -> (String, String, i32) {
    let out = Command::new(bin).args(args).arg("--kubeconfig").arg(kubeconfig).output().unwrap();
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
        out.status.code().unwrap_or(-1),
    )
}

fn bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("vgpuctl")
}

/// Every object's keys appear in sorted order in the text (checked on the re-parsed value's key order as
/// printed, which is the text's own order when serde_json preserves it, and on the raw top-level keys).
fn assert_top_level_keys_sorted(text: &str, keys: &[&str]) {
    let positions: Vec<usize> = keys.iter().map(|k| text.find(&format!("\n  \"{k}\":")).unwrap()).collect();
    let mut sorted_keys = keys.to_vec();
    sorted_keys.sort_unstable();
    assert_eq!(keys, sorted_keys.as_slice(), "the list of keys given must be sorted");
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "keys out of order: {keys:?} at {positions:?}\n{text}"
    );
}

#[test]
fn cluster_json_holds_the_allocations_per_gpu_and_is_stable() {
    let dir = tempfile::tempdir().unwrap();
    let (kubeconfig, seen) = fake_cluster(dir.path());
    let (first, err, rc) = vgpuctl(&bin(), &["cluster", "--json"], &kubeconfig);
    assert_eq!(rc, 0, "{err}");
    let (second, _, rc) = vgpuctl(&bin(), &["cluster", "--json"], &kubeconfig);
    assert_eq!(rc, 0);
    assert_eq!(first, second, "two runs differ");
    assert_top_level_keys_sorted(
        &first,
        &["allocations", "nodes", "nodes_listed", "pods_listed", "summary", "unhealthy"],
    );
    let v: Value = serde_json::from_str(&first).unwrap();
    assert_eq!(v["nodes_listed"], 4);
    assert_eq!(v["pods_listed"], 5);
    let names: Vec<&str> =
        v["nodes"].as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["gpu-a", "gpu-b", "gpu-bad"]);

    let a = &v["nodes"][0];
    assert_eq!(a["pods"], json!(["default/p1", "default/p2"]));
    let a0 = &a["gpus"][0];
    assert_eq!(
        (
            a0["uuid"].as_str(),
            a0["vgpus_allocated"].as_u64(),
            a0["cores_allocated"].as_u64(),
            a0["memory_mib_allocated"].as_u64()
        ),
        (Some("GPU-a0"), Some(2), Some(50), Some(6144))
    );
    assert_eq!(a0["pods"], json!(["default/p1", "default/p2"]));
    assert_eq!(
        (a0["vgpus"].as_u64(), a0["cores"].as_u64(), a0["memory_mib"].as_u64()),
        (Some(4), Some(100), Some(16384))
    );
    assert_eq!(a0["healthy"], true);
    let a1 = &a["gpus"][1];
    assert_eq!((a1["healthy"].as_bool(), a1["vgpus_allocated"].as_u64()), (Some(false), Some(0)));
    assert_eq!(a1["pods"], json!([]));
    assert_eq!(a["summary"]["gpus"], 1, "the unhealthy GPU is not schedulable");
    assert_eq!(a["summary"]["unhealthy_gpus"], 1);

    let b = &v["nodes"][1];
    for g in b["gpus"].as_array().unwrap() {
        assert_eq!(
            (g["cores_allocated"].as_u64(), g["memory_mib_allocated"].as_u64()),
            (Some(50), Some(8192))
        );
        assert_eq!(g["pods"], json!(["team/p3"]));
    }
    let bad = &v["nodes"][2];
    assert!(bad["error"].as_str().unwrap().contains("nvidia.com/node-device-register"), "{bad}");
    assert_eq!(bad["gpus"], json!([]));

    // Totals over the 3 schedulable GPUs: all in use, all partially filled.
    let s = &v["summary"];
    assert_eq!(
        (s["gpus"].as_u64(), s["gpus_in_use"].as_u64(), s["unhealthy_gpus"].as_u64()),
        (Some(3), Some(3), Some(1))
    );
    assert_eq!(s["core_utilization_pct"], 50.0);
    assert_eq!(
        s["memory_utilization_pct"].as_f64(),
        Some((10_000.0_f64 * 22528.0 / 49152.0).round() / 100.0)
    );
    assert_eq!(s["fragmentation_pct"], 100.0);
    assert_eq!(v["unhealthy"], json!([{"node": "gpu-a", "index": 1, "uuid": "GPU-a1"}]));
    let pods: Vec<&str> =
        v["allocations"].as_array().unwrap().iter().map(|p| p["pod"].as_str().unwrap()).collect();
    assert_eq!(pods, ["default/p1", "default/p2", "team/p3"]);

    // Read-only: only GETs, of nodes and pods.
    let seen = seen.lock().unwrap().clone();
    assert!(!seen.is_empty());
    for r in &seen {
        assert!(r.starts_with("GET /api/v1/nodes") || r.starts_with("GET /api/v1/pods"), "{r}");
    }
}

#[test]
fn cluster_table_lists_every_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let (kubeconfig, _) = fake_cluster(dir.path());
    let (out, err, rc) = vgpuctl(&bin(), &["cluster"], &kubeconfig);
    assert_eq!(rc, 0, "{err}");
    let lines: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines[0], ["NODE", "GPU", "TYPE", "HEALTH", "VGPUS", "CORES", "MEMORY(MiB)", "PODS"]);
    assert_eq!(
        lines[1],
        ["gpu-a", "0", "NVIDIA", "A100", "healthy", "2/4", "50/100", "6144/16384", "default/p1,default/p2"]
    );
    assert_eq!(lines[2], ["gpu-a", "1", "NVIDIA", "A100", "unhealthy", "0/4", "0/100", "0/16384", "-"]);
    assert_eq!(
        lines[3],
        ["gpu-b", "0", "NVIDIA", "A100", "healthy", "1/4", "50/100", "8192/16384", "team/p3"]
    );
    assert_eq!(
        lines[4],
        ["gpu-b", "1", "NVIDIA", "A100", "healthy", "1/4", "50/100", "8192/16384", "team/p3"]
    );
    assert!(out.lines().nth(5).unwrap().starts_with("gpu-bad"), "{out}");
    assert!(out.contains("3 of 3 schedulable GPUs in use, cores 50.0%"), "{out}");
    assert!(out.contains("unhealthy: gpu-a GPU 1 (GPU-a1)"), "{out}");
}

#[test]
fn pod_explains_a_pending_pod_per_node() {
    let dir = tempfile::tempdir().unwrap();
    let (kubeconfig, seen) = fake_cluster(dir.path());
    let (out, err, rc) = vgpuctl(&bin(), &["pod", "default/big", "--json"], &kubeconfig);
    assert_eq!(rc, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((v["status"].as_str(), v["node"].is_null()), (Some("pending"), true));
    assert!(v["allocation"].is_null());
    let p = &v["placement"];
    assert_eq!(p["fits"], json!([]));
    let codes: Vec<(&str, &str)> = p["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["node"].as_str().unwrap(), n["code"].as_str().unwrap()))
        .collect();
    assert_eq!(
        codes,
        [
            ("gpu-a", "InsufficientGPUCards"),
            ("gpu-b", "InsufficientVGPUCore"),
            ("gpu-bad", "NodeBadVGPURegister")
        ],
        "{out}"
    );
    assert_eq!(p["summary"], SUMMARY, "the local placement says what the extender said");
    // Events, oldest first, with the extender's summary.
    let reasons: Vec<&str> =
        v["events"].as_array().unwrap().iter().map(|e| e["reason"].as_str().unwrap()).collect();
    assert_eq!(reasons, ["FilteringFailed", "FailedScheduling"]);
    assert_eq!(v["events"][0]["message"], SUMMARY);
    assert_eq!(v["events"][0]["source"], "vgpu-scheduler");
    assert_eq!(v["events"][0]["count"], 2);
    let seen = seen.lock().unwrap().clone();
    assert!(seen.iter().all(|r| r.starts_with("GET ")), "{seen:?}");
    assert!(
        seen.iter()
            .any(|r| r.contains("/namespaces/default/events?") && r.contains("involvedObject.name%3Dbig"))
    );

    // The table says the same.
    let (out, _, rc) = vgpuctl(&bin(), &["pod", "default/big"], &kubeconfig);
    assert_eq!(rc, 0);
    assert!(out.starts_with("Pod default/big (Pending): pending\n"), "{out}");
    assert!(out.contains(&format!("Placement (local dry-run): {SUMMARY}")), "{out}");
    assert!(out.contains("gpu-b") && out.contains("InsufficientVGPUCore"), "{out}");
    assert!(out.contains("FilteringFailed"), "{out}");
}

#[test]
fn pod_shows_where_a_bound_pod_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (kubeconfig, _) = fake_cluster(dir.path());
    let (out, err, rc) = vgpuctl(&bin(), &["pod", "team/p3", "--json"], &kubeconfig);
    assert_eq!(rc, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((v["status"].as_str(), v["node"].as_str()), (Some("bound"), Some("gpu-b")));
    assert!(v["placement"].is_null());
    assert_eq!(v["events"], json!([]));
    assert_eq!(v["allocation"]["node"], "gpu-b");
    assert_eq!(
        v["allocation"]["containers"],
        json!([{"name": "main", "devices": [
            {"index": 0, "uuid": "GPU-b0", "cores": 50, "memory_mib": 8192},
            {"index": 1, "uuid": "GPU-b1", "cores": 50, "memory_mib": 8192}
        ]}])
    );
    let (out, _, rc) = vgpuctl(&bin(), &["pod", "team/p3"], &kubeconfig);
    assert_eq!(rc, 0);
    assert!(out.starts_with("Pod team/p3 (Running): bound on gpu-b\n"), "{out}");
    assert!(out.contains("GPU 1 GPU-b1  cores 50  memory 8192 MiB"), "{out}");
}

#[test]
fn bad_pod_references_and_unknown_pods_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let (kubeconfig, _) = fake_cluster(dir.path());
    for bad in ["big", "/big", "default/", "a/b/c"] {
        let (_, err, rc) = vgpuctl(&bin(), &["pod", bad], &kubeconfig);
        assert_eq!(rc, 2, "{bad}");
        assert!(err.contains("expected NAMESPACE/NAME"), "{bad}: {err}");
    }
    let (_, err, rc) = vgpuctl(&bin(), &["pod", "default/absent"], &kubeconfig);
    assert_eq!(rc, 2);
    assert!(err.contains("pod default/absent not found"), "{err}");
    // An unreachable kubeconfig file: exit 2 naming it.
    let missing = dir.path().join("absent.kubeconfig");
    let (_, err, rc) = vgpuctl(&bin(), &["cluster"], &missing);
    assert_eq!(rc, 2);
    assert!(err.contains("absent.kubeconfig"), "{err}");
}

#[cfg(unix)]
#[test]
fn kubectl_plugin_name_runs_the_same_commands() {
    let dir = tempfile::tempdir().unwrap();
    let (kubeconfig, _) = fake_cluster(dir.path());
    let plugin = dir.path().join("kubectl-vgpu");
    std::os::unix::fs::symlink(bin(), &plugin).unwrap();

    let help = Command::new(&plugin).arg("--help").output().unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    assert!(help.contains("Usage: kubectl vgpu [OPTIONS] <COMMAND>"), "{help}");
    let help = Command::new(&plugin).args(["cluster", "--help"]).output().unwrap();
    assert!(String::from_utf8(help.stdout).unwrap().contains("Usage: kubectl vgpu cluster"));
    Command::new(&plugin)
        .arg("--version")
        .assert()
        .success()
        .stdout(predicates::str::starts_with("kubectl-vgpu "));
    // A bad flag: exit 2, usage in the plugin's words.
    Command::new(&plugin)
        .args(["cluster", "--bogus"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("Usage: kubectl vgpu cluster"));
    // Same output as vgpuctl.
    let (via_plugin, err, rc) = vgpuctl(&plugin, &["cluster", "--json"], &kubeconfig);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(via_plugin, vgpuctl(&bin(), &["cluster", "--json"], &kubeconfig).0);
    // Under its own name, vgpuctl keeps its name.
    let help = Command::new(bin()).arg("--help").output().unwrap();
    assert!(String::from_utf8(help.stdout).unwrap().contains("Usage: vgpuctl [OPTIONS] <COMMAND>"));
}

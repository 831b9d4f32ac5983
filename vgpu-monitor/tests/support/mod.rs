//! A node in a temp tree for the monitor's tests and bench: a mock backend description, pods as the
//! device plugin leaves them, each container's `vgpu.config` (and optionally `vmem_node.config`), and a
//! cgroup v2 hierarchy (cgroupfs driver) holding each container's PIDs.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::HashMap,
    fmt::Write as _,
    io::{Read, Write as _},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;
use vgpu_core::abi::{
    vgpu_config::{self, DeviceConfig, VgpuConfig},
    vmem_node::{self, ProcessUsed, VmemNode},
};

/// One container's device: GPU index, cores, memory MiB.
#[derive(Debug, Clone)]
pub struct Claim {
    pub gpu: u32,
    pub cores: u64,
    pub memory_mib: u64,
}

/// One fake container.
#[derive(Debug, Clone)]
pub struct Container {
    pub pod: String,
    pub namespace: String,
    pub uid: String,
    pub name: String,
    pub id: String,
    pub pids: Vec<u32>,
    pub claims: Vec<Claim>,
    /// Virtual bytes per claim (same order), written to vmem_node.config when `Some`.
    pub vmem: Option<Vec<u64>>,
}

pub fn uuid(gpu: u32) -> String {
    format!("GPU-{gpu:04}")
}

/// The pod of `c` (one container, Running, Guaranteed).
pub fn pod(c: &Container) -> Pod {
    let claims: Vec<String> =
        c.claims.iter().map(|k| format!("{}_{}_{}_{}", k.gpu, uuid(k.gpu), k.cores, k.memory_mib)).collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": c.pod, "namespace": c.namespace, "uid": c.uid,
            "labels": { "nvidia.com/metrics-node": "node-1" },
            "annotations": { "nvidia.com/real-allocated": format!("{}[{}]", c.name, claims.join(",")) }
        },
        "spec": { "nodeName": "node-1", "containers": [{ "name": c.name }] },
        "status": {
            "phase": "Running", "qosClass": "Guaranteed",
            "containerStatuses": [{
                "name": c.name, "containerID": format!("containerd://{}", c.id), "image": "i", "imageID": "",
                "ready": true, "restartCount": 0, "state": { "running": {} }
            }]
        }
    }))
    .unwrap()
}

/// Writes `c`'s files under `manager` and `cgroup`.
pub fn write_files(c: &Container, manager: &Path, cgroup: &Path) {
    let dir = manager.join(format!("{}_{}", c.uid, c.name));
    std::fs::create_dir_all(dir.join("config")).unwrap();
    let mut config = VgpuConfig {
        pod_uid: c.uid.clone(),
        pod_name: c.pod.clone(),
        pod_namespace: c.namespace.clone(),
        container_name: c.name.clone(),
        vmem_node: i32::from(c.vmem.is_some()),
        ..VgpuConfig::default()
    };
    for k in &c.claims {
        config.devices[k.gpu as usize] = DeviceConfig {
            uuid: uuid(k.gpu),
            total_memory: k.memory_mib << 20,
            real_memory: k.memory_mib << 20,
            hard_core: k.cores as i32,
            soft_core: k.cores as i32,
            activate: 1,
            ..DeviceConfig::default()
        };
    }
    vgpu_config::write(&dir.join("config/vgpu.config"), &config).unwrap();
    if let Some(v) = &c.vmem {
        std::fs::create_dir_all(dir.join(vmem_node::DIR_NAME)).unwrap();
        let mut node = VmemNode::default();
        for (k, bytes) in c.claims.iter().zip(v) {
            node.devices[k.gpu as usize] = vec![ProcessUsed { pid: c.pids[0] as i32, used: *bytes }];
        }
        vmem_node::write(&dir.join(vmem_node::DIR_NAME).join(vmem_node::FILE_NAME), &node).unwrap();
    }
    std::fs::write(cgroup.join("cgroup.controllers"), "cpu memory").unwrap();
    let cg = cgroup.join(format!("kubepods/pod{}/{}", c.uid, c.id));
    std::fs::create_dir_all(&cg).unwrap();
    let procs: String = c.pids.iter().map(|p| format!("{p}\n")).collect();
    std::fs::write(cg.join("cgroup.procs"), procs).unwrap();
}

/// A process on a GPU: pid, used MiB, sm/enc/dec percent.
#[derive(Debug, Clone)]
pub struct Proc {
    pub gpu: u32,
    pub pid: u32,
    pub used_mib: u64,
    pub sm: u32,
    pub enc: u32,
    pub dec: u32,
}

/// A mock description: `gpus` GPUs of 24 GiB, the processes and one sample each.
pub fn mock_yaml(gpus: u32, procs: &[Proc]) -> String {
    let mut y = String::from("driver: { version: 570.86.10, cudaVersion: \"12.8\" }\ngpus:\n");
    for g in 0..gpus {
        writeln!(y, "  - uuid: {}\n    name: NVIDIA L4\n    memoryMiB: 24576\n    processes:", uuid(g))
            .unwrap();
        let mine: Vec<&Proc> = procs.iter().filter(|p| p.gpu == g).collect();
        if mine.is_empty() {
            y.push_str("      []\n");
        }
        for p in mine {
            writeln!(y, "      - {{ pid: {}, usedMemoryMiB: {}, kind: compute }}", p.pid, p.used_mib)
                .unwrap();
        }
    }
    y.push_str("utilization:\n");
    if procs.is_empty() {
        y.push_str("  []\n");
    }
    for p in procs {
        writeln!(
            y,
            "  - {{ gpu: {}, pid: {}, timestampUs: 1700000000000000, smPercent: {}, encoderPercent: {}, decoderPercent: {} }}",
            p.gpu, p.pid, p.sm, p.enc, p.dec
        )
        .unwrap();
    }
    y
}

/// A scratch directory on tmpfs when there is one (`/dev/shm`), else the default temp dir.
pub fn scratch() -> tempfile::TempDir {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir()
        && let Ok(d) = tempfile::tempdir_in(&shm)
    {
        return d;
    }
    tempfile::tempdir().unwrap()
}

/// An HTTP answer.
pub struct Reply {
    pub status: u16,
    pub headers: HashMap<String, String>,
    pub body: String,
}

/// `GET path` over a new loopback connection (HTTP/1.1, `Connection: close`).
pub fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: monitor\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Reply { status, headers, body: body.to_owned() }
}

/// The value of the one series of `name` whose labels include every `labels` pair.
pub fn value(page: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<f64> = page
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse().unwrap())
        .collect();
    assert_eq!(found.len(), 1, "{name} {labels:?} in\n{page}");
    found[0]
}

/// Whether `promtool` runs here (says SKIPPED when not).
pub fn promtool_installed() -> bool {
    match std::process::Command::new("promtool").arg("--version").output() {
        Ok(out) => {
            assert!(out.status.success());
            true
        }
        Err(_) => {
            eprintln!(
                "SKIPPED: promtool is not installed (Debian package `prometheus`; .ci/run installs it)"
            );
            false
        }
    }
}

/// `promtool check metrics` accepts `page` (`what` names it in the failure).
pub fn promtool_check(page: &str, what: &str) {
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(page.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics ({what}) failed:\n{}{}\n{page}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

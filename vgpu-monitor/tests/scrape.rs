//! The collector over a node in a temp tree (library layer, real files): mock backend with process
//! samples, two containers with real `vgpu.config`, `cgroup.procs` and `vmem_node.config`, a third
//! container whose `vgpu.config` is broken, pods in memory. The page shows the expected per-container
//! numbers (memory used vs limit, core utilization capped at 100, virtual memory added only with the gate),
//! the node and device totals, and `service="vGPU"` on every series; the SM watcher file is used when
//! present and the fallback is reported when not.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod support;

use std::sync::Arc;

use support::{Claim, Container, Proc, value};
use vgpu_core::{
    abi::sm_util::{self, DeviceProcesses, ProcessInfo, SmUtil},
    backend::{ProcessUtilizationSample, mock::MockBackend},
};
use vgpu_monitor::{
    cgroup::CgroupLayout,
    collect::{MonitorConfig, NodeCollector},
    metrics,
    pods::InMemoryPods,
    server::{MonitorServer, ServerConfig},
};

const MIB: f64 = 1024.0 * 1024.0;

fn containers() -> Vec<Container> {
    vec![
        Container {
            pod: "a".into(),
            namespace: "ns".into(),
            uid: "uid-a".into(),
            name: "main".into(),
            id: "ca".into(),
            pids: vec![100, 101],
            claims: vec![
                Claim { gpu: 0, cores: 50, memory_mib: 4096 },
                Claim { gpu: 1, cores: 30, memory_mib: 2048 },
            ],
            vmem: None,
        },
        Container {
            pod: "b".into(),
            namespace: "ns".into(),
            uid: "uid-b".into(),
            name: "worker".into(),
            id: "cb".into(),
            pids: vec![200],
            claims: vec![Claim { gpu: 0, cores: 50, memory_mib: 8192 }],
            vmem: Some(vec![1 << 30]),
        },
        // Its vgpu.config is replaced by garbage below: skipped, never a panic.
        Container {
            pod: "c".into(),
            namespace: "ns".into(),
            uid: "uid-c".into(),
            name: "broken".into(),
            id: "cc".into(),
            pids: vec![300],
            claims: vec![Claim { gpu: 1, cores: 20, memory_mib: 1024 }],
            vmem: None,
        },
    ]
}

fn procs() -> Vec<Proc> {
    vec![
        Proc { gpu: 0, pid: 100, used_mib: 1024, sm: 70, enc: 20, dec: 0 }, // 70 + 0.85 × 20 = 87
        Proc { gpu: 0, pid: 101, used_mib: 512, sm: 30, enc: 0, dec: 0 },   // A on GPU 0: 117 → 100
        Proc { gpu: 1, pid: 100, used_mib: 256, sm: 10, enc: 0, dec: 10 },  // 18.5
        Proc { gpu: 0, pid: 200, used_mib: 2048, sm: 20, enc: 0, dec: 0 },
        Proc { gpu: 0, pid: 999, used_mib: 4096, sm: 5, enc: 0, dec: 0 }, // nobody's
    ]
}

struct Node {
    dir: tempfile::TempDir,
    server: Arc<MonitorServer>,
}

fn node(vmem_gate: bool, sm_gate: bool) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let (manager, cgroup) = (dir.path().join("manager"), dir.path().join("cgroup"));
    std::fs::create_dir_all(&cgroup).unwrap();
    let cs = containers();
    for c in &cs {
        support::write_files(c, &manager, &cgroup);
    }
    std::fs::write(manager.join("uid-c_broken/config/vgpu.config"), b"not a vgpu.config").unwrap();
    let backend = Arc::new(MockBackend::from_yaml_str(&support::mock_yaml(2, &procs())).unwrap());
    let mut config = MonitorConfig::new("node-1");
    config.manager_dir = manager;
    config.cgroup = CgroupLayout { root: cgroup, ..CgroupLayout::default() };
    config.vmem_tracking = vmem_gate;
    config.sm_watcher = sm_gate;
    config.settings.device_memory_scaling = 2.0;
    let pods = Arc::new(InMemoryPods::new(cs.iter().map(support::pod)));
    let collector = Arc::new(NodeCollector::new(config, backend, pods.clone()));
    let mut registry = metrics::new_registry();
    metrics::register(&mut registry, collector);
    Node { dir, server: MonitorServer::new(registry, pods, ServerConfig::default()) }
}

fn ctr(pod: &'static str, idx: &'static str) -> [(&'static str, &'static str); 3] {
    [("pod_name", pod), ("vdevice_idx", idx), ("pod_namespace", "ns")]
}

#[test]
fn per_container_numbers_from_real_files() {
    for vmem_gate in [false, true] {
        let node = node(vmem_gate, false);
        let page = node.server.render(false).unwrap();
        // A on GPU 0: 1024 + 512 MiB of 4096, cores 87 + 30 capped at 100.
        let a0 = ctr("a", "0");
        assert_eq!(value(&page, "container_vgpu_device_memory_limit_in_bytes", &a0), 4096.0 * MIB);
        assert_eq!(value(&page, "container_vgpu_device_physical_memory_usage_in_bytes", &a0), 1536.0 * MIB);
        assert_eq!(value(&page, "container_vgpu_device_memory_usage_in_bytes", &a0), 1536.0 * MIB);
        assert_eq!(value(&page, "container_vgpu_device_memory_utilization_percent", &a0), 37.5);
        assert_eq!(value(&page, "container_vgpu_device_core_utilization_percent", &a0), 100.0);
        // A's second device is GPU 1 (vdevice_idx 1): 256 MiB, 10 + 0.85 × 10.
        let a1 = ctr("a", "1");
        assert_eq!(value(&page, "container_vgpu_device_physical_memory_usage_in_bytes", &a1), 256.0 * MIB);
        assert!((value(&page, "container_vgpu_device_core_utilization_percent", &a1) - 18.5).abs() < 1e-9);
        // B: 2048 MiB physical; the ledger's 1 GiB only with the gate.
        let b0 = ctr("b", "0");
        assert_eq!(value(&page, "container_vgpu_device_physical_memory_usage_in_bytes", &b0), 2048.0 * MIB);
        let used = if vmem_gate { 3072.0 } else { 2048.0 };
        assert_eq!(value(&page, "container_vgpu_device_memory_usage_in_bytes", &b0), used * MIB);
        assert_eq!(
            value(&page, "container_vgpu_device_memory_utilization_percent", &b0),
            used / 8192.0 * 100.0
        );
        assert_eq!(value(&page, "container_vgpu_device_core_utilization_percent", &b0), 20.0);
        // The broken container has no series.
        assert!(!page.contains(r#"pod_name="c""#), "{page}");
        // Physical GPU 0: all processes (pid 999 too), 87 + 30 + 20 + 5 → 100.
        let g0 = [("device_idx", "0"), ("device_uuid", "GPU-0000")];
        assert_eq!(value(&page, "physical_gpu_device_memory_usage_in_bytes", &g0), 7680.0 * MIB);
        assert_eq!(value(&page, "physical_gpu_device_core_utilization_percent", &g0), 100.0);
        assert_eq!(value(&page, "physical_gpu_device_health_status", &g0), 1.0);
        // Assigned: GPU 0 has A's and B's claims (the broken container's pod still counts on GPU 1).
        assert_eq!(value(&page, "vgpu_device_assigned_cores_number", &g0), 100.0);
        assert_eq!(value(&page, "vgpu_device_current_shared_containers_number", &g0), 2.0);
        assert_eq!(value(&page, "vgpu_device_assigned_memory_in_bytes", &g0), 12288.0 * MIB);
        assert_eq!(value(&page, "vgpu_device_assigned_physical_memory_in_bytes", &g0), 6144.0 * MIB);
        assert_eq!(value(&page, "vgpu_device_total_memory_in_bytes", &g0), 2.0 * 24576.0 * MIB);
        assert_eq!(
            value(&page, "node_vgpu_device_assigned_memory_in_bytes", &[]),
            (12288.0 + 2048.0 + 1024.0) * MIB
        );
        assert_eq!(value(&page, "node_vgpu_device_total_physical_memory_in_bytes", &[]), 2.0 * 24576.0 * MIB);
        assert!(page.contains(
            r#"node_gpu_device_configuration_info{service="vGPU",node="node-1",device_split="10",cores_scaling="1.00",memory_scaling="2.00",memory_factor="1"} 1.0"#
        ));
        assert!(page.contains(r#"driver_version="570.86.10",cuda_version="12.8""#), "{page}");
        // Every series carries service="vGPU"; no watcher series without the gate.
        for line in page.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
            assert!(line.contains(r#"service="vGPU""#), "{line}");
        }
        assert!(!page.contains("sm_watcher_file_present"));
        drop(node.dir);
    }
}

#[test]
fn the_sm_watcher_file_is_used_when_present_and_its_absence_is_reported() {
    let node = node(false, true);
    let page = node.server.render(false).unwrap();
    assert_eq!(value(&page, "sm_watcher_file_present", &[]), 0.0);
    // Fallback: the backend's numbers.
    assert_eq!(value(&page, "container_vgpu_device_core_utilization_percent", &ctr("b", "0")), 20.0);

    // The watcher publishes other numbers: B's process at 64 % (its encoder's 150 is not a valid percentage
    // and counts nothing) and 3 GiB on GPU 0.
    let mut util = SmUtil::default();
    util.devices[0] = DeviceProcesses {
        samples: vec![ProcessUtilizationSample {
            pid: 200,
            timestamp_us: 9,
            sm_percent: 64,
            ..Default::default()
        }],
        last_seen_ts: 9,
        compute: vec![ProcessInfo { pid: 200, used_memory_bytes: Some(3 << 30), ..Default::default() }],
        graphics: vec![],
    };
    let watcher = node.dir.path().join("manager/watcher");
    std::fs::create_dir_all(&watcher).unwrap();
    sm_util::create(&watcher.join("sm_util.config"), &util).unwrap();
    let page = node.server.render(true).unwrap();
    assert_eq!(value(&page, "sm_watcher_file_present", &[]), 1.0);
    assert_eq!(value(&page, "container_vgpu_device_core_utilization_percent", &ctr("b", "0")), 64.0);
    assert_eq!(
        value(&page, "container_vgpu_device_physical_memory_usage_in_bytes", &ctr("b", "0")),
        3072.0 * MIB
    );
    assert_eq!(value(&page, "container_vgpu_device_core_utilization_percent", &ctr("a", "0")), 0.0);
    assert!(page.ends_with("# EOF\n"));
}

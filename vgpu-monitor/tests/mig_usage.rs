//! `mig_device_memory_usage_in_bytes` and `mig_device_memory_utilization_percent` (library layer, a real
//! scrape of the page through [`MonitorServer::render`]): a mock GPU in MIG mode with three instances, two
//! of which script the memory used inside them (`usedMemoryMiB`). The page has usage and utilization series
//! for those two only (the values from the mock, one instance full at 100 %), none for the instance whose
//! usage is not reported, and the families' `# HELP`/`# TYPE` lines even on a node without MIG.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod support;

use std::sync::Arc;

use vgpu_core::backend::mock::MockBackend;
use vgpu_monitor::{
    collect::{MonitorConfig, NodeCollector},
    metrics,
    pods::InMemoryPods,
    server::{MonitorServer, ServerConfig},
};

const MIB: f64 = 1024.0 * 1024.0;

const MOCK: &str = "\
gpus:
  - uuid: GPU-mig
    name: NVIDIA A100-SXM4-80GB
    memoryMiB: 81920
    mig:
      mode: Enabled
      instances:
        - { uuid: MIG-a, profile: 3g.40gb, gpuInstanceId: 1, computeInstanceId: 0, placementStart: 0, placementSize: 4, memoryMiB: 40320, usedMemoryMiB: 10080 }
        - { uuid: MIG-b, profile: 1g.10gb, gpuInstanceId: 7, computeInstanceId: 0, placementStart: 4, placementSize: 1, memoryMiB: 9856 }
        - { uuid: MIG-c, profile: 1g.10gb, gpuInstanceId: 8, computeInstanceId: 0, placementStart: 5, placementSize: 1, memoryMiB: 9856, usedMemoryMiB: 9856 }
";

fn page(mock: &str) -> String {
    let backend = Arc::new(MockBackend::from_yaml_str(mock).unwrap());
    let pods = Arc::new(InMemoryPods::default());
    let collector = NodeCollector::new(MonitorConfig::new("node-1"), backend, pods.clone());
    let mut registry = metrics::new_registry();
    metrics::register(&mut registry, Arc::new(collector));
    MonitorServer::new(registry, pods, ServerConfig::default()).render(false).unwrap()
}

fn series(page: &str, name: &str) -> usize {
    page.lines().filter(|l| l.starts_with(&format!("{name}{{"))).count()
}

#[test]
fn mig_memory_usage_comes_from_the_backend() {
    let page = page(MOCK);
    let usage = "mig_device_memory_usage_in_bytes";
    let util = "mig_device_memory_utilization_percent";
    let a = [
        ("node", "node-1"),
        ("device_idx", "0"),
        ("device_uuid", "MIG-a"),
        ("parent_uuid", "GPU-mig"),
        ("ci_id", "0"),
        ("gi_id", "1"),
        ("profile", "3g.40gb"),
    ];
    assert_eq!(support::value(&page, usage, &a), 10080.0 * MIB);
    assert_eq!(support::value(&page, util, &a), 25.0);
    let c = [("device_uuid", "MIG-c"), ("gi_id", "8"), ("profile", "1g.10gb")];
    assert_eq!(support::value(&page, usage, &c), 9856.0 * MIB);
    assert_eq!(support::value(&page, util, &c), 100.0);
    // MIG-b's usage is not reported: no series (the total still is).
    for name in [usage, util] {
        let mig_b = page.lines().filter(|l| l.starts_with(name) && l.contains(r#"device_uuid="MIG-b""#));
        assert_eq!(mig_b.count(), 0, "{name}:\n{page}");
    }
    assert_eq!((series(&page, usage), series(&page, util)), (2, 2), "{page}");
    assert_eq!(series(&page, "mig_device_total_memory_in_bytes"), 3, "{page}");
    assert!(page.lines().any(|l| l.starts_with(usage) && l.contains(r#"service="vGPU""#)), "{page}");
    if support::promtool_installed() {
        support::promtool_check(&page, "MIG usage page");
    }
}

#[test]
fn families_are_described_without_mig() {
    let page = page("gpus:\n  - { uuid: GPU-0, name: x, memoryMiB: 1024 }\n");
    for name in ["mig_device_memory_usage_in_bytes", "mig_device_memory_utilization_percent"] {
        assert!(page.contains(&format!("# TYPE {name} gauge")), "{name}:\n{page}");
        assert_eq!(series(&page, name), 0, "{page}");
    }
}

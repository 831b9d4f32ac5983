//! Node agent scan of a 16-GPU fake sysfs tree with `pci.ids` (warm page cache): the discovery plus the
//! PhysicalGPU objects, and one steady-state `scan_once` against the in-memory cluster (no writes).
//! Run with `cargo bench -p vgpu-node-agent --bench scan`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{hint::black_box, sync::Arc};

use criterion::{Criterion, criterion_group, criterion_main};
use vgpu_core::discovery::{DiscoveryConfig, discover};
use vgpu_node_agent::{
    AgentConfig, InMemoryCluster, NodeAgent, desired,
    fake_sysfs::{FakeDevice, FakeSysfs},
};

fn tree() -> (tempfile::TempDir, FakeSysfs) {
    let dir = tempfile::tempdir().unwrap();
    let sys = FakeSysfs::create(dir.path()).unwrap();
    for i in 0..16u8 {
        let device = if i % 2 == 0 { "20b0" } else { "2330" };
        sys.add(&format!("0000:{:02x}:00.0", 0x10 + i * 8), &FakeDevice::gpu("10de", device, "nvidia"))
            .unwrap();
    }
    sys.add("0000:05:00.0", &FakeDevice::nic()).unwrap();
    (dir, sys)
}

fn bench(c: &mut Criterion) {
    let (_dir, sys) = tree();
    let config =
        DiscoveryConfig::default().with_sysfs_root(sys.sysfs_root()).with_pci_ids_paths([sys.pci_ids()]);
    assert_eq!(discover(&config).unwrap().gpus.len(), 16);
    c.bench_function("node_agent/discover_16_gpus", |b| {
        b.iter(|| {
            let report = discover(black_box(&config)).unwrap();
            let objects: Vec<_> =
                report.gpus.iter().filter_map(|g| desired::gpu_object("w1", "gpu.deckhouse.io", g)).collect();
            black_box(objects)
        });
    });

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let cluster = Arc::new(InMemoryCluster::new());
    cluster.put_node("w1", Default::default());
    let mut agent_config = AgentConfig::new("w1");
    agent_config.sysfs_root = sys.sysfs_root();
    agent_config.pci_ids_paths = vec![sys.pci_ids()];
    let mut agent = NodeAgent::new(cluster, agent_config);
    assert_eq!(runtime.block_on(agent.scan_once()).unwrap().applied.len(), 16);
    c.bench_function("node_agent/scan_once_16_gpus_steady", |b| {
        b.iter(|| {
            let outcome = runtime.block_on(agent.scan_once()).unwrap();
            assert!(outcome.applied.is_empty());
            black_box(outcome)
        });
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);

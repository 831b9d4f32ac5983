//! One scrape of a node with 100 containers × 8 GPUs (files on tmpfs when `/dev/shm` exists, mock
//! backend with one process and one sample per container and GPU): `NodeCollector::gather` plus the
//! Prometheus text encoding, as `/metrics` does it, with `VirtualMemoryTracking` off and on. Prints the
//! page size and the heap allocations of one scrape once (counted by `stats_alloc`'s instrumented system
//! allocator, which this bench installs as its global allocator).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::{alloc::System, hint::black_box, sync::Arc};

use criterion::{Criterion, criterion_group, criterion_main};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use support::{Claim, Container, Proc};
use vgpu_core::backend::mock::MockBackend;
use vgpu_monitor::{
    cgroup::CgroupLayout,
    collect::{MonitorConfig, NodeCollector},
    metrics,
    pods::InMemoryPods,
    server::{MonitorServer, ServerConfig},
};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const GPUS: u32 = 8;
const CONTAINERS: u32 = 100;

fn node(vmem: bool) -> (tempfile::TempDir, Arc<NodeCollector>, Arc<MonitorServer>) {
    let dir = support::scratch();
    let (manager, cgroup) = (dir.path().join("manager"), dir.path().join("cgroup"));
    std::fs::create_dir_all(&cgroup).unwrap();
    let mut procs = Vec::new();
    let mut pods = Vec::new();
    for i in 0..CONTAINERS {
        let pid = 10_000 + i;
        let c = Container {
            pod: format!("pod-{i}"),
            namespace: "bench".into(),
            uid: format!("uid-{i}"),
            name: "main".into(),
            id: format!("ctr{i}"),
            pids: vec![pid],
            claims: (0..GPUS).map(|gpu| Claim { gpu, cores: 10, memory_mib: 2048 }).collect(),
            vmem: vmem.then(|| vec![1 << 20; GPUS as usize]),
        };
        for gpu in 0..GPUS {
            procs.push(Proc { gpu, pid, used_mib: 100, sm: 5, enc: 0, dec: 0 });
        }
        support::write_files(&c, &manager, &cgroup);
        pods.push(support::pod(&c));
    }
    let backend = Arc::new(MockBackend::from_yaml_str(&support::mock_yaml(GPUS, &procs)).unwrap());
    let mut config = MonitorConfig::new("node-1");
    config.manager_dir = manager;
    config.cgroup = CgroupLayout { root: cgroup, ..CgroupLayout::default() };
    config.vmem_tracking = vmem;
    let pods = Arc::new(InMemoryPods::new(pods));
    let collector = Arc::new(NodeCollector::new(config, backend, pods.clone()));
    let mut registry = metrics::new_registry();
    metrics::register(&mut registry, Arc::clone(&collector));
    (dir, collector, MonitorServer::new(registry, pods, ServerConfig::default()))
}

fn scrape(c: &mut Criterion) {
    for vmem in [false, true] {
        let (_dir, collector, server) = node(vmem);
        let page = server.render(false).unwrap();
        assert_eq!(
            page.matches("container_vgpu_device_memory_limit_in_bytes{").count(),
            (CONTAINERS * GPUS) as usize
        );
        let region = Region::new(GLOBAL);
        black_box(server.render(false).unwrap());
        let allocs = region.change();
        eprintln!(
            "monitor scrape (vmem={vmem}): {} bytes Prometheus text, {} bytes OpenMetrics, {} lines; one scrape: {} allocations, {} reallocations, {} bytes allocated",
            page.len(),
            server.render(true).unwrap().len(),
            page.lines().count(),
            allocs.allocations,
            allocs.reallocations,
            allocs.bytes_allocated,
        );
        if !vmem {
            c.bench_function("gather_100x8", |b| b.iter(|| black_box(collector.gather())));
            let snap = collector.gather();
            c.bench_function("encode_100x8", |b| {
                b.iter(|| {
                    let mut out = String::new();
                    let mut reg = metrics::new_registry();
                    reg.register_collector(Box::new(Fixed(snap.clone())));
                    prometheus_client::encoding::prometheus_text::encode(&mut out, &reg).unwrap();
                    black_box(out)
                })
            });
        }
        let name = if vmem { "scrape_100x8_vmem" } else { "scrape_100x8" };
        c.bench_function(name, |b| b.iter(|| black_box(server.render(false).unwrap())));
    }
}

/// The `vgpu.config` files of the 100 containers, read the two ways: `std::fs::read` each time
/// (`vgpu_config::read`) against mappings kept between scrapes (`MappedFiles`).
fn readers(c: &mut Criterion) {
    let (dir, _collector, _server) = node(false);
    let paths: Vec<_> = (0..CONTAINERS)
        .map(|i| dir.path().join(format!("manager/uid-{i}_main/config/vgpu.config")))
        .collect();
    let mut group = c.benchmark_group("vgpu_config_100");
    group.bench_function("read", |b| {
        b.iter(|| {
            for p in &paths {
                black_box(vgpu_core::abi::vgpu_config::read(p).unwrap());
            }
        })
    });
    let mut maps = vgpu_monitor::mapped::MappedFiles::new();
    group.bench_function("mapped", |b| {
        b.iter(|| {
            for p in &paths {
                black_box(maps.vgpu_config(p).unwrap());
            }
            maps.retain_read();
        })
    });
    group.finish();
}

/// A collector that encodes a fixed snapshot (the encoding's share of a scrape).
#[derive(Debug)]
struct Fixed(vgpu_monitor::collect::Snapshot);

impl prometheus_client::collector::Collector for Fixed {
    fn encode(&self, e: prometheus_client::encoding::DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        self.0.encode(e)
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = scrape, readers
}
criterion_main!(benches);

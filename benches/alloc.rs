#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Per-node allocation of a 4-container pod (2 vGPUs each) on an 8-GPU DGX-1 (Volta) node with half the cards
//! busy, in each placement mode; and a node's topology fitness for needs 0..=16, which the scheduler cache
//! computes once per node and mode (`table/<mode>`), next to one `topology_fitness` call per need
//! (`per_need/<mode>`, requests prebuilt: what the cache did before, less building the 17 requests).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use vgpu_core::{
    alloc::{
        NodeLinks, NodeUsage, NodeView, PodContainer, PodFootprint, PodRequest, PodSpec, allocate,
        topology_fitness, topology_fitness_table,
    },
    codec::pod_devices,
    domain::ResourceDomain,
    model::{NodeDeviceInventory, NodeVgpuConfig, TopologyMode},
};

const DGX1_VOLTA: &str = include_str!("../vgpu-core/tests/fixtures/topology/dgx1-volta.json");

fn node() -> (NodeDeviceInventory, NodeVgpuConfig, NodeLinks, NodeUsage) {
    let inventory = NodeDeviceInventory::uniform(8, 32768, 10)
        .with_type_name("Tesla V100-SXM2-32GB")
        .with_uuids(|i| format!("GPU-{i:08}"));
    let links = NodeLinks::decode(DGX1_VOLTA).unwrap_or_else(|e| panic!("fixture: {e}"));
    let mut usage = NodeUsage::new();
    let busy = pod_devices::decode_pre_allocated(
        "a[0_GPU-00000000_50_16384,2_GPU-00000002_50_16384,4_GPU-00000004_50_16384,6_GPU-00000006_50_16384]",
    )
    .unwrap_or_else(|e| panic!("claim: {e}"));
    usage.insert_pod("busy", PodFootprint::from_claim(&busy));
    (inventory, NodeVgpuConfig::default(), links, usage)
}

fn request(mode: &str, policy: &str) -> PodRequest {
    let d = ResourceDomain::default();
    let mut pod = PodSpec::new()
        .annotation(d.device_topology_mode(), mode)
        .annotation(d.device_scheduler_policy(), policy);
    for c in 0..4 {
        pod = pod.container(
            PodContainer::app(format!("c{c}"))
                .limit(d.vgpu_number(), 2)
                .limit(d.vgpu_cores(), 10)
                .limit(d.vgpu_memory(), 2048),
        );
    }
    PodRequest::from_pod(&pod, &d).unwrap_or_else(|e| panic!("request: {e}"))
}

fn bench(c: &mut Criterion) {
    let (inventory, config, links, usage) = node();
    let view =
        NodeView { name: "dgx1", inventory: &inventory, config: &config, links: Some(&links), usage: &usage };
    let mut group = c.benchmark_group("alloc_4x2_on_8gpu_half_busy");
    for (name, mode, policy) in [
        ("none", "none", "none"),
        ("binpack", "none", "binpack"),
        ("spread", "none", "spread"),
        ("numa", "numa", "binpack"),
        ("link", "link", "binpack"),
    ] {
        let req = request(mode, policy);
        if let Err(e) = allocate(&req, &view) {
            panic!("{name}: {e}");
        }
        group.bench_function(name, |b| b.iter(|| allocate(black_box(&req), black_box(&view))));
    }
    group.finish();

    let empty = NodeUsage::new();
    let view = NodeView { usage: &empty, ..view };
    let d = ResourceDomain::default();
    let mut group = c.benchmark_group("fitness_needs_0_to_16_on_8gpu");
    for (name, mode) in [("link", TopologyMode::Link), ("numa", TopologyMode::Numa)] {
        let requests: Vec<PodRequest> = (0..17usize)
            .map(|n| {
                let pod = PodSpec::new()
                    .annotation(d.device_topology_mode(), mode.as_str())
                    .container(PodContainer::app("m").limit(d.vgpu_number(), n.max(1)));
                PodRequest::from_pod(&pod, &d).unwrap_or_else(|e| panic!("request: {e}"))
            })
            .collect();
        let table = topology_fitness_table::<17>(mode, &view);
        let per_need: Vec<Option<u8>> = requests.iter().map(|r| topology_fitness(r, &view)).collect();
        assert_eq!(table.map(|t| t.map(Some).to_vec()), Some(per_need), "{name}");
        group.bench_function(format!("table/{name}"), |b| {
            b.iter(|| topology_fitness_table::<17>(black_box(mode), black_box(&view)))
        });
        group.bench_function(format!("per_need/{name}"), |b| {
            b.iter(|| {
                requests.iter().map(|r| topology_fitness(black_box(r), black_box(&view))).collect::<Vec<_>>()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! Controller reconcile of 1,000 PhysicalGPUs (125 nodes × 8 GPUs, two models, 2,000 allocated claims) after a
//! GPUClass change: the pure plan (desired DeviceClasses and statuses of 8 classes, occupancy of every GPU,
//! compared with the current state) and one whole pass against the in-memory cluster, writes included.
//! Goal: ≤ 1 s per pass. Run with `cargo bench -p vgpu-controller --bench reconcile`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use vgpu_controller::cluster::{ControllerCluster, InMemoryCluster, Snapshot};
use vgpu_controller::config::ControllerConfig;
use vgpu_controller::metrics::Metrics;
use vgpu_controller::reconcile::{Reconciler, plan};
use vgpu_controller::{desired, fixture};

const NODES: u32 = 125;
const PER_NODE: u32 = 8;

fn cluster() -> InMemoryCluster {
    let cluster = InMemoryCluster::new();
    for n in 0..NODES {
        let node = format!("w{n}");
        let model = if n % 2 == 0 { "a100-sxm4-40gb" } else { "h100-sxm5-80gb" };
        for i in 0..PER_NODE {
            cluster.put_gpu(fixture::gpu(&node, i, "nvidia", model, Some(40960)));
            for k in 0..2 {
                cluster.put_claim(fixture::allocated_claim(
                    "ml",
                    &format!("{node}-{i}-{k}"),
                    &[("manager.nvidia.com", &node, &format!("vgpu-{i}"))],
                ));
            }
        }
    }
    for (i, model) in ["a100-sxm4-40gb", "h100-sxm5-80gb"].iter().enumerate() {
        for shares in [2, 4, 8, 16] {
            cluster.put_class(fixture::class(&format!("c{i}-{shares}"), "nvidia", Some(model), Some(shares)));
        }
    }
    cluster
}

fn bench(c: &mut Criterion) {
    let config = ControllerConfig::default();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let cluster = Arc::new(cluster());
    let reconciler = Reconciler::new(config.clone(), cluster.clone(), Metrics::default());
    // Settle: the first pass writes everything.
    rt.block_on(reconciler.reconcile_once()).unwrap();
    let settled: Snapshot = rt.block_on(cluster.snapshot()).unwrap();
    assert_eq!(settled.gpus.len(), 1000);
    assert_eq!(plan(&config, &settled).writes(), 0);

    // The change: one class's share count changes, so its status and the occupancy of its 504 GPUs (63 nodes × 8) change.
    let mut changed = settled.clone();
    let class = changed.classes.iter_mut().find(|c| c.metadata.name.as_deref() == Some("c0-16")).unwrap();
    class.spec.sharing.shares = Some(32);
    class.metadata.generation = Some(2);
    let p = plan(&config, &changed);
    assert_eq!((p.class_statuses.len(), p.gpu_statuses.len()), (1, 504));

    let mut g = c.benchmark_group("reconcile_1000_gpus");
    g.bench_function("desired_classes", |b| {
        b.iter(|| {
            desired::desired_classes(&config, black_box(&changed.classes), &changed.gpus, &changed.nodes)
        })
    });
    g.bench_function("plan_after_class_change", |b| b.iter(|| plan(&config, black_box(&changed))));
    g.bench_function("pass_after_class_change", |b| {
        b.iter_batched(
            || {
                let cluster = Arc::new(InMemoryCluster::new());
                for class in &changed.classes {
                    cluster.put_class(class.clone());
                }
                for gpu in &settled.gpus {
                    cluster.put_gpu(gpu.clone());
                }
                for claim in &settled.claims {
                    cluster.put_claim(claim.clone());
                }
                Reconciler::new(config.clone(), cluster, Metrics::default())
            },
            |r| {
                let report = rt.block_on(r.reconcile_once()).unwrap();
                assert!(report.failures.is_empty());
                report
            },
            criterion::BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench
}
criterion_main!(benches);

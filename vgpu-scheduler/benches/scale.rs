#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The extender at cluster scale (issue #22 item 2): 50,000 nodes x 8 GPUs with 200,000 placed pods when
//! `VGPU_BENCH_50K=1` (setup takes a minute or more on a small machine), else 5,000 x 8 with 20,000.
//! `VGPU_BENCH_50K=1 cargo bench -p vgpu-scheduler --bench scale`. The filter makes no heap allocation per
//! candidate (names in one buffer, [`vgpu_scheduler::CandidateNames`]), so it runs about as fast with glibc's
//! default allocator as with `GLIBC_TUNABLES=glibc.malloc.mxfast=0` (fastbins off; when each name
//! was a `String`, freeing them spent up to half a 50,000-name call in fastbin consolidation).
//!
//! Printed once before the timed benches (one run each, wall clock):
//! - `cache bytes/node`, `cache bytes/pod`: heap the cache keeps per node and per placed pod, counted by
//!   `stats_alloc`'s instrumented system allocator (net bytes of a `Region` around the inserts; the nodes'
//!   light API objects are built before the region and not counted, the pods' copies move into the cache and
//!   are, shown separately).
//! - `initial sync`: `ClusterCache::load` of every node and pod (what the extender does after its lists).
//! - `watch ingest`: pod events per second through `ClusterCache::apply` (a newer version of every placed pod).
//!
//! Criterion (`filter_<N>x8/…`): one live filter, request body to answer as the HTTP handler runs it
//! (`ExtenderArgs` JSON with the candidate names → `Extender::filter` → `ExtenderFilterResult::to_json`, the
//! bytes of `serde_json::to_vec`, written faster), over 5,000 candidates and over every node; and (`watch_<N>x8/…`) 10,000 pod events through the cache.

use std::alloc::System;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use vgpu_core::clock::ManualClock;
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{NodeDeviceInventory, NodeVgpuConfig};
use vgpu_scheduler::fixture::{vgpu_node, vgpu_pod};
use vgpu_scheduler::wire::{ExtenderArgs, ExtenderFilterResult};
use vgpu_scheduler::{
    ClusterCache, Extender, ExtenderConfig, MemoryCluster, Node, Pod, PodPhase, WatchEvent, convert,
};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const PODS_PER_NODE: usize = 4;
const NOW: i64 = 1_700_000_000_000_000_000;
const GRACE: i64 = vgpu_scheduler::extender::DEFAULT_STUCK_GRACE_NS;

fn node_count() -> usize {
    if std::env::var_os("VGPU_BENCH_50K").is_some_and(|v| v == "1") { 50_000 } else { 5_000 }
}

fn inventory(n: usize) -> NodeDeviceInventory {
    NodeDeviceInventory::uniform(8, 81559, 10)
        .with_type_name("NVIDIA H100 80GB HBM3")
        .with_uuids(|i| format!("GPU-{n:05}-{i}"))
}

/// The API objects: `nodes` vGPU nodes and 4 bound pods per node (1 vGPU of 25 cores and 8 GiB each).
fn objects(nodes: usize, d: &ResourceDomain) -> (Vec<Node>, Vec<Pod>) {
    let names: Vec<String> = (0..nodes).map(|n| format!("node-{n:05}")).collect();
    let nodes_v: Vec<Node> = names
        .iter()
        .enumerate()
        .map(|(n, name)| vgpu_node(name, &inventory(n), &NodeVgpuConfig::default(), None, d).unwrap())
        .collect();
    let pods = (0..nodes * PODS_PER_NODE)
        .map(|p| {
            let (n, k) = (p % nodes, p / nodes);
            let mut pod = vgpu_pod(&format!("placed-{p}"), 1, 25, 8192, &[], d);
            pod.node_name = Some(names[n].clone());
            pod.phase = PodPhase::Running;
            pod.resource_version = 1;
            pod.annotations.insert(d.pre_allocated(), format!("main[{k}_GPU-{n:05}-{k}_25_8192]"));
            pod.annotations.insert(d.predicate_node(), names[n].clone());
            pod
        })
        .collect();
    (nodes_v, pods)
}

fn net(region: &Region<'_, System>) -> i64 {
    let s = region.change();
    s.bytes_allocated as i64 - s.bytes_deallocated as i64
}

fn bench(c: &mut Criterion) {
    let d = ResourceDomain::default();
    let n = node_count();
    let (nodes, pods) = objects(n, &d);
    let names: Vec<String> = nodes.iter().map(|x| x.name.clone()).collect();

    // Memory: nodes alone, then pods, net heap bytes kept by the cache.
    let cache = ClusterCache::new(d.clone(), GRACE);
    let region = Region::new(GLOBAL);
    for node in &nodes {
        cache.upsert_node(node);
    }
    let node_bytes = net(&region);
    let region = Region::new(GLOBAL);
    for pod in &pods {
        cache.upsert_pod(pod.clone(), NOW);
    }
    let pod_bytes = net(&region);
    let light_pod = {
        let region = Region::new(GLOBAL);
        let copy = Box::new(pods[0].clone());
        let bytes = net(&region);
        drop(copy);
        bytes
    };
    println!(
        "scale {n} nodes x 8 GPUs, {} pods: cache bytes/node {} (nodes only), cache bytes/pod {} (of which {} the pod's own light copy)",
        pods.len(),
        node_bytes / n as i64,
        pod_bytes / pods.len() as i64,
        light_pod
    );
    drop(cache);

    // Initial sync: load of every node and pod.
    let cache = ClusterCache::new(d.clone(), GRACE);
    let (nodes2, pods2) = (nodes.clone(), pods.clone());
    let t = Instant::now();
    cache.load(nodes2, pods2, NOW);
    let sync = t.elapsed();
    println!("scale initial sync: {n} nodes + {} pods in {:.2} s", pods.len(), sync.as_secs_f64());

    // Watch ingest: a newer version of every placed pod.
    let events: Vec<WatchEvent> = pods
        .iter()
        .map(|p| {
            let mut p = p.clone();
            p.resource_version = 2;
            WatchEvent::PodUpserted(p)
        })
        .collect();
    let t = Instant::now();
    for e in &events {
        cache.apply(e, NOW);
    }
    let took = t.elapsed();
    println!(
        "scale watch ingest: {} pod events in {:.2} s, {:.0} events/s",
        events.len(),
        took.as_secs_f64(),
        events.len() as f64 / took.as_secs_f64()
    );
    drop(events);
    drop(cache);

    // Filter: an extender over the same cluster, request body to answer.
    let cluster = MemoryCluster::new().without_event_log();
    let ext = Extender::new(
        cluster,
        Arc::new(ManualClock::new(NOW)),
        ExtenderConfig { emit_events: false, serialize_filter: false, ..ExtenderConfig::default() },
    );
    ext.cache().load(nodes, pods, NOW);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let ann = vec![
        (d.node_scheduler_policy(), "binpack".to_string()),
        (d.device_scheduler_policy(), "binpack".to_string()),
    ];
    let probe = vgpu_pod("probe", 2, 50, 16384, &ann, &d);
    let reset = || {
        ext.cache().delete_pod(&probe.uid);
        ext.cluster().upsert_pod(probe.clone());
    };
    let mut group = c.benchmark_group(format!("filter_{n}x8"));
    group.sample_size(10);
    let subsets: Vec<(String, &[String])> = vec![
        ("json_5000_candidates".to_owned(), &names[..names.len().min(5000)]),
        (format!("json_all_{n}"), &names[..]),
    ];
    for (label, candidates) in subsets {
        let body = serde_json::to_vec(&serde_json::json!({
            "Pod": {
                "metadata": {"name": probe.name, "namespace": probe.namespace, "uid": probe.uid, "annotations": probe.annotations},
                "spec": {"containers": [{"name": "main", "resources": {"limits": {
                    d.vgpu_number(): "2", d.vgpu_cores(): "50", d.vgpu_memory(): "16384"
                }}}]}
            },
            "NodeNames": candidates,
        }))
        .unwrap();
        reset();
        let first = rt.block_on(ext.filter(Some(&probe), candidates));
        assert_eq!(first.node_names().len(), 1, "{label}: {:?}", first.error);
        assert_eq!(first.failed_nodes().len(), candidates.len() - 1, "{label}");
        let answer =
            ExtenderFilterResult::from_result(&serde_json::from_slice::<ExtenderArgs>(&body).unwrap(), first);
        assert_eq!(answer.to_json().unwrap(), serde_json::to_vec(&answer).unwrap(), "{label}");
        group.bench_function(label, |b| {
            b.iter_batched(
                reset,
                |()| {
                    let mut args: ExtenderArgs = serde_json::from_slice(&body).unwrap();
                    let names = args.take_candidate_names().unwrap();
                    let pod = args.pod.as_ref().map(convert::pod_from_k8s);
                    let result = rt.block_on(ext.filter(pod.as_ref(), names));
                    black_box(ExtenderFilterResult::from_result(&args, result).to_json().unwrap())
                },
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();

    // Ingest in batches of 10,000 events (resource versions rising, so none is ignored as stale).
    let mut group = c.benchmark_group(format!("watch_{n}x8"));
    group.sample_size(10);
    let sample: Vec<Pod> = ext
        .cache()
        .pods()
        .iter()
        .filter(|p| p.uid != probe.uid)
        .take(10_000)
        .map(|p| (**p).clone())
        .collect();
    let mut version = 10u64;
    group.bench_function("ingest_10k_pod_events", |b| {
        b.iter_batched(
            || {
                version += 1;
                sample
                    .iter()
                    .map(|p| {
                        let mut p = p.clone();
                        p.resource_version = version;
                        WatchEvent::PodUpserted(p)
                    })
                    .collect::<Vec<_>>()
            },
            |events| {
                for e in &events {
                    ext.cache().apply(e, NOW);
                }
                events
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

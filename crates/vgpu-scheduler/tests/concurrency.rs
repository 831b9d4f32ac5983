#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! 64 concurrent filter+bind streams at 50 nodes never over-commit a GPU, with and without serialization.

use std::collections::BTreeMap;
use std::sync::Arc;

use vgpu_core::codec::pod_devices;
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{GpuDevice, NodeDeviceInventory, NodeVgpuConfig};
use vgpu_scheduler::fixture::{vgpu_node, vgpu_pod};
use vgpu_scheduler::{Extender, ExtenderConfig, ManualClock, MemoryCluster};

const STREAMS: usize = 64;
const PODS_PER_STREAM: usize = 12;
const NODES: usize = 50;

fn run(serialize: bool) {
    let d = ResourceDomain::default();
    let cluster = MemoryCluster::new().without_event_log();
    let inv = NodeDeviceInventory::new(
        (0..4u32)
            .map(|i| GpuDevice {
                index: i,
                uuid: format!("GPU-{i}"),
                memory_mib: 24576,
                cores: 100,
                split_count: 3,
                numa_node: Some(i / 2),
                ..Default::default()
            })
            .collect(),
    );
    let names: Arc<Vec<String>> = Arc::new((0..NODES).map(|i| format!("n{i}")).collect());
    for n in names.iter() {
        cluster.upsert_node(vgpu_node(n, &inv, &NodeVgpuConfig::default(), None, &d).unwrap());
    }
    let config = ExtenderConfig {
        serialize_filter: serialize,
        serialize_bind: serialize,
        emit_events: false,
        ..ExtenderConfig::default()
    };
    let ext = Arc::new(Extender::new(cluster.clone(), Arc::new(ManualClock::new(1_000_000_000_000)), config));
    ext.attach();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).build().unwrap();
    rt.block_on(async {
        ext.sync().await.unwrap();
        let mut tasks = Vec::new();
        for s in 0..STREAMS {
            let (ext, names, cluster, d) = (ext.clone(), names.clone(), cluster.clone(), d.clone());
            tasks.push(tokio::spawn(async move {
                let mut placed = 0;
                for i in 0..PODS_PER_STREAM {
                    let k = s * 31 + i * 7;
                    let ann =
                        vec![(d.node_scheduler_policy(), ["binpack", "spread", "none"][k % 3].to_string())];
                    let pod = vgpu_pod(
                        &format!("s{s}-{i}"),
                        1 + (k % 3) as u32,
                        [30, 50, 70][k % 3],
                        [4096, 8192, 0][(k / 3) % 3],
                        &ann,
                        &d,
                    );
                    let pod = cluster.upsert_pod(pod);
                    let r = ext.filter(Some(&pod), &names).await;
                    if let Some(node) = r.node_names.first() {
                        tokio::task::yield_now().await;
                        if ext.bind(&pod.namespace, &pod.name, &pod.uid, node).await.error.is_empty() {
                            placed += 1;
                        }
                    }
                }
                placed
            }));
        }
        let mut placed = 0;
        for t in tasks {
            placed += t.await.unwrap();
        }
        assert!(placed > 0);
    });
    // Ground truth from the cluster.
    let mut used: BTreeMap<(String, u32), (u32, u64, u64)> = BTreeMap::new();
    for p in cluster.pods() {
        let (Some(node), Some(v)) = (&p.node_name, p.annotations.get(&d.pre_allocated())) else { continue };
        for c in pod_devices::decode_pre_allocated(v).unwrap().devices() {
            let e = used.entry((node.clone(), c.index)).or_default();
            *e = (e.0 + 1, e.1 + c.cores, e.2 + c.memory_mib);
        }
    }
    assert!(!used.is_empty());
    for ((node, gpu), (n, c, m)) in &used {
        let g = inv.get(*gpu).unwrap();
        assert!(*n <= g.split_count && *c <= g.cores && *m <= g.memory_mib, "{node}/{gpu}: {n} {c} {m}");
    }
    // The cache agrees with the cluster and holds no leftover reservation.
    assert_eq!(ext.cache().reservation_count(), 0);
    for (node, _, usage) in ext.cache().usage_snapshot() {
        for gpu in 0..4 {
            let u = usage.device(gpu);
            let t = used.get(&(node.clone(), gpu)).copied().unwrap_or_default();
            assert_eq!((u.number, u.cores, u.memory_mib), t, "{node}/{gpu}");
        }
    }
}

#[test]
fn concurrent_streams_serialized() {
    run(true);
}

#[test]
fn concurrent_streams_unserialized() {
    run(false);
}

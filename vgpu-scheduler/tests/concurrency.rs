#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! 64 concurrent filter+bind streams at 50 nodes never over-commit a GPU, with and without serialization.

mod common;

use std::sync::Arc;

use vgpu_core::clock::ManualClock;
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{NodeDeviceInventory, NodeVgpuConfig};
use vgpu_scheduler::fixture::{vgpu_node, vgpu_pod};
use vgpu_scheduler::{Extender, ExtenderConfig, MemoryCluster};

const STREAMS: usize = 64;
const PODS_PER_STREAM: usize = 12;
const NODES: usize = 50;

fn run(serialize: bool) {
    let d = ResourceDomain::default();
    let cluster = MemoryCluster::new().without_event_log();
    let inv = NodeDeviceInventory::uniform(4, 24576, 3);
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
                    let r = ext.filter(Some(&pod), names.to_vec()).await;
                    if let Some(node) = r.passed().next() {
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
    common::assert_no_overcommit(&cluster, &ext, &inv, &d);
}

#[test]
fn concurrent_streams_serialized() {
    run(true);
}

#[test]
fn concurrent_streams_unserialized() {
    run(false);
}

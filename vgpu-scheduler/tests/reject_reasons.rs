#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The live filter's shortcuts give the answers of a full evaluation, at the extender level: nodes rejected
//! from their rank-table row (size gates) or by `quick_reject` under their lock (first container's GPU filter,
//! `numa-strict`) carry the reason a placement attempt gives, and the filter picks a node exactly when one
//! fits. Checked against the side-effect-free dry-run filter, which evaluates every node with a full
//! placement, on random clusters filled by earlier filter + bind rounds.

use std::sync::Arc;

use proptest::prelude::*;
use vgpu_core::clock::ManualClock;
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{DeviceHealth, GpuDevice, NodeDeviceInventory, NodeVgpuConfig};
use vgpu_scheduler::fixture::{vgpu_node, vgpu_pod};
use vgpu_scheduler::{Extender, ExtenderConfig, MemoryCluster, Pod};

const T0: i64 = 1_700_000_000_000_000_000;

/// A GPU: split, GiB, NUMA node, healthy.
type Gpu = (u32, u64, Option<u32>, bool);

/// A pod: vGPUs, cores, MiB, topology mode index, memory policy.
type Shape = (u32, u32, u64, usize, bool);

fn gpu() -> impl Strategy<Value = Gpu> {
    (1u32..=4, 2u64..=8, prop::option::of(0u32..2), prop::bool::weighted(0.9))
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        1u32..=3,
        prop::sample::select(vec![0u32, 10, 30, 50, 100]),
        prop::sample::select(vec![0u64, 1024, 2048, 4096, 8192]),
        0usize..4,
        prop::bool::weighted(0.1),
    )
}

fn inventory(gpus: &[Gpu]) -> NodeDeviceInventory {
    NodeDeviceInventory::new(
        gpus.iter()
            .enumerate()
            .map(|(i, &(split, gib, numa, healthy))| GpuDevice {
                index: i as u32,
                uuid: format!("GPU-{i}"),
                type_name: "A100".into(),
                memory_mib: gib * 1024,
                cores: 100,
                split_count: split,
                numa_node: numa,
                health: DeviceHealth::from_bool(healthy),
                ..Default::default()
            })
            .collect(),
    )
}

fn pod(d: &ResourceDomain, uid: &str, (n, cores, mem, mode, policy): Shape) -> Pod {
    let modes = ["none", "numa", "numa-strict", "link"];
    let mut ann = vec![(d.device_topology_mode(), modes[mode].to_owned())];
    if policy {
        ann.push((d.memory_scheduler_policy(), "virtual".to_owned()));
    }
    vgpu_pod(uid, n, cores, mem, &ann, d)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn live_filter_rejects_with_the_full_evaluation_reasons(
        nodes in prop::collection::vec(prop::collection::vec(gpu(), 1..=4), 1..=5),
        fill in prop::collection::vec(shape(), 0..12),
        probes in prop::collection::vec(shape(), 1..=4),
    ) {
        let d = ResourceDomain::default();
        let cluster = MemoryCluster::new().without_event_log();
        let names: Vec<String> = (0..nodes.len()).map(|i| format!("n{i}")).collect();
        for (name, gpus) in names.iter().zip(&nodes) {
            cluster.upsert_node(vgpu_node(name, &inventory(gpus), &NodeVgpuConfig::default(), None, &d).unwrap());
        }
        let ext = Extender::new(cluster.clone(), Arc::new(ManualClock::new(T0)), ExtenderConfig::default());
        ext.attach();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(ext.sync()).unwrap();
        // Fill: each pod that fits is bound where the filter put it.
        for (i, s) in fill.iter().enumerate() {
            let p = cluster.upsert_pod(pod(&d, &format!("fill-{i}"), *s));
            let r = rt.block_on(ext.filter(Some(&p), names.clone()));
            if let Some(node) = r.node_names().first().map(|n| (*n).to_owned()) {
                prop_assert_eq!(rt.block_on(ext.bind(&p.namespace, &p.name, &p.uid, &node)).error, "");
            }
        }
        for (i, s) in probes.iter().enumerate() {
            let p = cluster.upsert_pod(pod(&d, &format!("probe-{i}"), *s));
            let full = ext.filter_dry_run(Some(&p), names.clone());
            let live = rt.block_on(ext.filter(Some(&p), names.clone()));
            prop_assert_eq!(&live.error, &full.error);
            let fits = full.node_names();
            match live.node_names().first() {
                Some(chosen) => prop_assert!(fits.contains(chosen), "chose {} of {:?}", chosen, fits),
                None => prop_assert!(fits.is_empty(), "no node chosen, but {:?} fit", fits),
            }
            for f in live.failed_nodes().filter(|f| f.reason != "pod already scheduled to another node") {
                let detailed = full.failure(f.node).unwrap_or_default();
                prop_assert!(
                    detailed.starts_with(f.reason),
                    "{}: live {:?}, full evaluation {:?} (probe {:?})", f.node, f.reason, detailed, s
                );
            }
            // Later probes see this one placed.
            if let Some(node) = live.node_names().first().map(|n| (*n).to_owned()) {
                prop_assert_eq!(rt.block_on(ext.bind(&p.namespace, &p.name, &p.uid, &node)).error, "");
            }
        }
    }
}

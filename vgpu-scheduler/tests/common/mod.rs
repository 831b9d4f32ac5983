//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;

use vgpu_core::clock::ManualClock;
use vgpu_core::codec::pod_devices;
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::NodeDeviceInventory;
use vgpu_scheduler::{Extender, MemoryCluster};

/// Per (node, GPU index): (vGPUs, cores, memory MiB) used by bound pods, from their `pre-allocated`.
pub type Usage = BTreeMap<(String, u32), (u32, u64, u64)>;

/// Checks that no GPU of any node is over-committed by the bound pods of `cluster` (every node has
/// `inventory`), that the extender's cache agrees with the cluster and holds no leftover reservation.
/// Returns the usage, which is never empty.
pub fn assert_no_overcommit(
    cluster: &MemoryCluster,
    ext: &Extender<MemoryCluster, ManualClock>,
    inv: &NodeDeviceInventory,
    d: &ResourceDomain,
) -> Usage {
    // Ground truth from the cluster.
    let mut used: Usage = BTreeMap::new();
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
        for gpu in inv.schedulable().map(|g| g.index) {
            let u = usage.device(gpu);
            let t = used.get(&(node.clone(), gpu)).copied().unwrap_or_default();
            assert_eq!((u.number, u.cores, u.memory_mib), t, "{node}/{gpu}");
        }
    }
    used
}

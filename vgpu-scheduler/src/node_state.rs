//! One node's mutable state in the cluster cache ([`NodeState`], shared as a [`NodeSlot`]): its decoded
//! annotations, GPU usage, reservations and its rank-table row.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use vgpu_core::alloc::{GateInputs, GpuFree, NodeFailure, NodeUsage, NodeView, PodFootprint, gate_inputs};
use vgpu_core::model::TopologyMode;

use crate::decoded::{DecodedNode, FITNESS_LEN};
use crate::rank_table::RowRef;

/// One node's mutable state, behind its own lock.
#[derive(Debug)]
pub struct NodeState {
    /// Node name.
    pub name: String,
    /// Decoded annotations, or why the node cannot take vGPU pods.
    pub decoded: Result<Arc<DecodedNode>, NodeFailure>,
    /// Fingerprint of what the decoded state depends on (`ClusterCache::decode_inputs`): the annotation
    /// texts are not kept (about 1.3 KiB per 8-GPU node), only a 128-bit randomly seeded hash of them.
    pub(crate) inputs: u128,
    /// GPU usage by counted pods and reservations (keyed by pod UID).
    pub usage: NodeUsage,
    /// This node's row of the cache's rank table, republished on every change of usage or annotations.
    pub(crate) row: RowRef,
    /// In-flight reservations: pod UID → expiry (Unix ns). A B-tree: empty on most nodes, and an empty one
    /// takes 24 bytes and no allocation.
    pub reserved: BTreeMap<String, i64>,
    /// Pods counted here (UIDs), reservations excluded.
    pub pods: BTreeSet<String>,
}

impl NodeState {
    pub(crate) fn recompute(&mut self) {
        let gates = match &self.decoded {
            Ok(d) => gate_inputs(&NodeView {
                name: &self.name,
                inventory: &d.inventory,
                config: &d.config,
                links: d.links.as_ref(),
                usage: &self.usage,
            }),
            Err(_) => GateInputs::default(),
        };
        match &self.decoded {
            Ok(d) => {
                let gpus = d.inventory.devices.iter().map(|g| GpuFree::of(g, self.usage.device(g.index)));
                self.row.publish(&self.decoded, &gates, gpus);
            }
            Err(_) => self.row.publish(&self.decoded, &gates, std::iter::empty()),
        }
    }

    /// This node's row id in the rank table.
    pub fn row_id(&self) -> u32 {
        self.row.id()
    }

    /// Computes this node's fitness table for a mode into its row; the entry for `need`.
    pub(crate) fn fill_fitness(&self, mode: TopologyMode, need: u32) -> Option<u8> {
        let d = self.decoded.as_ref().ok()?;
        let table = d.fitness_table(&self.name, mode)?;
        self.row.fill_fitness(mode, &table);
        table.get((need as usize).min(FITNESS_LEN - 1)).copied()
    }

    /// The allocator's view of this node, when it decoded.
    pub fn view(&self) -> Option<NodeView<'_>> {
        let d = self.decoded.as_ref().ok()?;
        Some(NodeView {
            name: &self.name,
            inventory: &d.inventory,
            config: &d.config,
            links: d.links.as_ref(),
            usage: &self.usage,
        })
    }

    pub(crate) fn insert(&mut self, uid: &str, fp: PodFootprint) {
        self.usage.insert_pod(uid, fp);
        self.recompute();
    }

    pub(crate) fn remove(&mut self, uid: &str) {
        if self.usage.remove_pod(uid) {
            self.recompute();
        }
    }
}

/// A shared node slot.
pub type NodeSlot = Arc<Mutex<NodeState>>;

//! Cross-pod / cross-node gang alignment for the filter (contract §3.1 step 6, §4.5).
//!
//! A pod that asks for `link` topology with `cross-pod-topology: "true"` and has gang siblings (same gang, or
//! without a gang the same controller) already placed gets a [`GangPlacement`] once per filter call: where its
//! siblings are, and the gang's majority domain signature and rail set resolved on the siblings' own nodes.
//! Per candidate node it yields the [`Alignment`] windows the allocator tries (rail, then the NVLink
//! component its siblings use on that node or the one with the gang's domain signature, then none).
//!
//! Siblings count whatever their own opt-in, as long as their pre-allocation counts; a sibling's UUIDs come
//! from its counted claim in the cache, and its node's domains from the cache (decoded once per node change).
//! Differences from upstream: siblings on any cached node vote (upstream uses the call's candidate nodes and
//! decodes others on demand — the same set unless a node is missing from the informer), and the alignment
//! metric reports the window the placement actually came from (upstream reports which key was resolved).

use std::collections::HashMap;
use std::sync::Arc;

use vgpu_core::alloc::{Alignment, GangKeys, GangVotes, NodeDomains, PodRequest};
use vgpu_core::model::TopologyMode;

use crate::cache::ClusterCache;
use crate::cluster::Pod;
use crate::decoded::DecodedNode;

/// The placements of a pod's gang siblings and the gang's cross-node keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GangPlacement {
    /// Node → GPU UUIDs its siblings hold there (one entry per sibling and GPU).
    on_node: HashMap<String, Vec<String>>,
    keys: GangKeys,
}

impl GangPlacement {
    /// Whether cross-pod alignment applies to a request: `link` base mode with `cross-pod-topology: "true"`.
    pub fn applies(request: &PodRequest) -> bool {
        request.cross_pod_topology && request.topology.base() == TopologyMode::Link
    }

    /// Resolves the siblings of `pod` from the cache; `None` when the pod has neither gang nor controller, or
    /// no sibling is placed. Takes the cache index lock, then each sibling node's lock in turn (never two at
    /// once), so call it without holding a node lock.
    pub fn resolve(cache: &ClusterCache, pod: &Pod) -> Option<Self> {
        let siblings = cache.sibling_placements(pod);
        if siblings.is_empty() {
            return None;
        }
        let mut decoded: HashMap<String, Option<Arc<DecodedNode>>> = HashMap::new();
        let mut votes = GangVotes::new();
        let mut on_node: HashMap<String, Vec<String>> = HashMap::new();
        for (node, uuids) in siblings {
            let d = decoded.entry(node.clone()).or_insert_with(|| cache.decoded(&node));
            if let Some(d) = d {
                votes.add(&d.domains, uuids.iter().map(String::as_str));
            }
            on_node.entry(node).or_default().extend(uuids);
        }
        Some(Self { on_node, keys: votes.finish() })
    }

    /// The gang's cross-node keys (`GangDomainKey`, `GangRailKey`).
    pub fn keys(&self) -> &GangKeys {
        &self.keys
    }

    /// The windows on one node: the rail window from the gang's rails, and the anchor component — the one
    /// most of the siblings on this node use (`GangAnchorComponent`), else the one with the gang's domain
    /// signature.
    pub fn alignment(&self, node: &str, domains: &NodeDomains) -> Alignment {
        let anchor =
            self.on_node.get(node).and_then(|uuids| domains.anchor(uuids.iter().map(String::as_str)));
        domains.alignment(anchor, &self.keys)
    }
}

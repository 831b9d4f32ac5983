//! Node ordering over the cache (contract §3.2) without per-node allocation: the same keys as
//! [`vgpu_core::alloc::order_nodes`], from per-node aggregates kept by the cache and a per-call memo of the
//! resolved request.

use std::cmp::Ordering;

use vgpu_core::alloc::{NodeScore, PodRequest, ResolvedRequest};
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::SchedulingPolicy;

use crate::cache::{DecodedNode, NodeState};

/// Resolved requests memoized by what `resolve` depends on (memory factor, uniform GPU memory).
#[derive(Debug, Default)]
pub struct ResolveMemo {
    entries: Vec<((u32, Option<u64>), ResolvedRequest)>,
}

impl ResolveMemo {
    /// The resolved request on a node.
    pub fn get(&mut self, request: &PodRequest, node: &DecodedNode) -> &ResolvedRequest {
        let key = (node.config.memory_factor.max(1), node.uniform_memory);
        let pos = match self.entries.iter().position(|(k, _)| *k == key) {
            Some(p) => p,
            None => {
                self.entries.push((key, request.resolve(&node.inventory, &node.config)));
                self.entries.len() - 1
            }
        };
        &self.entries[pos].1
    }
}

/// The rank inputs of one node (`score_node`), from its locked state.
pub fn score_state(
    request: &PodRequest,
    state: &NodeState,
    memo: &mut ResolveMemo,
    domain: &ResourceDomain,
) -> Option<NodeScore> {
    let d = state.decoded.as_ref().ok()?;
    let need = request.containers.iter().map(|c| c.request.number).max().unwrap_or(0);
    let fitness = d.fitness(&state.name, request.topology.base(), need, domain);
    let r = memo.get(request, d).total;
    let req = [r.number, r.cores, r.memory_mib];
    let (total, avail) = (d.totals, state.avail);
    let w = [request.profile.number, request.profile.cores, request.profile.memory];
    let fits = (0..3).all(|i| req[i] <= avail[i]) && total.iter().all(|&t| t > 0);
    let score = if !fits {
        0.0
    } else {
        let part = |i: usize| -> f64 {
            let t = total[i] as f64;
            match request.node_policy {
                SchedulingPolicy::Binpack => 1.0 - (avail[i] - req[i]) as f64 / t,
                SchedulingPolicy::Spread => avail[i] as f64 / t,
                SchedulingPolicy::None => 0.0,
            }
        };
        100.0 * (0..3).map(|i| w[i] * part(i)).sum::<f64>()
    };
    Some(NodeScore { fitness, score })
}

/// Sorts `(position, name, score)` entries like `order_nodes`: `[fitness desc] → score desc → name asc` for
/// binpack/spread, `[fitness desc] → input position` for none.
pub fn sort_ranked(policy: SchedulingPolicy, entries: &mut [(usize, &str, NodeScore)]) {
    entries.sort_unstable_by(|a, b| {
        let fit = b.2.fitness.cmp(&a.2.fitness);
        if fit != Ordering::Equal {
            return fit;
        }
        match policy {
            SchedulingPolicy::None => a.0.cmp(&b.0),
            _ => b.2.score.total_cmp(&a.2.score).then(a.1.cmp(b.1)).then(a.0.cmp(&b.0)),
        }
    });
}

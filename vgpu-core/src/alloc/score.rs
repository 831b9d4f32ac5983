//! Node ordering and scoring for node policies (contract §3.2).

use std::cmp::Ordering;
use std::collections::BTreeMap;

use crate::model::{SchedulingPolicy, TopologyMode};

use super::node::{LinkTier, NodeView};
use super::request::PodRequest;

/// A node's rank inputs: topology fitness (link/numa modes only) and the request-weighted score.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeScore {
    /// Topology fitness, higher is better; `None` outside link/numa modes.
    pub fitness: Option<u8>,
    /// Request-weighted binpack/spread score, 0..=100; 0 for `none` and for nodes that cannot fit the total.
    pub score: f64,
}

impl NodeScore {
    /// A kube-scheduler `HostPriority` value 0..=10 from the score (rounded tenths).
    pub fn host_priority(&self) -> i64 {
        (self.score / 10.0).round().clamp(0.0, 10.0) as i64
    }
}

/// Topology fitness (`needNumber = Max.Number`), `None` outside link/numa modes.
///
/// link: 5 fits in one NVLink component, 4 one PCIe-switch component, 3 one NUMA-tier component, 2 one any-P2P
/// component, 1 has topology but no fit, 0 no topology. numa: 2 if some NUMA node holds ≥ need schedulable GPUs,
/// 1 if the node has NUMA information, 0 otherwise. Components are over schedulable GPUs; for one GPU a
/// component must have a peer at that tier.
pub fn topology_fitness(request: &PodRequest, node: &NodeView<'_>) -> Option<u8> {
    let need = request.containers.iter().map(|c| c.request.number as usize).max().unwrap_or(0);
    fitness_of_needs(request.topology.base(), node, [need]).map(|[f]| f)
}

/// [`topology_fitness`] for every need at once: entry `n` is the fitness of a pod of a base `mode` whose largest
/// container asks for `max(n, 1)` GPUs (`None` for modes without fitness). Each link tier's components are
/// computed once for all needs, so a cache can keep a node's whole table for the cost of one call.
pub fn topology_fitness_table<const N: usize>(mode: TopologyMode, node: &NodeView<'_>) -> Option<[u8; N]> {
    fitness_of_needs(mode, node, std::array::from_fn(|n| n.max(1)))
}

fn fitness_of_needs<const N: usize>(
    mode: TopologyMode,
    node: &NodeView<'_>,
    needs: [usize; N],
) -> Option<[u8; N]> {
    match mode {
        TopologyMode::Link => {
            let Some(links) = node.links.filter(|l| l.has_links()) else { return Some([0; N]) };
            let gpus: Vec<u32> = node.inventory.schedulable().map(|d| d.index).collect();
            let mut out = [1u8; N];
            let mut open: Vec<usize> = (0..N).collect();
            for (tier, fit) in LinkTier::LADDER.into_iter().zip([5u8, 4, 3, 2]) {
                if open.is_empty() {
                    break;
                }
                let components = links.components(&gpus, tier);
                open.retain(|&i| {
                    let need = needs[i];
                    let ok = components.iter().any(|c| {
                        c.len() > need
                            || (c.len() == need
                                && (need > 1 || c.first().is_some_and(|&g| links.has_peer_at(gpus[g], tier))))
                    });
                    if ok {
                        out[i] = fit;
                    }
                    !ok
                });
            }
            Some(out)
        }
        TopologyMode::Numa => {
            let mut per = BTreeMap::<u32, usize>::new();
            let has = node.inventory.devices.iter().any(|d| d.numa_node.is_some());
            for d in node.inventory.schedulable() {
                if let Some(n) = d.numa_node {
                    *per.entry(n).or_default() += 1;
                }
            }
            let largest = per.values().copied().max().unwrap_or(0);
            Some(needs.map(|need| if largest >= need { 2 } else { u8::from(has) }))
        }
        _ => None,
    }
}

/// Scores a node: `100 × Σ weight_d × u_d` over slots, cores, memory of schedulable GPUs; binpack uses the
/// utilization after placing the request's total, spread the current free fraction; 0 when the node cannot
/// hold the total or the policy is `none`.
pub fn score_node(request: &PodRequest, node: &NodeView<'_>) -> NodeScore {
    let fitness = topology_fitness(request, node);
    let resolved = request.resolve(node.inventory, node.config);
    let mut total = [0u64; 3];
    let mut avail = [0u64; 3];
    for d in node.inventory.schedulable() {
        let u = node.usage.device(d.index);
        total[0] += u64::from(d.split_count);
        total[1] += d.cores;
        total[2] += d.memory_mib;
        avail[0] += u64::from(d.split_count.saturating_sub(u.number));
        avail[1] += d.cores.saturating_sub(u.cores);
        avail[2] += d.memory_mib.saturating_sub(u.memory_mib);
    }
    let req = [resolved.total.number, resolved.total.cores, resolved.total.memory_mib];
    let w = [request.profile.number, request.profile.cores, request.profile.memory];
    let fits = (0..3).all(|d| req[d] <= avail[d]) && total.iter().all(|&t| t > 0);
    let score = if !fits {
        0.0
    } else {
        let part = |d: usize| -> f64 {
            let t = total[d] as f64;
            match request.node_policy {
                SchedulingPolicy::Binpack => 1.0 - (avail[d] - req[d]) as f64 / t,
                SchedulingPolicy::Spread => avail[d] as f64 / t,
                SchedulingPolicy::None => 0.0,
            }
        };
        100.0 * (0..3).map(|d| w[d] * part(d)).sum::<f64>()
    };
    NodeScore { fitness, score }
}

/// Orders nodes for the filter (first fitting node wins): `[fitness desc] → score desc → name asc` for
/// binpack/spread, `[fitness desc] → input position` for none. Returns positions into `nodes`.
pub fn order_nodes(request: &PodRequest, nodes: &[NodeView<'_>]) -> Vec<usize> {
    let scores: Vec<NodeScore> = nodes.iter().map(|n| score_node(request, n)).collect();
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by(|&a, &b| {
        let (sa, sb) = (scores[a], scores[b]);
        let fit = sb.fitness.cmp(&sa.fitness);
        let rest = match request.node_policy {
            SchedulingPolicy::None => a.cmp(&b),
            _ => sb.score.total_cmp(&sa.score).then(nodes[a].name.cmp(nodes[b].name)).then(a.cmp(&b)),
        };
        if fit == Ordering::Equal { rest } else { fit }
    });
    order
}

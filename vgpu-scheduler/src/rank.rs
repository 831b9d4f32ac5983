//! Node ordering over the cache (contract §3.2) without per-node allocation or lock: the same keys as
//! [`vgpu_core::alloc::order_nodes`], from the cache's rank table ([`crate::rank_table`]) and a per-call memo of
//! the resolved request.

use std::cmp::Ordering;

use vgpu_core::alloc::{
    Footprint, NodeScore, PodRequest, ReasonCode, ResolvedRequest, quick_reject_summary, size_gate,
};
use vgpu_core::model::SchedulingPolicy;

use crate::cache::ClusterCache;
use crate::decoded::{DecodedNode, ResolveKey};
use crate::names::CandidateNames;
use crate::rank_table::{RankInputs, RowFitness, RowReader, RowStatus};

/// Resolved requests memoized by what `resolve` depends on (memory factor, uniform GPU memory).
#[derive(Debug, Default)]
pub struct ResolveMemo {
    entries: Vec<(ResolveKey, ResolvedRequest)>,
}

impl ResolveMemo {
    /// The resolved request on a node.
    pub fn get(&mut self, request: &PodRequest, node: &DecodedNode) -> &ResolvedRequest {
        self.get_keyed(node.resolve_key(), request, node)
    }

    fn get_keyed(&mut self, key: ResolveKey, request: &PodRequest, node: &DecodedNode) -> &ResolvedRequest {
        let pos = match self.entries.iter().position(|(k, _)| *k == key) {
            Some(p) => p,
            None => {
                self.entries.push((key, request.resolve(&node.inventory, &node.config)));
                self.entries.len() - 1
            }
        };
        &self.entries[pos].1
    }

    /// The request resolved under a key, if it was resolved before.
    pub fn lookup(&self, key: ResolveKey) -> Option<&ResolvedRequest> {
        self.entries.iter().find(|(k, _)| *k == key).map(|(_, r)| r)
    }
}

/// The rank inputs of one node (`score_node`) from its rank-table numbers, its topology fitness and the
/// request's total resolved on it.
pub fn score_inputs(
    request: &PodRequest,
    inputs: &RankInputs,
    fitness: Option<u8>,
    resolved_total: Footprint,
) -> NodeScore {
    let r = resolved_total;
    let req = [r.number, r.cores, r.memory_mib];
    let (avail, total) = (inputs.avail, inputs.totals);
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
    NodeScore { fitness, score }
}

/// Ranks a candidate list from the cache's rank table (one dense row per node, no node lock), given the
/// names' row ids ([`ClusterCache::candidate_rows`]): the scored entries, and `reject(position, reason)` for
/// every candidate the cache does not hold or that cannot take vGPU pods. A node's lock is taken only the
/// first time its fitness table or a new resolve key is needed.
///
/// With `row_rejection` (a filter: the nodes whose usage counts the pod, [`ClusterCache::nodes_counting`],
/// as a rule none), a node whose row shows it fails a size gate (cards, cores or memory per
/// vGPU, free slots, cores or memory: `vgpu_core::alloc::size_gate`) is rejected here with that gate's
/// reason, exactly as a placement attempt would reject it — unless the request has a memory policy (its node
/// check comes first) or the node counts the pod itself (a placement attempt leaves the pod's own usage
/// out). A full cluster's filter then never locks the nodes that are full. Without it (prioritize) every
/// held node is ranked.
pub fn rank_candidates<'a>(
    cache: &ClusterCache,
    request: &PodRequest,
    names: &'a CandidateNames,
    rows: &[u32],
    memo: &mut ResolveMemo,
    row_rejection: Option<&[String]>,
    mut reject: impl FnMut(usize, ReasonCode),
) -> Vec<Ranked<'a>> {
    let table = cache.rank_rows();
    let gated = row_rejection.filter(|_| request.memory_policy.is_none());
    let own = gated.unwrap_or_default();
    let mode = request.topology.base();
    let need = request.containers.iter().map(|c| c.request.number).max().unwrap_or(0);
    let mut ranked = Vec::with_capacity(names.len());
    for (pos, (name, &id)) in names.iter().zip(rows).enumerate() {
        let Some(row) = table.get(id) else {
            reject(pos, ReasonCode::NodeCacheMiss);
            continue;
        };
        match row.status() {
            RowStatus::Ready => {}
            RowStatus::Vacant => {
                reject(pos, ReasonCode::NodeCacheMiss);
                continue;
            }
            RowStatus::Failed(code) => {
                reject(pos, code);
                continue;
            }
        }
        let inputs = row.inputs();
        let mut key = inputs.key;
        if memo.lookup(key).is_none() {
            // Resolved under the decoded node's own key (never the row's, which may be a moment older).
            let Some(d) = cache.decoded(name) else {
                reject(pos, ReasonCode::NodeInfoBuildFailed);
                continue;
            };
            key = d.resolve_key();
            memo.get(request, &d);
        }
        let Some(resolved) = memo.lookup(key) else {
            reject(pos, ReasonCode::NodeInfoBuildFailed);
            continue;
        };
        // The row's gate inputs are judged only against the request resolved under the row's own key.
        if gated.is_some()
            && key == inputs.key
            && let Some(code) = inputs.gates.as_ref().and_then(|g| size_gate(resolved, g))
            && !own.iter().any(|n| n == name)
        {
            reject(pos, code);
            continue;
        }
        let total = resolved.total;
        let fitness = match row.fitness(mode, need) {
            RowFitness::NotRanked => None,
            RowFitness::Known(f) => Some(f),
            RowFitness::Unknown => cache.fill_fitness(name, mode, need),
        };
        ranked.push((pos, name, score_inputs(request, &inputs, fitness, total)));
    }
    ranked
}

/// Why a ranked node cannot take the pod, read from its rank-table row alone (no node lock): the size gates
/// and, from the row's GPU lane, the first container's GPU filter (`vgpu_core::alloc::quick_reject_summary`)
/// — the reason a placement attempt gives. `None` when the row cannot say (no usable lane, the request
/// resolved under another key, a memory policy whose node check comes first): lock the node and try it. The
/// caller leaves out nodes that count the pod itself. The filter asks this of each node just before it
/// would lock it, so a pod that fits at once pays it for one node, not for every candidate.
pub fn row_reject(rows: &RowReader, id: u32, request: &PodRequest, memo: &ResolveMemo) -> Option<ReasonCode> {
    if request.memory_policy.is_some() {
        return None;
    }
    let row = rows.get(id)?;
    if row.status() != RowStatus::Ready {
        return None;
    }
    let (inputs, lane) = row.inputs_with_gpus();
    let gates = inputs.gates?;
    let resolved = memo.lookup(inputs.key)?;
    match lane {
        Some(lane) => quick_reject_summary(request, resolved, &gates, lane.iter()),
        None => size_gate(resolved, &gates),
    }
}

/// A ranked candidate: input position, node name, rank inputs.
pub type Ranked<'a> = (usize, &'a str, NodeScore);

fn rank_cmp(policy: SchedulingPolicy, a: &Ranked<'_>, b: &Ranked<'_>) -> Ordering {
    let fit = b.2.fitness.cmp(&a.2.fitness);
    if fit != Ordering::Equal {
        return fit;
    }
    match policy {
        SchedulingPolicy::None => a.0.cmp(&b.0),
        _ => b.2.score.total_cmp(&a.2.score).then_with(|| name_cmp(a.1, b.1)).then_with(|| a.0.cmp(&b.0)),
    }
}

/// `a.cmp(b)` for node names, without a `memcmp` call for names of up to 16 bytes (most node names; every
/// tie of scores compares two, and whole clusters of identical nodes tie): both zero-padded to 16 bytes and
/// compared as big-endian integers, then by length. Padding keeps the order: where the padded forms first
/// differ, either both bytes are the names' own, or the shorter name is a prefix of the longer one, whose
/// byte there is not zero.
fn name_cmp(a: &str, b: &str) -> Ordering {
    padded_cmp(padded(a.as_bytes()), a, padded(b.as_bytes()), b)
}

/// [`name_cmp`] with the padded forms of the names given ([`padded`] of each).
fn padded_cmp(pa: Option<u128>, a: &str, pb: Option<u128>, b: &str) -> Ordering {
    match (pa, pb) {
        (Some(x), Some(y)) => x.cmp(&y).then_with(|| a.len().cmp(&b.len())),
        _ => a.cmp(b),
    }
}

/// A name of up to 16 bytes zero-padded to 16 bytes, as a big-endian integer (`None` when longer). Fixed-size
/// loads only (a variable-length copy into a buffer was a `memcpy` call per name): a name of 8 bytes or more
/// is its first 8 bytes and its last 8 bytes shifted left over the bytes they share.
fn padded(s: &[u8]) -> Option<u128> {
    let n = s.len();
    let word = |b: &[u8]| -> Option<u64> { Some(u64::from_be_bytes(b.try_into().ok()?)) };
    if n > 16 {
        None
    } else if n >= 8 {
        let hi = word(s.get(..8)?)?;
        let lo = word(s.get(n - 8..)?)?.checked_shl(8 * (16 - n) as u32).unwrap_or(0);
        Some((u128::from(hi) << 64) | u128::from(lo))
    } else {
        let mut buf = [0u8; 8];
        for (d, b) in buf.iter_mut().zip(s) {
            *d = *b;
        }
        Some(u128::from(u64::from_be_bytes(buf)) << 64)
    }
}

/// Sorts `(position, name, score)` entries like `order_nodes`: `[fitness desc] → score desc → name asc` for
/// binpack/spread, `[fitness desc] → input position` for none.
pub fn sort_ranked(policy: SchedulingPolicy, entries: &mut [Ranked<'_>]) {
    entries.sort_unstable_by(|a, b| rank_cmp(policy, a, b));
}

/// First chunk ordered by [`Ranking`] (later chunks double).
const FIRST_CHUNK: usize = 8;

/// The entries of [`sort_ranked`] handed out best first, ordering only as far as they are consumed: a live
/// filter usually stops at the first node, so ranking 5,000 nodes costs one selection (linear) instead of a full
/// sort. Chunks double in size, so draining everything costs at most about twice a full sort.
#[derive(Debug)]
pub struct Ranking<'a> {
    entries: Vec<Ranked<'a>>,
    policy: SchedulingPolicy,
    next: usize,
    ordered: usize,
}

impl<'a> Ranking<'a> {
    /// A ranking of `entries` under a node policy.
    pub fn new(policy: SchedulingPolicy, entries: Vec<Ranked<'a>>) -> Self {
        Self { entries, policy, next: 0, ordered: 0 }
    }

    /// How many entries have not been handed out yet.
    pub fn remaining(&self) -> usize {
        self.entries.len() - self.next
    }

    /// The entries not handed out yet, in no particular order.
    pub fn rest(&self) -> &[Ranked<'a>] {
        &self.entries[self.next..]
    }
}

impl<'a> Iterator for Ranking<'a> {
    type Item = Ranked<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.ordered == 0 && !self.entries.is_empty() {
            // The first pick, usually the only one: one linear scan for the best entry, the padded name of the
            // best so far kept (`rank_cmp` against it, each name padded once).
            let policy = self.policy;
            let mut best = 0;
            let mut best_pad = self.entries.first().and_then(|e| padded(e.1.as_bytes()));
            for (i, a) in self.entries.iter().enumerate().skip(1) {
                let Some(b) = self.entries.get(best) else { break };
                let mut pad = None;
                let ord = b.2.fitness.cmp(&a.2.fitness).then_with(|| match policy {
                    SchedulingPolicy::None => a.0.cmp(&b.0),
                    _ => b.2.score.total_cmp(&a.2.score).then_with(|| {
                        let pa = padded(a.1.as_bytes());
                        pad = Some(pa);
                        padded_cmp(pa, a.1, best_pad, b.1).then_with(|| a.0.cmp(&b.0))
                    }),
                });
                if ord == Ordering::Less {
                    best = i;
                    best_pad = pad.unwrap_or_else(|| padded(a.1.as_bytes()));
                }
            }
            self.entries.swap(0, best);
            self.ordered = 1;
        } else if self.next == self.ordered && self.ordered < self.entries.len() {
            let policy = self.policy;
            let rest = &mut self.entries[self.ordered..];
            let chunk = self.ordered.max(FIRST_CHUNK).min(rest.len());
            if chunk < rest.len() {
                rest.select_nth_unstable_by(chunk - 1, |a, b| rank_cmp(policy, a, b));
            }
            rest[..chunk].sort_unstable_by(|a, b| rank_cmp(policy, a, b));
            self.ordered += chunk;
        }
        let item = self.entries.get(self.next).copied()?;
        self.next += 1;
        Some(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining(), Some(self.remaining()))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn entries<'a>(raw: &[(u8, u8, u8)], names: &'a [String]) -> Vec<Ranked<'a>> {
        raw.iter()
            .enumerate()
            .map(|(pos, &(fit, score, name))| {
                let name = names[name as usize % names.len()].as_str();
                let fitness = (fit % 3 > 0).then_some(fit % 6);
                (pos, name, NodeScore { fitness, score: f64::from(score % 5) })
            })
            .collect()
    }

    proptest! {
        /// The padded form is the name's bytes zero-padded to 16, for every length up to 16.
        #[test]
        fn padded_is_zero_padding(s in proptest::collection::vec(any::<u8>(), 0..20)) {
            let want = (s.len() <= 16).then(|| {
                let mut buf = [0u8; 16];
                buf[..s.len()].copy_from_slice(&s);
                u128::from_be_bytes(buf)
            });
            prop_assert_eq!(padded(&s), want);
        }

        /// The short-name comparison is the string order.
        #[test]
        fn name_cmp_is_str_cmp(a in "[a-c\\x00.-]{0,20}", b in "[a-c\\x00.-]{0,20}") {
            prop_assert_eq!(name_cmp(&a, &b), a.cmp(&b));
            let long = format!("{a}{b}");
            prop_assert_eq!(name_cmp(&long, &a), long.as_str().cmp(a.as_str()));
        }

        /// Draining a ranking, in full or in part, yields exactly the prefix of the fully sorted order.
        #[test]
        fn ranking_matches_full_sort(
            raw in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<u8>()), 0..120),
            take in 0usize..130,
            policy in prop_oneof![
                Just(SchedulingPolicy::Binpack),
                Just(SchedulingPolicy::Spread),
                Just(SchedulingPolicy::None),
            ],
        ) {
            let names: Vec<String> = (0..7)
                .map(|i| format!("node-{i}"))
                .chain(["n", "node-", "node-1-long-name-x", "node-1-long-name-y", "node-10", "node-1\0"].map(String::from))
                .collect();
            let e = entries(&raw, &names);
            let mut sorted = e.clone();
            sort_ranked(policy, &mut sorted);
            let mut ranking = Ranking::new(policy, e);
            let head: Vec<usize> = ranking.by_ref().take(take).map(|r| r.0).collect();
            let want: Vec<usize> = sorted.iter().take(take).map(|r| r.0).collect();
            prop_assert_eq!(&head, &want);
            let mut rest: Vec<usize> = ranking.rest().iter().map(|r| r.0).collect();
            rest.sort_unstable();
            let mut want_rest: Vec<usize> = sorted.iter().skip(take).map(|r| r.0).collect();
            want_rest.sort_unstable();
            prop_assert_eq!(rest, want_rest);
        }
    }
}

//! NUMA placement (contract §4.2 `allocateNUMA`).

use std::collections::BTreeMap;

use crate::model::SchedulingPolicy;

use super::filter::{Candidate, group_score};

/// Picks `need` candidates of one NUMA node: groups visited fullest first (binpack), emptiest first (spread) or
/// by NUMA id (none), NUMA id breaking ties; the first group with enough GPUs gives its first `need` in store
/// order. `Err(max single-NUMA candidate count)` when none has enough.
pub(crate) fn pick(cands: &[Candidate], need: usize, policy: SchedulingPolicy) -> Result<Vec<usize>, usize> {
    let mut groups: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, c) in cands.iter().enumerate() {
        if let Some(n) = c.numa {
            groups.entry(n).or_default().push(i);
        }
    }
    let mut order: Vec<(f64, u32, Vec<usize>)> =
        groups.into_iter().map(|(id, m)| (group_score(cands, &m, policy), id, m)).collect();
    // Higher group score first (binpack: most utilized; spread: least utilized; none: all 0), then NUMA id.
    order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let max = order.iter().map(|g| g.2.len()).max().unwrap_or(0);
    order.into_iter().find(|g| g.2.len() >= need).map(|g| g.2[..need].to_vec()).ok_or(max)
}

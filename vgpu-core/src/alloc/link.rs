//! Link-topology placement: the contract's tiered walk (§4.3) checked against the exact best-effort optimizer
//! of [`crate::topology`].
//!
//! The walk picks the tightest tier with a component of enough candidates, the component by policy score, then
//! members by policy runs, filling the overflowing run by link quality (exhaustive below
//! [`MAX_COMBINATIONS`], greedy above). The chosen component (or, when spanning, all candidates) is then handed
//! to [`BestEffortPolicy`]; its set replaces the walk's only when it scores strictly higher, so the result
//! always scores at least as well as the walk and keeps the walk's policy adherence on ties.
//!
//! Two simplifications of upstream, both deterministic: ties in the subset search go to the first subset in
//! store order (upstream compares complements), and the "uniform tier" shortcut is not needed because with
//! equal pair scores the first subset in store order is the prefix.

use crate::model::SchedulingPolicy;
use crate::topology::BestEffortPolicy;

use super::filter::{Candidate, group_score};
use super::link_search::{LinkSearch, LinkSearchAlgo, note};
use super::node::{LinkTier, NodeLinks};

/// Largest `C(run, need)` searched exhaustively (`maxCombinationSearch`).
pub const MAX_COMBINATIONS: u128 = 50_000;

/// Largest pool handed to the best-effort optimizer; larger pools keep the walk's set (the optimizer's cost grows
/// with the number of GPU subsets).
pub const MAX_OPTIMIZER_POOL: usize = 16;

/// A link placement: candidate positions (store order), tier reached, whether it spans components.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LinkPlan {
    pub picks: Vec<usize>,
    pub tier: LinkTier,
    pub spanned: bool,
}

/// Group choice key (policy score, link score, root GPU), component, walk picks.
type GroupPick = (f64, u64, u32, Vec<usize>, Vec<usize>);

/// Sum of pair scores of candidate positions.
pub(crate) fn set_score(links: &NodeLinks, cands: &[Candidate], picks: &[usize]) -> u64 {
    let mut s = 0u64;
    for (i, &a) in picks.iter().enumerate() {
        for &b in &picks[i + 1..] {
            if let (Some(x), Some(y)) = (cands.get(a), cands.get(b)) {
                s = s.saturating_add(links.pair_score(x.index, y.index));
            }
        }
    }
    s
}

/// Runs the tiered walk; `None` when no tier holds a fitting group (only possible for `need == 1` without any
/// linked candidate, or too few candidates).
pub(crate) fn plan(
    links: &NodeLinks,
    cands: &[Candidate],
    need: usize,
    policy: SchedulingPolicy,
) -> Option<LinkPlan> {
    if need == 0 || cands.len() < need {
        return None;
    }
    let gpus: Vec<u32> = cands.iter().map(|c| c.index).collect();
    for tier in LinkTier::LADDER {
        let comps = links.components(&gpus, tier);
        let mut best: Option<GroupPick> = None;
        for comp in &comps {
            let eligible = comp.len() > need
                || (comp.len() == need
                    && (need > 1 || comp.first().is_some_and(|&c| links.has_peer_at(gpus[c], tier))));
            if !eligible {
                continue;
            }
            let picks = pick_members(links, cands, comp, need, policy);
            let key = (
                group_score(cands, comp, policy),
                set_score(links, cands, &picks),
                comp.iter().map(|&c| gpus[c]).min().unwrap_or(u32::MAX),
            );
            let better = match &best {
                None => true,
                Some(b) => key.0.total_cmp(&b.0).then(key.1.cmp(&b.1)).then(b.2.cmp(&key.2)).is_gt(),
            };
            if better {
                best = Some((key.0, key.1, key.2, comp.clone(), picks));
            }
        }
        if let Some((_, score, _, comp, picks)) = best {
            let picks = improve(links, cands, &comp, need, picks, score);
            return Some(LinkPlan { picks, tier, spanned: false });
        }
        if tier == LinkTier::Any && need > 1 {
            let mut order: Vec<(usize, f64, u32, &Vec<usize>)> = comps
                .iter()
                .map(|c| {
                    (c.len(), group_score(cands, c, policy), c.iter().map(|&i| gpus[i]).min().unwrap_or(0), c)
                })
                .collect();
            order.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.total_cmp(&a.1)).then(a.2.cmp(&b.2)));
            let mut picks = Vec::new();
            for (len, _, _, comp) in order {
                let remaining = need - picks.len();
                if remaining == 0 {
                    break;
                }
                if len <= remaining {
                    picks.extend(comp.iter().copied());
                } else {
                    picks.extend(pick_members(links, cands, comp, remaining, policy));
                }
            }
            picks.sort_unstable();
            let score = set_score(links, cands, &picks);
            let all: Vec<usize> = (0..cands.len()).collect();
            let picks = improve(links, cands, &all, need, picks, score);
            return Some(LinkPlan { picks, tier, spanned: true });
        }
    }
    None
}

/// Replaces the walk's picks by the best-effort optimizer's set over `pool` when that scores strictly higher.
fn improve(
    links: &NodeLinks,
    cands: &[Candidate],
    pool: &[usize],
    need: usize,
    picks: Vec<usize>,
    walk_score: u64,
) -> Vec<usize> {
    if need < 2 || pool.len() > MAX_OPTIMIZER_POOL {
        return picks;
    }
    let available: Vec<usize> = pool.iter().filter_map(|&p| cands.get(p)).map(|c| c.index as usize).collect();
    let Ok(got) = BestEffortPolicy::new(links.topology()).allocate(&available, &[], need) else {
        return picks;
    };
    if got.devices.len() != need || got.score <= walk_score {
        return picks;
    }
    let mut alt: Vec<usize> = pool
        .iter()
        .copied()
        .filter(|&p| cands.get(p).is_some_and(|c| got.devices.contains(&(c.index as usize))))
        .collect();
    alt.sort_unstable();
    if alt.len() == need { alt } else { picks }
}

/// `pickMembers`: whole policy runs (maximal runs of equal device score in store order; one run for `none`),
/// the overflowing run filled by link quality with the already-taken members fixed. Returns store order.
fn pick_members(
    links: &NodeLinks,
    cands: &[Candidate],
    group: &[usize],
    need: usize,
    policy: SchedulingPolicy,
) -> Vec<usize> {
    let mut runs: Vec<Vec<usize>> = Vec::new();
    for &g in group {
        let same = runs.last().and_then(|r| r.last()).is_some_and(|&last| {
            policy == SchedulingPolicy::None
                || cands.get(last).map(|c| c.score) == cands.get(g).map(|c| c.score)
        });
        match runs.last_mut() {
            Some(run) if same => run.push(g),
            _ => runs.push(vec![g]),
        }
    }
    let mut chosen: Vec<usize> = Vec::with_capacity(need);
    for run in runs {
        let remaining = need - chosen.len();
        if remaining == 0 {
            break;
        }
        if run.len() <= remaining {
            chosen.extend(run);
        } else {
            let extra = best_subset(links, cands, &run, remaining, &chosen);
            chosen.extend(extra);
            break;
        }
    }
    chosen.sort_unstable();
    chosen
}

fn gain(links: &NodeLinks, cands: &[Candidate], x: usize, others: &[usize]) -> u64 {
    let Some(cx) = cands.get(x) else { return 0 };
    others
        .iter()
        .filter_map(|&o| cands.get(o))
        .fold(0u64, |acc, co| acc.saturating_add(links.pair_score(cx.index, co.index)))
}

fn combinations(n: usize, k: usize) -> u128 {
    let k = k.min(n - k.min(n));
    let mut c: u128 = 1;
    for i in 0..k {
        c = c.saturating_mul((n - i) as u128) / (i as u128 + 1);
        if c > MAX_COMBINATIONS {
            return c;
        }
    }
    c
}

/// The `k` members of `run` maximising pair scores among themselves and with `fixed`; first in store order on
/// ties. Exhaustive when `C(|run|, k) ≤ MAX_COMBINATIONS`, else greedy.
fn best_subset(
    links: &NodeLinks,
    cands: &[Candidate],
    run: &[usize],
    k: usize,
    fixed: &[usize],
) -> Vec<usize> {
    let n = run.len();
    if k >= n {
        return run.to_vec();
    }
    let exhaustive = combinations(n, k) <= MAX_COMBINATIONS;
    let algo = if exhaustive { LinkSearchAlgo::Exhaustive } else { LinkSearchAlgo::Greedy };
    note(LinkSearch { algo, candidates: n });
    if exhaustive {
        let base: Vec<u64> = run.iter().map(|&r| gain(links, cands, r, fixed)).collect();
        let mut idx: Vec<usize> = (0..k).collect();
        let mut best: Option<(u64, Vec<usize>)> = None;
        loop {
            let members: Vec<usize> = idx.iter().map(|&i| run[i]).collect();
            let mut s = 0u64;
            for (a, &i) in idx.iter().enumerate() {
                s = s.saturating_add(base[i]).saturating_add(gain(links, cands, run[i], &members[a + 1..]));
            }
            if best.as_ref().is_none_or(|b| s > b.0) {
                best = Some((s, members));
            }
            // Next combination in lexicographic order.
            let mut i = k;
            loop {
                if i == 0 {
                    return best.map(|b| b.1).unwrap_or_default();
                }
                i -= 1;
                if idx[i] < n - k + i {
                    idx[i] += 1;
                    for j in i + 1..k {
                        idx[j] = idx[j - 1] + 1;
                    }
                    break;
                }
            }
        }
    }
    let mut taken: Vec<usize> = fixed.to_vec();
    let mut out = Vec::with_capacity(k);
    let mut left: Vec<usize> = run.to_vec();
    while out.len() < k && !left.is_empty() {
        let mut bi = 0;
        let mut bg = None;
        for (i, &x) in left.iter().enumerate() {
            let g = gain(links, cands, x, &taken);
            if bg.is_none_or(|b| g > b) {
                bg = Some(g);
                bi = i;
            }
        }
        let x = left.remove(bi);
        taken.push(x);
        out.push(x);
    }
    out
}

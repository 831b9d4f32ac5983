//! Test and bench support: a brute-force transcription of go-gpuallocator's best-effort enumeration (the
//! oracle the exact optimizer is checked against) and a tiny deterministic random topology generator.
//!
//! Shared by `tests/topology_best_effort.rs` and the workspace bench `benches/topology.rs` via `#[path]`.
#![allow(dead_code)]

use std::collections::BTreeMap;

use vgpu_core::topology::{DeviceTopology, GpuLinks, P2PLinkType, Topology};

/// A slot of the padded device list: a GPU index, or `None` for a placeholder.
pub type Slot = Option<usize>;

/// What the reference enumeration picks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OracleResult {
    /// The first best-scoring qualifying partition, sets in enumeration order.
    pub partition: Vec<Vec<Slot>>,
    /// Its score.
    pub score: u64,
    /// Index of the set upstream returns.
    pub upstream: usize,
    /// Index of the set returned after the padding fix.
    pub chosen: usize,
}

/// Every `size`-combination of `devices`, in lexicographic order of positions, passed to `f`.
pub fn for_each_set(devices: &[Slot], size: usize, f: &mut dyn FnMut(&[Slot])) {
    if size == 0 || size > devices.len() {
        return;
    }
    let mut idx: Vec<usize> = (0..size).collect();
    let n = devices.len();
    loop {
        let set: Vec<Slot> = idx.iter().map(|&i| devices[i]).collect();
        f(&set);
        // Advance to the next combination.
        let mut level = size;
        loop {
            if level == 0 {
                return;
            }
            level -= 1;
            if idx[level] < n - (size - level) {
                idx[level] += 1;
                for l in level + 1..size {
                    idx[l] = idx[l - 1] + 1;
                }
                break;
            }
        }
    }
}

fn padding_in(set: &[Slot]) -> usize {
    set.iter().filter(|s| s.is_none()).count()
}

/// Every partition upstream's `iterateGPUPartitions` visits, in its order.
pub fn for_each_partition(devices: &[usize], size: usize, f: &mut dyn FnMut(&[Vec<Slot>])) {
    if size == 0 || size > devices.len() {
        return;
    }
    if size == 1 {
        for &d in devices {
            f(&[vec![Some(d)]]);
        }
        return;
    }
    let mut padded: Vec<Slot> = devices.iter().map(|&d| Some(d)).collect();
    while !padded.len().is_multiple_of(size) {
        padded.push(None);
    }
    let padding = padding_in(&padded);
    fn walk(
        devices: &[Slot],
        size: usize,
        padding: usize,
        accum: &mut Vec<Vec<Slot>>,
        f: &mut dyn FnMut(&[Vec<Slot>]),
    ) {
        if size == devices.len() {
            accum.push(devices.to_vec());
            f(accum);
            accum.pop();
            return;
        }
        let head = devices[0];
        for_each_set(&devices[1..], size - 1, &mut |tail| {
            let mut set = vec![head];
            set.extend_from_slice(tail);
            let p = padding_in(&set);
            if !(p == 0 || p == padding) {
                return;
            }
            // Like upstream's pointer comparison: a set holding a placeholder removes every placeholder.
            let remaining: Vec<Slot> = devices.iter().copied().filter(|d| !set.contains(d)).collect();
            accum.push(set);
            walk(&remaining, size, padding, accum, f);
            accum.pop();
        });
    }
    walk(&padded, size, padding, &mut Vec::new(), f);
}

/// Set score with placeholders scoring 0.
pub fn set_score(t: &Topology, set: &[Slot]) -> u64 {
    let mut total = 0;
    for (i, a) in set.iter().enumerate() {
        for b in &set[i + 1..] {
            if let (Some(a), Some(b)) = (a, b) {
                total += t.pair_score(*a, *b).unwrap_or(0);
            }
        }
    }
    total
}

fn contains_all(set: &[Slot], required: &[usize]) -> bool {
    required.iter().all(|r| set.contains(&Some(*r)))
}

/// go-gpuallocator's `bestEffortPolicy.Allocate`, step by step, plus our padding fix.
pub fn best_effort(
    t: &Topology,
    available: &[usize],
    required: &[usize],
    size: usize,
) -> Option<OracleResult> {
    if size == 0 || available.len() < size || required.len() > size {
        return None;
    }
    let mut best: Option<(Vec<Vec<Slot>>, u64)> = None;
    for_each_partition(available, size, &mut |candidate| {
        let qualifies = candidate.iter().any(|set| contains_all(set, required) && padding_in(set) == 0);
        if !qualifies {
            return;
        }
        let score: u64 = candidate.iter().map(|set| set_score(t, set)).sum();
        if best.as_ref().is_none_or(|(_, s)| score > *s) {
            best = Some((candidate.to_vec(), score));
        }
    });
    let (partition, score) = best?;
    let pick = |allow_padded: bool| {
        let mut pick: Option<(usize, u64)> = None;
        for (i, set) in partition.iter().enumerate() {
            if !contains_all(set, required) || (!allow_padded && padding_in(set) > 0) {
                continue;
            }
            let s = set_score(t, set);
            if pick.is_none_or(|(_, b)| s > b) {
                pick = Some((i, s));
            }
        }
        pick.map(|(i, _)| i)
    };
    let upstream = pick(true)?;
    let chosen = if padding_in(&partition[upstream]) > 0 { pick(false)? } else { upstream };
    Some(OracleResult { partition, score, upstream, chosen })
}

/// SplitMix64: a tiny deterministic PRNG.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform-ish value in `0..bound` (`bound > 0`).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }
}

/// Builds a symmetric annotation from a per-pair link list function (`a < b`).
pub fn symmetric(n: usize, mut links: impl FnMut(usize, usize) -> Vec<P2PLinkType>) -> DeviceTopology {
    let mut gpus: Vec<GpuLinks> = (0..n).map(|index| GpuLinks { index, links: BTreeMap::new() }).collect();
    for a in 0..n {
        for b in a + 1..n {
            let l = links(a, b);
            if l.is_empty() {
                continue;
            }
            let mut back = l.clone();
            back.reverse();
            gpus[a].links.insert(b, l);
            gpus[b].links.insert(a, back);
        }
    }
    DeviceTopology { gpus }
}

/// A random but plausible topology: a PCIe level for every pair, NVLinks (1..=4) on about 40% of pairs.
pub fn random_topology(n: usize, seed: u64) -> DeviceTopology {
    let mut rng = SplitMix64(seed);
    symmetric(n, |_, _| {
        let mut l = vec![P2PLinkType::ALL[1 + rng.below(6) as usize]];
        if rng.below(10) < 4 {
            l.push(P2PLinkType::ALL[7 + rng.below(4) as usize]);
        }
        l
    })
}

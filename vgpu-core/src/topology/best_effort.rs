//! The go-gpuallocator best-effort policy, solved exactly by memoised search over subsets.
//!
//! # What upstream computes
//!
//! With `n` available GPUs (ascending index order), a set size `s ≥ 2` and `required` GPUs `R`, upstream pads
//! the list with `p = (s − n mod s) mod s` placeholders and walks every partition of the padded list into sets
//! of `s`, where each set holds either all `p` placeholders or none (so at most one *short* set). Sets are
//! generated in a fixed order: each partition is a sequence of sets ordered by their smallest member, and each
//! set is compared as its sorted tuple with placeholders after every real GPU; partitions are visited in
//! lexicographic order of that sequence. Among partitions with a placeholder-free set containing all of `R`,
//! the *first visited* with the highest score (sum of set scores, placeholders scoring 0) wins. Upstream then
//! returns the first highest-scoring set of that partition among those containing `R`. For `s = 1` every
//! single GPU is its own "partition" and the first one containing `R` wins.
//!
//! # How we compute it
//!
//! The winning partition is the lexicographically first partition of maximal score under the constraint
//! "every set meeting `R` contains all of `R` and no placeholder" (equivalent to upstream's filter). Both the
//! score and the order decompose over the first set: the best partition of a GPU mask `M` is the first (in
//! upstream's set order) set `B ∋ min(M)` maximising `score(B) + best(M ∖ B)`, followed by the best partition of
//! `M ∖ B`. [`BestEffortPolicy`] memoises `best(M)` per mask and enumerates candidate sets in upstream's order,
//! replacing the incumbent only on a strictly greater total — which reproduces upstream's first-wins tie-break
//! exactly. Candidates `B` are explored best-first by `score(B) + bound(M ∖ B)`, where `bound` is exact when
//! `M ∖ B` is already solved or is one last set, and otherwise half the sum over GPUs of their `s − 1` best pair
//! scores inside the mask (no set can score more). Exploration stops once the bound falls below the incumbent
//! and skips candidates that could only tie it from later in upstream's order; every memoised value stays
//! exact, and ties between explored candidates go to the earlier one in upstream's order.
//!
//! Up to 20 available GPUs the memo is a dense array indexed by mask, and once the best-first search has
//! generated a small budget of candidates (it pays a bound per candidate) the remaining masks are solved by the
//! plain programme: every allowed first set in upstream's order, its rest solved recursively, the incumbent
//! replaced only on a strictly greater total. Both store the same exact `best(M)`, so the result is the same.
//!
//! # Deliberate differences
//!
//! * Upstream may return the short set, i.e. fewer real GPUs than asked. We never do: in that case we return
//!   the first highest-scoring placeholder-free set of the same partition (there always is one).
//! * `available` and `required` are sets: order and duplicates in the arguments do not matter (upstream's own
//!   allocator passes them sorted and distinct).
//! * Upstream re-uses slice storage between partitions; for 7 or more sets per partition this can overwrite the
//!   recorded best partition. We follow the algorithm's intent, not that accident.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::score::{GpuSetError, Topology};

/// Most distinct available GPUs one best-effort call accepts (GPU subsets are 64-bit masks).
pub const MAX_AVAILABLE: usize = 64;

/// Result of an allocation: the chosen GPUs (ascending) and their set score. Empty when nothing fits.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Allocation {
    /// Chosen GPU indices, ascending; empty when no set fits.
    pub devices: Vec<usize>,
    /// Set score of `devices` (0 when empty or a single GPU).
    pub score: u64,
}

impl Allocation {
    /// Whether nothing was allocated.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }
}

/// One set of a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionSet {
    /// Real GPUs of the set, ascending.
    pub devices: Vec<usize>,
    /// Placeholders in the set (0, or all of the partition's padding).
    pub padding: usize,
    /// Set score (placeholders score 0).
    pub score: u64,
}

/// The best-scoring partition chosen by the best-effort policy, and the sets picked from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BestPartition {
    /// Sets in upstream's order (by smallest member).
    pub sets: Vec<PartitionSet>,
    /// Partition score: sum of set scores.
    pub score: u64,
    /// Index in `sets` of the set upstream returns (possibly a padded one).
    pub upstream: usize,
    /// Index in `sets` of the set we return (never padded).
    pub chosen: usize,
}

/// The go-gpuallocator best-effort policy over a [`Topology`].
///
/// ```
/// use vgpu_core::topology::{BestEffortPolicy, Topology};
///
/// // 4 GPUs: NV2 bridges 0-3 and 1-2, NODE 0-1 and 2-3, SYS 0-2 and 1-3 (4×RTX8000).
/// let topology = Topology::decode(
///     r#"[{"index":0,"links":{"1":[2],"2":[1],"3":[8]}},{"index":1,"links":{"0":[2],"2":[8],"3":[1]}},
///        {"index":2,"links":{"0":[1],"1":[8],"3":[2]}},{"index":3,"links":{"0":[8],"1":[1],"2":[2]}}]"#,
/// )?;
/// let policy = BestEffortPolicy::new(&topology);
/// let got = policy.allocate(&[0, 1, 2, 3], &[], 2)?;
/// assert_eq!(got.devices, vec![0, 3]);
/// assert_eq!(got.score, 200);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct BestEffortPolicy<'a> {
    topology: &'a Topology,
}

impl<'a> BestEffortPolicy<'a> {
    /// A policy scoring with `topology`.
    pub fn new(topology: &'a Topology) -> Self {
        Self { topology }
    }

    /// Returns the set of `size` GPUs from `available` (including all of `required`) that upstream's best-effort
    /// policy returns, with its padding bug fixed: the set returned never holds a placeholder.
    ///
    /// Empty when `size == 0`, fewer than `size` GPUs are available, more than `size` are required, or a
    /// required GPU is not available. Errors only for GPU indices outside the topology or more than
    /// [`MAX_AVAILABLE`] available GPUs.
    pub fn allocate(
        &self,
        available: &[usize],
        required: &[usize],
        size: usize,
    ) -> Result<Allocation, GpuSetError> {
        Ok(match self.best_partition(available, required, size)? {
            Some(best) => match best.sets.into_iter().nth(best.chosen) {
                Some(set) => Allocation { devices: set.devices, score: set.score },
                None => Allocation::default(),
            },
            None => Allocation::default(),
        })
    }

    /// The winning partition and the sets upstream and we pick from it; `None` when nothing fits.
    ///
    /// For `size == 1` upstream does not partition: the "partition" is the single winning GPU.
    pub fn best_partition(
        &self,
        available: &[usize],
        required: &[usize],
        size: usize,
    ) -> Result<Option<BestPartition>, GpuSetError> {
        let available = self.topology.normalize(available)?;
        let required = self.topology.normalize(required)?;
        if available.len() > MAX_AVAILABLE {
            return Err(GpuSetError::TooManyGpus { count: available.len(), max: MAX_AVAILABLE });
        }
        let n = available.len();
        if size == 0 || n < size || required.len() > size {
            return Ok(None);
        }
        // Required GPUs as a local mask; one that is not available means no partition qualifies.
        let mut req = 0u64;
        for r in &required {
            match available.binary_search(r) {
                Ok(i) => req |= 1u64 << i,
                Err(_) => return Ok(None),
            }
        }
        if size == 1 {
            let first = if req == 0 { 0 } else { req.trailing_zeros() as usize };
            let Some(&gpu) = available.get(first) else { return Ok(None) };
            let set = PartitionSet { devices: vec![gpu], padding: 0, score: 0 };
            return Ok(Some(BestPartition { sets: vec![set], score: 0, upstream: 0, chosen: 0 }));
        }

        let mut solver = Solver::new(self.topology, &available, size, req);
        let full = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        let Some(score) = solver.solve(full) else { return Ok(None) };

        // Walk the memo along the optimal path; sets come out ordered by smallest member.
        let mut sets = Vec::new();
        let mut mask = full;
        while mask != 0 {
            let Some(block) = solver.first_set(mask) else { return Ok(None) };
            if block == 0 || block & !mask != 0 {
                return Ok(None);
            }
            let members: Vec<usize> = bits(block).collect();
            let padding = size - members.len();
            let set_score = solver.block_score(&members);
            sets.push(PartitionSet {
                devices: members.iter().filter_map(|&i| available.get(i).copied()).collect(),
                padding,
                score: set_score,
            });
            mask &= !block;
        }

        // Upstream: first highest-scoring set among those containing all required GPUs.
        let contains_required = |set: &PartitionSet| required.iter().all(|r| set.devices.contains(r));
        let first_best = |allow_padded: bool| {
            let mut pick: Option<(usize, u64)> = None;
            for (i, set) in sets.iter().enumerate() {
                if !contains_required(set) || (!allow_padded && set.padding > 0) {
                    continue;
                }
                if pick.is_none_or(|(_, s)| set.score > s) {
                    pick = Some((i, set.score));
                }
            }
            pick.map(|(i, _)| i)
        };
        let Some(upstream) = first_best(true) else { return Ok(None) };
        let chosen = if sets.get(upstream).is_some_and(|s| s.padding > 0) {
            match first_best(false) {
                Some(i) => i,
                None => return Ok(None),
            }
        } else {
            upstream
        };
        Ok(Some(BestPartition { sets, score, upstream, chosen }))
    }
}

/// Iterates the set bit positions of `mask`, ascending.
fn bits(mut mask: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if mask == 0 {
            None
        } else {
            let i = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            Some(i)
        }
    })
}

/// Cheap multiplicative hasher for 64-bit masks.
#[derive(Default)]
struct MaskHasher(u64);

impl Hasher for MaskHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, x: u64) {
        let h = (x ^ self.0).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 29);
    }
}

/// Memo entry: best score of partitioning a mask (`None`: infeasible) and the first set of that partition.
#[derive(Debug, Clone, Copy)]
struct Entry {
    value: Option<u64>,
    block: u64,
}

/// Most available GPUs for which the memo is a dense array indexed by mask (and the plain dynamic programme is
/// used instead of the best-first search).
const DENSE_MAX: usize = 20;

/// Candidate sets the best-first search generates (dense memo) before handing over to the plain programme.
const BEST_FIRST_BUDGET: usize = 2_000;

/// Memoised `best(M)`: dense arrays indexed by mask for small GPU counts (values only, with "solved" and
/// "feasible" bitsets; first sets are re-derived along the winning path), a hash map otherwise.
enum Memo {
    Dense { solved: Vec<u64>, feasible: Vec<u64>, value: Vec<u64> },
    Sparse(HashMap<u64, Entry, BuildHasherDefault<MaskHasher>>),
}

impl Memo {
    fn new(n: usize) -> Self {
        if n <= DENSE_MAX {
            let words = (1usize << n).div_ceil(64);
            Memo::Dense { solved: vec![0; words], feasible: vec![0; words], value: vec![0; 1usize << n] }
        } else {
            Memo::Sparse(HashMap::with_capacity_and_hasher(1024, BuildHasherDefault::default()))
        }
    }

    /// The memoised value of `mask` (`Some(None)`: infeasible); dense entries carry no first set (`block` 0).
    #[inline]
    fn get(&self, mask: u64) -> Option<Entry> {
        match self {
            Memo::Dense { solved, feasible, value } => {
                let (word, bit) = ((mask >> 6) as usize, 1u64 << (mask & 63));
                if solved.get(word).is_none_or(|w| w & bit == 0) {
                    None
                } else if feasible.get(word).is_some_and(|w| w & bit != 0) {
                    Some(Entry { value: value.get(mask as usize).copied(), block: 0 })
                } else {
                    Some(Entry { value: None, block: 0 })
                }
            }
            Memo::Sparse(map) => map.get(&mask).copied(),
        }
    }

    #[inline]
    fn insert(&mut self, mask: u64, entry: Entry) {
        match self {
            Memo::Dense { solved, feasible, value } => {
                let (word, bit) = ((mask >> 6) as usize, 1u64 << (mask & 63));
                if let Some(w) = solved.get_mut(word) {
                    *w |= bit;
                }
                if let Some(v) = entry.value {
                    if let Some(w) = feasible.get_mut(word) {
                        *w |= bit;
                    }
                    if let Some(slot) = value.get_mut(mask as usize) {
                        *slot = v;
                    }
                }
            }
            Memo::Sparse(map) => {
                map.insert(mask, entry);
            }
        }
    }
}

/// A candidate first set of a mask, with what is known about the best total through it.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    /// Twice an upper bound on `score + best(rest)` (exact when `exact`).
    bound2: u64,
    /// Score of the set.
    score: u64,
    /// The set (local mask).
    block: u64,
    /// Position in upstream's visiting order (ties go to the smaller).
    seq: u32,
    /// `bound2` is exact (the rest is memoised or a single final set).
    exact: bool,
}

/// Exact solver over local GPU indices `0..n` (positions in the sorted available list).
struct Solver {
    n: usize,
    size: usize,
    padding: usize,
    required: u64,
    /// Local pair scores, row-major `n × n`.
    w: Vec<u64>,
    /// Per GPU: peers with a positive pair score, best first.
    neighbours: Vec<Vec<(u64, u8)>>,
    memo: Memo,
    /// Candidates the best-first search may still generate before switching to the plain dynamic programme
    /// (dense memo only; both store the same exact values).
    budget: usize,
    /// First sets of the masks the best-first search solved (dense memo only; it stores values alone).
    blocks: HashMap<u64, u64, BuildHasherDefault<MaskHasher>>,
}

impl Solver {
    fn new(topology: &Topology, available: &[usize], size: usize, required: u64) -> Self {
        let n = available.len();
        let mut w = vec![0u64; n * n];
        let mut neighbours = Vec::with_capacity(n);
        for (i, &a) in available.iter().enumerate() {
            let mut row = Vec::new();
            for (j, &b) in available.iter().enumerate() {
                let s = if i == j { 0 } else { topology.pair(a, b) };
                w[i * n + j] = s;
                if s > 0 {
                    row.push((s, j as u8));
                }
            }
            row.sort_unstable_by(|x, y| y.cmp(x));
            neighbours.push(row);
        }
        let budget = if n <= DENSE_MAX { BEST_FIRST_BUDGET } else { usize::MAX };
        Self {
            n,
            size,
            padding: (size - n % size) % size,
            required,
            w,
            neighbours,
            memo: Memo::new(n),
            blocks: HashMap::default(),
            budget,
        }
    }

    fn block_score(&self, members: &[usize]) -> u64 {
        let mut total = 0u64;
        for (i, &a) in members.iter().enumerate() {
            for &b in &members[i + 1..] {
                total = total.saturating_add(self.w[a * self.n + b]);
            }
        }
        total
    }

    fn mask_score(&self, mask: u64) -> u64 {
        let mut total = 0u64;
        let mut rest = mask;
        while rest != 0 {
            let a = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            let row = &self.w[a * self.n..(a + 1) * self.n];
            total = bits(rest).fold(total, |acc, b| acc.saturating_add(row[b]));
        }
        total
    }

    /// Whether a set may appear in a qualifying partition: a set meeting the required GPUs holds all of them
    /// and no placeholder.
    fn allowed(&self, block: u64, full: bool) -> bool {
        let hit = block & self.required;
        hit == 0 || (hit == self.required && full)
    }

    /// Upstream's padding rule: placeholders remain while the real count is not a multiple of the size.
    fn pending(&self, mask: u64) -> bool {
        self.padding > 0 && !(mask.count_ones() as usize).is_multiple_of(self.size)
    }

    /// For a mask that upstream closes as one last set: `Some(its best score or None if not allowed)`.
    fn terminal(&self, mask: u64) -> Option<Option<u64>> {
        let count = mask.count_ones() as usize;
        let pending = self.pending(mask);
        if (pending && count == self.size - self.padding) || (!pending && count == self.size) {
            Some(self.allowed(mask, !pending).then(|| self.mask_score(mask)))
        } else {
            None
        }
    }

    /// The first set of the memoised best partition of `mask`.
    fn first_set(&mut self, mask: u64) -> Option<u64> {
        if let Memo::Dense { .. } = self.memo {
            if let Some(&block) = self.blocks.get(&mask) {
                return self.memo.get(mask).and_then(|e| e.value).map(|_| block);
            }
            return match self.terminal(mask) {
                Some(t) => t.map(|_| mask),
                None => {
                    let e = self.search_dense(mask);
                    e.value.map(|_| e.block)
                }
            };
        }
        match self.memo.get(mask) {
            Some(e) => e.value.map(|_| e.block),
            None => self.terminal(mask).flatten().map(|_| mask),
        }
    }

    /// Best score of partitioning `mask` (`None`: no qualifying partition); memoises the first set of the
    /// first best partition in upstream's order.
    fn solve(&mut self, mask: u64) -> Option<u64> {
        if mask == 0 {
            return Some(0);
        }
        if self.budget == 0 {
            return self.solve_dense(mask);
        }
        if let Some(t) = self.terminal(mask) {
            return t;
        }
        if let Some(e) = self.memo.get(mask) {
            return e.value;
        }
        let mut candidates = self.candidates(mask);
        if let Memo::Dense { .. } = self.memo {
            // Best-first pays per candidate; past the budget the plain programme is cheaper (same exact values).
            self.budget = self.budget.saturating_sub(candidates.len().max(1));
        }
        if candidates.iter().all(|c| c.exact) {
            // Every total is known: the first maximum in upstream's order wins.
            let mut best: Option<Candidate> = None;
            for c in candidates {
                if best.is_none_or(|b| c.bound2 > b.bound2) {
                    best = Some(c);
                }
            }
            let entry = match best {
                Some(c) => Entry { value: Some(c.bound2 / 2), block: c.block },
                None => Entry { value: None, block: 0 },
            };
            self.record(mask, entry);
            return entry.value;
        }
        // Best-first; among equal bounds, upstream's order.
        candidates.sort_unstable_by(|a, b| b.bound2.cmp(&a.bound2).then(a.seq.cmp(&b.seq)));
        let mut best: Option<(u64, u64, u32)> = None; // (total, block, seq)
        for c in candidates {
            if let Some((total, _, seq)) = best {
                let total2 = total.saturating_mul(2);
                if c.bound2 < total2 {
                    break;
                }
                if c.bound2 == total2 && c.seq > seq {
                    continue;
                }
            }
            let total = if c.exact {
                c.bound2 / 2
            } else {
                match self.solve(mask & !c.block) {
                    Some(v) => c.score.saturating_add(v),
                    None => continue,
                }
            };
            let better = match best {
                None => true,
                Some((b, _, seq)) => total > b || (total == b && c.seq < seq),
            };
            if better {
                best = Some((total, c.block, c.seq));
            }
        }
        let entry = match best {
            Some((total, block, _)) => Entry { value: Some(total), block },
            None => Entry { value: None, block: 0 },
        };
        self.record(mask, entry);
        entry.value
    }

    /// Memoises a best-first result (keeping its first set aside when the memo is dense).
    fn record(&mut self, mask: u64, entry: Entry) {
        if let Memo::Dense { .. } = self.memo {
            self.blocks.insert(mask, entry.block);
        }
        self.memo.insert(mask, entry);
    }

    /// Plain dynamic programme (dense memo): `best(mask)` from every allowed first set in upstream's order, the
    /// incumbent replaced only on a strictly greater total. Terminal masks are memoised too.
    fn solve_dense(&mut self, mask: u64) -> Option<u64> {
        if mask == 0 {
            return Some(0);
        }
        if let Some(e) = self.memo.get(mask) {
            return e.value;
        }
        let entry = match self.terminal(mask) {
            Some(Some(v)) => Entry { value: Some(v), block: mask },
            Some(None) => Entry { value: None, block: 0 },
            None => self.search_dense(mask),
        };
        self.memo.insert(mask, entry);
        entry.value
    }

    /// The first best set of non-terminal `mask` in upstream's order, and the best total.
    fn search_dense(&mut self, mask: u64) -> Entry {
        let first = mask.trailing_zeros() as usize;
        let mut rest = [0u8; 64];
        let mut len = 0;
        for i in bits(mask & (mask - 1)) {
            rest[len] = i as u8;
            len += 1;
        }
        let mut chosen = [0u8; 64];
        chosen[0] = first as u8;
        let walk = Walk { rest: &rest[..len], pending: self.pending(mask) };
        let mut best = Entry { value: None, block: 0 };
        let incumbent = &mut best;
        // The plain dynamic programme evaluates each completion as it is enumerated.
        self.extend(&walk, 0, 1, 1u64 << first, 0, &mut chosen, &mut move |solver, block, score, full| {
            solver.consider(mask, block, score, full, incumbent)
        });
        best
    }

    /// Offers first set `block` of `mask` (if allowed) to the incumbent `best`: replaces it on a strictly
    /// greater total only, so the first best in upstream's order wins.
    #[inline]
    fn consider(&mut self, mask: u64, block: u64, score: u64, full: bool, best: &mut Entry) {
        if !self.allowed(block, full) {
            return;
        }
        let Some(v) = self.solve_dense(mask & !block) else { return };
        let total = score.saturating_add(v);
        if best.value.is_none_or(|b| total > b) {
            *best = Entry { value: Some(total), block };
        }
    }

    /// Every allowed first set of `mask` (the set holding its smallest GPU), in upstream's order.
    fn candidates(&mut self, mask: u64) -> Vec<Candidate> {
        let first = mask.trailing_zeros() as usize;
        let mut rest = [0u8; 64];
        let mut len = 0;
        for i in bits(mask & (mask - 1)) {
            rest[len] = i as u8;
            len += 1;
        }
        let mut chosen = [0u8; 64];
        chosen[0] = first as u8;
        let walk = Walk { rest: &rest[..len], pending: self.pending(mask) };
        let mut out = Vec::new();
        let sink = &mut out;
        self.extend(&walk, 0, 1, 1u64 << first, 0, &mut chosen, &mut move |solver, block, score, full| {
            solver.push(mask, block, score, full, sink)
        });
        out
    }

    /// Enumerates the completions of the partial set `chosen[..depth]` (members in `block`, pair score
    /// `score`) in upstream's order and hands each to `sink` as `(self, block, score, full)`; `full` is false
    /// for a short set that placeholders close. The best-first search collects them ([`Self::candidates`]),
    /// the plain programme evaluates them on the spot ([`Self::search_dense`]).
    #[allow(clippy::too_many_arguments)]
    fn extend<F: FnMut(&mut Self, u64, u64, bool)>(
        &mut self,
        walk: &Walk<'_>,
        start: usize,
        depth: usize,
        block: u64,
        score: u64,
        chosen: &mut [u8; 64],
        sink: &mut F,
    ) {
        let slots = self.size - depth;
        if slots == 0 {
            sink(self, block, score, true);
            return;
        }
        let pad = if walk.pending { self.padding } else { 0 };
        let len = walk.rest.len();
        for j in start..len {
            if len - j - 1 + pad < slots - 1 {
                break;
            }
            let e = walk.rest[j] as usize;
            let row = &self.w[e * self.n..(e + 1) * self.n];
            let add = chosen[..depth].iter().fold(0u64, |acc, &c| acc.saturating_add(row[c as usize]));
            chosen[depth] = e as u8;
            self.extend(walk, j + 1, depth + 1, block | (1u64 << e), score.saturating_add(add), chosen, sink);
        }
        // Placeholders sort after every real GPU: the short set closes this prefix's completions.
        if walk.pending && slots == self.padding {
            sink(self, block, score, false);
        }
    }

    /// Records candidate first set `block` of `mask` (if allowed) with its bound.
    fn push(&self, mask: u64, block: u64, score: u64, full: bool, out: &mut Vec<Candidate>) {
        let seq = out.len() as u32;
        if !self.allowed(block, full) {
            return;
        }
        let rest = mask & !block;
        let known = if rest == 0 {
            Some(Some(0))
        } else {
            self.terminal(rest).or_else(|| self.memo.get(rest).map(|e| e.value))
        };
        let candidate = match known {
            Some(None) => return,
            Some(Some(v)) => Candidate {
                bound2: score.saturating_add(v).saturating_mul(2),
                score,
                block,
                seq,
                exact: true,
            },
            None => Candidate {
                bound2: score.saturating_mul(2).saturating_add(self.bound2(rest)),
                score,
                block,
                seq,
                exact: false,
            },
        };
        out.push(candidate);
    }

    /// Twice an upper bound on the best partition score of `mask`: for every GPU, its `size − 1` best pair
    /// scores inside the mask.
    fn bound2(&self, mask: u64) -> u64 {
        let k = self.size - 1;
        let mut total = 0u64;
        for v in bits(mask) {
            let mut taken = 0;
            for &(s, u) in &self.neighbours[v] {
                if mask & (1u64 << u) != 0 {
                    total = total.saturating_add(s);
                    taken += 1;
                    if taken == k {
                        break;
                    }
                }
            }
        }
        total
    }
}

/// The members after the smallest of the mask being partitioned, and whether placeholders remain for it.
struct Walk<'r> {
    rest: &'r [u8],
    pending: bool,
}

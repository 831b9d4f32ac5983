//! The cache's node index: slots by exact name, and rank-table rows by name fingerprint.
//!
//! A filter resolves thousands of candidate names per call, in an order that changes from call to call
//! (kube-scheduler's parallel node filter appends feasible nodes as its workers finish). A `String`-keyed map
//! compares each probe against a key stored in its own heap allocation: one more cold cache line per name.
//! Ranking therefore resolves names through a second map keyed by a 64-bit randomly seeded hash of the name,
//! with 32 bits of a second, independent hash kept beside the row as a check, in 16-byte buckets (1 MiB at
//! 50,000 nodes, so the table mostly stays in a core's L2 cache while a filter resolves every name).
//!
//! - A key found with a matching check is the name's row. A wrong row needs two names agreeing in all 96 bits
//!   (probability about `n² / 2⁹⁷`, 2·10⁻²⁰ for 50,000 nodes), and even then only ranking reads the wrong row:
//!   every node an allocation is tried on is looked up again by exact name ([`NodeIndex::get`]).
//! - Otherwise (a name the index does not hold, or two held names sharing a 64-bit key, about `n² / 2⁶⁵`,
//!   7·10⁻¹¹ for 50,000 nodes) the name is resolved by exact name: one more lookup for an unknown name.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

use crate::names::CandidateNames;
use crate::node_state::NodeSlot;
use crate::rank_table::NO_ROW;

/// A node of the index: its slot and its rank-table row.
#[derive(Debug)]
pub(crate) struct NodeEntry {
    pub(crate) slot: NodeSlot,
    pub(crate) row: u32,
}

/// Hashes a fingerprint for the map: its low 64 bits (already uniformly distributed).
#[derive(Debug, Default)]
struct PrintHasher(u64);

impl Hasher for PrintHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// Two randomly seeded hashers; a name's fingerprint is the first hash (the map key) and 32 bits of the second
/// (kept with the row).
#[derive(Debug, Default)]
struct Fingerprinter {
    high: foldhash::quality::RandomState,
    low: foldhash::quality::RandomState,
    /// Tests: keys of 2 bits, so that names share keys.
    #[cfg(test)]
    colliding: bool,
}

impl Fingerprinter {
    fn of(&self, name: &str) -> (u64, u32) {
        let key = self.high.hash_one(name);
        #[cfg(test)]
        let key = if self.colliding { key & 3 } else { key };
        (key, self.low.hash_one(name) as u32)
    }
}

/// A row and the check bits of its name's fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Printed {
    row: u32,
    check: u32,
}

/// Slots by name and rows by fingerprint, always changed together.
#[derive(Debug, Default)]
pub(crate) struct NodeIndex {
    by_name: HashMap<String, NodeEntry, foldhash::fast::RandomState>,
    by_print: HashMap<u64, Printed, BuildHasherDefault<PrintHasher>>,
    prints: Fingerprinter,
    /// Bumped by every insert and remove: while it stays the same, every name keeps its row.
    generation: u64,
}

impl NodeIndex {
    /// The entry of a name (exact).
    pub(crate) fn get(&self, name: &str) -> Option<&NodeEntry> {
        self.by_name.get(name)
    }

    /// The rank-table row of a name by fingerprint ([`NO_ROW`] when unknown): one name of
    /// [`rows_of`](Self::rows_of), written plainly (tests compare the two).
    #[cfg(test)]
    pub(crate) fn row_of(&self, name: &str) -> u32 {
        let (key, check) = self.prints.of(name);
        match self.by_print.get(&key) {
            Some(p) if p.check == check => p.row,
            _ => self.by_name.get(name).map_or(NO_ROW, |e| e.row),
        }
    }

    /// [`row_of`](Self::row_of) of every name, in order. Two passes: every fingerprint first, then the probes,
    /// whose loop is short enough for the processor to keep several of their cache misses in flight at once.
    pub(crate) fn rows_of(&self, names: &CandidateNames) -> Vec<u32> {
        let prints: Vec<(u64, u32)> = names.iter().map(|n| self.prints.of(n)).collect();
        let mut rows: Vec<u32> = prints
            .iter()
            .map(|(key, check)| match self.by_print.get(key) {
                Some(p) if p.check == *check => p.row,
                _ => NO_ROW,
            })
            .collect();
        for (row, name) in rows.iter_mut().zip(names) {
            if *row == NO_ROW {
                *row = self.by_name.get(name).map_or(NO_ROW, |e| e.row);
            }
        }
        rows
    }

    /// Adds or replaces a node.
    pub(crate) fn insert(&mut self, name: String, entry: NodeEntry) {
        self.generation = self.generation.wrapping_add(1);
        let (key, check) = self.prints.of(&name);
        self.by_print.insert(key, Printed { row: entry.row, check });
        self.by_name.insert(name, entry);
    }

    /// Removes a node.
    pub(crate) fn remove(&mut self, name: &str) -> Option<NodeEntry> {
        let entry = self.by_name.remove(name)?;
        self.generation = self.generation.wrapping_add(1);
        let (key, check) = self.prints.of(name);
        if self.by_print.get(&key) == Some(&Printed { row: entry.row, check }) {
            self.by_print.remove(&key);
        }
        Some(entry)
    }

    /// Changes with every insert and remove (rows of names stay as they were while it does not).
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Number of nodes.
    pub(crate) fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Every node.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&String, &NodeEntry)> {
        self.by_name.iter()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::cache::ClusterCache;

    fn slot() -> NodeSlot {
        let cache = ClusterCache::new(Default::default(), 0);
        cache.upsert_node(&crate::cluster::Node { name: "x".into(), ..Default::default() });
        cache.node("x").unwrap()
    }

    proptest! {
        /// After any inserts and removes, lookups by name and by fingerprint agree with a plain map, also when
        /// names share keys.
        #[test]
        fn fingerprints_follow_the_names(
            ops in proptest::collection::vec((any::<bool>(), 0u8..12), 0..80),
            colliding in any::<bool>(),
        ) {
            let mut index = NodeIndex::default();
            index.prints.colliding = colliding;
            let mut model: HashMap<String, u32> = HashMap::new();
            let s = slot();
            for (i, (insert, n)) in ops.into_iter().enumerate() {
                let name = format!("node-{n}");
                if insert {
                    index.insert(name.clone(), NodeEntry { slot: s.clone(), row: i as u32 });
                    model.insert(name, i as u32);
                } else {
                    prop_assert_eq!(index.remove(&name).map(|e| e.row), model.remove(&name));
                }
                for k in 0..12u8 {
                    let name = format!("node-{k}");
                    let want = model.get(&name).copied();
                    prop_assert_eq!(index.get(&name).map(|e| e.row), want);
                    prop_assert_eq!(index.row_of(&name), want.unwrap_or(NO_ROW));
                }
                let all: Vec<String> = (0..12u8).rev().map(|k| format!("node-{k}")).collect();
                let want: Vec<u32> = all.iter().map(|n| model.get(n).copied().unwrap_or(NO_ROW)).collect();
                prop_assert_eq!(index.rows_of(&CandidateNames::from(&all[..])), want);
                prop_assert_eq!(index.iter().count(), model.len());
                prop_assert_eq!(index.len(), model.len());
            }
        }
    }
}

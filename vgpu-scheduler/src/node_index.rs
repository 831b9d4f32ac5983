//! The cache's node index: slots by exact name, and rank-table rows by name fingerprint.
//!
//! A filter resolves thousands of candidate names per call, in an order that changes from call to call
//! (kube-scheduler's parallel node filter appends feasible nodes as its workers finish). A `String`-keyed map
//! compares each probe against a key stored in its own heap allocation: one more cold cache line per name.
//! Ranking therefore resolves names through a second map keyed by a 128-bit fingerprint of the name (two
//! independently, randomly seeded hashes), stored inline in the map's buckets. Fingerprints of distinct names
//! collide with probability about `n² / 2¹²⁹` (10⁻³¹ for 5,000 nodes), and even then only ranking would read
//! the wrong row: every node an allocation is tried on is looked up again by exact name ([`NodeIndex::get`]).

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

use crate::cache::NodeSlot;
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

    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

/// Two randomly seeded hashers; a name's fingerprint is both hashes side by side.
#[derive(Debug, Default)]
struct Fingerprinter {
    high: foldhash::quality::RandomState,
    low: foldhash::quality::RandomState,
}

impl Fingerprinter {
    fn of(&self, name: &str) -> u128 {
        (u128::from(self.high.hash_one(name)) << 64) | u128::from(self.low.hash_one(name))
    }
}

/// Slots by name and rows by fingerprint, always changed together.
#[derive(Debug, Default)]
pub(crate) struct NodeIndex {
    by_name: HashMap<String, NodeEntry, foldhash::fast::RandomState>,
    by_print: HashMap<u128, u32, BuildHasherDefault<PrintHasher>>,
    prints: Fingerprinter,
    /// Bumped by every insert and remove: while it stays the same, every name keeps its row.
    generation: u64,
}

impl NodeIndex {
    /// The entry of a name (exact).
    pub(crate) fn get(&self, name: &str) -> Option<&NodeEntry> {
        self.by_name.get(name)
    }

    /// The rank-table row of a name by fingerprint ([`NO_ROW`] when unknown).
    pub(crate) fn row_of(&self, name: &str) -> u32 {
        self.by_print.get(&self.prints.of(name)).copied().unwrap_or(NO_ROW)
    }

    /// Adds or replaces a node.
    pub(crate) fn insert(&mut self, name: String, entry: NodeEntry) {
        self.generation = self.generation.wrapping_add(1);
        self.by_print.insert(self.prints.of(&name), entry.row);
        self.by_name.insert(name, entry);
    }

    /// Removes a node.
    pub(crate) fn remove(&mut self, name: &str) -> Option<NodeEntry> {
        let entry = self.by_name.remove(name)?;
        self.generation = self.generation.wrapping_add(1);
        let print = self.prints.of(name);
        if self.by_print.get(&print) == Some(&entry.row) {
            self.by_print.remove(&print);
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
        /// After any inserts and removes, lookups by name and by fingerprint agree with a plain map.
        #[test]
        fn fingerprints_follow_the_names(ops in proptest::collection::vec((any::<bool>(), 0u8..12), 0..80)) {
            let mut index = NodeIndex::default();
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
                prop_assert_eq!(index.iter().count(), model.len());
                prop_assert_eq!(index.len(), model.len());
            }
        }
    }
}

//! Validated link topology and go-gpuallocator pair / set scores.

use super::codec::{DeviceTopology, TopologyDecodeError};
use super::link_type::P2PLinkType;

/// Why a [`DeviceTopology`] cannot be turned into a scored [`Topology`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// The annotation value did not decode.
    #[error(transparent)]
    Decode(#[from] TopologyDecodeError),
    /// Two entries describe the same GPU index.
    #[error("GPU {index} is listed more than once in the topology")]
    DuplicateGpu {
        /// The repeated GPU index.
        index: usize,
    },
    /// GPU indices must be exactly `0..count`; this one is missing.
    #[error("GPU {index} is missing from the topology: expected indices 0..{count}")]
    MissingGpu {
        /// The missing GPU index.
        index: usize,
        /// Number of GPU entries.
        count: usize,
    },
    /// A GPU lists links to a peer that is not in the topology.
    #[error(
        "GPU {gpu} lists links to GPU {peer}, which is not in the topology (expected a peer in 0..{count})"
    )]
    UnknownPeer {
        /// The GPU whose entry names the peer.
        gpu: usize,
        /// The unknown peer index.
        peer: usize,
        /// Number of GPUs in the topology.
        count: usize,
    },
    /// A GPU lists links to itself.
    #[error("GPU {gpu} lists links to itself; expected links to peers only")]
    SelfLink {
        /// The GPU.
        gpu: usize,
    },
    /// The links from `a` to `b` differ from the links from `b` to `a` (as multisets of link types); only
    /// [`Topology::new`] refuses this, [`Topology::new_lenient`] scores the pair 0 instead.
    #[error(
        "asymmetric links between GPU {a} and GPU {b}: {a}→{b} is {forward:?} but {b}→{a} is {backward:?}"
    )]
    Asymmetric {
        /// The lower GPU index.
        a: usize,
        /// The higher GPU index.
        b: usize,
        /// Link types listed by `a` for `b`.
        forward: Vec<P2PLinkType>,
        /// Link types listed by `b` for `a`.
        backward: Vec<P2PLinkType>,
    },
}

impl From<AsymmetricPair> for TopologyError {
    fn from(p: AsymmetricPair) -> Self {
        Self::Asymmetric { a: p.a, b: p.b, forward: p.forward, backward: p.backward }
    }
}

/// A GPU set argument names GPUs the topology does not have, or more than an allocation can handle.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuSetError {
    /// A GPU index outside the topology.
    #[error("GPU {index} is not in the topology (expected an index in 0..{count})")]
    UnknownGpu {
        /// The offending index.
        index: usize,
        /// Number of GPUs in the topology.
        count: usize,
    },
    /// More available GPUs than the optimizer supports in one call.
    #[error("{count} GPUs available; at most {max} are supported in one allocation")]
    TooManyGpus {
        /// Distinct available GPUs given.
        count: usize,
        /// The limit.
        max: usize,
    },
}

/// A GPU pair whose links disagree: the links `a` lists for `b` differ from the links `b` lists for `a` (as
/// multisets of link types; a missing entry is the empty list).
///
/// [`Topology::new`] refuses a topology with such a pair ([`TopologyError::Asymmetric`]);
/// [`Topology::new_lenient`] keeps it and scores the pair 0 (no link benefit, as if the GPUs had no link), so
/// one inconsistent pair never costs a node the rest of its topology; its callers report the pairs
/// ([`Topology::asymmetric_pairs`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("asymmetric links between GPU {a} and GPU {b}: {a}→{b} is {forward:?} but {b}→{a} is {backward:?}")]
pub struct AsymmetricPair {
    /// The lower GPU index.
    pub a: usize,
    /// The higher GPU index.
    pub b: usize,
    /// Link types listed by `a` for `b`.
    pub forward: Vec<P2PLinkType>,
    /// Link types listed by `b` for `a`.
    pub backward: Vec<P2PLinkType>,
}

/// Score of one link list: the sum of the go-gpuallocator weights of its entries.
pub fn link_score(links: &[P2PLinkType]) -> u64 {
    links.iter().fold(0u64, |acc, t| acc.saturating_add(t.weight()))
}

/// A validated GPU link topology with precomputed pair scores (go-gpuallocator weights).
///
/// GPU indices are `0..len()`. Pair scores are symmetric by construction: building one from asymmetric data
/// is an error ([`new`](Self::new)) or scores the disagreeing pairs 0 ([`new_lenient`](Self::new_lenient)),
/// never a panic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    len: usize,
    /// Row-major `len × len` pair scores; the diagonal is 0.
    scores: Vec<u64>,
    /// Pairs scored 0 because their links disagree, sorted by `(a, b)`.
    asymmetric: Vec<AsymmetricPair>,
}

impl Topology {
    /// Validates `topology` and computes its pair scores.
    ///
    /// Requires GPU indices to be exactly `0..n` (any order), every peer to be one of them, no self links, and
    /// the link list `a→b` to equal `b→a` as a multiset. A peer with no entry at all means "no link" (score 0)
    /// and must be absent (or empty) in both directions. The first disagreeing pair (lowest `(a, b)`) is the
    /// [`TopologyError::Asymmetric`].
    pub fn new(topology: &DeviceTopology) -> Result<Self, TopologyError> {
        let t = Self::new_lenient(topology)?;
        match t.asymmetric.first() {
            Some(pair) => Err(pair.clone().into()),
            None => Ok(t),
        }
    }

    /// [`new`](Self::new) except for asymmetry: a pair whose link list `a→b` differs from `b→a` as a multiset
    /// (one direction missing included) scores 0, as if the GPUs had no link, and is listed in
    /// [`asymmetric_pairs`](Self::asymmetric_pairs); every other pair keeps its score. Every other check of
    /// [`new`](Self::new) still fails the whole topology. For a node's published annotation, where one bad pair
    /// should not cost the node its topology.
    pub fn new_lenient(topology: &DeviceTopology) -> Result<Self, TopologyError> {
        let n = topology.gpus.len();
        let mut rows: Vec<Option<&super::codec::GpuLinks>> = vec![None; n];
        for gpu in &topology.gpus {
            match rows.get_mut(gpu.index) {
                Some(slot @ None) => *slot = Some(gpu),
                Some(Some(_)) => return Err(TopologyError::DuplicateGpu { index: gpu.index }),
                None => {
                    // Out of range: some index below n must then be missing; report the first.
                    let index = first_missing(topology, n);
                    return Err(TopologyError::MissingGpu { index, count: n });
                }
            }
        }
        let mut scores = vec![0u64; n * n];
        let mut asymmetric = Vec::new();
        let empty = Vec::new();
        for (a, row) in rows.iter().enumerate() {
            let Some(row) = row else {
                return Err(TopologyError::MissingGpu { index: a, count: n });
            };
            for (&b, forward) in &row.links {
                if b == a {
                    return Err(TopologyError::SelfLink { gpu: a });
                }
                let Some(Some(peer_row)) = rows.get(b) else {
                    return Err(TopologyError::UnknownPeer { gpu: a, peer: b, count: n });
                };
                let backward = peer_row.links.get(&a);
                if !same_multiset(forward, backward.unwrap_or(&empty)) {
                    // Record each pair once: from its lower index, or from the higher one when the lower
                    // lists nothing for it (then the lower row never visits the pair).
                    if a < b || backward.is_none() {
                        let backward = backward.cloned().unwrap_or_default();
                        let (lo, hi, f, bk) = if a < b {
                            (a, b, forward.clone(), backward)
                        } else {
                            (b, a, backward, forward.clone())
                        };
                        asymmetric.push(AsymmetricPair { a: lo, b: hi, forward: f, backward: bk });
                    }
                    continue;
                }
                if let Some(cell) = scores.get_mut(a * n + b) {
                    *cell = link_score(forward);
                }
            }
        }
        asymmetric.sort_unstable_by_key(|p: &AsymmetricPair| (p.a, p.b));
        Ok(Self { len: n, scores, asymmetric })
    }

    /// Decodes a `node-device-topology` annotation value and validates it ([`new`](Self::new)).
    pub fn decode(annotation: &str) -> Result<Self, TopologyError> {
        Self::new(&DeviceTopology::decode(annotation)?)
    }

    /// Decodes a `node-device-topology` annotation value and validates it leniently
    /// ([`new_lenient`](Self::new_lenient)).
    pub fn decode_lenient(annotation: &str) -> Result<Self, TopologyError> {
        Self::new_lenient(&DeviceTopology::decode(annotation)?)
    }

    /// Builds a topology directly from a symmetric pair-score function (for synthetic topologies).
    ///
    /// Only `score(a, b)` with `a < b` is consulted; the diagonal is 0.
    pub fn from_pair_scores(len: usize, mut score: impl FnMut(usize, usize) -> u64) -> Self {
        let mut scores = vec![0u64; len * len];
        for a in 0..len {
            for b in a + 1..len {
                let s = score(a, b);
                if let Some(c) = scores.get_mut(a * len + b) {
                    *c = s;
                }
                if let Some(c) = scores.get_mut(b * len + a) {
                    *c = s;
                }
            }
        }
        Self { len, scores, asymmetric: Vec::new() }
    }

    /// The pairs whose two directions disagree, sorted by `(a, b)`, each once: they score 0. Empty for a
    /// consistent topology.
    pub fn asymmetric_pairs(&self) -> &[AsymmetricPair] {
        &self.asymmetric
    }

    /// Number of GPUs.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the topology has no GPUs.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Pair score of two GPUs: the sum of the weights of all link entries between them (0 for `a == b`).
    pub fn pair_score(&self, a: usize, b: usize) -> Result<u64, GpuSetError> {
        self.check(a)?;
        self.check(b)?;
        Ok(self.pair(a, b))
    }

    /// Set score: the sum of pair scores over all pairs of distinct GPUs in `set` (duplicates ignored).
    pub fn set_score(&self, set: &[usize]) -> Result<u64, GpuSetError> {
        let set = self.normalize(set)?;
        let mut total = 0u64;
        for (i, &a) in set.iter().enumerate() {
            for &b in set.iter().skip(i + 1) {
                total = total.saturating_add(self.pair(a, b));
            }
        }
        Ok(total)
    }

    /// Unchecked-index pair score (0 when out of range); callers validate first.
    pub(crate) fn pair(&self, a: usize, b: usize) -> u64 {
        self.scores.get(a * self.len + b).copied().unwrap_or(0)
    }

    /// Sorted, deduplicated copy of `set`, or the first index outside the topology.
    pub(crate) fn normalize(&self, set: &[usize]) -> Result<Vec<usize>, GpuSetError> {
        for &i in set {
            self.check(i)?;
        }
        let mut v = set.to_vec();
        v.sort_unstable();
        v.dedup();
        Ok(v)
    }

    fn check(&self, index: usize) -> Result<(), GpuSetError> {
        if index < self.len { Ok(()) } else { Err(GpuSetError::UnknownGpu { index, count: self.len }) }
    }
}

impl TryFrom<&DeviceTopology> for Topology {
    type Error = TopologyError;
    fn try_from(value: &DeviceTopology) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl std::str::FromStr for Topology {
    type Err = TopologyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::decode(s)
    }
}

fn first_missing(topology: &DeviceTopology, n: usize) -> usize {
    let mut seen = vec![false; n];
    for g in &topology.gpus {
        if let Some(s) = seen.get_mut(g.index) {
            *s = true;
        }
    }
    seen.iter().position(|s| !s).unwrap_or(0)
}

fn same_multiset(a: &[P2PLinkType], b: &[P2PLinkType]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut x = a.to_vec();
    let mut y = b.to_vec();
    x.sort_unstable();
    y.sort_unstable();
    x == y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_pair_scores() {
        // NV1+PIX = 150, NV2+PHB = 230, NV2+SYS = 210, SYS = 10.
        let t = Topology::decode(
            r#"[{"index":0,"links":{"1":[7,5],"2":[8,3],"3":[8,1]}},{"index":1,"links":{"0":[5,7],"2":[1]}},
               {"index":2,"links":{"0":[8,3],"1":[1]}},{"index":3,"links":{"0":[1,8]}}]"#,
        )
        .unwrap();
        assert_eq!(t.pair_score(0, 1), Ok(150));
        assert_eq!(t.pair_score(1, 0), Ok(150));
        assert_eq!(t.pair_score(0, 2), Ok(230));
        assert_eq!(t.pair_score(0, 3), Ok(210));
        assert_eq!(t.pair_score(1, 3), Ok(0));
        assert_eq!(t.pair_score(2, 2), Ok(0));
        assert_eq!(t.set_score(&[0, 1, 2]), Ok(150 + 230 + 10));
        assert_eq!(t.set_score(&[2, 0, 1, 0]), Ok(390));
        assert_eq!(t.pair_score(0, 4), Err(GpuSetError::UnknownGpu { index: 4, count: 4 }));
    }

    #[test]
    fn validation_errors() {
        let e =
            Topology::decode(r#"[{"index":0,"links":{"1":[7]}},{"index":1,"links":{"0":[8]}}]"#).unwrap_err();
        assert!(matches!(e, TopologyError::Asymmetric { a: 0, b: 1, .. }), "{e}");
        let e = Topology::decode(r#"[{"index":0,"links":{"1":[7]}},{"index":1,"links":{}}]"#).unwrap_err();
        assert!(matches!(e, TopologyError::Asymmetric { a: 0, b: 1, .. }), "{e}");
        let e = Topology::decode(r#"[{"index":0,"links":{"5":[7]}}]"#).unwrap_err();
        assert_eq!(e, TopologyError::UnknownPeer { gpu: 0, peer: 5, count: 1 });
        let e = Topology::decode(r#"[{"index":0,"links":{"0":[7]}}]"#).unwrap_err();
        assert_eq!(e, TopologyError::SelfLink { gpu: 0 });
        let e = Topology::decode(r#"[{"index":0},{"index":0}]"#).unwrap_err();
        assert_eq!(e, TopologyError::DuplicateGpu { index: 0 });
        let e = Topology::decode(r#"[{"index":0},{"index":7}]"#).unwrap_err();
        assert_eq!(e, TopologyError::MissingGpu { index: 1, count: 2 });
        let e = Topology::decode("[").unwrap_err();
        assert!(matches!(e, TopologyError::Decode(_)));
        assert!(Topology::decode("[]").unwrap().is_empty());
        // Structural errors fail the lenient constructor too.
        for bad in
            [r#"[{"index":0,"links":{"5":[7]}}]"#, r#"[{"index":0,"links":{"0":[7]}}]"#, "[{\"index\":1}]"]
        {
            assert_eq!(
                Topology::decode_lenient(bad).unwrap_err(),
                Topology::decode(bad).unwrap_err(),
                "{bad}"
            );
        }
    }

    /// Four GPUs: NV2 0-1 and NV1 2-3 both ways, SYS everywhere else; then `edit` applied to the rows.
    fn four(edit: impl FnOnce(&mut DeviceTopology)) -> DeviceTopology {
        let mut t = DeviceTopology::decode(
            r#"[{"index":0,"links":{"1":[8],"2":[1],"3":[1]}},{"index":1,"links":{"0":[8],"2":[1],"3":[1]}},
               {"index":2,"links":{"0":[1],"1":[1],"3":[7]}},{"index":3,"links":{"0":[1],"1":[1],"2":[7]}}]"#,
        )
        .unwrap();
        edit(&mut t);
        t
    }

    #[test]
    fn lenient_scores_only_the_asymmetric_pair_zero() {
        let base = Topology::new(&four(|_| {})).unwrap();
        assert!(base.asymmetric_pairs().is_empty());
        assert_eq!(Topology::new_lenient(&four(|_| {})).unwrap(), base);
        let nv1 = P2PLinkType::ALL[7];
        let nv2 = P2PLinkType::ALL[8];
        let sys = P2PLinkType::ALL[1];
        let cases: [(DeviceTopology, AsymmetricPair); 3] = [
            // Different link types each way.
            (
                four(|t| {
                    t.gpus[3].links.insert(2, vec![nv2]);
                }),
                AsymmetricPair { a: 2, b: 3, forward: vec![nv1], backward: vec![nv2] },
            ),
            // The lower GPU lists nothing for the higher one.
            (
                four(|t| {
                    t.gpus[2].links.remove(&3);
                }),
                AsymmetricPair { a: 2, b: 3, forward: vec![], backward: vec![nv1] },
            ),
            // The higher GPU lists nothing for the lower one.
            (
                four(|t| {
                    t.gpus[3].links.remove(&2);
                }),
                AsymmetricPair { a: 2, b: 3, forward: vec![nv1], backward: vec![] },
            ),
        ];
        for (links, want) in cases {
            let strict = Topology::new(&links).unwrap_err();
            assert_eq!(strict, TopologyError::from(want.clone()));
            let t = Topology::new_lenient(&links).unwrap();
            assert_eq!(t.asymmetric_pairs(), std::slice::from_ref(&want));
            assert_eq!((t.pair_score(2, 3), t.pair_score(3, 2)), (Ok(0), Ok(0)));
            for (a, b) in [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3)] {
                assert_eq!(t.pair_score(a, b), base.pair_score(a, b), "pair {a}-{b}");
                assert_eq!(t.pair_score(b, a), base.pair_score(a, b), "pair {b}-{a}");
            }
            assert_eq!(t.set_score(&[0, 1, 2, 3]), Ok(base.set_score(&[0, 1, 2, 3]).unwrap() - 100));
        }
        assert_eq!(link_score(&[sys]), 10);
    }

    #[test]
    fn asymmetric_pairs_are_sorted_once_each_and_named() {
        let links = four(|t| {
            t.gpus[1].links.insert(0, vec![P2PLinkType::ALL[7]]);
            t.gpus[3].links.remove(&1);
            t.gpus[2].links.remove(&3);
        });
        let t = Topology::new_lenient(&links).unwrap();
        let pairs: Vec<(usize, usize)> = t.asymmetric_pairs().iter().map(|p| (p.a, p.b)).collect();
        assert_eq!(pairs, [(0, 1), (1, 3), (2, 3)]);
        assert_eq!(t.pair_score(0, 2), Ok(10));
        let text = t.asymmetric_pairs()[0].to_string();
        assert!(text.contains("asymmetric links between GPU 0 and GPU 1"), "{text}");
        // The strict constructor names the lowest pair.
        assert!(matches!(Topology::new(&links), Err(TopologyError::Asymmetric { a: 0, b: 1, .. })));
    }
}

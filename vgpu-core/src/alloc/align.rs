//! Cross-pod (gang) alignment: the per-node facts it needs and the windows it hands to link placement
//! (contract §4.5 and the "cross-pod windows" of §4.3).
//!
//! A node's NVLink components (GPUs joined by NVLink edges, at least two members) are numbered by their
//! smallest GPU index: the component's *ordinal*. Its *domain signature* is `rail:<sorted rails>` when the node
//! publishes a trusted rail map (`node-gpu-domain` with an entry for every GPU), else `ord:<ordinal>`; the same
//! signature on two nodes means "the same sub-domain". Each GPU also has a *rail key*: `rail:<rail>` from a
//! trusted map, else `idx:<index>` (rail-optimized fabrics wire NIC *i* to GPU *i* on every host).
//!
//! A scheduler resolves, from the gang siblings placed on their own nodes, the majority domain signature and
//! rail-key set ([`GangKeys`], through [`GangVotes`]), and per candidate node turns them — together with the
//! NVLink component its siblings already use there ([`NodeDomains::anchor`]) — into an [`Alignment`]. Link
//! placement then tries, in order: the rail window (L1, GPUs on the gang's rails), the anchor component
//! window (L2), and no window (L3, left out when the mode is strict and an anchor exists).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::codec::node_gpu_domain::GpuRails;
use crate::model::NodeDeviceInventory;

use super::node::{LinkTier, NodeLinks};

/// The window a link placement came from (the `result` label of `crosspod_alignment_total`).
///
/// Ordered from the tightest to the loosest, so the loosest over a pod's containers is the maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AlignmentWindow {
    /// L1: the GPUs on the gang's rails.
    Rail,
    /// L2: the gang's anchor NVLink component.
    Component,
    /// L3: no window (or the non-topology fallback).
    None,
}

impl AlignmentWindow {
    /// Metric label: `rail`, `component`, `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            AlignmentWindow::Rail => "rail",
            AlignmentWindow::Component => "component",
            AlignmentWindow::None => "none",
        }
    }
}

/// Cross-pod windows for one node (GPU indices); an absent window is not tried.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Alignment {
    /// L1: GPUs whose rail key is one of the gang's rails (tried when it holds at least the container's need).
    pub rail_gpus: Option<Vec<u32>>,
    /// L2: the anchor NVLink component. Present, it also makes a strict request reject the node when the
    /// component is smaller than the need, and drops the unwindowed attempt for strict requests.
    pub anchor_gpus: Option<Vec<u32>>,
}

impl Alignment {
    /// Neither window is set (placement behaves as without alignment, but still reports
    /// [`AlignmentWindow::None`]).
    pub fn is_empty(&self) -> bool {
        self.rail_gpus.is_none() && self.anchor_gpus.is_none()
    }
}

/// The gang's cross-node keys, resolved from siblings on their own nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GangKeys {
    /// `GangDomainKey`: the majority domain signature of the components the siblings use.
    pub domain: Option<String>,
    /// `GangRailKey`: the majority set of rail keys the siblings use.
    pub rails: Option<BTreeSet<String>>,
}

/// Majority votes over siblings for [`GangKeys`]; ties go to the smaller key.
#[derive(Debug, Clone, Default)]
pub struct GangVotes {
    domains: BTreeMap<String, usize>,
    rails: BTreeMap<BTreeSet<String>, usize>,
}

impl GangVotes {
    /// No vote yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// One sibling's vote: `uuids` are the GPUs it holds on the node described by `node`.
    pub fn add<'a>(&mut self, node: &NodeDomains, uuids: impl IntoIterator<Item = &'a str> + Clone) {
        if let Some(d) = node.domain_of(uuids.clone()) {
            *self.domains.entry(d.to_owned()).or_default() += 1;
        }
        if let Some(r) = node.rail_signature(uuids) {
            *self.rails.entry(r).or_default() += 1;
        }
    }

    /// The majority keys.
    pub fn finish(self) -> GangKeys {
        GangKeys { domain: majority(self.domains), rails: majority(self.rails) }
    }
}

/// Most-voted key; the first (smallest) on ties.
fn majority<K>(votes: BTreeMap<K, usize>) -> Option<K> {
    let mut best: Option<(K, usize)> = None;
    for (k, v) in votes {
        if best.as_ref().is_none_or(|b| v > b.1) {
            best = Some((k, v));
        }
    }
    best.map(|b| b.0)
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Gpu {
    index: u32,
    component: Option<usize>,
    rail_key: String,
}

/// A node's NVLink components, their domain signatures and its GPUs' rail keys, computed once per node change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeDomains {
    /// NVLink components by ordinal, members ascending.
    components: Vec<Vec<u32>>,
    signatures: Vec<String>,
    /// Inventory order.
    gpus: Vec<Gpu>,
    by_uuid: HashMap<String, usize>,
}

impl NodeDomains {
    /// Derives the node's domains from its inventory, links and optional rail map (`node-gpu-domain`,
    /// trusted only when every GPU of the inventory has an entry).
    pub fn new(inventory: &NodeDeviceInventory, links: Option<&NodeLinks>, rails: Option<&GpuRails>) -> Self {
        let rails = rails
            .filter(|r| !inventory.is_empty() && inventory.devices.iter().all(|d| r.contains_key(&d.uuid)));
        let mut indices: Vec<u32> = inventory.devices.iter().map(|d| d.index).collect();
        indices.sort_unstable();
        indices.dedup();
        let components: Vec<Vec<u32>> = match links.filter(|l| l.has_links()) {
            None => Vec::new(),
            Some(l) => l
                .components(&indices, LinkTier::NvLink)
                .into_iter()
                .filter(|c| c.len() >= 2)
                .map(|c| c.iter().filter_map(|&p| indices.get(p).copied()).collect())
                .collect(),
        };
        let rail_of = |index: u32| -> Option<&String> {
            let uuid = &inventory.get(index)?.uuid;
            rails.and_then(|r| r.get(uuid))
        };
        let signatures = components
            .iter()
            .enumerate()
            .map(|(ord, members)| match rails {
                Some(_) => {
                    let set: BTreeSet<&str> =
                        members.iter().filter_map(|&i| rail_of(i)).map(String::as_str).collect();
                    format!("rail:{}", set.into_iter().collect::<Vec<_>>().join(","))
                }
                None => format!("ord:{ord}"),
            })
            .collect();
        let mut gpus = Vec::with_capacity(inventory.devices.len());
        let mut by_uuid = HashMap::with_capacity(inventory.devices.len());
        for d in &inventory.devices {
            let rail_key = match rails.and_then(|r| r.get(&d.uuid)) {
                Some(rail) => format!("rail:{rail}"),
                None => format!("idx:{}", d.index),
            };
            let component = components.iter().position(|c| c.contains(&d.index));
            by_uuid.entry(d.uuid.clone()).or_insert(gpus.len());
            gpus.push(Gpu { index: d.index, component, rail_key });
        }
        Self { components, signatures, gpus, by_uuid }
    }

    /// NVLink components by ordinal (GPU indices, ascending).
    pub fn components(&self) -> &[Vec<u32>] {
        &self.components
    }

    /// Domain signature of the component with this ordinal.
    pub fn signature(&self, ordinal: usize) -> Option<&str> {
        self.signatures.get(ordinal).map(String::as_str)
    }

    /// Rail key of a GPU index (`rail:<rail>` or `idx:<index>`).
    pub fn rail_key(&self, index: u32) -> Option<&str> {
        self.gpus.iter().find(|g| g.index == index).map(|g| g.rail_key.as_str())
    }

    fn gpu(&self, uuid: &str) -> Option<&Gpu> {
        self.by_uuid.get(uuid).and_then(|&p| self.gpus.get(p))
    }

    /// `GangAnchorComponent`: the ordinal of the component holding most of `uuids` (one vote per entry, so a
    /// GPU held by two siblings counts twice); ties go to the lower ordinal. `None` when no entry is on an
    /// NVLink component of this node.
    pub fn anchor<'a>(&self, uuids: impl IntoIterator<Item = &'a str>) -> Option<usize> {
        let mut votes = vec![0usize; self.components.len()];
        for u in uuids {
            if let Some(v) = self.gpu(u).and_then(|g| g.component).and_then(|c| votes.get_mut(c)) {
                *v += 1;
            }
        }
        let mut best: Option<(usize, usize)> = None;
        for (ord, &v) in votes.iter().enumerate() {
            if v > 0 && best.is_none_or(|b| v > b.1) {
                best = Some((ord, v));
            }
        }
        best.map(|b| b.0)
    }

    /// The majority domain signature of the components holding `uuids` (duplicates counted once; ties go to
    /// the smaller signature). `None` when none is on an NVLink component of this node.
    pub fn domain_of<'a>(&self, uuids: impl IntoIterator<Item = &'a str>) -> Option<&str> {
        let mut seen = BTreeSet::new();
        let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
        for u in uuids {
            if !seen.insert(u) {
                continue;
            }
            if let Some(sig) = self.gpu(u).and_then(|g| g.component).and_then(|c| self.signature(c)) {
                *votes.entry(sig).or_default() += 1;
            }
        }
        majority(votes)
    }

    /// The set of rail keys of `uuids` (unknown UUIDs skipped); `None` when none is known here.
    pub fn rail_signature<'a>(&self, uuids: impl IntoIterator<Item = &'a str>) -> Option<BTreeSet<String>> {
        let set: BTreeSet<String> =
            uuids.into_iter().filter_map(|u| self.gpu(u)).map(|g| g.rail_key.clone()).collect();
        (!set.is_empty()).then_some(set)
    }

    /// `ComponentByDomain`: the ordinal of the component with this signature.
    pub fn component_by_domain(&self, signature: &str) -> Option<usize> {
        self.signatures.iter().position(|s| s == signature)
    }

    /// The windows for a gang member on this node: the rail window from `keys.rails`, and the anchor component
    /// — `anchor` (siblings on this node, from [`anchor`](Self::anchor)) or else the component whose signature
    /// is `keys.domain`.
    pub fn alignment(&self, anchor: Option<usize>, keys: &GangKeys) -> Alignment {
        let rail_gpus = keys.rails.as_ref().and_then(|rails| {
            let w: Vec<u32> =
                self.gpus.iter().filter(|g| rails.contains(&g.rail_key)).map(|g| g.index).collect();
            (!w.is_empty()).then_some(w)
        });
        let anchor = anchor.or_else(|| keys.domain.as_deref().and_then(|d| self.component_by_domain(d)));
        let anchor_gpus = anchor.and_then(|c| self.components.get(c)).cloned();
        Alignment { rail_gpus, anchor_gpus }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::GpuDevice;

    fn inventory(n: u32) -> NodeDeviceInventory {
        NodeDeviceInventory::new(
            (0..n).map(|i| GpuDevice { index: i, uuid: format!("G{i}"), ..Default::default() }).collect(),
        )
    }

    /// NVLink within 0-3 and within 4-7 (all pairs), PCIe elsewhere; GPU 8 (if any) has no NVLink.
    fn islands(n: u32) -> NodeLinks {
        let mut gpus = Vec::new();
        for i in 0..n {
            let peers: Vec<String> = (0..n)
                .filter(|&j| j != i)
                .map(|j| {
                    let nv = i < 8 && j < 8 && i / 4 == j / 4;
                    format!("\"{j}\":[{}]", if nv { 12 } else { 2 })
                })
                .collect();
            gpus.push(format!("{{\"index\":{i},\"links\":{{{}}}}}", peers.join(",")));
        }
        NodeLinks::decode(&format!("[{}]", gpus.join(","))).unwrap()
    }

    fn rails(n: u32, skip: Option<u32>) -> GpuRails {
        (0..n).filter(|&i| Some(i) != skip).map(|i| (format!("G{i}"), format!("r{}", i % 4))).collect()
    }

    #[test]
    fn components_ordinals_and_signatures() {
        let inv = inventory(9);
        let links = islands(9);
        let d = NodeDomains::new(&inv, Some(&links), None);
        assert_eq!(d.components(), [vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        assert_eq!(d.signature(0), Some("ord:0"));
        assert_eq!(d.signature(1), Some("ord:1"));
        assert_eq!(d.rail_key(5), Some("idx:5"));
        // A trusted rail map: every GPU has an entry.
        let r = rails(9, None);
        let d = NodeDomains::new(&inv, Some(&links), Some(&r));
        assert_eq!(d.signature(0), Some("rail:r0,r1,r2,r3"));
        assert_eq!(d.signature(1), Some("rail:r0,r1,r2,r3"));
        assert_eq!(d.rail_key(5), Some("rail:r1"));
        // One GPU without an entry: the map is ignored.
        let r = rails(9, Some(8));
        let d = NodeDomains::new(&inv, Some(&links), Some(&r));
        assert_eq!(d.signature(1), Some("ord:1"));
        assert_eq!(d.rail_key(5), Some("idx:5"));
        // No links: no component.
        let d = NodeDomains::new(&inv, None, None);
        assert!(d.components().is_empty());
        assert_eq!(d.anchor(["G0"]), None);
    }

    #[test]
    fn anchor_majority_and_ties() {
        let inv = inventory(9);
        let links = islands(9);
        let d = NodeDomains::new(&inv, Some(&links), None);
        assert_eq!(d.anchor(["G5", "G6", "G1"]), Some(1));
        assert_eq!(d.anchor(["G5", "G1"]), Some(0), "tie → lower ordinal");
        assert_eq!(d.anchor(["G8", "nope"]), None, "GPU 8 has no NVLink component");
        assert_eq!(d.anchor(["G5", "G5", "G1"]), Some(1), "one vote per entry");
        assert_eq!(d.domain_of(["G5", "G5", "G1"]), Some("ord:0"), "duplicates once, tie → smaller");
        assert_eq!(d.domain_of(["G5", "G6", "G1"]), Some("ord:1"));
        assert_eq!(d.rail_signature(["G5", "G1", "G5", "x"]), Some(["idx:1".into(), "idx:5".into()].into()));
        assert_eq!(d.rail_signature(["x"]), None);
    }

    #[test]
    fn alignment_windows() {
        let inv = inventory(8);
        let links = islands(8);
        let d = NodeDomains::new(&inv, Some(&links), None);
        let keys =
            GangKeys { domain: Some("ord:1".into()), rails: Some(["idx:2".into(), "idx:6".into()].into()) };
        let a = d.alignment(None, &keys);
        assert_eq!(a.rail_gpus.as_deref(), Some(&[2, 6][..]));
        assert_eq!(a.anchor_gpus.as_deref(), Some(&[4, 5, 6, 7][..]));
        // A sibling anchor on this node wins over the cross-node domain.
        let a = d.alignment(Some(0), &keys);
        assert_eq!(a.anchor_gpus.as_deref(), Some(&[0, 1, 2, 3][..]));
        // Unknown keys give no window.
        let keys = GangKeys { domain: Some("ord:7".into()), rails: Some(["rail:x".into()].into()) };
        assert!(d.alignment(None, &keys).is_empty());
    }

    #[test]
    fn votes_pick_the_majority() {
        let inv = inventory(8);
        let links = islands(8);
        let d = NodeDomains::new(&inv, Some(&links), None);
        let mut v = GangVotes::new();
        v.add(&d, ["G4", "G5"]);
        v.add(&d, ["G0"]);
        v.add(&d, ["G6", "G7"]);
        let k = v.finish();
        assert_eq!(k.domain.as_deref(), Some("ord:1"));
        // Rail sets {4,5}, {0}, {6,7} once each: tie → the smallest set.
        assert_eq!(k.rails, Some(["idx:0".to_owned()].into()));
        assert_eq!(GangVotes::new().finish(), GangKeys::default());
    }
}

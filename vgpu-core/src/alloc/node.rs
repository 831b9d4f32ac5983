//! A node as the allocator sees it: inventory, config, link topology and usage; the node-stage checks.

use crate::codec::{node_config_info, node_devices};
use crate::model::{NodeDeviceInventory, NodeVgpuConfig};
use crate::topology::{AsymmetricPair, DeviceTopology, Topology, TopologyError};

use super::reason::{NodeFailure, ReasonCode};
use super::request::PodRequest;
use super::usage::NodeUsage;

/// Link tiers of the tiered walk (contract §4.3), tightest first, with their minimum link type code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LinkTier {
    /// Strongest link at least SingleNVLINK (7).
    NvLink,
    /// At least MultiSwitch (4).
    Switch,
    /// At least SameCPU (2).
    Numa,
    /// At least CrossCPU (1).
    Any,
}

impl LinkTier {
    /// The ladder, tightest first.
    pub const LADDER: [LinkTier; 4] = [LinkTier::NvLink, LinkTier::Switch, LinkTier::Numa, LinkTier::Any];

    /// Minimum strongest link type code for a pair to be connected at this tier.
    pub fn threshold(self) -> u8 {
        match self {
            LinkTier::NvLink => 7,
            LinkTier::Switch => 4,
            LinkTier::Numa => 2,
            LinkTier::Any => 1,
        }
    }

    /// Metric-style label (`nvlink`, `switch`, `numa`, `any`).
    pub fn as_str(self) -> &'static str {
        match self {
            LinkTier::NvLink => "nvlink",
            LinkTier::Switch => "switch",
            LinkTier::Numa => "numa",
            LinkTier::Any => "any",
        }
    }
}

/// A node's GPU links: strongest link type per pair (for tiers) and go-gpuallocator pair scores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLinks {
    n: usize,
    strongest: Vec<u8>,
    topology: Topology,
}

impl NodeLinks {
    /// Validates a decoded `node-device-topology` value ([`Topology::new_lenient`]): a pair of GPUs whose
    /// two directions disagree counts as unlinked (strongest link 0, pair score 0) and is listed in
    /// [`asymmetric_pairs`](Self::asymmetric_pairs); the rest of the topology is kept. Every other
    /// inconsistency is an error.
    pub fn new(links: &DeviceTopology) -> Result<Self, TopologyError> {
        let topology = Topology::new_lenient(links)?;
        let n = topology.len();
        let mut strongest = vec![0u8; n * n];
        for gpu in &links.gpus {
            for (&peer, types) in &gpu.links {
                let best = types.iter().map(|t| t.code()).max().unwrap_or(0);
                if gpu.index < n && peer < n {
                    strongest[gpu.index * n + peer] = strongest[gpu.index * n + peer].max(best);
                }
            }
        }
        for pair in topology.asymmetric_pairs() {
            for cell in [pair.a * n + pair.b, pair.b * n + pair.a] {
                if let Some(c) = strongest.get_mut(cell) {
                    *c = 0;
                }
            }
        }
        Ok(Self { n, strongest, topology })
    }

    /// The GPU pairs whose links disagree between the two directions, each scored as unlinked (see
    /// [`new`](Self::new)); empty for a consistent annotation.
    pub fn asymmetric_pairs(&self) -> &[AsymmetricPair] {
        self.topology.asymmetric_pairs()
    }

    /// Decodes and validates a `node-device-topology` annotation value (see [`new`](Self::new)).
    pub fn decode(annotation: &str) -> Result<Self, TopologyError> {
        Self::new(&DeviceTopology::decode(annotation)?)
    }

    /// GPUs described.
    pub fn len(&self) -> usize {
        self.n
    }

    /// No GPU described.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The scored topology (for the best-effort optimizer).
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Strongest link type code between two GPU indices (0 when unknown).
    pub fn strongest(&self, a: u32, b: u32) -> u8 {
        let (a, b) = (a as usize, b as usize);
        if a >= self.n || b >= self.n || a == b { 0 } else { self.strongest[a * self.n + b] }
    }

    /// Pair score (0 when unknown).
    pub fn pair_score(&self, a: u32, b: u32) -> u64 {
        self.topology.pair_score(a as usize, b as usize).unwrap_or(0)
    }

    /// Some pair has a link.
    pub fn has_links(&self) -> bool {
        self.strongest.iter().any(|&s| s > 0)
    }

    /// `gpu` has a peer (any GPU of the node, busy or not) connected at `tier`.
    pub fn has_peer_at(&self, gpu: u32, tier: LinkTier) -> bool {
        (0..self.n as u32).any(|p| self.strongest(gpu, p) >= tier.threshold())
    }

    /// Components of `members` (GPU indices) under direct edges at `tier`, each in `members` order, ordered by
    /// their first member.
    pub fn components(&self, members: &[u32], tier: LinkTier) -> Vec<Vec<usize>> {
        let m = members.len();
        let mut parent: Vec<usize> = (0..m).collect();
        fn find(p: &mut [usize], mut x: usize) -> usize {
            while p[x] != x {
                p[x] = p[p[x]];
                x = p[x];
            }
            x
        }
        for i in 0..m {
            for j in i + 1..m {
                if self.strongest(members[i], members[j]) >= tier.threshold() {
                    let (ri, rj) = (find(&mut parent, i), find(&mut parent, j));
                    if ri != rj {
                        parent[ri.max(rj)] = ri.min(rj);
                    }
                }
            }
        }
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut slot = vec![usize::MAX; m];
        for i in 0..m {
            let r = find(&mut parent, i);
            if slot[r] == usize::MAX {
                slot[r] = groups.len();
                groups.push(Vec::new());
            }
            if let Some(g) = groups.get_mut(slot[r]) {
                g.push(i);
            }
        }
        groups
    }

    /// Size of the largest component of all GPUs at `tier`.
    pub fn largest_component(&self, tier: LinkTier) -> usize {
        let all: Vec<u32> = (0..self.n as u32).collect();
        self.components(&all, tier).iter().map(Vec::len).max().unwrap_or(0)
    }
}

/// One node, borrowed from a scheduler cache: everything the allocator reads.
#[derive(Debug, Clone, Copy)]
pub struct NodeView<'a> {
    /// Node name (for ordering and messages).
    pub name: &'a str,
    /// `node-device-register`.
    pub inventory: &'a NodeDeviceInventory,
    /// `node-config-info`.
    pub config: &'a NodeVgpuConfig,
    /// `node-device-topology`, when published.
    pub links: Option<&'a NodeLinks>,
    /// Usage by the other pods on the node.
    pub usage: &'a NodeUsage,
}

impl NodeView<'_> {
    /// The node stage of the filter (contract §3.1 step 4, after decoding): `deviceSplit > 0`,
    /// `memoryFactor > 0`, memory policy.
    pub fn check(&self, request: &PodRequest) -> Result<(), NodeFailure> {
        if self.config.device_split == 0 {
            return Err(NodeFailure::new(ReasonCode::NodeBadVgpuConfig).with_detail("deviceSplit is 0"));
        }
        if self.config.memory_factor == 0 {
            return Err(NodeFailure::new(ReasonCode::NodeBadMemoryFactor).with_detail("memoryFactor is 0"));
        }
        if let Some(p) = request.memory_policy
            && !p.admits(self.config.memory_scaling)
        {
            return Err(NodeFailure::new(ReasonCode::NodeMemoryTypeMismatch).with_detail(format!(
                "pod wants {p} memory, node memoryScaling is {}",
                self.config.memory_scaling
            )));
        }
        Ok(())
    }
}

/// Decodes the two node annotations, mapping absence and decode errors to the node-stage reasons
/// (`NodeNoVGPURegister`, `NodeBadVGPURegister`, `NodeNoVGPUConfig`, `NodeBadVGPUConfig`).
pub fn decode_node(
    register: Option<&str>,
    config: Option<&str>,
) -> Result<(NodeDeviceInventory, NodeVgpuConfig), NodeFailure> {
    let register = register.ok_or_else(|| NodeFailure::new(ReasonCode::NodeNoVgpuRegister))?;
    let inventory = node_devices::decode(register)
        .map_err(|e| NodeFailure::new(ReasonCode::NodeBadVgpuRegister).with_detail(e.to_string()))?;
    let config = config.ok_or_else(|| NodeFailure::new(ReasonCode::NodeNoVgpuConfig))?;
    let config = node_config_info::decode(config)
        .map_err(|e| NodeFailure::new(ReasonCode::NodeBadVgpuConfig).with_detail(e.to_string()))?;
    Ok((inventory, config))
}

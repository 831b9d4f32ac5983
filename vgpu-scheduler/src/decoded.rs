//! A node's decoded annotations ([`DecodedNode`]): inventory, config, links and the static numbers the filter
//! ranks by, decoded once per annotation change by the [`ClusterCache`](crate::cache::ClusterCache).

use std::sync::Arc;

use vgpu_core::alloc::{NodeDomains, NodeLinks, NodeUsage, NodeView, topology_fitness_table};
use vgpu_core::codec::node_gpu_domain;
use vgpu_core::model::{NodeDeviceInventory, NodeVgpuConfig, TopologyMode};

/// Entries of a fitness table: needs `0..=FITNESS_LEN - 1` (larger needs read the last entry).
pub const FITNESS_LEN: usize = 17;

/// Decodes a node's `node-device-topology` (once per annotation change: [`ClusterCache`] re-decodes a node
/// only when its inputs change). A topology that does not validate is dropped (the node is treated as
/// publishing none); a GPU pair whose two directions disagree only costs that pair its link benefit
/// ([`NodeLinks::new`]). Both are logged as warnings naming the node (and the pair).
pub(crate) fn decode_links(node: &str, annotation: &str) -> Option<NodeLinks> {
    match NodeLinks::decode(annotation) {
        Ok(links) => {
            for pair in links.asymmetric_pairs() {
                tracing::warn!(
                    node,
                    gpu_a = pair.a,
                    gpu_b = pair.b,
                    forward = ?pair.forward,
                    backward = ?pair.backward,
                    "node-device-topology: {pair}; scoring this GPU pair as unlinked, the rest of the node's \
                     topology is used"
                );
            }
            Some(links)
        }
        Err(error) => {
            tracing::warn!(node, %error, "node-device-topology is invalid; the node is treated as publishing none");
            None
        }
    }
}

/// What resolving a request on a node depends on: memory factor and uniform GPU memory
/// ([`DecodedNode::resolve_key`]).
pub type ResolveKey = (u32, Option<u64>);

/// A node's decoded annotations and the static numbers the filter ranks by.
#[derive(Debug)]
pub struct DecodedNode {
    /// `node-device-register`.
    pub inventory: NodeDeviceInventory,
    /// `node-config-info`.
    pub config: NodeVgpuConfig,
    /// `node-device-topology`, when published and valid.
    pub links: Option<NodeLinks>,
    /// Memory size shared by every schedulable GPU, if uniform.
    pub uniform_memory: Option<u64>,
    /// Slots, cores, memory over schedulable GPUs.
    pub totals: [u64; 3],
    /// NVLink components, domain signatures and rail keys for cross-pod alignment (from the links and the
    /// optional `node-gpu-domain` rail map; a rail map that does not decode is ignored). Derived on first use
    /// ([`LazyDomains`]): only nodes a gang or controller pod aligns with pay for them.
    pub domains: LazyDomains,
}

/// A decoded node's [`NodeDomains`], computed the first time they are read (they copy every GPU's UUID and
/// rail key, about 1 KiB per 8-GPU node, and only cross-pod alignment reads them). Dereferences to
/// [`NodeDomains`].
#[derive(Debug)]
pub struct LazyDomains {
    /// Boxed: a node that never aligns keeps one pointer, not the domains' inline size.
    pub(crate) domains: std::sync::OnceLock<Box<NodeDomains>>,
    /// The decoded node these domains belong to (its inventory and links).
    node: std::sync::Weak<DecodedNode>,
    /// The decoded `node-gpu-domain` rail map, when published and valid.
    rails: Option<node_gpu_domain::GpuRails>,
}

impl std::ops::Deref for LazyDomains {
    type Target = NodeDomains;

    fn deref(&self) -> &NodeDomains {
        self.domains.get_or_init(|| match self.node.upgrade() {
            Some(d) => Box::new(NodeDomains::new(&d.inventory, d.links.as_ref(), self.rails.as_ref())),
            // Unreachable while the node is only ever shared as `Arc<DecodedNode>` (its only constructor):
            // borrowing these domains keeps that `Arc` alive.
            None => Box::default(),
        })
    }
}

impl DecodedNode {
    pub(crate) fn new(
        inventory: NodeDeviceInventory,
        config: NodeVgpuConfig,
        links: Option<NodeLinks>,
        rails: Option<&str>,
    ) -> Arc<Self> {
        let uniform_memory = {
            let mut sizes = inventory.schedulable().map(|d| d.memory_mib);
            sizes.next().filter(|f| sizes.all(|s| s == *f))
        };
        let mut totals = [0u64; 3];
        for d in inventory.schedulable() {
            totals[0] += u64::from(d.split_count);
            totals[1] += d.cores;
            totals[2] += d.memory_mib;
        }
        let rails = rails.and_then(|r| node_gpu_domain::decode(r).ok());
        Arc::new_cyclic(|node| {
            let domains = LazyDomains { domains: std::sync::OnceLock::new(), node: node.clone(), rails };
            Self { inventory, config, links, uniform_memory, totals, domains }
        })
    }

    /// What a request's resolution on this node depends on: the memory factor and the uniform GPU memory.
    pub fn resolve_key(&self) -> ResolveKey {
        (self.config.memory_factor.max(1), self.uniform_memory)
    }

    /// Topology fitness (`topology_fitness`) of the empty node for a base mode, per need `0..FITNESS_LEN`
    /// (`None` for modes without fitness). The rank table keeps it per node, so it is computed once per
    /// decoded node and mode.
    pub fn fitness_table(&self, name: &str, mode: TopologyMode) -> Option<[u8; FITNESS_LEN]> {
        let usage = NodeUsage::new();
        let view = NodeView {
            name,
            inventory: &self.inventory,
            config: &self.config,
            links: self.links.as_ref(),
            usage: &usage,
        };
        topology_fitness_table(mode, &view)
    }
}

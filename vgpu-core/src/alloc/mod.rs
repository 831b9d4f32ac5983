//! vGPU allocation with vgpu-manager semantics: the pod request model (contract §4.1), per-node placement
//! (§4.2, §4.3) and node ordering/scoring (§3.2).
//!
//! | step | items |
//! |---|---|
//! | describe the pod | [`PodSpec`], [`PodContainer`], [`parse_quantity`] |
//! | request model | [`PodRequest`] → per node [`ResolvedRequest`] (needs, `Total`, `Max`), [`RequestProfile`] |
//! | node state | [`NodeView`] (inventory, config, [`NodeLinks`], [`NodeUsage`] kept from [`PodFootprint`]s), [`decode_node`] |
//! | place | [`allocate`] → [`PodAllocation`] (a [`PodDeviceClaim`](crate::model::PodDeviceClaim) + notices) or [`NodeFailure`] |
//! | gang alignment | [`NodeDomains`] per node, [`GangVotes`] → [`GangKeys`], [`Alignment`] windows for [`place_aligned`], [`AlignmentWindow`] |
//! | explain | [`ReasonCode`], [`NodeFailure`], [`render_unavailable`] |
//! | order nodes | [`order_nodes`], [`score_node`], [`topology_fitness`], [`topology_fitness_table`], [`NodeScore::host_priority`] |
//!
//! Link placement runs the contract's tiered walk and hands the chosen component to the exact
//! [`BestEffortPolicy`](crate::topology::BestEffortPolicy); the better-scoring set wins.
//!
//! Where this differs from upstream (all deliberate, all deterministic):
//! * link placement may replace the walk's set by the optimizer's strictly better-scoring set from the same
//!   component (upstream keeps the walk's set); ties in the walk's subset search go to the first subset in store
//!   order (upstream compares complements);
//! * devices are filtered in inventory order rather than Go map order (upstream was already deterministic
//!   through the index tiebreak of the policy sort);
//! * node accounting of pods with sequential init containers is offered as
//!   [`PodFootprint::from_claim_with_roles`] (`ReducePodFootprint`), so a cache can count them exactly.
//!
//! ```
//! use vgpu_core::alloc::{NodeUsage, NodeView, PodContainer, PodFootprint, PodRequest, PodSpec, ReasonCode, allocate};
//! use vgpu_core::domain::ResourceDomain;
//! use vgpu_core::model::{GpuDevice, NodeDeviceInventory, NodeVgpuConfig};
//!
//! let d = ResourceDomain::default();
//! let inventory = NodeDeviceInventory::new(vec![GpuDevice {
//!     index: 0, uuid: "GPU-0".into(), memory_mib: 16384, cores: 100, split_count: 2, ..Default::default()
//! }]);
//! let config = NodeVgpuConfig::default();
//! let mut usage = NodeUsage::new();
//! let pod = PodSpec::new().container(PodContainer::app("m").limit(d.vgpu_number(), 1).limit(d.vgpu_memory(), 8192));
//! let request = PodRequest::from_pod(&pod, &d)?;
//! for uid in ["a", "b"] {
//!     let node = NodeView { name: "n", inventory: &inventory, config: &config, links: None, usage: &usage };
//!     let got = allocate(&request, &node)?;
//!     usage.insert_pod(uid, PodFootprint::from_claim(&got.claim));
//! }
//! let node = NodeView { name: "n", inventory: &inventory, config: &config, links: None, usage: &usage };
//! assert_eq!(allocate(&request, &node).unwrap_err().code, ReasonCode::InsufficientVgpuSlot);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod align;
mod filter;
mod link;
mod link_search;
mod node;
mod numa;
mod place;
mod pod;
mod reason;
mod request;
mod score;
mod usage;

#[cfg(test)]
mod tests;

pub use align::{Alignment, AlignmentWindow, GangKeys, GangVotes, NodeDomains};
pub use filter::GpuFree;
pub use link::{MAX_COMBINATIONS, MAX_OPTIMIZER_POOL};
pub use link_search::{LinkSearch, LinkSearchAlgo, record_link_searches};
pub use node::{LinkTier, NodeLinks, NodeView, decode_node};
pub use place::{
    GateInputs, Notice, NoticeKind, PodAllocation, allocate, gate_inputs, place, place_aligned, precheck,
    quick_reject, quick_reject_summary, size_gate,
};
pub use pod::{PodContainer, PodSpec, parse_quantity};
pub use reason::{MAX_NODES_PER_REASON, NodeFailure, ReasonCode, ReasonCounts, render_unavailable};
pub use request::{
    ContainerNeed, ContainerRole, Footprint, PodRequest, RequestBuildError, RequestProfile, ResolvedRequest,
};
pub use score::{NodeScore, order_nodes, score_node, topology_fitness, topology_fitness_table};
pub use usage::{DeviceUsage, NodeUsage, PodFootprint};

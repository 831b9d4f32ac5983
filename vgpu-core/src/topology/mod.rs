//! GPU link topology: the `node-device-topology` annotation, go-gpuallocator link scores and the best-effort
//! allocation policy.
//!
//! * [`P2PLinkType`]: the contract's link type codes `0..=24`.
//! * [`DeviceTopology`]: the annotation value, with a byte-compatible JSON codec.
//! * [`Topology`]: validated, symmetric links with pair and set scores (SYS 10, NODE 20, PHB 30, PXB 40,
//!   PIX 50, same board 60, `k` NVLinks `100·k`, summed over all link entries of a pair). A pair whose two
//!   directions disagree is an error ([`Topology::new`]) or scores 0, listed as an [`AsymmetricPair`]
//!   ([`Topology::new_lenient`], what the scheduler uses for a node's annotation).
//! * [`BestEffortPolicy`]: go-gpuallocator's best-effort policy (best set of the best partition), solved
//!   exactly; [`Allocator`] applies it sequentially.
//!
//! ```
//! use vgpu_core::topology::{Allocator, BestEffortPolicy, DeviceTopology, Topology};
//!
//! let annotation = r#"[{"index":0,"links":{"1":[7,5]}},{"index":1,"links":{"0":[7,5]}}]"#;
//! let links = DeviceTopology::decode(annotation)?;
//! assert_eq!(links.encode(), annotation);
//!
//! let topology = Topology::new(&links)?;
//! assert_eq!(topology.pair_score(0, 1)?, 150); // one NVLink (100) + same PCIe switch (50)
//!
//! let got = BestEffortPolicy::new(&topology).allocate(&[0, 1], &[], 2)?;
//! assert_eq!((got.devices, got.score), (vec![0, 1], 150));
//!
//! let mut allocator = Allocator::new(topology);
//! assert_eq!(allocator.allocate(1)?.devices, vec![0]);
//! assert_eq!(allocator.remaining(), &[1]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod allocator;
mod best_effort;
mod codec;
mod link_type;
mod score;

pub use allocator::Allocator;
pub use best_effort::{Allocation, BestEffortPolicy, BestPartition, MAX_AVAILABLE, PartitionSet};
pub use codec::{ANNOTATION_SUFFIX, DeviceTopology, GpuLinks, TopologyDecodeError};
pub use link_type::{InvalidLinkType, P2PLinkType};
pub use score::{AsymmetricPair, GpuSetError, Topology, TopologyError, link_score};

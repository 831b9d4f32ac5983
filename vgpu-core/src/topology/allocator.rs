//! Sequential allocation from what remains.

use super::best_effort::{Allocation, BestEffortPolicy};
use super::score::{GpuSetError, Topology};

/// Allocates GPU sets one after another with the best-effort policy, each time from the GPUs still free
/// (go-gpuallocator's `Allocator`).
///
/// ```
/// use vgpu_core::topology::{Allocator, Topology};
///
/// let topology = Topology::decode(
///     r#"[{"index":0,"links":{"1":[2],"2":[1],"3":[8]}},{"index":1,"links":{"0":[2],"2":[8],"3":[1]}},
///        {"index":2,"links":{"0":[1],"1":[8],"3":[2]}},{"index":3,"links":{"0":[8],"1":[1],"2":[2]}}]"#,
/// )?;
/// let mut allocator = Allocator::new(topology);
/// assert_eq!(allocator.allocate(2)?.devices, vec![0, 3]);
/// assert_eq!(allocator.allocate(2)?.devices, vec![1, 2]);
/// assert!(allocator.allocate(2)?.is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Allocator {
    topology: Topology,
    /// Free GPUs, ascending.
    remaining: Vec<usize>,
}

impl Allocator {
    /// An allocator with every GPU of `topology` free.
    pub fn new(topology: Topology) -> Self {
        let remaining = (0..topology.len()).collect();
        Self { topology, remaining }
    }

    /// An allocator with only `available` free.
    pub fn with_available(topology: Topology, available: &[usize]) -> Result<Self, GpuSetError> {
        let remaining = topology.normalize(available)?;
        Ok(Self { topology, remaining })
    }

    /// The topology scored against.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Free GPUs, ascending.
    pub fn remaining(&self) -> &[usize] {
        &self.remaining
    }

    /// Allocates `size` GPUs from the free ones and marks them used; empty when nothing fits.
    pub fn allocate(&mut self, size: usize) -> Result<Allocation, GpuSetError> {
        self.allocate_with(&[], size)
    }

    /// Allocates `size` free GPUs including all of `required`, and marks them used; empty when nothing fits.
    pub fn allocate_with(&mut self, required: &[usize], size: usize) -> Result<Allocation, GpuSetError> {
        let got = BestEffortPolicy::new(&self.topology).allocate(&self.remaining, required, size)?;
        self.remaining.retain(|g| !got.devices.contains(g));
        Ok(got)
    }

    /// Returns `devices` to the free pool (already-free ones are ignored).
    pub fn release(&mut self, devices: &[usize]) -> Result<(), GpuSetError> {
        let devices = self.topology.normalize(devices)?;
        self.remaining.extend(devices);
        self.remaining.sort_unstable();
        self.remaining.dedup();
        Ok(())
    }
}

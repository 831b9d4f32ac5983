//! Allocating GPU sets on a DGX-1 (Volta) through the SDK: decode the `node-device-topology` annotation,
//! score GPU sets, and hand out sets of 2 and 4 with the best-effort policy.
//!
//! Run: `cargo run --example dgx1_allocate`.

use vgpu_core::topology::{Allocator, BestEffortPolicy, Topology};

const DGX1_VOLTA: &str = include_str!("../vgpu-core/tests/fixtures/topology/dgx1-volta.json");

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let topology = Topology::decode(DGX1_VOLTA)?;
    println!("DGX-1 Volta: {} GPUs", topology.len());
    println!("score(0,3) = {} (two NVLinks + host bridge)", topology.pair_score(0, 3)?);
    println!("score({{0,1,2,3}}) = {}", topology.set_score(&[0, 1, 2, 3])?);

    // One-off: the best pair out of four free GPUs (a partition answer, not simply the best pair).
    let got = BestEffortPolicy::new(&topology).allocate(&[0, 2, 4, 5], &[], 2)?;
    println!("best pair of {{0,2,4,5}}: {:?} (score {})", got.devices, got.score);

    // Sequential: each request is served from what is still free.
    let mut allocator = Allocator::new(topology);
    for size in [2, 2, 4] {
        let got = allocator.allocate(size)?;
        println!(
            "allocate {size}: {:?} (score {}), free now {:?}",
            got.devices,
            got.score,
            allocator.remaining()
        );
    }
    let got = allocator.allocate(4)?;
    println!("allocate 4: {:?} (nothing fits)", got.devices);
    Ok(())
}

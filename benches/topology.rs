//! Benchmarks of the exact best-effort optimizer (`vgpu_core::topology`) and of the brute-force reference
//! enumeration it replaces.
//!
//! Run: `cargo bench --bench topology -- --warm-up-time 1 --measurement-time 3`.
//! Targets: every 8-GPU case under 50 µs median, every 16-GPU case under 5 ms. 24 GPUs is reported only and
//! slow (tens of seconds for sets of 4 on a random topology), so it runs once, timed, and only with
//! `VGPU_BENCH_24=1`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use vgpu_core::topology::{BestEffortPolicy, Topology};

#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[path = "../vgpu-core/tests/support/oracle.rs"]
mod oracle;

const DGX1_VOLTA: &str = include_str!("../vgpu-core/tests/fixtures/topology/dgx1-volta.json");
const TWO_ISLANDS: &str = include_str!("../vgpu-core/tests/fixtures/topology/two-islands-16x.json");

fn decode(name: &str, text: &str) -> Option<Topology> {
    match Topology::decode(text) {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("skipping {name}: {e}");
            None
        }
    }
}

fn random(n: usize, seed: u64) -> Option<Topology> {
    decode("random", &oracle::random_topology(n, seed).encode())
}

fn bench_policy(c: &mut Criterion, group: &str, name: &str, topology: &Topology, sizes: &[usize]) {
    let available: Vec<usize> = (0..topology.len()).collect();
    let policy = BestEffortPolicy::new(topology);
    let mut g = c.benchmark_group(group);
    for &size in sizes {
        g.bench_with_input(BenchmarkId::new(name, size), &size, |b, &size| {
            b.iter(|| policy.allocate(black_box(&available), &[], black_box(size)))
        });
    }
    g.finish();
}

fn bench_oracle(c: &mut Criterion, group: &str, name: &str, topology: &Topology, sizes: &[usize]) {
    let available: Vec<usize> = (0..topology.len()).collect();
    let mut g = c.benchmark_group(group);
    g.sample_size(10);
    for &size in sizes {
        g.bench_with_input(BenchmarkId::new(name, size), &size, |b, &size| {
            b.iter(|| oracle::best_effort(topology, black_box(&available), &[], black_box(size)))
        });
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    let Some(volta) = decode("dgx1-volta", DGX1_VOLTA) else { return };
    let Some(islands) = decode("two-islands-16x", TWO_ISLANDS) else { return };
    let Some(random8) = random(8, 8) else { return };
    let Some(random12) = random(12, 12) else { return };
    let Some(random16) = random(16, 16) else { return };
    let Some(random24) = random(24, 24) else { return };

    bench_policy(c, "best_effort_8", "dgx1-volta", &volta, &[1, 2, 3, 4, 5, 6, 7, 8]);
    bench_policy(c, "best_effort_8", "random", &random8, &[1, 2, 3, 4, 5, 6, 7, 8]);
    bench_policy(c, "best_effort_12", "random", &random12, &[2, 3, 4, 6]);
    bench_policy(c, "best_effort_16", "two-islands", &islands, &[2, 4, 8]);
    bench_policy(c, "best_effort_16", "random", &random16, &[2, 4, 8]);
    if std::env::var_os("VGPU_BENCH_24").is_some() {
        let available: Vec<usize> = (0..random24.len()).collect();
        for size in [4, 8] {
            let start = std::time::Instant::now();
            let got = BestEffortPolicy::new(&random24).allocate(&available, &[], size);
            eprintln!("best_effort_24/random/{size}: {:?} once -> {:?}", start.elapsed(), got);
        }
    }

    bench_oracle(c, "oracle_8", "dgx1-volta", &volta, &[2, 4]);
    bench_oracle(c, "oracle_12", "random", &random12, &[2, 3, 4, 6]);
}

criterion_group! {
    name = topology;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = benches
}
criterion_main!(topology);
